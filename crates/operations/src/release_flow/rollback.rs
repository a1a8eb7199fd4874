//! The Rollback state machine. [`determine_state`] checks, in this order, and the first
//! that holds is the state; [`next_action`] maps it to one action:
//!
//! | Stage | When | Action |
//! |---|---|---|
//! | [`Stage::Refused`] | Operation without name, namespace or UID | report `Failed` (`InvalidSpec`) |
//! | [`Stage::ApplicationGone`] | the ApplicationInstance was deleted | report `Failed` (`ApplicationNotFound`) |
//! | [`Stage::Refused`] | the history cannot be read, holds no target (`RevisionNotFound`) or cannot be written | report `Failed`, the error's reason |
//! | [`Stage::Setting`] | the target is not recorded under the Rollback's name, or not set on the application | record and set it, report `Running` (or record, and decide again) |
//! | [`Stage::Releasing`] | Flux has not finished with the target | report `Running` |
//! | [`Stage::Released`] | released and Ready | report `Succeeded` |
//! | [`Stage::ReleaseFailed`] | Flux failed it | report `Failed`, Flux's reason |
//!
//! The target is chosen once: when the history holds a revision recorded under the
//! Rollback's name, that is the target, whatever the history says about the current one.

use api::conditions::operation_reasons;
use api::{ApplicationInstance, ObjectReference, Operation};
use jiff::Timestamp;

use super::{Release, ReleaseAction, Setting, Target, history_reference};
use crate::Error;
use crate::meta::OpId;
use crate::release::{self, DesiredState};
use crate::revisions::{self, AppRevision};
use crate::status::Outcome;

/// What the decision rests on, read by the engine.
#[derive(Debug, Clone)]
pub struct Observation<'a> {
    /// The Rollback.
    pub op: &'a Operation,
    /// Its ApplicationInstance (`None`: deleted).
    pub app: Option<&'a ApplicationInstance>,
    /// The application's revision history, or why it cannot be read.
    pub history: Result<Vec<AppRevision>, Error>,
    /// The time of this pass (recorded with the new revision).
    pub now: Timestamp,
}

/// Where a Rollback stands: the stage, and the children to report with it.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// The stage.
    pub stage: Stage,
    /// Children: the revision history ConfigMap once the history was read.
    pub children: Vec<ObjectReference>,
}

/// The stages of a Rollback (see the module documentation for when each holds).
#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// The Rollback cannot be acted on.
    Refused(Error),
    /// The ApplicationInstance was deleted during the rollback.
    ApplicationGone,
    /// The target is not recorded under the Rollback's name, or not set on the application.
    Setting {
        /// What is left to do.
        setting: Setting,
        /// The ApplicationInstance's name.
        application: String,
        /// The target.
        target: Target,
        /// The revision the target was chosen from, when it is chosen in this pass.
        from: Option<i64>,
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
    /// Flux failed the target.
    ReleaseFailed {
        /// The target chart version.
        chart_version: String,
        /// Flux's reason.
        reason: String,
        /// Flux's message.
        message: String,
    },
}

/// Where the Rollback stands (the first stage in the module table that holds).
pub fn determine_state(observation: &Observation<'_>) -> State {
    let refused = |error: Error| State {
        stage: Stage::Refused(error),
        children: Vec::new(),
    };
    let id = match OpId::of(observation.op) {
        Ok(id) => id,
        Err(error) => return refused(error),
    };
    let Some(app) = observation.app else {
        return State {
            stage: Stage::ApplicationGone,
            children: Vec::new(),
        };
    };
    let history = match &observation.history {
        Ok(history) => history,
        Err(error) => return refused(error.clone()),
    };

    // 1. The target: the revision recorded under the Rollback's name, else the one the
    //    spec asks for, recorded under its name.
    let (target, from, unrecorded) = match history.iter().find(|r| r.operation.as_deref() == Some(id.name)) {
        Some(mine) => {
            let target = Target {
                state: DesiredState::of_revision(mine),
                revision: mine.number,
            };
            (target, None, None)
        }
        None => {
            let params = observation.op.spec.rollback.clone().unwrap_or_default();
            let chosen = match revisions::find_target(history, &params, release::current_revision(history, app)) {
                Ok(chosen) => chosen,
                Err(error) => return refused(error),
            };
            let state = DesiredState::of_revision(chosen);
            let (next, revision) = revisions::record(
                history,
                &state.chart_version,
                &state.values,
                Some(id.name),
                observation.now,
            );
            (Target { state, revision }, Some(chosen.number), Some(next))
        }
    };
    let children = vec![history_reference(id.application, id.namespace)];

    // 2. Record and set it.
    match Setting::of(app, &target.state, unrecorded) {
        Ok(Some(setting)) => {
            return State {
                stage: Stage::Setting {
                    setting,
                    application: super::application_name(app),
                    target,
                    from,
                },
                children,
            };
        }
        Ok(None) => {}
        Err(error) => return refused(error),
    }

    // 3. Flux's verdict.
    let stage = match Release::from(release::verdict(app, &target.state.chart_version)) {
        Release::Waiting { message } => Stage::Releasing { message },
        Release::Released { message } => Stage::Released { target, message },
        Release::Failed { reason, message } => Stage::ReleaseFailed {
            chart_version: target.state.chart_version,
            reason,
            message,
        },
    };
    State { stage, children }
}

/// What to do in `state` (see the module documentation).
pub fn next_action(state: State) -> ReleaseAction {
    let State { stage, children } = state;
    match stage {
        Stage::Refused(error) => ReleaseAction::Report(error.outcome()),
        Stage::ApplicationGone => ReleaseAction::Report(Outcome::failed(
            operation_reasons::APPLICATION_NOT_FOUND,
            "the ApplicationInstance was deleted during the rollback",
        )),
        Stage::Setting {
            setting,
            application,
            target,
            from,
        } => {
            let from = from.map(|f| format!(" from revision {f}")).unwrap_or_default();
            let then = Outcome::Running {
                message: format!(
                    "chart version {} and its values set on the application{from} (revision {})",
                    target.state.chart_version, target.revision
                ),
                children,
            };
            setting.action(application, &target.state, then)
        }
        Stage::Releasing { message } => ReleaseAction::Report(Outcome::Running { message, children }),
        Stage::Released { target, message } => ReleaseAction::Report(Outcome::Succeeded {
            result: format!(
                "Rolled back to chart version {} (recorded as revision {}): {message}",
                target.state.chart_version, target.revision
            ),
            children,
            report: Default::default(),
        }),
        Stage::ReleaseFailed {
            chart_version,
            reason,
            message,
        } => ReleaseAction::Report(Outcome::Failed {
            reason,
            message: format!("rollback to chart version {chart_version} failed: {message}"),
            children,
            report: Default::default(),
        }),
    }
}
