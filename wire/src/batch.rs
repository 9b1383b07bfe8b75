//! The record batch block: the compact binary form in which records travel,
//! and which storage and replication pass on without re-encoding.
//!
//! ```text
//! offset  size  field
//! 0       1     magic: 0x01 (the block's format version)
//! 1       4     crc32 (IEEE, big-endian) of every byte from offset 5 to the end
//! 5       var   record_count: LEB128 u32
//! ...           record_count records, each:
//!                 attributes: u8 (bit 0: a timestamp follows; bits 1-7 must be 0)
//!                 timestamp_ms: LEB128 u64, only when bit 0 is set
//!                 key_len: LEB128 u32, then key_len bytes
//!                 value_len: LEB128 u32, then value_len bytes
//!                 header_count: LEB128 u32, then per header:
//!                   name_len: LEB128 u32, then name_len bytes of UTF-8
//!                   value_len: LEB128 u32, then value_len bytes
//! ```
//!
//! Decoding checks the CRC before it looks at anything else, then walks the
//! records with every length checked against the bytes that remain, so a
//! declared length never drives an allocation. The block must end exactly
//! after the last record. Decoded keys and values are `Bytes` slices of the
//! block: nothing is copied.

use bytes::{BufMut, Bytes, BytesMut};

/// The magic byte (format version) at the head of every block.
pub const BATCH_MAGIC: u8 = 0x01;
/// Bytes before the CRC-covered part: magic and CRC.
pub const BATCH_HEADER_BYTES: usize = 5;
/// The smallest encoding of one record: attributes and three zero lengths.
const RECORD_BYTES_MIN: usize = 4;
/// The smallest encoding of one header: two zero lengths.
const HEADER_BYTES_MIN: usize = 2;
/// Attribute bit: a timestamp follows.
const ATTRIBUTE_TIMESTAMP: u8 = 0b0000_0001;
/// The default limit on one block's encoded size (1 MiB).
pub const BATCH_BYTES_MAX_DEFAULT: usize = 1024 * 1024;

/// Why a block was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("block of {bytes} bytes is shorter than the {min_bytes} byte minimum")]
    TooShort { bytes: usize, min_bytes: usize },
    #[error("unknown block magic {found:#04x}")]
    BadMagic { found: u8 },
    #[error("crc mismatch: block says {declared:#010x}, bytes give {computed:#010x}")]
    CrcMismatch { declared: u32, computed: u32 },
    #[error("truncated {field}: needs {needed} bytes, {remaining} remain")]
    Truncated {
        field: &'static str,
        needed: usize,
        remaining: usize,
    },
    #[error("malformed varint in {field}")]
    BadVarint { field: &'static str },
    #[error("record count {declared} cannot fit in the {remaining} bytes that remain")]
    CountMismatch { declared: u32, remaining: usize },
    #[error("header count {declared} cannot fit in the {remaining} bytes that remain")]
    HeaderCountMismatch { declared: u32, remaining: usize },
    #[error("record {index} sets reserved attribute bits {bits:#04x}")]
    ReservedAttributes { index: u32, bits: u8 },
    #[error("header name in record {index} is not utf-8")]
    HeaderNameNotUtf8 { index: u32 },
    #[error("{bytes} trailing bytes after the last record")]
    TrailingBytes { bytes: usize },
    #[error(
        "record of {record_bytes} bytes does not fit: the block would be {block_bytes} bytes, over the limit of {batch_bytes_max}"
    )]
    Full {
        record_bytes: usize,
        block_bytes: usize,
        batch_bytes_max: usize,
    },
    #[error("a field of {bytes} bytes exceeds the u32 length limit")]
    FieldTooLong { bytes: usize },
}

/// One record header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: Bytes,
}

/// One record as a client sees it. There is no offset: positions are carried
/// by opaque cursors only.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// The producer's timestamp, in milliseconds since the Unix epoch, if it set one.
    pub timestamp_ms: Option<u64>,
    pub key: Bytes,
    pub value: Bytes,
    pub headers: Vec<Header>,
}

impl Record {
    /// A record with a key and a value, no timestamp and no headers.
    pub fn new(key: impl Into<Bytes>, value: impl Into<Bytes>) -> Record {
        Record {
            timestamp_ms: None,
            key: key.into(),
            value: value.into(),
            headers: Vec::new(),
        }
    }

    /// The same record with a timestamp.
    pub fn with_timestamp_ms(mut self, timestamp_ms: u64) -> Record {
        self.timestamp_ms = Some(timestamp_ms);
        self
    }

    /// The same record with one more header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Bytes>) -> Record {
        self.headers.push(Header {
            name: name.into(),
            value: value.into(),
        });
        self
    }

    /// How many bytes this record takes inside a block.
    pub fn encoded_bytes(&self) -> usize {
        self.as_ref().encoded_bytes()
    }

    /// A borrowed view of this record, as `BatchBuilder::push_ref` takes.
    pub fn as_ref(&self) -> RecordRef<'_, Header> {
        RecordRef {
            timestamp_ms: self.timestamp_ms,
            key: &self.key,
            value: &self.value,
            headers: &self.headers,
        }
    }
}

/// A header as the encoder sees it, owned or borrowed.
pub trait HeaderParts {
    fn name_bytes(&self) -> &[u8];
    fn value_bytes(&self) -> &[u8];
}

impl HeaderParts for Header {
    fn name_bytes(&self) -> &[u8] {
        self.name.as_bytes()
    }
    fn value_bytes(&self) -> &[u8] {
        &self.value
    }
}

impl HeaderParts for (&str, &[u8]) {
    fn name_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
    fn value_bytes(&self) -> &[u8] {
        self.1
    }
}

/// A record whose bytes live elsewhere (a storage read buffer, say), so it
/// can be encoded into a block without first being copied into a `Record`.
#[derive(Debug, Clone, Copy)]
pub struct RecordRef<'a, H> {
    pub timestamp_ms: Option<u64>,
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub headers: &'a [H],
}

impl<H: HeaderParts> RecordRef<'_, H> {
    /// How many bytes this record takes inside a block.
    pub fn encoded_bytes(&self) -> usize {
        let mut bytes = 1;
        if let Some(ts) = self.timestamp_ms {
            bytes += varint_bytes(ts);
        }
        bytes += varint_bytes(self.key.len() as u64) + self.key.len();
        bytes += varint_bytes(self.value.len() as u64) + self.value.len();
        bytes += varint_bytes(self.headers.len() as u64);
        for header in self.headers {
            let (name, value) = (header.name_bytes(), header.value_bytes());
            bytes += varint_bytes(name.len() as u64) + name.len();
            bytes += varint_bytes(value.len() as u64) + value.len();
        }
        bytes
    }

    fn check_lengths(&self) -> Result<(), BatchError> {
        let too_long = |bytes: usize| {
            if u32::try_from(bytes).is_err() {
                Err(BatchError::FieldTooLong { bytes })
            } else {
                Ok(())
            }
        };
        too_long(self.key.len())?;
        too_long(self.value.len())?;
        too_long(self.headers.len())?;
        for header in self.headers {
            too_long(header.name_bytes().len())?;
            too_long(header.value_bytes().len())?;
        }
        Ok(())
    }

    fn encode_into(&self, out: &mut BytesMut) {
        match self.timestamp_ms {
            Some(ts) => {
                out.put_u8(ATTRIBUTE_TIMESTAMP);
                put_varint(out, ts);
            }
            None => out.put_u8(0),
        }
        put_varint(out, self.key.len() as u64);
        out.put_slice(self.key);
        put_varint(out, self.value.len() as u64);
        out.put_slice(self.value);
        put_varint(out, self.headers.len() as u64);
        for header in self.headers {
            let (name, value) = (header.name_bytes(), header.value_bytes());
            put_varint(out, name.len() as u64);
            out.put_slice(name);
            put_varint(out, value.len() as u64);
            out.put_slice(value);
        }
    }
}

/// A validated record batch block. It keeps the encoded bytes, so passing it
/// on (to storage, to a replica, to a consumer) never re-encodes it.
#[derive(Clone, PartialEq, Eq)]
pub struct RecordBatch {
    block: Bytes,
    count: u32,
}

impl std::fmt::Debug for RecordBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordBatch")
            .field("count", &self.count)
            .field("bytes", &self.block.len())
            .finish()
    }
}

impl Default for RecordBatch {
    /// The empty batch (zero records).
    fn default() -> RecordBatch {
        BatchBuilder::new(BATCH_BYTES_MAX_DEFAULT).finish()
    }
}

impl RecordBatch {
    /// Validate a block received from the network or read back from disk:
    /// CRC first, then the structure. The block is kept as is.
    pub fn from_block(block: Bytes) -> Result<RecordBatch, BatchError> {
        let count = walk(&block, |_| ())?;
        Ok(RecordBatch { block, count })
    }

    /// Encode records into one block, refusing to exceed `batch_bytes_max`.
    pub fn from_records<'a>(
        records: impl IntoIterator<Item = &'a Record>,
        batch_bytes_max: usize,
    ) -> Result<RecordBatch, BatchError> {
        let mut builder = BatchBuilder::new(batch_bytes_max);
        for record in records {
            builder.push(record)?;
        }
        Ok(builder.finish())
    }

    /// The encoded block, exactly as it travels and is stored.
    pub fn block(&self) -> &Bytes {
        &self.block
    }

    /// Give up the batch for its encoded block.
    pub fn into_block(self) -> Bytes {
        self.block
    }

    /// How many records the block holds.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Whether the block holds no record.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The block's size in bytes.
    pub fn encoded_bytes(&self) -> usize {
        self.block.len()
    }

    /// The records, as zero-copy slices of the block.
    pub fn records(&self) -> Vec<Record> {
        let mut records = Vec::with_capacity(self.count as usize);
        // The block was validated at construction (its CRC included) and
        // `Bytes` is immutable, so this second walk skips the CRC and cannot
        // fail; if it ever did, the records it found before are correct.
        debug_assert!(
            walk(&self.block, |_| ()).is_ok(),
            "a validated block changed"
        );
        let walked = walk_with(&self.block, false, |record| records.push(record));
        debug_assert!(walked.is_ok(), "a validated block failed its second walk");
        records
    }
}

/// The most bytes a LEB128 `u32` (the record count) takes.
const COUNT_VARINT_BYTES_MAX: usize = 5;
/// Room the builder keeps in front of the body for the magic, the CRC and
/// the count, so `finish` writes them in place instead of copying the body
/// (a fetch block is megabytes; copying it again cost as much as encoding).
const BUILDER_PREFIX_BYTES: usize = BATCH_HEADER_BYTES + COUNT_VARINT_BYTES_MAX;

/// Builds a block record by record, within `batch_bytes_max`.
#[derive(Debug)]
pub struct BatchBuilder {
    /// `BUILDER_PREFIX_BYTES` of room, then the encoded records.
    buf: BytesMut,
    count: u32,
    batch_bytes_max: usize,
    /// CRC of the encoded records so far, taken as each is written (while
    /// its bytes are in cache) rather than in a second pass over the block.
    body_crc: crc32fast::Hasher,
}

impl BatchBuilder {
    /// A builder whose block will not exceed `batch_bytes_max` bytes.
    pub fn new(batch_bytes_max: usize) -> BatchBuilder {
        BatchBuilder::with_capacity(batch_bytes_max, 0)
    }

    /// A builder that allocates room for `capacity_bytes` of block up front
    /// (never more than `batch_bytes_max`), so a caller that expects to fill
    /// it, such as a fetch, does not regrow and recopy the buffer.
    pub fn with_capacity(batch_bytes_max: usize, capacity_bytes: usize) -> BatchBuilder {
        let capacity = capacity_bytes
            .min(batch_bytes_max)
            .max(BUILDER_PREFIX_BYTES);
        let mut buf = BytesMut::with_capacity(capacity);
        buf.put_bytes(0, BUILDER_PREFIX_BYTES);
        BatchBuilder {
            buf,
            count: 0,
            batch_bytes_max,
            body_crc: crc32fast::Hasher::new(),
        }
    }

    fn body_bytes(&self) -> usize {
        self.buf.len() - BUILDER_PREFIX_BYTES
    }

    /// Append a record, or refuse it with [`BatchError::Full`] (the builder
    /// is unchanged) if the block would grow past its limit.
    pub fn push(&mut self, record: &Record) -> Result<(), BatchError> {
        self.push_ref(record.as_ref())
    }

    /// Append a record from borrowed parts; otherwise as `push`.
    pub fn push_ref<H: HeaderParts>(&mut self, record: RecordRef<'_, H>) -> Result<(), BatchError> {
        record.check_lengths()?;
        let record_bytes = record.encoded_bytes();
        let count = self.count.checked_add(1).ok_or(BatchError::FieldTooLong {
            bytes: self.count as usize + 1,
        })?;
        let block_bytes =
            BATCH_HEADER_BYTES + varint_bytes(u64::from(count)) + self.body_bytes() + record_bytes;
        if block_bytes > self.batch_bytes_max {
            return Err(BatchError::Full {
                record_bytes,
                block_bytes,
                batch_bytes_max: self.batch_bytes_max,
            });
        }
        let before = self.buf.len();
        record.encode_into(&mut self.buf);
        debug_assert_eq!(self.buf.len() - before, record_bytes);
        self.body_crc.update(&self.buf[before..]);
        self.count = count;
        Ok(())
    }

    /// Records pushed so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The size the block would have if finished now.
    pub fn encoded_bytes(&self) -> usize {
        BATCH_HEADER_BYTES + varint_bytes(u64::from(self.count)) + self.body_bytes()
    }

    /// Seal the block: count, CRC and magic, written into the room kept in
    /// front of the body; the body itself is not copied.
    pub fn finish(self) -> RecordBatch {
        let mut count_bytes = BytesMut::with_capacity(COUNT_VARINT_BYTES_MAX);
        put_varint(&mut count_bytes, u64::from(self.count));
        assert!(count_bytes.len() <= COUNT_VARINT_BYTES_MAX);
        let start = BUILDER_PREFIX_BYTES - BATCH_HEADER_BYTES - count_bytes.len();
        let mut block = self.buf;
        // Dropping the unused front of the room is O(1): it moves a pointer.
        let _unused_room = block.split_to(start);
        block[0] = BATCH_MAGIC;
        block[BATCH_HEADER_BYTES..BATCH_HEADER_BYTES + count_bytes.len()]
            .copy_from_slice(&count_bytes);
        // The CRC covers the count and then the body: combine the body's,
        // taken while pushing, onto the count's.
        let mut crc = crc32fast::Hasher::new();
        crc.update(&count_bytes);
        crc.combine(&self.body_crc);
        let crc = crc.finalize();
        debug_assert_eq!(crc, crc32fast::hash(&block[BATCH_HEADER_BYTES..]));
        block[1..BATCH_HEADER_BYTES].copy_from_slice(&crc.to_be_bytes());
        let block = block.freeze();
        assert!(block.len() <= self.batch_bytes_max.max(BATCH_HEADER_BYTES + 1));
        RecordBatch {
            block,
            count: self.count,
        }
    }
}

/// Check and walk a block, handing each record to `visit`. Returns the count.
fn walk(block: &Bytes, visit: impl FnMut(Record)) -> Result<u32, BatchError> {
    walk_with(block, true, visit)
}

/// Walks a block; `check_crc` false skips the checksum, for a block this
/// process already validated (a `RecordBatch` is immutable once built).
fn walk_with(
    block: &Bytes,
    check_crc: bool,
    mut visit: impl FnMut(Record),
) -> Result<u32, BatchError> {
    let min_bytes = BATCH_HEADER_BYTES + 1;
    if block.len() < min_bytes {
        return Err(BatchError::TooShort {
            bytes: block.len(),
            min_bytes,
        });
    }
    if block[0] != BATCH_MAGIC {
        return Err(BatchError::BadMagic { found: block[0] });
    }
    let declared = u32::from_be_bytes([block[1], block[2], block[3], block[4]]);
    if check_crc {
        let computed = crc32fast::hash(&block[BATCH_HEADER_BYTES..]);
        if declared != computed {
            return Err(BatchError::CrcMismatch { declared, computed });
        }
    }
    let mut reader = Reader {
        block,
        pos: BATCH_HEADER_BYTES,
    };
    let count = reader.varint_u32("record_count")?;
    // A count that cannot fit is refused before anything is sized from it.
    if (count as usize).saturating_mul(RECORD_BYTES_MIN) > reader.remaining() {
        return Err(BatchError::CountMismatch {
            declared: count,
            remaining: reader.remaining(),
        });
    }
    for index in 0..count {
        let attributes = reader.u8("attributes")?;
        if attributes & !ATTRIBUTE_TIMESTAMP != 0 {
            return Err(BatchError::ReservedAttributes {
                index,
                bits: attributes & !ATTRIBUTE_TIMESTAMP,
            });
        }
        let timestamp_ms = if attributes & ATTRIBUTE_TIMESTAMP != 0 {
            Some(reader.varint_u64("timestamp_ms")?)
        } else {
            None
        };
        let key = reader.sized("key")?;
        let value = reader.sized("value")?;
        let header_count = reader.varint_u32("header_count")?;
        if (header_count as usize).saturating_mul(HEADER_BYTES_MIN) > reader.remaining() {
            return Err(BatchError::HeaderCountMismatch {
                declared: header_count,
                remaining: reader.remaining(),
            });
        }
        let mut headers = Vec::with_capacity(header_count as usize);
        for _ in 0..header_count {
            let name = reader.sized("header_name")?;
            let name = String::from_utf8(name.to_vec())
                .map_err(|_| BatchError::HeaderNameNotUtf8 { index })?;
            let value = reader.sized("header_value")?;
            headers.push(Header { name, value });
        }
        visit(Record {
            timestamp_ms,
            key,
            value,
            headers,
        });
    }
    if reader.remaining() != 0 {
        return Err(BatchError::TrailingBytes {
            bytes: reader.remaining(),
        });
    }
    Ok(count)
}

/// A bounds-checked cursor over a block.
struct Reader<'a> {
    block: &'a Bytes,
    pos: usize,
}

impl Reader<'_> {
    fn remaining(&self) -> usize {
        self.block.len() - self.pos
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, BatchError> {
        let byte = *self.block.get(self.pos).ok_or(BatchError::Truncated {
            field,
            needed: 1,
            remaining: 0,
        })?;
        self.pos += 1;
        Ok(byte)
    }

    fn varint_u64(&mut self, field: &'static str) -> Result<u64, BatchError> {
        let (value, used) = read_varint(&self.block[self.pos..], field)?;
        self.pos += used;
        Ok(value)
    }

    fn varint_u32(&mut self, field: &'static str) -> Result<u32, BatchError> {
        let value = self.varint_u64(field)?;
        u32::try_from(value).map_err(|_| BatchError::BadVarint { field })
    }

    /// A length-prefixed field, as a zero-copy slice of the block.
    fn sized(&mut self, field: &'static str) -> Result<Bytes, BatchError> {
        let len = self.varint_u32(field)? as usize;
        if len > self.remaining() {
            return Err(BatchError::Truncated {
                field,
                needed: len,
                remaining: self.remaining(),
            });
        }
        let slice = self.block.slice(self.pos..self.pos + len);
        self.pos += len;
        Ok(slice)
    }
}

/// How many bytes `value` takes as a LEB128 varint.
pub fn varint_bytes(value: u64) -> usize {
    let bits = 64 - (value | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Append `value` as an unsigned LEB128 varint.
pub fn put_varint(out: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        out.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

/// Read an unsigned LEB128 varint of at most 10 bytes. Values that overflow
/// u64 and non-minimal encodings (e.g. `0x80 0x00` for 0) are refused.
pub fn read_varint(bytes: &[u8], field: &'static str) -> Result<(u64, usize), BatchError> {
    let mut value: u64 = 0;
    for (i, byte) in bytes.iter().take(10).enumerate() {
        let low = u64::from(byte & 0x7f);
        if i == 9 && *byte > 1 {
            return Err(BatchError::BadVarint { field });
        }
        value |= low << (7 * i);
        if byte & 0x80 == 0 {
            // One encoding per value: a zero final byte after the first
            // means the value had a shorter form. Canonical blocks re-encode
            // to the same bytes (and so to the same CRC).
            if i > 0 && *byte == 0 {
                return Err(BatchError::BadVarint { field });
            }
            return Ok((value, i + 1));
        }
    }
    if bytes.len() >= 10 {
        Err(BatchError::BadVarint { field })
    } else {
        Err(BatchError::Truncated {
            field,
            needed: bytes.len() + 1,
            remaining: bytes.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RecordBatch {
        RecordBatch::from_records(
            &[
                Record::new("k1", "v1"),
                Record::new("", "v2")
                    .with_timestamp_ms(1_700_000_000_000)
                    .with_header("h", "x"),
            ],
            BATCH_BYTES_MAX_DEFAULT,
        )
        .unwrap()
    }

    #[test]
    fn a_block_decodes_to_the_records_it_was_built_from() {
        let batch = sample();
        let again = RecordBatch::from_block(batch.block().clone()).unwrap();
        assert_eq!(again.count(), 2);
        let records = again.records();
        assert_eq!(records[0], Record::new("k1", "v1"));
        assert_eq!(records[1].timestamp_ms, Some(1_700_000_000_000));
        assert_eq!(records[1].headers[0].name, "h");
    }

    #[test]
    fn decoded_keys_and_values_are_slices_of_the_block_not_copies() {
        let batch = sample();
        let block = batch.block().clone();
        let records = RecordBatch::from_block(block.clone()).unwrap().records();
        let range = block.as_ptr() as usize..block.as_ptr() as usize + block.len();
        assert!(range.contains(&(records[0].key.as_ptr() as usize)));
        assert!(range.contains(&(records[0].value.as_ptr() as usize)));
    }

    #[test]
    fn a_flipped_bit_is_refused_as_a_crc_mismatch() {
        let mut bytes = sample().block().to_vec();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        assert!(matches!(
            RecordBatch::from_block(Bytes::from(bytes)),
            Err(BatchError::CrcMismatch { .. })
        ));
    }

    /// Re-seal a tampered body with a correct CRC so structure checks are reached.
    fn sealed(body: &[u8]) -> Bytes {
        let mut block = vec![BATCH_MAGIC];
        block.extend_from_slice(&crc32fast::hash(body).to_be_bytes());
        block.extend_from_slice(body);
        Bytes::from(block)
    }

    #[test]
    fn a_count_larger_than_the_bytes_allow_is_refused_before_allocating() {
        // count = u32::MAX, no records.
        let body = [0xff, 0xff, 0xff, 0xff, 0x0f];
        assert!(matches!(
            RecordBatch::from_block(sealed(&body)),
            Err(BatchError::CountMismatch { .. })
        ));
    }

    #[test]
    fn a_key_length_past_the_end_is_refused_as_truncated() {
        // count 1, attributes 0, key_len 100 with no key bytes, then padding.
        let body = [0x01, 0x00, 100, 0, 0, 0];
        assert!(matches!(
            RecordBatch::from_block(sealed(&body)),
            Err(BatchError::Truncated { field: "key", .. })
        ));
    }

    #[test]
    fn bytes_after_the_last_record_are_refused() {
        let body = [0x01, 0x00, 0x00, 0x00, 0x00, 0xaa];
        assert!(matches!(
            RecordBatch::from_block(sealed(&body)),
            Err(BatchError::TrailingBytes { bytes: 1 })
        ));
    }

    #[test]
    fn reserved_attribute_bits_are_refused() {
        let body = [0x01, 0x02, 0x00, 0x00, 0x00];
        assert!(matches!(
            RecordBatch::from_block(sealed(&body)),
            Err(BatchError::ReservedAttributes { index: 0, bits: 2 })
        ));
    }

    #[test]
    fn a_wrong_magic_is_refused() {
        let mut bytes = sample().block().to_vec();
        bytes[0] = 0x7f;
        assert!(matches!(
            RecordBatch::from_block(Bytes::from(bytes)),
            Err(BatchError::BadMagic { found: 0x7f })
        ));
    }

    #[test]
    fn the_builder_refuses_a_record_past_batch_bytes_max_and_keeps_the_others() {
        let mut builder = BatchBuilder::new(32);
        builder.push(&Record::new("a", "b")).unwrap();
        let big = Record::new("k", vec![0u8; 64]);
        assert!(matches!(builder.push(&big), Err(BatchError::Full { .. })));
        let batch = builder.finish();
        assert_eq!(batch.count(), 1);
        assert!(batch.encoded_bytes() <= 32);
    }

    #[test]
    fn a_builder_with_capacity_seals_the_same_block_as_a_plain_builder() {
        // 200 records make the count a two-byte varint, so the header is
        // written at a different place in the room kept in front of the body.
        for records in [0usize, 1, 127, 128, 200] {
            let mut plain = BatchBuilder::new(BATCH_BYTES_MAX_DEFAULT);
            let mut reserved = BatchBuilder::with_capacity(BATCH_BYTES_MAX_DEFAULT, 64 * 1024);
            for i in 0..records {
                let record = Record::new(format!("k{i}"), vec![i as u8; 10]).with_timestamp_ms(7);
                plain.push(&record).unwrap();
                reserved.push(&record).unwrap();
            }
            assert_eq!(plain.encoded_bytes(), reserved.encoded_bytes());
            let (plain, reserved) = (plain.finish(), reserved.finish());
            assert_eq!(plain.block(), reserved.block());
            assert_eq!(reserved.encoded_bytes(), reserved.block().len());
            let decoded = RecordBatch::from_block(reserved.block().clone()).unwrap();
            assert_eq!(decoded.count() as usize, records);
            assert_eq!(decoded.records().len(), records);
        }
    }

    #[test]
    fn a_builder_never_reserves_more_than_batch_bytes_max() {
        let builder = BatchBuilder::with_capacity(64, 1 << 30);
        assert!(builder.buf.capacity() < 1024);
        assert_eq!(builder.finish(), RecordBatch::default());
    }

    #[test]
    fn the_empty_batch_is_six_bytes_and_valid() {
        let batch = RecordBatch::default();
        assert_eq!(
            batch.block().as_ref(),
            &[0x01, 0xd2, 0x02, 0xef, 0x8d, 0x00],
            "documented in docs/protocol.md section 6"
        );
        assert!(RecordBatch::from_block(batch.block().clone()).is_ok());
    }

    #[test]
    fn varints_round_trip_at_the_edges_and_overlong_ones_are_refused() {
        for value in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = BytesMut::new();
            put_varint(&mut out, value);
            assert_eq!(out.len(), varint_bytes(value));
            assert_eq!(read_varint(&out, "v").unwrap(), (value, out.len()));
        }
        let overlong = [0xffu8; 11];
        assert!(matches!(
            read_varint(&overlong, "v"),
            Err(BatchError::BadVarint { .. })
        ));
        assert!(matches!(
            read_varint(&[0x80, 0x00], "v"),
            Err(BatchError::BadVarint { .. })
        ));
        assert!(matches!(
            read_varint(&[0x80], "v"),
            Err(BatchError::Truncated { .. })
        ));
    }
}
