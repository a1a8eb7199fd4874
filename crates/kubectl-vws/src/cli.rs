//! The command line. kubectl passes a plugin no global flags, so the plugin takes
//! `--kubeconfig`, `--context` and `-n/--namespace` itself (and honours `KUBECONFIG`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "kubectl-vws",
    bin_name = "kubectl vws",
    version,
    about = "vWorkspace applications and their day-2 Operations: get, trace, history, backup, restore, upgrade, rollback, runbook, suspend, resume, reconcile."
)]
pub struct Cli {
    /// Path of the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace (default: the context's namespace, then `default`).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// List applications, or show one: engine, chart, desired and deployed version, Ready
    /// and its reason, last backup, next maintenance window.
    Get {
        /// One application (default: all of the namespace).
        app: Option<String>,
        /// Across all namespaces.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// ApplicationInstance → HelmRelease (or Argo CD Application) → chart source →
    /// workloads, each with its Ready state.
    Trace { app: String },
    /// The application's revisions, newest first, with the Operations that caused each.
    History { app: String },
    /// Back the application up (a Backup Operation through Velero).
    Backup {
        app: String,
        /// How long Velero keeps the backup (e.g. 720h).
        #[arg(long)]
        ttl: Option<String>,
        /// Back up volume data too.
        #[arg(long)]
        include_volumes: bool,
        /// The Velero BackupStorageLocation.
        #[arg(long)]
        storage_location: Option<String>,
        #[command(flatten)]
        request: RequestArgs,
    },
    /// Restore the application from an earlier backup (a Restore Operation).
    Restore {
        app: String,
        /// The Backup Operation to restore from.
        #[arg(long)]
        from_operation: Option<String>,
        /// The Velero Backup to restore from, by name.
        #[arg(long)]
        from_backup: Option<String>,
        /// Restore volume data as well.
        #[arg(long)]
        restore_volumes: bool,
        /// Restore into another namespace.
        #[arg(long)]
        target_namespace: Option<String>,
        /// Verify the backup in a scratch namespace instead of restoring over the app.
        #[arg(long)]
        verify: bool,
        #[command(flatten)]
        request: RequestArgs,
    },
    /// Move the application to another chart version (an Upgrade Operation through Flux).
    Upgrade {
        app: String,
        /// The chart version to move to.
        #[arg(long)]
        version: String,
        /// A YAML or JSON file merged into the application's values (RFC 7386 merge patch).
        #[arg(long)]
        values_file: Option<PathBuf>,
        /// Back the application up before upgrading.
        #[arg(long)]
        backup_first: bool,
        /// What to do if the new release fails: none, rollback, rollback-and-restore.
        #[arg(long)]
        on_failure: Option<String>,
        #[command(flatten)]
        request: RequestArgs,
    },
    /// Return the application to an earlier revision (a Rollback Operation).
    Rollback {
        app: String,
        /// The revision (see `history`); default: the previous one.
        #[arg(long = "to", value_name = "REVISION")]
        revision: Option<i64>,
        #[command(flatten)]
        request: RequestArgs,
    },
    /// Run a one-shot Job (or an Argo WorkflowTemplate) against the application.
    Runbook {
        app: String,
        /// A YAML or JSON file holding a Job spec (`template:` …).
        #[arg(long)]
        job_file: Option<PathBuf>,
        /// An Argo WorkflowTemplate by name.
        #[arg(long)]
        workflow_template: Option<String>,
        /// The WorkflowTemplate is a ClusterWorkflowTemplate.
        #[arg(long, requires = "workflow_template")]
        cluster_template: bool,
        /// A parameter, KEY=VALUE (repeatable).
        #[arg(long = "param", value_name = "KEY=VALUE")]
        params: Vec<String>,
        #[command(flatten)]
        request: RequestArgs,
    },
    /// Suspend the application: Flux stops reconciling its release.
    Suspend { app: String },
    /// Resume a suspended application.
    Resume { app: String },
    /// Ask the engine to reconcile the application's release now (Flux's
    /// `reconcile.fluxcd.io/requestedAt` annotation; Argo CD's refresh), and wait for it.
    Reconcile {
        app: String,
        /// Also ask for the chart source to be fetched again.
        #[arg(long)]
        with_source: bool,
        /// Return once asked, without waiting for the engine.
        #[arg(long)]
        no_wait: bool,
        /// How long to wait (e.g. 5m).
        #[arg(long, default_value = "5m")]
        timeout: String,
    },
}

/// Flags of every command that creates an Operation.
#[derive(Args, Debug, Clone)]
pub struct RequestArgs {
    /// The Operation's idempotency key (default: a generated one). The same id names the
    /// same Operation, so a repeated command does not act twice.
    #[arg(long)]
    pub request_id: Option<String>,
    /// Follow the Operation with a live progress line until it ends; exit non-zero if it
    /// ends Failed or Expired.
    #[arg(long)]
    pub wait: bool,
    /// How long `--wait` follows (e.g. 30m, 1h).
    #[arg(long, default_value = "30m")]
    pub timeout: String,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_go_anywhere() -> Result<(), clap::Error> {
        let cli = Cli::try_parse_from(["kubectl-vws", "get", "wiki", "-n", "team-a", "-o", "yaml"])?;
        assert_eq!(cli.namespace.as_deref(), Some("team-a"));
        assert!(matches!(
            cli.command,
            Command::Get {
                output: Output::Yaml,
                ..
            }
        ));
        let cli = Cli::try_parse_from([
            "kubectl-vws",
            "--context",
            "c1",
            "rollback",
            "wiki",
            "--to",
            "3",
            "--wait",
        ])?;
        assert!(matches!(
            cli.command,
            Command::Rollback {
                revision: Some(3),
                request: RequestArgs { wait: true, .. },
                ..
            }
        ));
        assert!(
            Cli::try_parse_from(["kubectl-vws", "upgrade", "wiki"]).is_err(),
            "--version is required"
        );
        Ok(())
    }
}
