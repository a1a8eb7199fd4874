//! The install bundle running *in* the cluster, on the real node (issue 15, point 3): the
//! `full` overlay, from the images `hack/build-images.sh` built and `hack/cluster.sh
//! load-images` imported (never pulled), with only placement, the allow-list and the app
//! controller's replicas and chart-host flag changed. Every Deployment becomes Available
//! with its probes passing and no restart, on the real node; the controllers authenticate
//! with in-cluster config and their own ServiceAccount token; two app-controller replicas
//! elect one leader and the other takes over when the leader's pod is deleted; the product
//! path runs with everything in pods (odoo-sim outside the cluster, the agent, the app
//! controller, the bundled Flux, the sample app answering on its Service); removing the
//! bundle leaves none of its objects behind.
//!
//! The out-of-cluster Flux of `hack/cluster.sh` is stopped for the test (the bundle brings
//! its own; two helm-controllers would fight over the HelmReleases) and always started
//! again at the end, also when the test fails. Run no other e2e binary at the same time
//! (`just e2e` runs one binary at a time): it would find no Flux while that test runs, and
//! these tests remove the bundle's RBAC, which the other binaries' controllers run under
//! (`deploy::ensure_bundle_rbac` applies it once per process).
//!
//! CRDs are not part of what is installed and removed: ours (`deploy/crds/`) and Flux's are
//! applied by `hack/cluster.sh up` and the rest of the suite needs them (deleting Flux's CRDs
//! would delete every HelmRelease in the cluster). The overlay's Flux CRDs are checked with a
//! server-side dry run to be the ones the cluster serves.

use std::time::{Duration, Instant};

use api::ApplicationInstance;
use e2e::{
    TestContext,
    agent::{SimProcess, object_ack, report, summary, wait_sim},
    bundle::{
        self, BundleOptions, FLUX_NAMESPACE, InstalledBundle, OutOfClusterFluxStopped, RenderedBundle,
        other_credentials, pods_summary, projected_token_mount, restarts,
    },
    deploy::{self, SYSTEM_NAMESPACE, http_get, kind, lease_holder, metric_sum, name, to_yaml},
    eventually, flux, setup,
};
use k8s_openapi::api::{
    apps::v1::Deployment,
    coordination::v1::Lease,
    core::v1::{Pod, Service},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams},
};
use serde_json::{Value, json};

const APP_CONTROLLER: &str = "app-controller";
const APP_CONTROLLER_LEASE: &str = "vworkspace-app-controller";
/// Where the kubelet mounts the ServiceAccount token that in-cluster config reads.
const IN_CLUSTER_TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The out-of-cluster helm-controller's health endpoint (`hack/cluster.sh`).
const OUT_OF_CLUSTER_HELM_CONTROLLER_HEALTH: &str = "127.0.0.1:19441";
const PRODUCT_TIMEOUT: Duration = Duration::from_secs(240);
/// How long removing a bundle may take (see `InstalledBundle::remove`).
const REMOVAL_TIMEOUT: Duration = Duration::from_secs(600);
/// The chart repository as the test process (and the cluster's out-of-cluster Flux) reach it.
const CHART_REPO_ADDR: &str = "127.0.0.1:18879";

/// The tests take turns: one stops the cluster's Flux, the other uses it, and both install
/// and remove the bundle's objects in `vworkspace-system`.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn phase(started: Instant, what: &str) {
    eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
}

#[tokio::test]
async fn full_overlay_runs_on_the_real_node_end_to_end_and_leaves_nothing_behind() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let node = bundle::real_node()?;
    let ctx = TestContext::new("bundle-full").await?;
    let ns = ctx.namespace.clone();
    let client = ctx.client.clone();

    // The test charts are served over plain http from the node IP (pods cannot reach the
    // chart server's 127.0.0.1). The app controller refuses plain http:// to any host not
    // in --insecure-repository-hosts; 10.99.0.1 is an RFC 1918 address, which is refused
    // only when listed in --blocked-repository-cidrs (empty by default), and
    // --allowed-repository-hosts defaults to `*`. So naming that one host in
    // --insecure-repository-hosts is the whole change, and the smallest one (docs/security.md:
    // leave it empty in production, where repositories are https).
    let chart_repo = bundle::chart_repo_for_pods();
    let app_controller_args = [format!("--insecure-repository-hosts={}", bundle::url_host(&chart_repo))];
    let rendered = RenderedBundle::render(
        &ns,
        &BundleOptions {
            overlay: "full",
            node: &node,
            allowed_namespaces: &ns,
            app_controller_replicas: 2,
            app_controller_args: &app_controller_args,
            components: &[],
        },
    )
    .await?;
    let deployments = rendered.deployments();
    let mut names: Vec<&str> = deployments.iter().map(|(_, n)| n.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "agent",
            "app-controller",
            "backup-engine",
            "helm-controller",
            "restore-engine",
            "runbook-engine",
            "source-controller",
            "upgrade-engine"
        ]
    );
    for dep in rendered.of_kind(&["Deployment"]) {
        let spec = &dep["spec"]["template"]["spec"];
        assert_eq!(
            spec["nodeSelector"]["kubernetes.io/hostname"],
            node.as_str(),
            "{}",
            name(dep)
        );
        assert_eq!(
            spec["tolerations"][0]["key"],
            bundle::REAL_NODE_TAINT_KEY,
            "{}",
            name(dep)
        );
    }
    let tenancy: Vec<&Value> = rendered
        .of_kind(&["ConfigMap"])
        .into_iter()
        .filter(|c| name(c).starts_with("vworkspace-tenancy"))
        .collect();
    assert_eq!(tenancy.len(), 1, "one tenancy ConfigMap (merged, not added)");
    assert_eq!(tenancy[0]["data"]["allowed-namespaces"], ns.as_str());
    phase(started, "rendered the full overlay for the real node");

    // The overlay's Flux CRDs are the ones the cluster serves (dry run; see the module doc).
    let crds = rendered.of_kind(&["CustomResourceDefinition"]);
    assert_eq!(crds.len(), 7, "the bundled Flux brings its 7 CRDs");
    let out = deploy::apply(&to_yaml(&crds)?, true).await?;
    assert_eq!(out.matches("serverside-applied (server dry run)").count(), 7, "{out}");
    // Ours, again, as cluster up applied them.
    let crd_dir = e2e::repo_root().join("deploy/crds");
    deploy::kubectl(
        &[
            "apply",
            "--server-side",
            "--field-manager=vws-cluster-up",
            "-f",
            &crd_dir.to_string_lossy(),
        ],
        None,
    )
    .await?;

    reap_earlier_tests().await?;
    for system_ns in [SYSTEM_NAMESPACE, FLUX_NAMESPACE] {
        bundle::wait_namespace_usable(&client, system_ns, REMOVAL_TIMEOUT).await?;
    }

    // The simulator of Odoo runs outside the cluster, on the node IP so the agent's pod
    // reaches it (plain http, as in the rest of the suite: odoo-sim serves no TLS).
    let sim = SimProcess::start_on(&ctx, &bundle::node_ip()).await?;

    let flux_guard = OutOfClusterFluxStopped::stop()?;
    assert!(
        tokio::net::TcpStream::connect(OUT_OF_CLUSTER_HELM_CONTROLLER_HEALTH)
            .await
            .is_err(),
        "the out-of-cluster helm-controller is stopped"
    );
    phase(started, "stopped the out-of-cluster Flux");

    // Namespaces first, then what the cluster owner creates for the agent (its API key and
    // its configuration: the Deployment reads both), so the agent starts once, configured.
    let to_install = rendered.without_crds();
    let (namespaces, rest): (Vec<&Value>, Vec<&Value>) = to_install.iter().partition(|d| kind(d) == "Namespace");
    let installed = InstalledBundle::new(&rendered.dir, &to_install, &ns)?;
    // Namespaces are in `to_install` too: applying them first only orders the creation.
    deploy::apply(&to_yaml(&namespaces)?, false).await?;
    let agent_objects = [
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "agent-credentials", "namespace": SYSTEM_NAMESPACE},
            "stringData": {"api-key": sim.key},
        }),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "agent-config", "namespace": SYSTEM_NAMESPACE},
            "data": {
                "VWS_CONTROL_PLANE_URL": sim.url,
                "VWS_INSECURE_ALLOW_HTTP": "true",
                "VWS_CLUSTER_NAME": sim.cluster,
                "VWS_ALLOWED_NAMESPACES": ns,
                "VWS_SYNC_INTERVAL": "2s",
                "VWS_REQUEST_TIMEOUT": "3s",
                "VWS_MAX_BACKOFF": "4s",
            },
        }),
    ];
    deploy::apply(&to_yaml(&agent_objects.iter().collect::<Vec<_>>())?, false).await?;
    installed.apply().await?;
    assert!(!rest.is_empty());
    phase(started, &format!("applied {} objects of the bundle", to_install.len()));

    // Every Deployment Available on the real node, probes passing, no restart.
    let mut pods: Vec<Pod> = Vec::new();
    for (dep_ns, dep_name) in &deployments {
        let dep_pods = bundle::wait_available_on(&ctx, dep_ns, dep_name, &node, bundle::ROLLOUT_TIMEOUT).await?;
        phase(
            started,
            &format!("{dep_ns}/{dep_name} Available ({} pod(s))", dep_pods.len()),
        );
        pods.extend(dep_pods);
    }
    assert_eq!(pods.len(), deployments.len() + 1, "app-controller runs 2 replicas");

    // In-cluster config with their own ServiceAccount token: each pod runs as its
    // Deployment's ServiceAccount, has the kubelet's projected token at the in-cluster path
    // and no other credentials (no kubeconfig, no Secret volume, no KUBECONFIG).
    for (dep_ns, dep_name) in &deployments {
        let dep: Deployment = Api::namespaced(client.clone(), dep_ns).get(dep_name).await?;
        let sa = dep
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default();
        assert!(!sa.is_empty(), "{dep_name} names its ServiceAccount");
        for pod in bundle::deployment_pods(&client, &dep).await? {
            let pod_name = pod.metadata.name.clone().unwrap_or_default();
            let spec = pod.spec.as_ref();
            assert_eq!(
                spec.and_then(|s| s.service_account_name.as_deref()),
                Some(sa.as_str()),
                "{pod_name}"
            );
            assert_eq!(
                projected_token_mount(&pod).map_err(|e| anyhow::anyhow!("{pod_name}: {e}"))?,
                IN_CLUSTER_TOKEN_DIR,
                "{pod_name}"
            );
            assert_eq!(other_credentials(&pod), Vec::<String>::new(), "{pod_name}");
            for c in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
                assert!(
                    c.liveness_probe.is_some() && c.readiness_probe.is_some(),
                    "{pod_name}/{}: liveness and readiness probes",
                    c.name
                );
            }
        }
    }
    phase(
        started,
        "every pod uses its own ServiceAccount token, no other credentials",
    );

    // Leader election between the two app-controller replicas: one holds the Lease, and it
    // is a pod (the holder identity is the pod name, from the downward API); exactly that
    // replica says it leads (`vworkspace_leader` 1 on its admin port, 0 on the other's).
    let leader = wait_one_leader(&ctx).await?;
    let app_dep: Deployment = Api::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .get(APP_CONTROLLER)
        .await?;
    let app_pods: Vec<String> = bundle::deployment_pods(&client, &app_dep)
        .await?
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(app_pods.len(), 2, "{app_pods:?}");
    let lease: Lease = Api::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .get(APP_CONTROLLER_LEASE)
        .await?;
    let lease_seconds = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .unwrap_or_default();
    assert!(lease_seconds > 0, "the Lease has a duration");
    // Stable: the follower never takes it while the leader lives.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(wait_one_leader(&ctx).await?, leader);
    phase(started, &format!("{leader} leads, the other replica follows"));

    // Delete the leader's pod: within the lease duration a live replica holds the Lease. It
    // is the follower, or the pod the Deployment starts in place of the deleted one, when
    // that one asks first (the leader gives the Lease up as it stops; both then race for it).
    let deleted_at = Instant::now();
    Api::<Pod>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .delete(&leader, &DeleteParams::default())
        .await?;
    let within = Duration::from_secs(u64::try_from(lease_seconds)?);
    let new_leader = eventually(&ctx, "another replica takes the Lease over", within, || {
        let (client, leader) = (client.clone(), &leader);
        async move {
            Ok(
                match lease_holder(&client, SYSTEM_NAMESPACE, APP_CONTROLLER_LEASE).await? {
                    Some(h) if h != *leader && h.starts_with(APP_CONTROLLER) => Ok(h),
                    other => Err(format!("holder {other:?}")),
                },
            )
        }
    })
    .await?;
    let takeover = deleted_at.elapsed();
    // Two replicas again, and the Lease holder is the one replica that leads.
    bundle::wait_available_on(&ctx, SYSTEM_NAMESPACE, APP_CONTROLLER, &node, bundle::ROLLOUT_TIMEOUT).await?;
    assert_eq!(wait_one_leader(&ctx).await?, new_leader);
    phase(
        started,
        &format!(
            "{new_leader} took the Lease over {takeover:?} after {leader} was deleted (lease {lease_seconds}s; {})",
            if app_pods.contains(&new_leader) {
                "the follower"
            } else {
                "the replacement pod"
            }
        ),
    );

    // The product path, everything in pods: intent in the simulator → agent pod →
    // ApplicationInstance → app-controller pod → HelmRelease → Flux pods → the demo app's
    // pod on the real node, answering on its Service; status back to the simulator.
    let greeting = format!("hello from the bundle in {ns}");
    let mut values = bundle::placement(&node);
    values["greeting"] = json!(greeting);
    let mut spec = serde_json::to_value(e2e::apps::app("demo", "demo-app", "0.1.0", values).spec)?;
    spec["chart"]["repository"]["url"] = json!(chart_repo);
    let revision = sim.set_app(&ns, "demo", spec).await?;
    let ready = wait_sim(&ctx, &sim, "demo reported ready", PRODUCT_TIMEOUT, |v| {
        (summary(v, &ns, "demo")?["status"] == "ready").then(|| v.clone())
    })
    .await?;
    phase(started, "the simulator hears demo is ready");
    assert_eq!(
        object_ack(&ready, revision, &ns, "demo").map(|a| a["outcome"].clone()),
        Some(json!("applied"))
    );
    let r = report(&ready, "ApplicationInstance", &ns, "demo")
        .cloned()
        .unwrap_or_default();
    assert_eq!(r["state"], "ready", "{r}");
    assert_eq!(r["deployed_chart_version"], "0.1.0", "{r}");
    assert_eq!(ready["agent_online"], true);

    let ai = ctx.api::<ApplicationInstance>().get("demo").await?;
    assert_eq!(
        ai.metadata
            .labels
            .clone()
            .unwrap_or_default()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("vworkspace-agent"),
        "applied by the agent"
    );
    let releases = flux::helm_releases(&ctx).list(&ListParams::default()).await?.items;
    assert_eq!(releases.len(), 1, "one HelmRelease, made by the app controller");
    let hr = serde_json::to_value(&releases[0])?;
    assert_eq!(
        e2e::condition(&hr, "Ready").map(|c| c.0),
        Some("True".to_owned()),
        "{}",
        e2e::conditions_summary(&hr)
    );

    let demo_pods = bundle::wait_available_on(&ctx, &ns, "demo", &node, Duration::from_secs(60)).await?;
    assert_eq!(demo_pods.len(), 1, "{}", pods_summary(&demo_pods));
    // By its ClusterIP, through kube-proxy's rules in the netns, to the pod on the real node.
    let body = service_get(&ctx, "demo").await?;
    assert_eq!(body.trim(), greeting);
    phase(started, &format!("the demo Service answers {:?}", body.trim()));

    // The controllers in pods also published demo's status changes to the agent's status
    // channel: they reached it by its Service name (cluster DNS) and authenticated with the
    // ServiceAccount tokens the kubelet projects for the channel's audience, which the agent
    // checked with a TokenReview under its own ServiceAccount; none was refused.
    let agent_dep: Deployment = Api::namespaced(client.clone(), SYSTEM_NAMESPACE).get("agent").await?;
    let agent_ip = bundle::deployment_pods(&client, &agent_dep)
        .await?
        .first()
        .and_then(|p| p.status.as_ref()?.pod_ip.clone())
        .ok_or_else(|| anyhow::anyhow!("the agent pod has no IP"))?;
    let channel = eventually(
        &ctx,
        "status channel events at the agent",
        Duration::from_secs(30),
        || {
            let addr = format!("{agent_ip}:8080");
            async move {
                let metrics = http_get(&addr, "/metrics").await?;
                let count = |kind: &str| {
                    metric_sum(
                        &metrics,
                        "vworkspace_agent_status_channel_events_total",
                        &[&format!("kind=\"{kind}\"")],
                    )
                };
                let (resync, object) = (count("resync"), count("object"));
                let refused = metric_sum(&metrics, "vworkspace_agent_status_channel_refused_total", &[]);
                let connected = metric_sum(&metrics, "vworkspace_agent_control_plane_connected", &[]);
                Ok(
                    if resync >= 1.0 && object >= 1.0 && refused == 0.0 && connected == 1.0 {
                        Ok(format!("{resync} resyncs, {object} object events"))
                    } else {
                        Err(format!(
                            "resync {resync}, object {object}, refused {refused}, control plane connected {connected}"
                        ))
                    },
                )
            }
        },
    )
    .await?;
    phase(started, &format!("status channel: {channel}, none refused"));

    // Deletion takes the same path back: the release and its pods go.
    sim.delete_app(&ns, "demo").await?;
    eventually(&ctx, "demo and its release gone", PRODUCT_TIMEOUT, || {
        let (apps, deps, hrs) = (
            ctx.api::<ApplicationInstance>(),
            ctx.api::<Deployment>(),
            flux::helm_releases(&ctx),
        );
        async move {
            let left = (
                apps.get_opt("demo").await?.is_some(),
                deps.get_opt("demo").await?.is_some(),
                !hrs.list(&ListParams::default()).await?.items.is_empty(),
            );
            Ok(if left == (false, false, false) {
                Ok(())
            } else {
                Err(format!(
                    "ApplicationInstance, Deployment, HelmRelease present: {left:?}"
                ))
            })
        }
    })
    .await?;
    phase(started, "demo deleted through the agent");

    // No pod of the bundle restarted during all of this (liveness probes never failed).
    for system_ns in [SYSTEM_NAMESPACE, FLUX_NAMESPACE] {
        let list = Api::<Pod>::namespaced(client.clone(), system_ns)
            .list(&ListParams::default())
            .await?
            .items;
        let restarted: Vec<&Pod> = list.iter().filter(|p| restarts(p) > 0).collect();
        assert!(restarted.is_empty(), "restarted:\n  {}", pods_summary(&list));
    }

    // Remove the bundle: none of its objects is left, nor anything else labelled as ours
    // or the bundled Flux's among the cluster-scoped kinds it installs. CRDs stay.
    let removed_from = Instant::now();
    installed.remove(&ctx, REMOVAL_TIMEOUT).await?;
    let left = bundle::still_present(&to_install).await?;
    assert!(left.is_empty(), "left behind: {left:?}");
    for resource in [
        "clusterroles.rbac.authorization.k8s.io",
        "clusterrolebindings.rbac.authorization.k8s.io",
        "validatingadmissionpolicies.admissionregistration.k8s.io",
        "validatingadmissionpolicybindings.admissionregistration.k8s.io",
    ] {
        let found = bundle::cluster_objects_part_of(resource, &["vworkspace-operator", "flux"]).await?;
        assert!(found.is_empty(), "{resource} left behind: {found:?}");
    }
    for system_ns in [SYSTEM_NAMESPACE, FLUX_NAMESPACE] {
        assert!(
            Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
                .get_opt(system_ns)
                .await?
                .is_none(),
            "namespace {system_ns} is gone"
        );
    }
    for crd in crds
        .iter()
        .map(|c| name(c))
        .chain(["applicationinstances.vworkspace.io", "operations.vworkspace.io"])
    {
        deploy::kubectl(&["get", "crd", crd, "-o", "name"], None).await?;
    }
    phase(
        started,
        &format!("bundle removed in {:?}, nothing left behind", removed_from.elapsed()),
    );

    flux_guard.restore()?;
    phase(started, "out-of-cluster Flux restored");
    rendered.remove_dir();
    Ok(())
}

/// The chart `deploy/chart/vworkspace-operator` (issue 15, point 4), served by the chart
/// repository (`hack/cluster.sh` packages it beside the e2e charts) and installed by the
/// cluster's own Flux (the out-of-cluster one, which keeps running): a HelmRelease with the
/// values of the `app-only` overlay beside an existing Flux (`flux.enabled=false`, only
/// `appController`), placement on the real node and the allow-list. The app controller's
/// pod becomes Available on the real node, and an ApplicationInstance applied with the API
/// installs the demo app, whose pod answers on its Service. Uninstalling the release leaves
/// none of the chart's objects behind.
///
/// The ServiceAccount the HelmRelease runs as is bound to cluster-admin: the chart creates
/// ClusterRoles and bindings, and the cluster's Flux is locked down as the bundle ships it
/// (a HelmRelease without serviceAccountName gets no rights; docs/install/README.md).
/// The chart's CRDs (`crds: Skip`) and admission policies (`admissionPolicies.enabled=false`,
/// as in the overlays) are left out: `hack/cluster.sh up` installed the same from
/// `deploy/crds/`, the rest of the suite needs them, and Helm would adopt them and delete
/// them on uninstall.
#[tokio::test]
async fn chart_app_only_installed_by_the_clusters_flux_runs_on_the_real_node() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let node = bundle::real_node()?;
    let ctx = TestContext::new("bundle-chart").await?;
    let ns = ctx.namespace.clone();
    let client = ctx.client.clone();

    let index = http_get(CHART_REPO_ADDR, "/index.yaml").await?;
    anyhow::ensure!(
        index.contains("vworkspace-operator-0.1.0.tgz"),
        "the chart repository does not serve vworkspace-operator 0.1.0: `hack/cluster.sh up` packages it \
         (prepare_assets); this cluster was started before that"
    );
    anyhow::ensure!(
        tokio::net::TcpStream::connect(OUT_OF_CLUSTER_HELM_CONTROLLER_HEALTH)
            .await
            .is_ok(),
        "the cluster's (out-of-cluster) helm-controller is not running"
    );

    // The chart's objects must not exist already: Helm would adopt them (and delete them on
    // uninstall).
    remove_bundle_leftovers(&client).await?;
    phase(started, "no object of the bundle left from other tests");

    let installer = format!("{}{ns}", setup::INSTALLER_BINDING_PREFIX);
    let chart_repo = bundle::chart_repo_for_pods();
    let mut values = json!({
        "allowedNamespaces": [ns],
        "admissionPolicies": {"enabled": false},
        "flux": {"enabled": false},
        "backupEngine": {"enabled": false},
        "restoreEngine": {"enabled": false},
        "upgradeEngine": {"enabled": false},
        "runbookEngine": {"enabled": false},
        "agent": {"enabled": false},
        // The minimal repository change, as for the overlay (see the other test).
        "appController": {"extraArgs": [format!("--insecure-repository-hosts={}", bundle::url_host(&chart_repo))]},
    });
    let placement = bundle::placement(&node);
    values["nodeSelector"] = placement["nodeSelector"].clone();
    values["tolerations"] = placement["tolerations"].clone();
    let install = [
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "vworkspace-installer", "namespace": ns},
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            // Named for this process: a run killed before its cleanup leaves it to the next
            // suite's start check (e2e::setup), which removes it once this process is gone.
            "metadata": {"name": installer, "labels": {setup::INSTALLER_PID_LABEL: std::process::id().to_string()}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "vworkspace-installer", "namespace": ns}],
        }),
        json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmRepository",
            "metadata": {"name": "vworkspace", "namespace": ns},
            // The cluster's source-controller runs in the netns: loopback reaches the server.
            "spec": {"url": e2e::CHART_REPO, "interval": "1m"},
        }),
        json!({
            "apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
            "metadata": {"name": "vworkspace-operator", "namespace": ns},
            "spec": {
                "interval": "10m",
                "serviceAccountName": "vworkspace-installer",
                "chart": {"spec": {
                    "chart": "vworkspace-operator", "version": "0.1.0",
                    "sourceRef": {"kind": "HelmRepository", "name": "vworkspace"},
                }},
                "install": {"crds": "Skip", "timeout": "4m"},
                "upgrade": {"crds": "Skip"},
                "values": values,
            },
        }),
    ];
    // The guard before anything is applied: every exit path (a failed assertion's panic too)
    // removes the release, the installer's cluster-admin binding and whatever of the chart
    // still runs, and applies the release ClusterRole again.
    let guard = ChartInstall {
        namespace: ns.clone(),
        installer: installer.clone(),
        removed: false,
    };
    let result = chart_release_path(&ctx, &node, &chart_repo, &install, started).await;
    let removed = guard.remove().await;
    result?;
    removed?;
    phase(started, "release uninstalled, nothing of the chart left behind");
    Ok(())
}

/// The chart test's installation, removed on drop unless [`Self::remove`] did it.
struct ChartInstall {
    namespace: String,
    installer: String,
    removed: bool,
}

impl ChartInstall {
    async fn remove(mut self) -> anyhow::Result<()> {
        self.removed = true;
        remove_chart_install(&self.namespace, &self.installer).await
    }
}

impl Drop for ChartInstall {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        if std::thread::panicking() && std::env::var_os("VWS_E2E_KEEP_FAILED").is_some() {
            eprintln!(
                "VWS_E2E_KEEP_FAILED: the chart's release stays installed in {}; the next suite's start removes it",
                self.namespace
            );
            return;
        }
        let (namespace, installer) = (self.namespace.clone(), self.installer.clone());
        if let Err(e) = bundle::block_on_own_thread(async move { remove_chart_install(&namespace, &installer).await }) {
            eprintln!("removing the chart's release on drop: {e:#}");
        }
    }
}

/// Removes what the chart test installed in `namespace`: the release (Helm uninstalls it),
/// whatever of the chart still runs (an uninstall that did not finish, a failed install), the
/// installer's binding and the release ClusterRole the cluster's Flux needs (cluster up
/// applies it; the chart adopted it, so the uninstall deleted it). Every step runs whatever an
/// earlier one returned; then none of the chart's cluster-wide RBAC may be left.
async fn remove_chart_install(namespace: &str, installer: &str) -> anyhow::Result<()> {
    let client = e2e::client().await?;
    let releases = e2e::dynamic_api(
        &client,
        namespace,
        "helm.toolkit.fluxcd.io",
        "v2",
        "HelmRelease",
        "helmreleases",
    );
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client);
    let _ = releases.delete("vworkspace-operator", &DeleteParams::default()).await;
    let deadline = Instant::now() + REMOVAL_TIMEOUT;
    let gone = loop {
        let hr = releases.get_opt("vworkspace-operator").await?.is_some();
        let system = namespaces.get_opt(SYSTEM_NAMESPACE).await?.is_some();
        if !hr && !system {
            break Ok(());
        }
        if Instant::now() >= deadline {
            break Err(anyhow::anyhow!(
                "the operator's release not uninstalled after {REMOVAL_TIMEOUT:?}: HelmRelease present: {hr}, \
                 {SYSTEM_NAMESPACE} present: {system}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let reaped = bundle::reap_in_cluster_components().await;
    let left =
        bundle::cluster_objects_part_of("clusterroles.rbac.authorization.k8s.io", &["vworkspace-operator"]).await;
    let left_bindings = bundle::cluster_objects_part_of(
        "clusterrolebindings.rbac.authorization.k8s.io",
        &["vworkspace-operator"],
    )
    .await;
    let unbound = deploy::kubectl(&["delete", "clusterrolebinding", installer, "--ignore-not-found"], None).await;
    let restored = setup::restore_release_role().await;
    gone?;
    unbound?;
    restored?;
    let reaped = reaped?;
    anyhow::ensure!(reaped.is_empty(), "still running after the uninstall: {reaped:?}");
    let (left, left_bindings) = (left?, left_bindings?);
    anyhow::ensure!(
        left.is_empty() && left_bindings.is_empty(),
        "left behind: {left:?} {left_bindings:?}"
    );
    Ok(())
}

/// The part of the chart test that may fail: install, the app controller Available, the
/// demo app installed through it and answering.
async fn chart_release_path(
    ctx: &TestContext,
    node: &str,
    chart_repo: &str,
    install: &[Value],
    started: Instant,
) -> anyhow::Result<()> {
    deploy::apply(&to_yaml(&install.iter().collect::<Vec<_>>())?, false).await?;
    let hr = flux::wait_helm_release_ready(ctx, "vworkspace-operator", Duration::from_secs(300)).await?;
    phase(
        started,
        &format!(
            "the cluster's Flux installed the chart: {}",
            e2e::conditions_summary(&hr)
        ),
    );
    // Helm waited for the Deployment; on the real node, from its ServiceAccount token.
    let pods = bundle::wait_available_on(ctx, SYSTEM_NAMESPACE, APP_CONTROLLER, node, bundle::ROLLOUT_TIMEOUT).await?;
    for pod in &pods {
        assert_eq!(
            projected_token_mount(pod).map_err(|e| anyhow::anyhow!(e))?,
            IN_CLUSTER_TOKEN_DIR
        );
        assert_eq!(other_credentials(pod), Vec::<String>::new());
    }
    let deployments: Vec<String> = Api::<Deployment>::namespaced(ctx.client.clone(), SYSTEM_NAMESPACE)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|d| d.metadata.name)
        .collect();
    assert_eq!(deployments, [APP_CONTROLLER], "app-only: the app controller alone");
    assert!(
        Api::<k8s_openapi::api::core::v1::Namespace>::all(ctx.client.clone())
            .get_opt(FLUX_NAMESPACE)
            .await?
            .is_none_or(
                |n| n.metadata.labels.unwrap_or_default().get("app.kubernetes.io/part-of") != Some(&"flux".to_owned())
            ),
        "flux.enabled=false: no bundled Flux"
    );
    phase(started, "app-controller Available on the real node");

    demo_app_through_the_api(ctx, node, chart_repo, "the chart's app controller").await?;
    phase(
        started,
        "demo installed by the chart's app controller answers on its Service",
    );
    Ok(())
}

/// An ApplicationInstance applied with the API (the demo app on the real node, from the
/// chart repository as pods reach it) becomes Ready, its pod runs on the real node and its
/// Service answers with the greeting; deleting it removes the release.
async fn demo_app_through_the_api(ctx: &TestContext, node: &str, chart_repo: &str, by: &str) -> anyhow::Result<()> {
    demo_app_through(ctx, node, chart_repo, by, Engine::Flux).await
}

/// Which engine the app controller under test materialises the demo app with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Engine {
    Flux,
    ArgoCd,
}

async fn demo_app_through(
    ctx: &TestContext,
    node: &str,
    chart_repo: &str,
    by: &str,
    engine: Engine,
) -> anyhow::Result<()> {
    let ns = ctx.namespace.as_str();
    let greeting = format!("hello from {by} in {ns}");
    let mut values = bundle::placement(node);
    values["greeting"] = json!(greeting);
    let mut app = e2e::apps::app("demo", "demo-app", "0.1.0", values);
    if let Some(repo) = app.spec.chart.repository.as_mut() {
        repo.url = chart_repo.to_owned();
    }
    e2e::apps::apply_app(ctx, &app).await?;
    let ready_reason = match engine {
        Engine::Flux => "InstallSucceeded",
        Engine::ArgoCd => "Healthy",
    };
    e2e::apps::wait_deployed(ctx, "demo", ready_reason, "0.1.0").await?;
    if engine == Engine::ArgoCd {
        anyhow::ensure!(
            e2e::argocd::application(ctx, "demo").await?.is_some()
                && flux::helm_releases(ctx).get_opt("demo").await?.is_none(),
            "the demo app is an Argo CD Application, not a HelmRelease"
        );
    }
    let demo_pods = bundle::wait_available_on(ctx, ns, "demo", node, Duration::from_secs(60)).await?;
    assert_eq!(demo_pods.len(), 1, "{}", pods_summary(&demo_pods));
    let body = service_get(ctx, "demo").await?;
    assert_eq!(body.trim(), greeting);
    ctx.api::<ApplicationInstance>()
        .delete("demo", &DeleteParams::default())
        .await?;
    eventually(ctx, "demo and its release gone", Duration::from_secs(120), || {
        let (apps, hrs) = (ctx.api::<ApplicationInstance>(), flux::helm_releases(ctx));
        let (applications, application) = (e2e::argocd::applications(ctx), e2e::argocd::object_name(ctx, "demo"));
        async move {
            let app = apps.get_opt("demo").await?.is_some();
            // Argo CD's Applications only where Argo CD runs: its CRDs are installed by
            // `hack/cluster.sh start-argocd`, which a Flux-only test must not depend on.
            let hr = hrs.get_opt("demo").await?.is_some()
                || (engine == Engine::ArgoCd && applications.get_opt(&application).await?.is_some());
            Ok(if app || hr {
                Err(format!(
                    "ApplicationInstance present: {app}, HelmRelease or Application present: {hr}"
                ))
            } else {
                Ok(())
            })
        }
    })
    .await?;
    Ok(())
}

/// GET / of Service `name` in the test namespace, by its ClusterIP (kube-proxy runs in the
/// netns), until it answers 200.
async fn service_get(ctx: &TestContext, name_: &str) -> anyhow::Result<String> {
    let svc: Service = ctx.api().get(name_).await?;
    let cluster_ip = svc
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .filter(|ip| !ip.is_empty() && ip != "None")
        .ok_or_else(|| anyhow::anyhow!("Service {name_} has no ClusterIP"))?;
    let port = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.first())
        .map_or(80, |p| p.port);
    let addr = format!("{cluster_ip}:{port}");
    eventually(ctx, &format!("GET http://{addr}/"), Duration::from_secs(30), || {
        let addr = addr.clone();
        async move {
            Ok(match http_get(&addr, "/").await {
                Ok(body) => Ok(body),
                Err(e) => Err(format!("{e:#}")),
            })
        }
    })
    .await
}

/// Removes what other test binaries leave of the bundle: they apply its RBAC (the `no-flux`
/// overlay's) for the controllers they run out of cluster, once per process, and leave it
/// (they apply it again when they run). Waits until `vworkspace-system` is gone. A component
/// an earlier test of this file left running is removed first, so this test starts clean
/// whatever the earlier one did (that test fails on it itself).
async fn remove_bundle_leftovers(client: &kube::Client) -> anyhow::Result<()> {
    reap_earlier_tests().await?;
    let leftovers = deploy::render_docs("no-flux").await?;
    let leftovers: Vec<&Value> = leftovers
        .iter()
        .filter(|d| kind(d) != "CustomResourceDefinition")
        .collect();
    deploy::kubectl(
        &["delete", "--ignore-not-found", "--wait=false", "-f", "-"],
        Some(&to_yaml(&leftovers)?),
    )
    .await?;
    bundle::wait_namespace_usable(client, SYSTEM_NAMESPACE, REMOVAL_TIMEOUT).await
}

/// Removes a component an earlier test of this file left running, so this test starts clean
/// whatever the earlier one did (that test fails on it itself).
async fn reap_earlier_tests() -> anyhow::Result<()> {
    let foreign = bundle::reap_in_cluster_components().await?;
    if !foreign.is_empty() {
        eprintln!("an earlier test left these running; removed: {foreign:?}");
    }
    Ok(())
}

/// The end of an overlay test: removes the overlay and restores the release ClusterRole, also
/// when the test failed (`result`), then returns that failure first, and checks that none of
/// the overlay's objects is left behind but that ClusterRole.
async fn remove_overlay_and_check_nothing_left(
    ctx: &TestContext,
    installed: InstalledBundle,
    installed_docs: &[&Value],
    result: anyhow::Result<()>,
) -> anyhow::Result<()> {
    let removed = installed.remove(ctx, REMOVAL_TIMEOUT).await;
    let restored = setup::restore_release_role().await;
    result?;
    removed?;
    restored?;
    let left = bundle::still_present(installed_docs).await?;
    // The release ClusterRole is back (setup::restore_release_role), as the cluster had it.
    let left: Vec<&String> = left
        .iter()
        .filter(|id| !api::RELEASE_ROLES.iter().any(|role| id.ends_with(&format!("/{role}"))))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}

/// The `app-only` overlay beside the cluster's own Flux (the out-of-cluster one, which keeps
/// running), with the same changes as `full` above (placement, allow-list, the chart host):
/// the app controller's pod becomes Available on the real node with its own ServiceAccount
/// token, an ApplicationInstance applied with the API installs the demo app through the
/// cluster's Flux, its pod answers on its Service, and removing the overlay leaves none of
/// its objects behind.
#[tokio::test]
async fn app_only_overlay_beside_the_clusters_flux_runs_on_the_real_node() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let node = bundle::real_node()?;
    let ctx = TestContext::new("bundle-app-only").await?;
    let ns = ctx.namespace.clone();
    let client = ctx.client.clone();
    anyhow::ensure!(
        tokio::net::TcpStream::connect(OUT_OF_CLUSTER_HELM_CONTROLLER_HEALTH)
            .await
            .is_ok(),
        "the cluster's (out-of-cluster) helm-controller is not running"
    );
    remove_bundle_leftovers(&client).await?;

    let chart_repo = bundle::chart_repo_for_pods();
    let args = [format!("--insecure-repository-hosts={}", bundle::url_host(&chart_repo))];
    let rendered = RenderedBundle::render(
        &ns,
        &BundleOptions {
            overlay: "app-only",
            node: &node,
            allowed_namespaces: &ns,
            app_controller_replicas: 1,
            app_controller_args: &args,
            components: &[],
        },
    )
    .await?;
    assert_eq!(
        rendered.deployments(),
        [(SYSTEM_NAMESPACE.to_owned(), APP_CONTROLLER.to_owned())]
    );
    assert!(rendered.of_kind(&["CustomResourceDefinition"]).is_empty());
    let to_install = rendered.without_crds();
    let installed = InstalledBundle::new(&rendered.dir, &to_install, &ns)?;
    installed.apply().await?;
    phase(
        started,
        &format!("applied the {} objects of app-only", to_install.len()),
    );

    let result = async {
        let pods =
            bundle::wait_available_on(&ctx, SYSTEM_NAMESPACE, APP_CONTROLLER, &node, bundle::ROLLOUT_TIMEOUT).await?;
        for pod in &pods {
            assert_eq!(
                projected_token_mount(pod).map_err(|e| anyhow::anyhow!(e))?,
                IN_CLUSTER_TOKEN_DIR
            );
            assert_eq!(other_credentials(pod), Vec::<String>::new());
        }
        phase(started, "app-controller Available on the real node");
        demo_app_through_the_api(&ctx, &node, &chart_repo, "the app-only overlay").await?;
        phase(
            started,
            "demo installed through the cluster's Flux answers on its Service",
        );
        anyhow::Ok(())
    }
    .await;

    remove_overlay_and_check_nothing_left(&ctx, installed, &to_install, result).await?;
    let roles =
        bundle::cluster_objects_part_of("clusterroles.rbac.authorization.k8s.io", &["vworkspace-operator"]).await?;
    assert_eq!(
        roles,
        api::RELEASE_ROLES.map(|role| format!("clusterrole.rbac.authorization.k8s.io/{role}"))
    );
    let bindings = bundle::cluster_objects_part_of(
        "clusterrolebindings.rbac.authorization.k8s.io",
        &["vworkspace-operator"],
    )
    .await?;
    assert!(bindings.is_empty(), "left behind: {bindings:?}");
    phase(started, "app-only removed, nothing left behind");
    rendered.remove_dir();
    Ok(())
}

/// The `argocd-engine` component on the app-only overlay (issue 20): the app controller's pod
/// runs on the real node with `--default-engine=argocd` and its Role in Argo CD's namespace, and
/// an ApplicationInstance that names no engine is deployed by the cluster's real Argo CD (out of
/// cluster, `hack/cluster.sh start-argocd`), syncing as the namespace's release ServiceAccount:
/// the demo pod runs on the real node and answers on its Service; removing the overlay leaves
/// nothing behind.
#[tokio::test]
async fn app_only_overlay_with_the_argocd_engine_component_deploys_through_argo_cd() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let node = bundle::real_node()?;
    e2e::argocd::require_argocd().await?;
    let ctx = TestContext::new("bundle-argocd").await?;
    let ns = ctx.namespace.clone();
    let client = ctx.client.clone();
    remove_bundle_leftovers(&client).await?;

    let chart_repo = bundle::chart_repo_for_pods();
    let args = [format!("--insecure-repository-hosts={}", bundle::url_host(&chart_repo))];
    let rendered = RenderedBundle::render(
        &ns,
        &BundleOptions {
            overlay: "app-only",
            node: &node,
            allowed_namespaces: &ns,
            app_controller_replicas: 1,
            app_controller_args: &args,
            components: &["argocd-engine"],
        },
    )
    .await?;
    let controller_args: Vec<String> = rendered
        .of_kind(&["Deployment"])
        .iter()
        .filter_map(|d| d.pointer("/spec/template/spec/containers/0/args")?.as_array().cloned())
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    for flag in ["--engines=flux,argocd", "--default-engine=argocd"] {
        anyhow::ensure!(
            controller_args.iter().any(|a| a == flag),
            "{flag} missing: {controller_args:?}"
        );
    }
    let to_install = rendered.without_crds();
    let installed = InstalledBundle::new(&rendered.dir, &to_install, &ns)?;
    installed.apply().await?;
    phase(started, "applied app-only with the argocd-engine component");

    let result = async {
        bundle::wait_available_on(&ctx, SYSTEM_NAMESPACE, APP_CONTROLLER, &node, bundle::ROLLOUT_TIMEOUT).await?;
        phase(started, "app-controller Available on the real node");
        demo_app_through(&ctx, &node, &chart_repo, "Argo CD", Engine::ArgoCd).await?;
        phase(started, "demo installed through Argo CD answers on its Service");
        anyhow::Ok(())
    }
    .await;

    remove_overlay_and_check_nothing_left(&ctx, installed, &to_install, result).await?;
    phase(started, "removed, nothing left behind");
    rendered.remove_dir();
    Ok(())
}

/// Waits until the app controller's Lease is held by one of its pods and exactly that pod
/// reports itself leader (`vworkspace_leader` on its admin port, by pod IP: the test runs
/// in the node's netns), the other 0; returns its name.
async fn wait_one_leader(ctx: &TestContext) -> anyhow::Result<String> {
    let client = ctx.client.clone();
    eventually(
        ctx,
        "one app-controller pod holds the Lease and leads",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            async move {
                let dep: Deployment = Api::namespaced(client.clone(), SYSTEM_NAMESPACE)
                    .get(APP_CONTROLLER)
                    .await?;
                let holder = lease_holder(&client, SYSTEM_NAMESPACE, APP_CONTROLLER_LEASE).await?;
                let mut gauges = Vec::new();
                for pod in bundle::deployment_pods(&client, &dep).await? {
                    let name_ = pod.metadata.name.clone().unwrap_or_default();
                    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default();
                    let gauge = match http_get(&format!("{ip}:8080"), "/metrics").await {
                        Ok(text) => metric_sum(&text, "vworkspace_leader", &[]),
                        Err(_) => -1.0,
                    };
                    gauges.push((name_, gauge));
                }
                let leading: Vec<&String> = gauges.iter().filter(|(_, g)| *g == 1.0).map(|(n, _)| n).collect();
                Ok(match &holder {
                    Some(h) if gauges.len() == 2 && leading == [h] && gauges.iter().all(|(_, g)| *g >= 0.0) => {
                        Ok(h.clone())
                    }
                    _ => Err(format!("Lease holder {holder:?}, vworkspace_leader per pod {gauges:?}")),
                })
            }
        },
    )
    .await
}
