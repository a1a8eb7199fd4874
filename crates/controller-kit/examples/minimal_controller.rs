//! How a binary's `main` uses controller-kit. Real binaries replace `run` with
//! `kube::runtime::Controller`s and use `anyhow` for `main`'s error.
//!
//! ```sh
//! cargo run -p controller-kit --example minimal_controller -- --allowed-namespaces team-a --admin-addr 127.0.0.1:8080 --leader-elect
//! ```

use std::time::Duration;

use clap::Parser;
use controller_kit::{
    CancellationToken, CommonArgs, ControllerMetrics, LeaderElection, LeaderGate, Metrics, Readiness, WatchScope,
    WriteVerb, admin, shutdown, telemetry,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client, ResourceExt as _, api::ListParams};

const NAME: &str = "minimal-controller";

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    cli.common.validate()?;
    let _telemetry = telemetry::init(NAME, &cli.common)?;
    let shutdown = shutdown::cancel_on_signal(CancellationToken::new());

    let metrics = Metrics::new(NAME);
    let readiness = Readiness::new();
    let (_, admin) = admin::spawn(
        cli.common.admin_addr,
        metrics.clone(),
        readiness.clone(),
        shutdown.clone(),
    )
    .await?;

    let client = Client::try_default().await?;
    let scope = cli.common.watch_scope()?;
    let mut election = LeaderElection::start(client.clone(), &cli.common, NAME, &metrics, &shutdown)?;

    let controller = run(
        client,
        scope,
        election.gate(),
        metrics.controller("configmaps"),
        readiness,
        shutdown.clone(),
    );
    tokio::select! {
        res = controller => res?,
        // Lost the Lease: return the error so the process exits and restarts clean.
        res = election.wait() => res?,
    }
    shutdown.cancel();
    election.wait().await?; // releases the Lease
    admin.await??;
    Ok(())
}

/// Stand-in for a controller: reads on every replica, writes only through the gate.
async fn run(
    client: Client,
    scope: WatchScope,
    gate: LeaderGate,
    metrics: ControllerMetrics,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> Result<(), kube::Error> {
    let api: Api<ConfigMap> = scope.api(client);
    metrics.declare_write(WriteVerb::Apply, "ConfigMap");
    // A real controller sets this once its reflector stores are ready.
    readiness.set_ready();
    let mut tick = tokio::time::interval(Duration::from_secs(30));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let _timer = metrics.reconcile_timer();
        for cm in api.list(&ListParams::default()).await? {
            let ns = cm.namespace().unwrap_or_default();
            if !scope.allows(&ns) {
                continue;
            }
            if gate.is_leader() {
                // A real write: `metrics.api_write(WriteVerb::Apply, "ConfigMap")`, then the patch.
                tracing::debug!(name = %cm.name_any(), %ns, "would reconcile");
            }
        }
    }
}
