//! Velero `Backup` and `Restore` (`velero.io/v1`): the objects a Backup or Restore
//! Operation creates, and what their `status.phase` means for the Operation
//! (`docs/api/conditions.md` §3.3).
//!
//! ## Where the objects live
//!
//! In Velero's namespace (Velero only processes objects there). An owner reference cannot
//! cross namespaces, so children are linked by labels ([`crate::meta::labels`]) and
//! `status.children`, and the engine checks [`crate::meta::is_child_of`] before adopting
//! an existing object of the same name. Velero Backups outlive their Operation on
//! purpose: they are the data, with their own `ttl`.
//!
//! ## Scope of a Backup ([`BackupScope`])
//!
//! The namespaces come from the ApplicationInstance (never from the Operation's payload:
//! Velero is not tenant-aware, and the engine is what keeps a tenant inside its own
//! namespace). Within the target namespace there are two choices:
//!
//! - [`BackupScope::Namespace`], when the application is alone in its target namespace:
//!   everything in it. This is the complete choice: it also catches what carries no
//!   release label (objects created by hooks or by the application at run time, PVCs of
//!   StatefulSet `volumeClaimTemplates` whose chart forgot the label).
//! - [`BackupScope::Release`], when other ApplicationInstances share the namespace: only
//!   objects labelled `app.kubernetes.io/instance=<release>` (the Helm convention). A
//!   whole-namespace backup would be restored over the neighbours too, rolling back
//!   applications nobody asked to touch. Velero still follows pods to their PVCs and PVCs
//!   to their PVs on backup, so mounted volumes are included even when unlabelled.
//!
//! The engine picks with [`BackupScope::for_neighbours`] from the number of
//! ApplicationInstances targeting the namespace. A Restore applies the same filter, so a
//! whole-namespace backup restored after a neighbour moved in touches only this release.
//!
//! In both scopes, control objects are excluded ([`EXCLUDED_RESOURCES`]): our own
//! Operations and ApplicationInstances, Flux's objects and CRDs. They are re-created from
//! intent, not from a backup, and restoring them would do harm (an old Operation restored
//! without its status would be executed again; a CRD would be downgraded). Helm's release
//! records (`owner=helm` Secrets) are excluded by label: Flux owns the release history,
//! and a restored record would mark an old revision `deployed` next to the current one.
//!
//! ## Restore policy
//!
//! `existingResourcePolicy: update`: objects that still exist are brought back to their
//! backed-up state (Velero's default, `none`, would skip them and restore almost nothing
//! into a live application). Velero never overwrites an existing volume: volume data
//! (`restorePVs`) comes back only for PVCs that no longer exist.

use api::{Operation, OperationType, VolumeBackupMethod};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::meta::{self, OpId};
use crate::progress::Progress;
use crate::status::Report;
use crate::{Error, names, reasons};
use api::conditions::operation_reasons;

/// API version of Velero's objects.
pub const API_VERSION: &str = "velero.io/v1";
/// Label selecting a Helm release's objects (the Helm chart convention).
pub use api::LABEL_INSTANCE;
/// Resources never backed up or restored for an application (see the module docs).
pub const EXCLUDED_RESOURCES: [&str; 7] = [
    "operations.vworkspace.io",
    "applicationinstances.vworkspace.io",
    "helmreleases.helm.toolkit.fluxcd.io",
    "helmrepositories.source.toolkit.fluxcd.io",
    "ocirepositories.source.toolkit.fluxcd.io",
    "helmcharts.source.toolkit.fluxcd.io",
    "customresourcedefinitions.apiextensions.k8s.io",
];

/// Which Velero object is being read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VeleroKind {
    /// `velero.io/v1` `Backup`.
    Backup,
    /// `velero.io/v1` `Restore`.
    Restore,
}

impl VeleroKind {
    /// The Kubernetes kind.
    pub fn as_str(self) -> &'static str {
        match self {
            VeleroKind::Backup => "Backup",
            VeleroKind::Restore => "Restore",
        }
    }
}

/// What part of the target namespace a Backup (and Restore) covers (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackupScope {
    /// Everything in the target namespace: the application is alone there.
    Namespace,
    /// Only the release's labelled objects (and the volumes its pods mount).
    Release,
}

impl BackupScope {
    /// `Namespace` when `apps_in_namespace` (ApplicationInstances whose target namespace is
    /// this one, including this application) is at most one, else `Release`.
    pub fn for_neighbours(apps_in_namespace: usize) -> Self {
        if apps_in_namespace <= 1 {
            BackupScope::Namespace
        } else {
            BackupScope::Release
        }
    }
}

/// The application as Velero must see it, resolved by the engine from the ApplicationInstance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VeleroTarget {
    /// The namespace the release is installed into (`spec.targetNamespace`, or the app's own).
    pub namespace: String,
    /// The Helm release name (value of `app.kubernetes.io/instance`).
    pub release_name: String,
    /// What part of `namespace` to cover.
    pub scope: BackupScope,
}

/// The deterministic name of the Velero object of `op`: `<namespace>-<operation>-<hash>`,
/// cut to 63 characters. Velero's namespace holds every tenant's objects, hence the
/// namespace in the name and the hash ([`names::pair`]).
pub fn object_name(op: &OpId<'_>) -> String {
    names::pair(op.namespace, op.name)
}

/// The Velero `Backup` for a Backup Operation, created in `velero_namespace`.
pub fn backup_object(op: &Operation, target: &VeleroTarget, velero_namespace: &str) -> Result<Value, Error> {
    let id = OpId::of(op)?;
    if op.spec.type_ != OperationType::Backup {
        return Err(Error::InvalidSpec(format!(
            "a Velero Backup is built for a Backup Operation, not {}",
            op.spec.type_.as_str()
        )));
    }
    let params = op.spec.backup.clone().unwrap_or_default();
    let include_volumes = params.include_volumes.unwrap_or(false);
    let method = params.volume_method.unwrap_or_default();

    let mut spec = scope_filter(target);
    spec.insert(
        "snapshotVolumes".into(),
        json!(include_volumes && method == VolumeBackupMethod::Snapshot),
    );
    spec.insert(
        "defaultVolumesToFsBackup".into(),
        json!(include_volumes && method == VolumeBackupMethod::FileSystem),
    );
    if let Some(ttl) = params.ttl {
        spec.insert("ttl".into(), json!(ttl));
    }
    if let Some(location) = params.storage_location {
        spec.insert("storageLocation".into(), json!(location));
    }
    Ok(velero_object(&id, VeleroKind::Backup, velero_namespace, spec))
}

/// The Velero `Restore` for a Restore Operation, from the Velero Backup `backup_name`
/// (resolved by the engine, e.g. with [`backup_name_of`]), created in `velero_namespace`.
pub fn restore_object(
    op: &Operation,
    backup_name: &str,
    target: &VeleroTarget,
    velero_namespace: &str,
) -> Result<Value, Error> {
    let id = OpId::of(op)?;
    let Some(params) = op
        .spec
        .restore
        .as_ref()
        .filter(|_| op.spec.type_ == OperationType::Restore)
    else {
        return Err(Error::InvalidSpec(format!(
            "a Velero Restore is built for a Restore Operation with spec.restore, not {}",
            op.spec.type_.as_str()
        )));
    };
    if backup_name.is_empty() {
        return Err(Error::BackupNotFound("no Velero Backup name to restore from".into()));
    }
    let mut spec = scope_filter(target);
    spec.insert("backupName".into(), json!(backup_name));
    // A verified restore checks the data too: it restores whatever volume data the backup holds.
    spec.insert(
        "restorePVs".into(),
        json!(params.restore_volumes.unwrap_or(false) || params.verifies()),
    );
    let copy_into = if params.verifies() {
        Some(crate::verify::scratch_namespace(&id))
    } else {
        clone_namespace(op, target).map(str::to_owned)
    };
    match copy_into {
        // A clone or a verified restore: everything goes to the other namespace, and what
        // exists there is kept.
        Some(into) => {
            spec.insert("namespaceMapping".into(), json!({ target.namespace.as_str(): into }));
        }
        None => {
            spec.insert("existingResourcePolicy".into(), json!("update"));
        }
    }
    Ok(velero_object(&id, VeleroKind::Restore, velero_namespace, spec))
}

/// The namespace a Restore clones the application into: `restore.targetNamespace` when it
/// differs from the application's target namespace (the same namespace is an ordinary
/// restore).
pub fn clone_namespace<'a>(op: &'a Operation, target: &VeleroTarget) -> Option<&'a str> {
    op.spec
        .restore
        .as_ref()
        .and_then(|r| r.target_namespace.as_deref())
        .filter(|ns| *ns != target.namespace)
}

/// The Velero Backup behind a Backup Operation named as a Restore's `source.operationName`:
/// it must be a Succeeded Backup Operation whose children include a Velero Backup.
/// `source` is `None` when no Operation of that name exists.
pub fn backup_name_of(source_name: &str, namespace: &str, source: Option<&Operation>) -> Result<String, Error> {
    let Some(source) = source else {
        return Err(Error::BackupNotFound(format!(
            "Operation {namespace}/{source_name} not found"
        )));
    };
    let status = source.status.as_ref();
    let phase = status.and_then(|s| s.phase);
    if source.spec.type_ != OperationType::Backup || phase != Some(api::OperationPhase::Succeeded) {
        let phase = phase.map_or_else(|| "none".to_owned(), |p| format!("{p:?}"));
        return Err(Error::BackupNotFound(format!(
            "Operation {namespace}/{source_name} is not a succeeded Backup ({}, phase {phase})",
            source.spec.type_.as_str()
        )));
    }
    if status.and_then(|s| s.duplicate_of.as_deref()).is_some() {
        return Err(Error::BackupNotFound(format!(
            "Operation {namespace}/{source_name} is a duplicate request and holds no backup; use the Operation it names"
        )));
    }
    status
        .into_iter()
        .flat_map(|s| &s.children)
        .find(|c| c.api_version == API_VERSION && c.kind == VeleroKind::Backup.as_str())
        .map(|c| c.name.clone())
        .ok_or_else(|| {
            Error::BackupNotFound(format!(
                "Operation {namespace}/{source_name} lists no Velero Backup in status.children"
            ))
        })
}

/// Maps a Velero `Backup` (the whole object as JSON) to progress.
pub fn map_backup(backup: &Value) -> Progress {
    map(
        VeleroKind::Backup,
        &meta::display_name(backup),
        &VeleroStatus::of(backup),
    )
}

/// Maps a Velero `Restore` (the whole object as JSON) to progress.
pub fn map_restore(restore: &Value) -> Progress {
    map(
        VeleroKind::Restore,
        &meta::display_name(restore),
        &VeleroStatus::of(restore),
    )
}

/// The parts of a Velero Backup's or Restore's `status` the mapping reads.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VeleroStatus {
    /// `status.phase` (`None` or empty before Velero has seen the object).
    pub phase: Option<String>,
    /// `status.queuePosition` (Backups, Velero 1.18+).
    pub queue_position: Option<i64>,
    /// `status.validationErrors`.
    pub validation_errors: Option<Vec<String>>,
    /// `status.failureReason`.
    pub failure_reason: Option<String>,
    /// `status.warnings`.
    pub warnings: Option<i64>,
    /// `status.errors`.
    pub errors: Option<i64>,
    /// `status.progress`.
    pub progress: Option<VeleroItemProgress>,
}

/// `status.progress` of a Backup (`itemsBackedUp`) or Restore (`itemsRestored`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VeleroItemProgress {
    /// `totalItems`.
    pub total_items: Option<i64>,
    /// `itemsBackedUp` (Backup).
    pub items_backed_up: Option<i64>,
    /// `itemsRestored` (Restore).
    pub items_restored: Option<i64>,
}

impl VeleroStatus {
    /// The status of a Velero object. A status that does not parse (a future Velero
    /// changing a field's type) still yields its phase, so a finished object is recognised.
    pub fn of(object: &Value) -> Self {
        let Some(status) = object.get("status") else {
            return Self::default();
        };
        serde_json::from_value(status.clone()).unwrap_or_else(|_| Self {
            phase: status.get("phase").and_then(Value::as_str).map(str::to_owned),
            ..Self::default()
        })
    }
}

/// Maps a Velero phase to progress (`docs/api/conditions.md` §3.3). `name` is
/// `<namespace>/<name>` of the Velero object, for messages.
pub fn map(kind: VeleroKind, name: &str, status: &VeleroStatus) -> Progress {
    let phase = status.phase.as_deref().filter(|p| !p.is_empty()).unwrap_or("New");
    let what = format!("Velero {} {name}", kind.as_str());
    let report = Report {
        warnings: Some(status.warnings.unwrap_or(0)),
        errors: Some(status.errors.unwrap_or(0)),
        ..Report::default()
    };
    let tally = format!(
        "{} warnings, {} errors",
        report.warnings.unwrap_or(0),
        report.errors.unwrap_or(0)
    );
    let is_backup = kind == VeleroKind::Backup;
    match phase {
        "New" => running(format!("{what} is New")),
        "Queued" | "ReadyToStart" if is_backup => {
            let position = status
                .queue_position
                .map(|p| format!(" (queue position {p})"))
                .unwrap_or_default();
            running(format!("{what} is {phase}{position}"))
        }
        "InProgress"
        | "WaitingForPluginOperations"
        | "WaitingForPluginOperationsPartiallyFailed"
        | "Finalizing"
        | "FinalizingPartiallyFailed" => {
            let mut details = Vec::new();
            if let Some(items) = item_progress(kind, status) {
                details.push(items);
            }
            if phase.ends_with("PartiallyFailed") {
                details.push(format!("{} errors so far", status.errors.unwrap_or(0)));
            }
            let details = if details.is_empty() {
                String::new()
            } else {
                format!(" ({})", details.join(", "))
            };
            running(format!("{what} is {phase}{details}"))
        }
        "Completed" => Progress::Succeeded {
            message: format!("{what} completed ({tally})"),
            report,
        },
        "PartiallyFailed" => {
            let why = status
                .failure_reason
                .as_deref()
                .filter(|r| !r.is_empty())
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            Progress::Failed {
                reason: reasons::PARTIALLY_FAILED.to_owned(),
                message: format!("{what} partially failed ({tally}){why}"),
                report,
            }
        }
        "Failed" => {
            let why = status
                .failure_reason
                .as_deref()
                .filter(|r| !r.is_empty())
                .unwrap_or("no failureReason reported");
            failed(format!("{what} failed: {why}"), report)
        }
        "FailedValidation" => {
            let errors = status.validation_errors.as_deref().unwrap_or_default();
            let why = if errors.is_empty() {
                "no validationErrors reported".to_owned()
            } else {
                errors.join("; ")
            };
            failed(format!("{what} failed validation: {why}"), report)
        }
        "Deleting" if is_backup => failed(format!("{what} is being deleted"), report),
        unknown => running(format!(
            "{what} is in phase {unknown:?}, unknown to this operator; waiting for a known phase"
        )),
    }
}

fn running(message: String) -> Progress {
    Progress::Running { message }
}

fn failed(message: String, report: Report) -> Progress {
    Progress::Failed {
        reason: operation_reasons::FAILED.to_owned(),
        message,
        report,
    }
}

fn item_progress(kind: VeleroKind, status: &VeleroStatus) -> Option<String> {
    let progress = status.progress.as_ref()?;
    let (done, verb) = match kind {
        VeleroKind::Backup => (progress.items_backed_up, "backed up"),
        VeleroKind::Restore => (progress.items_restored, "restored"),
    };
    let total = progress.total_items?;
    Some(format!("{}/{total} items {verb}", done.unwrap_or(0)))
}

/// `includedNamespaces`, the label selector of the scope, and the exclusions.
fn scope_filter(target: &VeleroTarget) -> Map<String, Value> {
    let mut selector = Map::new();
    if target.scope == BackupScope::Release {
        selector.insert("matchLabels".into(), json!({ LABEL_INSTANCE: target.release_name }));
    }
    // Helm's release records (Secrets labelled owner=helm); see the module docs.
    selector.insert(
        "matchExpressions".into(),
        json!([{"key": "owner", "operator": "NotIn", "values": ["helm"]}]),
    );
    let mut spec = Map::new();
    spec.insert("includedNamespaces".into(), json!([target.namespace]));
    spec.insert("excludedResources".into(), json!(EXCLUDED_RESOURCES));
    spec.insert("labelSelector".into(), Value::Object(selector));
    spec
}

fn velero_object(id: &OpId<'_>, kind: VeleroKind, velero_namespace: &str, spec: Map<String, Value>) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": kind.as_str(),
        "metadata": meta::child_metadata(id, &object_name(id), velero_namespace),
        "spec": spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::tests::op;
    use api::{BackupParams, ObjectReference, OperationPhase, OperationStatus, RestoreParams, RestoreSource};

    fn target(scope: BackupScope) -> VeleroTarget {
        VeleroTarget {
            namespace: "team-a".into(),
            release_name: "nextcloud".into(),
            scope,
        }
    }

    fn backup_op(params: Option<BackupParams>) -> Operation {
        let mut o = op("nextcloud-backup-20261201", OperationType::Backup);
        o.spec.backup = params;
        o
    }

    #[test]
    fn backup_object_shape() {
        let o = backup_op(Some(BackupParams {
            ttl: Some("168h".into()),
            storage_location: Some("offsite".into()),
            ..Default::default()
        }));
        let b = backup_object(&o, &target(BackupScope::Namespace), "velero").expect("builds");
        let name = b["metadata"]["name"].as_str().expect("name");
        assert!(name.starts_with("team-a-nextcloud-backup-20261201-"), "{name}");
        assert!(names::is_dns_label(name));
        assert_eq!(b["apiVersion"], "velero.io/v1");
        assert_eq!(b["kind"], "Backup");
        assert_eq!(b["metadata"]["namespace"], "velero");
        assert!(
            b["metadata"].get("ownerReferences").is_none(),
            "no cross-namespace owner"
        );
        let labels = &b["metadata"]["labels"];
        assert_eq!(labels["vworkspace.io/operation"], "nextcloud-backup-20261201");
        assert_eq!(labels["vworkspace.io/operation-namespace"], "team-a");
        assert_eq!(labels["vworkspace.io/operation-uid"], "uid-nextcloud-backup-20261201");
        assert!(labels["vworkspace.io/request-id"].as_str().is_some());
        assert_eq!(labels["app.kubernetes.io/managed-by"], "vworkspace-operator");
        assert_eq!(b["metadata"]["annotations"]["vworkspace.io/request-id"], "odoo:op:4711");
        let spec = &b["spec"];
        assert_eq!(spec["includedNamespaces"], json!(["team-a"]));
        assert_eq!(spec["ttl"], "168h");
        assert_eq!(spec["storageLocation"], "offsite");
        assert_eq!(spec["excludedResources"], json!(EXCLUDED_RESOURCES));
        assert!(spec["labelSelector"].get("matchLabels").is_none());
        assert_eq!(spec["labelSelector"]["matchExpressions"][0]["key"], "owner");
        // Deterministic.
        assert_eq!(
            b,
            backup_object(&o, &target(BackupScope::Namespace), "velero").expect("builds")
        );
    }

    #[test]
    fn backup_release_scope_selects_the_release() {
        let o = backup_op(None);
        let b = backup_object(&o, &target(BackupScope::Release), "velero").expect("builds");
        assert_eq!(
            b["spec"]["labelSelector"]["matchLabels"],
            json!({"app.kubernetes.io/instance": "nextcloud"})
        );
        assert!(b["spec"].get("ttl").is_none());
        assert!(b["spec"].get("storageLocation").is_none());
    }

    #[test]
    fn volume_flags_table() {
        let cases = [
            (None, None, false, false),
            (Some(false), None, false, false),
            (Some(false), Some(VolumeBackupMethod::FileSystem), false, false),
            (Some(true), None, true, false),
            (Some(true), Some(VolumeBackupMethod::Snapshot), true, false),
            (Some(true), Some(VolumeBackupMethod::FileSystem), false, true),
        ];
        for (include, method, snapshot, fs) in cases {
            let o = backup_op(Some(BackupParams {
                include_volumes: include,
                volume_method: method,
                ..Default::default()
            }));
            let b = backup_object(&o, &target(BackupScope::Namespace), "velero").expect("builds");
            assert_eq!(b["spec"]["snapshotVolumes"], snapshot, "{include:?} {method:?}");
            assert_eq!(b["spec"]["defaultVolumesToFsBackup"], fs, "{include:?} {method:?}");
        }
    }

    #[test]
    fn scope_for_neighbours() {
        assert_eq!(BackupScope::for_neighbours(0), BackupScope::Namespace);
        assert_eq!(BackupScope::for_neighbours(1), BackupScope::Namespace);
        assert_eq!(BackupScope::for_neighbours(2), BackupScope::Release);
    }

    #[test]
    fn builders_refuse_wrong_operations() {
        let restore = op("r", OperationType::Restore);
        assert!(matches!(
            backup_object(&restore, &target(BackupScope::Namespace), "velero"),
            Err(Error::InvalidSpec(_))
        ));
        let backup = backup_op(None);
        assert!(matches!(
            restore_object(&backup, "b", &target(BackupScope::Namespace), "velero"),
            Err(Error::InvalidSpec(_))
        ));
        let mut no_uid = backup_op(None);
        no_uid.metadata.uid = None;
        assert_eq!(
            backup_object(&no_uid, &target(BackupScope::Namespace), "velero"),
            Err(Error::missing("Operation", "uid"))
        );
    }

    fn restore_op(volumes: Option<bool>) -> Operation {
        let mut o = op("nextcloud-restore", OperationType::Restore);
        o.spec.restore = Some(RestoreParams {
            source: RestoreSource {
                operation_name: Some("nextcloud-backup".into()),
                velero_backup_name: None,
            },
            restore_volumes: volumes,
            ..RestoreParams::default()
        });
        o
    }

    #[test]
    fn restore_object_shape() {
        for (volumes, restore_pvs) in [(None, false), (Some(false), false), (Some(true), true)] {
            let o = restore_op(volumes);
            let r = restore_object(&o, "team-a-nextcloud-backup-x", &target(BackupScope::Release), "velero")
                .expect("builds");
            assert_eq!(r["kind"], "Restore");
            assert_eq!(r["metadata"]["namespace"], "velero");
            assert!(
                r["metadata"]["name"]
                    .as_str()
                    .expect("name")
                    .starts_with("team-a-nextcloud-restore-")
            );
            let spec = &r["spec"];
            assert_eq!(spec["backupName"], "team-a-nextcloud-backup-x");
            assert_eq!(spec["restorePVs"], restore_pvs);
            assert_eq!(spec["existingResourcePolicy"], "update");
            assert_eq!(spec["includedNamespaces"], json!(["team-a"]));
            assert_eq!(
                spec["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"],
                "nextcloud"
            );
            assert_eq!(spec["excludedResources"], json!(EXCLUDED_RESOURCES));
        }
        assert!(matches!(
            restore_object(&restore_op(None), "", &target(BackupScope::Release), "velero"),
            Err(Error::BackupNotFound(_))
        ));
    }

    #[test]
    fn a_clone_maps_the_namespace_and_keeps_what_exists_there() {
        let mut op = restore_op(Some(true));
        if let Some(r) = op.spec.restore.as_mut() {
            r.target_namespace = Some("team-a-copy".into());
        }
        let target = target(BackupScope::Namespace);
        assert_eq!(clone_namespace(&op, &target), Some("team-a-copy"));
        let r = restore_object(&op, "b", &target, "velero").expect("builds");
        assert_eq!(r["spec"]["namespaceMapping"], json!({"team-a": "team-a-copy"}));
        assert_eq!(
            r["spec"]["includedNamespaces"],
            json!(["team-a"]),
            "filtered by the source namespace"
        );
        assert!(
            r["spec"].get("existingResourcePolicy").is_none(),
            "a clone never overwrites"
        );
        assert_eq!(r["spec"]["restorePVs"], true);
        // The application's own namespace is an ordinary restore.
        if let Some(r) = op.spec.restore.as_mut() {
            r.target_namespace = Some("team-a".into());
        }
        assert_eq!(clone_namespace(&op, &target), None);
        let r = restore_object(&op, "b", &target, "velero").expect("builds");
        assert!(r["spec"].get("namespaceMapping").is_none());
        assert_eq!(r["spec"]["existingResourcePolicy"], "update");
    }

    fn velero_child(name: &str) -> ObjectReference {
        crate::meta::object_ref(API_VERSION, "Backup", name, "velero")
    }

    #[test]
    fn backup_name_of_table() {
        let with_status = |type_, phase, children: Vec<ObjectReference>, dup: Option<&str>| {
            let mut o = op("src", type_);
            o.status = Some(OperationStatus {
                phase,
                children,
                duplicate_of: dup.map(str::to_owned),
                ..Default::default()
            });
            o
        };
        let ok = with_status(
            OperationType::Backup,
            Some(OperationPhase::Succeeded),
            vec![
                crate::meta::object_ref("v1", "ConfigMap", "x", "team-a"),
                velero_child("vb"),
            ],
            None,
        );
        assert_eq!(backup_name_of("src", "team-a", Some(&ok)), Ok("vb".to_owned()));

        let bad = [
            (None, "Operation team-a/src not found"),
            (
                Some(with_status(
                    OperationType::Backup,
                    Some(OperationPhase::Failed),
                    vec![velero_child("vb")],
                    None,
                )),
                "Operation team-a/src is not a succeeded Backup (Backup, phase Failed)",
            ),
            (
                Some(with_status(
                    OperationType::Backup,
                    Some(OperationPhase::Running),
                    vec![velero_child("vb")],
                    None,
                )),
                "Operation team-a/src is not a succeeded Backup (Backup, phase Running)",
            ),
            (
                Some(op("src", OperationType::Backup)),
                "Operation team-a/src is not a succeeded Backup (Backup, phase none)",
            ),
            (
                Some(with_status(
                    OperationType::Snapshot,
                    Some(OperationPhase::Succeeded),
                    vec![],
                    None,
                )),
                "Operation team-a/src is not a succeeded Backup (Snapshot, phase Succeeded)",
            ),
            (
                Some(with_status(
                    OperationType::Backup,
                    Some(OperationPhase::Succeeded),
                    vec![],
                    Some("orig"),
                )),
                "Operation team-a/src is a duplicate request and holds no backup; use the Operation it names",
            ),
            (
                Some(with_status(
                    OperationType::Backup,
                    Some(OperationPhase::Succeeded),
                    vec![],
                    None,
                )),
                "Operation team-a/src lists no Velero Backup in status.children",
            ),
        ];
        for (source, message) in bad {
            assert_eq!(
                backup_name_of("src", "team-a", source.as_ref()),
                Err(Error::BackupNotFound(message.into()))
            );
        }
    }

    fn obj(kind: &str, status: Value) -> Value {
        json!({"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": "bk", "namespace": "velero"}, "status": status})
    }

    fn running_msg(p: &Progress) -> &str {
        match p {
            Progress::Running { message } => message,
            other => panic!("expected Running, got {other:?}"),
        }
    }

    #[test]
    fn backup_running_phases() {
        let cases = [
            (json!({}), "Velero Backup velero/bk is New"),
            (json!({"phase": ""}), "Velero Backup velero/bk is New"),
            (json!({"phase": "New"}), "Velero Backup velero/bk is New"),
            (
                json!({"phase": "Queued", "queuePosition": 3}),
                "Velero Backup velero/bk is Queued (queue position 3)",
            ),
            (json!({"phase": "Queued"}), "Velero Backup velero/bk is Queued"),
            (
                json!({"phase": "ReadyToStart"}),
                "Velero Backup velero/bk is ReadyToStart",
            ),
            (
                json!({"phase": "InProgress", "progress": {"totalItems": 1030, "itemsBackedUp": 412}}),
                "Velero Backup velero/bk is InProgress (412/1030 items backed up)",
            ),
            (json!({"phase": "InProgress"}), "Velero Backup velero/bk is InProgress"),
            (
                json!({"phase": "WaitingForPluginOperations", "progress": {"totalItems": 10, "itemsBackedUp": 10}}),
                "Velero Backup velero/bk is WaitingForPluginOperations (10/10 items backed up)",
            ),
            (
                json!({"phase": "WaitingForPluginOperationsPartiallyFailed", "errors": 2}),
                "Velero Backup velero/bk is WaitingForPluginOperationsPartiallyFailed (2 errors so far)",
            ),
            (json!({"phase": "Finalizing"}), "Velero Backup velero/bk is Finalizing"),
            (
                json!({"phase": "FinalizingPartiallyFailed", "errors": 1, "progress": {"totalItems": 5}}),
                "Velero Backup velero/bk is FinalizingPartiallyFailed (0/5 items backed up, 1 errors so far)",
            ),
            (
                json!({"phase": "Frobnicating"}),
                "Velero Backup velero/bk is in phase \"Frobnicating\", unknown to this operator; waiting for a known phase",
            ),
        ];
        for (status, expected) in cases {
            assert_eq!(
                running_msg(&map_backup(&obj("Backup", status.clone()))),
                expected,
                "{status}"
            );
        }
        // No status at all.
        let bare = json!({"metadata": {"name": "bk", "namespace": "velero"}});
        assert_eq!(running_msg(&map_backup(&bare)), "Velero Backup velero/bk is New");
    }

    #[test]
    fn backup_terminal_phases() {
        let report = |w, e| Report {
            warnings: Some(w),
            errors: Some(e),
            ..Report::default()
        };
        let cases = [
            (
                json!({"phase": "Completed", "warnings": 2}),
                Progress::Succeeded {
                    message: "Velero Backup velero/bk completed (2 warnings, 0 errors)".into(),
                    report: report(2, 0),
                },
            ),
            (
                json!({"phase": "Completed"}),
                Progress::Succeeded {
                    message: "Velero Backup velero/bk completed (0 warnings, 0 errors)".into(),
                    report: report(0, 0),
                },
            ),
            (
                json!({"phase": "PartiallyFailed", "warnings": 1, "errors": 3}),
                Progress::Failed {
                    reason: "PartiallyFailed".into(),
                    message: "Velero Backup velero/bk partially failed (1 warnings, 3 errors)".into(),
                    report: report(1, 3),
                },
            ),
            (
                json!({"phase": "PartiallyFailed", "errors": 1, "failureReason": "volume x"}),
                Progress::Failed {
                    reason: "PartiallyFailed".into(),
                    message: "Velero Backup velero/bk partially failed (0 warnings, 1 errors): volume x".into(),
                    report: report(0, 1),
                },
            ),
            (
                json!({"phase": "Failed", "failureReason": "error getting backup store for location \"default\""}),
                Progress::Failed {
                    reason: "Failed".into(),
                    message: "Velero Backup velero/bk failed: error getting backup store for location \"default\""
                        .into(),
                    report: report(0, 0),
                },
            ),
            (
                json!({"phase": "Failed"}),
                Progress::Failed {
                    reason: "Failed".into(),
                    message: "Velero Backup velero/bk failed: no failureReason reported".into(),
                    report: report(0, 0),
                },
            ),
            (
                json!({"phase": "FailedValidation", "validationErrors": ["a is invalid", "b is missing"]}),
                Progress::Failed {
                    reason: "Failed".into(),
                    message: "Velero Backup velero/bk failed validation: a is invalid; b is missing".into(),
                    report: report(0, 0),
                },
            ),
            (
                json!({"phase": "FailedValidation"}),
                Progress::Failed {
                    reason: "Failed".into(),
                    message: "Velero Backup velero/bk failed validation: no validationErrors reported".into(),
                    report: report(0, 0),
                },
            ),
            (
                json!({"phase": "Deleting"}),
                Progress::Failed {
                    reason: "Failed".into(),
                    message: "Velero Backup velero/bk is being deleted".into(),
                    report: report(0, 0),
                },
            ),
        ];
        for (status, expected) in cases {
            assert_eq!(map_backup(&obj("Backup", status.clone())), expected, "{status}");
        }
    }

    #[test]
    fn restore_phases() {
        let cases = [
            (json!({"phase": "New"}), "Velero Restore velero/bk is New"),
            (
                json!({"phase": "InProgress", "progress": {"totalItems": 20, "itemsRestored": 7}}),
                "Velero Restore velero/bk is InProgress (7/20 items restored)",
            ),
            // Restores have no Queued, ReadyToStart or Deleting: unknown, keep waiting.
            (
                json!({"phase": "Queued"}),
                "Velero Restore velero/bk is in phase \"Queued\", unknown to this operator; waiting for a known phase",
            ),
            (
                json!({"phase": "Deleting"}),
                "Velero Restore velero/bk is in phase \"Deleting\", unknown to this operator; waiting for a known phase",
            ),
        ];
        for (status, expected) in cases {
            assert_eq!(
                running_msg(&map_restore(&obj("Restore", status.clone()))),
                expected,
                "{status}"
            );
        }
        assert_eq!(
            map_restore(&obj(
                "Restore",
                json!({"phase": "Completed", "warnings": 4, "errors": 0})
            )),
            Progress::Succeeded {
                message: "Velero Restore velero/bk completed (4 warnings, 0 errors)".into(),
                report: Report {
                    warnings: Some(4),
                    errors: Some(0),
                    ..Report::default()
                },
            }
        );
        assert!(matches!(
            map_restore(&obj("Restore", json!({"phase": "PartiallyFailed", "errors": 2}))),
            Progress::Failed { reason, .. } if reason == "PartiallyFailed"
        ));
    }

    #[test]
    fn unparseable_status_still_yields_the_phase() {
        let odd = obj("Backup", json!({"phase": "Completed", "warnings": "many"}));
        assert!(matches!(map_backup(&odd), Progress::Succeeded { .. }));
        assert_eq!(VeleroStatus::of(&odd).phase.as_deref(), Some("Completed"));
    }
}
