//! The simulator speaks the protocol as documented: JSON-2 conventions, error objects,
//! revisions, acknowledgements and resyncs.

use axum::{body::Body, http::Request};
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

use super::*;

const KEY: &str = "0123456789abcdef0123456789abcdef01234567";

fn sim() -> Sim {
    let sim = Sim::new(SimConfig {
        state_file: None,
        database: Some("prod".into()),
        sync_interval_seconds: None,
        offline_after: Duration::from_secs(90),
    })
    .unwrap();
    sim.add_cluster("edge-1", KEY).unwrap();
    sim
}

async fn call(sim: &Sim, method: &str, path: &str, key: Option<&str>, body: Value) -> (u16, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("authorization", format!("bearer {k}"));
    }
    let body = if body.is_null() {
        Body::empty()
    } else {
        Body::from(body.to_string())
    };
    let resp = router(sim.clone()).oneshot(req.body(body).unwrap()).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn register_params(uid: &str) -> Value {
    json!({"protocol_version": "1.0", "cluster": {"uid": uid, "name": "edge-1"},
        "agent": {"version": "0.1.0", "instance": "agent-0", "mode": "pull", "started_at": "2026-11-21T10:00:00Z"},
        "allowed_namespaces": ["team-a"]})
}

fn sync_params(known: Value) -> Value {
    json!({"protocol_version": "1.0", "cluster_uid": "uid-1", "agent_instance": "agent-0", "known": known})
}

#[tokio::test]
async fn json2_errors_look_like_odoo() {
    let sim = sim();
    let (s, body) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_register",
        None,
        register_params("uid-1"),
    )
    .await;
    assert_eq!(s, 401);
    assert_eq!(body["name"], "werkzeug.exceptions.Unauthorized");
    assert_eq!(body["message"], "Invalid apikey");
    assert_eq!(body["arguments"], json!(["Invalid apikey", 401]));
    assert!(body["context"].is_object() && body["debug"].is_string());

    let (s, body) = call(&sim, "POST", "/json/2/res.partner/search", Some(KEY), json!({})).await;
    assert_eq!((s, body["name"].as_str()), (404, Some("werkzeug.exceptions.NotFound")));
    let (s, _) = call(&sim, "POST", "/json/2/vworkspace.cluster/unlink", Some(KEY), json!({})).await;
    assert_eq!(s, 404);
    let (s, body) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_sync",
        Some(KEY),
        json!([1]),
    )
    .await;
    assert_eq!(
        (s, body["name"].as_str()),
        (400, Some("werkzeug.exceptions.BadRequest"))
    );
    let (s, body) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_sync",
        Some(KEY),
        sync_params(Value::Null),
    )
    .await;
    assert_eq!(
        (s, body["name"].as_str()),
        (404, Some("odoo.addons.vworkspace.exceptions.ClusterNotRegistered"))
    );
    let mut v2 = register_params("uid-1");
    v2["protocol_version"] = json!("2.0");
    let (s, body) = call(&sim, "POST", "/json/2/vworkspace.cluster/agent_register", Some(KEY), v2).await;
    assert_eq!(
        (s, body["name"].as_str()),
        (422, Some("odoo.addons.vworkspace.exceptions.ProtocolVersionMismatch"))
    );
    let (s, body) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_register",
        Some(KEY),
        json!({"x": 1}),
    )
    .await;
    assert_eq!(
        (s, body["name"].as_str()),
        (422, Some("werkzeug.exceptions.UnprocessableEntity"))
    );
}

#[tokio::test]
async fn register_binds_the_uid_and_sync_serves_revisions() {
    let sim = sim();
    let (s, body) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_register",
        Some(KEY),
        register_params("uid-1"),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let result: RegisterResult = serde_json::from_value(body).unwrap();
    assert_eq!(result.cluster_id, 1);
    let (s, body) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_register",
        Some(KEY),
        register_params("uid-2"),
    )
    .await;
    assert_eq!(
        (s, body["name"].as_str()),
        (403, Some("odoo.addons.vworkspace.exceptions.ClusterMismatch"))
    );

    // No intent yet: no document.
    let (s, body) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_sync",
        Some(KEY),
        sync_params(Value::Null),
    )
    .await;
    assert_eq!(s, 200);
    assert!(body.get("desired").is_none(), "{body}");

    let spec = json!({"chart": {"name": "wiki", "repository": {"url": "https://charts.example.com"}}});
    let (s, body) = call(&sim, "PUT", "/sim/clusters/edge-1/applications/team-a/wiki", None, spec).await;
    assert_eq!((s, body["revision"].as_u64()), (200, Some(1)));
    let (_, body) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_sync",
        Some(KEY),
        sync_params(Value::Null),
    )
    .await;
    let doc: DesiredState = serde_json::from_value(body["desired"].clone()).unwrap();
    assert_eq!((doc.revision, doc.applications.len()), (1, 1));
    let epoch = doc.epoch.clone();

    let view = sim.view("edge-1").unwrap();
    assert_eq!(view["objects"][0]["status"], "not_acknowledged");
    assert_eq!(view["intent_acknowledged"], false);

    // Acknowledged and reported: up to date, no document.
    let mut params = sync_params(json!({"epoch": epoch, "revision": 1}));
    params["acks"] = json!([{"epoch": epoch, "revision": 1, "outcome": "applied", "processed_at": "2026-11-21T10:00:00Z",
        "objects": [{"kind": "ApplicationInstance", "namespace": "team-a", "name": "wiki", "outcome": "applied", "generation": 1}]}]);
    params["reports"] = json!([{"kind": "ApplicationInstance", "namespace": "team-a", "name": "wiki", "uid": "u1",
        "state": "ready", "generation": 1, "observed_generation": 1, "observed_at": "2026-11-21T10:00:01Z"}]);
    params["resync"] = json!({"id": "r1", "batch": 0, "last_batch": true});
    let (_, body) = call(&sim, "POST", "/json/2/vworkspace.cluster/agent_sync", Some(KEY), params).await;
    assert!(body.get("desired").is_none());
    let view = sim.view("edge-1").unwrap();
    assert_eq!(view["intent_acknowledged"], true);
    assert_eq!(view["objects"][0]["status"], "ready", "{view}");
    assert_eq!(view["resync"]["completed"], 1);

    // Deleting in the control plane makes an explicit deletion intent with the reported uid.
    let (_, body) = call(
        &sim,
        "DELETE",
        "/sim/clusters/edge-1/applications/team-a/wiki",
        None,
        Value::Null,
    )
    .await;
    assert_eq!(body["revision"], 2);
    let (_, body) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_sync",
        Some(KEY),
        sync_params(json!({"epoch": epoch, "revision": 1})),
    )
    .await;
    let doc: DesiredState = serde_json::from_value(body["desired"].clone()).unwrap();
    assert!(doc.applications.is_empty());
    assert_eq!(doc.deletions[0].uid.as_deref(), Some("u1"));

    // A resync that does not mention wiki marks its report deleted.
    let mut params = sync_params(json!({"epoch": epoch, "revision": 2}));
    params["resync"] = json!({"id": "r2", "batch": 0, "last_batch": true});
    call(&sim, "POST", "/json/2/vworkspace.cluster/agent_sync", Some(KEY), params).await;
    let view = sim.view("edge-1").unwrap();
    assert_eq!(
        view["reports"]["ApplicationInstance/team-a/wiki"]["report"]["state"],
        "deleted"
    );
    assert_eq!(
        view["reports"]["ApplicationInstance/team-a/wiki"]["absent_after_resync"],
        true
    );
}

#[tokio::test]
async fn faults_and_raw_documents() {
    let sim = sim();
    call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_register",
        Some(KEY),
        register_params("uid-1"),
    )
    .await;
    call(
        &sim,
        "PUT",
        "/sim/clusters/edge-1/document",
        None,
        json!({"applications": "not a list"}),
    )
    .await;
    let (_, body) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_sync",
        Some(KEY),
        sync_params(Value::Null),
    )
    .await;
    assert_eq!(body["desired"]["applications"], "not a list");
    assert_eq!(body["desired"]["revision"], 1, "cursor filled in");

    sim.set_fault(Fault::Unavailable);
    let (s, _) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_sync",
        Some(KEY),
        sync_params(Value::Null),
    )
    .await;
    assert_eq!(s, 503);
    sim.set_fault(Fault::ServerError);
    let (s, body) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_sync",
        Some(KEY),
        sync_params(Value::Null),
    )
    .await;
    assert_eq!((s, body["message"].as_str()), (500, Some("internal server error")));
}

#[tokio::test]
async fn state_survives_a_restart_through_the_state_file() {
    let path = std::env::temp_dir().join(format!("odoo-sim-test-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let config = SimConfig {
        state_file: Some(path.clone()),
        database: None,
        sync_interval_seconds: None,
        offline_after: Duration::from_secs(90),
    };
    let sim = Sim::new(config.clone()).unwrap();
    sim.add_cluster("edge-1", KEY).unwrap();
    call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_register",
        Some(KEY),
        register_params("uid-1"),
    )
    .await;
    let again = Sim::new(config).unwrap();
    let (s, _) = call(
        &again,
        "POST",
        "/json/2/vworkspace.cluster/agent_sync",
        Some(KEY),
        sync_params(Value::Null),
    )
    .await;
    assert_eq!(s, 200, "the key and the registration were kept");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !again.view("edge-1").unwrap().to_string().contains(KEY),
        "the admin view never shows keys"
    );
    assert!(text.contains("uid-1"));
    let _ = std::fs::remove_file(&path);
}
