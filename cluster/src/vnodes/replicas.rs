//! The host's side of its replicas: which belong on this broker (by the
//! `RingStore`'s ring and the members), the steps that move them (opening
//! and closing replicas on peers over the `Router`, and here in the
//! `GroupSet`), and the public reads of the group set.

use super::*;

impl VnodeHost {
    /// Opens (or recovers) this broker's replicas at start (`open`), under
    /// the group set's opening lock: the ring's group first, then the
    /// vnodes'. The first failure ends it; `open` then shuts down.
    pub(super) async fn open_replicas(&self) -> Result<(), GroupError> {
        let _opening = self.groups.opening().await;
        let ring = self.ring();
        // Only the ring every broker started from, with the members the
        // cluster was formed with, says who the voters of a fresh group
        // are. Past it, groups move by membership changes (ADR 0104): a
        // replica this broker lacks is opened empty and learns its
        // membership from its leader, never guessed.
        let pristine = ring.version() == 1
            && ring.formed_members()
            && !self.config.joined
            && !self.rings.moved();
        self.open_ring_replica(pristine).await?;
        self.open_vnode_replicas(&ring, pristine).await
    }

    /// Opens the ring's group here if this broker is one of its voters or
    /// already holds its directory; fresh (with its voters) only on a
    /// pristine ring.
    async fn open_ring_replica(&self, pristine: bool) -> Result<(), GroupError> {
        let me = self.config.node_id;
        let ring_dir = self.config.data_dir.join("ring").exists();
        let ring_target = self.target_voters(RING_VNODE);
        if pristine && ring_target.contains(&me) {
            self.groups.open(RING_GROUP_ID, Some(ring_target)).await?;
        } else if ring_dir || ring_target.contains(&me) {
            self.groups.open(RING_GROUP_ID, None).await?;
        }
        Ok(())
    }

    /// Opens the ring's vnodes whose voters include this broker, and any
    /// vnode whose group exists here (a split's child the ring this broker
    /// knows does not name yet, a replica a membership change gave it);
    /// fresh (with their voters) only on a pristine ring. Opened side by
    /// side, a bounded number at a time: opening a group is mostly waiting
    /// for its files' fsyncs, which the disk absorbs together, and one at a
    /// time 4,096 vnodes took minutes to start (ADR 0105).
    async fn open_vnode_replicas(&self, ring: &Ring, pristine: bool) -> Result<(), GroupError> {
        use futures::{StreamExt, TryStreamExt};
        let me = self.config.node_id;
        let dirs: BTreeSet<VnodeId> = vnode_dirs(&self.config.data_dir).into_iter().collect();
        let mut vnodes: BTreeSet<VnodeId> = ring.vnodes().map(|v| v.id).collect();
        vnodes.extend(dirs.iter().copied());
        let opens = vnodes.into_iter().filter_map(|vnode| {
            let target = self.target_voters(vnode);
            if pristine && target.contains(&me) {
                Some((vnode.group_id(), Some(target)))
            } else if dirs.contains(&vnode) || target.contains(&me) {
                Some((vnode.group_id(), None))
            } else {
                None
            }
        });
        futures::stream::iter(opens)
            .map(|(group_id, voters)| self.groups.open(group_id, voters))
            .buffer_unordered(GROUPS_OPENING_MAX)
            .try_collect::<()>()
            .await
    }

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
        self.router
            .ask_peer(node, OPEN_VNODE_API_KEY, group_id, &body)
            .await
    }

    pub(super) async fn tell_closed(
        &self,
        node: u64,
        group_id: u64,
        body: &CloseVnode,
    ) -> Result<(), StepError> {
        let body = rmp_serde::to_vec(body)?;
        self.router
            .ask_peer(node, CLOSE_VNODE_API_KEY, group_id, &body)
            .await
    }

    /// Opens this broker's replica of `vnode`'s group as a peer asked:
    /// initialized with `voters` (a split's child; this broker must be
    /// one), or empty, to learn everything from the leader.
    pub(super) async fn open_requested(
        &self,
        vnode: VnodeId,
        voters: Option<Vec<u64>>,
    ) -> Result<(), GroupError> {
        if self.is_stopped() {
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
            self.rings.mark_moved().await?;
        }
        let _opening = self.groups.opening().await;
        let group_id = group_of(vnode);
        // Asked again: a sweep judging this replica by an older answer
        // must leave it open.
        self.groups.asked(group_id);
        self.groups.open(group_id, voters).await
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
        self.rings.mark_moved().await?;
        self.groups
            .close(group_of(request.vnode), request.vnode, opened)
            .await
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
        let candidates = self.groups.left_behind(grace);
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
        self.groups.stopped_by_full_volume()
    }

    /// Reopens the replicas a full volume stopped (`GroupSet::
    /// reopen_stopped_by_full_volume`): the caller knows the volume has
    /// room again.
    pub async fn reopen_stopped_by_full_volume(&self) -> usize {
        self.groups.reopen_stopped_by_full_volume().await
    }

    /// The hosted groups whose raft stopped on its own, other than for
    /// want of space (`GroupSet::fatal_groups`).
    pub fn fatal_groups(&self) -> Vec<(u64, GroupError)> {
        self.groups.fatal_groups()
    }

    /// Reopens a replica stopped fatally from its files (`GroupSet::
    /// reopen_fatal`).
    pub async fn reopen_fatal(&self, group_id: u64) -> Result<bool, GroupError> {
        self.groups.reopen_fatal(group_id).await
    }

    /// Opens this broker's replica of `vnode` (a split's child, known from
    /// a newer ring) if it belongs here: empty, to learn its membership
    /// from its leader. `Ok(false)` if it does not belong here. Callers
    /// hold the open lock.
    pub(super) async fn open_vnode_locked(&self, vnode: VnodeId) -> Result<bool, GroupError> {
        if !self.target_voters(vnode).contains(&self.config.node_id) {
            return Ok(false);
        }
        self.groups.open(vnode.group_id(), None).await?;
        Ok(true)
    }

    /// The voters of a vnode: its group's, as this broker's replica knows
    /// them, else where the members say they belong.
    pub fn voters(&self, vnode: VnodeId) -> Vec<u64> {
        self.groups
            .known_voters(vnode)
            .unwrap_or_else(|| self.target_voters(vnode))
    }

    /// The groups this broker hosts (for raft rpcs and status).
    pub fn registry(&self) -> &Arc<GroupRegistry> {
        self.groups.registry()
    }

    /// This broker's replica of `vnode`, if it hosts one.
    pub fn group(&self, vnode: VnodeId) -> Option<MetadataGroup> {
        self.groups.get(vnode.group_id())
    }

    /// The vnodes this broker leads now.
    pub fn led(&self) -> Vec<VnodeId> {
        self.groups.led()
    }

    /// The vnodes this broker leads, kept current (`GroupSet::watch_led`).
    pub fn watch_led(&self, poll_ms: u64) -> watch::Receiver<BTreeSet<VnodeId>> {
        self.groups.watch_led(poll_ms)
    }
}
