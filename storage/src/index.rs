//! The sparse index: derived data that maps an offset to a byte position.
//!
//! The `<id>.idx` sidecar is a flat array of 16-byte entries
//! `(offset u64 LE, position u64 LE)`, one about every `index_interval_bytes`
//! of log. Nothing trusts it: a lookup only gives the position to start a scan
//! from, the scan checks that the frame found there carries the expected
//! offset, and any disagreement falls back to a scan from byte zero.

use std::fs::File;
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes per entry in the sidecar file.
pub const INDEX_ENTRY_BYTES: usize = 16;

/// One index entry: the frame of `offset` starts at byte `position`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub offset: u64,
    pub position: u64,
}

/// An in-memory sparse index sorted by offset (and therefore by position).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparseIndex {
    entries: Vec<IndexEntry>,
    interval_bytes: u64,
}

impl SparseIndex {
    pub fn new(interval_bytes: u64) -> Self {
        assert!(interval_bytes > 0, "index interval must be positive");
        SparseIndex {
            entries: Vec::new(),
            interval_bytes,
        }
    }

    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// Offers the frame of `offset` at `position`; it becomes an entry when it
    /// starts at least `interval_bytes` after the previous entry (or at zero).
    pub fn observe(&mut self, offset: u64, position: u64) -> bool {
        let due = match self.entries.last() {
            None => true,
            Some(last) => {
                debug_assert!(offset > last.offset && position > last.position);
                position >= last.position + self.interval_bytes
            }
        };
        if due {
            self.entries.push(IndexEntry { offset, position });
        }
        due
    }

    /// Forgets the entries of offsets at or past `offset` (the log was cut there).
    pub fn truncate(&mut self, offset: u64) {
        let keep = self.entries.partition_point(|e| e.offset < offset);
        self.entries.truncate(keep);
    }

    /// The entry with the largest offset at or below `offset`: O(log n).
    pub fn floor(&self, offset: u64) -> Option<IndexEntry> {
        let n = self.entries.partition_point(|e| e.offset <= offset);
        n.checked_sub(1).map(|i| self.entries[i])
    }

    /// Reads a sidecar, keeping the longest prefix that is strictly increasing
    /// and lies below `bytes_limit`. Garbage only shortens the index.
    pub fn load(path: &Path, interval_bytes: u64, bytes_limit: u64) -> io::Result<Option<Self>> {
        let data = match std::fs::read(path) {
            Ok(data) => data,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some(SparseIndex::decode(
            &data,
            interval_bytes,
            bytes_limit,
        )))
    }

    /// Decodes sidecar bytes, keeping the longest prefix that is strictly
    /// increasing and lies below `bytes_limit`. Any input yields an index.
    pub fn decode(data: &[u8], interval_bytes: u64, bytes_limit: u64) -> Self {
        let mut index = SparseIndex::new(interval_bytes);
        for chunk in data.chunks_exact(INDEX_ENTRY_BYTES) {
            let mut o = [0u8; 8];
            let mut p = [0u8; 8];
            o.copy_from_slice(&chunk[..8]);
            p.copy_from_slice(&chunk[8..]);
            let entry = IndexEntry {
                offset: u64::from_le_bytes(o),
                position: u64::from_le_bytes(p),
            };
            let increasing = index
                .entries
                .last()
                .is_none_or(|last| entry.offset > last.offset && entry.position > last.position);
            if !increasing || entry.position >= bytes_limit {
                break;
            }
            index.entries.push(entry);
        }
        index
    }

    /// Encodes entries `from..` for the sidecar.
    pub fn encode_from(&self, from: usize) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(self.entries.len().saturating_sub(from) * INDEX_ENTRY_BYTES);
        for e in self.entries.iter().skip(from) {
            out.extend_from_slice(&e.offset.to_le_bytes());
            out.extend_from_slice(&e.position.to_le_bytes());
        }
        out
    }

    /// Rewrites the whole sidecar. It is not fsynced: it is derived data.
    pub fn write_all(&self, file: &File) -> io::Result<()> {
        let bytes = self.encode_from(0);
        file.write_all_at(&bytes, 0)?;
        file.set_len(bytes.len() as u64)
    }

    #[cfg(test)]
    pub(crate) fn push_unchecked(&mut self, entry: IndexEntry) {
        self.entries.push(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(entries: &[(u64, u64)]) -> SparseIndex {
        let mut i = SparseIndex::new(100);
        for &(offset, position) in entries {
            i.push_unchecked(IndexEntry { offset, position });
        }
        i
    }

    #[test]
    fn floor_returns_the_last_entry_at_or_below_the_offset() {
        let i = index(&[(0, 0), (10, 1000), (20, 2000)]);
        assert_eq!(i.floor(0).unwrap().offset, 0);
        assert_eq!(i.floor(9).unwrap().offset, 0);
        assert_eq!(i.floor(10).unwrap().offset, 10);
        assert_eq!(i.floor(19).unwrap().position, 1000);
        assert_eq!(i.floor(1_000).unwrap().offset, 20);
    }

    #[test]
    fn floor_on_empty_index_is_none() {
        assert_eq!(SparseIndex::new(10).floor(5), None);
    }

    #[test]
    fn observe_adds_an_entry_every_interval_bytes() {
        let mut i = SparseIndex::new(100);
        assert!(i.observe(0, 0));
        assert!(!i.observe(1, 60));
        assert!(i.observe(2, 120));
        assert!(!i.observe(3, 200));
        assert!(i.observe(4, 220));
        assert_eq!(i.entries().len(), 3);
    }

    #[test]
    fn load_keeps_only_the_increasing_prefix_below_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.idx");
        let good = index(&[(0, 0), (10, 1000), (5, 2000), (30, 3000)]);
        std::fs::write(&path, good.encode_from(0)).unwrap();
        let loaded = SparseIndex::load(&path, 100, 10_000).unwrap().unwrap();
        assert_eq!(loaded.entries().len(), 2);
        let clipped = SparseIndex::load(&path, 100, 1000).unwrap().unwrap();
        assert_eq!(clipped.entries().len(), 1);
    }

    #[test]
    fn load_of_a_missing_sidecar_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            SparseIndex::load(&dir.path().join("no.idx"), 10, 10)
                .unwrap()
                .is_none()
        );
    }
}
