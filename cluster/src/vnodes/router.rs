//! The router: a metadata request runs on this broker if it leads the
//! vnode, else it is forwarded to the leader it knows of, following
//! `NotLeader` hints and re-fetching the ring on a misrouted answer, each
//! attempt and the whole route bounded. Also what this broker serves to
//! other brokers' forwarded requests (`RpcService`).

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

#[async_trait::async_trait]
impl RpcService for VnodeHost {
    async fn serve(&self, api_key: u16, group_id: u64, body: Bytes) -> Result<Vec<u8>, RpcError> {
        // A stopping host's groups are shutting down: answer for them,
        // rather than hand a peer's heartbeat to a stopped raft (which
        // logs it as an error).
        if self.stopped.load(Ordering::Acquire) {
            return Err(RpcError::Group(crate::group::GroupError::Stopped));
        }
        match api_key {
            FORWARD_PROPOSE_API_KEY
            | FORWARD_READ_API_KEY
            | FORWARD_QUERY_API_KEY
            | OPEN_VNODE_API_KEY
            | CLOSE_VNODE_API_KEY
            | RING_ANNOUNCE_API_KEY => self.serve_forwarded(api_key, group_id, &body).await,
            _ => self.registry.serve_raft(api_key, group_id, &body).await,
        }
    }
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

impl VnodeHost {
    /// Which of `segments` one vnode's metadata lists, read linearizably
    /// from its leader (ADR 0115).
    pub async fn segments_listed_by(
        &self,
        vnode: VnodeId,
        segments: &[u64],
    ) -> Result<Vec<u64>, RouteError> {
        self.ask_listed(vnode, None, segments).await
    }

    /// Which of `segments`, all of `topic`, the topic's own vnode lists
    /// (ADR 0115): a vnode that does not hold the topic refuses, so "not
    /// listed" always comes from the one group that could list them.
    pub async fn topic_segments_listed(
        &self,
        topic: &str,
        segments: &[u64],
    ) -> Result<Vec<u64>, RouteError> {
        let vnode = self.ring().owner(topic).id;
        self.ask_listed(vnode, Some(topic.to_owned()), segments)
            .await
    }

    pub(super) async fn ask_listed(
        &self,
        vnode: VnodeId,
        topic: Option<String>,
        segments: &[u64],
    ) -> Result<Vec<u64>, RouteError> {
        let query = encode_request(
            &Query::ListsSegments {
                topic,
                segments: segments.to_vec(),
            },
            vnode,
        )?;
        self.route_group(vnode, FORWARD_QUERY_API_KEY, &query).await
    }

    /// Which of `segments` any vnode lists: every vnode of the ring, and
    /// the ring's own group, is asked (ADR 0115, the seed's orphan rule).
    /// Whole or nothing: a vnode that does not answer, or a ring that
    /// changes or has a split pending while they are asked, is an error,
    /// and then no id may be judged unlisted.
    pub async fn segments_listed(&self, segments: &[u64]) -> Result<SegmentListing, ListingError> {
        if segments.len() > LISTS_SEGMENTS_MAX {
            return Err(ListingError::TooMany {
                count: segments.len(),
            });
        }
        let silent = |vnode, source| ListingError::Silent { vnode, source };
        let before = self
            .ring_record()
            .await
            .map_err(|e| silent(RING_VNODE, e))?;
        if before.pending.is_some() {
            let v = before.ring.version();
            return Err(ListingError::RingMoved {
                before: v,
                after: v,
                pending: true,
            });
        }
        let mut vnodes: Vec<VnodeId> = before.ring.vnodes().map(|v| v.id).collect();
        vnodes.push(RING_VNODE);
        let mut listed = BTreeSet::new();
        for &vnode in &vnodes {
            let answer = self
                .segments_listed_by(vnode, segments)
                .await
                .map_err(|e| silent(vnode, e))?;
            listed.extend(answer);
        }
        let after = self
            .ring_record()
            .await
            .map_err(|e| silent(RING_VNODE, e))?;
        if after.ring.version() != before.ring.version() || after.pending.is_some() {
            return Err(ListingError::RingMoved {
                before: before.ring.version(),
                after: after.ring.version(),
                pending: after.pending.is_some(),
            });
        }
        Ok(SegmentListing {
            listed,
            vnodes_asked: vnodes.len(),
        })
    }

    /// Applies `cmd` on the vnode owning its topic, wherever its leader is.
    pub async fn propose(&self, cmd: Command) -> Result<Verdict, RouteError> {
        let topic = cmd.topic().ok_or(RouteError::Unroutable)?.to_owned();
        let body = encode_request(&cmd, VnodeId(0))?;
        self.route(&topic, FORWARD_PROPOSE_API_KEY, body).await
    }

    /// A linearizable description of `topic` from its vnode's leader.
    pub async fn describe(&self, topic: &str) -> Result<Option<TopicDescription>, RouteError> {
        let body = encode_request(
            &ReadRequest {
                topic: topic.to_owned(),
            },
            VnodeId(0),
        )?;
        let answer: ReadAnswer = self.route(topic, FORWARD_READ_API_KEY, body).await?;
        // Still refused once `moved_wait_ms` ran out: no ring this broker
        // could fetch leads to a vnode serving the topic.
        answer.map_err(|refused| RouteError::Unavailable {
            vnode: self.routing_ring.read().owner(topic).id,
            attempts: self.config.route_attempts_max,
            last: refused.to_string(),
        })
    }

    /// Sends `cmd` to `vnode` without consulting the ring: the path a
    /// broker with a wrong ring takes (the vnode's own arc check answers),
    /// and the path of commands that name no topic (leases, split steps).
    pub async fn propose_to(&self, vnode: VnodeId, cmd: Command) -> Result<Verdict, RouteError> {
        let body = encode_request(&cmd, vnode)?;
        self.route_group(vnode, FORWARD_PROPOSE_API_KEY, &body)
            .await
    }

    /// Routes by the ring, following misrouted answers (`WrongVnode`: the
    /// vnode no longer owns the topic; `Moved`: a split is moving it) to
    /// the current ring, for at most `moved_wait_ms`.
    pub(super) async fn route<T: serde::de::DeserializeOwned + RefusesRoute>(
        &self,
        topic: &str,
        api_key: u16,
        body: Vec<u8>,
    ) -> Result<T, RouteError> {
        let deadline = Instant::now() + Duration::from_millis(self.config.moved_wait_ms);
        let mut backoff = self.route_backoff(xxhash_rust::xxh3::xxh3_64(topic.as_bytes()));
        loop {
            let routing = Arc::clone(&self.routing_ring.read());
            let vnode = routing.owner(topic).id;
            let answer = self.route_group::<T>(vnode, api_key, &body).await?;
            if !answer.is_misrouted() {
                return Ok(answer);
            }
            if Instant::now() >= deadline {
                return Ok(answer);
            }
            let current = self.ring();
            if !Arc::ptr_eq(&current, &routing) {
                // This broker already knows a newer ring than it routed by.
                tracing::info!(%vnode, topic, version = current.version(), "misrouted: routing by the current ring");
                *self.routing_ring.write() = current;
                continue;
            }
            tracing::info!(%vnode, topic, version = routing.version(), "misrouted: fetching the ring");
            match self.refresh_ring().await {
                Ok(fetched) => *self.routing_ring.write() = Arc::clone(&fetched),
                Err(e) => tracing::debug!(%vnode, error = %e, "ring fetch failed"),
            }
            if self.ring().version() == routing.version() {
                // A split is between its fence and its ring commit (or the
                // ring group is out of reach): wait for it.
                tokio::time::sleep(Duration::from_millis(backoff.next_delay_ms())).await;
            }
        }
    }

    /// The backoff of one re-routing loop about `subject` (a group, a
    /// topic): exponential with jitter, seeded by this node and the subject.
    pub(crate) fn route_backoff(&self, subject: u64) -> Backoff {
        Backoff::new(
            self.config.route_retry_backoff_ms,
            self.config.route_retry_backoff_max_ms,
            backoff_seed(self.config.node_id, subject),
        )
    }

    /// Sends a request to the leader of `vnode`'s group (or of the ring's
    /// group for `RING_VNODE`), following `NotLeader` hints and trying the
    /// group's voters in turn, for at most `route_attempts_max` attempts.
    pub(super) async fn route_group<T: serde::de::DeserializeOwned>(
        &self,
        vnode: VnodeId,
        api_key: u16,
        body: &[u8],
    ) -> Result<T, RouteError> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(RouteError::Stopped);
        }
        let group_id = group_of(vnode);
        let mut voters = self.voters(vnode);
        if voters.is_empty() {
            voters = self.nodes();
        }
        let mut target = self
            .registry
            .get(group_id)
            .and_then(|g| g.leader_term().0)
            .unwrap_or(voters[0]);
        let mut last = String::from("no attempt");
        // Set once an attempt may have applied the request: from then on a
        // final failure is `OutcomeUnknown`, never a refusal.
        let mut uncertain: Option<String> = None;
        let mut next_voter = 0usize;
        let mut backoff = self.route_backoff(group_id);
        let mut redirects = Redirects::default();
        let deadline = Instant::now() + Duration::from_millis(self.config.route_timeout_ms);
        let mut attempts = 0;
        for attempt in 1..=self.config.route_attempts_max {
            attempts = attempt;
            let mut pause_at = None;
            let answer: Forwarded<T> = if target == self.config.node_id {
                self.serve_local(api_key, group_id, body).await
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
                last = format!("{last} (gave up after {} ms)", self.config.route_timeout_ms);
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

    /// Serves a forwarded request on this broker's replica.
    pub(super) async fn serve_local<T: serde::de::DeserializeOwned>(
        &self,
        api_key: u16,
        group_id: u64,
        body: &[u8],
    ) -> Forwarded<T> {
        // Locally the answer is encoded and decoded like a remote one, so
        // both paths are the same code; metadata answers are small.
        let encoded = match self.serve_forwarded(api_key, group_id, body).await {
            Ok(bytes) => bytes,
            Err(e) => {
                return Forwarded::Failed {
                    reason: e.to_string(),
                };
            }
        };
        rmp_serde::from_slice(&encoded).unwrap_or_else(|e| Forwarded::Failed {
            reason: format!("undecodable local answer: {e}"),
        })
    }

    pub(super) async fn serve_forwarded(
        &self,
        api_key: u16,
        group_id: u64,
        body: &[u8],
    ) -> Result<Vec<u8>, RpcError> {
        let codec = |what: &'static str| {
            move |e: rmp_serde::decode::Error| RpcError::Decode {
                what,
                source: Arc::new(e),
            }
        };
        if api_key == RING_ANNOUNCE_API_KEY {
            let announced: RingAnnounce =
                rmp_serde::from_slice(body).map_err(codec("a ring announce"))?;
            if let Some(host) = self.this.upgrade() {
                host.observe_ring_version(announced.version);
            }
            return encode(&Forwarded::Done(()));
        }
        if api_key == OPEN_VNODE_API_KEY {
            let request: OpenVnode =
                rmp_serde::from_slice(body).map_err(codec("an open vnode request"))?;
            let answer = match self.open_requested(request.vnode, request.voters).await {
                Ok(()) => Forwarded::Done(()),
                Err(e) => forwarded_error(e),
            };
            return encode(&answer);
        }
        if api_key == CLOSE_VNODE_API_KEY {
            let request: CloseVnode =
                rmp_serde::from_slice(body).map_err(codec("a close vnode request"))?;
            let answer = match self.close_requested(request).await {
                Ok(()) => Forwarded::Done(()),
                Err(e) => forwarded_error(e),
            };
            return encode(&answer);
        }
        let Some(group) = self.registry.get(group_id) else {
            // Not a replica: no leader to name.
            return encode(&Forwarded::<()>::NotLeader { leader: None });
        };
        match api_key {
            FORWARD_PROPOSE_API_KEY => {
                let cmd: Command =
                    rmp_serde::from_slice(body).map_err(codec("a forwarded command"))?;
                let answer = match self.propose_here(&group, group_id, cmd).await {
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
                                leader: self.config.node_id,
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
    ) -> Result<Verdict, GroupError> {
        if cmd.topic().is_some() && group.read_local(|s| s.arc()).is_none() {
            let vnode = u32::try_from(group_id)
                .ok()
                .and_then(|id| self.ring().vnode(VnodeId(id)).copied());
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

impl VnodeHost {
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
            .call_raw(
                target,
                api_key,
                group_id,
                body,
                self.config.forward_timeout_ms,
            )
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
}
