//! One request from decode to answer: the placement check (records, and the
//! splits and merges that freeze their segments, are served by the broker
//! hosting the topic's segments, any other answers `not_leader` with its
//! address, after verifying a fetch's or subscribe's cursor), then the
//! handler of the request's api family. A new client
//! operation is one arm here and one function in its family's module.

use malachi_wire::RequestFrame;
use malachi_wire::messages::{self as wire, ApiVersion, Request, Response};
use tracing::{debug, warn};

use super::context::MetaCtx;
use super::context::ReadCtx;
use super::error::ServeError;
use super::reply::{Failure, Reply, redirect_reply, refusal_frame};
use super::subscribe::{ConnCtx, credit, subscribe};
use super::{cluster, features, fetch, policies, token, topics, users, vnodes};
use crate::control::placement::{Serve, serve_here};

pub(crate) async fn handle_frame(
    meta: &MetaCtx,
    ctx: &ConnCtx,
    frame: RequestFrame,
) -> Option<Reply> {
    let correlation_id = frame.correlation_id;
    let request = match Request::decode(frame.api_key, frame.payload) {
        Ok(request) => request,
        Err(e) => return Some(refusal_frame(correlation_id, &ServeError::Decode(e))),
    };
    // Authorized first, before placement: a refused client learns nothing
    // of where the topic lives (ADR 0150).
    if let Err(refusal) = ctx.auth.gate(&request).await {
        return Some(refusal_frame(correlation_id, &refusal));
    }
    let request = match request {
        Request::Subscribe(req) => {
            if let Err(redirect) = serve_here(&ctx.read.place, &req.topic, Serve::Read).await {
                if let Some(refusal) = forged_cursor(&ctx.read, req.cursor.as_deref()).await {
                    return Some(refusal_frame(correlation_id, &refusal));
                }
                return Some(redirect_reply(redirect, correlation_id));
            }
            return subscribe(ctx, correlation_id, req)
                .await
                .err()
                .map(|refusal| refusal_frame(correlation_id, &refusal));
        }
        Request::SubscribeCredit(req) => {
            let answer = credit(ctx, req).map(Response::SubscribeCredit);
            return Some(encode_answer(correlation_id, "subscribe_credit", answer));
        }
        other => other,
    };
    // Records are served by the broker hosting the topic's segments; any
    // other broker answers `not_leader` with that broker's address. A split
    // or merge freezes the range's active segments, so it is served there
    // too (elsewhere the freeze could only fail).
    let served = match &request {
        Request::Produce(req) => Some((req.topic.as_str(), Serve::Write)),
        Request::Fetch(req) => Some((req.topic.as_str(), Serve::Read)),
        Request::SplitRange(req) => Some((req.topic.as_str(), Serve::Write)),
        Request::MergeRange(req) => Some((req.topic.as_str(), Serve::Write)),
        _ => None,
    };
    if let Some((topic, serve)) = served
        && let Err(redirect) = serve_here(&ctx.read.place, topic, serve).await
    {
        let cursor = match &request {
            Request::Fetch(req) => req.cursor.as_deref(),
            _ => None,
        };
        if let Some(refusal) = forged_cursor(&ctx.read, cursor).await {
            return Some(refusal_frame(correlation_id, &refusal));
        }
        return Some(redirect_reply(redirect, correlation_id));
    }
    let name = request.api_key().name();
    Some(encode_answer(
        correlation_id,
        name,
        handle_request(meta, ctx, request).await,
    ))
}

/// Before a fetch or subscribe is redirected, its cursor is verified here
/// under the cluster's keys (ADR 0096): a cursor no broker of the cluster
/// would accept is refused by the first broker it reaches, and a genuine
/// one is known good before the client is sent on. A broker that has not
/// learned the keys yet redirects without verifying.
async fn forged_cursor(read: &ReadCtx, cursor: Option<&str>) -> Option<ServeError> {
    let cursor = cursor?;
    match super::cursors::verify(read, cursor).await {
        Err(ServeError::CursorKeyPending) | Ok(_) => None,
        Err(refused) => Some(refused),
    }
}

fn encode_answer(
    correlation_id: u32,
    name: &'static str,
    answer: Result<Response, Failure>,
) -> Reply {
    match answer {
        Ok(response) => match Reply::encode(correlation_id, &response) {
            Ok(reply) => reply,
            Err(e) => {
                warn!(api = name, error = %e, "cannot encode a response");
                let refusal = ServeError::Internal {
                    what: "encode a response",
                    reason: e.to_string(),
                };
                refusal_frame(correlation_id, &refusal)
            }
        },
        Err(refusal) => {
            debug!(api = name, code = %refusal.code(), message = %refusal, "request refused");
            refusal_frame(correlation_id, &refusal)
        }
    }
}

async fn handle_request(
    meta: &MetaCtx,
    ctx: &ConnCtx,
    request: Request,
) -> Result<Response, Failure> {
    let read = ctx.read.as_ref();
    match request {
        Request::ApiVersions(_) => Ok(Response::ApiVersions(wire::ApiVersionsResponse {
            node_id: meta.node_id,
            versions: ApiVersion::supported(),
        })),
        Request::CreateTopic(req) => topics::create_topic(meta, req)
            .await
            .map(Response::CreateTopic),
        Request::DeleteTopic(req) => topics::delete_topic(meta, req)
            .await
            .map(Response::DeleteTopic),
        Request::ListTopics(_) => {
            let mut listed = topics::list_topics(meta).await?;
            let mut shown = Vec::with_capacity(listed.topics.len());
            for topic in std::mem::take(&mut listed.topics) {
                if ctx.auth.may_describe(&topic.name).await {
                    shown.push(topic);
                }
            }
            listed.topics = shown;
            Ok(Response::ListTopics(listed))
        }
        Request::DescribeTopic(req) => topics::describe_topic(meta, req)
            .await
            .map(Response::DescribeTopic),
        Request::SplitRange(req) => topics::split_range(meta, req)
            .await
            .map(Response::SplitRange),
        Request::MergeRange(req) => topics::merge_range(meta, req)
            .await
            .map(Response::MergeRange),
        // The connection hands produce requests to its sequencer, in order.
        Request::Produce(_) => Err(ServeError::Internal {
            what: "route a produce",
            reason: "produce requests go through the connection's sequencer".into(),
        }),
        Request::Fetch(req) => fetch::fetch(read, req).await.map(Response::Fetch),
        Request::TreeSnapshot(req) => cluster::tree_snapshot(meta, req)
            .await
            .map(Response::TreeSnapshot),
        Request::ClusterStatus(_) => Ok(Response::ClusterStatus(cluster::cluster_status(meta))),
        Request::VnodeList(_) => vnodes::vnode_list(meta).map(Response::VnodeList),
        Request::VnodeSplit(req) => vnodes::vnode_split(meta, req.vnode)
            .await
            .map(Response::VnodeSplit),
        Request::ClusterMembers(req) => vnodes::cluster_members(meta, req)
            .await
            .map(Response::ClusterMembers),
        Request::PutPolicy(req) => policies::put_policy(meta, req)
            .await
            .map(Response::PutPolicy),
        Request::ListPolicies(req) => policies::list_policies(meta, req)
            .await
            .map(Response::ListPolicies),
        Request::DeletePolicy(req) => policies::delete_policy(meta, req)
            .await
            .map(Response::DeletePolicy),
        Request::Features(req) => features::features(&meta.actors, meta.node_id, req)
            .await
            .map(Response::Features),
        Request::Subscribe(_) | Request::SubscribeCredit(_) => {
            Err(ServeError::SubscriptionMisrouted)
        }
        other => handle_auth(ctx, other).await,
    }
}

/// The login and the user and ACL administration (ADR 0150).
async fn handle_auth(ctx: &ConnCtx, request: Request) -> Result<Response, Failure> {
    let conn = ctx.auth.as_ref();
    match request {
        Request::SaslHandshake(req) => conn.handshake(req).await.map(Response::SaslHandshake),
        Request::SaslAuthenticate(req) => {
            conn.authenticate(req).await.map(Response::SaslAuthenticate)
        }
        Request::TokenAuthenticate(req) => {
            conn.token_login(req).await.map(Response::TokenAuthenticate)
        }
        Request::PutTokenKey(req) => token::put_token_key(conn, req)
            .await
            .map(Response::PutTokenKey),
        Request::DeleteTokenKey(req) => token::delete_token_key(conn, req)
            .await
            .map(Response::DeleteTokenKey),
        Request::ListTokenKeys(_) => token::list_token_keys(conn)
            .await
            .map(Response::ListTokenKeys),
        Request::PutUser(req) => users::put_user(conn, req).await.map(Response::PutUser),
        Request::DeleteUser(req) => users::delete_user(conn, req)
            .await
            .map(Response::DeleteUser),
        Request::ListUsers(_) => users::list_users(conn).await.map(Response::ListUsers),
        Request::AddAcl(req) => users::change_acl(conn, &req.entry, true)
            .await
            .map(Response::AddAcl),
        Request::RemoveAcl(req) => users::change_acl(conn, &req.entry, false)
            .await
            .map(Response::RemoveAcl),
        Request::ListAcls(req) => users::list_acls(conn, req).await.map(Response::ListAcls),
        Request::UnlockUser(req) => users::unlock_user(conn, req)
            .await
            .map(Response::UnlockUser),
        other => Err(ServeError::Internal {
            what: "route a request",
            reason: format!("{} has no handler", other.api_key().name()),
        }),
    }
}
