//! The live figures of `topic describe` (ADR 0098): each copy's durable end
//! and each active segment's committed end, which no metadata holds.
//!
//! Both halves of replica-status, asked over the node fabric (the
//! `replica_status` order, ADR 0133) and on the cluster port (api key 105)
//! when the fabric has no session to the broker asked ([`ask_status`]):
//! [`serve_replica_status`] answers for the copies this broker holds (from
//! the data plane, `data::status`), and [`add_live_figures`], run by the
//! broker answering a describe that asks for them (`live`, as `malachi
//! topic describe` does; a producer fetching the layout does not), asks
//! every broker holding a copy of one of the topic's active segments, all at once, each at most
//! [`REPLICA_STATUS_TIMEOUT_MS`]. A broker that does not answer makes its
//! copies `unreachable`, never the describe fail; the broker answering asks
//! itself without the network. Sealed segments are not asked about: their
//! seal's length is the committed end, and their copies show `sealed`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use malachi_cluster::group::{RpcError, TransportError};
use malachi_wire::messages as wire;
use malachi_wire::replica_status::{
    CopyStatus, REPLICA_STATUS_API_KEY, REPLICA_STATUS_SEGMENTS_MAX, ReplicaStatusRequest,
    ReplicaStatusResponse, ScrubSeal, SealedHealth,
};
use tracing::debug;

use crate::control::replica_order::over_fabric;
use crate::control::shared::{ClusterLinks, Shared};
use crate::data::status::{copy_status, sealed_copy_health, sealed_health};
use crate::data::storage::Storage;
use crate::fabric::remote::RemoteError;

/// How long a describe waits for one broker's replica-status answer. The
/// brokers are asked at once, so this bounds the describe's extra time.
pub(crate) const REPLICA_STATUS_TIMEOUT_MS: u64 = 1_500;

/// Answers one replica-status request from this broker's store (and, when
/// it names a topic, its range meters: ADR 0143).
pub(crate) fn serve_replica_status(shared: &Shared, body: &[u8]) -> Result<Vec<u8>, RpcError> {
    let data: &Storage = &shared.data;
    let request = ReplicaStatusRequest::decode(body).map_err(|e| RpcError::Decode {
        what: "replica_status_request",
        source: std::sync::Arc::new(e),
    })?;
    let answer = ReplicaStatusResponse {
        copies: copy_status(data, &request.segments),
        scrub: crate::data::scrub::verdicts(data, &request.scrub),
        health: crate::data::status::sealed_health(data, &request.sealed),
        reshaping: request.rates_topic.as_deref().and_then(|topic| {
            let now_ms = shared.clock.now_ms();
            shared.rates.reshaping(now_ms, topic, shared.config.node_id)
        }),
        producer_tables: crate::data::ancestors::sealed_tables(
            data.store.as_ref(),
            &request.producer_tables,
        ),
    };
    answer
        .encode()
        .map(|b| b.to_vec())
        .map_err(|e| RpcError::Encode {
            what: "replica_status_response",
            source: std::sync::Arc::new(e),
        })
}

/// What asking one broker about its copies came to.
#[derive(Debug)]
enum Asked {
    /// It answered: its copies by segment.
    Answered(HashMap<u64, CopyStatus>),
    /// It could not be reached, or did not answer in time.
    Unreachable,
    /// It answered without the figures (an older broker, or an error).
    Unknown,
}

/// Fills in each segment's primary, committed end and copies: from the
/// metadata for sealed segments, and, when `live`, by asking the copies'
/// brokers for active ones (without `live`, an active segment's committed
/// end is absent and its copies empty: nobody is asked). Never fails: what
/// cannot be learned shows as such.
pub(crate) async fn add_live_figures(
    shared: &Arc<Shared>,
    topic: &mut wire::TopicDescription,
    live: bool,
) {
    // The active segments each broker holds a copy of.
    let mut wanted: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for segment in topic.ranges.iter().flat_map(|r| &r.segments) {
        if live && segment.state != "sealed" {
            for &node in &segment.replicas {
                wanted.entry(node).or_default().push(segment.id);
            }
        }
    }
    // The sealed copies each broker holds, with their seals: a live
    // describe shows each copy's health (issue 19).
    let mut sealed: BTreeMap<u64, Vec<ScrubSeal>> = BTreeMap::new();
    for segment in topic.ranges.iter().flat_map(|r| &r.segments) {
        if let (true, "sealed", Some(length), Some(bytes)) =
            (live, segment.state.as_str(), segment.length, segment.bytes)
        {
            for &node in &segment.replicas {
                sealed.entry(node).or_default().push(ScrubSeal {
                    segment: segment.id,
                    length,
                    bytes,
                });
            }
        }
    }
    let asks = wanted
        .into_iter()
        .map(|(node, segments)| async move { (node, ask(shared, node, segments).await) });
    let health_asks = sealed
        .into_iter()
        .map(|(node, seals)| async move { (node, ask_health(shared, node, seals).await) });
    let (answers, health) = futures::future::join(
        futures::future::join_all(asks),
        futures::future::join_all(health_asks),
    )
    .await;
    let answers: HashMap<u64, Asked> = answers.into_iter().collect();
    let health: HashMap<u64, Option<HashMap<u64, SealedHealth>>> = health.into_iter().collect();
    let me = shared.config.node_id;
    for segment in topic.ranges.iter_mut().flat_map(|r| r.segments.iter_mut()) {
        if live || segment.state == "sealed" {
            fill(segment, &answers);
            if live {
                fill_health(segment, &health);
            }
            own_sealed_copy(shared, me, segment);
        } else {
            segment.primary = segment.replicas.first().copied();
        }
    }
}

/// A sealed segment's copies from their brokers' health answers: each
/// copy's health word (`intact`, `short`, `over`, `damaged`, `missing`,
/// `healing`), or `unreachable` for a broker that did not answer.
fn fill_health(
    segment: &mut wire::SegmentDescription,
    health: &HashMap<u64, Option<HashMap<u64, SealedHealth>>>,
) {
    if segment.state != "sealed" {
        return;
    }
    for copy in &mut segment.copies {
        match health.get(&copy.node) {
            Some(Some(answers)) => {
                if let Some(found) = answers.get(&segment.id) {
                    copy.status.clone_from(&found.health);
                    copy.durable_end = found.durable_end;
                }
            }
            Some(None) => copy.status = "unreachable".into(),
            None => {}
        }
    }
}

/// Asks broker `node` how its copies of the sealed `seals` stand (itself
/// without the network); `None` when it did not answer.
async fn ask_health(
    shared: &Arc<Shared>,
    node: u64,
    seals: Vec<ScrubSeal>,
) -> Option<HashMap<u64, SealedHealth>> {
    let by_segment =
        |health: Vec<SealedHealth>| health.into_iter().map(|h| (h.segment, h)).collect();
    if node == shared.config.node_id {
        return Some(by_segment(sealed_health(&shared.data, &seals)));
    }
    let mut found = HashMap::new();
    for chunk in seals.chunks(REPLICA_STATUS_SEGMENTS_MAX) {
        let request = ReplicaStatusRequest {
            sealed: chunk.to_vec(),
            ..ReplicaStatusRequest::default()
        };
        let response = call(&shared.links, node, &request).await.ok()?;
        found.extend(by_segment(response.health));
    }
    Some(found)
}

/// This broker's copy of a sealed segment, checked against its seal (ADR
/// 0108): a damaged, missing or short copy shows as such, not as `sealed`.
fn own_sealed_copy(shared: &Shared, me: u64, segment: &mut wire::SegmentDescription) {
    let (Some(length), Some(bytes)) = (segment.length, segment.bytes) else {
        return;
    };
    if segment.state != "sealed" {
        return;
    }
    let Some((status, durable_end)) = sealed_copy_health(
        &shared.data,
        segment.id,
        length,
        bytes,
        segment.replicas.len() == 1,
    ) else {
        return;
    };
    // A copy being healed is short until it is whole: it says so.
    for copy in segment
        .copies
        .iter_mut()
        .filter(|c| c.node == me && c.status != "healing")
    {
        copy.status = status.into();
        copy.durable_end = durable_end;
    }
}

/// One segment's figures from the answers.
fn fill(segment: &mut wire::SegmentDescription, answers: &HashMap<u64, Asked>) {
    segment.primary = segment.replicas.first().copied();
    if segment.state == "sealed" {
        segment.committed_end = segment.length;
        segment.copies = segment
            .replicas
            .iter()
            .map(|&node| wire::CopyDescription {
                node,
                status: "sealed".into(),
                durable_end: None,
            })
            .collect();
        return;
    }
    let status_of = |node: u64| -> Option<&CopyStatus> {
        match answers.get(&node) {
            Some(Asked::Answered(copies)) => copies.get(&segment.id),
            _ => None,
        }
    };
    segment.committed_end = segment
        .primary
        .and_then(status_of)
        .filter(|s| s.open)
        .and_then(|s| s.committed_end);
    segment.copies = segment
        .replicas
        .iter()
        .map(|&node| {
            let (status, durable_end) = match answers.get(&node) {
                Some(Asked::Answered(_)) => match status_of(node) {
                    Some(s) if s.open && s.failed => ("failed", s.durable_end),
                    Some(s) if s.open && s.fenced => ("fenced", s.durable_end),
                    Some(s) if s.open => ("live", s.durable_end),
                    Some(_) => ("not_open", None),
                    None => ("unknown", None),
                },
                Some(Asked::Unreachable) => ("unreachable", None),
                Some(Asked::Unknown) | None => ("unknown", None),
            };
            wire::CopyDescription {
                node,
                status: status.into(),
                durable_end,
            }
        })
        .collect();
}

/// Asks broker `node` about its copies of `segments` (itself without the
/// network), in requests of at most `REPLICA_STATUS_SEGMENTS_MAX`.
async fn ask(shared: &Arc<Shared>, node: u64, segments: Vec<u64>) -> Asked {
    if node == shared.config.node_id {
        return Asked::Answered(by_segment(copy_status(&shared.data, &segments)));
    }
    let chunks = segments.chunks(REPLICA_STATUS_SEGMENTS_MAX).map(|chunk| {
        let request = ReplicaStatusRequest {
            segments: chunk.to_vec(),
            ..ReplicaStatusRequest::default()
        };
        async move {
            call(&shared.links, node, &request)
                .await
                .map(|response| by_segment(response.copies))
        }
    });
    let mut copies = HashMap::new();
    for answer in futures::future::join_all(chunks).await {
        match answer {
            Ok(answered) => copies.extend(answered),
            Err(asked) => return asked,
        }
    }
    Asked::Answered(copies)
}

/// One replica-status round trip to broker `node`, bounded by
/// `REPLICA_STATUS_TIMEOUT_MS`: an error is what the asking came to.
async fn call(
    links: &ClusterLinks,
    node: u64,
    request: &ReplicaStatusRequest,
) -> Result<ReplicaStatusResponse, Asked> {
    ask_status(links, node, request, REPLICA_STATUS_TIMEOUT_MS, Lane::Raft)
        .await
        .map_err(|e| {
            debug!(node, error = %e, "replica-status unanswered");
            match e {
                StatusError::Unreachable { .. } => Asked::Unreachable,
                StatusError::Encode { .. } | StatusError::Unanswered { .. } => Asked::Unknown,
            }
        })
}

/// The cluster port's connections a replica-status ask falls back to:
/// raft's (a describe), or the replication ones (a read, which must not
/// queue behind raft's heartbeats nor they behind it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    Raft,
    Replication,
}

/// Why broker `node` gave no replica-status answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StatusError {
    #[error("cannot encode a replica-status request: {reason}")]
    Encode { reason: String },
    /// Not reached, or no answer within the deadline.
    #[error("broker {node} is unreachable: {reason}")]
    Unreachable { node: u64, reason: String },
    /// It answered, but not with replica-status figures (a refusal, an
    /// undecodable answer).
    #[error("broker {node} answered no replica status: {reason}")]
    Unanswered { node: u64, reason: String },
}

/// Asks broker `node` for replica status within `timeout_ms`: over the
/// node fabric (ADR 0133), and on the cluster port's `lane` when the
/// fabric has no session to it or lost the call, within what is left of
/// the deadline. Replica status only reads, so an ask carried twice is
/// harmless.
pub(crate) async fn ask_status(
    links: &ClusterLinks,
    node: u64,
    request: &ReplicaStatusRequest,
    timeout_ms: u64,
    lane: Lane,
) -> Result<ReplicaStatusResponse, StatusError> {
    let body = request.encode().map_err(|e| StatusError::Encode {
        reason: e.to_string(),
    })?;
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    let fabric = links.fabric.get();
    let carried = match fabric {
        Some(fabric) => {
            let timeout = Duration::from_millis(timeout_ms);
            over_fabric(fabric, node, REPLICA_STATUS_VARIANT, body.to_vec(), timeout).await
        }
        None => None,
    };
    let answer = match carried {
        Some(Ok(answer)) => Bytes::from(answer),
        Some(Err(error)) => return Err(fabric_error(node, &error)),
        None => on_port(links, node, &body, deadline, lane).await?,
    };
    ReplicaStatusResponse::decode(&answer).map_err(|e| StatusError::Unanswered {
        node,
        reason: e.to_string(),
    })
}

/// The name replica-status travels under on the node fabric.
const REPLICA_STATUS_VARIANT: &str = "replica_status";

/// What a fabric call's failure says of the peer.
fn fabric_error(node: u64, error: &RemoteError) -> StatusError {
    match error {
        RemoteError::Refused { .. } | RemoteError::TooLarge { .. } => StatusError::Unanswered {
            node,
            reason: error.to_string(),
        },
        RemoteError::Timeout { .. }
        | RemoteError::InflightFull { .. }
        | RemoteError::NoSession { .. }
        | RemoteError::Lost { .. } => StatusError::Unreachable {
            node,
            reason: error.to_string(),
        },
    }
}

/// The cluster port's half of [`ask_status`], until `deadline`.
async fn on_port(
    links: &ClusterLinks,
    node: u64,
    body: &[u8],
    deadline: Instant,
    lane: Lane,
) -> Result<Bytes, StatusError> {
    let Some(raft) = links.raft.get() else {
        // A lone broker reaches no other.
        return Err(StatusError::Unreachable {
            node,
            reason: "this broker has no cluster port".into(),
        });
    };
    let transport = match lane {
        Lane::Raft => &raft.transport,
        Lane::Replication => &raft.replication,
    };
    let left_ms = deadline
        .saturating_duration_since(Instant::now())
        .as_millis() as u64;
    transport
        .call_raw(node, REPLICA_STATUS_API_KEY, 0, body, left_ms.max(1))
        .await
        .map_err(|e| match e {
            TransportError::Remote { .. } => StatusError::Unanswered {
                node,
                reason: e.to_string(),
            },
            TransportError::Unreachable { .. } | TransportError::Network { .. } => {
                StatusError::Unreachable {
                    node,
                    reason: e.to_string(),
                }
            }
        })
}

fn by_segment(copies: Vec<CopyStatus>) -> HashMap<u64, CopyStatus> {
    copies.into_iter().map(|c| (c.segment, c)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(state: &str, replicas: Vec<u64>) -> wire::SegmentDescription {
        wire::SegmentDescription {
            id: 7,
            replicas,
            state: state.into(),
            ..wire::SegmentDescription::default()
        }
    }

    fn open(durable: u64, committed: u64) -> CopyStatus {
        CopyStatus {
            segment: 7,
            open: true,
            durable_end: Some(durable),
            committed_end: Some(committed),
            ..CopyStatus::default()
        }
    }

    fn answered(status: CopyStatus) -> Asked {
        Asked::Answered(by_segment(vec![status]))
    }

    fn shown(segment: &wire::SegmentDescription) -> Vec<(u64, String, Option<u64>)> {
        segment
            .copies
            .iter()
            .map(|c| (c.node, c.status.clone(), c.durable_end))
            .collect()
    }

    #[test]
    fn an_active_segment_shows_the_primarys_committed_end_and_each_copy() {
        let mut s = segment("active", vec![2, 3, 1]);
        let answers = HashMap::from([
            (2, answered(open(10, 9))),
            (3, answered(open(9, 7))),
            (1, Asked::Unreachable),
        ]);
        fill(&mut s, &answers);
        assert_eq!(s.primary, Some(2));
        assert_eq!(s.committed_end, Some(9), "the primary's, not a follower's");
        assert_eq!(
            shown(&s),
            vec![
                (2, "live".into(), Some(10)),
                (3, "live".into(), Some(9)),
                (1, "unreachable".into(), None),
            ]
        );
    }

    #[test]
    fn an_unreachable_primary_leaves_the_committed_end_unknown() {
        let mut s = segment("active", vec![1, 2, 3]);
        let closed = CopyStatus {
            segment: 7,
            ..CopyStatus::default()
        };
        let answers = HashMap::from([
            (1, Asked::Unreachable),
            (2, answered(closed)),
            (3, Asked::Unknown),
        ]);
        fill(&mut s, &answers);
        assert_eq!(s.committed_end, None);
        assert_eq!(
            shown(&s),
            vec![
                (1, "unreachable".into(), None),
                (2, "not_open".into(), None),
                (3, "unknown".into(), None),
            ]
        );
    }

    #[test]
    fn a_live_describe_shows_each_sealed_copys_health_or_unreachable() {
        let mut s = segment("sealed", vec![1, 2, 3]);
        s.length = Some(42);
        fill(&mut s, &HashMap::new());
        let word = |health: &str, end: u64| {
            Some(HashMap::from([(
                7,
                SealedHealth {
                    segment: 7,
                    health: health.into(),
                    durable_end: Some(end),
                },
            )]))
        };
        let health = HashMap::from([(1, word("intact", 42)), (2, word("healing", 17)), (3, None)]);
        fill_health(&mut s, &health);
        assert_eq!(
            shown(&s),
            vec![
                (1, "intact".into(), Some(42)),
                (2, "healing".into(), Some(17)),
                (3, "unreachable".into(), None),
            ]
        );
    }

    #[test]
    fn a_sealed_segment_is_committed_to_its_length_and_not_asked() {
        let mut s = segment("sealed", vec![1, 2, 3]);
        s.length = Some(42);
        fill(&mut s, &HashMap::new());
        assert_eq!(s.primary, Some(1));
        assert_eq!(s.committed_end, Some(42));
        assert!(s.copies.iter().all(|c| c.status == "sealed"));
        assert_eq!(s.copies.len(), 3);
    }

    #[test]
    fn a_failed_or_fenced_copy_says_so() {
        let mut s = segment("active", vec![1, 2]);
        let failed = CopyStatus {
            failed: true,
            ..open(3, 3)
        };
        let fenced = CopyStatus {
            fenced: true,
            ..open(3, 3)
        };
        let answers = HashMap::from([(1, answered(failed)), (2, answered(fenced))]);
        fill(&mut s, &answers);
        assert_eq!(s.copies[0].status, "failed");
        assert_eq!(s.copies[1].status, "fenced");
    }
}
