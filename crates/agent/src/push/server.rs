//! The accept loop (connection slots, per-address limits, TLS handshakes, graceful
//! shutdown) and push mode's lifecycle: the token read at start and refreshed on a timer.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::Router;
use controller_kit::CancellationToken;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use protocol::push::{METHOD_APPLY, METHOD_STATUS, PUSH_MODEL};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    sync::Semaphore,
};

use super::{
    CREDENTIALS_UNAVAILABLE, PushError,
    auth::AuthError,
    handlers::PushState,
    limits,
    router::router,
    tls::{ReloadingTls, TLS_RELOAD_INTERVAL, TlsFiles},
};
use crate::{apply::Cluster, health::Transition};

/// A TLS handshake must complete within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Request headers must arrive within this (no slow-loris connections held open).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 64;

/// A bound listener, with TLS or (development only) without.
pub struct PushServer {
    listener: TcpListener,
    tls: Option<Arc<ReloadingTls>>,
    tls_reload_every: Duration,
    per_ip: limits::PerIpLimit,
}

impl PushServer {
    /// Binds `addr`; `tls` `None` serves plain http. The TLS files are read here, so a
    /// broken one fails the start.
    pub async fn bind(addr: SocketAddr, tls: Option<TlsFiles>) -> Result<Self, PushError> {
        let tls = match tls {
            Some(files) => Some(Arc::new(ReloadingTls::load(files).await?)),
            None => None,
        };
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| PushError::Bind { addr, source })?;
        Ok(Self {
            listener,
            tls,
            tls_reload_every: TLS_RELOAD_INTERVAL,
            per_ip: limits::PerIpLimit::new(limits::CONNECTIONS_PER_IP),
        })
    }

    /// Open connections allowed per client address (default
    /// [`limits::CONNECTIONS_PER_IP`]); more are closed at once, before the TLS handshake.
    pub fn with_connections_per_ip(mut self, max: usize) -> Self {
        self.per_ip = limits::PerIpLimit::new(max);
        self
    }

    /// How often the TLS files are re-read (default [`TLS_RELOAD_INTERVAL`]).
    pub fn with_tls_reload_interval(mut self, every: Duration) -> Self {
        self.tls_reload_every = every;
        self
    }

    /// The bound address (the port when `:0` was asked).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// `https://<addr>` (or `http://`).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        match self.local_addr() {
            Ok(a) => format!("{scheme}://{a}"),
            Err(_) => format!("{scheme}://?"),
        }
    }

    /// Serves `app` until `shutdown`, then lets the requests in flight finish.
    pub async fn serve(self, app: Router, shutdown: CancellationToken) {
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut connections = tokio::task::JoinSet::new();
        let reloading = self
            .tls
            .clone()
            .map(|tls| tokio::spawn(tls.keep_reloading(self.tls_reload_every, shutdown.clone())));
        loop {
            let slot = tokio::select! {
                s = slots.clone().acquire_owned() => match s { Ok(s) => s, Err(_) => break },
                () = shutdown.cancelled() => break,
            };
            let accepted = tokio::select! {
                a = self.listener.accept() => a,
                () = shutdown.cancelled() => break,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little, keep serving.
                    tracing::warn!(error = %e, "push endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Before the handshake: a client that opens connections and never completes
            // them holds at most its own share of the slots, never Odoo's.
            let Some(ip_slot) = self.per_ip.try_acquire(peer.ip()) else {
                if let Some(suppressed) = limits::refusal_to_log() {
                    tracing::info!(%peer, suppressed, "push endpoint: too many connections from this address; closed");
                }
                drop(tcp);
                continue;
            };
            // The acceptor current at accept time: a reload affects new connections only.
            let tls = self.tls.as_ref().map(|t| t.acceptor());
            let (app, shutdown) = (app.clone(), shutdown.clone());
            // Reap finished connections so the set does not grow.
            while connections.try_join_next().is_some() {}
            connections.spawn(async move {
                let _slots = (slot, ip_slot);
                match tls {
                    None => serve_connection(tcp, app, shutdown).await,
                    Some(acceptor) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => serve_connection(stream, app, shutdown).await,
                        // A client without a valid certificate (with --push-client-ca) ends here.
                        Ok(Err(e)) => {
                            if let Some(suppressed) = limits::refusal_to_log() {
                                tracing::info!(%peer, error = %e, suppressed, "push endpoint: TLS handshake failed");
                            }
                        }
                        Err(_) => {
                            if let Some(suppressed) = limits::refusal_to_log() {
                                tracing::info!(%peer, suppressed, "push endpoint: TLS handshake timed out");
                            }
                        }
                    },
                }
            });
        }
        while connections.join_next().await.is_some() {}
        if let Some(task) = reloading {
            controller_kit::tasks::join_logged("TLS certificate reload", task).await;
        }
    }
}

async fn serve_connection<I>(io: I, app: Router, shutdown: CancellationToken)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => if let Err(e) = r {
            tracing::debug!(error = %e, "push endpoint: connection ended with an error");
        },
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Runs push mode until `shutdown`: reads the token once (so a broken source shows at
/// start), marks the caches listed when they are, and serves.
pub async fn run<C: Cluster + 'static>(state: Arc<PushState<C>>, server: PushServer, shutdown: CancellationToken) {
    let url = server.url();
    let synced = {
        let (status, health, shutdown) = (state.status.clone(), state.health.clone(), shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = status.wait_synced() => health.set_caches_synced(),
                () = shutdown.cancelled() => {}
            }
        })
    };
    let transition = match state.token.load().await {
        Ok(()) => state.health.push_serving(&url),
        Err(e) => {
            let detail = match e {
                AuthError::Unavailable(d) => d,
                _ => "the push token could not be read".to_owned(),
            };
            tracing::error!(error = %detail, "cannot read the push token: every request is refused until it can be read");
            state.health.push_unavailable(CREDENTIALS_UNAVAILABLE, detail)
        }
    };
    if transition == Transition::Changed {
        state.persist_health().await;
    }
    let refresh = tokio::spawn(refresh_token(state.clone(), url.clone(), shutdown.clone()));
    tracing::info!(
        endpoint = %url,
        token = %state.token.source(),
        "push endpoint listening: POST {} and {}",
        protocol::json2_path(PUSH_MODEL, METHOD_APPLY),
        protocol::json2_path(PUSH_MODEL, METHOD_STATUS)
    );
    server.serve(router(state), shutdown).await;
    controller_kit::tasks::join_logged("cache sync", synced).await;
    controller_kit::tasks::join_logged("push token refresh", refresh).await;
}

/// Re-reads the token every TTL, so the condition follows its source even when no request
/// arrives: an agent made not ready by an unreadable token gets no traffic through its
/// Service, and must notice the fix by itself.
pub(super) async fn refresh_token<C: Cluster + 'static>(
    state: Arc<PushState<C>>,
    url: String,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(state.token.ttl());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // `run` has just read it.
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let transition = match state.token.load().await {
            Ok(()) if state.health.condition().reason == CREDENTIALS_UNAVAILABLE => {
                tracing::info!(token = %state.token.source(), "the push token is readable again");
                state.health.push_serving(&url)
            }
            Ok(()) => Transition::None,
            Err(e) => {
                let detail = match e {
                    AuthError::Unavailable(d) => d,
                    _ => "the push token could not be read".to_owned(),
                };
                let t = state.health.push_unavailable(CREDENTIALS_UNAVAILABLE, detail.clone());
                if t == Transition::Changed {
                    tracing::error!(error = %detail, "cannot read the push token: every request is refused until it can be read");
                }
                t
            }
        };
        if transition == Transition::Changed {
            state.persist_health().await;
        }
    }
}
