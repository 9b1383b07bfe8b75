//! The durable raft log and vote of one group.
//!
//! Layout inside the group directory (see docs/adr/0050):
//! - `log`: the magic `MALRLOG1`, a header frame (group id, last purged log
//!   id), then one frame per entry in index order. Appends go to the end and
//!   are fsynced before openraft hears they are flushed. `truncate_after`
//!   cuts the file at the first removed entry. `purge` rewrites the retained
//!   entries under a new header into `log.tmp` and renames it over `log`,
//!   so the purge point and the entries never disagree.
//! - `vote`: the magic `MALRVOT1` and one frame, replaced atomically.
//!
//! Recovery reads the whole log. A frame cut short at the end of the file is
//! a torn append: the file is truncated to the last whole entry. A checksum
//! mismatch on the final frame, or a tail of zeros, is treated the same way,
//! because a torn write can leave a whole-looking length over a partial body
//! or a grown file whose data never landed. Anything wrong
//! before the final frame is corruption and refuses to open.
//!
//! Entries are also held in memory: a metadata log is short because it is
//! purged after every snapshot.

use super::error::{Corruption, GroupError};
use super::fsio::{
    self, FrameRead, MAGIC_BYTES, TaggedError, decode_tagged, encode_frame, encode_tagged,
    read_frame,
};
use super::types::{Entry, LogId, TypeConfig, Vote};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) const LOG_MAGIC: &[u8; MAGIC_BYTES] = b"MALRLOG1";
pub(crate) const VOTE_MAGIC: &[u8; MAGIC_BYTES] = b"MALRVOT1";
pub(crate) const LOG_FILE: &str = "log";
pub(crate) const VOTE_FILE: &str = "vote";
/// The largest header or vote frame body, in bytes.
const SMALL_FRAME_BYTES_MAX: u64 = 64 * 1024;

/// Why a group's files could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    #[error("i/o on {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} is corrupt at byte {offset}: {problem}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        problem: Corruption,
    },
}

impl From<OpenError> for GroupError {
    fn from(err: OpenError) -> GroupError {
        match err {
            OpenError::Io { path, source } => GroupError::Io {
                path,
                source: Arc::new(source),
            },
            OpenError::Corrupt {
                path,
                offset,
                problem,
            } => GroupError::Storage {
                path,
                offset,
                problem,
            },
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    group_id: u64,
    last_purged: Option<LogId>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    group_id: u64,
    file: File,
    /// Byte offset one past the last whole entry.
    end: u64,
    /// Each retained entry and the byte offset its frame starts at.
    entries: BTreeMap<u64, (Entry, u64)>,
    last_purged: Option<LogId>,
    vote: Option<Vote>,
    entry_bytes_max: u64,
    /// Set after a failed write: the file's tail is then unknown, so every
    /// later operation fails rather than build on it.
    failed: Option<String>,
    /// Test hook: the next operation fails with a full volume's error.
    #[cfg(test)]
    full_for_test: bool,
}

/// The on-disk log store; clones share one file.
#[derive(Debug, Clone)]
pub(crate) struct LogStore {
    inner: Arc<Mutex<Inner>>,
    /// Set when a write failed for want of space (`fsio::is_no_space`).
    no_space: Arc<std::sync::atomic::AtomicBool>,
}

impl LogStore {
    /// The flag set when a write failed for want of space: the group that
    /// owns this store may then be reopened once space returns.
    pub(crate) fn no_space(&self) -> Arc<std::sync::atomic::AtomicBool> {
        Arc::clone(&self.no_space)
    }
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> OpenError + '_ {
    move |source| OpenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn codec_error(err: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, err.to_string())
}

pub(crate) fn header_bytes(group_id: u64, last_purged: Option<LogId>) -> io::Result<Vec<u8>> {
    let body = rmp_serde::to_vec(&Header {
        group_id,
        last_purged,
    })
    .map_err(codec_error)?;
    encode_tagged(LOG_MAGIC, &body)
}

impl LogStore {
    /// Opens the log and vote in `dir`, creating an empty log if none exists.
    pub(crate) fn open(
        dir: &Path,
        group_id: u64,
        entry_bytes_max: u64,
    ) -> Result<LogStore, OpenError> {
        fs::create_dir_all(dir).map_err(io_at(dir))?;
        let log_path = dir.join(LOG_FILE);
        let vote_path = dir.join(VOTE_FILE);
        // A leftover staging file is a purge or vote write that crashed
        // before its rename; the old file is still authoritative.
        for staged in [fsio::tmp_path(&log_path), fsio::tmp_path(&vote_path)] {
            if staged.exists() {
                fs::remove_file(&staged).map_err(io_at(&staged))?;
            }
        }
        if !log_path.exists() {
            let bytes = header_bytes(group_id, None).map_err(io_at(&log_path))?;
            fsio::write_atomic(&log_path, &bytes).map_err(io_at(&log_path))?;
        }
        let vote = read_vote_file(&vote_path)?;
        let bytes = fs::read(&log_path).map_err(io_at(&log_path))?;
        let DecodedLog {
            last_purged,
            entries,
            end: at,
        } = decode_log(&bytes, group_id, entry_bytes_max, &log_path).map_err(
            |(offset, problem)| OpenError::Corrupt {
                path: log_path.clone(),
                offset: offset as u64,
                problem,
            },
        )?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&log_path)
            .map_err(io_at(&log_path))?;
        if at != bytes.len() {
            file.set_len(at as u64).map_err(io_at(&log_path))?;
            file.sync_all().map_err(io_at(&log_path))?;
        }
        file.seek(SeekFrom::Start(at as u64))
            .map_err(io_at(&log_path))?;
        Ok(LogStore {
            inner: Arc::new(Mutex::new(Inner {
                dir: dir.to_path_buf(),
                group_id,
                file,
                end: at as u64,
                entries,
                last_purged,
                vote,
                entry_bytes_max,
                failed: None,
                #[cfg(test)]
                full_for_test: false,
            })),
            no_space: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        })
    }
}

/// What a log file's bytes hold: the purge point, the entries by index with
/// the byte offset each frame starts at, and the offset one past the last
/// whole entry (a torn or zero tail lies beyond it).
#[derive(Debug)]
pub(crate) struct DecodedLog {
    pub(crate) last_purged: Option<LogId>,
    pub(crate) entries: BTreeMap<u64, (Entry, u64)>,
    pub(crate) end: usize,
}

/// Decodes a log file's bytes (untrusted: read from disk). Corruption is the
/// byte offset and a reason; `log_path` only names the file in warnings.
pub(crate) fn decode_log(
    bytes: &[u8],
    group_id: u64,
    entry_bytes_max: u64,
    log_path: &Path,
) -> Result<DecodedLog, (usize, Corruption)> {
    let corrupt = |offset: usize, problem: Corruption| (offset, problem);
    let header_body = decode_tagged(
        LOG_MAGIC,
        bytes.get(..header_end(bytes)).unwrap_or(bytes),
        SMALL_FRAME_BYTES_MAX,
    )
    .map_err(|e: TaggedError| corrupt(0, Corruption::LogHeaderFrame(e)))?;
    let header: Header = rmp_serde::from_slice(header_body)
        .map_err(|e| corrupt(MAGIC_BYTES, Corruption::LogHeader(Arc::new(e))))?;
    if header.group_id != group_id {
        return Err(corrupt(
            MAGIC_BYTES,
            Corruption::OtherGroup {
                found: header.group_id,
                expected: group_id,
            },
        ));
    }
    let mut at = header_end(bytes);
    let mut entries = BTreeMap::new();
    let mut expected_index = header.last_purged.as_ref().map_or(0, |id| id.index + 1);
    loop {
        if at == bytes.len() {
            break;
        }
        // A crash after the file grew but before its data reached the
        // disk leaves zeros; an all-zero header would even pass as an
        // empty frame (the CRC32 of nothing is 0). No entry encodes to
        // an empty body, so a zero tail is a torn append.
        if bytes[at..].iter().all(|&b| b == 0) {
            tracing::warn!(path = %log_path.display(), offset = at, zero_bytes = bytes.len() - at, "truncating a zero-filled log tail");
            break;
        }
        match read_frame(bytes, at, entry_bytes_max) {
            FrameRead::Whole { body, next } => {
                let entry: Entry = rmp_serde::from_slice(body)
                    .map_err(|e| corrupt(at, Corruption::Entry(Arc::new(e))))?;
                let index = entry.index();
                // The first entry of a fresh log may start anywhere a
                // snapshot install left the purge point; after it they
                // must be consecutive.
                if (!entries.is_empty() || header.last_purged.is_some()) && index != expected_index
                {
                    return Err(corrupt(
                        at,
                        Corruption::IndexGap {
                            found: index,
                            expected: expected_index,
                        },
                    ));
                }
                expected_index = index + 1;
                entries.insert(index, (entry, at as u64));
                at = next;
            }
            FrameRead::Short => {
                tracing::warn!(path = %log_path.display(), offset = at, file_bytes = bytes.len(), "truncating a torn log tail");
                break;
            }
            FrameRead::BadChecksum { next } if next == bytes.len() => {
                tracing::warn!(path = %log_path.display(), offset = at, "truncating a final log entry whose checksum fails");
                break;
            }
            FrameRead::BadChecksum { .. } => {
                return Err(corrupt(at, Corruption::EntryChecksum));
            }
            FrameRead::TooLong { len } => {
                return Err(corrupt(
                    at,
                    Corruption::EntryTooLong {
                        len,
                        entry_bytes_max,
                    },
                ));
            }
        }
    }
    Ok(DecodedLog {
        last_purged: header.last_purged,
        entries,
        end: at,
    })
}

/// The offset just past the header frame, or the file length if the header
/// is cut short (decoding then reports it).
fn header_end(bytes: &[u8]) -> usize {
    match read_frame(bytes, MAGIC_BYTES, SMALL_FRAME_BYTES_MAX) {
        FrameRead::Whole { next, .. } | FrameRead::BadChecksum { next } => next,
        FrameRead::Short | FrameRead::TooLong { .. } => bytes.len(),
    }
}

fn read_vote_file(path: &Path) -> Result<Option<Vote>, OpenError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_at(path)(e)),
    };
    let corrupt = |problem: Corruption| OpenError::Corrupt {
        path: path.to_path_buf(),
        offset: 0,
        problem,
    };
    decode_vote(&bytes).map(Some).map_err(corrupt)
}

/// Decodes a vote file's bytes (untrusted: read from disk).
pub(crate) fn decode_vote(bytes: &[u8]) -> Result<Vote, Corruption> {
    let body =
        decode_tagged(VOTE_MAGIC, bytes, SMALL_FRAME_BYTES_MAX).map_err(Corruption::VoteFrame)?;
    rmp_serde::from_slice(body).map_err(|e| Corruption::Vote(Arc::new(e)))
}

impl LogStore {
    /// Runs a disk operation on tokio's blocking pool, so an fsync never
    /// stalls the runtime's workers. A failure latches the store.
    async fn blocking<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Inner) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let inner = self.inner.clone();
        let no_space = Arc::clone(&self.no_space);
        tokio::task::spawn_blocking(move || {
            let mut inner = inner.lock();
            inner.check()?;
            #[cfg(test)]
            let f = {
                let full = inner.full_for_test;
                move |inner: &mut Inner| {
                    if full {
                        return Err(io::Error::from(io::ErrorKind::StorageFull));
                    }
                    f(inner)
                }
            };
            f(&mut inner).map_err(|e| {
                if super::fsio::is_no_space(&e) {
                    no_space.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                inner.fail(op, e)
            })
        })
        .await
        .map_err(|e| io::Error::other(format!("{op} did not finish: {e}")))?
    }
}

#[cfg(any(test, feature = "testing"))]
impl LogStore {
    /// Makes every later operation fail as if the disk had failed.
    pub(crate) fn break_disk(&self) {
        self.inner.lock().failed = Some("injected disk failure".to_owned());
    }
}

#[cfg(test)]
impl LogStore {
    /// Makes the next operation fail as a full volume's write does.
    pub(crate) fn fill_disk(&self) {
        self.inner.lock().full_for_test = true;
    }
}

impl Inner {
    fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some(reason) => Err(io::Error::other(format!(
                "log store failed earlier and refuses further i/o: {reason}"
            ))),
            None => Ok(()),
        }
    }

    fn fail(&mut self, op: &str, err: io::Error) -> io::Error {
        tracing::error!(group = self.group_id, op, error = %err, "raft log i/o failed; this replica is now fatal");
        self.failed = Some(format!("{op}: {err}"));
        err
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(LOG_FILE)
    }

    fn append_entries(&mut self, entries: Vec<Entry>) -> io::Result<()> {
        let mut buf = Vec::new();
        let mut placed = Vec::with_capacity(entries.len());
        let mut next_index = self
            .entries
            .last_key_value()
            .map(|(i, _)| i + 1)
            .or(self.last_purged.as_ref().map(|id| id.index + 1));
        for entry in entries {
            let index = entry.index();
            if let Some(expected) = next_index
                && index != expected
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("append of index {index} where {expected} was expected"),
                ));
            }
            next_index = Some(index + 1);
            let body = rmp_serde::to_vec(&entry).map_err(codec_error)?;
            if body.len() as u64 > self.entry_bytes_max {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "entry of {} bytes exceeds {}",
                        body.len(),
                        self.entry_bytes_max
                    ),
                ));
            }
            let offset = self.end + buf.len() as u64;
            encode_frame(&body, &mut buf)?;
            placed.push((entry, offset));
        }
        self.file.write_all(&buf)?;
        self.file.sync_data()?;
        self.end += buf.len() as u64;
        for (entry, offset) in placed {
            self.entries.insert(entry.index(), (entry, offset));
        }
        Ok(())
    }

    fn truncate_after(&mut self, last: Option<&LogId>) -> io::Result<()> {
        let first_removed = last.map_or(0, |id| id.index + 1);
        let Some((_, (_, offset))) = self.entries.range(first_removed..).next() else {
            return Ok(());
        };
        let offset = *offset;
        self.file.set_len(offset)?;
        self.file.sync_all()?;
        self.file.seek(SeekFrom::Start(offset))?;
        self.end = offset;
        self.entries.split_off(&first_removed);
        Ok(())
    }

    fn purge(&mut self, upto: LogId) -> io::Result<()> {
        if self
            .last_purged
            .as_ref()
            .is_some_and(|p| p.index >= upto.index)
        {
            return Ok(());
        }
        let retained = self.entries.split_off(&(upto.index + 1));
        let mut bytes = header_bytes(self.group_id, Some(upto))?;
        let mut placed = BTreeMap::new();
        for (index, (entry, _)) in retained {
            let body = rmp_serde::to_vec(&entry).map_err(codec_error)?;
            let offset = bytes.len() as u64;
            encode_frame(&body, &mut bytes)?;
            placed.insert(index, (entry, offset));
        }
        let path = self.log_path();
        fsio::write_atomic(&path, &bytes)?;
        let mut file = OpenOptions::new().read(true).write(true).open(&path)?;
        file.seek(SeekFrom::Start(bytes.len() as u64))?;
        self.file = file;
        self.end = bytes.len() as u64;
        self.entries = placed;
        self.last_purged = Some(upto);
        Ok(())
    }

    fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        let body = rmp_serde::to_vec(vote).map_err(codec_error)?;
        fsio::write_atomic(
            &self.dir.join(VOTE_FILE),
            &encode_tagged(VOTE_MAGIC, &body)?,
        )?;
        self.vote = Some(*vote);
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let inner = self.inner.lock();
        inner.check()?;
        Ok(inner
            .entries
            .range(range)
            .map(|(_, (e, _))| e.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        let inner = self.inner.lock();
        inner.check()?;
        Ok(inner.vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let inner = self.inner.lock();
        inner.check()?;
        let last_log_id = inner
            .entries
            .last_key_value()
            .map(|(_, (e, _))| e.log_id())
            .or_else(|| inner.last_purged);
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let vote = *vote;
        self.blocking("save_vote", move |inner| inner.save_vote(&vote))
            .await
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let result = self
            .blocking("append", move |inner| inner.append_entries(entries))
            .await;
        // The append is on disk (fsynced) or failed; tell openraft which.
        match result {
            Ok(()) => {
                callback.io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        self.blocking("truncate_after", move |inner| {
            inner.truncate_after(last_log_id.as_ref())
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.blocking("purge", move |inner| inner.purge(log_id))
            .await
    }
}
