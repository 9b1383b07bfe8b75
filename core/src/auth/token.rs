//! Bearer tokens (ADR 0152): JSON Web Tokens (RFC 7519) signed by an
//! issuer whose public keys the cluster keeps (`TokenKey`, in the ring's
//! admin store), verified through `jsonwebtoken` over aws-lc-rs.
//!
//! The rules, in the order [`verify`] applies them:
//! - at most [`TOKEN_BYTES_MAX`] bytes, three base64url parts;
//! - the header's `alg` must be one of the configured algorithms, all of
//!   them asymmetric: `none` is [`TokenError::Unsigned`], and HMAC
//!   (`HS256`...) is never accepted, so a public key can never be used as
//!   a shared secret (the classic algorithm switch);
//! - the header's `kid` names a stored key, and the token's `alg` must be
//!   exactly that key's algorithm ([`TokenError::AlgorithmMismatch`]);
//! - the signature verifies under that key;
//! - `sub` and `exp` are present (integers, seconds since the epoch);
//!   `exp` and `nbf` hold at `now_ms` within `clock_skew_ms`; `aud`, if
//!   configured, is required and must match.
//!
//! Pure like the rest of `auth`: the time is an argument. Minting
//! ([`mint`]) is for operators and tests; ECDSA and RSA-PSS signatures
//! draw their nonce inside aws-lc.

use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// The longest token, in bytes (the wire's bound, `TOKEN_BYTES_MAX`;
/// `TokenError::TooLong` says the number).
pub const TOKEN_BYTES_MAX: usize = 8192;
/// The longest key id, in bytes (`TokenError::InvalidKid` says it).
pub const KID_BYTES_MAX: usize = 64;
/// The longest issuer public key (PEM text), in bytes: an RSA-4096 key
/// in SPKI PEM is about 800.
pub const PUBLIC_KEY_PEM_BYTES_MAX: usize = 4096;
/// The most issuer keys the store holds (rotation needs two or three).
pub const TOKEN_KEYS_MAX: usize = 64;
/// The largest allowed clock skew for `exp` and `nbf`, in milliseconds.
pub const CLOCK_SKEW_MS_MAX: u64 = 300_000;
/// The longest configured audience, in bytes.
pub const AUDIENCE_BYTES_MAX: usize = 255;

/// An asymmetric JWS algorithm a token may be signed with. HMAC is not
/// one: its "key" would be a secret every broker shares with the issuer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TokenAlgorithm {
    EdDSA,
    ES256,
    ES384,
    RS256,
    RS384,
    RS512,
    PS256,
    PS384,
    PS512,
}

/// Every algorithm, in declaration order.
pub const TOKEN_ALGORITHMS: [TokenAlgorithm; 9] = [
    TokenAlgorithm::EdDSA,
    TokenAlgorithm::ES256,
    TokenAlgorithm::ES384,
    TokenAlgorithm::RS256,
    TokenAlgorithm::RS384,
    TokenAlgorithm::RS512,
    TokenAlgorithm::PS256,
    TokenAlgorithm::PS384,
    TokenAlgorithm::PS512,
];

impl TokenAlgorithm {
    /// The JWS name (`alg`), e.g. `EdDSA`.
    pub fn name(self) -> &'static str {
        match self {
            TokenAlgorithm::EdDSA => "EdDSA",
            TokenAlgorithm::ES256 => "ES256",
            TokenAlgorithm::ES384 => "ES384",
            TokenAlgorithm::RS256 => "RS256",
            TokenAlgorithm::RS384 => "RS384",
            TokenAlgorithm::RS512 => "RS512",
            TokenAlgorithm::PS256 => "PS256",
            TokenAlgorithm::PS384 => "PS384",
            TokenAlgorithm::PS512 => "PS512",
        }
    }

    /// The algorithm of a JWS name, exactly as spelled.
    pub fn from_name(name: &str) -> Option<TokenAlgorithm> {
        TOKEN_ALGORITHMS.into_iter().find(|a| a.name() == name)
    }

    fn jwt(self) -> Algorithm {
        match self {
            TokenAlgorithm::EdDSA => Algorithm::EdDSA,
            TokenAlgorithm::ES256 => Algorithm::ES256,
            TokenAlgorithm::ES384 => Algorithm::ES384,
            TokenAlgorithm::RS256 => Algorithm::RS256,
            TokenAlgorithm::RS384 => Algorithm::RS384,
            TokenAlgorithm::RS512 => Algorithm::RS512,
            TokenAlgorithm::PS256 => Algorithm::PS256,
            TokenAlgorithm::PS384 => Algorithm::PS384,
            TokenAlgorithm::PS512 => Algorithm::PS512,
        }
    }
}

impl std::fmt::Display for TokenAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One issuer public key: what verifies tokens whose header names `kid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenKey {
    pub kid: String,
    pub algorithm: TokenAlgorithm,
    /// The public key, SubjectPublicKeyInfo PEM (`-----BEGIN PUBLIC KEY-----`).
    pub public_key_pem: String,
    pub added_at_ms: u64,
}

impl TokenKey {
    /// The key as `jsonwebtoken` verifies with; refused if the PEM is not
    /// a public key of the algorithm's family.
    pub fn decoding_key(&self) -> Result<DecodingKey, TokenError> {
        let pem = self.public_key_pem.as_bytes();
        let key = match self.algorithm {
            TokenAlgorithm::EdDSA => DecodingKey::from_ed_pem(pem),
            TokenAlgorithm::ES256 | TokenAlgorithm::ES384 => DecodingKey::from_ec_pem(pem),
            _ => DecodingKey::from_rsa_pem(pem),
        };
        key.map_err(|e| TokenError::InvalidKey {
            kid: self.kid.clone(),
            reason: e.to_string(),
        })
    }

    /// Checks the key's bounds and that its PEM is a public key of its
    /// algorithm's family.
    pub fn check(&self) -> Result<(), TokenError> {
        check_kid(&self.kid)?;
        if self.public_key_pem.is_empty() || self.public_key_pem.len() > PUBLIC_KEY_PEM_BYTES_MAX {
            return Err(TokenError::InvalidKey {
                kid: self.kid.clone(),
                reason: format!(
                    "a public key of {} bytes is not within 1..={PUBLIC_KEY_PEM_BYTES_MAX}",
                    self.public_key_pem.len()
                ),
            });
        }
        self.decoding_key().map(|_| ())
    }
}

/// Checks a key id: 1 to [`KID_BYTES_MAX`] bytes of ASCII letters,
/// digits, `.`, `_` and `-`.
pub fn check_kid(kid: &str) -> Result<(), TokenError> {
    let fine = !kid.is_empty()
        && kid.len() <= KID_BYTES_MAX
        && kid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if fine {
        Ok(())
    } else {
        Err(TokenError::InvalidKid {
            kid: kid.chars().take(KID_BYTES_MAX).collect(),
        })
    }
}

/// How tokens are judged: the broker's `security.token_*` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenPolicy {
    /// The algorithms accepted; at least one.
    pub algorithms: Vec<TokenAlgorithm>,
    /// How far `exp` and `nbf` may be off, in milliseconds.
    pub clock_skew_ms: u64,
    /// If set, `aud` must be present and name it.
    pub audience: Option<String>,
}

/// A token that verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedToken {
    /// The `sub` claim, as given (the caller checks it is a user name).
    pub subject: String,
    /// `exp`, in milliseconds since the epoch.
    pub expires_at_ms: u64,
    /// The key it verified under.
    pub kid: String,
    /// That key, as the store held it (a session rests on it, ADR 0157).
    pub key: std::sync::Arc<TokenKey>,
}

/// Why a token was refused. The `Display` text starts with a stable code
/// (`token-expired: ...`), which the broker sends back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token-malformed: {0}")]
    Malformed(String),
    #[error("token-too-long: {bytes} bytes, at most 8192")]
    TooLong { bytes: usize },
    #[error("token-unsigned: alg \"none\" is never accepted")]
    Unsigned,
    #[error("token-algorithm-not-allowed: {alg:?} is not one of {allowed}")]
    AlgorithmNotAllowed { alg: String, allowed: String },
    #[error("token-algorithm-mismatch: the token says {token} but key {kid:?} is {key}")]
    AlgorithmMismatch {
        token: TokenAlgorithm,
        kid: String,
        key: TokenAlgorithm,
    },
    #[error("token-kid-missing: the header names no key (kid)")]
    MissingKid,
    #[error("token-kid-invalid: {kid:?} is not 1 to 64 bytes of [A-Za-z0-9._-]")]
    InvalidKid { kid: String },
    #[error("token-kid-unknown: no issuer key {kid:?}")]
    UnknownKid { kid: String },
    #[error("token-key-invalid: key {kid:?}: {reason}")]
    InvalidKey { kid: String, reason: String },
    #[error("token-invalid-signature: the signature does not verify under key {kid:?}")]
    BadSignature { kid: String },
    #[error("token-claim-missing: the token has no {0:?} claim")]
    MissingClaim(&'static str),
    #[error("token-audience: the token is not for this cluster's audience")]
    WrongAudience,
    #[error("token-expired: expired at {expires_at_ms} ms, now {now_ms} ms (skew {skew_ms} ms)")]
    Expired {
        expires_at_ms: u64,
        now_ms: u64,
        skew_ms: u64,
    },
    #[error(
        "token-not-yet-valid: valid from {not_before_ms} ms, now {now_ms} ms (skew {skew_ms} ms)"
    )]
    NotYetValid {
        not_before_ms: u64,
        now_ms: u64,
        skew_ms: u64,
    },
    #[error("token-subject-invalid: {0}")]
    InvalidSubject(String),
}

impl TokenError {
    /// The stable code the message starts with.
    pub fn code(&self) -> &'static str {
        match self {
            TokenError::Malformed(_) => "token-malformed",
            TokenError::TooLong { .. } => "token-too-long",
            TokenError::Unsigned => "token-unsigned",
            TokenError::AlgorithmNotAllowed { .. } => "token-algorithm-not-allowed",
            TokenError::AlgorithmMismatch { .. } => "token-algorithm-mismatch",
            TokenError::MissingKid => "token-kid-missing",
            TokenError::InvalidKid { .. } => "token-kid-invalid",
            TokenError::UnknownKid { .. } => "token-kid-unknown",
            TokenError::InvalidKey { .. } => "token-key-invalid",
            TokenError::BadSignature { .. } => "token-invalid-signature",
            TokenError::MissingClaim(_) => "token-claim-missing",
            TokenError::WrongAudience => "token-audience",
            TokenError::Expired { .. } => "token-expired",
            TokenError::NotYetValid { .. } => "token-not-yet-valid",
            TokenError::InvalidSubject(_) => "token-subject-invalid",
        }
    }
}

/// The header fields read before anything is verified.
#[derive(Debug, Deserialize)]
struct RawHeader {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

/// The claims the broker reads.
#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sub: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exp: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nbf: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iat: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    aud: Option<String>,
}

/// The header's `alg` and `kid`, unverified: enough to pick the key.
fn peek_header(token: &str) -> Result<RawHeader, TokenError> {
    if token.len() > TOKEN_BYTES_MAX {
        return Err(TokenError::TooLong { bytes: token.len() });
    }
    let parts: Vec<&str> = token.split('.').collect();
    if parts.len() != 3 {
        return Err(TokenError::Malformed(format!(
            "{} parts separated by '.', not 3",
            parts.len()
        )));
    }
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(parts[0])
        .map_err(|e| TokenError::Malformed(format!("the header is not base64url: {e}")))?;
    serde_json::from_slice(&json)
        .map_err(|e| TokenError::Malformed(format!("the header is not a JWS header: {e}")))
}

/// The `sub` a token claims, unverified: only for keying the lockout
/// before the signature is checked (a forged token then slows and locks
/// only its claimed principal from its own source).
pub fn claimed_subject(token: &str) -> Option<String> {
    if token.len() > TOKEN_BYTES_MAX {
        return None;
    }
    let payload = token.split('.').nth(1)?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()?;
    serde_json::from_slice::<Claims>(&json).ok()?.sub
}

/// The algorithm the header names, if the policy accepts it.
fn allowed_algorithm(alg: &str, policy: &TokenPolicy) -> Result<TokenAlgorithm, TokenError> {
    if alg.eq_ignore_ascii_case("none") {
        return Err(TokenError::Unsigned);
    }
    TokenAlgorithm::from_name(alg)
        .filter(|a| policy.algorithms.contains(a))
        .ok_or_else(|| TokenError::AlgorithmNotAllowed {
            alg: alg.chars().take(32).collect(),
            allowed: policy
                .algorithms
                .iter()
                .map(|a| a.name())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Verifies `token` under the key its `kid` names (`key_of`) and the
/// policy, at `now_ms`.
pub fn verify<'k>(
    token: &str,
    key_of: impl Fn(&str) -> Option<&'k TokenKey>,
    policy: &TokenPolicy,
    now_ms: u64,
) -> Result<VerifiedToken, TokenError> {
    let header = peek_header(token)?;
    let alg = allowed_algorithm(&header.alg, policy)?;
    let kid = header.kid.ok_or(TokenError::MissingKid)?;
    check_kid(&kid)?;
    let key = key_of(&kid).ok_or_else(|| TokenError::UnknownKid { kid: kid.clone() })?;
    if key.algorithm != alg {
        return Err(TokenError::AlgorithmMismatch {
            token: alg,
            kid,
            key: key.algorithm,
        });
    }
    let claims = verified_claims(token, key, policy)?;
    let subject = claims.sub.ok_or(TokenError::MissingClaim("sub"))?;
    let expires_at_ms = claims
        .exp
        .ok_or(TokenError::MissingClaim("exp"))?
        .saturating_mul(1000);
    let skew_ms = policy.clock_skew_ms;
    if now_ms > expires_at_ms.saturating_add(skew_ms) {
        return Err(TokenError::Expired {
            expires_at_ms,
            now_ms,
            skew_ms,
        });
    }
    if let Some(nbf) = claims.nbf {
        let not_before_ms = nbf.saturating_mul(1000);
        if not_before_ms > now_ms.saturating_add(skew_ms) {
            return Err(TokenError::NotYetValid {
                not_before_ms,
                now_ms,
                skew_ms,
            });
        }
    }
    Ok(VerifiedToken {
        subject,
        expires_at_ms,
        kid,
        key: std::sync::Arc::new(key.clone()),
    })
}

/// The signature checked by `jsonwebtoken` under exactly `key`'s
/// algorithm; the times are checked by the caller against its clock.
fn verified_claims(
    token: &str,
    key: &TokenKey,
    policy: &TokenPolicy,
) -> Result<Claims, TokenError> {
    let decoding = key.decoding_key()?;
    let mut validation = Validation::new(key.algorithm.jwt());
    validation.set_required_spec_claims::<&str>(&[]);
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = policy.audience.is_some();
    if let Some(audience) = &policy.audience {
        validation.set_audience(&[audience]);
        validation.set_required_spec_claims(&["aud"]);
    }
    jsonwebtoken::decode::<Claims>(token, &decoding, &validation)
        .map(|data| data.claims)
        .map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            match e.kind() {
                ErrorKind::InvalidSignature => TokenError::BadSignature {
                    kid: key.kid.clone(),
                },
                ErrorKind::InvalidAudience | ErrorKind::MissingRequiredClaim(_) => {
                    TokenError::WrongAudience
                }
                _ => TokenError::Malformed(e.to_string()),
            }
        })
}

/// What [`mint`] signs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MintRequest<'a> {
    pub algorithm: TokenAlgorithm,
    pub kid: &'a str,
    pub subject: &'a str,
    /// `iat` (and `nbf`, unless `not_before_ms`), in milliseconds.
    pub now_ms: u64,
    /// `exp - iat`, in milliseconds.
    pub lifetime_ms: u64,
    pub not_before_ms: Option<u64>,
    pub audience: Option<&'a str>,
}

/// Signs a token with `private_key_pem` (PKCS#8 PEM; `EC PRIVATE KEY` and
/// `RSA PRIVATE KEY` as well).
pub fn mint(private_key_pem: &[u8], request: &MintRequest<'_>) -> Result<String, TokenError> {
    check_kid(request.kid)?;
    let invalid = |e: jsonwebtoken::errors::Error| TokenError::InvalidKey {
        kid: request.kid.to_owned(),
        reason: e.to_string(),
    };
    let key = match request.algorithm {
        TokenAlgorithm::EdDSA => EncodingKey::from_ed_pem(private_key_pem),
        TokenAlgorithm::ES256 | TokenAlgorithm::ES384 => EncodingKey::from_ec_pem(private_key_pem),
        _ => EncodingKey::from_rsa_pem(private_key_pem),
    }
    .map_err(invalid)?;
    let mut header = Header::new(request.algorithm.jwt());
    header.typ = Some("JWT".to_owned());
    header.kid = Some(request.kid.to_owned());
    let iat = request.now_ms / 1000;
    let claims = Claims {
        sub: Some(request.subject.to_owned()),
        iat: Some(iat),
        nbf: Some(request.not_before_ms.map_or(iat, |ms| ms / 1000)),
        exp: Some(request.now_ms.saturating_add(request.lifetime_ms) / 1000),
        aud: request.audience.map(str::to_owned),
    };
    jsonwebtoken::encode(&header, &claims, &key).map_err(invalid)
}
