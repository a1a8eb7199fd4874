//! `bench-agent`: connectivity-agent figures (printed, never asserted).
//!
//! ```text
//! bench-agent [--part all|latency|fleet] [--ops 60] [--apps 10] [--op-interval-ms 300] [--no-compare]
//!             [--agents 1000] [--fleet-window-secs 120] [--sync-interval-secs 30] [--objects 5]
//!             [--client-per-agent]
//! ```
//!
//! **(a) Latency**, on the real local cluster (inside its netns): `odoo-sim`, the real
//! `agent` (pull mode, `--sync-interval 30s` so periodic syncs cannot explain the figures,
//! default `--report-delay`), the app-controller and the runbook-engine publishing to the
//! agent's gRPC status channel. `--apps` ApplicationInstances install `demo-app` through
//! Flux (progressing → ready) and `--ops` Runbook Operations (pending → running →
//! succeeded) are created one every `--op-interval-ms`. A client-side watch records each
//! status change (a version of an object whose state differs from the previous one's) with
//! its `resourceVersion` and the wall-clock instant it was seen; the simulator's report log
//! records when it received each report. Latency = first receipt of that version or a
//! newer one − seen, same clock.
//! The run is repeated with `--status-channel-addr off` (watches only) unless
//! `--no-compare`. The agent's RSS is sampled throughout.
//!
//! Every process listens on a free loopback port picked at run time (so the benchmark runs
//! beside `just demo`), and every wait stops with a process's log as soon as it exits.
//!
//! **(b) Fleet**, no cluster needed: one `odoo-sim` process with `--agents` cluster records
//! (one API key each, one application intent each), and as many lightweight agents as
//! tasks of this process, each speaking the real protocol through the agent's own
//! [`ControlPlaneClient`]: `agent_register`, a first `agent_sync` with a full resync of
//! `--objects` reports, the acknowledgement of the document it receives, then one
//! `agent_sync` every `--sync-interval-secs` at rest. Start times are spread uniformly
//! over the first interval. After that ramp, the simulator's own counters over
//! `--fleet-window-secs` give requests/s and bytes per sync at rest; this process's RSS
//! gives the memory per simulated agent.
//!
//! Environment defaults (flags win): `BENCH_AGENT_AGENTS`, `BENCH_AGENT_FLEET_WINDOW_SECS`,
//! `BENCH_AGENT_OPS`; `BENCH_AGENT_AGENT_LOG` is the agent's `--log-filter` (`info`).

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use agent::client::{ClientConfig, ControlPlaneClient};
use anyhow::{Context as _, bail};
use api::{ApplicationInstance, Operation};
use controller_kit::Redacted;
use e2e::{
    agent::http,
    apps::app,
    assert_loopback_only,
    bench::{check_processes, cpu_seconds, describe_ms, pause, percentile, recreate_namespace, rss_kib, wait_until},
    client, cluster_dir,
    deploy::{SYSTEM_NAMESPACE, http_get, metric_sum},
    ops::operation,
    process::{ControllerProcess, binary_path, free_loopback_addr, retry_address_race},
};
use futures::{StreamExt, TryStreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use odoo_sim::{ReceivedReport, SimStats};
use protocol::{
    METHOD_REGISTER, METHOD_SYNC, PROTOCOL_VERSION,
    messages::{
        AgentInfo, AgentMode, ClusterIdentity, Cursor, DocumentAck, DocumentOutcome, ObjectAck, ObjectKind,
        ObjectOutcome, ObjectReport, ObjectState, RegisterParams, ReportCondition, ResyncMarker, SyncParams,
        SyncResult,
    },
};
use serde_json::{Value, json};

const FIELD_MANAGER: &str = "bench-agent";
/// The scope of the processes this benchmark starts.
const SCOPE: &str = "bench-agent";
/// The Operations' application (suspended: a Runbook needs only the object).
const HOST_APP: &str = "host";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    All,
    Latency,
    Fleet,
}

struct Args {
    part: Part,
    ops: usize,
    apps: usize,
    op_interval: Duration,
    compare: bool,
    agents: usize,
    fleet_window: Duration,
    sync_interval: Duration,
    objects: usize,
    client_per_agent: bool,
    timeout: Duration,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        part: Part::All,
        ops: env_or("BENCH_AGENT_OPS", 60),
        apps: 10,
        op_interval: Duration::from_millis(300),
        compare: true,
        agents: env_or("BENCH_AGENT_AGENTS", 1000),
        fleet_window: Duration::from_secs(env_or("BENCH_AGENT_FLEET_WINDOW_SECS", 120)),
        sync_interval: Duration::from_secs(30),
        objects: 5,
        client_per_agent: false,
        timeout: Duration::from_secs(600),
    };
    let mut it = std::env::args().skip(1);
    let secs = |v: Option<String>, flag: &str| -> anyhow::Result<Duration> {
        Ok(Duration::from_secs(v.with_context(|| format!("{flag} N"))?.parse()?))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--part" => {
                args.part = match it.next().as_deref() {
                    Some("all") => Part::All,
                    Some("latency") => Part::Latency,
                    Some("fleet") => Part::Fleet,
                    other => bail!("--part all|latency|fleet, not {other:?}"),
                }
            }
            "--ops" => args.ops = it.next().context("--ops N")?.parse()?,
            "--apps" => args.apps = it.next().context("--apps N")?.parse()?,
            "--op-interval-ms" => {
                args.op_interval = Duration::from_millis(it.next().context("--op-interval-ms N")?.parse()?)
            }
            "--no-compare" => args.compare = false,
            "--agents" => args.agents = it.next().context("--agents N")?.parse()?,
            "--fleet-window-secs" => args.fleet_window = secs(it.next(), "--fleet-window-secs")?,
            "--sync-interval-secs" => args.sync_interval = secs(it.next(), "--sync-interval-secs")?,
            "--objects" => args.objects = it.next().context("--objects N")?.parse()?,
            "--client-per-agent" => args.client_per_agent = true,
            "--timeout-secs" => args.timeout = secs(it.next(), "--timeout-secs")?,
            other => bail!("unknown argument {other}"),
        }
    }
    anyhow::ensure!(args.ops > 0 && args.agents > 0, "--ops and --agents must be positive");
    anyhow::ensure!(args.objects >= 1, "--objects must be at least 1");
    anyhow::ensure!(
        args.sync_interval >= Duration::from_secs(1),
        "--sync-interval-secs must be at least 1"
    );
    Ok(args)
}

// ---------------------------------------------------------------------------------------
// The simulator as a process.
// ---------------------------------------------------------------------------------------

struct Sim {
    process: ControllerProcess,
    url: String,
}

impl Sim {
    /// Starts `odoo-sim serve` on a free port (another one if it lost the race for it),
    /// with one cluster record when `cluster` is given, and waits for it to answer.
    async fn start(log_name: &str, cluster: Option<(&str, &PathBuf)>) -> anyhow::Result<Self> {
        let key_file = cluster.map(|(_, f)| f.to_string_lossy().into_owned());
        retry_address_race(async || {
            let listen = free_loopback_addr()?.to_string();
            let mut args = vec!["serve", "--listen", listen.as_str()];
            if let (Some((name, _)), Some(file)) = (cluster, key_file.as_deref()) {
                args.extend(["--cluster", name, "--api-key-file", file]);
            }
            let process = ControllerProcess::start(SCOPE, "odoo-sim", log_name, &args, &[("RUST_LOG", "warn")]).await?;
            process
                .wait_http_ok(&listen, "/sim/health", Duration::from_secs(20))
                .await?;
            Ok(Self {
                process,
                url: format!("http://{listen}"),
            })
        })
        .await
    }

    async fn admin(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let (status, text) = http(&self.url, method, path, body).await?;
        anyhow::ensure!((200..300).contains(&status), "{method} {path}: HTTP {status}: {text}");
        Ok(serde_json::from_str(&text)?)
    }

    async fn stats(&self) -> anyhow::Result<SimStats> {
        Ok(serde_json::from_value(self.admin("GET", "/sim/stats", None).await?)?)
    }

    async fn report_log(&self, cluster: &str) -> anyhow::Result<Vec<ReceivedReport>> {
        let v = self
            .admin("GET", &format!("/sim/clusters/{cluster}/report-log"), None)
            .await?;
        Ok(serde_json::from_value(v["entries"].clone())?)
    }

    fn pid(&self) -> Option<u32> {
        self.process.pid()
    }
}

fn work_dir() -> anyhow::Result<PathBuf> {
    let dir = cluster_dir().join("bench-agent");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn api_key(tag: &str) -> String {
    format!("vwsbench{tag}{:016x}", fastrand::u64(..))
}

// ---------------------------------------------------------------------------------------
// (a) Latency: status change in the cluster → the simulator has it.
// ---------------------------------------------------------------------------------------

/// One status change seen by the watch: the object's state changed in this version.
#[derive(Clone, Copy, Debug)]
struct Change {
    /// Its `resourceVersion` (etcd's revision: versions of one object compare as numbers).
    rv: u64,
    state: ObjectState,
    /// Wall-clock instant the watch delivered it.
    at: Timestamp,
}

/// The status changes of each `Kind/namespace/name`, in order.
type Seen = Arc<Mutex<HashMap<String, Vec<Change>>>>;

fn spawn_state_watch<K>(api: Api<K>, kind: &'static str, state: fn(&K) -> ObjectState, seen: Seen)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(object)) = events.next().await {
            let at = Timestamp::now();
            let key = format!(
                "{kind}/{}/{}",
                object.namespace().unwrap_or_default(),
                object.name_any()
            );
            let rv = rv_number(object.resource_version().as_deref());
            let state = state(&object);
            let mut seen = seen.lock().expect("lock");
            let changes = seen.entry(key).or_default();
            if changes.last().is_none_or(|c| c.state != state && c.rv < rv) {
                changes.push(Change { rv, state, at });
            }
        }
    });
}

fn rv_number(rv: Option<&str>) -> u64 {
    rv.and_then(|v| v.parse().ok()).unwrap_or_default()
}

fn state_name(s: ObjectState) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn runbook_job() -> Value {
    json!({
        "backoffLimit": 0,
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["true"]}]}}
    })
}

struct LatencyRun {
    label: &'static str,
    /// Latencies in ms, ascending, all samples.
    all: Vec<f64>,
    /// The same per kind of change.
    by_state: BTreeMap<String, Vec<f64>>,
    /// Changes the agent never sent as such: superseded within its batching delay, they
    /// went up as the newer version (counted in the latencies with it).
    coalesced: usize,
    /// The slowest changes above 1 s, explained: what the watch saw and the simulator got.
    outliers: Vec<String>,
    /// Changes whose final state never reached the simulator.
    missing: usize,
    rss_idle: u64,
    rss_peak: u64,
    rss_rest: u64,
    syncs: f64,
    reports: f64,
    channel_events: f64,
    duration: Duration,
}

fn agent_has_status_channel_flag() -> bool {
    std::process::Command::new(binary_path("agent"))
        .arg("--help")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("--status-channel-addr"))
        .unwrap_or(false)
}

async fn agent_metric(admin: &str, metric: &str, labels: &[&str]) -> f64 {
    match http_get(admin, "/metrics").await {
        Ok(text) => metric_sum(&text, metric, labels),
        Err(_) => f64::NAN,
    }
}

async fn delete_namespace(client: &Client, ns: &str, timeout: Duration) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    if api.get_opt(ns).await?.is_some() {
        api.delete(ns, &DeleteParams::default()).await?;
    }
    let deadline = Instant::now() + timeout;
    while api.get_opt(ns).await?.is_some() {
        if Instant::now() > deadline {
            println!("  (namespace {ns} still terminating after {timeout:?}; left to the API server)");
            return Ok(());
        }
        // Its finalizers need the controllers this benchmark started.
        check_processes(&format!("namespace {ns} to be deleted"))?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

async fn latency_run(client: &Client, args: &Args, channel: bool) -> anyhow::Result<LatencyRun> {
    let label = if channel {
        "status channel on"
    } else {
        "status channel off (watches only)"
    };
    let tag = if channel { "on" } else { "off" };
    let ns = format!("bench-agent-{tag}");
    let cluster = format!("bench-agent-{tag}");
    println!(
        "(a) {label}: {} ApplicationInstances + {} Runbook Operations in {ns}",
        args.apps, args.ops
    );

    // The app-controller first, so a previous run's apps (with finalizers) can go away.
    // The publishers need the agent's status channel address before the agent starts: a
    // free port now; should another process take it meanwhile, the agent exits saying so.
    let channel_addr = free_loopback_addr()?.to_string();
    let endpoint = format!("http://{channel_addr}");
    // The publishers: confined to the run's namespace, publishing to the agent's channel.
    let publisher_args = |admin: &str| {
        let mut a = vec![
            "--watch-namespace".to_owned(),
            ns.clone(),
            "--allowed-namespaces".to_owned(),
            ns.clone(),
            "--admin-addr".to_owned(),
            admin.to_owned(),
            "--log-filter".to_owned(),
            "warn".to_owned(),
        ];
        if channel {
            a.extend(["--status-channel-endpoint".to_owned(), endpoint.clone()]);
        }
        a
    };
    // Port 0: the kernel picks a free one; nothing here reads this controller's metrics.
    let mut controller_args = publisher_args("127.0.0.1:0");
    // The bench charts are served over plain http on 127.0.0.1 (e2e::CHART_REPO).
    controller_args.extend(["--insecure-repository-hosts".to_owned(), "127.0.0.1".to_owned()]);
    let controller_args: Vec<&str> = controller_args.iter().map(String::as_str).collect();
    let controller = ControllerProcess::start(
        SCOPE,
        "app-controller",
        &format!("bench-agent-app-controller-{tag}"),
        &controller_args,
        &[],
    )
    .await?;
    recreate_namespace(client, &ns).await?;
    let apps: Api<ApplicationInstance> = Api::namespaced(client.clone(), &ns);
    let mut host = app(HOST_APP, "demo-app", "0.1.0", json!({}));
    host.spec.suspend = true;
    let body = json!({"apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance",
        "metadata": {"name": HOST_APP}, "spec": host.spec});
    apps.patch(
        HOST_APP,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;

    let dir = work_dir()?;
    let key_file = dir.join(format!("api-key-{tag}"));
    std::fs::write(&key_file, api_key(tag))?;
    let sim = Sim::start(&format!("bench-agent-odoo-sim-{tag}"), Some((&cluster, &key_file))).await?;

    let key = key_file.to_string_lossy().into_owned();
    let configmap = format!("bench-agent-status-{tag}");
    // The agent's log filter (its log: <cluster dir>/logs/bench-agent-agent-<on|off>.log).
    let agent_log = std::env::var("BENCH_AGENT_AGENT_LOG").unwrap_or_else(|_| "info".to_owned());
    let has_flag = agent_has_status_channel_flag();
    if channel && !has_flag {
        println!("  (this agent has no --status-channel-addr yet: the run measures its watches only)");
    }
    let agent_args = |admin: &str| {
        let mut a: Vec<String> = [
            "--control-plane-url",
            sim.url.as_str(),
            "--insecure-allow-http",
            "--api-key-file",
            key.as_str(),
            "--cluster-name",
            cluster.as_str(),
            "--watch-namespace",
            ns.as_str(),
            "--allowed-namespaces",
            ns.as_str(),
            "--admin-addr",
            admin,
            "--sync-interval",
            "30s",
            "--status-configmap",
            configmap.as_str(),
            "--log-filter",
            agent_log.as_str(),
        ]
        .map(str::to_owned)
        .to_vec();
        if has_flag {
            a.extend([
                "--status-channel-addr".to_owned(),
                if channel {
                    channel_addr.clone()
                } else {
                    "off".to_owned()
                },
            ]);
        }
        a
    };
    let (agent, agent_admin) = ControllerProcess::start_with_admin(
        SCOPE,
        "agent",
        &format!("bench-agent-agent-{tag}"),
        agent_args,
        &[("POD_NAMESPACE", SYSTEM_NAMESPACE)],
    )
    .await?;
    let pid = agent.pid().context("agent pid")?;
    // Ready = watches listed and the first sync succeeded.
    agent
        .wait_http_ok(&agent_admin, "/readyz", Duration::from_secs(90))
        .await?;

    let (engine, engine_admin) = ControllerProcess::start_with_admin(
        SCOPE,
        "runbook-engine",
        &format!("bench-agent-runbook-engine-{tag}"),
        |admin| {
            let mut a = publisher_args(admin);
            a.extend(["--concurrency".to_owned(), "16".to_owned()]);
            a
        },
        &[],
    )
    .await?;
    engine
        .wait_http_ok(&engine_admin, "/readyz", Duration::from_secs(60))
        .await?;
    // Let the publishers connect and the host app's status settle.
    pause("the publishers to connect", Duration::from_secs(3)).await?;
    let rss_idle = rss_kib(pid).unwrap_or_default();
    let syncs_before = agent_metric(
        &agent_admin,
        "vworkspace_agent_control_plane_calls_total",
        &["result=\"ok\""],
    )
    .await;
    let reports_before = agent_metric(&agent_admin, "vworkspace_agent_reports_sent_total", &[]).await;

    let seen: Seen = Arc::default();
    spawn_state_watch(
        apps.clone(),
        "ApplicationInstance",
        protocol::report::application_state,
        seen.clone(),
    );
    let ops: Api<Operation> = Api::namespaced(client.clone(), &ns);
    spawn_state_watch(
        ops.clone(),
        "Operation",
        protocol::report::operation_state,
        seen.clone(),
    );
    let peak = Arc::new(AtomicU64::new(rss_idle));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                if let Some(rss) = rss_kib(pid) {
                    peak.fetch_max(rss, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    let start = Instant::now();
    let app_names: Vec<String> = (0..args.apps).map(|i| format!("app-{i:03}")).collect();
    let op_names: Vec<String> = (0..args.ops).map(|i| format!("rb-{i:04}")).collect();
    stream::iter(app_names.clone())
        .map(|name| {
            let apps = apps.clone();
            async move {
                let a = app(&name, "demo-app", "0.1.0", json!({"replicaCount": 0}));
                let body = json!({"apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance",
                    "metadata": {"name": name}, "spec": a.spec});
                apps.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<_>>()
        .await?;
    let mut pace = tokio::time::interval(args.op_interval);
    for name in &op_names {
        pace.tick().await;
        let body = operation(name, HOST_APP, "Runbook", json!({"job": runbook_job()}));
        ops.patch(name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&body))
            .await?;
    }

    // Final states: every app Ready, every Operation terminal, as the watch sees them.
    let final_keys: Vec<(String, Vec<ObjectState>)> = app_names
        .iter()
        .map(|n| (format!("ApplicationInstance/{ns}/{n}"), vec![ObjectState::Ready]))
        .chain(op_names.iter().map(|n| {
            (
                format!("Operation/{ns}/{n}"),
                vec![ObjectState::Succeeded, ObjectState::Failed, ObjectState::Expired],
            )
        }))
        .collect();
    let reached = |seen: &HashMap<String, Vec<Change>>, key: &str, states: &[ObjectState]| {
        seen.get(key)
            .is_some_and(|changes| changes.iter().any(|c| states.contains(&c.state)))
    };
    wait_until(
        "every app Ready and every Operation terminal",
        args.timeout,
        async || {
            let seen = seen.lock().expect("lock");
            Ok(final_keys.iter().all(|(k, states)| reached(&seen, k, states)))
        },
    )
    .await?;
    // The simulator must have every final state (at most one periodic sync later).
    let deadline = Instant::now() + args.sync_interval + Duration::from_secs(5);
    let log = loop {
        let log = sim.report_log(&cluster).await?;
        let received: std::collections::HashSet<(&str, ObjectState)> =
            log.iter().map(|e| (e.key.as_str(), e.state)).collect();
        let all = final_keys
            .iter()
            .all(|(k, states)| states.iter().any(|s| received.contains(&(k.as_str(), *s))));
        if all || Instant::now() > deadline {
            break log;
        }
        check_processes("the simulator to receive every final state")?;
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let duration = start.elapsed();
    let syncs = agent_metric(
        &agent_admin,
        "vworkspace_agent_control_plane_calls_total",
        &["result=\"ok\""],
    )
    .await
        - syncs_before;
    let reports = agent_metric(&agent_admin, "vworkspace_agent_reports_sent_total", &[]).await - reports_before;
    let channel_events = agent_metric(&agent_admin, "vworkspace_agent_status_channel_events_total", &[]).await;

    // At rest: what the agent holds once nothing moves.
    pause("10 s at rest", Duration::from_secs(10)).await?;
    let rss_rest = rss_kib(pid).unwrap_or_default();
    sampler.abort();

    let measured = |key: &str| {
        let name = key.rsplit('/').next().unwrap_or_default();
        app_names.iter().chain(&op_names).any(|n| n == name)
    };
    let seen = seen.lock().expect("lock").clone();
    let (mut all, mut by_state, mut coalesced) = (Vec::new(), BTreeMap::<String, Vec<f64>>::new(), 0);
    let mut slow: Vec<(f64, String, ObjectState)> = Vec::new();
    for (key, changes) in seen.iter().filter(|(k, _)| measured(k)) {
        let received: Vec<(u64, Timestamp)> = log
            .iter()
            .filter(|e| &e.key == key)
            .map(|e| (rv_number(e.resource_version.as_deref()), e.received_at))
            .collect();
        for (i, change) in changes.iter().enumerate() {
            // Delivered when the simulator has this version or a newer one: a state
            // superseded within the agent's batching delay goes up as the newer version
            // (latest wins), and counts as delivered then.
            let Some(delivered) = received
                .iter()
                .filter(|(rv, _)| *rv >= change.rv)
                .map(|(_, at)| *at)
                .min()
            else {
                continue;
            };
            let next = changes.get(i + 1).map_or(u64::MAX, |c| c.rv);
            if !received.iter().any(|(rv, _)| (change.rv..next).contains(rv)) {
                coalesced += 1;
            }
            let ms = delivered.duration_since(change.at).as_secs_f64() * 1000.0;
            all.push(ms);
            if ms > 1000.0 {
                slow.push((ms, key.clone(), change.state));
            }
            let kind = key.split('/').next().unwrap_or_default();
            by_state
                .entry(format!("{kind} {}", state_name(change.state)))
                .or_default()
                .push(ms);
        }
    }
    slow.sort_by(|a, b| b.0.total_cmp(&a.0));
    let outliers = slow
        .iter()
        .take(5)
        .map(|(ms, key, state)| {
            let changes = seen.get(key).map(Vec::as_slice).unwrap_or_default();
            let t0 = changes.first().map_or_else(Timestamp::now, |c| c.at);
            let rel = |t: Timestamp| t.duration_since(t0).as_secs_f64() * 1000.0;
            let watched: Vec<String> = changes
                .iter()
                .map(|c| format!("{}@{:.0}(rv {})", state_name(c.state), rel(c.at), c.rv))
                .collect();
            let got: Vec<String> = log
                .iter()
                .filter(|e| &e.key == key)
                .map(|e| {
                    format!(
                        "{}@{:.0}(rv {})",
                        state_name(e.state),
                        rel(e.received_at),
                        e.resource_version.as_deref().unwrap_or("-")
                    )
                })
                .collect();
            format!(
                "{key} {}: {ms:.0} ms; watch saw [{}], the simulator got [{}] (ms from the first change)",
                state_name(*state),
                watched.join(", "),
                got.join(", ")
            )
        })
        .collect();
    let missing = {
        let received: std::collections::HashSet<(&str, ObjectState)> =
            log.iter().map(|e| (e.key.as_str(), e.state)).collect();
        final_keys
            .iter()
            .filter(|(k, states)| !states.iter().any(|s| received.contains(&(k.as_str(), *s))))
            .count()
    };
    all.sort_by(f64::total_cmp);
    for v in by_state.values_mut() {
        v.sort_by(f64::total_cmp);
    }

    // Clean up with the controllers still running (the apps' finalizers uninstall them).
    drop(agent);
    drop(sim);
    delete_namespace(client, &ns, Duration::from_secs(120)).await?;
    drop(engine);
    drop(controller);
    Ok(LatencyRun {
        label,
        all,
        by_state,
        coalesced,
        outliers,
        missing,
        rss_idle,
        rss_peak: peak.load(Ordering::Relaxed),
        rss_rest,
        syncs,
        reports,
        channel_events,
        duration,
    })
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn print_latency(run: &LatencyRun) {
    println!("  [{}]", run.label);
    println!(
        "    status change seen in the cluster → received by the simulator: {} (target p99 < 2 s: {})",
        describe_ms(&run.all),
        if percentile(&run.all, 0.99) < 2000.0 {
            "met"
        } else {
            "NOT met"
        }
    );
    if let Some(min) = run.all.first() {
        println!(
            "    (min {min:.1} ms: the bench's watch and the agent's see the same API server events; below 0, the \
             agent was first)"
        );
    }
    for (state, v) in &run.by_state {
        println!(
            "      {state:<32} n {:>3}, p50 {:>5.0} ms, p99 {:>5.0} ms",
            v.len(),
            percentile(v, 0.5),
            percentile(v, 0.99)
        );
    }
    for o in &run.outliers {
        println!("      slow: {o}");
    }
    println!(
        "    states superseded within the batching delay (delivered as the newer state, counted above): {}; final states never received: {}",
        run.coalesced, run.missing
    );
    println!(
        "    agent: {:.0} successful calls carrying {:.0} reports in {:.1} s ({:.1} reports per call); status-channel events {}",
        run.syncs,
        run.reports,
        run.duration.as_secs_f64(),
        run.reports / run.syncs.max(1.0),
        if run.channel_events.is_nan() || run.channel_events == 0.0 {
            "0 / not served".to_owned()
        } else {
            format!("{:.0}", run.channel_events)
        }
    );
    println!(
        "    agent RSS: idle {:.1} MiB, peak {:.1} MiB, at rest after {:.1} MiB (target ≤ 30 MB = 28.6 MiB: {})",
        mib(run.rss_idle),
        mib(run.rss_peak),
        mib(run.rss_rest),
        if run.rss_peak * 1024 <= 30_000_000 {
            "within"
        } else {
            "ABOVE"
        }
    );
}

// ---------------------------------------------------------------------------------------
// (b) Fleet: many simulated agents against one simulator.
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct FleetCounters {
    registered: AtomicU64,
    synced: AtomicU64,
    acknowledged: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    /// (when, round trip in ms) of every successful sync.
    round_trips: Mutex<Vec<(Instant, f32)>>,
}

impl FleetCounters {
    fn error(&self, reason: &str) {
        *self.errors.lock().expect("lock").entry(reason.to_owned()).or_default() += 1;
    }
}

struct FleetAgent {
    index: usize,
    key: Redacted<String>,
    client: ControlPlaneClient,
    interval: Duration,
    objects: usize,
    counters: Arc<FleetCounters>,
}

const FLEET_NS: &str = "apps";
const FLEET_APP: &str = "app-0";

fn fleet_reports(index: usize, objects: usize, now: Timestamp) -> Vec<ObjectReport> {
    let created: Timestamp = "2026-11-21T09:00:00Z".parse().expect("timestamp");
    let base = |kind, name: String, state| ObjectReport {
        kind,
        namespace: FLEET_NS.into(),
        uid: Some(format!("{index:04}-{name}-5b1c0e7a-8d2f-4e3b-9a61")),
        name,
        state,
        generation: Some(1),
        observed_generation: None,
        resource_version: Some(format!("{}", 100_000 + index)),
        managed_by_agent: true,
        conditions: Vec::new(),
        phase: None,
        result: None,
        start_time: None,
        completion_time: None,
        request_id: None,
        deployed_chart_version: None,
        desired_chart_version: None,
        created_at: Some(created),
        observed_at: now,
    };
    let mut app = base(ObjectKind::ApplicationInstance, FLEET_APP.into(), ObjectState::Ready);
    app.observed_generation = Some(1);
    app.deployed_chart_version = Some("0.1.0".into());
    app.desired_chart_version = Some("0.1.0".into());
    app.conditions = vec![ReportCondition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: "InstallSucceeded".into(),
        message: "Helm install succeeded for release apps/app-0.v1 with chart demo-app@0.1.0".into(),
        last_transition_time: created,
        observed_generation: Some(1),
    }];
    let mut out = vec![app];
    for n in 1..objects {
        let mut op = base(ObjectKind::Operation, format!("backup-{n:02}"), ObjectState::Succeeded);
        op.phase = Some("Succeeded".into());
        op.start_time = Some(created);
        op.completion_time = Some(created);
        op.request_id = Some(format!("odoo-req-{index}-{n}"));
        out.push(op);
    }
    out
}

fn ack_of(doc: &protocol::DesiredState, index: usize) -> DocumentAck {
    DocumentAck {
        epoch: doc.epoch.clone(),
        revision: doc.revision,
        outcome: DocumentOutcome::Applied,
        reason: None,
        message: None,
        processed_at: Timestamp::now(),
        objects: doc
            .applications
            .iter()
            .map(|a| ObjectAck {
                kind: ObjectKind::ApplicationInstance,
                namespace: a.namespace.clone(),
                name: a.name.clone(),
                outcome: ObjectOutcome::Unchanged,
                reason: None,
                message: None,
                uid: Some(format!("{index:04}-{}-5b1c0e7a-8d2f-4e3b-9a61", a.name)),
                generation: Some(1),
                conflict: None,
            })
            .collect(),
    }
}

impl FleetAgent {
    /// What a real agent does, minus Kubernetes: register, full resync, acknowledge the
    /// document, then sync every interval with nothing to say.
    async fn run(self, start_after: Duration) {
        tokio::time::sleep(start_after).await;
        let started_at = Timestamp::now();
        let instance = format!("fleet-agent-{:04}-7d9f8b6c4-x2x9q", self.index);
        let register = RegisterParams {
            protocol_version: PROTOCOL_VERSION,
            cluster: ClusterIdentity {
                uid: format!("{:04}0000-1b2c-4d5e-8f90-a1b2c3d4e5f6", self.index),
                name: format!("fleet-{:04}", self.index),
            },
            agent: AgentInfo {
                version: env!("CARGO_PKG_VERSION").into(),
                instance: instance.clone(),
                mode: AgentMode::Pull,
                started_at,
            },
            allowed_namespaces: vec![FLEET_NS.into()],
            capabilities: vec!["conflict_report".into(), "deletions".into()],
        };
        let backoff = protocol::backoff::Backoff::default();
        let mut failures = 0u32;
        let mut registered = false;
        let mut known: Option<Cursor> = None;
        let mut acks: Vec<DocumentAck> = Vec::new();
        let mut resyncs = 0u32;
        let mut resync = true;
        loop {
            if !registered {
                match self.client.call(&self.key, METHOD_REGISTER, &register).await {
                    Ok(_) => {
                        registered = true;
                        self.counters.registered.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        self.counters.error(&format!("register: {}", e.reason()));
                        failures += 1;
                        tokio::time::sleep(backoff.delay(failures, fastrand::f64())).await;
                        continue;
                    }
                }
            }
            let marker = resync.then(|| {
                resyncs += 1;
                ResyncMarker {
                    id: format!("{instance}-{}-{resyncs}", started_at.as_millisecond()),
                    batch: 0,
                    last_batch: true,
                }
            });
            let params = SyncParams {
                protocol_version: PROTOCOL_VERSION,
                cluster_uid: register.cluster.uid.clone(),
                agent_instance: instance.clone(),
                known: known.clone(),
                acks: acks.clone(),
                reports: if resync {
                    fleet_reports(self.index, self.objects, Timestamp::now())
                } else {
                    Vec::new()
                },
                resync: marker,
                more: false,
                last_error: None,
            };
            let sent = Instant::now();
            let answer = match self.client.call(&self.key, METHOD_SYNC, &params).await {
                Ok(v) => v,
                Err(e) => {
                    self.counters.error(&format!("sync: {}", e.reason()));
                    failures += 1;
                    resync = true;
                    tokio::time::sleep(backoff.delay(failures, fastrand::f64())).await;
                    continue;
                }
            };
            self.counters
                .round_trips
                .lock()
                .expect("lock")
                .push((sent, sent.elapsed().as_secs_f32() * 1000.0));
            failures = 0;
            if resync {
                self.counters.synced.fetch_add(1, Ordering::Relaxed);
            }
            if !acks.is_empty() {
                self.counters.acknowledged.fetch_add(1, Ordering::Relaxed);
            }
            resync = false;
            acks.clear();
            match serde_json::from_value::<SyncResult>(answer) {
                Ok(result) => {
                    if let Some(doc) = result.desired
                        && known.as_ref() != Some(&doc.cursor())
                    {
                        // Applied (nothing to write: the fleet's clusters are as desired);
                        // the acknowledgement goes at once, as the agent does.
                        acks.push(ack_of(&doc, self.index));
                        known = Some(doc.cursor());
                        continue;
                    }
                }
                Err(_) => self.counters.error("sync: MalformedResult"),
            }
            tokio::time::sleep(self.interval).await;
        }
    }
}

fn client_config(url: &str) -> ClientConfig {
    ClientConfig {
        url: url.to_owned(),
        database: None,
        timeout: Duration::from_secs(15),
        max_response_bytes: 8 * 1024 * 1024,
        ca_bundle: None,
        insecure_allow_http: true,
    }
}

fn per_call(total: u64, calls: u64) -> f64 {
    total as f64 / calls.max(1) as f64
}

fn diff(a: &odoo_sim::CallCounters, b: &odoo_sim::CallCounters) -> odoo_sim::CallCounters {
    odoo_sim::CallCounters {
        calls: a.calls - b.calls,
        errors: a.errors - b.errors,
        request_body_bytes: a.request_body_bytes - b.request_body_bytes,
        request_header_bytes: a.request_header_bytes - b.request_header_bytes,
        response_body_bytes: a.response_body_bytes - b.response_body_bytes,
        response_header_bytes: a.response_header_bytes - b.response_header_bytes,
    }
}

async fn fleet(args: &Args) -> anyhow::Result<()> {
    let n = args.agents;
    let interval = args.sync_interval;
    println!(
        "(b) fleet: {n} simulated agents (tasks of this process, the agent's own client{}) against one odoo-sim, \
         sync interval {}s, {} objects each, window {}s after a {}s ramp",
        if args.client_per_agent {
            ", one client each"
        } else {
            ", one shared connection pool"
        },
        interval.as_secs(),
        args.objects,
        args.fleet_window.as_secs(),
        interval.as_secs() + 5
    );
    let sim = Sim::start("bench-agent-odoo-sim-fleet", None).await?;
    let sim_pid = sim.pid().context("odoo-sim pid")?;
    let keys: Vec<String> = (0..n).map(|i| api_key(&format!("f{i:04}"))).collect();
    let t = Instant::now();
    let records: Vec<Value> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| json!({"name": format!("fleet-{i:04}"), "api_key": k}))
        .collect();
    sim.admin("POST", "/sim/clusters", Some(json!(records))).await?;
    let spec = serde_json::to_value(app(FLEET_APP, "demo-app", "0.1.0", json!({"replicaCount": 1})).spec)?;
    stream::iter(0..n)
        .map(|i| {
            let (sim, spec) = (&sim, spec.clone());
            async move {
                sim.admin(
                    "PUT",
                    &format!("/sim/clusters/fleet-{i:04}/applications/{FLEET_NS}/{FLEET_APP}"),
                    Some(spec),
                )
                .await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    println!(
        "  {n} cluster records (one bulk call) and {n} application intents in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let me = std::process::id();
    let rss_before = rss_kib(me).unwrap_or_default();
    let sim_rss_before = rss_kib(sim_pid).unwrap_or_default();
    let counters = Arc::new(FleetCounters::default());
    let shared = ControlPlaneClient::new(&client_config(&sim.url))?;
    let mut tasks = tokio::task::JoinSet::new();
    let ramp_start = Instant::now();
    for (index, key) in keys.into_iter().enumerate() {
        let client = if args.client_per_agent {
            ControlPlaneClient::new(&client_config(&sim.url))?
        } else {
            shared.clone()
        };
        let agent = FleetAgent {
            index,
            key: Redacted::new(key),
            client,
            interval,
            objects: args.objects,
            counters: counters.clone(),
        };
        let offset = interval.mul_f64(fastrand::f64());
        tasks.spawn(agent.run(offset));
    }
    let rss_spawned = rss_kib(me).unwrap_or_default();

    // Ramp: every agent starts within one interval, then registers, resyncs and acks.
    pause("the fleet to ramp up", interval + Duration::from_secs(5)).await?;
    let ramp = sim.stats().await?;
    let (registered, synced, acked) = (
        counters.registered.load(Ordering::Relaxed),
        counters.synced.load(Ordering::Relaxed),
        counters.acknowledged.load(Ordering::Relaxed),
    );
    println!(
        "  ramp ({:.0} s): {registered}/{n} registered, {synced}/{n} full resyncs delivered, {acked}/{n} documents acknowledged",
        ramp_start.elapsed().as_secs_f64()
    );
    let first = diff(&ramp.sync, &ramp.sync_at_rest);
    println!(
        "    {} register calls ({:.0} B up, {:.0} B down each), {} syncs carrying something ({:.0} B up, {:.0} B down each: \
         resyncs of {} reports, the document, its acknowledgement)",
        ramp.register.calls,
        per_call(ramp.register.request_body_bytes, ramp.register.calls),
        per_call(ramp.register.response_body_bytes, ramp.register.calls),
        first.calls,
        per_call(first.request_body_bytes, first.calls),
        per_call(first.response_body_bytes, first.calls),
        args.objects,
    );

    // Window: at rest.
    let cpu_fleet_0 = cpu_seconds(me).unwrap_or_default();
    let cpu_sim_0 = cpu_seconds(sim_pid).unwrap_or_default();
    let window_start = Instant::now();
    let mut rss_peak = rss_kib(me).unwrap_or_default();
    let mut sim_rss_peak = rss_kib(sim_pid).unwrap_or_default();
    while window_start.elapsed() < args.fleet_window {
        pause("the fleet window to end", Duration::from_secs(1)).await?;
        rss_peak = rss_peak.max(rss_kib(me).unwrap_or_default());
        sim_rss_peak = sim_rss_peak.max(rss_kib(sim_pid).unwrap_or_default());
    }
    let end = sim.stats().await?;
    let cpu_fleet = cpu_seconds(me).unwrap_or_default() - cpu_fleet_0;
    let cpu_sim = cpu_seconds(sim_pid).unwrap_or_default() - cpu_sim_0;
    let rss_end = rss_kib(me).unwrap_or_default();
    let sim_rss_end = rss_kib(sim_pid).unwrap_or_default();
    tasks.abort_all();

    let secs = end.now.duration_since(ramp.now).as_secs_f64();
    let reg = diff(&end.register, &ramp.register);
    let sync = diff(&end.sync, &ramp.sync);
    let rest = diff(&end.sync_at_rest, &ramp.sync_at_rest);
    let other = diff(&end.other, &ramp.other);
    let calls = reg.calls + sync.calls + other.calls;
    let errors = reg.errors + sync.errors + other.errors;
    let window_secs = window_start.elapsed().as_secs_f64();
    let mut trips: Vec<f64> = counters
        .round_trips
        .lock()
        .expect("lock")
        .iter()
        .filter(|(at, _)| *at >= window_start)
        .map(|(_, ms)| f64::from(*ms))
        .collect();
    trips.sort_by(f64::total_cmp);

    println!("  window {secs:.0} s, at the simulator:");
    println!(
        "    requests: {calls} ({:.1}/s; expected {n}/{}s = {:.1}/s), of which syncs {} and at rest {}; errors {errors}",
        calls as f64 / secs,
        interval.as_secs(),
        n as f64 / interval.as_secs_f64(),
        sync.calls,
        rest.calls
    );
    println!(
        "    bytes per sync at rest: {:.0} B up + {:.0} B down (JSON bodies); with HTTP/1.1 framing {:.0} B up + {:.0} B down",
        per_call(rest.request_body_bytes, rest.calls),
        per_call(rest.response_body_bytes, rest.calls),
        per_call(rest.request_body_bytes + rest.request_header_bytes, rest.calls),
        per_call(rest.response_body_bytes + rest.response_header_bytes, rest.calls),
    );
    let wire =
        (rest.request_body_bytes + rest.request_header_bytes + rest.response_body_bytes + rest.response_header_bytes)
            as f64
            / secs;
    println!(
        "    control-plane traffic at rest: {:.1} KiB/s for {n} clusters ({:.1} MiB/day)",
        wire / 1024.0,
        wire * 86_400.0 / 1024.0 / 1024.0
    );
    println!(
        "    simulator: CPU {:.1} % of one core, RSS {:.1} MiB before the fleet, {:.1} MiB peak, {:.1} MiB at the end (not Odoo)",
        cpu_sim / window_secs * 100.0,
        mib(sim_rss_before),
        mib(sim_rss_peak),
        mib(sim_rss_end)
    );
    println!(
        "  at the agents: sync round trip n {}, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        trips.len(),
        percentile(&trips, 0.5),
        percentile(&trips, 0.99),
        trips.last().copied().unwrap_or(f64::NAN)
    );
    let client_errors = counters.errors.lock().expect("lock").clone();
    if !client_errors.is_empty() {
        println!("    errors seen by the agents (whole run): {client_errors:?}");
    }
    let per_agent = rss_end.saturating_sub(rss_before) as f64 / n as f64;
    println!(
        "  fleet process: RSS {:.1} MiB before the agents, {:.1} MiB with {n} spawned, {:.1} MiB peak, {:.1} MiB at the end \
         → about {:.1} KiB per simulated agent; CPU {:.1} % of one core",
        mib(rss_before),
        mib(rss_spawned),
        mib(rss_peak),
        mib(rss_end),
        per_agent,
        cpu_fleet / window_secs * 100.0
    );
    println!(
        "    (a simulated agent is a task with its protocol state; the real agent's RSS, with its Kubernetes \
         client, watches and caches, is part (a)'s figure)"
    );
    drop(sim);
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    if args.part != Part::Fleet {
        // The fleet needs no cluster; the latency part runs inside the cluster's netns.
        assert_loopback_only();
    }
    println!("bench-agent");
    if args.part != Part::Fleet {
        let client = client().await?;
        let mut runs = vec![latency_run(&client, &args, true).await?];
        print_latency(&runs[0]);
        if args.compare {
            runs.push(latency_run(&client, &args, false).await?);
            print_latency(&runs[1]);
        }
    }
    if args.part != Part::Latency {
        fleet(&args).await?;
    }
    Ok(())
}
