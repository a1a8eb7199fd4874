//! The Upgrade state machine. [`determine_state`] checks, in this order, and the first
//! that holds is the state; [`next_action`] maps it to one action:
//!
//! | Stage | When | Action |
//! |---|---|---|
//! | [`Stage::Refused`] | no `spec.upgrade`; Operation without name, namespace or UID | report `Failed`, the error's reason |
//! | [`Stage::BackupToCreate`] | `backupFirst`, `<op>-backup` absent | create it, report `Running` |
//! | [`Stage::NameTaken`] | a child's name held by an object that is not the Upgrade's | report `Failed` (`Failed`) |
//! | [`Stage::BackupRunning`] | the backup has not ended | report `Running` |
//! | [`Stage::BackupEnded`] | the backup ended `Failed` or `Expired` | report `Failed` (`BackupFailed`); nothing changed |
//! | [`Stage::ApplicationGone`] | the ApplicationInstance was deleted | report `Failed` (`ApplicationNotFound`) |
//! | [`Stage::RollingBack`] | `<op>-rollback` exists (Flux failed the upgrade) and has not ended | report `Running` |
//! | [`Stage::RollbackEnded`] | it ended other than `Succeeded` | report `Failed`, Flux's reason |
//! | [`Stage::RolledBack`] | it succeeded, `onFailure: Rollback` | report `Failed`, Flux's reason |
//! | [`Stage::RestoreToCreate`] | it succeeded, `RollbackAndRestore`, `<op>-restore` absent | create it, report `Running` |
//! | [`Stage::Restoring`] | the restore has not ended | report `Running` |
//! | [`Stage::RestoreEnded`] | the restore ended (even `Succeeded`: the upgrade failed) | report `Failed`, Flux's reason |
//! | [`Stage::Refused`] | the revision history cannot be read or written | report `Failed` (`Failed`) |
//! | [`Stage::Setting`] | the target is not recorded, or not set on the application | record and set it, report `Running` (or record, and decide again) |
//! | [`Stage::Releasing`] | Flux has not finished with the target | report `Running` |
//! | [`Stage::Released`] | released and Ready | report `Succeeded` |
//! | [`Stage::ReleaseFailed`] | Flux failed it; `onFailure: None`, or no revision before the target | report `Failed`, Flux's reason |
//! | [`Stage::RollbackToCreate`] | Flux failed it; `onFailure` `Rollback` or `RollbackAndRestore` | create `<op>-rollback` to the baseline, report `Running` |
//!
//! The rollback child is followed under its name as it is found, without the ownership
//! check the backup and restore children get (as the engine always did; its creation is
//! checked like theirs).

use std::collections::BTreeMap;

use api::conditions::operation_reasons;
use api::text::prefix_within;
use api::{ApplicationInstance, ObjectReference, Operation, OperationPhase, OperationType, UpgradeFailurePolicy};
use jiff::Timestamp;
use serde_json::{Value, json};

use super::{Release, ReleaseAction, Setting, Target, history_reference, operation_reference};
use crate::meta::{self, OpId};
use crate::release::{self, DesiredState};
use crate::revisions::{self, AppRevision};
use crate::status::Outcome;
use crate::{Error, names};

/// Annotation on a child Rollback of a failed Upgrade: Flux's reason for the failure.
pub const ANNOTATION_CAUSE_REASON: &str = "vworkspace.io/cause-reason";
/// Annotation on a child Rollback of a failed Upgrade: Flux's message for the failure.
pub const ANNOTATION_CAUSE_MESSAGE: &str = "vworkspace.io/cause-message";
/// Longest cause message kept in the annotation, in bytes.
const CAUSE_MESSAGE_MAX_BYTES: usize = 1000;
/// Longest `requestId` (the CRD's limit), which a child's must respect too.
const MAX_REQUEST_ID: usize = 128;

/// The child Operations of an Upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpgradeChild {
    /// `backupFirst`: the pre-upgrade Backup.
    Backup,
    /// `onFailure`: the Rollback to the baseline revision.
    Rollback,
    /// `onFailure: RollbackAndRestore`: the Restore of the pre-upgrade Backup.
    Restore,
}

impl UpgradeChild {
    /// The child's name: `<upgrade>-backup`, `-rollback`, `-restore` (hashed when too long).
    pub fn name(self, upgrade: &str) -> String {
        names::with_suffix(upgrade, self.suffix())
    }

    /// Suffix of the name and of the `requestId`, and the payload field of the spec.
    fn suffix(self) -> &'static str {
        match self {
            UpgradeChild::Backup => "backup",
            UpgradeChild::Rollback => "rollback",
            UpgradeChild::Restore => "restore",
        }
    }

    fn operation_type(self) -> OperationType {
        match self {
            UpgradeChild::Backup => OperationType::Backup,
            UpgradeChild::Rollback => OperationType::Rollback,
            UpgradeChild::Restore => OperationType::Restore,
        }
    }
}

/// What the engine found under a child's name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ChildState {
    /// Nothing.
    #[default]
    Absent,
    /// An object that is not this Upgrade's child (no matching UID label).
    Foreign,
    /// This Upgrade's child.
    Ours(ChildStatus),
}

impl ChildState {
    /// `object` as read (`None`: absent), judged as a child of `parent`.
    pub fn of(object: Option<&Value>, parent: &OpId<'_>) -> Self {
        match object {
            None => ChildState::Absent,
            Some(object) if meta::is_child_of(object, parent) => ChildState::Ours(ChildStatus::of(object)),
            Some(_) => ChildState::Foreign,
        }
    }
}

/// What a child Operation says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChildStatus {
    /// `status.phase`.
    pub phase: Option<OperationPhase>,
    /// `status.result`.
    pub result: Option<String>,
    /// `metadata.annotations` (a child Rollback carries the failure's cause there).
    pub annotations: BTreeMap<String, String>,
}

impl ChildStatus {
    /// The status of a child Operation read as JSON.
    pub fn of(object: &Value) -> Self {
        Self {
            phase: object
                .pointer("/status/phase")
                .cloned()
                .and_then(|p| serde_json::from_value(p).ok()),
            result: object
                .pointer("/status/result")
                .and_then(Value::as_str)
                .map(str::to_owned),
            annotations: object
                .pointer("/metadata/annotations")
                .cloned()
                .and_then(|a| serde_json::from_value(a).ok())
                .unwrap_or_default(),
        }
    }
}

/// What the decision rests on, read by the engine.
#[derive(Debug, Clone)]
pub struct Observation<'a> {
    /// The Upgrade.
    pub op: &'a Operation,
    /// Its ApplicationInstance (`None`: deleted).
    pub app: Option<&'a ApplicationInstance>,
    /// `<op>-backup` (looked at only with `backupFirst`).
    pub backup: ChildState,
    /// `<op>-rollback`, whoever created it (see the module documentation).
    pub rollback: Option<ChildStatus>,
    /// `<op>-restore` (looked at only after a rollback with `RollbackAndRestore`).
    pub restore: ChildState,
    /// The application's revision history, or why it cannot be read.
    pub history: Result<Vec<AppRevision>, Error>,
    /// The time of this pass (recorded with new revisions).
    pub now: Timestamp,
}

/// Where an Upgrade stands: the stage, and the children to report with it.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// The stage.
    pub stage: Stage,
    /// Children, in the order they came into play.
    pub children: Vec<ObjectReference>,
}

/// The failure a child Rollback remediates, from its annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The target chart version.
    pub chart_version: String,
    /// Flux's reason (the Upgrade ends with it); `Failed` when the annotation is missing.
    pub reason: String,
    /// Flux's message.
    pub cause: String,
}

impl Failure {
    fn summary(&self) -> String {
        format!(
            "upgrade to chart version {} failed ({}: {})",
            self.chart_version, self.reason, self.cause
        )
    }

    fn rolled_back(&self, rollback_result: &str) -> String {
        format!("{}; rolled back: {rollback_result}", self.summary())
    }
}

/// The stages of an Upgrade (see the module documentation for when each holds).
#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// The Upgrade cannot be acted on.
    Refused(Error),
    /// `backupFirst`: create the pre-upgrade Backup.
    BackupToCreate {
        /// The child Operation.
        object: Value,
        /// Its name.
        backup: String,
    },
    /// A child's name is held by an object that is not the Upgrade's child.
    NameTaken {
        /// The name.
        name: String,
        /// Its namespace.
        namespace: String,
    },
    /// The pre-upgrade Backup runs.
    BackupRunning {
        /// Its name.
        backup: String,
    },
    /// The pre-upgrade Backup ended `Failed` or `Expired`.
    BackupEnded {
        /// Its name.
        backup: String,
        /// How it ended.
        phase: OperationPhase,
        /// Its result.
        result: String,
    },
    /// The ApplicationInstance was deleted during the upgrade.
    ApplicationGone,
    /// Flux failed the upgrade; the child Rollback runs.
    RollingBack {
        /// The failure.
        failure: Failure,
        /// The Rollback's name.
        rollback: String,
    },
    /// The child Rollback ended other than `Succeeded`.
    RollbackEnded {
        /// The failure.
        failure: Failure,
        /// The Rollback's name.
        rollback: String,
        /// How it ended.
        phase: OperationPhase,
        /// Its result.
        result: String,
    },
    /// The child Rollback succeeded and nothing else is asked for.
    RolledBack {
        /// The failure.
        failure: Failure,
        /// The Rollback's result.
        rollback_result: String,
    },
    /// Rolled back; create the child Restore of the pre-upgrade Backup.
    RestoreToCreate {
        /// The failure.
        failure: Failure,
        /// The Rollback's result.
        rollback_result: String,
        /// The child Operation.
        object: Value,
        /// Its name.
        restore: String,
    },
    /// Rolled back; the child Restore runs.
    Restoring {
        /// The failure.
        failure: Failure,
        /// The Rollback's result.
        rollback_result: String,
        /// The Restore's name.
        restore: String,
    },
    /// Rolled back; the child Restore ended.
    RestoreEnded {
        /// The failure.
        failure: Failure,
        /// The Rollback's result.
        rollback_result: String,
        /// The Restore's name.
        restore: String,
        /// How it ended.
        phase: OperationPhase,
        /// Its result.
        result: String,
    },
    /// The target is not recorded in the history, or not set on the application.
    Setting {
        /// What is left to do.
        setting: Setting,
        /// The ApplicationInstance's name.
        application: String,
        /// The target.
        target: Target,
    },
    /// Flux has not finished with the target.
    Releasing {
        /// Where it stands.
        message: String,
    },
    /// Flux released the target.
    Released {
        /// The target.
        target: Target,
        /// Flux's message.
        message: String,
    },
    /// Flux failed the target, and nothing is to be done about it.
    ReleaseFailed {
        /// The target chart version.
        chart_version: String,
        /// Flux's reason.
        reason: String,
        /// Flux's message.
        message: String,
    },
    /// Flux failed the target: create the child Rollback to the baseline.
    RollbackToCreate {
        /// The child Operation.
        object: Value,
        /// Its name.
        rollback: String,
        /// Flux's reason.
        reason: String,
        /// The revision it returns to.
        baseline: i64,
    },
}

/// Where the Upgrade stands (the first stage in the module table that holds).
pub fn determine_state(observation: &Observation<'_>) -> State {
    let refused = |error: Error| State {
        stage: Stage::Refused(error),
        children: Vec::new(),
    };
    let Some(params) = observation.op.spec.upgrade.as_ref() else {
        return refused(Error::InvalidSpec("spec.upgrade is missing".into()));
    };
    let id = match OpId::of(observation.op) {
        Ok(id) => id,
        Err(error) => return refused(error),
    };
    let name_taken = |name: String| State {
        stage: Stage::NameTaken {
            name,
            namespace: id.namespace.to_owned(),
        },
        children: Vec::new(),
    };
    let mut children = Vec::new();
    let at = |stage, children: &Vec<ObjectReference>| State {
        stage,
        children: children.clone(),
    };

    // 1. backupFirst: the pre-upgrade Backup must succeed before anything changes.
    if params.backup_first == Some(true) {
        let backup = UpgradeChild::Backup.name(id.name);
        children.push(operation_reference(&backup, id.namespace));
        match &observation.backup {
            ChildState::Absent => {
                let payload = params
                    .backup
                    .as_ref()
                    .and_then(|b| serde_json::to_value(b).ok())
                    .unwrap_or_else(|| json!({}));
                let object = child_operation(&id, UpgradeChild::Backup, payload, BTreeMap::new());
                return at(Stage::BackupToCreate { object, backup }, &children);
            }
            ChildState::Foreign => return name_taken(backup),
            ChildState::Ours(status) => match status.phase {
                Some(OperationPhase::Succeeded) => {}
                Some(phase @ (OperationPhase::Failed | OperationPhase::Expired)) => {
                    let result = status.result.clone().unwrap_or_else(|| "no result".into());
                    return at(Stage::BackupEnded { backup, phase, result }, &children);
                }
                _ => return at(Stage::BackupRunning { backup }, &children),
            },
        }
    }

    // 2. The application.
    let Some(app) = observation.app else {
        return at(Stage::ApplicationGone, &children);
    };

    // 3. A child Rollback exists: Flux failed the upgrade, and the remediation decides.
    if let Some(rollback) = &observation.rollback {
        return remediation(observation, params, &id, rollback, children);
    }

    // 4. Record the baseline and the target, then set the target on the application.
    let history = match &observation.history {
        Ok(history) => history,
        Err(error) => return refused(error.clone()),
    };
    let (target, baseline, unrecorded) = match history.iter().find(|r| r.operation.as_deref() == Some(id.name)) {
        Some(mine) => {
            let baseline = history
                .iter()
                .filter(|r| r.number < mine.number)
                .map(|r| r.number)
                .max();
            let target = Target {
                state: DesiredState::of_revision(mine),
                revision: mine.number,
            };
            (target, baseline, None)
        }
        None => {
            let current = DesiredState::of(app);
            let state = current.upgraded(&params.chart_version, params.values_patch.as_ref());
            let (with_baseline, baseline) =
                revisions::record(history, &current.chart_version, &current.values, None, observation.now);
            let (next, revision) = revisions::record(
                &with_baseline,
                &state.chart_version,
                &state.values,
                Some(id.name),
                observation.now,
            );
            (Target { state, revision }, Some(baseline), Some(next))
        }
    };
    children.push(history_reference(id.application, id.namespace));
    match Setting::of(app, &target.state, unrecorded) {
        Ok(Some(setting)) => {
            let application = super::application_name(app);
            return at(
                Stage::Setting {
                    setting,
                    application,
                    target,
                },
                &children,
            );
        }
        Ok(None) => {}
        Err(error) => return refused(error),
    }

    // 5. Flux's verdict, and onFailure.
    let stage = match Release::from(release::verdict(app, &target.state.chart_version)) {
        Release::Waiting { message } => Stage::Releasing { message },
        Release::Released { message } => Stage::Released { target, message },
        Release::Failed { reason, message } => match (params.on_failure.unwrap_or_default(), baseline) {
            (UpgradeFailurePolicy::None, _) | (_, None) => Stage::ReleaseFailed {
                chart_version: target.state.chart_version,
                reason,
                message,
            },
            (_, Some(baseline)) => {
                let rollback = UpgradeChild::Rollback.name(id.name);
                let cause = BTreeMap::from([
                    (ANNOTATION_CAUSE_REASON.to_owned(), reason.clone()),
                    (
                        ANNOTATION_CAUSE_MESSAGE.to_owned(),
                        prefix_within(&message, CAUSE_MESSAGE_MAX_BYTES).to_owned(),
                    ),
                ]);
                Stage::RollbackToCreate {
                    object: child_operation(&id, UpgradeChild::Rollback, json!({"revision": baseline}), cause),
                    rollback,
                    reason,
                    baseline,
                }
            }
        },
    };
    at(stage, &children)
}

/// After a failed upgrade: the child Rollback, then (`RollbackAndRestore`) the child Restore.
fn remediation(
    observation: &Observation<'_>,
    params: &api::UpgradeParams,
    id: &OpId<'_>,
    rollback: &ChildStatus,
    mut children: Vec<ObjectReference>,
) -> State {
    let rollback_name = UpgradeChild::Rollback.name(id.name);
    children.push(operation_reference(&rollback_name, id.namespace));
    let annotation = |key: &str| rollback.annotations.get(key).cloned();
    let failure = Failure {
        chart_version: params.chart_version.clone(),
        reason: annotation(ANNOTATION_CAUSE_REASON).unwrap_or_else(|| operation_reasons::FAILED.into()),
        cause: annotation(ANNOTATION_CAUSE_MESSAGE).unwrap_or_default(),
    };
    let rollback_result = rollback.result.clone().unwrap_or_default();
    let stage = match rollback.phase {
        Some(OperationPhase::Succeeded) => None,
        Some(phase) if phase.is_terminal() => Some(Stage::RollbackEnded {
            failure: failure.clone(),
            rollback: rollback_name,
            phase,
            result: rollback_result.clone(),
        }),
        _ => Some(Stage::RollingBack {
            failure: failure.clone(),
            rollback: rollback_name,
        }),
    };
    if let Some(stage) = stage {
        return State { stage, children };
    }
    if params.on_failure != Some(UpgradeFailurePolicy::RollbackAndRestore) {
        return State {
            stage: Stage::RolledBack {
                failure,
                rollback_result,
            },
            children,
        };
    }
    let restore = UpgradeChild::Restore.name(id.name);
    let stage = match &observation.restore {
        ChildState::Absent => {
            let backup = UpgradeChild::Backup.name(id.name);
            // The volume data comes back when the pre-upgrade backup holds it.
            let volumes = params.backup.as_ref().and_then(|b| b.include_volumes).unwrap_or(false);
            let payload = if volumes {
                json!({"source": {"operationName": backup}, "restoreVolumes": true})
            } else {
                json!({"source": {"operationName": backup}})
            };
            Stage::RestoreToCreate {
                failure,
                rollback_result,
                object: child_operation(id, UpgradeChild::Restore, payload, BTreeMap::new()),
                restore,
            }
        }
        ChildState::Foreign => {
            return State {
                stage: Stage::NameTaken {
                    name: restore,
                    namespace: id.namespace.to_owned(),
                },
                children: Vec::new(),
            };
        }
        ChildState::Ours(status) => match status.phase {
            Some(phase) if phase.is_terminal() => Stage::RestoreEnded {
                failure,
                rollback_result,
                restore,
                phase,
                result: status.result.clone().unwrap_or_else(|| "no result".into()),
            },
            _ => Stage::Restoring {
                failure,
                rollback_result,
                restore,
            },
        },
    };
    children.push(operation_reference(&UpgradeChild::Restore.name(id.name), id.namespace));
    State { stage, children }
}

/// What to do in `state` (see the module documentation).
pub fn next_action(state: State) -> ReleaseAction {
    let State { stage, children } = state;
    let running = |message: String, children: Vec<ObjectReference>| Outcome::Running { message, children };
    let failed = |reason: String, message: String, children: Vec<ObjectReference>| Outcome::Failed {
        reason,
        message,
        children,
        report: Default::default(),
    };
    match stage {
        Stage::Refused(error) => ReleaseAction::Report(error.outcome()),
        Stage::BackupToCreate { object, backup } => ReleaseAction::CreateChild {
            object,
            then: running(
                format!("waiting for the pre-upgrade backup Operation {backup}"),
                children,
            ),
        },
        Stage::NameTaken { name, namespace } => ReleaseAction::Report(Outcome::failed(
            operation_reasons::FAILED,
            format!(
                "Operation {namespace}/{name} already exists and was not created by this Operation; it is left alone"
            ),
        )),
        Stage::BackupRunning { backup } => ReleaseAction::Report(running(
            format!("waiting for the pre-upgrade backup Operation {backup}"),
            children,
        )),
        Stage::BackupEnded { backup, phase, result } => ReleaseAction::Report(failed(
            operation_reasons::BACKUP_FAILED.into(),
            format!("pre-upgrade backup Operation {backup} ended {phase:?}: {result}; the application was not changed"),
            children,
        )),
        Stage::ApplicationGone => ReleaseAction::Report(failed(
            operation_reasons::APPLICATION_NOT_FOUND.into(),
            "the ApplicationInstance was deleted during the upgrade".into(),
            children,
        )),
        Stage::RollingBack { failure, rollback } => ReleaseAction::Report(running(
            format!("{}; rolling back (Operation {rollback})", failure.summary()),
            children,
        )),
        Stage::RollbackEnded {
            failure,
            rollback,
            phase,
            result,
        } => ReleaseAction::Report(failed(
            failure.reason.clone(),
            format!(
                "{}; rollback Operation {rollback} ended {phase:?}: {result}",
                failure.summary()
            ),
            children,
        )),
        Stage::RolledBack {
            failure,
            rollback_result,
        } => ReleaseAction::Report(failed(
            failure.reason.clone(),
            failure.rolled_back(&rollback_result),
            children,
        )),
        Stage::RestoreToCreate {
            failure,
            rollback_result,
            object,
            restore,
        } => ReleaseAction::CreateChild {
            object,
            then: running(
                format!(
                    "{}; restoring the pre-upgrade backup (Operation {restore})",
                    failure.rolled_back(&rollback_result)
                ),
                children,
            ),
        },
        Stage::Restoring {
            failure,
            rollback_result,
            restore,
        } => ReleaseAction::Report(running(
            format!(
                "{}; restoring the pre-upgrade backup (Operation {restore})",
                failure.rolled_back(&rollback_result)
            ),
            children,
        )),
        Stage::RestoreEnded {
            failure,
            rollback_result,
            restore,
            phase,
            result,
        } => ReleaseAction::Report(failed(
            failure.reason.clone(),
            format!(
                "{}; restore of the pre-upgrade backup (Operation {restore}) ended {phase:?}: {result}",
                failure.rolled_back(&rollback_result)
            ),
            children,
        )),
        Stage::Setting {
            setting,
            application,
            target,
        } => {
            let then = running(
                format!(
                    "chart version {} set on the application (revision {})",
                    target.state.chart_version, target.revision
                ),
                children,
            );
            setting.action(application, &target.state, then)
        }
        Stage::Releasing { message } => ReleaseAction::Report(running(message, children)),
        Stage::Released { target, message } => ReleaseAction::Report(Outcome::Succeeded {
            result: format!(
                "Upgraded to chart version {} (revision {}): {message}",
                target.state.chart_version, target.revision
            ),
            children,
            report: Default::default(),
        }),
        Stage::ReleaseFailed {
            chart_version,
            reason,
            message,
        } => ReleaseAction::Report(failed(
            reason,
            format!("upgrade to chart version {chart_version} failed: {message}"),
            children,
        )),
        Stage::RollbackToCreate {
            object,
            rollback,
            reason,
            baseline,
        } => {
            let mut children = children;
            children.push(operation_reference(&rollback, namespace_of(&object)));
            ReleaseAction::CreateChild {
                object,
                then: running(
                    format!("upgrade failed ({reason}); rolling back to revision {baseline}"),
                    children,
                ),
            }
        }
    }
}

fn namespace_of(object: &Value) -> &str {
    object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// A child Operation of `parent` (owned by it; it takes the parent's place in the queue).
pub fn child_operation(
    parent: &OpId<'_>,
    child: UpgradeChild,
    payload: Value,
    extra_annotations: BTreeMap<String, String>,
) -> Value {
    let name = child.name(parent.name);
    let mut metadata = meta::child_metadata(parent, &name, parent.namespace);
    if let Some(Value::Object(annotations)) = metadata.get_mut("annotations") {
        annotations.extend(extra_annotations.into_iter().map(|(k, v)| (k, Value::String(v))));
    }
    let field = child.suffix();
    json!({
        "apiVersion": api::API_VERSION,
        "kind": "Operation",
        "metadata": metadata,
        "spec": {
            "type": child.operation_type().as_str(),
            "applicationRef": {"name": parent.application},
            "requestId": child_request_id(parent.request_id, field),
            field: payload,
        },
    })
}

/// `<parent requestId>:<suffix>`, shortened with a hash when it would exceed 128 characters.
pub fn child_request_id(parent: &str, suffix: &str) -> String {
    let full = format!("{parent}:{suffix}");
    if full.len() <= MAX_REQUEST_ID {
        return full;
    }
    format!("{}-{}:{suffix}", prefix_within(parent, 100), names::short_hash(parent))
}
