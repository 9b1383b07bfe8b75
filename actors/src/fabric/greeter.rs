//! The actor guide's example (`writing-an-actor.md` §10): a `greeter` on
//! each broker answers its peers' `hello` over the node fabric (tests only).

use std::time::Duration;

use malachi_supervision::ChildSpec;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::node::Fabric;
use super::remote::{self, RemoteError, RemoteMsg};

const BEHAVIOUR: &str = "greeter"; // peers find it in the group `greeter/<node_id>`

pub(crate) struct Greeter;

#[ractor::async_trait]
impl Actor for Greeter {
    type Msg = RemoteMsg;
    type State = u64; // this broker's node id
    type Arguments = u64;

    async fn pre_start(
        &self,
        me: ActorRef<RemoteMsg>,
        node_id: u64,
    ) -> Result<u64, ActorProcessingErr> {
        remote::join(BEHAVIOUR, node_id, me.get_cell());
        Ok(node_id)
    }

    async fn handle(
        &self,
        _me: ActorRef<RemoteMsg>,
        RemoteMsg::Call(call): RemoteMsg,
        node_id: &mut u64,
    ) -> Result<(), ActorProcessingErr> {
        // Untrusted bytes: answer what is known, refuse the rest (empty).
        let answer = match call.variant.as_str() {
            "hello" => format!("{} from {node_id}", String::from_utf8_lossy(&call.body)),
            _ => String::new(),
        };
        let _ = call.reply.send(answer.into_bytes());
        Ok(())
    }
}

/// The greeter as a supervisor's child.
pub(crate) fn spec(node_id: u64) -> ChildSpec {
    ChildSpec::worker("greeter", || Greeter, move || node_id)
}

/// Greets broker `peer` within the fabric's bounds (size, deadline, calls in flight).
pub(crate) async fn greet(fabric: &Fabric, peer: u64) -> Result<String, RemoteError> {
    let body = format!("hello {}", fabric.node_id).into_bytes();
    let (deadline, session_wait) = (Duration::from_secs(2), Duration::from_secs(1));
    let calls = &fabric.calls;
    let answer = calls.call(BEHAVIOUR, peer, "hello", body, deadline, session_wait);
    Ok(String::from_utf8_lossy(&answer.await?).into_owned())
}
