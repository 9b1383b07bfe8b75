//! The client port: the `listener` subtree. `listener.rs` (`listener/acceptor`)
//! accepts and starts one `connection/<peer>` actor per socket
//! (`connection.rs`: the pipelined request loop and its bounds; `stream.rs`
//! the socket, plaintext or TLS, and its halves; `reader.rs`
//! reads frames within request budget, `writer.rs` writes answers within
//! their deadline);
//! `dispatch.rs` takes each request to its api family's handler (the read
//! and produce paths get only what they use: `context.rs`):
//! `produce.rs`, `fetch.rs` (with `read.rs`, read plans to store reads,
//! and `remote.rs`, a sealed segment's records from the brokers holding
//! it when this one holds no usable copy), `subscribe.rs` (pushes within credit), `cursors.rs` (the cluster's
//! cursor keys as the client port uses them), `topics.rs` (topic and range
//! admin), `vnodes.rs` (vnode list and split), `cluster.rs` (tree and
//! cluster status), `auth.rs` (a connection's login and the one table
//! authorizing each request, ADR 0150), `session.rs` (how long a login
//! holds, ADR 0154), `lockout.rs` (the lockout both ports apply),
//! `token.rs` (bearer tokens, ADR 0152), `users.rs` (users and ACLs).
//! `reply.rs` holds what they answer with, `error.rs` the
//! `ServeError` they refuse with and its one mapping to wire codes.
//!
//! Architecture invariant: `serve` is the only module that speaks the client
//! protocol; it reaches the layers below through contexts of the parts each
//! path uses (`context.rs`: `ServeCtx` for the acceptor and connections,
//! `ReadCtx`, `ProduceCtx`, `MetaCtx` for the requests), built there once
//! from the broker context, and nothing below names `serve`.

pub(crate) mod auth;
pub(crate) mod cluster;
pub(crate) mod connection;
pub(crate) mod context;
pub(crate) mod cursors;
pub(crate) mod dispatch;
pub(crate) mod error;
pub(crate) mod features;
pub(crate) mod fetch;
pub(crate) mod listener;
pub(crate) mod lockout;
pub(crate) mod policies;
pub(crate) mod produce;
pub(crate) mod read;
pub(crate) mod reader;
pub(crate) mod remote;
pub(crate) mod reply;
pub(crate) mod session;
pub(crate) mod stream;
pub(crate) mod subscribe;
pub(crate) mod token;
pub(crate) mod topics;
pub(crate) mod users;
pub(crate) mod vnodes;
pub(crate) mod writer;
