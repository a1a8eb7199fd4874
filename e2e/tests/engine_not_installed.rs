//! On a cluster without Flux the app controller says so, and recovers by itself once Flux's
//! CRDs are installed.
//!
//! Runs against the peer cluster (`hack/cluster.sh up` starts it: an etcd and a
//! kube-apiserver with only our CRDs, in its own network namespace), the one cluster where
//! Flux's CRDs can come and go without disturbing other tests. The test installs them there
//! and removes them again at the end (and at the start, after an interrupted run), and
//! removes everything else it made on the peer. `two_clusters.rs` uses the peer too but
//! needs no Flux there; test files run one after another, so the two never overlap.

use std::time::{Duration, Instant};

use e2e::{
    TestContext, cluster_dir, eventually,
    peer::Peer,
    process::{ControllerProcess, binary_path},
};
use serde_json::json;

/// How long the controller may take to notice a change of the cluster's APIs: its
/// `EngineNotInstalled` recheck is 30 s.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// The Flux CRDs `hack/cluster.sh up` applies to the local cluster (from the Flux modules).
fn flux_crds() -> anyhow::Result<String> {
    let dir = cluster_dir().join("assets/flux-crds");
    anyhow::ensure!(dir.is_dir(), "{} is missing: run `hack/cluster.sh up`", dir.display());
    Ok(dir.to_string_lossy().into_owned())
}

/// Removes the Flux CRDs from the peer (with every object of theirs) and waits until their
/// APIs are no longer served. The delete is issued without `--wait` and re-issued while
/// polling: one kubectl watch can stall for minutes while a loaded API server re-creates a
/// CRD's storage, a short poll does not.
async fn remove_flux(ctx: &TestContext, peer: &Peer) -> anyhow::Result<()> {
    let crds = flux_crds()?;
    eventually(
        ctx,
        "the peer no longer serves Flux's APIs",
        Duration::from_secs(240),
        || async {
            peer.kubectl(
                &[
                    "delete",
                    "-f",
                    &crds,
                    "--ignore-not-found",
                    "--wait=false",
                    "--request-timeout=30s",
                ],
                None,
            )
            .await?;
            Ok(if peer.serves_flux().await? {
                Err("still served".to_owned())
            } else {
                Ok(())
            })
        },
    )
    .await
}

/// The `Ready` condition of ApplicationInstance `name` on the peer, for the current
/// generation: (status, reason, message).
async fn ready(peer: &Peer, namespace: &str, name: &str) -> anyhow::Result<Option<(String, String, String)>> {
    let app = peer
        .json(&["get", "applicationinstances", "-n", namespace, name])
        .await?;
    let generation = &app["metadata"]["generation"];
    Ok(app["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready" && &c["observedGeneration"] == generation)
        .map(|c| {
            let field = |f: &str| c[f].as_str().unwrap_or_default().to_owned();
            (field("status"), field("reason"), field("message"))
        }))
}

async fn wait_ready(
    ctx: &TestContext,
    peer: &Peer,
    name: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&(String, String, String)) -> bool,
) -> anyhow::Result<(String, String, String)> {
    let ns = ctx.namespace.as_str();
    eventually(
        ctx,
        &format!("ApplicationInstance {name} on the peer: {what}"),
        timeout,
        || async {
            Ok(match ready(peer, ns, name).await? {
                Some(ready) if check(&ready) => Ok(ready),
                other => Err(format!("Ready: {other:?}")),
            })
        },
    )
    .await
}

async fn apply_app(peer: &Peer, namespace: &str, name: &str) -> anyhow::Result<()> {
    let spec = serde_json::to_value(e2e::apps::app(name, "demo-app", "0.1.0", json!({})).spec)?;
    let doc = json!({
        "apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance",
        "metadata": {"name": name, "namespace": namespace}, "spec": spec,
    });
    peer.kubectl(
        &["apply", "--server-side", "--field-manager=e2e", "-f", "-"],
        Some(&doc.to_string()),
    )
    .await?;
    Ok(())
}

const NOT_INSTALLED: &str = "Flux is not installed or too old (v2.6 or newer is needed): the cluster does not serve \
                             helmreleases.helm.toolkit.fluxcd.io/v2, helmrepositories.source.toolkit.fluxcd.io/v1, \
                             ocirepositories.source.toolkit.fluxcd.io/v1, helmcharts.source.toolkit.fluxcd.io/v1";

#[tokio::test]
async fn without_flux_the_app_controller_says_so_and_recovers_once_it_is_installed() -> anyhow::Result<()> {
    let ctx = TestContext::new("engine-not-installed").await?;
    let peer = Peer::from_env()?;
    let ns = ctx.namespace.clone();
    remove_flux(&ctx, &peer).await?;
    peer.kubectl(&["create", "namespace", &ns], None).await?;
    let mut controller = start_peer_controller(&ctx, &peer)?;
    let result = scenario(&ctx, &peer, &controller).await;
    let cleanup = clean_up(&ctx, &peer, &mut controller).await;
    result.and(cleanup)
}

/// Starts the app controller in the peer's network namespace, against the peer's API
/// server, confined to the test namespace.
fn start_peer_controller(ctx: &TestContext, peer: &Peer) -> anyhow::Result<ControllerProcess> {
    let kubeconfig = peer.kubeconfig.to_string_lossy().into_owned();
    let ns = ctx.namespace.as_str();
    ControllerProcess::start_program(
        ctx.process_scope(),
        Some(&peer.netns),
        &binary_path("app-controller"),
        &format!("app-controller-{ns}-peer"),
        &[
            "--watch-namespace",
            ns,
            "--allowed-namespaces",
            ns,
            "--insecure-repository-hosts",
            "127.0.0.1",
            "--admin-addr",
            "127.0.0.1:0",
        ],
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            (
                "RUST_LOG",
                "debug,hyper=info,tower=info,h2=info,rustls=info,kube_client=info",
            ),
        ],
    )
}

async fn scenario(ctx: &TestContext, peer: &Peer, controller: &ControllerProcess) -> anyhow::Result<()> {
    let ns = ctx.namespace.as_str();
    let started = Instant::now();
    let pid = controller.pid();
    let not_installed =
        |(s, r, m): &(String, String, String)| s == "False" && r == "EngineNotInstalled" && m == NOT_INSTALLED;

    apply_app(peer, ns, "first").await?;
    wait_ready(
        ctx,
        peer,
        "first",
        "Ready=False EngineNotInstalled",
        RECOVERY_TIMEOUT,
        not_installed,
    )
    .await?;

    // A later app is told at once too: the failing Flux watches (404) must not hold up the
    // controller's other triggers (they backed off together, up to 30 s, before).
    let settle = Duration::from_secs(35).saturating_sub(started.elapsed());
    tokio::time::sleep(settle).await;
    apply_app(peer, ns, "second").await?;
    let created = Instant::now();
    wait_ready(
        ctx,
        peer,
        "second",
        "Ready=False EngineNotInstalled",
        Duration::from_secs(10),
        not_installed,
    )
    .await?;
    eprintln!("second app reported EngineNotInstalled after {:?}", created.elapsed());

    // Flux's CRDs only (no Flux controllers): the controller materialises the release and
    // waits for the engine.
    peer.kubectl(
        &["apply", "--server-side", "--field-manager=e2e", "-f", &flux_crds()?],
        None,
    )
    .await?;
    peer.kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            &flux_crds()?,
        ],
        None,
    )
    .await?;
    let installed = Instant::now();
    for name in ["first", "second"] {
        let now = wait_ready(
            ctx,
            peer,
            name,
            "Ready=Unknown AwaitingEngine",
            RECOVERY_TIMEOUT,
            |(s, r, _)| s == "Unknown" && r == "AwaitingEngine",
        )
        .await?;
        eprintln!(
            "{name} recovered {:?} after the CRDs were installed: {now:?}",
            installed.elapsed()
        );
        let release = peer
            .json(&["get", "helmreleases.helm.toolkit.fluxcd.io", "-n", ns, name])
            .await?;
        anyhow::ensure!(
            release["metadata"]["ownerReferences"][0]["name"] == name,
            "{name}: created for the ApplicationInstance: {release}"
        );
        // The chart source is shared by the apps of the namespace: the release names it.
        let source_name = release["spec"]["chart"]["spec"]["sourceRef"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let source = peer
            .json(&[
                "get",
                "helmrepositories.source.toolkit.fluxcd.io",
                "-n",
                ns,
                &source_name,
            ])
            .await?;
        anyhow::ensure!(
            source["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "vworkspace-operator"
                && release["metadata"]["labels"]["vworkspace.io/chart-source"] == source_name.as_str(),
            "{name}: created for the ApplicationInstance: {source}"
        );
    }
    controller.check_running("recovery")?;
    anyhow::ensure!(controller.pid() == pid, "recovered without a restart");
    Ok(())
}

/// Leaves the peer as it was: the apps deleted through the controller (their finalizer),
/// then what the controller made in the namespace, the Flux CRDs and the namespace itself.
/// The peer has no kube-controller-manager, so the namespace is finalized here once empty.
async fn clean_up(ctx: &TestContext, peer: &Peer, controller: &mut ControllerProcess) -> anyhow::Result<()> {
    let ns = ctx.namespace.as_str();
    let deleted = peer
        .try_kubectl(
            &[
                "delete",
                "applicationinstances",
                "--all",
                "-n",
                ns,
                "--wait=true",
                "--timeout=60s",
            ],
            None,
        )
        .await?;
    controller.kill().await?;
    if let Err(e) = deleted {
        // Not deleted through the controller (a failed run): let them go without it.
        eprintln!("apps not deleted through the controller: {e}");
        for name in ["first", "second"] {
            let _ = peer
                .try_kubectl(
                    &[
                        "patch",
                        "applicationinstances",
                        name,
                        "-n",
                        ns,
                        "--type=merge",
                        "-p",
                        r#"{"metadata":{"finalizers":null}}"#,
                    ],
                    None,
                )
                .await?;
        }
    }
    let mut kinds = "applicationinstances,operations,serviceaccounts,roles,rolebindings,configmaps,secrets,\
                     events.events.k8s.io"
        .to_owned();
    if peer.serves_flux().await? {
        kinds.push_str(",helmreleases.helm.toolkit.fluxcd.io,helmrepositories.source.toolkit.fluxcd.io");
    }
    eventually(
        ctx,
        &format!("no {kinds} left in {ns} on the peer"),
        Duration::from_secs(240),
        || async {
            peer.kubectl(
                &[
                    "delete",
                    &kinds,
                    "--all",
                    "-n",
                    ns,
                    "--wait=false",
                    "--request-timeout=30s",
                ],
                None,
            )
            .await?;
            let left = peer
                .kubectl(&["get", &kinds, "-n", ns, "-o", "name", "--request-timeout=30s"], None)
                .await?;
            Ok(if left.trim().is_empty() { Ok(()) } else { Err(left) })
        },
    )
    .await?;
    remove_flux(ctx, peer).await?;
    peer.kubectl(&["delete", "namespace", ns, "--wait=false"], None).await?;
    let finalize = json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns}, "spec": {"finalizers": []},
    });
    let path = format!("/api/v1/namespaces/{ns}/finalize");
    peer.kubectl(&["replace", "--raw", &path, "-f", "-"], Some(&finalize.to_string()))
        .await?;
    let left = peer
        .kubectl(&["get", "namespace", ns, "--ignore-not-found", "-o", "name"], None)
        .await?;
    anyhow::ensure!(left.trim().is_empty(), "namespace {ns} left on the peer: {left}");
    Ok(())
}
