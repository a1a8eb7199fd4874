//! (a) Latency: status change in the cluster → the simulator has it, with the gRPC status
//! channel and without it, and the real agent's RSS.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use api::{ApplicationInstance, Operation};
use e2e::{
    apps::app,
    bench::{check_processes, describe_ms, pause, percentile, recreate_namespace, rss_kib, wait_until},
    deploy::{SYSTEM_NAMESPACE, http_get, metric_sum},
    ops::operation,
    process::{ControllerProcess, binary_path, free_loopback_addr},
};
use futures::{StreamExt, TryStreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use protocol::messages::ObjectState;
use serde_json::{Value, json};

use crate::{Args, SCOPE, Sim, api_key, mib, scale::RssSampler, work_dir};

const FIELD_MANAGER: &str = "bench-agent";
/// The Operations' application (suspended: a Runbook needs only the object).
const HOST_APP: &str = "host";

/// One status change seen by the watch: the object's state changed in this version.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Change {
    /// Its `resourceVersion` (etcd's revision: versions of one object compare as numbers).
    pub(crate) rv: u64,
    pub(crate) state: ObjectState,
    /// Wall-clock instant the watch delivered it.
    pub(crate) at: Timestamp,
}

/// The status changes of each `Kind/namespace/name`, in order.
pub(crate) type Seen = Arc<Mutex<HashMap<String, Vec<Change>>>>;

pub(crate) fn spawn_state_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: &'static str,
    state: fn(&K) -> ObjectState,
    seen: Seen,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let mut events = watcher(api, config).default_backoff().applied_objects().boxed();
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

pub(crate) fn rv_number(rv: Option<&str>) -> u64 {
    rv.and_then(|v| v.parse().ok()).unwrap_or_default()
}

pub(crate) fn state_name(s: ObjectState) -> String {
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

pub(crate) struct LatencyRun {
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

pub(crate) fn agent_has_status_channel_flag() -> bool {
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

pub(crate) async fn delete_namespace(client: &Client, ns: &str, timeout: Duration) -> anyhow::Result<()> {
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

pub(crate) async fn run(client: &Client, args: &Args, channel: bool) -> anyhow::Result<LatencyRun> {
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
        watcher::Config::default(),
        "ApplicationInstance",
        protocol::report::application_state,
        seen.clone(),
    );
    let ops: Api<Operation> = Api::namespaced(client.clone(), &ns);
    spawn_state_watch(
        ops.clone(),
        watcher::Config::default(),
        "Operation",
        protocol::report::operation_state,
        seen.clone(),
    );
    let sampler = RssSampler::start(pid);

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
    let rss_peak = sampler.take_peak().max(rss_idle);
    drop(sampler);

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
        rss_peak,
        rss_rest,
        syncs,
        reports,
        channel_events,
        duration,
    })
}

pub(crate) fn print(run: &LatencyRun) {
    println!("  [{}]", run.label);
    println!(
        "    status change seen in the cluster → received by the simulator: {} (target p99 < 2 s: {})",
        describe_ms(&run.all),
        latency_verdict(&run.all, run.missing)
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
        rss_verdict(run.rss_peak)
    );
}

/// The p99 target's verdict: "met" only for a p99 over every final state (a missing one has
/// no latency, so the p99 of the others says nothing of it) and over at least one sample.
fn latency_verdict(sorted_ms: &[f64], missing: usize) -> String {
    let p99 = percentile(sorted_ms, 0.99);
    if sorted_ms.is_empty() {
        "NOT measured: no sample".to_owned()
    } else if missing > 0 {
        format!("NOT met: {missing} final states never received")
    } else if p99 < 2000.0 {
        "met".to_owned()
    } else {
        "NOT met".to_owned()
    }
}

/// The RSS target's verdict for a peak in KiB (`VmHWM`); 0 means it could not be read.
fn rss_verdict(peak_kib: u64) -> &'static str {
    if peak_kib == 0 {
        "NOT measured: the agent's RSS could not be read"
    } else if peak_kib * 1024 <= 30_000_000 {
        "within"
    } else {
        "ABOVE"
    }
}
