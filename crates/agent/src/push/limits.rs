//! What the push endpoint bounds before anyone is authenticated: connections per client
//! address (taken before the TLS handshake, so one client cannot hold every slot), the
//! length of the token itself, and the rate of refusal log lines.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

/// Default of `--push-max-connections-per-ip`: a fraction of [`super::MAX_CONNECTIONS`],
/// so a client that opens connections and never finishes the handshake holds at most
/// this many slots; Odoo needs one or two.
pub const CONNECTIONS_PER_IP: usize = 8;

/// Shortest push token accepted: 32 bytes (256 bits when random), as a start-up error and,
/// after a rotation, as an unreadable token (fail closed).
pub const MIN_TOKEN_BYTES: usize = 32;

/// At most one refusal line per this interval; the others are counted into the next one.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Why a token is not acceptable as the push token, or `None`.
pub fn token_too_short(token: &str) -> Option<String> {
    let len = token.len();
    (len < MIN_TOKEN_BYTES).then(|| {
        format!("the push token is {len} bytes; at least {MIN_TOKEN_BYTES} are required (e.g. `openssl rand -hex 32`)")
    })
}

/// Open connections per client address.
#[derive(Debug, Clone)]
pub struct PerIpLimit {
    max: usize,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One connection's place; released when dropped.
#[derive(Debug)]
pub struct IpSlot {
    ip: IpAddr,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PerIpLimit {
    /// At most `max` (at least 1) connections per address.
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            open: Arc::default(),
        }
    }

    /// A slot for a connection from `ip`, or `None` when it has `max` open already.
    pub fn try_acquire(&self, ip: IpAddr) -> Option<IpSlot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(ip).or_default();
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(IpSlot {
            ip,
            open: self.open.clone(),
        })
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Refusal log lines, at most one per interval: each line carries how many refusals were
/// not logged since the previous one, so a flood costs one line per interval, not one per
/// request, and nothing goes uncounted (the metrics count every refusal too).
#[derive(Debug)]
pub struct RefusalLog {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RefusalLog {
    /// One line per `interval`.
    pub const fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// A refusal at `now`: `Some(n)` to log it with `n` earlier refusals left unlogged,
    /// `None` to count it only.
    pub fn note(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < self.interval)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// The endpoint's refusal log (one per process: there is one endpoint).
static REFUSALS: Mutex<RefusalLog> = Mutex::new(RefusalLog::new(REFUSAL_LOG_INTERVAL));

/// Whether to log a refusal now, and how many were left unlogged before it.
pub fn refusal_to_log() -> Option<u64> {
    REFUSALS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .note(Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_need_32_bytes() {
        let cases = [
            ("", true),
            ("push-token-0123456789abcdef", true),
            (&"x".repeat(31), true),
            (&"x".repeat(32), false),
            (&"x".repeat(64), false),
        ];
        for (token, short) in cases {
            assert_eq!(token_too_short(token).is_some(), short, "{} bytes", token.len());
        }
        let msg = token_too_short("abc").unwrap();
        assert!(msg.contains("3 bytes") && !msg.contains("abc"), "{msg}");
    }

    #[test]
    fn connections_per_ip_are_capped_and_released() {
        let limit = PerIpLimit::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = limit.try_acquire(a).expect("first");
        let a2 = limit.try_acquire(a).expect("second");
        assert!(limit.try_acquire(a).is_none(), "third from the same address");
        let _b1 = limit.try_acquire(b).expect("another address is not affected");
        drop(a1);
        let _a3 = limit.try_acquire(a).expect("a released slot is free again");
        drop(a2);
        assert!(PerIpLimit::new(0).try_acquire(a).is_some(), "at least one");
    }

    #[test]
    fn refusal_lines_are_one_per_interval_with_a_count() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut log = RefusalLog::new(ms(1000));
        // (ms after t0, expected)
        let steps: [(u64, Option<u64>); 7] = [
            (0, Some(0)),
            (1, None),
            (500, None),
            (999, None),
            (1000, Some(3)),
            (1500, None),
            (5000, Some(1)),
        ];
        for (at, want) in steps {
            assert_eq!(log.note(t0 + ms(at)), want, "at {at} ms");
        }
    }
}
