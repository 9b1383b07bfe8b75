//! Topic and range administration: create, delete, list and describe
//! topics; split and merge ranges. Changes go to the coordinator manager
//! (which hands each to the coordinator of the topic's vnode); reads go to
//! the metadata plane, linearizable from the vnode's leader.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use malachi_core::model::{NodeId, RangeId};
use malachi_wire::messages as wire;
use tokio::time::Instant;

use super::context::MetaCtx;
use super::error::ServeError;
use super::reply::{Failure, not_serving};
use crate::common::convert::describe_to_wire;
use crate::control::describe_rates::{DESCRIBE_RATES_TIMEOUT_MS, range_primaries};
use crate::control::placement::{PlacementView, range_redirect};
use crate::control::requests::{CoordError, CoordinatorMsg};

/// How often a request waiting for a restarting coordinator manager looks
/// for the new one.
const COORDINATOR_WAIT_STEP_MS: u64 = 20;

async fn call_coordinator<R: Send + 'static>(
    meta: &MetaCtx,
    build: impl FnOnce(ractor::RpcReplyPort<Result<R, CoordError>>) -> CoordinatorMsg,
) -> Result<R, Failure> {
    let timeout_ms = meta.produce_timeout_ms;
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    // The manager is briefly absent while its supervisor restarts it: wait
    // for the new one (bounded) rather than fail the request. The request is
    // built only once a manager took it, so it never runs twice.
    let coordinator = loop {
        if let Some(coordinator) = meta.actors.manager().get()
            && coordinator.get_status() == ractor::ActorStatus::Running
        {
            break coordinator;
        }
        if Instant::now() >= deadline {
            return Err(ServeError::CoordinatorDown);
        }
        tokio::time::sleep(Duration::from_millis(COORDINATOR_WAIT_STEP_MS)).await;
    };
    match ractor::call_t!(coordinator, build, timeout_ms) {
        Ok(answer) => answer.map_err(ServeError::Coord),
        Err(e) => Err(ServeError::CoordinatorSilent {
            reason: e.to_string(),
        }),
    }
}

pub(crate) async fn create_topic(
    meta: &MetaCtx,
    req: wire::CreateTopicRequest,
) -> Result<wire::CreateTopicResponse, Failure> {
    if let Some(replication_factor) = req.replication_factor
        && replication_factor > 1
        && meta.metadata_backend == crate::common::config::MetadataBackend::File
    {
        return Err(ServeError::ReplicationFactor { replication_factor });
    }
    let name = req.name.clone();
    let incarnation = call_coordinator(meta, |reply| CoordinatorMsg::CreateTopic {
        name: req.name,
        policy: req.policy,
        replication_factor: req.replication_factor,
        reply,
    })
    .await?;
    Ok(wire::CreateTopicResponse { name, incarnation })
}

pub(crate) async fn delete_topic(
    meta: &MetaCtx,
    req: wire::DeleteTopicRequest,
) -> Result<wire::DeleteTopicResponse, Failure> {
    let name = req.name.clone();
    call_coordinator(meta, |reply| CoordinatorMsg::DeleteTopic {
        name: req.name,
        reply,
    })
    .await?;
    Ok(wire::DeleteTopicResponse { name })
}

/// Every vnode's topics, each read from its leader.
pub(crate) async fn list_topics(meta: &MetaCtx) -> Result<wire::ListTopicsResponse, Failure> {
    let plane = meta.plane().map_err(not_serving)?;
    let topics = plane
        .list()
        .await
        .map_err(not_serving)?
        .into_iter()
        .map(|t| wire::TopicListing {
            name: t.name,
            incarnation: t.incarnation,
            state: if t.sealed { "sealed" } else { "active" }.into(),
            ranges_active: t.ranges_active,
        })
        .collect();
    Ok(wire::ListTopicsResponse { topics })
}

/// The metadata linearizable, from the leader of the topic's vnode; then,
/// if the request asks for them, the live figures (committed ends, each
/// copy's durable end) from the brokers holding the copies, each bounded,
/// none required (ADR 0098).
pub(crate) async fn describe_topic(
    meta: &MetaCtx,
    req: wire::DescribeTopicRequest,
) -> Result<wire::DescribeTopicResponse, Failure> {
    let plane = meta.plane().map_err(not_serving)?;
    match plane.describe(&req.name).await.map_err(not_serving)? {
        Some(d) => {
            let mut topic = describe_to_wire(&d);
            // Policies live in the ring's group, not the topic's vnode
            // (ADR 0115): whether the name resolves is asked there. If the
            // ring's group does not answer, the vnode's own word stands.
            if let Some(name) = &topic.policy
                && let Ok(all) = meta.control.policies().await
            {
                topic.policy_resolved = all.contains_key(name);
            }
            // The rates are asked beside the live figures, not after them.
            let primaries = range_primaries(&topic);
            let name = topic.name.clone();
            let (_, reshaping) = futures::future::join(
                meta.control.add_live_figures(&mut topic, req.live),
                reshaping(meta, name, primaries, req.live),
            )
            .await;
            topic.reshaping = reshaping;
            Ok(wire::DescribeTopicResponse { topic })
        }
        None => Err(ServeError::TopicNotFound { topic: req.name }),
    }
}

/// The topic's write rates and recent automatic reshapes (ADR 0143). A
/// live describe (`malachi topic describe`) asks each range's primary, so
/// every broker answers alike; otherwise (a producer fetching the layout,
/// which must not wait on other brokers) this broker tells what it knows:
/// the ranges it writes, the reshapes it asked for.
async fn reshaping(
    meta: &MetaCtx,
    topic: String,
    primaries: BTreeMap<u64, BTreeSet<u64>>,
    live: bool,
) -> Option<wire::TopicReshaping> {
    if live {
        return meta
            .control
            .gather_reshaping(topic, primaries, DESCRIBE_RATES_TIMEOUT_MS)
            .await;
    }
    meta.rates
        .reshaping(meta.clock.now_ms(), &topic, meta.node_id)
}

/// A split or merge refused because another broker writes the range
/// becomes `not_leader` naming that broker, which the client follows at
/// once: the request completes there, within the client's deadline (ADR
/// 0141). Any other failure is passed on.
fn to_writer(meta: &MetaCtx, failure: Failure) -> Failure {
    let ServeError::Coord(CoordError::WrittenElsewhere {
        topic,
        range,
        primary,
    }) = &failure
    else {
        return failure;
    };
    let view = PlacementView {
        me: NodeId(meta.node_id),
        actors: std::sync::Arc::clone(&meta.actors),
        links: std::sync::Arc::clone(&meta.links),
    };
    ServeError::Redirect(range_redirect(&view, topic, *range, *primary))
}

pub(crate) async fn split_range(
    meta: &MetaCtx,
    req: wire::SplitRangeRequest,
) -> Result<wire::SplitRangeResponse, Failure> {
    let range = RangeId(req.range_id);
    let (lower, upper) = call_coordinator(meta, |reply| CoordinatorMsg::Split {
        topic: req.topic,
        range,
        reply,
    })
    .await
    .map_err(|failure| to_writer(meta, failure))?;
    Ok(wire::SplitRangeResponse {
        range_id: req.range_id,
        children: vec![lower.0, upper.0],
    })
}

pub(crate) async fn merge_range(
    meta: &MetaCtx,
    req: wire::MergeRangeRequest,
) -> Result<wire::MergeRangeResponse, Failure> {
    let (lower, upper, merged) = call_coordinator(meta, |reply| CoordinatorMsg::Merge {
        topic: req.topic,
        range: RangeId(req.range_id),
        reply,
    })
    .await
    .map_err(|failure| to_writer(meta, failure))?;
    Ok(wire::MergeRangeResponse {
        range_id: merged.0,
        parents: vec![lower.0, upper.0],
    })
}
