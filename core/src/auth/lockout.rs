//! Progressive lockout (ADR 0146): failed authentications per (principal,
//! source address) raise a delay before the next attempt that doubles
//! (1 s, 2 s, 4 s, ... up to a cap), and after a configured count a lock
//! until a configured time passes or an admin unlocks the principal.
//!
//! Keying by source as well as principal keeps the lockout from becoming a
//! lever against a victim: an attacker slows and locks only its own
//! address's attempts at a name, never the victim's logins from elsewhere.
//!
//! The state is a plain, serializable value, deterministic under the clock
//! the caller supplies (milliseconds since any fixed origin, e.g. the ring
//! group's applied time), so it can live in raft and be counted
//! cluster-wide. A clock that steps back is treated as no time passing.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockoutPolicy {
    /// The delay after the first failure.
    pub delay_first_ms: u64,
    /// The cap on the doubling delay.
    pub delay_max_ms: u64,
    /// After this many consecutive failures the key is locked; `None`
    /// never locks (delays only).
    pub lock_after_failures: Option<u32>,
    /// How long a lock lasts unless an admin unlocks it first.
    pub lock_ms: u64,
    /// Failures older than this (since the last one) are forgotten.
    pub forget_after_ms: u64,
    /// The most keys tracked; when full, the longest quiet unlocked key is
    /// forgotten first.
    pub entries_max: usize,
}

impl Default for LockoutPolicy {
    fn default() -> LockoutPolicy {
        LockoutPolicy {
            delay_first_ms: 1_000,
            delay_max_ms: 60_000,
            lock_after_failures: Some(20),
            lock_ms: 15 * 60 * 1_000,
            forget_after_ms: 15 * 60 * 1_000,
            entries_max: 100_000,
        }
    }
}

impl LockoutPolicy {
    /// The delay after `failures` consecutive failures (`failures >= 1`).
    pub fn delay_ms(&self, failures: u32) -> u64 {
        let doublings = failures.saturating_sub(1);
        let factor = 1u64.checked_shl(doublings).unwrap_or(u64::MAX);
        self.delay_first_ms
            .saturating_mul(factor)
            .min(self.delay_max_ms)
    }
}

/// Who is trying from where: the principal's name and the client's source
/// address (its IP, without the port, so reconnecting does not reset it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LockoutKey {
    pub principal: String,
    pub source: String,
}

/// The failures of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempts {
    /// Consecutive failures, at least 1 while tracked.
    pub failures: u32,
    pub last_failure_ms: u64,
    pub locked_until_ms: Option<u64>,
}

/// Whether an attempt may run now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Allowed,
    /// Too soon after a failure: refuse without trying, retry at `retry_at_ms`.
    Delayed {
        retry_at_ms: u64,
    },
    /// Locked until `until_ms` or an admin unlock.
    Locked {
        until_ms: u64,
    },
}

/// The tracked keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lockout {
    entries: BTreeMap<LockoutKey, Attempts>,
}

impl Lockout {
    /// Whether `key` may attempt at `now_ms`.
    pub fn check(&self, policy: &LockoutPolicy, key: &LockoutKey, now_ms: u64) -> Admission {
        match self.current(policy, key, now_ms) {
            None => Admission::Allowed,
            Some(attempts) => admission(policy, &attempts, now_ms),
        }
    }

    /// The live failures of `key` at `now_ms`: expired locks and forgotten
    /// failures read as none.
    fn current(&self, policy: &LockoutPolicy, key: &LockoutKey, now_ms: u64) -> Option<Attempts> {
        let attempts = *self.entries.get(key)?;
        match attempts.locked_until_ms {
            Some(until) if until <= now_ms => None,
            Some(_) => Some(attempts),
            None if now_ms.saturating_sub(attempts.last_failure_ms) >= policy.forget_after_ms => {
                None
            }
            None => Some(attempts),
        }
    }

    /// Records a failed attempt of `key` at `now_ms`; answers the admission
    /// of its next attempt.
    pub fn record_failure(
        &mut self,
        policy: &LockoutPolicy,
        key: &LockoutKey,
        now_ms: u64,
    ) -> Admission {
        let previous = self.current(policy, key, now_ms);
        if let Some(until_ms) = previous.and_then(|a| a.locked_until_ms) {
            return Admission::Locked { until_ms };
        }
        let failures = previous.map_or(0, |a| a.failures).saturating_add(1);
        let locked_until_ms = policy
            .lock_after_failures
            .filter(|count| failures >= *count)
            .map(|_| now_ms.saturating_add(policy.lock_ms));
        let attempts = Attempts {
            failures,
            last_failure_ms: now_ms.max(previous.map_or(0, |a| a.last_failure_ms)),
            locked_until_ms,
        };
        if !self.entries.contains_key(key) {
            self.make_room(policy, now_ms);
        }
        self.entries.insert(key.clone(), attempts);
        assert!(self.entries.len() <= policy.entries_max.max(1));
        admission(policy, &attempts, now_ms)
    }

    /// A successful attempt clears the key's failures.
    pub fn record_success(&mut self, key: &LockoutKey) {
        self.entries.remove(key);
    }

    /// An admin's unlock: clears every source's failures for `principal`.
    /// Answers how many keys were cleared.
    pub fn unlock(&mut self, principal: &str) -> usize {
        let before = self.entries.len();
        self.entries.retain(|key, _| key.principal != principal);
        before - self.entries.len()
    }

    /// Drops every key with nothing live at `now_ms`; answers how many.
    pub fn forget_stale(&mut self, policy: &LockoutPolicy, now_ms: u64) -> usize {
        let stale: Vec<LockoutKey> = self
            .entries
            .keys()
            .filter(|key| self.current(policy, key, now_ms).is_none())
            .cloned()
            .collect();
        for key in &stale {
            self.entries.remove(key);
        }
        stale.len()
    }

    /// What is recorded for `key`, live or not.
    pub fn attempts(&self, key: &LockoutKey) -> Option<Attempts> {
        self.entries.get(key).copied()
    }

    /// How many sources `principal` is locked out of at `now_ms`.
    pub fn locked_sources(&self, principal: &str, now_ms: u64) -> u32 {
        let locked = self
            .entries
            .iter()
            .filter(|(key, a)| {
                key.principal == principal && a.locked_until_ms.is_some_and(|until| until > now_ms)
            })
            .count();
        u32::try_from(locked).unwrap_or(u32::MAX)
    }

    /// How many keys are tracked.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Frees one slot when full: stale keys first, then the unlocked key
    /// quiet longest, then the lock ending first.
    fn make_room(&mut self, policy: &LockoutPolicy, now_ms: u64) {
        if self.entries.len() < policy.entries_max.max(1) {
            return;
        }
        if self.forget_stale(policy, now_ms) > 0 {
            return;
        }
        let victim = self
            .entries
            .iter()
            .min_by_key(|(_, a)| {
                (
                    a.locked_until_ms.is_some(),
                    a.locked_until_ms.unwrap_or(a.last_failure_ms),
                )
            })
            .map(|(key, _)| key.clone());
        if let Some(key) = victim {
            self.entries.remove(&key);
        }
    }
}

fn admission(policy: &LockoutPolicy, attempts: &Attempts, now_ms: u64) -> Admission {
    if let Some(until_ms) = attempts.locked_until_ms {
        return Admission::Locked { until_ms };
    }
    let retry_at_ms = attempts
        .last_failure_ms
        .saturating_add(policy.delay_ms(attempts.failures));
    if now_ms < retry_at_ms {
        Admission::Delayed { retry_at_ms }
    } else {
        Admission::Allowed
    }
}
