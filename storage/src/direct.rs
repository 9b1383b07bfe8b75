//! Direct I/O writes: whole aligned blocks with `O_DIRECT`, the partial
//! last block through the page cache.
//!
//! Why: on the machines we measured, the kernel's copy of written bytes into
//! the page cache (`copy_folio_from_iter_atomic`) was most of the CPU of a
//! durable append, and `O_DIRECT` writes of the same sizes moved 2 to 5 times
//! the bytes per second (ADR 0012). A flush copies its frames once, in user
//! space, into a reused aligned buffer behind the bytes of the file's partial
//! last block (kept in memory), writes every whole block of that buffer with
//! `O_DIRECT`, and writes the remainder (under one block) with an ordinary
//! `pwrite`, so the file's length is always the exact end of the last frame
//! and recovery never sees padding. The following `fdatasync` covers both.
//!
//! Rewriting the head of the partial block rewrites bytes that are already
//! durable with the same bytes, so a torn write of that block cannot change
//! them.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The alignment of `O_DIRECT` offsets, lengths and buffers. 4 KiB covers
/// every logical block size in use (512 B and 4 KiB).
pub(crate) const BLOCK_BYTES: usize = 4096;

/// Buffers kept for reuse above this capacity are dropped after a flush:
/// the pool must not pin the memory of one outsized flush for ever.
pub(crate) const POOLED_BUFFER_BYTES_MAX: usize = 8 << 20;

/// How many aligned buffers the pool keeps (with the size cap above, the
/// pool holds at most 128 MiB).
pub(crate) const POOLED_BUFFERS_MAX: usize = 16;

/// A growable byte buffer whose contents start at a `BLOCK_BYTES`-aligned
/// address, built on a plain `Vec` (over-allocated by one block) so no
/// unsafe code is needed.
#[derive(Debug, Default)]
pub(crate) struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// Clears the buffer and makes room for `capacity` bytes.
    pub(crate) fn reset(&mut self, capacity: usize) {
        self.len = 0;
        let needed = capacity + BLOCK_BYTES;
        if self.raw.len() < needed {
            // Zero-filled once per growth; the pool reuses it afterwards.
            self.raw = vec![0u8; needed.next_multiple_of(BLOCK_BYTES)];
        }
        self.start = self.raw.as_ptr().align_offset(BLOCK_BYTES);
        assert!(self.start < BLOCK_BYTES, "cannot align a heap buffer");
    }

    pub(crate) fn capacity(&self) -> usize {
        self.raw.len().saturating_sub(BLOCK_BYTES)
    }

    pub(crate) fn extend_from_slice(&mut self, bytes: &[u8]) {
        let at = self.start + self.len;
        assert!(
            at + bytes.len() <= self.raw.len(),
            "aligned buffer overflow: reset with the flush's size first"
        );
        self.raw[at..at + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

/// Writes `buf` (the file's bytes from `base` on; `base` block-aligned) with
/// its whole blocks through `direct` and the rest through `buffered`, and
/// returns the bytes of the new partial last block.
pub(crate) fn write_blocks(
    direct: &File,
    buffered: &File,
    buf: &AlignedBuf,
    base: u64,
) -> io::Result<Vec<u8>> {
    assert_eq!(base % BLOCK_BYTES as u64, 0, "direct write off a block");
    let bytes = buf.as_slice();
    let whole = bytes.len() / BLOCK_BYTES * BLOCK_BYTES;
    if whole > 0 {
        direct.write_all_at(&bytes[..whole], base)?;
    }
    let rest = &bytes[whole..];
    if !rest.is_empty() {
        buffered.write_all_at(rest, base + whole as u64)?;
    }
    Ok(rest.to_vec())
}

/// The bytes of the partial block that ends at `end`, given `head` (the
/// partial block's bytes before this write, starting on a block) followed
/// by `parts`, which together end at `end`.
pub(crate) fn tail_of(head: &[u8], parts: &[&[u8]], end: u64) -> Vec<u8> {
    let want = (end % BLOCK_BYTES as u64) as usize;
    let mut tail = vec![0u8; want];
    let mut missing = want;
    for part in parts.iter().rev().chain(std::iter::once(&head)) {
        if missing == 0 {
            break;
        }
        let take = missing.min(part.len());
        tail[missing - take..missing].copy_from_slice(&part[part.len() - take..]);
        missing -= take;
    }
    assert_eq!(
        missing, 0,
        "a partial block longer than the bytes before it"
    );
    tail
}

/// Whether an open with `O_DIRECT` failed because the file system does not
/// support it (tmpfs, some FUSE and network file systems), as opposed to a
/// real error.
pub(crate) fn unsupported(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aligned_buffer_starts_on_a_block_and_keeps_what_was_written() {
        let mut buf = AlignedBuf::default();
        buf.reset(10_000);
        assert!(buf.capacity() >= 10_000);
        buf.extend_from_slice(&[1, 2, 3]);
        buf.extend_from_slice(&[4; 5000]);
        assert_eq!(buf.as_slice().as_ptr().align_offset(BLOCK_BYTES), 0);
        assert_eq!(buf.as_slice().len(), 5003);
        assert_eq!(&buf.as_slice()[..4], &[1, 2, 3, 4]);
        // Reuse keeps alignment and forgets the old contents.
        buf.reset(100);
        assert!(buf.as_slice().is_empty());
        assert_eq!(buf.as_slice().as_ptr().align_offset(BLOCK_BYTES), 0);
    }

    #[test]
    fn the_partial_block_is_taken_from_the_end_across_parts() {
        let head = vec![1u8; 100];
        let a = vec![2u8; 3000];
        let b = vec![3u8; 1500];
        // head starts on a block: 100 + 3000 + 1500 = 4600 bytes, end 4600.
        let tail = tail_of(&head, &[&a, &b], 4600);
        assert_eq!(tail, vec![3u8; 504]);
        // Within the first block: everything since the block start.
        let tail = tail_of(&head, &[&a[..200]], 300);
        assert_eq!(tail.len(), 300);
        assert_eq!(&tail[..100], &head[..]);
        assert_eq!(&tail[100..], &a[..200]);
        // Ending on a block leaves no partial block.
        assert!(tail_of(&head, &[&a, &b[..996]], 4096).is_empty());
    }

    #[test]
    #[should_panic(expected = "aligned buffer overflow")]
    fn writing_past_the_reserved_size_is_refused() {
        let mut buf = AlignedBuf::default();
        buf.reset(10);
        buf.extend_from_slice(&[0; BLOCK_BYTES * 3]);
    }
}
