//! `bench-agent`: connectivity-agent figures (printed, never asserted).
//!
//! ```text
//! bench-agent [--part all|latency|fleet|scale] [--ops 60] [--apps 10] [--op-interval-ms 300] [--no-compare]
//!             [--agents 1000] [--fleet-window-secs 60] [--sync-interval-secs 30] [--objects 5]
//!             [--client-per-agent] [--scale-objects 10000] [--scale-namespaces 10]
//!             [--scale-changes 1000] [--keep-objects]
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
//! **(c) Scale**, on the real local cluster, last in `all` (20,000 writes before it measures):
//! `--scale-objects` suspended ApplicationInstances over `--scale-namespaces` namespaces,
//! each with the status the app controller writes for a suspended app (written by this
//! process: no controller runs, so no Flux object exists), then `odoo-sim` and the real
//! agent (pull mode, watches only, `--sync-interval 30s`). Figures: the full resync from
//! the agent's start (calls, reports, bytes from the simulator's counters, time to the
//! first and the last report), then `--scale-changes` apps unsuspended at once (32
//! parallel patches; suspended → progressing, as `protocol::report` computes it): latency
//! measured as in (a), calls and bytes; the agent's RSS and CPU throughout. The objects
//! are deleted at the end unless `--keep-objects` (a later run reuses them, suspended
//! again).
//!
//! Environment defaults (flags win): `BENCH_AGENT_AGENTS`, `BENCH_AGENT_FLEET_WINDOW_SECS`,
//! `BENCH_AGENT_OPS`, `BENCH_AGENT_SCALE_OBJECTS`, `BENCH_AGENT_SCALE_CHANGES`.

mod fleet;
mod latency;
mod scale;

use std::{path::PathBuf, time::Duration};

use clap::{Parser, ValueEnum};
use e2e::{
    agent::http,
    assert_loopback_only, client, cluster_dir,
    process::{ControllerProcess, free_loopback_addr, retry_address_race},
};
use odoo_sim::{ReceivedReport, SimStats};
use serde_json::Value;

/// The scope of the processes this benchmark starts.
const SCOPE: &str = "bench-agent";

/// Which benchmark to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Part {
    /// All three: latency, fleet, scale.
    All,
    /// (a) Status change in the cluster → the simulator has it.
    Latency,
    /// (b) Many simulated agents against one simulator.
    Fleet,
    /// (c) The real agent with 10,000 objects: full resync, RSS, 1,000 changes at once.
    Scale,
}

/// Connectivity-agent figures (printed, never asserted).
#[derive(Parser)]
#[command(name = "bench-agent")]
struct Cli {
    /// Which benchmark to run.
    #[arg(long, value_enum, default_value_t = Part::All)]
    part: Part,
    /// (a) Runbook Operations created.
    #[arg(long, env = "BENCH_AGENT_OPS", default_value_t = 60)]
    ops: usize,
    /// (a) ApplicationInstances installed through Flux.
    #[arg(long, default_value_t = 10)]
    apps: usize,
    /// (a) Delay between two Operations, milliseconds.
    #[arg(long, default_value_t = 300)]
    op_interval_ms: u64,
    /// (a) Skip the run without the status channel.
    #[arg(long)]
    no_compare: bool,
    /// (b) Simulated agents.
    #[arg(long, env = "BENCH_AGENT_AGENTS", default_value_t = 1000)]
    agents: usize,
    /// (b) Measurement window after the ramp, seconds.
    #[arg(long, env = "BENCH_AGENT_FLEET_WINDOW_SECS", default_value_t = 60)]
    fleet_window_secs: u64,
    /// (b) Sync interval of every simulated agent, seconds.
    #[arg(long, default_value_t = 30)]
    sync_interval_secs: u64,
    /// (b) Reports in each agent's full resync (one app, the rest Operations).
    #[arg(long, default_value_t = 5)]
    objects: usize,
    /// (b) One HTTP client per simulated agent instead of one shared connection pool.
    #[arg(long)]
    client_per_agent: bool,
    /// (a), (c) Longest wait for every change to be seen, seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// (c) Suspended ApplicationInstances the agent reports.
    #[arg(long, env = "BENCH_AGENT_SCALE_OBJECTS", default_value_t = 10_000)]
    scale_objects: usize,
    /// (c) Namespaces they are spread over.
    #[arg(long, default_value_t = 10)]
    scale_namespaces: usize,
    /// (c) Applications changed at once (unsuspended: suspended → progressing).
    #[arg(long, env = "BENCH_AGENT_SCALE_CHANGES", default_value_t = 1000)]
    scale_changes: usize,
    /// (c) Leave the objects (and their namespaces) for the next run instead of deleting them.
    #[arg(long)]
    keep_objects: bool,
}

/// The arguments, checked and in the units the benchmarks use.
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
    scale_objects: usize,
    scale_namespaces: usize,
    scale_changes: usize,
    keep_objects: bool,
}

impl Cli {
    fn check(self) -> anyhow::Result<Args> {
        anyhow::ensure!(self.ops > 0 && self.agents > 0, "--ops and --agents must be positive");
        anyhow::ensure!(self.objects >= 1, "--objects must be at least 1");
        anyhow::ensure!(self.sync_interval_secs >= 1, "--sync-interval-secs must be at least 1");
        anyhow::ensure!(
            self.scale_namespaces >= 1 && self.scale_objects >= self.scale_namespaces,
            "--scale-namespaces must be at least 1 and at most --scale-objects"
        );
        anyhow::ensure!(
            self.scale_changes <= self.scale_objects,
            "--scale-changes must be at most --scale-objects"
        );
        Ok(Args {
            part: self.part,
            ops: self.ops,
            apps: self.apps,
            op_interval: Duration::from_millis(self.op_interval_ms),
            compare: !self.no_compare,
            agents: self.agents,
            fleet_window: Duration::from_secs(self.fleet_window_secs),
            sync_interval: Duration::from_secs(self.sync_interval_secs),
            objects: self.objects,
            client_per_agent: self.client_per_agent,
            timeout: Duration::from_secs(self.timeout_secs),
            scale_objects: self.scale_objects,
            scale_namespaces: self.scale_namespaces,
            scale_changes: self.scale_changes,
            keep_objects: self.keep_objects,
        })
    }
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
        self.report_log_after(cluster, 0).await
    }

    /// The report log's entries after sequence number `after`.
    async fn report_log_after(&self, cluster: &str, after: u64) -> anyhow::Result<Vec<ReceivedReport>> {
        let v = self
            .admin(
                "GET",
                &format!("/sim/clusters/{cluster}/report-log?after={after}"),
                None,
            )
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

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Cli::parse().check()?;
    let latency = matches!(args.part, Part::All | Part::Latency);
    let fleet = matches!(args.part, Part::All | Part::Fleet);
    let scale = matches!(args.part, Part::All | Part::Scale);
    if args.part != Part::Fleet {
        // The fleet needs no cluster; the other parts run inside the cluster's netns.
        assert_loopback_only();
    }
    println!("bench-agent");
    if latency {
        let client = client().await?;
        let mut runs = vec![latency::run(&client, &args, true).await?];
        latency::print(&runs[0]);
        if args.compare {
            runs.push(latency::run(&client, &args, false).await?);
            latency::print(&runs[1]);
        }
    }
    if fleet {
        fleet::run(&args).await?;
    }
    if scale {
        let client = client().await?;
        scale::run(&client, &args).await?;
    }
    Ok(())
}
