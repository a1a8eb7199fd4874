//! The argocd engine end to end on REAL Argo CD (application-controller and repo-server built
//! from the argo-cd module, started on demand by `hack/cluster.sh start-argocd`), behind the
//! same Engine trait as Flux: the app controller runs with `--default-engine argocd`, as the
//! `argocd-engine` kustomize component deploys it, and the ApplicationInstances name no engine.
//! What Argo CD reports is relayed with its own words: where a test compares a message, it
//! compares ours with the Application's.

use api::{ApplicationInstance, EngineKind, ValuesReference, ValuesSourceKind};
use e2e::{
    TestContext,
    apps::{
        RELEASE_TIMEOUT, app, apply_app, condition, config_value, wait_app, wait_config, wait_deployed, wait_ready,
    },
    argocd::{self, app_projects, application, object_name, require_argocd, start_controller},
    eventually, flux,
};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Secret},
    rbac::v1::ClusterRoleBinding,
};
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};

fn text<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

#[tokio::test]
async fn installs_with_values_and_upgrades_by_version() -> anyhow::Result<()> {
    require_argocd().await?;
    let ctx = TestContext::new("argo-install").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let greeting = "grüß dich ✓ — ünïcødé";
    apply_app(&ctx, &app("wiki", "demo-app", "0.1.0", json!({"greeting": greeting}))).await?;

    let installed = wait_deployed(&ctx, "wiki", "Healthy", "0.1.0").await?;
    wait_config(&ctx, "wiki-config", "greeting", greeting).await?;
    let status = installed.status.clone().unwrap_or_default();
    assert_eq!(status.engine.as_deref(), Some("argocd"), "the cluster default engine");
    let engine_ref = status.engine_ref.clone().unwrap_or_default();
    assert_eq!(
        (
            engine_ref.kind.as_str(),
            engine_ref.namespace.as_deref(),
            engine_ref.name.as_str()
        ),
        (
            "Application",
            Some(argocd::ARGOCD_NAMESPACE),
            object_name(&ctx, "wiki").as_str()
        )
    );
    assert!(
        flux::helm_releases(&ctx).get_opt("wiki").await?.is_none(),
        "no HelmRelease: Argo CD runs this release"
    );

    let live = application(&ctx, "wiki")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no Application"))?;
    assert_eq!(text(&live, "/status/sync/status"), "Synced");
    assert_eq!(text(&live, "/status/health/status"), "Healthy");
    assert_eq!(text(&live, "/spec/project"), object_name(&ctx, "wiki"));
    assert_eq!(
        live.pointer("/spec/source/helm/valuesObject/greeting"),
        Some(&json!(greeting))
    );
    let project = app_projects(&ctx)
        .get(&object_name(&ctx, "wiki"))
        .await
        .map(|p| serde_json::to_value(p).unwrap_or_default())?;
    assert_eq!(
        project.pointer("/spec/destinations"),
        Some(&json!([{"server": "https://kubernetes.default.svc", "namespace": ctx.namespace}])),
        "one destination: the app's namespace"
    );
    assert_eq!(
        text(&project, "/spec/destinationServiceAccounts/0/defaultServiceAccount"),
        api::RELEASE_SERVICE_ACCOUNT,
        "every sync impersonates the namespace's release ServiceAccount"
    );

    // An upgrade by version.
    let mut upgraded = app("wiki", "demo-app", "0.2.0", json!({"greeting": greeting}));
    upgraded.spec.engine = None;
    apply_app(&ctx, &upgraded).await?;
    let upgraded = wait_deployed(&ctx, "wiki", "Healthy", "0.2.0").await?;
    wait_config(&ctx, "wiki-config", "chartVersion", "0.2.0").await?;
    let history: Vec<(String, String)> = upgraded
        .status
        .unwrap_or_default()
        .history
        .iter()
        .map(|r| (r.chart_version.clone(), r.status.clone()))
        .collect();
    assert_eq!(
        history,
        [
            ("0.2.0".to_owned(), "deployed".to_owned()),
            ("0.1.0".to_owned(), "superseded".to_owned())
        ],
        "Argo CD's sync history, newest first"
    );
    Ok(())
}

#[tokio::test]
async fn a_broken_upgrade_relays_argo_cds_failure_verbatim() -> anyhow::Result<()> {
    require_argocd().await?;
    let ctx = TestContext::new("argo-broken").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    apply_app(&ctx, &app("shop", "demo-app", "0.1.0", json!({}))).await?;
    wait_deployed(&ctx, "shop", "Healthy", "0.1.0").await?;

    apply_app(&ctx, &app("shop", "demo-app", "0.3.0", json!({}))).await?;
    let failed = wait_app(&ctx, "shop", "Ready=False", RELEASE_TIMEOUT, |a| {
        condition(a, "Ready").is_some_and(|(s, _, _)| s == "False")
    })
    .await?;
    let (_, reason, message) = condition(&failed, "Ready").unwrap_or_default();
    let live = application(&ctx, "shop").await?.unwrap_or_default();
    match reason.as_str() {
        "SyncFailed" => assert_eq!(message, text(&live, "/status/operationState/message")),
        other => {
            let conditions = live.pointer("/status/conditions").cloned().unwrap_or_default();
            let relayed = conditions
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == other && c["message"] == message.as_str());
            assert!(relayed, "reason {other} / {message:?} is not Argo CD's ({conditions})");
        }
    }
    assert!(
        message.contains("tls.key") || text(&live, "/status/operationState/syncResult").contains("tls.key") || {
            let results = live
                .pointer("/status/operationState/syncResult/resources")
                .cloned()
                .unwrap_or_default();
            results.to_string().contains("tls.key")
        },
        "Argo CD names the API server's refusal: {message:?}"
    );
    assert_eq!(
        failed.status.unwrap_or_default().deployed_chart_version.as_deref(),
        Some("0.1.0"),
        "the last good release stays the deployed one"
    );
    Ok(())
}

#[tokio::test]
async fn suspend_holds_the_release_and_resume_applies_what_changed() -> anyhow::Result<()> {
    require_argocd().await?;
    let ctx = TestContext::new("argo-suspend").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    apply_app(&ctx, &app("blog", "demo-app", "0.1.0", json!({"greeting": "one"}))).await?;
    wait_deployed(&ctx, "blog", "Healthy", "0.1.0").await?;

    let mut suspended = app("blog", "demo-app", "0.1.0", json!({"greeting": "two"}));
    suspended.spec.suspend = true;
    apply_app(&ctx, &suspended).await?;
    wait_app(&ctx, "blog", "Ready reason Suspended", RELEASE_TIMEOUT, |a| {
        condition(a, "Ready").is_some_and(|(_, r, _)| r == "Suspended")
    })
    .await?;
    let live = application(&ctx, "blog").await?.unwrap_or_default();
    assert!(
        live.pointer("/spec/syncPolicy/automated").is_none(),
        "suspended: automated sync off"
    );
    // Argo CD has compared the new values with the cluster and holds them: OutOfSync, with
    // automated sync off (no waiting out a sync that might come).
    eventually(&ctx, "Argo CD reports blog OutOfSync", RELEASE_TIMEOUT, || async {
        let live = application(&ctx, "blog").await?.unwrap_or_default();
        Ok(match text(&live, "/status/sync/status") {
            "OutOfSync" => Ok(()),
            other => Err(format!("sync status {other:?}")),
        })
    })
    .await?;
    assert_eq!(
        config_value(&ctx, "blog-config", "greeting").await?.as_deref(),
        Some("one"),
        "nothing applied while suspended"
    );

    apply_app(&ctx, &app("blog", "demo-app", "0.1.0", json!({"greeting": "two"}))).await?;
    wait_config(&ctx, "blog-config", "greeting", "two").await?;
    wait_ready(&ctx, "blog", "True", "Healthy").await?;
    Ok(())
}

#[tokio::test]
async fn deleting_removes_the_release_the_application_and_its_project() -> anyhow::Result<()> {
    require_argocd().await?;
    let ctx = TestContext::new("argo-delete").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    apply_app(&ctx, &app("temp", "demo-app", "0.1.0", json!({}))).await?;
    wait_deployed(&ctx, "temp", "Healthy", "0.1.0").await?;
    assert!(ctx.api::<Deployment>().get_opt("temp").await?.is_some());

    ctx.api::<ApplicationInstance>()
        .delete("temp", &DeleteParams::default())
        .await?;
    let name = object_name(&ctx, "temp");
    eventually(
        &ctx,
        "ApplicationInstance, Application, AppProject and the release's objects gone",
        RELEASE_TIMEOUT,
        || async {
            let app = ctx.api::<ApplicationInstance>().get_opt("temp").await?.is_some();
            let application = argocd::applications(&ctx).get_opt(&name).await?.is_some();
            let project = app_projects(&ctx).get_opt(&name).await?.is_some();
            let deployment = ctx.api::<Deployment>().get_opt("temp").await?.is_some();
            let config = ctx.api::<ConfigMap>().get_opt("temp-config").await?.is_some();
            Ok(if !(app || application || project || deployment || config) {
                Ok(())
            } else {
                Err(format!(
                    "app {app} application {application} project {project} deployment {deployment} config {config}"
                ))
            })
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn values_from_a_secret_is_refused_and_its_data_goes_nowhere() -> anyhow::Result<()> {
    require_argocd().await?;
    let ctx = TestContext::new("argo-values").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let secret_value = "s3cr3t-Ä-never-copied";
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": ctx.namespace},
        "stringData": {"values.yaml": format!("password: {secret_value}\n")},
    }))?;
    ctx.api::<Secret>().create(&Default::default(), &secret).await?;
    let mut wiki = app("wiki", "demo-app", "0.1.0", json!({}));
    wiki.spec.values_from = vec![ValuesReference {
        kind: ValuesSourceKind::Secret,
        name: "db".into(),
        values_key: None,
        target_path: None,
        optional: false,
    }];
    apply_app(&ctx, &wiki).await?;
    let refused = wait_ready(&ctx, "wiki", "False", "InvalidSpec").await?;
    let (_, _, message) = condition(&refused, "Ready").unwrap_or_default();
    assert!(
        message.contains("valuesFrom is not supported by the argocd engine"),
        "{message}"
    );
    assert!(
        condition(&refused, "Stalled").is_some_and(|(s, _, _)| s == "True"),
        "retrying cannot help"
    );
    assert!(application(&ctx, "wiki").await?.is_none(), "nothing written to Argo CD");

    // The same spec under Flux, named per ApplicationInstance, works: the engine choice is
    // per application.
    wiki.spec.engine = Some(EngineKind::Flux);
    apply_app(&ctx, &wiki).await?;
    wait_ready(&ctx, "wiki", "True", "InstallSucceeded").await?;
    let all = argocd::applications(&ctx).list(&Default::default()).await?;
    assert!(
        !serde_json::to_string(&all)?.contains(secret_value),
        "no Application holds the Secret's data"
    );
    Ok(())
}

#[tokio::test]
async fn a_chart_that_escalates_is_stopped_by_the_project_and_impersonation() -> anyhow::Result<()> {
    require_argocd().await?;
    let ctx = TestContext::new("argo-escalate").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    apply_app(&ctx, &app("escape", "escalate-app", "1.0.0", json!({}))).await?;
    let refused = wait_app(&ctx, "escape", "Ready=False", RELEASE_TIMEOUT, |a| {
        condition(a, "Ready").is_some_and(|(s, _, _)| s == "False")
    })
    .await?;
    let binding = format!("{}-escape-escalate", ctx.namespace);
    let bindings: Api<ClusterRoleBinding> = Api::all(ctx.client.clone());
    assert!(
        bindings.get_opt(&binding).await?.is_none(),
        "no cluster-admin binding: {:?}",
        condition(&refused, "Ready")
    );
    // The failure is the refusal of that binding, not any other (a chart that cannot be
    // fetched fails too): Argo CD's sync result refuses the ClusterRoleBinding (the AppProject
    // permits no cluster-scoped kind), and our Ready relays that refusal in Argo CD's words
    // (as `SyncFailed` from the operation, or as Argo CD's `SyncError` condition).
    let refusal = eventually(
        &ctx,
        "Argo CD refuses the ClusterRoleBinding, and Ready relays its words",
        RELEASE_TIMEOUT,
        || async {
            let ours = ctx.api::<ApplicationInstance>().get("escape").await?;
            let ready = condition(&ours, "Ready");
            let theirs = application(&ctx, "escape").await?.unwrap_or_default();
            let refused_binding = theirs
                .pointer("/status/operationState/syncResult/resources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|r| text(r, "/kind") == "ClusterRoleBinding" && text(r, "/status") != "Synced")
                .map(|r| text(r, "/message").to_owned());
            Ok(match (ready, refused_binding) {
                (Some((status, reason, message)), Some(why))
                    if status == "False"
                        && ["SyncFailed", "SyncError"].contains(&reason.as_str())
                        && !why.is_empty()
                        && message.contains(&why) =>
                {
                    Ok(why)
                }
                other => Err(format!("(Ready, refused ClusterRoleBinding): {other:?}")),
            })
        },
    )
    .await?;
    assert!(
        refusal.contains("ClusterRoleBinding is not permitted in project"),
        "the AppProject's refusal: {refusal}"
    );
    Ok(())
}
