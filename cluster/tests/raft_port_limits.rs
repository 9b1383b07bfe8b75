//! The raft port's bounds against strangers (ADR 0090): a connection
//! limit, the cookie handshake, handshake and frame timeouts, and frame
//! buffers that grow with the bytes received. Real `TransportServer`s on
//! 127.0.0.1; every wait has a generous margin, nothing asserts speed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use malachi_cluster::group::handshake::{CLIENT_PROOF_BYTES, SERVER_HELLO_BYTES, client_handshake};
use malachi_cluster::group::{
    ClusterCookie, FrameReadError, HandshakeError, RpcService, TcpTransport, TcpTransportConfig,
    TransportError, TransportServer, TransportServerConfig, UnreachableCause, read_frame,
};
use malachi_testkit::wait::wait_until;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long a wait may take, and how often it checks.
const WAIT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(50);

const SERVER: u64 = 2;
const CLIENT: u64 = 1;

#[derive(Debug, Default)]
struct Echo;

#[async_trait::async_trait]
impl RpcService for Echo {
    async fn serve(
        &self,
        _api_key: u16,
        _group_id: u64,
        body: Bytes,
    ) -> Result<Vec<u8>, malachi_cluster::group::RpcError> {
        Ok(body.to_vec())
    }
}

fn cookie(s: &str) -> ClusterCookie {
    ClusterCookie::new(s).unwrap()
}

async fn server(tune: impl FnOnce(&mut TransportServerConfig)) -> TransportServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = TransportServerConfig::new(SERVER, cookie("right"));
    tune(&mut config);
    TransportServer::start(listener, Arc::new(Echo), config).unwrap()
}

fn client(server: &TransportServer, secret: &str) -> TcpTransport {
    let transport = TcpTransport::new(TcpTransportConfig::new(CLIENT, cookie(secret)));
    transport.set_peer(SERVER, server.local_addr());
    transport
}

/// Whether the server closed `stream`: a read ends (EOF or reset) within
/// `within`, after skipping whatever the server sent first.
async fn closed_by_server(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    let read = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => continue,
            }
        }
    };
    tokio::time::timeout(within, read).await.unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_past_the_connection_limit_is_refused_while_a_peer_keeps_being_served() {
    const LIMIT: usize = 16;
    const FLOOD: usize = 2_000;
    let server = server(|c| {
        c.raft_connections_max = LIMIT;
        // The flood's handshakes hold their slots for the whole test.
        c.handshake_timeout_ms = 60_000;
    })
    .await;
    let peer = Arc::new(client(&server, "right"));
    peer.call_raw(SERVER, 201, 1, b"before", 10_000)
        .await
        .unwrap();
    assert_eq!(server.stats().authenticated, 1);

    // The authenticated peer calls throughout the flood.
    let caller = {
        let peer = Arc::clone(&peer);
        tokio::spawn(async move {
            let mut served = 0u32;
            for i in 0..50u32 {
                let answer = peer
                    .call_raw(SERVER, 201, 1, &i.to_be_bytes(), 10_000)
                    .await
                    .expect("the authenticated peer is served during the flood");
                assert_eq!(&answer[..], &i.to_be_bytes());
                served += 1;
                // pacing, not synchronisation: the calls spread over the flood.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            served
        })
    };
    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        flood.push(
            TcpStream::connect(server.local_addr())
                .await
                .expect("loopback connect"),
        );
    }
    let refused = FLOOD - (LIMIT - 1);
    wait_until(
        "the server refused the flood past its limit",
        WAIT,
        POLL,
        async || server.stats().refused_over_limit as usize >= refused,
    )
    .await;
    let stats = server.stats();
    assert_eq!(stats.refused_over_limit as usize, refused, "{stats:?}");
    assert_eq!(stats.connections_open as usize, LIMIT, "{stats:?}");
    // Rate-limited: a handful of lines for ~2,000 refusals, not one each.
    assert!(stats.refusals_logged <= 30, "{stats:?}");

    // The refused sockets are closed; the ones holding a slot are not.
    let mut closed = 0;
    for stream in &mut flood {
        if closed_by_server(stream, Duration::from_millis(1)).await {
            closed += 1;
        }
    }
    // A close not yet seen by the 1 ms read is fine: at least most show it.
    assert!(
        closed >= refused / 2,
        "only {closed} of {refused} refused sockets closed"
    );

    assert_eq!(caller.await.unwrap(), 50);
    drop(flood);
    peer.call_raw(SERVER, 201, 1, b"after", 10_000)
        .await
        .unwrap();
    assert_eq!(
        server.stats().authenticated,
        1,
        "the peer kept its connection"
    );
    // The flood's slots come back once its sockets close.
    wait_until("the flood's connections closed", WAIT, POLL, async || {
        server.stats().connections_open == 1
    })
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_in_the_handshake_is_dropped_after_the_handshake_timeout() {
    let server = server(|c| c.handshake_timeout_ms = 500).await;
    let mut stream = TcpStream::connect(server.local_addr()).await.unwrap();
    let mut hello = [0u8; SERVER_HELLO_BYTES];
    stream.read_exact(&mut hello).await.unwrap();
    let dribble = async {
        for _ in 0..CLIENT_PROOF_BYTES {
            if stream.write_all(b"M").await.is_err() {
                break;
            }
            // pacing, not synchronisation: a byte a second is the fault.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    // The dribble would take 77 s; the server must cut it well before.
    let _ = tokio::time::timeout(Duration::from_secs(3), dribble).await;
    assert!(closed_by_server(&mut stream, Duration::from_secs(10)).await);
    wait_until(
        "the handshake refusal was counted",
        WAIT,
        POLL,
        async || server.stats().refused_handshake == 1,
    )
    .await;
    assert_eq!(server.stats().connections_open, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_inside_a_frame_is_dropped_after_the_frame_read_timeout() {
    let server = server(|c| c.frame_read_timeout_ms = 500).await;
    let mut stream = TcpStream::connect(server.local_addr()).await.unwrap();
    let shaken = client_handshake(&mut stream, &cookie("right"), CLIENT, Some(SERVER)).await;
    assert_eq!(shaken.unwrap(), SERVER);
    // A request frame of 6 + 8 + 4 bytes, one byte a second.
    let mut frame = Vec::new();
    frame.extend_from_slice(&18u32.to_be_bytes());
    frame.extend_from_slice(&201u16.to_be_bytes());
    frame.extend_from_slice(&1u32.to_be_bytes());
    frame.extend_from_slice(&1u64.to_be_bytes());
    frame.extend_from_slice(b"slow");
    let dribble = async {
        for byte in &frame {
            if stream.write_all(&[*byte]).await.is_err() {
                break;
            }
            // pacing, not synchronisation: a byte a second is the fault.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(3), dribble).await;
    assert!(closed_by_server(&mut stream, Duration::from_secs(10)).await);
    wait_until("the dropped frame was counted", WAIT, POLL, async || {
        server.stats().dropped_bad_frame == 1
    })
    .await;
}

/// Collects the fields of every `raft connection refused` event.
mod capture {
    use std::sync::{Arc, Mutex};
    use tracing::field::{Field, Visit};
    use tracing_subscriber::layer::{Context, Layer};

    #[derive(Debug, Clone, Default)]
    pub struct Lines(pub Arc<Mutex<Vec<String>>>);

    struct Fields(String);

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!("{}={:?} ", field.name(), value));
        }
    }

    impl<S: tracing::Subscriber> Layer<S> for Lines {
        fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            self.0.lock().unwrap().push(fields.0);
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_wrong_cookie_or_garbage_is_refused_and_logged_without_the_secret() {
    use tracing_subscriber::layer::SubscriberExt;
    let lines = capture::Lines::default();
    let subscriber = tracing_subscriber::registry().with(lines.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = server(|c| c.refusal_log_interval_ms = 0).await;
    // A broker of another cluster: its calls fail, nothing reaches the service.
    let stranger = client(&server, "wrong-secret");
    let err = stranger
        .call_raw(SERVER, 210, 1, b"DeleteTopic", 5_000)
        .await
        .unwrap_err();
    assert!(matches!(err, TransportError::Unreachable { .. }), "{err:?}");
    wait_until("the wrong cookie was refused", WAIT, POLL, async || {
        server.stats().refused_handshake == 1
    })
    .await;

    // Garbage instead of the handshake.
    let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
    raw.write_all(&[0xAB; CLIENT_PROOF_BYTES]).await.unwrap();
    assert!(closed_by_server(&mut raw, Duration::from_secs(10)).await);
    wait_until("the garbage was refused", WAIT, POLL, async || {
        server.stats().refused_handshake == 2
    })
    .await;
    assert_eq!(server.stats().authenticated, 0);

    let lines = lines.0.lock().unwrap().clone();
    let refusals: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("raft connection refused"))
        .collect();
    assert!(
        refusals
            .iter()
            .any(|l| l.contains("bad cookie proof") && l.contains("peer=127.0.0.1")),
        "{lines:#?}"
    );
    assert!(
        refusals.iter().any(|l| l.contains("not a raft handshake")),
        "{lines:#?}"
    );
    for line in &lines {
        assert!(
            !line.contains("right") && !line.contains("wrong-secret"),
            "a secret in {line}"
        );
    }

    // The right cookie still gets in.
    let friend = client(&server, "right");
    friend.call_raw(SERVER, 201, 1, b"hi", 5_000).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_refuses_a_server_that_cannot_prove_the_cookie() {
    // An impostor that sends a hello, reads the client's proof and answers
    // with a made-up proof.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let impostor = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut hello = vec![0u8; SERVER_HELLO_BYTES];
        hello[..4].copy_from_slice(b"MRFT");
        hello[4] = 1;
        stream.write_all(&hello).await.unwrap();
        let mut proof = [0u8; CLIENT_PROOF_BYTES];
        stream.read_exact(&mut proof).await.unwrap();
        let mut answer = SERVER.to_be_bytes().to_vec();
        answer.extend_from_slice(&[0u8; 32]);
        stream.write_all(&answer).await.unwrap();
        // Anything the client sends now would be a request: there must be none.
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest).await;
        rest
    });
    let transport = TcpTransport::new(TcpTransportConfig::new(CLIENT, cookie("right")));
    transport.set_peer(SERVER, addr);
    let err = transport
        .call_raw(SERVER, 210, 1, b"secret proposal", 5_000)
        .await
        .unwrap_err();
    match err {
        TransportError::Unreachable { cause, .. } => {
            assert!(
                matches!(&cause, UnreachableCause::Handshake(e) if matches!(**e, HandshakeError::BadProof)),
                "{cause}"
            )
        }
        other => panic!("{other:?}"),
    }
    drop(transport);
    assert!(
        impostor.await.unwrap().is_empty(),
        "the client sent a request to an impostor"
    );
}

#[tokio::test]
async fn a_frame_buffer_grows_with_the_bytes_received_not_the_declared_length() {
    const DECLARED: u32 = 16 * 1024 * 1024;
    let (mut writer, mut reader) = tokio::io::duplex(1024 * 1024);
    let mut sent = DECLARED.to_be_bytes().to_vec();
    sent.extend_from_slice(&[7u8; 4096]);
    writer.write_all(&sent).await.unwrap();
    // The writer stays open: the rest of the frame never comes.
    let mut buf = Vec::new();
    let read = read_frame(
        &mut reader,
        &mut buf,
        6,
        64 * 1024 * 1024,
        Duration::from_millis(300),
    )
    .await;
    assert!(
        matches!(read, Err(FrameReadError::TimedOut { .. })),
        "{read:?}"
    );
    assert_eq!(buf.len(), 4 + 4096);
    assert!(
        buf.capacity() <= 128 * 1024,
        "reserved {} bytes for 4 KiB received",
        buf.capacity()
    );
    drop(writer);
}

#[tokio::test]
async fn a_whole_frame_is_read_and_one_over_the_bound_is_refused_before_any_buffer() {
    let (mut writer, mut reader) = tokio::io::duplex(64 * 1024);
    let body = vec![3u8; 200 * 1024];
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    let write = tokio::spawn(async move {
        writer.write_all(&frame).await.unwrap();
        writer.write_all(&(u32::MAX).to_be_bytes()).await.unwrap();
        writer
    });
    let mut buf = Vec::new();
    let timeout = Duration::from_secs(10);
    assert!(
        read_frame(&mut reader, &mut buf, 6, 1 << 20, timeout)
            .await
            .unwrap()
    );
    assert_eq!(buf.len(), 4 + body.len());
    assert!(buf[4..].iter().all(|b| *b == 3));
    assert!(
        buf.capacity() <= 4 + body.len(),
        "capped at the frame's length"
    );
    let mut next = Vec::new();
    let over = read_frame(&mut reader, &mut next, 6, 1 << 20, timeout).await;
    assert!(
        matches!(over, Err(FrameReadError::TooLarge { .. })),
        "{over:?}"
    );
    assert_eq!(next.capacity(), 0);
    drop(write.await.unwrap());
}

/// ADR 0155: each dial's outcome reaches the transport's reach judgement.
/// A server with another cookie closes after the client's proof: refused,
/// so the peer is unreachable at once; a port nobody listens on is only a
/// failure (unknown until it lasts the bound); the right cookie connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_dial_tells_the_reach_judgement_how_it_ended() {
    use malachi_cluster::clock::{Clock, ManualClock};
    use malachi_cluster::group::{PeerReach, Reach, ReachSettings};
    let clock = Arc::new(ManualClock::new(0));
    let reach = Arc::new(PeerReach::new(
        ReachSettings::default(),
        Arc::clone(&clock) as Arc<dyn Clock>,
    ));
    let wrong = server(|_| {}).await;
    let transport = TcpTransport::new(TcpTransportConfig::new(CLIENT, cookie("wrong")))
        .with_reach(Arc::clone(&reach));
    transport.set_peer(SERVER, wrong.local_addr());
    let refused = transport.call_raw(SERVER, 210, 1, b"x", 5_000).await;
    match refused {
        Err(TransportError::Unreachable { cause, .. }) => assert!(
            matches!(&cause, UnreachableCause::Handshake(e) if matches!(**e, HandshakeError::ProofRefused)),
            "{cause}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(reach.judge(SERVER), Reach::Unreachable);
    // Nobody listens on a closed port: a failure, not yet a verdict.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_addr = closed.local_addr().unwrap();
    drop(closed);
    transport.set_peer(3, closed_addr);
    assert!(transport.call_raw(3, 210, 1, b"x", 5_000).await.is_err());
    assert_eq!(reach.judge(3), Reach::Unknown);
    // The right cookie: a session, so the peer is reachable.
    let right = server(|_| {}).await;
    let good = TcpTransport::new(TcpTransportConfig::new(CLIENT, cookie("right")))
        .with_reach(Arc::clone(&reach));
    good.set_peer(4, right.local_addr());
    // The server proves itself as node SERVER; dialled as 4 it is the
    // wrong node, refused too.
    assert!(good.call_raw(4, 210, 1, b"x", 5_000).await.is_err());
    assert_eq!(reach.judge(4), Reach::Unreachable);
    good.set_peer(SERVER, right.local_addr());
    assert_eq!(
        good.call_raw(SERVER, 210, 1, b"x", 5_000)
            .await
            .unwrap()
            .as_ref(),
        b"x"
    );
    // It was refused by the other transport's dial: held out a while.
    assert_eq!(reach.judge(SERVER), Reach::Unreachable);
    clock.advance_ms(ReachSettings::default().reachable_hold_ms);
    assert_eq!(reach.judge(SERVER), Reach::Reachable);
}
