//! The plain-text tree (the future `malachi tree` output), snapshot-tested.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use malachi_supervision::{
    ChildKind, ChildSnapshot, ChildSpec, ChildStatus, RenderOptions, Restart, Strategy,
    SupervisorRef, SupervisorSnapshot, render_tree,
};

fn worker(name: &str, status: ChildStatus, restarts: u32, reason: Option<&str>) -> ChildSnapshot {
    ChildSnapshot {
        name: name.to_string(),
        actor_id: (status == ChildStatus::Running).then(|| format!("0.{}", name.len())),
        kind: ChildKind::Worker,
        restart: Restart::Permanent,
        status,
        restarts,
        last_exit_reason: reason.map(str::to_string),
        uptime_ms: 1_500,
        supervisor: None,
    }
}

fn fixture() -> SupervisorSnapshot {
    let storage = SupervisorSnapshot {
        name: "storage".to_string(),
        actor_id: "0.2".to_string(),
        strategy: Strategy::OneForOne,
        uptime_ms: 9_000,
        children: vec![
            worker(
                "segment/orders/0-63/7",
                ChildStatus::Running,
                1,
                Some("crash: boom"),
            ),
            worker(
                "segment/orders/64-127/3",
                ChildStatus::Restarting,
                2,
                Some("disk full"),
            ),
        ],
    };
    let maintenance = SupervisorSnapshot {
        name: "maintenance".to_string(),
        actor_id: "0.9".to_string(),
        strategy: Strategy::OneForOne,
        uptime_ms: 9_000,
        children: vec![worker("scrubber", ChildStatus::Running, 0, None)],
    };
    let nested = |snap: SupervisorSnapshot| ChildSnapshot {
        name: snap.name.clone(),
        actor_id: Some(snap.actor_id.clone()),
        kind: ChildKind::Supervisor,
        restart: Restart::Permanent,
        status: ChildStatus::Running,
        restarts: 0,
        last_exit_reason: None,
        uptime_ms: snap.uptime_ms,
        supervisor: Some(snap),
    };
    let mut listener = worker("listener", ChildStatus::Running, 0, None);
    listener.restart = Restart::Transient;
    SupervisorSnapshot {
        name: "broker".to_string(),
        actor_id: "0.1".to_string(),
        strategy: Strategy::OneForOne,
        uptime_ms: 10_000,
        children: vec![
            nested(storage),
            ChildSnapshot {
                status: ChildStatus::Unresponsive,
                supervisor: None,
                ..nested(maintenance)
            },
            listener,
        ],
    }
}

#[test]
fn full_rendering_shows_ids_uptimes_and_indented_branches() {
    insta::assert_snapshot!(render_tree(&fixture(), RenderOptions::FULL));
}

#[test]
fn stable_rendering_hides_volatile_fields() {
    insta::assert_snapshot!(render_tree(&fixture(), RenderOptions::STABLE));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_tree_renders_after_a_restart() {
    let mut probes = Probes::new();
    let inner = fast_args("storage", Strategy::OneForOne)
        .child(probes.spec("segment/a/0"))
        .child(probes.spec("segment/a/1"));
    let args = fast_args("broker", Strategy::OneForOne)
        .child(ChildSpec::supervisor(inner))
        .child(probes.spec_with("listener", Restart::Transient));
    let (broker, _join) = SupervisorRef::spawn(args).await.unwrap();
    probes.take(3).await;
    let storage = SupervisorRef::from_actor(broker.child("storage").await.unwrap().unwrap().into());
    poke(&storage, "segment/a/1", ProbeMsg::Crash).await;
    probes.take(1).await;

    let snap = wait_for_snapshot(&broker, |s| {
        s.descendant(&["storage", "segment/a/1"])
            .is_some_and(|c| c.restarts == 1 && c.status == ChildStatus::Running)
    })
    .await;

    insta::assert_snapshot!(render_tree(&snap, RenderOptions::STABLE));
    broker.stop(5_000).await.unwrap();
}
