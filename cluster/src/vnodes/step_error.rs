//! [`StepError`]: why one step of moving a vnode's replicas did not
//! complete. The rebalancer only logs it and tries again later, but it
//! keeps the error underneath typed so the log shows the whole chain.

use super::Forwarded;
use crate::group::{GroupError, TransportError};

#[derive(Debug, thiserror::Error)]
pub(super) enum StepError {
    #[error(transparent)]
    Group(#[from] GroupError),
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("encode: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    #[error("decode: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    /// The peer answered, but not with `Done`.
    #[error("node {node} answered {answer:?}")]
    Refused { node: u64, answer: Forwarded<()> },
}
