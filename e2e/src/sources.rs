//! The local cluster's authenticated chart sources (`hack/cluster.sh up` or
//! `start-registries`): an OCI registry and an HTTPS Helm repository, both with TLS from a
//! private CA and basic auth, holding every test chart. Helpers build the Secrets Flux reads
//! for them and check that no password leaks into logs, Events or status.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, DynamicObject, ListParams};

use crate::{TestContext, cluster_dir, dynamic_api};

/// The OCI registry (distribution), `host:port`; charts are `charts/<chart>:<version>`.
pub const OCI_REGISTRY: &str = "127.0.0.1:18881";
/// The Helm repository over HTTPS with basic auth, serving the same charts.
pub const HTTPS_CHART_REPO: &str = "https://127.0.0.1:18882";

/// The test user's credentials and the CA both sources' certificates are signed by, as
/// `hack/cluster.sh` wrote them (`<cluster>/registry/`).
pub struct Credentials {
    /// The user both sources accept.
    pub username: String,
    /// Its password (random per cluster directory).
    pub password: String,
    /// PEM of the private CA.
    pub ca_crt: String,
}

/// Where `hack/cluster.sh` keeps the sources' CA, credentials and logs of their own.
pub fn state_dir() -> PathBuf {
    std::env::var_os("VWS_REGISTRY_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| cluster_dir().join("registry"))
}

/// Reads the credentials of the running sources.
pub fn credentials() -> anyhow::Result<Credentials> {
    let dir = state_dir();
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name)).with_context(|| {
            format!(
                "reading {} (run `hack/cluster.sh start-registries`)",
                dir.join(name).display()
            )
        })
    };
    Ok(Credentials {
        username: read("username")?.trim().to_owned(),
        password: read("password")?.trim().to_owned(),
        ca_crt: read("ca.crt")?,
    })
}

/// A Secret with `username` and `password`: what a HelmRepository (HTTPS, or `type: oci`) reads.
pub fn basic_auth_secret(name: &str, username: &str, password: &str) -> anyhow::Result<Secret> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
        "stringData": {"username": username, "password": password},
    }))?)
}

/// A `kubernetes.io/dockerconfigjson` Secret for `registry`: the only kind of `secretRef` an
/// OCIRepository reads (source-controller v1.9 builds its keychain from pull secrets; plain
/// `username`/`password` keys are ignored there).
pub fn docker_config_secret(name: &str, registry: &str, username: &str, password: &str) -> anyhow::Result<Secret> {
    let auth = base64(format!("{username}:{password}").as_bytes());
    let config = serde_json::json!({
        "auths": {registry: {"username": username, "password": password, "auth": auth}}
    });
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": config.to_string()},
    }))?)
}

/// A Secret with the CA under `ca.crt`, for a source's `certSecretRef`.
pub fn ca_secret(name: &str, ca_crt: &str) -> anyhow::Result<Secret> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
        "stringData": {"ca.crt": ca_crt},
    }))?)
}

/// OCIRepository API in the test namespace.
pub fn oci_repositories(ctx: &TestContext) -> Api<DynamicObject> {
    dynamic_api(
        &ctx.client,
        &ctx.namespace,
        "source.toolkit.fluxcd.io",
        "v1",
        "OCIRepository",
        "ocirepositories",
    )
}

/// HelmChart API in the test namespace.
pub fn helm_charts(ctx: &TestContext) -> Api<DynamicObject> {
    dynamic_api(
        &ctx.client,
        &ctx.namespace,
        "source.toolkit.fluxcd.io",
        "v1",
        "HelmChart",
        "helmcharts",
    )
}

/// Standard base64 (RFC 4648, padded), for docker config `auth` fields and leak checks.
pub fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Everything a password could leak into, read now: the given log files (this test's app
/// controller, Flux's controllers, the sources' own logs), the namespace's Events, and every
/// ApplicationInstance, HelmRelease, HelmRepository, OCIRepository and HelmChart of the
/// namespace (whole objects, status included). Returns `(where, text)` pairs.
///
/// A log that cannot be read, or is empty, is an error, and so are logs of which none names
/// the test namespace (they would not cover what the test did): a check of nothing passes.
/// An app controller's log (`app-controller-*.log`) must be at debug level.
pub async fn leak_surfaces(ctx: &TestContext, logs: &[PathBuf]) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for path in logs {
        let text = read_lossy(path).with_context(|| format!("reading {} for the leak check", path.display()))?;
        anyhow::ensure!(
            !text.is_empty(),
            "{} is empty: the leak check would check nothing",
            path.display()
        );
        let app_controller = path
            .file_name()
            .is_some_and(|f| f.to_string_lossy().starts_with("app-controller-"));
        anyhow::ensure!(
            !app_controller || text.contains("DEBUG"),
            "{} has no DEBUG line: the app controller must log at debug level for the check to mean something",
            path.display()
        );
        out.push((path.display().to_string(), text));
    }
    anyhow::ensure!(
        logs.is_empty() || out.iter().any(|(_, text)| text.contains(&ctx.namespace)),
        "none of the logs {logs:?} names {}: they do not cover this test",
        ctx.namespace
    );
    let events: Api<Event> = ctx.api();
    let events = events.list(&ListParams::default()).await?;
    out.push((
        format!("Events in {}", ctx.namespace),
        serde_json::to_string(&events.items)?,
    ));
    let apps = ctx
        .api::<api::ApplicationInstance>()
        .list(&ListParams::default())
        .await?;
    out.push(("ApplicationInstances".into(), serde_json::to_string(&apps.items)?));
    for (kind, api) in [
        ("HelmReleases", crate::flux::helm_releases(ctx)),
        ("HelmRepositories", crate::flux::helm_repositories(ctx)),
        ("OCIRepositories", oci_repositories(ctx)),
        ("HelmCharts", helm_charts(ctx)),
    ] {
        let list = api.list(&ListParams::default()).await?;
        out.push((kind.into(), serde_json::to_string(&list.items)?));
    }
    Ok(out)
}

/// Fails naming the surface when any `secret` (or the base64 of `user:secret`, as it travels
/// in an `Authorization: Basic` header) appears in any of [`leak_surfaces`].
pub async fn assert_no_leak(
    ctx: &TestContext,
    username: &str,
    secrets: &[&str],
    logs: &[PathBuf],
) -> anyhow::Result<()> {
    let surfaces = leak_surfaces(ctx, logs).await?;
    for secret in secrets {
        anyhow::ensure!(secret.len() >= 12, "a leak check needs a distinctive secret");
        let encoded = base64(format!("{username}:{secret}").as_bytes());
        for (place, text) in &surfaces {
            anyhow::ensure!(
                !text.contains(secret) && !text.contains(&encoded),
                "a password ({} chars) appears in {place}",
                secret.len()
            );
        }
    }
    Ok(())
}

/// The cluster-wide logs a chart-source password could reach: Flux's two controllers and the
/// two sources themselves.
pub fn shared_logs() -> Vec<PathBuf> {
    let logs = cluster_dir().join("logs");
    ["source-controller", "helm-controller", "registry", "https-chart-server"]
        .iter()
        .map(|name| logs.join(format!("{name}.log")))
        .collect()
}

fn read_lossy(path: &Path) -> std::io::Result<String> {
    std::fs::read(path).map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in vectors {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain}");
        }
    }
}
