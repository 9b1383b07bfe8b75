//! The write rate of each range this broker writes (ADR 0143): the produce
//! path counts every part a segment stored, the reshaper and `topic
//! describe` read it.
//!
//! The meters are `malachi_core::rate`'s, fed the broker clock's time. The
//! registry is bounded (`RATE_RANGES_MAX`): a new range past the bound
//! takes the place of the range written longest ago, so a broker that
//! stopped writing a range (a split, a failover) forgets it in time. It
//! also keeps the recent automatic reshapes, per topic, for `topic
//! describe`: in memory, so a restart forgets them (the lineage in the
//! metadata stays).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use malachi_core::model::{RangeId, position};
use malachi_core::rate::{HotKeys, Rate, RateMeter};
use malachi_wire::messages::{RESHAPE_HISTORY_MAX, RangeRate, ReshapeEvent, TopicReshaping};

use super::config::rate_bucket_ms;

/// The most ranges one broker meters at once: as many as one
/// replica-status answer carries, so a live describe's ask is answerable.
pub(crate) const RATE_RANGES_MAX: usize = malachi_wire::replica_status::REPLICA_STATUS_RATES_MAX;
/// The most topics whose reshape history one broker keeps.
pub(crate) const RESHAPE_HISTORY_TOPICS_MAX: usize = 1_024;

#[derive(Debug)]
struct RangeMeter {
    topic: String,
    meter: RateMeter,
    hot: HotKeys,
    last_ms: u64,
    /// Set by the reshaper while a split is held back by one hot key.
    hot_key_unsplittable: bool,
}

/// One range's figures at an instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RangeSample {
    pub topic: String,
    pub range: RangeId,
    pub rate: Rate,
    pub hot_key_share_permille: Option<u64>,
    pub hot_key_unsplittable: bool,
}

#[derive(Debug, Default)]
struct Inner {
    ranges: BTreeMap<RangeId, RangeMeter>,
    history: BTreeMap<String, VecDeque<ReshapeEvent>>,
}

/// The broker's per-range meters and reshape history.
#[derive(Debug)]
pub(crate) struct RangeRates {
    window_ms: u64,
    inner: Mutex<Inner>,
}

impl RangeRates {
    pub fn new(window_ms: u64) -> RangeRates {
        RangeRates {
            window_ms,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves figures, not invariants:
        // the meters stay usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn meter(&self) -> RateMeter {
        match RateMeter::new(self.window_ms, rate_bucket_ms(self.window_ms)) {
            Ok(meter) => meter,
            // The broker config was validated with the same bounds.
            Err(e) => panic!("rate window checked at start: {e}"),
        }
    }

    /// Counts records a segment of `range` stored at `now_ms`: each
    /// record's key and value bytes, under its key's position.
    pub fn record<'a>(
        &self,
        now_ms: u64,
        topic: &str,
        range: RangeId,
        records: impl Iterator<Item = (&'a [u8], u64)>,
    ) {
        let mut inner = self.lock();
        if !inner.ranges.contains_key(&range) && inner.ranges.len() >= RATE_RANGES_MAX {
            let oldest = inner
                .ranges
                .iter()
                .min_by_key(|(id, m)| (m.last_ms, **id))
                .map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                inner.ranges.remove(&oldest);
            }
        }
        let fresh = || RangeMeter {
            topic: topic.to_owned(),
            meter: self.meter(),
            hot: HotKeys::new(self.window_ms),
            last_ms: now_ms,
            hot_key_unsplittable: false,
        };
        let entry = inner.ranges.entry(range).or_insert_with(fresh);
        let (mut bytes, mut count) = (0u64, 0u64);
        for (key, size) in records {
            entry.hot.record(now_ms, position(key), size);
            bytes = bytes.saturating_add(size);
            count += 1;
        }
        entry.meter.record(now_ms, bytes, count);
        entry.last_ms = entry.last_ms.max(now_ms);
        assert!(
            inner.ranges.len() <= RATE_RANGES_MAX,
            "range meters are bounded"
        );
    }

    /// Every metered range's figures at `now_ms`.
    pub fn samples(&self, now_ms: u64) -> Vec<RangeSample> {
        let mut inner = self.lock();
        inner
            .ranges
            .iter_mut()
            .map(|(range, m)| RangeSample {
                topic: m.topic.clone(),
                range: *range,
                rate: m.meter.rate(now_ms),
                hot_key_share_permille: m.hot.hottest_share_permille(now_ms),
                hot_key_unsplittable: m.hot_key_unsplittable,
            })
            .collect()
    }

    /// Forgets the ranges `keep` refuses (no longer active here).
    pub fn retain(&self, keep: impl Fn(RangeId) -> bool) {
        self.lock().ranges.retain(|id, _| keep(*id));
    }

    /// Marks whether a range's split is held back by one hot key.
    pub fn set_hot_key_unsplittable(&self, range: RangeId, unsplittable: bool) {
        if let Some(m) = self.lock().ranges.get_mut(&range) {
            m.hot_key_unsplittable = unsplittable;
        }
    }

    /// Keeps an automatic reshape in its topic's recent history.
    pub fn remember(&self, topic: &str, event: ReshapeEvent) {
        let mut inner = self.lock();
        if !inner.history.contains_key(topic) && inner.history.len() >= RESHAPE_HISTORY_TOPICS_MAX {
            let first = inner.history.keys().next().cloned();
            if let Some(first) = first {
                inner.history.remove(&first);
            }
        }
        let events = inner.history.entry(topic.to_owned()).or_default();
        events.push_back(event);
        while events.len() > RESHAPE_HISTORY_MAX {
            events.pop_front();
        }
    }

    /// `topic`'s rates as broker `me` measured them (the ranges it writes)
    /// and the reshapes of it `me` asked for, as `topic describe` shows
    /// them; `None` when there is neither.
    pub fn reshaping(&self, now_ms: u64, topic: &str, me: u64) -> Option<TopicReshaping> {
        let rates: Vec<RangeRate> = self
            .samples(now_ms)
            .into_iter()
            .filter(|s| s.topic == topic)
            .map(|s| RangeRate {
                range: s.range.0,
                primary: me,
                write_bytes_per_second: s.rate.bytes_per_second,
                write_records_per_second: s.rate.records_per_second,
                hot_key_share_permille: s.hot_key_share_permille,
                hot_key_unsplittable: s.hot_key_unsplittable,
            })
            .collect();
        let history = self.history(topic);
        if rates.is_empty() && history.is_empty() {
            return None;
        }
        assert!(rates.len() <= RATE_RANGES_MAX, "one rate per metered range");
        Some(TopicReshaping { rates, history })
    }

    /// A topic's recent automatic reshapes, oldest first.
    pub fn history(&self, topic: &str) -> Vec<ReshapeEvent> {
        self.lock()
            .history
            .get(topic)
            .map(|events| events.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed(n: usize, key: &[u8]) -> Vec<(&[u8], u64)> {
        vec![(key, 100); n]
    }

    #[test]
    fn a_range_written_steadily_has_its_rate() {
        let rates = RangeRates::new(1_000);
        for i in 0..20u64 {
            rates.record(i * 100, "t", RangeId(1), keyed(10, b"k").into_iter());
        }
        let samples = rates.samples(2_000);
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].rate.records_per_second, 100);
        assert_eq!(samples[0].hot_key_share_permille, Some(1_000));
    }

    #[test]
    fn the_meters_are_bounded() {
        let rates = RangeRates::new(1_000);
        for i in 0..(RATE_RANGES_MAX as u64 + 10) {
            rates.record(i, "t", RangeId(i), keyed(1, b"k").into_iter());
        }
        let samples = rates.samples(RATE_RANGES_MAX as u64 + 10);
        assert_eq!(samples.len(), RATE_RANGES_MAX);
        // The ranges written longest ago went first.
        assert!(samples.iter().all(|s| s.range.0 >= 10));
    }

    #[test]
    fn the_history_keeps_the_latest_events() {
        let rates = RangeRates::new(1_000);
        for i in 0..(RESHAPE_HISTORY_MAX as u64 + 3) {
            rates.remember(
                "t",
                ReshapeEvent {
                    at_ms: i,
                    ..ReshapeEvent::default()
                },
            );
        }
        let history = rates.history("t");
        assert_eq!(history.len(), RESHAPE_HISTORY_MAX);
        assert_eq!(history[0].at_ms, 3);
    }
}
