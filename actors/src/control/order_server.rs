//! The serving half of the coordinator's orders over the node fabric (ADR
//! 0133): `metadata/orders`, one actor per broker in the process group
//! `orders/<node_id>@<fabric addr>` (scope `malachi`), which ractor_cluster mirrors to
//! every connected broker. It answers fence, seal, drop-copies and
//! replica-status (which carries the scrub requests) with the same
//! functions the cluster port runs (`replica_order.rs`,
//! `replica_status.rs`), so the two paths cannot disagree; the bodies and
//! answers are the rmp-encoded wire types of `malachi_wire::replica_order`
//! and `malachi_wire::replica_status`.
//!
//! Each order is answered on a task, so a fence waiting for a drain does
//! not hold the next order; at most [`ORDERS_SERVED_INFLIGHT_MAX`] at once,
//! and one past it is answered empty (the caller's "refused") at once.

use std::sync::Arc;

use bytes::Bytes;
use malachi_wire::replica_status::REPLICA_STATUS_API_KEY;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use super::replica_order::{ORDERS_BEHAVIOUR, api_key_of};
use super::shared::Shared;
use crate::fabric::remote::{self, RemoteCall, RemoteMsg};

/// Orders one broker serves at once, from every peer together.
pub(crate) const ORDERS_SERVED_INFLIGHT_MAX: usize = 64;
/// How often the actor joins its process group again. ractor_cluster
/// tells peers of group changes once, in control messages a reconnect may
/// lose, and a leave names actors by pid only; joining again is a no-op
/// for the group here and makes every session announce the membership
/// anew, so a peer that lost it (or dropped it for another actor's leave,
/// ADR 0133) has it back within this.
pub(crate) const ORDERS_REJOIN_MS: u64 = 250;

pub(crate) struct OrderServer;

pub(crate) struct OrderServerState {
    shared: Arc<Shared>,
    serving: Arc<Semaphore>,
    /// The periodic join, aborted with the state (a stop or a failure).
    _rejoin: AbortOnDrop,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[ractor::async_trait]
impl Actor for OrderServer {
    type Msg = RemoteMsg;
    type State = OrderServerState;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        myself: ActorRef<RemoteMsg>,
        shared: Arc<Shared>,
    ) -> Result<OrderServerState, ActorProcessingErr> {
        let me = shared.fabric().map_or(
            remote::Peer {
                node_id: shared.config.node_id,
                addr: None,
            },
            |fabric| fabric.me(),
        );
        let cell = myself.get_cell();
        remote::join(ORDERS_BEHAVIOUR, me, cell.clone());
        let rejoin = tokio::spawn(async move {
            let period = std::time::Duration::from_millis(ORDERS_REJOIN_MS);
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            loop {
                tick.tick().await;
                remote::join(ORDERS_BEHAVIOUR, me, cell.clone());
            }
        });
        Ok(OrderServerState {
            shared,
            serving: Arc::new(Semaphore::new(ORDERS_SERVED_INFLIGHT_MAX)),
            _rejoin: AbortOnDrop(rejoin),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<RemoteMsg>,
        RemoteMsg::Call(call): RemoteMsg,
        state: &mut OrderServerState,
    ) -> Result<(), ActorProcessingErr> {
        let RemoteCall {
            variant,
            body,
            reply,
            from_wire,
        } = call;
        let Some(api_key) = api_key_of(&variant) else {
            debug!(%variant, "unknown order refused");
            let _ = reply.send(Vec::new());
            return Ok(());
        };
        let Ok(permit) = Arc::clone(&state.serving).try_acquire_owned() else {
            debug!(%variant, ORDERS_SERVED_INFLIGHT_MAX, "order refused: at the limit");
            let _ = reply.send(Vec::new());
            return Ok(());
        };
        if from_wire && let Some(fabric) = state.shared.fabric() {
            fabric.calls.count_served(&variant);
        }
        let shared = Arc::clone(&state.shared);
        tokio::spawn(async move {
            let answer = serve(&shared, api_key, body).await;
            drop(permit);
            let _ = reply.send(answer);
        });
        Ok(())
    }
}

/// One order's encoded answer; empty when it cannot be encoded (logged).
async fn serve(shared: &Arc<Shared>, api_key: u16, body: Vec<u8>) -> Vec<u8> {
    let answer = if api_key == REPLICA_STATUS_API_KEY {
        super::replica_status::serve_replica_status(shared, &body)
    } else {
        match super::replica_order::serve_order(shared, api_key, Bytes::from(body)).await {
            Some(answer) => answer,
            None => return Vec::new(),
        }
    };
    answer.unwrap_or_else(|error| {
        warn!(api_key, %error, "an order's answer could not be encoded");
        Vec::new()
    })
}
