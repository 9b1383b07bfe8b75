//! Progressive lockout (ADR 0146): the doubling delay with its cap, the
//! lock after a count and its end, the admin unlock, per (principal,
//! source) keys, a bounded table, all under a supplied clock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_core::auth::lockout::{Admission, Lockout, LockoutKey, LockoutPolicy};
use proptest::prelude::*;

fn key(principal: &str, source: &str) -> LockoutKey {
    LockoutKey {
        principal: principal.into(),
        source: source.into(),
    }
}

fn policy() -> LockoutPolicy {
    LockoutPolicy {
        delay_first_ms: 1_000,
        delay_max_ms: 16_000,
        lock_after_failures: Some(8),
        lock_ms: 600_000,
        forget_after_ms: 900_000,
        entries_max: 4,
    }
}

#[test]
fn the_delay_doubles_up_to_its_cap() {
    let p = policy();
    let delays: Vec<u64> = (1..=7).map(|n| p.delay_ms(n)).collect();
    assert_eq!(delays, [1_000, 2_000, 4_000, 8_000, 16_000, 16_000, 16_000]);
    assert_eq!(p.delay_ms(u32::MAX), 16_000);
    let uncapped = LockoutPolicy {
        delay_max_ms: u64::MAX,
        ..p
    };
    assert_eq!(uncapped.delay_ms(200), u64::MAX);
}

#[test]
fn failures_delay_then_lock_until_the_time_passes() {
    let p = policy();
    let mut lockout = Lockout::default();
    let k = key("alice", "10.0.0.9");
    let mut now = 1_000_000;
    assert_eq!(lockout.check(&p, &k, now), Admission::Allowed);
    for n in 1..8u32 {
        let next = lockout.record_failure(&p, &k, now);
        let retry_at_ms = now + p.delay_ms(n);
        assert_eq!(next, Admission::Delayed { retry_at_ms });
        assert_eq!(lockout.check(&p, &k, retry_at_ms - 1), next);
        assert_eq!(lockout.check(&p, &k, retry_at_ms), Admission::Allowed);
        now = retry_at_ms;
    }
    let locked = lockout.record_failure(&p, &k, now);
    let until_ms = now + p.lock_ms;
    assert_eq!(locked, Admission::Locked { until_ms });
    // Another failure while locked does not extend the lock.
    assert_eq!(lockout.record_failure(&p, &k, now + 5), locked);
    assert_eq!(lockout.check(&p, &k, until_ms - 1), locked);
    assert_eq!(lockout.check(&p, &k, until_ms), Admission::Allowed);
    // After the lock, counting starts over.
    assert_eq!(
        lockout.record_failure(&p, &k, until_ms),
        Admission::Delayed {
            retry_at_ms: until_ms + 1_000
        }
    );
}

#[test]
fn other_sources_and_principals_are_not_affected_and_success_clears() {
    let p = policy();
    let mut lockout = Lockout::default();
    let attacker = key("alice", "203.0.113.7");
    for n in 0..8 {
        lockout.record_failure(&p, &attacker, n * 100_000);
    }
    assert!(matches!(
        lockout.check(&p, &attacker, 800_000),
        Admission::Locked { .. }
    ));
    assert_eq!(
        lockout.check(&p, &key("alice", "10.0.0.9"), 800_000),
        Admission::Allowed
    );
    assert_eq!(
        lockout.check(&p, &key("bob", "203.0.113.7"), 800_000),
        Admission::Allowed
    );
    let k = key("bob", "10.0.0.1");
    lockout.record_failure(&p, &k, 0);
    lockout.record_success(&k);
    assert_eq!(lockout.check(&p, &k, 0), Admission::Allowed);
}

#[test]
fn an_admin_unlock_clears_every_source_of_the_principal() {
    let p = policy();
    let mut lockout = Lockout::default();
    for source in ["a", "b"] {
        for n in 0..8 {
            lockout.record_failure(&p, &key("alice", source), n);
        }
    }
    lockout.record_failure(&p, &key("bob", "a"), 0);
    assert_eq!(lockout.unlock("alice"), 2);
    assert_eq!(
        lockout.check(&p, &key("alice", "a"), 10),
        Admission::Allowed
    );
    assert_eq!(lockout.len(), 1);
}

#[test]
fn old_failures_are_forgotten_and_the_table_is_bounded() {
    let p = policy();
    let mut lockout = Lockout::default();
    lockout.record_failure(&p, &key("a", "1"), 0);
    assert_eq!(
        lockout.check(&p, &key("a", "1"), p.forget_after_ms),
        Admission::Allowed
    );
    assert_eq!(
        lockout.record_failure(&p, &key("a", "1"), p.forget_after_ms),
        Admission::Delayed {
            retry_at_ms: p.forget_after_ms + 1_000
        },
        "counting starts over once forgotten"
    );
    assert_eq!(lockout.forget_stale(&p, 2 * p.forget_after_ms), 1);
    assert!(lockout.is_empty());
    // Full: the longest quiet unlocked key goes first, a lock stays.
    for n in 0..8 {
        lockout.record_failure(&p, &key("locked", "x"), n);
    }
    for (n, source) in ["1", "2", "3"].iter().enumerate() {
        lockout.record_failure(&p, &key("a", source), 100 + n as u64);
    }
    lockout.record_failure(&p, &key("a", "4"), 200);
    assert_eq!(lockout.len(), p.entries_max);
    assert_eq!(lockout.check(&p, &key("a", "1"), 200), Admission::Allowed);
    assert!(matches!(
        lockout.check(&p, &key("locked", "x"), 200),
        Admission::Locked { .. }
    ));
}

#[test]
fn a_clock_that_steps_back_is_no_time_passing() {
    let p = policy();
    let mut lockout = Lockout::default();
    let k = key("alice", "1");
    lockout.record_failure(&p, &k, 10_000);
    assert_eq!(
        lockout.check(&p, &k, 5_000),
        Admission::Delayed {
            retry_at_ms: 11_000
        }
    );
    assert_eq!(
        lockout.record_failure(&p, &k, 5_000),
        Admission::Delayed {
            retry_at_ms: 12_000
        }
    );
}

#[derive(Debug, Clone)]
enum Step {
    Fail(u8),
    Succeed(u8),
    Unlock,
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..6).prop_map(Step::Fail),
        1 => (0u8..6).prop_map(Step::Succeed),
        1 => Just(Step::Unlock),
        3 => (0u64..120_000).prop_map(Step::Wait),
    ]
}

proptest! {
    /// The same steps give the same state and answers (it can be applied by
    /// every replica of a raft group), the table stays bounded, and a key
    /// is never allowed sooner than its delay after a failure.
    #[test]
    fn deterministic_bounded_and_never_early(steps in proptest::collection::vec(step(), 0..80)) {
        let p = policy();
        let run = || {
            let mut lockout = Lockout::default();
            let mut now = 0u64;
            let mut answers = Vec::new();
            for s in &steps {
                let k = |n: u8| key(if n.is_multiple_of(2) { "alice" } else { "bob" }, &format!("10.0.0.{}", n / 2));
                match s {
                    Step::Fail(n) => {
                        let next = lockout.record_failure(&p, &k(*n), now);
                        if let Admission::Delayed { retry_at_ms } = next {
                            assert!(retry_at_ms > now);
                            assert_eq!(lockout.check(&p, &k(*n), retry_at_ms - 1), next);
                        }
                        answers.push(next);
                    }
                    Step::Succeed(n) => lockout.record_success(&k(*n)),
                    Step::Unlock => {
                        lockout.unlock("alice");
                    }
                    Step::Wait(ms) => now += ms,
                }
                assert!(lockout.len() <= p.entries_max);
            }
            (lockout, answers)
        };
        prop_assert_eq!(run(), run());
    }
}
