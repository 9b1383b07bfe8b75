//! One crafted history per anomaly the checker claims to find, each asserting
//! exactly what it finds; and the near misses each rule must let through.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use common::{History, clean, cursor};
use malachi_chaos_checker::{Anomaly, Verdict};

#[test]
fn given_a_clean_history_when_checked_should_find_nothing() {
    let report = clean().check();
    assert_eq!(report.anomalies, vec![]);
    assert_eq!(report.verdict, Verdict::Clean);
    assert_eq!(report.writes.acknowledged, 4);
    assert_eq!(report.records_read, 13);
    assert_eq!(report.passes, 4);
    assert_eq!(report.nemesis_events.get("kill"), Some(&1));
    assert_eq!(report.recoveries.len(), 1);
    assert_eq!(report.recoveries[0].recovery_ms, Some(20));
    assert_eq!(report.recoveries[0].reconverged_ms, Some(40));
}

#[test]
fn given_an_acked_write_missing_from_the_final_read_should_find_it_lost() {
    let mut h = History::new();
    h.write("k1", 1).write("k1", 2).write("k1", 3);
    h.read("final", "k1", 1)
        .read("final", "k1", 3)
        .final_read("final");
    assert_eq!(
        h.check().anomalies,
        vec![Anomaly::Lost {
            key: "k1".into(),
            seq: 2,
            acked_ms: 30,
            acked_line: 4,
            missed_by: vec!["final".into()],
            line: 9,
        }]
    );
}

#[test]
fn given_two_final_readers_missing_one_write_should_report_it_once_naming_both() {
    let mut h = History::new();
    h.write("k1", 1).write("k1", 2);
    h.read("f1", "k1", 1).final_read("f1");
    h.read("f2", "k1", 1).final_read("f2");
    let anomalies = h.check().anomalies;
    assert_eq!(anomalies.len(), 1);
    let Anomaly::Lost { seq, missed_by, .. } = &anomalies[0] else {
        panic!("not lost: {anomalies:?}");
    };
    assert_eq!(
        (*seq, missed_by.clone()),
        (2, vec!["f1".into(), "f2".into()])
    );
}

#[test]
fn given_a_final_read_that_found_nothing_should_find_every_acked_write_lost() {
    let mut h = History::new();
    h.write("k1", 1).send("k1", 2).unknown("k1", 2);
    h.final_read("final");
    let report = h.check();
    assert!(
        matches!(
            &report.anomalies[..],
            [Anomaly::Lost {
                seq: 1,
                line: 5,
                ..
            }]
        ),
        "{:?}",
        report.anomalies
    );
    assert_eq!(report.final_reads[0].records, 0);
}

#[test]
fn given_a_pinned_reader_short_of_the_others_should_find_the_read_differs_by_broker() {
    // Three writes acknowledged, one of unknown outcome that landed. The
    // reader pinned to b2 reached "the end" without two of them: the
    // acknowledged seq 2 (so also lost) and the unknown seq 3, which only
    // a comparison of the readers can catch.
    let mut h = History::new();
    h.write("k1", 1).write("k1", 2);
    h.send("k1", 3).unknown("k1", 3);
    h.write("k2", 1);
    for key_seq in [("k1", 1), ("k1", 2), ("k1", 3), ("k2", 1)] {
        h.read("final-b1", key_seq.0, key_seq.1);
    }
    h.final_read_at("final-b1", "10.77.9.11:4040");
    h.read("final-b2", "k1", 1).read("final-b2", "k2", 1);
    h.final_read_at("final-b2", "10.77.9.12:4040");
    let short_line = h.last_line();
    for key_seq in [("k1", 1), ("k1", 2), ("k1", 3), ("k2", 1)] {
        h.read("final", key_seq.0, key_seq.1);
    }
    h.final_read("final");
    let report = h.check();
    let differs: Vec<&Anomaly> = report
        .anomalies
        .iter()
        .filter(|a| a.kind() == "read_differs_by_broker")
        .collect();
    assert_eq!(
        differs,
        vec![&Anomaly::ReadDiffersByBroker {
            consumer: "final-b2".into(),
            broker: Some("10.77.9.12:4040".into()),
            missing: 2,
            missing_acked: 1,
            examples: vec!["k1:2".into(), "k1:3".into()],
            seen_by: vec!["final-b1".into(), "final".into()],
            line: short_line,
        }]
    );
    // The acknowledged one is lost for that reader alone; nothing else.
    assert_eq!(report.anomaly_counts.get("lost"), Some(&1));
    assert_eq!(report.anomalies.len(), 2);
    assert_eq!(
        report.final_reads[1].broker.as_deref(),
        Some("10.77.9.12:4040")
    );
    assert_eq!(report.verdict, Verdict::Anomalous);
}

#[test]
fn given_a_write_of_unknown_outcome_first_seen_after_a_reader_ended_should_not_find_it_short() {
    // `live` ended its read before anyone saw k1:2 (unknown outcome): it
    // may have been committed after `live`'s last poll (a slow quorum or a
    // failover's seal), so `live` lacking it is no difference between
    // brokers (seen in `20261205T171426Z-short-seed42`). A reader that
    // ended after another had delivered it is short (the test below).
    let mut h = History::new();
    h.write("k1", 1);
    h.send("k1", 2).unknown("k1", 2);
    h.read("live", "k1", 1).final_read("live");
    h.read("final", "k1", 1).read("final", "k1", 2);
    h.final_read("final");
    let report = h.check();
    assert_eq!(report.anomalies, vec![]);
    assert_eq!(report.verdict, Verdict::Clean);
}

#[test]
fn given_a_record_of_unknown_outcome_seen_by_one_reader_only_should_find_the_reader_short() {
    // No acknowledged write is missing, so nothing is lost: the difference
    // alone makes the run anomalous. `live`, which followed the run, is a
    // final reader like the pinned ones.
    let mut h = History::new();
    h.write("k1", 1);
    h.send("k1", 2).unknown("k1", 2);
    h.read("live", "k1", 1)
        .read("live", "k1", 2)
        .final_read("live");
    h.read("final-b1", "k1", 1);
    h.final_read_at("final-b1", "b1:4040");
    let anomalies = h.check().anomalies;
    assert!(
        matches!(
            &anomalies[..],
            [Anomaly::ReadDiffersByBroker { consumer, missing: 1, missing_acked: 0, seen_by, .. }]
                if consumer == "final-b1" && seen_by == &vec!["live".to_owned()]
        ),
        "{anomalies:?}"
    );
}

#[test]
fn given_final_reads_that_agree_in_another_order_should_find_no_difference() {
    // Pinned readers may be served by different brokers and see keys
    // interleaved differently; only what they delivered is compared.
    let mut h = History::new();
    h.write("k1", 1).write("k2", 1).write("k1", 2);
    h.read("final-b1", "k1", 1)
        .read("final-b1", "k2", 1)
        .read("final-b1", "k1", 2);
    h.read("final-b2", "k2", 1)
        .read("final-b2", "k1", 1)
        .read("final-b2", "k1", 2);
    h.final_read_at("final-b1", "b1:4040");
    h.final_read_at("final-b2", "b2:4040");
    h.final_read("final");
    let report = h.check();
    // `final` read nothing: short of both, and every write lost for it.
    assert_eq!(
        report.anomaly_counts.get("read_differs_by_broker"),
        Some(&1)
    );
    assert_eq!(report.anomaly_counts.get("lost"), Some(&3));
    let mut h2 = History::new();
    h2.lines = h.lines[..h.lines.len() - 1].to_vec();
    h2.t_ms = h.t_ms;
    assert_eq!(h2.check().anomalies, vec![]);
}

#[test]
fn given_writes_not_acknowledged_when_missing_from_the_final_read_should_not_be_lost() {
    let mut h = History::new();
    h.write("k1", 1);
    h.send("k1", 2).unknown("k1", 2);
    h.send("k1", 3).fail("k1", 3);
    h.send("k1", 4);
    h.read("final", "k1", 1).final_read("final");
    // Acknowledged only after the final read: not that reader's to see.
    h.ok("k1", 4);
    assert_eq!(h.check().anomalies, vec![]);
}

#[test]
fn given_a_record_delivered_twice_in_one_pass_should_find_a_duplicate() {
    let mut h = History::new();
    h.write("k1", 1).write("k1", 2);
    h.read("c", "k1", 1).read("c", "k1", 2).read("c", "k1", 2);
    assert_eq!(
        h.check().anomalies,
        vec![Anomaly::Duplicate {
            consumer: "c".into(),
            pass: 0,
            key: "k1".into(),
            seq: 2,
            line: 7,
            t_ms: 60,
        }]
    );
}

#[test]
fn given_a_resume_from_an_old_cursor_when_records_are_reread_should_not_find_duplicates() {
    let mut h = History::new();
    h.write("k1", 1).write("k1", 2).write("k1", 3);
    h.read("c", "k1", 1).read("c", "k1", 2).read("c", "k1", 3);
    h.resume("c", &cursor("k1", 1));
    h.read("c", "k1", 2).read("c", "k1", 3);
    assert_eq!(h.check().anomalies, vec![]);
}

#[test]
fn given_a_lower_seq_after_a_higher_one_acked_first_should_find_order_broken() {
    let mut h = History::new();
    h.write("k1", 1).write("k1", 2);
    h.read("c", "k1", 2).read("c", "k1", 1);
    assert_eq!(
        h.check().anomalies,
        vec![Anomaly::OrderBroken {
            consumer: "c".into(),
            pass: 0,
            key: "k1".into(),
            earlier_seq: 1,
            later_seq: 2,
            earlier_delivered: true,
            line: 6,
            t_ms: 50,
        }]
    );
}

#[test]
fn given_a_gap_filled_later_in_a_resumed_pass_should_find_order_broken_once() {
    let mut h = History::new();
    h.write("k1", 1)
        .write("k1", 2)
        .write("k1", 3)
        .write("k1", 4);
    h.read("c", "k1", 1);
    h.resume("c", &cursor("k1", 1));
    // Seq 3 before seq 2, which was acknowledged before 3 was sent.
    h.read("c", "k1", 3).read("c", "k1", 2).read("c", "k1", 4);
    assert_eq!(
        h.check().anomalies,
        vec![Anomaly::OrderBroken {
            consumer: "c".into(),
            pass: 1,
            key: "k1".into(),
            earlier_seq: 2,
            later_seq: 3,
            earlier_delivered: true,
            line: 12,
            t_ms: 110,
        }]
    );
}

#[test]
fn given_a_gap_never_filled_in_a_live_pass_should_find_order_broken() {
    let mut h = History::new();
    h.write("k1", 1).write("k1", 2).write("k1", 3);
    h.read("c", "k1", 1).read("c", "k1", 3);
    assert_eq!(
        h.check().anomalies,
        vec![Anomaly::OrderBroken {
            consumer: "c".into(),
            pass: 0,
            key: "k1".into(),
            earlier_seq: 2,
            later_seq: 3,
            earlier_delivered: false,
            line: 8,
            t_ms: 70,
        }]
    );
}

#[test]
fn given_overlapping_writes_when_delivered_in_either_order_should_not_find_order_broken() {
    let mut h = History::new();
    // Seq 2 is sent before seq 1 is acknowledged: the log may hold 2 first.
    h.send("k1", 1).send("k1", 2).ok("k1", 1).ok("k1", 2);
    // Seq 3's outcome is unknown: it may land after seq 4.
    h.send("k1", 3).unknown("k1", 3).write("k1", 4);
    h.read("c", "k1", 2)
        .read("c", "k1", 1)
        .read("c", "k1", 4)
        .read("c", "k1", 3);
    assert_eq!(h.check().anomalies, vec![]);
}

#[test]
fn given_a_read_of_a_seq_never_sent_should_find_never_written() {
    let mut h = History::new();
    h.write("k1", 1);
    h.read_value("c", "k9", 1, "k9:1");
    assert_eq!(
        h.check().anomalies,
        vec![Anomaly::NeverWritten {
            consumer: "c".into(),
            key: "k9".into(),
            seq: 1,
            value: "k9:1".into(),
            seq_was_written: false,
            line: 3,
            t_ms: 20,
        }]
    );
}

#[test]
fn given_a_read_of_a_value_other_than_the_one_sent_should_find_never_written() {
    let mut h = History::new();
    h.write("k1", 1);
    h.read_value("c", "k1", 1, "garbage");
    assert_eq!(
        h.check().anomalies,
        vec![Anomaly::NeverWritten {
            consumer: "c".into(),
            key: "k1".into(),
            seq: 1,
            value: "garbage".into(),
            seq_was_written: true,
            line: 3,
            t_ms: 20,
        }]
    );
}

#[test]
fn given_a_read_of_an_unknown_or_in_flight_write_should_find_nothing() {
    let mut h = History::new();
    h.send("k1", 1).read("c", "k1", 1).unknown("k1", 1);
    h.send("k1", 2).read("c", "k1", 2);
    assert_eq!(h.check().anomalies, vec![]);
}

#[test]
fn given_a_read_of_a_failed_write_in_either_order_should_find_it() {
    let mut h = History::new();
    h.send("k1", 1).fail("k1", 1).read("c", "k1", 1);
    h.send("k1", 2).read("c", "k1", 2).fail("k1", 2);
    assert_eq!(
        h.check().anomalies,
        vec![
            Anomaly::ReadOfFailedWrite {
                consumer: "c".into(),
                key: "k1".into(),
                seq: 1,
                read_line: 3,
                failed_line: 2,
                line: 3,
            },
            Anomaly::ReadOfFailedWrite {
                consumer: "c".into(),
                key: "k1".into(),
                seq: 2,
                read_line: 5,
                failed_line: 6,
                line: 6,
            },
        ]
    );
}

#[test]
fn given_a_resume_when_a_record_before_the_cursor_is_delivered_should_find_cursor_backwards() {
    let mut h = History::new();
    h.write("k1", 1).write("k1", 2).write("k1", 3);
    h.read("c", "k1", 1).read("c", "k1", 2);
    h.resume("c", &cursor("k1", 2));
    h.read("c", "k1", 2).read("c", "k1", 3);
    assert_eq!(
        h.check().anomalies,
        vec![Anomaly::CursorBackwards {
            consumer: "c".into(),
            pass: 1,
            cursor: cursor("k1", 2),
            key: "k1".into(),
            cursor_seq: 2,
            delivered_seq: 2,
            line: 10,
            t_ms: 90,
        }]
    );
}

/// Regression (the five-broker long run `20261205T184229Z-long-seed3605`):
/// a failed session's batch of unknown outcome (seq 2) was applied after
/// the next session's seq 3, and a cursor given after seq 3 was followed,
/// rightly, by seq 2. The old rule (anything at or below the highest seq
/// read with the cursor) called that 16 times `cursor_backwards`.
#[test]
fn given_a_late_record_of_unknown_outcome_after_the_cursor_should_not_find_cursor_backwards() {
    let mut h = History::new();
    h.write("k1", 1)
        .send("k1", 2)
        .unknown("k1", 2)
        .write("k1", 3);
    h.read("c", "k1", 1).read("c", "k1", 3);
    // Seq 2 lands now, after 3, and the pass reads it.
    h.read("c", "k1", 2);
    h.resume("c", &cursor("k1", 3));
    h.read("c", "k1", 2);
    assert_eq!(h.check().anomalies, vec![]);
    // Resuming from the cursor given with seq 2 floors it, and seq 1 and 3.
    let mut h = History::new();
    h.write("k1", 1)
        .send("k1", 2)
        .unknown("k1", 2)
        .write("k1", 3);
    h.read("c", "k1", 1).read("c", "k1", 3).read("c", "k1", 2);
    h.resume("c", &cursor("k1", 2));
    h.read("c", "k1", 3);
    let anomalies = h.check().anomalies;
    assert!(
        matches!(
            &anomalies[..],
            [Anomaly::CursorBackwards {
                cursor_seq: 3,
                delivered_seq: 3,
                ..
            }]
        ),
        "{anomalies:?}"
    );
}

/// Two consumers at one position are given the same cursor: a resume from
/// it is floored by whichever was given it last, even while that one's
/// pass is still reading.
#[test]
fn given_a_cursor_another_consumer_is_still_reading_with_should_floor_the_resume() {
    let mut h = History::new();
    h.write("k1", 1).write("k1", 2).write("k1", 3);
    h.read("r", "k1", 1)
        .read("live", "k1", 1)
        .read("live", "k1", 2);
    h.resume("r", &cursor("k1", 2)).read("r", "k1", 2);
    let anomalies = h.check().anomalies;
    assert!(
        matches!(&anomalies[..], [Anomaly::CursorBackwards { consumer, delivered_seq: 2, .. }] if consumer == "r"),
        "{anomalies:?}"
    );
}

/// A pass resumed from C1 gives C2: what preceded C1 precedes C2 too.
#[test]
fn given_a_second_resume_should_floor_what_preceded_the_first_cursor() {
    let mut h = History::new();
    h.write("k1", 1).write("k1", 2).write("k1", 3);
    h.read("c", "k1", 1).read("c", "k1", 2);
    h.resume("c", &cursor("k1", 2)).read("c", "k1", 3);
    h.resume("c", &cursor("k1", 3)).read("c", "k1", 1);
    let anomalies = h.check().anomalies;
    assert!(
        matches!(
            &anomalies[..],
            [Anomaly::CursorBackwards {
                delivered_seq: 1,
                ..
            }]
        ),
        "{anomalies:?}"
    );
}

#[test]
fn given_a_cursor_carried_by_a_whole_batch_should_floor_every_key_in_it() {
    let mut h = History::new();
    h.write("a", 1).write("b", 1);
    // Both records came in one batch and carry its next_cursor.
    for key in ["a", "b"] {
        h.event(
            "read",
            serde_json::json!({"consumer": "c", "key": key, "seq": 1,
                               "value": common::value(key, 1), "cursor": "batch-1"}),
        );
    }
    h.resume("c", "batch-1").read("c", "b", 1);
    let anomalies = h.check().anomalies;
    assert!(
        matches!(&anomalies[..], [Anomaly::CursorBackwards { key, cursor_seq: 1, delivered_seq: 1, .. }] if key == "b"),
        "{anomalies:?}"
    );
}

#[test]
fn given_sealed_copies_whose_valid_bytes_differ_should_find_them_diverging() {
    let mut h = History::new();
    h.copies(
        7,
        4096,
        &[("b1", 4096, 1), ("b2", 8192, 1), ("b3", 4096, 2)],
    );
    assert_eq!(
        h.check().anomalies,
        vec![Anomaly::CopiesDiverge {
            topic: "chaos".into(),
            segment: 7,
            seal_len: 4096,
            crc32_by_broker: BTreeMap::from([("b1".into(), 1), ("b2".into(), 1), ("b3".into(), 2)]),
            line: 1,
            t_ms: 0,
        }]
    );
}

#[test]
fn given_a_sealed_copy_short_of_the_seal_at_the_end_should_find_a_short_copy() {
    let mut h = History::new();
    h.copies(
        7,
        4096,
        &[("b1", 4096, 1), ("b2", 4096, 1), ("b3", 1000, 9)],
    );
    assert_eq!(
        h.check().anomalies,
        vec![Anomaly::ShortCopy {
            topic: "chaos".into(),
            segment: 7,
            broker: "b3".into(),
            valid_len: 1000,
            seal_len: 4096,
            line: 1,
            t_ms: 0,
        }]
    );
}

#[test]
fn given_a_heal_followed_by_a_late_acknowledgement_should_find_slow_recovery() {
    let mut h = History::new();
    h.nemesis("partition", "b1").heal("partition");
    h.send("k1", 1).at(40_000).ok("k1", 1);
    assert_eq!(
        h.check().anomalies,
        vec![Anomaly::SlowRecovery {
            event: "partition".into(),
            target: "b1".into(),
            heal_line: 2,
            heal_ms: 10,
            recovery_ms: Some(39_990),
            bound_ms: 30_000,
        }]
    );
}

#[test]
fn given_a_heal_with_no_acknowledgement_after_it_should_find_slow_recovery() {
    let mut h = History::new();
    h.write("k1", 1).nemesis("pause", "b3").heal("pause");
    h.send("k1", 2).unknown("k1", 2);
    assert_eq!(
        h.check().anomalies,
        vec![Anomaly::SlowRecovery {
            event: "pause".into(),
            target: "b3".into(),
            heal_line: 4,
            heal_ms: 30,
            recovery_ms: None,
            bound_ms: 30_000,
        }]
    );
}

#[test]
fn given_recovery_exactly_at_the_bound_should_find_nothing() {
    let mut h = History::new();
    h.nemesis("kill", "b1").at(1_000).heal("kill");
    h.send("k1", 1).at(31_000).ok("k1", 1);
    assert_eq!(h.check().anomalies, vec![]);
}

#[test]
fn given_anomalies_should_list_them_in_line_order() {
    let mut h = History::new();
    h.nemesis("kill", "b1").heal("kill");
    h.write("k1", 1).write("k1", 2);
    h.read("c", "k1", 1).read("c", "k1", 1);
    h.read("final", "k1", 1).final_read("final");
    h.copies(1, 10, &[("b1", 5, 0)]);
    let kinds: Vec<&str> = h.check().anomalies.iter().map(Anomaly::kind).collect();
    assert_eq!(kinds, vec!["duplicate", "lost", "short_copy"]);
}
