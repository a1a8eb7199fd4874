//! `ApplicationInstance`: one application deployed from a Helm chart.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema;

/// Desired state of one application deployed from a Helm chart.
///
/// The operator turns it into a Flux `HelmRelease` (plus the `HelmRepository`
/// or `OCIRepository` behind it) and relays Flux's conditions back verbatim.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "vworkspace.io",
    version = "v1alpha1",
    kind = "ApplicationInstance",
    plural = "applicationinstances",
    singular = "applicationinstance",
    namespaced,
    status = "ApplicationInstanceStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "ai",
    shortname = "appinstance",
    category = "vworkspace",
    doc = "One application deployed from a Helm chart through the cluster's Helm engine (Flux by default).",
    validation = Rule::new("self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')")
        .message("metadata.name must be a DNS-1123 label: at most 63 lowercase alphanumerics or '-', starting and ending with an alphanumeric"),
    printcolumn(name = "Chart", type_ = "string", json_path = ".spec.chart.name"),
    printcolumn(name = "Version", type_ = "string", description = "Deployed chart version", json_path = ".status.deployedChartVersion"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].reason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Message", type_ = "string", priority = 1, json_path = ".status.conditions[?(@.type==\"Ready\")].message")
)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationInstanceSpec {
    /// The Helm chart to deploy and where it comes from.
    pub chart: ChartSpec,

    /// Inline Helm values, merged on top of `valuesFrom`. One document for server-side apply
    /// (atomic): an apply replaces it whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::atomic_free_form_object")]
    pub values: Option<serde_json::Value>,

    /// Values taken from Secrets or ConfigMaps in the same namespace, merged in list order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub values_from: Vec<ValuesReference>,

    /// Helm release name. Default: `[<targetNamespace>-]<metadata.name>`, as Flux composes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 53), regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub release_name: Option<String>,

    /// Namespace the chart is installed into. Default: the ApplicationInstance's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub target_namespace: Option<String>,

    /// How often the engine re-checks the release. Default `10m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub interval: Option<String>,

    /// Timeout for each Kubernetes operation of a Helm action (hooks, waits). Default `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub timeout: Option<String>,

    /// Stop reconciling the release (the engine keeps what is deployed). Deleting a suspended
    /// ApplicationInstance leaves the Helm release installed: Flux does not uninstall a suspended HelmRelease.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,

    /// Other ApplicationInstances that must be Ready before this one is installed or upgraded. Nothing is
    /// materialised while one of them does not exist (`DependencyNotFound`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub depends_on: Vec<ApplicationDependency>,

    /// ServiceAccount the engine impersonates to apply the release. Flux looks it up in the HelmRelease's
    /// namespace, which is this ApplicationInstance's namespace, not the target namespace. Unset:
    /// `vworkspace-release`, which the app controller creates and binds to namespace-scoped rights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub service_account_name: Option<String>,

    /// What to do when an install fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<ReleaseActionSpec>,

    /// What to do when an upgrade fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<ReleaseActionSpec>,

    /// Detect (and optionally correct) changes made to the release's objects outside Helm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift_detection: Option<DriftDetection>,

    /// Run the chart's Helm tests (its `helm.sh/hook: test` hooks) after every install and
    /// upgrade. Present: enabled (unless `enable: false`). The hooks run as any template of the
    /// chart does, as the release's ServiceAccount. Protocol 1.5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<ReleaseTest>,

    /// Helm engine that materialises this application. Default: the app controller's `--default-engine`
    /// (`flux`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineKind>,

    /// Back the application up on a schedule, with retention (ADR 0008). Each run is a Backup
    /// Operation the backup engine creates in this namespace; protocol 1.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_schedule: Option<crate::schedule::BackupSchedule>,

    /// Weekly windows in which the application may be changed (ADR 0009). Outside them its
    /// Upgrade, Rollback and Restore Operations wait unless `urgent`, and a chart version change
    /// is held until the next window opens. Empty: always open. Protocol 1.2.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub maintenance_windows: Vec<crate::maintenance::MaintenanceWindow>,

    /// How a verified restore (an Operation with `restore.verify`) checks a copy of this
    /// application restored into a scratch namespace. Without it, the check is that every
    /// restored Deployment and StatefulSet becomes ready. Protocol 1.3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_verification: Option<RestoreVerification>,
}

/// The checks of a verified restore, run in the scratch namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RestoreVerification {
    /// How long, after Velero finished, the restored workloads may take to become ready and
    /// the Job to finish. Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30, max = 86400))]
    pub timeout_seconds: Option<i64>,
    /// A `batch/v1` JobSpec run in the scratch namespace once the restored workloads are ready,
    /// e.g. checking the restored data or calling the copy's Service. It succeeds or fails the
    /// verification. Its pod must pass Pod Security `restricted` (absent fields get compliant
    /// defaults) and runs as the rightless ServiceAccount `vworkspace-runbook` without an API
    /// token; it may mount the restored claims by name. Every container gets
    /// `VWS_VERIFY_NAMESPACE` (the scratch namespace), `VWS_SOURCE_NAMESPACE` and
    /// `VWS_BACKUP_NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::free_form_object")]
    pub job: Option<serde_json::Value>,
}

impl RestoreVerification {
    /// The timeout when none is given.
    pub const DEFAULT_TIMEOUT_SECONDS: i64 = 600;

    /// `timeoutSeconds`, or the default.
    pub fn timeout_seconds(&self) -> i64 {
        self.timeout_seconds.unwrap_or(Self::DEFAULT_TIMEOUT_SECONDS)
    }
}

/// The chart and its source: exactly one of `repository` or `sourceRef`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.repository) != has(self.sourceRef)")
    .message("exactly one of chart.repository or chart.sourceRef must be set"))]
#[x_kube(validation = Rule::new("!has(self.sourceRef) || !(self.sourceRef.kind in ['OCIRepository', 'HelmChart']) || !has(self.version) || self.version == '*'")
    .message("chart.version cannot be set with an OCIRepository or HelmChart sourceRef: the source pins the version"))]
pub struct ChartSpec {
    /// Chart name in the repository (ignored for OCI repositories, whose URL names the chart).
    #[schemars(length(min = 1, max = 2048))]
    pub name: String,

    /// Exact version or semver range (e.g. `6.2.1`, `~6.2`, `>=6.0.0 <7.0.0`). Default `*` (latest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub version: Option<String>,

    /// A repository the operator manages a Flux source for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<ChartRepository>,

    /// An existing Flux source object to take the chart from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ref: Option<SourceReference>,
}

/// A chart repository: `http(s)://` becomes a Flux HelmRepository, `oci://` an OCIRepository.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ChartRepository {
    /// Repository URL: `https://charts.example.com` or `oci://registry.example.com/charts/app`.
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^(https?|oci)://[^\s]+$"))]
    pub url: String,

    /// Secret (same namespace) with credentials: `username`/`password`, or a docker config for OCI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalObjectReference>,

    /// Secret (same namespace) with a TLS client certificate and/or CA: `tls.crt`, `tls.key`, `ca.crt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_secret_ref: Option<LocalObjectReference>,

    /// How often the repository is re-fetched. Default `1h` (`5m` for OCI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub interval: Option<String>,
}

/// A reference to an existing Flux source object.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SourceReference {
    /// Kind of the Flux source.
    pub kind: SourceKind,
    /// Name of the source object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace of the source object. Default: the ApplicationInstance's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub namespace: Option<String>,
}

/// Flux source kinds a chart can come from.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SourceKind {
    /// `source.toolkit.fluxcd.io/v1` HelmRepository (chart name and version resolved by Flux).
    #[default]
    HelmRepository,
    /// `source.toolkit.fluxcd.io/v1` GitRepository (chart is a path in the repository).
    GitRepository,
    /// `source.toolkit.fluxcd.io/v1` Bucket.
    Bucket,
    /// `source.toolkit.fluxcd.io/v1` OCIRepository (pins one chart artifact).
    #[serde(rename = "OCIRepository")]
    OciRepository,
    /// `source.toolkit.fluxcd.io/v1` HelmChart (pins one chart artifact).
    HelmChart,
}

/// A reference to an object in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct LocalObjectReference {
    /// Object name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A Secret or ConfigMap holding Helm values.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ValuesReference {
    /// `Secret` or `ConfigMap`.
    pub kind: ValuesSourceKind,
    /// Object name, in the ApplicationInstance's namespace.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
    /// Data key holding the values. Default `values.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253), regex(pattern = r"^[\-._a-zA-Z0-9]+$"))]
    pub values_key: Option<String>,
    /// Where to put a single value, in `helm --set` path syntax (e.g. `auth.password`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 250), regex(pattern = r"^([a-zA-Z0-9_\-.\\\/]|\[[0-9]{1,5}\])+$"))]
    pub target_path: Option<String>,
    /// Tolerate a missing object (a missing key is still an error).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// Kinds of values sources.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ValuesSourceKind {
    /// A core/v1 Secret.
    #[default]
    Secret,
    /// A core/v1 ConfigMap.
    ConfigMap,
}

/// Another ApplicationInstance this one depends on.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ApplicationDependency {
    /// Name of the ApplicationInstance.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// Its namespace. Default: this ApplicationInstance's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub namespace: Option<String>,
}

/// Failure handling of one Helm action (install or upgrade).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseActionSpec {
    /// Remediation of a failed action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation: Option<Remediation>,
}

/// How a failed install or upgrade is remediated.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.retryInterval) || (has(self.strategy) && self.strategy == 'retry')")
    .message("retryInterval is only allowed with strategy retry"))]
pub struct Remediation {
    /// How many times to retry with strategy `rollback`. Default 0; a negative value retries forever.
    /// Ignored by Flux with strategy `retry`, which retries without limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = -1, max = 100))]
    pub retries: Option<i32>,
    /// `rollback` (default): remediate (roll an upgrade back; uninstall a failed install) then retry.
    /// `retry`: leave the failed release in place and retry every `retryInterval`, without limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<RemediationStrategy>,
    /// Wait between retries with strategy `retry`. Default `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub retry_interval: Option<String>,
}

/// Remediation strategies.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum RemediationStrategy {
    /// Roll back (upgrade) or uninstall (install), then retry.
    #[default]
    Rollback,
    /// Retry without remediating, without limit (`retries` is ignored).
    Retry,
}

/// Helm tests after an install or upgrade (Flux's `spec.test`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseTest {
    /// Run the tests. Default `true`: setting `spec.test` is what enables them; `false` keeps
    /// the settings without running any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    /// A failed test only reports `TestSuccess=False`: the application stays `Ready` and nothing
    /// is remediated. Default `false`: a failed test makes `Ready=False` (reason `TestFailed`) and
    /// counts as a failure of the install or upgrade it followed, for its remediation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_failures: bool,
    /// Timeout for each Kubernetes operation of the test action (each test hook). Default:
    /// `spec.timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub timeout: Option<String>,
}

impl ReleaseTest {
    /// Whether the tests run (`enable` defaults to true).
    pub fn enabled(&self) -> bool {
        self.enable.unwrap_or(true)
    }
}

/// Drift detection settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct DriftDetection {
    /// `enabled` corrects drift, `warn` only reports it, `disabled` (default) ignores it.
    #[serde(default)]
    pub mode: DriftDetectionMode,
}

/// Drift detection modes (Flux's).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum DriftDetectionMode {
    /// Detect and correct drift.
    Enabled,
    /// Detect and report drift only.
    Warn,
    /// Do not detect drift.
    #[default]
    Disabled,
}

/// Helm engines an ApplicationInstance can be materialised by.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// Flux helm-controller (`HelmRelease`), the default.
    #[default]
    Flux,
    /// Argo CD (`Application` in Argo CD's namespace, ADR 0012). Refused with `EngineUnavailable` unless the app
    /// controller drives it (`--engines`).
    Argocd,
}

impl EngineKind {
    /// Name as written in the spec and status.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Flux => "flux",
            EngineKind::Argocd => "argocd",
        }
    }
}

/// Observed state, written by the app controller, except `backupSchedule` (the backup engine's).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationInstanceStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`, `Reconciling`, `Stalled`, the relayed engine conditions (`Released`,
    /// `TestSuccess`, `Remediated`, `Drifted`) and `SourceReady` (present only while a chart
    /// source failed). See docs/api/conditions.md.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,

    /// Engine in use (`flux`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,

    /// The object the engine reconciles (the Flux HelmRelease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_ref: Option<ObjectReference>,

    /// Chart version currently deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployed_chart_version: Option<String>,

    /// App version of the deployed chart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_version: Option<String>,

    /// Chart revision of the last release attempt (`<version>[+<digest>]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempted_revision: Option<String>,

    /// The most recent Helm releases, newest first (at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub history: Vec<ReleaseRecord>,

    /// The backup schedule's last and next runs and kept backups; written by the backup engine
    /// (its own field manager), not by the app controller (ADR 0008).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_schedule: Option<crate::schedule::BackupScheduleStatus>,
}

/// One Helm release revision as reported by the engine.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseRecord {
    /// Helm release revision number.
    pub revision: i64,
    /// Chart name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart_name: Option<String>,
    /// Chart version.
    pub chart_version: String,
    /// App version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_version: Option<String>,
    /// Helm status: `deployed`, `superseded`, `failed`, `pending-*`, `uninstalled`.
    pub status: String,
    /// When this revision was last deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployed_at: Option<Time>,
}

/// A reference to any Kubernetes object.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, Hash, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    /// `group/version` of the object.
    pub api_version: String,
    /// Kind of the object.
    pub kind: String,
    /// Name of the object.
    pub name: String,
    /// Namespace of the object (empty for cluster-scoped objects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

impl ApplicationInstanceSpec {
    /// Namespace the release is installed into.
    pub fn target_namespace_or<'a>(&'a self, own_namespace: &'a str) -> &'a str {
        self.target_namespace.as_deref().unwrap_or(own_namespace)
    }

    /// Every namespace the spec reaches besides `own_namespace`, with the field that names it
    /// (`spec.targetNamespace`, `spec.chart.sourceRef.namespace`, `spec.dependsOn[i].namespace`).
    /// One tenant's app must not reach another tenant's namespace: the app controller refuses
    /// these unless a cluster administrator allowed the pair.
    pub fn foreign_namespaces<'a>(&'a self, own_namespace: &str) -> Vec<(String, &'a str)> {
        let mut out = Vec::new();
        if let Some(ns) = self.target_namespace.as_deref() {
            out.push(("spec.targetNamespace".to_owned(), ns));
        }
        if let Some(ns) = self.chart.source_ref.as_ref().and_then(|r| r.namespace.as_deref()) {
            out.push(("spec.chart.sourceRef.namespace".to_owned(), ns));
        }
        for (i, dep) in self.depends_on.iter().enumerate() {
            if let Some(ns) = dep.namespace.as_deref() {
                out.push((format!("spec.dependsOn[{i}].namespace"), ns));
            }
        }
        out.retain(|(_, ns)| *ns != own_namespace);
        out
    }
}
