//! A broker's segment copies on disk, as the tests that compare copies
//! byte for byte read them (failover, healing, rebuild).

use std::path::{Path, PathBuf};

/// The log file of segment `id` in a broker's data dir.
pub fn segment_log(data_dir: &Path, id: u64) -> PathBuf {
    data_dir.join("segments").join(format!("{id:020}.log"))
}

/// The whole frames at the start of a copy's log (a direct write pads the
/// last block), and how many.
pub fn frames(data_dir: &Path, id: u64) -> (Vec<u8>, u64) {
    let bytes = std::fs::read(segment_log(data_dir, id)).unwrap_or_default();
    let (mut at, mut n) = (0, 0u64);
    while let Ok((_, len)) = malachi_storage::frame::decode(&bytes[at..]) {
        at += len;
        n += 1;
    }
    (bytes[..at].to_vec(), n)
}
