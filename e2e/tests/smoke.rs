//! Smoke tests proving the local stack is real: the API server, the controller
//! manager, the scheduler, kwok and Flux all take part.

use std::time::Duration;

use e2e::{
    TestContext, condition,
    flux::{self, helm_release, local_helm_repository, wait_helm_release_failed, wait_helm_release_ready},
};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};

const INSTALL_TIMEOUT: Duration = Duration::from_secs(120);

/// A HelmRelease applied directly is installed by helm-controller and becomes
/// Ready, its Deployment Available through kube-controller-manager + kwok.
#[tokio::test]
async fn helm_release_applied_directly_becomes_ready() -> anyhow::Result<()> {
    let ctx = TestContext::new("smoke-hr").await?;
    flux::grant_release(&ctx.client, &ctx.namespace).await?;
    ctx.apply_yaml(&serde_saphyr::to_string(&local_helm_repository("local"))?)
        .await?;
    let values = serde_json::json!({"greeting": "hello from e2e"});
    ctx.apply_yaml(&serde_saphyr::to_string(&helm_release(
        "demo", "local", "demo-app", "0.1.0", values,
    ))?)
    .await?;

    let hr = wait_helm_release_ready(&ctx, "demo", INSTALL_TIMEOUT).await?;
    assert_eq!(
        condition(&hr, "Released").map(|c| c.1),
        Some("InstallSucceeded".to_string())
    );

    let release = "demo"; // no targetNamespace: Helm release named after the HelmRelease
    let cm = ctx.api::<ConfigMap>().get(&format!("{release}-config")).await?;
    assert_eq!(
        cm.data.unwrap_or_default().get("greeting").map(String::as_str),
        Some("hello from e2e")
    );

    let deploy = ctx.api::<Deployment>().get(release).await?;
    let available = deploy
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .any(|c| c.type_ == "Available" && c.status == "True");
    assert!(
        available,
        "Deployment {release} should be Available (KCM + scheduler + kwok)"
    );
    Ok(())
}

/// A chart version whose manifests the API server rejects makes the upgrade
/// fail with Flux's own reason.
#[tokio::test]
async fn broken_chart_version_reports_real_flux_reason() -> anyhow::Result<()> {
    let ctx = TestContext::new("smoke-broken").await?;
    flux::grant_release(&ctx.client, &ctx.namespace).await?;
    ctx.apply_yaml(&serde_saphyr::to_string(&local_helm_repository("local"))?)
        .await?;
    let hr = helm_release("broken", "local", "broken-app", "1.0.0", serde_json::json!({}));
    ctx.apply_yaml(&serde_saphyr::to_string(&hr)?).await?;
    wait_helm_release_ready(&ctx, "broken", INSTALL_TIMEOUT).await?;

    let hr = helm_release("broken", "local", "broken-app", "2.0.0", serde_json::json!({}));
    ctx.apply_yaml(&serde_saphyr::to_string(&hr)?).await?;
    let hr = wait_helm_release_failed(&ctx, "broken", INSTALL_TIMEOUT).await?;
    let (_, reason, message) = condition(&hr, "Ready").expect("Ready condition");
    assert_eq!(reason, "UpgradeFailed", "Ready message: {message}");
    let released = condition(&hr, "Released").expect("Released condition");
    assert_eq!((released.0.as_str(), released.1.as_str()), ("False", "UpgradeFailed"));

    // The previous release keeps running.
    let deploy = ctx.api::<Deployment>().get("broken").await?;
    assert!(deploy.status.and_then(|s| s.available_replicas).unwrap_or(0) >= 1);
    Ok(())
}
