//! The admin HTTP server: probes and metrics.
//!
//! * `GET /livez`: 200 `ok` while the process serves HTTP at all.
//! * `GET /readyz`: 200 once the binary marked itself ready (watch caches synced),
//!   503 with a short reason before. Leadership plays no part: every replica serves
//!   reads and health, only writes are gated on the Lease.
//! * `GET /metrics`: [`Metrics`] in the OpenMetrics text format.

use std::{
    borrow::Cow,
    net::SocketAddr,
    sync::{Arc, RwLock},
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, OPENMETRICS_CONTENT_TYPE};

/// Why the admin server failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The address could not be bound (in use, no permission).
    #[error("cannot bind the admin server to {addr}: {source}")]
    Bind {
        /// The requested address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The server stopped with an I/O error.
    #[error("admin server failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// The process-wide readiness flag behind `/readyz`. Cheap to clone; starts not ready.
#[derive(Clone, Debug)]
pub struct Readiness {
    // `None` when ready, otherwise why not.
    state: Arc<RwLock<Option<Cow<'static, str>>>>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new()
    }
}

impl Readiness {
    /// Not ready, with reason "starting".
    pub fn new() -> Self {
        Self {
            state: Arc::new(RwLock::new(Some(Cow::Borrowed("starting")))),
        }
    }

    /// Marks the process ready (call once the watch caches have synced).
    pub fn set_ready(&self) {
        *self.write() = None;
    }

    /// Marks the process not ready; `reason` is returned in the 503 body.
    pub fn set_not_ready(&self, reason: impl Into<Cow<'static, str>>) {
        *self.write() = Some(reason.into());
    }

    /// Whether `/readyz` currently answers 200.
    pub fn is_ready(&self) -> bool {
        self.read().is_none()
    }

    /// `Ok` when ready, otherwise the reason.
    pub fn status(&self) -> Result<(), String> {
        match &*self.read() {
            None => Ok(()),
            Some(reason) => Err(reason.to_string()),
        }
    }

    // Poisoning is ignored: the value is a plain Option, always consistent.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Option<Cow<'static, str>>> {
        self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Option<Cow<'static, str>>> {
        self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    readiness: Readiness,
}

/// The admin routes, for binaries that want to mount them in a server of their own.
pub fn router(metrics: Metrics, readiness: Readiness) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_handler))
        .with_state(AppState { metrics, readiness })
}

/// Binds `addr` (port 0 picks a free port) and serves the admin routes until `shutdown`
/// is cancelled, then finishes in-flight requests and returns.
///
/// Returns the address actually bound and the server task.
pub async fn spawn(
    addr: SocketAddr,
    metrics: Metrics,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, JoinHandle<Result<(), AdminError>>), AdminError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| AdminError::Bind { addr, source })?;
    let app = router(metrics, readiness);
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .map_err(AdminError::Serve)
    });
    tracing::info!(%bound, "admin server listening");
    Ok((bound, task))
}

async fn livez() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<AppState>) -> Response {
    match state.readiness.status() {
        Ok(()) => (StatusCode::OK, "ok").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}")).into_response(),
    }
}

async fn metrics_handler(State(state): State<AppState>) -> Response {
    match state.metrics.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], body).into_response(),
        Err(err) => {
            tracing::error!(error = %err, "cannot encode metrics");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics").into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// A deliberately tiny HTTP/1.1 client: enough for three GETs, no extra dependency.
    async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await.unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head.to_owned(), body.to_owned())
    }

    #[tokio::test]
    async fn probes_and_metrics() {
        let metrics = Metrics::new("test");
        let ctl = metrics.controller("demo");
        drop(ctl.reconcile_timer());
        ctl.reconcile_failure("kube_api");
        ctl.api_write(crate::metrics::WriteVerb::Apply, "HelmRelease");
        let readiness = Readiness::new();
        let shutdown = CancellationToken::new();
        let (addr, task) = spawn(
            ([127, 0, 0, 1], 0).into(),
            metrics.clone(),
            readiness.clone(),
            shutdown.clone(),
        )
        .await
        .unwrap();
        assert!(addr.ip().is_loopback());
        assert_ne!(addr.port(), 0, "the bound port is returned, not the requested 0");

        assert_eq!(get(addr, "/livez").await.0, 200);
        assert_eq!(get(addr, "/livez").await.2, "ok");

        let (status, _, body) = get(addr, "/readyz").await;
        assert_eq!((status, body.as_str()), (503, "not ready: starting"));
        readiness.set_not_ready("watch caches not synced");
        assert_eq!(get(addr, "/readyz").await.2, "not ready: watch caches not synced");
        readiness.set_ready();
        assert_eq!(get(addr, "/readyz").await.0, 200);

        let (status, head, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/openmetrics-text"),
            "{head}"
        );
        for name in [
            "test_reconcile_runs_total",
            "test_reconcile_failures_total",
            "test_reconcile_duration_seconds",
            "test_api_writes_total",
            "test_leader",
        ] {
            assert!(body.contains(name), "missing {name} in:\n{body}");
        }

        assert_eq!(get(addr, "/nope").await.0, 404);

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "listener closed after shutdown"
        );
    }

    #[tokio::test]
    async fn bind_error_is_typed() {
        let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let err = spawn(addr, Metrics::new(""), Readiness::new(), CancellationToken::new())
            .await
            .unwrap_err();
        assert!(matches!(err, AdminError::Bind { .. }), "{err}");
    }

    #[test]
    fn readiness_flag() {
        let r = Readiness::default();
        assert!(!r.is_ready());
        r.clone().set_ready();
        assert!(r.is_ready());
        r.set_not_ready(format!("{} of 2 caches synced", 1));
        assert_eq!(r.status(), Err("1 of 2 caches synced".to_owned()));
    }
}
