//! The format freeze: the exact bytes of everything `malachi-cluster`
//! persists, for small fixed inputs: the ring encoding, the metadata state
//! snapshot, and a metadata group's `log`, `vote` and `snapshot` files
//! (docs/adr/0050). A changed snapshot is a change of what brokers write to
//! disk (or replicate): state written before it may no longer restore. It
//! needs a new version byte or magic tag in the same commit, never a blind
//! `INSTA_UPDATE`. The openraft types inside the group files are part of
//! the format too: an openraft bump that changes their encoding fails here.
//!
//! Each snapshot holds a hex dump and, because every body is rmp-serde and
//! so self-describing, the body decoded by a small MessagePack reader of this
//! file (independent of rmp-serde). Each test also decodes the frozen bytes
//! back with the crate (decode, restore, or reopening the group over its
//! files), so a decoder change is caught as well.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_cluster::group::{GroupConfig, MetadataGroup};
use malachi_core::model::{Command, CursorSecret, MetadataState, NodeId, Outcome, SealRecord};
use malachi_core::ring::{Ring, VnodeId};
use std::fmt::Write as _;
use std::path::Path;

/// Hex, 16 bytes per line with the offset and an ASCII column, so a diff
/// points at the byte that moved and magics read at a glance.
fn hex(bytes: &[u8]) -> String {
    bytes
        .chunks(16)
        .enumerate()
        .map(|(line, chunk)| {
            let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
            let ascii: String = chunk
                .iter()
                .map(|&b| {
                    if b.is_ascii_graphic() || b == b' ' {
                        b as char
                    } else {
                        '.'
                    }
                })
                .collect();
            format!("{:04x}: {:<47}  |{ascii}|", line * 16, hex.join(" "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------
// A MessagePack reader that renders a value tree, one node a line.

#[derive(Debug)]
enum Value {
    Nil,
    Bool(bool),
    /// The value and how it was encoded (`""` for a fixint).
    Int(i128, &'static str),
    Float(f64, &'static str),
    Str(String),
    Bin(Vec<u8>),
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        assert!(self.bytes.len() >= n, "msgpack value runs past its bytes");
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        head
    }

    fn uint(&mut self, n: usize) -> u64 {
        self.take(n)
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
    }

    fn str(&mut self, n: usize) -> Value {
        Value::Str(std::str::from_utf8(self.take(n)).unwrap().to_owned())
    }

    fn values(&mut self, n: usize) -> Vec<Value> {
        (0..n).map(|_| self.value()).collect()
    }

    fn pairs(&mut self, n: usize) -> Vec<(Value, Value)> {
        (0..n).map(|_| (self.value(), self.value())).collect()
    }

    fn value(&mut self) -> Value {
        let marker = self.take(1)[0];
        match marker {
            0x00..=0x7f => Value::Int(i128::from(marker), ""),
            0xe0..=0xff => Value::Int(i128::from(marker as i8), ""),
            0xc0 => Value::Nil,
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xcc => Value::Int(i128::from(self.uint(1)), "u8 "),
            0xcd => Value::Int(i128::from(self.uint(2)), "u16 "),
            0xce => Value::Int(i128::from(self.uint(4)), "u32 "),
            0xcf => Value::Int(i128::from(self.uint(8)), "u64 "),
            0xd0 => Value::Int(i128::from(self.uint(1) as u8 as i8), "i8 "),
            0xd1 => Value::Int(i128::from(self.uint(2) as u16 as i16), "i16 "),
            0xd2 => Value::Int(i128::from(self.uint(4) as u32 as i32), "i32 "),
            0xd3 => Value::Int(i128::from(self.uint(8) as i64), "i64 "),
            0xca => Value::Float(f64::from(f32::from_bits(self.uint(4) as u32)), "f32 "),
            0xcb => Value::Float(f64::from_bits(self.uint(8)), "f64 "),
            0xa0..=0xbf => self.str(usize::from(marker & 0x1f)),
            0xd9..=0xdb => {
                let n = self.uint(1 << (marker - 0xd9)) as usize;
                self.str(n)
            }
            0xc4..=0xc6 => {
                let n = self.uint(1 << (marker - 0xc4)) as usize;
                Value::Bin(self.take(n).to_vec())
            }
            0x90..=0x9f => Value::Array(self.values(usize::from(marker & 0x0f))),
            0xdc..=0xdd => {
                let n = self.uint(2 << (marker - 0xdc)) as usize;
                Value::Array(self.values(n))
            }
            0x80..=0x8f => Value::Map(self.pairs(usize::from(marker & 0x0f))),
            0xde..=0xdf => {
                let n = self.uint(2 << (marker - 0xde)) as usize;
                Value::Map(self.pairs(n))
            }
            other => panic!("msgpack marker {other:#04x} is not used by these formats"),
        }
    }
}

impl Value {
    /// A long array of integers that all fit a byte: a `Vec<u8>` that serde
    /// wrote as a sequence (no `serde_bytes`).
    fn as_byte_seq(&self) -> Option<Vec<u8>> {
        let Value::Array(items) = self else {
            return None;
        };
        if items.len() < 16 {
            return None;
        }
        items
            .iter()
            .map(|v| match v {
                Value::Int(i, _) => u8::try_from(*i).ok(),
                _ => None,
            })
            .collect()
    }

    fn render(&self, out: &mut String, indent: usize, prefix: &str) {
        let pad = "  ".repeat(indent);
        let line = match self {
            Value::Nil => "nil".to_owned(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i, how) => format!("{how}{i}"),
            Value::Float(f, how) => format!("{how}{f}"),
            Value::Str(s) => format!("{s:?}"),
            Value::Bin(b) => format!("bin({}) [{}]", b.len(), spaced(b)),
            Value::Array(items) if items.is_empty() => "[]".to_owned(),
            Value::Map(pairs) if pairs.is_empty() => "{}".to_owned(),
            Value::Array(items) => {
                if let Some(bytes) = self.as_byte_seq() {
                    writeln!(
                        out,
                        "{pad}{prefix}array({}) of byte-sized ints:",
                        items.len()
                    )
                    .unwrap();
                    for chunk in bytes.chunks(16) {
                        writeln!(out, "{pad}  {}", spaced(chunk)).unwrap();
                    }
                    return;
                }
                writeln!(out, "{pad}{prefix}array({}) [", items.len()).unwrap();
                for (i, item) in items.iter().enumerate() {
                    item.render(out, indent + 1, &format!("{i}: "));
                }
                writeln!(out, "{pad}]").unwrap();
                return;
            }
            Value::Map(pairs) => {
                writeln!(out, "{pad}{prefix}map({}) {{", pairs.len()).unwrap();
                for (key, value) in pairs {
                    // Keys are scalars in these formats: rendered inline.
                    let mut k = String::new();
                    key.render(&mut k, 0, "");
                    value.render(out, indent + 1, &format!("{}: ", k.trim_end()));
                }
                writeln!(out, "{pad}}}").unwrap();
                return;
            }
        };
        writeln!(out, "{pad}{prefix}{line}").unwrap();
    }
}

fn spaced(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Exactly one MessagePack value; every byte must be consumed.
fn parse(bytes: &[u8]) -> Value {
    let mut reader = Reader { bytes };
    let value = reader.value();
    assert!(reader.bytes.is_empty(), "bytes after the msgpack value");
    value
}

fn render(value: &Value) -> String {
    let mut out = String::new();
    value.render(&mut out, 0, "");
    out
}

/// A version byte then one MessagePack value: the ring and the state
/// snapshot.
fn versioned(bytes: &[u8]) -> String {
    format!("version: {}\n{}", bytes[0], render(&parse(&bytes[1..])))
}

/// A group file: an 8-byte magic tag, then frames of `u32` LE length,
/// `u32` LE CRC-32 of the body, and an rmp-serde body, checked and
/// rendered. Returns the rendering and the bodies.
fn group_file(bytes: &[u8]) -> (String, Vec<Value>) {
    let magic = std::str::from_utf8(&bytes[..8]).unwrap();
    let mut out = format!("magic: {magic:?}\n");
    let mut bodies = Vec::new();
    let mut at = 8;
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap());
        let body = &bytes[at + 8..at + 8 + len];
        let n = bodies.len();
        assert_eq!(crc, crc32fast::hash(body), "frame {n} at byte {at}");
        writeln!(out, "frame {n} at {at:#06x}, {len} bytes, crc {crc:#010x}:").unwrap();
        let value = parse(body);
        out.push_str(&render(&value));
        bodies.push(value);
        at += 8 + len;
    }
    (out, bodies)
}

fn frozen(hex_dump: String, decoded: String) -> String {
    format!("{hex_dump}\n\n{decoded}")
}

// ---------------------------------------------------------------------------
// Fixed inputs.

fn create_orders() -> Command {
    Command::CreateTopic {
        topic: "orders".to_owned(),
        initial_ranges: 2,
        policy: None,
        replicas: vec![vec![NodeId(1), NodeId(2)], vec![NodeId(2), NodeId(3)]],
        at_ms: 1_700_000_000_000,
    }
}

/// A state with a topic of two ranges, one of whose segments has rolled:
/// active and sealed segments, a seal record, replica sets.
fn sample_state() -> MetadataState {
    let mut state = MetadataState::default();
    let Ok(Outcome::TopicCreated { segments, .. }) = state.apply(create_orders()) else {
        panic!("the topic was not created");
    };
    let rolled = state.apply(Command::RollSegment {
        topic: "orders".to_owned(),
        segment: segments[0],
        seal: SealRecord {
            length: 10,
            bytes: 740,
        },
        next_replicas: vec![NodeId(1), NodeId(3)],
        at_ms: 1_700_000_060_000,
    });
    assert!(
        matches!(rolled, Ok(Outcome::SegmentRolled { .. })),
        "{rolled:?}"
    );
    state
}

// ---------------------------------------------------------------------------
// The encodings.

#[test]
fn the_ring_encodes_to_its_frozen_bytes() {
    let mut ring = Ring::new(2).unwrap();
    ring.split(VnodeId(1)).unwrap();
    let bytes = ring.encode().unwrap();
    insta::assert_snapshot!("ring", frozen(hex(&bytes), versioned(&bytes)));
    assert_eq!(Ring::decode(&bytes).unwrap(), ring);
}

/// A ring carrying vnode placement (ADR 0121): members written (empty)
/// because a later field is, then the attributes and the constraints.
#[test]
fn a_ring_with_vnode_placement_encodes_to_its_frozen_bytes() {
    let mut ring = Ring::new(2).unwrap();
    ring.set_attributes(
        3,
        std::collections::BTreeMap::from([("zone".to_owned(), "c".to_owned())]),
    );
    ring.set_vnode_placement(vec!["distinct(zone) >= 3".to_owned()]);
    let bytes = ring.encode().unwrap();
    insta::assert_snapshot!(
        "ring_with_placement",
        frozen(hex(&bytes), versioned(&bytes))
    );
    assert_eq!(Ring::decode(&bytes).unwrap(), ring);
}

#[test]
fn the_metadata_state_snapshot_encodes_to_its_frozen_bytes() {
    let state = sample_state();
    let bytes = state.snapshot().unwrap();
    insta::assert_snapshot!("metadata_state", frozen(hex(&bytes), versioned(&bytes)));
    assert_eq!(MetadataState::restore(&bytes).unwrap(), state);
}

/// The ring group's state once it holds cursor keys (ADR 0096): the keys
/// are the last field, absent (not even a nil) from states without them,
/// so the `metadata_state` snapshot above did not change with them.
/// The lease request of ADR 0122 (a raft log entry) and a state holding a
/// lease it granted, with its generation: both frozen, so a change to
/// either encoding shows here.
#[test]
fn a_waited_lease_request_and_its_lease_encode_to_their_frozen_bytes() {
    let cmd = Command::AcquireLeaseWaited {
        holder: 2,
        duration_ms: 10_000,
        at_ms: 1_700_000_000_000,
        waited_for: Some(7),
    };
    let bytes = rmp_serde::to_vec(&cmd).unwrap();
    insta::assert_snapshot!(
        "acquire_lease_waited",
        frozen(hex(&bytes), render(&parse(&bytes)))
    );
    assert_eq!(rmp_serde::from_slice::<Command>(&bytes).unwrap(), cmd);

    let mut state = MetadataState::default();
    for at_ms in [1_000, 2_000] {
        state
            .apply(Command::AcquireLeaseWaited {
                holder: 2,
                duration_ms: 10_000,
                at_ms,
                waited_for: None,
            })
            .unwrap();
    }
    let bytes = state.snapshot().unwrap();
    insta::assert_snapshot!(
        "metadata_state_with_lease",
        frozen(hex(&bytes), versioned(&bytes))
    );
    let restored = MetadataState::restore(&bytes).unwrap();
    assert_eq!(restored, state);
    assert_eq!(
        restored.lease().map(|l| (l.epoch, l.generation)),
        Some((1, 2))
    );
}

#[test]
fn the_ring_groups_cursor_keys_encode_to_their_frozen_bytes() {
    let mut state = MetadataState::default();
    state.apply(Command::InitRing { vnodes: 2 }).unwrap();
    for (command, fill) in [(None, 0x11u8), (Some(0u32), 0x22)] {
        let secret = CursorSecret::new(vec![fill; 16]);
        let applied = match command {
            None => state.apply(Command::CreateCursorKey {
                secret,
                at_ms: 1_700_000_000_000,
            }),
            Some(after) => state.apply(Command::RotateCursorKey {
                after,
                secret,
                at_ms: 1_700_000_100_000,
            }),
        };
        assert!(
            matches!(applied, Ok(Outcome::CursorKeyCurrent { .. })),
            "{applied:?}"
        );
    }
    let bytes = state.snapshot().unwrap();
    insta::assert_snapshot!(
        "metadata_state_cursor_keys",
        frozen(hex(&bytes), versioned(&bytes))
    );
    assert_eq!(MetadataState::restore(&bytes).unwrap(), state);
}

/// The lease release naming its generation (ADR 0140, a raft log entry
/// behind `lease_release_generation`): frozen, so a change to its encoding
/// shows here.
#[test]
fn a_release_naming_its_generation_encodes_to_its_frozen_bytes() {
    let cmd = Command::ReleaseLeaseGeneration {
        holder: 2,
        epoch: 3,
        generation: 7,
    };
    let bytes = rmp_serde::to_vec(&cmd).unwrap();
    insta::assert_snapshot!(
        "release_lease_generation",
        frozen(hex(&bytes), render(&parse(&bytes)))
    );
    assert_eq!(rmp_serde::from_slice::<Command>(&bytes).unwrap(), cmd);
}

/// The ring group's state once it holds a feature table (ADR 0134), and
/// the three commands that change it (raft log entries): the table is the
/// ring record's last field, absent while pristine, so the snapshots above
/// did not change with it.
#[test]
fn the_feature_table_and_its_commands_encode_to_their_frozen_bytes() {
    let mut state = MetadataState::default();
    state.apply(Command::InitRing { vnodes: 2 }).unwrap();
    let advertise = |node: u64, extra: &[&str]| Command::AdvertiseFeatures {
        node,
        binary: "0.1.0".to_owned(),
        logical: 1,
        supported: ["waited_lease", "lease_generation", "split_merge_segments"]
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect(),
    };
    let commands = [
        ("advertise_features", advertise(1, &["zeta"])),
        ("advertise_features_2", advertise(2, &["zeta"])),
        (
            "activate_feature",
            Command::ActivateFeature {
                feature: "zeta".to_owned(),
            },
        ),
        ("finalize_features", Command::FinalizeFeatures),
    ];
    for (name, cmd) in commands {
        let bytes = rmp_serde::to_vec(&cmd).unwrap();
        if name != "advertise_features_2" {
            insta::assert_snapshot!(name, frozen(hex(&bytes), render(&parse(&bytes))));
        }
        assert_eq!(rmp_serde::from_slice::<Command>(&bytes).unwrap(), cmd);
        state.apply(cmd).unwrap();
    }
    let bytes = state.snapshot().unwrap();
    insta::assert_snapshot!(
        "metadata_state_features",
        frozen(hex(&bytes), versioned(&bytes))
    );
    let restored = MetadataState::restore(&bytes).unwrap();
    assert_eq!(restored, state);
    let table = restored.features().unwrap();
    assert_eq!(table.version(), 1);
    assert_eq!(
        table.state_of("zeta", &Default::default()),
        malachi_core::model::FeatureState::Finalized
    );
}

/// The file a broker keeps what its cluster finalized in (ADR 0134): a
/// magic tag, then the record.
#[test]
fn the_finalized_features_file_encodes_to_its_frozen_bytes() {
    use malachi_cluster::vnodes::FinalizedRecord;
    let record = FinalizedRecord {
        version: 1,
        features: ["split_merge_segments".to_owned(), "zeta".to_owned()].into(),
    };
    let bytes = record.encode().unwrap();
    insta::assert_snapshot!("finalized_features_file", hex(&bytes));
    assert_eq!(FinalizedRecord::decode(&bytes), Some(record));
    assert_eq!(FinalizedRecord::decode(&bytes[..bytes.len() - 1]), None);
}

// ---------------------------------------------------------------------------
// A metadata group's files.

fn config(dir: &Path) -> GroupConfig {
    let mut config = GroupConfig::new(7, 1, dir);
    config.election_timeout_min_ms = 100;
    config.election_timeout_max_ms = 200;
    config.heartbeat_interval_ms = 30;
    // No snapshot but the one the test asks for.
    config.snapshot_every_entries = 1_000;
    config
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap()
}

fn state_of(group: &MetadataGroup) -> MetadataState {
    group.read_local(|s| s.clone())
}

fn write(dir: &Path, files: &[(&str, &[u8])]) {
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

#[tokio::test]
async fn a_metadata_groups_log_vote_and_snapshot_files_are_frozen() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected = MetadataState::default();
    expected.apply(create_orders()).unwrap();

    // A fresh single voter: its membership (index 0, term 0), the blank
    // entry of its first term (index 1, term 1), then one command. The
    // entries are durable once the command is applied, so the files are
    // read while the group runs, before a snapshot purges them.
    let group = MetadataGroup::open_single(config(dir.path()))
        .await
        .unwrap();
    group.propose(create_orders()).await.unwrap().unwrap();
    let applied = group.status().last_applied;
    assert_eq!(applied, Some(2));
    let log = read(dir.path(), "log");
    let vote = read(dir.path(), "vote");
    // A snapshot of everything applied; the log is purged behind it.
    assert_eq!(group.snapshot_now().await.unwrap(), 2);
    group.shutdown().await.unwrap();
    let snapshot = read(dir.path(), "snapshot");
    let purged = read(dir.path(), "log");

    insta::assert_snapshot!("raft_log", frozen(hex(&log), group_file(&log).0));
    insta::assert_snapshot!("raft_vote", frozen(hex(&vote), group_file(&vote).0));
    // The snapshot file's body is (meta, data); data is the state snapshot
    // (`MetadataState::snapshot`), decoded below it as well.
    let (rendered, bodies) = group_file(&snapshot);
    let Value::Array(fields) = &bodies[0] else {
        panic!("the snapshot body is not (meta, data)");
    };
    let data = fields[1].as_byte_seq().unwrap();
    assert_eq!(data, expected.snapshot().unwrap());
    insta::assert_snapshot!(
        "raft_snapshot",
        frozen(
            hex(&snapshot),
            format!(
                "{rendered}
data, decoded:
{}",
                versioned(&data)
            )
        )
    );
    insta::assert_snapshot!(
        "raft_log_purged",
        frozen(hex(&purged), group_file(&purged).0)
    );

    // A group opened over the log and vote alone replays the command.
    let replay = tempfile::tempdir().unwrap();
    write(replay.path(), &[("log", &log), ("vote", &vote)]);
    let group = MetadataGroup::open_single(config(replay.path()))
        .await
        .unwrap();
    assert_eq!(state_of(&group), expected);
    let status = group.status();
    assert_eq!((status.group_id, status.voters), (7, vec![1]));
    assert_eq!(status.snapshot, None);
    group.shutdown().await.unwrap();

    // A group opened over the snapshot and the purged log restores the
    // state from the snapshot.
    let restore = tempfile::tempdir().unwrap();
    write(
        restore.path(),
        &[("log", &purged), ("vote", &vote), ("snapshot", &snapshot)],
    );
    let group = MetadataGroup::open_single(config(restore.path()))
        .await
        .unwrap();
    assert_eq!(state_of(&group), expected);
    assert_eq!(group.status().snapshot, Some(2));
    group.shutdown().await.unwrap();
}

/// A storage policy with automatic reshaping's settings (ADR 0143, behind
/// `reshape_policy`), and the same policy without them: the field is the
/// policy's last and left out while unset, so a policy without it encodes
/// exactly as before it existed and older brokers still decode it.
#[test]
fn a_policy_with_and_without_reshaping_encodes_to_its_frozen_bytes() {
    use malachi_core::model::{ReshapePolicy, StoragePolicy};
    let plain = StoragePolicy {
        name: "p".to_owned(),
        retention_age_ms: Some(1_000),
        retention_bytes: None,
        placement: Vec::new(),
        reshape: None,
    };
    let reshaping = StoragePolicy {
        reshape: Some(ReshapePolicy {
            auto_reshape: Some(true),
            split_write_bytes_per_second: Some(4 << 20),
            split_after_ms: Some(30_000),
            ranges_max: Some(16),
            ..ReshapePolicy::default()
        }),
        ..plain.clone()
    };
    for (name, policy) in [("policy_plain", &plain), ("policy_reshape", &reshaping)] {
        let cmd = Command::PutPolicy {
            policy: policy.clone(),
        };
        let bytes = rmp_serde::to_vec(&cmd).unwrap();
        insta::assert_snapshot!(name, frozen(hex(&bytes), render(&parse(&bytes))));
        assert_eq!(rmp_serde::from_slice::<Command>(&bytes).unwrap(), cmd);
    }
    // What a broker from before the field decodes: the plain policy, not
    // the one with reshaping (rmp-serde refuses a longer array).
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct OlderPolicy {
        name: String,
        retention_age_ms: Option<u64>,
        retention_bytes: Option<u64>,
        placement: Vec<String>,
    }
    let older =
        |p: &StoragePolicy| rmp_serde::from_slice::<OlderPolicy>(&rmp_serde::to_vec(p).unwrap());
    assert!(older(&plain).is_ok());
    assert!(older(&reshaping).is_err());
}

/// The admin stores' commands (ADR 0148, raft log entries behind
/// `admin_store`) and the ring group's state holding users, an ACL entry
/// and a lockout key: the store is the state's last field, absent while
/// empty, and the cursor keys' slot before it is written as nil when the
/// group holds no keys, so every snapshot above is unchanged.
#[test]
fn the_admin_stores_and_their_commands_encode_to_their_frozen_bytes() {
    use malachi_core::auth::acl::{
        AclEntry, NamePattern, Operation, Permission, Principal, PrincipalPattern, ResourcePattern,
    };
    use malachi_core::auth::lockout::{LockoutKey, LockoutPolicy};
    use malachi_core::auth::scram::StoredCredential;
    let entry = AclEntry {
        principal: PrincipalPattern::User(Principal::user("alice")),
        resource: ResourcePattern::Topic(NamePattern::Prefixed("orders".to_owned())),
        operation: Operation::Produce,
        permission: Permission::Allow,
    };
    let key = LockoutKey {
        principal: "alice".to_owned(),
        source: "10.0.0.1".to_owned(),
    };
    let put = |name: &str| Command::PutUser {
        name: name.to_owned(),
        credential: StoredCredential::from_salted(&[0x5a; 32], &[0x33; 16], 4096),
        replace: false,
        at_ms: 1_700_000_000_000,
    };
    let mut state = MetadataState::default();
    state.apply(Command::InitRing { vnodes: 2 }).unwrap();
    let commands = [
        ("put_user", put("alice")),
        ("put_user_bob", put("bob")),
        ("delete_user", Command::DeleteUser { name: "bob".into() }),
        (
            "add_acl",
            Command::AddAcl {
                entry: entry.clone(),
            },
        ),
        (
            "add_acl_again",
            Command::AddAcl {
                entry: entry.clone(),
            },
        ),
        (
            "record_login_failure",
            Command::RecordLoginFailure {
                key: key.clone(),
                policy: LockoutPolicy::default(),
                at_ms: 1_700_000_000_500,
            },
        ),
        (
            "record_login_failure_2",
            Command::RecordLoginFailure {
                key: LockoutKey {
                    source: "10.0.0.2".to_owned(),
                    ..key.clone()
                },
                policy: LockoutPolicy::default(),
                at_ms: 1_700_000_000_600,
            },
        ),
        (
            "record_login_success",
            Command::RecordLoginSuccess {
                key: LockoutKey {
                    source: "10.0.0.2".to_owned(),
                    ..key.clone()
                },
            },
        ),
    ];
    for (name, cmd) in commands {
        let bytes = rmp_serde::to_vec(&cmd).unwrap();
        if !name.ends_with("_bob") && !name.ends_with("_again") && !name.ends_with("_2") {
            insta::assert_snapshot!(name, frozen(hex(&bytes), render(&parse(&bytes))));
        }
        assert_eq!(rmp_serde::from_slice::<Command>(&bytes).unwrap(), cmd);
        state.apply(cmd).unwrap();
    }
    let bytes = state.snapshot().unwrap();
    insta::assert_snapshot!(
        "metadata_state_admin_store",
        frozen(hex(&bytes), versioned(&bytes))
    );
    let restored = MetadataState::restore(&bytes).unwrap();
    assert_eq!(restored, state);
    let view = restored.auth_view();
    assert_eq!(view.users.keys().collect::<Vec<_>>(), ["alice"]);
    assert_eq!(view.acls, vec![entry.clone()]);
    assert_eq!(view.lockout.len(), 1);
    // Two more commands, frozen without being applied.
    for (name, cmd) in [
        ("remove_acl", Command::RemoveAcl { entry }),
        (
            "unlock_user",
            Command::UnlockUser {
                name: "alice".into(),
            },
        ),
    ] {
        let bytes = rmp_serde::to_vec(&cmd).unwrap();
        insta::assert_snapshot!(name, frozen(hex(&bytes), render(&parse(&bytes))));
        assert_eq!(rmp_serde::from_slice::<Command>(&bytes).unwrap(), cmd);
    }
}

/// The token issuer keys (ADR 0152): their commands (behind `token_keys`)
/// and a ring group state holding one, as the admin store's last field,
/// left out while empty so `metadata_state_admin_store` is unchanged.
#[test]
fn the_token_keys_and_their_commands_encode_to_their_frozen_bytes() {
    use malachi_core::auth::token::{TokenAlgorithm, TokenKey};
    let key = TokenKey {
        kid: "k1".into(),
        algorithm: TokenAlgorithm::EdDSA,
        public_key_pem: "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAhfKbHyBGFxlhsTvSzKBzfmLhNyYf7N7HRBxRqKlD3q8=\n-----END PUBLIC KEY-----\n".into(),
        added_at_ms: 1_800_000_000_000,
    };
    let mut state = MetadataState::default();
    state.apply(Command::InitRing { vnodes: 2 }).unwrap();
    for (name, cmd) in [
        ("add_token_key", Command::AddTokenKey { key: key.clone() }),
        (
            "remove_token_key",
            Command::RemoveTokenKey { kid: "k1".into() },
        ),
    ] {
        let bytes = rmp_serde::to_vec(&cmd).unwrap();
        insta::assert_snapshot!(name, frozen(hex(&bytes), render(&parse(&bytes))));
        assert_eq!(rmp_serde::from_slice::<Command>(&bytes).unwrap(), cmd);
    }
    state
        .apply(Command::AddTokenKey { key: key.clone() })
        .unwrap();
    let bytes = state.snapshot().unwrap();
    insta::assert_snapshot!(
        "metadata_state_token_keys",
        frozen(hex(&bytes), versioned(&bytes))
    );
    let restored = MetadataState::restore(&bytes).unwrap();
    assert_eq!(restored, state);
    assert_eq!(restored.auth_view().token_keys.get("k1"), Some(&key));
}
