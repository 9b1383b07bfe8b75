//! Rate-limited logging of refused connections, for the ports that close a
//! connection past their limit at accept (the admin port, the node fabric).
//!
//! A flood of connections must cost a bounded number of log lines, not one
//! each: the first refusal is logged at once, later ones at most once per
//! [`REFUSAL_LOG_INTERVAL_MS`], each line carrying how many refusals it kept
//! quiet about since the previous one.

use std::time::{Duration, Instant};

/// At most one refusal line per port per this many milliseconds.
pub(crate) const REFUSAL_LOG_INTERVAL_MS: u64 = 10_000;

/// One port's refusal log: whether a refusal should be logged now.
#[derive(Debug)]
pub(crate) struct RefusalLog {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RefusalLog {
    pub(crate) fn new(interval_ms: u64) -> RefusalLog {
        RefusalLog {
            interval: Duration::from_millis(interval_ms),
            last: None,
            suppressed: 0,
        }
    }

    /// Counts one refusal at `now`: `Some(n)` if it is to be logged, `n`
    /// being the refusals left unlogged since the previous line; `None` if it
    /// is only counted.
    pub(crate) fn admit(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < self.interval)
        {
            self.suppressed = self.suppressed.saturating_add(1);
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_refusal_is_logged_then_one_summary_per_interval_with_the_count() {
        let mut log = RefusalLog::new(10_000);
        let t0 = Instant::now();
        assert_eq!(log.admit(t0), Some(0));
        for i in 1..=1_999u64 {
            assert_eq!(log.admit(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(log.admit(t0 + Duration::from_millis(9_999)), None);
        assert_eq!(log.admit(t0 + Duration::from_millis(10_000)), Some(2_000));
        assert_eq!(log.admit(t0 + Duration::from_millis(10_001)), None);
        assert_eq!(log.admit(t0 + Duration::from_millis(20_000)), Some(1));
    }
}
