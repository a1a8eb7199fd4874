//! **odoo-sim: a simulator of the Odoo control plane's side of the vWorkspace protocol.**
//! It is not Odoo and shares no code with it: it answers `vworkspace.cluster/agent_register`
//! and `vworkspace.cluster/agent_sync` exactly as `docs/connectivity/protocol.md` says the
//! Odoo module must, with Odoo 19's JSON-2 conventions (bearer API keys, the optional
//! `X-Odoo-Database` header, Odoo's error objects and HTTP statuses), so that the agent can be
//! tested end to end and an Odoo developer has a reference to compare the module with.
//!
//! * `POST /json/2/<model>/<method>`: the protocol, pull mode.
//! * Push mode, for a cluster given a push target: the simulator calls the agent's
//!   `vworkspace.agent/apply` and `/status` as the module would ([`push`]).
//! * `/sim/...`: the admin API (set intent, read reports and acknowledgements, inject
//!   faults), see [`router`]. A real Odoo has its own UI instead.
//!
//! State is in memory, and saved to a JSON file after every change when a state file is
//! given, so a restarted simulator keeps its clusters, intent, acknowledgements and reports.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use axum::{
    Json, Router,
    body::{Bytes, HttpBody as _},
    extract::{Path, RawQuery, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post, put},
};
use jiff::Timestamp;
use protocol::{
    MODEL, PROTOCOL_VERSION, ProtocolVersion,
    error::{OdooError, names},
    messages::{
        AgentInfo, ApplicationIntent, Cursor, DeletionIntent, DesiredState, DocumentAck, ObjectKind, ObjectOutcome,
        ObjectReport, ObjectState, OperationIntent, RegisterParams, RegisterResult, SyncParams, SyncResult,
    },
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub mod push;

/// Most reports accepted per sync (as a real module would cap them).
pub const MAX_REPORTS_PER_SYNC: usize = 500;
/// Acknowledgements kept per cluster.
const MAX_ACKS_KEPT: usize = 100;
/// Entries of the report log kept per cluster (oldest dropped first).
pub const REPORT_LOG_MAX: usize = 10_000;

/// One report as it arrived, in the per-cluster report log: every report received, in
/// order, where [`StoredReport`] keeps only the latest per object. For measurements
/// (`just bench-agent` reads when each state of each object arrived); a real module
/// needs no such log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReceivedReport {
    /// Position in the cluster's log (from 1, never reused).
    pub seq: u64,
    /// `Kind/namespace/name`.
    pub key: String,
    /// The reported state.
    pub state: ObjectState,
    /// The reported `resource_version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// The reported Operation phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Whether it came as part of a full resync.
    #[serde(default)]
    pub resync: bool,
    /// When the simulator received it (nanosecond precision, RFC 3339).
    pub received_at: Timestamp,
    /// The same instant in Unix milliseconds, for tools that do not parse RFC 3339.
    pub received_at_ms: i64,
}

/// Traffic of one kind of JSON-2 call, as counted by the simulator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallCounters {
    /// Calls answered.
    pub calls: u64,
    /// Calls answered with a non-2xx status.
    pub errors: u64,
    /// Request bodies (the JSON parameters), bytes.
    pub request_body_bytes: u64,
    /// Request line and headers as received (HTTP/1.1 framing), bytes.
    pub request_header_bytes: u64,
    /// Response bodies, bytes.
    pub response_body_bytes: u64,
    /// Status line and headers of the answers (HTTP/1.1 framing, including the
    /// `content-length` and `date` headers the server adds), bytes.
    pub response_header_bytes: u64,
}

impl CallCounters {
    fn add(&mut self, ok: bool, request: (u64, u64), response: (u64, u64)) {
        self.calls += 1;
        self.errors += u64::from(!ok);
        self.request_body_bytes += request.0;
        self.request_header_bytes += request.1;
        self.response_body_bytes += response.0;
        self.response_header_bytes += response.1;
    }
}

/// What the simulator counted since it started (`GET /sim/stats`): the control plane's
/// view of the load the agents put on it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SimStats {
    /// When counting started (the simulator's start).
    pub since: Timestamp,
    /// When this snapshot was taken.
    pub now: Timestamp,
    /// `agent_register` calls.
    pub register: CallCounters,
    /// `agent_sync` calls.
    pub sync: CallCounters,
    /// Of those, syncs at rest: no acknowledgement, no report, no resync marker, no
    /// error streak up, no document down.
    pub sync_at_rest: CallCounters,
    /// Any other JSON-2 call (unknown methods or models, unauthenticated calls, faults).
    pub other: CallCounters,
    /// Reports received.
    pub reports: u64,
    /// Cluster records.
    pub clusters: usize,
}

/// Marks an `agent_sync` answer that carried nothing either way (see [`SimStats`]).
#[derive(Clone, Copy, Debug)]
struct SyncAtRest;

/// A stored report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoredReport {
    /// The last report received.
    pub report: ObjectReport,
    /// When it was received.
    pub received_at: Timestamp,
    /// Marked deleted because a full resync did not include it.
    #[serde(default)]
    pub absent_after_resync: bool,
}

/// Progress of the current full resync.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ResyncProgress {
    /// Its id.
    pub id: String,
    /// Keys reported so far.
    pub seen: BTreeSet<String>,
    /// When the last batch arrived (None while in progress).
    pub completed_at: Option<Timestamp>,
    /// Completed resyncs.
    pub completed: u64,
}

/// One cluster record: what the Odoo model `vworkspace.cluster` holds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClusterRecord {
    /// Record id.
    pub id: i64,
    /// Human name (the admin's key for the record).
    pub name: String,
    /// Bound cluster UID (set by the first `agent_register`).
    pub uid: Option<String>,
    /// First registration.
    pub registered_at: Option<Timestamp>,
    /// Last call of any kind from the agent.
    pub last_seen: Option<Timestamp>,
    /// The agent as it last registered.
    pub agent: Option<AgentInfo>,
    /// The agent's allow-list as it last registered.
    pub allowed_namespaces: Vec<String>,
    /// The document sequence.
    pub epoch: String,
    /// Current revision (0: no intent yet, no document sent).
    pub revision: u64,
    /// Desired applications by `namespace/name`, with the revision that last changed them.
    pub applications: BTreeMap<String, (u64, ApplicationIntent)>,
    /// Desired operations by `namespace/name`.
    pub operations: BTreeMap<String, (u64, OperationIntent)>,
    /// Deletion intents by `Kind/namespace/name`.
    pub deletions: BTreeMap<String, (u64, DeletionIntent)>,
    /// A raw document replacing the built one (tests of malformed or empty documents).
    pub raw_document: Option<Value>,
    /// Acknowledgements, oldest first (latest per revision).
    pub acks: Vec<DocumentAck>,
    /// Reports by `Kind/namespace/name`.
    pub reports: BTreeMap<String, StoredReport>,
    /// Full resync progress.
    pub resync: ResyncProgress,
    /// Number of successful syncs.
    pub syncs: u64,
    /// The last error streak the agent reported.
    pub last_agent_error: Option<protocol::messages::AgentError>,
    /// Push mode: the agent's endpoint and how calls to it went (`None`: pull mode).
    #[serde(default)]
    pub push: Option<push::PushLink>,
    /// Every report received, oldest first, at most [`REPORT_LOG_MAX`] (not saved in the
    /// state file).
    #[serde(skip)]
    pub report_log: VecDeque<ReceivedReport>,
    /// Last `seq` of the report log.
    #[serde(skip)]
    pub report_log_seq: u64,
}

impl ClusterRecord {
    /// Records an acknowledgement (the latest per revision; the oldest dropped beyond
    /// [`MAX_ACKS_KEPT`]).
    fn store_ack(&mut self, ack: DocumentAck) {
        self.acks
            .retain(|a| !(a.epoch == ack.epoch && a.revision == ack.revision));
        self.acks.push(ack);
        let overflow = self.acks.len().saturating_sub(MAX_ACKS_KEPT);
        self.acks.drain(..overflow);
    }

    /// Stores reports received at `now`; `in_resync` counts them as seen by the full
    /// resync in progress.
    fn store_reports(&mut self, reports: Vec<ObjectReport>, in_resync: bool, now: Timestamp) {
        for report in reports {
            let key = report_key(report.kind, &report.namespace, &report.name);
            if in_resync {
                self.resync.seen.insert(key.clone());
            }
            self.report_log_seq += 1;
            if self.report_log.len() >= REPORT_LOG_MAX {
                self.report_log.pop_front();
            }
            self.report_log.push_back(ReceivedReport {
                seq: self.report_log_seq,
                key: key.clone(),
                state: report.state,
                resource_version: report.resource_version.clone(),
                phase: report.phase.clone(),
                resync: in_resync,
                received_at: now,
                received_at_ms: now.as_millisecond(),
            });
            self.reports.insert(
                key,
                StoredReport {
                    report,
                    received_at: now,
                    absent_after_resync: false,
                },
            );
        }
    }

    /// Ends a full resync: every object not reported during it is marked deleted.
    fn complete_resync(&mut self, now: Timestamp) {
        for (key, stored) in self.reports.iter_mut() {
            if !self.resync.seen.contains(key) && stored.report.state != ObjectState::Deleted {
                stored.report.state = ObjectState::Deleted;
                stored.absent_after_resync = true;
                stored.received_at = now;
            }
        }
        self.resync.completed_at = Some(now);
        self.resync.completed += 1;
    }
}

/// Everything persisted.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SimState {
    /// Records by name.
    pub clusters: BTreeMap<String, ClusterRecord>,
    /// API key → cluster name. Never shown by the admin API.
    keys: BTreeMap<String, String>,
    /// Cluster name → push target (with its token). Never shown by the admin API.
    #[serde(default)]
    push_targets: BTreeMap<String, push::PushTarget>,
    next_id: i64,
}

/// Faults to inject.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Fault {
    /// Normal service.
    #[default]
    None,
    /// 503 with an HTML body, as a reverse proxy in front of a stopped Odoo answers.
    Unavailable,
    /// 500 with Odoo's error object.
    ServerError,
    /// No answer for `seconds`.
    Hang {
        /// How long.
        seconds: u64,
    },
    /// 200 with a body that is not JSON.
    Malformed,
    /// 200 with a JSON body of `bytes` bytes.
    Oversize {
        /// Size of the answer.
        bytes: usize,
    },
}

/// Simulator settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Save state here after every change.
    pub state_file: Option<PathBuf>,
    /// When set, `X-Odoo-Database` must be absent or equal.
    pub database: Option<String>,
    /// Suggested sync interval sent at registration.
    pub sync_interval_seconds: Option<u32>,
    /// An agent not seen for this long is shown `offline`.
    pub offline_after: Duration,
}

/// The simulator. Cheap to clone.
#[derive(Clone)]
pub struct Sim {
    state: Arc<Mutex<SimState>>,
    fault: Arc<Mutex<Fault>>,
    config: Arc<SimConfig>,
    stats: Arc<Mutex<SimStats>>,
    /// Bumped on every change of intent or push target: wakes the push drivers.
    changes: Arc<tokio::sync::watch::Sender<u64>>,
}

/// Error of the admin API.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Unknown cluster.
    #[error("no cluster named {0:?}")]
    NoCluster(String),
    /// Name or key taken.
    #[error("{0}")]
    Conflict(String),
    /// Bad input.
    #[error("{0}")]
    BadRequest(String),
    /// State file.
    #[error("cannot load the state file: {0}")]
    Io(String),
}

impl IntoResponse for SimError {
    fn into_response(self) -> Response {
        let status = match &self {
            SimError::NoCluster(_) => StatusCode::NOT_FOUND,
            SimError::Conflict(_) => StatusCode::CONFLICT,
            SimError::BadRequest(_) => StatusCode::BAD_REQUEST,
            SimError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, Json(json!({"error": self.to_string()}))).into_response()
    }
}

fn odoo_error(status: StatusCode, name: &str, message: &str) -> Response {
    let with_status = name.starts_with("werkzeug.").then_some(status.as_u16());
    let mut body = OdooError::new(name, message, with_status);
    body.debug = format!("Traceback (most recent call last):\n  (odoo-sim)\n{name}: {message}\n");
    (
        status,
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        serde_json::to_string(&body).unwrap_or_default(),
    )
        .into_response()
}

fn json_ok(value: &impl Serialize) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        serde_json::to_string(value).unwrap_or_default(),
    )
        .into_response()
}

fn report_key(kind: ObjectKind, namespace: &str, name: &str) -> String {
    format!("{}/{namespace}/{name}", kind.as_str())
}

fn new_epoch() -> String {
    format!("sim-{}", Timestamp::now().as_millisecond())
}

impl Sim {
    /// A simulator, loading the state file if it exists.
    pub fn new(config: SimConfig) -> Result<Self, SimError> {
        let state = match &config.state_file {
            Some(path) if path.exists() => {
                let text = std::fs::read_to_string(path).map_err(|e| SimError::Io(e.to_string()))?;
                serde_json::from_str(&text).map_err(|e| SimError::Io(e.to_string()))?
            }
            _ => SimState::default(),
        };
        Ok(Self {
            state: Arc::new(Mutex::new(state)),
            fault: Arc::new(Mutex::new(Fault::None)),
            config: Arc::new(config),
            changes: Arc::new(tokio::sync::watch::Sender::new(0)),
            stats: Arc::new(Mutex::new(SimStats {
                since: Timestamp::now(),
                now: Timestamp::now(),
                register: CallCounters::default(),
                sync: CallCounters::default(),
                sync_at_rest: CallCounters::default(),
                other: CallCounters::default(),
                reports: 0,
                clusters: 0,
            })),
        })
    }

    /// What the simulator counted so far.
    pub fn stats(&self) -> SimStats {
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner).clone();
        stats.now = Timestamp::now();
        stats.clusters = self.lock().clusters.len();
        stats
    }

    fn count(&self, method: &str, request: (u64, u64), response: &Response) {
        let ok = response.status().is_success();
        let body = response.body().size_hint().exact().unwrap_or_default();
        let headers = response_header_bytes(response, body);
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        let counters = match method {
            protocol::METHOD_REGISTER => &mut stats.register,
            protocol::METHOD_SYNC => &mut stats.sync,
            _ => &mut stats.other,
        };
        counters.add(ok, request, (body, headers));
        if response.extensions().get::<SyncAtRest>().is_some() {
            stats.sync_at_rest.add(ok, request, (body, headers));
        }
    }

    fn count_reports(&self, n: usize) {
        self.stats.lock().unwrap_or_else(PoisonError::into_inner).reports += n as u64;
    }

    /// The report log of a cluster: entries with `seq > after`.
    pub fn report_log(&self, cluster: &str, after: u64) -> Result<Vec<ReceivedReport>, SimError> {
        let s = self.lock();
        let r = s
            .clusters
            .get(cluster)
            .ok_or_else(|| SimError::NoCluster(cluster.to_owned()))?;
        Ok(r.report_log.iter().filter(|e| e.seq > after).cloned().collect())
    }

    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn save(&self, state: &SimState) {
        let Some(path) = &self.config.state_file else { return };
        let tmp = path.with_extension("tmp");
        let written = serde_json::to_vec_pretty(state)
            .map_err(std::io::Error::other)
            .and_then(|bytes| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            tracing::error!(path = %path.display(), error = %e, "cannot save the state file");
        }
    }

    /// Creates a cluster record with its API key.
    pub fn add_cluster(&self, name: &str, api_key: &str) -> Result<(), SimError> {
        self.add_clusters(&[(name.to_owned(), api_key.to_owned())]).map(|_| ())
    }

    /// Creates many cluster records with their API keys at once (one state file write):
    /// all of them, or none when a name or key is taken, empty or repeated.
    pub fn add_clusters(&self, clusters: &[(String, String)]) -> Result<usize, SimError> {
        let mut s = self.lock();
        let mut names = BTreeSet::new();
        let mut keys = BTreeSet::new();
        for (name, api_key) in clusters {
            let key = api_key.trim();
            if s.clusters.contains_key(name) || !names.insert(name.as_str()) {
                return Err(SimError::Conflict(format!("cluster {name:?} exists")));
            }
            if key.is_empty() || s.keys.contains_key(key) || !keys.insert(key) {
                return Err(SimError::Conflict("API key empty or already in use".into()));
            }
        }
        for (name, api_key) in clusters {
            s.next_id += 1;
            let record = ClusterRecord {
                id: s.next_id,
                name: name.clone(),
                epoch: new_epoch(),
                ..Default::default()
            };
            s.clusters.insert(name.clone(), record);
            s.keys.insert(api_key.trim().to_owned(), name.clone());
        }
        self.save(&s);
        Ok(clusters.len())
    }

    /// Changes a cluster's intent (and bumps its revision).
    pub fn edit(&self, cluster: &str, f: impl FnOnce(&mut ClusterRecord, u64)) -> Result<u64, SimError> {
        let mut s = self.lock();
        let record = s
            .clusters
            .get_mut(cluster)
            .ok_or_else(|| SimError::NoCluster(cluster.to_owned()))?;
        let revision = record.revision + 1;
        f(record, revision);
        record.revision = revision;
        self.save(&s);
        drop(s);
        self.changed();
        Ok(revision)
    }

    /// Sets the fault mode.
    pub fn set_fault(&self, fault: Fault) {
        *self.fault.lock().unwrap_or_else(PoisonError::into_inner) = fault;
    }

    fn document(record: &ClusterRecord) -> Option<Value> {
        if record.revision == 0 {
            return None;
        }
        if let Some(raw) = &record.raw_document {
            let mut raw = raw.clone();
            if let Some(obj) = raw.as_object_mut() {
                obj.entry("epoch").or_insert_with(|| json!(record.epoch));
                obj.entry("revision").or_insert_with(|| json!(record.revision));
            }
            return Some(raw);
        }
        let doc = DesiredState {
            epoch: record.epoch.clone(),
            revision: record.revision,
            generated_at: Some(Timestamp::now()),
            applications: record.applications.values().map(|(_, a)| a.clone()).collect(),
            operations: record.operations.values().map(|(_, o)| o.clone()).collect(),
            deletions: record.deletions.values().map(|(_, d)| d.clone()).collect(),
        };
        serde_json::to_value(doc).ok()
    }

    /// The cluster of the bearer key, if the key is known.
    fn authenticate(&self, headers: &HeaderMap) -> Option<String> {
        let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
        let (scheme, key) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.lock().keys.get(key.trim()).cloned()
    }

    fn register(&self, cluster: &str, params: RegisterParams) -> Response {
        let mut s = self.lock();
        let Some(record) = s.clusters.get_mut(cluster) else {
            return odoo_error(StatusCode::UNAUTHORIZED, names::UNAUTHORIZED, "Invalid apikey");
        };
        let now = Timestamp::now();
        record.last_seen = Some(now);
        if let Some(uid) = &record.uid
            && *uid != params.cluster.uid
        {
            let message = format!("this API key belongs to cluster {} (uid {uid})", record.name);
            return odoo_error(StatusCode::FORBIDDEN, names::CLUSTER_MISMATCH, &message);
        }
        record.uid = Some(params.cluster.uid.clone());
        record.registered_at.get_or_insert(now);
        record.agent = Some(params.agent);
        record.allowed_namespaces = params.allowed_namespaces;
        let result = RegisterResult {
            protocol_version: PROTOCOL_VERSION,
            cluster_id: record.id,
            server_time: now,
            sync_interval_seconds: self.config.sync_interval_seconds,
            max_reports_per_sync: Some(MAX_REPORTS_PER_SYNC as u32),
        };
        self.save(&s);
        json_ok(&result)
    }

    fn sync(&self, cluster: &str, params: SyncParams) -> Response {
        let mut s = self.lock();
        let Some(record) = s.clusters.get_mut(cluster) else {
            return odoo_error(StatusCode::UNAUTHORIZED, names::UNAUTHORIZED, "Invalid apikey");
        };
        let now = Timestamp::now();
        record.last_seen = Some(now);
        let Some(uid) = record.uid.clone() else {
            return odoo_error(
                StatusCode::NOT_FOUND,
                names::CLUSTER_NOT_REGISTERED,
                "call agent_register first",
            );
        };
        if uid != params.cluster_uid {
            let message = format!("this API key belongs to cluster {} (uid {uid})", record.name);
            return odoo_error(StatusCode::FORBIDDEN, names::CLUSTER_MISMATCH, &message);
        }
        if params.reports.len() > MAX_REPORTS_PER_SYNC {
            let message = format!(
                "reports: at most {MAX_REPORTS_PER_SYNC} reports per call (got {})",
                params.reports.len()
            );
            return odoo_error(StatusCode::UNPROCESSABLE_ENTITY, names::INVALID_PARAMS, &message);
        }
        let acks_received = params.acks.len();
        for ack in params.acks {
            record.store_ack(ack);
        }
        if let Some(marker) = &params.resync
            && (marker.id != record.resync.id || marker.batch == 0)
        {
            record.resync.id = marker.id.clone();
            record.resync.seen.clear();
            record.resync.completed_at = None;
        }
        let reports_received = params.reports.len();
        record.store_reports(params.reports, params.resync.is_some(), now);
        if let Some(marker) = &params.resync
            && marker.last_batch
        {
            record.complete_resync(now);
        }
        let carried_nothing_up =
            reports_received == 0 && acks_received == 0 && params.resync.is_none() && params.last_error.is_none();
        if params.last_error.is_some() {
            record.last_agent_error = params.last_error;
        }
        record.syncs += 1;
        let current = Cursor {
            epoch: record.epoch.clone(),
            revision: record.revision,
        };
        let desired = if params.known.as_ref() == Some(&current) {
            None
        } else {
            Self::document(record)
        };
        self.save(&s);
        let mut result = serde_json::to_value(SyncResult {
            protocol_version: PROTOCOL_VERSION,
            server_time: now,
            desired: None,
            resync_requested: false,
            next_sync_seconds: None,
        })
        .unwrap_or_default();
        let at_rest = carried_nothing_up && desired.is_none();
        if let Some(d) = desired {
            // Raw documents may deliberately not parse as a DesiredState.
            result["desired"] = d;
        }
        drop(s);
        self.count_reports(reports_received);
        let mut response = json_ok(&result);
        if at_rest {
            response.extensions_mut().insert(SyncAtRest);
        }
        response
    }

    async fn json2(&self, model: &str, method: &str, headers: &HeaderMap, body: &Bytes) -> Response {
        let fault = self.fault.lock().unwrap_or_else(PoisonError::into_inner).clone();
        match fault {
            Fault::None => {}
            Fault::Unavailable => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::CONTENT_TYPE, "text/html")],
                    "<html><body><h1>503 Service Unavailable</h1></body></html>",
                )
                    .into_response();
            }
            Fault::ServerError => {
                return odoo_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "psycopg2.OperationalError",
                    "internal server error",
                );
            }
            Fault::Hang { seconds } => tokio::time::sleep(Duration::from_secs(seconds)).await,
            Fault::Malformed => {
                return (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    "{\"protocol_version\": \"1.0\", \"desired\": ",
                )
                    .into_response();
            }
            Fault::Oversize { bytes } => {
                let filler = "x".repeat(bytes);
                return json_ok(&json!({"protocol_version": "1.0", "filler": filler}));
            }
        }
        if let (Some(want), Some(got)) = (
            &self.config.database,
            headers.get("x-odoo-database").and_then(|v| v.to_str().ok()),
        ) && want != got
        {
            return odoo_error(
                StatusCode::NOT_FOUND,
                names::NOT_FOUND,
                &format!("database {got:?} not found"),
            );
        }
        let Some(cluster) = self.authenticate(headers) else {
            return odoo_error(StatusCode::UNAUTHORIZED, names::UNAUTHORIZED, "Invalid apikey");
        };
        if model != MODEL {
            return odoo_error(
                StatusCode::NOT_FOUND,
                names::NOT_FOUND,
                &format!("the model {model:?} does not exist"),
            );
        }
        let params: Value = match serde_json::from_slice(body) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => {
                return odoo_error(
                    StatusCode::BAD_REQUEST,
                    names::BAD_REQUEST,
                    "could not parse the body, expecting a json object",
                );
            }
            Err(e) => {
                return odoo_error(
                    StatusCode::BAD_REQUEST,
                    names::BAD_REQUEST,
                    &format!("could not parse the body as json: {e}"),
                );
            }
        };
        let version = params
            .get("protocol_version")
            .and_then(Value::as_str)
            .and_then(|v| v.parse::<ProtocolVersion>().ok());
        if let Some(v) = version
            && !v.is_compatible_with(PROTOCOL_VERSION)
        {
            let message = format!(
                "protocol version {v} is not supported; this server speaks {}.x",
                PROTOCOL_VERSION.major
            );
            return odoo_error(
                StatusCode::UNPROCESSABLE_ENTITY,
                names::PROTOCOL_VERSION_MISMATCH,
                &message,
            );
        }
        let unprocessable = |e: serde_json::Error| {
            odoo_error(
                StatusCode::UNPROCESSABLE_ENTITY,
                names::UNPROCESSABLE_ENTITY,
                &format!("{method}() got invalid arguments: {e}"),
            )
        };
        match method {
            protocol::METHOD_REGISTER => match serde_json::from_value(params) {
                Ok(p) => self.register(&cluster, p),
                Err(e) => unprocessable(e),
            },
            protocol::METHOD_SYNC => match serde_json::from_value(params) {
                Ok(p) => self.sync(&cluster, p),
                Err(e) => unprocessable(e),
            },
            other => odoo_error(
                StatusCode::NOT_FOUND,
                names::NOT_FOUND,
                &format!("The method '{other}' does not exist on the model '{MODEL}'"),
            ),
        }
    }

    /// The admin view of one cluster, with a per-object summary computed the way the Odoo
    /// module is expected to (docs/connectivity/protocol.md, "Reading status in Odoo").
    pub fn view(&self, name: &str) -> Result<Value, SimError> {
        let s = self.lock();
        let r = s
            .clusters
            .get(name)
            .ok_or_else(|| SimError::NoCluster(name.to_owned()))?;
        Ok(view(r, self.config.offline_after))
    }
}

fn latest_ack_for<'a>(
    r: &'a ClusterRecord,
    kind: ObjectKind,
    ns: &str,
    name: &str,
) -> Option<(u64, &'a protocol::ObjectAck)> {
    r.acks.iter().filter(|a| a.epoch == r.epoch).rev().find_map(|a| {
        a.objects
            .iter()
            .find(|o| o.kind == kind && o.namespace == ns && o.name == name)
            .map(|o| (a.revision, o))
    })
}

/// Summary per object: the distinctions the control plane must make.
fn object_summary(r: &ClusterRecord, kind: ObjectKind, ns: &str, name: &str, changed_at: u64, offline: bool) -> Value {
    let ack = latest_ack_for(r, kind, ns, name).filter(|(rev, _)| *rev >= changed_at);
    let report = r.reports.get(&report_key(kind, ns, name));
    let generation_ok = match (ack, report) {
        (Some((_, a)), Some(rep)) => a.generation.is_none() || rep.report.generation >= a.generation,
        _ => false,
    };
    let status = if offline {
        "agent_offline".to_owned()
    } else if let Some((_, a)) = ack {
        match a.outcome {
            ObjectOutcome::Refused => "refused".to_owned(),
            ObjectOutcome::Failed => "apply_failed".to_owned(),
            _ => match report.map(|r| (r.report.state, r.report.observed_generation == r.report.generation)) {
                Some((ObjectState::Ready, true)) if generation_ok => "ready".to_owned(),
                Some((ObjectState::Succeeded, _)) => "succeeded".to_owned(),
                Some((ObjectState::Failed, _)) => "failed".to_owned(),
                Some((ObjectState::Expired, _)) => "expired".to_owned(),
                Some((ObjectState::Deleted, _)) => "deleted".to_owned(),
                Some(_) | None => "applied_not_ready".to_owned(),
            },
        }
    } else {
        "not_acknowledged".to_owned()
    };
    json!({
        "kind": kind.as_str(), "namespace": ns, "name": name,
        "intent_revision": changed_at,
        "status": status,
        "ack": ack.map(|(rev, a)| json!({"revision": rev, "outcome": a.outcome, "reason": a.reason, "message": a.message, "conflict": a.conflict})),
        "report": report,
    })
}

fn view(r: &ClusterRecord, offline_after: Duration) -> Value {
    let now = Timestamp::now();
    let offline = r
        .last_seen
        .is_none_or(|t| now.duration_since(t).as_secs_f64() > offline_after.as_secs_f64());
    let acknowledged = r.acks.iter().filter(|a| a.epoch == r.epoch).map(|a| a.revision).max();
    let mut objects = Vec::new();
    for (rev, a) in r.applications.values() {
        objects.push(object_summary(
            r,
            ObjectKind::ApplicationInstance,
            &a.namespace,
            &a.name,
            *rev,
            offline,
        ));
    }
    for (rev, o) in r.operations.values() {
        objects.push(object_summary(
            r,
            ObjectKind::Operation,
            &o.namespace,
            &o.name,
            *rev,
            offline,
        ));
    }
    for (rev, d) in r.deletions.values() {
        objects.push(object_summary(r, d.kind, &d.namespace, &d.name, *rev, offline));
    }
    json!({
        "simulator": "odoo-sim (not Odoo)",
        "id": r.id,
        "name": r.name,
        "uid": r.uid,
        "registered_at": r.registered_at,
        "last_seen": r.last_seen,
        "agent_online": !offline,
        "agent": r.agent,
        "allowed_namespaces": r.allowed_namespaces,
        "cursor": {"epoch": r.epoch, "revision": r.revision},
        "acknowledged_revision": acknowledged,
        "intent_acknowledged": r.revision == 0 || acknowledged == Some(r.revision),
        "mode": if r.push.is_some() { "push" } else { "pull" },
        "push": r.push,
        "syncs": r.syncs,
        "last_agent_error": r.last_agent_error,
        "resync": {"id": r.resync.id, "completed_at": r.resync.completed_at, "completed": r.resync.completed},
        "objects": objects,
        "reports": r.reports,
        "acks": r.acks,
        "raw_document": r.raw_document,
    })
}

async fn json2_handler(
    State(sim): State<Sim>,
    Path((model, method)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let response = sim.json2(&model, &method, &headers, &body).await;
    tracing::info!(%model, %method, status = response.status().as_u16(), "json-2 call");
    let request_line = format!("POST {} HTTP/1.1\r\n", protocol::json2_path(&model, &method)).len();
    let request = (body.len() as u64, (request_line + header_bytes(&headers)) as u64);
    sim.count(if model == MODEL { &method } else { "" }, request, &response);
    response
}

/// Bytes of HTTP/1.1 header lines (`name: value\r\n` each, and the blank line).
fn header_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum::<usize>()
        + 2
}

/// Status line and headers of an answer as hyper writes it: the response's own headers
/// plus the `content-length` and `date` it adds.
fn response_header_bytes(response: &Response, body: u64) -> u64 {
    let reason = response.status().canonical_reason().unwrap_or_default();
    let status_line = format!("HTTP/1.1 {} {reason}\r\n", response.status().as_u16()).len();
    let mut bytes = status_line + header_bytes(response.headers());
    if !response.headers().contains_key(header::CONTENT_LENGTH) {
        bytes += format!("content-length: {body}\r\n").len();
    }
    if !response.headers().contains_key(header::DATE) {
        bytes += "date: Sat, 21 Nov 2026 10:00:00 GMT\r\n".len();
    }
    bytes as u64
}

async fn json2_other() -> Response {
    odoo_error(
        StatusCode::NOT_FOUND,
        names::NOT_FOUND,
        "Did you mean POST /json/2/<model>/<method>?",
    )
}

#[derive(Deserialize)]
struct NewCluster {
    name: String,
    api_key: String,
}

/// One record (`{"name", "api_key"}`), or many at once (an array of them).
#[derive(Deserialize)]
#[serde(untagged)]
enum NewClusters {
    One(NewCluster),
    Many(Vec<NewCluster>),
}

async fn add_cluster(State(sim): State<Sim>, Json(c): Json<NewClusters>) -> Result<Response, SimError> {
    match c {
        NewClusters::One(c) => {
            sim.add_cluster(&c.name, &c.api_key)?;
            Ok((StatusCode::CREATED, Json(json!({"name": c.name}))).into_response())
        }
        NewClusters::Many(list) => {
            let pairs: Vec<(String, String)> = list.into_iter().map(|c| (c.name, c.api_key)).collect();
            let created = sim.add_clusters(&pairs)?;
            Ok((StatusCode::CREATED, Json(json!({"created": created}))).into_response())
        }
    }
}

async fn get_stats(State(sim): State<Sim>) -> Json<SimStats> {
    Json(sim.stats())
}

async fn get_report_log(
    State(sim): State<Sim>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, SimError> {
    let after = match query
        .as_deref()
        .and_then(|q| q.split('&').find_map(|p| p.strip_prefix("after=")))
    {
        Some(n) => n
            .parse()
            .map_err(|_| SimError::BadRequest(format!("after={n}: expected a number")))?,
        None => 0,
    };
    let entries = sim.report_log(&name, after)?;
    Ok(Json(json!({"cluster": name, "entries": entries})))
}

async fn list_clusters(State(sim): State<Sim>) -> Json<Value> {
    let s = sim.lock();
    Json(json!(
        s.clusters
            .values()
            .map(|r| json!({"name": r.name, "id": r.id, "uid": r.uid,
        "last_seen": r.last_seen, "revision": r.revision}))
            .collect::<Vec<_>>()
    ))
}

async fn get_cluster(State(sim): State<Sim>, Path(name): Path<String>) -> Result<Json<Value>, SimError> {
    Ok(Json(sim.view(&name)?))
}

fn revision_response(revision: u64) -> Response {
    Json(json!({"revision": revision})).into_response()
}

async fn put_application(
    State(sim): State<Sim>,
    Path((cluster, ns, name)): Path<(String, String, String)>,
    Json(spec): Json<Value>,
) -> Result<Response, SimError> {
    let spec: api::ApplicationInstanceSpec =
        serde_json::from_value(spec).map_err(|e| SimError::BadRequest(format!("spec: {e}")))?;
    let key = format!("{ns}/{name}");
    let rev = sim.edit(&cluster, |r, rev| {
        r.deletions
            .remove(&report_key(ObjectKind::ApplicationInstance, &ns, &name));
        r.applications.insert(
            key,
            (
                rev,
                ApplicationIntent {
                    namespace: ns.clone(),
                    name: name.clone(),
                    spec,
                },
            ),
        );
    })?;
    Ok(revision_response(rev))
}

async fn delete_application(
    State(sim): State<Sim>,
    Path((cluster, ns, name)): Path<(String, String, String)>,
) -> Result<Response, SimError> {
    let rev = sim.edit(&cluster, |r, rev| {
        r.applications.remove(&format!("{ns}/{name}"));
        let key = report_key(ObjectKind::ApplicationInstance, &ns, &name);
        let uid = r.reports.get(&key).and_then(|s| s.report.uid.clone());
        r.deletions.insert(
            key,
            (
                rev,
                DeletionIntent {
                    kind: ObjectKind::ApplicationInstance,
                    namespace: ns.clone(),
                    name: name.clone(),
                    uid,
                    reason: Some("deleted in the control plane (odoo-sim admin)".into()),
                },
            ),
        );
    })?;
    Ok(revision_response(rev))
}

async fn put_operation(
    State(sim): State<Sim>,
    Path((cluster, ns, name)): Path<(String, String, String)>,
    Json(spec): Json<Value>,
) -> Result<Response, SimError> {
    let spec: api::OperationSpec =
        serde_json::from_value(spec).map_err(|e| SimError::BadRequest(format!("spec: {e}")))?;
    let rev = sim.edit(&cluster, |r, rev| {
        r.operations.insert(
            format!("{ns}/{name}"),
            (
                rev,
                OperationIntent {
                    namespace: ns.clone(),
                    name: name.clone(),
                    spec,
                },
            ),
        );
    })?;
    Ok(revision_response(rev))
}

async fn post_deletion(
    State(sim): State<Sim>,
    Path(cluster): Path<String>,
    Json(del): Json<DeletionIntent>,
) -> Result<Response, SimError> {
    let rev = sim.edit(&cluster, |r, rev| {
        let key = report_key(del.kind, &del.namespace, &del.name);
        let desired = format!("{}/{}", del.namespace, del.name);
        match del.kind {
            ObjectKind::ApplicationInstance => {
                r.applications.remove(&desired);
            }
            ObjectKind::Operation => {
                r.operations.remove(&desired);
            }
        }
        r.deletions.insert(key, (rev, del));
    })?;
    Ok(revision_response(rev))
}

async fn put_document(
    State(sim): State<Sim>,
    Path(cluster): Path<String>,
    Json(raw): Json<Value>,
) -> Result<Response, SimError> {
    let rev = sim.edit(&cluster, |r, _| {
        r.raw_document = (!raw.is_null()).then_some(raw);
    })?;
    Ok(revision_response(rev))
}

async fn reset_intent(State(sim): State<Sim>, Path(cluster): Path<String>) -> Result<Response, SimError> {
    let rev = sim.edit(&cluster, |r, _| {
        r.applications.clear();
        r.operations.clear();
        r.deletions.clear();
        r.raw_document = None;
    })?;
    Ok(revision_response(rev))
}

async fn put_push_target(
    State(sim): State<Sim>,
    Path(cluster): Path<String>,
    Json(target): Json<push::PushTarget>,
) -> Result<Response, SimError> {
    tracing::info!(%cluster, url = %target.url, "push target set: the simulator now calls the agent");
    sim.set_push_target(&cluster, Some(target))?;
    Ok(Json(json!({"cluster": cluster, "mode": "push"})).into_response())
}

async fn delete_push_target(State(sim): State<Sim>, Path(cluster): Path<String>) -> Result<Response, SimError> {
    sim.set_push_target(&cluster, None)?;
    Ok(Json(json!({"cluster": cluster, "mode": "pull"})).into_response())
}

async fn put_fault(State(sim): State<Sim>, Json(fault): Json<Fault>) -> Json<Value> {
    tracing::warn!(?fault, "fault mode set");
    sim.set_fault(fault.clone());
    Json(json!({"fault": fault}))
}

/// The simulator's HTTP API.
///
/// | Route | What |
/// |---|---|
/// | `POST /json/2/{model}/{method}` | the protocol (JSON-2) |
/// | `GET /sim/health` | `ok` |
/// | `POST /sim/clusters` `{"name", "api_key"}` (or an array of them) | create cluster records and their API keys |
/// | `GET /sim/clusters`, `GET /sim/clusters/{name}` | records; one record with reports, acks and a per-object summary |
/// | `GET /sim/clusters/{name}/report-log[?after=SEQ]` | every report received, in order, with its receive time ([`ReceivedReport`]) |
/// | `GET /sim/stats` | calls, errors and bytes counted per method, syncs at rest ([`SimStats`]) |
/// | `PUT /sim/clusters/{name}/applications/{ns}/{app}` (spec) | desired ApplicationInstance |
/// | `DELETE /sim/clusters/{name}/applications/{ns}/{app}` | remove it and add a deletion intent |
/// | `PUT /sim/clusters/{name}/operations/{ns}/{op}` (spec) | desired Operation |
/// | `POST /sim/clusters/{name}/deletions` (a deletion intent) | explicit deletion of anything |
/// | `PUT /sim/clusters/{name}/document` (raw JSON, `null` to clear) | send this document instead |
/// | `POST /sim/clusters/{name}/reset-intent` | empty intent (no deletions): the next document is empty |
/// | `PUT /sim/clusters/{name}/push` `{"url", "token", "ca_file"?, "client_identity_file"?, "poll_seconds"?}` | push mode: the simulator calls the agent's endpoint ([`push`]; needs [`push::drive`] running, as `odoo-sim serve` does) |
/// | `DELETE /sim/clusters/{name}/push` | back to pull mode |
/// | `PUT /sim/fault` `{"mode": "none" / "unavailable" / "server_error" / "hang" (seconds) / "malformed" / "oversize" (bytes)}` | inject faults |
pub fn router(sim: Sim) -> Router {
    Router::new()
        .route("/json/2/{model}/{method}", post(json2_handler).fallback(json2_other))
        .route("/json/2", axum::routing::any(json2_other))
        .route("/sim/health", get(|| async { "ok" }))
        .route("/sim/clusters", post(add_cluster).get(list_clusters))
        .route("/sim/clusters/{name}", get(get_cluster))
        .route("/sim/clusters/{name}/report-log", get(get_report_log))
        .route("/sim/stats", get(get_stats))
        .route(
            "/sim/clusters/{name}/applications/{ns}/{app}",
            put(put_application).delete(delete_application),
        )
        .route("/sim/clusters/{name}/operations/{ns}/{op}", put(put_operation))
        .route("/sim/clusters/{name}/deletions", post(post_deletion))
        .route("/sim/clusters/{name}/document", put(put_document))
        .route("/sim/clusters/{name}/reset-intent", post(reset_intent))
        .route(
            "/sim/clusters/{name}/push",
            put(put_push_target).delete(delete_push_target),
        )
        .route("/sim/fault", put(put_fault))
        .with_state(sim)
}

#[cfg(test)]
mod tests;
