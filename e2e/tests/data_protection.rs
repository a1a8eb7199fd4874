//! Application data protection with real volume data (issue 17): the `data-app` chart
//! keeps a random file on a `local-path` claim on the real node; a Backup Operation with
//! volumes (Velero's file-system backup: the node-agent on the real node, Kopia, S3 on
//! loopback) and a Restore Operation bring it back byte for byte after the claim and
//! the workload are gone.

use std::time::Duration;

use api::OperationPhase;
use e2e::{
    TestContext,
    apps::{app, apply_app, start_controller, wait_deployed},
    deploy::kubectl,
    eventually,
    ops::{create_operation, operation, start_engine, wait_phase},
    real_node::{placement, require_real_node},
};
use serde_json::{Value, json};

const VELERO_NAMESPACE: &str = "velero";
/// The files the app keeps on its claim that the test compares.
const DATA_FILES: [&str; 2] = ["/data/seed.bin", "/data/generation"];
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(180);

/// `sha256sum` of the app's data files, read in its running container.
async fn checksums(ctx: &TestContext, release: &str) -> anyhow::Result<String> {
    checksums_in(&ctx.namespace, release).await
}

/// Waits until the release's Deployment has an available replica.
async fn wait_available(ctx: &TestContext, release: &str) -> anyhow::Result<()> {
    let target = format!("deployment/{release}");
    let timeout = format!("--timeout={}s", ROLLOUT_TIMEOUT.as_secs());
    kubectl(
        &["-n", ctx.namespace.as_str(), "rollout", "status", &target, &timeout],
        None,
    )
    .await?;
    Ok(())
}

/// Velero's PodVolumeBackups (or Restores) of the Velero object `owner_label=name`, as
/// `(phase, bytes done)`.
async fn pod_volume_items(resource: &str, owner_label: &str, name: &str) -> anyhow::Result<Vec<(String, u64)>> {
    let selector = format!("{owner_label}={name}");
    let out = kubectl(
        &["-n", VELERO_NAMESPACE, "get", resource, "-l", &selector, "-o", "json"],
        None,
    )
    .await?;
    let list: Value = serde_json::from_str(&out)?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| {
            (
                item.pointer("/status/phase")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                item.pointer("/status/progress/bytesDone")
                    .and_then(Value::as_u64)
                    .unwrap_or(0),
            )
        })
        .collect())
}

/// Creates the Restore Operation `name` of `files` from the Backup Operation `with-data`,
/// with its volume data (into `target_namespace` when given: a clone), waits for it to
/// succeed, and returns its PodVolumeRestores as `(phase, bytes done)`.
async fn restore_with_volumes(
    ctx: &TestContext,
    name: &str,
    target_namespace: Option<&str>,
) -> anyhow::Result<Vec<(String, u64)>> {
    let mut payload = json!({"source": {"operationName": "with-data"}, "restoreVolumes": true});
    if let Some(target) = target_namespace {
        payload["targetNamespace"] = json!(target);
    }
    create_operation(ctx, &operation(name, "files", "Restore", payload)).await?;
    let restore = wait_phase(ctx, name, OperationPhase::Succeeded, "Completed").await?;
    let velero_restore = velero_child(&restore, "Restore")?;
    pod_volume_items("podvolumerestores.velero.io", "velero.io/restore-name", &velero_restore).await
}

/// The Velero child (`Backup` or `Restore`) an Operation lists.
fn velero_child(op: &api::Operation, kind: &str) -> anyhow::Result<String> {
    op.status
        .iter()
        .flat_map(|s| &s.children)
        .find(|c| c.api_version == "velero.io/v1" && c.kind == kind)
        .map(|c| c.name.clone())
        .ok_or_else(|| anyhow::anyhow!("the Operation lists no Velero {kind}"))
}

#[tokio::test]
async fn volume_data_comes_back_byte_for_byte_through_file_system_backup_and_restore() -> anyhow::Result<()> {
    require_real_node()?;
    let ctx = TestContext::new("data-fs").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let _backup = start_engine(&ctx, "backup-engine", &[]).await?;
    let _restore = start_engine(&ctx, "restore-engine", &[]).await?;

    let size_kib = 4096;
    let mut values = placement();
    values["dataSizeKiB"] = json!(size_kib);
    values["generation"] = json!("first, with UTF-8: é ✓");
    apply_app(&ctx, &app("files", "data-app", "1.0.0", values)).await?;
    wait_deployed(&ctx, "files", "InstallSucceeded", "1.0.0").await?;
    wait_available(&ctx, "files").await?;
    let before = checksums(&ctx, "files").await?;

    // Back up with volumes: Velero's file-system backup through the node-agent.
    create_operation(
        &ctx,
        &operation(
            "with-data",
            "files",
            "Backup",
            json!({"includeVolumes": true, "volumeMethod": "FileSystem", "ttl": "1h"}),
        ),
    )
    .await?;
    let backup = wait_phase(&ctx, "with-data", OperationPhase::Succeeded, "Completed").await?;
    let velero_backup = velero_child(&backup, "Backup")?;
    let volumes = pod_volume_items("podvolumebackups.velero.io", "velero.io/backup-name", &velero_backup).await?;
    assert_eq!(
        volumes,
        vec![(
            "Completed".to_owned(),
            size_kib * 1024 + "first, with UTF-8: é ✓\n".len() as u64
        )],
        "one PodVolumeBackup of the claim, every byte of it"
    );

    // Lose the data: the workload and the claim (its local volume goes with it).
    let ns = ctx.namespace.as_str();
    kubectl(&["-n", ns, "delete", "deployment", "files", "--wait=true"], None).await?;
    kubectl(&["-n", ns, "delete", "pvc", "files-data", "--wait=true"], None).await?;
    eventually(&ctx, "the claim and the app's pods gone", ROLLOUT_TIMEOUT, || async {
        let pvcs = kubectl(&["-n", ns, "get", "pvc", "-o", "name"], None).await?;
        let pods = kubectl(&["-n", ns, "get", "pods", "-o", "name"], None).await?;
        Ok(if pvcs.trim().is_empty() && pods.trim().is_empty() {
            Ok(())
        } else {
            Err(format!("claims: {pvcs:?}, pods: {pods:?}"))
        })
    })
    .await?;

    let volumes = restore_with_volumes(&ctx, "bring-back", None).await?;
    assert_eq!(volumes.len(), 1, "one PodVolumeRestore: {volumes:?}");
    assert_eq!(volumes[0].0, "Completed", "{volumes:?}");

    wait_available(&ctx, "files").await?;
    let after = checksums(&ctx, "files").await?;
    assert_eq!(after, before, "the restored volume holds the same bytes");
    Ok(())
}

/// Installs `files` (data-app 1.0.0 with 2 MiB on its claim, on the real node), backs it up
/// with its volume data (Backup Operation `with-data`), and returns the data's checksums.
async fn install_and_back_up(ctx: &TestContext) -> anyhow::Result<String> {
    let mut values = placement();
    values["dataSizeKiB"] = json!(2048);
    apply_app(ctx, &app("files", "data-app", "1.0.0", values)).await?;
    wait_deployed(ctx, "files", "InstallSucceeded", "1.0.0").await?;
    wait_available(ctx, "files").await?;
    let before = checksums(ctx, "files").await?;
    create_operation(
        ctx,
        &operation(
            "with-data",
            "files",
            "Backup",
            json!({"includeVolumes": true, "volumeMethod": "FileSystem", "ttl": "1h"}),
        ),
    )
    .await?;
    wait_phase(ctx, "with-data", OperationPhase::Succeeded, "Completed").await?;
    Ok(before)
}

/// Overwrites the app's data in place, as a bad migration or a user would.
async fn overwrite_data(ctx: &TestContext, release: &str) -> anyhow::Result<()> {
    let target = format!("deploy/{release}");
    kubectl(
        &[
            "-n",
            ctx.namespace.as_str(),
            "exec",
            &target,
            "-c",
            "app",
            "--",
            "sh",
            "-c",
            "head -c 4096 /dev/urandom > /data/seed.bin && echo overwritten > /data/generation",
        ],
        None,
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_volume_restore_replaces_the_live_claim_with_the_backed_up_data() -> anyhow::Result<()> {
    require_real_node()?;
    let ctx = TestContext::new("data-inplace").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let _backup = start_engine(&ctx, "backup-engine", &[]).await?;
    let _restore = start_engine(&ctx, "restore-engine", &[]).await?;

    let before = install_and_back_up(&ctx).await?;

    // The live data changes; the workload and its claim stay where they are.
    overwrite_data(&ctx, "files").await?;
    assert_ne!(checksums(&ctx, "files").await?, before, "the data was overwritten");

    let volumes = restore_with_volumes(&ctx, "bring-back", None).await?;
    assert_eq!(
        volumes.len(),
        1,
        "one PodVolumeRestore into the replaced claim: {volumes:?}"
    );
    wait_available(&ctx, "files").await?;
    assert_eq!(
        checksums(&ctx, "files").await?,
        before,
        "the backed-up bytes replaced the live ones"
    );
    Ok(())
}

#[tokio::test]
async fn a_failed_upgrade_that_rewrote_the_data_rolls_back_with_the_data_byte_identical() -> anyhow::Result<()> {
    require_real_node()?;
    let ctx = TestContext::new("data-rollback").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let _backup = start_engine(&ctx, "backup-engine", &[]).await?;
    let _restore = start_engine(&ctx, "restore-engine", &[]).await?;
    let _upgrade = start_engine(&ctx, "upgrade-engine", &[]).await?;

    let mut values = placement();
    values["dataSizeKiB"] = json!(2048);
    values["generation"] = json!("1.0.0 data");
    apply_app(&ctx, &app("files", "data-app", "1.0.0", values)).await?;
    wait_deployed(&ctx, "files", "InstallSucceeded", "1.0.0").await?;
    wait_available(&ctx, "files").await?;
    let before = checksums(&ctx, "files").await?;

    // 2.0.0's first pre-upgrade hook rewrites the data, its second fails the upgrade.
    create_operation(
        &ctx,
        &operation(
            "up",
            "files",
            "Upgrade",
            json!({
                "chartVersion": "2.0.0",
                "backupFirst": true,
                "backup": {"includeVolumes": true, "volumeMethod": "FileSystem", "ttl": "1h"},
                "onFailure": "RollbackAndRestore",
            }),
        ),
    )
    .await?;
    let failed = e2e::ops::wait_operation(
        &ctx,
        "up",
        "Failed after rolling back and restoring",
        e2e::ops::OPERATION_TIMEOUT * 3,
        |op| op.status.as_ref().and_then(|s| s.phase) == Some(OperationPhase::Failed),
    )
    .await?;
    let result = failed.status.clone().and_then(|s| s.result).unwrap_or_default();
    assert!(
        result.contains("rolled back") && result.contains("ended Succeeded"),
        "rolled back and restored: {result}"
    );
    let restore: api::Operation = ctx.api().get("up-restore").await?;
    assert_eq!(
        restore.spec.restore.as_ref().and_then(|r| r.restore_volumes),
        Some(true),
        "the child Restore brings the volume data back"
    );

    // The hook did rewrite the data before the upgrade failed.
    let rewrite = kubectl(
        &[
            "-n",
            ctx.namespace.as_str(),
            "get",
            "job",
            "files-migrate-rewrite",
            "-o",
            "jsonpath={.status.succeeded}",
        ],
        None,
    )
    .await?;
    assert_eq!(rewrite.trim(), "1", "the rewriting hook ran to completion");

    wait_deployed(&ctx, "files", "UpgradeSucceeded", "1.0.0").await?;
    wait_available(&ctx, "files").await?;
    assert_eq!(
        checksums(&ctx, "files").await?,
        before,
        "the old version runs again with its data byte-identical"
    );
    Ok(())
}

/// `sha256sum` of the data files of `release`'s running container in `namespace`.
async fn checksums_in(namespace: &str, release: &str) -> anyhow::Result<String> {
    let target = format!("deploy/{release}");
    let mut args = vec!["-n", namespace, "exec", &target, "-c", "app", "--", "sha256sum"];
    args.extend(DATA_FILES);
    kubectl(&args, None).await
}

#[tokio::test]
async fn a_clone_restores_the_application_and_its_data_into_an_allowed_namespace_only() -> anyhow::Result<()> {
    require_real_node()?;
    let ctx = TestContext::new("data-clone").await?;
    let copy = TestContext::new("data-clone-to").await?;
    let (from, to) = (ctx.namespace.as_str(), copy.namespace.as_str());
    // Allowed by the engine's namespaces but not paired: refused all the same.
    let unpaired = format!("{to}-x");
    let _controller = start_controller(&ctx, &[]).await?;
    let _backup = start_engine(&ctx, "backup-engine", &[]).await?;
    let allowed = format!("{from},{to},{unpaired}");
    let pair = format!("{from}={to}");
    let _restore =
        e2e::ops::start_engine_allowing(&ctx, "restore-engine", &allowed, &["--allowed-namespace-pairs", &pair])
            .await?;

    let before = install_and_back_up(&ctx).await?;

    let mut refused = operation(
        "elsewhere",
        "files",
        "Restore",
        json!({"source": {"operationName": "with-data"}, "restoreVolumes": true, "targetNamespace": unpaired}),
    );
    refused["spec"]["requestId"] = json!("req-elsewhere");
    create_operation(&ctx, &refused).await?;
    let refused = wait_phase(&ctx, "elsewhere", OperationPhase::Failed, "NamespaceNotAllowed").await?;
    let result = refused.status.and_then(|s| s.result).unwrap_or_default();
    assert!(
        result.contains(&format!("--allowed-namespace-pairs {from}={unpaired}")),
        "{result}"
    );

    let volumes = restore_with_volumes(&ctx, "clone", Some(to)).await?;
    assert_eq!(
        volumes.len(),
        1,
        "one PodVolumeRestore into the clone's claim: {volumes:?}"
    );

    // The clone runs in the other namespace on the same bytes; the original is untouched.
    wait_available(&copy, "files").await?;
    assert_eq!(
        checksums_in(to, "files").await?,
        before,
        "the clone holds the same bytes"
    );
    assert_eq!(checksums(&ctx, "files").await?, before, "the original keeps its data");
    let original: api::ApplicationInstance = ctx.api().get("files").await?;
    let ready = original
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.reason.clone()));
    assert_eq!(
        ready,
        Some(("True".to_owned(), "InstallSucceeded".to_owned())),
        "the original was never suspended"
    );
    Ok(())
}

/// The verification Job the `files` app declares: it checks the copy's data files, mounted
/// read-only from the restored claim, against `sums` (`sha256sum` output).
fn verification_job(sums: &str) -> anyhow::Result<Value> {
    let mut pod = placement();
    pod["containers"] = json!([{
        "name": "check",
        "image": e2e::real_node::image("registry.invalid/vworkspace/data")?,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", "echo \"copy of $VWS_SOURCE_NAMESPACE in $VWS_VERIFY_NAMESPACE\"; printf '%s\\n' \"$SUMS\" | sha256sum -c -"],
        "env": [{"name": "SUMS", "value": sums.trim_end()}],
        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true}],
    }]);
    pod["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": "files-data", "readOnly": true}}]);
    Ok(json!({"backoffLimit": 0, "template": {"spec": pod}}))
}

/// Declares `files`' restore verification (the same values as [`install_and_back_up`], so
/// the release does not change).
/// The UID of `release`'s Deployment.
async fn deployment_uid(ctx: &TestContext, release: &str) -> anyhow::Result<String> {
    let target = format!("deploy/{release}");
    let namespace = ctx.namespace.as_str();
    kubectl(
        &["-n", namespace, "get", &target, "-o", "jsonpath={.metadata.uid}"],
        None,
    )
    .await
}

/// A verified restore's evidence (`status.verification`), after checking that its scratch
/// namespace is gone.
async fn evidence_of(op: &api::Operation) -> anyhow::Result<api::RestoreVerificationStatus> {
    let evidence = op
        .status
        .as_ref()
        .and_then(|s| s.verification.clone())
        .ok_or_else(|| anyhow::anyhow!("no status.verification: {:?}", op.status))?;
    let namespace = format!("namespace/{}", evidence.scratch_namespace);
    let left = kubectl(&["get", &namespace, "--ignore-not-found", "-o", "name"], None).await?;
    anyhow::ensure!(left.trim().is_empty(), "the scratch namespace is left: {left}");
    Ok(evidence)
}

async fn declare_verification(ctx: &TestContext, sums: &str) -> anyhow::Result<()> {
    let mut values = placement();
    values["dataSizeKiB"] = json!(2048);
    let mut files = app("files", "data-app", "1.0.0", values);
    files.spec.restore_verification = Some(api::RestoreVerification {
        timeout_seconds: Some(300),
        job: Some(verification_job(sums)?),
    });
    apply_app(ctx, &files).await?;
    Ok(())
}

#[tokio::test]
async fn a_verified_restore_checks_a_copy_in_a_scratch_namespace_and_removes_it() -> anyhow::Result<()> {
    require_real_node()?;
    let ctx = TestContext::new("data-verify").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let _backup = start_engine(&ctx, "backup-engine", &[]).await?;
    // With the bundle's RBAC and admission policy only: the scratch namespace is the one
    // namespace it may create and delete.
    let _restore = e2e::ops::start_engine_as_service_account(&ctx, "restore-engine", &[]).await?;

    let before = install_and_back_up(&ctx).await?;
    let uid_before = deployment_uid(&ctx, "files").await?;
    declare_verification(&ctx, &before).await?;

    let verify = json!({"source": {"operationName": "with-data"}, "verify": true});
    create_operation(&ctx, &operation("verify-good", "files", "Restore", verify.clone())).await?;
    let good = wait_phase(&ctx, "verify-good", OperationPhase::Succeeded, "Completed").await?;
    let evidence = evidence_of(&good).await?;
    assert!(evidence.passed, "{evidence:?}");
    assert!(evidence.scratch_namespace_removed, "{evidence:?}");
    assert!(evidence.scratch_namespace.starts_with("vws-verify-"), "{evidence:?}");
    assert_eq!(evidence.workloads_ready, ["Deployment/files"], "{evidence:?}");
    assert_eq!(evidence.volumes_restored, Some(1), "{evidence:?}");
    assert!(evidence.items_restored.unwrap_or(0) > 0, "{evidence:?}");
    assert!(evidence.job.is_some(), "{evidence:?}");
    assert!(evidence.message.contains("completed"), "{evidence:?}");

    // The application was not touched: the same Deployment, the same bytes.
    let uid_after = deployment_uid(&ctx, "files").await?;
    assert_eq!(uid_after, uid_before, "the original Deployment is the same object");
    assert_eq!(checksums(&ctx, "files").await?, before, "the original keeps its data");

    // A check that finds other bytes fails the verification, and still cleans up.
    let wrong = before.replacen(|c: char| c.is_ascii_hexdigit(), "0", 8);
    declare_verification(&ctx, &wrong).await?;
    create_operation(&ctx, &operation("verify-bad", "files", "Restore", verify.clone())).await?;
    let bad = wait_phase(&ctx, "verify-bad", OperationPhase::Failed, "VerificationFailed").await?;
    let evidence = evidence_of(&bad).await?;
    assert!(!evidence.passed && evidence.scratch_namespace_removed, "{evidence:?}");
    assert!(evidence.message.contains("failed"), "{evidence:?}");

    // A verified restore deleted mid-way leaves no copy behind: the engine's sweep removes
    // the scratch namespace of an Operation that no longer exists.
    create_operation(&ctx, &operation("verify-dropped", "files", "Restore", verify)).await?;
    let label = format!("vworkspace.io/operation-namespace={}", ctx.namespace);
    let scratch = eventually(&ctx, "the scratch namespace exists", ROLLOUT_TIMEOUT, || async {
        let names = kubectl(&["get", "namespace", "-l", &label, "-o", "name"], None).await?;
        let name = names.lines().find(|n| n.contains("vws-verify-")).map(str::to_owned);
        Ok(name.ok_or_else(|| "not yet".to_owned()))
    })
    .await?;
    kubectl(
        &[
            "-n",
            ctx.namespace.as_str(),
            "delete",
            "operation",
            "verify-dropped",
            "--wait=true",
        ],
        None,
    )
    .await?;
    eventually(
        &ctx,
        "the orphaned scratch namespace removed",
        ROLLOUT_TIMEOUT,
        || async {
            let left = kubectl(&["get", &scratch, "--ignore-not-found", "-o", "name"], None).await?;
            Ok(if left.trim().is_empty() {
                Ok(())
            } else {
                Err(format!("{scratch} still exists"))
            })
        },
    )
    .await?;
    Ok(())
}
