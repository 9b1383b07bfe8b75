//! `docs/ARCHITECTURE.md` stays short and true (issue 37): every path it
//! names exists, every source folder of the workspace is named, it reads in
//! about ten minutes, and the ADR index lists every decision record.
//!
//! A "path" is a backticked token that names a file by its extension
//! (`.rs`, `.md`, `.toml`, `.py`, `.c`) or a folder by a trailing `/`, and
//! is written from the repository's root. Tokens that only look like paths
//! (an actor's tree name such as `segment/<topic>`) have neither and are
//! not checked. The checks are tested on crafted text first, so they cannot
//! pass by finding nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// About ten minutes at 300 words a minute.
const WORDS_MAX: usize = 3_000;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Backticked tokens of `text` that claim to be repository paths.
fn named_paths(text: &str) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    for (i, piece) in text.split('`').enumerate() {
        if i % 2 == 0 {
            continue;
        }
        let is_pathlike = !piece.is_empty()
            && piece
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c));
        let claims = piece.ends_with('/')
            || [".rs", ".md", ".toml", ".py", ".c"]
                .iter()
                .any(|ext| piece.ends_with(ext) && piece.contains('/'));
        if is_pathlike && claims && !piece.starts_with("../") {
            paths.insert(piece.to_owned());
        }
    }
    paths
}

/// Every folder under a workspace member's `src/` that holds a `.rs` file,
/// from the repository's root, with a trailing `/` (the members' `src/`
/// folders themselves included).
fn source_folders(root: &Path) -> BTreeSet<String> {
    let mut folders = BTreeSet::new();
    let members = [
        "src",
        "storage/src",
        "supervision/src",
        "cluster/src",
        "wire/src",
        "actors/src",
        "bench/src",
        "fuzz-bodies/src",
        "chaos/checker/src",
        "chaos/driver/src",
    ];
    for member in members {
        walk(root, &root.join(member), &mut folders);
    }
    folders
}

fn walk(root: &Path, dir: &Path, folders: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut has_source = false;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() && path.file_name().is_some_and(|n| n != "snapshots") {
            walk(root, &path, folders);
        } else if path.extension().is_some_and(|e| e == "rs") {
            has_source = true;
        }
    }
    if has_source {
        let relative = dir.strip_prefix(root).unwrap().to_string_lossy();
        folders.insert(format!("{relative}/"));
    }
}

/// The ADR files `index` links to, and the ADR files in `dir`.
fn adr_listing(dir: &Path, index: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let listed = index
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter(|link| link.ends_with(".md") && !link.contains('/'))
        .map(str::to_owned)
        .collect();
    let present = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md") && name.as_bytes()[0].is_ascii_digit())
        .collect();
    (listed, present)
}

fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

#[test]
fn the_checks_find_what_they_look_for() {
    let text = "see `actors/src/broker.rs`, `docs/`, `segment/<topic>`, \
                `../shared/seeds/architecture.md`, `Broker::start` and `lib.rs`";
    let paths = named_paths(text);
    assert_eq!(
        paths,
        ["actors/src/broker.rs", "docs/"]
            .into_iter()
            .map(String::from)
            .collect()
    );
    let folders = source_folders(&root());
    assert!(folders.contains("actors/src/serve/"), "{folders:?}");
    assert!(folders.contains("src/cli/"), "{folders:?}");
    assert!(!folders.iter().any(|f| f.contains("snapshots")));
    let (listed, _) = adr_listing(
        &root().join("docs/adr"),
        "| [0001](0001-a.md) | x |\n[guide](../guides/x.md)",
    );
    assert_eq!(listed.len(), 1);
    assert_eq!(words("one two\nthree"), 3);
}

#[test]
fn every_path_the_map_names_exists() {
    let map = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let missing: Vec<String> = named_paths(&map)
        .into_iter()
        .filter(|p| !root().join(p).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

#[test]
fn every_source_folder_is_named_in_the_map() {
    let map = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let named = named_paths(&map);
    let unnamed: Vec<String> = source_folders(&root())
        .into_iter()
        .filter(|folder| !named.contains(folder))
        .collect();
    assert!(
        unnamed.is_empty(),
        "docs/ARCHITECTURE.md does not name these source folders: {unnamed:?}"
    );
}

#[test]
fn the_map_reads_in_about_ten_minutes() {
    let map = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let count = words(&map);
    assert!(
        count <= WORDS_MAX,
        "docs/ARCHITECTURE.md has {count} words; at most {WORDS_MAX}"
    );
}

#[test]
fn the_adr_index_lists_every_decision_record() {
    let dir = root().join("docs/adr");
    let index = std::fs::read_to_string(dir.join("README.md")).unwrap();
    let (listed, present) = adr_listing(&dir, &index);
    let unlisted: Vec<_> = present.difference(&listed).collect();
    let dangling: Vec<_> = listed.difference(&present).collect();
    assert!(
        unlisted.is_empty(),
        "ADRs missing from docs/adr/README.md: {unlisted:?}"
    );
    assert!(
        dangling.is_empty(),
        "docs/adr/README.md lists missing files: {dangling:?}"
    );
}
