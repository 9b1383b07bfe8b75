//! The hash ring places topics deterministically, tiles the ring, and a
//! vnode refuses a topic outside its arc.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_core::model::{Command, MetadataState, ModelError, NodeId, Outcome, RingArc};
use malachi_core::ring::{Ring, VnodeId};
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
    let upper = RingArc::new(1 << 63, malachi_core::model::RING_END).unwrap();
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

fn vnodes_policy(placement: &[&str]) -> Command {
    Command::PutPolicy {
        policy: malachi_core::model::StoragePolicy {
            name: malachi_core::ring::VNODES_POLICY.to_owned(),
            retention_age_ms: None,
            retention_bytes: None,
            placement: placement.iter().map(|c| (*c).to_owned()).collect(),
            reshape: None,
        },
    }
}

fn ring_of(state: &MetadataState) -> Ring {
    state.ring_record().unwrap().ring.clone()
}

/// ADR 0121: the `vnodes` policy's constraints reach the ring, whether put
/// before or after the ring exists, and leave it when the policy goes;
/// every change bumps the ring's version and a repeat changes nothing.
#[test]
fn the_vnodes_policy_places_its_constraints_in_the_ring() {
    let mut state = MetadataState::new();
    state
        .apply(vnodes_policy(&["distinct(zone) >= 3"]))
        .unwrap();
    state.apply(Command::InitRing { vnodes: 4 }).unwrap();
    let ring = ring_of(&state);
    assert_eq!(ring.vnode_placement(), ["distinct(zone) >= 3"]);
    let version = ring.version();

    state
        .apply(vnodes_policy(&["distinct(zone) >= 2"]))
        .unwrap();
    assert_eq!(ring_of(&state).vnode_placement(), ["distinct(zone) >= 2"]);
    assert_eq!(ring_of(&state).version(), version + 1);
    assert_eq!(
        state
            .apply(vnodes_policy(&["distinct(zone) >= 2"]))
            .unwrap(),
        Outcome::Unchanged
    );
    assert_eq!(ring_of(&state).version(), version + 1);

    // Another policy's constraints are not the vnodes'.
    let mut other = vnodes_policy(&["zone == a"]);
    if let Command::PutPolicy { policy } = &mut other {
        policy.name = "other".to_owned();
    }
    state.apply(other).unwrap();
    assert_eq!(ring_of(&state).vnode_placement(), ["distinct(zone) >= 2"]);

    state
        .apply(Command::RemovePolicy {
            name: malachi_core::ring::VNODES_POLICY.to_owned(),
        })
        .unwrap();
    assert!(ring_of(&state).vnode_placement().is_empty());
    assert_eq!(ring_of(&state).version(), version + 2);
}

/// ADR 0121: a member's attributes are committed to the ring, bounded;
/// the same attributes again change nothing.
#[test]
fn member_attributes_are_committed_to_the_ring_and_bounded() {
    let mut state = MetadataState::new();
    let zone = |z: &str| BTreeMap::from([("zone".to_owned(), z.to_owned())]);
    let set = |node: u64, attributes: BTreeMap<String, String>| Command::SetMemberAttributes {
        node,
        attributes,
    };
    assert_eq!(state.apply(set(1, zone("a"))), Err(ModelError::NoRing));
    state.apply(Command::InitRing { vnodes: 4 }).unwrap();
    let version = ring_of(&state).version();
    state.apply(set(1, zone("a"))).unwrap();
    assert_eq!(ring_of(&state).attributes_of(1), Some(&zone("a")));
    assert_eq!(ring_of(&state).version(), version + 1);
    state.apply(set(1, zone("a"))).unwrap();
    assert_eq!(ring_of(&state).version(), version + 1);
    state.apply(set(1, zone("b"))).unwrap();
    assert_eq!(ring_of(&state).attributes_of(1), Some(&zone("b")));

    assert_eq!(state.apply(set(0, zone("a"))), Err(ModelError::InvalidNode));
    let too_many: BTreeMap<String, String> = (0..=malachi_core::ring::MEMBER_ATTRIBUTES_MAX)
        .map(|i| (format!("k{i}"), "v".to_owned()))
        .collect();
    assert!(matches!(
        state.apply(set(2, too_many)),
        Err(ModelError::InvalidAttributes { node: 2, .. })
    ));
    let long = BTreeMap::from([(
        "zone".to_owned(),
        "x".repeat(malachi_core::ring::MEMBER_ATTRIBUTE_BYTES_MAX + 1),
    )]);
    assert!(matches!(
        state.apply(set(2, long)),
        Err(ModelError::InvalidAttributes { node: 2, .. })
    ));
    let empty_key = BTreeMap::from([(String::new(), "a".to_owned())]);
    assert!(matches!(
        state.apply(set(2, empty_key)),
        Err(ModelError::InvalidAttributes { node: 2, .. })
    ));
    assert_eq!(ring_of(&state).attributes_of(2), None);
}

/// A ring that never recorded attributes or vnode constraints encodes as
/// before ADR 0121 (the fields are left out), and one that did round-trips.
#[test]
fn ring_attributes_and_vnode_placement_round_trip_and_are_left_out_when_empty() {
    let plain = Ring::new(4).unwrap();
    let mut placed = plain.clone();
    assert!(placed.set_attributes(3, BTreeMap::from([("zone".to_owned(), "c".to_owned())])));
    assert!(placed.set_vnode_placement(vec!["distinct(zone) >= 3".to_owned()]));
    assert!(placed.encode().unwrap().len() > plain.encode().unwrap().len());
    assert_eq!(Ring::decode(&placed.encode().unwrap()).unwrap(), placed);
    assert_eq!(Ring::decode(&plain.encode().unwrap()).unwrap(), plain);
    assert_eq!(placed.version(), plain.version() + 2);
}

/// The encoding is positional: a ring with attributes but no members (a
/// cluster never changed) still decodes, members and all.
#[test]
fn a_ring_with_attributes_and_no_members_round_trips() {
    let mut ring = Ring::new(4).unwrap();
    ring.set_attributes(1, BTreeMap::from([("zone".to_owned(), "a".to_owned())]));
    assert_eq!(Ring::decode(&ring.encode().unwrap()).unwrap(), ring);
    let mut members = Ring::new(4).unwrap();
    members.set_member(&[1, 2], 3, malachi_core::ring::MemberState::Active);
    assert_eq!(Ring::decode(&members.encode().unwrap()).unwrap(), members);
    members.set_vnode_placement(vec!["distinct(zone) >= 2".to_owned()]);
    assert_eq!(Ring::decode(&members.encode().unwrap()).unwrap(), members);
}
