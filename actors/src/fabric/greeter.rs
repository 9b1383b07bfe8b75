//! The actor guide's example (`writing-an-actor.md` §10), tests only: a greeter on each broker.

use std::time::Duration;

use malachi_supervision::ChildSpec;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::node::Fabric;
use super::remote::{self, Peer, RemoteError, RemoteMsg};

const BEHAVIOUR: &str = "greeter"; // in the group `greeter/<node_id>@<fabric addr>`

pub(crate) struct Greeter;

#[ractor::async_trait]
impl Actor for Greeter {
    type Msg = RemoteMsg;
    type State = Peer; // this broker
    type Arguments = Peer;

    async fn pre_start(
        &self,
        myself: ActorRef<RemoteMsg>,
        me: Peer,
    ) -> Result<Peer, ActorProcessingErr> {
        remote::join(BEHAVIOUR, me, myself.get_cell());
        Ok(me)
    }

    async fn handle(
        &self,
        _myself: ActorRef<RemoteMsg>,
        RemoteMsg::Call(call): RemoteMsg,
        me: &mut Peer,
    ) -> Result<(), ActorProcessingErr> {
        // Untrusted bytes: answer what is known, refuse the rest (empty).
        let who = String::from_utf8_lossy(&call.body);
        let answer = match call.variant.as_str() {
            "hello" => format!("{who} from {}", me.node_id),
            _ => String::new(),
        };
        let _ = call.reply.send(answer.into_bytes());
        Ok(())
    }
}

/// The greeter as a supervisor's child.
pub(crate) fn spec(me: Peer) -> ChildSpec {
    ChildSpec::worker("greeter", || Greeter, move || me)
}

/// Greets broker `peer` within the fabric's bounds (size, deadline, calls in flight).
pub(crate) async fn greet(fabric: &Fabric, peer: u64) -> Result<String, RemoteError> {
    let body = format!("hello {}", fabric.node_id).into_bytes();
    let (deadline, session_wait) = (Duration::from_secs(2), Duration::from_secs(1));
    let ((to, _live), calls) = (fabric.peer(peer), &fabric.calls);
    let answer = calls.call(BEHAVIOUR, to, "hello", body, deadline, session_wait);
    Ok(String::from_utf8_lossy(&answer.await?).into_owned())
}
