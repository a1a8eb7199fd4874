//! [`ObjectCache`]: the objects of one kind the controller already watches whole, kept
//! for the engine's reads.
//!
//! Shared chart sources are read by every reconcile of every app that uses them. The
//! controller watches them whole anyway ([`crate::WholeObjects`]), so the engine reads
//! them from here instead of asking the API server each time. The engine creates the
//! cache and hands it out with its watched kinds; the controller's watch fills it. A
//! process that never fills it (the day-2 engines drive the same adapter without that
//! watch) gets [`Cached::Unknown`] for every lookup and reads from the API server.
//!
//! The cache can lag the API server by the watch's delivery time. That is safe for its
//! readers: an object created meanwhile is applied again (server-side apply of the same
//! desired state changes nothing), and a status change arrives as the event that also wakes
//! the apps reading the object, after the cache holds it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use kube::ResourceExt;
use kube::api::DynamicObject;

/// What the cache knows of one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Cached {
    /// The cache does not cover the object (not filled yet, or its namespace is outside
    /// the watch): ask the API server.
    Unknown,
    /// The watch holds no such object.
    Absent,
    /// The object as the watch last delivered it.
    Present(Arc<DynamicObject>),
}

/// The objects of one kind, as a watch delivers them; cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct ObjectCache {
    state: Arc<RwLock<State>>,
}

type Key = (String, String);

#[derive(Debug, Default)]
struct State {
    /// What the cache covers once a list has completed: `Some(None)` every namespace,
    /// `Some(Some(ns))` one. `None`: nothing yet.
    covers: Option<Option<String>>,
    objects: HashMap<Key, Arc<DynamicObject>>,
    /// The objects a list in progress has delivered so far. A listed object is stored at
    /// once (it is at least as new as what the cache held, and its event may wake a
    /// reader before the list completes); the others are dropped when it completes (their
    /// deletion was missed).
    listing: Option<HashSet<Key>>,
}

fn key(object: &DynamicObject) -> Key {
    (object.namespace().unwrap_or_default(), object.name_any())
}

impl ObjectCache {
    /// What the cache holds of the object `namespace`/`name`.
    pub fn lookup(&self, namespace: &str, name: &str) -> Cached {
        let state = self.read();
        match &state.covers {
            Some(None) => {}
            Some(Some(covered)) if covered == namespace => {}
            _ => return Cached::Unknown,
        }
        match state.objects.get(&(namespace.to_owned(), name.to_owned())) {
            Some(object) => Cached::Present(object.clone()),
            None => Cached::Absent,
        }
    }

    /// A (re)list of the watch begins.
    pub fn list_started(&self) {
        self.write().listing = Some(HashSet::new());
    }

    /// One object of the list in progress.
    pub fn listed(&self, object: DynamicObject) {
        let mut state = self.write();
        let key = key(&object);
        if let Some(listing) = state.listing.as_mut() {
            listing.insert(key.clone());
        }
        state.objects.insert(key, Arc::new(object));
    }

    /// The list is complete: objects it did not deliver are gone, and the cache now covers
    /// `namespace` (`None`: every namespace).
    pub fn list_done(&self, namespace: Option<&str>) {
        let mut state = self.write();
        if let Some(listed) = state.listing.take() {
            state.objects.retain(|key, _| listed.contains(key));
            state.covers = Some(namespace.map(str::to_owned));
        }
    }

    /// An object was created or changed.
    pub fn applied(&self, object: DynamicObject) {
        let key = key(&object);
        self.write().objects.insert(key, Arc::new(object));
    }

    /// An object was deleted.
    pub fn deleted(&self, object: &DynamicObject) {
        self.write().objects.remove(&key(object));
    }

    // A panic while the lock was held cannot leave the map half-written (each change is one
    // insert, remove or swap), so a poisoned lock is still sound to use.
    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ApiResource;

    use super::*;

    fn object(namespace: &str, name: &str, version: &str) -> DynamicObject {
        let mut object = DynamicObject::new(name, &ApiResource::erase::<ConfigMap>(&())).within(namespace);
        object.metadata.resource_version = Some(version.to_owned());
        object
    }

    fn version(cached: Cached) -> Option<String> {
        match cached {
            Cached::Present(object) => object.resource_version(),
            _ => None,
        }
    }

    #[test]
    fn an_unfilled_cache_knows_nothing_and_a_list_makes_it_authoritative() {
        let cache = ObjectCache::default();
        assert_eq!(cache.lookup("team-a", "repo"), Cached::Unknown);
        cache.list_started();
        cache.listed(object("team-a", "repo", "1"));
        assert_eq!(
            cache.lookup("team-a", "repo"),
            Cached::Unknown,
            "until the first list completes, nothing is known"
        );
        cache.list_done(None);
        assert_eq!(version(cache.lookup("team-a", "repo")), Some("1".to_owned()));
        assert_eq!(cache.lookup("team-b", "repo"), Cached::Absent);
    }

    #[test]
    fn a_watch_of_one_namespace_covers_only_that_namespace() {
        let cache = ObjectCache::default();
        cache.list_started();
        cache.list_done(Some("team-a"));
        assert_eq!(cache.lookup("team-a", "repo"), Cached::Absent);
        assert_eq!(
            cache.lookup("shared", "repo"),
            Cached::Unknown,
            "another namespace is read from the API server"
        );
    }

    #[test]
    fn changes_and_deletions_follow_the_watch_and_a_relist_replaces_everything_at_once() {
        let cache = ObjectCache::default();
        cache.list_started();
        cache.listed(object("team-a", "kept", "1"));
        cache.listed(object("team-a", "gone", "1"));
        cache.list_done(None);
        cache.applied(object("team-a", "kept", "2"));
        cache.applied(object("team-a", "new", "3"));
        cache.deleted(&object("team-a", "gone", "1"));
        assert_eq!(version(cache.lookup("team-a", "kept")), Some("2".to_owned()));
        assert_eq!(version(cache.lookup("team-a", "new")), Some("3".to_owned()));
        assert_eq!(cache.lookup("team-a", "gone"), Cached::Absent);

        cache.list_started();
        cache.listed(object("team-a", "kept", "4"));
        assert_eq!(
            version(cache.lookup("team-a", "kept")),
            Some("4".to_owned()),
            "a listed object is news at once: its event may wake a reader before the list ends"
        );
        assert_eq!(
            version(cache.lookup("team-a", "new")),
            Some("3".to_owned()),
            "the others stay until the relist completes"
        );
        cache.list_done(None);
        assert_eq!(version(cache.lookup("team-a", "kept")), Some("4".to_owned()));
        assert_eq!(
            cache.lookup("team-a", "new"),
            Cached::Absent,
            "missed deletions are gone after a relist"
        );
    }
}
