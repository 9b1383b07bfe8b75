//! The pure core stays pure (ADR 0090, ADR 0132). `malachi-core` is the
//! pure core; the I/O around it lives in other crates (`malachi-cluster`:
//! `clock`, `group`, `vnodes`; `malachi-membership`). Purity is enforced
//! twice:
//! - by the manifest: `core/Cargo.toml` depends on no async runtime, raft,
//!   SWIM, randomness or storage crate, and on no other crate of ours, so
//!   the compiler refuses an impure import (checked below, so a dependency
//!   added later fails here with the reason);
//! - by the sources, for what a manifest cannot forbid: no clock,
//!   filesystem, network, environment, thread or process from `std`, no
//!   async code, no hash-ordered collection, no shared mutable state
//!   (`static mut`, locks, `OnceLock`), and every `crate::` path names a
//!   module of this crate.
//!
//! A test over crafted sources shows the checker catches each kind of
//! violation, so a checker that silently stopped matching would fail too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

/// The modules of the pure core, as `lib.rs` declares them.
const PURE_MODULES: [&str; 10] = [
    "auth",
    "constraints",
    "cursor",
    "formation",
    "load",
    "model",
    "placement",
    "plan",
    "rate",
    "ring",
];
/// The I/O modules of the crates that wrap the pure core: no path of the
/// core may name one.
const IO_MODULES: [&str; 4] = ["clock", "group", "membership", "vnodes"];

/// Words no pure source may use (matched as whole paths or identifiers).
const FORBIDDEN_WORDS: [&str; 23] = [
    "SystemTime",
    "Instant",
    "rand",
    "getrandom",
    "tokio",
    "tokio_util",
    "openraft",
    "foca",
    "futures",
    "async_trait",
    "parking_lot",
    "tracing",
    "HashMap",
    "HashSet",
    "async",
    "await",
    "thread_local",
    "OnceLock",
    "LazyLock",
    "Mutex",
    "RwLock",
    "malachi_storage",
    "malachi_supervision",
];

/// Modules of `std` (and `core`) no pure source may reach.
const FORBIDDEN_STD: [&str; 8] = ["time", "fs", "net", "env", "thread", "process", "io", "os"];

/// One broken rule, for the failure message.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Violation {
    line: usize,
    rule: String,
}

/// `source` with every comment replaced by spaces (newlines kept, so line
/// numbers stay true). Nested block comments are handled.
fn strip_comments(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let mut depth = 0usize;
    let mut in_line = false;
    while i < bytes.len() {
        let c = bytes[i];
        let next = bytes.get(i + 1).copied();
        if in_line {
            if c == b'\n' {
                in_line = false;
                out.push('\n');
            } else {
                out.push(' ');
            }
            i += 1;
        } else if c == b'/' && next == Some(b'*') {
            depth += 1;
            out.push_str("  ");
            i += 2;
        } else if depth > 0 && c == b'*' && next == Some(b'/') {
            depth -= 1;
            out.push_str("  ");
            i += 2;
        } else if depth > 0 {
            out.push(if c == b'\n' { '\n' } else { ' ' });
            i += 1;
        } else if c == b'/' && next == Some(b'/') {
            in_line = true;
            out.push_str("  ");
            i += 2;
        } else {
            // Multi-byte UTF-8 is copied through whole.
            let width = source[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&source[i..i + width]);
            i += width;
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

/// Every offset where `word` occurs as a whole identifier path.
fn whole_word_hits<'a>(text: &'a str, word: &'a str) -> impl Iterator<Item = usize> + 'a {
    text.match_indices(word).filter_map(move |(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        (!before.is_some_and(is_ident) && !after.is_some_and(is_ident)).then_some(at)
    })
}

/// The first path segments after every `root::` in `text`, with offsets:
/// `root::a::b` gives `a`, `root::{a::b, c}` gives `a` and `c`.
fn segments_after(text: &str, root: &str) -> Vec<(usize, String)> {
    let needle = format!("{root}::");
    let mut found = Vec::new();
    for at in whole_word_hits(text, root).collect::<Vec<_>>() {
        let rest = &text[at..];
        if !rest.starts_with(&needle) {
            continue;
        }
        let rest = rest[needle.len()..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // First-level names of a grouped import.
            let mut depth = 0usize;
            let mut name = String::new();
            let mut fresh = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => fresh = true,
                    c if depth == 0 && fresh && is_ident(c) => name.push(c),
                    _ if !name.is_empty() => {
                        found.push((at, std::mem::take(&mut name)));
                        fresh = false;
                    }
                    _ => {}
                }
            }
            if !name.is_empty() {
                found.push((at, name));
            }
        } else {
            let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            found.push((at, name));
        }
    }
    found
}

/// The rules a pure source file breaks.
fn violations(source: &str) -> Vec<Violation> {
    let text = strip_comments(source);
    let mut found = Vec::new();
    let mut push = |at: usize, rule: String| {
        found.push(Violation {
            line: line_of(&text, at),
            rule,
        })
    };
    for word in FORBIDDEN_WORDS {
        for at in whole_word_hits(&text, word) {
            push(at, format!("uses `{word}`"));
        }
    }
    // Immutable statics are constants; a mutable one is state shared by all.
    for at in whole_word_hits(&text, "static") {
        if text[at + "static".len()..].trim_start().starts_with("mut ") {
            push(at, "uses `static mut`".to_owned());
        }
    }
    for root in ["std", "core", "alloc"] {
        for (at, module) in segments_after(&text, root) {
            if FORBIDDEN_STD.contains(&module.as_str()) {
                push(at, format!("reaches `{root}::{module}`"));
            }
        }
    }
    for (at, module) in segments_after(&text, "crate") {
        if !PURE_MODULES.contains(&module.as_str()) {
            push(
                at,
                format!("reaches `crate::{module}`, outside the pure core"),
            );
        }
    }
    for (at, module) in segments_after(&text, "super") {
        if IO_MODULES.contains(&module.as_str()) || module == "super" {
            push(
                at,
                format!("reaches `super::{module}`, outside the pure core"),
            );
        }
    }
    found.sort_by_key(|v| v.line);
    found
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files_under(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files_under(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// Every source file of the pure core.
fn pure_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for module in PURE_MODULES {
        let dir = src().join(module);
        let file = src().join(format!("{module}.rs"));
        if dir.is_dir() {
            rust_files_under(&dir, &mut files);
        }
        if file.is_file() {
            files.push(file);
        }
    }
    files.sort();
    files
}

#[test]
fn every_pure_source_imports_nothing_impure_and_no_io_module() {
    let files = pure_files();
    assert!(
        files.len() >= 11,
        "expected the pure core's files, found {files:?}"
    );
    let mut broken = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap();
        for v in violations(&source) {
            broken.push(format!("{}:{} {}", file.display(), v.line, v.rule));
        }
    }
    assert!(
        broken.is_empty(),
        "the pure core is impure:\n{}",
        broken.join("\n")
    );
}

#[test]
fn every_module_of_the_crate_is_a_listed_pure_module() {
    let lib = strip_comments(&std::fs::read_to_string(src().join("lib.rs")).unwrap());
    let mut declared: Vec<String> = lib
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("mod "))
                .or_else(|| line.strip_prefix("pub(crate) mod "))?;
            Some(rest.trim_end_matches(';').trim().to_owned())
        })
        .collect();
    declared.sort();
    let mut classified: Vec<String> = PURE_MODULES.iter().map(|m| (*m).to_owned()).collect();
    classified.sort();
    assert_eq!(
        declared, classified,
        "a module of lib.rs is not listed in tests/purity.rs: the core holds only pure modules"
    );
}

fn rules(source: &str) -> Vec<(usize, String)> {
    violations(source)
        .into_iter()
        .map(|v| (v.line, v.rule))
        .collect()
}

#[test]
fn the_checker_catches_each_kind_of_violation_in_a_crafted_source() {
    let crafted = r#"use crate::model::Command;
use crate::{ring::Ring, group::MetadataGroup};
use std::{collections::BTreeMap, time::Duration};
/* use tokio::net::TcpStream; /* nested */ still a comment */
// use openraft::Raft;
fn f() -> usize {
    let _ = crate::vnodes::VnodeHost::open;
    0
}
use super::membership::Member;
async fn g() {}
use std::fs;
static mut HITS: u64 = 0;
static FINE: u64 = 0;
let map: HashMap<u8, u8> = HashMap::new();
"#;
    let found = rules(crafted);
    let expected = [
        (2, "reaches `crate::group`, outside the pure core"),
        (3, "reaches `std::time`"),
        (7, "reaches `crate::vnodes`, outside the pure core"),
        (10, "reaches `super::membership`, outside the pure core"),
        (11, "uses `async`"),
        (12, "reaches `std::fs`"),
        (13, "uses `static mut`"),
        (15, "uses `HashMap`"),
    ];
    for (line, rule) in expected {
        assert!(
            found.contains(&(line, rule.to_owned())),
            "missed line {line}: {rule}; found {found:?}"
        );
    }
    assert!(
        !found.iter().any(|(line, _)| [1, 4, 5, 14].contains(line)),
        "flagged a pure import or a comment: {found:?}"
    );
    assert_eq!(found.iter().filter(|(line, _)| *line == 15).count(), 2);
    assert_eq!(found.len(), expected.len() + 1, "{found:?}");
}

#[test]
fn the_checker_passes_a_pure_source() {
    let clean = r#"//! Uses tokio in a doc comment only.
use crate::model::{MetadataState, RangeId};
use crate::ring::Ring;
use super::keyspace::Band;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
fn randomish(operand: u64) -> u64 { operand.rotate_left(7) }
"#;
    assert_eq!(rules(clean), Vec::<(usize, String)>::new());
}

/// The only crates the core may depend on: serialisation, errors, hashing,
/// MACs, PBKDF2 and constant-time comparison. None of them does I/O, reads
/// a clock or draws randomness.
/// `jsonwebtoken` and `serde_json` (ADR 0152) are computations like the
/// SCRAM crates: a signature checked and JSON read, with no clock (the core
/// turns the library's `exp`/`nbf` checks off and judges them against the
/// time it is given), no I/O and no randomness.
const ALLOWED_DEPENDENCIES: [&str; 11] = [
    "base64",
    "hmac",
    "jsonwebtoken",
    "pbkdf2",
    "rmp-serde",
    "serde",
    "serde_json",
    "sha2",
    "subtle",
    "thiserror",
    "xxhash-rust",
];

/// The names under `[dependencies]` of a manifest.
fn dependencies_of(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.', ' ']).next().unwrap_or_default();
            names.push(name.to_owned());
        }
    }
    names.sort();
    names
}

#[test]
fn the_manifest_depends_on_no_impure_crate() {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    assert!(
        !manifest.contains("[target."),
        "no target-specific dependencies in the pure core"
    );
    let deps = dependencies_of(&manifest);
    let unexpected: Vec<&String> = deps
        .iter()
        .filter(|d| !ALLOWED_DEPENDENCIES.contains(&d.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "the pure core may not depend on {unexpected:?}: move the code that needs it to malachi-cluster or malachi-membership"
    );
}

#[test]
fn the_manifest_check_reads_dependencies_only() {
    let crafted = "[package]\nname = \"x\"\n[dependencies]\nserde.workspace = true\ntokio = \"1\"\n# a comment\n[dev-dependencies]\nproptest.workspace = true\n";
    assert_eq!(dependencies_of(crafted), vec!["serde", "tokio"]);
}
