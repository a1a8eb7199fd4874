//! `upgrade-engine`: Upgrade and Rollback Operations through the ApplicationInstance (and Flux).

use clap::Parser;
use engines::{
    cli::EngineMain,
    upgrade::{RollbackDriver, UpgradeDriver},
};

#[derive(Parser)]
#[command(
    name = "upgrade-engine",
    version,
    about = "Runs Upgrade and Rollback Operations by changing the ApplicationInstance's chart version and values."
)]
struct Cli {
    #[command(flatten)]
    engine: engines::cli::EngineArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    EngineMain::new("upgrade-engine")
        .driver(UpgradeDriver)
        .driver(RollbackDriver)
        .run(&cli.engine.common, "vworkspace-upgrade-engine")
        .await
}
