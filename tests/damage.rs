//! One broker, RF=1: damage to one segment copy never takes the broker down
//! and is never silent (issue 19, ADR 0108). The broker runs as users run
//! it, with the CLI's default flags; the copies are damaged between runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use common::{BrokerProcess, err, malachi, ok, out};
use malachi_testkit::wait::wait_until_blocking;

/// The segments of `topic` as `topic describe --json` gives them:
/// (range, segment id, state).
fn segments(broker: &str, topic: &str) -> Vec<(u64, u64, String)> {
    let described = ok(malachi(broker, &["topic", "describe", topic, "--json"], ""));
    let json: serde_json::Value = serde_json::from_str(&out(&described)).unwrap();
    let mut found = Vec::new();
    for range in json["ranges"].as_array().unwrap() {
        for segment in range["segments"].as_array().unwrap() {
            found.push((
                range["id"].as_u64().unwrap(),
                segment["id"].as_u64().unwrap(),
                segment["state"].as_str().unwrap().to_owned(),
            ));
        }
    }
    found
}

fn log_of(data_dir: &Path, segment: u64) -> std::path::PathBuf {
    data_dir.join("segments").join(format!("{segment:020}.log"))
}

/// GET `path` on the admin port: (status line, body).
fn admin_get(broker: &BrokerProcess, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(&broker.admin_addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        broker.admin_addr
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.lines().next().unwrap_or_default().to_owned();
    (status, response)
}

/// The broker is still running `seconds` seconds from now.
fn stays_up(broker: &mut BrokerProcess, seconds: u64) {
    for _ in 0..seconds * 4 {
        // pacing, not synchronisation: the process is sampled four times a second.
        std::thread::sleep(Duration::from_millis(250));
        let exited = broker.child.try_wait().unwrap();
        assert!(
            exited.is_none(),
            "the broker exited ({exited:?}); its log:\n{}",
            broker.log()
        );
    }
}

/// Another topic produces and consumes normally, and the broker is ready.
fn other_topic_serves(broker: &BrokerProcess, topic: &str, before: usize) {
    let b = &broker.client_addr;
    ok(malachi(b, &["produce", topic], "later\tone\n"));
    let consumed = ok(malachi(b, &["consume", topic, "--from-start"], ""));
    assert_eq!(
        out(&consumed).lines().count(),
        before + 1,
        "{}",
        out(&consumed)
    );
    let (status, _) = admin_get(broker, "/ready");
    assert!(status.contains("200"), "/ready: {status}");
}

/// The records `malachi produce` read from the lines given to topic a.
fn a_lines(batch: usize) -> String {
    (0..20).map(|i| format!("k{i}\tv-{batch}-{i}\n")).collect()
}

/// `consume --from-start` of a damaged topic: exactly the intact prefix
/// on stdout, then one `data_loss` error naming the topic, range and the
/// lost offsets; returns the prefix's length.
fn consume_reports_loss(
    broker: &str,
    topic: &str,
    range: u64,
    expected: &[String],
    to: u64,
) -> u64 {
    let consumed = malachi(broker, &["consume", topic, "--from-start"], "");
    assert!(
        !consumed.status.success(),
        "a consume of lost records succeeded"
    );
    let stderr = err(&consumed);
    let needle = format!("data_loss: topic {topic} range {range} lost records ");
    let at = stderr
        .find(&needle)
        .unwrap_or_else(|| panic!("no data_loss error in: {stderr}"));
    let offsets = &stderr[at + needle.len()..];
    let offsets = offsets.split_whitespace().next().unwrap();
    let (from, lost_to) = offsets.split_once("..").unwrap();
    let from: u64 = from.parse().unwrap();
    assert_eq!(lost_to.parse::<u64>().unwrap(), to, "{stderr}");
    let lines: Vec<String> = out(&consumed).lines().map(str::to_owned).collect();
    assert_eq!(
        lines.len() as u64,
        from,
        "the intact prefix, then the loss: {stderr}"
    );
    assert_eq!(
        lines,
        expected[..from as usize],
        "the prefix reads back as produced"
    );
    from
}

#[test]
fn one_broker_a_flipped_byte_in_an_active_segment_leaves_the_other_topics_serving_and_reports_data_loss()
 {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut broker = BrokerProcess::start(&data);
    let b = broker.client_addr.clone();
    ok(malachi(&b, &["topic", "create", "a"], ""));
    ok(malachi(&b, &["topic", "create", "b"], ""));
    // Ten produces: ten flushes, so the damage below has later flushes
    // after it (damage, not a torn tail).
    let mut expected = Vec::new();
    for batch in 0..10 {
        let lines = a_lines(batch);
        ok(malachi(&b, &["produce", "a"], &lines));
        expected.extend(lines.lines().map(str::to_owned));
    }
    ok(malachi(&b, &["produce", "b"], "k1\tb1\nk2\tb2\n"));
    let found = segments(&b, "a");
    let [(range, segment, ref state)] = found[..] else {
        panic!("one segment expected: {found:?}");
    };
    assert_eq!(state, "active");
    broker.kill9();

    // A few bytes flipped in the middle of the active segment's log.
    let log = log_of(&data, segment);
    let mut bytes = std::fs::read(&log).unwrap();
    let middle = bytes.len() / 2;
    for byte in &mut bytes[middle..middle + 4] {
        *byte ^= 0xA5;
    }
    std::fs::write(&log, &bytes).unwrap();

    let mut broker = BrokerProcess::start_on(&data, &b, &broker.admin_addr.clone());
    stays_up(&mut broker, 4);
    let prefix = consume_reports_loss(&b, "a", range, &expected, 200);
    assert!(
        prefix > 0 && prefix < 200,
        "the damage is in the middle: {prefix}"
    );
    other_topic_serves(&broker, "b", 2);

    // The damaged range rolled away from its copy: it takes writes again,
    // at offsets past the lost ones, and describe shows the lost copy.
    ok(malachi(&b, &["produce", "a"], "new\tafter\n"));
    let described = out(&ok(malachi(&b, &["topic", "describe", "a"], "")));
    assert!(
        described.contains(&format!(
            "segment {segment} start_offset 0 replicas 1 sealed length 200"
        )),
        "{described}"
    );
    assert!(
        described.contains(&format!("copy 1 damaged durable_end {prefix}")),
        "{described}"
    );
    assert!(
        described.contains("start_offset 200 replicas 1 active"),
        "{described}"
    );
    let (_, metrics) = admin_get(&broker, "/metrics");
    assert!(metrics.contains("malachi_copies_lost 1"), "{metrics}");
    assert!(
        metrics.contains(&format!("malachi_data_loss_records_total {}", 200 - prefix)),
        "{metrics}"
    );
    assert!(
        broker.log().contains("a segment copy lost records"),
        "no log line: {}",
        broker.log()
    );

    // A second restart brings no crash back, and the same answer.
    assert_eq!(broker.terminate(), Some(0));
    let admin = broker.admin_addr.clone();
    drop(broker);
    let mut broker = BrokerProcess::start_on(&data, &b, &admin);
    stays_up(&mut broker, 3);
    assert_eq!(consume_reports_loss(&b, "a", range, &expected, 200), prefix);
    other_topic_serves(&broker, "b", 3);
    // The damaged copy was left as it was found.
    assert_eq!(std::fs::read(&log).unwrap(), bytes);
}

#[test]
fn one_broker_a_deleted_sealed_segment_is_reported_not_read_short() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut broker = BrokerProcess::start(&data);
    let b = broker.client_addr.clone();
    ok(malachi(&b, &["topic", "create", "s"], ""));
    ok(malachi(&b, &["topic", "create", "other"], ""));
    let lines: String = (0..30).map(|i| format!("k{i}\tv{i}\n")).collect();
    ok(malachi(&b, &["produce", "s"], &lines));
    ok(malachi(&b, &["produce", "other"], "o\t1\n"));
    // A split seals range 0's segment; its children go on.
    ok(malachi(&b, &["topic", "split", "s", "0"], ""));
    ok(malachi(&b, &["produce", "s"], "after\tsplit\n"));
    let sealed: Vec<_> = segments(&b, "s")
        .into_iter()
        .filter(|(_, _, state)| state == "sealed")
        .collect();
    let [(range, segment, _)] = sealed[..] else {
        panic!("one sealed segment expected: {sealed:?}");
    };
    broker.kill9();
    std::fs::remove_file(log_of(&data, segment)).unwrap();

    let mut broker = BrokerProcess::start_on(&data, &b, &broker.admin_addr.clone());
    stays_up(&mut broker, 2);
    // Describe shows the missing copy before anything read it.
    let described = out(&ok(malachi(&b, &["topic", "describe", "s"], "")));
    assert!(described.contains("copy 1 missing"), "{described}");
    // Nothing of the sealed segment reads back, and nothing is skipped.
    let consumed = malachi(&b, &["consume", "s", "--from-start"], "");
    assert!(
        !consumed.status.success(),
        "a consume of a deleted segment succeeded"
    );
    let stderr = err(&consumed);
    assert!(
        stderr.contains(&format!(
            "data_loss: topic s range {range} lost records 0..30 (segment s{segment}): the copy's log is missing"
        )),
        "{stderr}"
    );
    assert_eq!(
        out(&consumed),
        "",
        "no record of the lost range is read short"
    );
    other_topic_serves(&broker, "other", 1);
    let (_, metrics) = admin_get(&broker, "/metrics");
    assert!(metrics.contains("malachi_copies_lost 1"), "{metrics}");
    // The scrubber, asked by the coordinator at its first upkeep, finds the
    // copy missing too: the copy health metric counts it (issue 19).
    let metrics = wait_until_blocking(
        "the scrubber's missing copy in the health metric",
        Duration::from_secs(15),
        Duration::from_millis(250),
        || {
            let metrics = admin_get(&broker, "/metrics").1;
            if metrics.contains("malachi_copies{health=\"missing\"} 1") {
                Ok(metrics)
            } else {
                Err(metrics)
            }
        },
    );
    assert!(
        metrics.contains("malachi_copies{health=\"intact\"}"),
        "every health word is exported: {metrics}"
    );
}
