//! Wiring: watches and the kube-runtime Controller.
//!
//! - ApplicationInstances: guarded against malformed objects, `managedFields` stripped,
//!   filtered by generation (+ finalizers) so our own status writes do not re-trigger;
//!   only those `--watch-label-selector` selects, when it is set (ADR 0015).
//! - The engine objects each engine names ([`helmengine::Engine::watched_kinds`]: for Flux
//!   HelmReleases linked by owner references and the sources apps read from; for Argo CD
//!   Applications in Argo CD's namespace, linked by labels), metadata only: engine status
//!   changes wake the ApplicationInstance at once. Kinds with few objects read by many apps
//!   (shared sources) are watched whole, wake their readers only when what those see
//!   changes, and fill the engine's cache of them, from which reconciles read them.
//!   Nothing here names an engine type.
//! - Both: the one event of a version a reconcile wrote and already acted on is dropped
//!   ([`SeenVersions`]).
//! - ConfigMaps, metadata only: a change wakes every ApplicationInstance referencing it
//!   (no polling). Secrets are not watched: the controller has no right to read them
//!   (a Secret's metadata can carry its data in kubectl's last-applied annotation); Flux
//!   reacts to Secrets labelled `reconcile.fluxcd.io/watch: Enabled` itself.

use std::{collections::HashMap, sync::Arc};

use api::{ApplicationInstance, ValuesSourceKind};
use controller_kit::{CancellationToken, Readiness, SeenVersions, WatchScope, labels::LabelSelector};
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
    /// `--watch-label-selector`: the ApplicationInstances this controller is responsible
    /// for; it neither sees nor writes the others (ADR 0015).
    pub selector: Option<LabelSelector>,
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
    let ctx = Arc::new(make_context(reader.clone()));
    let seen = ctx.seen.clone();
    let app_config = match &settings.selector {
        Some(selector) => watcher::Config::default().labels(selector.as_str()),
        None => watcher::Config::default(),
    };
    let app_stream = watcher(apps, app_config)
        .default_backoff()
        .modify(|app| app.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            predicates::generation
                .combine(predicates::finalizers)
                .combine(suspended_by_annotation),
            Default::default(),
        )
        .filter(move |event| std::future::ready(!acted_on(&seen, reconciler::API_KIND, event)));

    // Each engine kind is watched with its own backoff, and its errors stay in its stream:
    // the Controller pauses *all* its triggers after any trigger error, so on a cluster
    // without an engine's CRDs (every list of theirs a 404) ApplicationInstance events would
    // otherwise wait up to 30 s behind that backoff (EngineNotInstalled late, and late again
    // for each new app).
    let engine_watches: Vec<_> = settings
        .watched
        .iter()
        .map(|watched| engine_object_events(&client, scope, watched, ctx.seen.clone()))
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
    seen: Arc<SeenVersions>,
) -> (
    impl futures::Stream<Item = Result<PartialObjectMeta<DynamicObject>, watcher::Error>> + Send + 'static,
    ApiResource,
    OwnerLink,
) {
    let resource = watched.resource.clone();
    let namespace = match &watched.place {
        WatchPlace::Namespace(ns) => Some(ns.as_str()),
        WatchPlace::WithTheApplications => scope.watch_namespace(),
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
    let kind = resource.kind.clone();
    let changes = match &watched.whole {
        // Api<PartialObjectMeta<_>> makes metadata-only requests.
        None => watcher(
            place_api::<PartialObjectMeta<DynamicObject>>(client, namespace, &resource),
            config,
        )
        .touched_objects()
        .boxed(),
        Some(whole) => watcher(place_api::<DynamicObject>(client, namespace, &resource), config)
            .map(fill(whole.cache.clone(), namespace.map(str::to_owned)))
            .filter_map(changes_readers_see(whole.readers_see))
            .boxed(),
    };
    let stream = changes
        .default_backoff()
        .filter(move |event| std::future::ready(!acted_on(&seen, &kind, event)));
    let kind = resource.kind.clone();
    (keep_errors_to_itself(stream, kind), resource, watched.link)
}

/// The objects of `resource` in `namespace` (all namespaces when `None`).
fn place_api<K>(client: &Client, namespace: Option<&str>, resource: &ApiResource) -> Api<K>
where
    K: Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

/// What a whole-object watch yields.
type WholeObjectEvent = Result<watcher::Event<DynamicObject>, watcher::Error>;
/// What the Controller's engine-object triggers take.
type MetadataEvent = Result<PartialObjectMeta<DynamicObject>, watcher::Error>;

/// Keeps `cache` as the watch in `namespace` (`None`: every namespace) sees the objects,
/// before anything is woken by an event: a reconcile an event wakes reads at least that
/// event's version.
fn fill(cache: helmengine::ObjectCache, namespace: Option<String>) -> impl FnMut(WholeObjectEvent) -> WholeObjectEvent {
    move |event| {
        match &event {
            Ok(watcher::Event::Init) => cache.list_started(),
            Ok(watcher::Event::InitApply(object)) => cache.listed(object.clone()),
            Ok(watcher::Event::InitDone) => cache.list_done(namespace.as_deref()),
            Ok(watcher::Event::Apply(object)) => cache.applied(object.clone()),
            Ok(watcher::Event::Delete(object)) => cache.deleted(object),
            Err(_) => {}
        }
        event
    }
}

/// A filter of whole-object watch events down to the objects whose readers would see a
/// change ([`helmengine::WholeObjects::readers_see`]), as metadata: an object seen for the
/// first time since the last (re)list, a changed fingerprint, a deletion. Errors pass.
fn changes_readers_see(
    readers_see: helmengine::ReadersSee,
) -> impl FnMut(WholeObjectEvent) -> std::future::Ready<Option<MetadataEvent>> {
    let mut last: HashMap<(Option<String>, String), u64> = HashMap::new();
    move |event| {
        let as_meta = |object: DynamicObject| PartialObjectMeta {
            types: object.types,
            metadata: object.metadata,
            _phantom: std::marker::PhantomData,
        };
        let key = |object: &DynamicObject| (object.metadata.namespace.clone(), object.name_any());
        std::future::ready(match event {
            Err(error) => Some(Err(error)),
            // A relist may have missed deletions and changes: every object is news again.
            Ok(watcher::Event::Init) => {
                last.clear();
                None
            }
            Ok(watcher::Event::InitDone) => None,
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                let fingerprint = readers_see(&object);
                let before = last.insert(key(&object), fingerprint);
                (before != Some(fingerprint)).then(|| Ok(as_meta(object)))
            }
            Ok(watcher::Event::Delete(object)) => {
                last.remove(&key(&object));
                Some(Ok(as_meta(object)))
            }
        })
    }
}

/// Whether `event` carries a version a reconcile wrote and already acted on
/// ([`SeenVersions`]): it would wake the reconcile only to find nothing to do.
fn acted_on<K: Resource>(seen: &SeenVersions, kind: &str, event: &Result<K, watcher::Error>) -> bool {
    let Ok(object) = event else {
        return false;
    };
    let meta = object.meta();
    let (Some(name), Some(version)) = (&meta.name, &meta.resource_version) else {
        return false;
    };
    seen.consume(kind, meta.namespace.as_deref().unwrap_or_default(), name, version)
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

    /// A source's finalizer or a status detail no app reports wakes none of its readers; a
    /// change of what they see, a deletion and every object of a relist do.
    #[tokio::test]
    async fn a_shared_source_wakes_its_readers_only_when_what_they_see_changes() {
        use watcher::Event;
        let source = |seen: u64, finalizer: bool| {
            let mut object = DynamicObject::new("repo", &ApiResource::erase::<ConfigMap>(&())).within("team-a");
            object.data = serde_json::json!({"status": {"seen": seen}});
            if finalizer {
                object.metadata.finalizers = Some(vec!["finalizers.fluxcd.io".into()]);
            }
            object
        };
        let readers_see: helmengine::ReadersSee = |o| o.data["status"]["seen"].as_u64().unwrap_or_default();
        let events = futures::stream::iter([
            Ok(Event::Init),
            Ok(Event::InitApply(source(1, false))),
            Ok(Event::InitDone),
            Ok(Event::Apply(source(1, true))),
            Ok(Event::Apply(source(2, true))),
            Err(watcher::Error::NoResourceVersion),
            Ok(Event::Delete(source(2, true))),
            Ok(Event::Apply(source(2, false))),
            Ok(Event::Init),
            Ok(Event::InitApply(source(2, false))),
            Ok(Event::InitDone),
        ]);
        let woke: Vec<Result<Option<Vec<String>>, String>> = events
            .filter_map(changes_readers_see(readers_see))
            .map(|item| item.map(|meta| meta.metadata.finalizers).map_err(|e| e.to_string()))
            .collect()
            .await;
        let with = Some(vec!["finalizers.fluxcd.io".to_owned()]);
        assert_eq!(
            woke,
            [
                Ok(None),         // first seen
                Ok(with.clone()), // what its readers see changed (not the finalizer before it)
                Err(watcher::Error::NoResourceVersion.to_string()),
                Ok(with), // deleted
                Ok(None), // created again
                Ok(None), // relisted
            ]
        );
    }

    /// The engine's cache holds what the watch delivered before the event wakes anyone.
    #[tokio::test]
    async fn a_whole_object_watch_fills_the_engine_cache_first() {
        use helmengine::Cached;
        use watcher::Event;
        let source = |name: &str| DynamicObject::new(name, &ApiResource::erase::<ConfigMap>(&())).within("team-a");
        let cache = helmengine::ObjectCache::default();
        let mut fill = fill(cache.clone(), None);
        let mut wake = changes_readers_see(|_| 0);
        let mut woke = Vec::new();
        for event in [
            Ok(Event::Init),
            Ok(Event::InitDone),
            // A relist: what it delivers is news before it completes.
            Ok(Event::Init),
            Ok(Event::InitApply(source("listed"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(source("created"))),
            Ok(Event::Delete(source("listed"))),
        ] {
            if let Some(Ok(meta)) = wake(fill(event)).await {
                let name = meta.name_any();
                woke.push((name.clone(), cache.lookup("team-a", &name)));
            }
        }
        assert!(matches!(woke.first(), Some((n, Cached::Present(_))) if n == "listed"));
        assert!(matches!(woke.get(1), Some((n, Cached::Present(_))) if n == "created"));
        assert_eq!(woke.get(2), Some(&("listed".to_owned(), Cached::Absent)));
    }

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
