//! Starting, inspecting and stopping one broker.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use malachi_core::cursor::CursorKey;
use malachi_core::model::CursorSecret;
use malachi_membership::Membership;
use malachi_supervision::{
    Backoff, ChildKind, ChildSpec, Intensity, Strategy, Supervisor, SupervisorArgs, SupervisorRef,
    SupervisorSnapshot,
};
use ractor::Actor;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::admin::http::{AdminActor, AdminArgs};
use crate::common::clock::{Clock, SystemClock};
use crate::common::config::BrokerConfig;
use crate::common::error::BrokerError;
#[cfg(feature = "testing")]
use crate::common::error::HookError;
use crate::common::store_factory::StoreFactory;
use crate::control::coordinator::CoordinatorMsg;
use crate::control::manager::ManagerActor;
use crate::control::shared::{RaftEndpoint, Shared};
use crate::control::vnodes::VnodesActor;
use crate::fabric::formation::{FormArgs, Formed, Plan};
use crate::fabric::membership::{SwimActor, SwimArgs};
use crate::fabric::node::{Fabric, NodeActor, NodeArgs, node_server_spec};
use crate::maintenance;
use crate::serve::listener::{AcceptorActor, AcceptorArgs};

/// Bytes of OS randomness in a cursor secret this broker proposes.
const SECRET_BYTES: usize = 32;
/// How long an ordered shutdown waits for SWIM to tell the others it leaves.
const LEAVE_WAIT_MS: u64 = 500;

/// A membership handle for a broker whose fabric is missing, which
/// `Broker::start` rules out; kept total rather than panicking.
fn unreachable_membership() -> Membership {
    Membership::new(&malachi_membership::NodeIdentity::seed(SocketAddr::from((
        [127, 0, 0, 1],
        0,
    ))))
}

/// The broker's entry point.
#[derive(Debug)]
pub struct Broker;

/// A running broker: its addresses, its tree, and an ordered shutdown.
#[derive(Debug)]
pub struct BrokerHandle {
    shared: Arc<Shared>,
    root: SupervisorRef,
    join: Option<JoinHandle<()>>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> BrokerError + '_ {
    move |source| BrokerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The secret this broker proposes as the cluster's cursor key 0 at
/// bootstrap (ADR 0096): the per-broker secret file of a broker that ran
/// before cluster keys existed, so the cursors it minted stay valid, else
/// fresh OS randomness (this is the broker's only use of randomness).
/// Nothing is written: the cluster's keys live in the ring's group.
fn bootstrap_cursor_secret(path: &Path) -> Result<CursorSecret, BrokerError> {
    let secret = match std::fs::read(path) {
        Ok(bytes) => {
            info!(path = %path.display(), "proposing the existing cursor secret as the cluster's key 0");
            bytes
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = vec![0u8; SECRET_BYTES];
            getrandom::fill(&mut bytes).map_err(|e| BrokerError::Secret {
                path: path.to_path_buf(),
                reason: format!("no os randomness: {e}"),
            })?;
            bytes
        }
        Err(e) => return Err(io_err(path)(e)),
    };
    CursorKey::new(&secret).map_err(|e| BrokerError::Secret {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(CursorSecret::new(secret))
}

/// The file in a data dir naming the node it belongs to.
const NODE_FILE: &str = "NODE";

/// Refuses to start on a data dir written by another node: its raft logs,
/// votes and segment copies are that node's, and serving them under this
/// node's id would let one vote count twice. The first start records the
/// id; a data dir from before the file existed adopts this node's.
fn check_node_identity(config: &BrokerConfig) -> Result<(), BrokerError> {
    let path = config.data_dir.join(NODE_FILE);
    let wanted = format!("node_id = {}\n", config.node_id);
    match std::fs::read_to_string(&path) {
        Ok(recorded) if recorded == wanted => Ok(()),
        Ok(recorded) => {
            let owner = recorded
                .trim()
                .strip_prefix("node_id = ")
                .unwrap_or(recorded.trim());
            Err(BrokerError::Config {
                reason: format!(
                    "the data dir {} belongs to node {owner}, not node {}: start node {owner} on it, or give node {} a data dir of its own",
                    config.data_dir.display(),
                    config.node_id,
                    config.node_id
                ),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            write_durably(&path, wanted.as_bytes())?;
            Ok(())
        }
        Err(e) => Err(io_err(&path)(e)),
    }
}

/// Writes `bytes` to `path` through a synced temporary file and a rename,
/// and syncs the directory, so the file is either absent or whole.
fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), BrokerError> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    {
        let mut file = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
        file.write_all(bytes).map_err(io_err(&tmp))?;
        file.sync_all().map_err(io_err(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io_err(path))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(dir))?;
    }
    Ok(())
}

/// The address other brokers reach `bound` on: an unspecified ip (0.0.0.0,
/// ::) is replaced by the configured advertise ip, or loopback.
fn advertised(bound: SocketAddr, advertise_ip: Option<std::net::IpAddr>) -> SocketAddr {
    if bound.ip().is_unspecified() {
        let ip = advertise_ip.unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
        SocketAddr::new(ip, bound.port())
    } else {
        bound
    }
}

/// Membership and the node fabric: the SWIM socket on the client address's
/// own ip:port (UDP), the fabric's TCP port, and this broker's identity.
fn open_fabric(
    config: &BrokerConfig,
    swim_socket: std::net::UdpSocket,
    client_addr: SocketAddr,
    admin_addr: SocketAddr,
    raft_addr: SocketAddr,
    plan: &Plan,
) -> Result<Fabric, BrokerError> {
    let settings = &config.membership;
    let cluster_bind = settings
        .cluster_listen_addr
        .unwrap_or_else(|| SocketAddr::new(client_addr.ip(), 0));
    let cluster_listener = bind("node fabric port", cluster_bind)?;
    let cluster_bound = cluster_listener
        .local_addr()
        .map_err(|source| BrokerError::Bind {
            what: "node fabric port",
            addr: cluster_bind,
            source,
        })?;
    let identity = malachi_membership::NodeIdentity {
        node_id: config.node_id,
        incarnation: 0,
        client_addr: advertised(client_addr, settings.advertise_ip),
        admin_addr: Some(advertised(admin_addr, settings.advertise_ip)),
        raft_addr: Some(raft_addr),
        cluster_addr: Some(advertised(cluster_bound, settings.advertise_ip)),
        attributes: card_attributes(config, &plan.card(config.node_id)),
    };
    identity.validate().map_err(|e| BrokerError::Config {
        reason: format!("membership identity: {e}"),
    })?;
    let cookie = match &settings.cluster_cookie {
        Some(cookie) => cookie.clone(),
        None => {
            // Expected for a lone broker on loopback (nobody else can dial
            // it), so not a warning there; anywhere else it is one.
            let lone_on_loopback = config.seeds.is_empty()
                && plan.nodes.len() <= 1
                && !matches!(plan.mode, crate::fabric::formation::Mode::Bootstrap { .. })
                && config.listen_addr.ip().is_loopback();
            if lone_on_loopback {
                info!(
                    "no membership.cluster_cookie configured: the development cookie is used (set one before other brokers join)"
                );
            } else {
                warn!(
                    "no membership.cluster_cookie configured: brokers authenticate each other with the development cookie; set one outside development"
                );
            }
            crate::common::config::DEV_CLUSTER_COOKIE.to_owned()
        }
    };
    let membership = malachi_membership::Membership::new(&identity);
    let formed = Formed::new(
        plan,
        config.node_id,
        membership.clone(),
        config.attributes.clone(),
    );
    Ok(Fabric {
        membership,
        node_id: config.node_id,
        identity,
        cookie,
        swim_socket: Arc::new(swim_socket),
        cluster_listener,
        node_server: parking_lot::RwLock::new(None),
        swim_running: std::sync::atomic::AtomicBool::new(false),
        swim_task: parking_lot::Mutex::new(None),
        remote_call_timeout_ms: settings.remote_call_timeout_ms,
        inbound: crate::fabric::node::InboundConnections::new(
            settings.fabric_connections_max,
            settings.fabric_handshake_timeout_ms,
        ),
        formed: Arc::new(formed),
        calls: crate::fabric::remote::RemoteCalls::default(),
        tls: None,
    })
}

/// The operator's attributes plus this broker's cluster card (ADR 0102)
/// and its word that it reads the feature table (ADR 0134 §7), which a
/// broker playing one from before the table leaves out.
fn card_attributes(
    config: &BrokerConfig,
    card: &malachi_core::formation::Card,
) -> std::collections::BTreeMap<String, String> {
    let mut attributes = config.attributes.clone();
    attributes.extend(card.attributes());
    if !config.cluster.plays_pre_feature_gates {
        attributes.extend([malachi_core::model::features_attribute()]);
    }
    attributes
}

/// Finds this broker's cluster before the tree starts (ADR 0102): looks at
/// the live peers through a short SWIM run, waits for a bootstrap to
/// form, refuses a cluster that disagrees, and records the outcome. Then
/// the fabric gossips the final card, and the configuration names the
/// voters every later component reads.
async fn find_cluster(
    config: &mut BrokerConfig,
    fabric: &mut Fabric,
    plan: &mut Plan,
) -> Result<(), BrokerError> {
    let incarnation_path = config.incarnation_path();
    let mut identity = fabric.identity.clone();
    identity.incarnation = tokio::task::block_in_place(|| {
        crate::fabric::membership::next_incarnation(&incarnation_path)
    })
    .map_err(io_err(&incarnation_path))?;
    let mut rng_seed = [0u8; 8];
    getrandom::fill(&mut rng_seed).map_err(|e| BrokerError::Config {
        reason: format!("no os randomness: {e}"),
    })?;
    let args = FormArgs {
        membership: fabric.membership.clone(),
        socket: fabric
            .swim_socket
            .try_clone()
            .map_err(io_err(&config.data_dir))?,
        runtime: malachi_membership::RuntimeArgs {
            identity,
            settings: config.membership.swim(),
            seeds: if plan.looks_around() {
                crate::fabric::membership::resolve_seeds(&config.seeds).await
            } else {
                Vec::new()
            },
            rng_seed: u64::from_le_bytes(rng_seed),
            seal: config.membership.swim_seal(),
        },
    };
    crate::fabric::formation::form(plan, args).await?;
    fabric.identity.attributes = card_attributes(config, &plan.card(config.node_id));
    fabric.membership = Membership::new(&fabric.identity);
    fabric.formed = Arc::new(Formed::new(
        plan,
        config.node_id,
        fabric.membership.clone(),
        config.attributes.clone(),
    ));
    config.cluster.nodes = plan.nodes.clone();
    config.cluster.vnodes = Some(plan.shape.vnodes);
    config.cluster.replicas_per_vnode = plan.shape.replicas_per_vnode;
    config.cluster.bootstrap_expect = None;
    config.cluster.joined = plan.joined;
    Ok(())
}

/// How often a start on port 0 asks the kernel for another client port
/// when the one it got is taken for UDP by someone else.
const CLIENT_PORT_PICKS_MAX: usize = 16;

/// The client port: a TCP listener and the SWIM socket on the same ip:port
/// (UDP). With port 0 the kernel picks a TCP port that may be taken for UDP
/// (another process's ephemeral socket), so a taken pair is dropped and
/// another picked; a configured port is bound once and its error stands.
fn bind_client(
    addr: SocketAddr,
) -> Result<(Arc<std::net::TcpListener>, std::net::UdpSocket), BrokerError> {
    let mut picks = 0;
    loop {
        let tcp = bind("client port", addr)?;
        let bound = tcp.local_addr().map_err(|source| BrokerError::Bind {
            what: "client port",
            addr,
            source,
        })?;
        match std::net::UdpSocket::bind(bound) {
            Ok(udp) => return Ok((tcp, udp)),
            Err(e) if addr.port() == 0 && picks + 1 < CLIENT_PORT_PICKS_MAX => {
                picks += 1;
                tracing::debug!(port = bound.port(), error = %e, "client port taken for udp; picking another");
            }
            Err(source) => {
                return Err(BrokerError::Bind {
                    what: "membership (udp) port",
                    addr: bound,
                    source,
                });
            }
        }
    }
}

fn bind(what: &'static str, addr: SocketAddr) -> Result<Arc<std::net::TcpListener>, BrokerError> {
    std::net::TcpListener::bind(addr)
        .map(Arc::new)
        .map_err(|source| BrokerError::Bind { what, addr, source })
}

/// A nested supervisor whose handle is published into `slot` at every start,
/// so actors elsewhere in the tree can add dynamic children to it.
fn published_supervisor(
    args: SupervisorArgs,
    shared: &Arc<Shared>,
    slot: fn(&Shared) -> &parking_lot::RwLock<Option<SupervisorRef>>,
    after_start: fn(&Shared),
) -> ChildSpec {
    let name = args.name.clone();
    let shared = Arc::clone(shared);
    ChildSpec::from_fn(name, move |parent| {
        let args = args.clone();
        let shared = Arc::clone(&shared);
        Box::pin(async move {
            let (actor, _join) = Supervisor::spawn_linked(None, Supervisor, args, parent).await?;
            *slot(&shared).write() = Some(SupervisorRef::from_actor(actor.clone()));
            after_start(&shared);
            Ok(actor.get_cell())
        })
    })
    .kind(ChildKind::Supervisor)
    .shutdown_timeout_ms(malachi_supervision::SUPERVISOR_SHUTDOWN_TIMEOUT_MS_DEFAULT)
}

fn build_tree(
    shared: &Arc<Shared>,
    client: Arc<std::net::TcpListener>,
    admin: Arc<std::net::TcpListener>,
) -> SupervisorArgs {
    let acceptor_args = AcceptorArgs {
        serving: Arc::new(crate::serve::context::ServeCtx::of(shared)),
        socket: client,
    };
    let listener = SupervisorArgs::new("listener", Strategy::OneForOne).child(ChildSpec::worker(
        "acceptor",
        || AcceptorActor,
        move || acceptor_args.clone(),
    ));
    let listener = published_supervisor(listener, shared, |s| &s.actors.listener, |_| {});
    let admin_args = AdminArgs {
        ctx: Arc::new(crate::admin::AdminCtx::of(shared)),
        socket: admin,
    };
    SupervisorArgs::new("broker", Strategy::OneForOne)
        .intensity(Intensity {
            restarts_max: 5,
            period_ms: 10_000,
        })
        .child(storage_tree(shared))
        .child(ChildSpec::supervisor(metadata_tree(shared)))
        .child(ChildSpec::supervisor(membership_tree(shared)))
        .child(ChildSpec::supervisor(maintenance::supervisor(&upkeep(
            shared,
        ))))
        .child(listener)
        .child(ChildSpec::worker(
            "admin_http",
            || AdminActor,
            move || admin_args.clone(),
        ))
}

/// What the maintenance workers read of the broker's context.
fn upkeep(shared: &Arc<Shared>) -> maintenance::Upkeep<'_> {
    maintenance::Upkeep {
        config: &shared.config,
        actors: Arc::clone(&shared.actors),
        links: Arc::clone(&shared.links),
        data: Arc::clone(&shared.data),
        metrics: Arc::clone(&shared.metrics),
        rates: Arc::clone(&shared.rates),
        clock: Arc::clone(&shared.clock),
        control: crate::control::handle::ControlHandle::of(shared),
        #[cfg(feature = "testing")]
        fault_key: shared.client_addr,
    }
}

/// The storage supervisor: the ReplicationServer, and the segment actors
/// the coordinator starts under it.
fn storage_tree(shared: &Arc<Shared>) -> ChildSpec {
    // Many independent, cheap children: a larger budget than OTP's default.
    let storage = SupervisorArgs::new("storage", Strategy::OneForOne)
        .intensity(Intensity {
            restarts_max: 20,
            period_ms: 10_000,
        })
        .backoff(Backoff::DEFAULT)
        .child({
            let data = Arc::clone(&shared.data);
            ChildSpec::worker(
                "replication",
                || crate::data::replication::ReplicationServer,
                move || Arc::clone(&data),
            )
        });
    published_supervisor(
        storage,
        shared,
        |s| &s.data.supervisor,
        |s| {
            // A restarted storage supervisor has lost its dynamic children:
            // the coordinator starts them again from the metadata.
            if let Some(coordinator) = s.actors.manager().get() {
                let _ = coordinator.send_message(CoordinatorMsg::Reconcile);
            }
        },
    )
}

/// The metadata supervisor: the vnode replicas, the coordinators over
/// them, and the server of other brokers' orders.
fn metadata_tree(shared: &Arc<Shared>) -> SupervisorArgs {
    // The vnode replicas first, then the coordinator manager over them: the
    // manager starts one `coordinator/<vnode>` per vnode led here, as
    // dynamic children of its own supervisor.
    let vnodes_shared = Arc::clone(shared);
    let manager_shared = Arc::clone(shared);
    let coordinators =
        SupervisorArgs::new("coordinator_manager", Strategy::OneForOne).child(ChildSpec::worker(
            "manager",
            || ManagerActor,
            move || Arc::clone(&manager_shared),
        ));
    let coordinators =
        published_supervisor(coordinators, shared, |s| &s.actors.coordinator_sup, |_| {});
    // Last, so its restart restarts nothing else: it serves the orders of
    // other brokers' coordinators from the node fabric (ADR 0133).
    let orders_shared = Arc::clone(shared);
    SupervisorArgs::new("metadata", Strategy::RestForOne)
        .child(ChildSpec::worker(
            "vnodes",
            || VnodesActor,
            move || Arc::clone(&vnodes_shared),
        ))
        .child(coordinators)
        .child(ChildSpec::worker(
            "orders",
            || crate::control::order_server::OrderServer,
            move || Arc::clone(&orders_shared),
        ))
}

/// The membership supervisor: SWIM, then the node server, then the node
/// actor that feeds it and dials peers (a restarted node server restarts
/// the node actor too). Empty without a node fabric.
fn membership_tree(shared: &Arc<Shared>) -> SupervisorArgs {
    let mut membership = SupervisorArgs::new("membership", Strategy::RestForOne);
    if let Some(fabric) = shared.fabric() {
        let swim = SwimArgs {
            fabric: Arc::clone(&fabric),
            config: shared.config.clone(),
        };
        let node = NodeArgs {
            fabric: Arc::clone(&fabric),
            root: Arc::clone(&shared.actors.root),
        };
        membership = membership
            .child(ChildSpec::worker(
                "swim",
                || SwimActor,
                move || swim.clone(),
            ))
            .child(node_server_spec(fabric))
            .child(ChildSpec::worker(
                "node",
                || NodeActor,
                move || node.clone(),
            ));
    }
    membership
}

/// A fresh cluster id, this broker's candidate if it forms a cluster.
fn cluster_candidate() -> Result<malachi_core::formation::ClusterId, BrokerError> {
    let mut candidate = [0u8; 16];
    getrandom::fill(&mut candidate).map_err(|e| BrokerError::Config {
        reason: format!("no os randomness: {e}"),
    })?;
    Ok(malachi_core::formation::ClusterId(u128::from_be_bytes(
        candidate,
    )))
}

/// Binds the raft port and makes the transports to the other brokers'
/// (raft's, and replication's own, ADR 0095), sealed with the cluster
/// cookie, inside TLS when `peer_tls` is given (ADR 0151).
fn raft_endpoint(
    config: &BrokerConfig,
    client_addr: SocketAddr,
    peer_tls: Option<&malachi_cluster::group::PeerTls>,
    reach: Arc<malachi_cluster::group::PeerReach>,
) -> Result<RaftEndpoint, BrokerError> {
    // The raft port is bound before membership starts, so the identity
    // SWIM gossips carries it (ADR 0081).
    let raft_bind = config
        .cluster
        .raft_listen_addr
        .unwrap_or_else(|| SocketAddr::new(client_addr.ip(), 0));
    let raft_listener = bind("raft port", raft_bind)?;
    let raft_bound = raft_listener
        .local_addr()
        .map_err(|source| BrokerError::Bind {
            what: "raft port",
            addr: raft_bind,
            source,
        })?;
    let raft_addr = advertised(raft_bound, config.membership.advertise_ip);
    let cookie = malachi_cluster::group::ClusterCookie::new(
        config
            .membership
            .cluster_cookie
            .as_deref()
            .unwrap_or(crate::common::config::DEV_CLUSTER_COOKIE),
    )
    .ok_or_else(|| BrokerError::Config {
        reason: "membership.cluster_cookie must not be empty".to_owned(),
    })?;
    let transport = |cookie| {
        let mut transport_config =
            malachi_cluster::group::TcpTransportConfig::new(config.node_id, cookie);
        transport_config.tls = peer_tls.cloned();
        // Both transports' dials judge the peers' cluster ports (ADR 0155).
        Arc::new(
            malachi_cluster::group::TcpTransport::new(transport_config)
                .with_reach(Arc::clone(&reach)),
        )
    };
    Ok(RaftEndpoint {
        listener: raft_listener,
        addr: raft_addr,
        transport: transport(cookie.clone()),
        replication: transport(cookie),
        server: parking_lot::Mutex::new(None),
        port_counts: Default::default(),
        reach,
    })
}

impl Broker {
    /// Starts a broker with the system clock.
    pub async fn start(config: BrokerConfig) -> Result<BrokerHandle, BrokerError> {
        Broker::start_with_clock(config, Arc::new(SystemClock)).await
    }

    /// Starts a broker whose coordinator and segment actors read `clock`.
    /// Requires tokio's multi-thread runtime (the data path uses
    /// `block_in_place` around storage reads).
    pub async fn start_with_clock(
        config: BrokerConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<BrokerHandle, BrokerError> {
        Broker::start_with_store(config, clock, StoreFactory::default()).await
    }

    /// Starts a broker as [`start_with_clock`](Self::start_with_clock) does,
    /// on the segment store `store` opens (ADR 0131) instead of a
    /// `FileStore` over `data_dir/segments`.
    pub async fn start_with_store(
        config: BrokerConfig,
        clock: Arc<dyn Clock>,
        store: StoreFactory,
    ) -> Result<BrokerHandle, BrokerError> {
        config.validate()?;
        if tokio::runtime::Handle::current().runtime_flavor()
            != tokio::runtime::RuntimeFlavor::MultiThread
        {
            return Err(BrokerError::Config {
                reason: "the broker needs tokio's multi-thread runtime".into(),
            });
        }
        let data_dir = config.data_dir.clone();
        std::fs::create_dir_all(&data_dir).map_err(io_err(&data_dir))?;
        // The certificate files load now, so a bad one stops the start
        // before anything is bound or opened (ADR 0149).
        let tls = crate::common::tls::ServerTls::from_settings(&config.tls)?;
        let peer_tls = crate::common::cluster_tls::BrokerPeerTls::from_settings(&config.tls)?;
        let cursor_bootstrap = bootstrap_cursor_secret(&config.secret_path())?;
        check_node_identity(&config)?;
        let mut plan = crate::fabric::formation::plan(&config, cluster_candidate()?)?;
        let mut config = config;
        let (client, swim_socket) = bind_client(config.listen_addr)?;
        let admin = bind("admin port", config.admin_addr)?;
        let client_addr = client.local_addr().map_err(io_err(&data_dir))?;
        let admin_addr = admin.local_addr().map_err(io_err(&data_dir))?;
        let peer = peer_tls.as_ref().map(|t| &t.peer);
        let reach_log = Arc::new(crate::common::peer_reach::ReachLog::new(config.node_id));
        let reach = Arc::new(
            malachi_cluster::group::PeerReach::new(config.cluster.reach(), Arc::clone(&clock))
                .observed_by(
                    Arc::clone(&reach_log) as Arc<dyn malachi_cluster::group::ReachObserver>
                ),
        );
        let raft = raft_endpoint(&config, client_addr, peer, reach)?;
        let raft_addr = raft.addr;
        let mut fabric = open_fabric(
            &config,
            swim_socket,
            client_addr,
            admin_addr,
            raft_addr,
            &plan,
        )?;
        fabric.tls = peer.cloned();
        find_cluster(&mut config, &mut fabric, &mut plan).await?;
        // Segments open only once the cluster is known: a refused start
        // touches none of them.
        let store = store.open(&data_dir.join("segments"), config.store_config())?;
        let shared = Arc::new(Shared::new(
            config,
            store,
            clock,
            cursor_bootstrap,
            client_addr,
            admin_addr,
        ));
        if let Some(tls) = tls {
            tls.count_into(&shared.metrics);
            let _ = shared.tls.set(Arc::new(tls));
        }
        if let Some(peer_tls) = &peer_tls {
            peer_tls.count_into(&shared.metrics);
        }
        reach_log.count_into(&shared.metrics, &raft.reach.all());
        let _ = shared.links.fabric.set(Arc::new(fabric));
        let _ =
            shared
                .data
                .replication
                .link
                .set(Arc::new(crate::data::replication::TcpReplicaLink {
                    transport: Arc::clone(&raft.replication),
                }));
        let _ = shared.links.raft.set(Arc::new(raft));
        let tree = build_tree(&shared, client, admin);
        let (root, join) = SupervisorRef::spawn(tree).await?;
        *shared.actors.root.write() = Some(root.clone());
        info!(%client_addr, %admin_addr, node_id = shared.config.node_id, "broker started");
        Ok(BrokerHandle {
            shared,
            root,
            join: Some(join),
        })
    }
}

impl BrokerHandle {
    /// The bound client port.
    pub fn client_addr(&self) -> SocketAddr {
        self.shared.client_addr
    }

    /// The address other brokers reach this broker's raft port on.
    pub fn raft_addr(&self) -> Option<SocketAddr> {
        self.shared.links.raft.get().map(|r| r.addr)
    }

    /// Rotates the cluster's cursor key (ADR 0096): key `current + 1`, with
    /// a fresh secret from OS randomness, becomes the one cursors are
    /// minted under; cursors under the older keys keep verifying. Another
    /// broker learns the new key when a cursor first names it. Returns the
    /// new key id; refused if another rotation came first.
    pub async fn rotate_cursor_key(&self) -> Result<u32, BrokerError> {
        let mut secret = vec![0u8; SECRET_BYTES];
        getrandom::fill(&mut secret).map_err(|e| BrokerError::Secret {
            path: self.shared.config.data_dir.clone(),
            reason: format!("no os randomness: {e}"),
        })?;
        let plane = self.shared.plane()?;
        self.shared
            .memory
            .cursor_keys
            .rotate(
                plane.as_ref(),
                self.shared.clock.as_ref(),
                CursorSecret::new(secret),
            )
            .await
            .map_err(|e| BrokerError::CursorKeyRotation {
                reason: e.to_string(),
            })
    }

    /// The bound admin HTTP port.
    pub fn admin_addr(&self) -> SocketAddr {
        self.shared.admin_addr
    }

    pub fn node_id(&self) -> u64 {
        self.shared.config.node_id
    }

    /// This broker's membership: the live view of every broker (node id,
    /// incarnation, client, raft, admin and fabric addresses, attributes,
    /// state, routing), its events, and `set_local_routing`.
    pub fn membership(&self) -> Membership {
        // Set at start, before the handle exists.
        match self.shared.fabric() {
            Some(fabric) => fabric.membership.clone(),
            None => unreachable_membership(),
        }
    }

    /// The root supervisor.
    pub fn supervisor(&self) -> &SupervisorRef {
        &self.root
    }

    /// A live snapshot of the whole tree.
    pub async fn tree_snapshot(&self) -> Result<SupervisorSnapshot, BrokerError> {
        Ok(self.root.snapshot().await?)
    }

    /// Whether `/ready` answers 200.
    pub fn is_ready(&self) -> bool {
        self.shared.is_ready()
    }

    /// Waits (bounded) until the broker can serve clients.
    pub async fn wait_ready(&self, timeout_ms: u64) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
        while tokio::time::Instant::now() < deadline {
            if self.is_ready() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.is_ready()
    }

    /// Requests read from clients and not yet answered, over all connections.
    pub fn requests_inflight(&self) -> usize {
        self.shared.port.requests_inflight.load(Ordering::SeqCst)
    }

    /// The most requests one connection ever had in flight (bounded by
    /// `connection_inflight_max`).
    pub fn connection_inflight_peak(&self) -> usize {
        self.shared
            .port
            .connection_inflight_peak
            .load(Ordering::SeqCst)
    }

    /// Client connections being served.
    pub fn connections(&self) -> usize {
        self.shared.port.connections.load(Ordering::SeqCst)
    }

    /// The Prometheus text `/metrics` serves.
    pub fn metrics_text(&self) -> String {
        self.shared.metrics.render()
    }

    /// Resolves when the tree has exited on its own (it escalated past the
    /// root's restart intensity). Cancel-safe.
    pub async fn stopped(&mut self) {
        if let Some(join) = self.join.as_mut() {
            let _ = join.await;
            self.join = None;
        }
    }

    /// Ordered shutdown: stop accepting, let connections finish their
    /// in-flight requests (acknowledgements included), sync every open
    /// segment, then stop the tree in reverse start order.
    pub async fn shutdown(mut self) -> Result<(), BrokerError> {
        let bound = Duration::from_millis(self.shared.config.shutdown_timeout_ms);
        let deadline = tokio::time::Instant::now() + bound;
        info!("shutdown: stop accepting");
        self.shared.port.accepting.store(false, Ordering::SeqCst);
        let listener = self.shared.actors.listener.read().clone();
        if let Some(listener) = listener {
            let _ = listener.terminate_child("acceptor").await;
        }
        info!("shutdown: finish in-flight requests");
        self.shared.port.draining.cancel();
        while self.shared.port.connections.load(Ordering::SeqCst) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if self.shared.port.connections.load(Ordering::SeqCst) > 0 {
            warn!("shutdown: connections still open at the deadline");
        }
        info!("shutdown: sync segments");
        let segments: Vec<_> = self.shared.data.segments.lock().keys().copied().collect();
        for segment in segments {
            if let Ok(ticket) = self
                .shared
                .store
                .sync(malachi_storage::SegmentId(segment.0))
            {
                let _ = tokio::time::timeout_at(deadline, ticket).await;
            }
        }
        info!("shutdown: leave the cluster");
        if let Some(fabric) = self.shared.fabric() {
            fabric.membership.leave();
            let leave_deadline = tokio::time::Instant::now() + Duration::from_millis(LEAVE_WAIT_MS);
            while fabric.swim_running.load(Ordering::SeqCst)
                && tokio::time::Instant::now() < leave_deadline
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        info!("shutdown: stop the tree");
        *self.shared.actors.root.write() = None;
        let stopped = self.root.stop(bound.as_millis() as u64).await;
        if let Some(join) = self.join.take() {
            let _ = tokio::time::timeout(bound, join).await;
        }
        stopped?;
        info!("broker stopped");
        Ok(())
    }
}

#[cfg(feature = "testing")]
impl BrokerHandle {
    /// Test hook: starts the actor guide's example behaviour, the
    /// `greeter` (`fabric/greeter.rs`), as a child of the root supervisor.
    pub async fn start_greeter(&self) -> Result<(), BrokerError> {
        let root = self
            .shared
            .actors
            .root
            .read()
            .clone()
            .ok_or(BrokerError::Config {
                reason: "the tree is not running".into(),
            })?;
        let fabric = self.shared.fabric().ok_or(BrokerError::Config {
            reason: "no node fabric".into(),
        })?;
        root.start_child(crate::fabric::greeter::spec(fabric.me()))
            .await
            .map(|_| ())
            .map_err(|e| BrokerError::Config {
                reason: format!("cannot start the greeter: {e}"),
            })
    }

    /// Test hook: greets broker `peer`'s `greeter` over the node fabric.
    pub async fn greet(&self, peer: u64) -> Result<String, HookError> {
        let fabric = self.shared.fabric().ok_or(HookError::NoFabric)?;
        crate::fabric::greeter::greet(&fabric, peer)
            .await
            .map_err(|e| HookError::Fabric(Box::new(e)))
    }

    /// Test hook: orders this broker served from peers over the node
    /// fabric, by name (ADR 0133).
    pub fn fabric_orders_served(&self) -> std::collections::BTreeMap<String, u64> {
        self.shared
            .fabric()
            .map(|fabric| fabric.calls.served())
            .unwrap_or_default()
    }

    /// Test hook: this broker's calls over the node fabric that a peer
    /// answered, that were sent again after their session closed, and
    /// that went to the cluster port instead.
    pub fn fabric_call_counts(&self) -> (u64, u64, u64) {
        self.shared
            .fabric()
            .map(|fabric| fabric.calls.counts())
            .unwrap_or_default()
    }

    /// Test hook: sends the order `variant` (`fence`, `seal`,
    /// `drop_copies`, `replica_status`) with the encoded `body` to broker
    /// `node` over the node fabric only, within `timeout_ms`.
    pub async fn order_over_fabric(
        &self,
        node: u64,
        variant: &str,
        body: Vec<u8>,
        timeout_ms: u64,
    ) -> Result<Vec<u8>, HookError> {
        let fabric = self.shared.fabric().ok_or(HookError::NoFabric)?;
        let (to, _) = fabric.peer(node);
        fabric
            .calls
            .call(
                crate::control::replica_order::ORDERS_BEHAVIOUR,
                to,
                variant,
                body,
                Duration::from_millis(timeout_ms),
                Duration::from_millis(crate::control::replica_order::ORDER_SESSION_WAIT_MS),
            )
            .await
            .map_err(|e| HookError::Fabric(Box::new(e)))
    }

    /// Test hook: sends `body` with `api_key` to broker `node` on the
    /// cluster port, within `timeout_ms`.
    pub async fn call_cluster_port(
        &self,
        node: u64,
        api_key: u16,
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<Vec<u8>, HookError> {
        let raft = self
            .shared
            .links
            .raft
            .get()
            .ok_or(HookError::NoClusterPort)?;
        Ok(raft
            .transport
            .call_raw(node, api_key, 0, body, timeout_ms)
            .await?
            .to_vec())
    }

    /// Test hook: requests with `api_key` this broker's cluster port
    /// served since start (`control/cluster_port.rs`).
    pub fn cluster_port_served(&self, api_key: u16) -> u64 {
        self.shared
            .links
            .raft
            .get()
            .map_or(0, |raft| raft.port_counts.served(api_key))
    }

    /// Test hook: inbound node fabric connections authenticated, and dropped
    /// before authenticating, since start; `None` without a fabric.
    pub fn fabric_inbound_counts(&self) -> Option<(u64, u64)> {
        self.shared.fabric().map(|fabric| fabric.inbound.counts())
    }

    /// The address other brokers dial this broker's node fabric on; `None`
    /// without a fabric.
    pub fn fabric_addr(&self) -> Option<SocketAddr> {
        self.shared
            .fabric()
            .and_then(|fabric| fabric.identity.cluster_addr)
    }

    /// Test hook: the cluster port's server's counts (refusals, TLS ones
    /// among them, ADR 0151); `None` before it runs.
    pub fn cluster_port_stats(&self) -> Option<malachi_cluster::group::TransportServerStats> {
        let raft = self.shared.links.raft.get()?;
        let server = raft.server.lock().clone()?;
        Some(server.stats())
    }

    /// Test hook: sessions ractor_cluster's own (unadvertised) listener
    /// accepted and the fabric stopped at once, and that listener's address;
    /// `None` without a fabric.
    pub fn fabric_unadvertised(&self) -> Option<(u64, Option<SocketAddr>)> {
        self.shared
            .fabric()
            .map(|fabric| fabric.inbound.unadvertised())
    }

    /// Test hook: the free bytes the space worker sees on the data volume
    /// from its next poll (`None`: the volume's own, ADR 0111).
    pub fn set_free_bytes(&self, free_bytes: Option<u64>) {
        let source: Arc<dyn crate::data::space::FreeSpace> = match free_bytes {
            Some(bytes) => Arc::new(crate::data::space::FixedSpace(bytes)),
            None => Arc::new(crate::data::space::VolumeSpace),
        };
        *self.shared.data.free_space.write() = source;
    }

    /// Test hook: the segments a writer (segment actor) started for on this
    /// broker since it started, in order.
    pub fn writer_starts(&self) -> Vec<u64> {
        self.shared.data.writer_starts.lock().clone()
    }

    /// Test hook: while `hold` is set, failovers on this broker stop after
    /// their fences (before the seal is decided); returns how many have
    /// stopped there since start.
    pub fn hold_failovers(&self, hold: bool) -> u64 {
        use std::sync::atomic::Ordering;
        self.shared.failover_hold.hold.store(hold, Ordering::SeqCst);
        self.shared.failover_hold.held.load(Ordering::SeqCst)
    }

    /// Test hook: the failovers stopped after their fences since start.
    pub fn failovers_held(&self) -> u64 {
        self.shared
            .failover_hold
            .held
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Test hook: makes the named segment actor fail.
    pub async fn poison_segment(&self, name: &str) -> Result<(), BrokerError> {
        let storage = self.shared.data.supervisor.read().clone();
        let storage = storage.ok_or(BrokerError::TreeFailed)?;
        let cell = storage.child(name).await?.ok_or(BrokerError::TreeFailed)?;
        let actor: ractor::ActorRef<crate::data::segment::SegmentMsg> = cell.into();
        actor
            .send_message(crate::data::segment::SegmentMsg::Poison)
            .map_err(|_| BrokerError::TreeFailed)
    }

    /// Test hook: makes the connection actor of client `peer` fail.
    pub async fn poison_connection(&self, peer: SocketAddr) -> Result<(), BrokerError> {
        let listener = self.shared.actors.listener.read().clone();
        let listener = listener.ok_or(BrokerError::TreeFailed)?;
        let cell = listener
            .child(&format!("connection/{peer}"))
            .await?
            .ok_or(BrokerError::TreeFailed)?;
        let actor: ractor::ActorRef<crate::serve::connection::ConnectionMsg> = cell.into();
        actor
            .send_message(crate::serve::connection::ConnectionMsg::Poison)
            .map_err(|_| BrokerError::TreeFailed)
    }

    /// Test hook: kills the actor at `path` in the tree (child names from
    /// the root down, e.g. `["maintenance", "healer"]`), as a crash would:
    /// it ends at once, abnormally, and its `post_stop` does not run.
    pub async fn kill_actor(&self, path: &[&str]) -> Result<(), BrokerError> {
        let (last, parents) = path.split_last().ok_or(BrokerError::TreeFailed)?;
        let mut supervisor = self.root.clone();
        for name in parents {
            let cell = supervisor
                .child(name)
                .await?
                .ok_or(BrokerError::TreeFailed)?;
            supervisor = SupervisorRef::from_actor(cell.into());
        }
        let cell = supervisor
            .child(last)
            .await?
            .ok_or(BrokerError::TreeFailed)?;
        cell.kill();
        Ok(())
    }

    /// Test hook: the next pass of `worker`'s background work panics, as a
    /// bug in it would (`scrubber`, `space`, `sweeper`, and `node` for its
    /// dial loop; see `common::faults`; and the vnode host's loops by their
    /// `HostLoop` names: `prober`, `ring_sync`, `quiescer`, `rebalancer`,
    /// `admission`, `attributes`).
    pub fn fail_work(&self, worker: &str) {
        use malachi_cluster::vnodes::HostLoop;
        if let Some(which) = HostLoop::named(worker) {
            if let Some(host) = self.vnode_host() {
                host.fail_loop(which);
            }
            return;
        }
        crate::common::faults::arm(self.shared.client_addr, worker);
    }

    /// Test hook: the raft replica here of the vnode that owns `topic` has
    /// its disk fail: its next write stops it fatally. Returns its group id.
    pub fn break_vnode_disk(&self, topic: &str) -> Option<u64> {
        let host = self.vnode_host()?;
        let group = host.group(host.ring().owner(topic).id)?;
        group.break_disk_for_tests();
        Some(group.group_id())
    }

    fn vnode_host(&self) -> Option<Arc<malachi_cluster::vnodes::VnodeHost>> {
        let plane = self.shared.plane().ok()?;
        plane.host().cloned()
    }

    /// Test hook: makes the acceptor fail.
    pub async fn poison_acceptor(&self) -> Result<(), BrokerError> {
        let listener = self.shared.actors.listener.read().clone();
        let listener = listener.ok_or(BrokerError::TreeFailed)?;
        let cell = listener
            .child("acceptor")
            .await?
            .ok_or(BrokerError::TreeFailed)?;
        let actor: ractor::ActorRef<crate::serve::listener::AcceptorMsg> = cell.into();
        actor
            .send_message(crate::serve::listener::AcceptorMsg::Poison)
            .map_err(|_| BrokerError::TreeFailed)
    }
}

/// Runs a broker until SIGTERM or SIGINT, then shuts it down in order and
/// returns `Ok` (so the process exits 0). Returns an error if the broker
/// cannot start or its tree fails on its own.
pub async fn run_until_signal(config: BrokerConfig) -> Result<(), BrokerError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(BrokerError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(BrokerError::Signal)?;
    let mut broker = Broker::start(config).await?;
    tokio::select! {
        _ = term.recv() => info!("sigterm: shutting down"),
        _ = int.recv() => info!("sigint: shutting down"),
        _ = broker.stopped() => {
            warn!("the supervision tree exited on its own");
            return Err(BrokerError::TreeFailed);
        }
    }
    broker.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_dir_refuses_a_node_other_than_the_one_that_created_it() {
        let dir = tempfile::tempdir().unwrap();
        let one = BrokerConfig {
            node_id: 1,
            ..BrokerConfig::for_tests(dir.path())
        };
        check_node_identity(&one).unwrap();
        check_node_identity(&one).unwrap();
        let two = BrokerConfig {
            node_id: 2,
            ..BrokerConfig::for_tests(dir.path())
        };
        let refused = check_node_identity(&two).unwrap_err().to_string();
        assert!(
            refused.contains("belongs to node 1, not node 2"),
            "{refused}"
        );
    }

    #[test]
    fn the_client_port_holds_tcp_and_udp_on_one_port() {
        let (tcp, udp) = bind_client(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        assert_eq!(tcp.local_addr().unwrap(), udp.local_addr().unwrap());
    }

    /// A configured port whose UDP half is taken is refused naming the
    /// membership port, not re-picked (CI, `tls::mtls_required_...`: a port 0
    /// start met a taken UDP port once and failed; now it picks again).
    #[test]
    fn a_configured_client_port_taken_for_udp_is_refused_by_name() {
        // The kernel hands the UDP socket an ephemeral port whose TCP half
        // another test may hold at that moment: then the refusal names the
        // client port, and another UDP port is tried.
        for _ in 0..20 {
            let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let addr = taken.local_addr().unwrap();
            match bind_client(addr) {
                Err(BrokerError::Bind {
                    what: "membership (udp) port",
                    ..
                }) => return,
                Err(BrokerError::Bind {
                    what: "client port",
                    ..
                }) => continue,
                Err(other) => panic!("unexpected error: {other}"),
                Ok(_) => panic!("a taken udp port was bound"),
            }
        }
        panic!("every udp port tried had its tcp half taken too");
    }
}
