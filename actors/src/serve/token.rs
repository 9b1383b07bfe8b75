//! Bearer tokens on the client port (ADR 0152): 402 `token_authenticate`
//! logs a connection in as its token's subject; 410 to 412 add, remove
//! and list the issuer keys tokens verify under, kept in the ring's group
//! beside users and ACL entries (ADR 0148).
//!
//! A token login reads the keys and the lockout table linearizably, like
//! a SCRAM login (a key added or a failure counted on another broker a
//! moment ago is seen). The lockout key is the token's claimed `sub`
//! (unverified, or `?token` if it names no valid user) and the peer's IP;
//! a refused token counts as a failed login in the ring's group before
//! the answer, exactly like a wrong password. Verification (`jsonwebtoken`
//! over aws-lc-rs) runs on the blocking pool. The session ends at the
//! token's `exp` plus the clock skew (ADR 0154, `session.rs`), or once
//! the issuer key it verified under is removed (ADR 0157).

use std::sync::Arc;

use malachi_core::auth::acl::Principal;
use malachi_core::auth::session::Basis;
use malachi_core::auth::token::{self, TokenAlgorithm, TokenError, TokenKey, VerifiedToken};
use malachi_core::model::{AuthView, Command, Outcome, validate_user_name};
use malachi_wire::auth::{TokenAuthenticateRequest, TokenAuthenticateResponse};
use malachi_wire::token_keys as wire;
use tracing::{info, warn};

use super::auth::{AuthCtx, ConnAuth, Session};
use super::error::ServeError;
use super::users::propose;

/// The lockout's principal for a token that names no valid user: `?` is
/// not a user name character, so it never collides with a user's pairs.
pub(crate) const UNNAMED_TOKEN_PRINCIPAL: &str = "?token";

/// Verifies `token` against `view`'s issuer keys on the blocking pool;
/// the subject must be a valid user name.
pub(crate) async fn verify_token(
    auth: &AuthCtx,
    view: Arc<AuthView>,
    token: String,
) -> Result<Result<(Principal, VerifiedToken), TokenError>, ServeError> {
    let policy = auth.token.clone();
    let now_ms = auth.now_ms();
    tokio::task::spawn_blocking(move || {
        let verified = token::verify(&token, |kid| view.token_keys.get(kid), &policy, now_ms)?;
        validate_user_name(&verified.subject)
            .map_err(|e| TokenError::InvalidSubject(e.to_string()))?;
        Ok((Principal::user(&verified.subject), verified))
    })
    .await
    .map_err(|e| ServeError::Internal {
        what: "verify a token",
        reason: e.to_string(),
    })
}

/// The lockout's principal for `token`.
pub(crate) fn lockout_name(token: &str) -> String {
    token::claimed_subject(token)
        .filter(|sub| validate_user_name(sub).is_ok())
        .unwrap_or_else(|| UNNAMED_TOKEN_PRINCIPAL.to_owned())
}

impl ConnAuth {
    /// 402 `token_authenticate`.
    pub async fn token_login(
        &self,
        req: TokenAuthenticateRequest,
    ) -> Result<TokenAuthenticateResponse, ServeError> {
        let broker = self.broker();
        if !broker.enabled {
            return Err(self.refuse(
                "this broker does not authenticate clients (security.authentication = \"none\")"
                    .into(),
                None,
            ));
        }
        if let Some(refused) = self.login_again() {
            return Err(refused);
        }
        let host = broker.host()?;
        let view = Arc::new(host.auth_view().await.map_err(ServeError::AdminStore)?);
        let key = self.key(&lockout_name(&req.token));
        let had_failures = self.admit(&view, &key)?;
        match verify_token(broker, view, req.token).await? {
            Ok((principal, verified)) => {
                // The session ends at `exp` plus the skew (ADR 0154); the
                // answer says how long until then.
                let basis = Basis::Token {
                    expires_at_ms: verified.expires_at_ms,
                    key: verified.key,
                };
                let lifetime_ms = basis
                    .ends_at_ms(broker.token.clock_skew_ms)
                    .unwrap_or(u64::MAX)
                    .saturating_sub(broker.now_ms());
                let session = Session {
                    principal: principal.clone(),
                    basis,
                };
                self.logged_in(&host, key, had_failures, session, "token")
                    .await;
                Ok(TokenAuthenticateResponse {
                    principal: principal.to_string(),
                    session_lifetime_ms: Some(lifetime_ms),
                })
            }
            Err(e) => {
                broker.metrics.token_logins_refused(e.code());
                warn!(user = %key.principal, source = %key.source, error = %e, "token login failed");
                Err(self.failed_with(&host, key, e.to_string()).await)
            }
        }
    }
}

fn key_text(key: &TokenKey) -> wire::TokenKeyText {
    wire::TokenKeyText {
        kid: key.kid.clone(),
        algorithm: key.algorithm.name().to_owned(),
        public_key_pem: key.public_key_pem.clone(),
        added_at_ms: key.added_at_ms,
    }
}

/// 410 `put_token_key`: the key must parse as a public key of its
/// algorithm, one this broker accepts (`security.token_algorithms`).
pub(crate) async fn put_token_key(
    conn: &ConnAuth,
    req: wire::PutTokenKeyRequest,
) -> Result<wire::PutTokenKeyResponse, ServeError> {
    let auth = conn.broker();
    let text = req.key;
    let algorithm = TokenAlgorithm::from_name(&text.algorithm)
        .filter(|a| auth.token.algorithms.contains(a))
        .ok_or_else(|| {
            ServeError::InvalidAdmin(format!(
                "algorithm {:?} is not one of this broker's security.token_algorithms",
                text.algorithm
            ))
        })?;
    let key = TokenKey {
        kid: text.kid,
        algorithm,
        public_key_pem: text.public_key_pem,
        added_at_ms: auth.now_ms(),
    };
    key.check()
        .map_err(|e| ServeError::InvalidAdmin(e.to_string()))?;
    let kid = key.kid.clone();
    let outcome = propose(auth, Command::AddTokenKey { key }).await?;
    info!(%kid, %algorithm, principal = ?conn.principal(), "token key added");
    Ok(wire::PutTokenKeyResponse {
        kid,
        changed: outcome != Outcome::Unchanged,
    })
}

/// 411 `delete_token_key`.
pub(crate) async fn delete_token_key(
    conn: &ConnAuth,
    req: wire::DeleteTokenKeyRequest,
) -> Result<wire::DeleteTokenKeyResponse, ServeError> {
    propose(
        conn.broker(),
        Command::RemoveTokenKey {
            kid: req.kid.clone(),
        },
    )
    .await?;
    info!(kid = %req.kid, principal = ?conn.principal(), "token key removed");
    Ok(wire::DeleteTokenKeyResponse { kid: req.kid })
}

/// 412 `list_token_keys`, read linearizably.
pub(crate) async fn list_token_keys(
    conn: &ConnAuth,
) -> Result<wire::ListTokenKeysResponse, ServeError> {
    let view = conn
        .broker()
        .host()?
        .auth_view()
        .await
        .map_err(ServeError::AdminStore)?;
    Ok(wire::ListTokenKeysResponse {
        keys: view.token_keys.values().map(key_text).collect(),
    })
}
