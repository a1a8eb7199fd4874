//! Writes shared by every adapter: server-side apply that stays quiet at rest, deletes
//! that tolerate a race, and the API-error classes the adapters care about.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use tracing::debug;

use crate::EngineError;

/// Annotation recording a hash of the desired state we last applied. Together with a
/// check that the live object still holds every field we set, it lets a reconcile at
/// rest skip the apply entirely (the hash alone would miss manual edits; the subset
/// check alone would miss fields we stopped setting, which the apply must remove).
pub const ANNOTATION_DESIRED_HASH: &str = "vworkspace.io/desired-hash";

/// Server-side applies `object` as `field_manager` (forced), unless the live object already
/// carries exactly this desired state: no write at rest. The desired state's hash is
/// recorded in [`ANNOTATION_DESIRED_HASH`].
///
/// Returns the object the API server returned for the apply, or `None` when `live` was
/// already up to date (then `live` is the current object): either way the caller has the
/// current object without reading it again.
pub(crate) async fn apply_unless_up_to_date(
    api: &Api<DynamicObject>,
    field_manager: &str,
    object: &DynamicObject,
    live: Option<&DynamicObject>,
) -> Result<Option<DynamicObject>, kube::Error> {
    let mut object = object.clone();
    let hash = desired_hash(&object);
    let name = object.name_any();
    let kind = object.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
    if live.is_some_and(|live| is_up_to_date(live, &object, &hash)) {
        debug!(kind, namespace = ?object.metadata.namespace, name, "up to date, not applying");
        return Ok(None);
    }
    object
        .annotations_mut()
        .insert(ANNOTATION_DESIRED_HASH.to_owned(), hash);
    debug!(kind, namespace = ?object.metadata.namespace, name, "applying");
    let params = PatchParams::apply(field_manager).force();
    api.patch(&name, &params, &Patch::Apply(&object)).await.map(Some)
}

/// Remembers a successful check (e.g. "the engine's CRDs are served") for a while, so it is
/// not repeated on every reconcile. A failure is never remembered.
#[derive(Debug, Default)]
pub(crate) struct RecentSuccess {
    at: Mutex<Option<Instant>>,
}

impl RecentSuccess {
    /// A success was recorded less than `ttl` ago.
    pub(crate) fn is_fresh(&self, ttl: Duration) -> bool {
        self.at
            .lock()
            .map(|at| at.is_some_and(|t| t.elapsed() < ttl))
            .unwrap_or(false)
    }

    /// Records a success now.
    pub(crate) fn record(&self) {
        if let Ok(mut at) = self.at.lock() {
            *at = Some(Instant::now());
        }
    }
}

/// A 404, with or without a `Status` body. The API server answers a path under a group
/// version it does not serve (Flux's CRDs not installed) with the plain text `404 page not
/// found`, which kube turns into a `Status` without the `NotFound` reason, so
/// `Status::is_not_found` alone would take "Flux is not installed" for an API failure.
pub(crate) fn is_not_found(status: &kube::core::Status) -> bool {
    status.code == 404 || status.is_not_found()
}

/// A 404 on create that is about the namespace (being deleted or absent),
/// not about the resource type.
pub(crate) fn names_namespace(status: &kube::core::Status) -> bool {
    status.details.as_ref().is_some_and(|d| d.kind == "namespaces")
}

/// Deletes `name` if it is still the object with `uid`; gone or replaced meanwhile is fine.
pub(crate) async fn delete_tolerant(
    api: &Api<DynamicObject>,
    name: &str,
    uid: Option<String>,
) -> Result<(), EngineError> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if is_not_found(&status) || status.is_conflict() => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// A stable digest of the desired object (FNV-1a over its canonical JSON: serde_json
/// maps are ordered, so equal objects serialize equally).
pub(crate) fn desired_hash(object: &DynamicObject) -> String {
    crate::meta::fnv1a_hex(serde_json::to_vec(object).unwrap_or_default())
}

/// The live object was last applied from this exact desired state and nobody has
/// since changed a field we own.
pub(crate) fn is_up_to_date(live: &DynamicObject, desired: &DynamicObject, hash: &str) -> bool {
    let annotations = live.metadata.annotations.as_ref();
    let same_hash = annotations
        .and_then(|a| a.get(ANNOTATION_DESIRED_HASH))
        .is_some_and(|h| h == hash);
    let owners_match = live.metadata.owner_references == desired.metadata.owner_references;
    let labels = serde_json::to_value(&desired.metadata.labels).unwrap_or_default();
    let live_labels = serde_json::to_value(&live.metadata.labels).unwrap_or_default();
    let desired_annotations = serde_json::to_value(&desired.metadata.annotations).unwrap_or_default();
    let live_annotations = serde_json::to_value(&live.metadata.annotations).unwrap_or_default();
    same_hash
        && owners_match
        && is_subset(&labels, &live_labels)
        && is_subset(&desired_annotations, &live_annotations)
        && is_subset(&desired.data, &live.data)
}

/// `desired` is contained in `live`: objects recursively (the server may add defaults),
/// everything else (arrays, scalars) equal.
pub(crate) fn is_subset(desired: &serde_json::Value, live: &serde_json::Value) -> bool {
    match (desired, live) {
        (serde_json::Value::Object(d), serde_json::Value::Object(l)) => d
            .iter()
            .all(|(k, v)| l.get(k).is_some_and(|lv| is_subset(v, lv)) || v.is_null()),
        (serde_json::Value::Null, _) => true,
        (d, l) => d == l,
    }
}

#[cfg(test)]
mod up_to_date_tests {
    use super::*;
    use serde_json::json;

    fn object(data: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
            "metadata": {"name": "app", "namespace": "ns", "labels": {"a": "b"}},
            "spec": data
        }))
        .unwrap()
    }

    #[test]
    fn unchanged_object_with_server_defaults_is_up_to_date() {
        let desired = object(json!({"interval": "10m", "values": {"x": 1}}));
        let hash = desired_hash(&desired);
        let mut live = object(json!({"interval": "10m", "values": {"x": 1}, "timeout": "5m"}));
        live.annotations_mut()
            .insert(ANNOTATION_DESIRED_HASH.into(), hash.clone());
        assert!(is_up_to_date(&live, &desired, &hash));
    }

    #[test]
    fn manual_edit_or_changed_desired_state_is_not_up_to_date() {
        let desired = object(json!({"interval": "10m", "values": {"x": 1}}));
        let hash = desired_hash(&desired);
        let mut edited = object(json!({"interval": "10m", "values": {"x": 2}}));
        edited
            .annotations_mut()
            .insert(ANNOTATION_DESIRED_HASH.into(), hash.clone());
        assert!(
            !is_up_to_date(&edited, &desired, &hash),
            "a manual edit of a field we own is repaired"
        );

        // We stopped setting values.y: the hash differs, so the apply runs and removes it.
        let shrunk = object(json!({"interval": "10m", "values": {"x": 1}}));
        let mut live = object(json!({"interval": "10m", "values": {"x": 1, "y": 2}}));
        live.annotations_mut()
            .insert(ANNOTATION_DESIRED_HASH.into(), "0000".into());
        assert!(!is_up_to_date(&live, &shrunk, &desired_hash(&shrunk)));
    }

    #[test]
    fn hash_is_stable_and_content_sensitive() {
        let a = object(json!({"interval": "10m"}));
        assert_eq!(desired_hash(&a), desired_hash(&a.clone()));
        assert_ne!(desired_hash(&a), desired_hash(&object(json!({"interval": "11m"}))));
    }
}
