//! Who an admin HTTP request comes from and whether it may run (ADR
//! 0152): a bearer token (`Authorization: Bearer <jwt>`) or the verified
//! client certificate's principal (mTLS, ADR 0149 §8), judged through the
//! client port's table (`serve::auth::need`) for the request the route
//! stands for, by the same ACLs and superusers.
//!
//! With `security.authentication = "none"` nothing is checked. Otherwise
//! a request without a credential, or with a token that does not verify,
//! is answered 401; one whose principal the ACLs refuse, 403; each with a
//! JSON body naming what was refused, counted
//! (`malachi_admin_requests_refused_total{status}`) and logged, and the
//! route's handler does not run. `/health` and `/ready` are never
//! guarded. Tokens verify against the cached view (never older than
//! `auth_view_max_age_ms`): a key added anywhere is used here within it.

use std::net::SocketAddr;

use axum::extract::connect_info::Connected;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::serve::IncomingStream;
use malachi_core::auth::acl::Principal;
use malachi_wire::messages::Request;
use serde_json::json;
use tracing::warn;

use super::AdminCtx;
use super::http::BoundedListener;
use super::stream::CertPrincipal;
use crate::serve::auth::{Need, need};
use crate::serve::error::ServeError;

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

/// A refusal as its JSON answer, counted and logged.
fn refused(
    admin: &AdminCtx,
    peer: &AdminPeer,
    status: StatusCode,
    what: &Request,
    reason: String,
) -> Response {
    let code = if status == StatusCode::UNAUTHORIZED {
        "unauthenticated"
    } else {
        "unauthorized"
    };
    admin
        .metrics
        .admin_request_refused(if status == StatusCode::UNAUTHORIZED {
            "401"
        } else {
            "403"
        });
    warn!(peer = %peer.addr, api = what.api_key().name(), %reason, "admin request refused");
    let body = json!({
        "error": code,
        "refused": what.api_key().name(),
        "message": reason,
    });
    let mut response = (status, axum::Json(body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
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
) -> Result<Principal, (StatusCode, String)> {
    let unauthenticated = |reason: String| (StatusCode::UNAUTHORIZED, reason);
    let Some(token) = bearer(headers).map_err(unauthenticated)? else {
        return peer.cert_principal().ok_or_else(|| {
            unauthenticated(
                "no credential: send `Authorization: Bearer <token>` or a client certificate"
                    .into(),
            )
        });
    };
    let view = admin.auth.cached_view().await.map_err(unavailable)?;
    let verified = crate::serve::token::verify_token(&admin.auth, view, token.to_owned())
        .await
        .map_err(unavailable)?;
    match verified {
        Ok((principal, _)) => Ok(principal),
        Err(e) => {
            admin.metrics.token_logins_refused(e.code());
            Err(unauthenticated(e.to_string()))
        }
    }
}

fn unavailable(e: ServeError) -> (StatusCode, String) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("{}: {e}", e.code().name()),
    )
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
    let principal = match principal(admin, peer, headers).await {
        Ok(principal) => principal,
        Err((status, reason)) if status == StatusCode::SERVICE_UNAVAILABLE => {
            return Err((status, format!("{reason}\n")).into_response());
        }
        Err((status, reason)) => return Err(refused(admin, peer, status, what, reason)),
    };
    let decided = match need(what) {
        Need::Open | Need::Login => Ok(()),
        Need::Acl(operation, resource) => {
            admin.auth.authorize(&principal, operation, resource).await
        }
    };
    match decided {
        Ok(()) => Ok(()),
        Err(ServeError::Unauthorized { message }) => {
            Err(refused(admin, peer, StatusCode::FORBIDDEN, what, message))
        }
        Err(e) => {
            let (status, reason) = unavailable(e);
            Err((status, format!("{reason}\n")).into_response())
        }
    }
}
