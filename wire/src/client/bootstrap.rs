//! Connecting through a list of bootstrap brokers, as Kafka's
//! `bootstrap.servers`: the addresses are tried in order within the call's
//! deadline, dead ones skipped, and once one answers the client learns the
//! cluster's brokers from it, so later reconnects can go to any live one.
//!
//! The deadline (`request_timeout_ms`) bounds the whole bootstrap, not each
//! address: every address gets an equal share of what is left, so a
//! black-holed first address cannot spend the time of the ones after it.

use std::time::Duration;

use tokio::time::Instant;
use tracing::debug;

use super::{Client, ClientError, DISCOVERY_TIMEOUT_MS, left_ms};

/// The bootstrap addresses as given: blank ones dropped, repeats kept once
/// (the first), at most `max`.
pub(super) fn bootstrap_list<I, S>(addrs: I, max: usize) -> Result<Vec<String>, ClientError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut list: Vec<String> = Vec::new();
    for addr in addrs {
        let addr: String = addr.into();
        let addr = addr.trim();
        if addr.is_empty() || list.iter().any(|a| a == addr) {
            continue;
        }
        if list.len() == max {
            // Counted to say how many were given; the list stays bounded.
            list.push(addr.to_owned());
            return Err(ClientError::TooManyBootstrapBrokers {
                given: list.len(),
                max,
            });
        }
        list.push(addr.to_owned());
    }
    if list.is_empty() {
        return Err(ClientError::NoAddress);
    }
    debug_assert!(list.len() <= max);
    Ok(list)
}

impl Client {
    /// Connects to the first of `bootstrap` that answers before `deadline`,
    /// and makes it the default broker. One address fails with its own
    /// error; several fail with [`ClientError::Unreachable`] naming each
    /// one tried.
    pub(super) async fn bootstrap(
        &self,
        bootstrap: &[String],
        deadline: Instant,
    ) -> Result<(), ClientError> {
        let mut tried: Vec<(String, ClientError)> = Vec::new();
        for (i, addr) in bootstrap.iter().enumerate() {
            let left = left_ms(deadline);
            if left == 0 {
                debug!(addr = %addr, "bootstrap deadline passed; not tried");
                break;
            }
            let remaining = u64::try_from(bootstrap.len() - i).unwrap_or(u64::MAX);
            let share = Duration::from_millis(left.div_ceil(remaining));
            let until = (Instant::now() + share).min(deadline);
            match self.connection_until(addr, until).await {
                Ok(_) => {
                    self.state().default_addr = addr.clone();
                    if self.inner.config.discover_on_connect {
                        self.discover_in_background(addr);
                    }
                    return Ok(());
                }
                // A refused login is final: the same credentials are not
                // tried on another broker (ADR 0150).
                Err(error @ ClientError::Authentication { .. }) => return Err(error),
                Err(error) => {
                    debug!(addr = %addr, %error, "bootstrap broker unreachable");
                    tried.push((addr.clone(), error));
                }
            }
        }
        if bootstrap.len() == 1
            && let Some((_, error)) = tried.pop()
        {
            return Err(error);
        }
        Err(ClientError::Unreachable { tried })
    }

    /// Learns the cluster's brokers from `addr` without holding up the
    /// caller: bounded by `DISCOVERY_TIMEOUT_MS`; a failure only means
    /// the client knows fewer brokers.
    fn discover_in_background(&self, addr: &str) {
        let client = self.clone();
        let addr = addr.to_owned();
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_millis(DISCOVERY_TIMEOUT_MS);
            client.discover(&addr, deadline).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(addrs: &[&str], max: usize) -> Result<Vec<String>, ClientError> {
        bootstrap_list(addrs.iter().copied(), max)
    }

    #[test]
    fn blank_addresses_are_dropped_and_repeats_kept_once_in_order() {
        let got = list(&["b:1", " ", "a:1 ", "b:1", ""], 4).unwrap();
        assert_eq!(got, ["b:1", "a:1"]);
    }

    #[test]
    fn no_address_and_too_many_addresses_are_refused() {
        assert!(matches!(list(&["", " "], 4), Err(ClientError::NoAddress)));
        let error = list(&["a:1", "b:1", "c:1"], 2).unwrap_err();
        assert!(
            matches!(
                error,
                ClientError::TooManyBootstrapBrokers { given: 3, max: 2 }
            ),
            "{error}"
        );
        assert_eq!(list(&["a:1", "a:1", "b:1"], 2).unwrap(), ["a:1", "b:1"]);
    }

    #[test]
    fn every_address_tried_is_named_once() {
        let refused = |addr: &str| ClientError::Connect {
            addr: addr.to_owned(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        let error = ClientError::Unreachable {
            tried: vec![
                ("a:1".into(), refused("a:1")),
                (
                    "b:1".into(),
                    ClientError::ConnectionClosed { addr: "b:1".into() },
                ),
                (
                    "c:1".into(),
                    ClientError::Cancelled {
                        api: "api_versions",
                    },
                ),
            ],
        };
        let text = error.to_string();
        assert_eq!(text.matches("a:1").count(), 1, "{text}");
        assert_eq!(text.matches("b:1").count(), 1, "{text}");
        assert!(text.contains("c:1: api_versions was cancelled"), "{text}");
    }
}
