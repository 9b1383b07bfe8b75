//! The frames a primary wrote lately, kept in memory so its shippers do not
//! read them back from the log (ADR 0161).
//!
//! A primary's shipper reads every run it sends to a follower. Read back
//! from the log, that is a `pread` per run, a locate before it, and, where
//! the flush went out with `O_DIRECT` (which leaves nothing in the page
//! cache), a disk read of bytes written a moment before. Under load those
//! reads took a quarter of a capped broker's CPU. The flush has the frames
//! in memory when it writes them: this keeps the last of them, per copy and
//! store-wide bounded, and `read_frames` serves a run from here when its
//! start is kept.
//!
//! What is kept is exactly what was written (after `seal_trailers`), so a
//! run from here is byte-identical to one read from the log. Only appends
//! a primary encoded are kept (a replica's verbatim frames are not read for
//! shipping unless it becomes primary, and then it reads the log). The
//! runs live in the copy's `SegState` and are cleared wherever its end
//! moves back (`end_at`) and at its seal; `read_frames` still serves only
//! below the durable end.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::Batch;
use crate::store::FrameRun;

/// Bytes one copy keeps: a follower's whole in-flight window (16 MiB by
/// default) behind is then still served from memory.
pub(super) const RECENT_SEGMENT_BYTES_MAX: usize = 16 << 20;

/// One written batch: its frames from offset `first`.
#[derive(Debug)]
pub(super) struct RecentRun {
    first: u64,
    /// Start of each frame in `bytes`.
    starts: Vec<usize>,
    bytes: Vec<u8>,
}

impl RecentRun {
    /// The memory it holds, as the bounds count it: capacities, not lengths.
    fn cost(&self) -> usize {
        self.bytes.capacity() + self.starts.capacity() * std::mem::size_of::<usize>()
    }

    fn records(&self) -> u64 {
        self.starts.len() as u64
    }

    fn end(&self) -> u64 {
        self.first + self.records()
    }

    /// Byte range of frames `[from, to)` (offsets within this run).
    fn span(&self, from: u64, to: u64) -> (usize, usize) {
        debug_assert!(self.first <= from && from < to && to <= self.end());
        let at = |offset: u64| {
            let k = (offset - self.first) as usize;
            self.starts.get(k).copied().unwrap_or(self.bytes.len())
        };
        (at(from), at(to))
    }
}

/// The kept runs of one copy, oldest first, in offset order.
#[derive(Debug)]
pub(super) struct RecentFrames {
    runs: VecDeque<Arc<RecentRun>>,
    /// Their `cost`.
    bytes: usize,
    /// Bytes kept by every copy of the store, against `total_max`.
    total: Arc<AtomicUsize>,
    total_max: usize,
}

impl RecentFrames {
    pub(super) fn new(total: Arc<AtomicUsize>, total_max: usize) -> RecentFrames {
        RecentFrames {
            runs: VecDeque::new(),
            bytes: 0,
            total,
            total_max,
        }
    }

    /// Keeps a written flush's batches, the first at offset `first`; a
    /// replica's verbatim batches are skipped. Oldest runs go first when
    /// the copy's or the store's bound would be passed; a run that still
    /// does not fit is not kept.
    pub(super) fn keep(&mut self, mut first: u64, batches: Vec<Batch>) {
        for batch in batches {
            let records = batch.starts.len() as u64;
            if !batch.is_verbatim() && records > 0 {
                self.keep_run(RecentRun {
                    first,
                    starts: batch.starts,
                    bytes: batch.bytes,
                });
            }
            first += records;
        }
    }

    fn keep_run(&mut self, run: RecentRun) {
        if self.runs.back().is_some_and(|last| last.end() != run.first) {
            // Not contiguous with what is kept (a skipped batch): start over.
            self.clear();
        }
        let len = run.cost();
        if len > RECENT_SEGMENT_BYTES_MAX || len > self.total_max {
            self.clear();
            return;
        }
        while !self.runs.is_empty()
            && (self.bytes + len > RECENT_SEGMENT_BYTES_MAX
                || self.total.load(Ordering::Relaxed) + len > self.total_max)
        {
            self.drop_oldest();
        }
        let max = self.total_max;
        let admitted = self
            .total
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                (t + len <= max).then_some(t + len)
            })
            .is_ok();
        if !admitted {
            // Other copies' runs fill the store: this one reads the log.
            self.clear();
            return;
        }
        self.bytes += len;
        self.runs.push_back(Arc::new(run));
        debug_assert!(self.bytes <= RECENT_SEGMENT_BYTES_MAX);
    }

    fn drop_oldest(&mut self) {
        if let Some(run) = self.runs.pop_front() {
            self.bytes -= run.cost();
            self.total.fetch_sub(run.cost(), Ordering::Relaxed);
        }
    }

    /// Forgets every run (the copy's end moved back, or it was sealed).
    pub(super) fn clear(&mut self) {
        self.total.fetch_sub(self.bytes, Ordering::Relaxed);
        self.runs.clear();
        self.bytes = 0;
    }

    /// The kept runs holding offsets `from..end`, in order, contiguous;
    /// empty when `from` is not kept. Cheap: the caller copies outside the
    /// copy's lock.
    pub(super) fn runs_from(&self, from: u64, end: u64) -> Vec<Arc<RecentRun>> {
        let i = self.runs.partition_point(|r| r.end() <= from);
        let mut out = Vec::new();
        let mut next = from;
        for run in self.runs.range(i..) {
            if run.first > next || next >= end {
                break;
            }
            next = run.end();
            out.push(Arc::clone(run));
        }
        out
    }
}

impl Drop for RecentFrames {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Frames `from..end` from `runs` (as `runs_from` gave them), at most
/// `bytes_max` after the first frame, as `read_frames` cuts a run from the
/// log. `None` when `runs` does not hold `from`.
pub(super) fn run_of(
    runs: &[Arc<RecentRun>],
    from: u64,
    end: u64,
    bytes_max: usize,
) -> Option<FrameRun> {
    let first = runs.first()?;
    if first.first > from || first.end() <= from || from >= end {
        return None;
    }
    // First the spans, then one allocation of exactly their size.
    let mut spans: Vec<(&RecentRun, usize, usize)> = Vec::new();
    let mut taken = 0usize;
    let mut next = from;
    for run in runs {
        if run.first > next || next >= end {
            break;
        }
        // The frames of this run that fit; the run's first frame always.
        let mut to = next;
        let mut len = 0usize;
        while to < run.end().min(end) {
            let (a, b) = run.span(to, to + 1);
            if taken + len > 0 && taken + len + (b - a) > bytes_max {
                break;
            }
            len += b - a;
            to += 1;
        }
        if to == next {
            break;
        }
        let (a, b) = run.span(next, to);
        spans.push((run.as_ref(), a, b));
        taken += len;
        next = to;
        if to < run.end() {
            break;
        }
    }
    let mut bytes = Vec::with_capacity(taken);
    for (run, a, b) in spans {
        bytes.extend_from_slice(&run.bytes[a..b]);
    }
    debug_assert_eq!(bytes.len(), taken);
    Some(FrameRun {
        first: from,
        records: next - from,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of `n` frames of `len` bytes each, byte `i` of frame `k`
    /// being `k`.
    fn batch(n: usize, len: usize, verbatim: bool) -> Batch {
        let mut bytes = Vec::with_capacity(n * len);
        let mut starts = Vec::with_capacity(n);
        for k in 0..n {
            starts.push(bytes.len());
            bytes.extend(std::iter::repeat_n(k as u8, len));
        }
        Batch {
            bytes,
            starts,
            body_crcs: if verbatim {
                Vec::new()
            } else {
                vec![crc32fast::Hasher::new(); n]
            },
        }
    }

    fn recent(total_max: usize) -> (RecentFrames, Arc<AtomicUsize>) {
        let total = Arc::new(AtomicUsize::new(0));
        (RecentFrames::new(Arc::clone(&total), total_max), total)
    }

    #[test]
    fn a_run_is_served_across_kept_batches_up_to_the_end_and_the_bound() {
        let (mut r, _) = recent(1 << 30);
        r.keep(10, vec![batch(3, 100, false), batch(2, 100, false)]);
        let runs = r.runs_from(11, 15);
        let run = run_of(&runs, 11, 15, 1 << 20).unwrap();
        assert_eq!((run.first, run.records, run.bytes.len()), (11, 4, 400));
        // The durable end cuts it.
        let run = run_of(&r.runs_from(11, 13), 11, 13, 1 << 20).unwrap();
        assert_eq!((run.records, run.bytes.len()), (2, 200));
        // The bound cuts it at a frame, but one frame always goes.
        let run = run_of(&runs, 11, 15, 250).unwrap();
        assert_eq!((run.records, run.bytes.len()), (2, 200));
        let run = run_of(&runs, 11, 15, 10).unwrap();
        assert_eq!(run.records, 1);
        // Not kept: below, or at the end.
        assert!(run_of(&r.runs_from(9, 15), 9, 15, 1 << 20).is_none());
        assert!(r.runs_from(15, 20).is_empty());
    }

    #[test]
    fn a_replicas_verbatim_frames_are_not_kept_and_a_gap_starts_over() {
        let (mut r, total) = recent(1 << 30);
        r.keep(0, vec![batch(2, 10, false)]);
        r.keep(2, vec![batch(2, 10, true), batch(2, 10, false)]);
        assert!(
            r.runs_from(0, 6).is_empty(),
            "the run before the gap is gone"
        );
        let run = run_of(&r.runs_from(4, 6), 4, 6, 1 << 20).unwrap();
        assert_eq!(run.records, 2);
        // Counted by capacity: 20 bytes and two frame starts.
        assert_eq!(total.load(Ordering::Relaxed), 20 + 2 * 8);
    }

    #[test]
    fn the_copy_and_the_store_bounds_hold_and_clearing_gives_bytes_back() {
        // Each run costs 108: 100 bytes and one frame start.
        let (mut r, total) = recent(250);
        r.keep(0, vec![batch(1, 100, false), batch(1, 100, false)]);
        r.keep(2, vec![batch(1, 100, false)]);
        assert_eq!(total.load(Ordering::Relaxed), 216, "the oldest made room");
        assert!(r.runs_from(0, 3).is_empty());
        assert_eq!(r.runs_from(1, 3).len(), 2);
        let mut other = RecentFrames::new(Arc::clone(&total), 250);
        other.keep(0, vec![batch(1, 100, false)]);
        assert!(other.runs_from(0, 1).is_empty(), "the store is full");
        assert_eq!(total.load(Ordering::Relaxed), 216);
        r.clear();
        assert_eq!(total.load(Ordering::Relaxed), 0);
        other.keep(0, vec![batch(1, 100, false)]);
        drop(other);
        assert_eq!(
            total.load(Ordering::Relaxed),
            0,
            "a dropped copy gives back"
        );
        let (mut big, total) = recent(1 << 30);
        big.keep(0, vec![batch(1, RECENT_SEGMENT_BYTES_MAX + 1, false)]);
        assert_eq!(
            total.load(Ordering::Relaxed),
            0,
            "a run above the copy's bound"
        );
    }
}
