//! The quorum arithmetic of a replicated segment, as pure functions the
//! primary's replicator, the tests and a model checker share.
//!
//! A segment has N copies, the primary's first. A record is committed once
//! Q = floor(N/2) + 1 copies, the primary's included, have fsynced it
//! (`../shared/design/replication.md`, invariant 1). Each copy's durable end
//! only grows, so the committed end is the Q-th largest durable end.

/// Copies that must hold a record durably before it is acknowledged.
pub(crate) fn quorum(copies: usize) -> usize {
    copies / 2 + 1
}

/// The highest offset durable on a quorum: the Q-th largest of the copies'
/// durable ends (`durable[0]` is the primary's). With one copy it is that
/// copy's durable end.
pub(crate) fn committed_end(durable: &[u64]) -> u64 {
    if durable.is_empty() {
        return 0;
    }
    let mut ends = durable.to_vec();
    ends.sort_unstable_by(|a, b| b.cmp(a));
    ends[quorum(durable.len()) - 1]
}

/// Tracks the durable ends a primary has heard and the committed end they
/// imply. The committed end never goes down: a copy whose end is learned
/// again lower (a restarted follower that lost an unsynced tail) lowers
/// only its own entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CommitTracker {
    durable: Vec<u64>,
    /// Which copies reported their durable end since this tracker began
    /// (a reopened primary knows nothing of its followers until they answer).
    heard: Vec<bool>,
    committed: u64,
}

impl CommitTracker {
    /// `copies` copies (at least one), all empty, nothing committed yet;
    /// `committed` is what is known committed already (a reopened copy).
    pub(crate) fn new(copies: usize, committed: u64) -> CommitTracker {
        assert!(copies >= 1, "a segment has at least its primary's copy");
        CommitTracker {
            durable: vec![0; copies],
            heard: vec![false; copies],
            committed,
        }
    }

    /// Whether a quorum of copies has reported since the tracker began:
    /// only then is the committed end as high as what was acknowledged
    /// before (a reopened primary's is 0 until its followers answer).
    pub(crate) fn settled(&self) -> bool {
        self.heard.iter().filter(|h| **h).count() >= quorum(self.durable.len())
    }

    /// Records copy `copy`'s durable end and returns the committed end.
    pub(crate) fn observe(&mut self, copy: usize, durable_end: u64) -> u64 {
        if let Some(end) = self.durable.get_mut(copy) {
            *end = durable_end;
        }
        if let Some(heard) = self.heard.get_mut(copy) {
            *heard = true;
        }
        self.committed = self.committed.max(committed_end(&self.durable));
        self.committed
    }

    /// Raises copy `copy`'s durable end to at least `durable_end` and
    /// returns the committed end. The primary's own copy is reported by
    /// concurrent fsync completions in any order: a smaller end reported
    /// after a larger one says nothing new, and must not lower it.
    pub(crate) fn raise(&mut self, copy: usize, durable_end: u64) -> u64 {
        let end = self
            .durable
            .get(copy)
            .map_or(durable_end, |e| (*e).max(durable_end));
        self.observe(copy, end)
    }

    pub(crate) fn committed(&self) -> u64 {
        self.committed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn quorum_is_a_majority_counting_the_primary() {
        assert_eq!(
            [1, 2, 3, 4, 5].map(quorum),
            [1, 2, 2, 3, 3],
            "Q = floor(N/2) + 1"
        );
    }

    #[test]
    fn a_primary_end_reported_out_of_order_never_lowers_its_entry() {
        // Regression: two fsync completions of the primary reported 600
        // then 500; the follower answered 600. The entry fell to 500 and
        // the committed end stayed below the last acknowledged record
        // until the next write (a produce timed out `no_quorum`).
        let mut tracker = CommitTracker::new(2, 0);
        tracker.raise(0, 600);
        tracker.raise(0, 500);
        assert_eq!(tracker.observe(1, 600), 600);
    }

    #[test]
    fn a_reopened_tracker_is_settled_once_a_quorum_has_reported() {
        // Regression (CI, cursor_key): a primary restarted with committed
        // end 0 answered a resuming reader "nothing more" before its
        // followers had told it their ends.
        let mut tracker = CommitTracker::new(3, 0);
        tracker.raise(0, 15);
        assert!(!tracker.settled(), "the primary alone is not a quorum of 3");
        assert_eq!(tracker.committed(), 0);
        tracker.observe(2, 15);
        assert!(tracker.settled());
        assert_eq!(tracker.committed(), 15);
        let mut alone = CommitTracker::new(1, 0);
        alone.raise(0, 4);
        assert!(alone.settled(), "one copy is its own quorum");
    }

    #[test]
    fn the_committed_end_is_the_qth_largest() {
        assert_eq!(committed_end(&[7]), 7);
        assert_eq!(committed_end(&[10, 4, 8]), 8);
        assert_eq!(committed_end(&[10, 0, 0]), 0);
        assert_eq!(committed_end(&[3, 9, 9]), 9);
        assert_eq!(committed_end(&[5, 5, 1, 1, 9]), 5);
    }

    proptest! {
        /// Over any order in which acknowledgements arrive, the committed
        /// end (a) is held durably by at least Q copies, (b) never exceeds
        /// what Q copies hold (no larger end has Q holders), and (c) never
        /// goes down, even when a copy's end is reported lower again.
        #[test]
        fn the_committed_end_is_held_by_a_quorum_and_never_goes_down(
            copies in 1usize..=5,
            acks in proptest::collection::vec((0usize..5, 0u64..50), 0..60),
        ) {
            let mut tracker = CommitTracker::new(copies, 0);
            let mut seen = vec![0u64; copies];
            let mut last = 0;
            for (copy, end) in acks {
                let copy = copy % copies;
                seen[copy] = end;
                let committed = tracker.observe(copy, end);
                prop_assert!(committed >= last, "the committed end went down");
                last = committed;
                let now = committed_end(&seen);
                let holders = seen.iter().filter(|&&e| e >= now).count();
                prop_assert!(holders >= quorum(copies));
                let above = seen.iter().filter(|&&e| e > now).count();
                prop_assert!(above < quorum(copies), "a larger end had a quorum");
                prop_assert!(committed >= now);
            }
        }
    }
}
