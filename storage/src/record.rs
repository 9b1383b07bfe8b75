//! Records as callers see them.

/// One record: key, value, headers and a timestamp chosen by the caller.
///
/// The store never reads a clock for a record: the timestamp is whatever the
/// caller passed, so replicas that write the same batch hold the same bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    pub timestamp_ms: u64,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Record {
    /// A record without headers.
    pub fn new(timestamp_ms: u64, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        Record {
            timestamp_ms,
            key: key.into(),
            value: value.into(),
            headers: Vec::new(),
        }
    }
}

/// What the store needs to frame a record. [`Record`] implements it, and so
/// can a caller's own record type, so that a batch is framed straight from
/// the buffers it arrived in (a broker's request buffer) without first
/// being copied into owned `Record`s.
pub trait RecordParts {
    fn timestamp_ms(&self) -> u64;
    fn key(&self) -> &[u8];
    fn value(&self) -> &[u8];
    fn header_count(&self) -> usize;
    /// Header `i` as (name, value); `i < header_count()`.
    fn header(&self, i: usize) -> (&str, &[u8]);
}

impl RecordParts for Record {
    fn timestamp_ms(&self) -> u64 {
        self.timestamp_ms
    }
    fn key(&self) -> &[u8] {
        &self.key
    }
    fn value(&self) -> &[u8] {
        &self.value
    }
    fn header_count(&self) -> usize {
        self.headers.len()
    }
    fn header(&self, i: usize) -> (&str, &[u8]) {
        let (name, value) = &self.headers[i];
        (name, value)
    }
}

/// A record read back from a segment, with its offset within the segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub offset: u64,
    pub record: Record,
}

/// A batch of records an append frames, seen one record at a time as
/// `&dyn RecordParts`: what keeps [`SegmentStore::append`] callable on a
/// `dyn SegmentStore` (a generic `&[R]` would not be) while the batch is
/// still framed straight from the caller's buffers, with nothing copied or
/// allocated to hand it over (ADR 0131).
///
/// [`SegmentStore::append`]: crate::SegmentStore::append
pub trait RecordBatch {
    /// How many records the batch holds.
    fn len(&self) -> usize;
    /// Record `i`; `i < len()`.
    fn record(&self, i: usize) -> &dyn RecordParts;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl dyn RecordBatch + '_ {
    /// The records in order.
    pub fn iter(&self) -> impl Iterator<Item = &dyn RecordParts> + '_ {
        (0..self.len()).map(move |i| self.record(i))
    }
}

impl<R: RecordParts> RecordBatch for &[R] {
    fn len(&self) -> usize {
        <[R]>::len(self)
    }
    fn record(&self, i: usize) -> &dyn RecordParts {
        &self[i]
    }
}

impl<R: RecordParts> RecordBatch for Vec<R> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn record(&self, i: usize) -> &dyn RecordParts {
        &self[i]
    }
}

impl<R: RecordParts, const N: usize> RecordBatch for [R; N] {
    fn len(&self) -> usize {
        N
    }
    fn record(&self, i: usize) -> &dyn RecordParts {
        &self[i]
    }
}
