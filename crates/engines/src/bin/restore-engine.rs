//! `restore-engine`: Restore Operations through Velero.

use clap::Parser;
use engines::{cli::EngineMain, restore::RestoreDriver};

#[derive(Parser)]
#[command(
    name = "restore-engine",
    version,
    about = "Runs Restore Operations as Velero Restores, holding the HelmRelease suspended meanwhile."
)]
struct Cli {
    #[command(flatten)]
    engine: engines::cli::EngineArgs,
    /// Namespace Velero runs in (where its Backups and Restores are).
    #[arg(long, env = "VWS_VELERO_NAMESPACE", default_value = "velero")]
    velero_namespace: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    EngineMain::new("restore-engine")
        .driver(RestoreDriver {
            velero_namespace: cli.velero_namespace,
        })
        .run(&cli.engine.common, "vworkspace-restore-engine")
        .await
}
