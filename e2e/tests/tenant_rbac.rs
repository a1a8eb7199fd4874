//! A stolen controller token reaches no further than the code needs, written as the
//! attack on the real API server: the upgrade engine's ServiceAccount (its ClusterRole
//! may write ConfigMaps everywhere, because revision histories live in every tenant
//! namespace) tries to rewrite `kube-system` and to take over a tenant's ConfigMap; the
//! bundle's admission policy (deploy/components/upgrade-engine/configmap-policy.yaml)
//! refuses both and lets the revision history through.

use std::time::Duration;

use e2e::{
    TestContext,
    deploy::{client_from, ensure_bundle_rbac, impersonating_kubeconfig, is_forbidden},
    eventually,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

fn config_map(name: &str, component: Option<&str>) -> anyhow::Result<ConfigMap> {
    let mut labels = serde_json::Map::new();
    if let Some(c) = component {
        labels.insert("app.kubernetes.io/component".into(), c.into());
    }
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "data": {"planted": "by the attacker"},
    }))?)
}

fn denial(result: &Result<ConfigMap, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message.clone(),
        other => format!("{other:?}"),
    }
}

#[tokio::test]
async fn the_upgrade_engine_token_writes_revision_histories_only() -> anyhow::Result<()> {
    let ctx = TestContext::new("rbac-upgrade-cm").await?;
    ensure_bundle_rbac().await?;
    let stolen = client_from(&impersonating_kubeconfig(
        "vworkspace-system",
        "upgrade-engine",
        "upgrade-engine-stolen",
    )?)
    .await?;
    let post = PostParams::default();

    // kube-system: RBAC would allow it; the policy does not. A policy just applied takes
    // a moment to be enforced: until then, undo what got through and try again.
    let system: Api<ConfigMap> = Api::namespaced(stolen.clone(), "kube-system");
    let admin_system: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), "kube-system");
    let planted = eventually(
        &ctx,
        "the upgrade-engine policy is enforced",
        Duration::from_secs(30),
        || async {
            let planted = system.create(&post, &config_map("vws-planted", None)?).await;
            if planted.is_ok() {
                admin_system.delete("vws-planted", &Default::default()).await?;
                return Ok(Err("created: the policy is not enforced yet".to_owned()));
            }
            Ok(Ok(planted))
        },
    )
    .await?;
    assert!(is_forbidden(&planted), "{planted:?}");
    assert!(
        denial(&planted).contains("system namespace kube-system"),
        "{}",
        denial(&planted)
    );
    let as_history = system
        .create(&post, &config_map("vws-planted-revisions", Some("revision-history"))?)
        .await;
    assert!(is_forbidden(&as_history), "even labelled as a history: {as_history:?}");
    assert!(admin_system.get_opt("vws-planted").await?.is_none());
    assert!(admin_system.get_opt("vws-planted-revisions").await?.is_none());

    // A tenant's own ConfigMap: neither rewritten nor taken over by labelling it.
    let admin_tenant: Api<ConfigMap> = ctx.api();
    admin_tenant.create(&post, &config_map("app-settings", None)?).await?;
    let tenant: Api<ConfigMap> = Api::namespaced(stolen.clone(), &ctx.namespace);
    let relabel = json!({"metadata": {"labels": {"app.kubernetes.io/component": "revision-history"}}});
    let takeover = tenant
        .patch("app-settings", &PatchParams::default(), &Patch::Merge(&relabel))
        .await;
    assert!(is_forbidden(&takeover), "{takeover:?}");
    assert!(
        denial(&takeover).contains("only revision-history ConfigMaps"),
        "{}",
        denial(&takeover)
    );
    let other = tenant.create(&post, &config_map("other", None)?).await;
    assert!(is_forbidden(&other), "{other:?}");
    let kept = admin_tenant.get("app-settings").await?;
    assert!(kept.metadata.labels.unwrap_or_default().is_empty(), "labels unchanged");

    // What the engine really writes still passes.
    let history = tenant
        .create(&post, &config_map("wiki-revisions", Some("revision-history"))?)
        .await?;
    assert_eq!(history.metadata.name.as_deref(), Some("wiki-revisions"));
    Ok(())
}
