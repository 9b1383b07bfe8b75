//! What every handler of the client port answers with: a [`Reply`] (a
//! response kept as control map and block, so a fetched block is never
//! copied), the error frame of a [`ServeError`] a handler refuses with, and
//! the connection permit ([`Inflight`]) each response carries until it is
//! written.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use malachi_wire::messages::Response;
use malachi_wire::{ErrorBody, ErrorCode, Message, WireError};
use tokio::sync::OwnedSemaphorePermit;
use tracing::error;

use super::error::{ServeError, error_body};
use crate::common::client_port::ClientPortState;
use crate::control::placement::Redirect;

/// A handler's refusal.
pub(crate) type Failure = ServeError;

/// One request's slot: a connection permit, counted broker-wide, and the
/// response budget its answer holds until written (`common::budget`).
pub(crate) struct Inflight {
    port: Arc<ClientPortState>,
    _permit: OwnedSemaphorePermit,
    pub(crate) budget: Option<crate::common::budget::Held>,
}

impl Inflight {
    pub(crate) fn new(
        port: &Arc<ClientPortState>,
        permit: OwnedSemaphorePermit,
        used: usize,
    ) -> Inflight {
        port.requests_inflight.fetch_add(1, Ordering::SeqCst);
        port.connection_inflight_peak
            .fetch_max(used, Ordering::SeqCst);
        Inflight {
            port: Arc::clone(port),
            _permit: permit,
            budget: None,
        }
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.port.requests_inflight.fetch_sub(1, Ordering::SeqCst);
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

/// The error response with `code` and `message` to `correlation_id`.
pub(crate) fn error_frame(correlation_id: u32, code: ErrorCode, message: String) -> Reply {
    body_frame(correlation_id, code, &error_body(code, message, None))
}

/// The error response of a handler's refusal.
pub(crate) fn refusal_frame(correlation_id: u32, refusal: &ServeError) -> Reply {
    body_frame(correlation_id, refusal.code(), &refusal.body())
}

/// The `not_leader` (or other) refusal of placement, with the hosting
/// broker's client address as `leader_hint`.
pub(crate) fn redirect_reply(redirect: Redirect, correlation_id: u32) -> Reply {
    refusal_frame(correlation_id, &ServeError::Redirect(redirect))
}

/// An `ErrorBody` whose message is "the broker could not encode its error
/// response" and whose other
/// fields are absent, encoded once by hand (a map of one `message` string;
/// the other fields default when absent), so sending it cannot fail. A
/// test checks it decodes to that body.
const FALLBACK_ERROR_BODY: &[u8] =
    b"\x81\xa7message\xd9\x2ethe broker could not encode its error response";

/// An error frame with `body`. A body that cannot be encoded (it never
/// should: it is three plain fields) is logged and replaced by
/// `unknown_server_error` with [`FALLBACK_ERROR_BODY`], never an empty
/// payload a client cannot decode.
pub(crate) fn body_frame(correlation_id: u32, code: ErrorCode, body: &ErrorBody) -> Reply {
    match body.encode() {
        Ok(control) => Reply {
            correlation_id,
            error_code: code,
            control,
            block: None,
        },
        Err(e) => {
            error!(
                correlation_id,
                code = %code,
                message = %body.message,
                error = %e,
                "cannot encode an error body; sending the fallback"
            );
            Reply {
                correlation_id,
                error_code: ErrorCode::UnknownServerError,
                control: Bytes::from_static(FALLBACK_ERROR_BODY),
                block: None,
            }
        }
    }
}

/// The refusal of a request the metadata plane cannot serve.
pub(crate) fn not_serving(e: crate::common::error::MetadataError) -> Failure {
    ServeError::Metadata(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FALLBACK_MESSAGE: &str = "the broker could not encode its error response";

    #[test]
    fn the_fallback_error_body_decodes_to_its_message() {
        let body = ErrorBody::decode(Bytes::from_static(FALLBACK_ERROR_BODY)).unwrap();
        assert_eq!(
            body,
            ErrorBody {
                message: FALLBACK_MESSAGE.to_owned(),
                leader_hint: None,
                retry_after_ms: None,
                ranges: None,
            }
        );
    }

    #[test]
    fn a_refusal_frame_carries_the_code_and_a_decodable_body() {
        let refusal = ServeError::TopicNotFound {
            topic: "orders".into(),
        };
        let reply = refusal_frame(7, &refusal);
        assert_eq!(reply.correlation_id, 7);
        assert_eq!(reply.error_code, ErrorCode::TopicNotFound);
        let body = ErrorBody::decode(reply.control).unwrap();
        assert_eq!(body.message, "no such topic orders");
    }
}
