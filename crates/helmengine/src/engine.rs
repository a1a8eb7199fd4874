//! The [`Engine`] trait and the engine-neutral values that cross it.
//!
//! Nothing here names a Flux type: the reconciler sees an engine object
//! reference, conditions relayed as strings, a chart-source summary and the
//! release history. The Argo CD adapter implements the same trait and maps an
//! `Application` onto the same values.

use api::{ApplicationInstance, EngineKind, ObjectReference, ReleaseRecord};
use futures::future::BoxFuture;

use crate::EngineError;

/// At most this many releases are reported in [`Observation::history`]
/// (the `maxItems` of `ApplicationInstanceStatus.history`).
pub const MAX_HISTORY: usize = 10;

/// A Helm engine: materialises an ApplicationInstance as the engine's own
/// objects, observes them, and removes them.
///
/// Object-safe so the reconciler can hold `Arc<dyn Engine>` chosen per
/// application from `spec.engine` or the cluster default. Every method is
/// idempotent and safe to call on every reconcile.
pub trait Engine: Send + Sync {
    /// Which engine this is (written to `status.engine`).
    fn kind(&self) -> EngineKind;

    /// The engine objects whose changes must wake their ApplicationInstance at once, and
    /// how each names it. The controller watches exactly these (metadata only), so it names
    /// no engine type of its own.
    fn watched_kinds(&self) -> Vec<crate::WatchedKind>;

    /// Ok when the engine's APIs are served by the cluster, otherwise
    /// [`EngineError::NotInstalled`] naming what is missing.
    ///
    /// Not cached: the answer changes when the cluster owner installs or
    /// upgrades the engine, and one discovery request per call is cheap.
    /// Callers decide how often to ask.
    fn check_installed(&self) -> BoxFuture<'_, Result<(), EngineError>>;

    /// Writes the engine objects for `app` (server-side apply) and removes
    /// ones this app no longer needs. Validation happens before any write, so
    /// an [`EngineError::InvalidSpec`] leaves the cluster untouched.
    fn materialize<'a>(
        &'a self,
        app: &'a ApplicationInstance,
        input: &'a MaterializeInput,
    ) -> BoxFuture<'a, Result<Materialized, EngineError>>;

    /// Reads the engine's view of `app`. `None` when the engine object does
    /// not exist (yet, or any more).
    fn observe<'a>(&'a self, app: &'a ApplicationInstance) -> BoxFuture<'a, Result<Option<Observation>, EngineError>>;

    /// Removes the release and every object created for `app`. Call it until it
    /// returns [`DeleteProgress::Gone`]; objects already gone are not an error.
    fn delete<'a>(&'a self, app: &'a ApplicationInstance) -> BoxFuture<'a, Result<DeleteProgress, EngineError>>;
}

/// Inputs to [`Engine::materialize`] that the reconciler computes and the spec does not hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaterializeInput {
    /// Deterministic token derived from the resourceVersions of the Secrets and
    /// ConfigMaps the app references (valuesFrom, repository credentials).
    ///
    /// When it changes the engine re-applies the release promptly instead of
    /// at its next interval. It must be a pure function of those objects, never
    /// a timestamp: an unchanged token writes nothing, so the system is quiet
    /// at rest. `None` means "no referenced objects" and writes no trigger.
    pub values_revision: Option<String>,
    /// An Operation (by name, in the application's namespace) that holds the release
    /// suspended while it runs, e.g. a Restore, so Flux does not fight it. The release is
    /// materialised suspended, as with `spec.suspend: true`.
    pub suspended_by: Option<String>,
}

/// What [`Engine::materialize`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Materialized {
    /// The object the engine reconciles (for Flux, the HelmRelease), for `status.engineRef`.
    pub engine_ref: ObjectReference,
    /// The chart source the release reads from: the one materialize manages
    /// (HelmRepository / OCIRepository) or the one `chart.sourceRef` names.
    pub source_ref: Option<ObjectReference>,
    /// The engine's view, when materialize already holds every object it is made of (the
    /// objects its applies returned and the reads its ownership checks made): the caller
    /// need not call [`Engine::observe`] and read them again. `None`: call it.
    pub observation: Option<Observation>,
    /// The `resourceVersion` of the engine object `observation` was made from (what an
    /// apply returned, or the live object found current). Its own watch event brings the
    /// caller nothing new.
    pub engine_version: Option<String>,
}

/// Progress of [`Engine::delete`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteProgress {
    /// Nothing of ours is left that holds release state; the reconciler may
    /// remove its finalizer.
    Gone,
    /// Deletion is under way (e.g. Helm is uninstalling). The message says
    /// what is being waited for; call again later.
    InProgress(String),
}

/// The engine's view of one application, engine-neutral.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Observation {
    /// The engine has observed the latest desired state we wrote: the
    /// generation of its object and any reconcile request (values revision)
    /// we made. While false, `conditions` describe an older desired state and
    /// must not be reported as the outcome of the current one.
    pub observed_generation_current: bool,
    /// The engine's conditions, relayed verbatim (types, statuses, reasons,
    /// messages), in a fixed order: Ready, Released, TestSuccess, Remediated,
    /// Drifted, Reconciling, Stalled. Reasons are never translated, so a
    /// reason the engine adds tomorrow flows through unchanged.
    pub conditions: Vec<EngineCondition>,
    /// The chart source: the first one that failed, else the first one that is not
    /// ready, else the most specific one. `None` when none could be read.
    pub source: Option<SourceObservation>,
    /// Chart version of the newest release whose Helm status is `deployed`.
    pub deployed_chart_version: Option<String>,
    /// App version of that same release.
    pub app_version: Option<String>,
    /// The chart version (semver constraint) in the engine objects' spec, as last
    /// materialised: what the engine is asked to deploy now (HelmRelease
    /// `spec.chart.spec.version`, or an OCIRepository's `spec.ref.semver`). `None` when it
    /// cannot be read.
    pub materialized_chart_version: Option<String>,
    /// Chart revision of the last release attempt (`<version>[+<digest>]`).
    pub last_attempted_revision: Option<String>,
    /// Helm releases, newest first, at most [`MAX_HISTORY`].
    pub history: Vec<ReleaseRecord>,
    /// The engine object is suspended: the engine neither upgrades nor
    /// uninstalls it, and its conditions keep their last values.
    pub suspended: bool,
}

impl Observation {
    /// The relayed condition of the given type, if the engine reports it.
    pub fn condition(&self, type_: &str) -> Option<&EngineCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// One condition of the engine object, as the engine wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EngineCondition {
    /// Condition type, e.g. `Ready`.
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// The engine's reason, verbatim.
    pub reason: String,
    /// The engine's message, verbatim.
    pub message: String,
}

impl EngineCondition {
    /// `status == "True"`.
    pub fn is_true(&self) -> bool {
        self.status == "True"
    }
}

/// Readiness of the chart source behind the release.
///
/// This is where "repository unreachable" or "chart version not found"
/// surfaces, with the source's own reason (e.g. `IndexationFailed`,
/// `InvalidChartReference`) rather than the release's generic one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceObservation {
    /// The source holds an up-to-date artifact for its current spec.
    pub ready: bool,
    /// Flux reports the source failed (`Ready=False`) on its current spec: a failure to
    /// show, not work in progress (`Ready=Unknown`, or no report yet).
    pub failed: bool,
    /// The source's Ready reason, verbatim; `AwaitingEngine` while it has not
    /// reported on its current generation yet.
    pub reason: String,
    /// The source's Ready message, verbatim (or what is being waited for).
    pub message: String,
    /// Which object this describes.
    pub object: ObjectReference,
}
