//! Why an order to a copy (fence, catch-up, seal, replica status, scrub
//! verdicts, drop copies, repair: [`OrderClient`](super::replica_order::OrderClient))
//! got no answer its sender can use. The sending half only logs and
//! retries these (no wire code is made of them); a copy's refusal that
//! arrives as an answer (`OrderRefusal`, `ReplicaRefusal`) is the answer,
//! not an `OrderError` (a catch-up read's refusal becomes the lineage's
//! `HolderReadError::Refused`).

use malachi_cluster::group::{RpcError, TransportError};
use malachi_core::model::SegmentId;
use malachi_wire::WireError;

use crate::fabric::remote::RemoteError;

#[derive(Debug, thiserror::Error)]
pub(crate) enum OrderError {
    /// The request did not encode.
    #[error("cannot encode {what}: {source}")]
    Encode {
        what: &'static str,
        source: WireError,
    },
    /// Broker `node`'s answer did not decode.
    #[error("broker {node}'s {what} does not decode: {source}")]
    Decode {
        node: u64,
        what: &'static str,
        source: WireError,
    },
    /// An order to this broker itself has no local server (api key
    /// `api_key` is no order).
    #[error("no local order {api_key}")]
    NoLocalOrder { api_key: u16 },
    /// This broker's own answer did not encode.
    #[error(transparent)]
    Local(RpcError),
    /// Neither the node fabric carried the order nor is there a cluster
    /// port to carry it.
    #[error("this broker has no cluster port")]
    NoClusterPort,
    /// The node fabric carried the order and it failed there (timed out,
    /// refused, over a bound). Its text names the peer.
    #[error(transparent)]
    Fabric(#[from] RemoteError),
    /// The cluster port did not carry the order or its answer. Its text
    /// names the peer.
    #[error(transparent)]
    Port(#[from] TransportError),
    /// Broker `node` answered for none of its copy of `segment`.
    #[error("broker {node} said nothing of segment {segment}")]
    Silent { node: u64, segment: SegmentId },
    /// Broker `node` answered `answered` items for `asked`, or not in the
    /// order asked.
    #[error("broker {node} answered {answered} {what} for {asked} {of}, or out of order")]
    Mismatch {
        node: u64,
        what: &'static str,
        answered: usize,
        asked: usize,
        of: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_order_error_says_what_the_string_it_replaced_said() {
        assert_eq!(
            OrderError::Silent {
                node: 3,
                segment: SegmentId(9)
            }
            .to_string(),
            format!("broker 3 said nothing of segment {}", SegmentId(9))
        );
        assert_eq!(
            OrderError::Mismatch {
                node: 2,
                what: "copy statuses",
                answered: 1,
                asked: 2,
                of: "segments",
            }
            .to_string(),
            "broker 2 answered 1 copy statuses for 2 segments, or out of order"
        );
        assert_eq!(
            OrderError::NoLocalOrder { api_key: 7 }.to_string(),
            "no local order 7"
        );
        let timeout = RemoteError::Timeout {
            peer: 4,
            timeout_ms: 2_000,
        };
        let text = timeout.to_string();
        assert_eq!(OrderError::from(timeout).to_string(), text);
    }
}
