//! Authorization after Kafka's model (ADR 0146): principals, resources
//! (topics and consumer groups by literal name or prefix, the cluster),
//! operations, and allow or deny entries.
//!
//! With authentication on ([`Authorizer::enforced`]) everything not
//! allowed is denied, and a deny beats an allow whatever the order of the
//! entries. Superusers, from configuration, bypass the entries. There is no
//! "allow if no entry" switch (Kafka's `allow.everyone.if.no.acl.found`
//! let unlisted users in). Like Kafka, an allow of `produce`, `consume`,
//! `delete` or `alter` on a resource implies `describe` of it; a deny of
//! `describe` still beats that.
//!
//! The decision is a typed value that names the entry it rests on, or says
//! that no entry allows, so a refusal can be logged and answered with what
//! was refused.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;

/// The most entries an authorizer holds.
pub const ACL_ENTRIES_MAX: usize = 100_000;
/// The longest principal name, resource name or prefix, in bytes.
pub const ACL_NAME_BYTES_MAX: usize = 255;

/// Who acts: an authenticated user (`User:name`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Principal {
    pub name: String,
}

impl Principal {
    /// `User:name`.
    pub fn user(name: &str) -> Principal {
        Principal {
            name: name.to_owned(),
        }
    }

    /// Parses `User:name`.
    pub fn parse(text: &str) -> Result<Principal, AclError> {
        let name = text
            .strip_prefix("User:")
            .ok_or(AclError::Principal("must start with `User:`"))?;
        check_name(name)?;
        if name == "*" {
            return Err(AclError::Principal(
                "`User:*` is a pattern, not a principal",
            ));
        }
        Ok(Principal::user(name))
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "User:{}", self.name)
    }
}

/// Whom an entry applies to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PrincipalPattern {
    /// One principal.
    User(Principal),
    /// `User:*`: every authenticated principal.
    AnyUser,
}

impl PrincipalPattern {
    fn matches(&self, principal: &Principal) -> bool {
        match self {
            PrincipalPattern::User(p) => p == principal,
            PrincipalPattern::AnyUser => true,
        }
    }
}

/// How a resource name is matched.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum NamePattern {
    /// Exactly this name: `orders` does not match `orders2`.
    Literal(String),
    /// Every name starting with this prefix: `ab` does not match `a`.
    Prefixed(String),
}

impl NamePattern {
    fn matches(&self, name: &str) -> bool {
        match self {
            NamePattern::Literal(literal) => literal == name,
            NamePattern::Prefixed(prefix) => name.starts_with(prefix.as_str()),
        }
    }

    fn check(&self) -> Result<(), AclError> {
        match self {
            NamePattern::Literal(name) | NamePattern::Prefixed(name) => check_name(name),
        }
    }
}

/// What an entry applies to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ResourcePattern {
    Topic(NamePattern),
    Group(NamePattern),
    Cluster,
}

/// What a request acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource<'a> {
    Topic(&'a str),
    Group(&'a str),
    /// Cluster operations: decommission, admit, vnode splits, policies,
    /// features, users and ACLs.
    Cluster,
}

impl fmt::Display for Resource<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resource::Topic(name) => write!(f, "topic `{name}`"),
            Resource::Group(name) => write!(f, "group `{name}`"),
            Resource::Cluster => f.write_str("the cluster"),
        }
    }
}

impl ResourcePattern {
    fn matches(&self, resource: Resource<'_>) -> bool {
        match (self, resource) {
            (ResourcePattern::Topic(p), Resource::Topic(name)) => p.matches(name),
            (ResourcePattern::Group(p), Resource::Group(name)) => p.matches(name),
            (ResourcePattern::Cluster, Resource::Cluster) => true,
            _ => false,
        }
    }
}

/// An operation a principal may be allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Produce,
    Consume,
    Create,
    Delete,
    Describe,
    Alter,
    Admin,
}

impl Operation {
    /// Every operation.
    pub const ALL: [Operation; 7] = [
        Operation::Produce,
        Operation::Consume,
        Operation::Create,
        Operation::Delete,
        Operation::Describe,
        Operation::Alter,
        Operation::Admin,
    ];

    /// The snake_case name, as the CLI and refusals write it.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Produce => "produce",
            Operation::Consume => "consume",
            Operation::Create => "create",
            Operation::Delete => "delete",
            Operation::Describe => "describe",
            Operation::Alter => "alter",
            Operation::Admin => "admin",
        }
    }

    /// Whether an allow of `self` also allows `wanted` (Kafka's implied
    /// `describe`).
    fn implies(self, wanted: Operation) -> bool {
        self == wanted
            || (wanted == Operation::Describe
                && matches!(
                    self,
                    Operation::Produce | Operation::Consume | Operation::Delete | Operation::Alter
                ))
    }
}

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Permission {
    Allow,
    Deny,
}

/// One access control entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AclEntry {
    pub principal: PrincipalPattern,
    pub resource: ResourcePattern,
    pub operation: Operation,
    pub permission: Permission,
}

impl AclEntry {
    /// Checks the entry's names against their bounds.
    pub fn check(&self) -> Result<(), AclError> {
        if let PrincipalPattern::User(p) = &self.principal {
            check_name(&p.name)?;
        }
        match &self.resource {
            ResourcePattern::Topic(p) | ResourcePattern::Group(p) => p.check(),
            ResourcePattern::Cluster => Ok(()),
        }
    }
}

/// Why an entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    #[error("a name or prefix is empty")]
    EmptyName,
    #[error("a name of {0} bytes is above {ACL_NAME_BYTES_MAX}")]
    NameTooLong(usize),
    #[error("bad principal: {0}")]
    Principal(&'static str),
    #[error("{ACL_ENTRIES_MAX} entries already")]
    TooManyEntries,
}

fn check_name(name: &str) -> Result<(), AclError> {
    if name.is_empty() {
        return Err(AclError::EmptyName);
    }
    if name.len() > ACL_NAME_BYTES_MAX {
        return Err(AclError::NameTooLong(name.len()));
    }
    Ok(())
}

/// Why an operation is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowReason {
    /// Authentication is off: nothing is checked.
    NotEnforced,
    /// The principal is a configured superuser.
    Superuser,
    /// This allow entry matched (for the operation itself, or one implying it).
    Entry(AclEntry),
}

/// Why an operation is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyReason {
    /// This deny entry matched; it beats any allow.
    Entry(AclEntry),
    /// No entry allows it: the default under authentication.
    NoEntryAllows,
}

/// An authorization decision, with its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allowed(AllowReason),
    Denied(DenyReason),
}

impl Decision {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed(_))
    }
}

/// What an `unauthorized` answer says was refused, and why.
pub fn refusal_message(
    principal: &Principal,
    operation: Operation,
    resource: Resource<'_>,
    reason: &DenyReason,
) -> String {
    let why = match reason {
        DenyReason::Entry(_) => "a deny entry matches",
        DenyReason::NoEntryAllows => "no entry allows it",
    };
    format!("{principal} may not {} {resource}: {why}", operation.name())
}

/// The superusers and the entries, as a plain value (the ring's raft group
/// keeps the entries; configuration names the superusers).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Authorizer {
    enforced: bool,
    superusers: BTreeSet<Principal>,
    entries: BTreeSet<AclEntry>,
}

impl Authorizer {
    /// Authentication off: every decision is `Allowed(NotEnforced)`.
    pub fn open() -> Authorizer {
        Authorizer::default()
    }

    /// Authentication on: deny unless allowed, deny beats allow.
    pub fn enforced(superusers: impl IntoIterator<Item = Principal>) -> Authorizer {
        Authorizer {
            enforced: true,
            superusers: superusers.into_iter().collect(),
            entries: BTreeSet::new(),
        }
    }

    /// Adds `entry`; `Ok(false)` if it was there already.
    pub fn add(&mut self, entry: AclEntry) -> Result<bool, AclError> {
        entry.check()?;
        if !self.entries.contains(&entry) && self.entries.len() >= ACL_ENTRIES_MAX {
            return Err(AclError::TooManyEntries);
        }
        Ok(self.entries.insert(entry))
    }

    /// Removes `entry`; `false` if it was not there.
    pub fn remove(&mut self, entry: &AclEntry) -> bool {
        self.entries.remove(entry)
    }

    /// The entries, in their canonical order.
    pub fn entries(&self) -> impl Iterator<Item = &AclEntry> {
        self.entries.iter()
    }

    /// Whether `principal` may do `operation` on `resource`.
    pub fn decide(
        &self,
        principal: &Principal,
        operation: Operation,
        resource: Resource<'_>,
    ) -> Decision {
        if !self.enforced {
            return Decision::Allowed(AllowReason::NotEnforced);
        }
        if self.superusers.contains(principal) {
            return Decision::Allowed(AllowReason::Superuser);
        }
        let mut allow: Option<&AclEntry> = None;
        for entry in self.entries.iter() {
            if !(entry.principal.matches(principal) && entry.resource.matches(resource)) {
                continue;
            }
            match entry.permission {
                Permission::Deny if entry.operation == operation => {
                    return Decision::Denied(DenyReason::Entry(entry.clone()));
                }
                Permission::Allow if entry.operation.implies(operation) => {
                    // The first allow in canonical order: an exact one sorts
                    // by operation, so the reason is stable.
                    allow = allow.or(Some(entry));
                }
                _ => {}
            }
        }
        match allow {
            Some(entry) => Decision::Allowed(AllowReason::Entry(entry.clone())),
            None => Decision::Denied(DenyReason::NoEntryAllows),
        }
    }
}
