//! Chart sources as SSRF (issue 14, item 6), written as the attack: a tenant who may write
//! ApplicationInstances points `spec.chart.repository.url` at the cloud metadata service, at
//! the cluster's API server Service, at a registry inside the cluster, at a plain-http host,
//! and at a host outside the cluster administrator's allow-list, with a `secretRef` whose
//! credentials Flux would send along. Each app is refused with `RepositoryNotAllowed`, a
//! message naming the rule, and no HelmRepository, OCIRepository or HelmRelease is created,
//! so source-controller never fetches the URL and the credentials go nowhere. The one
//! allowed source (the local chart server, named in `--insecure-repository-hosts`) installs.

use api::{ApplicationInstance, ChartRepository, LocalObjectReference};
use e2e::{
    CHART_REPO, TestContext,
    apps::{app, apply_app, condition, start_controller, wait_deployed, wait_ready},
    dynamic_api, flux,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, PostParams};

const REASON: &str = "RepositoryNotAllowed";

/// An app whose chart comes from `url`, with the tenant's repository credentials attached.
fn hostile(name: &str, url: &str) -> ApplicationInstance {
    let mut a = app(name, "demo-app", "0.1.0", serde_json::json!({}));
    a.spec.chart.repository = Some(ChartRepository {
        url: url.into(),
        secret_ref: Some(LocalObjectReference {
            name: "repo-credentials".into(),
        }),
        interval: Some("1m".into()),
        ..Default::default()
    });
    a
}

#[tokio::test]
async fn hostile_repository_urls_are_refused_and_nothing_is_materialised() -> anyhow::Result<()> {
    let ctx = TestContext::new("tenant-sources").await?;
    // The cluster administrator's rules: charts from *.example.com over TLS, and the local
    // chart server on 127.0.0.1, named (so its loopback address is allowed) and allowed over
    // plain http. Every other default stays: internal addresses refused.
    let _controller = start_controller(
        &ctx,
        &[
            "--allowed-repository-hosts",
            "*.example.com,127.0.0.1",
            "--insecure-repository-hosts",
            "127.0.0.1",
        ],
    )
    .await?;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "repo-credentials"},
        "stringData": {"username": "tenant", "password": "not-for-strangers"},
    }))?;
    ctx.api::<Secret>().create(&PostParams::default(), &secret).await?;

    // (app name, URL, a fragment of the message naming the rule)
    let attacks = [
        (
            "metadata",
            "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
            "169.254.169.254 is a link-local",
        ),
        (
            "apiserver",
            "http://kubernetes.default.svc/api/v1/secrets",
            "kubernetes.default.svc is a cluster-internal name",
        ),
        (
            "in-cluster-oci",
            "oci://registry.kube-system.svc.cluster.local/charts/demo-app",
            "is a cluster-internal name",
        ),
        (
            "plain-http",
            "http://charts.example.com/stable",
            "plain http:// to charts.example.com is refused",
        ),
        (
            "elsewhere",
            "https://charts.attacker.test/stable",
            "charts.attacker.test is not in the allowed repository hosts",
        ),
    ];
    for (name, url, _) in attacks {
        apply_app(&ctx, &hostile(name, url)).await?;
    }
    let mut allowed = hostile("allowed", CHART_REPO);
    if let Some(r) = allowed.spec.chart.repository.as_mut() {
        r.secret_ref = None;
    }
    apply_app(&ctx, &allowed).await?;

    for (name, url, rule) in attacks {
        let refused = wait_ready(&ctx, name, "False", REASON).await?;
        let (_, _, message) = condition(&refused, "Ready").unwrap_or_default();
        assert!(message.contains(rule), "{name} ({url}): {message}");
        assert_eq!(
            condition(&refused, "Stalled").map(|c| c.1),
            Some(REASON.to_owned()),
            "{name}: waits for a spec or flag change"
        );
    }
    // The allowed source really works, so the refusals are not a broken controller.
    wait_deployed(&ctx, "allowed", "InstallSucceeded", "0.1.0").await?;

    // Nothing was materialised for any refused app: no Flux source of any kind points at a
    // refused URL, and no HelmRelease exists for them.
    let oci = dynamic_api(
        &ctx.client,
        &ctx.namespace,
        "source.toolkit.fluxcd.io",
        "v1",
        "OCIRepository",
        "ocirepositories",
    );
    let mut urls = Vec::new();
    for api in [flux::helm_repositories(&ctx), oci] {
        for source in api.list(&ListParams::default()).await? {
            urls.push(source.data["spec"]["url"].as_str().unwrap_or_default().to_owned());
        }
    }
    assert!(
        urls.iter()
            .all(|u| u.trim_end_matches('/') == CHART_REPO.trim_end_matches('/')),
        "only the allowed repository is materialised: {urls:?}"
    );
    for (name, _, _) in attacks {
        assert!(
            flux::helm_releases(&ctx).get_opt(name).await?.is_none(),
            "{name}: no HelmRelease"
        );
    }

    // Without its rule, the same controller refuses the local chart server too: the
    // allowance above is what let it through, not a gap in the rules.
    let mut loopback = hostile("loopback-https", "https://127.0.0.2:18879");
    if let Some(r) = loopback.spec.chart.repository.as_mut() {
        r.secret_ref = None;
    }
    apply_app(&ctx, &loopback).await?;
    let refused = wait_ready(&ctx, "loopback-https", "False", REASON).await?;
    let (_, _, message) = condition(&refused, "Ready").unwrap_or_default();
    assert!(message.contains("127.0.0.2 is a loopback address"), "{message}");
    Ok(())
}
