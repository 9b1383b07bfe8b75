//! The client's login (ADR 0150): after `api_versions`, on every
//! connection it opens (so after every reconnect), the client runs its
//! [`Authenticator`] through `sasl_handshake` and `sasl_authenticate`
//! (api keys 400, 401), or sends its bearer token ([`TokenLogin`]) in one
//! `token_authenticate` (402, ADR 0152). A refusal is final: [`ClientError::Authentication`]
//! names the broker and why, and the client does not try the same
//! credentials again.
//!
//! The mechanism itself is a seam: this crate knows the exchange's
//! framing, not SCRAM's arithmetic, which lives in `malachi-core`
//! (`auth::scram_client`); `malachi_actors::scram_login::ScramLogin`
//! adapts it. A session's steps may run PBKDF2, so they run on the
//! blocking pool.

use std::sync::Arc;

use super::connection::Connection;
use super::{Client, ClientError};
use crate::auth::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
    TokenAuthenticateRequest, TokenAuthenticateResponse,
};
use crate::error::ErrorCode;
use crate::messages::Message;

/// A login mechanism: starts one session per connection.
pub trait Authenticator: Send + Sync + std::fmt::Debug {
    /// The SASL mechanism's name (`SCRAM-SHA-256`).
    fn mechanism(&self) -> &str;
    /// A new session and its first message.
    fn start(&self) -> Result<(Box<dyn AuthSession>, String), String>;
    /// A bearer token to log in with through 402 `token_authenticate`
    /// instead of SASL (ADR 0152); `None` for a SASL mechanism.
    fn bearer_token(&self) -> Option<String> {
        None
    }
}

/// A login with a bearer token (a JWT the issuer minted), read once.
/// Its `Debug` never shows the token.
pub struct TokenLogin {
    token: String,
}

impl std::fmt::Debug for TokenLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenLogin").finish_non_exhaustive()
    }
}

impl TokenLogin {
    /// A login with `token` (surrounding whitespace trimmed).
    pub fn new(token: &str) -> TokenLogin {
        TokenLogin {
            token: token.trim().to_owned(),
        }
    }

    /// As the client's [`Login`].
    pub fn into_login(self) -> Login {
        Login(Arc::new(self))
    }
}

impl Authenticator for TokenLogin {
    fn mechanism(&self) -> &str {
        "token"
    }

    fn start(&self) -> Result<(Box<dyn AuthSession>, String), String> {
        Err("a token login has no SASL session".into())
    }

    fn bearer_token(&self) -> Option<String> {
        Some(self.token.clone())
    }
}

/// One login's client side.
pub trait AuthSession: Send {
    /// Takes the broker's message; answers the next message to send, or
    /// `None` once `complete` and the broker's last message verified.
    /// May run PBKDF2: called on the blocking pool.
    fn step(&mut self, server: &str, complete: bool) -> Result<Option<String>, String>;
}

/// The authenticator a client logs in with (compared by identity).
#[derive(Debug, Clone)]
pub struct Login(pub Arc<dyn Authenticator>);

impl PartialEq for Login {
    fn eq(&self, other: &Login) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Login {}

/// The most rounds one login may take (SCRAM takes 2).
const LOGIN_ROUNDS_MAX: usize = 8;

fn refused(addr: &str, reason: String, retry_after_ms: Option<u32>) -> ClientError {
    ClientError::Authentication {
        addr: addr.to_owned(),
        reason,
        retry_after_ms,
    }
}

/// A broker's refusal of a login step as the final error it is.
fn as_refusal(addr: &str, e: ClientError) -> ClientError {
    match e {
        ClientError::Server {
            code: ErrorCode::Unauthorized,
            message,
            retry_after_ms,
            ..
        } => refused(addr, message, retry_after_ms),
        other => other,
    }
}

impl Client {
    /// Logs `connection` in with the configured authenticator, if any.
    pub(super) async fn login(
        &self,
        connection: &Connection,
        timeout_ms: u64,
    ) -> Result<(), ClientError> {
        let Some(Login(authenticator)) = self.config().login.clone() else {
            return Ok(());
        };
        let addr = connection.addr().to_owned();
        if let Some(token) = authenticator.bearer_token() {
            let request = TokenAuthenticateRequest { token };
            let _answer: TokenAuthenticateResponse = self
                .exchange_payload::<TokenAuthenticateRequest>(
                    connection,
                    request.encode()?,
                    timeout_ms,
                )
                .await
                .map_err(|e| as_refusal(&addr, e))?;
            return Ok(());
        }
        let handshake = SaslHandshakeRequest {
            mechanism: authenticator.mechanism().to_owned(),
        };
        let answer: SaslHandshakeResponse = self
            .exchange_payload::<SaslHandshakeRequest>(connection, handshake.encode()?, timeout_ms)
            .await
            .map_err(|e| as_refusal(&addr, e))?;
        if !answer.accepted {
            let offered = if answer.mechanisms.is_empty() {
                "none: it does not authenticate clients".to_owned()
            } else {
                answer.mechanisms.join(", ")
            };
            return Err(refused(
                &addr,
                format!(
                    "the broker does not offer {} (it offers {offered})",
                    authenticator.mechanism()
                ),
                None,
            ));
        }
        let (mut session, mut message) =
            authenticator.start().map_err(|r| refused(&addr, r, None))?;
        for _ in 0..LOGIN_ROUNDS_MAX {
            let request = SaslAuthenticateRequest {
                auth_bytes: message,
            };
            let answer: SaslAuthenticateResponse = self
                .exchange_payload::<SaslAuthenticateRequest>(
                    connection,
                    request.encode()?,
                    timeout_ms,
                )
                .await
                .map_err(|e| as_refusal(&addr, e))?;
            let complete = answer.complete;
            let (back, next) = tokio::task::spawn_blocking(move || {
                let next = session.step(&answer.auth_bytes, complete);
                (session, next)
            })
            .await
            .map_err(|e| refused(&addr, format!("the login task failed: {e}"), None))?;
            session = back;
            match (next.map_err(|r| refused(&addr, r, None))?, complete) {
                (None, true) => return Ok(()),
                (Some(next), false) => message = next,
                _ => {
                    return Err(refused(
                        &addr,
                        "the broker's login exchange is out of step".into(),
                        None,
                    ));
                }
            }
        }
        Err(refused(
            &addr,
            "the login took too many rounds".into(),
            None,
        ))
    }
}
