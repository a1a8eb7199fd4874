//! `restore-engine`: Restore Operations through Velero.

use clap::Parser;
use controller_kit::namespaces::NamespacePairs;
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
    /// Clones a Restore may make, as `FROM=TO` pairs (e.g. `team-a=team-a-staging`): a Restore
    /// in `FROM` may restore into `TO` (`restore.targetNamespace`); any other is refused.
    #[arg(long, env = "VWS_ALLOWED_NAMESPACE_PAIRS", default_value = "")]
    allowed_namespace_pairs: NamespacePairs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    EngineMain::new("restore-engine")
        .driver(RestoreDriver {
            velero_namespace: cli.velero_namespace,
            namespace_pairs: cli.allowed_namespace_pairs,
        })
        .scratch_sweeper()
        .run(&cli.engine.common, "vworkspace-restore-engine")
        .await
}
