//! Pure status computation: from what the reconciler found (our own failure, or
//! what the engine reports) to the next `ApplicationInstanceStatus`.
//!
//! Rules (docs/api/conditions.md):
//! - engine conditions are relayed with status, reason and message verbatim, but only
//!   once the engine has observed the latest desired state; until then `Ready=Unknown`
//!   and `Reconciling=True` with our reason `AwaitingEngine`;
//! - `lastTransitionTime` moves only when a condition's status changes;
//! - `observedGeneration` is set on the status and on every condition we write;
//! - the result is deterministic for a given input, so an unchanged world yields an
//!   identical status and the caller skips the write.

use api::{
    ApplicationInstance, ApplicationInstanceStatus, EngineKind,
    conditions::{self, Setter, reasons, types},
};
use helmengine::{Materialized, Observation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Longest message we put in a condition (the API allows 32768).
const MAX_MESSAGE: usize = 4096;

/// What one reconcile found out.
#[derive(Debug, Clone)]
pub enum Assessment<'a> {
    /// Our own failure, before or while materialising.
    Failed {
        /// One of `api::conditions::reasons`.
        reason: &'static str,
        /// Human-readable; never contains secret material.
        message: String,
        /// No progress without a spec (or cluster) change.
        stalled: bool,
    },
    /// The engine objects are written; the engine's view (if it has one yet) follows.
    Materialized {
        engine: EngineKind,
        materialized: &'a Materialized,
        observation: Option<&'a Observation>,
        /// An Operation (e.g. a Restore) that holds the release suspended while it runs.
        suspended_by: Option<&'a str>,
        /// A chart version change that waits for a maintenance window (reason, message):
        /// the release was left as it is (ADR 0009).
        held: Option<(&'static str, &'a str)>,
    },
    /// Deletion in progress: the engine is uninstalling the release.
    Uninstalling { message: String },
}

/// The next status of `app` given `assessment`, at time `now`.
pub fn next_status(app: &ApplicationInstance, assessment: &Assessment<'_>, now: &Time) -> ApplicationInstanceStatus {
    let generation = app.metadata.generation;
    let mut status = app.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    let mut conds = Conditions(Setter::new(&mut status.conditions, generation, now));

    match assessment {
        Assessment::Failed {
            reason,
            message,
            stalled,
        } => {
            conds.set(types::READY, "False", reason, message);
            if *stalled {
                conds.set(types::STALLED, "True", reason, message);
            } else {
                conds.remove(types::STALLED);
            }
            conds.remove(types::RECONCILING);
        }
        Assessment::Uninstalling { message } => {
            conds.set(types::READY, "Unknown", reasons::UNINSTALLING, message);
            conds.set(types::RECONCILING, "True", reasons::UNINSTALLING, message);
            conds.remove(types::STALLED);
        }
        Assessment::Materialized {
            engine,
            materialized,
            observation,
            suspended_by,
            held,
        } => {
            status.engine = Some(engine.as_str().to_string());
            status.engine_ref = Some(materialized.engine_ref.clone());
            let engine_object = describe(&materialized.engine_ref);
            let mut conds = Conditions(Setter::new(&mut status.conditions, generation, now));
            match observation {
                None => conds.awaiting(&format!("{engine_object} does not exist yet")),
                Some(obs) => {
                    match &obs.source {
                        // Only a failure: a source still fetching (or not yet reported
                        // on) is work in progress the HelmRelease's conditions tell, and
                        // showing it would cost every app a status write twice over.
                        Some(source) if source.failed => {
                            let message = format!("{}: {}", describe(&source.object), source.message);
                            conds.set(types::SOURCE_READY, "False", &source.reason, &message);
                        }
                        _ => conds.remove(types::SOURCE_READY),
                    }
                    if app.spec.suspend {
                        conds.suspended(obs, "spec.suspend is true");
                    } else if let Some(operation) = suspended_by {
                        conds.suspended(
                            obs,
                            &format!("Operation {operation} holds the release suspended while it runs"),
                        );
                    } else if !obs.observed_generation_current {
                        conds.awaiting(&format!(
                            "{engine_object} has not yet observed the latest desired state"
                        ));
                    } else {
                        conds.relay(obs);
                    }
                    if let Some((reason, message)) = held {
                        // The release's own conditions describe the version it runs; this
                        // one says a change is on its way.
                        conds.set(types::RECONCILING, "True", reason, message);
                    }
                    status.deployed_chart_version = obs.deployed_chart_version.clone();
                    status.app_version = obs.app_version.clone();
                    status.last_attempted_revision = obs.last_attempted_revision.clone();
                    status.history = obs.history.clone();
                }
            }
        }
    }
    sort_conditions(&mut status.conditions);
    status
}

/// Whether `new` differs from the current status (so a write is needed).
pub fn needs_write(app: &ApplicationInstance, new: &ApplicationInstanceStatus) -> bool {
    app.status.as_ref() != Some(new)
}

/// The `Ready` condition of a status, if any.
pub fn ready(status: Option<&ApplicationInstanceStatus>) -> Option<&Condition> {
    conditions::find(&status?.conditions, types::READY)
}

fn describe(reference: &api::ObjectReference) -> String {
    match &reference.namespace {
        Some(ns) => format!("{} {ns}/{}", reference.kind, reference.name),
        None => format!("{} {}", reference.kind, reference.name),
    }
}

/// The shared setter (`api::conditions::Setter`: `lastTransitionTime` moves only when the
/// status changes, `observedGeneration` on every condition written) with this CRD's rules.
struct Conditions<'a>(Setter<'a>);

impl Conditions<'_> {
    /// Sets a condition, its message cut to [`MAX_MESSAGE`] bytes (with `…`).
    fn set(&mut self, type_: &str, status: &str, reason: &str, message: &str) {
        let message = api::text::cut_with_ellipsis(message, MAX_MESSAGE);
        // An empty reason is invalid in metav1.Condition; engines always set one, but be safe.
        let reason = if reason.is_empty() { "Unknown" } else { reason };
        self.0.set(type_, status, reason, message);
    }

    fn remove(&mut self, type_: &str) {
        self.0.remove(type_);
    }

    fn awaiting(&mut self, message: &str) {
        self.set(types::READY, "Unknown", reasons::AWAITING_ENGINE, message);
        self.set(types::RECONCILING, "True", reasons::AWAITING_ENGINE, message);
        self.remove(types::STALLED);
    }

    /// Relays every engine condition verbatim; relayed types the engine no longer has
    /// (e.g. `Reconciling` once done) are removed.
    fn relay(&mut self, obs: &Observation) {
        for type_ in types::RELAYED_FROM_HELMRELEASE {
            match obs.condition(type_) {
                Some(c) => self.set(type_, &c.status, &c.reason, &c.message),
                None => self.remove(type_),
            }
        }
    }

    /// Suspended: the engine does not reconcile, so its conditions are frozen. Ready keeps
    /// its status (and so its transition time) and says why nothing moves.
    fn suspended(&mut self, obs: &Observation, why: &str) {
        let (status, last) = match obs.condition(types::READY) {
            Some(c) => (
                c.status.clone(),
                format!("; last engine state: {}: {}", c.reason, c.message),
            ),
            None => ("Unknown".to_string(), String::new()),
        };
        let message = format!("{why}: the release is not reconciled{last}");
        self.set(types::READY, &status, reasons::SUSPENDED, &message);
        self.remove(types::RECONCILING);
    }
}

/// Stable order: Ready, Reconciling, Stalled first (as Flux and kstatus readers expect), then by type.
fn sort_conditions(list: &mut [Condition]) {
    conditions::sort(list, &[types::READY, types::RECONCILING, types::STALLED]);
}

#[cfg(test)]
mod tests;
