//! Reads of a copy's frames: located by the sparse index, checked frame
//! by frame, with a scan from byte zero when the index disagrees.

use super::*;

impl FileStore {
    /// Reads from the frame the index points at, falling back to a scan from
    /// byte zero when the hint disagrees with the log, so a wrong index never
    /// yields a wrong read. Hands each frame from `from` on to `visit` and
    /// returns the position of `from` and how many frames `visit` took.
    pub(super) fn read_range(
        &self,
        seg: &Segment,
        from: u64,
        end: (u64, u64),
        budget: ReadBudget,
        visit: &mut dyn FnMut(&FrameView<'_>, u64, usize) -> ControlFlow<()>,
    ) -> Result<(u64, usize), StorageError> {
        let hint = seg.index.lock().index.floor(from).unwrap_or(IndexEntry {
            offset: 0,
            position: 0,
        });
        let chunk = read_chunk(&self.shared.config, budget);
        let mut taken = 0usize;
        let first = read_from(seg, hint, from, end, budget, chunk, &mut |view, at, len| {
            let flow = visit(view, at, len);
            taken += usize::from(flow.is_continue());
            flow
        });
        let result = match first {
            // Damage after a frame was handed out is real: the scan had
            // already found a valid frame with the offset the hint claimed.
            Err(ReadAnomaly::Bad { .. }) if hint.position != 0 && taken == 0 => {
                debug!(
                    segment = seg.id.0,
                    from, "index hint disagreed with the log; rescanning"
                );
                let start = IndexEntry {
                    offset: 0,
                    position: 0,
                };
                read_from(seg, start, from, end, budget, chunk, visit)
            }
            other => other,
        };
        result.map_err(|anomaly| match anomaly {
            ReadAnomaly::Io(e) => StorageError::io("read log", &seg.log_path, e),
            ReadAnomaly::Bad {
                position,
                offset,
                error,
            } => StorageError::Corrupt {
                segment: seg.id,
                position,
                offset,
                reason: error,
            },
        })
    }

    pub(super) fn verify_file(
        &self,
        id: SegmentId,
        log: &File,
        end: u64,
    ) -> Result<VerifyReport, StorageError> {
        let cfg = &self.shared.config;
        let log_path = self.log_path(id);
        let report = scan::scan_log(log, end, cfg.index_interval_bytes, cfg.read_chunk_bytes)
            .map_err(|e| StorageError::io("scan log", &log_path, e))?;
        let idx_path = self.index_path(id);
        let sidecar = SparseIndex::load(&idx_path, cfg.index_interval_bytes, u64::MAX)
            .map_err(|e| StorageError::io("read index", &idx_path, e))?;
        let raw_len = std::fs::metadata(&idx_path).map(|m| m.len()).unwrap_or(0);
        let mut index_entries_bad = (raw_len / crate::index::INDEX_ENTRY_BYTES as u64)
            .saturating_sub(sidecar.as_ref().map_or(0, |s| s.entries().len() as u64));
        for entry in sidecar.iter().flat_map(|s| s.entries()) {
            if entry.position >= report.valid_bytes {
                continue;
            }
            let mut reader = FrameReader::new(
                log,
                entry.position,
                report.valid_bytes,
                frame::FRAME_BYTES_MIN,
            );
            let ok = matches!(reader.next_frame(), Ok(Next::Frame { view, .. }) if view.offset == entry.offset);
            if !ok {
                index_entries_bad += 1;
            }
        }
        Ok(VerifyReport {
            segment: id,
            records: report.records,
            valid_bytes: report.valid_bytes,
            scanned_bytes: report.scanned_bytes,
            first_bad: report.first_bad,
            valid_after: report.valid_after,
            later_flush: report.later_flush,
            index_entries_bad,
        })
    }
}

/// The chunk a read pulls from the log at a time. A locate (a zero budget:
/// only `from`'s position is wanted) walks at most one index interval of
/// frames to the one at `from`, so it reads that much, not a whole
/// `read_chunk_bytes`: the shipper locates before every run it reads, and
/// a 256 KiB chunk per locate was read (and zeroed) for the few KiB used.
fn read_chunk(config: &StoreConfig, budget: ReadBudget) -> usize {
    if budget.records_max == 0 {
        let interval = usize::try_from(config.index_interval_bytes).unwrap_or(usize::MAX);
        interval
            .saturating_add(LOCATE_SLACK_BYTES)
            .min(config.read_chunk_bytes)
    } else {
        config.read_chunk_bytes
    }
}

/// What a locate reads past one index interval: the frame at `from`'s
/// header and a small record or two (a larger frame grows the read).
const LOCATE_SLACK_BYTES: usize = 4 << 10;

/// Scans from `hint`, checking that every frame carries the next offset, and
/// hands the frames from `from` on to `visit` within the budget, until it
/// breaks. Returns the position of `from` and how many frames were taken.
pub(super) fn read_from(
    seg: &Segment,
    hint: IndexEntry,
    from: u64,
    (end_offset, end_bytes): (u64, u64),
    budget: ReadBudget,
    chunk: usize,
    visit: &mut dyn FnMut(&FrameView<'_>, u64, usize) -> ControlFlow<()>,
) -> Result<(u64, usize), ReadAnomaly> {
    debug_assert!(hint.offset <= from && from < end_offset);
    let mut reader = FrameReader::new(&seg.log, hint.position, end_bytes, chunk);
    let mut expected = hint.offset;
    let mut taken = 0usize;
    let mut bytes = 0usize;
    let mut from_position = None;
    let locate = budget.records_max == 0;
    while expected < end_offset && (locate || taken < budget.records_max) {
        match reader.next_frame()? {
            Next::End => {
                return Err(ReadAnomaly::Bad {
                    position: reader.position(),
                    offset: expected,
                    error: FrameError::Incomplete {
                        needed: 1,
                        available: 0,
                    },
                });
            }
            Next::Bad { position, error } => {
                return Err(ReadAnomaly::Bad {
                    position,
                    offset: expected,
                    error,
                });
            }
            Next::Frame {
                position,
                len,
                view,
            } => {
                if view.offset != expected {
                    return Err(ReadAnomaly::Bad {
                        position,
                        offset: expected,
                        error: FrameError::OffsetMismatch {
                            found: view.offset,
                            expected,
                        },
                    });
                }
                if expected >= from {
                    from_position.get_or_insert(position);
                    if locate || (taken > 0 && bytes + len > budget.bytes_max) {
                        break;
                    }
                    if visit(&view, position, len).is_break() {
                        break;
                    }
                    bytes += len;
                    taken += 1;
                }
                expected += 1;
            }
        }
    }
    let position = from_position.unwrap_or(reader.position());
    Ok((position, taken))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locate_reads_about_one_index_interval_and_a_read_a_whole_chunk() {
        let config = StoreConfig::default();
        let locate = ReadBudget {
            records_max: 0,
            bytes_max: 0,
        };
        let read = ReadBudget {
            records_max: 10,
            bytes_max: 1 << 20,
        };
        assert_eq!(
            read_chunk(&config, locate),
            config.index_interval_bytes as usize + LOCATE_SLACK_BYTES
        );
        assert_eq!(read_chunk(&config, read), config.read_chunk_bytes);
        let small = StoreConfig {
            read_chunk_bytes: 1024,
            ..StoreConfig::default()
        };
        assert_eq!(read_chunk(&small, locate), 1024, "never above the chunk");
    }
}
