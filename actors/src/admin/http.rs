//! `admin_http`: the admin port (axum). `/health` answers 200 while the
//! process serves HTTP at all; `/ready` answers 503 until the metadata plane
//! is open, the coordinator runs and the client port accepts; `/metrics` is
//! Prometheus text (with restart counts refreshed from a live tree snapshot);
//! `/api/tree` is the supervision tree as JSON.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::warn;

use crate::control::shared::Shared;

#[derive(Debug, Clone)]
pub(crate) struct AdminArgs {
    pub shared: Arc<Shared>,
    pub socket: Arc<std::net::TcpListener>,
}

#[derive(Debug)]
pub(crate) enum AdminMsg {}
impl ractor::Message for AdminMsg {}

pub(crate) struct AdminActor;

pub(crate) struct AdminState {
    _cancel: DropGuard,
}

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/api/tree", get(tree))
        .with_state(shared)
}

async fn ready(State(shared): State<Arc<Shared>>) -> Response {
    if shared.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let root = shared.root.read().clone();
    if let Some(root) = root
        && let Ok(snapshot) = root.snapshot().await
    {
        shared.metrics.record_restarts(&snapshot);
    }
    shared
        .metrics
        .open_segments
        .set(shared.data.segments.lock().len() as f64);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        shared.metrics.render(),
    )
        .into_response()
}

async fn tree(State(shared): State<Arc<Shared>>) -> Response {
    let root = shared.root.read().clone();
    let Some(root) = root else {
        return (StatusCode::SERVICE_UNAVAILABLE, "tree not running\n").into_response();
    };
    match root.snapshot().await {
        Ok(snapshot) => axum::Json(snapshot).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

#[ractor::async_trait]
impl Actor for AdminActor {
    type Msg = AdminMsg;
    type State = AdminState;
    type Arguments = AdminArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<AdminMsg>,
        args: AdminArgs,
    ) -> Result<AdminState, ActorProcessingErr> {
        let socket = args.socket.try_clone()?;
        socket.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(socket)?;
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        let app = router(args.shared);
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(token.cancelled_owned())
                .await;
            if let Err(e) = served {
                warn!(error = %e, "admin http server stopped");
            }
        });
        Ok(AdminState {
            _cancel: cancel.drop_guard(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::clock::SystemClock;
    use crate::common::config::BrokerConfig;
    use malachi_cluster::cursor::CursorKey;
    use malachi_storage::FileStore;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn status(addr: std::net::SocketAddr, path: &str) -> u16 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response[9..12].parse().unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ready_is_503_until_metadata_coordinator_tree_and_acceptor_are_up() {
        let dir = tempfile::tempdir().unwrap();
        let config = BrokerConfig::for_tests(dir.path());
        let store =
            FileStore::open_dir(dir.path().join("segments"), config.store_config()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::new(
            config,
            Arc::new(store),
            Arc::new(SystemClock),
            CursorKey::new(&[7u8; 32]).unwrap(),
            addr,
            addr,
        ));
        tokio::spawn(axum::serve(listener, router(Arc::clone(&shared))).into_future());
        assert_eq!(status(addr, "/health").await, 200);
        assert_eq!(status(addr, "/ready").await, 503);
        // Serving clients alone is not enough: the metadata plane is not open.
        shared
            .accepting
            .store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(status(addr, "/ready").await, 503);
        assert_eq!(status(addr, "/api/tree").await, 503);
    }
}
