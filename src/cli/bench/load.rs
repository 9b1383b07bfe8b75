//! The load generator `bench compare` drives Redis and NATS with: the same
//! shape as Malachi's produce path in `bench.rs` (N producer tasks, each on
//! its own connection, each keeping a window of unacknowledged records in
//! flight, latency measured from send to acknowledgement), written once over
//! a "send one record" function so both peers run exactly the same loop.
//! The readers that play back what a run wrote live here too.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use hdrhistogram::Histogram;

use super::super::error::CliError;
use super::{LoadOutcome, histogram, micros};

/// The acknowledgement of one record, or why it failed.
pub type Ack = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// How long, after the run's duration, producers may wait for the records
/// still in flight before those are dropped uncounted. A peer that acks a few
/// thousand records a second with 64 x 400 in flight would otherwise hold the
/// bench for many seconds after the measured window.
pub const DRAIN_MAX: Duration = Duration::from_secs(5);
/// Records asked for per read when playing a stream back: about 1 MiB of
/// 1 KiB records, the same as Malachi's fetch size in the comparison.
pub const READ_RECORDS_MAX: usize = 1000;
/// After a failed send, wait this long: a peer that refuses everything must
/// not be hammered in a tight loop.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// One producer: a function that sends one record and returns its ack.
pub type Producer = Box<dyn FnMut() -> Ack + Send>;

/// Run `producers` until `duration` ends, each keeping `window_records`
/// records unacknowledged at most, then wait at most [`DRAIN_MAX`] for the
/// last acknowledgements. Every record carries `record_bytes` of payload.
pub async fn drive(
    producers: Vec<Producer>,
    window_records: usize,
    record_bytes: usize,
    duration: Duration,
) -> Result<LoadOutcome, CliError> {
    let acked = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let end = started + duration;
    let drain_end = end + DRAIN_MAX.min(duration.max(Duration::from_millis(500)));
    let window = window_records.max(1);
    let tasks: Vec<_> = producers
        .into_iter()
        .map(|mut send| {
            let acked = acked.clone();
            tokio::spawn(async move {
                let mut hist = histogram()?;
                let mut errors = 0u64;
                let mut dropped = 0u64;
                let mut inflight = FuturesUnordered::new();
                loop {
                    while Instant::now() < end && inflight.len() < window {
                        let ack = send();
                        let sent = Instant::now();
                        inflight.push(async move { (ack.await, sent.elapsed()) });
                    }
                    if inflight.is_empty() {
                        break;
                    }
                    let deadline = if Instant::now() < end { end } else { drain_end };
                    match tokio::time::timeout_at(deadline.into(), inflight.next()).await {
                        Ok(Some((Ok(()), latency))) => {
                            hist.saturating_record(micros(latency));
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Some((Err(e), _))) => {
                            if errors == 0 {
                                tracing::warn!(error = %e, "a benchmark write failed");
                            }
                            errors += 1;
                            tokio::time::sleep(ERROR_BACKOFF).await;
                        }
                        Ok(None) => break,
                        // The run ended while sends waited: go round to stop
                        // sending, or give up on the drain.
                        Err(_) if deadline == end => {}
                        Err(_) => {
                            dropped = inflight.len() as u64;
                            break;
                        }
                    }
                }
                Ok::<_, CliError>((hist, errors, dropped))
            })
        })
        .collect();
    let mut hist = histogram()?;
    let (mut errors, mut dropped) = (0, 0);
    for task in tasks {
        let (h, e, d) = task
            .await
            .map_err(|e| CliError::Bench(format!("a producer failed: {e}")))??;
        let _ = hist.add(&h);
        errors += e;
        dropped += d;
    }
    let records = acked.load(Ordering::Relaxed);
    Ok(LoadOutcome {
        records,
        payload_bytes: records * record_bytes as u64,
        seconds: started.elapsed().as_secs_f64(),
        hist,
        errors,
        dropped,
    })
}

/// A reader of a stream written by a run, from its start.
pub trait Reader {
    /// One read: how many records and payload bytes it got, zero at the end.
    fn read(&mut self) -> impl Future<Output = Result<(u64, u64), String>>;
}

/// Read a stream back from its start until the end or `duration`, timing
/// each read.
pub async fn play_back<R: Reader>(
    duration: Duration,
    reader: &mut R,
) -> Result<LoadOutcome, CliError> {
    let mut hist: Histogram<u64> = histogram()?;
    let (mut records, mut bytes) = (0u64, 0u64);
    let started = Instant::now();
    while started.elapsed() < duration {
        let t = Instant::now();
        let (n, b) = reader
            .read()
            .await
            .map_err(|e| CliError::Bench(format!("read back: {e}")))?;
        if n == 0 {
            break;
        }
        hist.saturating_record(micros(t.elapsed()));
        records += n;
        bytes += b;
    }
    Ok(LoadOutcome {
        records,
        payload_bytes: bytes,
        seconds: started.elapsed().as_secs_f64(),
        hist,
        errors: 0,
        dropped: 0,
    })
}

/// Redis Streams: one `XADD` per record on a multiplexed connection per
/// producer (the connection pipelines the window's commands), and `XRANGE`
/// to read back.
pub mod redis_streams {
    use std::sync::Arc;
    use std::time::Duration;

    use redis::aio::MultiplexedConnection;
    use redis::{AsyncConnectionConfig, Value};

    use super::{Ack, Producer};

    /// Longer than any ack can take under load: the client's default of
    /// 500 ms would turn a slow durable Redis into errors, not latency.
    const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

    pub async fn connect(addr: &str) -> Result<MultiplexedConnection, String> {
        let client = redis::Client::open(format!("redis://{addr}/")).map_err(|e| e.to_string())?;
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(Duration::from_secs(10)));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| e.to_string())
    }

    pub fn producer(conn: MultiplexedConnection, key: String, value: Arc<[u8]>) -> Producer {
        Box::new(move || -> Ack {
            let (mut conn, key, value) = (conn.clone(), key.clone(), value.clone());
            Box::pin(async move {
                redis::cmd("XADD")
                    .arg(&key)
                    .arg("*")
                    .arg("v")
                    .arg(&value[..])
                    .query_async::<Value>(&mut conn)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
        })
    }

    /// Reads a stream with `XRANGE`, each read from where the last stopped.
    #[derive(Debug)]
    pub struct StreamReader {
        pub conn: MultiplexedConnection,
        pub key: String,
        /// An exclusive entry id (`(id`), or `-` before the first read.
        pub after: String,
    }

    impl super::Reader for StreamReader {
        async fn read(&mut self) -> Result<(u64, u64), String> {
            let reply: Value = redis::cmd("XRANGE")
                .arg(&self.key)
                .arg(self.after.as_str())
                .arg("+")
                .arg("COUNT")
                .arg(super::READ_RECORDS_MAX)
                .query_async(&mut self.conn)
                .await
                .map_err(|e| e.to_string())?;
            let Value::Array(entries) = reply else {
                return Err(format!("XRANGE answered {reply:?}"));
            };
            let (mut records, mut bytes) = (0u64, 0u64);
            for entry in &entries {
                let Value::Array(parts) = entry else {
                    return Err("XRANGE entry is not an array".into());
                };
                if let Some(Value::BulkString(id)) = parts.first() {
                    self.after = format!("({}", String::from_utf8_lossy(id));
                }
                if let Some(Value::Array(fields)) = parts.get(1) {
                    for field in fields.iter().skip(1).step_by(2) {
                        if let Value::BulkString(value) = field {
                            bytes += value.len() as u64;
                        }
                    }
                }
                records += 1;
            }
            Ok((records, bytes))
        }
    }
}

/// NATS JetStream: a publish per record whose ack future resolves once the
/// stream stored it (after the fsync, with `sync_interval: always`), and a
/// pull consumer without acks to read back.
pub mod jetstream {
    use std::time::Duration;

    use async_nats::jetstream::Context;
    use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
    use async_nats::jetstream::context::ContextBuilder;
    use async_nats::jetstream::stream::{Config, StorageType};
    use bytes::Bytes;
    use futures::StreamExt;

    use super::{Ack, Producer};

    /// How long an ack may take: as for Redis, slowness must show as
    /// latency, not as errors (the client's default is 5 s).
    const ACK_TIMEOUT: Duration = Duration::from_secs(60);

    pub async fn connect(addr: &str) -> Result<Context, String> {
        let client = async_nats::connect(addr).await.map_err(|e| e.to_string())?;
        Ok(ContextBuilder::new().timeout(ACK_TIMEOUT).build(client))
    }

    /// A file-backed stream of one subject, `replicas` copies (1 on a
    /// single server, 3 on the RF=3 rows' cluster), no limits.
    pub async fn create_stream(
        context: &Context,
        name: &str,
        replicas: usize,
    ) -> Result<(), String> {
        context
            .create_stream(Config {
                name: name.to_owned(),
                subjects: vec![subject(name)],
                storage: StorageType::File,
                num_replicas: replicas,
                ..Config::default()
            })
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    pub fn subject(stream: &str) -> String {
        format!("bench.{stream}")
    }

    pub fn producer(context: Context, subject: String, value: Bytes) -> Producer {
        Box::new(move || -> Ack {
            let (context, subject, value) = (context.clone(), subject.clone(), value.clone());
            Box::pin(async move {
                let ack = context
                    .publish(subject, value)
                    .await
                    .map_err(|e| e.to_string())?;
                ack.await.map(|_| ()).map_err(|e| e.to_string())
            })
        })
    }

    /// A consumer that reads `stream` from its first message, without acks.
    pub async fn reader(context: &Context, stream: &str) -> Result<PullConsumer, String> {
        let stream = context
            .get_stream(stream)
            .await
            .map_err(|e| e.to_string())?;
        stream
            .create_consumer(pull::Config {
                deliver_policy: DeliverPolicy::All,
                ack_policy: AckPolicy::None,
                ..pull::Config::default()
            })
            .await
            .map_err(|e| e.to_string())
    }

    /// Fetches of up to [`super::READ_RECORDS_MAX`] messages that return as
    /// soon as no more are stored.
    #[derive(Debug)]
    pub struct StreamReader {
        pub consumer: PullConsumer,
    }

    impl super::Reader for StreamReader {
        async fn read(&mut self) -> Result<(u64, u64), String> {
            let mut batch = self
                .consumer
                .fetch()
                .max_messages(super::READ_RECORDS_MAX)
                .messages()
                .await
                .map_err(|e| e.to_string())?;
            let (mut records, mut bytes) = (0u64, 0u64);
            while let Some(message) = batch.next().await {
                let message = message.map_err(|e| e.to_string())?;
                records += 1;
                bytes += message.payload.len() as u64;
            }
            Ok((records, bytes))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instant_producer(counter: Arc<AtomicU64>) -> Producer {
        Box::new(move || -> Ack {
            let counter = counter.clone();
            Box::pin(async move {
                counter.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
                Ok(())
            })
        })
    }

    #[tokio::test]
    async fn the_driver_counts_every_acknowledged_record_and_its_payload() {
        let sent = Arc::new(AtomicU64::new(0));
        let producers = (0..3).map(|_| instant_producer(sent.clone())).collect();
        let outcome = drive(producers, 8, 1024, Duration::from_millis(200))
            .await
            .unwrap();
        assert!(outcome.records > 0);
        // Every send was awaited to its ack: nothing dropped in the drain.
        assert_eq!(outcome.records, sent.load(Ordering::Relaxed));
        assert_eq!(outcome.payload_bytes, outcome.records * 1024);
        assert_eq!(outcome.hist.len(), outcome.records);
        assert_eq!(outcome.errors, 0);
    }

    #[tokio::test]
    async fn the_driver_keeps_at_most_the_window_in_flight() {
        let inflight = Arc::new(AtomicU64::new(0));
        let peak = Arc::new(AtomicU64::new(0));
        let (i, p) = (inflight.clone(), peak.clone());
        let producer: Producer = Box::new(move || -> Ack {
            let (i, p) = (i.clone(), p.clone());
            let now = i.fetch_add(1, Ordering::SeqCst) + 1;
            p.fetch_max(now, Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                i.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            })
        });
        drive(vec![producer], 5, 1, Duration::from_millis(100))
            .await
            .unwrap();
        assert_eq!(peak.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn failed_writes_are_counted_as_errors_not_records() {
        let producer: Producer = Box::new(|| -> Ack { Box::pin(async { Err("no".to_owned()) }) });
        let outcome = drive(vec![producer], 4, 1, Duration::from_millis(100))
            .await
            .unwrap();
        assert_eq!(outcome.records, 0);
        assert!(outcome.errors > 0);
    }

    #[tokio::test]
    async fn acks_that_never_come_end_the_run_after_the_drain() {
        let producer: Producer =
            Box::new(|| -> Ack { Box::pin(futures::future::pending::<Result<(), String>>()) });
        let started = Instant::now();
        let outcome = drive(vec![producer], 4, 1, Duration::from_millis(100))
            .await
            .unwrap();
        assert_eq!(outcome.records, 0);
        // The window's writes are reported as dropped, not as acknowledged.
        assert_eq!(outcome.dropped, 4);
        // Liveness only: the run ends (duration plus a bounded drain).
        assert!(started.elapsed() < Duration::from_secs(30));
    }

    struct Countdown(u64);

    impl Reader for Countdown {
        async fn read(&mut self) -> Result<(u64, u64), String> {
            let n = self.0.min(1000);
            self.0 -= n;
            Ok((n, n * 1024))
        }
    }

    #[tokio::test]
    async fn play_back_reads_until_a_read_comes_back_empty() {
        let outcome = play_back(Duration::from_secs(30), &mut Countdown(2500))
            .await
            .unwrap();
        assert_eq!(outcome.records, 2500);
        assert_eq!(outcome.payload_bytes, 2500 * 1024);
        assert_eq!(outcome.hist.len(), 3);
    }
}
