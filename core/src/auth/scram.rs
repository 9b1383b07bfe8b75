//! SCRAM-SHA-256 (RFC 5802, RFC 7677): the keys, the stored credential and
//! the typed errors shared by the server ([`super::scram_server`]) and the
//! client ([`super::scram_client`]) sides.
//!
//! A broker stores, per user, a salt, an iteration count, `StoredKey =
//! H(HMAC(SaltedPassword, "Client Key"))` and `ServerKey =
//! HMAC(SaltedPassword, "Server Key")`, where `SaltedPassword =
//! PBKDF2-HMAC-SHA-256(password, salt, iterations)`. Never the password,
//! never an unsalted hash: a stolen credential does not log in by itself
//! (the client must prove `ClientKey`, whose hash is `StoredKey`), and
//! recovering the password costs `iterations` HMACs per guess.
//!
//! PBKDF2 is CPU work on purpose: [`StoredCredential::from_password`] and
//! the client's [`super::scram_client::ClientFirst::receive`] run
//! `iterations` HMACs (about 0.3 µs each on one core in a release build:
//! 10 ms at the default 32,768). Callers on an async runtime run them off
//! the async threads (`spawn_blocking` or a bounded pool); the server's
//! exchange itself runs no PBKDF2, only a handful of HMACs.
//!
//! Passwords are used as their UTF-8 bytes. SASLprep (RFC 4013) is not
//! applied: ASCII passwords are unaffected, and a client that normalises
//! differently fails to log in rather than logging in as someone else.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use subtle::ConstantTimeEq;

/// The mechanism's name, as a SASL handshake names it.
pub const MECHANISM: &str = "SCRAM-SHA-256";
/// The fewest PBKDF2 iterations a credential may have (RFC 7677 §4).
pub const ITERATIONS_MIN: u32 = 4096;
/// The most iterations a client accepts from a server, bounding the CPU a
/// hostile server can make it spend.
pub const ITERATIONS_MAX: u32 = 10_000_000;
/// The iteration count new credentials get unless configured otherwise:
/// 8 times the minimum, about 10 ms of one core per login on the client
/// (PBKDF2-HMAC-SHA-256 ran at about 0.3 µs an iteration in a release build).
pub const ITERATIONS_DEFAULT: u32 = 32_768;
/// The salt length of new credentials and of unknown users' fake answers,
/// in bytes. Every salt a broker sends has this length.
pub const SALT_BYTES: usize = 16;
/// The shortest salt a credential may have, in bytes.
pub const SALT_BYTES_MIN: usize = 16;
/// The longest salt a credential may have, in bytes.
pub const SALT_BYTES_MAX: usize = 64;
/// The length of a SHA-256 output and so of every key, in bytes.
pub const KEY_BYTES: usize = 32;
/// The longest SCRAM message either side accepts, in bytes.
pub const MESSAGE_BYTES_MAX: usize = 2048;
/// The longest user name, in bytes (after unescaping).
pub const USERNAME_BYTES_MAX: usize = 255;
/// The longest nonce (client part, or client and server parts together).
pub const NONCE_BYTES_MAX: usize = 512;
/// The shortest server nonce part the caller may supply: it must be fresh
/// and unguessable, so at least 18 random bytes in base64.
pub const SERVER_NONCE_BYTES_MIN: usize = 24;
/// The shortest password, in bytes.
pub const PASSWORD_BYTES_MIN: usize = 1;
/// The longest password, in bytes.
pub const PASSWORD_BYTES_MAX: usize = 1024;

/// A SHA-256 sized key.
pub type Key = [u8; KEY_BYTES];

/// Why an exchange or a credential was refused. Every variant is final for
/// the exchange: the server answers `e=<value>` ([`ScramError::server_error`])
/// and the connection's authentication fails with `unauthorized`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// The message does not follow the grammar of RFC 5802 §7.
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    /// A message or field is longer than its bound.
    #[error("{field} is {actual} bytes, above {limit}")]
    TooLong {
        field: &'static str,
        actual: usize,
        limit: usize,
    },
    /// The `m=` mandatory extension, which no version understands.
    #[error("unsupported mandatory extension")]
    MandatoryExtension,
    /// The client asked for channel binding (`p=`), which is not offered.
    #[error("channel binding is not supported")]
    ChannelBindingNotSupported,
    /// The client named an authorization identity (`a=`): a principal acts
    /// only as itself.
    #[error("an authorization identity is not supported")]
    AuthzidNotSupported,
    /// `c=` is not the base64 of the gs2 header the client sent first.
    #[error("channel binding does not match the gs2 header")]
    ChannelBindingMismatch,
    /// The nonce is not the one this exchange agreed on.
    #[error("the nonce does not match the exchange")]
    NonceMismatch,
    /// The caller supplied a server nonce this broker used before.
    #[error("the server nonce was used before")]
    ServerNonceReused,
    /// The server's nonce does not extend the client's.
    #[error("the server nonce does not extend the client nonce")]
    NonceNotExtended,
    /// The proof is wrong: a wrong password, or a user that does not exist
    /// (the two are never told apart).
    #[error("invalid proof")]
    InvalidProof,
    /// The server's signature is wrong: the server does not know the
    /// credential, or a man in the middle changed the exchange.
    #[error("the server signature does not verify")]
    InvalidServerSignature,
    /// The server answered `e=<value>`.
    #[error("the server refused: {0}")]
    ServerRefused(String),
    /// An iteration count outside `ITERATIONS_MIN..=ITERATIONS_MAX`.
    #[error("{0} iterations is outside {ITERATIONS_MIN}..={ITERATIONS_MAX}")]
    Iterations(u32),
    /// A salt outside `SALT_BYTES_MIN..=SALT_BYTES_MAX` bytes.
    #[error("a salt of {0} bytes is outside {SALT_BYTES_MIN}..={SALT_BYTES_MAX}")]
    Salt(usize),
    /// A password outside `PASSWORD_BYTES_MIN..=PASSWORD_BYTES_MAX` bytes.
    #[error("a password of {0} bytes is outside {PASSWORD_BYTES_MIN}..={PASSWORD_BYTES_MAX}")]
    Password(usize),
}

impl ScramError {
    /// The `server-error-value` of RFC 5802 §7 the server sends for this
    /// refusal. Unknown users and wrong passwords both get `invalid-proof`.
    pub fn server_error(&self) -> &'static str {
        match self {
            ScramError::ChannelBindingNotSupported => "channel-binding-not-supported",
            ScramError::ChannelBindingMismatch => "channel-bindings-dont-match",
            ScramError::MandatoryExtension => "extensions-not-supported",
            ScramError::Malformed(_) | ScramError::TooLong { .. } => "invalid-encoding",
            ScramError::InvalidProof | ScramError::NonceMismatch => "invalid-proof",
            _ => "other-error",
        }
    }
}

/// What a broker keeps for one user. The keys are secrets (with both, a
/// thief could pose as the server to that user), so `Debug` hides them.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCredential {
    pub salt: Vec<u8>,
    pub iterations: u32,
    pub stored_key: Key,
    pub server_key: Key,
}

impl fmt::Debug for StoredCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredCredential")
            .field("salt_bytes", &self.salt.len())
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl StoredCredential {
    /// The credential for `password` under a fresh `salt` the caller drew
    /// from a secure random source. Runs PBKDF2: CPU work, off async threads.
    pub fn from_password(
        password: &[u8],
        salt: &[u8],
        iterations: u32,
    ) -> Result<StoredCredential, ScramError> {
        check_password(password)?;
        check_salt(salt)?;
        check_iterations(iterations)?;
        let salted = salted_password(password, salt, iterations);
        Ok(StoredCredential::from_salted(&salted, salt, iterations))
    }

    /// The credential for an already salted password.
    pub fn from_salted(salted: &Key, salt: &[u8], iterations: u32) -> StoredCredential {
        StoredCredential {
            salt: salt.to_vec(),
            iterations,
            stored_key: stored_key(&client_key(salted)),
            server_key: server_key(salted),
        }
    }

    /// Whether the credential keeps its bounds (a decoded credential is
    /// checked before use).
    pub fn check(&self) -> Result<(), ScramError> {
        check_salt(&self.salt)?;
        check_iterations(self.iterations)
    }
}

pub(super) fn check_password(password: &[u8]) -> Result<(), ScramError> {
    if !(PASSWORD_BYTES_MIN..=PASSWORD_BYTES_MAX).contains(&password.len()) {
        return Err(ScramError::Password(password.len()));
    }
    Ok(())
}

pub(super) fn check_salt(salt: &[u8]) -> Result<(), ScramError> {
    if !(SALT_BYTES_MIN..=SALT_BYTES_MAX).contains(&salt.len()) {
        return Err(ScramError::Salt(salt.len()));
    }
    Ok(())
}

pub fn check_iterations(iterations: u32) -> Result<(), ScramError> {
    if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&iterations) {
        return Err(ScramError::Iterations(iterations));
    }
    Ok(())
}

/// `Hi(password, salt, i)`: PBKDF2-HMAC-SHA-256 with one output block.
pub fn salted_password(password: &[u8], salt: &[u8], iterations: u32) -> Key {
    let mut out = [0u8; KEY_BYTES];
    pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
    out
}

/// `HMAC(key, data)` with SHA-256.
pub fn hmac(key: &[u8], data: &[u8]) -> Key {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut mac = match <Hmac<Sha256> as Mac>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    };
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// `ClientKey = HMAC(SaltedPassword, "Client Key")`.
pub fn client_key(salted: &Key) -> Key {
    hmac(salted, b"Client Key")
}

/// `ServerKey = HMAC(SaltedPassword, "Server Key")`.
pub fn server_key(salted: &Key) -> Key {
    hmac(salted, b"Server Key")
}

/// `StoredKey = H(ClientKey)`.
pub fn stored_key(client_key: &Key) -> Key {
    Sha256::digest(client_key).into()
}

/// `a XOR b`.
pub(super) fn xor(a: &Key, b: &Key) -> Key {
    let mut out = [0u8; KEY_BYTES];
    for (o, (x, y)) in out.iter_mut().zip(a.iter().zip(b.iter())) {
        *o = x ^ y;
    }
    out
}

/// Equality in time independent of where the inputs differ.
pub(super) fn same(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_keeps_no_password_and_its_debug_hides_the_keys() {
        let salt = [7u8; SALT_BYTES];
        let credential = StoredCredential::from_password(b"pencil", &salt, ITERATIONS_MIN).unwrap();
        let shown = format!("{credential:?}");
        assert!(!shown.contains("pencil"));
        assert!(!shown.contains("stored_key"));
        assert!(!shown.contains("server_key"));
        assert_ne!(credential.stored_key, credential.server_key);
        assert_eq!(credential.check(), Ok(()));
    }

    #[test]
    fn bounds_are_typed_errors() {
        let salt = [7u8; SALT_BYTES];
        assert_eq!(
            StoredCredential::from_password(b"pw", &salt, ITERATIONS_MIN - 1),
            Err(ScramError::Iterations(ITERATIONS_MIN - 1))
        );
        assert_eq!(
            StoredCredential::from_password(b"pw", &salt[..8], ITERATIONS_MIN),
            Err(ScramError::Salt(8))
        );
        assert_eq!(
            StoredCredential::from_password(b"", &salt, ITERATIONS_MIN),
            Err(ScramError::Password(0))
        );
    }
}
