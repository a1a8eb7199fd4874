//! Wiring: watches and the kube-runtime Controller.
//!
//! - ApplicationInstances: guarded against malformed objects, `managedFields` stripped,
//!   filtered by generation (+ finalizers) so our own status writes do not re-trigger.
//! - The engine objects each engine names ([`helmengine::Engine::watched_kinds`]: for Flux
//!   HelmReleases and their managed sources, linked by owner references; for Argo CD
//!   Applications in Argo CD's namespace, linked by labels), metadata only: engine status
//!   changes wake the ApplicationInstance at once. Nothing here names an engine type.
//! - ConfigMaps, metadata only: a change wakes every ApplicationInstance referencing it
//!   (no polling). Secrets are not watched: the controller has no right to read them
//!   (a Secret's metadata can carry its data in kubectl's last-applied annotation); Flux
//!   reacts to Secrets labelled `reconcile.fluxcd.io/watch: Enabled` itself.

use std::sync::Arc;

use api::{ApplicationInstance, ValuesSourceKind};
use controller_kit::{CancellationToken, Readiness, WatchScope};
use futures::StreamExt;
use helmengine::{OwnerLink, WatchPlace, WatchedKind};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DynamicObject, PartialObjectMeta},
    core::DeserializeGuard,
    runtime::{
        Controller, Predicate as _, WatchStreamExt,
        controller::Config,
        predicates,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tracing::{info, warn};

use crate::{
    reconciler::{self, Context},
    references,
};

/// Everything the controller needs besides the client.
pub struct Settings {
    pub scope: WatchScope,
    pub concurrency: u16,
    /// The engine objects to watch, from every engine this controller drives
    /// ([`helmengine::Engine::watched_kinds`]).
    pub watched: Vec<WatchedKind>,
}

/// Runs the ApplicationInstance controller until `shutdown` is cancelled.
pub async fn run(
    client: Client,
    settings: Settings,
    make_context: impl FnOnce(Store<DeserializeGuard<ApplicationInstance>>) -> Context,
    readiness: Readiness,
    shutdown: CancellationToken,
) {
    let scope = &settings.scope;
    let apps: Api<DeserializeGuard<ApplicationInstance>> = scope.api(client.clone());
    let (reader, writer) = reflector::store();
    let app_stream = watcher(apps, watcher::Config::default())
        .default_backoff()
        .modify(|app| app.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            predicates::generation
                .combine(predicates::finalizers)
                .combine(suspended_by_annotation),
            Default::default(),
        );

    // Each engine kind is watched with its own backoff, and its errors stay in its stream:
    // the Controller pauses *all* its triggers after any trigger error, so on a cluster
    // without an engine's CRDs (every list of theirs a 404) ApplicationInstance events would
    // otherwise wait up to 30 s behind that backoff (EngineNotInstalled late, and late again
    // for each new app).
    let engine_watches: Vec<_> = settings
        .watched
        .iter()
        .map(|watched| engine_object_events(&client, scope, watched))
        .collect();

    // Api<PartialObjectMeta<_>> makes metadata-only requests.
    let config_maps: Api<PartialObjectMeta<ConfigMap>> = scope.api(client.clone());
    let cm_stream = watcher(config_maps, watcher::Config::default())
        .default_backoff()
        .touched_objects();

    controller_kit::controller::on_cache_synced(reader.clone(), move || {
        info!("ApplicationInstance cache synced");
        readiness.set_ready();
    });

    let ctx = Arc::new(make_context(reader.clone()));
    let cm_reader = reader.clone();
    let apps_reader = reader.clone();
    let mut controller = Controller::for_stream(app_stream, reader);
    for (events, resource, link) in engine_watches {
        let store = apps_reader.clone();
        let watched = resource.clone();
        controller = controller.watches_stream_with(
            events,
            move |object: PartialObjectMeta<DynamicObject>| match link {
                OwnerLink::ReadBy(reads_from) => reading(&store, &watched, &object, reads_from),
                _ => helmengine::watch::owners(link, &object.metadata)
                    .into_iter()
                    .map(|key| ObjectRef::new(&key.name).within(&key.namespace))
                    .collect(),
            },
            resource,
        );
    }
    controller
        .watches_stream(cm_stream, move |meta: PartialObjectMeta<ConfigMap>| {
            referencing(&cm_reader, &meta, ValuesSourceKind::ConfigMap)
        })
        .with_config(Config::default().concurrency(settings.concurrency))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconciler::reconcile, reconciler::error_policy, ctx)
        .for_each(|result| {
            controller_kit::controller::log_result(&result);
            std::future::ready(())
        })
        .await;
    info!("controller stopped");
}

/// Metadata-only events of one engine kind, with their own backoff and errors kept to
/// themselves; with the resource and how its objects name their ApplicationInstance.
fn engine_object_events(
    client: &Client,
    scope: &WatchScope,
    watched: &WatchedKind,
) -> (
    impl futures::Stream<Item = Result<PartialObjectMeta<DynamicObject>, watcher::Error>> + Send + 'static,
    ApiResource,
    OwnerLink,
) {
    let resource = watched.resource.clone();
    // Api<PartialObjectMeta<_>> makes metadata-only requests.
    let api: Api<PartialObjectMeta<DynamicObject>> = match &watched.place {
        WatchPlace::Namespace(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        WatchPlace::WithTheApplications => match scope.watch_namespace() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        },
    };
    // A controller confined to one namespace hears only of its own ApplicationInstances'
    // objects in the engine's namespace (which holds every tenant's).
    let mut config = watcher::Config::default();
    if let (WatchPlace::Namespace(_), OwnerLink::InstanceLabels, Some(ns)) =
        (&watched.place, watched.link, scope.watch_namespace())
    {
        config = config.labels(&format!("{}={ns}", helmengine::watch::LABEL_INSTANCE_NAMESPACE));
    }
    // Backoff after `touched_objects`: the watcher emits `Init` before every list, and
    // any item resets a backoff placed before it, so a list failing over and over (404)
    // would be retried every second instead of backing off to 30 s.
    let stream = watcher(api, config).touched_objects().default_backoff();
    let kind = resource.kind.clone();
    (keep_errors_to_itself(stream, kind), resource, watched.link)
}

/// `stream` without its errors, which are logged instead (the watcher behind it retries
/// with its own backoff).
fn keep_errors_to_itself<T: Send>(
    stream: impl futures::Stream<Item = Result<T, watcher::Error>> + Send,
    kind: String,
) -> impl futures::Stream<Item = Result<T, watcher::Error>> + Send {
    stream.filter_map(move |item| {
        std::future::ready(match item {
            Ok(object) => Some(Ok(object)),
            Err(error) => {
                warn!(kind = %kind, %error, "watch failed; retrying");
                None
            }
        })
    })
}

/// Changes of the Operation-held suspension wake the reconciler (annotations do not move
/// the generation).
fn suspended_by_annotation(app: &DeserializeGuard<ApplicationInstance>) -> Option<u64> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    app.annotations().get(api::ANNOTATION_SUSPENDED_BY).hash(&mut hasher);
    Some(hasher.finish())
}

/// ApplicationInstances (same namespace) that reference the Secret/ConfigMap `meta`.
fn referencing<K: Resource>(
    store: &Store<DeserializeGuard<ApplicationInstance>>,
    meta: &PartialObjectMeta<K>,
    kind: ValuesSourceKind,
) -> Vec<ObjectRef<DeserializeGuard<ApplicationInstance>>> {
    let name = meta.name_any();
    let namespace = meta.namespace();
    store
        .state()
        .into_iter()
        .filter(|guard| guard.namespace() == namespace)
        .filter(|guard| {
            guard
                .0
                .as_ref()
                .is_ok_and(|app| references::references_object(app, kind, &name))
        })
        .map(|guard| ObjectRef::from_obj(&*guard))
        .collect()
}

/// ApplicationInstances whose spec reads from `object` (a shared chart source), by asking
/// `reads_from` of each one held. Events of such objects are rare (their status changes at
/// their fetch interval), so a scan of the cache is cheaper than an index kept up to date.
fn reading(
    store: &Store<DeserializeGuard<ApplicationInstance>>,
    resource: &ApiResource,
    object: &PartialObjectMeta<DynamicObject>,
    reads_from: helmengine::ReadsFrom,
) -> Vec<ObjectRef<DeserializeGuard<ApplicationInstance>>> {
    let reference = api::ObjectReference {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
        name: object.name_any(),
        namespace: object.namespace(),
    };
    store
        .state()
        .into_iter()
        .filter(|guard| guard.0.as_ref().is_ok_and(|app| reads_from(app, &reference)))
        .map(|guard| ObjectRef::from_obj(&*guard))
        .collect()
}

/// The requeue policy after failed reconciles: 2 s doubling to 5 min.
pub fn failures() -> controller_kit::RetryBackoff<ObjectRef<DeserializeGuard<ApplicationInstance>>> {
    controller_kit::RetryBackoff::new(std::time::Duration::from_secs(2), std::time::Duration::from_secs(300))
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;

    use super::*;

    #[tokio::test]
    async fn an_owned_watch_keeps_its_errors_to_itself() {
        let failed = || watcher::Error::NoResourceVersion;
        let items = futures::stream::iter([Err(failed()), Ok(1), Err(failed()), Ok(2)]);
        let passed: Vec<Result<i32, String>> = keep_errors_to_itself(items, "HelmRelease".to_owned())
            .map(|item| item.map_err(|e| e.to_string()))
            .collect()
            .await;
        assert_eq!(
            passed,
            [Ok(1), Ok(2)],
            "errors never reach the Controller's shared trigger backoff"
        );
    }
}
