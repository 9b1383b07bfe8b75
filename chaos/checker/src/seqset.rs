//! A set of sequence numbers kept as disjoint ranges, so a pass that reads a
//! key in order costs one entry however many records it reads.

use std::collections::BTreeMap;

/// Sequence numbers as disjoint, non-adjacent inclusive ranges.
#[derive(Debug, Default, Clone)]
pub(crate) struct SeqSet {
    /// Range start to range end (inclusive). Invariant: ranges neither
    /// overlap nor touch (`end + 1 < next start`).
    ranges: BTreeMap<u64, u64>,
}

impl SeqSet {
    pub(crate) fn contains(&self, seq: u64) -> bool {
        self.ranges
            .range(..=seq)
            .next_back()
            .is_some_and(|(_, &end)| seq <= end)
    }

    /// Every seq in the set, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.ranges.iter().flat_map(|(&start, &end)| start..=end)
    }

    /// How many seqs the set holds.
    pub(crate) fn len(&self) -> u64 {
        self.ranges
            .iter()
            .map(|(&start, &end)| end - start + 1)
            .sum()
    }

    /// The highest seq in the set.
    pub(crate) fn max(&self) -> Option<u64> {
        self.ranges.last_key_value().map(|(_, &end)| end)
    }

    /// Adds `seq`; false if it was already there.
    pub(crate) fn insert(&mut self, seq: u64) -> bool {
        if self.contains(seq) {
            return false;
        }
        let mut start = seq;
        let mut end = seq;
        if let Some(before) = seq.checked_sub(1)
            && let Some((&s, &e)) = self.ranges.range(..=before).next_back()
            && e == before
        {
            start = s;
        }
        if let Some(after) = seq.checked_add(1)
            && let Some(e) = self.ranges.remove(&after)
        {
            end = e;
        }
        self.ranges.insert(start, end);
        debug_assert!(self.contains(seq));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::SeqSet;

    #[test]
    fn in_order_inserts_keep_one_range() {
        let mut set = SeqSet::default();
        for seq in 0..100 {
            assert!(set.insert(seq));
        }
        assert_eq!(set.ranges.len(), 1);
        assert!(set.contains(0) && set.contains(99) && !set.contains(100));
    }

    #[test]
    fn the_highest_seq_is_the_last_ranges_end() {
        let mut set = SeqSet::default();
        assert_eq!(set.max(), None);
        for seq in [3, 1, 9, 4] {
            set.insert(seq);
        }
        assert_eq!(set.max(), Some(9));
    }

    #[test]
    fn iteration_gives_every_seq_once_in_order() {
        let mut set = SeqSet::default();
        for seq in [5, 1, 2, 9, 3] {
            set.insert(seq);
        }
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![1, 2, 3, 5, 9]);
        assert_eq!(set.len(), 5);
        assert_eq!(SeqSet::default().len(), 0);
    }

    #[test]
    fn a_filled_gap_merges_both_sides() {
        let mut set = SeqSet::default();
        assert!(set.insert(1));
        assert!(set.insert(3));
        assert!(!set.contains(2));
        assert!(set.insert(2));
        assert!(!set.insert(2));
        assert_eq!(set.ranges.len(), 1);
        assert!(set.insert(u64::MAX));
        assert!(set.insert(0));
        assert_eq!(set.ranges.len(), 2);
    }
}
