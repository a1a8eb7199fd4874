//! Status reports built from the CRs (pure): the cluster is the source of truth, so every
//! report can be rebuilt from the objects at any time.

use api::{ApplicationInstance, Operation, OperationPhase, conditions};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};

use crate::{
    MANAGED_BY_AGENT,
    messages::{ObjectKind, ObjectReport, ObjectState, ReportCondition},
};

fn report_conditions(conditions: &[Condition]) -> Vec<ReportCondition> {
    conditions
        .iter()
        .map(|c| ReportCondition {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            last_transition_time: c.last_transition_time.0,
            observed_generation: c.observed_generation,
        })
        .collect()
}

fn managed_by_agent(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(api::LABEL_MANAGED_BY))
        .is_some_and(|v| v == MANAGED_BY_AGENT)
}

fn base(kind: ObjectKind, meta: &ObjectMeta, state: ObjectState, observed_at: Timestamp) -> ObjectReport {
    ObjectReport {
        kind,
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone(),
        state,
        generation: meta.generation,
        observed_generation: None,
        resource_version: meta.resource_version.clone(),
        managed_by_agent: managed_by_agent(meta),
        conditions: Vec::new(),
        phase: None,
        result: None,
        start_time: None,
        completion_time: None,
        request_id: None,
        deployed_chart_version: None,
        desired_chart_version: None,
        backup_schedule: None,
        verification: None,
        created_at: meta.creation_timestamp.as_ref().map(|t| t.0),
        observed_at,
    }
}

/// The summary state of an ApplicationInstance.
///
/// `Ready` only counts when the status was computed for the current generation: a spec
/// change that the app controller has not observed yet is `progressing`, never `ready`
/// on the strength of the previous spec.
pub fn application_state(app: &ApplicationInstance) -> ObjectState {
    if app.metadata.deletion_timestamp.is_some() {
        return ObjectState::Deleting;
    }
    if app.spec.suspend {
        return ObjectState::Suspended;
    }
    let Some(status) = &app.status else {
        return ObjectState::Progressing;
    };
    if status.observed_generation.is_none() || status.observed_generation != app.metadata.generation {
        return ObjectState::Progressing;
    }
    let condition = |type_: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| c.status.as_str())
    };
    // kstatus, as Flux writes it: Stalled=True is a failure; Ready=False while
    // Reconciling=True is work in progress (helm-controller says SourceNotReady while the
    // chart is still being fetched), not a failure, unless the source itself failed.
    // A source not ready yet while the release is still in progress (Ready=Unknown with
    // Reconciling=True: the first chart fetch) is progress; with Ready=False it failed.
    let in_progress = condition(conditions::types::READY).is_none_or(|s| s == "Unknown")
        && condition(conditions::types::RECONCILING) == Some("True");
    let failed = condition(conditions::types::STALLED) == Some("True")
        || (condition(conditions::types::SOURCE_READY) == Some("False") && !in_progress);
    match (condition(conditions::types::READY), failed) {
        (Some("True"), _) => ObjectState::Ready,
        (_, true) => ObjectState::NotReady,
        _ if condition(conditions::types::RECONCILING) == Some("True") => ObjectState::Progressing,
        (Some("False"), _) => ObjectState::NotReady,
        _ => ObjectState::Progressing,
    }
}

/// The report of an ApplicationInstance.
pub fn application_report(app: &ApplicationInstance, observed_at: Timestamp) -> ObjectReport {
    let mut r = base(
        ObjectKind::ApplicationInstance,
        &app.metadata,
        application_state(app),
        observed_at,
    );
    r.desired_chart_version = app.spec.chart.version.clone();
    if let Some(status) = &app.status {
        r.observed_generation = status.observed_generation;
        r.conditions = report_conditions(&status.conditions);
        r.deployed_chart_version = status.deployed_chart_version.clone();
        r.backup_schedule = status
            .backup_schedule
            .as_ref()
            .map(crate::schedule::BackupScheduleReport::of);
    }
    r
}

/// The summary state of an Operation (its phase; `pending` until an engine wrote one).
pub fn operation_state(op: &Operation) -> ObjectState {
    let phase = op.status.as_ref().and_then(|s| s.phase);
    if op.metadata.deletion_timestamp.is_some() {
        return ObjectState::Deleting;
    }
    match phase {
        None | Some(OperationPhase::Pending) => ObjectState::Pending,
        Some(OperationPhase::Running) => ObjectState::Running,
        Some(OperationPhase::Succeeded) => ObjectState::Succeeded,
        Some(OperationPhase::Failed) => ObjectState::Failed,
        Some(OperationPhase::Expired) => ObjectState::Expired,
    }
}

/// The report of an Operation.
pub fn operation_report(op: &Operation, observed_at: Timestamp) -> ObjectReport {
    let mut r = base(ObjectKind::Operation, &op.metadata, operation_state(op), observed_at);
    r.request_id = Some(op.spec.request_id.clone());
    if let Some(status) = &op.status {
        r.observed_generation = status.observed_generation;
        r.conditions = report_conditions(&status.conditions);
        r.phase = status.phase.map(|p| format!("{p:?}"));
        r.result = status.result.clone();
        r.start_time = status.start_time.as_ref().map(|t| t.0);
        r.completion_time = status.completion_time.as_ref().map(|t| t.0);
        r.verification = status
            .verification
            .as_ref()
            .map(crate::verification::VerificationReport::of);
    }
    r
}

/// The report of an object that no longer exists.
pub fn deleted_report(
    kind: ObjectKind,
    namespace: &str,
    name: &str,
    uid: Option<String>,
    observed_at: Timestamp,
) -> ObjectReport {
    let meta = ObjectMeta {
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        uid,
        ..Default::default()
    };
    base(kind, &meta, ObjectState::Deleted, observed_at)
}

/// Whether two reports carry the same information (everything but `observed_at`), so
/// an unchanged object is not reported again.
pub fn same_content(a: &ObjectReport, b: &ObjectReport) -> bool {
    let mut b = b.clone();
    b.observed_at = a.observed_at;
    *a == b
}

#[cfg(test)]
mod tests {
    use api::{ApplicationInstanceStatus, OperationStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn cond(type_: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "R".into(),
            message: "m".into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: Some(2),
        }
    }

    fn app(generation: i64, observed: Option<i64>, ready: Option<&str>) -> ApplicationInstance {
        let mut a = ApplicationInstance::new("wiki", Default::default());
        a.metadata.namespace = Some("team-a".into());
        a.metadata.generation = Some(generation);
        a.status = observed.map(|o| ApplicationInstanceStatus {
            observed_generation: Some(o),
            conditions: ready.map(|s| vec![cond("Ready", s)]).unwrap_or_default(),
            ..Default::default()
        });
        a
    }

    #[test]
    fn application_states() {
        assert_eq!(application_state(&app(1, None, None)), ObjectState::Progressing);
        assert_eq!(
            application_state(&app(2, Some(1), Some("True"))),
            ObjectState::Progressing
        );
        assert_eq!(application_state(&app(2, Some(2), Some("True"))), ObjectState::Ready);
        assert_eq!(
            application_state(&app(2, Some(2), Some("False"))),
            ObjectState::NotReady
        );
        assert_eq!(
            application_state(&app(2, Some(2), Some("Unknown"))),
            ObjectState::Progressing
        );
        let with = |ready: &str, extra: &[(&str, &str)]| {
            let mut a = app(2, Some(2), Some(ready));
            let st = a.status.as_mut().unwrap();
            st.conditions.extend(extra.iter().map(|(t, v)| cond(t, v)));
            application_state(&a)
        };
        assert_eq!(with("False", &[("Reconciling", "True")]), ObjectState::Progressing);
        assert_eq!(
            with("False", &[("Reconciling", "True"), ("Stalled", "True")]),
            ObjectState::NotReady
        );
        assert_eq!(with("Unknown", &[("Stalled", "True")]), ObjectState::NotReady);
        assert_eq!(with("False", &[("Reconciling", "False")]), ObjectState::NotReady);
        assert_eq!(with("True", &[("Reconciling", "True")]), ObjectState::Ready);
        assert_eq!(
            with("False", &[("Reconciling", "True"), ("SourceReady", "False")]),
            ObjectState::NotReady,
            "a failing source is not progress"
        );
        assert_eq!(
            with("Unknown", &[("Reconciling", "True"), ("SourceReady", "False")]),
            ObjectState::Progressing,
            "the first chart fetch of a new install (issue 18)"
        );
        assert_eq!(
            with("Unknown", &[("SourceReady", "False")]),
            ObjectState::NotReady,
            "a source that failed, with nothing reconciling"
        );
        let mut s = app(2, Some(2), Some("True"));
        s.spec.suspend = true;
        assert_eq!(application_state(&s), ObjectState::Suspended);
        let mut d = app(2, Some(2), Some("True"));
        d.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(application_state(&d), ObjectState::Deleting);
    }

    #[test]
    fn operation_report_carries_phase_and_times() {
        let mut op = Operation::new("backup-1", Default::default());
        op.metadata.namespace = Some("team-a".into());
        op.spec.request_id = "odoo-1".into();
        assert_eq!(operation_report(&op, Timestamp::UNIX_EPOCH).state, ObjectState::Pending);
        op.status = Some(OperationStatus {
            phase: Some(OperationPhase::Succeeded),
            start_time: Some(Time(Timestamp::UNIX_EPOCH)),
            completion_time: Some(Time(Timestamp::UNIX_EPOCH)),
            result: Some("done".into()),
            conditions: vec![cond("Succeeded", "True")],
            ..Default::default()
        });
        let r = operation_report(&op, Timestamp::UNIX_EPOCH);
        assert_eq!(r.state, ObjectState::Succeeded);
        assert_eq!(r.phase.as_deref(), Some("Succeeded"));
        assert_eq!(r.request_id.as_deref(), Some("odoo-1"));
        assert!(r.completion_time.is_some() && r.conditions.len() == 1);
    }

    #[test]
    fn same_content_ignores_observed_at() {
        let a = application_report(&app(1, None, None), Timestamp::UNIX_EPOCH);
        let mut b = a.clone();
        b.observed_at = Timestamp::now();
        assert!(same_content(&a, &b));
        b.state = ObjectState::Ready;
        assert!(!same_content(&a, &b));
    }
}
