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

/// A record read back from a segment, with its offset within the segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub offset: u64,
    pub record: Record,
}
