//! What each serve path uses of the broker, named field by field and built
//! once, when the acceptor starts, from the broker context: [`ReadCtx`] for
//! fetch, subscribe and the reads through holders (`remote.rs`) and cursor
//! keys (`cursors.rs`); [`ProduceCtx`] for the produce sequencer;
//! [`MetaCtx`] for the metadata requests (topics, policies, vnodes,
//! cluster, features); [`ServeCtx`] for the acceptor and each connection,
//! holding the others. A handler given one of them cannot reach the rest
//! of the broker (the admin server, configuration it does not read).
//!
//! This file is the `serve` layer's one boundary with the broker context
//! (`Shared`): nothing else under `serve/` names it
//! (`actors/tests/module_cycles.rs`).

use std::sync::Arc;

use malachi_storage::SegmentStore;
use tokio_util::sync::CancellationToken;

use crate::common::client_port::ClientPortState;
use crate::common::clock::Clock;
use crate::common::config::{Authentication, MetadataBackend};
use crate::common::metrics::BrokerMetrics;
use crate::control::handle::ControlHandle;
use crate::control::memory::ControlMemory;
use crate::control::placement::PlacementView;
use crate::control::registry::ActorRegistry;
use crate::control::shared::{ClusterLinks, Shared};
use crate::data::storage::Storage;

use super::auth::{AuthCtx, AuthSettings};

/// What the read path uses: who serves what (`place`: this broker, the
/// metadata plane, membership and the cluster port to holders), the data
/// plane's copies and their damage book, durable watches and settled
/// ends (`data`, `store`), the cluster's cursor keys (`memory`, refreshed
/// against `clock`), the read limits, and the port's drain.
#[derive(Debug, Clone)]
pub(crate) struct ReadCtx {
    pub place: PlacementView,
    pub store: Arc<dyn SegmentStore>,
    pub data: Arc<Storage>,
    pub metrics: Arc<BrokerMetrics>,
    /// The cursor keys (`memory.cursor_keys`).
    pub memory: Arc<ControlMemory>,
    pub clock: Arc<dyn Clock>,
    /// Cancelled when the client port drains: long polls and pushes end.
    pub draining: CancellationToken,
    pub frame_bytes_max: usize,
    pub fetch_wait_ms_max: u64,
}

impl ReadCtx {
    pub fn of(shared: &Shared) -> ReadCtx {
        ReadCtx {
            place: PlacementView::of(shared),
            store: Arc::clone(&shared.store),
            data: Arc::clone(&shared.data),
            metrics: Arc::clone(&shared.metrics),
            memory: Arc::clone(&shared.memory),
            clock: Arc::clone(&shared.clock),
            draining: shared.port.draining.clone(),
            frame_bytes_max: shared.config.frame_bytes_max,
            fetch_wait_ms_max: shared.config.fetch_wait_ms_max,
        }
    }
}

/// What the produce path uses: who serves what (`place`), the data
/// plane's segments, free space and replicated copies (`data`), the
/// clock records are stamped with, the port's response budgets (`port`),
/// and the produce limits.
#[derive(Debug, Clone)]
pub(crate) struct ProduceCtx {
    pub place: PlacementView,
    pub data: Arc<Storage>,
    pub clock: Arc<dyn Clock>,
    /// The broker-wide response budget (`port.budgets`).
    pub port: Arc<ClientPortState>,
    /// Where each stored part is counted (ADR 0143).
    pub rates: Arc<crate::common::rates::RangeRates>,
    pub produce_timeout_ms: u64,
    pub record_value_bytes_max: usize,
}

impl ProduceCtx {
    pub fn of(shared: &Shared) -> ProduceCtx {
        ProduceCtx {
            place: PlacementView::of(shared),
            data: Arc::clone(&shared.data),
            clock: Arc::clone(&shared.clock),
            port: Arc::clone(&shared.port),
            rates: Arc::clone(&shared.rates),
            produce_timeout_ms: shared.config.produce_timeout_ms,
            record_value_bytes_max: shared.config.record_value_bytes_max,
        }
    }
}

/// What the metadata requests use (topics, policies, vnodes, cluster
/// status and members, features): this broker's id and addresses, the
/// registry (the metadata plane, the coordinator manager, the tree's
/// root), membership (`links`), the control plane's operations they ask
/// for (`control`), and the limits they apply.
#[derive(Debug, Clone)]
pub(crate) struct MetaCtx {
    pub node_id: u64,
    pub client_addr: std::net::SocketAddr,
    pub admin_addr: std::net::SocketAddr,
    pub actors: Arc<ActorRegistry>,
    pub links: Arc<ClusterLinks>,
    pub control: ControlHandle,
    /// How long a coordinator call may take.
    pub produce_timeout_ms: u64,
    pub metadata_backend: MetadataBackend,
    /// The ranges' write rates here, for `topic describe` (ADR 0143).
    pub rates: Arc<crate::common::rates::RangeRates>,
    pub clock: Arc<dyn Clock>,
}

impl MetaCtx {
    pub fn of(shared: &Arc<Shared>) -> MetaCtx {
        MetaCtx {
            node_id: shared.config.node_id,
            client_addr: shared.client_addr,
            admin_addr: shared.admin_addr,
            actors: Arc::clone(&shared.actors),
            links: Arc::clone(&shared.links),
            control: ControlHandle::of(shared),
            produce_timeout_ms: shared.config.produce_timeout_ms,
            metadata_backend: shared.config.metadata_backend,
            rates: Arc::clone(&shared.rates),
            clock: Arc::clone(&shared.clock),
        }
    }

    pub fn plane(
        &self,
    ) -> Result<Arc<dyn crate::control::metadata::MetadataPlane>, crate::common::error::MetadataError>
    {
        self.actors.plane()
    }
}

/// The client port's bounds a connection and the acceptor apply, copied
/// from the configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PortLimits {
    pub connections_max: usize,
    pub address_connections_max: usize,
    pub connection_inflight_max: usize,
    pub connection_request_bytes_max: usize,
    pub connection_response_bytes_max: usize,
    pub frame_bytes_max: usize,
    pub response_write_timeout_ms: u64,
    pub record_value_bytes_max: usize,
    pub frame_read_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub admission_timeout_ms: u64,
    pub shutdown_timeout_ms: u64,
}

/// What the acceptor and each connection use: the port's state (flags,
/// counters, budgets), the metrics they count into, the port's limits,
/// the registry (the listener supervisor new connections start under),
/// and the request paths' contexts, built once here and shared by every
/// connection.
#[derive(Debug)]
pub(crate) struct ServeCtx {
    pub port: Arc<ClientPortState>,
    pub metrics: Arc<BrokerMetrics>,
    pub limits: PortLimits,
    pub actors: Arc<ActorRegistry>,
    pub read: Arc<ReadCtx>,
    pub produce: Arc<ProduceCtx>,
    pub meta: Arc<MetaCtx>,
    /// The port's TLS, if it has TLS (ADR 0149).
    pub tls: Option<Arc<crate::common::tls::ServerTls>>,
    /// Rate-limits the logs of clients of the wrong protocol.
    pub wrong_protocol: crate::common::tls::WrongProtocolLog,
    /// Authentication and authorization (ADR 0150).
    pub auth: Arc<AuthCtx>,
    /// The broker's fault-injection key (its client address).
    #[cfg(feature = "testing")]
    pub fault_key: std::net::SocketAddr,
}

impl ServeCtx {
    pub fn of(shared: &Arc<Shared>) -> ServeCtx {
        let config = &shared.config;
        ServeCtx {
            port: Arc::clone(&shared.port),
            metrics: Arc::clone(&shared.metrics),
            limits: PortLimits {
                connections_max: config.connections_max,
                address_connections_max: config.address_connections_max,
                connection_inflight_max: config.connection_inflight_max,
                connection_request_bytes_max: config.connection_request_bytes_max,
                connection_response_bytes_max: config.connection_response_bytes_max,
                frame_bytes_max: config.frame_bytes_max,
                response_write_timeout_ms: config.response_write_timeout_ms,
                record_value_bytes_max: config.record_value_bytes_max,
                frame_read_timeout_ms: config.frame_read_timeout_ms,
                idle_timeout_ms: config.idle_timeout_ms,
                admission_timeout_ms: config.admission_timeout_ms,
                shutdown_timeout_ms: config.shutdown_timeout_ms,
            },
            actors: Arc::clone(&shared.actors),
            read: Arc::new(ReadCtx::of(shared)),
            produce: Arc::new(ProduceCtx::of(shared)),
            meta: Arc::new(MetaCtx::of(shared)),
            tls: shared.tls.get().cloned(),
            wrong_protocol: Default::default(),
            auth: auth_ctx(shared),
            #[cfg(feature = "testing")]
            fault_key: shared.client_addr,
        }
    }
}

/// The broker's authentication from `[security]`, with a cache of its
/// own: the client port's, and the admin port's (ADR 0152).
pub(crate) fn build_auth(shared: &Arc<Shared>) -> Arc<AuthCtx> {
    let security = &shared.config.security;
    let default_policy = || malachi_core::auth::token::TokenPolicy {
        algorithms: vec![malachi_core::auth::token::TokenAlgorithm::EdDSA],
        clock_skew_ms: crate::common::config::TOKEN_CLOCK_SKEW_MS_DEFAULT,
        audience: None,
    };
    let settings = AuthSettings {
        enabled: security.authentication == Authentication::Scram,
        // Validated at start (`BrokerConfig::validate`).
        superusers: security.superuser_principals().unwrap_or_default(),
        iterations: security.scram_iterations,
        policy: security.lockout_policy(),
        view_max_age_ms: security.auth_view_max_age_ms,
        token: security.token_policy().unwrap_or_else(|_| default_policy()),
    };
    Arc::new(AuthCtx::new(
        settings,
        Arc::clone(&shared.actors),
        Arc::clone(&shared.memory),
        Arc::clone(&shared.clock),
        Arc::clone(&shared.metrics),
    ))
}

/// The client port's authentication, from `[security]`; starts creating
/// the bootstrap user, if one is configured, in the background.
fn auth_ctx(shared: &Arc<Shared>) -> Arc<AuthCtx> {
    let security = &shared.config.security;
    let auth = build_auth(shared);
    if let (Some(name), Some(file)) = (
        security.bootstrap_user.clone(),
        security.bootstrap_password_file.clone(),
    ) && let Ok(runtime) = tokio::runtime::Handle::try_current()
    {
        runtime.spawn(super::users::bootstrap_user(
            Arc::clone(&auth),
            name,
            file,
            shared.port.draining.clone(),
        ));
    }
    auth
}
