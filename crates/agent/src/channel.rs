//! Serves the gRPC status channel (crate `status-channel`) and turns its events into
//! [`StatusHint`]s for the status cache.
//!
//! The channel is an accelerator: a hint makes the agent read one object at once and sync
//! within `--report-delay`. Nothing depends on it: the watches and relists are complete,
//! so a failure to serve it is logged and the agent carries on.

use std::net::SocketAddr;

use controller_kit::{CancellationToken, Metrics};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};
use status_channel::Received;
use tokio::{sync::mpsc, task::JoinHandle};

use crate::status::StatusHint;

/// Events buffered between the gRPC streams and the hint consumer. A full buffer slows
/// the publishers' streams (their own bounded buffers then overflow into a Resync), never
/// their reconcilers.
const EVENT_BUFFER: usize = 1024;

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

/// Serves the channel on `addr` until `shutdown`, forwarding hints to `hints`. Counts
/// events in `vworkspace_agent_status_channel_events_total{kind="object"|"resync"}`.
pub fn spawn(
    addr: SocketAddr,
    hints: mpsc::Sender<StatusHint>,
    metrics: &Metrics,
    shutdown: CancellationToken,
) -> Vec<JoinHandle<()>> {
    let counted = Family::<EventLabels, Counter>::default();
    metrics.register(
        "agent_status_channel_events",
        "Events received on the gRPC status channel, by kind (object, resync)",
        counted.clone(),
    );
    let (events_tx, mut events) = mpsc::channel(EVENT_BUFFER);
    let server_shutdown = shutdown.clone();
    let server = tokio::spawn(async move {
        if let Err(e) = status_channel::serve(addr, events_tx, server_shutdown.cancelled_owned()).await {
            tracing::error!(%addr, error = %e, "cannot serve the status channel; status still flows through the watches");
        }
    });
    let forward = tokio::spawn(async move {
        loop {
            let received = tokio::select! {
                () = shutdown.cancelled() => return,
                r = events.recv() => r,
            };
            let Some(received) = received else { return };
            let kind = match received {
                Received::Status { .. } => "object",
                Received::Resync { .. } => "resync",
            };
            counted.get_or_create(&EventLabels { kind }).inc();
            if let Some(h) = hint(received)
                && hints.send(h).await.is_err()
            {
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

    #[tokio::test]
    async fn a_published_event_reaches_the_hint_consumer() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let (tx, mut rx) = mpsc::channel(16);
        let shutdown = CancellationToken::new();
        let metrics = Metrics::new("test");
        let tasks = spawn(addr, tx, &metrics, shutdown.clone());
        let publisher = status_channel::Publisher::from_flag(Some(&format!("http://{addr}")), "test", "test-0");
        // The first thing a (re)connecting publisher sends is a Resync.
        let first = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .expect("a hint within 10 s")
            .unwrap();
        assert!(matches!(first, StatusHint::Resync { .. }), "{first:?}");
        drop(publisher);
        shutdown.cancel();
        for t in tasks {
            t.await.unwrap();
        }
    }
}
