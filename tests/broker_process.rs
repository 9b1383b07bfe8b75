//! The broker as a process: it serves until SIGTERM, then shuts down in
//! order and exits 0 without a warning, and what it acknowledged before is
//! there after a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use common::{BrokerProcess, malachi, ok, out};

#[test]
fn sigterm_shuts_the_broker_down_in_order_and_exits_zero_keeping_acknowledged_records() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut broker = BrokerProcess::start(&data);
    let b = broker.client_addr.clone();
    ok(malachi(&b, &["topic", "create", "kept"], ""));
    ok(malachi(&b, &["produce", "kept"], "k\tv1\nk\tv2\n"));
    assert_eq!(broker.terminate(), Some(0), "log:\n{}", broker.log());

    let again = BrokerProcess::start_on(&data, &broker.client_addr, &broker.admin_addr);
    let consumed = ok(malachi(
        &again.client_addr,
        &["consume", "kept", "--from-start"],
        "",
    ));
    assert_eq!(out(&consumed), "k\tv1\nk\tv2\n");
}

#[test]
fn a_plain_start_work_and_stop_warns_of_nothing_at_the_default_log_levels() {
    // Issue 18: an expected condition is never logged as a warning. A lone
    // broker with no cookie configured on loopback is such a condition.
    let dir = tempfile::tempdir().unwrap();
    let mut broker = BrokerProcess::start_with_default_logs(&dir.path().join("data"));
    let b = broker.client_addr.clone();
    ok(malachi(&b, &["topic", "create", "quiet"], ""));
    ok(malachi(&b, &["produce", "quiet"], "k\tv1\nk\tv2\n"));
    ok(malachi(&b, &["consume", "quiet", "--from-start"], ""));
    assert_eq!(broker.terminate(), Some(0), "log:\n{}", broker.log());
    let log = broker.log();
    assert!(
        log.contains("INFO"),
        "the default levels log at info:\n{log}"
    );
    assert!(
        !log.contains("WARN") && !log.contains("ERROR"),
        "a plain start, produce, consume and stop logged:\n{log}"
    );
}
