//! The consumers of the workload, all plain `fetch` loops (a fetch only
//! reads, so retrying one is always safe):
//!
//! - `live` reads from the start of the log and follows it for the whole
//!   run;
//! - `resumer` reads the same way, saves the cursor of some batches, and
//!   every `resume_every_ms` goes back to an old saved cursor (logged as
//!   `resume`: a new pass, which must not redeliver anything at or before
//!   that cursor);
//! - `final` runs once the producers have stopped and the cluster is
//!   healed: it reads from the start until the log has nothing more
//!   (`FINAL_EMPTY_FETCHES` long polls in a row come back empty), then logs
//!   `final_read`;
//! - `live`, too, once the producers have stopped, reads on to the end of
//!   the log and logs `final_read` for its pass from the start: two final
//!   readers, one that followed the run and one that reads it afresh.
//!
//! Every delivered record is logged as `read` with the batch's
//! `next_cursor`. A record whose value is not `"key:seq"` is logged with
//! seq 0 (the workload never writes seq 0), so the checker reports it as
//! never written rather than the driver hiding it.
//!
//! A fetch that fails after the client's own retries is counted, and the
//! consumer opens a new client a broker further in the rotation and tries
//! the same position again after a backoff.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use malachi_chaos_checker::Event;
use malachi_wire::messages::FetchRequest;
use malachi_wire::{Client, ErrorCode};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::brokers::Brokers;
use crate::history::History;
use crate::stats::{Stats, error_kind};

/// Records asked per fetch.
const FETCH_RECORDS_MAX: u32 = 1_000;
/// Block bytes asked per fetch.
const FETCH_BYTES_MAX: u32 = 1 << 20;
/// The long poll of one fetch; below the client's request timeout.
const FETCH_WAIT_MS: u32 = 500;
/// Backoff after a failed fetch: from the first, doubling, to the max.
const FETCH_BACKOFF_MS_MIN: u64 = 100;
const FETCH_BACKOFF_MS_MAX: u64 = 2_000;
/// Empty long polls in a row that make the final read call the log ended.
const FINAL_EMPTY_FETCHES: u32 = 3;
/// Cursors the resumer keeps to go back to.
const SAVED_CURSORS_MAX: usize = 64;
/// The resumer saves the cursor of one batch in this many.
const SAVE_EVERY_BATCHES: u64 = 4;

/// How a consumer reads.
#[derive(Debug, Clone)]
pub enum Role {
    Live,
    Resumer {
        /// How often it goes back to an old cursor.
        resume_every_ms: u64,
        /// Seeds the choice of cursor, so a seed replays it.
        seed: u64,
    },
}

/// What the final read found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FinalOutcome {
    /// The reader's name in the history.
    pub consumer: String,
    /// The one broker it started at, for a pinned reader.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker: Option<String>,
    /// Whether it reached the end of the log (and logged `final_read`).
    pub complete: bool,
    pub records: u64,
    pub millis: u64,
    /// Why it did not complete, or the last error it rode out.
    pub error: Option<String>,
}

/// One position in the log: the start, or a cursor.
#[derive(Debug, Clone)]
struct Position(Option<String>);

impl Position {
    fn request(&self, topic: &str) -> FetchRequest {
        FetchRequest {
            topic: topic.to_owned(),
            cursor: self.0.clone(),
            from_start: self.0.is_none(),
            records_max: FETCH_RECORDS_MAX,
            bytes_max: FETCH_BYTES_MAX,
            wait_ms: FETCH_WAIT_MS,
        }
    }
}

/// A fetching client that rotates on failure.
struct Reader {
    name: String,
    topic: String,
    brokers: Brokers,
    client: Option<Client>,
    rotation: usize,
    failures: u32,
    /// For a reader pinned to one broker: its address, logged with its
    /// `final_read`.
    pinned: Option<String>,
}

/// What one fetch gave.
enum Fetched {
    /// Records (possibly none) and the cursor after them.
    Batch(u64),
    /// It failed; the reader backed off and will rotate.
    Failed(String),
    Stopped,
}

impl Reader {
    /// Fetches at `position` and logs what it delivered; moves `position`
    /// past it.
    async fn fetch(
        &mut self,
        position: &mut Position,
        history: &History,
        stats: &Stats,
        stop: &watch::Receiver<bool>,
    ) -> Fetched {
        if self.client.is_none() {
            match self
                .brokers
                .connect_until(&mut self.rotation, stop, &self.name)
                .await
            {
                Some(client) => self.client = Some(client),
                None => return Fetched::Stopped,
            }
        }
        let Some(client) = &self.client else {
            return Fetched::Stopped;
        };
        match client.fetch(&position.request(&self.topic)).await {
            Ok(response) => {
                self.failures = 0;
                let records = response.records.records();
                let cursor = response.next_cursor;
                for record in &records {
                    let key = String::from_utf8_lossy(&record.key).into_owned();
                    let value = String::from_utf8_lossy(&record.value).into_owned();
                    let seq = parse_seq(&key, &value);
                    history.log(|t_ms| Event::Read {
                        t_ms,
                        consumer: self.name.clone(),
                        key,
                        seq,
                        value,
                        cursor: cursor.clone(),
                    });
                }
                let n = records.len() as u64;
                stats.read(&self.name, n);
                if n > 0 {
                    // An empty batch's cursor is the position it was asked
                    // at: keep the one we have (the start stays "from start").
                    position.0 = Some(cursor);
                }
                Fetched::Batch(n)
            }
            Err(error) => {
                stats.error(&self.name, &error);
                if error.code() == Some(ErrorCode::DataLoss) {
                    stats.data_loss.fetch_add(1, Ordering::Relaxed);
                }
                let kind = error_kind(&error);
                let text = error.to_string();
                eprintln!("chaos-driver: {}: fetch failed ({kind}): {text}", self.name);
                self.client = None;
                self.rotation = self.rotation.wrapping_add(1);
                self.failures += 1;
                let wait = FETCH_BACKOFF_MS_MIN
                    .saturating_mul(1 << self.failures.min(8))
                    .min(FETCH_BACKOFF_MS_MAX);
                tokio::time::sleep(Duration::from_millis(wait)).await;
                Fetched::Failed(format!("{kind}: {text}"))
            }
        }
    }
}

/// The seq in a value `"key:seq"` of `key`, or 0 when it is not one.
pub fn parse_seq(key: &str, value: &str) -> u64 {
    value
        .strip_prefix(key)
        .and_then(|rest| rest.strip_prefix(':'))
        .and_then(|digits| digits.parse().ok())
        .unwrap_or(0)
}

/// A small seeded generator (xorshift64*): the resumer's choices replay
/// from the seed.
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-enough in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// One consumer of the run.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    /// The name in the history (`consumer`).
    pub name: String,
    pub role: Role,
    pub topic: String,
    /// Where in the broker list its first client starts.
    pub rotation: usize,
    /// After the stop, how long `live` may take to read on to the end of
    /// the log.
    pub tail_timeout_ms: u64,
}

/// Runs a live or resuming consumer until `stop`. The driver stops the
/// consumers only once the producers have stopped and drained, so at the
/// stop `live` reads on to the end of the log and logs `final_read` for
/// its pass: a pass from the start that saw the whole run, judged for
/// lost writes even when a fresh read from the start cannot finish.
pub async fn run(
    settings: ConsumerSettings,
    brokers: Brokers,
    history: Arc<History>,
    stats: Arc<Stats>,
    stop: watch::Receiver<bool>,
) -> Option<FinalOutcome> {
    let ConsumerSettings {
        name,
        role,
        topic,
        rotation,
        tail_timeout_ms,
    } = settings;
    let mut reader = Reader {
        name,
        topic,
        brokers,
        client: None,
        rotation,
        failures: 0,
        pinned: None,
    };
    let mut position = Position(None);
    let mut saved: VecDeque<String> = VecDeque::new();
    let mut batches: u64 = 0;
    let (resume_every, mut rng) = match &role {
        Role::Live => (None, Rng::new(0)),
        Role::Resumer {
            resume_every_ms,
            seed,
        } => (
            Some(Duration::from_millis(*resume_every_ms)),
            Rng::new(*seed),
        ),
    };
    let mut next_resume = resume_every.map(|every| Instant::now() + every);
    loop {
        if *stop.borrow() {
            return match role {
                Role::Live => Some(
                    read_to_end(
                        &mut reader,
                        &mut position,
                        &history,
                        &stats,
                        tail_timeout_ms,
                    )
                    .await,
                ),
                Role::Resumer { .. } => None,
            };
        }
        if let (Some(at), Some(every)) = (next_resume, resume_every)
            && Instant::now() >= at
        {
            // Go back to one of the older half of the saved cursors.
            if !saved.is_empty() {
                let pick = rng.below(saved.len().div_ceil(2));
                if let Some(cursor) = saved.get(pick).cloned() {
                    history.log(|t_ms| Event::Resume {
                        t_ms,
                        consumer: reader.name.clone(),
                        cursor: cursor.clone(),
                    });
                    stats.resumes.fetch_add(1, Ordering::Relaxed);
                    position = Position(Some(cursor));
                }
            }
            next_resume = Some(Instant::now() + every);
        }
        match reader.fetch(&mut position, &history, &stats, &stop).await {
            Fetched::Batch(n) if n > 0 => {
                batches += 1;
                if resume_every.is_some()
                    && batches.is_multiple_of(SAVE_EVERY_BATCHES)
                    && let Some(cursor) = &position.0
                {
                    if saved.len() == SAVED_CURSORS_MAX {
                        saved.pop_front();
                    }
                    saved.push_back(cursor.clone());
                }
            }
            Fetched::Batch(_) | Fetched::Failed(_) => {}
            Fetched::Stopped => {}
        }
    }
}

/// Reads the whole log from the start, once, for at most `timeout_ms`, as
/// consumer `name`. With `pinned`, every client the reader opens has that
/// one broker as its only bootstrap address: the read begins there each
/// time and goes elsewhere only where the broker's answers send it (the
/// hints the client follows), so it shows what a consumer that starts at
/// that broker gets. Without, it rotates over `brokers` like the others.
pub async fn final_read(
    name: String,
    pinned: Option<String>,
    topic: String,
    brokers: Brokers,
    history: Arc<History>,
    stats: Arc<Stats>,
    timeout_ms: u64,
) -> FinalOutcome {
    let brokers = match &pinned {
        Some(addr) => brokers.only(addr),
        None => brokers,
    };
    let mut reader = Reader {
        name,
        topic,
        brokers,
        client: None,
        rotation: 0,
        failures: 0,
        pinned,
    };
    read_to_end(
        &mut reader,
        &mut Position(None),
        &history,
        &stats,
        timeout_ms,
    )
    .await
}

/// Reads on from `position` until the log has nothing more
/// (`FINAL_EMPTY_FETCHES` empty long polls in a row), then logs
/// `final_read` for the reader's pass; gives up after `timeout_ms`
/// without logging it.
async fn read_to_end(
    reader: &mut Reader,
    position: &mut Position,
    history: &History,
    stats: &Stats,
    timeout_ms: u64,
) -> FinalOutcome {
    let started = Instant::now();
    let deadline = started + Duration::from_millis(timeout_ms);
    // Never stopped from outside: the deadline bounds it.
    let (_keep, stop) = watch::channel(false);
    let mut records = 0u64;
    let mut empty_in_a_row = 0u32;
    let mut last_error = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return FinalOutcome {
                consumer: reader.name.clone(),
                broker: reader.pinned.clone(),
                complete: false,
                records,
                millis: started.elapsed().as_millis() as u64,
                error: Some(
                    last_error.unwrap_or_else(|| "the read to the end timed out".to_owned()),
                ),
            };
        }
        match tokio::time::timeout(left, reader.fetch(position, history, stats, &stop)).await {
            Ok(Fetched::Batch(0)) => {
                empty_in_a_row += 1;
                if empty_in_a_row >= FINAL_EMPTY_FETCHES {
                    break;
                }
            }
            Ok(Fetched::Batch(n)) => {
                records += n;
                empty_in_a_row = 0;
            }
            Ok(Fetched::Failed(error)) => {
                // A failure is not the end of the log.
                empty_in_a_row = 0;
                last_error = Some(error);
            }
            Ok(Fetched::Stopped) | Err(_) => {}
        }
    }
    history.log(|t_ms| Event::FinalRead {
        t_ms,
        consumer: reader.name.clone(),
        broker: reader.pinned.clone(),
    });
    FinalOutcome {
        consumer: reader.name.clone(),
        broker: reader.pinned.clone(),
        complete: true,
        records,
        millis: started.elapsed().as_millis() as u64,
        error: last_error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_of_the_workload_gives_its_seq_and_anything_else_gives_zero() {
        assert_eq!(parse_seq("p0-k1", "p0-k1:17"), 17);
        assert_eq!(parse_seq("p0-k1", "p0-k2:17"), 0);
        assert_eq!(parse_seq("p0-k1", "p0-k1:x"), 0);
        assert_eq!(parse_seq("p0-k1", "garbage"), 0);
    }

    #[test]
    fn the_generator_replays_from_its_seed() {
        let a: Vec<u64> = {
            let mut rng = Rng::new(7);
            (0..5).map(|_| rng.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut rng = Rng::new(7);
            (0..5).map(|_| rng.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, {
            let mut rng = Rng::new(8);
            (0..5).map(|_| rng.next_u64()).collect::<Vec<_>>()
        });
    }
}
