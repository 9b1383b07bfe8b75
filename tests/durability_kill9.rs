//! Durability under `kill -9`: a broker process is SIGKILLed at random
//! moments (at least 20 times) while several producers append keyed
//! sequences, and restarted each time on the same data directory.
//!
//! The property, precisely. Every produce attempt carries one record whose
//! value names its key, its sequence number and its attempt number
//! (`key:seq:attempt`), so a retry is a different record from the attempt
//! it retries. Each producer sends one request at a time per key and, until
//! one is acknowledged, retries the same sequence number as a new attempt.
//! Afterwards, reading the whole topic from the start:
//! - every acknowledged record is present exactly once;
//! - per key, the acknowledged records appear in sequence order;
//! - a record whose produce was not acknowledged is absent or present once;
//! - nothing is present that was never sent.
//!
//! The seed of the kill schedule is printed; set `MALACHI_TEST_SEED` to
//! replay one.
//!
//! A second test does the same with the client's own idempotent, pipelined
//! `Producer` (ADR 0092): several requests in flight per producer, and the
//! producer, not the test, resends a request after a lost connection with
//! the same sequence number. A resend is then the same record as the
//! attempt it repeats (`key:seq`), so afterwards every key must read back
//! as exactly 0, 1, 2, ... with nothing twice, and every acknowledged
//! record must be there.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{BrokerProcess, free_port};
use malachi_testkit::wait::wait_until_blocking;
use malachi_wire::client::{ConsumeOptions, Producer, StartAt};
use malachi_wire::{Client, ClientConfig, Record, RecordBatch};

const TOPIC: &str = "durable";
const PRODUCERS: usize = 4;
const KEYS_PER_PRODUCER: usize = 2;
const KILLS: usize = 20;

/// splitmix64: a seeded, reproducible schedule with no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn between_ms(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.next() % (high - low))
    }
}

/// What one producer saw: every attempt sent, and the acknowledged ones in order.
#[derive(Debug, Default)]
struct Log {
    sent: HashSet<String>,
    acked: Vec<(String, u64, String)>,
}

fn client_config() -> ClientConfig {
    ClientConfig {
        request_timeout_ms: 5_000,
        connect_timeout_ms: 500,
        // The test retries by itself, as a new attempt, so that every record
        // on the wire is distinguishable.
        retries_max: 0,
        ..ClientConfig::default()
    }
}

async fn connect(addr: &str) -> Client {
    loop {
        if let Ok(client) = Client::connect_with([addr.to_owned()], client_config()).await {
            return client;
        }
        // pacing, not synchronisation: backoff between connects while the broker restarts.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn produce_until(
    addr: String,
    producer: usize,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Log>>,
    acks: Arc<AtomicU64>,
) {
    let mut client = connect(&addr).await;
    let keys: Vec<String> = (0..KEYS_PER_PRODUCER)
        .map(|j| format!("p{producer}k{j}"))
        .collect();
    let mut next_seq = vec![0u64; keys.len()];
    let mut attempt: u64 = 0;
    let mut turn = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let k = turn % keys.len();
        turn += 1;
        attempt += 1;
        let value = format!("{}:{}:{attempt}", keys[k], next_seq[k]);
        let record = Record::new(Bytes::from(keys[k].clone()), Bytes::from(value.clone()));
        let batch = RecordBatch::from_records([&record], 1 << 20).unwrap();
        log.lock().unwrap().sent.insert(value.clone());
        match client.produce(TOPIC, batch).await {
            Ok(response) => {
                assert_eq!(response.records_acknowledged, 1);
                log.lock()
                    .unwrap()
                    .acked
                    .push((keys[k].clone(), next_seq[k], value));
                next_seq[k] += 1;
                acks.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                // Not acknowledged: the same sequence number goes again as a
                // new attempt once the broker is back. A fresh client drops
                // any half-dead connection.
                // pacing, not synchronisation: backoff before a retry while the broker restarts.
                tokio::time::sleep(Duration::from_millis(20)).await;
                client = connect(&addr).await;
            }
        }
    }
}

#[test]
fn acknowledged_records_survive_repeated_kill_9_in_order_and_without_duplicates() {
    let seed = std::env::var("MALACHI_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("kill schedule seed: {seed} (replay with MALACHI_TEST_SEED={seed})");
    let mut rng = Rng(seed);

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let client_addr = format!("127.0.0.1:{}", free_port());
    let admin_addr = format!("127.0.0.1:{}", free_port());
    let mut broker = BrokerProcess::start_on(&data, &client_addr, &admin_addr);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = connect(&client_addr).await;
        client.create_topic(TOPIC, None, None).await.unwrap();
    });

    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(AtomicU64::new(0));
    let logs: Vec<Arc<Mutex<Log>>> = (0..PRODUCERS).map(|_| Arc::default()).collect();
    let tasks: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            runtime.spawn(produce_until(
                client_addr.clone(),
                p,
                stop.clone(),
                logs[p].clone(),
                acks.clone(),
            ))
        })
        .collect();

    let started = Instant::now();
    let mut acks_between_kills = Vec::with_capacity(KILLS);
    for _ in 0..KILLS {
        let before = acks.load(Ordering::Relaxed);
        // pacing, not synchronisation: a random run before the next kill.
        std::thread::sleep(rng.between_ms(80, 400));
        broker.kill9();
        acks_between_kills.push(acks.load(Ordering::Relaxed) - before);
        // pacing, not synchronisation: a random time down.
        std::thread::sleep(rng.between_ms(0, 100));
        broker = BrokerProcess::start_on(&data, &client_addr, &admin_addr);
    }
    // The producers run against the last incarnation until it has
    // acknowledged some of their writes.
    last_incarnation_acknowledges(&acks);
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(async {
        for task in tasks {
            task.await.unwrap();
        }
    });
    println!(
        "{KILLS} kills in {:?}; acknowledgements between kills: {acks_between_kills:?}",
        started.elapsed()
    );
    let acked_total = acks.load(Ordering::Relaxed);
    assert!(
        acks_between_kills.iter().filter(|&&n| n > 0).count() >= KILLS / 2,
        "the producers made progress between too few kills: {acks_between_kills:?}"
    );

    // Read everything back from a fresh connection.
    let read: Vec<Record> = runtime.block_on(async {
        let client = connect(&client_addr).await;
        let mut consumer = client.consume(TOPIC, StartAt::Start, ConsumeOptions::default());
        let mut out = Vec::new();
        while let Some(item) = consumer.next().await {
            out.push(item.unwrap().record);
        }
        out
    });

    let mut sent = HashSet::new();
    let mut acked: HashMap<String, Vec<(u64, String)>> = HashMap::new();
    for log in &logs {
        let log = log.lock().unwrap();
        sent.extend(log.sent.iter().cloned());
        for (key, seq, value) in &log.acked {
            acked
                .entry(key.clone())
                .or_default()
                .push((*seq, value.clone()));
        }
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut order: HashMap<String, Vec<String>> = HashMap::new();
    for record in &read {
        let key = String::from_utf8(record.key.to_vec()).unwrap();
        let value = String::from_utf8(record.value.to_vec()).unwrap();
        assert!(
            value.starts_with(&format!("{key}:")),
            "{value} under key {key}"
        );
        assert!(sent.contains(&value), "{value} was never sent");
        *seen.entry(value.clone()).or_default() += 1;
        order.entry(key).or_default().push(value);
    }
    for (value, count) in &seen {
        assert_eq!(*count, 1, "{value} is present {count} times");
    }
    for (key, acked_values) in &acked {
        let read_values = order.get(key).cloned().unwrap_or_default();
        let position: HashMap<&str, usize> = read_values
            .iter()
            .enumerate()
            .map(|(i, v)| (v.as_str(), i))
            .collect();
        let mut last = None;
        for (seq, value) in acked_values {
            let at = *position.get(value.as_str()).unwrap_or_else(|| {
                panic!("acknowledged {value} (seq {seq}) is missing (seed {seed})")
            });
            if let Some(previous) = last {
                assert!(
                    at > previous,
                    "{value} is out of order under {key} (seed {seed})"
                );
            }
            last = Some(at);
        }
    }
    println!(
        "{acked_total} acknowledged records all present once and in order; {} records read, {} attempts sent",
        read.len(),
        sent.len()
    );
    drop(broker);
}

const PIPELINED_TOPIC: &str = "durable-pipelined";
const PIPELINED_PRODUCERS: usize = 3;
const PIPELINED_KEYS_PER_PRODUCER: usize = 4;
const PIPELINED_WINDOW: usize = 16;
const PIPELINED_KILLS: usize = 5;

/// What one pipelined producer did: the (key, seq) of each record by its
/// ordinal (send order), the acknowledged ordinal intervals, and any error.
#[derive(Debug, Default)]
struct PipelinedLog {
    sent: Vec<(String, u64)>,
    acknowledged: Vec<(u64, u64)>,
    error: Option<String>,
}

fn pipelined_client_config() -> ClientConfig {
    ClientConfig {
        // One attempt is bounded by this; the delivery timeout below spans
        // many attempts, across a restart.
        request_timeout_ms: 2_000,
        connect_timeout_ms: 500,
        backoff_max_ms: 200,
        ..ClientConfig::default()
    }
}

async fn pipelined_connect(addr: &str) -> Client {
    loop {
        if let Ok(client) = Client::connect_with([addr.to_owned()], pipelined_client_config()).await
        {
            return client;
        }
        // pacing, not synchronisation: backoff between connects while the broker restarts.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn pipelined_produce_until(
    addr: String,
    producer_no: usize,
    stop: Arc<AtomicBool>,
    acks: Arc<AtomicU64>,
) -> PipelinedLog {
    let client = pipelined_connect(&addr).await;
    let mut producer: Producer = client.producer(PIPELINED_TOPIC, PIPELINED_WINDOW);
    producer.set_delivery_timeout(Duration::from_secs(40));
    let keys: Vec<String> = (0..PIPELINED_KEYS_PER_PRODUCER)
        .map(|j| format!("p{producer_no}k{j}"))
        .collect();
    let mut next_seq = vec![0u64; keys.len()];
    let mut log = PipelinedLog::default();
    let mut turn = 0usize;
    let mut rng = Rng(producer_no as u64 + 1);
    let mut result = Ok(());
    while !stop.load(Ordering::Relaxed) {
        // 1 to 8 records a request, the keys interleaved within and across
        // requests.
        let count = 1 + (rng.next() % 8) as usize;
        let mut records = Vec::with_capacity(count);
        for _ in 0..count {
            let k = (turn + (rng.next() % 2) as usize) % keys.len();
            turn += 1;
            let seq = next_seq[k];
            next_seq[k] += 1;
            let value = format!("{}:{seq}", keys[k]);
            records.push(Record::new(
                Bytes::from(keys[k].clone()),
                Bytes::from(value),
            ));
            log.sent.push((keys[k].clone(), seq));
        }
        let batch = RecordBatch::from_records(records.iter(), 1 << 20).unwrap();
        match producer.send(batch).await {
            Ok(ack) => {
                if let Some(ack) = ack {
                    acks.fetch_add(u64::from(ack.records_acknowledged), Ordering::Relaxed);
                }
            }
            Err(error) => {
                result = Err(error);
                break;
            }
        }
    }
    if result.is_ok() {
        // Count what comes back while flushing, too.
        loop {
            match producer.next_ack().await {
                Ok(Some(ack)) => {
                    acks.fetch_add(u64::from(ack.records_acknowledged), Ordering::Relaxed);
                }
                Ok(None) => break,
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
        }
    }
    if let Err(error) = result {
        log.error = Some(error.to_string());
    }
    assert_eq!(producer.records_sent(), log.sent.len() as u64);
    log.acknowledged = producer.acknowledged_ordinals();
    log
}

#[test]
fn pipelined_idempotent_producers_survive_kill_9_exactly_once_and_in_key_order() {
    let seed = std::env::var("MALACHI_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("kill schedule seed: {seed} (replay with MALACHI_TEST_SEED={seed})");
    let mut rng = Rng(seed);

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let client_addr = format!("127.0.0.1:{}", free_port());
    let admin_addr = format!("127.0.0.1:{}", free_port());
    let mut broker = BrokerProcess::start_on(&data, &client_addr, &admin_addr);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = pipelined_connect(&client_addr).await;
        client
            .create_topic(PIPELINED_TOPIC, None, None)
            .await
            .unwrap();
    });

    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..PIPELINED_PRODUCERS)
        .map(|p| {
            runtime.spawn(pipelined_produce_until(
                client_addr.clone(),
                p,
                stop.clone(),
                acks.clone(),
            ))
        })
        .collect();

    let started = Instant::now();
    let mut acks_between_kills = Vec::with_capacity(PIPELINED_KILLS);
    for _ in 0..PIPELINED_KILLS {
        let before = acks.load(Ordering::Relaxed);
        // pacing, not synchronisation: a random run before the next kill.
        std::thread::sleep(rng.between_ms(300, 1_200));
        broker.kill9();
        acks_between_kills.push(acks.load(Ordering::Relaxed) - before);
        // pacing, not synchronisation: a random time down.
        std::thread::sleep(rng.between_ms(0, 300));
        broker = BrokerProcess::start_on(&data, &client_addr, &admin_addr);
    }
    last_incarnation_acknowledges(&acks);
    stop.store(true, Ordering::Relaxed);
    let logs: Vec<PipelinedLog> = runtime.block_on(async {
        let mut logs = Vec::new();
        for task in tasks {
            logs.push(task.await.unwrap());
        }
        logs
    });
    println!(
        "{PIPELINED_KILLS} kills in {:?}; acknowledgements between kills: {acks_between_kills:?}",
        started.elapsed()
    );
    for (p, log) in logs.iter().enumerate() {
        assert!(
            log.error.is_none(),
            "producer {p} failed (seed {seed}): {:?}\nbroker log:\n{}",
            log.error,
            broker.log()
        );
    }
    assert!(
        acks_between_kills.iter().filter(|&&n| n > 0).count() >= PIPELINED_KILLS / 2,
        "the producers made progress between too few kills: {acks_between_kills:?}"
    );

    let read: Vec<Record> = runtime.block_on(async {
        let client = pipelined_connect(&client_addr).await;
        let mut consumer =
            client.consume(PIPELINED_TOPIC, StartAt::Start, ConsumeOptions::default());
        let mut out = Vec::new();
        while let Some(item) = consumer.next().await {
            out.push(item.unwrap().record);
        }
        out
    });

    // Per key: the highest sequence sent, and the acknowledged sequences.
    let mut sent_max: HashMap<String, u64> = HashMap::new();
    let mut acked: HashMap<String, Vec<u64>> = HashMap::new();
    let mut acked_total = 0u64;
    for log in &logs {
        for (key, seq) in &log.sent {
            let max = sent_max.entry(key.clone()).or_default();
            *max = (*max).max(*seq);
        }
        for &(start, end) in &log.acknowledged {
            for ordinal in start..end {
                let (key, seq) = &log.sent[ordinal as usize];
                acked.entry(key.clone()).or_default().push(*seq);
                acked_total += 1;
            }
        }
    }
    let sent_total: usize = logs.iter().map(|l| l.sent.len()).sum();
    assert_eq!(
        acked_total, sent_total as u64,
        "every record sent was acknowledged once the producers flushed"
    );

    let mut order: HashMap<String, Vec<u64>> = HashMap::new();
    for record in &read {
        let key = String::from_utf8(record.key.to_vec()).unwrap();
        let value = String::from_utf8(record.value.to_vec()).unwrap();
        let (value_key, seq) = value.rsplit_once(':').unwrap();
        assert_eq!(value_key, key, "{value} under key {key}");
        let seq: u64 = seq.parse().unwrap();
        assert!(
            sent_max.get(&key).is_some_and(|max| seq <= *max),
            "{value} was never sent"
        );
        order.entry(key).or_default().push(seq);
    }
    for (key, seqs) in &order {
        for (at, seq) in seqs.iter().enumerate() {
            assert_eq!(
                *seq,
                at as u64,
                "key {key}: record {at} read back has sequence {seq} (seed {seed}); \
                 a duplicate, a gap or a reordering. First reads: {:?}",
                &seqs[at.saturating_sub(5)..(at + 5).min(seqs.len())]
            );
        }
    }
    for (key, seqs) in &acked {
        let read_count = order.get(key).map_or(0, Vec::len) as u64;
        for seq in seqs {
            assert!(
                *seq < read_count,
                "acknowledged {key}:{seq} is missing (seed {seed}); {read_count} read under {key}"
            );
        }
    }
    assert_eq!(
        read.len() as u64,
        acked_total,
        "nothing beyond what was sent"
    );
    println!(
        "{acked_total} acknowledged records present once each and in key order; {} keys",
        order.len()
    );
    drop(broker);
}

/// Waits until the broker's last incarnation has acknowledged writes: the
/// producers' count of acknowledgements moves past where it stood.
fn last_incarnation_acknowledges(acks: &AtomicU64) {
    let at_restart = acks.load(Ordering::Relaxed);
    wait_until_blocking(
        "the last incarnation acknowledges writes",
        Duration::from_secs(60),
        Duration::from_millis(10),
        || acks.load(Ordering::Relaxed) > at_restart,
    );
}
