//! Fake brokers: tokio listeners in the test that speak the server side of
//! the frame codec, answering as each test's handler says, for the client
//! library's tests (`wire/tests/client.rs`).

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use malachi_wire::messages::*;
use malachi_wire::{
    ApiKey, ErrorBody, ErrorCode, Message, RequestFrame, ResponseFrame, ServerCodec,
};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};

/// What a fake broker does with a request: answer (or not) on the sender.
pub type Handler =
    Arc<dyn Fn(RequestFrame, mpsc::Sender<ResponseFrame>) -> BoxFuture<'static, ()> + Send + Sync>;

/// Start a fake broker. It answers `api_versions` itself and hands every
/// other request to `handler` in a task of its own, so answers can overtake
/// each other.
pub async fn fake_broker(handler: Handler) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let handler = handler.clone();
            tokio::spawn(async move {
                let (read_half, write_half) = socket.into_split();
                let mut requests = FramedRead::new(read_half, ServerCodec::default());
                let mut responses = FramedWrite::new(write_half, ServerCodec::default());
                let (tx, mut rx) = mpsc::channel::<ResponseFrame>(1024);
                tokio::spawn(async move {
                    while let Some(frame) = rx.recv().await {
                        if responses.send(frame).await.is_err() {
                            break;
                        }
                    }
                });
                while let Some(Ok(frame)) = requests.next().await {
                    if frame.api_key == ApiKey::ApiVersions.code() {
                        let versions = ApiVersionsResponse {
                            node_id: 1,
                            versions: ApiVersion::supported(),
                        };
                        tx.send(ok(frame.correlation_id, &versions)).await.unwrap();
                        continue;
                    }
                    if frame.api_key == ApiKey::DescribeTopic.code()
                        && DescribeTopicRequest::decode(frame.payload.clone())
                            .is_ok_and(|r| r.name == "t")
                    {
                        // One range over the whole keyspace, as a producer routes by.
                        tx.send(ok(frame.correlation_id, &one_range_topic()))
                            .await
                            .unwrap();
                        continue;
                    }
                    tokio::spawn(handler(frame, tx.clone()));
                }
            });
        }
    });
    addr
}

/// The description a fake broker gives of any topic: range 1, the whole keyspace.
pub fn one_range_topic() -> DescribeTopicResponse {
    DescribeTopicResponse {
        topic: TopicDescription {
            name: "t".into(),
            ranges: vec![RangeDescription {
                id: 1,
                band_start: "0x0000000000000000".into(),
                band_end: "0x10000000000000000".into(),
                state: "active".into(),
                ..RangeDescription::default()
            }],
            ..TopicDescription::default()
        },
    }
}

/// A success frame carrying `message`.
pub fn ok(correlation_id: u32, message: &impl Message) -> ResponseFrame {
    ResponseFrame {
        correlation_id,
        error_code: ErrorCode::None,
        payload: message.encode().unwrap(),
    }
}

/// A refusal frame with `code` and `body`.
pub fn refusal(correlation_id: u32, code: ErrorCode, body: ErrorBody) -> ResponseFrame {
    ResponseFrame {
        correlation_id,
        error_code: code,
        payload: body.encode().unwrap(),
    }
}
