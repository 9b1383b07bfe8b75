//! Behaviour of the supervisor: strategies, restart types, intensity, backoff,
//! dynamic children, shutdown, snapshots. One behaviour per test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use malachi_supervision::{
    Backoff, ChildKind, ChildSpec, ChildStatus, Intensity, Restart, Strategy, SupervisionError,
    SupervisorArgs, SupervisorRef, SupervisorSnapshot,
};
use tokio::time::Instant;

fn ids(snap: &SupervisorSnapshot) -> Vec<Option<String>> {
    snap.children.iter().map(|c| c.actor_id.clone()).collect()
}

fn restarts(snap: &SupervisorSnapshot) -> Vec<u32> {
    snap.children.iter().map(|c| c.restarts).collect()
}

async fn spawn_abc(probes: &mut Probes, strategy: Strategy, names: &[&str]) -> SupervisorRef {
    let mut args = fast_args("sup", strategy);
    for name in names {
        args = args.child(probes.spec(name));
    }
    let (sup, _join) = SupervisorRef::spawn(args).await.unwrap();
    let expected: Vec<_> = names.iter().map(|n| started(n)).collect();
    assert_eq!(
        probes.take(names.len()).await,
        expected,
        "children start in order"
    );
    sup
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_for_one_restarts_only_the_failed_child() {
    let mut probes = Probes::new();
    let sup = spawn_abc(&mut probes, Strategy::OneForOne, &["a", "b", "c"]).await;
    let before = sup.snapshot().await.unwrap();

    poke(&sup, "b", ProbeMsg::Crash).await;

    assert_eq!(probes.take(1).await, vec![started("b")]);
    assert_eq!(probes.drain_for(50).await, vec![], "no sibling was touched");
    let after = wait_for_snapshot(&sup, |s| restarts(s) == vec![0, 1, 0]).await;
    assert_eq!(after.children[0].actor_id, before.children[0].actor_id);
    assert_ne!(after.children[1].actor_id, before.children[1].actor_id);
    assert_eq!(after.children[2].actor_id, before.children[2].actor_id);
    sup.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_for_all_stops_siblings_in_reverse_and_restarts_all_in_order() {
    let mut probes = Probes::new();
    let sup = spawn_abc(&mut probes, Strategy::OneForAll, &["a", "b", "c"]).await;
    let before = sup.snapshot().await.unwrap();

    poke(&sup, "b", ProbeMsg::Crash).await;

    assert_eq!(
        probes.take(5).await,
        vec![
            stopped("c"),
            stopped("a"),
            started("a"),
            started("b"),
            started("c")
        ]
    );
    assert_eq!(probes.drain_for(50).await, vec![]);
    let after = wait_for_snapshot(&sup, |s| restarts(s) == vec![1, 1, 1]).await;
    for (old, new) in ids(&before).iter().zip(ids(&after).iter()) {
        assert_ne!(old, new, "every child is a new instance");
    }
    sup.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_for_one_restarts_the_failed_child_and_those_started_after_it() {
    let mut probes = Probes::new();
    let sup = spawn_abc(&mut probes, Strategy::RestForOne, &["a", "b", "c", "d"]).await;
    let before = sup.snapshot().await.unwrap();

    poke(&sup, "b", ProbeMsg::Crash).await;

    assert_eq!(
        probes.take(5).await,
        vec![
            stopped("d"),
            stopped("c"),
            started("b"),
            started("c"),
            started("d")
        ]
    );
    assert_eq!(probes.drain_for(50).await, vec![], "a was not touched");
    let after = wait_for_snapshot(&sup, |s| restarts(s) == vec![0, 1, 1, 1]).await;
    assert_eq!(after.children[0].actor_id, before.children[0].actor_id);
    sup.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intensity_exceeded_stops_children_and_escalates_to_the_parent() {
    let mut probes = Probes::new();
    let args = fast_args("sup", Strategy::OneForOne)
        .intensity(Intensity {
            restarts_max: 2,
            period_ms: 10_000,
        })
        .child(probes.spec("a"))
        .child(probes.spec("b"));
    let (sup, mut seen, _watcher) = watched(args).await;
    let sup = sup.unwrap();
    assert_eq!(probes.take(2).await, vec![started("a"), started("b")]);

    for _ in 0..2 {
        poke(&sup, "b", ProbeMsg::Crash).await;
        assert_eq!(probes.take(1).await, vec![started("b")]);
    }
    poke(&sup, "b", ProbeMsg::Crash).await;

    assert_eq!(probes.take(1).await, vec![stopped("a")], "a is shut down");
    let parent_saw = tokio::time::timeout(Duration::from_secs(5), seen.recv())
        .await
        .unwrap()
        .unwrap();
    match parent_saw {
        Seen::Failed(reason) => assert!(
            reason.contains("exceeded its restart intensity"),
            "unexpected reason {reason}"
        ),
        other => panic!("the parent must see a failure, saw {other:?}"),
    }
    assert!(matches!(
        sup.snapshot().await,
        Err(SupervisionError::NotRunning)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_older_than_the_period_do_not_count_towards_intensity() {
    let mut probes = Probes::new();
    let args = fast_args("sup", Strategy::OneForOne)
        .intensity(Intensity {
            restarts_max: 1,
            period_ms: 100,
        })
        .child(probes.spec("a"));
    let (sup, _join) = SupervisorRef::spawn(args).await.unwrap();
    assert_eq!(probes.take(1).await, vec![started("a")]);

    for _ in 0..3 {
        poke(&sup, "a", ProbeMsg::Crash).await;
        assert_eq!(probes.take(1).await, vec![started("a")]);
        // Fault timing, not synchronisation: the restart ages past the
        // 100 ms period before the next crash.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let snap = sup.snapshot().await.unwrap();
    assert_eq!(snap.children[0].restarts, 3);
    sup.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_child_that_exits_normally_is_not_restarted() {
    let mut probes = Probes::new();
    let args = fast_args("sup", Strategy::OneForOne)
        .child(probes.spec_with("t", Restart::Transient))
        .child(probes.spec("p"));
    let (sup, _join) = SupervisorRef::spawn(args).await.unwrap();
    assert_eq!(probes.take(2).await, vec![started("t"), started("p")]);

    poke(&sup, "t", ProbeMsg::Exit).await;

    assert_eq!(probes.take(1).await, vec![stopped("t")]);
    let snap = wait_for_snapshot(&sup, |s| s.children[0].status == ChildStatus::Stopped).await;
    assert_eq!(snap.children[0].restarts, 0);
    assert_eq!(probes.drain_for(100).await, vec![], "no restart happened");
    sup.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_child_that_crashes_is_restarted() {
    let mut probes = Probes::new();
    let args =
        fast_args("sup", Strategy::OneForOne).child(probes.spec_with("t", Restart::Transient));
    let (sup, _join) = SupervisorRef::spawn(args).await.unwrap();
    assert_eq!(probes.take(1).await, vec![started("t")]);

    poke(&sup, "t", ProbeMsg::Crash).await;

    assert_eq!(probes.take(1).await, vec![started("t")]);
    let snap = wait_for_snapshot(&sup, |s| s.children[0].restarts == 1).await;
    assert_eq!(snap.children[0].status, ChildStatus::Running);
    sup.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temporary_child_is_never_restarted_even_after_a_crash() {
    let mut probes = Probes::new();
    let args = fast_args("sup", Strategy::OneForOne)
        .child(probes.spec_with("tmp", Restart::Temporary))
        .child(probes.spec("p"));
    let (sup, _join) = SupervisorRef::spawn(args).await.unwrap();
    assert_eq!(probes.take(2).await, vec![started("tmp"), started("p")]);

    poke(&sup, "tmp", ProbeMsg::Crash).await;

    let snap = wait_for_snapshot(&sup, |s| s.child("tmp").is_none()).await;
    assert_eq!(snap.children.len(), 1);
    assert_eq!(probes.drain_for(100).await, vec![], "no restart happened");
    sup.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_inside_a_handler_is_restarted() {
    let mut probes = Probes::new();
    let args = fast_args("sup", Strategy::OneForOne).child(probes.spec("a"));
    let (sup, _join) = SupervisorRef::spawn(args).await.unwrap();
    assert_eq!(probes.take(1).await, vec![started("a")]);

    poke(&sup, "a", ProbeMsg::Panic).await;

    assert_eq!(probes.take(1).await, vec![started("a")]);
    let snap = wait_for_snapshot(&sup, |s| s.children[0].restarts == 1).await;
    let reason = snap.children[0].last_exit_reason.clone().unwrap();
    assert!(reason.contains("kaboom"), "reason was {reason}");
    sup.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_children_start_and_terminate_at_run_time() {
    let mut probes = Probes::new();
    let args = fast_args("sup", Strategy::OneForOne).child(probes.spec("static"));
    let (sup, _join) = SupervisorRef::spawn(args).await.unwrap();
    assert_eq!(probes.take(1).await, vec![started("static")]);

    let cell = sup.start_child(probes.spec("conn-1")).await.unwrap();
    assert_eq!(probes.take(1).await, vec![started("conn-1")]);
    let snap = sup.snapshot().await.unwrap();
    assert_eq!(
        snap.child("conn-1").unwrap().actor_id,
        Some(cell.get_id().to_string())
    );
    assert_eq!(
        sup.start_child(probes.spec("conn-1")).await.unwrap_err(),
        SupervisionError::DuplicateChild {
            name: "conn-1".to_string()
        }
    );

    sup.terminate_child("conn-1").await.unwrap();

    assert_eq!(probes.take(1).await, vec![stopped("conn-1")]);
    assert!(sup.snapshot().await.unwrap().child("conn-1").is_none());
    assert_eq!(
        probes.drain_for(100).await,
        vec![],
        "a terminated child is not restarted"
    );
    assert_eq!(
        sup.terminate_child("conn-1").await.unwrap_err(),
        SupervisionError::NoSuchChild {
            name: "conn-1".to_string()
        }
    );
    sup.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_child_whose_start_fails_is_reported_and_not_added() {
    let mut probes = Probes::new();
    let (sup, _join) = SupervisorRef::spawn(fast_args("sup", Strategy::OneForOne))
        .await
        .unwrap();
    probes.fail_starts("seg", 1);

    let err = sup.start_child(probes.spec("seg")).await.unwrap_err();

    assert!(matches!(err, SupervisionError::StartFailed { ref name, .. } if name == "seg"));
    assert_eq!(probes.take(1).await, vec![start_failed("seg")]);
    assert!(sup.snapshot().await.unwrap().children.is_empty());
    sup.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_children_in_reverse_start_order() {
    let mut probes = Probes::new();
    let sup = spawn_abc(&mut probes, Strategy::OneForOne, &["a", "b", "c"]).await;
    sup.start_child(probes.spec("d")).await.unwrap();
    assert_eq!(probes.take(1).await, vec![started("d")]);

    sup.stop(5_000).await.unwrap();

    assert_eq!(
        probes.take(4).await,
        vec![stopped("d"), stopped("c"), stopped("b"), stopped("a")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_kills_a_child_that_overruns_its_timeout() {
    let mut probes = Probes::new();
    probes.slow_stop("slow");
    let args = fast_args("sup", Strategy::OneForOne)
        .child(probes.spec("slow").shutdown_timeout_ms(50))
        .child(probes.spec("fast"));
    let (sup, _join) = SupervisorRef::spawn(args).await.unwrap();
    assert_eq!(probes.take(2).await, vec![started("slow"), started("fast")]);

    let t0 = Instant::now();
    sup.stop(5_000).await.unwrap();

    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "the slow child was killed, not awaited"
    );
    // The killed child never finished its post_stop, so only "fast" reports.
    assert_eq!(probes.take(1).await, vec![stopped("fast")]);
    assert_eq!(probes.drain_for(100).await, vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_pre_start_backs_off_and_escalates() {
    let mut probes = Probes::new();
    probes.fail_starts("bad", u32::MAX);
    let args = SupervisorArgs::new("sup", Strategy::OneForOne)
        .intensity(Intensity {
            restarts_max: 3,
            period_ms: 10_000,
        })
        .backoff(Backoff {
            delay_initial_ms: 20,
            delay_max_ms: 60,
            multiplier: 2,
            reset_after_ms: 10_000,
        })
        .child(probes.spec("bad"));

    let (sup, mut seen, _watcher) = watched(args).await;

    assert!(
        sup.is_ok(),
        "a failing child start is not a supervisor crash"
    );
    let mut attempts = Vec::new();
    for _ in 0..4 {
        let (at, event) = probes.next().await;
        assert_eq!(event, start_failed("bad"));
        attempts.push(at);
    }
    let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1] - w[0]).collect();
    // Delays 20, 40, then capped at 60 ms; a scheduler can only add to them.
    for (gap, floor_ms) in gaps.iter().zip([20u64, 40, 60]) {
        assert!(
            *gap >= Duration::from_millis(floor_ms),
            "gap {gap:?} shorter than backoff {floor_ms} ms (all gaps {gaps:?})"
        );
    }
    let parent_saw = tokio::time::timeout(Duration::from_secs(5), seen.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&parent_saw, Seen::Failed(r) if r.contains("restart intensity")),
        "parent saw {parent_saw:?}"
    );
    assert_eq!(
        probes.drain_for(100).await,
        vec![],
        "no attempt after escalation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_pre_start_is_retried_until_it_succeeds() {
    let mut probes = Probes::new();
    probes.fail_starts("flaky", 2);
    let args = fast_args("sup", Strategy::OneForOne).child(probes.spec("flaky"));

    let (sup, _join) = SupervisorRef::spawn(args).await.unwrap();

    assert_eq!(
        probes.take(3).await,
        vec![
            start_failed("flaky"),
            start_failed("flaky"),
            started("flaky")
        ]
    );
    let snap = wait_for_snapshot(&sup, |s| s.children[0].status == ChildStatus::Running).await;
    assert_eq!(snap.children[0].restarts, 2);
    assert!(
        snap.children[0]
            .last_exit_reason
            .as_deref()
            .unwrap()
            .contains("refuses to start")
    );
    sup.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_for_one_starts_independent_children_while_one_waits_for_its_backoff() {
    let mut probes = Probes::new();
    probes.fail_starts("a", 1);
    let args = fast_args("sup", Strategy::OneForOne)
        .backoff(Backoff {
            delay_initial_ms: 200,
            delay_max_ms: 200,
            multiplier: 1,
            reset_after_ms: 10_000,
        })
        .child(probes.spec("a"))
        .child(probes.spec("b"));

    let (sup, _join) = SupervisorRef::spawn(args).await.unwrap();

    assert_eq!(
        probes.take(3).await,
        vec![start_failed("a"), started("b"), started("a")],
        "b does not wait for a's backoff"
    );
    sup.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_for_one_does_not_start_later_children_while_an_earlier_one_cannot_start() {
    let mut probes = Probes::new();
    probes.fail_starts("db", 2);
    let args = fast_args("sup", Strategy::RestForOne)
        .child(probes.spec("db"))
        .child(probes.spec("api"));

    let (sup, _join) = SupervisorRef::spawn(args).await.unwrap();

    assert_eq!(
        probes.take(4).await,
        vec![
            start_failed("db"),
            start_failed("db"),
            started("db"),
            started("api")
        ]
    );
    sup.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_reflects_restarts_and_nested_supervisors() {
    let mut probes = Probes::new();
    let inner = fast_args("inner", Strategy::RestForOne)
        .child(probes.spec("x"))
        .child(probes.spec("y"));
    let args = fast_args("root", Strategy::OneForOne)
        .child(probes.spec("a"))
        .child(ChildSpec::supervisor(inner));
    let (root, _join) = SupervisorRef::spawn(args).await.unwrap();
    assert_eq!(
        probes.take(3).await,
        vec![started("a"), started("x"), started("y")]
    );

    let inner_cell = root.child("inner").await.unwrap().unwrap();
    let inner_ref = SupervisorRef::from_actor(inner_cell.into());
    poke(&inner_ref, "y", ProbeMsg::Crash).await;
    assert_eq!(probes.take(1).await, vec![started("y")]);

    let snap = wait_for_snapshot(&root, |s| {
        s.descendant(&["inner", "y"])
            .is_some_and(|y| y.restarts == 1)
    })
    .await;
    let inner_snap = snap.child("inner").unwrap();
    assert_eq!(inner_snap.kind, ChildKind::Supervisor);
    assert_eq!(inner_snap.status, ChildStatus::Running);
    assert_eq!(inner_snap.restarts, 0);
    let nested = inner_snap.supervisor.as_ref().unwrap();
    assert_eq!(nested.strategy, Strategy::RestForOne);
    let x = nested.child("x").unwrap();
    assert_eq!(x.restarts, 0);
    let y = nested.child("y").unwrap();
    assert!(
        x.uptime_ms >= y.uptime_ms,
        "the restarted instance is younger than its untouched sibling"
    );
    assert_eq!(y.last_exit_reason.as_deref(), Some("crash: boom"));
    assert!(y.actor_id.is_some());
    assert_eq!(snap.child("a").unwrap().kind, ChildKind::Worker);

    let json = serde_json::to_string(&snap).unwrap();
    let back: SupervisorSnapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back, snap, "snapshots survive the wire");
    root.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_supervisor_escalation_counts_as_an_abnormal_exit_for_its_parent() {
    let mut probes = Probes::new();
    let inner = fast_args("inner", Strategy::OneForOne)
        .intensity(Intensity {
            restarts_max: 0,
            period_ms: 10_000,
        })
        .child(probes.spec("x"));
    // Transient: the parent restarts it only if its exit is abnormal.
    let args = fast_args("root", Strategy::OneForOne)
        .child(ChildSpec::supervisor(inner).restart(Restart::Transient));
    let (root, _join) = SupervisorRef::spawn(args).await.unwrap();
    assert_eq!(probes.take(1).await, vec![started("x")]);

    let inner_ref = SupervisorRef::from_actor(root.child("inner").await.unwrap().unwrap().into());
    poke(&inner_ref, "x", ProbeMsg::Crash).await;

    assert_eq!(
        probes.take(1).await,
        vec![started("x")],
        "the parent restarted the subtree"
    );
    let snap = wait_for_snapshot(&root, |s| {
        s.child("inner")
            .is_some_and(|c| c.restarts == 1 && c.status == ChildStatus::Running)
    })
    .await;
    let reason = snap
        .child("inner")
        .unwrap()
        .last_exit_reason
        .clone()
        .unwrap();
    assert!(reason.contains("restart intensity"), "reason was {reason}");
    root.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_shows_a_busy_nested_supervisor_as_unresponsive() {
    let mut probes = Probes::new();
    probes.slow_stop("slow");
    // one_for_all: a crash of "trigger" makes "inner" stop "slow", which takes
    // 10 s, so "inner" is busy and cannot answer a snapshot.
    let inner = fast_args("inner", Strategy::OneForAll)
        .child(probes.spec("slow").shutdown_timeout_ms(20_000))
        .child(probes.spec("trigger"));
    let args = fast_args("root", Strategy::OneForOne)
        .child(probes.spec("a"))
        .child(ChildSpec::supervisor(inner));
    let (root, _join) = SupervisorRef::spawn(args).await.unwrap();
    assert_eq!(
        probes.take(3).await,
        vec![started("a"), started("slow"), started("trigger")]
    );
    let inner_ref = SupervisorRef::from_actor(root.child("inner").await.unwrap().unwrap().into());

    poke(&inner_ref, "trigger", ProbeMsg::Crash).await;
    wait_for_snapshot(&root, |s| {
        s.child("inner")
            .is_some_and(|c| c.status == ChildStatus::Unresponsive)
    })
    .await;
    let t0 = Instant::now();
    let snap = root.snapshot().await.unwrap();

    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "the snapshot did not wait for the busy subtree"
    );
    assert_eq!(
        snap.child("inner").unwrap().status,
        ChildStatus::Unresponsive
    );
    assert_eq!(snap.child("a").unwrap().status, ChildStatus::Running);
    root.cell().kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_trees_with_identical_names_coexist_in_one_process() {
    let mut probes_one = Probes::new();
    let mut probes_two = Probes::new();
    let tree = |probes: &Probes| {
        fast_args("broker", Strategy::OneForOne)
            .child(probes.spec("storage"))
            .child(ChildSpec::supervisor(
                fast_args("maintenance", Strategy::OneForOne).child(probes.spec("scrubber")),
            ))
    };
    let (one, _j1) = SupervisorRef::spawn(tree(&probes_one)).await.unwrap();
    let (two, _j2) = SupervisorRef::spawn(tree(&probes_two)).await.unwrap();
    assert_eq!(
        probes_one.take(2).await,
        vec![started("storage"), started("scrubber")]
    );
    assert_eq!(
        probes_two.take(2).await,
        vec![started("storage"), started("scrubber")]
    );

    poke(&one, "storage", ProbeMsg::Crash).await;

    assert_eq!(probes_one.take(1).await, vec![started("storage")]);
    assert_eq!(
        probes_two.drain_for(100).await,
        vec![],
        "the other tree is unaffected"
    );
    let s1 = wait_for_snapshot(&one, |s| s.children[0].restarts == 1).await;
    let s2 = two.snapshot().await.unwrap();
    assert_eq!(s2.children[0].restarts, 0);
    assert_ne!(s1.actor_id, s2.actor_id);
    assert_ne!(s1.children[0].actor_id, s2.children[0].actor_id);
    one.stop(5_000).await.unwrap();
    two.stop(5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_args_fail_the_spawn_with_a_typed_error() {
    let probes = Probes::new();
    let args = fast_args("sup", Strategy::OneForOne)
        .child(probes.spec("same"))
        .child(probes.spec("same"));

    let err = SupervisorRef::spawn(args).await.unwrap_err();

    assert!(
        matches!(&err, SupervisionError::SpawnFailed { reason, .. } if reason.contains("child same already exists")),
        "got {err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_supervisor_that_cannot_start_is_a_failed_start_for_its_parent() {
    let mut probes = Probes::new();
    probes.fail_starts("x", u32::MAX);
    // The inner supervisor gives up on its first failed child start, so its
    // own pre_start fails: a spawn error for the root, not an event.
    let inner = fast_args("inner", Strategy::OneForOne)
        .intensity(Intensity {
            restarts_max: 0,
            period_ms: 10_000,
        })
        .child(probes.spec("x"));
    let root = fast_args("root", Strategy::OneForOne)
        .intensity(Intensity {
            restarts_max: 2,
            period_ms: 10_000,
        })
        .child(ChildSpec::supervisor(inner));

    let (sup, mut seen, _watcher) = watched(root).await;

    assert!(sup.is_ok(), "the root starts even though its child cannot");
    // One initial attempt and two restarts fit the root's budget; the third
    // failure exceeds it.
    assert_eq!(
        probes.take(3).await,
        vec![start_failed("x"), start_failed("x"), start_failed("x")]
    );
    let parent_saw = tokio::time::timeout(Duration::from_secs(5), seen.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&parent_saw, Seen::Failed(r) if r.contains("supervisor root exceeded")),
        "parent saw {parent_saw:?}"
    );
    assert_eq!(probes.drain_for(100).await, vec![]);
}
