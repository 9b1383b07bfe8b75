//! OTP-style supervision over ractor: every long-lived part of the broker is a
//! ractor actor under a [`Supervisor`] from this crate.
//!
//! ractor links a child to its parent and delivers supervision events; it has
//! no restart policy. This crate adds the policy: the three OTP strategies
//! ([`Strategy`]), permanent/transient/temporary children ([`Restart`]), a
//! restart intensity beyond which a supervisor stops its children and fails
//! to its own parent ([`Intensity`]), bounded restart backoff ([`Backoff`]),
//! dynamic children, ordered shutdown, and live, recursive, serde-friendly
//! tree snapshots ([`SupervisorSnapshot`], rendered by [`render_tree`]). It also
//! provides the broker's backpressure pattern for ractor's unbounded mailboxes
//! ([`BoundedRef`]: in-flight credit carried inside each message).
//!
//! Boundaries: this crate knows nothing of storage, the wire protocol or raft,
//! and it never uses ractor's process-global name registry (children are
//! spawned unnamed; names live in each supervisor's own child table), so any
//! number of independent trees, e.g. many brokers in one test process, coexist.
//! It is also the only crate that should need to change when the pinned ractor
//! version moves (docs/adr/0001, docs/adr/0020).
//!
//! How to write a supervised actor, which strategy and restart type to pick,
//! and how it shows up in the tree: `docs/guides/writing-an-actor.md`, backed
//! by the runnable example `supervision/examples/counter_tree.rs`
//! (`cargo run -p malachi-supervision --example counter_tree`).
//!
//! ```no_run
//! use malachi_supervision::{ChildSpec, Strategy, SupervisorArgs, SupervisorRef};
//! # async fn demo(worker: ChildSpec) -> Result<(), malachi_supervision::SupervisionError> {
//! let args = SupervisorArgs::new("broker", Strategy::OneForOne).child(worker);
//! let (broker, _join) = SupervisorRef::spawn(args).await?;
//! let tree = broker.snapshot().await?;
//! println!("{}", malachi_supervision::render_tree(&tree, malachi_supervision::RenderOptions::FULL));
//! broker.stop(5_000).await?;
//! # Ok(()) }
//! ```

mod bounded;
mod error;
mod intensity;
mod snapshot;
mod spec;
mod supervisor;

pub use bounded::{BoundedRef, Permit};
pub use error::SupervisionError;
pub use intensity::RestartWindow;
pub use snapshot::{ChildSnapshot, ChildStatus, RenderOptions, SupervisorSnapshot, render_tree};
pub use spec::{
    Backoff, ChildKind, ChildSpec, Intensity, Restart, SNAPSHOT_TIMEOUT_MS_DEFAULT,
    SUPERVISOR_SHUTDOWN_TIMEOUT_MS_DEFAULT, StartFn, StartFuture, Strategy, SupervisorArgs,
    WORKER_SHUTDOWN_TIMEOUT_MS_DEFAULT,
};
pub use supervisor::{
    CALL_TIMEOUT_MS_DEFAULT, SHUTDOWN_REASON, Supervisor, SupervisorMsg, SupervisorRef,
    SupervisorState,
};
