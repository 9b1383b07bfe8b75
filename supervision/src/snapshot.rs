//! Live tree snapshots and their plain-text rendering.
//!
//! A snapshot is plain serde data so the wire protocol, the admin HTTP API and
//! the dashboard can carry it unchanged; [`render_tree`] is the text form that
//! `malachi tree` prints.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::spec::{ChildKind, Restart, Strategy};

/// The state of one supervisor and, recursively, of its subtree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SupervisorSnapshot {
    /// The supervisor's human-readable name.
    pub name: String,
    /// The supervisor's ractor actor id (e.g. `0.42`).
    pub actor_id: String,
    /// Its restart strategy.
    pub strategy: Strategy,
    /// How long it has been running, in milliseconds.
    pub uptime_ms: u64,
    /// Its children, in start order.
    pub children: Vec<ChildSnapshot>,
}

/// What a child is doing right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildStatus {
    /// Started and linked.
    Running,
    /// Exited (or failed to start) and waiting for its backoff to elapse.
    Restarting,
    /// Exited and will not be restarted (a static transient child that ended normally).
    Stopped,
    /// A nested supervisor that did not answer the snapshot request in time.
    Unresponsive,
}

impl ChildStatus {
    /// The snake_case name used in the rendered tree.
    pub fn as_str(self) -> &'static str {
        match self {
            ChildStatus::Running => "running",
            ChildStatus::Restarting => "restarting",
            ChildStatus::Stopped => "stopped",
            ChildStatus::Unresponsive => "unresponsive",
        }
    }
}

/// One child of a supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildSnapshot {
    /// The child's name, unique under its supervisor.
    pub name: String,
    /// The current instance's actor id, if one is running.
    pub actor_id: Option<String>,
    /// Worker or nested supervisor.
    pub kind: ChildKind,
    /// Its restart type.
    pub restart: Restart,
    /// What it is doing now.
    pub status: ChildStatus,
    /// How many times the supervisor has restarted (or tried to restart) it.
    pub restarts: u32,
    /// Why its previous instance ended (or why its last start failed).
    pub last_exit_reason: Option<String>,
    /// How long the current instance has been running, in milliseconds (0 if none).
    pub uptime_ms: u64,
    /// For a running nested supervisor that answered: its own snapshot.
    pub supervisor: Option<SupervisorSnapshot>,
}

impl SupervisorSnapshot {
    /// Find a direct child by name.
    pub fn child(&self, name: &str) -> Option<&ChildSnapshot> {
        self.children.iter().find(|c| c.name == name)
    }

    /// Find a descendant by a `/`-free path of names, e.g. `["metadata", "coordinator_manager"]`.
    pub fn descendant(&self, path: &[&str]) -> Option<&ChildSnapshot> {
        let (first, rest) = path.split_first()?;
        let child = self.child(first)?;
        if rest.is_empty() {
            return Some(child);
        }
        child.supervisor.as_ref()?.descendant(rest)
    }
}

/// Which volatile fields [`render_tree`] prints. Tests turn them off to get
/// deterministic output; operators want them on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderOptions {
    /// Print actor ids.
    pub show_ids: bool,
    /// Print uptimes.
    pub show_uptime: bool,
}

impl RenderOptions {
    /// Everything, for operators.
    pub const FULL: RenderOptions = RenderOptions {
        show_ids: true,
        show_uptime: true,
    };
    /// Only the fields that do not change from run to run.
    pub const STABLE: RenderOptions = RenderOptions {
        show_ids: false,
        show_uptime: false,
    };
}

/// Render a snapshot as an indented tree, one line per node:
///
/// ```text
/// broker one_for_one
/// ├── storage supervisor one_for_one running restarts=0
/// │   └── segment/a/0 worker running restarts=1 last_exit="boom"
/// └── listener worker running restarts=0
/// ```
pub fn render_tree(snapshot: &SupervisorSnapshot, options: RenderOptions) -> String {
    let mut out = String::new();
    out.push_str(&snapshot.name);
    out.push(' ');
    out.push_str(snapshot.strategy.as_str());
    if options.show_ids {
        let _ = write!(out, " id={}", snapshot.actor_id);
    }
    if options.show_uptime {
        let _ = write!(out, " up={}ms", snapshot.uptime_ms);
    }
    out.push('\n');
    render_children(&mut out, &snapshot.children, "", options);
    out
}

fn render_children(
    out: &mut String,
    children: &[ChildSnapshot],
    prefix: &str,
    options: RenderOptions,
) {
    for (i, child) in children.iter().enumerate() {
        let last = i + 1 == children.len();
        out.push_str(prefix);
        out.push_str(if last { "└── " } else { "├── " });
        out.push_str(&child.name);
        out.push(' ');
        out.push_str(child.kind.as_str());
        if let Some(nested) = &child.supervisor {
            out.push(' ');
            out.push_str(nested.strategy.as_str());
        }
        out.push(' ');
        out.push_str(child.status.as_str());
        if child.restart != Restart::Permanent {
            out.push(' ');
            out.push_str(child.restart.as_str());
        }
        let _ = write!(out, " restarts={}", child.restarts);
        if let (true, Some(id)) = (options.show_ids, &child.actor_id) {
            let _ = write!(out, " id={id}");
        }
        if options.show_uptime && child.status == ChildStatus::Running {
            let _ = write!(out, " up={}ms", child.uptime_ms);
        }
        if let Some(reason) = &child.last_exit_reason {
            let _ = write!(out, " last_exit={reason:?}");
        }
        out.push('\n');
        if let Some(nested) = &child.supervisor {
            let deeper = format!("{prefix}{}", if last { "    " } else { "│   " });
            render_children(out, &nested.children, &deeper, options);
        }
    }
}
