//! The cluster's admin stores (ADR 0148): users and their SCRAM
//! credentials, ACL entries and the lockout table, kept in the ring's group
//! beside the policies and the cursor keys (ADR 0146), so a change made
//! through any broker reaches every broker.
//!
//! The credentials arrive already derived (the proposer ran PBKDF2 at the
//! edge, off the async threads): the machine derives nothing and keeps no
//! password. The lockout commands carry the time and the policy they are
//! judged under, so replicas apply them to the same bytes. Everything is
//! bounded: users (`USERS_MAX`), entries (`ACL_ENTRIES_MAX`) and lockout
//! keys (`LOCKOUT_ENTRIES_MAX`).

use super::command::{ModelError, Outcome, USER_NAME_BYTES_MAX, UserNameRule};
use super::state::MetadataState;
use crate::auth::acl::{ACL_ENTRIES_MAX, ACL_NAME_BYTES_MAX, AclEntry, Authorizer, Principal};
use crate::auth::lockout::{Admission, Lockout, LockoutKey, LockoutPolicy};
use crate::auth::scram::{
    ITERATIONS_MAX, ITERATIONS_MIN, SALT_BYTES_MAX, SALT_BYTES_MIN, StoredCredential,
    USERNAME_BYTES_MAX,
};
use crate::auth::token::{TOKEN_KEYS_MAX, TokenError, TokenKey};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The most users the store holds.
pub const USERS_MAX: usize = 100_000;
const _: () = assert!(USER_NAME_BYTES_MAX <= USERNAME_BYTES_MAX);
const _: () = assert!(USER_NAME_BYTES_MAX <= ACL_NAME_BYTES_MAX);
/// The most (principal, source) keys the lockout table keeps. It replaces
/// the `entries_max` of the policy a command carries, so the bound never
/// moves under a full table.
pub const LOCKOUT_ENTRIES_MAX: usize = 100_000;
/// The longest lockout source (an IP address), in bytes.
pub const LOCKOUT_SOURCE_BYTES_MAX: usize = 64;

/// One user: the credential and when it was created and last changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    pub credential: StoredCredential,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
}

/// The admin stores of the ring's group. Encoded as a whole, in this field
/// order; a new field goes last, with a default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminStore {
    users: BTreeMap<String, UserRecord>,
    acls: BTreeSet<AclEntry>,
    lockout: Lockout,
    /// The token issuer's public keys by key id (ADR 0152). Left out of
    /// the encoding while empty, so a store without them encodes as before.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    token_keys: BTreeMap<String, TokenKey>,
}

/// What a broker needs to decide: a copy of the stores at one applied
/// state, which it caches for no longer than its lease (ADR 0148).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthView {
    pub users: BTreeMap<String, UserRecord>,
    /// The entries, in their canonical order.
    pub acls: Vec<AclEntry>,
    pub lockout: Lockout,
    /// The token issuer's public keys by key id (ADR 0152).
    #[serde(default)]
    pub token_keys: BTreeMap<String, TokenKey>,
}

impl AuthView {
    /// An enforcing authorizer over these entries, with the configured
    /// superusers. The view's entries were validated when applied.
    pub fn authorizer(
        &self,
        superusers: impl IntoIterator<Item = Principal>,
    ) -> Result<Authorizer, ModelError> {
        let mut authorizer = Authorizer::enforced(superusers);
        for entry in &self.acls {
            authorizer.add(entry.clone()).map_err(|e| acl_error(&e))?;
        }
        Ok(authorizer)
    }

    /// The stored credential of `name`, if the user exists.
    pub fn credential(&self, name: &str) -> Option<&StoredCredential> {
        self.users.get(name).map(|u| &u.credential)
    }
}

/// Checks a user name: 1 to `USER_NAME_BYTES_MAX` bytes of ASCII letters,
/// digits, `.`, `_`, `-` and `@` (no `,` or `=`, which SCRAM escapes, no
/// `:` or `*`, which principals and their patterns use).
pub fn validate_user_name(name: &str) -> Result<(), ModelError> {
    let rule = if name.is_empty() {
        Some(UserNameRule::Empty)
    } else if name.len() > USER_NAME_BYTES_MAX {
        Some(UserNameRule::TooLong)
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@'))
    {
        Some(UserNameRule::BadCharacter)
    } else {
        None
    };
    match rule {
        Some(reason) => Err(ModelError::InvalidUserName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Checks a credential's bounds (the keys are fixed-size by type).
pub fn validate_credential(credential: &StoredCredential) -> Result<(), ModelError> {
    if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&credential.iterations) {
        return Err(ModelError::CredentialIterations {
            iterations: credential.iterations,
            min: ITERATIONS_MIN,
            max: ITERATIONS_MAX,
        });
    }
    let bytes = credential.salt.len();
    if !(SALT_BYTES_MIN..=SALT_BYTES_MAX).contains(&bytes) {
        return Err(ModelError::CredentialSalt {
            bytes,
            min: SALT_BYTES_MIN,
            max: SALT_BYTES_MAX,
        });
    }
    Ok(())
}

/// Checks a token key's bounds (the key id's characters, the PEM's
/// size), not its PEM: the proposer parsed it, and a machine that parses
/// keys would tie the log's meaning to a crypto library's version.
pub fn validate_token_key(key: &TokenKey) -> Result<(), ModelError> {
    let invalid = |e: TokenError| ModelError::InvalidTokenKey {
        reason: e.to_string(),
    };
    crate::auth::token::check_kid(&key.kid).map_err(invalid)?;
    let bytes = key.public_key_pem.len();
    if bytes == 0 || bytes > crate::auth::token::PUBLIC_KEY_PEM_BYTES_MAX {
        return Err(ModelError::InvalidTokenKey {
            reason: format!(
                "a public key of {bytes} bytes is not within 1..={}",
                crate::auth::token::PUBLIC_KEY_PEM_BYTES_MAX
            ),
        });
    }
    Ok(())
}

fn acl_error(e: &crate::auth::acl::AclError) -> ModelError {
    ModelError::InvalidAcl {
        reason: e.to_string(),
    }
}

fn validate_lockout(key: &LockoutKey) -> Result<(), ModelError> {
    let reason = if key.principal.is_empty() || key.principal.len() > USER_NAME_BYTES_MAX {
        Some(format!(
            "a principal of {} bytes is not within 1..={USER_NAME_BYTES_MAX}",
            key.principal.len()
        ))
    } else if key.source.is_empty() || key.source.len() > LOCKOUT_SOURCE_BYTES_MAX {
        Some(format!(
            "a source of {} bytes is not within 1..={LOCKOUT_SOURCE_BYTES_MAX}",
            key.source.len()
        ))
    } else {
        None
    };
    match reason {
        Some(reason) => Err(ModelError::InvalidLockout { reason }),
        None => Ok(()),
    }
}

impl AdminStore {
    /// Whether the store is one `apply` could have built.
    pub fn is_well_formed(&self) -> bool {
        self.users.len() <= USERS_MAX
            && self.users.iter().all(|(name, user)| {
                validate_user_name(name).is_ok() && validate_credential(&user.credential).is_ok()
            })
            && self.acls.len() <= ACL_ENTRIES_MAX
            && self.acls.iter().all(|e| e.check().is_ok())
            && self.lockout.len() <= LOCKOUT_ENTRIES_MAX
            && self.token_keys.len() <= TOKEN_KEYS_MAX
            && self
                .token_keys
                .iter()
                .all(|(kid, key)| *kid == key.kid && validate_token_key(key).is_ok())
    }

    fn view(&self) -> AuthView {
        AuthView {
            users: self.users.clone(),
            acls: self.acls.iter().cloned().collect(),
            lockout: self.lockout.clone(),
            token_keys: self.token_keys.clone(),
        }
    }
}

impl MetadataState {
    /// The admin stores' view: empty until an admin command applied.
    pub fn auth_view(&self) -> AuthView {
        self.admin
            .as_ref()
            .map(AdminStore::view)
            .unwrap_or_default()
    }

    fn admin_mut(&mut self) -> &mut AdminStore {
        self.admin.get_or_insert_with(AdminStore::default)
    }

    pub(super) fn put_user(
        &mut self,
        name: String,
        credential: StoredCredential,
        replace: bool,
        at_ms: u64,
    ) -> Result<Outcome, ModelError> {
        validate_user_name(&name)?;
        validate_credential(&credential)?;
        let existing = self.admin.as_ref().and_then(|a| a.users.get(&name));
        let created_at_ms = match existing {
            // A repeat whose answer was lost: nothing to do.
            Some(user) if user.credential == credential => return Ok(Outcome::Unchanged),
            Some(_) if !replace => return Err(ModelError::UserExists { name }),
            Some(user) => user.created_at_ms,
            None => {
                let count = self.admin.as_ref().map_or(0, |a| a.users.len());
                if count >= USERS_MAX {
                    return Err(ModelError::TooManyUsers { max: USERS_MAX });
                }
                at_ms
            }
        };
        let created = existing.is_none();
        let record = UserRecord {
            credential,
            created_at_ms,
            updated_at_ms: at_ms,
        };
        self.admin_mut().users.insert(name, record);
        Ok(Outcome::UserPut { created })
    }

    /// Forgets the user and its lockout keys; its ACL entries stay (as
    /// Kafka's do), so a user re-created under the name gets them back.
    pub(super) fn delete_user(&mut self, name: &str) -> Result<Outcome, ModelError> {
        let Some(admin) = self.admin.as_mut().filter(|a| a.users.contains_key(name)) else {
            return Err(ModelError::NoSuchUser {
                name: name.to_owned(),
            });
        };
        admin.users.remove(name);
        admin.lockout.unlock(name);
        Ok(Outcome::UserDeleted)
    }

    pub(super) fn add_acl(&mut self, entry: AclEntry) -> Result<Outcome, ModelError> {
        entry.check().map_err(|e| acl_error(&e))?;
        let acls = self.admin.as_ref().map(|a| &a.acls);
        if acls.is_some_and(|acls| acls.contains(&entry)) {
            return Ok(Outcome::Unchanged);
        }
        if acls.map_or(0, BTreeSet::len) >= ACL_ENTRIES_MAX {
            return Err(ModelError::TooManyAcls {
                max: ACL_ENTRIES_MAX,
            });
        }
        self.admin_mut().acls.insert(entry);
        Ok(Outcome::AclAdded)
    }

    pub(super) fn remove_acl(&mut self, entry: AclEntry) -> Result<Outcome, ModelError> {
        let removed = self.admin.as_mut().is_some_and(|a| a.acls.remove(&entry));
        if removed {
            Ok(Outcome::AclRemoved)
        } else {
            Err(ModelError::NoSuchAcl {
                entry: Box::new(entry),
            })
        }
    }

    pub(super) fn record_login_failure(
        &mut self,
        key: LockoutKey,
        policy: LockoutPolicy,
        at_ms: u64,
    ) -> Result<Outcome, ModelError> {
        validate_lockout(&key)?;
        // The store's own bound, whatever the command says: a policy whose
        // `entries_max` shrank between two commands would leave the table
        // above it, which `Lockout::record_failure` asserts against (a
        // panic in every replica's apply).
        let policy = LockoutPolicy {
            entries_max: LOCKOUT_ENTRIES_MAX,
            ..policy
        };
        let admission = self
            .admin_mut()
            .lockout
            .record_failure(&policy, &key, at_ms);
        let (retry_at_ms, locked) = match admission {
            Admission::Allowed => (at_ms, false),
            Admission::Delayed { retry_at_ms } => (retry_at_ms, false),
            Admission::Locked { until_ms } => (until_ms, true),
        };
        Ok(Outcome::LoginFailureRecorded {
            retry_at_ms,
            locked,
        })
    }

    pub(super) fn record_login_success(&mut self, key: &LockoutKey) -> Result<Outcome, ModelError> {
        let Some(admin) = self.admin.as_mut() else {
            return Ok(Outcome::LockoutCleared { keys: 0 });
        };
        let before = admin.lockout.len();
        admin.lockout.record_success(key);
        Ok(Outcome::LockoutCleared {
            keys: (before - admin.lockout.len()) as u64,
        })
    }

    pub(super) fn unlock_user(&mut self, name: &str) -> Result<Outcome, ModelError> {
        let keys = self.admin.as_mut().map_or(0, |a| a.lockout.unlock(name));
        Ok(Outcome::LockoutCleared { keys: keys as u64 })
    }
}

impl MetadataState {
    /// Adds an issuer key; the same key again is `Unchanged`, another key
    /// under a key id already used is `TokenKeyExists` (a rotation adds a
    /// new key id, then removes the old one).
    pub(super) fn add_token_key(&mut self, key: TokenKey) -> Result<Outcome, ModelError> {
        validate_token_key(&key)?;
        let keys = self.admin.as_ref().map(|a| &a.token_keys);
        match keys.and_then(|k| k.get(&key.kid)) {
            Some(existing)
                if existing.algorithm == key.algorithm
                    && existing.public_key_pem == key.public_key_pem =>
            {
                return Ok(Outcome::Unchanged);
            }
            Some(_) => return Err(ModelError::TokenKeyExists { kid: key.kid }),
            None => {}
        }
        if keys.map_or(0, BTreeMap::len) >= TOKEN_KEYS_MAX {
            return Err(ModelError::TooManyTokenKeys {
                max: TOKEN_KEYS_MAX,
            });
        }
        self.admin_mut().token_keys.insert(key.kid.clone(), key);
        Ok(Outcome::TokenKeyAdded)
    }

    /// Removes an issuer key: tokens naming it are refused from then on,
    /// and the sessions they opened end (ADR 0157, `auth::session`).
    pub(super) fn remove_token_key(&mut self, kid: &str) -> Result<Outcome, ModelError> {
        let removed = self
            .admin
            .as_mut()
            .and_then(|a| a.token_keys.remove(kid))
            .is_some();
        if removed {
            Ok(Outcome::TokenKeyRemoved)
        } else {
            Err(ModelError::NoSuchTokenKey {
                kid: kid.to_owned(),
            })
        }
    }
}
