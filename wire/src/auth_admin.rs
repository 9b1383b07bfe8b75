//! User and ACL administration, api keys 403 to 409 (ADR 0150): create,
//! replace and delete users, list them, add, remove and list ACL entries,
//! and unlock a user. `docs/protocol.md` §10.3 describes them byte by byte.
//!
//! A user's credential travels as its SCRAM parts (salt, iteration count,
//! `StoredKey`, `ServerKey`), derived by the client from the password: no
//! password ever reaches a broker or the ring's raft log (ADR 0148, 0150).
//! The salt and the keys are standard base64 (with padding).
//!
//! ACL entries travel as text, parsed by the broker: `principal` is
//! `User:<name>` or `User:*`; `resource` is `topic`, `group` or `cluster`;
//! `pattern` is `literal` or `prefixed` (empty for the cluster); `name` the
//! topic's or group's name or prefix (empty for the cluster); `operation`
//! one of `produce`, `consume`, `create`, `delete`, `describe`, `alter`,
//! `admin`; `permission` `allow` or `deny`.

use serde::{Deserialize, Serialize};

use crate::error::WireError;
use crate::limits::{NAME_BYTES_MAX, STATE_BYTES_MAX};
use crate::messages::{Message, check_len};

/// The longest base64 salt (64 bytes, padded), in bytes.
pub const SALT_TEXT_BYTES_MAX: usize = 88;
/// The length of a base64 SHA-256 key (32 bytes, padded), in bytes.
pub const KEY_TEXT_BYTES: usize = 44;
/// The most users one `list_users` answer carries.
pub const USERS_MAX: usize = 100_000;
/// The most entries one `list_acls` answer carries.
pub const ACLS_MAX: usize = 100_000;

fn check_user(field: &'static str, name: &str) -> Result<(), WireError> {
    if name.is_empty() {
        return Err(WireError::InvalidField {
            field,
            reason: "empty",
        });
    }
    check_len(field, name.len(), NAME_BYTES_MAX)
}

/// A user's SCRAM credential, as the client derived it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct UserCredential {
    /// base64 of 16 to 64 random bytes.
    pub salt: String,
    /// PBKDF2 iterations, 4,096 to 10,000,000.
    pub iterations: u32,
    /// base64 of `StoredKey` (32 bytes).
    pub stored_key: String,
    /// base64 of `ServerKey` (32 bytes).
    pub server_key: String,
}

impl UserCredential {
    fn check(&self) -> Result<(), WireError> {
        if self.salt.is_empty() {
            return Err(WireError::InvalidField {
                field: "salt",
                reason: "empty",
            });
        }
        check_len("salt", self.salt.len(), SALT_TEXT_BYTES_MAX)?;
        check_len("stored_key", self.stored_key.len(), KEY_TEXT_BYTES)?;
        check_len("server_key", self.server_key.len(), KEY_TEXT_BYTES)
    }
}

/// 403 `put_user` request: creates `name`, or with `replace` sets its
/// credential (a password change).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PutUserRequest {
    pub name: String,
    pub credential: UserCredential,
    pub replace: bool,
}

impl Message for PutUserRequest {
    const NAME: &'static str = "put_user_request";
    fn check(&self) -> Result<(), WireError> {
        check_user("name", &self.name)?;
        self.credential.check()
    }
}

/// 403 `put_user` response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PutUserResponse {
    pub name: String,
    /// `false` when the user already had this very credential (a retry).
    pub changed: bool,
}

impl Message for PutUserResponse {
    const NAME: &'static str = "put_user_response";
    fn check(&self) -> Result<(), WireError> {
        check_user("name", &self.name)
    }
}

/// 404 `delete_user` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DeleteUserRequest {
    pub name: String,
}

impl Message for DeleteUserRequest {
    const NAME: &'static str = "delete_user_request";
    fn check(&self) -> Result<(), WireError> {
        check_user("name", &self.name)
    }
}

/// 404 `delete_user` response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DeleteUserResponse {
    pub name: String,
}

impl Message for DeleteUserResponse {
    const NAME: &'static str = "delete_user_response";
    fn check(&self) -> Result<(), WireError> {
        check_user("name", &self.name)
    }
}

/// 405 `list_users` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ListUsersRequest {}

impl Message for ListUsersRequest {
    const NAME: &'static str = "list_users_request";
    fn check(&self) -> Result<(), WireError> {
        Ok(())
    }
}

/// One user of `list_users`: never its credential's keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct UserSummary {
    pub name: String,
    pub iterations: u32,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Sources (IP addresses) this user is locked out of now.
    pub locked_sources: u32,
}

/// 405 `list_users` response, in name order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ListUsersResponse {
    pub users: Vec<UserSummary>,
}

impl Message for ListUsersResponse {
    const NAME: &'static str = "list_users_response";
    fn check(&self) -> Result<(), WireError> {
        check_len("users", self.users.len(), USERS_MAX)?;
        self.users
            .iter()
            .try_for_each(|u| check_user("name", &u.name))
    }
}

/// One ACL entry, as text (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct AclEntryText {
    pub principal: String,
    pub resource: String,
    pub pattern: String,
    pub name: String,
    pub operation: String,
    pub permission: String,
}

impl AclEntryText {
    fn check(&self) -> Result<(), WireError> {
        check_user("principal", &self.principal)?;
        check_len("principal", self.principal.len(), NAME_BYTES_MAX + 5)?;
        check_len("resource", self.resource.len(), STATE_BYTES_MAX)?;
        check_len("pattern", self.pattern.len(), STATE_BYTES_MAX)?;
        check_len("name", self.name.len(), NAME_BYTES_MAX)?;
        check_len("operation", self.operation.len(), STATE_BYTES_MAX)?;
        check_len("permission", self.permission.len(), STATE_BYTES_MAX)
    }
}

/// 406 `add_acl` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct AddAclRequest {
    pub entry: AclEntryText,
}

impl Message for AddAclRequest {
    const NAME: &'static str = "add_acl_request";
    fn check(&self) -> Result<(), WireError> {
        self.entry.check()
    }
}

/// 407 `remove_acl` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RemoveAclRequest {
    pub entry: AclEntryText,
}

impl Message for RemoveAclRequest {
    const NAME: &'static str = "remove_acl_request";
    fn check(&self) -> Result<(), WireError> {
        self.entry.check()
    }
}

/// 406 `add_acl` and 407 `remove_acl` response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct AclChangeResponse {
    /// `false` when the entry was already there (add) or already gone
    /// (remove is then `acl_not_found`, so only an add answers `false`).
    pub changed: bool,
}

impl Message for AclChangeResponse {
    const NAME: &'static str = "acl_change_response";
    fn check(&self) -> Result<(), WireError> {
        Ok(())
    }
}

/// 408 `list_acls` request: every entry, or those of one principal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ListAclsRequest {
    #[serde(default)]
    pub principal: Option<String>,
}

impl Message for ListAclsRequest {
    const NAME: &'static str = "list_acls_request";
    fn check(&self) -> Result<(), WireError> {
        match &self.principal {
            Some(p) => check_len("principal", p.len(), NAME_BYTES_MAX + 5),
            None => Ok(()),
        }
    }
}

/// 408 `list_acls` response, in the store's canonical order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ListAclsResponse {
    pub entries: Vec<AclEntryText>,
}

impl Message for ListAclsResponse {
    const NAME: &'static str = "list_acls_response";
    fn check(&self) -> Result<(), WireError> {
        check_len("entries", self.entries.len(), ACLS_MAX)?;
        self.entries.iter().try_for_each(AclEntryText::check)
    }
}

/// 409 `unlock_user` request: clears the user's lockout on every source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct UnlockUserRequest {
    pub name: String,
}

impl Message for UnlockUserRequest {
    const NAME: &'static str = "unlock_user_request";
    fn check(&self) -> Result<(), WireError> {
        check_user("name", &self.name)
    }
}

/// 409 `unlock_user` response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct UnlockUserResponse {
    pub name: String,
}

impl Message for UnlockUserResponse {
    const NAME: &'static str = "unlock_user_response";
    fn check(&self) -> Result<(), WireError> {
        check_user("name", &self.name)
    }
}
