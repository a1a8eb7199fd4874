//! `kubectl vws` on the real cluster: the plugin binary, run as kubectl runs it (and through
//! kubectl itself), against an app installed by Flux and Operations run by the real
//! engines. Output is checked line by line; without a terminal the progress is plain lines.

use std::{path::PathBuf, process::Stdio};

use anyhow::{Context, bail, ensure};
use api::{ApplicationInstance, Operation, OperationPhase};
use e2e::{
    TestContext,
    apps::{app, apply_app, start_controller, wait_deployed},
    cluster_dir,
    deploy::kubectl_path,
    flux::helm_releases,
    ops::start_engine,
    process::binary_path,
};
use kube::{ResourceExt, api::ListParams};
use serde_json::{Value, json};

/// What one run of the plugin printed, and how it exited.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(self) -> anyhow::Result<String> {
        // Shown with --nocapture: the session as a person sees it (docs/cli.md quotes it).
        println!("{}{}", self.stdout, self.stderr);
        ensure!(self.code == 0, "exit {}: {}\n{}", self.code, self.stdout, self.stderr);
        Ok(self.stdout)
    }
}

fn kubeconfig() -> PathBuf {
    std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| cluster_dir().join("admin.kubeconfig"))
}

/// `kubectl-vws --kubeconfig … -n <test namespace> <args>`, stdout not a terminal.
async fn vws(ctx: &TestContext, args: &[&str]) -> anyhow::Result<Run> {
    let out = tokio::process::Command::new(binary_path("kubectl-vws"))
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(["-n", &ctx.namespace])
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .context("running kubectl-vws")?;
    Ok(Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

fn write_file(ctx: &TestContext, name: &str, text: &str) -> anyhow::Result<String> {
    let dir = std::env::temp_dir().join(format!("kubectl-vws-{}", ctx.namespace));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path.display().to_string())
}

fn line_with<'a>(text: &'a str, needle: &str) -> anyhow::Result<&'a str> {
    text.lines()
        .find(|l| l.contains(needle))
        .with_context(|| format!("no line with {needle:?} in:\n{text}"))
}

/// The whole session of the README: get, trace, upgrade --wait, history, rollback --wait
/// (twice with one request id), a failing runbook, suspend/resume, reconcile, and errors.
#[tokio::test]
async fn a_kubectl_vws_session_on_a_real_release() -> anyhow::Result<()> {
    let ctx = TestContext::new("kubectl-vws").await?;
    let ns = ctx.namespace.clone();
    let _controller = start_controller(&ctx, &[]).await?;
    let _upgrade = start_engine(&ctx, "upgrade-engine", &[]).await?;
    let _runbook = start_engine(&ctx, "runbook-engine", &[]).await?;
    apply_app(&ctx, &app("shop", "demo-app", "0.1.0", json!({"greeting": "hello"}))).await?;
    wait_deployed(&ctx, "shop", "InstallSucceeded", "0.1.0").await?;

    // get: the namespace's table, one app as JSON, every namespace.
    let table = vws(&ctx, &["get"]).await?.ok()?;
    let mut lines = table.lines();
    assert_eq!(
        lines.next().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")),
        Some("NAME ENGINE CHART DESIRED DEPLOYED READY REASON LAST BACKUP NEXT WINDOW".to_owned()),
        "{table}"
    );
    let row: Vec<&str> = line_with(&table, "shop")?.split_whitespace().collect();
    assert_eq!(
        row,
        [
            "shop",
            "flux",
            "demo-app",
            "0.1.0",
            "0.1.0",
            "True",
            "InstallSucceeded",
            "-",
            "-"
        ],
        "{table}"
    );
    let json_out = vws(&ctx, &["get", "shop", "-o", "json"]).await?.ok()?;
    let object: Value = serde_json::from_str(&json_out)?;
    assert_eq!(object["kind"], "ApplicationInstance");
    assert!(object["metadata"].get("managedFields").is_none(), "{json_out}");
    let yaml_out = vws(&ctx, &["get", "-o", "yaml"]).await?.ok()?;
    let list: Value = serde_saphyr::from_str(&yaml_out)?;
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"][0]["metadata"]["name"], "shop");
    let all = vws(&ctx, &["get", "-A"]).await?.ok()?;
    assert!(all.starts_with("NAMESPACE"), "{all}");
    assert!(line_with(&all, &format!("{ns} "))?.contains(" shop "), "{all}");

    // trace: app → HelmRelease → its shared HelmRepository and HelmChart, all Ready.
    let trace = vws(&ctx, &["trace", "shop"]).await?.ok()?;
    assert!(
        line_with(&trace, "ApplicationInstance/")?.starts_with(&format!("ApplicationInstance/{ns}/shop  Ready=True")),
        "{trace}"
    );
    assert!(
        line_with(&trace, &format!("HelmRelease/{ns}/shop  Ready=True"))?.starts_with("└─ "),
        "{trace}"
    );
    assert!(line_with(&trace, "HelmRepository/")?.contains("Ready=True"), "{trace}");
    assert!(line_with(&trace, "HelmChart/")?.contains("Ready=True"), "{trace}");

    // upgrade --wait with a values file: plain progress lines, then Succeeded.
    let values = write_file(&ctx, "values.yaml", "greeting: hi\nextra: x\n")?;
    let up = vws(
        &ctx,
        &[
            "upgrade",
            "shop",
            "--version",
            "0.2.0",
            "--values-file",
            &values,
            "--wait",
            "--timeout",
            "3m",
        ],
    )
    .await?
    .ok()?;
    let created = line_with(&up, "created (requestId kubectl-vws-")?;
    let up_name = created
        .trim_start_matches("operation.vworkspace.io/")
        .split_whitespace()
        .next()
        .context("operation name")?
        .to_owned();
    // Its child (the revision history it recorded) and the engine's words in the line.
    assert!(
        line_with(&up, &format!("{up_name} Running  ConfigMap/{ns}/shop-revisions  "))?.contains("chart version 0.2.0"),
        "{up}"
    );
    assert!(
        up.trim_end().ends_with(&format!(
            "operation {up_name} Succeeded: {}",
            result_of(&ctx, &up_name).await?
        )),
        "{up}"
    );
    assert!(!up.contains('\r'), "no terminal, no carriage returns: {up:?}");
    let shop = ctx.api::<ApplicationInstance>().get("shop").await?;
    assert_eq!(shop.spec.values, Some(json!({"greeting": "hi", "extra": "x"})));
    wait_deployed(&ctx, "shop", "UpgradeSucceeded", "0.2.0").await?;

    // history: newest first, revision 2 caused by the upgrade, 1 by the spec.
    let history = vws(&ctx, &["history", "shop"]).await?.ok()?;
    let rows: Vec<&str> = history.lines().skip(1).collect();
    ensure!(rows.len() >= 2, "{history}");
    assert!(
        rows[0].starts_with("2 ") && rows[0].contains("demo-app-0.2.0"),
        "{history}"
    );
    assert!(
        rows[0].ends_with(&format!("Upgrade/{up_name} ({})", request_id_of(&ctx, &up_name).await?)),
        "{history}"
    );
    assert!(
        rows[1].starts_with("1 ") && rows[1].ends_with("spec change"),
        "{history}"
    );

    // rollback --to 1 with a request id; the same command again does not act twice.
    let back = vws(
        &ctx,
        &["rollback", "shop", "--to", "1", "--request-id", "back-1", "--wait"],
    )
    .await?
    .ok()?;
    assert!(line_with(&back, "created (requestId back-1)").is_ok(), "{back}");
    assert!(line_with(&back, "Succeeded:").is_ok(), "{back}");
    let again = vws(
        &ctx,
        &["rollback", "shop", "--to", "1", "--request-id", "back-1", "--wait"],
    )
    .await?
    .ok()?;
    assert!(
        line_with(&again, "already exists for requestId back-1; not created again").is_ok(),
        "{again}"
    );
    assert!(line_with(&again, "Succeeded:").is_ok(), "{again}");
    let rollbacks = ctx
        .api::<Operation>()
        .list(&ListParams::default().fields("spec.applicationRef.name=shop"))
        .await?
        .items
        .into_iter()
        .filter(|o| o.spec.type_ == api::OperationType::Rollback)
        .count();
    assert_eq!(rollbacks, 1, "one Operation for one request");
    wait_deployed(&ctx, "shop", "UpgradeSucceeded", "0.1.0").await?;

    // A runbook whose pod can never be scheduled fails at its deadline: exit 1, the reason.
    let job = write_file(
        &ctx,
        "job.yaml",
        "backoffLimit: 0\nactiveDeadlineSeconds: 3\ntemplate:\n  spec:\n    nodeSelector:\n      vworkspace.io/no-such-node: \"true\"\n    containers:\n    - name: main\n      image: busybox:1.36\n      command: [\"sleep\", \"1000\"]\n",
    )?;
    let failed = vws(
        &ctx,
        &["runbook", "shop", "--job-file", &job, "--param", "MODE=full", "--wait"],
    )
    .await?;
    assert_eq!(failed.code, 1, "{}\n{}", failed.stdout, failed.stderr);
    assert!(failed.stderr.starts_with("error: Operation "), "{}", failed.stderr);
    assert!(
        failed.stderr.contains(" Failed: DeadlineExceeded: "),
        "{}",
        failed.stderr
    );
    assert!(
        line_with(&failed.stdout, "Job/").is_ok(),
        "the child is shown: {}",
        failed.stdout
    );

    // suspend / resume change the spec; the table follows.
    vws(&ctx, &["suspend", "shop"]).await?.ok()?;
    assert!(ctx.api::<ApplicationInstance>().get("shop").await?.spec.suspend);
    vws(&ctx, &["resume", "shop"]).await?.ok()?;
    assert!(!ctx.api::<ApplicationInstance>().get("shop").await?.spec.suspend);

    // reconcile: Flux's annotation on the HelmRelease, and Flux handled that very request.
    let reconciled = vws(&ctx, &["reconcile", "shop", "--with-source"]).await?.ok()?;
    assert!(
        line_with(&reconciled, &format!("► asked HelmRelease/{ns}/shop to reconcile")).is_ok(),
        "{reconciled}"
    );
    assert!(
        line_with(&reconciled, &format!("✔ reconciled: HelmRelease/{ns}/shop  Ready=True")).is_ok(),
        "{reconciled}"
    );
    let hr = helm_releases(&ctx).get("shop").await?;
    let asked = hr.annotations().get("reconcile.fluxcd.io/requestedAt").cloned();
    let handled = hr
        .data
        .pointer("/status/lastHandledReconcileAt")
        .and_then(Value::as_str)
        .map(str::to_owned);
    assert!(asked.is_some() && asked == handled, "{asked:?} {handled:?}");

    // Through kubectl itself: the plugin is found on PATH.
    let debug_dir = binary_path("kubectl-vws")
        .parent()
        .map(PathBuf::from)
        .context("binary dir")?;
    let path = format!("{}:{}", debug_dir.display(), std::env::var("PATH").unwrap_or_default());
    let through_kubectl = tokio::process::Command::new(kubectl_path())
        .args(["vws", "--kubeconfig"])
        .arg(kubeconfig())
        .args(["get", "shop", "-n", &ns])
        .env("PATH", path)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&through_kubectl.stdout);
    assert!(
        through_kubectl.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&through_kubectl.stderr)
    );
    assert!(line_with(&stdout, "shop")?.contains("UpgradeSucceeded"), "{stdout}");

    // Errors: a clear message and exit 1; a missing flag is a usage error (2).
    let missing = vws(&ctx, &["get", "nope"]).await?;
    assert_eq!(missing.code, 1);
    assert_eq!(
        missing.stderr.trim(),
        format!("error: applicationinstance {ns}/nope not found")
    );
    let no_app = vws(&ctx, &["backup", "nope"]).await?;
    assert_eq!(
        (no_app.code, no_app.stderr.trim()),
        (1, format!("error: applicationinstance {ns}/nope not found").as_str())
    );
    let usage = vws(&ctx, &["upgrade", "shop"]).await?;
    assert_eq!(usage.code, 2, "{}", usage.stderr);
    let bad_id = vws(&ctx, &["backup", "shop", "--request-id", "a b"]).await?;
    assert!(
        bad_id.code == 1 && bad_id.stderr.contains("[A-Za-z0-9._:-]"),
        "{}",
        bad_id.stderr
    );
    Ok(())
}

async fn operation_of(ctx: &TestContext, name: &str) -> anyhow::Result<Operation> {
    Ok(ctx.api::<Operation>().get(name).await?)
}

async fn result_of(ctx: &TestContext, name: &str) -> anyhow::Result<String> {
    let op = operation_of(ctx, name).await?;
    let status = op.status.unwrap_or_default();
    if status.phase != Some(OperationPhase::Succeeded) {
        bail!("{name} is {:?}", status.phase);
    }
    Ok(status.result.unwrap_or_default())
}

async fn request_id_of(ctx: &TestContext, name: &str) -> anyhow::Result<String> {
    Ok(operation_of(ctx, name).await?.spec.request_id)
}
