//! A small supervised tree: counters under a nested supervisor, fed through a
//! bounded reference, one of which crashes and is restarted with fresh state.
//!
//! Run with `cargo run -p malachi-supervision --example counter_tree`.
//! It prints the tree before and after the crash, then shuts the tree down in
//! order. The walkthrough is in docs/guides/writing-an-actor.md.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use malachi_supervision::{
    Backoff, BoundedRef, ChildSpec, Intensity, Permit, RenderOptions, Restart, Strategy,
    SupervisionError, SupervisorArgs, SupervisorRef, render_tree,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

/// The actor struct stays empty: everything lives in the state built by
/// `pre_start`, so a restart starts from a clean slate.
struct Counter;

enum CounterMsg {
    /// Data-path message: carries a credit from the counter's BoundedRef.
    Add(Permit, u64),
    /// Control message: read the total.
    Get(RpcReplyPort<u64>),
    /// Simulate a bug.
    Crash,
}

// ractor's `cluster` feature is on in this workspace, so every message type
// needs an explicit (local-only) Message impl.
impl ractor::Message for CounterMsg {}

struct CounterArgs {
    start_at: u64,
}

struct CounterState {
    total: u64,
}

#[ractor::async_trait]
impl Actor for Counter {
    type Msg = CounterMsg;
    type State = CounterState;
    type Arguments = CounterArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<CounterMsg>,
        args: CounterArgs,
    ) -> Result<CounterState, ActorProcessingErr> {
        Ok(CounterState {
            total: args.start_at,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<CounterMsg>,
        message: CounterMsg,
        state: &mut CounterState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            // The permit is dropped when this arm ends: that returns the credit.
            CounterMsg::Add(_permit, n) => state.total += n,
            CounterMsg::Get(reply) => {
                let _ = reply.send(state.total);
            }
            CounterMsg::Crash => return Err("counter hit a bug".into()),
        }
        Ok(())
    }
}

fn counter(name: &str) -> ChildSpec {
    // A fresh handler and fresh arguments on every (re)start.
    ChildSpec::worker(name, || Counter, || CounterArgs { start_at: 0 })
}

async fn total(counter: &ActorRef<CounterMsg>) -> u64 {
    counter
        .call(CounterMsg::Get, Some(Duration::from_secs(1)))
        .await
        .expect("counter is running")
        .expect("counter answers in time")
}

#[tokio::main]
async fn main() -> Result<(), SupervisionError> {
    let counters = SupervisorArgs::new("counters", Strategy::OneForOne)
        .intensity(Intensity {
            restarts_max: 3,
            period_ms: 5_000,
        })
        .backoff(Backoff {
            delay_initial_ms: 10,
            delay_max_ms: 500,
            multiplier: 2,
            reset_after_ms: 10_000,
        })
        .child(counter("counter/a"))
        .child(counter("counter/b"));
    let root = SupervisorArgs::new("app", Strategy::OneForOne)
        .child(ChildSpec::supervisor(counters))
        .child(counter("reporter").restart(Restart::Transient));
    let (app, _join) = SupervisorRef::spawn(root).await?;

    let counters = SupervisorRef::from_actor(
        app.child("counters")
            .await?
            .expect("counters is running")
            .into(),
    );
    let a: ActorRef<CounterMsg> = counters.child("counter/a").await?.expect("a runs").into();
    let a = BoundedRef::new(a, 16);
    for _ in 0..10 {
        a.send(|permit| CounterMsg::Add(permit, 1)).await?;
    }
    println!(
        "counter/a total before the crash: {}\n",
        total(a.actor()).await
    );

    println!(
        "{}",
        render_tree(&app.snapshot().await?, RenderOptions::FULL)
    );

    a.actor()
        .send_message(CounterMsg::Crash)
        .expect("a is running");
    // Wait (bounded) for the supervisor to restart it after its backoff.
    for _ in 0..200 {
        let snap = app.snapshot().await?;
        if snap
            .descendant(&["counters", "counter/a"])
            .is_some_and(|c| c.restarts == 1 && c.actor_id.is_some())
        {
            println!("after the crash (state was rebuilt in pre_start):");
            println!("{}", render_tree(&snap, RenderOptions::FULL));
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let fresh: ActorRef<CounterMsg> = counters
        .child("counter/a")
        .await?
        .expect("restarted")
        .into();
    println!(
        "counter/a total after the restart: {}\n",
        total(&fresh).await
    );

    counters
        .start_child(counter("counter/c").restart(Restart::Temporary))
        .await?;
    println!("with a dynamic child:");
    println!(
        "{}",
        render_tree(&app.snapshot().await?, RenderOptions::STABLE)
    );
    counters.terminate_child("counter/c").await?;

    // Ordered shutdown: reporter, then counters (which stops b, then a).
    app.stop(10_000).await?;
    println!("stopped: reporter first, then counters (b, then a)");
    Ok(())
}
