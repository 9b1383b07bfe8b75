//! `GroupSet`: the raft groups this broker hosts (its replicas), each
//! opened at most once, closed, reopened after a fatal stop or a full
//! volume, and which of them this broker leads. Which replicas belong here
//! and the steps that move them are the host's: `replicas.rs`.

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

/// The replicas this broker hosts: part of `VnodeHost`.
#[derive(Debug)]
pub struct GroupSet {
    node_id: u64,
    data_dir: PathBuf,
    /// The tunables every group is opened with (`group_id`, `node_id` and
    /// `dir` are replaced per group).
    group: GroupConfig,
    /// Whether groups open parked: liveness paces their campaigns.
    open_parked: bool,
    transport: Arc<TcpTransport>,
    registry: Arc<GroupRegistry>,
    /// Serializes opening replicas and adopting rings, so one group
    /// directory is never opened twice.
    opening: tokio::sync::Mutex<()>,
    /// Replicas closed because a full volume stopped them, not yet opened
    /// again (`reopen_stopped_by_full_volume`).
    closed_by_full_volume: Mutex<BTreeSet<u64>>,
    /// Bumped whenever a group is opened, so `watch_led` watches it too.
    groups_opened: watch::Sender<u64>,
    /// When each hosted group was opened (or last asked to open): a
    /// replica left behind by a lost close is swept only once it is older
    /// than a membership step.
    opened_at: Mutex<BTreeMap<u64, Instant>>,
}

impl GroupSet {
    pub(super) fn new(config: &VnodeHostConfig, transport: Arc<TcpTransport>) -> GroupSet {
        GroupSet {
            node_id: config.node_id,
            data_dir: config.data_dir.clone(),
            group: config.group.clone(),
            open_parked: config.liveness.is_some(),
            transport,
            registry: Arc::new(GroupRegistry::new()),
            opening: tokio::sync::Mutex::new(()),
            closed_by_full_volume: Mutex::new(BTreeSet::new()),
            groups_opened: watch::channel(0).0,
            opened_at: Mutex::new(BTreeMap::new()),
        }
    }

    /// The open lock: held by whoever opens or closes a replica or adopts
    /// a ring.
    pub(super) async fn opening(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.opening.lock().await
    }

    /// Opens this broker's replica of a group if it is not hosted yet, and
    /// initializes a fresh one with `voters` if given (else it learns its
    /// membership from the leader). Callers hold `opening`.
    pub(super) async fn open(
        &self,
        group_id: u64,
        voters: Option<Vec<u64>>,
    ) -> Result<(), GroupError> {
        if self.registry.get(group_id).is_some() {
            return Ok(());
        }
        let mut group_config = self.group.clone();
        group_config.group_id = group_id;
        group_config.node_id = self.node_id;
        group_config.dir = self.dir(group_id);
        let group = MetadataGroup::open(group_config, self.transport.clone()).await?;
        // Opened parked where groups are paced by liveness: the quiescer
        // lets it campaign once a quorum of its voters is up and its turn
        // has come (ADR 0105). Opened ticking, thousands of groups
        // campaigned against peers that were still starting.
        if self.open_parked {
            group.set_parked(true);
        }
        // Under the open lock nobody else opened it meanwhile: two
        // replicas of one directory would corrupt it.
        assert!(
            self.registry.get(group_id).is_none(),
            "group {group_id} opened twice"
        );
        self.registry.insert(group.clone());
        self.opened_at.lock().insert(group_id, Instant::now());
        self.groups_opened.send_modify(|n| *n += 1);
        match voters {
            Some(voters) => group.initialize(&voters).await,
            None => Ok(()),
        }
    }

    /// Notes that a peer asked for `group_id`'s replica again: a sweep
    /// judging it by an older answer must leave it open.
    pub(super) fn asked(&self, group_id: u64) {
        self.opened_at.lock().insert(group_id, Instant::now());
    }

    /// Closes this broker's replica of `group_id` and removes its
    /// directory, unless `opened` is given and the replica was opened (or
    /// asked to open) again since. Refused for a group it leads. Takes the
    /// open lock.
    pub(super) async fn close(
        &self,
        group_id: u64,
        vnode: VnodeId,
        opened: Option<Instant>,
    ) -> Result<(), GroupError> {
        let _opening = self.opening().await;
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
                node: self.node_id,
                vnode,
            }));
        }
        group.shutdown().await?;
        self.registry.remove(group_id);
        self.opened_at.lock().remove(&group_id);
        let dir = self.dir(group_id);
        tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dir))
            .await
            .map_err(|e| GroupError::refused(Refusal::Task(Arc::new(e))))?
            .map_err(|e| GroupError::refused(Refusal::DirNotRemoved(Arc::new(e))))?;
        tracing::info!(node = self.node_id, %vnode, "left the group: replica closed and removed");
        Ok(())
    }

    /// The hosted groups this broker neither leads nor is a voter of by
    /// its own view, opened at least `grace` ago, with when: the ones a
    /// lost close may have left behind.
    pub(super) fn left_behind(&self, grace: Duration) -> Vec<(u64, Instant)> {
        let me = self.node_id;
        self.registry
            .all()
            .into_iter()
            .filter(|g| !g.is_leader() && !g.membership().voters.contains(&me))
            .map(|g| g.group_id())
            .filter_map(|id| {
                let at = *self.opened_at.lock().get(&id)?;
                (at.elapsed() >= grace).then_some((id, at))
            })
            .collect()
    }

    pub(super) fn dir(&self, group_id: u64) -> PathBuf {
        if group_id == RING_GROUP_ID {
            self.data_dir.join("ring")
        } else {
            self.data_dir.join(format!("vnode-{group_id}"))
        }
    }

    /// The groups this broker hosts (for raft rpcs and status).
    pub fn registry(&self) -> &Arc<GroupRegistry> {
        &self.registry
    }

    /// This broker's replica of `group_id`, if it hosts one.
    pub fn get(&self, group_id: u64) -> Option<MetadataGroup> {
        self.registry.get(group_id)
    }

    /// How many groups are hosted here.
    pub fn len(&self) -> usize {
        self.registry.all().len()
    }

    /// Whether no group is hosted here.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The voters of `vnode`'s group as this broker's replica knows them;
    /// `None` without a replica, or one that knows none yet.
    pub fn known_voters(&self, vnode: VnodeId) -> Option<Vec<u64>> {
        let group = self.registry.get(group_of(vnode))?;
        let voters: Vec<u64> = group.membership().voters.into_iter().collect();
        (!voters.is_empty()).then_some(voters)
    }

    /// The leader of `vnode`'s group as this broker's replica knows it.
    pub fn known_leader(&self, vnode: VnodeId) -> Option<u64> {
        self.registry
            .get(group_of(vnode))
            .and_then(|g| g.leader_term().0)
    }

    /// How many hosted groups are quiet now (ADR 0101).
    pub fn quiet_count(&self) -> usize {
        self.registry.all().iter().filter(|g| g.is_quiet()).count()
    }

    /// A counter bumped whenever a group is opened.
    pub fn watch_opened(&self) -> watch::Receiver<u64> {
        self.groups_opened.subscribe()
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
        let groups = Arc::downgrade(self);
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
                let Some(groups) = groups.upgrade() else {
                    break;
                };
                groups.watch_new_groups(&mut watched, &changed);
                let led: BTreeSet<VnodeId> = groups.led().into_iter().collect();
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
    fn watch_new_groups(&self, watched: &mut BTreeSet<u64>, changed: &Arc<Notify>) {
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

    /// Reopens, from their files, the replicas that a write refused for
    /// want of space stopped, as a restart would: the caller knows the
    /// volume has room again. Returns how many were reopened; one that
    /// fails to open stays closed and is tried again at the next call.
    pub async fn reopen_stopped_by_full_volume(&self) -> usize {
        let stopped: Vec<MetadataGroup> = self
            .registry
            .all()
            .into_iter()
            .filter(MetadataGroup::stopped_by_full_volume)
            .collect();
        if stopped.is_empty() && self.closed_by_full_volume.lock().is_empty() {
            return 0;
        }
        let _opening = self.opening().await;
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
        let mut reopened = 0;
        for group_id in pending {
            match self.open(group_id, None).await {
                Ok(()) => {
                    self.closed_by_full_volume.lock().remove(&group_id);
                    reopened += 1;
                    tracing::info!(
                        node = self.node_id,
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

    /// Replaces the replica of `group_id`, stopped fatally, by reopening
    /// it from its files, as a restart would: what it committed is on
    /// disk, and its log store checks what it reads. `Ok(false)` if the
    /// group is no longer hosted here or is not fatal (any more); an error
    /// if it cannot be reopened, which its owner escalates (a dead group is
    /// never left behind a running tree).
    pub async fn reopen_fatal(&self, group_id: u64) -> Result<bool, GroupError> {
        let _opening = self.opening().await;
        let Some(group) = self.registry.get(group_id) else {
            return Ok(false);
        };
        if group.stopped_by_full_volume() {
            return Ok(false);
        }
        let Some(fatal) = group.fatal() else {
            return Ok(false);
        };
        tracing::warn!(node = self.node_id, group = group_id, error = %fatal, "a raft replica stopped fatally; reopening it from its files");
        if let Err(e) = group.shutdown().await {
            tracing::debug!(group = group_id, error = %e, "a fatally stopped replica did not stop cleanly");
        }
        self.registry.remove(group_id);
        self.open(group_id, None).await?;
        assert!(
            self.registry
                .get(group_id)
                .is_some_and(|g| g.serial() != group.serial()),
            "group {group_id} was not replaced by a new replica"
        );
        tracing::info!(
            node = self.node_id,
            group = group_id,
            "reopened a raft replica that had stopped fatally"
        );
        Ok(true)
    }

    /// Stops every hosted group and forgets it.
    pub(super) async fn shutdown(&self) {
        let groups = self.registry.all();
        // Every group refuses calls and peers' answers first, so their
        // grace periods overlap: the host's stop waits out one, not one
        // per group.
        for group in &groups {
            group.begin_shutdown();
        }
        for group in groups {
            let id = group.group_id();
            if let Err(e) = group.shutdown().await {
                tracing::warn!(group = id, error = %e, "vnode group did not shut down cleanly");
            }
            self.registry.remove(id);
        }
    }
}
