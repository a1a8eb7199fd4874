//! Exponential requeue after failed reconciles, per object: every controller retries the
//! same way (doubling from a base delay, capped, computed by the workspace's one policy,
//! [`api::backoff::Backoff`], without jitter), and a success resets the count.
//!
//! An object that fails and is then deleted never succeeds, and kube-runtime does not
//! reconcile a deleted object, so nothing would ever remove its count: entries whose last
//! failure is older than twice the cap are forgotten (a failing object fails again within
//! one cap). The sweep runs at most once per cap, from [`RetryBackoff::failed`].

use std::{
    collections::HashMap,
    hash::Hash,
    sync::Mutex,
    time::{Duration, Instant},
};

use api::backoff::Backoff;

/// Consecutive failures per object key, and the delay they earn.
#[derive(Debug)]
pub struct RetryBackoff<K> {
    policy: Backoff,
    cap: Duration,
    state: Mutex<Failures<K>>,
}

#[derive(Debug)]
struct Failures<K> {
    by_key: HashMap<K, (u32, Instant)>,
    swept_at: Instant,
}

impl<K: Eq + Hash> RetryBackoff<K> {
    /// Delays `base`, `2·base`, `4·base`… up to `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            policy: Backoff::doubling(base, cap),
            cap,
            state: Mutex::new(Failures {
                by_key: HashMap::new(),
                swept_at: Instant::now(),
            }),
        }
    }

    /// Records a failure of `key`; returns the delay before the next attempt and the
    /// number of consecutive failures.
    pub fn failed(&self, key: K) -> (Duration, u32) {
        self.failed_at(key, Instant::now())
    }

    fn failed_at(&self, key: K, now: Instant) -> (Duration, u32) {
        let attempts = self
            .state
            .lock()
            .map(|mut state| {
                if now.saturating_duration_since(state.swept_at) >= self.cap {
                    let stale = self.cap.saturating_mul(2);
                    state
                        .by_key
                        .retain(|_, (_, last)| now.saturating_duration_since(*last) < stale);
                    state.swept_at = now;
                }
                let entry = state.by_key.entry(key).or_insert((0, now));
                entry.0 = entry.0.saturating_add(1);
                entry.1 = now;
                entry.0
            })
            .unwrap_or(1);
        (self.policy.ceiling(attempts.saturating_sub(1)), attempts)
    }

    /// Forgets the failures of `key` after a success.
    pub fn succeeded(&self, key: &K) {
        if let Ok(mut state) = self.state.lock() {
            state.by_key.remove(key);
        }
    }

    /// Number of objects with failures remembered.
    pub fn len(&self) -> usize {
        self.state.lock().map(|s| s.by_key.len()).unwrap_or_default()
    }

    /// Whether no failure is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_and_resets() {
        let retry = RetryBackoff::new(Duration::from_secs(2), Duration::from_secs(300));
        assert_eq!(retry.failed("a"), (Duration::from_secs(2), 1));
        assert_eq!(retry.failed("a"), (Duration::from_secs(4), 2));
        assert_eq!(retry.failed("b"), (Duration::from_secs(2), 1));
        for _ in 0..20 {
            retry.failed("a");
        }
        assert_eq!(retry.failed("a").0, Duration::from_secs(300));
        retry.succeeded(&"a");
        assert_eq!(retry.failed("a"), (Duration::from_secs(2), 1));
    }

    /// Issue 18: an object that failed and was deleted is forgotten; one that keeps
    /// failing (at least once per cap) keeps its count.
    #[test]
    fn objects_that_stopped_failing_are_forgotten() {
        let cap = Duration::from_secs(300);
        let retry = RetryBackoff::new(Duration::from_secs(1), cap);
        let start = Instant::now();
        for i in 0..1000 {
            retry.failed_at(format!("deleted-{i}"), start);
        }
        retry.failed_at("failing".to_owned(), start);
        assert_eq!(retry.len(), 1001);
        // The failing object comes back within each cap; the others never do.
        for step in 1..=3u32 {
            retry.failed_at("failing".to_owned(), start + cap * step);
        }
        assert_eq!(retry.len(), 1, "only the object still failing is remembered");
        assert_eq!(retry.failed_at("failing".to_owned(), start + cap * 3).1, 5);
    }
}
