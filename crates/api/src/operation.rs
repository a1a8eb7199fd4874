//! `Operation`: one day-2 action on an application, immutable once created.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ObjectReference, schema};

/// One day-2 action (backup, restore, snapshot, upgrade, rollback, runbook) on
/// one ApplicationInstance in the same namespace.
///
/// The spec is immutable: to change an operation, create a new one. Exactly the
/// payload matching `type` may be set.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "vworkspace.io",
    version = "v1alpha1",
    kind = "Operation",
    plural = "operations",
    singular = "operation",
    namespaced,
    status = "OperationStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "vop",
    category = "vworkspace",
    selectable = ".spec.type",
    selectable = ".spec.applicationRef.name",
    doc = "One day-2 action on an ApplicationInstance, driven through a proven controller (Velero, CSI snapshots, Flux, Jobs).",
    validation = Rule::new("self.metadata.name.size() <= 63")
        .message("metadata.name must be at most 63 characters (it names the child objects)"),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "Application", type_ = "string", json_path = ".spec.applicationRef.name"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Result", type_ = "string", priority = 1, json_path = ".status.result")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message("Operation spec is immutable; create a new Operation instead"))]
#[x_kube(validation = Rule::new("(self.type == 'Restore') == has(self.restore)").message("spec.restore must be set when type is Restore, and only then"))]
#[x_kube(validation = Rule::new("(self.type == 'Upgrade') == has(self.upgrade)").message("spec.upgrade must be set when type is Upgrade, and only then"))]
#[x_kube(validation = Rule::new("(self.type == 'Rollback') == has(self.rollback)").message("spec.rollback must be set when type is Rollback, and only then"))]
#[x_kube(validation = Rule::new("(self.type == 'Runbook') == has(self.runbook)").message("spec.runbook must be set when type is Runbook, and only then"))]
#[x_kube(validation = Rule::new("!has(self.backup) || self.type == 'Backup'").message("spec.backup is only allowed when type is Backup"))]
#[x_kube(validation = Rule::new("!has(self.snapshot) || self.type == 'Snapshot'").message("spec.snapshot is only allowed when type is Snapshot"))]
#[x_kube(validation = Rule::new("!has(self.notBefore) || !has(self.deadline) || self.deadline > self.notBefore").message("spec.deadline must be later than spec.notBefore"))]
pub struct OperationSpec {
    /// What to do.
    #[serde(rename = "type")]
    pub type_: OperationType,

    /// The ApplicationInstance (same namespace) the operation acts on.
    pub application_ref: ApplicationReference,

    /// Idempotency key from the control plane: a second Operation with the same requestId for
    /// the same application ends without acting and points at the first.
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[A-Za-z0-9]([-A-Za-z0-9_.:]*[A-Za-z0-9])?$")
    )]
    pub request_id: String,

    /// Do not start before this time; the operation waits in Pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Time>,

    /// If the operation has not started by this time it ends `Expired` and does nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Time>,

    /// Start outside the application's maintenance windows (an Upgrade, Rollback or Restore
    /// otherwise waits for the next one). Default false. Protocol 1.2.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub urgent: bool,

    /// Payload of a Backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupParams>,
    /// Payload of a Restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreParams>,
    /// Payload of a Snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotParams>,
    /// Payload of an Upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeParams>,
    /// Payload of a Rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RollbackParams>,
    /// Payload of a Runbook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runbook: Option<RunbookParams>,
}

/// Kinds of day-2 operations.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum OperationType {
    /// Velero Backup of the application's namespace and release.
    #[default]
    Backup,
    /// Velero Restore from an earlier backup.
    Restore,
    /// CSI VolumeSnapshots of the application's PVCs.
    Snapshot,
    /// Move the application to another chart version (optionally with a values patch).
    Upgrade,
    /// Return the application to an earlier revision (chart version and values).
    Rollback,
    /// Run a one-shot Job (or, later, an Argo Workflow) against the application.
    Runbook,
}

impl OperationType {
    /// Every type, in declaration order.
    pub const ALL: [OperationType; 6] = [
        OperationType::Backup,
        OperationType::Restore,
        OperationType::Snapshot,
        OperationType::Upgrade,
        OperationType::Rollback,
        OperationType::Runbook,
    ];

    /// Name as written in `spec.type` (and usable in a field selector).
    pub fn as_str(self) -> &'static str {
        match self {
            OperationType::Backup => "Backup",
            OperationType::Restore => "Restore",
            OperationType::Snapshot => "Snapshot",
            OperationType::Upgrade => "Upgrade",
            OperationType::Rollback => "Rollback",
            OperationType::Runbook => "Runbook",
        }
    }

    /// Mutating operations change the release or its data; at most one runs per application.
    pub fn is_mutating(self) -> bool {
        matches!(
            self,
            OperationType::Upgrade | OperationType::Rollback | OperationType::Restore
        )
    }
}

/// The application an operation acts on.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ApplicationReference {
    /// Name of an ApplicationInstance in the Operation's namespace.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
}

/// Backup settings (all optional).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BackupParams {
    /// How long the backup is kept (Velero `ttl`). Default: Velero's (720h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub ttl: Option<String>,
    /// Back up volume data too. Default false (resources only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_volumes: Option<bool>,
    /// How volume data is captured when `includeVolumes` is true. Default `Snapshot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_method: Option<VolumeBackupMethod>,
    /// Velero BackupStorageLocation name. Default: Velero's default location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_location: Option<String>,
}

/// How volume data is backed up.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum VolumeBackupMethod {
    /// Volume snapshots (CSI or provider snapshots).
    #[default]
    Snapshot,
    /// Velero file-system backup of pod volumes.
    FileSystem,
}

/// Restore settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.verify) || !self.verify || !has(self.targetNamespace)")
    .message("restore.verify restores into a scratch namespace of its own and cannot be combined with targetNamespace"))]
pub struct RestoreParams {
    /// The backup to restore from.
    pub source: RestoreSource,
    /// Restore volume data as well. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_volumes: Option<bool>,
    /// Restore into this namespace instead of the application's target namespace: a clone of
    /// the application's objects and volume data beside the original, which is left untouched
    /// (ADR 0010). The clone is not a release: nothing manages it until an application adopts
    /// it. Refused unless the restore engine's `--allowed-namespace-pairs` lists
    /// `<Operation namespace>=<targetNamespace>`; objects that already exist there are left
    /// as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub target_namespace: Option<String>,
    /// A verified restore: restore the backup, with its volume data, into a scratch namespace
    /// the restore engine creates, check that the copy works (its workloads become ready and
    /// the application's `spec.restoreVerification.job` succeeds), record the evidence in
    /// `status.verification`, and remove the scratch namespace. The application itself is not
    /// touched, so it does not wait for maintenance windows. Protocol 1.3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<bool>,
}

impl RestoreParams {
    /// Whether this is a verified restore into a scratch namespace (`verify: true`).
    pub fn verifies(&self) -> bool {
        self.verify == Some(true)
    }
}

/// Where a restore takes its backup from: exactly one field.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.operationName) != has(self.veleroBackupName)")
    .message("restore.source needs exactly one of operationName or veleroBackupName"))]
pub struct RestoreSource {
    /// A succeeded Backup Operation in the same namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub operation_name: Option<String>,
    /// A Velero Backup by name (in Velero's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub velero_backup_name: Option<String>,
}

/// Snapshot settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotParams {
    /// PVC names to snapshot. Default: every PVC of the application's release.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(inner(length(min = 1, max = 253)))]
    pub pvcs: Vec<String>,
    /// VolumeSnapshotClass to use. Default: the cluster's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub volume_snapshot_class_name: Option<String>,
}

/// Upgrade settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.onFailure) || self.onFailure != 'RollbackAndRestore' || (has(self.backupFirst) && self.backupFirst)")
    .message("onFailure RollbackAndRestore needs backupFirst: true"))]
#[x_kube(validation = Rule::new("!has(self.backup) || (has(self.backupFirst) && self.backupFirst)")
    .message("upgrade.backup configures the pre-upgrade backup and needs backupFirst: true"))]
pub struct UpgradeParams {
    /// Target chart version (exact version or semver range).
    #[schemars(length(min = 1, max = 256))]
    pub chart_version: String,
    /// Values merged (JSON merge patch) onto the application's values with the upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::free_form_object")]
    pub values_patch: Option<serde_json::Value>,
    /// Take a Backup Operation first, and refuse to upgrade if it fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_first: Option<bool>,
    /// Settings of the pre-upgrade Backup (with `backupFirst`), e.g. `includeVolumes: true` and
    /// `volumeMethod: FileSystem` so that `RollbackAndRestore` brings the volume data back too.
    /// Default: a Backup of the resources only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupParams>,
    /// What to do if the upgrade fails. Default `None` (the application's own remediation applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<UpgradeFailurePolicy>,
}

/// What an Upgrade does when Flux reports the new release failed.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UpgradeFailurePolicy {
    /// Leave it to the application's remediation settings.
    #[default]
    None,
    /// Return the application to the revision it had before the upgrade.
    Rollback,
    /// Roll back, then restore the pre-upgrade backup (needs `backupFirst`).
    RollbackAndRestore,
}

/// Rollback settings: at most one of `revision` or `chartVersion`; neither means the previous revision.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.revision) && has(self.chartVersion))")
    .message("rollback takes at most one of revision or chartVersion"))]
pub struct RollbackParams {
    /// Application revision number (from the application's revision history).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub revision: Option<i64>,
    /// The newest revision that deployed this chart version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub chart_version: Option<String>,
}

/// Runbook settings: exactly one of `job` or `workflowTemplateRef`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.job) != has(self.workflowTemplateRef)")
    .message("runbook needs exactly one of job or workflowTemplateRef"))]
pub struct RunbookParams {
    /// A `batch/v1` JobSpec run in the application's namespace; `backoffLimit` and
    /// `activeDeadlineSeconds` are honoured. Its pod must pass Pod Security `restricted`
    /// (absent fields get compliant defaults) and runs as the ServiceAccount
    /// `vworkspace-runbook`, which has no rights, without an API token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::free_form_object")]
    pub job: Option<serde_json::Value>,
    /// An Argo Workflows WorkflowTemplate. Accepted, but refused with `NotSupported` until an
    /// Argo engine exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_template_ref: Option<WorkflowTemplateReference>,
    /// Parameters, passed to every container of the Job as environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub parameters: BTreeMap<String, String>,
}

/// A reference to an Argo Workflows WorkflowTemplate.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowTemplateReference {
    /// Template name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// A ClusterWorkflowTemplate rather than a namespaced WorkflowTemplate.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cluster_scope: bool,
}

/// Lifecycle phase of an Operation.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum OperationPhase {
    /// Accepted, not started (waiting for `notBefore` or a maintenance window, or queued
    /// behind another operation).
    #[default]
    Pending,
    /// Started: child objects exist.
    Running,
    /// Finished successfully.
    Succeeded,
    /// Finished unsuccessfully; see conditions and `result`.
    Failed,
    /// Not started before its deadline; nothing was done.
    Expired,
}

impl OperationPhase {
    /// Name as written in `status.phase`.
    pub fn as_str(self) -> &'static str {
        match self {
            OperationPhase::Pending => "Pending",
            OperationPhase::Running => "Running",
            OperationPhase::Succeeded => "Succeeded",
            OperationPhase::Failed => "Failed",
            OperationPhase::Expired => "Expired",
        }
    }

    /// Terminal phases never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            OperationPhase::Succeeded | OperationPhase::Failed | OperationPhase::Expired
        )
    }
}

/// Observed state of an Operation, written only by its engine.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct OperationStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<OperationPhase>,
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Summary condition `Succeeded` (Unknown while pending or running); see docs/api/conditions.md.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
    /// When the operation started acting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When it reached a terminal phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Every object the operation created (Velero Backup/Restore, VolumeSnapshots, Job, child Operations).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub children: Vec<ObjectReference>,
    /// Human-readable outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// For a replayed requestId: the Operation that already carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<String>,
    /// Warnings reported by the underlying engine (e.g. Velero).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warnings: Option<i64>,
    /// Errors reported by the underlying engine (e.g. Velero).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errors: Option<i64>,
    /// The evidence of a verified restore (`restore.verify`), once it has a verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<RestoreVerificationStatus>,
}

/// The evidence of a verified restore: what was restored where, what was checked, the
/// verdict, and the removal of the scratch namespace.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RestoreVerificationStatus {
    /// The Velero Backup that was restored.
    #[schemars(length(max = 253))]
    pub backup: String,
    /// The scratch namespace the copy was restored into.
    #[schemars(length(max = 63))]
    pub scratch_namespace: String,
    /// Items Velero restored into it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items_restored: Option<i64>,
    /// Volumes whose data Velero restored (completed PodVolumeRestores).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes_restored: Option<i64>,
    /// The restored workloads that became ready, as `Kind/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub workloads_ready: Vec<String>,
    /// The verification Job that ran, when the application declares one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Whether every check passed.
    pub passed: bool,
    /// What was checked and found, for people.
    #[schemars(length(max = 4096))]
    pub message: String,
    /// Whether the scratch namespace has been removed.
    #[serde(default)]
    pub scratch_namespace_removed: bool,
}
