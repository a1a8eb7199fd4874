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
    core::v1::{ConfigMap, Event, Namespace, Secret, ServiceAccount},
    rbac::v1::{ClusterRoleBinding, RoleBinding},
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
