//! Bearer tokens (ADR 0152): what `auth::token::verify` accepts and each
//! refusal as its typed error.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use malachi_core::auth::token::{
    MintRequest, TokenAlgorithm, TokenError, TokenKey, TokenPolicy, VerifiedToken, claimed_subject,
    mint, verify,
};

const ED_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIB3i8a/0zHz5j0J/vzyE0wfpugyLequZ5U8ngjqFqjQb
-----END PRIVATE KEY-----
";
const ED_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAhfKbHyBGFxlhsTvSzKBzfmLhNyYf7N7HRBxRqKlD3q8=
-----END PUBLIC KEY-----
";
/// Another Ed25519 key: a token it signs does not verify under `ED_PUBLIC`.
const OTHER_ED_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIO3yfyaSIwiIyBVgJRAvt7t1iR11g2akPN6T94D/VKh6
-----END PRIVATE KEY-----
";
const P256_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgUE4dWKgkmDaCyksx
936NgXfsV7cHxZbJJOgRTGLJCYahRANCAAQWpvLq7I3xJFdMT+qF456p1Cd1vaNP
Nr9ViYfQPghtNFs4OQy45EA8kaLZeFdEM1m1rVCNP08gBFACvajqCN4M
-----END PRIVATE KEY-----
";
const P256_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEFqby6uyN8SRXTE/qheOeqdQndb2j
Tza/VYmH0D4IbTRbODkMuORAPJGi2XhXRDNZta1QjT9PIARQAr2o6gjeDA==
-----END PUBLIC KEY-----
";

const NOW_MS: u64 = 1_800_000_000_000;
const HOUR_MS: u64 = 3_600_000;

fn ed_key() -> TokenKey {
    TokenKey {
        kid: "k1".into(),
        algorithm: TokenAlgorithm::EdDSA,
        public_key_pem: ED_PUBLIC.into(),
        added_at_ms: 0,
    }
}

fn es_key() -> TokenKey {
    TokenKey {
        kid: "e1".into(),
        algorithm: TokenAlgorithm::ES256,
        public_key_pem: P256_PUBLIC.into(),
        added_at_ms: 0,
    }
}

fn policy(algorithms: &[TokenAlgorithm]) -> TokenPolicy {
    TokenPolicy {
        algorithms: algorithms.to_vec(),
        clock_skew_ms: 30_000,
        audience: None,
    }
}

fn request(kid: &str) -> MintRequest<'_> {
    MintRequest {
        algorithm: TokenAlgorithm::EdDSA,
        kid,
        subject: "alice",
        now_ms: NOW_MS,
        lifetime_ms: HOUR_MS,
        not_before_ms: None,
        audience: None,
    }
}

fn check(token: &str, policy: &TokenPolicy, now_ms: u64) -> Result<VerifiedToken, TokenError> {
    let keys = [ed_key(), es_key()];
    verify(
        token,
        |kid| keys.iter().find(|k| k.kid == kid),
        policy,
        now_ms,
    )
}

fn b64(json: &str) -> String {
    URL_SAFE_NO_PAD.encode(json)
}

#[test]
fn a_minted_token_verifies_as_its_subject() {
    let token = mint(ED_PRIVATE.as_bytes(), &request("k1")).unwrap();
    let verified = check(&token, &policy(&[TokenAlgorithm::EdDSA]), NOW_MS).unwrap();
    assert_eq!(verified.subject, "alice");
    assert_eq!(verified.kid, "k1");
    assert_eq!(verified.expires_at_ms, NOW_MS + HOUR_MS);
    assert_eq!(claimed_subject(&token).as_deref(), Some("alice"));
    // ES256, when configured and stored.
    let es = MintRequest {
        algorithm: TokenAlgorithm::ES256,
        ..request("e1")
    };
    let token = mint(P256_PRIVATE.as_bytes(), &es).unwrap();
    let both = policy(&[TokenAlgorithm::EdDSA, TokenAlgorithm::ES256]);
    assert_eq!(check(&token, &both, NOW_MS).unwrap().subject, "alice");
}

#[test]
fn a_bad_signature_is_refused() {
    let token = mint(OTHER_ED_PRIVATE.as_bytes(), &request("k1")).unwrap();
    let refused = check(&token, &policy(&[TokenAlgorithm::EdDSA]), NOW_MS).unwrap_err();
    assert_eq!(refused, TokenError::BadSignature { kid: "k1".into() });
    // A claim changed after signing.
    let token = mint(ED_PRIVATE.as_bytes(), &request("k1")).unwrap();
    let parts: Vec<&str> = token.split('.').collect();
    let forged_claims = b64(r#"{"sub":"root","exp":1900000000}"#);
    let forged = format!("{}.{forged_claims}.{}", parts[0], parts[2]);
    let refused = check(&forged, &policy(&[TokenAlgorithm::EdDSA]), NOW_MS).unwrap_err();
    assert_eq!(refused.code(), "token-invalid-signature");
}

#[test]
fn alg_none_is_refused_whatever_the_spelling() {
    for alg in ["none", "None", "NONE"] {
        let header = b64(&format!(r#"{{"alg":"{alg}","kid":"k1"}}"#));
        let claims = b64(r#"{"sub":"alice","exp":1900000000}"#);
        let token = format!("{header}.{claims}.");
        let refused = check(&token, &policy(&[TokenAlgorithm::EdDSA]), NOW_MS).unwrap_err();
        assert_eq!(refused, TokenError::Unsigned, "{alg}");
    }
}

#[test]
fn an_algorithm_switch_is_refused() {
    // HS256 with the issuer's public key as the HMAC secret: the classic
    // switch. HMAC is never an accepted algorithm.
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some("k1".into());
    let claims = serde_json::json!({"sub": "alice", "exp": 1_900_000_000u64});
    let secret = jsonwebtoken::EncodingKey::from_secret(ED_PUBLIC.as_bytes()).unwrap();
    let token = jsonwebtoken::encode(&header, &claims, &secret).unwrap();
    let refused = check(&token, &policy(&[TokenAlgorithm::EdDSA]), NOW_MS).unwrap_err();
    assert!(
        matches!(&refused, TokenError::AlgorithmNotAllowed { alg, .. } if alg == "HS256"),
        "{refused}"
    );
    // An allowed algorithm, but not the named key's: ES256 against an
    // EdDSA key.
    let es = MintRequest {
        algorithm: TokenAlgorithm::ES256,
        ..request("k1")
    };
    let token = mint(P256_PRIVATE.as_bytes(), &es).unwrap();
    let both = policy(&[TokenAlgorithm::EdDSA, TokenAlgorithm::ES256]);
    let refused = check(&token, &both, NOW_MS).unwrap_err();
    assert_eq!(
        refused,
        TokenError::AlgorithmMismatch {
            token: TokenAlgorithm::ES256,
            kid: "k1".into(),
            key: TokenAlgorithm::EdDSA,
        }
    );
    // An algorithm the broker does not accept at all.
    let refused = check(&token, &policy(&[TokenAlgorithm::EdDSA]), NOW_MS).unwrap_err();
    assert_eq!(refused.code(), "token-algorithm-not-allowed");
}

#[test]
fn expiry_and_not_before_hold_within_the_skew() {
    let token = mint(ED_PRIVATE.as_bytes(), &request("k1")).unwrap();
    let p = policy(&[TokenAlgorithm::EdDSA]);
    let exp = NOW_MS + HOUR_MS;
    assert!(check(&token, &p, exp + 30_000).is_ok(), "within the skew");
    assert_eq!(
        check(&token, &p, exp + 30_001).unwrap_err(),
        TokenError::Expired {
            expires_at_ms: exp,
            now_ms: exp + 30_001,
            skew_ms: 30_000,
        }
    );
    let later = MintRequest {
        not_before_ms: Some(NOW_MS + 600_000),
        ..request("k1")
    };
    let token = mint(ED_PRIVATE.as_bytes(), &later).unwrap();
    assert_eq!(
        check(&token, &p, NOW_MS).unwrap_err().code(),
        "token-not-yet-valid"
    );
    assert!(
        check(&token, &p, NOW_MS + 570_000).is_ok(),
        "within the skew"
    );
}

#[test]
fn an_unknown_or_missing_kid_is_refused() {
    let token = mint(ED_PRIVATE.as_bytes(), &request("gone")).unwrap();
    assert_eq!(
        check(&token, &policy(&[TokenAlgorithm::EdDSA]), NOW_MS).unwrap_err(),
        TokenError::UnknownKid { kid: "gone".into() }
    );
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    header.kid = None;
    let key = jsonwebtoken::EncodingKey::from_ed_pem(ED_PRIVATE.as_bytes()).unwrap();
    let claims = serde_json::json!({"sub": "alice", "exp": 1_900_000_000u64});
    let token = jsonwebtoken::encode(&header, &claims, &key).unwrap();
    assert_eq!(
        check(&token, &policy(&[TokenAlgorithm::EdDSA]), NOW_MS).unwrap_err(),
        TokenError::MissingKid
    );
}

#[test]
fn claims_and_shape_are_required() {
    let key = jsonwebtoken::EncodingKey::from_ed_pem(ED_PRIVATE.as_bytes()).unwrap();
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    header.kid = Some("k1".into());
    let p = policy(&[TokenAlgorithm::EdDSA]);
    let no_exp = jsonwebtoken::encode(&header, &serde_json::json!({"sub": "alice"}), &key).unwrap();
    assert_eq!(
        check(&no_exp, &p, NOW_MS).unwrap_err(),
        TokenError::MissingClaim("exp")
    );
    let no_sub =
        jsonwebtoken::encode(&header, &serde_json::json!({"exp": 1_900_000_000u64}), &key).unwrap();
    assert_eq!(
        check(&no_sub, &p, NOW_MS).unwrap_err(),
        TokenError::MissingClaim("sub")
    );
    for garbage in ["", "a.b", "a.b.c.d", "!!!.e30.", "e30.e30.e30"] {
        assert_eq!(
            check(garbage, &p, NOW_MS).unwrap_err().code(),
            "token-malformed",
            "{garbage:?}"
        );
    }
    let long = "a".repeat(8193);
    assert_eq!(
        check(&long, &p, NOW_MS).unwrap_err(),
        TokenError::TooLong { bytes: 8193 }
    );
}

#[test]
fn the_audience_is_checked_when_configured() {
    let with_aud = MintRequest {
        audience: Some("malachi-prod"),
        ..request("k1")
    };
    let token = mint(ED_PRIVATE.as_bytes(), &with_aud).unwrap();
    let mut p = policy(&[TokenAlgorithm::EdDSA]);
    p.audience = Some("malachi-prod".into());
    assert!(check(&token, &p, NOW_MS).is_ok());
    p.audience = Some("malachi-test".into());
    assert_eq!(
        check(&token, &p, NOW_MS).unwrap_err(),
        TokenError::WrongAudience
    );
    let without = mint(ED_PRIVATE.as_bytes(), &request("k1")).unwrap();
    assert_eq!(
        check(&without, &p, NOW_MS).unwrap_err(),
        TokenError::WrongAudience
    );
}

#[test]
fn a_key_must_be_a_public_key_of_its_algorithm() {
    assert!(ed_key().check().is_ok());
    let wrong_family = TokenKey {
        algorithm: TokenAlgorithm::ES256,
        ..ed_key()
    };
    assert_eq!(
        wrong_family.check().unwrap_err().code(),
        "token-key-invalid"
    );
    let private = TokenKey {
        public_key_pem: ED_PRIVATE.into(),
        ..ed_key()
    };
    assert_eq!(private.check().unwrap_err().code(), "token-key-invalid");
    let bad_kid = TokenKey {
        kid: "k 1".into(),
        ..ed_key()
    };
    assert_eq!(bad_kid.check().unwrap_err().code(), "token-kid-invalid");
}

/// `docs/protocol.md` §10.2's example token, byte for byte.
const DOC_TOKEN: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJFZERTQSIsImtpZCI6ImsxIn0.eyJzdWIiOiJhbGljZSIsImV4cCI6MTgwMDAwMzYwMCwibmJmIjoxODAwMDAwMDAwLCJpYXQiOjE4MDAwMDAwMDB9.7N2D2cWKqbDxNo-xUbjcDCCe8UfKAkO5znqCMqY49vOQV1t5dzuYdi1BTJNKgYNhzTvFksDUP_HjG8OZmacYAQ";

#[test]
fn the_documented_example_token_is_what_mint_makes_and_verifies() {
    let token = mint(ED_PRIVATE.as_bytes(), &request("k1")).unwrap();
    assert_eq!(token, DOC_TOKEN);
    assert_eq!(token.len(), 227);
    let verified = check(&token, &policy(&[TokenAlgorithm::EdDSA]), NOW_MS).unwrap();
    assert_eq!(verified.expires_at_ms - NOW_MS, 3_600_000);
    // §10.2's refusal example: an hour and 100 s later, skew 60 s.
    let mut p = policy(&[TokenAlgorithm::EdDSA]);
    p.clock_skew_ms = 60_000;
    assert_eq!(
        format!("{}", check(&token, &p, 1_800_003_700_000).unwrap_err()),
        "token-expired: expired at 1800003600000 ms, now 1800003700000 ms (skew 60000 ms)"
    );
}

/// `jsonwebtoken` is built with its `aws_lc_rs` backend only, so it has
/// a process default without anyone installing one (ADR 0152 §1): with
/// both backends it would have none and every token would fail.
#[test]
fn jsonwebtoken_has_its_one_provider() {
    assert!(jsonwebtoken::crypto::CryptoProvider::try_get_default().is_some());
}
