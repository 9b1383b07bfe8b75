//! `malachi cluster version` and `malachi feature list|activate|finalize`
//! end to end against a broker process (ADR 0134): the broker advertises
//! its versions and features, the baseline is active, activating a feature
//! no broker supports fails with one line naming it, and finalize makes
//! every active feature final and sets the cluster version.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use common::{BrokerProcess, malachi, ok, one_line_failure, out};
use std::time::Duration;

/// The binary's version, which moves with releases, as `[version]`.
fn stable(text: &str) -> String {
    text.replace(env!("CARGO_PKG_VERSION"), "[version]")
}

#[test]
fn cluster_version_and_feature_list_activate_finalize_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"));
    let b = broker.client_addr.as_str();

    // The broker advertises itself in the background on start.
    let version = malachi_testkit::wait::wait_until_blocking(
        "the broker advertises itself in `cluster version`",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let text = out(&ok(malachi(b, &["cluster", "version"], "")));
            text.contains("node 1 ").then_some(text)
        },
    );
    insta::assert_snapshot!("cluster_version_before_finalize", stable(&version));
    let listed = out(&ok(malachi(b, &["feature", "list"], "")));
    insta::assert_snapshot!("feature_list_before_finalize", listed);

    let line = one_line_failure(&malachi(b, &["feature", "activate", "no_such_feature"], ""));
    assert!(
        line.contains("feature_unavailable") && line.contains("no_such_feature"),
        "{line}"
    );

    let finalized = out(&ok(malachi(b, &["feature", "finalize"], "")));
    assert!(
        finalized.lines().all(|l| l.ends_with("finalized")),
        "{finalized}"
    );
    let version = out(&ok(malachi(b, &["cluster", "version"], "")));
    insta::assert_snapshot!("cluster_version_after_finalize", stable(&version));
    let json = out(&ok(malachi(b, &["cluster", "version", "--json"], "")));
    let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(value["cluster_version"], 1, "{json}");
    assert_eq!(value["brokers"][0]["node_id"], 1, "{json}");
    let json = out(&ok(malachi(b, &["feature", "list", "--json"], "")));
    assert!(
        json.lines()
            .any(|l| l.contains("\"name\":\"waited_lease\"")
                && l.contains("\"state\":\"finalized\"")),
        "{json}"
    );
}
