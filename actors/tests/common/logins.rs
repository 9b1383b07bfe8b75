//! Logins for the security tests (`client_auth`, `token_auth`): a
//! broker's SCRAM settings with a bootstrap superuser, a login, and a
//! connection logged in as that superuser.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use malachi_actors::{Authentication, BrokerHandle, SecuritySettings};
use malachi_core::auth::scram_client::ScramClient;
use malachi_testkit::inproc::{Refused, TestClient};
use malachi_testkit::wait::wait_until;
use malachi_wire::auth::{SaslAuthenticateRequest, SaslHandshakeRequest};

pub const ADMIN_PASSWORD: &str = "admin-secret";
/// The count credentials are made with here, and the brokers' setting.
pub const ITERATIONS: u32 = 4096;

pub fn security(dir: &Path, delay_first_ms: u64) -> SecuritySettings {
    let password_file = dir.join("admin.pw");
    std::fs::write(&password_file, format!("{ADMIN_PASSWORD}\n")).unwrap();
    SecuritySettings {
        authentication: Authentication::Scram,
        superusers: vec!["User:admin".into()],
        scram_iterations: ITERATIONS,
        auth_view_max_age_ms: 500,
        lockout_delay_first_ms: delay_first_ms,
        bootstrap_user: Some("admin".into()),
        bootstrap_password_file: Some(password_file),
        ..SecuritySettings::default()
    }
}

/// Logs `client` in; the refusal of the step that failed.
pub async fn login(client: &mut TestClient, user: &str, password: &str) -> Result<(), Refused> {
    let handshake = client
        .call(&SaslHandshakeRequest {
            mechanism: "SCRAM-SHA-256".into(),
        })
        .await?;
    assert!(handshake.accepted);
    let (first, message) = ScramClient::start(user, "a-client-nonce-0123456789").unwrap();
    let server_first = client
        .call(&SaslAuthenticateRequest {
            auth_bytes: message,
        })
        .await?;
    let (last, message) = first
        .receive(&server_first.auth_bytes, password.as_bytes())
        .unwrap();
    let server_final = client
        .call(&SaslAuthenticateRequest {
            auth_bytes: message,
        })
        .await?;
    assert!(server_final.complete);
    assert_eq!(server_final.principal, Some(format!("User:{user}")));
    last.verify(&server_final.auth_bytes).unwrap();
    Ok(())
}

/// A connection to `broker` logged in as the bootstrap superuser, once
/// the broker created it.
pub async fn admin(broker: &BrokerHandle) -> TestClient {
    wait_until(
        "the bootstrap user logs in",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let mut client = TestClient::connect(broker.client_addr()).await;
            login(&mut client, "admin", ADMIN_PASSWORD)
                .await
                .ok()
                .map(|()| client)
        },
    )
    .await
}
