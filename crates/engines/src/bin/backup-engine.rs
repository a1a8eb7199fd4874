//! `backup-engine`: Backup Operations through Velero, Snapshot Operations through CSI, and
//! the backup schedules of ApplicationInstances (a Backup Operation per scheduled run).

use clap::Parser;
use engines::{backup::BackupDriver, cli::EngineMain, snapshot::SnapshotDriver};

#[derive(Parser)]
#[command(
    name = "backup-engine",
    version,
    about = "Runs Backup Operations as Velero Backups, Snapshot Operations as CSI VolumeSnapshots, and \
             ApplicationInstances' backup schedules as Backup Operations."
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
            velero_namespace: cli.velero_namespace.clone(),
        })
        .driver(SnapshotDriver)
        .backup_schedules(cli.velero_namespace)
        .run(&cli.engine.common, "vworkspace-backup-engine")
        .await
}
