//! `runbook-engine`: runs Runbook Operations as Jobs.

use clap::Parser;
use engines::{cli::EngineMain, runbook::RunbookDriver};

#[derive(Parser)]
#[command(
    name = "runbook-engine",
    version,
    about = "Runs Runbook Operations as batch/v1 Jobs."
)]
struct Cli {
    #[command(flatten)]
    engine: engines::cli::EngineArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    EngineMain::new("runbook-engine")
        .driver(RunbookDriver)
        .run(&cli.engine.common, "vworkspace-runbook-engine")
        .await
}
