//! Waiting for the balancer after the hand-made splits (issue 38).
//!
//! A split keeps its lower child on the parent's primary and gives the
//! upper child to the least loaded other broker (ADR 0144), so the order
//! the bench splits in can leave the primaries uneven (1/3/2 for six
//! ranges on three brokers); the balancer then moves one range every
//! `maintenance.balance_interval_ms` (10 s) until every broker is within
//! one of the others. The pre-split figure is measured on the topic a
//! user would have once that settled, not on the order of the splits.

use std::time::{Duration, Instant};

use malachi_wire::messages::TopicDescription;

use super::super::super::OutputArgs;
use super::super::super::error::CliError;
use super::super::bench_client;
use super::primaries_per_broker;

/// How long the balancer has to even the primaries out: six moves.
pub(super) const BALANCE_WAIT_MS: u64 = 60_000;
/// How often the topic is described meanwhile.
const BALANCE_POLL_MS: u64 = 500;

/// The difference between the most and the fewest primaries of a broker.
pub(super) fn spread(primaries: &[usize]) -> usize {
    let most = primaries.iter().max().copied().unwrap_or(0);
    let fewest = primaries.iter().min().copied().unwrap_or(0);
    most - fewest
}

/// What the wait ended with: the topic as last described, and how long it
/// took to be balanced (`None`: not within [`BALANCE_WAIT_MS`]).
pub(super) struct Settled {
    pub described: TopicDescription,
    pub balanced_after: Option<Duration>,
}

/// Describes `topic` until its active ranges' primaries are within one of
/// each other over `brokers` brokers, or [`BALANCE_WAIT_MS`] has passed.
pub(super) async fn balanced(
    output: &OutputArgs,
    topic: &str,
    brokers: u64,
    mut described: TopicDescription,
) -> Result<Settled, CliError> {
    let client = bench_client(output).await?;
    let started = Instant::now();
    let deadline = started + Duration::from_millis(BALANCE_WAIT_MS);
    loop {
        if spread(&primaries_per_broker(&described, brokers)) <= 1 {
            return Ok(Settled {
                described,
                balanced_after: Some(started.elapsed()),
            });
        }
        if Instant::now() >= deadline {
            return Ok(Settled {
                described,
                balanced_after: None,
            });
        }
        tokio::time::sleep(Duration::from_millis(BALANCE_POLL_MS)).await;
        if let Ok(now) = client.describe_topic(topic).await {
            described = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn the_spread_is_the_most_less_the_fewest() {
        assert_eq!(spread(&[1, 3, 2]), 2);
        assert_eq!(spread(&[2, 2, 2]), 0);
        assert_eq!(spread(&[2, 1, 2, 1, 2, 2]), 1);
        assert_eq!(spread(&[]), 0);
    }
}
