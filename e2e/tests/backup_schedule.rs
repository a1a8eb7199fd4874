//! Backups on a schedule (issue 17, item 3; ADR 0008) on the real local cluster: the backup
//! engine turns an ApplicationInstance's `spec.backupSchedule` into one Backup Operation per
//! scheduled minute, Velero backs each up (S3 on loopback), and retention keeps the newest
//! two: the older backups are deleted through Velero's `DeleteBackupRequest` (so its sync
//! does not bring them back) and their runs go after them. The app controller runs beside
//! it and leaves `status.backupSchedule` to the engine. And the same from Odoo's side
//! (`odoo-sim`, a simulator of the Odoo module): a schedule in the intent reaches the
//! cluster through the agent (protocol 1.1), and the application's report carries its last
//! and next run.

use std::{cell::RefCell, collections::BTreeMap, time::Duration};

use anyhow::Context as _;
use api::{
    ApplicationInstance, BackupParams, Operation, OperationPhase,
    schedule::{BackupSchedule, BackupScheduleStatus},
};
use e2e::{
    TestContext,
    agent::{SimProcess, report, start_agent, wait_sim},
    apps::{RELEASE_TIMEOUT, app, apply_app, start_controller, wait_ready},
    deploy::kubectl,
    eventually,
    ops::start_engine,
    wait_object,
};
use kube::api::ListParams;
use serde_json::Value;

const VELERO_NAMESPACE: &str = "velero";
const APP: &str = "nightly";

fn schedule_status(app: &ApplicationInstance) -> BackupScheduleStatus {
    app.status
        .as_ref()
        .and_then(|s| s.backup_schedule.clone())
        .unwrap_or_default()
}

fn scheduled(status: &BackupScheduleStatus) -> Option<(String, String)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "Scheduled")
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn schedule_summary(app: &ApplicationInstance) -> String {
    format!("{:?}", schedule_status(app))
}

/// The Velero Backups of this test's application (by the labels the backup engine sets),
/// as `name -> phase`.
/// The default BackupStorageLocation's `status.lastSyncedTime` (Velero's backup sync
/// controller sets it after each sync from the bucket), as RFC 3339 text; `None` before the
/// first sync.
async fn last_synced() -> anyhow::Result<Option<jiff::Timestamp>> {
    let out = kubectl(
        &[
            "-n",
            VELERO_NAMESPACE,
            "get",
            "backupstoragelocations.velero.io",
            "default",
            "-o",
            "json",
        ],
        None,
    )
    .await?;
    let location: Value = serde_json::from_str(&out)?;
    location
        .pointer("/status/lastSyncedTime")
        .and_then(Value::as_str)
        .map(|t| t.parse::<jiff::Timestamp>().context("lastSyncedTime"))
        .transpose()
}

async fn velero_backups(ctx: &TestContext) -> anyhow::Result<BTreeMap<String, String>> {
    let selector = format!(
        "vworkspace.io/application={APP},vworkspace.io/operation-namespace={}",
        ctx.namespace
    );
    let out = kubectl(
        &[
            "-n",
            VELERO_NAMESPACE,
            "get",
            "backups.velero.io",
            "-l",
            &selector,
            "-o",
            "json",
        ],
        None,
    )
    .await?;
    let list: Value = serde_json::from_str(&out)?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| {
            let text = |p: &str| item.pointer(p).and_then(Value::as_str).unwrap_or_default().to_owned();
            (text("/metadata/name"), text("/status/phase"))
        })
        .collect())
}

/// The runs of the schedule, by name, with their phase and their Velero Backup.
async fn runs(ctx: &TestContext) -> anyhow::Result<BTreeMap<String, (Option<OperationPhase>, Option<String>)>> {
    let listed = ctx
        .api::<Operation>()
        .list(&ListParams::default().labels(&format!("vworkspace.io/backup-schedule={APP}")))
        .await?;
    Ok(listed
        .items
        .into_iter()
        .map(|op| {
            let status = op.status.clone().unwrap_or_default();
            let backup = status
                .children
                .iter()
                .find(|c| c.kind == "Backup")
                .map(|c| c.name.clone());
            (op.metadata.name.clone().unwrap_or_default(), (status.phase, backup))
        })
        .collect())
}

#[tokio::test]
async fn a_schedule_every_minute_keeps_the_last_two_backups_and_deletes_older_ones_through_velero() -> anyhow::Result<()>
{
    let ctx = TestContext::new("schedule").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let _engine = start_engine(&ctx, "backup-engine", &[]).await?;

    let mut nightly = app(APP, "demo-app", "0.1.0", serde_json::json!({}));
    nightly.spec.backup_schedule = Some(BackupSchedule {
        cron: "* * * * *".into(),
        time_zone: Some("Europe/Brussels".into()),
        keep_last: Some(2),
        backup: Some(BackupParams::default()),
        ..BackupSchedule::default()
    });
    apply_app(&ctx, &nightly).await?;
    wait_ready(&ctx, APP, "True", "InstallSucceeded").await?;

    let first = wait_object::<ApplicationInstance>(
        &ctx,
        APP,
        "status.backupSchedule Scheduled=True with a next time",
        Duration::from_secs(60),
        |a| {
            let s = schedule_status(a);
            scheduled(&s) == Some(("True".into(), "Scheduled".into())) && s.next_schedule_time.is_some()
        },
        schedule_summary,
    )
    .await?;
    let status = schedule_status(&first);
    assert_eq!(status.schedule.as_deref(), Some("* * * * * in Europe/Brussels"));

    // Over three scheduled minutes: every run is recorded with its Velero Backup while it
    // exists; done once the oldest run's backup and then the run itself are gone.
    let seen: RefCell<BTreeMap<String, Option<String>>> = RefCell::default();
    eventually(
        &ctx,
        "three runs, the oldest backup deleted by retention and its run after it",
        Duration::from_secs(330),
        || {
            let (ctx, seen) = (&ctx, &seen);
            async move {
                let current = runs(ctx).await?;
                let backups = velero_backups(ctx).await?;
                let mut seen = seen.borrow_mut();
                for (name, (_, backup)) in &current {
                    let entry = seen.entry(name.clone()).or_default();
                    if entry.is_none() {
                        *entry = backup.clone();
                    }
                }
                let Some((oldest, oldest_backup)) = seen.iter().next() else {
                    return Ok(Err("no run yet".into()));
                };
                let done = seen.len() >= 3
                    && oldest_backup.as_ref().is_some_and(|b| !backups.contains_key(b))
                    && !current.contains_key(oldest);
                Ok(if done {
                    Ok(())
                } else {
                    Err(format!(
                        "runs seen {seen:?}; now {current:?}; Velero Backups {backups:?}"
                    ))
                })
            }
        },
    )
    .await?;

    // Stop new runs; retention goes on and settles on exactly the two newest completed
    // backups, which are all that is left in Velero of this schedule.
    let mut suspended = nightly.clone();
    if let Some(schedule) = suspended.spec.backup_schedule.as_mut() {
        schedule.suspend = true;
    }
    apply_app(&ctx, &suspended).await?;
    let settled = eventually(
        &ctx,
        "suspended, with the two newest completed backups kept and nothing else in Velero",
        Duration::from_secs(150),
        || {
            let ctx = &ctx;
            async move {
                let app = ctx.api::<ApplicationInstance>().get(APP).await?;
                let status = schedule_status(&app);
                let backups = velero_backups(ctx).await?;
                let runs = runs(ctx).await?;
                let kept: Vec<&String> = status.kept_backups.iter().collect();
                let in_velero: Vec<&String> = backups.keys().collect();
                let mut kept_sorted = kept.clone();
                kept_sorted.sort();
                let running = runs
                    .values()
                    .any(|(phase, _)| !phase.is_some_and(OperationPhase::is_terminal));
                Ok(
                    if scheduled(&status) == Some(("False".into(), "Suspended".into()))
                        && !running
                        && kept.len() == 2
                        && kept_sorted == in_velero
                        && backups.values().all(|phase| phase == "Completed")
                    {
                        Ok((status, runs))
                    } else {
                        Err(format!("status {status:?}; Velero Backups {backups:?}; runs {runs:?}"))
                    },
                )
            }
        },
    )
    .await?;
    let (status, runs_left) = settled;
    assert!(
        status.next_schedule_time.is_none(),
        "no next run while suspended: {status:?}"
    );
    assert!(status.last_successful_time.is_some(), "{status:?}");
    // The kept backups are those of the newest runs (names sort by scheduled time).
    let newest: Vec<String> = runs_left
        .iter()
        .rev()
        .filter_map(|(_, (_, backup))| backup.clone())
        .take(2)
        .collect();
    assert_eq!(status.kept_backups, newest, "kept newest first; runs {runs_left:?}");
    assert!(
        runs_left.len() <= 3,
        "older runs are deleted once their backups are gone: {runs_left:?}"
    );

    // The deleted backups stay deleted: Velero's sync from the bucket does not bring them
    // back (the DeleteBackupRequest removed the data too).
    let seen = seen.into_inner();
    let deleted: Vec<String> = seen
        .values()
        .flatten()
        .filter(|b| !status.kept_backups.contains(b))
        .cloned()
        .collect();
    assert!(!deleted.is_empty(), "retention deleted at least one backup: {seen:?}");
    // Two of Velero's syncs from the bucket finish after the deletions (the location's
    // lastSyncedTime moves on twice), so a sync that started after them, and could have
    // brought a backup back, has run (`hack/cluster.sh` runs Velero with `--backup-sync-period=10s`).
    for sync in 1..=2 {
        let after = last_synced().await?;
        eventually(
            &ctx,
            &format!("Velero's sync #{sync} from the bucket after the deletions"),
            Duration::from_secs(60),
            || async {
                let now = last_synced().await?;
                Ok(if now > after {
                    Ok(())
                } else {
                    Err(format!("lastSyncedTime {now:?}"))
                })
            },
        )
        .await?;
    }
    let backups = velero_backups(&ctx).await?;
    for backup in &deleted {
        assert!(!backups.contains_key(backup), "{backup} came back: {backups:?}");
    }
    Ok(())
}

#[tokio::test]
async fn odoo_sets_a_schedule_through_the_agent_and_sees_the_last_and_next_run_in_its_report() -> anyhow::Result<()> {
    let ctx = TestContext::new("schedule-odoo").await?;
    let sim = SimProcess::start(&ctx).await?;
    let agent = start_agent(&ctx, &sim, &sim.key_file, "", &[]).await?;
    let channel = ["--status-channel-endpoint", agent.status_channel.as_str()];
    let _controller = start_controller(&ctx, &channel).await?;
    let _engine = start_engine(&ctx, "backup-engine", &channel).await?;
    let ns = ctx.namespace.as_str();

    let mut spec = app(APP, "demo-app", "0.1.0", serde_json::json!({})).spec;
    spec.backup_schedule = Some(BackupSchedule {
        cron: "* * * * *".into(),
        keep_last: Some(1),
        ..BackupSchedule::default()
    });
    sim.set_app(ns, APP, serde_json::to_value(&spec)?).await?;

    // The first run comes at the next minute; the report then names it, and the next one.
    let view = wait_sim(
        &ctx,
        &sim,
        "a report with the schedule's last and next run",
        RELEASE_TIMEOUT + Duration::from_secs(90),
        |v| {
            let schedule = &report(v, "ApplicationInstance", ns, APP)?["backup_schedule"];
            (schedule["scheduled"] == "True"
                && schedule["last_schedule_time"].is_string()
                && schedule["last_successful_time"].is_string()
                && schedule["next_schedule_time"].is_string())
            .then(|| v.clone())
        },
    )
    .await?;
    let schedule = &report(&view, "ApplicationInstance", ns, APP).context("report")?["backup_schedule"];
    assert_eq!(schedule["message"], "Backups run at * * * * * in UTC", "{schedule}");
    let (last, next) = (
        schedule["last_schedule_time"].as_str().unwrap_or_default(),
        schedule["next_schedule_time"].as_str().unwrap_or_default(),
    );
    assert!(last < next, "{schedule}");
    // The run is an Operation the agent did not create: reported, and marked so.
    // Named after its scheduled time in UTC (ADR 0008).
    let run = format!(
        "{APP}-backup-{}",
        last.parse::<jiff::Timestamp>()?.strftime("%Y%m%d%H%M")
    );
    let run_report = report(&view, "Operation", ns, &run).context("the run's report")?;
    assert_eq!(run_report["managed_by_agent"], false, "{run_report}");
    Ok(())
}
