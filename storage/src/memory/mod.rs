//! A `SegmentStore` in memory, for tests (ADR 0131).
//!
//! Each copy keeps the bytes written and, separately, how many of them were
//! synced, in the same frame format as a [`FileStore`](crate::FileStore)
//! log, so a copy's frames replicate to and from file stores unchanged.
//! By default every write is synced at once and every ticket is complete
//! when `append` returns; [`MemoryStore::hold_syncs`] models a disk slow to
//! sync, whose tickets wait for [`MemoryStore::release_syncs`] (an order
//! that drains, such as a seal, a fence order or a close, syncs at once).
//!
//! [`MemoryStore::crash`] is a power cut: every open copy closes and its
//! waiting tickets fail, the synced bytes stay, the unsynced bytes are lost
//! except, by the store's seeded generator, a torn prefix of the first
//! unsynced write cut inside one of its frames, which the next `open`
//! truncates as a file store's recovery does. The same seed and history
//! tear the same bytes. Damage at rest is never simulated: a copy opens
//! clean or torn at its tail, never `Damaged`.

mod copy;
mod rng;
mod segment_store;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tracing::{debug, warn};

use crate::error::StorageError;
use crate::frame;
use crate::record::RecordBatch;
use crate::store::{SegmentId, StoreConfig};
use crate::ticket::{AppendTicket, Completion};

use copy::Copy;
pub use copy::CrashReport;
use rng::SplitMix;

/// Segment copies in memory, shared between threads.
#[derive(Debug)]
pub struct MemoryStore {
    config: StoreConfig,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// By id, so a crash walks the copies in the same order every time.
    copies: BTreeMap<SegmentId, Copy>,
    held: bool,
    rng: SplitMix,
}

impl MemoryStore {
    /// An empty store whose crashes tear by `seed`. `config` gives the
    /// record and batch limits; its flush and I/O settings are not used.
    pub fn new(config: StoreConfig, seed: u64) -> Result<Self, StorageError> {
        config.validate()?;
        Ok(MemoryStore {
            config,
            state: Mutex::new(State {
                copies: BTreeMap::new(),
                held: false,
                rng: SplitMix::new(seed),
            }),
        })
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// From now on writes are not synced until [`release_syncs`](Self::release_syncs).
    pub fn hold_syncs(&self) {
        self.state.lock().held = true;
    }

    /// Syncs everything written and completes every waiting ticket.
    pub fn release_syncs(&self) {
        let mut state = self.state.lock();
        state.held = false;
        for copy in state.copies.values_mut() {
            copy.sync_now();
        }
    }

    /// A power cut (see the module doc). Returns what it did to each copy
    /// that had unsynced bytes. Syncs are no longer held afterwards.
    pub fn crash(&self) -> BTreeMap<SegmentId, CrashReport> {
        let mut state = self.state.lock();
        let State {
            copies, held, rng, ..
        } = &mut *state;
        *held = false;
        let mut reports = BTreeMap::new();
        for (&segment, copy) in copies.iter_mut() {
            let report = copy.crash(rng);
            if report.lost_bytes > 0 || report.torn_bytes > 0 {
                warn!(
                    segment = segment.0,
                    lost_bytes = report.lost_bytes,
                    torn_bytes = report.torn_bytes,
                    "memory store crashed"
                );
                reports.insert(segment, report);
            }
        }
        reports
    }

    /// The copy's log as written, synced or not (empty for no copy).
    pub fn written(&self, segment: SegmentId) -> Vec<u8> {
        let state = self.state.lock();
        state
            .copies
            .get(&segment)
            .map(|c| c.disk.log.clone())
            .unwrap_or_default()
    }

    /// How many bytes of the copy's log are synced.
    pub fn synced_bytes(&self, segment: SegmentId) -> u64 {
        let state = self.state.lock();
        state
            .copies
            .get(&segment)
            .map_or(0, |c| c.disk.synced as u64)
    }

    /// Writes finished frames at the end of an open copy and syncs them,
    /// or leaves them for a held sync; the ticket covers them.
    fn write_frames(
        state: &mut State,
        segment: SegmentId,
        bytes: &[u8],
        offsets: std::ops::Range<u64>,
    ) -> Result<AppendTicket, StorageError> {
        let held = state.held;
        let copy = state
            .copies
            .get_mut(&segment)
            .ok_or(StorageError::NotOpen { segment })?;
        copy.write(bytes);
        let open = copy.open_mut(segment)?;
        let mut end = open.ends.last().copied().unwrap_or(0);
        let mut at = 0usize;
        while at < bytes.len() {
            // Frames built or checked by the caller: whole and valid.
            let len = frame::peek_len(&bytes[at..]).unwrap_or(bytes.len() - at);
            at += len;
            end += len;
            open.ends.push(end);
        }
        if !held {
            copy.sync_now();
            return Ok(AppendTicket::ready(offsets));
        }
        let completion = Completion::new();
        open.waiters.push((end, Arc::clone(&completion)));
        Ok(AppendTicket::new(offsets, completion))
    }

    /// Frames `records` at `first` for an append: every record is checked
    /// against the limits before any byte is framed.
    fn frame_batch(
        &self,
        records: &dyn RecordBatch,
        first: u64,
        durable_below: u64,
    ) -> Result<Vec<u8>, StorageError> {
        let cfg = &self.config;
        let mut batch_bytes = 0usize;
        for record in records.iter() {
            let payload = frame::payload_len(record).unwrap_or(usize::MAX);
            if payload > cfg.record_bytes_max {
                return Err(StorageError::RecordTooLarge {
                    record_bytes: payload,
                    record_bytes_max: cfg.record_bytes_max,
                });
            }
            batch_bytes = batch_bytes.saturating_add(frame::FRAME_HEADER_BYTES + payload);
        }
        if records.len() > cfg.batch_records_max || batch_bytes > cfg.pending_bytes_max {
            return Err(StorageError::BatchTooLarge {
                records: records.len(),
                bytes: batch_bytes,
                records_max: cfg.batch_records_max,
                bytes_max: cfg.pending_bytes_max,
            });
        }
        let mut frames = Vec::with_capacity(batch_bytes);
        for (offset, record) in (first..).zip(records.iter()) {
            let start = frames.len();
            let body_crc = frame::encode_unsealed(&mut frames, record);
            frame::seal_frame(&mut frames[start..], offset, durable_below, body_crc);
        }
        debug!(
            records = records.len(),
            bytes = batch_bytes,
            "memory append framed"
        );
        Ok(frames)
    }
}
