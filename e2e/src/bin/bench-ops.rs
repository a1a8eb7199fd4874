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
//! API server counters) and writes at rest. Then a paced phase: `--paced-ops` more
//! Operations arriving at `--paced-rate` per second (below the burst's work-off rate),
//! with the engine's share and the API server's own write time printed for that phase
//! alone, beside the burst's. Runs inside the cluster netns
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
/// Name prefixes of the two phases' Operations.
const BURST: &str = "rb-";
const PACED: &str = "paced-";

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
    /// Operations of the paced phase (0 skips it).
    #[arg(long, default_value_t = 300)]
    paced_ops: usize,
    /// Arrivals per second in the paced phase (0.01 to 1,000).
    #[arg(long, default_value_t = 8.0, value_parser = paced_rate)]
    paced_rate: f64,
    /// Longest wait for every Operation to end, seconds.
    #[arg(long, default_value_t = 900)]
    timeout_secs: u64,
}

/// Checked with the other flags, so a bad rate fails at once rather than after the burst; the
/// bounds keep `1 / rate` a duration the timer can hold.
fn paced_rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text.parse().map_err(|e| format!("not a number: {e}"))?;
    if (0.01..=1000.0).contains(&rate) {
        Ok(rate)
    } else {
        Err(format!("{rate} is outside 0.01 to 1000 arrivals per second"))
    }
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

/// Milliseconds from each named object's `from` time to its `to` time, sorted; only the
/// names starting with `prefix`, and only those seen at both.
fn spans_ms(from: &DoneTimes, to: &DoneTimes, prefix: &str) -> Vec<f64> {
    let (from, to) = (from.lock().expect("lock"), to.lock().expect("lock"));
    let mut spans: Vec<f64> = from
        .iter()
        .filter(|(name, _)| name.starts_with(prefix))
        .filter_map(|(name, at)| Some(to.get(name)?.saturating_duration_since(*at).as_secs_f64() * 1000.0))
        .collect();
    spans.sort_by(f64::total_cmp);
    spans
}

fn print_spans(what: &str, spans: &[f64]) {
    println!(
        "  {what}: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        percentile(spans, 0.5),
        percentile(spans, 0.99),
        spans.last().copied().unwrap_or(f64::NAN)
    );
}

/// p50 and p99 of a Prometheus histogram (cumulative buckets of seconds), in ms.
fn print_quantiles(what: &str, buckets: &[(f64, f64)]) {
    println!(
        "    {what}: p50 {:.0} ms, p99 {:.0} ms",
        histogram_quantile(buckets, 0.5) * 1000.0,
        histogram_quantile(buckets, 0.99) * 1000.0
    );
}

fn terminal_count(done: &DoneTimes, prefix: &str) -> usize {
    done.lock()
        .expect("lock")
        .keys()
        .filter(|name| name.starts_with(prefix))
        .count()
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
    let created: DoneTimes = Arc::default();
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
            create_runbook(ops, created, format!("{BURST}{i:05}"), app_name)
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    let created_in = start.elapsed();

    let total = wait_until("every Operation terminal", args.timeout(), async || {
        Ok(terminal_count(&done, BURST) >= args.ops)
    })
    .await?;
    let total = created_in.max(Duration::ZERO) + total;
    sampler.abort();

    let all = ops.list(&Default::default()).await?.items;
    let succeeded = all
        .iter()
        .filter(|op| op.status.as_ref().and_then(|s| s.phase) == Some(api::OperationPhase::Succeeded))
        .count();
    let latencies = spans_ms(&created, &done, BURST);
    // The engine's own share: from the Job's Complete condition to the Operation's end.
    let relay = spans_ms(&jobs_done, &done, BURST);
    let writes = engine_writes(&admin).await? - writes_before;
    let api_writes = apiserver_writes(&client).await? - api_before;
    let status_latency = histogram_delta(&status_apply_latency(&client).await?, &status_latency_before);
    let fast_lane = fast_lane_buckets(&admin).await?;
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
    print_spans("creation → terminal", &latencies);
    print_spans("Job Complete → Operation terminal (engine share)", &relay);
    print_quantiles(
        &format!(
            "the engine's fast lane, child event in → its end write returned ({:.0} ends, from its histogram)",
            fast_lane.last().map_or(0.0, |(_, count)| *count)
        ),
        &fast_lane,
    );
    print_quantiles(
        "the API server's own time for an Operation status apply (all writers, same window)",
        &status_latency,
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
    if args.paced_ops > 0 {
        paced_phase(&args, &client, &ops, &admin, &done, &jobs_done).await?;
    }
    drop(engine);
    Ok(())
}

async fn create_runbook(ops: Api<Operation>, created: DoneTimes, name: String, app_name: String) -> anyhow::Result<()> {
    let body = operation(&name, &app_name, "Runbook", json!({"job": runbook_job()}));
    ops.patch(&name, &PatchParams::apply("bench-ops"), &Patch::Apply(&body))
        .await?;
    created.lock().expect("lock").insert(name, Instant::now());
    Ok(())
}

/// Operations arriving one by one at `--paced-rate`, below the rate the burst is worked off
/// at: the engine's share when the machine is not saturated by the arrivals themselves.
async fn paced_phase(
    args: &Args,
    client: &Client,
    ops: &Api<Operation>,
    admin: &str,
    done: &DoneTimes,
    jobs_done: &DoneTimes,
) -> anyhow::Result<()> {
    let latency_before = status_apply_latency(client).await?;
    let fast_lane_before = fast_lane_buckets(admin).await?;
    let created: DoneTimes = Arc::default();
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / args.paced_rate));
    let start = Instant::now();
    let mut creates = tokio::task::JoinSet::new();
    for i in 0..args.paced_ops {
        ticks.tick().await;
        let app_name = format!("app-{:03}", i % args.apps);
        creates.spawn(create_runbook(
            ops.clone(),
            created.clone(),
            format!("{PACED}{i:05}"),
            app_name,
        ));
    }
    while let Some(created) = creates.join_next().await {
        created??;
    }
    let arrived_in = start.elapsed();
    wait_until("every paced Operation terminal", args.timeout(), async || {
        Ok(terminal_count(done, PACED) >= args.paced_ops)
    })
    .await?;
    let status_latency = histogram_delta(&status_apply_latency(client).await?, &latency_before);
    let fast_lane = histogram_delta(&fast_lane_buckets(admin).await?, &fast_lane_before);
    println!(
        "paced: {} Runbook Operations arriving at {:.1}/s (created over {:.1} s)",
        args.paced_ops,
        args.paced_rate,
        arrived_in.as_secs_f64()
    );
    print_spans("creation → terminal", &spans_ms(&created, done, PACED));
    print_spans(
        "Job Complete → Operation terminal (engine share)",
        &spans_ms(jobs_done, done, PACED),
    );
    print_quantiles("the engine's fast lane", &fast_lane);
    print_quantiles(
        "the API server's own time for an Operation status apply",
        &status_latency,
    );
    Ok(())
}

async fn fast_lane_buckets(admin: &str) -> anyhow::Result<Vec<(f64, f64)>> {
    Ok(histogram_buckets(
        &http_get(admin, "/metrics").await?,
        "vworkspace_operation_end_from_child_seconds",
        &["type=\"Runbook\""],
    ))
}
