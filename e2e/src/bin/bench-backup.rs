//! `bench-backup`: backup and restore of volume data on the real node (printed, never
//! asserted).
//!
//! ```text
//! bench-backup --size-mib 1024
//! ```
//!
//! Installs the `data-app` e2e chart on the real node with `--size-mib` MiB of random bytes on
//! its `local-path` claim, then measures, in the same run and on the same disk:
//! 1. the baseline: a plain `cp -a` of the claim's directory (then `sync`), the throughput any
//!    copy of the data could reach there;
//! 2. a Backup Operation with volumes (Velero file-system backup: node-agent, Kopia, S3 on
//!    loopback), from its creation to `Succeeded`, and from its creation to the moment the
//!    Velero Backup is first seen `InProgress`;
//! 3. after deleting the workload and the claim, a Restore Operation with volumes, the same
//!    two figures, and the restored bytes compared (sha256) with the originals.
//!
//! Throughputs are reported as a ratio to the `cp` baseline. The app controller and the
//! engines are the e2e (debug) builds: what is measured is Velero's data path and the
//! engines' latency to start it, not their CPU. Runs inside the cluster netns
//! (`just bench-backup`).

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use api::{Operation, OperationPhase};
use clap::Parser;
use e2e::{
    TestContext,
    apps::{app, apply_app, start_controller, wait_deployed},
    deploy::kubectl,
    ops::{create_operation, operation, start_engine},
    real_node::{placement, require_real_node},
};
use serde_json::{Value, json};

const VELERO_NAMESPACE: &str = "velero";
const RELEASE: &str = "files";
const POLL: Duration = Duration::from_millis(100);

/// Backup and restore of volume data on the real node (printed, never asserted).
#[derive(Parser)]
#[command(name = "bench-backup")]
struct Args {
    /// Random data on the claim, MiB.
    #[arg(long, default_value_t = 1024)]
    size_mib: u64,
    /// Longest wait for each Operation, seconds.
    #[arg(long, default_value_t = 1800)]
    timeout_secs: u64,
}

/// When an Operation was seen ending, and when its Velero child was first seen `InProgress`.
struct Timing {
    velero_started: Option<Duration>,
    done: Duration,
    phase: Option<OperationPhase>,
    /// The Velero child's name.
    velero_name: Option<String>,
}

/// Creates `op` and polls it (and its Velero `kind` child) every [`POLL`] until it ends.
async fn run_operation(ctx: &TestContext, op: &Value, kind: &str, timeout: Duration) -> anyhow::Result<Timing> {
    let name = op
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let started = Instant::now();
    create_operation(ctx, op).await?;
    let mut velero_started = None;
    let mut velero_name = None;
    loop {
        let current: Operation = ctx.api().get(&name).await?;
        let status = current.status.clone().unwrap_or_default();
        if velero_started.is_none()
            && let Some(child) = status
                .children
                .iter()
                .find(|c| c.kind == kind && c.api_version == "velero.io/v1")
        {
            velero_name = Some(child.name.clone());
            let out = kubectl(
                &[
                    "-n",
                    VELERO_NAMESPACE,
                    "get",
                    &format!("{}.velero.io", kind.to_ascii_lowercase()),
                    &child.name,
                    "-o",
                    "jsonpath={.status.phase}",
                ],
                None,
            )
            .await
            .unwrap_or_default();
            if matches!(
                out.trim(),
                "InProgress" | "WaitingForPluginOperations" | "Finalizing" | "Completed"
            ) {
                velero_started = Some(started.elapsed());
            }
        }
        if status.phase.is_some_and(OperationPhase::is_terminal) {
            return Ok(Timing {
                velero_started,
                done: started.elapsed(),
                phase: status.phase,
                velero_name: velero_name.or_else(|| {
                    status
                        .children
                        .iter()
                        .find(|c| c.kind == kind && c.api_version == "velero.io/v1")
                        .map(|c| c.name.clone())
                }),
            });
        }
        if started.elapsed() > timeout {
            bail!("Operation {name} did not end within {timeout:?}: {:?}", status.phase);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The host directory of the app's claim (a `local-path` hostPath volume on this machine).
async fn claim_directory(ctx: &TestContext) -> anyhow::Result<String> {
    let ns = ctx.namespace.as_str();
    let claim = format!("{RELEASE}-data");
    let volume = kubectl(
        &["-n", ns, "get", "pvc", &claim, "-o", "jsonpath={.spec.volumeName}"],
        None,
    )
    .await?;
    let pv: Value = serde_json::from_str(&kubectl(&["get", "pv", volume.trim(), "-o", "json"], None).await?)?;
    pv.pointer("/spec/hostPath/path")
        .or_else(|| pv.pointer("/spec/local/path"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .context("the claim's volume is neither hostPath nor local")
}

/// `cp -a` of `dir` beside itself, then `sync`; seconds. The copy is removed.
fn copy_seconds(dir: &str) -> anyhow::Result<f64> {
    let copy = format!("{}.bench-copy", dir.trim_end_matches('/'));
    let _ = std::fs::remove_dir_all(&copy);
    let sync = || std::process::Command::new("sync").status();
    sync()?;
    let started = Instant::now();
    let status = std::process::Command::new("cp").args(["-a", dir, &copy]).status()?;
    sync()?;
    let seconds = started.elapsed().as_secs_f64();
    std::fs::remove_dir_all(&copy)?;
    if !status.success() {
        bail!("cp -a {dir} {copy} failed: {status}");
    }
    Ok(seconds)
}

/// Velero's own record of the data stage: `(bytes done, seconds from start to completion)` of
/// each PodVolumeBackup (or Restore) of the Velero object `owner_label=name` (whole seconds).
async fn pod_volume_stage(resource: &str, owner_label: &str, name: &str) -> anyhow::Result<Vec<(u64, i64)>> {
    let selector = format!("{owner_label}={name}");
    let out = kubectl(
        &["-n", VELERO_NAMESPACE, "get", resource, "-l", &selector, "-o", "json"],
        None,
    )
    .await?;
    let list: Value = serde_json::from_str(&out)?;
    let time = |item: &Value, field: &str| {
        item.pointer(&format!("/status/{field}"))
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
    };
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| {
            let bytes = item
                .pointer("/status/progress/bytesDone")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            let seconds = match (time(item, "startTimestamp"), time(item, "completionTimestamp")) {
                (Some(start), Some(end)) => end.as_second() - start.as_second(),
                _ => -1,
            };
            (bytes, seconds)
        })
        .collect())
}

async fn checksum(ctx: &TestContext) -> anyhow::Result<String> {
    let target = format!("deploy/{RELEASE}");
    let ns = ctx.namespace.as_str();
    kubectl(
        &[
            "-n",
            ns,
            "exec",
            &target,
            "-c",
            "app",
            "--",
            "sha256sum",
            "/data/seed.bin",
        ],
        None,
    )
    .await
}

async fn wait_available(ctx: &TestContext, timeout: Duration) -> anyhow::Result<()> {
    let target = format!("deployment/{RELEASE}");
    let timeout = format!("--timeout={}s", timeout.as_secs());
    kubectl(
        &["-n", ctx.namespace.as_str(), "rollout", "status", &target, &timeout],
        None,
    )
    .await?;
    Ok(())
}

fn mib_per_second(mib: u64, seconds: f64) -> f64 {
    mib as f64 / seconds.max(1e-9)
}

fn report(what: &str, timing: &Timing, mib: u64, baseline: f64) {
    let seconds = timing.done.as_secs_f64();
    let rate = mib_per_second(mib, seconds);
    println!(
        "{what}: {:?} after {seconds:.1} s, {rate:.1} MiB/s = {:.3} x cp; Operation created -> Velero InProgress: {}",
        timing.phase,
        rate / baseline,
        timing
            .velero_started
            .map_or("not seen".to_owned(), |d| format!("{} ms", d.as_millis()))
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    require_real_node()?;
    let timeout = Duration::from_secs(args.timeout_secs);
    let ctx = TestContext::new("bench-backup").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let _backup = start_engine(&ctx, "backup-engine", &[]).await?;
    let _restore = start_engine(&ctx, "restore-engine", &[]).await?;

    let mut values = placement();
    values["dataSizeKiB"] = json!(args.size_mib * 1024);
    values["storage"] = json!(format!("{}Mi", args.size_mib * 2));
    apply_app(&ctx, &app(RELEASE, "data-app", "1.0.0", values)).await?;
    wait_deployed(&ctx, RELEASE, "InstallSucceeded", "1.0.0").await?;
    wait_available(&ctx, timeout).await?;
    let before = checksum(&ctx).await?;

    let dir = claim_directory(&ctx).await?;
    let cp = copy_seconds(&dir)?;
    let baseline = mib_per_second(args.size_mib, cp);
    println!(
        "data: {} MiB of random bytes on a local-path claim ({dir})",
        args.size_mib
    );
    println!("baseline: cp -a + sync of the claim's directory on the same disk: {cp:.1} s, {baseline:.1} MiB/s");

    let backup = operation(
        "bench-backup",
        RELEASE,
        "Backup",
        json!({"includeVolumes": true, "volumeMethod": "FileSystem", "ttl": "1h"}),
    );
    let timing = run_operation(&ctx, &backup, "Backup", timeout).await?;
    report(
        "backup (Velero file-system backup, Kopia, S3 on loopback)",
        &timing,
        args.size_mib,
        baseline,
    );
    if let Some(name) = &timing.velero_name {
        let stage = pod_volume_stage("podvolumebackups.velero.io", "velero.io/backup-name", name).await?;
        println!("  of which the PodVolumeBackups (bytes, seconds start -> completion): {stage:?}");
    }
    if timing.phase != Some(OperationPhase::Succeeded) {
        bail!("the backup did not succeed");
    }

    let ns = ctx.namespace.as_str();
    kubectl(&["-n", ns, "delete", "deployment", RELEASE, "--wait=true"], None).await?;
    kubectl(
        &["-n", ns, "delete", "pvc", &format!("{RELEASE}-data"), "--wait=true"],
        None,
    )
    .await?;
    let restore = operation(
        "bench-restore",
        RELEASE,
        "Restore",
        json!({"source": {"operationName": "bench-backup"}, "restoreVolumes": true}),
    );
    let timing = run_operation(&ctx, &restore, "Restore", timeout).await?;
    report("restore (Velero file-system restore)", &timing, args.size_mib, baseline);
    if let Some(name) = &timing.velero_name {
        let stage = pod_volume_stage("podvolumerestores.velero.io", "velero.io/restore-name", name).await?;
        println!("  of which the PodVolumeRestores (bytes, seconds start -> completion): {stage:?}");
    }
    wait_available(&ctx, timeout).await?;
    let after = checksum(&ctx).await?;
    println!(
        "restored bytes: {}",
        if after == before {
            "identical (sha256)"
        } else {
            "DIFFERENT"
        }
    );
    if after != before {
        bail!("restored data differs: {after} vs {before}");
    }
    Ok(())
}
