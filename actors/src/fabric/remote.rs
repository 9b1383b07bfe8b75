//! Calls between actors on different brokers over the node fabric
//! (ractor_cluster), bounded (ADR 0133). A distributed behaviour is an actor
//! on each broker that takes [`RemoteMsg`] and joins the process group
//! `<behaviour>/<node_id>@<fabric addr>` ([`join`]); a peer reaches it with
//! [`RemoteCalls::call`], naming the behaviour, the target node and a
//! request (a variant name and its encoded body). No api key is needed:
//! the variant names the request, and the body is the behaviour's own
//! versioned encoding (the coordinator's orders use the rmp-encoded wire
//! types of `malachi_wire::replica_order`).
//!
//! Bounds, because ractor_cluster has none of its own (decisions §1: its
//! session writes through an unbounded queue and may lose messages on a
//! reconnect):
//! - a request body and an answer are at most `message_bytes_max` bytes
//!   ([`ORDER_BYTES_MAX`] for the orders), refused with
//!   [`RemoteError::TooLarge`] before anything is sent, and dropped by the
//!   receiver's decoder;
//! - each call has a deadline (the caller's), for its whole life: the wait
//!   for a slot, every attempt and the waits between them;
//! - at most `calls_inflight_max` calls to one peer are in flight at once
//!   ([`CALLS_INFLIGHT_MAX`]); a call past it waits for a slot within its
//!   deadline, then fails with [`RemoteError::InflightFull`];
//! - a call whose session closed under it (ractor_cluster drops the pending
//!   reply ports of a closed session, which is how a lost message shows) is
//!   sent again, at most `attempts_max` times ([`CALL_ATTEMPTS_MAX`]) within
//!   the deadline. That is only safe for idempotent requests: every
//!   behaviour served here must be (the orders are: ADR 0133 lists why).
//!
//! A call that times out is not sent again: the receiver may still be
//! working on it, and a second copy would double the load on a broker that
//! is already slow.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use ractor::message::{BoxedDowncastErr, SerializedMessage};
use ractor::rpc::CallResult;
use ractor::{ActorCell, ActorRef, RpcReplyPort};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tracing::debug;

/// The process-group scope of broker actors reachable over the fabric.
pub(crate) const PG_SCOPE: &str = "malachi";
/// The largest order body or answer carried over the fabric: a drop order
/// or a replica-status request of 4096 segments is about 40 KiB, a status
/// answer for as many copies a few hundred KiB.
pub(crate) const ORDER_BYTES_MAX: usize = 1 << 20;
/// Calls to one peer in flight at once, per broker.
pub(crate) const CALLS_INFLIGHT_MAX: usize = 32;
/// How many times a call whose session closed under it is sent, in all.
pub(crate) const CALL_ATTEMPTS_MAX: u32 = 3;
/// How often a call waiting for a peer's proxy looks for it again.
const SESSION_POLL_MS: u64 = 25;
/// The wait before sending a call again, so a reconnecting session can
/// come back (ractor_cluster re-announces process groups on reconnect).
const RETRY_DELAY_MS: u64 = 50;

/// A broker as the fabric finds it: its node id and the fabric address it
/// advertises (from membership). Both name its groups, so two clusters in
/// one process (tests) never share one: ractor's groups are process-global,
/// and every node server in a process re-exports every actor in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer {
    pub node_id: u64,
    pub addr: Option<SocketAddr>,
}

/// The process group of `behaviour`'s actor on broker `peer`.
pub(crate) fn group(behaviour: &str, peer: Peer) -> String {
    match peer.addr {
        Some(addr) => format!("{behaviour}/{}@{addr}", peer.node_id),
        None => format!("{behaviour}/{}", peer.node_id),
    }
}

/// Joins `cell` to `behaviour`'s group for broker `me`; ractor_cluster
/// mirrors the group to every connected broker. The actor leaves it when
/// it stops.
pub(crate) fn join(behaviour: &str, me: Peer, cell: ActorCell) {
    ractor::pg::join_scoped(PG_SCOPE.to_owned(), group(behaviour, me), vec![cell]);
}

/// A request to a distributed behaviour's actor, local or from a peer.
#[derive(Debug)]
pub(crate) struct RemoteCall {
    /// Which request (the behaviour's own name for it).
    pub variant: String,
    /// Its encoded body, at most the receiver's `message_bytes_max`.
    pub body: Vec<u8>,
    /// The encoded answer; an empty answer means "refused" (unknown
    /// variant, busy) and is never a valid encoding of an answer.
    pub reply: RpcReplyPort<Vec<u8>>,
    /// Whether it came over the fabric (decoded from a peer's bytes).
    pub from_wire: bool,
}

/// The message type of a distributed behaviour's actor.
#[derive(Debug)]
pub(crate) enum RemoteMsg {
    Call(RemoteCall),
}

impl ractor::Message for RemoteMsg {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        let RemoteMsg::Call(call) = self;
        Ok(SerializedMessage::Call {
            variant: call.variant,
            args: call.body,
            reply: call.reply,
            metadata: None,
        })
    }

    /// Only calls within [`ORDER_BYTES_MAX`] are taken; anything else is
    /// dropped here (the caller sees its call time out), never handed to
    /// the actor half-understood.
    fn deserialize(message: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        match message {
            SerializedMessage::Call {
                variant,
                args,
                reply,
                ..
            } if args.len() <= ORDER_BYTES_MAX && variant.len() <= 64 => {
                Ok(RemoteMsg::Call(RemoteCall {
                    variant,
                    body: args,
                    reply,
                    from_wire: true,
                }))
            }
            other => {
                debug!(message = ?other, "undecodable remote call dropped");
                Err(BoxedDowncastErr)
            }
        }
    }
}

/// Why a remote call did not bring an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RemoteError {
    #[error("a {what} of {bytes} bytes is over message_bytes_max ({bytes_max})")]
    TooLarge {
        what: &'static str,
        bytes: usize,
        bytes_max: usize,
    },
    #[error(
        "{calls_inflight_max} calls to broker {peer} are in flight; none ended within the deadline"
    )]
    InflightFull {
        peer: u64,
        calls_inflight_max: usize,
    },
    #[error("no node fabric session to broker {peer} serves {behaviour}")]
    NoSession { peer: u64, behaviour: String },
    #[error("the session to broker {peer} closed under the call, {attempts} times")]
    Lost { peer: u64, attempts: u32 },
    #[error("broker {peer} did not answer within {timeout_ms} ms")]
    Timeout { peer: u64, timeout_ms: u64 },
    #[error("broker {peer} refused the call (busy, or it does not serve {variant})")]
    Refused { peer: u64, variant: String },
}

impl RemoteError {
    /// The fabric did not carry the call to the peer at all, or lost it:
    /// a caller with another path may take it.
    pub(crate) fn is_unreachable(&self) -> bool {
        matches!(
            self,
            RemoteError::NoSession { .. } | RemoteError::Lost { .. }
        )
    }
}

/// The calling side of one broker: its limits, a slot semaphore per peer,
/// and counters tests and the ADR's measurements read.
#[derive(Debug)]
pub(crate) struct RemoteCalls {
    message_bytes_max: usize,
    calls_inflight_max: usize,
    attempts_max: u32,
    /// Whether an actor in this process may serve a call (unit tests only).
    local_members: bool,
    /// One entry per peer ever called: bounded by the cluster's brokers.
    slots: Mutex<HashMap<u64, Arc<Semaphore>>>,
    /// Calls answered by a peer over the fabric.
    answered_total: AtomicU64,
    /// Calls sent again after their session closed.
    resent_total: AtomicU64,
    /// Calls a caller sent another way after the fabric could not carry
    /// them ([`RemoteError::is_unreachable`]).
    bypassed_total: AtomicU64,
    /// Calls served by this broker's behaviours from a peer, by variant.
    served: Mutex<BTreeMap<String, u64>>,
}

impl RemoteCalls {
    pub(crate) fn new(
        message_bytes_max: usize,
        calls_inflight_max: usize,
        attempts_max: u32,
    ) -> Self {
        assert!(message_bytes_max > 0 && calls_inflight_max > 0 && attempts_max > 0);
        RemoteCalls {
            message_bytes_max,
            calls_inflight_max,
            attempts_max,
            local_members: false,
            slots: Mutex::new(HashMap::new()),
            answered_total: AtomicU64::new(0),
            resent_total: AtomicU64::new(0),
            bypassed_total: AtomicU64::new(0),
            served: Mutex::new(BTreeMap::new()),
        }
    }

    /// These limits, served by actors in this process too (unit tests).
    #[cfg(test)]
    fn in_process(message_bytes_max: usize, calls_inflight_max: usize, attempts_max: u32) -> Self {
        RemoteCalls {
            local_members: true,
            ..RemoteCalls::new(message_bytes_max, calls_inflight_max, attempts_max)
        }
    }

    /// Calls `variant` of `behaviour` on broker `peer` with `body`, within
    /// `timeout`; the peer's encoded answer.
    ///
    /// A peer with no proxy yet is waited for up to `session_wait` (within
    /// the deadline), polled every [`SESSION_POLL_MS`]: a session that is
    /// reconnecting, or a group membership a peer is announcing again.
    pub(crate) async fn call(
        &self,
        behaviour: &str,
        to: Peer,
        variant: &str,
        body: Vec<u8>,
        timeout: Duration,
        session_wait: Duration,
    ) -> Result<Vec<u8>, RemoteError> {
        let peer = to.node_id;
        if body.len() > self.message_bytes_max {
            return Err(RemoteError::TooLarge {
                what: "request",
                bytes: body.len(),
                bytes_max: self.message_bytes_max,
            });
        }
        let deadline = Instant::now() + timeout;
        let _slot = self.slot(peer, deadline).await?;
        let wait_until = deadline.min(Instant::now() + session_wait);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let found = self.member_by(behaviour, to, wait_until).await;
            let Some(actor) = found else {
                if attempts == 1 {
                    return Err(RemoteError::NoSession {
                        peer,
                        behaviour: behaviour.to_owned(),
                    });
                }
                return Err(RemoteError::Lost {
                    peer,
                    attempts: attempts - 1,
                });
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let request = |reply| {
                RemoteMsg::Call(RemoteCall {
                    variant: variant.to_owned(),
                    body: body.clone(),
                    reply,
                    from_wire: false,
                })
            };
            let local = actor.get_id().is_local();
            debug!(peer, behaviour, variant, attempts, local, "remote call");
            match actor.call(request, Some(left)).await {
                Ok(CallResult::Success(answer)) => return self.answered(peer, variant, answer),
                Ok(CallResult::Timeout) => {
                    return Err(RemoteError::Timeout {
                        peer,
                        timeout_ms: timeout.as_millis() as u64,
                    });
                }
                // The session closed (its pending reply ports dropped) or
                // the proxy stopped: the message may be lost.
                Ok(CallResult::SenderError) | Err(_) => {}
            }
            let retry_at = Instant::now() + Duration::from_millis(RETRY_DELAY_MS);
            if attempts >= self.attempts_max || retry_at >= deadline {
                return Err(RemoteError::Lost { peer, attempts });
            }
            self.resent_total.fetch_add(1, Ordering::Relaxed);
            debug!(
                peer,
                behaviour, variant, attempts, "remote call lost; sending it again"
            );
            tokio::time::sleep_until(retry_at).await;
        }
    }

    /// `behaviour`'s actor on `peer`, polled for until `wait_until`.
    async fn member_by(
        &self,
        behaviour: &str,
        peer: Peer,
        wait_until: Instant,
    ) -> Option<ActorRef<RemoteMsg>> {
        loop {
            let found = member(behaviour, peer, self.local_members);
            let next = Instant::now() + Duration::from_millis(SESSION_POLL_MS);
            if found.is_some() || next > wait_until {
                return found;
            }
            tokio::time::sleep_until(next).await;
        }
    }

    /// A slot for one call to `peer`, waited for until `deadline`.
    async fn slot(
        &self,
        peer: u64,
        deadline: Instant,
    ) -> Result<OwnedSemaphorePermit, RemoteError> {
        let slots = Arc::clone(
            self.slots
                .lock()
                .entry(peer)
                .or_insert_with(|| Arc::new(Semaphore::new(self.calls_inflight_max))),
        );
        let full = RemoteError::InflightFull {
            peer,
            calls_inflight_max: self.calls_inflight_max,
        };
        match tokio::time::timeout_at(deadline, slots.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed; a timeout is the limit held.
            Ok(Err(_)) | Err(_) => Err(full),
        }
    }

    fn answered(&self, peer: u64, variant: &str, answer: Vec<u8>) -> Result<Vec<u8>, RemoteError> {
        if answer.is_empty() {
            return Err(RemoteError::Refused {
                peer,
                variant: variant.to_owned(),
            });
        }
        if answer.len() > self.message_bytes_max {
            return Err(RemoteError::TooLarge {
                what: "answer",
                bytes: answer.len(),
                bytes_max: self.message_bytes_max,
            });
        }
        self.answered_total.fetch_add(1, Ordering::Relaxed);
        Ok(answer)
    }

    /// Counts a call its caller sent another way.
    pub(crate) fn count_bypassed(&self) {
        self.bypassed_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a call this broker served from a peer.
    pub(crate) fn count_served(&self, variant: &str) {
        *self.served.lock().entry(variant.to_owned()).or_default() += 1;
    }

    /// Calls this broker served from peers, by variant (for tests).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn served(&self) -> BTreeMap<String, u64> {
        self.served.lock().clone()
    }

    /// Calls answered over the fabric, calls sent again, and calls sent
    /// another way (for tests).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        (
            self.answered_total.load(Ordering::Relaxed),
            self.resent_total.load(Ordering::Relaxed),
            self.bypassed_total.load(Ordering::Relaxed),
        )
    }
}

impl Default for RemoteCalls {
    fn default() -> Self {
        RemoteCalls::new(ORDER_BYTES_MAX, CALLS_INFLIGHT_MAX, CALL_ATTEMPTS_MAX)
    }
}

/// The actor serving `behaviour` on broker `peer`: a proxy of it that
/// crossed a fabric session. With `local`, failing that, the actor itself
/// when it runs in this process (the unit tests below). Without it, a
/// broker in the same process (tests, `malachi dev`) is reached over the
/// fabric too, so a test sees the path production takes, and the caller's
/// fallback when the fabric has no proxy.
fn member(behaviour: &str, peer: Peer, local: bool) -> Option<ActorRef<RemoteMsg>> {
    let mut members = ractor::pg::get_scoped_members(&PG_SCOPE.to_owned(), &group(behaviour, peer));
    members.retain(|cell| local || !cell.get_id().is_local());
    members.sort_by_key(|cell| cell.get_id().is_local());
    members.into_iter().next().map(ActorRef::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(node_id: u64) -> Peer {
        Peer {
            node_id,
            addr: None,
        }
    }

    #[tokio::test]
    async fn a_request_over_the_size_limit_is_refused_before_it_is_sent() {
        let calls = RemoteCalls::in_process(16, 4, 3);
        let refused = calls
            .call(
                "orders",
                at(7),
                "seal",
                vec![0; 17],
                Duration::from_secs(1),
                Duration::ZERO,
            )
            .await;
        assert_eq!(
            refused,
            Err(RemoteError::TooLarge {
                what: "request",
                bytes: 17,
                bytes_max: 16
            })
        );
    }

    #[tokio::test]
    async fn calls_to_one_peer_are_bounded_and_other_peers_are_not_held() {
        let calls = RemoteCalls::in_process(64, 2, 3);
        let deadline = Instant::now() + Duration::from_secs(1);
        let _a = calls.slot(7, deadline).await.unwrap();
        let _b = calls.slot(7, deadline).await.unwrap();
        // The third call to peer 7 waits for a slot and gives up at its
        // deadline, before looking for the peer at all.
        let held = calls
            .call(
                "orders",
                at(7),
                "seal",
                vec![1],
                Duration::from_millis(50),
                Duration::ZERO,
            )
            .await;
        assert_eq!(
            held,
            Err(RemoteError::InflightFull {
                peer: 7,
                calls_inflight_max: 2
            })
        );
        // Peer 8 has its own slots: its call goes on (and finds no session).
        let other = calls
            .call(
                "orders",
                at(8),
                "seal",
                vec![1],
                Duration::from_millis(50),
                Duration::ZERO,
            )
            .await;
        assert!(
            matches!(other, Err(RemoteError::NoSession { peer: 8, .. })),
            "{other:?}"
        );
        drop(_a);
        let freed = calls
            .call(
                "orders",
                at(7),
                "seal",
                vec![1],
                Duration::from_millis(50),
                Duration::ZERO,
            )
            .await;
        assert!(
            matches!(freed, Err(RemoteError::NoSession { peer: 7, .. })),
            "{freed:?}"
        );
    }

    /// A behaviour for the tests: answers each call after `work`, on a
    /// task, counting how many it holds at once; drops the reply of its
    /// first `lose` calls, as a closed session does.
    struct Probe;

    #[derive(Default)]
    struct Seen {
        now: std::sync::atomic::AtomicUsize,
        peak: std::sync::atomic::AtomicUsize,
        calls: std::sync::atomic::AtomicUsize,
    }

    #[ractor::async_trait]
    impl ractor::Actor for Probe {
        type Msg = RemoteMsg;
        type State = (Arc<Seen>, usize, Duration);
        type Arguments = (Arc<Seen>, usize, Duration);

        async fn pre_start(
            &self,
            _myself: ActorRef<RemoteMsg>,
            args: Self::Arguments,
        ) -> Result<Self::State, ractor::ActorProcessingErr> {
            Ok(args)
        }

        async fn handle(
            &self,
            _myself: ActorRef<RemoteMsg>,
            RemoteMsg::Call(call): RemoteMsg,
            (seen, lose, work): &mut Self::State,
        ) -> Result<(), ractor::ActorProcessingErr> {
            let n = seen.calls.fetch_add(1, Ordering::SeqCst);
            if n < *lose {
                drop(call.reply);
                return Ok(());
            }
            let (seen, work) = (Arc::clone(seen), *work);
            tokio::spawn(async move {
                let now = seen.now.fetch_add(1, Ordering::SeqCst) + 1;
                seen.peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(work).await;
                seen.now.fetch_sub(1, Ordering::SeqCst);
                let _ = call.reply.send(call.body);
            });
            Ok(())
        }
    }

    async fn probe(node: u64, lose: usize, work_ms: u64) -> (Arc<Seen>, ActorRef<RemoteMsg>) {
        let seen = Arc::new(Seen::default());
        let args = (Arc::clone(&seen), lose, Duration::from_millis(work_ms));
        let (actor, _) = ractor::Actor::spawn(None, Probe, args).await.unwrap();
        join("probe", at(node), actor.get_cell());
        (seen, actor)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_than_calls_inflight_max_calls_reach_one_peer_at_once() {
        let (seen, actor) = probe(9_001, 0, 30).await;
        let calls = Arc::new(RemoteCalls::in_process(64, 2, 3));
        let sent = (0..8u8).map(|i| {
            let calls = Arc::clone(&calls);
            async move {
                calls
                    .call(
                        "probe",
                        at(9_001),
                        "echo",
                        vec![i],
                        Duration::from_secs(10),
                        Duration::ZERO,
                    )
                    .await
            }
        });
        let answers = futures::future::join_all(sent).await;
        for (i, answer) in answers.into_iter().enumerate() {
            assert_eq!(answer, Ok(vec![i as u8]));
        }
        assert_eq!(
            seen.peak.load(Ordering::SeqCst),
            2,
            "calls_inflight_max held"
        );
        actor.stop(None);
    }

    /// Calls the probe on `peer` with `echo` of `[5]`, waiting for no session.
    async fn echo(
        calls: &RemoteCalls,
        peer: u64,
        timeout: Duration,
    ) -> Result<Vec<u8>, RemoteError> {
        calls
            .call("probe", at(peer), "echo", vec![5], timeout, Duration::ZERO)
            .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_lost_with_its_session_is_sent_again_within_attempts_max() {
        let (seen, actor) = probe(9_002, 2, 0).await;
        let calls = RemoteCalls::in_process(64, 2, 3);
        let answer = echo(&calls, 9_002, Duration::from_secs(5)).await;
        assert_eq!(answer, Ok(vec![5]));
        assert_eq!(seen.calls.load(Ordering::SeqCst), 3, "sent three times");
        assert_eq!(calls.counts(), (1, 2, 0));
        // Lost more often than attempts_max: a typed error, no endless loop.
        let (_, lossy) = probe(9_003, 10, 0).await;
        let lost = echo(&calls, 9_003, Duration::from_secs(5)).await;
        assert_eq!(
            lost,
            Err(RemoteError::Lost {
                peer: 9_003,
                attempts: 3
            })
        );
        actor.stop(None);
        lossy.stop(None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_that_times_out_is_not_sent_again() {
        let (seen, actor) = probe(9_004, 0, 2_000).await;
        let calls = RemoteCalls::in_process(64, 2, 3);
        let answer = echo(&calls, 9_004, Duration::from_millis(100)).await;
        assert_eq!(
            answer,
            Err(RemoteError::Timeout {
                peer: 9_004,
                timeout_ms: 100
            })
        );
        assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
        actor.stop(None);
    }

    #[test]
    fn an_oversized_or_cast_remote_message_is_refused_not_handed_to_the_actor() {
        let (tx, _rx) = tokio::sync::oneshot::channel::<Vec<u8>>();
        let big = SerializedMessage::Call {
            variant: "seal".into(),
            args: vec![0; ORDER_BYTES_MAX + 1],
            reply: RpcReplyPort::from(tx),
            metadata: None,
        };
        assert!(<RemoteMsg as ractor::Message>::deserialize(big).is_err());
        let cast = SerializedMessage::Cast {
            variant: "seal".into(),
            args: vec![1],
            metadata: None,
        };
        assert!(<RemoteMsg as ractor::Message>::deserialize(cast).is_err());
        let (tx, _rx) = tokio::sync::oneshot::channel::<Vec<u8>>();
        let fine = SerializedMessage::Call {
            variant: "seal".into(),
            args: vec![1],
            reply: RpcReplyPort::from(tx),
            metadata: None,
        };
        let Ok(RemoteMsg::Call(call)) = <RemoteMsg as ractor::Message>::deserialize(fine) else {
            panic!("a small call is taken");
        };
        assert!(call.from_wire);
    }
}
