//! Test actors and helpers shared by the supervision tests.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use malachi_supervision::{
    Backoff, ChildSpec, Intensity, Restart, SupervisionError, SupervisorArgs, SupervisorRef,
    SupervisorSnapshot,
};
use malachi_testkit::wait::wait_until;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What probes report, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Started(String),
    StartFailed(String),
    Stopped(String),
}

#[derive(Debug)]
pub enum ProbeMsg {
    /// Return an error from the handler.
    Crash,
    /// Panic inside the handler.
    Panic,
    /// Stop normally.
    Exit,
}
impl ractor::Message for ProbeMsg {}

/// A worker that reports its lifecycle and crashes on request.
#[derive(Debug)]
pub struct Probe;

#[derive(Debug)]
pub struct ProbeArgs {
    name: String,
    events: mpsc::UnboundedSender<(Instant, Event)>,
    fail_start: bool,
    stop_delay_ms: u64,
}

#[ractor::async_trait]
impl Actor for Probe {
    type Msg = ProbeMsg;
    type State = ProbeArgs;
    type Arguments = ProbeArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<ProbeMsg>,
        args: ProbeArgs,
    ) -> Result<ProbeArgs, ActorProcessingErr> {
        if args.fail_start {
            let _ = args
                .events
                .send((Instant::now(), Event::StartFailed(args.name.clone())));
            return Err(format!("{} refuses to start", args.name).into());
        }
        let _ = args
            .events
            .send((Instant::now(), Event::Started(args.name.clone())));
        Ok(args)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ProbeMsg>,
        state: &mut ProbeArgs,
    ) -> Result<(), ActorProcessingErr> {
        if state.stop_delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(state.stop_delay_ms)).await;
        }
        let _ = state
            .events
            .send((Instant::now(), Event::Stopped(state.name.clone())));
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ProbeMsg>,
        message: ProbeMsg,
        _state: &mut ProbeArgs,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ProbeMsg::Crash => Err("crash: boom".into()),
            ProbeMsg::Panic => panic!("kaboom"),
            ProbeMsg::Exit => {
                myself.stop(None);
                Ok(())
            }
        }
    }
}

/// Builds probe child specs and collects their events.
pub struct Probes {
    tx: mpsc::UnboundedSender<(Instant, Event)>,
    rx: mpsc::UnboundedReceiver<(Instant, Event)>,
    /// Names whose next starts fail, with how many failures remain (u32::MAX = always).
    failing: Arc<Mutex<std::collections::HashMap<String, u32>>>,
    slow_stop: Arc<Mutex<HashSet<String>>>,
}

pub const EVENT_WAIT_MS: u64 = 5_000;

impl Probes {
    pub fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            tx,
            rx,
            failing: Arc::default(),
            slow_stop: Arc::default(),
        }
    }

    /// A permanent probe worker.
    pub fn spec(&self, name: &str) -> ChildSpec {
        let tx = self.tx.clone();
        let failing = Arc::clone(&self.failing);
        let slow = Arc::clone(&self.slow_stop);
        let owned = name.to_string();
        ChildSpec::worker(
            name,
            || Probe,
            move || {
                let fail_start = {
                    let mut failing = failing.lock().unwrap();
                    match failing.get_mut(&owned) {
                        Some(0) | None => false,
                        Some(n) => {
                            if *n != u32::MAX {
                                *n -= 1;
                            }
                            true
                        }
                    }
                };
                ProbeArgs {
                    name: owned.clone(),
                    events: tx.clone(),
                    fail_start,
                    stop_delay_ms: if slow.lock().unwrap().contains(&owned) {
                        10_000
                    } else {
                        0
                    },
                }
            },
        )
    }

    pub fn spec_with(&self, name: &str, restart: Restart) -> ChildSpec {
        self.spec(name).restart(restart)
    }

    /// Make the next `count` starts of `name` fail in `pre_start` (u32::MAX: all).
    pub fn fail_starts(&self, name: &str, count: u32) {
        self.failing.lock().unwrap().insert(name.to_string(), count);
    }

    /// Make `name` take 10 s to stop.
    pub fn slow_stop(&self, name: &str) {
        self.slow_stop.lock().unwrap().insert(name.to_string());
    }

    /// The next event, failing the test if none arrives in time.
    pub async fn next(&mut self) -> (Instant, Event) {
        tokio::time::timeout(Duration::from_millis(EVENT_WAIT_MS), self.rx.recv())
            .await
            .expect("timed out waiting for a probe event")
            .expect("probe channel closed")
    }

    /// The next `n` events, without timestamps.
    pub async fn take(&mut self, n: usize) -> Vec<Event> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.next().await.1);
        }
        out
    }

    /// Events that arrive within `quiet_ms` (used to show nothing else happened).
    pub async fn drain_for(&mut self, quiet_ms: u64) -> Vec<Event> {
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_millis(quiet_ms);
        while let Ok(Some((_, e))) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            out.push(e);
        }
        out
    }
}

pub fn started(name: &str) -> Event {
    Event::Started(name.to_string())
}
pub fn stopped(name: &str) -> Event {
    Event::Stopped(name.to_string())
}
pub fn start_failed(name: &str) -> Event {
    Event::StartFailed(name.to_string())
}

/// Fast settings so tests run in milliseconds.
pub fn fast_args(name: &str, strategy: malachi_supervision::Strategy) -> SupervisorArgs {
    SupervisorArgs::new(name, strategy)
        .intensity(Intensity {
            restarts_max: 10,
            period_ms: 10_000,
        })
        .backoff(Backoff {
            delay_initial_ms: 1,
            delay_max_ms: 5,
            multiplier: 2,
            reset_after_ms: 10_000,
        })
}

/// Send a message to a probe child looked up by name.
pub async fn poke(sup: &SupervisorRef, child: &str, msg: ProbeMsg) {
    let cell = sup
        .child(child)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("child {child} is not running"));
    cell.send_message(msg).unwrap();
}

/// Poll snapshots until `cond` holds, failing after a bound with the last
/// snapshot.
pub async fn wait_for_snapshot<F>(sup: &SupervisorRef, cond: F) -> SupervisorSnapshot
where
    F: Fn(&SupervisorSnapshot) -> bool,
{
    let deadline = Duration::from_millis(EVENT_WAIT_MS);
    wait_until(
        "the snapshot shows the condition",
        deadline,
        Duration::from_millis(5),
        async || {
            let snap = sup.snapshot().await.unwrap();
            if cond(&snap) { Ok(snap) } else { Err(snap) }
        },
    )
    .await
}

/// An actor that spawns a supervisor linked to itself and reports the
/// supervision events it receives, standing in for a parent supervisor.
#[derive(Debug)]
pub struct Watcher;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Failed(String),
    Terminated(Option<String>),
}

pub struct WatcherArgs {
    pub supervisor: SupervisorArgs,
    pub seen: mpsc::UnboundedSender<Seen>,
    pub spawned: mpsc::UnboundedSender<Result<SupervisorRef, SupervisionError>>,
}

impl ractor::Message for Seen {}

#[ractor::async_trait]
impl Actor for Watcher {
    type Msg = Seen;
    type State = mpsc::UnboundedSender<Seen>;
    type Arguments = WatcherArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Seen>,
        args: WatcherArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let spawned = SupervisorRef::spawn_linked(args.supervisor, myself.get_cell())
            .await
            .map(|(sup, _join)| sup);
        let _ = args.spawned.send(spawned);
        Ok(args.seen)
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Seen>,
        event: SupervisionEvent,
        seen: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(_, err) => {
                let _ = seen.send(Seen::Failed(err.to_string()));
            }
            SupervisionEvent::ActorTerminated(_, _, reason) => {
                let _ = seen.send(Seen::Terminated(reason));
            }
            _ => {}
        }
        Ok(())
    }
}

/// Spawn `args` under a [`Watcher`]; returns the supervisor (or its spawn
/// error), the watcher's events and the watcher itself.
pub async fn watched(
    args: SupervisorArgs,
) -> (
    Result<SupervisorRef, SupervisionError>,
    mpsc::UnboundedReceiver<Seen>,
    ActorCell,
) {
    let (seen_tx, seen_rx) = mpsc::unbounded_channel();
    let (spawned_tx, mut spawned_rx) = mpsc::unbounded_channel();
    let (watcher, _join) = Watcher::spawn(
        None,
        Watcher,
        WatcherArgs {
            supervisor: args,
            seen: seen_tx,
            spawned: spawned_tx,
        },
    )
    .await
    .unwrap();
    let sup = spawned_rx.recv().await.unwrap();
    (sup, seen_rx, watcher.get_cell())
}
