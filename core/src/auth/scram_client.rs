//! The client's side of a SCRAM-SHA-256 exchange, for the SDK and the CLI:
//! [`ScramClient::start`] writes the `client-first-message`,
//! [`ClientFirst::receive`] answers the server's first message with the
//! proof (running PBKDF2: CPU work, off async threads) and
//! [`ClientFinal::verify`] checks the server's signature, so a client only
//! trusts a server that knows its credential.
//!
//! The client refuses a server nonce that does not extend its own, an
//! iteration count below [`ITERATIONS_MIN`] (a downgrade) or above
//! [`ITERATIONS_MAX`] (a CPU sink), and a salt outside its bounds.

use super::scram::{self, ITERATIONS_MAX, ITERATIONS_MIN, Key, ScramError};
use super::scram_message::{self as message, ServerFinal};

/// The shortest client nonce, in bytes: at least 12 random bytes in base64.
pub const CLIENT_NONCE_BYTES_MIN: usize = 16;

/// The gs2 header the client sends: no channel binding, no authzid.
const GS2_HEADER: &str = "n,,";

/// Starts an exchange.
#[derive(Debug, Clone, Copy)]
pub struct ScramClient;

/// Waiting for the `server-first-message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFirst {
    bare: String,
    nonce: String,
}

/// Waiting for the `server-final-message`.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientFinal {
    server_signature: Key,
}

impl std::fmt::Debug for ClientFinal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientFinal").finish_non_exhaustive()
    }
}

impl ScramClient {
    /// The `client-first-message` for `username`, with `client_nonce` (fresh
    /// random printable ASCII, at least [`CLIENT_NONCE_BYTES_MIN`] bytes).
    pub fn start(username: &str, client_nonce: &str) -> Result<(ClientFirst, String), ScramError> {
        if client_nonce.len() < CLIENT_NONCE_BYTES_MIN {
            return Err(ScramError::Malformed("client nonce too short"));
        }
        let bare = format!("n={},r={client_nonce}", message::encode_username(username));
        let first = format!("{GS2_HEADER}{bare}");
        // Parse what was written: the same bounds and grammar as the server.
        let parsed = message::parse_client_first(&first)?;
        assert_eq!(parsed.username, username);
        let state = ClientFirst {
            bare,
            nonce: client_nonce.to_owned(),
        };
        Ok((state, first))
    }
}

impl ClientFirst {
    /// The `client-final-message` answering `server_first`, proving
    /// `password`. Runs PBKDF2.
    pub fn receive(
        self,
        server_first: &str,
        password: &[u8],
    ) -> Result<(ClientFinal, String), ScramError> {
        scram::check_password(password)?;
        let first = message::parse_server_first(server_first)?;
        if !(first.nonce.len() > self.nonce.len() && first.nonce.starts_with(self.nonce.as_str())) {
            return Err(ScramError::NonceNotExtended);
        }
        if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&first.iterations) {
            return Err(ScramError::Iterations(first.iterations));
        }
        scram::check_salt(&first.salt)?;
        let salted = scram::salted_password(password, &first.salt, first.iterations);
        let without_proof = format!(
            "c={},r={}",
            message::b64(GS2_HEADER.as_bytes()),
            first.nonce
        );
        let auth_message = format!("{},{server_first},{without_proof}", self.bare);
        let client_key = scram::client_key(&salted);
        let client_signature =
            scram::hmac(&scram::stored_key(&client_key), auth_message.as_bytes());
        let proof = scram::xor(&client_key, &client_signature);
        let server_signature = scram::hmac(&scram::server_key(&salted), auth_message.as_bytes());
        let last = format!("{without_proof},p={}", message::b64(&proof));
        Ok((ClientFinal { server_signature }, last))
    }
}

impl ClientFinal {
    /// Checks the `server-final-message`: `Ok` only for the server's
    /// signature over this exchange.
    pub fn verify(self, server_final: &str) -> Result<(), ScramError> {
        match message::parse_server_final(server_final)? {
            ServerFinal::Error(value) => Err(ScramError::ServerRefused(value)),
            ServerFinal::Verifier(signature) => {
                if scram::same(&signature, &self.server_signature) {
                    Ok(())
                } else {
                    Err(ScramError::InvalidServerSignature)
                }
            }
        }
    }
}
