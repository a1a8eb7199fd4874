//! The two methods (`apply`, `status`) behind authentication and the leader check, the
//! acknowledgement ledger that makes a repeated push idempotent, and JSON-2's rules for
//! bodies and parameters.

use axum::{
    Json,
    body::Body,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use controller_kit::{LeaderGate, WatchScope};
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use jiff::Timestamp;
use kube::runtime::events::Recorder;
use protocol::{
    PROTOCOL_VERSION, ProtocolVersion,
    error::{OdooError, names},
    messages::{AgentInfo, ClusterIdentity, Cursor, DesiredState},
    push::{ApplyParams, ApplyResult, StatusParams, StatusResult, error_names},
    revision::{AckLedger, Decision},
};
use serde_json::Value;
use tokio::sync::Mutex;

use super::{
    CREDENTIALS_UNAVAILABLE,
    auth::{AuthError, TokenCache, bearer},
    limits,
};
use crate::{
    apply::{Cluster, apply_received, cursor_of, refuse_malformed},
    health::{Health, Transition},
    ledger_store::{LedgerStore, StoreError},
    status::SharedStatus,
    sync::allowed_list,
};

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
    pub(super) fn new(status: StatusCode, name: &str, message: impl Into<String>) -> Self {
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
    /// Where the ledger survives restarts and leader changes: read back under the lock
    /// before every document (another replica may have led since), recorded before an
    /// acknowledgement is answered. `None` keeps it in memory only (tests).
    pub ledger_store: Option<LedgerStore>,
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

    /// The ledger, locked and read back from its store (another replica may have processed
    /// documents since this one last led).
    async fn current_ledger(&self) -> Result<tokio::sync::MutexGuard<'_, AckLedger>, ApiError> {
        let mut ledger = self.ledger.lock().await;
        if let Some(store) = &self.ledger_store {
            *ledger = store.load().await.map_err(ledger_unavailable)?;
        }
        Ok(ledger)
    }

    /// Records the ledger before its acknowledgement is answered.
    async fn save_ledger(&self, ledger: &mut AckLedger) -> Result<(), ApiError> {
        match &self.ledger_store {
            Some(store) => store.save(ledger).await.map_err(ledger_unavailable),
            None => Ok(()),
        }
    }

    pub(super) async fn persist_health(&self) {
        let known = self.ledger.lock().await.known().map(ToString::to_string);
        self.health.persist(known).await;
    }

    async fn pushed(&self) {
        if self.health.pushed() == Transition::Changed {
            tracing::info!("authenticated push served: the endpoint is in use");
            self.persist_health().await;
        }
    }

    pub(super) async fn apply(&self, headers: &HeaderMap, body: Body) -> Result<ApplyResult, ApiError> {
        self.authorize(headers).await?;
        self.leader()?;
        let params: ApplyParams = parse_params(&read_body(body, self.max_body).await?)?;
        check_version(params.protocol_version)?;
        self.check_cluster(params.cluster_uid.as_deref())?;
        let doc = match protocol::odoo_compat::decode::<DesiredState>(&params.document) {
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
                // The path and what is expected only: what came goes back to the caller in
                // the refusal, not to the logs.
                tracing::error!(
                    revision = %format!("{epoch}/{revision}"),
                    path = %e.path,
                    expected = %e.expected,
                    "pushed document does not follow the protocol; refused, nothing applied"
                );
                // The revision rule holds for it too: an older (or already processed) cursor
                // is not refused again, so a delayed push cannot reopen processed revisions.
                let cursor = protocol::Cursor { epoch, revision };
                let ack = {
                    let mut ledger = self.current_ledger().await?;
                    let ack = match ledger.decide(&cursor) {
                        Decision::Apply => {
                            let ack = refuse_malformed(
                                cursor.epoch.clone(),
                                cursor.revision,
                                e.to_string(),
                                Timestamp::now(),
                            );
                            self.health.metrics().document("refused");
                            ledger.record(ack.clone());
                            ack
                        }
                        Decision::AlreadyProcessed => match ledger.ack_of(&cursor) {
                            Some(ack) => ack.clone(),
                            None => return Err(stale(&cursor, ledger.known())),
                        },
                        Decision::Stale => return Err(stale(&cursor, ledger.known())),
                    };
                    self.save_ledger(&mut ledger).await?;
                    ack
                };
                self.pushed().await;
                return Ok(ApplyResult {
                    protocol_version: PROTOCOL_VERSION,
                    ack,
                });
            }
        };
        let cursor = doc.cursor();
        let ack = {
            let mut ledger = self.current_ledger().await?;
            let ack = match ledger.decide(&cursor) {
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
                Decision::AlreadyProcessed => match ledger.ack_of(&cursor) {
                    Some(ack) => {
                        tracing::debug!(revision = %cursor, "document already processed; acknowledged again");
                        ack.clone()
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
            };
            // Answered only once recorded: a retry after an unrecorded apply is applied
            // again (idempotent), never acknowledged from memory alone.
            self.save_ledger(&mut ledger).await?;
            ack
        };
        self.pushed().await;
        Ok(ApplyResult {
            protocol_version: PROTOCOL_VERSION,
            ack,
        })
    }

    pub(super) async fn status(&self, headers: &HeaderMap, body: Body) -> Result<StatusResult, ApiError> {
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
        // `known` as recorded (another replica may have led since); what this replica
        // holds when the record cannot be read now (polled every few seconds: no error log).
        let known = {
            let mut ledger = self.ledger.lock().await;
            if let Some(store) = &self.ledger_store {
                match store.load().await {
                    Ok(recorded) => *ledger = recorded,
                    Err(e) => {
                        tracing::debug!(error = %e, "status: the ledger could not be read; answering from memory")
                    }
                }
            }
            ledger.known().cloned()
        };
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

fn ledger_unavailable(e: StoreError) -> ApiError {
    tracing::error!(reason = e.reason(), error = %e, "the acknowledgement ledger cannot be read or recorded; nothing answered");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        error_names::SERVICE_UNAVAILABLE,
        format!(
            "{}: the agent cannot read or record its acknowledgement ledger; retry",
            e.reason()
        ),
    )
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
