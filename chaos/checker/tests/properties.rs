//! Properties over generated histories: a run that keeps every promise is
//! clean, and taking one acknowledged record out of the final read yields
//! exactly one lost write.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{History, value};
use malachi_chaos_checker::{Anomaly, Verdict};
use proptest::prelude::*;
use serde_json::json;

/// A generated clean run and where its final reads are.
struct Run {
    history: History,
    /// Index into `history.lines` of each final read of an acknowledged
    /// record, with its key and seq.
    final_acked_reads: Vec<(usize, String, u64)>,
}

/// The cursor a broker returns after log position `i`.
fn cursor_after(i: usize) -> String {
    format!("pos-{i}")
}

fn read_at(h: &mut History, consumer: &str, log: &[(String, u64)], i: usize) {
    let (key, seq) = &log[i];
    h.event(
        "read",
        json!({"consumer": consumer, "key": key, "seq": seq, "value": value(key, *seq),
               "cursor": cursor_after(i)}),
    );
}

/// Interprets `actions` as a random interleaving of per-key sequential
/// writes (one in flight per key), a live reader, and a reader that resumes
/// from cursors it was given earlier, then ends with a heal, one more
/// acknowledged write and a final read of the whole log.
///
/// A write lands in the log when it is sent (the broker orders it then);
/// a rejected write is failed at once and never lands; one in six landed
/// writes gets an unknown outcome instead of an acknowledgement.
fn generate(keys: usize, actions: &[u16]) -> Run {
    let key_names: Vec<String> = (0..keys).map(|k| format!("k{k}")).collect();
    let mut h = History::new();
    let mut log: Vec<(String, u64)> = Vec::new();
    let mut acked: Vec<bool> = Vec::new();
    let mut next_seq = vec![1u64; keys];
    // Per key: the log position of its write in flight.
    let mut in_flight: Vec<Option<usize>> = vec![None; keys];
    let mut live = 0usize;
    let mut resumer = 0usize;

    h.nemesis("kill", "b1");
    for &action in actions {
        let choice = usize::from(action) / 5;
        let k = choice % keys;
        match action % 5 {
            0 if in_flight[k].is_none() => {
                let key = key_names[k].clone();
                let seq = next_seq[k];
                next_seq[k] += 1;
                h.send(&key, seq);
                if choice % 7 == 6 {
                    h.fail(&key, seq);
                } else {
                    log.push((key, seq));
                    acked.push(false);
                    in_flight[k] = Some(log.len() - 1);
                }
            }
            1 => {
                if let Some(i) = in_flight[k].take() {
                    let (key, seq) = log[i].clone();
                    if choice % 6 == 5 {
                        h.unknown(&key, seq);
                    } else {
                        h.ok(&key, seq);
                        acked[i] = true;
                    }
                }
            }
            2 if live < log.len() => {
                read_at(&mut h, "live", &log, live);
                live += 1;
            }
            3 if resumer < log.len() => {
                read_at(&mut h, "resumer", &log, resumer);
                resumer += 1;
            }
            4 if resumer > 0 => {
                // Back to the cursor after a record it already read.
                let i = choice % resumer;
                h.resume("resumer", &cursor_after(i));
                resumer = i + 1;
            }
            _ => {}
        }
    }
    h.heal("kill");
    for slot in in_flight.iter_mut() {
        if let Some(i) = slot.take() {
            let (key, seq) = log[i].clone();
            h.ok(&key, seq);
            acked[i] = true;
        }
    }
    // One write acknowledged after the heal, so availability came back.
    let seq = next_seq[0];
    h.write(&key_names[0], seq);
    log.push((key_names[0].clone(), seq));
    acked.push(true);

    let mut final_acked_reads = Vec::new();
    for i in 0..log.len() {
        read_at(&mut h, "final", &log, i);
        if acked[i] {
            final_acked_reads.push((h.lines.len() - 1, log[i].0.clone(), log[i].1));
        }
    }
    h.final_read("final");
    h.copies(1, 100, &[("b1", 100, 5), ("b2", 100, 5), ("b3", 120, 5)]);
    Run {
        history: h,
        final_acked_reads,
    }
}

proptest! {
    #[test]
    fn a_generated_clean_history_has_no_anomaly(
        keys in 1usize..5,
        actions in proptest::collection::vec(any::<u16>(), 0..300),
    ) {
        let run = generate(keys, &actions);
        let report = run.history.check();
        prop_assert_eq!(&report.anomalies, &vec![]);
        prop_assert_eq!(report.verdict, Verdict::Clean);
    }

    #[test]
    fn removing_one_acked_read_from_the_final_pass_yields_exactly_one_lost(
        keys in 1usize..5,
        actions in proptest::collection::vec(any::<u16>(), 0..300),
        pick in any::<prop::sample::Index>(),
    ) {
        let mut run = generate(keys, &actions);
        let (line, key, seq) = run.final_acked_reads[pick.index(run.final_acked_reads.len())].clone();
        run.history.lines.remove(line);
        let anomalies = run.history.check().anomalies;
        prop_assert_eq!(anomalies.len(), 1, "{:?}", anomalies);
        let is_the_one = matches!(
            &anomalies[0],
            Anomaly::Lost { key: k, seq: s, missed_by, .. }
                if *k == key && *s == seq && missed_by == &vec!["final".to_owned()]
        );
        prop_assert!(is_the_one, "{:?}", anomalies);
    }
}
