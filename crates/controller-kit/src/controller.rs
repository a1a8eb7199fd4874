//! What every kube-runtime `Controller` of the workspace does the same way: wait for its
//! watch cache before saying ready ([`on_cache_synced`], [`wait_for_cache`]), and open
//! each reconcile with the same checks ([`admit`]).

use std::{hash::Hash, ops::ControlFlow, time::Duration};

use kube::{
    Resource,
    core::DeserializeGuard,
    runtime::{
        controller::Action,
        reflector::{Lookup, Store, store::WriterDropped},
    },
};
use tokio::task::JoinHandle;

use crate::leader::LeaderGate;

/// How often [`wait_for_cache`] looks at the store's readiness again.
pub const CACHE_POLL: Duration = Duration::from_millis(500);

/// Completes once `store` holds its first complete listing; `Err` if the store's writer
/// (its watch) went away before.
///
/// A [`Store`]'s readiness signal wakes only its most recent waiter, and the `Controller`
/// reading the same store waits on it too; so this waits [`CACHE_POLL`] at a time and
/// looks again, rather than awaiting once and possibly never being woken.
pub async fn wait_for_cache<K>(store: &Store<K>) -> Result<(), WriterDropped>
where
    K: Lookup + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    loop {
        if let Ok(ready) = tokio::time::timeout(CACHE_POLL, store.wait_until_ready()).await {
            return ready;
        }
    }
}

/// Spawns a task that calls `synced` once `store` is ready ([`wait_for_cache`]); if the
/// store's writer goes away first, the task ends without calling it.
///
/// `synced` typically logs and marks the process ready ([`crate::Readiness::set_ready`]).
pub fn on_cache_synced<K>(store: Store<K>, synced: impl FnOnce() + Send + 'static) -> JoinHandle<()>
where
    K: Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    tokio::spawn(async move {
        if wait_for_cache(&store).await.is_ok() {
            synced();
        }
    })
}

/// Logs one result of a kube-runtime `Controller`'s stream: a reconciled object at debug, a
/// controller error (a failed reconcile, or a watch error the watcher retries with backoff,
/// e.g. a CRD not installed yet) at warn. For `controller.run(..).for_each(..)`.
pub fn log_result<T: std::fmt::Display, E: std::fmt::Display>(result: &Result<(T, Action), E>) {
    match result {
        Ok((object, action)) => tracing::debug!(%object, ?action, "reconciled"),
        Err(e) => tracing::warn!(error = %e, "controller event"),
    }
}

/// The checks at the top of every reconcile, in order:
///
/// 1. an object that does not match this binary's schema (the API server validated it, so
///    this is a version skew or a bug) is logged once and left alone until it changes:
///    `Break(await_change)`;
/// 2. a replica that does not lead keeps its caches warm but never writes: it looks again
///    after `follower_requeue`;
/// 3. otherwise `Continue` with the object.
pub fn admit<'a, K>(
    guard: &'a DeserializeGuard<K>,
    gate: &LeaderGate,
    follower_requeue: Duration,
) -> ControlFlow<Action, &'a K>
where
    K: Resource<DynamicType = ()>,
{
    let object = match &guard.0 {
        Ok(object) => object,
        Err(invalid) => {
            tracing::warn!(
                error = %invalid.error,
                "{} does not match this controller's schema; skipping",
                K::kind(&())
            );
            return ControlFlow::Break(Action::await_change());
        }
    };
    if !gate.is_leader() {
        return ControlFlow::Break(Action::requeue(follower_requeue));
    }
    ControlFlow::Continue(object)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::{
        core::{ObjectMeta, error_boundary::InvalidObject},
        runtime::{reflector, watcher},
    };
    use tokio::sync::watch;

    use super::*;

    fn valid() -> DeserializeGuard<ConfigMap> {
        DeserializeGuard(Ok(ConfigMap {
            metadata: ObjectMeta {
                name: Some("cm".into()),
                namespace: Some("team-a".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }))
    }

    fn malformed() -> DeserializeGuard<ConfigMap> {
        DeserializeGuard(Err(InvalidObject {
            error: "data: invalid type".into(),
            metadata: ObjectMeta::default(),
        }))
    }

    const FOLLOWER: Duration = Duration::from_secs(7);

    #[test]
    fn the_leader_reconciles_a_valid_object() {
        let guard = valid();
        match admit(&guard, &LeaderGate::always_leader(), FOLLOWER) {
            ControlFlow::Continue(cm) => assert_eq!(cm.metadata.name.as_deref(), Some("cm")),
            ControlFlow::Break(action) => panic!("stopped with {action:?}"),
        }
    }

    #[test]
    fn a_follower_requeues_without_touching_the_object() {
        let (_tx, rx) = watch::channel(false);
        assert_eq!(
            admit(&valid(), &LeaderGate::new(rx), FOLLOWER),
            ControlFlow::Break(Action::requeue(FOLLOWER))
        );
    }

    #[test]
    fn a_malformed_object_waits_for_a_change_on_every_replica() {
        let (_tx, rx) = watch::channel(false);
        for gate in [LeaderGate::always_leader(), LeaderGate::new(rx)] {
            assert_eq!(
                admit(&malformed(), &gate, FOLLOWER),
                ControlFlow::Break(Action::await_change())
            );
        }
    }

    #[tokio::test]
    async fn cache_wait_survives_a_second_waiter() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = on_cache_synced(store.clone(), move || {
            let _ = tx.send(());
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Another waiter on the same store (the Controller's) takes the wake-up.
        let other = tokio::spawn({
            let store = store.clone();
            async move { store.wait_until_ready().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);

        tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .expect("synced was not called")
            .expect("the task dropped the callback");
        task.await.unwrap();
        assert!(other.await.unwrap().is_ok());
        assert!(wait_for_cache(&store).await.is_ok(), "ready stays ready");
    }

    #[tokio::test]
    async fn cache_wait_ends_without_calling_back_when_the_watch_is_gone() {
        let (store, writer) = reflector::store::<ConfigMap>();
        let task = on_cache_synced(store.clone(), || panic!("called back without a synced cache"));
        drop(writer);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the task did not end")
            .unwrap();
        assert!(wait_for_cache(&store).await.is_err());
    }
}
