//! The history file: every event of the run, one JSON object per line, in
//! the format `malachi-chaos-check` judges (`chaos/README.md`).
//!
//! Each event is stamped and written under one lock, so `t_ms` never
//! decreases from one line to the next and an event the driver saw first
//! is on an earlier line: the order the checker's rules read as "before".
//! Events are the checker's own [`Event`] type, serialized, so a line the
//! driver writes is a line the checker reads.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use malachi_chaos_checker::Event;

use crate::error::DriverError;

/// The history writer. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct History {
    start: Instant,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    out: BufWriter<File>,
    /// The last stamp written: stamps never go back, even if two calls of
    /// `Instant::now` were to disagree.
    last_t_ms: u64,
    lines: u64,
    /// The first write error; once set, nothing more is written and the
    /// run ends with it (a history with a hole cannot be judged).
    failed: Option<String>,
}

impl History {
    /// A new history at `path` (created or truncated), its clock starting now.
    pub fn create(path: &Path) -> Result<History, DriverError> {
        let file = File::create(path).map_err(|source| DriverError::History {
            path: path.to_owned(),
            source,
        })?;
        Ok(History {
            start: Instant::now(),
            inner: Mutex::new(Inner {
                out: BufWriter::with_capacity(1 << 20, file),
                last_t_ms: 0,
                lines: 0,
                failed: None,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Milliseconds since the run started, on the monotonic clock.
    pub fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Stamps `make(t_ms)` with the run's clock and writes it, both under
    /// the lock. Returns the stamp.
    pub fn log(&self, make: impl FnOnce(u64) -> Event) -> u64 {
        let mut inner = self.lock();
        let t_ms = self.elapsed_ms().max(inner.last_t_ms);
        inner.last_t_ms = t_ms;
        let event = make(t_ms);
        debug_assert_eq!(
            event.t_ms(),
            t_ms,
            "an event carries the stamp it was given"
        );
        if inner.failed.is_some() {
            return t_ms;
        }
        let written = serde_json::to_writer(&mut inner.out, &event)
            .map_err(std::io::Error::other)
            .and_then(|()| inner.out.write_all(b"\n"));
        match written {
            Ok(()) => inner.lines += 1,
            Err(error) => inner.failed = Some(error.to_string()),
        }
        t_ms
    }

    /// Pushes what is buffered to the file (the runner may read it while
    /// the run goes on; a crash then loses at most the last second).
    pub fn flush(&self) -> Result<(), DriverError> {
        let mut inner = self.lock();
        if let Some(reason) = &inner.failed {
            return Err(DriverError::HistoryWrite(reason.clone()));
        }
        inner
            .out
            .flush()
            .map_err(|e| DriverError::HistoryWrite(e.to_string()))
    }

    /// Flushes and syncs the file: the end of the run.
    pub fn finish(&self) -> Result<u64, DriverError> {
        self.flush()?;
        let inner = self.lock();
        inner
            .out
            .get_ref()
            .sync_all()
            .map_err(|e| DriverError::HistoryWrite(e.to_string()))?;
        Ok(inner.lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_never_decrease_and_lines_are_what_the_checker_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let history = History::create(&path).unwrap();
        let mut stamps = Vec::new();
        for seq in 1..=3u64 {
            stamps.push(history.log(|t_ms| Event::Produce {
                t_ms,
                client: "p0".into(),
                key: "k".into(),
                seq,
                value: format!("k:{seq}"),
            }));
        }
        history.log(|t_ms| Event::Nemesis {
            t_ms,
            event: "kill".into(),
            target: "b1".into(),
            detail: String::new(),
        });
        assert_eq!(history.finish().unwrap(), 4);
        assert!(stamps.windows(2).all(|w| w[0] <= w[1]));
        let text = std::fs::read_to_string(&path).unwrap();
        let events: Vec<Event> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(events.len(), 4);
        assert!(text.lines().all(|l| l.contains("\"kind\":")));
    }
}
