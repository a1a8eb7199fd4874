//! `bench-app`: app-controller figures on the real local cluster (printed, never asserted).
//!
//! ```text
//! bench-app --apps 100              # full: real Helm installs, plus the same objects applied directly
//! bench-app --apps 1000 --suspended # materialisation only: HelmReleases created suspended
//! ```
//!
//! Reports (a) time until every HelmRelease exists and every ApplicationInstance mirrors
//! it, (b) time to all Ready with real Flux vs the same HelmRelease + HelmRepository
//! objects applied directly (operator overhead), (c) p50/p99 latency from HelmRelease
//! Ready to ApplicationInstance Ready (client-side watch timestamps), (d) controller RSS
//! idle and at N, (e) writes at rest after convergence. Runs inside the cluster netns
//! (`just bench-app`), starting its own app-controller (release build) with its admin
//! server on a free port (so it runs beside `just demo`), and stops with the controller's
//! log if it exits.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use api::ApplicationInstance;
use clap::Parser;
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
use helmengine::{MaterializeInput, flux::build};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};

/// The scope of the processes this benchmark starts.
const SCOPE: &str = "bench-app";
const CREATE_CONCURRENCY: usize = 16;

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
    /// Skip the Flux-alone baseline (the same objects applied directly).
    #[arg(long)]
    skip_baseline: bool,
    /// Longest wait for each phase, seconds.
    #[arg(long, default_value_t = 1800)]
    timeout_secs: u64,
}

impl Args {
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }
}

/// First client-side time each object was seen Ready=True for its current generation.
type ReadyTimes = Arc<Mutex<HashMap<String, Instant>>>;

fn ready_now(obj: &serde_json::Value) -> bool {
    let generation = obj.pointer("/metadata/generation").and_then(|g| g.as_i64());
    let ready = obj
        .pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .cloned();
    matches!(ready, Some(c) if c["status"] == "True" && c["observedGeneration"].as_i64() == generation)
}

fn spawn_ready_watch(api: Api<DynamicObject>) -> ReadyTimes {
    let times: ReadyTimes = Arc::default();
    let sink = times.clone();
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(obj)) = events.next().await {
            let name = obj.name_any();
            if serde_json::to_value(&obj).is_ok_and(|json| ready_now(&json)) {
                sink.lock().expect("lock").entry(name).or_insert_with(Instant::now);
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

/// Writes the API server counted on the objects the app controller owns.
async fn apiserver_writes(client: &Client) -> anyhow::Result<f64> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            ["PATCH", "POST", "PUT", "DELETE", "APPLY"]
                .iter()
                .any(|v| l.contains(&format!("verb=\"{v}\"")))
                && (l.contains("resource=\"applicationinstances\"")
                    || (l.contains("resource=\"helmreleases\"") && l.contains("subresource=\"\""))
                    || (l.contains("resource=\"helmrepositories\"") && l.contains("subresource=\"\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Arguments first: `--help` and a bad flag answer outside the cluster's netns too.
    let args = Args::parse();
    assert_loopback_only();
    let client = client().await?;
    let n = args.apps;
    let mode = if args.suspended {
        "suspended (materialisation only)"
    } else {
        "full (real Helm installs)"
    };
    println!("bench-app: {n} ApplicationInstances, {mode}");

    let ns = format!("bench-app-{n}");
    let (mut controller, admin) = ControllerProcess::start_with_admin(
        SCOPE,
        "app-controller",
        "bench-app-controller",
        |admin| {
            [
                "--admin-addr",
                admin,
                "--concurrency",
                "8",
                "--log-filter",
                "warn",
                "--allowed-namespaces",
                &ns,
                // The bench charts are served over plain http on 127.0.0.1 (e2e::CHART_REPO).
                "--insecure-repository-hosts",
                "127.0.0.1",
            ]
            .map(str::to_owned)
            .to_vec()
        },
        &[],
    )
    .await?;
    let pid = controller.pid().context("controller pid")?;
    // With the controller running, so a previous run's apps (with finalizers) go away.
    recreate_namespace(&client, &ns).await?;
    pause("the controller to idle", Duration::from_secs(3)).await?;
    let rss_idle = rss_kib(pid).unwrap_or_default();

    let hr_api = dynamic_api(
        &client,
        &ns,
        "helm.toolkit.fluxcd.io",
        "v2",
        "HelmRelease",
        "helmreleases",
    );
    let ai_dyn = dynamic_api(
        &client,
        &ns,
        "vworkspace.io",
        "v1alpha1",
        "ApplicationInstance",
        "applicationinstances",
    );
    let hr_ready = spawn_ready_watch(hr_api.clone());
    let ai_ready = spawn_ready_watch(ai_dyn.clone());
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

    let mirrored = wait_until(
        "every HelmRelease to exist and be mirrored",
        args.timeout(),
        async || {
            let hrs = hr_api.list(&ListParams::default()).await?.items.len();
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
            Ok(hrs == n && mirrored == n)
        },
    )
    .await?;
    let mirrored = start.elapsed().max(mirrored);
    println!(
        "(a) created {n} ApplicationInstances in {:.1}s; all HelmReleases exist and are mirrored after {:.1}s ({:.1} apps/s)",
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
        let (hr, ai) = (
            hr_ready.lock().expect("lock").clone(),
            ai_ready.lock().expect("lock").clone(),
        );
        let mut lat: Vec<f64> = ai
            .iter()
            .filter_map(|(name, t_ai)| {
                hr.get(name)
                    .map(|t_hr| t_ai.saturating_duration_since(*t_hr).as_secs_f64() * 1000.0)
            })
            .collect();
        lat.sort_by(f64::total_cmp);
        println!(
            "(c) HelmRelease Ready -> ApplicationInstance Ready: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (n={})",
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
    let (c0, a0) = (controller_writes(&admin).await?, apiserver_writes(&client).await?);
    pause("30 s of writes at rest", Duration::from_secs(30)).await?;
    let (c1, a1) = (controller_writes(&admin).await?, apiserver_writes(&client).await?);
    println!(
        "(d) controller RSS: idle {:.1} MiB, at {n} apps {:.1} MiB",
        rss_idle as f64 / 1024.0,
        rss_n as f64 / 1024.0
    );
    println!(
        "(e) writes at rest over 30 s: controller-counted {:.0} ({:.2}/s); API server on applicationinstances/helmreleases/helmrepositories {:.0} ({:.2}/s)",
        c1 - c0,
        (c1 - c0) / 30.0,
        a1 - a0,
        (a1 - a0) / 30.0
    );
    controller.kill().await?;

    if let (Some(op_total), false) = (operator_total, args.skip_baseline) {
        // Baseline: the very objects the operator writes (HelmRepository + HelmRelease per
        // app), applied directly, with no operator running.
        let base_ns = format!("bench-flux-{n}");
        recreate_namespace(&client, &base_ns).await?;
        // The HelmReleases name the release ServiceAccount (as the operator's do); Flux's lockdown
        // gives a HelmRelease no rights without it.
        e2e::flux::grant_release(&client, &base_ns).await?;
        let base_hr = dynamic_api(
            &client,
            &base_ns,
            "helm.toolkit.fluxcd.io",
            "v2",
            "HelmRelease",
            "helmreleases",
        );
        let base_repo = dynamic_api(
            &client,
            &base_ns,
            "source.toolkit.fluxcd.io",
            "v1",
            "HelmRepository",
            "helmrepositories",
        );
        let base_ready = spawn_ready_watch(base_hr.clone());
        let start = Instant::now();
        stream::iter(0..n)
            .map(|i| {
                let (base_hr, base_repo, base_ns) = (base_hr.clone(), base_repo.clone(), base_ns.clone());
                async move {
                    let mut a = bench_app(i, false);
                    a.metadata.namespace = Some(base_ns);
                    a.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
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
        wait_until("every baseline HelmRelease Ready", args.timeout(), async || {
            Ok(base_ready.lock().expect("lock").len() >= n)
        })
        .await?;
        let flux_total = start.elapsed();
        let overhead = (op_total.as_secs_f64() - flux_total.as_secs_f64()) / flux_total.as_secs_f64() * 100.0;
        println!(
            "(b) Flux alone (same objects applied directly): all {n} Ready after {:.1}s; operator overhead {overhead:+.1}%",
            flux_total.as_secs_f64()
        );
        Api::<Namespace>::all(client.clone())
            .delete(&base_ns, &DeleteParams::background())
            .await?;
    }
    println!("bench-app done (namespace {ns} kept for inspection; `just cluster-down` clears everything)");
    Ok(())
}
