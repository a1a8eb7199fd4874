//! Upgrade and Rollback: change the application's desired state (chart version and inline
//! values) on the ApplicationInstance, record it in the revision history, and wait for
//! Flux's verdict as relayed by the app controller. The app controller stays the only
//! writer of the HelmRelease. Who owns `spec.chart.version` and `spec.values`:
//! `docs/adr/0004-desired-version-ownership.md`.

use std::time::Duration;

use api::{
    ApplicationInstance, Operation, OperationPhase, OperationType, UpgradeFailurePolicy, conditions::operation_reasons,
};
use controller_kit::WriteVerb;
use kube::{
    Api,
    api::{ApiResource, Patch, PatchParams},
};
use operations::{
    Outcome,
    meta::{self, OpId},
    names,
    release::{self, DesiredState, Verdict},
    revisions::{self, AppRevision},
};
use serde_json::{Value, json};

use crate::children::{self, Child};
use crate::runtime::{Cx, Driver, DriverError, Watch};

/// Annotation on a child Rollback of a failed Upgrade: Flux's reason for the failure.
pub const ANNOTATION_CAUSE_REASON: &str = "vworkspace.io/cause-reason";
/// Annotation on a child Rollback of a failed Upgrade: Flux's message for the failure.
pub const ANNOTATION_CAUSE_MESSAGE: &str = "vworkspace.io/cause-message";

fn operations_resource() -> ApiResource {
    children::resource("vworkspace.io/v1alpha1", "Operation", "operations")
}

fn config_maps() -> ApiResource {
    children::resource("v1", "ConfigMap", "configmaps")
}

/// Drives Upgrade Operations.
#[derive(Debug, Default, Clone)]
pub struct UpgradeDriver;

/// Drives Rollback Operations.
#[derive(Debug, Default, Clone)]
pub struct RollbackDriver;

impl Driver for UpgradeDriver {
    fn op_type(&self) -> OperationType {
        OperationType::Upgrade
    }

    fn watches(&self) -> Vec<Watch> {
        vec![Watch::Applications, Watch::Owned(operations_resource())]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_secs(15)
    }

    async fn validate(&self, cx: &Cx) -> Result<Option<Outcome>, DriverError> {
        if let Some(refusal) = pinned_by_source(cx) {
            return Ok(Some(refusal));
        }
        // A history that cannot be read is refused before anything changes.
        history(cx).await?;
        Ok(None)
    }

    async fn drive(&self, cx: &Cx) -> Result<Outcome, DriverError> {
        let Some(params) = cx.op.spec.upgrade.as_ref() else {
            return Ok(Outcome::failed(
                operation_reasons::INVALID_SPEC,
                "spec.upgrade is missing",
            ));
        };
        let id = OpId::of(&cx.op)?;
        let mut reported = Vec::new();

        // 1. backupFirst: a child Backup Operation must succeed before anything changes.
        let backup_name = names::with_suffix(id.name, "backup");
        if params.backup_first == Some(true) {
            let object = child_operation(&cx.op, &backup_name, OperationType::Backup, json!({}), None)?;
            let backup = match children::ensure(cx, &operations_resource(), &object).await? {
                Child::Ours(backup) => backup,
                Child::Foreign(message) => return Ok(children::foreign(message)),
            };
            reported.extend(meta::reference_of(&backup));
            match phase_of(&backup) {
                Some(OperationPhase::Succeeded) => {}
                Some(phase @ (OperationPhase::Failed | OperationPhase::Expired)) => {
                    return Ok(Outcome::Failed {
                        reason: operation_reasons::BACKUP_FAILED.into(),
                        message: format!(
                            "pre-upgrade backup Operation {backup_name} ended {phase:?}: {}; the application was not changed",
                            result_of(&backup)
                        ),
                        children: reported,
                        counts: Default::default(),
                    });
                }
                _ => {
                    return Ok(Outcome::Running {
                        message: format!("waiting for the pre-upgrade backup Operation {backup_name}"),
                        children: reported,
                    });
                }
            }
        }

        let Some(app) = cx.app.as_ref() else {
            return Ok(Outcome::Failed {
                reason: operation_reasons::APPLICATION_NOT_FOUND.into(),
                message: "the ApplicationInstance was deleted during the upgrade".into(),
                children: reported,
                counts: Default::default(),
            });
        };

        // 4. After a failure: follow the remediation children.
        let rollback_name = names::with_suffix(id.name, "rollback");
        let restore_name = names::with_suffix(id.name, "restore");
        let ops: Api<Operation> = Api::namespaced(cx.client.clone(), cx.namespace());
        if let Some(rollback) = ops.get_opt(&rollback_name).await? {
            return remediation(cx, params.on_failure, &rollback, &restore_name, &backup_name, reported).await;
        }

        // 2. Record the baseline and the target, then set the target on the application.
        let (target, target_number, baseline) =
            upgrade_target(cx, app, &params.chart_version, params.values_patch.as_ref()).await?;
        reported.push(meta::object_ref(
            "v1",
            "ConfigMap",
            &revisions::config_map_name(id.application),
            id.namespace,
        ));
        if set_desired_state(cx, app, &target).await? {
            return Ok(Outcome::Running {
                message: format!(
                    "chart version {} set on the application (revision {target_number})",
                    target.chart_version
                ),
                children: reported,
            });
        }

        // 3. Flux's verdict.
        let settled = settled(release::verdict(app, &target.chart_version), reported, |message| {
            format!(
                "Upgraded to chart version {} (revision {target_number}): {message}",
                target.chart_version
            )
        });
        match settled {
            Settled::Outcome(outcome) => Ok(outcome),
            Settled::Failed(Failure {
                reason,
                message,
                mut reported,
            }) => match (params.on_failure.unwrap_or_default(), baseline) {
                (UpgradeFailurePolicy::None, _) | (_, None) => Ok(Outcome::Failed {
                    message: format!("upgrade to chart version {} failed: {message}", target.chart_version),
                    reason,
                    children: reported,
                    counts: Default::default(),
                }),
                (_, Some(baseline)) => {
                    let cause = json!({
                        ANNOTATION_CAUSE_REASON: reason,
                        ANNOTATION_CAUSE_MESSAGE: truncate(&message, 1000),
                    });
                    let object = child_operation(
                        &cx.op,
                        &rollback_name,
                        OperationType::Rollback,
                        json!({"revision": baseline}),
                        Some(cause),
                    )?;
                    if let Child::Foreign(message) = children::ensure(cx, &operations_resource(), &object).await? {
                        return Ok(children::foreign(message));
                    }
                    reported.push(meta::object_ref(
                        "vworkspace.io/v1alpha1",
                        "Operation",
                        &rollback_name,
                        id.namespace,
                    ));
                    Ok(Outcome::Running {
                        message: format!("upgrade failed ({reason}); rolling back to revision {baseline}"),
                        children: reported,
                    })
                }
            },
        }
    }
}

/// After a failed upgrade: the child Rollback, then (RollbackAndRestore) the child Restore.
async fn remediation(
    cx: &Cx,
    policy: Option<UpgradeFailurePolicy>,
    rollback: &Operation,
    restore_name: &str,
    backup_name: &str,
    mut reported: Vec<api::ObjectReference>,
) -> Result<Outcome, DriverError> {
    let namespace = cx.namespace().to_owned();
    let rollback_name = rollback.metadata.name.clone().unwrap_or_default();
    reported.push(meta::object_ref(
        "vworkspace.io/v1alpha1",
        "Operation",
        &rollback_name,
        &namespace,
    ));
    let annotations = rollback.metadata.annotations.clone().unwrap_or_default();
    let reason = annotations
        .get(ANNOTATION_CAUSE_REASON)
        .cloned()
        .unwrap_or_else(|| operation_reasons::FAILED.into());
    let cause = annotations.get(ANNOTATION_CAUSE_MESSAGE).cloned().unwrap_or_default();
    let rollback_status = rollback.status.clone().unwrap_or_default();
    let version = cx
        .op
        .spec
        .upgrade
        .as_ref()
        .map(|u| u.chart_version.as_str())
        .unwrap_or_default();
    let failed = |message: String, reported| Outcome::Failed {
        reason: reason.clone(),
        message,
        children: reported,
        counts: Default::default(),
    };
    let summary = format!("upgrade to chart version {version} failed ({reason}: {cause})");
    match rollback_status.phase {
        Some(OperationPhase::Succeeded) => {}
        Some(phase) if phase.is_terminal() => {
            return Ok(failed(
                format!(
                    "{summary}; rollback Operation {rollback_name} ended {phase:?}: {}",
                    rollback_status.result.unwrap_or_default()
                ),
                reported,
            ));
        }
        _ => {
            return Ok(Outcome::Running {
                message: format!("{summary}; rolling back (Operation {rollback_name})"),
                children: reported,
            });
        }
    }
    let rolled_back = format!("{summary}; rolled back: {}", rollback_status.result.unwrap_or_default());
    if policy != Some(UpgradeFailurePolicy::RollbackAndRestore) {
        return Ok(failed(rolled_back, reported));
    }
    let object = child_operation(
        &cx.op,
        restore_name,
        OperationType::Restore,
        json!({"source": {"operationName": backup_name}}),
        None,
    )?;
    let restore = match children::ensure(cx, &operations_resource(), &object).await? {
        Child::Ours(restore) => restore,
        Child::Foreign(message) => return Ok(children::foreign(message)),
    };
    reported.extend(meta::reference_of(&restore));
    match phase_of(&restore) {
        Some(phase) if phase.is_terminal() => Ok(failed(
            format!(
                "{rolled_back}; restore of the pre-upgrade backup (Operation {restore_name}) ended {phase:?}: {}",
                result_of(&restore)
            ),
            reported,
        )),
        _ => Ok(Outcome::Running {
            message: format!("{rolled_back}; restoring the pre-upgrade backup (Operation {restore_name})"),
            children: reported,
        }),
    }
}

impl Driver for RollbackDriver {
    fn op_type(&self) -> OperationType {
        OperationType::Rollback
    }

    fn watches(&self) -> Vec<Watch> {
        vec![Watch::Applications]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_secs(15)
    }

    async fn validate(&self, cx: &Cx) -> Result<Option<Outcome>, DriverError> {
        if let Some(refusal) = pinned_by_source(cx) {
            return Ok(Some(refusal));
        }
        let (Some(app), Some(params)) = (cx.app.as_ref(), cx.op.spec.rollback.as_ref()) else {
            return Ok(None);
        };
        let history = history(cx).await?;
        revisions::find_target(&history, params, release::current_revision(&history, app))?;
        Ok(None)
    }

    async fn drive(&self, cx: &Cx) -> Result<Outcome, DriverError> {
        let id = OpId::of(&cx.op)?;
        let Some(app) = cx.app.as_ref() else {
            return Ok(Outcome::failed(
                operation_reasons::APPLICATION_NOT_FOUND,
                "the ApplicationInstance was deleted during the rollback",
            ));
        };
        let params = cx.op.spec.rollback.clone().unwrap_or_default();
        let history = history(cx).await?;
        let (target, number, from) = match history.iter().find(|r| r.operation.as_deref() == Some(id.name)) {
            Some(mine) => (DesiredState::of_revision(mine), mine.number, None),
            None => {
                let chosen = revisions::find_target(&history, &params, release::current_revision(&history, app))?;
                let state = DesiredState::of_revision(chosen);
                let from = chosen.number;
                let number = record(cx, app, &history, &state, Some(id.name)).await?;
                (state, number, Some(from))
            }
        };
        let mut reported = vec![meta::object_ref(
            "v1",
            "ConfigMap",
            &revisions::config_map_name(id.application),
            id.namespace,
        )];
        reported.dedup();
        if set_desired_state(cx, app, &target).await? {
            let from = from.map(|f| format!(" from revision {f}")).unwrap_or_default();
            return Ok(Outcome::Running {
                message: format!(
                    "chart version {} and its values set on the application{from} (revision {number})",
                    target.chart_version
                ),
                children: reported,
            });
        }
        let settled = settled(release::verdict(app, &target.chart_version), reported, |message| {
            format!(
                "Rolled back to chart version {} (recorded as revision {number}): {message}",
                target.chart_version
            )
        });
        Ok(match settled {
            Settled::Outcome(outcome) => outcome,
            Settled::Failed(Failure {
                reason,
                message,
                reported,
            }) => Outcome::Failed {
                message: format!("rollback to chart version {} failed: {message}", target.chart_version),
                reason,
                children: reported,
                counts: Default::default(),
            },
        })
    }
}

/// Flux failed the release: what the Operation does next is its own policy.
struct Failure {
    reason: String,
    message: String,
    reported: Vec<api::ObjectReference>,
}

/// Flux's verdict for an Upgrade or a Rollback.
enum Settled {
    /// Still waiting, or released: the same for both types.
    Outcome(Outcome),
    /// Failed: each type has its own policy.
    Failed(Failure),
}

/// Flux's verdict; `released` words the result of a successful release.
fn settled(verdict: Verdict, reported: Vec<api::ObjectReference>, released: impl FnOnce(&str) -> String) -> Settled {
    match verdict {
        Verdict::Waiting(message) => Settled::Outcome(Outcome::Running {
            message,
            children: reported,
        }),
        Verdict::Released(message) => Settled::Outcome(Outcome::Succeeded {
            result: released(&message),
            children: reported,
            counts: Default::default(),
        }),
        Verdict::Failed { reason, message } => Settled::Failed(Failure {
            reason,
            message,
            reported,
        }),
    }
}

/// The chart version cannot change when the source pins it (OCIRepository, HelmChart).
fn pinned_by_source(cx: &Cx) -> Option<Outcome> {
    let app = cx.app.as_ref()?;
    let source = app.spec.chart.source_ref.as_ref()?;
    matches!(source.kind, api::SourceKind::OciRepository | api::SourceKind::HelmChart).then(|| {
        Outcome::failed(
            operation_reasons::NOT_SUPPORTED,
            format!(
                "the chart comes from a {} whose own spec pins the version; change the source instead",
                serde_json::to_value(source.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            ),
        )
    })
}

/// The application's revision history (empty when none was recorded).
async fn history(cx: &Cx) -> Result<Vec<AppRevision>, DriverError> {
    let name = revisions::config_map_name(&cx.op.spec.application_ref.name);
    match children::get(&cx.client, &config_maps(), cx.namespace(), &name).await? {
        Some(config_map) => Ok(revisions::parse_history(&config_map)?),
        None => Ok(Vec::new()),
    }
}

/// Records `state` (applied by `operation`) and writes the history; returns its number.
async fn record(
    cx: &Cx,
    app: &ApplicationInstance,
    history: &[AppRevision],
    state: &DesiredState,
    operation: Option<&str>,
) -> Result<i64, DriverError> {
    let (next, number) = revisions::record(history, &state.chart_version, &state.values, operation, cx.now);
    if next != history {
        write_history(cx, app, &next).await?;
    }
    Ok(number)
}

async fn write_history(cx: &Cx, app: &ApplicationInstance, history: &[AppRevision]) -> Result<(), DriverError> {
    let object = revisions::history_config_map(app, history)?;
    let name = revisions::config_map_name(&cx.op.spec.application_ref.name);
    cx.metrics.api_write(WriteVerb::Apply, "ConfigMap");
    Api::<kube::api::DynamicObject>::namespaced_with(cx.client.clone(), cx.namespace(), &config_maps())
        .patch(
            &name,
            &PatchParams::apply(cx.field_manager).force(),
            &Patch::Apply(&object),
        )
        .await?;
    Ok(())
}

/// The Upgrade's target state and revision number, recorded once (with the baseline before
/// it), and the baseline's revision number (`None` when the upgrade changes nothing).
async fn upgrade_target(
    cx: &Cx,
    app: &ApplicationInstance,
    chart_version: &str,
    values_patch: Option<&Value>,
) -> Result<(DesiredState, i64, Option<i64>), DriverError> {
    let me = cx.op.metadata.name.as_deref().unwrap_or_default();
    let history = history(cx).await?;
    if let Some(mine) = history.iter().find(|r| r.operation.as_deref() == Some(me)) {
        let baseline = history
            .iter()
            .filter(|r| r.number < mine.number)
            .map(|r| r.number)
            .max();
        return Ok((DesiredState::of_revision(mine), mine.number, baseline));
    }
    let current = DesiredState::of(app);
    let target = current.upgraded(chart_version, values_patch);
    let (with_baseline, baseline) = revisions::record(&history, &current.chart_version, &current.values, None, cx.now);
    let (next, number) = revisions::record(&with_baseline, &target.chart_version, &target.values, Some(me), cx.now);
    write_history(cx, app, &next).await?;
    Ok((target, number, Some(baseline)))
}

/// Sets `state` on the application (server-side apply, forced: the engine takes over the
/// two fields; ADR 0004). Returns whether anything changed.
async fn set_desired_state(cx: &Cx, app: &ApplicationInstance, state: &DesiredState) -> Result<bool, DriverError> {
    if DesiredState::of(app) == *state {
        return Ok(false);
    }
    let name = app.metadata.name.clone().unwrap_or_default();
    let spec = json!({"spec": {"chart": {"version": state.chart_version}, "values": state.values}});
    children::apply_application(cx, &name, spec).await?;
    Ok(true)
}

/// A child Operation of `parent` (owned by it; it takes the parent's place in the queue).
fn child_operation(
    parent: &Operation,
    name: &str,
    type_: OperationType,
    payload: Value,
    annotations: Option<Value>,
) -> Result<Value, DriverError> {
    let id = OpId::of(parent)?;
    let mut metadata = meta::child_metadata(&id, name, id.namespace);
    if let (Some(Value::Object(extra)), Some(Value::Object(existing))) = (annotations, metadata.get_mut("annotations"))
    {
        existing.extend(extra);
    }
    let field = match type_ {
        OperationType::Backup => "backup",
        OperationType::Restore => "restore",
        OperationType::Rollback => "rollback",
        OperationType::Snapshot => "snapshot",
        OperationType::Upgrade => "upgrade",
        OperationType::Runbook => "runbook",
    };
    Ok(json!({
        "apiVersion": "vworkspace.io/v1alpha1",
        "kind": "Operation",
        "metadata": metadata,
        "spec": {
            "type": type_.as_str(),
            "applicationRef": {"name": id.application},
            "requestId": child_request_id(id.request_id, field),
            field: payload,
        },
    }))
}

/// `<parent requestId>:<suffix>`, shortened with a hash when it would exceed 128 characters.
fn child_request_id(parent: &str, suffix: &str) -> String {
    let full = format!("{parent}:{suffix}");
    if full.len() <= 128 {
        return full;
    }
    let mut cut = 100;
    while !parent.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}-{}:{suffix}", &parent[..cut], names::short_hash(parent))
}

fn phase_of(object: &Value) -> Option<OperationPhase> {
    object
        .pointer("/status/phase")
        .cloned()
        .and_then(|p| serde_json::from_value(p).ok())
}

fn result_of(object: &Value) -> String {
    object
        .pointer("/status/result")
        .and_then(Value::as_str)
        .unwrap_or("no result")
        .to_owned()
}

/// `text` cut to at most `max` bytes, at a character boundary (Event notes, annotations).
pub(crate) fn truncate(text: &str, max: usize) -> String {
    let mut cut = text.len().min(max);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text[..cut].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_request_ids_stay_valid() {
        assert_eq!(child_request_id("req-1", "backup"), "req-1:backup");
        let long = "a".repeat(128);
        let id = child_request_id(&long, "rollback");
        assert!(id.len() <= 128, "{}", id.len());
        assert!(id.ends_with(":rollback"));
        assert_ne!(
            child_request_id(&long, "restore"),
            child_request_id(&"b".repeat(128), "restore")
        );
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
