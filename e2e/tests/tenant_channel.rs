//! The agent's gRPC status channel, attacked: a client without a token, with a token of a
//! ServiceAccount that is not a publisher, or with a publisher's ordinary API token (the
//! wrong audience) is refused before a single event is read; an oversized message ends
//! its stream; and a legitimate publisher flooding relist requests is throttled while the
//! agent keeps serving Odoo. The normal path (the controllers publishing with their
//! projected tokens) is proven by `tests/agent.rs`.
//!
//! The agent runs as its ServiceAccount with the deploy bundle's RBAC, so its TokenReviews
//! are authorised exactly as in the bundle.

use std::time::Duration;

use e2e::{
    TestContext,
    agent::{SimProcess, object_ack, service_account_token, start_agent, wait_sim},
    apps::app,
    deploy::{http_get, metric_sum},
};
use serde_json::json;
use status_channel::{
    auth::MAX_MESSAGE_BYTES,
    pb::{ObjectStatus, Resync, StatusEvent, status_channel_client::StatusChannelClient, status_event::Payload},
};
use tonic::{Code, Request, transport::Endpoint};

/// Opens a stream to the channel at `endpoint` with the token in `token_file` (if any),
/// sends `events` and returns the first answer (an ack, the end, or the refusal).
async fn publish(
    endpoint: &str,
    token_file: Option<&std::path::Path>,
    events: Vec<StatusEvent>,
) -> Result<(), tonic::Status> {
    // The agent serves the channel once it knows its cluster, a moment after /livez answers.
    let endpoint = Endpoint::from_shared(endpoint.to_owned()).map_err(|e| tonic::Status::internal(e.to_string()))?;
    let mut attempts = 0;
    let channel = loop {
        match endpoint.connect().await {
            Ok(channel) => break channel,
            Err(e) if attempts >= 50 => return Err(tonic::Status::unavailable(e.to_string())),
            Err(_) => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let mut request = Request::new(tokio_stream_iter(events));
    if let Some(path) = token_file {
        let token = std::fs::read_to_string(path).map_err(|e| tonic::Status::internal(e.to_string()))?;
        let value = format!("Bearer {}", token.trim())
            .parse()
            .map_err(|_| tonic::Status::internal("token is not ASCII"))?;
        request.metadata_mut().insert("authorization", value);
    }
    let mut acks = StatusChannelClient::new(channel).publish(request).await?.into_inner();
    // Drain: the server answers the end of a stream with its end, or with its refusal.
    while acks.message().await?.is_some() {}
    Ok(())
}

fn tokio_stream_iter(events: Vec<StatusEvent>) -> impl futures::Stream<Item = StatusEvent> + Send + 'static {
    futures::stream::iter(events)
}

fn resync(sequence: u64) -> StatusEvent {
    StatusEvent {
        sequence,
        publisher: "vworkspace-app-controller".into(),
        publisher_instance: "attacker".into(),
        payload: Some(Payload::Resync(Resync {
            reason: "connected".into(),
        })),
    }
}

async fn metric(agent_admin: &str, name: &str, labels: &[&str]) -> anyhow::Result<f64> {
    Ok(metric_sum(&http_get(agent_admin, "/metrics").await?, name, labels))
}

#[tokio::test]
async fn the_status_channel_refuses_strangers_oversized_messages_and_relist_floods() -> anyhow::Result<()> {
    let ctx = TestContext::new("tenant-channel").await?;
    let sim = SimProcess::start(&ctx).await?;
    let agent = start_agent(&ctx, &sim, &sim.key_file, "", &[]).await?;
    let endpoint = agent.status_channel.as_str();
    let refused = |reason: &'static str| format!("reason=\"{reason}\"");

    // No token at all.
    let err = publish(endpoint, None, vec![resync(1)]).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    // A valid token of a ServiceAccount that is not a publisher (the agent's own).
    let stranger = service_account_token("agent", None).await?;
    let err = publish(endpoint, Some(&stranger), vec![resync(1)]).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    // A publisher's token for the API server's audience (what a stolen ordinary pod token
    // would be), not the channel's.
    let api_audience =
        service_account_token("app-controller", Some("https://kubernetes.default.svc.cluster.local")).await?;
    let err = publish(endpoint, Some(&api_audience), vec![resync(1)])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    // A forged token.
    let forged = e2e::agent::work_dir(&ctx)?.join("forged.token");
    std::fs::write(&forged, "eyJhbGciOiJSUzI1NiJ9.e30.c2lnbmF0dXJl")?;
    let err = publish(endpoint, Some(&forged), vec![resync(1)]).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    let admin = agent.admin_addr.as_str();
    let name = "vworkspace_agent_status_channel_refused_total";
    assert!(metric(admin, name, &[&refused("missing_token")]).await? >= 1.0);
    assert!(metric(admin, name, &[&refused("not_allowed")]).await? >= 1.0);
    assert!(metric(admin, name, &[&refused("unauthenticated")]).await? >= 2.0);
    // None of them reached the consumer.
    assert_eq!(
        metric(admin, "vworkspace_agent_status_channel_events_total", &[]).await?,
        0.0,
        "refused streams deliver nothing"
    );

    // A legitimate publisher's token, an oversized message: its stream ends, refused.
    let publisher = service_account_token("app-controller", None).await?;
    let huge = StatusEvent {
        sequence: 1,
        payload: Some(Payload::Object(ObjectStatus {
            uid: "x".repeat(MAX_MESSAGE_BYTES + 1),
            ..ObjectStatus::default()
        })),
        ..resync(1)
    };
    let err = publish(endpoint, Some(&publisher), vec![huge]).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err}");
    assert_eq!(
        metric(admin, "vworkspace_agent_status_channel_events_total", &[]).await?,
        0.0
    );

    // A flood of relist requests: counted, but only the burst relists; the rest wait for
    // one deferred relist.
    let flood: Vec<StatusEvent> = (1..=200).map(resync).collect();
    publish(endpoint, Some(&publisher), flood).await?;
    e2e::eventually(&ctx, "the flood is counted", Duration::from_secs(20), || async {
        let received = metric(
            admin,
            "vworkspace_agent_status_channel_events_total",
            &["kind=\"resync\""],
        )
        .await?;
        Ok(if received >= 200.0 {
            Ok(())
        } else {
            Err(format!("{received} resync events so far"))
        })
    })
    .await?;
    let throttled = metric(admin, "vworkspace_agent_status_channel_resyncs_throttled_total", &[]).await?;
    assert!(
        throttled >= 195.0,
        "at most the burst relists at once: {throttled} throttled"
    );

    // The agent still serves Odoo meanwhile: the next revision is acknowledged (its
    // outcome depends on the chart rules of the app, not on the channel).
    let ns = ctx.namespace.as_str();
    let spec = serde_json::to_value(app("x", "demo-app", "0.1.0", json!({})).spec)?;
    let rev = sim.set_app(ns, "after-flood", spec).await?;
    wait_sim(
        &ctx,
        &sim,
        "the revision after the flood acknowledged",
        Duration::from_secs(60),
        |v| object_ack(v, rev, ns, "after-flood").map(|_| ()),
    )
    .await?;

    // The tokens, valid or not, never reach the agent's log (debug level).
    let logs = agent.process.logs();
    for path in [&publisher, &stranger, &api_audience, &forged] {
        let token = std::fs::read_to_string(path)?;
        assert!(!logs.contains(token.trim()), "a token in the agent's log");
    }
    Ok(())
}
