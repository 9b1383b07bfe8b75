//! Fuzzes every decoder of the wire protocol with arbitrary bytes: the server
//! and client frame codecs, then each frame's payload as the request (or
//! response) its api key names, then the bytes as a record batch block.
//!
//! Run (nightly toolchain and cargo-fuzz required):
//!     cargo install cargo-fuzz
//!     cargo +nightly fuzz run --fuzz-dir fuzz-wire decode_frame -- -max_total_time=300
//! (from the repository root).
//! The property: no decoder panics, and whatever decodes re-encodes to a
//! payload that decodes to the same value.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use malachi_wire::{ApiKey, ClientCodec, ErrorBody, Message, RecordBatch, Request, Response, ServerCodec};
use tokio_util::codec::Decoder;

const FRAME_BYTES_MAX: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let mut buffer = BytesMut::from(data);
    while let Ok(Some(frame)) = ServerCodec::new(FRAME_BYTES_MAX).decode(&mut buffer) {
        if let Ok(request) = Request::decode(frame.api_key, frame.payload.clone()) {
            let again = request.encode().expect("a decoded request re-encodes");
            let decoded = Request::decode(frame.api_key, again).expect("and decodes again");
            assert_eq!(decoded, request);
        }
    }
    let mut buffer = BytesMut::from(data);
    while let Ok(Some(frame)) = ClientCodec::new(FRAME_BYTES_MAX).decode(&mut buffer) {
        for key in ApiKey::ALL {
            if let Ok(response) = Response::decode(key, frame.payload.clone()) {
                let again = response.encode().expect("a decoded response re-encodes");
                assert_eq!(Response::decode(key, again).expect("and decodes again"), response);
            }
        }
        let _ = ErrorBody::decode(frame.payload.clone());
    }
    if let Ok(batch) = RecordBatch::from_block(Bytes::copy_from_slice(data)) {
        let records = batch.records();
        assert_eq!(records.len(), batch.count() as usize);
        let again = RecordBatch::from_records(&records, usize::MAX).expect("records re-encode");
        assert_eq!(again.block(), batch.block());
    }
});
