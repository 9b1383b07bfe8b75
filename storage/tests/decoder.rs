#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The frame decoder over arbitrary bytes: errors, never panics.

use malachi_storage::Record;
use malachi_storage::frame::{self, FRAME_HEADER_BYTES};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = frame::decode(&bytes);
    }

    #[test]
    fn arbitrary_bytes_behind_a_valid_magic_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = frame::FRAME_MAGIC.to_vec();
        bytes.extend(tail);
        let _ = frame::decode(&bytes);
    }

    #[test]
    fn a_mutated_valid_frame_never_panics_and_never_decodes_to_a_different_record(
        key in proptest::collection::vec(any::<u8>(), 0..16),
        value in proptest::collection::vec(any::<u8>(), 0..64),
        at in any::<usize>(),
        byte in any::<u8>(),
    ) {
        let record = Record { timestamp_ms: 9, key, value, headers: vec![("a".into(), vec![1])] };
        let mut bytes = Vec::new();
        frame::encode(&mut bytes, 3, 1, &record);
        let at = at % bytes.len();
        bytes[at] = byte;
        if let Ok((view, len)) = frame::decode(&bytes) {
            // Only a mutation that changed nothing can decode.
            prop_assert_eq!(len, bytes.len());
            prop_assert_eq!(view.to_record(), record);
        }
    }

    #[test]
    fn a_length_field_with_a_valid_crc_cannot_make_the_decoder_over_read(
        inner in any::<u32>(),
        value in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut bytes = Vec::new();
        frame::encode(&mut bytes, 0, 0, &Record::new(0, "k", value));
        // Overwrite the key length and fix the CRC, as an adversary could.
        let key_len_at = FRAME_HEADER_BYTES + 8;
        bytes[key_len_at..key_len_at + 4].copy_from_slice(&inner.to_le_bytes());
        let crc = crc32fast::hash(&bytes[FRAME_HEADER_BYTES..]);
        bytes[8..12].copy_from_slice(&crc.to_le_bytes());
        let _ = frame::decode(&bytes);
    }
}
