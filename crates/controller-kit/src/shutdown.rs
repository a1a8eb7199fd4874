//! Graceful shutdown.
//!
//! One [`CancellationToken`] per process is the shutdown signal: [`cancel_on_signal`]
//! cancels it on SIGINT/SIGTERM, and every long-running task (controllers, admin
//! server, leader elector) takes a clone and stops when it is cancelled. Child tokens
//! (`token.child_token()`) let a subsystem stop early without stopping the process.

pub use tokio_util::sync::CancellationToken;

/// Completes on the first SIGINT (Ctrl-C) or SIGTERM (what the kubelet sends on pod deletion).
///
/// If a handler cannot be installed (practically never), the failure is logged and
/// the other signal is still awaited, rather than failing startup.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %err, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };

    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();

    tokio::select! {
        () = ctrl_c => tracing::info!("received SIGINT, shutting down"),
        () = terminate => tracing::info!("received SIGTERM, shutting down"),
    }
}

/// Spawns a task that cancels `token` when [`shutdown_signal`] completes. Returns the token for chaining.
pub fn cancel_on_signal(token: CancellationToken) -> CancellationToken {
    let returned = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = shutdown_signal() => token.cancel(),
            // Cancelled by someone else (e.g. a fatal error): nothing left to do.
            () = token.cancelled() => {}
        }
    });
    returned
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn signal_task_ends_when_token_is_cancelled_elsewhere() {
        let token = cancel_on_signal(CancellationToken::new());
        let child = token.child_token();
        token.cancel();
        tokio::time::timeout(Duration::from_secs(1), child.cancelled())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn shutdown_signal_is_pending_without_a_signal() {
        let res = tokio::time::timeout(Duration::from_millis(50), shutdown_signal()).await;
        assert!(res.is_err());
    }
}
