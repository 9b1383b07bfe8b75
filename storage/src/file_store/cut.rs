//! Cutting a copy's log back: a torn batch at the end of an unreplicated
//! copy, or the bytes past a sealed copy's seal. Each cut reads what can
//! fail first, then cuts the log, resets the copy's end and cuts the
//! sidecar index (derived data: a failed cut of it only costs a rebuild).

use super::*;

impl FileStore {
    /// Cuts a torn batch from the end of an unreplicated copy that took
    /// no append since it was opened (`SegmentStore::truncate_tail`).
    pub(super) fn cut_torn_batch(
        &self,
        segment: SegmentId,
        length: u64,
    ) -> Result<SegmentInfo, StorageError> {
        let seg = self.segment(segment)?;
        let refuse = |reason| StorageError::NotTruncatable {
            segment,
            length,
            reason,
        };
        let mut st = seg.state.lock();
        if st.sealed.is_some() || st.fenced || st.failed.is_some() {
            return Err(refuse("the copy is sealed, fenced or failed"));
        }
        if st.committed.is_some() {
            return Err(refuse("the copy is replicated"));
        }
        if st.next_offset != st.opened_end
            || st.next_offset != st.durable_offset
            || st.pending_records != 0
            || st.writing
            || !st.inflight.is_empty()
        {
            return Err(refuse("records were appended since the copy was opened"));
        }
        if length > st.durable_offset {
            return Err(refuse("the copy holds fewer records"));
        }
        if length == st.durable_offset {
            drop(st);
            return Ok(FileStore::info_of(&seg));
        }
        let locate = ReadBudget {
            records_max: 0,
            bytes_max: 0,
        };
        let end = (st.durable_offset, st.durable_bytes);
        let (position, _) = self.read_range(&seg, length, end, locate, &mut |_, _, _| {
            ControlFlow::Break(())
        })?;
        let io = |op: &'static str| log_err(&seg, op);
        // Everything that can fail without changing the copy goes first.
        let tail_block = last_block(&seg, position)?;
        seg.log.set_len(position).map_err(io("cut the log"))?;
        st.end_at(length, position, tail_block);
        if let Err(e) = seg.log.sync_data() {
            // As after any failed sync: the copy takes no more appends.
            st.failed = Some(e.to_string());
            return Err(io("sync log")(e));
        }
        cut_index(&seg, length);
        warn!(
            segment = seg.id.0,
            records = length,
            bytes = position,
            "cut a torn batch from the end of the log"
        );
        drop(st);
        Ok(FileStore::info_of(&seg))
    }

    /// Cuts a sealed copy's bytes past its seal (`SegmentStore::cut_to_seal`).
    pub(super) fn cut_past_seal(&self, segment: SegmentId) -> Result<u64, StorageError> {
        let seg = self.segment(segment)?;
        let mut st = seg.state.lock();
        let Some(seal) = st.sealed else {
            return Err(StorageError::NotTruncatable {
                segment,
                length: st.durable_offset,
                reason: "the copy is not sealed",
            });
        };
        // Sealing fenced and drained the copy: nothing is in flight.
        debug_assert!(st.inflight.is_empty() && st.pending_records == 0);
        let io = |op: &'static str| log_err(&seg, op);
        let file_len = seg.log.metadata().map_err(io("stat log"))?.len();
        if st.durable_offset <= seal.length && file_len <= seal.byte_size {
            return Ok(0);
        }
        if st.durable_offset < seal.length {
            // Short of its seal, and longer on disk only by padding: filling
            // it is repair's job, not a cut's.
            return Ok(0);
        }
        let position = seal.byte_size;
        let tail_block = last_block(&seg, position)?;
        seg.log
            .set_len(position)
            .map_err(io("cut the log at its seal"))?;
        if let Err(e) = seg.log.sync_data() {
            st.failed = Some(e.to_string());
            return Err(io("sync log")(e));
        }
        st.end_at(seal.length, position, tail_block);
        drop(st);
        cut_index(&seg, seal.length);
        let cut = file_len.saturating_sub(position);
        debug!(
            segment = segment.0,
            length = seal.length,
            bytes = position,
            cut,
            "cut to its seal"
        );
        Ok(cut)
    }
}

/// An I/O error on the copy's log.
fn log_err(seg: &Segment, op: &'static str) -> impl FnOnce(io::Error) -> StorageError + use<> {
    let path = seg.log_path.clone();
    move |e| StorageError::io(op, path, e)
}

/// With direct writes, the bytes of the partial block that ends at
/// `position`, which the next flush rewrites; empty otherwise.
fn last_block(seg: &Segment, position: u64) -> Result<Vec<u8>, StorageError> {
    if !seg.direct {
        return Ok(Vec::new());
    }
    let base = align_down(position);
    let mut tail = vec![0u8; (position - base) as usize];
    seg.log
        .read_exact_at(&mut tail, base)
        .map_err(log_err(seg, "read the last block"))?;
    Ok(tail)
}

/// Cuts the sparse index and its sidecar to the first `length` records.
fn cut_index(seg: &Segment, length: u64) {
    let mut idx = seg.index.lock();
    idx.index.truncate(length);
    let kept = idx.index.entries().len();
    idx.persisted = idx.persisted.min(kept);
    let bytes = (kept * crate::index::INDEX_ENTRY_BYTES) as u64;
    if let Err(e) = seg.idx.set_len(bytes) {
        warn!(segment = seg.id.0, error = %e, "index sidecar cut failed");
    }
}

impl SegState {
    /// Sets the copy's end after a cut of its log to `length` records and
    /// `position` bytes, with nothing pending or in flight.
    fn end_at(&mut self, length: u64, position: u64, tail_block: Vec<u8>) {
        debug_assert!(self.inflight.is_empty() && self.pending_records == 0);
        self.next_offset = length;
        self.opened_end = length;
        self.durable_offset = length;
        self.pending_first_offset = length;
        self.durable_bytes = position;
        self.written_bytes = position;
        self.tail_block = tail_block;
        // Kept frames past the new end are no longer the log's.
        self.recent.clear();
    }
}
