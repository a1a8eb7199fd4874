//! The day-2 engines end to end on the real cluster: Runbook Jobs run by
//! kube-controller-manager (pods completed by kwok), Upgrade and Rollback through the
//! ApplicationInstance and real Flux releases, the lifecycle rules (expiry, duplicates,
//! queueing of mutating Operations).

use std::time::Duration;

use api::{ApplicationInstance, Operation, OperationPhase};
use e2e::{
    TestContext,
    apps::{app, apply_app, start_controller, wait_deployed},
    ops::{
        OPERATION_TIMEOUT, bare_app, create_operation, operation, phase_reason, start_engine, summary, wait_operation,
        wait_phase,
    },
};
use k8s_openapi::api::{
    batch::v1::Job,
    core::v1::{ConfigMap, ResourceQuota},
};
use kube::ResourceExt;
use serde_json::json;

fn job(command: &str) -> serde_json::Value {
    json!({
        "backoffLimit": 0,
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", command]}]}}
    })
}

#[tokio::test]
async fn runbook_jobs_succeed_and_fail_with_job_reasons() -> anyhow::Result<()> {
    let ctx = TestContext::new("ops-runbook").await?;
    let engine = start_engine(&ctx, "runbook-engine", &[]).await?;
    bare_app(&ctx, "wiki").await?;

    let mut ok = operation(
        "reindex",
        "wiki",
        "Runbook",
        json!({"job": job("echo reindex"), "parameters": {"MODE": "full"}}),
    );
    ok["spec"]["runbook"]["parameters"]["TOKEN_HINT"] = json!("x");
    create_operation(&ctx, &ok).await?;
    let done = wait_phase(&ctx, "reindex", OperationPhase::Succeeded, "Completed").await?;
    let status = done.status.clone().unwrap_or_default();
    assert!(
        status.start_time.is_some() && status.completion_time.is_some(),
        "{status:?}"
    );
    assert!(
        status.children.iter().any(|c| c.kind == "Job" && c.name == "reindex"),
        "{status:?}"
    );
    let job_obj = ctx.api::<Job>().get("reindex").await?;
    let env = job_obj
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .env
        .clone()
        .unwrap_or_default();
    assert!(
        env.iter()
            .any(|e| e.name == "MODE" && e.value.as_deref() == Some("full")),
        "{env:?}"
    );
    let owner = job_obj.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        owner
            .iter()
            .any(|o| o.kind == "Operation" && o.name == "reindex" && o.controller == Some(true))
    );

    // A pod that can never be scheduled: the Job controller fails it at activeDeadlineSeconds.
    let mut stuck = job("sleep 1000");
    stuck["activeDeadlineSeconds"] = json!(3);
    stuck["template"]["spec"]["nodeSelector"] = json!({"vworkspace.io/no-such-node": "true"});
    create_operation(&ctx, &operation("stuck", "wiki", "Runbook", json!({"job": stuck}))).await?;
    let failed = wait_phase(&ctx, "stuck", OperationPhase::Failed, "DeadlineExceeded").await?;
    assert!(
        failed.status.unwrap().result.unwrap_or_default().contains("Job"),
        "result names the Job"
    );

    // Argo WorkflowTemplates are accepted by the API and refused by the engine.
    create_operation(
        &ctx,
        &operation(
            "argo",
            "wiki",
            "Runbook",
            json!({"workflowTemplateRef": {"name": "cleanup"}}),
        ),
    )
    .await?;
    let refused = wait_phase(&ctx, "argo", OperationPhase::Failed, "NotSupported").await?;
    assert!(refused.status.unwrap().children.is_empty());

    // Invalid job spec: a clear reason, nothing created.
    let mut bad = job("true");
    bad["ttlSecondsAfterFinished"] = json!(10);
    create_operation(&ctx, &operation("bad", "wiki", "Runbook", json!({"job": bad}))).await?;
    wait_phase(&ctx, "bad", OperationPhase::Failed, "InvalidSpec").await?;
    assert!(ctx.api::<Job>().get_opt("bad").await?.is_none());

    // A missing application fails fast.
    create_operation(
        &ctx,
        &operation("orphan", "nope", "Runbook", json!({"job": job("true")})),
    )
    .await?;
    wait_phase(&ctx, "orphan", OperationPhase::Failed, "ApplicationNotFound").await?;

    // A Job the namespace's quota refuses: the Operation says why while the engine retries,
    // and goes on once the quota is lifted.
    let quotas = ctx.api::<ResourceQuota>();
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "no-jobs"},
        "spec": {"hard": {"count/jobs.batch": "0"}},
    }))?;
    quotas.create(&Default::default(), &quota).await?;
    create_operation(
        &ctx,
        &operation("quota", "wiki", "Runbook", json!({"job": job("true")})),
    )
    .await?;
    let refused = wait_operation(&ctx, "quota", "the quota's refusal shown", OPERATION_TIMEOUT, |op| {
        let status = op.status.clone().unwrap_or_default();
        status.phase == Some(OperationPhase::Running)
            && status.conditions.iter().any(|c| {
                c.type_ == "Succeeded"
                    && c.message
                        .starts_with("the Kubernetes API refused a request (403 Forbidden)")
                    && c.message.contains("quota")
            })
    })
    .await?;
    assert!(
        ctx.api::<Job>().get_opt("quota").await?.is_none(),
        "{}",
        summary(&refused)
    );
    quotas.delete("no-jobs", &Default::default()).await?;
    wait_phase(&ctx, "quota", OperationPhase::Succeeded, "Completed").await?;
    drop(engine);
    Ok(())
}

#[tokio::test]
async fn lifecycle_expiry_duplicates_and_not_before() -> anyhow::Result<()> {
    let ctx = TestContext::new("ops-lifecycle").await?;
    let _engine = start_engine(&ctx, "runbook-engine", &[]).await?;
    bare_app(&ctx, "wiki").await?;
    let now = jiff::Timestamp::now();

    // Deadline already passed: Expired, nothing created.
    let mut late = operation("late", "wiki", "Runbook", json!({"job": job("true")}));
    late["spec"]["deadline"] = json!((now - jiff::SignedDuration::from_secs(1)).to_string());
    create_operation(&ctx, &late).await?;
    wait_phase(&ctx, "late", OperationPhase::Expired, "DeadlineExceeded").await?;
    assert!(
        ctx.api::<Job>().get_opt("late").await?.is_none(),
        "an expired Operation creates nothing"
    );

    // notBefore in the future: Pending, then runs.
    let mut later = operation("later", "wiki", "Runbook", json!({"job": job("true")}));
    later["spec"]["notBefore"] = json!(
        (now + jiff::SignedDuration::from_secs(6))
            .round(jiff::Unit::Second)?
            .to_string()
    );
    create_operation(&ctx, &later).await?;
    wait_phase(&ctx, "later", OperationPhase::Pending, "WaitingForNotBefore").await?;
    assert!(ctx.api::<Job>().get_opt("later").await?.is_none());
    wait_phase(&ctx, "later", OperationPhase::Succeeded, "Completed").await?;

    // Replayed requestId: ends without acting, pointing at the first.
    let mut replay = operation("later-again", "wiki", "Runbook", json!({"job": job("true")}));
    replay["spec"]["requestId"] = json!("req-later");
    create_operation(&ctx, &replay).await?;
    let dup = wait_phase(&ctx, "later-again", OperationPhase::Succeeded, "DuplicateRequest").await?;
    assert_eq!(dup.status.unwrap().duplicate_of.as_deref(), Some("later"));
    assert!(ctx.api::<Job>().get_opt("later-again").await?.is_none());
    Ok(())
}

fn history_numbers(cm: &ConfigMap) -> Vec<(i64, String, Option<String>)> {
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get("revisions.json"))
        .cloned()
        .unwrap_or_default();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    doc["revisions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["number"].as_i64().unwrap_or_default(),
                r["chartVersion"].as_str().unwrap_or_default().to_owned(),
                r["operation"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

#[tokio::test]
async fn upgrade_and_rollback_change_the_release_through_flux() -> anyhow::Result<()> {
    let ctx = TestContext::new("ops-upgrade").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let _engine = start_engine(&ctx, "upgrade-engine", &[]).await?;
    apply_app(&ctx, &app("shop", "demo-app", "0.1.0", json!({"greeting": "hello"}))).await?;
    wait_deployed(&ctx, "shop", "InstallSucceeded", "0.1.0").await?;

    create_operation(
        &ctx,
        &operation(
            "up",
            "shop",
            "Upgrade",
            json!({"chartVersion": "0.2.0", "valuesPatch": {"greeting": "hi", "extra": "x"}}),
        ),
    )
    .await?;
    let up = wait_phase(&ctx, "up", OperationPhase::Succeeded, "Completed").await?;
    assert!(up.status.unwrap().result.unwrap_or_default().contains("0.2.0"));
    let shop = ctx.api::<ApplicationInstance>().get("shop").await?;
    assert_eq!(shop.spec.chart.version.as_deref(), Some("0.2.0"));
    assert_eq!(shop.spec.values, Some(json!({"greeting": "hi", "extra": "x"})));
    wait_deployed(&ctx, "shop", "UpgradeSucceeded", "0.2.0").await?;

    // The history records the baseline and the upgrade.
    let cm = ctx.api::<ConfigMap>().get("shop-revisions").await?;
    assert_eq!(
        history_numbers(&cm),
        vec![(1, "0.1.0".into(), None), (2, "0.2.0".into(), Some("up".into()))]
    );

    // Rollback to the previous revision: chart version and the values used then.
    create_operation(&ctx, &operation("back", "shop", "Rollback", json!({}))).await?;
    wait_phase(&ctx, "back", OperationPhase::Succeeded, "Completed").await?;
    let shop = ctx.api::<ApplicationInstance>().get("shop").await?;
    assert_eq!(shop.spec.chart.version.as_deref(), Some("0.1.0"));
    assert_eq!(
        shop.spec.values,
        Some(json!({"greeting": "hello"})),
        "values of revision 1, exactly"
    );
    wait_deployed(&ctx, "shop", "UpgradeSucceeded", "0.1.0").await?;
    let cm = ctx.api::<ConfigMap>().get("shop-revisions").await?;
    assert_eq!(
        history_numbers(&cm).last().cloned(),
        Some((3, "0.1.0".into(), Some("back".into())))
    );

    // A revision the history does not hold.
    create_operation(&ctx, &operation("nowhere", "shop", "Rollback", json!({"revision": 42}))).await?;
    wait_phase(&ctx, "nowhere", OperationPhase::Failed, "RevisionNotFound").await?;
    Ok(())
}

#[tokio::test]
async fn failing_upgrade_with_on_failure_rollback_returns_to_the_old_release() -> anyhow::Result<()> {
    let ctx = TestContext::new("ops-upgrade-fail").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let _engine = start_engine(&ctx, "upgrade-engine", &[]).await?;
    apply_app(&ctx, &app("crm", "broken-app", "1.0.0", json!({}))).await?;
    wait_deployed(&ctx, "crm", "InstallSucceeded", "1.0.0").await?;

    create_operation(
        &ctx,
        &operation(
            "up",
            "crm",
            "Upgrade",
            json!({"chartVersion": "2.0.0", "onFailure": "Rollback"}),
        ),
    )
    .await?;
    let failed = wait_operation(&ctx, "up", "Failed after rolling back", OPERATION_TIMEOUT * 2, |op| {
        phase_reason(op).0 == Some(OperationPhase::Failed)
    })
    .await?;
    let (_, reason) = phase_reason(&failed);
    let result = failed.status.clone().unwrap().result.unwrap_or_default();
    assert_eq!(reason, "UpgradeFailed", "Flux's reason verbatim: {result}");
    assert!(result.contains("rolled back"), "{result}");
    assert!(
        failed
            .status
            .unwrap()
            .children
            .iter()
            .any(|c| c.kind == "Operation" && c.name == "up-rollback")
    );
    let rollback = ctx.api::<Operation>().get("up-rollback").await?;
    assert_eq!(phase_reason(&rollback).0, Some(OperationPhase::Succeeded));
    let crm = ctx.api::<ApplicationInstance>().get("crm").await?;
    assert_eq!(crm.spec.chart.version.as_deref(), Some("1.0.0"));
    wait_deployed(&ctx, "crm", "UpgradeSucceeded", "1.0.0").await?;
    Ok(())
}

#[tokio::test]
async fn mutating_operations_queue_in_creation_order() -> anyhow::Result<()> {
    let ctx = TestContext::new("ops-queue").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let _engine = start_engine(&ctx, "upgrade-engine", &[]).await?;
    apply_app(&ctx, &app("shop", "demo-app", "0.1.0", json!({}))).await?;
    wait_deployed(&ctx, "shop", "InstallSucceeded", "0.1.0").await?;

    create_operation(
        &ctx,
        &operation("first", "shop", "Upgrade", json!({"chartVersion": "0.2.0"})),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(1100)).await; // distinct creation timestamps
    create_operation(
        &ctx,
        &operation("second", "shop", "Rollback", json!({"chartVersion": "0.1.0"})),
    )
    .await?;
    let queued = wait_phase(&ctx, "second", OperationPhase::Pending, "Queued").await?;
    let message = queued.status.unwrap().conditions[0].message.clone();
    assert!(message.contains("first"), "{message}");

    let first = wait_phase(&ctx, "first", OperationPhase::Succeeded, "Completed").await?;
    let second = wait_phase(&ctx, "second", OperationPhase::Succeeded, "Completed").await?;
    let ended = first.status.unwrap().completion_time.unwrap().0;
    let started = second.status.unwrap().start_time.unwrap().0;
    assert!(started >= ended, "second started {started} before first ended {ended}");
    wait_deployed(&ctx, "shop", "UpgradeSucceeded", "0.1.0").await?;
    Ok(())
}

#[tokio::test]
async fn engines_restarted_mid_operation_resume_without_duplicates() -> anyhow::Result<()> {
    let ctx = TestContext::new("ops-restart").await?;
    bare_app(&ctx, "wiki").await?;
    let engine = start_engine(&ctx, "runbook-engine", &[]).await?;
    // A pod that never schedules keeps the Job running until activeDeadlineSeconds.
    let mut slow = job("sleep 1000");
    slow["activeDeadlineSeconds"] = json!(12);
    slow["template"]["spec"]["nodeSelector"] = json!({"vworkspace.io/no-such-node": "true"});
    create_operation(&ctx, &operation("slow", "wiki", "Runbook", json!({"job": slow}))).await?;
    let running = wait_phase(&ctx, "slow", OperationPhase::Running, "Running").await?;
    let started = running.status.unwrap().start_time;

    drop(engine); // SIGKILL (kill_on_drop)
    let _engine = start_engine(&ctx, "runbook-engine", &[]).await?;
    let failed = wait_phase(&ctx, "slow", OperationPhase::Failed, "DeadlineExceeded").await?;
    assert_eq!(failed.status.unwrap().start_time, started, "the start is recorded once");
    let uid = failed.metadata.uid.clone().unwrap_or_default();
    let jobs = ctx
        .api::<Job>()
        .list(&kube::api::ListParams::default().labels(&format!("vworkspace.io/operation-uid={uid}")))
        .await?;
    assert_eq!(jobs.items.len(), 1, "one Job, whatever the restarts");
    Ok(())
}

#[tokio::test]
async fn snapshot_creates_volume_snapshots_and_maps_ready_to_use() -> anyhow::Result<()> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
    let ctx = TestContext::new("ops-snapshot").await?;
    bare_app(&ctx, "db").await?;
    for pvc in ["data", "logs"] {
        ctx.apply_yaml(&format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {pvc}}}\nspec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}\n"
        ))
        .await?;
    }
    let _engine = start_engine(&ctx, "backup-engine", &[]).await?;
    create_operation(
        &ctx,
        &operation("snap", "db", "Snapshot", json!({"volumeSnapshotClassName": "csi-test"})),
    )
    .await?;
    let running = wait_operation(
        &ctx,
        "snap",
        "Running with two VolumeSnapshots",
        OPERATION_TIMEOUT,
        |op| {
            op.status
                .as_ref()
                .is_some_and(|s| s.children.iter().filter(|c| c.kind == "VolumeSnapshot").count() == 2)
        },
    )
    .await?;
    assert_eq!(phase_reason(&running).0, Some(OperationPhase::Running));

    // CSI test double: no CSI driver runs here, so the test plays the snapshot controller
    // and marks each VolumeSnapshot readyToUse through the status subresource.
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshot"),
        "volumesnapshots",
    );
    let snapshots: kube::Api<DynamicObject> = kube::Api::namespaced_with(ctx.client.clone(), &ctx.namespace, &resource);
    let children = running.status.unwrap().children;
    // One snapshot of each claim of the app, each of its own claim: two of one claim (or of
    // another app's) would be a wrong backup.
    let mut sources = Vec::new();
    for child in children.iter().filter(|c| c.kind == "VolumeSnapshot") {
        let snapshot = snapshots.get(&child.name).await?;
        sources.push(
            snapshot.data["spec"]["source"]["persistentVolumeClaimName"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    sources.sort();
    assert_eq!(sources, ["data", "logs"], "one VolumeSnapshot of each claim");
    for (i, child) in children.iter().filter(|c| c.kind == "VolumeSnapshot").enumerate() {
        let snapshot = snapshots.get(&child.name).await?;
        assert_eq!(snapshot.data["spec"]["volumeSnapshotClassName"], "csi-test");
        let status = json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "status": {"readyToUse": true, "boundVolumeSnapshotContentName": format!("content-{i}")}});
        snapshots
            .patch_status(
                &child.name,
                &PatchParams::apply("csi-test-double").force(),
                &Patch::Apply(&status),
            )
            .await?;
    }
    wait_phase(&ctx, "snap", OperationPhase::Succeeded, "Completed").await?;
    Ok(())
}

/// A ConfigMap the application owns at run time (not part of its chart).
fn data_config_map(value: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: app-data}}\ndata: {{state: {value}}}\n")
}

async fn data_state(ctx: &TestContext) -> anyhow::Result<Option<String>> {
    Ok(ctx
        .api::<ConfigMap>()
        .get_opt("app-data")
        .await?
        .and_then(|cm| cm.data.and_then(|d| d.get("state").cloned())))
}

#[tokio::test]
async fn velero_backup_and_restore_bring_back_deleted_objects() -> anyhow::Result<()> {
    let ctx = TestContext::new("ops-velero").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let _backup = start_engine(&ctx, "backup-engine", &[]).await?;
    let _restore = start_engine(&ctx, "restore-engine", &[]).await?;
    apply_app(&ctx, &app("shop", "demo-app", "0.1.0", json!({"greeting": "hello"}))).await?;
    wait_deployed(&ctx, "shop", "InstallSucceeded", "0.1.0").await?;
    ctx.apply_yaml(&data_config_map("v1")).await?;

    // Backup with the real Velero server (S3 on loopback).
    create_operation(&ctx, &operation("nightly", "shop", "Backup", json!({"ttl": "24h"}))).await?;
    let backup = wait_phase(&ctx, "nightly", OperationPhase::Succeeded, "Completed").await?;
    let velero_backup = backup
        .status
        .clone()
        .unwrap()
        .children
        .into_iter()
        .find(|c| c.api_version == "velero.io/v1" && c.kind == "Backup")
        .expect("the Velero Backup is listed");
    assert_eq!(velero_backup.namespace.as_deref(), Some("velero"));

    // Lose data: a release object and a run-time object.
    ctx.api::<ConfigMap>()
        .delete("shop-config", &Default::default())
        .await?;
    ctx.api::<ConfigMap>().delete("app-data", &Default::default()).await?;

    create_operation(
        &ctx,
        &operation(
            "undo",
            "shop",
            "Restore",
            json!({"source": {"operationName": "nightly"}}),
        ),
    )
    .await?;
    let restored = wait_phase(&ctx, "undo", OperationPhase::Succeeded, "Completed").await?;
    assert!(restored.status.unwrap().children.iter().any(|c| c.kind == "Restore"));
    assert!(
        ctx.api::<ConfigMap>().get_opt("shop-config").await?.is_some(),
        "release object restored"
    );
    assert_eq!(
        data_state(&ctx).await?.as_deref(),
        Some("v1"),
        "run-time object restored"
    );
    // The hold on Flux is released.
    let shop = ctx.api::<ApplicationInstance>().get("shop").await?;
    assert!(
        !shop.annotations().contains_key(api::ANNOTATION_SUSPENDED_BY),
        "{:?}",
        shop.annotations()
    );
    wait_deployed(&ctx, "shop", "InstallSucceeded", "0.1.0").await?;

    // Invalid references fail fast, nothing half-applied.
    create_operation(
        &ctx,
        &operation(
            "ghost",
            "shop",
            "Restore",
            json!({"source": {"operationName": "missing"}}),
        ),
    )
    .await?;
    wait_phase(&ctx, "ghost", OperationPhase::Failed, "BackupNotFound").await?;
    create_operation(
        &ctx,
        &operation(
            "elsewhere",
            "shop",
            "Backup",
            json!({"storageLocation": "does-not-exist"}),
        ),
    )
    .await?;
    let refused = wait_phase(&ctx, "elsewhere", OperationPhase::Failed, "Failed").await?;
    let result = refused.status.unwrap().result.unwrap_or_default();
    assert!(
        result.contains("does-not-exist"),
        "Velero's validation error is surfaced: {result}"
    );
    Ok(())
}

#[tokio::test]
async fn failed_upgrade_rolls_back_and_restores_the_pre_upgrade_backup() -> anyhow::Result<()> {
    let ctx = TestContext::new("ops-rollback-restore").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let _upgrade = start_engine(&ctx, "upgrade-engine", &[]).await?;
    let _backup = start_engine(&ctx, "backup-engine", &[]).await?;
    let _restore = start_engine(&ctx, "restore-engine", &[]).await?;
    apply_app(&ctx, &app("crm", "broken-app", "1.0.0", json!({}))).await?;
    wait_deployed(&ctx, "crm", "InstallSucceeded", "1.0.0").await?;
    ctx.apply_yaml(&data_config_map("before-upgrade")).await?;

    create_operation(
        &ctx,
        &operation(
            "up",
            "crm",
            "Upgrade",
            json!({"chartVersion": "2.0.0", "backupFirst": true, "onFailure": "RollbackAndRestore"}),
        ),
    )
    .await?;
    // The pre-upgrade backup runs first; then the "migration" damages the data.
    wait_phase(&ctx, "up-backup", OperationPhase::Succeeded, "Completed").await?;
    ctx.apply_yaml(&data_config_map("damaged-by-upgrade")).await?;

    let failed = wait_operation(
        &ctx,
        "up",
        "Failed after rollback and restore",
        OPERATION_TIMEOUT * 2,
        |op| phase_reason(op).0 == Some(OperationPhase::Failed),
    )
    .await?;
    let (_, reason) = phase_reason(&failed);
    let status = failed.status.unwrap();
    let result = status.result.unwrap_or_default();
    assert_eq!(reason, "UpgradeFailed", "{result}");
    assert!(result.contains("rolled back") && result.contains("restore"), "{result}");
    for child in ["up-backup", "up-rollback", "up-restore"] {
        assert!(
            status.children.iter().any(|c| c.name == child),
            "{child} in {:?}",
            status.children
        );
        let op = ctx.api::<Operation>().get(child).await?;
        assert_eq!(phase_reason(&op).0, Some(OperationPhase::Succeeded), "{child}");
    }
    assert_eq!(
        data_state(&ctx).await?.as_deref(),
        Some("before-upgrade"),
        "data restored"
    );
    let crm = ctx.api::<ApplicationInstance>().get("crm").await?;
    assert_eq!(crm.spec.chart.version.as_deref(), Some("1.0.0"));
    wait_deployed(&ctx, "crm", "UpgradeSucceeded", "1.0.0").await?;
    Ok(())
}
