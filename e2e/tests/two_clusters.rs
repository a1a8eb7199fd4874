//! Two real clusters driven by one control plane stay apart.
//!
//! The local cluster and its peer (`hack/cluster.sh up` starts both: the peer is an etcd
//! and a kube-apiserver with our CRDs, in a second loopback-only network namespace) each
//! run an agent with its own key against one simulator (`odoo-sim`, a simulator of the
//! Odoo module). The only path between the namespaces is one port carried over a Unix
//! socket (`hack/netns-bridge.py`), the peer's way to the simulator, as every cluster
//! reaches Odoo. Written as the attack: intent for one cluster must never land on the
//! other, and the first cluster's key copied to the peer must be refused there
//! (`ClusterMismatch`: the key is bound to the first cluster's identity) with nothing
//! applied.

use std::{path::Path, time::Duration};

use anyhow::Context as _;
use e2e::{
    TestContext,
    agent::{AGENT_TIMEOUT, PullAgentFlags, SimProcess, api_key, object_ack, start_agent, wait_sim, work_dir},
    apps::app,
    eventually,
    peer::Peer,
    process::{ControllerProcess, binary_path, free_loopback_addr},
    repo_root,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use serde_json::{Value, json};

/// Carries `127.0.0.1:<port>` of this namespace (the simulator) into the peer's namespace
/// at `127.0.0.1:<peer_port>`; returns both bridge processes (stopped on drop).
async fn bridge_into_peer(
    ctx: &TestContext,
    peer: &Peer,
    port: u16,
    peer_port: u16,
) -> anyhow::Result<[ControllerProcess; 2]> {
    let script = repo_root().join("hack/netns-bridge.py");
    let socket = work_dir(ctx)?.join("sim.sock");
    let (script, socket) = (path_str(&script)?, path_str(&socket)?);
    let python = Path::new("python3");
    let here = ControllerProcess::start_program(
        ctx.process_scope(),
        None,
        python,
        &format!("bridge-{}-sim", ctx.namespace),
        &[script, "unix-to-tcp", socket, &format!("127.0.0.1:{port}")],
        &[],
    )?;
    wait_logged(ctx, &here, "ready").await?;
    let there = ControllerProcess::start_program(
        ctx.process_scope(),
        Some(&peer.netns),
        python,
        &format!("bridge-{}-peer", ctx.namespace),
        &[script, "tcp-to-unix", &format!("127.0.0.1:{peer_port}"), socket],
        &[],
    )?;
    wait_logged(ctx, &there, "ready").await?;
    Ok([here, there])
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

async fn wait_logged(ctx: &TestContext, process: &ControllerProcess, line: &str) -> anyhow::Result<()> {
    eventually(
        ctx,
        &format!("{} logs {line:?}", process.log_path.display()),
        Duration::from_secs(20),
        || async {
            Ok(if process.logs().lines().any(|l| l == line) {
                Ok(())
            } else {
                Err(process.logs())
            })
        },
    )
    .await
}

/// Starts an agent in the peer's namespace, against the peer's API server, pulling from
/// the simulator through the bridge at `127.0.0.1:<sim_port>`.
fn start_peer_agent(
    ctx: &TestContext,
    peer: &Peer,
    sim_port: u16,
    cluster: &str,
    key_file: &Path,
    tag: &str,
) -> anyhow::Result<ControllerProcess> {
    let url = format!("http://127.0.0.1:{sim_port}");
    // The peer's namespace has only this agent: any port is free there.
    let admin = format!("127.0.0.1:{}", free_loopback_addr()?.port());
    let channel = format!("127.0.0.1:{}", free_loopback_addr()?.port());
    let kubeconfig = path_str(&peer.kubeconfig)?;
    let status_configmap = format!("agent-status{tag}");
    let args = PullAgentFlags {
        control_plane_url: &url,
        key_file: path_str(key_file)?,
        cluster,
        namespace: &ctx.namespace,
        admin_addr: &admin,
        channel_addr: &channel,
        status_configmap: &status_configmap,
    }
    .args();
    ControllerProcess::start_program(
        ctx.process_scope(),
        Some(&peer.netns),
        &binary_path("agent"),
        &format!("agent-{}-peer{tag}", ctx.namespace),
        &args,
        &[
            ("KUBECONFIG", kubeconfig),
            ("POD_NAMESPACE", "vworkspace-system"),
            ("RUST_LOG", "debug,tower=info,h2=info"),
        ],
    )
}

fn app_spec() -> anyhow::Result<Value> {
    Ok(serde_json::to_value(app("x", "demo-app", "0.1.0", json!({})).spec)?)
}

#[tokio::test]
async fn intent_for_one_cluster_never_lands_on_the_other_and_a_copied_key_is_refused() -> anyhow::Result<()> {
    let ctx = TestContext::new("two-clusters").await?;
    let peer = Peer::from_env()?;
    let ns = ctx.namespace.as_str();
    peer.ensure_namespace(ns).await?;
    peer.ensure_namespace("vworkspace-system").await?;

    // One simulator, two cluster records, each with its own key.
    let sim = SimProcess::start(&ctx).await?;
    let peer_cluster = format!("peer-{ns}");
    let peer_key = api_key("peer");
    let peer_key_file = work_dir(&ctx)?.join("peer-api-key");
    std::fs::write(&peer_key_file, &peer_key)?;
    sim.admin(
        "POST",
        "/sim/clusters",
        Some(json!({"name": peer_cluster, "api_key": peer_key})),
    )
    .await?;
    let peer_path = |rest: &str| format!("/sim/clusters/{peer_cluster}{rest}");

    let sim_port: u16 = sim.url.rsplit(':').next().context("simulator port")?.parse()?;
    let peer_sim_port = free_loopback_addr()?.port();
    let _bridge = bridge_into_peer(&ctx, &peer, sim_port, peer_sim_port).await?;

    let _agent = start_agent(&ctx, &sim, &sim.key_file, "", &[]).await?;
    let mut peer_agent = start_peer_agent(&ctx, &peer, peer_sim_port, &peer_cluster, &peer_key_file, "")?;

    // Each cluster gets its own intent.
    let rev_here = sim.set_app(ns, "only-here", app_spec()?).await?;
    let peer_rev = sim
        .admin(
            "PUT",
            &peer_path(&format!("/applications/{ns}/only-peer")),
            Some(app_spec()?),
        )
        .await?["revision"]
        .as_u64()
        .context("revision")?;
    wait_sim(&ctx, &sim, "this cluster applied its intent", AGENT_TIMEOUT, |v| {
        (object_ack(v, rev_here, ns, "only-here")?["outcome"] == "applied").then_some(())
    })
    .await?;
    eventually(&ctx, "the peer applied its intent", AGENT_TIMEOUT, || async {
        let view = sim.admin("GET", &peer_path(""), None).await?;
        let applied = object_ack(&view, peer_rev, ns, "only-peer").is_some_and(|a| a["outcome"] == "applied");
        Ok(if applied { Ok(()) } else { Err(view.to_string()) })
    })
    .await?;
    let here: Vec<String> = ctx
        .api::<api::ApplicationInstance>()
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|a| a.metadata.name.unwrap_or_default())
        .collect();
    assert_eq!(
        here,
        ["only-here"],
        "this cluster holds only its own intent (revision {rev_here})"
    );
    assert_eq!(
        peer.app_names(ns).await?,
        ["only-peer"],
        "the peer holds only its own intent"
    );

    // This cluster's key, copied to the peer: refused there, and nothing of its intent lands.
    peer_agent.kill().await?;
    let copied = work_dir(&ctx)?.join("copied-api-key");
    std::fs::copy(&sim.key_file, &copied)?;
    let _thief = start_peer_agent(&ctx, &peer, peer_sim_port, &sim.cluster, &copied, "-copied")?;
    eventually(
        &ctx,
        "the copied key is refused with ClusterMismatch",
        AGENT_TIMEOUT,
        || async {
            let status = peer.agent_status("agent-status-copied").await?;
            let text = status.as_ref().map(Value::to_string).unwrap_or_default();
            Ok(if text.contains("ClusterMismatch") {
                Ok(())
            } else {
                Err(text)
            })
        },
    )
    .await?;
    // New intent for this cluster while the copied key is in use on the peer.
    let rev_after = sim.set_app(ns, "after-copy", app_spec()?).await?;
    wait_sim(&ctx, &sim, "this cluster applied the new intent", AGENT_TIMEOUT, |v| {
        (object_ack(v, rev_after, ns, "after-copy")?["outcome"] == "applied").then_some(())
    })
    .await?;
    // A few of the thief's sync intervals: still nothing of this cluster's intent on the peer.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        peer.app_names(ns).await?,
        ["only-peer"],
        "nothing of this cluster's intent was applied on the peer with the copied key"
    );
    // The record stays bound to this cluster: the thief's contact did not rebind it.
    let view = sim.view().await?;
    let uid_here = Api::<Namespace>::all(ctx.client.clone())
        .get("kube-system")
        .await?
        .metadata
        .uid;
    assert_eq!(
        view["uid"].as_str().map(str::to_owned),
        uid_here,
        "record bound to this cluster: {view}"
    );
    Ok(())
}
