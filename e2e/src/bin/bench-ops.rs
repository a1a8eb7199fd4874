//! `bench-ops`: runbook-engine figures on the real local cluster (printed, never asserted).
//!
//! ```text
//! bench-ops --ops 1000 --apps 100
//! ```
//!
//! Creates `--apps` ApplicationInstances (suspended: only their existence matters to a
//! Runbook) and `--ops` Runbook Operations spread over them, whose Jobs run on the kwok
//! node through kube-controller-manager. Reports throughput (first creation → last
//! terminal phase), p50/p99 from creation to terminal phase (client-side watch
//! timestamps), engine RSS idle/peak/after, writes per Operation (engine counter and
//! API server counters) and writes at rest. Runs inside the cluster netns
//! (`just bench-ops`), starting its own runbook-engine (release build) with its admin
//! server on a free port (so it runs beside `just demo`), and stops with the engine's log
//! if it exits.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use api::{ApplicationInstance, Operation};
use clap::Parser;
use e2e::{
    apps::app,
    assert_loopback_only,
    bench::{
        histogram_buckets, histogram_delta, histogram_quantile, pause, percentile, recreate_namespace, rss_kib,
        wait_until,
    },
    client,
    deploy::{http_get, metric_sum},
    ops::operation,
    process::ControllerProcess,
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::batch::v1::Job;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

/// The scope of the processes this benchmark starts.
const SCOPE: &str = "bench-ops";
const NAMESPACE: &str = "bench-ops";
const CREATE_CONCURRENCY: usize = 16;

/// Runbook-engine figures on the real local cluster (printed, never asserted).
#[derive(Parser)]
#[command(name = "bench-ops")]
struct Args {
    /// Runbook Operations created.
    #[arg(long, default_value_t = 1000)]
    ops: usize,
    /// ApplicationInstances the Operations are spread over.
    #[arg(long, default_value_t = 100)]
    apps: usize,
    /// The runbook-engine's `--concurrency`.
    #[arg(long, default_value_t = 16)]
    concurrency: u16,
    /// Longest wait for every Operation to end, seconds.
    #[arg(long, default_value_t = 900)]
    timeout_secs: u64,
}

impl Args {
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }
}

/// First client-side time each object was seen satisfying `done`.
type DoneTimes = Arc<Mutex<HashMap<String, Instant>>>;

fn spawn_first_seen<K>(api: Api<K>, done: fn(&K) -> bool) -> DoneTimes
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let times: DoneTimes = Arc::default();
    let sink = times.clone();
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(object)) = events.next().await {
            if done(&object) {
                sink.lock()
                    .expect("lock")
                    .entry(object.name_any())
                    .or_insert_with(Instant::now);
            }
        }
    });
    times
}

fn operation_terminal(op: &Operation) -> bool {
    op.status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(|p| p.is_terminal())
}

fn job_complete(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Complete" && c.status == "True"))
}

/// Writes the API server counted on Operations (status included) and Jobs.
async fn apiserver_writes(client: &Client) -> anyhow::Result<f64> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    let mut total = 0.0;
    for verb in ["PATCH", "POST", "PUT", "DELETE", "APPLY"] {
        for resource in ["operations", "jobs"] {
            total += metric_sum(
                &text,
                "apiserver_request_total",
                &[&format!("verb=\"{verb}\""), &format!("resource=\"{resource}\"")],
            );
        }
    }
    Ok(total)
}

/// The API server's request latency histogram of Operation status applies (everyone's).
async fn status_apply_latency(client: &Client) -> anyhow::Result<Vec<(f64, f64)>> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    Ok(histogram_buckets(
        &text,
        "apiserver_request_duration_seconds",
        &["resource=\"operations\"", "subresource=\"status\"", "verb=\"APPLY\""],
    ))
}

async fn engine_writes(admin: &str) -> anyhow::Result<f64> {
    Ok(metric_sum(
        &http_get(admin, "/metrics").await?,
        "vworkspace_api_writes_total",
        &[],
    ))
}

fn runbook_job() -> serde_json::Value {
    json!({
        "backoffLimit": 0,
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["true"]}]}}
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Arguments first: `--help` and a bad flag answer outside the cluster's netns too.
    let args = Args::parse();
    anyhow::ensure!(args.apps > 0 && args.ops > 0, "--ops and --apps must be positive");
    assert_loopback_only();
    let client = client().await?;
    println!("bench-ops: {} Runbook Operations across {} apps", args.ops, args.apps);
    recreate_namespace(&client, NAMESPACE).await?;

    let apps: Api<ApplicationInstance> = Api::namespaced(client.clone(), NAMESPACE);
    for i in 0..args.apps {
        let mut a = app(&format!("app-{i:03}"), "demo-app", "0.1.0", json!({}));
        a.spec.suspend = true;
        let body = json!({"apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance",
            "metadata": {"name": a.name_any()}, "spec": a.spec});
        apps.patch(
            &a.name_any(),
            &PatchParams::apply("bench-ops").force(),
            &Patch::Apply(&body),
        )
        .await?;
    }

    let concurrency = args.concurrency.to_string();
    let (engine, admin) = ControllerProcess::start_with_admin(
        SCOPE,
        "runbook-engine",
        "bench-runbook-engine",
        |admin| {
            [
                "--watch-namespace",
                NAMESPACE,
                "--allowed-namespaces",
                NAMESPACE,
                "--admin-addr",
                admin,
                "--concurrency",
                &concurrency,
            ]
            .map(str::to_owned)
            .to_vec()
        },
        &[("RUST_LOG", "info")],
    )
    .await?;
    let pid = engine.pid().context("engine pid")?;
    engine.wait_http_ok(&admin, "/readyz", Duration::from_secs(60)).await?;
    pause("the engine to idle", Duration::from_secs(2)).await?;
    let rss_idle = rss_kib(pid).unwrap_or_default();
    let writes_before = engine_writes(&admin).await?;
    let api_before = apiserver_writes(&client).await?;
    let status_latency_before = status_apply_latency(&client).await?;

    let ops: Api<Operation> = Api::namespaced(client.clone(), NAMESPACE);
    let done = spawn_first_seen(ops.clone(), operation_terminal);
    let jobs_done = spawn_first_seen(Api::<Job>::namespaced(client.clone(), NAMESPACE), job_complete);
    let created: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let start = Instant::now();
    let peak = Arc::new(Mutex::new(rss_idle));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                if let Some(rss) = rss_kib(pid) {
                    let mut p = peak.lock().expect("lock");
                    *p = (*p).max(rss);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    stream::iter(0..args.ops)
        .map(|i| {
            let (ops, created) = (ops.clone(), created.clone());
            let app_name = format!("app-{:03}", i % args.apps);
            async move {
                let name = format!("rb-{i:05}");
                let body = operation(&name, &app_name, "Runbook", json!({"job": runbook_job()}));
                ops.patch(&name, &PatchParams::apply("bench-ops"), &Patch::Apply(&body))
                    .await?;
                created.lock().expect("lock").insert(name, Instant::now());
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    let created_in = start.elapsed();

    let total = wait_until("every Operation terminal", args.timeout(), async || {
        Ok(done.lock().expect("lock").len() >= args.ops)
    })
    .await?;
    let total = created_in.max(Duration::ZERO) + total;
    sampler.abort();

    let all = ops.list(&Default::default()).await?.items;
    let succeeded = all
        .iter()
        .filter(|op| op.status.as_ref().and_then(|s| s.phase) == Some(api::OperationPhase::Succeeded))
        .count();
    let mut latencies: Vec<f64> = {
        let (created, done) = (created.lock().expect("lock"), done.lock().expect("lock"));
        created
            .iter()
            .filter_map(|(name, at)| Some(done.get(name)?.saturating_duration_since(*at).as_secs_f64() * 1000.0))
            .collect()
    };
    latencies.sort_by(f64::total_cmp);
    // The engine's own share: from the Job's Complete condition to the Operation's end.
    let mut relay: Vec<f64> = {
        let (jobs, done) = (jobs_done.lock().expect("lock"), done.lock().expect("lock"));
        jobs.iter()
            .filter_map(|(name, at)| Some(done.get(name)?.saturating_duration_since(*at).as_secs_f64() * 1000.0))
            .collect()
    };
    relay.sort_by(f64::total_cmp);
    let writes = engine_writes(&admin).await? - writes_before;
    let api_writes = apiserver_writes(&client).await? - api_before;
    let status_latency = histogram_delta(&status_apply_latency(&client).await?, &status_latency_before);
    let fast_lane = histogram_buckets(
        &http_get(&admin, "/metrics").await?,
        "vworkspace_operation_end_from_child_seconds",
        &["type=\"Runbook\""],
    );
    let rss_peak = *peak.lock().expect("lock");

    // At rest: nothing should be written any more.
    pause("20 s of writes at rest", Duration::from_secs(20)).await?;
    let rest_writes = engine_writes(&admin).await? - writes_before - writes;
    let rss_after = rss_kib(pid).unwrap_or_default();

    println!("  created {} Operations in {:.1} s", args.ops, created_in.as_secs_f64());
    println!(
        "  all terminal in {:.1} s ({succeeded} Succeeded): {:.1} Operations/s",
        total.as_secs_f64(),
        args.ops as f64 / total.as_secs_f64()
    );
    println!(
        "  creation → terminal: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "  Job Complete → Operation terminal (engine share): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        percentile(&relay, 0.5),
        percentile(&relay, 0.99),
        relay.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "    the engine's fast lane, child event in → its end write returned ({:.0} ends, from its histogram): p50 {:.0} ms, p99 {:.0} ms",
        fast_lane.last().map_or(0.0, |(_, count)| *count),
        histogram_quantile(&fast_lane, 0.5) * 1000.0,
        histogram_quantile(&fast_lane, 0.99) * 1000.0
    );
    println!(
        "    the API server's own time for an Operation status apply (all writers, same window): p50 {:.0} ms, p99 {:.0} ms",
        histogram_quantile(&status_latency, 0.5) * 1000.0,
        histogram_quantile(&status_latency, 0.99) * 1000.0
    );
    println!(
        "  engine RSS: idle {:.1} MiB, peak {:.1} MiB, after {:.1} MiB",
        rss_idle as f64 / 1024.0,
        rss_peak as f64 / 1024.0,
        rss_after as f64 / 1024.0
    );
    println!(
        "  writes per Operation: engine {:.2} (incl. events), API server on operations+jobs {:.2} (incl. Job controller status)",
        writes / args.ops as f64,
        api_writes / args.ops as f64
    );
    println!("  engine writes in 20 s at rest: {rest_writes}");
    drop(engine);
    Ok(())
}
