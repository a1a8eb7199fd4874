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
    // Argo CD's namespace (its argocd-cm and argocd-rbac-cm decide what every Argo CD user may
    // do), even as a revision history; it exists only once Argo CD was started.
    e2e::deploy::ensure_namespace("argocd").await?;
    let argocd: Api<ConfigMap> = Api::namespaced(stolen.clone(), "argocd");
    let admin_argocd: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), "argocd");
    let planted = "argocd-cm-planted-revisions";
    // The policy may have just changed (applied above by this process): as for kube-system,
    // undo what got through until it is enforced.
    let in_argocd = eventually(
        &ctx,
        "the upgrade-engine policy refuses argocd",
        Duration::from_secs(30),
        || async {
            let created = argocd
                .create(&post, &config_map(planted, Some("revision-history"))?)
                .await;
            if created.is_ok() {
                admin_argocd.delete(planted, &Default::default()).await?;
                return Ok(Err("created: the policy is not enforced yet".to_owned()));
            }
            Ok(Ok(created))
        },
    )
    .await?;
    assert!(admin_argocd.get_opt(planted).await?.is_none());
    assert!(is_forbidden(&in_argocd), "{in_argocd:?}");
    assert!(
        denial(&in_argocd).contains("system namespace argocd"),
        "{}",
        denial(&in_argocd)
    );

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

#[tokio::test]
async fn the_restore_engine_token_creates_and_deletes_scratch_namespaces_only() -> anyhow::Result<()> {
    use k8s_openapi::api::{batch::v1::Job, core::v1::Namespace};
    let ctx = TestContext::new("rbac-restore-ns").await?;
    ensure_bundle_rbac().await?;
    let stolen = client_from(&impersonating_kubeconfig(
        "vworkspace-system",
        "restore-engine",
        "restore-engine-stolen",
    )?)
    .await?;
    let post = PostParams::default();
    let namespaces: Api<Namespace> = Api::all(stolen.clone());
    let admin_namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let namespace = |name: &str, scratch: bool| -> anyhow::Result<Namespace> {
        let labels = if scratch {
            json!({"vworkspace.io/scratch": "restore-verification"})
        } else {
            json!({})
        };
        Ok(serde_json::from_value(
            json!({"metadata": {"name": name, "labels": labels}}),
        )?)
    };

    // Any other namespace: RBAC would allow it; the policy does not.
    let planted = eventually(
        &ctx,
        "the restore-engine policy is enforced",
        Duration::from_secs(30),
        || async {
            let planted = namespaces.create(&post, &namespace("vws-planted-ns", false)?).await;
            if planted.is_ok() {
                admin_namespaces.delete("vws-planted-ns", &Default::default()).await?;
                return Ok(Err("created: the policy is not enforced yet".to_owned()));
            }
            Ok(Ok(planted))
        },
    )
    .await?;
    assert!(is_forbidden(&planted), "{planted:?}");
    let named_like_scratch = namespaces.create(&post, &namespace("vws-verify-planted", false)?).await;
    assert!(is_forbidden(&named_like_scratch), "unlabelled: {named_like_scratch:?}");
    let labelled_elsewhere = namespaces.create(&post, &namespace("team-z-planted", true)?).await;
    assert!(is_forbidden(&labelled_elsewhere), "misnamed: {labelled_elsewhere:?}");

    // A tenant's namespace can be neither deleted nor given a Job.
    let deleted = namespaces.delete(&ctx.namespace, &Default::default()).await;
    assert!(
        matches!(&deleted, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("only scratch namespaces")),
        "{deleted:?}"
    );
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "planted"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}},
    }))?;
    let planted_job = Api::<Job>::namespaced(stolen.clone(), &ctx.namespace)
        .create(&post, &job)
        .await;
    assert!(
        matches!(&planted_job, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("only in scratch namespaces")),
        "{planted_job:?}"
    );

    // What the engine really does still passes: a scratch namespace, created and deleted.
    let scratch = format!("vws-verify-{}", ctx.namespace);
    let created = namespaces.create(&post, &namespace(&scratch, true)?).await?;
    assert_eq!(created.metadata.name.as_deref(), Some(scratch.as_str()));
    namespaces.delete(&scratch, &Default::default()).await?;
    Ok(())
}
