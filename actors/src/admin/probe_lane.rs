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
            let held = (slot, address);
            let answered = tokio::time::timeout(
                timeout,
                answer(ctx.tls.as_ref(), || ctx.is_ready(), stream, held),
            )
            .await;
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

/// Reads one request line and answers it. `held` (the lane's slot and the
/// address's place) is given back once the answer is written and *before*
/// the close, so a probe that has read its answer to the end never finds
/// its own previous connection still holding its address's one place.
async fn answer<Held>(
    tls: Option<&std::sync::Arc<crate::common::tls::ServerTls>>,
    ready: impl FnOnce() -> bool,
    stream: TcpStream,
    held: Held,
) -> std::io::Result<Answer> {
    let principal = super::stream::CertPrincipal::default();
    let mut stream = AdminStream::new(stream, tls, principal);
    let mut line = Vec::with_capacity(128);
    let mut byte = [0u8; 1];
    let answer = loop {
        if stream.read(&mut byte).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if byte[0] == b'\n' {
            let line = line.strip_suffix(b"\r").unwrap_or(&line);
            break Answer::of(line, ready);
        }
        if line.len() == REQUEST_LINE_BYTES_MAX {
            break Answer::Busy;
        }
        line.push(byte[0]);
    };
    stream.write_all(answer.response()).await?;
    drop(held);
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

    /// Whether the client end has seen the close, once what was sent
    /// before it is read: the check a probe's place makes as it is given
    /// back.
    struct PlaceGivenBack {
        client: std::net::TcpStream,
        closed_first: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    impl Drop for PlaceGivenBack {
        fn drop(&mut self) {
            use std::io::Read;
            let mut sink = [0u8; 512];
            let closed = loop {
                match self.client.read(&mut sink) {
                    Ok(0) => break true,
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                    Err(e) => panic!("the client end failed: {e}"),
                }
            };
            self.closed_first
                .store(closed, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// CI found a health checker's second probe refused: its first
    /// connection had read its answer to the end, but the lane still held
    /// the address's one place. The place must go back before the close.
    #[tokio::test]
    async fn a_probes_place_is_given_back_before_its_connection_closes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        std::io::Write::write_all(&mut client, b"GET /health HTTP/1.1\r\n").unwrap();
        client.set_nonblocking(true).unwrap();
        let closed_first = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let place = PlaceGivenBack {
            client,
            closed_first: std::sync::Arc::clone(&closed_first),
        };
        let answered = answer(None, || true, server, place).await.unwrap();
        assert_eq!(answered, Answer::Health);
        assert!(
            !closed_first.load(std::sync::atomic::Ordering::SeqCst),
            "the connection was closed before its place was given back"
        );
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
