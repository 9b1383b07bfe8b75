//! The admin port's probe lane: health and readiness answered while every
//! slot of the port is taken (issue 39).
//!
//! A connection the port's limits refuse (`admin_connections_max`, or its
//! address's `admin_address_connections_max`) is not just closed: it is
//! handed here. The lane serves at most `admin_probe_connections_max`
//! connections at once and **one per source address**, so a health checker
//! keeps a place unless that many other hosts are probing at the same
//! moment; each gets `admin_probe_timeout_ms` in all (TLS handshake
//! included) to send a request line. `GET /health` and `GET /ready` are
//! answered as on the main lane; anything else gets `503 busy`. Then the
//! connection is closed. Nothing here allocates past one request line of
//! [`REQUEST_LINE_BYTES_MAX`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tracing::debug;

use super::AdminCtx;
use super::stream::AdminStream;
use crate::common::addresses::AddressTable;

/// The longest request line the lane reads; a longer one is `busy`.
const REQUEST_LINE_BYTES_MAX: usize = 1024;

/// What the lane answers a request line with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Health,
    Ready,
    NotReady,
    Busy,
}

impl Answer {
    fn of(line: &[u8], ready: impl FnOnce() -> bool) -> Answer {
        let mut words = line.split(|b| *b == b' ');
        let (Some(b"GET"), Some(path)) = (words.next(), words.next()) else {
            return Answer::Busy;
        };
        match path {
            b"/health" => Answer::Health,
            b"/ready" if ready() => Answer::Ready,
            b"/ready" => Answer::NotReady,
            _ => Answer::Busy,
        }
    }

    fn response(self) -> &'static [u8] {
        match self {
            Answer::Health => {
                b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n"
            }
            Answer::Ready => {
                b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\nconnection: close\r\n\r\nready\n"
            }
            Answer::NotReady => {
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 10\r\nconnection: close\r\n\r\nnot ready\n"
            }
            Answer::Busy => {
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 5\r\nconnection: close\r\nretry-after: 1\r\n\r\nbusy\n"
            }
        }
    }
}

/// The lane: its slots, its one-per-address table and its deadline.
#[derive(Debug)]
pub(crate) struct ProbeLane {
    ctx: Arc<AdminCtx>,
    slots: Arc<Semaphore>,
    addresses: Arc<AddressTable<()>>,
    timeout: Duration,
}

impl ProbeLane {
    pub(crate) fn new(ctx: Arc<AdminCtx>) -> ProbeLane {
        assert!(
            ctx.probe_connections_max > 0 && ctx.probe_timeout_ms > 0,
            "the probe lane's bounds are validated positive"
        );
        ProbeLane {
            slots: Arc::new(Semaphore::new(ctx.probe_connections_max)),
            addresses: AddressTable::new(1, || ()),
            timeout: Duration::from_millis(ctx.probe_timeout_ms),
            ctx,
        }
    }

    /// Answers `stream` on a task of its own if the lane has room for it
    /// (and its address); closes it otherwise. Whether it was taken.
    pub(crate) fn take(&self, stream: TcpStream, peer: SocketAddr) -> bool {
        let Some((slot, address)) = Arc::clone(&self.slots)
            .try_acquire_owned()
            .ok()
            .zip(self.addresses.admit(peer.ip()))
        else {
            return false;
        };
        let ctx = Arc::clone(&self.ctx);
        let timeout = self.timeout;
        tokio::spawn(async move {
            let _held = (slot, address);
            let answered = tokio::time::timeout(timeout, answer(&ctx, stream)).await;
            match answered {
                Ok(Ok(answer)) => {
                    ctx.metrics.admin_probe_answered.increment(1);
                    debug!(%peer, ?answer, "admin probe lane answered");
                }
                Ok(Err(error)) => debug!(%peer, %error, "admin probe lane connection failed"),
                Err(_) => debug!(%peer, "admin probe lane connection timed out"),
            }
        });
        true
    }
}

/// Reads one request line and answers it.
async fn answer(ctx: &AdminCtx, stream: TcpStream) -> std::io::Result<Answer> {
    let principal = super::stream::CertPrincipal::default();
    let mut stream = AdminStream::new(stream, ctx.tls.as_deref(), principal);
    let mut line = Vec::with_capacity(128);
    let mut byte = [0u8; 1];
    let answer = loop {
        if stream.read(&mut byte).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if byte[0] == b'\n' {
            let line = line.strip_suffix(b"\r").unwrap_or(&line);
            break Answer::of(line, || ctx.is_ready());
        }
        if line.len() == REQUEST_LINE_BYTES_MAX {
            break Answer::Busy;
        }
        line.push(byte[0]);
    };
    stream.write_all(answer.response()).await?;
    stream.shutdown().await?;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_health_and_ready_are_answered() {
        assert_eq!(
            Answer::of(b"GET /health HTTP/1.1", || false),
            Answer::Health
        );
        assert_eq!(Answer::of(b"GET /ready HTTP/1.1", || true), Answer::Ready);
        assert_eq!(
            Answer::of(b"GET /ready HTTP/1.1", || false),
            Answer::NotReady
        );
        for line in [
            &b"GET /metrics HTTP/1.1"[..],
            b"POST /health HTTP/1.1",
            b"GET /api/members/2/admit HTTP/1.1",
            b"GET",
            b"",
            b"\xff\xfe",
        ] {
            assert_eq!(Answer::of(line, || true), Answer::Busy, "{line:?}");
        }
    }

    #[test]
    fn each_response_declares_its_body_length() {
        for answer in [
            Answer::Health,
            Answer::Ready,
            Answer::NotReady,
            Answer::Busy,
        ] {
            let text = std::str::from_utf8(answer.response()).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            let declared = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .unwrap();
            assert_eq!(declared.parse::<usize>().unwrap(), body.len(), "{answer:?}");
        }
    }
}
