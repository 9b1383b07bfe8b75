//! The broker's configuration. The binary layers TOML, `MALACHI_*`
//! environment variables and flags into it; this crate only validates it.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use malachi_core::auth::token::{
    AUDIENCE_BYTES_MAX, CLOCK_SKEW_MS_MAX, TokenAlgorithm, TokenPolicy,
};
use malachi_storage::{SealPolicy, StoreConfig};
use serde::{Deserialize, Serialize};

use crate::common::error::BrokerError;

/// Largest record value a broker may be configured to accept (the storage
/// frame format caps a whole record at 64 MiB).
pub const RECORD_VALUE_BYTES_MAX_LIMIT: usize = 32 << 20;
/// Seeds a broker may be given.
pub const SEEDS_MAX: usize = 64;
/// The most replica-appends of one segment a primary may pipeline to one
/// follower, and so the most early ones a follower holds for it.
pub const REPLICA_PIPELINE_DEPTH_LIMIT: usize = 64;
/// Room the storage frame needs besides the value (key, headers, varints).
const RECORD_OVERHEAD_BYTES: usize = 64 << 10;

/// The store tunables an operator may set (a serde mirror of the subset of
/// `malachi_storage::StoreConfig` that makes sense to expose).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    /// How long the first pending record waits before a group commit starts.
    pub flush_interval_ms: u64,
    /// Threads that write and fdatasync; distinct segments sync in parallel.
    pub sync_threads: usize,
    /// Appends beyond this many bytes pending on one segment get `busy`.
    pub pending_bytes_max: usize,
    /// Write large flushes with `O_DIRECT`, skipping the page-cache copy
    /// (ADR 0012). Off, freshly written records stay in the page cache for
    /// tailing consumers at the cost of that copy.
    pub direct_io: bool,
    /// Below this many free bytes on the data dir's volume the broker takes
    /// no records (`storage_full`) and is not ready, until a quarter more
    /// is free again (ADR 0111). The margin keeps the metadata groups, on
    /// the same volume, writing. 0: only a write's `ENOSPC` stops it.
    pub min_free_bytes: u64,
    /// Memory for the frames flushes wrote, kept so a primary ships them
    /// without reading its log back (ADR 0161), over all copies; 16 MiB at
    /// most a copy. 0 keeps none (every run is read from the log).
    pub recent_bytes_max: usize,
}

/// The default `store.min_free_bytes`: room for the metadata groups and
/// the flushes already in flight when the guard trips.
pub const MIN_FREE_BYTES_DEFAULT: u64 = 128 << 20;

impl Default for StoreSettings {
    fn default() -> Self {
        let store = StoreConfig::default();
        StoreSettings {
            flush_interval_ms: 2,
            sync_threads: 4,
            pending_bytes_max: store.pending_bytes_max,
            direct_io: store.direct_io,
            min_free_bytes: MIN_FREE_BYTES_DEFAULT,
            recent_bytes_max: store.recent_bytes_max,
        }
    }
}

/// Which metadata plane the broker runs (ADR 0060).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetadataBackend {
    /// The openraft group with this broker as its single voter.
    #[default]
    Raft,
    /// A snapshot file rewritten per command (a fallback for debugging).
    File,
}

/// Whether the client port asks TLS clients for a certificate (mTLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// No client certificate is asked for.
    #[default]
    None,
    /// A certificate is asked for and verified if sent; a client may send none.
    Optional,
    /// A client without a certificate under `client_ca_path` is refused.
    Required,
}

/// Whether the cluster port and the node fabric speak TLS with mutual
/// authentication under the cluster's CA (ADR 0151).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClusterTls {
    /// Plaintext between brokers, authenticated by the cluster cookie only.
    Off,
    /// A rolling move's first step (ADR 0162): dials plaintext, takes TLS
    /// (under the cluster CA) and plaintext.
    Accept,
    /// A rolling move's second step: dials TLS, takes TLS and plaintext.
    Send,
    /// TLS both ways, a certificate under the cluster CA required of every
    /// peer; plaintext and other certificates are refused.
    Required,
}

impl ClusterTls {
    /// The setting's word for this mode.
    pub fn name(self) -> &'static str {
        match self {
            ClusterTls::Off => "off",
            ClusterTls::Accept => "accept",
            ClusterTls::Send => "send",
            ClusterTls::Required => "required",
        }
    }

    /// Whether plaintext is taken from other brokers (or sent to them).
    pub fn allows_plaintext(self) -> bool {
        self != ClusterTls::Required
    }
}

/// Whether the client port and the admin port, once they have a
/// certificate, also take plaintext clients (ADR 0162).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientPortsTls {
    /// TLS only: a plaintext client is told so and closed (ADR 0149 §4).
    #[default]
    Required,
    /// TLS and plaintext, told apart by the first byte: the step that lets
    /// clients move to TLS one by one.
    Accept,
}

/// Whether a peer's certificate must be for the node it is (ADR 0155):
/// a URI SAN `malachi:node:<id>` or a DNS SAN `node-<id>.malachi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeIdentity {
    /// Any certificate under the cluster CA may claim any node id.
    #[default]
    Off,
    /// A dialled broker's certificate must be for the node dialled, and an
    /// accepted one's for the node it proves it is in the cookie handshake.
    Required,
}

/// The default `tls.handshake_timeout_ms`.
pub const TLS_HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// The default `tls.reload_check_ms`.
pub const TLS_RELOAD_CHECK_MS_DEFAULT: u64 = 10_000;

/// TLS on the client port and the admin port (ADR 0149), and between
/// brokers on the cluster port and the node fabric (ADR 0151). Off unless
/// `cert_path` and `key_path` are set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// The broker's certificate chain (PEM, the leaf first).
    pub cert_path: Option<PathBuf>,
    /// The broker's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_path: Option<PathBuf>,
    /// The CA client certificates must chain to (PEM), for `client_auth`.
    pub client_ca_path: Option<PathBuf>,
    /// Whether a client certificate is asked for: none, optional, required.
    pub client_auth: ClientAuth,
    /// A TLS handshake must finish within this time of the accept; the
    /// connection holds its place in the port's limits meanwhile.
    pub handshake_timeout_ms: u64,
    /// How often, at most, the certificate and key files are checked for a
    /// change (their modification time and size) and reloaded.
    pub reload_check_ms: u64,
    /// Whether the client and admin ports, with a certificate, also take
    /// plaintext clients: `required` (TLS only) or `accept` (ADR 0162).
    pub client_ports: ClientPortsTls,
    /// TLS between brokers (ADR 0151): `off`, `accept`, `send` (the steps
    /// of a rolling move, ADR 0162) or `required`; unset, it is `required`
    /// when the broker has a certificate, `off` otherwise.
    pub cluster: Option<ClusterTls>,
    /// The CA every broker's certificate must chain to (PEM); unset,
    /// `client_ca_path`.
    pub cluster_ca_path: Option<PathBuf>,
    /// The certificate and key the broker shows other brokers; unset,
    /// `cert_path` and `key_path`. It serves both ways, so it needs both
    /// the serverAuth and the clientAuth extended key usages.
    pub cluster_cert_path: Option<PathBuf>,
    pub cluster_key_path: Option<PathBuf>,
    /// The DNS name every broker's certificate carries; unset, a broker's
    /// certificate must carry the ip address its peers dial (an IP SAN).
    pub cluster_server_name: Option<String>,
    /// Whether a peer's certificate must name its node id (ADR 0155).
    pub cluster_node_identity: NodeIdentity,
}

impl Default for TlsSettings {
    fn default() -> Self {
        TlsSettings {
            cert_path: None,
            key_path: None,
            client_ca_path: None,
            client_auth: ClientAuth::None,
            handshake_timeout_ms: TLS_HANDSHAKE_TIMEOUT_MS_DEFAULT,
            reload_check_ms: TLS_RELOAD_CHECK_MS_DEFAULT,
            client_ports: ClientPortsTls::Required,
            cluster: None,
            cluster_ca_path: None,
            cluster_cert_path: None,
            cluster_key_path: None,
            cluster_server_name: None,
            cluster_node_identity: NodeIdentity::Off,
        }
    }
}

impl TlsSettings {
    /// Whether the ports speak TLS.
    pub fn enabled(&self) -> bool {
        self.cert_path.is_some()
    }

    fn check(&self) -> Result<(), String> {
        if self.cert_path.is_some() != self.key_path.is_some() {
            return Err("tls.cert_path and tls.key_path must be set together".into());
        }
        if !self.enabled()
            && (self.client_ca_path.is_some() || self.client_auth != ClientAuth::None)
        {
            return Err(
                "tls.client_ca_path and tls.client_auth need tls.cert_path and tls.key_path".into(),
            );
        }
        if (self.client_auth == ClientAuth::None) != self.client_ca_path.is_none() {
            return Err(
                "tls.client_auth = \"optional\" or \"required\" needs tls.client_ca_path, and tls.client_ca_path needs one of them"
                    .into(),
            );
        }
        if !self.enabled() && self.client_ports != ClientPortsTls::Required {
            return Err("tls.client_ports = \"accept\" needs tls.cert_path and tls.key_path: without them the client and admin ports are plaintext only".into());
        }
        if self.handshake_timeout_ms == 0 || self.reload_check_ms == 0 {
            return Err("tls.handshake_timeout_ms and tls.reload_check_ms must be positive".into());
        }
        self.check_cluster()
    }

    /// Whether brokers speak TLS to each other (ADR 0151).
    pub fn cluster_mode(&self) -> ClusterTls {
        self.cluster.unwrap_or(if self.enabled() {
            ClusterTls::Required
        } else {
            ClusterTls::Off
        })
    }

    /// The CA peers' certificates must chain to.
    pub fn cluster_ca(&self) -> Option<&PathBuf> {
        self.cluster_ca_path
            .as_ref()
            .or(self.client_ca_path.as_ref())
    }

    /// The certificate and key shown to other brokers.
    pub fn cluster_pair(&self) -> Option<(&PathBuf, &PathBuf)> {
        match (&self.cluster_cert_path, &self.cluster_key_path) {
            (Some(cert), Some(key)) => Some((cert, key)),
            _ => self.cert_path.as_ref().zip(self.key_path.as_ref()),
        }
    }

    fn check_cluster(&self) -> Result<(), String> {
        if self.cluster_cert_path.is_some() != self.cluster_key_path.is_some() {
            return Err(
                "tls.cluster_cert_path and tls.cluster_key_path must be set together".into(),
            );
        }
        if self.cluster_mode() == ClusterTls::Off {
            if self.cluster_node_identity == NodeIdentity::Required {
                return Err("tls.cluster_node_identity = \"required\" needs TLS between brokers (tls.cluster = \"required\"): the node id is read from the peer's certificate".into());
            }
            return Ok(());
        }
        if self.cluster_pair().is_none() {
            return Err(format!(
                "tls.cluster = \"{}\" needs a certificate: tls.cert_path and tls.key_path, or tls.cluster_cert_path and tls.cluster_key_path",
                self.cluster_mode().name()
            ));
        }
        if self.cluster_ca().is_none() {
            return Err("TLS between brokers (tls.cluster, \"required\" by default with a certificate) needs the CA every broker's certificate chains to: set tls.cluster_ca_path (or tls.client_ca_path), or tls.cluster = \"off\" for a broker that never has peers".into());
        }
        if let Some(name) = &self.cluster_server_name
            && rustls::pki_types::ServerName::try_from(name.as_str()).is_err()
        {
            return Err(format!(
                "tls.cluster_server_name {name:?} is neither a DNS name nor an IP address"
            ));
        }
        Ok(())
    }
}

/// The cookie brokers authenticate each other's ractor_cluster sessions with
/// when none is configured. Fine on a laptop; a warning says so at start.
pub const DEV_CLUSTER_COOKIE: &str = "malachi-dev-cookie";

/// Membership (SWIM) and the node fabric (ractor_cluster). The SWIM socket is
/// UDP on the client address's own ip:port, so it needs no setting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MembershipSettings {
    /// How often a broker probes another.
    pub probe_period_ms: u64,
    /// How long a direct probe waits before others are asked to probe.
    pub probe_rtt_ms: u64,
    /// How long a suspected broker has to refute before it is declared dead.
    pub suspect_timeout_ms: u64,
    /// Largest SWIM datagram.
    pub packet_bytes_max: usize,
    /// While alone, announce to the seeds this often.
    pub seed_retry_ms: u64,
    /// Where the ractor_cluster node server listens; the client address's
    /// ip with a free port if unset. Advertised to the others through SWIM.
    pub cluster_listen_addr: Option<SocketAddr>,
    /// The shared secret of ractor_cluster sessions (every broker of a
    /// cluster must have the same). A development cookie if unset.
    pub cluster_cookie: Option<String>,
    /// The ip other brokers reach this one on, when it listens on an
    /// unspecified address (0.0.0.0 or ::).
    pub advertise_ip: Option<IpAddr>,
    /// How long a remote call (a tree snapshot) may take before the broker
    /// is reported unreachable.
    pub remote_call_timeout_ms: u64,
    /// Connections accepted on the node fabric port at once, authenticated
    /// or not; more are closed at accept.
    pub fabric_connections_max: usize,
    /// A node fabric connection that has not authenticated within this long
    /// of its accept is closed.
    pub fabric_handshake_timeout_ms: u64,
    /// How SWIM datagrams are sealed with a key derived from the cluster
    /// cookie (ADR 0147): `required` (the default: sealed out, only sealed
    /// in), or the steps a cluster from before sealing takes to it without
    /// a stop, `accept` (plain out, both in), then `send` (sealed out, both
    /// in); `off` is as before sealing and lets anyone who reaches the
    /// port steer membership.
    pub swim_seal: SwimSeal,
}

/// `membership.swim_seal` (ADR 0147).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwimSeal {
    Off,
    Accept,
    Send,
    #[default]
    Required,
}

impl Default for MembershipSettings {
    fn default() -> Self {
        let swim = malachi_membership::SwimSettings::default();
        MembershipSettings {
            probe_period_ms: swim.probe_period_ms,
            probe_rtt_ms: swim.probe_rtt_ms,
            suspect_timeout_ms: swim.suspect_timeout_ms,
            packet_bytes_max: swim.packet_bytes_max,
            seed_retry_ms: swim.seed_retry_ms,
            cluster_listen_addr: None,
            cluster_cookie: None,
            advertise_ip: None,
            remote_call_timeout_ms: 3_000,
            fabric_connections_max: 64,
            fabric_handshake_timeout_ms: 5_000,
            swim_seal: SwimSeal::default(),
        }
    }
}

impl MembershipSettings {
    /// The SWIM timers these settings ask for.
    pub fn swim(&self) -> malachi_membership::SwimSettings {
        malachi_membership::SwimSettings {
            probe_period_ms: self.probe_period_ms,
            probe_rtt_ms: self.probe_rtt_ms,
            suspect_timeout_ms: self.suspect_timeout_ms,
            packet_bytes_max: self.packet_bytes_max,
            seed_retry_ms: self.seed_retry_ms,
        }
    }

    /// How SWIM seals its datagrams: the key from the cluster cookie (the
    /// development cookie when none is set), and the mode.
    pub fn swim_seal(&self) -> malachi_membership::seal::SealSettings {
        use malachi_membership::seal::SealMode;
        let cookie = self.cluster_cookie.as_deref().unwrap_or(DEV_CLUSTER_COOKIE);
        malachi_membership::seal::SealSettings {
            key: malachi_membership::seal::SwimKey::from_cookie(cookie),
            mode: match self.swim_seal {
                SwimSeal::Off => SealMode::Off,
                SwimSeal::Accept => SealMode::Accept,
                SwimSeal::Send => SealMode::Send,
                SwimSeal::Required => SealMode::Required,
            },
        }
    }
}

/// Brokers a cluster may list in `cluster.nodes`.
pub const CLUSTER_NODES_MAX: usize = 64;
/// The shortest `cluster.replace_after_ms`: several liveness windows, so a
/// broker that restarts is never replaced.
pub const REPLACE_AFTER_MS_MIN: u64 = 5_000;

/// The bounds of `cluster.peer_unreachable_after_ms`: above the
/// transport's connect and handshake timeouts (1 s each), so one slow dial
/// never counts; at most ten minutes.
pub const PEER_UNREACHABLE_AFTER_MS_MIN: u64 = 2_000;
pub const PEER_UNREACHABLE_AFTER_MS_MAX: u64 = 600_000;
/// The longest `cluster.peer_reachable_hold_ms`.
pub const PEER_REACHABLE_HOLD_MS_MAX: u64 = 600_000;

/// A sealed copy is re-read once a day by default: ZFS and Ceph scrub
/// weekly to monthly, and the scrubber's rate bounds what it costs.
pub const SCRUB_INTERVAL_MS_DEFAULT: u64 = 24 * 60 * 60 * 1_000;
/// The shortest `cluster.scrub_interval_ms`.
pub const SCRUB_INTERVAL_MS_MIN: u64 = 1_000;

/// The metadata cluster: which brokers share the vnodes, how many vnodes
/// there are and how many brokers replicate each (ADR 0081). Every broker
/// of a cluster must be given the same `nodes`, `vnodes` and
/// `replicas_per_vnode`: they decide each vnode's voters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSettings {
    /// Every broker's node id, this one included. Empty: this broker alone,
    /// the nodes its data dir recorded, or those `bootstrap_expect` forms.
    pub nodes: Vec<u64>,
    /// Form the cluster from seeds alone (ADR 0102): a fresh broker waits
    /// until this many fresh brokers with the same setting see each other,
    /// then the lowest node ids among them are the cluster's voters,
    /// recorded in every data dir. Set on the first brokers only, instead of
    /// `nodes`; ignored once the data dir records its cluster.
    pub bootstrap_expect: Option<u32>,
    /// Where the raft transport listens; the client address's ip with a
    /// free port if unset. Advertised to the others through SWIM.
    pub raft_listen_addr: Option<SocketAddr>,
    /// Vnodes on the ring (1 to 4,096). Unset: 16 with several brokers, 1 for
    /// a lone broker (which gains nothing from more groups to fsync).
    pub vnodes: Option<u32>,
    /// Brokers per vnode group (all brokers when there are fewer).
    pub replicas_per_vnode: usize,
    /// How often the coordinator manager re-reads leadership even without an
    /// event (the slow timer that catches what an event missed).
    pub coordinator_poll_ms: u64,
    /// How long one metadata request forwarded to a vnode leader may take.
    pub forward_timeout_ms: u64,
    /// How long a coordinator's lease on its vnode's continuous work lasts
    /// in the group's view (ADR 0082).
    pub lease_duration_ms: u64,
    /// How much earlier than another may take the lease the holder stops
    /// its work: covers the rate drift of two brokers' monotonic clocks
    /// over one duration (wall clocks play no part, ADR 0122).
    pub lease_margin_ms: u64,
    /// How often a coordinator renews its lease (below duration - margin).
    pub lease_renew_ms: u64,
    /// Whether idle vnode groups go quiet (ADR 0101): no raft heartbeats
    /// or election timers while their leader's broker answers liveness
    /// probes. Off: every group ticks, as before quiescence.
    pub quiet_groups: bool,
    /// Whether an idle vnode leader hands its leadership to the group's
    /// preferred voter, so leaders spread over the brokers (ADR 0101). Off
    /// by default: with it on, a leader killed and restarted at once can
    /// leave a quiet vnode whose replicas name each other as leader.
    pub balance_leaders: bool,
    /// How long a broker may be dead before the vnode replicas it holds
    /// are replaced on the other brokers (ADR 0104). Long enough for a
    /// restart; replacing never leaves a group with fewer replicas.
    pub replace_after_ms: u64,
    /// How long a fresh broker with seeds only looks for a running
    /// cluster to join before it refuses to start (ADR 0104).
    pub join_timeout_ms: u64,
    /// How long dials of a peer's cluster port may keep failing, with no
    /// session between them, before new copies, primaries and moves stop
    /// going to it (ADR 0155). A refused dial (another CA's certificate,
    /// another cookie) counts at once; a peer never dialled is never left
    /// out.
    pub peer_unreachable_after_ms: u64,
    /// How long a peer left out for its cluster port must keep its session
    /// before it is counted on again: a flapping peer stays out.
    pub peer_reachable_hold_ms: u64,
    /// How long a scrub's verdict that a sealed copy is intact stands
    /// before the copy is read again (ADR 0110). Coordinators ask about
    /// their sealed copies every quarter of it (1 to 30 s); a broken copy
    /// is rebuilt from an intact one.
    pub scrub_interval_ms: u64,
    /// Set at start, never configured: this broker joined a running
    /// cluster and is not among `nodes`, the nodes it was formed with.
    #[serde(skip)]
    pub joined: bool,
    /// Tests only, never configured: play a broker from before feature
    /// gates (ADR 0134 §7), which gossips no `malachi.features` and
    /// advertises nothing to the feature table.
    #[serde(skip)]
    pub plays_pre_feature_gates: bool,
}

impl ClusterSettings {
    /// How this broker judges its peers' cluster ports (ADR 0155).
    pub(crate) fn reach(&self) -> malachi_cluster::group::ReachSettings {
        malachi_cluster::group::ReachSettings {
            unreachable_after_ms: self.peer_unreachable_after_ms,
            reachable_hold_ms: self.peer_reachable_hold_ms,
        }
    }

    /// The coordinator lease settings these give a broker (ADR 0083).
    pub(crate) fn lease_config(&self, node_id: u64) -> malachi_cluster::vnodes::lease::LeaseConfig {
        malachi_cluster::vnodes::lease::LeaseConfig {
            holder: node_id,
            duration_ms: self.lease_duration_ms,
            safety_margin_ms: self.lease_margin_ms,
            renew_every_ms: self.lease_renew_ms,
        }
    }
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            nodes: Vec::new(),
            bootstrap_expect: None,
            raft_listen_addr: None,
            vnodes: None,
            replicas_per_vnode: malachi_cluster::vnodes::REPLICAS_PER_VNODE_DEFAULT,
            coordinator_poll_ms: 1_000,
            forward_timeout_ms: 2_000,
            lease_duration_ms: 10_000,
            lease_margin_ms: 2_000,
            lease_renew_ms: 2_000,
            quiet_groups: true,
            balance_leaders: false,
            replace_after_ms: malachi_cluster::vnodes::rebalance::REPLACE_AFTER_MS_DEFAULT,
            join_timeout_ms: 60_000,
            peer_unreachable_after_ms:
                malachi_cluster::group::reach::PEER_UNREACHABLE_AFTER_MS_DEFAULT,
            peer_reachable_hold_ms: malachi_cluster::group::reach::PEER_REACHABLE_HOLD_MS_DEFAULT,
            scrub_interval_ms: SCRUB_INTERVAL_MS_DEFAULT,
            joined: false,
            plays_pre_feature_gates: false,
        }
    }
}

/// The default `maintenance.orphan_sweep_ms`.
pub const ORPHAN_SWEEP_MS_DEFAULT: u64 = 60_000;
/// The default `maintenance.orphan_grace_ms`.
pub const ORPHAN_GRACE_MS_DEFAULT: u64 = 60_000;
/// The default `maintenance.retention_sweep_ms`.
pub const RETENTION_SWEEP_MS_DEFAULT: u64 = 60_000;
/// The shortest `maintenance.retention_sweep_ms`.
pub const RETENTION_SWEEP_MS_MIN: u64 = 100;
/// The shortest `maintenance.orphan_sweep_ms`: each pass asks every vnode.
pub const ORPHAN_SWEEP_MS_MIN: u64 = 1_000;

/// The default `maintenance.balance_interval_ms`: a move every ten
/// seconds at most, several gossip rounds apart, so each move is seen by
/// every broker before the next is decided (ADR 0144).
pub const BALANCE_INTERVAL_MS_DEFAULT: u64 = 10_000;
/// The shortest `maintenance.balance_interval_ms` other than 0 (off).
pub const BALANCE_INTERVAL_MS_MIN: u64 = 1_000;

/// The broker's upkeep of its data on disk (issue 21, ADR 0115).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MaintenanceSettings {
    /// How often the orphan sweeper looks for copies whose segment no
    /// metadata lists. A pass with a candidate asks every vnode; it removes
    /// nothing unless all of them answered.
    pub orphan_sweep_ms: u64,
    /// A copy whose files changed this recently is never an orphan
    /// candidate, whatever the metadata says.
    pub orphan_grace_ms: u64,
    /// How often each vnode's coordinator applies its topics' retention.
    pub retention_sweep_ms: u64,
    /// The age backstop for a topic naming a policy no definition backs:
    /// its sealed segments go once sealed this long. Unset (the default),
    /// such a topic keeps all of its data.
    pub unresolved_policy_age_ms: Option<u64>,
    /// How often this broker's balancer may move one of its primaries to
    /// the least loaded broker (ADR 0144); 0 turns the balancer off.
    pub balance_interval_ms: u64,
}

impl Default for MaintenanceSettings {
    fn default() -> Self {
        MaintenanceSettings {
            orphan_sweep_ms: ORPHAN_SWEEP_MS_DEFAULT,
            orphan_grace_ms: ORPHAN_GRACE_MS_DEFAULT,
            retention_sweep_ms: RETENTION_SWEEP_MS_DEFAULT,
            unresolved_policy_age_ms: None,
            balance_interval_ms: BALANCE_INTERVAL_MS_DEFAULT,
        }
    }
}

/// The default `reshape.split_write_bytes_per_second`: 4 MiB/s.
pub const SPLIT_WRITE_BYTES_PER_SECOND_DEFAULT: u64 = 4 << 20;
/// The default `reshape.split_after_ms`: 10 s, one rate window (ADR
/// 0156's measurements: with 30 s and 60 s between reshapes a hot topic
/// could not reach a second round of splits within a minute).
pub const SPLIT_AFTER_MS_DEFAULT: u64 = 10_000;
/// The default `reshape.merge_write_bytes_per_second`: 256 KiB/s.
pub const MERGE_WRITE_BYTES_PER_SECOND_DEFAULT: u64 = 256 << 10;
/// The default `reshape.merge_after_ms`.
pub const MERGE_AFTER_MS_DEFAULT: u64 = 300_000;
/// The default `reshape.reshape_interval_ms`: 20 s between opposite
/// reshapes (a merge after a split, a split after a merge) and after a
/// refusal; a split's child still hot splits without it (ADR 0160).
pub const RESHAPE_INTERVAL_MS_DEFAULT: u64 = 20_000;
/// The default `reshape.reshape_check_interval_ms`.
pub const RESHAPE_CHECK_INTERVAL_MS_DEFAULT: u64 = 1_000;
/// The shortest `reshape.reshape_check_interval_ms`.
pub const RESHAPE_CHECK_INTERVAL_MS_MIN: u64 = 50;
/// The default `reshape.rate_window_ms`.
pub const RATE_WINDOW_MS_DEFAULT: u64 = 10_000;
/// The bucket a rate window of `window_ms` is counted in: a tenth of it,
/// at least 10 ms.
pub fn rate_bucket_ms(window_ms: u64) -> u64 {
    (window_ms / 10).max(10)
}
/// The default `reshape.ranges_max`.
pub const RANGES_MAX_DEFAULT: u32 = 64;

/// Automatic reshaping (issue 38 L11, ADR 0143): the brokers' defaults,
/// which a storage policy's `reshape` overrides per topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReshapeDefaults {
    /// Whether topics reshape themselves unless their policy says.
    /// Off by default (ADR 0143): a policy's `auto_reshape` turns it on.
    pub auto_reshape: bool,
    /// A range whose write rate stays above this for `split_after_ms` splits.
    pub split_write_bytes_per_second: u64,
    pub split_after_ms: u64,
    /// Two buddies both below this for `merge_after_ms` merge.
    pub merge_write_bytes_per_second: u64,
    pub merge_after_ms: u64,
    /// No merge this soon after a split, no split this soon after a merge
    /// or a refusal; a split's child still hot is not held back (ADR 0160).
    pub reshape_interval_ms: u64,
    /// A merge never leaves a topic with fewer active ranges.
    pub ranges_min: u32,
    /// A split never leaves a topic with more active ranges.
    pub ranges_max: u32,
    /// How often each broker checks the ranges it writes.
    pub reshape_check_interval_ms: u64,
    /// The window a range's write rate is measured over.
    pub rate_window_ms: u64,
}

impl Default for ReshapeDefaults {
    fn default() -> Self {
        ReshapeDefaults {
            auto_reshape: false,
            split_write_bytes_per_second: SPLIT_WRITE_BYTES_PER_SECOND_DEFAULT,
            split_after_ms: SPLIT_AFTER_MS_DEFAULT,
            merge_write_bytes_per_second: MERGE_WRITE_BYTES_PER_SECOND_DEFAULT,
            merge_after_ms: MERGE_AFTER_MS_DEFAULT,
            reshape_interval_ms: RESHAPE_INTERVAL_MS_DEFAULT,
            ranges_min: 1,
            ranges_max: RANGES_MAX_DEFAULT,
            reshape_check_interval_ms: RESHAPE_CHECK_INTERVAL_MS_DEFAULT,
            rate_window_ms: RATE_WINDOW_MS_DEFAULT,
        }
    }
}

impl ReshapeDefaults {
    fn check(&self) -> Result<(), String> {
        if self.reshape_check_interval_ms < RESHAPE_CHECK_INTERVAL_MS_MIN {
            return Err(format!(
                "reshape.reshape_check_interval_ms must be at least {RESHAPE_CHECK_INTERVAL_MS_MIN} ms"
            ));
        }
        if self.ranges_min == 0 || self.ranges_min > self.ranges_max {
            return Err(
                "reshape.ranges_min must be at least 1 and at most reshape.ranges_max".into(),
            );
        }
        if self.merge_write_bytes_per_second >= self.split_write_bytes_per_second {
            return Err(
                "reshape.merge_write_bytes_per_second must be below reshape.split_write_bytes_per_second, or ranges would split and merge in turn".into(),
            );
        }
        malachi_core::rate::RateMeter::new(self.rate_window_ms, rate_bucket_ms(self.rate_window_ms))
            .map(|_| ())
            .map_err(|e| format!("reshape.rate_window_ms: {e}"))
    }

    /// The decision's settings, before a policy's overrides.
    pub fn settings(&self) -> malachi_core::plan::reshape::ReshapeSettings {
        malachi_core::plan::reshape::ReshapeSettings {
            auto_reshape: self.auto_reshape,
            split_write_bytes_per_second: self.split_write_bytes_per_second,
            split_after_ms: self.split_after_ms,
            merge_write_bytes_per_second: self.merge_write_bytes_per_second,
            merge_after_ms: self.merge_after_ms,
            reshape_interval_ms: self.reshape_interval_ms,
            ranges_min: self.ranges_min,
            ranges_max: self.ranges_max,
        }
    }
}

/// Everything a single broker needs to start. Defaults serve a development
/// broker on loopback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// This broker's node id (the single voter of its metadata group).
    pub node_id: u64,
    /// The client port (port 0 picks a free port; see `BrokerHandle::client_addr`).
    pub listen_addr: SocketAddr,
    /// The admin HTTP port (health, readiness, metrics, tree).
    pub admin_addr: SocketAddr,
    /// Admin HTTP connections served at once; more are closed at accept.
    pub admin_connections_max: usize,
    /// Admin HTTP connections one client address holds at once; more from
    /// it are closed at accept, so one host cannot keep `/health` and
    /// `/ready` from others (ADR 0145).
    pub admin_address_connections_max: usize,
    /// An admin connection that writes nothing for this long while it waits
    /// on its client (no complete request head, an idle keep-alive) is closed.
    pub admin_read_timeout_ms: u64,
    /// Connections past the admin port's limits answered `/health` and
    /// `/ready` at once (the probe lane; at most one per address).
    pub admin_probe_connections_max: usize,
    /// A probe lane connection's whole time to send its request line, TLS
    /// handshake included.
    pub admin_probe_timeout_ms: u64,
    /// Holds `segments/` and `metadata/` (and, from before ADR 0096, a
    /// `cluster.secret` the first start proposes as the cluster's cursor key).
    pub data_dir: PathBuf,
    /// A segment rolls once it holds this many durable bytes.
    pub segment_bytes_max: u64,
    /// A segment rolls once it is this old.
    pub segment_age_ms: u64,
    /// Group-commit tunables of the segment store.
    pub store: StoreSettings,
    /// Largest frame a client may send or receive.
    pub frame_bytes_max: usize,
    /// Largest record value a produce may carry.
    pub record_value_bytes_max: usize,
    /// Requests one connection may have in flight (read, not yet answered);
    /// when reached the broker stops reading from that client.
    pub connection_inflight_max: usize,
    /// Append messages one segment actor may have queued or awaiting fsync.
    pub segment_inflight_max: usize,
    /// Client connections served at once; more are refused with `busy`.
    pub connections_max: usize,
    /// Client connections one source address holds at once; more from it
    /// are refused with `busy` (ADR 0145).
    pub address_connections_max: usize,
    /// A client connection whose partial frame does not complete within
    /// this long of its first byte is closed (a slowloris), time spent
    /// waiting for request budget included (ADR 0145).
    pub frame_read_timeout_ms: u64,
    /// A client connection with no request in flight, no open subscription
    /// and no frame arriving for this long is closed.
    pub idle_timeout_ms: u64,
    /// A client connection that has not sent a whole first frame and, with
    /// authentication on, logged in within this long of being accepted is
    /// closed, so idle connections that never say who they are cannot hold
    /// slots for `idle_timeout_ms` (issue 39).
    pub admission_timeout_ms: u64,
    /// Request bytes all client connections together may hold (frames being
    /// read or handled; only bytes that arrived, ADR 0145); a connection
    /// waits, unread, while it is spent.
    pub request_bytes_budget: usize,
    /// Response bytes all client connections together may hold (being built
    /// or waiting to be written); a connection stops reading requests while
    /// it is spent.
    pub response_bytes_budget: usize,
    /// Request bytes one client connection may hold (at least `frame_bytes_max`).
    pub connection_request_bytes_max: usize,
    /// Response bytes one client connection may hold (at least `frame_bytes_max`).
    pub connection_response_bytes_max: usize,
    /// Request bytes the connections of one source address may hold
    /// together (at least `frame_bytes_max`; ADR 0145).
    pub address_request_bytes_max: usize,
    /// Response bytes the connections of one source address may hold
    /// together (at least `frame_bytes_max`; ADR 0145).
    pub address_response_bytes_max: usize,
    /// A response whose writing does not finish within this long (its
    /// client does not read) closes its connection, and its share of the
    /// response budget returns (ADR 0145).
    pub response_write_timeout_ms: u64,
    /// How long a produce may take end to end before it is answered `timeout`.
    pub produce_timeout_ms: u64,
    /// Idempotent producers whose state one range keeps (ADR 0092); the
    /// least recently seen is forgotten first.
    pub producers_per_range_max: usize,
    /// A producer silent on a range for this long is forgotten there: its
    /// next batch must start a new epoch (`unknown_producer` otherwise).
    pub producer_idle_expiry_ms: u64,
    /// Upper bound on a fetch's long poll, whatever the client asks.
    pub fetch_wait_ms_max: u64,
    /// How long a produce to a replicated segment waits for a quorum of
    /// copies to fsync its records before it is answered `no_quorum`
    /// (retriable); also the bound on one replica-append round trip.
    pub replica_ack_timeout_ms: u64,
    /// Frame bytes one replica-append carries at most (one frame always fits).
    pub replica_append_bytes_max: usize,
    /// Replica-append bytes in flight to one follower, across its segments:
    /// what a slow follower can cost the primary's memory.
    pub replica_inflight_bytes_max: usize,
    /// Replica-appends one segment's primary keeps in flight to one
    /// follower at once (1 ships the next only after the last is answered);
    /// the follower writes them in offset order (ADR 0099).
    pub replica_pipeline_depth_max: usize,
    /// Replication-level group commit (off at 0, the default): a primary
    /// holds a follower's next replica-append up to this long, or until
    /// `replica_group_commit_records` records wait, so the follower fsyncs
    /// fewer, larger runs. It pays only when many producers share hot ranges
    /// on an fsync-bound disk (`docs/guides/clustering.md` has the rule).
    pub replica_group_commit_ms: u64,
    /// The record count that sends a held replica-append at once.
    pub replica_group_commit_records: u64,
    /// Copies of a topic's segments when `create_topic` names none: this,
    /// or fewer when fewer brokers are configured in `[cluster] nodes` or live.
    pub default_replication_factor: u8,
    /// The broker attribute replicas are spread over (distinct values first).
    pub placement_attribute: String,
    /// How long an ordered shutdown may take before the tree is stopped anyway.
    pub shutdown_timeout_ms: u64,
    /// A cursor HMAC secret from before cluster-wide keys (ADR 0096): read,
    /// if it exists, and proposed as the cluster's cursor key 0 at
    /// bootstrap; never written. `data_dir/cluster.secret` if unset.
    pub cursor_secret_file: Option<PathBuf>,
    /// Which metadata plane to run.
    pub metadata_backend: MetadataBackend,
    /// Client addresses (host:port) of brokers to join through.
    pub seeds: Vec<String>,
    /// Operator-given attributes (zone, rack, ...), gossiped to every broker.
    pub attributes: BTreeMap<String, String>,
    /// SWIM timers and the node fabric.
    pub membership: MembershipSettings,
    /// The metadata cluster (vnodes, voters, the raft port).
    pub cluster: ClusterSettings,
    /// The upkeep of the data on disk: orphan sweeps (ADR 0115).
    pub maintenance: MaintenanceSettings,
    /// Automatic reshaping's defaults (ADR 0143).
    pub reshape: ReshapeDefaults,
    /// TLS on the client and admin ports (ADR 0149).
    pub tls: TlsSettings,
    /// Client authentication and authorization (ADR 0150).
    pub security: SecuritySettings,
}

/// How the client port authenticates its clients (ADR 0150).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Authentication {
    /// Every connection is served unauthenticated and nothing is checked
    /// (the default for now; issue 39 makes it refuse off loopback).
    #[default]
    None,
    /// SCRAM-SHA-256 logins (api keys 400, 401) and ACLs that deny by default.
    Scram,
}

/// `[security]`: client authentication, superusers and the lockout
/// (ADR 0146, 0150).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecuritySettings {
    /// `none` or `scram`.
    pub authentication: Authentication,
    /// Principals (`User:name`) that bypass the ACL entries.
    pub superusers: Vec<String>,
    /// The PBKDF2 iteration count unknown users are answered with, and
    /// the count the bootstrap user gets. Credentials the CLI creates use
    /// the same default: keep them equal, or an unknown user's answer
    /// differs from a real one's (ADR 0146).
    pub scram_iterations: u32,
    /// The oldest users-and-ACLs view a request is authorized against,
    /// at most 1,000 ms (ADR 0148).
    pub auth_view_max_age_ms: u64,
    /// The delay after a principal's first failed login from one source;
    /// it doubles per failure.
    pub lockout_delay_first_ms: u64,
    /// The longest such delay.
    pub lockout_delay_max_ms: u64,
    /// After this many failures the pair is locked (0: never).
    pub lockout_after_failures: u32,
    /// How long a lock lasts unless an admin unlocks the user first.
    pub lockout_ms: u64,
    /// Failures quiet for this long are forgotten.
    pub lockout_forget_after_ms: u64,
    /// A user the broker creates at start if it does not exist yet (the
    /// first administrator), with the password in `bootstrap_password_file`.
    pub bootstrap_user: Option<String>,
    /// The file holding `bootstrap_user`'s password (its first line).
    pub bootstrap_password_file: Option<PathBuf>,
    /// The JWS algorithms bearer tokens may be signed with (ADR 0152):
    /// `EdDSA` (the default), `ES256`, `ES384`, `RS256`, `RS384`,
    /// `RS512`, `PS256`, `PS384`, `PS512`. Never `none` or HMAC.
    pub token_algorithms: Vec<String>,
    /// How far a token's `exp` and `nbf` may be off the broker's clock,
    /// at most 300,000 ms.
    pub token_clock_skew_ms: u64,
    /// If set, a token's `aud` must be present and name it.
    pub token_audience: Option<String>,
    /// Accept listening off loopback without client authentication (the
    /// client port's or the admin port's).
    /// Without it such a broker refuses to start, naming the risk.
    pub insecure: bool,
}

impl Default for SecuritySettings {
    fn default() -> Self {
        let lockout = malachi_core::auth::lockout::LockoutPolicy::default();
        SecuritySettings {
            authentication: Authentication::None,
            superusers: Vec::new(),
            scram_iterations: malachi_core::auth::scram::ITERATIONS_DEFAULT,
            auth_view_max_age_ms: 1_000,
            lockout_delay_first_ms: lockout.delay_first_ms,
            lockout_delay_max_ms: lockout.delay_max_ms,
            lockout_after_failures: lockout.lock_after_failures.unwrap_or(0),
            lockout_ms: lockout.lock_ms,
            lockout_forget_after_ms: lockout.forget_after_ms,
            bootstrap_user: None,
            bootstrap_password_file: None,
            token_algorithms: vec![TokenAlgorithm::EdDSA.name().to_owned()],
            token_clock_skew_ms: TOKEN_CLOCK_SKEW_MS_DEFAULT,
            token_audience: None,
            insecure: false,
        }
    }
}

/// The default `security.token_clock_skew_ms`: a minute, as common JWT
/// libraries allow.
pub const TOKEN_CLOCK_SKEW_MS_DEFAULT: u64 = 60_000;

/// The longest `security.auth_view_max_age_ms`: a change takes effect on
/// every broker within a second (issue 39, ADR 0148).
pub const AUTH_VIEW_MAX_AGE_MS_LIMIT: u64 = 1_000;

impl SecuritySettings {
    /// The lockout policy these settings describe.
    pub fn lockout_policy(&self) -> malachi_core::auth::lockout::LockoutPolicy {
        malachi_core::auth::lockout::LockoutPolicy {
            delay_first_ms: self.lockout_delay_first_ms,
            delay_max_ms: self.lockout_delay_max_ms,
            lock_after_failures: (self.lockout_after_failures > 0)
                .then_some(self.lockout_after_failures),
            lock_ms: self.lockout_ms,
            forget_after_ms: self.lockout_forget_after_ms,
            ..malachi_core::auth::lockout::LockoutPolicy::default()
        }
    }

    /// How bearer tokens are judged (ADR 0152).
    pub fn token_policy(&self) -> Result<TokenPolicy, BrokerError> {
        let bad = |reason: String| BrokerError::Config { reason };
        let mut algorithms = Vec::new();
        for name in &self.token_algorithms {
            let Some(algorithm) = TokenAlgorithm::from_name(name) else {
                return Err(bad(format!(
                    "security.token_algorithms: {name:?} is not an accepted algorithm (none and HMAC never are); use EdDSA, ES256, ES384, RS256, RS384, RS512, PS256, PS384 or PS512"
                )));
            };
            if !algorithms.contains(&algorithm) {
                algorithms.push(algorithm);
            }
        }
        if algorithms.is_empty() {
            return Err(bad(
                "security.token_algorithms must name at least one algorithm".into(),
            ));
        }
        if self.token_clock_skew_ms > CLOCK_SKEW_MS_MAX {
            return Err(bad(format!(
                "security.token_clock_skew_ms must be at most {CLOCK_SKEW_MS_MAX}"
            )));
        }
        if let Some(audience) = &self.token_audience
            && (audience.is_empty() || audience.len() > AUDIENCE_BYTES_MAX)
        {
            return Err(bad(format!(
                "security.token_audience must be 1 to {AUDIENCE_BYTES_MAX} bytes"
            )));
        }
        Ok(TokenPolicy {
            algorithms,
            clock_skew_ms: self.token_clock_skew_ms,
            audience: self.token_audience.clone(),
        })
    }

    /// The superusers, parsed.
    pub fn superuser_principals(
        &self,
    ) -> Result<Vec<malachi_core::auth::acl::Principal>, BrokerError> {
        self.superusers
            .iter()
            .map(|text| {
                malachi_core::auth::acl::Principal::parse(text).map_err(|e| BrokerError::Config {
                    reason: format!("security.superusers: {text:?}: {e}"),
                })
            })
            .collect()
    }

    fn validate(&self, backend: MetadataBackend) -> Result<(), BrokerError> {
        let bad = |reason: String| Err(BrokerError::Config { reason });
        self.superuser_principals()?;
        self.token_policy()?;
        if self.authentication == Authentication::Scram && backend != MetadataBackend::Raft {
            return bad("security.authentication = \"scram\" needs metadata_backend = \"raft\": users and ACLs live in the ring's raft group".into());
        }
        if let Err(e) = malachi_core::auth::scram::check_iterations(self.scram_iterations) {
            return bad(format!("security.scram_iterations: {e}"));
        }
        if self.auth_view_max_age_ms == 0 || self.auth_view_max_age_ms > AUTH_VIEW_MAX_AGE_MS_LIMIT
        {
            return bad(format!(
                "security.auth_view_max_age_ms must be between 1 and {AUTH_VIEW_MAX_AGE_MS_LIMIT}"
            ));
        }
        if self.lockout_delay_first_ms == 0
            || self.lockout_delay_max_ms < self.lockout_delay_first_ms
            || self.lockout_delay_max_ms > u64::from(u32::MAX)
            || self.lockout_ms > u64::from(u32::MAX)
            || self.lockout_forget_after_ms == 0
        {
            return bad("security.lockout_delay_first_ms and lockout_forget_after_ms must be positive, lockout_delay_max_ms at least lockout_delay_first_ms, and lockout_delay_max_ms and lockout_ms below 2^32".into());
        }
        if self.bootstrap_user.is_some() != self.bootstrap_password_file.is_some() {
            return bad(
                "security.bootstrap_user and security.bootstrap_password_file go together".into(),
            );
        }
        if let Some(name) = &self.bootstrap_user
            && let Err(e) = malachi_core::model::validate_user_name(name)
        {
            return bad(format!("security.bootstrap_user: {e}"));
        }
        Ok(())
    }
}

/// Bounds of one range's idempotent-producer table (ADR 0092).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProducerLimits {
    /// Producers whose own stream a range remembers; the least recently
    /// seen is forgotten first.
    pub producers_max: usize,
    /// A producer not seen for this long is forgotten.
    pub idle_expiry_ms: u64,
}

impl BrokerConfig {
    /// The bounds of each range's producer table.
    pub(crate) fn producer_limits(&self) -> ProducerLimits {
        ProducerLimits {
            producers_max: self.producers_per_range_max,
            idle_expiry_ms: self.producer_idle_expiry_ms,
        }
    }
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            node_id: 1,
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 4040)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_connections_max: 64,
            admin_address_connections_max: 16,
            admin_read_timeout_ms: 10_000,
            admin_probe_connections_max: 16,
            admin_probe_timeout_ms: 1_000,
            data_dir: PathBuf::from("data"),
            segment_bytes_max: 256 << 20,
            segment_age_ms: 60 * 60 * 1000,
            store: StoreSettings::default(),
            frame_bytes_max: malachi_wire::frame::FRAME_BYTES_MAX_DEFAULT,
            record_value_bytes_max: 1 << 20,
            connection_inflight_max: 64,
            segment_inflight_max: 256,
            connections_max: 1024,
            address_connections_max: 256,
            frame_read_timeout_ms: 30_000,
            idle_timeout_ms: 10 * 60 * 1000,
            admission_timeout_ms: 10_000,
            request_bytes_budget: 512 << 20,
            response_bytes_budget: 512 << 20,
            connection_request_bytes_max: 64 << 20,
            connection_response_bytes_max: 64 << 20,
            address_request_bytes_max: 128 << 20,
            address_response_bytes_max: 128 << 20,
            response_write_timeout_ms: 30_000,
            produce_timeout_ms: 10_000,
            producers_per_range_max: 1024,
            producer_idle_expiry_ms: 24 * 60 * 60 * 1000,
            fetch_wait_ms_max: u64::from(malachi_wire::limits::FETCH_WAIT_MS_MAX),
            replica_ack_timeout_ms: 5_000,
            replica_append_bytes_max: 1 << 20,
            replica_inflight_bytes_max: 16 << 20,
            replica_pipeline_depth_max: 8,
            replica_group_commit_ms: 0,
            replica_group_commit_records: 20_000,
            default_replication_factor: 3,
            placement_attribute: "zone".to_owned(),
            shutdown_timeout_ms: 10_000,
            cursor_secret_file: None,
            metadata_backend: MetadataBackend::Raft,
            seeds: Vec::new(),
            attributes: BTreeMap::new(),
            membership: MembershipSettings::default(),
            cluster: ClusterSettings::default(),
            maintenance: MaintenanceSettings::default(),
            reshape: ReshapeDefaults::default(),
            tls: TlsSettings::default(),
            security: SecuritySettings::default(),
        }
    }
}

impl BrokerConfig {
    /// A configuration for tests: ports 0 on loopback, the given data dir.
    pub fn for_tests(data_dir: impl Into<PathBuf>) -> BrokerConfig {
        BrokerConfig {
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: data_dir.into(),
            store: StoreSettings {
                flush_interval_ms: 1,
                sync_threads: 2,
                ..StoreSettings::default()
            },
            shutdown_timeout_ms: 5_000,
            membership: MembershipSettings {
                probe_period_ms: 100,
                probe_rtt_ms: 40,
                suspect_timeout_ms: 600,
                seed_retry_ms: 100,
                remote_call_timeout_ms: 2_000,
                ..MembershipSettings::default()
            },
            ..BrokerConfig::default()
        }
    }

    /// Refuses a configuration the broker cannot serve safely, with a message
    /// that names the field.
    pub fn validate(&self) -> Result<(), BrokerError> {
        self.validate_identity()?;
        self.validate_limits()?;
        self.validate_budgets()?;
        self.validate_membership()?;
        self.validate_cluster()?;
        self.validate_intervals()?;
        self.validate_reach()?;
        self.tls
            .check()
            .map_err(|reason| BrokerError::Config { reason })?;
        self.validate_codecs()?;
        self.security.validate(self.metadata_backend)?;
        self.validate_exposure()
    }

    /// Secure by default where it matters (issue 39): off loopback, the
    /// development cookie is refused, and so is a client port or an admin
    /// port without authentication (with it, the admin port takes a token
    /// or a client certificate, ADR 0152), unless `security.insecure`
    /// accepts the risk.
    fn validate_exposure(&self) -> Result<(), BrokerError> {
        let bad = |reason: String| Err(BrokerError::Config { reason });
        let exposed = [
            ("listen_addr", Some(self.listen_addr)),
            ("admin_addr", Some(self.admin_addr)),
            (
                "membership.cluster_listen_addr",
                self.membership.cluster_listen_addr,
            ),
            ("cluster.raft_listen_addr", self.cluster.raft_listen_addr),
        ];
        let off_loopback = exposed
            .iter()
            .find(|(_, addr)| addr.is_some_and(|a| !a.ip().is_loopback()));
        let Some((field, Some(addr))) = off_loopback else {
            return Ok(());
        };
        if self.membership.cluster_cookie.is_none() {
            return bad(format!(
                "{field} {addr} is not a loopback address and membership.cluster_cookie is unset: the development cookie is public, so anyone could join the cluster's node fabric; set membership.cluster_cookie to a secret shared by the brokers"
            ));
        }
        if self.security.insecure {
            return Ok(());
        }
        if self.security.authentication == Authentication::None
            && !self.listen_addr.ip().is_loopback()
        {
            return bad(format!(
                "listen_addr {} is not a loopback address and security.authentication = \"none\": anyone who reaches it may read, write and delete every topic; set security.authentication = \"scram\", or security.insecure = true to accept the risk",
                self.listen_addr
            ));
        }
        if self.security.authentication == Authentication::None
            && !self.admin_addr.ip().is_loopback()
        {
            return bad(format!(
                "admin_addr {} is not a loopback address and security.authentication = \"none\": anyone who reaches the admin port may admit and decommission brokers; set security.authentication = \"scram\" (the admin port then takes a token or a client certificate), bind it to loopback, or set security.insecure = true to accept the risk",
                self.admin_addr
            ));
        }
        let mode = self.tls.cluster_mode();
        if mode.allows_plaintext() {
            return bad(format!(
                "{field} {addr} is not a loopback address and tls.cluster = \"{}\": brokers would send (or take) raft, replication and fabric traffic in cleartext, authenticated only by the cookie; configure [tls] with a certificate and tls.cluster_ca_path and tls.cluster = \"required\", or security.insecure = true to accept the risk (as for the steps of a rolling move, ADR 0162)",
                mode.name()
            ));
        }
        Ok(())
    }

    /// Who this broker is and where it keeps its data.
    fn validate_identity(&self) -> Result<(), BrokerError> {
        let bad = |reason: String| Err(BrokerError::Config { reason });
        if self.node_id == 0 {
            return bad("node_id must be positive".into());
        }
        if self.data_dir.as_os_str().is_empty() {
            return bad("data_dir must be set".into());
        }
        Ok(())
    }

    /// Segments, frames, records, in-flight windows and replication.
    fn validate_limits(&self) -> Result<(), BrokerError> {
        let bad = |reason: String| Err(BrokerError::Config { reason });
        if self.segment_bytes_max == 0 || self.segment_age_ms == 0 {
            return bad("segment_bytes_max and segment_age_ms must be positive".into());
        }
        let frame_min = malachi_wire::frame::REQUEST_HEADER_BYTES + 1024;
        if self.frame_bytes_max < frame_min || self.frame_bytes_max > (256 << 20) {
            return bad(format!(
                "frame_bytes_max must be between {frame_min} and {} bytes",
                256 << 20
            ));
        }
        if self.record_value_bytes_max == 0
            || self.record_value_bytes_max > RECORD_VALUE_BYTES_MAX_LIMIT
        {
            return bad(format!(
                "record_value_bytes_max must be between 1 and {RECORD_VALUE_BYTES_MAX_LIMIT}"
            ));
        }
        if self.connection_inflight_max == 0
            || self.segment_inflight_max == 0
            || self.connections_max == 0
        {
            return bad(
                "connection_inflight_max, segment_inflight_max and connections_max must be positive"
                    .into(),
            );
        }
        if self.producers_per_range_max == 0 || self.producer_idle_expiry_ms == 0 {
            return bad(
                "producers_per_range_max and producer_idle_expiry_ms must be positive".into(),
            );
        }
        if self.replica_ack_timeout_ms == 0
            || self.replica_append_bytes_max == 0
            || self.replica_inflight_bytes_max < self.replica_append_bytes_max
            || self.default_replication_factor == 0
            || self.replica_group_commit_records == 0
        {
            return bad("replica_ack_timeout_ms, replica_append_bytes_max, replica_group_commit_records and default_replication_factor must be positive, and replica_inflight_bytes_max at least replica_append_bytes_max".into());
        }
        if self.replica_pipeline_depth_max == 0
            || self.replica_pipeline_depth_max > REPLICA_PIPELINE_DEPTH_LIMIT
        {
            return bad(format!(
                "replica_pipeline_depth_max ({}) must be between 1 and {REPLICA_PIPELINE_DEPTH_LIMIT}: a follower holds at most that many early appends of one segment",
                self.replica_pipeline_depth_max
            ));
        }
        if self.replica_group_commit_ms >= self.replica_ack_timeout_ms {
            return bad(format!(
                "replica_group_commit_ms ({}) must be below replica_ack_timeout_ms ({}): a held append would time every produce out",
                self.replica_group_commit_ms, self.replica_ack_timeout_ms
            ));
        }
        if self.produce_timeout_ms == 0 || self.shutdown_timeout_ms == 0 {
            return bad("produce_timeout_ms and shutdown_timeout_ms must be positive".into());
        }
        if self.frame_read_timeout_ms == 0
            || self.idle_timeout_ms == 0
            || self.admission_timeout_ms == 0
            || self.response_write_timeout_ms == 0
        {
            return bad(
                "frame_read_timeout_ms, idle_timeout_ms, admission_timeout_ms and response_write_timeout_ms must be positive"
                    .into(),
            );
        }
        if self.address_connections_max == 0 {
            return bad("address_connections_max must be positive".into());
        }
        Ok(())
    }

    /// The client port's per-connection caps and broker-wide budgets.
    fn validate_budgets(&self) -> Result<(), BrokerError> {
        let bad = |reason: String| Err(BrokerError::Config { reason });
        // A connection must be able to hold one whole frame each way, and
        // the broker one connection's worth, or a frame could never be read.
        for (field, cap, budget_field, budget) in [
            (
                "connection_request_bytes_max",
                self.connection_request_bytes_max,
                "request_bytes_budget",
                self.request_bytes_budget,
            ),
            (
                "connection_response_bytes_max",
                self.connection_response_bytes_max,
                "response_bytes_budget",
                self.response_bytes_budget,
            ),
        ] {
            if cap < self.frame_bytes_max {
                return bad(format!("{field} must be at least frame_bytes_max"));
            }
            if budget < cap {
                return bad(format!("{budget_field} must be at least {field}"));
            }
            if budget > (1 << 40) {
                return bad(format!("{budget_field} must be at most 1 TiB"));
            }
        }
        for (field, share) in [
            ("address_request_bytes_max", self.address_request_bytes_max),
            (
                "address_response_bytes_max",
                self.address_response_bytes_max,
            ),
        ] {
            if share < self.frame_bytes_max || share > (1 << 40) {
                return bad(format!(
                    "{field} must be at least frame_bytes_max and at most 1 TiB"
                ));
            }
        }
        Ok(())
    }

    /// SWIM, the admin port, the node fabric, the cookie and the seeds.
    fn validate_membership(&self) -> Result<(), BrokerError> {
        let bad = |reason: String| Err(BrokerError::Config { reason });
        self.membership
            .swim()
            .validate()
            .map_err(|e| BrokerError::Config {
                reason: e.to_string(),
            })?;
        if self.membership.remote_call_timeout_ms == 0 {
            return bad("membership.remote_call_timeout_ms must be positive".into());
        }
        if self.admin_connections_max == 0
            || self.admin_address_connections_max == 0
            || self.admin_read_timeout_ms == 0
            || self.admin_probe_connections_max == 0
            || self.admin_probe_timeout_ms == 0
        {
            return bad(
                "admin_connections_max, admin_address_connections_max, admin_read_timeout_ms, admin_probe_connections_max and admin_probe_timeout_ms must be positive"
                    .into(),
            );
        }
        if self.membership.fabric_connections_max == 0
            || self.membership.fabric_handshake_timeout_ms == 0
        {
            return bad(
                "membership.fabric_connections_max and membership.fabric_handshake_timeout_ms must be positive"
                    .into(),
            );
        }
        if self
            .membership
            .cluster_cookie
            .as_ref()
            .is_some_and(|c| c.is_empty())
        {
            return bad("membership.cluster_cookie must not be empty".into());
        }
        if self.seeds.len() > SEEDS_MAX {
            return bad(format!("at most {SEEDS_MAX} seeds"));
        }
        for seed in &self.seeds {
            let valid = seed
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !valid {
                return bad(format!("seed {seed:?} is not host:port"));
            }
        }
        if !self.seeds.is_empty()
            && self.listen_addr.ip().is_unspecified()
            && self.membership.advertise_ip.is_none()
        {
            return bad(
                "listen_addr is unspecified (0.0.0.0 or ::): set membership.advertise_ip so other brokers can reach this one"
                    .into(),
            );
        }
        Ok(())
    }

    /// How the cluster is formed: its nodes, bootstrap and attributes.
    fn validate_cluster(&self) -> Result<(), BrokerError> {
        let bad = |reason: String| Err(BrokerError::Config { reason });
        let nodes = self.cluster_nodes();
        if nodes.len() > CLUSTER_NODES_MAX {
            return bad(format!(
                "cluster.nodes lists at most {CLUSTER_NODES_MAX} brokers"
            ));
        }
        if nodes.contains(&0) {
            return bad("cluster.nodes must hold positive node ids".into());
        }
        if let Some(expect) = self.cluster.bootstrap_expect {
            if expect == 0 || expect as usize > CLUSTER_NODES_MAX {
                return bad(format!(
                    "cluster.bootstrap_expect must be between 1 and {CLUSTER_NODES_MAX}"
                ));
            }
            if !self.cluster.nodes.is_empty() {
                return bad(
                    "set either cluster.nodes (a fixed list) or cluster.bootstrap_expect (formed from seeds), not both"
                        .into(),
                );
            }
            if expect > 1 && self.seeds.is_empty() {
                return bad(format!(
                    "cluster.bootstrap_expect = {expect} needs seeds: the other brokers' client addresses"
                ));
            }
        }
        if let Some(key) = self
            .attributes
            .keys()
            .find(|k| k.starts_with(malachi_core::formation::RESERVED_ATTRIBUTE_PREFIX))
        {
            return bad(format!(
                "attribute {key:?}: keys starting with {:?} are reserved for the broker itself",
                malachi_core::formation::RESERVED_ATTRIBUTE_PREFIX
            ));
        }
        if !self.cluster.nodes.is_empty() && !self.cluster.nodes.contains(&self.node_id) {
            return bad(format!(
                "cluster.nodes {:?} must include this broker's node_id {}",
                self.cluster.nodes, self.node_id
            ));
        }
        Ok(())
    }

    /// How peers' cluster ports are judged (ADR 0155).
    fn validate_reach(&self) -> Result<(), BrokerError> {
        let bad = |reason: String| Err(BrokerError::Config { reason });
        let after = self.cluster.peer_unreachable_after_ms;
        if !(PEER_UNREACHABLE_AFTER_MS_MIN..=PEER_UNREACHABLE_AFTER_MS_MAX).contains(&after) {
            return bad(format!(
                "cluster.peer_unreachable_after_ms must be between {PEER_UNREACHABLE_AFTER_MS_MIN} and {PEER_UNREACHABLE_AFTER_MS_MAX} ms: shorter, one slow dial would leave a broker out"
            ));
        }
        if self.cluster.peer_reachable_hold_ms > PEER_REACHABLE_HOLD_MS_MAX {
            return bad(format!(
                "cluster.peer_reachable_hold_ms must be at most {PEER_REACHABLE_HOLD_MS_MAX} ms"
            ));
        }
        Ok(())
    }

    /// The ring, replicas, maintenance intervals, leases and the backend.
    fn validate_intervals(&self) -> Result<(), BrokerError> {
        let bad = |reason: String| Err(BrokerError::Config { reason });
        let vnodes = self.vnode_count();
        if vnodes == 0 || vnodes > malachi_core::ring::VNODES_MAX {
            return bad(format!(
                "cluster.vnodes must be between 1 and {}",
                malachi_core::ring::VNODES_MAX
            ));
        }
        if self.cluster.replicas_per_vnode == 0 {
            return bad("cluster.replicas_per_vnode must be positive".into());
        }
        if self.cluster.replace_after_ms < REPLACE_AFTER_MS_MIN {
            return bad(format!(
                "cluster.replace_after_ms must be at least {REPLACE_AFTER_MS_MIN} ms: a broker down for less is restarting, not gone"
            ));
        }
        if self.cluster.scrub_interval_ms < SCRUB_INTERVAL_MS_MIN {
            return bad(format!(
                "cluster.scrub_interval_ms must be at least {SCRUB_INTERVAL_MS_MIN} ms"
            ));
        }
        if let Err(reason) = self.reshape.check() {
            return bad(reason);
        }
        if self.maintenance.orphan_sweep_ms < ORPHAN_SWEEP_MS_MIN {
            return bad(format!(
                "maintenance.orphan_sweep_ms must be at least {ORPHAN_SWEEP_MS_MIN} ms: each pass asks every vnode"
            ));
        }
        let balance = self.maintenance.balance_interval_ms;
        if balance != 0 && balance < BALANCE_INTERVAL_MS_MIN {
            return bad(format!(
                "maintenance.balance_interval_ms must be 0 (off) or at least {BALANCE_INTERVAL_MS_MIN} ms"
            ));
        }
        if self.maintenance.retention_sweep_ms < RETENTION_SWEEP_MS_MIN {
            return bad(format!(
                "maintenance.retention_sweep_ms must be at least {RETENTION_SWEEP_MS_MIN} ms"
            ));
        }
        if self.cluster.join_timeout_ms == 0 {
            return bad("cluster.join_timeout_ms must be positive".into());
        }
        if self.cluster.coordinator_poll_ms == 0 || self.cluster.forward_timeout_ms == 0 {
            return bad(
                "cluster.coordinator_poll_ms and cluster.forward_timeout_ms must be positive"
                    .into(),
            );
        }
        if let Err(e) = malachi_cluster::vnodes::lease::LeaseKeeper::new(
            self.cluster.lease_config(self.node_id),
        ) {
            return bad(format!(
                "cluster.lease_duration_ms, lease_margin_ms and lease_renew_ms: {e}"
            ));
        }
        if self.cluster_nodes().len() > 1 && self.metadata_backend == MetadataBackend::File {
            return bad(
                "metadata_backend = \"file\" serves a lone broker only; cluster.nodes lists several"
                    .into(),
            );
        }
        Ok(())
    }

    /// What the identity codec and the store can encode.
    fn validate_codecs(&self) -> Result<(), BrokerError> {
        // The identity codec's bounds: refuse at start what could not be gossiped.
        let probe = malachi_membership::NodeIdentity {
            node_id: self.node_id,
            incarnation: 0,
            client_addr: self.listen_addr,
            admin_addr: Some(self.admin_addr),
            raft_addr: None,
            cluster_addr: Some(self.listen_addr),
            attributes: self.attributes.clone(),
        };
        probe.validate().map_err(|e| BrokerError::Config {
            reason: format!("attributes: {e}"),
        })?;
        self.store_config()
            .validate()
            .map_err(|e| BrokerError::Config {
                reason: format!("store: {e}"),
            })?;
        Ok(())
    }

    /// The storage configuration this broker opens its store with.
    pub fn store_config(&self) -> StoreConfig {
        let record_bytes_max = self.record_value_bytes_max + RECORD_OVERHEAD_BYTES;
        StoreConfig {
            flush_interval_ms: self.store.flush_interval_ms,
            sync_threads: self.store.sync_threads,
            direct_io: self.store.direct_io,
            record_bytes_max,
            pending_bytes_max: self
                .store
                .pending_bytes_max
                .max(2 * record_bytes_max + malachi_storage::frame::FRAME_HEADER_BYTES),
            recent_bytes_max: self.store.recent_bytes_max,
            ..StoreConfig::default()
        }
    }

    /// When segments roll.
    pub fn seal_policy(&self) -> SealPolicy {
        SealPolicy {
            segment_bytes_max: self.segment_bytes_max,
            segment_age_ms: self.segment_age_ms,
        }
    }

    /// The brokers of the metadata cluster, sorted and without repeats: this
    /// broker alone when `cluster.nodes` is empty.
    pub fn cluster_nodes(&self) -> Vec<u64> {
        let mut nodes = if self.cluster.nodes.is_empty() {
            vec![self.node_id]
        } else {
            self.cluster.nodes.clone()
        };
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    /// How many brokers form the cluster from seeds (0: not bootstrapping).
    pub fn bootstrap_expect(&self) -> u32 {
        self.cluster.bootstrap_expect.unwrap_or(0)
    }

    /// The ring's shape this configuration asks for.
    pub fn shape(&self) -> malachi_core::formation::Shape {
        malachi_core::formation::Shape {
            vnodes: self.vnode_count(),
            replicas_per_vnode: self.cluster.replicas_per_vnode,
        }
    }

    /// The vnode count of the ring (ADR 0081: 16 for a cluster, 1 alone).
    pub fn vnode_count(&self) -> u32 {
        self.cluster.vnodes.unwrap_or(
            if self.cluster_nodes().len() > 1 || self.bootstrap_expect() > 1 {
                malachi_core::ring::VNODES_DEFAULT
            } else {
                1
            },
        )
    }

    /// Where this broker's last membership incarnation is kept.
    pub fn incarnation_path(&self) -> PathBuf {
        self.data_dir.join("membership.incarnation")
    }

    /// Where a pre-ADR 0096 cursor secret would be.
    pub fn secret_path(&self) -> PathBuf {
        self.cursor_secret_file
            .clone()
            .unwrap_or_else(|| self.data_dir.join("cluster.secret"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_keeps_the_memory_the_config_gives_its_flushed_frames() {
        let mut config = BrokerConfig::default();
        assert_eq!(config.store_config().recent_bytes_max, 64 << 20);
        config.store = serde_json::from_str(r#"{"recent_bytes_max": 0}"#).unwrap();
        assert_eq!(config.store_config().recent_bytes_max, 0);
    }

    #[test]
    fn token_settings_are_checked_at_start() {
        let mut config = BrokerConfig::default();
        assert_eq!(
            config.security.token_policy().unwrap().algorithms,
            vec![TokenAlgorithm::EdDSA]
        );
        for bad in ["HS256", "none", "eddsa"] {
            config.security.token_algorithms = vec![bad.into()];
            let refused = config.validate().unwrap_err().to_string();
            assert!(refused.contains("token_algorithms"), "{bad}: {refused}");
        }
        config.security.token_algorithms = Vec::new();
        assert!(config.validate().is_err());
        config.security.token_algorithms = vec!["RS256".into(), "ES256".into()];
        assert!(config.validate().is_ok());
        config.security.token_clock_skew_ms = CLOCK_SKEW_MS_MAX + 1;
        let refused = config.validate().unwrap_err().to_string();
        assert!(refused.contains("token_clock_skew_ms"), "{refused}");
    }

    #[test]
    fn node_identity_needs_tls_between_brokers() {
        let mut config = BrokerConfig::default();
        config.tls.cluster_node_identity = NodeIdentity::Required;
        let refused = config.validate().unwrap_err().to_string();
        assert!(refused.contains("cluster_node_identity"), "{refused}");
        config.tls.cluster_node_identity = NodeIdentity::Off;
        assert!(config.validate().is_ok());
    }

    #[test]
    fn the_peer_reach_bounds_are_checked_at_start() {
        let mut config = BrokerConfig::default();
        assert_eq!(
            config.cluster.reach(),
            malachi_cluster::group::ReachSettings::default()
        );
        for bad in [
            0,
            PEER_UNREACHABLE_AFTER_MS_MIN - 1,
            PEER_UNREACHABLE_AFTER_MS_MAX + 1,
        ] {
            config.cluster.peer_unreachable_after_ms = bad;
            let refused = config.validate().unwrap_err().to_string();
            assert!(
                refused.contains("peer_unreachable_after_ms"),
                "{bad}: {refused}"
            );
        }
        config.cluster.peer_unreachable_after_ms = PEER_UNREACHABLE_AFTER_MS_MIN;
        config.cluster.peer_reachable_hold_ms = PEER_REACHABLE_HOLD_MS_MAX + 1;
        let refused = config.validate().unwrap_err().to_string();
        assert!(refused.contains("peer_reachable_hold_ms"), "{refused}");
        config.cluster.peer_reachable_hold_ms = 0;
        assert!(config.validate().is_ok());
    }

    #[test]
    fn off_loopback_a_broker_needs_a_cookie_and_authentication() {
        let exposed = |listen: &str, admin: &str| BrokerConfig {
            listen_addr: listen.parse().unwrap(),
            admin_addr: admin.parse().unwrap(),
            ..BrokerConfig::default()
        };
        // On loopback (127.0.0.0/8), nothing is asked.
        assert!(
            exposed("127.0.0.2:4040", "127.0.0.1:8080")
                .validate()
                .is_ok()
        );
        let mut config = exposed("0.0.0.0:4040", "127.0.0.1:8080");
        let refused = config.validate().unwrap_err().to_string();
        assert!(refused.contains("cluster_cookie"), "{refused}");
        config.membership.cluster_cookie = Some("a secret".into());
        let refused = config.validate().unwrap_err().to_string();
        assert!(
            refused.contains("authentication") && refused.contains("security.insecure"),
            "{refused}"
        );
        config.security.authentication = Authentication::Scram;
        // Brokers off loopback speak TLS to each other (ADR 0151).
        let refused = config.validate().unwrap_err().to_string();
        assert!(
            refused.contains("tls.cluster") && refused.contains("security.insecure"),
            "{refused}"
        );
        config.tls = TlsSettings {
            cert_path: Some("/etc/malachi/node.pem".into()),
            key_path: Some("/etc/malachi/node.key".into()),
            cluster_ca_path: Some("/etc/malachi/cluster-ca.pem".into()),
            ..TlsSettings::default()
        };
        assert!(config.validate().is_ok());
        // The middle steps of a rolling move take plaintext peers, so off
        // loopback they need `security.insecure` as "off" does (ADR 0162).
        for step in [ClusterTls::Accept, ClusterTls::Send] {
            config.tls.cluster = Some(step);
            let refused = config.validate().unwrap_err().to_string();
            assert!(
                refused.contains(&format!("tls.cluster = \"{}\"", step.name()))
                    && refused.contains("security.insecure"),
                "{refused}"
            );
            config.security.insecure = true;
            assert!(config.validate().is_ok(), "{step:?}");
            config.security.insecure = false;
        }
        config.tls.cluster = None;
        // With authentication on, the admin port authenticates too (ADR
        // 0152): off loopback is fine.
        config.admin_addr = "10.0.0.1:8080".parse().unwrap();
        assert!(config.validate().is_ok());
        // Without it, an admin port off loopback is refused by itself.
        let mut config = exposed("127.0.0.1:4040", "10.0.0.1:8080");
        config.membership.cluster_cookie = Some("a secret".into());
        let refused = config.validate().unwrap_err().to_string();
        assert!(
            refused.contains("admin_addr") && refused.contains("security.insecure"),
            "{refused}"
        );
        config.security.insecure = true;
        assert!(config.validate().is_ok());
        config.membership.cluster_cookie = None;
        assert!(
            config.validate().is_err(),
            "insecure never accepts the public cookie"
        );
    }

    #[test]
    fn default_config_is_valid() {
        BrokerConfig::default().validate().unwrap();
        BrokerConfig::for_tests("/tmp/x").validate().unwrap();
    }

    #[test]
    fn a_half_tls_table_is_refused_with_its_fields() {
        let refused = |tls: TlsSettings| {
            let config = BrokerConfig {
                tls,
                ..BrokerConfig::default()
            };
            config.validate().unwrap_err().to_string()
        };
        let pair = TlsSettings {
            cert_path: Some("b.pem".into()),
            key_path: Some("b.key".into()),
            cluster_ca_path: Some("cluster-ca.pem".into()),
            ..TlsSettings::default()
        };
        let config = BrokerConfig {
            tls: pair.clone(),
            ..BrokerConfig::default()
        };
        config.validate().unwrap();
        insta::assert_snapshot!(refused(TlsSettings { key_path: None, ..pair.clone() }), @"invalid configuration: tls.cert_path and tls.key_path must be set together");
        insta::assert_snapshot!(refused(TlsSettings { client_auth: ClientAuth::Required, ..pair.clone() }), @r#"invalid configuration: tls.client_auth = "optional" or "required" needs tls.client_ca_path, and tls.client_ca_path needs one of them"#);
        insta::assert_snapshot!(refused(TlsSettings { client_ca_path: Some("ca.pem".into()), ..pair.clone() }), @r#"invalid configuration: tls.client_auth = "optional" or "required" needs tls.client_ca_path, and tls.client_ca_path needs one of them"#);
        insta::assert_snapshot!(refused(TlsSettings { client_ca_path: Some("ca.pem".into()), ..TlsSettings::default() }), @"invalid configuration: tls.client_ca_path and tls.client_auth need tls.cert_path and tls.key_path");
        insta::assert_snapshot!(refused(TlsSettings { handshake_timeout_ms: 0, ..pair.clone() }), @"invalid configuration: tls.handshake_timeout_ms and tls.reload_check_ms must be positive");
        // TLS between brokers (ADR 0151): on by default with a certificate,
        // so it needs a CA; off needs none.
        insta::assert_snapshot!(refused(TlsSettings { cluster_ca_path: None, ..pair.clone() }), @r#"invalid configuration: TLS between brokers (tls.cluster, "required" by default with a certificate) needs the CA every broker's certificate chains to: set tls.cluster_ca_path (or tls.client_ca_path), or tls.cluster = "off" for a broker that never has peers"#);
        let off = TlsSettings {
            cluster_ca_path: None,
            cluster: Some(ClusterTls::Off),
            ..pair.clone()
        };
        BrokerConfig {
            tls: off,
            ..BrokerConfig::default()
        }
        .validate()
        .unwrap();
        insta::assert_snapshot!(refused(TlsSettings { cluster: Some(ClusterTls::Required), ..TlsSettings::default() }), @r#"invalid configuration: tls.cluster = "required" needs a certificate: tls.cert_path and tls.key_path, or tls.cluster_cert_path and tls.cluster_key_path"#);
        insta::assert_snapshot!(refused(TlsSettings { cluster: Some(ClusterTls::Accept), ..TlsSettings::default() }), @r#"invalid configuration: tls.cluster = "accept" needs a certificate: tls.cert_path and tls.key_path, or tls.cluster_cert_path and tls.cluster_key_path"#);
        insta::assert_snapshot!(refused(TlsSettings { client_ports: ClientPortsTls::Accept, ..TlsSettings::default() }), @r#"invalid configuration: tls.client_ports = "accept" needs tls.cert_path and tls.key_path: without them the client and admin ports are plaintext only"#);
        insta::assert_snapshot!(refused(TlsSettings { cluster_cert_path: Some("c.pem".into()), ..pair.clone() }), @"invalid configuration: tls.cluster_cert_path and tls.cluster_key_path must be set together");
        insta::assert_snapshot!(refused(TlsSettings { cluster_server_name: Some("not a name!".into()), ..pair }), @r#"invalid configuration: tls.cluster_server_name "not a name!" is neither a DNS name nor an IP address"#);
    }

    #[test]
    fn zero_node_id_is_refused_with_its_field_name() {
        let config = BrokerConfig {
            node_id: 0,
            ..BrokerConfig::default()
        };
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("node_id"), "{err}");
    }

    #[test]
    fn a_replica_pipeline_depth_outside_1_to_64_is_refused_with_its_name() {
        for depth in [0, REPLICA_PIPELINE_DEPTH_LIMIT + 1] {
            let config = BrokerConfig {
                replica_pipeline_depth_max: depth,
                ..BrokerConfig::default()
            };
            let refused = config.validate().unwrap_err().to_string();
            assert!(refused.contains("replica_pipeline_depth_max"), "{refused}");
        }
        let config = BrokerConfig {
            replica_pipeline_depth_max: REPLICA_PIPELINE_DEPTH_LIMIT,
            ..BrokerConfig::default()
        };
        config.validate().unwrap();
    }

    #[test]
    fn a_bad_bootstrap_expect_or_a_reserved_attribute_is_refused_with_its_name() {
        let refused = |config: BrokerConfig| config.validate().unwrap_err().to_string();
        let with = |expect: u32, nodes: Vec<u64>, seeds: Vec<String>| BrokerConfig {
            seeds,
            cluster: ClusterSettings {
                bootstrap_expect: Some(expect),
                nodes,
                ..ClusterSettings::default()
            },
            ..BrokerConfig::for_tests("/tmp/x")
        };
        let seed = || vec!["127.0.0.1:4041".to_owned()];
        assert!(refused(with(0, vec![], seed())).contains("cluster.bootstrap_expect"));
        assert!(refused(with(100_000, vec![], seed())).contains("cluster.bootstrap_expect"));
        assert!(refused(with(3, vec![1, 2, 3], seed())).contains("not both"));
        assert!(refused(with(3, vec![], vec![])).contains("needs seeds"));
        with(3, vec![], seed()).validate().unwrap();
        with(1, vec![], vec![]).validate().unwrap();
        let reserved = BrokerConfig {
            attributes: [("malachi.cluster".to_owned(), "c:1".to_owned())].into(),
            ..BrokerConfig::for_tests("/tmp/x")
        };
        assert!(refused(reserved).contains("reserved"));
    }

    #[test]
    fn a_bad_seed_or_attribute_or_timer_is_refused_with_its_name() {
        let config = BrokerConfig {
            seeds: vec!["nowhere".into()],
            ..BrokerConfig::default()
        };
        assert!(config.validate().unwrap_err().to_string().contains("seed"));
        let config = BrokerConfig {
            attributes: [("".to_owned(), "x".to_owned())].into(),
            ..BrokerConfig::default()
        };
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("attribute")
        );
        let mut config = BrokerConfig::default();
        config.membership.probe_rtt_ms = config.membership.probe_period_ms;
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("probe_rtt_ms")
        );
    }

    #[test]
    fn a_cluster_that_leaves_this_broker_out_or_has_too_many_vnodes_is_refused() {
        let config = BrokerConfig {
            node_id: 4,
            cluster: ClusterSettings {
                nodes: vec![1, 2, 3],
                ..ClusterSettings::default()
            },
            ..BrokerConfig::default()
        };
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("cluster.nodes")
        );
        let config = BrokerConfig {
            cluster: ClusterSettings {
                vnodes: Some(4097),
                ..ClusterSettings::default()
            },
            ..BrokerConfig::default()
        };
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("cluster.vnodes")
        );
    }

    #[test]
    fn a_lone_broker_runs_one_vnode_and_a_cluster_sixteen() {
        let alone = BrokerConfig::default();
        assert_eq!(alone.cluster_nodes(), vec![1]);
        assert_eq!(alone.vnode_count(), 1);
        let three = BrokerConfig {
            cluster: ClusterSettings {
                nodes: vec![3, 1, 2, 1],
                ..ClusterSettings::default()
            },
            ..BrokerConfig::default()
        };
        assert_eq!(three.cluster_nodes(), vec![1, 2, 3]);
        assert_eq!(three.vnode_count(), 16);
    }

    #[test]
    fn an_oversized_value_limit_is_refused() {
        let config = BrokerConfig {
            record_value_bytes_max: RECORD_VALUE_BYTES_MAX_LIMIT + 1,
            ..BrokerConfig::default()
        };
        assert!(config.validate().is_err());
    }
}
