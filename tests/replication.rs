//! Quorum replication of records across three broker processes (issue 17):
//! every segment on three brokers, acknowledged once two have fsynced it.
//! The CLI is run with its default flags, as users run it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::keyed::*;
use common::{err, malachi, ok, out};
use malachi_testkit::wait::{Wait, wait_until_blocking};
use serde_json::Value;

/// How long a copy may take to settle, and how often a wait checks.
const SETTLE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

/// The replica sets of a topic's segments, oldest first (node ids, the
/// primary's first), from `topic describe --json`.
fn replica_sets(broker: &str, topic: &str) -> Vec<(u64, Vec<u64>)> {
    let output = ok(malachi(broker, &["topic", "describe", topic, "--json"], ""));
    let described: Value = serde_json::from_str(&out(&output)).unwrap();
    let mut sets = Vec::new();
    for range in described["ranges"].as_array().unwrap() {
        for segment in range["segments"].as_array().unwrap() {
            let replicas = segment["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().unwrap())
                .collect();
            sets.push((segment["id"].as_u64().unwrap(), replicas));
        }
    }
    sets
}

/// The log file of segment `id` in a broker's data dir.
fn segment_log(data_dir: &std::path::Path, id: u64) -> PathBuf {
    data_dir.join("segments").join(format!("{id:020}.log"))
}

#[test]
fn a_topic_gets_three_copies_and_keeps_every_acknowledged_record_in_key_order_through_a_follower_kill()
 {
    const LINES: u64 = 100_000;
    const KEYS: u64 = 100;
    const CHUNK: u64 = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::three_ready(dir.path());
    let clients = cluster.clients();
    let b = clients[0].clone();
    ok(malachi(&b, &["topic", "create", "replicated"], ""));
    let sets = replica_sets(&b, "replicated");
    assert_eq!(sets.len(), 1);
    let (segment, replicas) = sets[0].clone();
    assert_eq!(replicas.len(), 3, "the default replication factor is 3");
    let follower = replicas[2];

    let mut child = spawn_malachi(&b, &["produce", "replicated", "--timeout-ms", "60000"]);
    let stdin = child.stdin.take().unwrap();
    let writer = KeyedWriter::spawn(stdin, LINES, CHUNK, Duration::from_millis(20), |j| {
        keyed_line(j, KEYS)
    });
    writer.wait_written(LINES / 3);
    let node = &mut cluster.nodes[(follower - 1) as usize];
    node.kill9();
    let killed_at = writer.written();
    // Fault timing: the follower stays down for half a second of writes.
    std::thread::sleep(Duration::from_millis(500));
    let seeds = node.seeds_among(&clients);
    node.start(&seeds);
    // A produce that stopped is reported below, with its stderr.
    let _ = writer.join();
    let output = wait_output(child, Duration::from_secs(300));
    assert!(
        output.status.success(),
        "produce failed: {}\n{}",
        err(&output),
        cluster
            .logs()
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .take(40)
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!("follower {follower} killed with {killed_at} of {LINES} lines written");
    assert_eq!(
        out(&output),
        format!("{LINES} of {LINES} records acknowledged by replicated\n"),
        "stderr: {}",
        err(&output)
    );
    assert!(
        killed_at < LINES,
        "the kill came after all input was written"
    );

    for broker in &clients {
        let records = consume_all(broker, "replicated");
        assert_keyed_sequences(&records, KEYS, LINES);
    }

    // The restarted follower caught up: once every broker stopped in order,
    // its copy is the primary's byte for byte.
    let primary = replicas[0];
    // Compare whole frames only: a direct write pads the last block.
    let frames = |bytes: &[u8]| {
        let mut at = 0;
        while let Ok((_, len)) = malachi_storage::frame::decode(&bytes[at..]) {
            at += len;
        }
        bytes[..at].to_vec()
    };
    let log_of = |node: u64| {
        std::fs::read(segment_log(
            &cluster.nodes[(node - 1) as usize].data_dir,
            segment,
        ))
        .unwrap_or_default()
    };
    Wait::new(
        "the follower's copy equal to the primary's",
        Duration::from_secs(60),
        Duration::from_millis(200),
    )
    .context(|| cluster.logs())
    .until_blocking(|| {
        let (a, f) = (frames(&log_of(primary)), frames(&log_of(follower)));
        if a == f && !a.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "primary {} bytes, follower {} bytes",
                a.len(),
                f.len()
            ))
        }
    });
}

#[test]
fn with_both_followers_down_produce_answers_no_quorum_and_resumes_when_one_returns() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::three_ready(dir.path());
    let clients = cluster.clients();
    let b = clients[0].clone();
    ok(malachi(&b, &["topic", "create", "quorum"], ""));
    let (_, replicas) = replica_sets(&b, "quorum")[0].clone();
    let primary = clients[(replicas[0] - 1) as usize].clone();
    ok(malachi(&primary, &["produce", "quorum"], "a\t1\n"));

    for &node in &replicas[1..] {
        cluster.nodes[(node - 1) as usize].kill9();
    }
    let started = Instant::now();
    let refused = malachi(
        &primary,
        &["produce", "quorum", "--timeout-ms", "12000"],
        "a\t2\n",
    );
    let took = started.elapsed();
    assert!(
        !refused.status.success(),
        "a produce without a quorum succeeded"
    );
    assert!(
        err(&refused).contains("quorum"),
        "the refusal names the quorum: {}",
        err(&refused)
    );
    // Bounded: the CLI's timeout plus one replica_ack_timeout_ms (5 s by
    // default), with a wide margin for a loaded machine; never a hang.
    assert!(took < Duration::from_secs(60), "produce took {took:?}");

    let back = &mut cluster.nodes[(replicas[1] - 1) as usize];
    let seeds = back.seeds_among(&clients);
    back.start(&seeds);
    ok(malachi(
        &primary,
        &["produce", "quorum", "--timeout-ms", "60000"],
        "a\t3\n",
    ));
    let records = consume_all(&primary, "quorum");
    let values: Vec<&str> = records.iter().map(|(_, v)| v.as_str()).collect();
    // The refused record may have been committed once the follower returned
    // (it was durable on the primary); either way order is kept.
    assert!(
        values == ["1", "3"] || values == ["1", "2", "3"],
        "records read back: {values:?}"
    );
}

/// The raft (cluster) address of broker `node`, from `cluster status`.
fn raft_addr(broker: &str, node: u64) -> std::net::SocketAddr {
    // One JSON line per broker.
    let output = ok(malachi(broker, &["cluster", "status", "--json"], ""));
    let found = json_lines(&out(&output))
        .into_iter()
        .find(|b| b["node_id"].as_u64() == Some(node))
        .expect("the broker is listed");
    found["raft_addr"].as_str().unwrap().parse().unwrap()
}

/// The whole frames at the start of `bytes` (a direct write pads the last block).
fn whole_frames(bytes: &[u8]) -> &[u8] {
    let mut at = 0;
    while let Ok((_, len)) = malachi_storage::frame::decode(&bytes[at..]) {
        at += len;
    }
    &bytes[..at]
}

fn frame_at(offset: u64, value: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let record = malachi_storage::Record {
        timestamp_ms: 1,
        key: b"intruder".to_vec(),
        value: value.as_bytes().to_vec(),
        headers: Vec::new(),
    };
    malachi_storage::frame::encode(&mut out, offset, 0, &record);
    out
}

#[test]
fn a_follower_refuses_every_bad_replica_append_writes_nothing_and_stays_up() {
    use malachi_cluster::group::{ClusterCookie, TcpTransport, TcpTransportConfig};
    use malachi_wire::replication::{
        REPLICA_APPEND_API_KEY, ReplicaAppendRequest, ReplicaAppendResponse, ReplicaRefusal,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::three_ready(dir.path());
    let clients = cluster.clients();
    let b = clients[0].clone();
    // A topic created before its vnode's coordinator holds a lease opens
    // at writer epoch 0 (ADR 0097): right after the cluster forms that can
    // happen, so the test takes a topic opened under a lease.
    let lines: String = (0..10).map(|i| format!("k{i}\t{i}\n")).collect();
    let (topic, segment, replicas) = (0..5)
        .find_map(|attempt| {
            let topic = format!("guarded-{attempt}");
            ok(malachi(&b, &["topic", "create", &topic], ""));
            ok(malachi(&b, &["produce", &topic], &lines));
            let (segment, replicas) = replica_sets(&b, &topic)[0].clone();
            (segment_epoch(&b, &topic, segment) >= 1).then_some((topic, segment, replicas))
        })
        .expect("a topic opened under a lease within five tries");
    let follower = replicas[1];
    let data = cluster.nodes[(follower - 1) as usize].data_dir.clone();
    let log = segment_log(&data, segment);
    // The follower holds the ten records (a quorum acknowledged them; this
    // follower may be the one that was not needed, so wait for it).
    let count_frames = |bytes: &[u8]| {
        let (mut at, mut n) = (0, 0u64);
        while let Ok((_, len)) = malachi_storage::frame::decode(&bytes[at..]) {
            at += len;
            n += 1;
        }
        n
    };
    wait_until_blocking("the follower holds ten records", SETTLE, POLL, || {
        count_frames(&std::fs::read(&log).unwrap_or_default()) >= 10
    });
    let before = whole_frames(&std::fs::read(&log).unwrap()).to_vec();
    let end = count_frames(&before);
    // The segment's writer epoch: the coordinator lease epoch it was opened
    // under (at least 1), which every replica-append must carry.
    let epoch = segment_epoch(&b, topic.as_str(), segment);
    assert!(epoch >= 1, "a segment opened under a lease has its epoch");

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let answers = runtime.block_on(async {
        let transport = TcpTransport::new(TcpTransportConfig::new(
            99,
            ClusterCookie::new("test-cookie").unwrap(),
        ));
        transport.set_peer(follower, raft_addr(&b, follower));
        let send_at =
            |epoch: u64, segment: u64, first: u64, frames: Vec<u8>| ReplicaAppendRequest {
                topic: topic.clone(),
                segment,
                epoch,
                first_offset: first,
                committed_end: 0,
                repair: None,
                frames: bytes::Bytes::from(frames),
            };
        let send =
            |segment: u64, first: u64, frames: Vec<u8>| send_at(epoch, segment, first, frames);
        let mut bad_crc = frame_at(end, "tampered");
        let last = bad_crc.len() - 20;
        bad_crc[last] ^= 0x40;
        let cases = vec![
            (
                "bad crc",
                send(segment, end, bad_crc),
                ReplicaRefusal::BadFrames,
            ),
            (
                "gap",
                send(segment, end + 5, frame_at(end + 5, "x")),
                ReplicaRefusal::NotAtEnd,
            ),
            (
                "overlap",
                send(segment, end - 1, frame_at(end - 1, "x")),
                ReplicaRefusal::NotAtEnd,
            ),
            (
                "wrong offset inside",
                send(segment, end, frame_at(end + 1, "x")),
                ReplicaRefusal::BadFrames,
            ),
            (
                "unknown copy",
                send(987_654, 0, frame_at(0, "x")),
                ReplicaRefusal::UnknownCopy,
            ),
            (
                "stale epoch",
                send_at(epoch - 1, segment, end, frame_at(end, "x")),
                ReplicaRefusal::StaleEpoch,
            ),
        ];
        let mut answers = Vec::new();
        for (what, request, want) in cases {
            let body = request.encode().unwrap();
            let raw = transport
                .call_raw(
                    follower,
                    REPLICA_APPEND_API_KEY,
                    request.segment,
                    &body,
                    10_000,
                )
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let answer = ReplicaAppendResponse::decode(&raw).unwrap();
            answers.push((what, answer, want));
        }
        // Garbage where the request's map should be.
        let raw = transport
            .call_raw(
                follower,
                REPLICA_APPEND_API_KEY,
                segment,
                &[0xc1, 0xff, 0x00, 0x13],
                10_000,
            )
            .await
            .unwrap();
        answers.push((
            "garbage",
            ReplicaAppendResponse::decode(&raw).unwrap(),
            ReplicaRefusal::InvalidRequest,
        ));
        answers
    });
    for (what, answer, want) in &answers {
        assert_eq!(answer.refused, Some(*want), "{what}: {answer:?}");
        assert!(!answer.message.is_empty(), "{what}: a refusal says why");
    }
    let gap = &answers[1].1;
    assert_eq!(gap.durable_end, end, "a gap's refusal names the copy's end");
    // Nothing of any refused append was written.
    let after = std::fs::read(&log).unwrap();
    assert_eq!(whole_frames(&after), &before[..]);
    // And the follower still serves: a record produced now reaches it.
    ok(malachi(&b, &["produce", topic.as_str()], "k\tlast\n"));
    Wait::new("the follower takes the next append", SETTLE, POLL)
        .context(|| cluster.logs())
        .until_blocking(|| count_frames(&std::fs::read(&log).unwrap()) > end);
    let records = consume_all(&clients[(follower - 1) as usize], topic.as_str());
    assert_eq!(records.len() as u64, end + 1);

    // A sealed copy is fenced for good: a split seals the segment, and an
    // append to it is refused `fenced`, also after the follower restarts.
    let range = active_ranges(&b, topic.as_str())[0].to_string();
    ok(malachi(&b, &["topic", "split", topic.as_str(), &range], ""));
    let sealed_end = end + 1;
    let fenced_answer = |cluster: &Cluster| {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let transport = TcpTransport::new(TcpTransportConfig::new(
                99,
                ClusterCookie::new("test-cookie").unwrap(),
            ));
            transport.set_peer(follower, raft_addr(&cluster.clients()[0], follower));
            let request = ReplicaAppendRequest {
                topic: topic.clone(),
                segment,
                epoch,
                first_offset: sealed_end,
                committed_end: 0,
                repair: None,
                frames: bytes::Bytes::from(frame_at(sealed_end, "late")),
            };
            let body = request.encode().unwrap();
            let raw = transport
                .call_raw(follower, REPLICA_APPEND_API_KEY, segment, &body, 10_000)
                .await
                .unwrap();
            ReplicaAppendResponse::decode(&raw).unwrap()
        })
    };
    let wait_fenced = |cluster: &Cluster, when: &str, seconds: u64| {
        let what = format!("{when}, an append to a sealed copy is refused fenced");
        let deadline = Duration::from_secs(seconds);
        wait_until_blocking(&what, deadline, Duration::from_millis(200), || {
            let answer = fenced_answer(cluster);
            if answer.refused == Some(ReplicaRefusal::Fenced) {
                Ok(())
            } else {
                Err(answer)
            }
        });
    };
    wait_fenced(&cluster, "once sealed", 30);
    let node = &mut cluster.nodes[(follower - 1) as usize];
    node.kill9();
    let seeds = node.seeds_among(&clients);
    node.start(&seeds);
    wait_fenced(&cluster, "after a restart", 60);
    let after = whole_frames(&std::fs::read(&log).unwrap()).to_vec();
    assert_eq!(
        count_frames(&after),
        sealed_end,
        "nothing was appended past the seal"
    );
}

/// The writer epoch of segment `id`, from `topic describe --json`.
fn segment_epoch(broker: &str, topic: &str, id: u64) -> u64 {
    let output = ok(malachi(broker, &["topic", "describe", topic, "--json"], ""));
    let described: Value = serde_json::from_str(&out(&output)).unwrap();
    described["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["segments"].as_array().unwrap().iter())
        .find(|s| s["id"].as_u64() == Some(id))
        .and_then(|s| s["epoch"].as_u64())
        .expect("describe shows the segment's epoch")
}

/// The range ids of a topic's active ranges, from `topic describe --json`.
fn active_ranges(broker: &str, topic: &str) -> Vec<u64> {
    let output = ok(malachi(broker, &["topic", "describe", topic, "--json"], ""));
    let described: Value = serde_json::from_str(&out(&output)).unwrap();
    described["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["state"] == "active")
        .map(|r| r["id"].as_u64().unwrap())
        .collect()
}

/// Regression: a split whose freeze could not reach a quorum answered an
/// error but left the segment frozen, so every later produce to it timed
/// out and a later split or merge answered `busy`, until the broker
/// restarted. Now the freeze answers `no_quorum`, the segment rolls once a
/// quorum is back, and produce and split work again. At two copies (a
/// quorum of two) one dead follower is enough, and the metadata groups
/// (on all three brokers) keep their quorum.
#[test]
fn a_split_without_a_quorum_answers_no_quorum_and_leaves_the_range_writable_and_splittable() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::three_ready(dir.path());
    let clients = cluster.clients();
    let b = clients[0].clone();
    ok(malachi(
        &b,
        &["topic", "create", "thawed", "--replication-factor", "2"],
        "",
    ));
    let (_, replicas) = replica_sets(&b, "thawed")[0].clone();
    assert_eq!(replicas.len(), 2);
    let primary = clients[(replicas[0] - 1) as usize].clone();
    ok(malachi(&primary, &["produce", "thawed"], "a\t1\n"));
    cluster.nodes[(replicas[1] - 1) as usize].kill9();
    // A record durable on the primary alone: the freeze must wait for a
    // quorum to hold it, and cannot.
    let refused = malachi(
        &primary,
        &["produce", "thawed", "--timeout-ms", "3000"],
        "a\t2\n",
    );
    assert!(
        !refused.status.success(),
        "a produce without a quorum succeeded"
    );

    let range = active_ranges(&primary, "thawed")[0].to_string();
    // Within a deadline: the CLI retries a retriable refusal until its
    // deadline (ADR 0126). Since ADR 0125 the segment may meanwhile fail
    // over onto its surviving copy (at two copies the survivor seals
    // alone), after which the split rightly succeeds: either way the range
    // is never left frozen.
    let first = malachi(
        &primary,
        &["topic", "split", "thawed", &range, "--timeout-ms", "8000"],
        "",
    );
    if !first.status.success() {
        // The first attempt answers `no_quorum`; the CLI retries it, and a
        // retry may find the thawed segment rolling (`busy`), or failed
        // over to another primary (`not_leader`) as the deadline ends: all
        // retriable.
        let refusal = err(&first);
        assert!(
            refusal.contains("quorum")
                || refusal.contains("rolling")
                || refusal.contains("not_leader"),
            "the split's refusal names the quorum or the roll: {}",
            err(&first)
        );
    }

    let back = &mut cluster.nodes[(replicas[1] - 1) as usize];
    let seeds = back.seeds_among(&clients);
    back.start(&seeds);
    ok(malachi(
        &primary,
        &["produce", "thawed", "--timeout-ms", "60000"],
        "a\t3\n",
    ));
    // The frozen segment rolled: the range is still the one active range,
    // and it splits now (retrying while the roll settles).
    if !first.status.success() {
        Wait::new(
            "the range split again",
            Duration::from_secs(60),
            Duration::from_millis(500),
        )
        .context(|| cluster.logs())
        .until_blocking(|| {
            let ranges = active_ranges(&primary, "thawed");
            // A split whose answer the deadline cut may have happened.
            if ranges.len() == 2 {
                return Ok(());
            }
            assert_eq!(ranges.len(), 1, "no split happened yet: {ranges:?}");
            let split = malachi(
                &primary,
                &["topic", "split", "thawed", &ranges[0].to_string()],
                "",
            );
            if split.status.success() {
                Ok(())
            } else {
                Err(err(&split))
            }
        });
    }
    assert_eq!(active_ranges(&primary, "thawed").len(), 2);
    ok(malachi(&primary, &["produce", "thawed"], "a\t4\n"));
    let values: Vec<String> = consume_all(&primary, "thawed")
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    // The refused record was durable on the primary and commits once the
    // follower is back; either way every acknowledged record, in order.
    assert!(
        values == ["1", "2", "3", "4"] || values == ["1", "3", "4"],
        "records read back: {values:?}"
    );
}

/// How many whole frames the log of segment `id` holds in `data_dir`.
fn frames_on_disk(data_dir: &std::path::Path, id: u64) -> u64 {
    let bytes = std::fs::read(segment_log(data_dir, id)).unwrap_or_default();
    let (mut at, mut n) = (0, 0u64);
    while let Ok((_, len)) = malachi_storage::frame::decode(&bytes[at..]) {
        at += len;
        n += 1;
    }
    n
}

/// Waits until broker `asked` sees broker `node` as `state` in `cluster status`.
fn wait_member_state(asked: &str, node: u64, state: &str) {
    let what = format!("broker {asked} sees broker {node} {state}");
    wait_until_blocking(
        &what,
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let output = malachi(asked, &["cluster", "status", "--json"], "");
            output.status.success()
                && json_lines(&out(&output))
                    .iter()
                    .any(|b| b["node_id"].as_u64() == Some(node) && b["state"] == state)
        },
    );
}

/// With its primary dead, a topic's sealed segments (and the committed
/// records of its active ones) are read through a broker that holds
/// follower copies, a cursor minted there resumes there, and no redirect
/// points at the dead broker; a produce goes on once the segment failed over.
#[test]
fn with_the_primary_dead_a_follower_serves_reads_and_nothing_redirects_to_the_dead_broker() {
    const SEALED: u64 = 60;
    const TAIL: u64 = 30;
    const KEYS: u64 = 6;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::three_ready(dir.path());
    let clients = cluster.clients();
    let b = clients[0].clone();
    ok(malachi(&b, &["topic", "create", "survives"], ""));
    let (first, replicas) = replica_sets(&b, "survives")[0].clone();
    assert_eq!(replicas.len(), 3);
    let primary = replicas[0];
    let follower = replicas[1];
    let lines: String = (0..SEALED).map(|i| keyed_line(i, KEYS)).collect();
    ok(malachi(&b, &["produce", "survives"], &lines));
    // The split seals the first segment; the rest goes to its children.
    let range = active_ranges(&b, "survives")[0].to_string();
    ok(malachi(&b, &["topic", "split", "survives", &range], ""));
    let lines: String = (SEALED..SEALED + TAIL)
        .map(|i| keyed_line(i, KEYS))
        .collect();
    ok(malachi(&b, &["produce", "survives"], &lines));
    // Both followers hold the sealed segment whole (a quorum acknowledged
    // it; the other copy may lag a moment).
    for &node in &replicas[1..] {
        let data = cluster.nodes[(node - 1) as usize].data_dir.clone();
        let what = format!("follower {node} holds the sealed segment");
        wait_until_blocking(&what, SETTLE, POLL, || {
            frames_on_disk(&data, first) >= SEALED
        });
    }

    cluster.nodes[(primary - 1) as usize].kill9();
    let reader = clients[(follower - 1) as usize].clone();
    wait_member_state(&reader, primary, "dead");

    // Read through the follower: every record of the sealed segment, then
    // the tail as far as the follower knows it committed (the primary may
    // have died before telling it the last committed end), in per-key
    // order, each once: per key a run 0, 1, 2, ... with no gap.
    let records = consume_all(&reader, "survives");
    let mut next: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for (key, value) in &records {
        let expected = next.entry(key.as_str()).or_default();
        assert_eq!(
            value,
            &expected.to_string(),
            "key {key}: a gap, duplicate or reordering"
        );
        *expected += 1;
    }
    for k in 0..KEYS {
        let read = next.get(format!("k{k}").as_str()).copied().unwrap_or(0);
        assert!(
            (SEALED / KEYS..=(SEALED + TAIL) / KEYS).contains(&read),
            "key k{k}: {read} records read; the sealed segment alone holds {}",
            SEALED / KEYS
        );
    }

    // A cursor from the follower resumes there.
    let first_page = malachi(
        &reader,
        &["consume", "survives", "--from-start", "--max", "10"],
        "",
    );
    let page = ok(first_page);
    let cursor = err(&page)
        .lines()
        .find_map(|l| l.strip_prefix("cursor: "))
        .expect("consume prints the cursor")
        .to_string();
    let rest = ok(malachi(
        &reader,
        &["consume", "survives", "--cursor", &cursor, "--max", "1000"],
        "",
    ));
    assert_eq!(
        out(&page).lines().count() + out(&rest).lines().count(),
        records.len(),
        "the two pages hold every record once"
    );

    // A write goes on once the segment failed over (issue 19): never sent
    // to the dead broker's address on the way.
    let produced = malachi(
        &reader,
        &["produce", "survives", "--timeout-ms", "30000"],
        "k0\tlate\n",
    );
    assert!(
        produced.status.success(),
        "a produce after the primary died failed: {}",
        err(&produced)
    );
    let dead_addr = &clients[(primary - 1) as usize];
    assert!(
        !err(&produced).contains(dead_addr.as_str()),
        "the client was sent to the dead broker: {}",
        err(&produced)
    );
}

/// A follower down while its segment is written and sealed comes back with
/// a copy short of the seal; the primary's catch-up fills it up to the seal
/// (the copy's fence stops appends, not repair), and it ends byte for byte
/// equal to the primary's, sealed.
#[test]
fn a_follower_that_missed_a_sealed_segment_catches_up_to_the_seal_byte_identical() {
    const LINES: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::three_ready(dir.path());
    let clients = cluster.clients();
    let b = clients[0].clone();
    ok(malachi(&b, &["topic", "create", "lagging"], ""));
    let (first, replicas) = replica_sets(&b, "lagging")[0].clone();
    let (primary, lagging) = (replicas[0], replicas[2]);
    // Placed by load (ADR 0144), the lagging follower may be the broker
    // the topic was created through: the rest goes through the primary.
    let b = clients[(primary - 1) as usize].clone();
    ok(malachi(&b, &["produce", "lagging"], "k0\t0\n"));
    cluster.nodes[(lagging - 1) as usize].kill9();
    let lines: String = (1..LINES).map(|i| keyed_line(i, 1)).collect();
    ok(malachi(&b, &["produce", "lagging"], &lines));
    let range = active_ranges(&b, "lagging")[0].to_string();
    ok(malachi(&b, &["topic", "split", "lagging", &range], ""));

    let node = &mut cluster.nodes[(lagging - 1) as usize];
    let seeds = node.seeds_among(&clients);
    node.start(&seeds);
    let lagging_dir = cluster.nodes[(lagging - 1) as usize].data_dir.clone();
    let primary_dir = cluster.nodes[(primary - 1) as usize].data_dir.clone();
    let what = format!("the lagging copy holds all {LINES} records (records held)");
    Wait::new(what, Duration::from_secs(60), Duration::from_millis(200))
        .context(|| cluster.logs())
        .until_blocking(|| {
            let held = frames_on_disk(&lagging_dir, first);
            if held >= LINES { Ok(()) } else { Err(held) }
        });
    let on_primary = std::fs::read(segment_log(&primary_dir, first)).unwrap();
    let on_lagging = std::fs::read(segment_log(&lagging_dir, first)).unwrap();
    assert_eq!(
        whole_frames(&on_lagging),
        whole_frames(&on_primary),
        "the caught-up copy differs from the primary's"
    );
    // The caught-up copy is sealed at the recorded length: its seal marker.
    let marker = lagging_dir
        .join("segments")
        .join(format!("{first:020}.seal"));
    wait_until_blocking("the caught-up copy is sealed", SETTLE, POLL, || {
        marker.exists()
    });
}
