//! Helpers for the bundle tests (`tests/bundle.rs`): the install bundle running *in* the
//! cluster, on the real node (`hack/node.sh`), from the images of `hack/build-images.sh`.
//!
//! An overlay is rendered through a kustomization of our own, written to a directory under
//! the cluster dir, whose only base is the overlay: it changes nothing but what running on
//! the real node needs (placement), the tenancy allow-list and what the test asks for
//! (replicas, extra args). The out-of-cluster Flux of `hack/cluster.sh` is stopped while a
//! bundle with its own Flux runs ([`OutOfClusterFluxStopped`]).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, bail};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Namespace, Pod},
};
use kube::{Api, Client, api::ListParams};
use serde_json::Value;

use crate::{
    TestContext, cluster_dir,
    deploy::{self, kind, kubectl, name, namespace},
    eventually, repo_root,
};

/// The taint that keeps everything but chosen pods off the real node (`hack/node.sh`).
pub const REAL_NODE_TAINT_KEY: &str = "vws.dev/real-node";
/// The namespace of the bundled Flux.
pub const FLUX_NAMESPACE: &str = "flux-system";
/// How long a bundle's Deployments may take to become Available on the real node (images
/// are imported, never pulled; the first start of a controller waits for its caches).
pub const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(180);

/// The real node's name: `VWS_REAL_NODE` (from `hack/cluster.sh env`); an error when the
/// cluster runs without one (`VWS_REAL_NODE=0`), since nothing could run.
pub fn real_node() -> anyhow::Result<String> {
    std::env::var("VWS_REAL_NODE").context(
        "VWS_REAL_NODE is not set: the cluster has no real node (started with VWS_REAL_NODE=0?), \
         or the test runs outside `hack/cluster.sh exec`",
    )
}

/// The real node's IP (on `lo` of the cluster's netns; its pods reach it).
pub fn node_ip() -> String {
    std::env::var("VWS_NODE_IP").unwrap_or_else(|_| "10.99.0.1".to_owned())
}

/// The chart repository as pods on the real node reach it (`VWS_CHART_REPO_FOR_PODS`).
pub fn chart_repo_for_pods() -> String {
    std::env::var("VWS_CHART_REPO_FOR_PODS").unwrap_or_else(|_| format!("http://{}:18879", node_ip()))
}

/// The host (no scheme, no port) of a URL such as [`chart_repo_for_pods`].
pub fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

/// `nodeSelector` and `tolerations` that put a pod on the real node `node` (and nowhere else).
pub fn placement(node: &str) -> Value {
    serde_json::json!({
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [{"key": REAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
    })
}

/// What a test changes in an overlay, and nothing else.
pub struct BundleOptions<'a> {
    /// `deploy/overlays/<overlay>`.
    pub overlay: &'a str,
    /// The real node every Deployment is placed on.
    pub node: &'a str,
    /// `allowed-namespaces` of the ConfigMap `vworkspace-tenancy` (merged into the overlay's).
    pub allowed_namespaces: &'a str,
    /// `spec.replicas` of the app controller's Deployment.
    pub app_controller_replicas: u32,
    /// Arguments appended to the app controller's container.
    pub app_controller_args: &'a [String],
    /// Components of `deploy/components/` added to the overlay (e.g. `argocd-engine`).
    pub components: &'a [&'a str],
}

/// The kustomization (`kustomization.yaml`) rendering `options`: the overlay as its only
/// base, one patch placing every Deployment on the real node, the allow-list merged into
/// the overlay's generated ConfigMap, and the app controller's replicas and extra args.
/// `dir` is where the kustomization lives: kustomize takes a base only by a relative path.
pub fn kustomization(dir: &Path, options: &BundleOptions<'_>) -> anyhow::Result<String> {
    let overlay = repo_root().join("deploy/overlays").join(options.overlay);
    anyhow::ensure!(overlay.is_dir(), "no overlay {}", overlay.display());
    let base = relative_path(dir, &overlay)?;
    let placement_patch = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        // Ignored: the target selects the Deployments.
        "metadata": {"name": "any"},
        "spec": {"template": {"spec": placement(options.node)}},
    });
    let mut app_controller_ops = vec![serde_json::json!({
        "op": "replace", "path": "/spec/replicas", "value": options.app_controller_replicas,
    })];
    for arg in options.app_controller_args {
        app_controller_ops.push(serde_json::json!({
            "op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": arg,
        }));
    }
    let components = options
        .components
        .iter()
        .map(|c| {
            Ok(relative_path(dir, &repo_root().join("deploy/components").join(c))?
                .to_string_lossy()
                .into_owned())
        })
        .collect::<anyhow::Result<Vec<String>>>()?;
    let kustomization = serde_json::json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [base.to_string_lossy()],
        "components": components,
        "configMapGenerator": [{
            "name": "vworkspace-tenancy",
            "namespace": deploy::SYSTEM_NAMESPACE,
            "behavior": "merge",
            "literals": [format!("allowed-namespaces={}", options.allowed_namespaces)],
        }],
        "patches": [
            {"target": {"kind": "Deployment"}, "patch": serde_saphyr::to_string(&placement_patch)?},
            {
                "target": {"kind": "Deployment", "name": "app-controller", "namespace": deploy::SYSTEM_NAMESPACE},
                "patch": serde_json::to_string(&app_controller_ops)?,
            },
        ],
    });
    Ok(serde_saphyr::to_string(&kustomization)?)
}

/// The path of `to` relative to the directory `from` (both made absolute and canonical).
pub fn relative_path(from: &Path, to: &Path) -> anyhow::Result<PathBuf> {
    let canonical = |p: &Path| p.canonicalize().with_context(|| format!("resolving {}", p.display()));
    let (from, to) = (canonical(from)?, canonical(to)?);
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = PathBuf::new();
    for _ in from.components().skip(common) {
        out.push("..");
    }
    for c in to.components().skip(common) {
        out.push(c);
    }
    Ok(out)
}

/// A rendered bundle: the kustomization's directory and the documents it renders to.
pub struct RenderedBundle {
    /// Holds `kustomization.yaml` (removed by [`RenderedBundle::remove_dir`]).
    pub dir: PathBuf,
    /// Every rendered document.
    pub docs: Vec<Value>,
}

impl RenderedBundle {
    /// Writes the kustomization for `options` into `<cluster dir>/bundle-e2e/<tag>` and
    /// renders it with the cluster's kubectl (`kubectl kustomize`).
    pub async fn render(tag: &str, options: &BundleOptions<'_>) -> anyhow::Result<Self> {
        let dir = cluster_dir().join("bundle-e2e").join(tag);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join("kustomization.yaml"), kustomization(&dir, options)?)?;
        let yaml = kubectl(&["kustomize", &dir.to_string_lossy()], None)
            .await
            .with_context(|| format!("rendering {}", dir.display()))?;
        Ok(Self {
            dir,
            docs: crate::yaml_documents(&yaml)?,
        })
    }

    /// The documents of `kinds`.
    pub fn of_kind(&self, kinds: &[&str]) -> Vec<&Value> {
        self.docs.iter().filter(|d| kinds.contains(&kind(d))).collect()
    }

    /// Everything but the CustomResourceDefinitions: the objects a test installs and removes
    /// (CRDs are cluster infrastructure the rest of the suite needs; see the test).
    pub fn without_crds(&self) -> Vec<&Value> {
        self.docs
            .iter()
            .filter(|d| kind(d) != "CustomResourceDefinition")
            .collect()
    }

    /// `(namespace, name)` of every Deployment.
    pub fn deployments(&self) -> Vec<(String, String)> {
        self.of_kind(&["Deployment"])
            .into_iter()
            .map(|d| (namespace(d).to_owned(), name(d).to_owned()))
            .collect()
    }

    /// Removes the kustomization's directory.
    pub fn remove_dir(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `hack/cluster.sh ARGS...` (blocking); fails with its output when it fails.
pub fn cluster_sh(args: &[&str]) -> anyhow::Result<String> {
    let script = repo_root().join("hack/cluster.sh");
    let out = std::process::Command::new(&script)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("hack/cluster.sh {} failed ({}):\n{text}", args.join(" "), out.status);
    }
    Ok(text)
}

/// The out-of-cluster Flux of `hack/cluster.sh` (source-controller and helm-controller as
/// local processes), stopped while a bundle brings its own: two helm-controllers would
/// reconcile the same HelmReleases. Dropping the guard starts it again (`hack/cluster.sh
/// restart-flux`), also when the test panics; [`Self::restore`] does it with an error.
pub struct OutOfClusterFluxStopped {
    restored: bool,
}

impl OutOfClusterFluxStopped {
    /// `hack/cluster.sh stop-flux`.
    pub fn stop() -> anyhow::Result<Self> {
        // The guard first: a stop that fails half-way is restored too.
        let guard = Self { restored: false };
        cluster_sh(&["stop-flux"])?;
        Ok(guard)
    }

    /// `hack/cluster.sh restart-flux` now, with its error.
    pub fn restore(mut self) -> anyhow::Result<()> {
        self.restored = true;
        cluster_sh(&["restart-flux"]).map(drop)
    }
}

impl Drop for OutOfClusterFluxStopped {
    fn drop(&mut self) {
        if !self.restored
            && let Err(e) = cluster_sh(&["restart-flux"])
        {
            eprintln!("restoring the out-of-cluster Flux failed: {e:#}");
        }
    }
}

/// An installed bundle: removed when dropped unless [`Self::remove`] did it (so a failing
/// test leaves no controllers running, and never two Fluxes once the out-of-cluster one is
/// restored: declare it after [`OutOfClusterFluxStopped`], it is dropped first). Before the
/// bundle, the ApplicationInstances of `tenant_namespace` are deleted while the app controller
/// still runs to remove its finalizer.
pub struct InstalledBundle {
    file: PathBuf,
    tenant_namespace: String,
    removed: bool,
    count: usize,
}

impl InstalledBundle {
    /// The guard of `docs` (written to `<dir>/installed.yaml`), before anything is applied:
    /// whatever gets applied from here on is removed.
    pub fn new(dir: &std::path::Path, docs: &[&Value], tenant_namespace: &str) -> anyhow::Result<Self> {
        let yaml = deploy::to_yaml(docs)?;
        let file = dir.join(INSTALLED_FILE);
        std::fs::write(&file, &yaml)?;
        // Who installed it: a run killed before its guard ran leaves both files, and the next
        // suite's start check uninstalls what a process that is gone installed
        // ([`uninstall_leftover_bundles`]).
        std::fs::write(
            dir.join(INSTALLED_OWNER_FILE),
            format!("{} {tenant_namespace}\n", std::process::id()),
        )?;
        Ok(Self {
            file,
            tenant_namespace: tenant_namespace.to_owned(),
            removed: false,
            count: docs.len(),
        })
    }

    /// Server-side applies every object (as an installer would).
    pub async fn apply(&self) -> anyhow::Result<()> {
        let yaml = std::fs::read_to_string(&self.file)?;
        let out = deploy::apply(&yaml, false).await?;
        anyhow::ensure!(
            out.matches("serverside-applied").count() == self.count,
            "not every object was applied:\n{out}"
        );
        Ok(())
    }

    /// Uninstalls as docs/install/README.md#uninstalling says ([`uninstall`]), then waits until
    /// none of the installed objects exists (namespaces included); on timeout the error names
    /// what is left. Every step runs whatever an earlier one returned; the first error is the
    /// one returned.
    pub async fn remove(mut self, ctx: &TestContext, timeout: Duration) -> anyhow::Result<()> {
        self.removed = true;
        let uninstalled = uninstall(&self.file, &self.tenant_namespace).await;
        forget_owner(&self.file);
        let docs = crate::yaml_documents(&std::fs::read_to_string(&self.file)?)?;
        let docs: Vec<&Value> = docs.iter().collect();
        let gone = eventually(ctx, "every object of the bundle deleted", timeout, || {
            let docs = &docs;
            async move {
                let left = still_present(docs).await?;
                Ok(if left.is_empty() {
                    Ok(())
                } else {
                    Err(format!("still present: {left:?}"))
                })
            }
        })
        .await;
        uninstalled?;
        gone
    }
}

/// `kubectl` arguments that delete the Deployments of a file (its path appended) and wait
/// until their pods are gone. Bounded below the bundled helm-controller's 600 s termination
/// grace (Flux's manifest: it lets an in-flight Helm action finish): past it, the pods are
/// deleted without grace ([`uninstall`]).
const DELETE_CONTROLLERS: [&str; 6] = [
    "delete",
    "--ignore-not-found",
    "--cascade=foreground",
    "--wait=true",
    "--timeout=180s",
    "-f",
];

/// Removes an installed bundle (`file`, the applied objects) in the order an administrator
/// would: the ApplicationInstances of `tenant_namespace` while the app controller still runs
/// to remove its finalizer; the Deployments, until their pods are gone (deleted together
/// with their RBAC, helm-controller took minutes to stop, its requests refused, and the
/// namespace waited for it), without grace when they do not stop in time; every other
/// object; whatever of ours or Flux's still runs in the cluster
/// ([`reap_in_cluster_components`]); and last the finalizers of the tenant's
/// ApplicationInstances whose deletion did not finish (their controller is gone). No step is skipped because an earlier one failed (a
/// half-removed bundle is what broke the next suites once); the first error is returned.
pub async fn uninstall(file: &Path, tenant_namespace: &str) -> anyhow::Result<()> {
    let mut first_error: Option<anyhow::Error> = None;
    let mut note = |step: anyhow::Result<()>| {
        if let Err(e) = step {
            eprintln!("removing the bundle: {e:#}");
            first_error.get_or_insert(e);
        }
    };
    note(
        kubectl(
            &[
                "delete",
                "applicationinstances.vworkspace.io",
                "--all",
                "-n",
                tenant_namespace,
                "--wait=true",
                "--timeout=90s",
            ],
            None,
        )
        .await
        .map(drop),
    );
    let controllers = write_controllers_file(file);
    match &controllers {
        Ok(controllers) => {
            let stopped = kubectl(&[&DELETE_CONTROLLERS[..], &[controllers.as_str()]].concat(), None).await;
            if let Err(e) = stopped {
                note(Err(e.context(
                    "the bundle's Deployments did not stop in time; deleting their pods",
                )));
                note(delete_component_pods().await);
            }
        }
        Err(e) => note(Err(anyhow::anyhow!("listing the bundle's Deployments failed: {e:#}"))),
    }
    let file = file.to_string_lossy().into_owned();
    note(
        kubectl(&["delete", "--ignore-not-found", "--wait=false", "-f", &file], None)
            .await
            .map(drop),
    );
    note(reap_in_cluster_components().await.map(drop));
    // An ApplicationInstance whose deletion did not finish keeps the app controller's
    // finalizer, and that controller is gone now: without this, the tenant namespace would
    // stay Terminating for good.
    note(drop_app_finalizers(tenant_namespace).await);
    first_error.map_or(Ok(()), Err)
}

/// Removes the finalizers of the ApplicationInstances left in `namespace`.
async fn drop_app_finalizers(namespace: &str) -> anyhow::Result<()> {
    let names = kubectl(
        &[
            "get",
            "applicationinstances.vworkspace.io",
            "-n",
            namespace,
            "-o",
            "name",
        ],
        None,
    )
    .await?;
    for app in names.lines().filter(|n| !n.is_empty()) {
        let patch = r#"{"metadata":{"finalizers":null}}"#;
        kubectl(&["patch", app, "-n", namespace, "--type=merge", "-p", patch], None).await?;
    }
    Ok(())
}

/// Writes the Deployments of the installed `file` alone to `installed-deployments.yaml`
/// beside it, and returns its path (uninstalling removes them first).
fn write_controllers_file(file: &Path) -> anyhow::Result<String> {
    let docs = crate::yaml_documents(&std::fs::read_to_string(file)?)?;
    let deployments: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Deployment").collect();
    let controllers = file.with_file_name("installed-deployments.yaml");
    std::fs::write(&controllers, deploy::to_yaml(&deployments)?)?;
    Ok(controllers.to_string_lossy().into_owned())
}

impl Drop for InstalledBundle {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        if std::thread::panicking() && std::env::var_os("VWS_E2E_KEEP_FAILED").is_some() {
            eprintln!(
                "VWS_E2E_KEEP_FAILED: the bundle stays installed ({}); remove it with `kubectl delete -f` \
                 before `hack/cluster.sh restart-flux`",
                self.file.display()
            );
            return;
        }
        let (file, tenant_namespace) = (self.file.clone(), self.tenant_namespace.clone());
        if let Err(e) = block_on_own_thread(async move { uninstall(&file, &tenant_namespace).await }) {
            eprintln!("removing the bundle on drop: {e:#}");
        }
        forget_owner(&self.file);
    }
}

/// The file [`InstalledBundle`] writes what it installs to, in the bundle's directory.
const INSTALLED_FILE: &str = "installed.yaml";
/// Beside it while installed: `<pid> <tenant namespace>` of the test process that installed it.
const INSTALLED_OWNER_FILE: &str = "installed.owner";

/// Removes the owner file beside an installed bundle's `file`: uninstalled (or tried).
fn forget_owner(file: &Path) {
    let _ = std::fs::remove_file(file.with_file_name(INSTALLED_OWNER_FILE));
}

/// Uninstalls ([`uninstall`]) every bundle an [`InstalledBundle`] of a test process that is gone
/// left installed (a SIGKILLed bundle run: its Flux namespace, RBAC, Services and policies, not
/// only the Deployments [`reap_in_cluster_components`] finds), and returns their files. The
/// bundle's RBAC (which every suite's out-of-cluster controllers run under) is applied again
/// afterwards, as each suite applies it.
pub async fn uninstall_leftover_bundles() -> anyhow::Result<Vec<String>> {
    let root = cluster_dir().join("bundle-e2e");
    let mut done = Vec::new();
    let Ok(dirs) = std::fs::read_dir(&root) else {
        return Ok(done);
    };
    for dir in dirs.filter_map(Result::ok).map(|e| e.path()) {
        let Ok(owner) = std::fs::read_to_string(dir.join(INSTALLED_OWNER_FILE)) else {
            continue;
        };
        let mut words = owner.split_whitespace();
        let (pid, tenant_namespace) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
        if crate::setup::process_alive(pid) {
            continue;
        }
        let file = dir.join(INSTALLED_FILE);
        if file.exists() {
            // Every step runs whatever another returned (a bundled helm-controller that does
            // not stop within 180 s loses its pods without grace); what matters is below.
            if let Err(e) = uninstall(&file, tenant_namespace).await {
                eprintln!("uninstalling {} of a killed run: {e:#}", file.display());
            }
            // Its namespaces gone (not Terminating): a later suite would take a Terminating
            // `flux-system` for a bundled Flux, and could not apply the bundle's RBAC into a
            // Terminating `vworkspace-system`.
            let client = crate::client().await?;
            let docs = crate::yaml_documents(&std::fs::read_to_string(&file)?)?;
            for ns in docs.iter().filter(|d| kind(d) == "Namespace").map(name) {
                wait_namespace_usable(&client, ns, REAP_TIMEOUT).await?;
            }
            done.push(file.display().to_string());
        }
        forget_owner(&file);
    }
    if !done.is_empty() {
        deploy::apply_bundle_rbac().await?;
    }
    Ok(done)
}

/// Runs `work` to completion on a runtime of its own, on a thread of its own: a `Drop` runs
/// inside the test's runtime, which cannot be blocked on from within.
pub fn block_on_own_thread<F>(work: F) -> anyhow::Result<()>
where
    F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(work)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the cleanup thread panicked"))?
}

/// The label values (`app.kubernetes.io/part-of`) of what a bundle or the chart runs.
const COMPONENT_PART_OF: [&str; 2] = ["vworkspace-operator", "flux"];
/// The chart whose HelmReleases install the operator into the cluster.
const OPERATOR_CHART: &str = "vworkspace-operator";

/// What of ours or Flux's runs *in* the cluster, as `kind/namespace/name`: HelmReleases of
/// the operator's chart, and Deployments in `vworkspace-system` or `flux-system` or labelled
/// part of the operator or of Flux. Outside the bundle tests there is none: the suites run
/// our controllers and Flux as local processes (`hack/cluster.sh`), so anything listed here
/// was left by a bundle test and would act on every later suite's objects (a cluster-wide
/// app controller allowed one other namespace refuses them all).
pub async fn in_cluster_components() -> anyhow::Result<Vec<String>> {
    let mut found = Vec::new();
    let releases: Value = serde_json::from_str(
        &kubectl(
            &["get", "helmreleases.helm.toolkit.fluxcd.io", "-A", "-o", "json"],
            None,
        )
        .await?,
    )?;
    for hr in items(&releases) {
        if hr.pointer("/spec/chart/spec/chart").and_then(Value::as_str) == Some(OPERATOR_CHART) {
            found.push(format!("helmrelease/{}/{}", namespace(hr), name(hr)));
        }
    }
    let deployments: Value = serde_json::from_str(&kubectl(&["get", "deployments", "-A", "-o", "json"], None).await?)?;
    for dep in items(&deployments) {
        let part_of = dep
            .pointer("/metadata/labels/app.kubernetes.io~1part-of")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if [deploy::SYSTEM_NAMESPACE, FLUX_NAMESPACE].contains(&namespace(dep)) || COMPONENT_PART_OF.contains(&part_of)
        {
            found.push(format!("deployment/{}/{}", namespace(dep), name(dep)));
        }
    }
    Ok(found)
}

fn items(list: &Value) -> impl Iterator<Item = &Value> {
    list["items"].as_array().into_iter().flatten()
}

/// How long reaping may take before it reports what is still there.
const REAP_TIMEOUT: Duration = Duration::from_secs(180);

/// Removes whatever [`in_cluster_components`] lists: the operator's HelmReleases first (their
/// finalizer dropped when the uninstall does not finish in time, as nothing else would
/// reinstall it), then the Deployments, then their pods without grace; applies the release
/// ClusterRole again (their removal took it along); waits until none is left, and returns what
/// it found.
pub async fn reap_in_cluster_components() -> anyhow::Result<Vec<String>> {
    let found = in_cluster_components().await?;
    if found.is_empty() {
        return Ok(found);
    }
    let ids: Vec<(&str, &str, &str)> = found
        .iter()
        .filter_map(|id| {
            let mut parts = id.splitn(3, '/');
            Some((parts.next()?, parts.next()?, parts.next()?))
        })
        .collect();
    for (kind_, ns, name_) in &ids {
        let resource = if *kind_ == "helmrelease" {
            "helmreleases.helm.toolkit.fluxcd.io"
        } else {
            "deployments"
        };
        kubectl(
            &[
                "delete",
                resource,
                name_,
                "-n",
                ns,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        )
        .await?;
    }
    let deadline = tokio::time::Instant::now() + REAP_TIMEOUT;
    loop {
        let releases_left = in_cluster_components()
            .await?
            .into_iter()
            .filter(|id| id.starts_with("helmrelease/"))
            .count();
        if releases_left == 0 {
            break;
        }
        if tokio::time::Instant::now() + REAP_TIMEOUT / 2 >= deadline {
            for (_, ns, name_) in ids.iter().filter(|(k, _, _)| *k == "helmrelease") {
                let patch = r#"{"metadata":{"finalizers":null}}"#;
                let args = [
                    "patch",
                    "helmreleases.helm.toolkit.fluxcd.io",
                    name_,
                    "-n",
                    ns,
                    "--type=merge",
                    "-p",
                    patch,
                ];
                if let Err(e) = kubectl(&args, None).await {
                    eprintln!("dropping the finalizer of HelmRelease {ns}/{name_}: {e:#}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        if tokio::time::Instant::now() >= deadline {
            break;
        }
    }
    delete_component_pods().await?;
    // The bundle and the chart ship the release ClusterRole that the cluster's own set-up
    // applied (`hack/cluster.sh up`): removing them took it along.
    crate::setup::restore_release_role().await?;
    loop {
        let left = in_cluster_components().await?;
        let pods = component_pods().await?;
        if left.is_empty() && pods.is_empty() {
            return Ok(found);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("after {REAP_TIMEOUT:?} still in the cluster: {left:?}, pods {pods:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The label selector of what a bundle or the chart runs.
fn component_selector() -> String {
    format!("app.kubernetes.io/part-of in ({})", COMPONENT_PART_OF.join(","))
}

/// Pods of ours or Flux's in the cluster (by label, or in `vworkspace-system`/`flux-system`),
/// as `namespace/name`.
async fn component_pods() -> anyhow::Result<Vec<String>> {
    let pods: Value = serde_json::from_str(&kubectl(&["get", "pods", "-A", "-o", "json"], None).await?)?;
    Ok(items(&pods)
        .filter(|pod| {
            let part_of = pod
                .pointer("/metadata/labels/app.kubernetes.io~1part-of")
                .and_then(Value::as_str)
                .unwrap_or_default();
            [deploy::SYSTEM_NAMESPACE, FLUX_NAMESPACE].contains(&namespace(pod)) || COMPONENT_PART_OF.contains(&part_of)
        })
        .map(|pod| format!("{}/{}", namespace(pod), name(pod)))
        .collect())
}

/// Deletes the pods [`component_pods`] lists without grace (the kubelet still stops them).
async fn delete_component_pods() -> anyhow::Result<()> {
    let force = ["--ignore-not-found", "--wait=false", "--grace-period=0", "--force"];
    for ns in [deploy::SYSTEM_NAMESPACE, FLUX_NAMESPACE] {
        kubectl(&[&["delete", "pods", "--all", "-n", ns][..], &force[..]].concat(), None).await?;
    }
    let selector = component_selector();
    kubectl(
        &[&["delete", "pods", "-A", "-l", selector.as_str()][..], &force[..]].concat(),
        None,
    )
    .await?;
    Ok(())
}

/// Waits until namespace `name` is absent or not Terminating (a previous run's deletion).
pub async fn wait_namespace_usable(client: &Client, name_: &str, timeout: Duration) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let phase = api.get_opt(name_).await?.and_then(|n| n.status).and_then(|s| s.phase);
        if phase.as_deref() != Some("Terminating") {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("namespace {name_} still Terminating after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The pods a Deployment selects (by its `matchLabels`), without those being deleted.
pub async fn deployment_pods(client: &Client, dep: &Deployment) -> anyhow::Result<Vec<Pod>> {
    let ns = dep.metadata.namespace.clone().unwrap_or_default();
    let labels: BTreeMap<String, String> = dep
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    let selector = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    Ok(pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// Whether a pod is Running and Ready.
pub fn pod_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Restarts of every container of a pod, summed.
pub fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).sum())
        .unwrap_or_default()
}

/// One line per pod: node, phase, readiness, restarts and why a container waits or ended.
pub fn pods_summary(pods: &[Pod]) -> String {
    pods.iter()
        .map(|p| {
            let status = p.status.as_ref();
            let why: Vec<String> = status
                .and_then(|s| s.container_statuses.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|c| {
                    let state = c.state.as_ref()?;
                    let last = c.last_state.as_ref().and_then(|l| l.terminated.as_ref());
                    let now = state
                        .waiting
                        .as_ref()
                        .map(|w| {
                            format!(
                                "waiting {}: {}",
                                w.reason.as_deref().unwrap_or("-"),
                                w.message.as_deref().unwrap_or("")
                            )
                        })
                        .or_else(|| {
                            state
                                .terminated
                                .as_ref()
                                .map(|t| format!("terminated {} ({})", t.reason.as_deref().unwrap_or("-"), t.exit_code))
                        });
                    let before = last.map(|t| {
                        format!(
                            "last terminated {} ({}) {}",
                            t.reason.as_deref().unwrap_or("-"),
                            t.exit_code,
                            t.message.as_deref().unwrap_or("")
                        )
                    });
                    let parts: Vec<String> = now.into_iter().chain(before).collect();
                    (!parts.is_empty()).then(|| format!("{}: {}", c.name, parts.join("; ")))
                })
                .collect();
            format!(
                "{} node={} phase={} ready={} restarts={} {}",
                p.metadata.name.as_deref().unwrap_or("-"),
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("-"),
                status.and_then(|s| s.phase.as_deref()).unwrap_or("-"),
                pod_ready(p),
                restarts(p),
                why.join(" | ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n  ")
}

/// Waits until Deployment `namespace/name` is Available with every replica updated and
/// ready, and exactly its replicas' pods exist, each Running and Ready on `node` with no
/// container restart (so readiness probes pass, and liveness probes never failed).
/// Returns its pods.
pub async fn wait_available_on(
    ctx: &TestContext,
    namespace_: &str,
    name_: &str,
    node: &str,
    timeout: Duration,
) -> anyhow::Result<Vec<Pod>> {
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace_);
    let client = ctx.client.clone();
    eventually(
        ctx,
        &format!("Deployment {namespace_}/{name_} Available on {node}"),
        timeout,
        || {
            let (deployments, client) = (deployments.clone(), client.clone());
            async move {
                let Some(dep) = deployments.get_opt(name_).await? else {
                    return Ok(Err("no Deployment".to_owned()));
                };
                let want = dep.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let status = dep.status.clone().unwrap_or_default();
                let available = status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Available" && c.status == "True");
                let pods = deployment_pods(&client, &dep).await?;
                let ok = available
                    && status.updated_replicas == Some(want)
                    && status.ready_replicas == Some(want)
                    && status.replicas == Some(want)
                    && pods.len() == usize::try_from(want).unwrap_or_default()
                    && pods.iter().all(|p| {
                        pod_ready(p)
                            && restarts(p) == 0
                            && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                    });
                Ok(if ok {
                    Ok(pods)
                } else {
                    Err(format!(
                        "available={available} replicas={:?}/{want} updated={:?} ready={:?}; pods:\n  {}",
                        status.replicas,
                        status.updated_replicas,
                        status.ready_replicas,
                        pods_summary(&pods)
                    ))
                })
            }
        },
    )
    .await
}

/// The path of a pod's ServiceAccount token projected by the kubelet (`kube-api-access-*`:
/// a projected volume with a `serviceAccountToken` source, mounted at the in-cluster config
/// path), or why there is none.
pub fn projected_token_mount(pod: &Pod) -> Result<String, String> {
    let spec = pod.spec.as_ref().ok_or("no spec")?;
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| {
            v.projected
                .as_ref()
                .is_some_and(|p| p.sources.iter().flatten().any(|s| s.service_account_token.is_some()))
                && v.name.starts_with("kube-api-access-")
        })
        .ok_or("no projected kube-api-access volume with a serviceAccountToken source")?;
    let container = spec.containers.first().ok_or("no container")?;
    container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume.name)
        .map(|m| m.mount_path.clone())
        .ok_or_else(|| format!("volume {} is not mounted", volume.name))
}

/// Anything in a pod that could carry other credentials than its ServiceAccount token: a
/// `KUBECONFIG` variable, a Secret volume, or a mount whose path or volume names a kubeconfig.
pub fn other_credentials(pod: &Pod) -> Vec<String> {
    let mut found = Vec::new();
    let Some(spec) = pod.spec.as_ref() else {
        return found;
    };
    for v in spec.volumes.iter().flatten() {
        if v.secret.is_some() {
            found.push(format!("Secret volume {}", v.name));
        }
        if v.name.to_ascii_lowercase().contains("kubeconfig") {
            found.push(format!("volume {}", v.name));
        }
    }
    for c in &spec.containers {
        for e in c.env.iter().flatten() {
            if e.name == "KUBECONFIG" {
                found.push(format!("{}: env KUBECONFIG", c.name));
            }
        }
        for m in c.volume_mounts.iter().flatten() {
            if m.mount_path.to_ascii_lowercase().contains("kube/config")
                || m.mount_path.to_ascii_lowercase().contains("kubeconfig")
            {
                found.push(format!("{}: mount {}", c.name, m.mount_path));
            }
        }
    }
    found
}

/// The ids (`kind/namespace/name`) of `docs` that still exist.
pub async fn still_present(docs: &[&Value]) -> anyhow::Result<Vec<String>> {
    let client = crate::client().await?;
    let mut left = Vec::new();
    for doc in docs {
        let (ar, namespaced) = crate::api_resource_of(&client, doc).await?;
        let api: Api<kube::api::DynamicObject> = if namespaced {
            Api::namespaced_with(client.clone(), namespace(doc), &ar)
        } else {
            Api::all_with(client.clone(), &ar)
        };
        if api.get_opt(name(doc)).await?.is_some() {
            left.push(deploy::id(doc));
        }
    }
    Ok(left)
}

/// Cluster-scoped objects of `resource` (e.g. `clusterroles.rbac.authorization.k8s.io`)
/// labelled `app.kubernetes.io/part-of` one of `part_of`: `kind/name` lines.
pub async fn cluster_objects_part_of(resource: &str, part_of: &[&str]) -> anyhow::Result<Vec<String>> {
    let selector = format!("app.kubernetes.io/part-of in ({})", part_of.join(","));
    let out = kubectl(&["get", resource, "-l", &selector, "-o", "name"], None).await?;
    Ok(out.lines().map(str::to_owned).filter(|l| !l.is_empty()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_path_goes_up_then_down() {
        let root = crate::repo_root();
        let rel = relative_path(&root.join("e2e/src"), &root.join("deploy/overlays")).expect("relative");
        assert_eq!(rel, PathBuf::from("../../deploy/overlays"));
        assert_eq!(relative_path(&root, &root).expect("relative"), PathBuf::new());
    }

    #[test]
    fn url_host_strips_scheme_port_and_path() {
        assert_eq!(url_host("http://10.99.0.1:18879"), "10.99.0.1");
        assert_eq!(url_host("http://10.99.0.1:18879/charts"), "10.99.0.1");
        assert_eq!(url_host("https://charts.example.com/x"), "charts.example.com");
        assert_eq!(url_host("charts.example.com"), "charts.example.com");
    }

    #[test]
    fn kustomization_changes_placement_allow_list_and_app_controller_only() {
        let args = ["--insecure-repository-hosts=10.99.0.1".to_owned()];
        let dir = crate::repo_root().join("e2e");
        let text = kustomization(
            &dir,
            &BundleOptions {
                overlay: "full",
                node: "real-node-0",
                allowed_namespaces: "e2e-x",
                app_controller_replicas: 2,
                app_controller_args: &args,
                components: &[],
            },
        )
        .expect("kustomization");
        let k: Value = serde_saphyr::from_str(&text).expect("yaml");
        assert_eq!(k["resources"].as_array().map(Vec::len), Some(1));
        assert_eq!(k["resources"][0], "../deploy/overlays/full");
        assert_eq!(k["configMapGenerator"][0]["behavior"], "merge");
        assert_eq!(k["configMapGenerator"][0]["literals"][0], "allowed-namespaces=e2e-x");
        let placement: Value = serde_saphyr::from_str(k["patches"][0]["patch"].as_str().expect("patch")).expect("yaml");
        assert_eq!(
            placement["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"],
            "real-node-0"
        );
        let ops: Value = serde_json::from_str(k["patches"][1]["patch"].as_str().expect("patch")).expect("json");
        assert_eq!(ops[0]["value"], 2);
        assert_eq!(ops[1]["value"], "--insecure-repository-hosts=10.99.0.1");
    }
}
