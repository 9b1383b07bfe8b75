//! The protocol's bounds. Every decoder checks them; every encoder refuses to
//! send a message that breaks them. Changing one is a protocol change.

/// Topic, policy, client, supervisor and child names, attribute keys and values.
pub const NAME_BYTES_MAX: usize = 255;
/// An opaque cursor string. It must stay at least the cluster's longest
/// encoded cursor (`CURSOR_ENCODED_BYTES_MAX`, about 54 KiB for 1024 range
/// positions); the wire does not depend on the cluster crate, so whoever
/// joins the two (the broker) should assert the relation.
pub const CURSOR_BYTES_MAX: usize = 64 * 1024;
/// A `host:port` address.
pub const ADDRESS_BYTES_MAX: usize = 255;
/// An error message or a child's last exit reason.
pub const MESSAGE_BYTES_MAX: usize = 4096;
/// A short state word (`active`, `sealed`) or a hex band bound.
pub const STATE_BYTES_MAX: usize = 32;
/// Entries of an `api_versions` list.
pub const API_VERSIONS_MAX: usize = 1024;
/// Topics in a `list_topics` answer.
pub const TOPICS_MAX: usize = 65_536;
/// Ranges in one topic description.
pub const RANGES_MAX: usize = 65_536;
/// Parents or children of one range (a split has two children, a merge two parents).
pub const RANGE_LINKS_MAX: usize = 16;
/// Segments of one range in a description.
pub const SEGMENTS_MAX: usize = 65_536;
/// Replicas of one segment.
pub const REPLICAS_MAX: usize = 16;
/// Brokers in a cluster status.
pub const BROKERS_MAX: usize = 4096;
/// Features in a `features` response, and that one broker advertises
/// (ADR 0134; the ring's table keeps at most 256 a broker).
pub const FEATURES_MAX: usize = 256;
/// The longest feature name.
pub const FEATURE_NAME_BYTES_MAX: usize = 64;
/// Attributes of one broker.
pub const ATTRIBUTES_MAX: usize = 64;
/// Vnodes one broker leads.
pub const VNODES_MAX: usize = 65_536;
/// Nested supervisors in a tree snapshot (the root is depth 1).
pub const TREE_DEPTH_MAX: usize = 32;
/// Children of one supervisor in a tree snapshot.
pub const TREE_CHILDREN_MAX: usize = 65_536;
/// The longest long poll a fetch may ask for.
pub const FETCH_WAIT_MS_MAX: u32 = 30_000;
/// The most records one fetch may ask for.
pub const RECORDS_PER_FETCH_MAX: u32 = 100_000;
/// The most record credit outstanding in one grant.
pub const CREDIT_RECORDS_MAX: u32 = 1_000_000;
/// The most byte credit in one grant (64 MiB).
pub const CREDIT_BYTES_MAX: u32 = 64 * 1024 * 1024;
/// The MessagePack nesting depth a decoder accepts (maps and arrays); a
/// tree snapshot of TREE_DEPTH_MAX supervisors nests about 3 levels each.
pub const NESTING_DEPTH_MAX: usize = 128;
/// Range outcomes in one produce answer (a request reaches at most this many
/// ranges; a topic this wide is refused at creation long before).
pub const RANGE_OUTCOMES_MAX: usize = 65_536;
/// The reserved record header in which an idempotent batch's tag is stored
/// with its last record (ADR 0092). Producers may not set headers with the
/// `malachi.` prefix; consumers never see this one.
pub const PRODUCER_HEADER: &str = "malachi.producer";
/// The reserved record header on the first record of an idempotent batch
/// of more than one record: the batch's record count (`u32`, little-endian).
/// A log that ends before that many records follow it ends inside a batch a
/// crash tore, which recovery cuts (ADR 0092). Consumers never see it.
pub const PRODUCER_START_HEADER: &str = "malachi.producer-start";
/// Header names with this prefix are the broker's.
pub const RESERVED_HEADER_PREFIX: &str = "malachi.";
