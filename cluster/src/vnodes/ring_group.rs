//! The host's side of the ring: what the ring's own raft group is asked
//! (its record, cursor keys, policies, member changes), reached through
//! the `Router`, and how a newer ring is adopted, which needs both the
//! `RingStore` (the ring) and the `GroupSet` (the replicas it adds).

use super::*;

/// What one attempt of a ring change found: the ring group's verdict
/// (taken, with the version and what to log; or refused), or that the
/// group could not be reached.
pub(super) type RingChange = Result<Result<(u64, &'static str), ModelError>, RouteError>;

/// Runs `change` until it is done: `None` (nothing to change), the ring
/// group's verdict (taken, or refused, logged as an error), or, while the
/// group cannot be reached, again after a backoff. Returns then: a ring
/// change is a one-shot. With `which`, each pass first trips a fault a
/// test armed (`VnodeHost::fail_loop`).
pub(super) async fn run_ring_change<F, Fut>(
    host: std::sync::Weak<VnodeHost>,
    which: Option<HostLoop>,
    what: &'static str,
    change: F,
) where
    F: Fn(Arc<VnodeHost>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Option<RingChange>> + Send + 'static,
{
    let mut backoff = None;
    loop {
        let Some(strong) = host.upgrade() else { break };
        if strong.is_stopped() {
            break;
        }
        if let Some(which) = which {
            strong.trip(which);
        }
        let me = strong.config.node_id;
        let backoff = backoff.get_or_insert_with(|| {
            Backoff::new(
                RING_SYNC_BACKOFF_MIN_MS,
                RING_SYNC_BACKOFF_MAX_MS,
                backoff_seed(me, RING_GROUP_ID),
            )
        });
        match change(Arc::clone(&strong)).await {
            None => break,
            Some(Ok(Ok((version, done)))) => {
                tracing::info!(node = me, ring_version = version, "{done}");
                break;
            }
            Some(Ok(Err(refused))) => {
                tracing::error!(node = me, what, %refused, "the ring's group refused this broker's change");
                break;
            }
            Some(Err(e)) => {
                tracing::info!(node = me, what, error = %e, "the ring's group not reached yet; asking again");
            }
        }
        drop(strong);
        tokio::time::sleep(Duration::from_millis(backoff.next_delay_ms())).await;
    }
}

impl VnodeHost {
    /// Makes `node` an active member (ADR 0104): its share of the vnode
    /// replicas moves to it. Returns the ring version that lists it, or
    /// the ring group's refusal.
    pub async fn admit(&self, node: u64) -> Result<Result<u64, ModelError>, RouteError> {
        let cmd = Command::AdmitNode {
            node,
            formed: self.config.nodes.clone(),
        };
        self.change_members(cmd).await
    }

    /// Decommissions `node` (ADR 0104): its vnode replicas move to the
    /// active members. Returns the ring version that says so.
    pub async fn decommission(&self, node: u64) -> Result<Result<u64, ModelError>, RouteError> {
        let cmd = Command::DecommissionNode {
            node,
            formed: self.config.nodes.clone(),
            replicas: u32::try_from(self.config.replicas_per_vnode).unwrap_or(u32::MAX),
        };
        self.change_members(cmd).await
    }

    pub(super) async fn change_members(
        &self,
        cmd: Command,
    ) -> Result<Result<u64, ModelError>, RouteError> {
        // A fresh ring group holds no ring yet: create it first.
        self.ring_record().await?;
        let version = match self.propose_ring(cmd).await? {
            Ok(Outcome::RingChanged { version }) => version,
            Ok(other) => {
                return Err(RouteError::Failed {
                    vnode: RING_VNODE,
                    reason: format!("unexpected outcome {other:?}"),
                });
            }
            Err(refused) => return Ok(Err(refused)),
        };
        self.refresh_ring().await?;
        self.announce_ring(version).await;
        Ok(Ok(version))
    }

    /// Fetches the current ring until one answer arrives, then parks: the
    /// host's owner runs it (`HostLoop::RingSync`) and is told if it ends.
    pub(super) async fn run_ring_sync(host: std::sync::Weak<VnodeHost>) {
        let mut backoff = None;
        loop {
            let Some(strong) = host.upgrade() else { return };
            let backoff = backoff.get_or_insert_with(|| {
                Backoff::new(
                    RING_SYNC_BACKOFF_MIN_MS,
                    RING_SYNC_BACKOFF_MAX_MS,
                    backoff_seed(strong.config.node_id, RING_GROUP_ID),
                )
            });
            if strong.is_stopped() {
                return;
            }
            strong.trip(HostLoop::RingSync);
            match strong.refresh_ring().await {
                Ok(ring) => {
                    tracing::debug!(
                        node = strong.config.node_id,
                        version = ring.version(),
                        "ring fetched"
                    );
                    break;
                }
                Err(e) => {
                    tracing::debug!(node = strong.config.node_id, error = %e, "ring fetch failed; retrying")
                }
            }
            drop(strong);
            tokio::time::sleep(Duration::from_millis(backoff.next_delay_ms())).await;
        }
        // Fetched: its work is done, and a loop that returns has ended.
        // It parks until the host stops (or a test fails it).
        let Some(strong) = host.upgrade() else { return };
        let signals = Arc::clone(&strong.signals);
        drop(strong);
        signals.armed(HostLoop::RingSync).await;
        if let Some(strong) = host.upgrade() {
            strong.trip(HostLoop::RingSync);
        }
    }

    /// The voters of the ring's own group.
    pub fn ring_voters(&self) -> Vec<u64> {
        self.voters(RING_VNODE)
    }

    /// The ring this broker believes current.
    pub fn ring(&self) -> Arc<Ring> {
        self.rings.current()
    }

    /// Routes by `ring` until a misrouted answer makes the router re-read
    /// the current ring. For tests of a broker whose ring lags.
    pub fn set_routing_ring(&self, ring: Ring) {
        self.rings.set_routing(Arc::new(ring));
    }

    /// Learns `ring` if it is newer than the one this broker holds: keeps it
    /// on disk, opens this broker's replicas of vnodes it adds, and routes by
    /// it from then on. Returns whether it was newer.
    pub async fn adopt_ring(&self, ring: Ring) -> Result<bool, GroupError> {
        let _opening = self.groups.opening().await;
        if !self.rings.is_newer(ring.version()) {
            return Ok(false);
        }
        // Replicas first: once routing names a vnode, this broker should
        // already serve its raft messages. Computed by the new ring.
        let ring = Arc::new(ring);
        let previous = self.rings.advance(Arc::clone(&ring));
        let opened = async {
            for vnode in ring.vnodes() {
                self.open_vnode_locked(vnode.id).await?;
            }
            Ok::<(), GroupError>(())
        }
        .await;
        if let Err(e) = opened {
            self.rings.restore(previous, &ring);
            return Err(e);
        }
        self.rings.keep(&ring).await;
        tracing::info!(
            node = self.config.node_id,
            version = ring.version(),
            vnodes = ring.len(),
            "ring adopted"
        );
        self.rings.route_by_current();
        self.update_probe_peers();
        Ok(true)
    }

    /// Fetches the current ring from the ring's group (creating it there,
    /// the same for every broker, if the group holds none yet) and adopts it.
    pub async fn refresh_ring(&self) -> Result<Arc<Ring>, RouteError> {
        let record = self.ring_record().await?;
        self.adopt_ring(record.ring)
            .await
            .map_err(|e| RouteError::Failed {
                vnode: RING_VNODE,
                reason: e.to_string(),
            })?;
        Ok(self.ring())
    }

    /// Called with the ring version another broker announces (membership
    /// gossip): fetches the current ring in the background if it is newer.
    pub fn observe_ring_version(self: &Arc<Self>, version: u64) {
        if !self.rings.is_newer(version) || self.is_stopped() {
            return;
        }
        let host = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(e) = host.refresh_ring().await {
                tracing::debug!(node = host.config.node_id, version, error = %e, "announced ring not fetched");
            }
        });
    }

    /// Tells every other broker that ring `version` exists, best effort:
    /// each fetches it in the background. Gossip and misrouted answers
    /// reach any broker this misses.
    pub async fn announce_ring(&self, version: u64) {
        let me = self.config.node_id;
        let peers: Vec<u64> = self.nodes().into_iter().filter(|n| *n != me).collect();
        self.router.announce_ring(&peers, version).await;
    }

    /// The ring's group's record (the ring and any split in progress),
    /// read from its leader.
    pub async fn ring_record(&self) -> Result<RingRecord, RouteError> {
        let query = encode_request(&Query::Ring, RING_VNODE)?;
        for _ in 0..2 {
            let record: Option<RingRecord> = self
                .route_group(RING_VNODE, FORWARD_QUERY_API_KEY, &query)
                .await?;
            if let Some(record) = record {
                self.adopt_features(record.features.clone());
                return Ok(record);
            }
            // A fresh ring group: create the ring every broker starts from.
            let init = Command::InitRing {
                vnodes: self.config.vnode_count,
            };
            self.propose_ring(init)
                .await?
                .map_err(|e| RouteError::Failed {
                    vnode: RING_VNODE,
                    reason: e.to_string(),
                })?;
        }
        Err(RouteError::Failed {
            vnode: RING_VNODE,
            reason: "the ring group holds no ring after creating one".to_owned(),
        })
    }

    /// The cluster's cursor keys, read linearizably from the ring group's
    /// leader; `None` until a broker's bootstrap created them.
    pub async fn cursor_keys(&self) -> Result<Option<CursorKeyRing>, RouteError> {
        let query = encode_request(&Query::CursorKeys, RING_VNODE)?;
        self.route_group(RING_VNODE, FORWARD_QUERY_API_KEY, &query)
            .await
    }

    /// The cluster's storage policies, read linearizably from the ring
    /// group's leader (ADR 0115). Defined and removed with `propose_ring`.
    pub async fn policies(
        &self,
    ) -> Result<std::collections::BTreeMap<String, malachi_core::model::StoragePolicy>, RouteError>
    {
        let query = encode_request(&Query::Policies, RING_VNODE)?;
        self.route_group(RING_VNODE, FORWARD_QUERY_API_KEY, &query)
            .await
    }

    /// Applies a command in the ring's own group (`InitRing` and the split
    /// steps; `split_vnode` and `abort_split` are the usual way in).
    pub async fn propose_ring(&self, cmd: Command) -> Result<Verdict, RouteError> {
        let body = encode_request(&cmd, RING_VNODE)?;
        self.route_group(RING_VNODE, FORWARD_PROPOSE_API_KEY, &body)
            .await
    }

    /// This broker's replica of the ring's group, if it hosts one.
    pub fn ring_group(&self) -> Option<MetadataGroup> {
        self.groups.get(RING_GROUP_ID)
    }
}
