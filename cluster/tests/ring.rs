//! The hash ring places topics deterministically, tiles the ring, and a
//! vnode refuses a topic outside its arc.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_cluster::model::{Command, MetadataState, ModelError, NodeId, Outcome, RingArc};
use malachi_cluster::ring::{Ring, VnodeId};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// 1,000 topic names. Built from random numbers and a random prefix
/// rather than a regex strategy, which is far slower at this count.
fn topic_names() -> impl Strategy<Value = Vec<String>> {
    ("[a-z]{0,8}", proptest::collection::vec(any::<u64>(), 1000))
        .prop_map(|(prefix, ids)| ids.iter().map(|id| format!("{prefix}{id:x}")).collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// 1,000 topics over 16 vnodes: two rings built apart, and a ring that
    /// went through encode and decode, place every topic on the same vnode,
    /// whose arc holds the topic; every vnode gets some topics.
    #[test]
    fn placement_of_1000_topics_over_16_vnodes_is_deterministic(names in topic_names()) {
        let ring = Ring::new(16).unwrap();
        let other = Ring::new(16).unwrap();
        let decoded = Ring::decode(&ring.encode().unwrap()).unwrap();
        let mut per_vnode: BTreeMap<VnodeId, usize> = BTreeMap::new();
        for name in &names {
            let owner = ring.owner(name);
            prop_assert_eq!(owner, other.owner(name));
            prop_assert_eq!(owner, decoded.owner(name));
            prop_assert!(owner.arc.holds_topic(name));
            *per_vnode.entry(owner.id).or_default() += 1;
        }
        prop_assert_eq!(per_vnode.len(), 16, "every vnode owns some of 1,000 topics");
        prop_assert_eq!(per_vnode.values().sum::<usize>(), 1000);
    }

    /// A split moves only the topics in the upper half of the split arc, and
    /// moves them to the new vnode.
    #[test]
    fn a_split_moves_only_the_upper_half_of_one_arc(names in topic_names(), which in 0u32..16) {
        let before = Ring::new(16).unwrap();
        let mut after = before.clone();
        let new = after.split(VnodeId(which)).unwrap();
        prop_assert!(after.version() > before.version());
        after.check().unwrap();
        for name in &names {
            let (old, now) = (before.owner(name).id, after.owner(name).id);
            if now != old {
                prop_assert_eq!(old, VnodeId(which));
                prop_assert_eq!(now, new.id);
                prop_assert!(new.arc.holds_topic(name));
            }
        }
    }
}

fn create(topic: &str) -> Command {
    Command::CreateTopic {
        topic: topic.to_owned(),
        initial_ranges: 1,
        policy: None,
        replicas: vec![vec![NodeId(1)]],
        at_ms: 1,
    }
}

/// Two names on opposite halves of the ring.
fn names_in_halves() -> (String, String) {
    let lower = RingArc::new(0, 1 << 63).unwrap();
    let mut low = None;
    let mut high = None;
    for i in 0.. {
        let name = format!("topic-{i}");
        if lower.holds_topic(&name) {
            low.get_or_insert(name);
        } else {
            high.get_or_insert(name);
        }
        if low.is_some() && high.is_some() {
            break;
        }
    }
    (low.unwrap(), high.unwrap())
}

#[test]
fn a_vnode_refuses_a_topic_outside_its_arc_and_stays_unchanged() {
    let (low, high) = names_in_halves();
    let arc = RingArc::new(0, 1 << 63).unwrap();
    let mut state = MetadataState::new();
    assert_eq!(
        state.apply(Command::AssignArc {
            arc,
            id_base: 1 << 40
        }),
        Ok(Outcome::ArcAssigned)
    );
    let before = state.snapshot().unwrap();
    let refused = state.apply(create(&high)).unwrap_err();
    assert_eq!(
        refused,
        ModelError::WrongVnode {
            topic: high.clone(),
            arc
        }
    );
    assert_eq!(state.snapshot().unwrap(), before);
    // Every topic command is checked, not only creation.
    assert!(matches!(
        state.apply(Command::DeleteTopic { topic: high }),
        Err(ModelError::WrongVnode { .. })
    ));
    // Ids come from the vnode's own block, so they never collide with
    // another vnode's.
    match state.apply(create(&low)) {
        Ok(Outcome::TopicCreated {
            ranges, segments, ..
        }) => {
            assert_eq!(ranges[0].0, 1 << 40);
            assert_eq!(segments[0].0, 1 << 40);
        }
        other => panic!("{other:?}"),
    }
    // The arc survives a snapshot.
    let restored = MetadataState::restore(&state.snapshot().unwrap()).unwrap();
    assert_eq!(restored.arc(), Some(arc));
}

#[test]
fn an_arc_that_would_orphan_a_topic_is_refused() {
    let (low, _high) = names_in_halves();
    let mut state = MetadataState::new();
    state.apply(create(&low)).unwrap();
    let upper = RingArc::new(1 << 63, malachi_cluster::model::RING_END).unwrap();
    assert!(matches!(
        state.apply(Command::AssignArc {
            arc: upper,
            id_base: 0
        }),
        Err(ModelError::ArcExcludesTopic { .. })
    ));
    assert_eq!(state.arc(), None);
    // Without an arc a vnode owns the whole ring (a lone broker's group).
    assert!(state.apply(create("anything-goes")).is_ok());
}
