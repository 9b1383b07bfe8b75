//! The restart-intensity window, as pure logic over explicit instants so it can
//! be tested without a runtime and driven by any clock.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::spec::Intensity;

/// Remembers the instants of recent restarts and says when there were more
/// than `restarts_max` of them within `period_ms`.
#[derive(Debug, Clone)]
pub struct RestartWindow {
    intensity: Intensity,
    /// Restart instants within the current period, oldest first. Never longer
    /// than `restarts_max + 1`: one more than the budget is already a verdict.
    recent: VecDeque<Instant>,
}

impl RestartWindow {
    /// An empty window.
    pub fn new(intensity: Intensity) -> Self {
        Self {
            intensity,
            recent: VecDeque::new(),
        }
    }

    /// Record a restart at `now`. Returns `true` when this restart exceeds
    /// the intensity, i.e. the supervisor must give up and escalate.
    pub fn record(&mut self, now: Instant) -> bool {
        let period = Duration::from_millis(self.intensity.period_ms);
        while let Some(&oldest) = self.recent.front() {
            if now.saturating_duration_since(oldest) >= period {
                self.recent.pop_front();
            } else {
                break;
            }
        }
        self.recent.push_back(now);
        let exceeded = self.recent.len() > self.intensity.restarts_max as usize;
        if exceeded {
            // Keep the bound even if a caller ignores the verdict.
            while self.recent.len() > self.intensity.restarts_max as usize + 1 {
                self.recent.pop_front();
            }
        }
        debug_assert!(self.recent.len() <= self.intensity.restarts_max as usize + 1);
        exceeded
    }

    /// How many restarts the current window holds.
    pub fn len(&self) -> usize {
        self.recent.len()
    }

    /// Whether the window holds no restart.
    pub fn is_empty(&self) -> bool {
        self.recent.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(restarts_max: u32, period_ms: u64) -> RestartWindow {
        RestartWindow::new(Intensity {
            restarts_max,
            period_ms,
        })
    }

    #[test]
    fn restarts_up_to_the_budget_within_the_period_are_tolerated() {
        let mut w = window(3, 1_000);
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(!w.record(t0 + Duration::from_millis(i * 10)));
        }
        assert!(w.record(t0 + Duration::from_millis(40)));
    }

    #[test]
    fn restarts_older_than_the_period_are_forgotten() {
        let mut w = window(2, 100);
        let t0 = Instant::now();
        assert!(!w.record(t0));
        assert!(!w.record(t0 + Duration::from_millis(50)));
        // The first restart has left the window by now.
        assert!(!w.record(t0 + Duration::from_millis(120)));
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn zero_budget_escalates_on_the_first_restart() {
        let mut w = window(0, 1_000);
        assert!(w.record(Instant::now()));
    }
}
