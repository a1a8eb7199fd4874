//! The peer cluster of `hack/cluster.sh up`: an etcd and a kube-apiserver with our CRDs in a
//! second loopback-only network namespace, the one cluster where a test may change what is
//! served (Flux's CRDs) or run a second agent with its own cluster identity. Its users
//! (`engine_not_installed`, `two_clusters`, `odoo`) never run side by side
//! (`hack/e2e-lanes.py`, group `peer`).

use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;
use serde_json::Value;
use tokio::process::Command;

/// How long one kubectl call against the peer may take.
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(120);

/// The peer cluster of `hack/cluster.sh up` (`VWS_PEER_*` in the cluster's env): an etcd and
/// a kube-apiserver with our CRDs in a second loopback-only network namespace.
pub struct Peer {
    /// Its network namespace.
    pub netns: String,
    /// Its admin kubeconfig.
    pub kubeconfig: PathBuf,
}

impl Peer {
    /// The peer named by the environment (`hack/cluster.sh exec` exports it).
    pub fn from_env() -> anyhow::Result<Self> {
        let netns = std::env::var("VWS_PEER_NETNS")
            .context("VWS_PEER_NETNS is not set: start the clusters with `hack/cluster.sh up` (or `peer-up`)")?;
        let dir = PathBuf::from(std::env::var("VWS_PEER_CLUSTER_DIR").context("VWS_PEER_CLUSTER_DIR is not set")?);
        Ok(Self {
            netns,
            kubeconfig: dir.join("admin.kubeconfig"),
        })
    }

    /// `kubectl` against the peer, inside its network namespace: `Ok(stdout)`, or
    /// `Err(stderr)` when kubectl failed.
    pub async fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<Result<String, String>> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.netns])
            .arg(crate::deploy::kubectl_path())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("starting kubectl in the peer's netns")?;
        if let Some(text) = stdin {
            use tokio::io::AsyncWriteExt as _;
            let mut input = child.stdin.take().context("kubectl stdin")?;
            input.write_all(text.as_bytes()).await?;
        }
        drop(child.stdin.take());
        let out = tokio::time::timeout(KUBECTL_TIMEOUT, child.wait_with_output()).await??;
        Ok(if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        })
    }

    /// `kubectl` against the peer, inside its network namespace; its stderr is the error.
    pub async fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        self.try_kubectl(args, stdin)
            .await?
            .map_err(|stderr| anyhow::anyhow!("kubectl {}: {stderr}", args.join(" ")))
    }

    /// `kubectl ARGS -o json` against the peer, parsed.
    pub async fn json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.kubectl(&all, None).await?)?)
    }

    /// Whether the peer serves `helm.toolkit.fluxcd.io/v2` (discovery).
    pub async fn serves_flux(&self) -> anyhow::Result<bool> {
        Ok(self
            .try_kubectl(&["get", "--raw", "/apis/helm.toolkit.fluxcd.io/v2"], None)
            .await?
            .is_ok())
    }

    /// Creates namespace `name` in the peer if it does not exist.
    pub async fn ensure_namespace(&self, name: &str) -> anyhow::Result<()> {
        let doc = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n");
        self.kubectl(
            &["apply", "--server-side", "--field-manager=e2e", "-f", "-"],
            Some(&doc),
        )
        .await?;
        Ok(())
    }

    /// Deletes namespace `name` of the peer (not waiting).
    pub async fn delete_namespace(&self, name: &str) -> anyhow::Result<()> {
        self.kubectl(
            &["delete", "namespace", name, "--wait=false", "--ignore-not-found"],
            None,
        )
        .await?;
        Ok(())
    }

    /// Names of the ApplicationInstances in `namespace` of the peer.
    pub async fn app_names(&self, namespace: &str) -> anyhow::Result<Vec<String>> {
        let out = self
            .kubectl(&["get", "applicationinstances", "-n", namespace, "-o", "json"], None)
            .await?;
        let list: Value = serde_json::from_str(&out)?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_owned))
            .collect())
    }

    /// The `metadata.uid` of the peer's `kube-system` (its cluster identity).
    pub async fn cluster_uid(&self) -> anyhow::Result<String> {
        Ok(self
            .kubectl(
                &["get", "namespace", "kube-system", "-o", "jsonpath={.metadata.uid}"],
                None,
            )
            .await?
            .trim()
            .to_owned())
    }

    /// The `data` of the agent's status ConfigMap `name` in the peer, if it exists yet.
    pub async fn agent_status(&self, name: &str) -> anyhow::Result<Option<Value>> {
        let out = self
            .kubectl(
                &[
                    "get",
                    "configmap",
                    "-n",
                    "vworkspace-system",
                    name,
                    "-o",
                    "json",
                    "--ignore-not-found",
                ],
                None,
            )
            .await?;
        if out.trim().is_empty() {
            return Ok(None);
        }
        let cm: Value = serde_json::from_str(&out)?;
        Ok(Some(cm["data"].clone()))
    }
}
