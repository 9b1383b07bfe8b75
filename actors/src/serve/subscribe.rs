//! Subscriptions: records pushed within credit (ADR 0042).
//!
//! A subscription is named by the correlation id of its `subscribe` request
//! on its connection. Push 0 (empty, carrying the starting cursor) accepts
//! it; each later push carries at most the record credit and, unless it
//! holds exactly one record, at most the byte credit, and subtracts what it
//! carried. With no credit, nothing is pushed: credit, not TCP, is the flow
//! control, and pushes share the connection's bounded outbound queue. A
//! cancel ends the subscription with a push flagged `last`; an error frame
//! on the subscription's id ends it too (the topic was deleted, or the
//! connection's session ended: ADR 0154, checked before each push). Each push
//! reads as a fetch does, the sealed segments this broker holds no usable
//! copy of through their holders (`remote.rs`, ADR 0118).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use malachi_core::cursor::{Cursor, Position};
use malachi_core::model::RangeId;
use malachi_wire::batch::BatchBuilder;
use malachi_wire::limits::{CREDIT_BYTES_MAX, CREDIT_RECORDS_MAX};
use malachi_wire::messages::{
    FetchRequest, SubscribeCreditRequest, SubscribeCreditResponse, SubscribePush, SubscribeRequest,
};
use malachi_wire::{ErrorCode, Message, RecordBatch};
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::context::ReadCtx;
use super::error::ServeError;
use super::fetch::caught_up_start;
use super::read::{LocalCopies, ReadBudget, active_plans, read_topic, response_control_bytes};
use super::remote::{REMOTE_ACTIVE_POLL_MS, read_through_holders};
use super::reply::{Failure, Outbound, Reply, refusal_frame};
use crate::control::metadata::read_owner;

/// Subscriptions one connection may hold at once.
pub(crate) const SUBSCRIPTIONS_PER_CONNECTION_MAX: usize = 16;
const READ_CHUNK_RECORDS: usize = 1024;

#[derive(Debug, Default)]
struct Credit {
    records: u32,
    bytes: u32,
}

#[derive(Debug, Default)]
pub(crate) struct Subscription {
    credit: Mutex<Credit>,
    wake: Notify,
    cancelled: AtomicBool,
}

/// The live subscriptions of one connection.
#[derive(Debug, Default)]
pub(crate) struct Subscriptions {
    map: Mutex<HashMap<u32, Arc<Subscription>>>,
}

impl Subscriptions {
    fn remove(&self, id: u32) {
        self.map.lock().remove(&id);
    }

    /// No subscription is open (the connection may be idle).
    pub(crate) fn is_empty(&self) -> bool {
        self.map.lock().is_empty()
    }
}

/// What a request handler may use of its connection (subscriptions push
/// through it), and what its reads use of the broker (`read`, built once
/// per connection).
#[derive(Clone)]
pub(crate) struct ConnCtx {
    pub read: Arc<ReadCtx>,
    /// Who the connection is, and the broker's authorization (ADR 0150).
    pub auth: Arc<super::auth::ConnAuth>,
    pub tx: tokio::sync::mpsc::Sender<Outbound>,
    pub subscriptions: Arc<Subscriptions>,
    pub cancel: tokio_util::sync::CancellationToken,
}

fn push_frame(id: u32, push: &SubscribePush) -> Reply {
    match push.encode_parts() {
        Ok((control, block)) => Reply {
            correlation_id: id,
            error_code: ErrorCode::None,
            control,
            block,
        },
        Err(e) => refusal_frame(
            id,
            &ServeError::Internal {
                what: "encode a push",
                reason: e.to_string(),
            },
        ),
    }
}

/// Accepts a subscription and starts its push task; a refusal is returned
/// (and becomes an error response on the subscription's id).
pub(crate) async fn subscribe(
    ctx: &ConnCtx,
    id: u32,
    req: SubscribeRequest,
) -> Result<(), Failure> {
    let broker = &ctx.read;
    let plane = broker.place.plane().map_err(ServeError::Metadata)?;
    super::cursors::keys(broker)?;
    let verified = match &req.cursor {
        Some(encoded) => Some(super::cursors::verify(broker, encoded).await?),
        None => None,
    };
    let as_fetch = FetchRequest {
        topic: req.topic.clone(),
        cursor: req.cursor.clone(),
        from_start: req.from_start,
        records_max: 1,
        bytes_max: 1,
        wait_ms: 0,
    };
    let (incarnation, start) = caught_up_start(broker, plane.as_ref(), &as_fetch, verified).await?;
    let sub = Arc::new(Subscription {
        credit: Mutex::new(Credit {
            records: req.credit_records,
            bytes: req.credit_bytes,
        }),
        ..Subscription::default()
    });
    {
        let mut map = ctx.subscriptions.map.lock();
        if map.contains_key(&id) {
            return Err(ServeError::SubscriptionOpen { id });
        }
        if map.len() >= SUBSCRIPTIONS_PER_CONNECTION_MAX {
            return Err(ServeError::TooManySubscriptions {
                subscriptions_max: SUBSCRIPTIONS_PER_CONNECTION_MAX,
            });
        }
        map.insert(id, Arc::clone(&sub));
    }
    let task = PushTask {
        broker: Arc::clone(broker),
        tx: ctx.tx.clone(),
        cancel: ctx.cancel.clone(),
        subscriptions: Arc::clone(&ctx.subscriptions),
        auth: Arc::clone(&ctx.auth),
        sub,
        id,
        topic: req.topic,
        incarnation,
    };
    tokio::spawn(task.run(start));
    Ok(())
}

/// Adds credit to, or cancels, a subscription of this connection.
pub(crate) fn credit(
    ctx: &ConnCtx,
    req: SubscribeCreditRequest,
) -> Result<SubscribeCreditResponse, Failure> {
    let sub = ctx
        .subscriptions
        .map
        .lock()
        .get(&req.subscription_id)
        .cloned()
        .ok_or(ServeError::SubscriptionNotFound {
            subscription_id: req.subscription_id,
        })?;
    let answer = {
        let mut credit = sub.credit.lock();
        credit.records = credit
            .records
            .saturating_add(req.credit_records)
            .min(CREDIT_RECORDS_MAX);
        credit.bytes = credit
            .bytes
            .saturating_add(req.credit_bytes)
            .min(CREDIT_BYTES_MAX);
        SubscribeCreditResponse {
            credit_records: credit.records,
            credit_bytes: credit.bytes,
        }
    };
    if req.cancel {
        sub.cancelled.store(true, Ordering::SeqCst);
    }
    sub.wake.notify_one();
    Ok(answer)
}

struct PushTask {
    broker: Arc<ReadCtx>,
    tx: tokio::sync::mpsc::Sender<Outbound>,
    cancel: tokio_util::sync::CancellationToken,
    subscriptions: Arc<Subscriptions>,
    /// The connection's session: pushes stop when it ends (ADR 0154).
    auth: Arc<super::auth::ConnAuth>,
    sub: Arc<Subscription>,
    id: u32,
    topic: String,
    incarnation: u64,
}

impl PushTask {
    async fn send(&self, frame: Reply) -> bool {
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            sent = self.tx.send(Outbound { frame, _slot: None }) => sent.is_ok(),
        }
    }

    fn push(
        &self,
        sequence: u64,
        positions: &BTreeMap<RangeId, Position>,
        records: RecordBatch,
        last: bool,
    ) -> Reply {
        let cursor = Cursor {
            topic: self.topic.clone(),
            incarnation: self.incarnation,
            positions: positions.clone(),
        };
        let keys = match super::cursors::keys(&self.broker) {
            Ok(keys) => keys,
            Err(refusal) => return refusal_frame(self.id, &refusal),
        };
        match cursor.encode(&keys) {
            Ok(next_cursor) => push_frame(
                self.id,
                &SubscribePush {
                    sequence,
                    next_cursor,
                    last,
                    records,
                },
            ),
            Err(e) => refusal_frame(
                self.id,
                &ServeError::Internal {
                    what: "encode a cursor",
                    reason: e.to_string(),
                },
            ),
        }
    }

    async fn run(self, start: BTreeMap<RangeId, Position>) {
        let mut positions = start;
        let mut sequence = 0u64;
        let accepted = self.push(sequence, &positions, RecordBatch::default(), false);
        if !self.send(accepted).await {
            self.subscriptions.remove(self.id);
            return;
        }
        let frame_max = self.broker.frame_bytes_max;
        loop {
            sequence += 1;
            // Nothing is pushed past the session's end (a token's `exp`, a
            // deleted user): the subscription ends with the refusal.
            if let Err(ended) = self.auth.session_live().await {
                let _ = self.send(refusal_frame(self.id, &ended)).await;
                break;
            }
            if self.sub.cancelled.load(Ordering::SeqCst) {
                let last = self.push(sequence, &positions, RecordBatch::default(), true);
                let _ = self.send(last).await;
                break;
            }
            let mut durable = self.broker.data.watch_topic(&self.topic);
            let (records_credit, bytes_credit) = {
                let credit = self.sub.credit.lock();
                (credit.records, credit.bytes)
            };
            let Ok(plane) = self.broker.place.plane() else {
                break;
            };
            let alive = read_owner(plane.as_ref(), &self.topic, |state| {
                state
                    .topic(&self.topic)
                    .is_some_and(|t| t.incarnation.0 == self.incarnation)
            });
            if !alive {
                let gone = refusal_frame(
                    self.id,
                    &ServeError::TopicDeleted {
                        topic: self.topic.clone(),
                    },
                );
                let _ = self.send(gone).await;
                break;
            }
            let mut pushed = false;
            // Whether the read needs another broker's active segment, whose
            // appends do not wake `durable` here: a timer does (ADR 0123).
            let mut remote_active = false;
            if records_credit > 0 && bytes_credit > 0 {
                let me = self.broker.place.me;
                let (plans, copies) = read_owner(plane.as_ref(), &self.topic, |state| {
                    let plans = active_plans(state, &self.topic);
                    let copies = LocalCopies::of(state, &plans, me)
                        .with_metrics(&self.broker.metrics)
                        .without_broken(&self.broker.data.scrub.book.lock());
                    (plans, copies)
                });
                remote_active = copies.reads_active_elsewhere(&plans);
                // The frame keeps room for a cursor over every range. A
                // record larger than the byte credit goes alone (within the
                // frame), so it cannot stall the subscription; one too large
                // for any frame ends it with `frame_too_large`.
                let control = response_control_bytes(&self.topic, plans.len());
                let frame_room = frame_max.saturating_sub(control);
                let batch_max = (bytes_credit as usize).min(frame_room);
                // A sealed segment this broker cannot read is read from a
                // holder (ADR 0118).
                let attempt =
                    read_through_holders(&self.broker, &self.topic, copies, batch_max, |copies| {
                        let mut builder = BatchBuilder::with_capacity(frame_room, batch_max);
                        let outcome = tokio::task::block_in_place(|| {
                            read_topic(
                                &plans,
                                copies,
                                self.broker.store.as_ref(),
                                &positions,
                                &mut builder,
                                ReadBudget {
                                    records_max: records_credit,
                                    batch_bytes_max: batch_max,
                                    read_chunk_records: READ_CHUNK_RECORDS,
                                },
                            )
                        })?;
                        Ok((outcome, builder))
                    })
                    .await;
                let (batch, outcome, moved) = match attempt {
                    Ok(read) => (read.out.finish(), read.outcome, read.moved),
                    Err(e) => {
                        let refusal = e.refusal(&self.topic, frame_max, control);
                        let failed = refusal_frame(self.id, &refusal);
                        let _ = self.send(failed).await;
                        break;
                    }
                };
                if outcome.records == 0 && moved {
                    // Records of a holder's run, none of this range's: read
                    // on from past them without waiting.
                    positions = outcome.positions;
                    sequence -= 1;
                    continue;
                }
                if outcome.records > 0 {
                    {
                        let mut credit = self.sub.credit.lock();
                        credit.records = credit.records.saturating_sub(outcome.records);
                        let block = u32::try_from(batch.encoded_bytes()).unwrap_or(u32::MAX);
                        credit.bytes = credit.bytes.saturating_sub(block);
                    }
                    self.broker
                        .metrics
                        .records_consumed
                        .increment(u64::from(outcome.records));
                    self.broker.metrics.bytes_consumed.increment(outcome.bytes);
                    positions = outcome.positions;
                    let frame = self.push(sequence, &positions, batch, false);
                    if !self.send(frame).await {
                        break;
                    }
                    pushed = true;
                }
            }
            if !pushed {
                sequence -= 1;
                tokio::select! {
                    _ = self.cancel.cancelled() => break,
                    _ = self.broker.draining.cancelled() => break,
                    _ = self.sub.wake.notified() => {}
                    _ = self.auth.session_deadline() => {}
                    _ = durable.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(REMOTE_ACTIVE_POLL_MS)), if remote_active => {}
                }
            }
        }
        self.subscriptions.remove(self.id);
    }
}
