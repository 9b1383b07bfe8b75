//! Direct I/O writes: whole aligned blocks with `O_DIRECT`, the partial
//! last block padded with zeros.
//!
//! Why: on the machines we measured, the kernel's copy of written bytes into
//! the page cache (`copy_folio_from_iter_atomic`) was most of the CPU of a
//! durable append, and `O_DIRECT` writes of the same sizes moved 2 to 5 times
//! the bytes per second (ADR 0012). A flush copies its frames once, in user
//! space, into a reused aligned buffer behind the bytes of the file's partial
//! last block (kept in memory), pads the buffer with zeros to a whole block,
//! and writes it with one `O_DIRECT` write.
//!
//! Padding, not a page-cache write of the partial block (ADR 0013): a
//! buffered tail costs the `fdatasync` a second device round trip (its own
//! writeback) and the next direct write an invalidation of that page, which
//! cost 10 to 15% of the bandwidth of 100 KiB flushes on this disk. The log
//! file may therefore end in under one block of zeros past its last frame.
//! The store knows the true end (`written_bytes`); recovery drops such
//! padding silently (zeros are never a frame: the magic is not zero), and
//! seal, close and shutdown trim it, so a file at rest is exact.
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
    /// Clears the buffer and makes room for `capacity` bytes, and for the
    /// padding to the block after them.
    pub(crate) fn reset(&mut self, capacity: usize) {
        self.len = 0;
        let needed = capacity.next_multiple_of(BLOCK_BYTES) + BLOCK_BYTES;
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

    /// Zero-fills to the next block boundary; returns how many bytes of
    /// padding that added.
    pub(crate) fn pad_to_block(&mut self) -> usize {
        let padded = self.len.next_multiple_of(BLOCK_BYTES);
        let at = self.start + self.len;
        let pad = padded - self.len;
        assert!(at + pad <= self.raw.len(), "no room reserved for padding");
        self.raw[at..at + pad].fill(0);
        self.len = padded;
        pad
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

/// Writes `buf` (the file's bytes from `base` on; `base` block-aligned)
/// with `O_DIRECT`, padded with zeros to a whole block, and returns the
/// bytes of the new partial last block (before the padding).
pub(crate) fn write_padded(direct: &File, buf: &mut AlignedBuf, base: u64) -> io::Result<Vec<u8>> {
    assert_eq!(base % BLOCK_BYTES as u64, 0, "direct write off a block");
    let end = buf.as_slice().len();
    let tail = buf.as_slice()[end / BLOCK_BYTES * BLOCK_BYTES..].to_vec();
    buf.pad_to_block();
    direct.write_all_at(buf.as_slice(), base)?;
    Ok(tail)
}

/// Whether `bytes`, found past the last valid frame at the end of a log,
/// are a direct write's padding: fewer than a block, all zero, ending the
/// file on a block boundary.
pub(crate) fn is_padding(bytes: &[u8], file_len: u64) -> bool {
    bytes.len() < BLOCK_BYTES
        && file_len.is_multiple_of(BLOCK_BYTES as u64)
        && bytes.iter().all(|&b| b == 0)
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
    fn padding_fills_to_the_next_block_with_zeros_over_old_contents() {
        let mut buf = AlignedBuf::default();
        buf.reset(5000);
        buf.extend_from_slice(&[9u8; 5000]);
        assert_eq!(buf.pad_to_block(), 2 * BLOCK_BYTES - 5000);
        assert_eq!(buf.as_slice().len(), 2 * BLOCK_BYTES);
        // A reused buffer still holds the old bytes past its length.
        buf.reset(10);
        buf.extend_from_slice(&[1u8; 10]);
        assert_eq!(buf.pad_to_block(), BLOCK_BYTES - 10);
        assert!(buf.as_slice()[10..].iter().all(|&b| b == 0));
        // A whole block needs no padding.
        buf.reset(BLOCK_BYTES);
        buf.extend_from_slice(&[1u8; BLOCK_BYTES]);
        assert_eq!(buf.pad_to_block(), 0);
    }

    #[test]
    fn only_zeros_short_of_a_block_at_a_block_aligned_end_are_padding() {
        assert!(is_padding(&[0; 100], 8192));
        assert!(is_padding(&[], 8192));
        assert!(!is_padding(&[0; 100], 8000), "the file must end on a block");
        assert!(
            !is_padding(&[0; BLOCK_BYTES], 8192),
            "padding is under a block"
        );
        assert!(!is_padding(&[0, 0, 1], 8192), "padding is all zeros");
    }

    #[test]
    fn a_padded_write_leaves_a_whole_block_file_and_returns_the_partial_block() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        // Buffered here: the padding logic is the same, and /tmp may be tmpfs.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut buf = AlignedBuf::default();
        buf.reset(5000);
        buf.extend_from_slice(&[7u8; 5000]);
        let tail = write_padded(&file, &mut buf, 0).unwrap();
        assert_eq!(tail, vec![7u8; 5000 - BLOCK_BYTES]);
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(on_disk.len(), 2 * BLOCK_BYTES);
        assert!(on_disk[..5000].iter().all(|&b| b == 7));
        assert!(is_padding(&on_disk[5000..], on_disk.len() as u64));
    }

    #[test]
    #[should_panic(expected = "aligned buffer overflow")]
    fn writing_past_the_reserved_size_is_refused() {
        let mut buf = AlignedBuf::default();
        buf.reset(10);
        buf.extend_from_slice(&[0; BLOCK_BYTES * 3]);
    }
}
