//! Restoring volume data in place: what must go before Velero can bring it back.
//!
//! Velero never overwrites an existing PersistentVolumeClaim, and it restores a pod
//! volume's data (file-system backup) only into a pod it restores itself, through an init
//! container. So a Restore with `restoreVolumes: true` into a live application would bring
//! back no data at all. Before it creates the Velero Restore, the restore engine therefore
//! *replaces* the volumes the backup holds data for: it deletes the workloads whose pods
//! mount those claims, then the claims, waits until they are gone, and only then lets
//! Velero restore all of them from the backup (`docs/day-2-operations.md`, "Restore").
//!
//! The decision is a pure function of what the engine lists, so a restarted engine carries
//! on from what it finds ([`replace_step`]):
//! - the claims with data are those the backup's completed PodVolumeBackups name (annotation
//!   `velero.io/pvc-name`) in the target namespace;
//! - only objects the Velero Restore will bring back may be deleted: everything in the
//!   namespace in `Namespace` scope, objects labelled `app.kubernetes.io/instance=<release>`
//!   in `Release` scope (the Restore's own filter);
//! - a pod that mounts such a claim is removed through its top controller (Deployment through
//!   its ReplicaSet, StatefulSet, ReplicaSet, or the pod itself); a running pod owned by
//!   anything else (a DaemonSet, a Job) or out of scope stops the restore before anything is
//!   deleted; a finished pod (a hook Job's) is deleted itself when in scope.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::velero::{BackupScope, LABEL_INSTANCE, VeleroTarget};

/// Annotation Velero puts on a PodVolumeBackup: the claim the volume belongs to.
pub const ANNOTATION_PVC_NAME: &str = "velero.io/pvc-name";
/// Label Velero puts on a PodVolumeBackup: its Velero Backup.
pub const LABEL_BACKUP_NAME: &str = "velero.io/backup-name";

/// An object to delete (in the target namespace).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deletion {
    /// `Deployment`, `StatefulSet`, `ReplicaSet`, `Pod` or `PersistentVolumeClaim`.
    pub kind: &'static str,
    /// Its name.
    pub name: String,
    /// Its UID: deleted with this precondition, so a newer object of the same name is kept.
    pub uid: Option<String>,
}

impl Deletion {
    /// Static metric label of its kind.
    pub fn kind_label(&self) -> &'static str {
        self.kind
    }
}

/// What the engine does before creating the Velero Restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplaceStep {
    /// Nothing in the way: create the Velero Restore.
    Ready,
    /// Delete these (workloads first, by kind and name, then claims), then look again.
    Delete(Vec<Deletion>),
    /// Deletions are under way; the message says what is awaited.
    Waiting(String),
    /// The volumes cannot be replaced safely; nothing was deleted. End the Restore `Failed`.
    Refused(String),
}

/// What the engine listed in the target namespace.
#[derive(Debug, Clone, Default)]
pub struct Listed<'a> {
    /// The Velero Backup's PodVolumeBackups (label `velero.io/backup-name`).
    pub pod_volume_backups: &'a [Value],
    /// PersistentVolumeClaims of the target namespace.
    pub claims: &'a [Value],
    /// Pods of the target namespace.
    pub pods: &'a [Value],
    /// ReplicaSets of the target namespace (to find a pod's Deployment).
    pub replica_sets: &'a [Value],
}

/// The claims of `namespace` a completed PodVolumeBackup holds data for.
pub fn claims_with_data(pod_volume_backups: &[Value], namespace: &str) -> BTreeSet<String> {
    pod_volume_backups
        .iter()
        .filter(|pvb| str_at(pvb, "/spec/pod/namespace") == Some(namespace))
        .filter(|pvb| str_at(pvb, "/status/phase") == Some("Completed"))
        .filter_map(|pvb| {
            pvb.pointer("/metadata/annotations")
                .and_then(|a| a.get(ANNOTATION_PVC_NAME))
                .and_then(Value::as_str)
        })
        .map(str::to_owned)
        .collect()
}

/// The next step of replacing the volumes of `target` that the backup holds data for.
pub fn replace_step(target: &VeleroTarget, listed: &Listed<'_>) -> ReplaceStep {
    let with_data = claims_with_data(listed.pod_volume_backups, &target.namespace);
    if with_data.is_empty() {
        return ReplaceStep::Ready;
    }
    let in_scope = |obj: &Value| match target.scope {
        BackupScope::Namespace => true,
        BackupScope::Release => {
            obj.pointer("/metadata/labels")
                .and_then(|l| l.get(LABEL_INSTANCE))
                .and_then(Value::as_str)
                == Some(target.release_name.as_str())
        }
    };
    let mounts = |pod: &Value| -> Vec<String> {
        pod.pointer("/spec/volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| str_at(v, "/persistentVolumeClaim/claimName"))
            .filter(|claim| with_data.contains(*claim))
            .map(str::to_owned)
            .collect()
    };

    let mut workloads: BTreeSet<Deletion> = BTreeSet::new();
    let mut awaited: Vec<String> = Vec::new();
    for pod in listed.pods {
        let claims = mounts(pod);
        if claims.is_empty() {
            continue;
        }
        let pod_name = name(pod);
        // A finished pod (a completed or failed hook Job's) holds no data open: it goes
        // itself, whatever controls it (a finished Job creates no other), or is left alone.
        if matches!(str_at(pod, "/status/phase"), Some("Succeeded" | "Failed")) {
            if in_scope(pod) && !is_deleting(pod) {
                workloads.insert(deletion("Pod", pod));
            }
            continue;
        }
        let owner = match top_controller(pod, listed.replica_sets) {
            Ok(owner) => owner,
            Err(kind) => {
                return ReplaceStep::Refused(format!(
                    "pod {pod_name} mounts {} and is controlled by a {kind}, which a restore does not replace; \
                     nothing was deleted",
                    claims.join(", ")
                ));
            }
        };
        if !in_scope(owner.object) {
            return ReplaceStep::Refused(format!(
                "{} {} mounts {} but is outside what this restore brings back (release {}); nothing was deleted",
                owner.deletion.kind,
                owner.deletion.name,
                claims.join(", "),
                target.release_name
            ));
        }
        if is_deleting(owner.object) || is_deleting(pod) {
            awaited.push(format!("pod {pod_name}"));
        } else {
            workloads.insert(owner.deletion);
        }
    }

    let mut claims: Vec<Deletion> = Vec::new();
    for claim in listed.claims {
        let claim_name = name(claim);
        if !with_data.contains(claim_name) {
            continue;
        }
        if !in_scope(claim) {
            return ReplaceStep::Refused(format!(
                "PersistentVolumeClaim {claim_name} is not labelled {LABEL_INSTANCE}={}, so this restore would not \
                 bring it back; nothing was deleted",
                target.release_name
            ));
        }
        if is_deleting(claim) {
            awaited.push(format!("PersistentVolumeClaim {claim_name}"));
        } else {
            claims.push(deletion("PersistentVolumeClaim", claim));
        }
    }

    if workloads.is_empty() && claims.is_empty() {
        return if awaited.is_empty() {
            ReplaceStep::Ready
        } else {
            ReplaceStep::Waiting(format!(
                "replacing volumes: waiting for {} to be gone",
                awaited.join(", ")
            ))
        };
    }
    let mut deletions: Vec<Deletion> = workloads.into_iter().collect();
    deletions.extend(claims);
    ReplaceStep::Delete(deletions)
}

/// A pod's top controller and the object it was found in.
struct Owner<'a> {
    deletion: Deletion,
    object: &'a Value,
}

/// The object that keeps `pod` alive: its Deployment (through its ReplicaSet), StatefulSet or
/// ReplicaSet, or the pod itself. `Err(kind)` for any other controller.
fn top_controller<'a>(pod: &'a Value, replica_sets: &'a [Value]) -> Result<Owner<'a>, String> {
    let Some(owner) = controller_of(pod) else {
        return Ok(Owner {
            deletion: deletion("Pod", pod),
            object: pod,
        });
    };
    match owner.kind.as_str() {
        "StatefulSet" => Ok(Owner {
            // The StatefulSet itself is not listed: the pod's labels stand for it in scope.
            deletion: Deletion {
                kind: "StatefulSet",
                name: owner.name,
                uid: owner.uid,
            },
            object: pod,
        }),
        "ReplicaSet" => {
            let rs = replica_sets.iter().find(|rs| name(rs) == owner.name);
            match (rs, rs.and_then(controller_of)) {
                (Some(rs), Some(deployment)) if deployment.kind == "Deployment" => Ok(Owner {
                    deletion: Deletion {
                        kind: "Deployment",
                        name: deployment.name,
                        uid: deployment.uid,
                    },
                    object: rs,
                }),
                (Some(_), Some(other)) => Err(other.kind),
                (Some(rs), None) => Ok(Owner {
                    deletion: deletion("ReplicaSet", rs),
                    object: rs,
                }),
                // Already gone: the pod follows through garbage collection.
                (None, _) => Ok(Owner {
                    deletion: deletion("Pod", pod),
                    object: pod,
                }),
            }
        }
        _ => Err(owner.kind),
    }
}

struct OwnerRef {
    kind: String,
    name: String,
    uid: Option<String>,
}

fn controller_of(obj: &Value) -> Option<OwnerRef> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|o| o.get("controller").and_then(Value::as_bool) == Some(true))
        .map(|o| OwnerRef {
            kind: str_at(o, "/kind").unwrap_or_default().to_owned(),
            name: str_at(o, "/name").unwrap_or_default().to_owned(),
            uid: str_at(o, "/uid").map(str::to_owned),
        })
}

fn deletion(kind: &'static str, obj: &Value) -> Deletion {
    Deletion {
        kind,
        name: name(obj).to_owned(),
        uid: str_at(obj, "/metadata/uid").map(str::to_owned),
    }
}

fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null())
}

fn name(obj: &Value) -> &str {
    str_at(obj, "/metadata/name").unwrap_or_default()
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    obj.pointer(pointer).and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const NS: &str = "team-a";

    fn target(scope: BackupScope) -> VeleroTarget {
        VeleroTarget {
            namespace: NS.into(),
            release_name: "files".into(),
            scope,
        }
    }

    fn pvb(claim: &str, phase: &str) -> Value {
        json!({
            "metadata": {"name": format!("pvb-{claim}"), "annotations": {ANNOTATION_PVC_NAME: claim}},
            "spec": {"pod": {"namespace": NS, "name": "old-pod"}, "volume": "data"},
            "status": {"phase": phase},
        })
    }

    fn labels(release: &str) -> Value {
        json!({LABEL_INSTANCE: release})
    }

    fn claim(name: &str, release: &str) -> Value {
        json!({"metadata": {"name": name, "uid": format!("uid-{name}"), "labels": labels(release)}})
    }

    fn owned(kind: &str, name: &str) -> Value {
        json!([{"kind": kind, "name": name, "uid": format!("uid-{name}"), "controller": true}])
    }

    fn pod(name: &str, claim: &str, owner: Option<(&str, &str)>, release: &str) -> Value {
        let mut pod = json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": labels(release)},
            "spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}, {"name": "tmp", "emptyDir": {}}]},
        });
        if let Some((kind, owner)) = owner {
            pod["metadata"]["ownerReferences"] = owned(kind, owner);
        }
        pod
    }

    fn rs(name: &str, deployment: Option<&str>, release: &str) -> Value {
        let mut rs = json!({"metadata": {"name": name, "uid": format!("uid-{name}"), "labels": labels(release)}});
        if let Some(d) = deployment {
            rs["metadata"]["ownerReferences"] = owned("Deployment", d);
        }
        rs
    }

    fn deleting(mut obj: Value) -> Value {
        obj["metadata"]["deletionTimestamp"] = json!("2026-11-26T12:00:00Z");
        obj
    }

    fn del(kind: &'static str, name: &str) -> Deletion {
        Deletion {
            kind,
            name: name.into(),
            uid: Some(format!("uid-{name}")),
        }
    }

    fn step(scope: BackupScope, pvbs: &[Value], claims: &[Value], pods: &[Value], rss: &[Value]) -> ReplaceStep {
        replace_step(
            &target(scope),
            &Listed {
                pod_volume_backups: pvbs,
                claims,
                pods,
                replica_sets: rss,
            },
        )
    }

    #[test]
    fn only_completed_volume_backups_of_the_namespace_count() {
        let mut elsewhere = pvb("other", "Completed");
        elsewhere["spec"]["pod"]["namespace"] = json!("team-b");
        let got = claims_with_data(
            &[pvb("files-data", "Completed"), pvb("failed", "Failed"), elsewhere],
            NS,
        );
        assert_eq!(got, BTreeSet::from(["files-data".to_owned()]));
    }

    #[test]
    fn the_steps_of_replacing_a_deployments_claim() {
        use BackupScope::{Namespace, Release};
        let pvbs = [pvb("files-data", "Completed")];
        let claims = [claim("files-data", "files"), claim("unrelated", "files")];
        let rss = [rs("files-7d9", Some("files"), "files")];
        let app_pod = pod(
            "files-7d9-abc",
            "files-data",
            Some(("ReplicaSet", "files-7d9")),
            "files",
        );

        // Live: the Deployment (through its ReplicaSet) and the claim go; the other claim stays.
        assert_eq!(
            step(Release, &pvbs, &claims, std::slice::from_ref(&app_pod), &rss),
            ReplaceStep::Delete(vec![
                del("Deployment", "files"),
                del("PersistentVolumeClaim", "files-data")
            ])
        );
        // Being deleted: wait, and delete nothing twice.
        assert_eq!(
            step(
                Release,
                &pvbs,
                &[deleting(claims[0].clone())],
                &[deleting(app_pod.clone())],
                &rss
            ),
            ReplaceStep::Waiting(
                "replacing volumes: waiting for pod files-7d9-abc, PersistentVolumeClaim files-data to be gone".into()
            )
        );
        // Gone: Velero may restore.
        assert_eq!(step(Release, &pvbs, &claims[1..], &[], &[]), ReplaceStep::Ready);
        // A backup without volume data changes nothing.
        assert_eq!(
            step(Namespace, &[], &claims, std::slice::from_ref(&app_pod), &rss),
            ReplaceStep::Ready
        );
    }

    #[test]
    fn statefulsets_replica_sets_and_bare_pods() {
        use BackupScope::Namespace;
        let pvbs = [pvb("data-db-0", "Completed"), pvb("scratch", "Completed")];
        let claims = [claim("data-db-0", "files"), claim("scratch", "files")];
        let pods = [
            pod("db-0", "data-db-0", Some(("StatefulSet", "db")), "files"),
            pod("loose", "scratch", None, "files"),
            pod("rs-pod", "scratch", Some(("ReplicaSet", "bare-rs")), "files"),
        ];
        let rss = [rs("bare-rs", None, "files")];
        assert_eq!(
            step(Namespace, &pvbs, &claims, &pods, &rss),
            ReplaceStep::Delete(vec![
                del("Pod", "loose"),
                del("ReplicaSet", "bare-rs"),
                del("StatefulSet", "db"),
                del("PersistentVolumeClaim", "data-db-0"),
                del("PersistentVolumeClaim", "scratch"),
            ])
        );
    }

    #[test]
    fn finished_hook_pods_go_themselves() {
        use BackupScope::Release;
        let pvbs = [pvb("files-data", "Completed")];
        let claims = [claim("files-data", "files")];
        let mut hook = pod("files-migrate-x", "files-data", Some(("Job", "files-migrate")), "files");
        hook["status"] = json!({"phase": "Failed"});
        let mut foreign = pod("other-x", "files-data", Some(("Job", "other")), "other");
        foreign["status"] = json!({"phase": "Succeeded"});
        assert_eq!(
            step(Release, &pvbs, &claims, &[hook, foreign], &[]),
            ReplaceStep::Delete(vec![
                del("Pod", "files-migrate-x"),
                del("PersistentVolumeClaim", "files-data")
            ])
        );
    }

    #[test]
    fn refusals_delete_nothing() {
        use BackupScope::Release;
        let pvbs = [pvb("files-data", "Completed")];
        let claims = [claim("files-data", "files")];
        let daemon = pod("agent-x", "files-data", Some(("DaemonSet", "agent")), "files");
        let neighbour = pod("other-1", "files-data", None, "other");
        let unlabelled_claim = json!({"metadata": {"name": "files-data", "uid": "u"}});
        let cases = [
            (vec![daemon], claims.to_vec(), "controlled by a DaemonSet"),
            (
                vec![neighbour],
                claims.to_vec(),
                "Pod other-1 mounts files-data but is outside",
            ),
            (
                vec![],
                vec![unlabelled_claim],
                "is not labelled app.kubernetes.io/instance=files",
            ),
        ];
        for (pods, claims, words) in cases {
            match step(Release, &pvbs, &claims, &pods, &[]) {
                ReplaceStep::Refused(message) => {
                    assert!(
                        message.contains(words) && message.ends_with("nothing was deleted"),
                        "{message}"
                    )
                }
                other => panic!("{words}: {other:?}"),
            }
        }
    }
}
