//! How this broker finds its cluster at start (ADR 0102): which voters its
//! vnode groups are drawn from, under which cluster id, and whether the
//! brokers it sees agree.
//!
//! - [`plan`] reads the data dir's record (`metadata/cluster-settings`) and
//!   the configuration, and says where the voters come from: a fixed
//!   `[cluster] nodes` list, the record of an earlier start, a bootstrap
//!   from seeds (`bootstrap_expect`), or this broker alone. Seeds with none
//!   of these are refused: such a broker would be silently alone among
//!   others.
//! - [`form`] runs SWIM for a moment before the supervision tree starts,
//!   reads the live peers' cards (`malachi_core::formation`), waits for
//!   a bootstrap to complete, refuses a cluster whose id, shape or voters
//!   differ, and records what it decided before any vnode group opens.
//! - [`Formed`] is what the rest of the broker reads afterwards: the card
//!   it gossips, and the cluster id (learned later for a fixed node list
//!   whose lowest node had not been seen yet).

use std::path::{Path, PathBuf};
use std::time::Duration;

use malachi_core::formation::{
    Card, ClusterId, ClusterRecord, Formation, FormationError, Mark, Shape, check_peers,
    decide_bootstrap, decide_join,
};
use malachi_membership::{Membership, MembershipView, RuntimeArgs, runtime};
use parking_lot::Mutex;
use tracing::{info, warn};

use crate::common::config::{BrokerConfig, MetadataBackend};
use crate::common::error::BrokerError;

/// The file in `data_dir/metadata` recording the cluster.
pub(crate) const CLUSTER_RECORD_FILE: &str = "cluster-settings";
/// How long a broker with known voters looks for peers before it starts,
/// so a foreign or differently configured cluster is refused at start.
const LOOK_AROUND_MS: u64 = 1_500;
/// How long it keeps looking once a first peer has answered (the others of
/// a cluster starting together answer within a few SWIM rounds).
const LOOK_AFTER_FIRST_PEER_MS: u64 = 300;
/// How long a bootstrap's decision must stay the same before it is
/// recorded: a few SWIM rounds, so brokers still joining are counted.
const BOOTSTRAP_SETTLE_MS: u64 = 1_000;
/// How often a waiting bootstrap says what it sees.
const BOOTSTRAP_REPORT_MS: u64 = 5_000;

/// Where the voters come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// This broker alone (no seeds), or the file metadata backend.
    Lone,
    /// `[cluster] nodes`.
    Fixed,
    /// The data dir's record of a cluster bootstrapped earlier.
    Recorded,
    /// Not formed yet: wait for `expect` fresh brokers.
    Bootstrap { expect: u32 },
    /// A fresh broker with seeds only: join the running cluster they lead
    /// to (ADR 0104).
    Join,
}

/// What [`plan`] decided, and [`form`] completes.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub mode: Mode,
    /// Sorted voters (empty while bootstrapping).
    pub nodes: Vec<u64>,
    pub shape: Shape,
    pub cluster_id: Option<ClusterId>,
    /// The id this broker proposes if it turns out to be a new cluster's
    /// lowest node.
    pub candidate: ClusterId,
    /// `None` with the file backend, which records nothing.
    pub record_path: Option<PathBuf>,
    /// This broker joined a running cluster: it is not among `nodes`, the
    /// cluster's formation nodes (ADR 0104).
    pub joined: bool,
    /// The vnode count the operator set, if any (a joining broker adopts
    /// the cluster's otherwise).
    pub explicit_vnodes: Option<u32>,
    /// How long a joining broker looks for its cluster (ADR 0104).
    pub join_timeout_ms: u64,
}

impl Plan {
    /// The card this broker gossips while it starts.
    pub fn card(&self, node_id: u64) -> Card {
        if self.mode == Mode::Join {
            // Nothing to compare yet: it adopts what it finds.
            return Card {
                node_id,
                mark: Some(Mark::New {
                    candidate: self.candidate,
                }),
                shape: None,
                nodes: None,
                expect: None,
                members: None,
            };
        }
        Card {
            node_id,
            mark: Some(match self.cluster_id {
                Some(id) => Mark::Established(id),
                None => Mark::New {
                    candidate: self.candidate,
                },
            }),
            shape: Some(self.shape),
            nodes: (!self.nodes.is_empty()).then(|| self.nodes.clone()),
            expect: match self.mode {
                Mode::Bootstrap { expect } => Some(expect),
                _ => None,
            },
            members: None,
        }
    }

    /// Whether [`form`] must look at the peers before the broker starts.
    pub fn looks_around(&self) -> bool {
        matches!(self.mode, Mode::Bootstrap { .. } | Mode::Join)
            || self.joined
            || (matches!(self.mode, Mode::Fixed | Mode::Recorded) && self.nodes.len() > 1)
    }

    fn record(&self) -> ClusterRecord {
        ClusterRecord {
            nodes: self.nodes.clone(),
            shape: self.shape,
            cluster_id: self.cluster_id,
            joined: self.joined,
        }
    }
}

fn refused(reason: String) -> BrokerError {
    BrokerError::Config { reason }
}

fn read_record(path: &Path) -> Result<Option<ClusterRecord>, BrokerError> {
    match std::fs::read_to_string(path) {
        Ok(text) => ClusterRecord::parse(&text).map(Some).map_err(|e| {
            refused(format!(
                "{} is unreadable ({e}): it records the cluster this data dir belongs to",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(BrokerError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Decides where this broker's voters come from, and refuses a data dir
/// whose record disagrees with the configuration (the voters it would
/// compute would no longer match its groups' memberships, ADR 0081).
pub(crate) fn plan(config: &BrokerConfig, candidate: ClusterId) -> Result<Plan, BrokerError> {
    let shape = config.shape();
    if config.metadata_backend == MetadataBackend::File {
        return Ok(file_backed(config, candidate));
    }
    let path = config.data_dir.join("metadata").join(CLUSTER_RECORD_FILE);
    let record = read_record(&path)?;
    let mut plan = Plan {
        mode: Mode::Lone,
        nodes: config.cluster_nodes(),
        shape,
        cluster_id: None,
        candidate,
        record_path: Some(path),
        joined: false,
        explicit_vnodes: config.cluster.vnodes,
        join_timeout_ms: config.cluster.join_timeout_ms,
    };
    if !config.cluster.nodes.is_empty() {
        return fixed_nodes(config, plan, record);
    }
    if let Some(recorded) = record {
        if recorded.nodes.len() > 1 || recorded.joined {
            // Formed earlier (bootstrap), or joined: the record is the
            // cluster.
            return recorded_cluster(config, plan, recorded);
        }
        // A lone broker's record.
        if config.bootstrap_expect() > 1
            || recorded.settings_line() != plan.record().settings_line()
        {
            let wanted = ClusterRecord {
                nodes: if config.bootstrap_expect() > 1 {
                    Vec::new()
                } else {
                    plan.nodes.clone()
                },
                ..plan.record()
            };
            return Err(settings_differ(config, &recorded, &wanted));
        }
        plan.cluster_id = recorded.cluster_id;
    } else if config.bootstrap_expect() > 1 {
        plan.mode = Mode::Bootstrap {
            expect: config.bootstrap_expect(),
        };
        plan.nodes = Vec::new();
        return Ok(plan);
    }
    if !config.seeds.is_empty() {
        // Seeds alone: join the cluster they lead to, or refuse once none
        // is found (never run alone among others).
        plan.mode = Mode::Join;
        plan.nodes = Vec::new();
        return Ok(plan);
    }
    Ok(plan)
}

/// The plan of a broker on the file backend: alone, with no record.
fn file_backed(config: &BrokerConfig, candidate: ClusterId) -> Plan {
    Plan {
        mode: Mode::Lone,
        nodes: vec![config.node_id],
        shape: config.shape(),
        cluster_id: None,
        candidate,
        record_path: None,
        joined: false,
        explicit_vnodes: config.cluster.vnodes,
        join_timeout_ms: config.cluster.join_timeout_ms,
    }
}

/// The plan of a broker configured with its cluster's nodes: the record,
/// if any, must have been made with the same settings.
fn fixed_nodes(
    config: &BrokerConfig,
    mut plan: Plan,
    record: Option<ClusterRecord>,
) -> Result<Plan, BrokerError> {
    plan.mode = if plan.nodes.len() > 1 {
        Mode::Fixed
    } else {
        Mode::Lone
    };
    if let Some(recorded) = record {
        if recorded.settings_line() != plan.record().settings_line() {
            return Err(settings_differ(config, &recorded, &plan.record()));
        }
        plan.cluster_id = recorded.cluster_id;
    }
    Ok(plan)
}

/// The plan of a broker whose data dir records a cluster formed earlier
/// (bootstrap) or joined: the record is the cluster, and settings that
/// disagree with it are refused.
fn recorded_cluster(
    config: &BrokerConfig,
    plan: Plan,
    recorded: ClusterRecord,
) -> Result<Plan, BrokerError> {
    let (me, shape) = (config.node_id, config.shape());
    if !recorded.joined && !recorded.nodes.contains(&me) {
        return Err(refused(format!(
            "the data dir {} records a cluster of nodes {:?} without this node {me}",
            config.data_dir.display(),
            recorded.nodes
        )));
    }
    let vnodes_differ = config
        .cluster
        .vnodes
        .is_some_and(|v| v != recorded.shape.vnodes);
    if vnodes_differ || shape.replicas_per_vnode != recorded.shape.replicas_per_vnode {
        let wanted = ClusterRecord {
            shape,
            ..recorded.clone()
        };
        return Err(settings_differ(config, &recorded, &wanted));
    }
    if let Some(expect) = config.cluster.bootstrap_expect
        && expect as usize != recorded.nodes.len()
    {
        info!(
            expect,
            nodes = ?recorded.nodes,
            "bootstrap_expect is ignored: the data dir records the cluster formed earlier"
        );
    }
    Ok(Plan {
        mode: Mode::Recorded,
        nodes: recorded.nodes,
        shape: recorded.shape,
        cluster_id: recorded.cluster_id,
        joined: recorded.joined,
        ..plan
    })
}

/// The refusal of a data dir created with other cluster settings.
fn settings_differ(
    config: &BrokerConfig,
    recorded: &ClusterRecord,
    wanted: &ClusterRecord,
) -> BrokerError {
    refused(format!(
        "the data dir {} was created with cluster settings `{}`, not `{}`: every broker keeps the [cluster] nodes, vnodes and replicas_per_vnode its data dir was created with",
        config.data_dir.display(),
        recorded.settings_line(),
        wanted.settings_line()
    ))
}

/// Writes the record through a synced temporary file and a rename, and
/// syncs the directory.
fn write_record(path: &Path, record: &ClusterRecord) -> Result<(), BrokerError> {
    use std::io::Write;
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| BrokerError::Io { path, source }
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tmp = path.with_extension("tmp");
    {
        let mut file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        file.write_all(record.render().as_bytes())
            .map_err(io(&tmp))?;
        file.sync_all().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io(path))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(())
}

/// The peers' cards in `view` (live members other than this one).
fn peer_cards(view: &MembershipView, me: u64) -> Vec<Card> {
    view.live()
        .filter(|m| m.node_id != me)
        .map(|m| Card::from_attributes(m.node_id, &m.attributes))
        .collect()
}

/// How [`form`] runs SWIM before the tree starts.
pub(crate) struct FormArgs {
    pub membership: Membership,
    pub socket: std::net::UdpSocket,
    pub runtime: RuntimeArgs,
}

/// Completes `plan` against the live peers: waits for a bootstrap, or
/// looks around for a moment; refuses what disagrees; records the result.
/// SWIM runs only for this, and stops before the tree starts its own run.
pub(crate) async fn form(plan: &mut Plan, args: FormArgs) -> Result<(), BrokerError> {
    let me = args.runtime.identity.node_id;
    if plan.looks_around() {
        args.socket
            .set_nonblocking(true)
            .map_err(|source| BrokerError::Io {
                path: PathBuf::from("swim socket"),
                source,
            })?;
        let socket =
            tokio::net::UdpSocket::from_std(args.socket).map_err(|source| BrokerError::Io {
                path: PathBuf::from("swim socket"),
                source,
            })?;
        let membership = args.membership.clone();
        let swim = tokio::spawn(runtime::run(membership, socket, args.runtime));
        let outcome = watch_peers(plan, me, &args.membership).await;
        swim.abort();
        outcome?;
    }
    if plan.cluster_id.is_none() && plan.mode == Mode::Lone {
        // A lone broker is a cluster of its own, formed now.
        plan.cluster_id = Some(plan.candidate);
    }
    if let Some(path) = &plan.record_path {
        let record = plan.record();
        if read_record(path)?.as_ref() != Some(&record) {
            write_record(path, &record)?;
        }
    }
    Ok(())
}

/// One look of a broker joining through its seeds: `true` once `plan`
/// names the running cluster it joins; refused past `join_timeout_ms`.
/// `clock` is when the look started and now.
fn join_step(
    plan: &mut Plan,
    me: u64,
    peers: &[Card],
    (started, now): (tokio::time::Instant, tokio::time::Instant),
    reported: &mut tokio::time::Instant,
) -> Result<bool, BrokerError> {
    if let Some(joining) = decide_join(me, plan.explicit_vnodes, peers)? {
        info!(
            cluster = %joining.cluster_id,
            formed_by = ?joining.nodes,
            shape = %joining.shape,
            "joining the running cluster"
        );
        plan.nodes = joining.nodes;
        plan.shape = joining.shape;
        plan.cluster_id = Some(joining.cluster_id);
        plan.joined = true;
        plan.mode = Mode::Recorded;
        return Ok(true);
    }
    if now.duration_since(started) >= Duration::from_millis(plan.join_timeout_ms) {
        let seen: Vec<u64> = peers.iter().map(|p| p.node_id).collect();
        return Err(refused(format!(
            "seeds are set, but neither [cluster] nodes nor --bootstrap-expect, and no running cluster answered through them within {} ms (brokers seen: {seen:?}): to join a cluster, check the seeds; to start a new one, start its first brokers with --bootstrap-expect N (the same N on each), or list every broker's node id in [cluster] nodes (docs/guides/clustering.md)",
            plan.join_timeout_ms
        )));
    }
    if now.duration_since(*reported) >= Duration::from_millis(BOOTSTRAP_REPORT_MS) {
        *reported = now;
        info!(
            seen = ?peers.iter().map(|p| p.node_id).collect::<Vec<_>>(),
            "looking for a running cluster to join through the seeds"
        );
    }
    Ok(false)
}

/// One look of a bootstrapping broker: `true` once the same formation was
/// decided for `BOOTSTRAP_SETTLE_MS` and `plan` records it. `clock` is
/// now, the formation decided and since when, and the last report.
fn bootstrap_step(
    plan: &mut Plan,
    me: u64,
    expect: u32,
    peers: &[Card],
    (now, settled, reported): (
        tokio::time::Instant,
        &mut Option<(Formation, tokio::time::Instant)>,
        &mut tokio::time::Instant,
    ),
) -> Result<bool, BrokerError> {
    let decision = decide_bootstrap(&plan.card(me), expect, peers)?;
    if let Formation::Wait { seen } = &decision
        && now.duration_since(*reported) >= Duration::from_millis(BOOTSTRAP_REPORT_MS)
    {
        *reported = now;
        info!(
            expect,
            ?seen,
            "bootstrap: waiting for the other brokers to be seen"
        );
    }
    match (&decision, &*settled) {
        (Formation::Formed { .. }, Some((same, since))) if *same == decision => {
            if now.duration_since(*since) >= Duration::from_millis(BOOTSTRAP_SETTLE_MS) {
                let Formation::Formed { nodes, cluster_id } = decision else {
                    unreachable!("matched Formed above");
                };
                info!(?nodes, cluster = %cluster_id, "bootstrap: the cluster is formed");
                plan.nodes = nodes;
                plan.cluster_id = Some(cluster_id);
                plan.mode = Mode::Recorded;
                return Ok(true);
            }
        }
        (Formation::Formed { .. }, _) => *settled = Some((decision, now)),
        (Formation::Wait { .. }, _) => *settled = None,
    }
    Ok(false)
}

async fn watch_peers(plan: &mut Plan, me: u64, membership: &Membership) -> Result<(), BrokerError> {
    let mut view = membership.watch();
    let started = tokio::time::Instant::now();
    let mut first_peer: Option<tokio::time::Instant> = None;
    let mut settled: Option<(Formation, tokio::time::Instant)> = None;
    let mut reported = started;
    loop {
        let peers = peer_cards(&view.borrow_and_update(), me);
        let now = tokio::time::Instant::now();
        match plan.mode {
            Mode::Join => {
                if join_step(plan, me, &peers, (started, now), &mut reported)? {
                    return Ok(());
                }
            }
            Mode::Bootstrap { expect } => {
                let clock = (now, &mut settled, &mut reported);
                if bootstrap_step(plan, me, expect, &peers, clock)? {
                    return Ok(());
                }
            }
            _ => {
                if let Some(learned) = check_peers(&plan.card(me), &peers)? {
                    plan.cluster_id.get_or_insert(learned);
                }
                if !peers.is_empty() {
                    first_peer.get_or_insert(now);
                }
                let all_seen = plan
                    .nodes
                    .iter()
                    .all(|n| *n == me || peers.iter().any(|p| p.node_id == *n));
                let after_first = first_peer.is_some_and(|at| {
                    now.duration_since(at) >= Duration::from_millis(LOOK_AFTER_FIRST_PEER_MS)
                });
                if all_seen
                    || after_first
                    || now.duration_since(started) >= Duration::from_millis(LOOK_AROUND_MS)
                {
                    return Ok(());
                }
            }
        }
        // Wake on a change, and at least every 100 ms to let time pass.
        let _ = tokio::time::timeout(Duration::from_millis(100), view.changed()).await;
    }
}

/// What the running broker knows of its cluster: the card it gossips, and
/// the cluster id, which a broker of a fixed node list may learn later.
#[derive(Debug)]
pub(crate) struct Formed {
    pub card: Card,
    /// Where a learned id is gossiped, beside the operator's attributes.
    membership: Membership,
    operator_attributes: std::collections::BTreeMap<String, String>,
    record_path: Option<PathBuf>,
    record: Mutex<ClusterRecord>,
    /// Peers already reported as foreign (by node id and incarnation).
    reported: Mutex<std::collections::BTreeSet<(u64, u64)>>,
    /// The last disagreement with a peer's settings that was logged.
    disagreement: Mutex<Option<String>>,
    /// The ring's members as last gossiped (`malachi.members`).
    members: Mutex<Option<Vec<u64>>>,
}

impl Formed {
    pub(crate) fn new(
        plan: &Plan,
        node_id: u64,
        membership: Membership,
        operator_attributes: std::collections::BTreeMap<String, String>,
    ) -> Formed {
        Formed {
            card: plan.card(node_id),
            membership,
            operator_attributes,
            record_path: plan.record_path.clone(),
            record: Mutex::new(plan.record()),
            reported: Mutex::new(Default::default()),
            disagreement: Mutex::new(None),
            members: Mutex::new(None),
        }
    }

    /// Gossips every member the ring lists (`malachi.members`), when it
    /// changed: a fresh data dir started under one of those ids is then
    /// refused at join (`FormationError::LostMembership`, issue 18).
    pub(crate) fn advertise_members(&self, members: Vec<u64>) {
        {
            let mut known = self.members.lock();
            if known.as_ref() == Some(&members) {
                return;
            }
            *known = Some(members.clone());
        }
        let mut attributes = self.membership.local().attributes;
        match malachi_core::formation::members_attribute(&members) {
            Some((key, value)) => {
                attributes.insert(key, value);
            }
            None => {
                attributes.remove(malachi_core::formation::ATTR_MEMBERS);
            }
        }
        if let Err(e) = self.membership.set_local_attributes(attributes) {
            warn!(error = %e, "cannot gossip the cluster's members");
        }
    }

    pub fn cluster_id(&self) -> Option<ClusterId> {
        self.record.lock().cluster_id
    }

    /// Reads the live peers: learns the cluster id if still unknown (and
    /// records it), and returns the peers that belong to another cluster,
    /// which raft and replication must never talk to. Each foreign peer is
    /// logged once per incarnation.
    pub fn observe(&self, view: &MembershipView, me: u64) -> std::collections::BTreeSet<u64> {
        let peers = peer_cards(view, me);
        if self.cluster_id().is_none() {
            // The card says `New` exactly while the id is unknown.
            match check_peers(&self.card, &peers) {
                Ok(Some(id)) => self.learn(id),
                Ok(None) => {}
                Err(e) => {
                    // Once per distinct disagreement, not per view change.
                    let message = e.to_string();
                    let mut last = self.disagreement.lock();
                    if last.as_deref() != Some(message.as_str()) {
                        warn!(error = %message, "a peer disagrees with this broker's cluster settings");
                        *last = Some(message);
                    }
                }
            }
        }
        let ours = self.cluster_id();
        let mut foreign = std::collections::BTreeSet::new();
        for member in view.live().filter(|m| m.node_id != me) {
            let card = Card::from_attributes(member.node_id, &member.attributes);
            if malachi_core::formation::is_foreign(ours, &card) {
                foreign.insert(member.node_id);
                if self
                    .reported
                    .lock()
                    .insert((member.node_id, member.incarnation))
                {
                    let theirs = match card.mark {
                        Some(Mark::Established(id)) => id.to_string(),
                        _ => String::new(),
                    };
                    warn!(
                        node = member.node_id,
                        theirs,
                        ours = ?ours.map(|id| id.to_string()),
                        "a broker of another cluster is in this membership: raft and replication ignore it"
                    );
                }
            }
        }
        foreign
    }

    fn learn(&self, id: ClusterId) {
        let record = {
            let mut record = self.record.lock();
            if record.cluster_id.is_some() {
                return;
            }
            record.cluster_id = Some(id);
            record.clone()
        };
        info!(cluster = %id, "learned the cluster id");
        if let Some(path) = &self.record_path
            && let Err(e) = write_record(path, &record)
        {
            warn!(error = %e, "cannot record the cluster id; it is learned again at the next start");
        }
        // Gossip it, so a broker of another cluster is told apart now,
        // not only after this one's next start.
        let mut card = self.card.clone();
        card.mark = Some(Mark::Established(id));
        let mut attributes = self.operator_attributes.clone();
        attributes.extend(card.attributes());
        // The space worker's word on the volume (ADR 0111), the members
        // list, the word that it reads the feature table (ADR 0134) and
        // the balancer's load (ADR 0144) stay.
        let local = self.membership.local().attributes;
        for kept in [
            crate::common::volume::STORAGE_ATTRIBUTE,
            malachi_core::formation::ATTR_MEMBERS,
            malachi_core::model::FEATURES_ATTRIBUTE,
            malachi_core::load::LOAD_ATTRIBUTE,
        ] {
            if let Some(value) = local.get(kept) {
                attributes.insert(kept.to_owned(), value.clone());
            }
        }
        if let Err(e) = self.membership.set_local_attributes(attributes) {
            warn!(error = %e, "cannot gossip the learned cluster id");
        }
    }
}

impl From<FormationError> for BrokerError {
    fn from(e: FormationError) -> BrokerError {
        BrokerError::Config {
            reason: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::config::ClusterSettings;

    fn config(dir: &Path, node_id: u64) -> BrokerConfig {
        BrokerConfig {
            node_id,
            ..BrokerConfig::for_tests(dir)
        }
    }

    #[test]
    fn seeds_without_nodes_or_bootstrap_expect_join_a_running_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let joining = BrokerConfig {
            seeds: vec!["127.0.0.1:4041".to_owned()],
            ..config(dir.path(), 1)
        };
        let planned = plan(&joining, ClusterId(1)).unwrap();
        assert_eq!(planned.mode, Mode::Join);
        assert!(planned.looks_around());
        assert!(planned.nodes.is_empty());
    }

    #[test]
    fn a_damaged_record_is_refused_naming_the_file_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata").join(CLUSTER_RECORD_FILE);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        for garbage in [
            "",
            "nodes=1 vnodes=x replicas_per_vnode=3\n",
            "\u{0}\u{1}garbage",
        ] {
            std::fs::write(&path, garbage).unwrap();
            let err = plan(&config(dir.path(), 1), ClusterId(1))
                .unwrap_err()
                .to_string();
            assert!(err.contains("cluster-settings"), "{err}");
            assert_eq!(std::fs::read_to_string(&path).unwrap(), garbage);
        }
    }

    #[test]
    fn a_lone_broker_is_a_cluster_of_its_own_and_keeps_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let alone = config(dir.path(), 1);
        let mut first = plan(&alone, ClusterId(7)).unwrap();
        assert_eq!(first.mode, Mode::Lone);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let identity = malachi_membership::NodeIdentity {
            node_id: 1,
            incarnation: 1,
            client_addr: socket.local_addr().unwrap(),
            admin_addr: None,
            raft_addr: None,
            cluster_addr: None,
            attributes: Default::default(),
        };
        let args = FormArgs {
            membership: Membership::new(&identity),
            socket,
            runtime: RuntimeArgs {
                identity,
                settings: alone.membership.swim(),
                seeds: Vec::new(),
                rng_seed: 1,
                seal: alone.membership.swim_seal(),
            },
        };
        runtime.block_on(form(&mut first, args)).unwrap();
        assert_eq!(first.cluster_id, Some(ClusterId(7)));
        let again = plan(&alone, ClusterId(8)).unwrap();
        assert_eq!(
            again.cluster_id,
            Some(ClusterId(7)),
            "the recorded id stays"
        );
    }

    #[test]
    fn a_data_dir_created_alone_refuses_a_bootstrap_and_a_fixed_list() {
        let dir = tempfile::tempdir().unwrap();
        let alone = config(dir.path(), 1);
        let first = plan(&alone, ClusterId(7)).unwrap();
        write_record(first.record_path.as_ref().unwrap(), &first.record()).unwrap();
        let bootstrap = BrokerConfig {
            seeds: vec!["127.0.0.1:4041".to_owned()],
            cluster: ClusterSettings {
                bootstrap_expect: Some(3),
                ..ClusterSettings::default()
            },
            ..config(dir.path(), 1)
        };
        let err = plan(&bootstrap, ClusterId(7)).unwrap_err().to_string();
        assert!(err.contains("nodes=1 vnodes=1"), "{err}");
        let fixed = BrokerConfig {
            cluster: ClusterSettings {
                nodes: vec![1, 2, 3],
                ..ClusterSettings::default()
            },
            ..config(dir.path(), 1)
        };
        let err = plan(&fixed, ClusterId(7)).unwrap_err().to_string();
        assert!(err.contains("nodes=1,2,3 vnodes=16"), "{err}");
    }

    #[test]
    fn a_bootstrapped_record_gives_the_voters_on_every_later_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata").join(CLUSTER_RECORD_FILE);
        let record = ClusterRecord {
            nodes: vec![1, 2, 3],
            shape: Shape {
                vnodes: 16,
                replicas_per_vnode: 3,
            },
            cluster_id: Some(ClusterId(42)),
            joined: false,
        };
        write_record(&path, &record).unwrap();
        let restarted = BrokerConfig {
            seeds: vec!["127.0.0.1:4041".to_owned()],
            ..config(dir.path(), 2)
        };
        let planned = plan(&restarted, ClusterId(9)).unwrap();
        assert_eq!(planned.mode, Mode::Recorded);
        assert_eq!(planned.nodes, vec![1, 2, 3]);
        assert_eq!(planned.cluster_id, Some(ClusterId(42)));
        let other_vnodes = BrokerConfig {
            cluster: ClusterSettings {
                vnodes: Some(256),
                ..ClusterSettings::default()
            },
            ..restarted.clone()
        };
        let err = plan(&other_vnodes, ClusterId(9)).unwrap_err().to_string();
        assert!(err.contains("vnodes=256"), "{err}");
        let not_listed = config(dir.path(), 4);
        let err = plan(&not_listed, ClusterId(9)).unwrap_err().to_string();
        assert!(err.contains("without this node 4"), "{err}");
    }
}
