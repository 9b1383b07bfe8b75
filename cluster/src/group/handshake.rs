//! The raft port's handshake: a mutual challenge-response over the cluster
//! cookie, before any frame (docs/protocol.md, "The raft port"; ADR 0090).
//!
//! ```text
//! server -> client  hello  37 bytes: "MRFT" | version 1 | server nonce (32)
//! client -> server  proof  77 bytes: "MRFT" | version 1 | client node id (u64 BE)
//!                                    | client nonce (32) | client mac (32)
//! server -> client  proof  40 bytes: server node id (u64 BE) | server mac (32)
//!
//! client mac = HMAC-SHA256(cookie, "malachi raft client v1" | server nonce
//!                                  | client nonce | client node id)
//! server mac = HMAC-SHA256(cookie, "malachi raft server v1" | client nonce
//!                                  | server nonce | server node id | client node id)
//! ```
//!
//! The server answers a bad client proof by closing the connection, without
//! a word. Each side proves it holds the cookie over the other's fresh nonce,
//! so neither proof can be replayed, and the labels keep a client's proof from
//! passing as a server's. MACs are compared in constant time. mTLS is the
//! planned replacement: the cookie authenticates but does not encrypt.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The first bytes of the hello and of the client's proof.
pub const HANDSHAKE_MAGIC: [u8; 4] = *b"MRFT";
/// The handshake's version.
pub const HANDSHAKE_VERSION: u8 = 1;
/// Bytes of a nonce.
pub const NONCE_BYTES: usize = 32;
/// Bytes of an HMAC-SHA256.
pub const MAC_BYTES: usize = 32;
/// Bytes of the server's hello.
pub const SERVER_HELLO_BYTES: usize = 4 + 1 + NONCE_BYTES;
/// Bytes of the client's proof.
pub const CLIENT_PROOF_BYTES: usize = 4 + 1 + 8 + NONCE_BYTES + MAC_BYTES;
/// Bytes of the server's proof.
pub const SERVER_PROOF_BYTES: usize = 8 + MAC_BYTES;

const CLIENT_LABEL: &[u8] = b"malachi raft client v1";
const SERVER_LABEL: &[u8] = b"malachi raft server v1";

type HmacSha256 = Hmac<Sha256>;

/// The secret every broker of a cluster shares. Its `Debug` shows no byte
/// of it, so it cannot reach a log by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterCookie(Arc<[u8]>);

impl ClusterCookie {
    /// A cookie of these bytes; `None` if empty.
    pub fn new(bytes: impl AsRef<[u8]>) -> Option<ClusterCookie> {
        let bytes = bytes.as_ref();
        (!bytes.is_empty()).then(|| ClusterCookie(Arc::from(bytes)))
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes a key of any length.
        match HmacSha256::new_from_slice(&self.0) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC accepts keys of every length"),
        }
    }
}

impl fmt::Debug for ClusterCookie {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterCookie(<redacted>)")
    }
}

/// Why a handshake failed. None of them carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("handshake i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a raft handshake (bad magic or version)")]
    NotAHandshake,
    #[error("the peer's proof does not match the cluster cookie")]
    BadProof,
    /// The server closed the connection right after reading the client's
    /// proof: how a server answers a proof made with another cookie.
    #[error("the server closed after the proof (a different cluster cookie?)")]
    ProofRefused,
    /// The client proved the cookie as a node it may not be here (its
    /// certificate is for another node, ADR 0155): no server proof sent.
    #[error("node {client} proved the cookie, but may not connect as that node")]
    NodeRefused { client: u64 },
    #[error("the peer answered as node {got}, expected node {expected}")]
    WrongNode { expected: u64, got: u64 },
    #[error("no randomness for a nonce: {0}")]
    Randomness(getrandom::Error),
}

fn nonce() -> Result<[u8; NONCE_BYTES], HandshakeError> {
    let mut bytes = [0u8; NONCE_BYTES];
    getrandom::fill(&mut bytes).map_err(HandshakeError::Randomness)?;
    Ok(bytes)
}

fn client_mac(
    cookie: &ClusterCookie,
    server_nonce: &[u8],
    client_nonce: &[u8],
    client: u64,
) -> HmacSha256 {
    let mut mac = cookie.mac();
    mac.update(CLIENT_LABEL);
    mac.update(server_nonce);
    mac.update(client_nonce);
    mac.update(&client.to_be_bytes());
    mac
}

fn server_mac(
    cookie: &ClusterCookie,
    client_nonce: &[u8],
    server_nonce: &[u8],
    server: u64,
    client: u64,
) -> HmacSha256 {
    let mut mac = cookie.mac();
    mac.update(SERVER_LABEL);
    mac.update(client_nonce);
    mac.update(server_nonce);
    mac.update(&server.to_be_bytes());
    mac.update(&client.to_be_bytes());
    mac
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(word)
}

/// The server's side: challenges the client and, if its proof holds, proves
/// itself in turn. Returns the client's node id.
pub async fn serve_handshake<S>(
    stream: &mut S,
    cookie: &ClusterCookie,
    server_node: u64,
) -> Result<u64, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    serve_handshake_for(stream, cookie, server_node, &|_| true).await
}

/// [`serve_handshake`], proving itself only to a client whose proven node
/// id `admit` takes: any other is refused before the server's proof, so
/// its side sees the close it sees for another cookie.
pub async fn serve_handshake_for<S>(
    stream: &mut S,
    cookie: &ClusterCookie,
    server_node: u64,
    admit: &(dyn Fn(u64) -> bool + Send + Sync),
) -> Result<u64, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let server_nonce = nonce()?;
    let mut hello = [0u8; SERVER_HELLO_BYTES];
    hello[..4].copy_from_slice(&HANDSHAKE_MAGIC);
    hello[4] = HANDSHAKE_VERSION;
    hello[5..].copy_from_slice(&server_nonce);
    stream.write_all(&hello).await?;
    stream.flush().await?;

    let mut proof = [0u8; CLIENT_PROOF_BYTES];
    stream.read_exact(&mut proof).await?;
    if proof[..4] != HANDSHAKE_MAGIC || proof[4] != HANDSHAKE_VERSION {
        return Err(HandshakeError::NotAHandshake);
    }
    let client = u64_at(&proof, 5);
    let client_nonce = &proof[13..13 + NONCE_BYTES];
    let mac = &proof[13 + NONCE_BYTES..];
    client_mac(cookie, &server_nonce, client_nonce, client)
        .verify_slice(mac)
        .map_err(|_| HandshakeError::BadProof)?;
    if !admit(client) {
        return Err(HandshakeError::NodeRefused { client });
    }

    let mut answer = [0u8; SERVER_PROOF_BYTES];
    answer[..8].copy_from_slice(&server_node.to_be_bytes());
    let tag = server_mac(cookie, client_nonce, &server_nonce, server_node, client).finalize();
    answer[8..].copy_from_slice(&tag.into_bytes());
    stream.write_all(&answer).await?;
    stream.flush().await?;
    Ok(client)
}

/// The client's side: answers the server's challenge as `client_node` and
/// checks the server's proof (and, if given, that it is `expected_server`).
/// Returns the server's node id.
pub async fn client_handshake<S>(
    stream: &mut S,
    cookie: &ClusterCookie,
    client_node: u64,
    expected_server: Option<u64>,
) -> Result<u64, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut hello = [0u8; SERVER_HELLO_BYTES];
    stream.read_exact(&mut hello).await?;
    if hello[..4] != HANDSHAKE_MAGIC || hello[4] != HANDSHAKE_VERSION {
        return Err(HandshakeError::NotAHandshake);
    }
    let server_nonce = &hello[5..];
    let client_nonce = nonce()?;
    let mut proof = [0u8; CLIENT_PROOF_BYTES];
    proof[..4].copy_from_slice(&HANDSHAKE_MAGIC);
    proof[4] = HANDSHAKE_VERSION;
    proof[5..13].copy_from_slice(&client_node.to_be_bytes());
    proof[13..13 + NONCE_BYTES].copy_from_slice(&client_nonce);
    let tag = client_mac(cookie, server_nonce, &client_nonce, client_node).finalize();
    proof[13 + NONCE_BYTES..].copy_from_slice(&tag.into_bytes());
    stream.write_all(&proof).await?;
    stream.flush().await?;

    let mut answer = [0u8; SERVER_PROOF_BYTES];
    match stream.read_exact(&mut answer).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(HandshakeError::ProofRefused);
        }
        Err(e) => return Err(e.into()),
    }
    let server = u64_at(&answer, 0);
    server_mac(cookie, &client_nonce, server_nonce, server, client_node)
        .verify_slice(&answer[8..])
        .map_err(|_| HandshakeError::BadProof)?;
    if let Some(expected) = expected_server
        && expected != server
    {
        return Err(HandshakeError::WrongNode {
            expected,
            got: server,
        });
    }
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cookie(s: &str) -> ClusterCookie {
        ClusterCookie::new(s).unwrap_or_else(|| unreachable!())
    }

    #[tokio::test]
    async fn both_sides_agree_on_one_cookie_and_learn_each_others_ids() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let c = cookie("secret");
        let (server, client) = tokio::join!(
            serve_handshake(&mut a, &c, 7),
            client_handshake(&mut b, &c, 3, Some(7))
        );
        assert_eq!((server.ok(), client.ok()), (Some(3), Some(7)));
    }

    #[tokio::test]
    async fn a_wrong_cookie_fails_on_the_server() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let (right, guess) = (cookie("secret"), cookie("guess"));
        let serve = async {
            let r = serve_handshake(&mut a, &right, 7).await;
            drop(a);
            r
        };
        let (server, client) = tokio::join!(serve, async {
            let r = client_handshake(&mut b, &guess, 3, Some(7)).await;
            drop(b);
            r
        });
        assert!(
            matches!(server, Err(HandshakeError::BadProof)),
            "{server:?}"
        );
        // The server closed after the proof: the client knows it was
        // refused, not merely cut off before the hello.
        assert!(
            matches!(client, Err(HandshakeError::ProofRefused)),
            "{client:?}"
        );
    }

    #[tokio::test]
    async fn a_client_the_server_does_not_admit_is_refused_before_the_servers_proof() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let c = cookie("secret");
        let serve = async {
            let r = serve_handshake_for(&mut a, &c, 7, &|client| client == 4).await;
            drop(a);
            r
        };
        let (server, client) = tokio::join!(serve, async {
            let r = client_handshake(&mut b, &c, 3, Some(7)).await;
            drop(b);
            r
        });
        assert!(
            matches!(server, Err(HandshakeError::NodeRefused { client: 3 })),
            "{server:?}"
        );
        assert!(
            matches!(client, Err(HandshakeError::ProofRefused)),
            "{client:?}"
        );
    }

    #[tokio::test]
    async fn the_client_checks_the_servers_node_id() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let c = cookie("secret");
        let (_, client) = tokio::join!(
            serve_handshake(&mut a, &c, 8),
            client_handshake(&mut b, &c, 3, Some(7))
        );
        assert!(matches!(
            client,
            Err(HandshakeError::WrongNode {
                expected: 7,
                got: 8
            })
        ));
    }

    #[test]
    fn the_cookie_does_not_print() {
        assert_eq!(
            format!("{:?}", cookie("secret")),
            "ClusterCookie(<redacted>)"
        );
        assert!(ClusterCookie::new("").is_none());
    }
}
