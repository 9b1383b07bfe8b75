//! How long a login holds (ADR 0154): the decision, for one request, of
//! whether the connection's session still stands.
//!
//! A session rests on what its login proved ([`Basis`]):
//! - a bearer token holds until its `exp` plus the configured clock skew
//!   (the same allowance a login gets, so a token accepted at login is
//!   never cut shorter than it would be refused), and while the issuer
//!   key it verified under is still in the admin store (ADR 0157):
//!   removing the key ends it, and so does removing it and adding a key
//!   under the same key id again;
//! - a SCRAM login holds while its user exists in the admin store with
//!   the credential the login proved: deleting the user ends it, and so
//!   does changing its password (another `StoredKey`), or deleting and
//!   re-creating the name;
//! - a client certificate the transport verified holds for the
//!   connection's life (the TLS handshake checked its validity).
//!
//! Pure like the rest of `auth`: the time and the store's answer come in
//! as arguments, so [`judge`] is tested without a broker.

use super::scram::{Key, StoredCredential};
use std::sync::Arc;

use super::token::TokenKey;

/// What a connection's login rests on.
#[derive(Clone, PartialEq, Eq)]
pub enum Basis {
    /// A SCRAM login of `user`, which proved the credential whose
    /// `StoredKey` is `stored_key`.
    Password { user: String, stored_key: Key },
    /// A bearer token, `exp` in milliseconds since the epoch, verified
    /// under the issuer key `key` (as the store held it then: its id,
    /// algorithm, public key and when it was added).
    Token {
        expires_at_ms: u64,
        key: Arc<TokenKey>,
    },
    /// A client certificate verified by the transport (mTLS).
    Certificate,
}

impl std::fmt::Debug for Basis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Basis::Password { user, .. } => f
                .debug_struct("Password")
                .field("user", user)
                .finish_non_exhaustive(),
            Basis::Token { expires_at_ms, key } => f
                .debug_struct("Token")
                .field("expires_at_ms", expires_at_ms)
                .field("kid", &key.kid)
                .finish_non_exhaustive(),
            Basis::Certificate => f.write_str("Certificate"),
        }
    }
}

impl Basis {
    /// The user whose stored credential the session rests on: the store
    /// is consulted for these ...
    pub fn user(&self) -> Option<&str> {
        match self {
            Basis::Password { user, .. } => Some(user),
            Basis::Token { .. } | Basis::Certificate => None,
        }
    }

    /// ... and for the issuer key a token session rests on.
    pub fn kid(&self) -> Option<&str> {
        match self {
            Basis::Token { key, .. } => Some(&key.kid),
            Basis::Password { .. } | Basis::Certificate => None,
        }
    }

    /// When the session ends by itself, in milliseconds since the epoch
    /// (`exp` plus `skew_ms`); `None`: it does not.
    pub fn ends_at_ms(&self, skew_ms: u64) -> Option<u64> {
        match self {
            Basis::Token { expires_at_ms, .. } => Some(expires_at_ms.saturating_add(skew_ms)),
            Basis::Password { .. } | Basis::Certificate => None,
        }
    }
}

/// What the deciding broker's cached admin store says of what a session
/// rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store<'a> {
    /// Not consulted (not needed, or it could not be read now).
    Unread,
    /// The user's stored credential, or `None` if the user does not exist.
    Holds(Option<&'a StoredCredential>),
    /// The issuer key stored under the token's key id, or `None` if there
    /// is none.
    Key(Option<&'a TokenKey>),
}

/// Why a session ended. The `Display` text starts with a stable code
/// (`session-expired: ...`), which the broker sends back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ended {
    #[error(
        "session-expired: the token expired at {expires_at_ms} ms (now {now_ms} ms, skew {skew_ms} ms); log in again with a fresh token on a new connection"
    )]
    Expired {
        expires_at_ms: u64,
        now_ms: u64,
        skew_ms: u64,
    },
    #[error("principal-removed: user {user:?} was deleted; this connection's session is over")]
    PrincipalRemoved { user: String },
    #[error(
        "credential-changed: the password of user {user:?} changed; log in again on a new connection"
    )]
    CredentialChanged { user: String },
    #[error(
        "issuer-key-removed: the issuer key {kid:?} that verified this session's token was removed; log in again on a new connection with a token under a current key"
    )]
    IssuerKeyRemoved { kid: String },
}

impl Ended {
    /// The stable code the message starts with.
    pub fn code(&self) -> &'static str {
        match self {
            Ended::Expired { .. } => SESSION_EXPIRED,
            Ended::PrincipalRemoved { .. } => PRINCIPAL_REMOVED,
            Ended::CredentialChanged { .. } => CREDENTIAL_CHANGED,
            Ended::IssuerKeyRemoved { .. } => ISSUER_KEY_REMOVED,
        }
    }
}

/// The code of a session whose token expired.
pub const SESSION_EXPIRED: &str = "session-expired";
/// The code of a session whose user was deleted.
pub const PRINCIPAL_REMOVED: &str = "principal-removed";
/// The code of a session whose user's password changed.
pub const CREDENTIAL_CHANGED: &str = "credential-changed";
/// The code of a token session whose issuer key was removed.
pub const ISSUER_KEY_REMOVED: &str = "issuer-key-removed";

/// Whether the session resting on `basis` still stands at `now_ms`,
/// with tokens allowed `skew_ms` past `exp`, given what the store says
/// of its user or its issuer key. A store that was not read, or read for
/// the other kind of session, ends no session; a token's expiry is found
/// before its key's removal.
pub fn judge(basis: &Basis, now_ms: u64, skew_ms: u64, store: Store<'_>) -> Result<(), Ended> {
    match basis {
        Basis::Certificate => Ok(()),
        Basis::Token { expires_at_ms, key } => {
            if now_ms > expires_at_ms.saturating_add(skew_ms) {
                return Err(Ended::Expired {
                    expires_at_ms: *expires_at_ms,
                    now_ms,
                    skew_ms,
                });
            }
            match store {
                // Gone, or another key under the same id (the session's
                // was removed, then one added again): `add_token_key`
                // refuses a second key under a used id, and a key added
                // again carries another `added_at_ms`.
                Store::Key(stored) if stored != Some(key.as_ref()) => {
                    Err(Ended::IssuerKeyRemoved {
                        kid: key.kid.clone(),
                    })
                }
                Store::Key(_) | Store::Holds(_) | Store::Unread => Ok(()),
            }
        }
        Basis::Password { user, stored_key } => match store {
            Store::Unread | Store::Key(_) => Ok(()),
            Store::Holds(None) => Err(Ended::PrincipalRemoved { user: user.clone() }),
            Store::Holds(Some(credential)) if credential.stored_key != *stored_key => {
                Err(Ended::CredentialChanged { user: user.clone() })
            }
            Store::Holds(Some(_)) => Ok(()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credential(key: u8) -> StoredCredential {
        StoredCredential {
            salt: vec![7; 16],
            iterations: 4096,
            stored_key: [key; 32],
            server_key: [0; 32],
        }
    }

    /// An issuer key (its PEM is not parsed here).
    fn issuer(kid: &str, public_key_pem: &str, added_at_ms: u64) -> TokenKey {
        TokenKey {
            kid: kid.into(),
            algorithm: crate::auth::token::TokenAlgorithm::EdDSA,
            public_key_pem: public_key_pem.into(),
            added_at_ms,
        }
    }

    fn token(expires_at_ms: u64, key: &TokenKey) -> Basis {
        Basis::Token {
            expires_at_ms,
            key: Arc::new(key.clone()),
        }
    }

    fn password(key: u8) -> Basis {
        Basis::Password {
            user: "alice".into(),
            stored_key: [key; 32],
        }
    }

    #[test]
    fn a_token_session_holds_through_exp_plus_skew_and_ends_after() {
        let basis = token(10_000, &issuer("k1", "pem", 1));
        assert_eq!(judge(&basis, 0, 0, Store::Unread), Ok(()));
        assert_eq!(judge(&basis, 10_000, 0, Store::Unread), Ok(()));
        assert_eq!(
            judge(&basis, 10_001, 0, Store::Unread),
            Err(Ended::Expired {
                expires_at_ms: 10_000,
                now_ms: 10_001,
                skew_ms: 0
            })
        );
        // The skew a login is allowed holds for the session too.
        assert_eq!(judge(&basis, 12_000, 2_000, Store::Unread), Ok(()));
        assert!(judge(&basis, 12_001, 2_000, Store::Unread).is_err());
        assert_eq!(basis.ends_at_ms(2_000), Some(12_000));
        // The users never matter to a token.
        assert_eq!(judge(&basis, 5, 0, Store::Holds(None)), Ok(()));
        // No overflow at the far end.
        let far = token(u64::MAX, &issuer("k1", "pem", 1));
        assert_eq!(judge(&far, u64::MAX, u64::MAX, Store::Unread), Ok(()));
    }

    #[test]
    fn a_token_session_ends_when_its_issuer_key_is_removed_and_not_when_another_is() {
        let k1 = issuer("k1", "pem-1", 100);
        let basis = token(10_000, &k1);
        assert_eq!(basis.kid(), Some("k1"));
        assert_eq!(judge(&basis, 0, 0, Store::Key(Some(&k1))), Ok(()));
        let removed = Err(Ended::IssuerKeyRemoved { kid: "k1".into() });
        assert_eq!(judge(&basis, 0, 0, Store::Key(None)), removed);
        // Removed, then a key added under the same id: a new public key,
        // or the same one added again later.
        assert_eq!(
            judge(&basis, 0, 0, Store::Key(Some(&issuer("k1", "pem-2", 100)))),
            removed
        );
        assert_eq!(
            judge(&basis, 0, 0, Store::Key(Some(&issuer("k1", "pem-1", 200)))),
            removed
        );
        // A token's expiry is its first reason.
        assert!(matches!(
            judge(&basis, 10_001, 0, Store::Key(None)),
            Err(Ended::Expired { .. })
        ));
        // A store not read ends nothing; a key never ends a password
        // session.
        assert_eq!(judge(&basis, 0, 0, Store::Unread), Ok(()));
        assert_eq!(judge(&password(1), 0, 0, Store::Key(None)), Ok(()));
        assert_eq!(password(1).kid(), None);
        // The key never prints its public key.
        let text = format!("{basis:?}");
        assert!(text.contains("k1") && !text.contains("pem-1"), "{text}");
    }

    #[test]
    fn a_password_session_ends_when_its_user_goes_or_its_password_changes() {
        let basis = password(1);
        let same = credential(1);
        let changed = credential(2);
        assert_eq!(judge(&basis, 0, 0, Store::Holds(Some(&same))), Ok(()));
        assert_eq!(
            judge(&basis, 0, 0, Store::Holds(None)),
            Err(Ended::PrincipalRemoved {
                user: "alice".into()
            })
        );
        assert_eq!(
            judge(&basis, 0, 0, Store::Holds(Some(&changed))),
            Err(Ended::CredentialChanged {
                user: "alice".into()
            })
        );
        // An unread store ends nothing, and time does not either.
        assert_eq!(judge(&basis, u64::MAX, 0, Store::Unread), Ok(()));
        assert_eq!(basis.ends_at_ms(0), None);
        assert_eq!(basis.user(), Some("alice"));
    }

    #[test]
    fn a_certificate_session_holds_for_the_connections_life() {
        let basis = Basis::Certificate;
        assert_eq!(judge(&basis, u64::MAX, 0, Store::Holds(None)), Ok(()));
        assert_eq!(basis.user(), None);
        assert_eq!(basis.ends_at_ms(0), None);
    }

    #[test]
    fn each_ending_names_its_stable_code_first() {
        let endings = [
            Ended::Expired {
                expires_at_ms: 1_000,
                now_ms: 2_000,
                skew_ms: 0,
            },
            Ended::PrincipalRemoved { user: "bob".into() },
            Ended::CredentialChanged { user: "bob".into() },
            Ended::IssuerKeyRemoved { kid: "k1".into() },
        ];
        for ended in endings {
            let text = ended.to_string();
            assert!(text.starts_with(&format!("{}: ", ended.code())), "{text}");
        }
        assert_eq!(
            Ended::Expired {
                expires_at_ms: 1_800_003_600_000,
                now_ms: 1_800_003_600_001,
                skew_ms: 0
            }
            .to_string(),
            "session-expired: the token expired at 1800003600000 ms (now 1800003600001 ms, skew 0 ms); log in again with a fresh token on a new connection"
        );
    }

    #[test]
    fn a_password_basis_never_prints_its_key() {
        let text = format!("{:?}", password(0xab));
        assert!(!text.contains("171"), "{text}");
        assert!(text.contains("alice"), "{text}");
    }
}
