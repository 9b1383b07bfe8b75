//! What every handler of the client port answers with: a [`Reply`] (a
//! response kept as control map and block, so a fetched block is never
//! copied), the [`Failure`] a handler refuses with, and the connection
//! permit ([`Inflight`]) each response carries until it is written.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use malachi_wire::limits::MESSAGE_BYTES_MAX;
use malachi_wire::messages::Response;
use malachi_wire::{ErrorBody, ErrorCode, Message, WireError};
use tokio::sync::OwnedSemaphorePermit;

use crate::common::error::MetadataError;
use crate::control::placement::Redirect;
use crate::control::shared::Shared;

/// A handler's refusal: the wire error code and its lowercase message.
pub(crate) type Failure = (ErrorCode, String);

/// One request's slot: a connection permit, counted broker-wide.
pub(crate) struct Inflight {
    shared: Arc<Shared>,
    _permit: OwnedSemaphorePermit,
}

impl Inflight {
    pub(crate) fn new(shared: &Arc<Shared>, permit: OwnedSemaphorePermit, used: usize) -> Inflight {
        shared.requests_inflight.fetch_add(1, Ordering::SeqCst);
        shared
            .connection_inflight_peak
            .fetch_max(used, Ordering::SeqCst);
        Inflight {
            shared: Arc::clone(shared),
            _permit: permit,
        }
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.shared.requests_inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(crate) struct Outbound {
    pub frame: Reply,
    pub _slot: Option<Inflight>,
}

/// A response ready for the writer. Its payload stays in two pieces, the
/// control map and the record batch block, so a fetched block (up to 4 MiB)
/// reaches the socket without being copied into a frame buffer.
pub(crate) struct Reply {
    pub correlation_id: u32,
    pub error_code: ErrorCode,
    pub control: Bytes,
    pub block: Option<Bytes>,
}

impl Reply {
    /// A successful response to `correlation_id`.
    pub(crate) fn encode(correlation_id: u32, response: &Response) -> Result<Reply, WireError> {
        let (control, block) = response.encode_parts()?;
        Ok(Reply {
            correlation_id,
            error_code: ErrorCode::None,
            control,
            block,
        })
    }
}

pub(crate) fn error_frame(correlation_id: u32, code: ErrorCode, message: String) -> Reply {
    let mut message = message;
    if message.len() > MESSAGE_BYTES_MAX {
        let mut cut = MESSAGE_BYTES_MAX;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    let body = ErrorBody {
        message,
        leader_hint: None,
        retry_after_ms: code.retriable().then_some(10),
    };
    Reply {
        correlation_id,
        error_code: code,
        control: body.encode().unwrap_or_else(|_| Bytes::new()),
        block: None,
    }
}

/// The `not_leader` (or other) refusal of placement, with the hosting
/// broker's client address as `leader_hint`.
pub(crate) fn redirect_reply(redirect: Redirect, correlation_id: u32) -> Reply {
    let body = ErrorBody {
        message: redirect.message,
        leader_hint: redirect.hint,
        retry_after_ms: redirect.code.retriable().then_some(10),
    };
    Reply {
        correlation_id,
        error_code: redirect.code,
        control: body.encode().unwrap_or_default(),
        block: None,
    }
}

/// The refusal of a request the metadata plane cannot serve.
pub(crate) fn not_serving(e: MetadataError) -> Failure {
    (e.error_code(), e.to_string())
}
