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

pub(super) fn forwarded_error<T>(e: GroupError) -> Forwarded<T> {
    match e {
        GroupError::NotLeader { leader } => Forwarded::NotLeader { leader },
        GroupError::Discarded { leader } => Forwarded::NotLeader { leader },
        GroupError::Timeout | GroupError::Raft { .. } | GroupError::Stopped => Forwarded::Retry {
            reason: e.to_string(),
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
        let voters = targets.voters;
        assert!(!voters.is_empty(), "a route to {vnode} with no voter");
        let mut target = targets.leader.unwrap_or(voters[0]);
        let mut last = String::from("no attempt");
        // Set once an attempt may have applied the request: from then on a
        // final failure is `OutcomeUnknown`, never a refusal.
        let mut uncertain: Option<String> = None;
        let mut next_voter = 0usize;
        let mut backoff = self.backoff(group_id);
        let mut redirects = Redirects::default();
        let deadline = Instant::now() + Duration::from_millis(self.route_timeout_ms);
        let mut attempts = 0;
        for attempt in 1..=self.attempts_max {
            attempts = attempt;
            let mut pause_at = None;
            let answer: Forwarded<T> = if target == self.node_id {
                local().await
            } else {
                self.forward_to(target, api_key, group_id, body, &mut last)
                    .await
            };
            match answer {
                Forwarded::Done(value) => return Ok(value),
                Forwarded::Failed { reason } => {
                    return Err(settle(
                        vnode,
                        uncertain,
                        RouteError::Failed { vnode, reason },
                    ));
                }
                Forwarded::Unknown { leader, reason } => {
                    tracing::debug!(%vnode, attempt, target, %reason, "metadata request outcome unknown");
                    last = reason.clone();
                    uncertain = Some(reason);
                    if let Some(leader) = leader
                        && leader != target
                    {
                        if redirects.fresh(target, leader) {
                            target = leader;
                            continue;
                        }
                        pause_at = Some(leader);
                    }
                }
                Forwarded::NotLeader {
                    leader: Some(leader),
                } if leader != target => {
                    last = format!("node {target} is not the leader; node {leader} is");
                    if redirects.fresh(target, leader) {
                        target = leader;
                        continue;
                    }
                    pause_at = Some(leader);
                }
                Forwarded::NotLeader { .. } => {
                    if last == "no attempt" {
                        last = format!("node {target} knows no leader");
                    }
                }
                Forwarded::Retry { reason } => last = reason,
            }
            tracing::debug!(%vnode, attempt, target, %last, "metadata request re-routed");
            // No leader known here, or replicas naming each other while an
            // election settles: pause so it can finish, then ask the named
            // leader again, or else the voters in turn.
            target = pause_at.unwrap_or_else(|| {
                next_voter += 1;
                voters[(next_voter - 1) % voters.len()]
            });
            redirects.paused();
            let pause = Duration::from_millis(backoff.next_delay_ms());
            if Instant::now() + pause >= deadline {
                last = format!("{last} (gave up after {} ms)", self.route_timeout_ms);
                break;
            }
            tokio::time::sleep(pause).await;
        }
        Err(settle(
            vnode,
            uncertain,
            RouteError::Unavailable {
                vnode,
                attempts,
                last,
            },
        ))
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

impl Router {
    /// Serves a request forwarded to this broker's replica `group` (a
    /// proposal, a read or a control query), by the ring `ring`.
    pub(super) async fn serve_group(
        &self,
        group: &MetadataGroup,
        group_id: u64,
        api_key: u16,
        body: &[u8],
        ring: &Ring,
    ) -> Result<Vec<u8>, RpcError> {
        let codec = |what: &'static str| {
            move |e: rmp_serde::decode::Error| RpcError::Decode {
                what,
                source: Arc::new(e),
            }
        };
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
                let read = group
                    .read(move |s| {
                        s.check_topic_route(&request.topic)
                            .map(|()| s.describe_topic(&request.topic))
                    })
                    .await;
                // Outside the arc, or being moved by a split, the answer is
                // the refusal: a reader routing by an older ring must not
                // take "absent" here for an answer.
                let answer: Forwarded<ReadAnswer> = match read {
                    Ok(answer) => Forwarded::Done(answer),
                    Err(e) => forwarded_error(e),
                };
                encode(&answer)
            }
            FORWARD_QUERY_API_KEY => {
                let query: Query =
                    rmp_serde::from_slice(body).map_err(codec("a forwarded query"))?;
                match query {
                    Query::Ring => {
                        let answer = match group.read(|s| s.ring_record().cloned()).await {
                            Ok(record) => Forwarded::Done(record),
                            Err(e) => forwarded_error(e),
                        };
                        encode(&answer)
                    }
                    Query::Membership => {
                        // The leader's own view, without a read-index
                        // round: cheap enough for every broker to ask every
                        // so often. A deposed leader's answer is at worst
                        // stale, and its `committed` flag then names a
                        // membership a quorum once held, which is all a
                        // reader acts on (`sweep_left_groups`).
                        let answer = if group.is_leader() {
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
                        };
                        encode(&answer)
                    }
                    Query::ListsSegments { topic, segments } => {
                        let read = group
                            .read(move |s| {
                                if let Some(topic) = &topic {
                                    s.check_topic_route(topic)?;
                                }
                                Ok::<_, ModelError>(
                                    segments
                                        .into_iter()
                                        .filter(|id| {
                                            s.segment(malachi_core::model::SegmentId(*id)).is_some()
                                        })
                                        .collect::<Vec<u64>>(),
                                )
                            })
                            .await;
                        let answer = match read {
                            Ok(Ok(listed)) => Forwarded::Done(listed),
                            Ok(Err(refused)) => Forwarded::Failed {
                                reason: refused.to_string(),
                            },
                            Err(e) => forwarded_error(e),
                        };
                        encode(&answer)
                    }
                    Query::Policies => {
                        let answer = match group.read(|s| s.policies().clone()).await {
                            Ok(policies) => Forwarded::Done(policies),
                            Err(e) => forwarded_error(e),
                        };
                        encode(&answer)
                    }
                    Query::CursorKeys => {
                        let answer = match group.read(|s| s.cursor_keys().cloned()).await {
                            Ok(keys) => Forwarded::Done(keys),
                            Err(e) => forwarded_error(e),
                        };
                        encode(&answer)
                    }
                    Query::Export { arc, id_base } => {
                        let read = group
                            .read(move |s| {
                                (s.fence() == Some(arc)).then(|| s.export_arc(arc, id_base))
                            })
                            .await;
                        let answer = match read {
                            Ok(Some(seed)) => Forwarded::Done(seed),
                            Ok(None) => Forwarded::Failed {
                                reason: format!("the arc {arc} is not fenced; nothing exported"),
                            },
                            Err(e) => forwarded_error(e),
                        };
                        encode(&answer)
                    }
                }
            }
            other => Err(RpcError::NotForwarded { api_key: other }),
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
