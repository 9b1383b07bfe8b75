//! Authorization (ADR 0146): deny by default under authentication, deny
//! beats allow in any order, literal and prefix names match exactly what
//! they say, and adding an allow never removes access nor a deny grants it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_core::auth::acl::{
    AclEntry, AclError, AllowReason, Authorizer, Decision, DenyReason, NamePattern, Operation,
    Permission, Principal, PrincipalPattern, Resource, ResourcePattern,
};
use proptest::prelude::*;

fn alice() -> Principal {
    Principal::user("alice")
}

fn entry(
    principal: PrincipalPattern,
    resource: ResourcePattern,
    operation: Operation,
    permission: Permission,
) -> AclEntry {
    AclEntry {
        principal,
        resource,
        operation,
        permission,
    }
}

fn topic_literal(name: &str) -> ResourcePattern {
    ResourcePattern::Topic(NamePattern::Literal(name.into()))
}

fn topic_prefix(prefix: &str) -> ResourcePattern {
    ResourcePattern::Topic(NamePattern::Prefixed(prefix.into()))
}

fn user(p: &Principal) -> PrincipalPattern {
    PrincipalPattern::User(p.clone())
}

#[test]
fn with_authentication_on_nothing_is_allowed_without_an_entry() {
    let acl = Authorizer::enforced([]);
    for operation in Operation::ALL {
        for resource in [
            Resource::Topic("orders"),
            Resource::Group("g"),
            Resource::Cluster,
        ] {
            assert_eq!(
                acl.decide(&alice(), operation, resource),
                Decision::Denied(DenyReason::NoEntryAllows)
            );
        }
    }
    let open = Authorizer::open();
    assert_eq!(
        open.decide(&alice(), Operation::Admin, Resource::Cluster),
        Decision::Allowed(AllowReason::NotEnforced)
    );
}

#[test]
fn a_refusal_says_what_was_refused_and_why() {
    let message = malachi_core::auth::acl::refusal_message(
        &alice(),
        Operation::Produce,
        Resource::Topic("orders"),
        &DenyReason::NoEntryAllows,
    );
    assert_eq!(
        message,
        "User:alice may not produce topic `orders`: no entry allows it"
    );
    let names: Vec<&str> = Operation::ALL.iter().map(|o| o.name()).collect();
    let serialized: Vec<String> = Operation::ALL.iter().map(|o| serde_name(*o)).collect();
    assert_eq!(names, serialized);
}

/// The serde name of an operation, read back from its MessagePack string.
fn serde_name(operation: Operation) -> String {
    let bytes = rmp_serde::to_vec(&operation).unwrap();
    rmp_serde::from_slice::<String>(&bytes).unwrap()
}

#[test]
fn superusers_are_allowed_everything() {
    let root = Principal::user("root");
    let mut acl = Authorizer::enforced([root.clone()]);
    acl.add(entry(
        PrincipalPattern::AnyUser,
        ResourcePattern::Cluster,
        Operation::Admin,
        Permission::Deny,
    ))
    .unwrap();
    assert_eq!(
        acl.decide(&root, Operation::Admin, Resource::Cluster),
        Decision::Allowed(AllowReason::Superuser)
    );
    assert!(
        !acl.decide(&alice(), Operation::Admin, Resource::Cluster)
            .is_allowed()
    );
}

#[test]
fn literal_and_prefix_names_match_exactly_what_they_say() {
    let mut acl = Authorizer::enforced([]);
    let literal = entry(
        user(&alice()),
        topic_literal("orders"),
        Operation::Produce,
        Permission::Allow,
    );
    let prefix = entry(
        user(&alice()),
        topic_prefix("ab"),
        Operation::Consume,
        Permission::Allow,
    );
    acl.add(literal.clone()).unwrap();
    acl.add(prefix.clone()).unwrap();
    let decide = |op, topic| acl.decide(&alice(), op, Resource::Topic(topic));
    assert_eq!(
        decide(Operation::Produce, "orders"),
        Decision::Allowed(AllowReason::Entry(literal))
    );
    assert!(!decide(Operation::Produce, "orders2").is_allowed());
    assert!(!decide(Operation::Produce, "order").is_allowed());
    assert_eq!(
        decide(Operation::Consume, "abc"),
        Decision::Allowed(AllowReason::Entry(prefix.clone()))
    );
    assert_eq!(
        decide(Operation::Consume, "ab"),
        Decision::Allowed(AllowReason::Entry(prefix))
    );
    assert!(!decide(Operation::Consume, "a").is_allowed());
    assert!(!decide(Operation::Consume, "xab").is_allowed());
    // A topic pattern never matches a group of the same name.
    assert!(
        !acl.decide(&alice(), Operation::Produce, Resource::Group("orders"))
            .is_allowed()
    );
    // Another principal gets nothing from alice's entries.
    assert!(
        !acl.decide(
            &Principal::user("bob"),
            Operation::Produce,
            Resource::Topic("orders")
        )
        .is_allowed()
    );
}

#[test]
fn a_data_allow_implies_describe_but_a_describe_deny_still_wins() {
    let mut acl = Authorizer::enforced([]);
    let produce = entry(
        user(&alice()),
        topic_literal("orders"),
        Operation::Produce,
        Permission::Allow,
    );
    acl.add(produce.clone()).unwrap();
    assert_eq!(
        acl.decide(&alice(), Operation::Describe, Resource::Topic("orders")),
        Decision::Allowed(AllowReason::Entry(produce))
    );
    assert!(
        !acl.decide(&alice(), Operation::Create, Resource::Topic("orders"))
            .is_allowed()
    );
    let deny = entry(
        PrincipalPattern::AnyUser,
        topic_prefix("ord"),
        Operation::Describe,
        Permission::Deny,
    );
    acl.add(deny.clone()).unwrap();
    assert_eq!(
        acl.decide(&alice(), Operation::Describe, Resource::Topic("orders")),
        Decision::Denied(DenyReason::Entry(deny))
    );
    assert!(
        acl.decide(&alice(), Operation::Produce, Resource::Topic("orders"))
            .is_allowed()
    );
}

#[test]
fn principals_and_entries_are_checked() {
    assert_eq!(Principal::parse("User:alice"), Ok(alice()));
    assert_eq!(alice().to_string(), "User:alice");
    assert!(Principal::parse("alice").is_err());
    assert!(Principal::parse("User:").is_err());
    assert!(Principal::parse("User:*").is_err());
    let mut acl = Authorizer::enforced([]);
    let empty = entry(
        user(&alice()),
        topic_prefix(""),
        Operation::Consume,
        Permission::Allow,
    );
    assert_eq!(acl.add(empty), Err(AclError::EmptyName));
    let long = entry(
        user(&alice()),
        topic_literal(&"x".repeat(256)),
        Operation::Consume,
        Permission::Allow,
    );
    assert_eq!(acl.add(long), Err(AclError::NameTooLong(256)));
    let ok = entry(
        user(&alice()),
        ResourcePattern::Cluster,
        Operation::Admin,
        Permission::Allow,
    );
    assert_eq!(acl.add(ok.clone()), Ok(true));
    assert_eq!(acl.add(ok.clone()), Ok(false));
    assert!(acl.remove(&ok));
    assert!(!acl.remove(&ok));
}

fn principal() -> impl Strategy<Value = Principal> {
    prop_oneof![Just("alice"), Just("bob")].prop_map(Principal::user)
}

fn name() -> impl Strategy<Value = String> {
    "[ab]{1,3}"
}

fn an_entry() -> impl Strategy<Value = AclEntry> {
    let principal = prop_oneof![
        principal().prop_map(PrincipalPattern::User),
        Just(PrincipalPattern::AnyUser)
    ];
    let resource = prop_oneof![
        name().prop_map(|n| ResourcePattern::Topic(NamePattern::Literal(n))),
        name().prop_map(|n| ResourcePattern::Topic(NamePattern::Prefixed(n))),
        name().prop_map(|n| ResourcePattern::Group(NamePattern::Prefixed(n))),
        Just(ResourcePattern::Cluster),
    ];
    let operation = proptest::sample::select(Operation::ALL.to_vec());
    let permission = prop_oneof![Just(Permission::Allow), Just(Permission::Deny)];
    (principal, resource, operation, permission).prop_map(
        |(principal, resource, operation, permission)| AclEntry {
            principal,
            resource,
            operation,
            permission,
        },
    )
}

/// A request: principal, operation, and a topic, group or the cluster.
fn request() -> impl Strategy<Value = (Principal, Operation, u8, String)> {
    (
        principal(),
        proptest::sample::select(Operation::ALL.to_vec()),
        0u8..3,
        name(),
    )
}

fn resource(kind: u8, name: &str) -> Resource<'_> {
    match kind {
        0 => Resource::Topic(name),
        1 => Resource::Group(name),
        _ => Resource::Cluster,
    }
}

fn build(entries: &[AclEntry]) -> Authorizer {
    let mut acl = Authorizer::enforced([]);
    for entry in entries {
        acl.add(entry.clone()).unwrap();
    }
    acl
}

proptest! {
    #[test]
    fn a_matching_deny_beats_any_allow_in_any_order(
        entries in proptest::collection::vec(an_entry(), 0..12),
        (who, operation, kind, topic) in request(),
        at in any::<proptest::sample::Index>(),
    ) {
        let deny = AclEntry {
            principal: PrincipalPattern::User(who.clone()),
            resource: match kind {
                0 => ResourcePattern::Topic(NamePattern::Literal(topic.clone())),
                1 => ResourcePattern::Group(NamePattern::Literal(topic.clone())),
                _ => ResourcePattern::Cluster,
            },
            operation,
            permission: Permission::Deny,
        };
        let mut with_deny = entries.clone();
        with_deny.insert(at.index(entries.len() + 1), deny);
        let decision = build(&with_deny).decide(&who, operation, resource(kind, &topic));
        prop_assert!(matches!(decision, Decision::Denied(DenyReason::Entry(ref e)) if e.permission == Permission::Deny));
        let mut reversed = with_deny.clone();
        reversed.reverse();
        prop_assert_eq!(build(&reversed).decide(&who, operation, resource(kind, &topic)), decision);
    }

    #[test]
    fn an_allow_never_removes_access_and_a_deny_never_grants_it(
        entries in proptest::collection::vec(an_entry(), 0..12),
        extra in an_entry(),
        (who, operation, kind, topic) in request(),
    ) {
        let before = build(&entries).decide(&who, operation, resource(kind, &topic));
        let mut more = entries.clone();
        more.push(extra.clone());
        let after = build(&more).decide(&who, operation, resource(kind, &topic));
        match extra.permission {
            Permission::Allow => prop_assert!(!before.is_allowed() || after.is_allowed()),
            Permission::Deny => prop_assert!(before.is_allowed() || !after.is_allowed()),
        }
        // A granted decision always names an allow entry that matches.
        if let Decision::Allowed(AllowReason::Entry(e)) = &after {
            prop_assert_eq!(e.permission, Permission::Allow);
        }
    }

    #[test]
    fn a_prefix_longer_than_the_name_never_matches(prefix in "[a-c]{2,6}", cut in 1usize..6) {
        let short = &prefix[..prefix.len().saturating_sub(cut).max(1).min(prefix.len() - 1)];
        let acl = build(&[AclEntry {
            principal: PrincipalPattern::AnyUser,
            resource: ResourcePattern::Topic(NamePattern::Prefixed(prefix.clone())),
            operation: Operation::Consume,
            permission: Permission::Allow,
        }]);
        prop_assert!(!acl.decide(&alice(), Operation::Consume, Resource::Topic(short)).is_allowed());
        prop_assert!(acl.decide(&alice(), Operation::Consume, Resource::Topic(&prefix)).is_allowed());
    }

    #[test]
    fn a_literal_never_matches_a_longer_name(name in "[a-z]{1,10}", tail in "[a-z0-9]{1,4}") {
        let acl = build(&[AclEntry {
            principal: PrincipalPattern::AnyUser,
            resource: ResourcePattern::Topic(NamePattern::Literal(name.clone())),
            operation: Operation::Produce,
            permission: Permission::Allow,
        }]);
        let longer = format!("{name}{tail}");
        prop_assert!(!acl.decide(&alice(), Operation::Produce, Resource::Topic(&longer)).is_allowed());
        prop_assert!(acl.decide(&alice(), Operation::Produce, Resource::Topic(&name)).is_allowed());
    }
}
