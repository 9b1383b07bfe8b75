//! The record frame: the unit the log file is made of.
//!
//! ```text
//! frame   = magic "MLR1" (4 bytes) | payload_len u32 | crc32 u32 | payload
//! payload = body | trailer
//! body    = timestamp_ms u64 | key_len u32 | key | value_len u32 | value
//!         | header_count u32 | { name_len u32 | name (utf-8) | hvalue_len u32 | hvalue }*
//! trailer = offset u64 | durable_below u64
//! ```
//!
//! The offsets sit in a trailer so that the appender's thread can checksum
//! the body while it encodes it (the bytes are in cache then), and the sync
//! thread only extends that checksum over the 16 trailer bytes once it knows
//! the flush.
//!
//! All integers are little-endian. The CRC is CRC-32 (IEEE, as computed by
//! crc32fast) over the payload bytes. `docs/storage-format.md` is the normative
//! description; this module is one implementation of it.
//!
//! The decoder reads untrusted bytes: it never allocates from a length it has
//! not checked against the bytes actually present, and it never panics.

use crate::record::{Record, RecordParts};

/// The four bytes every frame starts with.
pub const FRAME_MAGIC: [u8; 4] = *b"MLR1";
/// Magic, payload length and CRC.
pub const FRAME_HEADER_BYTES: usize = 12;
/// timestamp, key_len, value_len, header_count, offset, durable_below.
pub const PAYLOAD_FIXED_BYTES: usize = 8 + 4 + 4 + 4 + 8 + 8;
/// The trailer: offset and durable_below.
pub const TRAILER_BYTES: usize = 16;
/// The smallest possible frame: an empty key, value and header list.
pub const FRAME_BYTES_MIN: usize = FRAME_HEADER_BYTES + PAYLOAD_FIXED_BYTES;
/// A format limit, independent of configuration, so that any file written by a
/// valid configuration stays readable by any other: a larger length is damage.
pub const FRAME_PAYLOAD_BYTES_MAX: usize = 64 << 20;

/// Why bytes do not form a valid frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The bytes end before the frame does (a torn tail looks like this).
    #[error("incomplete frame: {needed} bytes needed, {available} available")]
    Incomplete { needed: u64, available: u64 },
    /// The first four bytes are not the frame magic.
    #[error("bad frame magic")]
    BadMagic,
    /// The payload length is outside what the format allows.
    #[error("payload length {length} outside the format's bounds")]
    LengthOutOfRange { length: u64 },
    /// The payload does not match its checksum.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadCrc { stored: u32, computed: u32 },
    /// The checksum matches but the payload's inner lengths are inconsistent.
    #[error("malformed payload: {reason}")]
    Malformed { reason: &'static str },
    /// A valid frame carries an offset other than the one its position requires.
    #[error("frame carries offset {found}, expected {expected}")]
    OffsetMismatch { found: u64, expected: u64 },
}

/// A decoded frame borrowing the bytes it was decoded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameView<'a> {
    pub offset: u64,
    /// The offset of the first record written by the same write and fdatasync.
    /// Recovery uses it to tell a torn last flush from damage in the middle.
    pub durable_below: u64,
    pub timestamp_ms: u64,
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub headers: Vec<(&'a str, &'a [u8])>,
}

impl FrameView<'_> {
    /// Copies the borrowed bytes into an owned record.
    pub fn to_record(&self) -> Record {
        Record {
            timestamp_ms: self.timestamp_ms,
            key: self.key.to_vec(),
            value: self.value.to_vec(),
            headers: self
                .headers
                .iter()
                .map(|(name, value)| ((*name).to_owned(), value.to_vec()))
                .collect(),
        }
    }
}

/// The payload size of a record's frame, or `None` if it overflows `usize`.
pub fn payload_len(record: &(impl RecordParts + ?Sized)) -> Option<usize> {
    let mut len = PAYLOAD_FIXED_BYTES
        .checked_add(record.key().len())?
        .checked_add(record.value().len())?;
    for i in 0..record.header_count() {
        let (name, value) = record.header(i);
        len = len
            .checked_add(8)?
            .checked_add(name.len())?
            .checked_add(value.len())?;
    }
    Some(len)
}

/// Appends a complete frame for `record` to `buf`.
///
/// The caller must have checked `payload_len(record) <= FRAME_PAYLOAD_BYTES_MAX`;
/// that bound is what makes every inner length fit its `u32` field.
pub fn encode(buf: &mut Vec<u8>, offset: u64, durable_below: u64, record: &Record) {
    let start = buf.len();
    let body_crc = encode_unsealed(buf, record);
    seal_frame(&mut buf[start..], offset, durable_below, body_crc);
}

/// Appends a frame whose trailer and CRC are still zero, and returns the
/// checksum state over its body.
///
/// The store encodes a batch outside its segment lock with this and finishes
/// each frame with [`seal_frame`] once the flush that writes it is known.
pub(crate) fn encode_unsealed(
    buf: &mut Vec<u8>,
    record: &(impl RecordParts + ?Sized),
) -> crc32fast::Hasher {
    let payload = payload_len(record).unwrap_or(usize::MAX);
    assert!(
        payload <= FRAME_PAYLOAD_BYTES_MAX,
        "record size was not checked"
    );
    buf.reserve(FRAME_HEADER_BYTES + payload);
    buf.extend_from_slice(&FRAME_MAGIC);
    buf.extend_from_slice(&len_u32(payload).to_le_bytes());
    buf.extend_from_slice(&0u32.to_le_bytes()); // crc
    let body_start = buf.len();
    buf.extend_from_slice(&record.timestamp_ms().to_le_bytes());
    put_bytes(buf, record.key());
    put_bytes(buf, record.value());
    buf.extend_from_slice(&len_u32(record.header_count()).to_le_bytes());
    for i in 0..record.header_count() {
        let (name, value) = record.header(i);
        put_bytes(buf, name.as_bytes());
        put_bytes(buf, value);
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&buf[body_start..]);
    buf.extend_from_slice(&[0u8; TRAILER_BYTES]);
    hasher
}

/// Writes the trailer of one frame produced by [`encode_unsealed`] and its
/// CRC, extending `body_crc` (that call's result) over the trailer. `frame`
/// must be exactly that frame's bytes.
pub(crate) fn seal_frame(
    frame: &mut [u8],
    offset: u64,
    durable_below: u64,
    body_crc: crc32fast::Hasher,
) {
    assert!(
        frame.len() >= FRAME_BYTES_MIN,
        "frame shorter than the minimum"
    );
    assert!(
        durable_below <= offset,
        "a flush starts at or before its records"
    );
    let trailer_start = frame.len() - TRAILER_BYTES;
    frame[trailer_start..trailer_start + 8].copy_from_slice(&offset.to_le_bytes());
    frame[trailer_start + 8..].copy_from_slice(&durable_below.to_le_bytes());
    let mut hasher = body_crc;
    hasher.update(&frame[trailer_start..]);
    let crc = hasher.finalize();
    debug_assert_eq!(crc, crc32fast::hash(&frame[FRAME_HEADER_BYTES..]));
    frame[8..12].copy_from_slice(&crc.to_le_bytes());
}

/// Reads the payload length from a frame header, checking only the magic and
/// the format bounds. Scanners use it to know how many bytes to fetch.
pub fn peek_len(header: &[u8]) -> Result<usize, FrameError> {
    if header.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Incomplete {
            needed: FRAME_HEADER_BYTES as u64,
            available: header.len() as u64,
        });
    }
    if header[0..4] != FRAME_MAGIC {
        return Err(FrameError::BadMagic);
    }
    let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
    if !(PAYLOAD_FIXED_BYTES..=FRAME_PAYLOAD_BYTES_MAX).contains(&len) {
        return Err(FrameError::LengthOutOfRange { length: len as u64 });
    }
    Ok(FRAME_HEADER_BYTES + len)
}

/// Decodes the frame at the start of `bytes`, returning it and its length.
///
/// Any input, however malformed, yields an error rather than a panic, and the
/// only allocation (the header list) is bounded by the bytes present.
pub fn decode(bytes: &[u8]) -> Result<(FrameView<'_>, usize), FrameError> {
    let total = peek_len(bytes)?;
    if bytes.len() < total {
        return Err(FrameError::Incomplete {
            needed: total as u64,
            available: bytes.len() as u64,
        });
    }
    let stored = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    let payload = &bytes[FRAME_HEADER_BYTES..total];
    let computed = crc32fast::hash(payload);
    if stored != computed {
        return Err(FrameError::BadCrc { stored, computed });
    }
    let view = decode_payload(payload)?;
    Ok((view, total))
}

fn decode_payload(payload: &[u8]) -> Result<FrameView<'_>, FrameError> {
    let mut cur = Cursor { bytes: payload };
    let timestamp_ms = cur.u64()?;
    let key = cur.bytes()?;
    let value = cur.bytes()?;
    let header_count = cur.u32()? as usize;
    // Each header takes at least eight bytes, so a count the remaining bytes
    // (less the trailer) cannot hold is rejected before it sizes an allocation.
    if header_count > cur.bytes.len().saturating_sub(TRAILER_BYTES) / 8 {
        return Err(FrameError::Malformed {
            reason: "header count exceeds the payload",
        });
    }
    let mut headers = Vec::with_capacity(header_count);
    for _ in 0..header_count {
        let name = std::str::from_utf8(cur.bytes()?).map_err(|_| FrameError::Malformed {
            reason: "header name is not utf-8",
        })?;
        headers.push((name, cur.bytes()?));
    }
    let offset = cur.u64()?;
    let durable_below = cur.u64()?;
    if !cur.bytes.is_empty() {
        return Err(FrameError::Malformed {
            reason: "bytes between the headers and the trailer",
        });
    }
    if durable_below > offset {
        return Err(FrameError::Malformed {
            reason: "flush starts after its own record",
        });
    }
    Ok(FrameView {
        offset,
        durable_below,
        timestamp_ms,
        key,
        value,
        headers,
    })
}

struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.bytes.len() < n {
            return Err(FrameError::Malformed {
                reason: "inner length exceeds the payload",
            });
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, FrameError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, FrameError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn bytes(&mut self) -> Result<&'a [u8], FrameError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

fn len_u32(len: usize) -> u32 {
    // Bounded by FRAME_PAYLOAD_BYTES_MAX, checked by the caller of encode.
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn put_bytes(buf: &mut Vec<u8>, bytes: &[u8]) {
    buf.extend_from_slice(&len_u32(bytes.len()).to_le_bytes());
    buf.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            timestamp_ms: 1_700_000_000_000,
            key: b"key".to_vec(),
            value: b"value".to_vec(),
            headers: vec![("trace".to_owned(), b"abc".to_vec())],
        }
    }

    #[test]
    fn encoded_frame_decodes_to_the_same_record_and_offsets() {
        let mut buf = Vec::new();
        encode(&mut buf, 7, 5, &sample());
        let (view, len) = decode(&buf).unwrap();
        assert_eq!(len, buf.len());
        assert_eq!(view.offset, 7);
        assert_eq!(view.durable_below, 5);
        assert_eq!(view.to_record(), sample());
    }

    #[test]
    fn the_checksum_is_crc32_iso_hdlc_as_documented() {
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn frame_size_is_header_plus_payload_len() {
        let mut buf = Vec::new();
        encode(&mut buf, 0, 0, &sample());
        assert_eq!(
            buf.len(),
            FRAME_HEADER_BYTES + payload_len(&sample()).unwrap()
        );
    }

    #[test]
    fn empty_record_is_the_minimum_frame() {
        let mut buf = Vec::new();
        encode(&mut buf, 0, 0, &Record::default());
        assert_eq!(buf.len(), FRAME_BYTES_MIN);
        assert!(decode(&buf).is_ok());
    }

    #[test]
    fn any_flipped_bit_is_detected() {
        let mut buf = Vec::new();
        encode(&mut buf, 3, 3, &sample());
        for bit in 0..buf.len() * 8 {
            let mut copy = buf.clone();
            copy[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&copy).is_err(), "flip of bit {bit} went unnoticed");
        }
    }

    #[test]
    fn truncated_frame_is_incomplete() {
        let mut buf = Vec::new();
        encode(&mut buf, 0, 0, &sample());
        for cut in 0..buf.len() {
            match decode(&buf[..cut]) {
                Err(FrameError::Incomplete { .. }) => {}
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
    }

    #[test]
    fn huge_length_is_rejected_without_allocating() {
        let mut buf = FRAME_MAGIC.to_vec();
        buf.extend_from_slice(&u32::MAX.to_le_bytes());
        buf.extend_from_slice(&[0; 8]);
        assert_eq!(
            decode(&buf).unwrap_err(),
            FrameError::LengthOutOfRange {
                length: u64::from(u32::MAX)
            }
        );
    }

    #[test]
    fn header_count_beyond_payload_is_malformed_even_with_a_valid_crc() {
        let mut buf = Vec::new();
        encode(&mut buf, 0, 0, &Record::default());
        let count_at = buf.len() - TRAILER_BYTES - 4;
        buf[count_at..count_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let crc = crc32fast::hash(&buf[FRAME_HEADER_BYTES..]);
        buf[8..12].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(decode(&buf), Err(FrameError::Malformed { .. })));
    }
}
