//! The tenant rules hold at the API server, for a kubectl user as much as for the agent
//! (issue 14): the ValidatingAdmissionPolicies generated into deploy/crds/ (crates/api
//! `admission`) refuse what would reach beyond a tenant's namespace or above its
//! privileges, before anything is stored, so no controller ever sees it.
//!
//! Written as the attack: a tenant user (an impersonated user and group, not a
//! ServiceAccount) who holds only a Role in their namespace (create/get/list on
//! ApplicationInstances and Operations) tries to reach a second tenant's namespace, the
//! node, a cluster-scoped object or another namespace's Secret. Every attempt must be
//! refused with the documented message (docs/security.md), and nothing may exist
//! in the other namespace afterwards; a well-formed object in their own namespace is
//! accepted. The cluster administrator stays exempt and the operator's ServiceAccounts do
//! not.

use std::time::Duration;

use api::{
    ApplicationInstance, Operation, RUNBOOK_SERVICE_ACCOUNT,
    admission::{ANNOTATION_ALLOWED_NAMESPACE_PAIRS, APPLICATION_INSTANCE_POLICY, OPERATION_POLICY},
};
use e2e::{
    CHART_REPO, TestContext, cluster_dir,
    deploy::{self, SYSTEM_NAMESPACE, client_from, ensure_bundle_rbac, impersonating_kubeconfig, is_forbidden},
    dynamic_api,
};
use k8s_openapi::api::{
    core::v1::{Namespace, Secret},
    rbac::v1::{ClusterRoleBinding, Role, RoleBinding},
};
use kube::{
    Api, Client, Config,
    api::{DynamicObject, ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

/// The group every impersonated tenant user is in (bound to nothing cluster-wide).
const TENANT_GROUP: &str = "vws-e2e-tenants";

static POLICIES: OnceCell<()> = OnceCell::const_new();

/// Applies deploy/crds/admission-policies.yaml as `hack/cluster.sh up` does (same field
/// manager, so neither takes the other's fields), once per test process: a cluster started
/// before the policies existed gets them here. Then waits until the API server enforces
/// them (policies are loaded asynchronously).
async fn ensure_policies(tenant: &Client, namespace: &str) -> anyhow::Result<()> {
    POLICIES
        .get_or_try_init(async || {
            let file = e2e::repo_root().join("deploy/crds/admission-policies.yaml");
            let path = file.to_string_lossy().into_owned();
            deploy::kubectl(
                &["apply", "--server-side", "--field-manager=vws-cluster-up", "-f", &path],
                None,
            )
            .await?;
            anyhow::Ok(())
        })
        .await?;
    // A dry run of a refused object, until the refusal comes from the policy.
    let probe = app("probe", json!({"targetNamespace": "kube-system"}));
    let apps: Api<ApplicationInstance> = Api::namespaced(tenant.clone(), namespace);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match apps
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &probe,
            )
            .await
        {
            Err(e) if e.to_string().contains(APPLICATION_INSTANCE_POLICY) => return Ok(()),
            other if tokio::time::Instant::now() > deadline => {
                anyhow::bail!("the admission policies are not enforced after 30 s: {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// A client for the admin kubeconfig that impersonates user `user` in group [`TENANT_GROUP`]:
/// every request is authorised with that user's RBAC only.
async fn tenant_client(user: &str) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(cluster_dir().join("admin.kubeconfig"))?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = Some(vec![TENANT_GROUP.to_owned()]);
    Ok(Client::try_from(config)?)
}

/// A tenant namespace whose user holds only a Role to create/get/list ApplicationInstances
/// and Operations there, and the client that acts as that user.
async fn tenant(ctx: &TestContext) -> anyhow::Result<Client> {
    let user = format!("tenant@{}", ctx.namespace);
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "tenant"},
        "rules": [{
            "apiGroups": ["vworkspace.io"],
            "resources": ["applicationinstances", "operations"],
            "verbs": ["create", "get", "list"],
        }],
    }))?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "tenant"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))?;
    ctx.apply(&role).await?;
    ctx.apply(&binding).await?;
    let client = tenant_client(&user).await?;
    ensure_policies(&client, &ctx.namespace).await?;
    Ok(client)
}

/// An ApplicationInstance of the local chart repository with `extra` merged into its spec.
fn app(name: &str, extra: Value) -> ApplicationInstance {
    let mut spec = json!({"chart": {"name": "demo-app", "version": "0.1.0", "repository": {"url": CHART_REPO}}});
    if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
        spec.extend(extra);
    }
    let value = json!({
        "apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance",
        "metadata": {"name": name}, "spec": spec,
    });
    serde_json::from_value(value).unwrap_or_else(|e| panic!("test ApplicationInstance {name}: {e}"))
}

/// A Runbook Operation whose Job's pod spec is one busybox container plus `pod`, with
/// `container` merged into the container.
fn runbook(name: &str, pod: Value, container: Value) -> Operation {
    let mut main = json!({"name": "main", "image": "busybox:1.36", "command": ["true"]});
    if let (Some(main), Value::Object(extra)) = (main.as_object_mut(), container) {
        main.extend(extra);
    }
    let mut spec = json!({"containers": [main]});
    if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), pod) {
        spec.extend(extra);
    }
    operation(
        name,
        "Runbook",
        json!({"runbook": {"job": {"template": {"spec": spec}}}}),
    )
}

/// An Operation of `type_` on the app `wiki` with `payload` merged into its spec.
fn operation(name: &str, type_: &str, payload: Value) -> Operation {
    let mut spec = json!({"type": type_, "applicationRef": {"name": "wiki"}, "requestId": format!("req-{name}")});
    if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), payload) {
        spec.extend(extra);
    }
    let value =
        json!({"apiVersion": "vworkspace.io/v1alpha1", "kind": "Operation", "metadata": {"name": name}, "spec": spec});
    serde_json::from_value(value).unwrap_or_else(|e| panic!("test Operation {name}: {e}"))
}

/// Asserts that `result` is the API server's refusal by `policy`, naming `expect`.
fn assert_refused<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>, policy: &str, expect: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert!(
                status.is_forbidden(),
                "{what}: refused, but not as Forbidden: {status:?}"
            );
            let message = &status.message;
            assert!(
                message.contains(&format!("ValidatingAdmissionPolicy '{policy}'")) && message.contains(expect),
                "{what}: refusal {message:?} does not come from {policy} or does not contain {expect:?}"
            );
        }
        other => panic!("{what}: expected a refusal containing {expect:?}, got {other:?}"),
    }
}

/// Nothing of ours and no HelmRelease exists in `namespace` (checked as the administrator).
async fn assert_untouched(other: &TestContext) -> anyhow::Result<()> {
    let lp = ListParams::default();
    let apps = other.api::<ApplicationInstance>().list(&lp).await?;
    let ops = other.api::<Operation>().list(&lp).await?;
    let releases = e2e::flux::helm_releases(other).list(&lp).await?;
    assert!(
        apps.items.is_empty() && ops.items.is_empty() && releases.items.is_empty(),
        "{} is not untouched: {} ApplicationInstances, {} Operations, {} HelmReleases",
        other.namespace,
        apps.items.len(),
        ops.items.len(),
        releases.items.len()
    );
    Ok(())
}

#[tokio::test]
async fn a_tenant_application_instance_cannot_reach_another_namespace() -> anyhow::Result<()> {
    let mine = TestContext::new("adm-app-a").await?;
    let theirs = TestContext::new("adm-app-b").await?;
    let tenant = tenant(&mine).await?;
    let apps: Api<ApplicationInstance> = Api::namespaced(tenant.clone(), &mine.namespace);
    let b = theirs.namespace.as_str();
    let pp = PostParams::default();

    let attacks = [
        (
            "install into team-b",
            app("into-b", json!({"targetNamespace": b})),
            format!("spec.targetNamespace {b} is not this object's namespace"),
        ),
        (
            "use team-b's source",
            app(
                "from-b",
                json!({"chart": {"name": "demo-app", "sourceRef": {"kind": "HelmRepository", "name": "private", "namespace": b}}}),
            ),
            format!("spec.chart.sourceRef.namespace {b} is not this object's namespace"),
        ),
        (
            "depend on team-b",
            app(
                "after-b",
                json!({"dependsOn": [{"name": "db"}, {"name": "db", "namespace": b}]}),
            ),
            format!("spec.dependsOn[].namespace {b} is not this object's namespace"),
        ),
        (
            "release as another ServiceAccount",
            app("as-deployer", json!({"serviceAccountName": "deployer"})),
            "spec.serviceAccountName deployer is not allowed".to_owned(),
        ),
        (
            "fetch charts from the metadata service",
            app(
                "metadata",
                json!({"chart": {"name": "demo-app", "repository": {"url": "http://169.254.169.254/latest/meta-data"}}}),
            ),
            "spec.chart.repository.url http://169.254.169.254/latest/meta-data points at a link-local address"
                .to_owned(),
        ),
        (
            "fetch charts from the metadata service, IPv4-mapped",
            app(
                "metadata6",
                json!({"chart": {"name": "demo-app", "repository": {"url": "http://[::ffff:169.254.169.254]/"}}}),
            ),
            "spec.chart.repository.url http://[::ffff:169.254.169.254]/ points at a link-local address".to_owned(),
        ),
    ];
    for (what, attack, expect) in &attacks {
        assert_refused(
            what,
            apps.create(&pp, attack).await,
            APPLICATION_INSTANCE_POLICY,
            expect,
        );
    }
    // The same objects straight into team-b: RBAC refuses before admission.
    let apps_b: Api<ApplicationInstance> = Api::namespaced(tenant.clone(), b);
    assert!(
        is_forbidden(&apps_b.create(&pp, &app("intruder", json!({}))).await),
        "an ApplicationInstance in team-b"
    );

    // A well-formed one in the tenant's own namespace, its own namespace named explicitly
    // and the release ServiceAccount named, is accepted.
    let own = json!({
        "targetNamespace": mine.namespace, "serviceAccountName": "vworkspace-release",
        "dependsOn": [{"name": "db", "namespace": mine.namespace}],
    });
    apps.create(&pp, &app("wiki", own)).await?;
    let names: Vec<String> = mine
        .api::<ApplicationInstance>()
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|a| a.metadata.name)
        .collect();
    assert_eq!(names, ["wiki"], "only the well-formed ApplicationInstance exists");
    assert_untouched(&theirs).await?;
    Ok(())
}

#[tokio::test]
async fn a_tenant_runbook_cannot_reach_the_node_the_api_or_another_namespace() -> anyhow::Result<()> {
    let mine = TestContext::new("adm-op-a").await?;
    let theirs = TestContext::new("adm-op-b").await?;
    let tenant = tenant(&mine).await?;
    let ops: Api<Operation> = Api::namespaced(tenant.clone(), &mine.namespace);
    let pp = PostParams::default();
    let spec = "spec.runbook.job.template.spec.";

    let attacks = [
        (
            "privileged container",
            runbook(
                "privileged",
                json!({}),
                json!({"securityContext": {"privileged": true}}),
            ),
            format!("{spec}containers[main].securityContext.privileged is true"),
        ),
        (
            "the node's filesystem",
            runbook(
                "host-path",
                json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
                json!({}),
            ),
            format!("{spec}volumes[root].hostPath is set"),
        ),
        (
            "the node's network",
            runbook("host-network", json!({"hostNetwork": true}), json!({})),
            format!("{spec}hostNetwork is true"),
        ),
        (
            "the node's processes",
            runbook("host-pid", json!({"hostPID": true}), json!({})),
            format!("{spec}hostPID is true"),
        ),
        (
            "an added capability",
            runbook(
                "sys-admin",
                json!({}),
                json!({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}),
            ),
            format!(
                "{spec}containers[main].securityContext.capabilities.add adds a capability other than NET_BIND_SERVICE"
            ),
        ),
        (
            "privilege escalation",
            runbook(
                "escalate",
                json!({}),
                json!({"securityContext": {"allowPrivilegeEscalation": true}}),
            ),
            format!("{spec}containers[main].securityContext.allowPrivilegeEscalation is true"),
        ),
        (
            "another ServiceAccount",
            runbook("deployer", json!({"serviceAccountName": "deployer"}), json!({})),
            format!("{spec}serviceAccountName names another ServiceAccount than {RUNBOOK_SERVICE_ACCOUNT}"),
        ),
        (
            "an API token",
            runbook("token", json!({"automountServiceAccountToken": true}), json!({})),
            format!("{spec}automountServiceAccountToken is true"),
        ),
        (
            "a cluster-scoped WorkflowTemplate",
            operation(
                "cluster-wf",
                "Runbook",
                json!({"runbook": {"workflowTemplateRef": {"name": "x", "clusterScope": true}}}),
            ),
            "spec.runbook.workflowTemplateRef.clusterScope is true".to_owned(),
        ),
        (
            "a clone into another namespace",
            operation(
                "clone",
                "Restore",
                json!({"restore": {"source": {"operationName": "nightly"}, "targetNamespace": theirs.namespace}}),
            ),
            format!(
                "spec.restore.targetNamespace {} is not this object's namespace {}",
                theirs.namespace, mine.namespace
            ),
        ),
    ];
    for (what, attack, expect) in &attacks {
        assert_refused(what, ops.create(&pp, attack).await, OPERATION_POLICY, expect);
    }

    // A Restore names another namespace only as a clone with an allowed pair (refused above);
    // otherwise it restores the application's own target namespace, which the
    // ApplicationInstance policy keeps in its namespace. The other way into team-b is an
    // Operation there, which RBAC refuses.
    let restore = operation(
        "restore",
        "Restore",
        json!({"restore": {"source": {"operationName": "nightly"}}}),
    );
    let ops_b: Api<Operation> = Api::namespaced(tenant.clone(), &theirs.namespace);
    assert!(is_forbidden(&ops_b.create(&pp, &restore).await), "a Restore in team-b");

    // Ordinary ones in the tenant's own namespace are accepted.
    ops.create(&pp, &restore).await?;
    let ordinary = runbook(
        "ordinary",
        json!({"serviceAccountName": RUNBOOK_SERVICE_ACCOUNT, "automountServiceAccountToken": false}),
        json!({"securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}),
    );
    ops.create(&pp, &ordinary).await?;
    let mut names: Vec<String> = mine
        .api::<Operation>()
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    names.sort();
    assert_eq!(names, ["ordinary", "restore"], "only the well-formed Operations exist");
    assert_untouched(&theirs).await?;
    Ok(())
}

#[tokio::test]
async fn a_tenant_cannot_go_around_the_operator_with_its_own_rights() -> anyhow::Result<()> {
    let mine = TestContext::new("adm-rbac-a").await?;
    let theirs = TestContext::new("adm-rbac-b").await?;
    let tenant = tenant(&mine).await?;
    let pp = PostParams::default();
    // team-b's Secret, made by the administrator.
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "db-password"}, "stringData": {"password": "s3cret"}}))?;
    theirs.apply(&secret).await?;

    let hr: DynamicObject = serde_json::from_value(e2e::flux::helm_release(
        "intruder",
        "repo",
        "demo-app",
        "0.1.0",
        json!({}),
    ))?;
    for ns in [&theirs.namespace, &mine.namespace] {
        let releases = dynamic_api(
            &tenant,
            ns,
            "helm.toolkit.fluxcd.io",
            "v2",
            "HelmRelease",
            "helmreleases",
        );
        assert!(is_forbidden(&releases.create(&pp, &hr).await), "a HelmRelease in {ns}");
    }
    let secrets: Api<Secret> = Api::namespaced(tenant.clone(), &theirs.namespace);
    assert!(
        is_forbidden(&secrets.get("db-password").await),
        "reading team-b's Secret"
    );
    assert!(
        is_forbidden(&secrets.list(&ListParams::default()).await),
        "listing team-b's Secrets"
    );
    let crb: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("vws-e2e-{}", mine.namespace)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": TENANT_GROUP}],
    }))?;
    assert!(
        is_forbidden(&Api::<ClusterRoleBinding>::all(tenant.clone()).create(&pp, &crb).await),
        "a ClusterRoleBinding"
    );
    assert!(
        is_forbidden(
            &Api::<ApplicationInstance>::all(tenant.clone())
                .list(&ListParams::default())
                .await
        ),
        "listing every namespace's ApplicationInstances"
    );
    assert_untouched(&theirs).await?;
    Ok(())
}

#[tokio::test]
async fn the_agent_is_held_to_the_rules_and_the_administrator_is_not() -> anyhow::Result<()> {
    let mine = TestContext::new("adm-who-a").await?;
    let theirs = TestContext::new("adm-who-b").await?;
    // The tenant is only here to wait for the policies to be in force.
    tenant(&mine).await?;
    ensure_bundle_rbac().await?;
    let kubeconfig = impersonating_kubeconfig(SYSTEM_NAMESPACE, "agent", &format!("agent-{}", mine.namespace))?;
    let agent = client_from(&kubeconfig).await?;
    let b = theirs.namespace.as_str();
    let escape = app("escape", json!({"targetNamespace": b}));
    let pp = PostParams::default();

    // The agent's ServiceAccount may create ApplicationInstances anywhere, but not this one.
    let as_agent: Api<ApplicationInstance> = Api::namespaced(agent.clone(), &mine.namespace);
    assert_refused(
        "the agent",
        as_agent.create(&pp, &escape).await,
        APPLICATION_INSTANCE_POLICY,
        &format!("spec.targetNamespace {b} is not this object's namespace"),
    );

    // The administrator (system:masters) may: the controllers' own refusals are tested
    // that way, and an administrator could remove the policies anyway.
    mine.api::<ApplicationInstance>().create(&pp, &escape).await?;

    // Updates that leave the spec alone (labels, finalizers: what controllers write) pass
    // on that object; one that changes the spec is checked again, and refused.
    let label = json!({"metadata": {"labels": {"vworkspace.io/e2e": "yes"}}});
    as_agent
        .patch("escape", &PatchParams::default(), &Patch::Merge(&label))
        .await?;
    let suspend = json!({"spec": {"suspend": true}});
    assert_refused(
        "the agent changing the spec",
        as_agent
            .patch("escape", &PatchParams::default(), &Patch::Merge(&suspend))
            .await,
        APPLICATION_INSTANCE_POLICY,
        &format!("spec.targetNamespace {b}"),
    );
    Ok(())
}

/// Sets (or with `None` removes) the pairs annotation on `namespace`, as an administrator
/// does with `kubectl annotate namespace`.
async fn annotate_pairs(namespace: &str, pairs: Option<&str>) -> anyhow::Result<()> {
    let value = pairs.map_or_else(
        || format!("{ANNOTATION_ALLOWED_NAMESPACE_PAIRS}-"),
        |p| format!("{ANNOTATION_ALLOWED_NAMESPACE_PAIRS}={p}"),
    );
    deploy::kubectl(&["annotate", "--overwrite", "namespace", namespace, &value], None).await?;
    Ok(())
}

#[tokio::test]
async fn an_administrator_allows_a_namespace_pair_with_a_namespace_annotation() -> anyhow::Result<()> {
    let mine = TestContext::new("adm-pair-a").await?;
    let theirs = TestContext::new("adm-pair-b").await?;
    let third = TestContext::new("adm-pair-c").await?;
    let mine_tenant = tenant(&mine).await?;
    let apps: Api<ApplicationInstance> = Api::namespaced(mine_tenant, &mine.namespace);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let (a, b, c) = (&mine.namespace, &theirs.namespace, &third.namespace);
    let into = |ns: &str| {
        app(
            "shared",
            json!({"targetNamespace": ns, "dependsOn": [{"name": "db", "namespace": ns}],
                   "chart": {"name": "demo-app", "sourceRef": {"kind": "HelmRepository", "name": "shared", "namespace": ns}}}),
        )
    };
    let refused = |ns: &str| format!("spec.targetNamespace {ns} is not this object's namespace {a}");

    // Strict by default.
    assert_refused(
        "no pair allowed yet",
        apps.create(&dry, &into(b)).await,
        APPLICATION_INSTANCE_POLICY,
        &refused(b),
    );

    // The same value as the app controller's --allowed-namespace-pairs, blanks and pairs of
    // other namespaces included: only a=b counts for objects in a.
    let pairs = format!(" {b}={c} , {a}={b} ");
    annotate_pairs(a, Some(&pairs)).await?;
    annotate_pairs(b, Some(&pairs)).await?;
    // The namespace change reaches the API server's namespace cache asynchronously.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while let Err(e) = apps.create(&dry, &into(b)).await {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the pair {a}={b} is not allowed after 30 s: {e}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Only that pair, in that direction.
    assert_refused(
        "a namespace not in the pair",
        apps.create(&dry, &into(c)).await,
        APPLICATION_INSTANCE_POLICY,
        &format!("allows the pair {a}={c}"),
    );
    let theirs_tenant = tenant(&theirs).await?;
    assert_refused(
        "the reverse direction",
        Api::<ApplicationInstance>::namespaced(theirs_tenant, b)
            .create(&dry, &into(a))
            .await,
        APPLICATION_INSTANCE_POLICY,
        &format!("spec.targetNamespace {a} is not this object's namespace {b}"),
    );

    // The tenant cannot set the annotation itself: a Namespace is cluster-scoped.
    let tenant_ns: Api<Namespace> = Api::all(tenant_client(&format!("tenant@{a}")).await?);
    let patch = json!({"metadata": {"annotations": {ANNOTATION_ALLOWED_NAMESPACE_PAIRS: format!("{a}={c}")}}});
    assert!(
        is_forbidden(&tenant_ns.patch(a, &PatchParams::default(), &Patch::Merge(&patch)).await),
        "the tenant annotating its own namespace"
    );

    // Without the annotation, strict again.
    annotate_pairs(a, None).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while apps.create(&dry, &into(b)).await.is_ok() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the pair is still allowed 30 s after removal"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}
