//! Exponential requeue after failed reconciles, per object: every controller retries the
//! same way (doubling from a base delay, capped, computed by the workspace's one policy,
//! [`api::backoff::Backoff`], without jitter), and a success resets the count.

use std::{collections::HashMap, hash::Hash, sync::Mutex, time::Duration};

use api::backoff::Backoff;

/// Consecutive failures per object key, and the delay they earn.
#[derive(Debug)]
pub struct RetryBackoff<K> {
    policy: Backoff,
    failures: Mutex<HashMap<K, u32>>,
}

impl<K: Eq + Hash> RetryBackoff<K> {
    /// Delays `base`, `2·base`, `4·base`… up to `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            policy: Backoff::doubling(base, cap),
            failures: Mutex::default(),
        }
    }

    /// Records a failure of `key`; returns the delay before the next attempt and the
    /// number of consecutive failures.
    pub fn failed(&self, key: K) -> (Duration, u32) {
        let attempts = self
            .failures
            .lock()
            .map(|mut f| {
                let n = f.entry(key).or_insert(0);
                *n = n.saturating_add(1);
                *n
            })
            .unwrap_or(1);
        (self.policy.ceiling(attempts.saturating_sub(1)), attempts)
    }

    /// Forgets the failures of `key` after a success.
    pub fn succeeded(&self, key: &K) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.remove(key);
        }
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
}
