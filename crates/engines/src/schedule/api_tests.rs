//! One pass of the schedule controller against a scripted API server (`test-support`): every
//! request, in order, with the answers. An unscripted request fails the test, so "nothing
//! written" is a script of reads only.

use anyhow::{Context as _, ensure};
use http::Method;
use serde_json::{Value, json};
use test_support::{ApiServer, Step};

use super::*;

const FIELD_MANAGER: &str = "vworkspace-backup-engine";
const OPS_PATH: &str = "/apis/vworkspace.io/v1alpha1/namespaces/team-a/operations";
const APP_STATUS_PATH: &str = "/apis/vworkspace.io/v1alpha1/namespaces/team-a/applicationinstances/wiki/status";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/team-a/events";
const BACKUPS_PATH: &str = "/apis/velero.io/v1/namespaces/velero/backups";
const REQUESTS_PATH: &str = "/apis/velero.io/v1/namespaces/velero/deletebackuprequests";
/// The run of 2026-01-01T00:00Z (the yearly schedule below, in UTC).
const RUN: &str = "wiki-backup-202601010000";

fn context() -> anyhow::Result<(Arc<Context>, ApiServer)> {
    let (client, server) = test_support::pair();
    let settings = EngineSettings::for_tests(&client, None)?;
    let ctx = Context {
        client,
        velero_namespace: "velero".into(),
        metrics: settings.metrics.controller(CONTROLLER),
        settings,
        failures: RetryBackoff::new(Duration::from_secs(1), Duration::from_secs(300)),
    };
    Ok((Arc::new(ctx), server))
}

/// `team-a/wiki`, backed up every 1 January at 00:00 UTC, keeping 2; its schedule took
/// effect in 2025, so the run of 2026-01-01 is due (and, under `RunOnce` without a starting
/// deadline, still created late).
fn application(schedule_status: Value) -> anyhow::Result<ApplicationInstance> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance",
        "metadata": {"name": "wiki", "namespace": "team-a", "uid": "app-uid", "generation": 1},
        "spec": {
            "chart": {"name": "wiki", "repository": {"url": "https://charts.example.com"}},
            "backupSchedule": {"cron": "0 0 1 1 *", "keepLast": 2},
        },
        "status": {"backupSchedule": schedule_status},
    }))?)
}

/// [`application`] whose schedule took effect on 2025-06-01 (as the engine wrote it then).
fn due() -> anyhow::Result<ApplicationInstance> {
    application(json!({"schedule": "0 0 1 1 * in UTC", "since": "2025-06-01T00:00:00Z"}))
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "50"}, "items": items})
}

async fn pass(
    server: &mut ApiServer,
    ctx: &Arc<Context>,
    app: &ApplicationInstance,
    script: Vec<Step>,
) -> anyhow::Result<(Result<Action, ScheduleControllerError>, Vec<test_support::Seen>)> {
    server.run(script, step(app, "team-a", ctx)).await
}

#[tokio::test]
async fn a_due_run_is_created_before_the_status_says_so_and_the_next_pass_only_reads() -> anyhow::Result<()> {
    let (ctx, mut server) = context()?;
    let app = due()?;
    let script = vec![
        Step::get(OPS_PATH, list("OperationList", Vec::new())),
        Step::echo(Method::POST, OPS_PATH),
        Step::echo(Method::POST, EVENTS_PATH),
        Step::ok(Method::PATCH, APP_STATUS_PATH, serde_json::to_value(&app)?),
    ];
    let (result, seen) = pass(&mut server, &ctx, &app, script).await?;
    let action = result?;
    ensure!(
        action != Action::await_change(),
        "a schedule always looks again: {action:?}"
    );

    ensure!(
        seen[0].query("labelSelector") == Some("vworkspace.io%2Fbackup-schedule%3Dwiki"),
        "{:?}",
        seen[0]
    );
    let run = seen[1].body()?;
    ensure!(run["metadata"]["name"] == RUN, "{run}");
    ensure!(
        run["spec"]["requestId"] == "backup-schedule:wiki:20260101T0000Z",
        "{run}"
    );
    ensure!(run["metadata"]["ownerReferences"][0]["uid"] == "app-uid", "{run}");
    ensure!(seen[1].query("fieldManager") == Some(FIELD_MANAGER), "{:?}", seen[1]);
    let event = seen[2].body()?;
    ensure!(event["reason"] == "BackupScheduled", "{event}");

    let status_apply = &seen[3];
    ensure!(
        status_apply.query("fieldManager") == Some(FIELD_MANAGER),
        "{status_apply:?}"
    );
    let sent = status_apply.body()?;
    let written = &sent["status"]["backupSchedule"];
    ensure!(
        sent["status"].as_object().map(|s| s.len()) == Some(1),
        "the engine applies status.backupSchedule alone: {sent}"
    );
    ensure!(written["active"] == RUN, "{written}");
    ensure!(written["lastScheduleTime"] == "2026-01-01T00:00:00Z", "{written}");
    ensure!(written["since"] == "2025-06-01T00:00:00Z", "{written}");

    // The next pass sees the run (not ended, no backup yet) and the status it wrote: the
    // Velero side is read, nothing is written.
    let mut app = app;
    if let Some(status) = app.status.as_mut() {
        status.backup_schedule = Some(serde_json::from_value(written.clone())?);
    }
    let mut created: Operation = serde_json::from_value(run.clone())?;
    created.metadata.uid = Some("run-uid".into());
    let script = vec![
        Step::get(OPS_PATH, list("OperationList", vec![serde_json::to_value(&created)?])),
        Step::get(BACKUPS_PATH, list("BackupList", Vec::new())),
        Step::get(REQUESTS_PATH, list("DeleteBackupRequestList", Vec::new())),
    ];
    let (result, seen) = pass(&mut server, &ctx, &app, script).await?;
    result?;
    ensure!(seen.iter().all(|s| !s.is_write()), "{seen:?}");
    Ok(())
}

#[tokio::test]
async fn a_replayed_create_is_taken_as_done_and_velero_missing_means_no_backups() -> anyhow::Result<()> {
    let (ctx, mut server) = context()?;
    let app = due()?;
    // Another replica (or an earlier pass that crashed before its status write) created it.
    let script = vec![
        Step::get(OPS_PATH, list("OperationList", Vec::new())),
        Step::fail(Method::POST, OPS_PATH, 409, "AlreadyExists"),
        Step::ok(Method::PATCH, APP_STATUS_PATH, serde_json::to_value(&app)?),
    ];
    let (result, seen) = pass(&mut server, &ctx, &app, script).await?;
    result?;
    ensure!(
        !seen.iter().any(|s| s.path == EVENTS_PATH),
        "no Event for a run this pass did not create"
    );

    // Velero's CRDs are not served: its lists answer 404, which is "no backups".
    let mut run: Operation = serde_json::from_value(seen[1].body()?.clone())?;
    run.metadata.uid = Some("run-uid".into());
    let mut app = app;
    let written = seen[2].body()?["status"]["backupSchedule"].clone();
    if let Some(status) = app.status.as_mut() {
        status.backup_schedule = Some(serde_json::from_value(written)?);
    }
    let script = vec![
        Step::get(OPS_PATH, list("OperationList", vec![serde_json::to_value(&run)?])),
        Step::not_found(BACKUPS_PATH),
    ];
    let (result, seen) = pass(&mut server, &ctx, &app, script).await?;
    result.context("a cluster without Velero is not an error")?;
    ensure!(seen.iter().all(|s| !s.is_write()), "{seen:?}");
    Ok(())
}
