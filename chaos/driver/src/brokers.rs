//! Reaching the cluster: one client per task, bootstrapped from the broker
//! list rotated so that each new client starts at another broker.
//!
//! The wire client follows `not_leader` hints and, on a refused connection,
//! moves to the next bootstrap broker by itself. What it does not do is
//! leave a broker whose requests time out (a paused or partitioned one:
//! the connection stays open and nothing answers), and it remembers a
//! topic's hinted owner. So a task that gives up on a request (a client
//! timeout, a connection lost, a `not_leader` without a hint, its retries
//! spent) drops its client and opens a new one a broker further on: the
//! rotation the driver promises.

use std::time::{Duration, Instant};

use std::path::Path;

use malachi_actors::scram_login::ScramLogin;
use malachi_wire::{Client, ClientConfig, ClientError};

use crate::error::DriverError;

/// The brokers' client addresses and the client limits every task uses.
#[derive(Debug, Clone)]
pub struct Brokers {
    addrs: Vec<String>,
    config: ClientConfig,
}

/// How long a task keeps trying to open a client before it reports the
/// cluster unreachable (it keeps trying after that, the report is a log).
const CONNECT_PAUSE_MS: u64 = 200;

/// TLS and a login for every client (`chaos/run --secure`), or neither.
#[derive(Debug, Clone, Default)]
pub struct Security {
    tls: Option<malachi_wire::tls::ClientTls>,
    login: Option<malachi_wire::client::Login>,
}

impl Security {
    /// TLS when a CA is given; a SCRAM login when a user is (with the
    /// first line of its password file).
    pub fn from_files(
        ca: Option<&Path>,
        user: Option<&str>,
        password_file: Option<&Path>,
    ) -> Result<Security, DriverError> {
        let tls = match ca {
            Some(ca) => Some(
                malachi_wire::tls::ClientTls::from_files(&malachi_wire::tls::ClientTlsFiles {
                    ca_path: ca.to_owned(),
                    cert_path: None,
                    key_path: None,
                    server_name: None,
                })
                .map_err(|e| DriverError::Credentials {
                    path: ca.to_owned(),
                    what: "the CA",
                    reason: e.to_string(),
                })?,
            ),
            None => None,
        };
        let login = match (user, password_file) {
            (Some(user), Some(file)) => {
                let fail = |reason: String| DriverError::Credentials {
                    path: file.to_owned(),
                    what: "the password file",
                    reason,
                };
                let text = std::fs::read_to_string(file).map_err(|e| fail(e.to_string()))?;
                let password = text.lines().next().unwrap_or_default();
                if password.is_empty() {
                    return Err(fail("the first line is empty".into()));
                }
                Some(ScramLogin::new(user, password.as_bytes()).into_login())
            }
            _ => None,
        };
        Ok(Security { tls, login })
    }
}

impl Brokers {
    pub fn new(addrs: Vec<String>, request_timeout_ms: u64, security: Security) -> Brokers {
        assert!(!addrs.is_empty(), "at least one broker");
        let config = ClientConfig {
            client_name: concat!("malachi-chaos-driver/", env!("CARGO_PKG_VERSION")).to_owned(),
            request_timeout_ms,
            // A partitioned broker drops the SYN: give up on it quickly.
            connect_timeout_ms: request_timeout_ms.min(2_000),
            retries_max: 3,
            backoff_initial_ms: 50,
            backoff_max_ms: 500,
            tls: security.tls,
            login: security.login,
            ..ClientConfig::default()
        };
        Brokers { addrs, config }
    }

    /// The same limits with `addr` as the only broker: a client of it
    /// always starts there (a pinned final reader), and does not ask it
    /// for the cluster's brokers on connect, so it goes elsewhere only
    /// where the broker's answers send it.
    pub fn only(&self, addr: &str) -> Brokers {
        Brokers {
            addrs: vec![addr.to_owned()],
            config: ClientConfig {
                discover_on_connect: false,
                ..self.config.clone()
            },
        }
    }

    /// Every broker's address, in the order given.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// The broker list starting at `rotation` (mod its length).
    pub fn rotated(&self, rotation: usize) -> Vec<String> {
        let n = self.addrs.len();
        (0..n)
            .map(|i| self.addrs[(rotation + i) % n].clone())
            .collect()
    }

    /// One client, bootstrapped at broker `rotation` first.
    pub async fn connect(&self, rotation: usize) -> Result<Client, ClientError> {
        Client::connect_with(self.rotated(rotation), self.config.clone()).await
    }

    /// Keeps trying `connect`, one rotation further each time, until it
    /// succeeds or `stop` says so; `None` when stopped.
    pub async fn connect_until(
        &self,
        rotation: &mut usize,
        stop: &tokio::sync::watch::Receiver<bool>,
        component: &str,
    ) -> Option<Client> {
        let started = Instant::now();
        let mut warned = false;
        loop {
            if *stop.borrow() {
                return None;
            }
            match self.connect(*rotation).await {
                Ok(client) => return Some(client),
                Err(error) => {
                    *rotation = rotation.wrapping_add(1);
                    if !warned && started.elapsed() > Duration::from_secs(10) {
                        eprintln!(
                            "chaos-driver: {component}: no broker reachable for 10s: {error}"
                        );
                        warned = true;
                    }
                    tokio::time::sleep(Duration::from_millis(CONNECT_PAUSE_MS)).await;
                }
            }
        }
    }
}
