//! Helpers shared by the cluster crate's integration tests.

use malachi_core::model::{Command, NodeId};

/// A creation of `topic` with two ranges, placed on brokers 1 and 2, at a
/// fixed time so every test applies the same command.
pub fn create(topic: &str) -> Command {
    Command::CreateTopic {
        topic: topic.to_owned(),
        initial_ranges: 2,
        policy: None,
        replicas: vec![vec![NodeId(1)], vec![NodeId(2)]],
        at_ms: 5,
    }
}
