//! The `SegmentStore` contract over copies in memory: the same answers a
//! `FileStore` gives, without files.

use std::ops::ControlFlow;
use std::time::SystemTime;

use crate::error::StorageError;
use crate::frame::{self, FrameView};
use crate::record::RecordBatch;
use crate::store::{
    FenceInfo, FrameRun, Loss, OrderEpoch, Recovery, SealInfo, SegmentId, SegmentInfo,
    SegmentStore, VerifyReport,
};
use crate::ticket::AppendTicket;

use super::copy::{self, Copy, Open, position};
use super::{MemoryStore, State};

fn info_of(segment: SegmentId, copy: &Copy, open: &Open) -> SegmentInfo {
    let (length, byte_size) = copy.readable_end(open);
    let (_, durable_bytes) = copy.durable(open);
    SegmentInfo {
        segment,
        length,
        byte_size,
        durable: copy.stored_end(open).0,
        committed: open.committed,
        assigned: open.ends.len() as u64,
        stored_bytes: durable_bytes.max(copy.disk.seal.map_or(0, |s| s.byte_size)),
        sealed: copy.disk.seal,
        fenced: open.fenced,
        failed: open.failed.is_some(),
        lost: open.lost.as_ref().map(|(loss, _)| *loss),
    }
}

fn check_writable(segment: SegmentId, copy: &Copy, open: &Open) -> Result<(), StorageError> {
    check_repairable(segment, copy, open)?;
    if open.fenced {
        return Err(StorageError::Fenced { segment });
    }
    Ok(())
}

fn check_repairable(segment: SegmentId, copy: &Copy, open: &Open) -> Result<(), StorageError> {
    if let Some(reason) = &open.failed {
        return Err(StorageError::Failed {
            segment,
            reason: reason.clone(),
        });
    }
    if let Some(seal) = copy.disk.seal {
        return Err(StorageError::Sealed {
            segment,
            length: seal.length,
        });
    }
    Ok(())
}

impl State {
    fn copy(&mut self, segment: SegmentId) -> Result<&mut Copy, StorageError> {
        self.copies
            .get_mut(&segment)
            .filter(|c| c.open.is_some())
            .ok_or(StorageError::NotOpen { segment })
    }
}

/// Opens (recovers) a copy: a torn tail is cut; a copy short of its seal
/// keeps what it has and reports the rest lost.
fn recover(segment: SegmentId, copy: &mut Copy) -> Recovery {
    let log_missing = !copy.disk.exists;
    copy.disk.exists = true;
    let scan = copy::scan(&copy.disk.log);
    let valid = copy::position(&scan.ends, scan.ends.len() as u64);
    let records = scan.ends.len() as u64;
    let mut truncated_bytes = 0;
    let mut lost = None;
    let mut short_of_seal = false;
    match copy.disk.seal {
        Some(seal) if records < seal.length => {
            short_of_seal = true;
            lost = Some((
                Loss {
                    from: records,
                    to: seal.length,
                },
                format!(
                    "the copy holds {records} of the {} records of its seal",
                    seal.length
                ),
            ));
        }
        Some(_) => {}
        None if valid < copy.disk.log.len() => {
            truncated_bytes = (copy.disk.log.len() - valid) as u64;
            tracing::warn!(segment = segment.0, truncated_bytes, "truncating torn tail");
            copy.cut(valid);
        }
        None => {}
    }
    let fenced = copy.disk.seal.is_some() || copy.disk.fence.is_some();
    let open = Open {
        ends: scan.ends,
        fenced,
        order: copy.disk.fence.unwrap_or_default(),
        committed: copy.disk.seal.map(|s| s.length),
        lost,
        opened_end: records,
        ..Open::default()
    };
    let info = info_of(segment, copy, &open);
    copy.open = Some(open);
    Recovery {
        info,
        truncated_bytes,
        index_rebuilt: false,
        short_of_seal,
        log_missing,
    }
}

impl MemoryStore {
    fn open_copy(&self, segment: SegmentId) -> Result<Recovery, StorageError> {
        let mut state = self.state.lock();
        let copy = state.copies.entry(segment).or_default();
        if let Some(open) = &copy.open {
            return Ok(Recovery {
                info: info_of(segment, copy, open),
                truncated_bytes: 0,
                index_rebuilt: false,
                short_of_seal: false,
                log_missing: false,
            });
        }
        Ok(recover(segment, copy))
    }

    fn queue_frames(
        &self,
        segment: SegmentId,
        first: u64,
        frames: &[u8],
        repair: Option<u64>,
    ) -> Result<AppendTicket, StorageError> {
        let cfg = &self.config;
        if frames.len() > cfg.pending_bytes_max {
            return Err(StorageError::BatchTooLarge {
                records: 0,
                bytes: frames.len(),
                records_max: cfg.batch_records_max,
                bytes_max: cfg.pending_bytes_max,
            });
        }
        let starts = crate::file_store::check_frames(segment, first, frames, cfg)?;
        let mut state = self.state.lock();
        let copy = state.copy(segment)?;
        let open = copy.open_state(segment)?;
        match repair {
            None => check_writable(segment, copy, open)?,
            Some(seal) => {
                check_repairable(segment, copy, open)?;
                let end = first.saturating_add(starts.len() as u64);
                if end > seal {
                    return Err(StorageError::PastSeal { segment, end, seal });
                }
            }
        }
        let next = open.ends.len() as u64;
        if first != next {
            return Err(StorageError::NotAtEnd {
                segment,
                first,
                end: next,
            });
        }
        let end = first + starts.len() as u64;
        if starts.is_empty() {
            return Ok(AppendTicket::ready(first..first));
        }
        MemoryStore::write_frames(&mut state, segment, frames, first..end)
    }

    /// Syncs the copy now: what the file store's drain waits for.
    fn drain(state: &mut State, segment: SegmentId) -> Result<(), StorageError> {
        state.copy(segment)?.sync_now();
        Ok(())
    }

    /// The durable frames from `from` up to `end` as bytes, copied out so
    /// that no visitor runs under the store's lock.
    fn frames_between(copy: &Copy, open: &Open, from: u64, end: u64) -> Vec<u8> {
        copy.disk.log[position(&open.ends, from)..position(&open.ends, end)].to_vec()
    }
}

impl SegmentStore for MemoryStore {
    fn open(&self, segment: SegmentId) -> Result<Recovery, StorageError> {
        self.open_copy(segment)
    }

    fn open_quarantined(&self, segment: SegmentId) -> Result<Recovery, StorageError> {
        // Nothing in memory is damaged in the middle: it opens as `open`.
        self.open_copy(segment)
    }

    fn check_seal(&self, segment: SegmentId, length: u64) -> Result<Option<Loss>, StorageError> {
        let mut state = self.state.lock();
        let copy = state.copy(segment)?;
        let durable = copy.durable(copy.open_state(segment)?).0;
        let open = copy.open_mut(segment)?;
        if durable < length {
            let short = Loss {
                from: durable,
                to: length,
            };
            open.lost = Some(match open.lost.take() {
                Some((loss, reason)) => (loss.union(short), reason),
                None => (
                    short,
                    format!("the copy holds {durable} of the {length} records of its seal"),
                ),
            });
        }
        Ok(open.lost.as_ref().map(|(loss, _)| *loss))
    }

    fn append(
        &self,
        segment: SegmentId,
        records: &dyn RecordBatch,
    ) -> Result<AppendTicket, StorageError> {
        let mut state = self.state.lock();
        let copy = state.copy(segment)?;
        let open = copy.open_state(segment)?;
        check_writable(segment, copy, open)?;
        let first = open.ends.len() as u64;
        if records.is_empty() {
            return Ok(AppendTicket::ready(first..first));
        }
        let pending = copy.disk.log.len() - copy.disk.synced;
        if pending > self.config.pending_bytes_max {
            return Err(StorageError::Busy {
                segment,
                pending_bytes: pending,
                pending_bytes_max: self.config.pending_bytes_max,
            });
        }
        let durable = copy.durable(open).0;
        let durable_below = open.committed.map_or(durable, |c| c.min(durable));
        let frames = self.frame_batch(records, first, durable_below)?;
        let end = first + records.len() as u64;
        MemoryStore::write_frames(&mut state, segment, &frames, first..end)
    }

    fn sync(&self, segment: SegmentId) -> Result<AppendTicket, StorageError> {
        let mut state = self.state.lock();
        let held = state.held;
        let copy = state.copy(segment)?;
        let offsets = {
            let open = copy.open_state(segment)?;
            let end = open.ends.len() as u64;
            end..end
        };
        if !held || copy.disk.synced == copy.disk.log.len() {
            copy.sync_now();
            return Ok(AppendTicket::ready(offsets));
        }
        let end = copy.disk.log.len();
        let completion = crate::ticket::Completion::new();
        copy.open_mut(segment)?
            .waiters
            .push((end, std::sync::Arc::clone(&completion)));
        Ok(AppendTicket::new(offsets, completion))
    }

    fn read_with(
        &self,
        segment: SegmentId,
        from: u64,
        records_max: usize,
        bytes_max: usize,
        visit: &mut dyn FnMut(&FrameView<'_>) -> ControlFlow<()>,
    ) -> Result<usize, StorageError> {
        let bytes = {
            let mut state = self.state.lock();
            let copy = state.copy(segment)?;
            let open = copy.open_state(segment)?;
            let (end, _) = copy.readable_end(open);
            if let Some((loss, reason)) = &open.lost
                && from >= end
                && from < loss.to
            {
                return Err(StorageError::Lost {
                    segment,
                    from: loss.from,
                    to: loss.to,
                    reason: reason.clone(),
                });
            }
            if from > end {
                return Err(StorageError::OffsetOutOfRange {
                    segment,
                    offset: from,
                    end,
                });
            }
            if from == end || records_max == 0 {
                return Ok(0);
            }
            let last = end.min(from.saturating_add(records_max as u64));
            MemoryStore::frames_between(copy, open, from, last)
        };
        let (mut at, mut taken) = (0usize, 0usize);
        while at < bytes.len() {
            let (view, len) =
                frame::decode(&bytes[at..]).map_err(|reason| StorageError::Corrupt {
                    segment,
                    position: at as u64,
                    offset: from + taken as u64,
                    reason,
                })?;
            if taken > 0 && at + len > bytes_max {
                break;
            }
            if visit(&view).is_break() {
                break;
            }
            at += len;
            taken += 1;
        }
        Ok(taken)
    }

    fn append_frames(
        &self,
        segment: SegmentId,
        first: u64,
        frames: &[u8],
    ) -> Result<AppendTicket, StorageError> {
        self.queue_frames(segment, first, frames, None)
    }

    fn repair_frames(
        &self,
        segment: SegmentId,
        first: u64,
        frames: &[u8],
        seal_length: u64,
    ) -> Result<AppendTicket, StorageError> {
        self.queue_frames(segment, first, frames, Some(seal_length))
    }

    fn read_frames(
        &self,
        segment: SegmentId,
        from: u64,
        bytes_max: usize,
    ) -> Result<FrameRun, StorageError> {
        let mut state = self.state.lock();
        let copy = state.copy(segment)?;
        let open = copy.open_state(segment)?;
        let (end, _) = copy.stored_end(open);
        if from > end {
            return Err(StorageError::OffsetOutOfRange {
                segment,
                offset: from,
                end,
            });
        }
        let start = position(&open.ends, from);
        // At least one frame, then whole frames within `bytes_max`.
        let mut last = from;
        while last < end && (last == from || open.ends[last as usize] - start <= bytes_max) {
            last += 1;
        }
        Ok(FrameRun {
            first: from,
            records: last - from,
            bytes: MemoryStore::frames_between(copy, open, from, last),
        })
    }

    fn set_committed(&self, segment: SegmentId, end: u64) -> Result<u64, StorageError> {
        let mut state = self.state.lock();
        let copy = state.copy(segment)?;
        if let Some(seal) = copy.disk.seal {
            return Ok(seal.length);
        }
        let open = copy.open_mut(segment)?;
        let committed = open.committed.map_or(end, |c| c.max(end));
        open.committed = Some(committed);
        Ok(committed)
    }

    fn seal(&self, segment: SegmentId, length: u64) -> Result<SealInfo, StorageError> {
        let mut state = self.state.lock();
        let copy = state.copy(segment)?;
        if let Some(existing) = copy.disk.seal {
            return if existing.length == length {
                Ok(existing)
            } else {
                Err(StorageError::AlreadySealed {
                    segment,
                    existing: existing.length,
                    requested: length,
                })
            };
        }
        copy.open_mut(segment)?.fenced = true;
        MemoryStore::drain(&mut state, segment)?;
        let copy = state.copy(segment)?;
        let open = copy.open_state(segment)?;
        let (durable, _) = copy.durable(open);
        if length > durable {
            return Err(StorageError::SealBeyondEnd {
                segment,
                requested: length,
                stored: durable,
            });
        }
        let info = SealInfo {
            length,
            byte_size: position(&open.ends, length) as u64,
        };
        copy.disk.seal = Some(info);
        let open = copy.open_mut(segment)?;
        if open.committed.is_some() {
            open.committed = Some(length);
        }
        Ok(info)
    }

    fn fence(&self, segment: SegmentId) -> Result<(), StorageError> {
        let mut state = self.state.lock();
        let copy = state.copy(segment)?;
        let open = copy.open_mut(segment)?;
        open.fenced = true;
        let order = open.order;
        copy.disk.fence = Some(order);
        Ok(())
    }

    fn fence_order(
        &self,
        segment: SegmentId,
        order: OrderEpoch,
    ) -> Result<FenceInfo, StorageError> {
        let mut state = self.state.lock();
        let copy = state.copy(segment)?;
        let open = copy.open_mut(segment)?;
        if order.is_stale_against(open.order) {
            return Err(StorageError::StaleOrder {
                segment,
                seen: open.order,
                order,
            });
        }
        open.fenced = true;
        open.order = order;
        copy.disk.fence = Some(order);
        MemoryStore::drain(&mut state, segment)?;
        let copy = state.copy(segment)?;
        let open = copy.open_state(segment)?;
        let (durable, durable_bytes) = copy.durable(open);
        Ok(FenceInfo {
            durable,
            durable_bytes,
            sealed: copy.disk.seal,
            order: open.order,
            failed: open.failed.is_some(),
        })
    }

    fn order_epoch(&self, segment: SegmentId) -> Result<OrderEpoch, StorageError> {
        let mut state = self.state.lock();
        Ok(state.copy(segment)?.open_state(segment)?.order)
    }

    fn truncate_tail(&self, segment: SegmentId, length: u64) -> Result<SegmentInfo, StorageError> {
        let refuse = |reason| StorageError::NotTruncatable {
            segment,
            length,
            reason,
        };
        let mut state = self.state.lock();
        let copy = state.copy(segment)?;
        let open = copy.open_state(segment)?;
        if copy.disk.seal.is_some() || open.fenced || open.failed.is_some() {
            return Err(refuse("the copy is sealed, fenced or failed"));
        }
        if open.committed.is_some() {
            return Err(refuse("the copy is replicated"));
        }
        let assigned = open.ends.len() as u64;
        if assigned != open.opened_end || assigned != copy.durable(open).0 {
            return Err(refuse("records were appended since the copy was opened"));
        }
        if length > assigned {
            return Err(refuse("the copy holds fewer records"));
        }
        let cut = position(&open.ends, length);
        copy.cut(cut);
        let open = copy.open_mut(segment)?;
        open.ends.truncate(length as usize);
        open.opened_end = length;
        let copy = state.copy(segment)?;
        Ok(info_of(segment, copy, copy.open_state(segment)?))
    }

    fn cut_to_seal(&self, segment: SegmentId) -> Result<u64, StorageError> {
        let mut state = self.state.lock();
        let copy = state.copy(segment)?;
        let open = copy.open_state(segment)?;
        let durable = copy.durable(open).0;
        let Some(seal) = copy.disk.seal else {
            return Err(StorageError::NotTruncatable {
                segment,
                length: durable,
                reason: "the copy is not sealed",
            });
        };
        let stored = copy.disk.log.len() as u64;
        if durable <= seal.length {
            return Ok(0);
        }
        copy.cut(seal.byte_size as usize);
        let open = copy.open_mut(segment)?;
        open.ends.truncate(seal.length as usize);
        open.opened_end = seal.length;
        Ok(stored - seal.byte_size)
    }

    fn verify(&self, segment: SegmentId) -> Result<VerifyReport, StorageError> {
        let state = self.state.lock();
        let copy = state
            .copies
            .get(&segment)
            .filter(|c| c.disk.exists)
            .ok_or(StorageError::NotOpen { segment })?;
        let end = match &copy.open {
            Some(open) => copy.readable_end(open).1 as usize,
            None => copy.disk.log.len(),
        };
        let scan = copy::scan(&copy.disk.log[..end]);
        Ok(VerifyReport {
            segment,
            records: scan.ends.len() as u64,
            valid_bytes: position(&scan.ends, scan.ends.len() as u64) as u64,
            scanned_bytes: end as u64,
            first_bad: scan.first_bad,
            valid_after: None,
            later_flush: None,
            index_entries_bad: 0,
        })
    }

    fn info(&self, segment: SegmentId) -> Result<SegmentInfo, StorageError> {
        let mut state = self.state.lock();
        let copy = state.copy(segment)?;
        Ok(info_of(segment, copy, copy.open_state(segment)?))
    }

    fn close(&self, segment: SegmentId) -> Result<(), StorageError> {
        let mut state = self.state.lock();
        MemoryStore::drain(&mut state, segment)?;
        state.copy(segment)?.open = None;
        Ok(())
    }

    fn copy_bytes(&self, segment: SegmentId) -> Result<Option<u64>, StorageError> {
        let state = self.state.lock();
        Ok(state
            .copies
            .get(&segment)
            .filter(|c| c.disk.exists)
            .map(|c| c.disk.log.len() as u64))
    }

    fn has_seal_marker(&self, segment: SegmentId) -> bool {
        let state = self.state.lock();
        state
            .copies
            .get(&segment)
            .is_some_and(|c| c.disk.seal.is_some())
    }

    fn seal_at_rest(&self, segment: SegmentId) -> Result<Option<SealInfo>, StorageError> {
        let state = self.state.lock();
        Ok(state.copies.get(&segment).and_then(|c| c.disk.seal))
    }

    fn read_sidecar(&self, segment: SegmentId) -> Result<Option<Vec<u8>>, StorageError> {
        let state = self.state.lock();
        Ok(state
            .copies
            .get(&segment)
            .and_then(|c| c.disk.sidecar.clone()))
    }

    fn write_sidecar(&self, segment: SegmentId, bytes: &[u8]) -> Result<(), StorageError> {
        let mut state = self.state.lock();
        let copy = state.copies.entry(segment).or_default();
        copy.disk.sidecar = Some(bytes.to_vec());
        copy.disk.modified = SystemTime::now();
        Ok(())
    }

    fn set_aside(&self, segment: SegmentId) -> Result<bool, StorageError> {
        let mut state = self.state.lock();
        let Some(copy) = state.copies.get_mut(&segment) else {
            return Ok(false);
        };
        copy.sync_now();
        copy.open = None;
        let moved = copy.disk.exists && copy.disk.aside.is_none();
        let log = std::mem::take(&mut copy.disk.log);
        if moved {
            copy.disk.aside = Some(log);
        }
        copy.disk.synced = 0;
        copy.disk.exists = false;
        copy.disk.seal = None;
        copy.disk.modified = SystemTime::now();
        Ok(moved)
    }

    fn is_aside(&self, segment: SegmentId) -> bool {
        let state = self.state.lock();
        state
            .copies
            .get(&segment)
            .is_some_and(|c| c.disk.aside.is_some())
    }

    fn discard_aside(&self, segment: SegmentId) -> Result<u64, StorageError> {
        let mut state = self.state.lock();
        let aside = state
            .copies
            .get_mut(&segment)
            .and_then(|c| c.disk.aside.take());
        Ok(aside.map_or(0, |log| log.len() as u64))
    }

    fn repair_index(&self, _segment: SegmentId) -> Result<(), StorageError> {
        // No index: every read scans the frames it returns.
        Ok(())
    }

    fn remove_copy(&self, segment: SegmentId) -> Result<Option<u64>, StorageError> {
        let mut state = self.state.lock();
        let Some(mut copy) = state.copies.remove(&segment) else {
            return Ok(None);
        };
        copy.sync_now();
        let disk = copy.disk;
        let sidecar = disk.sidecar.map_or(0, |s| s.len());
        let aside = disk.aside.map_or(0, |a| a.len());
        Ok(Some((disk.log.len() + sidecar + aside) as u64))
    }

    fn local_copies(&self) -> Result<Vec<SegmentId>, StorageError> {
        let state = self.state.lock();
        Ok(state
            .copies
            .iter()
            .filter(|(_, c)| {
                let d = &c.disk;
                d.exists || d.aside.is_some() || d.sidecar.is_some() || d.fence.is_some()
            })
            .map(|(&id, _)| id)
            .collect())
    }

    fn copy_modified(&self, segment: SegmentId) -> Option<SystemTime> {
        let state = self.state.lock();
        state.copies.get(&segment).map(|c| c.disk.modified)
    }
}
