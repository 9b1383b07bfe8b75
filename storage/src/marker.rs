//! Seal and fence markers, written atomically next to the log.
//!
//! `<id>.seal` is 32 bytes: magic "MLS1", version u32 (1), length u64
//! (records), byte_size u64, crc32 u32 of bytes 0..24, reserved u32 (zero).
//! `<id>.fence`'s existence is the fence. Written by a plain `fence` it is
//! empty; written by a coordinator's fence order (ADR 0106) it is 32 bytes
//! that remember the order's epoch across restarts: magic "MLF1", version
//! u32 (1), group u64, term u64, crc32 u32 of bytes 0..24, reserved u32
//! (zero). An empty marker reads as the default epoch.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::StorageError;
use crate::store::{OrderEpoch, SealInfo};

const SEAL_MAGIC: [u8; 4] = *b"MLS1";
const SEAL_VERSION: u32 = 1;
pub const SEAL_MARKER_BYTES: usize = 32;

const FENCE_MAGIC: [u8; 4] = *b"MLF1";
const FENCE_VERSION: u32 = 1;
pub const FENCE_MARKER_BYTES: usize = 32;

/// The fence marker's bytes for an order of epoch `order`.
pub fn encode_fence(order: OrderEpoch) -> [u8; FENCE_MARKER_BYTES] {
    let mut out = [0u8; FENCE_MARKER_BYTES];
    out[0..4].copy_from_slice(&FENCE_MAGIC);
    out[4..8].copy_from_slice(&FENCE_VERSION.to_le_bytes());
    out[8..16].copy_from_slice(&order.group.to_le_bytes());
    out[16..24].copy_from_slice(&order.term.to_le_bytes());
    let crc = crc32fast::hash(&out[0..24]);
    out[24..28].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes a fence marker's bytes (untrusted: read from disk). An empty
/// marker (a plain fence, or one written before orders had epochs) is the
/// default epoch.
pub fn decode_fence(bytes: &[u8]) -> Result<OrderEpoch, &'static str> {
    if bytes.is_empty() {
        return Ok(OrderEpoch::default());
    }
    if bytes.len() != FENCE_MARKER_BYTES {
        return Err("wrong size");
    }
    if bytes[0..4] != FENCE_MAGIC {
        return Err("bad magic");
    }
    let word = |at: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(a)
    };
    let version = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if version != FENCE_VERSION {
        return Err("unknown version");
    }
    let crc = u32::from_le_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]);
    if crc != crc32fast::hash(&bytes[0..24]) {
        return Err("checksum mismatch");
    }
    if bytes[28..32] != [0; 4] {
        return Err("reserved bytes not zero");
    }
    Ok(OrderEpoch {
        group: word(8),
        term: word(16),
    })
}

/// The order epoch a fence marker at `path` holds: `None` without a marker.
pub(crate) fn read_fence(path: &Path) -> Result<Option<OrderEpoch>, StorageError> {
    match fs::read(path) {
        Ok(bytes) => decode_fence(&bytes)
            .map(Some)
            .map_err(|reason| StorageError::BadMarker {
                path: path.to_owned(),
                reason,
            }),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StorageError::io("read fence marker", path, e)),
    }
}

/// The seal marker's bytes for `info`.
pub fn encode_seal(info: SealInfo) -> [u8; SEAL_MARKER_BYTES] {
    let mut out = [0u8; SEAL_MARKER_BYTES];
    out[0..4].copy_from_slice(&SEAL_MAGIC);
    out[4..8].copy_from_slice(&SEAL_VERSION.to_le_bytes());
    out[8..16].copy_from_slice(&info.length.to_le_bytes());
    out[16..24].copy_from_slice(&info.byte_size.to_le_bytes());
    let crc = crc32fast::hash(&out[0..24]);
    out[24..28].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes a seal marker's bytes (untrusted: read from disk).
pub fn decode_seal(bytes: &[u8]) -> Result<SealInfo, &'static str> {
    if bytes.len() != SEAL_MARKER_BYTES {
        return Err("wrong size");
    }
    if bytes[0..4] != SEAL_MAGIC {
        return Err("bad magic");
    }
    let word = |at: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(a)
    };
    let version = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if version != SEAL_VERSION {
        return Err("unknown version");
    }
    let crc = u32::from_le_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]);
    if crc != crc32fast::hash(&bytes[0..24]) {
        return Err("checksum mismatch");
    }
    // The CRC does not cover the reserved word: a marker with anything but
    // zeros there was not written by this module (found by fuzzing).
    if bytes[28..32] != [0; 4] {
        return Err("reserved bytes not zero");
    }
    Ok(SealInfo {
        length: word(8),
        byte_size: word(16),
    })
}

pub(crate) fn read_seal(path: &Path) -> Result<Option<SealInfo>, StorageError> {
    match fs::read(path) {
        Ok(bytes) => decode_seal(&bytes)
            .map(Some)
            .map_err(|reason| StorageError::BadMarker {
                path: path.to_owned(),
                reason,
            }),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StorageError::io("read seal marker", path, e)),
    }
}

/// Tells apart the temporary files of writes that run at once.
static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// The temporary file one write of `path` goes through: its own, never
/// shared with another write. Regression: it was `<stem>.tmp`, one file for
/// a segment's seal, fence and producer markers alike, so a fence written
/// while a seal was renamed its empty file over `.seal` (a marker of the
/// wrong size, a copy that no longer opened after a restart).
fn tmp_path(path: &Path) -> std::path::PathBuf {
    let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{seq}.tmp"));
    path.with_file_name(name)
}

/// Writes `<tmp>`, fsyncs it, renames it over `path` and fsyncs the directory,
/// so a crash leaves either no marker or the whole marker. Writes that run
/// at once, of one marker or of several, each go through a file of their
/// own: the marker is always one write's whole bytes.
pub fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let tmp = tmp_path(path);
    let write = || -> std::io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    };
    write().map_err(|e| StorageError::io("write marker", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_marker_round_trips_and_an_empty_one_is_the_default_epoch() {
        let order = OrderEpoch { group: 7, term: 42 };
        assert_eq!(decode_fence(&encode_fence(order)).unwrap(), order);
        assert_eq!(decode_fence(&[]).unwrap(), OrderEpoch::default());
        let mut bytes = encode_fence(order);
        bytes[17] ^= 1;
        assert_eq!(decode_fence(&bytes), Err("checksum mismatch"));
        assert_eq!(decode_fence(&bytes[..5]), Err("wrong size"));
    }

    #[test]
    fn fence_marker_bytes_are_stable() {
        let bytes = encode_fence(OrderEpoch { group: 3, term: 9 });
        insta::assert_snapshot!(hex(&bytes));
    }

    /// Regression (CI, cursor_key): a seal and a fence of one segment
    /// written at once shared `<stem>.tmp`, and the seal marker was left
    /// empty. Written at once from several threads, every marker read is
    /// always one write's whole bytes.
    #[test]
    fn markers_of_one_segment_written_at_once_are_always_whole() {
        let dir = tempfile::tempdir().unwrap();
        let seal = dir.path().join("0001.seal");
        let fence = dir.path().join("0001.fence");
        let info = SealInfo {
            length: 7,
            byte_size: 99,
        };
        write_atomically(dir.path(), &seal, &encode_seal(info)).unwrap();
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    for _ in 0..200 {
                        write_atomically(dir.path(), &seal, &encode_seal(info)).unwrap();
                    }
                });
                scope.spawn(|| {
                    for term in 0..200 {
                        let order = OrderEpoch { group: 1, term };
                        write_atomically(dir.path(), &fence, &encode_fence(order)).unwrap();
                    }
                });
            }
            scope.spawn(|| {
                for _ in 0..400 {
                    assert_eq!(read_seal(&seal).unwrap(), Some(info));
                }
            });
        });
        let left: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "no temporary file is left: {left:?}");
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn seal_marker_round_trips() {
        let info = SealInfo {
            length: 42,
            byte_size: 4242,
        };
        assert_eq!(decode_seal(&encode_seal(info)).unwrap(), info);
    }

    #[test]
    fn damaged_seal_marker_is_refused() {
        let mut bytes = encode_seal(SealInfo {
            length: 1,
            byte_size: 60,
        });
        bytes[9] ^= 1;
        assert_eq!(decode_seal(&bytes), Err("checksum mismatch"));
        assert_eq!(decode_seal(&bytes[..10]), Err("wrong size"));
    }

    #[test]
    fn a_seal_marker_with_nonzero_reserved_bytes_is_refused() {
        // The fuzzer's input (storage_seal): a valid CRC over bytes 0..24
        // and "rrrr" in the reserved word, which decoded before.
        let bytes = *b"MLS1\x01\0\0\0rrrrrrrrrrrrrr\x0ar\x0a*\xf2!rrrr";
        assert_eq!(decode_seal(&bytes), Err("reserved bytes not zero"));
        let mut zeroed = bytes;
        zeroed[28..].fill(0);
        assert_eq!(encode_seal(decode_seal(&zeroed).unwrap()), zeroed);
    }
}
