//! A lone broker's cursor key (ADR 0096): created once through its own
//! metadata, from its old per-broker secret when it has one, so the cursors
//! it minted before key ids existed stay valid, and kept across restarts in
//! the metadata rather than in a file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use hmac::{Hmac, Mac};
use malachi_actors::BrokerConfig;
use malachi_core::cursor::{Cursor, CursorKey, CursorKeys, Position};
use sha2::Sha256;

const OLD_SECRET: &[u8] = b"a secret from before key ids!!!!";

/// `cursor` in the format before key ids (version 1): `1 || body || tag`,
/// tagged under `secret`, as a broker of that time minted it.
fn version_1(cursor: &Cursor, secret: &[u8]) -> String {
    let positions: Vec<(u64, Position)> = cursor.positions.iter().map(|(r, p)| (r.0, *p)).collect();
    let body = rmp_serde::to_vec(&(&cursor.topic, cursor.incarnation, positions)).unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(b"malachi-cursor\0");
    mac.update(&[1]);
    mac.update(&body);
    let mut raw = vec![1u8];
    raw.extend_from_slice(&body);
    raw.extend_from_slice(&mac.finalize().into_bytes());
    URL_SAFE_NO_PAD.encode(raw)
}

fn values(records: &[malachi_wire::batch::Record]) -> Vec<Vec<u8>> {
    records.iter().map(|r| r.value.to_vec()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_lone_broker_proposes_its_old_secret_as_key_0_and_keeps_its_old_cursors() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cluster.secret"), OLD_SECRET).unwrap();
    let config = BrokerConfig::for_tests(dir.path());
    let broker = start(config.clone()).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("t").await;
    let all: Vec<_> = (0..5)
        .map(|i| record(&format!("k{i}"), &format!("v{i}")))
        .collect();
    client.produce("t", &all).await.unwrap();
    let (first, cursor) = client.fetch("t", None, true, 3, 0).await.unwrap();
    assert_eq!(
        values(&first),
        [b"v0".to_vec(), b"v1".to_vec(), b"v2".to_vec()]
    );

    // The broker minted under key 0, which is its old secret.
    let old_key = CursorKeys::single(0, CursorKey::new(OLD_SECRET).unwrap());
    let decoded = Cursor::decode(&cursor, &old_key).unwrap();
    // A cursor it minted before the upgrade, at the same place, still reads on.
    let legacy = version_1(&decoded, OLD_SECRET);
    let (rest, _) = client
        .fetch("t", Some(legacy.clone()), false, 10, 0)
        .await
        .unwrap();
    assert_eq!(values(&rest), [b"v3".to_vec(), b"v4".to_vec()]);
    // One under another secret is forged.
    let forged = version_1(&decoded, b"some other broker's old secret!!");
    let refused = client
        .fetch("t", Some(forged), false, 10, 0)
        .await
        .unwrap_err();
    assert_eq!(refused.code, malachi_wire::ErrorCode::InvalidCursor);
    drop(client);
    broker.shutdown().await.unwrap();

    // Restarted, with the file gone: the key comes from the metadata.
    std::fs::remove_file(dir.path().join("cluster.secret")).unwrap();
    let broker = start(config).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    for resume in [cursor, legacy] {
        let (rest, next) = client.fetch("t", Some(resume), false, 10, 0).await.unwrap();
        assert_eq!(values(&rest), [b"v3".to_vec(), b"v4".to_vec()]);
        assert!(
            Cursor::decode(&next, &old_key).is_ok(),
            "minted under key 0"
        );
    }
    assert!(
        !dir.path().join("cluster.secret").exists(),
        "the broker no longer writes a secret file"
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_lone_broker_keeps_its_key_in_its_metadata_across_restarts() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig::for_tests(dir.path());
    let broker = start(config.clone()).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("t").await;
    client.produce("t", &[record("k", "a")]).await.unwrap();
    let (_, cursor) = client.fetch("t", None, true, 10, 0).await.unwrap();
    client.produce("t", &[record("k", "b")]).await.unwrap();
    drop(client);
    broker.shutdown().await.unwrap();
    assert!(!dir.path().join("cluster.secret").exists());

    let broker = start(config).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let (rest, _) = client.fetch("t", Some(cursor), false, 10, 0).await.unwrap();
    assert_eq!(values(&rest), [b"b".to_vec()]);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_rotation_old_cursors_still_verify_and_new_ones_carry_the_new_key_id() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig::for_tests(dir.path());
    let broker = start(config.clone()).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("t").await;
    client.produce("t", &[record("k", "a")]).await.unwrap();
    let (_, before) = client.fetch("t", None, true, 10, 0).await.unwrap();
    let key_id = |cursor: &str| {
        let raw = URL_SAFE_NO_PAD.decode(cursor).unwrap();
        u32::from_be_bytes(raw[1..5].try_into().unwrap())
    };
    assert_eq!(key_id(&before), 0);

    assert_eq!(broker.rotate_cursor_key().await.unwrap(), 1);
    assert_eq!(broker.rotate_cursor_key().await.unwrap(), 2);
    client.produce("t", &[record("k", "b")]).await.unwrap();
    let (rest, after) = client.fetch("t", Some(before), false, 10, 0).await.unwrap();
    assert_eq!(
        values(&rest),
        [b"b".to_vec()],
        "a key 0 cursor still reads on"
    );
    assert_eq!(key_id(&after), 2, "new cursors carry the current key id");
    drop(client);
    broker.shutdown().await.unwrap();

    // The rotated keys are the metadata's: a restart verifies key 2 cursors.
    let broker = start(config).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.produce("t", &[record("k", "c")]).await.unwrap();
    let (rest, _) = client.fetch("t", Some(after), false, 10, 0).await.unwrap();
    assert_eq!(values(&rest), [b"c".to_vec()]);
    broker.shutdown().await.unwrap();
}
