//! Upgrade and Rollback as explicit state machines, on the model of Flux helm-controller
//! (`DetermineReleaseState` → `actionForState`). The engine reads what a decision rests on
//! into an observation; `determine_state` says where the Operation stands; `next_action`
//! says what to do about it; the engine carries the [`ReleaseAction`] out and, for
//! [`ReleaseAction::RecordRevisions`] only, decides again on what it wrote. Nothing here
//! does IO or reads the clock. The behaviour is `docs/day-2-operations.md` ("Upgrade",
//! "Rollback"); each module lists its states.
//!
//! | Module | Machine |
//! |---|---|
//! | [`upgrade`] | backupFirst → record and set the target → Flux's verdict → onFailure (child Rollback, then child Restore) |
//! | [`rollback`] | choose and record the target once → set it → Flux's verdict |

pub mod rollback;
pub mod upgrade;

#[cfg(test)]
mod tests;

use api::maintenance::ANNOTATION_OPERATION_CHART_VERSION;
use api::{ApplicationInstance, ObjectReference};
use serde_json::Value;

use crate::meta;
use crate::release::DesiredState;
use crate::revisions::{self, AppRevision};
use crate::status::Outcome;

/// What the engine does next for an Upgrade or a Rollback.
#[derive(Debug, Clone, PartialEq)]
pub enum ReleaseAction {
    /// Create this child Operation, then report `then`. A name taken by another object
    /// since it was read fails the Operation instead.
    CreateChild {
        /// The child Operation.
        object: Value,
        /// The outcome once it exists.
        then: Outcome,
    },
    /// Write the revision history ConfigMap, then decide again on `history`.
    RecordRevisions {
        /// The ConfigMap to apply.
        config_map: Value,
        /// The history it holds.
        history: Vec<AppRevision>,
    },
    /// Write the revision history ConfigMap when there is one, then set the desired state on
    /// the ApplicationInstance, then report `then`.
    SetDesiredState {
        /// The ConfigMap to apply first, when the target is not recorded yet.
        config_map: Option<Value>,
        /// Name of the ApplicationInstance.
        application: String,
        /// The fields to apply to it (`spec.chart.version`, `spec.values`).
        fields: Value,
        /// The outcome once set.
        then: Outcome,
    },
    /// Nothing to change: report this outcome.
    Report(Outcome),
}

/// The target of an Upgrade or a Rollback as the history holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// Chart version and values.
    pub state: DesiredState,
    /// Its revision number.
    pub revision: i64,
}

/// Where recording and setting the target stand, when something is left to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Setting {
    /// Not recorded yet, and the application asks for something else: record, then set.
    RecordAndSet {
        /// The history ConfigMap holding the target.
        config_map: Value,
    },
    /// Not recorded yet, but the application already asks for it: record, then decide again.
    Record {
        /// The history ConfigMap holding the target.
        config_map: Value,
        /// The history it holds.
        history: Vec<AppRevision>,
    },
    /// Recorded; the application asks for something else: set it (again).
    Set,
}

impl Setting {
    /// What is left to do for `target` on `app` (`None`: nothing, it is recorded and set).
    /// `unrecorded` is the history that would hold the target, when the stored one does not.
    fn of(
        app: &ApplicationInstance,
        target: &DesiredState,
        unrecorded: Option<Vec<AppRevision>>,
    ) -> Result<Option<Self>, crate::Error> {
        let set = DesiredState::of(app) == *target;
        Ok(match (unrecorded, set) {
            (None, true) => None,
            (None, false) => Some(Setting::Set),
            (Some(history), false) => Some(Setting::RecordAndSet {
                config_map: revisions::history_config_map(app, &history)?,
            }),
            (Some(history), true) => Some(Setting::Record {
                config_map: revisions::history_config_map(app, &history)?,
                history,
            }),
        })
    }

    /// The action for this setting of `target` on `application`; `then` is reported once set.
    fn action(self, application: String, target: &DesiredState, then: Outcome) -> ReleaseAction {
        let set = |config_map| ReleaseAction::SetDesiredState {
            config_map,
            application,
            fields: desired_state_fields(target),
            then,
        };
        match self {
            Setting::RecordAndSet { config_map } => set(Some(config_map)),
            Setting::Set => set(None),
            Setting::Record { config_map, history } => ReleaseAction::RecordRevisions { config_map, history },
        }
    }
}

/// Flux's verdict on the target, as relayed on the ApplicationInstance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// Flux has not finished with the target yet.
    Waiting {
        /// Where it stands.
        message: String,
    },
    /// Released and Ready.
    Released {
        /// Flux's message.
        message: String,
    },
    /// Flux failed it; the reason verbatim.
    Failed {
        /// Flux's reason.
        reason: String,
        /// Flux's message.
        message: String,
    },
}

impl From<crate::release::Verdict> for Release {
    fn from(verdict: crate::release::Verdict) -> Self {
        use crate::release::Verdict;
        match verdict {
            Verdict::Waiting(message) => Release::Waiting { message },
            Verdict::Released(message) => Release::Released { message },
            Verdict::Failed { reason, message } => Release::Failed { reason, message },
        }
    }
}

/// The `status.children` reference of the application's revision history ConfigMap.
fn history_reference(application: &str, namespace: &str) -> ObjectReference {
    meta::object_ref("v1", "ConfigMap", &revisions::config_map_name(application), namespace)
}

/// The `status.children` reference of a child Operation.
fn operation_reference(name: &str, namespace: &str) -> ObjectReference {
    meta::object_ref(api::API_VERSION, "Operation", name, namespace)
}

/// The ApplicationInstance fields that hold `state` (ADR 0004: the engine owns exactly these),
/// and the annotation telling the app controller that this chart version comes from an
/// Operation that passed its maintenance window check (ADR 0009).
fn desired_state_fields(state: &DesiredState) -> Value {
    serde_json::json!({
        "metadata": {"annotations": {ANNOTATION_OPERATION_CHART_VERSION: state.chart_version}},
        "spec": {"chart": {"version": state.chart_version}, "values": state.values},
    })
}

/// Name of the ApplicationInstance, as the engine applies to it.
fn application_name(app: &ApplicationInstance) -> String {
    app.metadata.name.clone().unwrap_or_default()
}
