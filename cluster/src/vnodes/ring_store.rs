//! `RingStore`: the ring this broker holds, in memory and on disk. The
//! ring it believes current (only ever newer), the ring it routes by, and
//! the marker that a group moved on or off this broker. What the ring's
//! own raft group is asked, and how a newer ring is adopted (which opens
//! groups too), is the host's: `ring_group.rs`.

use super::*;

/// The ring a broker kept on disk, if it reads back whole.
pub(super) fn load_ring(path: &Path) -> Option<Ring> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the kept ring is unreadable; fetching it");
            return None;
        }
    };
    let body = match fsio::decode_tagged(RING_FILE_MAGIC, &bytes, RING_FILE_BYTES_MAX) {
        Ok(body) => body,
        Err(e) => {
            // Only a cache of the ring group's ring: start from the fresh
            // ring and fetch the current one.
            tracing::warn!(path = %path.display(), error = %e, "the kept ring is damaged; fetching it");
            return None;
        }
    };
    match Ring::decode(body) {
        Ok(ring) => Some(ring),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the kept ring is damaged; fetching it");
            None
        }
    }
}

/// Where a broker keeps the newest ring it has learned.
pub(super) const RING_FILE: &str = "ring.current";

/// Present once a group moved on or off this broker (ADR 0104).
pub(super) const MOVED_FILE: &str = "groups-moved";

/// The magic tag of the ring file.
pub(super) const RING_FILE_MAGIC: &[u8; 8] = b"MALRING1";

/// The largest ring file read back (256 vnodes encode to a few KiB).
pub(super) const RING_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// The first and the longest pause of the background ring fetch.
pub(super) const RING_SYNC_BACKOFF_MIN_MS: u64 = 100;

pub(super) const RING_SYNC_BACKOFF_MAX_MS: u64 = 2_000;

/// The ring's group has its voters chosen like a vnode's, under a tag no
/// vnode id reaches (`VNODES_MAX` is far below it).
pub(super) const RING_VOTERS_TAG: VnodeId = VnodeId(u32::from_be_bytes(*b"ring"));

/// The ring this broker holds: part of `VnodeHost`.
#[derive(Debug)]
pub struct RingStore {
    node_id: u64,
    data_dir: PathBuf,
    /// The ring this broker believes current: the newest it has learned.
    current: RwLock<Arc<Ring>>,
    /// The ring requests are routed by; replaced by `current` on a
    /// misrouted answer. Only tests set it apart from `current`, to play a
    /// broker with a stale ring.
    routing: RwLock<Arc<Ring>>,
    /// Whether `MOVED_FILE` is written (and the lock its writers take).
    moved_marked: tokio::sync::Mutex<bool>,
}

impl RingStore {
    /// The ring kept in `data_dir`, else a fresh one of `vnode_count`.
    pub(super) fn load(
        node_id: u64,
        data_dir: &Path,
        vnode_count: u32,
    ) -> Result<RingStore, GroupError> {
        let fresh =
            Ring::new(vnode_count).map_err(|e| GroupError::config(ConfigProblem::Ring(e)))?;
        let ring = Arc::new(load_ring(&data_dir.join(RING_FILE)).unwrap_or(fresh));
        Ok(RingStore {
            node_id,
            data_dir: data_dir.to_path_buf(),
            current: RwLock::new(Arc::clone(&ring)),
            routing: RwLock::new(ring),
            moved_marked: tokio::sync::Mutex::new(false),
        })
    }

    /// The ring this broker believes current.
    pub fn current(&self) -> Arc<Ring> {
        Arc::clone(&self.current.read())
    }

    /// The ring requests are routed by.
    pub fn routing(&self) -> Arc<Ring> {
        Arc::clone(&self.routing.read())
    }

    /// Routes by `ring` from now on.
    pub fn set_routing(&self, ring: Arc<Ring>) {
        *self.routing.write() = ring;
    }

    /// Whether `version` is newer than the current ring's.
    pub fn is_newer(&self, version: u64) -> bool {
        version > self.current.read().version()
    }

    /// Makes `ring` current and returns the ring it replaces. The adopter
    /// checked it is newer under the host's open lock: a ring never goes
    /// back, so an older one here is a bug.
    pub(super) fn advance(&self, ring: Arc<Ring>) -> Arc<Ring> {
        let mut current = self.current.write();
        assert!(
            ring.version() > current.version(),
            "ring version {} adopted over {}",
            ring.version(),
            current.version()
        );
        std::mem::replace(&mut *current, ring)
    }

    /// Undoes an `advance` whose groups did not open: `previous` is current
    /// again, unless a newer ring was adopted since (it never is, under the
    /// open lock).
    pub(super) fn restore(&self, previous: Arc<Ring>, advanced: &Ring) {
        let mut current = self.current.write();
        assert_eq!(
            current.version(),
            advanced.version(),
            "the ring changed under an adoption"
        );
        *current = previous;
    }

    /// Routes by the current ring.
    pub(super) fn route_by_current(&self) {
        let current = self.current();
        *self.routing.write() = current;
    }

    /// Keeps `ring` on disk, best effort: the ring's group is the
    /// authority, and a broker that cannot keep its copy re-fetches it
    /// after a restart.
    pub(super) async fn keep(&self, ring: &Ring) {
        let path = self.data_dir.join(RING_FILE);
        match ring.encode() {
            Ok(body) => {
                let written = tokio::task::spawn_blocking(move || {
                    let bytes = fsio::encode_tagged(RING_FILE_MAGIC, &body)?;
                    fsio::write_atomic(&path, &bytes)
                })
                .await;
                if !matches!(written, Ok(Ok(()))) {
                    tracing::warn!(
                        node = self.node_id,
                        ?written,
                        "the learned ring was not kept on disk"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(node = self.node_id, error = %e, "the learned ring does not encode")
            }
        }
    }

    /// Whether a group ever moved on or off this broker (`MOVED_FILE`).
    pub(super) fn moved(&self) -> bool {
        self.data_dir.join(MOVED_FILE).exists()
    }

    /// Records, durably, that a group moved on or off this broker: from
    /// then on its start opens only the groups it has, or learns of, and
    /// never initializes one from the formation's voters, which would
    /// re-create a group this broker left (ADR 0104).
    pub(super) async fn mark_moved(&self) -> Result<(), GroupError> {
        // One writer at a time: the record is written through one
        // temporary file.
        let mut marked = self.moved_marked.lock().await;
        let path = self.data_dir.join(MOVED_FILE);
        if *marked || path.exists() {
            *marked = true;
            return Ok(());
        }
        tokio::task::spawn_blocking(move || fsio::write_atomic(&path, b"groups moved\n"))
            .await
            .map_err(|e| GroupError::refused(Refusal::Task(Arc::new(e))))?
            .map_err(|e| GroupError::config(ConfigProblem::MovedNotRecorded(Arc::new(e))))?;
        *marked = true;
        Ok(())
    }
}
