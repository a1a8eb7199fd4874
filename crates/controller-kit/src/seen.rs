//! Versions of objects a reconcile has already acted on, so that their own watch events do
//! not wake it again.
//!
//! A reconcile that writes an object (adds its finalizer, applies the engine object it
//! owns) gets the written version back and acts on it at once. The watch then delivers that
//! very version as an event, which would run the reconcile again only to find nothing to do.
//! The reconcile records the version here; the watch stream drops the one event carrying it.
//! Any event of the object consumes its entry, so the map holds at most one version per
//! object written since its last event, and a version recorded too late (after its event)
//! costs only the extra reconcile it would have cost anyway.

use std::{
    collections::{HashMap, hash_map::Entry},
    hash::{BuildHasher, RandomState},
    sync::{Mutex, PoisonError},
};

/// Which object: kind, namespace ("" for cluster-scoped objects), name.
type Key = (String, String, String);

/// Versions recorded by reconciles, consumed by watch streams (shared between them).
///
/// Entries are found by a hash of the object's key, so the watch streams' lookup (one per
/// event) allocates nothing; the full key is kept beside the version to tell apart the
/// rare objects whose hashes collide (the later one replaces the earlier, which then costs
/// only its extra reconcile).
#[derive(Debug, Default)]
pub struct SeenVersions {
    versions: Mutex<HashMap<u64, (Key, String)>>,
    hasher: RandomState,
}

impl SeenVersions {
    /// Records that the reconcile acted on `resource_version` of the object.
    pub fn record(&self, kind: &str, namespace: &str, name: &str, resource_version: &str) {
        let hash = self.hash(kind, namespace, name);
        let key = (kind.to_owned(), namespace.to_owned(), name.to_owned());
        self.lock().insert(hash, (key, resource_version.to_owned()));
    }

    /// Whether an event of the object at `resource_version` brings nothing the reconcile has
    /// not acted on. Consumes the object's entry either way: a later version is news.
    pub fn consume(&self, kind: &str, namespace: &str, name: &str, resource_version: &str) -> bool {
        let mut versions = self.lock();
        if versions.is_empty() {
            return false;
        }
        let Entry::Occupied(entry) = versions.entry(self.hash(kind, namespace, name)) else {
            return false;
        };
        let ((k, ns, n), _) = entry.get();
        if (k.as_str(), ns.as_str(), n.as_str()) != (kind, namespace, name) {
            return false;
        }
        entry.remove().1 == resource_version
    }

    fn hash(&self, kind: &str, namespace: &str, name: &str) -> u64 {
        self.hasher.hash_one((kind, namespace, name))
    }

    /// How many versions wait for their event.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no version waits for its event.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (Key, String)>> {
        // The map stays consistent through any panic of a holder: each call is one insert or remove.
        self.versions.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_version_is_dropped_once_and_any_other_passes() {
        let seen = SeenVersions::default();
        assert!(!seen.consume("HelmRelease", "a", "x", "1"), "nothing recorded: news");
        seen.record("HelmRelease", "a", "x", "7");
        assert!(!seen.consume("HelmRelease", "a", "y", "7"), "another object");
        assert!(!seen.consume("Application", "a", "x", "7"), "another kind");
        assert!(seen.consume("HelmRelease", "a", "x", "7"), "the version acted on");
        assert!(!seen.consume("HelmRelease", "a", "x", "7"), "only once");
        assert!(seen.is_empty());
    }

    #[test]
    fn a_later_version_is_news_and_consumes_the_entry() {
        let seen = SeenVersions::default();
        seen.record("ApplicationInstance", "a", "x", "7");
        assert!(!seen.consume("ApplicationInstance", "a", "x", "8"));
        assert_eq!(seen.len(), 0, "no entry outlives the object's next event");
    }
}
