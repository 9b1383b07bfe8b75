//! Framing, checksums and atomic replacement for the group's files.
//!
//! Every record on disk is a frame: a little-endian `u32` body length, a
//! little-endian `u32` CRC32 of the body, then the body. Small files (the vote,
//! the snapshot) are a magic tag and one frame, replaced atomically: written
//! to a temporary sibling, fsynced, renamed over the old file, and the
//! directory fsynced so the rename itself survives a crash.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Bytes of a frame header: length then checksum.
pub(crate) const FRAME_HEADER_BYTES: usize = 8;
/// Bytes of every file's leading magic tag.
pub(crate) const MAGIC_BYTES: usize = 8;

/// Appends one frame holding `body` to `out`.
pub(crate) fn encode_frame(body: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame body exceeds u32"))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    out.extend_from_slice(body);
    Ok(())
}

/// What the bytes at some offset hold.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FrameRead<'a> {
    /// A whole frame whose checksum matches; `next` is the offset after it.
    Whole { body: &'a [u8], next: usize },
    /// Fewer bytes remain than the header or the declared body needs: a
    /// write that a crash cut short.
    Short,
    /// The frame is whole but its checksum does not match its body.
    BadChecksum { next: usize },
    /// The declared length exceeds the limit.
    TooLong { len: u64 },
}

/// Reads the frame starting at `at` in `bytes`.
pub(crate) fn read_frame(bytes: &[u8], at: usize, body_bytes_max: u64) -> FrameRead<'_> {
    let Some(header) = bytes.get(at..at.saturating_add(FRAME_HEADER_BYTES)) else {
        return FrameRead::Short;
    };
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if u64::from(len) > body_bytes_max {
        return FrameRead::TooLong {
            len: u64::from(len),
        };
    }
    let start = at + FRAME_HEADER_BYTES;
    let next = start + len as usize;
    let Some(body) = bytes.get(start..next) else {
        return FrameRead::Short;
    };
    if crc32fast::hash(body) != crc {
        return FrameRead::BadChecksum { next };
    }
    FrameRead::Whole { body, next }
}

/// Fsyncs a directory so that renames and creations inside it are durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The temporary sibling a replacement is staged in.
pub(crate) fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Replaces `path` with `contents` so that a crash leaves either the old or
/// the new file, never a mix.
pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> io::Result<()> {
    let tmp = tmp_path(path);
    {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
        _ => sync_dir(Path::new(".")),
    }
}

/// A magic tag then one frame: the shape of the vote and snapshot files.
pub(crate) fn encode_tagged(magic: &[u8; MAGIC_BYTES], body: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(MAGIC_BYTES + FRAME_HEADER_BYTES + body.len());
    out.extend_from_slice(magic);
    encode_frame(body, &mut out)?;
    Ok(out)
}

/// Why a tagged file could not be read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TaggedError {
    #[error("unknown magic tag")]
    BadMagic,
    #[error("file is shorter than its frame")]
    Short,
    #[error("checksum mismatch")]
    BadChecksum,
    #[error("frame length {len} exceeds the limit")]
    TooLong { len: u64 },
    #[error("bytes after the frame")]
    TrailingBytes,
}

/// The body of a tagged file.
pub(crate) fn decode_tagged<'a>(
    magic: &[u8; MAGIC_BYTES],
    bytes: &'a [u8],
    body_bytes_max: u64,
) -> Result<&'a [u8], TaggedError> {
    if bytes.get(..MAGIC_BYTES) != Some(&magic[..]) {
        return Err(TaggedError::BadMagic);
    }
    match read_frame(bytes, MAGIC_BYTES, body_bytes_max) {
        FrameRead::Whole { body, next } if next == bytes.len() => Ok(body),
        FrameRead::Whole { .. } => Err(TaggedError::TrailingBytes),
        FrameRead::Short => Err(TaggedError::Short),
        FrameRead::BadChecksum { .. } => Err(TaggedError::BadChecksum),
        FrameRead::TooLong { len } => Err(TaggedError::TooLong { len }),
    }
}

/// Whether `err` says the volume has no room (a full disk or an exhausted
/// quota): the one storage failure a raft replica may recover from in
/// place, once space returns, since nothing it wrote was acknowledged.
pub(crate) fn is_no_space(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_reads_back_and_a_cut_or_flipped_one_does_not() {
        let mut out = Vec::new();
        encode_frame(b"hello", &mut out).unwrap();
        assert_eq!(
            read_frame(&out, 0, 1024),
            FrameRead::Whole {
                body: b"hello",
                next: out.len()
            }
        );
        assert_eq!(read_frame(&out[..out.len() - 1], 0, 1024), FrameRead::Short);
        assert_eq!(read_frame(&out[..3], 0, 1024), FrameRead::Short);
        let mut flipped = out.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        assert_eq!(
            read_frame(&flipped, 0, 1024),
            FrameRead::BadChecksum { next: out.len() }
        );
        assert_eq!(read_frame(&out, 0, 4), FrameRead::TooLong { len: 5 });
    }

    #[test]
    fn a_tagged_file_refuses_a_foreign_magic_and_trailing_bytes() {
        let bytes = encode_tagged(b"MALTEST1", b"body").unwrap();
        assert_eq!(decode_tagged(b"MALTEST1", &bytes, 64), Ok(&b"body"[..]));
        assert_eq!(
            decode_tagged(b"MALTEST2", &bytes, 64),
            Err(TaggedError::BadMagic)
        );
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(
            decode_tagged(b"MALTEST1", &longer, 64),
            Err(TaggedError::TrailingBytes)
        );
    }
}
