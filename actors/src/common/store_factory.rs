//! Which segment store a broker runs on (ADR 0131): a `FileStore` over
//! `data_dir/segments` unless the embedder (a test) gives another.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use malachi_storage::{FileStore, SegmentStore, StorageError, StoreConfig};

type Open = dyn Fn(&Path, StoreConfig) -> Result<Arc<dyn SegmentStore>, StorageError> + Send + Sync;

/// Opens the broker's segment store at start, given the segments directory
/// and the store settings of the broker's configuration.
#[derive(Clone)]
pub struct StoreFactory(Arc<Open>);

impl StoreFactory {
    /// A factory of the caller's own.
    pub fn new(
        open: impl Fn(&Path, StoreConfig) -> Result<Arc<dyn SegmentStore>, StorageError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        StoreFactory(Arc::new(open))
    }

    /// The same store at every start: a broker restarted on it finds what
    /// the last one left (a memory store after its crash, say).
    pub fn shared(store: Arc<dyn SegmentStore>) -> Self {
        StoreFactory::new(move |_, _| Ok(Arc::clone(&store)))
    }

    pub(crate) fn open(
        &self,
        dir: &Path,
        config: StoreConfig,
    ) -> Result<Arc<dyn SegmentStore>, StorageError> {
        (self.0)(dir, config)
    }
}

impl Default for StoreFactory {
    /// A `FileStore` over the directory.
    fn default() -> Self {
        StoreFactory::new(|dir, config| Ok(Arc::new(FileStore::open_dir(dir, config)?)))
    }
}

impl fmt::Debug for StoreFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StoreFactory")
    }
}
