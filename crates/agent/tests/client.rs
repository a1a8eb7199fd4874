//! The agent's HTTP client against the control-plane simulator (in process, on loopback):
//! every failure mode becomes a clear, credential-free error with a stable reason.

mod common;

use std::time::Duration;

use agent::client::{CallError, ClientConfig, ControlPlaneClient};
use controller_kit::Redacted;
use odoo_sim::{Fault, Sim};
use protocol::{METHOD_REGISTER, METHOD_SYNC, error::ErrorClass};
use serde_json::{Value, json};

const KEY: &str = "s3cr3t-api-key-0123456789abcdef0123456789";

async fn serve(sim: Sim) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, odoo_sim::router(sim)).await.unwrap() });
    format!("http://{addr}")
}

fn sim() -> Sim {
    let sim = Sim::new(odoo_sim::SimConfig {
        database: Some("prod".into()),
        ..common::sim_config()
    })
    .unwrap();
    sim.add_cluster("edge-1", KEY).unwrap();
    sim
}

fn client(url: &str, max: usize) -> ControlPlaneClient {
    ControlPlaneClient::new(&ClientConfig {
        url: url.into(),
        database: Some("prod".into()),
        timeout: Duration::from_millis(800),
        max_response_bytes: max,
        ca_bundle: None,
        insecure_allow_http: true,
    })
    .unwrap()
}

fn register() -> Value {
    json!({"protocol_version": "1.0", "cluster": {"uid": "uid-1", "name": "edge-1"},
        "agent": {"version": "0.1.0", "instance": "agent-0", "mode": "pull", "started_at": "2026-11-21T10:00:00Z"},
        "allowed_namespaces": ["*"]})
}

fn assert_no_key(err: &CallError) {
    for text in [err.to_string(), format!("{err:?}")] {
        assert!(!text.contains(KEY), "the key leaked into {text}");
    }
}

#[tokio::test]
async fn success_and_every_failure_mode() {
    let sim = sim();
    let url = serve(sim.clone()).await;
    let c = client(&url, 64 * 1024);
    let key = Redacted::new(KEY.to_owned());

    let ok = c.call(&key, METHOD_REGISTER, &register()).await.unwrap();
    assert_eq!(ok["cluster_id"], 1);
    let ok = c
        .call(
            &key,
            METHOD_SYNC,
            &json!({"protocol_version": "1.0", "cluster_uid": "uid-1", "agent_instance": "a"}),
        )
        .await
        .unwrap();
    assert_eq!(ok["protocol_version"], protocol::PROTOCOL_VERSION.to_string());

    let bad = Redacted::new("wrong-key".to_owned());
    let err = c.call(&bad, METHOD_SYNC, &json!({})).await.unwrap_err();
    assert_eq!(err.reason(), "Unauthorized");
    assert_eq!(err.class(), Some(ErrorClass::Unauthorized));
    assert!(err.needs_attention());
    assert!(
        err.to_string().contains("HTTP 401") && err.to_string().contains("Invalid apikey"),
        "{err}"
    );

    let err = c
        .call(
            &key,
            METHOD_SYNC,
            &json!({"protocol_version": "1.0", "cluster_uid": "other", "agent_instance": "a"}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "ClusterMismatch");
    assert_no_key(&err);

    sim.set_fault(Fault::Unavailable);
    let err = c.call(&key, METHOD_SYNC, &json!({})).await.unwrap_err();
    assert_eq!(err.reason(), "Unavailable");
    assert!(err.to_string().contains("non-JSON body"), "{err}");
    assert!(!err.needs_attention());

    sim.set_fault(Fault::ServerError);
    assert_eq!(
        c.call(&key, METHOD_SYNC, &json!({})).await.unwrap_err().reason(),
        "ServerError"
    );

    sim.set_fault(Fault::Malformed);
    let err = c.call(&key, METHOD_SYNC, &json!({})).await.unwrap_err();
    assert_eq!(err.reason(), "MalformedResponse");

    sim.set_fault(Fault::Oversize { bytes: 200 * 1024 });
    let err = c.call(&key, METHOD_SYNC, &json!({})).await.unwrap_err();
    assert_eq!(err.reason(), "ResponseTooLarge");
    assert!(err.to_string().contains("65536 bytes"), "{err}");

    sim.set_fault(Fault::Hang { seconds: 5 });
    let started = std::time::Instant::now();
    let err = c.call(&key, METHOD_SYNC, &json!({})).await.unwrap_err();
    assert_eq!(err.reason(), "Timeout");
    assert!(started.elapsed() < Duration::from_secs(3));

    sim.set_fault(Fault::None);
    let err = client("http://127.0.0.1:9", 1024)
        .call(&key, METHOD_SYNC, &json!({}))
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "ConnectionFailed");
    assert_no_key(&err);
}

#[tokio::test]
async fn another_major_version_is_refused() {
    let app = axum::Router::new().route(
        "/json/2/vworkspace.cluster/agent_sync",
        axum::routing::post(|| async {
            axum::Json(json!({"protocol_version": "2.0", "server_time": "2026-11-21T10:00:00Z"}))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let err = client(&format!("http://{addr}"), 4096)
        .call(&Redacted::new(KEY.to_owned()), METHOD_SYNC, &json!({}))
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "IncompatibleProtocol");
    assert!(err.needs_attention());
}

/// The client with another `X-Odoo-Database`.
fn client_of_database(url: &str, database: &str) -> ControlPlaneClient {
    ControlPlaneClient::new(&ClientConfig {
        url: url.into(),
        database: Some(database.into()),
        timeout: Duration::from_millis(800),
        max_response_bytes: 64 * 1024,
        ca_bundle: None,
        insecure_allow_http: true,
    })
    .unwrap()
}

#[tokio::test]
async fn the_simulator_fails_as_real_odoo_does_and_each_failure_has_its_reason() {
    let sim = sim();
    let url = serve(sim.clone()).await;
    let c = client(&url, 64 * 1024);
    let key = Redacted::new(KEY.to_owned());
    c.call(&key, METHOD_REGISTER, &register()).await.unwrap();
    let sync = json!({"protocol_version": "1.0", "cluster_uid": "uid-1", "agent_instance": "a"});

    // A database this Odoo does not serve: Odoo's HTML 404.
    let err = client_of_database(&url, "other")
        .call(&key, METHOD_SYNC, &sync)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "DatabaseNotSelected", "{err}");
    assert!(err.needs_attention());

    // A module without **kwargs and a keyword it does not name.
    sim.set_fault(Fault::NoKwargs);
    let mut newer = sync.clone();
    newer["newer_field"] = json!(true);
    let err = c.call(&key, METHOD_SYNC, &newer).await.unwrap_err();
    assert_eq!(err.reason(), "UnexpectedParameter", "{err}");
    assert!(err.to_string().contains("newer_field"), "{err}");

    // Two concurrent inserts of one key: transient, nobody needs to act.
    sim.set_fault(Fault::ConcurrentInsert);
    let err = c.call(&key, METHOD_SYNC, &sync).await.unwrap_err();
    assert_eq!(err.reason(), "ConcurrentUpdate", "{err}");
    assert!(!err.needs_attention());

    // A front proxy's body limit.
    sim.set_fault(Fault::BodyLimit { bytes: 16 });
    let err = c.call(&key, METHOD_SYNC, &sync).await.unwrap_err();
    assert_eq!(err.reason(), "RequestTooLarge", "{err}");

    // Committed, then answered after the client's timeout: the call took effect.
    let syncs = sim.view("edge-1").unwrap()["syncs"].as_u64().unwrap();
    sim.set_fault(Fault::CommittedThenLate { seconds: 2 });
    let err = c.call(&key, METHOD_SYNC, &sync).await.unwrap_err();
    assert_eq!(err.reason(), "Timeout", "{err}");
    assert_eq!(sim.view("edge-1").unwrap()["syncs"].as_u64(), Some(syncs + 1));
    assert_no_key(&err);
}
