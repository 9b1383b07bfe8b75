//! The order epoch a coordinator's orders to the copies carry (ADR 0106):
//! its group's id and the raft term it leads in. The wire and the store
//! spell it apart; this file converts between them, and holds the rule
//! that one coordinator's epochs never go back ([`OrderEpochs`]).
//!
//! Below both halves of the orders (`replica_order.rs` serves and sends
//! them, `replica.rs` serves the repair appends) so neither names the other
//! for it.

use malachi_wire::replica_order::OrderEpoch;

/// The storage layer's epoch for a wire one.
pub(crate) fn store_order(order: OrderEpoch) -> malachi_storage::OrderEpoch {
    malachi_storage::OrderEpoch {
        group: order.group,
        term: order.term,
    }
}

/// The wire's epoch for a storage one.
pub(crate) fn wire_order(order: malachi_storage::OrderEpoch) -> OrderEpoch {
    OrderEpoch {
        group: order.group,
        term: order.term,
    }
}

/// The epochs one coordinator has put on its orders, newest last.
///
/// A copy refuses an order older than the newest it took, so a
/// coordinator whose epoch went back would have its own orders refused
/// after its earlier ones: raft terms only grow, and a leader leads in one
/// term at a time, so an epoch going back is a bug, not a race.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct OrderEpochs {
    last: Option<OrderEpoch>,
}

impl OrderEpochs {
    /// Takes `order` as the epoch of the next orders. Panics if it is
    /// older than the last one of the same group (a new group starts over).
    pub(crate) fn next(&mut self, order: OrderEpoch) -> OrderEpoch {
        if let Some(last) = self.last
            && last.group == order.group
        {
            assert!(
                order.term >= last.term,
                "order epochs never go back: group {} went from term {} to {}",
                order.group,
                last.term,
                order.term
            );
        }
        self.last = Some(order);
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(group: u64, term: u64) -> OrderEpoch {
        OrderEpoch { group, term }
    }

    #[test]
    fn an_order_epoch_may_stay_or_grow() {
        let mut epochs = OrderEpochs::default();
        assert_eq!(epochs.next(epoch(7, 3)), epoch(7, 3));
        assert_eq!(epochs.next(epoch(7, 3)), epoch(7, 3));
        assert_eq!(epochs.next(epoch(7, 5)), epoch(7, 5));
        // Another group's epoch is not ordered against this one's.
        assert_eq!(epochs.next(epoch(8, 1)), epoch(8, 1));
    }

    #[test]
    #[should_panic(expected = "order epochs never go back")]
    fn an_order_epoch_that_goes_back_panics() {
        let mut epochs = OrderEpochs::default();
        epochs.next(epoch(7, 5));
        epochs.next(epoch(7, 4));
    }

    #[test]
    fn the_wire_and_store_epochs_convert_both_ways() {
        let wire = epoch(3, 9);
        assert_eq!(wire_order(store_order(wire)), wire);
    }
}
