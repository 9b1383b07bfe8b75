//! The summary table a person reads after a run, pinned by a snapshot.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{History, cursor};

#[test]
fn summary_table_of_a_small_run_with_one_lost_write() {
    let mut h = History::new();
    h.nemesis("kill", "b2").nemesis("partition", "b1");
    h.write("k1", 1).read("live", "k1", 1);
    h.heal("kill");
    h.write("k1", 2).read("live", "k1", 2);
    h.at(1_000).reconverged("kill");
    h.heal("partition");
    h.send("k2", 1).unknown("k2", 1);
    h.write("k2", 2).read("live", "k2", 2);
    h.resume("live", &cursor("k1", 1)).read("live", "k1", 2);
    h.read("final", "k1", 1)
        .read("final", "k2", 2)
        .final_read("final");
    h.copies(
        4,
        2048,
        &[("b1", 2048, 7), ("b2", 2048, 7), ("b3", 2048, 7)],
    );
    let report = h.check();
    insta::assert_snapshot!(report.summary());
}
