//! The push side of the Odoo module, simulated: for a cluster record with a push target,
//! the simulator calls the agent's endpoint (`vworkspace.agent/apply` and `/status`) the
//! way docs/connectivity/protocol.md ("Push mode") asks the module to, instead of waiting
//! for `agent_sync`:
//!
//! * it pushes the document whenever its cursor differs from the agent's `known`
//!   (at once when the intent changes), and retries the same document after a failure;
//! * it polls `status` every `poll_seconds` (default 5) for deltas, and asks for a `full`
//!   answer first, after any failed call, when the agent's `instance` changed and every
//!   ten minutes; on a `full` answer every object it holds a report for and that is not
//!   in it is marked `deleted`, as after a pull-mode resync;
//! * acknowledgements and reports are stored exactly as `agent_sync`'s, so the admin view
//!   (and its per-object summary) reads the same in both modes; *last seen* is the last
//!   successful call.
//!
//! The token is kept with the API keys: saved in the state file, never shown by the admin
//! API nor logged.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use jiff::Timestamp;
use protocol::{
    PROTOCOL_VERSION,
    backoff::Backoff,
    error::OdooError,
    messages::{Cursor, DocumentAck},
    push::{ApplyParams, METHOD_APPLY, METHOD_STATUS, PUSH_MODEL, StatusParams, StatusResult},
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Sim, SimError};

/// Default interval between two `status` calls.
pub const DEFAULT_POLL_SECONDS: u64 = 5;
/// A `full` status at least this often (pull mode's periodic resync).
pub const FULL_STATUS_EVERY: Duration = Duration::from_secs(600);
/// Whole-call timeout: an `apply` answers after every object was handled.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

fn default_poll_seconds() -> u64 {
    DEFAULT_POLL_SECONDS
}

/// How to reach a cluster's agent in push mode: what the Odoo module stores per cluster
/// record.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushTarget {
    /// The agent's endpoint, e.g. `https://agent.example.com:8443`.
    pub url: String,
    /// The push token (the agent's `--push-token-file` / `--push-token-secret`).
    pub token: String,
    /// PEM CA the agent's certificate chains to, besides the system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for an agent with `--push-client-ca`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_identity_file: Option<PathBuf>,
    /// Seconds between two `status` calls.
    #[serde(default = "default_poll_seconds")]
    pub poll_seconds: u64,
}

impl std::fmt::Debug for PushTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushTarget")
            .field("url", &self.url)
            .field("token", &"<redacted>")
            .field("ca_file", &self.ca_file)
            .field("client_identity_file", &self.client_identity_file)
            .field("poll_seconds", &self.poll_seconds)
            .finish()
    }
}

/// What the admin view shows of a cluster in push mode (never the token).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PushLink {
    /// The agent's endpoint.
    pub url: String,
    /// Seconds between two `status` calls.
    pub poll_seconds: u64,
    /// The agent's `known`, as its last `status` answer gave it.
    pub known: Option<Cursor>,
    /// Last successful `status` call.
    pub last_status_at: Option<Timestamp>,
    /// Last successful `apply` call.
    pub last_apply_at: Option<Timestamp>,
    /// The last failed call, until a call succeeds.
    pub last_error: Option<String>,
    /// Successful `apply` calls.
    pub applies: u64,
    /// Successful `status` calls.
    pub status_calls: u64,
}

/// A failed call to the agent.
#[derive(Debug)]
enum CallFailure {
    /// `409`: the agent holds a later revision of this epoch.
    Stale(String),
    /// Anything else: unreachable, TLS, `401`, `5xx`, a malformed answer.
    Other(String),
}

impl CallFailure {
    fn message(&self) -> &str {
        match self {
            Self::Stale(m) | Self::Other(m) => m,
        }
    }
}

impl Sim {
    /// Sets (or, with `None`, removes) a cluster's push target. The cluster is then driven
    /// by [`drive`] instead of waiting for `agent_sync`.
    pub fn set_push_target(&self, cluster: &str, target: Option<PushTarget>) -> Result<(), SimError> {
        if let Some(t) = &target {
            let url = t.url.trim();
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(SimError::BadRequest(format!("url {url:?}: expected https://host:port")));
            }
            if t.token.trim().is_empty() {
                return Err(SimError::BadRequest("token: empty".into()));
            }
        }
        let mut s = self.lock();
        let record = s
            .clusters
            .get_mut(cluster)
            .ok_or_else(|| SimError::NoCluster(cluster.to_owned()))?;
        // A changed target keeps the link's history; the next `status` answer tells
        // what the (maybe new) agent knows.
        record.push = target.as_ref().map(|t| PushLink {
            url: t.url.trim().trim_end_matches('/').to_owned(),
            poll_seconds: t.poll_seconds,
            last_error: None,
            ..record.push.take().unwrap_or_default()
        });
        match target {
            Some(t) => s.push_targets.insert(cluster.to_owned(), t),
            None => s.push_targets.remove(cluster),
        };
        self.schedule_save();
        drop(s);
        self.changed();
        Ok(())
    }

    fn bound_uid(&self, cluster: &str) -> Option<String> {
        self.lock().clusters.get(cluster)?.uid.clone()
    }

    pub(crate) fn push_target(&self, cluster: &str) -> Option<PushTarget> {
        self.lock().push_targets.get(cluster).cloned()
    }

    /// The current cursor, its document and the bound UID, when the agent's `known` is
    /// not that cursor.
    fn document_to_push(&self, cluster: &str) -> Option<(Cursor, Value, Option<String>)> {
        let s = self.lock();
        let record = s.clusters.get(cluster)?;
        let cursor = Cursor {
            epoch: record.epoch.clone(),
            revision: record.revision,
        };
        if record.push.as_ref()?.known.as_ref() == Some(&cursor) {
            return None;
        }
        Some((cursor, Self::document(record)?, record.uid.clone()))
    }

    fn push_failed(&self, cluster: &str, what: &str, failure: &CallFailure) {
        let message = format!("{what}: {}", failure.message());
        let mut s = self.lock();
        let Some(link) = s.clusters.get_mut(cluster).and_then(|r| r.push.as_mut()) else {
            return;
        };
        if link.last_error.as_deref() != Some(message.as_str()) {
            tracing::warn!(%cluster, error = %message, "push: call to the agent failed");
        }
        link.last_error = Some(message);
        self.schedule_save();
    }

    fn applied(&self, cluster: &str, ack: DocumentAck) {
        let now = Timestamp::now();
        let mut s = self.lock();
        let Some(record) = s.clusters.get_mut(cluster) else {
            return;
        };
        record.last_seen = Some(now);
        if let Some(link) = record.push.as_mut() {
            link.last_apply_at = Some(now);
            link.last_error = None;
            link.applies += 1;
            if ack.outcome != protocol::messages::DocumentOutcome::Incomplete {
                link.known = Some(Cursor {
                    epoch: ack.epoch.clone(),
                    revision: ack.revision,
                });
            }
        }
        record.store_ack(ack);
        self.schedule_save();
    }

    /// Stores a `status` answer; `Ok(true)` when the agent restarted since the last one
    /// (ask for `full` next).
    fn status_received(&self, cluster: &str, result: StatusResult) -> Result<bool, CallFailure> {
        let now = Timestamp::now();
        let mut s = self.lock();
        let Some(record) = s.clusters.get_mut(cluster) else {
            return Ok(false);
        };
        if let Some(uid) = &record.uid
            && *uid != result.cluster.uid
        {
            return Err(CallFailure::Other(format!(
                "the endpoint serves cluster uid {}, this record is bound to {uid}",
                result.cluster.uid
            )));
        }
        record.uid = Some(result.cluster.uid.clone());
        record.registered_at.get_or_insert(now);
        record.last_seen = Some(now);
        let restarted = record
            .agent
            .as_ref()
            .is_some_and(|a| a.instance != result.agent.instance || a.started_at != result.agent.started_at);
        record.agent = Some(result.agent);
        record.allowed_namespaces = result.allowed_namespaces;
        if result.full {
            record.resync.id = format!("push-status-{}", now.as_millisecond());
            record.resync.seen.clear();
            record.store_reports(result.reports, true, now);
            record.complete_resync(now);
        } else {
            record.store_reports(result.reports, false, now);
        }
        if let Some(link) = record.push.as_mut() {
            link.known = result.known;
            link.last_status_at = Some(now);
            link.last_error = None;
            link.status_calls += 1;
        }
        self.schedule_save();
        Ok(restarted && !result.full)
    }
}

fn client(target: &PushTarget) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .timeout(CALL_TIMEOUT)
        .connect_timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none());
    if let Some(path) = &target.ca_file {
        let pem = std::fs::read(path).map_err(|e| format!("CA file {}: {e}", path.display()))?;
        for cert in
            reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| format!("CA file {}: {e}", path.display()))?
        {
            builder = builder.add_root_certificate(cert);
        }
    }
    if let Some(path) = &target.client_identity_file {
        let pem = std::fs::read(path).map_err(|e| format!("client identity {}: {e}", path.display()))?;
        let identity =
            reqwest::Identity::from_pem(&pem).map_err(|e| format!("client identity {}: {e}", path.display()))?;
        builder = builder.identity(identity);
    }
    builder.build().map_err(|e| e.to_string())
}

/// Every source of an error, joined: reqwest's top-level message hides the TLS reason.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

async fn call<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    target: &PushTarget,
    method: &str,
    params: &impl Serialize,
) -> Result<T, CallFailure> {
    let url = format!(
        "{}{}",
        target.url.trim().trim_end_matches('/'),
        protocol::json2_path(PUSH_MODEL, method)
    );
    let body = serde_json::to_vec(params).map_err(|e| CallFailure::Other(e.to_string()))?;
    let response = http
        .post(&url)
        .bearer_auth(target.token.trim())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| CallFailure::Other(format!("cannot reach the agent: {}", error_chain(&e))))?;
    let status = response.status();
    let bytes = response
        .bytes()
        .await
        .map_err(|e| CallFailure::Other(format!("reading the answer: {}", error_chain(&e))))?;
    if !status.is_success() {
        let detail = match serde_json::from_slice::<OdooError>(&bytes) {
            Ok(e) => format!("{}: {}", e.name, e.message),
            Err(_) => String::from_utf8_lossy(bytes.get(..bytes.len().min(200)).unwrap_or_default()).into_owned(),
        };
        let message = format!("HTTP {} {detail}", status.as_u16());
        return Err(if status.as_u16() == 409 {
            CallFailure::Stale(message)
        } else {
            CallFailure::Other(message)
        });
    }
    serde_json::from_slice(&bytes).map_err(|e| CallFailure::Other(format!("malformed answer: {e}")))
}

/// One cluster's push-side state: what the module keeps between two jobs.
struct ClusterDriver {
    sim: Sim,
    cluster: String,
    /// Ask for a `full` status next.
    full: bool,
    last_full: Instant,
    next_status: Instant,
    /// The cursor last pushed and when: it is pushed again only after a poll interval
    /// (after `incomplete`, or an answer lost), not in a loop.
    pushed: Option<(Cursor, Instant)>,
}

impl ClusterDriver {
    /// Polls `status` when due; `false` when the call failed.
    async fn status_step(&mut self, http: &reqwest::Client, target: &PushTarget, poll: Duration) -> bool {
        if self.last_full.elapsed() >= FULL_STATUS_EVERY {
            self.full = true;
        }
        if !self.full && Instant::now() < self.next_status {
            return true;
        }
        // Once bound, the UID goes along: an endpoint now serving another cluster refuses
        // (`403 ClusterMismatch`) instead of answering its reports.
        let params = StatusParams {
            protocol_version: Some(PROTOCOL_VERSION),
            full: self.full,
            cluster_uid: self.sim.bound_uid(&self.cluster),
        };
        let stored = match call::<StatusResult>(http, target, METHOD_STATUS, &params).await {
            Ok(result) => {
                let more = result.more;
                self.sim
                    .status_received(&self.cluster, result)
                    .map(|restarted| (restarted, more))
            }
            Err(e) => Err(e),
        };
        match stored {
            Ok((restarted, more)) => {
                if self.full {
                    self.last_full = Instant::now();
                }
                self.full = restarted;
                self.next_status = Instant::now() + if more { Duration::ZERO } else { poll };
                true
            }
            Err(e) => {
                self.sim.push_failed(&self.cluster, METHOD_STATUS, &e);
                self.full = true;
                false
            }
        }
    }

    /// Pushes the document when the agent's `known` differs; `false` when the call failed.
    async fn apply_step(&mut self, http: &reqwest::Client, target: &PushTarget, poll: Duration) -> bool {
        let Some((cursor, document, uid)) = self.sim.document_to_push(&self.cluster) else {
            return true;
        };
        if self
            .pushed
            .as_ref()
            .is_some_and(|(c, at)| *c == cursor && at.elapsed() < poll)
        {
            return true;
        }
        self.pushed = Some((cursor, Instant::now()));
        let params = ApplyParams {
            protocol_version: PROTOCOL_VERSION,
            cluster_uid: uid,
            document,
        };
        match call::<DocumentAck>(http, target, METHOD_APPLY, &params).await {
            Ok(ack) => {
                tracing::info!(cluster = %self.cluster, revision = ack.revision, outcome = ?ack.outcome, "push: document applied by the agent");
                self.sim.applied(&self.cluster, ack);
                true
            }
            Err(e) => {
                self.sim.push_failed(&self.cluster, METHOD_APPLY, &e);
                // Stale (a later revision there) is no failure: learn the agent's `known`.
                self.full = true;
                matches!(e, CallFailure::Stale(_))
            }
        }
    }
}

/// Drives one cluster until its push target is removed.
async fn drive_cluster(sim: Sim, cluster: String) {
    let mut changes = sim.subscribe();
    let mut http: Option<(PushTarget, reqwest::Client)> = None;
    let mut driver = ClusterDriver {
        sim: sim.clone(),
        cluster: cluster.clone(),
        full: true,
        last_full: Instant::now(),
        next_status: Instant::now(),
        pushed: None,
    };
    let mut failures = 0u32;
    loop {
        let Some(target) = sim.push_target(&cluster) else {
            return;
        };
        if http.as_ref().is_none_or(|(t, _)| *t != target) {
            http = match client(&target) {
                Ok(c) => Some((target.clone(), c)),
                Err(e) => {
                    sim.push_failed(&cluster, "configuration", &CallFailure::Other(e));
                    None
                }
            };
        }
        let poll = Duration::from_secs(target.poll_seconds.max(1));
        let ok = match &http {
            Some((_, c)) => driver.status_step(c, &target, poll).await && driver.apply_step(c, &target, poll).await,
            None => false,
        };
        let wait = if ok {
            failures = 0;
            driver.next_status.saturating_duration_since(Instant::now())
        } else {
            failures = failures.saturating_add(1);
            let jitter = f64::from(Timestamp::now().subsec_nanosecond().unsigned_abs() % 1000) / 1000.0;
            Backoff::default().delay(failures - 1, jitter)
        };
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Drives every cluster with a push target, for as long as the returned future runs:
/// starts a driver when a target is set and stops it when it is removed.
pub async fn drive(sim: Sim) {
    let mut changes = sim.subscribe();
    // Dropping the set (this future) stops every driver.
    let mut tasks = tokio::task::JoinSet::new();
    let mut drivers: BTreeMap<String, tokio::task::AbortHandle> = BTreeMap::new();
    loop {
        while tasks.try_join_next().is_some() {}
        let wanted: Vec<String> = sim.lock().push_targets.keys().cloned().collect();
        drivers.retain(|name, task| {
            let keep = wanted.contains(name) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        for name in wanted {
            drivers
                .entry(name.clone())
                .or_insert_with(|| tasks.spawn(drive_cluster(sim.clone(), name)));
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}
