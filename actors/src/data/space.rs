//! The free-space guard (issue 19, ADR 0111): a volume that runs out of
//! space is refused new records before it is full, loudly and at once,
//! and takes them again by itself once space is freed.
//!
//! The guard is a small state machine fed by two sources: the
//! `maintenance/space` worker's poll of the data dir's volume (through
//! [`FreeSpace`], so tests drive it with any figures), and the store's own
//! `ENOSPC` ([`SpaceGuard::note_no_space`]). It goes full when the free
//! bytes fall below `store.min_free_bytes`, and back only once they reach
//! a quarter more ([`SpaceGuard::resume_bytes`]), so a volume hovering at
//! the line does not flap. While full: a produce served here is answered
//! `storage_full` (no roll, no retry storm), `/ready` says not ready, and
//! the metadata groups keep the margin the produces no longer take.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How the guard learns the free bytes of a volume.
pub(crate) trait FreeSpace: Send + Sync + std::fmt::Debug {
    /// Bytes an unprivileged writer may still use on `dir`'s volume.
    fn free_bytes(&self, dir: &Path) -> std::io::Result<u64>;
}

/// A fixed answer: what a test says the volume has.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug)]
pub(crate) struct FixedSpace(pub u64);

#[cfg(any(test, feature = "testing"))]
impl FreeSpace for FixedSpace {
    fn free_bytes(&self, _dir: &Path) -> std::io::Result<u64> {
        Ok(self.0)
    }
}

/// The volume's own answer, from `statvfs`.
#[derive(Debug, Default)]
pub(crate) struct VolumeSpace;

impl FreeSpace for VolumeSpace {
    fn free_bytes(&self, dir: &Path) -> std::io::Result<u64> {
        let stat = rustix::fs::statvfs(dir).map_err(std::io::Error::from)?;
        Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
    }
}

/// What an observation changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    None,
    BecameFull,
    Recovered,
}

/// After a write's `ENOSPC` the volume stays full at least this long, even
/// if a poll says there is space (a quota or exhausted inodes answer so),
/// doubling with each `ENOSPC` that follows within
/// [`NO_SPACE_MEMORY_MS`], up to [`NO_SPACE_HOLD_MS_MAX`]: a lying volume
/// costs one roll per hold, never a storm.
pub(crate) const NO_SPACE_HOLD_MS_MIN: u64 = 10_000;
pub(crate) const NO_SPACE_HOLD_MS_MAX: u64 = 300_000;
/// How long an `ENOSPC` counts towards the next hold's length.
pub(crate) const NO_SPACE_MEMORY_MS: u64 = 600_000;

#[derive(Debug, Default)]
struct NoSpace {
    /// `ENOSPC`s in a row, each within `NO_SPACE_MEMORY_MS` of the last.
    in_a_row: u32,
    last_ms: u64,
    hold_until_ms: u64,
}

/// Whether the data dir's volume may take more records.
#[derive(Debug)]
pub(crate) struct SpaceGuard {
    min_free_bytes: u64,
    full: AtomicBool,
    /// The last free bytes observed (`u64::MAX` before the first poll).
    free: AtomicU64,
    /// Bytes let in by [`SpaceGuard::try_take`] since the process started.
    taken: AtomicU64,
    /// `taken` when the last poll's figure was read: what was taken since
    /// is not in that figure yet.
    taken_at_poll: AtomicU64,
    no_space: parking_lot::Mutex<NoSpace>,
}

/// A write the line refused: what the guard saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NoRoom {
    /// The free bytes the guard reckons with: the last poll's, less the
    /// bytes taken since (`None` while full from a write's `ENOSPC`).
    pub free_bytes: u64,
    /// Whether this refusal made the guard full (log it once).
    pub became_full: bool,
}

impl SpaceGuard {
    pub(crate) fn new(min_free_bytes: u64) -> SpaceGuard {
        SpaceGuard {
            min_free_bytes,
            full: AtomicBool::new(false),
            free: AtomicU64::new(u64::MAX),
            taken: AtomicU64::new(0),
            taken_at_poll: AtomicU64::new(0),
            no_space: parking_lot::Mutex::new(NoSpace::default()),
        }
    }

    pub(crate) fn min_free_bytes(&self) -> u64 {
        self.min_free_bytes
    }

    /// The free bytes a full volume must reach to take records again.
    pub(crate) fn resume_bytes(&self) -> u64 {
        self.min_free_bytes
            .saturating_add(self.min_free_bytes / 4)
            .max(1)
    }

    pub(crate) fn is_full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }

    /// The last free bytes observed, if any.
    pub(crate) fn free_bytes(&self) -> Option<u64> {
        Some(self.free.load(Ordering::Relaxed)).filter(|f| *f != u64::MAX)
    }

    /// The bytes taken so far: read just before a poll asks the volume,
    /// and handed to [`SpaceGuard::observe_since`] with its answer.
    pub(crate) fn mark(&self) -> u64 {
        self.taken.load(Ordering::Acquire)
    }

    /// The free bytes the guard reckons with now: the last poll's, less
    /// what was taken since (`None` before the first poll).
    pub(crate) fn reckoned_free_bytes(&self) -> Option<u64> {
        let since = self
            .taken
            .load(Ordering::Acquire)
            .saturating_sub(self.taken_at_poll.load(Ordering::Acquire));
        self.free_bytes().map(|free| free.saturating_sub(since))
    }

    /// Asks to write `bytes` to the volume. Refused while full, and when
    /// the write would leave less than the line free: the guard is then
    /// full (the next poll decides when it is not, as for a poll below the
    /// line). Before the first poll nothing is known, and nothing refused.
    pub(crate) fn try_take(&self, bytes: u64) -> Result<(), NoRoom> {
        let free = self.reckoned_free_bytes();
        if self.is_full() {
            return Err(NoRoom {
                free_bytes: free.unwrap_or(0),
                became_full: false,
            });
        }
        if let Some(free) = free
            && free.saturating_sub(bytes) < self.min_free_bytes
        {
            let became_full = !self.full.swap(true, Ordering::AcqRel);
            return Err(NoRoom {
                free_bytes: free,
                became_full,
            });
        }
        self.taken.fetch_add(bytes, Ordering::AcqRel);
        Ok(())
    }

    /// Feeds one poll's free bytes, at `now_ms`, for a poll that began
    /// when nothing had been taken since the last (unit tests).
    #[cfg(test)]
    pub(crate) fn observe(&self, free: u64, now_ms: u64) -> Change {
        self.observe_since(free, self.mark(), now_ms)
    }

    /// Feeds one poll's free bytes, at `now_ms`; `mark` is what
    /// [`SpaceGuard::mark`] said just before the volume was asked, so the
    /// bytes taken while it answered still count against the figure.
    pub(crate) fn observe_since(&self, free: u64, mark: u64, now_ms: u64) -> Change {
        self.free.store(free.min(u64::MAX - 1), Ordering::Relaxed);
        self.taken_at_poll.store(mark, Ordering::Release);
        let full = self.is_full();
        let held = now_ms < self.no_space.lock().hold_until_ms;
        if !full && free < self.min_free_bytes {
            self.full.store(true, Ordering::Release);
            Change::BecameFull
        } else if full && free >= self.resume_bytes() && !held {
            self.full.store(false, Ordering::Release);
            Change::Recovered
        } else {
            Change::None
        }
    }

    /// The store met `ENOSPC` at `now_ms`: full at once, for at least the
    /// hold, then until a poll sees the space back. Returns whether this
    /// made it full.
    pub(crate) fn note_no_space(&self, now_ms: u64) -> bool {
        {
            let mut no_space = self.no_space.lock();
            if now_ms < no_space.hold_until_ms {
                // The same episode: flushes in flight failing together.
            } else {
                let recent = no_space.in_a_row > 0
                    && now_ms.saturating_sub(no_space.last_ms) < NO_SPACE_MEMORY_MS;
                no_space.in_a_row = if recent { no_space.in_a_row + 1 } else { 1 };
                let doublings = no_space.in_a_row.saturating_sub(1).min(16);
                let hold = NO_SPACE_HOLD_MS_MIN
                    .saturating_mul(1 << doublings)
                    .min(NO_SPACE_HOLD_MS_MAX);
                no_space.hold_until_ms = now_ms.saturating_add(hold);
            }
            no_space.last_ms = now_ms;
        }
        !self.full.swap(true, Ordering::AcqRel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_goes_full_below_the_line_and_back_only_past_the_margin() {
        let guard = SpaceGuard::new(1_000);
        assert_eq!(guard.resume_bytes(), 1_250);
        assert_eq!(guard.free_bytes(), None);
        assert_eq!(guard.observe(5_000, 0), Change::None);
        assert!(!guard.is_full());
        assert_eq!(guard.observe(999, 0), Change::BecameFull);
        assert!(guard.is_full());
        assert_eq!(guard.observe(500, 0), Change::None);
        // Back over the line but inside the margin: still full (no flap).
        assert_eq!(guard.observe(1_100, 0), Change::None);
        assert!(guard.is_full());
        assert_eq!(guard.observe(1_250, 0), Change::Recovered);
        assert!(!guard.is_full());
        assert_eq!(guard.free_bytes(), Some(1_250));
    }

    #[test]
    fn enospc_holds_the_volume_full_for_a_growing_while_whatever_polls_say() {
        let guard = SpaceGuard::new(1_000);
        assert_eq!(guard.observe(10_000, 0), Change::None);
        // ENOSPC at t=1 s: full for at least the first hold.
        assert!(guard.note_no_space(1_000));
        assert!(!guard.note_no_space(1_500), "one episode, one change");
        assert!(guard.is_full());
        assert_eq!(guard.observe(10_000, 5_000), Change::None);
        assert_eq!(
            guard.observe(10_000, 1_000 + NO_SPACE_HOLD_MS_MIN),
            Change::Recovered
        );
        // Again soon after: the hold doubles.
        let again = 20_000;
        assert!(guard.note_no_space(again));
        assert_eq!(
            guard.observe(10_000, again + NO_SPACE_HOLD_MS_MIN),
            Change::None
        );
        assert_eq!(
            guard.observe(10_000, again + 2 * NO_SPACE_HOLD_MS_MIN),
            Change::Recovered
        );
        // Long after: back to the first hold.
        let later = again + NO_SPACE_MEMORY_MS + 1;
        assert!(guard.note_no_space(later));
        assert_eq!(
            guard.observe(10_000, later + NO_SPACE_HOLD_MS_MIN),
            Change::Recovered
        );
    }

    #[test]
    fn the_hold_never_exceeds_its_bound() {
        let guard = SpaceGuard::new(1_000);
        let mut now = 0;
        for _ in 0..40 {
            guard.note_no_space(now);
            now += NO_SPACE_HOLD_MS_MAX + 1;
            assert_eq!(guard.observe(10_000, now), Change::Recovered);
        }
    }

    #[test]
    fn writes_between_two_polls_stop_at_the_line_not_at_the_next_poll() {
        let guard = SpaceGuard::new(1_000);
        // Nothing known before the first poll: nothing refused.
        assert_eq!(guard.try_take(1_000_000), Ok(()));
        let mark = guard.mark();
        assert_eq!(guard.observe_since(1_500, mark, 0), Change::None);
        assert_eq!(guard.try_take(300), Ok(()));
        assert_eq!(guard.reckoned_free_bytes(), Some(1_200));
        // 1,200 free less 300 would cross the line of 1,000: refused, and
        // the guard is full until a poll sees the space back.
        assert_eq!(
            guard.try_take(300),
            Err(NoRoom {
                free_bytes: 1_200,
                became_full: true
            })
        );
        assert!(guard.is_full());
        assert_eq!(
            guard.try_take(1),
            Err(NoRoom {
                free_bytes: 1_200,
                became_full: false
            })
        );
        // A poll that began before a write counts it against its figure.
        let mark = guard.mark();
        guard.full.store(false, Ordering::Release);
        assert_eq!(guard.try_take(100), Ok(()));
        guard.full.store(true, Ordering::Release);
        assert_eq!(guard.observe_since(1_300, mark, 0), Change::Recovered);
        assert_eq!(guard.reckoned_free_bytes(), Some(1_200));
        assert_eq!(guard.try_take(200), Ok(()));
        assert!(guard.try_take(1).is_err());
    }

    #[test]
    fn the_volume_answers_for_a_real_dir() {
        let dir = std::env::temp_dir();
        assert!(VolumeSpace.free_bytes(&dir).is_ok());
    }

    proptest::proptest! {
        /// Whatever the polls say, the guard is full exactly when the last
        /// crossing was below the line, and never flips inside the margin.
        #[test]
        fn the_guard_never_flaps_inside_the_margin(frees in proptest::collection::vec(0u64..3_000, 1..64)) {
            let guard = SpaceGuard::new(1_000);
            let mut full = false;
            for free in frees {
                let change = guard.observe(free, 0);
                let expected = if !full && free < 1_000 {
                    full = true;
                    Change::BecameFull
                } else if full && free >= 1_250 {
                    full = false;
                    Change::Recovered
                } else {
                    Change::None
                };
                proptest::prop_assert_eq!(change, expected);
                proptest::prop_assert_eq!(guard.is_full(), full);
            }
        }
    }
}
