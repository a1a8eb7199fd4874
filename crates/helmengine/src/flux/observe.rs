//! Pure mapping: Flux objects → [`Observation`].
//!
//! Reading is lenient on purpose: Flux adds status fields over time and a
//! malformed entry (one bad history snapshot, one odd condition) must not hide
//! the rest, so each list item is parsed on its own and skipped if it does not
//! fit. Reasons and messages are copied verbatim; nothing here knows the list
//! of Flux reasons, so a reason added in a future Flux flows through.
//!
//! # When is the observation current?
//!
//! [`Observation::observed_generation_current`] is true when helm-controller
//! has seen the HelmRelease generation we last wrote (the `Ready` condition's
//! `observedGeneration`, which Flux stamps at the start of every reconcile, or
//! `status.observedGeneration`, written at its end) **and** has handled the
//! `reconcile.fluxcd.io/requestedAt` token we set for a values change
//! (`status.lastHandledReconcileAt`). A token change does not bump the
//! generation, so without the second check a stale `Ready=True` would be
//! reported right after a values ConfigMap changed. Two exceptions keep it from
//! blocking: while Flux shows `Reconciling=True` with a `Ready` that is not
//! True, the token is being worked on and that progress (or failure) is
//! reported; and a suspended HelmRelease will not act on it at all.
//! `Reconciling=True` beside `Ready=True` does not count: helm-controller marks
//! Reconciling before it touches Ready, so that Ready is the one from before
//! the request, and its final patch writes the conditions before
//! `lastHandledReconcileAt` and the history (see "A torn write").
//!
//! ## A torn write
//!
//! helm-controller writes a status in two requests, the conditions first and
//! then the rest (`fluxcd/pkg/runtime` `patch.Helper`). For a moment after an
//! install, `Ready=True` stands without the history that names the deployed
//! chart; after an upgrade, beside the previous release's history. Seen on the
//! real cluster: an ApplicationInstance reported ready with no deployed
//! version. `status.observedGeneration` comes with the rest, and only when a
//! reconcile finished; so `Ready=True` counts as current only once
//! `status.observedGeneration` has reached the generation, and until then the
//! observation is not current. Any other `Ready` (a failure, progress) is
//! current by either generation, as above, so a failure Flux retries (and
//! leaves `status.observedGeneration` behind for) is still reported.
//!
//! # Which source is reported?
//!
//! The chart source chain is: the repository (HelmRepository / OCIRepository,
//! ours or referenced) and, for chart templates, the HelmChart Flux generates
//! (named in the HelmRelease's `status.helmChart` as `<ns>/<name>`). The first
//! one that failed is reported, so a root cause such as "repository
//! unreachable" wins over its consequence on the chart; else the first one that
//! is not ready; when all are ready the most specific one (the HelmChart), whose
//! message names the pulled chart version.
//!
//! A source is ready when `Ready=True` describes its current generation (as
//! helm-controller's own `isSourceReady` checks), and failed when `Ready=False`
//! does. One that has not reported on its current generation yet is neither,
//! with reason `AwaitingEngine`. A
//! HelmRepository of `type: oci` is static in Flux (no status, existence
//! means ready) and is reported ready with Flux's generic `Succeeded`.

use api::conditions::{reasons, types};
use api::{ObjectReference, ReleaseRecord};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DynamicObject;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{ANNOTATION_REQUESTED_AT, FluxKind, HELM_CHART, HELM_REPOSITORY};
use crate::{EngineCondition, MAX_HISTORY, Observation, SourceObservation};

/// Helm release status of the revision that is live.
const HELM_STATUS_DEPLOYED: &str = "deployed";

/// The source objects a HelmRelease reads from, as it names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceRefs {
    /// The repository or chart source (`spec.chart.spec.sourceRef` or `spec.chartRef`).
    pub source: Option<ObjectReference>,
    /// The HelmChart helm-controller generated for a chart template (`status.helmChart`).
    pub chart: Option<ObjectReference>,
}

/// Maps a HelmRelease and the source objects behind it (each `None` when absent
/// or unreadable) to an engine-neutral [`Observation`].
pub fn observe(hr: &DynamicObject, source: Option<&DynamicObject>, chart: Option<&DynamicObject>) -> Observation {
    let conditions = conditions(hr);
    let suspended = hr
        .data
        .pointer("/spec/suspend")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let history = history(hr);
    let deployed = history.iter().find(|s| s.status == HELM_STATUS_DEPLOYED);
    Observation {
        observed_generation_current: generation_seen(hr, &conditions)
            && reconcile_request_seen(hr, &conditions, suspended),
        conditions: relayed(&conditions),
        source: select_source(source, chart),
        deployed_chart_version: deployed.map(|s| s.chart_version.clone()),
        app_version: deployed.and_then(|s| s.app_version.clone()),
        materialized_chart_version: str_at(hr, "/spec/chart/spec/version")
            .or_else(|| source.and_then(|s| str_at(s, "/spec/ref/semver")))
            .map(str::to_owned),
        last_attempted_revision: str_at(hr, "/status/lastAttemptedRevision").map(str::to_owned),
        history: history.iter().take(MAX_HISTORY).map(SnapshotView::record).collect(),
        suspended,
    }
}

/// The source objects `hr` names (see [`SourceRefs`]). Kinds this adapter does
/// not know (e.g. `ExternalArtifact`) are left out.
pub fn source_refs(hr: &DynamicObject) -> SourceRefs {
    let namespace = hr.metadata.namespace.as_deref().unwrap_or_default();
    let template = hr.data.pointer("/spec/chart");
    let reference = hr
        .data
        .pointer("/spec/chartRef")
        .or_else(|| template.and_then(|t| t.pointer("/spec/sourceRef")))
        .and_then(|v| RefView::deserialize(v).ok());
    let source = reference.and_then(|r| {
        let kind = FluxKind::source_by_kind(&r.kind)?;
        Some(kind.object_ref(&r.name, r.namespace.as_deref().unwrap_or(namespace)))
    });
    let chart = template
        .and(str_at(hr, "/status/helmChart"))
        .and_then(|s| s.split_once('/'))
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
        .map(|(ns, name)| HELM_CHART.object_ref(name, ns));
    SourceRefs { source, chart }
}

/// A `sourceRef` / `chartRef` as written in a HelmRelease.
#[derive(Deserialize)]
struct RefView {
    kind: String,
    name: String,
    #[serde(default)]
    namespace: Option<String>,
}

/// A `metav1.Condition` as much as we need of it, tolerant of missing fields.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ConditionView {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    reason: String,
    message: String,
    observed_generation: Option<i64>,
}

impl ConditionView {
    fn is_true(&self) -> bool {
        self.status == "True"
    }
}

/// One `status.history[]` snapshot.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotView {
    version: i64,
    #[serde(default)]
    status: String,
    #[serde(default)]
    chart_name: Option<String>,
    #[serde(default)]
    chart_version: String,
    #[serde(default)]
    app_version: Option<String>,
    #[serde(default)]
    last_deployed: Option<String>,
}

impl SnapshotView {
    fn record(&self) -> ReleaseRecord {
        ReleaseRecord {
            revision: self.version,
            chart_name: self.chart_name.clone(),
            chart_version: self.chart_version.clone(),
            app_version: self.app_version.clone(),
            status: self.status.clone(),
            deployed_at: self.last_deployed.as_deref().and_then(|t| t.parse().ok()).map(Time),
        }
    }
}

/// Snapshots newest first. Flux already sorts them; sorting again (stably)
/// keeps "newest" meaning "highest Helm revision" whatever the input order.
fn history(hr: &DynamicObject) -> Vec<SnapshotView> {
    let mut snapshots: Vec<SnapshotView> = items(hr, "/status/history");
    snapshots.sort_by_key(|s| std::cmp::Reverse(s.version));
    snapshots
}

fn generation_seen(hr: &DynamicObject, conditions: &[ConditionView]) -> bool {
    let Some(generation) = hr.metadata.generation else {
        return false;
    };
    let ready = find(conditions, types::READY);
    let status = hr.data.pointer("/status/observedGeneration").and_then(Value::as_i64);
    // A success is only complete once the rest of the status (history) has landed: see
    // "A torn write" in the module docs.
    if ready.is_some_and(|c| c.status == "True") {
        return status == Some(generation);
    }
    ready.and_then(|c| c.observed_generation) == Some(generation) || status == Some(generation)
}

fn reconcile_request_seen(hr: &DynamicObject, conditions: &[ConditionView], suspended: bool) -> bool {
    let requested = hr
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_REQUESTED_AT));
    let Some(token) = requested else {
        return true;
    };
    let handled = str_at(hr, "/status/lastHandledReconcileAt") == Some(token.as_str());
    // A Ready=True beside Reconciling=True is the one from before the request (Flux marks
    // Reconciling first and Ready later), or a torn write of its end: neither tells of it.
    let in_progress = find(conditions, types::RECONCILING).is_some_and(ConditionView::is_true)
        && !find(conditions, types::READY).is_some_and(ConditionView::is_true);
    suspended || handled || in_progress
}

/// The relayed condition types, in the order of `RELAYED_FROM_HELMRELEASE`.
fn relayed(conditions: &[ConditionView]) -> Vec<EngineCondition> {
    types::RELAYED_FROM_HELMRELEASE
        .iter()
        .filter_map(|type_| find(conditions, type_))
        .map(|c| EngineCondition {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        })
        .collect()
}

fn select_source(source: Option<&DynamicObject>, chart: Option<&DynamicObject>) -> Option<SourceObservation> {
    let mut observed: Vec<SourceObservation> = [source, chart].into_iter().flatten().map(source_observation).collect();
    let shown = observed
        .iter()
        .position(|o| o.failed)
        .or_else(|| observed.iter().position(|o| !o.ready));
    match shown {
        Some(index) => Some(observed.swap_remove(index)),
        None => observed.pop(),
    }
}

/// What an app reads from a chart source, as a fingerprint ([`crate::ReadersSee`]): whether
/// it failed and, if so, why (an app shows only a failure: `SourceReady=False`), its
/// generation (the chart version an OCIRepository's `spec.ref.semver` gives) and whether it
/// is being deleted (its apps recreate it). A source that goes from fetching to ready wakes
/// none of its apps: their HelmReleases' events do.
pub fn source_fingerprint(obj: &DynamicObject) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let seen = source_observation(obj);
    let mut hasher = DefaultHasher::new();
    seen.failed.then_some((&seen.reason, &seen.message)).hash(&mut hasher);
    obj.metadata.generation.hash(&mut hasher);
    obj.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    hasher.finish()
}

fn source_observation(obj: &DynamicObject) -> SourceObservation {
    let object = reference_of(obj);
    if is_static_oci_helm_repository(obj) {
        return SourceObservation {
            ready: true,
            failed: false,
            reason: "Succeeded".into(),
            message: "HelmRepository of type oci is static in Flux: it exists, so it is ready".into(),
            object,
        };
    }
    let conditions = conditions(obj);
    match find(&conditions, types::READY).filter(|ready| source_generation_seen(obj, ready)) {
        Some(ready) => SourceObservation {
            ready: ready.is_true(),
            failed: ready.status == "False",
            reason: ready.reason.clone(),
            message: ready.message.clone(),
            object,
        },
        None => {
            let message = format!(
                "waiting for Flux to report on {} {}/{}",
                object.kind,
                object.namespace.as_deref().unwrap_or_default(),
                object.name
            );
            SourceObservation {
                ready: false,
                failed: false,
                reason: reasons::AWAITING_ENGINE.into(),
                message,
                object,
            }
        }
    }
}

/// Whether `ready` describes the source's current generation: by
/// `status.observedGeneration` (Flux's own test) or by the condition's
/// `observedGeneration`. Either suffices: source-controller leaves
/// `status.observedGeneration` at -1 while a source keeps failing, yet stamps the
/// current generation on its Ready=False condition, which is exactly the failure
/// (e.g. an unreachable repository) we must surface.
fn source_generation_seen(obj: &DynamicObject, ready: &ConditionView) -> bool {
    let Some(generation) = obj.metadata.generation else {
        return true;
    };
    let observed = obj.data.pointer("/status/observedGeneration").and_then(Value::as_i64);
    observed == Some(generation) || ready.observed_generation == Some(generation)
}

fn is_static_oci_helm_repository(obj: &DynamicObject) -> bool {
    let kind = obj.types.as_ref().map(|t| t.kind.as_str());
    kind == Some(HELM_REPOSITORY.kind) && str_at(obj, "/spec/type") == Some("oci")
}

fn reference_of(obj: &DynamicObject) -> ObjectReference {
    let types = obj.types.clone().unwrap_or_default();
    ObjectReference {
        api_version: types.api_version,
        kind: types.kind,
        name: obj.metadata.name.clone().unwrap_or_default(),
        namespace: obj.metadata.namespace.clone(),
    }
}

fn conditions(obj: &DynamicObject) -> Vec<ConditionView> {
    items(obj, "/status/conditions")
}

/// The first condition of `type_` (conditions are a list-map keyed by type).
fn find<'a>(conditions: &'a [ConditionView], type_: &str) -> Option<&'a ConditionView> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// The items of the array at `pointer`, each parsed on its own; malformed ones are skipped.
fn items<T: DeserializeOwned>(obj: &DynamicObject, pointer: &str) -> Vec<T> {
    let Some(Value::Array(values)) = obj.data.pointer(pointer) else {
        return Vec::new();
    };
    values.iter().filter_map(|v| T::deserialize(v).ok()).collect()
}

fn str_at<'a>(obj: &'a DynamicObject, pointer: &str) -> Option<&'a str> {
    obj.data.pointer(pointer).and_then(Value::as_str)
}

#[cfg(test)]
mod tests;
