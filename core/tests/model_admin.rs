//! The admin stores in the ring's group (ADR 0148): users and their SCRAM
//! credentials, ACL entries and the lockout table, as commands of the
//! metadata state machine. Each command is validated (typed refusals that
//! leave the state byte for byte as it was) and applied deterministically;
//! the state's encoding keeps states from before the stores decoding, and
//! states without the stores encoding exactly as before.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_core::auth::acl::{
    AclEntry, NamePattern, Operation, Permission, Principal, PrincipalPattern, Resource,
    ResourcePattern,
};
use malachi_core::auth::lockout::{LockoutKey, LockoutPolicy};
use malachi_core::auth::scram::StoredCredential;
use malachi_core::model::{
    Command, CursorSecret, LOCKOUT_ENTRIES_MAX, MetadataState, ModelError, Outcome, UserNameRule,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// A credential without running PBKDF2: the store only checks its bounds.
fn credential(fill: u8, iterations: u32) -> StoredCredential {
    StoredCredential::from_salted(&[fill; 32], &[fill; 16], iterations)
}

fn put(name: &str, fill: u8, replace: bool, at_ms: u64) -> Command {
    Command::PutUser {
        name: name.to_owned(),
        credential: credential(fill, 4096),
        replace,
        at_ms,
    }
}

fn allow(user: &str, topic: &str, operation: Operation) -> AclEntry {
    AclEntry {
        principal: PrincipalPattern::User(Principal::user(user)),
        resource: ResourcePattern::Topic(NamePattern::Literal(topic.to_owned())),
        operation,
        permission: Permission::Allow,
    }
}

fn key(principal: &str, source: &str) -> LockoutKey {
    LockoutKey {
        principal: principal.to_owned(),
        source: source.to_owned(),
    }
}

/// Applies `command`; on a refusal, asserts the state did not change.
fn apply(state: &mut MetadataState, command: Command) -> Result<Outcome, ModelError> {
    let before = state.snapshot().unwrap();
    let result = state.apply(command);
    if result.is_err() {
        assert_eq!(
            state.snapshot().unwrap(),
            before,
            "a refusal changed the state"
        );
    }
    result
}

#[test]
fn a_user_is_created_repeated_refused_without_replace_and_replaced() {
    let mut state = MetadataState::new();
    assert_eq!(
        apply(&mut state, put("alice", 1, false, 10)),
        Ok(Outcome::UserPut { created: true })
    );
    // The same creation again (its answer lost) is a no-op.
    assert_eq!(
        apply(&mut state, put("alice", 1, false, 20)),
        Ok(Outcome::Unchanged)
    );
    assert_eq!(
        apply(&mut state, put("alice", 2, false, 30)),
        Err(ModelError::UserExists {
            name: "alice".into()
        })
    );
    assert_eq!(
        apply(&mut state, put("alice", 2, true, 40)),
        Ok(Outcome::UserPut { created: false })
    );
    let view = state.auth_view();
    let user = &view.users["alice"];
    assert_eq!(user.credential, credential(2, 4096));
    assert_eq!((user.created_at_ms, user.updated_at_ms), (10, 40));
    assert_eq!(view.credential("alice"), Some(&credential(2, 4096)));
    assert_eq!(view.credential("bob"), None);
}

#[test]
fn user_names_keep_their_rule() {
    let mut state = MetadataState::new();
    let long = "a".repeat(256);
    for (name, reason) in [
        ("", UserNameRule::Empty),
        (long.as_str(), UserNameRule::TooLong),
        ("a,b", UserNameRule::BadCharacter),
        ("a=b", UserNameRule::BadCharacter),
        ("User:a", UserNameRule::BadCharacter),
        ("*", UserNameRule::BadCharacter),
        ("a b", UserNameRule::BadCharacter),
        ("é", UserNameRule::BadCharacter),
    ] {
        assert_eq!(
            apply(&mut state, put(name, 1, false, 1)),
            Err(ModelError::InvalidUserName {
                name: name.to_owned(),
                reason
            }),
            "{name:?}"
        );
    }
    for name in [
        "a",
        "svc-orders_2.prod",
        "ops@example.com",
        &"z".repeat(255),
    ] {
        assert!(
            apply(&mut state, put(name, 1, false, 1)).is_ok(),
            "{name:?}"
        );
    }
    assert_eq!(state.auth_view().users.len(), 4);
}

#[test]
fn a_credential_below_4096_iterations_or_with_a_short_salt_is_refused() {
    let mut state = MetadataState::new();
    let weak = Command::PutUser {
        name: "alice".into(),
        credential: credential(1, 4095),
        replace: false,
        at_ms: 1,
    };
    assert_eq!(
        apply(&mut state, weak),
        Err(ModelError::CredentialIterations {
            iterations: 4095,
            min: 4096,
            max: 10_000_000
        })
    );
    let short_salt = Command::PutUser {
        name: "alice".into(),
        credential: StoredCredential::from_salted(&[1; 32], &[1; 8], 4096),
        replace: false,
        at_ms: 1,
    };
    assert_eq!(
        apply(&mut state, short_salt),
        Err(ModelError::CredentialSalt {
            bytes: 8,
            min: 16,
            max: 64
        })
    );
    assert!(state.auth_view().users.is_empty());
}

#[test]
fn deleting_a_missing_user_is_refused_and_a_deletion_clears_its_lockout() {
    let mut state = MetadataState::new();
    assert_eq!(
        apply(
            &mut state,
            Command::DeleteUser {
                name: "alice".into()
            }
        ),
        Err(ModelError::NoSuchUser {
            name: "alice".into()
        })
    );
    apply(&mut state, put("alice", 1, false, 1)).unwrap();
    apply(&mut state, put("bob", 2, false, 1)).unwrap();
    for (who, at_ms) in [("alice", 100), ("bob", 100)] {
        apply(
            &mut state,
            Command::RecordLoginFailure {
                key: key(who, "10.0.0.1"),
                policy: LockoutPolicy::default(),
                at_ms,
            },
        )
        .unwrap();
    }
    assert_eq!(
        apply(
            &mut state,
            Command::DeleteUser {
                name: "alice".into()
            }
        ),
        Ok(Outcome::UserDeleted)
    );
    let view = state.auth_view();
    assert_eq!(view.users.keys().collect::<Vec<_>>(), ["bob"]);
    assert_eq!(view.lockout.len(), 1, "bob's key stays");
}

#[test]
fn acl_entries_add_idempotently_and_removing_a_missing_one_is_refused() {
    let mut state = MetadataState::new();
    let entry = allow("alice", "orders", Operation::Produce);
    assert_eq!(
        apply(
            &mut state,
            Command::AddAcl {
                entry: entry.clone()
            }
        ),
        Ok(Outcome::AclAdded)
    );
    assert_eq!(
        apply(
            &mut state,
            Command::AddAcl {
                entry: entry.clone()
            }
        ),
        Ok(Outcome::Unchanged)
    );
    assert_eq!(state.auth_view().acls, vec![entry.clone()]);
    assert_eq!(
        apply(
            &mut state,
            Command::RemoveAcl {
                entry: entry.clone()
            }
        ),
        Ok(Outcome::AclRemoved)
    );
    assert_eq!(
        apply(
            &mut state,
            Command::RemoveAcl {
                entry: entry.clone()
            }
        ),
        Err(ModelError::NoSuchAcl {
            entry: Box::new(entry)
        })
    );
    let empty_name = allow("alice", "", Operation::Produce);
    assert!(matches!(
        apply(&mut state, Command::AddAcl { entry: empty_name }),
        Err(ModelError::InvalidAcl { .. })
    ));
}

#[test]
fn the_view_decides_with_the_entries_and_the_superusers() {
    let mut state = MetadataState::new();
    for entry in [
        allow("alice", "orders", Operation::Produce),
        AclEntry {
            permission: Permission::Deny,
            ..allow("alice", "orders", Operation::Describe)
        },
    ] {
        apply(&mut state, Command::AddAcl { entry }).unwrap();
    }
    let authorizer = state
        .auth_view()
        .authorizer([Principal::user("root")])
        .unwrap();
    let orders = Resource::Topic("orders");
    let alice = Principal::user("alice");
    assert!(
        authorizer
            .decide(&alice, Operation::Produce, orders)
            .is_allowed()
    );
    assert!(
        !authorizer
            .decide(&alice, Operation::Describe, orders)
            .is_allowed()
    );
    assert!(
        !authorizer
            .decide(&Principal::user("bob"), Operation::Produce, orders)
            .is_allowed()
    );
    assert!(
        authorizer
            .decide(
                &Principal::user("root"),
                Operation::Admin,
                Resource::Cluster
            )
            .is_allowed()
    );
}

#[test]
fn lockout_failures_delay_then_lock_and_an_unlock_clears_every_source() {
    let mut state = MetadataState::new();
    let policy = LockoutPolicy {
        lock_after_failures: Some(3),
        ..LockoutPolicy::default()
    };
    let fail = |at_ms, source: &str| Command::RecordLoginFailure {
        key: key("alice", source),
        policy,
        at_ms,
    };
    assert_eq!(
        apply(&mut state, fail(1_000, "a")),
        Ok(Outcome::LoginFailureRecorded {
            retry_at_ms: 2_000,
            locked: false
        })
    );
    assert_eq!(
        apply(&mut state, fail(2_000, "a")),
        Ok(Outcome::LoginFailureRecorded {
            retry_at_ms: 4_000,
            locked: false
        })
    );
    assert_eq!(
        apply(&mut state, fail(4_000, "a")),
        Ok(Outcome::LoginFailureRecorded {
            retry_at_ms: 4_000 + 15 * 60 * 1_000,
            locked: true
        })
    );
    apply(&mut state, fail(4_000, "b")).unwrap();
    assert_eq!(
        apply(
            &mut state,
            Command::RecordLoginSuccess {
                key: key("alice", "b")
            }
        ),
        Ok(Outcome::LockoutCleared { keys: 1 })
    );
    apply(&mut state, fail(5_000, "b")).unwrap();
    assert_eq!(
        apply(
            &mut state,
            Command::UnlockUser {
                name: "alice".into()
            }
        ),
        Ok(Outcome::LockoutCleared { keys: 2 })
    );
    assert!(state.auth_view().lockout.is_empty());
}

#[test]
fn a_lockout_record_out_of_bounds_is_refused() {
    let mut state = MetadataState::new();
    let cases = [
        (key("", "a"), LockoutPolicy::default()),
        (key("alice", ""), LockoutPolicy::default()),
        (key("alice", &"1".repeat(65)), LockoutPolicy::default()),
    ];
    for (key, policy) in cases {
        let refused = apply(
            &mut state,
            Command::RecordLoginFailure {
                key,
                policy,
                at_ms: 1,
            },
        );
        assert!(
            matches!(refused, Err(ModelError::InvalidLockout { .. })),
            "{refused:?}"
        );
    }
}

/// Regression: a policy's `entries_max` shrinking between two failures
/// (a broker's configuration changed) must not leave the table above the
/// bound `Lockout::record_failure` asserts, a panic in every replica. The
/// store keeps its own bound, whatever the command carries.
#[test]
fn a_shrinking_policy_bound_never_panics_the_apply() {
    let mut state = MetadataState::new();
    for (source, entries_max) in [("a", 100), ("b", 100), ("c", 100), ("d", 1), ("e", 0)] {
        let outcome = apply(
            &mut state,
            Command::RecordLoginFailure {
                key: key("alice", source),
                policy: LockoutPolicy {
                    entries_max,
                    ..LockoutPolicy::default()
                },
                at_ms: 1_000,
            },
        );
        assert!(outcome.is_ok(), "{outcome:?}");
    }
    assert_eq!(state.auth_view().lockout.len(), 5);
    assert!(state.auth_view().lockout.len() <= LOCKOUT_ENTRIES_MAX);
}

/// The cursor-key state of `format_snapshots__metadata_state_cursor_keys`,
/// as brokers wrote it before the admin stores: it still restores, holds
/// no admin store, and encodes back to the same bytes.
#[test]
fn a_snapshot_from_before_the_admin_stores_decodes_and_encodes_as_before() {
    let mut state = MetadataState::new();
    state.apply(Command::InitRing { vnodes: 2 }).unwrap();
    state
        .apply(Command::CreateCursorKey {
            secret: CursorSecret::new(vec![0x11; 16]),
            at_ms: 1_700_000_000_000,
        })
        .unwrap();
    state
        .apply(Command::RotateCursorKey {
            after: 0,
            secret: CursorSecret::new(vec![0x22; 16]),
            at_ms: 1_700_000_100_000,
        })
        .unwrap();
    let frozen = concat!(
        "019c80808080000000c0c0c0939301820092009200c410000000000000000080",
        "00000000000000cf8000000000000000920192cf8000000000000000c4100000",
        "000000000001000000000000000002c00291929300dc00101111111111111111",
        "1111111111111111cf0000018bcfe568009301dc001022222222222222222222",
        "222222222222cf0000018bcfe6eea0",
    );
    let hex = frozen;
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let restored = MetadataState::restore(&bytes).unwrap();
    assert_eq!(restored, state);
    assert_eq!(restored.auth_view(), Default::default());
    assert_eq!(restored.snapshot().unwrap(), bytes);
    // A state with neither still encodes as the 11 fields it always had.
    let bare = MetadataState::new().snapshot().unwrap();
    assert_eq!(bare[1], 0x9b, "array of 11");
}

/// With the admin store and no cursor keys, the keys' slot is written as
/// nil so the store lands in its own position.
#[test]
fn a_state_holding_the_stores_with_or_without_cursor_keys_restores() {
    let mut state = MetadataState::new();
    state.apply(Command::InitRing { vnodes: 2 }).unwrap();
    state.apply(put("alice", 1, false, 5)).unwrap();
    let bytes = state.snapshot().unwrap();
    assert_eq!(
        bytes[1], 0x9d,
        "array of 13: cursor keys nil, then the store"
    );
    let restored = MetadataState::restore(&bytes).unwrap();
    assert_eq!(restored, state);
    assert!(restored.cursor_keys().is_none());
    state
        .apply(Command::CreateCursorKey {
            secret: CursorSecret::new(vec![0x11; 16]),
            at_ms: 6,
        })
        .unwrap();
    let restored = MetadataState::restore(&state.snapshot().unwrap()).unwrap();
    assert_eq!(restored, state);
    assert_eq!(restored.auth_view().users.len(), 1);
}

#[derive(Debug, Clone)]
enum Op {
    Put { user: u8, fill: u8, replace: bool },
    Delete { user: u8 },
    Add { user: u8, topic: u8 },
    Remove { user: u8, topic: u8 },
    Fail { user: u8, source: u8 },
    Succeed { user: u8, source: u8 },
    Unlock { user: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..4u8, 0..3u8, any::<bool>()).prop_map(|(user, fill, replace)| Op::Put {
            user,
            fill,
            replace
        }),
        (0..4u8).prop_map(|user| Op::Delete { user }),
        (0..4u8, 0..3u8).prop_map(|(user, topic)| Op::Add { user, topic }),
        (0..4u8, 0..3u8).prop_map(|(user, topic)| Op::Remove { user, topic }),
        (0..4u8, 0..2u8).prop_map(|(user, source)| Op::Fail { user, source }),
        (0..4u8, 0..2u8).prop_map(|(user, source)| Op::Succeed { user, source }),
        (0..4u8).prop_map(|user| Op::Unlock { user }),
    ]
}

fn command(op: &Op, at_ms: u64) -> Command {
    let name = |user: &u8| format!("u{user}");
    let acl = |user: &u8, topic: &u8| allow(&name(user), &format!("t{topic}"), Operation::Consume);
    match op {
        Op::Put {
            user,
            fill,
            replace,
        } => put(&name(user), *fill, *replace, at_ms),
        Op::Delete { user } => Command::DeleteUser { name: name(user) },
        Op::Add { user, topic } => Command::AddAcl {
            entry: acl(user, topic),
        },
        Op::Remove { user, topic } => Command::RemoveAcl {
            entry: acl(user, topic),
        },
        Op::Fail { user, source } => Command::RecordLoginFailure {
            key: key(&name(user), &format!("s{source}")),
            policy: LockoutPolicy::default(),
            at_ms,
        },
        Op::Succeed { user, source } => Command::RecordLoginSuccess {
            key: key(&name(user), &format!("s{source}")),
        },
        Op::Unlock { user } => Command::UnlockUser { name: name(user) },
    }
}

proptest! {
    /// Any sequence of admin commands: a refusal changes nothing; the
    /// users and entries are those a plain map and set would hold; the
    /// state restores from its snapshot; and replaying the same commands
    /// gives the same bytes (replicas agree).
    #[test]
    fn admin_commands_match_a_reference_and_replay_to_the_same_bytes(
        ops in proptest::collection::vec(op(), 0..60)
    ) {
        let mut state = MetadataState::new();
        let mut users: BTreeMap<String, u8> = BTreeMap::new();
        let mut acls: BTreeSet<AclEntry> = BTreeSet::new();
        let mut log = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let cmd = command(op, 1_000 * i as u64);
            log.push(cmd.clone());
            let result = apply(&mut state, cmd.clone());
            match (&cmd, op) {
                (Command::PutUser { name, replace, .. }, Op::Put { fill, .. }) => {
                    match users.get(name) {
                        Some(f) if f != fill && !replace => {
                            let refused = matches!(result, Err(ModelError::UserExists { .. }));
                            prop_assert!(refused);
                        }
                        _ => {
                            prop_assert!(result.is_ok());
                            users.insert(name.clone(), *fill);
                        }
                    }
                }
                (Command::DeleteUser { name }, _) => {
                    prop_assert_eq!(users.remove(name).is_some(), result.is_ok());
                }
                (Command::AddAcl { entry }, _) => {
                    prop_assert!(result.is_ok());
                    acls.insert(entry.clone());
                }
                (Command::RemoveAcl { entry }, _) => {
                    prop_assert_eq!(acls.remove(entry), result.is_ok());
                }
                _ => prop_assert!(result.is_ok()),
            }
            prop_assert_eq!(state.check_invariants(), Ok(()));
        }
        let view = state.auth_view();
        let expected: BTreeMap<String, StoredCredential> = users
            .iter()
            .map(|(name, fill)| (name.clone(), credential(*fill, 4096)))
            .collect();
        let held: BTreeMap<String, StoredCredential> = view
            .users
            .iter()
            .map(|(name, user)| (name.clone(), user.credential.clone()))
            .collect();
        prop_assert_eq!(held, expected);
        prop_assert_eq!(view.acls, acls.into_iter().collect::<Vec<_>>());
        let bytes = state.snapshot().unwrap();
        prop_assert_eq!(&MetadataState::restore(&bytes).unwrap(), &state);
        let mut replica = MetadataState::new();
        for cmd in log {
            let _ = replica.apply(cmd);
        }
        prop_assert_eq!(replica.snapshot().unwrap(), bytes);
    }
}

/// Token issuer keys (ADR 0152): added once, the same key again a no-op,
/// another key under a used key id refused, removed, bounded; each
/// refusal leaves the state as it was.
#[test]
fn token_keys_are_added_refused_and_removed() {
    use malachi_core::auth::token::{TOKEN_KEYS_MAX, TokenAlgorithm, TokenKey};
    let key = |kid: &str, pem: &str| TokenKey {
        kid: kid.into(),
        algorithm: TokenAlgorithm::EdDSA,
        public_key_pem: pem.into(),
        added_at_ms: 1,
    };
    let mut state = MetadataState::default();
    state.apply(Command::InitRing { vnodes: 1 }).unwrap();
    let before = state.snapshot().unwrap();
    assert_eq!(
        state.apply(Command::AddTokenKey {
            key: key("k 1", "pem")
        }),
        Err(ModelError::InvalidTokenKey {
            reason: "token-kid-invalid: \"k 1\" is not 1 to 64 bytes of [A-Za-z0-9._-]".into()
        })
    );
    assert!(matches!(
        state.apply(Command::AddTokenKey { key: key("k1", "") }),
        Err(ModelError::InvalidTokenKey { .. })
    ));
    assert_eq!(state.snapshot().unwrap(), before, "refusals write nothing");
    assert_eq!(
        state.apply(Command::AddTokenKey {
            key: key("k1", "pem-a")
        }),
        Ok(Outcome::TokenKeyAdded)
    );
    assert_eq!(
        state.apply(Command::AddTokenKey {
            key: key("k1", "pem-a")
        }),
        Ok(Outcome::Unchanged)
    );
    let with_one = state.snapshot().unwrap();
    assert_eq!(
        state.apply(Command::AddTokenKey {
            key: key("k1", "pem-b")
        }),
        Err(ModelError::TokenKeyExists { kid: "k1".into() })
    );
    assert_eq!(state.snapshot().unwrap(), with_one);
    for i in 1..TOKEN_KEYS_MAX {
        let kid = format!("k-{i}");
        state
            .apply(Command::AddTokenKey {
                key: key(&kid, "pem"),
            })
            .unwrap();
    }
    assert_eq!(
        state.apply(Command::AddTokenKey {
            key: key("one-more", "pem")
        }),
        Err(ModelError::TooManyTokenKeys {
            max: TOKEN_KEYS_MAX
        })
    );
    assert_eq!(
        state.apply(Command::RemoveTokenKey { kid: "k1".into() }),
        Ok(Outcome::TokenKeyRemoved)
    );
    assert_eq!(
        state.apply(Command::RemoveTokenKey { kid: "k1".into() }),
        Err(ModelError::NoSuchTokenKey { kid: "k1".into() })
    );
    assert_eq!(state.auth_view().token_keys.len(), TOKEN_KEYS_MAX - 1);
    let restored = MetadataState::restore(&state.snapshot().unwrap()).unwrap();
    assert_eq!(restored, state);
}
