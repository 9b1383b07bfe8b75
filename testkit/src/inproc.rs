//! In-process brokers, for the broker's own tests (`actors/tests/`): start
//! N of them, a tiny test client over the wire's frame codec, and the reads
//! and keyed batches the tests compare.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use malachi_actors::{Broker, BrokerConfig, BrokerHandle};
use malachi_wire::batch::{BatchBuilder, Record};
use malachi_wire::messages::*;
use malachi_wire::{ClientCodec, ErrorBody, ErrorCode, Message, RequestFrame, ResponseFrame};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

use crate::wait::eventually;

/// A client of one broker, speaking the frame codec request by request.
#[derive(Debug)]
pub struct TestClient {
    pub framed: Framed<TcpStream, ClientCodec>,
    next_id: u32,
}

/// A request the broker refused: its error code and message.
#[derive(Debug)]
pub struct Refused {
    pub code: ErrorCode,
    pub message: String,
}

impl TestClient {
    pub async fn connect(addr: SocketAddr) -> TestClient {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        TestClient {
            framed: Framed::new(stream, ClientCodec::default()),
            next_id: 1,
        }
    }

    /// A client whose socket is bound to `local_ip` (say `127.0.0.2`), so
    /// the broker sees it come from that address.
    pub async fn connect_from(addr: SocketAddr, local_ip: std::net::IpAddr) -> TestClient {
        let stream = tcp_from(addr, local_ip).await.unwrap();
        stream.set_nodelay(true).unwrap();
        TestClient {
            framed: Framed::new(stream, ClientCodec::default()),
            next_id: 1,
        }
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.framed.get_ref().local_addr().unwrap()
    }

    pub async fn send_raw(&mut self, api_key: u16, payload: Bytes) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        self.framed
            .send(RequestFrame {
                api_key,
                correlation_id: id,
                payload,
            })
            .await
            .unwrap();
        id
    }

    pub async fn recv(&mut self) -> Option<ResponseFrame> {
        tokio::time::timeout(Duration::from_secs(20), self.framed.next())
            .await
            .expect("no response within 20 s")
            .and_then(|r| r.ok())
    }

    pub async fn next_frame(&mut self) -> Option<ResponseFrame> {
        self.framed.next().await.and_then(|r| r.ok())
    }

    pub async fn call<Op: Operation>(&mut self, request: &Op) -> Result<Op::Response, Refused> {
        let id = self
            .send_raw(Op::API_KEY.code(), request.encode().unwrap())
            .await;
        let frame = self.recv().await.expect("connection closed");
        assert_eq!(frame.correlation_id, id);
        decode::<Op>(frame)
    }

    pub async fn create_topic(&mut self, name: &str) -> u64 {
        self.call(&CreateTopicRequest {
            name: name.into(),
            replication_factor: None,
            policy: None,
        })
        .await
        .unwrap()
        .incarnation
    }

    pub async fn produce(&mut self, topic: &str, records: &[Record]) -> Result<u32, Refused> {
        self.call(&produce_request(topic, records))
            .await
            .map(|r| r.records_acknowledged)
    }

    pub async fn fetch(
        &mut self,
        topic: &str,
        cursor: Option<String>,
        from_start: bool,
        records_max: u32,
        wait_ms: u32,
    ) -> Result<(Vec<Record>, String), Refused> {
        let response = self
            .call(&FetchRequest {
                topic: topic.into(),
                cursor,
                from_start,
                records_max,
                bytes_max: 8 << 20,
                wait_ms,
            })
            .await?;
        Ok((response.records.records(), response.next_cursor))
    }
}

/// A TCP connection to `addr` from `local_ip` (any port): on loopback, a
/// test plays several client hosts with `127.0.0.2`, `127.0.0.3`, ...
pub async fn tcp_from(addr: SocketAddr, local_ip: std::net::IpAddr) -> std::io::Result<TcpStream> {
    let socket = match local_ip {
        std::net::IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(local_ip, 0))?;
    socket.connect(addr).await
}

/// Creates `topic` with `replication_factor` copies through the broker at
/// `addr`, retrying for up to 30 s while a new cluster settles; panics if
/// it never succeeds.
pub async fn create_replicated_topic(addr: SocketAddr, topic: &str, replication_factor: u8) {
    let mut admin = TestClient::connect(addr).await;
    assert!(
        eventually(30_000, async || {
            admin
                .call(&CreateTopicRequest {
                    name: topic.into(),
                    replication_factor: Some(replication_factor),
                    policy: None,
                })
                .await
                .is_ok()
        })
        .await,
        "the topic {topic} was never created"
    );
}

/// `topic` as a describe without live figures shows it.
pub async fn describe(client: &mut TestClient, topic: &str) -> Result<TopicDescription, Refused> {
    client
        .call(&DescribeTopicRequest {
            name: topic.into(),
            live: false,
        })
        .await
        .map(|d| d.topic)
}

/// The ids of `topic`'s active ranges, in the order the topic lists them.
pub async fn active_ranges(client: &mut TestClient, topic: &str) -> Vec<u64> {
    describe(client, topic)
        .await
        .unwrap()
        .ranges
        .iter()
        .filter(|r| r.state == "active")
        .map(|r| r.id)
        .collect()
}

/// Every segment of `topic`, range by range, each range's in order.
pub async fn segments(
    client: &mut TestClient,
    topic: &str,
) -> Result<Vec<SegmentDescription>, Refused> {
    Ok(describe(client, topic)
        .await?
        .ranges
        .into_iter()
        .flat_map(|r| r.segments)
        .collect())
}

/// Starts brokers 1 to `n`, each seeded with the client addresses of those
/// started before it, and waits until every one is ready; kept as options
/// so a test can stop one and start it again in its place.
pub async fn start_stoppable(
    n: u64,
    config: impl Fn(u64, &[SocketAddr]) -> BrokerConfig,
) -> Vec<Option<BrokerHandle>> {
    let mut brokers: Vec<Option<BrokerHandle>> = Vec::new();
    for node_id in 1..=n {
        let seeds: Vec<SocketAddr> = brokers.iter().flatten().map(|b| b.client_addr()).collect();
        brokers.push(Some(Broker::start(config(node_id, &seeds)).await.unwrap()));
    }
    for b in brokers.iter().flatten() {
        assert!(
            b.wait_ready(30_000).await,
            "broker {} never ready",
            b.node_id()
        );
    }
    brokers
}

/// Every record from the start as a subscription pushes them.
pub async fn subscribe_from_start(
    client: &mut TestClient,
    topic: &str,
    records: usize,
) -> Vec<Record> {
    let request = SubscribeRequest {
        topic: topic.into(),
        cursor: None,
        from_start: true,
        credit_records: u32::try_from(records).unwrap(),
        credit_bytes: 1 << 20,
    };
    let id = client.send_raw(12, request.encode().unwrap()).await;
    let mut got = Vec::new();
    while got.len() < records {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(30), client.recv())
            .await
            .unwrap_or_else(|_| panic!("the subscription stalled at {} of {records}", got.len()))
            .expect("connection closed");
        assert_eq!(frame.correlation_id, id);
        assert_eq!(
            frame.error_code,
            ErrorCode::None,
            "the subscription was refused: {:?}",
            ErrorBody::decode(frame.payload).unwrap_or_default()
        );
        got.extend(
            SubscribePush::decode(frame.payload)
                .unwrap()
                .records
                .records(),
        );
    }
    got
}

/// Every record of `topic` from the start through `client`, `page`
/// records a fetch (so a read crosses each segment in several), until a
/// fetch brings nothing and leaves the cursor where it was. A fetch
/// refused as retriable by this broker (`no_quorum` while a reopened
/// segment settles its committed end, `busy`) is asked again, as a client
/// would, for up to `READ_ALL_RETRY_MS`; any other refusal, or one that
/// outlasts it, is returned.
pub async fn read_from_start(
    client: &mut TestClient,
    topic: &str,
    page: u32,
) -> Result<Vec<Record>, Refused> {
    let (mut got, mut cursor) = fetch_retrying(client, topic, None, page).await?;
    for _ in 0..10_000 {
        let (records, next) = fetch_retrying(client, topic, Some(cursor.clone()), page).await?;
        if records.is_empty() && next == cursor {
            return Ok(got);
        }
        cursor = next;
        got.extend(records);
    }
    panic!("the read of {topic} never reached the end");
}

/// One fetch, asked again while this broker refuses it as retriable here
/// (not a redirect), for up to `READ_ALL_RETRY_MS`.
async fn fetch_retrying(
    client: &mut TestClient,
    topic: &str,
    cursor: Option<String>,
    page: u32,
) -> Result<(Vec<Record>, String), Refused> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(READ_ALL_RETRY_MS);
    loop {
        let from_start = cursor.is_none();
        match client
            .fetch(topic, cursor.clone(), from_start, page, 0)
            .await
        {
            Err(refused)
                if refused.code.retriable()
                    && !matches!(refused.code, ErrorCode::NotLeader | ErrorCode::Moved)
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(READ_RETRY_POLL_MS)).await;
            }
            answer => return answer,
        }
    }
}

/// The client address of broker `node` among `brokers`.
pub fn addr_of(brokers: &[&BrokerHandle], node: u64) -> SocketAddr {
    brokers
        .iter()
        .find(|b| b.node_id() == node)
        .unwrap()
        .client_addr()
}

/// Defines policy `name` with `placement` through every broker of
/// `addrs`: each refreshes its own cache of the policies (what placement
/// reads) when it proposes a change.
pub async fn put_placement(
    addrs: impl IntoIterator<Item = SocketAddr>,
    name: &str,
    placement: &[String],
) {
    for addr in addrs {
        let mut client = TestClient::connect(addr).await;
        assert!(
            eventually(30_000, async || client
                .call(&PutPolicyRequest {
                    policy: PolicyDescription {
                        name: name.into(),
                        placement: placement.to_vec(),
                        ..PolicyDescription::default()
                    },
                })
                .await
                .is_ok())
            .await
        );
    }
}

/// How long `read_all` and `read_from_start` retry a retriable refusal of
/// a fetch, and how often they ask again.
const READ_ALL_RETRY_MS: u64 = 10_000;
const READ_RETRY_POLL_MS: u64 = 100;

/// Every record of `topic` from the start, through one broker. The first
/// fetch is retried while it is refused as retriable: a broker that just
/// started answers `no_quorum` until it has learned the cluster's cursor
/// key, which under a loaded test run can take more than a moment.
pub async fn read_all(client: &mut TestClient, topic: &str) -> Vec<Record> {
    let mut first = None;
    let mut last = None;
    let fetched = eventually(READ_ALL_RETRY_MS, async || {
        match client.fetch(topic, None, true, 100, 0).await {
            Ok(page) => {
                first = Some(page);
                true
            }
            Err(refused) if refused.code.retriable() => {
                last = Some(refused);
                false
            }
            Err(refused) => panic!("the read of {topic} was refused: {refused:?}"),
        }
    })
    .await;
    assert!(
        fetched,
        "the read of {topic} was refused until the end: {last:?}"
    );
    let (mut got, mut cursor) = first.expect("fetched");
    loop {
        let (page, next) = client
            .fetch(topic, Some(cursor.clone()), false, 100, 0)
            .await
            .unwrap();
        cursor = next;
        if page.is_empty() {
            return got;
        }
        got.extend(page);
    }
}

pub fn decode<Op: Operation>(frame: ResponseFrame) -> Result<Op::Response, Refused> {
    if frame.error_code == ErrorCode::None {
        Ok(Op::Response::decode(frame.payload).unwrap())
    } else {
        let body = ErrorBody::decode(frame.payload).unwrap_or_default();
        Err(Refused {
            code: frame.error_code,
            message: body.message,
        })
    }
}

pub fn produce_request(topic: &str, records: &[Record]) -> ProduceRequest {
    let mut builder = BatchBuilder::new(64 << 20);
    for record in records {
        builder.push(record).unwrap();
    }
    ProduceRequest {
        topic: topic.into(),
        producer: None,
        records: builder.finish(),
    }
}

pub fn record(key: &str, value: &str) -> Record {
    Record::new(
        Bytes::copy_from_slice(key.as_bytes()),
        Bytes::copy_from_slice(value.as_bytes()),
    )
}

pub async fn start(config: BrokerConfig) -> BrokerHandle {
    let broker = Broker::start(config).await.unwrap();
    assert!(broker.wait_ready(10_000).await, "broker never became ready");
    broker
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Values grouped by key, each key's in the order they were read (see
/// [`crate::keyed::by_key`]).
pub fn by_key(records: &[Record]) -> std::collections::BTreeMap<Vec<u8>, Vec<Vec<u8>>> {
    crate::keyed::by_key(records.iter().map(|r| (r.key.to_vec(), r.value.to_vec())))
}

/// `n` records over `keys` keys: key `k<i % keys>`, value `<tag>-<i>`.
pub fn keyed_batch(tag: &str, n: usize, keys: usize) -> Vec<Record> {
    (0..n)
        .map(|i| record(&format!("k{}", i % keys), &format!("{tag}-{i}")))
        .collect()
}

/// Starts brokers `1..=N` one after another, each given those before it as
/// seeds (`config(node_id, seeds)`), and waits until every one is ready.
pub async fn start_seeded<const N: usize>(
    config: impl Fn(u64, &[&BrokerHandle]) -> BrokerConfig,
) -> [BrokerHandle; N] {
    let mut brokers: Vec<BrokerHandle> = Vec::with_capacity(N);
    for node_id in 1..=N as u64 {
        let seeds: Vec<&BrokerHandle> = brokers.iter().collect();
        let broker = Broker::start(config(node_id, &seeds)).await.unwrap();
        brokers.push(broker);
    }
    for b in &brokers {
        assert!(
            b.wait_ready(30_000).await,
            "broker {} never ready",
            b.node_id()
        );
    }
    let Ok(brokers) = <[BrokerHandle; N]>::try_from(brokers) else {
        unreachable!("N brokers were started")
    };
    brokers
}

/// A test broker `node_id` of a cluster formed of `nodes`, with `seeds`
/// as its seeds and its data under `dir/node-<id>`.
pub fn cluster_config(
    dir: &std::path::Path,
    node_id: u64,
    seeds: &[&BrokerHandle],
    nodes: &[u64],
) -> BrokerConfig {
    BrokerConfig {
        node_id,
        seeds: seeds.iter().map(|b| b.client_addr().to_string()).collect(),
        cluster: malachi_actors::ClusterSettings {
            nodes: nodes.to_vec(),
            ..malachi_actors::ClusterSettings::default()
        },
        ..BrokerConfig::for_tests(dir.join(format!("node-{node_id}")))
    }
}

/// Broker `node_id` of a cluster of brokers 1, 2 and 3 seeded with `seeds`,
/// its data under `dir/node-<id>`, with a coordinator that polls every
/// 200 ms (an orphaned fence or a dead primary is found within seconds).
pub fn three_node_config(dir: &Path, node_id: u64, seeds: &[SocketAddr]) -> BrokerConfig {
    BrokerConfig {
        node_id,
        seeds: seeds.iter().map(|a| a.to_string()).collect(),
        cluster: malachi_actors::ClusterSettings {
            nodes: vec![1, 2, 3],
            coordinator_poll_ms: 200,
            ..malachi_actors::ClusterSettings::default()
        },
        ..BrokerConfig::for_tests(dir.join(format!("node-{node_id}")))
    }
}

/// `topic`'s first active segment, as the first live broker of `brokers`
/// that answers describes it.
pub async fn active_segment(
    brokers: &[Option<BrokerHandle>],
    topic: &str,
) -> Option<SegmentDescription> {
    for broker in brokers.iter().flatten() {
        let mut client = TestClient::connect(broker.client_addr()).await;
        if let Ok(all) = segments(&mut client, topic).await
            && let Some(active) = all.into_iter().find(|s| s.state == "active")
        {
            return Some(active);
        }
    }
    None
}

/// Produces `records` to `topic` at its active segment's primary (broker
/// `n` at `brokers[n - 1]`), if it is live and answers within 2 s; whether
/// they were acknowledged.
pub async fn produce_once(
    brokers: &[Option<BrokerHandle>],
    topic: &str,
    records: &[Record],
) -> bool {
    let Some(segment) = active_segment(brokers, topic).await else {
        return false;
    };
    let Some(primary) = brokers[(segment.replicas[0] - 1) as usize].as_ref() else {
        return false;
    };
    let mut client = TestClient::connect(primary.client_addr()).await;
    tokio::time::timeout(Duration::from_secs(2), client.produce(topic, records))
        .await
        .is_ok_and(|r| r.is_ok())
}

/// The value of the metric line `name VALUE` (no labels) in `broker`'s
/// metrics, 0 when it is not shown yet.
pub fn counter(broker: &BrokerHandle, name: &str) -> u64 {
    broker
        .metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}
