//! The primary's side: one shipper per follower copy, pipelining
//! replica-appends of the copy's frames and feeding their answers to the
//! segment's commit tracker.

use super::*;
use crate::common::metrics::ShippedFrom;

/// One replica-append's answer, with what the shipper knew when it sent it.
pub(super) struct Shipped {
    /// The committed end it told the follower.
    commit: u64,
    /// The primary's durable end when it was sent (for the lag).
    durable: u64,
    sent_at: Instant,
    answer: Result<ReplicaAppendResponse, LinkError>,
}

/// A shipper's requests in flight, oldest first; dropping them (the
/// shipper ended or was replaced) aborts them, releasing their credit.
#[derive(Default)]
pub(super) struct InFlight(VecDeque<JoinHandle<Shipped>>);

impl InFlight {
    fn abort_all(&mut self) {
        for shipped in self.0.drain(..) {
            shipped.abort();
        }
    }
}

impl std::ops::Deref for InFlight {
    type Target = VecDeque<JoinHandle<Shipped>>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for InFlight {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.abort_all();
    }
}

/// Ships one segment's durable frames to one follower, up to
/// `replica_pipeline_depth_max` requests in flight.
pub(super) struct Shipper {
    pub(super) storage: Arc<Storage>,
    pub(super) link: Arc<dyn ReplicaLink>,
    pub(super) replicated: Arc<Replicated>,
    /// The follower's index in the replica set (1..N).
    pub(super) copy: usize,
}

/// Where a shipper's loop stands.
pub(super) struct ShipLoop {
    node: NodeId,
    id: malachi_storage::SegmentId,
    window: Arc<Semaphore>,
    local: watch::Receiver<u64>,
    committed: watch::Receiver<u64>,
    /// Where the follower ends, as far as its answers tell; the first
    /// request (empty, at 0) learns it.
    next: u64,
    probed: bool,
    /// Where the next request starts: past every one in flight.
    next_send: u64,
    /// The requests sent and not yet answered, oldest first; their
    /// answers are taken in this order (ADR 0099).
    inflight: InFlight,
    /// The committed end the follower was last told.
    told_committed: Option<u64>,
    retry_ms: u64,
    /// When the segment actor stopped (its segment sealed), if it did.
    closed_at: Option<Instant>,
    /// Replication-level group commit held the next append already.
    held: bool,
}

impl ShipLoop {
    /// Drops every request in flight (their answers no longer matter: the
    /// follower refuses what overlaps) and resends from where the follower
    /// last said it ends.
    fn reset(&mut self) {
        self.inflight.abort_all();
        self.next_send = self.next;
    }
}

/// What one turn of a shipper's loop looked at.
#[derive(Debug, Clone, Copy)]
pub(super) struct Turn {
    /// A closed segment's length to catch the follower up to.
    catch_up: Option<u64>,
    /// The primary's durable end (or `catch_up`).
    durable: u64,
    commit: u64,
    /// Room for another request in flight.
    room: bool,
    send_probe: bool,
    send_data: bool,
    send_commit: bool,
}

/// Whether a shipper's loop goes round again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    Again,
    End,
}

impl Shipper {
    pub(super) async fn run(self) {
        let node = self.replicated.replicas[self.copy];
        let config = &self.storage.config;
        let mut ship = ShipLoop {
            node,
            id: malachi_storage::SegmentId(self.replicated.segment.0),
            window: self
                .storage
                .replication
                .window(node, config.replica_inflight_bytes_max),
            local: self.replicated.local_durable.subscribe(),
            committed: self.replicated.committed.subscribe(),
            next: 0,
            probed: false,
            next_send: 0,
            inflight: InFlight::default(),
            told_committed: None,
            retry_ms: RETRY_MS_MIN,
            closed_at: None,
            held: false,
        };
        loop {
            let Some(turn) = self.turn(&mut ship) else {
                return;
            };
            let step = if turn.send_probe || turn.send_data || turn.send_commit {
                self.send(&mut ship, turn).await
            } else {
                self.await_answer(&mut ship, turn).await
            };
            if step == Step::End {
                return;
            }
        }
    }

    /// What to do this turn; `None` once a closed segment's follower is
    /// done with (whole up to the seal, or given up on).
    fn turn(&self, ship: &mut ShipLoop) -> Option<Turn> {
        let catch_up = self.catch_up(ship)?;
        let durable = catch_up.unwrap_or_else(|| *ship.local.borrow_and_update());
        let commit = *ship.committed.borrow_and_update();
        let depth_max = self.storage.config.replica_pipeline_depth_max.max(1);
        let room = ship.inflight.len() < depth_max;
        let probed = ship.probed;
        Some(Turn {
            catch_up,
            durable,
            commit,
            room,
            send_probe: !probed && ship.inflight.is_empty(),
            send_data: probed && room && ship.next_send < durable,
            send_commit: probed
                && ship.inflight.is_empty()
                && ship.next_send >= durable
                && ship.told_committed != Some(commit),
        })
    }

    /// A sealed (or fenced, about to be sealed) segment's follower still
    /// gets every record up to the seal: a copy that lagged when the
    /// quorum moved on catches up, so every copy ends whole and
    /// byte-identical (ADR 0097). Bounded in time: past it, a copy still
    /// short is the healer's. `Some(None)` while the segment is open;
    /// `None` once the follower is done with.
    fn catch_up(&self, ship: &mut ShipLoop) -> Option<Option<u64>> {
        if !self.replicated.is_closed() {
            return Some(None);
        }
        let since = *ship.closed_at.get_or_insert_with(Instant::now);
        let target = self.sealed_length(ship.id)?;
        let (segment, follower) = (self.replicated.segment, ship.node.0);
        if ship.probed && ship.next >= target {
            debug!(%segment, follower, length = target, "follower copy whole up to the seal");
            return None;
        }
        if since.elapsed() > Duration::from_millis(CATCH_UP_AFTER_SEAL_MS_MAX) {
            warn!(%segment, follower, follower_end = ship.next, length = target, "a follower copy is still short of its seal; catch-up gives up");
            return None;
        }
        Some(Some(target))
    }

    /// Sends the next request: a probe, a run of frames, or the committed
    /// end alone; unless group commit holds it back first.
    async fn send(&self, ship: &mut ShipLoop, turn: Turn) -> Step {
        if let Some(step) = self.hold_for_group_commit(ship, turn).await {
            return step;
        }
        let (first, frames, records) = match self.frames_to_send(ship, turn).await {
            Ok(run) => run,
            Err(step) => return step,
        };
        let config = &self.storage.config;
        let request = ReplicaAppendRequest {
            topic: self.replicated.topic.clone(),
            segment: self.replicated.segment.0,
            epoch: self.replicated.epoch,
            first_offset: first,
            committed_end: turn.commit,
            repair: None,
            frames,
        };
        let weight = request
            .frames
            .len()
            .clamp(1, config.replica_inflight_bytes_max);
        let Ok(credit) = Arc::clone(&ship.window)
            .acquire_many_owned(u32::try_from(weight).unwrap_or(u32::MAX))
            .await
        else {
            return Step::End;
        };
        let link = Arc::clone(&self.link);
        let (node, timeout_ms) = (ship.node, config.replica_ack_timeout_ms);
        let (commit, durable, sent_at) = (turn.commit, turn.durable, Instant::now());
        ship.inflight.push_back(tokio::spawn(async move {
            let answer = link.append(node, &request, timeout_ms).await;
            drop(credit);
            Shipped {
                commit,
                durable,
                sent_at,
                answer,
            }
        }));
        if ship.probed {
            ship.next_send = first + records;
        }
        tracing::trace!(segment = %self.replicated.segment, follower = node.0, first, records, next_send = ship.next_send, durable, inflight = ship.inflight.len(), "replica append sent");
        Step::Again
    }

    /// Replication-level group commit (off by default): with nothing in
    /// flight, holds the next run until enough records wait or the linger
    /// passes. `None` when it does not hold this send.
    async fn hold_for_group_commit(&self, ship: &mut ShipLoop, turn: Turn) -> Option<Step> {
        let config = &self.storage.config;
        let linger_ms = config.replica_group_commit_ms;
        if linger_ms == 0
            || ship.held
            || turn.catch_up.is_some()
            || !turn.send_data
            || !ship.inflight.is_empty()
            || turn.durable - ship.next_send >= config.replica_group_commit_records
        {
            ship.held = false;
            return None;
        }
        ship.held = true;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(linger_ms);
        while ship
            .local
            .borrow_and_update()
            .saturating_sub(ship.next_send)
            < config.replica_group_commit_records
        {
            match tokio::time::timeout_at(deadline, ship.local.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Some(Step::End),
                Err(_) => break,
            }
        }
        Some(Step::Again)
    }

    /// The frames the next request carries, from the run cache or the
    /// store: (first offset, frames, records). A probe or a committed end
    /// alone carries none.
    async fn frames_to_send(
        &self,
        ship: &mut ShipLoop,
        turn: Turn,
    ) -> Result<(u64, Bytes, u64), Step> {
        if !turn.send_data {
            let first = if ship.probed { ship.next_send } else { 0 };
            return Ok((first, Bytes::new(), 0));
        }
        if let Some(run) = self.replicated.cached_run(ship.next_send) {
            let bytes = run.frames.len() as u64;
            self.storage.metrics.shipped(ShippedFrom::Cache, bytes);
            return Ok((run.first, run.frames, run.records));
        }
        let store = Arc::clone(&self.storage.store);
        let (id, from) = (ship.id, ship.next_send);
        let bytes_max = self.storage.config.replica_append_bytes_max;
        let read =
            tokio::task::spawn_blocking(move || store.read_frames(id, from, bytes_max)).await;
        match read {
            Ok(Ok(run)) => {
                debug_assert_eq!(run.first, from, "a run starts where it was asked");
                let frames = Bytes::from(run.bytes);
                self.storage
                    .metrics
                    .shipped(ShippedFrom::Log, frames.len() as u64);
                self.replicated.cache_run(CachedRun {
                    first: run.first,
                    records: run.records,
                    frames: frames.clone(),
                });
                Ok((run.first, frames, run.records))
            }
            Ok(Err(e)) => {
                warn!(segment = %self.replicated.segment, follower = ship.node.0, error = %e, "cannot read frames to ship");
                self.pause(&mut ship.retry_ms).await;
                Err(Step::Again)
            }
            Err(_) => Err(Step::End),
        }
    }

    /// Nothing to send now: waits for an answer, more durable records
    /// (while there is room), or a new committed end.
    async fn await_answer(&self, ship: &mut ShipLoop, turn: Turn) -> Step {
        let Some(oldest) = ship.inflight.front_mut() else {
            tracing::trace!(segment = %self.replicated.segment, follower = ship.node.0, next = ship.next, next_send = ship.next_send, durable = turn.durable, commit = turn.commit, "shipper idle");
            tokio::select! {
                changed = ship.local.changed() => if changed.is_err() { return Step::End },
                changed = ship.committed.changed() => if changed.is_err() { return Step::End },
            }
            return Step::Again;
        };
        let shipped = tokio::select! {
            biased;
            shipped = oldest => shipped,
            changed = ship.local.changed(), if turn.room && turn.catch_up.is_none() => {
                if changed.is_err() { return Step::End }
                return Step::Again;
            }
        };
        ship.inflight.pop_front();
        tracing::trace!(segment = %self.replicated.segment, follower = ship.node.0, answer = ?shipped.as_ref().map(|s| s.answer.as_ref().map(|r| (r.durable_end, r.refused))), next = ship.next, next_send = ship.next_send, inflight = ship.inflight.len(), "replica append answered");
        let Ok(shipped) = shipped else {
            // The task was aborted or failed: start over from the end the
            // follower last told.
            ship.reset();
            return Step::Again;
        };
        self.on_answer(ship, shipped).await;
        Step::Again
    }

    /// Takes the follower's answer to the oldest request in flight.
    async fn on_answer(&self, ship: &mut ShipLoop, shipped: Shipped) {
        let Shipped {
            commit,
            durable,
            sent_at,
            answer,
        } = shipped;
        let (segment, follower) = (self.replicated.segment, ship.node.0);
        let response = match answer {
            Ok(response) => response,
            Err(reason) => {
                debug!(%segment, follower, %reason, "follower unreachable");
                self.storage.metrics.shipper_resumed("unreachable");
                ship.reset();
                self.pause(&mut ship.retry_ms).await;
                return;
            }
        };
        match response.refused {
            None => {
                ship.retry_ms = RETRY_MS_MIN;
                if !ship.probed {
                    ship.probed = true;
                    ship.next_send = response.durable_end;
                }
                ship.told_committed = Some(commit);
                ship.next = ship.next.max(response.durable_end);
                self.replicated
                    .observe(&self.storage, self.copy, response.durable_end);
                self.storage.metrics.replica_lag(
                    ship.node,
                    durable.saturating_sub(response.durable_end),
                    sent_at.elapsed(),
                );
                report_lag_bytes(&self.storage, ship.node, ship.id, &response);
            }
            Some(ReplicaRefusal::NotAtEnd) => {
                // The follower ends elsewhere (it restarted, an earlier
                // request was lost, or one landed after its answer was
                // lost): drop what is in flight and resume from its end. A
                // copy ahead of the primary's durable end cannot happen; it
                // is only waited out.
                ship.probed = true;
                ship.next = response.durable_end;
                self.storage.metrics.shipper_resumed("not_at_end");
                ship.reset();
                // Against the primary's durable end now, not the one this
                // request was sent at: with appends pipelined, the follower
                // may well hold what became durable here after the send.
                let durable_now = *ship.local.borrow();
                if ship.next > durable.max(durable_now) {
                    warn!(%segment, follower, follower_end = ship.next, durable = durable_now, "a follower copy ends past the primary's");
                    self.pause(&mut ship.retry_ms).await;
                }
            }
            Some(refusal) => {
                debug!(%segment, follower, ?refusal, message = %response.message, "follower refused a replica append");
                self.storage.metrics.shipper_resumed("refused");
                ship.reset();
                self.pause(&mut ship.retry_ms).await;
            }
        }
    }

    /// The length a closed segment's copy here is (or is about to be)
    /// sealed at: its seal, or its durable end once fenced. `None` for a
    /// copy neither sealed nor fenced (its actor stopped for another
    /// reason; a restarted actor leads it again).
    fn sealed_length(&self, id: malachi_storage::SegmentId) -> Option<u64> {
        let info = self.storage.store.info(id).ok()?;
        match info.sealed {
            Some(seal) => Some(seal.length),
            None if info.fenced => Some(info.durable),
            None => None,
        }
    }

    async fn pause(&self, retry_ms: &mut u64) {
        tokio::time::sleep(Duration::from_millis(*retry_ms)).await;
        *retry_ms = (*retry_ms * 2).min(RETRY_MS_MAX);
    }
}

/// The follower's lag in bytes behind this copy's durable bytes, when its
/// answer told its own (ADR 0098).
pub(super) fn report_lag_bytes(
    storage: &Storage,
    node: NodeId,
    id: malachi_storage::SegmentId,
    response: &ReplicaAppendResponse,
) {
    let (Some(follower), Ok(local)) = (response.durable_bytes, storage.store.info(id)) else {
        return;
    };
    storage
        .metrics
        .replica_lag_bytes(node, local.byte_size.saturating_sub(follower));
}
