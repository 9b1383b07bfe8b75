//! The broker's side of a SCRAM-SHA-256 exchange, as a state machine the
//! serve layer drives with the client's two messages:
//!
//! 1. [`ServerExchange::start`] takes the `client-first-message`, looks the
//!    user up through the caller's function and answers the
//!    `server-first-message` with the client's nonce extended by a fresh
//!    server nonce the caller supplies (from a secure random source);
//! 2. [`ServerExchange::finish`] takes the `client-final-message`, checks
//!    the channel binding and the nonce and verifies the proof against the
//!    stored key; it consumes the exchange, so one exchange verifies at
//!    most one proof.
//!
//! An unknown user is answered with a salt and an iteration count derived
//! from a server secret ([`ServerConfig::fake_credential`]): the same salt
//! every time for the same name, the same length and count as real users
//! get, and the same verification work at the end, which fails as
//! `InvalidProof` exactly like a wrong password. Real users must have the
//! configured iteration count for the two to look alike.
//!
//! A server nonce is refused if this broker used it before (the
//! [`NonceLedger`]), so a caller whose random source repeated cannot turn a
//! recorded `client-final-message` into a replay. A replay into a new
//! exchange fails on its nonce, which the new exchange extends differently.

use super::scram::{
    self, ITERATIONS_DEFAULT, MESSAGE_BYTES_MAX, NONCE_BYTES_MAX, SALT_BYTES,
    SERVER_NONCE_BYTES_MIN, ScramError, StoredCredential,
};
use super::scram_message as message;
use std::collections::{BTreeSet, VecDeque};

/// The shortest fake-credential secret, in bytes.
pub const FAKE_SECRET_BYTES_MIN: usize = 16;
/// The server nonces a ledger remembers before forgetting the oldest.
pub const NONCE_LEDGER_ENTRIES_MAX: usize = 65_536;

/// Domain labels, so the fake answers' HMACs never equal another use of
/// the same secret.
const FAKE_SALT: &[u8] = b"malachi-scram-fake-salt\0";
const FAKE_STORED_KEY: &[u8] = b"malachi-scram-fake-stored-key\0";
const FAKE_SERVER_KEY: &[u8] = b"malachi-scram-fake-server-key\0";

/// The server side's settings.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The secret unknown users' fake salts are derived from. Every broker
    /// of a cluster must use the same one, or asking two brokers would tell
    /// an unknown user (its salt would differ) from a known one.
    fake_secret: Vec<u8>,
    /// The iteration count unknown users are answered with: the count real
    /// credentials are created with.
    pub iterations: u32,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ServerConfig {
    /// Settings with `fake_secret` (at least [`FAKE_SECRET_BYTES_MIN`]
    /// bytes) and the default iteration count.
    pub fn new(fake_secret: &[u8]) -> Result<ServerConfig, ScramError> {
        if fake_secret.len() < FAKE_SECRET_BYTES_MIN {
            return Err(ScramError::Malformed("fake secret shorter than 16 bytes"));
        }
        Ok(ServerConfig {
            fake_secret: fake_secret.to_vec(),
            iterations: ITERATIONS_DEFAULT,
        })
    }

    /// The same settings with another iteration count.
    pub fn with_iterations(mut self, iterations: u32) -> Result<ServerConfig, ScramError> {
        scram::check_iterations(iterations)?;
        self.iterations = iterations;
        Ok(self)
    }

    /// What an unknown user is answered with: deterministic in the name,
    /// shaped like a real credential, and matching no password.
    pub fn fake_credential(&self, username: &str) -> StoredCredential {
        let derive = |label: &[u8]| {
            let mut data = label.to_vec();
            data.extend_from_slice(username.as_bytes());
            scram::hmac(&self.fake_secret, &data)
        };
        StoredCredential {
            salt: derive(FAKE_SALT)[..SALT_BYTES].to_vec(),
            iterations: self.iterations,
            stored_key: derive(FAKE_STORED_KEY),
            server_key: derive(FAKE_SERVER_KEY),
        }
    }
}

/// The server nonces this broker used, most recent last, bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NonceLedger {
    seen: BTreeSet<String>,
    order: VecDeque<String>,
}

impl NonceLedger {
    /// Records `nonce`; `false` if it was used before (and is remembered).
    fn record(&mut self, nonce: &str) -> bool {
        if self.seen.contains(nonce) {
            return false;
        }
        if self.order.len() >= NONCE_LEDGER_ENTRIES_MAX
            && let Some(oldest) = self.order.pop_front()
        {
            self.seen.remove(&oldest);
        }
        self.seen.insert(nonce.to_owned());
        self.order.push_back(nonce.to_owned());
        assert!(self.order.len() <= NONCE_LEDGER_ENTRIES_MAX);
        true
    }

    /// How many nonces it remembers.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether it remembers none.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// An exchange between its two client messages.
pub struct ServerExchange {
    username: String,
    known: bool,
    credential: StoredCredential,
    gs2_header: String,
    /// `client-first-message-bare "," server-first-message`: the first two
    /// parts of AuthMessage.
    auth_prefix: String,
    nonce: String,
}

impl std::fmt::Debug for ServerExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerExchange")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// A verified exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated {
    /// The user the client proved it is.
    pub username: String,
    /// The `server-final-message` (`v=...`) proving the server knew the
    /// credential.
    pub server_final: String,
}

impl ServerExchange {
    /// Parses `client_first`, looks its user up with `lookup` and answers
    /// the `server-first-message`. `server_nonce` must be fresh random
    /// printable ASCII of at least [`SERVER_NONCE_BYTES_MIN`] bytes.
    pub fn start(
        config: &ServerConfig,
        client_first: &str,
        lookup: impl FnOnce(&str) -> Option<StoredCredential>,
        server_nonce: &str,
        ledger: &mut NonceLedger,
    ) -> Result<(ServerExchange, String), ScramError> {
        check_server_nonce(server_nonce)?;
        let first = message::parse_client_first(client_first)?;
        let nonce = format!("{}{server_nonce}", first.nonce);
        if nonce.len() > NONCE_BYTES_MAX {
            return Err(ScramError::TooLong {
                field: "nonce",
                actual: nonce.len(),
                limit: NONCE_BYTES_MAX,
            });
        }
        let (known, credential) = match lookup(&first.username) {
            Some(credential) => (true, credential),
            None => (false, config.fake_credential(&first.username)),
        };
        credential.check()?;
        if !ledger.record(server_nonce) {
            return Err(ScramError::ServerNonceReused);
        }
        let server_first = format!(
            "r={nonce},s={},i={}",
            message::b64(&credential.salt),
            credential.iterations
        );
        assert!(server_first.len() <= MESSAGE_BYTES_MAX);
        let exchange = ServerExchange {
            username: first.username,
            known,
            credential,
            gs2_header: first.gs2_header.to_owned(),
            auth_prefix: format!("{},{server_first}", first.bare),
            nonce,
        };
        Ok((exchange, server_first))
    }

    /// The user the client claims to be (not yet proven).
    pub fn claimed_username(&self) -> &str {
        &self.username
    }

    /// Verifies `client_final`. On success the caller sends
    /// [`Authenticated::server_final`]; on failure it sends
    /// [`server_error_message`] and fails the connection's authentication.
    pub fn finish(self, client_final: &str) -> Result<Authenticated, ScramError> {
        let last = message::parse_client_final(client_final)?;
        if last.channel_binding != self.gs2_header.as_bytes() {
            return Err(ScramError::ChannelBindingMismatch);
        }
        if !scram::same(last.nonce.as_bytes(), self.nonce.as_bytes()) {
            return Err(ScramError::NonceMismatch);
        }
        let auth_message = format!("{},{}", self.auth_prefix, last.without_proof);
        let client_signature = scram::hmac(&self.credential.stored_key, auth_message.as_bytes());
        let client_key = scram::xor(&last.proof, &client_signature);
        let proven = scram::same(&scram::stored_key(&client_key), &self.credential.stored_key);
        // The server signature is computed whether or not the proof holds,
        // so known and unknown users, right and wrong proofs, do the same work.
        let server_signature = scram::hmac(&self.credential.server_key, auth_message.as_bytes());
        if !(proven && self.known) {
            return Err(ScramError::InvalidProof);
        }
        Ok(Authenticated {
            username: self.username,
            server_final: format!("v={}", message::b64(&server_signature)),
        })
    }
}

/// The `server-final-message` refusing an exchange for `error`.
pub fn server_error_message(error: &ScramError) -> String {
    format!("e={}", error.server_error())
}

fn check_server_nonce(nonce: &str) -> Result<(), ScramError> {
    if nonce.len() < SERVER_NONCE_BYTES_MIN {
        return Err(ScramError::Malformed("server nonce too short"));
    }
    if !nonce
        .bytes()
        .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
    {
        return Err(ScramError::Malformed("server nonce is not printable ASCII"));
    }
    Ok(())
}
