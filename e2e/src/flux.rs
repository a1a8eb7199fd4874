//! Small helpers for Flux objects in tests (no Flux Rust types exist; JSON is enough).

use std::time::Duration;

use kube::api::{Api, DynamicObject};

use crate::{CHART_REPO, TestContext, condition, conditions_summary, dynamic_api, eventually, get_json};

/// HelmRelease API in the test namespace.
pub fn helm_releases(ctx: &TestContext) -> Api<DynamicObject> {
    dynamic_api(
        &ctx.client,
        &ctx.namespace,
        "helm.toolkit.fluxcd.io",
        "v2",
        "HelmRelease",
        "helmreleases",
    )
}

/// HelmRepository API in the test namespace.
pub fn helm_repositories(ctx: &TestContext) -> Api<DynamicObject> {
    dynamic_api(
        &ctx.client,
        &ctx.namespace,
        "source.toolkit.fluxcd.io",
        "v1",
        "HelmRepository",
        "helmrepositories",
    )
}

/// The name of the chart source the app controller manages for the ApplicationInstance
/// `app` of the test namespace: shared by every app of the namespace with the same
/// repository spec, so named after the spec, not after the app
/// (`helmengine::flux::build::source_reference`).
pub async fn managed_source_name(ctx: &TestContext, app: &str) -> anyhow::Result<String> {
    let app = ctx.api::<api::ApplicationInstance>().get(app).await?;
    Ok(helmengine::flux::build::source_reference(&app)?.name)
}

/// A HelmRepository for the local chart server.
pub fn local_helm_repository(name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "HelmRepository",
        "metadata": {"name": name},
        "spec": {"url": CHART_REPO, "interval": "1m"}
    })
}

/// The release ServiceAccount and its RoleBinding in `namespace`, as the app controller
/// applies them: what a HelmRelease created without the app controller needs under the
/// cluster's Flux lockdown (helm-controller `--default-service-account` names a
/// ServiceAccount with no rights; [`helm_release`] names this one).
pub fn release_identity(namespace: &str) -> [serde_json::Value; 2] {
    [
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": api::RELEASE_SERVICE_ACCOUNT, "namespace": namespace},
            "automountServiceAccountToken": false
        }),
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": api::RELEASE_ROLE, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": api::RELEASE_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": api::RELEASE_SERVICE_ACCOUNT, "namespace": namespace}]
        }),
    ]
}

/// Applies [`release_identity`] in `namespace`.
pub async fn grant_release(client: &kube::Client, namespace: &str) -> anyhow::Result<()> {
    for doc in release_identity(namespace) {
        crate::apply_dynamic(client, namespace, doc).await?;
    }
    Ok(())
}

/// A HelmRelease of `chart@version` from the HelmRepository `repo` in the same namespace,
/// applied as the release ServiceAccount (see [`grant_release`]).
pub fn helm_release(
    name: &str,
    repo: &str,
    chart: &str,
    version: &str,
    values: serde_json::Value,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "metadata": {"name": name},
        "spec": {
            "interval": "5m",
            "timeout": "1m",
            "chart": {"spec": {"chart": chart, "version": version, "interval": "1m",
                               "sourceRef": {"kind": "HelmRepository", "name": repo}}},
            "serviceAccountName": api::RELEASE_SERVICE_ACCOUNT,
            "values": values
        }
    })
}

/// True when the HelmRelease has observed its generation and reports `Ready=<status>`.
fn ready_is(hr: &serde_json::Value, status: &str) -> bool {
    let generation = hr.pointer("/metadata/generation").and_then(|g| g.as_i64());
    let ready_gen = hr
        .pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["observedGeneration"].as_i64());
    generation.is_some() && generation == ready_gen && condition(hr, "Ready").is_some_and(|(s, _, _)| s == status)
}

/// Waits until the HelmRelease is Ready=True for its current generation.
pub async fn wait_helm_release_ready(
    ctx: &TestContext,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    let api = helm_releases(ctx);
    eventually(ctx, &format!("HelmRelease {name} Ready=True"), timeout, || async {
        Ok(match get_json(&api, name).await? {
            Some(hr) if ready_is(&hr, "True") => Ok(hr),
            Some(hr) => Err(conditions_summary(&hr)),
            None => Err("not found".into()),
        })
    })
    .await
}

/// Waits until the HelmRelease is Ready=False for its current generation and not reconciling.
pub async fn wait_helm_release_failed(
    ctx: &TestContext,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    let api = helm_releases(ctx);
    eventually(ctx, &format!("HelmRelease {name} Ready=False"), timeout, || async {
        Ok(match get_json(&api, name).await? {
            Some(hr) if ready_is(&hr, "False") && condition(&hr, "Reconciling").is_none() => Ok(hr),
            Some(hr) => Err(conditions_summary(&hr)),
            None => Err("not found".into()),
        })
    })
    .await
}

/// Waits until the HelmRelease exists (whatever its status).
pub async fn wait_helm_release_exists(ctx: &TestContext, name: &str, timeout: Duration) -> anyhow::Result<()> {
    let api = helm_releases(ctx);
    eventually(ctx, &format!("HelmRelease {name} created"), timeout, || async {
        Ok(api
            .get_opt(name)
            .await?
            .map(|_| ())
            .ok_or_else(|| "no HelmRelease yet".to_string()))
    })
    .await
}
