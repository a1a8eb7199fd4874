//! **odoo-sim: a simulator of the Odoo control plane's side of the vWorkspace protocol.**
//! It is not Odoo and shares no code with it: it answers `vworkspace.cluster/agent_register`
//! and `vworkspace.cluster/agent_sync` exactly as `docs/connectivity/protocol.md` says the
//! Odoo module must, with Odoo 19's JSON-2 conventions (bearer API keys, the optional
//! `X-Odoo-Database` header, Odoo's error objects and HTTP statuses), so that the agent can be
//! tested end to end and an Odoo developer has a reference to compare the module with.
//!
//! * `POST /json/2/<model>/<method>`: the protocol, pull mode ([`json2`]).
//! * Push mode, for a cluster given a push target: the simulator calls the agent's
//!   `vworkspace.agent/apply` and `/status` as the module would ([`push`]).
//! * `/sim/...`: the admin API (set intent, read reports and acknowledgements, inject
//!   faults), see [`router`] ([`admin`], [`views`], [`stats`]). A real Odoo has its own UI
//!   instead.
//!
//! State ([`state`]) is in memory. With a state file it is loaded at start and saved by a
//! background writer soon after every change, off the request path ([`persist`]), so a
//! simulator restarted after a graceful stop keeps its clusters, intent,
//! acknowledgements and reports.

#![warn(missing_docs)]

use std::{
    collections::BTreeSet,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use axum::{
    Json, Router,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post, put},
};
use jiff::Timestamp;
use serde_json::json;

pub mod admin;
pub mod json2;
pub mod persist;
pub mod push;
pub mod state;
pub mod stats;
pub mod views;

pub use json2::{Fault, MAX_REPORTS_PER_SYNC};
pub use state::{ClusterRecord, REPORT_LOG_MAX, ReceivedReport, ResyncProgress, SimState, StoredReport};
pub use stats::{CallCounters, SimStats};

use crate::{persist::StateWriter, state::new_epoch};

/// Simulator settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Keep state in this file: loaded at start, saved in the background soon after every
    /// change ([`persist`]).
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
    /// Saves the state file in the background (`None`: no state file).
    writer: Option<Arc<StateWriter>>,
    /// Most reports accepted per `agent_sync` now ([`MAX_REPORTS_PER_SYNC`] at start); a
    /// module's administrator may lower it at any time.
    report_limit: Arc<std::sync::atomic::AtomicUsize>,
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
    /// The state file cannot be written.
    #[error("cannot save the state file: {0}")]
    Save(String),
}

impl IntoResponse for SimError {
    fn into_response(self) -> Response {
        let status = match &self {
            SimError::NoCluster(_) => StatusCode::NOT_FOUND,
            SimError::Conflict(_) => StatusCode::CONFLICT,
            SimError::BadRequest(_) => StatusCode::BAD_REQUEST,
            SimError::Io(_) | SimError::Save(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, Json(json!({"error": self.to_string()}))).into_response()
    }
}

impl Sim {
    /// A simulator, loading the state file if it exists and starting its background
    /// writer (which needs a Tokio runtime).
    pub fn new(config: SimConfig) -> Result<Self, SimError> {
        let state = match &config.state_file {
            Some(path) => persist::load(path)?,
            None => SimState::default(),
        };
        let state = Arc::new(Mutex::new(state));
        let writer = match &config.state_file {
            Some(path) => {
                let shared = state.clone();
                let snapshot: persist::Snapshot = Box::new(move || {
                    serde_json::to_vec_pretty(&*shared.lock().unwrap_or_else(PoisonError::into_inner))
                });
                Some(Arc::new(StateWriter::spawn(
                    path.clone(),
                    persist::COALESCE_DELAY,
                    snapshot,
                )?))
            }
            None => None,
        };
        Ok(Self {
            state,
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
            writer,
            report_limit: Arc::new(std::sync::atomic::AtomicUsize::new(MAX_REPORTS_PER_SYNC)),
        })
    }

    /// Changes the most reports accepted per `agent_sync` (at least 1): a call carrying
    /// more is refused `422`, and every answer announces the limit (`max_reports_per_sync`).
    pub fn set_max_reports_per_sync(&self, limit: usize) {
        self.report_limit
            .store(limit.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    /// The most reports accepted per `agent_sync` now.
    pub fn max_reports_per_sync(&self) -> usize {
        self.report_limit.load(std::sync::atomic::Ordering::Relaxed)
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

    /// Has the state saved soon, by the background writer (nothing without a state file).
    fn schedule_save(&self) {
        if let Some(writer) = &self.writer {
            writer.mark();
        }
    }

    /// Waits until every change made so far is in the state file (nothing to wait for
    /// without one).
    pub async fn flush(&self) -> Result<(), SimError> {
        match &self.writer {
            Some(writer) => writer.flush().await,
            None => Ok(()),
        }
    }

    /// Saves what is pending at once and stops the background writer: the last call
    /// before the process exits (`odoo-sim serve` makes it on SIGTERM and ctrl-c).
    pub async fn shutdown(&self) -> Result<(), SimError> {
        match &self.writer {
            Some(writer) => writer.shutdown().await,
            None => Ok(()),
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
        self.schedule_save();
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
        self.schedule_save();
        drop(s);
        self.changed();
        Ok(revision)
    }

    /// Sets the fault mode.
    pub fn set_fault(&self, fault: Fault) {
        *self.fault.lock().unwrap_or_else(PoisonError::into_inner) = fault;
    }
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
/// | `PUT /sim/fault` `{"mode": "none" / "unavailable" / "server_error" / "hang" (seconds) / "malformed" / "oversize" (bytes) / "no_kwargs" / "committed_then_late" (seconds) / "concurrent_insert" / "body_limit" (bytes) / "drop_ack"}` | inject faults |
pub fn router(sim: Sim) -> Router {
    Router::new()
        .route(
            "/json/2/{model}/{method}",
            post(json2::handler).fallback(json2::not_found),
        )
        .route("/json/2", axum::routing::any(json2::not_found))
        .route("/sim/health", get(|| async { "ok" }))
        .route("/sim/clusters", post(admin::add_cluster).get(admin::list_clusters))
        .route("/sim/clusters/{name}", get(admin::get_cluster))
        .route("/sim/clusters/{name}/report-log", get(admin::get_report_log))
        .route("/sim/stats", get(admin::get_stats))
        .route(
            "/sim/clusters/{name}/applications/{ns}/{app}",
            put(admin::put_application).delete(admin::delete_application),
        )
        .route("/sim/clusters/{name}/operations/{ns}/{op}", put(admin::put_operation))
        .route("/sim/clusters/{name}/deletions", post(admin::post_deletion))
        .route("/sim/clusters/{name}/document", put(admin::put_document))
        .route("/sim/clusters/{name}/reset-intent", post(admin::reset_intent))
        .route(
            "/sim/clusters/{name}/push",
            put(admin::put_push_target).delete(admin::delete_push_target),
        )
        .route("/sim/fault", put(admin::put_fault))
        .with_state(sim)
}

#[cfg(test)]
mod tests;
