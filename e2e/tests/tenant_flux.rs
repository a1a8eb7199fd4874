//! Flux multi-tenancy lockdown as the attack of issue 14, item 1: whoever can write an
//! ApplicationInstance (Odoo through the agent, the push-token holder, a kubectl user with
//! create rights in one namespace) tries to become cluster-admin through a chart, or to read
//! another namespace's Secret with Helm's `lookup`. The release is applied as the namespace's
//! `vworkspace-release` ServiceAccount (namespace-scoped rights), and helm-controller runs
//! with `--default-service-account=vworkspace-no-rights` and `--no-cross-namespace-refs=true`
//! (hack/cluster.sh, as the bundle's deploy/flux). Every attempt fails with Flux's own reason,
//! relayed verbatim, and creates nothing outside the tenant; an ordinary app still installs.
//! See docs/install/README.md#flux-multi-tenancy.

use std::time::Duration;

use api::{ApplicationInstance, RELEASE_ROLE, RELEASE_SERVICE_ACCOUNT};
use e2e::{
    TestContext,
    apps::{app, apply_app, condition, start_controller, wait_deployed, wait_ready},
    eventually, flux,
};
use k8s_openapi::api::{
    apps::v1::Deployment,
    authorization::v1::SubjectAccessReview,
    core::v1::{ConfigMap, Event, Namespace, Secret, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding},
};
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
};
use serde_json::json;

const FLUX_TIMEOUT: Duration = Duration::from_secs(120);

/// The app's Ready message, and the same condition on its HelmRelease (relayed verbatim).
async fn ready_message_matches_flux(ctx: &TestContext, app: &ApplicationInstance) -> anyhow::Result<String> {
    let name = app.name_any();
    let (_, reason, message) = condition(app, "Ready").unwrap_or_default();
    let hr = e2e::get_json(&flux::helm_releases(ctx), &name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("HelmRelease {name} missing"))?;
    let (_, hr_reason, hr_message) = e2e::condition(&hr, "Ready").unwrap_or_default();
    assert_eq!(
        (reason.as_str(), message.as_str()),
        (hr_reason.as_str(), hr_message.as_str())
    );
    Ok(message)
}

/// An ordinary app installs under the lockdown, as the release ServiceAccount the controller
/// created and bound in its namespace (which now enforces Pod Security); a chart that ships a
/// ClusterRoleBinding of cluster-admin fails with Flux's `InstallFailed` and the API server's
/// refusal in the message, and no ClusterRoleBinding exists afterwards.
#[tokio::test]
async fn a_chart_cannot_bind_cluster_admin_and_an_ordinary_app_still_installs() -> anyhow::Result<()> {
    let ctx = TestContext::new("tf-escalate").await?;
    let _controller = start_controller(&ctx, &[]).await?;

    apply_app(&ctx, &app("ordinary", "demo-app", "0.1.0", json!({}))).await?;
    wait_deployed(&ctx, "ordinary", "InstallSucceeded", "0.1.0").await?;
    let hr = e2e::get_json(&flux::helm_releases(&ctx), "ordinary")
        .await?
        .unwrap_or_default();
    assert_eq!(hr["spec"]["serviceAccountName"], RELEASE_SERVICE_ACCOUNT);
    let sa = ctx.api::<ServiceAccount>().get(RELEASE_SERVICE_ACCOUNT).await?;
    assert_eq!(sa.automount_service_account_token, Some(false));
    let rb = ctx.api::<RoleBinding>().get(RELEASE_ROLE).await?;
    assert_eq!(
        (rb.role_ref.kind.as_str(), rb.role_ref.name.as_str()),
        ("ClusterRole", RELEASE_ROLE)
    );
    let ns = Api::<Namespace>::all(ctx.client.clone()).get(&ctx.namespace).await?;
    let labels = ns.labels();
    assert_eq!(
        labels.get("pod-security.kubernetes.io/enforce").map(String::as_str),
        Some("baseline")
    );
    assert_eq!(
        labels.get("pod-security.kubernetes.io/warn").map(String::as_str),
        Some("restricted")
    );

    apply_app(&ctx, &app("escalate", "escalate-app", "1.0.0", json!({}))).await?;
    let failed = wait_ready(&ctx, "escalate", "False", "InstallFailed").await?;
    let message = ready_message_matches_flux(&ctx, &failed).await?;
    let who = format!("system:serviceaccount:{}:{RELEASE_SERVICE_ACCOUNT}", ctx.namespace);
    assert!(
        message.contains("clusterrolebindings") && message.contains("forbidden") && message.contains(&who),
        "Ready message: {message}"
    );
    let crb = format!("{}-escalate-escalate", ctx.namespace);
    assert!(
        Api::<ClusterRoleBinding>::all(ctx.client.clone())
            .get_opt(&crb)
            .await?
            .is_none(),
        "ClusterRoleBinding {crb} must not exist"
    );
    Ok(())
}

/// Helm `lookup` runs with the release's rights: the same chart copies a Secret of its own
/// namespace (proving the chart and `lookup` work), but reading another namespace's Secret
/// is refused, the install fails, and the value appears in no object, status or Event.
#[tokio::test]
async fn lookup_cannot_read_another_namespaces_secret() -> anyhow::Result<()> {
    let ctx = TestContext::new("tf-lookup").await?;
    let victim = TestContext::new("tf-victim").await?;
    let stolen = "victim-token-must-not-leak";
    let own = "own-token-may-be-read";
    let secret = |value: &str| -> anyhow::Result<Secret> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "api-token"},
            "stringData": {"token": value}
        }))?)
    };
    victim.apply(&secret(stolen)?).await?;
    ctx.apply(&secret(own)?).await?;
    let _controller = start_controller(&ctx, &[]).await?;

    let values = |ns: &str| json!({"victim": {"namespace": ns, "name": "api-token"}});
    apply_app(&ctx, &app("control", "lookup-app", "1.0.0", values(&ctx.namespace))).await?;
    wait_deployed(&ctx, "control", "InstallSucceeded", "1.0.0").await?;
    let loot = ctx.api::<ConfigMap>().get("control-loot").await?;
    assert_eq!(
        loot.data.unwrap_or_default().get("loot").map(String::as_str),
        Some(own),
        "lookup works inside the release's own namespace"
    );

    apply_app(&ctx, &app("thief", "lookup-app", "1.0.0", values(&victim.namespace))).await?;
    let failed = wait_ready(&ctx, "thief", "False", "InstallFailed").await?;
    let message = ready_message_matches_flux(&ctx, &failed).await?;
    assert!(
        message.contains("forbidden") && message.contains("secrets"),
        "Ready message: {message}"
    );
    assert!(ctx.api::<ConfigMap>().get_opt("thief-loot").await?.is_none());
    let config_maps = serde_json::to_string(&ctx.api::<ConfigMap>().list(&ListParams::default()).await?.items)?;
    let events = serde_json::to_string(&ctx.api::<Event>().list(&ListParams::default()).await?.items)?;
    let status = serde_json::to_string(&failed.status)?;
    for (what, text) in [
        ("a ConfigMap", &config_maps),
        ("an Event", &events),
        ("the status", &status),
    ] {
        assert!(!text.contains(stolen), "{what} contains the victim's Secret");
    }
    Ok(())
}

/// A HelmRelease created directly, without `serviceAccountName`, is applied as
/// `vworkspace-no-rights` (helm-controller's default), which nothing binds: it gets no rights.
#[tokio::test]
async fn a_helm_release_without_service_account_gets_no_rights() -> anyhow::Result<()> {
    let ctx = TestContext::new("tf-direct").await?;
    ctx.apply_yaml(&serde_saphyr::to_string(&flux::local_helm_repository("local"))?)
        .await?;
    let mut hr = flux::helm_release("direct", "local", "demo-app", "0.1.0", json!({}));
    if let Some(spec) = hr["spec"].as_object_mut() {
        spec.remove("serviceAccountName");
    }
    let hr: kube::api::DynamicObject = serde_json::from_value(hr)?;
    flux::helm_releases(&ctx).create(&PostParams::default(), &hr).await?;
    // Flux keeps retrying (Reconciling stays True), so wait for the refusal itself.
    let who = format!("system:serviceaccount:{}:vworkspace-no-rights", ctx.namespace);
    let api = flux::helm_releases(&ctx);
    eventually(&ctx, "HelmRelease direct refused", FLUX_TIMEOUT, || async {
        let hr = e2e::get_json(&api, "direct").await?.unwrap_or_default();
        Ok(match e2e::condition(&hr, "Ready") {
            Some((status, _, message))
                if status == "False" && message.contains(&who) && message.contains("forbidden") =>
            {
                Ok(())
            }
            other => Err(format!("Ready {other:?}")),
        })
    })
    .await?;
    assert!(
        ctx.api::<Deployment>().get_opt("direct").await?.is_none(),
        "nothing of the chart was applied"
    );
    Ok(())
}

/// A target namespace allowed by a pair but missing: the release identity cannot be bound
/// there, so the app is `TenantSetupFailed`, nothing is materialised, and no namespace is
/// created by the controller's server-side apply.
#[tokio::test]
async fn a_missing_target_namespace_is_tenant_setup_failed_and_nothing_is_created() -> anyhow::Result<()> {
    let ctx = TestContext::new("tf-missing").await?;
    let missing = format!("{}-gone", ctx.namespace);
    let allowed = format!("{},{missing}", ctx.namespace);
    let pair = format!("{}={missing}", ctx.namespace);
    let _controller = start_controller(
        &ctx,
        &["--allowed-namespaces", &allowed, "--allowed-namespace-pairs", &pair],
    )
    .await?;
    let mut elsewhere = app("elsewhere", "demo-app", "0.1.0", json!({}));
    elsewhere.spec.target_namespace = Some(missing.clone());
    apply_app(&ctx, &elsewhere).await?;
    let failed = wait_ready(&ctx, "elsewhere", "False", "TenantSetupFailed").await?;
    let (_, _, message) = condition(&failed, "Ready").unwrap_or_default();
    assert!(
        message.contains(&format!("namespace {missing} does not exist")),
        "Ready message: {message}"
    );
    assert!(flux::helm_releases(&ctx).get_opt("elsewhere").await?.is_none());
    assert!(
        Api::<Namespace>::all(ctx.client.clone())
            .get_opt(&missing)
            .await?
            .is_none()
    );
    Ok(())
}

/// A ClusterRole shaped like a standard Flux install's `flux-edit` (flux2's manifests: every
/// Flux API group, labelled to aggregate into the built-in `admin` and `edit`), cluster-wide
/// and uniquely named; deleted on drop, also when the test panics.
struct FluxEditRole {
    name: String,
}

impl FluxEditRole {
    async fn apply(ctx: &TestContext) -> anyhow::Result<Self> {
        let role = Self {
            name: format!("e2e-flux-edit-{}", ctx.namespace),
        };
        let groups = [
            "source.toolkit.fluxcd.io",
            "kustomize.toolkit.fluxcd.io",
            "helm.toolkit.fluxcd.io",
            "notification.toolkit.fluxcd.io",
            "image.toolkit.fluxcd.io",
        ];
        let doc = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": role.name, "labels": {
                "rbac.authorization.k8s.io/aggregate-to-admin": "true",
                "rbac.authorization.k8s.io/aggregate-to-edit": "true",
            }},
            "rules": [{"apiGroups": groups, "resources": ["*"],
                "verbs": ["create", "delete", "deletecollection", "patch", "update"]}],
        });
        e2e::deploy::apply(&e2e::deploy::to_yaml(&[&doc])?, false).await?;
        Ok(role)
    }
}

impl Drop for FluxEditRole {
    fn drop(&mut self) {
        let name = self.name.clone();
        if let Err(e) = e2e::bundle::block_on_own_thread(async move {
            e2e::deploy::kubectl(&["delete", "clusterrole", &name, "--ignore-not-found"], None)
                .await
                .map(drop)
        }) {
            eprintln!("deleting the flux-edit ClusterRole: {e:#}");
        }
    }
}

/// Whether `user` (with `groups`) may `verb` `group/resource` in `namespace`, as the API
/// server's authorizer answers a SubjectAccessReview.
async fn allowed(
    ctx: &TestContext,
    (user, groups): (&str, &[String]),
    verb: &str,
    (group, resource): (&str, &str),
    namespace: &str,
) -> anyhow::Result<bool> {
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {"user": user, "groups": groups, "resourceAttributes": {
            "namespace": namespace, "verb": verb, "group": group, "resource": resource,
        }},
    }))?;
    let answer = Api::<SubjectAccessReview>::all(ctx.client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// On a cluster that runs a standard Flux (the app-only install beside an existing Flux), its
/// `flux-edit` ClusterRole aggregates into the built-in `admin`. The release ServiceAccount a
/// chart is applied as must not follow it: a chart that writes a Kustomization without a
/// ServiceAccount is applied by kustomize-controller as cluster-admin, and a HelmRelease or
/// HelmRepository written directly skips the ApplicationInstance's admission policy and
/// repository rules. Written as the attack: with flux-edit present (and aggregated into
/// `admin`, so the precondition is real), the release ServiceAccount's HelmRelease and
/// HelmRepository are refused by the API server and nothing is created, and a review of each
/// Flux kind answers no; what a chart needs in its namespace is still allowed, and nothing
/// that lets it act as another identity.
#[tokio::test]
async fn a_standard_flux_edit_role_does_not_reach_the_release_service_account() -> anyhow::Result<()> {
    let ctx = TestContext::new("tf-flux-edit").await?;
    let ns = ctx.namespace.clone();
    // The release identity exactly as the app controller sets it up in a tenant namespace.
    ctx.apply_yaml(&format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {RELEASE_SERVICE_ACCOUNT}}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {RELEASE_ROLE}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {RELEASE_ROLE}}}\n\
         subjects: [{{kind: ServiceAccount, name: {RELEASE_SERVICE_ACCOUNT}, namespace: {ns}}}]\n"
    ))
    .await?;
    let _flux_edit = FluxEditRole::apply(&ctx).await?;
    eventually(
        &ctx,
        "flux-edit aggregated into the built-in admin ClusterRole",
        Duration::from_secs(60),
        || async {
            let admin = Api::<ClusterRole>::all(ctx.client.clone()).get("admin").await?;
            let has_flux = admin.rules.unwrap_or_default().iter().any(|r| {
                r.api_groups
                    .iter()
                    .flatten()
                    .any(|g| g == "kustomize.toolkit.fluxcd.io")
            });
            Ok(if has_flux { Ok(()) } else { Err("not yet".to_owned()) })
        },
    )
    .await?;

    let user = e2e::deploy::service_account_user(&ns, RELEASE_SERVICE_ACCOUNT);
    let groups = vec![
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{ns}"),
        "system:authenticated".to_owned(),
    ];
    let release = (user.as_str(), groups.as_slice());
    let mut wrong = Vec::new();
    for (verb, target, expected) in [
        ("create", ("kustomize.toolkit.fluxcd.io", "kustomizations"), false),
        ("create", ("source.toolkit.fluxcd.io", "gitrepositories"), false),
        ("create", ("source.toolkit.fluxcd.io", "helmrepositories"), false),
        ("create", ("helm.toolkit.fluxcd.io", "helmreleases"), false),
        ("create", ("", "serviceaccounts/token"), false),
        ("impersonate", ("", "serviceaccounts"), false),
        ("create", ("", "pods/exec"), false),
        ("create", ("apps", "deployments"), true),
        ("create", ("", "secrets"), true),
        ("create", ("rbac.authorization.k8s.io", "rolebindings"), true),
        ("create", ("batch", "jobs"), true),
    ] {
        if allowed(&ctx, release, verb, target, &ns).await? != expected {
            wrong.push(format!("{verb} {}/{}: expected allowed={expected}", target.0, target.1));
        }
    }
    assert!(wrong.is_empty(), "the release ServiceAccount's rights: {wrong:?}");

    // The attack itself, as the release ServiceAccount (what helm-controller impersonates).
    let chart = e2e::deploy::client_from(&e2e::deploy::impersonating_kubeconfig(
        &ns,
        RELEASE_SERVICE_ACCOUNT,
        &format!("{ns}-release"),
    )?)
    .await?;
    let repository = json!({
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmRepository",
        "metadata": {"name": "planted"}, "spec": {"url": e2e::CHART_REPO, "interval": "1m"},
    });
    let release_doc = json!({
        "apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
        "metadata": {"name": "planted"},
        "spec": {"interval": "1m", "chart": {"spec": {"chart": "escalate-app", "version": "0.1.0",
            "sourceRef": {"kind": "HelmRepository", "name": "planted"}}}},
    });
    for (doc, plural) in [(&repository, "helmrepositories"), (&release_doc, "helmreleases")] {
        let (group, version) = doc["apiVersion"]
            .as_str()
            .and_then(|v| v.split_once('/'))
            .unwrap_or_default();
        let kind = doc["kind"].as_str().unwrap_or_default();
        let as_chart = e2e::dynamic_api(&chart, &ns, group, version, kind, plural);
        let object: kube::api::DynamicObject = serde_json::from_value(doc.clone())?;
        let result = as_chart.create(&PostParams::default(), &object).await;
        assert!(
            e2e::deploy::is_forbidden(&result),
            "{kind} written as the release ServiceAccount: {result:?}"
        );
        let as_admin = e2e::dynamic_api(&ctx.client, &ns, group, version, kind, plural);
        assert!(as_admin.get_opt("planted").await?.is_none(), "a {kind} was created");
    }
    Ok(())
}
