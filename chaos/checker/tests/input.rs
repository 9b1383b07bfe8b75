//! Vacuity gates, and histories the checker refuses to judge.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{History, clean, lenient};
use malachi_chaos_checker::{Anomaly, CheckError, Checker, Config, Event, Vacuity, Verdict, check};

fn check_text(text: &str) -> Result<malachi_chaos_checker::Report, CheckError> {
    check(text.as_bytes(), &lenient())
}

#[test]
fn given_too_few_acknowledged_writes_should_be_vacuous() {
    let config = Config {
        min_acked: 5,
        ..lenient()
    };
    let report = check(clean().text().as_bytes(), &config).unwrap();
    assert_eq!(report.verdict, Verdict::Vacuous);
    assert_eq!(
        report.vacuity,
        vec![Vacuity::TooFewAcknowledged {
            acknowledged: 4,
            min_acked: 5,
        }]
    );
    assert_eq!(report.anomalies, vec![]);
}

#[test]
fn given_too_few_nemesis_events_should_be_vacuous() {
    let config = Config {
        min_events: 2,
        ..lenient()
    };
    let report = check(clean().text().as_bytes(), &config).unwrap();
    assert_eq!(report.verdict, Verdict::Vacuous);
    assert_eq!(
        report.vacuity,
        vec![Vacuity::TooFewEvents {
            events: 1,
            min_events: 2,
        }]
    );
}

#[test]
fn given_no_final_read_should_be_vacuous() {
    let mut h = History::new();
    h.write("k1", 1).read("c", "k1", 1);
    let report = h.check();
    assert_eq!(report.verdict, Verdict::Vacuous);
    assert_eq!(report.vacuity, vec![Vacuity::NoFinalRead]);
}

#[test]
fn given_the_default_gates_an_empty_history_should_be_vacuous() {
    let report = check(&b""[..], &Config::default()).unwrap();
    assert_eq!(report.verdict, Verdict::Vacuous);
    assert_eq!(report.vacuity.len(), 3);
    assert_eq!(report.verdict.exit_code(), 2);
}

#[test]
fn given_an_anomaly_in_a_vacuous_run_should_be_anomalous() {
    let mut h = History::new();
    h.write("k1", 1).read("c", "k1", 1).read("c", "k1", 1);
    let report = h.check();
    assert_eq!(report.verdict, Verdict::Anomalous);
    assert_eq!(report.vacuity, vec![Vacuity::NoFinalRead]);
    assert!(matches!(report.anomalies[..], [Anomaly::Duplicate { .. }]));
}

#[test]
fn given_a_malformed_line_should_refuse_naming_its_line() {
    let mut h = History::new();
    h.write("k1", 1);
    let text = format!(
        "{}{{\"kind\": \"read\", \"t_ms\": 30, \"consumer\"\n",
        h.text()
    );
    let error = check_text(&text).unwrap_err();
    assert!(
        matches!(error, CheckError::Malformed { line: 3, .. }),
        "{error}"
    );
    assert!(
        error.to_string().starts_with("line 3: malformed event"),
        "{error}"
    );
}

#[test]
fn given_an_unknown_kind_or_a_missing_field_should_refuse_the_line() {
    let unknown = "{\"kind\": \"explode\", \"t_ms\": 0}\n";
    assert!(matches!(
        check_text(unknown),
        Err(CheckError::Malformed { line: 1, .. })
    ));
    let missing = "\n{\"kind\": \"produce\", \"t_ms\": 0, \"client\": \"p\", \"key\": \"k\", \"value\": \"v\"}\n";
    let error = check_text(missing).unwrap_err();
    assert!(
        matches!(error, CheckError::Malformed { line: 2, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("seq"), "{error}");
}

#[test]
fn given_unknown_fields_and_blank_lines_should_accept_them() {
    let text = "\n{\"kind\": \"nemesis\", \"t_ms\": 0, \"event\": \"kill\", \"target\": \"b1\", \"seed\": 7}\n\n";
    let report = check_text(text).unwrap();
    assert_eq!(report.lines, 3);
    assert_eq!(report.nemesis_events.get("kill"), Some(&1));
}

#[test]
fn given_a_line_that_is_not_utf8_should_refuse_naming_its_line() {
    let bytes = b"\n\xff\xfe\n";
    let error = check(&bytes[..], &lenient()).unwrap_err();
    assert!(matches!(error, CheckError::Read { line: 2, .. }), "{error}");
}

#[test]
fn given_time_going_backwards_should_refuse() {
    let mut h = History::new();
    h.at(100).send("k1", 1).at(50).ok("k1", 1);
    let error = check_text(&h.text()).unwrap_err();
    assert!(
        matches!(
            error,
            CheckError::TimeBackwards {
                line: 2,
                t_ms: 50,
                previous_ms: 100
            }
        ),
        "{error}"
    );
}

#[test]
fn given_a_broken_workload_contract_should_refuse() {
    let outcome_unsent = History::new().ok("k1", 1).text();
    assert!(matches!(
        check_text(&outcome_unsent),
        Err(CheckError::OutcomeWithoutSend { line: 1, .. })
    ));
    let twice = History::new().write("k1", 1).fail("k1", 1).text();
    assert!(matches!(
        check_text(&twice),
        Err(CheckError::SecondOutcome { line: 3, .. })
    ));
    let resent = History::new().write("k1", 2).send("k1", 2).text();
    assert!(matches!(
        check_text(&resent),
        Err(CheckError::SeqNotIncreasing {
            line: 3,
            seq: 2,
            previous_seq: 2,
            ..
        })
    ));
    let mut h = History::new();
    h.send("k1", 1).event(
        "produce_ok",
        serde_json::json!({"client": "p0", "key": "k1", "seq": 1, "value": "other"}),
    );
    assert!(matches!(
        check_text(&h.text()),
        Err(CheckError::AckedValueDiffers { line: 2, .. })
    ));
}

#[test]
fn given_misplaced_final_reads_heals_and_copies_should_refuse() {
    let twice = History::new().final_read("f").final_read("f").text();
    assert!(matches!(
        check_text(&twice),
        Err(CheckError::FinalReadAgain { line: 2, .. })
    ));
    let mut h = History::new();
    h.write("k1", 1)
        .read("c", "k1", 1)
        .resume("c", "x")
        .final_read("c");
    assert!(matches!(
        check_text(&h.text()),
        Err(CheckError::FinalReadAfterResume { line: 5, .. })
    ));
    let mut h = History::new();
    h.write("k1", 1)
        .read("c", "k1", 1)
        .final_read("c")
        .read("c", "k1", 1);
    assert!(matches!(
        check_text(&h.text()),
        Err(CheckError::ReadAfterFinal { line: 5, .. })
    ));
    let heal = History::new().nemesis("kill", "b1").heal("pause").text();
    assert!(matches!(
        check_text(&heal),
        Err(CheckError::HealWithoutNemesis { line: 2, .. })
    ));
    let reconverged = History::new().reconverged("kill").text();
    assert!(matches!(
        check_text(&reconverged),
        Err(CheckError::ReconvergedWithoutHeal { line: 1, .. })
    ));
    let copies = History::new().copies(3, 10, &[]).text();
    assert!(matches!(
        check_text(&copies),
        Err(CheckError::NoCopies {
            line: 1,
            segment: 3,
            ..
        })
    ));
}

#[test]
fn given_events_fed_one_at_a_time_should_judge_as_the_reader_does() {
    let text = clean().text();
    let mut checker = Checker::new(lenient());
    for line in text.lines() {
        let event: Event = serde_json::from_str(line).unwrap();
        checker.observe(event).unwrap();
    }
    let fed = checker.finish();
    assert_eq!(fed, check_text(&text).unwrap());
}

#[test]
fn given_events_should_round_trip_through_json() {
    for line in clean().text().lines() {
        let event: Event = serde_json::from_str(line).unwrap();
        let again: Event = serde_json::from_str(&serde_json::to_string(&event).unwrap()).unwrap();
        assert_eq!(event, again);
    }
}
