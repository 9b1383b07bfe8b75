//! Write rates, measured without a clock (issue 38, L11; ADR 0143).
//!
//! A [`RateMeter`] counts the bytes and records appended to one range in
//! fixed buckets of `bucket_ms` and reports their rate over the last
//! `window_ms`: a sliding window, so a burst leaves the rate once it is
//! older than the window, and a meter younger than its window divides by
//! its age (never less than one bucket) rather than by the whole window.
//! A [`Streak`] says how long a condition ("above the split threshold")
//! has held at the instants it was observed. [`HotKeys`] is a space-saving
//! top-k sketch over key hashes: how much of the window's bytes the single
//! hottest key carries, as a lower bound.
//!
//! Every function takes the time as milliseconds from the caller: the same
//! calls give the same answers, so the decisions built on them are tested
//! without waiting.

use std::collections::VecDeque;

/// The most buckets a meter keeps (`window_ms / bucket_ms`, rounded up).
pub const RATE_BUCKETS_MAX: u64 = 600;
/// The keys a [`HotKeys`] sketch tracks at most: the hottest key's share is
/// exact when fewer distinct keys were seen, a lower bound otherwise.
pub const HOT_KEYS_TRACKED_MAX: usize = 16;

/// A rate over the meter's window, in whole units per second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rate {
    pub bytes_per_second: u64,
    pub records_per_second: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bucket {
    /// The bucket's start, a multiple of `bucket_ms`.
    start_ms: u64,
    bytes: u64,
    records: u64,
}

/// Why a meter cannot be built with these bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    #[error("a rate bucket of 0 ms measures nothing")]
    ZeroBucket,
    #[error("a rate window of {window_ms} ms is shorter than its bucket of {bucket_ms} ms")]
    WindowBelowBucket { window_ms: u64, bucket_ms: u64 },
    #[error(
        "a rate window of {window_ms} ms in buckets of {bucket_ms} ms needs more than {RATE_BUCKETS_MAX} buckets"
    )]
    TooManyBuckets { window_ms: u64, bucket_ms: u64 },
}

/// Bytes and records per second over a sliding window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateMeter {
    window_ms: u64,
    bucket_ms: u64,
    /// When the meter first counted something: a young meter divides by
    /// its age.
    first_ms: Option<u64>,
    /// Oldest first; starts strictly increasing.
    buckets: VecDeque<Bucket>,
}

impl RateMeter {
    /// A meter over the last `window_ms`, counted in buckets of `bucket_ms`.
    pub fn new(window_ms: u64, bucket_ms: u64) -> Result<RateMeter, RateError> {
        if bucket_ms == 0 {
            return Err(RateError::ZeroBucket);
        }
        if window_ms < bucket_ms {
            return Err(RateError::WindowBelowBucket {
                window_ms,
                bucket_ms,
            });
        }
        if window_ms.div_ceil(bucket_ms) > RATE_BUCKETS_MAX {
            return Err(RateError::TooManyBuckets {
                window_ms,
                bucket_ms,
            });
        }
        Ok(RateMeter {
            window_ms,
            bucket_ms,
            first_ms: None,
            buckets: VecDeque::new(),
        })
    }

    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// Counts an append at `now_ms`. Time that goes back (a caller's clock
    /// stepping) counts in the newest bucket: a meter never reorders.
    pub fn record(&mut self, now_ms: u64, bytes: u64, records: u64) {
        let start_ms = now_ms - now_ms % self.bucket_ms;
        self.first_ms.get_or_insert(now_ms);
        match self.buckets.back_mut() {
            Some(last) if last.start_ms >= start_ms => {
                last.bytes = last.bytes.saturating_add(bytes);
                last.records = last.records.saturating_add(records);
            }
            _ => self.buckets.push_back(Bucket {
                start_ms,
                bytes,
                records,
            }),
        }
        self.expire(now_ms);
    }

    /// Drops the buckets wholly older than the window.
    fn expire(&mut self, now_ms: u64) {
        let horizon = now_ms.saturating_sub(self.window_ms);
        while let Some(first) = self.buckets.front() {
            if first.start_ms + self.bucket_ms <= horizon {
                self.buckets.pop_front();
            } else {
                break;
            }
        }
        assert!(
            self.buckets.len() as u64 <= RATE_BUCKETS_MAX + 1,
            "a rate meter holds at most its window's buckets"
        );
    }

    /// The rate over the window ending at `now_ms`.
    pub fn rate(&self, now_ms: u64) -> Rate {
        let Some(first_ms) = self.first_ms else {
            return Rate::default();
        };
        let horizon = now_ms.saturating_sub(self.window_ms);
        let (bytes, records) = self
            .buckets
            .iter()
            .filter(|b| b.start_ms + self.bucket_ms > horizon)
            .fold((0u64, 0u64), |(by, re), b| {
                (by.saturating_add(b.bytes), re.saturating_add(b.records))
            });
        let age_ms = now_ms.saturating_sub(first_ms);
        let span_ms = age_ms.clamp(self.bucket_ms, self.window_ms);
        Rate {
            bytes_per_second: per_second(bytes, span_ms),
            records_per_second: per_second(records, span_ms),
        }
    }

    /// Whether nothing was counted within the window ending at `now_ms`.
    pub fn is_idle(&self, now_ms: u64) -> bool {
        self.rate(now_ms) == Rate::default()
    }
}

fn per_second(count: u64, span_ms: u64) -> u64 {
    let rate = u128::from(count) * 1_000 / u128::from(span_ms.max(1));
    u64::try_from(rate).unwrap_or(u64::MAX)
}

/// How long a condition has held, judged at the instants it was observed.
/// A condition observed false resets it; one never observed false since
/// `since_ms` has held from then.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Streak {
    since_ms: Option<u64>,
}

impl Streak {
    /// Observes the condition at `now_ms`.
    pub fn observe(&mut self, now_ms: u64, holds: bool) {
        if holds {
            self.since_ms.get_or_insert(now_ms);
        } else {
            self.since_ms = None;
        }
    }

    /// How long it has held at `now_ms` (0 when it does not hold).
    pub fn held_ms(&self, now_ms: u64) -> u64 {
        self.since_ms
            .map_or(0, |since| now_ms.saturating_sub(since))
    }

    /// Whether it has held for at least `duration_ms`.
    pub fn held_for(&self, now_ms: u64, duration_ms: u64) -> bool {
        self.since_ms.is_some() && self.held_ms(now_ms) >= duration_ms
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counter {
    key: u64,
    /// An overestimate of the key's bytes: `count - error` is a lower bound.
    count: u64,
    error: u64,
}

/// One window's space-saving sketch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Sketch {
    counters: Vec<Counter>,
    total: u64,
}

impl Sketch {
    fn add(&mut self, key: u64, bytes: u64) {
        self.total = self.total.saturating_add(bytes);
        if let Some(c) = self.counters.iter_mut().find(|c| c.key == key) {
            c.count = c.count.saturating_add(bytes);
            return;
        }
        if self.counters.len() < HOT_KEYS_TRACKED_MAX {
            self.counters.push(Counter {
                key,
                count: bytes,
                error: 0,
            });
            return;
        }
        // Space saving: the smallest counter gives its place to the new key,
        // which inherits its count as its possible error.
        if let Some(min) = self.counters.iter_mut().min_by_key(|c| (c.count, c.key)) {
            *min = Counter {
                key,
                count: min.count.saturating_add(bytes),
                error: min.count,
            };
        }
    }

    /// The hottest key and a lower bound of its bytes.
    fn hottest(&self) -> Option<(u64, u64)> {
        self.counters
            .iter()
            .map(|c| (c.key, c.count - c.error))
            .max_by_key(|&(key, bytes)| (bytes, std::cmp::Reverse(key)))
    }
}

/// The share of a range's bytes its hottest key carries, over windows of
/// `window_ms`: the last full window with the current one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotKeys {
    window_ms: u64,
    current_start_ms: u64,
    current: Sketch,
    previous: Sketch,
}

impl HotKeys {
    pub fn new(window_ms: u64) -> HotKeys {
        HotKeys {
            window_ms: window_ms.max(1),
            current_start_ms: 0,
            current: Sketch::default(),
            previous: Sketch::default(),
        }
    }

    fn rotate(&mut self, now_ms: u64) {
        if now_ms < self.current_start_ms + self.window_ms {
            return;
        }
        let gap = now_ms - self.current_start_ms;
        self.previous = if gap < 2 * self.window_ms {
            std::mem::take(&mut self.current)
        } else {
            self.current = Sketch::default();
            Sketch::default()
        };
        self.current_start_ms = now_ms - now_ms % self.window_ms;
    }

    /// Counts `bytes` under a key's hash at `now_ms`.
    pub fn record(&mut self, now_ms: u64, key: u64, bytes: u64) {
        self.rotate(now_ms);
        self.current.add(key, bytes);
    }

    /// The hottest key's share of the bytes, in per mille (a lower bound),
    /// or `None` when nothing was counted in the last two windows.
    pub fn hottest_share_permille(&mut self, now_ms: u64) -> Option<u64> {
        self.rotate(now_ms);
        let total = self.current.total.saturating_add(self.previous.total);
        if total == 0 {
            return None;
        }
        let mut by_key: Vec<(u64, u64)> = Vec::new();
        for sketch in [&self.previous, &self.current] {
            for c in &sketch.counters {
                let lower = c.count - c.error;
                match by_key.iter_mut().find(|(k, _)| *k == c.key) {
                    Some((_, bytes)) => *bytes = bytes.saturating_add(lower),
                    None => by_key.push((c.key, lower)),
                }
            }
        }
        let top = by_key.iter().map(|&(_, b)| b).max().unwrap_or(0);
        let share = u128::from(top) * 1_000 / u128::from(total);
        Some(u64::try_from(share).unwrap_or(1_000).min(1_000))
    }

    /// The hottest key of the current window (for tests and logs).
    pub fn hottest_key(&self) -> Option<u64> {
        self.current.hottest().map(|(k, _)| k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_steady_load_reads_as_its_rate() {
        let mut meter = RateMeter::new(10_000, 1_000).unwrap();
        for second in 0..30u64 {
            meter.record(second * 1_000, 1_000, 10);
        }
        let rate = meter.rate(30_000);
        assert_eq!(rate.bytes_per_second, 1_000);
        assert_eq!(rate.records_per_second, 10);
    }

    #[test]
    fn a_burst_leaves_the_rate_after_the_window() {
        let mut meter = RateMeter::new(10_000, 1_000).unwrap();
        meter.record(500, 50_000, 50);
        assert!(meter.rate(5_000).bytes_per_second > 0);
        assert_eq!(meter.rate(11_001), Rate::default());
        assert!(meter.is_idle(11_001));
    }

    #[test]
    fn a_young_meter_divides_by_its_age_not_its_window() {
        let mut meter = RateMeter::new(60_000, 1_000).unwrap();
        meter.record(0, 4_000, 4);
        meter.record(1_999, 4_000, 4);
        assert_eq!(meter.rate(2_000).bytes_per_second, 4_000);
    }

    #[test]
    fn bounds_are_refused() {
        assert_eq!(RateMeter::new(1_000, 0), Err(RateError::ZeroBucket));
        assert!(RateMeter::new(10, 100).is_err());
        assert!(RateMeter::new(RATE_BUCKETS_MAX * 10 + 10, 10).is_err());
    }

    #[test]
    fn a_streak_holds_until_observed_false() {
        let mut streak = Streak::default();
        assert!(!streak.held_for(0, 0));
        streak.observe(1_000, true);
        streak.observe(2_000, true);
        assert!(streak.held_for(31_000, 30_000));
        assert!(!streak.held_for(30_999, 30_000));
        streak.observe(31_000, false);
        assert_eq!(streak.held_ms(40_000), 0);
        streak.observe(41_000, true);
        assert_eq!(streak.held_ms(42_000), 1_000);
    }

    #[test]
    fn one_key_carrying_everything_has_the_whole_share() {
        let mut hot = HotKeys::new(10_000);
        for i in 0..100 {
            hot.record(i * 10, 7, 100);
        }
        assert_eq!(hot.hottest_share_permille(1_000), Some(1_000));
        assert_eq!(hot.hottest_key(), Some(7));
    }

    #[test]
    fn many_even_keys_have_a_small_share() {
        let mut hot = HotKeys::new(10_000);
        for i in 0..10_000u64 {
            hot.record(i / 10, i % 500, 10);
        }
        let share = hot.hottest_share_permille(1_000).unwrap();
        assert!(share < 100, "share {share}");
    }

    #[test]
    fn the_share_forgets_after_two_windows() {
        let mut hot = HotKeys::new(1_000);
        hot.record(0, 1, 100);
        assert_eq!(hot.hottest_share_permille(1_500), Some(1_000));
        assert_eq!(hot.hottest_share_permille(2_500), None);
    }

    proptest! {
        /// The meter never reports more than it was given over its span,
        /// nor ever holds more than its bound of buckets.
        #[test]
        fn the_rate_is_bounded_by_what_was_counted(
            steps in proptest::collection::vec((0u64..5_000, 0u64..1_000_000, 0u64..1_000), 1..200),
        ) {
            let mut meter = RateMeter::new(10_000, 500).unwrap();
            let mut now = 0u64;
            let mut total = 0u64;
            for (advance, bytes, records) in steps {
                now += advance;
                meter.record(now, bytes, records);
                total += bytes;
                let rate = meter.rate(now);
                // At least one bucket of span: at most the total per 500 ms.
                prop_assert!(rate.bytes_per_second <= total * 2);
                prop_assert!(meter.buckets.len() as u64 <= 10_000 / 500 + 1);
            }
        }

        /// The hottest key's lower bound never exceeds the bytes counted,
        /// and a key with more than half the bytes is always found.
        #[test]
        fn a_majority_key_is_always_seen(
            keys in proptest::collection::vec(0u64..1_000, 1..300),
        ) {
            let mut hot = HotKeys::new(1_000_000);
            for (i, key) in keys.iter().enumerate() {
                hot.record(i as u64, *key, 10);
                hot.record(i as u64, u64::MAX, 11);
            }
            let share = hot.hottest_share_permille(1_000).unwrap();
            prop_assert!(share <= 1_000);
            prop_assert!(share >= 500, "share {}", share);
        }
    }
}
