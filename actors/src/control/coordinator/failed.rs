//! Whether a broker counts as failed for a failover: the one judgement the
//! coordinator makes from membership (SWIM) and the raft port's liveness
//! prober, before the pure planners (`malachi_core::plan`) take over.

/// Whether a broker counts as failed for a failover: declared dead by
/// SWIM, or suspected by SWIM *and* down by the raft port's liveness
/// prober (two signals, about a second after it stops answering, where
/// SWIM's dead takes several). A broker SWIM does not know is not failed.
pub(crate) fn primary_failed(
    swim: Option<malachi_membership::MemberState>,
    up: Option<bool>,
) -> bool {
    use malachi_membership::MemberState;
    match swim {
        Some(MemberState::Dead) => true,
        Some(MemberState::Suspect) => up == Some(false),
        // Not known to SWIM yet (the coordinators start before membership,
        // and the prober counts every peer down until it answers): never
        // failed on the prober's word alone, or every start would fail
        // over the segments its peers lead.
        Some(MemberState::Alive) | None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_primary_is_failed_when_swim_says_dead_or_both_signals_say_down() {
        use malachi_membership::MemberState::{Alive, Dead, Suspect};
        assert!(primary_failed(Some(Dead), None));
        assert!(primary_failed(Some(Dead), Some(true)));
        assert!(primary_failed(Some(Suspect), Some(false)));
        // One signal alone is not a failure: timeouts are not failures.
        assert!(!primary_failed(Some(Suspect), Some(true)));
        assert!(!primary_failed(Some(Suspect), None));
        assert!(!primary_failed(Some(Alive), Some(false)));
        // Unknown to SWIM (a broker that just started): not failed.
        assert!(!primary_failed(None, Some(false)));
        assert!(!primary_failed(None, None));
    }
}
