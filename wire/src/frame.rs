//! Framing: how requests and responses are delimited on a TCP stream.
//!
//! ```text
//! request:  len:u32 | api_key:u16 | correlation_id:u32 | payload
//! response: len:u32 | correlation_id:u32 | error_code:u16 | payload
//! ```
//!
//! All integers are big-endian. `len` counts the bytes AFTER the `len` field
//! (the 6 header bytes plus the payload), so the smallest legal `len` is 6.
//! The decoder checks `len` against `frame_bytes_max` (and against the 6 byte
//! minimum) as soon as the 4 length bytes are in, and reserves at most
//! [`FRAME_READ_CHUNK_BYTES`] ahead of the bytes that arrived (the buffer's
//! own doubling aside), never the declared length. A decode error leaves the stream out of
//! sync: the connection must be closed after it.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::error::{ErrorCode, WireError};

/// Bytes of the `len` field.
pub const LEN_BYTES: usize = 4;
/// Bytes of a request header after `len`: api_key and correlation_id.
pub const REQUEST_HEADER_BYTES: usize = 6;
/// Bytes of a response header after `len`: correlation_id and error_code.
pub const RESPONSE_HEADER_BYTES: usize = 6;
/// The default limit on `len` (16 MiB).
pub const FRAME_BYTES_MAX_DEFAULT: usize = 16 * 1024 * 1024;
/// How far ahead of the bytes received a decoder reserves buffer space for a
/// frame still arriving (64 KiB): the buffer of a partial frame is bounded by
/// the bytes that arrived plus this, whatever `len` declared.
pub const FRAME_READ_CHUNK_BYTES: usize = 64 * 1024;

/// One request as it travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFrame {
    /// The raw api key: an unknown or reserved number still frames correctly,
    /// so a server can answer it with `unsupported_api` and keep the connection.
    pub api_key: u16,
    pub correlation_id: u32,
    pub payload: Bytes,
}

/// One response (or subscription push) as it travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseFrame {
    pub correlation_id: u32,
    pub error_code: ErrorCode,
    pub payload: Bytes,
}

/// Read the declared length and check it before anything is allocated.
/// `Ok(None)` means more bytes are needed.
fn declared_len(
    src: &BytesMut,
    header_bytes: usize,
    frame_bytes_max: usize,
) -> Result<Option<usize>, WireError> {
    if src.len() < LEN_BYTES {
        return Ok(None);
    }
    let declared = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
    if declared > frame_bytes_max {
        return Err(WireError::FrameTooLarge {
            declared_bytes: declared,
            frame_bytes_max,
        });
    }
    if declared < header_bytes {
        return Err(WireError::FrameTooShort {
            declared_bytes: declared,
            header_bytes,
        });
    }
    Ok(Some(declared))
}

/// Take one whole frame body (after `len`) off `src`, or ask for more bytes.
fn take_frame(
    src: &mut BytesMut,
    header_bytes: usize,
    frame_bytes_max: usize,
) -> Result<Option<Bytes>, WireError> {
    let Some(declared) = declared_len(src, header_bytes, frame_bytes_max)? else {
        return Ok(None);
    };
    let total = LEN_BYTES + declared;
    if src.len() < total {
        // Reserve at most one read chunk ahead, never the declared length:
        // a peer that declares 16 MiB and sends 4 KiB must cost about 4 KiB,
        // so memory grows with the bytes that arrived, not with a length
        // someone declared. The buffer grows chunk by chunk as bytes come.
        src.reserve((total - src.len()).min(FRAME_READ_CHUNK_BYTES));
        return Ok(None);
    }
    src.advance(LEN_BYTES);
    Ok(Some(src.split_to(declared).freeze()))
}

fn check_outgoing(
    payload: usize,
    header_bytes: usize,
    frame_bytes_max: usize,
) -> Result<u32, WireError> {
    let declared = header_bytes + payload;
    if declared > frame_bytes_max {
        return Err(WireError::FrameTooLarge {
            declared_bytes: declared,
            frame_bytes_max,
        });
    }
    u32::try_from(declared).map_err(|_| WireError::FrameTooLarge {
        declared_bytes: declared,
        frame_bytes_max,
    })
}

/// The client side: encodes requests, decodes responses.
#[derive(Debug, Clone, Copy)]
pub struct ClientCodec {
    frame_bytes_max: usize,
}

/// The server side: decodes requests, encodes responses.
#[derive(Debug, Clone, Copy)]
pub struct ServerCodec {
    frame_bytes_max: usize,
}

impl ClientCodec {
    pub fn new(frame_bytes_max: usize) -> ClientCodec {
        ClientCodec { frame_bytes_max }
    }
}

impl Default for ClientCodec {
    fn default() -> ClientCodec {
        ClientCodec::new(FRAME_BYTES_MAX_DEFAULT)
    }
}

impl ServerCodec {
    pub fn new(frame_bytes_max: usize) -> ServerCodec {
        ServerCodec { frame_bytes_max }
    }
}

impl Default for ServerCodec {
    fn default() -> ServerCodec {
        ServerCodec::new(FRAME_BYTES_MAX_DEFAULT)
    }
}

/// Append a request frame to `dst`.
pub fn encode_request(
    frame: &RequestFrame,
    dst: &mut BytesMut,
    frame_bytes_max: usize,
) -> Result<(), WireError> {
    let declared = check_outgoing(frame.payload.len(), REQUEST_HEADER_BYTES, frame_bytes_max)?;
    dst.reserve(LEN_BYTES + declared as usize);
    dst.put_u32(declared);
    dst.put_u16(frame.api_key);
    dst.put_u32(frame.correlation_id);
    dst.put_slice(&frame.payload);
    Ok(())
}

/// Append a response frame to `dst`.
pub fn encode_response(
    frame: &ResponseFrame,
    dst: &mut BytesMut,
    frame_bytes_max: usize,
) -> Result<(), WireError> {
    let declared = check_outgoing(frame.payload.len(), RESPONSE_HEADER_BYTES, frame_bytes_max)?;
    dst.reserve(LEN_BYTES + declared as usize);
    dst.put_u32(declared);
    dst.put_u32(frame.correlation_id);
    dst.put_u16(frame.error_code.code());
    dst.put_slice(&frame.payload);
    Ok(())
}

/// A response frame held as three pieces that, written in order, are
/// byte-for-byte what [`encode_response`] appends: the 10 header bytes, the
/// control map, and the record batch block. A fetch response carries up to
/// 4 MiB of block, so keeping it as its own (shared) `Bytes` lets a server
/// hand it to the socket without copying it into a frame buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseParts {
    /// `len | correlation_id | error_code`.
    pub head: Bytes,
    /// The control map (or the whole payload of a response without a block).
    pub control: Bytes,
    /// The record batch block, for responses that carry one.
    pub block: Option<Bytes>,
}

impl ResponseParts {
    /// Bytes of the whole frame, `len` field included.
    pub fn total_len(&self) -> usize {
        self.head.len() + self.control.len() + self.block.as_ref().map_or(0, Bytes::len)
    }

    /// The pieces chained in wire order, for a (vectored) `write_all_buf`.
    pub fn into_buf(self) -> impl Buf {
        self.head
            .chain(self.control)
            .chain(self.block.unwrap_or_default())
    }
}

/// Build a response frame as [`ResponseParts`]. The frame limit is checked
/// first, so an oversized response is refused before any of it is written.
pub fn encode_response_parts(
    correlation_id: u32,
    error_code: ErrorCode,
    control: Bytes,
    block: Option<Bytes>,
    frame_bytes_max: usize,
) -> Result<ResponseParts, WireError> {
    let payload = control.len() + block.as_ref().map_or(0, Bytes::len);
    let declared = check_outgoing(payload, RESPONSE_HEADER_BYTES, frame_bytes_max)?;
    let mut head = BytesMut::with_capacity(LEN_BYTES + RESPONSE_HEADER_BYTES);
    head.put_u32(declared);
    head.put_u32(correlation_id);
    head.put_u16(error_code.code());
    let parts = ResponseParts {
        head: head.freeze(),
        control,
        block,
    };
    assert_eq!(parts.total_len(), LEN_BYTES + declared as usize);
    Ok(parts)
}

/// Split a request frame body (after `len`) into its fields.
fn parse_request(mut body: Bytes) -> RequestFrame {
    debug_assert!(body.len() >= REQUEST_HEADER_BYTES);
    let api_key = body.get_u16();
    let correlation_id = body.get_u32();
    RequestFrame {
        api_key,
        correlation_id,
        payload: body,
    }
}

/// Split a response frame body (after `len`) into its fields.
fn parse_response(mut body: Bytes) -> ResponseFrame {
    debug_assert!(body.len() >= RESPONSE_HEADER_BYTES);
    let correlation_id = body.get_u32();
    let error_code = ErrorCode::from_code(body.get_u16());
    ResponseFrame {
        correlation_id,
        error_code,
        payload: body,
    }
}

impl Encoder<RequestFrame> for ClientCodec {
    type Error = WireError;

    fn encode(&mut self, frame: RequestFrame, dst: &mut BytesMut) -> Result<(), WireError> {
        encode_request(&frame, dst, self.frame_bytes_max)
    }
}

impl Decoder for ClientCodec {
    type Item = ResponseFrame;
    type Error = WireError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<ResponseFrame>, WireError> {
        Ok(take_frame(src, RESPONSE_HEADER_BYTES, self.frame_bytes_max)?.map(parse_response))
    }
}

impl Encoder<ResponseFrame> for ServerCodec {
    type Error = WireError;

    fn encode(&mut self, frame: ResponseFrame, dst: &mut BytesMut) -> Result<(), WireError> {
        encode_response(&frame, dst, self.frame_bytes_max)
    }
}

impl Decoder for ServerCodec {
    type Item = RequestFrame;
    type Error = WireError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<RequestFrame>, WireError> {
        Ok(take_frame(src, REQUEST_HEADER_BYTES, self.frame_bytes_max)?.map(parse_request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_survives_encode_then_decode() {
        let frame = RequestFrame {
            api_key: 10,
            correlation_id: 7,
            payload: Bytes::from_static(b"abc"),
        };
        let mut buf = BytesMut::new();
        ClientCodec::default()
            .encode(frame.clone(), &mut buf)
            .unwrap();
        assert_eq!(&buf[..4], &9u32.to_be_bytes());
        let decoded = ServerCodec::default().decode(&mut buf).unwrap().unwrap();
        assert_eq!(decoded, frame);
        assert!(buf.is_empty());
    }

    #[test]
    fn a_response_survives_encode_then_decode_and_unknown_codes_stay_typed() {
        let frame = ResponseFrame {
            correlation_id: 9,
            error_code: ErrorCode::Unknown(4242),
            payload: Bytes::new(),
        };
        let mut buf = BytesMut::new();
        ServerCodec::default()
            .encode(frame.clone(), &mut buf)
            .unwrap();
        let decoded = ClientCodec::default().decode(&mut buf).unwrap().unwrap();
        assert_eq!(decoded, frame);
    }

    #[test]
    fn a_partial_frame_waits_for_more_bytes() {
        let mut buf = BytesMut::new();
        buf.put_u32(10);
        buf.put_u16(0);
        assert!(ServerCodec::default().decode(&mut buf).unwrap().is_none());
        buf.put_u32(1);
        buf.put_u32(0xdead_beef);
        let frame = ServerCodec::default().decode(&mut buf).unwrap().unwrap();
        assert_eq!(frame.payload.as_ref(), &0xdead_beefu32.to_be_bytes());
    }

    #[test]
    fn a_declared_length_over_the_limit_is_refused_before_the_buffer_grows() {
        let mut buf = BytesMut::with_capacity(8);
        buf.put_u32(u32::MAX);
        let capacity = buf.capacity();
        let err = ServerCodec::new(1024).decode(&mut buf).unwrap_err();
        assert!(matches!(
            err,
            WireError::FrameTooLarge { declared_bytes, frame_bytes_max: 1024 }
                if declared_bytes == u32::MAX as usize
        ));
        assert_eq!(buf.capacity(), capacity, "the decoder reserved memory");
        let err = ClientCodec::new(1024).decode(&mut buf).unwrap_err();
        assert!(matches!(err, WireError::FrameTooLarge { .. }));
        assert_eq!(buf.capacity(), capacity, "the decoder reserved memory");
    }

    #[test]
    fn a_partial_frame_reserves_with_the_bytes_received_not_the_declared_length() {
        // Regression: 300 connections that each sent 4 MiB of a declared
        // 16 MiB frame held 16 MiB each, because the decoder reserved the
        // declared length as soon as the 4-byte header arrived.
        let declared = 16 * 1024 * 1024 - 4;
        let mut buf = BytesMut::new();
        buf.put_u32(declared as u32);
        buf.put_u16(10);
        buf.put_u32(7);
        let mut codec = ServerCodec::default();
        let mut received = 10;
        while received < 1024 * 1024 {
            assert!(codec.decode(&mut buf).unwrap().is_none());
            // BytesMut grows by doubling, so twice what arrived plus a chunk.
            assert!(
                buf.capacity() <= 2 * (buf.len() + FRAME_READ_CHUNK_BYTES),
                "capacity {} for {} bytes received",
                buf.capacity(),
                buf.len()
            );
            let chunk = vec![0xabu8; 4096.min(buf.capacity() - buf.len()).max(1)];
            buf.extend_from_slice(&chunk);
            received += chunk.len();
        }
        assert!(buf.capacity() < 4 * 1024 * 1024, "{}", buf.capacity());
        // The frame still decodes whole once every byte is in.
        buf.extend_from_slice(&vec![0u8; LEN_BYTES + declared - buf.len()]);
        let frame = codec.decode(&mut buf).unwrap().unwrap();
        assert_eq!(frame.payload.len(), declared - REQUEST_HEADER_BYTES);
    }

    #[test]
    fn a_declared_length_shorter_than_the_header_is_refused() {
        let mut buf = BytesMut::new();
        buf.put_u32(5);
        assert!(matches!(
            ServerCodec::default().decode(&mut buf),
            Err(WireError::FrameTooShort {
                declared_bytes: 5,
                header_bytes: 6
            })
        ));
    }

    #[test]
    fn an_outgoing_frame_over_the_limit_is_refused_and_nothing_is_written() {
        let frame = RequestFrame {
            api_key: 10,
            correlation_id: 1,
            payload: Bytes::from(vec![0u8; 100]),
        };
        let mut buf = BytesMut::new();
        assert!(matches!(
            ClientCodec::new(64).encode(frame, &mut buf),
            Err(WireError::FrameTooLarge {
                declared_bytes: 106,
                frame_bytes_max: 64
            })
        ));
        assert!(buf.is_empty());
    }

    #[test]
    fn response_parts_concatenated_equal_the_encoded_fetch_response() {
        use crate::batch::BatchBuilder;
        use crate::batch::Record;
        use crate::messages::{FetchResponse, Message};
        let mut builder = BatchBuilder::new(1024 * 1024);
        builder.push(&Record::new("key", "value-one")).unwrap();
        builder.push(&Record::new("", "value-two")).unwrap();
        let response = FetchResponse {
            next_cursor: "c".repeat(40),
            records: builder.finish(),
        };
        let (control, block) = response.encode_parts().unwrap();
        assert!(block.is_some());
        let parts =
            encode_response_parts(5, ErrorCode::None, control, block, FRAME_BYTES_MAX_DEFAULT)
                .unwrap();
        let mut old = BytesMut::new();
        let frame = ResponseFrame {
            correlation_id: 5,
            error_code: ErrorCode::None,
            payload: response.encode().unwrap(),
        };
        encode_response(&frame, &mut old, FRAME_BYTES_MAX_DEFAULT).unwrap();
        assert_eq!(parts.total_len(), old.len());
        let mut buf = parts.into_buf();
        let joined = buf.copy_to_bytes(buf.remaining());
        assert_eq!(joined, old.freeze());
    }

    #[test]
    fn response_parts_over_the_limit_are_refused() {
        let err = encode_response_parts(
            1,
            ErrorCode::None,
            Bytes::from(vec![0u8; 10]),
            Some(Bytes::from(vec![0u8; 60])),
            64,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            WireError::FrameTooLarge {
                declared_bytes: 76,
                frame_bytes_max: 64
            }
        ));
    }
}
