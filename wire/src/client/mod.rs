//! The async client: connect to any broker, pipeline requests by correlation
//! id within a bounded window, retry retriable errors with bounded
//! exponential backoff, follow `not_leader` and `moved` hints, and time out
//! cleanly.
//!
//! Delivery: a retried request may have been applied by the broker before the
//! failure was seen (a lost connection, a `timeout` code), so `produce` is
//! at-least-once under retries until idempotent produce (the reserved
//! `producer` sequence) is implemented. A client-side timeout is never
//! retried: it is returned as [`ClientError::Timeout`] and the late response,
//! if it ever arrives, is dropped.

mod connection;
mod producer;
mod stream;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tracing::{debug, info};

use crate::batch::RecordBatch;
use crate::error::{ErrorBody, ErrorCode, WireError};
use crate::frame::FRAME_BYTES_MAX_DEFAULT;
use crate::messages::*;
use connection::Connection;
pub use producer::{ProduceAck, Producer, ProducerIdentity};
pub use stream::{
    ConsumeOptions, ConsumedRecord, Consumer, StartAt, Subscription, SubscriptionBatch,
};

/// The client's limits. Every field is a bound; units are in the names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// A free-form name sent in `api_versions`.
    pub client_name: String,
    /// How long one attempt of one request may take, window wait included.
    pub request_timeout_ms: u64,
    /// How long opening a TCP connection may take.
    pub connect_timeout_ms: u64,
    /// Requests awaiting a response on one connection (the window).
    pub inflight_requests_max: usize,
    /// Retries after the first attempt, for retriable errors.
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
        }
    }
}

/// What a client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no broker address given")]
    NoAddress,
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("connecting to {addr} took longer than {timeout_ms}ms")]
    ConnectTimeout { addr: String, timeout_ms: u64 },
    #[error("connection to {addr} closed")]
    ConnectionClosed { addr: String },
    #[error("{api} got no response within {timeout_ms}ms")]
    Timeout { api: &'static str, timeout_ms: u64 },
    #[error("broker refused {api}: {code}: {message}")]
    Server {
        api: &'static str,
        code: ErrorCode,
        message: String,
        leader_hint: Option<String>,
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

impl ClientError {
    /// The broker's error code, when the broker refused the request.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether sending the request again may succeed. Client-side timeouts
    /// are not retriable: the broker may have applied the request.
    pub fn retriable(&self) -> bool {
        match self {
            ClientError::Server { code, .. } => code.retriable(),
            ClientError::Connect { .. }
            | ClientError::ConnectTimeout { .. }
            | ClientError::ConnectionClosed { .. } => true,
            _ => false,
        }
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
    bootstrap: Vec<String>,
    state: Mutex<RouteState>,
}

#[derive(Debug, Default)]
struct RouteState {
    connections: HashMap<String, Arc<Connection>>,
    /// Where requests without a known owner go.
    default_addr: String,
    /// The last hinted owner of each topic.
    topics: HashMap<String, String>,
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

    /// Connect to the first reachable broker of `addrs`, negotiating versions
    /// with `api_versions` first.
    pub async fn connect_with<I, S>(addrs: I, config: ClientConfig) -> Result<Client, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let bootstrap: Vec<String> = addrs.into_iter().map(Into::into).collect();
        let first = bootstrap.first().cloned().ok_or(ClientError::NoAddress)?;
        let client = Client {
            inner: Arc::new(Inner {
                config,
                bootstrap: bootstrap.clone(),
                state: Mutex::new(RouteState {
                    default_addr: first,
                    ..RouteState::default()
                }),
            }),
        };
        let mut last_error = ClientError::NoAddress;
        for addr in &bootstrap {
            match client.connection(addr).await {
                Ok(_) => {
                    client.state().default_addr = addr.clone();
                    return Ok(client);
                }
                Err(error) => {
                    debug!(addr = %addr, %error, "bootstrap broker unreachable");
                    last_error = error;
                }
            }
        }
        Err(last_error)
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

    /// The open connection to `addr`, opening (and negotiating) it if needed.
    async fn connection(&self, addr: &str) -> Result<Arc<Connection>, ClientError> {
        {
            let mut state = self.state();
            if let Some(existing) = state.connections.get(addr) {
                if !existing.is_closed() {
                    return Ok(existing.clone());
                }
                state.connections.remove(addr);
            }
            if state.connections.len() >= self.inner.config.connections_max {
                return Err(ClientError::TooManyConnections {
                    connections_max: self.inner.config.connections_max,
                });
            }
        }
        let connection = Arc::new(Connection::open(addr, &self.inner.config).await?);
        self.negotiate(&connection).await?;
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
    async fn negotiate(&self, connection: &Connection) -> Result<(), ClientError> {
        let request = ApiVersionsRequest {
            client_name: self.inner.config.client_name.clone(),
            versions: ApiVersion::supported(),
        };
        let response: ApiVersionsResponse = self.exchange(connection, &request).await?;
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

    /// One attempt of one request on one connection.
    async fn exchange<O: Operation>(
        &self,
        connection: &Connection,
        request: &O,
    ) -> Result<O::Response, ClientError> {
        let payload = request.encode()?;
        self.exchange_payload::<O>(connection, payload).await
    }

    async fn exchange_payload<O: Operation>(
        &self,
        connection: &Connection,
        payload: Bytes,
    ) -> Result<O::Response, ClientError> {
        let frame = connection
            .call(O::API_KEY, payload, self.inner.config.request_timeout_ms)
            .await?;
        decode_response::<O>(frame.error_code, frame.payload, connection.addr())
    }

    /// Send any request, with routing, retries and hint following. `topic`
    /// names the topic the request concerns, so hints are remembered per topic.
    pub async fn call<O: Operation>(
        &self,
        topic: Option<&str>,
        request: &O,
    ) -> Result<O::Response, ClientError> {
        let payload = request.encode()?;
        let config = &self.inner.config;
        let mut addr = self.addr_for(topic);
        let mut attempt: u32 = 0;
        loop {
            let result = match self.connection(&addr).await {
                Ok(connection) => {
                    self.exchange_payload::<O>(&connection, payload.clone())
                        .await
                }
                Err(error) => Err(error),
            };
            let error = match result {
                Ok(response) => return Ok(response),
                Err(error) if error.retriable() && attempt < config.retries_max => error,
                Err(error) => return Err(error),
            };
            attempt += 1;
            if let Some(hint) = error.leader_hint() {
                // A hint is fresh routing information: follow it at once.
                debug!(api = O::API_KEY.name(), from = %addr, to = %hint, attempt, "following hint");
                addr = hint.to_owned();
                self.remember(topic, &addr);
                if attempt == 1 {
                    continue;
                }
            } else if matches!(
                error,
                ClientError::Connect { .. }
                    | ClientError::ConnectTimeout { .. }
                    | ClientError::ConnectionClosed { .. }
            ) {
                addr = self.next_bootstrap(&addr);
                self.remember(topic, &addr);
            }
            let wait_ms = backoff_ms(config, attempt, error.retry_after_ms());
            debug!(api = O::API_KEY.name(), %error, attempt, wait_ms, "retrying");
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        }
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

    /// The bootstrap address after `addr` (round robin), for a broker that went away.
    fn next_bootstrap(&self, addr: &str) -> String {
        let bootstrap = &self.inner.bootstrap;
        let next = bootstrap
            .iter()
            .position(|a| a == addr)
            .map_or(0, |i| (i + 1) % bootstrap.len());
        bootstrap
            .get(next)
            .cloned()
            .unwrap_or_else(|| addr.to_owned())
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
        let mut addr = self.addr_for(Some(topic));
        let mut attempt = 0;
        loop {
            let result = match self.connection(&addr).await {
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
                addr = hint.to_owned();
                self.remember(Some(topic), &addr);
            }
            let wait_ms = backoff_ms(config, attempt, error.retry_after_ms());
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
