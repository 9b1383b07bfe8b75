//! Authentication messages, api keys 400 to 402 (ADR 0146): the formats a
//! client and a broker exchange to authenticate a connection.
//!
//! Brokers serve 400 and 401 (ADR 0150) and 402 (ADR 0152). The broker, the SDK and the CLI build on these definitions;
//! `docs/protocol.md` §10 describes the exchange byte by byte.
//!
//! Every message here is read before the client is authenticated, so each
//! bounds its whole payload ([`Message::PAYLOAD_BYTES_MAX`]) before
//! anything is decoded, and each field after.

use serde::{Deserialize, Serialize};

use crate::error::WireError;
use crate::limits::{NAME_BYTES_MAX, STATE_BYTES_MAX};
use crate::messages::{Message, check_len};

/// `sasl_handshake`: the client names its SASL mechanism.
pub const SASL_HANDSHAKE: u16 = 400;
/// `sasl_authenticate`: one round of the mechanism's exchange.
pub const SASL_AUTHENTICATE: u16 = 401;
/// `token_authenticate`: a bearer token (a JWT) in one round.
pub const TOKEN_AUTHENTICATE: u16 = 402;

/// The longest mechanism message, in bytes: a SCRAM message is at most
/// 2,048 (malachi-core's `auth::scram::MESSAGE_BYTES_MAX`).
pub const AUTH_BYTES_MAX: usize = 2048;
/// The longest token, in bytes.
pub const TOKEN_BYTES_MAX: usize = 8192;
/// The most mechanisms a handshake answer lists.
pub const MECHANISMS_MAX: usize = 16;
/// Room for a message's map, keys and length prefixes around its fields.
const FRAMING_BYTES: usize = 64;

/// The code an `unauthorized` message starts with when the connection's
/// session ended because its token expired (ADR 0154): the request wrote
/// nothing and may be sent again on a new connection, logged in afresh.
pub const SESSION_EXPIRED: &str = "session-expired";
/// The codes an `unauthorized` message starts with when the connection's
/// session ended (its token expired, its user was deleted, its password
/// changed, its token's issuer key was removed, ADR 0157): the broker
/// closes the connection after its answers, and the request wrote nothing
/// (`docs/protocol.md` §10.5).
pub const SESSION_ENDED_CODES: [&str; 4] = [
    SESSION_EXPIRED,
    "principal-removed",
    "credential-changed",
    "issuer-key-removed",
];

/// The session-ended code `message` (an `unauthorized` error's) starts
/// with, if any.
pub fn session_ended_code(message: &str) -> Option<&'static str> {
    SESSION_ENDED_CODES.into_iter().find(|code| {
        message
            .strip_prefix(code)
            .is_some_and(|rest| rest.starts_with(':'))
    })
}

fn check_mechanism(mechanism: &str) -> Result<(), WireError> {
    if mechanism.is_empty() {
        return Err(WireError::InvalidField {
            field: "mechanism",
            reason: "empty",
        });
    }
    check_len("mechanism", mechanism.len(), STATE_BYTES_MAX)
}

fn check_principal(principal: &str) -> Result<(), WireError> {
    if principal.is_empty() {
        return Err(WireError::InvalidField {
            field: "principal",
            reason: "empty",
        });
    }
    // `User:` and a name.
    check_len("principal", principal.len(), NAME_BYTES_MAX + 5)
}

/// 400 `sasl_handshake` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SaslHandshakeRequest {
    /// `SCRAM-SHA-256`.
    pub mechanism: String,
}

impl Message for SaslHandshakeRequest {
    const NAME: &'static str = "sasl_handshake_request";
    const PAYLOAD_BYTES_MAX: Option<usize> = Some(STATE_BYTES_MAX + FRAMING_BYTES);
    fn check(&self) -> Result<(), WireError> {
        check_mechanism(&self.mechanism)
    }
}

/// 400 `sasl_handshake` response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SaslHandshakeResponse {
    /// Whether the requested mechanism is enabled; `sasl_authenticate`
    /// may follow only if it is.
    pub accepted: bool,
    /// The mechanisms this broker enables, so a client can choose again.
    pub mechanisms: Vec<String>,
}

impl Message for SaslHandshakeResponse {
    const NAME: &'static str = "sasl_handshake_response";
    const PAYLOAD_BYTES_MAX: Option<usize> =
        Some(MECHANISMS_MAX * (STATE_BYTES_MAX + 2) + FRAMING_BYTES);
    fn check(&self) -> Result<(), WireError> {
        check_len("mechanisms", self.mechanisms.len(), MECHANISMS_MAX)?;
        self.mechanisms.iter().try_for_each(|m| check_mechanism(m))
    }
}

/// 401 `sasl_authenticate` request: the client's next mechanism message
/// (for SCRAM, the `client-first-message`, then the `client-final-message`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SaslAuthenticateRequest {
    pub auth_bytes: String,
}

impl Message for SaslAuthenticateRequest {
    const NAME: &'static str = "sasl_authenticate_request";
    const PAYLOAD_BYTES_MAX: Option<usize> = Some(AUTH_BYTES_MAX + FRAMING_BYTES);
    fn check(&self) -> Result<(), WireError> {
        check_len("auth_bytes", self.auth_bytes.len(), AUTH_BYTES_MAX)
    }
}

/// 401 `sasl_authenticate` response: the broker's next mechanism message
/// (the `server-first-message`, then the `server-final-message`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SaslAuthenticateResponse {
    pub auth_bytes: String,
    /// `true` on the last round: the connection is authenticated as
    /// `principal` once the client has verified `auth_bytes`.
    pub complete: bool,
    /// `User:name`, on the last round.
    #[serde(default)]
    pub principal: Option<String>,
    /// How long the authentication holds before the client must
    /// authenticate again; absent: for the connection's life.
    #[serde(default)]
    pub session_lifetime_ms: Option<u64>,
}

impl Message for SaslAuthenticateResponse {
    const NAME: &'static str = "sasl_authenticate_response";
    const PAYLOAD_BYTES_MAX: Option<usize> =
        Some(AUTH_BYTES_MAX + NAME_BYTES_MAX + 5 + 2 * FRAMING_BYTES);
    fn check(&self) -> Result<(), WireError> {
        check_len("auth_bytes", self.auth_bytes.len(), AUTH_BYTES_MAX)?;
        match (&self.principal, self.complete) {
            (Some(principal), true) => check_principal(principal),
            (None, false) => Ok(()),
            _ => Err(WireError::InvalidField {
                field: "principal",
                reason: "set exactly when complete",
            }),
        }
    }
}

/// 402 `token_authenticate` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TokenAuthenticateRequest {
    /// A JWT in its compact form.
    pub token: String,
}

impl Message for TokenAuthenticateRequest {
    const NAME: &'static str = "token_authenticate_request";
    const PAYLOAD_BYTES_MAX: Option<usize> = Some(TOKEN_BYTES_MAX + FRAMING_BYTES);
    fn check(&self) -> Result<(), WireError> {
        if self.token.is_empty() {
            return Err(WireError::InvalidField {
                field: "token",
                reason: "empty",
            });
        }
        check_len("token", self.token.len(), TOKEN_BYTES_MAX)
    }
}

/// 402 `token_authenticate` response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TokenAuthenticateResponse {
    /// `User:name`, the token's subject.
    pub principal: String,
    /// Until the token's `exp`, from now.
    #[serde(default)]
    pub session_lifetime_ms: Option<u64>,
}

impl Message for TokenAuthenticateResponse {
    const NAME: &'static str = "token_authenticate_response";
    const PAYLOAD_BYTES_MAX: Option<usize> = Some(NAME_BYTES_MAX + 5 + FRAMING_BYTES);
    fn check(&self) -> Result<(), WireError> {
        check_principal(&self.principal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn each_message_round_trips() {
        let request = SaslAuthenticateRequest {
            auth_bytes: "n,,n=user,r=rOprNGfwEbeRWgbNEkqO".into(),
        };
        let decoded = SaslAuthenticateRequest::decode(request.encode().unwrap()).unwrap();
        assert_eq!(decoded, request);
        let response = SaslAuthenticateResponse {
            auth_bytes: "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".into(),
            complete: true,
            principal: Some("User:user".into()),
            session_lifetime_ms: None,
        };
        let decoded = SaslAuthenticateResponse::decode(response.encode().unwrap()).unwrap();
        assert_eq!(decoded, response);
    }

    #[test]
    fn an_oversized_payload_is_refused_before_decoding() {
        let huge = Bytes::from(vec![0xa0u8; AUTH_BYTES_MAX + FRAMING_BYTES + 1]);
        assert!(matches!(
            SaslAuthenticateRequest::decode(huge),
            Err(WireError::OverLimit {
                field: "payload",
                ..
            })
        ));
        let token = TokenAuthenticateRequest {
            token: "x".repeat(TOKEN_BYTES_MAX + 1),
        };
        assert!(token.encode().is_err());
        // The largest valid message still fits its payload bound.
        let biggest = SaslAuthenticateResponse {
            auth_bytes: "x".repeat(AUTH_BYTES_MAX),
            complete: true,
            principal: Some(format!("User:{}", "n".repeat(NAME_BYTES_MAX))),
            session_lifetime_ms: Some(u64::MAX),
        };
        let bytes = biggest.encode().unwrap();
        assert_eq!(SaslAuthenticateResponse::decode(bytes).unwrap(), biggest);
        let listing = SaslHandshakeResponse {
            accepted: true,
            mechanisms: vec!["m".repeat(STATE_BYTES_MAX); MECHANISMS_MAX],
        };
        assert_eq!(
            SaslHandshakeResponse::decode(listing.encode().unwrap()).unwrap(),
            listing
        );
        let token = TokenAuthenticateRequest {
            token: "t".repeat(TOKEN_BYTES_MAX),
        };
        assert_eq!(
            TokenAuthenticateRequest::decode(token.encode().unwrap()).unwrap(),
            token
        );
    }

    #[test]
    fn bad_fields_are_refused() {
        let incomplete_principal = SaslAuthenticateResponse {
            auth_bytes: "r=abc".into(),
            complete: false,
            principal: Some("User:a".into()),
            session_lifetime_ms: None,
        };
        assert!(incomplete_principal.encode().is_err());
        let empty = SaslHandshakeRequest::default();
        assert!(empty.encode().is_err());
        assert!(TokenAuthenticateRequest::default().encode().is_err());
        assert!(TokenAuthenticateResponse::default().encode().is_err());
    }

    #[test]
    fn a_session_ending_is_told_by_its_code_and_colon_only() {
        assert_eq!(
            session_ended_code("session-expired: the token expired at 1 ms"),
            Some(SESSION_EXPIRED)
        );
        assert_eq!(
            session_ended_code("principal-removed: user \"bob\" was deleted"),
            Some("principal-removed")
        );
        assert_eq!(
            session_ended_code("credential-changed: the password changed"),
            Some("credential-changed")
        );
        for other in [
            "authentication failed: token-expired: expired at 1 ms",
            "User:bob may not produce topic `session-expired:`",
            "session-expired",
            "session-expiredx: no",
            "",
        ] {
            assert_eq!(session_ended_code(other), None, "{other}");
        }
    }

    #[test]
    fn the_keys_keep_their_numbers() {
        use crate::api::ApiKey;
        assert_eq!(ApiKey::SaslHandshake.code(), SASL_HANDSHAKE);
        assert_eq!(ApiKey::SaslAuthenticate.code(), SASL_AUTHENTICATE);
        assert_eq!(ApiKey::TokenAuthenticate.code(), TOKEN_AUTHENTICATE);
    }
}
