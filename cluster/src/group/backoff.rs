//! Backoff for every retry and reconnect loop of the raft port's client
//! side: exponential from a minimum, capped, with jitter.
//!
//! The jitter is deterministic: a hash of a seed (the caller's node and
//! peer, say) and the attempt number, so two brokers retrying the same peer
//! spread out, while a test sees the same delays on every run. Each delay
//! lies in `[base / 2, base]` where `base = min(min_ms * 2^failures, max_ms)`
//! ("equal jitter"): never below half the exponential step, never above the
//! cap.

/// One retry loop's backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    min_ms: u64,
    max_ms: u64,
    seed: u64,
    failures: u32,
}

impl Backoff {
    /// A backoff from `min_ms` up to `max_ms`, its jitter drawn from `seed`.
    pub fn new(min_ms: u64, max_ms: u64, seed: u64) -> Backoff {
        Backoff {
            min_ms: min_ms.max(1),
            max_ms: max_ms.max(min_ms.max(1)),
            seed,
            failures: 0,
        }
    }

    /// The delay before the next attempt, counting one more failure.
    pub fn next_delay_ms(&mut self) -> u64 {
        let delay = backoff_delay_ms(self.min_ms, self.max_ms, self.failures, self.seed);
        self.failures = self.failures.saturating_add(1);
        delay
    }

    /// Back to the minimum after a success.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failures counted since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// The delay after `failures` failures before this one: the pure function
/// `Backoff` steps through.
pub fn backoff_delay_ms(min_ms: u64, max_ms: u64, failures: u32, seed: u64) -> u64 {
    let min_ms = min_ms.max(1);
    let max_ms = max_ms.max(min_ms);
    let base = min_ms
        .checked_shl(failures.min(63))
        .filter(|b| *b >> failures.min(63) == min_ms)
        .unwrap_or(max_ms)
        .min(max_ms);
    let half = base / 2;
    let spread = base - half;
    let draw = xxhash_rust::xxh3::xxh3_64_with_seed(&failures.to_be_bytes(), seed);
    half + draw % (spread + 1)
}

/// A seed for a loop of `node` retrying `peer` (or any other subject).
pub fn backoff_seed(node: u64, peer: u64) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&node.to_be_bytes());
    bytes[8..].copy_from_slice(&peer.to_be_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_with_jitter_inside_the_step() {
        let mut backoff = Backoff::new(50, 2_000, 7);
        let mut base = 50;
        for _ in 0..20 {
            let delay = backoff.next_delay_ms();
            assert!(
                delay >= base / 2 && delay <= base,
                "{delay} outside [{}, {base}]",
                base / 2
            );
            base = (base * 2).min(2_000);
        }
        backoff.reset();
        assert!(backoff.next_delay_ms() <= 50);
    }

    #[test]
    fn the_jitter_is_deterministic_and_differs_between_seeds() {
        let run = |seed| {
            let mut b = Backoff::new(100, 10_000, seed);
            (0..8).map(|_| b.next_delay_ms()).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
        assert_ne!(backoff_seed(1, 2), backoff_seed(2, 1));
    }

    #[test]
    fn huge_failure_counts_stay_at_the_cap() {
        assert!(backoff_delay_ms(50, 2_000, u32::MAX, 0) <= 2_000);
        assert!(backoff_delay_ms(50, 2_000, 64, 0) >= 1_000);
        assert!(backoff_delay_ms(0, 0, 3, 0) <= 1);
    }
}
