//! Backups on a schedule ([ADR 0008](../../../docs/adr/0008-backup-schedules.md)): the backup
//! engine's controller of ApplicationInstances with a `spec.backupSchedule`.
//!
//! It only carries out what [`operations::schedule::decide`] returns. Per reconcile of an
//! application:
//!
//! 1. malformed object, not the leader, no schedule and no schedule status, namespace
//!    outside the allow-list, being deleted → nothing;
//! 2. read the schedule's runs (Backup Operations labelled with the application, in its
//!    namespace) and, when there are runs, the Velero Backups labelled with the application
//!    and the `DeleteBackupRequest`s of this schedule, in Velero's namespace;
//! 3. [`decide`]: then create the run (a plain create: the name comes from the scheduled
//!    time, so a second create is `AlreadyExists` and changes nothing), ask Velero to
//!    delete the expired backups (one `DeleteBackupRequest` each), delete the runs that
//!    have no backup left (with a UID precondition);
//! 4. write `status.backupSchedule` (server-side apply of that field alone, under the
//!    engine's field manager) only when it changed, and look again when the decision says.
//!
//! The run is created before the status says so: a crash in between is repaired from the
//! runs themselves on the next pass.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use api::{ApplicationInstance, LABEL_MANAGED_BY, MANAGED_BY, Operation, OperationType};
use controller_kit::{CancellationToken, ControllerMetrics, RetryBackoff, WriteVerb, writes};
use futures::StreamExt;
use jiff::Timestamp;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions},
    core::DeserializeGuard,
    runtime::{
        Controller, WatchStreamExt,
        controller::{Action, Config},
        events::EventType,
        predicates,
        reflector::{self, ObjectRef},
        watcher,
    },
};
use operations::{
    meta,
    schedule::{self, Decision, LABEL_SCHEDULE, Observed, ObservedBackup, decide},
};
use serde_json::Value;
use tracing::{info, instrument, warn};

use crate::{
    backup::velero_backups,
    children,
    runtime::{self, EngineSettings, SyncTracker, until},
};

/// Name of the controller in metrics and logs.
pub const CONTROLLER: &str = "backup-schedule";
/// Look again at least this often, for retention by `ttl` while no run is due.
const MAX_REQUEUE: Duration = Duration::from_secs(3600);
/// How often a replica that does not lead looks at an application again.
const FOLLOWER_RECHECK: Duration = Duration::from_secs(5);

/// Velero's DeleteBackupRequest resource.
pub fn delete_backup_requests() -> ApiResource {
    children::resource(
        operations::velero::API_VERSION,
        "DeleteBackupRequest",
        "deletebackuprequests",
    )
}

/// Errors of one reconcile: all are retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleControllerError {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl ScheduleControllerError {
    fn metric_label(&self) -> &'static str {
        match self {
            ScheduleControllerError::Kube(_) => "kube",
        }
    }
}

struct Context {
    client: Client,
    velero_namespace: String,
    settings: EngineSettings,
    metrics: ControllerMetrics,
    failures: RetryBackoff<ObjectRef<DeserializeGuard<ApplicationInstance>>>,
}

/// Runs the schedule controller until `shutdown`.
pub async fn run(
    client: Client,
    velero_namespace: String,
    settings: EngineSettings,
    synced: SyncTracker,
    shutdown: CancellationToken,
) {
    let metrics = settings.metrics.controller(CONTROLLER);
    for kind in ["Operation", "Event", "DeleteBackupRequest"] {
        metrics.declare_write(WriteVerb::Create, kind);
    }
    metrics.declare_write(WriteVerb::Apply, "ApplicationInstance");
    metrics.declare_write(WriteVerb::Patch, "ApplicationInstance");
    metrics.declare_write(WriteVerb::Delete, "Operation");
    let scope = settings.scope.clone();

    let apps: Api<DeserializeGuard<ApplicationInstance>> = scope.api(client.clone());
    let (reader, writer) = reflector::store();
    let app_stream = watcher(apps, watcher::Config::default())
        .default_backoff()
        .modify(|app| app.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects()
        // A spec change (or a new object) only: status writes, ours and the app
        // controller's, do not wake this controller; runs and backups do.
        .predicate_filter(predicates::generation, Default::default());

    // The backup schedule gauges, from this controller's cache (crate::metrics).
    tokio::spawn(crate::metrics::observe_schedules(
        reader.clone(),
        settings.metrics.clone(),
        settings.gate.clone(),
        shutdown.clone(),
    ));

    controller_kit::controller::on_cache_synced(reader.clone(), move || {
        info!("ApplicationInstance cache synced (backup schedules)");
        synced.synced();
    });

    // The runs: owned by their ApplicationInstance (controller reference).
    let runs: Api<Operation> = scope.api(client.clone());
    let runs_stream = watcher(runs, watcher::Config::default().labels(LABEL_SCHEDULE))
        .default_backoff()
        .touched_objects();
    // Velero Backups of Backup Operations: their labels name the application.
    let backups: Api<DynamicObject> = Api::namespaced_with(client.clone(), &velero_namespace, &velero_backups());
    let backup_labels = format!(
        "{LABEL_MANAGED_BY}={MANAGED_BY},{}={}",
        meta::LABEL_OPERATION_TYPE,
        OperationType::Backup.as_str()
    );
    let backups_stream = watcher(backups, watcher::Config::default().labels(&backup_labels))
        .default_backoff()
        .touched_objects();

    let ctx = Arc::new(Context {
        client,
        velero_namespace,
        settings: settings.clone(),
        metrics,
        failures: RetryBackoff::new(Duration::from_secs(1), Duration::from_secs(300)),
    });
    Controller::for_stream(app_stream, reader)
        .owns_stream(runs_stream)
        .watches_stream_with(
            backups_stream,
            |backup: DynamicObject| {
                let labels = backup.labels();
                let app = labels.get(meta::LABEL_APPLICATION)?;
                let namespace = labels.get(meta::LABEL_OPERATION_NAMESPACE)?;
                Some(ObjectRef::new(app).within(namespace))
            },
            velero_backups(),
        )
        .with_config(Config::default().concurrency(settings.concurrency))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            controller_kit::controller::log_result(&result);
            std::future::ready(())
        })
        .await;
    info!("backup schedule controller stopped");
}

fn error_policy(
    guard: Arc<DeserializeGuard<ApplicationInstance>>,
    error: &ScheduleControllerError,
    ctx: Arc<Context>,
) -> Action {
    ctx.metrics.reconcile_failure(error.metric_label());
    let (delay, attempts) = ctx.failures.failed(ObjectRef::from_obj(&*guard));
    warn!(error = %error, attempts, ?delay, "backup schedule reconcile failed; retrying");
    Action::requeue(delay)
}

#[instrument(skip_all, fields(namespace = guard.namespace().unwrap_or_default(), name = guard.name_any()))]
async fn reconcile(
    guard: Arc<DeserializeGuard<ApplicationInstance>>,
    ctx: Arc<Context>,
) -> Result<Action, ScheduleControllerError> {
    let app = match controller_kit::controller::admit(&guard, &ctx.settings.gate, FOLLOWER_RECHECK) {
        std::ops::ControlFlow::Continue(app) => app,
        std::ops::ControlFlow::Break(action) => return Ok(action),
    };
    let has_status = app.status.as_ref().is_some_and(|s| s.backup_schedule.is_some());
    let namespace = app.namespace().unwrap_or_default();
    if (app.spec.backup_schedule.is_none() && !has_status)
        || app.metadata.deletion_timestamp.is_some()
        // The app controller reports the refusal on the application itself.
        || !ctx.settings.scope.allows(&namespace)
    {
        return Ok(Action::await_change());
    }
    let _timer = ctx.metrics.reconcile_timer();
    let action = step(app, &namespace, &ctx).await?;
    ctx.failures.succeeded(&ObjectRef::from_obj(&*guard));
    Ok(action)
}

async fn step(app: &ApplicationInstance, namespace: &str, ctx: &Context) -> Result<Action, ScheduleControllerError> {
    let now = Timestamp::now();
    let name = app.name_any();
    let ops: Api<Operation> = Api::namespaced(ctx.client.clone(), namespace);
    let runs = if app.spec.backup_schedule.is_some() {
        ops.list(&ListParams::default().labels(&format!("{LABEL_SCHEDULE}={name}")))
            .await?
            .items
    } else {
        Vec::new()
    };
    // Backups matter only through runs (retention checks each against its run).
    let backups = if runs.is_empty() {
        Vec::new()
    } else {
        observed_backups(ctx, namespace, &name).await?
    };
    let decision = decide(Observed {
        app,
        now,
        runs: &runs,
        backups: &backups,
    });
    carry_out(app, &ops, &runs, &decision, ctx).await?;

    let current = app.status.as_ref().and_then(|s| s.backup_schedule.as_ref());
    if current != decision.status.as_ref() {
        write_status(app, namespace, decision.status.as_ref(), ctx).await?;
    }
    Ok(match decision.requeue_at {
        Some(at) => Action::requeue(until(now, at).min(MAX_REQUEUE)),
        None if app.spec.backup_schedule.is_some() => Action::requeue(MAX_REQUEUE),
        None => Action::await_change(),
    })
}

/// The Velero Backups of the application's Backup Operations, each marked when a
/// `DeleteBackupRequest` of this schedule already asks for its deletion. Without Velero's
/// CRDs there are none.
async fn observed_backups(
    ctx: &Context,
    namespace: &str,
    app: &str,
) -> Result<Vec<ObservedBackup>, ScheduleControllerError> {
    let backups: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ctx.velero_namespace, &velero_backups());
    let selector = format!(
        "{LABEL_MANAGED_BY}={MANAGED_BY},{}={},{}={app},{}={namespace}",
        meta::LABEL_OPERATION_TYPE,
        OperationType::Backup.as_str(),
        meta::LABEL_APPLICATION,
        meta::LABEL_OPERATION_NAMESPACE,
    );
    let Some(listed) = list_if_served(&backups, &selector).await? else {
        return Ok(Vec::new());
    };
    let requests: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ctx.velero_namespace, &delete_backup_requests());
    let request_selector = format!("{LABEL_SCHEDULE}={app},{}={namespace}", meta::LABEL_OPERATION_NAMESPACE);
    let requested: BTreeSet<String> = list_if_served(&requests, &request_selector)
        .await?
        .unwrap_or_default()
        .iter()
        .filter_map(|request| text(&request.data, "/spec/backupName"))
        .collect();
    Ok(listed
        .into_iter()
        .map(|backup| {
            let name = backup.name_any();
            ObservedBackup {
                deletion_requested: requested.contains(&name),
                labels: backup.labels().clone(),
                created: backup.metadata.creation_timestamp.as_ref().map(|t| t.0),
                phase: text(&backup.data, "/status/phase"),
                name,
            }
        })
        .collect())
}

/// Lists `api` by `selector`; `None` when the kind is not served (Velero not installed).
async fn list_if_served(
    api: &Api<DynamicObject>,
    selector: &str,
) -> Result<Option<Vec<DynamicObject>>, ScheduleControllerError> {
    match api.list(&ListParams::default().labels(selector)).await {
        Ok(list) => Ok(Some(list.items)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn text(data: &Value, pointer: &str) -> Option<String> {
    data.pointer(pointer).and_then(Value::as_str).map(str::to_owned)
}

/// Creates the run, asks Velero to delete expired backups, deletes runs without backups.
async fn carry_out(
    app: &ApplicationInstance,
    ops: &Api<Operation>,
    runs: &[Operation],
    decision: &Decision,
    ctx: &Context,
) -> Result<(), ScheduleControllerError> {
    let fm = ctx.settings.field_manager;
    let post = writes::create_as(fm);
    if let Some(run) = &decision.create {
        let run_name = run.name_any();
        ctx.metrics.api_write(WriteVerb::Create, "Operation");
        if created(ops.create(&post, run).await)? {
            info!(run = %run_name, "scheduled backup run created");
            let note = format!("Created the Backup Operation {run_name}");
            publish(app, ctx, EventType::Normal, "BackupScheduled", note).await;
        }
    }
    if let Some(skipped) = decision.skipped {
        let note = format!(
            "Skipped the backup scheduled at {skipped}: later than the starting deadline ({:?} policy)",
            app.spec
                .backup_schedule
                .as_ref()
                .and_then(|s| s.missed_run_policy)
                .unwrap_or_default()
        );
        info!(%skipped, "scheduled backup run skipped");
        publish(app, ctx, EventType::Warning, "BackupSkipped", note).await;
    }
    if !decision.delete_backups.is_empty() {
        let requests: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), &ctx.velero_namespace, &delete_backup_requests());
        for backup in &decision.delete_backups {
            let object = schedule::delete_backup_request(backup, &ctx.velero_namespace, app);
            let request: DynamicObject = serde_json::from_value(object).map_err(kube::Error::SerdeError)?;
            ctx.metrics.api_write(WriteVerb::Create, "DeleteBackupRequest");
            if created(requests.create(&post, &request).await)? {
                info!(%backup, "retention: asked Velero to delete the backup");
                let note = format!("Asked Velero to delete the backup {backup} (retention)");
                publish(app, ctx, EventType::Normal, "BackupExpired", note).await;
            }
        }
    }
    for name in &decision.delete_runs {
        let uid = runs
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name.as_str()))
            .and_then(|r| r.metadata.uid.clone());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid,
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        ctx.metrics.api_write(WriteVerb::Delete, "Operation");
        match ops.delete(name, &params).await {
            Ok(_) => info!(run = %name, "retention: run deleted (no backup of it is left)"),
            // Gone already, or replaced by another object of that name: nothing to do.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `Ok(true)` for a created object, `Ok(false)` when the name was taken already.
fn created<T>(result: Result<T, kube::Error>) -> Result<bool, ScheduleControllerError> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Writes `status.backupSchedule`: server-side apply of that field alone (the app controller
/// owns the rest of the status), or its removal when there is no schedule any more.
async fn write_status(
    app: &ApplicationInstance,
    namespace: &str,
    status: Option<&api::schedule::BackupScheduleStatus>,
    ctx: &Context,
) -> Result<(), ScheduleControllerError> {
    let apps: Api<ApplicationInstance> = Api::namespaced(ctx.client.clone(), namespace);
    let name = app.name_any();
    match status {
        Some(status) => {
            ctx.metrics.api_write(WriteVerb::Apply, "ApplicationInstance");
            let patch = serde_json::json!({
                "apiVersion": api::API_VERSION,
                "kind": "ApplicationInstance",
                "status": {"backupSchedule": status},
            });
            apps.patch_status(
                &name,
                &PatchParams::apply(ctx.settings.field_manager).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        }
        None => {
            // A merge patch: the field goes whoever else once wrote it.
            let patch = serde_json::json!({"status": {"backupSchedule": null}});
            ctx.metrics.api_write(WriteVerb::Patch, "ApplicationInstance");
            apps.patch_status(
                &name,
                &writes::patch_as(ctx.settings.field_manager),
                &Patch::Merge(&patch),
            )
            .await?;
        }
    }
    Ok(())
}

async fn publish(app: &ApplicationInstance, ctx: &Context, type_: EventType, reason: &str, note: String) {
    let object = app.object_ref(&());
    runtime::publish_event(
        &ctx.settings,
        &ctx.metrics,
        &object,
        "BackupSchedule",
        type_,
        reason,
        note,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delete_backup_requests_are_velero_objects() {
        let resource = delete_backup_requests();
        assert_eq!(resource.group, "velero.io");
        assert_eq!(resource.plural, "deletebackuprequests");
    }
}

#[cfg(test)]
mod api_tests;
