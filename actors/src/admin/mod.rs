//! The admin port: `admin_http` (`http.rs`): health, readiness, the
//! Prometheus text of `common::metrics` and the live tree as JSON, over
//! TLS when the broker has it (`stream.rs`).
//!
//! This file is the layer's one boundary with the broker context: it
//! builds the [`AdminCtx`] the handlers get, of the parts they read.

use std::sync::Arc;

use crate::common::client_port::ClientPortState;
use crate::common::metrics::BrokerMetrics;
use crate::control::memory::ControlMemory;
use crate::control::registry::ActorRegistry;
use crate::control::shared::Shared;
use crate::data::storage::Storage;
use crate::serve::context::MetaCtx;

pub(crate) mod access;
pub(crate) mod http;
pub(crate) mod probe_lane;
pub(crate) mod stream;

/// What the admin handlers read: the registry (the tree's root, the
/// metadata plane), the client port's flags and the data plane (for
/// readiness and the open-segment gauge), the leases held (`memory`), the
/// metrics they render, the cluster members request's context (`meta`,
/// shared with the client port) and the admin port's bounds.
#[derive(Debug)]
pub(crate) struct AdminCtx {
    pub actors: Arc<ActorRegistry>,
    pub port: Arc<ClientPortState>,
    pub data: Arc<Storage>,
    pub memory: Arc<ControlMemory>,
    pub metrics: Arc<BrokerMetrics>,
    pub meta: Arc<MetaCtx>,
    pub connections_max: usize,
    pub address_connections_max: usize,
    pub read_timeout_ms: u64,
    pub probe_connections_max: usize,
    pub probe_timeout_ms: u64,
    /// Who may do what (ADR 0152): the client port's rules, with a view
    /// cache of its own.
    pub auth: Arc<crate::serve::auth::AuthCtx>,
    /// The port's TLS, the client port's (ADR 0149).
    pub tls: Option<Arc<crate::common::tls::ServerTls>>,
    /// The broker's fault-injection key (its client address).
    #[cfg(feature = "testing")]
    pub fault_key: std::net::SocketAddr,
}

impl AdminCtx {
    pub(crate) fn of(shared: &Arc<Shared>) -> AdminCtx {
        AdminCtx {
            actors: Arc::clone(&shared.actors),
            port: Arc::clone(&shared.port),
            data: Arc::clone(&shared.data),
            memory: Arc::clone(&shared.memory),
            metrics: Arc::clone(&shared.metrics),
            meta: Arc::new(MetaCtx::of(shared)),
            connections_max: shared.config.admin_connections_max,
            address_connections_max: shared.config.admin_address_connections_max,
            read_timeout_ms: shared.config.admin_read_timeout_ms,
            probe_connections_max: shared.config.admin_probe_connections_max,
            probe_timeout_ms: shared.config.admin_probe_timeout_ms,
            auth: crate::serve::context::build_auth(shared),
            tls: shared.tls.get().cloned(),
            #[cfg(feature = "testing")]
            fault_key: shared.client_addr,
        }
    }

    /// Whether the broker is ready for traffic (`Shared::is_ready`).
    pub(crate) fn is_ready(&self) -> bool {
        crate::control::shared::is_ready(&self.actors, &self.port, &self.data)
    }
}
