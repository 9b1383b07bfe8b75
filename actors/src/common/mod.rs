//! Leaf modules every layer uses: configuration, the clock, the crate's
//! error types, the broker's metric handles and the conversions to and from
//! the wire's types, the ranges' write rates, and TLS (the server config
//! and the verified peer's identity). Nothing here names another module of this crate.

pub(crate) mod addresses;
pub(crate) mod budget;
pub(crate) mod client_port;
pub(crate) mod clock;
pub(crate) mod cluster_tls;
pub(crate) mod config;
pub(crate) mod convert;
pub(crate) mod error;
#[cfg(feature = "testing")]
pub(crate) mod faults;
pub(crate) mod metrics;
pub(crate) mod peer_identity;
pub(crate) mod peer_reach;
pub(crate) mod rates;
pub(crate) mod refusal;
pub(crate) mod reloading;
pub(crate) mod store_factory;
pub(crate) mod tls;
pub(crate) mod tls_roots;
pub(crate) mod volume;
pub(crate) mod watched;

/// A supervisor's handle, published at each of its starts and read by
/// whoever needs it later (the root by the admin port and the node fabric).
pub(crate) type SupervisorSlot =
    std::sync::Arc<parking_lot::RwLock<Option<malachi_supervision::SupervisorRef>>>;
