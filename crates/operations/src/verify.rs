//! Verified restore (`restore.verify`): a backup restored into a scratch namespace, checked,
//! and thrown away, with the evidence kept in the Operation's status
//! (`docs/day-2-operations.md#verified-restore`).
//!
//! The restore engine carries out one [`Step`] per pass, decided by [`step`] from what it
//! observed: create the scratch namespace, create the Velero Restore (the application's
//! namespace mapped to the scratch one, volume data included), wait for the restored
//! Deployments and StatefulSets to become ready, run the application's verification Job,
//! record the verdict, remove the scratch namespace, and only then end the Operation.
//!
//! The verdict is recorded on the Velero Restore (annotation [`ANNOTATION_VERDICT`]), which
//! lives in Velero's namespace and outlives the scratch namespace: a restarted engine that
//! finds it only finishes the removal and reports it, and never checks twice.
//!
//! The scratch namespace's name is derived from the Operation's UID ([`scratch_namespace`]):
//! no tenant chooses it. It carries the Operation's labels and [`LABEL_SCRATCH`], which the
//! admission policy of `deploy/components/restore-engine` requires before the restore
//! engine may create it, delete it, or create anything in it. It copies the Pod Security
//! labels of the application's namespace, so the copy runs under the same rules as the
//! original.

use std::collections::BTreeMap;

use api::{RestoreVerification, RestoreVerificationStatus};
use jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::job::{self, restricted_job_spec};
use crate::meta::{self, OpId};
use crate::progress::Progress;
use crate::velero::{self, VeleroStatus};
use crate::{Error, names};

/// Prefix of every scratch namespace.
pub const SCRATCH_PREFIX: &str = "vws-verify-";
/// Label marking a scratch namespace, with the value [`SCRATCH_VALUE`].
pub const LABEL_SCRATCH: &str = "vworkspace.io/scratch";
/// Value of [`LABEL_SCRATCH`].
pub const SCRATCH_VALUE: &str = "restore-verification";
/// Annotation on the scratch namespace naming the namespace the copy came from.
pub const ANNOTATION_SOURCE_NAMESPACE: &str = "vworkspace.io/scratch-source-namespace";
/// Annotation on the scratch namespace naming its Operation (`<namespace>/<name>`).
pub const ANNOTATION_OPERATION: &str = "vworkspace.io/scratch-operation";
/// Annotation on the Velero Restore holding the verdict (JSON of [`RestoreVerificationStatus`]).
pub const ANNOTATION_VERDICT: &str = "vworkspace.io/verification";
/// Name of the verification Job in the scratch namespace.
pub const JOB_NAME: &str = "vworkspace-verification";
/// Label prefix of the Pod Security admission labels copied from the source namespace.
const POD_SECURITY_PREFIX: &str = "pod-security.kubernetes.io/";

/// The scratch namespace of `op`: [`SCRATCH_PREFIX`] and a hash of its UID.
pub fn scratch_namespace(op: &OpId<'_>) -> String {
    format!("{SCRATCH_PREFIX}{}", names::short_hash(op.uid))
}

/// The scratch namespace object: `op`'s labels, [`LABEL_SCRATCH`], the Pod Security labels
/// of the source namespace (`source_labels`), and the source named in an annotation.
pub fn namespace_object(op: &OpId<'_>, source_namespace: &str, source_labels: &BTreeMap<String, String>) -> Value {
    let mut labels: Map<String, Value> = meta::labels(op).into_iter().map(|(k, v)| (k, json!(v))).collect();
    for (key, value) in source_labels {
        if key.starts_with(POD_SECURITY_PREFIX) {
            labels.insert(key.clone(), json!(value));
        }
    }
    labels.insert(LABEL_SCRATCH.into(), json!(SCRATCH_VALUE));
    let mut annotations: Map<String, Value> = meta::annotations(op).into_iter().map(|(k, v)| (k, json!(v))).collect();
    annotations.insert(ANNOTATION_SOURCE_NAMESPACE.into(), json!(source_namespace));
    annotations.insert(ANNOTATION_OPERATION.into(), json!(op.display()));
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": scratch_namespace(op), "labels": labels, "annotations": annotations},
    })
}

/// Whether `namespace` (as JSON) is a scratch namespace of `op`.
pub fn is_scratch_of(namespace: &Value, op: &OpId<'_>) -> bool {
    let label = |key: &str| namespace.pointer(&format!("/metadata/labels/{}", key.replace('/', "~1")));
    label(LABEL_SCRATCH).and_then(Value::as_str) == Some(SCRATCH_VALUE) && meta::is_child_of(namespace, op)
}

/// The Operation a scratch namespace (as JSON) belongs to: `(namespace, name, uid)` from its
/// annotation and labels, or `None` when it does not say (not ours to judge).
pub fn owner_of(scratch: &Value) -> Option<(String, String, String)> {
    let annotation = scratch
        .pointer(&format!(
            "/metadata/annotations/{}",
            ANNOTATION_OPERATION.replace('/', "~1")
        ))
        .and_then(Value::as_str)?;
    let (namespace, name) = annotation.split_once('/')?;
    let uid = scratch
        .pointer(&format!(
            "/metadata/labels/{}",
            meta::LABEL_OPERATION_UID.replace('/', "~1")
        ))
        .and_then(Value::as_str)?;
    Some((namespace.to_owned(), name.to_owned(), uid.to_owned()))
}

/// Whether a scratch namespace is orphaned and must be removed: its Operation (`operation`,
/// as read by the name [`owner_of`] gives) is gone, or is another Operation of the same
/// name (another UID), or has ended (an ended verified restore removed its namespace before
/// reporting the end, so whatever is left was not its to keep). A namespace being deleted
/// already is not orphaned again.
pub fn is_orphaned(scratch: &Value, operation: Option<&api::Operation>) -> bool {
    if scratch.pointer("/metadata/deletionTimestamp").is_some() {
        return false;
    }
    let Some((_, _, uid)) = owner_of(scratch) else {
        return false;
    };
    match operation {
        None => true,
        Some(op) => {
            op.metadata.uid.as_deref().map(names::label_value) != Some(uid)
                || op
                    .status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .is_some_and(api::OperationPhase::is_terminal)
        }
    }
}

/// The verification Job of the application's `spec.restoreVerification.job`, in the scratch
/// namespace: held to Pod Security `restricted` like a Runbook's, with `VWS_VERIFY_NAMESPACE`,
/// `VWS_SOURCE_NAMESPACE` and `VWS_BACKUP_NAME` in every container. It has no owner (its
/// Operation is in another namespace); it goes with the scratch namespace.
pub fn job_object(
    op: &OpId<'_>,
    job_spec: &Value,
    scratch: &str,
    source_namespace: &str,
    backup: &str,
) -> Result<Value, Error> {
    let parameters = BTreeMap::from([
        ("VWS_VERIFY_NAMESPACE".to_owned(), scratch.to_owned()),
        ("VWS_SOURCE_NAMESPACE".to_owned(), source_namespace.to_owned()),
        ("VWS_BACKUP_NAME".to_owned(), backup.to_owned()),
    ]);
    let spec = restricted_job_spec(op, "spec.restoreVerification.job", job_spec, &parameters)?;
    Ok(json!({
        "apiVersion": job::API_VERSION,
        "kind": job::KIND,
        "metadata": meta::child_metadata(op, JOB_NAME, scratch),
        "spec": spec,
    }))
}

/// The verdict recorded on the Velero Restore, if any (one that does not parse is none:
/// the checks run again rather than a guess being reported).
pub fn recorded_verdict(restore: &Value) -> Option<RestoreVerificationStatus> {
    let text = restore
        .pointer(&format!(
            "/metadata/annotations/{}",
            ANNOTATION_VERDICT.replace('/', "~1")
        ))
        .and_then(Value::as_str)?;
    serde_json::from_str(text).ok()
}

/// The merge patch that records `verdict` on the Velero Restore.
pub fn verdict_patch(verdict: &RestoreVerificationStatus) -> Result<Value, Error> {
    let text = serde_json::to_string(verdict).map_err(|e| Error::InvalidSpec(format!("verdict: {e}")))?;
    Ok(json!({"metadata": {"annotations": {ANNOTATION_VERDICT: text}}}))
}

/// What the restore is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Plan<'a> {
    /// The Velero Backup restored.
    pub backup: &'a str,
    /// The scratch namespace ([`scratch_namespace`]).
    pub scratch: &'a str,
    /// The application's `spec.restoreVerification` (`None`: readiness only, default timeout).
    pub verification: Option<&'a RestoreVerification>,
}

/// What the engine observed in one pass.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The scratch namespace, if it exists.
    pub scratch: Option<&'a Value>,
    /// This Operation's Velero Restore, if it exists.
    pub restore: Option<&'a Value>,
    /// The Deployments and StatefulSets in the scratch namespace.
    pub workloads: &'a [Value],
    /// The verification Job, if it exists.
    pub job: Option<&'a Value>,
    /// Completed PodVolumeRestores of the Velero Restore (`None`: not listed).
    pub volumes_restored: Option<i64>,
    /// The time of the decision.
    pub now: Timestamp,
}

/// One step of a verified restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Create the scratch namespace ([`namespace_object`]).
    CreateNamespace,
    /// Create the Velero Restore into it.
    CreateRestore,
    /// Create the verification Job ([`job_object`]).
    CreateJob,
    /// Nothing to do but wait: the progress, for people.
    Wait(String),
    /// Record the verdict on the Velero Restore ([`verdict_patch`]).
    Record(RestoreVerificationStatus),
    /// Delete the scratch namespace (the verdict is recorded).
    RemoveNamespace(RestoreVerificationStatus),
    /// The scratch namespace is gone: end the Operation with this evidence.
    Done(RestoreVerificationStatus),
}

/// The next step of a verified restore (see the module docs).
pub fn step(plan: &Plan<'_>, seen: &Observed<'_>) -> Step {
    let terminating = seen
        .scratch
        .is_some_and(|ns| ns.pointer("/metadata/deletionTimestamp").is_some());
    if let Some(verdict) = seen.restore.and_then(recorded_verdict) {
        return match seen.scratch {
            None => Step::Done(RestoreVerificationStatus {
                scratch_namespace_removed: true,
                ..verdict
            }),
            Some(_) if terminating => Step::Wait(format!(
                "verification {}; removing the scratch namespace {}",
                if verdict.passed { "passed" } else { "failed" },
                plan.scratch
            )),
            Some(_) => Step::RemoveNamespace(verdict),
        };
    }
    let evidence = |passed: bool, message: String| RestoreVerificationStatus {
        backup: plan.backup.to_owned(),
        scratch_namespace: plan.scratch.to_owned(),
        items_restored: seen.restore.and_then(|r| VeleroStatus::of(r).progress?.items_restored),
        volumes_restored: seen.volumes_restored,
        workloads_ready: ready_workloads(seen.workloads),
        job: seen.job.map(meta::display_name),
        passed,
        message,
        scratch_namespace_removed: false,
    };
    let Some(restore) = seen.restore else {
        return match seen.scratch {
            None => Step::CreateNamespace,
            Some(_) if terminating => Step::Wait(format!(
                "the scratch namespace {} is still being removed (an earlier attempt)",
                plan.scratch
            )),
            Some(_) => Step::CreateRestore,
        };
    };
    if seen.scratch.is_none() || terminating {
        return Step::Record(evidence(
            false,
            format!(
                "the scratch namespace {} was removed by someone else before the verification ended",
                plan.scratch
            ),
        ));
    }
    let restored = match velero::map_restore(restore) {
        Progress::Running { message } => return Step::Wait(message),
        Progress::Failed { message, .. } => {
            return Step::Record(evidence(false, format!("the copy is not whole: {message}")));
        }
        Progress::Succeeded { message, .. } => message,
    };

    let timeout = plan.verification.map_or(
        RestoreVerification::DEFAULT_TIMEOUT_SECONDS,
        RestoreVerification::timeout_seconds,
    );
    let restored_at = restore
        .pointer("/status/completionTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<Timestamp>().ok());
    let timed_out = restored_at.is_some_and(|at| seen.now.duration_since(at).as_secs() > timeout);

    let not_ready = unready_workloads(seen.workloads);
    if !not_ready.is_empty() {
        return if timed_out {
            Step::Record(evidence(
                false,
                format!(
                    "{restored}; not ready {timeout} s after the restore: {}",
                    not_ready.join(", ")
                ),
            ))
        } else {
            Step::Wait(format!(
                "{restored}; waiting for {} to become ready",
                not_ready.join(", ")
            ))
        };
    }
    let ready = ready_workloads(seen.workloads);
    let ready_text = if ready.is_empty() {
        "no Deployment or StatefulSet to check".to_owned()
    } else {
        format!("ready: {}", ready.join(", "))
    };
    let Some(_) = plan.verification.and_then(|v| v.job.as_ref()) else {
        return Step::Record(evidence(true, format!("{restored}; {ready_text}")));
    };
    let Some(job) = seen.job else {
        return Step::CreateJob;
    };
    match job::map_job(job) {
        Progress::Running { message } if timed_out => Step::Record(evidence(
            false,
            format!("{restored}; {ready_text}; the verification did not finish within {timeout} s: {message}"),
        )),
        Progress::Running { message } => Step::Wait(format!("{restored}; {ready_text}; {message}")),
        Progress::Succeeded { message, .. } => {
            Step::Record(evidence(true, format!("{restored}; {ready_text}; {message}")))
        }
        Progress::Failed { message, .. } => {
            Step::Record(evidence(false, format!("{restored}; {ready_text}; {message}")))
        }
    }
}

/// `Kind/name` of a workload.
fn workload_name(workload: &Value) -> String {
    format!(
        "{}/{}",
        workload.get("kind").and_then(Value::as_str).unwrap_or("Workload"),
        workload
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    )
}

/// Ready and wanted replicas of a Deployment or StatefulSet (wanted defaults to 1).
fn replicas(workload: &Value) -> (i64, i64) {
    let wanted = workload.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    let ready = workload
        .pointer("/status/readyReplicas")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    (ready, wanted)
}

/// The workloads with every wanted replica ready, as `Kind/name`, sorted.
fn ready_workloads(workloads: &[Value]) -> Vec<String> {
    let mut names: Vec<String> = workloads
        .iter()
        .filter(|w| {
            let (ready, wanted) = replicas(w);
            ready >= wanted
        })
        .map(workload_name)
        .collect();
    names.sort();
    names
}

/// The workloads still short of ready replicas, as `Kind/name: ready/wanted ready`, sorted.
fn unready_workloads(workloads: &[Value]) -> Vec<String> {
    let mut names: Vec<String> = workloads
        .iter()
        .filter_map(|w| {
            let (ready, wanted) = replicas(w);
            (ready < wanted).then(|| format!("{}: {ready}/{wanted} ready", workload_name(w)))
        })
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests;
