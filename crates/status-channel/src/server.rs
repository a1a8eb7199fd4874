//! The agent's side: accepts publisher streams and hands their events to one consumer.

use std::{net::SocketAddr, pin::Pin};

use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::{StreamExt as _, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info};

use crate::{
    Error,
    pb::{
        self, Ack, StatusEvent,
        status_channel_server::{StatusChannel, StatusChannelServer},
        status_event::Payload,
    },
};

/// What the consumer (the agent) receives.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    /// The current status of one object.
    Status {
        /// Who published it.
        publisher: String,
        /// The state (boxed: it is much larger than a resync marker).
        status: Box<pb::ObjectStatus>,
    },
    /// The publisher may have lost events: re-list.
    Resync {
        /// Who asked.
        publisher: String,
        /// Why (`connected`, `publisher buffer overflow`).
        reason: String,
    },
}

struct Service {
    sink: mpsc::Sender<Received>,
}

type AckStream = Pin<Box<dyn Stream<Item = Result<Ack, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl StatusChannel for Service {
    type PublishStream = AckStream;

    async fn publish(&self, request: Request<Streaming<StatusEvent>>) -> Result<Response<AckStream>, Status> {
        let mut events = request.into_inner();
        let sink = self.sink.clone();
        let (ack_tx, ack_rx) = mpsc::channel(16);
        tokio::spawn(async move {
            while let Some(Ok(event)) = events.next().await {
                let received = match event.payload {
                    Some(Payload::Object(status)) => Received::Status {
                        publisher: event.publisher,
                        status: Box::new(status),
                    },
                    Some(Payload::Resync(resync)) => {
                        info!(publisher = %event.publisher, reason = %resync.reason, "publisher asks for a resync");
                        Received::Resync {
                            publisher: event.publisher,
                            reason: resync.reason,
                        }
                    }
                    None => continue,
                };
                // Back-pressure reaches the publisher's bounded buffer, never its reconciler.
                if sink.send(received).await.is_err() {
                    return;
                }
                // Acknowledge only when nothing else is queued, so a burst costs one ack.
                if ack_tx.capacity() > 0 {
                    let _ = ack_tx.try_send(Ok(Ack {
                        sequence: event.sequence,
                    }));
                }
            }
            debug!("publisher stream ended");
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(ack_rx))))
    }
}

/// The tonic service, to mount in an existing server.
pub fn service(sink: mpsc::Sender<Received>) -> StatusChannelServer<impl StatusChannel> {
    StatusChannelServer::new(Service { sink })
}

/// Serves the status channel on `addr` until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    sink: mpsc::Sender<Received>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    info!(%addr, "status channel listening");
    tonic::transport::Server::builder()
        .add_service(service(sink))
        .serve_with_shutdown(addr, shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Publisher, PublisherConfig};

    #[tokio::test]
    async fn events_travel_from_publisher_to_consumer_after_a_resync() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let (tx, mut rx) = mpsc::channel(16);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(addr, tx, async {
            let _ = stop_rx.await;
        }));

        let publisher = Publisher::spawn(PublisherConfig {
            endpoint: format!("http://{addr}"),
            publisher: "app-controller".into(),
            instance: "p-0".into(),
            capacity: 16,
        });
        let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(first, Received::Resync { ref reason, .. } if reason == "connected"),
            "{first:?}"
        );
        let status = pb::ObjectStatus {
            uid: "u-1".into(),
            phase: "Running".into(),
            ..Default::default()
        };
        publisher.publish(status.clone());
        let second = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            second,
            Received::Status {
                publisher: "app-controller".into(),
                status: Box::new(status)
            }
        );
        let _ = stop_tx.send(());
        server.abort();
    }
}
