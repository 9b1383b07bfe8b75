//! One `malachi broker` process started from a TOML config, for the CLI's
//! security tests (`cli_security`, `cli_token`, `cli_client_config`),
//! killed when dropped.

use std::path::Path;
use std::process::Command;

use malachi_testkit::process::{bin, free_port, spawn_until_serving};

pub struct Broker {
    pub child: std::process::Child,
    pub addr: String,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Node 1 on free loopback ports, its data under `dir/data`, `config`
/// written to `dir/broker.toml`; returns once it serves. `what` names it
/// in the failure when it does not start.
pub fn start_with_config(dir: &Path, config: &str, what: &str) -> Broker {
    let path = dir.join("broker.toml");
    std::fs::write(&path, config).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let mut command = Command::new(bin());
    command
        .args(["broker", "--node-id", "1", "--listen", &addr])
        .args(["--admin-listen", &admin, "--data-dir"])
        .arg(dir.join("data"))
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "warn");
    let child = spawn_until_serving(command, &dir.join("broker.log"), what);
    Broker { child, addr }
}
