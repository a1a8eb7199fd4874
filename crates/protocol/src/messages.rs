//! The messages of the protocol: parameters and results of `agent_register` and
//! `agent_sync`, the desired-state document, acknowledgements and status reports.
//!
//! Every optional field may be absent; receivers ignore fields they do not know
//! (forward compatibility within a MAJOR version, see [`crate::version`]). What the agent
//! reads from Odoo also takes Odoo's own forms (offset-less UTC timestamps, `false` for an
//! empty field), through the helpers of [`crate::odoo_compat`].

use api::{ApplicationInstanceSpec, OperationSpec};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{odoo_compat, version::ProtocolVersion};

/// Who the cluster is. `uid` is stable for the life of the cluster: the UID of its
/// `kube-system` namespace. `name` is for humans and may change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterIdentity {
    /// The `kube-system` namespace's `metadata.uid`.
    pub uid: String,
    /// Human name given by the cluster owner (`--cluster-name`).
    pub name: String,
}

/// How the agent receives intent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AgentMode {
    /// The agent calls Odoo (outbound HTTPS only). The default.
    #[default]
    Pull,
    /// Odoo calls the agent (opt-in; the same document and acknowledgements).
    Push,
    /// A mode this version does not know.
    #[serde(other)]
    Unknown,
}

/// The agent process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// Agent software version (`0.1.0`).
    pub version: String,
    /// This process: pod name, or `<host>-<pid>`. A new value means the agent restarted.
    pub instance: String,
    /// Pull or push.
    #[serde(default)]
    pub mode: AgentMode,
    /// When this process started.
    pub started_at: Timestamp,
}

/// `vworkspace.cluster/agent_register` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegisterParams {
    /// The agent's protocol version.
    pub protocol_version: ProtocolVersion,
    /// The cluster.
    pub cluster: ClusterIdentity,
    /// The agent.
    pub agent: AgentInfo,
    /// The cluster owner's namespace allow-list, enforced by the agent: `["*"]` for all.
    /// Informational for Odoo (to warn before sending intent that will be refused).
    pub allowed_namespaces: Vec<String>,
    /// Optional features the agent supports (e.g. `conflict_report`, `status_channel`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
}

/// `vworkspace.cluster/agent_register` result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegisterResult {
    /// Odoo's protocol version.
    pub protocol_version: ProtocolVersion,
    /// Odoo's record id of the cluster (`vworkspace.cluster` id), for logs.
    pub cluster_id: i64,
    /// Odoo's clock, to spot clock skew.
    #[serde(deserialize_with = "odoo_compat::timestamp")]
    pub server_time: Timestamp,
    /// Suggested sync interval; the agent uses it when it lies within 5 s and 1 h.
    #[serde(
        default,
        deserialize_with = "odoo_compat::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub sync_interval_seconds: Option<u32>,
    /// Largest number of reports Odoo accepts in one sync; the agent sends at most that
    /// many (and at most its own limit).
    #[serde(
        default,
        deserialize_with = "odoo_compat::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_reports_per_sync: Option<u32>,
}

/// Position in Odoo's sequence of desired-state documents for one cluster.
///
/// `epoch` names the sequence (Odoo creates a new one when the cluster record is
/// created or its data was restored from a backup); `revision` increases by at least one
/// every time the desired state changes within an epoch.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cursor {
    /// Sequence identifier (1 to 64 characters of `[A-Za-z0-9._-]`).
    pub epoch: String,
    /// Revision within the epoch, from 1.
    pub revision: u64,
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.epoch, self.revision)
    }
}

/// Kinds of objects the protocol manages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ObjectKind {
    /// `vworkspace.io/v1alpha1` ApplicationInstance.
    ApplicationInstance,
    /// `vworkspace.io/v1alpha1` Operation.
    Operation,
}

impl ObjectKind {
    /// The kind as written in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ApplicationInstance => "ApplicationInstance",
            Self::Operation => "Operation",
        }
    }
}

/// `kind/namespace/name` of one object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Kind.
    pub kind: ObjectKind,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

/// One desired ApplicationInstance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApplicationIntent {
    /// Namespace of the ApplicationInstance.
    pub namespace: String,
    /// Name of the ApplicationInstance (DNS-1123 label).
    pub name: String,
    /// Its spec, verbatim (`docs/api/application-instance.md`, camelCase fields).
    pub spec: ApplicationInstanceSpec,
}

/// One desired Operation. Operations are immutable: applied once, never changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperationIntent {
    /// Namespace of the Operation (the application's).
    pub namespace: String,
    /// Name of the Operation (at most 63 characters).
    pub name: String,
    /// Its spec, verbatim (`docs/api/operation.md`): `requestId`, `notBefore`, `deadline`…
    pub spec: OperationSpec,
}

/// An explicit request to delete one object. Absence from the document never deletes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletionIntent {
    /// Kind of the object.
    pub kind: ObjectKind,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Delete only the object with this UID (from an earlier report); a recreated object
    /// of the same name is then left alone.
    #[serde(
        default,
        deserialize_with = "odoo_compat::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub uid: Option<String>,
    /// Why, for the audit trail (kept in logs and the acknowledgement).
    #[serde(
        default,
        deserialize_with = "odoo_compat::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub reason: Option<String>,
}

/// The desired state of one cluster at one revision.
///
/// Applications and operations are upserts: the agent applies each one. Anything not
/// listed is left alone: an empty or partial document never deletes. Deletion happens
/// only through [`DesiredState::deletions`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DesiredState {
    /// Sequence identifier.
    pub epoch: String,
    /// Revision within the epoch.
    pub revision: u64,
    /// When Odoo built this document.
    #[serde(
        default,
        deserialize_with = "odoo_compat::option_timestamp",
        skip_serializing_if = "Option::is_none"
    )]
    pub generated_at: Option<Timestamp>,
    /// Desired ApplicationInstances.
    #[serde(default, deserialize_with = "odoo_compat::or_default")]
    pub applications: Vec<ApplicationIntent>,
    /// Desired Operations.
    #[serde(default, deserialize_with = "odoo_compat::or_default")]
    pub operations: Vec<OperationIntent>,
    /// Explicit deletions.
    #[serde(default, deserialize_with = "odoo_compat::or_default")]
    pub deletions: Vec<DeletionIntent>,
}

impl DesiredState {
    /// The document's cursor.
    pub fn cursor(&self) -> Cursor {
        Cursor {
            epoch: self.epoch.clone(),
            revision: self.revision,
        }
    }
}

/// What the agent did with a whole document.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DocumentOutcome {
    /// Every object was applied (or was already as desired, or was refused for a
    /// per-object reason listed in `objects`). The revision is done.
    Applied,
    /// Some objects failed for a transient reason (`outcome: failed`); the agent retries
    /// the same revision at its next sync.
    Incomplete,
    /// The document was rejected as a whole (`reason`, `message`) and nothing was
    /// applied, e.g. it failed validation.
    Refused,
    /// An outcome this version does not know.
    #[serde(other)]
    Unknown,
}

/// What the agent did with one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectOutcome {
    /// Written (created or changed) by server-side apply.
    Applied,
    /// Already as desired; nothing written.
    Unchanged,
    /// Applied without `spec.chart.version` and `spec.values`, which an Operation now
    /// owns (ADR 0004); see `conflict`.
    Conflict,
    /// Deleted by a deletion intent.
    Deleted,
    /// A deletion intent for an object that does not exist: nothing to do.
    Absent,
    /// Not applied for a reason that will not go away by retrying (`reason`, `message`).
    Refused,
    /// Not applied for a transient reason (API server unavailable); retried.
    Failed,
    /// An outcome this version does not know.
    #[serde(other)]
    Unknown,
}

/// The fields an Operation took over, and what is in force now (ADR 0004).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct ConflictReport {
    /// The conflicting fields, e.g. `spec.chart.version`, `spec.values`.
    pub fields: Vec<String>,
    /// The field managers that own them now (e.g. `vworkspace-upgrade-engine`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub managers: Vec<String>,
    /// `spec.chart.version` in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart_version_in_force: Option<String>,
    /// `spec.values` in force (Odoo's own data, sent back so it can update its intent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values_in_force: Option<Value>,
    /// The application revision in effect (from the revision history `<app>-revisions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_in_effect: Option<i64>,
    /// The Operation that applied that revision, if recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
}

/// Acknowledgement of one object of a document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObjectAck {
    /// Kind.
    pub kind: ObjectKind,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Outcome.
    pub outcome: ObjectOutcome,
    /// Stable reason code for `refused`, `failed` and `conflict` (see [`reasons`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// UID of the object after the action (for `deleted`, the UID it had; none when it
    /// does not exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// `metadata.generation` after the action: the status report whose
    /// `observed_generation` reaches it reflects this intent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Details of an ADR 0004 conflict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict: Option<ConflictReport>,
}

/// Acknowledgement of one document revision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DocumentAck {
    /// Epoch of the acknowledged document.
    pub epoch: String,
    /// Revision of the acknowledged document.
    pub revision: u64,
    /// Outcome of the whole document.
    pub outcome: DocumentOutcome,
    /// Reason code when `refused` (see [`reasons`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail when `refused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the agent finished applying it.
    pub processed_at: Timestamp,
    /// One entry per application, operation and deletion of the document, in this order.
    #[serde(default)]
    pub objects: Vec<ObjectAck>,
}

/// A condition as reported (a `metav1.Condition`, snake_case).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportCondition {
    /// Condition type (`Ready`, `Succeeded`, …).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable message.
    #[serde(default)]
    pub message: String,
    /// When `status` last changed.
    pub last_transition_time: Timestamp,
    /// Generation the condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The summary state of an object, computed by the agent from its status so that Odoo
/// need not re-implement the conditions contract (`docs/api/conditions.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectState {
    /// ApplicationInstance: the latest spec has not been observed by the app controller
    /// yet, or `Ready` is `Unknown` (work under way).
    Progressing,
    /// ApplicationInstance: `Ready=True` for the current generation.
    Ready,
    /// ApplicationInstance: `Ready=False` for the current generation (see the reason).
    NotReady,
    /// ApplicationInstance: `spec.suspend` is true.
    Suspended,
    /// ApplicationInstance or Operation: being deleted.
    Deleting,
    /// Operation: `Pending` (waiting for `notBefore`, queued, or not yet seen by an engine).
    Pending,
    /// Operation: `Running`.
    Running,
    /// Operation: `Succeeded`.
    Succeeded,
    /// Operation: `Failed`.
    Failed,
    /// Operation: `Expired` (not started before its deadline; nothing done).
    Expired,
    /// The object no longer exists in the cluster.
    Deleted,
    /// A state this version does not know.
    #[serde(other)]
    Unknown,
}

/// The status of one object, as read from the cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObjectReport {
    /// Kind.
    pub kind: ObjectKind,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.uid` (absent only for a deletion seen without the object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Summary state.
    pub state: ObjectState,
    /// `metadata.generation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// `status.observedGeneration`: equal to `generation` once the controller has seen
    /// the latest spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `metadata.resourceVersion`: changes with every write; the same value means the
    /// same report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Whether the agent applied this object (label `app.kubernetes.io/managed-by:
    /// vworkspace-agent`); objects created by other means are reported too.
    #[serde(default)]
    pub managed_by_agent: bool,
    /// `status.conditions`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<ReportCondition>,
    /// Operation: `status.phase`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Operation: `status.result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Operation: `status.startTime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    /// Operation: `status.completionTime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Timestamp>,
    /// Operation: `spec.requestId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// ApplicationInstance: `status.deployedChartVersion`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployed_chart_version: Option<String>,
    /// ApplicationInstance: `spec.chart.version` in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_chart_version: Option<String>,
    /// ApplicationInstance with a backup schedule: `status.backupSchedule` (protocol 1.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_schedule: Option<crate::schedule::BackupScheduleReport>,
    /// Operation, a verified restore that ended: `status.verification` (protocol 1.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<crate::verification::VerificationReport>,
    /// `metadata.creationTimestamp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Timestamp>,
    /// When the agent read this state.
    pub observed_at: Timestamp,
}

impl ObjectReport {
    /// The report's object key.
    pub fn key(&self) -> ObjectKey {
        ObjectKey {
            kind: self.kind,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// Marks the reports of a full resync: after a start or a reconnect the agent sends the
/// status of every object it reports, in one or more batches sharing one `id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncMarker {
    /// Identifies this resync (new for every resync).
    pub id: String,
    /// Batch number, from 0.
    pub batch: u32,
    /// True on the last batch: every object of this cluster that Odoo knows and that no
    /// batch of this resync reported no longer exists in the cluster. Odoo marks those
    /// `deleted` in its status records; it never deletes intent because of it.
    pub last_batch: bool,
}

/// A problem the agent had since its last successful sync, for Odoo's records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentError {
    /// Stable reason code (`Timeout`, `ServerError`, `MalformedResponse`, …).
    pub reason: String,
    /// Human-readable detail (never contains credentials).
    pub message: String,
    /// First failure of the streak.
    pub since: Timestamp,
    /// Failed attempts in the streak.
    pub attempts: u32,
}

/// `vworkspace.cluster/agent_sync` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyncParams {
    /// The agent's protocol version.
    pub protocol_version: ProtocolVersion,
    /// The cluster (must match the UID registered for the API key).
    pub cluster_uid: String,
    /// The agent process (see [`AgentInfo::instance`]).
    pub agent_instance: String,
    /// The last document the agent fully processed; Odoo sends a document only when its
    /// current cursor differs. Absent after an agent start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known: Option<Cursor>,
    /// Acknowledgements not yet delivered, oldest first. Delivered at least once: Odoo
    /// must accept the same acknowledgement twice.
    #[serde(default)]
    pub acks: Vec<DocumentAck>,
    /// Status reports: changes since the last successful sync, or a resync batch.
    #[serde(default)]
    pub reports: Vec<ObjectReport>,
    /// Set when `reports` is (part of) a full resync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync: Option<ResyncMarker>,
    /// More reports (or, after a `413`, acknowledgements) are waiting; the agent calls again
    /// at once.
    #[serde(default)]
    pub more: bool,
    /// The failure streak that ended with this call, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<AgentError>,
}

/// `vworkspace.cluster/agent_sync` result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyncResult {
    /// Odoo's protocol version.
    pub protocol_version: ProtocolVersion,
    /// Odoo's clock.
    #[serde(deserialize_with = "odoo_compat::timestamp")]
    pub server_time: Timestamp,
    /// The desired state, when its cursor differs from `known`; absent (or `null`, or
    /// `false`) when the agent is up to date.
    #[serde(
        default,
        deserialize_with = "odoo_compat::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub desired: Option<DesiredState>,
    /// Odoo lost its status records (e.g. restored from a backup) and asks for a full
    /// resync now.
    #[serde(default, deserialize_with = "odoo_compat::or_default")]
    pub resync_requested: bool,
    /// Suggested delay before the next periodic sync.
    #[serde(
        default,
        deserialize_with = "odoo_compat::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub next_sync_seconds: Option<u32>,
    /// (1.4) Most reports Odoo accepts per call, now: the agent sends at most that many
    /// from its next call on, so a lowered limit reaches it without a new registration.
    #[serde(
        default,
        deserialize_with = "odoo_compat::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_reports_per_sync: Option<u32>,
}

/// Stable reason codes used in acknowledgements and the agent's condition.
pub mod reasons {
    /// Refused: the namespace (or `spec.targetNamespace`) is outside the agent's allow-list.
    pub const NAMESPACE_NOT_ALLOWED: &str = "NamespaceNotAllowed";
    /// Refused: the API server rejected the object as invalid (schema or CEL rule).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Refused: the namespace does not exist (the agent never creates namespaces). Odoo
    /// re-sends the intent in a new revision once the cluster owner created it.
    pub const NAMESPACE_NOT_FOUND: &str = "NamespaceNotFound";
    /// Refused: the API server forbade the write (the agent's RBAC).
    pub const FORBIDDEN: &str = "Forbidden";
    /// Refused: another field manager owns fields the intent sets (other than the
    /// ADR 0004 pair, which yields `conflict`).
    pub const FIELD_CONFLICT: &str = "FieldConflict";
    /// Conflict (ADR 0004): an Operation owns `spec.chart.version` / `spec.values`.
    pub const OWNED_BY_OPERATION: &str = "OwnedByOperation";
    /// Refused: an Operation with this name exists with another spec (Operations are immutable).
    pub const IMMUTABLE: &str = "Immutable";
    /// Refused: an intent (apply or deletion) names an existing object the agent did not
    /// create (no managed-by label); the agent never takes it over.
    pub const NOT_MANAGED_BY_AGENT: &str = "NotManagedByAgent";
    /// Refused: a deletion intent's `uid` does not match the object's.
    pub const UID_MISMATCH: &str = "UidMismatch";
    /// Failed: the API server could not be reached or answered 5xx; retried.
    pub const API_UNAVAILABLE: &str = "ApiUnavailable";
    /// Document refused: it failed validation (`message` says where).
    pub const INVALID_DOCUMENT: &str = "InvalidDocument";
    /// Document refused: it could not be parsed.
    pub const MALFORMED_DOCUMENT: &str = "MalformedDocument";
    /// Refused: an Operation without `deadline` in a document without `generated_at`
    /// (nothing bounds how late it would run; [`crate::lateness`]).
    pub const DEADLINE_REQUIRED: &str = "DeadlineRequired";
    /// Refused: an Operation without `deadline` in a document generated more than an hour
    /// ago ([`crate::lateness`]): not started late.
    pub const EXPIRED: &str = "Expired";
}
