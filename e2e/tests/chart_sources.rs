//! Authenticated chart sources on the real cluster (issue 19): the local OCI registry and
//! the HTTPS Helm repository, both with TLS from a private CA and basic auth
//! (`e2e::sources`). ApplicationInstances install from `oci://` through a managed
//! OCIRepository, a user's HelmRepository of `type: oci` and a user's OCIRepository, and from
//! `https://` through a managed HelmRepository, each with `secretRef` credentials and a
//! `certSecretRef` CA. A wrong password surfaces as `SourceReady=False` with the Flux source's
//! own reason, and no password appears in logs, Events or status.

use std::{path::PathBuf, time::Duration};

use api::{ApplicationInstance, ChartRepository, LocalObjectReference, SourceKind, SourceReference};
use e2e::{
    TestContext, apply_dynamic,
    apps::{app, apply_app, condition, start_controller, wait_app, wait_deployed, wait_ready},
    eventually, flux, get_json,
    sources::{
        self, HTTPS_CHART_REPO, OCI_REGISTRY, assert_no_leak, basic_auth_secret, ca_secret, credentials,
        docker_config_secret,
    },
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

/// A failing source reports within its first reconcile; installs take longer.
const SOURCE_TIMEOUT: Duration = Duration::from_secs(90);
const CA_SECRET: &str = "registry-ca";

/// An app of `chart@version` from the managed source at `url`, with both Secret references.
fn app_from(name: &str, url: &str, chart: &str, version: &str, secret: &str) -> ApplicationInstance {
    let mut a = app(name, chart, version, serde_json::json!({}));
    a.spec.chart.repository = Some(ChartRepository {
        url: url.into(),
        secret_ref: Some(LocalObjectReference { name: secret.into() }),
        cert_secret_ref: Some(LocalObjectReference { name: CA_SECRET.into() }),
        interval: Some("1m".into()),
    });
    a
}

/// An app taking `chart` from the user's Flux source `kind/name` (no version: a HelmRepository
/// gets one from the caller, an OCIRepository pins its own).
fn app_from_ref(name: &str, chart: &str, kind: SourceKind, source: &str) -> ApplicationInstance {
    let mut a = app(name, chart, "*", serde_json::json!({}));
    a.spec.chart.version = None;
    a.spec.chart.repository = None;
    a.spec.chart.source_ref = Some(SourceReference {
        kind,
        name: source.into(),
        namespace: None,
    });
    a
}

async fn create_secret(ctx: &TestContext, secret: Secret) -> anyhow::Result<()> {
    ctx.apply(&secret).await?;
    Ok(())
}

/// A wrong password nobody could mistake for anything else, unique per test.
fn wrong_password(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("vws-wrong-{tag}-{nanos:09}-pw")
}

/// Waits until the app shows `SourceReady=False` with exactly the reason of the Flux object it
/// names (read at the same moment), and returns (reason, message).
async fn wait_source_failure(
    ctx: &TestContext,
    name: &str,
    source: &Api<kube::api::DynamicObject>,
    source_name: &str,
) -> anyhow::Result<(String, String)> {
    wait_app(ctx, name, "SourceReady=False", SOURCE_TIMEOUT, |a| {
        condition(a, "SourceReady").is_some_and(|(s, _, _)| s == "False")
    })
    .await?;
    eventually(
        ctx,
        &format!("{name}: SourceReady reason equal to {source_name}'s Ready reason"),
        SOURCE_TIMEOUT,
        || async {
            let app = ctx.api::<ApplicationInstance>().get(name).await?;
            let ours = condition(&app, "SourceReady");
            let theirs = get_json(source, source_name)
                .await?
                .and_then(|o| e2e::condition(&o, "Ready"));
            Ok(match (ours, theirs) {
                (Some((s, r, m)), Some((fs, fr, _))) if s == "False" && fs == "False" && r == fr => Ok((r, m)),
                other => Err(format!("(app SourceReady, source Ready): {other:?}")),
            })
        },
    )
    .await
}

/// The chart version helm-controller records for the app `name`'s chart, taken from its
/// (shared) OCIRepository:
/// with a `chartRef` to an OCIRepository, Flux appends the first 12 hex digits of the
/// artifact's digest as semver build metadata (`0.2.0+8e1052361664`, helm-controller
/// `mutateChartWithSourceRevision`), so a re-pushed tag counts as a new version. Read from the
/// OCIRepository's `status.artifact.revision` (`<tag>@sha256:<hex>`).
async fn oci_chart_version(ctx: &TestContext, app: &str, tag: &str) -> anyhow::Result<String> {
    let name = flux::managed_source_name(ctx, app).await?;
    let oci = get_json(&sources::oci_repositories(ctx), &name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("OCIRepository {name} is missing"))?;
    let revision = oci["status"]["artifact"]["revision"].as_str().unwrap_or_default();
    let hex = revision
        .strip_prefix(&format!("{tag}@sha256:"))
        .filter(|hex| hex.len() >= 12)
        .ok_or_else(|| anyhow::anyhow!("OCIRepository {name}: revision {revision:?} is not {tag}@sha256:…"))?;
    Ok(format!("{tag}+{}", &hex[..12]))
}

fn logs_to_check(controller_log: PathBuf) -> Vec<PathBuf> {
    let mut logs = sources::shared_logs();
    logs.push(controller_log);
    logs
}

#[tokio::test]
async fn managed_oci_repository_with_docker_config_secret_and_private_ca_installs() -> anyhow::Result<()> {
    let ctx = TestContext::new("src-oci").await?;
    let creds = credentials()?;
    let controller = start_controller(&ctx, &[]).await?;
    create_secret(
        &ctx,
        docker_config_secret("registry-auth", OCI_REGISTRY, &creds.username, &creds.password)?,
    )
    .await?;
    create_secret(&ctx, ca_secret(CA_SECRET, &creds.ca_crt)?).await?;
    let url = format!("oci://{OCI_REGISTRY}/charts/demo-app");
    apply_app(&ctx, &app_from("oci", &url, "demo-app", "0.2.0", "registry-auth")).await?;

    wait_ready(&ctx, "oci", "True", "InstallSucceeded").await?;
    let version = oci_chart_version(&ctx, "oci", "0.2.0").await?;
    let ready = wait_deployed(&ctx, "oci", "InstallSucceeded", &version).await?;
    assert_eq!(condition(&ready, "SourceReady"), None, "no source failure left behind");
    let oci = get_json(
        &sources::oci_repositories(&ctx),
        &flux::managed_source_name(&ctx, "oci").await?,
    )
    .await?
    .ok_or_else(|| anyhow::anyhow!("OCIRepository oci is missing"))?;
    assert_eq!(oci["spec"]["secretRef"]["name"], "registry-auth");
    assert_eq!(oci["spec"]["certSecretRef"]["name"], CA_SECRET);
    assert_eq!(
        e2e::condition(&oci, "Ready").map(|c| c.0),
        Some("True".to_owned()),
        "{oci}"
    );
    assert_no_leak(
        &ctx,
        &creds.username,
        &[&creds.password],
        &logs_to_check(controller.log_path.clone()),
    )
    .await
}

#[tokio::test]
async fn source_ref_to_helm_repository_of_type_oci_installs() -> anyhow::Result<()> {
    let ctx = TestContext::new("src-helmrepo-oci").await?;
    let creds = credentials()?;
    let controller = start_controller(&ctx, &[]).await?;
    create_secret(
        &ctx,
        basic_auth_secret("registry-login", &creds.username, &creds.password)?,
    )
    .await?;
    create_secret(&ctx, ca_secret(CA_SECRET, &creds.ca_crt)?).await?;
    apply_dynamic(
        &ctx.client,
        &ctx.namespace,
        serde_json::json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmRepository",
            "metadata": {"name": "registry"},
            "spec": {
                "type": "oci", "url": format!("oci://{OCI_REGISTRY}/charts"), "interval": "1m",
                "secretRef": {"name": "registry-login"}, "certSecretRef": {"name": CA_SECRET},
            },
        }),
    )
    .await?;
    let mut a = app_from_ref("via-helmrepo", "demo-app", SourceKind::HelmRepository, "registry");
    a.spec.chart.version = Some("0.2.0".into());
    apply_app(&ctx, &a).await?;

    // Through a HelmChart the version stays as published: no digest is appended.
    wait_deployed(&ctx, "via-helmrepo", "InstallSucceeded", "0.2.0").await?;
    assert_no_leak(
        &ctx,
        &creds.username,
        &[&creds.password],
        &logs_to_check(controller.log_path.clone()),
    )
    .await
}

#[tokio::test]
async fn source_ref_to_oci_repository_installs() -> anyhow::Result<()> {
    let ctx = TestContext::new("src-ocirepo").await?;
    let creds = credentials()?;
    let controller = start_controller(&ctx, &[]).await?;
    create_secret(
        &ctx,
        docker_config_secret("registry-auth", OCI_REGISTRY, &creds.username, &creds.password)?,
    )
    .await?;
    create_secret(&ctx, ca_secret(CA_SECRET, &creds.ca_crt)?).await?;
    apply_dynamic(
        &ctx.client,
        &ctx.namespace,
        serde_json::json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "OCIRepository",
            "metadata": {"name": "demo-app"},
            "spec": {
                "url": format!("oci://{OCI_REGISTRY}/charts/demo-app"), "interval": "1m",
                "ref": {"tag": "0.1.0"},
                "layerSelector": {
                    "mediaType": "application/vnd.cncf.helm.chart.content.v1.tar+gzip", "operation": "copy"
                },
                "secretRef": {"name": "registry-auth"}, "certSecretRef": {"name": CA_SECRET},
            },
        }),
    )
    .await?;
    apply_app(
        &ctx,
        &app_from_ref("via-ocirepo", "demo-app", SourceKind::OciRepository, "demo-app"),
    )
    .await?;

    wait_ready(&ctx, "via-ocirepo", "True", "InstallSucceeded").await?;
    let version = oci_chart_version(&ctx, "via-ocirepo", "0.1.0").await?;
    wait_deployed(&ctx, "via-ocirepo", "InstallSucceeded", &version).await?;
    assert_no_leak(
        &ctx,
        &creds.username,
        &[&creds.password],
        &logs_to_check(controller.log_path.clone()),
    )
    .await
}

#[tokio::test]
async fn oci_wrong_password_surfaces_the_sources_reason_and_leaks_nothing() -> anyhow::Result<()> {
    let ctx = TestContext::new("src-oci-wrong").await?;
    let creds = credentials()?;
    let wrong = wrong_password("oci");
    let controller = start_controller(&ctx, &[]).await?;
    create_secret(
        &ctx,
        docker_config_secret("wrong-auth", OCI_REGISTRY, &creds.username, &wrong)?,
    )
    .await?;
    create_secret(&ctx, basic_auth_secret("wrong-login", &creds.username, &wrong)?).await?;
    // The right credentials, but as username/password keys: an OCIRepository reads only a
    // docker config Secret, so it pulls anonymously and the registry refuses it.
    create_secret(
        &ctx,
        basic_auth_secret("plain-login", &creds.username, &creds.password)?,
    )
    .await?;
    create_secret(&ctx, ca_secret(CA_SECRET, &creds.ca_crt)?).await?;
    let url = format!("oci://{OCI_REGISTRY}/charts/demo-app");
    apply_app(&ctx, &app_from("oci-wrong", &url, "demo-app", "0.1.0", "wrong-auth")).await?;
    apply_app(&ctx, &app_from("oci-plain", &url, "demo-app", "0.1.0", "plain-login")).await?;
    apply_dynamic(
        &ctx.client,
        &ctx.namespace,
        serde_json::json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmRepository",
            "metadata": {"name": "registry"},
            "spec": {
                "type": "oci", "url": format!("oci://{OCI_REGISTRY}/charts"), "interval": "1m",
                "secretRef": {"name": "wrong-login"}, "certSecretRef": {"name": CA_SECRET},
            },
        }),
    )
    .await?;
    let mut via_helmrepo = app_from_ref("helmrepo-wrong", "demo-app", SourceKind::HelmRepository, "registry");
    via_helmrepo.spec.chart.version = Some("0.1.0".into());
    apply_app(&ctx, &via_helmrepo).await?;

    let oci = sources::oci_repositories(&ctx);
    let oci_wrong = flux::managed_source_name(&ctx, "oci-wrong").await?;
    let (reason, message) = wait_source_failure(&ctx, "oci-wrong", &oci, &oci_wrong).await?;
    assert!(message.starts_with("OCIRepository "), "{message}");
    let oci_plain = flux::managed_source_name(&ctx, "oci-plain").await?;
    let (plain_reason, plain_message) = wait_source_failure(&ctx, "oci-plain", &oci, &oci_plain).await?;
    // A type: oci HelmRepository is static in Flux: the failure is on the HelmChart that
    // helm-controller generates (named in the HelmRelease's status.helmChart as ns/name).
    let chart_name = eventually(
        &ctx,
        "HelmRelease helmrepo-wrong names its HelmChart",
        SOURCE_TIMEOUT,
        || async {
            let hr = get_json(&flux::helm_releases(&ctx), "helmrepo-wrong").await?;
            Ok(
                match hr
                    .as_ref()
                    .and_then(|h| h["status"]["helmChart"].as_str())
                    .and_then(|c| c.split_once('/'))
                {
                    Some((_, name)) => Ok(name.to_owned()),
                    None => Err("no status.helmChart yet".to_owned()),
                },
            )
        },
    )
    .await?;
    let (chart_reason, chart_message) =
        wait_source_failure(&ctx, "helmrepo-wrong", &sources::helm_charts(&ctx), &chart_name).await?;
    assert!(chart_message.starts_with("HelmChart "), "{chart_message}");
    // Each failure is the registry's refusal of the login, not any other source failure (a
    // wrong URL or CA would fail too, and prove nothing about credentials).
    for (what, text) in [
        ("oci-wrong", &message),
        ("oci-plain", &plain_message),
        ("helmrepo-wrong", &chart_message),
    ] {
        let lower = text.to_ascii_lowercase();
        assert!(
            lower.contains("401") || lower.contains("unauthorized"),
            "{what}: not the registry's refusal of the login: {text}"
        );
    }
    eprintln!(
        "OCIRepository wrong password: {reason}; username/password Secret: {plain_reason}; HelmChart: {chart_reason}"
    );

    // Nothing installed from a refused source.
    for name in ["oci-wrong", "oci-plain", "helmrepo-wrong"] {
        let a = ctx.api::<ApplicationInstance>().get(name).await?;
        assert_ne!(condition(&a, "Ready").map(|c| c.0), Some("True".to_owned()), "{name}");
    }
    assert_no_leak(
        &ctx,
        &creds.username,
        &[&creds.password, &wrong],
        &logs_to_check(controller.log_path.clone()),
    )
    .await
}

#[tokio::test]
async fn https_repository_with_basic_auth_and_private_ca_installs() -> anyhow::Result<()> {
    let ctx = TestContext::new("src-https").await?;
    let creds = credentials()?;
    let controller = start_controller(&ctx, &[]).await?;
    create_secret(&ctx, basic_auth_secret("repo-login", &creds.username, &creds.password)?).await?;
    create_secret(&ctx, ca_secret(CA_SECRET, &creds.ca_crt)?).await?;
    apply_app(
        &ctx,
        &app_from("https", HTTPS_CHART_REPO, "demo-app", "0.2.0", "repo-login"),
    )
    .await?;

    wait_deployed(&ctx, "https", "InstallSucceeded", "0.2.0").await?;
    let repo = get_json(
        &flux::helm_repositories(&ctx),
        &flux::managed_source_name(&ctx, "https").await?,
    )
    .await?
    .ok_or_else(|| anyhow::anyhow!("HelmRepository https is missing"))?;
    assert_eq!(repo["spec"]["url"], HTTPS_CHART_REPO);
    assert_eq!(repo["spec"]["secretRef"]["name"], "repo-login");
    assert_eq!(repo["spec"]["certSecretRef"]["name"], CA_SECRET);
    assert_no_leak(
        &ctx,
        &creds.username,
        &[&creds.password],
        &logs_to_check(controller.log_path.clone()),
    )
    .await
}

#[tokio::test]
async fn https_repository_wrong_password_surfaces_the_sources_reason_and_leaks_nothing() -> anyhow::Result<()> {
    let ctx = TestContext::new("src-https-wrong").await?;
    let creds = credentials()?;
    let wrong = wrong_password("https");
    let controller = start_controller(&ctx, &[]).await?;
    create_secret(&ctx, basic_auth_secret("repo-login", &creds.username, &wrong)?).await?;
    create_secret(&ctx, ca_secret(CA_SECRET, &creds.ca_crt)?).await?;
    apply_app(
        &ctx,
        &app_from("https-wrong", HTTPS_CHART_REPO, "demo-app", "0.1.0", "repo-login"),
    )
    .await?;

    let https_wrong = flux::managed_source_name(&ctx, "https-wrong").await?;
    let (reason, message) =
        wait_source_failure(&ctx, "https-wrong", &flux::helm_repositories(&ctx), &https_wrong).await?;
    assert!(message.starts_with("HelmRepository "), "{message}");
    assert!(message.contains("401"), "the repository's answer is relayed: {message}");
    eprintln!("HelmRepository wrong password: {reason}: {message}");
    assert_no_leak(
        &ctx,
        &creds.username,
        &[&creds.password, &wrong],
        &logs_to_check(controller.log_path.clone()),
    )
    .await
}
