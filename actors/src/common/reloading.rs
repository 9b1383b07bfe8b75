//! A value built from files and built again when they change: the reload
//! check behind the broker's certificate (`tls.rs`) and its CA bundles
//! (`tls_roots.rs`).
//!
//! At most every `check_every`, a use first compares the files'
//! modification times and sizes with those last seen; when any changed it
//! builds the value again. A build that fails is logged at warn and
//! counted (`malachi_tls_reloads_total{outcome="failed"}`), and the
//! previous value serves on until the files change again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use malachi_wire::tls::TlsError;
use parking_lot::Mutex;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::common::metrics::BrokerMetrics;

/// A file's modification time and size: what a reload check compares.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

type Build<T> = Box<dyn Fn() -> Result<T, TlsError> + Send + Sync>;

struct State<T> {
    current: T,
    /// The files' stamps when last built (or tried).
    seen: Vec<Stamp>,
    next_check: Instant,
}

/// `T` built from `paths` by `build`, rebuilt when they change.
pub(crate) struct Reloading<T> {
    /// What is reloaded, for logs (`certificate`, `tls.cluster_ca_path`).
    what: &'static str,
    paths: Vec<PathBuf>,
    build: Build<T>,
    check_every: Duration,
    state: Mutex<State<T>>,
    metrics: OnceLock<Arc<BrokerMetrics>>,
}

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("what", &self.what)
            .field("paths", &self.paths)
            .field("check_every", &self.check_every)
            .finish_non_exhaustive()
    }
}

impl<T: Clone> Reloading<T> {
    /// Built now: a build that fails stops the start.
    pub(crate) fn load(
        what: &'static str,
        paths: Vec<PathBuf>,
        check_every: Duration,
        build: impl Fn() -> Result<T, TlsError> + Send + Sync + 'static,
    ) -> Result<Reloading<T>, TlsError> {
        let seen = paths.iter().map(|p| stamp(p)).collect();
        let current = build()?;
        Ok(Reloading {
            what,
            paths,
            build: Box::new(build),
            check_every,
            state: Mutex::new(State {
                current,
                seen,
                next_check: Instant::now() + check_every,
            }),
            metrics: OnceLock::new(),
        })
    }

    /// Where reloads are counted, once the broker's metrics exist.
    pub(crate) fn count_into(&self, metrics: &Arc<BrokerMetrics>) {
        let _ = self.metrics.set(Arc::clone(metrics));
    }

    /// The value to use now, rebuilt first if a check is due and the files
    /// changed.
    pub(crate) fn current(&self) -> T {
        let mut state = self.state.lock();
        let now = Instant::now();
        if now >= state.next_check {
            state.next_check = now + self.check_every;
            let seen: Vec<Stamp> = self.paths.iter().map(|p| stamp(p)).collect();
            if seen != state.seen {
                state.seen = seen;
                self.rebuild(&mut state);
            }
        }
        state.current.clone()
    }

    fn rebuild(&self, state: &mut State<T>) {
        let outcome = match (self.build)() {
            Ok(current) => {
                state.current = current;
                info!(what = self.what, paths = ?self.paths, "tls: files reloaded");
                "reloaded"
            }
            Err(e) => {
                warn!(
                    what = self.what,
                    paths = ?self.paths,
                    error = %e,
                    "tls: the changed files do not load; the previous ones serve on"
                );
                "failed"
            }
        };
        if let Some(metrics) = self.metrics.get() {
            metrics.tls_reload(outcome);
        }
    }
}
