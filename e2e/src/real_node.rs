//! The local cluster's real node (`hack/node.sh`): where a test puts a pod that must
//! really run, and the images that node holds (`hack/build-images.sh`, imported by
//! `hack/e2e.sh`; never pulled).
//!
//! Placement is always explicit: the real node is tainted, so a pod lands there only
//! with [`placement`]; without it, it lands on the kwok node and never runs.

use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::LogParams};
use serde_json::{Value, json};

use crate::{TestContext, cluster_dir, eventually};

/// The real node's name (`NODE_NAME` in `hack/node.sh`).
pub const REAL_NODE: &str = "real-node-0";
/// The fake node's name (`hack/cluster.sh`).
pub const KWOK_NODE: &str = "kwok-node-0";
/// The real node's taint key; its pods tolerate it.
pub const TAINT_KEY: &str = "vws.dev/real-node";

/// Fails unless the cluster runs the real node (`hack/cluster.sh up` without
/// `VWS_REAL_NODE=0` exports `VWS_REAL_NODE` in its env).
pub fn require_real_node() -> anyhow::Result<()> {
    match std::env::var("VWS_REAL_NODE") {
        Ok(node) if node == REAL_NODE => Ok(()),
        _ => bail!(
            "this test needs the real node {REAL_NODE}: start the cluster without VWS_REAL_NODE=0 \
             and run the tests through `hack/cluster.sh exec` (or `just e2e`)"
        ),
    }
}

/// The pod-spec fields that put a pod on the real node: a nodeSelector and a
/// toleration of its taint. Merge them into a pod template's `spec`.
pub fn placement() -> Value {
    json!({
        "nodeSelector": {"kubernetes.io/hostname": REAL_NODE},
        "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
    })
}

/// The full name of an image the real node holds, by repository
/// (e.g. `registry.invalid/vworkspace/busybox`), from `images/images.txt`.
pub fn image(repository: &str) -> anyhow::Result<String> {
    let list = cluster_dir().join("images/images.txt");
    let text = std::fs::read_to_string(&list)
        .with_context(|| format!("reading {} (run hack/build-images.sh)", list.display()))?;
    let prefix = format!("{repository}:");
    text.lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .find(|name| name.starts_with(&prefix))
        .map(str::to_owned)
        .with_context(|| format!("no image {repository} in {}", list.display()))
}

/// A restricted securityContext (Pod Security `restricted`) for a container.
pub fn restricted_container_security() -> Value {
    json!({
        "runAsNonRoot": true,
        "runAsUser": 65532,
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

/// Waits until pod `name` is in `phase` (`Running`, `Succeeded`), failing at once if it
/// ends `Failed`; returns the pod.
pub async fn wait_pod_phase(ctx: &TestContext, name: &str, phase: &str, timeout: Duration) -> anyhow::Result<Pod> {
    let pods: Api<Pod> = ctx.api();
    // A Failed pod ends the wait as a value (`eventually` retries errors, which would wait
    // out the timeout on a pod that can never reach `phase`).
    let outcome = eventually(ctx, &format!("pod {name} {phase}"), timeout, || {
        let pods = pods.clone();
        async move {
            let Some(pod) = pods.get_opt(name).await? else {
                return Ok(Err("not created yet".to_string()));
            };
            let current = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
            if current == phase {
                return Ok(Ok(Ok(pod)));
            }
            if current == "Failed" && phase != "Failed" {
                return Ok(Ok(Err(format!("pod {name} Failed: {:?}", pod.status))));
            }
            Ok(Err(format!("phase {current:?}")))
        }
    })
    .await?;
    outcome.map_err(|failed| anyhow::anyhow!(failed))
}

/// The log of a pod's (only) container, through the API server and the kubelet.
pub async fn pod_log(ctx: &TestContext, name: &str) -> anyhow::Result<String> {
    let pods: Api<Pod> = ctx.api();
    Ok(pods.logs(name, &LogParams::default()).await?)
}

/// One HTTP GET from the test's network namespace (a pod IP, or a ClusterIP through
/// kube-proxy's rules there): `Ok(body)` on a 2xx answer, `Err(what happened)` otherwise,
/// the shape [`eventually`] polls.
pub async fn http_get(url: &str) -> anyhow::Result<Result<String, String>> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(3))
        .build()?;
    Ok(match client.get(url).send().await {
        Ok(answer) if answer.status().is_success() => Ok(answer.text().await?),
        Ok(answer) => Err(format!("HTTP {}", answer.status())),
        Err(e) => Err(format!("{e:#}")),
    })
}
