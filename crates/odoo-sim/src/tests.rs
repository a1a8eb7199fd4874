//! The simulator speaks the protocol as documented: JSON-2 conventions, error objects,
//! revisions, acknowledgements and resyncs.

use axum::{body::Body, http::Request};
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

use protocol::{
    PROTOCOL_VERSION,
    messages::{DesiredState, ObjectState, RegisterResult, SyncResult},
};
use serde_json::{Value, json};

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

/// A configuration saving to a fresh state file (removed first) named after `tag`.
fn with_state_file(tag: &str) -> (PathBuf, SimConfig) {
    let path = std::env::temp_dir().join(format!("odoo-sim-test-{tag}-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let config = SimConfig {
        state_file: Some(path.clone()),
        database: None,
        sync_interval_seconds: None,
        offline_after: Duration::from_secs(90),
    };
    (path, config)
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
    // server_time as an ordinary Odoo module answers it; the agent reads it as UTC.
    let time = body["server_time"].as_str().unwrap().to_owned();
    assert!(
        time.len() == 19 && time.as_bytes()[10] == b' ' && !time.contains('T'),
        "{time}"
    );
    let result: RegisterResult = protocol::odoo_compat::decode(&body).unwrap();
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
    assert_eq!(
        body["desired"]["generated_at"].as_str().map(str::len),
        Some(19),
        "{body}"
    );
    let doc: DesiredState = protocol::odoo_compat::decode(&body["desired"]).unwrap();
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
    let doc: DesiredState = protocol::odoo_compat::decode(&body["desired"]).unwrap();
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
    let (path, config) = with_state_file("restart");
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
    // What a graceful stop does before the process exits.
    sim.shutdown().await.unwrap();
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

#[tokio::test]
async fn many_clusters_are_created_at_once_or_not_at_all() {
    let sim = sim();
    let many: Vec<Value> = (0..3)
        .map(|i| json!({"name": format!("fleet-{i}"), "api_key": format!("{KEY}-{i}")}))
        .collect();
    let (s, body) = call(&sim, "POST", "/sim/clusters", None, json!(many)).await;
    assert_eq!((s, body["created"].as_u64()), (201, Some(3)), "{body}");
    let (_, list) = call(&sim, "GET", "/sim/clusters", None, Value::Null).await;
    assert_eq!(list.as_array().map(Vec::len), Some(4));
    // Each key authenticates its own record.
    let (s, body) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_register",
        Some(&format!("{KEY}-2")),
        register_params("uid-f2"),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(sim.view("fleet-2").unwrap()["uid"], "uid-f2");

    // A repeated key (or a taken name) refuses the whole batch.
    let clash =
        json!([{"name": "fleet-a", "api_key": "k-a-0123456789"}, {"name": "fleet-b", "api_key": "k-a-0123456789"}]);
    let (s, _) = call(&sim, "POST", "/sim/clusters", None, clash).await;
    assert_eq!(s, 409);
    let taken =
        json!([{"name": "fleet-c", "api_key": "k-c-0123456789"}, {"name": "fleet-0", "api_key": "k-d-0123456789"}]);
    let (s, _) = call(&sim, "POST", "/sim/clusters", None, taken).await;
    assert_eq!(s, 409);
    assert!(
        sim.view("fleet-a").is_err() && sim.view("fleet-c").is_err(),
        "nothing of a refused batch is created"
    );
    // The single form still works.
    let (s, body) = call(
        &sim,
        "POST",
        "/sim/clusters",
        None,
        json!({"name": "solo", "api_key": "k-solo-0123456789"}),
    )
    .await;
    assert_eq!((s, body["name"].as_str()), (201, Some("solo")));
}

fn op_report(name: &str, state: &str, rv: &str) -> Value {
    json!({"kind": "Operation", "namespace": "team-a", "name": name, "uid": format!("u-{name}"),
        "state": state, "resource_version": rv, "phase": "Running", "observed_at": "2026-11-21T10:00:01Z"})
}

#[tokio::test]
async fn every_report_is_logged_in_order_with_its_receive_time() {
    let sim = sim();
    call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_register",
        Some(KEY),
        register_params("uid-1"),
    )
    .await;
    let before = Timestamp::now();
    let mut params = sync_params(Value::Null);
    params["reports"] = json!([op_report("b1", "pending", "10"), op_report("b2", "pending", "11")]);
    params["resync"] = json!({"id": "r1", "batch": 0, "last_batch": true});
    call(&sim, "POST", "/json/2/vworkspace.cluster/agent_sync", Some(KEY), params).await;
    let mut params = sync_params(Value::Null);
    params["reports"] = json!([op_report("b1", "running", "12")]);
    call(&sim, "POST", "/json/2/vworkspace.cluster/agent_sync", Some(KEY), params).await;

    let (s, body) = call(&sim, "GET", "/sim/clusters/edge-1/report-log", None, Value::Null).await;
    assert_eq!(s, 200);
    let log: Vec<ReceivedReport> = serde_json::from_value(body["entries"].clone()).unwrap();
    assert_eq!(
        log.iter()
            .map(|e| (e.seq, e.key.as_str(), e.state, e.resync))
            .collect::<Vec<_>>(),
        [
            (1, "Operation/team-a/b1", ObjectState::Pending, true),
            (2, "Operation/team-a/b2", ObjectState::Pending, true),
            (3, "Operation/team-a/b1", ObjectState::Running, false),
        ]
    );
    assert_eq!(log[2].resource_version.as_deref(), Some("12"));
    assert!(log[0].received_at >= before && log[2].received_at >= log[0].received_at);
    assert_eq!(log[2].received_at_ms, log[2].received_at.as_millisecond());
    // The latest report per object is still what the view shows.
    assert_eq!(
        sim.view("edge-1").unwrap()["reports"]["Operation/team-a/b1"]["report"]["state"],
        "running"
    );

    let (_, body) = call(
        &sim,
        "GET",
        "/sim/clusters/edge-1/report-log?after=2",
        None,
        Value::Null,
    )
    .await;
    assert_eq!(body["entries"].as_array().map(Vec::len), Some(1));
    assert_eq!(body["entries"][0]["seq"], 3);
    let (s, _) = call(
        &sim,
        "GET",
        "/sim/clusters/edge-1/report-log?after=x",
        None,
        Value::Null,
    )
    .await;
    assert_eq!(s, 400);
    let (s, _) = call(&sim, "GET", "/sim/clusters/nope/report-log", None, Value::Null).await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn the_log_keeps_the_latest_entries_only() {
    let sim = sim();
    call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_register",
        Some(KEY),
        register_params("uid-1"),
    )
    .await;
    let reports: Vec<Value> = (0..MAX_REPORTS_PER_SYNC)
        .map(|i| op_report(&format!("o{i}"), "pending", "1"))
        .collect();
    let rounds = REPORT_LOG_MAX / MAX_REPORTS_PER_SYNC + 1;
    for _ in 0..rounds {
        let mut params = sync_params(Value::Null);
        params["reports"] = json!(reports);
        call(&sim, "POST", "/json/2/vworkspace.cluster/agent_sync", Some(KEY), params).await;
    }
    let log = sim.report_log("edge-1", 0).unwrap();
    assert_eq!(log.len(), REPORT_LOG_MAX);
    assert_eq!(log.last().map(|e| e.seq), Some((rounds * MAX_REPORTS_PER_SYNC) as u64));
    assert_eq!(log[0].seq, (rounds * MAX_REPORTS_PER_SYNC - REPORT_LOG_MAX + 1) as u64);
}

#[tokio::test]
async fn calls_and_bytes_are_counted_and_syncs_at_rest_told_apart() {
    let sim = sim();
    let register = register_params("uid-1");
    let register_len = register.to_string().len() as u64;
    call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_register",
        Some(KEY),
        register,
    )
    .await;
    // With a report: not at rest.
    let mut params = sync_params(Value::Null);
    params["reports"] = json!([op_report("b1", "pending", "10")]);
    call(&sim, "POST", "/json/2/vworkspace.cluster/agent_sync", Some(KEY), params).await;
    // Nothing either way: at rest.
    let rest = sync_params(Value::Null);
    let rest_len = rest.to_string().len() as u64;
    call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_sync",
        Some(KEY),
        rest.clone(),
    )
    .await;
    // A document going down is not at rest.
    let spec = json!({"chart": {"name": "wiki", "repository": {"url": "https://charts.example.com"}}});
    call(&sim, "PUT", "/sim/clusters/edge-1/applications/team-a/wiki", None, spec).await;
    call(&sim, "POST", "/json/2/vworkspace.cluster/agent_sync", Some(KEY), rest).await;
    // Errors are counted too.
    call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_sync",
        Some("wrong-key"),
        sync_params(Value::Null),
    )
    .await;
    call(&sim, "POST", "/json/2/res.partner/search", Some(KEY), json!({})).await;

    let (s, body) = call(&sim, "GET", "/sim/stats", None, Value::Null).await;
    assert_eq!(s, 200);
    let stats: SimStats = serde_json::from_value(body).unwrap();
    assert_eq!((stats.register.calls, stats.register.errors), (1, 0));
    assert_eq!(stats.register.request_body_bytes, register_len);
    assert_eq!((stats.sync.calls, stats.sync.errors), (4, 1));
    assert_eq!((stats.sync_at_rest.calls, stats.sync_at_rest.errors), (1, 0));
    assert_eq!(stats.sync_at_rest.request_body_bytes, rest_len);
    let mut answer = serde_json::to_value(SyncResult {
        protocol_version: PROTOCOL_VERSION,
        server_time: Timestamp::now(),
        desired: None,
        resync_requested: false,
        next_sync_seconds: None,
        max_reports_per_sync: Some(crate::MAX_REPORTS_PER_SYNC as u32),
    })
    .unwrap();
    answer["server_time"] = json!(json2::odoo_datetime(Timestamp::now()));
    // Odoo's datetimes have no fraction of a second: nothing varies.
    assert_eq!(stats.sync_at_rest.response_body_bytes, answer.to_string().len() as u64);
    assert!(stats.sync.response_body_bytes > 4 * stats.sync_at_rest.response_body_bytes / 2);
    // Headers: the request line, authorization, content-type, ...; the status line, content-type, length, date.
    assert!(stats.sync_at_rest.request_header_bytes > 100, "{stats:?}");
    assert!(stats.sync_at_rest.response_header_bytes > 80, "{stats:?}");
    assert_eq!((stats.other.calls, stats.other.errors), (1, 1));
    assert_eq!((stats.reports, stats.clusters), (1, 1));
}

#[tokio::test]
async fn a_push_target_is_checked_kept_across_restarts_and_its_token_never_shown() {
    let (path, config) = with_state_file("push");
    let sim = Sim::new(config.clone()).unwrap();
    sim.add_cluster("edge-1", KEY).unwrap();
    let token = "push-token-fedcba9876543210";
    let put = |body: Value| call(&sim, "PUT", "/sim/clusters/edge-1/push", None, body);
    assert_eq!(put(json!({"url": "agent:8443", "token": token})).await.0, 400);
    assert_eq!(put(json!({"url": "https://agent:8443", "token": " "})).await.0, 400);
    let (s, _) = call(
        &sim,
        "PUT",
        "/sim/clusters/nope/push",
        None,
        json!({"url": "https://a", "token": token}),
    )
    .await;
    assert_eq!(s, 404);
    let (s, body) = put(json!({"url": "https://agent:8443/", "token": token})).await;
    assert_eq!(s, 200, "{body}");

    sim.shutdown().await.unwrap();
    let again = Sim::new(config).unwrap();
    let view = again.view("edge-1").unwrap();
    assert_eq!(view["mode"], "push");
    assert_eq!(view["push"]["url"], "https://agent:8443");
    assert_eq!(view["push"]["poll_seconds"], push::DEFAULT_POLL_SECONDS);
    assert!(
        !view.to_string().contains(token),
        "the admin view never shows the token"
    );
    let target = again.push_target("edge-1").unwrap();
    assert!(!format!("{target:?}").contains(token), "nor does Debug");
    assert_eq!(target.token, token, "kept in the state file");

    let (s, _) = call(&again, "DELETE", "/sim/clusters/edge-1/push", None, Value::Null).await;
    assert_eq!(s, 200);
    assert_eq!(again.view("edge-1").unwrap()["mode"], "pull");
    assert!(again.push_target("edge-1").is_none());
    let _ = std::fs::remove_file(&path);
}

/// A request to the JSON-2 route with these headers and body; the status, content type and
/// body text.
async fn raw_call(sim: &Sim, headers: &[(&str, &str)], body: String) -> (u16, String, String) {
    let mut req = Request::builder()
        .method("POST")
        .uri("/json/2/vworkspace.cluster/agent_sync");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = router(sim.clone())
        .oneshot(req.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let kind = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, kind, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn what_odoo_answers_before_the_method_runs_is_what_odoo_19_answers() {
    let sim = sim();
    let auth = format!("bearer {KEY}");
    let body = sync_params(Value::Null).to_string();
    // No JSON content type: werkzeug's 415 page (odoo/http.py _set_request_dispatcher).
    let (s, kind, text) = raw_call(&sim, &[("authorization", &auth)], body.clone()).await;
    assert_eq!((s, kind.as_str()), (415, "text/html; charset=utf-8"));
    assert!(text.contains("Please verify the Content-Type request header"), "{text}");
    // A database this Odoo does not serve: an HTML 404, not a JSON-2 error.
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
        ("x-odoo-database", "other"),
    ];
    let (s, kind, text) = raw_call(&sim, &headers, body.clone()).await;
    assert_eq!((s, kind.as_str()), (404, "text/html; charset=utf-8"), "{text}");
    // A module without **kwargs refuses a keyword it does not name, before the method runs.
    call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_register",
        Some(KEY),
        register_params("uid-1"),
    )
    .await;
    sim.set_fault(Fault::NoKwargs);
    let mut params = sync_params(Value::Null);
    params["newer_field"] = json!(1);
    let (s, body) = call(&sim, "POST", "/json/2/vworkspace.cluster/agent_sync", Some(KEY), params).await;
    assert_eq!(
        (s, body["name"].as_str(), body["message"].as_str()),
        (
            422,
            Some("werkzeug.exceptions.UnprocessableEntity"),
            Some("got an unexpected keyword argument 'newer_field'")
        )
    );
    // Every keyword the agent sends is named.
    let (s, body) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_sync",
        Some(KEY),
        sync_params(Value::Null),
    )
    .await;
    assert_eq!(s, 200, "{body}");
}

#[test]
fn a_module_without_kwargs_names_every_field_the_agent_sends() {
    use protocol::messages::{AgentError, ResyncMarker, SyncParams};
    let params = SyncParams {
        protocol_version: PROTOCOL_VERSION,
        cluster_uid: "u".into(),
        agent_instance: "a".into(),
        known: Some(protocol::messages::Cursor {
            epoch: "e".into(),
            revision: 1,
        }),
        acks: Vec::new(),
        reports: Vec::new(),
        resync: Some(ResyncMarker {
            id: "r".into(),
            batch: 0,
            last_batch: true,
        }),
        more: true,
        last_error: Some(AgentError {
            reason: "R".into(),
            message: "m".into(),
            attempts: 1,
            since: Timestamp::now(),
        }),
    };
    let value = serde_json::to_value(params).unwrap();
    for key in value.as_object().unwrap().keys() {
        assert!(json2::SYNC_KEYWORDS.contains(&key.as_str()), "{key}");
    }
}

#[tokio::test]
async fn a_call_committed_then_answered_late_has_taken_effect_and_a_concurrent_insert_is_refused_once() {
    let sim = sim();
    call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_register",
        Some(KEY),
        register_params("uid-1"),
    )
    .await;
    sim.set_fault(Fault::CommittedThenLate { seconds: 1 });
    let mut params = sync_params(Value::Null);
    params["reports"] = json!([op_report("b1", "pending", "10")]);
    let started = std::time::Instant::now();
    let (s, _) = call(&sim, "POST", "/json/2/vworkspace.cluster/agent_sync", Some(KEY), params).await;
    assert_eq!(s, 200);
    assert!(started.elapsed() >= Duration::from_secs(1));
    // Committed before the answer: the report is there.
    assert!(
        sim.view("edge-1").unwrap()["reports"]
            .as_object()
            .is_some_and(|r| !r.is_empty())
    );

    sim.set_fault(Fault::ConcurrentInsert);
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
        (422, Some("odoo.exceptions.ValidationError"))
    );
    let (s, _) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_sync",
        Some(KEY),
        sync_params(Value::Null),
    )
    .await;
    assert_eq!(s, 200, "served again after one refusal");

    sim.set_fault(Fault::BodyLimit { bytes: 64 });
    let (s, _) = call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_sync",
        Some(KEY),
        sync_params(Value::Null),
    )
    .await;
    assert_eq!(s, 413);
}

#[tokio::test]
async fn drop_ack_confirms_an_acknowledgement_it_does_not_store_once() {
    let sim = sim();
    call(
        &sim,
        "POST",
        "/json/2/vworkspace.cluster/agent_register",
        Some(KEY),
        register_params("uid-1"),
    )
    .await;
    let ack = |revision: u64| {
        json!({"epoch": "e", "revision": revision, "outcome": "applied", "processed_at": "2026-11-21T10:00:00Z",
            "objects": []})
    };
    let sync = async |acks: Value| {
        let mut params = sync_params(Value::Null);
        params["acks"] = acks;
        call(&sim, "POST", "/json/2/vworkspace.cluster/agent_sync", Some(KEY), params)
            .await
            .0
    };
    sim.set_fault(Fault::DropAck);
    assert_eq!(sync(json!([])).await, 200, "a call without acknowledgements is served");
    assert_eq!(sync(json!([ack(1), ack(2)])).await, 200, "answered as usual");
    assert_eq!(sync(json!([ack(3)])).await, 200);
    let revisions: Vec<u64> = sim.view("edge-1").unwrap()["acks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["revision"].as_u64())
        .collect();
    assert_eq!(
        revisions,
        [2, 3],
        "the first acknowledgement of the first call carrying some is lost, once"
    );
}
