//! Serves the gRPC status channel (crate `status-channel`) and turns its events into
//! [`StatusHint`]s for the status cache.
//!
//! The channel is an accelerator: a hint makes the agent read one object at once and sync
//! within `--report-delay`. Nothing depends on it: the watches and relists are complete,
//! so a failure to serve it is logged and the agent carries on.
//!
//! Every stream is authenticated ([`crate::channel_auth`]), and the relists publishers
//! can ask for are rate-limited ([`ResyncBudget`]): a relist lists both CRDs across the
//! watched namespaces and sends Odoo a full resync, so an unbounded stream of `Resync`
//! markers would turn the agent into a load amplifier.

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use controller_kit::{CancellationToken, Metrics};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};
use status_channel::{Authenticator, Received};
use tokio::{sync::mpsc, task::JoinHandle};

use crate::status::StatusHint;

/// Events buffered between the gRPC streams and the hint consumer. A full buffer slows
/// the publishers' streams (their own bounded buffers then overflow into a Resync), never
/// their reconcilers.
const EVENT_BUFFER: usize = 1024;

/// Relists the status channel may trigger at once (publishers reconnecting after an agent
/// restart all ask together; one relist answers them all, the burst absorbs a few more).
pub const RESYNC_BURST: u32 = 3;
/// One more relist is allowed per this interval.
pub const RESYNC_EVERY: Duration = Duration::from_secs(30);

/// A token bucket for the relists publishers ask for. A request beyond the budget is not
/// lost: the caller defers one relist to when the bucket refills (every deferred request
/// is answered by that one relist, since each relist reads full state).
#[derive(Debug, Clone)]
pub struct ResyncBudget {
    capacity: u32,
    every: Duration,
    tokens: u32,
    /// When the last token was added (or the bucket was full).
    refilled: Instant,
}

impl ResyncBudget {
    /// A full bucket of `capacity` relists, one more per `every`.
    pub fn new(capacity: u32, every: Duration, now: Instant) -> Self {
        Self {
            capacity: capacity.max(1),
            every: every.max(Duration::from_millis(1)),
            tokens: capacity.max(1),
            refilled: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled);
        let earned = u32::try_from(elapsed.as_nanos() / self.every.as_nanos()).unwrap_or(u32::MAX);
        if earned == 0 {
            return;
        }
        self.tokens = self.tokens.saturating_add(earned).min(self.capacity);
        self.refilled = if self.tokens == self.capacity {
            now
        } else {
            self.refilled + self.every * earned
        };
    }

    /// Takes one relist now, or says when the next one will be available.
    pub fn take(&mut self, now: Instant) -> Result<(), Instant> {
        self.refill(now);
        if self.tokens > 0 {
            self.tokens -= 1;
            if self.tokens + 1 == self.capacity {
                // The interval of the next token starts when the bucket stops being full.
                self.refilled = now;
            }
            Ok(())
        } else {
            Err(self.refilled + self.every)
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    kind: &'static str,
}

/// The hint an event stands for; `None` for a kind the agent does not report.
pub fn hint(received: Received) -> Option<StatusHint> {
    match received {
        Received::Status { status, .. } => {
            let r = status.r#ref.unwrap_or_default();
            StatusHint::object(&r.kind, &r.namespace, &r.name, &status.resource_version, status.deleted)
        }
        Received::Resync { publisher, reason } => Some(StatusHint::Resync {
            reason: format!("{publisher}: {reason}"),
        }),
    }
}

/// Serves the channel on `addr` until `shutdown`, streams authenticated by `auth`,
/// forwarding hints to `hints`. Counts events in
/// `vworkspace_agent_status_channel_events_total{kind="object"|"resync"}` and the relist
/// requests deferred by the [`ResyncBudget`] in
/// `vworkspace_agent_status_channel_resyncs_throttled_total`.
pub fn spawn(
    addr: SocketAddr,
    auth: Arc<dyn Authenticator>,
    hints: mpsc::Sender<StatusHint>,
    metrics: &Metrics,
    shutdown: CancellationToken,
) -> Vec<JoinHandle<()>> {
    spawn_with_budget(
        addr,
        auth,
        hints,
        metrics,
        ResyncBudget::new(RESYNC_BURST, RESYNC_EVERY, Instant::now()),
        shutdown,
    )
}

fn spawn_with_budget(
    addr: SocketAddr,
    auth: Arc<dyn Authenticator>,
    hints: mpsc::Sender<StatusHint>,
    metrics: &Metrics,
    mut budget: ResyncBudget,
    shutdown: CancellationToken,
) -> Vec<JoinHandle<()>> {
    let counted = Family::<EventLabels, Counter>::default();
    metrics.register(
        "agent_status_channel_events",
        "Events received on the gRPC status channel, by kind (object, resync)",
        counted.clone(),
    );
    let throttled = Counter::<u64>::default();
    metrics.register(
        "agent_status_channel_resyncs_throttled",
        "Relist requests of the status channel deferred by its rate limit (answered by a later relist)",
        throttled.clone(),
    );
    let (events_tx, mut events) = mpsc::channel(EVENT_BUFFER);
    let server_shutdown = shutdown.clone();
    let server = tokio::spawn(async move {
        if let Err(e) = status_channel::serve(addr, events_tx, auth, server_shutdown.cancelled_owned()).await {
            tracing::error!(%addr, error = %e, "cannot serve the status channel; status still flows through the watches");
        }
    });
    let forward = tokio::spawn(async move {
        // A relist owed to requests that came in over budget, and when it may run.
        let mut deferred: Option<(tokio::time::Instant, String)> = None;
        loop {
            let due = deferred.as_ref().map(|(at, _)| *at);
            let received = tokio::select! {
                () = shutdown.cancelled() => return,
                () = async { tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)).await }, if due.is_some() => {
                    let Some((_, reason)) = deferred.take() else { continue };
                    // The bucket refilled by now; should it not have, wait one more round.
                    match budget.take(Instant::now()) {
                        Ok(()) => {
                            if hints.send(StatusHint::Resync { reason }).await.is_err() {
                                return;
                            }
                        }
                        Err(at) => deferred = Some((at.into(), reason)),
                    }
                    continue;
                }
                r = events.recv() => r,
            };
            let Some(received) = received else { return };
            let kind = match received {
                Received::Status { .. } => "object",
                Received::Resync { .. } => "resync",
            };
            counted.get_or_create(&EventLabels { kind }).inc();
            let Some(h) = hint(received) else { continue };
            if let StatusHint::Resync { reason } = &h {
                if deferred.is_some() {
                    throttled.inc();
                    continue;
                }
                if let Err(at) = budget.take(Instant::now()) {
                    throttled.inc();
                    tracing::debug!(%reason, "status channel relist deferred by its rate limit");
                    deferred = Some((at.into(), format!("{reason} (deferred)")));
                    continue;
                }
            }
            if hints.send(h).await.is_err() {
                return;
            }
        }
    });
    vec![server, forward]
}

#[cfg(test)]
mod tests {
    use status_channel::pb::{ObjectRef, ObjectStatus};

    use super::*;

    fn status(kind: &str, rv: &str, deleted: bool) -> Received {
        Received::Status {
            publisher: "vworkspace-app-controller".into(),
            status: Box::new(ObjectStatus {
                r#ref: Some(ObjectRef {
                    api_version: "vworkspace.io/v1alpha1".into(),
                    kind: kind.into(),
                    namespace: "team-a".into(),
                    name: "cloud".into(),
                }),
                resource_version: rv.into(),
                deleted,
                ..ObjectStatus::default()
            }),
        }
    }

    #[test]
    fn events_become_hints() {
        assert_eq!(
            hint(status("ApplicationInstance", "42", false)),
            StatusHint::object("ApplicationInstance", "team-a", "cloud", "42", false)
        );
        assert_eq!(
            hint(status("Operation", "", true)),
            StatusHint::object("Operation", "team-a", "cloud", "", true)
        );
        assert_eq!(
            hint(status("HelmRelease", "1", false)),
            None,
            "kinds the agent does not report"
        );
        assert_eq!(
            hint(Received::Resync {
                publisher: "backup-engine".into(),
                reason: "connected".into()
            }),
            Some(StatusHint::Resync {
                reason: "backup-engine: connected".into()
            })
        );
    }

    #[test]
    fn the_resync_budget_allows_a_burst_then_one_per_interval() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // (seconds after t0, Ok or the second the next relist is available)
        let steps: [(u64, Result<(), u64>); 9] = [
            (0, Ok(())),
            (0, Ok(())),
            (1, Ok(())),
            (1, Err(30)),
            (29, Err(30)),
            (30, Ok(())),
            (31, Err(60)),
            // Idle long enough to refill completely, and no more than the burst.
            (500, Ok(())),
            (500, Ok(())),
        ];
        let mut budget = ResyncBudget::new(3, s(30), t0);
        for (at, want) in steps {
            let got = budget.take(t0 + s(at)).map_err(|next| (next - t0).as_secs());
            assert_eq!(got, want, "at {at}s");
        }
        assert_eq!(budget.take(t0 + s(500)), Ok(()));
        assert!(budget.take(t0 + s(500)).is_err(), "the burst is 3");
    }

    /// Accepts every stream as `test` (the TokenReview is proven in e2e).
    struct AnyToken;

    impl Authenticator for AnyToken {
        fn authenticate<'a>(
            &'a self,
            _token: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<String, status_channel::Refused>> {
            Box::pin(async { Ok("test".to_owned()) })
        }
    }

    #[tokio::test]
    async fn a_published_event_reaches_the_hint_consumer_and_resyncs_are_throttled() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "t").unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let shutdown = CancellationToken::new();
        let metrics = Metrics::new("test");
        // One relist, then one every 200 ms.
        let budget = ResyncBudget::new(1, Duration::from_millis(200), Instant::now());
        let tasks = spawn_with_budget(addr, Arc::new(AnyToken), tx, &metrics, budget, shutdown.clone());
        let connect = |instance: &str| {
            status_channel::Publisher::spawn(status_channel::PublisherConfig {
                endpoint: format!("http://{addr}"),
                publisher: "test".into(),
                instance: instance.into(),
                capacity: 16,
                token_file: Some(token.clone()),
            })
        };
        // The first thing a (re)connecting publisher sends is a Resync.
        let publishers: Vec<_> = (0..4).map(|i| connect(&format!("test-{i}"))).collect();
        let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a hint within 10 s")
            .unwrap();
        assert!(matches!(first, StatusHint::Resync { .. }), "{first:?}");
        // The other three are answered by one deferred relist.
        let second = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the deferred relist")
            .unwrap();
        assert!(
            matches!(second, StatusHint::Resync { ref reason } if reason.ends_with("(deferred)")),
            "{second:?}"
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(600), rx.recv())
                .await
                .is_err(),
            "one relist answers every deferred request"
        );
        drop(publishers);
        shutdown.cancel();
        for t in tasks {
            t.await.unwrap();
        }
    }
}
