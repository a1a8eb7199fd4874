//! The engines' domain metrics (prefix `vworkspace_`), besides the reconcile metrics every
//! controller has:
//!
//! | metric | type | labels | exported by |
//! |---|---|---|---|
//! | `operations` | gauge: Operations that exist, by phase | `type`, `phase` | the engine of each type |
//! | `operations_started_total` | counter: Operations seen to start | `type` | the engine of each type |
//! | `operations_finished_total` | counter: Operations seen to end | `type`, `phase` (`Succeeded`, `Failed`, `Expired`) | the engine of each type |
//! | `operation_duration_seconds` | histogram, 1 s to 6 h: `completionTime - startTime` of those that ended | `type`, `phase` | the engine of each type |
//! | `operation_end_from_child_seconds` | histogram, 1 ms to 2.5 s: from a child's event reaching the engine to the end it decided being written by the fast lane | `type` | the runbook engine |
//! | `backup_schedule_last_success_timestamp_seconds` | gauge: when the newest successful scheduled backup completed | `namespace`, `application` | `backup-engine` |
//! | `backup_schedule_due_timestamp_seconds` | gauge: the scheduled time of the backup the schedule waits for | `namespace`, `application` | `backup-engine` |
//!
//! The Operation metrics come from an observer per Operation type ([`observe_operations`]):
//! its own watch of the type's Operations, kept apart from the controller's, which records
//! each Operation's phase and counts the transitions it sees (a start, an end). The first
//! list after the process starts counts nothing (those transitions happened before), a
//! re-list after a lost watch counts what changed meanwhile. Only the leader reports, so
//! sums over replicas count each Operation once; a transition during a leader change may be
//! missed, never counted twice by one process.
//!
//! The backup schedule gauges ([`observe_schedules`]) are recomputed from the schedule
//! controller's cache: one series per ApplicationInstance with an active (valid, not
//! suspended) `spec.backupSchedule`. `due` is the first scheduled time after the last
//! successful backup (or after the schedule took effect, before any success): once that time
//! is well past, a backup is overdue. The alert `VWorkspaceBackupOverdue`
//! (`deploy/monitoring/`) compares it with `time()`.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use api::{ApplicationInstance, Operation, OperationPhase, OperationType};
use controller_kit::{CancellationToken, GaugeSnapshot, LeaderGate, Metrics};
use futures::StreamExt;
use kube::{
    Api, Client, ResourceExt,
    core::DeserializeGuard,
    runtime::{WatchStreamExt, reflector::Store, watcher},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
};
use tracing::debug;

/// How often the gauges are recomputed.
pub const REFRESH: Duration = Duration::from_secs(30);

/// Buckets of `operation_duration_seconds`: a Runbook Job can end in a second, a Backup of
/// a large volume take hours.
const DURATION_BUCKETS: [f64; 13] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 21600.0,
];

/// Labels of `operations_started_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct TypeLabels {
    /// `spec.type`.
    pub r#type: &'static str,
}

/// Buckets of `operation_end_from_child_seconds`: an end written from a child's event is a
/// matter of milliseconds.
const END_FROM_CHILD_BUCKETS: [f64; 11] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// `operation_end_from_child_seconds`: the engine's own share of an end decided from a
/// child's event (the runtime's fast lane), from the event reaching the engine to the
/// status write returning. Registered once per binary; cheap to clone.
#[derive(Clone, Debug)]
pub struct EndFromChild {
    seconds: Family<TypeLabels, Histogram, fn() -> Histogram>,
}

fn end_from_child_histogram() -> Histogram {
    Histogram::new(END_FROM_CHILD_BUCKETS)
}

impl EndFromChild {
    /// Creates and registers the histogram.
    pub fn register(metrics: &Metrics) -> Self {
        let this = Self {
            seconds: Family::new_with_constructor(end_from_child_histogram as fn() -> Histogram),
        };
        metrics.register(
            "operation_end_from_child_seconds",
            "From a child's event reaching the engine to the end it decided being written, by type",
            this.seconds.clone(),
        );
        this
    }

    /// Records one end of an Operation of `op_type`, `elapsed` after its child's event.
    pub fn observe(&self, op_type: OperationType, elapsed: Duration) {
        self.seconds
            .get_or_create(&TypeLabels {
                r#type: op_type.as_str(),
            })
            .observe(elapsed.as_secs_f64());
    }
}

/// Labels of `operations`, `operations_finished_total` and `operation_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PhaseLabels {
    /// `spec.type`.
    pub r#type: &'static str,
    /// `status.phase` (`Pending` before the engine wrote one).
    pub phase: &'static str,
}

/// What the observer keeps of one Operation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Seen {
    /// `status.phase`, `Pending` when absent.
    pub phase: OperationPhase,
    /// `status.startTime` is set.
    pub started: bool,
    /// `completionTime - startTime` in seconds, when both are set.
    pub duration: Option<f64>,
}

impl Seen {
    /// What matters of `op`.
    pub fn of(op: &Operation) -> Self {
        let status = op.status.as_ref();
        let start = status.and_then(|s| s.start_time.as_ref()).map(|t| t.0);
        let end = status.and_then(|s| s.completion_time.as_ref()).map(|t| t.0);
        Self {
            phase: status.and_then(|s| s.phase).unwrap_or_default(),
            started: start.is_some(),
            duration: start
                .zip(end)
                .map(|(start, end)| end.duration_since(start).as_secs_f64().max(0.0)),
        }
    }
}

/// The transitions between two observations of one Operation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Transitions {
    /// It started.
    pub started: bool,
    /// It ended in this phase, after this many seconds (when it had started).
    pub finished: Option<(OperationPhase, Option<f64>)>,
}

/// What happened between `before` (`None`: not seen before, i.e. created since) and `after`.
pub fn transitions(before: Option<&Seen>, after: &Seen) -> Transitions {
    let was_started = before.is_some_and(|b| b.started);
    let was_terminal = before.is_some_and(|b| b.phase.is_terminal());
    Transitions {
        started: after.started && !was_started,
        finished: (after.phase.is_terminal() && !was_terminal).then_some((after.phase, after.duration)),
    }
}

/// Operations by phase, from what the observer knows.
pub fn phase_counts<'a>(
    op_type: OperationType,
    seen: impl IntoIterator<Item = &'a Seen>,
) -> BTreeMap<PhaseLabels, i64> {
    let mut counts = BTreeMap::new();
    for s in seen {
        *counts
            .entry(PhaseLabels {
                r#type: op_type.as_str(),
                phase: s.phase.as_str(),
            })
            .or_insert(0) += 1;
    }
    counts
}

/// The Operation metrics of one engine binary (all its types). Cheap to clone.
#[derive(Clone, Debug)]
pub struct OperationMetrics {
    phases: GaugeSnapshot<PhaseLabels>,
    started: Family<TypeLabels, Counter>,
    finished: Family<PhaseLabels, Counter>,
    duration: Family<PhaseLabels, Histogram, fn() -> Histogram>,
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

impl OperationMetrics {
    /// Creates and registers the metrics, with the series of `types` at zero (so rates and
    /// alerts see them before the first Operation).
    pub fn register(metrics: &Metrics, types: &[OperationType]) -> Self {
        let m = Self {
            phases: GaugeSnapshot::register(metrics, "operations", "Operations that exist, by type and phase"),
            started: Family::default(),
            finished: Family::default(),
            duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
        };
        metrics.register(
            "operations_started",
            "Operations seen to start, by type",
            m.started.clone(),
        );
        metrics.register(
            "operations_finished",
            "Operations seen to end, by type and terminal phase",
            m.finished.clone(),
        );
        metrics.register(
            "operation_duration_seconds",
            "completionTime - startTime of the Operations seen to end, by type and terminal phase",
            m.duration.clone(),
        );
        for op_type in types {
            let r#type = op_type.as_str();
            drop(m.started.get_or_create(&TypeLabels { r#type }));
            for phase in [
                OperationPhase::Succeeded,
                OperationPhase::Failed,
                OperationPhase::Expired,
            ] {
                let labels = PhaseLabels {
                    r#type,
                    phase: phase.as_str(),
                };
                drop(m.finished.get_or_create(&labels));
                drop(m.duration.get_or_create(&labels));
            }
        }
        m
    }

    /// Counts `t` for an Operation of `op_type`.
    pub fn record(&self, op_type: OperationType, t: Transitions) {
        let r#type = op_type.as_str();
        if t.started {
            self.started.get_or_create(&TypeLabels { r#type }).inc();
        }
        if let Some((phase, duration)) = t.finished {
            let labels = PhaseLabels {
                r#type,
                phase: phase.as_str(),
            };
            self.finished.get_or_create(&labels).inc();
            if let Some(seconds) = duration {
                self.duration.get_or_create(&labels).observe(seconds);
            }
        }
    }
}

/// The observer's state for one type: the Operations it knows, by UID.
#[derive(Debug, Default)]
struct Observer {
    known: HashMap<String, Seen>,
    /// Filled during a (re-)list, then swapped in.
    relist: Option<HashMap<String, Seen>>,
    /// The first list is done: from now on, an unknown Operation is a new one.
    listed: bool,
}

impl Observer {
    /// Applies one watch event; returns the transitions to count.
    fn event(&mut self, event: watcher::Event<DeserializeGuard<Operation>>) -> Vec<Transitions> {
        let op_of = |guard: &DeserializeGuard<Operation>| -> Option<(String, Seen)> {
            let op = guard.0.as_ref().ok()?;
            Some((op.uid()?, Seen::of(op)))
        };
        match event {
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                Vec::new()
            }
            watcher::Event::InitApply(guard) => {
                let Some((uid, seen)) = op_of(&guard) else {
                    return Vec::new();
                };
                // Before the first list is done, nothing is known: nothing to count.
                let counted = self.known.get(&uid).map(|before| transitions(Some(before), &seen));
                self.relist.get_or_insert_with(HashMap::new).insert(uid, seen);
                counted.into_iter().collect()
            }
            watcher::Event::InitDone => {
                self.known = self.relist.take().unwrap_or_default();
                self.listed = true;
                Vec::new()
            }
            watcher::Event::Apply(guard) => {
                let Some((uid, seen)) = op_of(&guard) else {
                    return Vec::new();
                };
                let before = self.known.insert(uid, seen);
                if before.is_none() && !self.listed {
                    return Vec::new();
                }
                vec![transitions(before.as_ref(), &seen)]
            }
            watcher::Event::Delete(guard) => {
                if let Some(uid) = guard.uid() {
                    self.known.remove(&uid);
                }
                Vec::new()
            }
        }
    }
}

/// Watches the Operations of `op_type` (in `api`'s scope) and keeps `metrics` current
/// until `shutdown`.
pub async fn observe_operations(
    api: Api<DeserializeGuard<Operation>>,
    op_type: OperationType,
    metrics: OperationMetrics,
    gate: LeaderGate,
    shutdown: CancellationToken,
) {
    let selector = format!("spec.type={}", op_type.as_str());
    let mut events = watcher(api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .boxed();
    let mut observer = Observer::default();
    let mut ticks = tokio::time::interval(REFRESH);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticks.tick() => {
                // The binary's types share the family: each observer replaces its own part.
                let counts = if gate.is_leader() {
                    phase_counts(op_type, observer.known.values())
                } else {
                    BTreeMap::new()
                };
                metrics.phases.replace_part(|l| l.r#type == op_type.as_str(), &counts);
            }
            event = events.next() => match event {
                Some(Ok(event)) => {
                    let counted = observer.event(event);
                    if gate.is_leader() {
                        for t in counted {
                            metrics.record(op_type, t);
                        }
                    }
                }
                Some(Err(e)) => debug!(error = %e, r#type = op_type.as_str(), "Operation metrics watch failed; retrying"),
                None => return,
            },
        }
    }
}

/// Starts [`observe_operations`] for each of `types`.
pub async fn observe_all(
    client: Client,
    scope: controller_kit::WatchScope,
    types: Vec<OperationType>,
    metrics: Metrics,
    gate: LeaderGate,
    shutdown: CancellationToken,
) {
    let registered = OperationMetrics::register(&metrics, &types);
    let runs = types.into_iter().map(|op_type| {
        observe_operations(
            scope.api(client.clone()),
            op_type,
            registered.clone(),
            gate.clone(),
            shutdown.clone(),
        )
    });
    futures::future::join_all(runs).await;
}

// ---------------------------------------------------------------------------
// Backup schedules
// ---------------------------------------------------------------------------

/// Labels of the backup schedule gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct AppLabels {
    /// The ApplicationInstance's namespace.
    pub namespace: String,
    /// The ApplicationInstance's name.
    pub application: String,
}

/// The backup schedule gauges' values at one moment.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ScheduleGauges {
    /// `backup_schedule_last_success_timestamp_seconds`.
    pub last_success: BTreeMap<AppLabels, i64>,
    /// `backup_schedule_due_timestamp_seconds`.
    pub due: BTreeMap<AppLabels, i64>,
}

/// The gauges for `apps` (pure): only applications with a valid, not suspended schedule.
pub fn schedule_gauges<'a>(apps: impl IntoIterator<Item = &'a ApplicationInstance>) -> ScheduleGauges {
    let mut out = ScheduleGauges::default();
    for app in apps {
        let Some(spec) = app.spec.backup_schedule.as_ref() else {
            continue;
        };
        if spec.suspend {
            continue;
        }
        let Ok(schedule) = operations::schedule::Schedule::parse(spec) else {
            continue;
        };
        let status = app.status.as_ref().and_then(|s| s.backup_schedule.as_ref());
        let last_success = status.and_then(|s| s.last_successful_time.as_ref()).map(|t| t.0);
        // Before the controller recorded when the schedule took effect, there is nothing to
        // wait for yet.
        let Some(since) = status.and_then(|s| s.since.as_ref()).map(|t| t.0) else {
            continue;
        };
        let labels = AppLabels {
            namespace: app.namespace().unwrap_or_default(),
            application: app.name_any(),
        };
        let from = last_success.map_or(since, |t| t.max(since));
        if let Ok(due) = schedule.next_after(from) {
            out.due.insert(labels.clone(), due.as_second());
        }
        if let Some(t) = last_success {
            out.last_success.insert(labels, t.as_second());
        }
    }
    out
}

/// Recomputes the backup schedule gauges from the schedule controller's cache every
/// [`REFRESH`] until `shutdown`; only the leader reports.
pub async fn observe_schedules(
    store: Store<DeserializeGuard<ApplicationInstance>>,
    metrics: Metrics,
    gate: LeaderGate,
    shutdown: CancellationToken,
) {
    let last_success: GaugeSnapshot<AppLabels> = GaugeSnapshot::register(
        &metrics,
        "backup_schedule_last_success_timestamp_seconds",
        "Unix time the newest successful scheduled backup of the ApplicationInstance completed",
    );
    let due: GaugeSnapshot<AppLabels> = GaugeSnapshot::register(
        &metrics,
        "backup_schedule_due_timestamp_seconds",
        "Unix time of the first scheduled backup after the last successful one (the backup the schedule waits for)",
    );
    controller_kit::metrics::refresh_while_leading(
        REFRESH,
        &gate,
        &shutdown,
        || {
            last_success.clear();
            due.clear();
        },
        || {
            let state = store.state();
            let gauges = schedule_gauges(state.iter().filter_map(|guard| guard.0.as_ref().ok()));
            last_success.replace(&gauges.last_success);
            due.replace(&gauges.due);
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use OperationPhase::{Expired, Failed, Pending, Running, Succeeded};

    fn seen(phase: OperationPhase, started: bool, duration: Option<f64>) -> Seen {
        Seen {
            phase,
            started,
            duration,
        }
    }

    #[test]
    fn transitions_count_each_start_and_end_once() {
        let pending = seen(Pending, false, None);
        let running = seen(Running, true, None);
        let failed = seen(Failed, true, Some(42.0));
        let expired = seen(Expired, false, None);
        let none = Transitions {
            started: false,
            finished: None,
        };
        // (before, after, expected)
        let cases = [
            (None, pending, none),
            (Some(pending), pending, none),
            (
                Some(pending),
                running,
                Transitions {
                    started: true,
                    finished: None,
                },
            ),
            (Some(running), running, none),
            (
                Some(running),
                failed,
                Transitions {
                    started: false,
                    finished: Some((Failed, Some(42.0))),
                },
            ),
            (Some(failed), failed, none),
            // Both seen at once (missed while the watch was down, or created already done).
            (
                Some(pending),
                failed,
                Transitions {
                    started: true,
                    finished: Some((Failed, Some(42.0))),
                },
            ),
            (
                None,
                failed,
                Transitions {
                    started: true,
                    finished: Some((Failed, Some(42.0))),
                },
            ),
            // Expired before it ever started: an end without a start or a duration.
            (
                Some(pending),
                expired,
                Transitions {
                    started: false,
                    finished: Some((Expired, None)),
                },
            ),
        ];
        for (before, after, want) in cases {
            assert_eq!(transitions(before.as_ref(), &after), want, "{before:?} -> {after:?}");
        }
    }

    fn op(uid: &str, phase: Option<&str>, start: Option<i64>, end: Option<i64>) -> DeserializeGuard<Operation> {
        let time = |s: i64| jiff::Timestamp::from_second(s).unwrap().to_string();
        let mut status = serde_json::Map::new();
        if let Some(phase) = phase {
            status.insert("phase".into(), phase.into());
        }
        if let Some(s) = start {
            status.insert("startTime".into(), time(s).into());
        }
        if let Some(s) = end {
            status.insert("completionTime".into(), time(s).into());
        }
        let op: Operation = serde_json::from_value(serde_json::json!({
            "apiVersion": "vworkspace.io/v1alpha1",
            "kind": "Operation",
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"type": "Backup", "applicationRef": {"name": "app"}, "requestId": "r-1"},
            "status": status,
        }))
        .unwrap();
        DeserializeGuard(Ok(op))
    }

    #[test]
    fn the_first_list_counts_nothing_later_events_and_relists_count_changes() {
        let mut observer = Observer::default();
        let mut feed = |events: Vec<watcher::Event<DeserializeGuard<Operation>>>| -> Vec<Transitions> {
            events.into_iter().flat_map(|e| observer.event(e)).collect()
        };
        let first = feed(vec![
            watcher::Event::Init,
            watcher::Event::InitApply(op("a", Some("Running"), Some(0), None)),
            watcher::Event::InitApply(op("b", Some("Failed"), Some(0), Some(5))),
            watcher::Event::InitDone,
        ]);
        assert!(first.is_empty(), "{first:?}");
        let counted = feed(vec![
            // A new Operation, then it starts and ends.
            watcher::Event::Apply(op("c", None, None, None)),
            watcher::Event::Apply(op("c", Some("Running"), Some(10), None)),
            watcher::Event::Apply(op("c", Some("Succeeded"), Some(10), Some(70))),
            // The watch is lost; meanwhile `a` failed, `b` was deleted.
            watcher::Event::Init,
            watcher::Event::InitApply(op("a", Some("Failed"), Some(0), Some(30))),
            watcher::Event::InitApply(op("c", Some("Succeeded"), Some(10), Some(70))),
            watcher::Event::InitDone,
        ]);
        let interesting: Vec<_> = counted
            .into_iter()
            .filter(|t| t.started || t.finished.is_some())
            .collect();
        assert_eq!(
            interesting,
            [
                Transitions {
                    started: true,
                    finished: None
                },
                Transitions {
                    started: false,
                    finished: Some((Succeeded, Some(60.0)))
                },
                Transitions {
                    started: false,
                    finished: Some((Failed, Some(30.0)))
                },
            ]
        );
        let phases: BTreeMap<_, _> = phase_counts(OperationType::Backup, observer.known.values());
        let label = |phase| PhaseLabels {
            r#type: "Backup",
            phase,
        };
        assert_eq!(
            phases,
            [(label("Failed"), 1), (label("Succeeded"), 1)].into_iter().collect()
        );
    }

    #[test]
    fn recorded_transitions_reach_the_exported_metrics() {
        let registry = Metrics::new("vworkspace");
        let m = OperationMetrics::register(&registry, &[OperationType::Upgrade]);
        let text = registry.encode().unwrap();
        for needle in [
            "vworkspace_operations_started_total{type=\"Upgrade\"} 0",
            "vworkspace_operations_finished_total{type=\"Upgrade\",phase=\"Failed\"} 0",
            "vworkspace_operation_duration_seconds_count{type=\"Upgrade\",phase=\"Succeeded\"} 0",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        m.record(
            OperationType::Upgrade,
            Transitions {
                started: true,
                finished: Some((Failed, Some(90.0))),
            },
        );
        m.phases
            .replace(&phase_counts(OperationType::Upgrade, &[seen(Failed, true, None)]));
        let text = registry.encode().unwrap();
        for needle in [
            "vworkspace_operations_started_total{type=\"Upgrade\"} 1",
            "vworkspace_operations_finished_total{type=\"Upgrade\",phase=\"Failed\"} 1",
            "vworkspace_operation_duration_seconds_sum{type=\"Upgrade\",phase=\"Failed\"} 90.0",
            "vworkspace_operations{type=\"Upgrade\",phase=\"Failed\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
    }

    fn scheduled(cron: &str, suspend: bool, since: Option<&str>, last_success: Option<&str>) -> ApplicationInstance {
        let mut status = serde_json::Map::new();
        if let Some(t) = since {
            status.insert("since".into(), t.into());
        }
        if let Some(t) = last_success {
            status.insert("lastSuccessfulTime".into(), t.into());
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "vworkspace.io/v1alpha1",
            "kind": "ApplicationInstance",
            "metadata": {"name": "app", "namespace": "ns"},
            "spec": {
                "chart": {"name": "demo", "version": "0.1.0", "repository": {"url": "https://charts.example.com"}},
                "backupSchedule": {"cron": cron, "suspend": suspend},
            },
            "status": {"backupSchedule": status},
        }))
        .unwrap()
    }

    fn ts(s: &str) -> i64 {
        s.parse::<jiff::Timestamp>().unwrap().as_second()
    }

    #[test]
    fn backups_are_due_at_the_first_scheduled_time_after_the_last_success() {
        let since = Some("2026-01-01T00:00:00Z");
        // (app, due, last success)
        let cases = [
            // Never succeeded: the first run after the schedule took effect.
            (
                scheduled("0 3 * * *", false, since, None),
                Some("2026-01-01T03:00:00Z"),
                None,
            ),
            (
                scheduled("0 3 * * *", false, since, Some("2026-01-05T03:10:00Z")),
                Some("2026-01-06T03:00:00Z"),
                Some("2026-01-05T03:10:00Z"),
            ),
            (
                scheduled("@hourly", false, since, Some("2026-01-05T03:10:00Z")),
                Some("2026-01-05T04:00:00Z"),
                Some("2026-01-05T03:10:00Z"),
            ),
            // Suspended, invalid, or not yet taken up by the controller: no series.
            (scheduled("0 3 * * *", true, since, None), None, None),
            (scheduled("61 3 * * *", false, since, None), None, None),
            (scheduled("0 3 * * *", false, None, None), None, None),
        ];
        for (app, due, last) in cases {
            let got = schedule_gauges([&app]);
            let labels = AppLabels {
                namespace: "ns".into(),
                application: "app".into(),
            };
            assert_eq!(
                got.due.get(&labels).copied(),
                due.map(ts),
                "{:?}",
                app.spec.backup_schedule
            );
            assert_eq!(got.last_success.get(&labels).copied(), last.map(ts));
        }
    }
}
