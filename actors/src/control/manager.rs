//! `coordinator_manager/manager`: runs a coordinator per vnode this broker
//! leads, and is the front door of every coordinator request on this broker.
//!
//! Leadership is read from raft (`VnodeHost::watch_led`, which changes on
//! every leadership event of a hosted group and on a slow timer) and the
//! ring the host holds; `plan_coordinators` decides what to start and stop,
//! and the manager carries it out as dynamic children of its own supervisor
//! (`coordinator/<vnode>`), without restarting anything else. After each
//! change it publishes the vnodes it leads through membership
//! (`set_local_routing`).
//!
//! Requests (create, delete, roll, split, merge) arrive here, from client
//! connections and segment actors alike. Each goes to the coordinator of the
//! topic's vnode when this broker leads it. Otherwise the manager serves it
//! on a task of its own with the same logic (`CoordinatorState`): its
//! proposals are routed to the vnode's leader by the plane, and the local
//! side effects (starting the segment actors placed here) happen here.
//!
//! The manager also reconciles segment actors with the metadata of every
//! replica this broker holds, on every applied change: a broker that
//! another broker's coordinator placed a segment on starts its actor.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use malachi_cluster::vnodes::plan_coordinators;
use malachi_core::ring::{Ring, VnodeId};
use malachi_membership::VnodeLeader;
use malachi_supervision::{ChildSpec, Restart};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{debug, info, warn};

use crate::common::watched::{Watched, spawn_watched};
use crate::control::coordinator::{CoordinatorActor, CoordinatorMsg, CoordinatorState, reconcile};
use crate::control::shared::Shared;

pub(crate) struct ManagerActor;

pub(crate) struct ManagerState {
    shared: Arc<Shared>,
    /// The coordinators this manager started and has not stopped.
    running: BTreeSet<VnodeId>,
    /// Feeds `Replan` and `Reconcile` from leadership, applied changes and
    /// the slow timer.
    /// Aborted when the state is dropped, after a stop or a failure alike.
    watcher: Option<Watched>,
    /// Which of `Replan` and `Reconcile` are queued, so a burst of events
    /// queues one of each, not one per event: the mailbox stays bounded.
    queued: Arc<Queued>,
    /// What was last gossiped, so an unchanged routing is not re-sent.
    published: Option<(u64, Vec<VnodeLeader>)>,
}

/// Flags set while a message is in the manager's mailbox.
#[derive(Debug, Default)]
pub(crate) struct Queued {
    replan: AtomicBool,
    reconcile: AtomicBool,
}

/// The coordinator's name in the `coordinator_manager` supervisor.
pub(crate) fn coordinator_name(vnode: VnodeId) -> String {
    format!("coordinator/{}", vnode.0)
}

/// The topic a coordinator request is about.
fn topic_of(msg: &CoordinatorMsg) -> Option<&str> {
    match msg {
        CoordinatorMsg::CreateTopic { name, .. } | CoordinatorMsg::DeleteTopic { name, .. } => {
            Some(name)
        }
        CoordinatorMsg::Roll { topic, .. }
        | CoordinatorMsg::Split { topic, .. }
        | CoordinatorMsg::Merge { topic, .. }
        | CoordinatorMsg::Move { topic, .. } => Some(topic),
        CoordinatorMsg::Reconcile
        | CoordinatorMsg::Replan
        | CoordinatorMsg::Upkeep
        | CoordinatorMsg::TaskEnded(_) => None,
    }
}

impl ManagerState {
    /// The ring and the vnodes led here now. A plane without vnodes (the
    /// file plane) is one vnode, always led.
    fn leadership(&self) -> Option<(Arc<Ring>, BTreeSet<VnodeId>)> {
        let plane = self.shared.plane().ok()?;
        match plane.host() {
            Some(host) => Some((host.ring(), host.led().into_iter().collect())),
            None => {
                let ring = Ring::new(1).ok()?;
                Some((Arc::new(ring), [VnodeId(0)].into()))
            }
        }
    }

    /// Brings the running coordinators to the vnodes led here, and publishes
    /// them through membership.
    async fn replan(&mut self) {
        let Some(sup) = self.shared.actors.coordinator_sup.read().clone() else {
            return;
        };
        let (ring, led) = match self.leadership() {
            Some((ring, led)) => (Some(ring), led),
            None => (None, BTreeSet::new()),
        };
        let plan = plan_coordinators(ring.as_deref(), &led, &self.running);
        for vnode in plan.stop {
            info!(%vnode, "leadership lost: stopping the coordinator");
            match sup.terminate_child(&coordinator_name(vnode)).await {
                Ok(_) | Err(malachi_supervision::SupervisionError::NotRunning) => {}
                Err(e) => warn!(%vnode, error = %e, "cannot stop a coordinator"),
            }
            self.shared.actors.coordinators().forget(vnode);
            self.running.remove(&vnode);
        }
        for vnode in plan.start {
            let shared = Arc::clone(&self.shared);
            let spec = ChildSpec::worker(
                coordinator_name(vnode),
                || CoordinatorActor,
                move || (Arc::clone(&shared), vnode),
            )
            // Transient: a coordinator stopped because leadership moved stays
            // stopped; one that crashed is restarted.
            .restart(Restart::Transient);
            match sup.start_child(spec).await {
                Ok(_) | Err(malachi_supervision::SupervisionError::DuplicateChild { .. }) => {
                    self.running.insert(vnode);
                }
                // The coordinator supervisor stops before this manager at
                // shutdown: nothing is lost, the broker is going away.
                Err(malachi_supervision::SupervisionError::NotRunning) => {
                    debug!(%vnode, "coordinator supervisor stopped: not starting");
                    return;
                }
                Err(e) => warn!(%vnode, error = %e, "cannot start a coordinator"),
            }
        }
        self.publish_routing(ring.as_deref());
    }

    /// Gossips the vnodes this broker leads, with their terms.
    fn publish_routing(&mut self, ring: Option<&Ring>) {
        let (Some(ring), Ok(plane)) = (ring, self.shared.plane()) else {
            return;
        };
        let Some(host) = plane.host() else {
            return;
        };
        let Some(fabric) = self.shared.fabric() else {
            return;
        };
        let leaders: Vec<VnodeLeader> = self
            .running
            .iter()
            .filter_map(|v| {
                host.group(*v).map(|g| VnodeLeader {
                    vnode: v.0,
                    term: g.leader_term().1,
                })
            })
            .collect();
        // Decommissioned: its unreplicated active segments roll away.
        let me = self.shared.config.node_id;
        self.shared.data.leaving.store(
            ring.members().get(&me) == Some(&malachi_core::ring::MemberState::Decommissioned),
            std::sync::atomic::Ordering::Relaxed,
        );
        // Every member the ring lists, so a fresh data dir under one of
        // their ids is refused at join (issue 18).
        fabric
            .formed
            .advertise_members(ring.members().keys().copied().collect());
        let routing = (ring.version(), leaders);
        if self.published.as_ref() == Some(&routing) {
            return;
        }
        if let Err(e) = fabric
            .membership
            .set_local_routing(routing.0, routing.1.clone())
        {
            warn!(error = %e, "cannot publish the vnodes led here");
            return;
        }
        self.published = Some(routing);
    }

    /// Hands a request to its vnode's coordinator, or serves it here.
    async fn dispatch(&mut self, msg: CoordinatorMsg) {
        let Some(topic) = topic_of(&msg) else {
            return;
        };
        let Ok(plane) = self.shared.plane() else {
            // Dropping the request drops its reply port: the caller gets a
            // closed-reply error rather than waiting for its timeout.
            return;
        };
        let vnode = plane.vnode_of(topic);
        let leads = match plane.host() {
            Some(host) => host.group(vnode).is_some_and(|g| g.is_leader()),
            None => true,
        };
        if leads && !self.running.contains(&vnode) {
            // Leadership arrived before its event did: start the coordinator
            // now rather than serve this request around it.
            self.replan().await;
        }
        let coordinator = self.shared.actors.coordinators().get(vnode);
        let msg = match coordinator {
            Some(coordinator) => match coordinator.send_message(msg) {
                Ok(()) => return,
                Err(ractor::MessagingErr::SendErr(msg)) => msg,
                Err(_) => return,
            },
            None => msg,
        };
        // Not led here (or its coordinator just stopped): the same logic on a
        // task, so the manager's mailbox is never held by a remote round trip.
        let state = CoordinatorState::new(Arc::clone(&self.shared), vnode);
        tokio::spawn(async move { state.serve(msg).await });
    }
}

/// Turns leadership changes, applied metadata and the slow timer into
/// `Replan` and `Reconcile` messages.
fn watch(
    shared: &Arc<Shared>,
    myself: ActorRef<CoordinatorMsg>,
    queued: Arc<Queued>,
) -> Option<Watched> {
    let plane = shared.plane().ok()?;
    let poll = Duration::from_millis(shared.config.cluster.coordinator_poll_ms);
    let mut led = plane.host().map(|h| h.watch_led(poll.as_millis() as u64));
    let mut applied = plane.subscribe();
    let actor = myself.clone();
    #[cfg(feature = "testing")]
    let broker = shared.client_addr;
    let work = async move {
        loop {
            #[cfg(feature = "testing")]
            crate::common::faults::trip(broker, "leadership_watcher");
            let mut changed = false;
            tokio::select! {
                Ok(()) = async {
                    match led.as_mut() {
                        Some(led) => led.changed().await,
                        None => std::future::pending().await,
                    }
                } => {}
                Ok(()) = applied.changed() => changed = true,
                _ = tokio::time::sleep(poll) => changed = true,
            }
            if !queued.replan.swap(true, Ordering::SeqCst)
                && myself.send_message(CoordinatorMsg::Replan).is_err()
            {
                break;
            }
            if changed && !queued.reconcile.swap(true, Ordering::SeqCst) {
                // Fails only if the manager is stopping; the Replan send
                // above already ends the loop then.
                let _ = myself.send_message(CoordinatorMsg::Reconcile);
            }
        }
    };
    Some(spawn_watched(
        actor,
        "leadership_watcher",
        work,
        CoordinatorMsg::TaskEnded,
    ))
}

#[ractor::async_trait]
impl Actor for ManagerActor {
    type Msg = CoordinatorMsg;
    type State = ManagerState;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        myself: ActorRef<CoordinatorMsg>,
        shared: Arc<Shared>,
    ) -> Result<ManagerState, ActorProcessingErr> {
        // The vnodes actor started before this one (rest_for_one order).
        shared.plane()?;
        shared.actors.manager().register(myself);
        Ok(ManagerState {
            shared,
            running: BTreeSet::new(),
            watcher: None,
            queued: Arc::new(Queued::default()),
            published: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<CoordinatorMsg>,
        state: &mut ManagerState,
    ) -> Result<(), ActorProcessingErr> {
        state.watcher = watch(&state.shared, myself.clone(), Arc::clone(&state.queued));
        // Through the mailbox, so the supervisors above finish starting first.
        state.queued.replan.store(true, Ordering::SeqCst);
        myself.send_message(CoordinatorMsg::Replan)?;
        state.queued.reconcile.store(true, Ordering::SeqCst);
        myself.send_message(CoordinatorMsg::Reconcile)?;
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<CoordinatorMsg>,
        msg: CoordinatorMsg,
        state: &mut ManagerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CoordinatorMsg::Replan => {
                state.queued.replan.store(false, Ordering::SeqCst);
                state.replan().await;
            }
            CoordinatorMsg::Reconcile => {
                state.queued.reconcile.store(false, Ordering::SeqCst);
                // A failed reconcile is a failure of this actor: the
                // supervisor restarts it, which reconciles again.
                reconcile(&state.shared).await?;
            }
            CoordinatorMsg::TaskEnded(ended) => return Err(ended.into()),
            request => state.dispatch(request).await,
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<CoordinatorMsg>,
        state: &mut ManagerState,
    ) -> Result<(), ActorProcessingErr> {
        // Dropping the watcher aborts it.
        state.watcher = None;
        state.shared.actors.manager().unregister(&myself);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use malachi_supervision::SupervisorSnapshot;
    use malachi_wire::Client;

    use crate::{Broker, BrokerConfig, BrokerHandle, ClusterSettings, MetadataBackend};

    const CONVERGE: Duration = Duration::from_secs(30);

    fn segment_actors(tree: &SupervisorSnapshot, topic: &str) -> usize {
        tree.child("storage")
            .and_then(|s| s.supervisor.as_ref())
            .map_or(0, |s| {
                s.children
                    .iter()
                    .filter(|c| c.name.starts_with(&format!("segment/{topic}/")))
                    .count()
            })
    }

    async fn wait_until<F: std::future::Future<Output = bool>>(
        what: &str,
        mut check: impl FnMut() -> F,
    ) {
        let deadline = Instant::now() + CONVERGE;
        while !check().await {
            assert!(Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_file_plane_broker_runs_one_coordinator_and_serves_topics() {
        let dir = tempfile::tempdir().unwrap();
        let config = BrokerConfig {
            metadata_backend: MetadataBackend::File,
            ..BrokerConfig::for_tests(dir.path())
        };
        let broker = Broker::start(config).await.unwrap();
        assert!(broker.wait_ready(10_000).await);
        let client = Client::connect([broker.client_addr().to_string()])
            .await
            .unwrap();
        client.create_topic("orders", None, None).await.unwrap();
        assert_eq!(
            client.describe_topic("orders").await.unwrap().name,
            "orders"
        );
        assert_eq!(client.list_topics().await.unwrap().topics.len(), 1);
        let tree = broker.tree_snapshot().await.unwrap();
        assert!(
            tree.descendant(&["metadata", "coordinator_manager", "coordinator/0"])
                .is_some()
        );
        assert_eq!(segment_actors(&tree, "orders"), 1);
        broker.shutdown().await.unwrap();
    }

    /// Three brokers in one process sharing the vnodes.
    async fn three(root: &std::path::Path) -> Vec<BrokerHandle> {
        three_with(root, |_| {}).await
    }

    async fn three_with(
        root: &std::path::Path,
        tune: impl Fn(&mut BrokerConfig),
    ) -> Vec<BrokerHandle> {
        let mut brokers: Vec<BrokerHandle> = Vec::new();
        for node_id in 1..=3u64 {
            let mut config = BrokerConfig {
                node_id,
                cluster: ClusterSettings {
                    nodes: vec![1, 2, 3],
                    vnodes: Some(4),
                    coordinator_poll_ms: 100,
                    ..ClusterSettings::default()
                },
                ..BrokerConfig::for_tests(root.join(format!("node-{node_id}")))
            };
            if let Some(first) = brokers.first() {
                config.seeds = vec![first.client_addr().to_string()];
            }
            tune(&mut config);
            let broker = Broker::start(config).await.unwrap();
            assert!(broker.wait_ready(10_000).await);
            brokers.push(broker);
        }
        brokers
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_topic_deleted_through_another_broker_stops_its_hosts_segment_actor() {
        let dir = tempfile::tempdir().unwrap();
        let brokers = three(dir.path()).await;
        let via = |i: usize| {
            let addr = brokers[i].client_addr().to_string();
            async move { Client::connect([addr]).await.unwrap() }
        };
        let second = via(1).await;
        wait_until("orders is created through broker 2", || {
            let second = &second;
            async move {
                second.create_topic("orders", None, None).await.is_ok()
                    || second.describe_topic("orders").await.is_ok()
            }
        })
        .await;
        // The segment's primary is placed by load (ADR 0144), whichever
        // broker was asked; the others follow.
        let described = second.describe_topic("orders").await.unwrap();
        let replicas = &described.ranges[0].segments[0].replicas;
        // Three copies once membership saw all three brokers (fewer if the
        // others were still joining when the topic was created).
        assert!(!replicas.is_empty(), "{replicas:?}");
        let primary = usize::try_from(replicas[0]).unwrap() - 1;
        let host = &brokers[primary];
        wait_until("the host runs the segment actor", || async {
            segment_actors(&host.tree_snapshot().await.unwrap(), "orders") == 1
        })
        .await;

        // Deleted through a broker that does not host it.
        let third = via((primary + 1) % 3).await;
        third.delete_topic("orders").await.unwrap();
        wait_until(
            "the host stops the deleted topic's segment actor",
            || async { segment_actors(&host.tree_snapshot().await.unwrap(), "orders") == 0 },
        )
        .await;
        for i in 0..3 {
            let client = via(i).await;
            assert!(client.list_topics().await.unwrap().topics.is_empty());
        }
        for broker in brokers.into_iter().rev() {
            broker.shutdown().await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_split_through_one_broker_is_gossiped_by_every_broker() {
        let dir = tempfile::tempdir().unwrap();
        let brokers = three(dir.path()).await;
        let client = Client::connect([brokers[1].client_addr().to_string()])
            .await
            .unwrap();
        wait_until("every vnode has a leader", || {
            let client = &client;
            async move {
                client.vnode_list().await.is_ok_and(|l| {
                    l.vnodes.len() == 4 && l.vnodes.iter().all(|v| v.leader.is_some())
                })
            }
        })
        .await;
        let split = client.vnode_split(0).await.unwrap();
        assert_eq!(split.parent.id, 0);
        let version = split.ring_version;
        // Each broker's manager publishes the ring it routes by with the
        // vnodes it leads; every broker's view ends up with the new version
        // from every broker, itself included.
        wait_until("every broker gossips the split's ring", || {
            let brokers = &brokers;
            async move {
                brokers.iter().all(|b| {
                    let view = b.membership().view();
                    view.peers.len() == 2 && view.all().all(|m| m.ring_version == version)
                })
            }
        })
        .await;
        for broker in &brokers {
            let client = Client::connect([broker.client_addr().to_string()])
                .await
                .unwrap();
            let ring = client.vnode_list().await.unwrap();
            assert_eq!((ring.ring_version, ring.vnodes.len()), (version, 5));
        }
        // Splitting a vnode the ring lacks is refused with its own code.
        let refused = client.vnode_split(99).await.unwrap_err();
        assert_eq!(refused.code(), Some(malachi_wire::ErrorCode::VnodeNotFound));
        for broker in brokers.into_iter().rev() {
            broker.shutdown().await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn segments_roll_on_a_broker_that_does_not_lead_the_topics_vnode() {
        use malachi_wire::batch::{BatchBuilder, Record};
        use malachi_wire::messages::FetchRequest;

        let dir = tempfile::tempdir().unwrap();
        let brokers = three_with(dir.path(), |c| c.segment_bytes_max = 2_048).await;
        // A topic's primary is placed by load (ADR 0144). Find a topic
        // whose primary does not lead its vnode, so every roll goes through
        // that leader. Any broker may lead all four vnodes (elections
        // decide), so create topics through each broker in turn.
        let mut chosen = None;
        'hosts: for (index, broker) in brokers.iter().enumerate() {
            let host = Client::connect([broker.client_addr().to_string()])
                .await
                .unwrap();
            for i in 0..64 {
                let topic = format!("rolls-{}-{i}", index + 1);
                wait_until("a topic is created through the host", || {
                    let (host, topic) = (&host, &topic);
                    async move {
                        host.create_topic(topic, None, None).await.is_ok()
                            || host.describe_topic(topic).await.is_ok()
                    }
                })
                .await;
                let range = host.describe_topic(&topic).await.unwrap().ranges[0].clone();
                let vnode = (range.id >> 40) as u32;
                let Some(&primary) = range.segments[0].replicas.first() else {
                    continue;
                };
                let status = host.cluster_status().await.unwrap();
                let led_there = status
                    .brokers
                    .iter()
                    .any(|b| b.node_id == primary && b.vnodes_led.contains(&vnode));
                if !led_there {
                    chosen = Some((host, primary, topic));
                    break 'hosts;
                }
            }
        }
        let (host, node_id, topic) = chosen.expect("some primary does not lead its vnode");
        let mut sent = Vec::new();
        for batch in 0..20 {
            let mut builder = BatchBuilder::new(1 << 20);
            for i in 0..4 {
                let value = format!("{batch:02}-{i}-{}", "x".repeat(100));
                builder.push(&Record::new("k", value.clone())).unwrap();
                sent.push(value);
            }
            host.produce(&topic, builder.finish()).await.unwrap();
        }
        let described = host.describe_topic(&topic).await.unwrap();
        let segments = &described.ranges[0].segments;
        assert!(segments.len() > 2, "no rolls: {described:?}");
        // The first roll ran on the chosen primary; later ones stay there
        // unless the balancer moves the range (ADR 0144), so only the
        // first is pinned. Regression: the test assumed the creating
        // broker kept every primary.
        assert_eq!(
            segments[0].replicas.first(),
            Some(&node_id),
            "{described:?}"
        );
        assert!(
            segments.iter().all(|s| s.replicas.len() >= 2),
            "{described:?}"
        );

        let mut received = Vec::new();
        let mut cursor = None;
        let deadline = Instant::now() + CONVERGE;
        while received.len() < sent.len() {
            assert!(Instant::now() < deadline, "read {} records", received.len());
            let answer = host
                .fetch(&FetchRequest {
                    topic: topic.clone(),
                    from_start: cursor.is_none(),
                    cursor: cursor.clone(),
                    records_max: 1_000,
                    bytes_max: 1 << 20,
                    wait_ms: 100,
                })
                .await
                .unwrap();
            for record in answer.records.records() {
                received.push(String::from_utf8(record.value.to_vec()).unwrap());
            }
            cursor = Some(answer.next_cursor);
        }
        assert_eq!(received, sent);
        for broker in brokers.into_iter().rev() {
            broker.shutdown().await.unwrap();
        }
    }
}
