//! The agent's own condition: is it in touch with the control plane, and if not, why.
//!
//! One condition, `ControlPlaneConnected`, is kept in memory and published three ways
//! (in push mode it says whether the push endpoint serves: `True`/`PushServing` with the
//! last authenticated push, see [`Health::push_serving`]):
//!
//! * **metrics** (`vworkspace_agent_*`, see [`AgentMetrics`]), always current;
//! * **`/readyz`**: `503 not ready: <reason>: <message>` while the agent cannot sync
//!   (after [`NOT_READY_AFTER`] consecutive failures, or at once for a failure that needs
//!   someone to act: a wrong API key, the Odoo module missing, incompatible versions),
//!   and before its watches have listed the CRs. Readiness only gates the Service (the
//!   status channel's endpoint): a not-ready agent keeps running and retrying, it is
//!   never restarted for it;
//! * **the ConfigMap `vworkspace-agent-status`** in the agent's namespace (key
//!   `status.json`), written on each transition of the condition only (no writes at
//!   rest), so `kubectl get configmap vworkspace-agent-status -o yaml` explains an agent
//!   without access to its logs or Secrets.

use std::sync::{Arc, Mutex, PoisonError};

use controller_kit::{Metrics, Readiness};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
};
use serde::Serialize;
use serde_json::json;

/// Consecutive transient failures before the agent reports itself not ready.
pub const NOT_READY_AFTER: u32 = 3;
/// The condition type.
pub const CONDITION_TYPE: &str = "ControlPlaneConnected";
/// Push mode's reason while its endpoint serves.
pub const PUSH_SERVING: &str = "PushServing";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PushLabels {
    endpoint: &'static str,
    code: u16,
}

/// The agent's metrics, registered in the process registry (prefix `vworkspace_`).
#[derive(Clone, Default)]
pub struct AgentMetrics {
    calls: Family<ResultLabels, Counter>,
    connected: Gauge,
    condition: Family<ReasonLabels, Gauge>,
    last_success: Gauge,
    failures: Gauge,
    objects: Family<OutcomeLabels, Counter>,
    documents: Family<OutcomeLabels, Counter>,
    reports_sent: Counter,
    reports_pending: Gauge,
    revision: Gauge,
    bytes_sent: Counter,
    push_requests: Family<PushLabels, Counter>,
}

impl std::fmt::Debug for AgentMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentMetrics")
    }
}

impl AgentMetrics {
    /// Creates and registers the metrics.
    pub fn register(metrics: &Metrics) -> Self {
        let m = Self::default();
        metrics.register(
            "agent_control_plane_calls",
            "Calls to the control plane, by result (ok or a failure reason)",
            m.calls.clone(),
        );
        metrics.register(
            "agent_control_plane_connected",
            "1 while the last call to the control plane succeeded",
            m.connected.clone(),
        );
        metrics.register(
            "agent_condition",
            "1 for the current reason of the ControlPlaneConnected condition",
            m.condition.clone(),
        );
        metrics.register(
            "agent_last_successful_sync_timestamp_seconds",
            "Unix time of the last successful sync",
            m.last_success.clone(),
        );
        metrics.register(
            "agent_consecutive_failures",
            "Failed calls since the last success",
            m.failures.clone(),
        );
        metrics.register(
            "agent_objects",
            "Objects of desired-state documents processed, by outcome",
            m.objects.clone(),
        );
        metrics.register(
            "agent_documents",
            "Desired-state documents processed, by outcome",
            m.documents.clone(),
        );
        metrics.register("agent_reports_sent", "Status reports delivered", m.reports_sent.clone());
        metrics.register(
            "agent_reports_pending",
            "Status changes not yet delivered",
            m.reports_pending.clone(),
        );
        metrics.register(
            "agent_known_revision",
            "Revision of the last desired-state document processed",
            m.revision.clone(),
        );
        metrics.register(
            "agent_request_bytes",
            "Bytes of sync parameters sent",
            m.bytes_sent.clone(),
        );
        metrics.register(
            "agent_push_requests",
            "Push mode: requests to the push endpoint, by endpoint and HTTP status",
            m.push_requests.clone(),
        );
        drop(m.calls.get_or_create(&ResultLabels { result: "ok" }));
        m
    }

    /// Counts a request to the push endpoint (`endpoint` is `apply`, `status` or `other`).
    pub fn push_request(&self, endpoint: &'static str, code: u16) {
        self.push_requests.get_or_create(&PushLabels { endpoint, code }).inc();
    }

    /// Counts a processed object.
    pub fn object(&self, outcome: &'static str) {
        self.objects.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// Counts a processed document.
    pub fn document(&self, outcome: &'static str) {
        self.documents.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// Counts delivered reports and request bytes.
    pub fn sent(&self, reports: usize, bytes: usize) {
        self.reports_sent.inc_by(reports as u64);
        self.bytes_sent.inc_by(bytes as u64);
    }

    /// Sets the pending-report gauge.
    pub fn pending(&self, n: usize) {
        self.reports_pending.set(n as i64);
    }

    /// Sets the known-revision gauge.
    pub fn revision(&self, r: u64) {
        self.revision.set(i64::try_from(r).unwrap_or(i64::MAX));
    }
}

/// The condition as published.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCondition {
    /// `ControlPlaneConnected`.
    #[serde(rename = "type")]
    pub type_: &'static str,
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    /// `Synced`, `Starting`, or the failure reason.
    pub reason: &'static str,
    /// Human-readable detail (never credentials).
    pub message: String,
    /// Last change of `status` or `reason`.
    pub last_transition_time: Timestamp,
}

#[derive(Debug)]
struct State {
    condition: AgentCondition,
    failures: u32,
    needs_attention: bool,
    last_success: Option<Timestamp>,
    caches_synced: bool,
    leading: bool,
}

/// Shared health of the agent. Cheap to clone.
#[derive(Clone)]
pub struct Health {
    state: Arc<Mutex<State>>,
    readiness: Readiness,
    metrics: AgentMetrics,
    configmap: Option<(Api<ConfigMap>, String)>,
    identity: serde_json::Value,
}

/// What changed after an event (so the caller knows whether to persist it).
#[derive(Debug, PartialEq, Eq)]
pub enum Transition {
    /// Nothing visible changed.
    None,
    /// The condition's status or reason changed.
    Changed,
}

impl Health {
    /// Starts `Unknown/Starting`, not ready.
    pub fn new(
        readiness: Readiness,
        metrics: AgentMetrics,
        configmap: Option<(Client, String, String)>,
        identity: serde_json::Value,
    ) -> Self {
        let h = Self {
            state: Arc::new(Mutex::new(State {
                condition: AgentCondition {
                    type_: CONDITION_TYPE,
                    status: "Unknown",
                    reason: "Starting",
                    message: "the agent has not contacted the control plane yet".into(),
                    last_transition_time: Timestamp::now(),
                },
                failures: 0,
                needs_attention: false,
                last_success: None,
                caches_synced: false,
                leading: true,
            })),
            readiness,
            metrics,
            configmap: configmap.map(|(client, ns, name)| (Api::namespaced(client, &ns), name)),
            identity,
        };
        h.metrics
            .condition
            .get_or_create(&ReasonLabels { reason: "Starting" })
            .set(1);
        h.update_readiness();
        h
    }

    /// The metrics.
    pub fn metrics(&self) -> &AgentMetrics {
        &self.metrics
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current condition.
    pub fn condition(&self) -> AgentCondition {
        self.lock().condition.clone()
    }

    /// The watches have listed the CRs.
    pub fn set_caches_synced(&self) {
        self.lock().caches_synced = true;
        self.update_readiness();
    }

    /// Leadership changed: a follower does not sync, and is ready once its caches are.
    pub fn set_leading(&self, leading: bool) {
        self.lock().leading = leading;
        self.update_readiness();
    }

    fn update_readiness(&self) {
        let s = self.lock();
        if !s.caches_synced {
            self.readiness
                .set_not_ready("listing ApplicationInstances and Operations");
        } else if s.leading && (s.needs_attention || s.failures >= NOT_READY_AFTER) {
            self.readiness.set_not_ready(format!(
                "{}: {}: {}",
                CONDITION_TYPE, s.condition.reason, s.condition.message
            ));
        } else {
            self.readiness.set_ready();
        }
    }

    fn transition(&self, status: &'static str, reason: &'static str, message: String) -> Transition {
        let mut s = self.lock();
        let changed = s.condition.status != status || s.condition.reason != reason;
        if changed {
            self.metrics
                .condition
                .get_or_create(&ReasonLabels {
                    reason: s.condition.reason,
                })
                .set(0);
            self.metrics.condition.get_or_create(&ReasonLabels { reason }).set(1);
            s.condition.status = status;
            s.condition.reason = reason;
            s.condition.last_transition_time = Timestamp::now();
        }
        s.condition.message = message;
        if changed { Transition::Changed } else { Transition::None }
    }

    /// A call succeeded.
    pub fn success(&self) -> Transition {
        let now = Timestamp::now();
        {
            let mut s = self.lock();
            s.failures = 0;
            s.needs_attention = false;
            s.last_success = Some(now);
        }
        self.metrics.calls.get_or_create(&ResultLabels { result: "ok" }).inc();
        self.metrics.connected.set(1);
        self.metrics.failures.set(0);
        self.metrics.last_success.set(now.as_second());
        let t = self.transition(
            "True",
            "Synced",
            "the last sync with the control plane succeeded".into(),
        );
        self.update_readiness();
        t
    }

    /// A call failed with `reason` (a stable code) and a credential-free `message`.
    pub fn failure(&self, reason: &'static str, message: String, needs_attention: bool) -> (Transition, u32) {
        let failures = {
            let mut s = self.lock();
            s.failures = s.failures.saturating_add(1);
            s.needs_attention = needs_attention;
            s.failures
        };
        self.metrics.calls.get_or_create(&ResultLabels { result: reason }).inc();
        self.metrics.connected.set(0);
        self.metrics.failures.set(i64::from(failures));
        let t = self.transition("False", reason, message);
        self.update_readiness();
        (t, failures)
    }

    /// Push mode: the endpoint listens on `endpoint` (`https://0.0.0.0:8443`). The agent
    /// cannot know whether Odoo reaches it, only that it serves: `True`/`PushServing`.
    pub fn push_serving(&self, endpoint: &str) -> Transition {
        let last = {
            let mut s = self.lock();
            s.needs_attention = false;
            s.failures = 0;
            s.last_success
        };
        self.metrics.connected.set(1);
        let last = last.map_or_else(
            || "no authenticated push yet".to_owned(),
            |t| format!("last authenticated push at {t}"),
        );
        let t = self.transition(
            "True",
            PUSH_SERVING,
            format!("serving the push endpoint on {endpoint}; {last}"),
        );
        self.update_readiness();
        t
    }

    /// Push mode: an authenticated request was served; its time is the last success.
    pub fn pushed(&self) -> Transition {
        let now = Timestamp::now();
        {
            let mut s = self.lock();
            s.failures = 0;
            s.needs_attention = false;
            s.last_success = Some(now);
        }
        self.metrics.connected.set(1);
        self.metrics.failures.set(0);
        self.metrics.last_success.set(now.as_second());
        let t = self.transition(
            "True",
            PUSH_SERVING,
            format!("serving the push endpoint; last authenticated push at {now}"),
        );
        self.update_readiness();
        t
    }

    /// Push mode: the endpoint cannot authenticate anyone (its token cannot be read):
    /// `False` with `reason`, not ready at once, until [`Health::pushed`] or
    /// [`Health::push_serving`].
    pub fn push_unavailable(&self, reason: &'static str, message: String) -> Transition {
        self.lock().needs_attention = true;
        self.metrics.connected.set(0);
        let t = self.transition("False", reason, message);
        self.update_readiness();
        t
    }

    /// Writes the condition to the status ConfigMap (best effort; logged on failure).
    pub async fn persist(&self, known_revision: Option<String>) {
        let Some((api, name)) = &self.configmap else { return };
        let (condition, last_success, failures) = {
            let s = self.lock();
            (s.condition.clone(), s.last_success, s.failures)
        };
        let doc = json!({
            "condition": condition,
            "lastSuccessfulSync": last_success,
            "consecutiveFailures": failures,
            "knownRevision": known_revision,
            "agent": self.identity,
            "updatedAt": Timestamp::now(),
        });
        let body = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {
                "app.kubernetes.io/name": "agent",
                "app.kubernetes.io/part-of": "vworkspace-operator",
            }},
            "data": {
                "status.json": serde_json::to_string_pretty(&doc).unwrap_or_default(),
                "condition": format!("{}={} ({})", condition.type_, condition.status, condition.reason),
            },
        });
        let params = PatchParams::apply(protocol::FIELD_MANAGER).force();
        if let Err(e) = api.patch(name, &params, &Patch::Apply(&body)).await {
            tracing::warn!(configmap = %name, error = %e, "cannot record the agent condition in its ConfigMap");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> (Health, Readiness, Metrics) {
        let readiness = Readiness::new();
        let metrics = Metrics::new("vworkspace");
        let h = Health::new(
            readiness.clone(),
            AgentMetrics::register(&metrics),
            None,
            json!({"cluster": "c"}),
        );
        (h, readiness, metrics)
    }

    #[test]
    fn readiness_follows_caches_and_failures() {
        let (h, r, metrics) = health();
        assert!(!r.is_ready(), "not ready before the caches are listed");
        h.set_caches_synced();
        assert!(r.is_ready(), "ready while starting (nothing failed yet)");
        assert_eq!(h.success(), Transition::Changed);
        assert_eq!(h.success(), Transition::None);
        for i in 1..NOT_READY_AFTER {
            let (t, n) = h.failure("Timeout", "no answer".into(), false);
            assert_eq!(n, i);
            assert_eq!(t == Transition::Changed, i == 1);
            assert!(r.is_ready(), "a few transient failures keep it ready");
        }
        h.failure("Timeout", "no answer".into(), false);
        assert_eq!(r.status(), Err("ControlPlaneConnected: Timeout: no answer".to_owned()));
        h.success();
        assert!(r.is_ready());
        h.failure("Unauthorized", "agent_sync failed with HTTP 401".into(), true);
        assert!(!r.is_ready(), "a wrong key needs attention at once");
        h.set_leading(false);
        assert!(r.is_ready(), "a follower does not talk to the control plane");

        let text = metrics.encode().unwrap();
        for needle in [
            "vworkspace_agent_control_plane_calls_total{result=\"ok\"} 3",
            "vworkspace_agent_control_plane_calls_total{result=\"Timeout\"} 3",
            "vworkspace_agent_control_plane_calls_total{result=\"Unauthorized\"} 1",
            "vworkspace_agent_control_plane_connected 0",
            "vworkspace_agent_condition{reason=\"Unauthorized\"} 1",
            "vworkspace_agent_condition{reason=\"Synced\"} 0",
            "vworkspace_agent_consecutive_failures 1",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }

    #[test]
    fn push_mode_condition_says_the_endpoint_serves() {
        let (h, r, metrics) = health();
        h.set_caches_synced();
        assert_eq!(h.push_serving("https://0.0.0.0:8443"), Transition::Changed);
        assert!(r.is_ready());
        let c = h.condition();
        assert_eq!((c.status, c.reason), ("True", PUSH_SERVING));
        assert!(c.message.contains("no authenticated push yet"), "{}", c.message);
        assert_eq!(
            h.pushed(),
            Transition::None,
            "same status and reason: nothing to persist"
        );
        assert!(h.condition().message.contains("last authenticated push at"));
        assert_eq!(
            h.push_unavailable("CredentialsUnavailable", "cannot read the push token file /t".into()),
            Transition::Changed
        );
        assert_eq!(
            r.status(),
            Err("ControlPlaneConnected: CredentialsUnavailable: cannot read the push token file /t".to_owned())
        );
        h.pushed();
        assert!(r.is_ready(), "a readable token again: ready again");
        h.metrics().push_request("apply", 401);
        let text = metrics.encode().unwrap();
        for needle in [
            "vworkspace_agent_push_requests_total{endpoint=\"apply\",code=\"401\"} 1",
            "vworkspace_agent_condition{reason=\"PushServing\"} 1",
            "vworkspace_agent_control_plane_connected 1",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
