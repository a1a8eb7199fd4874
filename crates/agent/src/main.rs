//! `agent`: pulls desired state from the Odoo control plane (pull mode, the default) or
//! accepts it on an authenticated HTTPS endpoint (push mode), applies it as CRs inside the
//! namespace allow-list, and reports status back.

use clap::Parser;
use controller_kit::Runtime;

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
    let runtime = Runtime::builder(NAME, &cli.agent.common)?;
    // Before anything connects: a wrong flag combination is a clear error at once.
    cli.agent.validate()?;
    runtime.run(|rt| agent::run(cli.agent, rt)).await?;
    Ok(())
}
