//! The streaming side of the client: a windowed producer, a consumer that
//! carries its cursor, and credit-based subscriptions.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::Stream;
use tokio::sync::mpsc;

use super::connection::{Connection, PendingGuard};
use super::{Client, ClientConfig, ClientError, decode_response};
use crate::batch::{Record, RecordBatch};
use crate::messages::*;

/// Where a consumer or a subscription starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartAt {
    /// Resume from a cursor a previous read returned.
    Cursor(String),
    /// The oldest retained record.
    Start,
    /// Only records produced from now on.
    Tail,
}

impl StartAt {
    pub(crate) fn into_fields(self) -> (Option<String>, bool) {
        match self {
            StartAt::Cursor(cursor) => (Some(cursor), false),
            StartAt::Start => (None, true),
            StartAt::Tail => (None, false),
        }
    }
}

/// How a consumer fetches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumeOptions {
    /// Records asked for per fetch.
    pub records_per_fetch_max: u32,
    /// Block bytes asked for per fetch.
    pub bytes_per_fetch_max: u32,
    /// Keep waiting for new records (long polls) instead of ending at the tail.
    pub follow: bool,
    /// The long poll per fetch when following.
    pub wait_ms: u32,
    /// Stop after this many records. Fetches never ask for more than remain,
    /// so the cursor after the last record is exact.
    pub records_total_max: Option<u64>,
    /// How long one fetch keeps retrying a retriable refusal (a broker
    /// still learning the cluster's cursor key, a leader moving, a
    /// connection lost) before the consumer yields the error. A fetch only
    /// reads, so a retry is always safe.
    pub retry_ms_max: u64,
}

/// The first pause before a fetch is retried.
const FETCH_RETRY_MS_MIN: u64 = 50;
/// The longest pause between two tries of a fetch.
const FETCH_RETRY_MS_MAX: u64 = 1_000;

impl Default for ConsumeOptions {
    fn default() -> ConsumeOptions {
        ConsumeOptions {
            records_per_fetch_max: 1_000,
            bytes_per_fetch_max: 1024 * 1024,
            follow: false,
            wait_ms: 1_000,
            records_total_max: None,
            retry_ms_max: 10_000,
        }
    }
}

/// One consumed record. `cursor_after` is set on the last record of each
/// fetched batch: it is the position right after that record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedRecord {
    pub record: Record,
    pub cursor_after: Option<String>,
}

/// Reads a topic record by record, fetching batches behind the scenes.
///
/// [`Consumer::cursor`] is the position after the last record handed out
/// when that record ended a batch, and otherwise the position before the
/// current batch: resuming from it never skips a record, and re-delivers at
/// most the unfinished part of one batch.
#[derive(Debug)]
pub struct Consumer {
    client: Client,
    topic: String,
    start: Option<StartAt>,
    options: ConsumeOptions,
    buffer: VecDeque<Record>,
    batch_cursor: Option<String>,
    cursor: Option<String>,
    yielded: u64,
    done: bool,
}

impl Consumer {
    pub(crate) fn new(
        client: Client,
        topic: String,
        start: StartAt,
        options: ConsumeOptions,
    ) -> Consumer {
        let cursor = match &start {
            StartAt::Cursor(cursor) => Some(cursor.clone()),
            _ => None,
        };
        Consumer {
            client,
            topic,
            start: Some(start),
            options,
            buffer: VecDeque::new(),
            batch_cursor: None,
            cursor,
            yielded: 0,
            done: false,
        }
    }

    /// The resume position (see the type's docs); `None` before the first fetch
    /// from the start or the tail.
    pub fn cursor(&self) -> Option<&str> {
        self.cursor.as_deref()
    }

    /// Records handed out so far.
    pub fn records_consumed(&self) -> u64 {
        self.yielded
    }

    /// The next record; `None` at the end (the tail when not following, or
    /// `records_total_max` reached).
    pub async fn next(&mut self) -> Option<Result<ConsumedRecord, ClientError>> {
        loop {
            if let Some(limit) = self.options.records_total_max
                && self.yielded >= limit
            {
                return None;
            }
            if let Some(record) = self.buffer.pop_front() {
                self.yielded += 1;
                let cursor_after = if self.buffer.is_empty() {
                    self.cursor = self.batch_cursor.take();
                    self.cursor.clone()
                } else {
                    None
                };
                return Some(Ok(ConsumedRecord {
                    record,
                    cursor_after,
                }));
            }
            if self.done {
                return None;
            }
            if let Err(error) = self.fetch().await {
                self.done = true;
                return Some(Err(error));
            }
        }
    }

    async fn fetch(&mut self) -> Result<(), ClientError> {
        let remaining = self
            .options
            .records_total_max
            .map_or(u64::MAX, |limit| limit.saturating_sub(self.yielded));
        let records_max = u64::from(self.options.records_per_fetch_max.max(1)).min(remaining);
        let (cursor, from_start) = match (&self.cursor, self.start.clone()) {
            (Some(cursor), _) => (Some(cursor.clone()), false),
            (None, Some(start)) => start.into_fields(),
            (None, None) => (None, false),
        };
        let request = FetchRequest {
            topic: self.topic.clone(),
            cursor,
            from_start,
            records_max: u32::try_from(records_max).unwrap_or(u32::MAX),
            bytes_max: self.options.bytes_per_fetch_max.max(1),
            wait_ms: if self.options.follow {
                self.options.wait_ms
            } else {
                0
            },
        };
        let response = self.fetch_retrying(&request).await?;
        self.start = None;
        if response.records.is_empty() {
            self.cursor = Some(response.next_cursor);
            if !self.options.follow {
                self.done = true;
            }
            return Ok(());
        }
        self.buffer.extend(response.records.records());
        self.batch_cursor = Some(response.next_cursor);
        Ok(())
    }

    /// One fetch, retried with backoff while its refusal is retriable, for
    /// at most `retry_ms_max`.
    async fn fetch_retrying(&self, request: &FetchRequest) -> Result<FetchResponse, ClientError> {
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.options.retry_ms_max);
        let mut pause_ms = FETCH_RETRY_MS_MIN;
        loop {
            match self.client.fetch(request).await {
                Err(error)
                    if error.retriable()
                        && tokio::time::Instant::now() + Duration::from_millis(pause_ms)
                            < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                    pause_ms = (pause_ms * 2).min(FETCH_RETRY_MS_MAX);
                }
                answer => return answer,
            }
        }
    }

    /// The consumer as a `futures::Stream`.
    pub fn into_stream(self) -> impl Stream<Item = Result<ConsumedRecord, ClientError>> {
        futures::stream::unfold(self, |mut consumer| async move {
            consumer.next().await.map(|item| (item, consumer))
        })
    }
}

/// One push of a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionBatch {
    pub sequence: u64,
    /// The position after this batch.
    pub cursor: String,
    pub records: RecordBatch,
}

/// A push subscription on one connection. Records arrive within the credit
/// granted; [`Subscription::grant`] adds credit and acknowledges pushes.
pub struct Subscription {
    connection: Arc<Connection>,
    guard: PendingGuard,
    pushes: mpsc::Receiver<crate::frame::ResponseFrame>,
    first: Option<SubscriptionBatch>,
    cursor: String,
    request_timeout_ms: u64,
    ended: bool,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.guard.id())
            .field("cursor", &self.cursor)
            .field("ended", &self.ended)
            .finish()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // Best effort: tell the broker to stop pushing to nobody. Pushes that
        // still arrive find no waiter and are dropped by the reader.
        let cancel = SubscribeCreditRequest {
            subscription_id: self.id(),
            cancel: true,
            ..SubscribeCreditRequest::default()
        };
        if let Ok(payload) = cancel.encode() {
            self.connection
                .send_detached(crate::api::ApiKey::SubscribeCredit, payload);
        }
    }
}

impl Subscription {
    pub(crate) async fn open(
        connection: Arc<Connection>,
        payload: Bytes,
        config: &ClientConfig,
    ) -> Result<Subscription, ClientError> {
        let (guard, mut pushes) = connection
            .open_stream(
                crate::api::ApiKey::Subscribe,
                payload,
                config.subscription_pushes_max,
            )
            .await?;
        let first = tokio::time::timeout(
            Duration::from_millis(config.request_timeout_ms),
            pushes.recv(),
        )
        .await
        .map_err(|_| ClientError::Timeout {
            api: "subscribe",
            timeout_ms: config.request_timeout_ms,
        })?
        .ok_or_else(|| ClientError::ConnectionClosed {
            addr: connection.addr().to_owned(),
        })?;
        let push = decode_response::<SubscribeRequest>(
            first.error_code,
            first.payload,
            connection.addr(),
        )?;
        let cursor = push.next_cursor.clone();
        let first = (!push.records.is_empty()).then(|| SubscriptionBatch {
            sequence: push.sequence,
            cursor: push.next_cursor,
            records: push.records,
        });
        Ok(Subscription {
            connection,
            guard,
            pushes,
            first,
            cursor,
            request_timeout_ms: config.request_timeout_ms,
            ended: push.last,
        })
    }

    /// The correlation id the broker pushes on.
    pub fn id(&self) -> u32 {
        self.guard.id()
    }

    /// The position after the last batch received.
    pub fn cursor(&self) -> &str {
        &self.cursor
    }

    /// The next push; `None` once the subscription ended (after a cancel).
    pub async fn next(&mut self) -> Option<Result<SubscriptionBatch, ClientError>> {
        if let Some(first) = self.first.take() {
            return Some(Ok(first));
        }
        loop {
            if self.ended {
                return None;
            }
            let Some(frame) = self.pushes.recv().await else {
                self.ended = true;
                return Some(Err(ClientError::SubscriptionEnded));
            };
            let push = match decode_response::<SubscribeRequest>(
                frame.error_code,
                frame.payload,
                self.connection.addr(),
            ) {
                Ok(push) => push,
                Err(error) => {
                    self.ended = true;
                    return Some(Err(error));
                }
            };
            self.cursor = push.next_cursor.clone();
            self.ended = push.last;
            if push.records.is_empty() {
                continue;
            }
            return Some(Ok(SubscriptionBatch {
                sequence: push.sequence,
                cursor: push.next_cursor,
                records: push.records,
            }));
        }
    }

    /// Add credit and acknowledge pushes up to `acked_sequence`.
    pub async fn grant(
        &self,
        credit_records: u32,
        credit_bytes: u32,
        acked_sequence: Option<u64>,
    ) -> Result<SubscribeCreditResponse, ClientError> {
        self.credit(SubscribeCreditRequest {
            subscription_id: self.id(),
            credit_records,
            credit_bytes,
            acked_sequence,
            cancel: false,
        })
        .await
    }

    /// Ask the broker to end the subscription; [`Subscription::next`] then
    /// drains what was already pushed and returns `None` after the last push.
    pub async fn cancel(&self) -> Result<(), ClientError> {
        self.credit(SubscribeCreditRequest {
            subscription_id: self.id(),
            cancel: true,
            ..SubscribeCreditRequest::default()
        })
        .await
        .map(|_| ())
    }

    async fn credit(
        &self,
        request: SubscribeCreditRequest,
    ) -> Result<SubscribeCreditResponse, ClientError> {
        // Credit belongs to this connection's subscription: never rerouted.
        let frame = self
            .connection
            .call(
                crate::api::ApiKey::SubscribeCredit,
                request.encode()?,
                self.request_timeout_ms,
            )
            .await?;
        decode_response::<SubscribeCreditRequest>(
            frame.error_code,
            frame.payload,
            self.connection.addr(),
        )
    }
}
