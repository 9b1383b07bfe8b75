//! Malachi's storage layer: segment copies as CRC-framed record logs on local
//! disk, with a sparse index sidecar, seal and fence markers, group commit
//! over a pool of sync threads, crash recovery and a read-only verify.
//!
//! It knows nothing of actors, raft or the network, and it runs on no async
//! runtime: an append returns an [`AppendTicket`] that is both a
//! `std::future::Future` and a blocking `wait()`. The on-disk format is
//! described byte by byte in `docs/storage-format.md`. Its benchmark lives in
//! the `malachi-bench` crate.

mod direct;
mod error;
mod file_store;
pub mod frame;
pub mod index;
pub mod marker;
mod memory;
mod record;
mod removal;
pub mod scan;
mod store;
mod ticket;

pub use error::StorageError;
pub use file_store::{FileStore, StoreStats};
pub use frame::{FrameError, FrameView};
pub use memory::{CrashReport, MemoryStore};
pub use record::{Record, RecordBatch, RecordParts, StoredRecord};
pub use scan::{BadFrame, LaterFrame};
pub use store::{
    FLUSH_PIPELINE_DEPTH_MAX, FenceInfo, FrameRun, Loss, OrderEpoch, Recovery, SealInfo,
    SealPolicy, SealReason, SegmentId, SegmentInfo, SegmentStore, StoreConfig, VerifyReport,
};
pub use ticket::AppendTicket;
