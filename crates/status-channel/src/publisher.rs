//! The publishing side: a cheap, cloneable, never-blocking handle.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use api::backoff::Backoff;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{metadata::MetadataValue, transport::Endpoint};
use tracing::{debug, info, warn};

use crate::{
    auth::{MAX_MESSAGE_BYTES, token_file_from_env},
    pb::{self, status_channel_client::StatusChannelClient, status_event::Payload},
};

/// Room left in an event for its envelope (sequence, names) besides the object status.
const ENVELOPE_BYTES: usize = 1024;

/// A condition message cut to this when an event would exceed the server's cap.
const SHRUNK_MESSAGE_BYTES: usize = 1024;

/// Where and as whom to publish.
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    /// The agent's gRPC endpoint, e.g. `http://vworkspace-agent.vworkspace-system:9090`.
    pub endpoint: String,
    /// Publisher name, e.g. `vworkspace-app-controller`.
    pub publisher: String,
    /// Process identity (pod name); a new value tells the agent the publisher restarted.
    pub instance: String,
    /// Events buffered while disconnected or slow; beyond this, drop and resync.
    pub capacity: usize,
    /// File holding the ServiceAccount token sent with each stream (a projected token
    /// with audience [`crate::auth::AUDIENCE`]). Read again on every connection, because
    /// the kubelet rotates it. `None` sends no token (the agent then refuses the stream).
    pub token_file: Option<PathBuf>,
}

/// Counters of a publisher (for tests and metrics).
#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    dropped: AtomicU64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    result: &'static str,
}

/// The publisher's metrics (names without the process prefix `vworkspace_`):
///
/// | metric | type | labels |
/// |---|---|---|
/// | `status_channel_connected` | gauge (0/1): 1 while a stream to the agent is open | |
/// | `status_channel_connections_total` | counter: streams the agent accepted | |
/// | `status_channel_events_total` | counter: status events handed to the channel | `result` (`accepted`, `dropped`) |
///
/// Registered only for an enabled publisher ([`Publisher::register_metrics`]), so a
/// process without a status channel shows no `status_channel_connected` series to alert on.
#[derive(Clone, Debug, Default)]
struct PublisherMetrics {
    connected: Gauge,
    connections: Counter,
    events: Family<EventLabels, Counter>,
}

impl PublisherMetrics {
    fn new() -> Self {
        let m = Self::default();
        // Both series exist at zero before the first event.
        for result in [EVENT_ACCEPTED, EVENT_DROPPED] {
            drop(m.events.get_or_create(&EventLabels { result }));
        }
        m
    }

    fn event(&self, result: &'static str) {
        self.events.get_or_create(&EventLabels { result }).inc();
    }
}

/// `result` of an event accepted into the buffer.
const EVENT_ACCEPTED: &str = "accepted";
/// `result` of an event dropped (buffer full, or too large to send).
const EVENT_DROPPED: &str = "dropped";

/// A handle to publish status events. Cloning is cheap; publishing never blocks.
#[derive(Clone, Debug)]
pub struct Publisher {
    tx: Option<mpsc::Sender<pb::ObjectStatus>>,
    overflow: Arc<AtomicBool>,
    counters: Arc<Counters>,
    metrics: PublisherMetrics,
}

impl Publisher {
    /// A publisher that discards everything (no agent configured).
    pub fn disabled() -> Self {
        Self {
            tx: None,
            overflow: Arc::default(),
            counters: Arc::default(),
            metrics: PublisherMetrics::default(),
        }
    }

    /// The publisher for an optional endpoint flag: disabled when `None`. The token is
    /// read from `$VWS_STATUS_CHANNEL_TOKEN_FILE`, else the bundle's projected volume
    /// ([`crate::auth::DEFAULT_TOKEN_FILE`]).
    pub fn from_flag(endpoint: Option<&str>, publisher: &str, instance: &str) -> Self {
        match endpoint {
            Some(endpoint) => Self::spawn(PublisherConfig {
                endpoint: endpoint.to_owned(),
                publisher: publisher.to_owned(),
                instance: instance.to_owned(),
                capacity: 1024,
                token_file: Some(token_file_from_env()),
            }),
            None => Self::disabled(),
        }
    }

    /// Starts the background connection task (on the current Tokio runtime).
    pub fn spawn(config: PublisherConfig) -> Self {
        let (tx, rx) = mpsc::channel(config.capacity.max(1));
        let overflow = Arc::new(AtomicBool::new(false));
        let metrics = PublisherMetrics::new();
        tokio::spawn(run(config, rx, overflow.clone(), metrics.clone()));
        Self {
            tx: Some(tx),
            overflow,
            counters: Arc::default(),
            metrics,
        }
    }

    /// Registers the channel's metrics in the process registry (with its prefix:
    /// `vworkspace_status_channel_connected`, `_connections_total`, `_events_total{result}`);
    /// nothing for a disabled publisher, so only a process with a channel has a
    /// `status_channel_connected` series to alert on.
    pub fn register_metrics(&self, metrics: &controller_kit::Metrics) {
        if !self.is_enabled() {
            return;
        }
        metrics.register(
            "status_channel_connected",
            "1 while this process's status channel stream to the agent is open",
            self.metrics.connected.clone(),
        );
        metrics.register(
            "status_channel_connections",
            "Status channel streams the agent accepted (reconnections included)",
            self.metrics.connections.clone(),
        );
        metrics.register(
            "status_channel_events",
            "Status events handed to the status channel, by result (accepted, dropped)",
            self.metrics.events.clone(),
        );
    }

    /// Hands `status` to the channel. Never blocks: when the buffer is full the event is
    /// dropped and the agent will be told to re-list.
    pub fn publish(&self, status: pb::ObjectStatus) {
        let Some(tx) = &self.tx else { return };
        // An event the agent would refuse would end the stream: shrink it, or drop it and
        // let the resync marker repair (the agent re-reads the object from the API).
        let Some(status) = fit(status) else {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            self.metrics.event(EVENT_DROPPED);
            self.overflow.store(true, Ordering::Relaxed);
            return;
        };
        match tx.try_send(status) {
            Ok(()) => {
                self.counters.published.fetch_add(1, Ordering::Relaxed);
                self.metrics.event(EVENT_ACCEPTED);
            }
            Err(_) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                self.metrics.event(EVENT_DROPPED);
                self.overflow.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Whether a channel is configured.
    pub fn is_enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Events accepted into the buffer so far.
    pub fn published(&self) -> u64 {
        self.counters.published.load(Ordering::Relaxed)
    }

    /// Events dropped because the buffer was full.
    pub fn dropped(&self) -> u64 {
        self.counters.dropped.load(Ordering::Relaxed)
    }
}

/// `status` within the server's message cap: as is, else with condition messages cut to
/// [`SHRUNK_MESSAGE_BYTES`] (on a character boundary), else `None`.
fn fit(mut status: pb::ObjectStatus) -> Option<pb::ObjectStatus> {
    let limit = MAX_MESSAGE_BYTES - ENVELOPE_BYTES;
    if status.encoded_len() <= limit {
        return Some(status);
    }
    for c in &mut status.conditions {
        let end = api::text::prefix_within(&c.message, SHRUNK_MESSAGE_BYTES).len();
        c.message.truncate(end);
    }
    (status.encoded_len() <= limit).then_some(status)
}

/// The token to send, read now (the kubelet rotates the file). Errors are logged at debug
/// with the path only, never the content.
fn read_token(path: Option<&PathBuf>) -> Option<MetadataValue<tonic::metadata::Ascii>> {
    let path = path?;
    let token = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            debug!(path = %path.display(), error = %e, "cannot read the status channel token; connecting without it");
            return None;
        }
    };
    let mut value = MetadataValue::try_from(format!("Bearer {}", token.trim())).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// Reconnect delays: 0.5 s doubling to 30 s, without jitter (the workspace's one policy,
/// [`api::backoff::Backoff`]); reset after a connection that carried events.
const RECONNECT: Backoff = Backoff::doubling(Duration::from_millis(500), Duration::from_secs(30));

fn backoff(attempt: u32) -> Duration {
    RECONNECT.ceiling(attempt)
}

async fn run(
    config: PublisherConfig,
    mut rx: mpsc::Receiver<pb::ObjectStatus>,
    overflow: Arc<AtomicBool>,
    metrics: PublisherMetrics,
) {
    let endpoint = match Endpoint::from_shared(config.endpoint.clone()) {
        Ok(e) => e
            .connect_timeout(Duration::from_secs(2))
            .tcp_keepalive(Some(Duration::from_secs(30))),
        Err(e) => {
            warn!(endpoint = %config.endpoint, error = %e, "invalid status channel endpoint; status events are discarded");
            while rx.recv().await.is_some() {}
            return;
        }
    };
    let mut sequence = 0u64;
    let mut attempt = 0u32;
    loop {
        let channel = match endpoint.connect().await {
            Ok(channel) => channel,
            Err(e) => {
                debug!(endpoint = %config.endpoint, error = %e, "status channel not reachable; retrying");
                // Keep only what fits; anything beyond is dropped (publish sets the overflow flag).
                tokio::time::sleep(backoff(attempt)).await;
                attempt = attempt.saturating_add(1);
                if rx.is_closed() && rx.is_empty() {
                    return;
                }
                continue;
            }
        };
        info!(endpoint = %config.endpoint, "status channel connected");
        let (out_tx, out_rx) = mpsc::channel::<pb::StatusEvent>(64);
        let mut client = StatusChannelClient::new(channel);
        let event = |sequence: u64, payload: Payload| pb::StatusEvent {
            sequence,
            publisher: config.publisher.clone(),
            publisher_instance: config.instance.clone(),
            payload: Some(payload),
        };
        // Whatever happened while disconnected is unknown to the agent: drop the backlog
        // and ask it to re-list (events carry full state, so nothing is lost).
        while rx.try_recv().is_ok() {}
        overflow.store(false, Ordering::Relaxed);
        sequence += 1;
        let resync = event(
            sequence,
            Payload::Resync(pb::Resync {
                reason: "connected".into(),
            }),
        );
        if out_tx.send(resync).await.is_err() {
            continue;
        }
        let mut request = tonic::Request::new(ReceiverStream::new(out_rx));
        if let Some(token) = read_token(config.token_file.as_ref()) {
            request.metadata_mut().insert("authorization", token);
        }
        let response = client.publish(request).await;
        let mut acks = match response {
            Ok(response) => response.into_inner(),
            Err(status) => {
                // A refused token (wrong ServiceAccount, missing volume) is a deployment
                // error worth seeing; it is retried with backoff, so this is not a flood.
                if matches!(
                    status.code(),
                    tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
                ) {
                    warn!(endpoint = %config.endpoint, error = %status.message(), "status channel refused this publisher; retrying");
                } else {
                    debug!(error = %status, "status channel refused the stream; retrying");
                }
                tokio::time::sleep(backoff(attempt)).await;
                attempt = attempt.saturating_add(1);
                continue;
            }
        };
        attempt = 0;
        metrics.connected.set(1);
        metrics.connections.inc();
        loop {
            tokio::select! {
                next = rx.recv() => {
                    let Some(status) = next else { return };
                    sequence += 1;
                    let payload = if overflow.swap(false, Ordering::Relaxed) {
                        while rx.try_recv().is_ok() {}
                        Payload::Resync(pb::Resync { reason: "publisher buffer overflow".into() })
                    } else {
                        Payload::Object(status)
                    };
                    if out_tx.send(event(sequence, payload)).await.is_err() {
                        break;
                    }
                }
                ack = acks.message() => match ack {
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => {
                        debug!("status channel closed; reconnecting");
                        break;
                    }
                }
            }
        }
        metrics.connected.set(0);
        tokio::time::sleep(backoff(0)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_shrunk_to_the_cap_or_dropped() {
        let with = |messages: &[usize]| pb::ObjectStatus {
            conditions: messages
                .iter()
                .map(|&n| pb::Condition {
                    message: "é".repeat(n / 2),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        // (condition message sizes, kept?, every message at most this long after)
        let cases: [(&[usize], bool, usize); 4] = [
            (&[100, 4096], true, 4096),
            (&[4096; 8], true, 4096),
            (&[70_000], true, SHRUNK_MESSAGE_BYTES),
            (&[SHRUNK_MESSAGE_BYTES; 80], false, 0),
        ];
        for (sizes, kept, longest) in cases {
            let out = fit(with(sizes));
            assert_eq!(out.is_some(), kept, "{sizes:?}");
            if let Some(out) = out {
                assert!(out.encoded_len() <= MAX_MESSAGE_BYTES - ENVELOPE_BYTES);
                assert!(out.conditions.iter().all(|c| c.message.len() <= longest), "{sizes:?}");
            }
        }
    }

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(0), Duration::from_millis(500));
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(6), Duration::from_secs(30));
        assert_eq!(backoff(60), Duration::from_secs(30));
    }

    #[tokio::test]
    async fn disabled_publisher_accepts_and_discards() {
        let publisher = Publisher::disabled();
        publisher.publish(pb::ObjectStatus::default());
        assert!(!publisher.is_enabled());
        assert_eq!(publisher.published(), 0);
    }

    #[tokio::test]
    async fn publishing_without_an_agent_never_blocks_and_drops_beyond_capacity() {
        let publisher = Publisher::spawn(PublisherConfig {
            // Nothing listens there: the task keeps retrying in the background.
            endpoint: "http://127.0.0.1:1".into(),
            publisher: "test".into(),
            instance: "t-0".into(),
            capacity: 4,
            token_file: None,
        });
        let started = std::time::Instant::now();
        for _ in 0..100 {
            publisher.publish(pb::ObjectStatus::default());
        }
        assert!(started.elapsed() < Duration::from_millis(100), "publish must not block");
        assert_eq!(publisher.published() + publisher.dropped(), 100);
        assert!(publisher.dropped() >= 96, "{}", publisher.dropped());
    }

    #[tokio::test]
    async fn metrics_count_events_and_show_the_connection_state() {
        let publisher = Publisher::spawn(PublisherConfig {
            endpoint: "http://127.0.0.1:1".into(),
            publisher: "test".into(),
            instance: "t-0".into(),
            capacity: 2,
            token_file: None,
        });
        let metrics = controller_kit::Metrics::new("vworkspace");
        publisher.register_metrics(&metrics);
        for _ in 0..5 {
            publisher.publish(pb::ObjectStatus::default());
        }
        let text = metrics.encode().unwrap();
        for needle in [
            "vworkspace_status_channel_connected 0",
            "vworkspace_status_channel_connections_total 0",
            "vworkspace_status_channel_events_total{result=\"accepted\"} 2",
            "vworkspace_status_channel_events_total{result=\"dropped\"} 3",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }

        // A disabled publisher registers nothing.
        let metrics = controller_kit::Metrics::new("vworkspace");
        Publisher::disabled().register_metrics(&metrics);
        assert!(!metrics.encode().unwrap().contains("status_channel"));
    }
}
