//! `bench-app`: app-controller figures on the real local cluster (printed, never asserted).
//!
//! ```text
//! bench-app --apps 100                   # full: real Helm installs, plus the same objects applied directly
//! bench-app --apps 1000 --suspended      # materialisation only: HelmReleases created suspended
//! bench-app --apps 50 --engine argocd    # the same figures through Argo CD (`hack/cluster.sh start-argocd`)
//! ```
//!
//! Reports (a) time until every engine object (HelmRelease, or Argo CD Application) exists
//! and every ApplicationInstance mirrors it, (b) time to all Ready through the operator vs
//! the very objects the engine writes (HelmRelease + HelmRepository, or Application +
//! AppProject) applied directly (operator overhead), (c) p50/p99 latency from engine-object
//! Ready to ApplicationInstance Ready (client-side watch timestamps), (d) controller RSS
//! idle and at N, (e) writes at rest after convergence. Runs inside the cluster netns
//! (`just bench-app`), starting its own app-controller (release build) with its admin
//! server on a free port (so it runs beside `just demo`), and stops with the controller's
//! log if it exits.
//!
//! With `--engine argocd` the controller runs with `--engines flux,argocd --default-engine
//! argocd` and the ApplicationInstances name no engine; an Application counts as Ready
//! when Argo CD reports it `Synced` and `Healthy` (Argo CD has no Ready condition).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use api::ApplicationInstance;
use clap::{Parser, ValueEnum};
use e2e::{
    apps::app,
    assert_loopback_only,
    bench::{check_processes, pause, percentile, recreate_namespace, rss_kib, wait_until},
    client,
    deploy::http_get,
    dynamic_api,
    process::ControllerProcess,
};
use futures::{StreamExt, TryStreamExt, stream};
use helmengine::{
    MaterializeInput,
    argocd::{self, build::Placement},
    flux::build,
    watch::LABEL_INSTANCE_NAMESPACE,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};

/// The scope of the processes this benchmark starts.
const SCOPE: &str = "bench-app";
const CREATE_CONCURRENCY: usize = 16;
/// Longest wait for Argo CD to delete the baseline's Applications (and their releases).
const ARGOCD_CLEANUP: Duration = Duration::from_secs(300);

/// The engine the ApplicationInstances run on.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EngineChoice {
    /// Flux helm-controller (HelmRelease + HelmRepository).
    Flux,
    /// Argo CD (Application + AppProject in namespace `argocd`); start it first with
    /// `hack/cluster.sh start-argocd` (`just bench-app --engine argocd` does).
    Argocd,
}

impl EngineChoice {
    /// The engine object an ApplicationInstance mirrors.
    fn object(self) -> &'static str {
        match self {
            Self::Flux => "HelmRelease",
            Self::Argocd => "Application",
        }
    }

    fn product(self) -> &'static str {
        match self {
            Self::Flux => "Flux",
            Self::Argocd => "Argo CD",
        }
    }

    /// The resources whose writes (e) counts at the API server: `(group, resource)`.
    fn counted_resources(self) -> [(&'static str, &'static str); 3] {
        match self {
            Self::Flux => [
                ("vworkspace.io", "applicationinstances"),
                ("helm.toolkit.fluxcd.io", "helmreleases"),
                ("source.toolkit.fluxcd.io", "helmrepositories"),
            ],
            Self::Argocd => [
                ("vworkspace.io", "applicationinstances"),
                (argocd::GROUP, argocd::APPLICATION.plural),
                (argocd::GROUP, argocd::APP_PROJECT.plural),
            ],
        }
    }
}

/// App-controller figures on the real local cluster (printed, never asserted).
#[derive(Parser)]
#[command(name = "bench-app")]
struct Args {
    /// ApplicationInstances created.
    #[arg(long, default_value_t = 100)]
    apps: usize,
    /// Create them suspended: materialisation only, no Helm install.
    #[arg(long)]
    suspended: bool,
    /// Skip the engine-alone baseline (the same objects applied directly).
    #[arg(long)]
    skip_baseline: bool,
    /// The engine the controller applies by default (the ApplicationInstances name none).
    #[arg(long, value_enum, default_value_t = EngineChoice::Flux)]
    engine: EngineChoice,
    /// Longest wait for each phase, seconds.
    #[arg(long, default_value_t = 1800)]
    timeout_secs: u64,
}

impl Args {
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }
}

/// First client-side time each app's object was seen ready, by ApplicationInstance name.
type ReadyTimes = Arc<Mutex<HashMap<String, Instant>>>;

/// Ready=True for the current generation (ApplicationInstance, HelmRelease).
fn ready_condition_now(obj: &serde_json::Value) -> bool {
    let generation = obj.pointer("/metadata/generation").and_then(|g| g.as_i64());
    let ready = obj
        .pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .cloned();
    matches!(ready, Some(c) if c["status"] == "True" && c["observedGeneration"].as_i64() == generation)
}

/// An Argo CD Application's own readiness: synced and healthy.
fn synced_and_healthy(obj: &serde_json::Value) -> bool {
    obj.pointer("/status/sync/status").and_then(|s| s.as_str()) == Some("Synced")
        && obj.pointer("/status/health/status").and_then(|s| s.as_str()) == Some("Healthy")
}

/// Records when each object (keyed by the ApplicationInstance it stands for: its
/// `app.kubernetes.io/instance` label, else its name) is first seen `ready`.
fn spawn_ready_watch(
    api: Api<DynamicObject>,
    config: watcher::Config,
    ready: fn(&serde_json::Value) -> bool,
) -> ReadyTimes {
    let times: ReadyTimes = Arc::default();
    let sink = times.clone();
    tokio::spawn(async move {
        let mut events = watcher(api, config).default_backoff().applied_objects().boxed();
        while let Some(Ok(obj)) = events.next().await {
            let key = obj
                .labels()
                .get(api::LABEL_INSTANCE)
                .cloned()
                .unwrap_or_else(|| obj.name_any());
            if serde_json::to_value(&obj).is_ok_and(|json| ready(&json)) {
                sink.lock().expect("lock").entry(key).or_insert_with(Instant::now);
            }
        }
    });
    times
}

async fn controller_writes(admin: &str) -> anyhow::Result<f64> {
    let body = http_get(admin, "/metrics").await?;
    Ok(body
        .lines()
        .filter(|l| l.starts_with("vworkspace_api_writes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Writes the API server counted on `resources` (`(group, resource)`, the object itself,
/// not a subresource; except the ApplicationInstances' status), by resource.
async fn apiserver_writes(client: &Client, resources: &[(&str, &str)]) -> anyhow::Result<BTreeMap<String, f64>> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    let mut counts: BTreeMap<String, f64> = resources.iter().map(|(_, r)| ((*r).to_owned(), 0.0)).collect();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let mutating = ["PATCH", "POST", "PUT", "DELETE", "APPLY"]
            .iter()
            .any(|v| line.contains(&format!("verb=\"{v}\"")));
        let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        let counted = resources.iter().find(|(group, resource)| {
            line.contains(&format!("group=\"{group}\""))
                && line.contains(&format!("resource=\"{resource}\""))
                && (*resource == "applicationinstances" || line.contains("subresource=\"\""))
        });
        if let (true, Some((_, resource))) = (mutating, counted) {
            *counts.entry((*resource).to_owned()).or_default() += value;
        }
    }
    Ok(counts)
}

fn bench_app(i: usize, suspended: bool) -> ApplicationInstance {
    let mut a = app(
        &format!("app-{i:05}"),
        "demo-app",
        "0.1.0",
        serde_json::json!({"replicaCount": 0, "greeting": format!("app {i}")}),
    );
    a.spec.suspend = suspended;
    a
}

/// The bench app `i` as if read from the API in `namespace`, for building engine objects.
fn baseline_app(i: usize, namespace: &str) -> ApplicationInstance {
    let mut a = bench_app(i, false);
    a.metadata.namespace = Some(namespace.to_owned());
    a.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    a
}

fn argocd_api(client: &Client, kind: argocd::ArgoKind) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), argocd::DEFAULT_NAMESPACE, &kind.api_resource())
}

/// The Argo CD objects written for ApplicationInstances of `namespace`.
fn instance_selector(namespace: &str) -> String {
    format!("{LABEL_INSTANCE_NAMESPACE}={namespace}")
}

/// Argo CD running (`hack/cluster.sh start-argocd`, sync impersonation on) and the app
/// controller's Role in Argo CD's namespace from the `argocd-engine` component, as the e2e
/// tests have them.
async fn ensure_argocd_prerequisites() -> anyhow::Result<()> {
    e2e::argocd::require_argocd().await
}

/// Deletes the Applications (first: their finalizer makes Argo CD delete the releases, which
/// needs the project) and then the AppProjects written for `namespace`, waiting at most
/// `bound` for the Applications to go. False when some are still there (nothing else deleted).
async fn delete_argocd_objects(client: &Client, namespace: &str, bound: Duration) -> anyhow::Result<bool> {
    let lp = ListParams::default().labels(&instance_selector(namespace));
    let applications = argocd_api(client, argocd::APPLICATION);
    if !applications.list_metadata(&lp).await?.items.is_empty() {
        applications.delete_collection(&DeleteParams::background(), &lp).await?;
    }
    let start = Instant::now();
    loop {
        let left = applications.list_metadata(&lp).await?.items.len();
        if left == 0 {
            break;
        }
        if start.elapsed() >= bound {
            println!(
                "    warning: {left} Applications for namespace {namespace} still there {}s after their deletion; \
                 left in place (see the argocd-application-controller log)",
                bound.as_secs()
            );
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let projects = argocd_api(client, argocd::APP_PROJECT);
    if !projects.list_metadata(&lp).await?.items.is_empty() {
        projects.delete_collection(&DeleteParams::background(), &lp).await?;
    }
    Ok(true)
}

/// Flux alone: the HelmRepository + HelmRelease per app the operator writes, applied
/// directly in `bench-flux-<n>`. Returns the time until all are Ready.
async fn flux_baseline(client: &Client, n: usize, timeout: Duration) -> anyhow::Result<Duration> {
    let base_ns = format!("bench-flux-{n}");
    recreate_namespace(client, &base_ns).await?;
    // The HelmReleases name the release ServiceAccount (as the operator's do); Flux's lockdown
    // gives a HelmRelease no rights without it.
    e2e::flux::grant_release(client, &base_ns).await?;
    let base_hr = dynamic_api(
        client,
        &base_ns,
        "helm.toolkit.fluxcd.io",
        "v2",
        "HelmRelease",
        "helmreleases",
    );
    let base_repo = dynamic_api(
        client,
        &base_ns,
        "source.toolkit.fluxcd.io",
        "v1",
        "HelmRepository",
        "helmrepositories",
    );
    let base_ready = spawn_ready_watch(base_hr.clone(), watcher::Config::default(), ready_condition_now);
    let start = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let (base_hr, base_repo, base_ns) = (base_hr.clone(), base_repo.clone(), base_ns.clone());
            async move {
                let a = baseline_app(i, &base_ns);
                let strip = |mut o: DynamicObject| {
                    o.metadata.owner_references = None;
                    o
                };
                let pp = PatchParams::apply("bench-baseline").force();
                if let Some(repo) = build::source(&a)? {
                    base_repo.patch(&a.name_any(), &pp, &Patch::Apply(strip(repo))).await?;
                }
                let hr = strip(build::helm_release(&a, &MaterializeInput::default())?);
                base_hr.patch(&a.name_any(), &pp, &Patch::Apply(hr)).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    wait_until("every baseline HelmRelease Ready", timeout, async || {
        Ok(base_ready.lock().expect("lock").len() >= n)
    })
    .await?;
    let total = start.elapsed();
    Api::<Namespace>::all(client.clone())
        .delete(&base_ns, &DeleteParams::background())
        .await?;
    Ok(total)
}

/// Argo CD alone: the AppProject + Application per app the operator writes, applied
/// directly into Argo CD's namespace for apps of `bench-argocd-<n>` (a namespace the
/// operator does not watch), deploying there as its release ServiceAccount. Returns the
/// time until all are Synced and Healthy.
async fn argocd_baseline(client: &Client, n: usize, timeout: Duration) -> anyhow::Result<Duration> {
    let base_ns = format!("bench-argocd-{n}");
    // A previous run's baseline first: its Applications name this namespace.
    anyhow::ensure!(
        delete_argocd_objects(client, &base_ns, ARGOCD_CLEANUP).await?,
        "the previous baseline's Applications for {base_ns} are not gone"
    );
    recreate_namespace(client, &base_ns).await?;
    // Argo CD syncs impersonating the release ServiceAccount of the destination namespace
    // (the AppProject's destinationServiceAccounts), as for the operator's apps.
    e2e::flux::grant_release(client, &base_ns).await?;
    let placement = Placement {
        namespace: argocd::DEFAULT_NAMESPACE.to_owned(),
        destination_server: argocd::IN_CLUSTER_SERVER.to_owned(),
    };
    let applications = argocd_api(client, argocd::APPLICATION);
    let projects = argocd_api(client, argocd::APP_PROJECT);
    let base_ready = spawn_ready_watch(
        applications.clone(),
        watcher::Config::default().labels(&instance_selector(&base_ns)),
        synced_and_healthy,
    );
    let start = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let (applications, projects, placement, base_ns) = (
                applications.clone(),
                projects.clone(),
                placement.clone(),
                base_ns.clone(),
            );
            async move {
                let a = baseline_app(i, &base_ns);
                let pp = PatchParams::apply("bench-baseline").force();
                let project = argocd::build::app_project(&a, &placement)?;
                projects
                    .patch(&project.name_any(), &pp, &Patch::Apply(&project))
                    .await?;
                let application = argocd::build::application(&a, &MaterializeInput::default(), &placement)?;
                applications
                    .patch(&application.name_any(), &pp, &Patch::Apply(&application))
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    wait_until("every baseline Application Synced and Healthy", timeout, async || {
        Ok(base_ready.lock().expect("lock").len() >= n)
    })
    .await?;
    let total = start.elapsed();
    let cleanup = Instant::now();
    if delete_argocd_objects(client, &base_ns, ARGOCD_CLEANUP).await? {
        println!(
            "    (baseline Applications and AppProjects deleted; Argo CD removed the releases in {:.1}s)",
            cleanup.elapsed().as_secs_f64()
        );
        Api::<Namespace>::all(client.clone())
            .delete(&base_ns, &DeleteParams::background())
            .await?;
    }
    Ok(total)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Arguments first: `--help` and a bad flag answer outside the cluster's netns too.
    let args = Args::parse();
    assert_loopback_only();
    let client = client().await?;
    let n = args.apps;
    let engine = args.engine;
    let mode = if args.suspended {
        "suspended (materialisation only)"
    } else {
        "full (real Helm installs)"
    };
    println!(
        "bench-app: {n} ApplicationInstances, {mode}, engine {}",
        engine.product()
    );

    // One namespace per engine: a run never inherits apps another engine's run left behind.
    let ns = match engine {
        EngineChoice::Flux => format!("bench-app-{n}"),
        EngineChoice::Argocd => format!("bench-app-argocd-{n}"),
    };
    let mut controller_args = vec![
        "--concurrency",
        "8",
        "--log-filter",
        "warn",
        "--allowed-namespaces",
        &ns,
        // The bench charts are served over plain http on 127.0.0.1 (e2e::CHART_REPO).
        "--insecure-repository-hosts",
        "127.0.0.1",
    ];
    if engine == EngineChoice::Argocd {
        ensure_argocd_prerequisites().await?;
        controller_args.extend([
            "--engines",
            "flux,argocd",
            "--default-engine",
            "argocd",
            "--argocd-namespace",
            argocd::DEFAULT_NAMESPACE,
        ]);
    }
    let make_args = |admin: &str| -> Vec<String> {
        ["--admin-addr", admin]
            .into_iter()
            .chain(controller_args.iter().copied())
            .map(str::to_owned)
            .collect()
    };
    // A previous run's apps (the namespace is kept for inspection) go first. The namespace is
    // deleted before a controller of their own starts (their finalizers need one), so it only
    // deletes them and materialises nothing (with Argo CD, deleting an Application whose
    // sync is failing waits for the sync's retries). The measured controller then starts
    // cold, and what it remembers having prepared in the namespace (the release
    // ServiceAccount and RoleBinding, ensured once per process) cannot outlive the namespace.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(&ns).await?.is_some() {
        let cleanup = Instant::now();
        namespaces.delete(&ns, &DeleteParams::default()).await?;
        let (mut cleaner, _) = ControllerProcess::start_with_admin(
            SCOPE,
            "app-controller",
            "bench-app-controller-cleanup",
            make_args,
            &[],
        )
        .await?;
        wait_until(
            &format!("the previous run's namespace {ns} to be deleted"),
            Duration::from_secs(900),
            async || Ok(namespaces.get_opt(&ns).await?.is_none()),
        )
        .await?;
        cleaner.kill().await?;
        println!(
            "    (the previous run's apps in {ns} deleted in {:.1}s)",
            cleanup.elapsed().as_secs_f64()
        );
    }
    recreate_namespace(&client, &ns).await?;
    let (mut controller, admin) =
        ControllerProcess::start_with_admin(SCOPE, "app-controller", "bench-app-controller", make_args, &[]).await?;
    let pid = controller.pid().context("controller pid")?;
    pause("the controller to idle", Duration::from_secs(3)).await?;
    let rss_idle = rss_kib(pid).unwrap_or_default();

    // The engine objects of this namespace's apps, and how to list them.
    let (engine_api, engine_lp, engine_ready) = match engine {
        EngineChoice::Flux => (
            dynamic_api(
                &client,
                &ns,
                "helm.toolkit.fluxcd.io",
                "v2",
                "HelmRelease",
                "helmreleases",
            ),
            ListParams::default(),
            ready_condition_now as fn(&serde_json::Value) -> bool,
        ),
        EngineChoice::Argocd => (
            argocd_api(&client, argocd::APPLICATION),
            ListParams::default().labels(&instance_selector(&ns)),
            synced_and_healthy as fn(&serde_json::Value) -> bool,
        ),
    };
    let engine_watch = match &engine_lp.label_selector {
        Some(selector) => watcher::Config::default().labels(selector),
        None => watcher::Config::default(),
    };
    let ai_dyn = dynamic_api(
        &client,
        &ns,
        "vworkspace.io",
        "v1alpha1",
        "ApplicationInstance",
        "applicationinstances",
    );
    let obj_ready = spawn_ready_watch(engine_api.clone(), engine_watch, engine_ready);
    let ai_ready = spawn_ready_watch(ai_dyn.clone(), watcher::Config::default(), ready_condition_now);
    let ais: Api<ApplicationInstance> = Api::namespaced(client.clone(), &ns);

    let start = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let ais = ais.clone();
            async move {
                let a = bench_app(i, args.suspended);
                let body = serde_json::json!({"apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance",
                    "metadata": {"name": a.name_any()}, "spec": a.spec});
                ais.patch(
                    &a.name_any(),
                    &PatchParams::apply("bench").force(),
                    &Patch::Apply(&body),
                )
                .await
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    let created = start.elapsed();

    let object = engine.object();
    let mirrored = wait_until(
        &format!("every {object} to exist and be mirrored"),
        args.timeout(),
        async || {
            let objects = engine_api.list_metadata(&engine_lp).await?.items.len();
            let mirrored = ais
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|a| {
                    let s = a.status.as_ref();
                    s.and_then(|s| s.engine_ref.as_ref()).is_some()
                        && s.and_then(|s| s.observed_generation) == a.metadata.generation
                })
                .count();
            Ok(objects == n && mirrored == n)
        },
    )
    .await?;
    let mirrored = start.elapsed().max(mirrored);
    println!(
        "(a) created {n} ApplicationInstances in {:.1}s; all {object}s exist and are mirrored after {:.1}s ({:.1} apps/s)",
        created.as_secs_f64(),
        mirrored.as_secs_f64(),
        n as f64 / mirrored.as_secs_f64()
    );

    let mut operator_total = None;
    if !args.suspended {
        wait_until("every ApplicationInstance Ready", args.timeout(), async || {
            Ok(ai_ready.lock().expect("lock").len() >= n)
        })
        .await?;
        let total = start.elapsed();
        operator_total = Some(total);
        println!(
            "(b) all {n} ApplicationInstances Ready after {:.1}s",
            total.as_secs_f64()
        );
        let (objs, ai) = (
            obj_ready.lock().expect("lock").clone(),
            ai_ready.lock().expect("lock").clone(),
        );
        let mut lat: Vec<f64> = ai
            .iter()
            .filter_map(|(name, t_ai)| {
                objs.get(name)
                    .map(|t_obj| t_ai.saturating_duration_since(*t_obj).as_secs_f64() * 1000.0)
            })
            .collect();
        lat.sort_by(f64::total_cmp);
        let object_ready = match engine {
            EngineChoice::Flux => "HelmRelease Ready",
            EngineChoice::Argocd => "Application Synced+Healthy",
        };
        println!(
            "(c) {object_ready} -> ApplicationInstance Ready: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (n={})",
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            lat.last().copied().unwrap_or(f64::NAN),
            lat.len()
        );
    }
    let rss_n = rss_kib(pid).unwrap_or_default();

    // Writes at rest: first let the world settle (sources fetched, statuses final): no
    // ApplicationInstance changes for 10 s in a row. Then nothing may be written for 30 s.
    let settle_start = Instant::now();
    let mut last_versions = String::new();
    let mut stable_since = Instant::now();
    while stable_since.elapsed() < Duration::from_secs(10) {
        check_processes("the ApplicationInstances to settle")?;
        anyhow::ensure!(
            settle_start.elapsed() < args.timeout(),
            "ApplicationInstances never settled"
        );
        let versions: String = ais
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|a| a.resource_version().unwrap_or_default())
            .collect::<Vec<_>>()
            .join(",");
        if versions != last_versions {
            last_versions = versions;
            stable_since = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "    (settled: no ApplicationInstance change for 10 s, {:.1}s after the last phase)",
        (settle_start.elapsed() - Duration::from_secs(10)).as_secs_f64()
    );
    let counted = engine.counted_resources();
    let (c0, a0) = (
        controller_writes(&admin).await?,
        apiserver_writes(&client, &counted).await?,
    );
    pause("30 s of writes at rest", Duration::from_secs(30)).await?;
    let (c1, a1) = (
        controller_writes(&admin).await?,
        apiserver_writes(&client, &counted).await?,
    );
    println!(
        "(d) controller RSS: idle {:.1} MiB, at {n} apps {:.1} MiB",
        rss_idle as f64 / 1024.0,
        rss_n as f64 / 1024.0
    );
    let by_resource: Vec<(String, f64)> = a1
        .iter()
        .map(|(resource, v)| (resource.clone(), v - a0.get(resource).copied().unwrap_or_default()))
        .collect();
    let api_total: f64 = by_resource.iter().map(|(_, v)| v).sum();
    let names = counted.map(|(_, r)| r).join("/");
    let breakdown = by_resource
        .iter()
        .map(|(resource, v)| format!("{resource} {v:.0}"))
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "(e) writes at rest over 30 s: controller-counted {:.0} ({:.2}/s); API server on {names} {api_total:.0} ({:.2}/s: {breakdown})",
        c1 - c0,
        (c1 - c0) / 30.0,
        api_total / 30.0
    );
    controller.kill().await?;

    if let (Some(op_total), false) = (operator_total, args.skip_baseline) {
        // Baseline: the very objects the operator writes, applied directly, with no operator running.
        let alone = match engine {
            EngineChoice::Flux => flux_baseline(&client, n, args.timeout()).await?,
            EngineChoice::Argocd => argocd_baseline(&client, n, args.timeout()).await?,
        };
        let overhead = (op_total.as_secs_f64() - alone.as_secs_f64()) / alone.as_secs_f64() * 100.0;
        println!(
            "(b) {} alone (same objects applied directly): all {n} Ready after {:.1}s; operator overhead {overhead:+.1}%",
            engine.product(),
            alone.as_secs_f64()
        );
    }
    println!("bench-app done (namespace {ns} kept for inspection; `just cluster-down` clears everything)");
    Ok(())
}
