//! Forming a cluster and staying in it (ADR 0102): the cluster id, the
//! settings every broker of one cluster must share, and the decisions a
//! broker takes from what its live peers say about themselves.
//!
//! Each broker gossips a *card* in reserved SWIM attributes (`malachi.*`):
//! - `malachi.cluster`: `c:<id>` once its data dir records the cluster's id,
//!   or `new:<candidate>` while it has none (a fresh data dir), with a random
//!   candidate drawn at this start;
//! - `malachi.shape`: the ring's vnode count and replicas per vnode;
//! - `malachi.nodes`: the voters every vnode group is drawn from, once known,
//!   joined by `+` (`cluster status` lists attributes joined by commas);
//! - `malachi.expect`: the `--bootstrap-expect` count while bootstrapping.
//!
//! Two pure functions read the cards, so the same rules run in the broker
//! and in the tests:
//! - [`decide_bootstrap`]: a fresh broker with `--bootstrap-expect N` waits
//!   until N fresh brokers with the same expectation and shape see each
//!   other; the N lowest node ids are the voters, and the cluster id is the
//!   candidate of the lowest of them. A broker that sees an established
//!   cluster listing it adopts that cluster instead.
//! - [`check_peers`]: a broker that knows its voters refuses a running
//!   cluster whose id, shape or voters differ from its own, and learns the
//!   id of a cluster formed from a static `[cluster] nodes` list (the
//!   lowest node's candidate at the first start) when its data dir has none.
//!
//! Nothing here does I/O or draws randomness (the broker draws the
//! candidate and persists what these decide): a module of the pure core.

use std::collections::BTreeMap;
use std::fmt;

/// The attribute carrying a broker's cluster mark.
pub const ATTR_CLUSTER: &str = "malachi.cluster";
/// The attribute carrying the ring's shape.
pub const ATTR_SHAPE: &str = "malachi.shape";
/// The attribute carrying the voters, once known.
pub const ATTR_NODES: &str = "malachi.nodes";
/// The attribute carrying every member the ring lists (founders, brokers
/// that joined, decommissioned ones), once the broker runs: a fresh data
/// dir under one of those ids lost its data (issue 18).
pub const ATTR_MEMBERS: &str = "malachi.members";
/// The attribute carrying `--bootstrap-expect` while bootstrapping.
pub const ATTR_EXPECT: &str = "malachi.expect";
/// Attribute keys the broker reserves for itself; operators may not set them.
pub const RESERVED_ATTRIBUTE_PREFIX: &str = "malachi.";
/// The longest `malachi.nodes` value gossiped (membership's attribute value
/// bound, `ATTRIBUTE_VALUE_BYTES_MAX`; a test there keeps the two equal).
pub const NODES_ATTR_BYTES_MAX: usize = 128;

/// A cluster's id: drawn at random once, when the cluster forms, and
/// recorded in every member's data dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterId(pub u128);

impl ClusterId {
    /// Parses the 32 lowercase hex digits [`Display`](fmt::Display) writes.
    pub fn parse(text: &str) -> Option<ClusterId> {
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(text, 16).ok().map(ClusterId)
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// What a broker says of its cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Its data dir records this cluster id.
    Established(ClusterId),
    /// Its data dir records no cluster id yet; `candidate` becomes the
    /// cluster's id if this broker is the lowest node of a forming cluster.
    New { candidate: ClusterId },
}

impl Mark {
    fn encode(self) -> String {
        match self {
            Mark::Established(id) => format!("c:{id}"),
            Mark::New { candidate } => format!("new:{candidate}"),
        }
    }

    fn decode(text: &str) -> Option<Mark> {
        if let Some(id) = text.strip_prefix("c:") {
            return ClusterId::parse(id).map(Mark::Established);
        }
        text.strip_prefix("new:")
            .and_then(ClusterId::parse)
            .map(|candidate| Mark::New { candidate })
    }
}

/// The ring's shape: what every broker of one cluster must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub vnodes: u32,
    pub replicas_per_vnode: usize,
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "vnodes={} replicas_per_vnode={}",
            self.vnodes, self.replicas_per_vnode
        )
    }
}

impl Shape {
    fn encode(self) -> String {
        format!("v{}.r{}", self.vnodes, self.replicas_per_vnode)
    }

    fn decode(text: &str) -> Option<Shape> {
        let (v, r) = text.strip_prefix('v')?.split_once(".r")?;
        Some(Shape {
            vnodes: v.parse().ok()?,
            replicas_per_vnode: r.parse().ok()?,
        })
    }
}

/// What one broker gossips about its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Card {
    pub node_id: u64,
    pub mark: Option<Mark>,
    pub shape: Option<Shape>,
    /// The voters it knows, sorted (absent while bootstrapping, or when the
    /// list is too long for one attribute).
    pub nodes: Option<Vec<u64>>,
    pub expect: Option<u32>,
    /// Every member the ring lists, sorted (absent until the broker runs,
    /// or when the list is too long for one attribute).
    pub members: Option<Vec<u64>>,
}

/// A sorted id list as an attribute value (`1+2+3`), or `None` when it is
/// longer than an attribute may be.
fn encode_ids(ids: &[u64]) -> Option<String> {
    let list: Vec<String> = ids.iter().map(u64::to_string).collect();
    let list = list.join("+");
    (list.len() <= NODES_ATTR_BYTES_MAX).then_some(list)
}

fn decode_ids(text: &str) -> Option<Vec<u64>> {
    let mut ids = text
        .split('+')
        .map(|n| n.parse::<u64>().ok())
        .collect::<Option<Vec<u64>>>()?;
    ids.sort_unstable();
    ids.dedup();
    Some(ids)
}

/// The `malachi.members` attribute for `members` (sorted here), or `None`
/// when the list is too long to gossip.
pub fn members_attribute(members: &[u64]) -> Option<(String, String)> {
    let mut sorted = members.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    encode_ids(&sorted).map(|list| (ATTR_MEMBERS.to_owned(), list))
}

impl Card {
    /// The card a member's attributes carry (unknown or malformed fields
    /// read as absent: a card is a hint checked, never trusted blindly).
    pub fn from_attributes(node_id: u64, attributes: &BTreeMap<String, String>) -> Card {
        let get = |key: &str| attributes.get(key).map(String::as_str);
        Card {
            node_id,
            mark: get(ATTR_CLUSTER).and_then(Mark::decode),
            shape: get(ATTR_SHAPE).and_then(Shape::decode),
            nodes: get(ATTR_NODES).and_then(decode_ids),
            expect: get(ATTR_EXPECT).and_then(|n| n.parse().ok()),
            members: get(ATTR_MEMBERS).and_then(decode_ids),
        }
    }

    /// The attributes that gossip this card (`node_id` is the identity's).
    pub fn attributes(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Some(mark) = self.mark {
            out.push((ATTR_CLUSTER.to_owned(), mark.encode()));
        }
        if let Some(shape) = self.shape {
            out.push((ATTR_SHAPE.to_owned(), shape.encode()));
        }
        if let Some(list) = self.nodes.as_deref().and_then(encode_ids) {
            out.push((ATTR_NODES.to_owned(), list));
        }
        if let Some(expect) = self.expect {
            out.push((ATTR_EXPECT.to_owned(), expect.to_string()));
        }
        if let Some(list) = self.members.as_deref().and_then(encode_ids) {
            out.push((ATTR_MEMBERS.to_owned(), list));
        }
        out
    }
}

/// Why a broker may not start beside the peers it sees. Each names the
/// peer and both sides of the difference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormationError {
    #[error(
        "node {node} belongs to cluster {theirs}, and this broker's data dir to cluster {ours}: a data dir from another cluster is refused; give this broker an empty data dir, or point its seeds at its own cluster"
    )]
    ForeignCluster {
        node: u64,
        theirs: ClusterId,
        ours: ClusterId,
    },
    #[error(
        "node {node} runs with {theirs}, this broker is configured with {ours}: every broker of a cluster needs the same [cluster] vnodes and replicas_per_vnode"
    )]
    ShapeDiffers {
        node: u64,
        theirs: Shape,
        ours: Shape,
    },
    #[error(
        "node {node} votes among nodes {theirs:?}, this broker among {ours:?}: every broker of a cluster needs the same [cluster] nodes"
    )]
    NodesDiffer {
        node: u64,
        theirs: Vec<u64>,
        ours: Vec<u64>,
    },
    #[error(
        "node {node} bootstraps expecting {theirs} brokers, this broker expects {ours}: start every first broker with the same --bootstrap-expect"
    )]
    ExpectDiffers { node: u64, theirs: u32, ours: u32 },
    #[error(
        "{expect} brokers bootstrapped the cluster as nodes {nodes:?} without this broker (node {me}): start exactly --bootstrap-expect brokers first, then start the others without --bootstrap-expect to join"
    )]
    Excluded {
        me: u64,
        expect: u32,
        nodes: Vec<u64>,
    },
    #[error(
        "node {node} runs cluster {cluster}, formed by nodes {nodes:?}, which do not include this broker: to join it, start this broker with its seeds and without --bootstrap-expect or [cluster] nodes"
    )]
    Running {
        node: u64,
        cluster: ClusterId,
        nodes: Vec<u64>,
    },
    #[error(
        "node {me} formed cluster {cluster} (with nodes {nodes:?}) but its data dir holds no record of it: a broker that lost its data must not vote again. Restore its data dir, or decommission node {me} and join with a new node id"
    )]
    LostData {
        me: u64,
        cluster: ClusterId,
        nodes: Vec<u64>,
    },
    #[error(
        "node {node} of cluster {cluster} lists node {me} as a member (it joined earlier), but this broker's data dir holds no record of it: a broker that lost its data must not come back under its old id, its raft votes and logs gone. Restore its data dir, or start it with a new node id (and decommission node {me})"
    )]
    LostMembership {
        me: u64,
        node: u64,
        cluster: ClusterId,
    },
}

/// The cluster a fresh broker joins (ADR 0104): learned from an
/// established peer's card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joining {
    pub cluster_id: ClusterId,
    /// The nodes the cluster was formed with.
    pub nodes: Vec<u64>,
    pub shape: Shape,
}

/// The decision of a fresh broker with seeds but neither `[cluster] nodes`
/// nor `--bootstrap-expect`: `None` until an established peer is seen,
/// then the cluster it joins. `vnodes` is the vnode count the operator
/// set, if any (the cluster's is adopted otherwise). A node id among the
/// cluster's formation nodes is refused: that broker lost its data dir.
pub fn decide_join(
    me: u64,
    vnodes: Option<u32>,
    peers: &[Card],
) -> Result<Option<Joining>, FormationError> {
    let mut joining: Option<Joining> = None;
    for peer in peers {
        let (Some(Mark::Established(id)), Some(shape), Some(nodes)) =
            (peer.mark, peer.shape, peer.nodes.as_ref())
        else {
            continue;
        };
        if let Some(first) = &joining
            && first.cluster_id != id
        {
            return Err(FormationError::ForeignCluster {
                node: peer.node_id,
                theirs: id,
                ours: first.cluster_id,
            });
        }
        if let Some(wanted) = vnodes
            && wanted != shape.vnodes
        {
            return Err(FormationError::ShapeDiffers {
                node: peer.node_id,
                theirs: shape,
                ours: Shape {
                    vnodes: wanted,
                    ..shape
                },
            });
        }
        if nodes.contains(&me) {
            return Err(FormationError::LostData {
                me,
                cluster: id,
                nodes: nodes.clone(),
            });
        }
        if peer.members.as_ref().is_some_and(|m| m.contains(&me)) {
            return Err(FormationError::LostMembership {
                me,
                node: peer.node_id,
                cluster: id,
            });
        }
        joining.get_or_insert(Joining {
            cluster_id: id,
            nodes: nodes.clone(),
            shape,
        });
    }
    Ok(joining)
}

/// What a bootstrapping broker does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Formation {
    /// Too few brokers yet: these (this one included) are seen.
    Wait { seen: Vec<u64> },
    /// The cluster is formed: record it and open its vnode groups.
    Formed {
        nodes: Vec<u64>,
        cluster_id: ClusterId,
    },
}

/// The decision of a fresh broker started with `--bootstrap-expect expect`
/// (`me` is its own card; `peers` the other live members' cards).
pub fn decide_bootstrap(
    me: &Card,
    expect: u32,
    peers: &[Card],
) -> Result<Formation, FormationError> {
    let ours = me.shape;
    let shape_check = |peer: &Card| match (peer.shape, ours) {
        (Some(theirs), Some(ours)) if theirs != ours => Err(FormationError::ShapeDiffers {
            node: peer.node_id,
            theirs,
            ours,
        }),
        _ => Ok(()),
    };
    // An established cluster wins: adopt it if it lists this broker (it
    // formed while this one was still looking), else it is not ours to join.
    let mut adopted: Option<(ClusterId, Vec<u64>)> = None;
    for peer in peers {
        let Some(Mark::Established(id)) = peer.mark else {
            continue;
        };
        shape_check(peer)?;
        let nodes = peer.nodes.clone().unwrap_or_default();
        if !nodes.contains(&me.node_id) {
            return Err(FormationError::Running {
                node: peer.node_id,
                cluster: id,
                nodes,
            });
        }
        match &adopted {
            Some((first, _)) if *first != id => {
                return Err(FormationError::ForeignCluster {
                    node: peer.node_id,
                    theirs: id,
                    ours: *first,
                });
            }
            _ => adopted = Some((id, nodes)),
        }
    }
    if let Some((cluster_id, nodes)) = adopted {
        return Ok(Formation::Formed { nodes, cluster_id });
    }
    let mut fresh: Vec<(u64, ClusterId)> = Vec::new();
    if let Some(Mark::New { candidate }) = me.mark {
        fresh.push((me.node_id, candidate));
    }
    for peer in peers {
        let Some(Mark::New { candidate }) = peer.mark else {
            continue;
        };
        match peer.expect {
            Some(theirs) if theirs != expect => {
                return Err(FormationError::ExpectDiffers {
                    node: peer.node_id,
                    theirs,
                    ours: expect,
                });
            }
            Some(_) => {}
            // A fresh broker with a static node list forms its own way.
            None => continue,
        }
        shape_check(peer)?;
        fresh.push((peer.node_id, candidate));
    }
    fresh.sort_unstable();
    fresh.dedup_by_key(|(node, _)| *node);
    if fresh.len() < expect as usize {
        return Ok(Formation::Wait {
            seen: fresh.iter().map(|(n, _)| *n).collect(),
        });
    }
    let chosen = &fresh[..expect as usize];
    let nodes: Vec<u64> = chosen.iter().map(|(n, _)| *n).collect();
    if !nodes.contains(&me.node_id) {
        return Err(FormationError::Excluded {
            me: me.node_id,
            expect,
            nodes,
        });
    }
    Ok(Formation::Formed {
        nodes,
        cluster_id: chosen[0].1,
    })
}

/// Checks a broker that knows its voters (`me.nodes`, sorted) against the
/// live peers' cards, and returns the cluster id it learns if its own
/// card has none recorded (`me.mark` is `New`).
///
/// A static cluster's id is the candidate its lowest node drew at the
/// cluster's first start: a fresh broker learns it from an established
/// peer of its cluster, or from the lowest node while that one is fresh
/// too. The lowest node adopts its own candidate only once it has seen
/// every other node fresh, so a lowest node restarted on an empty data dir
/// learns the running cluster's id instead of making one up.
pub fn check_peers(me: &Card, peers: &[Card]) -> Result<Option<ClusterId>, FormationError> {
    let ours_nodes = me.nodes.clone().unwrap_or_default();
    let mut learned: Option<ClusterId> = None;
    for peer in peers {
        if let (Some(theirs), Some(ours)) = (peer.shape, me.shape)
            && theirs != ours
        {
            return Err(FormationError::ShapeDiffers {
                node: peer.node_id,
                theirs,
                ours,
            });
        }
        match (peer.mark, me.mark) {
            (Some(Mark::Established(theirs)), Some(Mark::Established(ours))) if theirs != ours => {
                return Err(FormationError::ForeignCluster {
                    node: peer.node_id,
                    theirs,
                    ours,
                });
            }
            (Some(Mark::Established(theirs)), Some(Mark::New { .. }))
                if ours_nodes.contains(&peer.node_id) =>
            {
                learned.get_or_insert(theirs);
            }
            _ => {}
        }
        if let Some(theirs) = &peer.nodes
            && *theirs != ours_nodes
            && !ours_nodes.is_empty()
        {
            return Err(FormationError::NodesDiffer {
                node: peer.node_id,
                theirs: theirs.clone(),
                ours: ours_nodes,
            });
        }
    }
    if learned.is_some() || !matches!(me.mark, Some(Mark::New { .. })) {
        return Ok(learned);
    }
    // No established peer: the lowest node's candidate, if it is fresh too.
    let Some(&lowest) = ours_nodes.first() else {
        return Ok(None);
    };
    if lowest == me.node_id {
        let all_seen_fresh = ours_nodes.iter().filter(|n| **n != me.node_id).all(|n| {
            peers
                .iter()
                .any(|p| p.node_id == *n && matches!(p.mark, Some(Mark::New { .. })))
        });
        return Ok(match me.mark {
            Some(Mark::New { candidate }) if all_seen_fresh => Some(candidate),
            _ => None,
        });
    }
    Ok(peers
        .iter()
        .find(|p| p.node_id == lowest)
        .and_then(|p| match p.mark {
            Some(Mark::New { candidate }) => Some(candidate),
            _ => None,
        }))
}

/// Whether a peer's card says it belongs to a cluster other than `ours`:
/// raft and replication never talk to such a broker.
pub fn is_foreign(ours: Option<ClusterId>, peer: &Card) -> bool {
    matches!((ours, peer.mark), (Some(ours), Some(Mark::Established(theirs))) if ours != theirs)
}

/// A data dir's record of the cluster it belongs to
/// (`metadata/cluster-settings`).
///
/// ```text
/// nodes=1,2,3 vnodes=16 replicas_per_vnode=3
/// cluster_id=<32 hex digits>        (once known)
/// joined=true                       (a broker that joined a running cluster)
/// ```
///
/// `nodes` are the nodes the cluster was formed with; a broker that
/// joined later is not among them (ADR 0104).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRecord {
    pub nodes: Vec<u64>,
    pub shape: Shape,
    pub cluster_id: Option<ClusterId>,
    pub joined: bool,
}

/// Why a cluster record cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cluster record: {reason}")]
pub struct RecordError {
    pub reason: String,
}

impl ClusterRecord {
    /// The record's first line: what decides which vnodes exist and who
    /// votes in each (unchanged since the file was introduced).
    pub fn settings_line(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(u64::to_string).collect();
        format!("nodes={} {}", nodes.join(","), self.shape)
    }

    pub fn render(&self) -> String {
        let mut out = self.settings_line();
        out.push('\n');
        if let Some(id) = self.cluster_id {
            out.push_str(&format!("cluster_id={id}\n"));
        }
        if self.joined {
            out.push_str("joined=true\n");
        }
        out
    }

    pub fn parse(text: &str) -> Result<ClusterRecord, RecordError> {
        let bad = |reason: &str| RecordError {
            reason: reason.to_owned(),
        };
        let mut lines = text.lines();
        let first = lines.next().ok_or_else(|| bad("empty"))?;
        let mut nodes = None;
        let mut vnodes = None;
        let mut replicas = None;
        for field in first.split_whitespace() {
            let (key, value) = field
                .split_once('=')
                .ok_or_else(|| bad("a field without `=`"))?;
            match key {
                "nodes" => {
                    nodes = Some(
                        value
                            .split(',')
                            .map(|n| {
                                n.parse::<u64>()
                                    .map_err(|_| bad("a node id is not a number"))
                            })
                            .collect::<Result<Vec<u64>, _>>()?,
                    )
                }
                "vnodes" => {
                    vnodes = Some(value.parse().map_err(|_| bad("vnodes is not a number"))?)
                }
                "replicas_per_vnode" => {
                    replicas = Some(
                        value
                            .parse()
                            .map_err(|_| bad("replicas_per_vnode is not a number"))?,
                    )
                }
                _ => return Err(bad("an unknown field")),
            }
        }
        let mut cluster_id = None;
        let mut joined = false;
        for line in lines {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if line == "joined=true" {
                joined = true;
                continue;
            }
            let id = line
                .strip_prefix("cluster_id=")
                .ok_or_else(|| bad("an unknown line"))?;
            cluster_id =
                Some(ClusterId::parse(id).ok_or_else(|| bad("cluster_id is not 32 hex digits"))?);
        }
        Ok(ClusterRecord {
            nodes: nodes.ok_or_else(|| bad("no nodes"))?,
            shape: Shape {
                vnodes: vnodes.ok_or_else(|| bad("no vnodes"))?,
                replicas_per_vnode: replicas.ok_or_else(|| bad("no replicas_per_vnode"))?,
            },
            cluster_id,
            joined,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SHAPE: Shape = Shape {
        vnodes: 16,
        replicas_per_vnode: 3,
    };

    fn fresh(node_id: u64, expect: u32) -> Card {
        Card {
            node_id,
            mark: Some(Mark::New {
                candidate: ClusterId(u128::from(node_id) * 1000),
            }),
            shape: Some(SHAPE),
            nodes: None,
            expect: Some(expect),
            members: None,
        }
    }

    fn established(node_id: u64, id: u128, nodes: &[u64]) -> Card {
        Card {
            node_id,
            mark: Some(Mark::Established(ClusterId(id))),
            shape: Some(SHAPE),
            nodes: Some(nodes.to_vec()),
            expect: None,
            members: None,
        }
    }

    #[test]
    fn a_card_survives_its_attributes() {
        for card in [fresh(7, 3), established(2, 0xabc, &[1, 2, 3])] {
            let attrs: BTreeMap<String, String> = card.attributes().into_iter().collect();
            assert_eq!(Card::from_attributes(card.node_id, &attrs), card);
        }
        let attrs: BTreeMap<String, String> = established(2, 0xabc, &[1, 2, 3])
            .attributes()
            .into_iter()
            .collect();
        insta::assert_debug_snapshot!("card_attributes", attrs);
    }

    #[test]
    fn bootstrap_waits_for_the_expected_count_then_takes_the_lowest_ids() {
        let me = fresh(2, 3);
        assert_eq!(
            decide_bootstrap(&me, 3, &[fresh(5, 3)]).unwrap(),
            Formation::Wait { seen: vec![2, 5] }
        );
        let formed = decide_bootstrap(&me, 3, &[fresh(5, 3), fresh(9, 3)]).unwrap();
        assert_eq!(
            formed,
            Formation::Formed {
                nodes: vec![2, 5, 9],
                cluster_id: ClusterId(2000)
            }
        );
    }

    #[test]
    fn bootstrap_names_what_differs() {
        let me = fresh(1, 3);
        let mut other = fresh(2, 3);
        other.shape = Some(Shape {
            vnodes: 256,
            replicas_per_vnode: 3,
        });
        let err = decide_bootstrap(&me, 3, &[other]).unwrap_err();
        assert!(err.to_string().contains("vnodes=256"), "{err}");
        assert!(err.to_string().contains("vnodes=16"), "{err}");
        let err = decide_bootstrap(&me, 3, &[fresh(2, 5)]).unwrap_err();
        assert_eq!(
            err,
            FormationError::ExpectDiffers {
                node: 2,
                theirs: 5,
                ours: 3
            }
        );
        let err = decide_bootstrap(&fresh(9, 2), 2, &[fresh(1, 2), fresh(2, 2)]).unwrap_err();
        assert!(matches!(err, FormationError::Excluded { .. }), "{err}");
    }

    #[test]
    fn bootstrap_adopts_an_established_cluster_that_lists_it_and_refuses_one_that_does_not() {
        let me = fresh(3, 3);
        let peers = [established(1, 77, &[1, 2, 3]), fresh(2, 3)];
        assert_eq!(
            decide_bootstrap(&me, 3, &peers).unwrap(),
            Formation::Formed {
                nodes: vec![1, 2, 3],
                cluster_id: ClusterId(77)
            }
        );
        let err = decide_bootstrap(&fresh(4, 3), 3, &peers).unwrap_err();
        assert!(
            matches!(err, FormationError::Running { node: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_data_dir_of_another_cluster_is_foreign() {
        let me = established(1, 5, &[1, 2, 3]);
        let err = check_peers(&me, &[established(2, 6, &[1, 2, 3])]).unwrap_err();
        assert_eq!(
            err,
            FormationError::ForeignCluster {
                node: 2,
                theirs: ClusterId(6),
                ours: ClusterId(5)
            }
        );
        assert!(is_foreign(Some(ClusterId(5)), &established(2, 6, &[1])));
        assert!(!is_foreign(Some(ClusterId(5)), &established(2, 5, &[1])));
        assert!(!is_foreign(Some(ClusterId(5)), &fresh(2, 3)));
        assert!(!is_foreign(None, &established(2, 6, &[1])));
    }

    #[test]
    fn a_static_cluster_learns_the_lowest_nodes_candidate() {
        let static_card = |node: u64| Card {
            expect: None,
            nodes: Some(vec![1, 2, 3]),
            ..fresh(node, 0)
        };
        // Node 2 learns node 1's candidate as soon as it sees node 1 fresh.
        assert_eq!(
            check_peers(&static_card(2), &[static_card(1)]).unwrap(),
            Some(ClusterId(1000))
        );
        // Node 1 adopts its own only once it saw every other node fresh.
        assert_eq!(
            check_peers(&static_card(1), &[static_card(2)]).unwrap(),
            None
        );
        assert_eq!(
            check_peers(&static_card(1), &[static_card(2), static_card(3)]).unwrap(),
            Some(ClusterId(1000))
        );
        // An established peer of the cluster wins.
        assert_eq!(
            check_peers(
                &static_card(1),
                &[static_card(2), established(3, 42, &[1, 2, 3])]
            )
            .unwrap(),
            Some(ClusterId(42))
        );
        // Other voters are refused, naming both lists.
        let err = check_peers(&static_card(1), &[established(3, 42, &[1, 2, 3, 4])]).unwrap_err();
        assert!(err.to_string().contains("[1, 2, 3, 4]"), "{err}");
    }

    #[test]
    fn a_record_reads_what_it_writes_and_the_first_line_is_unchanged() {
        let record = ClusterRecord {
            nodes: vec![1, 2, 3],
            shape: SHAPE,
            cluster_id: Some(ClusterId(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef)),
            joined: false,
        };
        insta::assert_snapshot!("cluster_record", record.render());
        assert_eq!(ClusterRecord::parse(&record.render()).unwrap(), record);
        let joined = ClusterRecord {
            joined: true,
            ..record.clone()
        };
        insta::assert_snapshot!("cluster_record_joined", joined.render());
        assert_eq!(ClusterRecord::parse(&joined.render()).unwrap(), joined);
        // A record from before cluster ids.
        let old = ClusterRecord::parse("nodes=1 vnodes=1 replicas_per_vnode=3\n").unwrap();
        assert_eq!(old.cluster_id, None);
        assert_eq!(old.render(), "nodes=1 vnodes=1 replicas_per_vnode=3\n");
        assert!(ClusterRecord::parse("nodes=1 vnodes=x replicas_per_vnode=3").is_err());
        assert!(
            ClusterRecord::parse("nodes=1 vnodes=1 replicas_per_vnode=3\ncluster_id=zz").is_err()
        );
    }

    #[test]
    fn a_fresh_broker_joins_the_established_cluster_it_sees() {
        assert_eq!(decide_join(4, None, &[fresh(1, 3)]).unwrap(), None);
        let joining = decide_join(4, None, &[fresh(5, 3), established(2, 42, &[1, 2, 3])])
            .unwrap()
            .unwrap();
        assert_eq!(joining.cluster_id, ClusterId(42));
        assert_eq!(joining.nodes, vec![1, 2, 3]);
        assert_eq!(joining.shape, SHAPE);
        // Two clusters through the seeds, a vnode count of its own, or a
        // formation node whose data dir is gone: refused by name.
        let two = decide_join(
            4,
            None,
            &[
                established(2, 42, &[1, 2, 3]),
                established(7, 43, &[7, 8, 9]),
            ],
        )
        .unwrap_err();
        assert!(
            matches!(two, FormationError::ForeignCluster { .. }),
            "{two}"
        );
        let vnodes = decide_join(4, Some(256), &[established(2, 42, &[1, 2, 3])]).unwrap_err();
        assert!(vnodes.to_string().contains("vnodes=256"), "{vnodes}");
        let lost = decide_join(3, None, &[established(2, 42, &[1, 2, 3])]).unwrap_err();
        assert!(lost.to_string().contains("new node id"), "{lost}");
        // A broker that joined later and lost its data dir: the running
        // members list it, so it is refused too.
        let listing = Card {
            members: Some(vec![1, 2, 3, 4]),
            ..established(2, 42, &[1, 2, 3])
        };
        let attrs: BTreeMap<String, String> = listing.attributes().into_iter().collect();
        assert_eq!(Card::from_attributes(2, &attrs), listing);
        let wiped = decide_join(4, None, std::slice::from_ref(&listing)).unwrap_err();
        assert!(
            matches!(wiped, FormationError::LostMembership { me: 4, node: 2, .. }),
            "{wiped}"
        );
        assert!(wiped.to_string().contains("new node id"), "{wiped}");
        // A new id still joins.
        assert!(decide_join(5, None, &[listing]).unwrap().is_some());
    }

    proptest! {
        /// Every broker of a bootstrap that sees the same fresh brokers
        /// forms the same cluster, whatever order it sees them in, and a
        /// broker that sees fewer only waits.
        #[test]
        fn every_bootstrapping_broker_forms_the_same_cluster(
            ids in proptest::collection::btree_set(1u64..50, 1..8),
            expect in 1u32..6,
            seen_fraction in 0.0f64..1.0,
        ) {
            let ids: Vec<u64> = ids.into_iter().collect();
            let cards: Vec<Card> = ids.iter().map(|id| fresh(*id, expect)).collect();
            let mut formed = None;
            for me in &cards {
                let all: Vec<Card> = cards.iter().filter(|c| c.node_id != me.node_id).cloned().collect();
                let cut = ((all.len() as f64) * seen_fraction) as usize;
                let partial = &all[..cut];
                match decide_bootstrap(me, expect, partial) {
                    Ok(Formation::Wait { seen }) => prop_assert!(seen.len() < expect as usize),
                    Ok(Formation::Formed { nodes, .. }) => prop_assert!(nodes.contains(&me.node_id)),
                    Err(FormationError::Excluded { .. }) => {}
                    Err(e) => prop_assert!(false, "{e}"),
                }
                match decide_bootstrap(me, expect, &all) {
                    Ok(Formation::Formed { nodes, cluster_id }) => {
                        prop_assert_eq!(nodes.len(), expect as usize);
                        prop_assert_eq!(cluster_id, ClusterId(u128::from(nodes[0]) * 1000));
                        if let Some(first) = &formed {
                            prop_assert_eq!(first, &(nodes.clone(), cluster_id));
                        }
                        formed = Some((nodes, cluster_id));
                    }
                    Ok(Formation::Wait { .. }) => prop_assert!(ids.len() < expect as usize),
                    Err(FormationError::Excluded { nodes, .. }) => {
                        prop_assert!(!nodes.contains(&me.node_id));
                    }
                    Err(e) => prop_assert!(false, "{e}"),
                }
            }
        }
    }
}
