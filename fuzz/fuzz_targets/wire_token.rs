#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| malachi_fuzz_bodies::wire_token(data));
