//! `Router`: how a request reaches a group's leader. It tries the leader
//! this broker knows of (serving it here when that is this broker),
//! follows `NotLeader` hints, tries the voters in turn, and bounds each
//! attempt and the whole route; and it serves the requests other brokers
//! forward to a replica hosted here. Which vnode a request is for (the
//! ring), and which replicas are here, are the host's: `routing.rs`.

use super::*;

/// Whether an answer is a vnode's refusal of a topic it does not (or no
/// longer) serve: outside its arc, or in a part a split is moving.
pub(super) trait RefusesRoute {
    fn is_misrouted(&self) -> bool;
}

impl RefusesRoute for Verdict {
    fn is_misrouted(&self) -> bool {
        matches!(self, Err(e) if e.is_misrouted())
    }
}

impl RefusesRoute for ReadAnswer {
    fn is_misrouted(&self) -> bool {
        matches!(self, Err(e) if e.is_misrouted())
    }
}

impl<T> Forwarded<T> {
    pub(super) fn noting(self, last: &mut String, reason: String) -> Forwarded<T> {
        *last = reason;
        self
    }
}

/// A group error as it travels back to a router. A replica that went
/// fatal (its volume full, its log damaged) cannot answer, but the group
/// can: the other voters elect a leader while this broker's `vnodes`
/// actor reopens the replica, so the router retries elsewhere.
pub(super) fn forwarded_error<T>(e: GroupError) -> Forwarded<T> {
    match e {
        GroupError::NotLeader { leader } => Forwarded::NotLeader { leader },
        GroupError::Discarded { leader } => Forwarded::NotLeader { leader },
        GroupError::Timeout | GroupError::Raft { .. } | GroupError::Stopped => Forwarded::Retry {
            reason: e.to_string(),
        },
        fatal if fatal.is_fatal() => Forwarded::Retry {
            reason: fatal.to_string(),
        },
        other => Forwarded::Failed {
            reason: other.to_string(),
        },
    }
}

/// How a route that failed ends: as `OutcomeUnknown` if an earlier attempt
/// may have applied the request, else as `failed`.
pub(super) fn settle(vnode: VnodeId, uncertain: Option<String>, failed: RouteError) -> RouteError {
    match uncertain {
        Some(reason) => RouteError::OutcomeUnknown { vnode, reason },
        None => failed,
    }
}

/// A proposal's failure as it travels back: one that may still commit
/// (timed out, or discarded by a leader change) is `Unknown`, so the router
/// can tell it from a refusal.
pub(super) fn proposal_error<T>(e: GroupError) -> Forwarded<T> {
    match e {
        GroupError::Discarded { leader } => Forwarded::Unknown {
            leader,
            reason: e.to_string(),
        },
        GroupError::Timeout => Forwarded::Unknown {
            leader: None,
            reason: "the proposal timed out".to_owned(),
        },
        // A leader whose own log append failed may already have sent the
        // entry to its followers: it may still commit under the next leader.
        fatal if fatal.is_fatal() => Forwarded::Unknown {
            leader: None,
            reason: fatal.to_string(),
        },
        other => forwarded_error(other),
    }
}

pub(super) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, RpcError> {
    rmp_serde::to_vec(value).map_err(|e| RpcError::Encode {
        what: "a forwarded answer",
        source: Arc::new(e),
    })
}

pub(super) fn encode_request<T: Serialize>(
    value: &T,
    vnode: VnodeId,
) -> Result<Vec<u8>, RouteError> {
    rmp_serde::to_vec(value).map_err(|e| RouteError::Failed {
        vnode,
        reason: e.to_string(),
    })
}

/// The replicas a routed request was redirected between since its last
/// pause. A redirect back to one of them is a cycle (two replicas naming
/// each other as leader while an election settles, e.g. a restarted
/// ex-leader and followers that still name it): it pauses like a missing
/// leader instead of spending every attempt at once.
#[derive(Debug, Default)]
pub(crate) struct Redirects {
    since_pause: Vec<u64>,
}

impl Redirects {
    /// Whether following `from`'s redirect to `to` is new since the last
    /// pause (follow it at once) rather than a cycle (pause first).
    pub(crate) fn fresh(&mut self, from: u64, to: u64) -> bool {
        if self.since_pause.contains(&to) {
            return false;
        }
        self.since_pause.push(from);
        self.since_pause.push(to);
        true
    }

    /// A pause happened: redirects may be followed at once again.
    pub(crate) fn paused(&mut self) {
        self.since_pause.clear();
    }
}

/// What one attempt's answer tells a route to do next.
enum Next<T> {
    /// The route ends: with the answer, or with a refusal.
    End(Result<T, RouteError>),
    /// A fresh redirect was followed: ask the new target at once.
    Redirected,
    /// Pause, then ask `at` (a named leader), or else the next voter.
    Pause { at: Option<u64> },
}

/// One routed request's progress over its attempts.
struct Route {
    vnode: VnodeId,
    voters: Vec<u64>,
    /// Whom the next attempt asks.
    target: u64,
    /// Why the last attempt did not answer: the final error's reason.
    last: String,
    /// Set once an attempt may have applied the request: from then on a
    /// final failure is `OutcomeUnknown`, never a refusal.
    uncertain: Option<String>,
    /// How many voters were tried in turn.
    next_voter: usize,
    redirects: Redirects,
}

impl Route {
    /// A route starting at `targets`' leader, else its first voter.
    fn new(vnode: VnodeId, targets: Targets) -> Route {
        let voters = targets.voters;
        assert!(!voters.is_empty(), "a route to {vnode} with no voter");
        let target = targets.leader.unwrap_or(voters[0]);
        Route {
            vnode,
            voters,
            target,
            last: String::from("no attempt"),
            uncertain: None,
            next_voter: 0,
            redirects: Redirects::default(),
        }
    }

    /// Decides what `answer` to attempt `attempt` means: the end, a fresh
    /// redirect to follow at once (`target` moves), or a pause. A redirect
    /// that cycles pauses toward the leader it names.
    fn judge<T>(&mut self, attempt: u32, answer: Forwarded<T>) -> Next<T> {
        let vnode = self.vnode;
        let target = self.target;
        let mut pause_at = None;
        match answer {
            Forwarded::Done(value) => return Next::End(Ok(value)),
            Forwarded::Failed { reason } => {
                let failed = RouteError::Failed { vnode, reason };
                return Next::End(Err(settle(vnode, self.uncertain.take(), failed)));
            }
            Forwarded::Unknown { leader, reason } => {
                tracing::debug!(%vnode, attempt, target, %reason, "metadata request outcome unknown");
                self.last = reason.clone();
                self.uncertain = Some(reason);
                if let Some(leader) = leader
                    && leader != target
                {
                    if self.redirect(leader) {
                        return Next::Redirected;
                    }
                    pause_at = Some(leader);
                }
            }
            Forwarded::NotLeader {
                leader: Some(leader),
            } if leader != target => {
                self.last = format!("node {target} is not the leader; node {leader} is");
                if self.redirect(leader) {
                    return Next::Redirected;
                }
                pause_at = Some(leader);
            }
            Forwarded::NotLeader { .. } => {
                if self.last == "no attempt" {
                    self.last = format!("node {target} knows no leader");
                }
            }
            Forwarded::Retry { reason } => self.last = reason,
        }
        Next::Pause { at: pause_at }
    }

    /// Follows a redirect to `leader` if it is fresh since the last pause.
    fn redirect(&mut self, leader: u64) -> bool {
        debug_assert_ne!(leader, self.target, "a redirect names another replica");
        let fresh = self.redirects.fresh(self.target, leader);
        if fresh {
            self.target = leader;
        }
        fresh
    }

    /// Chooses whom to ask after a pause. No leader known here, or
    /// replicas naming each other while an election settles: pause so it
    /// can finish, then ask the named leader again, or else the voters in
    /// turn.
    fn paused_toward(&mut self, pause_at: Option<u64>) {
        self.target = pause_at.unwrap_or_else(|| {
            self.next_voter += 1;
            self.voters[(self.next_voter - 1) % self.voters.len()]
        });
        self.redirects.paused();
    }

    /// How the route ends once out of attempts or time.
    fn unavailable(self, attempts: u32) -> RouteError {
        let vnode = self.vnode;
        let unavailable = RouteError::Unavailable {
            vnode,
            attempts,
            last: self.last,
        };
        settle(vnode, self.uncertain, unavailable)
    }
}

/// How a request reaches a group's leader: part of `VnodeHost`.
#[derive(Debug)]
pub struct Router {
    node_id: u64,
    transport: Arc<TcpTransport>,
    /// How long one forwarded request may take.
    forward_timeout_ms: u64,
    /// How many times one request is re-routed.
    attempts_max: u32,
    /// How long one request may keep being re-routed.
    route_timeout_ms: u64,
    /// The first and the longest pause between re-routes.
    backoff_ms: u64,
    backoff_max_ms: u64,
}

/// Where a request for one group may go: its voters, and the leader this
/// broker knows of.
#[derive(Debug, Clone)]
pub(super) struct Targets {
    pub voters: Vec<u64>,
    pub leader: Option<u64>,
}

impl Router {
    pub(super) fn new(config: &VnodeHostConfig, transport: Arc<TcpTransport>) -> Router {
        Router {
            node_id: config.node_id,
            transport,
            forward_timeout_ms: config.forward_timeout_ms,
            attempts_max: config.route_attempts_max,
            route_timeout_ms: config.route_timeout_ms,
            backoff_ms: config.route_retry_backoff_ms,
            backoff_max_ms: config.route_retry_backoff_max_ms,
        }
    }

    /// The transport requests are forwarded over.
    pub fn transport(&self) -> &Arc<TcpTransport> {
        &self.transport
    }

    /// The backoff of one re-routing loop about `subject` (a group, a
    /// topic): exponential with jitter, seeded by this node and the subject.
    pub(crate) fn backoff(&self, subject: u64) -> Backoff {
        Backoff::new(
            self.backoff_ms,
            self.backoff_max_ms,
            backoff_seed(self.node_id, subject),
        )
    }

    /// Sends a request to the leader of `vnode`'s group `group_id`,
    /// starting at `targets`' leader (else its first voter), following
    /// `NotLeader` hints and trying the voters in turn, for at most
    /// `route_attempts_max` attempts and `route_timeout_ms`. An attempt
    /// aimed at this broker runs `local` instead of the transport.
    pub(super) async fn route_group<'a, T: serde::de::DeserializeOwned>(
        &self,
        vnode: VnodeId,
        targets: Targets,
        api_key: u16,
        body: &[u8],
        local: impl Fn() -> futures::future::BoxFuture<'a, Forwarded<T>>,
    ) -> Result<T, RouteError> {
        let group_id = group_of(vnode);
        let mut route = Route::new(vnode, targets);
        let mut backoff = self.backoff(group_id);
        let deadline = Instant::now() + Duration::from_millis(self.route_timeout_ms);
        let mut attempts = 0;
        for attempt in 1..=self.attempts_max {
            attempts = attempt;
            let answer: Forwarded<T> = if route.target == self.node_id {
                local().await
            } else {
                self.forward_to(route.target, api_key, group_id, body, &mut route.last)
                    .await
            };
            let pause_at = match route.judge(attempt, answer) {
                Next::End(ended) => return ended,
                Next::Redirected => continue,
                Next::Pause { at } => at,
            };
            tracing::debug!(%vnode, attempt, target = route.target, last = %route.last, "metadata request re-routed");
            route.paused_toward(pause_at);
            let pause = Duration::from_millis(backoff.next_delay_ms());
            if Instant::now() + pause >= deadline {
                route.last = format!(
                    "{} (gave up after {} ms)",
                    route.last, self.route_timeout_ms
                );
                break;
            }
            tokio::time::sleep(pause).await;
        }
        Err(route.unavailable(attempts))
    }

    /// Sends a request to `target`'s forwarding service and decodes its
    /// answer. A transport failure reads as "no leader known", with its
    /// reason kept in `last` for the final error.
    pub(super) async fn forward_to<T: serde::de::DeserializeOwned>(
        &self,
        target: u64,
        api_key: u16,
        group_id: u64,
        body: &[u8],
        last: &mut String,
    ) -> Forwarded<T> {
        match self
            .transport
            .call_raw(target, api_key, group_id, body, self.forward_timeout_ms)
            .await
        {
            Ok(bytes) => rmp_serde::from_slice(&bytes).unwrap_or_else(|e| Forwarded::Retry {
                reason: format!("undecodable answer: {e}"),
            }),
            // A proposal whose connection failed may have reached the
            // leader before it did: its outcome is unknown.
            Err(e @ TransportError::Network { .. }) if api_key == FORWARD_PROPOSE_API_KEY => {
                Forwarded::Unknown {
                    leader: None,
                    reason: e.to_string(),
                }
            }
            Err(
                e @ (TransportError::Unreachable { .. }
                | TransportError::Network { .. }
                | TransportError::Remote { .. }),
            ) => Forwarded::NotLeader { leader: None }.noting(last, e.to_string()),
        }
    }

    /// Sends a membership step (`api_key`, `body`) to `node` and takes its
    /// answer: done, or the peer's refusal.
    pub(super) async fn ask_peer(
        &self,
        node: u64,
        api_key: u16,
        group_id: u64,
        body: &[u8],
    ) -> Result<(), StepError> {
        let bytes = self
            .transport
            .call_raw(node, api_key, group_id, body, self.forward_timeout_ms)
            .await?;
        match rmp_serde::from_slice::<Forwarded<()>>(&bytes)? {
            Forwarded::Done(()) => Ok(()),
            answer => Err(StepError::Refused { node, answer }),
        }
    }

    /// Tells `peers` that ring `version` exists, best effort.
    pub(super) async fn announce_ring(&self, peers: &[u64], version: u64) {
        let Ok(body) = rmp_serde::to_vec(&RingAnnounce { version }) else {
            return;
        };
        let calls = peers.iter().map(|node| {
            self.transport.call_raw(
                *node,
                RING_ANNOUNCE_API_KEY,
                RING_GROUP_ID,
                &body,
                self.forward_timeout_ms,
            )
        });
        for (node, result) in peers.iter().zip(futures::future::join_all(calls).await) {
            if let Err(e) = result {
                tracing::debug!(node, version, error = %e, "ring announcement not delivered");
            }
        }
    }
}

/// The decoder error of a forwarded `what`.
fn codec(what: &'static str) -> impl Fn(rmp_serde::decode::Error) -> RpcError {
    move |e| RpcError::Decode {
        what,
        source: Arc::new(e),
    }
}

/// A replica's read as it travels back: the value, or the group's error.
fn answered<V>(read: Result<V, GroupError>) -> Forwarded<V> {
    match read {
        Ok(value) => Forwarded::Done(value),
        Err(e) => forwarded_error(e),
    }
}

impl Router {
    /// Serves a request forwarded to this broker's replica `group` (a
    /// proposal, a read or a control query), by the ring `ring`: decides
    /// by `api_key` which service answers; an unknown key is refused.
    pub(super) async fn serve_group(
        &self,
        group: &MetadataGroup,
        group_id: u64,
        api_key: u16,
        body: &[u8],
        ring: &Ring,
    ) -> Result<Vec<u8>, RpcError> {
        match api_key {
            FORWARD_PROPOSE_API_KEY => {
                let cmd: Command =
                    rmp_serde::from_slice(body).map_err(codec("a forwarded command"))?;
                let answer = match self.propose_here(group, group_id, cmd, ring).await {
                    Ok(verdict) => Forwarded::Done(verdict),
                    Err(e) => proposal_error(e),
                };
                encode(&answer)
            }
            FORWARD_READ_API_KEY => {
                let request: ReadRequest =
                    rmp_serde::from_slice(body).map_err(codec("a forwarded read"))?;
                encode(&serve_read(group, request).await)
            }
            FORWARD_QUERY_API_KEY => {
                let query: Query =
                    rmp_serde::from_slice(body).map_err(codec("a forwarded query"))?;
                self.serve_query(group, query).await
            }
            other => Err(RpcError::NotForwarded { api_key: other }),
        }
    }

    /// Answers a forwarded control query from this broker's replica.
    async fn serve_query(&self, group: &MetadataGroup, query: Query) -> Result<Vec<u8>, RpcError> {
        match query {
            Query::Ring => encode(&answered(group.read(|s| s.ring_record().cloned()).await)),
            Query::Membership => encode(&self.membership_here(group)),
            Query::ListsSegments { topic, segments } => {
                encode(&lists_segments(group, topic, segments).await)
            }
            Query::Policies => encode(&answered(group.read(|s| s.policies().clone()).await)),
            Query::CursorKeys => encode(&answered(group.read(|s| s.cursor_keys().cloned()).await)),
            Query::AuthView => encode(&answered(group.read(|s| s.auth_view()).await)),
            Query::Export { arc, id_base } => encode(&export_arc(group, arc, id_base).await),
        }
    }

    /// The group's membership as this replica sees it, if it leads; else
    /// the leader it knows of. The leader's own view, without a read-index
    /// round: cheap enough for every broker to ask every so often. A
    /// deposed leader's answer is at worst stale, and its `committed` flag
    /// then names a membership a quorum once held, which is all a reader
    /// acts on (`sweep_left_groups`).
    fn membership_here(&self, group: &MetadataGroup) -> Forwarded<VnodeMembership> {
        if group.is_leader() {
            let m: GroupMembership = group.membership();
            Forwarded::Done(VnodeMembership {
                leader: self.node_id,
                voters: m.voters.into_iter().collect(),
                learners: m.learners.into_iter().collect(),
                joint: m.joint,
                committed: m.committed,
            })
        } else {
            Forwarded::NotLeader {
                leader: group.leader_term().0,
            }
        }
    }

    /// Proposes on this broker's replica, first recording the vnode's arc
    /// if the group has none yet.
    pub(super) async fn propose_here(
        &self,
        group: &MetadataGroup,
        group_id: u64,
        cmd: Command,
        ring: &Ring,
    ) -> Result<Verdict, GroupError> {
        if cmd.topic().is_some() && group.read_local(|s| s.arc()).is_none() {
            let vnode = u32::try_from(group_id)
                .ok()
                .and_then(|id| ring.vnode(VnodeId(id)).copied());
            if let Some(vnode) = vnode {
                let arc = vnode.arc;
                let id_base = vnode.id.id_base();
                match group.propose(Command::AssignArc { arc, id_base }).await? {
                    Ok(_) => tracing::info!(group = group_id, %arc, "vnode arc recorded"),
                    // The group already holds a topic outside this arc (a
                    // lone broker's group 0 from before vnodes): leave it
                    // unenforced rather than refuse its own topics.
                    Err(refused) => {
                        tracing::warn!(group = group_id, %refused, "vnode arc not recorded")
                    }
                }
            }
        }
        group.propose(cmd).await
    }
}

/// Reads a topic's description for a forwarded read. Outside the arc, or
/// being moved by a split, the answer is the refusal: a reader routing by
/// an older ring must not take "absent" here for an answer.
async fn serve_read(group: &MetadataGroup, request: ReadRequest) -> Forwarded<ReadAnswer> {
    let read = group
        .read(move |s| {
            s.check_topic_route(&request.topic)
                .map(|()| s.describe_topic(&request.topic))
        })
        .await;
    answered(read)
}

/// Which of `segments` the group's state lists, checked against `topic`'s
/// route first when one is named: a refused route is a failure, not an
/// empty list.
async fn lists_segments(
    group: &MetadataGroup,
    topic: Option<String>,
    segments: Vec<u64>,
) -> Forwarded<Vec<u64>> {
    let read = group
        .read(move |s| {
            if let Some(topic) = &topic {
                s.check_topic_route(topic)?;
            }
            Ok::<_, ModelError>(
                segments
                    .into_iter()
                    .filter(|id| s.segment(malachi_core::model::SegmentId(*id)).is_some())
                    .collect::<Vec<u64>>(),
            )
        })
        .await;
    match read {
        Ok(Ok(listed)) => Forwarded::Done(listed),
        Ok(Err(refused)) => Forwarded::Failed {
            reason: refused.to_string(),
        },
        Err(e) => forwarded_error(e),
    }
}

/// The seed of `arc` for a split, only while the group is fenced at
/// exactly that arc: an unfenced arc may still change under the export.
async fn export_arc(
    group: &MetadataGroup,
    arc: RingArc,
    id_base: u64,
) -> Forwarded<malachi_core::model::VnodeSeed> {
    let read = group
        .read(move |s| (s.fence() == Some(arc)).then(|| s.export_arc(arc, id_base)))
        .await;
    match read {
        Ok(Some(seed)) => Forwarded::Done(seed),
        Ok(None) => Forwarded::Failed {
            reason: format!("the arc {arc} is not fenced; nothing exported"),
        },
        Err(e) => forwarded_error(e),
    }
}
