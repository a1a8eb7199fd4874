//! Upgrade and Rollback: change the application's desired state (chart version and inline
//! values) on the ApplicationInstance, record it in the revision history, and wait for
//! Flux's verdict as relayed by the app controller. The app controller stays the only
//! writer of the HelmRelease. Who owns `spec.chart.version` and `spec.values`:
//! `docs/adr/0004-desired-version-ownership.md`.
//!
//! The decisions are `operations::release_flow` (state in, action out); the drivers here
//! read what they rest on, carry out the action and, after recording the history only,
//! decide again.

use std::time::Duration;

use api::OperationType;
use controller_kit::WriteVerb;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use operations::{
    Outcome,
    meta::OpId,
    release,
    release_flow::{
        ReleaseAction, rollback,
        upgrade::{self, ChildState, ChildStatus, UpgradeChild},
    },
    revisions::{self, AppRevision},
};
use serde_json::Value;

use crate::children::{self, Child};
use crate::runtime::{Cx, Driver, DriverError, Watch};

/// Annotation on a child Rollback of a failed Upgrade: Flux's message for the failure.
pub use operations::release_flow::upgrade::ANNOTATION_CAUSE_MESSAGE;
/// Annotation on a child Rollback of a failed Upgrade: Flux's reason for the failure.
pub use operations::release_flow::upgrade::ANNOTATION_CAUSE_REASON;

/// Actions one pass may carry out: recording the history is followed by one more
/// decision, every other action ends the pass.
const MAX_ACTIONS_PER_PASS: usize = 3;

fn operations_resource() -> ApiResource {
    children::resource(api::API_VERSION, "Operation", "operations")
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
        if let Some(refusal) = cx.app.as_ref().and_then(release::pinned_by_source) {
            return Ok(Some(refusal));
        }
        // A history that cannot be read is refused before anything changes.
        history(cx).await??;
        Ok(None)
    }

    async fn drive(&self, cx: &Cx) -> Result<Outcome, DriverError> {
        // 1. Read what the decision rests on: the children under their names, the history.
        let id = OpId::of(&cx.op)?;
        let child = |child: UpgradeChild| child_operation(cx, child.name(id.name));
        let mut observation = upgrade::Observation {
            op: &cx.op,
            app: cx.app.as_ref(),
            backup: ChildState::of(child(UpgradeChild::Backup).await?.as_ref(), &id),
            rollback: child(UpgradeChild::Rollback).await?.as_ref().map(ChildStatus::of),
            restore: ChildState::of(child(UpgradeChild::Restore).await?.as_ref(), &id),
            history: history(cx).await?,
            now: cx.now,
        };
        // 2. Decide and act, until an action ends the pass.
        for _ in 0..MAX_ACTIONS_PER_PASS {
            let action = upgrade::next_action(upgrade::determine_state(&observation));
            match carry_out(cx, action).await? {
                Carried::Done(outcome) => return Ok(outcome),
                Carried::Recorded(history) => observation.history = Ok(history),
            }
        }
        Err(DriverError::Retry(
            "the upgrade did not settle on an action within one pass".into(),
        ))
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
        if let Some(refusal) = cx.app.as_ref().and_then(release::pinned_by_source) {
            return Ok(Some(refusal));
        }
        let (Some(app), Some(params)) = (cx.app.as_ref(), cx.op.spec.rollback.as_ref()) else {
            return Ok(None);
        };
        let history = history(cx).await??;
        revisions::find_target(&history, params, release::current_revision(&history, app))?;
        Ok(None)
    }

    async fn drive(&self, cx: &Cx) -> Result<Outcome, DriverError> {
        // 1. Read what the decision rests on: the history.
        let mut observation = rollback::Observation {
            op: &cx.op,
            app: cx.app.as_ref(),
            history: history(cx).await?,
            now: cx.now,
        };
        // 2. Decide and act, until an action ends the pass.
        for _ in 0..MAX_ACTIONS_PER_PASS {
            let action = rollback::next_action(rollback::determine_state(&observation));
            match carry_out(cx, action).await? {
                Carried::Done(outcome) => return Ok(outcome),
                Carried::Recorded(history) => observation.history = Ok(history),
            }
        }
        Err(DriverError::Retry(
            "the rollback did not settle on an action within one pass".into(),
        ))
    }
}

/// What carrying out an action leaves.
enum Carried {
    /// The pass ends with this outcome.
    Done(Outcome),
    /// The history now holds this: decide again.
    Recorded(Vec<AppRevision>),
}

/// Carries out `action` (the only writes of the upgrade engine besides the status).
async fn carry_out(cx: &Cx, action: ReleaseAction) -> Result<Carried, DriverError> {
    Ok(match action {
        ReleaseAction::Report(outcome) => Carried::Done(outcome),
        ReleaseAction::CreateChild { object, then } => {
            match children::ensure(cx, &operations_resource(), &object).await? {
                Child::Ours(_) => Carried::Done(then),
                Child::Foreign(message) => Carried::Done(children::foreign(message)),
            }
        }
        ReleaseAction::RecordRevisions { config_map, history } => {
            write_history(cx, &config_map).await?;
            Carried::Recorded(history)
        }
        ReleaseAction::SetDesiredState {
            config_map,
            application,
            fields,
            then,
        } => {
            if let Some(config_map) = config_map {
                write_history(cx, &config_map).await?;
            }
            // Forced: the engine takes over the two fields (ADR 0004).
            children::apply_application(cx, &application, fields).await?;
            Carried::Done(then)
        }
    })
}

/// A child Operation of this Upgrade by name, as JSON (`None` when absent).
async fn child_operation(cx: &Cx, name: String) -> Result<Option<Value>, DriverError> {
    children::get(&cx.client, &operations_resource(), cx.namespace(), &name).await
}

/// The application's revision history (empty when none was recorded), or why it cannot be
/// read. An API error is the outer error (retried); a corrupt history the inner one.
async fn history(cx: &Cx) -> Result<Result<Vec<AppRevision>, operations::Error>, DriverError> {
    let name = revisions::config_map_name(&cx.op.spec.application_ref.name);
    Ok(
        match children::get(&cx.client, &config_maps(), cx.namespace(), &name).await? {
            Some(config_map) => revisions::parse_history(&config_map),
            None => Ok(Vec::new()),
        },
    )
}

/// Writes the history ConfigMap (server-side apply, forced: the engine is its only writer).
async fn write_history(cx: &Cx, config_map: &Value) -> Result<(), DriverError> {
    let name = revisions::config_map_name(&cx.op.spec.application_ref.name);
    cx.metrics.api_write(WriteVerb::Apply, "ConfigMap");
    kube::Api::<DynamicObject>::namespaced_with(cx.client.clone(), cx.namespace(), &config_maps())
        .patch(
            &name,
            &PatchParams::apply(cx.field_manager).force(),
            &Patch::Apply(config_map),
        )
        .await?;
    Ok(())
}
