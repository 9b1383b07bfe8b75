//! Brokers that just let a request time out, and for how long a hint naming
//! one is not followed (ADR 0128).
//!
//! A paused or cut-off primary holds its connections open and answers
//! nothing. The brokers that do answer keep naming it in their `not_leader`
//! hints until its segments' failover is recorded (about 1.5 s after the
//! fault), so a client that followed every hint went straight back to the
//! silent broker and waited out a second timeout: the first acknowledgement
//! after a pause came at p50 2.1 s, p99 3.2 s. A suspected broker's hint is
//! instead answered by asking the broker that gave it again, every
//! `SUSPECT_POLL_MS`, until it names another broker or the suspicion ends.
//!
//! A suspicion ends after `SUSPECT_MS`, or at once when the broker answers
//! anything (an answer, even a refusal, shows it is not paused). If the
//! broker was only slow and is still the primary, following its hint again
//! after `SUSPECT_MS` is the cost of the false suspicion.
//!
//! Time comes in as an argument, so the rules are tested without a clock.

use std::time::Duration;

use tokio::time::Instant;

/// How long a broker that let a request time out stays suspected: above
/// the failover bound (a seal is recorded within 2 s at p99), so the
/// brokers that answer name the new primary before it ends.
pub(crate) const SUSPECT_MS: u64 = 3_000;
/// While the hint names a suspected broker, the wait before the broker that
/// gave it is asked again.
pub(crate) const SUSPECT_POLL_MS: u64 = 100;
/// The most brokers suspected at once; the oldest suspicion gives way.
pub(crate) const SUSPECTS_MAX: usize = 64;

/// The suspected brokers, each with the instant its suspicion ends.
#[derive(Debug, Default)]
pub(crate) struct Suspects {
    until: Vec<(String, Instant)>,
}

impl Suspects {
    /// `addr` let a request time out at `now`.
    pub(crate) fn suspect(&mut self, addr: &str, now: Instant) {
        self.until.retain(|(a, until)| a != addr && *until > now);
        if self.until.len() >= SUSPECTS_MAX {
            self.until.remove(0);
        }
        self.until
            .push((addr.to_owned(), now + Duration::from_millis(SUSPECT_MS)));
        debug_assert!(self.until.len() <= SUSPECTS_MAX);
    }

    /// Whether a hint naming `addr` should not be followed at `now`.
    pub(crate) fn suspected(&self, addr: &str, now: Instant) -> bool {
        self.until
            .iter()
            .any(|(a, until)| a == addr && *until > now)
    }

    /// `addr` answered: it is not paused.
    pub(crate) fn acquit(&mut self, addr: &str) {
        if !self.until.is_empty() {
            self.until.retain(|(a, _)| a != addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suspicion_lasts_suspect_ms_and_an_answer_ends_it() {
        let now = Instant::now();
        let mut suspects = Suspects::default();
        assert!(!suspects.suspected("a", now));
        suspects.suspect("a", now);
        assert!(suspects.suspected("a", now));
        assert!(!suspects.suspected("b", now));
        let almost = now + Duration::from_millis(SUSPECT_MS - 1);
        assert!(suspects.suspected("a", almost));
        let after = now + Duration::from_millis(SUSPECT_MS);
        assert!(!suspects.suspected("a", after));
        suspects.suspect("a", now);
        suspects.acquit("a");
        assert!(!suspects.suspected("a", now));
    }

    #[test]
    fn a_new_timeout_renews_the_suspicion_and_the_list_stays_bounded() {
        let now = Instant::now();
        let mut suspects = Suspects::default();
        suspects.suspect("a", now);
        let later = now + Duration::from_millis(SUSPECT_MS / 2);
        suspects.suspect("a", later);
        assert!(suspects.suspected("a", now + Duration::from_millis(SUSPECT_MS)));
        assert_eq!(suspects.until.len(), 1);
        for i in 0..SUSPECTS_MAX + 10 {
            suspects.suspect(&format!("b{i}"), later);
        }
        assert_eq!(suspects.until.len(), SUSPECTS_MAX);
        // The oldest gave way, the newest stays.
        assert!(!suspects.suspected("a", later));
        assert!(suspects.suspected(&format!("b{}", SUSPECTS_MAX + 9), later));
    }
}
