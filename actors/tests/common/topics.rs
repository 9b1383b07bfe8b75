//! Topic set-up the multi-broker tests share.
#![allow(dead_code)]

use malachi_testkit::inproc::TestClient;
use malachi_testkit::wait::eventually;
use malachi_wire::messages::CreateTopicRequest;

/// Creates `topic` with three copies, retrying while the cluster forms.
pub async fn create_replicated(client: &mut TestClient, topic: &str) {
    assert!(
        eventually(30_000, async || client
            .call(&CreateTopicRequest {
                name: topic.into(),
                replication_factor: Some(3),
                policy: None,
            })
            .await
            .is_ok())
        .await,
        "{topic} was never created"
    );
}
