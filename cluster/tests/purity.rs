//! The model and the cursor codec stay pure: no clock, randomness, filesystem,
//! network or hash-ordered collection in their code. This guards the
//! architecture invariant stated in `model/mod.rs` against a casual import.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

const FORBIDDEN: [&str; 10] = [
    "std::time",
    "SystemTime",
    "Instant",
    "rand",
    "std::fs",
    "std::net",
    "tokio",
    "HashMap",
    "HashSet",
    "std::env",
];

fn code_lines(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .map(|(i, line)| (i + 1, line.to_owned()))
        .collect()
}

#[test]
fn the_model_and_cursor_sources_import_nothing_impure() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files: Vec<_> = std::fs::read_dir(root.join("model"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.push(root.join("cursor.rs"));
    assert!(
        files.len() >= 7,
        "expected the model's files, found {files:?}"
    );
    for file in files {
        for (number, line) in code_lines(&file) {
            for word in FORBIDDEN {
                let hit = line.match_indices(word).any(|(at, _)| {
                    !line[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
                        && !line[at + word.len()..]
                            .starts_with(|c: char| c.is_alphanumeric() || c == '_')
                });
                assert!(!hit, "{}:{number} uses {word}: {line}", file.display());
            }
        }
    }
}
