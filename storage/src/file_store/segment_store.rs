//! `SegmentStore` for `FileStore`: the trait's methods, each taking the
//! segment's lock and calling into the room that does the work.

use super::*;

impl SegmentStore for FileStore {
    fn open(&self, segment: SegmentId) -> Result<Recovery, StorageError> {
        if let Ok(seg) = self.segment(segment) {
            return Ok(Recovery {
                info: FileStore::info_of(&seg),
                truncated_bytes: 0,
                index_rebuilt: false,
                short_of_seal: false,
                log_missing: false,
            });
        }
        let (seg, recovery) = self.open_segment(segment, false)?;
        let mut segments = self.shared.segments.lock();
        if let Some(existing) = segments.get(&segment) {
            // A concurrent open won; its scan saw the same bytes.
            return Ok(Recovery {
                info: FileStore::info_of(existing),
                ..recovery
            });
        }
        segments.insert(segment, Arc::new(seg));
        Ok(recovery)
    }

    fn open_quarantined(&self, segment: SegmentId) -> Result<Recovery, StorageError> {
        if let Ok(seg) = self.segment(segment) {
            return Ok(Recovery {
                info: FileStore::info_of(&seg),
                truncated_bytes: 0,
                index_rebuilt: false,
                short_of_seal: false,
                log_missing: false,
            });
        }
        let (seg, recovery) = self.open_segment(segment, true)?;
        let mut segments = self.shared.segments.lock();
        if let Some(existing) = segments.get(&segment) {
            return Ok(Recovery {
                info: FileStore::info_of(existing),
                ..recovery
            });
        }
        segments.insert(segment, Arc::new(seg));
        Ok(recovery)
    }

    fn check_seal(&self, segment: SegmentId, length: u64) -> Result<Option<Loss>, StorageError> {
        let seg = self.segment(segment)?;
        let mut st = seg.state.lock();
        if st.durable_offset < length {
            let short = Loss {
                from: st.durable_offset,
                to: length,
            };
            let lost = match st.lost.take() {
                Some((loss, reason)) => (loss.union(short), reason),
                None => (
                    short,
                    format!(
                        "the copy holds {} of the {} records of its seal",
                        st.durable_offset, length
                    ),
                ),
            };
            st.lost = Some(lost);
        }
        Ok(st.lost.as_ref().map(|(loss, _)| *loss))
    }

    fn append(
        &self,
        segment: SegmentId,
        records: &dyn RecordBatch,
    ) -> Result<AppendTicket, StorageError> {
        let cfg = &self.shared.config;
        let seg = self.segment(segment)?;
        let mut frames = Vec::new();
        let mut starts = Vec::with_capacity(records.len());
        let mut body_crcs = Vec::with_capacity(records.len());
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
        frames.reserve_exact(batch_bytes);
        for record in records.iter() {
            starts.push(frames.len());
            body_crcs.push(frame::encode_unsealed(&mut frames, record));
        }
        debug_assert_eq!(frames.len(), batch_bytes);
        let (ticket, wake) = {
            let mut st = seg.state.lock();
            check_writable(segment, &st)?;
            if records.is_empty() {
                return Ok(AppendTicket::ready(st.next_offset..st.next_offset));
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
                    bytes: frames,
                    starts,
                    body_crcs,
                },
            )
        };
        self.shared.wake(&seg, wake);
        Ok(self.with_help(ticket, &seg))
    }

    fn sync(&self, segment: SegmentId) -> Result<AppendTicket, StorageError> {
        let seg = self.segment(segment)?;
        let (ticket, wake) = {
            let mut st = seg.state.lock();
            if let Some(reason) = &st.failed {
                return Err(StorageError::Failed {
                    segment,
                    reason: reason.clone(),
                });
            }
            let end = st.next_offset;
            let completion = Completion::new();
            let ticket = AppendTicket::new(end..end, Arc::clone(&completion));
            if st.pending_records > 0 {
                st.pending_waiters.push(completion);
                st.force_flush = true;
            } else if let Some(last) = st.inflight.back_mut() {
                // Published in order, so the last flush covers everything.
                last.waiters.push(completion);
            } else {
                return Ok(AppendTicket::ready(end..end));
            }
            (ticket, decide(&self.shared.config, &mut st, Instant::now()))
        };
        self.shared.wake(&seg, wake);
        Ok(self.with_help(ticket, &seg))
    }

    fn read_with(
        &self,
        segment: SegmentId,
        from: u64,
        records_max: usize,
        bytes_max: usize,
        visit: &mut dyn FnMut(&FrameView<'_>) -> ControlFlow<()>,
    ) -> Result<usize, StorageError> {
        let seg = self.segment(segment)?;
        let (end, lost) = {
            let st = seg.state.lock();
            (readable_end(&st), st.lost.clone())
        };
        if let Some((loss, reason)) = lost
            && from >= end.0
            && from < loss.to
        {
            return Err(StorageError::Lost {
                segment,
                from: loss.from,
                to: loss.to,
                reason,
            });
        }
        if from > end.0 {
            return Err(StorageError::OffsetOutOfRange {
                segment,
                offset: from,
                end: end.0,
            });
        }
        if from == end.0 || records_max == 0 {
            return Ok(0);
        }
        let mut expected = from;
        let budget = ReadBudget {
            records_max,
            bytes_max,
        };
        let (_, taken) = self.read_range(&seg, from, end, budget, &mut |view, _, _| {
            // Cheap enough to keep on: a reader must never see a gap.
            assert_eq!(view.offset, expected, "read handed out a gap");
            expected += 1;
            visit(view)
        })?;
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
        let seg = self.segment(segment)?;
        let ((end, end_bytes), kept) = {
            let st = seg.state.lock();
            let end = stored_end(&st);
            (end, st.recent.runs_from(from, end.0))
        };
        if from > end {
            return Err(StorageError::OffsetOutOfRange {
                segment,
                offset: from,
                end,
            });
        }
        if from == end {
            return Ok(FrameRun {
                first: from,
                records: 0,
                bytes: Vec::new(),
            });
        }
        if let Some(run) = recent::run_of(&kept, from, end, bytes_max) {
            self.shared.stats.lock().frames_from_memory_bytes += run.bytes.len() as u64;
            return Ok(run);
        }
        let locate = ReadBudget {
            records_max: 0,
            bytes_max: 0,
        };
        let (position, _) =
            self.read_range(&seg, from, (end, end_bytes), locate, &mut |_, _, _| {
                ControlFlow::Break(())
            })?;
        let available = end_bytes.saturating_sub(position);
        let corrupt = |at: u64, offset: u64, reason| StorageError::Corrupt {
            segment,
            position: at,
            offset,
            reason,
        };
        let io = |e| StorageError::io("read log", &seg.log_path, e);
        let want = (bytes_max.max(frame::FRAME_BYTES_MIN) as u64).min(available);
        let mut bytes = vec![0u8; want as usize];
        seg.log.read_exact_at(&mut bytes, position).map_err(io)?;
        // Cut at the last whole frame, checking each CRC: a shipped frame was
        // checked after it was read.
        let (mut at, mut offset) = (0usize, from);
        while offset < end {
            match frame::decode(&bytes[at..]) {
                Ok((view, len)) if view.offset == offset => {
                    at += len;
                    offset += 1;
                }
                Ok((view, _)) => {
                    let found = view.offset;
                    return Err(corrupt(
                        position + at as u64,
                        offset,
                        FrameError::OffsetMismatch {
                            found,
                            expected: offset,
                        },
                    ));
                }
                Err(FrameError::Incomplete { needed, .. }) if at == 0 => {
                    // One frame larger than `bytes_max`: a run holds at
                    // least one. `needed` passed the format's bound.
                    if needed > available {
                        return Err(corrupt(
                            position,
                            offset,
                            FrameError::Incomplete { needed, available },
                        ));
                    }
                    bytes.resize(needed as usize, 0);
                    seg.log.read_exact_at(&mut bytes, position).map_err(io)?;
                }
                Err(FrameError::Incomplete { .. }) => break,
                Err(reason) => return Err(corrupt(position + at as u64, offset, reason)),
            }
        }
        bytes.truncate(at);
        Ok(FrameRun {
            first: from,
            records: offset - from,
            bytes,
        })
    }

    fn set_committed(&self, segment: SegmentId, end: u64) -> Result<u64, StorageError> {
        let seg = self.segment(segment)?;
        let mut st = seg.state.lock();
        if let Some(seal) = st.sealed {
            return Ok(seal.length);
        }
        let committed = st.committed.map_or(end, |c| c.max(end));
        st.committed = Some(committed);
        Ok(committed)
    }

    fn truncate_tail(&self, segment: SegmentId, length: u64) -> Result<SegmentInfo, StorageError> {
        self.cut_torn_batch(segment, length)
    }

    fn seal(&self, segment: SegmentId, length: u64) -> Result<SealInfo, StorageError> {
        let seg = self.segment(segment)?;
        {
            let mut st = seg.state.lock();
            if let Some(existing) = st.sealed {
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
            // Fence first so that nothing new is appended while we wait.
            st.fenced = true;
        }
        self.drain(&seg);
        let (durable, durable_bytes) = {
            let st = seg.state.lock();
            (st.durable_offset, st.durable_bytes)
        };
        if length > durable {
            return Err(StorageError::SealBeyondEnd {
                segment,
                requested: length,
                stored: durable,
            });
        }
        let byte_size = if length == durable {
            durable_bytes
        } else {
            let locate = ReadBudget {
                records_max: 0,
                bytes_max: 0,
            };
            self.read_range(
                &seg,
                length,
                (durable, durable_bytes),
                locate,
                &mut |_, _, _| ControlFlow::Break(()),
            )?
            .0
        };
        let info = SealInfo { length, byte_size };
        trim_padding(&seg)?;
        marker::write_atomically(
            &self.shared.dir,
            &self.seal_path(segment),
            &marker::encode_seal(info),
        )?;
        {
            let mut st = seg.state.lock();
            st.sealed = Some(info);
            // A sealed copy takes no more flushes: its kept runs would hold
            // the store's budget for good (a follower still behind reads
            // the log).
            st.recent.clear();
            if st.committed.is_some() {
                st.committed = Some(length);
            }
        }
        debug!(segment = segment.0, length, byte_size, "sealed");
        Ok(info)
    }

    fn fence(&self, segment: SegmentId) -> Result<(), StorageError> {
        let seg = self.segment(segment)?;
        {
            let mut st = seg.state.lock();
            st.fenced = true;
            // Fenced: a seal follows, and no flush will keep more.
            st.recent.clear();
        }
        let path = self.fence_path(segment);
        marker::write_atomically(&self.shared.dir, &path, &[])?;
        debug!(segment = segment.0, "fenced");
        Ok(())
    }

    fn fence_order(
        &self,
        segment: SegmentId,
        order: OrderEpoch,
    ) -> Result<FenceInfo, StorageError> {
        let seg = self.segment(segment)?;
        // Orders of one copy are serialized by the marker lock, so two
        // racing orders cannot write their markers in the wrong order.
        let _ordering = seg.ordering.lock();
        let (seen, fenced) = {
            let st = seg.state.lock();
            (st.order, st.fenced)
        };
        if order.is_stale_against(seen) {
            return Err(StorageError::StaleOrder {
                segment,
                seen,
                order,
            });
        }
        if order != seen || !fenced {
            // Fence in memory first, so nothing new is queued while the
            // marker is written; the marker makes fence and epoch durable
            // before the answer.
            seg.state.lock().fenced = true;
            marker::write_atomically(
                &self.shared.dir,
                &self.fence_path(segment),
                &marker::encode_fence(order),
            )?;
            seg.state.lock().order = order;
            debug!(
                segment = segment.0,
                group = order.group,
                term = order.term,
                "fenced by order"
            );
        }
        // Whatever was queued before the fence becomes durable (or fails)
        // before the answer, never after it.
        self.drain(&seg);
        let st = seg.state.lock();
        Ok(FenceInfo {
            durable: st.durable_offset,
            durable_bytes: st.durable_bytes,
            sealed: st.sealed,
            order: st.order,
            failed: st.failed.is_some(),
        })
    }

    fn cut_to_seal(&self, segment: SegmentId) -> Result<u64, StorageError> {
        self.cut_past_seal(segment)
    }

    fn order_epoch(&self, segment: SegmentId) -> Result<OrderEpoch, StorageError> {
        Ok(self.segment(segment)?.state.lock().order)
    }

    fn verify(&self, segment: SegmentId) -> Result<VerifyReport, StorageError> {
        match self.segment(segment) {
            Ok(seg) => {
                let end = readable_end(&seg.state.lock()).1;
                self.verify_file(segment, &seg.log, end)
            }
            Err(_) => {
                let path = self.log_path(segment);
                let log = File::open(&path).map_err(|e| StorageError::io("open log", &path, e))?;
                let end = log
                    .metadata()
                    .map_err(|e| StorageError::io("stat log", &path, e))?
                    .len();
                self.verify_file(segment, &log, end)
            }
        }
    }

    fn info(&self, segment: SegmentId) -> Result<SegmentInfo, StorageError> {
        let seg = self.segment(segment)?;
        Ok(FileStore::info_of(&seg))
    }

    fn close(&self, segment: SegmentId) -> Result<(), StorageError> {
        let seg = self.segment(segment)?;
        self.drain(&seg);
        // Trimmed while still in the map: once removed, an `open` may build a
        // new copy on the same file, whose writes this trim must not cut.
        let trimmed = trim_padding(&seg);
        self.shared.segments.lock().remove(&segment);
        trimmed
    }

    fn copy_bytes(&self, segment: SegmentId) -> Result<Option<u64>, StorageError> {
        let path = self.log_path(segment);
        match std::fs::metadata(&path) {
            Ok(meta) => Ok(Some(meta.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StorageError::io("stat log", &path, e)),
        }
    }

    fn has_seal_marker(&self, segment: SegmentId) -> bool {
        self.seal_path(segment).exists()
    }

    fn seal_at_rest(&self, segment: SegmentId) -> Result<Option<SealInfo>, StorageError> {
        crate::marker::read_seal(&self.seal_path(segment))
    }

    fn read_sidecar(&self, segment: SegmentId) -> Result<Option<Vec<u8>>, StorageError> {
        let path = self.producers_path(segment);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StorageError::io("read sidecar", &path, e)),
        }
    }

    fn write_sidecar(&self, segment: SegmentId, bytes: &[u8]) -> Result<(), StorageError> {
        marker::write_atomically(&self.shared.dir, &self.producers_path(segment), bytes)
    }

    fn set_aside(&self, segment: SegmentId) -> Result<bool, StorageError> {
        FileStore::set_aside(self, segment)
    }

    fn is_aside(&self, segment: SegmentId) -> bool {
        FileStore::is_aside(self, segment)
    }

    fn discard_aside(&self, segment: SegmentId) -> Result<u64, StorageError> {
        FileStore::discard_aside(self, segment)
    }

    fn repair_index(&self, segment: SegmentId) -> Result<(), StorageError> {
        FileStore::repair_index(self, segment)
    }

    fn remove_copy(&self, segment: SegmentId) -> Result<Option<u64>, StorageError> {
        FileStore::remove_copy(self, segment)
    }

    fn local_copies(&self) -> Result<Vec<SegmentId>, StorageError> {
        FileStore::local_copies(self)
    }

    fn copy_modified(&self, segment: SegmentId) -> Option<std::time::SystemTime> {
        FileStore::copy_modified(self, segment)
    }
}
