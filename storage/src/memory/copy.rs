//! One copy held in memory: the log as written and the prefix of it that
//! was synced, the markers that outlive a crash, and what an open copy
//! keeps only while it is open.

use std::sync::Arc;
use std::time::SystemTime;

use crate::error::StorageError;
use crate::frame::{self, FrameError};
use crate::scan::BadFrame;
use crate::store::{Loss, OrderEpoch, SealInfo, SegmentId};
use crate::ticket::Completion;

use super::rng::SplitMix;

/// What a crash leaves of a copy: its "disk".
#[derive(Debug)]
pub(super) struct Disk {
    /// Every byte written, synced or not.
    pub log: Vec<u8>,
    /// The synced prefix of `log`: what a crash cannot take.
    pub synced: usize,
    /// Where each write not yet synced starts, in order.
    pub unsynced_writes: Vec<usize>,
    /// The log exists (an `open` creates it; a set-aside moves it away).
    pub exists: bool,
    pub seal: Option<SealInfo>,
    /// The fence marker and the order epoch it records.
    pub fence: Option<OrderEpoch>,
    pub sidecar: Option<Vec<u8>>,
    pub aside: Option<Vec<u8>>,
    pub modified: SystemTime,
}

impl Default for Disk {
    fn default() -> Self {
        Disk {
            log: Vec::new(),
            synced: 0,
            unsynced_writes: Vec::new(),
            exists: false,
            seal: None,
            fence: None,
            sidecar: None,
            aside: None,
            modified: SystemTime::now(),
        }
    }
}

/// What an open copy knows beyond its disk; a crash loses it.
#[derive(Debug, Default)]
pub(super) struct Open {
    /// Where each frame of `log` ends: frame `i` spans `ends[i-1]..ends[i]`.
    pub ends: Vec<usize>,
    pub fenced: bool,
    pub order: OrderEpoch,
    pub committed: Option<u64>,
    pub failed: Option<String>,
    pub lost: Option<(Loss, String)>,
    /// The end recovery found (or a cut left): `truncate_tail` needs it.
    pub opened_end: u64,
    /// Tickets waiting for the sync that reaches their byte end.
    pub waiters: Vec<(usize, Arc<Completion>)>,
}

/// One segment's copy.
#[derive(Debug, Default)]
pub(super) struct Copy {
    pub disk: Disk,
    pub open: Option<Open>,
}

/// What a crash did to one copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashReport {
    /// Synced bytes, all kept.
    pub synced_bytes: u64,
    /// Unsynced bytes lost.
    pub lost_bytes: u64,
    /// Bytes of a torn write left after the synced prefix (a prefix of the
    /// first unsynced write, cut inside one of its frames).
    pub torn_bytes: u64,
}

/// The valid frames of a log from byte zero and the first bad one.
#[derive(Debug)]
pub(super) struct Scan {
    pub ends: Vec<usize>,
    pub first_bad: Option<BadFrame>,
}

/// Scans `log` from byte zero, checking every frame (CRC included) and that
/// offsets count up from zero.
pub(super) fn scan(log: &[u8]) -> Scan {
    let mut ends = Vec::new();
    let mut at = 0usize;
    while at < log.len() {
        let offset = ends.len() as u64;
        let error = match frame::decode(&log[at..]) {
            Ok((view, len)) if view.offset == offset => {
                at += len;
                ends.push(at);
                continue;
            }
            Ok((view, _)) => FrameError::OffsetMismatch {
                found: view.offset,
                expected: offset,
            },
            Err(e) => e,
        };
        let first_bad = Some(BadFrame {
            position: at as u64,
            offset,
            error,
        });
        return Scan { ends, first_bad };
    }
    Scan {
        ends,
        first_bad: None,
    }
}

impl Copy {
    pub fn open_state(&self, segment: SegmentId) -> Result<&Open, StorageError> {
        self.open.as_ref().ok_or(StorageError::NotOpen { segment })
    }

    pub fn open_mut(&mut self, segment: SegmentId) -> Result<&mut Open, StorageError> {
        self.open.as_mut().ok_or(StorageError::NotOpen { segment })
    }

    /// Records and bytes durable (synced), not clamped.
    pub fn durable(&self, open: &Open) -> (u64, u64) {
        let records = open.ends.partition_point(|&end| end <= self.disk.synced);
        (records as u64, position(&open.ends, records as u64) as u64)
    }

    /// Durable records and bytes, clamped to the seal.
    pub fn stored_end(&self, open: &Open) -> (u64, u64) {
        let (records, bytes) = self.durable(open);
        match self.disk.seal {
            Some(seal) => (records.min(seal.length), bytes.min(seal.byte_size)),
            None => (records, bytes),
        }
    }

    /// What readers see: the stored end, clamped to the committed end on a
    /// replicated copy.
    pub fn readable_end(&self, open: &Open) -> (u64, u64) {
        let (records, bytes) = self.stored_end(open);
        match (self.disk.seal, open.committed) {
            (None, Some(committed)) => {
                let records = records.min(committed);
                (records, position(&open.ends, records) as u64)
            }
            _ => (records, bytes),
        }
    }

    /// Syncs everything written and completes the tickets it covers.
    pub fn sync_now(&mut self) {
        self.disk.synced = self.disk.log.len();
        self.disk.unsynced_writes.clear();
        if let Some(open) = &mut self.open {
            for (_, completion) in open.waiters.drain(..) {
                completion.complete(Ok(()));
            }
        }
    }

    /// Writes `bytes` at the end of the log, unsynced.
    pub fn write(&mut self, bytes: &[u8]) {
        self.disk.unsynced_writes.push(self.disk.log.len());
        self.disk.log.extend_from_slice(bytes);
        self.disk.modified = SystemTime::now();
    }

    /// Cuts the log to `bytes`, durably (a truncation and its sync).
    pub fn cut(&mut self, bytes: usize) {
        self.disk.log.truncate(bytes);
        self.disk.synced = self.disk.synced.min(bytes);
        self.disk.unsynced_writes.retain(|&start| start < bytes);
        self.disk.modified = SystemTime::now();
    }

    /// A power cut: the copy closes, its waiters fail, its unsynced bytes
    /// are lost but for an optional torn prefix of the first unsynced write.
    pub fn crash(&mut self, rng: &mut SplitMix) -> CrashReport {
        if let Some(open) = self.open.take() {
            for (_, completion) in open.waiters {
                completion.complete(Err(StorageError::ShuttingDown));
            }
        }
        let disk = &mut self.disk;
        let written = disk.log.len();
        let torn = match disk.unsynced_writes.first() {
            Some(&start) if rng.next() % 2 == 1 => {
                let end = disk.unsynced_writes.get(1).copied().unwrap_or(written);
                torn_prefix(&disk.log[start..end], rng)
            }
            _ => 0,
        };
        let kept = disk.synced + torn;
        disk.log.truncate(kept);
        disk.synced = kept;
        disk.unsynced_writes.clear();
        CrashReport {
            synced_bytes: (kept - torn) as u64,
            lost_bytes: (written - kept) as u64,
            torn_bytes: torn as u64,
        }
    }
}

/// How many bytes of a write (whole frames) a tear leaves: its first `k`
/// frames and part of frame `k`, never a frame boundary, so the frame the
/// tear cuts cannot decode.
fn torn_prefix(write: &[u8], rng: &mut SplitMix) -> usize {
    let mut starts = Vec::new();
    let mut at = 0usize;
    while at < write.len() {
        let Ok(len) = frame::peek_len(&write[at..]) else {
            break;
        };
        starts.push((at, len));
        at += len;
    }
    let Some(&(start, len)) = starts.get(rng.below(starts.len() as u64) as usize) else {
        return 0;
    };
    // Somewhere strictly inside the frame: at least a byte of it, never all.
    start + 1 + rng.below(len as u64 - 1) as usize
}

/// The byte position where record `offset` starts.
pub(super) fn position(ends: &[usize], offset: u64) -> usize {
    match offset {
        0 => 0,
        n => ends[n as usize - 1],
    }
}
