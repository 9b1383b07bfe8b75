//! The client's login (ADR 0150): after `api_versions`, on every
//! connection it opens (so after every reconnect), the client runs its
//! [`Authenticator`] through `sasl_handshake` and `sasl_authenticate`
//! (api keys 400, 401), or sends its bearer token ([`TokenLogin`]) in one
//! `token_authenticate` (402, ADR 0152). A refusal is final: [`ClientError::Authentication`]
//! names the broker and why, and the client does not try the same
//! credentials again.
//!
//! A session may end (ADR 0154): a token's at its `exp`, any when the
//! broker says so (`unauthorized` starting with a code of
//! [`crate::auth::SESSION_ENDED_CODES`]), after which the broker closes
//! the connection. The client opens no new request on a connection past
//! its session's end (`session_lifetime_ms` from the login's answer), and
//! a request refused `session-expired` is sent again on a new connection,
//! logged in afresh: a [`TokenLogin::from_file`] reads its file again
//! for that login, so a token renewed on disk is picked up.
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
    /// instead of SASL (ADR 0152), asked for at every login; `None` for a
    /// SASL mechanism, `Some(Err(why))` if the token cannot be had now.
    fn bearer_token(&self) -> Option<Result<String, String>> {
        None
    }
}

/// Where a [`TokenLogin`]'s token comes from.
enum TokenSource {
    /// Given once.
    Fixed(String),
    /// The first line of a file, read at every login.
    File(std::path::PathBuf),
}

/// A login with a bearer token (a JWT the issuer minted): a fixed one, or
/// the first line of a file read again at every login (a token agent
/// renews the file; the next connection uses the new token). Its `Debug`
/// never shows the token.
pub struct TokenLogin {
    source: TokenSource,
}

impl std::fmt::Debug for TokenLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("TokenLogin");
        if let TokenSource::File(path) = &self.source {
            d.field("file", path);
        }
        d.finish_non_exhaustive()
    }
}

impl TokenLogin {
    /// A login with `token` (surrounding whitespace trimmed).
    pub fn new(token: &str) -> TokenLogin {
        TokenLogin {
            source: TokenSource::Fixed(token.trim().to_owned()),
        }
    }

    /// A login with the first line of `path`, read at every login (so on
    /// every new connection, and after a session ended).
    pub fn from_file(path: impl Into<std::path::PathBuf>) -> TokenLogin {
        TokenLogin {
            source: TokenSource::File(path.into()),
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

    fn bearer_token(&self) -> Option<Result<String, String>> {
        Some(match &self.source {
            TokenSource::Fixed(token) => Ok(token.clone()),
            TokenSource::File(path) => read_token_file(path),
        })
    }
}

/// The first line of a token file, trimmed: at most
/// [`crate::auth::TOKEN_BYTES_MAX`] bytes are used, and an empty line is
/// refused.
pub fn read_token_file(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|file| {
            // A line ending (`\r\n`) past the longest token.
            file.take(crate::auth::TOKEN_BYTES_MAX as u64 + 2)
                .read_to_string(&mut text)
        })
        .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    let line = text.lines().next().unwrap_or_default().trim();
    if line.is_empty() {
        return Err(format!(
            "{}: the first line (the token) is empty",
            path.display()
        ));
    }
    Ok(line.to_owned())
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
    /// Logs `connection` in with the configured authenticator, if any;
    /// answers the session's lifetime, if the broker named one.
    pub(super) async fn login(
        &self,
        connection: &Connection,
        timeout_ms: u64,
    ) -> Result<Option<u64>, ClientError> {
        let Some(Login(authenticator)) = self.config().login.clone() else {
            return Ok(None);
        };
        let addr = connection.addr().to_owned();
        if let Some(token) = authenticator.bearer_token() {
            let token = token.map_err(|why| refused(&addr, why, None))?;
            let request = TokenAuthenticateRequest { token };
            let answer: TokenAuthenticateResponse = self
                .exchange_payload::<TokenAuthenticateRequest>(
                    connection,
                    request.encode()?,
                    timeout_ms,
                )
                .await
                .map_err(|e| as_refusal(&addr, e))?;
            return Ok(answer.session_lifetime_ms);
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
            let lifetime_ms = answer.session_lifetime_ms;
            let (back, next) = tokio::task::spawn_blocking(move || {
                let next = session.step(&answer.auth_bytes, complete);
                (session, next)
            })
            .await
            .map_err(|e| refused(&addr, format!("the login task failed: {e}"), None))?;
            session = back;
            match (next.map_err(|r| refused(&addr, r, None))?, complete) {
                (None, true) => return Ok(lifetime_ms),
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
