//! The progressive lockout as the broker applies it (ADR 0146, 0150,
//! 0154), one definition for the client port's logins (SCRAM and tokens)
//! and the admin port's bearer tokens: a (principal, source address) pair
//! the table delays or locks is refused without trying its credential
//! and without counting; a refused credential is counted in the ring's
//! group before the answer, so the delay holds on every broker and on
//! both ports; a success clears the pair's failures, if it had any.

use malachi_cluster::vnodes::VnodeHost;
use malachi_core::auth::lockout::{Admission, LockoutKey};
use malachi_core::model::{AuthView, Command, Outcome};
use tracing::warn;

use super::auth::AuthCtx;

/// A pair the lockout refuses to try now: why, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Throttled {
    pub message: String,
    pub retry_after_ms: u32,
}

/// The lockout's source for a peer: its IP without the port (so a
/// reconnect does not reset it), an IPv4 address mapped into IPv6 written
/// as IPv4, so both ports key one client alike.
pub(crate) fn lockout_source(ip: std::net::IpAddr) -> String {
    ip.to_canonical().to_string()
}

pub(crate) fn clamp_ms(ms: u64) -> u32 {
    u32::try_from(ms).unwrap_or(u32::MAX)
}

impl AuthCtx {
    /// Whether `key` may try now under `view`'s lockout table: whether it
    /// has failures to clear on success, or the refusal.
    pub(crate) fn admission(&self, view: &AuthView, key: &LockoutKey) -> Result<bool, Throttled> {
        let now_ms = self.now_ms();
        match view.lockout.check(&self.policy, key, now_ms) {
            Admission::Allowed => Ok(view.lockout.attempts(key).is_some()),
            Admission::Delayed { retry_at_ms } => {
                let wait = retry_at_ms.saturating_sub(now_ms);
                Err(Throttled {
                    message: format!(
                        "too many failed logins of this user from this address: try again in {wait} ms"
                    ),
                    retry_after_ms: clamp_ms(wait),
                })
            }
            Admission::Locked { until_ms } => {
                let wait = until_ms.saturating_sub(now_ms);
                Err(Throttled {
                    message: format!(
                        "this user is locked out from this address for {wait} ms after repeated failed logins, or until an admin unlocks it"
                    ),
                    retry_after_ms: clamp_ms(wait),
                })
            }
        }
    }

    /// Counts a failed attempt of `key` in the ring's group; answers the
    /// delay its next attempt must wait, if the count was recorded.
    pub(crate) async fn record_failure(&self, host: &VnodeHost, key: LockoutKey) -> Option<u32> {
        let at_ms = self.now_ms();
        let recorded = host
            .propose_admin(Command::RecordLoginFailure {
                key: key.clone(),
                policy: self.policy,
                at_ms,
            })
            .await;
        match recorded {
            Ok(Ok(Outcome::LoginFailureRecorded { retry_at_ms, .. })) => {
                Some(clamp_ms(retry_at_ms.saturating_sub(at_ms)))
            }
            other => {
                warn!(user = %key.principal, outcome = ?other, "a failed login was not counted");
                None
            }
        }
    }

    /// A success of `key`: its failures are cleared, if it had any (no
    /// raft write otherwise).
    pub(crate) async fn clear_failures(
        &self,
        host: &VnodeHost,
        key: LockoutKey,
        had_failures: bool,
    ) {
        if !had_failures {
            return;
        }
        let cleared = host
            .propose_admin(Command::RecordLoginSuccess { key: key.clone() })
            .await;
        if let Err(e) = cleared {
            warn!(user = %key.principal, error = %e, "a login's failures were not cleared");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_ipv4_peer_is_keyed_as_ipv4() {
        let mapped: std::net::IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let plain: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let six: std::net::IpAddr = "::1".parse().unwrap();
        assert_eq!(lockout_source(mapped), "127.0.0.1");
        assert_eq!(lockout_source(plain), "127.0.0.1");
        assert_eq!(lockout_source(six), "::1");
        assert_eq!(clamp_ms(u64::MAX), u32::MAX);
    }
}
