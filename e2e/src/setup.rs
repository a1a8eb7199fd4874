//! What `hack/cluster.sh up` sets up and every suite relies on, and the check at the start of
//! every suite (test binary) that it is there: nothing of ours or Flux's is installed or runs
//! *in* the cluster (only the bundle tests install one, removed on every exit path; what a
//! killed bundle run installed is uninstalled whole), the out-of-cluster Flux
//! runs, the release ClusterRole exists, and no test's cluster-admin binding outlives its
//! process. What a failed or killed suite left is put back (and named on stderr), so it never
//! changes another suite's outcome; a component that cannot be put back from here fails the
//! suite with its name.

use std::{path::Path, process::Stdio, time::Duration};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::{bundle, cluster_dir, deploy, repo_root};

/// The release ClusterRole as `hack/cluster.sh up` applies it (`apply_release_role`): the
/// cluster's Flux runs every test's release under it. The bundle and the chart ship it too, so
/// removing one of them deletes it.
const RELEASE_ROLE_FILE: &str = "deploy/base/release-rbac/clusterrole.yaml";

/// The prefix of the cluster-admin ClusterRoleBindings the chart test gives its installer.
pub const INSTALLER_BINDING_PREFIX: &str = "e2e-vworkspace-installer-";

/// The label on such a binding naming the test process that made it: once that process is
/// gone (a SIGKILLed run), the binding is removed at the next suite's start.
pub const INSTALLER_PID_LABEL: &str = "vworkspace.io/e2e-installer-pid";

/// The out-of-cluster Flux components `hack/cluster.sh restart-flux` starts again.
const OUT_OF_CLUSTER_FLUX: [&str; 2] = ["source-controller", "helm-controller"];

/// Applies the release ClusterRole again, as `hack/cluster.sh up` does.
pub async fn restore_release_role() -> anyhow::Result<()> {
    let file = repo_root().join(RELEASE_ROLE_FILE);
    deploy::kubectl(
        &[
            "apply",
            "--server-side",
            "--field-manager=vws-cluster-up",
            "-f",
            &file.to_string_lossy(),
        ],
        None,
    )
    .await?;
    Ok(())
}

/// The components `hack/cluster.sh status` lists as `stopped` (one `NAME  stopped` line each;
/// the real node's components are listed the same way).
pub fn stopped_components(status: &str) -> Vec<String> {
    status
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?;
            (words.next() == Some("stopped") && words.next().is_none()).then(|| name.to_owned())
        })
        .collect()
}

/// `hack/cluster.sh status`'s output, whatever its exit status (it fails when one is stopped).
async fn cluster_status() -> anyhow::Result<String> {
    let out = tokio::process::Command::new(repo_root().join("hack/cluster.sh"))
        .arg("status")
        .stdin(Stdio::null())
        .output()
        .await
        .context("running hack/cluster.sh status")?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether process `pid` runs (the tests and `hack/cluster.sh` share one pid namespace).
pub fn process_alive(pid: &str) -> bool {
    !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) && Path::new("/proc").join(pid).exists()
}

/// The installer bindings whose test process is gone, or that name none (`items` of a
/// ClusterRoleBinding list).
pub fn orphaned_installer_bindings(bindings: &Value) -> Vec<String> {
    bindings["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|binding| {
            let name = binding.pointer("/metadata/name")?.as_str()?;
            let label = format!("/metadata/labels/{}", INSTALLER_PID_LABEL.replace('/', "~1"));
            let pid = binding.pointer(&label).and_then(Value::as_str).unwrap_or_default();
            (name.starts_with(INSTALLER_BINDING_PREFIX) && !process_alive(pid)).then(|| name.to_owned())
        })
        .collect()
}

/// How long the check waits for another test process's check (they take turns).
const LOCK_TIMEOUT: Duration = Duration::from_secs(600);

/// Holds the machine-wide lock of the start-of-suite check: suites that start together (the
/// lanes of `hack/e2e-lanes.py`) would otherwise reap and restart Flux at the same time.
async fn lock_start_check() -> anyhow::Result<std::fs::File> {
    let path = cluster_dir().join("e2e-suite-start.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let deadline = tokio::time::Instant::now() + LOCK_TIMEOUT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => bail!("locking {}: {e:?}", path.display()),
        }
    }
}

/// The start-of-suite check (module docs). Returns what it put back, as words for stderr.
pub async fn ensure_cluster_setup() -> anyhow::Result<Vec<String>> {
    let _lock = lock_start_check().await?;
    let mut restored = Vec::new();
    let uninstalled = bundle::uninstall_leftover_bundles()
        .await
        .context("uninstalling what a killed bundle run left installed")?;
    if !uninstalled.is_empty() {
        restored.push(format!("uninstalled the bundles of killed runs: {uninstalled:?}"));
    }
    let reaped = bundle::reap_in_cluster_components()
        .await
        .context("removing what an earlier suite left running in the cluster")?;
    if !reaped.is_empty() {
        restored.push(format!("removed from the cluster: {reaped:?}"));
    }

    let mut stopped = stopped_components(&cluster_status().await?);
    if stopped.iter().any(|c| OUT_OF_CLUSTER_FLUX.contains(&c.as_str())) {
        // A bundle run killed while its own Flux replaced the cluster's (never two at once:
        // the in-cluster one was reaped just above).
        bundle::cluster_sh(&["restart-flux"]).context("starting the out-of-cluster Flux again")?;
        restored.push(format!(
            "the out-of-cluster Flux was stopped ({stopped:?}); started it again"
        ));
        stopped = stopped_components(&cluster_status().await?);
    }
    if !stopped.is_empty() {
        bail!(
            "the cluster's own components are not running: {stopped:?} (`hack/cluster.sh status`; \
             `hack/cluster.sh down && hack/cluster.sh up` starts the cluster anew)"
        );
    }

    let role = deploy::kubectl(
        &[
            "get",
            "clusterrole",
            api::RELEASE_ROLE,
            "--ignore-not-found",
            "-o",
            "name",
        ],
        None,
    )
    .await?;
    if role.trim().is_empty() {
        restore_release_role().await?;
        restored.push(format!(
            "the release ClusterRole {} was missing; applied it again",
            api::RELEASE_ROLE
        ));
    }

    let bindings: Value = serde_json::from_str(
        &deploy::kubectl(
            &["get", "clusterrolebindings.rbac.authorization.k8s.io", "-o", "json"],
            None,
        )
        .await?,
    )?;
    for binding in orphaned_installer_bindings(&bindings) {
        deploy::kubectl(&["delete", "clusterrolebinding", &binding, "--ignore-not-found"], None).await?;
        restored.push(format!(
            "deleted cluster-admin binding {binding} of a test process that is gone"
        ));
    }
    Ok(restored)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn stopped_components_reads_status_lines() {
        let status = "etcd                     running (pid 12)\n\
                      helm-controller          stopped\n\
                      node-kubelet             stopped\n\
                      apiserver version: v1.35.0\n\
                      velero BackupStorageLocation default: stopped now\n";
        assert_eq!(stopped_components(status), ["helm-controller", "node-kubelet"]);
    }

    #[test]
    fn installer_bindings_of_live_processes_stay() {
        let own = std::process::id().to_string();
        let bindings = json!({"items": [
            {"metadata": {"name": "e2e-vworkspace-installer-a", "labels": {INSTALLER_PID_LABEL: own}}},
            {"metadata": {"name": "e2e-vworkspace-installer-b", "labels": {INSTALLER_PID_LABEL: "999999999"}}},
            {"metadata": {"name": "e2e-vworkspace-installer-c"}},
            {"metadata": {"name": "cluster-admin"}},
        ]});
        assert_eq!(
            orphaned_installer_bindings(&bindings),
            ["e2e-vworkspace-installer-b", "e2e-vworkspace-installer-c"]
        );
    }
}
