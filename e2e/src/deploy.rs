//! Helpers for the deploy bundle tests (`tests/deploy.rs`): render the kustomize overlays
//! under `deploy/overlays/` with the cluster's kubectl, apply them server-side, inspect
//! their RBAC and Deployments, and run a binary out of cluster under a ServiceAccount's
//! rights (a kubeconfig that impersonates it).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
};

use anyhow::{Context as _, bail};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{cluster_dir, repo_root, yaml_documents};

/// Field manager of the objects these tests apply (a stand-in for an operator's install).
pub const INSTALL_FIELD_MANAGER: &str = "vws-e2e-install";
/// The operator's namespace in every overlay.
pub const SYSTEM_NAMESPACE: &str = "vworkspace-system";
/// Every overlay under `deploy/overlays/`.
pub const OVERLAYS: [&str; 4] = ["full", "app-only", "no-flux", "namespaced"];

/// The cluster's kubectl (`$VWS_BIN_DIR/kubectl`, set by `hack/cluster.sh exec`), else `kubectl` on PATH.
pub fn kubectl_path() -> PathBuf {
    std::env::var_os("VWS_BIN_DIR")
        .map(|d| PathBuf::from(d).join("kubectl"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("kubectl"))
}

/// Runs kubectl against the local cluster as admin, with `stdin` piped in; returns stdout.
pub async fn kubectl(args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    let kubeconfig = cluster_dir().join("admin.kubeconfig");
    let mut cmd = tokio::process::Command::new(kubectl_path());
    cmd.arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("running {}", kubectl_path().display()))?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().context("kubectl stdin")?;
        pipe.write_all(input.as_bytes()).await?;
        drop(pipe);
    }
    let out = child.wait_with_output().await?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Path of an overlay directory.
pub fn overlay_dir(overlay: &str) -> PathBuf {
    repo_root().join("deploy/overlays").join(overlay)
}

/// `kubectl kustomize deploy/overlays/<overlay>`: the rendered YAML.
pub async fn render(overlay: &str) -> anyhow::Result<String> {
    let dir = overlay_dir(overlay);
    kubectl(&["kustomize", &dir.to_string_lossy()], None)
        .await
        .with_context(|| format!("rendering {}", dir.display()))
}

/// The rendered overlay as JSON documents.
pub async fn render_docs(overlay: &str) -> anyhow::Result<Vec<Value>> {
    yaml_documents(&render(overlay).await?)
}

/// `kind` of a document.
pub fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

/// `metadata.name` of a document.
pub fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

/// `metadata.namespace` of a document (empty for cluster-scoped ones).
pub fn namespace(doc: &Value) -> &str {
    doc["metadata"]["namespace"].as_str().unwrap_or_default()
}

/// `kind/namespace/name`, for messages.
pub fn id(doc: &Value) -> String {
    format!("{}/{}/{}", kind(doc), namespace(doc), name(doc))
}

/// Objects of the bundled Flux (`app.kubernetes.io/part-of: flux`).
pub fn is_flux(doc: &Value) -> bool {
    doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "flux"
}

/// The one aggregated ClusterRole the bundle may ship: the release role (granted to a chart
/// only through RoleBindings in one namespace), aggregating exactly the release label: the
/// bundle's explicit list and what a platform team labels on purpose, never the built-in
/// `admin`'s label, which grows with whatever the cluster installs
/// (docs/install/README.md#flux-multi-tenancy).
fn is_release_role_aggregation(doc: &Value) -> bool {
    kind(doc) == "ClusterRole"
        && name(doc) == api::RELEASE_ROLE
        && doc["aggregationRule"]
            == serde_json::json!({"clusterRoleSelectors": [
                {"matchLabels": {"vworkspace.io/aggregate-to-release": "true"}},
            ]})
}

/// Every place a `*` appears in an RBAC rule of a Role or ClusterRole, as `id: field=value`;
/// an aggregationRule (rights that grow with whatever gets labelled) counts as one, but for the
/// release role's.
pub fn rbac_wildcards(docs: &[Value]) -> Vec<String> {
    let mut found = Vec::new();
    for doc in docs.iter().filter(|d| matches!(kind(d), "Role" | "ClusterRole")) {
        if doc.get("aggregationRule").is_some() && !is_release_role_aggregation(doc) {
            found.push(format!("{}: aggregationRule", id(doc)));
        }
        for rule in doc["rules"].as_array().into_iter().flatten() {
            for field in ["apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"] {
                for value in rule[field].as_array().into_iter().flatten() {
                    if value.as_str().is_some_and(|s| s.contains('*')) {
                        found.push(format!("{}: {field}={value}", id(doc)));
                    }
                }
            }
        }
    }
    found
}

/// The first container of a Deployment.
pub fn container(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

/// The Deployment named `name` in the rendered documents.
pub fn deployment<'a>(docs: &'a [Value], name_: &str) -> anyhow::Result<&'a Value> {
    docs.iter()
        .find(|d| kind(d) == "Deployment" && name(d) == name_)
        .with_context(|| format!("no Deployment {name_} in the rendered overlay"))
}

/// The container's `args` as strings.
pub fn container_args(deployment: &Value) -> Vec<String> {
    container(deployment)["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect()
}

/// Server-side applies YAML with kubectl as admin; `dry_run` adds `--dry-run=server`.
pub async fn apply(yaml: &str, dry_run: bool) -> anyhow::Result<String> {
    let manager = format!("--field-manager={INSTALL_FIELD_MANAGER}");
    let mut args = vec!["apply", "--server-side", manager.as_str(), "-f", "-"];
    if dry_run {
        args.push("--dry-run=server");
    }
    kubectl(&args, Some(yaml)).await
}

/// Serialises documents back into one multi-document YAML stream.
pub fn to_yaml(docs: &[&Value]) -> anyhow::Result<String> {
    let mut out = String::new();
    for doc in docs {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(doc)?);
    }
    Ok(out)
}

/// Creates namespace `name` unless it exists; returns whether it was created (by this call:
/// test files run side by side, so another process may create it between the get and the
/// create).
pub async fn ensure_namespace(name_: &str) -> anyhow::Result<bool> {
    if !kubectl(&["get", "namespace", name_, "--ignore-not-found", "-o", "name"], None)
        .await?
        .trim()
        .is_empty()
    {
        return Ok(false);
    }
    match kubectl(&["create", "namespace", name_], None).await {
        Ok(_) => Ok(true),
        Err(e) if e.to_string().contains("(AlreadyExists)") => Ok(false),
        Err(e) => Err(e),
    }
}

/// The user name of a ServiceAccount, as the API server authenticates it.
pub fn service_account_user(namespace_: &str, name_: &str) -> String {
    format!("system:serviceaccount:{namespace_}:{name_}")
}

/// Writes a kubeconfig that authenticates as the cluster admin but impersonates the
/// ServiceAccount `namespace/name` (`as` / `as-groups`), so every request is authorised
/// with exactly that ServiceAccount's RBAC. Returns its path.
pub fn impersonating_kubeconfig(namespace_: &str, name_: &str, file_stem: &str) -> anyhow::Result<PathBuf> {
    let admin = std::fs::read_to_string(cluster_dir().join("admin.kubeconfig"))?;
    let mut config: serde_json::Value = serde_saphyr::from_str(&admin)?;
    let users = config["users"].as_array_mut().context("kubeconfig without users")?;
    for user in users {
        let u = &mut user["user"];
        u["as"] = serde_json::Value::from(service_account_user(namespace_, name_));
        u["as-groups"] = serde_json::to_value([
            "system:serviceaccounts".to_owned(),
            format!("system:serviceaccounts:{namespace_}"),
            "system:authenticated".to_owned(),
        ])?;
    }
    let dir = cluster_dir().join("kubeconfigs");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{file_stem}.kubeconfig"));
    // Concurrent tests start binaries with the same kubeconfig: write a temporary file and
    // rename it, so a starting process never reads a half-written one.
    static WRITES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{file_stem}.{}.{n}.tmp", std::process::id()));
    std::fs::write(&tmp, serde_saphyr::to_string(&config)?)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// A client from a kubeconfig file (e.g. an impersonating one).
pub async fn client_from(path: &Path) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Whether an API result is the API server's 403 Forbidden.
pub fn is_forbidden<T>(result: &Result<T, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.is_forbidden())
}

/// Minimal HTTP/1.0 GET on loopback (the admin server); returns the body.
pub async fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    stream.read_to_string(&mut out).await?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((out.as_str(), ""));
    anyhow::ensure!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "GET {path}: {head}"
    );
    Ok(body.to_owned())
}

/// Sum of every sample of `metric` whose labels contain all of `labels` (`key="value"`),
/// from an OpenMetrics text exposition.
pub fn metric_sum(text: &str, metric: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The holder of a Lease (None when absent or free).
pub async fn lease_holder(client: &Client, namespace_: &str, name_: &str) -> anyhow::Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace_);
    Ok(leases
        .get_opt(name_)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// The binaries of the bundle that run under their own ServiceAccount in e2e.
pub const BUNDLE_BINARIES: [&str; 6] = [
    "agent",
    "app-controller",
    "backup-engine",
    "restore-engine",
    "upgrade-engine",
    "runbook-engine",
];

static BUNDLE_RBAC: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// Applies (once per test process) the ServiceAccounts, RBAC and admission policies of the `no-flux` overlay,
/// so the e2e suite runs every controller with exactly its installed rights.
pub async fn ensure_bundle_rbac() -> anyhow::Result<()> {
    BUNDLE_RBAC.get_or_try_init(apply_bundle_rbac).await?;
    Ok(())
}

/// Applies the ServiceAccounts and RBAC of the `no-flux` overlay now (e.g. again after a
/// test removed them).
pub async fn apply_bundle_rbac() -> anyhow::Result<()> {
    // The admission policies that narrow RBAC (e.g. the upgrade engine's ConfigMaps) too,
    // so every test runs the controllers under them.
    const KINDS: [&str; 8] = [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    let docs = render_docs("no-flux").await?;
    for ns in docs.iter().filter(|d| KINDS.contains(&kind(d))).map(namespace) {
        if !ns.is_empty() {
            ensure_namespace(ns).await?;
        }
    }
    let rbac: Vec<&Value> = docs.iter().filter(|d| KINDS.contains(&kind(d))).collect();
    apply(&to_yaml(&rbac)?, false).await?;
    Ok(())
}

/// A kubeconfig for running `binary` (one of [`BUNDLE_BINARIES`]) as its ServiceAccount,
/// after making sure the bundle's RBAC is applied. `None` when `VWS_E2E_AS_ADMIN` is set
/// (debugging: run as the cluster admin) or for other binaries.
pub async fn least_privilege_kubeconfig(binary: &str) -> anyhow::Result<Option<PathBuf>> {
    if std::env::var_os("VWS_E2E_AS_ADMIN").is_some() || !BUNDLE_BINARIES.contains(&binary) {
        return Ok(None);
    }
    ensure_bundle_rbac().await?;
    Ok(Some(impersonating_kubeconfig(SYSTEM_NAMESPACE, binary, binary)?))
}

/// Lets ServiceAccount `vworkspace-system/<service_account>` hold the Lease `lease` there
/// (get and update by name): the bundle grants each binary its default Lease only
/// (`vworkspace-<binary>`), and tests that elect a leader use a Lease of their own.
pub async fn grant_lease(service_account: &str, lease: &str) -> anyhow::Result<()> {
    let role = format!("e2e-lease-{lease}");
    let docs = [
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": role, "namespace": SYSTEM_NAMESPACE},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                "resourceNames": [lease], "verbs": ["get", "update"]}],
        }),
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": role, "namespace": SYSTEM_NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": SYSTEM_NAMESPACE}],
        }),
    ];
    apply(&to_yaml(&docs.iter().collect::<Vec<_>>())?, false).await?;
    Ok(())
}
