//! A metadata cluster of broker processes on loopback for the process-level
//! tests: three brokers sharing the default 16 vnodes, with short timers (a
//! config file sets them), and a wait until every vnode has a coordinator
//! running, so the first metadata request of a test does not race the
//! elections.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use super::{bin, free_port, malachi, out, spawn_until_serving};
use crate::wait::Wait;

/// The vnode count of a cluster with the default settings.
pub const VNODES_DEFAULT: u64 = 16;
/// How long elections and coordinator start-up may take: generous, because
/// the machine is shared and noisy.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// One broker of a test cluster, as a child process.
#[derive(Debug)]
pub struct ClusterNode {
    pub node_id: u64,
    pub client: String,
    pub admin: String,
    pub data_dir: PathBuf,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl ClusterNode {
    /// A broker of the cluster `nodes` with its files under `root`, not started.
    pub fn new(root: &Path, node_id: u64, nodes: &[u64]) -> ClusterNode {
        ClusterNode::with_cluster_settings(root, node_id, nodes, "")
    }

    /// Like `new`, with more lines for the `[cluster]` table (such as
    /// `vnodes = 2`).
    pub fn with_cluster_settings(
        root: &Path,
        node_id: u64,
        nodes: &[u64],
        cluster_lines: &str,
    ) -> ClusterNode {
        let config = root.join(format!("node-{node_id}.toml"));
        let list: Vec<String> = nodes.iter().map(u64::to_string).collect();
        std::fs::write(
            &config,
            format!(
                "[membership]\nprobe_period_ms = 200\nprobe_rtt_ms = 100\n\
                 suspect_timeout_ms = 2000\nseed_retry_ms = 200\n\
                 cluster_cookie = \"test-cookie\"\n\n\
                 [cluster]\nnodes = [{}]\ncoordinator_poll_ms = 200\n{cluster_lines}",
                list.join(", ")
            ),
        )
        .unwrap();
        ClusterNode {
            node_id,
            client: format!("127.0.0.1:{}", free_port()),
            admin: format!("127.0.0.1:{}", free_port()),
            data_dir: root.join(format!("node-{node_id}")),
            config,
            log: root.join(format!("node-{node_id}.log")),
            child: None,
        }
    }

    /// Starts (or restarts) the broker and waits until it serves.
    pub fn start(&mut self, seeds: &[String]) {
        let mut command = Command::new(bin());
        command
            .args(["broker", "--node-id", &self.node_id.to_string()])
            .args(["--listen", &self.client, "--admin-listen", &self.admin])
            .arg("--config")
            .arg(&self.config)
            .arg("--data-dir")
            .arg(&self.data_dir);
        for seed in seeds {
            command.args(["--seed", seed]);
        }
        command
            .env("RUST_LOG", "info")
            .env_remove("MALACHI_SEEDS")
            .env_remove("MALACHI_ATTRS");
        let what = format!("node {}", self.node_id);
        self.child = Some(spawn_until_serving(command, &self.log, &what));
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// SIGTERM (an ordered shutdown), and wait for the process to be gone.
    pub fn terminate(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = libc::pid_t::try_from(child.id()).unwrap();
            // SAFETY: kill(2) takes plain integers and touches no memory of
            // ours; the pid is our own child, not yet reaped.
            #[allow(unsafe_code)]
            let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
            assert_eq!(rc, 0, "kill(SIGTERM) failed");
            child.wait().unwrap();
        }
    }

    /// The client addresses of the other brokers, to start this one with.
    pub fn seeds_among(&self, clients: &[String]) -> Vec<String> {
        clients
            .iter()
            .filter(|c| **c != self.client)
            .cloned()
            .collect()
    }

    /// The broker's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Brokers 1, 2 and 3 of one metadata cluster, each given the others as
/// seeds. Dropping it kills them.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: Vec<ClusterNode>,
}

impl Cluster {
    /// Starts three brokers under `root` and waits until each of the 16
    /// vnodes runs a coordinator on exactly one of them.
    pub fn three_ready(root: &Path) -> Cluster {
        let cluster = Cluster::three(root);
        cluster.wait_for_coordinators(VNODES_DEFAULT);
        cluster
    }

    /// Starts three brokers under `root`, each serving its client port, and
    /// returns without waiting for elections.
    pub fn three(root: &Path) -> Cluster {
        Cluster::three_with(root, "")
    }

    /// `three`, with more lines for every broker's `[cluster]` table.
    pub fn three_with(root: &Path, cluster_lines: &str) -> Cluster {
        let ids = [1, 2, 3];
        let mut nodes: Vec<ClusterNode> = ids
            .iter()
            .map(|id| ClusterNode::with_cluster_settings(root, *id, &ids, cluster_lines))
            .collect();
        let clients: Vec<String> = nodes.iter().map(|n| n.client.clone()).collect();
        for node in &mut nodes {
            let seeds: Vec<String> = clients
                .iter()
                .filter(|c| **c != node.client)
                .cloned()
                .collect();
            node.start(&seeds);
        }
        Cluster { nodes }
    }

    /// The brokers' client addresses, in node id order.
    pub fn clients(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.client.clone()).collect()
    }

    /// Every broker's log, for a failure message.
    pub fn logs(&self) -> String {
        logs(&self.nodes)
    }

    /// Waits until `malachi tree` of the brokers, together, shows one
    /// `coordinator/V` actor for each of the `vnodes` vnodes: then every
    /// vnode has a leader that serves metadata commands.
    pub fn wait_for_coordinators(&self, vnodes: u64) {
        wait_for_coordinators(&self.nodes, vnodes);
    }
}

/// [`Cluster::wait_for_coordinators`] over brokers not held as a `Cluster`.
pub fn wait_for_coordinators(nodes: &[ClusterNode], vnodes: u64) {
    let what = format!("one coordinator runs for each of {vnodes} vnodes");
    Wait::new(what, READY_TIMEOUT, Duration::from_millis(100))
        .context(|| logs(nodes))
        .until_blocking(|| {
            let (running, count) = coordinators(nodes);
            if running.len() as u64 == vnodes && count == vnodes {
                Ok(())
            } else {
                Err(format!("{running:?} ({count} actors)"))
            }
        });
}

/// The vnodes whose `coordinator/V` actor `malachi tree` of the brokers
/// shows, and how many such actors run in all.
fn coordinators(nodes: &[ClusterNode]) -> (BTreeSet<u64>, u64) {
    let mut running = BTreeSet::new();
    let mut count = 0;
    for node in nodes {
        let output = malachi(&node.client, &["tree"], "");
        if !output.status.success() {
            continue;
        }
        for line in out(&output).lines() {
            if let Some(at) = line.find("coordinator/") {
                let rest = &line[at + "coordinator/".len()..];
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                if let Ok(vnode) = digits.parse::<u64>() {
                    running.insert(vnode);
                    count += 1;
                }
            }
        }
    }
    (running, count)
}

/// Every broker's log, for a failure message.
pub fn logs(nodes: &[ClusterNode]) -> String {
    nodes
        .iter()
        .map(|n| format!("--- node {} ---\n{}", n.node_id, n.log()))
        .collect::<Vec<_>>()
        .join("\n")
}
