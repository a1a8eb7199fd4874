//! The ApplicationInstance reconciler: thin IO around the pure pieces
//! ([`crate::status`], [`crate::references`], the engine's builders).
//!
//! Pipeline per reconcile: guard (malformed object, leadership, namespace policy) →
//! finalizer → validate references → hold a chart version change outside the maintenance
//! windows (then only the status is written) → engine.materialize → engine.observe →
//! status (written only when it changed) → events on Ready transitions.

use std::{collections::HashMap, ops::ControlFlow, sync::Arc, time::Duration};

use api::{ApplicationInstance, EngineKind, conditions::reasons};
use controller_kit::{ControllerMetrics, LeaderGate, RetryBackoff, WatchScope, WriteVerb, namespaces::NamespacePairs};
use helmengine::{DeleteProgress, Engine, EngineError, MaterializeInput, Materialized};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    core::DeserializeGuard,
    runtime::{
        controller::Action,
        events::{Event, EventType, Recorder},
        finalizer::{self, finalizer},
        reflector::{ObjectRef, Store},
    },
};
use tracing::{debug, info, instrument, warn};

use crate::{
    maintenance::{self, ChartChange},
    references,
    status::{self, Assessment},
};

/// Finalizer that makes deletion uninstall the release first.
pub const FINALIZER: &str = "vworkspace.io/app-controller";
/// Field manager of our status writes (and, through the engine, of the engine objects).
pub const FIELD_MANAGER: &str = helmengine::flux::FIELD_MANAGER;
/// Kind of the objects this controller reconciles, in metrics and seen versions.
pub const API_KIND: &str = "ApplicationInstance";
/// Controller name in metrics and events.
pub const CONTROLLER: &str = "applicationinstance";

/// Re-check a healthy application this often (reads only; writes happen on change).
const RESYNC: Duration = Duration::from_secs(600);
/// Re-check soon when waiting on something we do not watch (a missing dependency, Flux CRDs).
const RECHECK: Duration = Duration::from_secs(30);
/// Poll while an uninstall is in progress (the HelmRelease watch usually wakes us first).
const UNINSTALL_POLL: Duration = Duration::from_secs(2);

/// Errors of one reconcile; all are retried with exponential backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("waiting for the release to be uninstalled: {0}")]
    Uninstalling(String),
    #[error("finalizer: {0}")]
    Finalizer(String),
}

impl Error {
    /// Stable label for the failures metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Engine(e) => e.reason(),
            Error::Uninstalling(_) => "uninstalling",
            Error::Finalizer(_) => "finalizer",
        }
    }
}

/// The engines this controller can drive, and which one is the cluster default.
#[derive(Clone)]
pub struct Engines {
    pub default: EngineKind,
    pub available: HashMap<EngineKind, Arc<dyn Engine>>,
}

impl Engines {
    /// What the controller must watch for every engine it drives, each kind once.
    pub fn watched_kinds(&self) -> Vec<helmengine::WatchedKind> {
        let mut kinds: Vec<helmengine::WatchedKind> = Vec::new();
        let mut engines: Vec<_> = self.available.iter().collect();
        engines.sort_by_key(|(kind, _)| kind.as_str());
        for (_, engine) in engines {
            for watched in engine.watched_kinds() {
                let seen = kinds
                    .iter()
                    .any(|k| k.resource == watched.resource && k.place == watched.place);
                if !seen {
                    kinds.push(watched);
                }
            }
        }
        kinds
    }

    /// The engine `app` asks for (or the default), if this controller has it.
    fn for_app(&self, app: &ApplicationInstance) -> (EngineKind, Option<Arc<dyn Engine>>) {
        let kind = app.spec.engine.unwrap_or(self.default);
        (kind, self.available.get(&kind).cloned())
    }
}

/// Shared state of the reconciler.
pub struct Context {
    pub client: Client,
    pub engines: Engines,
    pub scope: WatchScope,
    /// Cross-namespace references a cluster administrator allowed (`--allowed-namespace-pairs`).
    pub namespace_pairs: NamespacePairs,
    /// `spec.chart.repository.url` rules (`--allowed-repository-hosts` and friends).
    pub repositories: crate::repositories::RepositoryPolicy,
    pub gate: LeaderGate,
    pub metrics: ControllerMetrics,
    pub recorder: Recorder,
    pub store: Store<DeserializeGuard<ApplicationInstance>>,
    /// Status changes go to the agent's status channel (a no-op when none is configured).
    pub publisher: status_channel::Publisher,
    /// Consecutive failures per object, for exponential requeue.
    pub failures: RetryBackoff<ObjectRef<DeserializeGuard<ApplicationInstance>>>,
    /// The release ServiceAccount, its RoleBindings and the Pod Security labels per namespace.
    pub tenancy: crate::tenancy::Tenancy,
    /// Versions of apps and engine objects this controller wrote and acted on; the watches
    /// drop their events.
    pub seen: Arc<controller_kit::SeenVersions>,
    /// `--watch-label-selector`, when set: the store holds only the apps it selects, so a
    /// dependency outside it reads as missing, and the message says why.
    pub selector: Option<controller_kit::labels::LabelSelector>,
}

/// Reconciles one ApplicationInstance (guarded against malformed objects).
#[instrument(skip_all, fields(namespace = guard.namespace().unwrap_or_default(), name = guard.name_any()))]
pub async fn reconcile(guard: Arc<DeserializeGuard<ApplicationInstance>>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer();
    // The span around this reconcile (kube-runtime's) names what woke it.
    tracing::trace!("reconciling");
    // Malformed → wait for a change; a follower keeps its cache warm and looks again later.
    let app = match controller_kit::controller::admit(&guard, &ctx.gate, RECHECK) {
        ControlFlow::Continue(app) => app.clone(),
        ControlFlow::Break(action) => return Ok(action),
    };
    let namespace = app.namespace().unwrap_or_default();
    let api: Api<ApplicationInstance> = Api::namespaced(ctx.client.clone(), &namespace);

    if !ctx.scope.allows(&namespace) {
        return refuse_namespace(&api, app, &ctx).await;
    }

    // Added here rather than by `finalizer`, which would end this reconcile and leave the
    // work to the next one, woken by the finalizer's own event.
    let app = with_finalizer(&api, app, &ctx).await?;
    let result = finalizer(&api, FINALIZER, Arc::new(app), |event| async {
        match event {
            finalizer::Event::Apply(app) => apply(&api, app, &ctx).await,
            finalizer::Event::Cleanup(app) => cleanup(&api, app, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(other.to_string()),
    });
    if result.is_ok() {
        ctx.failures.succeeded(&ObjectRef::from_obj(&*guard));
    }
    result
}

/// `app` with this controller's finalizer, added unless it is there or the app is being
/// deleted. The version the patch returns is recorded as seen: its watch event would only
/// wake this reconcile again. A copy older than the live object (the cache lags a write of a
/// reconcile that just ended) is answered by a conflict; then the live object is read and
/// used, or patched once more.
async fn with_finalizer(
    api: &Api<ApplicationInstance>,
    app: ApplicationInstance,
    ctx: &Context,
) -> Result<ApplicationInstance, Error> {
    let has_finalizer = |app: &ApplicationInstance| {
        app.meta().deletion_timestamp.is_some() || app.finalizers().iter().any(|f| f == FINALIZER)
    };
    if has_finalizer(&app) {
        return Ok(app);
    }
    let patched = match add_finalizer(api, &app, ctx).await {
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let live = api.get(&app.name_any()).await?;
            if has_finalizer(&live) {
                return Ok(live);
            }
            add_finalizer(api, &live, ctx).await?
        }
        other => other?,
    };
    if let Some(version) = &patched.metadata.resource_version {
        let namespace = patched.namespace().unwrap_or_default();
        ctx.seen.record(API_KIND, &namespace, &patched.name_any(), version);
    }
    Ok(patched)
}

/// Appends [`FINALIZER`] to the finalizers of `app` as it was read (the resourceVersion
/// precondition makes the write fail rather than drop a finalizer added since).
async fn add_finalizer(
    api: &Api<ApplicationInstance>,
    app: &ApplicationInstance,
    ctx: &Context,
) -> Result<ApplicationInstance, kube::Error> {
    let mut finalizers = app.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    let patch = serde_json::json!({
        "metadata": {"finalizers": finalizers, "resourceVersion": app.resource_version()},
    });
    ctx.metrics.api_write(WriteVerb::Patch, API_KIND);
    api.patch(&app.name_any(), &merge_params(), &Patch::Merge(&patch)).await
}

/// Parameters of the controller's merge patches (the finalizer's addition and removal):
/// named, so `managedFields` says who wrote the finalizer instead of `unknown`.
fn merge_params() -> PatchParams {
    controller_kit::writes::patch_as(FIELD_MANAGER)
}

/// Exponential requeue per object (2 s, 4 s, 8 s … capped at 5 min); uninstall waits poll quickly.
pub fn error_policy(guard: Arc<DeserializeGuard<ApplicationInstance>>, error: &Error, ctx: Arc<Context>) -> Action {
    if let Error::Uninstalling(what) = error {
        debug!(%what, "uninstall in progress");
        return Action::requeue(UNINSTALL_POLL);
    }
    ctx.metrics.reconcile_failure(error.metric_label());
    let (delay, attempts) = ctx.failures.failed(ObjectRef::from_obj(&*guard));
    warn!(error = %error, attempts, ?delay, "reconcile failed; retrying");
    Action::requeue(delay)
}

async fn apply(api: &Api<ApplicationInstance>, app: Arc<ApplicationInstance>, ctx: &Context) -> Result<Action, Error> {
    let namespace = app.namespace().unwrap_or_default();
    let (kind, engine) = ctx.engines.for_app(&app);
    let Some(engine) = engine else {
        let message = format!("engine {:?} is not available in this controller", kind.as_str());
        return fail(api, &app, ctx, reasons::ENGINE_UNAVAILABLE, message, true, None).await;
    };

    if let Some(message) = namespace_refusal(&app.spec, &namespace, &ctx.scope, &ctx.namespace_pairs) {
        return fail(api, &app, ctx, reasons::NAMESPACE_NOT_ALLOWED, message, true, None).await;
    }

    // Before anything is read or written for the app: a refused URL gets no Flux source, so
    // source-controller never fetches it and the secretRef credentials never reach it.
    if let Some(repo) = &app.spec.chart.repository
        && let Err(message) = ctx.repositories.check(&repo.url)
    {
        return fail(api, &app, ctx, reasons::REPOSITORY_NOT_ALLOWED, message, true, None).await;
    }

    if let Some(missing) = missing_dependency(&app, &ctx.store) {
        let message = match &ctx.selector {
            None => format!("dependsOn names ApplicationInstance {missing}, which does not exist"),
            Some(selector) => format!(
                "dependsOn names ApplicationInstance {missing}, which does not exist among the \
                 ApplicationInstances this controller selects (--watch-label-selector {selector})"
            ),
        };
        return fail(
            api,
            &app,
            ctx,
            reasons::DEPENDENCY_NOT_FOUND,
            message,
            false,
            Some(RECHECK),
        )
        .await;
    }

    if let Err(e) = engine.check_installed().await {
        if matches!(e, EngineError::NotInstalled(_)) {
            return fail(
                api,
                &app,
                ctx,
                reasons::ENGINE_NOT_INSTALLED,
                e.to_string(),
                false,
                Some(RECHECK),
            )
            .await;
        }
        return Err(e.into());
    }

    // Before anything is materialised: the release must never be applied with more than the
    // namespace-scoped rights of its ServiceAccount (docs/install/README.md#flux-multi-tenancy).
    let target = app.spec.target_namespace_or(&namespace);
    if let Err(e) = ctx.tenancy.ensure(&ctx.client, &ctx.metrics, &namespace, target).await {
        let message = format!("preparing the release's namespace failed: {e}");
        return fail(
            api,
            &app,
            ctx,
            reasons::TENANT_SETUP_FAILED,
            message,
            false,
            Some(RECHECK),
        )
        .await;
    }

    let resolved = references::resolve(&ctx.client, &namespace, &references::references(&app)).await?;
    if !resolved.missing.is_empty() {
        let message = format!("referenced objects not found: {}", resolved.missing.join(", "));
        // The ConfigMap watch wakes us when they appear (Secrets are left to Flux).
        return fail(
            api,
            &app,
            ctx,
            reasons::REFERENCED_OBJECT_NOT_FOUND,
            message,
            false,
            Some(RESYNC),
        )
        .await;
    }

    let suspended_by = suspending_operation(&ctx.client, &app).await?;
    if let Some(action) =
        hold_for_maintenance_window(api, &app, ctx, engine.as_ref(), kind, suspended_by.is_some()).await?
    {
        return Ok(action);
    }
    let input = MaterializeInput {
        values_revision: resolved.token,
        suspended_by: suspended_by.clone(),
    };
    let materialized = match engine.materialize(&app, &input).await {
        Ok(m) => m,
        Err(e) if e.is_terminal() => {
            return fail(api, &app, ctx, e.reason(), e.to_string(), true, None).await;
        }
        Err(e) => {
            let _ = fail(api, &app, ctx, e.reason(), e.to_string(), false, None).await;
            return Err(e.into());
        }
    };
    if let Some(version) = &materialized.engine_version {
        let engine_ref = &materialized.engine_ref;
        let engine_namespace = engine_ref.namespace.as_deref().unwrap_or_default();
        ctx.seen
            .record(&engine_ref.kind, engine_namespace, &engine_ref.name, version);
    }
    // An engine that already holds its objects after applying them says what it sees.
    let observation = match &materialized.observation {
        Some(observation) => Some(observation.clone()),
        None => engine.observe(&app).await?,
    };
    let assessment = Assessment::Materialized {
        engine: kind,
        materialized: &materialized,
        observation: observation.as_ref(),
        suspended_by: suspended_by.as_deref(),
        held: None,
    };
    write_status(api, &app, ctx, &assessment).await?;
    // The Operation holding the release may be deleted without touching this object.
    Ok(Action::requeue(if suspended_by.is_some() { RECHECK } else { RESYNC }))
}

/// Holds a chart version change outside the application's maintenance windows
/// ([`maintenance::chart_change`]): the release is left as it is, the status says what waits
/// for which window, and the reconcile comes back when the window opens. `None`: go on and
/// materialise. Costs one engine read, only for applications that declare windows.
async fn hold_for_maintenance_window(
    api: &Api<ApplicationInstance>,
    app: &ApplicationInstance,
    ctx: &Context,
    engine: &dyn Engine,
    kind: EngineKind,
    suspended_by_operation: bool,
) -> Result<Option<Action>, Error> {
    if app.spec.maintenance_windows.is_empty() {
        return Ok(None);
    }
    // The engine object as last materialised; without a reference to it, nothing to hold.
    let Some(engine_ref) = app.status.as_ref().and_then(|s| s.engine_ref.clone()) else {
        return Ok(None);
    };
    let observation = engine.observe(app).await?;
    let current = observation
        .as_ref()
        .and_then(|o| o.materialized_chart_version.as_deref());
    let decision = maintenance::chart_change(app, current, suspended_by_operation, jiff::Timestamp::now(), RESYNC);
    let ChartChange::Hold {
        reason,
        message,
        recheck,
    } = decision
    else {
        return Ok(None);
    };
    let materialized = Materialized {
        engine_ref,
        source_ref: None,
        observation: None,
        engine_version: None,
    };
    let assessment = Assessment::Materialized {
        engine: kind,
        materialized: &materialized,
        observation: observation.as_ref(),
        suspended_by: None,
        held: Some((reason, &message)),
    };
    write_status(api, app, ctx, &assessment).await?;
    Ok(Some(Action::requeue(recheck)))
}

/// The Operation named by the `vworkspace.io/suspended-by-operation` annotation, if it
/// still exists and has not ended. A stale annotation (its Operation deleted or finished)
/// suspends nothing, so a crashed engine can never leave a release frozen.
async fn suspending_operation(client: &Client, app: &ApplicationInstance) -> Result<Option<String>, Error> {
    let Some(name) = app.annotations().get(api::ANNOTATION_SUSPENDED_BY) else {
        return Ok(None);
    };
    let ops: Api<api::Operation> = Api::namespaced(client.clone(), &app.namespace().unwrap_or_default());
    let holding = ops.get_opt(name).await?.is_some_and(|op| {
        !op.status
            .and_then(|s| s.phase)
            .is_some_and(api::OperationPhase::is_terminal)
    });
    Ok(holding.then(|| name.clone()))
}

async fn cleanup(
    api: &Api<ApplicationInstance>,
    app: Arc<ApplicationInstance>,
    ctx: &Context,
) -> Result<Action, Error> {
    let namespace = app.namespace().unwrap_or_default();
    let (_, engine) = ctx.engines.for_app(&app);
    let target = app.spec.target_namespace_or(&namespace);
    let Some(engine) = engine.filter(|_| ctx.scope.allows(target)) else {
        // Nothing of ours can exist: we never materialise for an unavailable engine or a
        // disallowed target namespace. Let the deletion through.
        return Ok(Action::await_change());
    };
    match engine.delete(&app).await? {
        DeleteProgress::Gone => {
            // Its namespace may be on its way out (with its release ServiceAccount and
            // bindings) and come back under the same name: ensure them again next time.
            ctx.tenancy.forget(&namespace);
            info!("release uninstalled; removing finalizer");
            Ok(Action::await_change())
        }
        DeleteProgress::InProgress(message) => {
            write_status(
                api,
                &app,
                ctx,
                &Assessment::Uninstalling {
                    message: message.clone(),
                },
            )
            .await?;
            // An error keeps the finalizer in place; error_policy polls quickly.
            Err(Error::Uninstalling(message))
        }
    }
}

/// An ApplicationInstance in a namespace we may not manage: say so, never materialise,
/// and never hold up its deletion.
async fn refuse_namespace(
    api: &Api<ApplicationInstance>,
    app: ApplicationInstance,
    ctx: &Context,
) -> Result<Action, Error> {
    if app.meta().deletion_timestamp.is_some() {
        if app.finalizers().iter().any(|f| f == FINALIZER) {
            let finalizers: Vec<&String> = app.finalizers().iter().filter(|f| *f != FINALIZER).collect();
            let patch = serde_json::json!({"metadata": {"finalizers": finalizers}});
            ctx.metrics.api_write(WriteVerb::Patch, "ApplicationInstance");
            api.patch(&app.name_any(), &merge_params(), &Patch::Merge(&patch))
                .await?;
        }
        return Ok(Action::await_change());
    }
    let message = format!(
        "namespace {} is not allowed ({})",
        app.namespace().unwrap_or_default(),
        ctx.scope.policy()
    );
    fail(api, &app, ctx, reasons::NAMESPACE_NOT_ALLOWED, message, true, None).await
}

/// Why the spec may not be acted on, if it reaches a namespace outside the allow-list, or
/// outside its own namespace without an allowed pair (one tenant never reaches another's).
pub fn namespace_refusal(
    spec: &api::ApplicationInstanceSpec,
    own_namespace: &str,
    scope: &WatchScope,
    pairs: &NamespacePairs,
) -> Option<String> {
    let foreign = spec.foreign_namespaces(own_namespace);
    if let Some((field, ns)) = foreign.iter().find(|(_, ns)| !scope.allows_reference(ns)) {
        return Some(format!("{field} {ns} is not allowed ({})", scope.policy()));
    }
    foreign
        .iter()
        .find(|(_, ns)| !pairs.allows(own_namespace, ns))
        .map(|(field, ns)| {
            format!(
                "{field} {ns} is outside this ApplicationInstance's namespace {own_namespace}; a cluster \
             administrator can allow it with --allowed-namespace-pairs {own_namespace}={ns}"
            )
        })
}

fn missing_dependency(
    app: &ApplicationInstance,
    store: &Store<DeserializeGuard<ApplicationInstance>>,
) -> Option<String> {
    let own_ns = app.namespace().unwrap_or_default();
    app.spec.depends_on.iter().find_map(|dep| {
        let ns = dep.namespace.clone().unwrap_or_else(|| own_ns.clone());
        let key = ObjectRef::new(&dep.name).within(&ns);
        store.get(&key).is_none().then(|| format!("{ns}/{}", dep.name))
    })
}

/// Records one of our own failures as status; `requeue` None means wait for a change.
async fn fail(
    api: &Api<ApplicationInstance>,
    app: &ApplicationInstance,
    ctx: &Context,
    reason: &'static str,
    message: String,
    stalled: bool,
    requeue: Option<Duration>,
) -> Result<Action, Error> {
    write_status(
        api,
        app,
        ctx,
        &Assessment::Failed {
            reason,
            message,
            stalled,
        },
    )
    .await?;
    Ok(requeue.map(Action::requeue).unwrap_or_else(Action::await_change))
}

/// Computes the next status and writes it only if it changed; publishes an event when
/// Ready changes status or reason.
async fn write_status(
    api: &Api<ApplicationInstance>,
    app: &ApplicationInstance,
    ctx: &Context,
    assessment: &Assessment<'_>,
) -> Result<(), Error> {
    let now = Time(jiff::Timestamp::now());
    let next = status::next_status(app, assessment, &now);
    if !status::needs_write(app, &next) {
        return Ok(());
    }
    // `status.backupSchedule` is the backup engine's (ADR 0008): applying it here too would
    // make this controller a co-owner that writes back a stale copy.
    let owned = api::ApplicationInstanceStatus {
        backup_schedule: None,
        ..next.clone()
    };
    let patch = serde_json::json!({
        "apiVersion": api::API_VERSION,
        "kind": "ApplicationInstance",
        "status": owned,
    });
    ctx.metrics.api_write(WriteVerb::Apply, "ApplicationInstance");
    api.patch_status(
        &app.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    ctx.publisher
        .publish(status_channel::convert::application(app, &next, jiff::Timestamp::now()));

    let before = status::ready(app.status.as_ref());
    let after = status::ready(Some(&next));
    let changed = match (before, after) {
        (Some(b), Some(a)) => b.status != a.status || b.reason != a.reason,
        // The first assessment is no news unless it is a verdict: an app starting out as
        // `Unknown` (progressing, waiting for the engine) gets its first Event when that is decided.
        (None, Some(a)) => a.status != "Unknown",
        _ => false,
    };
    if let (true, Some(ready)) = (changed, after) {
        publish(app, ctx, ready).await;
    }
    Ok(())
}

async fn publish(
    app: &ApplicationInstance,
    ctx: &Context,
    ready: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition,
) {
    let type_ = if ready.status == "False" {
        EventType::Warning
    } else {
        EventType::Normal
    };
    // Events notes are capped at 1 kB; Flux's message may carry any UTF-8 (chart errors, values).
    let full = format!("Ready={}: {}", ready.status, ready.message);
    let note = api::text::prefix_within(&full, 1000).to_owned();
    let event = Event {
        type_,
        reason: ready.reason.clone(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    ctx.metrics.api_write(WriteVerb::Create, "Event");
    if let Err(e) = ctx.recorder.publish(&event, &app.object_ref(&())).await {
        // Events are best effort; a failure must not fail the reconcile.
        debug!(error = %e, "publishing event failed");
    }
}

#[cfg(test)]
mod tests {
    use super::FINALIZER;

    /// The admission policy that sets the finalizer at creation names this one: with another
    /// name, every new application would carry a finalizer nobody removes.
    #[test]
    fn the_admission_policy_sets_this_finalizer() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/components/admission-finalizer/finalizer-policy.yaml"
        );
        let policy = std::fs::read_to_string(path).expect("the policy file");
        let expected = format!("finalizers: [\"{FINALIZER}\"]");
        assert!(policy.contains(&expected), "{path} must add {expected}");
    }
}
