//! The cursor codec: round trips, tamper refusal, stale refusal, and no panic on any input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use malachi_core::cursor::{
    CURSOR_ENCODED_BYTES_MAX, CURSOR_POSITIONS_MAX, CURSOR_VERSION, CURSOR_VERSION_V1, Cursor,
    CursorKey, CursorKeyError, CursorKeys, EncodeCursorError, InvalidCursor, Position,
    ShapeProblem, StaleReason,
};
use malachi_core::model::{
    Command, MetadataState, NodeId, Outcome, RangeId, SealRecord, SegmentId,
};
use malachi_core::model::{CursorKeyRing, CursorSecret};
use proptest::prelude::*;
use sha2::Sha256;
use std::collections::BTreeMap;

const SECRET: &[u8] = b"a cluster secret of enough bytes";

/// The keys of a cluster whose only key, id 0, is `SECRET`.
fn key() -> CursorKeys {
    CursorKeys::single(0, CursorKey::new(SECRET).unwrap())
}

fn cursor(topic: &str, incarnation: u64, positions: &[(u64, Position)]) -> Cursor {
    Cursor {
        topic: topic.into(),
        incarnation,
        positions: positions.iter().map(|(r, p)| (RangeId(*r), *p)).collect(),
    }
}

fn sample() -> Cursor {
    cursor(
        "orders",
        3,
        &[
            (0, Position::Start),
            (
                4,
                Position::At {
                    segment: SegmentId(9),
                    offset: 120,
                },
            ),
        ],
    )
}

/// Builds a correctly tagged cursor around an arbitrary body, as a holder of
/// `secret` could: this pins the wire format and reaches the checks behind
/// the tag. Version 2 carries `key_id`; version 1 carries none.
fn tagged_under(secret: &[u8], version: u8, key_id: u32, body: &[u8]) -> String {
    let mut header = vec![version];
    if version != CURSOR_VERSION_V1 {
        header.extend_from_slice(&key_id.to_be_bytes());
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(b"malachi-cursor\0");
    mac.update(&header);
    mac.update(body);
    let mut raw = header;
    raw.extend_from_slice(body);
    raw.extend_from_slice(&mac.finalize().into_bytes());
    URL_SAFE_NO_PAD.encode(raw)
}

/// `tagged_under` with `SECRET` as key 0.
fn tagged(version: u8, body: &[u8]) -> String {
    tagged_under(SECRET, version, 0, body)
}

#[test]
fn a_cursor_round_trips() {
    let encoded = sample().encode(&key()).unwrap();
    assert_eq!(Cursor::decode(&encoded, &key()), Ok(sample()));
}

#[test]
fn the_wire_form_is_version_key_id_body_and_tag() {
    let encoded = sample().encode(&key()).unwrap();
    let raw = URL_SAFE_NO_PAD.decode(&encoded).unwrap();
    assert_eq!(raw[0], CURSOR_VERSION);
    assert_eq!(raw[1..5], 0u32.to_be_bytes(), "the key id, big-endian");
    let body = &raw[5..raw.len() - 32];
    assert_eq!(tagged(CURSOR_VERSION, body), encoded);
}

/// The bytes of a cursor, split into its parts, for the snapshot.
fn layout(encoded: &str) -> String {
    let raw = URL_SAFE_NO_PAD.decode(encoded).unwrap();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "encoded: {encoded}\nversion: {}\nkey_id:  {}\nbody:    {}\ntag:     {}\n",
        hex(&raw[..1]),
        hex(&raw[1..5]),
        hex(&raw[5..raw.len() - 32]),
        hex(&raw[raw.len() - 32..]),
    )
}

#[test]
fn the_wire_form_is_frozen() {
    let keys = CursorKeys::single(7, CursorKey::new(SECRET).unwrap());
    insta::assert_snapshot!("cursor_v2", layout(&sample().encode(&keys).unwrap()));
}

#[test]
fn a_version_1_cursor_from_before_key_ids_verifies_under_key_0() {
    let body = rmp_serde::to_vec(&("orders", 3u64, vec![(0u64, Position::Start)])).unwrap();
    let legacy = tagged(CURSOR_VERSION_V1, &body);
    let expected = cursor("orders", 3, &[(0, Position::Start)]);
    assert_eq!(Cursor::decode(&legacy, &key()), Ok(expected.clone()));
    // After a rotation, key 0 still verifies it.
    let rotated = ring(&[(0, SECRET), (1, b"the rotated secret of 32 bytes!!")]);
    assert_eq!(Cursor::decode(&legacy, &rotated), Ok(expected));
    // A cluster whose keys lack id 0 cannot verify it.
    let other = CursorKeys::single(1, CursorKey::new(SECRET).unwrap());
    assert_eq!(
        Cursor::decode(&legacy, &other),
        Err(InvalidCursor::UnknownKey { key_id: 0 })
    );
}

/// Cursor keys as a broker builds them from the ring group's record.
fn ring(keys: &[(u32, &[u8])]) -> CursorKeys {
    let ring = CursorKeyRing {
        keys: keys
            .iter()
            .map(|(id, secret)| malachi_core::model::CursorKeyEntry {
                id: *id,
                secret: CursorSecret::new(secret.to_vec()),
                created_at_ms: 0,
            })
            .collect(),
    };
    CursorKeys::from_ring(&ring).unwrap().unwrap()
}

#[test]
fn a_cursor_minted_before_a_rotation_still_verifies_and_new_ones_carry_the_new_id() {
    let before = ring(&[(0, SECRET)]);
    let after = ring(&[(0, SECRET), (1, b"the rotated secret of 32 bytes!!")]);
    assert_eq!(after.current_id(), 1);
    let old = sample().encode(&before).unwrap();
    assert_eq!(Cursor::decode(&old, &after), Ok(sample()));
    let new = sample().encode(&after).unwrap();
    assert_eq!(
        URL_SAFE_NO_PAD.decode(&new).unwrap()[1..5],
        1u32.to_be_bytes()
    );
    assert_eq!(Cursor::decode(&new, &after), Ok(sample()));
    // A broker that has not learned key 1 refuses it as unknown, not forged.
    assert_eq!(
        Cursor::decode(&new, &before),
        Err(InvalidCursor::UnknownKey { key_id: 1 })
    );
}

#[test]
fn a_cursor_relabelled_with_another_key_id_is_refused() {
    let keys = ring(&[(0, SECRET), (1, b"the rotated secret of 32 bytes!!")]);
    let mut raw = URL_SAFE_NO_PAD
        .decode(sample().encode(&keys).unwrap())
        .unwrap();
    raw[1..5].copy_from_slice(&0u32.to_be_bytes());
    assert_eq!(
        Cursor::decode(&URL_SAFE_NO_PAD.encode(raw), &keys),
        Err(InvalidCursor::BadTag)
    );
}

#[test]
fn an_unknown_key_id_is_a_typed_refusal() {
    let body = rmp_serde::to_vec(&("orders", 3u64, vec![(0u64, Position::Start)])).unwrap();
    let minted = tagged_under(SECRET, CURSOR_VERSION, 42, &body);
    assert_eq!(
        Cursor::decode(&minted, &key()),
        Err(InvalidCursor::UnknownKey { key_id: 42 })
    );
}

#[test]
fn changing_any_byte_of_a_cursor_is_refused() {
    let encoded = sample().encode(&key()).unwrap();
    let raw = URL_SAFE_NO_PAD.decode(&encoded).unwrap();
    for i in 0..raw.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut tampered = raw.clone();
            tampered[i] ^= flip;
            let result = Cursor::decode(&URL_SAFE_NO_PAD.encode(&tampered), &key());
            assert!(result.is_err(), "byte {i} xor {flip:#x} was accepted");
        }
    }
}

#[test]
fn changing_any_character_of_the_encoded_cursor_is_refused() {
    let encoded = sample().encode(&key()).unwrap();
    for i in 0..encoded.len() {
        let mut chars: Vec<char> = encoded.chars().collect();
        chars[i] = if chars[i] == 'A' { 'B' } else { 'A' };
        let tampered: String = chars.into_iter().collect();
        assert!(
            Cursor::decode(&tampered, &key()).is_err(),
            "character {i} was accepted"
        );
    }
}

#[test]
fn a_truncated_cursor_is_refused() {
    let encoded = sample().encode(&key()).unwrap();
    for len in 0..encoded.len() {
        assert!(
            Cursor::decode(&encoded[..len], &key()).is_err(),
            "prefix of {len} accepted"
        );
    }
}

#[test]
fn a_cursor_under_another_secret_is_refused_as_a_bad_tag() {
    let other = CursorKeys::single(
        0,
        CursorKey::new(b"another secret of enough bytes!!").unwrap(),
    );
    let encoded = sample().encode(&other).unwrap();
    assert_eq!(Cursor::decode(&encoded, &key()), Err(InvalidCursor::BadTag));
}

#[test]
fn an_unknown_version_is_refused() {
    let encoded = sample().encode(&key()).unwrap();
    let mut raw = URL_SAFE_NO_PAD.decode(&encoded).unwrap();
    raw[0] = 3;
    assert_eq!(
        Cursor::decode(&URL_SAFE_NO_PAD.encode(raw), &key()),
        Err(InvalidCursor::BadVersion { found: 3 })
    );
}

#[test]
fn an_overlong_cursor_is_refused_before_decoding() {
    let long = "A".repeat(CURSOR_ENCODED_BYTES_MAX + 1);
    assert_eq!(
        Cursor::decode(&long, &key()),
        Err(InvalidCursor::TooLong {
            bytes: CURSOR_ENCODED_BYTES_MAX + 1,
            max: CURSOR_ENCODED_BYTES_MAX
        })
    );
}

#[test]
fn a_tagged_body_that_is_not_a_cursor_is_malformed() {
    assert_eq!(
        Cursor::decode(&tagged(CURSOR_VERSION, b"\xc1\x00"), &key()),
        Err(InvalidCursor::Malformed)
    );
}

#[test]
fn a_tagged_body_with_trailing_bytes_is_malformed() {
    let mut body = rmp_serde::to_vec(&("orders", 3u64, vec![(0u64, Position::Start)])).unwrap();
    assert!(Cursor::decode(&tagged(CURSOR_VERSION, &body), &key()).is_ok());
    body.push(0);
    assert_eq!(
        Cursor::decode(&tagged(CURSOR_VERSION, &body), &key()),
        Err(InvalidCursor::Malformed)
    );
}

#[test]
fn a_tagged_body_with_repeated_ranges_has_a_bad_shape() {
    let body = rmp_serde::to_vec(&(
        "orders",
        3u64,
        vec![(5u64, Position::Start), (5u64, Position::Start)],
    ))
    .unwrap();
    assert_eq!(
        Cursor::decode(&tagged(CURSOR_VERSION, &body), &key()),
        Err(InvalidCursor::Shape(ShapeProblem::UnorderedPositions))
    );
}

#[test]
fn a_tagged_body_without_positions_has_a_bad_shape() {
    let body = rmp_serde::to_vec(&("orders", 3u64, Vec::<(u64, Position)>::new())).unwrap();
    assert_eq!(
        Cursor::decode(&tagged(CURSOR_VERSION, &body), &key()),
        Err(InvalidCursor::Shape(ShapeProblem::NoPositions))
    );
}

#[test]
fn encoding_more_positions_than_a_reader_accepts_is_refused() {
    let positions: Vec<(u64, Position)> = (0..=CURSOR_POSITIONS_MAX as u64)
        .map(|r| (r, Position::Start))
        .collect();
    assert_eq!(
        cursor("t", 0, &positions).encode(&key()),
        Err(EncodeCursorError::Shape(ShapeProblem::TooManyPositions))
    );
    let at_limit = cursor("t", 0, &positions[..CURSOR_POSITIONS_MAX]);
    let encoded = at_limit.encode(&key()).unwrap();
    assert_eq!(Cursor::decode(&encoded, &key()), Ok(at_limit));
}

#[test]
fn the_largest_cursor_at_its_largest_positions_fits_the_decode_bound() {
    let positions: Vec<(u64, Position)> = (0..CURSOR_POSITIONS_MAX as u64)
        .map(|i| {
            (
                u64::MAX - i,
                Position::At {
                    segment: SegmentId(u64::MAX),
                    offset: u64::MAX,
                },
            )
        })
        .rev()
        .collect();
    let largest = cursor(&"t".repeat(249), u64::MAX, &positions);
    let encoded = largest.encode(&key()).unwrap();
    assert!(encoded.len() <= CURSOR_ENCODED_BYTES_MAX);
    assert_eq!(Cursor::decode(&encoded, &key()), Ok(largest));
}

#[test]
fn a_short_secret_is_refused() {
    assert_eq!(
        CursorKey::new(b"short").unwrap_err(),
        CursorKeyError::TooShort { bytes: 5, min: 16 }
    );
}

#[test]
fn a_key_does_not_print_its_secret() {
    assert!(!format!("{:?}", key()).contains("secret"));
    assert!(!format!("{:?}", CursorKey::new(SECRET).unwrap()).contains("secret"));
}

// ---------------------------------------------------------------- staleness

fn topic_with_a_split() -> (MetadataState, RangeId, RangeId, SegmentId) {
    let mut state = MetadataState::new();
    state
        .apply(Command::CreateTopic {
            topic: "orders".into(),
            initial_ranges: 1,
            policy: None,
            replicas: vec![vec![NodeId(1)]],
            at_ms: 0,
        })
        .unwrap();
    let Outcome::RangeSplit {
        parent,
        upper,
        upper_segment,
        ..
    } = state
        .apply(Command::SplitRange {
            topic: "orders".into(),
            range: RangeId(0),
            seal: SealRecord {
                length: 10,
                bytes: 100,
            },
            lower_replicas: vec![NodeId(1)],
            upper_replicas: vec![NodeId(2)],
            at_ms: 1,
            segment: None,
        })
        .unwrap()
    else {
        panic!()
    };
    (state, parent, upper, upper_segment)
}

fn incarnation(state: &MetadataState) -> u64 {
    state.topic("orders").unwrap().incarnation.0
}

#[test]
fn a_cursor_inside_an_ancestor_slice_is_valid_for_the_child() {
    let (state, parent, upper, _) = topic_with_a_split();
    let parent_segment = state.range(parent).unwrap().segments[0];
    let c = cursor(
        "orders",
        incarnation(&state),
        &[(
            upper.0,
            Position::At {
                segment: parent_segment,
                offset: 10,
            },
        )],
    );
    let encoded = c.encode(&key()).unwrap();
    assert_eq!(Cursor::decode_for(&encoded, &key(), &state), Ok(c));
}

#[test]
fn a_cursor_of_a_deleted_topic_is_stale() {
    let (mut state, _, upper, _) = topic_with_a_split();
    let c = cursor("orders", incarnation(&state), &[(upper.0, Position::Start)]);
    state
        .apply(Command::DeleteTopic {
            topic: "orders".into(),
        })
        .unwrap();
    assert_eq!(
        c.validate(&state),
        Err(InvalidCursor::Stale(StaleReason::TopicGone))
    );
}

#[test]
fn a_cursor_of_a_recreated_topic_is_stale() {
    let (mut state, _, _, _) = topic_with_a_split();
    let c = cursor("orders", incarnation(&state), &[(0, Position::Start)]);
    state
        .apply(Command::DeleteTopic {
            topic: "orders".into(),
        })
        .unwrap();
    state
        .apply(Command::CreateTopic {
            topic: "orders".into(),
            initial_ranges: 1,
            policy: None,
            replicas: vec![vec![NodeId(1)]],
            at_ms: 5,
        })
        .unwrap();
    let current = incarnation(&state);
    assert_eq!(
        c.validate(&state),
        Err(InvalidCursor::Stale(StaleReason::IncarnationChanged {
            current
        }))
    );
}

#[test]
fn a_cursor_naming_a_range_of_another_topic_is_stale() {
    let (mut state, _, _, _) = topic_with_a_split();
    let Outcome::TopicCreated { ranges, .. } = state
        .apply(Command::CreateTopic {
            topic: "other".into(),
            initial_ranges: 1,
            policy: None,
            replicas: vec![vec![NodeId(1)]],
            at_ms: 2,
        })
        .unwrap()
    else {
        panic!()
    };
    let c = cursor(
        "orders",
        incarnation(&state),
        &[(ranges[0].0, Position::Start)],
    );
    assert_eq!(
        c.validate(&state),
        Err(InvalidCursor::Stale(StaleReason::UnknownRange {
            range: ranges[0]
        }))
    );
}

/// Chaos finding F5: a cursor minted by the broker that had applied a
/// failover's roll was validated, seconds later, against another broker's
/// replica that had not, and refused as stale (`invalid_cursor`, which a
/// client must not retry). What the replica has not issued yet (a range
/// or segment id past its counters) makes it `ReplicaBehind`, and the
/// same cursor validates once the replica has applied the roll.
#[test]
fn a_cursor_from_a_newer_state_is_behind_not_stale_and_validates_once_caught_up() {
    let (mut state, _, upper, upper_segment) = topic_with_a_split();
    let behind = state.clone();
    let Outcome::SegmentRolled { next, .. } = state
        .apply(Command::RollSegment {
            topic: "orders".into(),
            segment: upper_segment,
            seal: SealRecord {
                length: 4,
                bytes: 40,
            },
            next_replicas: vec![NodeId(3)],
            at_ms: 2,
        })
        .unwrap()
    else {
        panic!()
    };
    let c = cursor(
        "orders",
        incarnation(&state),
        &[(
            upper.0,
            Position::At {
                segment: next,
                offset: 6,
            },
        )],
    );
    assert_eq!(
        c.validate(&behind),
        Err(InvalidCursor::ReplicaBehind(StaleReason::UnknownSegment {
            range: upper,
            segment: next
        }))
    );
    assert_eq!(c.validate(&state), Ok(()));
    // A range or incarnation the replica has not issued is behind too.
    let unissued = cursor("orders", incarnation(&state), &[(77, Position::Start)]);
    assert_eq!(
        unissued.validate(&state),
        Err(InvalidCursor::ReplicaBehind(StaleReason::UnknownRange {
            range: RangeId(77)
        }))
    );
    let newer = cursor(
        "orders",
        incarnation(&state) + 1,
        &[(upper.0, Position::Start)],
    );
    assert!(matches!(
        newer.validate(&state),
        Err(InvalidCursor::ReplicaBehind(
            StaleReason::IncarnationChanged { .. }
        ))
    ));
}

#[test]
fn a_cursor_naming_a_segment_outside_the_read_plan_is_stale() {
    let (state, _, upper, _) = topic_with_a_split();
    let lower_segment = state.active_ranges("orders").next().unwrap().segments[0];
    let c = cursor(
        "orders",
        incarnation(&state),
        &[(
            upper.0,
            Position::At {
                segment: lower_segment,
                offset: 0,
            },
        )],
    );
    assert_eq!(
        c.validate(&state),
        Err(InvalidCursor::Stale(StaleReason::UnknownSegment {
            range: upper,
            segment: lower_segment
        }))
    );
}

#[test]
fn a_cursor_past_a_sealed_segment_end_is_stale() {
    let (state, parent, upper, _) = topic_with_a_split();
    let parent_segment = state.range(parent).unwrap().segments[0];
    let c = cursor(
        "orders",
        incarnation(&state),
        &[(
            upper.0,
            Position::At {
                segment: parent_segment,
                offset: 11,
            },
        )],
    );
    assert_eq!(
        c.validate(&state),
        Err(InvalidCursor::Stale(StaleReason::OffsetOutOfSegment {
            segment: parent_segment,
            offset: 11
        }))
    );
}

// ---------------------------------------------------------------- properties

fn position() -> impl Strategy<Value = Position> {
    prop_oneof![
        Just(Position::Start),
        (any::<u64>(), any::<u64>()).prop_map(|(s, o)| Position::At {
            segment: SegmentId(s),
            offset: o
        }),
    ]
}

fn any_cursor() -> impl Strategy<Value = Cursor> {
    (
        "[a-z0-9._-]{1,40}",
        any::<u64>(),
        prop::collection::btree_map(any::<u64>(), position(), 1..20),
    )
        .prop_map(|(topic, incarnation, positions)| Cursor {
            topic,
            incarnation,
            positions: positions
                .into_iter()
                .map(|(r, p)| (RangeId(r), p))
                .collect::<BTreeMap<_, _>>(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_valid_cursor_round_trips(c in any_cursor()) {
        let encoded = c.encode(&key()).unwrap();
        prop_assert_eq!(Cursor::decode(&encoded, &key()), Ok(c));
    }

    #[test]
    fn arbitrary_bytes_are_refused_without_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        prop_assert!(Cursor::decode(&URL_SAFE_NO_PAD.encode(&bytes), &key()).is_err());
    }

    #[test]
    fn arbitrary_strings_are_refused_without_a_panic(s in ".{0,300}") {
        prop_assert!(Cursor::decode(&s, &key()).is_err());
    }

    #[test]
    fn arbitrary_tagged_bodies_decode_or_refuse_without_a_panic(body in prop::collection::vec(any::<u8>(), 0..256)) {
        // Behind a valid tag, only well-formed bodies may pass, and they must re-encode identically.
        if let Ok(c) = Cursor::decode(&tagged(CURSOR_VERSION, &body), &key()) {
            prop_assert_eq!(c.encode(&key()).unwrap(), tagged(CURSOR_VERSION, &body));
        }
    }

    #[test]
    fn flipping_a_random_byte_of_a_random_cursor_is_refused(c in any_cursor(), index in any::<usize>(), flip in 1u8..) {
        let mut raw = URL_SAFE_NO_PAD.decode(c.encode(&key()).unwrap()).unwrap();
        let i = index % raw.len();
        raw[i] ^= flip;
        prop_assert!(Cursor::decode(&URL_SAFE_NO_PAD.encode(&raw), &key()).is_err());
    }
}
