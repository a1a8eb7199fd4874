//! End-to-end test harness for the real local cluster started by
//! `hack/cluster.sh up` (see docs/development/local-cluster.md).
//!
//! Every test gets a fresh namespace, waits with clear timeout messages, and on
//! a timeout dumps the objects involved, the namespace's events and the tail of
//! the relevant controller logs. Tests refuse to run outside the cluster's
//! loopback-only network namespace, so no test can reach anything but 127.0.0.1.

#![warn(missing_docs)]

use std::{
    fmt::Debug,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::{Event, Namespace};
use kube::{
    Api, Client, Config, Resource, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    core::{ApiResource, GroupVersionKind},
    discovery,
};
use serde::{Serialize, de::DeserializeOwned};

pub mod agent;
pub mod apps;
pub mod argocd;
pub mod bench;
pub mod bundle;
pub mod deploy;
pub mod flux;
pub mod odoo;
pub mod ops;
pub mod peer;
pub mod process;
pub mod real_node;
pub mod setup;
pub mod sources;

/// Field manager for objects the tests write.
pub const FIELD_MANAGER: &str = "vws-e2e";
/// The local chart repository served by `hack/cluster.sh` inside the netns.
pub const CHART_REPO: &str = "http://127.0.0.1:18879";

/// Repository root (the workspace), from this crate's manifest dir.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_path_buf()
}

/// Runtime directory of the local cluster (certs, kubeconfig, logs).
pub fn cluster_dir() -> PathBuf {
    std::env::var_os("VWS_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/e2e-cluster"))
}

/// The real node's bridge in the cluster's network namespace (hack/node.sh).
pub const NODE_BRIDGE: &str = "vwsbr0";

/// Tests must only ever reach what runs on this machine: refuse to run unless
/// the network namespace is the cluster's (true inside `hack/cluster.sh exec`).
/// Its interfaces are `lo`, the real node's bridge and the veths of that node's
/// pods (each enslaved to the bridge), and it has no default route.
pub fn assert_loopback_only() {
    let ifaces: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let foreign: Vec<&String> = ifaces
        .iter()
        .filter(|name| !is_contained_interface(name) && interface_still_exists(name))
        .collect();
    let has_default_route = std::fs::read_to_string("/proc/net/route")
        .map(|routes| {
            routes
                .lines()
                .skip(1)
                .any(|l| l.split_whitespace().nth(1) == Some("00000000"))
        })
        .unwrap_or(true);
    assert!(
        ifaces.iter().any(|i| i == "lo") && foreign.is_empty() && !has_default_route,
        "e2e tests run only inside the cluster's network namespace: lo, {NODE_BRIDGE} and its veths, no default route \
         (found interfaces {ifaces:?}, default route: {has_default_route}); \
         use `just e2e` or `hack/cluster.sh exec cargo test -p e2e`"
    );
}

/// A pod's veth may go between listing the interfaces and reading its master
/// (a pod terminating while a test starts): one that is gone is not foreign.
fn interface_still_exists(name: &str) -> bool {
    std::path::Path::new("/sys/class/net").join(name).exists()
}

fn is_contained_interface(name: &str) -> bool {
    if name == "lo" || name == NODE_BRIDGE {
        return true;
    }
    let master = std::fs::read_link(format!("/sys/class/net/{name}/master")).ok();
    name.starts_with("veth") && master.is_some_and(|m| m.file_name().is_some_and(|f| f == NODE_BRIDGE))
}

/// A client for the local cluster's admin user.
pub async fn client() -> anyhow::Result<Client> {
    let path = std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| cluster_dir().join("admin.kubeconfig"));
    let kubeconfig = Kubeconfig::read_from(&path)
        .with_context(|| format!("reading kubeconfig {} (is the cluster up?)", path.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

static NAMESPACE_COUNTER: AtomicU32 = AtomicU32::new(0);

/// Set once a test process has checked the cluster's set-up ([`setup::ensure_cluster_setup`]).
static SETUP_CHECKED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// The check at the start of every suite (test binary), once per process: nothing of ours or
/// Flux's runs *in* the cluster, and what `hack/cluster.sh up` set up is there
/// ([`setup::ensure_cluster_setup`]). What an earlier suite left (once, a bundled app controller
/// allowed one namespace refused every later suite's apps) is put back and named on stderr.
async fn ensure_nothing_foreign() -> anyhow::Result<()> {
    SETUP_CHECKED
        .get_or_try_init(|| async {
            let restored = setup::ensure_cluster_setup().await?;
            if !restored.is_empty() {
                eprintln!("e2e: an earlier suite left the cluster changed; put back first: {restored:?}");
            }
            anyhow::Ok(())
        })
        .await?;
    Ok(())
}

/// One test's world: a client and a fresh namespace that is deleted on drop.
pub struct TestContext {
    /// A client for the local cluster, with its admin kubeconfig.
    pub client: Client,
    /// This test's namespace, `e2e-<prefix>-<unique>`; every object of the test goes here.
    pub namespace: String,
    keep: bool,
}

impl TestContext {
    /// Connects and creates namespace `e2e-<prefix>-<unique>`.
    pub async fn new(prefix: &str) -> anyhow::Result<Self> {
        assert_loopback_only();
        ensure_nothing_foreign().await?;
        let client = client().await?;
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.subsec_nanos();
        let n = NAMESPACE_COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut prefix: String = prefix
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(30)
            .collect();
        prefix.make_ascii_lowercase();
        let namespace = format!("e2e-{prefix}-{:x}{n}", nanos % 0xfffff);
        create_namespace(&client, &namespace).await?;
        let keep = std::env::var_os("VWS_E2E_KEEP_NAMESPACES").is_some();
        Ok(Self {
            client,
            namespace,
            keep,
        })
    }

    /// The scope of the processes this test starts ([`process::ControllerProcess::start`]):
    /// its waits fail when one of them exits unexpectedly, other tests' waits do not.
    pub fn process_scope(&self) -> &str {
        &self.namespace
    }

    /// A typed API in the test namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Server-side applies a typed object into the test namespace.
    pub async fn apply<K>(&self, obj: &K) -> anyhow::Result<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope> + Clone + DeserializeOwned + Serialize + Debug,
        <K as Resource>::DynamicType: Default,
    {
        let name = obj.meta().name.clone().context("object without a name")?;
        Ok(self
            .api::<K>()
            .patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(obj))
            .await?)
    }

    /// Server-side applies a multi-document YAML string into the test namespace.
    pub async fn apply_yaml(&self, yaml: &str) -> anyhow::Result<Vec<DynamicObject>> {
        let mut out = Vec::new();
        for doc in yaml_documents(yaml)? {
            out.push(apply_dynamic(&self.client, &self.namespace, doc).await?);
        }
        Ok(out)
    }

    /// Namespace events and the tail of every controller log, for failure messages.
    pub async fn diagnostics(&self) -> String {
        let mut out = String::new();
        let events: Api<Event> = self.api();
        if let Ok(list) = events.list(&ListParams::default()).await {
            out.push_str(&format!("--- events in {} ---\n", self.namespace));
            for e in list.items.iter().rev().take(40).rev() {
                let obj = &e.involved_object;
                out.push_str(&format!(
                    "{} {}/{}: {} {}\n",
                    e.type_.as_deref().unwrap_or("-"),
                    obj.kind.as_deref().unwrap_or("-"),
                    obj.name.as_deref().unwrap_or("-"),
                    e.reason.as_deref().unwrap_or("-"),
                    e.message.as_deref().unwrap_or("-")
                ));
            }
        }
        let own = cluster_dir().join(format!("logs/app-controller-{}.log", self.namespace));
        if own.exists() {
            out.push_str("--- tail of this test's app-controller log ---\n");
            out.push_str(&log_tail(&own, 30, None));
        }
        for log in ["helm-controller", "source-controller"] {
            out.push_str(&format!(
                "--- tail of {log} log (lines naming {}) ---\n",
                self.namespace
            ));
            out.push_str(&log_tail(
                &cluster_dir().join(format!("logs/{log}.log")),
                20,
                Some(&self.namespace),
            ));
        }
        out
    }
}

impl Drop for TestContext {
    fn drop(&mut self) {
        if self.keep || std::thread::panicking() && std::env::var_os("VWS_E2E_KEEP_FAILED").is_some() {
            eprintln!("keeping namespace {}", self.namespace);
            return;
        }
        // Deletion is asynchronous on the server. Use a fresh runtime *and client*: the test's
        // client drives its connection on the test runtime, which is blocked in this Drop.
        let ns = self.namespace.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(rt) = rt {
                rt.block_on(async move {
                    if let Ok(client) = client().await {
                        let _ = Api::<Namespace>::all(client)
                            .delete(&ns, &DeleteParams::background())
                            .await;
                    }
                });
            }
        })
        .join();
    }
}

async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"vworkspace.io/e2e": "true"}}
    }))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

/// Splits a multi-document YAML string into JSON values (empty documents skipped).
pub fn yaml_documents(yaml: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(yaml)?;
    Ok(docs.into_iter().filter(|value| !value.is_null()).collect())
}

/// Resolves the API resource of a JSON object through discovery.
pub async fn api_resource_of(client: &Client, value: &serde_json::Value) -> anyhow::Result<(ApiResource, bool)> {
    let api_version = value["apiVersion"].as_str().context("object without apiVersion")?;
    let kind = value["kind"].as_str().context("object without kind")?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (ar, caps) = discovery::pinned_kind(client, &gvk).await?;
    Ok((ar, caps.scope == discovery::Scope::Namespaced))
}

/// Server-side applies one object (namespaced objects go into `namespace`).
pub async fn apply_dynamic(
    client: &Client,
    namespace: &str,
    value: serde_json::Value,
) -> anyhow::Result<DynamicObject> {
    let (ar, namespaced) = api_resource_of(client, &value).await?;
    let mut obj: DynamicObject = serde_json::from_value(value)?;
    let name = obj.name_any();
    let api: Api<DynamicObject> = if namespaced {
        obj.metadata.namespace = Some(namespace.to_string());
        Api::namespaced_with(client.clone(), namespace, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    };
    Ok(api
        .patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&obj))
        .await?)
}

/// Waits until the namespaced object `name` exists and `check` accepts it; on timeout the
/// last `summary` of it is in the error.
pub async fn wait_object<K>(
    ctx: &TestContext,
    name: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&K) -> bool,
    summary: impl Fn(&K) -> String,
) -> anyhow::Result<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let api = ctx.api::<K>();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    eventually(ctx, &format!("{kind} {name}: {what}"), timeout, || {
        let api = api.clone();
        let (check, summary) = (&check, &summary);
        async move {
            Ok(match api.get_opt(name).await? {
                Some(object) if check(&object) => Ok(object),
                Some(object) => Err(summary(&object)),
                None => Err("not found".into()),
            })
        }
    })
    .await
}

/// Polls `probe` until it returns `Some`, or fails after `timeout` with `what`, the last
/// observed state and the test context's diagnostics. Fails at once, with its log, when a
/// process the test started (scope: its namespace) has exited while nobody stopped it:
/// waiting on would only end in a timeout that hides why.
pub async fn eventually<T, F, Fut>(ctx: &TestContext, what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Result<T, String>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last;
    loop {
        match probe().await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(state)) => last = state,
            Err(e) => last = format!("error: {e:#}"),
        }
        if let Err(exited) = process::check_exits(Some(ctx.process_scope()), what) {
            bail!("{exited}\nlast observed: {last}\n{}", ctx.diagnostics().await);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "timed out after {timeout:?} waiting for {what}\nlast observed: {last}\n{}",
                ctx.diagnostics().await
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The `status.conditions[type]` of a JSON object as (status, reason, message).
pub fn condition(obj: &serde_json::Value, type_: &str) -> Option<(String, String, String)> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
                c["message"].as_str().unwrap_or_default().to_string(),
            )
        })
}

/// Compact one-line view of an object's conditions, for "last observed" messages.
pub fn conditions_summary(obj: &serde_json::Value) -> String {
    let generation = obj
        .pointer("/metadata/generation")
        .and_then(|g| g.as_i64())
        .unwrap_or(-1);
    let observed = obj
        .pointer("/status/observedGeneration")
        .and_then(|g| g.as_i64())
        .unwrap_or(-1);
    let conds = obj
        .pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .map(|cs| {
            cs.iter()
                .map(|c| format!("{}={}({}: {})", c["type"], c["status"], c["reason"], c["message"]))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    format!("generation {generation}, observedGeneration {observed}, conditions [{conds}]")
}

/// The last `n` lines of a log file (optionally only lines containing `filter`).
pub fn log_tail(path: &Path, n: usize, filter: Option<&str>) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return format!("(no log at {})\n", path.display());
    };
    let lines: Vec<&str> = text.lines().filter(|l| filter.is_none_or(|f| l.contains(f))).collect();
    let start = lines.len().saturating_sub(n);
    let mut out = lines[start..].join("\n");
    out.push('\n');
    out
}

/// Dynamic API for a group/version/kind in a namespace.
pub fn dynamic_api(
    client: &Client,
    namespace: &str,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Api::namespaced_with(client.clone(), namespace, &ar)
}

/// Fetches an object as JSON (None if absent).
pub async fn get_json(api: &Api<DynamicObject>, name: &str) -> anyhow::Result<Option<serde_json::Value>> {
    Ok(api.get_opt(name).await?.map(serde_json::to_value).transpose()?)
}
