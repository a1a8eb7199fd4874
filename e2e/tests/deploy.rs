//! The install bundle under `deploy/` on the real cluster: every overlay renders with
//! `kubectl kustomize` and is accepted by a server-side apply; no RBAC rule contains `*`;
//! the app controller does its whole job (install to Ready, uninstall) with nothing but
//! the RBAC of the `app-only` and `namespaced` overlays, and the API server refuses it
//! anything else (403); two replicas with leader election never both write, and the
//! follower takes over within the lease duration when the leader is SIGKILLed.
//!
//! The bundled Flux CRDs are applied with `--dry-run=server` only: the cluster's own Flux
//! (run by `hack/cluster.sh` from the same pinned versions) serves from them, and
//! rewriting them under running tests would restart their watches. Everything else,
//! Flux's Deployments and RBAC included, is applied for real (the pods land on the
//! kwok node, where they are reported Running without running anything).

use std::time::{Duration, Instant};

use api::ApplicationInstance;
use e2e::{
    TestContext,
    apps::{RELEASE_TIMEOUT, app, apply_app, condition, wait_deployed, wait_ready},
    deploy::{
        self, OVERLAYS, SYSTEM_NAMESPACE, client_from, container, container_args, deployment, http_get, id,
        impersonating_kubeconfig, is_flux, is_forbidden, kind, lease_holder, metric_sum, name, namespace,
        rbac_wildcards, to_yaml,
    },
    dynamic_api, eventually, flux,
    process::ControllerProcess,
};
use k8s_openapi::api::{
    apps::v1::Deployment,
    coordination::v1::Lease,
    core::v1::{ConfigMap, Event, Namespace, Secret},
    rbac::v1::ClusterRole,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::{Value, json};
use tokio::sync::Mutex;

/// The overlay test creates and deletes the shared objects of `vworkspace-system` that the
/// RBAC tests apply and use: they take turns.
static SHARED: Mutex<()> = Mutex::const_new(());

const APP_CONTROLLER: &str = "app-controller";

fn docs_of_kind<'a>(docs: &'a [Value], kinds: &[&str]) -> Vec<&'a Value> {
    docs.iter().filter(|d| kinds.contains(&kind(d))).collect()
}

/// Static checks of one rendered overlay: RBAC, references, pod hardening, images.
fn check_rendered(overlay: &str, docs: &[Value]) {
    let wildcards = rbac_wildcards(docs);
    assert!(wildcards.is_empty(), "{overlay}: `*` in RBAC rules: {wildcards:#?}");

    let service_accounts: Vec<(&str, &str)> = docs_of_kind(docs, &["ServiceAccount"])
        .into_iter()
        .map(|d| (namespace(d), name(d)))
        .collect();
    for binding in docs_of_kind(docs, &["RoleBinding", "ClusterRoleBinding"]) {
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
        let role_name = binding["roleRef"]["name"].as_str().unwrap_or_default();
        let builtin = role_kind == "ClusterRole" && role_name == "cluster-admin";
        assert!(
            builtin
                || docs
                    .iter()
                    .any(|d| kind(d) == role_kind && name(d) == role_name && namespace(d) == namespace(binding)),
            "{overlay}: {} binds {role_kind} {role_name}, which the overlay does not define",
            id(binding)
        );
        if builtin {
            assert_eq!(
                name(binding),
                "helm-reconciler-rolebinding",
                "{overlay}: only Flux's helm-controller is bound to cluster-admin"
            );
        }
        for subject in binding["subjects"].as_array().into_iter().flatten() {
            let sa = (
                subject["namespace"].as_str().unwrap_or_default(),
                subject["name"].as_str().unwrap_or_default(),
            );
            assert!(
                subject["kind"] == "ServiceAccount" && service_accounts.contains(&sa),
                "{overlay}: {} binds {subject}, not a ServiceAccount of the overlay",
                id(binding)
            );
        }
    }

    for dep in docs_of_kind(docs, &["Deployment"]) {
        let pod = &dep["spec"]["template"]["spec"];
        let sa = (namespace(dep), pod["serviceAccountName"].as_str().unwrap_or_default());
        assert!(
            service_accounts.contains(&sa),
            "{overlay}: {} runs as {sa:?}, not a ServiceAccount of the overlay",
            id(dep)
        );
        let c = container(dep);
        let image = c["image"].as_str().unwrap_or_default();
        let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or_default();
        assert!(
            !tag.is_empty() && !tag.contains('/') && tag != "latest",
            "{overlay}: {} image {image} is not pinned by tag",
            id(dep)
        );
        let sc = &c["securityContext"];
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{overlay}: {}", id(dep));
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{overlay}: {}", id(dep));
        assert_eq!(sc["runAsNonRoot"], true, "{overlay}: {}", id(dep));
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{overlay}: {}", id(dep));
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{overlay}: {}", id(dep));
        if is_flux(dep) {
            assert!(
                image.starts_with("ghcr.io/fluxcd/"),
                "{overlay}: {} image {image}",
                id(dep)
            );
            continue;
        }
        // Ours: one binary per Deployment, chosen by `command` in the multi-binary image.
        let binary = dep["metadata"]["labels"]["app.kubernetes.io/name"]
            .as_str()
            .unwrap_or_default();
        assert_eq!(
            image.split_once(':').map(|(n, _)| n),
            Some(format!("vworkspace/{binary}").as_str())
        );
        assert_eq!(c["command"], json!([format!("/usr/local/bin/{binary}")]), "{}", id(dep));
        assert_eq!(pod["securityContext"]["runAsUser"], 65532, "{}", id(dep));
        let args = container_args(dep);
        for want in ["--leader-elect", "--log-format=json"] {
            assert!(args.iter().any(|a| a == want), "{}: args {args:?} lack {want}", id(dep));
        }
        let env: Vec<&str> = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["valueFrom"]["fieldRef"].is_object())
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert_eq!(env, ["POD_NAME", "POD_NAMESPACE"], "{}: downward API env", id(dep));
        check_allow_list(overlay, docs, dep, binary);
        assert_eq!(c["ports"][0]["name"], "admin");
        assert_eq!(c["ports"][0]["containerPort"], 8080);
        assert_eq!(
            c["livenessProbe"]["httpGet"],
            json!({"path": "/livez", "port": "admin"})
        );
        assert_eq!(
            c["readinessProbe"]["httpGet"],
            json!({"path": "/readyz", "port": "admin"})
        );
        assert_eq!(
            c["resources"],
            json!({"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}})
        );
        if binary == "agent" {
            assert_eq!(
                c["ports"][1],
                json!({"name": "grpc", "containerPort": 9090, "protocol": "TCP"})
            );
        }
    }
}

/// The namespace allow-list is required, so every binary of every overlay must get one
/// explicitly: the namespaced overlay as a flag, the agent from its agent-config ConfigMap
/// (written by the cluster owner), every other binary from the overlay's generated
/// `vworkspace-tenancy` ConfigMap, which must exist in the overlay and hold a valid list.
fn check_allow_list(overlay: &str, docs: &[Value], dep: &Value, binary: &str) {
    let c = container(dep);
    if container_args(dep)
        .iter()
        .any(|a| a.starts_with("--allowed-namespaces="))
    {
        return;
    }
    if binary == "agent" {
        let from = &c["envFrom"][0]["configMapRef"]["name"];
        assert_eq!(
            from,
            "agent-config",
            "{overlay}: {} takes its allow-list from agent-config",
            id(dep)
        );
        return;
    }
    let env = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "VWS_ALLOWED_NAMESPACES");
    let Some(env) = env else {
        panic!(
            "{overlay}: {} has neither --allowed-namespaces nor VWS_ALLOWED_NAMESPACES",
            id(dep)
        );
    };
    let key_ref = &env["valueFrom"]["configMapKeyRef"];
    assert_eq!(key_ref["key"], "allowed-namespaces", "{overlay}: {}", id(dep));
    let cm_name = key_ref["name"].as_str().unwrap_or_default();
    let cm = docs
        .iter()
        .find(|d| kind(d) == "ConfigMap" && name(d) == cm_name && namespace(d) == namespace(dep));
    let Some(cm) = cm else {
        panic!(
            "{overlay}: {} reads ConfigMap {cm_name}, which the overlay does not ship",
            id(dep)
        );
    };
    assert!(
        cm_name.starts_with("vworkspace-tenancy"),
        "{overlay}: {cm_name} is not the generated vworkspace-tenancy"
    );
    let list = cm["data"]["allowed-namespaces"].as_str().unwrap_or_default();
    let policy: Result<controller_kit::NamespacePolicy, _> = list.parse();
    assert!(
        policy.is_ok(),
        "{overlay}: {cm_name} allowed-namespaces {list:?} is not a valid allow-list: {policy:?}"
    );
}

#[tokio::test]
async fn every_overlay_renders_and_is_applied_server_side() -> anyhow::Result<()> {
    let _shared = SHARED.lock().await;
    e2e::assert_loopback_only();
    let started = Instant::now();

    let mut rendered = Vec::new();
    for overlay in OVERLAYS {
        let docs = deploy::render_docs(overlay).await?;
        check_rendered(overlay, &docs);
        rendered.push((overlay, docs));
    }
    let by_name = |o: &str| &rendered.iter().find(|(n, _)| *n == o).expect("rendered").1;

    // What each overlay contains.
    let deployments = |o: &str| -> Vec<String> {
        let mut v: Vec<String> = docs_of_kind(by_name(o), &["Deployment"])
            .iter()
            .map(|d| name(d).to_owned())
            .collect();
        v.sort();
        v
    };
    let ours = [
        "agent",
        "app-controller",
        "backup-engine",
        "restore-engine",
        "runbook-engine",
        "upgrade-engine",
    ];
    let mut full: Vec<String> = ours.iter().map(|s| s.to_string()).collect();
    full.extend(["helm-controller".into(), "source-controller".into()]);
    full.sort();
    assert_eq!(deployments("full"), full);
    assert_eq!(deployments("no-flux"), ours);
    assert_eq!(deployments("app-only"), [APP_CONTROLLER]);
    assert!(by_name("no-flux").iter().all(|d| !is_flux(d)));
    assert!(by_name("app-only").iter().all(|d| !is_flux(d)));
    assert_eq!(
        docs_of_kind(by_name("full"), &["CustomResourceDefinition"]).len(),
        7,
        "the bundled Flux brings its 7 CRDs"
    );

    // namespaced: Roles only, one Deployment per binary and namespace, flags to match. Its
    // ClusterRoles are the release roles, bound only by RoleBindings (they grant nothing by
    // themselves).
    let namespaced = by_name("namespaced");
    let cluster_scoped: Vec<String> = docs_of_kind(namespaced, &["ClusterRole", "ClusterRoleBinding"])
        .into_iter()
        .map(id)
        .collect();
    assert_eq!(
        cluster_scoped,
        api::RELEASE_ROLES.map(|role| format!("ClusterRole//{role}")),
        "namespaced: no cluster-wide RBAC"
    );
    assert_eq!(docs_of_kind(namespaced, &["Deployment"]).len(), 10);
    for dep in docs_of_kind(namespaced, &["Deployment"]) {
        let team = name(dep).rsplit_once("-team-").map(|(_, t)| format!("team-{t}"));
        let team = team.unwrap_or_else(|| panic!("{} is not per team", id(dep)));
        let args = container_args(dep);
        for flag in ["--watch-namespace", "--allowed-namespaces", "--lease-namespace"] {
            assert!(
                args.contains(&format!("{flag}={team}")),
                "{}: args {args:?} lack {flag}={team}",
                id(dep)
            );
        }
        // Everything its ServiceAccount may do is in its namespace (or Velero's).
        let sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or_default();
        for binding in docs_of_kind(namespaced, &["RoleBinding"]) {
            if binding["subjects"][0]["name"] == sa {
                assert!(
                    [team.as_str(), "velero"].contains(&namespace(binding)),
                    "{} grants {sa} rights in {}",
                    id(binding),
                    namespace(binding)
                );
            }
        }
    }

    // Namespaces the overlays expect to exist: Velero's (left in place afterwards: other
    // tests may use Velero), and the example tenants (deleted afterwards if created here).
    deploy::ensure_namespace("velero").await?;
    let mut created = Vec::new();
    for ns in ["team-a", "team-b"] {
        if deploy::ensure_namespace(ns).await? {
            created.push(ns);
        }
    }

    // Apply each overlay as an installer would (server-side); Flux's CRDs as a dry run.
    for (overlay, docs) in &rendered {
        let (crds, rest): (Vec<&Value>, Vec<&Value>) = docs.iter().partition(|d| kind(d) == "CustomResourceDefinition");
        if !crds.is_empty() {
            assert!(
                crds.iter().all(|d| is_flux(d)),
                "{overlay}: only Flux's CRDs are bundled"
            );
            let out = deploy::apply(&to_yaml(&crds)?, true).await?;
            assert_eq!(
                out.matches("serverside-applied (server dry run)").count(),
                crds.len(),
                "{out}"
            );
        }
        let out = deploy::apply(&to_yaml(&rest)?, false).await?;
        assert_eq!(
            out.matches("serverside-applied").count(),
            rest.len(),
            "{overlay}:\n{out}"
        );
    }

    // The Deployments roll out (the pod security "restricted" level of vworkspace-system
    // admits their pods; kwok then reports them Running).
    let all_deployments: std::collections::BTreeSet<(String, String)> = rendered
        .iter()
        .flat_map(|(_, docs)| docs_of_kind(docs, &["Deployment"]))
        .map(|d| (namespace(d).to_owned(), name(d).to_owned()))
        .collect();
    for (ns, dep) in &all_deployments {
        deploy::kubectl(
            &[
                "rollout",
                "status",
                "-n",
                ns,
                &format!("deployment/{dep}"),
                "--timeout=120s",
            ],
            None,
        )
        .await?;
    }
    let client = e2e::client().await?;
    let dep: Deployment = Api::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .get(APP_CONTROLLER)
        .await?;
    assert_eq!(dep.status.and_then(|s| s.available_replicas), Some(1));
    eprintln!(
        "applied {} overlays ({} distinct Deployments rolled out) in {:?}",
        rendered.len(),
        all_deployments.len(),
        started.elapsed()
    );

    // Clean up: everything but the CRDs, then the namespaces this test created.
    let mut seen = std::collections::BTreeSet::new();
    let mut everything = Vec::new();
    for (_, docs) in &rendered {
        for d in docs.iter().filter(|d| kind(d) != "CustomResourceDefinition") {
            if seen.insert(id(d)) {
                everything.push(d);
            }
        }
    }
    deploy::kubectl(
        &[
            "delete",
            "--ignore-not-found",
            "--wait=true",
            "--timeout=180s",
            "-f",
            "-",
        ],
        Some(&to_yaml(&everything)?),
    )
    .await?;
    for ns in created {
        deploy::kubectl(&["delete", "namespace", ns, "--wait=true", "--timeout=180s"], None).await?;
    }
    Ok(())
}

/// Starts `app-controller` out of cluster with the args of its rendered Deployment, the
/// downward-API env a pod would get, and a kubeconfig impersonating its ServiceAccount.
async fn start_as_service_account(
    ctx: &TestContext,
    dep: &Value,
    extra_args: &[&str],
) -> anyhow::Result<(ControllerProcess, String, std::path::PathBuf)> {
    let sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let kubeconfig = impersonating_kubeconfig(namespace(dep), &sa, &format!("{sa}-{}", ctx.namespace))?;
    let pod = format!("{}-{}", name(dep), ctx.namespace);
    let kubeconfig_str = kubeconfig.to_string_lossy().into_owned();
    let (controller, admin) = ControllerProcess::start_with_admin(
        ctx.process_scope(),
        APP_CONTROLLER,
        &format!("app-controller-{}", ctx.namespace),
        |admin| {
            let mut args = container_args(dep);
            args.extend(["--admin-addr".to_owned(), admin.to_owned()]);
            // The test charts are served over plain http on 127.0.0.1 (e2e::CHART_REPO).
            args.extend(["--insecure-repository-hosts".to_owned(), "127.0.0.1".to_owned()]);
            args.extend(extra_args.iter().map(|s| s.to_string()));
            args
        },
        &[
            ("KUBECONFIG", kubeconfig_str.as_str()),
            ("POD_NAME", pod.as_str()),
            ("POD_NAMESPACE", namespace(dep)),
            ("RUST_LOG", "info"),
        ],
    )
    .await?;
    controller
        .wait_http_ok(&admin, "/readyz", Duration::from_secs(60))
        .await?;
    Ok((controller, pod, kubeconfig))
}

/// The app controller's log must show no request refused by RBAC.
fn assert_never_forbidden(controller: &ControllerProcess) {
    let logs = controller.logs();
    let refused: Vec<&str> = logs
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("forbidden") || l.contains(" 403")
        })
        .collect();
    assert!(refused.is_empty(), "requests refused by RBAC:\n{}", refused.join("\n"));
}

/// Deletes the ApplicationInstance and waits until it and its HelmRelease are gone
/// (uninstall: HelmRelease delete and finalizer removal, under the controller's RBAC).
async fn delete_and_wait_gone(ctx: &TestContext, app_name: &str) -> anyhow::Result<()> {
    ctx.api::<ApplicationInstance>()
        .delete(app_name, &DeleteParams::default())
        .await?;
    eventually(ctx, &format!("{app_name} uninstalled"), RELEASE_TIMEOUT, || async {
        let app = ctx.api::<ApplicationInstance>().get_opt(app_name).await?;
        let hr = flux::helm_releases(ctx).get_opt(app_name).await?;
        Ok(if app.is_none() && hr.is_none() {
            Ok(())
        } else {
            Err(format!("app {} hr {}", app.is_some(), hr.is_some()))
        })
    })
    .await
}

/// Events the app controller published in the test namespace.
async fn controller_events(ctx: &TestContext) -> anyhow::Result<Vec<Event>> {
    Ok(ctx
        .api::<Event>()
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reporting_component.as_deref() == Some("vworkspace-app-controller"))
        .collect())
}

fn secret(name_: &str) -> Secret {
    serde_json::from_value(json!({"metadata": {"name": name_}, "stringData": {"k": "v"}})).expect("secret")
}

#[tokio::test]
async fn app_controller_works_with_the_app_only_rbac_and_nothing_more() -> anyhow::Result<()> {
    let _shared = SHARED.lock().await;
    let ctx = TestContext::new("deploy-rbac").await?;
    let docs = deploy::render_docs("app-only").await?;
    let rbac = docs_of_kind(
        &docs,
        &[
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ],
    );
    deploy::apply(&to_yaml(&rbac)?, false).await?;
    let dep = deployment(&docs, APP_CONTROLLER)?;

    // Cluster-wide RBAC, but this replica watches the test namespace only so it cannot
    // touch other tests' ApplicationInstances; its own Lease so it leads at once.
    let lease = format!("e2e-{}", ctx.namespace);
    deploy::grant_lease("app-controller", &lease).await?;
    let (controller, pod, kubeconfig) = start_as_service_account(
        &ctx,
        dep,
        &[
            "--watch-namespace",
            &ctx.namespace,
            "--allowed-namespaces",
            &ctx.namespace,
            "--lease-name",
            &lease,
        ],
    )
    .await?;

    apply_app(
        &ctx,
        &app("rbac-demo", "demo-app", "0.1.0", json!({"greeting": "least privilege"})),
    )
    .await?;
    wait_deployed(&ctx, "rbac-demo", "InstallSucceeded", "0.1.0").await?;

    let client = e2e::client().await?;
    assert_eq!(
        lease_holder(&client, SYSTEM_NAMESPACE, &lease).await?.as_deref(),
        Some(pod.as_str()),
        "the Lease in vworkspace-system is held under the Role"
    );
    assert!(
        !controller_events(&ctx).await?.is_empty(),
        "Events published under the ClusterRole"
    );

    // The impersonated ServiceAccount may do its job...
    let sa = client_from(&kubeconfig).await?;
    Api::<ApplicationInstance>::namespaced(sa.clone(), &ctx.namespace)
        .list(&ListParams::default())
        .await?;
    // ...and nothing else: the API server answers 403.
    let pp = PostParams::default();
    let ns = ctx.namespace.as_str();
    assert!(is_forbidden(
        &Api::<Secret>::namespaced(sa.clone(), ns)
            .create(&pp, &secret("stolen"))
            .await
    ));
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "x"}}))?;
    assert!(is_forbidden(
        &Api::<ConfigMap>::namespaced(sa.clone(), ns).create(&pp, &cm).await
    ));
    let workload: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "x"},
        "spec": {"selector": {"matchLabels": {"a": "b"}},
                 "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}
    }))?;
    assert!(is_forbidden(
        &Api::<Deployment>::namespaced(sa.clone(), ns)
            .create(&pp, &workload)
            .await
    ));
    let foreign_lease: Lease = serde_json::from_value(json!({"metadata": {"name": "x"}}))?;
    assert!(
        is_forbidden(
            &Api::<Lease>::namespaced(sa.clone(), "kube-system")
                .create(&pp, &foreign_lease)
                .await
        ),
        "Lease rights only in vworkspace-system"
    );
    assert!(
        is_forbidden(
            &Api::<Lease>::namespaced(sa.clone(), SYSTEM_NAMESPACE)
                .get("vworkspace-agent")
                .await
        ),
        "another binary's Lease is out of reach"
    );
    let escalate: ClusterRole = serde_json::from_value(json!({"metadata": {"name": "vws-e2e-escalate"}, "rules": []}))?;
    assert!(is_forbidden(
        &Api::<ClusterRole>::all(sa.clone()).create(&pp, &escalate).await
    ));
    assert!(is_forbidden(
        &Api::<Namespace>::all(sa.clone())
            .delete(ns, &DeleteParams::default())
            .await
    ));

    delete_and_wait_gone(&ctx, "rbac-demo").await?;
    assert_never_forbidden(&controller);
    Ok(())
}

#[tokio::test]
async fn namespaced_overlay_confines_the_app_controller_to_its_namespace() -> anyhow::Result<()> {
    let _shared = SHARED.lock().await;
    let ctx = TestContext::new("deploy-ns").await?;
    let other = TestContext::new("deploy-other").await?;
    // The overlay's example tenants team-a and team-b become this test's two namespaces,
    // exactly as the docs say to adapt it.
    let yaml = deploy::render("namespaced")
        .await?
        .replace("team-a", &ctx.namespace)
        .replace("team-b", &other.namespace);
    let docs = e2e::yaml_documents(&yaml)?;
    // The release ClusterRoles alone, granting nothing by themselves: the release role each
    // controller binds in its own namespace with a RoleBinding, and the rules it aggregates
    // (docs/install/README.md#flux-multi-tenancy).
    let cluster_scoped: Vec<(&str, &str)> = docs_of_kind(&docs, &["ClusterRole", "ClusterRoleBinding"])
        .into_iter()
        .map(|d| (kind(d), name(d)))
        .collect();
    assert_eq!(cluster_scoped, api::RELEASE_ROLES.map(|role| ("ClusterRole", role)));
    let dep_name = format!("app-controller-{}", ctx.namespace);
    let dep = deployment(&docs, &dep_name)?;
    let sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or_default();
    let mine: Vec<&Value> = docs
        .iter()
        .filter(|d| {
            kind(d) == "Namespace"
                || (kind(d) == "ClusterRole" && api::RELEASE_ROLES.contains(&name(d)))
                || (kind(d) == "ServiceAccount" && name(d) == sa)
                || (matches!(kind(d), "Role" | "RoleBinding")
                    && d["metadata"]["labels"]["app.kubernetes.io/name"] == APP_CONTROLLER
                    && namespace(d) == ctx.namespace)
        })
        .collect();
    assert_eq!(
        mine.len(),
        8,
        "namespace, 2 release ClusterRoles, ServiceAccount, 2 Roles, 2 RoleBindings"
    );
    deploy::apply(&to_yaml(&mine)?, false).await?;

    let (controller, pod, kubeconfig) = start_as_service_account(&ctx, dep, &[]).await?;
    apply_app(&ctx, &app("tenant-app", "demo-app", "0.1.0", json!({}))).await?;
    wait_deployed(&ctx, "tenant-app", "InstallSucceeded", "0.1.0").await?;
    let client = e2e::client().await?;
    assert_eq!(
        lease_holder(&client, &ctx.namespace, "vworkspace-app-controller")
            .await?
            .as_deref(),
        Some(pod.as_str()),
        "the Lease lives in the tenant namespace"
    );

    // Policy: a target namespace outside the allow-list is refused before any write.
    let mut escape = app("escape", "demo-app", "0.1.0", json!({}));
    escape.spec.target_namespace = Some(other.namespace.clone());
    apply_app(&ctx, &escape).await?;
    let refused = wait_ready(&ctx, "escape", "False", "NamespaceNotAllowed").await?;
    assert!(condition(&refused, "Ready").unwrap().2.contains(&other.namespace));

    // RBAC: even if it tried, the API server refuses writes and reads outside its namespace.
    let sa_client = client_from(&kubeconfig).await?;
    let hr_other = dynamic_api(
        &sa_client,
        &other.namespace,
        "helm.toolkit.fluxcd.io",
        "v2",
        "HelmRelease",
        "helmreleases",
    );
    let hr: kube::api::DynamicObject =
        serde_json::from_value(flux::helm_release("intruder", "repo", "demo-app", "0.1.0", json!({})))?;
    assert!(
        is_forbidden(&hr_other.create(&PostParams::default(), &hr).await),
        "HelmRelease in another namespace"
    );
    assert!(
        is_forbidden(
            &Api::<ApplicationInstance>::all(sa_client.clone())
                .list(&ListParams::default())
                .await
        ),
        "cluster-wide list"
    );
    assert!(is_forbidden(
        &Api::<Secret>::namespaced(sa_client.clone(), &other.namespace)
            .list(&ListParams::default())
            .await
    ));
    assert!(is_forbidden(
        &Api::<Secret>::namespaced(sa_client.clone(), &ctx.namespace)
            .create(&PostParams::default(), &secret("stolen"))
            .await
    ));

    delete_and_wait_gone(&ctx, "escape").await?;
    delete_and_wait_gone(&ctx, "tenant-app").await?;
    assert_never_forbidden(&controller);
    drop(controller);
    // The ServiceAccount is in vworkspace-system; the Roles go with the test namespace.
    let _ = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client, SYSTEM_NAMESPACE)
        .delete(sa, &DeleteParams::default())
        .await;
    Ok(())
}

/// One app-controller replica with leader election, on the admin kubeconfig.
struct Replica {
    identity: &'static str,
    admin: String,
    process: ControllerProcess,
}

/// One Lease per test run, in the namespace where the ServiceAccount may hold Leases.
fn lease_name(ctx: &TestContext) -> String {
    format!("app-controller-{}", ctx.namespace)
}

impl Replica {
    async fn start(ctx: &TestContext, identity: &'static str) -> anyhow::Result<Self> {
        // As the ServiceAccount (e2e default): its Lease rights are in the system namespace.
        let lease = lease_name(ctx);
        let args = |admin: &str| {
            [
                "--leader-elect",
                "--log-format=json",
                "--lease-name",
                &lease,
                "--lease-namespace",
                SYSTEM_NAMESPACE,
                "--lease-duration",
                "4s",
                "--renew-deadline",
                "3s",
                "--retry-period",
                "1s",
                "--identity",
                identity,
                "--watch-namespace",
                ctx.namespace.as_str(),
                "--allowed-namespaces",
                ctx.namespace.as_str(),
                "--insecure-repository-hosts",
                "127.0.0.1",
                "--admin-addr",
                admin,
            ]
            .map(str::to_owned)
            .to_vec()
        };
        // Neither replica may exit on its own: the leader is SIGKILLed (`kill`, an expected
        // exit); a replica exiting after losing its Lease fails the test's waits at once.
        let (process, admin) = ControllerProcess::start_with_admin(
            ctx.process_scope(),
            APP_CONTROLLER,
            &format!("app-controller-{}-{identity}", ctx.namespace),
            args,
            &[("RUST_LOG", "info")],
        )
        .await?;
        process.wait_http_ok(&admin, "/readyz", Duration::from_secs(60)).await?;
        Ok(Self {
            identity,
            admin,
            process,
        })
    }

    async fn metrics(&self) -> anyhow::Result<String> {
        http_get(&self.admin, "/metrics").await
    }

    /// Writes the reconciler counted (status applies, Events), Lease writes excluded.
    async fn writes(&self) -> anyhow::Result<f64> {
        Ok(metric_sum(
            &self.metrics().await?,
            "vworkspace_api_writes_total",
            &["controller=\"applicationinstance\""],
        ))
    }

    /// Requests the process's client sent, by verb and resource (`vworkspace_api_requests_total`,
    /// which sees the engine's applies too).
    async fn requests(&self, verb: &str, resource: &str) -> anyhow::Result<f64> {
        let verb = format!("verb=\"{verb}\"");
        let resource = format!("resource=\"{resource}\"");
        Ok(metric_sum(
            &self.metrics().await?,
            "vworkspace_api_requests_total",
            &[&verb, &resource],
        ))
    }

    async fn leader_gauge(&self) -> anyhow::Result<f64> {
        Ok(metric_sum(&self.metrics().await?, "vworkspace_leader", &[]))
    }
}

/// Events about `app_name`, by reporting instance.
async fn reporting_instances(ctx: &TestContext, app_name: &str) -> anyhow::Result<Vec<String>> {
    let mut v: Vec<String> = controller_events(ctx)
        .await?
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(app_name))
        .filter_map(|e| e.reporting_instance)
        .collect();
    v.sort();
    v.dedup();
    Ok(v)
}

#[tokio::test]
async fn leader_election_one_writer_and_takeover_after_sigkill() -> anyhow::Result<()> {
    // The replicas run as their ServiceAccount: keep the overlay tests from removing its RBAC
    // meanwhile, and put it back if one already did.
    let _shared = SHARED.lock().await;
    e2e::deploy::apply_bundle_rbac().await?;
    let ctx = TestContext::new("deploy-leader").await?;
    e2e::deploy::grant_lease("app-controller", &lease_name(&ctx)).await?;
    let client = ctx.client.clone();
    let a = Replica::start(&ctx, "replica-a").await?;
    let b = Replica::start(&ctx, "replica-b").await?;
    let lease_duration = Duration::from_secs(4);

    let holder = eventually(&ctx, "a Lease holder", Duration::from_secs(30), || async {
        Ok(lease_holder(&client, SYSTEM_NAMESPACE, &lease_name(&ctx))
            .await?
            .ok_or_else(|| "no holder".to_owned()))
    })
    .await?;
    let (leader, follower) = if holder == a.identity { (a, b) } else { (b, a) };
    assert_eq!(holder, leader.identity);
    assert_eq!(leader.leader_gauge().await?, 1.0);
    assert_eq!(follower.leader_gauge().await?, 0.0);

    apply_app(&ctx, &app("first", "demo-app", "0.1.0", json!({}))).await?;
    wait_deployed(&ctx, "first", "InstallSucceeded", "0.1.0").await?;
    assert!(leader.writes().await? > 0.0, "the leader wrote the status");
    assert_eq!(follower.writes().await?, 0.0, "the follower never wrote");
    // Counted at the client, so the engine's own requests show too: only the leader applied
    // and read the HelmRelease; the follower only watches.
    assert!(leader.requests("apply", "helmreleases").await? > 0.0);
    assert!(leader.requests("get", "helmreleases").await? > 0.0);
    for verb in ["apply", "get", "patch", "delete"] {
        assert_eq!(follower.requests(verb, "helmreleases").await?, 0.0, "follower {verb}");
    }
    assert!(follower.requests("watch", "applicationinstances").await? > 0.0);
    assert_eq!(reporting_instances(&ctx, "first").await?, [leader.identity]);

    // SIGKILL: no release of the Lease, the follower must wait for it to expire.
    let Replica {
        identity: dead,
        process: mut leader_process,
        ..
    } = leader;
    leader_process.kill().await?;
    let killed = Instant::now();
    eventually(
        &ctx,
        "the follower takes the Lease",
        Duration::from_secs(30),
        || async {
            Ok(
                match lease_holder(&client, SYSTEM_NAMESPACE, &lease_name(&ctx)).await? {
                    Some(h) if h == follower.identity => Ok(()),
                    other => Err(format!("holder {other:?}")),
                },
            )
        },
    )
    .await?;
    let takeover = killed.elapsed();
    eprintln!("takeover {takeover:?} after SIGKILL (lease duration {lease_duration:?}, retry period 1s)");
    // client-go semantics: the follower takes over once it has itself seen the record
    // unchanged for a lease duration. It sees the last renewal up to one (jittered) retry
    // period late and attempts up to one retry period after expiry: at most the lease
    // duration plus two retry periods of 1.2 s.
    assert!(
        takeover <= lease_duration + Duration::from_millis(2 * 1200 + 600),
        "takeover took {takeover:?}"
    );
    assert_eq!(follower.leader_gauge().await?, 1.0);

    apply_app(&ctx, &app("second", "demo-app", "0.1.0", json!({}))).await?;
    wait_deployed(&ctx, "second", "InstallSucceeded", "0.1.0").await?;
    assert!(follower.writes().await? > 0.0, "the new leader writes");
    assert_eq!(reporting_instances(&ctx, "second").await?, [follower.identity]);
    let lease: Lease = Api::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .get(&lease_name(&ctx))
        .await?;
    assert!(
        lease.spec.and_then(|s| s.lease_transitions).unwrap_or_default() >= 1,
        "the takeover is recorded as a transition"
    );

    // No write conflicts: neither replica logged a 409 / Conflict.
    for (who, logs) in [
        (dead, leader_process.logs()),
        (follower.identity, follower.process.logs()),
    ] {
        let conflicts: Vec<&str> = logs
            .lines()
            .filter(|l| {
                // Not a bare "409": timestamps contain it (17:15:10.914092Z).
                let l = l.to_ascii_lowercase();
                l.contains("conflict") || l.contains("code: 409") || l.contains("\"code\":409")
            })
            .collect();
        assert!(
            conflicts.is_empty(),
            "{who} logged conflicts:\n{}",
            conflicts.join("\n")
        );
    }
    Ok(())
}

/// Ports of `policy`'s ingress rules that admit traffic, with whether the rule names its
/// sources (`from`) or is open to all.
fn policy_ports(policy: &Value) -> Vec<(String, bool)> {
    policy["spec"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|rule| {
            let restricted = rule["from"].as_array().is_some_and(|f| !f.is_empty());
            rule["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |p| (p["port"].to_string().trim_matches('"').to_owned(), restricted))
        })
        .collect()
}

/// Whether `policy` selects the pods of `service` (its matchLabels are all in the
/// Service's selector).
fn selects(policy: &Value, service: &Value) -> bool {
    let selector = &service["spec"]["selector"];
    namespace(policy) == namespace(service)
        && policy["spec"]["podSelector"]["matchLabels"]
            .as_object()
            .is_some_and(|labels| labels.iter().all(|(k, v)| selector[k] == *v))
        && policy["spec"]["policyTypes"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t == "Ingress"))
}

/// Every port of every Service of the bundle is admitted by a NetworkPolicy selecting its
/// pods (and so closed to anything the policies do not name); `overlay` names the docs.
fn check_network_policies(overlay: &str, docs: &[Value]) {
    let policies = docs_of_kind(docs, &["NetworkPolicy"]);
    let ours = |d: &&Value| d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "vworkspace-operator";
    let services: Vec<&Value> = docs_of_kind(docs, &["Service"]).into_iter().filter(ours).collect();
    assert!(!services.is_empty(), "{overlay}: no Service of the bundle");
    for service in services {
        for port in service["spec"]["ports"].as_array().into_iter().flatten() {
            let target = port.get("targetPort").unwrap_or(&port["port"]);
            let target = target.to_string().trim_matches('"').to_owned();
            let number = port["port"].to_string();
            let admitted: Vec<bool> = policies
                .iter()
                .filter(|p| selects(p, service))
                .flat_map(|p| policy_ports(p))
                .filter(|(p, _)| *p == target || *p == number)
                .map(|(_, restricted)| restricted)
                .collect();
            assert!(
                !admitted.is_empty(),
                "{overlay}: port {target} of Service {} has no NetworkPolicy",
                name(service)
            );
            // The ports only the bundle's own pods or monitoring may reach are never open
            // to all; only push mode's endpoint is (Odoo calls it from outside).
            if target != "push" {
                assert!(
                    admitted.iter().all(|r| *r),
                    "{overlay}: port {target} of Service {} is open to every source",
                    name(service)
                );
            }
        }
    }
}

#[tokio::test]
async fn every_service_port_is_covered_by_a_network_policy() -> anyhow::Result<()> {
    for overlay in deploy::OVERLAYS {
        check_network_policies(overlay, &deploy::render_docs(overlay).await?);
    }
    // Push mode's component adds a port: render the full overlay with it.
    let dir = e2e::repo_root().join("target/kustomize-agent-push");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- ../../deploy/overlays/full\ncomponents:\n- ../../deploy/components/agent-push\n",
    )?;
    let rendered = deploy::kubectl(&["kustomize", &dir.to_string_lossy()], None).await?;
    let docs = e2e::yaml_documents(&rendered)?;
    assert!(
        docs.iter().any(|d| kind(d) == "Service" && name(d) == "agent-push"),
        "the push Service is rendered"
    );
    check_network_policies("full + agent-push", &docs);
    Ok(())
}
