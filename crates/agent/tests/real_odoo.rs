//! What real Odoo 19 sends, which the simulator does not: a control plane on loopback that
//! answers exactly as Odoo's JSON-2 route does (json_default's offset-less timestamps,
//! `false` for empty fields, HTML 404/413/415 pages, `422` binding and `ValidationError`
//! bodies, an answer after the agent gave up waiting). The agent accepts what is well
//! formed and classifies every failure with a reason and a message that says what to change.

mod common;

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use agent::{
    client::{CallError, ClientConfig, ControlPlaneClient},
    health::{AgentMetrics, Health},
};
use axum::{
    body::Bytes,
    extract::{Path, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use controller_kit::{CancellationToken, Metrics, Readiness, Redacted};
use protocol::{METHOD_REGISTER, METHOD_SYNC, error::ErrorClass, messages::RegisterResult};
use serde_json::{Value, json};

const KEY: &str = "r3al-0doo-k3y-0123456789abcdef0123456789ab";

/// One answer: status, content type, body, and how long to wait before sending it.
struct Answer {
    status: StatusCode,
    content_type: &'static str,
    body: String,
    delay: Duration,
}

impl Answer {
    fn json(value: Value) -> Self {
        Self::status_json(StatusCode::OK, value)
    }

    fn status_json(status: StatusCode, value: Value) -> Self {
        Self {
            status,
            content_type: "application/json; charset=utf-8",
            body: value.to_string(),
            delay: Duration::ZERO,
        }
    }

    fn html(status: StatusCode, body: &str) -> Self {
        Self {
            status,
            content_type: "text/html; charset=utf-8",
            body: body.to_owned(),
            delay: Duration::ZERO,
        }
    }

    fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// Decides each answer from the method, the parameters and how many calls of that method
/// came before.
type Responder = dyn Fn(&str, &Value, usize) -> Answer + Send + Sync;

struct Mock {
    respond: Box<Responder>,
    calls: Mutex<Vec<(String, Value)>>,
}

impl Mock {
    fn calls(&self, method: &str) -> Vec<Value> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(m, _)| m == method)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

async fn handle(State(mock): State<Arc<Mock>>, Path(method): Path<String>, body: Bytes) -> Response {
    let params: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let n = {
        let mut calls = mock.calls.lock().unwrap_or_else(PoisonError::into_inner);
        let n = calls.iter().filter(|(m, _)| *m == method).count();
        calls.push((method.clone(), params.clone()));
        n
    };
    let answer = (mock.respond)(&method, &params, n);
    tokio::time::sleep(answer.delay).await;
    (
        answer.status,
        [(header::CONTENT_TYPE, answer.content_type)],
        answer.body,
    )
        .into_response()
}

async fn serve(respond: impl Fn(&str, &Value, usize) -> Answer + Send + Sync + 'static) -> (String, Arc<Mock>) {
    let mock = Arc::new(Mock {
        respond: Box::new(respond),
        calls: Mutex::new(Vec::new()),
    });
    let app = axum::Router::new()
        .route("/json/2/vworkspace.cluster/{method}", axum::routing::post(handle))
        .with_state(mock.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, app).into_future());
    (url, mock)
}

fn client(url: &str, database: Option<&str>, timeout: Duration) -> ControlPlaneClient {
    ControlPlaneClient::new(&ClientConfig {
        url: url.into(),
        database: database.map(Into::into),
        timeout,
        max_response_bytes: 1 << 20,
        ca_bundle: None,
        insecure_allow_http: true,
    })
    .unwrap()
}

/// `agent_register`'s answer as a method returning `fields.Datetime.now()` and two empty
/// Integer fields gives it.
fn register_answer() -> Value {
    json!({"protocol_version": "1.5", "cluster_id": 7, "server_time": "2026-12-01 19:30:45",
        "sync_interval_seconds": false, "max_reports_per_sync": false})
}

/// `agent_sync`'s answer when the agent is up to date, written the same way.
fn up_to_date() -> Value {
    json!({"protocol_version": "1.5", "server_time": "2026-12-01 19:30:46", "desired": false,
        "resync_requested": false, "next_sync_seconds": false, "max_reports_per_sync": false})
}

fn odoo_error(name: &str, message: &str, status: Option<u16>) -> Value {
    let mut arguments = vec![json!(message)];
    arguments.extend(status.map(|s| json!(s)));
    json!({"name": name, "message": message, "arguments": arguments, "context": {},
        "debug": format!("Traceback (most recent call last):\n{name}: {message}\n")})
}

/// Odoo's page for a request without `Content-Type: application/json` (werkzeug's 415).
const HTML_415: &str = "<!doctype html>\n<html lang=en>\n<title>415 Unsupported Media Type</title>\n\
    <h1>Unsupported Media Type</h1>\n<p>Request inferred type is compatible with [&#39;http&#39;] but \
    &#39;/json/2/&lt;__model__&gt;/&lt;__method__&gt;&#39; is type=&#39;json2&#39;.</p>\n";
/// Odoo's page when no database is selected (several databases, no `X-Odoo-Database`).
const HTML_404: &str = "<!doctype html>\n<html lang=en>\n<title>404 Not Found</title>\n<h1>Not Found</h1>\n\
    <p>The requested URL was not found on the server.</p>\n";
/// nginx's page over its `client_max_body_size`.
const HTML_413: &str = "<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n\
    <center><h1>413 Request Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n";

fn key() -> Redacted<String> {
    Redacted::new(KEY.to_owned())
}

#[tokio::test]
async fn an_ordinary_odoo_answer_reads_and_each_real_failure_says_what_to_change() {
    let (url, _) = serve(|method, params, _| match params.get("case").and_then(Value::as_str) {
        Some("415") => Answer::html(StatusCode::UNSUPPORTED_MEDIA_TYPE, HTML_415),
        Some("404") => Answer::html(StatusCode::NOT_FOUND, HTML_404),
        Some("413") => Answer::html(StatusCode::PAYLOAD_TOO_LARGE, HTML_413),
        Some("unique") => Answer::status_json(
            StatusCode::UNPROCESSABLE_ENTITY,
            odoo_error(
                "odoo.exceptions.ValidationError",
                "The operation cannot be completed: duplicate key value violates unique constraint \
                 \"vworkspace_cluster_ack_key_uniq\"",
                None,
            ),
        ),
        Some("kwargs") => Answer::status_json(
            StatusCode::UNPROCESSABLE_ENTITY,
            odoo_error(
                "werkzeug.exceptions.UnprocessableEntity",
                "got an unexpected keyword argument 'capabilities'",
                Some(422),
            ),
        ),
        Some("bad time") => Answer::json(json!({"protocol_version": "1.5", "cluster_id": 7,
            "server_time": "01/12/2026 19:30"})),
        Some("no version") => Answer::json(json!({"cluster_id": 7})),
        _ if method == METHOD_REGISTER => Answer::json(register_answer()),
        _ => Answer::json(up_to_date()),
    })
    .await;
    let c = client(&url, None, Duration::from_secs(5));
    let call = |case: &'static str| {
        let c = c.clone();
        async move { c.call(&key(), METHOD_REGISTER, &json!({"case": case})).await }
    };

    // Well formed, the Odoo way: offset-less UTC `server_time`, `false` for empty integers.
    let answer = call("ok").await.unwrap();
    let r: RegisterResult = agent::client::decode(METHOD_REGISTER, &answer).unwrap();
    assert_eq!(r.server_time, "2026-12-01T19:30:45Z".parse().unwrap());
    assert_eq!((r.sync_interval_seconds, r.max_reports_per_sync), (None, None));

    // Not well formed: the method, the field, what came and what to send.
    let answer = call("bad time").await.unwrap();
    let err = agent::client::decode::<RegisterResult>(METHOD_REGISTER, &answer).unwrap_err();
    assert_eq!(err.reason(), "MalformedResponse");
    assert_eq!(
        err.to_string(),
        format!(
            "malformed answer to agent_register: `server_time`: received \"01/12/2026 19:30\"; expected {}",
            protocol::odoo_compat::TIMESTAMP_EXPECTED
        )
    );
    let err = call("no version").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "malformed answer to agent_register: `protocol_version`: received nothing (the member is absent); \
         expected the control plane's protocol version as a string \"MAJOR.MINOR\""
    );

    // (case, reason, needs someone to act, what the message must say)
    let cases: [(&str, &str, bool, &[&str]); 5] = [
        (
            "415",
            "UnsupportedMediaType",
            true,
            &["HTTP 415", "Content-Type: application/json", "a proxy"],
        ),
        (
            "404",
            "DatabaseNotSelected",
            true,
            &[
                "HTTP 404",
                "--database",
                "VWS_ODOO_DATABASE",
                "X-Odoo-Database",
                "--db-filter",
            ],
        ),
        (
            "413",
            "RequestTooLarge",
            true,
            &["HTTP 413", "request body was", "client_max_body_size"],
        ),
        (
            "unique",
            "ConcurrentUpdate",
            false,
            &[
                "odoo.exceptions.ValidationError",
                "unique constraint",
                "concurrent call",
                "repeats it",
            ],
        ),
        (
            "kwargs",
            "UnexpectedParameter",
            true,
            &["vworkspace.cluster.agent_register", "`capabilities`", "**kwargs"],
        ),
    ];
    for (case, reason, attention, says) in cases {
        let err = call(case).await.unwrap_err();
        let text = err.to_string();
        assert_eq!(
            (err.reason(), err.needs_attention()),
            (reason, attention),
            "{case}: {text}"
        );
        for needle in says {
            assert!(text.contains(needle), "{case}: {needle:?} missing in {text}");
        }
        assert!(!text.contains(KEY) && !format!("{err:?}").contains(KEY));
    }
    assert_eq!(
        call("unique").await.unwrap_err().class(),
        Some(ErrorClass::ConcurrentUpdate)
    );

    // With --database set, the 404 names the database the agent sent.
    let err = client(&url, Some("vws"), Duration::from_secs(5))
        .call(&key(), METHOD_SYNC, &json!({"case": "404"}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("`X-Odoo-Database: vws`"), "{err}");
    assert!(err.to_string().contains("--db-filter"), "{err}");
}

/// A pull loop against `url` whose readiness the test can see, with a `timeout` per call.
fn pull_loop(
    url: &str,
    key_file: &std::path::Path,
    reports: usize,
    timeout: Duration,
) -> (agent::sync::SyncLoop<common::Accepting>, Readiness) {
    let apps = (0..reports).map(|i| app_report(&format!("app-{i}"))).collect();
    let metrics = Metrics::new("vworkspace");
    let mut sync = common::pull_loop(url, key_file, common::listed_status(apps), &metrics, 200);
    let readiness = Readiness::new();
    sync.health = Health::new(
        readiness.clone(),
        AgentMetrics::register(&Metrics::new("vworkspace")),
        None,
        json!({}),
    );
    sync.client = client(url, None, timeout);
    (sync, readiness)
}

fn app_report(name: &str) -> protocol::messages::ObjectReport {
    let app: api::ApplicationInstance = serde_json::from_value(json!({
        "apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance",
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}"),
            "resourceVersion": "1", "generation": 1},
        "spec": {"chart": {"name": "wiki", "repository": {"url": "https://charts.example.com"}}},
    }))
    .unwrap();
    protocol::report::application_report(&app, jiff::Timestamp::now())
}

fn key_file(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("agent-real-odoo-{name}-{}", std::process::id()));
    std::fs::write(&path, KEY).unwrap();
    path
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn names(call: &Value) -> Vec<String> {
    call["reports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str().map(ToOwned::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_written_the_odoo_way_is_applied_and_acknowledged() {
    let (url, mock) = serve(|method, _, n| match (method, n) {
        (METHOD_REGISTER, _) => Answer::json(register_answer()),
        (_, 0) => {
            let mut answer = up_to_date();
            answer["desired"] = json!({"epoch": "e1", "revision": 1, "generated_at": "2026-12-01 19:30:44",
                "applications": [{"namespace": "team-a", "name": "wiki", "spec": {
                    "chart": {"name": "wiki", "version": false, "repository": {"url": "https://charts.example.com"}},
                    "values": false, "targetNamespace": false, "dependsOn": false}}],
                "operations": false, "deletions": false});
            Answer::json(answer)
        }
        _ => Answer::json(up_to_date()),
    })
    .await;
    let key_file = key_file("document");
    let (sync, _) = pull_loop(&url, &key_file, 1, Duration::from_secs(5));
    let health = sync.health.clone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(sync.run(shutdown.clone()));

    wait_for("the acknowledgement", || {
        mock.calls(METHOD_SYNC)
            .iter()
            .any(|c| c["acks"][0]["outcome"] == "applied")
    })
    .await;
    let calls = mock.calls(METHOD_SYNC);
    let ack = calls.iter().find_map(|c| c["acks"].get(0)).unwrap();
    assert_eq!((ack["epoch"].as_str(), ack["revision"].as_u64()), (Some("e1"), Some(1)));
    assert_eq!(ack["objects"][0]["outcome"], "applied", "{ack}");
    assert_eq!(health.condition().reason, "Synced");
    shutdown.cancel();
    task.await.unwrap();
    let _ = std::fs::remove_file(key_file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_is_followed_by_the_same_call() {
    // The first agent_sync is answered after the agent stopped waiting, as Odoo does after
    // retrying a serialisation failure; its effects would be committed by then.
    let (url, mock) = serve(|method, _, n| match (method, n) {
        (METHOD_REGISTER, _) => Answer::json(register_answer()),
        (_, 0) => Answer::json(up_to_date()).after(Duration::from_millis(1500)),
        _ => Answer::json(up_to_date()),
    })
    .await;
    let key_file = key_file("late");
    let (sync, _) = pull_loop(&url, &key_file, 3, Duration::from_millis(400));
    let health = sync.health.clone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(sync.run(shutdown.clone()));

    wait_for("two agent_sync calls", || mock.calls(METHOD_SYNC).len() >= 2).await;
    let calls = mock.calls(METHOD_SYNC);
    let strip = |call: &Value| {
        let mut call = call.clone();
        call.as_object_mut().unwrap().remove("last_error");
        call
    };
    assert_eq!(names(&calls[0]).len(), 3, "{}", calls[0]);
    assert_eq!(
        strip(&calls[1]),
        strip(&calls[0]),
        "the same call: reports, resync batch and acknowledgements"
    );
    assert_eq!(calls[1]["last_error"]["reason"], "Timeout", "{}", calls[1]);
    wait_for("in sync", || health.condition().reason == "Synced").await;
    shutdown.cancel();
    task.await.unwrap();
    let _ = std::fs::remove_file(key_file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_413_halves_the_calls_down_to_what_passes_and_then_reports_the_limit() {
    // A proxy that takes at most two reports per call.
    let (url, mock) = serve(|method, params, _| match method {
        METHOD_REGISTER => Answer::json(register_answer()),
        _ if params["reports"].as_array().map_or(0, Vec::len) > 2 => {
            Answer::html(StatusCode::PAYLOAD_TOO_LARGE, HTML_413)
        }
        _ => Answer::json(up_to_date()),
    })
    .await;
    let key_file = key_file("split");
    let (sync, _) = pull_loop(&url, &key_file, 7, Duration::from_secs(5));
    let health = sync.health.clone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(sync.run(shutdown.clone()));
    let delivered = |mock: &Mock| {
        let mut all: Vec<String> = mock
            .calls(METHOD_SYNC)
            .iter()
            .filter(|c| names(c).len() <= 2)
            .flat_map(names)
            .collect();
        all.sort();
        all.dedup();
        all.len()
    };
    wait_for("the 7 reports", || delivered(&mock) == 7).await;
    let sizes: Vec<usize> = mock.calls(METHOD_SYNC).iter().map(|c| names(c).len()).collect();
    assert_eq!(
        sizes.get(..3),
        Some(&[7, 3, 1][..]),
        "halved down to what passes: {sizes:?}"
    );
    let first_ok = &mock.calls(METHOD_SYNC)[2];
    assert_eq!(first_ok["last_error"]["reason"], "RequestTooLarge", "{first_ok}");
    let message = first_ok["last_error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("at most 1 report(s)"), "{message}");
    wait_for("in sync", || health.condition().reason == "Synced").await;
    shutdown.cancel();
    task.await.unwrap();

    // A proxy that takes nothing: once a call carries one report, nothing is left to split.
    let (url, mock) = serve(|method, _, _| match method {
        METHOD_REGISTER => Answer::json(register_answer()),
        _ => Answer::html(StatusCode::PAYLOAD_TOO_LARGE, HTML_413),
    })
    .await;
    let (sync, readiness) = pull_loop(&url, &key_file, 3, Duration::from_secs(5));
    let health = sync.health.clone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(sync.run(shutdown.clone()));
    wait_for("the limit reported", || {
        let c = health.condition();
        c.reason == "RequestTooLarge" && c.message.contains("smallest call")
    })
    .await;
    let c = health.condition();
    assert!(
        c.message.contains("1 report(s)") && c.message.contains("client_max_body_size"),
        "{}",
        c.message
    );
    assert!(!readiness.is_ready(), "someone must raise the limit: not ready at once");
    let sizes: Vec<usize> = mock.calls(METHOD_SYNC).iter().map(|c| names(c).len()).collect();
    assert_eq!(sizes.get(..2), Some(&[3, 1][..]), "{sizes:?}");
    shutdown.cancel();
    task.await.unwrap();
    let _ = std::fs::remove_file(key_file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_insert_is_retried_and_a_missing_kwargs_needs_the_module_fixed() {
    // Two failed calls with Odoo's ValidationError of a unique key, then success.
    let (url, mock) = serve(|method, _, n| match (method, n) {
        (METHOD_REGISTER, _) => Answer::json(register_answer()),
        (_, 0 | 1) => Answer::status_json(
            StatusCode::UNPROCESSABLE_ENTITY,
            odoo_error(
                "odoo.exceptions.ValidationError",
                "The operation cannot be completed: duplicate key value violates unique constraint",
                None,
            ),
        ),
        _ => Answer::json(up_to_date()),
    })
    .await;
    let key_file = key_file("unique");
    let (sync, readiness) = pull_loop(&url, &key_file, 2, Duration::from_secs(5));
    let health = sync.health.clone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(sync.run(shutdown.clone()));
    wait_for("in sync after the retries", || {
        if health.condition().reason == "ConcurrentUpdate" {
            // Transient: a couple of them keep the agent ready.
            assert!(readiness.is_ready());
        }
        mock.calls(METHOD_SYNC).len() >= 3 && health.condition().reason == "Synced"
    })
    .await;
    let calls = mock.calls(METHOD_SYNC);
    assert_eq!(calls[2]["last_error"]["reason"], "ConcurrentUpdate", "{}", calls[2]);
    assert_eq!(calls[2]["last_error"]["attempts"], 2);
    shutdown.cancel();
    task.await.unwrap();

    // A module whose agent_register has no **kwargs, called with `capabilities`.
    let (url, _) = serve(|_, _, _| {
        Answer::status_json(
            StatusCode::UNPROCESSABLE_ENTITY,
            odoo_error(
                "werkzeug.exceptions.UnprocessableEntity",
                "got an unexpected keyword argument 'capabilities'",
                Some(422),
            ),
        )
    })
    .await;
    let (sync, readiness) = pull_loop(&url, &key_file, 1, Duration::from_secs(5));
    let health = sync.health.clone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(sync.run(shutdown.clone()));
    wait_for("the condition", || health.condition().reason == "UnexpectedParameter").await;
    let message = health.condition().message;
    assert!(
        message.contains("vworkspace.cluster.agent_register does not take the parameter `capabilities`")
            && message.contains("**kwargs"),
        "{message}"
    );
    assert!(!readiness.is_ready(), "the module must be fixed: not ready at once");
    shutdown.cancel();
    task.await.unwrap();
    let _ = std::fs::remove_file(key_file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_answer_field_fails_the_call_by_name_without_refusing_the_document() {
    let (url, mock) = serve(|method, _, n| match (method, n) {
        (METHOD_REGISTER, _) => Answer::json(register_answer()),
        (_, 0) => {
            let mut answer = up_to_date();
            answer["next_sync_seconds"] = json!("30");
            answer["desired"] = json!({"epoch": "e1", "revision": 1, "applications": []});
            Answer::json(answer)
        }
        _ => Answer::json(up_to_date()),
    })
    .await;
    let key_file = key_file("field");
    let (sync, _) = pull_loop(&url, &key_file, 1, Duration::from_secs(5));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(sync.run(shutdown.clone()));
    wait_for("the next call", || mock.calls(METHOD_SYNC).len() >= 2).await;
    let second = &mock.calls(METHOD_SYNC)[1];
    assert_eq!(second["acks"], json!([]), "no document was refused for it: {second}");
    assert_eq!(second["last_error"]["reason"], "MalformedResponse");
    assert_eq!(
        second["last_error"]["message"],
        "malformed answer to agent_sync: `next_sync_seconds`: received \"30\"; expected u32"
    );
    shutdown.cancel();
    task.await.unwrap();
    let _ = std::fs::remove_file(key_file);
}

#[test]
fn a_call_error_names_the_method_for_every_real_failure() {
    // The smallest call refused with 413: the limit to raise, in bytes.
    let err = CallError::RequestTooLarge {
        method: METHOD_SYNC.into(),
        acks: 1,
        reports: 0,
        bytes: 1_234_567,
    };
    assert_eq!(err.reason(), "RequestTooLarge");
    assert!(err.needs_attention());
    assert!(
        err.to_string()
            .starts_with("agent_sync carrying 1 acknowledgement(s) and 0 report(s) (1234567 bytes)")
    );
    assert!(err.to_string().contains("at least 1234567 bytes"), "{err}");
}
