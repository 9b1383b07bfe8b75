//! SCRAM-SHA-256 (ADR 0146): the RFC 7677 example exactly, the right
//! password always and a wrong one never, unknown users answered like known
//! ones, and tampered, replayed or downgraded messages refused with typed
//! errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use malachi_core::auth::scram::{self, ITERATIONS_MIN, SALT_BYTES, ScramError, StoredCredential};
use malachi_core::auth::scram_client::ScramClient;
use malachi_core::auth::scram_server::{
    NONCE_LEDGER_ENTRIES_MAX, NonceLedger, ServerConfig, ServerExchange, server_error_message,
};
use proptest::prelude::*;

const RFC_CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
const RFC_SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
const RFC_SERVER_FIRST: &str =
    "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
const RFC_CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
const RFC_SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

fn config() -> ServerConfig {
    ServerConfig::new(b"a cluster-wide fake-salt secret")
        .unwrap()
        .with_iterations(ITERATIONS_MIN)
        .unwrap()
}

fn rfc_credential() -> StoredCredential {
    let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
    StoredCredential::from_password(b"pencil", &salt, 4096).unwrap()
}

fn server_nonce(n: u32) -> String {
    format!("server-nonce-{n:012}-abcdef")
}

/// One full exchange; the server's outcome.
fn exchange(
    stored: Option<&StoredCredential>,
    username: &str,
    password: &[u8],
    ledger: &mut NonceLedger,
    nonce: u32,
) -> Result<String, ScramError> {
    let (client, first) = ScramClient::start(username, "client-nonce-0123456789").unwrap();
    let (server, server_first) = ServerExchange::start(
        &config(),
        &first,
        |name| {
            assert_eq!(name, username);
            stored.cloned()
        },
        &server_nonce(nonce),
        ledger,
    )?;
    let (client, last) = client.receive(&server_first, password)?;
    let done = server.finish(&last)?;
    client.verify(&done.server_final)?;
    Ok(done.username)
}

#[test]
fn the_rfc_7677_example_passes_exactly_on_both_sides() {
    let mut ledger = NonceLedger::default();
    let credential = rfc_credential();
    let (server, server_first) = ServerExchange::start(
        &config(),
        RFC_CLIENT_FIRST,
        |name| (name == "user").then(|| credential.clone()),
        RFC_SERVER_NONCE,
        &mut ledger,
    )
    .unwrap();
    assert_eq!(server_first, RFC_SERVER_FIRST);
    assert_eq!(server.claimed_username(), "user");
    let done = server.finish(RFC_CLIENT_FINAL).unwrap();
    assert_eq!(done.username, "user");
    assert_eq!(done.server_final, RFC_SERVER_FINAL);

    let (client, first) = ScramClient::start("user", "rOprNGfwEbeRWgbNEkqO").unwrap();
    assert_eq!(first, RFC_CLIENT_FIRST);
    let (client, last) = client.receive(RFC_SERVER_FIRST, b"pencil").unwrap();
    assert_eq!(last, RFC_CLIENT_FINAL);
    assert_eq!(client.verify(RFC_SERVER_FINAL), Ok(()));
}

#[test]
fn an_unknown_user_gets_the_same_answer_as_a_wrong_password() {
    let salt = [9u8; SALT_BYTES];
    let known = StoredCredential::from_password(b"right", &salt, ITERATIONS_MIN).unwrap();
    let mut ledger = NonceLedger::default();
    let wrong = exchange(Some(&known), "alice", b"wrong", &mut ledger, 1);
    let unknown = exchange(None, "mallory", b"wrong", &mut ledger, 2);
    assert_eq!(wrong, Err(ScramError::InvalidProof));
    assert_eq!(unknown, Err(ScramError::InvalidProof));
    assert_eq!(
        server_error_message(&ScramError::InvalidProof),
        "e=invalid-proof"
    );
    // Even the password that "matches" a fake credential cannot exist, but
    // the unknown user's first answer is shaped like a real one, and stable.
    let answer = |nonce: u32, ledger: &mut NonceLedger| {
        ServerExchange::start(
            &config(),
            "n,,n=mallory,r=client-nonce-0123456789",
            |_| None,
            &server_nonce(nonce),
            ledger,
        )
        .unwrap()
        .1
    };
    let (a, b) = (answer(3, &mut ledger), answer(4, &mut ledger));
    let tail = |s: &str| s.split_once(",s=").unwrap().1.to_owned();
    assert_eq!(tail(&a), tail(&b), "the fake salt is deterministic");
    let fake = config().fake_credential("mallory");
    assert_eq!(fake.salt.len(), SALT_BYTES);
    assert_eq!(fake.iterations, ITERATIONS_MIN);
    assert_ne!(config().fake_credential("bob").salt, fake.salt);
    let other = ServerConfig::new(b"another cluster's secret").unwrap();
    assert_ne!(other.fake_credential("mallory").salt, fake.salt);
    assert!(format!("{:?}", config()).find("secret").is_none());
}

#[test]
fn a_replayed_client_final_is_refused_by_its_nonce() {
    let credential = rfc_credential();
    let mut ledger = NonceLedger::default();
    let (server, _) = ServerExchange::start(
        &config(),
        RFC_CLIENT_FIRST,
        |_| Some(credential.clone()),
        RFC_SERVER_NONCE,
        &mut ledger,
    )
    .unwrap();
    server.finish(RFC_CLIENT_FINAL).unwrap();
    // The same server nonce again: the caller's random source repeated.
    let again = ServerExchange::start(
        &config(),
        RFC_CLIENT_FIRST,
        |_| Some(credential.clone()),
        RFC_SERVER_NONCE,
        &mut ledger,
    );
    assert_eq!(again.err(), Some(ScramError::ServerNonceReused));
    // A fresh exchange: the recorded client-final is refused.
    let (server, _) = ServerExchange::start(
        &config(),
        RFC_CLIENT_FIRST,
        |_| Some(credential.clone()),
        &server_nonce(7),
        &mut ledger,
    )
    .unwrap();
    assert_eq!(
        server.finish(RFC_CLIENT_FINAL),
        Err(ScramError::NonceMismatch)
    );
}

#[test]
fn the_nonce_ledger_is_bounded_and_forgets_the_oldest() {
    let mut ledger = NonceLedger::default();
    let first = "n,,n=user,r=abcdefghijklmnop";
    for n in 0..=NONCE_LEDGER_ENTRIES_MAX as u32 {
        ServerExchange::start(&config(), first, |_| None, &server_nonce(n), &mut ledger).unwrap();
    }
    assert_eq!(ledger.len(), NONCE_LEDGER_ENTRIES_MAX);
    // Nonce 0 was forgotten, nonce 1 is still remembered.
    assert!(
        ServerExchange::start(&config(), first, |_| None, &server_nonce(1), &mut ledger).is_err()
    );
}

#[test]
fn tampering_gets_its_typed_error() {
    let credential = rfc_credential();
    let start = |ledger: &mut NonceLedger, first: &str| {
        ServerExchange::start(
            &config(),
            first,
            |_| Some(credential.clone()),
            RFC_SERVER_NONCE,
            ledger,
        )
        .unwrap()
        .0
    };
    let tampered = [
        (
            RFC_CLIENT_FINAL.replace("c=biws", "c=eSws"),
            ScramError::ChannelBindingMismatch,
        ),
        (
            RFC_CLIENT_FINAL.replace("r=rOpr", "r=xOpr"),
            ScramError::NonceMismatch,
        ),
        (
            RFC_CLIENT_FINAL.replace("p=dHzb", "p=eHzb"),
            ScramError::InvalidProof,
        ),
        (
            RFC_CLIENT_FINAL.replace(",p=", ",x=1,p="),
            ScramError::InvalidProof,
        ),
        (
            RFC_CLIENT_FINAL.replace(",p=", ",m=1,p="),
            ScramError::MandatoryExtension,
        ),
    ];
    for (message, error) in tampered {
        let server = start(&mut NonceLedger::default(), RFC_CLIENT_FIRST);
        assert_eq!(server.finish(&message), Err(error), "{message}");
    }
    // A `y,,` client (supports binding, believes we do not) is accepted,
    // but then must bind `y,,`, not `n,,`.
    let server = start(
        &mut NonceLedger::default(),
        "y,,n=user,r=rOprNGfwEbeRWgbNEkqO",
    );
    assert_eq!(
        server.finish(RFC_CLIENT_FINAL),
        Err(ScramError::ChannelBindingMismatch)
    );
    // The client refuses a tampered server answer.
    let client = || {
        ScramClient::start("user", "rOprNGfwEbeRWgbNEkqO")
            .unwrap()
            .0
    };
    let downgraded = RFC_SERVER_FIRST.replace("i=4096", "i=1");
    assert_eq!(
        client().receive(&downgraded, b"pencil").err(),
        Some(ScramError::Iterations(1))
    );
    let foreign = RFC_SERVER_FIRST.replace("r=rOpr", "r=xOpr");
    assert_eq!(
        client().receive(&foreign, b"pencil").err(),
        Some(ScramError::NonceNotExtended)
    );
    let same_nonce = "r=rOprNGfwEbeRWgbNEkqO,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    assert_eq!(
        client().receive(same_nonce, b"pencil").err(),
        Some(ScramError::NonceNotExtended)
    );
    let (last, _) = client().receive(RFC_SERVER_FIRST, b"pencil").unwrap();
    let forged = RFC_SERVER_FINAL.replace("v=6rri", "v=7rri");
    assert_eq!(
        last.clone().verify(&forged),
        Err(ScramError::InvalidServerSignature)
    );
    assert_eq!(
        last.verify("e=invalid-proof"),
        Err(ScramError::ServerRefused("invalid-proof".into()))
    );
}

#[test]
fn channel_binding_and_authzid_requests_are_refused() {
    let mut ledger = NonceLedger::default();
    let refused = |first: &str, ledger: &mut NonceLedger| {
        ServerExchange::start(&config(), first, |_| None, RFC_SERVER_NONCE, ledger).err()
    };
    assert_eq!(
        refused("p=tls-server-end-point,,n=user,r=abc", &mut ledger),
        Some(ScramError::ChannelBindingNotSupported)
    );
    assert_eq!(
        refused("n,a=admin,n=user,r=abc", &mut ledger),
        Some(ScramError::AuthzidNotSupported)
    );
    assert_eq!(
        ScramError::ChannelBindingNotSupported.server_error(),
        "channel-binding-not-supported"
    );
    // A refused start records no nonce.
    assert!(ledger.is_empty());
    let short = ServerExchange::start(&config(), RFC_CLIENT_FIRST, |_| None, "short", &mut ledger);
    assert!(matches!(short.err(), Some(ScramError::Malformed(_))));
}

#[test]
fn the_keys_are_the_rfc_definitions() {
    let credential = rfc_credential();
    let salted = scram::salted_password(b"pencil", &credential.salt, 4096);
    assert_eq!(
        credential.stored_key,
        scram::stored_key(&scram::client_key(&salted))
    );
    assert_eq!(credential.server_key, scram::server_key(&salted));
    assert_eq!(
        StoredCredential::from_salted(&salted, &credential.salt, 4096),
        credential
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn the_right_password_always_authenticates_and_another_never(
        username in "[a-zA-Z0-9,=._-]{1,40}",
        password in proptest::collection::vec(any::<u8>(), 1..64),
        other in proptest::collection::vec(any::<u8>(), 1..64),
        salt in proptest::collection::vec(any::<u8>(), SALT_BYTES..=32),
        nonce in 0u32..1_000_000,
    ) {
        let credential = StoredCredential::from_password(&password, &salt, ITERATIONS_MIN).unwrap();
        let mut ledger = NonceLedger::default();
        let right = exchange(Some(&credential), &username, &password, &mut ledger, nonce);
        prop_assert_eq!(right, Ok(username.clone()));
        let wrong = exchange(Some(&credential), &username, &other, &mut ledger, nonce + 1);
        if other == password {
            prop_assert!(wrong.is_ok());
        } else {
            prop_assert_eq!(wrong, Err(ScramError::InvalidProof));
        }
    }

    #[test]
    fn any_change_to_the_client_final_is_refused(at in 0usize..200, byte in 0x20u8..0x7f) {
        let credential = rfc_credential();
        let at = at % RFC_CLIENT_FINAL.len();
        let mut bytes = RFC_CLIENT_FINAL.as_bytes().to_vec();
        prop_assume!(bytes[at] != byte);
        bytes[at] = byte;
        let message = String::from_utf8(bytes).unwrap();
        let mut ledger = NonceLedger::default();
        let (server, _) = ServerExchange::start(
            &config(),
            RFC_CLIENT_FIRST,
            |_| Some(credential.clone()),
            RFC_SERVER_NONCE,
            &mut ledger,
        )
        .unwrap();
        prop_assert!(server.finish(&message).is_err(), "{}", message);
    }

    #[test]
    fn garbage_never_panics_either_side(message in "\\PC{0,300}") {
        let mut ledger = NonceLedger::default();
        let _ = ServerExchange::start(&config(), &message, |_| None, RFC_SERVER_NONCE, &mut ledger)
            .map(|(server, _)| server.finish(&message));
        let (client, _) = ScramClient::start("user", "rOprNGfwEbeRWgbNEkqO").unwrap();
        if let Ok((client, _)) = client.receive(&message, b"pencil") {
            let _ = client.verify(&message);
        }
    }
}
