//! The backpressure pattern: a BoundedRef never lets more than `inflight_max`
//! messages be queued or in handling at one actor.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use malachi_supervision::{BoundedRef, Permit, SupervisionError};
use malachi_testkit::wait::wait_until;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::Semaphore;

/// How long a wait may take, and how often it checks.
const WAIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(2);

/// A worker that blocks on a gate before finishing each message, so messages
/// pile up exactly as they would behind a slow disk.
struct Gated;

enum GatedMsg {
    Work(Permit),
    Echo(Permit, u64, RpcReplyPort<u64>),
}
impl ractor::Message for GatedMsg {}

struct GatedState {
    gate: Arc<Semaphore>,
    handled: Arc<AtomicUsize>,
}

#[ractor::async_trait]
impl Actor for Gated {
    type Msg = GatedMsg;
    type State = GatedState;
    type Arguments = GatedState;

    async fn pre_start(
        &self,
        _myself: ActorRef<GatedMsg>,
        args: GatedState,
    ) -> Result<GatedState, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<GatedMsg>,
        message: GatedMsg,
        state: &mut GatedState,
    ) -> Result<(), ActorProcessingErr> {
        state.gate.acquire().await?.forget();
        state.handled.fetch_add(1, Ordering::SeqCst);
        match message {
            // The permit is dropped at the end of the handler: that returns the credit.
            GatedMsg::Work(_permit) => {}
            GatedMsg::Echo(_permit, n, reply) => {
                let _ = reply.send(n);
            }
        }
        Ok(())
    }
}

async fn spawn_gated(
    inflight_max: usize,
) -> (BoundedRef<GatedMsg>, Arc<Semaphore>, Arc<AtomicUsize>) {
    let gate = Arc::new(Semaphore::new(0));
    let handled = Arc::new(AtomicUsize::new(0));
    let (actor, _join) = Gated::spawn(
        None,
        Gated,
        GatedState {
            gate: Arc::clone(&gate),
            handled: Arc::clone(&handled),
        },
    )
    .await
    .unwrap();
    (BoundedRef::new(actor, inflight_max), gate, handled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_send_is_refused_with_busy_once_inflight_max_messages_are_outstanding() {
    let (bounded, gate, handled) = spawn_gated(4).await;
    for _ in 0..4 {
        bounded.try_send(GatedMsg::Work).unwrap();
    }

    let refused = bounded.try_send(GatedMsg::Work).unwrap_err();

    assert_eq!(refused, SupervisionError::Busy { inflight_max: 4 });
    assert_eq!(bounded.inflight(), 4);
    gate.add_permits(4);
    wait_until("no message is in flight", WAIT, POLL, async || {
        bounded.inflight() == 0
    })
    .await;
    assert_eq!(
        handled.load(Ordering::SeqCst),
        4,
        "the refused message never reached the actor"
    );
    bounded.actor().stop(None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_waits_for_credit_instead_of_growing_the_mailbox() {
    let (bounded, gate, handled) = spawn_gated(2).await;
    let producer = {
        let bounded = bounded.clone();
        tokio::spawn(async move {
            for _ in 0..50 {
                bounded.send(GatedMsg::Work).await.unwrap();
                assert!(bounded.inflight() <= bounded.inflight_max());
            }
        })
    };

    wait_until("two messages are in flight", WAIT, POLL, async || {
        bounded.inflight() == 2
    })
    .await;
    assert!(
        !producer.is_finished(),
        "the producer is held back at the bound"
    );

    gate.add_permits(50);
    tokio::time::timeout(Duration::from_secs(5), producer)
        .await
        .unwrap()
        .unwrap();
    wait_until("all 50 messages are handled", WAIT, POLL, async || {
        handled.load(Ordering::SeqCst) == 50
    })
    .await;
    wait_until("no message is in flight", WAIT, POLL, async || {
        bounded.inflight() == 0
    })
    .await;
    bounded.actor().stop(None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_answers_within_its_bound_and_times_out_when_the_actor_is_stuck() {
    let (bounded, gate, _handled) = spawn_gated(1).await;
    gate.add_permits(1);
    let answer = bounded
        .call(|permit, reply| GatedMsg::Echo(permit, 7, reply), 1_000)
        .await
        .unwrap();
    assert_eq!(answer, 7);

    // The gate is closed now: the next call cannot be answered.
    let stuck = bounded
        .call(|permit, reply| GatedMsg::Echo(permit, 8, reply), 50)
        .await
        .unwrap_err();

    assert_eq!(stuck, SupervisionError::Timeout { timeout_ms: 50 });
    bounded.actor().kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credit_returns_when_the_actor_dies_with_messages_queued() {
    let (bounded, _gate, _handled) = spawn_gated(3).await;
    for _ in 0..3 {
        bounded.try_send(GatedMsg::Work).unwrap();
    }

    bounded.actor().kill();

    wait_until("no message is in flight", WAIT, POLL, async || {
        bounded.inflight() == 0
    })
    .await;
    assert_eq!(
        bounded.try_send(GatedMsg::Work).unwrap_err(),
        SupervisionError::NotRunning
    );
    assert_eq!(
        bounded.inflight(),
        0,
        "a refused send does not leak its credit"
    );
}
