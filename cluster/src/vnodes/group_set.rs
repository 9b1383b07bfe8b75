//! The group set: the vnode groups this broker hosts, opening and closing
//! them as membership moves replicas, the ones a full volume stopped, and
//! which of them this broker leads.

use super::*;

/// The vnodes whose group directories exist under `data_dir`.
pub(super) fn vnode_dirs(data_dir: &Path) -> Vec<VnodeId> {
    let Ok(entries) = std::fs::read_dir(data_dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|name| name.strip_prefix("vnode-"))
                .and_then(|id| id.parse::<u32>().ok())
        })
        .filter(|id| *id < malachi_core::ring::VNODES_MAX)
        .map(VnodeId)
        .collect()
}

/// The raft group a vnode's metadata lives in (`RING_VNODE`: the ring's).
pub(super) fn group_of(vnode: VnodeId) -> u64 {
    if vnode == RING_VNODE {
        RING_GROUP_ID
    } else {
        vnode.group_id()
    }
}

impl VnodeHost {
    /// Where `vnode`'s replicas belong among the active members (the
    /// ring's group for `RING_VNODE`), by the ring this broker holds. The
    /// groups' memberships follow it (ADR 0104).
    pub fn target_voters(&self, vnode: VnodeId) -> Vec<u64> {
        let eligible = rebalance::eligible(
            &self.members(),
            &BTreeSet::new(),
            self.config.replicas_per_vnode,
        );
        let replicas = self.config.replicas_per_vnode;
        let ring = self.ring();
        // Constraints no eligible set meets leave the groups where they
        // are (the rebalancer moves nothing); this answer falls back to
        // rendezvous hashing.
        rebalance::placed_voters(vnode, &eligible, replicas, &ring)
            .unwrap_or_else(|_| rebalance::target_voters(vnode, &eligible, replicas))
            .into_iter()
            .collect()
    }

    /// Takes one step of moving a group this broker leads toward its
    /// target (`rebalance::next_step` chose it).
    pub(crate) async fn take_step(
        &self,
        vnode: VnodeId,
        group: MetadataGroup,
        step: rebalance::Step,
    ) {
        use rebalance::Step;
        let timeout_ms = self.config.membership_step_timeout_ms;
        let group_id = group.group_id();
        group.set_quiet(false);
        let result: Result<(), StepError> = match &step {
            Step::Settled => Ok(()),
            Step::AddLearner { node } => match self.ask_open(*node, vnode, None).await {
                Ok(()) => group
                    .add_learner(*node, timeout_ms)
                    .await
                    .map_err(StepError::from),
                Err(e) => Err(e),
            },
            Step::ChangeVoters { voters } => group
                .change_voters(voters, timeout_ms)
                .await
                .map_err(StepError::from),
            Step::HandOver { to } => group.transfer_leader(*to).await.map_err(StepError::from),
            Step::RemoveLearners { nodes } => {
                match group.remove_learners(nodes, timeout_ms).await {
                    Ok(()) => {
                        let body = CloseVnode {
                            vnode,
                            voters: group.membership().voters.into_iter().collect(),
                        };
                        for node in nodes {
                            if let Err(e) = self.tell_closed(*node, group_id, &body).await {
                                tracing::info!(group = group_id, node, error = %e, "a removed replica was not told to close; it closes when it next asks");
                            }
                        }
                        Ok(())
                    }
                    Err(e) => Err(StepError::from(e)),
                }
            }
        };
        match result {
            Ok(()) => tracing::info!(group = group_id, ?step, "vnode replicas moved a step"),
            Err(e) => {
                tracing::info!(group = group_id, ?step, error = %e, "vnode replica move did not complete; trying again")
            }
        }
    }

    /// Asks `node` to open its replica of `vnode`'s group.
    pub(super) async fn ask_open(
        &self,
        node: u64,
        vnode: VnodeId,
        voters: Option<Vec<u64>>,
    ) -> Result<(), StepError> {
        let group_id = group_of(vnode);
        if node == self.config.node_id {
            return Ok(self.open_requested(vnode, voters).await?);
        }
        let body = rmp_serde::to_vec(&OpenVnode { vnode, voters })?;
        self.ask_peer(node, OPEN_VNODE_API_KEY, group_id, &body)
            .await
    }

    pub(super) async fn tell_closed(
        &self,
        node: u64,
        group_id: u64,
        body: &CloseVnode,
    ) -> Result<(), StepError> {
        let body = rmp_serde::to_vec(body)?;
        self.ask_peer(node, CLOSE_VNODE_API_KEY, group_id, &body)
            .await
    }

    /// Sends a membership step (`api_key`, `body`) to `node` and takes its
    /// answer: done, or the peer's refusal.
    async fn ask_peer(
        &self,
        node: u64,
        api_key: u16,
        group_id: u64,
        body: &[u8],
    ) -> Result<(), StepError> {
        let bytes = self
            .transport
            .call_raw(
                node,
                api_key,
                group_id,
                body,
                self.config.forward_timeout_ms,
            )
            .await?;
        match rmp_serde::from_slice::<Forwarded<()>>(&bytes)? {
            Forwarded::Done(()) => Ok(()),
            answer => Err(StepError::Refused { node, answer }),
        }
    }

    /// Opens this broker's replica of `vnode`'s group as a peer asked:
    /// initialized with `voters` (a split's child; this broker must be
    /// one), or empty, to learn everything from the leader.
    pub(super) async fn open_requested(
        &self,
        vnode: VnodeId,
        voters: Option<Vec<u64>>,
    ) -> Result<(), GroupError> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(GroupError::Stopped);
        }
        if let Some(voters) = &voters
            && !voters.contains(&self.config.node_id)
        {
            return Err(GroupError::config(ConfigProblem::NotAVnodeVoter {
                node: self.config.node_id,
                vnode,
                voters: voters.clone(),
            }));
        }
        if voters.is_none() {
            self.mark_moved().await?;
        }
        let _adopting = self.adopting.lock().await;
        let group_id = group_of(vnode);
        // Asked again: a sweep judging this replica by an older answer
        // must leave it open.
        self.opened_at.lock().insert(group_id, Instant::now());
        self.open_group(group_id, voters).await
    }

    /// Closes this broker's replica of a group it left and removes its
    /// directory. Refused for a group it leads or is still a voter of (by
    /// the voters the leader sent).
    pub(super) async fn close_requested(&self, request: CloseVnode) -> Result<(), GroupError> {
        self.close_unless_reopened(request, None).await
    }

    /// `close_requested`, unless `opened` is given and the replica was
    /// opened (or asked to open) again since.
    pub(super) async fn close_unless_reopened(
        &self,
        request: CloseVnode,
        opened: impl Into<Option<Instant>>,
    ) -> Result<(), GroupError> {
        let opened = opened.into();
        let me = self.config.node_id;
        if request.voters.contains(&me) {
            return Err(GroupError::config(ConfigProblem::StillAVoter {
                node: me,
                vnode: request.vnode,
            }));
        }
        // From now on this broker never initializes a group from the
        // formation's voters again (see `open`).
        self.mark_moved().await?;
        let _adopting = self.adopting.lock().await;
        let group_id = group_of(request.vnode);
        let Some(group) = self.registry.get(group_id) else {
            return Ok(());
        };
        if let Some(opened) = opened
            && self.opened_at.lock().get(&group_id) != Some(&opened)
        {
            return Ok(());
        }
        if group.is_leader() {
            return Err(GroupError::config(ConfigProblem::Leads {
                node: me,
                vnode: request.vnode,
            }));
        }
        group.shutdown().await?;
        self.registry.remove(group_id);
        self.opened_at.lock().remove(&group_id);
        let dir = self.group_dir(group_id);
        tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dir))
            .await
            .map_err(|e| GroupError::refused(Refusal::Task(Arc::new(e))))?
            .map_err(|e| GroupError::refused(Refusal::DirNotRemoved(Arc::new(e))))?;
        tracing::info!(node = me, vnode = %request.vnode, "left the group: replica closed and removed");
        Ok(())
    }

    /// Records, durably, that a group moved on or off this broker: from
    /// then on its start opens only the groups it has, or learns of, and
    /// never initializes one from the formation's voters, which would
    /// re-create a group this broker left (ADR 0104).
    pub(super) async fn mark_moved(&self) -> Result<(), GroupError> {
        // One writer at a time: the record is written through one
        // temporary file.
        let mut marked = self.moved_marked.lock().await;
        let path = self.config.data_dir.join(MOVED_FILE);
        if *marked || path.exists() {
            *marked = true;
            return Ok(());
        }
        tokio::task::spawn_blocking(move || fsio::write_atomic(&path, b"groups moved\n"))
            .await
            .map_err(|e| GroupError::refused(Refusal::Task(Arc::new(e))))?
            .map_err(|e| GroupError::config(ConfigProblem::MovedNotRecorded(Arc::new(e))))?;
        *marked = true;
        Ok(())
    }

    pub(super) fn group_dir(&self, group_id: u64) -> PathBuf {
        if group_id == RING_GROUP_ID {
            self.config.data_dir.join("ring")
        } else {
            self.config.data_dir.join(format!("vnode-{group_id}"))
        }
    }

    /// Closes the replicas this broker hosts but whose group's leader
    /// lists it no more (a close that was lost, or sent while this broker
    /// was down). Only replicas older than a membership step are judged,
    /// and only by a committed, settled membership, so a learner still
    /// being added, or a change that may roll back, is never mistaken for
    /// a removal.
    pub(crate) async fn sweep_left_groups(&self) {
        let me = self.config.node_id;
        let grace = Duration::from_millis(self.config.membership_step_timeout_ms);
        // Only replicas that are no voter by their own view: a voter is
        // removed by first becoming a learner (the change reaches it, as
        // learners are replicated to), so a voter has nothing to ask.
        let candidates: Vec<(u64, Instant)> = self
            .registry
            .all()
            .into_iter()
            .filter(|g| !g.is_leader() && !g.membership().voters.contains(&me))
            .map(|g| g.group_id())
            .filter_map(|id| {
                let at = *self.opened_at.lock().get(&id)?;
                (at.elapsed() >= grace).then_some((id, at))
            })
            .collect();
        for (group_id, opened) in candidates {
            let Some(vnode) = rebalance::vnode_of(group_id) else {
                continue;
            };
            let Ok(m) = self.membership_of(vnode).await else {
                continue;
            };
            let listed = m.voters.contains(&me) || m.learners.contains(&me);
            if listed || m.joint || !m.committed || m.leader == me {
                continue;
            }
            tracing::info!(node = me, %vnode, voters = ?m.voters, "this replica's group lists it no more; closing it");
            let request = CloseVnode {
                vnode,
                voters: m.voters,
            };
            if let Err(e) = self.close_unless_reopened(request, opened).await {
                tracing::info!(node = me, %vnode, error = %e, "a replica the group left was not closed");
            }
        }
    }

    /// Every group's membership from its leader (the vnodes of the ring
    /// this broker holds, and the ring's group, as `RING_VNODE`).
    pub async fn memberships(&self) -> Vec<(VnodeId, Result<VnodeMembership, RouteError>)> {
        let mut groups: Vec<VnodeId> = vec![RING_VNODE];
        groups.extend(self.ring().vnodes().map(|v| v.id));
        let mut out = Vec::with_capacity(groups.len());
        for chunk in groups.chunks(16) {
            let reads = chunk
                .iter()
                .map(|vnode| async move { (*vnode, self.membership_of(*vnode).await) });
            out.extend(futures::future::join_all(reads).await);
        }
        out
    }

    /// One group's membership from its leader.
    pub async fn membership_of(&self, vnode: VnodeId) -> Result<VnodeMembership, RouteError> {
        let query = encode_request(&Query::Membership, vnode)?;
        self.route_group(vnode, FORWARD_QUERY_API_KEY, &query).await
    }

    /// The groups whose replica here a write refused for want of space
    /// stopped, open or closed awaiting a reopen.
    pub fn stopped_by_full_volume(&self) -> BTreeSet<u64> {
        let mut stopped: BTreeSet<u64> = self
            .registry
            .all()
            .into_iter()
            .filter(MetadataGroup::stopped_by_full_volume)
            .map(|g| g.group_id())
            .collect();
        stopped.extend(self.closed_by_full_volume.lock().iter().copied());
        stopped
    }

    /// Reopens, from their files, this broker's replicas that a write
    /// refused for want of space stopped (`stopped_by_full_volume`), as a
    /// restart would: the caller knows the volume has room again. Returns
    /// how many were reopened; one that fails to open stays closed and is
    /// tried again at the next call.
    pub async fn reopen_stopped_by_full_volume(&self) -> usize {
        let stopped: Vec<MetadataGroup> = self
            .registry
            .all()
            .into_iter()
            .filter(MetadataGroup::stopped_by_full_volume)
            .collect();
        let closed: Vec<u64> = self.closed_by_full_volume.lock().iter().copied().collect();
        if stopped.is_empty() && closed.is_empty() {
            return 0;
        }
        let _adopting = self.adopting.lock().await;
        let mut reopened = 0;
        for group in stopped {
            let group_id = group.group_id();
            if let Err(e) = group.shutdown().await {
                tracing::debug!(group = group_id, error = %e, "a replica stopped by a full volume did not stop cleanly");
            }
            if self
                .registry
                .get(group_id)
                .is_some_and(|g| g.stopped_by_full_volume())
            {
                self.registry.remove(group_id);
            }
            self.closed_by_full_volume.lock().insert(group_id);
        }
        let pending: Vec<u64> = self.closed_by_full_volume.lock().iter().copied().collect();
        for group_id in pending {
            match self.open_group(group_id, None).await {
                Ok(()) => {
                    self.closed_by_full_volume.lock().remove(&group_id);
                    reopened += 1;
                    tracing::info!(
                        node = self.config.node_id,
                        group = group_id,
                        "reopened a raft replica a full volume had stopped"
                    );
                }
                Err(e) => {
                    tracing::warn!(group = group_id, error = %e, "cannot reopen a raft replica a full volume had stopped; trying again later");
                }
            }
        }
        reopened
    }

    /// The hosted groups whose raft stopped on its own (`MetadataGroup::
    /// fatal`), other than for want of space: those wait for the volume to
    /// have room (`reopen_stopped_by_full_volume`).
    pub fn fatal_groups(&self) -> Vec<(u64, GroupError)> {
        self.registry
            .all()
            .into_iter()
            .filter(|g| !g.stopped_by_full_volume())
            .filter_map(|g| g.fatal().map(|e| (g.group_id(), e)))
            .collect()
    }

    /// Replaces this broker's replica of `group_id`, stopped fatally, by
    /// reopening it from its files, as a restart would: what it committed
    /// is on disk, and its log store checks what it reads. `Ok(false)` if
    /// the group is no longer hosted here or is not fatal (any more); an
    /// error if it cannot be reopened, which its owner escalates (a dead
    /// group is never left behind a running tree).
    pub async fn reopen_fatal(&self, group_id: u64) -> Result<bool, GroupError> {
        let _adopting = self.adopting.lock().await;
        let Some(group) = self.registry.get(group_id) else {
            return Ok(false);
        };
        if group.stopped_by_full_volume() {
            return Ok(false);
        }
        let Some(fatal) = group.fatal() else {
            return Ok(false);
        };
        tracing::warn!(node = self.config.node_id, group = group_id, error = %fatal, "a raft replica stopped fatally; reopening it from its files");
        if let Err(e) = group.shutdown().await {
            tracing::debug!(group = group_id, error = %e, "a fatally stopped replica did not stop cleanly");
        }
        self.registry.remove(group_id);
        self.open_group(group_id, None).await?;
        assert!(
            self.registry
                .get(group_id)
                .is_some_and(|g| g.serial() != group.serial()),
            "group {group_id} was not replaced by a new replica"
        );
        tracing::info!(
            node = self.config.node_id,
            group = group_id,
            "reopened a raft replica that had stopped fatally"
        );
        Ok(true)
    }

    /// Opens this broker's replica of a group if it is not hosted yet, and
    /// initializes a fresh one with `voters` if given (else it learns its
    /// membership from the leader). Callers hold `adopting`.
    pub(super) async fn open_group(
        &self,
        group_id: u64,
        voters: Option<Vec<u64>>,
    ) -> Result<(), GroupError> {
        if self.registry.get(group_id).is_some() {
            return Ok(());
        }
        let mut group_config = self.config.group.clone();
        group_config.group_id = group_id;
        group_config.node_id = self.config.node_id;
        group_config.dir = self.group_dir(group_id);
        let group = MetadataGroup::open(group_config, self.transport.clone()).await?;
        // Opened parked where groups are paced by liveness: the quiescer
        // lets it campaign once a quorum of its voters is up and its turn
        // has come (ADR 0105). Opened ticking, thousands of groups
        // campaigned against peers that were still starting.
        if self.config.liveness.is_some() {
            group.set_parked(true);
        }
        self.registry.insert(group.clone());
        self.opened_at.lock().insert(group_id, Instant::now());
        self.groups_opened.send_modify(|n| *n += 1);
        match voters {
            Some(voters) => group.initialize(&voters).await,
            None => Ok(()),
        }
    }

    /// Opens this broker's replica of `vnode` (a split's child, known from
    /// a newer ring) if it belongs here: empty, to learn its membership
    /// from its leader. `Ok(false)` if it does not belong here.
    pub(super) async fn open_vnode_locked(&self, vnode: VnodeId) -> Result<bool, GroupError> {
        if !self.target_voters(vnode).contains(&self.config.node_id) {
            return Ok(false);
        }
        self.open_group(vnode.group_id(), None).await?;
        Ok(true)
    }

    /// The voters of a vnode: its group's, as this broker's replica knows
    /// them, else where the members say they belong.
    pub fn voters(&self, vnode: VnodeId) -> Vec<u64> {
        if let Some(group) = self.registry.get(group_of(vnode)) {
            let voters: Vec<u64> = group.membership().voters.into_iter().collect();
            if !voters.is_empty() {
                return voters;
            }
        }
        self.target_voters(vnode)
    }

    /// The groups this broker hosts (for raft rpcs and status).
    pub fn registry(&self) -> &Arc<GroupRegistry> {
        &self.registry
    }

    /// This broker's replica of `vnode`, if it hosts one.
    pub fn group(&self, vnode: VnodeId) -> Option<MetadataGroup> {
        self.registry.get(vnode.group_id())
    }

    /// The vnodes this broker leads now.
    pub fn led(&self) -> Vec<VnodeId> {
        self.registry
            .all()
            .into_iter()
            .filter(|g| g.is_leader())
            .filter_map(|g| u32::try_from(g.group_id()).ok().map(VnodeId))
            .collect()
    }

    /// The vnodes this broker leads, kept current: recomputed on every
    /// leadership change of a hosted group and at least every `poll_ms`
    /// (the slow timer that catches anything an event missed). The
    /// watching task ends when every receiver is dropped.
    pub fn watch_led(self: &Arc<Self>, poll_ms: u64) -> watch::Receiver<BTreeSet<VnodeId>> {
        let (tx, rx) = watch::channel(self.led().into_iter().collect());
        let changed = Arc::new(Notify::new());
        let mut opened = self.groups_opened.subscribe();
        let mut watched = BTreeSet::new();
        self.watch_new_groups(&mut watched, &changed);
        let host = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = changed.notified() => {}
                    // A group opened after the watch began (a split's child,
                    // a vnode a newer ring added): watch it too.
                    Ok(()) = opened.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(poll_ms)) => {}
                    _ = tx.closed() => break,
                }
                let Some(host) = host.upgrade() else { break };
                host.watch_new_groups(&mut watched, &changed);
                let led: BTreeSet<VnodeId> = host.led().into_iter().collect();
                tx.send_if_modified(|current| {
                    let differs = *current != led;
                    *current = led;
                    differs
                });
            }
        });
        rx
    }

    /// Forwards the leadership changes of hosted groups not in `watched`
    /// to `changed`, and adds them to `watched`. Keyed by each opening
    /// (`MetadataGroup::serial`), so a reopened replica is watched again.
    pub(super) fn watch_new_groups(&self, watched: &mut BTreeSet<u64>, changed: &Arc<Notify>) {
        let groups = self.registry.all();
        watched.retain(|serial| groups.iter().any(|g| g.serial() == *serial));
        for group in groups {
            if !watched.insert(group.serial()) {
                continue;
            }
            let mut leader = group.watch_leader();
            let changed = Arc::clone(changed);
            tokio::spawn(async move {
                while leader.changed().await.is_ok() {
                    changed.notify_one();
                }
            });
        }
    }
}
