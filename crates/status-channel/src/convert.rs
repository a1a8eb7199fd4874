//! From our CRDs to status events: full state of one object, never a delta.

use api::{ApplicationInstance, ApplicationInstanceStatus, Operation, OperationStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Resource, ResourceExt};

use crate::pb;

fn reference<K: Resource<DynamicType = ()>>(object: &K) -> pb::ObjectRef {
    pb::ObjectRef {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
    }
}

fn condition(c: &Condition) -> pb::Condition {
    pb::Condition {
        r#type: c.type_.clone(),
        status: c.status.clone(),
        reason: c.reason.clone(),
        message: c.message.clone(),
        observed_generation: c.observed_generation.unwrap_or_default(),
        last_transition_time: c.last_transition_time.0.to_string(),
    }
}

fn base<K: Resource<DynamicType = ()>>(object: &K, now: jiff::Timestamp) -> pb::ObjectStatus {
    pb::ObjectStatus {
        r#ref: Some(reference(object)),
        uid: object.meta().uid.clone().unwrap_or_default(),
        generation: object.meta().generation.unwrap_or_default(),
        resource_version: object.meta().resource_version.clone().unwrap_or_default(),
        observed_at: now.to_string(),
        ..Default::default()
    }
}

/// The event for an ApplicationInstance whose status is (now) `status`.
pub fn application(
    app: &ApplicationInstance,
    status: &ApplicationInstanceStatus,
    now: jiff::Timestamp,
) -> pb::ObjectStatus {
    pb::ObjectStatus {
        conditions: status.conditions.iter().map(condition).collect(),
        ..base(app, now)
    }
}

/// The event for an Operation whose status is (now) `status`.
pub fn operation(op: &Operation, status: &OperationStatus, now: jiff::Timestamp) -> pb::ObjectStatus {
    pb::ObjectStatus {
        conditions: status.conditions.iter().map(condition).collect(),
        phase: status
            .phase
            .and_then(|p| serde_json::to_value(p).ok())
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        ..base(op, now)
    }
}

/// The event for a deleted object.
pub fn deleted<K: Resource<DynamicType = ()>>(object: &K, now: jiff::Timestamp) -> pb::ObjectStatus {
    pb::ObjectStatus {
        deleted: true,
        ..base(object, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::{OperationPhase, OperationSpec};

    #[test]
    fn operation_events_carry_phase_and_identity() {
        let mut op = Operation::new("backup-1", OperationSpec::default());
        op.metadata.namespace = Some("team-a".into());
        op.metadata.uid = Some("u-1".into());
        op.metadata.generation = Some(1);
        let status = OperationStatus {
            phase: Some(OperationPhase::Running),
            ..Default::default()
        };
        let event = operation(&op, &status, jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(event.phase, "Running");
        let reference = event.r#ref.unwrap();
        assert_eq!(
            (
                reference.kind.as_str(),
                reference.namespace.as_str(),
                reference.name.as_str()
            ),
            ("Operation", "team-a", "backup-1")
        );
        assert_eq!(reference.api_version, "vworkspace.io/v1alpha1");
        assert_eq!(event.observed_at, "1970-01-01T00:00:00Z");
        assert!(!event.deleted);
    }
}
