//! Time as a seam, the one `Clock` of the project (ADR 0090).
//!
//! Whatever reads time (a coordinator stamping `at_ms` on a command, a
//! segment actor judging a segment's age, a lease holder counting down its
//! deadline) reads it through [`Clock`], so tests drive time by hand with
//! [`ManualClock`] and the broker runs on [`SystemClock`]. The pure model
//! never reads a clock: time reaches it inside commands.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Time as the broker sees it.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Milliseconds on a clock that never goes back (deadlines, timeouts);
    /// comparable only within one process.
    fn monotonic_ms(&self) -> u64;

    /// Milliseconds since the Unix epoch: the times commands and records
    /// carry, which other brokers compare.
    fn wall_ms(&self) -> u64;

    /// The wall clock: what the broker stamps commands and records with.
    fn now_ms(&self) -> u64 {
        self.wall_ms()
    }
}

/// The machine's clocks. Its monotonic clock counts from the first time any
/// `SystemClock` in the process read it, so every `SystemClock` agrees.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl SystemClock {
    pub fn new() -> SystemClock {
        SystemClock
    }
}

fn process_origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

impl Clock for SystemClock {
    fn monotonic_ms(&self) -> u64 {
        u64::try_from(process_origin().elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn wall_ms(&self) -> u64 {
        // A clock before 1970 is a broken host; 0 keeps the broker serving.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to (tests). Its wall clock may be
/// offset from its monotonic one, to play skew between brokers, and may
/// jump on its own, to play a stepped wall clock (NTP, an operator).
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicU64,
    wall_offset_ms: AtomicI64,
}

impl ManualClock {
    /// A clock at `now_ms` on both its monotonic and its wall clock.
    pub fn new(now_ms: u64) -> ManualClock {
        ManualClock::skewed(now_ms, 0)
    }

    /// A clock at `now_ms` whose wall clock reads `now_ms + wall_offset_ms`.
    pub fn skewed(now_ms: u64, wall_offset_ms: i64) -> ManualClock {
        ManualClock {
            now_ms: AtomicU64::new(now_ms),
            wall_offset_ms: AtomicI64::new(wall_offset_ms),
        }
    }

    /// Steps the wall clock alone by `delta_ms` (back when negative); the
    /// monotonic clock does not move.
    pub fn jump_wall_ms(&self, delta_ms: i64) {
        self.wall_offset_ms.fetch_add(delta_ms, Ordering::SeqCst);
    }

    /// Moves both clocks forward.
    pub fn advance_ms(&self, delta_ms: u64) {
        self.now_ms.fetch_add(delta_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn monotonic_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn wall_ms(&self) -> u64 {
        self.monotonic_ms()
            .saturating_add_signed(self.wall_offset_ms.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_keeps_its_skew() {
        let clock = ManualClock::skewed(1_000, -300);
        assert_eq!((clock.monotonic_ms(), clock.wall_ms()), (1_000, 700));
        assert_eq!(clock.now_ms(), clock.wall_ms());
        clock.advance_ms(50);
        assert_eq!((clock.monotonic_ms(), clock.wall_ms()), (1_050, 750));
        assert_eq!(ManualClock::new(5).wall_ms(), 5);
        clock.jump_wall_ms(-60_000);
        assert_eq!(clock.monotonic_ms(), 1_050);
        assert_eq!(clock.wall_ms(), 0, "a wall clock before 1970 saturates");
        clock.jump_wall_ms(70_000);
        assert_eq!((clock.monotonic_ms(), clock.wall_ms()), (1_050, 10_750));
    }

    #[test]
    fn every_system_clock_shares_one_monotonic_origin() {
        let a = SystemClock::new().monotonic_ms();
        let b = SystemClock.monotonic_ms();
        assert!(b >= a);
        assert!(SystemClock.wall_ms() > 1_600_000_000_000);
    }
}
