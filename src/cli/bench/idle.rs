//! `malachi bench idle`: what a cluster with no traffic costs, broker by
//! broker (issue 18). It starts the brokers itself, as `bench compare`
//! does, waits until they see each other and lets elections settle, then
//! reads each broker's CPU time and resident memory from `/proc` at the
//! start and end of the sampling window. The idle cost of raft groups
//! (heartbeats, lease renewals, ticks) is what it shows; nothing is
//! asserted here: the targets live in docs/benchmarks.md.

use std::time::Instant;

use malachi_bench::peers::ServerGuard;
use serde::Serialize;

use super::super::error::CliError;
use super::super::{BenchIdleArgs, OutputArgs};
use super::compare::{start_cluster, wait_for_brokers};

/// The most brokers one run starts.
const IDLE_BROKERS_MAX: u64 = 16;
/// The most vnodes one run asks for.
const IDLE_VNODES_MAX: u32 = 65_536;

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
    let config = idle_config(args.brokers, args.vnodes);
    let guards = start_cluster(&exe, args.brokers, &config, |id| {
        tempfile::Builder::new()
            .prefix(&format!("malachi-idle-{id}-"))
            .tempdir()
            .map_err(|e| CliError::Bench(format!("cannot create a directory: {e}")))
    })
    .await?;
    let guards: Vec<(u64, ServerGuard)> = (1..=args.brokers).zip(guards).collect();
    let output = OutputArgs {
        broker: guards
            .first()
            .map(|(_, g)| g.addr.to_string())
            .unwrap_or_default(),
        json: true,
        timeout_ms: 10_000,
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
    drop(guards);
    for row in &rows {
        if args.json {
            let line = serde_json::to_string(row)
                .map_err(|e| CliError::Bench(format!("cannot encode a row: {e}")))?;
            println!("{line}");
        } else {
            println!("{}", text_row(row));
        }
    }
    Ok(())
}

/// Each broker's config: one cluster of `brokers` with `vnodes` vnodes.
pub fn idle_config(brokers: u64, vnodes: u32) -> String {
    let nodes: Vec<String> = (1..=brokers).map(|n| n.to_string()).collect();
    format!(
        "# written by malachi bench idle\n[membership]\ncluster_cookie = \"malachi-bench-idle\"\n\n[cluster]\nnodes = [{}]\nvnodes = {vnodes}\n",
        nodes.join(", ")
    )
}

fn text_row(row: &IdleRow) -> String {
    format!(
        "broker {} of {}, {} vnodes: cpu {:.1}% of a core, rss {:.0} MiB, over {:.1} s",
        row.node, row.brokers, row.vnodes, row.cpu_percent, row.rss_mib, row.seconds
    )
}

/// A process's CPU time so far (user and system), in clock ticks, from
/// `/proc/PID/stat`; `None` when it cannot be read.
fn cpu_ticks(pid: u32) -> Option<u64> {
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
