//! Api keys: which operation a request frame carries, with stable numbers.
//!
//! Numbers are grouped in blocks so that a future feature gets a contiguous
//! range and a reader of a hex dump can tell the area at a glance:
//!
//! | block       | area                                                      |
//! |-------------|-----------------------------------------------------------|
//! | 0..=99      | client operations (implemented, see [`ApiKey`])           |
//! | 100..=199   | replication (replica_append, catch_up, seal, fence, ...)  |
//! | 200..=299   | raft, multiplexed by group id (served on the raft port)   |
//! | 300..=399   | consumer groups                                           |
//! | 400..=499   | authentication                                            |
//!
//! The authentication block serves its first keys (400, 401, the user
//! and ACL administration from 403, ADR 0150, and tokens: 402 and the
//! issuer keys from 410, ADR 0152). A reserved number decodes
//! to [`WireError::UnsupportedApi`] until its feature is implemented, exactly like an unknown number; [`reserved_name`]
//! names it for logs and docs.

use crate::error::WireError;

/// An implemented operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum ApiKey {
    ApiVersions = 0,
    CreateTopic = 1,
    DeleteTopic = 2,
    ListTopics = 3,
    DescribeTopic = 4,
    SplitRange = 5,
    MergeRange = 6,
    Produce = 10,
    Fetch = 11,
    Subscribe = 12,
    /// The subscription "ack": grants more credit and acknowledges delivered pushes.
    SubscribeCredit = 13,
    TreeSnapshot = 20,
    ClusterStatus = 21,
    /// The ring as the answering broker routes by: vnodes, arcs, leaders.
    VnodeList = 22,
    /// The operator's vnode split (ADR 0082), run from any broker.
    VnodeSplit = 23,
    /// The cluster's members, where their vnode replicas are, and the
    /// operator's decommission (ADR 0104), run from any broker.
    ClusterMembers = 24,
    /// Defines or redefines a storage policy (ADR 0115).
    PutPolicy = 25,
    /// The cluster's storage policies, or one by name.
    ListPolicies = 26,
    /// Removes a storage policy definition.
    DeletePolicy = 27,
    /// The cluster's versions and feature states; activates or finalizes
    /// features (ADR 0134).
    Features = 28,
    /// Names the SASL mechanism of a connection's login (ADR 0146, 0150).
    SaslHandshake = 400,
    /// One round of the mechanism's exchange.
    SaslAuthenticate = 401,
    /// Logs in with a bearer token, a JWT (ADR 0152).
    TokenAuthenticate = 402,
    /// Creates a user or replaces its credential (ADR 0150).
    PutUser = 403,
    /// Removes a user.
    DeleteUser = 404,
    /// The users, without their credentials.
    ListUsers = 405,
    /// Adds an ACL entry.
    AddAcl = 406,
    /// Removes an ACL entry.
    RemoveAcl = 407,
    /// The ACL entries.
    ListAcls = 408,
    /// Clears a user's lockout on every source.
    UnlockUser = 409,
    /// Adds a token issuer's public key (ADR 0152).
    PutTokenKey = 410,
    /// Removes a token issuer's key.
    DeleteTokenKey = 411,
    /// The token issuer's keys.
    ListTokenKeys = 412,
}

/// A supported version range for one api key, as `api_versions` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRange {
    pub min_version: u16,
    pub max_version: u16,
}

/// Numbers reserved for later features, with their future names.
pub const RESERVED: &[(u16, &str)] = &[
    (100, "replica_append"),
    (101, "catch_up"),
    (102, "seal"),
    (103, "fence"),
    (104, "drop_copies"),
    (105, "replica_status"),
    (200, "vote"),
    (201, "append_entries"),
    (202, "install_snapshot"),
    (203, "pre_vote"),
    (210, "forward_propose"),
    (211, "forward_read"),
    (212, "forward_list"),
    (300, "join_group"),
    (301, "sync_group"),
    (302, "heartbeat"),
    (303, "leave_group"),
    (304, "commit_cursor"),
    (305, "fetch_cursor"),
];

/// The inclusive number blocks reserved for later features.
pub const RESERVED_BLOCKS: &[(u16, u16, &str)] = &[
    (100, 199, "replication"),
    (200, 299, "raft"),
    (300, 399, "consumer_groups"),
    (400, 499, "auth"),
];

impl ApiKey {
    /// Every implemented key, in number order.
    pub const ALL: [ApiKey; 33] = [
        ApiKey::ApiVersions,
        ApiKey::CreateTopic,
        ApiKey::DeleteTopic,
        ApiKey::ListTopics,
        ApiKey::DescribeTopic,
        ApiKey::SplitRange,
        ApiKey::MergeRange,
        ApiKey::Produce,
        ApiKey::Fetch,
        ApiKey::Subscribe,
        ApiKey::SubscribeCredit,
        ApiKey::TreeSnapshot,
        ApiKey::ClusterStatus,
        ApiKey::VnodeList,
        ApiKey::VnodeSplit,
        ApiKey::ClusterMembers,
        ApiKey::PutPolicy,
        ApiKey::ListPolicies,
        ApiKey::DeletePolicy,
        ApiKey::Features,
        ApiKey::SaslHandshake,
        ApiKey::SaslAuthenticate,
        ApiKey::TokenAuthenticate,
        ApiKey::PutUser,
        ApiKey::DeleteUser,
        ApiKey::ListUsers,
        ApiKey::AddAcl,
        ApiKey::RemoveAcl,
        ApiKey::ListAcls,
        ApiKey::UnlockUser,
        ApiKey::PutTokenKey,
        ApiKey::DeleteTokenKey,
        ApiKey::ListTokenKeys,
    ];

    /// The stable number carried in the request frame.
    pub fn code(self) -> u16 {
        self as u16
    }

    /// The key for a wire number. Unknown and reserved numbers are
    /// [`WireError::UnsupportedApi`], which a server answers with the
    /// `unsupported_api` error code without closing the connection.
    pub fn from_code(code: u16) -> Result<ApiKey, WireError> {
        ApiKey::ALL
            .iter()
            .copied()
            .find(|key| key.code() == code)
            .ok_or(WireError::UnsupportedApi { api_key: code })
    }

    /// The versions this build speaks. Every key is at version 0 today;
    /// compatible additions (new optional fields) do not bump it, see ADR 0040.
    pub fn versions(self) -> VersionRange {
        VersionRange {
            min_version: 0,
            max_version: 0,
        }
    }

    /// The snake_case name used in docs and logs.
    pub fn name(self) -> &'static str {
        match self {
            ApiKey::ApiVersions => "api_versions",
            ApiKey::CreateTopic => "create_topic",
            ApiKey::DeleteTopic => "delete_topic",
            ApiKey::ListTopics => "list_topics",
            ApiKey::DescribeTopic => "describe_topic",
            ApiKey::SplitRange => "split_range",
            ApiKey::MergeRange => "merge_range",
            ApiKey::Produce => "produce",
            ApiKey::Fetch => "fetch",
            ApiKey::Subscribe => "subscribe",
            ApiKey::SubscribeCredit => "subscribe_credit",
            ApiKey::TreeSnapshot => "tree_snapshot",
            ApiKey::ClusterStatus => "cluster_status",
            ApiKey::VnodeList => "vnode_list",
            ApiKey::VnodeSplit => "vnode_split",
            ApiKey::ClusterMembers => "cluster_members",
            ApiKey::PutPolicy => "put_policy",
            ApiKey::ListPolicies => "list_policies",
            ApiKey::DeletePolicy => "delete_policy",
            ApiKey::Features => "features",
            ApiKey::SaslHandshake => "sasl_handshake",
            ApiKey::SaslAuthenticate => "sasl_authenticate",
            ApiKey::TokenAuthenticate => "token_authenticate",
            ApiKey::PutUser => "put_user",
            ApiKey::DeleteUser => "delete_user",
            ApiKey::ListUsers => "list_users",
            ApiKey::AddAcl => "add_acl",
            ApiKey::RemoveAcl => "remove_acl",
            ApiKey::ListAcls => "list_acls",
            ApiKey::UnlockUser => "unlock_user",
            ApiKey::PutTokenKey => "put_token_key",
            ApiKey::DeleteTokenKey => "delete_token_key",
            ApiKey::ListTokenKeys => "list_token_keys",
        }
    }
}

/// The future name of a reserved number, if it is one.
pub fn reserved_name(code: u16) -> Option<&'static str> {
    RESERVED
        .iter()
        .find(|(number, _)| *number == code)
        .map(|(_, name)| *name)
}

/// Whether a number falls in a reserved block.
pub fn is_reserved(code: u16) -> bool {
    RESERVED_BLOCKS
        .iter()
        .any(|(start, end, _)| (*start..=*end).contains(&code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_round_trips_through_its_number() {
        for key in ApiKey::ALL {
            assert_eq!(ApiKey::from_code(key.code()).ok(), Some(key));
        }
    }

    #[test]
    fn reserved_numbers_are_refused_as_unsupported_api() {
        for (number, _) in RESERVED {
            assert!(is_reserved(*number));
            assert!(matches!(
                ApiKey::from_code(*number),
                Err(WireError::UnsupportedApi { api_key }) if api_key == *number
            ));
        }
    }

    #[test]
    fn implemented_keys_are_not_reserved_numbers() {
        for key in ApiKey::ALL {
            assert!(
                reserved_name(key.code()).is_none(),
                "{} is reserved",
                key.name()
            );
            // Keys served in a block keep to the block's area.
            if is_reserved(key.code()) {
                assert!((400..=499).contains(&key.code()), "{}", key.name());
            }
        }
    }

    #[test]
    fn an_unknown_number_is_unsupported_api() {
        assert!(matches!(
            ApiKey::from_code(65_535),
            Err(WireError::UnsupportedApi { api_key: 65_535 })
        ));
    }
}
