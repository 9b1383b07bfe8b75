//! Malachi's wire protocol and its async client.
//!
//! This crate owns everything a client and a broker exchange over the client
//! port: the framing ([`frame`]), the api keys and their versions ([`api`]),
//! the error codes ([`error`]), one request and one response type per
//! operation ([`messages`]), the record batch block ([`batch`]), the protocol's
//! bounds ([`limits`]) and an async client ([`client`]). It knows nothing of
//! storage, raft or supervision: the topic description and the supervision tree
//! snapshot are the wire's own mirror types, which the broker fills in. Cursors
//! are opaque strings here; only the broker can read them. The record batch
//! block is validated (CRC, structure) and then carried as its original bytes,
//! so storage and replication pass it on without re-encoding it. Brokers'
//! own requests on the cluster port live here too: replica-append
//! ([`replication`]), the coordinator's orders to copies ([`replica_order`])
//! and replica-status ([`replica_status`]). The authentication messages
//! ([`auth`], api keys 400 to 402) are defined but not yet served.
//! `docs/protocol.md` describes the format byte by byte.

pub mod api;
pub mod auth;
pub mod auth_admin;
pub mod batch;
pub mod client;
pub mod error;
pub mod frame;
pub mod limits;
pub mod messages;
pub mod replica_order;
pub mod replica_status;
pub mod replication;
pub mod tls;
pub mod token_keys;

pub use api::ApiKey;
pub use batch::{BatchBuilder, BatchError, Header, HeaderParts, Record, RecordBatch, RecordRef};
pub use client::{Client, ClientConfig, ClientError};
pub use error::{ErrorBody, ErrorCode, WireError};
pub use frame::{ClientCodec, RequestFrame, ResponseFrame, ServerCodec};
pub use messages::{Message, Operation, Request, Response};
