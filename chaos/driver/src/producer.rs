//! One producer of the workload: it owns a few keys and writes each key's
//! sequence `1, 2, 3, ...` with the value `"key:seq"`, round robin over its
//! keys, at a bounded rate, through the wire client's idempotent
//! [`Producer`] (ordered, pipelined, retrying with the same sequence
//! numbers, as `malachi produce` does).
//!
//! The history records, per write:
//! - `produce` just before the record is handed to the producer;
//! - `produce_ok` once the producer counts its ordinal acknowledged;
//! - `produce_unknown` for every record not acknowledged when the producer
//!   session gives up (a record not acknowledged within the delivery
//!   timeout, or a refusal it cannot retry) or when the run stops before
//!   its outcome.
//!
//! `produce_fail` is never written. It means "certainly not applied", and
//! no failure the driver sees says that of a record: the session's retries
//! may have stored any attempt that went out before the final refusal, and
//! the wire producer reports one failure for the session, not which of its
//! pipelined requests was refused. Unknown is the truthful outcome, and the
//! checker demands nothing of an unknown write except that it was sent.
//!
//! After a failed session the producer opens a new one (a fresh producer
//! id and epoch) on a new client, a broker further in the rotation. The
//! keys go on with new seqs: a seq is never sent twice, so a retry that
//! might land twice is a new write (the checker's contract).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use malachi_chaos_checker::Event;
use malachi_wire::client::Producer;
use malachi_wire::{BatchBuilder, ClientError, Record};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::brokers::Brokers;
use crate::history::History;
use crate::stats::{Stats, error_kind};

/// One producer's settings.
#[derive(Debug, Clone)]
pub struct ProducerSettings {
    /// The name in the history (`client`), e.g. `p0`.
    pub name: String,
    pub topic: String,
    /// Its keys, e.g. `p0-k0`..: no other producer writes them.
    pub keys: Vec<String>,
    /// Records per second this producer offers (it sends less when the
    /// window is full).
    pub rate_per_s: u64,
    /// Produce requests in flight (one record each).
    pub window_requests_max: usize,
    /// How long the session retries one record before it gives up.
    pub delivery_timeout_ms: u64,
    /// How long, after the stop, outstanding records may still be
    /// acknowledged before they are logged unknown.
    pub drain_timeout_ms: u64,
    /// Where in the broker list its first client starts.
    pub rotation: usize,
}

/// The pause after a failed session before the next one.
const SESSION_BACKOFF_MS: u64 = 250;
/// The longest the sender falls behind its rate before it stops catching up.
const CATCH_UP_MS_MAX: u64 = 1_000;
/// The largest batch block of one record (the keys and values are short).
const RECORD_BATCH_BYTES_MAX: usize = 4 * 1024;

/// A record handed to the session and not yet acknowledged.
#[derive(Debug)]
struct Pending {
    key: usize,
    seq: u64,
}

/// Runs the producer until `stop`, then drains. Writes only to the history
/// and the stats.
pub async fn run(
    settings: ProducerSettings,
    brokers: Brokers,
    history: Arc<History>,
    stats: Arc<Stats>,
    mut stop: watch::Receiver<bool>,
) {
    assert!(
        !settings.keys.is_empty(),
        "a producer owns at least one key"
    );
    let interval = Duration::from_micros(1_000_000 / settings.rate_per_s.max(1));
    let mut rotation = settings.rotation;
    let mut next_seq: Vec<u64> = vec![1; settings.keys.len()];
    let mut next_key = 0usize;
    let mut next_send = Instant::now();
    'sessions: loop {
        if *stop.borrow() {
            return;
        }
        let Some(client) = brokers
            .connect_until(&mut rotation, &stop, &settings.name)
            .await
        else {
            return;
        };
        let mut producer = client.producer(&settings.topic, settings.window_requests_max);
        producer.set_delivery_timeout(Duration::from_millis(settings.delivery_timeout_ms));
        stats.sessions.fetch_add(1, Ordering::Relaxed);
        // Ordinal (the session's 0-based count of records sent) to record.
        let mut pending: BTreeMap<u64, Pending> = BTreeMap::new();
        loop {
            if *stop.borrow() {
                drain(&settings, &mut producer, &mut pending, &history, &stats).await;
                return;
            }
            let now = Instant::now();
            if now >= next_send {
                let key = next_key;
                next_key = (next_key + 1) % settings.keys.len();
                let seq = next_seq[key];
                next_seq[key] += 1;
                let name = &settings.keys[key];
                let value = format!("{name}:{seq}");
                let mut builder = BatchBuilder::new(RECORD_BATCH_BYTES_MAX);
                let pushed = builder.push(&Record::new(
                    name.clone().into_bytes(),
                    value.clone().into_bytes(),
                ));
                assert!(pushed.is_ok(), "a short record always fits a batch");
                let ordinal = producer.records_sent();
                history.log(|t_ms| Event::Produce {
                    t_ms,
                    client: settings.name.clone(),
                    key: name.clone(),
                    seq,
                    value,
                });
                stats.produced.fetch_add(1, Ordering::Relaxed);
                pending.insert(ordinal, Pending { key, seq });
                let sent = producer.send(builder.finish()).await;
                settle(&settings, &producer, &mut pending, &history, &stats);
                next_send += interval;
                let behind = Instant::now().saturating_duration_since(next_send);
                if behind > Duration::from_millis(CATCH_UP_MS_MAX) {
                    next_send = Instant::now();
                }
                if let Err(error) = sent {
                    give_up(&settings, &mut pending, &error, &history, &stats);
                    rotation = rotation.wrapping_add(1);
                    pause(&mut stop, SESSION_BACKOFF_MS).await;
                    continue 'sessions;
                }
            } else if pending.is_empty() {
                tokio::select! {
                    () = tokio::time::sleep_until(next_send) => {}
                    _ = stop.changed() => {}
                }
            } else {
                // Take acknowledgements while waiting for the next send, so
                // `produce_ok` is stamped when the answer came. Cutting
                // `next_ack` short at the deadline is safe: at worst a
                // request it was writing goes out again with the same
                // sequence number, which the broker answers as a duplicate.
                let acked = tokio::time::timeout_at(next_send, producer.next_ack()).await;
                settle(&settings, &producer, &mut pending, &history, &stats);
                if let Ok(Err(error)) = acked {
                    give_up(&settings, &mut pending, &error, &history, &stats);
                    rotation = rotation.wrapping_add(1);
                    pause(&mut stop, SESSION_BACKOFF_MS).await;
                    continue 'sessions;
                }
            }
        }
    }
}

/// Sleeps `ms`, or less if the run stops.
async fn pause(stop: &mut watch::Receiver<bool>, ms: u64) {
    tokio::select! {
        () = tokio::time::sleep(Duration::from_millis(ms)) => {}
        _ = stop.changed() => {}
    }
}

/// Logs `produce_ok` for every pending record the session now counts
/// acknowledged.
fn settle(
    settings: &ProducerSettings,
    producer: &Producer,
    pending: &mut BTreeMap<u64, Pending>,
    history: &History,
    stats: &Stats,
) {
    if pending.is_empty() {
        return;
    }
    for (start, end) in producer.acknowledged_ordinals() {
        let done: Vec<u64> = pending.range(start..end).map(|(o, _)| *o).collect();
        for ordinal in done {
            let Some(record) = pending.remove(&ordinal) else {
                continue;
            };
            let key = &settings.keys[record.key];
            history.log(|t_ms| Event::ProduceOk {
                t_ms,
                client: settings.name.clone(),
                key: key.clone(),
                seq: record.seq,
                value: format!("{key}:{}", record.seq),
            });
            stats.acked.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The session failed: every record it still holds may or may not land.
fn give_up(
    settings: &ProducerSettings,
    pending: &mut BTreeMap<u64, Pending>,
    error: &ClientError,
    history: &History,
    stats: &Stats,
) {
    stats.error(&settings.name, error);
    let reason = error.to_string();
    eprintln!(
        "chaos-driver: {}: session failed ({}), {} records unknown: {reason}",
        settings.name,
        error_kind(error),
        pending.len()
    );
    for (_, record) in std::mem::take(pending) {
        history.log(|t_ms| Event::ProduceUnknown {
            t_ms,
            client: settings.name.clone(),
            key: settings.keys[record.key].clone(),
            seq: record.seq,
            error: reason.clone(),
        });
        stats.unknown.fetch_add(1, Ordering::Relaxed);
    }
}

/// After the stop: take the acknowledgements still coming, for at most the
/// drain timeout, then call the rest unknown.
async fn drain(
    settings: &ProducerSettings,
    producer: &mut Producer,
    pending: &mut BTreeMap<u64, Pending>,
    history: &History,
    stats: &Stats,
) {
    let deadline = Instant::now() + Duration::from_millis(settings.drain_timeout_ms);
    while !pending.is_empty() {
        let acked = tokio::time::timeout_at(deadline, producer.next_ack()).await;
        settle(settings, producer, pending, history, stats);
        match acked {
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) => break,
            Ok(Err(error)) => {
                give_up(settings, pending, &error, history, stats);
                return;
            }
            Err(_elapsed) => break,
        }
    }
    if !pending.is_empty() {
        let error = ClientError::ProduceFailed {
            message: "the run stopped before an answer".to_owned(),
        };
        give_up(settings, pending, &error, history, stats);
    }
}
