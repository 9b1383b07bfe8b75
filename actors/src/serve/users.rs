//! User and ACL administration over the client port, api keys 403 to 409
//! (ADR 0150), kept in the ring's group (ADR 0148), and the bootstrap
//! user a broker creates at start.
//!
//! A credential arrives already derived (the client ran PBKDF2): the
//! broker checks its bounds and proposes it; no password reaches the
//! broker for these keys. The bootstrap user's password is read from a
//! file and derived here, on the blocking pool.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use malachi_core::auth::acl::{
    AclEntry, NamePattern, Operation, Permission, Principal, PrincipalPattern, ResourcePattern,
};
use malachi_core::auth::scram::{KEY_BYTES, StoredCredential};
use malachi_core::model::{Command, ModelError, Outcome};
use malachi_wire::auth_admin as wire;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::auth::{AuthCtx, ConnAuth, derive_credential};
use super::error::ServeError;

/// How long the bootstrap waits between attempts while the ring's group
/// or the `admin_store` feature is not ready.
const BOOTSTRAP_RETRY_MS: u64 = 250;
/// The longest bootstrap password file read, in bytes.
const PASSWORD_FILE_BYTES_MAX: u64 = 4096;

fn decode_key(field: &str, text: &str) -> Result<[u8; KEY_BYTES], ServeError> {
    let bytes = STANDARD
        .decode(text)
        .map_err(|e| ServeError::InvalidAdmin(format!("{field} is not base64: {e}")))?;
    bytes
        .try_into()
        .map_err(|_| ServeError::InvalidAdmin(format!("{field} must be {KEY_BYTES} bytes")))
}

fn credential_of(text: &wire::UserCredential) -> Result<StoredCredential, ServeError> {
    let salt = STANDARD
        .decode(&text.salt)
        .map_err(|e| ServeError::InvalidAdmin(format!("salt is not base64: {e}")))?;
    Ok(StoredCredential {
        salt,
        iterations: text.iterations,
        stored_key: decode_key("stored_key", &text.stored_key)?,
        server_key: decode_key("server_key", &text.server_key)?,
    })
}

/// A change proposed to the ring's group; the cached view is dropped so
/// this broker's next decision sees it.
pub(super) async fn propose(auth: &AuthCtx, cmd: Command) -> Result<Outcome, ServeError> {
    let host = auth.host()?;
    let outcome = host
        .propose_admin(cmd)
        .await
        .map_err(ServeError::AdminStore)?;
    auth.invalidate().await;
    match outcome {
        Ok(outcome) => Ok(outcome),
        Err(refused) => Err(ServeError::AdminRefused(refused)),
    }
}

/// 403 `put_user`. A user may replace its own credential (`passwd`); any
/// other change needs `alter` on the cluster (checked by the gate).
pub(crate) async fn put_user(
    conn: &ConnAuth,
    req: wire::PutUserRequest,
) -> Result<wire::PutUserResponse, ServeError> {
    let auth = conn.broker();
    if req.replace && auth.enabled {
        let own = conn.principal().is_some_and(|p| p.name == req.name);
        if !own {
            let principal = conn
                .principal()
                .ok_or(ServeError::NotAuthenticated { api: "put_user" })?;
            auth.authorize(
                &principal,
                Operation::Alter,
                malachi_core::auth::acl::Resource::Cluster,
            )
            .await?;
        }
    }
    let credential = credential_of(&req.credential)?;
    let stored_key = credential.stored_key;
    let outcome = propose(
        auth,
        Command::PutUser {
            name: req.name.clone(),
            credential,
            replace: req.replace,
            at_ms: auth.now_ms(),
        },
    )
    .await?;
    // A password changed through this connection leaves its own session
    // standing; the user's other sessions end (ADR 0154).
    if req.replace {
        conn.renew_password(&req.name, stored_key);
    }
    info!(user = %req.name, replace = req.replace, principal = ?conn.principal(), "user stored");
    Ok(wire::PutUserResponse {
        name: req.name,
        changed: outcome != Outcome::Unchanged,
    })
}

/// 404 `delete_user`.
pub(crate) async fn delete_user(
    conn: &ConnAuth,
    req: wire::DeleteUserRequest,
) -> Result<wire::DeleteUserResponse, ServeError> {
    propose(
        conn.broker(),
        Command::DeleteUser {
            name: req.name.clone(),
        },
    )
    .await?;
    info!(user = %req.name, principal = ?conn.principal(), "user deleted");
    Ok(wire::DeleteUserResponse { name: req.name })
}

/// 405 `list_users`, read linearizably.
pub(crate) async fn list_users(conn: &ConnAuth) -> Result<wire::ListUsersResponse, ServeError> {
    let auth = conn.broker();
    let view = auth
        .host()?
        .auth_view()
        .await
        .map_err(ServeError::AdminStore)?;
    let now_ms = auth.now_ms();
    let users = view
        .users
        .iter()
        .map(|(name, user)| wire::UserSummary {
            name: name.clone(),
            iterations: user.credential.iterations,
            created_at_ms: user.created_at_ms,
            updated_at_ms: user.updated_at_ms,
            locked_sources: view.lockout.locked_sources(name, now_ms),
        })
        .collect();
    Ok(wire::ListUsersResponse { users })
}

/// 409 `unlock_user`.
pub(crate) async fn unlock_user(
    conn: &ConnAuth,
    req: wire::UnlockUserRequest,
) -> Result<wire::UnlockUserResponse, ServeError> {
    propose(
        conn.broker(),
        Command::UnlockUser {
            name: req.name.clone(),
        },
    )
    .await?;
    info!(user = %req.name, principal = ?conn.principal(), "user unlocked");
    Ok(wire::UnlockUserResponse { name: req.name })
}

/// The entry a text form names.
pub(crate) fn entry_of(text: &wire::AclEntryText) -> Result<AclEntry, ServeError> {
    let bad = |what: String| ServeError::InvalidAdmin(what);
    let principal = if text.principal == "User:*" {
        PrincipalPattern::AnyUser
    } else {
        PrincipalPattern::User(
            Principal::parse(&text.principal).map_err(|e| bad(format!("principal: {e}")))?,
        )
    };
    let pattern = |name: &str| match text.pattern.as_str() {
        "literal" => Ok(NamePattern::Literal(name.to_owned())),
        "prefixed" => Ok(NamePattern::Prefixed(name.to_owned())),
        other => Err(bad(format!(
            "pattern {other:?}: expected `literal` or `prefixed`"
        ))),
    };
    let resource = match text.resource.as_str() {
        "topic" => ResourcePattern::Topic(pattern(&text.name)?),
        "group" => ResourcePattern::Group(pattern(&text.name)?),
        "cluster" if text.name.is_empty() => ResourcePattern::Cluster,
        "cluster" => return Err(bad("the cluster resource takes no name".into())),
        other => {
            return Err(bad(format!(
                "resource {other:?}: expected `topic`, `group` or `cluster`"
            )));
        }
    };
    let operation = Operation::ALL
        .into_iter()
        .find(|op| op.name() == text.operation)
        .ok_or_else(|| bad(format!("operation {:?} is not one of produce, consume, create, delete, describe, alter, admin", text.operation)))?;
    let permission = match text.permission.as_str() {
        "allow" => Permission::Allow,
        "deny" => Permission::Deny,
        other => {
            return Err(bad(format!(
                "permission {other:?}: expected `allow` or `deny`"
            )));
        }
    };
    let entry = AclEntry {
        principal,
        resource,
        operation,
        permission,
    };
    entry.check().map_err(|e| bad(e.to_string()))?;
    Ok(entry)
}

/// The text form of an entry.
pub(crate) fn text_of(entry: &AclEntry) -> wire::AclEntryText {
    let principal = match &entry.principal {
        PrincipalPattern::AnyUser => "User:*".to_owned(),
        PrincipalPattern::User(p) => p.to_string(),
    };
    let named = |kind: &str, p: &NamePattern| match p {
        NamePattern::Literal(n) => (kind.to_owned(), "literal".to_owned(), n.clone()),
        NamePattern::Prefixed(n) => (kind.to_owned(), "prefixed".to_owned(), n.clone()),
    };
    let (resource, pattern, name) = match &entry.resource {
        ResourcePattern::Topic(p) => named("topic", p),
        ResourcePattern::Group(p) => named("group", p),
        ResourcePattern::Cluster => ("cluster".to_owned(), String::new(), String::new()),
    };
    wire::AclEntryText {
        principal,
        resource,
        pattern,
        name,
        operation: entry.operation.name().to_owned(),
        permission: match entry.permission {
            Permission::Allow => "allow".to_owned(),
            Permission::Deny => "deny".to_owned(),
        },
    }
}

/// 406 `add_acl` and 407 `remove_acl`.
pub(crate) async fn change_acl(
    conn: &ConnAuth,
    entry: &wire::AclEntryText,
    add: bool,
) -> Result<wire::AclChangeResponse, ServeError> {
    let parsed = entry_of(entry)?;
    let cmd = if add {
        Command::AddAcl { entry: parsed }
    } else {
        Command::RemoveAcl { entry: parsed }
    };
    let outcome = propose(conn.broker(), cmd).await?;
    info!(?entry, add, principal = ?conn.principal(), "acl changed");
    Ok(wire::AclChangeResponse {
        changed: outcome != Outcome::Unchanged,
    })
}

/// 408 `list_acls`, read linearizably.
pub(crate) async fn list_acls(
    conn: &ConnAuth,
    req: wire::ListAclsRequest,
) -> Result<wire::ListAclsResponse, ServeError> {
    let view = conn
        .broker()
        .host()?
        .auth_view()
        .await
        .map_err(ServeError::AdminStore)?;
    let entries = view
        .acls
        .iter()
        .map(text_of)
        .filter(|e| req.principal.as_ref().is_none_or(|p| &e.principal == p))
        .collect();
    Ok(wire::ListAclsResponse { entries })
}

/// Creates `name` with the password in `password_file` unless it exists,
/// retrying while the ring's group or the `admin_store` feature is not
/// ready, until done or `cancel`.
pub(crate) async fn bootstrap_user(
    auth: Arc<AuthCtx>,
    name: String,
    password_file: PathBuf,
    cancel: CancellationToken,
) {
    let password = match read_password(&password_file) {
        Ok(password) => password,
        Err(reason) => {
            warn!(user = %name, file = %password_file.display(), %reason, "the bootstrap user's password file cannot be read; no user created");
            return;
        }
    };
    let credential = match derive_credential(password, auth.iterations).await {
        Ok(credential) => credential,
        Err(e) => {
            warn!(user = %name, error = %e, "the bootstrap user's credential cannot be derived");
            return;
        }
    };
    loop {
        let cmd = Command::PutUser {
            name: name.clone(),
            credential: credential.clone(),
            replace: false,
            at_ms: auth.now_ms(),
        };
        match propose(&auth, cmd).await {
            Ok(_) => {
                info!(user = %name, "bootstrap user created");
                return;
            }
            Err(ServeError::AdminRefused(ModelError::UserExists { .. })) => return,
            Err(ServeError::AdminRefused(refused)) => {
                warn!(user = %name, error = %refused, "the bootstrap user was refused");
                return;
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(BOOTSTRAP_RETRY_MS)) => {}
        }
    }
}

fn read_password(path: &PathBuf) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut text = String::new();
    file.take(PASSWORD_FILE_BYTES_MAX)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    let line = text.lines().next().unwrap_or_default();
    if line.is_empty() {
        return Err("the file's first line is empty".into());
    }
    Ok(line.as_bytes().to_vec())
}
