//! Who an admin HTTP request comes from and whether it may run (ADR
//! 0152): a bearer token (`Authorization: Bearer <jwt>`) or the verified
//! client certificate's principal (mTLS, ADR 0149 §8), judged through the
//! client port's table (`serve::auth::need`) for the request the route
//! stands for, by the same ACLs and superusers.
//!
//! With `security.authentication = "none"` nothing is checked. Otherwise
//! a request without a credential, or with a token that does not verify,
//! is answered 401; one whose principal the ACLs refuse, 403; one whose
//! token's (claimed principal, source address) the lockout delays or
//! locks, 429 with the delay; each with a JSON body naming what was
//! refused, counted (`malachi_admin_requests_refused_total{status}`) and
//! logged, and the route's handler does not run. `/health` and `/ready`
//! are never guarded. Tokens verify against the cached view (never older
//! than `auth_view_max_age_ms`): a key added anywhere is used here within
//! it.
//!
//! A refused token is a failed login like one on the client port (ADR
//! 0154): `serve::lockout` checks its pair against the cached view's
//! lockout table before verifying it and counts the failure in the ring's
//! group before the 401, so bad tokens here raise the delay the client
//! port applies to the same name from the same address, and the reverse.

use std::net::SocketAddr;

use axum::extract::connect_info::Connected;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::serve::IncomingStream;
use malachi_core::auth::acl::Principal;
use malachi_core::auth::lockout::LockoutKey;
use malachi_wire::messages::Request;
use serde_json::json;
use tracing::warn;

use super::AdminCtx;
use super::http::BoundedListener;
use super::stream::CertPrincipal;
use crate::serve::auth::{Need, need};
use crate::serve::error::ServeError;
use crate::serve::lockout::{Throttled, lockout_source};
use crate::serve::token::{lockout_name, verify_token};

/// The longest `Authorization` header value read, in bytes.
const AUTHORIZATION_BYTES_MAX: usize = malachi_core::auth::token::TOKEN_BYTES_MAX + 16;

/// An admin connection's peer: its address and its certificate's
/// principal (once the TLS handshake is done).
#[derive(Debug, Clone)]
pub(crate) struct AdminPeer {
    pub addr: SocketAddr,
    cert_principal: CertPrincipal,
}

impl Connected<IncomingStream<'_, BoundedListener>> for AdminPeer {
    fn connect_info(stream: IncomingStream<'_, BoundedListener>) -> AdminPeer {
        AdminPeer {
            addr: *stream.remote_addr(),
            cert_principal: stream.io().cert_principal(),
        }
    }
}

impl AdminPeer {
    fn cert_principal(&self) -> Option<Principal> {
        self.cert_principal
            .get()
            .and_then(Option::as_deref)
            .map(Principal::user)
    }
}

/// Why an admin request may not run.
#[derive(Debug)]
enum Denied {
    /// 401: no credential, or a token that does not verify (with the
    /// delay the lockout now puts on the token's next attempt).
    Unauthenticated {
        reason: String,
        retry_after_ms: Option<u32>,
    },
    /// 403: the ACLs refuse the principal.
    Forbidden(String),
    /// 429: the lockout delays or locks the token's pair; not tried.
    Throttled(Throttled),
    /// 503: the users, keys or lockout could not be read.
    Unavailable(String),
}

fn unauthenticated(reason: String) -> Denied {
    Denied::Unauthenticated {
        reason,
        retry_after_ms: None,
    }
}

/// A refusal as its answer: JSON naming what was refused, counted and
/// logged (a 503 is plain text, not counted: nothing was judged).
fn refused(admin: &AdminCtx, peer: &AdminPeer, what: &Request, denied: Denied) -> Response {
    let (status, code, reason, retry_after_ms) = match denied {
        Denied::Unavailable(reason) => {
            return (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response();
        }
        Denied::Unauthenticated {
            reason,
            retry_after_ms,
        } => (
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            reason,
            retry_after_ms,
        ),
        Denied::Forbidden(reason) => (StatusCode::FORBIDDEN, "unauthorized", reason, None),
        Denied::Throttled(t) => (
            StatusCode::TOO_MANY_REQUESTS,
            "throttled",
            format!("authentication failed: {}", t.message),
            Some(t.retry_after_ms),
        ),
    };
    admin.metrics.admin_request_refused(match status {
        StatusCode::UNAUTHORIZED => "401",
        StatusCode::TOO_MANY_REQUESTS => "429",
        _ => "403",
    });
    warn!(peer = %peer.addr, api = what.api_key().name(), %status, %reason, "admin request refused");
    let mut body = json!({
        "error": code,
        "refused": what.api_key().name(),
        "message": reason,
    });
    if let Some(ms) = retry_after_ms {
        body["retry_after_ms"] = json!(ms);
    }
    let mut response = (status, axum::Json(body)).into_response();
    let headers = response.headers_mut();
    if status == StatusCode::UNAUTHORIZED {
        headers.insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    if status == StatusCode::TOO_MANY_REQUESTS
        && let Some(ms) = retry_after_ms
    {
        // Whole seconds, rounded up (RFC 9110 §10.2.3).
        headers.insert(
            header::RETRY_AFTER,
            header::HeaderValue::from(ms.div_ceil(1000)),
        );
    }
    response
}

/// The bearer token of `headers`, if it sends one.
fn bearer(headers: &HeaderMap) -> Result<Option<&str>, String> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    if value.len() > AUTHORIZATION_BYTES_MAX {
        return Err("the Authorization header is too long".into());
    }
    let text = value
        .to_str()
        .map_err(|_| "the Authorization header is not text".to_owned())?;
    match text.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => Ok(Some(token.trim())),
        _ => Err("the Authorization header is not `Bearer <token>`".into()),
    }
}

/// Who sends the request: a token's subject, else the certificate's.
async fn principal(
    admin: &AdminCtx,
    peer: &AdminPeer,
    headers: &HeaderMap,
) -> Result<Principal, Denied> {
    let Some(token) = bearer(headers).map_err(unauthenticated)? else {
        return peer.cert_principal().ok_or_else(|| {
            unauthenticated(
                "no credential: send `Authorization: Bearer <token>` or a client certificate"
                    .into(),
            )
        });
    };
    token_principal(admin, peer, token).await
}

/// A bearer token's principal, judged like a token login on the client
/// port: the lockout first, a refusal counted before the answer.
async fn token_principal(
    admin: &AdminCtx,
    peer: &AdminPeer,
    token: &str,
) -> Result<Principal, Denied> {
    let auth = &admin.auth;
    let view = auth.cached_view().await.map_err(unavailable)?;
    let key = LockoutKey {
        principal: lockout_name(token),
        source: lockout_source(peer.addr.ip()),
    };
    let had_failures = auth.admission(&view, &key).map_err(Denied::Throttled)?;
    let verified = verify_token(auth, view, token.to_owned())
        .await
        .map_err(unavailable)?;
    let host = auth.host().map_err(unavailable)?;
    match verified {
        Ok((principal, _)) => {
            if had_failures {
                auth.clear_failures(&host, key, true).await;
                auth.invalidate().await;
            }
            Ok(principal)
        }
        Err(e) => {
            admin.metrics.token_logins_refused(e.code());
            let retry_after_ms = auth.record_failure(&host, key).await;
            // This port's next check sees the count at once.
            auth.invalidate().await;
            Err(Denied::Unauthenticated {
                reason: e.to_string(),
                retry_after_ms,
            })
        }
    }
}

fn unavailable(e: ServeError) -> Denied {
    Denied::Unavailable(format!("{}: {e}", e.code().name()))
}

/// Whether the request the route stands for (`what`) may run for this
/// caller; the answer to send instead if not.
pub(crate) async fn guard(
    admin: &AdminCtx,
    peer: &AdminPeer,
    headers: &HeaderMap,
    what: &Request,
) -> Result<(), Response> {
    if !admin.auth.enabled {
        return Ok(());
    }
    let decided = match principal(admin, peer, headers).await {
        Ok(principal) => match need(what) {
            Need::Open | Need::Login => Ok(()),
            Need::Acl(operation, resource) => admin
                .auth
                .authorize(&principal, operation, resource)
                .await
                .map_err(|e| match e {
                    ServeError::Unauthorized { message } => Denied::Forbidden(message),
                    other => unavailable(other),
                }),
        },
        Err(denied) => Err(denied),
    };
    decided.map_err(|denied| refused(admin, peer, what, denied))
}
