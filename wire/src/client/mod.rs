//! The async client: connect to any broker, pipeline requests by correlation
//! id within a bounded window, retry retriable errors with bounded
//! exponential backoff, follow `not_leader` and `moved` hints, and time out
//! cleanly.
//!
//! Deadlines: a call's `request_timeout_ms` bounds the whole call, its
//! retries, reconnections and backoffs included; each attempt gets what is
//! left. A call that runs out while retrying fails with
//! [`ClientError::Deadline`], which names the part it was waiting for (the
//! connection, the answer, a quorum, the topic's leader).
//!
//! Where a request goes: the broker last hinted for its topic, else the
//! default broker; a producer's part goes to its range's route, seeded
//! from the topic's range map and refreshed by hints (`routes.rs`). A
//! broker that cannot serve the topic now without naming who can
//! (`no_quorum`, `not_leader` without a hint, `shutting_down`, or a
//! connection that fails) sends the next attempt to the next broker the
//! client knows: the bootstrap addresses, every hinted address, and, when
//! it knows no other, the brokers the answering one lists in
//! `cluster_status`. A primary cut off from its followers answers
//! `no_quorum` while the others fail its segments over; asking them is how
//! a client finds the new primary (ADR 0126).
//!
//! Delivery: a retried request may have been applied by the broker before the
//! failure was seen (a lost connection, a `timeout` code), so `produce` is
//! at-least-once under retries until idempotent produce (the reserved
//! `producer` sequence) is implemented. A client-side timeout is never
//! retried: it is returned as [`ClientError::Timeout`] and the late response,
//! if it ever arrives, is dropped.

mod bootstrap;
mod connection;
mod login;
mod producer;
mod routes;
mod stream;
mod suspects;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use tracing::{debug, info};

use crate::batch::RecordBatch;
use crate::error::{ErrorBody, ErrorCode, WireError};
use crate::frame::FRAME_BYTES_MAX_DEFAULT;
use crate::messages::*;
use connection::Connection;
pub use login::{AuthSession, Authenticator, Login, TokenLogin};
pub use producer::{ProduceAck, Producer, ProducerIdentity};
pub use stream::{
    ConsumeOptions, ConsumedRecord, Consumer, StartAt, Subscription, SubscriptionBatch,
};
use suspects::{SUSPECT_MS, SUSPECT_POLL_MS, Suspects};

/// The client's limits. Every field is a bound; units are in the names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// A free-form name sent in `api_versions`.
    pub client_name: String,
    /// How long one call may take: its first attempt (window wait
    /// included), and its retries, reconnections and backoffs together.
    pub request_timeout_ms: u64,
    /// How long opening a TCP connection may take.
    pub connect_timeout_ms: u64,
    /// Requests awaiting a response on one connection (the window).
    pub inflight_requests_max: usize,
    /// Retries after the first attempt, for retriable errors, within the
    /// call's deadline (`request_timeout_ms`).
    pub retries_max: u32,
    /// The first backoff; it doubles per retry.
    pub backoff_initial_ms: u64,
    /// The longest backoff (also caps a broker's `retry_after_ms`).
    pub backoff_max_ms: u64,
    /// The frame limit for both directions.
    pub frame_bytes_max: usize,
    /// Pushes buffered per subscription before it is ended as overrun.
    pub subscription_pushes_max: usize,
    /// Open connections (bootstrap plus followed hints) per client.
    pub connections_max: usize,
    /// Bootstrap addresses one client may be given (Kafka's
    /// `bootstrap.servers`): a few reachable ones suffice, the rest of the
    /// cluster is learned from it.
    pub bootstrap_brokers_max: usize,
    /// Whether a client, once connected, asks the broker for the cluster's
    /// brokers (in the background, within `DISCOVERY_TIMEOUT_MS`), so a
    /// later reconnect can go to any live broker, not only the bootstrap
    /// ones. Off for fake brokers that answer one operation only.
    pub discover_on_connect: bool,
    /// TLS to every broker (ADR 0149); unset, plaintext.
    pub tls: Option<crate::tls::ClientTls>,
    /// How the client logs in on every connection it opens (ADR 0150);
    /// `None`: it does not.
    pub login: Option<Login>,
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            client_name: concat!("malachi-wire/", env!("CARGO_PKG_VERSION")).to_owned(),
            request_timeout_ms: 30_000,
            connect_timeout_ms: 5_000,
            inflight_requests_max: 64,
            retries_max: 5,
            backoff_initial_ms: 10,
            backoff_max_ms: 1_000,
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
            subscription_pushes_max: 256,
            connections_max: 64,
            bootstrap_brokers_max: BOOTSTRAP_BROKERS_MAX_DEFAULT,
            discover_on_connect: true,
            tls: None,
            login: None,
        }
    }
}

/// The default of [`ClientConfig::bootstrap_brokers_max`].
pub const BOOTSTRAP_BROKERS_MAX_DEFAULT: usize = 32;

/// What a client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no broker address given")]
    NoAddress,
    #[error("{given} bootstrap broker addresses given, at most {max} allowed")]
    TooManyBootstrapBrokers { given: usize, max: usize },
    /// None of several bootstrap addresses could be connected to within
    /// the deadline: each one tried, with why (a single address fails with
    /// its own error, as it always did).
    #[error("no bootstrap broker could be reached: {}", list_failures(.tried))]
    Unreachable { tried: Vec<(String, ClientError)> },
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("connecting to {addr} took longer than {timeout_ms}ms")]
    ConnectTimeout { addr: String, timeout_ms: u64 },
    /// TLS to the broker failed: its certificate was refused (expired,
    /// another CA, another name), or the broker's port is plaintext.
    #[error("TLS to {addr}: {reason}")]
    Tls { addr: String, reason: String },
    #[error("connection to {addr} closed")]
    ConnectionClosed { addr: String },
    #[error("{api} got no response within {timeout_ms}ms")]
    Timeout { api: &'static str, timeout_ms: u64 },
    /// The call's deadline passed while it was retrying. `part` names what
    /// it was waiting for then (the connection to a broker, a broker's
    /// answer, a quorum, the topic's leader, a metadata lookup); `last` is
    /// the failure of the last attempt.
    #[error(
        "{api}: {part} did not come within the deadline of {timeout_ms}ms ({attempts} attempts); last error: {last}"
    )]
    Deadline {
        api: &'static str,
        part: String,
        timeout_ms: u64,
        attempts: u32,
        last: Box<ClientError>,
    },
    #[error("broker refused {api}: {code}: {message}")]
    Server {
        api: &'static str,
        code: ErrorCode,
        message: String,
        leader_hint: Option<String>,
        retry_after_ms: Option<u32>,
    },
    /// The broker refused the login: final, the same credentials are not
    /// tried again. `retry_after_ms` is the lockout's delay, if any.
    #[error("authentication with {addr} failed: {reason}")]
    Authentication {
        addr: String,
        reason: String,
        retry_after_ms: Option<u32>,
    },
    #[error("the broker at {addr} does not support {api}")]
    Unsupported { addr: String, api: &'static str },
    #[error("too many open connections ({connections_max})")]
    TooManyConnections { connections_max: usize },
    #[error("the subscription ended")]
    SubscriptionEnded,
    /// The runtime cancelled a request's task (it is shutting down).
    #[error("{api} was cancelled before its response")]
    Cancelled { api: &'static str },
    /// A producer gave up: a non-retriable refusal, or records not
    /// acknowledged within the delivery timeout. It takes no more records.
    #[error("{message}")]
    ProduceFailed { message: String },
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// `addr: error; addr: error`, for [`ClientError::Unreachable`]. A
/// connection error already names its address, so it is not said twice.
fn list_failures(tried: &[(String, ClientError)]) -> String {
    let each = tried.iter().map(|(addr, error)| {
        let text = error.to_string();
        if text.contains(addr.as_str()) {
            text
        } else {
            format!("{addr}: {text}")
        }
    });
    each.collect::<Vec<_>>().join("; ")
}

impl ClientError {
    /// The broker's error code, when the broker refused the request.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. } => Some(*code),
            ClientError::Authentication { .. } => Some(ErrorCode::Unauthorized),
            ClientError::Deadline { last, .. } => last.code(),
            _ => None,
        }
    }

    /// Whether sending the request again may succeed. Client-side timeouts
    /// are not retriable: the broker may have applied the request. A
    /// request refused because the connection's token expired is (it wrote
    /// nothing; the next attempt logs in again on a new connection, ADR
    /// 0154).
    pub fn retriable(&self) -> bool {
        match self {
            ClientError::Server { .. } if self.session_expired() => true,
            ClientError::Server { code, .. } => code.retriable(),
            ClientError::Connect { .. }
            | ClientError::ConnectTimeout { .. }
            | ClientError::ConnectionClosed { .. } => true,
            _ => false,
        }
    }

    /// Whether the broker refused the request because the connection's
    /// session ended at its token's expiry (`session-expired`, ADR 0154).
    pub fn session_expired(&self) -> bool {
        matches!(
            self,
            ClientError::Server { code: ErrorCode::Unauthorized, message, .. }
                if crate::auth::session_ended_code(message) == Some(crate::auth::SESSION_EXPIRED)
        )
    }

    /// Whether the broker answered (a refusal is an answer): one that
    /// answers is not paused.
    fn answered(&self) -> bool {
        matches!(self, ClientError::Server { .. })
    }

    fn leader_hint(&self) -> Option<&str> {
        match self {
            ClientError::Server {
                code, leader_hint, ..
            } if code.carries_hint() => leader_hint.as_deref(),
            _ => None,
        }
    }

    fn retry_after_ms(&self) -> Option<u32> {
        match self {
            ClientError::Server { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        }
    }

    /// Whether the broker that gave this answer cannot serve the request
    /// now and does not say who can: the next attempt asks another broker
    /// (an isolated primary answers `no_quorum` while the others fail its
    /// segments over; a broker that is down does not answer at all).
    fn look_elsewhere(&self) -> bool {
        match self {
            ClientError::Connect { .. }
            | ClientError::ConnectTimeout { .. }
            | ClientError::ConnectionClosed { .. } => true,
            ClientError::Server {
                code: ErrorCode::NoQuorum | ErrorCode::ShuttingDown,
                ..
            } => true,
            ClientError::Server {
                code: ErrorCode::NotLeader,
                leader_hint,
                ..
            } => leader_hint.is_none(),
            _ => false,
        }
    }

    /// What a call that failed this way was waiting for, for
    /// [`ClientError::Deadline`].
    fn part(&self, addr: &str) -> String {
        match self {
            ClientError::Connect { addr, .. }
            | ClientError::ConnectTimeout { addr, .. }
            | ClientError::ConnectionClosed { addr } => format!("the connection to {addr}"),
            ClientError::Timeout { .. } => format!("the answer of {addr}"),
            ClientError::Server { code, .. } => match code {
                ErrorCode::NoQuorum => format!("a quorum (no_quorum at {addr})"),
                ErrorCode::NotLeader | ErrorCode::Moved => {
                    format!("the topic's leader ({code} at {addr})")
                }
                _ => format!("a success ({code} at {addr})"),
            },
            ClientError::Deadline { part, .. } => part.clone(),
            _ => format!("an answer of {addr}"),
        }
    }
}

/// Addresses a client remembers (bootstrap, hints, brokers listed by
/// `cluster_status`): the bound of the list it looks through.
const KNOWN_ADDRS_MAX: usize = 256;
/// Per-range routes a client keeps at most; past it they are forgotten
/// together and learned again from the brokers' hints.
const RANGE_ROUTES_MAX: usize = 4_096;
/// How long asking a broker for the cluster's brokers may take.
const DISCOVERY_TIMEOUT_MS: u64 = 1_000;
/// The least time between two such questions.
const DISCOVERY_INTERVAL_MS: u64 = 5_000;

/// The failure a call that ran out of time reports, and the broker it came
/// from: the last one (`error`, at `addr`) if a broker answered it, else
/// the latest refusal a broker answered (a live broker that said why, such
/// as `no_quorum` naming a vnode with no leader, tells more than the
/// brokers that were down or the attempt the deadline cut off), else the
/// last one.
fn telling(
    previous: Vec<(String, ClientError)>,
    addr: String,
    error: ClientError,
) -> (String, ClientError) {
    if matches!(error, ClientError::Server { .. }) {
        return (addr, error);
    }
    previous
        .into_iter()
        .rev()
        .find(|(_, e)| matches!(e, ClientError::Server { .. }))
        .unwrap_or((addr, error))
}

/// How long is left until `deadline`, in milliseconds rounded up (a call
/// that has spent a few microseconds still reports its whole timeout).
fn left_ms(deadline: Instant) -> u64 {
    let left = deadline.saturating_duration_since(Instant::now());
    u64::try_from(left.as_micros().div_ceil(1_000)).unwrap_or(u64::MAX)
}

/// The backoff before retry number `attempt` (1-based): the initial backoff
/// doubled per attempt, at least what the broker asked for, capped at the max.
pub fn backoff_ms(config: &ClientConfig, attempt: u32, retry_after_ms: Option<u32>) -> u64 {
    let doubled = config
        .backoff_initial_ms
        .saturating_mul(1u64 << attempt.saturating_sub(1).min(32));
    doubled
        .max(u64::from(retry_after_ms.unwrap_or(0)))
        .min(config.backoff_max_ms)
}

/// A cheap handle (clone it freely) to a cluster of brokers.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: ClientConfig,
    state: Mutex<RouteState>,
    /// See [`Client::redirects_followed`].
    redirects_followed: AtomicU64,
}

#[derive(Debug, Default)]
struct RouteState {
    connections: HashMap<String, Arc<Connection>>,
    /// Where requests without a known owner go.
    default_addr: String,
    /// The last hinted owner of each topic.
    topics: HashMap<String, String>,
    /// The primary of a topic's range, for the producer, which sends one
    /// range per request: seeded from the topic's range map, refreshed by
    /// hints (ADR 0129, 0142).
    ranges: HashMap<(String, u64), String>,
    /// The client address of each live broker `cluster_status` listed,
    /// by node id: what a range map's primaries are routed to.
    members: HashMap<u64, String>,
    /// Every broker address known, bootstrap first: where a request goes
    /// when the broker it went to cannot serve it and names nobody.
    known: Vec<String>,
    /// When the brokers were last asked for the cluster's brokers.
    discovered_at: Option<Instant>,
    /// Brokers that just let a request time out: hints naming them are
    /// not followed for a while (ADR 0128).
    suspects: Suspects,
}

impl Client {
    /// Connect to the first reachable broker of `addrs` with the default config.
    pub async fn connect<I, S>(addrs: I) -> Result<Client, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Client::connect_with(addrs, ClientConfig::default()).await
    }

    /// Connect to the first reachable broker of `addrs` (the bootstrap
    /// brokers, at most `bootstrap_brokers_max`; see [`bootstrap`]), all
    /// tried within `request_timeout_ms`, negotiating versions with
    /// `api_versions` first.
    pub async fn connect_with<I, S>(addrs: I, config: ClientConfig) -> Result<Client, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let bootstrap = bootstrap::bootstrap_list(addrs, config.bootstrap_brokers_max)?;
        let first = bootstrap.first().cloned().ok_or(ClientError::NoAddress)?;
        let deadline = Instant::now() + Duration::from_millis(config.request_timeout_ms);
        let client = Client {
            inner: Arc::new(Inner {
                config,
                state: Mutex::new(RouteState {
                    default_addr: first,
                    ..RouteState::default()
                }),
                redirects_followed: AtomicU64::new(0),
            }),
        };
        for addr in &bootstrap {
            client.learn(addr);
        }
        client.bootstrap(&bootstrap, deadline).await?;
        Ok(client)
    }

    /// The client's limits.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    fn state(&self) -> MutexGuard<'_, RouteState> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn addr_for(&self, topic: Option<&str>) -> String {
        let state = self.state();
        topic
            .and_then(|t| state.topics.get(t))
            .unwrap_or(&state.default_addr)
            .clone()
    }

    /// Where parts of one range of `topic` go: the broker last hinted for
    /// that range, else the topic's. A topic's ranges may have different
    /// primaries; routing the whole topic to one broker bounced the
    /// producer between them (issue 36).
    fn addr_for_range(&self, topic: &str, range: u64) -> String {
        let state = self.state();
        state
            .ranges
            .get(&(topic.to_owned(), range))
            .or_else(|| state.topics.get(topic))
            .unwrap_or(&state.default_addr)
            .clone()
    }

    /// Remembers where `range` of `topic` is written; the routes kept are
    /// bounded (`RANGE_ROUTES_MAX`): past it, the topic's route serves.
    fn remember_range(&self, topic: &str, range: u64, addr: &str) {
        let mut state = self.state();
        let key = (topic.to_owned(), range);
        if state.ranges.len() >= RANGE_ROUTES_MAX && !state.ranges.contains_key(&key) {
            state.ranges.clear();
        }
        state.ranges.insert(key, addr.to_owned());
        debug_assert!(state.ranges.len() <= RANGE_ROUTES_MAX);
    }

    /// The open connection to `addr`, opening and negotiating it before
    /// `deadline` if needed.
    async fn connection_until(
        &self,
        addr: &str,
        deadline: Instant,
    ) -> Result<Arc<Connection>, ClientError> {
        {
            let mut state = self.state();
            if let Some(existing) = state.connections.get(addr) {
                if existing.usable() {
                    return Ok(existing.clone());
                }
                // Closed, or its session ended: calls already on it finish
                // there, new ones go on a new connection, logged in afresh.
                state.connections.remove(addr);
            }
            if state.connections.len() >= self.inner.config.connections_max {
                return Err(ClientError::TooManyConnections {
                    connections_max: self.inner.config.connections_max,
                });
            }
        }
        let config = &self.inner.config;
        let connect_timeout_ms = config.connect_timeout_ms.min(left_ms(deadline));
        let connection = Arc::new(Connection::open(addr, config, connect_timeout_ms).await?);
        let negotiate_timeout_ms = config.request_timeout_ms.min(left_ms(deadline));
        self.negotiate(&connection, negotiate_timeout_ms).await?;
        let lifetime_ms = self
            .login(
                &connection,
                config.request_timeout_ms.min(left_ms(deadline)),
            )
            .await?;
        if let Some(lifetime_ms) = lifetime_ms {
            connection.set_session_lifetime(lifetime_ms);
        }
        info!(addr = %addr, "connected to broker");
        let mut state = self.state();
        // Another task may have connected meanwhile; keep the first one.
        let kept = state
            .connections
            .entry(addr.to_owned())
            .or_insert(connection)
            .clone();
        Ok(kept)
    }

    /// `api_versions` first on every connection; keys with no common version
    /// are then refused locally with [`ClientError::Unsupported`].
    async fn negotiate(&self, connection: &Connection, timeout_ms: u64) -> Result<(), ClientError> {
        let request = ApiVersionsRequest {
            client_name: self.inner.config.client_name.clone(),
            versions: ApiVersion::supported(),
        };
        let payload = request.encode()?;
        let response: ApiVersionsResponse = self
            .exchange_payload::<ApiVersionsRequest>(connection, payload, timeout_ms)
            .await?;
        let mut unsupported = Vec::new();
        for ours in ApiVersion::supported() {
            let theirs = response
                .versions
                .iter()
                .find(|v| v.api_key == ours.api_key)
                .copied();
            let agreed = theirs.and_then(|theirs| ApiVersion::negotiate(ours, theirs));
            if agreed.is_none() {
                // Not fatal: a broker may not offer every operation (e.g. an
                // older one); calls to that key are refused locally.
                debug!(
                    addr = connection.addr(),
                    api_key = ours.api_key,
                    "no common version"
                );
                unsupported.push(ours.api_key);
            }
        }
        connection.set_unsupported(unsupported);
        Ok(())
    }

    /// One attempt of one request on one connection, within `timeout_ms`.
    async fn exchange_payload<O: Operation>(
        &self,
        connection: &Connection,
        payload: Bytes,
        timeout_ms: u64,
    ) -> Result<O::Response, ClientError> {
        let frame = connection.call(O::API_KEY, payload, timeout_ms).await?;
        decode_response::<O>(frame.error_code, frame.payload, connection.addr())
    }

    /// One attempt at `addr`, connecting first if needed, before `deadline`.
    async fn attempt<O: Operation>(
        &self,
        addr: &str,
        payload: Bytes,
        deadline: Instant,
    ) -> Result<O::Response, ClientError> {
        let connection = self.connection_until(addr, deadline).await?;
        let timeout_ms = self.inner.config.request_timeout_ms.min(left_ms(deadline));
        self.exchange_payload::<O>(&connection, payload, timeout_ms)
            .await
    }

    /// Send any request, with routing, retries and hint following. `topic`
    /// names the topic the request concerns, so hints are remembered per
    /// topic. The whole call, retries included, takes at most
    /// `request_timeout_ms`.
    pub async fn call<O: Operation>(
        &self,
        topic: Option<&str>,
        request: &O,
    ) -> Result<O::Response, ClientError> {
        let deadline = Instant::now() + Duration::from_millis(self.inner.config.request_timeout_ms);
        self.call_until(topic, request, deadline).await
    }

    /// [`Client::call`], done or given up by `deadline`: retries stop when
    /// the next one could not start before it, and the last attempt's wait
    /// for an answer ends at it.
    pub async fn call_until<O: Operation>(
        &self,
        topic: Option<&str>,
        request: &O,
        deadline: Instant,
    ) -> Result<O::Response, ClientError> {
        let payload = request.encode()?;
        let config = &self.inner.config;
        let api = O::API_KEY.name();
        let mut addr = self.addr_for(topic);
        let mut attempt: u32 = 0;
        // Attempts that asked again because the hint named a suspect; not
        // counted in `attempt`, bounded by the suspicion's length.
        let mut polls: u64 = 0;
        // The last failure at each broker tried (one entry per known
        // broker at most): when an attempt is cut off by the deadline,
        // that broker's earlier refusal is what the call was waiting out.
        let mut previous: Vec<(String, ClientError)> = Vec::new();
        loop {
            let result = self.attempt::<O>(&addr, payload.clone(), deadline).await;
            if result.as_ref().map_or_else(ClientError::answered, |_| true) {
                self.acquit(&addr);
            }
            let error = match result {
                Ok(response) => return Ok(response),
                Err(error) if error.retriable() && attempt < config.retries_max => error,
                Err(error @ ClientError::Timeout { .. }) => {
                    // Not retried (the broker may have applied it), but the
                    // next call of this topic goes to another broker: a
                    // paused or cut-off primary holds its connections open
                    // and answers nothing, and a client that stayed with it
                    // waited out the whole pause (issue 36). The other
                    // broker sends it on to the new primary once the segment
                    // failed over, or back here until then.
                    self.route_away(topic, &addr);
                    if attempt == 0 {
                        return Err(error);
                    }
                    let (at, last) = telling(previous, addr, error);
                    return Err(self.deadline_error(api, &at, last, attempt + 1));
                }
                Err(error) => return Err(error),
            };
            let failed_at = addr.clone();
            if let Some(hint) = error.leader_hint()
                && self.suspected(hint)
            {
                // The broker that answered still names one that just let
                // a request time out: its failover is not recorded yet.
                // Ask the answering broker again rather than wait out a
                // second timeout at the silent one (ADR 0128).
                polls += 1;
                assert!(
                    polls <= SUSPECT_MS / SUSPECT_POLL_MS + 2,
                    "suspect polls bounded"
                );
                debug!(api, at = %addr, hint = %hint, polls, "the hint names a suspected broker");
                if Instant::now() + Duration::from_millis(SUSPECT_POLL_MS) >= deadline {
                    let (at, last) = telling(previous, failed_at, error);
                    return Err(self.deadline_error(api, &at, last, attempt + 1));
                }
                tokio::time::sleep(Duration::from_millis(SUSPECT_POLL_MS)).await;
                continue;
            }
            attempt += 1;
            let follow_at_once = if let Some(hint) = error.leader_hint() {
                // A hint is fresh routing information: follow it at once.
                debug!(api, from = %addr, to = %hint, attempt, "following hint");
                self.note_redirect();
                addr = hint.to_owned();
                self.learn(&addr);
                self.remember(topic, &addr);
                attempt == 1
            } else {
                if error.look_elsewhere() {
                    let next = self.elsewhere(&addr, deadline).await;
                    debug!(api, from = %addr, to = %next, %error, "asking another broker");
                    addr = next;
                    self.remember(topic, &addr);
                }
                false
            };
            let wait_ms = if follow_at_once {
                0
            } else {
                backoff_ms(config, attempt, error.retry_after_ms())
            };
            if Instant::now() + Duration::from_millis(wait_ms) >= deadline {
                let (at, last) = telling(previous, failed_at, error);
                return Err(self.deadline_error(api, &at, last, attempt));
            }
            debug!(api, %error, attempt, wait_ms, "retrying");
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
            previous.retain(|(at, _)| *at != failed_at);
            if previous.len() < KNOWN_ADDRS_MAX {
                previous.push((failed_at, error));
            }
        }
    }

    /// The error of a call whose deadline passed after `attempts` attempts
    /// ending with `last` (at `addr`).
    fn deadline_error(
        &self,
        api: &'static str,
        addr: &str,
        last: ClientError,
        attempts: u32,
    ) -> ClientError {
        ClientError::Deadline {
            api,
            part: last.part(addr),
            timeout_ms: self.inner.config.request_timeout_ms,
            attempts,
            last: Box::new(last),
        }
    }

    /// `addr` let a request time out: suspects it, and routes `topic`'s
    /// next call to the next broker this client knows after `addr`, if it
    /// knows another.
    fn route_away(&self, topic: Option<&str>, addr: &str) {
        self.suspect(addr);
        let next = self.next_known(addr);
        if next != addr {
            debug!(from = %addr, to = %next, "no timely answer; the next call goes elsewhere");
            self.remember(topic, &next);
        }
    }

    /// `addr` let a request time out (ADR 0128).
    fn suspect(&self, addr: &str) {
        self.state().suspects.suspect(addr, Instant::now());
    }

    /// Whether a hint naming `addr` is not to be followed now (ADR 0128).
    fn suspected(&self, addr: &str) -> bool {
        self.state().suspects.suspected(addr, Instant::now())
    }

    /// `addr` answered something: it is not paused.
    fn acquit(&self, addr: &str) {
        self.state().suspects.acquit(addr);
    }

    fn remember(&self, topic: Option<&str>, addr: &str) {
        let mut state = self.state();
        match topic {
            Some(topic) => {
                // Bounded: one entry per topic this client touched.
                state.topics.insert(topic.to_owned(), addr.to_owned());
            }
            None => state.default_addr = addr.to_owned(),
        }
    }

    /// Adds `addr` to the brokers this client knows (at most
    /// `KNOWN_ADDRS_MAX`; the bootstrap addresses come first).
    fn learn(&self, addr: &str) {
        let mut state = self.state();
        if state.known.len() < KNOWN_ADDRS_MAX && !state.known.iter().any(|a| a == addr) {
            state.known.push(addr.to_owned());
        }
    }

    /// The known broker after `addr` (round robin), for a broker that
    /// cannot serve a request and names nobody who can. A client that
    /// knows no other asks `addr` (or any broker it is connected to) for
    /// the cluster's brokers first, at most every `DISCOVERY_INTERVAL_MS`.
    async fn elsewhere(&self, addr: &str, deadline: Instant) -> String {
        if self.state().known.iter().all(|a| a == addr) {
            self.discover(addr, deadline).await;
        }
        self.next_known(addr)
    }

    /// Learns the client addresses of the brokers `cluster_status` lists
    /// (see [`Client::ask_members`]), at most every `DISCOVERY_INTERVAL_MS`.
    async fn discover(&self, addr: &str, deadline: Instant) {
        {
            let mut state = self.state();
            let now = Instant::now();
            if state.discovered_at.is_some_and(|at| {
                now.saturating_duration_since(at) < Duration::from_millis(DISCOVERY_INTERVAL_MS)
            }) {
                return;
            }
            state.discovered_at = Some(now);
        }
        self.ask_members(Some(addr), deadline).await;
    }

    /// The known broker after `addr`, without asking for more: for a
    /// connection that failed (nothing to ask).
    fn next_known(&self, addr: &str) -> String {
        let state = self.state();
        let known = &state.known;
        let next = known
            .iter()
            .position(|a| a == addr)
            .map_or(0, |i| (i + 1) % known.len().max(1));
        known.get(next).cloned().unwrap_or_else(|| addr.to_owned())
    }

    // ------------------------------------------------------------ operations

    /// The answering broker's supported versions.
    pub async fn api_versions(&self) -> Result<ApiVersionsResponse, ClientError> {
        let request = ApiVersionsRequest {
            client_name: self.inner.config.client_name.clone(),
            versions: ApiVersion::supported(),
        };
        self.call(None, &request).await
    }

    pub async fn create_topic(
        &self,
        name: &str,
        replication_factor: Option<u8>,
        policy: Option<String>,
    ) -> Result<CreateTopicResponse, ClientError> {
        let request = CreateTopicRequest {
            name: name.to_owned(),
            replication_factor,
            policy,
        };
        self.call(Some(name), &request).await
    }

    pub async fn delete_topic(&self, name: &str) -> Result<DeleteTopicResponse, ClientError> {
        let request = DeleteTopicRequest {
            name: name.to_owned(),
        };
        self.call(Some(name), &request).await
    }

    /// Defines or redefines a storage policy (ADR 0115).
    pub async fn put_policy(
        &self,
        policy: PolicyDescription,
    ) -> Result<PutPolicyResponse, ClientError> {
        self.call(None, &PutPolicyRequest { policy }).await
    }

    /// The cluster's storage policies, or the one named.
    pub async fn list_policies(
        &self,
        name: Option<&str>,
    ) -> Result<ListPoliciesResponse, ClientError> {
        let request = ListPoliciesRequest {
            name: name.map(str::to_owned),
        };
        self.call(None, &request).await
    }

    /// Removes a storage policy definition.
    pub async fn delete_policy(&self, name: &str) -> Result<DeletePolicyResponse, ClientError> {
        let request = DeletePolicyRequest {
            name: name.to_owned(),
        };
        self.call(None, &request).await
    }

    pub async fn list_topics(&self) -> Result<ListTopicsResponse, ClientError> {
        self.call(None, &ListTopicsRequest {}).await
    }

    /// The topic's metadata: its ranges and segments (what a producer
    /// routes by).
    pub async fn describe_topic(&self, name: &str) -> Result<TopicDescription, ClientError> {
        let request = DescribeTopicRequest {
            name: name.to_owned(),
            live: false,
        };
        Ok(self.call(Some(name), &request).await?.topic)
    }

    /// The topic's metadata and the live figures of its active segments:
    /// the committed end and each copy's durable end, asked by the
    /// answering broker of the brokers holding the copies (ADR 0098).
    pub async fn describe_topic_live(&self, name: &str) -> Result<TopicDescription, ClientError> {
        let request = DescribeTopicRequest {
            name: name.to_owned(),
            live: true,
        };
        Ok(self.call(Some(name), &request).await?.topic)
    }

    pub async fn split_range(
        &self,
        topic: &str,
        range_id: u64,
    ) -> Result<SplitRangeResponse, ClientError> {
        let request = SplitRangeRequest {
            topic: topic.to_owned(),
            range_id,
        };
        self.call(Some(topic), &request).await
    }

    /// Merge `range_id` with its buddy.
    pub async fn merge_range(
        &self,
        topic: &str,
        range_id: u64,
    ) -> Result<MergeRangeResponse, ClientError> {
        let request = MergeRangeRequest {
            topic: topic.to_owned(),
            range_id,
        };
        self.call(Some(topic), &request).await
    }

    /// Append one batch and wait for its acknowledgement. Call it from many
    /// tasks (or use [`Client::producer`]) to keep several in flight.
    pub async fn produce(
        &self,
        topic: &str,
        records: RecordBatch,
    ) -> Result<ProduceResponse, ClientError> {
        let request = ProduceRequest {
            topic: topic.to_owned(),
            producer: None,
            records,
        };
        self.call(Some(topic), &request).await
    }

    /// One fetch, as is.
    pub async fn fetch(&self, request: &FetchRequest) -> Result<FetchResponse, ClientError> {
        self.call(Some(&request.topic), request).await
    }

    /// The live supervision tree of the answering broker.
    pub async fn tree_snapshot(&self) -> Result<TreeSnapshotResponse, ClientError> {
        self.call(None, &TreeSnapshotRequest::default()).await
    }

    pub async fn cluster_status(&self) -> Result<ClusterStatusResponse, ClientError> {
        self.call(None, &ClusterStatusRequest {}).await
    }

    /// The ring the answering broker routes by.
    pub async fn vnode_list(&self) -> Result<VnodeListResponse, ClientError> {
        self.call(None, &VnodeListRequest {}).await
    }

    /// Splits `vnode` in two (any broker runs it). Repeating the request
    /// resumes a split an earlier one left unfinished.
    pub async fn vnode_split(&self, vnode: u32) -> Result<VnodeSplitResponse, ClientError> {
        self.call(None, &VnodeSplitRequest { vnode }).await
    }

    /// The cluster's members and where their vnode replicas are, after the
    /// change `request` asks for, if any (ADR 0104).
    pub async fn cluster_members(
        &self,
        request: ClusterMembersRequest,
    ) -> Result<ClusterMembersResponse, ClientError> {
        self.call(None, &request).await
    }

    /// The cluster's versions and feature states, after the activation or
    /// finalize `request` asks for, if any (ADR 0134).
    pub async fn features(
        &self,
        request: FeaturesRequest,
    ) -> Result<FeaturesResponse, ClientError> {
        self.call(None, &request).await
    }

    /// An ordered, idempotent producer with a fresh identity, keeping up to
    /// `window_requests_max` produce requests in flight.
    pub fn producer(&self, topic: &str, window_requests_max: usize) -> Producer {
        self.producer_as(topic, window_requests_max, ProducerIdentity::fresh())
    }

    /// A producer with the given identity: a new session of a named
    /// producer fences the older one (ADR 0092).
    pub fn producer_as(
        &self,
        topic: &str,
        window_requests_max: usize,
        identity: ProducerIdentity,
    ) -> Producer {
        Producer::new(
            self.clone(),
            topic.to_owned(),
            window_requests_max,
            identity,
        )
    }

    /// Read a topic as a sequence of records that carries its resume cursor.
    pub fn consume(&self, topic: &str, start: StartAt, options: ConsumeOptions) -> Consumer {
        Consumer::new(self.clone(), topic.to_owned(), start, options)
    }

    /// Open a push subscription with an initial credit. Waits for the
    /// broker's first push (its acceptance), following hints and retrying
    /// retriable refusals like any request.
    pub async fn subscribe(
        &self,
        topic: &str,
        start: StartAt,
        credit_records: u32,
        credit_bytes: u32,
    ) -> Result<Subscription, ClientError> {
        let (cursor, from_start) = start.into_fields();
        let request = SubscribeRequest {
            topic: topic.to_owned(),
            cursor,
            from_start,
            credit_records,
            credit_bytes,
        };
        let payload = request.encode()?;
        let config = &self.inner.config;
        let deadline = Instant::now() + Duration::from_millis(config.request_timeout_ms);
        let mut addr = self.addr_for(Some(topic));
        let mut attempt = 0;
        loop {
            let result = match self.connection_until(&addr, deadline).await {
                Ok(connection) => Subscription::open(connection, payload.clone(), config).await,
                Err(error) => Err(error),
            };
            let error = match result {
                Ok(subscription) => return Ok(subscription),
                Err(error) if error.retriable() && attempt < config.retries_max => error,
                Err(error) => return Err(error),
            };
            attempt += 1;
            if let Some(hint) = error.leader_hint() {
                self.note_redirect();
                addr = hint.to_owned();
                self.learn(&addr);
                self.remember(Some(topic), &addr);
            } else if error.look_elsewhere() {
                addr = self.elsewhere(&addr, deadline).await;
                self.remember(Some(topic), &addr);
            }
            let wait_ms = backoff_ms(config, attempt, error.retry_after_ms());
            if Instant::now() + Duration::from_millis(wait_ms) >= deadline {
                return Err(self.deadline_error("subscribe", &addr, error, attempt));
            }
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        }
    }
}

/// Turn a response frame into the operation's response or a typed refusal.
pub(crate) fn decode_response<O: Operation>(
    code: ErrorCode,
    payload: Bytes,
    addr: &str,
) -> Result<O::Response, ClientError> {
    if code == ErrorCode::None {
        return Ok(O::Response::decode(payload)?);
    }
    if code == ErrorCode::UnsupportedApi || code == ErrorCode::UnsupportedVersion {
        return Err(ClientError::Unsupported {
            addr: addr.to_owned(),
            api: O::API_KEY.name(),
        });
    }
    // A body that does not decode still leaves a typed code to act on.
    let body = ErrorBody::decode(payload).unwrap_or_default();
    Err(ClientError::Server {
        api: O::API_KEY.name(),
        code,
        message: body.message,
        leader_hint: body.leader_hint,
        retry_after_ms: body.retry_after_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_initial_value_and_stops_at_the_max() {
        let config = ClientConfig {
            backoff_initial_ms: 10,
            backoff_max_ms: 100,
            ..ClientConfig::default()
        };
        assert_eq!(backoff_ms(&config, 1, None), 10);
        assert_eq!(backoff_ms(&config, 2, None), 20);
        assert_eq!(backoff_ms(&config, 4, None), 80);
        assert_eq!(backoff_ms(&config, 5, None), 100);
        assert_eq!(backoff_ms(&config, 60, None), 100);
    }

    #[test]
    fn a_brokers_retry_after_lengthens_the_backoff_within_the_max() {
        let config = ClientConfig {
            backoff_initial_ms: 10,
            backoff_max_ms: 100,
            ..ClientConfig::default()
        };
        assert_eq!(backoff_ms(&config, 1, Some(50)), 50);
        assert_eq!(backoff_ms(&config, 1, Some(5_000)), 100);
    }

    #[test]
    fn an_error_response_decodes_to_a_typed_server_error_with_its_hint() {
        let body = ErrorBody {
            message: "not the leader".into(),
            leader_hint: Some("10.0.0.2:4040".into()),
            retry_after_ms: None,
            ranges: None,
        };
        let err =
            decode_response::<FetchRequest>(ErrorCode::NotLeader, body.encode().unwrap(), "a")
                .unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::NotLeader));
        assert!(err.retriable());
        assert_eq!(err.leader_hint(), Some("10.0.0.2:4040"));
    }

    #[test]
    fn only_an_expired_session_makes_an_unauthorized_answer_retriable() {
        let refusal = |message: &str| {
            let body = ErrorBody {
                message: message.into(),
                ..ErrorBody::default()
            };
            decode_response::<FetchRequest>(ErrorCode::Unauthorized, body.encode().unwrap(), "a")
                .unwrap_err()
        };
        let expired = refusal("session-expired: the token expired at 1 ms (now 2 ms, skew 0 ms)");
        assert!(expired.session_expired());
        assert!(expired.retriable());
        for final_one in [
            "principal-removed: user \"bob\" was deleted; this connection's session is over",
            "credential-changed: the password of user \"bob\" changed",
            "issuer-key-removed: the issuer key \"k1\" that verified this session's token was removed",
            "User:bob may not consume topic `t`: no entry allows it",
            "authentication failed: token-expired: expired at 1 ms",
        ] {
            let refused = refusal(final_one);
            assert!(!refused.session_expired(), "{final_one}");
            assert!(!refused.retriable(), "{final_one}");
        }
    }

    #[test]
    fn an_undecodable_error_body_still_gives_the_typed_code() {
        let err = decode_response::<FetchRequest>(
            ErrorCode::InvalidCursor,
            Bytes::from_static(b"\xc1garbage"),
            "a",
        )
        .unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::InvalidCursor));
        assert!(!err.retriable());
    }
}
