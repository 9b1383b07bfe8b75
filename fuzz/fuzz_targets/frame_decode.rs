//! Fuzzes the record frame decoder with arbitrary bytes.
//!
//! Run (nightly toolchain and cargo-fuzz required):
//!     cargo install cargo-fuzz
//!     cd fuzz && cargo +nightly fuzz run frame_decode -- -max_total_time=300
//! The property: decoding never panics, and whatever decodes re-encodes to
//! exactly the bytes it was decoded from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use malachi_storage::frame;

fuzz_target!(|data: &[u8]| {
    if let Ok((view, len)) = frame::decode(data) {
        let mut again = Vec::new();
        frame::encode(&mut again, view.offset, view.flush_first_offset, &view.to_record());
        assert_eq!(&again[..], &data[..len]);
    }
});
