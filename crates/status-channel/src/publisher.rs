//! The publishing side: a cheap, cloneable, never-blocking handle.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use tracing::{debug, info, warn};

use crate::pb::{self, status_channel_client::StatusChannelClient, status_event::Payload};

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
}

/// Counters of a publisher (for tests and metrics).
#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    dropped: AtomicU64,
}

/// A handle to publish status events. Cloning is cheap; publishing never blocks.
#[derive(Clone, Debug)]
pub struct Publisher {
    tx: Option<mpsc::Sender<pb::ObjectStatus>>,
    overflow: Arc<AtomicBool>,
    counters: Arc<Counters>,
}

impl Publisher {
    /// A publisher that discards everything (no agent configured).
    pub fn disabled() -> Self {
        Self {
            tx: None,
            overflow: Arc::default(),
            counters: Arc::default(),
        }
    }

    /// The publisher for an optional endpoint flag: disabled when `None`.
    pub fn from_flag(endpoint: Option<&str>, publisher: &str, instance: &str) -> Self {
        match endpoint {
            Some(endpoint) => Self::spawn(PublisherConfig {
                endpoint: endpoint.to_owned(),
                publisher: publisher.to_owned(),
                instance: instance.to_owned(),
                capacity: 1024,
            }),
            None => Self::disabled(),
        }
    }

    /// Starts the background connection task (on the current Tokio runtime).
    pub fn spawn(config: PublisherConfig) -> Self {
        let (tx, rx) = mpsc::channel(config.capacity.max(1));
        let overflow = Arc::new(AtomicBool::new(false));
        tokio::spawn(run(config, rx, overflow.clone()));
        Self {
            tx: Some(tx),
            overflow,
            counters: Arc::default(),
        }
    }

    /// Hands `status` to the channel. Never blocks: when the buffer is full the event is
    /// dropped and the agent will be told to re-list.
    pub fn publish(&self, status: pb::ObjectStatus) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(status) {
            Ok(()) => {
                self.counters.published.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
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

/// Reconnect delays: 0.5 s doubling to 30 s; reset after a connection that carried events.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(500u64.saturating_mul(1 << attempt.min(6))).min(Duration::from_secs(30))
}

async fn run(config: PublisherConfig, mut rx: mpsc::Receiver<pb::ObjectStatus>, overflow: Arc<AtomicBool>) {
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
        let response = client.publish(ReceiverStream::new(out_rx)).await;
        let mut acks = match response {
            Ok(response) => response.into_inner(),
            Err(status) => {
                debug!(error = %status, "status channel refused the stream; retrying");
                tokio::time::sleep(backoff(attempt)).await;
                attempt = attempt.saturating_add(1);
                continue;
            }
        };
        attempt = 0;
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
        tokio::time::sleep(backoff(0)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        });
        let started = std::time::Instant::now();
        for _ in 0..100 {
            publisher.publish(pb::ObjectStatus::default());
        }
        assert!(started.elapsed() < Duration::from_millis(100), "publish must not block");
        assert_eq!(publisher.published() + publisher.dropped(), 100);
        assert!(publisher.dropped() >= 96, "{}", publisher.dropped());
    }
}
