//! The load of `malachi bench scale`: keyed records, one prebuilt batch
//! per active range (every key of a batch falls in that range, so the
//! producer sends the block as it is), producers taking the ranges in
//! turn so that each range gets the same share whatever its band's width.
//! Acknowledgements are counted from the end of the warmup to the end of
//! the measurement; what is in flight then is neither counted nor failed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use malachi_wire::messages::TopicDescription;
use malachi_wire::{Record, RecordBatch};

use super::super::super::OutputArgs;
use super::super::super::error::CliError;
use super::super::{BATCH_BYTES_MAX, bench_client, histogram, micros};

/// The most keys tried to fill every range's batch.
const KEY_TRIES_MAX: u64 = 10_000_000;
/// How long the producers may take to stop after the measurement.
const STOP_WAIT_MS: u64 = 10_000;

/// One load run's shape.
#[derive(Debug, Clone)]
pub struct ScaleLoad {
    pub topic: String,
    pub producers: usize,
    /// Requests each producer keeps in flight.
    pub window: usize,
}

/// What the measurement window saw.
#[derive(Debug)]
pub struct Measured {
    pub records: u64,
    pub seconds: f64,
    pub hist: Histogram<u64>,
    pub errors: u64,
}

/// The active ranges' bands, `(start, end exclusive)`, sorted by start.
pub fn active_bands(topic: &TopicDescription) -> Result<Vec<(u64, u128)>, CliError> {
    let parse = |text: &str| {
        u128::from_str_radix(text.strip_prefix("0x").unwrap_or(text), 16)
            .map_err(|e| CliError::Bench(format!("band bound {text}: {e}")))
    };
    let mut bands = Vec::new();
    for range in topic.ranges.iter().filter(|r| r.state == "active") {
        let start = u64::try_from(parse(&range.band_start)?)
            .map_err(|_| CliError::Bench("a band starts beyond 2^64".into()))?;
        bands.push((start, parse(&range.band_end)?));
    }
    bands.sort_unstable();
    Ok(bands)
}

/// `count` equal bands over the whole keyspace (`count` a power of two,
/// so that the halves a split makes never cut one).
pub fn equal_bands(count: u32) -> Vec<(u64, u128)> {
    assert!(count.is_power_of_two(), "bands a split never cuts");
    let width = (1u128 << 64) / u128::from(count);
    (0..u128::from(count))
        .map(|i| ((i * width) as u64, (i + 1) * width))
        .collect()
}

/// `count` keys for each band, in band order: `key-<n>` for the first n
/// whose position falls in it.
pub fn keys_by_band(bands: &[(u64, u128)], count: usize) -> Result<Vec<Vec<Bytes>>, CliError> {
    let mut keys: Vec<Vec<Bytes>> = vec![Vec::with_capacity(count); bands.len()];
    let mut missing = bands.len() * count;
    for n in 0..KEY_TRIES_MAX {
        if missing == 0 {
            return Ok(keys);
        }
        let key = format!("key-{n:010}");
        let position = malachi_core::model::position(key.as_bytes());
        let at = bands.partition_point(|(start, _)| *start <= position);
        let Some(i) = at.checked_sub(1) else { continue };
        if u128::from(position) < bands[i].1 && keys[i].len() < count {
            keys[i].push(Bytes::from(key));
            missing -= 1;
        }
    }
    if missing == 0 {
        return Ok(keys);
    }
    Err(CliError::Bench(format!(
        "no keys for every range within {KEY_TRIES_MAX} tries: a band is too narrow"
    )))
}

/// One batch per range: its keys, each with a value of `value_bytes`.
pub fn batches(keys: &[Vec<Bytes>], value_bytes: usize) -> Result<Vec<RecordBatch>, CliError> {
    let value = Bytes::from(vec![0x5A_u8; value_bytes]);
    keys.iter()
        .map(|keys| {
            let records: Vec<Record> = keys
                .iter()
                .map(|k| Record::new(k.clone(), value.clone()))
                .collect();
            RecordBatch::from_records(&records, BATCH_BYTES_MAX)
                .map_err(|e| CliError::Bench(format!("cannot build a batch: {e}")))
        })
        .collect()
}

/// The producers, running until [`Running::finish`].
#[derive(Debug)]
pub struct Running {
    tasks: Vec<tokio::task::JoinHandle<Result<Histogram<u64>, CliError>>>,
    stop: Arc<AtomicBool>,
    measuring: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    errors_before: u64,
    started: Instant,
}

/// Starts `load.producers` producers, each on its own connection, each
/// keeping `load.window` requests in flight. Nothing is counted until
/// [`Running::measure_from_now`].
pub async fn start(
    output: &OutputArgs,
    load: &ScaleLoad,
    batches: Vec<RecordBatch>,
) -> Result<Running, CliError> {
    assert!(!batches.is_empty(), "a topic has at least one range");
    let batches = Arc::new(batches);
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let kinds = Arc::new(FailureKinds::default());
    let mut tasks = Vec::with_capacity(load.producers);
    for first in 0..load.producers {
        let client = bench_client(output).await?;
        let producer = client.producer(&load.topic, load.window.max(1));
        tasks.push(tokio::spawn(produce(
            producer,
            batches.clone(),
            first,
            Counters {
                stop: stop.clone(),
                measuring: measuring.clone(),
                acked: acked.clone(),
                errors: errors.clone(),
                kinds: kinds.clone(),
            },
        )));
    }
    Ok(Running {
        tasks,
        stop,
        measuring,
        acked,
        errors,
        errors_before: 0,
        started: Instant::now(),
    })
}

struct Counters {
    stop: Arc<AtomicBool>,
    measuring: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    kinds: Arc<FailureKinds>,
}

/// The kinds of failed sends seen: the first of each kind is logged at
/// warn with its whole error, so a run that counts failures says what
/// they were without a debug log (at most `FAILURE_KINDS_MAX` kinds).
#[derive(Debug, Default)]
struct FailureKinds(std::sync::Mutex<std::collections::BTreeSet<String>>);

/// How many kinds of failed sends are told apart.
const FAILURE_KINDS_MAX: usize = 64;

impl FailureKinds {
    fn note(&self, error: &malachi_wire::ClientError) {
        let kind = match error.code() {
            Some(code) => format!("{code:?}"),
            None => format!("{error:?}")
                .chars()
                .take_while(|c| c.is_alphanumeric())
                .collect(),
        };
        let mut seen = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.len() < FAILURE_KINDS_MAX && seen.insert(kind.clone()) {
            tracing::warn!(kind, error = %error, "a scale bench produce failed (the first of its kind)");
        } else {
            tracing::debug!(kind, error = %error, "a scale bench produce failed");
        }
    }
}

/// One producer: the ranges' batches in turn, from range `first`.
async fn produce(
    mut producer: malachi_wire::client::Producer,
    batches: Arc<Vec<RecordBatch>>,
    first: usize,
    counters: Counters,
) -> Result<Histogram<u64>, CliError> {
    let mut hist = histogram()?;
    let mut next = first;
    while !counters.stop.load(Ordering::Relaxed) {
        let batch = batches[next % batches.len()].clone();
        next = next.wrapping_add(1);
        match producer.send(batch).await {
            Ok(Some(ack)) if counters.measuring.load(Ordering::Relaxed) => {
                hist.saturating_record(micros(ack.latency));
                counters
                    .acked
                    .fetch_add(u64::from(ack.records_acknowledged), Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(e) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                counters.kinds.note(&e);
                // A refusing broker must not be hammered in a loop.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    Ok(hist)
}

impl Running {
    /// Starts counting acknowledgements, errors and time.
    pub fn measure_from_now(&mut self) {
        self.errors_before = self.errors.load(Ordering::Relaxed);
        self.started = Instant::now();
        self.measuring.store(true, Ordering::Relaxed);
    }

    /// Records acknowledged since [`Running::measure_from_now`], so far.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }

    /// Failed produces since [`Running::measure_from_now`], so far.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed) - self.errors_before
    }

    /// Stops counting and the producers; returns what was counted.
    pub async fn finish(self) -> Result<Measured, CliError> {
        self.measuring.store(false, Ordering::Relaxed);
        let seconds = self.started.elapsed().as_secs_f64();
        let records = self.acked.load(Ordering::Relaxed);
        let errors = self.errors.load(Ordering::Relaxed) - self.errors_before;
        self.stop.store(true, Ordering::Relaxed);
        let mut hist = histogram()?;
        for task in self.tasks {
            let abort = task.abort_handle();
            match tokio::time::timeout(Duration::from_millis(STOP_WAIT_MS), task).await {
                Ok(Ok(Ok(h))) => {
                    let _ = hist.add(&h);
                }
                Ok(Ok(Err(e))) => return Err(e),
                Ok(Err(e)) => return Err(CliError::Bench(format!("a producer failed: {e}"))),
                // A producer stuck on a broker that stopped answering.
                Err(_) => abort.abort(),
            }
        }
        Ok(Measured {
            records,
            seconds,
            hist,
            errors,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn equal_bands_cover_the_keyspace_in_halves() {
        let bands = equal_bands(4);
        assert_eq!(bands.first().map(|b| b.0), Some(0));
        assert_eq!(bands.last().map(|b| b.1), Some(1u128 << 64));
        assert_eq!(bands[2], (1u64 << 63, 3u128 << 62));
        assert!(bands.windows(2).all(|w| u128::from(w[1].0) == w[0].1));
    }

    #[test]
    fn every_key_of_a_band_falls_in_it() {
        let half = 1u64 << 63;
        let bands = vec![(0, u128::from(half)), (half, 1u128 << 64)];
        let keys = keys_by_band(&bands, 16).unwrap();
        assert_eq!(keys.len(), 2);
        for ((start, end), keys) in bands.iter().zip(&keys) {
            assert_eq!(keys.len(), 16);
            for key in keys {
                let p = malachi_core::model::position(key);
                assert!(*start <= p && u128::from(p) < *end);
            }
        }
    }
}
