//! `membership/swim`: the actor that runs this broker's SWIM runtime.
//!
//! Each start is a new incarnation of the broker's identity: one more than
//! the last one recorded in `data_dir/membership.incarnation`, and at least
//! the wall clock in milliseconds, so a restarted broker (same node id, same
//! data dir, or even a wiped one) always wins over the ghost of its previous
//! run in every other member's table. The runtime task reports its end to
//! the actor; an end that nobody asked for fails the actor, and the
//! supervisor restarts it (as a new incarnation).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use malachi_membership::{RuntimeArgs, runtime};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{info, warn};

use super::node::Fabric;
use crate::common::config::BrokerConfig;

/// How long a start waits for the runtime's first view before it warns.
/// The view is local and comes in milliseconds; a second was too short on
/// a loaded machine (a plain start warned in `tests/broker_process.rs`
/// while three builds shared two cores), and only a stuck runtime is worth
/// a warning.
const FIRST_VIEW_WAIT_MS: u64 = 5_000;
/// How long resolving one seed's host name may take.
const SEED_RESOLVE_TIMEOUT_MS: u64 = 2_000;

pub(crate) struct SwimActor;

/// What each start of `swim` needs: the fabric (socket, identity,
/// membership handle) and the configuration (seeds, SWIM settings, where
/// the incarnation is recorded).
#[derive(Debug, Clone)]
pub(crate) struct SwimArgs {
    pub fabric: Arc<Fabric>,
    pub config: BrokerConfig,
}

#[derive(Debug)]
pub(crate) enum SwimMsg {
    /// The runtime task ended, with its error if it failed.
    Exited(Option<String>),
}
impl ractor::Message for SwimMsg {}

pub(crate) struct SwimState {
    fabric: Arc<Fabric>,
}

#[ractor::async_trait]
impl Actor for SwimActor {
    type Msg = SwimMsg;
    type State = SwimState;
    type Arguments = SwimArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SwimMsg>,
        SwimArgs { fabric, config }: SwimArgs,
    ) -> Result<SwimState, ActorProcessingErr> {
        // A failed predecessor's task may still hold the socket's attention.
        if let Some(stale) = fabric.swim_task.lock().take() {
            stale.abort();
        }
        let path = config.incarnation_path();
        let incarnation = tokio::task::block_in_place(|| next_incarnation(&path))?;
        let mut identity = fabric.identity.clone();
        identity.incarnation = incarnation;
        let seeds = resolve_seeds(&config.seeds).await;
        let socket = fabric.swim_socket.try_clone()?;
        socket.set_nonblocking(true)?;
        let socket = tokio::net::UdpSocket::from_std(socket)?;
        let mut seed_bytes = [0u8; 8];
        getrandom::fill(&mut seed_bytes).map_err(|e| format!("no os randomness: {e}"))?;
        let args = RuntimeArgs {
            identity,
            settings: config.membership.swim(),
            seeds,
            rng_seed: u64::from_le_bytes(seed_bytes),
            seal: config.membership.swim_seal(),
        };
        info!(incarnation, seeds = args.seeds.len(), "swim starting");
        let membership = fabric.membership.clone();
        let task = tokio::spawn(async move {
            // A panic ends the runtime as surely as an error: reported the
            // same way, or the actor would stay "running" without SWIM.
            let run = std::panic::AssertUnwindSafe(runtime::run(membership, socket, args));
            let error = match futures::FutureExt::catch_unwind(run).await {
                Ok(result) => result.err().map(|e| e.to_string()),
                Err(panic) => Some(format!(
                    "the swim runtime panicked: {}",
                    crate::common::watched::panic_text(panic.as_ref())
                )),
            };
            let _ = myself.send_message(SwimMsg::Exited(error));
        });
        *fabric.swim_task.lock() = Some(task.abort_handle());
        fabric.swim_running.store(true, Ordering::SeqCst);
        // The broker is ready only once its own view shows this incarnation,
        // so the first `cluster status` never reports a stale one.
        let mut view = fabric.membership.watch();
        let published = view.wait_for(|v| shows_this_run(v, incarnation));
        if tokio::time::timeout(Duration::from_millis(FIRST_VIEW_WAIT_MS), published)
            .await
            .is_err()
        {
            warn!(incarnation, "swim has not published its first view yet");
        }
        Ok(SwimState { fabric })
    }

    async fn handle(
        &self,
        _myself: ActorRef<SwimMsg>,
        message: SwimMsg,
        state: &mut SwimState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SwimMsg::Exited(error) => {
                state.fabric.swim_running.store(false, Ordering::SeqCst);
                if state.fabric.membership.is_leaving() {
                    info!("swim left the cluster");
                    return Ok(());
                }
                Err(error
                    .unwrap_or_else(|| "the swim runtime ended on its own".to_owned())
                    .into())
            }
        }
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<SwimMsg>,
        state: &mut SwimState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(task) = state.fabric.swim_task.lock().take() {
            task.abort();
        }
        state.fabric.swim_running.store(false, Ordering::SeqCst);
        Ok(())
    }
}

/// Resolves `host:port` seeds; one that does not resolve is skipped with a
/// warning (it is retried at the next start).
pub(crate) async fn resolve_seeds(seeds: &[String]) -> Vec<std::net::SocketAddr> {
    let mut out = Vec::new();
    for seed in seeds {
        let lookup = tokio::net::lookup_host(seed.as_str());
        match tokio::time::timeout(Duration::from_millis(SEED_RESOLVE_TIMEOUT_MS), lookup).await {
            Ok(Ok(addrs)) => out.extend(addrs.take(1)),
            Ok(Err(error)) => warn!(seed, %error, "seed does not resolve; skipped"),
            Err(_) => warn!(seed, "seed resolution timed out; skipped"),
        }
    }
    out
}

/// The incarnation of this start, recorded durably before it is used.
pub(crate) fn next_incarnation(path: &Path) -> std::io::Result<u64> {
    let stored = match std::fs::read_to_string(path) {
        Ok(text) => text.trim().parse::<u64>().unwrap_or(0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e),
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let next = stored.saturating_add(1).max(now_ms);
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&tmp)?;
        writeln!(file, "{next}")?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    Ok(next)
}

/// Whether `view` is this run's: its incarnation, or a later one the
/// runtime moved to already to gossip new attributes (the load; a start
/// that waited for the exact incarnation missed it when the load changed
/// first, and warned after 5 s).
fn shows_this_run(view: &malachi_membership::MembershipView, incarnation: u64) -> bool {
    view.local.incarnation >= incarnation
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_already_past_this_runs_incarnation_is_this_runs() {
        let identity = malachi_membership::NodeIdentity::seed("127.0.0.1:1".parse().unwrap());
        let mut core = malachi_membership::MembershipCore::new(
            malachi_membership::NodeIdentity {
                node_id: 1,
                incarnation: 7,
                ..identity
            },
            &malachi_membership::SwimSettings::default(),
            1,
        )
        .unwrap();
        assert!(shows_this_run(core.view(), 7));
        core.set_attributes([("load".to_owned(), "1".to_owned())].into())
            .unwrap();
        assert!(core.view().local.incarnation > 7, "attributes renew it");
        assert!(shows_this_run(core.view(), 7));
        assert!(!shows_this_run(
            core.view(),
            core.view().local.incarnation + 1
        ));
    }

    #[test]
    fn every_start_gets_a_higher_incarnation_even_with_a_clock_behind_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("membership.incarnation");
        let first = next_incarnation(&path).unwrap();
        let second = next_incarnation(&path).unwrap();
        assert!(second > first);
        // A record from the future (a clock that went back) still grows.
        std::fs::write(&path, format!("{}\n", u64::MAX - 5)).unwrap();
        assert_eq!(next_incarnation(&path).unwrap(), u64::MAX - 4);
    }
}
