//! How a binary's `main` uses controller-kit. Real binaries replace `run` with
//! `kube::runtime::Controller`s and use `anyhow` for `main`'s error.
//!
//! ```sh
//! cargo run -p controller-kit --example minimal_controller -- --allowed-namespaces team-a --admin-addr 127.0.0.1:8080 --leader-elect
//! ```

use std::time::Duration;

use clap::Parser;
use controller_kit::{
    CancellationToken, CommonArgs, ControllerMetrics, LeaderGate, Readiness, Runtime, WatchScope, WriteVerb,
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
    // Telemetry, signals, admin server, client, leader election; then the controllers until
    // shutdown, or an error when the Lease is lost, so the process exits and restarts clean.
    Runtime::builder(NAME, &cli.common)?
        .run(|rt| {
            run(
                rt.client,
                rt.scope,
                rt.gate,
                rt.metrics.controller("configmaps"),
                rt.readiness,
                rt.shutdown,
            )
        })
        .await?;
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
