//! Coordinator leases: a holder that fails to renew stops (reports `Lost`)
//! before any other holder can acquire. The pure keeper and its renew loop
//! run on simulated clocks against the model; the last test runs the loop
//! against a real vnode group on three brokers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_cluster::group::{TcpTransport, TcpTransportConfig, TransportServer};
use malachi_cluster::model::{Command, MetadataState, ModelError, Outcome};
use malachi_cluster::ring::VnodeId;
use malachi_cluster::vnodes::lease::{
    Clock, LeaseConfig, LeaseConfigError, LeaseGroup, LeaseKeeper, LeaseState, ManualClock,
    SystemClock, VnodeLeaseGroup, spawn_lease_keeper,
};
use malachi_cluster::vnodes::{VnodeHost, VnodeHostConfig};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

const WAIT: Duration = Duration::from_secs(30);

fn config(holder: u64) -> LeaseConfig {
    LeaseConfig {
        holder,
        duration_ms: 1_000,
        safety_margin_ms: 200,
        renew_every_ms: 250,
    }
}

/// The group, as the model: applies what reaches it unless partitioned
/// from `cut` (the holder whose messages are lost).
#[derive(Debug, Default)]
struct ModelGroup {
    state: Mutex<MetadataState>,
    cut: Mutex<Option<u64>>,
}

impl ModelGroup {
    fn apply(&self, cmd: Command) -> Result<Result<Outcome, ModelError>, String> {
        if let Command::AcquireLease { holder, .. } = &cmd
            && *self.cut.lock() == Some(*holder)
        {
            return Err(format!("node {holder} is cut off"));
        }
        Ok(self.state.lock().apply(cmd))
    }
}

#[async_trait::async_trait]
impl LeaseGroup for ModelGroup {
    async fn propose(&self, cmd: Command) -> Result<Result<Outcome, ModelError>, String> {
        self.apply(cmd)
    }
}

#[test]
fn a_lease_config_that_cannot_keep_its_promise_is_refused() {
    let mut c = config(1);
    c.safety_margin_ms = 1_000;
    assert!(matches!(
        LeaseKeeper::new(c),
        Err(LeaseConfigError::Margin { .. })
    ));
    let mut c = config(1);
    c.renew_every_ms = 800;
    assert!(matches!(
        LeaseKeeper::new(c),
        Err(LeaseConfigError::Renewal { .. })
    ));
    assert!(LeaseKeeper::new(config(1)).is_ok());
}

#[test]
fn a_holder_that_fails_to_renew_reports_lost_before_another_can_acquire() {
    // Holder 2's wall clock runs 150 ms ahead of holder 1's: skew below the
    // 200 ms margin. Each proposal takes 30 ms to apply.
    for skew in [0i64, 150, -150] {
        let group = ModelGroup::default();
        let clock1 = ManualClock::new(1_000);
        let clock2 = ManualClock::skewed(1_000, skew);
        let mut one = LeaseKeeper::new(config(1)).unwrap();
        let mut two = LeaseKeeper::new(config(2)).unwrap();
        let step_ms = 10;
        let latency_ms = 30;
        let mut lost_at = None;
        let mut acquired_at = None;
        let mut next_renew = 0;
        for _ in 0..400 {
            let now = clock1.monotonic_ms();
            if now >= next_renew {
                let (cmd, sent) = one.request(&clock1);
                // Holder 1 is cut off after its first renewals.
                if now >= 1_600 {
                    *group.cut.lock() = Some(1);
                }
                clock1.advance_ms(latency_ms);
                clock2.advance_ms(latency_ms);
                if let Ok(answer) = group.apply(cmd) {
                    one.on_answer(&answer, sent);
                }
                next_renew = sent + 250;
            }
            let (cmd, sent) = two.request(&clock2);
            let answer = group.apply(cmd).unwrap();
            two.on_answer(&answer, sent);
            let t = clock1.monotonic_ms();
            if lost_at.is_none() && matches!(one.state(t), LeaseState::Lost { .. }) {
                lost_at = Some(t);
            }
            if acquired_at.is_none() && two.holds(clock2.monotonic_ms()) {
                acquired_at = Some(t);
                // The moment holder 2 may work, holder 1 must not.
                assert!(!one.holds(t), "skew {skew}: both hold at {t}");
            }
            if t < 1_600 {
                assert!(
                    one.holds(t),
                    "skew {skew}: holder 1 lost a renewed lease at {t}"
                );
            }
            clock1.advance_ms(step_ms);
            clock2.advance_ms(step_ms);
        }
        let (lost, acquired) = (lost_at.unwrap(), acquired_at.unwrap());
        assert!(
            lost < acquired,
            "skew {skew}: lost at {lost}, acquired by another at {acquired}"
        );
        let LeaseState::Held { epoch, .. } = two.state(clock2.monotonic_ms()) else {
            panic!()
        };
        assert_eq!(epoch, 2, "a new holder raises the epoch");
    }
}

#[test]
fn a_late_answer_never_extends_a_lease_beyond_its_own_send_time() {
    let group = ModelGroup::default();
    let clock = ManualClock::new(0);
    let mut keeper = LeaseKeeper::new(config(1)).unwrap();
    let (cmd, sent) = keeper.request(&clock);
    // The answer arrives 700 ms later: validity still counts from `sent`.
    clock.advance_ms(700);
    keeper.on_answer(&group.apply(cmd).unwrap(), sent);
    assert_eq!(
        keeper.state(clock.monotonic_ms()),
        LeaseState::Held {
            epoch: 1,
            valid_until_ms: 800
        }
    );
    clock.advance_ms(100);
    assert_eq!(
        keeper.state(clock.monotonic_ms()),
        LeaseState::Lost { epoch: 1 }
    );
    // Released after the work stopped, another may take it at once.
    group.apply(keeper.release().unwrap()).unwrap().unwrap();
    let two = group
        .apply(Command::AcquireLease {
            holder: 2,
            duration_ms: 1_000,
            at_ms: clock.wall_ms(),
        })
        .unwrap();
    assert!(matches!(two, Ok(Outcome::LeaseGranted { .. })), "{two:?}");
}

/// Waits (real time) until `check` holds.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_renew_loop_reports_lost_when_cut_off_before_another_acquires() {
    let group = Arc::new(ModelGroup::default());
    let clock = Arc::new(ManualClock::new(10_000));
    let handle = spawn_lease_keeper(
        LeaseKeeper::new(config(1)).unwrap(),
        group.clone(),
        clock.clone(),
        2,
    );
    let mut states = handle.watch();
    eventually("the first grant", || {
        matches!(*states.borrow(), LeaseState::Held { .. })
    })
    .await;
    // Simulated time moves in 50 ms steps; each step waits until the loop
    // has renewed if a renewal was due, so renewals keep it held.
    for _ in 0..20 {
        clock.advance_ms(50);
        let now = clock.monotonic_ms();
        eventually("a renewal", || match handle.state() {
            LeaseState::Held { valid_until_ms, .. } => valid_until_ms > now + 400,
            _ => false,
        })
        .await;
    }
    // Cut off: renewals fail from now on.
    *group.cut.lock() = Some(1);
    let other = |clock: &ManualClock| {
        group.apply(Command::AcquireLease {
            holder: 2,
            duration_ms: 1_000,
            at_ms: clock.wall_ms(),
        })
    };
    let mut reported_lost = false;
    for _ in 0..60 {
        clock.advance_ms(25);
        if !handle.holds() && !reported_lost {
            // Simulated time stands still while the loop reports it.
            eventually("the loop to report lost", || {
                matches!(*states.borrow_and_update(), LeaseState::Lost { .. })
            })
            .await;
            reported_lost = true;
        }
        let acquired = matches!(other(&clock), Ok(Ok(Outcome::LeaseGranted { .. })));
        if acquired {
            assert!(
                reported_lost,
                "another acquired before the holder reported lost"
            );
            assert!(!handle.holds());
            handle.stop().await;
            return;
        }
    }
    panic!("the lease never passed to another holder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_in_a_vnode_group_is_exclusive_and_passes_on_when_its_holder_stops() {
    let nodes = [1u64, 2, 3];
    let mut listeners = Vec::new();
    for _ in nodes {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut hosts = Vec::new();
    let mut servers = Vec::new();
    let mut dirs = Vec::new();
    for (listener, id) in listeners.into_iter().zip(nodes) {
        let transport = Arc::new(TcpTransport::new(TcpTransportConfig::new(
            id,
            test_cookie(),
        )));
        for (peer, addr) in nodes.iter().zip(&addrs) {
            if *peer != id {
                transport.set_peer(*peer, *addr);
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let mut config = VnodeHostConfig::new(id, nodes.to_vec(), dir.path());
        config.vnode_count = 2;
        config.group.election_timeout_min_ms = 300;
        config.group.election_timeout_max_ms = 600;
        config.group.heartbeat_interval_ms = 60;
        let host = VnodeHost::open(config, transport).await.unwrap();
        servers.push(
            TransportServer::start(listener, host.clone(), server_config(id, 64 * 1024 * 1024))
                .unwrap(),
        );
        hosts.push(host);
        dirs.push(dir);
    }
    let lease = |i: usize| {
        let group = Arc::new(VnodeLeaseGroup {
            host: Arc::clone(&hosts[i]),
            vnode: VnodeId(1),
        });
        let config = LeaseConfig {
            holder: nodes[i],
            duration_ms: 1_500,
            safety_margin_ms: 300,
            renew_every_ms: 200,
        };
        spawn_lease_keeper(
            LeaseKeeper::new(config).unwrap(),
            group,
            Arc::new(SystemClock::new()),
            10,
        )
    };
    let first = lease(0);
    let deadline = Instant::now() + WAIT;
    while !first.holds() {
        assert!(Instant::now() < deadline, "no lease granted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = lease(1);
    // While the first renews, the second never holds.
    for _ in 0..40 {
        assert!(!second.holds(), "two holders at once");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(first.holds());
    // The first stops renewing (a coordinator that stopped or hung): it
    // gives up on its own clock, then the second takes over.
    first.stop().await;
    let deadline = Instant::now() + WAIT;
    while !second.holds() {
        assert!(Instant::now() < deadline, "the lease never passed on");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let LeaseState::Held { epoch, .. } = second.state() else {
        panic!()
    };
    assert_eq!(epoch, 2);
    second.stop().await;
    for server in &servers {
        server.shutdown().await;
    }
    for host in &hosts {
        host.shutdown().await;
    }
}

fn test_cookie() -> malachi_cluster::group::ClusterCookie {
    malachi_cluster::group::ClusterCookie::new("test cookie").unwrap()
}

fn server_config(
    node: u64,
    frame_bytes_max: usize,
) -> malachi_cluster::group::TransportServerConfig {
    let mut config = malachi_cluster::group::TransportServerConfig::new(node, test_cookie());
    config.frame_bytes_max = frame_bytes_max;
    config
}
