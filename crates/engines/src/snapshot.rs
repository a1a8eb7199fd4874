//! Snapshot: one CSI `VolumeSnapshot` per PVC of the application (the PVCs named in the
//! payload, else those labelled with the release, or every PVC of the target namespace
//! when the application is alone there), done when all are `readyToUse`.

use std::time::Duration;

use api::{LABEL_INSTANCE, OperationType, conditions::operation_reasons};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::{
    Api, ResourceExt,
    api::{ApiResource, ListParams},
};
use operations::{Outcome, meta, snapshot, velero::BackupScope};

use crate::backup::velero_target;
use crate::children::{self, Child};
use crate::runtime::{Cx, Driver, DriverError, Watch};

fn volume_snapshots() -> ApiResource {
    children::resource(snapshot::API_VERSION, snapshot::KIND, "volumesnapshots")
}

/// Drives Snapshot Operations through the CSI snapshot API.
#[derive(Debug, Default, Clone)]
pub struct SnapshotDriver;

impl Driver for SnapshotDriver {
    fn op_type(&self) -> OperationType {
        OperationType::Snapshot
    }

    fn watches(&self) -> Vec<Watch> {
        // Snapshots live next to their PVCs, possibly outside the Operation's namespace.
        vec![Watch::Labelled {
            resource: volume_snapshots(),
            namespace: None,
        }]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_secs(30)
    }

    async fn validate(&self, cx: &Cx) -> Result<Option<Outcome>, DriverError> {
        if children::is_served(&cx.client, snapshot::API_VERSION, snapshot::KIND).await? {
            return Ok(None);
        }
        Ok(Some(Outcome::failed(
            operation_reasons::ENGINE_NOT_INSTALLED,
            format!(
                "CSI snapshots are not installed: {}/{} is not served by this cluster",
                snapshot::API_VERSION,
                snapshot::KIND
            ),
        )))
    }

    async fn drive(&self, cx: &Cx) -> Result<Outcome, DriverError> {
        let Some(target) = velero_target(cx).await? else {
            return Ok(Outcome::failed(
                operation_reasons::APPLICATION_NOT_FOUND,
                "the ApplicationInstance was deleted during the snapshot",
            ));
        };
        let params = cx.op.spec.snapshot.clone().unwrap_or_default();
        let pvcs = if params.pvcs.is_empty() {
            let selector = match target.scope {
                BackupScope::Namespace => ListParams::default(),
                BackupScope::Release => {
                    ListParams::default().labels(&format!("{LABEL_INSTANCE}={}", target.release_name))
                }
            };
            let api: Api<PersistentVolumeClaim> = Api::namespaced(cx.client.clone(), &target.namespace);
            let mut names: Vec<String> = api.list(&selector).await?.items.iter().map(|p| p.name_any()).collect();
            names.sort();
            names
        } else {
            params.pvcs.clone()
        };
        let class = params.volume_snapshot_class_name.as_deref();
        let mut snapshots = Vec::with_capacity(pvcs.len());
        for pvc in &pvcs {
            let object = snapshot::volume_snapshot_object(&cx.op, &target.namespace, pvc, class)?;
            match children::ensure(cx, &volume_snapshots(), &object).await? {
                Child::Ours(existing) => snapshots.push(existing),
                Child::Foreign(message) => return Ok(children::foreign(message)),
            }
        }
        let references = snapshots.iter().filter_map(meta::reference_of).collect();
        Ok(snapshot::map_snapshots(&snapshots, pvcs.len()).into_outcome(references))
    }
}
