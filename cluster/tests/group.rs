//! The metadata group on real files: a single voter that proposes, reads,
//! snapshots, purges, and recovers from restarts and damaged logs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_cluster::group::{Corruption, GroupConfig, GroupError, MetadataGroup};
use malachi_core::model::{Command, ModelError, NodeId, Outcome};
use std::fs::OpenOptions;
use std::path::Path;

fn config(dir: &Path) -> GroupConfig {
    let mut config = GroupConfig::new(7, 1, dir);
    // Short timeouts keep restarts (which wait out an election) fast.
    config.election_timeout_min_ms = 100;
    config.election_timeout_max_ms = 200;
    config.heartbeat_interval_ms = 30;
    config
}

fn create(topic: &str) -> Command {
    Command::CreateTopic {
        topic: topic.to_owned(),
        initial_ranges: 2,
        policy: None,
        replicas: vec![vec![NodeId(1)], vec![NodeId(1)]],
        at_ms: 1_000,
    }
}

fn topic_names(group: &MetadataGroup) -> Vec<String> {
    group.read_local(|s| s.topics().map(|t| t.name.clone()).collect())
}

fn state_bytes(group: &MetadataGroup) -> Vec<u8> {
    group.read_local(|s| s.snapshot().unwrap())
}

async fn open(dir: &Path) -> MetadataGroup {
    MetadataGroup::open_single(config(dir)).await.unwrap()
}

#[tokio::test]
async fn a_fresh_group_becomes_leader_of_a_single_voter_membership() {
    let dir = tempfile::tempdir().unwrap();
    let group = open(dir.path()).await;
    let status = group.status();
    assert!(group.is_leader());
    assert_eq!(status.leader, Some(1));
    assert_eq!(status.voters, vec![1]);
    assert_eq!(status.group_id, 7);
    group.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_proposed_topic_is_created_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let group = open(dir.path()).await;
    let outcome = group.propose(create("orders")).await.unwrap().unwrap();
    assert!(matches!(outcome, Outcome::TopicCreated { ref ranges, .. } if ranges.len() == 2));
    let ranges = group
        .read(|s| s.active_ranges("orders").count())
        .await
        .unwrap();
    assert_eq!(ranges, 2);
    assert_eq!(topic_names(&group), vec!["orders".to_owned()]);
    group.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_models_refusal_comes_back_as_the_inner_error() {
    let dir = tempfile::tempdir().unwrap();
    let group = open(dir.path()).await;
    group.propose(create("orders")).await.unwrap().unwrap();
    let verdict = group.propose(create("orders")).await.unwrap();
    assert_eq!(
        verdict,
        Err(ModelError::TopicExists {
            topic: "orders".to_owned()
        })
    );
    group.shutdown().await.unwrap();
}

#[tokio::test]
async fn subscribers_see_the_applied_index_advance_past_a_proposal() {
    let dir = tempfile::tempdir().unwrap();
    let group = open(dir.path()).await;
    let mut applied = group.subscribe();
    let before = *applied.borrow_and_update();
    group.propose(create("orders")).await.unwrap().unwrap();
    assert!(*applied.borrow() > before);
    assert_eq!(Some(*applied.borrow()), group.status().last_applied);
    group.shutdown().await.unwrap();
}

#[tokio::test]
async fn topics_survive_a_restart_with_identical_state_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let group = open(dir.path()).await;
    for name in ["a", "b", "c"] {
        group.propose(create(name)).await.unwrap().unwrap();
    }
    group
        .propose(Command::DeleteTopic {
            topic: "b".to_owned(),
        })
        .await
        .unwrap()
        .unwrap();
    let before = state_bytes(&group);
    group.shutdown().await.unwrap();

    let group = open(dir.path()).await;
    assert_eq!(topic_names(&group), vec!["a".to_owned(), "c".to_owned()]);
    assert_eq!(state_bytes(&group), before);
    // The restarted group keeps taking writes after its recovered log.
    group.propose(create("d")).await.unwrap().unwrap();
    group.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_torn_log_tail_recovers_to_the_last_complete_entry() {
    let dir = tempfile::tempdir().unwrap();
    let group = open(dir.path()).await;
    for name in ["a", "b", "c"] {
        group.propose(create(name)).await.unwrap().unwrap();
    }
    group.shutdown().await.unwrap();

    // Cut the final entry (the create of "c") short, as a crash mid-append would.
    let log = dir.path().join("log");
    let len = std::fs::metadata(&log).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(len - 3)
        .unwrap();

    let group = open(dir.path()).await;
    assert_eq!(topic_names(&group), vec!["a".to_owned(), "b".to_owned()]);
    // The partial bytes are gone and new appends land after the whole entries.
    group.propose(create("c2")).await.unwrap().unwrap();
    group.shutdown().await.unwrap();
    let group = open(dir.path()).await;
    assert_eq!(
        topic_names(&group),
        vec!["a".to_owned(), "b".to_owned(), "c2".to_owned()]
    );
    group.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_zero_filled_log_tail_is_treated_as_a_torn_append() {
    let dir = tempfile::tempdir().unwrap();
    let group = open(dir.path()).await;
    group.propose(create("a")).await.unwrap().unwrap();
    group.shutdown().await.unwrap();

    // A file that grew before its data landed reads back as zeros.
    let log = dir.path().join("log");
    let len = std::fs::metadata(&log).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(len + 37)
        .unwrap();

    let group = open(dir.path()).await;
    assert_eq!(topic_names(&group), vec!["a".to_owned()]);
    group.propose(create("b")).await.unwrap().unwrap();
    group.shutdown().await.unwrap();
    let group = open(dir.path()).await;
    assert_eq!(topic_names(&group), vec!["a".to_owned(), "b".to_owned()]);
    group.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_corrupted_middle_entry_refuses_to_open_with_a_storage_error() {
    let dir = tempfile::tempdir().unwrap();
    let group = open(dir.path()).await;
    for name in ["a", "b", "c"] {
        group.propose(create(name)).await.unwrap().unwrap();
    }
    group.shutdown().await.unwrap();

    // Flip a byte inside the body of the create of "a": its name is unique
    // in the file, so it lands in one entry that more entries follow.
    let log = dir.path().join("log");
    let mut bytes = std::fs::read(&log).unwrap();
    let at = bytes
        .windows(3)
        .position(|w| w == [0xa1, b'a', 0x02])
        .expect("the topic name is encoded in the log");
    bytes[at + 1] ^= 0x55;
    std::fs::write(&log, &bytes).unwrap();

    let err = MetadataGroup::open_single(config(dir.path()))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            GroupError::Storage {
                problem: Corruption::EntryChecksum,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_fatal());
}

#[tokio::test]
async fn a_log_of_another_group_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let group = open(dir.path()).await;
    group.shutdown().await.unwrap();
    let mut other = config(dir.path());
    other.group_id = 8;
    let err = MetadataGroup::open_single(other).await.unwrap_err();
    assert!(
        matches!(
            err,
            GroupError::Storage {
                problem: Corruption::OtherGroup {
                    found: 7,
                    expected: 8
                },
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn opening_as_a_node_outside_the_membership_times_out_with_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let group = open(dir.path()).await;
    group.shutdown().await.unwrap();
    let mut stranger = config(dir.path());
    stranger.node_id = 2;
    stranger.open_timeout_ms = 400;
    let err = MetadataGroup::open_single(stranger).await.unwrap_err();
    assert!(matches!(err, GroupError::Timeout), "{err:?}");
    // The failed open released the directory: the rightful voter reopens it.
    let group = open(dir.path()).await;
    assert!(group.is_leader());
    group.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_corrupted_vote_file_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let group = open(dir.path()).await;
    group.shutdown().await.unwrap();
    let vote = dir.path().join("vote");
    let mut bytes = std::fs::read(&vote).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&vote, &bytes).unwrap();
    let err = MetadataGroup::open_single(config(dir.path()))
        .await
        .unwrap_err();
    assert!(matches!(err, GroupError::Storage { .. }), "{err:?}");
}

#[tokio::test]
async fn snapshots_purge_the_log_and_a_reopen_yields_identical_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.snapshot_every_entries = 4;
    cfg.log_entries_kept_after_snapshot = 0;
    let group = MetadataGroup::open_single(cfg.clone()).await.unwrap();
    for i in 0..20 {
        group
            .propose(create(&format!("t{i:02}")))
            .await
            .unwrap()
            .unwrap();
    }
    let covered = group.snapshot_now().await.unwrap();
    let applied = group.status().last_applied.unwrap();
    assert_eq!(covered, applied);
    let before = state_bytes(&group);
    group.shutdown().await.unwrap();

    assert!(dir.path().join("snapshot").exists());
    // Everything the snapshot covers was purged: the log holds no topic
    // names at all, only its header.
    let log = std::fs::read(dir.path().join("log")).unwrap();
    assert!(
        !log.windows(3).any(|w| w == b"t00"),
        "purged entries are still in the log"
    );

    let group = MetadataGroup::open_single(cfg).await.unwrap();
    assert_eq!(state_bytes(&group), before);
    assert_eq!(topic_names(&group).len(), 20);
    assert!(group.status().snapshot.unwrap() >= covered);
    group.shutdown().await.unwrap();
}

#[tokio::test]
async fn automatic_snapshots_plus_a_log_tail_reopen_to_identical_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.snapshot_every_entries = 5;
    let group = MetadataGroup::open_single(cfg.clone()).await.unwrap();
    for i in 0..13 {
        group
            .propose(create(&format!("t{i:02}")))
            .await
            .unwrap()
            .unwrap();
    }
    let before = state_bytes(&group);
    group.shutdown().await.unwrap();

    let group = MetadataGroup::open_single(cfg).await.unwrap();
    assert!(group.status().snapshot.is_some());
    assert_eq!(state_bytes(&group), before);
    group.shutdown().await.unwrap();
}

#[tokio::test]
async fn proposals_and_reads_after_shutdown_are_refused_as_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let group = open(dir.path()).await;
    let clone = group.clone();
    group.shutdown().await.unwrap();
    let late = clone.propose(create("late")).await.unwrap_err();
    assert!(matches!(late, GroupError::Stopped), "{late:?}");
    let read = clone.read(|s| s.topics().count()).await.unwrap_err();
    assert!(matches!(read, GroupError::Stopped), "{read:?}");
    assert!(!clone.is_leader());
    assert!(!GroupError::Stopped.is_fatal());
    // A second shutdown is harmless.
    clone.shutdown().await.unwrap();
}
