//! `agent`: pulls desired state from the Odoo control plane (pull mode, the default) or
//! accepts it on an authenticated HTTPS endpoint (push mode), applies it as CRs inside the
//! namespace allow-list, and reports status back.

use anyhow::Context as _;
use clap::Parser;
use controller_kit::{CancellationToken, LeaderElection, Metrics, Readiness, admin, shutdown, telemetry};
use kube::Client;

const NAME: &str = "vworkspace-agent";

#[derive(Parser)]
#[command(
    name = "agent",
    version,
    about = "Connectivity agent: pulls intent from the Odoo control plane over HTTPS (or, with --mode push, serves an \
             HTTPS endpoint Odoo pushes to), applies it inside the namespace allow-list and reports status."
)]
struct Cli {
    #[command(flatten)]
    agent: agent::cli::AgentArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let common = cli.agent.common.clone();
    common.validate()?;
    // Before anything connects: a wrong flag combination is a clear error at once.
    cli.agent.validate()?;
    let _telemetry = telemetry::init(NAME, &common)?;
    let shutdown = shutdown::cancel_on_signal(CancellationToken::new());
    let metrics = Metrics::new("vworkspace");
    let readiness = Readiness::new();
    let (admin_addr, admin) =
        admin::spawn(common.admin_addr, metrics.clone(), readiness.clone(), shutdown.clone()).await?;
    tracing::info!(%admin_addr, "admin server listening");

    let client = Client::try_default()
        .await
        .context("connecting to the Kubernetes API")?;
    let mut election = LeaderElection::start(client.clone(), &common, NAME, &metrics, &shutdown)?;
    let runtime = agent::Runtime {
        client,
        gate: election.gate(),
        metrics,
        readiness,
        shutdown: shutdown.clone(),
    };
    tokio::select! {
        res = agent::run(cli.agent, runtime) => res?,
        res = election.wait() => res?,
    }
    shutdown.cancel();
    election.wait().await?;
    admin.await??;
    Ok(())
}
