//! What `bench compare` prints: one row per system, scenario and durability,
//! the ratios between them, the targets, and the text table. Pure
//! functions over numbers, so the rendering is tested on fixed figures.
//!
//! Rows are compared within one replication factor: a single Malachi broker
//! against the single-server peers, three Malachi brokers at RF=3
//! ([`MALACHI_RF3`]) against the three-node NATS cluster at R3. An RF=3 row
//! also carries its own raw disk baseline, measured in slices interleaved
//! with its load, divided by three (every byte is written to the one disk
//! three times): `ratio_to_raw_third`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// `system` of the raw disk rows: pwrite and fdatasync on plain files.
pub const RAW_DISK: &str = "raw-disk";
/// `system` of the loopback TCP bandwidth row.
pub const LOOPBACK: &str = "loopback";
pub const MALACHI: &str = "malachi";
/// `system` of three Malachi brokers on one machine, topic at RF=3.
pub const MALACHI_RF3: &str = "malachi-rf3";
/// `system` of one Malachi broker whose client port speaks TLS and whose
/// clients log in with SCRAM-SHA-256, measured beside a plaintext broker
/// in interleaved slices (issue 39).
pub const MALACHI_TLS: &str = "malachi-tls";
/// Copies an RF=3 row writes of each record, all on the one disk.
pub const RF3_COPIES: u32 = 3;
/// The scenario every target is judged on (16 producers, issue 8).
pub const TARGET_SCENARIO: &str = "produce-p16";

/// One line of the comparison. Every field is always present in JSON (null
/// where it does not apply), so scripts can rely on the shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// `malachi`, `malachi-rf3`, `redis`, `nats`, `nats-r3`, `raw-disk` or
    /// `loopback`.
    pub system: String,
    /// `produce-p1`, `produce-p16`, `produce-p64`, `consume`,
    /// `fsync-latency` or `tcp-bandwidth`.
    pub scenario: String,
    /// `durable` (acknowledged after an fsync that covers the write),
    /// `default` (the peer's default, weaker setting) or `-`.
    pub durability: String,
    /// When the system fsyncs: `per write`, `every 1 s`, `every 2 min`, `-`.
    pub fsync: String,
    /// Concurrent producers (consumers for `consume`, files for `raw-disk`).
    pub clients: usize,
    /// Copies of each record the system keeps (and writes to the one disk):
    /// 3 for `malachi-rf3` and `nats-r3`, 1 otherwise. Malachi is compared
    /// with the peers of its own replication factor.
    pub replication_factor: u32,
    /// Payload bytes per record (per write for `raw-disk`).
    pub record_bytes: usize,
    pub seconds: f64,
    pub records: u64,
    /// Payload MB/s (10^6 bytes): record values only, the same for every system.
    pub mb_per_s: f64,
    pub records_per_s: f64,
    /// Acknowledgement latency (produce), read latency (consume) or fsync
    /// latency (raw disk), in microseconds; null when nothing was
    /// acknowledged in the row (`records` 0).
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
    pub p999_us: Option<u64>,
    /// This row's MB/s over the raw disk's at the same parallelism and batch
    /// size (produce rows only).
    pub ratio_to_raw: Option<f64>,
    /// RF=3 Malachi rows: the raw disk's MB/s at the same parallelism and
    /// batch size, measured in slices interleaved with the row's own, divided
    /// by [`RF3_COPIES`] (what is left for payload when each byte is written
    /// three times).
    pub raw_third_mb_per_s: Option<f64>,
    /// This row's MB/s over `raw_third_mb_per_s` (target: at least 0.6).
    pub ratio_to_raw_third: Option<f64>,
    /// `malachi-tls` rows: the MB/s of a plaintext broker of the same
    /// config, measured in slices interleaved with the row's own (the same
    /// load, the same disk, the same minutes).
    pub plaintext_mb_per_s: Option<f64>,
    /// This row's MB/s over `plaintext_mb_per_s` (targets: produce at
    /// least 0.85, consume at least 0.7).
    pub ratio_to_plaintext: Option<f64>,
    /// The MB/s of Malachi at the same replication factor in the same
    /// scenario over this row's (peer rows only).
    pub malachi_over_this: Option<f64>,
    /// On Malachi rows: its MB/s over each peer's of the same replication
    /// factor in the same scenario, keyed `redis-durable`, `redis-default`,
    /// `nats-durable`, `nats-default` (RF=1) or `nats-r3-durable`,
    /// `nats-r3-default` (RF=3).
    pub ratio_to_peers: BTreeMap<String, f64>,
    pub errors: u64,
    /// Writes still unacknowledged when the row stopped waiting for them
    /// (after its duration and a drain of at most 5 s): not counted.
    pub dropped: u64,
    /// The server's version line (or the raw method), for reproducibility.
    pub version: String,
}

impl Row {
    fn peer_key(&self) -> String {
        format!("{}-{}", self.system, self.durability)
    }

    fn is_malachi(&self) -> bool {
        matches!(self.system.as_str(), MALACHI | MALACHI_RF3)
    }

    fn is_peer(&self) -> bool {
        !self.is_malachi() && !matches!(self.system.as_str(), RAW_DISK | LOOPBACK | MALACHI_TLS)
    }
}

/// A payload bandwidth over a third of a raw disk bandwidth measured beside
/// it: `(mb_per_s, raw_mb_per_s / 3)`, or none when the raw run moved
/// nothing.
pub fn raw_third(mb_per_s: f64, raw_mb_per_s: f64) -> (f64, Option<f64>) {
    let third = raw_mb_per_s / f64::from(RF3_COPIES);
    (third, ratio(mb_per_s, third))
}

/// Fill in `ratio_to_raw` (produce rows over the raw disk row of the same
/// scenario), `ratio_to_raw_third` (rows that carry their interleaved
/// baseline) and the ratios between Malachi and each peer row of the same
/// scenario and replication factor. Ratios are of payload MB/s; a zero
/// denominator gives none.
pub fn fill_ratios(rows: &mut [Row]) {
    let raw = |rows: &[Row], scenario: &str| {
        rows.iter()
            .find(|r| r.system == RAW_DISK && r.scenario == scenario)
            .map(|r| r.mb_per_s)
    };
    let malachi = |rows: &[Row], scenario: &str, rf: u32| {
        rows.iter()
            .find(|r| r.is_malachi() && r.scenario == scenario && r.replication_factor == rf)
            .map(|r| r.mb_per_s)
    };
    let snapshot = rows.to_vec();
    for row in rows.iter_mut() {
        let is_produce = row.scenario.starts_with("produce-");
        if is_produce && row.system != RAW_DISK {
            row.ratio_to_raw =
                raw(&snapshot, &row.scenario).and_then(|raw| ratio(row.mb_per_s, raw));
        }
        row.ratio_to_raw_third = row
            .raw_third_mb_per_s
            .and_then(|third| ratio(row.mb_per_s, third));
        row.ratio_to_plaintext = row
            .plaintext_mb_per_s
            .and_then(|plain| ratio(row.mb_per_s, plain));
        if row.is_peer() {
            row.malachi_over_this = malachi(&snapshot, &row.scenario, row.replication_factor)
                .and_then(|m| ratio(m, row.mb_per_s));
        }
        if row.is_malachi() {
            row.ratio_to_peers = snapshot
                .iter()
                .filter(|p| {
                    p.is_peer()
                        && p.scenario == row.scenario
                        && p.replication_factor == row.replication_factor
                })
                .filter_map(|p| ratio(row.mb_per_s, p.mb_per_s).map(|r| (p.peer_key(), r)))
                .collect();
        }
    }
}

fn ratio(numerator: f64, denominator: f64) -> Option<f64> {
    (denominator > 0.0 && numerator.is_finite()).then(|| numerator / denominator)
}

/// The text table: one row per line, limits and produce scenarios grouped,
/// ratios in the last columns (`raw/3` is an RF=3 row's interleaved raw
/// baseline over three, in MB/s; `x plain` a TLS row's over its
/// interleaved plaintext baseline).
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<11} {:<14} {:<27} {:>9} {:>11} {:>9} {:>9} {:>9} {:>6} {:>7} {:>7} {:>10} {:>7}",
        "system",
        "scenario",
        "durability",
        "MB/s",
        "records/s",
        "p50 us",
        "p99 us",
        "p999 us",
        "x raw",
        "raw/3",
        "x raw/3",
        "malachi x",
        "x plain"
    );
    let mut last_scenario = None;
    for row in rows {
        if last_scenario.is_some_and(|s: &str| s != row.scenario) {
            out.push('\n');
        }
        last_scenario = Some(&row.scenario);
        let durability = if row.durability == "-" {
            "-".to_owned()
        } else {
            format!("{} (fsync {})", row.durability, row.fsync)
        };
        let _ = writeln!(
            out,
            "{:<11} {:<14} {:<27} {:>9.1} {:>11.0} {:>9} {:>9} {:>9} {:>6} {:>7} {:>7} {:>10} {:>7}",
            row.system,
            row.scenario,
            durability,
            row.mb_per_s,
            row.records_per_s,
            latency(row.p50_us),
            latency(row.p99_us),
            latency(row.p999_us),
            optional(row.ratio_to_raw),
            row.raw_third_mb_per_s
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.1}")),
            optional(row.ratio_to_raw_third),
            optional(row.malachi_over_this),
            optional(row.ratio_to_plaintext),
        );
    }
    out
}

fn latency(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn optional(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

/// One of the targets, judged on this run's rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub what: &'static str,
    pub wanted: f64,
    /// `None` when a row it needs was not measured.
    pub measured: Option<f64>,
}

/// A target's threshold as written in its issue: one decimal, or two
/// when it has them (0.85).
fn threshold(wanted: f64) -> String {
    if (wanted * 10.0).fract().abs() < 1e-9 {
        format!("{wanted:.1}")
    } else {
        format!("{wanted:.2}")
    }
}

impl Target {
    pub fn line(&self) -> String {
        match self.measured {
            Some(v) if v.is_infinite() => format!(
                "target {}: >= {}: met (the peer acknowledged no write within the row)",
                self.what,
                threshold(self.wanted)
            ),
            Some(v) => format!(
                "target {}: >= {}, measured {v:.2}: {}",
                self.what,
                threshold(self.wanted),
                if v >= self.wanted { "met" } else { "missed" }
            ),
            None => format!(
                "target {}: >= {}: not measured in this run",
                self.what,
                threshold(self.wanted)
            ),
        }
    }
}

/// The issues' targets for Malachi, 16 producers, 1 KiB records, durable
/// (issue 8's against the peers and the disk, issue 17's at RF=3, issue
/// 39's for TLS and SCRAM against plaintext).
pub fn targets(rows: &[Row]) -> Vec<Target> {
    let malachi = rows
        .iter()
        .find(|r| r.system == MALACHI && r.scenario == TARGET_SCENARIO);
    // A peer row that acknowledged nothing gives no finite ratio; Malachi
    // moving anything at all then beats it by more than any target.
    let peer = |key: &str| {
        let m = malachi?;
        m.ratio_to_peers.get(key).copied().or_else(|| {
            rows.iter()
                .any(|p| {
                    p.scenario == TARGET_SCENARIO
                        && p.peer_key() == key
                        && p.records == 0
                        && m.records > 0
                })
                .then_some(f64::INFINITY)
        })
    };
    let tls = |scenario: &str| {
        rows.iter()
            .find(|r| r.system == MALACHI_TLS && r.scenario == scenario)
            .and_then(|r| r.ratio_to_plaintext)
    };
    vec![
        Target {
            what: "malachi / redis durable (16 producers)",
            wanted: 3.0,
            measured: peer("redis-durable"),
        },
        Target {
            what: "malachi / nats durable (16 producers)",
            wanted: 20.0,
            measured: peer("nats-durable"),
        },
        Target {
            what: "malachi / redis default (16 producers)",
            wanted: 1.0,
            measured: peer("redis-default"),
        },
        Target {
            what: "malachi / nats default (16 producers)",
            wanted: 1.0,
            measured: peer("nats-default"),
        },
        Target {
            what: "malachi / raw disk (16 producers)",
            wanted: 0.7,
            measured: malachi.and_then(|m| m.ratio_to_raw),
        },
        Target {
            what: "malachi rf=3 / a third of the raw disk beside it (16 producers)",
            wanted: 0.6,
            measured: rows
                .iter()
                .find(|r| r.system == MALACHI_RF3 && r.scenario == TARGET_SCENARIO)
                .and_then(|m| m.ratio_to_raw_third),
        },
        Target {
            what: "malachi tls+scram / plaintext beside it, produce (16 producers)",
            wanted: 0.85,
            measured: tls(TARGET_SCENARIO),
        },
        Target {
            what: "malachi tls+scram / plaintext beside it, consume",
            wanted: 0.7,
            measured: tls("consume"),
        },
    ]
}

/// Today's date in UTC as `YYYY-MM-DD`, for the results file names.
pub fn utc_date(unix_seconds: u64) -> String {
    // Howard Hinnant's days-to-civil, for days since 1970-01-01.
    let days = (unix_seconds / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
pub mod tests {
    use super::*;

    pub fn row(system: &str, scenario: &str, durability: &str, fsync: &str, mb: f64) -> Row {
        Row {
            system: system.into(),
            scenario: scenario.into(),
            durability: durability.into(),
            fsync: fsync.into(),
            clients: 16,
            replication_factor: if system.ends_with("-rf3") || system.ends_with("-r3") {
                RF3_COPIES
            } else {
                1
            },
            record_bytes: 1024,
            seconds: 5.0,
            records: (mb * 1e6 / 1024.0 * 5.0) as u64,
            mb_per_s: mb,
            records_per_s: mb * 1e6 / 1024.0,
            p50_us: Some(1_000),
            p99_us: Some(5_000),
            p999_us: Some(9_000),
            ratio_to_raw: None,
            raw_third_mb_per_s: None,
            ratio_to_raw_third: None,
            plaintext_mb_per_s: None,
            ratio_to_plaintext: None,
            malachi_over_this: None,
            ratio_to_peers: BTreeMap::new(),
            errors: 0,
            dropped: 0,
            version: "v".into(),
        }
    }

    /// A run with every system, fixed numbers.
    pub fn fixed_rows() -> Vec<Row> {
        let mut rows = vec![
            row(RAW_DISK, "produce-p16", "durable", "per write", 500.0),
            row(MALACHI, "produce-p16", "durable", "per write", 400.0),
            row("redis", "produce-p16", "durable", "per write", 50.0),
            row("redis", "produce-p16", "default", "every 1 s", 100.0),
            row("nats", "produce-p16", "durable", "per write", 2.5),
            row("nats", "produce-p16", "default", "every 2 min", 80.0),
            row(MALACHI, "consume", "durable", "per write", 600.0),
            row("redis", "consume", "durable", "per write", 150.0),
            row(LOOPBACK, "tcp-bandwidth", "-", "-", 3000.0),
        ];
        // The RF=3 rows sort after the single servers of their scenario.
        rows.splice(
            6..6,
            [
                rf3_row(120.0, 600.0),
                row("nats-r3", "produce-p16", "durable", "per write", 1.5),
                row("nats-r3", "produce-p16", "default", "every 2 min", 40.0),
            ],
        );
        fill_ratios(&mut rows);
        rows
    }

    /// [`fixed_rows`] with the TLS rows, measured at `produce` and `consume` MB/s beside
    /// plaintext baselines of 400 and 600.
    pub fn fixed_rows_with_tls(produce: f64, consume: f64) -> Vec<Row> {
        let mut rows = fixed_rows();
        let tls = |scenario: &str, mb: f64, plain: f64| {
            let mut r = row(MALACHI_TLS, scenario, "durable", "per write", mb);
            r.plaintext_mb_per_s = Some(plain);
            r
        };
        // Where `bench compare` sorts them: right after Malachi's own row.
        let consume_at = rows
            .iter()
            .position(|r| r.system == MALACHI && r.scenario == "consume")
            .unwrap();
        rows.insert(consume_at + 1, tls("consume", consume, 600.0));
        rows.insert(2, tls("produce-p16", produce, 400.0));
        for r in &mut rows {
            r.ratio_to_peers.clear();
            r.malachi_over_this = None;
        }
        fill_ratios(&mut rows);
        rows
    }

    #[test]
    fn a_tls_row_is_divided_by_its_plaintext_baseline_and_is_no_peer() {
        let rows = fixed_rows_with_tls(360.0, 300.0);
        let tls: Vec<&Row> = rows.iter().filter(|r| r.system == MALACHI_TLS).collect();
        assert_eq!(tls[0].ratio_to_plaintext, Some(0.9));
        assert_eq!(tls[1].ratio_to_plaintext, Some(0.5));
        // Not a peer: Malachi is not compared with itself, nor the TLS row
        // with the peers.
        assert_eq!(tls[0].malachi_over_this, None);
        assert!(tls[0].ratio_to_peers.is_empty());
        let malachi = rows.iter().find(|r| r.system == MALACHI).unwrap();
        assert!(malachi.ratio_to_peers.keys().all(|k| !k.contains("tls")));
        // Rows without a plaintext baseline have no ratio to one.
        assert_eq!(malachi.ratio_to_plaintext, None);
        let t = targets(&rows);
        assert!(
            t[6].line().ends_with("measured 0.90: met"),
            "{}",
            t[6].line()
        );
        assert!(
            t[7].line().ends_with("measured 0.50: missed"),
            "{}",
            t[7].line()
        );
        assert!(
            targets(&fixed_rows())[7]
                .line()
                .ends_with("not measured in this run")
        );
    }

    /// A Malachi RF=3 row of `mb` MB/s whose interleaved raw slices moved
    /// `raw` MB/s.
    pub fn rf3_row(mb: f64, raw: f64) -> Row {
        let mut rf3 = row(MALACHI_RF3, "produce-p16", "durable", "per write", mb);
        rf3.raw_third_mb_per_s = Some(raw_third(mb, raw).0);
        rf3
    }

    #[test]
    fn a_third_of_the_raw_disk_is_what_three_copies_leave_for_payload() {
        assert_eq!(raw_third(120.0, 600.0), (200.0, Some(0.6)));
        assert_eq!(raw_third(300.0, 450.0), (150.0, Some(2.0)));
        // A raw run that moved nothing gives no ratio.
        assert_eq!(raw_third(10.0, 0.0), (0.0, None));
    }

    #[test]
    fn an_rf3_row_is_divided_by_its_own_raw_third_and_compared_with_the_r3_peers_only() {
        let rows = fixed_rows();
        let rf3 = rows.iter().find(|r| r.system == MALACHI_RF3).unwrap();
        assert_eq!(rf3.replication_factor, 3);
        assert_eq!(rf3.raw_third_mb_per_s, Some(200.0));
        assert_eq!(rf3.ratio_to_raw_third, Some(0.6));
        // Against the whole raw disk of the limits, as every produce row.
        assert_eq!(rf3.ratio_to_raw, Some(0.24));
        let keys: Vec<&str> = rf3.ratio_to_peers.keys().map(String::as_str).collect();
        assert_eq!(keys, ["nats-r3-default", "nats-r3-durable"]);
        assert_eq!(rf3.ratio_to_peers["nats-r3-durable"], 80.0);
        assert_eq!(rf3.ratio_to_peers["nats-r3-default"], 3.0);
        let nats_r3 = rows
            .iter()
            .find(|r| r.system == "nats-r3" && r.durability == "default")
            .unwrap();
        assert_eq!(nats_r3.malachi_over_this, Some(3.0));
        // The single broker is not compared with the cluster, nor the other
        // way round; rows without an interleaved baseline have no raw third.
        let single = &rows[1];
        assert!(single.ratio_to_peers.keys().all(|k| !k.contains("r3")));
        assert_eq!(single.ratio_to_raw_third, None);
        assert_eq!(rows[4].malachi_over_this, Some(160.0));
    }

    #[test]
    fn the_rf3_target_is_judged_on_the_interleaved_raw_third() {
        let missed = vec![rf3_row(100.0, 600.0)];
        let mut missed = missed;
        fill_ratios(&mut missed);
        let rf3 = |rows: &[Row]| {
            targets(rows)
                .into_iter()
                .find(|t| t.what.starts_with("malachi rf=3"))
                .unwrap()
        };
        let t = rf3(&missed);
        assert_eq!(t.measured, Some(0.5));
        assert!(t.line().ends_with("measured 0.50: missed"), "{}", t.line());
        let t = rf3(&[]);
        assert!(
            t.line().ends_with("not measured in this run"),
            "{}",
            t.line()
        );
    }

    #[test]
    fn produce_rows_are_divided_by_the_raw_disk_of_their_scenario() {
        let rows = fixed_rows();
        assert_eq!(rows[1].ratio_to_raw, Some(0.8));
        assert_eq!(rows[2].ratio_to_raw, Some(0.1));
        // The raw disk is not a ratio of itself, and reads have no raw limit.
        assert_eq!(rows[0].ratio_to_raw, None);
        assert_eq!(rows[9].ratio_to_raw, None);
    }

    #[test]
    fn malachi_is_divided_by_each_peer_of_the_same_scenario() {
        let rows = fixed_rows();
        let peers = &rows[1].ratio_to_peers;
        assert_eq!(peers.get("redis-durable"), Some(&8.0));
        assert_eq!(peers.get("redis-default"), Some(&4.0));
        assert_eq!(peers.get("nats-durable"), Some(&160.0));
        assert_eq!(peers.get("nats-default"), Some(&5.0));
        assert_eq!(peers.len(), 4);
        assert_eq!(rows[2].malachi_over_this, Some(8.0));
        assert_eq!(rows[10].malachi_over_this, Some(4.0));
        assert_eq!(rows[9].ratio_to_peers.get("redis-durable"), Some(&4.0));
        // Neither Malachi nor the limits get a ratio to Malachi.
        assert_eq!(rows[1].malachi_over_this, None);
        assert_eq!(rows[0].ratio_to_raw_third, None);
        assert_eq!(rows[11].malachi_over_this, None);
    }

    #[test]
    fn a_peer_that_moved_nothing_gives_no_ratio_instead_of_infinity() {
        let mut rows = vec![
            row(MALACHI, "produce-p1", "durable", "per write", 10.0),
            row("nats", "produce-p1", "durable", "per write", 0.0),
        ];
        fill_ratios(&mut rows);
        assert!(rows[0].ratio_to_peers.is_empty());
        assert_eq!(rows[1].malachi_over_this, None);
    }

    #[test]
    fn the_table_for_fixed_numbers() {
        insta::assert_snapshot!(table(&fixed_rows_with_tls(360.0, 480.0)));
    }

    #[test]
    fn every_json_line_carries_every_field() {
        for row in fixed_rows() {
            let value = serde_json::to_value(&row).unwrap();
            for field in [
                "system",
                "scenario",
                "durability",
                "mb_per_s",
                "records_per_s",
                "p50_us",
                "p99_us",
                "p999_us",
                "ratio_to_raw",
                "replication_factor",
                "raw_third_mb_per_s",
                "ratio_to_raw_third",
                "malachi_over_this",
                "ratio_to_peers",
                "plaintext_mb_per_s",
                "ratio_to_plaintext",
            ] {
                assert!(value.get(field).is_some(), "{field} missing in {value}");
            }
        }
        let malachi = serde_json::to_value(&fixed_rows()[1]).unwrap();
        assert_eq!(malachi["ratio_to_raw"], serde_json::json!(0.8));
        assert_eq!(
            malachi["ratio_to_peers"]["nats-durable"],
            serde_json::json!(160.0)
        );
    }

    #[test]
    fn targets_are_judged_on_the_16_producer_row() {
        let lines: Vec<String> = targets(&fixed_rows_with_tls(360.0, 480.0))
            .iter()
            .map(Target::line)
            .collect();
        insta::assert_snapshot!(lines.join("\n"));
    }

    #[test]
    fn a_target_whose_peer_was_skipped_says_so() {
        let rows: Vec<Row> = fixed_rows()
            .into_iter()
            .filter(|r| r.system != "nats")
            .collect();
        let mut rows = rows;
        for r in &mut rows {
            r.ratio_to_peers.clear();
        }
        fill_ratios(&mut rows);
        let t = targets(&rows);
        assert_eq!(t[1].measured, None);
        assert!(
            t[1].line().ends_with("not measured in this run"),
            "{}",
            t[1].line()
        );
        assert_eq!(t[0].measured, Some(8.0));
    }

    #[test]
    fn a_peer_that_acknowledged_nothing_shows_no_latency_and_malachi_meets_its_target() {
        let mut rows = fixed_rows();
        let nats = rows
            .iter_mut()
            .find(|r| r.system == "nats" && r.durability == "durable")
            .unwrap();
        nats.records = 0;
        nats.mb_per_s = 0.0;
        nats.records_per_s = 0.0;
        nats.p50_us = None;
        nats.p99_us = None;
        nats.p999_us = None;
        for r in &mut rows {
            r.ratio_to_peers.clear();
            r.malachi_over_this = None;
        }
        fill_ratios(&mut rows);
        let t = &targets(&rows)[1];
        assert_eq!(t.measured, Some(f64::INFINITY));
        assert!(
            t.line().contains("met (the peer acknowledged no write"),
            "{}",
            t.line()
        );
        let table = table(&rows);
        let line = table
            .lines()
            .find(|l| l.starts_with("nats") && l.contains("durable"))
            .unwrap();
        assert!(
            line.contains("       0.0           0         -         -         -"),
            "{line}"
        );
    }

    #[test]
    fn dates_are_utc_calendar_days() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(951_782_400), "2000-02-29");
        assert_eq!(utc_date(1_795_996_800), "2026-11-30");
        assert_eq!(utc_date(1_796_083_199), "2026-11-30");
        assert_eq!(utc_date(1_796_083_200), "2026-12-01");
    }
}
