//! `malachi bench idle`: what a cluster with no traffic costs, broker by
//! broker (issue 18). It starts the brokers itself, as `bench compare`
//! does, waits until they see each other and lets elections settle, then
//! reads each broker's CPU time and resident memory from `/proc` at the
//! start and end of the sampling window. The idle cost of raft groups
//! (heartbeats, lease renewals, ticks) is what it shows; nothing is
//! asserted here: the targets live in docs/benchmarks.md.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use malachi_bench::peers::ServerGuard;
use serde::Serialize;

use super::super::client::connect;
use super::super::error::CliError;
use super::super::{BenchIdleArgs, OutputArgs};
use super::compare::{start_cluster_within, wait_for_brokers};

/// The most brokers one run starts.
const IDLE_BROKERS_MAX: u64 = 16;
/// The most vnodes one run asks for.
const IDLE_VNODES_MAX: u32 = 65_536;
/// How long `--kill-leader` waits for every orphaned vnode to be led again.
const FAILOVER_WAIT_MS: u64 = 60_000;
/// How much longer a broker may take to start per vnode of the ring.
const START_MS_PER_VNODE: u64 = 40;
/// How often the survivors are asked who leads what.
const FAILOVER_POLL_MS: u64 = 10;

/// How long the vnodes a killed broker led took to be led again.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FailoverRow {
    pub brokers: u64,
    pub vnodes: u32,
    /// The broker killed (SIGKILL): the one leading the most vnodes.
    pub killed: u64,
    /// The vnodes it led when it was killed.
    pub vnodes_led: usize,
    /// How many of them a survivor led within the wait.
    pub recovered: usize,
    /// From the kill to a survivor leading the vnode, over the recovered
    /// vnodes; `null` when none recovered.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

/// One broker's figures over the sampling window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IdleRow {
    pub brokers: u64,
    pub vnodes: u32,
    pub node: u64,
    /// CPU time (user and system) over wall time, in percent of one core.
    pub cpu_percent: f64,
    /// Resident memory at the end of the window, in MiB.
    pub rss_mib: f64,
    pub seconds: f64,
}

pub async fn idle(args: BenchIdleArgs) -> Result<(), CliError> {
    if args.brokers == 0 || args.brokers > IDLE_BROKERS_MAX {
        return Err(CliError::Bench(format!(
            "--brokers must be between 1 and {IDLE_BROKERS_MAX}"
        )));
    }
    if args.vnodes == 0 || args.vnodes > IDLE_VNODES_MAX {
        return Err(CliError::Bench(format!(
            "--vnodes must be between 1 and {IDLE_VNODES_MAX}"
        )));
    }
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Bench(format!("cannot find this executable: {e}")))?;
    let mut config = idle_config(args.brokers, args.vnodes);
    for setting in &args.cluster_set {
        config.push_str(&cluster_setting_line(setting)?);
    }
    // Refuse a bad setting here, with its name, not as a broker that
    // failed to start.
    toml::from_str::<malachi_actors::BrokerConfig>(&config).map_err(|e| {
        CliError::Bench(format!(
            "--cluster-set: {}",
            e.message().trim().replace('\n', " ")
        ))
    })?;
    // A broker opens (and on a fresh dir initializes, with fsyncs) every
    // group it votes in before it serves: about 10 ms each on this class of
    // disk, so thousands of vnodes need more than the usual 20 s.
    let start_timeout = Duration::from_millis(20_000 + u64::from(args.vnodes) * START_MS_PER_VNODE);
    let guards = start_cluster_within(
        &exe,
        args.brokers,
        &config,
        |id| {
            tempfile::Builder::new()
                .prefix(&format!("malachi-idle-{id}-"))
                .tempdir()
                .map_err(|e| CliError::Bench(format!("cannot create a directory: {e}")))
        },
        start_timeout,
    )
    .await?;
    let guards: Vec<(u64, ServerGuard)> = (1..=args.brokers).zip(guards).collect();
    let output = OutputArgs {
        credentials: super::super::CredentialArgs::default(),
        client_config: super::super::ClientConfigArgs::internal(),
        broker: vec![
            guards
                .first()
                .map(|(_, g)| g.addr.to_string())
                .unwrap_or_default(),
        ],
        json: true,
        timeout_ms: 10_000,
        tls: Default::default(),
    };
    wait_for_brokers(&output, args.brokers)
        .await
        .map_err(CliError::Bench)?;
    tokio::time::sleep(args.settle).await;
    let before: Vec<Option<u64>> = guards.iter().map(|(_, g)| cpu_ticks(g.pid())).collect();
    let started = Instant::now();
    tokio::time::sleep(args.duration).await;
    let seconds = started.elapsed().as_secs_f64();
    let ticks_per_second = clock_ticks_per_second();
    let mut rows = Vec::new();
    for ((id, guard), before) in guards.iter().zip(before) {
        let (Some(before), Some(after)) = (before, cpu_ticks(guard.pid())) else {
            return Err(CliError::Bench(format!(
                "broker {id} is gone, or /proc cannot be read: {}",
                guard.log_tail()
            )));
        };
        let cpu_seconds = after.saturating_sub(before) as f64 / ticks_per_second;
        rows.push(IdleRow {
            brokers: args.brokers,
            vnodes: args.vnodes,
            node: *id,
            cpu_percent: 100.0 * cpu_seconds / seconds.max(1e-9),
            rss_mib: rss_bytes(guard.pid()).unwrap_or(0) as f64 / (1024.0 * 1024.0),
            seconds,
        });
    }
    for row in &rows {
        if args.json {
            let line = serde_json::to_string(row)
                .map_err(|e| CliError::Bench(format!("cannot encode a row: {e}")))?;
            println!("{line}");
        } else {
            println!("{}", text_row(row));
        }
    }
    if args.kill_leader {
        let mut guards = guards;
        let row = failover(&mut guards, args.vnodes).await?;
        if args.json {
            let line = serde_json::to_string(&row)
                .map_err(|e| CliError::Bench(format!("cannot encode a row: {e}")))?;
            println!("{line}");
        } else {
            println!("{}", failover_text(&row));
        }
    }
    Ok(())
}

fn output_for(guard: &ServerGuard) -> OutputArgs {
    OutputArgs {
        credentials: super::super::CredentialArgs::default(),
        client_config: super::super::ClientConfigArgs::internal(),
        broker: vec![guard.addr.to_string()],
        json: true,
        timeout_ms: 2_000,
        tls: Default::default(),
    }
}

/// SIGKILLs the broker leading the most vnodes and times, for each vnode
/// it led, how long until a survivor's own replica reports that it leads
/// the vnode.
async fn failover(guards: &mut [(u64, ServerGuard)], vnodes: u32) -> Result<FailoverRow, CliError> {
    let bench = |what: &str, e: &dyn std::fmt::Display| CliError::Bench(format!("{what}: {e}"));
    let brokers = guards.len() as u64;
    if guards.len() < 2 {
        return Err(CliError::Bench(
            "--kill-leader needs at least two brokers".to_owned(),
        ));
    }
    let mut clients = Vec::new();
    let mut led: Vec<BTreeSet<u32>> = Vec::new();
    for (id, guard) in guards.iter() {
        let client = connect(&output_for(guard)).await?;
        let list = client
            .vnode_list()
            .await
            .map_err(|e| bench(&format!("vnode list at broker {id}"), &e))?;
        led.push(
            list.vnodes
                .iter()
                .filter(|v| v.leader == Some(*id))
                .map(|v| v.id)
                .collect(),
        );
        clients.push(client);
    }
    let victim = (0..guards.len())
        .max_by_key(|i| led[*i].len())
        .unwrap_or_default();
    let mut pending = led.swap_remove(victim);
    let killed = guards[victim].0;
    let vnodes_led = pending.len();
    drop(clients.swap_remove(victim));
    guards[victim].1.kill_now();
    let killed_at = Instant::now();
    let deadline = killed_at + Duration::from_millis(FAILOVER_WAIT_MS);
    let mut took_ms = Vec::new();
    while !pending.is_empty() && Instant::now() < deadline {
        for client in &clients {
            let Ok(list) = client.vnode_list().await else {
                continue;
            };
            for v in &list.vnodes {
                if v.leader == Some(list.node_id) && pending.remove(&v.id) {
                    took_ms.push(killed_at.elapsed().as_secs_f64() * 1_000.0);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(FAILOVER_POLL_MS)).await;
    }
    took_ms.sort_by(f64::total_cmp);
    Ok(FailoverRow {
        brokers,
        vnodes,
        killed,
        vnodes_led,
        recovered: took_ms.len(),
        p50_ms: percentile(&took_ms, 0.50),
        p99_ms: percentile(&took_ms, 0.99),
        max_ms: took_ms.last().copied(),
    })
}

/// The `q` quantile of sorted samples (nearest rank), `None` when empty.
fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

fn failover_text(row: &FailoverRow) -> String {
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0} ms"));
    format!(
        "broker {} killed: {} of the {} vnodes it led were led again, p50 {}, p99 {}, max {}",
        row.killed,
        row.recovered,
        row.vnodes_led,
        ms(row.p50_ms),
        ms(row.p99_ms),
        ms(row.max_ms)
    )
}

/// Each broker's config: one cluster of `brokers` with `vnodes` vnodes.
pub fn idle_config(brokers: u64, vnodes: u32) -> String {
    let nodes: Vec<String> = (1..=brokers).map(|n| n.to_string()).collect();
    format!(
        "# written by malachi bench idle\n[membership]\ncluster_cookie = \"malachi-bench-idle\"\n\n[cluster]\nnodes = [{}]\nvnodes = {vnodes}\n",
        nodes.join(", ")
    )
}

/// One `--cluster-set KEY=VALUE` as a line of the `[cluster]` table.
fn cluster_setting_line(setting: &str) -> Result<String, CliError> {
    let Some((key, value)) = setting.split_once('=') else {
        return Err(CliError::Bench(format!(
            "--cluster-set wants KEY=VALUE, not `{setting}`"
        )));
    };
    let key = key.trim();
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(CliError::Bench(format!(
            "--cluster-set: `{key}` is not a setting name"
        )));
    }
    Ok(format!("{key} = {}\n", value.trim()))
}

fn text_row(row: &IdleRow) -> String {
    format!(
        "broker {} of {}, {} vnodes: cpu {:.1}% of a core, rss {:.0} MiB, over {:.1} s",
        row.node, row.brokers, row.vnodes, row.cpu_percent, row.rss_mib, row.seconds
    )
}

/// A process's CPU time so far (user and system), in clock ticks, from
/// `/proc/PID/stat`; `None` when it cannot be read.
pub(super) fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat)
}

/// utime + stime of a `/proc/PID/stat` line: fields 14 and 15, counted
/// after the command name, which is in parentheses and may hold spaces.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) is index 11.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A process's resident memory, from `VmRSS` in `/proc/PID/status`.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `/proc` counts CPU time in USER_HZ ticks, which the kernel fixes at 100
/// per second for user space on every architecture Linux runs Malachi on.
fn clock_ticks_per_second() -> f64 {
    100.0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn cpu_ticks_are_read_after_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (malachi (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 731 269 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_cpu_ticks(stat), Some(1000));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn the_config_names_every_broker_and_the_vnode_count() {
        let config = idle_config(3, 256);
        assert!(
            config.contains("nodes = [1, 2, 3]\nvnodes = 256\n"),
            "{config}"
        );
        let parsed: malachi_actors::BrokerConfig = toml::from_str(&config).unwrap();
        assert_eq!(parsed.cluster.vnodes, Some(256));
    }

    #[test]
    fn cluster_settings_become_lines_of_the_cluster_table_and_bad_ones_are_refused() {
        assert_eq!(
            cluster_setting_line("quiet_groups=false").unwrap(),
            "quiet_groups = false\n"
        );
        let mut config = idle_config(3, 16);
        config.push_str(&cluster_setting_line("lease_renew_ms = 8000").unwrap());
        let parsed: malachi_actors::BrokerConfig = toml::from_str(&config).unwrap();
        assert_eq!(parsed.cluster.lease_renew_ms, 8000);
        assert!(cluster_setting_line("no_equals").is_err());
        assert!(cluster_setting_line("bad key=1").is_err());
        config.push_str(&cluster_setting_line("no_such_setting=1").unwrap());
        assert!(toml::from_str::<malachi_actors::BrokerConfig>(&config).is_err());
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&samples, 0.50), Some(50.0));
        assert_eq!(percentile(&samples, 0.99), Some(99.0));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn a_failover_row_reads_as_one_line() {
        let row = FailoverRow {
            brokers: 3,
            vnodes: 256,
            killed: 1,
            vnodes_led: 85,
            recovered: 85,
            p50_ms: Some(1203.4),
            p99_ms: Some(1710.0),
            max_ms: Some(1712.9),
        };
        insta::assert_snapshot!(failover_text(&row), @"broker 1 killed: 85 of the 85 vnodes it led were led again, p50 1203 ms, p99 1710 ms, max 1713 ms");
    }

    #[test]
    fn a_row_reads_as_one_line() {
        let row = IdleRow {
            brokers: 3,
            vnodes: 16,
            node: 2,
            cpu_percent: 7.94,
            rss_mib: 41.2,
            seconds: 30.01,
        };
        insta::assert_snapshot!(text_row(&row), @"broker 2 of 3, 16 vnodes: cpu 7.9% of a core, rss 41 MiB, over 30.0 s");
    }
}
