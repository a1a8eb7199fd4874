//! (c) Scale: the real agent with `--scale-objects` ApplicationInstances (10,000 by
//! default): its full resync to the control plane, its RSS, and the status-change latency
//! while `--scale-changes` of them (1,000) change at once.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use api::ApplicationInstance;
use e2e::{
    apps::app,
    bench::{check_processes, cpu_seconds, describe_ms, pause, percentile, rss_kib, wait_until},
    deploy::SYSTEM_NAMESPACE,
    process::ControllerProcess,
};
use futures::{StreamExt, TryStreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use odoo_sim::SimStats;
use protocol::messages::ObjectState;
use serde_json::{Value, json};

use crate::{
    Args, SCOPE, Sim, api_key,
    fleet::diff,
    latency::{Seen, agent_has_status_channel_flag, rv_number, spawn_state_watch},
    mib, work_dir,
};

const CLUSTER: &str = "bench-agent-scale";
/// Marks the objects of this part (the bench's own watch selects them).
const LABEL: &str = "bench.vworkspace.io/part";
const LABEL_VALUE: &str = "agent-scale";
/// Parallel requests while writing the objects and while changing them.
const WRITERS: usize = 16;
const CHANGERS: usize = 32;

fn namespace(i: usize) -> String {
    format!("bench-agent-scale-{i}")
}

/// Object `i` lives in namespace `i % namespaces`, so the changed ones (the first
/// `--scale-changes`) are spread over every namespace.
fn object(i: usize, namespaces: usize) -> (String, String) {
    (namespace(i % namespaces), format!("app-{i:05}"))
}

fn watch_key(ns: &str, name: &str) -> String {
    format!("ApplicationInstance/{ns}/{name}")
}

/// The status the app controller writes for a suspended application whose HelmRelease it
/// materialised (suspended) and that Flux never reconciled: the agent reports it, so the
/// reports have their real size without 10,000 installs' worth of Flux objects.
fn suspended_status(ns: &str, name: &str, generation: i64) -> Value {
    json!({"status": {
        "observedGeneration": generation,
        "engine": "flux",
        "engineRef": {"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease", "namespace": ns, "name": name},
        "conditions": [{
            "type": "Ready",
            "status": "Unknown",
            "reason": "Suspended",
            "message": "spec.suspend is true: the release is not reconciled",
            "lastTransitionTime": Timestamp::now().to_string(),
            "observedGeneration": generation,
        }],
    }})
}

/// What one object needs before a run: created, suspended again (a previous run with
/// `--keep-objects` unsuspended it), its status written for its generation.
async fn prepare_object(
    client: &Client,
    ns: &str,
    name: &str,
    existing: Option<&ApplicationInstance>,
) -> anyhow::Result<bool> {
    let apps: Api<ApplicationInstance> = Api::namespaced(client.clone(), ns);
    let mut generation = existing.and_then(|a| a.metadata.generation);
    let mut wrote = false;
    match existing {
        None => {
            let mut a = app(name, "demo-app", "0.1.0", json!({"replicaCount": 0}));
            a.spec.suspend = true;
            a.metadata.labels = Some([(LABEL.to_owned(), LABEL_VALUE.to_owned())].into());
            let created = apps.create(&PostParams::default(), &a).await?;
            generation = created.metadata.generation;
            wrote = true;
        }
        Some(a) if !a.spec.suspend => {
            let patched = apps
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"suspend": true}})),
                )
                .await?;
            generation = patched.metadata.generation;
            wrote = true;
        }
        Some(_) => {}
    }
    let status_current = !wrote
        && existing
            .and_then(|a| a.status.as_ref())
            .is_some_and(|s| s.observed_generation == generation);
    if !status_current {
        let generation = generation.context("an ApplicationInstance without metadata.generation")?;
        apps.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(suspended_status(ns, name, generation)),
        )
        .await?;
        wrote = true;
    }
    Ok(wrote)
}

/// Creates what is missing and puts back what a previous run changed; returns how many
/// objects needed a write.
async fn prepare(client: &Client, args: &Args) -> anyhow::Result<usize> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut existing: HashMap<(String, String), ApplicationInstance> = HashMap::new();
    for i in 0..args.scale_namespaces {
        let ns = namespace(i);
        if let Some(found) = namespaces.get_opt(&ns).await? {
            if found.metadata.deletion_timestamp.is_some() {
                wait_gone(client, std::slice::from_ref(&ns), Duration::from_secs(600)).await?;
            } else {
                let apps: Api<ApplicationInstance> = Api::namespaced(client.clone(), &ns);
                for a in apps
                    .list(&ListParams::default().labels(&format!("{LABEL}={LABEL_VALUE}")))
                    .await?
                {
                    existing.insert((ns.clone(), a.name_any()), a);
                }
                continue;
            }
        }
        let body: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        namespaces.create(&PostParams::default(), &body).await?;
    }
    let existing = Arc::new(existing);
    let written = stream::iter(0..args.scale_objects)
        .map(|i| {
            let existing = existing.clone();
            async move {
                let (ns, name) = object(i, args.scale_namespaces);
                prepare_object(client, &ns, &name, existing.get(&(ns.clone(), name.clone()))).await
            }
        })
        .buffer_unordered(WRITERS)
        .try_fold(0usize, |n, wrote| async move { Ok(n + usize::from(wrote)) })
        .await?;
    Ok(written)
}

/// Deletes the namespaces (their objects have no finalizers: no controller ran) and waits
/// until they are gone.
async fn delete_namespaces(client: &Client, args: &Args) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = (0..args.scale_namespaces).map(namespace).collect();
    for ns in &names {
        if api.get_opt(ns).await?.is_some() {
            api.delete(ns, &DeleteParams::default()).await?;
        }
    }
    wait_gone(client, &names, Duration::from_secs(600)).await
}

async fn wait_gone(client: &Client, names: &[String], timeout: Duration) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    wait_until("the scale namespaces to be deleted", timeout, async || {
        for ns in names {
            if api.get_opt(ns).await?.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await?;
    Ok(())
}

/// Traffic between two snapshots of the simulator's counters.
#[derive(Clone, Copy, Debug, Default)]
struct Traffic {
    registers: u64,
    syncs: u64,
    errors: u64,
    reports: u64,
    body_up: u64,
    body_down: u64,
    wire_up: u64,
    wire_down: u64,
}

impl Traffic {
    fn between(before: &SimStats, after: &SimStats) -> Self {
        let (register, sync) = (diff(&after.register, &before.register), diff(&after.sync, &before.sync));
        let both = [register, sync];
        Self {
            registers: register.calls,
            syncs: sync.calls,
            errors: both.iter().map(|c| c.errors).sum(),
            reports: after.reports - before.reports,
            body_up: both.iter().map(|c| c.request_body_bytes).sum(),
            body_down: both.iter().map(|c| c.response_body_bytes).sum(),
            wire_up: both.iter().map(|c| c.request_body_bytes + c.request_header_bytes).sum(),
            wire_down: both
                .iter()
                .map(|c| c.response_body_bytes + c.response_header_bytes)
                .sum(),
        }
    }

    fn describe(&self) -> String {
        let kib = |b: u64| b as f64 / 1024.0;
        format!(
            "{} register + {} sync calls ({} errors) carrying {} reports ({:.0} per sync); up {:.1} KiB ({:.1} KiB \
             with HTTP framing, {:.0} B per report), down {:.1} KiB ({:.1} KiB with framing)",
            self.registers,
            self.syncs,
            self.errors,
            self.reports,
            self.reports as f64 / self.syncs.max(1) as f64,
            kib(self.body_up),
            kib(self.wire_up),
            self.body_up as f64 / self.reports.max(1) as f64,
            kib(self.body_down),
            kib(self.wire_down),
        )
    }
}

/// The agent's RSS: the highest since the last [`RssSampler::take_peak`], sampled every 100 ms.
pub(crate) struct RssSampler {
    pid: u32,
    peak: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    pub(crate) fn start(pid: u32) -> Self {
        let peak = Arc::new(AtomicU64::new(rss_kib(pid).unwrap_or_default()));
        let task = {
            let peak = peak.clone();
            tokio::spawn(async move {
                loop {
                    if let Some(rss) = rss_kib(pid) {
                        peak.fetch_max(rss, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        Self { pid, peak, task }
    }

    fn now(&self) -> u64 {
        rss_kib(self.pid).unwrap_or_default()
    }

    /// The peak so far; the next peak starts from the current RSS.
    pub(crate) fn take_peak(&self) -> u64 {
        let now = self.now();
        self.peak.swap(now, Ordering::Relaxed).max(now)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) async fn run(client: &Client, args: &Args) -> anyhow::Result<()> {
    let n = args.scale_objects;
    println!(
        "(c) scale: {n} suspended ApplicationInstances over {} namespaces, then {} of them unsuspended at once",
        args.scale_namespaces, args.scale_changes
    );
    let prepare_start = Instant::now();
    let written = prepare(client, args).await?;
    println!(
        "  objects ready: {written} of {n} written ({:.1} s; the status the app controller writes for a suspended \
         app, written by the bench: no controller runs)",
        prepare_start.elapsed().as_secs_f64()
    );
    let outcome = measure(client, args).await;
    if args.keep_objects {
        println!("  objects kept (--keep-objects): namespaces bench-agent-scale-*");
    } else {
        let start = Instant::now();
        delete_namespaces(client, args).await?;
        println!("  objects deleted ({:.1} s)", start.elapsed().as_secs_f64());
    }
    outcome
}

async fn measure(client: &Client, args: &Args) -> anyhow::Result<()> {
    let n = args.scale_objects;
    let namespaces: Vec<String> = (0..args.scale_namespaces).map(namespace).collect();
    let allowed = namespaces.join(",");

    let dir = work_dir()?;
    let key_file = dir.join("api-key-scale");
    std::fs::write(&key_file, api_key("scale"))?;
    let sim = Sim::start("bench-agent-odoo-sim-scale", Some((CLUSTER, &key_file))).await?;
    let key = key_file.to_string_lossy().into_owned();
    let agent_log = std::env::var("BENCH_AGENT_AGENT_LOG").unwrap_or_else(|_| "info".to_owned());
    let has_channel_flag = agent_has_status_channel_flag();
    let stats_start = sim.stats().await?;

    // From the agent's start: list, register, full resync.
    let started_at = Timestamp::now();
    let started = Instant::now();
    let (agent, agent_admin) = ControllerProcess::start_with_admin(
        SCOPE,
        "agent",
        "bench-agent-agent-scale",
        |admin| {
            let mut a: Vec<String> = [
                "--control-plane-url",
                sim.url.as_str(),
                "--insecure-allow-http",
                "--api-key-file",
                key.as_str(),
                "--cluster-name",
                CLUSTER,
                "--allowed-namespaces",
                allowed.as_str(),
                "--admin-addr",
                admin,
                "--sync-interval",
                "30s",
                "--status-configmap",
                "bench-agent-status-scale",
                "--log-filter",
                agent_log.as_str(),
            ]
            .map(str::to_owned)
            .to_vec();
            if has_channel_flag {
                // No publisher runs here: the watches alone.
                a.extend(["--status-channel-addr".to_owned(), "off".to_owned()]);
            }
            a
        },
        &[("POD_NAMESPACE", SYSTEM_NAMESPACE)],
    )
    .await?;
    let pid = agent.pid().context("agent pid")?;
    let rss = RssSampler::start(pid);
    let mut ready_after = None;
    wait_until(
        "the simulator to hold every report of the full resync",
        args.timeout,
        async || {
            if ready_after.is_none() && e2e::deploy::http_get(&agent_admin, "/readyz").await.is_ok() {
                ready_after = Some(started.elapsed());
            }
            Ok(sim.stats().await?.reports >= n as u64)
        },
    )
    .await?;
    let stats_resync = sim.stats().await?;
    let resync_cpu = cpu_seconds(pid).unwrap_or(f64::NAN);
    let rss_resync_peak = rss.take_peak();
    let log = sim.report_log(CLUSTER).await?;
    let since_start = |t: Timestamp| t.duration_since(started_at).as_secs_f64();
    let first_report = log.first().map_or(f64::NAN, |e| since_start(e.received_at));
    let last_report = log.last().map_or(f64::NAN, |e| since_start(e.received_at));
    let view = sim.admin("GET", &format!("/sim/clusters/{CLUSTER}"), None).await?;
    let completed = view["resync"]["completed"].as_u64().unwrap_or_default();
    let resync = Traffic::between(&stats_start, &stats_resync);

    // At rest with every object known.
    pause("10 s at rest after the full resync", Duration::from_secs(10)).await?;
    let rss_idle = rss.now();
    rss.take_peak();

    // The changes: the bench's own watch sees each one (as in (a)), the simulator's log
    // says when its report arrived.
    let seen: Seen = Arc::default();
    spawn_state_watch(
        Api::<ApplicationInstance>::all(client.clone()),
        watcher::Config::default().labels(&format!("{LABEL}={LABEL_VALUE}")),
        "ApplicationInstance",
        protocol::report::application_state,
        seen.clone(),
    );
    wait_until("the bench's watch to list every object", args.timeout, async || {
        Ok(seen.lock().expect("lock").len() >= n)
    })
    .await?;
    let log_seq = sim.report_log(CLUSTER).await?.last().map_or(0, |e| e.seq);
    let stats_before = sim.stats().await?;
    let cpu_before = cpu_seconds(pid).unwrap_or(f64::NAN);
    let changed: Vec<(String, String)> = (0..args.scale_changes)
        .map(|i| object(i, args.scale_namespaces))
        .collect();
    let change_start = Instant::now();
    stream::iter(changed.clone())
        .map(|(ns, name)| async move {
            let apps: Api<ApplicationInstance> = Api::namespaced(client.clone(), &ns);
            apps.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"suspend": false}})),
            )
            .await?;
            anyhow::Ok(())
        })
        .buffer_unordered(CHANGERS)
        .try_collect::<Vec<_>>()
        .await?;
    let written_in = change_start.elapsed();
    let changed_keys: Vec<String> = changed.iter().map(|(ns, name)| watch_key(ns, name)).collect();
    // Each changed app's first progressing version, as the watch saw it.
    let progressing =
        |seen: &HashMap<String, Vec<crate::latency::Change>>| -> BTreeMap<String, crate::latency::Change> {
            changed_keys
                .iter()
                .filter_map(|k| {
                    let c = seen.get(k)?.iter().find(|c| c.state == ObjectState::Progressing)?;
                    Some((k.clone(), *c))
                })
                .collect()
        };
    wait_until("the watch to see every change", args.timeout, async || {
        Ok(progressing(&seen.lock().expect("lock")).len() == changed_keys.len())
    })
    .await?;
    let watched = progressing(&seen.lock().expect("lock"));
    let delivered = |log: &[odoo_sim::ReceivedReport]| -> BTreeMap<String, Timestamp> {
        watched
            .iter()
            .filter_map(|(k, change)| {
                let at = log
                    .iter()
                    .filter(|e| &e.key == k && rv_number(e.resource_version.as_deref()) >= change.rv)
                    .map(|e| e.received_at)
                    .min()?;
                Some((k.clone(), at))
            })
            .collect()
    };
    let mut log = Vec::new();
    wait_until("the simulator to receive every change", args.timeout, async || {
        log = sim.report_log_after(CLUSTER, log_seq).await?;
        Ok(delivered(&log).len() == watched.len())
    })
    .await?;
    let changes_in = change_start.elapsed();
    let stats_after = sim.stats().await?;
    let change_cpu = cpu_seconds(pid).unwrap_or(f64::NAN) - cpu_before;
    let rss_change_peak = rss.take_peak();
    let received = delivered(&log);
    let mut latencies: Vec<f64> = watched
        .iter()
        .filter_map(|(k, change)| {
            let at = received.get(k)?;
            Some(at.duration_since(change.at).as_secs_f64() * 1000.0)
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    let first_seen = watched.values().map(|c| c.at).min();
    let last_seen = watched.values().map(|c| c.at).max();
    let changes = Traffic::between(&stats_before, &stats_after);

    pause("10 s at rest after the changes", Duration::from_secs(10)).await?;
    let rss_rest = rss.now();
    let rss_peak_rest = rss.take_peak();
    check_processes("the agent to stay up")?;
    drop(rss);
    drop(agent);
    drop(sim);

    println!("  [full resync of {n} objects, from the agent's start]");
    println!(
        "    agent ready (watches listed, first sync ok) after {}; first report at the simulator after {first_report:.2} \
         s, all {n} after {last_report:.2} s; resyncs completed {completed}",
        ready_after.map_or_else(|| "-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64())),
    );
    println!("    {}", resync.describe());
    println!("    agent CPU from its start to the end of the resync: {resync_cpu:.2} s");
    println!(
        "  [{} apps unsuspended at once ({} parallel patches, written in {:.2} s; the watch saw them over {:.2} s)]",
        args.scale_changes,
        CHANGERS,
        written_in.as_secs_f64(),
        match (first_seen, last_seen) {
            (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
            _ => f64::NAN,
        }
    );
    println!(
        "    status change seen in the cluster → received by the simulator: {}",
        describe_ms(&latencies)
    );
    println!(
        "    (target p99 < 2 s: {}); every change at the simulator {:.2} s after the first patch",
        if percentile(&latencies, 0.99) < 2000.0 {
            "met"
        } else {
            "NOT met"
        },
        changes_in.as_secs_f64()
    );
    println!("    {}", changes.describe());
    println!("    agent CPU for the changes: {change_cpu:.2} s");
    println!(
        "  agent RSS: peak during the resync {:.1} MiB, at rest with {n} objects {:.1} MiB, peak during the changes \
         {:.1} MiB, at rest after {:.1} MiB (peak in those 10 s {:.1} MiB)",
        mib(rss_resync_peak),
        mib(rss_idle),
        mib(rss_change_peak),
        mib(rss_rest),
        mib(rss_peak_rest),
    );
    Ok(())
}
