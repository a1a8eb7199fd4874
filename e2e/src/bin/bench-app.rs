//! `bench-app`: app-controller figures on the real local cluster (printed, never asserted).
//!
//! ```text
//! bench-app --apps 100                   # real Helm installs: operator vs Flux alone, 3 alternating pairs
//! bench-app --apps 1000 --suspended      # materialisation only: HelmReleases created suspended
//! bench-app --apps 10000 --suspended     # the same at 10,000, plus a controller restart
//! bench-app --apps 50 --engine argocd    # the same figures through Argo CD (`hack/cluster.sh start-argocd`)
//! ```
//!
//! Every materialisation-only run (`--suspended`) first measures the limit: the API server's
//! raw write rate (1,000 ConfigMap creates, and 1,000 server-side applies of a scratch custom
//! resource, each with the parallelism used for the ApplicationInstances), and from it the
//! most apps/s any controller could materialise given the writes one app needs (a run with
//! real installs does not: Helm's work shares the API server). The ApplicationInstances are
//! spread round-robin over `--namespaces` namespaces (`bench-app-0`, …) and `--repositories`
//! URLs of the local chart server (the same server, told apart by a query string, which Flux
//! keeps on the index and chart downloads), so apps of one namespace and repository can
//! share one source object.
//!
//! Reports (a) time until every engine object (HelmRelease, or Argo CD Application) exists
//! and every ApplicationInstance mirrors it, as a fraction of the limit, (b) time to all
//! Ready through the operator vs the very objects the operator wrote (copied from its run)
//! applied directly, over alternating pairs (operator, engine alone, …), each side starting
//! on an empty, idle cluster, (c) p50/p99 latency from engine-object Ready to
//! ApplicationInstance Ready (client-side watch timestamps), (d) controller RSS, (e) writes at
//! rest after convergence, (f) calls per reconcile and writes per app (the controller's
//! `vworkspace_api_requests_total` by verb, when it has it, over `vworkspace_reconcile_runs_total`),
//! and for suspended runs (g) the time a restarted controller takes to be caught up. Runs
//! inside the cluster netns (`just bench-app`), starting its own app-controller (release
//! build) with its admin server on a free port, and stops with the controller's log if it
//! exits.
//!
//! Between sides, and before a run (a previous run's apps are kept for inspection), every
//! benchmark namespace is deleted with the finalizers of its objects removed: no controller
//! runs then, and no uninstall or source clean-up is left to compete with the next side.
//!
//! With `--engine argocd` the controller runs with `--engines flux,argocd --default-engine
//! argocd` and the ApplicationInstances name no engine; an Application counts as Ready
//! when Argo CD reports it `Synced` and `Healthy` (Argo CD has no Ready condition).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use api::ApplicationInstance;
use clap::{Parser, ValueEnum};
use e2e::{
    CHART_REPO,
    apps::{FinalizerAtAdmission, app},
    assert_loopback_only,
    bench::{cluster_component_pid, load_average, pause, percentile, rss_kib, wait_components_idle, wait_until},
    client,
    deploy::http_get,
    process::ControllerProcess,
};
use futures::{StreamExt, TryStreamExt, stream};
use helmengine::{argocd, watch::LABEL_INSTANCE_NAMESPACE};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use tokio::task::JoinHandle;

/// The scope of the processes this benchmark starts.
const SCOPE: &str = "bench-app";
/// ApplicationInstances (and, for the limit, ConfigMaps; for the engine-alone side, engine
/// objects) in flight at once.
const CREATE_CONCURRENCY: usize = 16;
/// Objects created to measure the API server's raw write rate.
const LIMIT_OBJECTS: usize = 1000;
/// Rounds of [`raw_custom_apply_rates`]; the limit is their median.
const LIMIT_ROUNDS: usize = 3;
/// Label on every namespace this benchmark creates: what a later run deletes first.
const BENCH_LABEL: &str = "bench.vworkspace.io/bench";
const BENCH_LABEL_VALUE: &str = "bench-app";
/// Writes one app needs whatever the controller: the ApplicationInstance's creation, its
/// engine object, its status; the shared source is added amortised.
const WRITES_PER_APP_UNSHARED: f64 = 3.0;
/// No ApplicationInstance change for this long: settled.
const SETTLE_QUIET: Duration = Duration::from_secs(10);
const REST_WINDOW: Duration = Duration::from_secs(30);

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

    /// The engine object's readiness.
    fn ready(self) -> fn(&serde_json::Value) -> bool {
        match self {
            Self::Flux => ready_condition_now,
            Self::Argocd => synced_and_healthy,
        }
    }

    /// The resources whose writes the API server's counters are read for: `(group, resource)`.
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

    /// The objects the operator writes for its apps, sources first: what the engine-alone
    /// side applies again.
    fn written_kinds(self) -> Vec<ApiResource> {
        match self {
            Self::Flux => vec![helm_repository(), helm_release()],
            Self::Argocd => vec![argocd::APP_PROJECT.api_resource(), argocd::APPLICATION.api_resource()],
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
    /// Create them suspended: materialisation only, no Helm install (one run, then a
    /// controller restart).
    #[arg(long)]
    suspended: bool,
    /// Namespaces the apps are spread over, round-robin (`bench-app-0`, …).
    #[arg(long, default_value_t = 10)]
    namespaces: usize,
    /// Distinct repository URLs the apps are spread over (the same chart server).
    #[arg(long, default_value_t = 5)]
    repositories: usize,
    /// Pairs of sides (operator, then the engine alone) for the overhead, alternating.
    #[arg(long, default_value_t = 3)]
    pairs: usize,
    /// Skip the engine-alone sides (the operator side runs once).
    #[arg(long)]
    skip_baseline: bool,
    /// Leave out the app controller's finalizer at admission
    /// (deploy/components/admission-finalizer, bound here to the benchmark's namespaces):
    /// the controller then adds its finalizer with a merge patch, as on clusters older than
    /// Kubernetes 1.36.
    #[arg(long)]
    no_admission_finalizer: bool,
    /// The engine the controller applies by default (the ApplicationInstances name none).
    #[arg(long, value_enum, default_value_t = EngineChoice::Flux)]
    engine: EngineChoice,
    /// The controller's `--concurrency`; by default 8, and one per 25 apps above 200, at
    /// most 40 (at 1,000 apps, 20 left the controller 5 s behind the creation; 40 kept it
    /// within 1 s, and 64 was no faster).
    #[arg(long)]
    controller_concurrency: Option<u16>,
    /// The controller's `--log-filter` (its log is target/e2e-cluster/logs/bench-app-controller.log);
    /// e.g. `warn,app_controller=trace` names what woke each reconcile.
    #[arg(long, default_value = "warn")]
    controller_log_filter: String,
    /// Longest wait for each phase, seconds; by default 300 plus 0.2 s per app (suspended)
    /// or 3 s per app (real installs).
    #[arg(long)]
    timeout_secs: Option<u64>,
}

impl Args {
    fn timeout(&self) -> Duration {
        let per_app = if self.suspended { 0.2 } else { 3.0 };
        let default = 300 + (self.apps as f64 * per_app) as u64;
        Duration::from_secs(self.timeout_secs.unwrap_or(default))
    }

    fn controller_concurrency(&self) -> u16 {
        self.controller_concurrency
            .unwrap_or_else(|| (self.apps / 25).clamp(8, 40) as u16)
    }
}

fn helm_release() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("helm.toolkit.fluxcd.io", "v2", "HelmRelease"),
        "helmreleases",
    )
}

fn helm_repository() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("source.toolkit.fluxcd.io", "v1", "HelmRepository"),
        "helmrepositories",
    )
}

fn helm_chart() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("source.toolkit.fluxcd.io", "v1", "HelmChart"),
        "helmcharts",
    )
}

fn application_instance() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("vworkspace.io", "v1alpha1", "ApplicationInstance"),
        "applicationinstances",
    )
}

/// Where the apps go: namespace `i mod N`, repository `(i div N) mod R`, so that every
/// namespace uses every repository.
struct Spread {
    namespaces: Vec<String>,
    repositories: usize,
}

impl Spread {
    fn new(namespaces: usize, repositories: usize) -> Self {
        Self {
            namespaces: (0..namespaces.max(1)).map(|k| format!("bench-app-{k}")).collect(),
            repositories: repositories.max(1),
        }
    }

    fn namespace(&self, i: usize) -> &str {
        &self.namespaces[i % self.namespaces.len()]
    }

    /// The chart server under its `r`-th URL: the query string tells Flux's sources apart
    /// (and is kept on the index and chart downloads); the server ignores it.
    fn repository_url(&self, i: usize) -> String {
        let r = (i / self.namespaces.len()) % self.repositories;
        format!("{CHART_REPO}/?repository={r}")
    }

    /// Distinct (namespace, repository) pairs among `n` apps: the source objects a
    /// controller sharing them needs.
    fn sources(&self, n: usize) -> usize {
        (0..n)
            .map(|i| (self.namespace(i).to_owned(), self.repository_url(i)))
            .collect::<BTreeSet<_>>()
            .len()
    }

    fn contains(&self, namespace: &str) -> bool {
        self.namespaces.iter().any(|ns| ns == namespace)
    }

    /// `vworkspace.io/instance-namespace in (…)`: the Argo CD objects of these namespaces.
    fn argocd_selector(&self) -> String {
        format!("{LABEL_INSTANCE_NAMESPACE} in ({})", self.namespaces.join(","))
    }
}

fn bench_app(i: usize, spread: &Spread, suspended: bool) -> ApplicationInstance {
    let mut a = app(
        &format!("app-{i:05}"),
        "demo-app",
        "0.1.0",
        serde_json::json!({"replicaCount": 0, "greeting": format!("app {i}")}),
    );
    if let Some(repository) = a.spec.chart.repository.as_mut() {
        repository.url = spread.repository_url(i);
    }
    a.spec.suspend = suspended;
    a
}

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

/// The ApplicationInstance names its engine object and has observed its generation.
fn mirrored(obj: &serde_json::Value) -> bool {
    obj.pointer("/status/engineRef").is_some_and(|r| !r.is_null())
        && obj.pointer("/status/observedGeneration").and_then(|g| g.as_i64())
            == obj.pointer("/metadata/generation").and_then(|g| g.as_i64())
}

/// One watched object: whether each predicate holds now, and when it first held.
struct Tracked {
    holds: Vec<bool>,
    first: Vec<Option<Instant>>,
}

/// The objects of one kind in the benchmark's namespaces, kept current by a watch (no
/// polling lists: at 10,000 objects those would load the API server being measured).
#[derive(Default)]
struct TrackerState {
    objects: HashMap<String, Tracked>,
    last_change: Option<Instant>,
}

struct Tracker {
    state: Arc<Mutex<TrackerState>>,
    task: JoinHandle<()>,
}

impl Tracker {
    /// Watches `api` (with `config`), keeping the objects of `spread`'s namespaces, keyed by
    /// the ApplicationInstance they stand for (`vworkspace.io/instance-namespace`, else their
    /// namespace; `app.kubernetes.io/instance`, else their name).
    fn spawn(
        api: Api<DynamicObject>,
        config: watcher::Config,
        spread: Arc<Spread>,
        predicates: Vec<fn(&serde_json::Value) -> bool>,
    ) -> Self {
        let state: Arc<Mutex<TrackerState>> = Arc::default();
        let sink = state.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(api, config).default_backoff().boxed();
            while let Some(event) = events.next().await {
                let Ok(event) = event else { continue };
                let (obj, deleted) = match event {
                    watcher::Event::Apply(o) | watcher::Event::InitApply(o) => (o, false),
                    watcher::Event::Delete(o) => (o, true),
                    watcher::Event::Init | watcher::Event::InitDone => continue,
                };
                let labels = obj.labels();
                let namespace = labels
                    .get(LABEL_INSTANCE_NAMESPACE)
                    .cloned()
                    .or_else(|| obj.namespace())
                    .unwrap_or_default();
                if !spread.contains(&namespace) {
                    continue;
                }
                let name = labels
                    .get(api::LABEL_INSTANCE)
                    .cloned()
                    .unwrap_or_else(|| obj.name_any());
                let key = format!("{namespace}/{name}");
                let now = Instant::now();
                let mut state = sink.lock().unwrap_or_else(|e| e.into_inner());
                state.last_change = Some(now);
                if deleted {
                    state.objects.remove(&key);
                    continue;
                }
                let json = serde_json::to_value(&obj).unwrap_or_default();
                let entry = state.objects.entry(key).or_insert_with(|| Tracked {
                    holds: vec![false; predicates.len()],
                    first: vec![None; predicates.len()],
                });
                for (i, predicate) in predicates.iter().enumerate() {
                    entry.holds[i] = predicate(&json);
                    if entry.holds[i] && entry.first[i].is_none() {
                        entry.first[i] = Some(now);
                    }
                }
            }
        });
        Self { state, task }
    }

    fn with<T>(&self, f: impl FnOnce(&TrackerState) -> T) -> T {
        f(&self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn count(&self) -> usize {
        self.with(|s| s.objects.len())
    }

    /// Objects for which predicate `i` holds now.
    fn holding(&self, i: usize) -> usize {
        self.with(|s| s.objects.values().filter(|t| t.holds[i]).count())
    }

    /// Objects for which predicate `i` has held at least once.
    fn ever_held(&self, i: usize) -> usize {
        self.with(|s| s.objects.values().filter(|t| t.first[i].is_some()).count())
    }

    fn first_times(&self, i: usize) -> HashMap<String, Instant> {
        self.with(|s| {
            s.objects
                .iter()
                .filter_map(|(k, t)| Some((k.clone(), t.first[i]?)))
                .collect()
        })
    }

    fn quiet_for(&self) -> Duration {
        self.with(|s| s.last_change.map(|t| t.elapsed()).unwrap_or(Duration::MAX))
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The value of label `name` on a Prometheus text line.
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!("{name}=\""))? + name.len() + 2;
    let rest = &line[start..];
    Some(&rest[..rest.find('"')?])
}

fn sample_value(line: &str) -> Option<f64> {
    line.rsplit(' ').next()?.parse().ok()
}

/// The controller's own counters.
#[derive(Clone, Default)]
struct ControllerCounters {
    runs: f64,
    /// `vworkspace_api_writes_total` by `verb kind`.
    writes: BTreeMap<String, f64>,
    /// `vworkspace_api_requests_total` by verb; None when the controller has no such metric.
    requests: Option<BTreeMap<String, f64>>,
}

/// Verbs of `vworkspace_api_requests_total` that write.
const WRITE_VERBS: [&str; 6] = ["create", "apply", "patch", "update", "delete", "deletecollection"];

impl ControllerCounters {
    async fn read(admin: &str) -> anyhow::Result<Self> {
        let body = http_get(admin, "/metrics").await?;
        let mut counters = Self::default();
        for line in body.lines() {
            let Some(value) = sample_value(line) else { continue };
            if line.starts_with("vworkspace_reconcile_runs_total") {
                counters.runs += value;
            } else if line.starts_with("vworkspace_api_writes_total{")
                && label(line, "controller") != Some("leader-election")
            {
                let key = format!(
                    "{} {}",
                    label(line, "verb").unwrap_or("?"),
                    label(line, "kind").unwrap_or("?")
                );
                *counters.writes.entry(key).or_default() += value;
            } else if line.starts_with("vworkspace_api_requests_total{") {
                let verb = label(line, "verb").unwrap_or("other").to_owned();
                *counters.requests.get_or_insert_default().entry(verb).or_default() += value;
            }
        }
        Ok(counters)
    }

    /// `self - earlier`.
    fn since(&self, earlier: &Self) -> Self {
        let minus = |now: &BTreeMap<String, f64>, then: &BTreeMap<String, f64>| -> BTreeMap<String, f64> {
            now.iter()
                .map(|(k, v)| (k.clone(), v - then.get(k).copied().unwrap_or_default()))
                .filter(|(_, v)| *v != 0.0)
                .collect()
        };
        Self {
            runs: self.runs - earlier.runs,
            writes: minus(&self.writes, &earlier.writes),
            requests: self
                .requests
                .as_ref()
                .map(|now| minus(now, earlier.requests.as_ref().unwrap_or(&BTreeMap::new()))),
        }
    }

    fn writes_total(&self) -> f64 {
        // `+ 0.0`: an empty f64 sum is -0.0.
        self.writes.values().sum::<f64>() + 0.0
    }

    /// Requests that wrote, from `vworkspace_api_requests_total`.
    fn request_writes(&self) -> Option<f64> {
        let requests = self.requests.as_ref()?;
        Some(WRITE_VERBS.iter().filter_map(|v| requests.get(*v)).sum::<f64>() + 0.0)
    }

    /// Requests other than watches, by verb, per reconcile: `get 2.00, apply 1.00, … = 4.0`.
    fn calls_per_reconcile(&self) -> String {
        let Some(requests) = &self.requests else {
            return "n/a (the controller has no vworkspace_api_requests_total)".to_owned();
        };
        if self.runs == 0.0 {
            return "n/a (no reconcile)".to_owned();
        }
        let calls: Vec<(&String, f64)> = requests
            .iter()
            .filter(|(verb, _)| verb.as_str() != "watch")
            .map(|(verb, v)| (verb, v / self.runs))
            .collect();
        let total: f64 = calls.iter().map(|(_, v)| v).sum();
        let parts: Vec<String> = calls.iter().map(|(verb, v)| format!("{verb} {v:.2}")).collect();
        format!("{total:.2} ({})", parts.join(", "))
    }

    fn writes_breakdown(&self) -> String {
        let parts: Vec<String> = self
            .writes
            .iter()
            .filter(|(_, v)| **v != 0.0)
            .map(|(k, v)| format!("{k} {v:.0}"))
            .collect();
        if parts.is_empty() {
            return "none".to_owned();
        }
        parts.join(", ")
    }
}

/// Writes the API server counted on `resources` (`(group, resource)`, the object itself,
/// not a subresource; except the ApplicationInstances' status), by resource.
async fn apiserver_writes(client: &Client, resources: &[(&str, &str)]) -> anyhow::Result<BTreeMap<String, f64>> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    let mut counts: BTreeMap<String, f64> = resources.iter().map(|(_, r)| ((*r).to_owned(), 0.0)).collect();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let mutating = ["PATCH", "POST", "PUT", "DELETE", "APPLY"].contains(&label(line, "verb").unwrap_or_default());
        let Some(value) = sample_value(line) else { continue };
        let counted = resources.iter().find(|(group, resource)| {
            label(line, "group") == Some(*group)
                && label(line, "resource") == Some(*resource)
                && (*resource == "applicationinstances" || label(line, "subresource") == Some(""))
        });
        if let (true, Some((_, resource))) = (mutating, counted) {
            *counts.entry((*resource).to_owned()).or_default() += value;
        }
    }
    Ok(counts)
}

fn counts_since(now: &BTreeMap<String, f64>, then: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    now.iter()
        .map(|(k, v)| (k.clone(), v - then.get(k).copied().unwrap_or_default()))
        .collect()
}

fn describe_counts(counts: &BTreeMap<String, f64>) -> String {
    let total = counts.values().sum::<f64>() + 0.0;
    let parts: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v:.0}")).collect();
    format!("{total:.0} ({})", parts.join(", "))
}

fn mib(kib: Option<u64>) -> String {
    kib.map(|k| format!("{:.1} MiB", k as f64 / 1024.0))
        .unwrap_or_else(|| "n/a".to_owned())
}

fn namespace_object(name: &str) -> anyhow::Result<Namespace> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {BENCH_LABEL: BENCH_LABEL_VALUE}}
    }))?)
}

/// The namespace of the limit measurements.
const SCRATCH: &str = "bench-app-limit";

/// Creates the namespace of a limit measurement; returns the namespaces' API.
async fn create_scratch(client: &Client) -> anyhow::Result<Api<Namespace>> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &namespace_object(SCRATCH)?)
        .await?;
    Ok(namespaces)
}

/// Deletes the namespace of a limit measurement, with what it holds, and waits until it is gone.
async fn delete_scratch(namespaces: &Api<Namespace>) -> anyhow::Result<()> {
    namespaces.delete(SCRATCH, &DeleteParams::background()).await?;
    wait_until("the scratch namespace to go", Duration::from_secs(300), async || {
        Ok(namespaces.get_opt(SCRATCH).await?.is_none())
    })
    .await?;
    Ok(())
}

/// The API server's raw write rate: `LIMIT_OBJECTS` small ConfigMaps created with
/// `CREATE_CONCURRENCY` in flight, in a scratch namespace deleted afterwards. Creates/s.
async fn raw_create_rate(client: &Client) -> anyhow::Result<f64> {
    let namespaces = create_scratch(client).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), SCRATCH);
    let rate = write_rate(|i| {
        let config_maps = config_maps.clone();
        async move {
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("cm-{i:05}")},
                "data": {"k": format!("v{i}")}
            }))?;
            config_maps.create(&PostParams::default(), &cm).await?;
            anyhow::Ok(())
        }
    })
    .await?;
    delete_scratch(&namespaces).await?;
    Ok(rate)
}

/// Runs `write(i)` for `LIMIT_OBJECTS` objects with `CREATE_CONCURRENCY` in flight, timed;
/// writes/s.
async fn write_rate<F, W>(write: F) -> anyhow::Result<f64>
where
    F: FnMut(usize) -> W,
    W: Future<Output = anyhow::Result<()>>,
{
    let start = Instant::now();
    stream::iter(0..LIMIT_OBJECTS)
        .map(write)
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(LIMIT_OBJECTS as f64 / start.elapsed().as_secs_f64())
}

/// The scratch kind of [`raw_custom_apply_rate`]: stored, served, watched by nobody.
const PROBE_GROUP: &str = "probe.bench.vworkspace.io";
const PROBE_KIND: &str = "LimitProbe";
const PROBE_PLURAL: &str = "limitprobes";

/// The API server's raw rate for the kind of write an app is made of: `LIMIT_OBJECTS`
/// server-side applies of a custom resource (a scratch CRD with an open schema, which no
/// controller watches) carrying a benchmark ApplicationInstance's spec, with
/// `CREATE_CONCURRENCY` in flight. Every write one app needs (its creation, its engine
/// object, its status, its finalizer) is such an apply or patch of a custom resource, and
/// on this API server one costs several times a ConfigMap create.
///
/// One round of 1,000 lasts about two seconds, and its rate moved by a fifth between runs
/// (an API server garbage collection, the previous case's namespaces still being
/// deleted), so [`LIMIT_ROUNDS`] rounds of fresh objects are timed and the median is the
/// limit. Returns the rates of the rounds, in the order run (applies/s).
async fn raw_custom_apply_rates(client: &Client, spread: &Spread) -> anyhow::Result<Vec<f64>> {
    let crds: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&crd_gvk()));
    let crd_name = format!("{PROBE_PLURAL}.{PROBE_GROUP}");
    let crd = serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": crd_name, "labels": {BENCH_LABEL: BENCH_LABEL_VALUE}},
        "spec": {"group": PROBE_GROUP, "scope": "Namespaced",
            "names": {"kind": PROBE_KIND, "plural": PROBE_PLURAL, "singular": "limitprobe"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]}
    });
    crds.patch(&crd_name, &PatchParams::apply("bench").force(), &Patch::Apply(&crd))
        .await?;
    wait_until("the probe CRD to be established", Duration::from_secs(60), async || {
        let crd = crds.get(&crd_name).await?;
        Ok(crd.data["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Established" && c["status"] == "True")))
    })
    .await?;
    let probe = ApiResource::from_gvk(&GroupVersionKind::gvk(PROBE_GROUP, "v1", PROBE_KIND));
    let namespaces = create_scratch(client).await?;
    let probes: Api<DynamicObject> = Api::namespaced_with(client.clone(), SCRATCH, &probe);
    // A new CRD is served a moment after it is established.
    wait_until("the probe kind to be served", Duration::from_secs(60), async || {
        Ok(probes.list_metadata(&ListParams::default().limit(1)).await.is_ok())
    })
    .await?;
    let mut rates = Vec::with_capacity(LIMIT_ROUNDS);
    for round in 0..LIMIT_ROUNDS {
        let rate = write_rate(|i| {
            let probes = probes.clone();
            let spec = bench_app(i, spread, true).spec;
            async move {
                // New names each round: applying a stored object again would be a no-op write.
                let name = format!("probe-{round}-{i:05}");
                let body = serde_json::json!({"apiVersion": format!("{PROBE_GROUP}/v1"), "kind": PROBE_KIND,
                    "metadata": {"name": name}, "spec": spec});
                probes
                    .patch(&name, &PatchParams::apply("bench").force(), &Patch::Apply(&body))
                    .await?;
                anyhow::Ok(())
            }
        })
        .await?;
        rates.push(rate);
    }
    delete_scratch(&namespaces).await?;
    crds.delete(&crd_name, &DeleteParams::background()).await?;
    Ok(rates)
}

fn crd_gvk() -> GroupVersionKind {
    GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition")
}

/// Deletes every namespace this benchmark created (label [`BENCH_LABEL`]) and Argo CD
/// objects written for them, removing the finalizers of the deleted objects (no controller
/// of ours runs now, and uninstalls would only compete with the next side), then waits
/// until they are gone, no Helm release Secret is left, and Flux's controllers idle.
/// Returns what it cleared, for the log.
async fn clear_bench_namespaces(client: &Client, engine: EngineChoice, bound: Duration) -> anyhow::Result<String> {
    let start = Instant::now();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let bench_lp = ListParams::default().labels(&format!("{BENCH_LABEL}={BENCH_LABEL_VALUE}"));
    let names: Vec<String> = namespaces
        .list_metadata(&bench_lp)
        .await?
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    let mut kinds: Vec<(ApiResource, Option<String>)> =
        [application_instance(), helm_release(), helm_repository(), helm_chart()]
            .into_iter()
            .map(|ar| (ar, None))
            .collect();
    if engine == EngineChoice::Argocd && !names.is_empty() {
        let selector = format!("{LABEL_INSTANCE_NAMESPACE} in ({})", names.join(","));
        for ar in [argocd::APPLICATION.api_resource(), argocd::APP_PROJECT.api_resource()] {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), argocd::DEFAULT_NAMESPACE, &ar);
            api.delete_collection(&DeleteParams::background(), &ListParams::default().labels(&selector))
                .await?;
            kinds.push((ar, Some(selector.clone())));
        }
    }
    for name in &names {
        namespaces.delete(name, &DeleteParams::background()).await?;
    }
    let mut stripped = 0usize;
    loop {
        let left = namespaces.list_metadata(&bench_lp).await?.items.len();
        // Objects being deleted in them (or, for Argo CD, for them) whose finalizers nothing
        // will remove: every controller that would is either stopped or busy for nothing.
        let mut stuck: Vec<(ApiResource, String, String)> = Vec::new();
        for (ar, selector) in &kinds {
            let (api, lp): (Api<DynamicObject>, ListParams) = match selector {
                Some(s) => (
                    Api::namespaced_with(client.clone(), argocd::DEFAULT_NAMESPACE, ar),
                    ListParams::default().labels(s),
                ),
                None => (Api::all_with(client.clone(), ar), ListParams::default()),
            };
            let Ok(list) = api.list_metadata(&lp).await else {
                continue; // the kind is not installed
            };
            stuck.extend(
                list.items
                    .into_iter()
                    .filter(|o| {
                        o.metadata.deletion_timestamp.is_some()
                            && !o.finalizers().is_empty()
                            && (selector.is_some() || names.contains(&o.namespace().unwrap_or_default()))
                    })
                    .map(|o| (ar.clone(), o.namespace().unwrap_or_default(), o.name_any())),
            );
        }
        if left == 0 && stuck.is_empty() {
            break;
        }
        stripped += stuck.len();
        stream::iter(stuck)
            .map(|(ar, ns, name)| {
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
                async move {
                    let patch = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
                    // Gone meanwhile is fine.
                    let _ = api.patch(&name, &PatchParams::default(), &patch).await;
                }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        anyhow::ensure!(
            start.elapsed() < bound,
            "the benchmark namespaces ({left} left) not gone after {bound:?}"
        );
        pause("the benchmark namespaces to go", Duration::from_secs(1)).await?;
    }
    // Helm release Secrets live in the deleted namespaces; say so if any other is left.
    let secrets: Api<Secret> = Api::all(client.clone());
    let releases = secrets
        .list_metadata(&ListParams::default().fields("type=helm.sh/release.v1"))
        .await?
        .items
        .into_iter()
        .filter(|s| s.namespace().is_some_and(|ns| ns.starts_with("bench-app-")))
        .count();
    anyhow::ensure!(
        releases == 0,
        "{releases} Helm release Secrets left in bench-app-* namespaces"
    );
    let idle = wait_components_idle(
        &["source-controller", "helm-controller", "kube-controller-manager"],
        0.05,
        Duration::from_secs(120),
    )
    .await?;
    let idle = match idle {
        Some(_) => "idle".to_owned(),
        None => "NOT idle after 120 s (or pids unknown)".to_owned(),
    };
    Ok(format!(
        "{} namespaces deleted ({stripped} finalizers removed), Flux {idle}, in {:.1}s",
        names.len(),
        start.elapsed().as_secs_f64()
    ))
}

/// The binding of the shipped finalizer policy to the benchmark's namespaces (the shipped
/// binding covers every namespace; other tests of this cluster run applications with no app
/// controller).
const FINALIZER_BINDING: &str = "bench-app-finalizer";

/// Sets up (or, with `enabled` false, removes) the app controller's finalizer at admission
/// for the benchmark's namespaces: the policy of deploy/components/admission-finalizer as
/// shipped, bound by label to the benchmark's namespaces, and waits until the API server
/// applies it (a dry-run create in the first namespace carries the finalizer).
async fn admission_finalizer(client: &Client, spread: &Spread, enabled: bool) -> anyhow::Result<()> {
    if !enabled {
        return FinalizerAtAdmission::unbind(FINALIZER_BINDING).await;
    }
    FinalizerAtAdmission::bind(
        FINALIZER_BINDING,
        "bench",
        serde_json::json!({"matchLabels": {BENCH_LABEL: BENCH_LABEL_VALUE}}),
        &Api::namespaced(client.clone(), spread.namespace(0)),
        &bench_app(0, spread, true),
    )
    .await?;
    Ok(())
}

async fn create_namespaces(client: &Client, spread: &Spread) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for name in &spread.namespaces {
        namespaces
            .create(&PostParams::default(), &namespace_object(name)?)
            .await?;
    }
    Ok(())
}

/// The engine objects the operator wrote for the apps of `spread`, as the engine-alone side
/// applies them: spec, labels and annotations, no owner, status or server-set fields. Argo
/// CD Applications keep their finalizer (the operator sets it); Flux's are Flux's own.
async fn snapshot_engine_objects(
    client: &Client,
    engine: EngineChoice,
    spread: &Spread,
) -> anyhow::Result<Vec<(ApiResource, DynamicObject)>> {
    let mut objects = Vec::new();
    for ar in engine.written_kinds() {
        let (api, lp): (Api<DynamicObject>, ListParams) = match engine {
            EngineChoice::Flux => (Api::all_with(client.clone(), &ar), ListParams::default()),
            EngineChoice::Argocd => (
                Api::namespaced_with(client.clone(), argocd::DEFAULT_NAMESPACE, &ar),
                ListParams::default().labels(&spread.argocd_selector()),
            ),
        };
        for obj in api.list(&lp).await?.items {
            let namespace = obj.namespace().unwrap_or_default();
            if engine == EngineChoice::Flux && !spread.contains(&namespace) {
                continue;
            }
            let mut copy = DynamicObject::new(&obj.name_any(), &ar).within(&namespace);
            copy.metadata.labels = obj.metadata.labels.clone();
            copy.metadata.annotations = obj.metadata.annotations.clone();
            if ar.kind == argocd::APPLICATION.kind {
                copy.metadata.finalizers = obj.metadata.finalizers.clone();
            }
            copy.data = serde_json::json!({"spec": obj.data.get("spec").cloned().unwrap_or_default()});
            objects.push((ar.clone(), copy));
        }
    }
    Ok(objects)
}

/// Measures and prints the limit: ConfigMap creates, and the median of
/// [`raw_custom_apply_rates`].
async fn measure_limit(client: &Client, spread: &Spread) -> anyhow::Result<Limit> {
    let raw_creates_per_s = raw_create_rate(client).await?;
    println!(
        "(a) limit: the API server creates {raw_creates_per_s:.0} ConfigMaps/s ({LIMIT_OBJECTS} with {CREATE_CONCURRENCY} in flight)"
    );
    let rounds = raw_custom_apply_rates(client, spread).await?;
    let mut sorted = rounds.clone();
    sorted.sort_by(f64::total_cmp);
    let raw_custom_applies_per_s = median(&sorted);
    let rounds_shown: Vec<String> = rounds.iter().map(|r| format!("{r:.0}")).collect();
    println!(
        "(a) limit: the API server server-side applies {raw_custom_applies_per_s:.0} custom resources/s, the median of \
         {LIMIT_ROUNDS} rounds ({}) of {LIMIT_OBJECTS} new objects of a scratch kind with an ApplicationInstance's spec, \
         {CREATE_CONCURRENCY} in flight",
        rounds_shown.join(", ")
    );
    Ok(Limit {
        raw_creates_per_s,
        raw_custom_applies_per_s,
    })
}

/// One side's run through the operator.
struct OperatorRun {
    total: Option<Duration>,
}

/// What every side shares.
struct Bench {
    client: Client,
    args: Args,
    spread: Arc<Spread>,
    controller_args: Vec<String>,
    /// Measured for materialisation-only (suspended) runs; `None` in a run with real installs.
    limit: Option<Limit>,
}

/// The API server's write rates, measured in the same run.
#[derive(Clone, Copy)]
struct Limit {
    raw_creates_per_s: f64,
    /// The median of [`raw_custom_apply_rates`].
    raw_custom_applies_per_s: f64,
}

impl Bench {
    fn n(&self) -> usize {
        self.args.apps
    }

    fn make_args(&self) -> impl Fn(&str) -> Vec<String> + use<> {
        let controller_args = self.controller_args.clone();
        move |admin: &str| {
            ["--admin-addr", admin]
                .into_iter()
                .map(str::to_owned)
                .chain(controller_args.iter().cloned())
                .collect()
        }
    }

    async fn start_controller(&self, log_name: &str) -> anyhow::Result<(ControllerProcess, String, u32)> {
        let (controller, admin) =
            ControllerProcess::start_with_admin(SCOPE, "app-controller", log_name, self.make_args(), &[]).await?;
        let pid = controller.pid().context("controller pid")?;
        Ok((controller, admin, pid))
    }

    fn engine_tracker(&self) -> Tracker {
        let engine = self.args.engine;
        let (api, config) = match engine {
            EngineChoice::Flux => (
                Api::all_with(self.client.clone(), &helm_release()),
                watcher::Config::default(),
            ),
            EngineChoice::Argocd => (
                Api::namespaced_with(
                    self.client.clone(),
                    argocd::DEFAULT_NAMESPACE,
                    &argocd::APPLICATION.api_resource(),
                ),
                watcher::Config::default().labels(&self.spread.argocd_selector()),
            ),
        };
        Tracker::spawn(api, config, self.spread.clone(), vec![engine.ready()])
    }

    /// The operator side: namespaces, a cold controller, N ApplicationInstances. With
    /// `full_report`, also settles, counts writes at rest and (suspended) restarts the
    /// controller. Leaves the apps in place, the controller stopped.
    async fn operator_side(&self, full_report: bool) -> anyhow::Result<OperatorRun> {
        let (n, engine, client) = (self.n(), self.args.engine, &self.client);
        let timeout = self.args.timeout();
        create_namespaces(client, &self.spread).await?;
        admission_finalizer(client, &self.spread, !self.args.no_admission_finalizer).await?;
        let (mut controller, admin, pid) = self.start_controller("bench-app-controller").await?;
        pause("the controller to idle", Duration::from_secs(3)).await?;
        let rss_idle = rss_kib(pid);
        let engine_objects = self.engine_tracker();
        let ais = Tracker::spawn(
            Api::all_with(client.clone(), &application_instance()),
            watcher::Config::default(),
            self.spread.clone(),
            vec![mirrored, ready_condition_now],
        );
        let counted = engine.counted_resources();
        let (m0, a0) = (
            ControllerCounters::read(&admin).await?,
            apiserver_writes(client, &counted).await?,
        );

        let start = Instant::now();
        stream::iter(0..n)
            .map(|i| {
                let ais: Api<ApplicationInstance> = Api::namespaced(client.clone(), self.spread.namespace(i));
                let a = bench_app(i, &self.spread, self.args.suspended);
                async move {
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
        wait_until(
            &format!("every {object} to exist and be mirrored"),
            timeout,
            async || Ok(engine_objects.count() >= n && ais.holding(0) >= n),
        )
        .await?;
        let materialised = start.elapsed();
        let (m1, a1) = (
            ControllerCounters::read(&admin).await?,
            apiserver_writes(client, &counted).await?,
        );
        let rss_n = rss_kib(pid);
        let apps_per_s = n as f64 / materialised.as_secs_f64();
        println!(
            "(a) created {n} ApplicationInstances in {:.1}s; all {object}s exist and are mirrored after {:.1}s ({apps_per_s:.1} apps/s)",
            created.as_secs_f64(),
            materialised.as_secs_f64(),
        );

        let mut total = None;
        if !self.args.suspended {
            wait_until("every ApplicationInstance Ready", timeout, async || {
                Ok(ais.ever_held(1) >= n)
            })
            .await?;
            let all_ready = start.elapsed();
            total = Some(all_ready);
            println!(
                "(b) all {n} ApplicationInstances Ready after {:.1}s",
                all_ready.as_secs_f64()
            );
            let (objects_ready, ai_ready) = (engine_objects.first_times(0), ais.first_times(1));
            let mut lat: Vec<f64> = ai_ready
                .iter()
                .filter_map(|(key, t_ai)| {
                    objects_ready
                        .get(key)
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
        if !full_report {
            controller.kill().await?;
            return Ok(OperatorRun { total });
        }

        // Settle: sources fetched, statuses final: no ApplicationInstance change for 10 s.
        let settle_start = Instant::now();
        wait_until("the ApplicationInstances to settle", timeout, async || {
            Ok(ais.quiet_for() >= SETTLE_QUIET)
        })
        .await?;
        let settled = settle_start.elapsed().saturating_sub(SETTLE_QUIET);
        let (m2, a2) = (
            ControllerCounters::read(&admin).await?,
            apiserver_writes(client, &counted).await?,
        );
        println!(
            "    settled (no ApplicationInstance change for {} s) {:.1}s after the last phase",
            SETTLE_QUIET.as_secs(),
            settled.as_secs_f64()
        );
        self.print_cost(&m0, &m1, &m2, &a0, &a1, &a2, apps_per_s);

        pause("30 s of writes at rest", REST_WINDOW).await?;
        let (m3, a3) = (
            ControllerCounters::read(&admin).await?,
            apiserver_writes(client, &counted).await?,
        );
        let rss_settled = rss_kib(pid);
        println!(
            "(d) controller RSS: idle {}, at {n} apps {}, after settling {}",
            mib(rss_idle),
            mib(rss_n),
            mib(rss_settled)
        );
        print_cluster_rss();
        let at_rest = m3.since(&m2);
        println!(
            "(e) writes at rest over {} s: controller-counted {:.0} ({}); API server {}",
            REST_WINDOW.as_secs(),
            at_rest.writes_total(),
            at_rest.writes_breakdown(),
            describe_counts(&counts_since(&a3, &a2)),
        );
        controller.kill().await?;

        if self.args.suspended {
            self.restart_figures(&a3).await?;
        }
        Ok(OperatorRun { total })
    }

    /// Materialisation and settle phases: calls per reconcile, writes per app, and the limit.
    #[allow(clippy::too_many_arguments)]
    fn print_cost(
        &self,
        m0: &ControllerCounters,
        m1: &ControllerCounters,
        m2: &ControllerCounters,
        a0: &BTreeMap<String, f64>,
        a1: &BTreeMap<String, f64>,
        a2: &BTreeMap<String, f64>,
        apps_per_s: f64,
    ) {
        let n = self.n() as f64;
        let sources = self.spread.sources(self.n());
        let needed = WRITES_PER_APP_UNSHARED + sources as f64 / n;
        for (phase, later, earlier, a_later, a_earlier) in
            [("materialisation", m1, m0, a1, a0), ("settle", m2, m1, a2, a1)]
        {
            let delta = later.since(earlier);
            let request_writes = delta
                .request_writes()
                .map(|w| format!("{:.2}", w / n))
                .unwrap_or_else(|| "n/a".to_owned());
            println!(
                "(f) {phase}: {:.0} reconciles; calls per reconcile {}; controller writes per app: {request_writes} \
                 (all requests that write), {:.2} (vworkspace_api_writes_total: {}); API server writes {}",
                delta.runs,
                delta.calls_per_reconcile(),
                delta.writes_total() / n,
                delta.writes_breakdown(),
                describe_counts(&counts_since(a_later, a_earlier)),
            );
        }
        let whole = m2.since(m0);
        let api_whole: f64 = counts_since(a2, a0).values().sum();
        let measured = whole
            .request_writes()
            .map(|w| format!("{:.2}", 1.0 + w / n))
            .unwrap_or_else(|| "n/a".to_owned());
        println!(
            "(f) writes per app: needed {needed:.2} (create, {}, status, + {sources} shared sources / {n:.0} apps); \
             measured {measured} (1 create + the controller's writing requests, both phases); \
             API server on {} {:.2} (includes the engine's own writes there)",
            self.args.engine.object(),
            self.args.engine.counted_resources().map(|(_, r)| r).join("/"),
            api_whole / n,
        );
        let Some(limit) = self.limit else {
            return;
        };
        let bound = limit.raw_creates_per_s / needed;
        println!(
            "(a) limit: API server raw {:.0} creates/s / {needed:.2} writes per app = {bound:.1} apps/s at most; \
             materialisation {apps_per_s:.1} apps/s = {:.0} % of it",
            limit.raw_creates_per_s,
            apps_per_s / bound * 100.0
        );
        let custom_bound = limit.raw_custom_applies_per_s / needed;
        println!(
            "(a) limit by custom resource applies: {:.0} applies/s / {needed:.2} writes per app = {custom_bound:.1} \
             apps/s at most; materialisation {apps_per_s:.1} apps/s = {:.0} % of it",
            limit.raw_custom_applies_per_s,
            apps_per_s / custom_bound * 100.0
        );
    }

    /// Restarts the controller on the settled apps: time until it has reconciled every app
    /// once, with what it wrote meanwhile (nothing, for unchanged apps).
    async fn restart_figures(&self, a_before: &BTreeMap<String, f64>) -> anyhow::Result<()> {
        let n = self.n();
        let counted = self.args.engine.counted_resources();
        let start = Instant::now();
        let (mut controller, admin, pid) = self.start_controller("bench-app-controller-restarted").await?;
        let mut last = ControllerCounters::default();
        wait_until(
            "the restarted controller to reconcile every app",
            self.args.timeout(),
            async || {
                last = ControllerCounters::read(&admin).await?;
                Ok(last.runs >= n as f64)
            },
        )
        .await?;
        let caught_up = start.elapsed();
        let a_after = apiserver_writes(&self.client, &counted).await?;
        println!(
            "(g) restarted controller caught up (reconcile runs >= {n}) after {:.1}s ({:.0} runs); \
             calls per reconcile {}; controller writes meanwhile {:.0} ({}); API server {}; RSS {}",
            caught_up.as_secs_f64(),
            last.runs,
            last.calls_per_reconcile(),
            last.writes_total(),
            last.writes_breakdown(),
            describe_counts(&counts_since(&a_after, a_before)),
            mib(rss_kib(pid)),
        );
        controller.kill().await?;
        Ok(())
    }

    /// The engine alone: `objects` (from the operator's run) applied directly into freshly
    /// created namespaces, with no operator running. Time until every engine object is ready.
    async fn engine_side(&self, objects: &[(ApiResource, DynamicObject)]) -> anyhow::Result<Duration> {
        let client = &self.client;
        create_namespaces(client, &self.spread).await?;
        // The HelmReleases name the release ServiceAccount (as the operator's do); Flux's
        // lockdown gives a HelmRelease no rights without it. Argo CD impersonates it too.
        for ns in &self.spread.namespaces {
            e2e::flux::grant_release(client, ns).await?;
        }
        let tracker = self.engine_tracker();
        let start = Instant::now();
        let kinds = self.args.engine.written_kinds();
        // Sources first, as the operator writes them.
        for kind in &kinds {
            stream::iter(objects.iter().filter(|(ar, _)| ar.kind == kind.kind))
                .map(|(ar, obj)| {
                    let api: Api<DynamicObject> =
                        Api::namespaced_with(client.clone(), &obj.namespace().unwrap_or_default(), ar);
                    async move {
                        api.patch(
                            &obj.name_any(),
                            &PatchParams::apply("bench-baseline").force(),
                            &Patch::Apply(obj),
                        )
                        .await
                    }
                })
                .buffer_unordered(CREATE_CONCURRENCY)
                .try_collect::<Vec<_>>()
                .await?;
        }
        let n = self.n();
        wait_until(
            &format!("every {} applied directly to be ready", self.args.engine.object()),
            self.args.timeout(),
            async || Ok(tracker.ever_held(0) >= n),
        )
        .await?;
        Ok(start.elapsed())
    }

    async fn clear(&self) -> anyhow::Result<()> {
        let cleared = clear_bench_namespaces(&self.client, self.args.engine, self.args.timeout()).await?;
        println!("    (cleared: {cleared}; load {})", load_average());
        Ok(())
    }
}

/// RSS of the API server and etcd (of this cluster), for the record.
fn print_cluster_rss() {
    let rss = |name| mib(cluster_component_pid(name).and_then(rss_kib));
    println!(
        "    kube-apiserver RSS {}, etcd RSS {}",
        rss("kube-apiserver"),
        rss("etcd")
    );
}

fn median(sorted: &[f64]) -> f64 {
    percentile(sorted, 0.5)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Arguments first: `--help` and a bad flag answer outside the cluster's netns too.
    let args = Args::parse();
    assert_loopback_only();
    let client = client().await?;
    let n = args.apps;
    let engine = args.engine;
    let spread = Arc::new(Spread::new(args.namespaces, args.repositories));
    let mode = if args.suspended {
        "suspended (materialisation only)"
    } else {
        "full (real Helm installs)"
    };
    let concurrency = args.controller_concurrency();
    println!(
        "bench-app: {n} ApplicationInstances, {mode}, engine {}, over {} namespaces and {} repository URLs \
         ({} namespace/repository pairs), controller --concurrency {concurrency}, finalizer {}, phase timeout {}s; \
         load {}",
        engine.product(),
        spread.namespaces.len(),
        spread.repositories,
        spread.sources(n),
        if args.no_admission_finalizer {
            "added by the controller (--no-admission-finalizer)"
        } else {
            "set at admission (deploy/components/admission-finalizer, bound to the benchmark's namespaces)"
        },
        args.timeout().as_secs(),
        load_average()
    );

    let mut controller_args: Vec<String> = [
        "--concurrency",
        &concurrency.to_string(),
        "--log-filter",
        &args.controller_log_filter,
        "--allowed-namespaces",
        &spread.namespaces.join(","),
        // The bench charts are served over plain http on 127.0.0.1 (e2e::CHART_REPO).
        "--insecure-repository-hosts",
        "127.0.0.1",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    if engine == EngineChoice::Argocd {
        // Argo CD running (`hack/cluster.sh start-argocd`, sync impersonation on) and the app
        // controller's Role in Argo CD's namespace, as the e2e tests have them.
        e2e::argocd::require_argocd().await?;
        controller_args.extend(
            [
                "--engines",
                "flux,argocd",
                "--default-engine",
                "argocd",
                "--argocd-namespace",
                argocd::DEFAULT_NAMESPACE,
            ]
            .map(str::to_owned),
        );
    }
    let mut bench = Bench {
        client: client.clone(),
        spread,
        controller_args,
        limit: None,
        args,
    };
    // A previous run's apps (kept for inspection) and anything else of ours go first.
    bench.clear().await?;
    // The limit bounds materialisation alone; with real installs, Helm's work shares the
    // API server with it, so a fraction of the limit would say little there.
    if bench.args.suspended {
        bench.limit = Some(measure_limit(&client, &bench.spread).await?);
    } else {
        println!("(a) limit: measured in the materialisation-only runs (--suspended), not with real installs");
    }

    let pairs = if bench.args.suspended || bench.args.skip_baseline {
        0
    } else {
        bench.args.pairs.max(1)
    };
    if pairs == 0 {
        bench.operator_side(true).await?;
        println!(
            "bench-app done ({n} apps kept in bench-app-* for inspection; the next run or `just cluster-down` clears them); load {}",
            load_average()
        );
        return Ok(());
    }

    let mut results: Vec<(f64, f64)> = Vec::new();
    for pair in 1..=pairs {
        println!("--- pair {pair}/{pairs}: operator");
        let run = bench.operator_side(pair == 1).await?;
        let op_total = run.total.context("operator side without a total")?;
        let objects = snapshot_engine_objects(&client, engine, &bench.spread).await?;
        bench.clear().await?;
        println!(
            "--- pair {pair}/{pairs}: {} alone ({} objects the operator wrote, applied directly)",
            engine.product(),
            objects.len()
        );
        let alone = bench.engine_side(&objects).await?;
        bench.clear().await?;
        let overhead = (op_total.as_secs_f64() - alone.as_secs_f64()) / alone.as_secs_f64() * 100.0;
        println!(
            "(b) pair {pair}: operator {:.1}s, {} alone {:.1}s, overhead {overhead:+.1}%",
            op_total.as_secs_f64(),
            engine.product(),
            alone.as_secs_f64()
        );
        results.push((op_total.as_secs_f64(), alone.as_secs_f64()));
    }
    let mut overheads: Vec<f64> = results.iter().map(|(o, f)| (o - f) / f * 100.0).collect();
    overheads.sort_by(f64::total_cmp);
    println!("(b) all {n} Ready, operator vs {} alone, by pair:", engine.product());
    for (i, (o, f)) in results.iter().enumerate() {
        println!(
            "      pair {}: operator {o:.1}s, {} alone {f:.1}s, {:+.1}%",
            i + 1,
            engine.product(),
            (o - f) / f * 100.0
        );
    }
    println!(
        "(b) operator overhead: median {:+.1}%, spread {:+.1}% .. {:+.1}% over {} pairs",
        median(&overheads),
        overheads.first().copied().unwrap_or(f64::NAN),
        overheads.last().copied().unwrap_or(f64::NAN),
        overheads.len()
    );
    println!("bench-app done (benchmark namespaces cleared); load {}", load_average());
    Ok(())
}
