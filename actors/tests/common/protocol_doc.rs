//! The error codes `docs/protocol.md` promises, read from the document
//! itself: each operation's `Errors:` list and the codes every request may
//! get. The tables of `actors/tests/documented_errors.rs` (one broker) and
//! `tests/documented_errors.rs` (three brokers) provoke them, so a code the
//! document lists but nothing sends, or one a broker sends but the document
//! does not list, fails a test.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use malachi_wire::ErrorCode;

/// What the document says each operation may answer.
#[derive(Debug)]
pub struct DocumentedErrors {
    /// "Every request may also fail with ...".
    pub common: BTreeSet<String>,
    /// Operation name (`produce`) to the codes its `Errors:` names.
    pub per_op: BTreeMap<String, BTreeSet<String>>,
}

impl DocumentedErrors {
    pub fn read() -> DocumentedErrors {
        // From the actors crate or from the workspace root.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let path = [
            root.join("docs/protocol.md"),
            root.join("../docs/protocol.md"),
        ]
        .into_iter()
        .find(|p| p.exists())
        .expect("docs/protocol.md");
        let text = std::fs::read_to_string(path).expect("docs/protocol.md");
        DocumentedErrors::parse(&text)
    }

    pub fn parse(text: &str) -> DocumentedErrors {
        let start = text
            .find("Every request may also fail with")
            .expect("the common errors sentence");
        let end = start + text[start..].find("; the lists").expect("its end");
        let common = code_names(&text[start..end]);
        assert!(!common.is_empty(), "no common codes parsed");

        let mut per_op = BTreeMap::new();
        let mut sections = text.split("\n### ").skip(1);
        for section in &mut sections {
            // "10 `produce`\n..." up to the next heading of any level.
            let section = section.split("\n## ").next().unwrap_or(section);
            let name = section
                .split('`')
                .nth(1)
                .expect("an operation heading names it in backticks")
                .to_owned();
            let codes = match section.find("Errors:") {
                None => BTreeSet::new(),
                Some(at) => {
                    let list = &section[at..];
                    let list = list.split("\n\n").next().unwrap_or(list);
                    if let Some(other) = list.strip_prefix("Errors: as ") {
                        let other = other.split([';', '.', ' ']).next().unwrap_or("");
                        per_op
                            .get(other)
                            .cloned()
                            .unwrap_or_else(|| panic!("{name}: errors as unknown {other}"))
                    } else {
                        code_names(list)
                    }
                }
            };
            per_op.insert(name, codes);
        }
        DocumentedErrors { common, per_op }
    }

    /// The codes `op` may answer: its own and the common ones.
    pub fn allowed(&self, op: &str) -> BTreeSet<String> {
        let own = self
            .per_op
            .get(op)
            .unwrap_or_else(|| panic!("protocol.md has no operation {op}"));
        own.union(&self.common).cloned().collect()
    }

    /// The codes only `op` lists (not the common ones), which a table must
    /// provoke for `op` itself.
    pub fn particular(&self, op: &str) -> BTreeSet<String> {
        self.per_op[op].difference(&self.common).cloned().collect()
    }
}

/// Every backticked word of `text` that names an error code.
fn code_names(text: &str) -> BTreeSet<String> {
    let names: BTreeSet<&str> = ErrorCode::KNOWN.iter().map(|c| c.name()).collect();
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| names.contains(word))
        .map(str::to_owned)
        .collect()
}

/// The (operation, code) pairs the three-broker test provokes; the
/// one-broker test counts them as covered, and the three-broker test checks
/// it provokes exactly these.
pub const PROVOKED_BY_THREE_BROKERS: &[(&str, &str)] = &[
    ("create_topic", "no_quorum"),
    ("delete_topic", "no_quorum"),
    ("split_range", "not_leader"),
    ("split_range", "no_quorum"),
    ("merge_range", "not_leader"),
    ("merge_range", "no_quorum"),
    ("produce", "not_leader"),
    ("fetch", "not_leader"),
    ("subscribe", "not_leader"),
];

/// Listed codes no test provokes from outside a broker, and why: each is a
/// fault a client must handle but cannot cause on demand. Their mapping to
/// the wire is unit-tested in `actors/src/serve/error.rs`.
pub const NOT_PROVOKED: &[(&str, &str, &str)] = &[
    ("*", "unknown_server_error", "a broker bug or a failed disk"),
    (
        "fetch",
        "no_quorum",
        "a broker of a cluster whose ring group has no quorum, before it learned the cursor key (tests/cursor_key.rs provokes it with broker processes)",
    ),
    (
        "subscribe",
        "no_quorum",
        "a broker of a cluster whose ring group has no quorum, before it learned the cursor key (as fetch)",
    ),
    ("*", "shutting_down", "a request racing a broker's stop"),
    (
        "fetch",
        "data_loss",
        "a segment copy damaged or deleted on disk at RF=1 (tests/damage.rs provokes it with broker processes)",
    ),
    (
        "subscribe",
        "data_loss",
        "a segment copy damaged or deleted on disk at RF=1 (as fetch)",
    ),
    (
        "cluster_members",
        "no_quorum",
        "the ring's group without a quorum (most of the cluster's brokers down); cluster/tests/membership_change.rs runs the same routing",
    ),
    (
        "*",
        "timeout",
        "a coordinator or disk slower than its deadline",
    ),
    ("*", "unauthorized", "authentication is not built yet"),
    (
        "fetch",
        "cursor_expired",
        "a cursor into segments retention deleted (actors/tests/retention.rs provokes it under a manual clock)",
    ),
    (
        "subscribe",
        "cursor_expired",
        "a cursor into segments retention deleted (as fetch)",
    ),
    (
        "put_policy",
        "no_quorum",
        "the ring's group without a quorum (as cluster_members)",
    ),
    (
        "list_policies",
        "no_quorum",
        "the ring's group without a quorum (as cluster_members)",
    ),
    (
        "delete_policy",
        "no_quorum",
        "the ring's group without a quorum (as cluster_members)",
    ),
    (
        "features",
        "no_quorum",
        "the ring's group without a quorum (as cluster_members)",
    ),
    (
        "create_topic",
        "outcome_unknown",
        "a proposal lost to a leader change",
    ),
    (
        "delete_topic",
        "outcome_unknown",
        "a proposal lost to a leader change",
    ),
    (
        "split_range",
        "outcome_unknown",
        "a proposal lost to a leader change",
    ),
    (
        "merge_range",
        "outcome_unknown",
        "a proposal lost to a leader change",
    ),
    (
        "vnode_split",
        "outcome_unknown",
        "a proposal lost to a leader change",
    ),
    (
        "split_range",
        "busy",
        "a segment that cannot be frozen in time",
    ),
    (
        "merge_range",
        "busy",
        "a segment that cannot be frozen in time",
    ),
    (
        "split_range",
        "topic_sealed",
        "no client operation seals a topic yet",
    ),
    (
        "merge_range",
        "topic_sealed",
        "no client operation seals a topic yet",
    ),
    (
        "produce",
        "topic_sealed",
        "no client operation seals a topic yet",
    ),
    (
        "produce",
        "no_quorum",
        "provoked in tests/replication.rs (both followers down): a lone broker has no followers",
    ),
    (
        "vnode_split",
        "split_in_progress",
        "a split of another vnode stopped part way",
    ),
    (
        "vnode_split",
        "no_quorum",
        "a group the split needs losing its quorum mid-split",
    ),
];
