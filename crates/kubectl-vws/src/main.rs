//! `kubectl-vws`: parse, connect, run one command; errors to stderr with exit status 1.

use std::io::IsTerminal;

use clap::Parser;
use kubectl_vws::{cli::Cli, commands};

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let terminal = std::io::stdout().is_terminal();
    let result = async {
        let session = commands::Session::connect(cli.kubeconfig.as_deref(), cli.context, cli.namespace).await?;
        let mut out = std::io::stdout().lock();
        commands::run(&session, cli.command, &mut out, terminal).await
    }
    .await;
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
