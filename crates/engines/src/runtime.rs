//! The Operation controller every engine runs, once per Operation type it handles.
//!
//! Per reconcile (`docs/day-2-operations.md`, "Lifecycle"):
//!
//! 1. malformed object, not the leader, terminal → nothing;
//! 2. namespace outside the allow-list → `Failed NamespaceNotAllowed`;
//! 3. the application's Operations are listed fresh from the API server (not a cache), the
//!    application is read, and [`operations::lifecycle::gate`] decides; a duplicate ends at once.
//!    Once started, the gate always lets the Operation go on, so its siblings are not listed
//!    and the application is read only for a driver that uses it
//!    ([`Driver::reads_application_once_started`]);
//! 4. not started yet: the application must exist and its target namespace be allowed,
//!    and the [`Driver`] validates its payload; then deadline, `notBefore`, the application's
//!    maintenance windows and the queue;
//! 5. starting is a *claim*: the status write that sets `startTime` carries the
//!    Operation's `resourceVersion`, so an engine acting on a stale copy loses with a
//!    conflict instead of starting twice;
//! 6. the driver creates or reads its children and reports an [`Outcome`]; a child already in
//!    the cache of the child watch is taken from there (the event that woke the reconcile is
//!    in it) instead of being read again;
//! 7. the status is written only when it changed (no writes at rest); every write of a started
//!    Operation, and every end, carries the `resourceVersion` it was decided on, like the claim,
//!    so the end and its Event are written once even when a stale copy is reconciled.
//!
//! A driver that decides from its children's cache alone ([`Driver::ends_from_child_events`])
//! also gets a fast lane: a child's event that ends its Operation is written at once instead of
//! waiting in the work queue behind every start queued before it ([`end_from_child_event`]).

use std::{
    collections::HashMap,
    future::Future,
    ops::ControlFlow,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use api::{
    ApplicationInstance, LABEL_MANAGED_BY, MANAGED_BY, Operation, OperationPhase, OperationStatus, OperationType,
    conditions::operation_reasons,
};
use controller_kit::{
    CancellationToken, ControllerMetrics, LeaderGate, Readiness, RetryBackoff, WatchScope, WriteVerb,
};
use futures::StreamExt;
use jiff::Timestamp;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams},
    core::DeserializeGuard,
    runtime::{
        Controller, WatchStreamExt,
        controller::{Action, Config},
        events::{Event, EventType, Recorder},
        predicates,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use operations::lifecycle::Maintenance;
use operations::{Gate, Outcome, Siblings, lifecycle, meta, status};
use tracing::{debug, info, instrument, warn};

/// How often a queued Operation looks at its siblings again. Operations of other engines
/// are not watched (each engine watches only its own types), so a queue advances by polling.
const QUEUE_POLL: Duration = Duration::from_secs(2);
/// How often an Operation waiting for a maintenance window looks at the application again
/// (its windows may change; ApplicationInstances are not watched), besides waking when the
/// window opens.
const WINDOW_RECHECK: Duration = Duration::from_secs(60);
/// How often a replica that does not lead looks at an Operation again.
const FOLLOWER_RECHECK: Duration = Duration::from_secs(5);
/// How soon an Operation whose end lost to a newer version looks again (the watch usually
/// delivers that version first).
const STALE_END_RECHECK: Duration = Duration::from_secs(1);
/// Child events waiting for the fast lane; when full, the work queue alone handles them.
const FAST_END_BUFFER: usize = 1024;
/// Ends the fast lane writes at once.
const FAST_END_CONCURRENCY: usize = 8;
/// Tries of the fast lane for one event, and the wait after one lost to a newer version.
const FAST_END_ATTEMPTS: usize = 3;
const FAST_END_STALE_WAIT: Duration = Duration::from_millis(50);

/// What one try of the fast lane did.
#[derive(Debug, PartialEq, Eq)]
enum FastEnd {
    /// Wrote the end.
    Ended,
    /// Nothing to end, or left to the work queue.
    Left,
    /// Decided on a stale copy: the write lost with a conflict.
    Stale,
}

/// Errors of one reconcile. Kubernetes errors are retried with backoff; domain errors are
/// permanent (the spec is immutable) and end the Operation `Failed` instead.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The Operation cannot be acted on (its reason comes from the error).
    #[error(transparent)]
    Domain(#[from] operations::Error),
    /// A transient condition worth retrying, e.g. an object not readable yet.
    #[error("{0}")]
    Retry(String),
}

impl DriverError {
    fn metric_label(&self) -> &'static str {
        match self {
            DriverError::Kube(_) => "kube",
            DriverError::Domain(_) => "domain",
            DriverError::Retry(_) => "retry",
        }
    }
}

/// What an engine watches besides its Operations, to be woken when the driven work moves.
#[derive(Clone, Debug)]
pub enum Watch {
    /// Objects with a controller owner reference to an Operation (Jobs, child Operations).
    Owned(ApiResource),
    /// Objects linked to their Operation by our labels only, because they live in another
    /// namespace (Velero Backups and Restores in Velero's namespace).
    Labelled {
        /// The kind.
        resource: ApiResource,
        /// Namespace to watch (`None`: all).
        namespace: Option<String>,
    },
    /// ApplicationInstances: a change wakes the application's unfinished Operations.
    Applications,
}

/// One Operation type's behaviour. The runtime owns the lifecycle; a driver only checks
/// its payload and drives its children.
pub trait Driver: Send + Sync + 'static {
    /// The Operation type this driver acts on.
    fn op_type(&self) -> OperationType;

    /// Extra watches (children, applications).
    fn watches(&self) -> Vec<Watch> {
        Vec::new()
    }

    /// Whether [`Driver::drive`] uses [`Cx::app`] after the Operation started. `false` spares
    /// the read on every pass of a running Operation, so its terminal status follows its
    /// children's end sooner.
    fn reads_application_once_started(&self) -> bool {
        true
    }

    /// Whether [`Driver::drive`] of a started Operation decides from [`Cx::cached_children`]
    /// alone, without API calls or [`Cx::app`]. Then a child's event that ends the Operation
    /// is acted on at once, outside the work queue (where it would wait behind every start
    /// queued before it); see [`end_from_child_event`].
    fn ends_from_child_events(&self) -> bool {
        false
    }

    /// The status the claim writes, when the driver can tell from the Operation alone what
    /// [`Driver::drive`] will report once its children exist (`None`: `Running`, "Starting").
    /// Written with the claim, it spares the write after the children's creation; and a child
    /// that ends quickly then finds its Operation as the end is decided on, so the end is
    /// written at once instead of losing to a stale copy and waiting.
    fn claim_outcome(&self, _cx: &Cx) -> Option<Outcome> {
        None
    }

    /// While Running, look again this often even when no watch fires.
    fn poll_interval(&self) -> Duration {
        Duration::from_secs(10)
    }

    /// Checks only this engine can make before the Operation starts (payload, referenced
    /// objects, driven controller installed). `Some(outcome)` ends the Operation
    /// (a failure with a reason); `None` lets it go on to the schedule checks.
    fn validate(&self, cx: &Cx) -> impl Future<Output = Result<Option<Outcome>, DriverError>> + Send;

    /// Creates (idempotently) and reads the children; reports where the work stands.
    fn drive(&self, cx: &Cx) -> impl Future<Output = Result<Outcome, DriverError>> + Send;
}

/// What a driver gets for one reconcile.
pub struct Cx {
    /// Client with the engine's identity.
    pub client: Client,
    /// The Operation (without `managedFields`).
    pub op: Operation,
    /// Its ApplicationInstance, if it exists; once the Operation started, read only when
    /// [`Driver::reads_application_once_started`] (`None` otherwise).
    pub app: Option<ApplicationInstance>,
    /// The other Operations of the application, fresh from the API server; listed only before
    /// the Operation starts (empty once started: nothing after the start depends on them).
    pub siblings: Vec<Operation>,
    /// The children the engine watches ([`Watch::Owned`]), as last seen by the watch.
    pub cached_children: ChildCache,
    /// Namespace allow-list and watch scope.
    pub scope: WatchScope,
    /// Field manager of every write.
    pub field_manager: &'static str,
    /// Write counters.
    pub metrics: ControllerMetrics,
    /// The time of this reconcile.
    pub now: Timestamp,
}

impl Cx {
    /// The Operation's namespace.
    pub fn namespace(&self) -> &str {
        self.op.metadata.namespace.as_deref().unwrap_or_default()
    }

    /// The namespace the application's release lives in.
    pub fn target_namespace(&self) -> Option<&str> {
        self.app
            .as_ref()
            .map(|app| app.spec.target_namespace_or(self.namespace()))
    }
}

/// The caches of the [`Watch::Owned`] watches, one per kind.
#[derive(Clone, Default)]
pub struct ChildCache {
    stores: Vec<(ApiResource, Store<DynamicObject>)>,
}

impl ChildCache {
    /// `namespace/name` of `resource` as the watch last saw it (`None` when not watched or not
    /// seen). It may lag the API server, never the event that woke the reconcile.
    pub fn get(&self, resource: &ApiResource, namespace: &str, name: &str) -> Option<serde_json::Value> {
        let (dyntype, store) = self.stores.iter().find(|(r, _)| r == resource)?;
        let object = store.get(&ObjectRef::new_with(name, dyntype.clone()).within(namespace))?;
        serde_json::to_value(&*object).ok()
    }
}

/// Settings shared by every controller of one engine binary.
#[derive(Clone)]
pub struct EngineSettings {
    /// Binary name, also the event reporter.
    pub name: &'static str,
    /// Field manager of every write.
    pub field_manager: &'static str,
    /// Namespace allow-list and watch scope.
    pub scope: WatchScope,
    /// Parallel reconciles per controller.
    pub concurrency: u16,
    /// Only the leader writes.
    pub gate: LeaderGate,
    /// Metrics of the binary.
    pub metrics: controller_kit::Metrics,
    /// Event recorder.
    pub recorder: Recorder,
    /// Status changes go to the agent's status channel (a no-op when none is configured).
    pub publisher: status_channel::Publisher,
    /// The fast lane's timings.
    pub end_from_child: crate::metrics::EndFromChild,
}

#[cfg(test)]
impl EngineSettings {
    /// The backup engine's settings on `client` for reconcile tests: every namespace but the
    /// system ones allowed (or only `allowed`), always the leader, no status channel.
    pub(crate) fn for_tests(client: &Client, allowed: Option<&str>) -> anyhow::Result<Self> {
        let policy = match allowed {
            Some(ns) => ns.parse()?,
            None => controller_kit::namespaces::NamespacePolicy::All,
        };
        let reporter = kube::runtime::events::Reporter {
            controller: "backup-engine".into(),
            instance: None,
        };
        let metrics = controller_kit::Metrics::new("test");
        Ok(Self {
            end_from_child: crate::metrics::EndFromChild::register(&metrics),
            metrics,
            name: "backup-engine",
            field_manager: "vworkspace-backup-engine",
            scope: WatchScope::new(policy, None)?,
            concurrency: 1,
            gate: LeaderGate::always_leader(),
            recorder: Recorder::new(client.clone(), reporter),
            publisher: status_channel::Publisher::disabled(),
        })
    }
}

/// Marks the binary ready once every controller's cache has synced.
#[derive(Clone)]
pub struct SyncTracker {
    remaining: Arc<AtomicUsize>,
    readiness: Readiness,
}

impl SyncTracker {
    /// Ready after `controllers` controllers reported synced.
    pub fn new(controllers: usize, readiness: Readiness) -> Self {
        Self {
            remaining: Arc::new(AtomicUsize::new(controllers)),
            readiness,
        }
    }

    pub(crate) fn synced(&self) {
        if self.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.readiness.set_ready();
        }
    }
}

struct Context<D> {
    driver: D,
    client: Client,
    cached_children: ChildCache,
    settings: EngineSettings,
    metrics: ControllerMetrics,
    failures: RetryBackoff<ObjectRef<DeserializeGuard<Operation>>>,
    /// Operations the fast lane is deciding on now (with the events being handled), so the
    /// work queue, woken by the same event, leaves the end to it.
    fast_lane: Mutex<HashMap<OpRef, usize>>,
}

impl<D> Context<D> {
    /// Notes that the fast lane handles an event of `op_ref` (`true`), or is done with it.
    fn fast_lane_handles(&self, op_ref: &OpRef, handles: bool) {
        let Ok(mut in_flight) = self.fast_lane.lock() else {
            return;
        };
        let count = in_flight.entry(op_ref.clone()).or_insert(0);
        if handles {
            *count += 1;
        } else {
            *count = count.saturating_sub(1);
            if *count == 0 {
                in_flight.remove(op_ref);
            }
        }
    }

    /// Whether the fast lane is deciding on `op_ref` now.
    fn fast_lane_has(&self, op_ref: &OpRef) -> bool {
        self.fast_lane
            .lock()
            .is_ok_and(|in_flight| in_flight.contains_key(op_ref))
    }

    /// What a driver sees of `op` at `now`: this engine's client, caches and settings.
    fn cx(&self, op: Operation, app: Option<ApplicationInstance>, siblings: Vec<Operation>, now: Timestamp) -> Cx {
        Cx {
            client: self.client.clone(),
            op,
            app,
            siblings,
            cached_children: self.cached_children.clone(),
            scope: self.settings.scope.clone(),
            field_manager: self.settings.field_manager,
            metrics: self.metrics.clone(),
            now,
        }
    }
}

type OpRef = ObjectRef<DeserializeGuard<Operation>>;

/// Runs the controller for `driver`'s Operation type until `shutdown`.
pub async fn run<D: Driver>(
    client: Client,
    driver: D,
    settings: EngineSettings,
    synced: SyncTracker,
    shutdown: CancellationToken,
) {
    let op_type = driver.op_type();
    let controller_name = controller_name(op_type);
    let metrics = settings.metrics.controller(controller_name);
    metrics.declare_write(WriteVerb::Apply, "Operation");
    let scope = settings.scope.clone();

    // Only this engine's type: the API server filters (selectable field `spec.type`).
    let ops: Api<DeserializeGuard<Operation>> = scope.api(client.clone());
    let selector = format!("spec.type={}", op_type.as_str());
    let (reader, writer) = reflector::store();
    let op_stream = watcher(ops, watcher::Config::default().fields(&selector))
        .default_backoff()
        .modify(|op| op.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects()
        // Our own status writes do not change the generation: they do not wake us.
        .predicate_filter(predicates::generation, Default::default());

    controller_kit::controller::on_cache_synced(reader.clone(), move || {
        info!(r#type = op_type.as_str(), "Operation cache synced");
        synced.synced();
    });

    let mut controller = Controller::for_stream(op_stream, reader.clone());
    let mut cached_children = ChildCache::default();
    // The fast lane for ends decided from a child's event (`Driver::ends_from_child_events`).
    let (ended_tx, ended_rx) = if driver.ends_from_child_events() {
        let (tx, rx) = tokio::sync::mpsc::channel::<(OpRef, Instant)>(FAST_END_BUFFER);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    for watch in driver.watches() {
        controller = match watch {
            Watch::Owned(resource) => {
                let api: Api<DynamicObject> = match scope.watch_namespace() {
                    Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
                    None => Api::all_with(client.clone(), &resource),
                };
                let config = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
                let writer = reflector::store::Writer::new(resource.clone());
                cached_children.stores.push((resource.clone(), writer.as_reader()));
                // With backoff: a refused or failing watch must not retry in a hot loop. The
                // cache is written before the event is passed on, so a reconcile finds it there.
                let ended = ended_tx.clone();
                let stream = watcher(api, config)
                    .default_backoff()
                    .modify(|child| child.managed_fields_mut().clear())
                    .reflect(writer)
                    .touched_objects()
                    .inspect(move |child| {
                        if let (Some(sender), Ok(child)) = (&ended, child)
                            && let Some(owner) = operation_owner(child)
                        {
                            // Full: the work queue still has the event.
                            let _ = sender.try_send((owner, Instant::now()));
                        }
                    });
                controller.owns_stream_with(stream, resource)
            }
            Watch::Labelled { resource, namespace } => {
                // `None`: wherever the engine watches (all namespaces, or its watch namespace).
                let api: Api<DynamicObject> = match namespace.as_deref().or(scope.watch_namespace()) {
                    Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
                    None => Api::all_with(client.clone(), &resource),
                };
                let config = watcher::Config::default().labels(&format!(
                    "{LABEL_MANAGED_BY}={MANAGED_BY},{}={}",
                    meta::LABEL_OPERATION_TYPE,
                    op_type.as_str()
                ));
                let stream = watcher(api, config).default_backoff().touched_objects();
                controller.watches_stream_with(
                    stream,
                    |object: DynamicObject| {
                        let labels = object.labels();
                        let name = labels.get(meta::LABEL_OPERATION)?;
                        let namespace = labels.get(meta::LABEL_OPERATION_NAMESPACE)?;
                        Some(OpRef::new(name).within(namespace))
                    },
                    resource,
                )
            }
            Watch::Applications => {
                let apps: Api<DeserializeGuard<ApplicationInstance>> = scope.api(client.clone());
                let store = reader.clone();
                let stream = watcher(apps, watcher::Config::default())
                    .default_backoff()
                    .touched_objects();
                controller.watches_stream(stream, move |app| {
                    operations_of(&store, app.namespace().as_deref(), &app.name_any())
                })
            }
        };
    }

    let ctx = Arc::new(Context {
        driver,
        client,
        cached_children,
        metrics,
        settings: settings.clone(),
        // 1 s doubling to 5 min.
        failures: RetryBackoff::new(Duration::from_secs(1), Duration::from_secs(300)),
        fast_lane: Mutex::default(),
    });
    drop(ended_tx);
    if let Some(mut ended) = ended_rx {
        let (ctx, store) = (ctx.clone(), reader.clone());
        // Ends when the child watches (the senders) are dropped with the controller.
        tokio::spawn(
            futures::stream::poll_fn(move |cx| ended.poll_recv(cx)).for_each_concurrent(FAST_END_CONCURRENCY, move |(op_ref, arrived)| {
                let (ctx, store) = (ctx.clone(), store.clone());
                async move {
                    ctx.fast_lane_handles(&op_ref, true);
                    // A conflict means the copy was stale (a Running write of the work queue
                    // landed first): look again once the watch brought the newer version.
                    for _ in 0..FAST_END_ATTEMPTS {
                        match end_from_child_event(&op_ref, &store, &ctx).await {
                            Ok(FastEnd::Stale) => tokio::time::sleep(FAST_END_STALE_WAIT).await,
                            Ok(FastEnd::Ended) => {
                                ctx.settings.end_from_child.observe(ctx.driver.op_type(), arrived.elapsed());
                                break;
                            }
                            Ok(FastEnd::Left) => break,
                            Err(e) => {
                                debug!(error = %e, operation = %op_ref, "ending from a child's event failed; the work queue retries");
                                break;
                            }
                        }
                    }
                    ctx.fast_lane_handles(&op_ref, false);
                }
            }),
        );
    }
    controller
        .with_config(Config::default().concurrency(settings.concurrency))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile::<D>, error_policy::<D>, ctx)
        .for_each(|result| {
            controller_kit::controller::log_result(&result);
            std::future::ready(())
        })
        .await;
    info!(r#type = op_type.as_str(), "controller stopped");
}

/// The Operation a child belongs to (its controller owner reference).
fn operation_owner(child: &DynamicObject) -> Option<OpRef> {
    let owner = child
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "Operation" && o.api_version == api::API_VERSION)?;
    Some(OpRef::new(&owner.name).within(&child.namespace()?))
}

/// The fast lane: a child's event that ends its started Operation writes the end at once
/// instead of waiting in the work queue. It only ever writes an end, conditional on the
/// `resourceVersion` it was decided on, like every status write of a started Operation
/// ([`finish`]); so whichever of it and the work queue writes first wins, the other loses
/// with a conflict, and the end and its Event are written once. Anything else (not leading,
/// not started, not ended, a child not in the cache) is left to the work queue, which has the
/// same event.
async fn end_from_child_event<D: Driver>(
    op_ref: &OpRef,
    store: &Store<DeserializeGuard<Operation>>,
    ctx: &Context<D>,
) -> Result<FastEnd, DriverError> {
    let Some(guard) = store.get(op_ref) else {
        return Ok(FastEnd::Left);
    };
    let Ok(op) = &guard.0 else {
        return Ok(FastEnd::Left);
    };
    let namespace = op.namespace().unwrap_or_default();
    let phase = op.status.as_ref().and_then(|s| s.phase);
    let started = op.status.as_ref().is_some_and(|s| s.start_time.is_some());
    if !ctx.settings.gate.is_leader()
        || !started
        || phase.is_some_and(OperationPhase::is_terminal)
        || !ctx.settings.scope.allows(&namespace)
    {
        return Ok(FastEnd::Left);
    }
    let now = Timestamp::now();
    let cx = ctx.cx(op.clone(), None, Vec::new(), now);
    let outcome = match ctx.driver.drive(&cx).await {
        Ok(outcome) => outcome,
        Err(DriverError::Domain(e)) => e.outcome(),
        Err(e) => return Err(e),
    };
    if !outcome.phase().is_terminal() {
        return Ok(FastEnd::Left);
    }
    let ops: Api<Operation> = Api::namespaced(ctx.client.clone(), &namespace);
    Ok(match record(&ops, &cx.op, outcome, ctx, now).await? {
        Recorded::Stale => FastEnd::Stale,
        Recorded::Terminal => FastEnd::Ended,
        Recorded::Current => FastEnd::Left,
    })
}

/// Unfinished Operations (in `store`) of the application `namespace/app`.
fn operations_of(store: &Store<DeserializeGuard<Operation>>, namespace: Option<&str>, app: &str) -> Vec<OpRef> {
    store
        .state()
        .into_iter()
        .filter(|guard| guard.namespace().as_deref() == namespace)
        .filter(|guard| {
            guard.0.as_ref().is_ok_and(|op| {
                op.spec.application_ref.name == app
                    && !op
                        .status
                        .as_ref()
                        .and_then(|s| s.phase)
                        .is_some_and(OperationPhase::is_terminal)
            })
        })
        .map(|guard| ObjectRef::from_obj(&*guard))
        .collect()
}

/// Name of the controller for `op_type` in metrics and logs.
pub fn controller_name(op_type: OperationType) -> &'static str {
    match op_type {
        OperationType::Backup => "operation-backup",
        OperationType::Restore => "operation-restore",
        OperationType::Snapshot => "operation-snapshot",
        OperationType::Upgrade => "operation-upgrade",
        OperationType::Rollback => "operation-rollback",
        OperationType::Runbook => "operation-runbook",
    }
}

fn error_policy<D: Driver>(
    guard: Arc<DeserializeGuard<Operation>>,
    error: &DriverError,
    ctx: Arc<Context<D>>,
) -> Action {
    ctx.metrics.reconcile_failure(error.metric_label());
    let (delay, attempts) = ctx.failures.failed(ObjectRef::from_obj(&*guard));
    warn!(error = %error, attempts, ?delay, "reconcile failed; retrying");
    Action::requeue(delay)
}

#[instrument(skip_all, fields(namespace = guard.namespace().unwrap_or_default(), name = guard.name_any()))]
async fn reconcile<D: Driver>(
    guard: Arc<DeserializeGuard<Operation>>,
    ctx: Arc<Context<D>>,
) -> Result<Action, DriverError> {
    let _timer = ctx.metrics.reconcile_timer();
    // Malformed → wait for a change; a follower keeps its cache warm and looks again soon.
    let op = match controller_kit::controller::admit(&guard, &ctx.settings.gate, FOLLOWER_RECHECK) {
        ControlFlow::Continue(op) => op.clone(),
        ControlFlow::Break(action) => return Ok(action),
    };
    if op
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(OperationPhase::is_terminal)
    {
        return Ok(Action::await_change());
    }
    let action = step(op, &ctx).await?;
    ctx.failures.succeeded(&ObjectRef::from_obj(&*guard));
    Ok(action)
}

async fn step<D: Driver>(op: Operation, ctx: &Context<D>) -> Result<Action, DriverError> {
    let namespace = op.namespace().unwrap_or_default();
    let ops: Api<Operation> = Api::namespaced(ctx.client.clone(), &namespace);
    let now = Timestamp::now();

    if !ctx.settings.scope.allows(&namespace) {
        let message = format!("namespace {namespace} is not allowed ({})", ctx.settings.scope.policy());
        let outcome = Outcome::failed(operation_reasons::NAMESPACE_NOT_ALLOWED, message);
        return finish(&ops, &op, outcome, ctx, now, None).await;
    }

    let started = op.status.as_ref().is_some_and(|s| s.start_time.is_some());
    let app_name = &op.spec.application_ref.name;
    let apps: Api<ApplicationInstance> = Api::namespaced(ctx.client.clone(), &namespace);
    let (siblings, app) = if started {
        // The gate lets a started Operation go on whatever its siblings do.
        let app = if ctx.driver.reads_application_once_started() {
            apps.get_opt(app_name).await?
        } else {
            None
        };
        (Vec::new(), app)
    } else {
        // Fresh from the API server: the queue decision must not rest on a stale cache.
        let list_params = ListParams::default().fields(&format!("spec.applicationRef.name={app_name}"));
        let (siblings, app) = futures::try_join!(ops.list(&list_params), apps.get_opt(app_name))?;
        (siblings.items, app)
    };
    let maintenance = Maintenance::of(app.as_ref());
    let gate = lifecycle::gate(&op, now, &Siblings::of(&op, &siblings), &maintenance);
    match gate {
        Gate::Terminal => return Ok(Action::await_change()),
        // A duplicate ends before the engine's own checks (`docs/api/operation.md`).
        Gate::Duplicate(outcome) => return finish(&ops, &op, outcome, ctx, now, None).await,
        Gate::Expired(_) | Gate::WaitUntil(_) | Gate::Queued(_) | Gate::WaitForWindow(_) | Gate::Proceed => {}
    }
    let mut cx = ctx.cx(op, app, siblings, now);

    if !started {
        if let Some(refusal) = refuse(&cx, ctx).await? {
            return finish(&ops, &cx.op, refusal, ctx, now, None).await;
        }
        let wake = lifecycle::wake_at(&cx.op, now, &maintenance).map(|at| until(now, at));
        let held = match gate {
            Gate::Expired(outcome) | Gate::WaitUntil(outcome) => Some((outcome, wake)),
            Gate::Queued(outcome) => Some((outcome, Some(wake.map_or(QUEUE_POLL, |w| w.min(QUEUE_POLL))))),
            Gate::WaitForWindow(outcome) => {
                Some((outcome, Some(wake.map_or(WINDOW_RECHECK, |w| w.min(WINDOW_RECHECK)))))
            }
            Gate::Terminal | Gate::Duplicate(_) | Gate::Proceed => None,
        };
        if let Some((outcome, requeue)) = held {
            return finish(&ops, &cx.op, outcome, ctx, now, requeue).await;
        }
        cx.op = claim(&ops, &cx, ctx, now).await?;
    }

    let op_ref = OpRef::new(&cx.op.name_any()).within(&namespace);
    let outcome = match ctx.driver.drive(&cx).await {
        Ok(outcome) if started && outcome.phase().is_terminal() && ctx.fast_lane_has(&op_ref) => {
            // The fast lane is writing this end, from the same child event: writing it here
            // too would only lose with a conflict. Look again once it is written.
            return Ok(Action::requeue(STALE_END_RECHECK));
        }
        Ok(outcome) => outcome,
        Err(DriverError::Domain(e)) => e.outcome(),
        Err(e) => {
            // A refusal that will not pass by itself is shown on the Operation (its status
            // would otherwise keep saying what the claim expected); the retry follows.
            if let Some(message) = lasting_refusal(&e) {
                let outcome = Outcome::Running {
                    message,
                    children: Vec::new(),
                };
                if let Err(write) = record(&ops, &cx.op, outcome, ctx, now).await {
                    debug!(error = %write, "recording the refusal failed");
                }
            }
            return Err(e);
        }
    };
    let poll = ctx.driver.poll_interval();
    finish(&ops, &cx.op, outcome, ctx, now, Some(poll)).await
}

/// The engine's own checks before an Operation starts: application, target namespace,
/// then the driver's payload checks.
async fn refuse<D: Driver>(cx: &Cx, ctx: &Context<D>) -> Result<Option<Outcome>, DriverError> {
    let Some(app) = &cx.app else {
        return Ok(Some(Outcome::failed(
            operation_reasons::APPLICATION_NOT_FOUND,
            format!(
                "ApplicationInstance {}/{} does not exist",
                cx.namespace(),
                cx.op.spec.application_ref.name
            ),
        )));
    };
    let target = app.spec.target_namespace_or(cx.namespace());
    if !ctx.settings.scope.allows(target) {
        return Ok(Some(Outcome::failed(
            operation_reasons::NAMESPACE_NOT_ALLOWED,
            format!(
                "the application's target namespace {target} is not allowed ({})",
                ctx.settings.scope.policy()
            ),
        )));
    }
    match ctx.driver.validate(cx).await {
        Ok(refusal) => Ok(refusal),
        Err(DriverError::Domain(e)) => Ok(Some(e.outcome())),
        Err(e) => Err(e),
    }
}

/// The message of an API error a started Operation shows while it is retried: a refusal
/// that will not pass by itself (a quota, an admission policy, an object the API server
/// finds invalid, missing rights). Conflicts, timeouts, throttling, server and connection
/// errors pass by themselves and are only retried.
fn lasting_refusal(error: &DriverError) -> Option<String> {
    let DriverError::Kube(kube::Error::Api(status)) = error else {
        return None;
    };
    let passes = matches!(status.code, 408 | 409 | 429) || !(400..500).contains(&status.code);
    (!passes).then(|| {
        format!(
            "the Kubernetes API refused a request ({} {}): {}; retrying with backoff",
            status.code,
            status.reason,
            // Validation errors can list many fields.
            api::text::prefix_within(&status.message, 1000)
        )
    })
}

/// Starts the Operation: writes `Running` with `startTime` (and what the driver expects to
/// report, [`Driver::claim_outcome`]), conditional on the `resourceVersion` it was decided
/// on. Returns the Operation as written.
async fn claim<D: Driver>(
    ops: &Api<Operation>,
    cx: &Cx,
    ctx: &Context<D>,
    now: Timestamp,
) -> Result<Operation, DriverError> {
    let op = &cx.op;
    let outcome = ctx.driver.claim_outcome(cx).unwrap_or_else(|| Outcome::Running {
        message: "Starting".into(),
        children: Vec::new(),
    });
    let next = status::next_status(op.status.as_ref(), op.metadata.generation, outcome, now);
    let patch = serde_json::json!({
        "apiVersion": api::API_VERSION,
        "kind": "Operation",
        "metadata": {"resourceVersion": op.metadata.resource_version},
        "status": next,
    });
    ctx.metrics.api_write(WriteVerb::Apply, "Operation");
    let claimed = ops
        .patch_status(
            &op.name_any(),
            &PatchParams::apply(ctx.settings.field_manager).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    if let Some(status) = &claimed.status {
        ctx.settings
            .publisher
            .publish(status_channel::convert::operation(&claimed, status, now));
    }
    info!(r#type = op.spec.type_.as_str(), "operation started");
    publish(ctx, op, EventType::Normal, "Started", "Operation started".into()).await;
    Ok(claimed)
}

/// Writes the status for `outcome` if it changed; returns when to look again.
async fn finish<D: Driver>(
    ops: &Api<Operation>,
    op: &Operation,
    outcome: Outcome,
    ctx: &Context<D>,
    now: Timestamp,
    requeue: Option<Duration>,
) -> Result<Action, DriverError> {
    Ok(match record(ops, op, outcome, ctx, now).await? {
        Recorded::Stale => Action::requeue(STALE_END_RECHECK),
        Recorded::Terminal => Action::await_change(),
        Recorded::Current => requeue.map_or_else(Action::await_change, Action::requeue),
    })
}

/// What [`record`] did.
#[derive(Debug, PartialEq, Eq)]
enum Recorded {
    /// The status is current (written, or unchanged) and not terminal.
    Current,
    /// The status is terminal (written now, or before).
    Terminal,
    /// Decided on a stale copy: the write lost with a conflict and nothing was written.
    Stale,
}

/// Writes the status for `outcome` if it changed, and the Event of an end.
async fn record<D: Driver>(
    ops: &Api<Operation>,
    op: &Operation,
    outcome: Outcome,
    ctx: &Context<D>,
    now: Timestamp,
) -> Result<Recorded, DriverError> {
    let next = status::next_status(op.status.as_ref(), op.metadata.generation, outcome, now);
    if status::needs_write(op.status.as_ref(), &next) {
        let was_terminal = op
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(OperationPhase::is_terminal);
        let ends = next.phase.filter(|p| p.is_terminal() && !was_terminal);
        // Every write of a started Operation (and every end) is conditional on the
        // resourceVersion it was decided on: a reconcile of a stale copy (our own end not yet
        // in the cache, or an end the fast lane wrote meanwhile) loses instead of writing the
        // end and its Event again or turning an ended Operation back to Running. The watch
        // brings the fresh copy.
        let started = op.status.as_ref().is_some_and(|s| s.start_time.is_some());
        let precondition = (started || ends.is_some())
            .then_some(op.metadata.resource_version.as_deref())
            .flatten();
        match write_status(ops, op, &next, precondition, ctx).await {
            Err(DriverError::Kube(kube::Error::Api(status))) if precondition.is_some() && status.is_conflict() => {
                debug!("the status was decided on a stale copy; looking again");
                return Ok(Recorded::Stale);
            }
            written => written?,
        }
        if let Some(phase) = ends {
            let (type_, reason) = match phase {
                OperationPhase::Succeeded => (EventType::Normal, "Succeeded"),
                OperationPhase::Expired => (EventType::Warning, "Expired"),
                _ => (EventType::Warning, "Failed"),
            };
            let note = next.result.clone().unwrap_or_default();
            info!(?phase, result = %note, "operation finished");
            publish(ctx, op, type_, reason, note).await;
        }
    }
    Ok(if next.phase.is_some_and(OperationPhase::is_terminal) {
        Recorded::Terminal
    } else {
        Recorded::Current
    })
}

async fn write_status<D: Driver>(
    ops: &Api<Operation>,
    op: &Operation,
    next: &OperationStatus,
    resource_version: Option<&str>,
    ctx: &Context<D>,
) -> Result<(), DriverError> {
    let mut patch = serde_json::json!({
        "apiVersion": api::API_VERSION,
        "kind": "Operation",
        "status": next,
    });
    if let (Some(version), Some(fields)) = (resource_version, patch.as_object_mut()) {
        fields.insert("metadata".to_owned(), serde_json::json!({"resourceVersion": version}));
    }
    ctx.metrics.api_write(WriteVerb::Apply, "Operation");
    ops.patch_status(
        &op.name_any(),
        &PatchParams::apply(ctx.settings.field_manager).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    ctx.settings
        .publisher
        .publish(status_channel::convert::operation(op, next, Timestamp::now()));
    Ok(())
}

async fn publish<D: Driver>(ctx: &Context<D>, op: &Operation, type_: EventType, reason: &str, note: String) {
    let object = op.object_ref(&());
    publish_event(
        &ctx.settings,
        &ctx.metrics,
        &object,
        op.spec.type_.as_str(),
        type_,
        reason,
        note,
    )
    .await;
}

/// Publishes an Event about `object` (its note cut at 1000 bytes on a character boundary);
/// a failure is only logged: an Event is never worth a retry.
pub(crate) async fn publish_event(
    settings: &EngineSettings,
    metrics: &ControllerMetrics,
    object: &k8s_openapi::api::core::v1::ObjectReference,
    action: &str,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(api::text::prefix_within(&note, 1000).to_owned()),
        action: action.into(),
        secondary: None,
    };
    metrics.api_write(WriteVerb::Create, "Event");
    if let Err(e) = settings.recorder.publish(&event, object).await {
        debug!(error = %e, "publishing event failed");
    }
}

/// Time from `now` until `at`, at least one second.
pub(crate) fn until(now: Timestamp, at: Timestamp) -> Duration {
    let secs = (at.as_millisecond() - now.as_millisecond()).max(1000);
    Duration::from_millis(u64::try_from(secs).unwrap_or(1000))
}

#[cfg(test)]
mod api_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_is_at_least_a_second() {
        let now = Timestamp::from_second(1_000).unwrap();
        assert_eq!(until(now, Timestamp::from_second(999).unwrap()), Duration::from_secs(1));
        assert_eq!(
            until(now, Timestamp::from_second(1_030).unwrap()),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn child_cache_finds_a_watched_child_by_kind_namespace_and_name() {
        let jobs = crate::runbook::jobs();
        let mut writer = reflector::store::Writer::new(jobs.clone());
        let job = DynamicObject::new("rb-1-job", &jobs).within("team-a");
        writer.apply_watcher_event(&watcher::Event::Apply(job));
        let cache = ChildCache {
            stores: vec![(jobs.clone(), writer.as_reader())],
        };
        let found = cache.get(&jobs, "team-a", "rb-1-job");
        assert_eq!(
            found.as_ref().and_then(|j| j.pointer("/metadata/name")),
            Some(&serde_json::json!("rb-1-job"))
        );
        assert!(cache.get(&jobs, "team-b", "rb-1-job").is_none());
        let config_maps = crate::children::resource("v1", "ConfigMap", "configmaps");
        assert!(cache.get(&config_maps, "team-a", "rb-1-job").is_none());
        assert!(ChildCache::default().get(&jobs, "team-a", "rb-1-job").is_none());
    }

    #[test]
    fn controller_names_are_distinct() {
        let names: std::collections::BTreeSet<_> = OperationType::ALL.iter().map(|t| controller_name(*t)).collect();
        assert_eq!(names.len(), OperationType::ALL.len());
    }
}
