//! Flux behaviour an ApplicationInstance relies on, end to end on the local cluster: a semver
//! range following a newly published chart, values from a ConfigMap, install remediation, drift
//! detection, Helm tests and chart-hook migrations. What Flux reports is relayed verbatim:
//! where a test compares conditions, it compares ours with the HelmRelease's.

use std::{path::PathBuf, time::Duration};

use api::{
    ApplicationInstance, DriftDetection, DriftDetectionMode, ReleaseActionSpec, ReleaseTest, Remediation,
    ValuesReference, ValuesSourceKind,
};
use e2e::{
    CHART_REPO, TestContext,
    apps::{
        RELEASE_TIMEOUT, ReadyTimeline, app, apply_app, condition, config_value, start_controller, wait_app,
        wait_config, wait_deployed, wait_ready,
    },
    cluster_dir, eventually, flux, get_json,
    real_node::{REAL_NODE, image, placement, pod_log, require_real_node, wait_pod_phase},
};
use k8s_openapi::api::{
    apps::v1::Deployment,
    batch::v1::Job,
    core::v1::{ConfigMap, Event, Pod},
};
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::{Value, json};

/// The condition types Flux writes on a HelmRelease and we relay (`RELAYED_FROM_HELMRELEASE`).
const RELAYED: [&str; 7] = [
    "Ready",
    "Released",
    "TestSuccess",
    "Remediated",
    "Drifted",
    "Reconciling",
    "Stalled",
];

async fn helm_release(ctx: &TestContext, name: &str) -> anyhow::Result<Value> {
    get_json(&flux::helm_releases(ctx), name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no HelmRelease {name}"))
}

/// Waits until every relayed condition of the ApplicationInstance equals the HelmRelease's,
/// status, reason and message, or is absent on both (the app's status must be current).
async fn wait_relayed_verbatim(ctx: &TestContext, name: &str) -> anyhow::Result<ApplicationInstance> {
    let apps = ctx.api::<ApplicationInstance>();
    eventually(
        ctx,
        &format!("{name}: conditions equal to the HelmRelease's"),
        Duration::from_secs(60),
        || async {
            let app = apps.get(name).await?;
            let hr = helm_release(ctx, name).await?;
            if app.status.as_ref().and_then(|s| s.observed_generation) != app.metadata.generation {
                return Ok(Err("status not current".into()));
            }
            let differences: Vec<String> = RELAYED
                .iter()
                .filter_map(|type_| {
                    let ours = condition(&app, type_);
                    let theirs = e2e::condition(&hr, type_);
                    (ours != theirs).then(|| format!("{type_}: ours {ours:?}, HelmRelease's {theirs:?}"))
                })
                .collect();
            Ok(if differences.is_empty() {
                Ok(app)
            } else {
                Err(differences.join("; "))
            })
        },
    )
    .await
}

/// The reasons of the Events recorded on HelmRelease `name`, oldest first, with their counts.
async fn helm_release_events(ctx: &TestContext, name: &str) -> anyhow::Result<Vec<(String, i32, String)>> {
    let fields = format!("involvedObject.kind=HelmRelease,involvedObject.name={name}");
    let mut events = ctx
        .api::<Event>()
        .list(&ListParams::default().fields(&fields))
        .await?
        .items;
    events.sort_by_key(|e| e.first_timestamp.clone().map(|t| t.0));
    Ok(events
        .into_iter()
        .map(|e| {
            (
                e.reason.unwrap_or_default(),
                e.count.unwrap_or(1),
                e.message.unwrap_or_default(),
            )
        })
        .collect())
}

async fn wait_event(ctx: &TestContext, hr: &str, reason: &str, min_count: i32) -> anyhow::Result<String> {
    eventually(
        ctx,
        &format!("HelmRelease {hr}: event {reason} (x{min_count})"),
        RELEASE_TIMEOUT,
        || async {
            let events = helm_release_events(ctx, hr).await?;
            let count: i32 = events.iter().filter(|e| e.0 == reason).map(|e| e.1).sum();
            Ok(match events.iter().rev().find(|e| e.0 == reason) {
                Some(event) if count >= min_count => Ok(event.2.clone()),
                _ => Err(format!(
                    "events {:?}",
                    events.iter().map(|e| (&e.0, e.1)).collect::<Vec<_>>()
                )),
            })
        },
    )
    .await
}

async fn deployment_replicas(ctx: &TestContext, name: &str) -> anyhow::Result<Option<i32>> {
    Ok(ctx.api::<Deployment>().get(name).await?.spec.and_then(|s| s.replicas))
}

// ---------------------------------------------------------------------------------------------
// Semver ranges

/// A chart repository of the test's own, served by the cluster's chart server from
/// `charts/<namespace>/`: charts are published into it one by one. Removed on drop.
struct OwnRepository {
    dir: PathBuf,
    url: String,
}

impl OwnRepository {
    fn new(ctx: &TestContext) -> anyhow::Result<Self> {
        let dir = cluster_dir().join("charts").join(&ctx.namespace);
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            dir,
            url: format!("{CHART_REPO}/{}", ctx.namespace),
        })
    }

    /// Publishes exactly `versions` of `chart`, packaged by hack/package-charts.py into the
    /// shared repository: their archives, and an index listing only them (JSON, which is YAML).
    fn publish(&self, chart: &str, versions: &[&str]) -> anyhow::Result<()> {
        let shared = cluster_dir().join("charts");
        let index: Value = serde_saphyr::from_str(&std::fs::read_to_string(shared.join("index.yaml"))?)?;
        let entries: Vec<Value> = index["entries"][chart]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["version"].as_str().is_some_and(|v| versions.contains(&v)))
            .cloned()
            .collect();
        anyhow::ensure!(
            entries.len() == versions.len(),
            "{chart} {versions:?} not all packaged in {}",
            shared.display()
        );
        for version in versions {
            let archive = format!("{chart}-{version}.tgz");
            std::fs::copy(shared.join(&archive), self.dir.join(&archive))?;
        }
        let own = json!({"apiVersion": "v1", "entries": {chart: entries}});
        // Renamed into place: the chart server never serves a half-written index.
        let tmp = self.dir.join("index.yaml.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&own)?)?;
        std::fs::rename(&tmp, self.dir.join("index.yaml"))?;
        Ok(())
    }
}

impl Drop for OwnRepository {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An app on `~0.1` moves to 0.1.1 by itself once the repository publishes it: no spec change,
/// a second Helm revision, and the history and `deployedChartVersion` say so.
#[tokio::test]
async fn a_semver_range_follows_a_newly_published_patch_release() -> anyhow::Result<()> {
    let ctx = TestContext::new("flux-semver").await?;
    let repository = OwnRepository::new(&ctx)?;
    repository.publish("semver-app", &["0.1.0"])?;
    let _controller = start_controller(&ctx, &[]).await?;

    let mut site = app("site", "semver-app", "~0.1", json!({}));
    site.spec.interval = Some("10s".into());
    if let Some(repo) = site.spec.chart.repository.as_mut() {
        repo.url = repository.url.clone();
        repo.interval = Some("5s".into());
    }
    apply_app(&ctx, &site).await?;
    let installed = wait_deployed(&ctx, "site", "InstallSucceeded", "0.1.0").await?;
    assert_eq!(
        config_value(&ctx, "site-config", "chartVersion").await?.as_deref(),
        Some("0.1.0")
    );

    repository.publish("semver-app", &["0.1.0", "0.1.1"])?;
    let upgraded = wait_deployed(&ctx, "site", "UpgradeSucceeded", "0.1.1").await?;
    assert_eq!(
        upgraded.metadata.generation, installed.metadata.generation,
        "no spec change: Flux resolved the range again"
    );
    let status = upgraded.status.clone().unwrap_or_default();
    let history: Vec<(i64, &str, &str)> = status
        .history
        .iter()
        .map(|h| (h.revision, h.chart_version.as_str(), h.status.as_str()))
        .collect();
    assert_eq!(history, [(2, "0.1.1", "deployed"), (1, "0.1.0", "superseded")]);
    assert_eq!(status.app_version.as_deref(), Some("0.1.1"));
    assert_eq!(
        config_value(&ctx, "site-config", "chartVersion").await?.as_deref(),
        Some("0.1.1")
    );
    // The HelmRelease still asks for the range, not for the version it resolved to.
    let hr = helm_release(&ctx, "site").await?;
    assert_eq!(hr.pointer("/spec/chart/spec/version"), Some(&json!("~0.1")));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Values from a ConfigMap

/// `valuesFrom` a ConfigMap (its whole `values.yaml`, and one key at a `targetPath`), and a
/// change to the ConfigMap re-applied without a spec change and without a label on it: the app
/// controller reads ConfigMaps and asks Flux for a reconcile when one changes.
#[tokio::test]
async fn values_from_a_config_map_follow_the_config_map() -> anyhow::Result<()> {
    let ctx = TestContext::new("flux-cm").await?;
    let settings = |greeting: &str, replicas: &str| -> anyhow::Result<ConfigMap> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "wiki-settings"},
            "data": {"values.yaml": format!("greeting: {greeting}\n"), "replicas": replicas}
        }))?)
    };
    ctx.apply(&settings("from the configmap", "2")?).await?;
    let _controller = start_controller(&ctx, &[]).await?;

    let mut wiki = app("wiki", "demo-app", "0.1.0", json!({}));
    wiki.spec.values_from = vec![
        ValuesReference {
            kind: ValuesSourceKind::ConfigMap,
            name: "wiki-settings".into(),
            values_key: None,
            target_path: None,
            optional: false,
        },
        ValuesReference {
            kind: ValuesSourceKind::ConfigMap,
            name: "wiki-settings".into(),
            values_key: Some("replicas".into()),
            target_path: Some("replicaCount".into()),
            optional: false,
        },
    ];
    apply_app(&ctx, &wiki).await?;
    let ready = wait_ready(&ctx, "wiki", "True", "InstallSucceeded").await?;
    wait_config(&ctx, "wiki-config", "greeting", "from the configmap").await?;
    assert_eq!(deployment_replicas(&ctx, "wiki").await?, Some(2));

    // From the reconcile request on, the app never shows the Ready=True from before it
    // (helm-controller marks Reconciling before it touches Ready), nor the torn end of it
    // (conditions written before the history and lastHandledReconcileAt).
    let installed = newest_revision(&ready).expect("the installed release in the history");
    let timeline = ReadyTimeline::watch(&ctx, "wiki").await?;
    ctx.apply(&settings("changed in the configmap", "3")?).await?;
    wait_config(&ctx, "wiki-config", "greeting", "changed in the configmap").await?;
    let after = wait_ready(&ctx, "wiki", "True", "UpgradeSucceeded").await?;
    assert_eq!(deployment_replicas(&ctx, "wiki").await?, Some(3));
    assert_eq!(
        after.metadata.generation, ready.metadata.generation,
        "no spec change was needed"
    );
    let upgraded = newest_revision(&after);
    assert!(
        upgraded > Some(installed),
        "a new release: {upgraded:?} after {installed}"
    );
    let steps = timeline
        .assert_no_stale_or_torn_ready(installed, "UpgradeSucceeded")
        .await;
    eprintln!("wiki's Ready, reason and newest revision from the ConfigMap change on: {steps:?}");
    let cm = ctx.api::<ConfigMap>().get("wiki-settings").await?;
    assert!(
        !cm.metadata
            .labels
            .unwrap_or_default()
            .contains_key("reconcile.fluxcd.io/watch"),
        "the user's ConfigMap was not labelled for Flux"
    );
    let hr = helm_release(&ctx, "wiki").await?;
    assert!(
        hr.pointer("/metadata/annotations/reconcile.fluxcd.io~1requestedAt")
            .is_some(),
        "the change reached Flux as a reconcile request: {:?}",
        hr.pointer("/metadata/annotations")
    );
    Ok(())
}

/// The newest Helm revision an ApplicationInstance's status shows.
fn newest_revision(app: &ApplicationInstance) -> Option<i64> {
    app.status.as_ref()?.history.iter().map(|r| r.revision).max()
}

// ---------------------------------------------------------------------------------------------
// Install remediation

/// A chart that fails on install, with `install.remediation.retries: 1`: Flux installs, fails
/// (`InstallFailed`), remediates by uninstalling, installs again, fails again and stops
/// (`Stalled`, `RetriesExceeded`). Every relayed condition is the HelmRelease's, verbatim.
#[tokio::test]
async fn install_failure_is_relayed_verbatim_and_remediated_by_uninstall() -> anyhow::Result<()> {
    let ctx = TestContext::new("flux-install").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let mut crm = app("crm", "broken-app", "2.0.0", json!({}));
    crm.spec.install = Some(ReleaseActionSpec {
        remediation: Some(Remediation {
            retries: Some(1),
            ..Default::default()
        }),
    });
    apply_app(&ctx, &crm).await?;

    let failed = wait_app(&ctx, "crm", "install failed, retries exhausted", RELEASE_TIMEOUT, |a| {
        condition(a, "Ready").is_some_and(|(s, _, _)| s == "False")
            && condition(a, "Released").is_some_and(|(s, r, _)| s == "False" && r == "InstallFailed")
            && condition(a, "Stalled").is_some_and(|(s, r, _)| s == "True" && r == "RetriesExceeded")
            && condition(a, "Reconciling").is_none()
    })
    .await?;
    let released = condition(&failed, "Released").unwrap_or_default();
    assert!(
        released.2.contains("tls.key"),
        "Flux's message, with the API server's refusal: {}",
        released.2
    );
    assert_eq!(
        failed.status.as_ref().and_then(|s| s.deployed_chart_version.as_deref()),
        None,
        "nothing was ever deployed"
    );
    wait_relayed_verbatim(&ctx, "crm").await?;

    // Two attempts, and the uninstall between them.
    let hr = helm_release(&ctx, "crm").await?;
    assert_eq!(hr.pointer("/status/installFailures"), Some(&json!(2)), "{hr:#}");
    wait_event(&ctx, "crm", "InstallFailed", 2).await?;
    let uninstalled = wait_event(&ctx, "crm", "UninstallSucceeded", 1).await?;
    assert!(uninstalled.contains("crm"), "{uninstalled}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Drift detection

/// A hand-made change to a released Deployment (its replicas) is detected. With
/// `driftDetection.mode: enabled` Flux reports it and puts the Deployment back; with `warn` it
/// only reports it: `Drifted=True`, reason `DriftDetected`, relayed, and the change stays.
#[tokio::test]
async fn drift_is_corrected_when_enabled_and_only_reported_with_warn() -> anyhow::Result<()> {
    let ctx = TestContext::new("flux-drift").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    for (name, mode) in [
        ("fixed", DriftDetectionMode::Enabled),
        ("warned", DriftDetectionMode::Warn),
    ] {
        let mut drifting = app(name, "demo-app", "0.1.0", json!({}));
        drifting.spec.interval = Some("5s".into());
        drifting.spec.drift_detection = Some(DriftDetection { mode });
        apply_app(&ctx, &drifting).await?;
    }
    for name in ["fixed", "warned"] {
        wait_ready(&ctx, name, "True", "InstallSucceeded").await?;
        // The first reconcile after the install compares the cluster with the release.
        wait_app(&ctx, name, "Drifted=False NoDriftDetected", RELEASE_TIMEOUT, |a| {
            condition(a, "Drifted").is_some_and(|(s, r, _)| s == "False" && r == "NoDriftDetected")
        })
        .await?;
    }

    let by_hand = PatchParams {
        field_manager: Some("e2e-by-hand".into()),
        ..Default::default()
    };
    for name in ["fixed", "warned"] {
        ctx.api::<Deployment>()
            .patch(name, &by_hand, &Patch::Merge(json!({"spec": {"replicas": 3}})))
            .await?;
    }

    // warn: reported, relayed verbatim, left as it is; the application stays Ready.
    let warned = wait_app(&ctx, "warned", "Drifted=True DriftDetected", RELEASE_TIMEOUT, |a| {
        condition(a, "Drifted").is_some_and(|(s, r, _)| s == "True" && r == "DriftDetected")
    })
    .await?;
    let drifted = condition(&warned, "Drifted").unwrap_or_default();
    assert!(
        drifted.2.contains("Deployment") && drifted.2.contains("warned"),
        "Flux names what drifted: {}",
        drifted.2
    );
    assert_eq!(condition(&warned, "Ready").map(|c| c.0), Some("True".into()));
    wait_relayed_verbatim(&ctx, "warned").await?;
    // Several 5 s reconciles later the change is still there, and still reported.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(deployment_replicas(&ctx, "warned").await?, Some(3));
    let still = ctx.api::<ApplicationInstance>().get("warned").await?;
    assert_eq!(
        condition(&still, "Drifted").map(|c| (c.0, c.1)),
        Some(("True".into(), "DriftDetected".into()))
    );

    // enabled: reported (Flux's Warning event, as the condition it sets for the moment of the
    // correction), corrected, and then no drift again.
    let detected = wait_event(&ctx, "fixed", "DriftDetected", 1).await?;
    assert!(detected.contains("Deployment"), "{detected}");
    wait_event(&ctx, "fixed", "DriftCorrected", 1).await?;
    eventually(&ctx, "fixed: replicas back to 1", RELEASE_TIMEOUT, || async {
        Ok(match deployment_replicas(&ctx, "fixed").await? {
            Some(1) => Ok(()),
            other => Err(format!("replicas {other:?}")),
        })
    })
    .await?;
    let fixed = wait_app(&ctx, "fixed", "Drifted=False again, Ready", RELEASE_TIMEOUT, |a| {
        condition(a, "Drifted").is_some_and(|(s, r, _)| s == "False" && r == "NoDriftDetected")
            && condition(a, "Ready").is_some_and(|(s, _, _)| s == "True")
    })
    .await?;
    assert_eq!(
        fixed
            .status
            .as_ref()
            .and_then(|s| s.history.first())
            .map(|h| h.revision),
        Some(1),
        "corrected in place, not by a new Helm revision"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Helm tests

/// test-app on the real node (its test hook is a bare Pod, which kwok never completes), its
/// test exiting with `exit_code`.
fn test_app(name: &str, exit_code: i32, test: ReleaseTest) -> anyhow::Result<ApplicationInstance> {
    let mut values = placement();
    values["tests"] = json!({"exitCode": exit_code, "image": image("registry.invalid/vworkspace/busybox")?});
    let mut tested = app(name, "test-app", "1.0.0", values);
    tested.spec.test = Some(test);
    Ok(tested)
}

/// `spec.test` runs the chart's test hooks after the install: a passing test gives
/// `TestSuccess=True` (`TestSucceeded`); a failing one `TestSuccess=False` (`TestFailed`), which
/// fails the application unless `ignoreFailures`. All relayed verbatim.
#[tokio::test]
async fn helm_tests_run_and_a_failure_fails_the_release_unless_ignored() -> anyhow::Result<()> {
    require_real_node()?;
    let ctx = TestContext::new("flux-tests").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let timed = ReleaseTest {
        timeout: Some("2m".into()),
        ..Default::default()
    };
    let ignoring = ReleaseTest {
        ignore_failures: true,
        ..Default::default()
    };
    apply_app(&ctx, &test_app("passing", 0, timed)?).await?;
    apply_app(&ctx, &test_app("strict", 1, ReleaseTest::default())?).await?;
    apply_app(&ctx, &test_app("lenient", 1, ignoring)?).await?;

    // Passing: the hook ran on the real node, and its result is the condition.
    let passing = wait_app(&ctx, "passing", "TestSuccess=True, Ready", RELEASE_TIMEOUT, |a| {
        condition(a, "TestSuccess").is_some_and(|(s, r, _)| s == "True" && r == "TestSucceeded")
            && condition(a, "Ready").is_some_and(|(s, _, _)| s == "True")
    })
    .await?;
    let message = condition(&passing, "TestSuccess").unwrap_or_default().2;
    assert!(message.contains("1 test hook completed successfully"), "{message}");
    let pod = wait_pod_phase(&ctx, "passing-test", "Succeeded", RELEASE_TIMEOUT).await?;
    assert_eq!(pod.spec.and_then(|s| s.node_name).as_deref(), Some(REAL_NODE));
    assert_eq!(pod_log(&ctx, "passing-test").await?.trim(), "testing release passing");
    let hr = helm_release(&ctx, "passing").await?;
    assert_eq!(
        hr.pointer("/spec/test"),
        Some(&json!({"enable": true, "ignoreFailures": false, "timeout": "2m"}))
    );
    wait_relayed_verbatim(&ctx, "passing").await?;

    // Failing, not ignored: the application is not Ready.
    let strict = wait_app(&ctx, "strict", "TestSuccess=False, Ready=False", RELEASE_TIMEOUT, |a| {
        condition(a, "TestSuccess").is_some_and(|(s, r, _)| s == "False" && r == "TestFailed")
            && condition(a, "Ready").is_some_and(|(s, _, _)| s == "False")
            && condition(a, "Reconciling").is_none()
    })
    .await?;
    let ready = condition(&strict, "Ready").unwrap_or_default();
    assert_eq!(ready.1, "TestFailed", "{ready:?}");
    // The failed test counts as the install's failure; with no retries left Flux stops there
    // (the release stays installed: install remediation retries default to 0).
    assert_eq!(
        condition(&strict, "Stalled").map(|c| (c.0, c.1)),
        Some(("True".into(), "RetriesExceeded".into()))
    );
    let failed_pod = ctx.api::<Pod>().get("strict-test").await?;
    assert_eq!(failed_pod.status.and_then(|s| s.phase).as_deref(), Some("Failed"));
    wait_relayed_verbatim(&ctx, "strict").await?;

    // Failing, ignored: reported, and the application stays Ready.
    let lenient = wait_app(&ctx, "lenient", "TestSuccess=False, Ready=True", RELEASE_TIMEOUT, |a| {
        condition(a, "TestSuccess").is_some_and(|(s, r, _)| s == "False" && r == "TestFailed")
            && condition(a, "Ready").is_some_and(|(s, _, _)| s == "True")
    })
    .await?;
    assert_eq!(
        condition(&lenient, "Released").map(|c| (c.0, c.1)),
        Some(("True".into(), "InstallSucceeded".into()))
    );
    wait_relayed_verbatim(&ctx, "lenient").await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Chart-hook migrations

/// hook-app on the real node, so its pre-upgrade Job really runs (kwok would complete it
/// whatever its command), the Job exiting with `migrate_exit_code`.
fn hook_app(name: &str, version: &str, migrate_exit_code: i32) -> ApplicationInstance {
    let mut values = placement();
    values["migrate"] = json!({"exitCode": migrate_exit_code});
    app(name, "hook-app", version, values)
}

/// An upgrade 1.0.0 → 1.1.0 runs hook-app's pre-upgrade migration Job before anything else; a
/// failing migration fails the upgrade (`UpgradeFailed`, Flux's message naming the hook) and
/// leaves the release's objects as they were.
#[tokio::test]
async fn an_upgrade_runs_its_pre_upgrade_migration_and_a_failing_one_fails_it() -> anyhow::Result<()> {
    require_real_node()?;
    let ctx = TestContext::new("flux-hooks").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    for name in ["ledger", "books"] {
        apply_app(&ctx, &hook_app(name, "1.0.0", 0)).await?;
    }
    for name in ["ledger", "books"] {
        wait_deployed(&ctx, name, "InstallSucceeded", "1.0.0").await?;
        assert!(
            ctx.api::<Job>().get_opt(&format!("{name}-migrate")).await?.is_none(),
            "{name}: no migration on install"
        );
    }
    apply_app(&ctx, &hook_app("ledger", "1.1.0", 0)).await?;
    apply_app(&ctx, &hook_app("books", "1.1.0", 1)).await?;

    // Succeeds: the Job ran (its log), then the chart's objects moved to 1.1.0.
    wait_deployed(&ctx, "ledger", "UpgradeSucceeded", "1.1.0").await?;
    let job = ctx.api::<Job>().get("ledger-migrate").await?;
    assert_eq!(job.status.and_then(|s| s.succeeded), Some(1));
    let pods = ctx
        .api::<Pod>()
        .list(&ListParams::default().labels("job-name=ledger-migrate"))
        .await?;
    let pod = pods
        .items
        .first()
        .and_then(|p| p.metadata.name.clone())
        .unwrap_or_default();
    assert_eq!(
        pod_log(&ctx, &pod).await?.trim(),
        "migrating release ledger to schema 1.1.0"
    );
    assert_eq!(
        config_value(&ctx, "ledger-config", "migratedTo").await?.as_deref(),
        Some("1.1.0")
    );

    // Fails: Flux's reason and message, verbatim; nothing of 1.1.0 was applied.
    let failed = wait_app(&ctx, "books", "upgrade failed", RELEASE_TIMEOUT, |a| {
        condition(a, "Released").is_some_and(|(s, r, _)| s == "False" && r == "UpgradeFailed")
            && condition(a, "Ready").is_some_and(|(s, _, _)| s == "False")
            && condition(a, "Reconciling").is_none()
    })
    .await?;
    let released = condition(&failed, "Released").unwrap_or_default();
    assert!(
        released.2.contains("pre-upgrade") && released.2.contains("books-migrate"),
        "Flux's message names the hook: {}",
        released.2
    );
    wait_relayed_verbatim(&ctx, "books").await?;
    let job = ctx.api::<Job>().get("books-migrate").await?;
    assert_eq!(job.status.and_then(|s| s.failed), Some(1));
    assert_eq!(
        config_value(&ctx, "books-config", "migratedTo").await?.as_deref(),
        Some("1.0.0")
    );
    assert_ne!(
        failed.status.as_ref().and_then(|s| s.deployed_chart_version.as_deref()),
        Some("1.1.0")
    );
    Ok(())
}
