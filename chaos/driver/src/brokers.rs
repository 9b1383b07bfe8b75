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

use malachi_wire::{Client, ClientConfig, ClientError};

/// The brokers' client addresses and the client limits every task uses.
#[derive(Debug, Clone)]
pub struct Brokers {
    addrs: Vec<String>,
    config: ClientConfig,
}

/// How long a task keeps trying to open a client before it reports the
/// cluster unreachable (it keeps trying after that, the report is a log).
const CONNECT_PAUSE_MS: u64 = 200;

impl Brokers {
    pub fn new(addrs: Vec<String>, request_timeout_ms: u64) -> Brokers {
        assert!(!addrs.is_empty(), "at least one broker");
        let config = ClientConfig {
            client_name: concat!("malachi-chaos-driver/", env!("CARGO_PKG_VERSION")).to_owned(),
            request_timeout_ms,
            // A partitioned broker drops the SYN: give up on it quickly.
            connect_timeout_ms: request_timeout_ms.min(2_000),
            retries_max: 3,
            backoff_initial_ms: 50,
            backoff_max_ms: 500,
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
