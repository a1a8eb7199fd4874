//! The agent's side: accepts publisher streams and hands their events to one consumer.

use std::{net::SocketAddr, pin::Pin, sync::Arc};

use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::{StreamExt as _, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info};

use crate::{
    Error,
    auth::{Authenticator, MAX_MESSAGE_BYTES, Refused, bearer},
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
    auth: Arc<dyn Authenticator>,
}

/// The gRPC answer to a refused publisher. Missing or invalid tokens are
/// `UNAUTHENTICATED`, a valid token of another identity `PERMISSION_DENIED`.
fn refusal(refused: &Refused) -> Status {
    match refused {
        Refused::MissingToken | Refused::Unauthenticated(_) => Status::unauthenticated(refused.to_string()),
        Refused::NotAllowed(_) => Status::permission_denied(refused.to_string()),
        Refused::Unavailable(_) => Status::unavailable(refused.to_string()),
    }
}

type AckStream = Pin<Box<dyn Stream<Item = Result<Ack, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl StatusChannel for Service {
    type PublishStream = AckStream;

    async fn publish(&self, request: Request<Streaming<StatusEvent>>) -> Result<Response<AckStream>, Status> {
        // Authenticated before a single event is read; refusals are logged at debug only,
        // so a flood of refused clients cannot flood the log (the agent counts them).
        let checked = match bearer(request.metadata()) {
            Some(token) => self.auth.authenticate(token).await,
            None => Err(Refused::MissingToken),
        };
        let publisher = checked.map_err(|refused| {
            self.auth.refused(&refused);
            debug!(peer = ?request.remote_addr(), reason = %refused, "status channel publisher refused");
            refusal(&refused)
        })?;
        let mut events = request.into_inner();
        let sink = self.sink.clone();
        let (ack_tx, ack_rx) = mpsc::channel(16);
        tokio::spawn(async move {
            loop {
                let event = match events.next().await {
                    Some(Ok(event)) => event,
                    // An oversized or malformed message ends the stream; the publisher
                    // learns why from the error.
                    Some(Err(status)) => {
                        debug!(%publisher, error = %status.message(), "status channel stream refused");
                        let _ = ack_tx.send(Err(status)).await;
                        return;
                    }
                    None => break,
                };
                // The authenticated identity names the publisher, not the name it gives itself.
                let received = match event.payload {
                    Some(Payload::Object(status)) => Received::Status {
                        publisher: publisher.clone(),
                        status: Box::new(status),
                    },
                    Some(Payload::Resync(resync)) => {
                        debug!(%publisher, reason = %resync.reason, "publisher asks for a resync");
                        Received::Resync {
                            publisher: publisher.clone(),
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

/// The tonic service, to mount in an existing server: every stream is authenticated by
/// `auth`, and messages above [`MAX_MESSAGE_BYTES`] end their stream.
pub fn service(sink: mpsc::Sender<Received>, auth: Arc<dyn Authenticator>) -> StatusChannelServer<impl StatusChannel> {
    StatusChannelServer::new(Service { sink, auth }).max_decoding_message_size(MAX_MESSAGE_BYTES)
}

/// Streams one connection may open: a publisher needs one.
const STREAMS_PER_CONNECTION: u32 = 4;

/// Serves the status channel on `addr` until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    sink: mpsc::Sender<Received>,
    auth: Arc<dyn Authenticator>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    info!(%addr, "status channel listening");
    tonic::transport::Server::builder()
        .max_concurrent_streams(STREAMS_PER_CONNECTION)
        .add_service(service(sink, auth))
        .serve_with_shutdown(addr, shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::future::BoxFuture;
    use tonic::transport::Endpoint;

    use super::*;
    use crate::{Publisher, PublisherConfig, pb::status_channel_client::StatusChannelClient};

    /// Accepts `good` as the identity `app-controller`, knows `other` as a valid token of
    /// an identity that may not publish, refuses anything else.
    struct TestTokens;

    impl Authenticator for TestTokens {
        fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<String, Refused>> {
            Box::pin(async move {
                match token {
                    "good" => Ok("app-controller".to_owned()),
                    "other" => Err(Refused::NotAllowed("default".into())),
                    _ => Err(Refused::Unauthenticated("unknown token".into())),
                }
            })
        }
    }

    async fn start() -> (SocketAddr, mpsc::Receiver<Received>, tokio::sync::oneshot::Sender<()>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let (tx, rx) = mpsc::channel(16);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(addr, tx, Arc::new(TestTokens), async {
            let _ = stop_rx.await;
        }));
        (addr, rx, stop_tx)
    }

    fn token_file(dir: &std::path::Path, token: &str) -> std::path::PathBuf {
        let path = dir.join(format!("token-{token}"));
        std::fs::write(&path, format!("{token}\n")).unwrap();
        path
    }

    /// Opens a raw stream with `token`, sends `events`, returns the first answer.
    async fn raw(addr: SocketAddr, token: Option<&str>, events: Vec<StatusEvent>) -> Result<Option<Ack>, Status> {
        let channel = loop {
            match Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let mut request = Request::new(tokio_stream::iter(events));
        if let Some(t) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        let mut acks = StatusChannelClient::new(channel).publish(request).await?.into_inner();
        acks.message().await
    }

    fn resync_event(sequence: u64) -> StatusEvent {
        StatusEvent {
            sequence,
            publisher: "forged-name".into(),
            payload: Some(Payload::Resync(pb::Resync { reason: "r".into() })),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn events_travel_from_publisher_to_consumer_after_a_resync() {
        let (addr, mut rx, stop) = start().await;
        let dir = std::env::temp_dir().join(format!("status-channel-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let publisher = Publisher::spawn(PublisherConfig {
            endpoint: format!("http://{addr}"),
            publisher: "app-controller".into(),
            instance: "p-0".into(),
            capacity: 16,
            token_file: Some(token_file(&dir, "good")),
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
        let _ = stop.send(());
    }

    #[tokio::test]
    async fn refused_streams_deliver_nothing() {
        let (addr, mut rx, stop) = start().await;
        // (token, expected code)
        let cases = [
            (None, tonic::Code::Unauthenticated),
            (Some("forged"), tonic::Code::Unauthenticated),
            (Some("other"), tonic::Code::PermissionDenied),
        ];
        for (token, code) in cases {
            let err = raw(addr, token, vec![resync_event(1)]).await.unwrap_err();
            assert_eq!(err.code(), code, "{token:?}: {err}");
        }
        let huge = StatusEvent {
            sequence: 1,
            payload: Some(Payload::Object(pb::ObjectStatus {
                uid: "x".repeat(MAX_MESSAGE_BYTES + 1),
                ..Default::default()
            })),
            ..Default::default()
        };
        let err = raw(addr, Some("good"), vec![huge]).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::OutOfRange, "{err}");
        assert!(rx.try_recv().is_err(), "nothing reached the consumer");
        // The identity names the publisher, not the name it gave itself.
        raw(addr, Some("good"), vec![resync_event(1)]).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(got, Received::Resync { ref publisher, .. } if publisher == "app-controller"),
            "{got:?}"
        );
        let _ = stop.send(());
    }
}
