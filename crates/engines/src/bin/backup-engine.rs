//! `backup-engine`: Backup Operations through Velero, Snapshot Operations through CSI.

use clap::Parser;
use engines::{backup::BackupDriver, cli::EngineMain, snapshot::SnapshotDriver};

#[derive(Parser)]
#[command(
    name = "backup-engine",
    version,
    about = "Runs Backup Operations as Velero Backups and Snapshot Operations as CSI VolumeSnapshots."
)]
struct Cli {
    #[command(flatten)]
    engine: engines::cli::EngineArgs,
    /// Namespace Velero runs in (where its Backups are created).
    #[arg(long, env = "VWS_VELERO_NAMESPACE", default_value = "velero")]
    velero_namespace: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    EngineMain::new("backup-engine")
        .driver(BackupDriver {
            velero_namespace: cli.velero_namespace,
        })
        .driver(SnapshotDriver)
        .run(&cli.engine.common, "vworkspace-backup-engine")
        .await
}
