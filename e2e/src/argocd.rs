//! Real Argo CD on the local cluster, started on demand (`hack/cluster.sh start-argocd`:
//! application-controller and repo-server built from the argo-cd module, Redis from Debian),
//! and helpers for tests of the argocd engine.

use anyhow::{Context as _, bail};
use kube::api::{Api, DynamicObject};
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::{TestContext, apps, dynamic_api, get_json, process::ControllerProcess, repo_root};

/// Argo CD's namespace on the local cluster; the engine writes its objects there.
pub const ARGOCD_NAMESPACE: &str = "argocd";

static STARTED: OnceCell<()> = OnceCell::const_new();

/// Starts Argo CD once per test binary (a no-op when it runs already; the script holds a
/// lock, so test binaries running side by side start it once), and applies the app
/// controller's Role in Argo CD's namespace from `deploy/components/argocd-engine`, so the
/// tests' controllers run with exactly the rights that component installs.
pub async fn require_argocd() -> anyhow::Result<()> {
    STARTED
        .get_or_try_init(|| async {
            let script = repo_root().join("hack/cluster.sh");
            let output = tokio::process::Command::new("bash")
                .arg(&script)
                .arg("start-argocd")
                .output()
                .await
                .with_context(|| format!("running {} start-argocd", script.display()))?;
            if !output.status.success() {
                bail!(
                    "hack/cluster.sh start-argocd failed ({}):\n{}{}",
                    output.status,
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            let rbac = repo_root().join("deploy/components/argocd-engine/rbac-argocd.yaml");
            let yaml = std::fs::read_to_string(&rbac).with_context(|| format!("reading {}", rbac.display()))?;
            crate::deploy::ensure_bundle_rbac().await?;
            crate::deploy::apply(&yaml, false).await?;
            Ok(())
        })
        .await
        .map(|_| ())
}

/// An app-controller for the test namespace whose default engine is Argo CD (as the
/// `argocd-engine` kustomize component configures it).
pub async fn start_controller(ctx: &TestContext, extra: &[&str]) -> anyhow::Result<ControllerProcess> {
    let mut args = vec![
        "--engines",
        "flux,argocd",
        "--default-engine",
        "argocd",
        "--argocd-namespace",
        ARGOCD_NAMESPACE,
    ];
    args.extend_from_slice(extra);
    apps::start_controller(ctx, &args).await
}

/// An Argo CD kind in Argo CD's namespace.
fn argocd_api(ctx: &TestContext, kind: &str, plural: &str) -> Api<DynamicObject> {
    dynamic_api(&ctx.client, ARGOCD_NAMESPACE, "argoproj.io", "v1alpha1", kind, plural)
}

/// Argo CD's Applications.
pub fn applications(ctx: &TestContext) -> Api<DynamicObject> {
    argocd_api(ctx, "Application", "applications")
}

/// Argo CD's AppProjects.
pub fn app_projects(ctx: &TestContext) -> Api<DynamicObject> {
    argocd_api(ctx, "AppProject", "appprojects")
}

/// The name of the Application (and AppProject) the engine writes for ApplicationInstance `app`.
pub fn object_name(ctx: &TestContext, app: &str) -> String {
    format!("{}.{app}", ctx.namespace)
}

/// The Application written for ApplicationInstance `app`, as JSON.
pub async fn application(ctx: &TestContext, app: &str) -> anyhow::Result<Option<Value>> {
    get_json(&applications(ctx), &object_name(ctx, app)).await
}
