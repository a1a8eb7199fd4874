//! Restore: a Velero `Restore` from a Backup Operation or a named Velero Backup into the
//! application's target namespace. The application's HelmRelease is held suspended while
//! the restore runs (annotation `vworkspace.io/suspended-by-operation` on the
//! ApplicationInstance, honoured by the app controller while this Operation has not
//! ended), so Flux does not fight the restored objects. With `restoreVolumes`, the volumes
//! the backup holds data for are replaced first ([`operations::volume_replace`]): Velero
//! restores volume data only into claims and pods it creates itself. A verified restore
//! (`restore.verify`) goes to a scratch namespace instead and leaves the application alone
//! ([`crate::verify`]).

use std::time::Duration;

use api::{
    ANNOTATION_SUSPENDED_BY, ApplicationInstance, Operation, OperationType,
    conditions::{operation_reasons, reasons, types},
};
use controller_kit::{WriteVerb, namespaces::NamespacePairs};
use kube::{
    Api,
    api::{DeleteParams, DynamicObject, ListParams, Preconditions, PropagationPolicy},
    discovery::ApiResource,
};
use operations::{
    Outcome, Progress,
    meta::{self, OpId},
    velero::{self, VeleroKind, VeleroTarget},
    volume_replace::{self, Deletion, Listed, ReplaceStep},
};
use serde_json::{Value, json};

use crate::backup::{require_velero, velero_backups, velero_restores, velero_target};
use crate::children::{self, Child};
use crate::runtime::{Cx, Driver, DriverError, Watch};

/// Drives Restore Operations through Velero.
#[derive(Debug, Clone)]
pub struct RestoreDriver {
    /// Namespace Velero runs in.
    pub velero_namespace: String,
    /// `FROM=TO` pairs: a Restore in `FROM` may clone into `TO` (`restore.targetNamespace`).
    pub namespace_pairs: NamespacePairs,
}

impl RestoreDriver {
    /// The Velero Backup to restore from, or why there is none (`BackupNotFound`).
    pub(crate) async fn source_backup(&self, cx: &Cx) -> Result<String, DriverError> {
        let Some(params) = cx.op.spec.restore.as_ref() else {
            return Err(operations::Error::InvalidSpec("spec.restore is missing".into()).into());
        };
        if let Some(operation) = &params.source.operation_name {
            let ops: Api<Operation> = Api::namespaced(cx.client.clone(), cx.namespace());
            let source = ops.get_opt(operation).await?;
            return Ok(velero::backup_name_of(operation, cx.namespace(), source.as_ref())?);
        }
        let name = params.source.velero_backup_name.clone().unwrap_or_default();
        let backup = children::get(&cx.client, &velero_backups(), &self.velero_namespace, &name).await?;
        let phase = backup
            .as_ref()
            .and_then(|b| b.pointer("/status/phase"))
            .and_then(Value::as_str)
            .unwrap_or("");
        match (backup.is_some(), phase) {
            (true, "Completed") => Ok(name),
            (false, _) => Err(operations::Error::BackupNotFound(format!(
                "Velero Backup {}/{name} not found",
                self.velero_namespace
            ))
            .into()),
            (true, phase) => Err(operations::Error::BackupNotFound(format!(
                "Velero Backup {}/{name} is not Completed (phase {phase:?})",
                self.velero_namespace
            ))
            .into()),
        }
    }
}

/// Velero's PodVolumeBackup resource (what a file-system backup holds data for).
fn pod_volume_backups() -> ApiResource {
    children::resource(velero::API_VERSION, "PodVolumeBackup", "podvolumebackups")
}

/// The core and apps resources a volume replacement reads or deletes, by kind.
fn workload_resource(kind: &str) -> ApiResource {
    match kind {
        "Deployment" => children::resource("apps/v1", "Deployment", "deployments"),
        "StatefulSet" => children::resource("apps/v1", "StatefulSet", "statefulsets"),
        "ReplicaSet" => children::resource("apps/v1", "ReplicaSet", "replicasets"),
        "PersistentVolumeClaim" => children::resource("v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
        _ => children::resource("v1", "Pod", "pods"),
    }
}

/// Lists `resource` in `namespace` (optionally by label) as JSON.
async fn list_json(
    cx: &Cx,
    resource: &ApiResource,
    namespace: &str,
    labels: Option<&str>,
) -> Result<Vec<Value>, DriverError> {
    let params = labels.map_or_else(ListParams::default, |l| ListParams::default().labels(l));
    let list = Api::<DynamicObject>::namespaced_with(cx.client.clone(), namespace, resource)
        .list(&params)
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|o| serde_json::to_value(o).ok())
        .collect())
}

/// Deletes `deletion` in `namespace` (UID precondition; dependents first, so no pod of a
/// deleted workload outlives it); already gone is fine.
async fn delete(cx: &Cx, namespace: &str, deletion: &Deletion) -> Result<(), DriverError> {
    let api = Api::<DynamicObject>::namespaced_with(cx.client.clone(), namespace, &workload_resource(deletion.kind));
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        preconditions: deletion.uid.clone().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    cx.metrics.api_write(WriteVerb::Delete, deletion.kind_label());
    match api.delete(&deletion.name, &params).await {
        Ok(_) => Ok(()),
        // Gone, or replaced by a newer object of the same name (left alone).
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sets (`Some`) or releases (`None`) the suspension of the application by this Operation.
async fn hold(cx: &Cx, app: &ApplicationInstance, holder: Option<&str>) -> Result<(), DriverError> {
    let current = app
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_SUSPENDED_BY));
    let me = cx.op.metadata.name.as_deref().unwrap_or_default();
    match holder {
        Some(name) if current.map(String::as_str) == Some(name) => return Ok(()),
        // Only release what this Operation holds.
        None if current.map(String::as_str) != Some(me) => return Ok(()),
        _ => {}
    }
    let annotations = holder.map_or_else(|| json!({}), |h| json!({ ANNOTATION_SUSPENDED_BY: h }));
    let name = app.metadata.name.clone().unwrap_or_default();
    children::apply_application(cx, &name, json!({"metadata": {"annotations": annotations}})).await?;
    Ok(())
}

/// Whether the Operation is a verified restore into a scratch namespace (`restore.verify`).
fn verifies(cx: &Cx) -> bool {
    cx.op.spec.restore.as_ref().is_some_and(api::RestoreParams::verifies)
}

/// Whether the app controller reports the release suspended by `operation`.
fn suspended_by(app: &ApplicationInstance, operation: &str) -> bool {
    app.status.as_ref().is_some_and(|status| {
        status.observed_generation == app.metadata.generation
            && status
                .conditions
                .iter()
                .any(|c| c.type_ == types::READY && c.reason == reasons::SUSPENDED && c.message.contains(operation))
    })
}

impl RestoreDriver {
    /// This Operation's Velero Restore `name`, if it exists (`Ok(None)`), or the outcome when
    /// the name is held by a Restore this Operation did not create.
    pub(crate) async fn own_restore(
        &self,
        cx: &Cx,
        id: &OpId<'_>,
        name: &str,
    ) -> Result<Result<Option<Value>, Outcome>, DriverError> {
        Ok(
            match children::get(&cx.client, &velero_restores(), &self.velero_namespace, name).await? {
                Some(existing) if meta::is_child_of(&existing, id) => Ok(Some(existing)),
                Some(_) => Err(children::foreign(format!(
                    "Velero Restore {}/{name} already exists and was not created by this Operation",
                    self.velero_namespace
                ))),
                None => Ok(None),
            },
        )
    }

    /// A clone into another namespace must be allowed twice: by the engine's namespaces (the
    /// policy, never a system namespace) and by a cluster administrator's pair
    /// `<Operation namespace>=<targetNamespace>`. A tenant's intent never reaches another
    /// namespace on its own.
    fn refuse_clone(&self, cx: &Cx) -> Option<Outcome> {
        let app = cx.app.as_ref()?;
        let own = app.spec.target_namespace_or(cx.namespace());
        let clone = cx
            .op
            .spec
            .restore
            .as_ref()
            .and_then(|r| r.target_namespace.as_deref())
            .filter(|ns| *ns != own)?;
        let from = cx.namespace();
        if !cx.scope.allows_reference(clone) {
            return Some(Outcome::failed(
                operation_reasons::NAMESPACE_NOT_ALLOWED,
                format!("restore.targetNamespace {clone} is not allowed ({})", cx.scope.policy()),
            ));
        }
        if !self.namespace_pairs.allows(from, clone) {
            return Some(Outcome::failed(
                operation_reasons::NAMESPACE_NOT_ALLOWED,
                format!(
                    "restore.targetNamespace {clone} is outside this Operation's namespace {from}; a cluster \
                     administrator can allow it with --allowed-namespace-pairs {from}={clone}"
                ),
            ));
        }
        None
    }

    /// With `restoreVolumes`, one step of replacing the volumes the backup holds data for
    /// ([`volume_replace::replace_step`]): `None` when Velero may restore now, else the
    /// outcome to report (deletions under way, or a refusal).
    async fn replace_volumes(
        &self,
        cx: &Cx,
        backup: &str,
        target: &VeleroTarget,
    ) -> Result<Option<Outcome>, DriverError> {
        let restore_volumes = cx
            .op
            .spec
            .restore
            .as_ref()
            .and_then(|r| r.restore_volumes)
            .unwrap_or(false);
        if !restore_volumes {
            return Ok(None);
        }
        let selector = format!("{}={backup}", volume_replace::LABEL_BACKUP_NAME);
        let pod_volume_backups = list_json(cx, &pod_volume_backups(), &self.velero_namespace, Some(&selector)).await?;
        if volume_replace::claims_with_data(&pod_volume_backups, &target.namespace).is_empty() {
            return Ok(None);
        }
        let ns = target.namespace.as_str();
        let claims = list_json(cx, &workload_resource("PersistentVolumeClaim"), ns, None).await?;
        let pods = list_json(cx, &workload_resource("Pod"), ns, None).await?;
        let replica_sets = list_json(cx, &workload_resource("ReplicaSet"), ns, None).await?;
        let listed = Listed {
            pod_volume_backups: &pod_volume_backups,
            claims: &claims,
            pods: &pods,
            replica_sets: &replica_sets,
        };
        Ok(match volume_replace::replace_step(target, &listed) {
            ReplaceStep::Ready => None,
            ReplaceStep::Waiting(message) => Some(Outcome::Running {
                message,
                children: Vec::new(),
            }),
            ReplaceStep::Delete(deletions) => {
                for deletion in &deletions {
                    delete(cx, ns, deletion).await?;
                }
                let names: Vec<String> = deletions.iter().map(|d| format!("{} {}", d.kind, d.name)).collect();
                Some(Outcome::Running {
                    message: format!(
                        "replacing volumes: deleted {} in {ns}; Velero restores them with their data from Backup {backup}",
                        names.join(", ")
                    ),
                    children: Vec::new(),
                })
            }
            ReplaceStep::Refused(message) => {
                if let Some(app) = cx.app.as_ref() {
                    hold(cx, app, None).await?;
                }
                Some(Outcome::failed(
                    operation_reasons::VOLUMES_NOT_REPLACED,
                    format!("volume data cannot be restored in place: {message}"),
                ))
            }
        })
    }
}

impl Driver for RestoreDriver {
    fn op_type(&self) -> OperationType {
        OperationType::Restore
    }

    fn watches(&self) -> Vec<Watch> {
        vec![
            Watch::Labelled {
                resource: velero_restores(),
                namespace: Some(self.velero_namespace.clone()),
            },
            Watch::Applications,
        ]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_secs(15)
    }

    async fn validate(&self, cx: &Cx) -> Result<Option<Outcome>, DriverError> {
        if let Some(refusal) = require_velero(cx, VeleroKind::Restore).await? {
            return Ok(Some(refusal));
        }
        if let Some(refusal) = self.refuse_clone(cx) {
            return Ok(Some(refusal));
        }
        if verifies(cx)
            && let Some(refusal) = Self::refuse_verification_job(cx)
        {
            return Ok(Some(refusal));
        }
        self.source_backup(cx).await?;
        Ok(None)
    }

    async fn drive(&self, cx: &Cx) -> Result<Outcome, DriverError> {
        if verifies(cx) {
            return self.drive_verification(cx).await;
        }
        let id = OpId::of(&cx.op)?;
        let name = velero::object_name(&id);
        let restore = match self.own_restore(cx, &id, &name).await? {
            Ok(restore) => restore,
            Err(foreign) => return Ok(foreign),
        };

        let Some(restore) = restore else {
            // Not created yet: hold the release still first, then create the Restore.
            let Some(app) = cx.app.as_ref() else {
                return Ok(Outcome::failed(
                    operation_reasons::APPLICATION_NOT_FOUND,
                    "the ApplicationInstance was deleted before the restore started",
                ));
            };
            let Some(target) = velero_target(cx).await? else {
                return Ok(Outcome::failed(
                    operation_reasons::APPLICATION_NOT_FOUND,
                    "the ApplicationInstance is gone",
                ));
            };
            // A clone leaves the application as it is: nothing to hold, nothing to replace.
            let cloning = velero::clone_namespace(&cx.op, &target).is_some();
            if !cloning {
                hold(cx, app, Some(id.name)).await?;
                if !suspended_by(app, id.name) {
                    return Ok(Outcome::Running {
                        message: "waiting for the app controller to suspend the HelmRelease".into(),
                        children: Vec::new(),
                    });
                }
            }
            let backup = self.source_backup(cx).await?;
            if !cloning && let Some(outcome) = self.replace_volumes(cx, &backup, &target).await? {
                return Ok(outcome);
            }
            let object = velero::restore_object(&cx.op, &backup, &target, &self.velero_namespace)?;
            return Ok(match children::ensure(cx, &velero_restores(), &object).await? {
                Child::Ours(restore) => Outcome::Running {
                    message: format!("Velero Restore {name} created from Backup {backup}"),
                    children: meta::reference_of(&restore).into_iter().collect(),
                },
                Child::Foreign(message) => children::foreign(message),
            });
        };

        let reference: Vec<_> = meta::reference_of(&restore).into_iter().collect();
        let progress = velero::map_restore(&restore);
        if matches!(progress, Progress::Running { .. }) {
            return Ok(progress.into_outcome(reference));
        }
        // Done: give the release back to Flux before reporting the end.
        if let Some(app) = cx.app.as_ref() {
            hold(cx, app, None).await?;
        }
        Ok(progress.into_outcome(reference))
    }
}
