//! A full volume in a cluster of broker processes (issue 19, ADR 0111):
//! three `malachi` brokers, RF=3, each with its data dir on a tmpfs of its
//! own. The volume of the topic's primary is filled with a plain file past
//! `store.min_free_bytes`: the broker is not ready, tells the cluster it is
//! full, its active segment is sealed and goes on in a successor on the
//! brokers with room, and producers run with the CLI's default flags (as
//! users run it) move on without losing or repeating an acknowledged
//! record. Deleting the file makes the broker ready again, with no
//! restart, and it takes new copies and records again.
//!
//! Every broker gets a tmpfs (not only one): which broker becomes the
//! topic's primary is the topic vnode's coordinator's choice, known only
//! after the brokers are running, and the data dirs are fixed at start.
//! With each volume small and separate, whichever broker is chosen can be
//! filled. Mounting needs root (CAP_SYS_ADMIN): without it the test fails,
//! saying so, rather than pass without testing anything.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::copies::frames;
use common::keyed::{consume_all, spawn_malachi, wait_output};
use common::{err, malachi, ok, out};
use serde_json::Value;

const TOPIC: &str = "filling";
/// Each broker's volume.
const TMPFS_BYTES: u64 = 64 << 20;
/// `store.min_free_bytes` of every broker: a quarter of the volume.
const MIN_FREE_BYTES: u64 = 16 << 20;
/// What the filler file leaves free: under the line, with room for the
/// flushes and metadata writes the margin is there for.
const LEFT_FREE_BYTES: u64 = 8 << 20;
const PRODUCERS: u64 = 3;
const LINES: u64 = 6_000;
const KEYS: u64 = 8;
const CHUNK: u64 = 100;
/// Records one more producer sends once the volume has room again.
const LINES_AFTER: u64 = 400;
/// How long the guard's poll, membership and the coordinator's failover
/// may take between them: generous, the machine is shared.
const MOVE_TIMEOUT: Duration = Duration::from_secs(30);
const RECOVER_TIMEOUT: Duration = Duration::from_secs(30);

/// The tempdir with one tmpfs per broker under it, and the cluster on
/// them. Dropping it kills the brokers first, then unmounts (lazily, so a
/// straggler holding a file open cannot keep the mount), then removes the
/// dir: on success and on failure alike.
struct Rig {
    cluster: Option<Cluster>,
    mounts: Vec<PathBuf>,
    dir: Option<tempfile::TempDir>,
}

impl Rig {
    fn cluster(&self) -> &Cluster {
        self.cluster.as_ref().unwrap()
    }

    fn root(&self) -> &Path {
        self.dir.as_ref().unwrap().path()
    }

    /// Mounts a tmpfs of `TMPFS_BYTES` at `dir`, or fails the test saying why.
    fn mount(&mut self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={TMPFS_BYTES}"))
            .arg("tmpfs")
            .arg(dir)
            .output()
            .unwrap_or_else(|e| panic!("cannot run mount(8): {e}"));
        assert!(
            output.status.success(),
            "this test needs to mount a tmpfs (root, or CAP_SYS_ADMIN) and cannot: \
             `mount -t tmpfs -o size={TMPFS_BYTES} tmpfs {}` exited {:?}: {}",
            dir.display(),
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
        self.mounts.push(dir.to_owned());
        let total = volume(dir).1;
        assert!(
            total <= TMPFS_BYTES,
            "{} is not the tmpfs just mounted ({total} bytes)",
            dir.display()
        );
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        drop(self.cluster.take());
        for mount in self.mounts.drain(..).rev() {
            let umounted = Command::new("umount").arg("-l").arg(&mount).status();
            if !matches!(umounted, Ok(s) if s.success()) {
                eprintln!("could not unmount {}: {umounted:?}", mount.display());
            }
        }
        drop(self.dir.take());
    }
}

/// The free bytes an unprivileged writer has on `dir`'s volume (what the
/// broker's guard asks), and the volume's size.
fn volume(dir: &Path) -> (u64, u64) {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: an all-zero statvfs is a valid value of that plain C struct.
    #[allow(unsafe_code)]
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stat` a valid, writable
    // statvfs; statvfs(3) writes only into it.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
    assert_eq!(
        rc,
        0,
        "statvfs({}): {}",
        dir.display(),
        std::io::Error::last_os_error()
    );
    let block = stat.f_frsize as u64;
    (stat.f_bavail as u64 * block, stat.f_blocks as u64 * block)
}

/// Writes zeros to `file` until `dir`'s volume has `left` bytes free.
fn fill(dir: &Path, file: &Path, left: u64) -> u64 {
    let (free, _) = volume(dir);
    assert!(
        free > left + (1 << 20),
        "{} has only {free} bytes free before the filler",
        dir.display()
    );
    let mut remaining = free - left;
    let written = remaining;
    let mut filler = std::fs::File::create(file).unwrap();
    let block = vec![0u8; 1 << 20];
    while remaining > 0 {
        let n = remaining.min(block.len() as u64) as usize;
        filler.write_all(&block[..n]).unwrap();
        remaining -= n as u64;
    }
    filler.sync_all().unwrap();
    written
}

/// One segment of `topic describe --json`.
#[derive(Debug, Clone)]
struct Described {
    id: u64,
    range: u64,
    replicas: Vec<u64>,
    state: String,
    length: Option<u64>,
}

fn describe(broker: &str, topic: &str) -> Vec<Described> {
    let output = ok(malachi(broker, &["topic", "describe", topic, "--json"], ""));
    let described: Value = serde_json::from_str(&out(&output)).unwrap();
    let mut segments = Vec::new();
    for range in described["ranges"].as_array().unwrap() {
        for segment in range["segments"].as_array().unwrap() {
            segments.push(Described {
                id: segment["id"].as_u64().unwrap(),
                range: range["id"].as_u64().unwrap_or(0),
                replicas: segment["replicas"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_u64().unwrap())
                    .collect(),
                state: segment["state"].as_str().unwrap_or("").to_string(),
                length: segment["length"].as_u64(),
            });
        }
    }
    segments.sort_by_key(|s| s.id);
    segments
}

/// GET `path` on an admin port: the status code.
fn admin_status(admin: &str, path: &str) -> u16 {
    admin_get(admin, path).0
}

/// GET `path` on an admin port: (status code, body).
fn admin_get(admin: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(admin).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("GET {path} on {admin}: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The value of the gauge `name` on an admin port's `/metrics`.
fn gauge(admin: &str, name: &str) -> f64 {
    let (status, body) = admin_get(admin, "/metrics");
    assert_eq!(status, 200, "/metrics on {admin}");
    body.lines()
        .find_map(|l| {
            let (metric, value) = l.split_once(' ')?;
            (metric == name).then(|| value.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no {name} on {admin}/metrics"))
}

/// The attributes of `node` as broker `asked` sees them (`cluster status`).
fn attributes_of(asked: &str, node: u64) -> HashMap<String, String> {
    let output = ok(malachi(asked, &["cluster", "status", "--json"], ""));
    for line in out(&output).lines() {
        let broker: Value = serde_json::from_str(line).unwrap();
        if broker["node_id"].as_u64() == Some(node) {
            return broker["attributes"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                .collect();
        }
    }
    panic!("{asked} does not know broker {node}: {}", out(&output));
}

fn says_full(attributes: &HashMap<String, String>) -> bool {
    attributes.get("malachi.storage").map(String::as_str) == Some("full")
}

/// Producer `p`'s line `i`: its own keys, so each producer's per-key
/// sequences are checked apart.
fn line(p: u64, i: u64) -> String {
    format!("p{p}k{}\t{}\n", i % KEYS, i / KEYS)
}

/// Per key 0, 1, 2, ... in order, each once, and `expected[p]` records of
/// producer `p` in all.
fn assert_exactly_once_in_key_order(records: &[(String, String)], expected: &[u64], through: &str) {
    let mut next: HashMap<&str, u64> = HashMap::new();
    let mut per_producer: HashMap<String, u64> = HashMap::new();
    for (at, (key, value)) in records.iter().enumerate() {
        let wanted = next.entry(key.as_str()).or_default();
        let got: u64 = value.parse().unwrap_or_else(|_| panic!("value {value:?}"));
        assert_eq!(
            got, *wanted,
            "through {through}, record {at}: key {key} has {got} where {wanted} comes next (a duplicate, gap or reordering)"
        );
        *wanted += 1;
        let producer = key.split('k').next().unwrap_or("").to_string();
        *per_producer.entry(producer).or_default() += 1;
    }
    for (p, lines) in expected.iter().enumerate() {
        assert_eq!(
            per_producer.get(&format!("p{p}")).copied().unwrap_or(0),
            *lines,
            "through {through}: records of producer {p}"
        );
    }
    assert_eq!(
        records.len() as u64,
        expected.iter().sum::<u64>(),
        "through {through}: records in all"
    );
}

/// Polls `done` every 100 ms until it holds, failing with `what` (and the
/// brokers' logs) past `limit`; returns how long it took.
fn wait_until(
    cluster: &Cluster,
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        if done() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "{what} (waited {limit:?})\n{}",
            interesting_lines(cluster)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The brokers' warnings, errors, and volume and failover lines (past
/// start-up), for a failure message.
fn interesting_lines(cluster: &Cluster) -> String {
    cluster
        .nodes
        .iter()
        .map(|n| {
            let lines: Vec<String> = n
                .log()
                .lines()
                .filter(|l| {
                    (l.contains("WARN")
                        || l.contains("ERROR")
                        || l.contains("volume")
                        || l.contains("failover")
                        || l.contains("failed over"))
                        // Start-up noise: elections before the peers are known.
                        && !l.contains("while requesting")
                        && !l.contains("ractor_cluster::node")
                        && !l.contains("no longer Leader")
                })
                .take(80)
                .map(str::to_owned)
                .collect();
            format!("--- node {} ---\n{}", n.node_id, lines.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_full_volume_fails_its_segment_over_producers_move_on_and_freeing_space_recovers_it() {
    let started = Instant::now();
    let mut rig = Rig {
        cluster: None,
        mounts: Vec::new(),
        dir: Some(tempfile::tempdir().unwrap()),
    };
    // `ClusterNode` keeps broker N's data in `node-N` under the root.
    let root = rig.root().to_owned();
    for id in 1..=3u64 {
        rig.mount(&root.join(format!("node-{id}")));
    }
    // The `[cluster]` lines end the config file, so a table after them is
    // the file's own: the line a quarter of each 64 MiB volume (the default
    // 128 MiB would be more than the volume).
    rig.cluster = Some(Cluster::three_with(
        &root,
        &format!("\n[store]\nmin_free_bytes = {MIN_FREE_BYTES}\n"),
    ));
    let cluster = rig.cluster();
    cluster.wait_for_coordinators(common::cluster::VNODES_DEFAULT);
    let clients = cluster.clients();
    let admin_of = |node: u64| cluster.nodes[(node - 1) as usize].admin.clone();
    let dir_of = |node: u64| cluster.nodes[(node - 1) as usize].data_dir.clone();
    for node in 1..=3 {
        assert_eq!(
            admin_status(&admin_of(node), "/ready"),
            200,
            "broker {node}"
        );
        let (free, total) = volume(&dir_of(node));
        println!("broker {node}: {free} of {total} bytes free after start");
    }

    ok(malachi(&clients[0], &["topic", "create", TOPIC], ""));
    let first = describe(&clients[0], TOPIC);
    assert_eq!(first.len(), 1, "{first:?}");
    let old = first[0].clone();
    assert_eq!(old.replicas.len(), 3, "the default replication factor is 3");
    let full = old.replicas[0];
    println!(
        "segment {} on {:?}; filling broker {full}",
        old.id, old.replicas
    );

    // Producers with the CLI's default flags (pipelined, retried, 10 s
    // delivery timeout), bootstrapped through every broker, the one whose
    // volume fills among them. They write a quarter, go on writing while
    // the volume fills and the segment moves (about a second: the guard's
    // poll, then the failover), and wait before the last quarter until it
    // has moved, so records go to the old primary, to the successor, and
    // some in between.
    let written: Vec<Arc<AtomicU64>> = (0..PRODUCERS)
        .map(|_| Arc::new(AtomicU64::new(0)))
        .collect();
    let moved_flag = Arc::new(AtomicBool::new(false));
    let mut children = Vec::new();
    let mut writers = Vec::new();
    for p in 0..PRODUCERS {
        let mut child = spawn_malachi(&clients[(p % 3) as usize], &["produce", TOPIC]);
        let mut stdin = child.stdin.take().unwrap();
        let written = Arc::clone(&written[p as usize]);
        let moved = Arc::clone(&moved_flag);
        writers.push(std::thread::spawn(move || {
            let mut i = 0;
            while i < LINES {
                if i >= 3 * LINES / 4 {
                    let deadline = Instant::now() + MOVE_TIMEOUT + Duration::from_secs(10);
                    while !moved.load(Ordering::Relaxed) && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                let chunk: String = (i..(i + CHUNK).min(LINES)).map(|j| line(p, j)).collect();
                if stdin.write_all(chunk.as_bytes()).is_err() || stdin.flush().is_err() {
                    break;
                }
                i = (i + CHUNK).min(LINES);
                written.store(i, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(40));
            }
            written.store(LINES, Ordering::Relaxed);
        }));
        children.push(child);
    }
    while written
        .iter()
        .any(|w| w.load(Ordering::Relaxed) < LINES / 4)
    {
        std::thread::sleep(Duration::from_millis(5));
    }

    // The volume fills: a plain file leaves less than the line free.
    let full_dir = dir_of(full);
    let filler = full_dir.join("filler");
    let filled_bytes = fill(&full_dir, &filler, LEFT_FREE_BYTES);
    let filled = Instant::now();
    println!(
        "filler of {filled_bytes} bytes written; {} bytes free",
        volume(&full_dir).0
    );

    // Not ready within a poll or two.
    let not_ready_after = wait_until(cluster, MOVE_TIMEOUT, "the full broker stays ready", || {
        admin_status(&admin_of(full), "/ready") == 503
    });
    // The active segment moves: sealed, its successor on the brokers with
    // room, led by one that held a copy.
    let mut successor = None;
    let moved_after = wait_until(
        cluster,
        MOVE_TIMEOUT,
        "the full broker's active segment never moved to the brokers with room",
        || {
            let now = describe(&clients[0], TOPIC);
            let sealed = now.iter().any(|s| s.id == old.id && s.state == "sealed");
            successor = now
                .iter()
                .find(|s| {
                    s.range == old.range
                        && s.id > old.id
                        && s.state == "active"
                        && !s.replicas.contains(&full)
                })
                .cloned();
            sealed && successor.is_some()
        },
    );
    moved_flag.store(true, Ordering::Relaxed);
    let written_at_move: Vec<u64> = written.iter().map(|w| w.load(Ordering::Relaxed)).collect();
    let successor = successor.unwrap();
    println!(
        "not ready {not_ready_after:?} after the fill; segment {} sealed and {} active on {:?} \
         {moved_after:?} later ({:?} after the fill), the producers having written {written_at_move:?} of {LINES} lines",
        old.id,
        successor.id,
        successor.replicas,
        filled.elapsed(),
    );
    assert!(
        old.replicas.contains(&successor.replicas[0]),
        "the successor's primary held no copy of the sealed segment: {successor:?}"
    );
    let mut others: Vec<u64> = old
        .replicas
        .iter()
        .copied()
        .filter(|n| *n != full)
        .collect();
    others.sort_unstable();
    let mut on = successor.replicas.clone();
    on.sort_unstable();
    assert_eq!(
        on, others,
        "the successor is on every broker with room, and only on them"
    );

    // The full broker says so: to the cluster, on /ready, in its metrics,
    // and in one log line.
    for asked in &clients {
        wait_until(
            cluster,
            MOVE_TIMEOUT,
            &format!("{asked} never saw broker {full} as full"),
            || says_full(&attributes_of(asked, full)),
        );
    }
    assert_eq!(gauge(&admin_of(full), "malachi_storage_full"), 1.0);
    for node in others.iter().copied() {
        assert_eq!(
            admin_status(&admin_of(node), "/ready"),
            200,
            "broker {node}"
        );
        assert_eq!(gauge(&admin_of(node), "malachi_storage_full"), 0.0);
    }

    // Every producer gets every record acknowledged.
    for writer in writers {
        writer.join().unwrap();
    }
    for (p, child) in children.into_iter().enumerate() {
        let output = wait_output(child, Duration::from_secs(120));
        assert!(
            output.status.success(),
            "producer {p} failed: {}\n{}",
            err(&output),
            interesting_lines(cluster)
        );
        assert_eq!(
            out(&output),
            format!("{LINES} of {LINES} records acknowledged by {TOPIC}\n"),
            "producer {p}: {}",
            err(&output)
        );
    }

    // Still full (nothing freed the space): not ready, nothing more on its
    // volume than the margin allows.
    let (free_while_full, _) = volume(&full_dir);
    assert!(
        free_while_full < MIN_FREE_BYTES,
        "{free_while_full} bytes free on the full volume"
    );
    assert_eq!(admin_status(&admin_of(full), "/ready"), 503);

    // Records went to both segments, and the old one is sealed at a length
    // that the surviving copies hold.
    let now = describe(&clients[0], TOPIC);
    let sealed = now.iter().find(|s| s.id == old.id).unwrap().clone();
    let seal = sealed.length.expect("a sealed segment has a length");
    assert!(
        seal > 0 && seal < PRODUCERS * LINES,
        "the sealed segment holds {seal} of {} records: the producers did not write across the move",
        PRODUCERS * LINES
    );
    for node in &others {
        let count = frames(&dir_of(*node), old.id).1;
        assert!(
            count >= seal,
            "broker {node}'s copy holds {count} frames; the seal is {seal}"
        );
    }

    // Nothing acknowledged is lost or repeated, through every broker, the
    // full one included (its sealed copy is read, not written).
    let expected = vec![LINES; PRODUCERS as usize];
    for broker in &clients {
        let records = consume_all(broker, TOPIC);
        assert_exactly_once_in_key_order(&records, &expected, broker);
    }

    // Space is freed: the broker recovers by itself, no restart.
    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    println!("filler deleted; {} bytes free", volume(&full_dir).0);
    let ready_after = wait_until(
        cluster,
        RECOVER_TIMEOUT,
        "the broker never became ready again after space was freed",
        || admin_status(&admin_of(full), "/ready") == 200,
    );
    for asked in &clients {
        wait_until(
            cluster,
            RECOVER_TIMEOUT,
            &format!("{asked} still sees broker {full} as full"),
            || !says_full(&attributes_of(asked, full)),
        );
    }
    println!(
        "ready {ready_after:?} after the filler was deleted; the cluster knows after {:?}",
        freed.elapsed()
    );
    assert_eq!(gauge(&admin_of(full), "malachi_storage_full"), 0.0);
    let full_log = cluster.nodes[(full - 1) as usize].log();
    let became_full = full_log
        .lines()
        .filter(|l| l.contains("the data volume is nearly full"))
        .count();
    let recovered = full_log
        .lines()
        .filter(|l| l.contains("the data volume has space again"))
        .count();
    assert_eq!(
        (became_full, recovered),
        (1, 1),
        "one line when the volume filled and one when it had room again\n{}",
        interesting_lines(cluster)
    );

    // It takes copies again: a new topic's segment has a copy on it (three
    // brokers, three copies), and records go through it.
    ok(malachi(&clients[0], &["topic", "create", "refilled"], ""));
    let fresh = describe(&clients[0], "refilled");
    assert_eq!(fresh.len(), 1, "{fresh:?}");
    assert!(
        fresh[0].replicas.contains(&full) && fresh[0].replicas.len() == 3,
        "a topic created after the recovery has no copy on broker {full}: {fresh:?}"
    );
    let lines: String = (0..LINES_AFTER).map(|i| line(0, i)).collect();
    let answer = ok(malachi(
        &clients[(full - 1) as usize],
        &["produce", "refilled"],
        &lines,
    ));
    assert_eq!(
        out(&answer),
        format!("{LINES_AFTER} of {LINES_AFTER} records acknowledged by refilled\n")
    );
    wait_until(
        cluster,
        RECOVER_TIMEOUT,
        "the recovered broker's copy of the new topic never held its records",
        || frames(&full_dir, fresh[0].id).1 == LINES_AFTER,
    );
    let records = consume_all(&clients[(full - 1) as usize], "refilled");
    assert_exactly_once_in_key_order(&records, &[LINES_AFTER], "refilled");

    // The first topic's active segment, left on two brokers by the
    // failover, rolls onto a full set of three again once the broker has
    // room (`failover_candidates`' restore rule): a loss of copies never
    // outlives the fault.
    let restored = wait_until(
        cluster,
        Duration::from_secs(60),
        "the first topic's active segment never got its third copy back",
        || {
            describe(&clients[0], TOPIC)
                .iter()
                .filter(|s| s.state == "active")
                .all(|s| s.replicas.len() == 3 && s.replicas.contains(&full))
        },
    );
    println!("{TOPIC} back to three copies {restored:?} after the recovery");

    // And the first topic goes on taking records, all of them still read
    // once in key order through every broker.
    let lines: String = (0..LINES_AFTER).map(|i| line(PRODUCERS, i)).collect();
    ok(malachi(
        &clients[(full - 1) as usize],
        &["produce", TOPIC],
        &lines,
    ));
    let mut expected = vec![LINES; PRODUCERS as usize];
    expected.push(LINES_AFTER);
    for broker in &clients {
        let records = consume_all(broker, TOPIC);
        assert_exactly_once_in_key_order(&records, &expected, broker);
    }
    println!(
        "after the recovery, {TOPIC}'s segments: {:?}",
        describe(&clients[0], TOPIC)
            .iter()
            .map(|s| (s.id, s.state.as_str(), s.replicas.clone(), s.length))
            .collect::<Vec<_>>()
    );
    println!("wall time {:?}", started.elapsed());
}
