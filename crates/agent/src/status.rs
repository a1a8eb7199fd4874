//! Status, rebuilt from the CRs: watches of ApplicationInstances and Operations feed a
//! cache of reports; the sync loop sends what changed (deltas) or everything (a full
//! resync after a start or a reconnect). Nothing lives only in memory that the cluster
//! does not hold: after a restart of the agent or of Odoo, a relist rebuilds it all.
//!
//! The gRPC status channel (crate `status-channel`, served by the agent) plugs in
//! through [`StatusHint`]s: each event names an object that changed, so the agent reads
//! it at once and forwards it with the next (immediate) sync, instead of waiting for
//! its watch or its periodic sync. The channel is an accelerator, never a dependency:
//! the watches alone are complete.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, PoisonError},
};

use api::{ApplicationInstance, Operation};
use futures::StreamExt as _;
use jiff::Timestamp;
use kube::{
    Api, Client, ResourceExt as _,
    runtime::{WatchStreamExt as _, watcher},
};
use protocol::{
    messages::{ObjectKey, ObjectKind, ObjectReport},
    report::{application_report, deleted_report, operation_report, same_content},
};
use tokio::sync::{Notify, mpsc};

use controller_kit::{CancellationToken, WatchScope};

/// A status-channel event: "this object changed" (or "re-list everything").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatusHint {
    /// One object changed; `resource_version` lets the agent skip what it already has.
    Object {
        /// The object.
        key: ObjectKey,
        /// Its `metadata.resourceVersion` as published (empty if unknown).
        resource_version: String,
        /// The publisher saw it deleted.
        deleted: bool,
    },
    /// A publisher may have lost events: re-list and resync.
    Resync {
        /// Why (for logs).
        reason: String,
    },
}

impl StatusHint {
    /// A hint from the fields of a status-channel event (`ObjectRef.kind`, `namespace`,
    /// `name`, `resource_version`, `deleted`); `None` for a kind the agent does not report.
    pub fn object(kind: &str, namespace: &str, name: &str, resource_version: &str, deleted: bool) -> Option<Self> {
        let kind = match kind {
            "ApplicationInstance" => ObjectKind::ApplicationInstance,
            "Operation" => ObjectKind::Operation,
            _ => return None,
        };
        Some(Self::Object {
            key: key(kind, namespace, name),
            resource_version: resource_version.to_owned(),
            deleted,
        })
    }
}

#[derive(Debug)]
struct Entry {
    report: ObjectReport,
    version: u64,
}

/// Reports by object, with the set of changes not yet delivered to the control plane.
#[derive(Debug, Default)]
pub struct StatusCache {
    entries: BTreeMap<ObjectKey, Entry>,
    /// Deletions not yet delivered.
    tombstones: BTreeMap<ObjectKey, Entry>,
    /// Changed keys and the version of the change.
    dirty: BTreeMap<ObjectKey, u64>,
    counter: u64,
    synced: BTreeSet<ObjectKind>,
}

/// A report taken for sending, with the version to confirm on delivery.
pub type Taken = (ObjectKey, u64, ObjectReport);

/// `new` is an older state of the same object than `known`: a status-channel hint's GET
/// and the watch race, and a late event must not put back a state Odoo already left.
/// resourceVersions are compared as numbers only when both are (an etcd-backed API server
/// hands out increasing integers); anything else is taken as newer.
fn older(new: &ObjectReport, known: &ObjectReport) -> bool {
    let number = |r: &ObjectReport| r.resource_version.as_deref()?.parse::<u64>().ok();
    new.uid == known.uid && matches!((number(new), number(known)), (Some(n), Some(k)) if n < k)
}

impl StatusCache {
    fn bump(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    /// Records the current report of an object; returns whether anything changed.
    pub fn upsert(&mut self, report: ObjectReport) -> bool {
        let key = report.key();
        if let Some(e) = self.entries.get(&key)
            && (same_content(&e.report, &report) || older(&report, &e.report))
        {
            return false;
        }
        let version = self.bump();
        self.tombstones.remove(&key);
        self.dirty.insert(key.clone(), version);
        self.entries.insert(key, Entry { report, version });
        true
    }

    /// Records a deletion; returns whether the object was known.
    pub fn remove(&mut self, key: &ObjectKey, now: Timestamp) -> bool {
        let Some(old) = self.entries.remove(key) else {
            return false;
        };
        let version = self.bump();
        let report = deleted_report(key.kind, &key.namespace, &key.name, old.report.uid, now);
        self.dirty.insert(key.clone(), version);
        self.tombstones.insert(key.clone(), Entry { report, version });
        true
    }

    /// After a full list of one kind: every listed object is upserted, every cached one
    /// that was not listed is deleted. Marks the kind synced. Returns how many changed.
    pub fn replace_kind(&mut self, kind: ObjectKind, reports: Vec<ObjectReport>, now: Timestamp) -> usize {
        let listed: BTreeSet<ObjectKey> = reports.iter().map(ObjectReport::key).collect();
        let mut changed = 0;
        for r in reports {
            changed += usize::from(self.upsert(r));
        }
        let gone: Vec<ObjectKey> = self
            .entries
            .keys()
            .filter(|k| k.kind == kind && !listed.contains(k))
            .cloned()
            .collect();
        for k in gone {
            changed += usize::from(self.remove(&k, now));
        }
        self.synced.insert(kind);
        changed
    }

    /// Whether both kinds have been listed at least once.
    pub fn is_synced(&self) -> bool {
        self.synced.len() == 2
    }

    /// The resourceVersion cached for an object.
    pub fn resource_version(&self, key: &ObjectKey) -> Option<&str> {
        self.entries.get(key).and_then(|e| e.report.resource_version.as_deref())
    }

    /// Up to `max` undelivered changes, oldest first.
    pub fn deltas(&self, max: usize) -> Vec<Taken> {
        let mut out: Vec<Taken> = self
            .dirty
            .iter()
            .filter_map(|(k, v)| {
                let e = self.entries.get(k).or_else(|| self.tombstones.get(k))?;
                (e.version == *v).then(|| (k.clone(), *v, e.report.clone()))
            })
            .collect();
        out.sort_by_key(|(_, v, _)| *v);
        out.truncate(max);
        out
    }

    /// Every current report (for a full resync), with versions.
    pub fn snapshot(&self) -> Vec<Taken> {
        self.entries
            .iter()
            .map(|(k, e)| (k.clone(), e.version, e.report.clone()))
            .collect()
    }

    /// Delivered: forget those changes unless the object changed again since.
    pub fn delivered(&mut self, sent: impl IntoIterator<Item = (ObjectKey, u64)>) {
        for (key, version) in sent {
            if self.dirty.get(&key) == Some(&version) {
                self.dirty.remove(&key);
                if self.tombstones.get(&key).is_some_and(|t| t.version == version) {
                    self.tombstones.remove(&key);
                }
            }
        }
    }

    /// Undelivered deletions whose tombstones are older than a resync are covered by it.
    pub fn drop_tombstones_before(&mut self, version: u64) {
        let old: Vec<ObjectKey> = self
            .tombstones
            .iter()
            .filter(|(_, e)| e.version <= version)
            .map(|(k, _)| k.clone())
            .collect();
        for k in old {
            self.tombstones.remove(&k);
            if self.dirty.get(&k).is_some_and(|v| *v <= version) {
                self.dirty.remove(&k);
            }
        }
    }

    /// Number of undelivered changes.
    pub fn pending(&self) -> usize {
        self.dirty.len()
    }

    /// Highest version handed out so far.
    pub fn version(&self) -> u64 {
        self.counter
    }

    /// Number of objects known.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no object is known.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The shared cache and the signal that it changed.
#[derive(Clone, Default)]
pub struct SharedStatus {
    cache: Arc<Mutex<StatusCache>>,
    changed: Arc<Notify>,
    synced: Arc<Notify>,
}

impl SharedStatus {
    /// A new, empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` on the cache (held briefly; never across an await).
    pub fn with<T>(&self, f: impl FnOnce(&mut StatusCache) -> T) -> T {
        let mut guard = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard)
    }

    /// Completes when something changed (after the call).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    fn notify_changed(&self) {
        self.changed.notify_one();
    }

    /// Completes once both kinds have been listed.
    pub async fn wait_synced(&self) {
        loop {
            let notified = self.synced.notified();
            if self.with(|c| c.is_synced()) {
                return;
            }
            notified.await;
        }
    }
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn key(kind: ObjectKind, ns: &str, name: &str) -> ObjectKey {
    ObjectKey {
        kind,
        namespace: ns.to_owned(),
        name: name.to_owned(),
    }
}

/// Watches one kind and keeps the cache current until `shutdown`.
async fn watch_kind<K, F>(
    api: Api<K>,
    kind: ObjectKind,
    scope: WatchScope,
    status: SharedStatus,
    to_report: F,
    shutdown: CancellationToken,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(&K, Timestamp) -> ObjectReport,
{
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    let mut listing: Option<Vec<ObjectReport>> = None;
    loop {
        let event = tokio::select! {
            () = shutdown.cancelled() => return,
            e = stream.next() => e,
        };
        let Some(event) = event else { return };
        let allowed = |o: &K| scope.allows(o.namespace().as_deref().unwrap_or_default());
        match event {
            Ok(watcher::Event::Init) => listing = Some(Vec::new()),
            Ok(watcher::Event::InitApply(obj)) => {
                if allowed(&obj)
                    && let Some(l) = listing.as_mut()
                {
                    l.push(to_report(&obj, now()));
                }
            }
            Ok(watcher::Event::InitDone) => {
                let reports = listing.take().unwrap_or_default();
                let count = reports.len();
                let changed = status.with(|c| c.replace_kind(kind, reports, now()));
                tracing::info!(kind = kind.as_str(), objects = count, changed, "listed");
                status.synced.notify_waiters();
                if changed > 0 {
                    status.notify_changed();
                }
            }
            Ok(watcher::Event::Apply(obj)) => {
                if allowed(&obj) && status.with(|c| c.upsert(to_report(&obj, now()))) {
                    status.notify_changed();
                }
            }
            Ok(watcher::Event::Delete(obj)) => {
                let k = key(kind, obj.namespace().as_deref().unwrap_or_default(), &obj.name_any());
                if status.with(|c| c.remove(&k, now())) {
                    status.notify_changed();
                }
            }
            Err(e) => tracing::warn!(kind = kind.as_str(), error = %e, "watch error; retrying with backoff"),
        }
    }
}

/// Starts the two watches. Returns their tasks.
pub fn spawn_watches(
    client: Client,
    scope: WatchScope,
    status: SharedStatus,
    shutdown: CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let apps: Api<ApplicationInstance> = scope.api(client.clone());
    let ops: Api<Operation> = scope.api(client);
    vec![
        tokio::spawn(watch_kind(
            apps,
            ObjectKind::ApplicationInstance,
            scope.clone(),
            status.clone(),
            application_report,
            shutdown.clone(),
        )),
        tokio::spawn(watch_kind(
            ops,
            ObjectKind::Operation,
            scope,
            status,
            operation_report,
            shutdown,
        )),
    ]
}

/// Lists both kinds afresh and replaces the cache's content (the periodic relist, and the
/// answer to a status-channel resync).
pub async fn relist(client: &Client, scope: &WatchScope, status: &SharedStatus) -> Result<usize, kube::Error> {
    let apps: Api<ApplicationInstance> = scope.api(client.clone());
    let ops: Api<Operation> = scope.api(client.clone());
    let allowed = |ns: Option<String>| scope.allows(ns.as_deref().unwrap_or_default());
    let app_reports: Vec<ObjectReport> = apps
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|a| allowed(a.namespace()))
        .map(|a| application_report(a, now()))
        .collect();
    let op_reports: Vec<ObjectReport> = ops
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|o| allowed(o.namespace()))
        .map(|o| operation_report(o, now()))
        .collect();
    let changed = status.with(|c| {
        c.replace_kind(ObjectKind::ApplicationInstance, app_reports, now())
            + c.replace_kind(ObjectKind::Operation, op_reports, now())
    });
    if changed > 0 {
        status.notify_changed();
    }
    Ok(changed)
}

/// Reads one object named by a hint and updates the cache.
async fn refresh(client: &Client, scope: &WatchScope, status: &SharedStatus, k: &ObjectKey) -> Result<(), kube::Error> {
    if !scope.allows(&k.namespace) {
        return Ok(());
    }
    let report = match k.kind {
        ObjectKind::ApplicationInstance => Api::<ApplicationInstance>::namespaced(client.clone(), &k.namespace)
            .get_opt(&k.name)
            .await?
            .map(|a| application_report(&a, now())),
        ObjectKind::Operation => Api::<Operation>::namespaced(client.clone(), &k.namespace)
            .get_opt(&k.name)
            .await?
            .map(|o| operation_report(&o, now())),
    };
    let changed = match report {
        Some(r) => status.with(|c| c.upsert(r)),
        None => status.with(|c| c.remove(k, now())),
    };
    if changed {
        status.notify_changed();
    }
    Ok(())
}

/// Consumes status-channel hints until `shutdown`. `resync` is signalled on a
/// [`StatusHint::Resync`] (after the relist).
pub async fn consume_hints(
    client: Client,
    scope: WatchScope,
    status: SharedStatus,
    mut hints: mpsc::Receiver<StatusHint>,
    resync: Arc<Notify>,
    shutdown: CancellationToken,
) {
    loop {
        let hint = tokio::select! {
            () = shutdown.cancelled() => return,
            h = hints.recv() => h,
        };
        let Some(hint) = hint else { return };
        match hint {
            StatusHint::Object {
                key,
                resource_version,
                deleted,
            } => {
                let known = status.with(|c| c.resource_version(&key).map(str::to_owned));
                if !deleted && !resource_version.is_empty() && known.as_deref() == Some(resource_version.as_str()) {
                    continue;
                }
                if let Err(e) = refresh(&client, &scope, &status, &key).await {
                    tracing::debug!(object = %key, error = %e, "cannot read the object of a status hint; the watch will catch up");
                }
            }
            StatusHint::Resync { reason } => {
                // Publishers reconnecting together (an agent restart) each ask; one relist
                // answers every request queued so far, and covers any queued object hint.
                let mut coalesced = 0;
                while hints.try_recv().is_ok() {
                    coalesced += 1;
                }
                tracing::info!(%reason, coalesced, "status channel asks for a resync");
                match relist(&client, &scope, &status).await {
                    Ok(_) => resync.notify_one(),
                    Err(e) => tracing::warn!(error = %e, "relist failed; the watches stay the source"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use protocol::messages::ObjectState;

    use super::*;

    fn report(name: &str, state: ObjectState, rv: &str) -> ObjectReport {
        let mut r = deleted_report(
            ObjectKind::ApplicationInstance,
            "team-a",
            name,
            Some(format!("uid-{name}")),
            Timestamp::UNIX_EPOCH,
        );
        r.state = state;
        r.resource_version = Some(rv.into());
        r
    }

    #[test]
    fn a_late_older_state_does_not_replace_a_newer_one() {
        let mut c = StatusCache::default();
        assert!(c.upsert(report("a", ObjectState::Ready, "20")));
        assert!(!c.upsert(report("a", ObjectState::Progressing, "19")), "older");
        assert_eq!(c.resource_version(&k("a")), Some("20"));
        assert!(c.upsert(report("a", ObjectState::Failed, "21")), "newer");
        let mut recreated = report("a", ObjectState::Progressing, "5");
        recreated.uid = Some("uid-other".into());
        assert!(c.upsert(recreated), "another object under the same name");
        assert!(
            c.upsert(report("a", ObjectState::Ready, "opaque")),
            "not comparable: taken"
        );
    }

    fn k(name: &str) -> ObjectKey {
        key(ObjectKind::ApplicationInstance, "team-a", name)
    }

    #[test]
    fn deltas_are_delivered_at_least_once() {
        let mut c = StatusCache::default();
        assert!(c.upsert(report("a", ObjectState::Progressing, "1")));
        assert!(!c.upsert(report("a", ObjectState::Progressing, "1")), "same content");
        assert!(c.upsert(report("b", ObjectState::Ready, "2")));
        let sent = c.deltas(10);
        assert_eq!(sent.len(), 2);
        // "a" changes while the sync is in flight: its newer version stays pending.
        assert!(c.upsert(report("a", ObjectState::Ready, "3")));
        c.delivered(sent.iter().map(|(k, v, _)| (k.clone(), *v)));
        let left = c.deltas(10);
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].2.state, ObjectState::Ready);
        assert_eq!(left[0].0, k("a"));
    }

    #[test]
    fn a_relist_reports_what_disappeared_while_nobody_watched() {
        let mut c = StatusCache::default();
        c.replace_kind(
            ObjectKind::ApplicationInstance,
            vec![
                report("a", ObjectState::Ready, "1"),
                report("b", ObjectState::Ready, "2"),
            ],
            Timestamp::UNIX_EPOCH,
        );
        let all = c.deltas(10);
        c.delivered(all.iter().map(|(k, v, _)| (k.clone(), *v)));
        assert!(!c.is_synced(), "only one kind listed");
        let changed = c.replace_kind(
            ObjectKind::ApplicationInstance,
            vec![report("a", ObjectState::Ready, "1")],
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(changed, 1);
        let d = c.deltas(10);
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].0.clone(), d[0].2.state), (k("b"), ObjectState::Deleted));
        assert_eq!(d[0].2.uid.as_deref(), Some("uid-b"));
        assert_eq!(c.snapshot().len(), 1);
        c.replace_kind(ObjectKind::Operation, vec![], Timestamp::UNIX_EPOCH);
        assert!(c.is_synced());
    }

    #[test]
    fn batches_are_bounded_and_oldest_first() {
        let mut c = StatusCache::default();
        for i in 0..10 {
            c.upsert(report(&format!("o{i}"), ObjectState::Ready, "1"));
        }
        let first = c.deltas(4);
        assert_eq!(first.len(), 4);
        assert_eq!(first[0].0, k("o0"));
        c.delivered(first.iter().map(|(k, v, _)| (k.clone(), *v)));
        assert_eq!(c.pending(), 6);
        assert_eq!(c.deltas(4)[0].0, k("o4"));
    }

    #[test]
    fn hints_from_channel_fields() {
        assert_eq!(
            StatusHint::object("Operation", "team-a", "b1", "42", false),
            Some(StatusHint::Object {
                key: key(ObjectKind::Operation, "team-a", "b1"),
                resource_version: "42".into(),
                deleted: false
            })
        );
        assert_eq!(StatusHint::object("HelmRelease", "team-a", "x", "1", false), None);
    }

    #[test]
    fn tombstones_are_dropped_once_a_resync_covers_them() {
        let mut c = StatusCache::default();
        c.upsert(report("a", ObjectState::Ready, "1"));
        c.remove(&k("a"), Timestamp::UNIX_EPOCH);
        assert_eq!(c.pending(), 1);
        c.drop_tombstones_before(c.version());
        assert_eq!(c.pending(), 0);
        assert!(c.is_empty());
    }
}
