//! Coordinator leases: a holder that fails to renew stops (reports `Lost`)
//! before any other holder can acquire, whatever the brokers' wall clocks
//! do (ADR 0122). The pure keeper and its renew loop
//! run on simulated clocks against the model; the last test runs the loop
//! against a real vnode group on three brokers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_cluster::group::{TcpTransport, TcpTransportConfig, TransportServer};
use malachi_cluster::vnodes::lease::{
    Clock, LeaseConfig, LeaseConfigError, LeaseGroup, LeaseKeeper, LeaseState, ManualClock,
    SystemClock, VnodeLeaseGroup, spawn_lease_keeper,
};
use malachi_cluster::vnodes::{RouteError, VnodeHost, VnodeHostConfig};
use malachi_core::model::{Command, Lease, MetadataState, ModelError, Outcome};
use malachi_core::ring::VnodeId;
use malachi_testkit::wait::wait_until;
use parking_lot::Mutex;
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

const WAIT: Duration = Duration::from_secs(30);
/// How often a wait checks (real time).
const POLL: Duration = Duration::from_millis(5);

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
    /// Whether `Feature::LeaseReleaseGeneration` is active.
    named_releases: bool,
    /// Whether the grants are hidden from a new keeper (not yet applied on
    /// its broker), so it releases none first.
    hide_grants: bool,
}

impl ModelGroup {
    fn apply(&self, cmd: Command) -> Result<Result<Outcome, ModelError>, RouteError> {
        if let Command::AcquireLeaseWaited { holder, .. } = &cmd
            && *self.cut.lock() == Some(*holder)
        {
            return Err(RouteError::Unavailable {
                vnode: VnodeId(0),
                attempts: 1,
                last: format!("node {holder} is cut off"),
            });
        }
        Ok(self.state.lock().apply(cmd))
    }
}

#[async_trait::async_trait]
impl LeaseGroup for ModelGroup {
    async fn propose(&self, cmd: Command) -> Result<Result<Outcome, ModelError>, RouteError> {
        self.apply(cmd)
    }

    fn release_generation(&self) -> bool {
        self.named_releases
    }

    fn recorded_grant_of(&self, holder: u64) -> Option<Lease> {
        if self.hide_grants {
            return None;
        }
        let lease = self.state.lock().lease()?;
        (lease.holder == holder && !lease.is_released()).then_some(lease)
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
                    deliver(&mut one, &answer, sent, clock1.monotonic_ms());
                }
                next_renew = sent + 250;
            }
            let (cmd, sent) = two.request(&clock2);
            let answer = group.apply(cmd).unwrap();
            deliver(&mut two, &answer, sent, clock2.monotonic_ms());
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
    deliver(
        &mut keeper,
        &group.apply(cmd).unwrap(),
        sent,
        clock.monotonic_ms(),
    );
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
    group
        .apply(keeper.release(false).unwrap())
        .unwrap()
        .unwrap();
    let two = group
        .apply(Command::AcquireLeaseWaited {
            holder: 2,
            duration_ms: 1_000,
            at_ms: clock.wall_ms(),
            waited_for: None,
        })
        .unwrap();
    assert!(matches!(two, Ok(Outcome::LeaseGranted { .. })), "{two:?}");
}

/// Hands `keeper` the group's answer to a request sent at `sent_ms`,
/// received at `received_ms` (both on the keeper's monotonic clock).
fn deliver(
    keeper: &mut LeaseKeeper,
    answer: &Result<Outcome, ModelError>,
    sent_ms: u64,
    received_ms: u64,
) {
    keeper.on_answer(answer, sent_ms, received_ms);
}

/// Which broker's wall clock a scenario steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Holder,
    Acquirer,
}

/// Holder 1 takes the lease and renews it; holder 2 tries to take it all
/// along. At 1.5 s `jump` steps one broker's wall clock; at 3 s holder 1 is
/// cut off. Both brokers' monotonic clocks run at one rate; holder 2's wall
/// clock is `skew_ms` off holder 1's from the start. Asserts at every 10 ms
/// step that at most one keeper holds, and that holder 2 holds at last, no
/// sooner than a full duration after holder 1's last renewal was recorded
/// (it cannot know of it sooner) and not much later.
fn handover(jump: Option<(Side, i64)>, skew_ms: i64) {
    let what = format!("jump {jump:?}, skew {skew_ms} ms");
    let start = 1_000_000u64;
    let group = ModelGroup::default();
    let clock1 = ManualClock::new(start);
    let clock2 = ManualClock::skewed(start, skew_ms);
    let mut one = LeaseKeeper::new(config(1)).unwrap();
    let mut two = LeaseKeeper::new(config(2)).unwrap();
    let (mut next1, mut next2) = (start, start + 500);
    let mut last_renewal = None;
    let mut acquired_at = None;
    while clock1.monotonic_ms() < start + 8_000 {
        let now = clock1.monotonic_ms();
        if now == start + 1_500 {
            match jump {
                Some((Side::Holder, delta)) => clock1.jump_wall_ms(delta),
                Some((Side::Acquirer, delta)) => clock2.jump_wall_ms(delta),
                None => {}
            }
        }
        if now == start + 3_000 {
            *group.cut.lock() = Some(1);
        }
        if now >= next1 {
            let (cmd, sent) = one.request(&clock1);
            if let Ok(answer) = group.apply(cmd) {
                if matches!(answer, Ok(Outcome::LeaseGranted { .. })) {
                    last_renewal = Some(now);
                }
                deliver(&mut one, &answer, sent, clock1.monotonic_ms());
            }
            next1 = sent + 250;
        }
        if now >= next2 {
            let (cmd, sent) = two.request(&clock2);
            let answer = group.apply(cmd).unwrap();
            deliver(&mut two, &answer, sent, clock2.monotonic_ms());
            next2 = sent + 250;
        }
        let (h1, h2) = (one.holds(now), two.holds(clock2.monotonic_ms()));
        assert!(!(h1 && h2), "{what}: both hold at {}", now - start);
        if h2 && acquired_at.is_none() {
            acquired_at = Some(now);
        }
        clock1.advance_ms(10);
        clock2.advance_ms(10);
    }
    let last = last_renewal.unwrap();
    let acquired = acquired_at.unwrap_or_else(|| panic!("{what}: holder 2 never acquired"));
    assert!(
        acquired >= last + 1_000,
        "{what}: acquired at {} only {} ms after the last renewal",
        acquired - start,
        acquired - last
    );
    assert!(
        acquired <= last + 1_000 + 2 * 250 + 20,
        "{what}: acquired at {}, {} ms after the last renewal",
        acquired - start,
        acquired - last
    );
}

#[test]
fn a_holders_wall_clock_jumping_back_never_lets_another_in_early() {
    // The holder's renewals then carry times before the grant they renew.
    handover(Some((Side::Holder, -60_000)), 0);
    handover(Some((Side::Holder, -15_000)), 0);
    handover(Some((Side::Acquirer, -60_000)), 0);
}

#[test]
fn a_wall_clock_jumping_forward_never_lets_another_in_early() {
    // The acquirer's requests then carry times past the holder's expiry.
    handover(Some((Side::Acquirer, 60_000)), 0);
    handover(Some((Side::Acquirer, 15_000)), 0);
    handover(Some((Side::Holder, 60_000)), 0);
}

#[test]
fn another_acquires_a_duration_after_it_saw_the_last_renewal_whatever_the_skew() {
    // Skews far beyond the 200 ms margin, either way, stable all along.
    for skew_ms in [0, 150, -150, 5_000, -5_000, 3_600_000] {
        handover(None, skew_ms);
    }
}

/// One step of the interleavings the property below explores.
#[derive(Debug, Clone)]
enum Step {
    /// Keeper `i` sends its request (if it has none in flight).
    Send(usize),
    /// The group applies keeper `i`'s request in flight.
    Apply(usize),
    /// Keeper `i` receives the group's answer.
    Deliver(usize),
    /// Keeper `i`'s request or answer is lost.
    Lose(usize),
    /// Time passes, at one rate on both brokers.
    Advance(u64),
    /// Broker `i`'s wall clock steps by the given milliseconds.
    Jump(usize, i64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..2usize).prop_map(Step::Send),
        3 => (0..2usize).prop_map(Step::Apply),
        3 => (0..2usize).prop_map(Step::Deliver),
        1 => (0..2usize).prop_map(Step::Lose),
        4 => (1..400u64).prop_map(Step::Advance),
        1 => (0..2usize, -60_000i64..60_000).prop_map(|(i, d)| Step::Jump(i, d)),
    ]
}

/// A request in flight, and then its answer.
#[derive(Debug, Default)]
struct InFlight {
    request: Option<(Command, u64)>,
    answer: Option<(Result<Outcome, ModelError>, u64)>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the order in which two keepers' requests are sent, applied,
    /// answered or lost, and however their wall clocks jump, never do both
    /// hold the lease at once.
    #[test]
    fn never_two_holders_whatever_the_interleaving_and_the_wall_clocks(
        steps in proptest::collection::vec(step(), 1..300),
    ) {
        let mut state = MetadataState::new();
        let clocks = [ManualClock::new(1_000_000), ManualClock::new(1_000_000)];
        let mut keepers = [
            LeaseKeeper::new(config(1)).unwrap(),
            LeaseKeeper::new(config(2)).unwrap(),
        ];
        let mut flights = [InFlight::default(), InFlight::default()];
        for (n, step) in steps.iter().enumerate() {
            match *step {
                Step::Send(i) => {
                    let f = &mut flights[i];
                    if f.request.is_none() && f.answer.is_none() {
                        f.request = Some(keepers[i].request(&clocks[i]));
                    }
                }
                Step::Apply(i) => {
                    if let Some((cmd, sent)) = flights[i].request.take() {
                        flights[i].answer = Some((state.apply(cmd), sent));
                    }
                }
                Step::Deliver(i) => {
                    if let Some((answer, sent)) = flights[i].answer.take() {
                        let now = clocks[i].monotonic_ms();
                        deliver(&mut keepers[i], &answer, sent, now);
                    }
                }
                Step::Lose(i) => {
                    if flights[i].request.take().is_none() {
                        flights[i].answer = None;
                    }
                }
                Step::Advance(ms) => {
                    for clock in &clocks {
                        clock.advance_ms(ms);
                    }
                }
                Step::Jump(i, delta) => clocks[i].jump_wall_ms(delta),
            }
            let now = clocks[0].monotonic_ms();
            prop_assert!(
                !(keepers[0].holds(now) && keepers[1].holds(now)),
                "both hold after step {n} ({step:?})"
            );
        }
    }
}

/// Chaos finding F11: a stopped keeper's release landed after the same
/// holder's next keeper had re-acquired the same epoch, released the new
/// grant, and another broker took the lease at once while the new keeper
/// still counted it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_of_an_earlier_keeper_does_not_release_the_next_keepers_grant() {
    let group = Arc::new(ModelGroup::default());
    let clock = Arc::new(ManualClock::new(10_000));
    let first = spawn_lease_keeper(
        LeaseKeeper::new(config(1)).unwrap(),
        group.clone(),
        clock.clone(),
        2,
    );
    let states = first.watch();
    wait_until("the first keeper's grant", WAIT, POLL, async || {
        matches!(*states.borrow(), LeaseState::Held { .. })
    })
    .await;
    let LeaseState::Held { epoch: old, .. } = first.state() else {
        panic!("the first keeper holds no lease");
    };
    // The first keeper stops; its release is still on its way.
    first.stop().await;
    let late_release = Command::ReleaseLease {
        holder: 1,
        epoch: old,
    };
    let second = spawn_lease_keeper(
        LeaseKeeper::new(config(1)).unwrap(),
        group.clone(),
        clock.clone(),
        2,
    );
    let states = second.watch();
    wait_until("the second keeper's grant", WAIT, POLL, async || {
        matches!(*states.borrow(), LeaseState::Held { .. })
    })
    .await;
    let LeaseState::Held { epoch: new, .. } = second.state() else {
        panic!("the second keeper holds no lease");
    };
    assert!(new > old, "the second keeper's grant reuses epoch {old}");
    // The late release arrives: it names the old grant and changes nothing.
    assert_eq!(group.apply(late_release).unwrap(), Ok(Outcome::Unchanged));
    let lease = group.state.lock().lease().unwrap();
    assert!(!lease.is_released(), "the next keeper's grant was released");
    // So another holder is still refused.
    assert_held_by_one(&group, clock.as_ref());
    second.stop().await;
}

/// Another holder asking now is refused: holder 1 still holds the lease.
fn assert_held_by_one(group: &ModelGroup, clock: &dyn Clock) {
    let other = LeaseKeeper::new(config(2)).unwrap();
    let (cmd, _) = other.request(clock);
    assert!(
        matches!(
            group.apply(cmd).unwrap(),
            Err(ModelError::LeaseHeld { holder: 1, .. })
        ),
        "another holder took a lease the next keeper holds"
    );
}

/// F11, the stricter fix (`Feature::LeaseReleaseGeneration` active): a
/// keeper's release names the generation it was last granted, so once a
/// later keeper of the same holder renewed the grant (same epoch), the late
/// release changes nothing, even without the release-first of the next
/// keeper (a grant not yet applied where that keeper reads).
#[test]
fn a_release_naming_its_generation_does_not_release_a_later_renewal() {
    let group = ModelGroup {
        named_releases: true,
        ..ModelGroup::default()
    };
    let clock = ManualClock::new(0);
    let mut first = LeaseKeeper::new(config(1)).unwrap();
    let (cmd, sent) = first.request(&clock);
    deliver(&mut first, &group.apply(cmd).unwrap(), sent, sent);
    let late = first.release(group.release_generation()).unwrap();
    let Command::ReleaseLeaseGeneration {
        holder: 1,
        epoch,
        generation,
    } = late
    else {
        panic!("the gate is open, yet the release names no generation: {late:?}");
    };
    // The next keeper of holder 1 renews: the same epoch, a new generation.
    let mut second = LeaseKeeper::new(config(1)).unwrap();
    let (cmd, sent) = second.request(&clock);
    deliver(&mut second, &group.apply(cmd).unwrap(), sent, sent);
    let renewed = group.state.lock().lease().unwrap();
    assert_eq!(renewed.epoch, epoch);
    assert!(renewed.generation > generation);
    assert_eq!(group.apply(late).unwrap(), Ok(Outcome::Unchanged));
    assert!(!group.state.lock().lease().unwrap().is_released());
    // The second keeper's own release names the current generation.
    let own = second.release(true).unwrap();
    assert_eq!(group.apply(own).unwrap(), Ok(Outcome::LeaseReleased));
    // With the gate closed, the old form, which every broker decodes.
    assert!(matches!(
        second.release(false),
        Some(Command::ReleaseLease { holder: 1, .. })
    ));
}

/// F11's stricter fix through the renew loops: the next keeper did not see
/// the earlier grant (not yet applied on its broker), so it renewed it,
/// same epoch; the earlier keeper's late release names the generation it
/// was granted and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_named_release_does_not_release_a_grant_the_next_keeper_renewed_unseen() {
    let group = Arc::new(ModelGroup {
        named_releases: true,
        hide_grants: true,
        ..ModelGroup::default()
    });
    let clock = Arc::new(ManualClock::new(10_000));
    let keeper = |group: &Arc<ModelGroup>| {
        spawn_lease_keeper(
            LeaseKeeper::new(config(1)).unwrap(),
            group.clone(),
            clock.clone(),
            2,
        )
    };
    let first = keeper(&group);
    let states = first.watch();
    wait_until("the first keeper's grant", WAIT, POLL, async || {
        matches!(*states.borrow(), LeaseState::Held { .. })
    })
    .await;
    let late_release = first.release(group.release_generation()).unwrap();
    assert!(matches!(
        late_release,
        Command::ReleaseLeaseGeneration { .. }
    ));
    first.stop().await;
    let second = keeper(&group);
    let states = second.watch();
    wait_until("the second keeper's grant", WAIT, POLL, async || {
        matches!(*states.borrow(), LeaseState::Held { .. })
    })
    .await;
    assert_eq!(group.apply(late_release).unwrap(), Ok(Outcome::Unchanged));
    assert!(!group.state.lock().lease().unwrap().is_released());
    assert_held_by_one(&group, clock.as_ref());
    second.stop().await;
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
    wait_until("the first grant", WAIT, POLL, async || {
        matches!(*states.borrow(), LeaseState::Held { .. })
    })
    .await;
    // Simulated time moves in 50 ms steps; each step waits until the loop
    // has renewed if a renewal was due, so renewals keep it held.
    for _ in 0..20 {
        clock.advance_ms(50);
        let now = clock.monotonic_ms();
        wait_until("a renewal", WAIT, POLL, async || match handle.state() {
            LeaseState::Held { valid_until_ms, .. } => valid_until_ms > now + 400,
            _ => false,
        })
        .await;
    }
    // Cut off: renewals fail from now on. Another keeper, driven by hand,
    // tries all along: it must see the lease unrenewed for a whole
    // duration before it may take it.
    *group.cut.lock() = Some(1);
    let mut other = LeaseKeeper::new(config(2)).unwrap();
    let mut reported_lost = false;
    for _ in 0..80 {
        clock.advance_ms(25);
        if !handle.holds() && !reported_lost {
            // Simulated time stands still while the loop reports it.
            wait_until("the loop to report lost", WAIT, POLL, async || {
                matches!(*states.borrow_and_update(), LeaseState::Lost { .. })
            })
            .await;
            reported_lost = true;
        }
        let (cmd, sent) = other.request(clock.as_ref());
        let answer = group.apply(cmd).unwrap();
        deliver(&mut other, &answer, sent, clock.monotonic_ms());
        if other.holds(clock.monotonic_ms()) {
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
    wait_until("a lease is granted", WAIT, POLL, async || first.holds()).await;
    let second = lease(1);
    // While the first renews, the second never holds: an absence, watched
    // for a second (no condition to wait on).
    for _ in 0..40 {
        assert!(!second.holds(), "two holders at once");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(first.holds());
    // The first stops renewing (a coordinator that stopped or hung): it
    // gives up on its own clock, then the second takes over.
    first.stop().await;
    wait_until("the lease passes on", WAIT, POLL, async || second.holds()).await;
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
