//! Sequential frame scanning over a log file, shared by recovery, verify and
//! reads, plus the resynchronisation search that tells a torn tail from
//! damage in the middle.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use crate::frame::{self, FRAME_BYTES_MIN, FRAME_HEADER_BYTES, FRAME_MAGIC, FrameError, FrameView};
use crate::index::SparseIndex;

/// What the reader found at its position.
#[derive(Debug)]
pub(crate) enum Next<'a> {
    Frame {
        position: u64,
        len: usize,
        view: FrameView<'a>,
    },
    End,
    Bad {
        position: u64,
        error: FrameError,
    },
}

/// A buffered, positioned frame reader over `[start, end)` of a file.
///
/// It reads with `pread`, so several readers and one writer can share a file.
/// Its buffer grows only to the length of a frame whose header passed the
/// format bounds and whose bytes lie inside `end`.
#[derive(Debug)]
pub(crate) struct FrameReader<'f> {
    file: &'f File,
    end: u64,
    buf: Vec<u8>,
    /// File position of `buf[0]`.
    buf_pos: u64,
    start: usize,
    filled: usize,
    chunk_bytes: usize,
}

impl<'f> FrameReader<'f> {
    pub(crate) fn new(file: &'f File, start: u64, end: u64, chunk_bytes: usize) -> Self {
        FrameReader {
            file,
            end,
            buf: Vec::new(),
            buf_pos: start,
            start: 0,
            filled: 0,
            chunk_bytes: chunk_bytes.max(FRAME_BYTES_MIN),
        }
    }

    pub(crate) fn position(&self) -> u64 {
        self.buf_pos + self.start as u64
    }

    pub(crate) fn next_frame(&mut self) -> io::Result<Next<'_>> {
        let position = self.position();
        if position >= self.end {
            return Ok(Next::End);
        }
        let available = self.end - position;
        let header_bytes = available.min(FRAME_HEADER_BYTES as u64) as usize;
        if !self.fill(header_bytes)? {
            return Ok(self.short(position, FRAME_HEADER_BYTES as u64));
        }
        let total = match frame::peek_len(&self.buf[self.start..self.filled]) {
            Ok(total) => total,
            Err(error) => return Ok(Next::Bad { position, error }),
        };
        if total as u64 > available {
            return Ok(Next::Bad {
                position,
                error: FrameError::Incomplete {
                    needed: total as u64,
                    available,
                },
            });
        }
        if !self.fill(total)? {
            return Ok(self.short(position, total as u64));
        }
        // The frame is consumed before it is decoded so that the returned view
        // can borrow the buffer; after `Bad` a reader is not used again.
        let start = self.start;
        self.start += total;
        match frame::decode(&self.buf[start..start + total]) {
            Ok((view, len)) => {
                debug_assert_eq!(len, total);
                Ok(Next::Frame {
                    position,
                    len: total,
                    view,
                })
            }
            Err(error) => Ok(Next::Bad { position, error }),
        }
    }

    fn short(&self, position: u64, needed: u64) -> Next<'static> {
        Next::Bad {
            position,
            error: FrameError::Incomplete {
                needed,
                available: (self.filled - self.start) as u64,
            },
        }
    }

    /// Ensures `n` bytes from the current position are buffered. Returns
    /// false if the file ended first (it is shorter than `end` claimed).
    fn fill(&mut self, n: usize) -> io::Result<bool> {
        if self.filled - self.start >= n {
            return Ok(true);
        }
        if self.buf.len() - self.start < n {
            self.buf.copy_within(self.start..self.filled, 0);
            self.buf_pos += self.start as u64;
            self.filled -= self.start;
            self.start = 0;
            // No bigger than what is left before `end`: a read near the
            // end of the log does not zero a whole chunk it cannot fill.
            let left = usize::try_from(self.end.saturating_sub(self.buf_pos)).unwrap_or(usize::MAX);
            let want = n.max(self.chunk_bytes.min(left));
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
        }
        while self.filled - self.start < n {
            let file_pos = self.buf_pos + self.filled as u64;
            let room = (self.buf.len() - self.filled) as u64;
            let limit = room.min(self.end.saturating_sub(file_pos)) as usize;
            if limit == 0 {
                return Ok(false);
            }
            let read = self
                .file
                .read_at(&mut self.buf[self.filled..self.filled + limit], file_pos)?;
            if read == 0 {
                return Ok(false);
            }
            self.filled += read;
        }
        Ok(true)
    }
}

/// The first bad frame of a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadFrame {
    /// Byte position where the bad frame starts.
    pub position: u64,
    /// The offset a valid frame at that position would carry.
    pub offset: u64,
    pub error: FrameError,
}

/// A valid frame found after a bad one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaterFrame {
    pub position: u64,
    pub offset: u64,
    pub durable_below: u64,
}

/// The result of scanning a log from byte zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanReport {
    /// Records in the valid prefix (offsets 0..records).
    pub records: u64,
    /// Bytes in the valid prefix.
    pub valid_bytes: u64,
    /// Bytes scanned (the file length, or the limit given).
    pub scanned_bytes: u64,
    pub first_bad: Option<BadFrame>,
    /// The first valid frame after the bad one, if any.
    pub valid_after: Option<LaterFrame>,
    /// A valid frame after the bad one, written when the bad frame's record
    /// was already durable (its `durable_below` is above that offset): this
    /// is damage, not a torn tail.
    pub later_flush: Option<LaterFrame>,
    pub index: SparseIndex,
}

impl ScanReport {
    /// True when the log is clean or only its unsynced last flush is torn.
    pub fn is_torn_tail_or_clean(&self) -> bool {
        self.later_flush.is_none()
    }
}

/// Scans `[0, end)` of a log, checking every frame and that offsets count up
/// from zero, and builds the sparse index of the valid prefix.
pub(crate) fn scan_log(
    file: &File,
    end: u64,
    index_interval_bytes: u64,
    chunk_bytes: usize,
) -> io::Result<ScanReport> {
    let mut reader = FrameReader::new(file, 0, end, chunk_bytes);
    let mut index = SparseIndex::new(index_interval_bytes);
    let mut expected = 0u64;
    let first_bad = loop {
        match reader.next_frame()? {
            Next::End => break None,
            Next::Bad { position, error } => {
                break Some(BadFrame {
                    position,
                    offset: expected,
                    error,
                });
            }
            Next::Frame { position, view, .. } => {
                if view.offset != expected {
                    break Some(BadFrame {
                        position,
                        offset: expected,
                        error: FrameError::OffsetMismatch {
                            found: view.offset,
                            expected,
                        },
                    });
                }
                index.observe(expected, position);
                expected += 1;
            }
        }
    };
    let valid_bytes = first_bad.map_or(end.min(reader.position()), |b| b.position);
    let (valid_after, later_flush) = match first_bad {
        None => (None, None),
        Some(bad) => find_valid_after(file, bad, end, chunk_bytes)?,
    };
    Ok(ScanReport {
        records: expected,
        valid_bytes,
        scanned_bytes: end,
        first_bad,
        valid_after,
        later_flush,
        index,
    })
}

/// Searches `(bad.position, end)` for valid frames that could belong to this
/// log after the bad frame: magic, bounds and CRC hold, and the offset is one
/// the bytes in between could have carried. Returns the first such frame and
/// the first one written by a later flush.
/// The offset of the last frame of the valid run that starts at `start`
/// (a frame boundary, such as a [`LaterFrame`]'s position), read up to
/// `end`: the run stops at the first frame that does not decode.
pub(crate) fn last_offset_from(
    file: &File,
    start: u64,
    end: u64,
    chunk_bytes: usize,
) -> io::Result<Option<u64>> {
    let mut reader = FrameReader::new(file, start, end, chunk_bytes);
    let mut last = None;
    while let Next::Frame { view, .. } = reader.next_frame()? {
        last = Some(view.offset);
    }
    Ok(last)
}

pub(crate) fn find_valid_after(
    file: &File,
    bad: BadFrame,
    end: u64,
    chunk_bytes: usize,
) -> io::Result<(Option<LaterFrame>, Option<LaterFrame>)> {
    let chunk_bytes = chunk_bytes.max(FRAME_BYTES_MIN);
    let mut first = None;
    let mut chunk = vec![0u8; chunk_bytes];
    let mut pos = bad.position + 1;
    while pos + FRAME_BYTES_MIN as u64 <= end {
        let len = (chunk_bytes as u64).min(end - pos) as usize;
        let read = file.read_at(&mut chunk[..len], pos)?;
        if read < FRAME_MAGIC.len() {
            break;
        }
        let mut next_pos = pos + (read - (FRAME_MAGIC.len() - 1)) as u64;
        let mut i = 0;
        while i + FRAME_MAGIC.len() <= read {
            if chunk[i..i + FRAME_MAGIC.len()] != FRAME_MAGIC {
                i += 1;
                continue;
            }
            let candidate = pos + i as u64;
            let mut reader = FrameReader::new(file, candidate, end, FRAME_BYTES_MIN);
            if let Next::Frame { len, view, .. } = reader.next_frame()? {
                let frames_between = (candidate - bad.position) / FRAME_BYTES_MIN as u64;
                if view.offset >= bad.offset && view.offset <= bad.offset + frames_between {
                    let later = LaterFrame {
                        position: candidate,
                        offset: view.offset,
                        durable_below: view.durable_below,
                    };
                    first.get_or_insert(later);
                    if view.durable_below > bad.offset {
                        return Ok((first, Some(later)));
                    }
                    // Written while the bad record was not yet durable (its
                    // own flush or a pipelined one): skip past this one and
                    // keep looking for a frame written after it was durable.
                    next_pos = candidate + len as u64;
                    break;
                }
            }
            i += 1;
        }
        pos = next_pos;
    }
    Ok((first, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;

    /// A read near the end of the log zeroes no more than what is left:
    /// the shipper locates at the tail before every run it reads.
    #[test]
    fn a_reader_near_the_end_does_not_grow_its_buffer_to_a_whole_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut bytes = Vec::new();
        for offset in 0..3 {
            let record = Record {
                timestamp_ms: 1,
                key: b"k".to_vec(),
                value: vec![7; 100],
                headers: Vec::new(),
            };
            frame::encode(&mut bytes, offset, 0, &record);
        }
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        let end = bytes.len() as u64;
        let mut reader = FrameReader::new(&file, 0, end, 256 << 10);
        let mut frames = 0;
        while let Next::Frame { .. } = reader.next_frame().unwrap() {
            frames += 1;
        }
        assert_eq!(frames, 3);
        assert!(
            reader.buf.len() <= bytes.len().max(FRAME_BYTES_MIN),
            "buffer {} for a {}-byte log",
            reader.buf.len(),
            bytes.len()
        );
    }
}
