//! The token issuer's public keys, api keys 410 to 412 (ADR 0152): add,
//! remove and list the keys bearer tokens (402 `token_authenticate`) are
//! verified under. `docs/protocol.md` §10.4 describes them byte by byte.
//!
//! A key travels as its key id (`kid`, what a token's header names), its
//! JWS algorithm name (`EdDSA`, `ES256`, `ES384`, `RS256`, `RS384`,
//! `RS512`, `PS256`, `PS384`, `PS512`) and its public key as
//! SubjectPublicKeyInfo PEM text. Only public keys: the issuer's private
//! key never reaches a broker.

use serde::{Deserialize, Serialize};

use crate::error::WireError;
use crate::limits::STATE_BYTES_MAX;
use crate::messages::{Message, check_len};

/// The longest key id, in bytes.
pub const KID_BYTES_MAX: usize = 64;
/// The longest public key PEM, in bytes.
pub const PUBLIC_KEY_PEM_BYTES_MAX: usize = 4096;
/// The most keys one `list_token_keys` answer carries.
pub const TOKEN_KEYS_MAX: usize = 64;

fn check_kid(kid: &str) -> Result<(), WireError> {
    if kid.is_empty() {
        return Err(WireError::InvalidField {
            field: "kid",
            reason: "empty",
        });
    }
    check_len("kid", kid.len(), KID_BYTES_MAX)
}

/// One issuer key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TokenKeyText {
    pub kid: String,
    /// The JWS algorithm name.
    pub algorithm: String,
    /// `-----BEGIN PUBLIC KEY-----` PEM.
    pub public_key_pem: String,
    /// When the key was added (answers only; ignored in a request).
    #[serde(default)]
    pub added_at_ms: u64,
}

impl TokenKeyText {
    fn check(&self) -> Result<(), WireError> {
        check_kid(&self.kid)?;
        check_len("algorithm", self.algorithm.len(), STATE_BYTES_MAX)?;
        check_len(
            "public_key_pem",
            self.public_key_pem.len(),
            PUBLIC_KEY_PEM_BYTES_MAX,
        )
    }
}

/// 410 `put_token_key` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PutTokenKeyRequest {
    pub key: TokenKeyText,
}

impl Message for PutTokenKeyRequest {
    const NAME: &'static str = "put_token_key_request";
    fn check(&self) -> Result<(), WireError> {
        self.key.check()
    }
}

/// 410 `put_token_key` response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PutTokenKeyResponse {
    pub kid: String,
    /// `false` when the very same key was there already (a retry).
    pub changed: bool,
}

impl Message for PutTokenKeyResponse {
    const NAME: &'static str = "put_token_key_response";
    fn check(&self) -> Result<(), WireError> {
        check_kid(&self.kid)
    }
}

/// 411 `delete_token_key` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DeleteTokenKeyRequest {
    pub kid: String,
}

impl Message for DeleteTokenKeyRequest {
    const NAME: &'static str = "delete_token_key_request";
    fn check(&self) -> Result<(), WireError> {
        check_kid(&self.kid)
    }
}

/// 411 `delete_token_key` response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DeleteTokenKeyResponse {
    pub kid: String,
}

impl Message for DeleteTokenKeyResponse {
    const NAME: &'static str = "delete_token_key_response";
    fn check(&self) -> Result<(), WireError> {
        check_kid(&self.kid)
    }
}

/// 412 `list_token_keys` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ListTokenKeysRequest {}

impl Message for ListTokenKeysRequest {
    const NAME: &'static str = "list_token_keys_request";
    fn check(&self) -> Result<(), WireError> {
        Ok(())
    }
}

/// 412 `list_token_keys` response, in key id order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ListTokenKeysResponse {
    pub keys: Vec<TokenKeyText>,
}

impl Message for ListTokenKeysResponse {
    const NAME: &'static str = "list_token_keys_response";
    fn check(&self) -> Result<(), WireError> {
        check_len("keys", self.keys.len(), TOKEN_KEYS_MAX)?;
        self.keys.iter().try_for_each(TokenKeyText::check)
    }
}
