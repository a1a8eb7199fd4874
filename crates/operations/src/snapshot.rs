//! CSI `VolumeSnapshot`s (`snapshot.storage.k8s.io/v1`) for a Snapshot Operation:
//! one per PVC, and when they are done (`docs/api/conditions.md` §3.4).
//!
//! A snapshot's `status.error` is retryable by design (the snapshot controller keeps
//! trying and clears it on success), so it keeps the Operation Running with the error in
//! the message instead of failing it.
//!
//! Each VolumeSnapshot is owned by its Operation when they share a namespace, so deleting
//! the Operation deletes the snapshots (and, with a `Delete` deletion policy on the
//! VolumeSnapshotClass, the data). PVCs of an application with a different
//! `targetNamespace` live elsewhere; their snapshots carry labels only (an owner
//! reference cannot cross namespaces).

use serde_json::{Value, json};

use crate::meta::{self, OpId};
use crate::progress::Progress;
use crate::status::Report;
use crate::{Error, names};
use api::{Operation, OperationType};

/// API version of VolumeSnapshots.
pub const API_VERSION: &str = "snapshot.storage.k8s.io/v1";
/// Kind of VolumeSnapshots.
pub const KIND: &str = "VolumeSnapshot";
/// Label naming the PVC a snapshot was taken of.
pub const LABEL_PVC: &str = "vworkspace.io/pvc";

/// The deterministic name of `op`'s snapshot of `pvc`: `<operation>-<pvc>-<hash>`.
pub fn snapshot_name(op: &OpId<'_>, pvc: &str) -> String {
    names::pair(op.name, pvc)
}

/// The VolumeSnapshot of `pvc` (in `pvc_namespace`) for a Snapshot Operation, with
/// `class` or, when `None`, the cluster's default VolumeSnapshotClass.
pub fn volume_snapshot_object(
    op: &Operation,
    pvc_namespace: &str,
    pvc: &str,
    class: Option<&str>,
) -> Result<Value, Error> {
    let id = OpId::of(op)?;
    if op.spec.type_ != OperationType::Snapshot {
        return Err(Error::InvalidSpec(format!(
            "a VolumeSnapshot is built for a Snapshot Operation, not {}",
            op.spec.type_.as_str()
        )));
    }
    if pvc.is_empty() {
        return Err(Error::InvalidSpec("snapshot.pvcs: a PVC name is empty".into()));
    }
    let mut metadata = meta::child_metadata(&id, &snapshot_name(&id, pvc), pvc_namespace);
    if let Some(labels) = metadata.get_mut("labels").and_then(Value::as_object_mut) {
        labels.insert(LABEL_PVC.into(), json!(names::label_value(pvc)));
    }
    let spec = match class {
        Some(class) => json!({ "source": { "persistentVolumeClaimName": pvc }, "volumeSnapshotClassName": class }),
        None => json!({ "source": { "persistentVolumeClaimName": pvc } }),
    };
    Ok(json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": spec,
    }))
}

/// Maps the Operation's VolumeSnapshots (whole objects as JSON) to progress. `expected`
/// is the number of PVCs to snapshot: snapshots not created (or not seen) yet count as
/// not ready, so an incomplete list never reads as done.
pub fn map_snapshots(snapshots: &[Value], expected: usize) -> Progress {
    let total = expected.max(snapshots.len());
    if total == 0 {
        return Progress::Succeeded {
            message: "No PersistentVolumeClaims to snapshot".into(),
            report: Report::default(),
        };
    }
    let ready = snapshots
        .iter()
        .filter(|s| s.pointer("/status/readyToUse").and_then(Value::as_bool) == Some(true))
        .count();
    if ready == total {
        return Progress::Succeeded {
            message: format!("{ready}/{total} VolumeSnapshots ready to use"),
            report: Report::default(),
        };
    }
    let mut errors: Vec<(String, &str)> = snapshots
        .iter()
        .filter(|s| s.pointer("/status/readyToUse").and_then(Value::as_bool) != Some(true))
        .filter_map(|s| {
            let message = s.pointer("/status/error/message").and_then(Value::as_str)?;
            Some((meta::display_name(s), message))
        })
        .collect();
    errors.sort();
    let mut message = format!("{ready}/{total} VolumeSnapshots ready to use");
    if let Some((name, error)) = errors.first() {
        message.push_str(&format!("; VolumeSnapshot {name}: {error}"));
        if errors.len() > 1 {
            message.push_str(&format!(" (and {} more with errors)", errors.len() - 1));
        }
        message.push_str("; the snapshot controller retries");
    }
    Progress::Running { message }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::tests::op;

    #[test]
    fn snapshot_object_shape() {
        let o = op("nextcloud-snap", OperationType::Snapshot);
        let s = volume_snapshot_object(&o, "team-a", "data-nextcloud-0", Some("csi-hostpath")).expect("builds");
        assert_eq!(s["apiVersion"], API_VERSION);
        assert_eq!(s["kind"], KIND);
        let name = s["metadata"]["name"].as_str().expect("name");
        assert!(name.starts_with("nextcloud-snap-data-nextcloud-0-"), "{name}");
        assert!(names::is_dns_label(name));
        assert_eq!(s["metadata"]["namespace"], "team-a");
        assert_eq!(s["metadata"]["ownerReferences"][0]["name"], "nextcloud-snap");
        assert_eq!(s["metadata"]["ownerReferences"][0]["kind"], "Operation");
        assert_eq!(s["metadata"]["labels"][LABEL_PVC], "data-nextcloud-0");
        assert_eq!(s["metadata"]["labels"]["vworkspace.io/operation"], "nextcloud-snap");
        assert_eq!(s["spec"]["source"]["persistentVolumeClaimName"], "data-nextcloud-0");
        assert_eq!(s["spec"]["volumeSnapshotClassName"], "csi-hostpath");

        let default_class = volume_snapshot_object(&o, "team-a", "data", None).expect("builds");
        assert!(default_class["spec"].get("volumeSnapshotClassName").is_none());

        // PVC in another namespace (targetNamespace): no owner reference.
        let elsewhere = volume_snapshot_object(&o, "team-a-apps", "data", None).expect("builds");
        assert_eq!(elsewhere["metadata"]["namespace"], "team-a-apps");
        assert!(elsewhere["metadata"].get("ownerReferences").is_none());

        // Long names still fit, and two PVCs never share a snapshot name.
        let long = "p".repeat(253);
        let a = volume_snapshot_object(&o, "team-a", &long, None).expect("builds");
        let b = volume_snapshot_object(&o, "team-a", &format!("{long}x"), None).expect("builds");
        assert!(names::is_dns_label(a["metadata"]["name"].as_str().expect("name")));
        assert_ne!(a["metadata"]["name"], b["metadata"]["name"]);
    }

    #[test]
    fn snapshot_object_refusals() {
        let backup = op("b", OperationType::Backup);
        assert!(matches!(
            volume_snapshot_object(&backup, "team-a", "data", None),
            Err(Error::InvalidSpec(_))
        ));
        let snap = op("s", OperationType::Snapshot);
        assert!(matches!(
            volume_snapshot_object(&snap, "team-a", "", None),
            Err(Error::InvalidSpec(_))
        ));
    }

    fn vs(name: &str, status: Value) -> Value {
        json!({"metadata": {"name": name, "namespace": "team-a"}, "status": status})
    }

    #[test]
    fn map_snapshots_table() {
        let ready = |n: &str| vs(n, json!({"readyToUse": true}));
        let cases: Vec<(&str, Vec<Value>, usize, Progress)> = vec![
            (
                "all ready",
                vec![ready("a"), ready("b")],
                2,
                Progress::Succeeded {
                    message: "2/2 VolumeSnapshots ready to use".into(),
                    report: Report::default(),
                },
            ),
            (
                "nothing to snapshot",
                vec![],
                0,
                Progress::Succeeded {
                    message: "No PersistentVolumeClaims to snapshot".into(),
                    report: Report::default(),
                },
            ),
            (
                "one not created yet",
                vec![ready("a")],
                2,
                Progress::Running {
                    message: "1/2 VolumeSnapshots ready to use".into(),
                },
            ),
            (
                "readyToUse false and unset",
                vec![ready("a"), vs("b", json!({"readyToUse": false})), vs("c", json!({}))],
                3,
                Progress::Running {
                    message: "1/3 VolumeSnapshots ready to use".into(),
                },
            ),
            (
                "no status at all",
                vec![json!({"metadata": {"name": "a"}})],
                1,
                Progress::Running {
                    message: "0/1 VolumeSnapshots ready to use".into(),
                },
            ),
            (
                "an error is retryable",
                vec![ready("a"), vs("b", json!({"readyToUse": false, "error": {"message": "driver timeout"}}))],
                2,
                Progress::Running {
                    message: "1/2 VolumeSnapshots ready to use; VolumeSnapshot team-a/b: driver timeout; the snapshot controller retries".into(),
                },
            ),
            (
                "several errors: first by name, and a count",
                vec![
                    vs("z", json!({"error": {"message": "z failed"}})),
                    vs("m", json!({"error": {"message": "m failed"}})),
                ],
                2,
                Progress::Running {
                    message: "0/2 VolumeSnapshots ready to use; VolumeSnapshot team-a/m: m failed (and 1 more with errors); the snapshot controller retries".into(),
                },
            ),
            (
                "a stale error on a ready snapshot is ignored",
                vec![vs("a", json!({"readyToUse": true, "error": {"message": "old"}}))],
                1,
                Progress::Succeeded {
                    message: "1/1 VolumeSnapshots ready to use".into(),
                    report: Report::default(),
                },
            ),
            (
                "more snapshots than expected: all must be ready",
                vec![ready("a"), vs("b", json!({}))],
                1,
                Progress::Running {
                    message: "1/2 VolumeSnapshots ready to use".into(),
                },
            ),
        ];
        for (name, snapshots, expected, progress) in cases {
            assert_eq!(map_snapshots(&snapshots, expected), progress, "{name}");
        }
    }
}
