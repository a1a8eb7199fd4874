//! Push mode (opt-in, `--mode push`): Odoo calls the agent instead of the agent calling
//! Odoo. The agent serves an HTTPS endpoint (axum on hyper, TLS by rustls) shaped like
//! Odoo's JSON-2 API, and makes no outbound call at all:
//!
//! * `POST /json/2/vworkspace.agent/apply` with `{"protocol_version", "document"}` (the
//!   desired-state document of `agent_sync`'s result) answers the document's
//!   [`DocumentAck`], exactly what pull mode sends back. The document goes through the
//!   same path as in pull mode ([`crate::sync::apply_received`], so
//!   [`crate::apply::apply_document`]): validation, the namespace allow-list, server-side
//!   apply without force, deletion only by explicit intent; and the same revision rules
//!   ([`decide`], [`AckLedger`]).
//! * `POST /json/2/vworkspace.agent/status` with `{"full": bool}` answers the status
//!   reports (the same [`ObjectReport`]s as `agent_sync`'s), either all of them or the
//!   changes not yet delivered, with the cluster's identity and the agent's.
//!
//! Every request needs `Authorization: bearer <token>` (compared in constant time; the
//! token is read from a file or a Secret and re-read when it may have been rotated) and,
//! with `--push-client-ca`, a client certificate chained to that CA (checked by rustls
//! during the handshake, before any HTTP). Errors are Odoo's JSON-2 error objects
//! ([`OdooError`]) with the status Odoo would use. Only the leader answers (`503` on a
//! follower), so one replica writes, as in pull mode.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    body::Body,
    extract::State,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};
use controller_kit::{CancellationToken, LeaderGate, Redacted, WatchScope};
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use jiff::Timestamp;
use kube::runtime::events::Recorder;
use protocol::{
    PROTOCOL_VERSION, ProtocolVersion,
    error::{OdooError, names},
    messages::{AgentInfo, ClusterIdentity, Cursor, DesiredState, DocumentAck},
    revision::{AckLedger, Decision, decide},
};
use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
    server::WebPkiClientVerifier,
};
use serde::Serialize;
use serde_json::Value;
use subtle::ConstantTimeEq as _;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    sync::{Mutex, Semaphore},
};
use tokio_rustls::TlsAcceptor;

pub mod limits;

pub use protocol::push::{
    ApplyParams, ApplyResult, METHOD_APPLY, METHOD_STATUS, PUSH_MODEL, StatusParams, StatusResult, error_names,
};

use crate::{
    apply::{Cluster, refuse_malformed},
    credentials::{CredentialError, CredentialSource},
    health::{Health, Transition},
    status::SharedStatus,
    sync::{allowed_list, apply_received},
};

/// How long a token read from its source is trusted: a revoked token stops working within
/// this delay.
pub const TOKEN_TTL: Duration = Duration::from_secs(30);
/// Least delay between two reads caused by a token that does not match: a rotated token
/// is picked up at once, and a flood of wrong tokens costs at most one read (a Secret
/// GET) per this delay.
pub const TOKEN_MIN_RELOAD: Duration = Duration::from_secs(2);
/// How often the TLS certificate, key and client CA files are re-read.
pub const TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(10);
/// A TLS handshake must complete within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Request headers must arrive within this (no slow-loris connections held open).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 64;
/// The condition's reason while the token cannot be read (pull mode's, for the API key).
pub const CREDENTIALS_UNAVAILABLE: &str = "CredentialsUnavailable";

/// Why the endpoint cannot be set up. Never contains the token.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// A PEM file cannot be read or parsed.
    #[error("cannot read the {what} {path}: {detail}")]
    Pem {
        /// Which file (`TLS certificate`, …).
        what: &'static str,
        /// Its path.
        path: String,
        /// The reader's error.
        detail: String,
    },
    /// rustls refused the certificate, key or client CA.
    #[error("invalid TLS configuration: {0}")]
    Tls(String),
    /// The address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// An error answer: an Odoo JSON-2 error object and its status.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// The body (boxed: errors travel through `Result`s on the success path's stack).
    pub error: Box<OdooError>,
    /// Whether the message may be logged: a parser's message can quote the caller's data
    /// (values), which the agent never logs; the caller gets it, the log only the name.
    pub loggable: bool,
}

impl ApiError {
    fn new(status: StatusCode, name: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            error: Box::new(OdooError::new(name, &message.into(), None)),
            loggable: true,
        }
    }

    fn quoting_input(mut self) -> Self {
        self.loggable = false;
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = (self.status, Json(*self.error)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            res.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        res
    }
}

/// The token, read from its [`CredentialSource`] and kept only as its SHA-256 digest.
pub struct TokenCache {
    source: CredentialSource,
    kube: kube::Client,
    ttl: Duration,
    min_reload: Duration,
    state: Mutex<TokenState>,
}

#[derive(Default)]
struct TokenState {
    digest: Option<Redacted<[u8; 32]>>,
    loaded_at: Option<Instant>,
    /// Why the last read failed (credential-free), while it did.
    error: Option<String>,
}

/// Why a request is not authenticated.
#[derive(Debug, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization: bearer …` header.
    Missing,
    /// A token that does not match.
    Invalid,
    /// The agent's own token cannot be read (nobody can be authenticated).
    Unavailable(String),
}

fn digest(token: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The error of a token load, worded for the push token (the loader words it for the
/// pull mode's API key).
fn token_error(e: &CredentialError, source: &CredentialSource) -> String {
    match e {
        CredentialError::File { path, source } => format!("cannot read the push token file {path}: {source}"),
        CredentialError::Invalid(_) => format!("the push token from {source} is empty or not printable ASCII"),
        other => format!("push token: {other}"),
    }
}

impl TokenCache {
    /// A cache reading `source` (`kube` reads a Secret source).
    pub fn new(source: CredentialSource, kube: kube::Client) -> Self {
        Self::with_timing(source, kube, TOKEN_TTL, TOKEN_MIN_RELOAD)
    }

    /// The same with other delays (tests).
    pub fn with_timing(source: CredentialSource, kube: kube::Client, ttl: Duration, min_reload: Duration) -> Self {
        Self {
            source,
            kube,
            ttl,
            min_reload,
            state: Mutex::new(TokenState::default()),
        }
    }

    /// Where the token comes from (for logs).
    pub fn source(&self) -> &CredentialSource {
        &self.source
    }

    /// How often it is re-read at the latest.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn reload(&self, state: &mut TokenState) -> Result<(), AuthError> {
        state.loaded_at = Some(Instant::now());
        match self.source.load(&self.kube).await {
            // A rotated token that is too short is refused like an unreadable one: fail closed.
            Ok(token) if limits::token_too_short(token.expose()).is_some() => {
                let detail = format!(
                    "push token from {}: {}",
                    self.source,
                    limits::token_too_short(token.expose()).unwrap_or_default()
                );
                state.digest = None;
                state.error = Some(detail.clone());
                Err(AuthError::Unavailable(detail))
            }
            Ok(token) => {
                state.digest = Some(Redacted::new(digest(token.expose().as_bytes())));
                state.error = None;
                Ok(())
            }
            Err(e) => {
                // Fail closed: a token that cannot be read any more (a deleted Secret)
                // authenticates nobody.
                let detail = token_error(&e, &self.source);
                state.digest = None;
                state.error = Some(detail.clone());
                Err(AuthError::Unavailable(detail))
            }
        }
    }

    /// Reads the token now (at start, so a broken source shows before the first push).
    pub async fn load(&self) -> Result<(), AuthError> {
        let mut state = self.state.lock().await;
        self.reload(&mut state).await
    }

    /// Checks a presented token, in constant time over digests (neither its content nor
    /// its length leaks through timing).
    pub async fn verify(&self, presented: &[u8]) -> Result<(), AuthError> {
        let want = digest(presented);
        let mut state = self.state.lock().await;
        let due = |s: &TokenState, after: Duration| s.loaded_at.is_none_or(|t| t.elapsed() >= after);
        let matches = |s: &TokenState| s.digest.as_ref().is_some_and(|d| bool::from(d.expose().ct_eq(&want)));
        // Read it when never read or expired (a revoked token must stop working), and
        // retry an unreadable one no more often than min_reload.
        if due(&state, self.ttl) || (state.digest.is_none() && due(&state, self.min_reload)) {
            self.reload(&mut state).await?;
        }
        if matches(&state) {
            return Ok(());
        }
        // Perhaps rotated: read it again, at most once per min_reload.
        if state.digest.is_some() && due(&state, self.min_reload) {
            self.reload(&mut state).await?;
            if matches(&state) {
                return Ok(());
            }
        }
        match state.digest {
            Some(_) => Err(AuthError::Invalid),
            None => Err(AuthError::Unavailable(
                state
                    .error
                    .clone()
                    .unwrap_or_else(|| "the push token could not be read".into()),
            )),
        }
    }
}

/// The bearer token of an `Authorization` header (scheme case-insensitive, as Odoo's).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at(value.iter().position(|b| *b == b' ')?);
    let token = token.trim_ascii();
    (scheme.eq_ignore_ascii_case(b"bearer") && !token.is_empty()).then_some(token)
}

/// What the endpoint needs. One per agent, shared by every request.
pub struct PushState<C: Cluster> {
    /// The apply target.
    pub cluster: C,
    /// Namespace policy (the allow-list enforced on every entry).
    pub scope: WatchScope,
    /// Cluster identity.
    pub identity: ClusterIdentity,
    /// This agent (mode `push`).
    pub agent: AgentInfo,
    /// Status cache (fed by the watches).
    pub status: SharedStatus,
    /// The agent's condition and metrics.
    pub health: Health,
    /// Only the leader applies and hands out status.
    pub gate: LeaderGate,
    /// Events on the objects intent touched; `None` for none.
    pub recorder: Option<Recorder>,
    /// The bearer token.
    pub token: TokenCache,
    /// Largest body read.
    pub max_body: usize,
    /// Most reports per status answer (deltas).
    pub batch_size: usize,
    /// `known` and the acknowledgements of recent documents. Locked for the whole of an
    /// apply: documents are applied one at a time, in the order they arrive.
    pub ledger: Mutex<AckLedger>,
}

impl<C: Cluster> PushState<C> {
    async fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let result = match bearer(headers) {
            None => Err(AuthError::Missing),
            Some(token) => self.token.verify(token).await,
        };
        match result {
            Ok(()) => Ok(()),
            Err(AuthError::Missing) => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                names::UNAUTHORIZED,
                "missing bearer token (Authorization: bearer <push token>)",
            )),
            Err(AuthError::Invalid) => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                names::UNAUTHORIZED,
                "invalid push token",
            )),
            Err(AuthError::Unavailable(detail)) => {
                if let Some(suppressed) = limits::refusal_to_log() {
                    tracing::error!(error = %detail, suppressed, "cannot read the push token: nobody can be authenticated");
                }
                if self.health.push_unavailable(CREDENTIALS_UNAVAILABLE, detail) == Transition::Changed {
                    self.persist_health().await;
                }
                Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    error_names::SERVICE_UNAVAILABLE,
                    "the agent cannot read its push token; see its logs",
                ))
            }
        }
    }

    fn leader(&self) -> Result<(), ApiError> {
        if self.gate.is_leader() {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                error_names::SERVICE_UNAVAILABLE,
                "this agent replica is not the leader; retry (another replica holds the Lease)",
            ))
        }
    }

    fn check_cluster(&self, uid: Option<&str>) -> Result<(), ApiError> {
        match uid {
            Some(uid) if uid != self.identity.uid => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                names::CLUSTER_MISMATCH,
                format!(
                    "this agent serves cluster {} ({}), not {uid}",
                    self.identity.uid, self.identity.name
                ),
            )),
            _ => Ok(()),
        }
    }

    async fn persist_health(&self) {
        let known = self.ledger.lock().await.known().map(ToString::to_string);
        self.health.persist(known).await;
    }

    async fn pushed(&self) {
        if self.health.pushed() == Transition::Changed {
            tracing::info!("authenticated push served: the endpoint is in use");
            self.persist_health().await;
        }
    }

    async fn apply(&self, headers: &HeaderMap, body: Body) -> Result<ApplyResult, ApiError> {
        self.authorize(headers).await?;
        self.leader()?;
        let params: ApplyParams = parse_params(&read_body(body, self.max_body).await?)?;
        check_version(params.protocol_version)?;
        self.check_cluster(params.cluster_uid.as_deref())?;
        let doc = match serde_json::from_value::<DesiredState>(params.document.clone()) {
            Ok(doc) => doc,
            Err(e) => {
                // As pull mode: refused whole, acknowledged by its cursor when readable.
                let Some((epoch, revision)) = cursor_of(&params.document) else {
                    return Err(ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        names::UNPROCESSABLE_ENTITY,
                        format!("the document does not parse and has no readable epoch and revision: {e}"),
                    )
                    .quoting_input());
                };
                tracing::error!(
                    revision = %format!("{epoch}/{revision}"),
                    error_class = ?e.classify(),
                    "pushed document does not follow the protocol; refused, nothing applied"
                );
                let ack = refuse_malformed(epoch, revision, e.to_string(), Timestamp::now());
                self.health.metrics().document("refused");
                self.ledger.lock().await.record(ack.clone());
                self.pushed().await;
                return Ok(ApplyResult {
                    protocol_version: PROTOCOL_VERSION,
                    ack,
                });
            }
        };
        let cursor = doc.cursor();
        let ack = {
            let mut ledger = self.ledger.lock().await;
            match decide(ledger.known(), &cursor) {
                Decision::Apply => {
                    // Leadership may have moved while waiting for the ledger.
                    self.leader()?;
                    let ack = apply_received(
                        &self.cluster,
                        &self.scope,
                        self.health.metrics(),
                        self.recorder.as_ref(),
                        &doc,
                    )
                    .await;
                    ledger.record(ack.clone());
                    ack
                }
                // A repeated push (its answer was lost): the same acknowledgement again,
                // nothing written.
                Decision::AlreadyProcessed => match recorded_ack(&ledger, &cursor) {
                    Some(ack) => {
                        tracing::debug!(revision = %cursor, "document already processed; acknowledged again");
                        ack
                    }
                    None => return Err(stale(&cursor, ledger.known())),
                },
                Decision::Stale => {
                    tracing::warn!(
                        revision = %cursor,
                        known = ?ledger.known(),
                        "refusing a pushed document older than the one already processed"
                    );
                    return Err(stale(&cursor, ledger.known()));
                }
            }
        };
        self.pushed().await;
        Ok(ApplyResult {
            protocol_version: PROTOCOL_VERSION,
            ack,
        })
    }

    async fn status(&self, headers: &HeaderMap, body: Body) -> Result<StatusResult, ApiError> {
        self.authorize(headers).await?;
        self.leader()?;
        let bytes = read_body(body, self.max_body).await?;
        let params: StatusParams = if bytes.iter().all(u8::is_ascii_whitespace) {
            StatusParams::default()
        } else {
            parse_params(&bytes)?
        };
        if let Some(v) = params.protocol_version {
            check_version(v)?;
        }
        self.check_cluster(params.cluster_uid.as_deref())?;
        if !self.status.with(|c| c.is_synced()) {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                error_names::SERVICE_UNAVAILABLE,
                "the agent is still listing ApplicationInstances and Operations; retry",
            ));
        }
        let batch = self.batch_size.max(1);
        // Taken and marked delivered under one lock: a change made meanwhile stays pending.
        let (reports, more) = self.status.with(|c| {
            if params.full {
                let all = c.snapshot();
                let covered = c.version();
                c.delivered(all.iter().map(|(k, v, _)| (k.clone(), *v)));
                c.drop_tombstones_before(covered);
                (all.into_iter().map(|(_, _, r)| r).collect::<Vec<_>>(), false)
            } else {
                let deltas = c.deltas(batch);
                let more = c.pending() > deltas.len();
                c.delivered(deltas.iter().map(|(k, v, _)| (k.clone(), *v)));
                (deltas.into_iter().map(|(_, _, r)| r).collect(), more)
            }
        });
        self.health.metrics().sent(reports.len(), 0);
        self.health.metrics().pending(self.status.with(|c| c.pending()));
        let known = self.ledger.lock().await.known().cloned();
        self.pushed().await;
        Ok(StatusResult {
            protocol_version: PROTOCOL_VERSION,
            server_time: Timestamp::now(),
            cluster: self.identity.clone(),
            agent: self.agent.clone(),
            allowed_namespaces: allowed_list(&self.scope),
            known,
            full: params.full,
            reports,
            more,
        })
    }
}

fn recorded_ack(ledger: &AckLedger, cursor: &Cursor) -> Option<DocumentAck> {
    ledger
        .outgoing()
        .into_iter()
        .rev()
        .find(|a| a.epoch == cursor.epoch && a.revision == cursor.revision)
}

fn stale(cursor: &Cursor, known: Option<&Cursor>) -> ApiError {
    let known = known.map(ToString::to_string).unwrap_or_default();
    ApiError::new(
        StatusCode::CONFLICT,
        error_names::CONFLICT,
        format!(
            "revision {cursor} is not newer than {known}, already processed; a revision must never decrease within an epoch"
        ),
    )
}

/// The cursor of a document that does not parse, if one can be read.
fn cursor_of(document: &Value) -> Option<(String, u64)> {
    Some((
        document.get("epoch")?.as_str()?.to_owned(),
        document.get("revision")?.as_u64()?,
    ))
}

fn check_version(v: ProtocolVersion) -> Result<(), ApiError> {
    if PROTOCOL_VERSION.is_compatible_with(v) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            names::PROTOCOL_VERSION_MISMATCH,
            format!("the agent speaks protocol {PROTOCOL_VERSION}, the request {v}: another MAJOR version"),
        ))
    }
}

async fn read_body(body: Body, max: usize) -> Result<axum::body::Bytes, ApiError> {
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            error_names::REQUEST_ENTITY_TOO_LARGE,
            format!("the body is larger than {max} bytes (--push-max-body); nothing applied"),
        )),
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            names::BAD_REQUEST,
            format!("cannot read the body: {e}"),
        )),
    }
}

/// JSON-2's rules: a body that is not a JSON object is 400, parameters that do not bind
/// are 422. The caller's error text goes back to the caller only, never to the logs (it
/// may quote values).
fn parse_params<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            names::BAD_REQUEST,
            format!("the body is not JSON: {e}"),
        )
        .quoting_input()
    })?;
    if !value.is_object() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            names::BAD_REQUEST,
            "the body must be a JSON object of named parameters",
        ));
    }
    serde_json::from_value(value).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            names::UNPROCESSABLE_ENTITY,
            format!("the parameters do not bind: {e}"),
        )
        .quoting_input()
    })
}

fn respond<T: Serialize>(health: &Health, endpoint: &'static str, result: Result<T, ApiError>) -> Response {
    match result {
        Ok(v) => {
            health.metrics().push_request(endpoint, 200);
            (StatusCode::OK, Json(v)).into_response()
        }
        Err(e) => {
            health.metrics().push_request(endpoint, e.status.as_u16());
            let message = if e.loggable {
                e.error.message.as_str()
            } else {
                "(a parser's message, returned to the caller only)"
            };
            // 503 is this agent asking a caller to retry (still listing, not the leader, its
            // token unreadable: logged where it happens), not a refusal of the caller: it must
            // not use up the refusal lines' budget, or a flood of bad tokens right after start
            // would leave no line naming them.
            if e.status == StatusCode::SERVICE_UNAVAILABLE {
                tracing::debug!(endpoint, message, "push request answered: retry later");
            // One line per interval at most (`suppressed` counts the others since the
            // previous line); the request metrics count every refusal.
            } else if let Some(suppressed) = limits::refusal_to_log() {
                tracing::info!(endpoint, status = e.status.as_u16(), error = %e.error.name, message, suppressed, "push request refused");
            }
            e.into_response()
        }
    }
}

async fn apply_handler<C: Cluster + 'static>(
    State(state): State<Arc<PushState<C>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = state.apply(&headers, body).await;
    respond(&state.health, METHOD_APPLY, result)
}

async fn status_handler<C: Cluster + 'static>(
    State(state): State<Arc<PushState<C>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = state.status(&headers, body).await;
    respond(&state.health, METHOD_STATUS, result)
}

/// The endpoint's routes (no TLS: [`PushServer`] adds it).
pub fn router<C: Cluster + 'static>(state: Arc<PushState<C>>) -> Router {
    let health = state.health.clone();
    let not_found = move || {
        let health = health.clone();
        async move {
            health.metrics().push_request("other", 404);
            ApiError::new(
                StatusCode::NOT_FOUND,
                names::NOT_FOUND,
                format!(
                    "unknown path: use POST {} or {}",
                    protocol::json2_path(PUSH_MODEL, METHOD_APPLY),
                    protocol::json2_path(PUSH_MODEL, METHOD_STATUS)
                ),
            )
        }
    };
    let health = state.health.clone();
    let not_allowed = move || {
        let health = health.clone();
        async move {
            health.metrics().push_request("other", 405);
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                error_names::METHOD_NOT_ALLOWED,
                "use POST",
            )
        }
    };
    Router::new()
        .route(
            &protocol::json2_path(PUSH_MODEL, METHOD_APPLY),
            post(apply_handler::<C>),
        )
        .route(
            &protocol::json2_path(PUSH_MODEL, METHOD_STATUS),
            post(status_handler::<C>),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(not_allowed)
        .with_state(state)
}

fn pem_error(what: &'static str, path: &Path, e: impl std::fmt::Display) -> PushError {
    PushError::Pem {
        what,
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

fn parse_certs(what: &'static str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, PushError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(what, path, e))?;
    if certs.is_empty() {
        return Err(pem_error(what, path, "no CERTIFICATE block"));
    }
    Ok(certs)
}

/// The files of the endpoint's TLS configuration. They are re-read while serving (every
/// [`TLS_RELOAD_INTERVAL`]), so a renewed certificate (cert-manager, a rotated Secret
/// volume) or a changed client CA takes effect without a restart.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
    /// PEM CAs a client certificate must chain to; `None`: no client certificate asked.
    pub client_ca: Option<PathBuf>,
}

/// The bytes of [`TlsFiles`], read once: what a reload compares is what it parses.
#[derive(PartialEq, Eq)]
struct TlsPem {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl TlsFiles {
    async fn read(&self) -> Result<TlsPem, PushError> {
        let read = |what: &'static str, path: PathBuf| async move {
            tokio::fs::read(&path).await.map_err(|e| pem_error(what, &path, e))
        };
        Ok(TlsPem {
            cert: read("TLS certificate", self.cert.clone()).await?,
            key: read("TLS key", self.key.clone()).await?,
            client_ca: match &self.client_ca {
                Some(path) => Some(read("client CA", path.clone()).await?),
                None => None,
            },
        })
    }

    /// The server's TLS configuration these files hold now: the certificate and key, and,
    /// with a client CA, client certificates required and verified against it (WebPKI
    /// rules). TLS 1.2 and 1.3 on ring. A key that does not match the certificate is an
    /// error (rustls compares their public keys).
    pub async fn load(&self) -> Result<Arc<ServerConfig>, PushError> {
        self.build(&self.read().await?)
    }

    fn build(&self, pem: &TlsPem) -> Result<Arc<ServerConfig>, PushError> {
        let certs = parse_certs("TLS certificate", &self.cert, &pem.cert)?;
        let key = PrivateKeyDer::from_pem_slice(&pem.key).map_err(|e| pem_error("TLS key", &self.key, e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| PushError::Tls(e.to_string()))?;
        let builder = match (&self.client_ca, &pem.client_ca) {
            (Some(path), Some(ca_pem)) => {
                let mut roots = RootCertStore::empty();
                for ca in parse_certs("client CA", path, ca_pem)? {
                    roots.add(ca).map_err(|e| pem_error("client CA", path, e))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| PushError::Tls(format!("client CA {}: {e}", path.display())))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| PushError::Tls(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The TLS configuration in use, and the files' bytes it was built from.
struct ReloadingTls {
    files: TlsFiles,
    current: std::sync::RwLock<(TlsAcceptor, TlsPem)>,
}

impl ReloadingTls {
    async fn load(files: TlsFiles) -> Result<Self, PushError> {
        let pem = files.read().await?;
        let config = files.build(&pem)?;
        Ok(Self {
            files,
            current: std::sync::RwLock::new((TlsAcceptor::from(config), pem)),
        })
    }

    fn acceptor(&self) -> TlsAcceptor {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            .clone()
    }

    /// Re-reads the files: `Ok(true)` when changed ones are now in use, `Ok(false)` when
    /// nothing changed. On an error (a file missing, or a certificate and key that do not
    /// match yet, half-way through a rotation) the previous configuration stays in use.
    async fn reload(&self) -> Result<bool, PushError> {
        let pem = self.files.read().await?;
        if self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).1 == pem {
            return Ok(false);
        }
        let config = self.files.build(&pem)?;
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = (TlsAcceptor::from(config), pem);
        Ok(true)
    }

    /// Reloads every `every` until `shutdown`; logs what changed and, once per distinct
    /// error, why new files are not used.
    async fn keep_reloading(self: Arc<Self>, every: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // Just loaded.
        let mut last_error: Option<String> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            match self.reload().await {
                Ok(true) => {
                    last_error = None;
                    tracing::info!(cert = %self.files.cert.display(), "push endpoint: TLS files changed, new connections use them");
                }
                Ok(false) => last_error = None,
                Err(e) => {
                    let message = e.to_string();
                    if last_error.as_ref() != Some(&message) {
                        tracing::warn!(error = %message, "push endpoint: new TLS files are not usable, still serving the previous ones");
                        last_error = Some(message);
                    }
                }
            }
        }
    }
}

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
            let _ = task.await;
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
    let _ = synced.await;
    let _ = refresh.await;
}

/// Re-reads the token every TTL, so the condition follows its source even when no request
/// arrives: an agent made not ready by an unreadable token gets no traffic through its
/// Service, and must notice the fix by itself.
async fn refresh_token<C: Cluster + 'static>(state: Arc<PushState<C>>, url: String, shutdown: CancellationToken) {
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

#[cfg(test)]
mod tests;
