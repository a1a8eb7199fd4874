//! Prometheus metrics shared by every controller.
//!
//! Names, with the binary's prefix (the controllers use `vworkspace_`):
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `reconcile_runs_total` | counter | `controller` |
//! | `reconcile_failures_total` | counter | `controller`, `reason` |
//! | `reconcile_duration_seconds` | histogram, 1 ms to 60 s | `controller` |
//! | `api_writes_total` | counter | `controller`, `verb`, `kind` |
//! | `api_requests_total` | counter | `verb`, `resource` |
//! | `leader` | gauge (0/1) | |
//!
//! `api_writes_total` counts the writes a controller reports through [`Metrics::api_write`]
//! (status patches, events); writes made inside libraries such as helmengine are not
//! seen here, so `bench-app` also reads the API server's own request counters. Lease renewals are
//! counted too, under `controller="leader-election"`, so they can be told apart.
//!
//! `api_requests_total` counts every request the process's client sends (reads, watches
//! and writes, including those made inside libraries), classified from the request line
//! by [`crate::requests`]; `resource` values are bounded by the resources the code touches.
//!
//! Labels are `&'static str` on purpose: label values come from constants (controller
//! names, kinds, error `metric_label()`s), which bounds cardinality at compile time.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    hash::Hash,
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Metric, Registry, Unit},
};

/// Content type of [`Metrics::encode`]'s output.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Histogram buckets, in seconds: a cached no-op reconcile takes about a millisecond,
/// one that waits on slow API calls can take tens of seconds.
const DURATION_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The `controller` label used for Lease writes by [`crate::leader`].
pub const LEADER_ELECTION_CONTROLLER: &str = "leader-election";

/// The kind of write sent to the API server.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum WriteVerb {
    /// POST of a new object.
    Create,
    /// Server-side apply (`PATCH` with `application/apply-patch+yaml`).
    Apply,
    /// Any other `PATCH` (merge, JSON, strategic).
    Patch,
    /// `PUT` (replace), including optimistic-concurrency updates.
    Replace,
    /// `DELETE`.
    Delete,
}

impl WriteVerb {
    /// The label value: lowercase, as in Kubernetes audit logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Apply => "apply",
            Self::Patch => "patch",
            Self::Replace => "replace",
            Self::Delete => "delete",
        }
    }
}

impl fmt::Display for WriteVerb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl EncodeLabelValue for WriteVerb {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
        fmt::Write::write_str(encoder, self.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    controller: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    controller: &'static str,
    verb: WriteVerb,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: &'static str,
    resource: String,
}

struct Inner {
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    runs: Family<ControllerLabels, Counter>,
    failures: Family<FailureLabels, Counter>,
    duration: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    writes: Family<WriteLabels, Counter>,
    leader: Gauge,
}

/// The process's metrics registry and the standard controller metrics. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// Metric names allow `[a-zA-Z0-9_:]`; binary names use `-`, so map anything else to `_`.
fn sanitize_prefix(prefix: &str) -> String {
    let mut out: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

impl Metrics {
    /// Creates the registry with every metric name prefixed by `prefix` (sanitised:
    /// `app-controller` becomes `app_controller`). An empty prefix means no prefix.
    pub fn new(prefix: &str) -> Self {
        let prefix = sanitize_prefix(prefix);
        let mut registry = if prefix.is_empty() {
            Registry::default()
        } else {
            Registry::with_prefix(prefix)
        };

        let runs = Family::<ControllerLabels, Counter>::default();
        registry.register("reconcile_runs", "Reconciliations started", runs.clone());
        let failures = Family::<FailureLabels, Counter>::default();
        registry.register(
            "reconcile_failures",
            "Reconciliations that returned an error, by reason",
            failures.clone(),
        );
        let duration = Family::<ControllerLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            duration_histogram as fn() -> Histogram,
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Time spent in one reconciliation",
            Unit::Seconds,
            duration.clone(),
        );
        let writes = Family::<WriteLabels, Counter>::default();
        registry.register("api_writes", "Writes sent to the Kubernetes API server", writes.clone());
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "api_requests",
            "Requests sent to the Kubernetes API server, by verb and resource",
            requests.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease (or runs without election)",
            leader.clone(),
        );

        Self {
            inner: Arc::new(Inner {
                registry: Mutex::new(registry),
                requests,
                runs,
                failures,
                duration,
                writes,
                leader,
            }),
        }
    }

    /// Registers a binary-specific metric in the same registry (and prefix).
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry().register(name, help, metric);
    }

    /// Counts a reconcile run and returns a guard that records its duration when dropped.
    pub fn reconcile_timer(&self, controller: &'static str) -> ReconcileTimer {
        self.inner.runs.get_or_create(&ControllerLabels { controller }).inc();
        ReconcileTimer {
            metrics: self.clone(),
            controller,
            start: Instant::now(),
        }
    }

    /// Counts a failed reconcile; `reason` should be the error's stable `metric_label()`.
    pub fn reconcile_failure(&self, controller: &'static str, reason: &'static str) {
        self.inner
            .failures
            .get_or_create(&FailureLabels { controller, reason })
            .inc();
    }

    /// Counts one write to the API server. Call it for every create/apply/patch/replace/delete.
    pub fn api_write(&self, controller: &'static str, verb: WriteVerb, kind: &'static str) {
        self.inner
            .writes
            .get_or_create(&WriteLabels { controller, verb, kind })
            .inc();
    }

    /// Counts one request sent to the API server (see [`crate::requests`]).
    pub fn api_request<B>(&self, request: &http::Request<B>) {
        let labels = RequestLabels {
            verb: crate::requests::verb(request),
            resource: crate::requests::resource(request.uri().path()),
        };
        self.inner.requests.get_or_create(&labels).inc();
    }

    /// Creates the `api_writes_total` series for this combination at zero, so a
    /// controller at rest shows an explicit `0` instead of no series at all. Call it at
    /// startup for each write a controller can make.
    pub fn declare_write(&self, controller: &'static str, verb: WriteVerb, kind: &'static str) {
        drop(self.inner.writes.get_or_create(&WriteLabels { controller, verb, kind }));
    }

    /// Sets the `leader` gauge.
    pub fn set_leader(&self, is_leader: bool) {
        self.inner.leader.set(i64::from(is_leader));
    }

    /// Metrics scoped to one controller, so its `Context` need not repeat the name.
    ///
    /// Also creates the controller's run counter and duration histogram at zero, so
    /// its series exist on `/metrics` before the first reconcile (absent series make
    /// `rate()` and alerts blind).
    pub fn controller(&self, controller: &'static str) -> ControllerMetrics {
        let labels = ControllerLabels { controller };
        drop(self.inner.runs.get_or_create(&labels));
        drop(self.inner.duration.get_or_create(&labels));
        ControllerMetrics {
            metrics: self.clone(),
            controller,
        }
    }

    /// Renders every metric in the OpenMetrics text format (served on `/metrics`).
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut out = String::with_capacity(4096);
        prometheus_client::encoding::text::encode(&mut out, &self.registry())?;
        Ok(out)
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        // A panic while holding the lock cannot leave the registry inconsistent
        // (registration is a push onto a Vec), so poisoning is ignored.
        self.inner.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`Metrics`] bound to one controller name. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    metrics: Metrics,
    controller: &'static str,
}

impl ControllerMetrics {
    /// See [`Metrics::reconcile_timer`].
    pub fn reconcile_timer(&self) -> ReconcileTimer {
        self.metrics.reconcile_timer(self.controller)
    }

    /// See [`Metrics::reconcile_failure`].
    pub fn reconcile_failure(&self, reason: &'static str) {
        self.metrics.reconcile_failure(self.controller, reason);
    }

    /// See [`Metrics::api_write`].
    pub fn api_write(&self, verb: WriteVerb, kind: &'static str) {
        self.metrics.api_write(self.controller, verb, kind);
    }

    /// See [`Metrics::declare_write`].
    pub fn declare_write(&self, verb: WriteVerb, kind: &'static str) {
        self.metrics.declare_write(self.controller, verb, kind);
    }
}

/// Calls `refresh` every `period` while this replica leads and `clear` while it does not, until
/// `shutdown`: gauges computed from a cache are reported by the leader only, so a sum over
/// replicas counts each object once.
pub async fn refresh_while_leading(
    period: std::time::Duration,
    gate: &crate::LeaderGate,
    shutdown: &crate::CancellationToken,
    mut clear: impl FnMut(),
    mut refresh: impl FnMut(),
) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        if gate.is_leader() { refresh() } else { clear() }
    }
}

/// A gauge family whose whole content is replaced at once from a computed snapshot (counts
/// of objects by labels, per-object timestamps): label sets missing from the new snapshot are
/// removed, so an object or namespace that went away leaves no stale series. Cheap to clone.
#[derive(Clone, Debug)]
pub struct GaugeSnapshot<L> {
    family: Family<L, Gauge>,
    keys: Arc<Mutex<BTreeSet<L>>>,
}

impl<L> GaugeSnapshot<L>
where
    L: Clone + Hash + Eq + Ord + EncodeLabelSet + fmt::Debug + Send + Sync + 'static,
{
    /// Creates the family and registers it as `name` in `metrics` (with its prefix).
    pub fn register(metrics: &Metrics, name: &str, help: &str) -> Self {
        let family = Family::<L, Gauge>::default();
        metrics.register(name, help, family.clone());
        Self {
            family,
            keys: Arc::default(),
        }
    }

    /// Sets the family to exactly `values`.
    pub fn replace(&self, values: &BTreeMap<L, i64>) {
        self.replace_part(|_| true, values);
    }

    /// Sets the part of the family whose label sets satisfy `part` to exactly `values`
    /// (which should all satisfy it), leaving the other series alone: for several writers
    /// sharing one family, each owning a part of it.
    pub fn replace_part(&self, part: impl Fn(&L) -> bool, values: &BTreeMap<L, i64>) {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.retain(|k| {
            let gone = part(k) && !values.contains_key(k);
            if gone {
                self.family.remove(k);
            }
            !gone
        });
        for (labels, value) in values {
            self.family.get_or_create(labels).set(*value);
            keys.insert(labels.clone());
        }
    }

    /// Removes every series.
    pub fn clear(&self) {
        self.replace(&BTreeMap::new());
    }
}

/// Records the reconcile duration when dropped, so every exit path (`?` included) is measured.
#[must_use = "the duration is recorded when the timer is dropped; bind it with `let _timer = ...`"]
#[derive(Debug)]
pub struct ReconcileTimer {
    metrics: Metrics,
    controller: &'static str,
    start: Instant,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        let labels = ControllerLabels {
            controller: self.controller,
        };
        self.metrics
            .inner
            .duration
            .get_or_create(&labels)
            .observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_is_sanitised() {
        assert_eq!(sanitize_prefix("app-controller"), "app_controller");
        assert_eq!(sanitize_prefix("vws:backup_engine"), "vws:backup_engine");
        assert_eq!(sanitize_prefix("9lives"), "_9lives");
        assert_eq!(sanitize_prefix(""), "");
    }

    #[test]
    fn encodes_all_standard_metrics() {
        let metrics = Metrics::new("app-controller");
        let ctl = metrics.controller("applicationinstance");
        {
            let _timer = ctl.reconcile_timer();
        }
        ctl.reconcile_failure("kube_api");
        ctl.api_write(WriteVerb::Apply, "HelmRelease");
        ctl.api_write(WriteVerb::Apply, "HelmRelease");
        metrics.set_leader(true);

        let text = metrics.encode().unwrap();
        for needle in [
            "# TYPE app_controller_reconcile_runs counter",
            "app_controller_reconcile_runs_total{controller=\"applicationinstance\"} 1",
            "app_controller_reconcile_failures_total{controller=\"applicationinstance\",reason=\"kube_api\"} 1",
            "# UNIT app_controller_reconcile_duration_seconds seconds",
            "app_controller_reconcile_duration_seconds_count{controller=\"applicationinstance\"} 1",
            "app_controller_reconcile_duration_seconds_bucket{le=\"0.001\",controller=\"applicationinstance\"}",
            "app_controller_reconcile_duration_seconds_bucket{le=\"60.0\",controller=\"applicationinstance\"} 1",
            "app_controller_api_writes_total{controller=\"applicationinstance\",verb=\"apply\",kind=\"HelmRelease\"} 2",
            "app_controller_leader 1",
            "# EOF",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
    }

    #[test]
    fn clones_share_state_and_custom_metrics_register() {
        let metrics = Metrics::new("x");
        let clone = metrics.clone();
        clone.api_write("c", WriteVerb::Delete, "Job");
        let custom = Counter::<u64>::default();
        metrics.register("custom_events", "A binary-specific counter", custom.clone());
        custom.inc();
        let text = metrics.encode().unwrap();
        assert!(
            text.contains("x_api_writes_total{controller=\"c\",verb=\"delete\",kind=\"Job\"} 1"),
            "{text}"
        );
        assert!(text.contains("x_custom_events_total 1"), "{text}");
    }

    #[test]
    fn controller_series_exist_before_the_first_reconcile() {
        let metrics = Metrics::new("x");
        let ctl = metrics.controller("backup");
        let text = metrics.encode().unwrap();
        assert!(
            text.contains("x_reconcile_runs_total{controller=\"backup\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("x_reconcile_duration_seconds_count{controller=\"backup\"} 0"),
            "{text}"
        );
        // Write series exist only once declared (or written).
        assert!(!text.contains("x_api_writes_total"), "{text}");
        ctl.declare_write(WriteVerb::Apply, "HelmRelease");
        let text = metrics.encode().unwrap();
        assert!(
            text.contains("x_api_writes_total{controller=\"backup\",verb=\"apply\",kind=\"HelmRelease\"} 0"),
            "{text}"
        );
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
    struct NsLabels {
        namespace: String,
    }

    #[test]
    fn gauge_snapshots_replace_their_whole_content() {
        let metrics = Metrics::new("x");
        let gauges = GaugeSnapshot::<NsLabels>::register(&metrics, "apps", "Apps by namespace");
        let ns = |n: &str| NsLabels { namespace: n.into() };
        // (snapshot, lines expected, lines that must be gone)
        type Case<'a> = (Vec<(&'a str, i64)>, &'a [&'a str], &'a [&'a str]);
        let cases: [Case<'_>; 3] = [
            (
                vec![("a", 2), ("b", 1)],
                &["x_apps{namespace=\"a\"} 2", "x_apps{namespace=\"b\"} 1"],
                &[],
            ),
            (vec![("b", 3)], &["x_apps{namespace=\"b\"} 3"], &["namespace=\"a\""]),
            // Empty: prometheus-client prints nothing of a family without series.
            (vec![], &[], &["x_apps{"]),
        ];
        for (snapshot, present, absent) in cases {
            gauges.replace(&snapshot.iter().map(|(n, v)| (ns(n), *v)).collect());
            let text = metrics.encode().unwrap();
            for needle in present {
                assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
            }
            for needle in absent {
                assert!(!text.contains(needle), "unexpected {needle:?} in:\n{text}");
            }
        }
        // A part: only the series it selects are replaced.
        gauges.replace(&[(ns("a"), 1), (ns("b"), 1)].into_iter().collect());
        gauges.replace_part(|l| l.namespace == "a", &BTreeMap::new());
        let text = metrics.encode().unwrap();
        assert!(!text.contains("namespace=\"a\""), "{text}");
        assert!(text.contains("x_apps{namespace=\"b\"} 1"), "{text}");
        gauges.clear();
        assert!(!metrics.encode().unwrap().contains("namespace="));
    }

    #[test]
    fn verbs_render_lowercase() {
        let all = [
            WriteVerb::Create,
            WriteVerb::Apply,
            WriteVerb::Patch,
            WriteVerb::Replace,
            WriteVerb::Delete,
        ];
        let names: Vec<_> = all.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["create", "apply", "patch", "replace", "delete"]);
    }
}
