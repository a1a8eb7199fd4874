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

    /// Set in the child process [`sigterm_cancels_the_token`] starts.
    const SIGNAL_CHILD: &str = "VWS_SHUTDOWN_TEST_CHILD";

    /// The signal path itself: a SIGTERM sent to the process (as the kubelet sends on pod
    /// deletion) cancels the token. Runs in a child process (this test binary again, this
    /// one test), so the signal reaches no other test.
    #[tokio::test]
    async fn sigterm_cancels_the_token() {
        if std::env::var_os(SIGNAL_CHILD).is_some() {
            let token = cancel_on_signal(CancellationToken::new());
            // The current-thread runtime runs the spawned task (which installs the handlers)
            // while this one sleeps.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let sent = std::process::Command::new("kill")
                .args(["-TERM", &std::process::id().to_string()])
                .status()
                .unwrap();
            assert!(sent.success());
            tokio::time::timeout(Duration::from_secs(5), token.cancelled())
                .await
                .expect("SIGTERM cancelled the token");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["shutdown::tests::sigterm_cancels_the_token", "--exact", "--nocapture"])
            .env(SIGNAL_CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "the child failed ({}): {text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[tokio::test]
    async fn shutdown_signal_is_pending_without_a_signal() {
        let res = tokio::time::timeout(Duration::from_millis(50), shutdown_signal()).await;
        assert!(res.is_err());
    }
}
