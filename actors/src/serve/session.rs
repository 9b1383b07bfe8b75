//! How long a connection's login holds (ADR 0154), as the client port
//! applies the core's pure decision (`malachi_core::auth::session`).
//!
//! Every request that needs a login checks the session first
//! ([`ConnAuth::session_live`], from `ConnAuth::gate`), and so does a
//! subscription before each push: a token session ends once the broker's
//! clock passes the token's `exp` plus `security.token_clock_skew_ms`; a
//! SCRAM session ends once the broker's cached view of the users (no
//! older than `security.auth_view_max_age_ms`, no raft round trip per
//! request) no longer holds its user with the credential it proved, and a
//! token session once that view no longer holds the issuer key its token
//! verified under (ADR 0157: the key was removed, for any subject). A
//! certificate's session lasts the connection's life, and so does a
//! configured superuser's SCRAM session (its power is the configuration's,
//! and it must keep working while the ring group is unreachable, ADR
//! 0150). A view that cannot be read ends no session: the request goes
//! on to its own decision (an ACL decision needs the view and fails).
//!
//! An ended session refuses the request that found it, and every later
//! one, with `unauthorized` and a message starting with the ending's code
//! (`session-expired: ...`); nothing of them runs. The connection then
//! stops reading, writes the answers already due and closes: a client
//! logs in again on a new connection (no re-authentication on the same
//! one, `docs/protocol.md` §10.5).

use std::time::Duration;

use malachi_core::auth::session::{self, Basis, Ended, Store};
use tracing::{debug, warn};

use super::auth::ConnAuth;
use super::error::ServeError;

impl ConnAuth {
    /// Whether the connection's session still stands now; ends it if not.
    /// A connection not logged in has no session to end.
    pub async fn session_live(&self) -> Result<(), ServeError> {
        if let Some(ended) = self.ended.lock().clone() {
            return Err(ServeError::SessionEnded(ended));
        }
        let Some(session) = self.session() else {
            return Ok(());
        };
        let broker = self.broker();
        // A token session is checked whoever its subject is: its power is
        // the issuer key's, which may sign for a superuser too.
        let consulted = match (session.basis.user(), session.basis.kid()) {
            (Some(_), _) => !broker.is_superuser(&session.principal),
            (None, kid) => kid.is_some(),
        };
        let view = if consulted {
            match broker.cached_view().await {
                Ok(view) => Some(view),
                Err(e) => {
                    debug!(principal = %session.principal, error = %e, "the session's store was not checked");
                    None
                }
            }
        } else {
            None
        };
        let store = match (&view, session.basis.user(), session.basis.kid()) {
            (Some(view), Some(user), _) => Store::Holds(view.credential(user)),
            (Some(view), None, Some(kid)) => Store::Key(view.token_keys.get(kid)),
            _ => Store::Unread,
        };
        let now_ms = broker.now_ms();
        match session::judge(&session.basis, now_ms, broker.token.clock_skew_ms, store) {
            Ok(()) => Ok(()),
            Err(ended) => Err(self.end(ended)),
        }
    }

    /// Ends the session for `ended` (the first reason found stays):
    /// logged, counted, and the connection set to close after its
    /// answers.
    fn end(&self, ended: Ended) -> ServeError {
        let kept = {
            let mut held = self.ended.lock();
            if let Some(earlier) = held.as_ref() {
                return ServeError::SessionEnded(earlier.clone());
            }
            *held = Some(ended.clone());
            ended
        };
        let broker = self.broker();
        broker.metrics.session_ended(kept.code());
        warn!(
            principal = ?self.principal(),
            source = %self.source(),
            reason = kept.code(),
            message = %kept,
            "session ended; the connection closes after its answers"
        );
        self.closing.cancel();
        ServeError::SessionEnded(kept)
    }

    /// Whether the session ended (the connection is closing).
    pub fn closing(&self) -> &tokio_util::sync::CancellationToken {
        &self.closing
    }

    /// Resolves once the session may have ended by itself (a token's
    /// `exp` plus the skew, by the broker's clock), or once it ended for
    /// another reason; never for a session without an end. A waiter then
    /// asks [`ConnAuth::session_live`].
    pub async fn session_deadline(&self) {
        let broker = self.broker();
        let ends_at_ms = self
            .session()
            .and_then(|s| s.basis.ends_at_ms(broker.token.clock_skew_ms));
        let Some(ends_at_ms) = ends_at_ms else {
            return self.closing.cancelled().await;
        };
        // One millisecond past the end: the session holds through it.
        let wait_ms = ends_at_ms.saturating_add(1).saturating_sub(broker.now_ms());
        tokio::select! {
            _ = self.closing.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
        }
    }

    /// This connection replaced its own user's password: its session
    /// rests on the new credential from now on (other sessions of the
    /// user end at their next request).
    pub fn renew_password(&self, user: &str, stored_key: malachi_core::auth::scram::Key) {
        let mut held = self.session.lock();
        if let Some(session) = held.as_mut()
            && let Basis::Password { user: own, .. } = &session.basis
            && own == user
        {
            session.basis = Basis::Password {
                user: user.to_owned(),
                stored_key,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::reply::refusal_frame;

    /// The frame `docs/protocol.md` §10.5 shows, byte for byte.
    #[test]
    fn an_expired_sessions_refusal_is_the_documented_frame() {
        let ended = Ended::Expired {
            expires_at_ms: 1_800_003_600_000,
            now_ms: 1_800_003_660_001,
            skew_ms: 60_000,
        };
        let reply = refusal_frame(42, &ServeError::SessionEnded(ended));
        let parts = malachi_wire::frame::encode_response_parts(
            reply.correlation_id,
            reply.error_code,
            reply.control,
            reply.block,
            1 << 20,
        )
        .unwrap();
        let mut bytes = parts.head.to_vec();
        bytes.extend_from_slice(&parts.control);
        let message = "session-expired: the token expired at 1800003600000 ms (now 1800003660001 ms, skew 60000 ms); log in again with a fresh token on a new connection";
        let mut expected = vec![0x00, 0x00, 0x00, 0xbf, 0x00, 0x00, 0x00, 0x2a, 0x00, 0x1f];
        expected.extend_from_slice(b"\x83\xa7message\xd9\x91");
        expected.extend_from_slice(message.as_bytes());
        expected.extend_from_slice(b"\xableader_hint\xc0\xaeretry_after_ms\xc0");
        assert_eq!(bytes, expected);
        // The client tells it by the same code.
        assert_eq!(
            malachi_wire::auth::session_ended_code(message),
            Some(malachi_wire::auth::SESSION_EXPIRED)
        );
    }

    #[test]
    fn the_wire_knows_every_code_the_core_ends_a_session_with() {
        use malachi_core::auth::session::{
            CREDENTIAL_CHANGED, ISSUER_KEY_REMOVED, PRINCIPAL_REMOVED, SESSION_EXPIRED,
        };
        assert_eq!(
            malachi_wire::auth::SESSION_ENDED_CODES,
            [
                SESSION_EXPIRED,
                PRINCIPAL_REMOVED,
                CREDENTIAL_CHANGED,
                ISSUER_KEY_REMOVED
            ]
        );
    }
}
