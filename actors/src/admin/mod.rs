//! The admin port: `admin_http` (`http.rs`): health, readiness, the
//! Prometheus text of `common::metrics` and the live tree as JSON.

pub(crate) mod http;
