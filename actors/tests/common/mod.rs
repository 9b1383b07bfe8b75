//! The broker's test helpers: the in-process brokers, test client and
//! waits of `malachi-testkit` (`testkit/`), and the protocol document's
//! table builder, which only the broker's tests use. Each test binary uses
//! a part of them.
#![allow(unused_imports)]

pub use malachi_testkit::copies;
pub use malachi_testkit::inproc::*;
pub use malachi_testkit::wait::{eventually, wait_until};

pub mod logins;
pub mod protocol_doc;
pub mod reach;
pub mod redirects;
pub mod topics;
pub mod zones;
