//! Condition types and the reasons the operator sets itself.
//!
//! This is the machine-readable half of `docs/api/conditions.md`. Reasons that
//! come from Flux (e.g. `InstallFailed`, `UpgradeFailed`, `ArtifactFailed`) are
//! relayed verbatim and deliberately not listed here: the operator does not
//! invent a vocabulary on top of Flux's, and a reason Flux adds tomorrow flows
//! through unchanged.
//!
//! It also holds the one conditions setter both CRDs use ([`Setter`], [`set`]): replace or
//! append a condition by type, `lastTransitionTime` moving only when the status changes,
//! `observedGeneration` stamped on each condition written, and [`sort`] for a CRD that
//! orders its list. Each CRD keeps its own rules where its status is computed (which
//! conditions exist, their reasons, message bounds, order): `app-controller/src/status.rs`
//! and `operations/src/status.rs`. The setter lives here, not in `controller-kit`, because
//! `operations` is a pure crate and must not depend on controller-kit's runtime.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition types.
pub mod types {
    /// Summary: the application is deployed at the desired state (normal-true).
    pub const READY: &str = "Ready";
    /// Work is under way (abnormal-true, present only when True, kstatus).
    pub const RECONCILING: &str = "Reconciling";
    /// No progress without a change (abnormal-true, present only when True, kstatus).
    pub const STALLED: &str = "Stalled";
    /// Relayed from the HelmRelease: result of the last install/upgrade.
    pub const RELEASED: &str = "Released";
    /// Relayed from the HelmRelease: result of the last Helm test.
    pub const TEST_SUCCESS: &str = "TestSuccess";
    /// Relayed from the HelmRelease: result of the last remediation.
    pub const REMEDIATED: &str = "Remediated";
    /// Relayed from the HelmRelease: drift between the release manifest and the cluster.
    pub const DRIFTED: &str = "Drifted";
    /// Relayed from the chart source (HelmRepository / OCIRepository / HelmChart): present only while
    /// the source is not ready (status `False`, the source's reason and message), removed once it is.
    pub const SOURCE_READY: &str = "SourceReady";

    /// Operation summary for bounded work: Unknown while pending or running, True/False at the end.
    pub const SUCCEEDED: &str = "Succeeded";

    /// Engine conditions relayed from a HelmRelease onto an ApplicationInstance.
    pub const RELAYED_FROM_HELMRELEASE: [&str; 7] =
        [READY, RELEASED, TEST_SUCCESS, REMEDIATED, DRIFTED, RECONCILING, STALLED];
}

/// Reasons the operator sets on ApplicationInstances.
pub mod reasons {
    /// Ready=Unknown / Reconciling=True: the engine object does not exist yet, or the engine has not
    /// yet observed the desired state last written to it (its generation and any reconcile request).
    /// Also what the Flux engine says of a chart source that has not reported on its current
    /// generation (work in progress: no `SourceReady` on the app).
    pub const AWAITING_ENGINE: &str = "AwaitingEngine";
    /// Reserved (Ready=Unknown / Reconciling=True, nothing applied yet). The app controller does not
    /// set it today: a new ApplicationInstance goes straight to `AwaitingEngine`.
    pub const PROGRESSING: &str = "Progressing";
    /// Ready=False / Stalled=True: the spec is valid for the API server but cannot be materialised.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Ready=False: a non-optional ConfigMap named in valuesFrom does not exist (Secrets are not read:
    /// Flux reports a missing Secret itself).
    pub const REFERENCED_OBJECT_NOT_FOUND: &str = "ReferencedObjectNotFound";
    /// Ready=False / Stalled=True: the namespace or target namespace is outside the controller's allow-list.
    pub const NAMESPACE_NOT_ALLOWED: &str = "NamespaceNotAllowed";
    /// Ready=False: the engine's CRDs (e.g. Flux's HelmRelease) are not installed; re-checked every 30 s.
    pub const ENGINE_NOT_INSTALLED: &str = "EngineNotInstalled";
    /// Ready=False / Stalled=True: the requested engine is not available in this build/cluster.
    pub const ENGINE_UNAVAILABLE: &str = "EngineUnavailable";
    /// Ready=False: writing the engine objects failed (forbidden, conflict, server error).
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// Ready=False: an ApplicationInstance in dependsOn does not exist; nothing is materialised,
    /// re-checked every 30 s.
    pub const DEPENDENCY_NOT_FOUND: &str = "DependencyNotFound";
    /// Ready=Unknown / Reconciling=True: the ApplicationInstance is being deleted and the release
    /// uninstalled.
    pub const UNINSTALLING: &str = "Uninstalling";
    /// `spec.suspend` is true: Ready keeps its status and `lastTransitionTime`, its reason becomes
    /// `Suspended` and its message carries the engine's last state; Reconciling is removed.
    pub const SUSPENDED: &str = "Suspended";
    /// Ready=False: the release ServiceAccount, its RoleBinding, or the namespace's Pod Security
    /// labels could not be ensured (e.g. Forbidden, or the target namespace does not exist);
    /// nothing is materialised, re-checked every 30 s.
    pub const TENANT_SETUP_FAILED: &str = "TenantSetupFailed";
    /// Ready=False / Stalled=True: `spec.chart.repository.url` breaks the app controller's
    /// repository rules (an internal address, a host outside the allow-list, or plain http to a
    /// host not allowed for it); nothing is materialised, so no credentials go to that host.
    pub const REPOSITORY_NOT_ALLOWED: &str = "RepositoryNotAllowed";
    /// Reconciling=True: a chart version change waits for the next maintenance window (ADR
    /// 0009); the message names the version and the window. The release stays as it is, and
    /// the other conditions describe it.
    pub const WAITING_FOR_MAINTENANCE_WINDOW: &str = "WaitingForMaintenanceWindow";
    /// Reconciling=True: `spec.maintenanceWindows` cannot be used (an unknown time zone, a
    /// duration out of range); a chart version change is held until it is fixed.
    pub const INVALID_MAINTENANCE_WINDOW: &str = "InvalidMaintenanceWindow";

    /// Every reason the app controller sets itself (for docs and tests).
    pub const APP_REASONS: [&str; 15] = [
        AWAITING_ENGINE,
        PROGRESSING,
        INVALID_SPEC,
        REFERENCED_OBJECT_NOT_FOUND,
        NAMESPACE_NOT_ALLOWED,
        ENGINE_NOT_INSTALLED,
        ENGINE_UNAVAILABLE,
        APPLY_FAILED,
        DEPENDENCY_NOT_FOUND,
        UNINSTALLING,
        SUSPENDED,
        TENANT_SETUP_FAILED,
        REPOSITORY_NOT_ALLOWED,
        WAITING_FOR_MAINTENANCE_WINDOW,
        INVALID_MAINTENANCE_WINDOW,
    ];
}

/// Reasons the day-2 engines set on Operations (condition `Succeeded`).
pub mod operation_reasons {
    /// Pending: waiting for `spec.notBefore`.
    pub const WAITING_FOR_NOT_BEFORE: &str = "WaitingForNotBefore";
    /// Pending: another mutating operation on the same application runs first.
    pub const QUEUED: &str = "Queued";
    /// Pending: an Upgrade, Rollback or Restore that is not `urgent` waits for the
    /// application's next maintenance window, which the message names (ADR 0009).
    pub const QUEUED_FOR_MAINTENANCE_WINDOW: &str = "QueuedForMaintenanceWindow";
    /// Pending: the application's `spec.maintenanceWindows` cannot be used (an unknown time
    /// zone, a duration out of range); the Operation waits until they are fixed, or its deadline.
    pub const INVALID_MAINTENANCE_WINDOW: &str = "InvalidMaintenanceWindow";
    /// Running: the child objects exist and are being driven.
    pub const RUNNING: &str = "Running";
    /// Succeeded=True.
    pub const COMPLETED: &str = "Completed";
    /// Succeeded=False: the underlying engine reported failure (message says why).
    pub const FAILED: &str = "Failed";
    /// Expired: not started before `spec.deadline`; nothing was done.
    pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
    /// Succeeded=True without acting: the requestId was already handled (see status.duplicateOf).
    pub const DUPLICATE_REQUEST: &str = "DuplicateRequest";
    /// Failed: spec.applicationRef names no ApplicationInstance.
    pub const APPLICATION_NOT_FOUND: &str = "ApplicationNotFound";
    /// Failed: the operation's namespace is outside the engine's allow-list.
    pub const NAMESPACE_NOT_ALLOWED: &str = "NamespaceNotAllowed";
    /// Failed: the backup to restore from does not exist or did not succeed.
    pub const BACKUP_NOT_FOUND: &str = "BackupNotFound";
    /// Failed: an Upgrade's pre-upgrade backup (`backupFirst`) did not succeed; nothing was changed.
    pub const BACKUP_FAILED: &str = "BackupFailed";
    /// Failed: the payload asks for something this engine does not do (yet).
    pub const NOT_SUPPORTED: &str = "NotSupported";
    /// Failed: the payload cannot be acted on (e.g. a Job spec that does not parse).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Failed: the controller the operation drives (Velero, CSI snapshots) is not installed.
    pub const ENGINE_NOT_INSTALLED: &str = "EngineNotInstalled";
    /// Failed: Velero ended the Backup or Restore in phase `PartiallyFailed` (Velero's phase name,
    /// kept as the reason; the message carries the warning and error counts).
    pub const PARTIALLY_FAILED: &str = "PartiallyFailed";
    /// Failed: a Restore with `restoreVolumes` cannot replace the application's volumes safely
    /// (a claim is mounted by a DaemonSet or Job, or by something the restore would not bring
    /// back); nothing was deleted.
    pub const VOLUMES_NOT_REPLACED: &str = "VolumesNotReplaced";
    /// Failed: a Rollback names a revision (or chart version) that the application's revision
    /// history does not hold.
    pub const REVISION_NOT_FOUND: &str = "RevisionNotFound";
    /// Failed: a verified restore's copy did not pass its checks (a workload not ready in time,
    /// the verification Job failed, or Velero could not restore it whole); the evidence is in
    /// `status.verification` and the scratch namespace was removed.
    pub const VERIFICATION_FAILED: &str = "VerificationFailed";
    /// Failed: the restore engine may not create the scratch namespace of a verified restore
    /// (an installation without the rights of `deploy/components/restore-engine`).
    pub const SCRATCH_NAMESPACE_FORBIDDEN: &str = "ScratchNamespaceForbidden";
}

/// Replaces the condition of the same type in `list`, or appends `condition` when there is
/// none, keeping the existing `lastTransitionTime` when `status` did not change
/// (apimachinery's `meta.SetStatusCondition`). The other conditions, and the position of
/// a replaced one, are left as they are.
pub fn set(list: &mut Vec<Condition>, mut condition: Condition) {
    match list.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(existing) => {
            if existing.status == condition.status {
                condition.last_transition_time = existing.last_transition_time.clone();
            }
            *existing = condition;
        }
        None => list.push(condition),
    }
}

/// Removes the condition of type `type_`, if any.
pub fn remove(list: &mut Vec<Condition>, type_: &str) {
    list.retain(|c| c.type_ != type_);
}

/// The condition of type `type_`, if any.
pub fn find<'a>(list: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    list.iter().find(|c| c.type_ == type_)
}

/// Stable order: the types in `leading` first, in that order, then the others by type.
pub fn sort(list: &mut [Condition], leading: &[&str]) {
    let rank = |t: &str| leading.iter().position(|l| *l == t).unwrap_or(leading.len());
    list.sort_by(|a, b| rank(&a.type_).cmp(&rank(&b.type_)).then_with(|| a.type_.cmp(&b.type_)));
}

/// Sets conditions on one status for one pass: every condition written carries the
/// object's `observedGeneration` and, when its status changes (or it is new), `now` as its
/// `lastTransitionTime` (see [`set`]).
#[derive(Debug)]
pub struct Setter<'a> {
    list: &'a mut Vec<Condition>,
    observed_generation: Option<i64>,
    now: &'a Time,
}

impl<'a> Setter<'a> {
    /// A setter on `list` for an object at `metadata.generation` `observed_generation`, at `now`.
    pub fn new(list: &'a mut Vec<Condition>, observed_generation: Option<i64>, now: &'a Time) -> Self {
        Self {
            list,
            observed_generation,
            now,
        }
    }

    /// Sets the condition `type_` (see [`set`]). Reason and message are taken as given:
    /// bounding the message and validating the reason are the CRD's rules, applied before.
    pub fn set(&mut self, type_: &str, status: &str, reason: impl Into<String>, message: impl Into<String>) {
        set(
            self.list,
            Condition {
                type_: type_.to_owned(),
                status: status.to_owned(),
                reason: reason.into(),
                message: message.into(),
                observed_generation: self.observed_generation,
                last_transition_time: self.now.clone(),
            },
        );
    }

    /// Removes the condition `type_`, if any.
    pub fn remove(&mut self, type_: &str) {
        remove(self.list, type_);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(s: &str) -> Time {
        Time(s.parse().expect("timestamp"))
    }

    const T0: &str = "2026-12-01T02:00:00Z";
    const T1: &str = "2026-12-01T02:05:00Z";

    fn cond(type_: &str, status: &str, reason: &str, at: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: format!("{type_} is {status}"),
            observed_generation: Some(1),
            last_transition_time: time(at),
        }
    }

    #[test]
    fn set_keeps_the_transition_time_only_while_the_status_stays() {
        // (stored status, new status, expected lastTransitionTime)
        let cases = [
            (None, "True", T1),
            (Some("True"), "True", T0),
            (Some("True"), "False", T1),
            (Some("Unknown"), "Unknown", T0),
            (Some("Unknown"), "True", T1),
        ];
        for (stored, status, expected) in cases {
            let mut list = vec![cond("Other", "True", "Mine", T0)];
            if let Some(stored) = stored {
                list.push(cond("Ready", stored, "Before", T0));
            }
            let mut new = cond("Ready", status, "After", T1);
            new.observed_generation = Some(2);
            set(&mut list, new);
            assert_eq!(list.len(), 2, "{stored:?} -> {status}");
            assert_eq!(list[0], cond("Other", "True", "Mine", T0), "others untouched");
            let ready = find(&list, "Ready").expect("set");
            assert_eq!(ready.status, status);
            assert_eq!(ready.reason, "After", "reason replaced");
            assert_eq!(ready.observed_generation, Some(2));
            assert_eq!(ready.last_transition_time, time(expected), "{stored:?} -> {status}");
        }
    }

    #[test]
    fn setter_stamps_generation_and_time_and_removes() {
        let mut list = vec![cond("Ready", "False", "Old", T0), cond("Stalled", "True", "Old", T0)];
        let now = time(T1);
        let mut setter = Setter::new(&mut list, Some(7), &now);
        setter.set("Ready", "False", "New", "still failing");
        setter.set("Reconciling", "True", "Work", String::from("on it"));
        setter.remove("Stalled");
        setter.remove("Absent");
        let types: Vec<_> = list.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "Reconciling"], "replaced in place, appended, removed");
        let ready = &list[0];
        assert_eq!(
            (ready.reason.as_str(), ready.message.as_str()),
            ("New", "still failing")
        );
        assert_eq!(ready.last_transition_time, time(T0), "False -> False keeps it");
        assert_eq!(ready.observed_generation, Some(7));
        assert_eq!(list[1].last_transition_time, time(T1), "new condition");
        assert_eq!(list[1].observed_generation, Some(7));
    }

    #[test]
    fn sort_puts_leading_types_first_then_by_type() {
        let mut list: Vec<_> = ["Zeta", "Stalled", "Alpha", "Ready", "Reconciling"]
            .into_iter()
            .map(|t| cond(t, "True", "R", T0))
            .collect();
        sort(&mut list, &["Ready", "Reconciling", "Stalled"]);
        let types: Vec<_> = list.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "Reconciling", "Stalled", "Alpha", "Zeta"]);
        sort(&mut list, &[]);
        let types: Vec<_> = list.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Alpha", "Ready", "Reconciling", "Stalled", "Zeta"]);
    }
}
