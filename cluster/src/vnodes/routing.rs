//! The host's routing: which vnode a request is for (by the `RingStore`'s
//! routing ring, re-fetched on a misrouted answer), where its group's
//! leader may be (the `GroupSet`'s replica, else the voters), and the
//! `Router` that gets it there; and what this broker serves to other
//! brokers' forwarded requests (`RpcService`), which opens and closes
//! replicas or hands the request to a hosted one.

use super::*;

#[async_trait::async_trait]
impl RpcService for VnodeHost {
    async fn serve(&self, api_key: u16, group_id: u64, body: Bytes) -> Result<Vec<u8>, RpcError> {
        // A stopping host's groups are shutting down: answer for them,
        // rather than hand a peer's heartbeat to a stopped raft (which
        // logs it as an error).
        if self.is_stopped() {
            return Err(RpcError::Group(crate::group::GroupError::Stopped));
        }
        match api_key {
            FORWARD_PROPOSE_API_KEY
            | FORWARD_READ_API_KEY
            | FORWARD_QUERY_API_KEY
            | OPEN_VNODE_API_KEY
            | CLOSE_VNODE_API_KEY
            | RING_ANNOUNCE_API_KEY => self.serve_forwarded(api_key, group_id, &body).await,
            _ => self.registry().serve_raft(api_key, group_id, &body).await,
        }
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
            vnode: self.rings.routing().owner(topic).id,
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
        let mut backoff = self
            .router
            .backoff(xxhash_rust::xxh3::xxh3_64(topic.as_bytes()));
        loop {
            let routing = self.rings.routing();
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
                self.rings.set_routing(current);
                continue;
            }
            tracing::info!(%vnode, topic, version = routing.version(), "misrouted: fetching the ring");
            match self.refresh_ring().await {
                Ok(fetched) => self.rings.set_routing(fetched),
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
    /// topic).
    pub(crate) fn route_backoff(&self, subject: u64) -> Backoff {
        self.router.backoff(subject)
    }

    /// Sends a request to the leader of `vnode`'s group (or of the ring's
    /// group for `RING_VNODE`) through the `Router`, starting at the leader
    /// this broker's replica knows of, else the group's voters.
    pub(super) async fn route_group<T: serde::de::DeserializeOwned>(
        &self,
        vnode: VnodeId,
        api_key: u16,
        body: &[u8],
    ) -> Result<T, RouteError> {
        if self.is_stopped() {
            return Err(RouteError::Stopped);
        }
        let group_id = group_of(vnode);
        let mut voters = self.voters(vnode);
        if voters.is_empty() {
            voters = self.nodes();
        }
        let targets = Targets {
            voters,
            leader: self.groups.known_leader(vnode),
        };
        self.router
            .route_group(vnode, targets, api_key, body, || {
                Box::pin(self.serve_local(api_key, group_id, body))
            })
            .await
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
        let Some(group) = self.groups.get(group_id) else {
            // Not a replica: no leader to name.
            return encode(&Forwarded::<()>::NotLeader { leader: None });
        };
        let ring = self.ring();
        self.router
            .serve_group(&group, group_id, api_key, body, &ring)
            .await
    }
}
