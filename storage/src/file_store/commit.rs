//! Group commit: queueing batches under a segment's lock, deciding when
//! to flush, and the sync threads' pipelined writes and `fdatasync`s
//! (see the module doc of `file_store`).

use super::*;

impl FileStore {
    /// The one path of a replica's frames into a copy: `append_frames`
    /// (`repair: None`) and `repair_frames` (`repair: Some(seal_length)`).
    pub(super) fn queue_frames(
        &self,
        segment: SegmentId,
        first: u64,
        frames: &[u8],
        repair: Option<u64>,
    ) -> Result<AppendTicket, StorageError> {
        let cfg = &self.shared.config;
        let seg = self.segment(segment)?;
        if frames.len() > cfg.pending_bytes_max {
            return Err(StorageError::BatchTooLarge {
                records: 0,
                bytes: frames.len(),
                records_max: cfg.batch_records_max,
                bytes_max: cfg.pending_bytes_max,
            });
        }
        // Every frame is checked before any byte is queued: a bad run is
        // refused whole, so the copy never holds half of it.
        let starts = check_frames(segment, first, frames, cfg)?;
        let (ticket, wake) = {
            let mut st = seg.state.lock();
            match repair {
                None => check_writable(segment, &st)?,
                Some(seal) => {
                    check_repairable(segment, &st)?;
                    let end = first.saturating_add(starts.len() as u64);
                    if end > seal {
                        return Err(StorageError::PastSeal { segment, end, seal });
                    }
                }
            }
            if first != st.next_offset {
                return Err(StorageError::NotAtEnd {
                    segment,
                    first,
                    end: st.next_offset,
                });
            }
            if starts.is_empty() {
                return Ok(AppendTicket::ready(first..first));
            }
            if st.pending_bytes > 0 && st.pending_bytes + frames.len() > cfg.pending_bytes_max {
                return Err(StorageError::Busy {
                    segment,
                    pending_bytes: st.pending_bytes,
                    pending_bytes_max: cfg.pending_bytes_max,
                });
            }
            queue(
                cfg,
                &mut st,
                Batch {
                    bytes: frames.to_vec(),
                    starts,
                    body_crcs: Vec::new(),
                },
            )
        };
        self.shared.wake(&seg, wake);
        Ok(self.with_help(ticket, &seg))
    }
}

impl Shared {
    pub(super) fn wake(&self, seg: &Arc<Segment>, wake: Wake) {
        match wake {
            Wake::Nothing => {}
            Wake::Ready => {
                let mut sched = self.sched.lock();
                sched.ready.push_back(Arc::clone(seg));
                self.sched_cv.notify_one();
            }
            Wake::Timer(deadline) => {
                let mut sched = self.sched.lock();
                sched.seq += 1;
                let seq = sched.seq;
                sched.timers.push(TimerEntry {
                    deadline,
                    seq,
                    segment: Arc::clone(seg),
                });
                self.sched_cv.notify_one();
            }
        }
    }
}

/// Queues `batch` at the segment's end under its lock (offsets are
/// assigned here, so offset order is enqueue order) and returns its ticket
/// and whether a flush should start.
pub(super) fn queue(cfg: &StoreConfig, st: &mut SegState, batch: Batch) -> (AppendTicket, Wake) {
    let first = st.next_offset;
    let records = batch.starts.len();
    st.next_offset += records as u64;
    if st.pending_records == 0 {
        st.pending_first_offset = first;
        st.pending_since = Some(Instant::now());
    }
    st.pending_bytes += batch.bytes.len();
    st.pending_records += records;
    st.pending.push(batch);
    let completion = Completion::new();
    st.pending_waiters.push(Arc::clone(&completion));
    let wake = decide(cfg, st, Instant::now());
    (AppendTicket::new(first..st.next_offset, completion), wake)
}

/// Decides, under the segment lock, whether its pending bytes should be
/// flushed now, on a timer, or left to the flush in flight.
pub(super) fn decide(cfg: &StoreConfig, st: &mut SegState, now: Instant) -> Wake {
    if !can_take(cfg, st) || st.pending_records == 0 || st.failed.is_some() {
        return Wake::Nothing;
    }
    let interval = Duration::from_millis(cfg.flush_interval_ms);
    let deadline = st.pending_since.unwrap_or(now) + interval;
    let due = cfg.flush_interval_ms == 0
        || st.force_flush
        || st.pending_records >= cfg.flush_records_max
        || st.pending_bytes >= cfg.flush_bytes_max
        || deadline <= now;
    if due {
        if st.ready_queued {
            return Wake::Nothing;
        }
        st.ready_queued = true;
        Wake::Ready
    } else if st.timer_armed {
        Wake::Nothing
    } else {
        st.timer_armed = true;
        Wake::Timer(deadline)
    }
}

/// Whether a new flush may start: nothing is writing and a slot is free.
pub(super) fn can_take(cfg: &StoreConfig, st: &SegState) -> bool {
    !st.writing && free_slot(cfg, st).is_some()
}

pub(super) fn free_slot(cfg: &StoreConfig, st: &SegState) -> Option<usize> {
    (0..cfg.flush_pipeline_depth).find(|slot| st.slots_busy & (1 << slot) == 0)
}

pub(super) fn sync_worker(shared: &Shared) {
    loop {
        let (seg, source) = {
            let mut sched = shared.sched.lock();
            loop {
                if let Some(seg) = sched.ready.pop_front() {
                    break (seg, FlushSource::Ready);
                }
                let now = Instant::now();
                match sched.timers.peek().map(|t| t.deadline) {
                    Some(deadline) if deadline <= now => {
                        if let Some(entry) = sched.timers.pop() {
                            break (entry.segment, FlushSource::Timer);
                        }
                    }
                    Some(deadline) => {
                        if sched.shutdown {
                            return;
                        }
                        shared.sched_cv.wait_for(&mut sched, deadline - now);
                    }
                    None => {
                        if sched.shutdown {
                            return;
                        }
                        shared.sched_cv.wait(&mut sched);
                    }
                }
            }
        };
        flush(shared, &seg, source);
    }
}

pub(super) struct Taken {
    batches: Vec<Batch>,
    /// The partial last block's bytes (direct writes only).
    head: Vec<u8>,
    seq: u64,
    slot: usize,
    records: u64,
    bytes: u64,
    first: u64,
    position: u64,
    durable_below: u64,
    /// An earlier flush of this file was still syncing when this one was taken.
    overlapped: bool,
}

/// Who runs a flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FlushSource {
    /// A sync thread, for a segment it took from the ready queue.
    Ready,
    /// A sync thread, for a segment whose flush timer fired.
    Timer,
    /// A caller blocked in `AppendTicket::wait` on an idle segment, which
    /// flushes itself rather than wait for a sync thread to wake up.
    Helper,
}

/// One group commit of one file: one vectored write and one fdatasync,
/// pipelined behind up to `flush_pipeline_depth - 1` earlier ones.
pub(super) fn flush(shared: &Shared, seg: &Arc<Segment>, source: FlushSource) {
    let cfg = &shared.config;
    let Some(taken) = take_flush(cfg, seg, source) else {
        return;
    };
    if taken.overlapped {
        shared.stats.lock().flushes_overlapped += 1;
    }
    let Taken {
        mut batches,
        head,
        seq,
        slot,
        records,
        bytes,
        first,
        position,
        durable_below,
        overlapped: _,
    } = taken;
    let sealed_to = seal_trailers(&mut batches, first, durable_below);
    assert_eq!(
        sealed_to,
        first + records,
        "pending record count out of step"
    );
    let file = &seg.writers[slot];
    let mut written = if !seg.direct {
        write_batches(file, &batches, position).map(|()| None)
    } else if head.len() + bytes as usize >= cfg.direct_io_bytes_min {
        write_direct(shared, file, head, &batches, position, bytes).map(Some)
    } else {
        // A small flush costs little to copy through the page cache, and a
        // direct write of it would rewrite a whole block for a few records.
        write_batches(&seg.log, &batches, position).map(|()| {
            Some(direct::tail_of(
                &head,
                &batches_bytes(&batches),
                position + bytes,
            ))
        })
    };
    if written.is_ok() {
        index_written(seg, &batches, first, position);
    }
    let wake = {
        let mut st = seg.state.lock();
        st.writing = false;
        match &mut written {
            Ok(tail) => {
                assert_eq!(st.written_bytes, position, "flush writes out of order");
                st.written_bytes = position + bytes;
                if let Some(tail) = tail.take() {
                    st.tail_block = tail;
                }
                // Served only below the durable end, which this flush's
                // sync moves (`read_frames`).
                st.recent.keep(first, batches);
            }
            // Latch before anyone can take a flush that would write after a gap.
            Err(e) => latch_failed(&mut st, seq, e),
        }
        // The next flush may write while this one syncs.
        decide(cfg, &mut st, Instant::now())
    };
    shared.wake(seg, wake);
    #[cfg(test)]
    {
        let hook = shared.sync_hook.lock().clone();
        if let Some(hook) = hook {
            (hook.0)(seg.id, seq);
        }
    }
    let result = written.and_then(|_| file.sync_data());
    complete(shared, seg, seq, slot, result);
}

/// Takes the segment's pending batches for a flush, under its lock: the
/// write turn, a free pipeline slot and a place in the in-flight queue.
/// `None` when there is nothing to flush, the copy failed, or a write or
/// every slot is busy (the flush running then takes the rest).
fn take_flush(cfg: &StoreConfig, seg: &Segment, source: FlushSource) -> Option<Taken> {
    let mut st = seg.state.lock();
    match source {
        FlushSource::Timer => st.timer_armed = false,
        FlushSource::Ready => st.ready_queued = false,
        FlushSource::Helper => {}
    }
    if st.pending_records == 0 || st.failed.is_some() {
        return None;
    }
    let (false, Some(slot)) = (st.writing, free_slot(cfg, &st)) else {
        return None;
    };
    // Nothing is writing, so a busy slot is an earlier flush in its sync.
    let overlapped = st.slots_busy != 0;
    st.writing = true;
    st.slots_busy |= 1 << slot;
    st.force_flush = false;
    st.pending_since = None;
    let seq = st.flush_seq;
    st.flush_seq += 1;
    let taken = Taken {
        batches: std::mem::take(&mut st.pending),
        head: std::mem::take(&mut st.tail_block),
        seq,
        slot,
        records: st.pending_records as u64,
        bytes: st.pending_bytes as u64,
        first: st.pending_first_offset,
        position: st.written_bytes,
        // A replicated copy's frames carry the committed end, which is
        // the same on every copy that writes them (ADR 0094).
        durable_below: st
            .committed
            .map_or(st.durable_offset, |c| c.min(st.durable_offset)),
        overlapped,
    };
    let waiters = std::mem::take(&mut st.pending_waiters);
    st.inflight.push_back(InFlight {
        seq,
        first: taken.first,
        records: taken.records,
        position: taken.position,
        bytes: taken.bytes,
        waiters,
        outcome: None,
    });
    st.pending_records = 0;
    st.pending_bytes = 0;
    Some(taken)
}

/// Fills in each appended frame's trailer (offset, `durable_below`, CRC)
/// now that the flush is known, and returns the offset after the last
/// frame. `durable_below` (the durable end when this flush was taken) is
/// what lets recovery tell this flush's torn pages, or a pipelined
/// neighbour's, from damage to a flush that was already durable. The
/// appenders already checksummed the bodies, so this costs 16 bytes of CRC
/// a frame. A replica's frames are written as they arrived.
fn seal_trailers(batches: &mut [Batch], first: u64, durable_below: u64) -> u64 {
    let mut offset = first;
    for batch in batches {
        if batch.is_verbatim() {
            // Checked frame by frame when it was queued.
            offset += batch.starts.len() as u64;
            continue;
        }
        for (i, &start) in batch.starts.iter().enumerate() {
            let end = batch
                .starts
                .get(i + 1)
                .copied()
                .unwrap_or(batch.bytes.len());
            let body_crc = batch.body_crcs[i].clone();
            frame::seal_frame(
                &mut batch.bytes[start..end],
                offset,
                durable_below,
                body_crc,
            );
            if cfg!(debug_assertions) {
                // Pair the checksum written with one read back before the bytes leave.
                let decoded = frame::decode(&batch.bytes[start..end]).map(|(v, _)| v.offset);
                debug_assert_eq!(decoded, Ok(offset));
            }
            offset += 1;
        }
    }
    offset
}

/// Adds a written flush's frames to the sparse index and appends the new
/// entries to the sidecar. Writes are serialized, so entries arrive in
/// offset order; entries past the durable end are harmless, since reads
/// stop at it.
fn index_written(seg: &Segment, batches: &[Batch], first: u64, position: u64) {
    let mut idx = seg.index.lock();
    let (mut offset, mut base) = (first, position);
    for batch in batches {
        for &start in &batch.starts {
            idx.index.observe(offset, base + start as u64);
            offset += 1;
        }
        base += batch.bytes.len() as u64;
    }
    let new = idx.index.encode_from(idx.persisted);
    let at = (idx.persisted * crate::index::INDEX_ENTRY_BYTES) as u64;
    // The sidecar is derived data: a failed write only costs a rebuild.
    if let Err(e) = seg.idx.write_all_at(&new, at) {
        warn!(segment = seg.id.0, error = %e, "index sidecar write failed");
    } else {
        idx.persisted = idx.index.entries().len();
    }
}

/// Marks the segment failed from flush `seq` on: fsync errors cannot be
/// retried safely, so the copy takes no more appends.
pub(super) fn latch_failed(st: &mut SegState, seq: u64, e: &io::Error) {
    if st.failed.is_none() {
        st.failed = Some(e.to_string());
    }
    st.failed_from_seq = Some(st.failed_from_seq.map_or(seq, |from| from.min(seq)));
}

/// Records a flush's outcome, frees its slot and publishes every flush at
/// the head of the pipeline whose outcome is known, in order.
pub(super) fn complete(
    shared: &Shared,
    seg: &Arc<Segment>,
    seq: u64,
    slot: usize,
    result: io::Result<()>,
) {
    let (done, wake, published) = {
        let mut st = seg.state.lock();
        st.slots_busy &= !(1 << slot);
        let mut done = Vec::new();
        let outcome = match &result {
            Ok(()) => Ok(()),
            Err(e) => {
                error!(segment = seg.id.0, error = %e, seq, "flush failed; segment latched as failed");
                latch_failed(&mut st, seq, e);
                // Nothing pending will be written any more.
                let failed = StorageError::Failed {
                    segment: seg.id,
                    reason: e.to_string(),
                };
                done.push((std::mem::take(&mut st.pending_waiters), Err(failed)));
                st.pending.clear();
                st.pending_records = 0;
                st.pending_bytes = 0;
                Err(StorageError::io("flush log", &seg.log_path, clone_io(e)))
            }
        };
        let Some(entry) = st.inflight.iter_mut().find(|f| f.seq == seq) else {
            unreachable!("a flush stays in the pipeline until it is published");
        };
        entry.outcome = Some(outcome);
        let mut published = (0u64, 0u64, 0u64);
        while st.inflight.front().is_some_and(|f| f.outcome.is_some()) {
            let Some(f) = st.inflight.pop_front() else {
                break;
            };
            let mut outcome = f.outcome.unwrap_or(Err(StorageError::ShuttingDown));
            if outcome.is_ok() && st.failed_from_seq.is_some_and(|from| f.seq > from) {
                // Its own sync succeeded, but an earlier flush's data is lost:
                // durability is a prefix, so this one is not durable either.
                outcome = Err(StorageError::Failed {
                    segment: seg.id,
                    reason: st.failed.clone().unwrap_or_default(),
                });
            }
            if outcome.is_ok() {
                assert_eq!(f.first, st.durable_offset, "flushes published out of order");
                st.durable_offset = f.first + f.records;
                st.durable_bytes = f.position + f.bytes;
                published.0 += 1;
                published.1 += f.bytes;
                published.2 += f.records;
            }
            done.push((f.waiters, outcome));
        }
        let wake = decide(&shared.config, &mut st, Instant::now());
        seg.idle.notify_all();
        (done, wake, published)
    };
    if published.0 > 0 {
        let mut stats = shared.stats.lock();
        stats.flushes += published.0;
        stats.flushed_bytes += published.1;
        stats.flushed_records += published.2;
    }
    shared.wake(seg, wake);
    for (waiters, outcome) in done {
        for waiter in waiters {
            waiter.complete(outcome.clone());
        }
    }
}

pub(super) fn batches_bytes(batches: &[Batch]) -> Vec<&[u8]> {
    batches.iter().map(|b| b.bytes.as_slice()).collect()
}

pub(super) fn align_down(position: u64) -> u64 {
    position / BLOCK_BYTES as u64 * BLOCK_BYTES as u64
}

/// Opens one writer per pipeline slot, with `O_DIRECT` when configured and
/// supported. Returns the writers and whether they are direct.
pub(super) fn open_writers(
    path: &Path,
    cfg: &StoreConfig,
) -> Result<(Vec<File>, bool), StorageError> {
    let open = |direct: bool| {
        (0..cfg.flush_pipeline_depth)
            .map(|_| {
                let mut options = OpenOptions::new();
                options.write(true);
                if direct {
                    options.custom_flags(libc::O_DIRECT);
                }
                options.open(path)
            })
            .collect::<io::Result<Vec<File>>>()
    };
    if cfg.direct_io {
        match open(true) {
            Ok(writers) => return Ok((writers, true)),
            Err(e) if direct::unsupported(&e) => {
                warn!(path = %path.display(), "the file system refuses O_DIRECT; writing through the page cache");
            }
            Err(e) => return Err(StorageError::io("open log for direct writes", path, e)),
        }
    }
    let writers = open(false).map_err(|e| StorageError::io("open log for writing", path, e))?;
    Ok((writers, false))
}

/// Copies the partial last block's bytes and the batches into an aligned
/// buffer and writes it (see [`direct`]). Returns the new partial block.
pub(super) fn write_direct(
    shared: &Shared,
    file: &File,
    head: Vec<u8>,
    batches: &[Batch],
    position: u64,
    bytes: u64,
) -> io::Result<Vec<u8>> {
    let base = position - head.len() as u64;
    assert_eq!(base, align_down(position), "partial block out of step");
    let mut buf = shared.buffers.lock().pop().unwrap_or_default();
    buf.reset(head.len() + bytes as usize);
    buf.extend_from_slice(&head);
    for batch in batches {
        buf.extend_from_slice(&batch.bytes);
    }
    let tail = direct::write_padded(file, &mut buf, base);
    if tail.is_ok() {
        shared.stats.lock().direct_bytes += buf.as_slice().len() as u64;
    }
    if buf.capacity() <= direct::POOLED_BUFFER_BYTES_MAX {
        let mut pool = shared.buffers.lock();
        if pool.len() < direct::POOLED_BUFFERS_MAX {
            pool.push(buf);
        }
    }
    tail
}

/// Writes the batches back to back at `position` with vectored writes.
/// Only the one flusher of a segment moves the file cursor; reads use pread.
pub(super) fn write_batches(log: &File, batches: &[Batch], position: u64) -> io::Result<()> {
    let mut file = log;
    file.seek(SeekFrom::Start(position))?;
    let mut slices: Vec<IoSlice<'_>> = batches.iter().map(|b| IoSlice::new(&b.bytes)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let written = match file.write_vectored(rest) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if written == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "vectored write wrote nothing",
            ));
        }
        IoSlice::advance_slices(&mut rest, written);
    }
    Ok(())
}

pub(super) fn clone_io(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}
