//! The SDK's SCRAM-SHA-256 login (ADR 0150): `malachi-core`'s client side
//! of the exchange behind `malachi-wire`'s [`Authenticator`] seam (the two
//! crates do not depend on each other, so the adapter lives here, where
//! both are), and the credential the CLI derives from a password for
//! `put_user`, so a password never reaches a broker.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use malachi_core::auth::scram::{self, ITERATIONS_DEFAULT, MECHANISM, SALT_BYTES};
use malachi_core::auth::scram_client::{ClientFinal, ClientFirst, ScramClient};
use malachi_wire::auth_admin::UserCredential;
use malachi_wire::client::{AuthSession, Authenticator, Login};

/// Random bytes in a client nonce (base64: 24 printable bytes).
const CLIENT_NONCE_RANDOM_BYTES: usize = 18;

/// A user name and password to log in with. `Debug` hides the password.
#[derive(Clone)]
pub struct ScramLogin {
    user: String,
    password: Vec<u8>,
}

impl std::fmt::Debug for ScramLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramLogin")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl ScramLogin {
    pub fn new(user: &str, password: &[u8]) -> ScramLogin {
        ScramLogin {
            user: user.to_owned(),
            password: password.to_vec(),
        }
    }

    /// As a client's `login` setting.
    pub fn into_login(self) -> Login {
        Login(Arc::new(self))
    }
}

fn random_b64(bytes: usize) -> Result<String, String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| format!("no os randomness: {e}"))?;
    Ok(STANDARD.encode(buf))
}

impl Authenticator for ScramLogin {
    fn mechanism(&self) -> &str {
        MECHANISM
    }

    fn start(&self) -> Result<(Box<dyn AuthSession>, String), String> {
        let nonce = random_b64(CLIENT_NONCE_RANDOM_BYTES)?;
        let (first, message) = ScramClient::start(&self.user, &nonce).map_err(|e| e.to_string())?;
        let session = ScramSession {
            password: self.password.clone(),
            state: State::First(first),
        };
        Ok((Box::new(session), message))
    }
}

enum State {
    First(ClientFirst),
    Final(ClientFinal),
    Done,
}

struct ScramSession {
    password: Vec<u8>,
    state: State,
}

impl AuthSession for ScramSession {
    fn step(&mut self, server: &str, complete: bool) -> Result<Option<String>, String> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::First(first) if !complete => {
                let (last, message) = first
                    .receive(server, &self.password)
                    .map_err(|e| e.to_string())?;
                self.state = State::Final(last);
                Ok(Some(message))
            }
            State::Final(last) if complete => {
                last.verify(server).map_err(|e| {
                    format!("the broker did not prove it knows the credential: {e}")
                })?;
                Ok(None)
            }
            _ => Err("the broker's login exchange is out of step".into()),
        }
    }
}

/// The credential `put_user` carries for `password`: a fresh random salt
/// and `iterations` (the default if `None`). Runs PBKDF2: call it off
/// async threads.
pub fn derive_credential(
    password: &[u8],
    iterations: Option<u32>,
) -> Result<UserCredential, String> {
    let mut salt = [0u8; SALT_BYTES];
    getrandom::fill(&mut salt).map_err(|e| format!("no os randomness: {e}"))?;
    let iterations = iterations.unwrap_or(ITERATIONS_DEFAULT);
    let credential = scram::StoredCredential::from_password(password, &salt, iterations)
        .map_err(|e| e.to_string())?;
    Ok(UserCredential {
        salt: STANDARD.encode(&credential.salt),
        iterations,
        stored_key: STANDARD.encode(credential.stored_key),
        server_key: STANDARD.encode(credential.server_key),
    })
}
