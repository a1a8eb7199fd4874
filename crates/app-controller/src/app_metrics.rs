//! Readiness of the ApplicationInstances as metrics, computed from the controller's cache.
//!
//! Two gauge families, rebuilt every [`REFRESH`] from the watch cache (no API calls):
//!
//! | metric (prefix `vworkspace_`) | labels | value |
//! |---|---|---|
//! | `applicationinstances` | `namespace`, `ready` (`True`, `False`, `Unknown`), `reason` | ApplicationInstances |
//! | `applicationinstances_not_ready_since_timestamp_seconds` | `namespace` | Unix time since which the namespace's longest not-Ready application has not been Ready |
//!
//! Cardinality is bounded by namespaces, not applications: one series per namespace and
//! (Ready status, reason) pair present, and one per namespace with an application that is not
//! Ready. A reason that is not a plain identifier of at most [`MAX_REASON_LEN`] characters is
//! counted as `Other`. "Not Ready since" is the Ready condition's `lastTransitionTime` (it
//! moves only when the status changes), or the creation time of an application without a
//! Ready condition yet. Suspended applications are counted, but never "not Ready": a suspended
//! application is left alone on purpose. The alert `VWorkspaceApplicationNotReady`
//! (`deploy/monitoring/`) compares this time with `time()`.

use std::{collections::BTreeMap, time::Duration};

use api::{
    ApplicationInstance,
    conditions::{self, reasons, types},
};
use controller_kit::{CancellationToken, GaugeSnapshot, LeaderGate, Metrics};
use kube::{ResourceExt, core::DeserializeGuard, runtime::reflector::Store};
use prometheus_client::encoding::EncodeLabelSet;

/// How often the gauges are recomputed from the cache.
pub const REFRESH: Duration = Duration::from_secs(30);
/// Longest reason kept as a label value; longer ones become `Other`.
pub const MAX_REASON_LEN: usize = 64;
/// The label value of a reason that is not a plain identifier.
pub const OTHER_REASON: &str = "Other";
/// The label value of an application without a Ready condition (or without a reason).
pub const NO_REASON: &str = "None";

/// Labels of `applicationinstances`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ReadyLabels {
    /// The application's namespace.
    pub namespace: String,
    /// Ready's status: `True`, `False` or `Unknown` (also for an application without Ready).
    pub ready: String,
    /// Ready's reason, bounded (see the module docs).
    pub reason: String,
}

/// Labels of `applicationinstances_not_ready_since_timestamp_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct NamespaceLabels {
    /// The namespace.
    pub namespace: String,
}

/// What the gauges say at one moment.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    /// Applications by namespace, Ready status and reason.
    pub counts: BTreeMap<ReadyLabels, i64>,
    /// Per namespace with a not-Ready (and not suspended) application: the oldest time since
    /// which one of them has not been Ready, in Unix seconds.
    pub not_ready_since: BTreeMap<NamespaceLabels, i64>,
}

/// `reason` as a bounded label value.
pub fn reason_label(reason: &str) -> &str {
    if reason.is_empty() {
        NO_REASON
    } else if reason.len() <= MAX_REASON_LEN && reason.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        reason
    } else {
        OTHER_REASON
    }
}

/// The gauges' values for `apps` (pure: the cache's content in, label sets out).
pub fn readiness<'a>(apps: impl IntoIterator<Item = &'a ApplicationInstance>) -> Readiness {
    let mut out = Readiness::default();
    for app in apps {
        let namespace = app.namespace().unwrap_or_default();
        let ready = app
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, types::READY));
        let status = match ready.map(|c| c.status.as_str()) {
            Some("True") => "True",
            Some("False") => "False",
            _ => "Unknown",
        };
        let reason = ready.map_or(NO_REASON, |c| reason_label(&c.reason));
        *out.counts
            .entry(ReadyLabels {
                namespace: namespace.clone(),
                ready: status.to_owned(),
                reason: reason.to_owned(),
            })
            .or_default() += 1;
        if status == "True" || app.spec.suspend || reason == reasons::SUSPENDED {
            continue;
        }
        let since = ready
            .map(|c| c.last_transition_time.0)
            .or_else(|| app.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let Some(since) = since else { continue };
        let entry = out
            .not_ready_since
            .entry(NamespaceLabels { namespace })
            .or_insert(i64::MAX);
        *entry = (*entry).min(since.as_second());
    }
    out
}

/// The registered gauge families.
#[derive(Clone, Debug)]
pub struct AppMetrics {
    counts: GaugeSnapshot<ReadyLabels>,
    not_ready_since: GaugeSnapshot<NamespaceLabels>,
}

impl AppMetrics {
    /// Creates and registers the families.
    pub fn register(metrics: &Metrics) -> Self {
        Self {
            counts: GaugeSnapshot::register(
                metrics,
                "applicationinstances",
                "ApplicationInstances by namespace, Ready status and Ready reason",
            ),
            not_ready_since: GaugeSnapshot::register(
                metrics,
                "applicationinstances_not_ready_since_timestamp_seconds",
                "Per namespace: Unix time since which its longest not-Ready (and not suspended) ApplicationInstance has not been Ready",
            ),
        }
    }

    /// Replaces the families' content with `readiness`.
    pub fn set(&self, readiness: &Readiness) {
        self.counts.replace(&readiness.counts);
        self.not_ready_since.replace(&readiness.not_ready_since);
    }

    /// Removes every series.
    pub fn clear(&self) {
        self.counts.clear();
        self.not_ready_since.clear();
    }
}

/// Recomputes the gauges from `store` every [`REFRESH`] until `shutdown`. Only the leader
/// reports (a follower's families are empty), so a sum over replicas counts each app once.
pub async fn run(
    store: Store<DeserializeGuard<ApplicationInstance>>,
    metrics: AppMetrics,
    gate: LeaderGate,
    shutdown: CancellationToken,
) {
    controller_kit::metrics::refresh_while_leading(
        REFRESH,
        &gate,
        &shutdown,
        || metrics.clear(),
        || {
            let state = store.state();
            metrics.set(&readiness(state.iter().filter_map(|guard| guard.0.as_ref().ok())));
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn app(namespace: &str, ready: Option<(&str, &str, i64)>, created: i64, suspend: bool) -> ApplicationInstance {
        let mut value = serde_json::json!({
            "apiVersion": "vworkspace.io/v1alpha1",
            "kind": "ApplicationInstance",
            "metadata": {"name": "a", "namespace": namespace},
            "spec": {"chart": {"name": "demo", "version": "0.1.0",
                               "repository": {"url": "https://charts.example.com"}}},
        });
        let mut app: ApplicationInstance = serde_json::from_value(value.take()).unwrap();
        app.spec.suspend = suspend;
        app.metadata.creation_timestamp = Some(Time(jiff::Timestamp::from_second(created).unwrap()));
        if let Some((status, reason, since)) = ready {
            app.status = Some(api::ApplicationInstanceStatus {
                conditions: vec![Condition {
                    type_: "Ready".into(),
                    status: status.into(),
                    reason: reason.into(),
                    message: String::new(),
                    last_transition_time: Time(jiff::Timestamp::from_second(since).unwrap()),
                    observed_generation: None,
                }],
                ..Default::default()
            });
        }
        app
    }

    fn labels(namespace: &str, ready: &str, reason: &str) -> ReadyLabels {
        ReadyLabels {
            namespace: namespace.into(),
            ready: ready.into(),
            reason: reason.into(),
        }
    }

    fn ns(namespace: &str) -> NamespaceLabels {
        NamespaceLabels {
            namespace: namespace.into(),
        }
    }

    #[test]
    fn reasons_are_bounded() {
        let long = "A".repeat(MAX_REASON_LEN + 1);
        let cases = [
            ("InstallFailed", "InstallFailed"),
            ("", NO_REASON),
            ("has space", OTHER_REASON),
            ("a-b", OTHER_REASON),
            (long.as_str(), OTHER_REASON),
            ("Ünïcode", OTHER_REASON),
        ];
        for (reason, label) in cases {
            assert_eq!(reason_label(reason), label, "{reason:?}");
        }
    }

    #[test]
    fn counts_by_namespace_status_and_reason() {
        let apps = [
            app("a", Some(("True", "InstallSucceeded", 100)), 10, false),
            app("a", Some(("True", "InstallSucceeded", 200)), 10, false),
            app("a", Some(("False", "InstallFailed", 300)), 10, false),
            app("a", Some(("False", "InstallFailed", 250)), 10, false),
            app("b", None, 50, false),
            app("b", Some(("Weird", "Progressing", 400)), 10, false),
            app("c", Some(("False", "Suspended", 10)), 10, true),
        ];
        let got = readiness(&apps);
        let want: BTreeMap<_, _> = [
            (labels("a", "True", "InstallSucceeded"), 2),
            (labels("a", "False", "InstallFailed"), 2),
            (labels("b", "Unknown", NO_REASON), 1),
            (labels("b", "Unknown", "Progressing"), 1),
            (labels("c", "False", "Suspended"), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(got.counts, want);
        // The oldest not-Ready time per namespace; a missing Ready counts from creation;
        // suspended applications are never "not Ready".
        let since: BTreeMap<_, _> = [(ns("a"), 250), (ns("b"), 50)].into_iter().collect();
        assert_eq!(got.not_ready_since, since);
    }

    #[test]
    fn no_apps_no_series() {
        assert_eq!(readiness(&[]), Readiness::default());
    }

    #[test]
    fn gauges_follow_the_snapshot() {
        let metrics = Metrics::new("vworkspace");
        let gauges = AppMetrics::register(&metrics);
        gauges.set(&readiness(&[app(
            "a",
            Some(("False", "InstallFailed", 300)),
            10,
            false,
        )]));
        let text = metrics.encode().unwrap();
        for needle in [
            "vworkspace_applicationinstances{namespace=\"a\",ready=\"False\",reason=\"InstallFailed\"} 1",
            "vworkspace_applicationinstances_not_ready_since_timestamp_seconds{namespace=\"a\"} 300",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        gauges.set(&readiness(&[app(
            "a",
            Some(("True", "InstallSucceeded", 400)),
            10,
            false,
        )]));
        let text = metrics.encode().unwrap();
        assert!(!text.contains("InstallFailed"), "{text}");
        assert!(!text.contains("not_ready_since_timestamp_seconds{"), "{text}");
    }
}
