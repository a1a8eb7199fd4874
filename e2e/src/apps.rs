//! Helpers for ApplicationInstance tests: a controller per test (watching only the
//! test namespace) and waits on ApplicationInstance conditions.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;

use api::{ApplicationInstance, ApplicationInstanceSpec, ChartRepository, ChartSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};

use crate::{CHART_REPO, FIELD_MANAGER, TestContext, process::ControllerProcess, wait_object};

/// How long an install or upgrade may take on the local cluster.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(120);

/// Starts an app-controller confined to the test namespace (namespaced mode), with debug
/// logging so tests can prove what never appears in logs. `extra` may give its own
/// `--allowed-namespaces`, which then replaces the test namespace alone, and its own
/// `--insecure-repository-hosts`, which then replaces `127.0.0.1`.
pub async fn start_controller(ctx: &TestContext, extra: &[&str]) -> anyhow::Result<ControllerProcess> {
    let mut args = vec!["--watch-namespace", ctx.namespace.as_str()];
    if !extra.contains(&"--allowed-namespaces") {
        args.extend(["--allowed-namespaces", ctx.namespace.as_str()]);
    }
    // The test charts are served over plain http on 127.0.0.1 (CHART_REPO), refused unless
    // named; a test may give its own repository flags instead.
    if !extra.contains(&"--insecure-repository-hosts") {
        args.extend(["--insecure-repository-hosts", "127.0.0.1"]);
    }
    // Port 0: the kernel picks a free one; the tests never call this admin server.
    args.extend(["--admin-addr", "127.0.0.1:0"]);
    args.extend_from_slice(extra);
    let log_name = format!("app-controller-{}", ctx.namespace);
    ControllerProcess::start(
        ctx.process_scope(),
        "app-controller",
        &log_name,
        &args,
        &[("RUST_LOG", "debug,hyper=info,tower=info,h2=info,rustls=info")],
    )
    .await
}

/// An ApplicationInstance of `chart@version` from the local chart repository.
pub fn app(name: &str, chart: &str, version: &str, values: serde_json::Value) -> ApplicationInstance {
    let mut app = ApplicationInstance::new(
        name,
        ApplicationInstanceSpec {
            chart: ChartSpec {
                name: chart.into(),
                version: Some(version.into()),
                repository: Some(ChartRepository {
                    url: CHART_REPO.into(),
                    interval: Some("1m".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            values: Some(values),
            timeout: Some("1m".into()),
            ..Default::default()
        },
    );
    app.metadata.namespace = None;
    app
}

/// Server-side applies an ApplicationInstance spec as the test (as Odoo's agent would).
pub async fn apply_app(ctx: &TestContext, app: &ApplicationInstance) -> anyhow::Result<ApplicationInstance> {
    let name = app.metadata.name.clone().unwrap_or_default();
    let body = serde_json::json!({
        "apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance",
        "metadata": {"name": name}, "spec": app.spec,
    });
    Ok(ctx
        .api::<ApplicationInstance>()
        .patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
        .await?)
}

/// The (status, reason, message) of an ApplicationInstance condition.
pub fn condition(app: &ApplicationInstance, type_: &str) -> Option<(String, String, String)> {
    let c = app.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// One-line view of an ApplicationInstance's status for "last observed" messages.
pub fn summary(app: &ApplicationInstance) -> String {
    let status = app.status.clone().unwrap_or_default();
    let conds: Vec<String> = status
        .conditions
        .iter()
        .map(|c| format!("{}={}({}: {})", c.type_, c.status, c.reason, c.message))
        .collect();
    format!(
        "generation {:?}, observedGeneration {:?}, deployed {:?}, conditions [{}]",
        app.metadata.generation,
        status.observed_generation,
        status.deployed_chart_version,
        conds.join(", ")
    )
}

/// Waits until `check` accepts the ApplicationInstance (status computed for its current generation).
pub async fn wait_app(
    ctx: &TestContext,
    name: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&ApplicationInstance) -> bool,
) -> anyhow::Result<ApplicationInstance> {
    let current =
        |app: &ApplicationInstance| app.status.as_ref().and_then(|s| s.observed_generation) == app.metadata.generation;
    wait_object(ctx, name, what, timeout, |app| current(app) && check(app), summary).await
}

/// Waits for `Ready` with the given status and reason.
pub async fn wait_ready(
    ctx: &TestContext,
    name: &str,
    status: &str,
    reason: &str,
) -> anyhow::Result<ApplicationInstance> {
    wait_app(
        ctx,
        name,
        &format!("Ready={status} reason {reason}"),
        RELEASE_TIMEOUT,
        |app| condition(app, "Ready").is_some_and(|(s, r, _)| s == status && r == reason),
    )
    .await
}

/// Waits for `Ready=True` with `reason` *and* the release history mirrored with
/// `chart_version` deployed (its `deployed_at` too).
pub async fn wait_deployed(
    ctx: &TestContext,
    name: &str,
    reason: &str,
    chart_version: &str,
) -> anyhow::Result<ApplicationInstance> {
    wait_app(
        ctx,
        name,
        &format!("Ready=True {reason}, {chart_version} deployed"),
        RELEASE_TIMEOUT,
        |app| {
            let status = app.status.as_ref();
            condition(app, "Ready").is_some_and(|(s, r, _)| s == "True" && r == reason)
                && status.and_then(|s| s.deployed_chart_version.as_deref()) == Some(chart_version)
                && status
                    .and_then(|s| s.history.first())
                    .is_some_and(|h| h.deployed_at.is_some())
        },
    )
    .await
}

/// `data[key]` of ConfigMap `config_map` in the test namespace (the test charts render their
/// values and chart version into one).
pub async fn config_value(ctx: &TestContext, config_map: &str, key: &str) -> anyhow::Result<Option<String>> {
    Ok(ctx
        .api::<ConfigMap>()
        .get_opt(config_map)
        .await?
        .and_then(|cm| cm.data.and_then(|d| d.get(key).cloned())))
}

/// Waits until ConfigMap `config_map` holds `key: want`.
pub async fn wait_config(ctx: &TestContext, config_map: &str, key: &str, want: &str) -> anyhow::Result<()> {
    crate::eventually(
        ctx,
        &format!("ConfigMap {config_map} {key}={want}"),
        RELEASE_TIMEOUT,
        || async {
            Ok(match config_value(ctx, config_map, key).await? {
                Some(v) if v == want => Ok(()),
                other => Err(format!("{key}={other:?}")),
            })
        },
    )
    .await
}

/// What a status watch recorded: the items `pick` took, in order, and every error of the
/// watch (each a possible gap in what was seen).
struct Recorded<T> {
    items: Vec<T>,
    errors: Vec<String>,
}

/// A watch of the test namespace's ApplicationInstances selected by `config`, recording what
/// `pick` takes from each version seen, in order, until stopped.
struct StatusRecorder<T> {
    recorded: Arc<Mutex<Recorded<T>>>,
    task: tokio::task::JoinHandle<()>,
}

/// How long a status watch may take to deliver its first list.
const FIRST_LIST_TIMEOUT: Duration = Duration::from_secs(30);

impl<T: Clone + Send + 'static> StatusRecorder<T> {
    /// Starts the watch and returns once its first list is in (so nothing written after this
    /// returns can be missed), or fails when that list does not come.
    async fn start(
        ctx: &TestContext,
        config: watcher::Config,
        pick: impl Fn(&ApplicationInstance) -> Option<T> + Send + 'static,
    ) -> anyhow::Result<Self> {
        let recorded = Arc::new(Mutex::new(Recorded {
            items: Vec::new(),
            errors: Vec::new(),
        }));
        let events = watcher(ctx.api::<ApplicationInstance>(), config).default_backoff();
        let sink = Arc::clone(&recorded);
        let (listed, first_list) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut listed = Some(listed);
            let mut events = events.boxed();
            while let Some(event) = events.next().await {
                let app = match event {
                    Ok(watcher::Event::Apply(app) | watcher::Event::InitApply(app)) => app,
                    Ok(watcher::Event::InitDone) => {
                        if let Some(listed) = listed.take() {
                            let _ = listed.send(());
                        }
                        continue;
                    }
                    Ok(watcher::Event::Init | watcher::Event::Delete(_)) => continue,
                    Err(e) => {
                        sink.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .errors
                            .push(e.to_string());
                        continue;
                    }
                };
                if let Some(item) = pick(&app) {
                    sink.lock().unwrap_or_else(PoisonError::into_inner).items.push(item);
                }
            }
        });
        match tokio::time::timeout(FIRST_LIST_TIMEOUT, first_list).await {
            Ok(Ok(())) => Ok(Self { recorded, task }),
            _ => {
                task.abort();
                let errors = recorded.lock().unwrap_or_else(PoisonError::into_inner).errors.clone();
                anyhow::bail!("the status watch delivered no first list in {FIRST_LIST_TIMEOUT:?}; errors: {errors:?}")
            }
        }
    }

    /// How many items are in so far.
    fn count(&self) -> usize {
        self.recorded.lock().unwrap_or_else(PoisonError::into_inner).items.len()
    }

    /// Stops the watch; fails if it had an error (it may have missed a version), else
    /// returns what it saw.
    fn stop(self) -> Vec<T> {
        self.task.abort();
        let recorded = self.recorded.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(
            recorded.errors.is_empty(),
            "the status watch failed, so it may have missed a version: {:?}",
            recorded.errors
        );
        recorded.items.clone()
    }
}

/// One `Ready=True`: (name, pinned chart version, deployed chart version).
type ReadyClaim = (String, Option<String>, Option<String>);

/// Every `Ready=True` an ApplicationInstance of the test namespace claimed for its current
/// generation while it was watched, as (name, pinned chart version, deployed chart version).
/// helm-controller writes a success in two requests (conditions, then the history): a
/// controller that relays the first alone claims a release it does not yet show.
pub struct ReadyClaims {
    recorder: StatusRecorder<ReadyClaim>,
}

impl ReadyClaims {
    /// Starts watching (before the applications are applied, to see every write); returns
    /// once the watch has its first list.
    pub async fn watch(ctx: &TestContext) -> anyhow::Result<Self> {
        let recorder = StatusRecorder::start(ctx, watcher::Config::default(), |app| {
            let status = app.status.as_ref()?;
            let current = status.observed_generation == app.metadata.generation;
            (current && condition(app, "Ready").is_some_and(|(s, _, _)| s == "True")).then(|| {
                (
                    app.metadata.name.clone().unwrap_or_default(),
                    app.spec.chart.version.clone(),
                    status.deployed_chart_version.clone(),
                )
            })
        })
        .await?;
        Ok(Self { recorder })
    }

    /// Waits (a few seconds at most) until `at_least` claims have come through the watch,
    /// which trails the reads that told the test the app was ready; then stops watching and
    /// fails if fewer came, if the watch failed, or if any claim named no deployed version,
    /// or another than the pinned one. Returns how many claims were seen.
    pub async fn assert_each_names_its_release(self, at_least: usize) -> usize {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.recorder.count() < at_least && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let seen = self.recorder.stop();
        assert!(
            seen.len() >= at_least,
            "{} Ready=True claims seen, {at_least} expected: {seen:?}",
            seen.len()
        );
        let wrong: Vec<_> = seen
            .iter()
            .filter(|(_, pinned, deployed)| deployed.is_none() || deployed != pinned)
            .collect();
        assert!(
            wrong.is_empty(),
            "Ready=True without the release it names (name, pinned, deployed): {wrong:?}"
        );
        seen.len()
    }
}

/// One status of an ApplicationInstance as a watch saw it: its `Ready` status and reason, and
/// the newest Helm revision in its history.
type ReadyStep = (Option<String>, Option<String>, Option<i64>);

/// Every status one ApplicationInstance was seen with, in order, from the moment this starts
/// (the first entry is the status it had then). For a values change the app controller asks
/// Flux for with a reconcile token (a `valuesFrom` ConfigMap changed; no new generation), every
/// step after the first with a `Ready=True` that names no newer release than the one before is
/// wrong: the app was at rest when the watch began (no status writes at rest), so any later
/// status was written after the change, and a `Ready=True` of the old release then is the stale
/// Ready from before the request (relayed while Flux had not yet handled it) or a torn write
/// (`UpgradeSucceeded` beside the previous history). An identical repeat counts too: a watch
/// delivers a step only for a write, and the write was made after the change.
pub struct ReadyTimeline {
    recorder: StatusRecorder<ReadyStep>,
}

impl ReadyTimeline {
    /// Starts watching `name`; returns once the watch has its first list, whose version of
    /// the app is the first step.
    pub async fn watch(ctx: &TestContext, name: &str) -> anyhow::Result<Self> {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let recorder = StatusRecorder::start(ctx, config, |app| {
            let ready = condition(app, "Ready");
            let newest = app
                .status
                .as_ref()
                .and_then(|s| s.history.iter().map(|r| r.revision).max());
            Some((ready.clone().map(|c| c.0), ready.map(|c| c.1), newest))
        })
        .await?;
        Ok(Self { recorder })
    }

    /// Stops watching and returns the steps seen; fails if the watch failed or saw nothing
    /// (the app existed when the watch started, so its first list holds it).
    pub fn stop(self) -> Vec<ReadyStep> {
        let seen = self.recorder.stop();
        assert!(!seen.is_empty(), "the timeline saw no status at all");
        seen
    }

    /// Waits (a few seconds at most: the watch trails the read that told the test) until the
    /// timeline shows `Ready=True` with `outcome` for a release newer than `before`, then stops
    /// watching; fails if that step never came (the watch missed the change it was to see),
    /// on a stale or torn `Ready=True` (see the type) for a release no newer than `before`, or
    /// as [`Self::stop`]. Returns the steps seen.
    pub async fn assert_no_stale_or_torn_ready(self, before: i64, outcome: &str) -> Vec<ReadyStep> {
        let arrived = |steps: &Recorded<ReadyStep>| {
            steps.items.iter().any(|(ready, reason, newest)| {
                ready.as_deref() == Some("True")
                    && reason.as_deref() == Some(outcome)
                    && newest.is_some_and(|r| r > before)
            })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !arrived(&self.recorder.recorded.lock().unwrap_or_else(PoisonError::into_inner))
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let seen = self.stop();
        assert!(
            seen.iter()
                .any(|(ready, reason, newest)| ready.as_deref() == Some("True")
                    && reason.as_deref() == Some(outcome)
                    && newest.is_some_and(|r| r > before)),
            "the timeline never showed Ready=True {outcome} for a release after {before}: {seen:?}"
        );
        let wrong: Vec<ReadyStep> = seen
            .iter()
            .skip(1)
            .filter(|(ready, _, newest)| ready.as_deref() == Some("True") && newest.is_none_or(|r| r <= before))
            .cloned()
            .collect();
        assert!(
            wrong.is_empty(),
            "Ready=True for revision {before} or older after the change: {wrong:?} in {seen:?}"
        );
        seen
    }
}

/// The shipped finalizer-at-admission policy (deploy/components/admission-finalizer), bound
/// by `binding` to the namespaces `namespace_selector` matches instead of the component's
/// cluster-wide binding: tests and benchmarks share the cluster with applications that no
/// app controller serves, which would keep a finalizer nobody removes.
pub struct FinalizerAtAdmission {
    binding: String,
}

impl FinalizerAtAdmission {
    const POLICY_FILE: &str = "deploy/components/admission-finalizer/finalizer-policy.yaml";

    /// Applies the policy and the binding as `field_manager`, then waits until the API server
    /// applies them: policies load asynchronously, so dry-run creates of `probe` through
    /// `apps` (a namespace the binding matches) until one comes back with the finalizer.
    pub async fn bind(
        binding: &str,
        field_manager: &str,
        namespace_selector: serde_json::Value,
        apps: &kube::Api<ApplicationInstance>,
        probe: &ApplicationInstance,
    ) -> anyhow::Result<Self> {
        let file = crate::repo_root().join(Self::POLICY_FILE);
        let text = std::fs::read_to_string(&file).with_context(|| file.display().to_string())?;
        // The policy document alone (the file's second document is the cluster-wide binding).
        let policy = text
            .split("\n---\n")
            .next()
            .with_context(|| format!("no policy in {}", file.display()))?;
        let manager = format!("--field-manager={field_manager}");
        let apply = [
            "apply",
            "--server-side",
            "--force-conflicts",
            manager.as_str(),
            "-f",
            "-",
        ];
        crate::deploy::kubectl(&apply, Some(policy)).await?;
        let binding_object = serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": binding},
            "spec": {"policyName": "vworkspace-app-controller-finalizer",
                "matchResources": {"namespaceSelector": namespace_selector}},
        });
        crate::deploy::kubectl(&apply, Some(&binding_object.to_string())).await?;
        let dry_run = kube::api::PostParams {
            dry_run: true,
            ..Default::default()
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let created = apps.create(&dry_run, probe).await?;
            if !created.metadata.finalizers.unwrap_or_default().is_empty() {
                return Ok(Self {
                    binding: binding.to_owned(),
                });
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the admission policy set no finalizer within 30 s (binding {binding})"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Removes the binding named `binding`, if any (the policy stays: it acts only where bound).
    pub async fn unbind(binding: &str) -> anyhow::Result<()> {
        crate::deploy::kubectl(
            &[
                "delete",
                "mutatingadmissionpolicybinding",
                binding,
                "--ignore-not-found",
            ],
            None,
        )
        .await?;
        Ok(())
    }

    /// Removes this binding.
    pub async fn remove(self) -> anyhow::Result<()> {
        Self::unbind(&self.binding).await
    }
}
