//! Brokers as processes, for the process-level tests of the root crate:
//! run the built `malachi` binary as a broker and as a client, on ports
//! chosen free by the test.

pub mod cli;
pub mod cluster;
pub use crate::copies;

/// The keyed sequences and the CLI's side of them, as the process tests
/// used them under one name.
pub mod keyed {
    pub use super::cli::{consume_all, json_lines, spawn_malachi, wait_output};
    pub use crate::keyed::{KeyedWriter, assert_keyed_sequences, keyed_line};
}

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

use crate::wait::wait_until_blocking;

/// The binary under test: `malachi` next to the test binary's `deps/`
/// folder, where cargo builds a package's binaries before its integration
/// tests (`CARGO_BIN_EXE_malachi` is only known to the test crate itself).
pub fn bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let test = std::env::current_exe().expect("the test binary's path");
        let profile = test
            .parent()
            .and_then(Path::parent)
            .expect("a test binary under target/<profile>/deps");
        let bin = profile.join(format!("malachi{}", std::env::consts::EXE_SUFFIX));
        assert!(
            bin.exists(),
            "{} is missing: run the tests through cargo, which builds it",
            bin.display()
        );
        bin
    })
}
/// How long a broker may take to print its serving line.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Ports handed to brokers come from below Linux's default ephemeral range
/// (32768-60999): a port the kernel picked for a `:0` bind (a broker's raft
/// listener, any client socket) is free again the moment it is released,
/// so the kernel could give it to another broker before the one it was
/// meant for binds it. Below that range only another test's pick collides.
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A loopback port free for TCP and UDP (SWIM shares the client port) at
/// the time of asking, outside the kernel's ephemeral range.
///
/// Ports are handed out in sequence from a per-process random start, so one
/// test process never hands out the same port twice (a port picked for a
/// broker that has not bound it yet looks free to a second, parallel
/// test). Picking each port by an independent hash did collide: with about
/// thirty brokers per test binary over 12,000 ports, one run in a few dozen
/// gave two brokers the same admin port (CI, `cli_end_to_end`).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let span = u64::from(TEST_PORTS.end - TEST_PORTS.start);
    let start = {
        static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        *START.get_or_init(|| {
            let seed = u64::from(std::process::id()).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
            (seed.wrapping_mul(0x94D0_49BB_1331_11EB) >> 32) % span
        })
    };
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = TEST_PORTS.start + ((start + n) % span) as u16;
        let tcp = TcpListener::bind(("127.0.0.1", port));
        let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {TEST_PORTS:?}");
}

/// A broker running as a child process.
#[derive(Debug)]
pub struct BrokerProcess {
    pub child: Child,
    pub client_addr: String,
    pub admin_addr: String,
    pub data_dir: PathBuf,
    stderr_log: PathBuf,
}

impl BrokerProcess {
    /// Start a broker on fresh free ports.
    pub fn start(data_dir: &Path) -> BrokerProcess {
        let client = format!("127.0.0.1:{}", free_port());
        let admin = format!("127.0.0.1:{}", free_port());
        BrokerProcess::start_on(data_dir, &client, &admin)
    }

    /// Start a broker on the given addresses and wait until it serves.
    pub fn start_on(data_dir: &Path, client_addr: &str, admin_addr: &str) -> BrokerProcess {
        BrokerProcess::start_logging(data_dir, client_addr, admin_addr, Some("warn"))
    }

    /// Start a broker on fresh free ports with the log levels a user gets
    /// (`RUST_LOG` unset).
    pub fn start_with_default_logs(data_dir: &Path) -> BrokerProcess {
        let client = format!("127.0.0.1:{}", free_port());
        let admin = format!("127.0.0.1:{}", free_port());
        BrokerProcess::start_logging(data_dir, &client, &admin, None)
    }

    fn start_logging(
        data_dir: &Path,
        client_addr: &str,
        admin_addr: &str,
        rust_log: Option<&str>,
    ) -> BrokerProcess {
        let stderr_log = data_dir.with_extension("broker.log");
        let mut command = Command::new(bin());
        command
            .args(["broker", "--node-id", "1", "--listen", client_addr])
            .args(["--admin-listen", admin_addr, "--data-dir"])
            .arg(data_dir);
        match rust_log {
            Some(levels) => command.env("RUST_LOG", levels),
            None => command.env_remove("RUST_LOG"),
        };
        let child = spawn_until_serving(command, &stderr_log, "the broker");
        BrokerProcess {
            child,
            client_addr: client_addr.to_owned(),
            admin_addr: admin_addr.to_owned(),
            data_dir: data_dir.to_owned(),
            stderr_log,
        }
    }

    /// SIGKILL: no shutdown of any kind.
    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then wait for the exit; returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) takes plain integers and touches no memory of ours;
        // the pid is our own child, not yet reaped, so it names that process.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill(SIGTERM) failed");
        let child = &mut self.child;
        wait_until_blocking(
            "the broker exits on SIGTERM",
            Duration::from_secs(30),
            Duration::from_millis(20),
            || child.try_wait().unwrap().ok_or("running"),
        )
        .code()
    }

    /// The broker's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `malachi ARGS` against `broker` (via MALACHI_BROKER), with stdin left
/// open for the test to write.
pub fn spawn_malachi(broker: &str, args: &[&str]) -> Child {
    Command::new(bin())
        .args(args)
        .env("MALACHI_BROKER", broker)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Run `malachi ARGS` with `stdin`, against `broker` (via MALACHI_BROKER).
pub fn malachi(broker: &str, args: &[&str], stdin: &str) -> Output {
    let mut child = spawn_malachi(broker, args);
    let written = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    // A command that fails before it reads its input (no broker to reach)
    // closes the pipe first: its exit and stderr are what a test checks.
    if let Err(e) = written {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    child.wait_with_output().unwrap()
}

/// stdout as text.
pub fn out(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// stderr as text.
pub fn err(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

/// Assert success, showing stderr otherwise.
pub fn ok(output: Output) -> Output {
    assert!(
        output.status.success(),
        "exit {:?}, stderr: {}",
        output.status.code(),
        err(&output)
    );
    output
}

/// Assert a clean failure: non-zero exit, exactly one line on stderr
/// starting with `malachi:`, and that line returned.
pub fn one_line_failure(output: &Output) -> String {
    assert!(!output.status.success(), "expected a failure, got success");
    assert_ne!(
        output.status.code(),
        Some(2),
        "a usage error: {}",
        err(output)
    );
    let stderr = err(output);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one stderr line, got: {stderr}");
    assert!(lines[0].starts_with("malachi: "), "{stderr}");
    lines[0].to_owned()
}

/// The lines of a child's stdout, read on a thread of their own so the
/// child never blocks on a full pipe.
pub fn lines_of(stdout: std::process::ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    rx
}

/// Spawns a broker command with stderr appended to `stderr_log` and waits
/// until it prints that it serves clients; panics with its log otherwise.
/// Stdout keeps being drained after the wait, so the broker never blocks on
/// a full pipe.
pub fn spawn_until_serving(mut command: Command, stderr_log: &Path, what: &str) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(stderr_log)
        .unwrap();
    let mut child = command
        .env_remove("MALACHI_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let rx = lines_of(child.stdout.take().unwrap());
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("serving clients on") => return child,
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                let log = std::fs::read_to_string(stderr_log).unwrap_or_default();
                panic!("{what} did not start within {START_TIMEOUT:?}; its log:\n{log}");
            }
        }
    }
}
