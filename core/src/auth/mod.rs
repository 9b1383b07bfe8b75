//! Authentication and authorization decisions (ADR 0146), pure: no I/O, no
//! clock, no randomness. Nonces, salts and the time come in as arguments;
//! the serve layer, the admin stores and the SDK call these.
//!
//! - `scram`: SCRAM-SHA-256 keys, stored credentials and errors;
//!   `scram_message` parses its messages, `scram_server` and
//!   `scram_client` are the two sides of an exchange.
//! - `acl`: principals, resources, operations and the allow/deny decision.
//! - `lockout`: the progressive delay and lock after failed attempts.
//! - `token`: bearer tokens (JWT) verified under the issuer's keys.
//! - `session`: whether a connection's login still stands (a token's
//!   `exp`, a SCRAM user deleted or its password changed).

pub mod acl;
pub mod lockout;
pub mod scram;
pub mod scram_client;
mod scram_message;
pub mod scram_server;
pub mod session;
pub mod token;
