//! The format freeze: the exact bytes of every file `malachi-storage` writes
//! (docs/storage-format.md), for small fixed inputs. A changed snapshot is a
//! change of the on-disk format: files written before it may no longer open.
//! It needs a new magic or version and an update of docs/storage-format.md in
//! the same commit, never a blind `INSTA_UPDATE`.
//!
//! Each test also decodes the frozen bytes back (with the crate's decoders, or
//! by reopening the store over them), so a decoder change is caught as well.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use malachi_storage::frame::{self, FRAME_BYTES_MIN};
use malachi_storage::index::{IndexEntry, SparseIndex};
use malachi_storage::{
    FileStore, Record, SealInfo, SegmentId, SegmentStore, StoreConfig, StoredRecord,
};

const SEG: SegmentId = SegmentId(42);
/// The index interval of these tests: small, so three frames get two entries.
const INDEX_INTERVAL: u64 = 64;

/// Hex, 16 bytes per line with the offset and an ASCII column, so a diff
/// points at the byte that moved and magics read at a glance.
fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "(empty)".to_owned();
    }
    bytes
        .chunks(16)
        .enumerate()
        .map(|(line, chunk)| {
            let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
            let ascii: String = chunk
                .iter()
                .map(|&b| {
                    if b.is_ascii_graphic() || b == b' ' {
                        b as char
                    } else {
                        '.'
                    }
                })
                .collect();
            format!("{:04x}: {:<47}  |{ascii}|", line * 16, hex.join(" "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Buffered writes (no direct-I/O padding), one flush in flight, and flushes
/// as soon as possible: every byte of the files is a function of the inputs.
fn config() -> StoreConfig {
    StoreConfig {
        flush_interval_ms: 0,
        sync_threads: 1,
        flush_pipeline_depth: 1,
        direct_io: false,
        index_interval_bytes: INDEX_INTERVAL,
        read_chunk_bytes: 512,
        ..StoreConfig::default()
    }
}

/// A record with a key, a value and one header.
fn with_header() -> Record {
    Record {
        timestamp_ms: 1_700_000_000_000,
        key: b"user-1".to_vec(),
        value: b"hello".to_vec(),
        headers: vec![("trace".to_owned(), b"ab".to_vec())],
    }
}

/// A record without headers.
fn plain() -> Record {
    Record {
        timestamp_ms: 1_700_000_000_001,
        key: b"user-2".to_vec(),
        value: b"world".to_vec(),
        headers: Vec::new(),
    }
}

/// A record with an empty key and value and two headers, one of them empty.
fn empty_with_headers() -> Record {
    Record {
        timestamp_ms: 1_700_000_000_002,
        key: Vec::new(),
        value: Vec::new(),
        headers: vec![
            ("a".to_owned(), Vec::new()),
            ("b".to_owned(), vec![0x00, 0xff]),
        ],
    }
}

fn encoded(offset: u64, durable_below: u64, record: &Record) -> Vec<u8> {
    let mut buf = Vec::new();
    frame::encode(&mut buf, offset, durable_below, record);
    buf
}

/// Decodes `bytes` as frames back to back from offset 0, as recovery does.
fn decode_all(bytes: &[u8]) -> Vec<(u64, u64, Record)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let (view, len) = frame::decode(&bytes[at..]).unwrap();
        assert_eq!(view.offset, out.len() as u64, "frame at byte {at}");
        out.push((view.offset, view.durable_below, view.to_record()));
        at += len;
    }
    out
}

fn read_all(store: &FileStore) -> Vec<StoredRecord> {
    store.read(SEG, 0, 100, 1 << 20).unwrap()
}

/// Writes the three records as two flushes ([0, 1] then [2]) and closes the
/// copy, leaving its `.log` and `.idx` in `dir`.
fn write_segment(dir: &Path) -> FileStore {
    let store = FileStore::open_dir(dir, config()).unwrap();
    store.open(SEG).unwrap();
    store
        .append(SEG, &[with_header(), plain()])
        .unwrap()
        .wait()
        .unwrap();
    store
        .append(SEG, &[empty_with_headers()])
        .unwrap()
        .wait()
        .unwrap();
    store
}

fn file(dir: &Path, extension: &str) -> Vec<u8> {
    std::fs::read(dir.join(format!("{}.{extension}", SEG.file_stem()))).unwrap()
}

#[test]
fn a_frame_encodes_to_its_frozen_bytes() {
    let bytes = encoded(5, 3, &with_header());
    insta::assert_snapshot!("frame", hex(&bytes));

    let (view, len) = frame::decode(&bytes).unwrap();
    assert_eq!(len, bytes.len());
    assert_eq!((view.offset, view.durable_below), (5, 3));
    assert_eq!(view.to_record(), with_header());
}

#[test]
fn the_smallest_frame_encodes_to_its_frozen_bytes() {
    let bytes = encoded(0, 0, &Record::default());
    assert_eq!(bytes.len(), FRAME_BYTES_MIN);
    insta::assert_snapshot!("frame_min", hex(&bytes));

    let (view, len) = frame::decode(&bytes).unwrap();
    assert_eq!(len, FRAME_BYTES_MIN);
    assert_eq!((view.offset, view.durable_below), (0, 0));
    assert_eq!(view.to_record(), Record::default());
}

#[test]
fn a_segment_log_is_its_frames_back_to_back() {
    let dir = tempfile::tempdir().unwrap();
    write_segment(dir.path()).close(SEG).unwrap();
    let log = file(dir.path(), "log");
    insta::assert_snapshot!("segment_log", hex(&log));

    // The store writes exactly what the frame encoder makes: the first flush
    // carries durable_below 0, the second the file's durable end, 2.
    let expected = [
        encoded(0, 0, &with_header()),
        encoded(1, 0, &plain()),
        encoded(2, 2, &empty_with_headers()),
    ]
    .concat();
    assert_eq!(log, expected);
    assert_eq!(
        decode_all(&log),
        vec![
            (0, 0, with_header()),
            (1, 0, plain()),
            (2, 2, empty_with_headers())
        ]
    );

    // Reopened over these bytes, the store recovers all three records and
    // cuts nothing.
    let store = FileStore::open_dir(dir.path(), config()).unwrap();
    let recovery = store.open(SEG).unwrap();
    assert_eq!(recovery.truncated_bytes, 0);
    assert_eq!(recovery.info.length, 3);
    assert_eq!(recovery.info.byte_size, log.len() as u64);
    let records: Vec<Record> = read_all(&store).into_iter().map(|r| r.record).collect();
    assert_eq!(records, vec![with_header(), plain(), empty_with_headers()]);
}

#[test]
fn the_sparse_index_sidecar_is_its_frozen_entries() {
    let dir = tempfile::tempdir().unwrap();
    write_segment(dir.path()).close(SEG).unwrap();
    let log = file(dir.path(), "log");
    let idx = file(dir.path(), "idx");
    insta::assert_snapshot!("segment_index", hex(&idx));

    // An entry for the first frame, then for the first frame starting at
    // least INDEX_INTERVAL bytes after it (offset 1, at the end of frame 0).
    let second = encoded(0, 0, &with_header()).len() as u64;
    let expected = [
        IndexEntry {
            offset: 0,
            position: 0,
        },
        IndexEntry {
            offset: 1,
            position: second,
        },
    ];
    let loaded = SparseIndex::load(
        &dir.path().join(format!("{}.idx", SEG.file_stem())),
        INDEX_INTERVAL,
        log.len() as u64,
    )
    .unwrap()
    .unwrap();
    assert_eq!(loaded.entries(), &expected);
    for entry in loaded.entries() {
        let (view, _) = frame::decode(&log[entry.position as usize..]).unwrap();
        assert_eq!(view.offset, entry.offset);
    }
    // The encoder of the in-memory index makes the same bytes.
    let mut index = SparseIndex::new(INDEX_INTERVAL);
    for entry in expected {
        index.observe(entry.offset, entry.position);
    }
    assert_eq!(index.encode_from(0), idx);

    // The store trusts the sidecar as it is: reopening rebuilds nothing.
    let store = FileStore::open_dir(dir.path(), config()).unwrap();
    assert!(!store.open(SEG).unwrap().index_rebuilt);
}

#[test]
fn the_seal_marker_encodes_to_its_frozen_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = write_segment(dir.path());
    // Sealed below the stored length, so length and byte_size differ from
    // the file's: the marker alone carries them.
    let seal = store.seal(SEG, 2).unwrap();
    let two_frames = (encoded(0, 0, &with_header()).len() + encoded(1, 0, &plain()).len()) as u64;
    assert_eq!(
        seal,
        SealInfo {
            length: 2,
            byte_size: two_frames
        }
    );
    store.close(SEG).unwrap();
    drop(store);
    let marker = file(dir.path(), "seal");
    insta::assert_snapshot!("seal_marker", hex(&marker));

    // Layout as docs/storage-format.md gives it, read by hand.
    assert_eq!(marker.len(), 32);
    assert_eq!(&marker[0..4], b"MLS1");
    assert_eq!(marker[4..8], 1u32.to_le_bytes());
    assert_eq!(marker[8..16], 2u64.to_le_bytes());
    assert_eq!(marker[16..24], two_frames.to_le_bytes());
    assert_eq!(marker[24..28], crc32_by_hand(&marker[0..24]).to_le_bytes());
    assert_eq!(marker[28..32], [0; 4]);

    // The store decodes the marker on reopen: sealed at 2, fenced, and reads
    // clamped to the seal although the log holds three records.
    let store = FileStore::open_dir(dir.path(), config()).unwrap();
    let recovery = store.open(SEG).unwrap();
    assert_eq!(recovery.info.sealed, Some(seal));
    assert!(recovery.info.fenced);
    assert_eq!(recovery.info.length, 2);
    assert_eq!(read_all(&store).len(), 2);
}

#[test]
fn the_fence_marker_is_an_empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = write_segment(dir.path());
    store.fence(SEG).unwrap();
    store.close(SEG).unwrap();
    drop(store);
    let marker = file(dir.path(), "fence");
    insta::assert_snapshot!("fence_marker", hex(&marker));
    assert!(
        !dir.path()
            .join(format!("{}.seal", SEG.file_stem()))
            .exists()
    );

    // Its existence is the fence: the reopened copy refuses appends.
    let store = FileStore::open_dir(dir.path(), config()).unwrap();
    let recovery = store.open(SEG).unwrap();
    assert!(recovery.info.fenced);
    assert_eq!(recovery.info.sealed, None);
    assert!(store.append(SEG, &[plain()]).is_err());
}

#[test]
fn file_names_are_the_id_in_twenty_digits() {
    let dir = tempfile::tempdir().unwrap();
    let store = write_segment(dir.path());
    store.seal(SEG, 3).unwrap();
    store.close(SEG).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    insta::assert_snapshot!("file_names", names.join("\n"));
}

/// CRC-32/ISO-HDLC computed bit by bit, independently of crc32fast, as the
/// doc specifies it (reflected polynomial 0xEDB88320, init and xor-out all
/// ones).
fn crc32_by_hand(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn the_independent_crc_agrees_with_the_documented_check_value() {
    assert_eq!(crc32_by_hand(b"123456789"), 0xCBF4_3926);
    let bytes = encoded(5, 3, &with_header());
    assert_eq!(
        bytes[8..12],
        crc32_by_hand(&bytes[frame::FRAME_HEADER_BYTES..]).to_le_bytes()
    );
}
