//! Retry delays: exponential backoff with jitter, as a pure function of the attempt
//! number and a random draw, so the policy is testable and every caller behaves alike.
//!
//! The one backoff of the workspace: the agent's retries to the control plane (with jitter,
//! re-exported as `protocol::backoff`), the engines' requeue after failed reconciles
//! (`controller_kit::RetryBackoff`, no jitter) and the status-channel publisher's reconnects
//! (no jitter) all compute their delays here. It lives in `api`, the lowest crate, because
//! `protocol` is pure and must not depend on controller-kit's runtime.
//!
//! Written here rather than taken from `backon` (already in the lock through kube): backon's
//! jitter adds up to one more full delay (`[d, 2d]`) and draws from its own generator inside
//! a stateful iterator, while this policy guarantees half the capped delay, never exceeds
//! the cap, and is a pure function the tests can pin (see `docs/development/project-layout.md`).

use std::time::Duration;

/// Exponential backoff with "equal jitter": the delay of attempt `n` (from 0) is drawn
/// uniformly from `[d/2, d]` where `d = min(max, initial × multiplier^n)`. Half the delay
/// is guaranteed (no hammering after an outage), half is random (agents restarted
/// together do not retry in lockstep).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// Delay before the first retry (before jitter).
    pub initial: Duration,
    /// Upper bound of any delay.
    pub max: Duration,
    /// Growth per attempt (≥ 1).
    pub multiplier: f64,
}

impl Default for Backoff {
    /// 1 s doubling to 5 min: 1, 2, 4, … 256, 300, 300 s (before jitter).
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
            multiplier: 2.0,
        }
    }
}

impl Backoff {
    /// `initial` doubling up to `max`: `initial`, `2·initial`, `4·initial`… (before jitter).
    pub const fn doubling(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            multiplier: 2.0,
        }
    }

    /// The capped delay of attempt `n` (from 0), before jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = self.multiplier.max(1.0).powi(attempt.min(64) as i32);
        let secs = self.initial.as_secs_f64() * factor;
        if !secs.is_finite() || secs >= self.max.as_secs_f64() {
            self.max
        } else {
            Duration::from_secs_f64(secs)
        }
    }

    /// The delay of attempt `n`; `random` is a uniform draw from `[0, 1)` (clamped).
    pub fn delay(&self, attempt: u32, random: f64) -> Duration {
        let ceiling = self.ceiling(attempt);
        let r = if random.is_finite() {
            random.clamp(0.0, 1.0)
        } else {
            0.0
        };
        ceiling.mul_f64(0.5 + 0.5 * r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_then_caps() {
        let b = Backoff::default();
        let ceilings: Vec<u64> = (0..12).map(|n| b.ceiling(n).as_secs()).collect();
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(b.ceiling(u32::MAX), b.max);
    }

    #[test]
    fn jitter_stays_between_half_and_full() {
        let b = Backoff::default();
        for n in 0..15 {
            let c = b.ceiling(n);
            assert_eq!(b.delay(n, 0.0), c / 2);
            assert_eq!(b.delay(n, 1.0), c);
            let mid = b.delay(n, 0.5);
            assert!(mid > c / 2 && mid < c, "{n}: {mid:?}");
        }
        assert_eq!(b.delay(3, -7.0), b.ceiling(3) / 2, "clamped");
        assert_eq!(b.delay(3, f64::NAN), b.ceiling(3) / 2);
    }

    #[test]
    fn doubling_matches_the_former_integer_backoffs() {
        // controller-kit's RetryBackoff (1 s to 5 min, from the first failure) and the
        // status-channel reconnect delay (0.5 s to 30 s): the same values as their former
        // `base << n`, capped, implementations.
        let engines = Backoff::doubling(Duration::from_secs(1), Duration::from_secs(300));
        for n in 0..40u32 {
            let former = Duration::from_secs(1)
                .saturating_mul(1u32 << n.min(16))
                .min(Duration::from_secs(300));
            assert_eq!(engines.ceiling(n), former, "engines, attempt {n}");
        }
        let channel = Backoff::doubling(Duration::from_millis(500), Duration::from_secs(30));
        for n in 0..40u32 {
            let former = Duration::from_millis(500u64.saturating_mul(1 << n.min(6))).min(Duration::from_secs(30));
            assert_eq!(channel.ceiling(n), former, "status channel, attempt {n}");
        }
        let ms = |n| channel.ceiling(n).as_millis();
        assert_eq!(
            (0..8).map(ms).collect::<Vec<_>>(),
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]
        );
        assert_eq!(channel.ceiling(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn custom_policy() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            multiplier: 3.0,
        };
        assert_eq!(b.ceiling(0), Duration::from_millis(100));
        assert_eq!(b.ceiling(2), Duration::from_millis(900));
        assert_eq!(b.ceiling(3), Duration::from_secs(1));
    }
}
