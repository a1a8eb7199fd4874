//! Runs our own binaries out of cluster as child processes, with their output
//! captured to a file (so tests can prove what they log and what they do not).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
};

use anyhow::Context as _;
use tokio::process::{Child, Command};

use crate::{cluster_dir, repo_root};

/// A running controller binary; killed on drop.
pub struct ControllerProcess {
    child: Child,
    pub log_path: PathBuf,
}

/// Path of a workspace binary built by cargo (same profile as the tests).
pub fn binary_path(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
    target.join(profile).join(name)
}

impl ControllerProcess {
    /// Starts `binary` with `args`, KUBECONFIG for the local cluster, and logs to
    /// `<cluster>/logs/<log_name>.log`.
    pub async fn start(binary: &str, log_name: &str, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let path = binary_path(binary);
        anyhow::ensure!(
            path.exists(),
            "{} is not built; run `cargo build --bins` first",
            path.display()
        );
        let log_path = cluster_dir().join("logs").join(format!("{log_name}.log"));
        std::fs::create_dir_all(log_path.parent().context("log dir")?)?;
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = Command::new(&path);
        cmd.args(args)
            .env("KUBECONFIG", cluster_dir().join("admin.kubeconfig"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        // Least privilege by default: our controllers run as their ServiceAccount, with the
        // RBAC of the deploy bundle (an explicit KUBECONFIG in `env` still wins).
        if let Some(kubeconfig) = crate::deploy::least_privilege_kubeconfig(binary).await? {
            cmd.env("KUBECONFIG", kubeconfig);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().with_context(|| format!("starting {}", path.display()))?;
        Ok(Self { child, log_path })
    }

    /// Everything the process has logged so far.
    pub fn logs(&self) -> String {
        read_log(&self.log_path)
    }

    /// Stops the process (SIGKILL; tests use it to simulate crashes too).
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }

    /// The process id (for RSS measurements).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}
