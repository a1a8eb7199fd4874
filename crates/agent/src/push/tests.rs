//! Push mode without a cluster: the endpoint in process (tower's `oneshot`) against an
//! in-memory API server, and over real TLS with certificates generated here.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex as StdMutex},
    time::Duration,
};

use api::{ApplicationInstance, Operation};
use axum::{
    body::Body,
    http::{HeaderMap, HeaderValue, Request, StatusCode, header},
};
use controller_kit::{CancellationToken, LeaderGate, Metrics, NamespacePolicy, Readiness, WatchScope};
use jiff::Timestamp;
use operations::revisions::AppRevision;
use protocol::{
    error::{OdooError, names},
    messages::{
        AgentInfo, AgentMode, ClusterIdentity, DocumentAck, DocumentOutcome, ObjectKind, ObjectOutcome, ObjectReport,
        ObjectState,
    },
    report::deleted_report,
};
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::{auth::bearer, server::refresh_token, *};
use crate::{
    apply::{Cluster, ClusterError},
    credentials::CredentialSource,
    health::{AgentMetrics, Health},
    status::SharedStatus,
};

/// An API server that keeps what is applied and counts writes.
#[derive(Default)]
struct Fake {
    apps: StdMutex<BTreeMap<(String, String), ApplicationInstance>>,
    writes: StdMutex<Vec<String>>,
}

impl Fake {
    fn writes(&self) -> Vec<String> {
        self.writes.lock().unwrap().clone()
    }
}

impl Cluster for Arc<Fake> {
    async fn get_application(&self, ns: &str, name: &str) -> Result<Option<ApplicationInstance>, ClusterError> {
        Ok(self.apps.lock().unwrap().get(&(ns.into(), name.into())).cloned())
    }
    async fn apply_application(&self, ns: &str, name: &str, body: &Value) -> Result<ApplicationInstance, ClusterError> {
        self.writes.lock().unwrap().push(format!("apply {ns}/{name}"));
        let mut app: ApplicationInstance = serde_json::from_value(body.clone()).unwrap();
        app.metadata.uid = Some(format!("uid-{name}"));
        app.metadata.generation = Some(1);
        self.apps.lock().unwrap().insert((ns.into(), name.into()), app.clone());
        Ok(app)
    }
    async fn get_operation(&self, _: &str, _: &str) -> Result<Option<Operation>, ClusterError> {
        Ok(None)
    }
    async fn apply_operation(&self, _: &str, _: &str, _: &Value) -> Result<Operation, ClusterError> {
        Err(ClusterError::Forbidden("not in these tests".into()))
    }
    async fn delete(&self, _: ObjectKind, _: &str, _: &str, _: &str) -> Result<(), ClusterError> {
        Err(ClusterError::Forbidden("not in these tests".into()))
    }
    async fn revision_history(&self, _: &str, _: &str) -> Result<Option<Vec<AppRevision>>, ClusterError> {
        Ok(None)
    }
}

const TOKEN: &str = "push-token-0123456789abcdef-0123456789";

struct Harness {
    state: Arc<PushState<Arc<Fake>>>,
    fake: Arc<Fake>,
    readiness: Readiness,
    metrics: Metrics,
    token_file: PathBuf,
    _dir: tempfile::TempDir,
    // Keeps a follower's gate closed (a gate whose elector is gone is closed too, but
    // this is the honest case).
    _leader: Option<tokio::sync::watch::Sender<bool>>,
}

fn kube_client() -> kube::Client {
    // Never contacted: the token comes from a file.
    kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap()
}

fn harness_with(leader: bool, ttl: Duration, min_reload: Duration) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("push-token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let readiness = Readiness::new();
    let metrics = Metrics::new("vworkspace");
    let health = Health::new(
        readiness.clone(),
        AgentMetrics::register(&metrics),
        None,
        json!({"clusterUid": "uid-kube-system"}),
    );
    let (gate, sender) = if leader {
        (LeaderGate::always_leader(), None)
    } else {
        let (tx, rx) = tokio::sync::watch::channel(false);
        (LeaderGate::new(rx), Some(tx))
    };
    let fake = Arc::new(Fake::default());
    let scope = WatchScope::new(
        NamespacePolicy::AllowList(["team-a".to_owned()].into_iter().collect()),
        None,
    )
    .unwrap();
    let state = Arc::new(PushState {
        cluster: fake.clone(),
        scope,
        identity: ClusterIdentity {
            uid: "uid-kube-system".into(),
            name: "edge-1".into(),
        },
        agent: AgentInfo {
            version: "0.1.0".into(),
            instance: "agent-0".into(),
            mode: AgentMode::Push,
            started_at: Timestamp::UNIX_EPOCH,
        },
        status: SharedStatus::new(),
        health,
        gate,
        recorder: None,
        token: TokenCache::with_timing(
            CredentialSource::File(token_file.clone()),
            kube_client(),
            ttl,
            min_reload,
        ),
        max_body: 64 * 1024,
        batch_size: 2,
        ledger: Default::default(),
        ledger_store: None,
    });
    Harness {
        state,
        fake,
        readiness,
        metrics,
        token_file,
        _dir: dir,
        _leader: sender,
    }
}

fn harness() -> Harness {
    harness_with(true, TOKEN_TTL, TOKEN_MIN_RELOAD)
}

fn document(epoch: &str, revision: u64, apps: &[(&str, &str)]) -> Value {
    let applications: Vec<Value> = apps
        .iter()
        .map(|(ns, name)| {
            json!({"namespace": ns, "name": name, "spec": {"chart": {"name": "wiki", "version": "1.0.0",
                "repository": {"url": "https://charts.example.com"}}}})
        })
        .collect();
    json!({"epoch": epoch, "revision": revision, "applications": applications})
}

fn apply_body(document: Value) -> Value {
    json!({"protocol_version": "1.0", "document": document})
}

const APPLY: &str = "/json/2/vworkspace.agent/apply";
const STATUS: &str = "/json/2/vworkspace.agent/status";

impl Harness {
    async fn call_raw(&self, method: &str, path: &str, auth: Option<&str>, body: Vec<u8>) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(auth) = auth {
            req = req.header(header::AUTHORIZATION, auth);
        }
        let res = router(self.state.clone())
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = res.status();
        let www = res.headers().get(header::WWW_AUTHENTICATE).cloned();
        assert_eq!(
            res.headers()
                .get(header::CONTENT_TYPE)
                .map(|v| v.to_str().unwrap().to_owned()),
            Some("application/json".to_owned()),
            "every answer is JSON, errors included"
        );
        if status == StatusCode::UNAUTHORIZED {
            assert_eq!(www, Some(HeaderValue::from_static("Bearer")));
        }
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    async fn call(&self, path: &str, auth: Option<&str>, body: Value) -> (StatusCode, Value) {
        self.call_raw("POST", path, auth, body.to_string().into_bytes()).await
    }

    async fn push(&self, document: Value) -> (StatusCode, Value) {
        self.call(APPLY, Some(&format!("bearer {TOKEN}")), apply_body(document))
            .await
    }

    async fn status(&self, full: bool) -> (StatusCode, Value) {
        self.call(STATUS, Some(&format!("Bearer {TOKEN}")), json!({"full": full}))
            .await
    }

    fn metric(&self, needle: &str) -> bool {
        self.metrics.encode().unwrap().contains(needle)
    }
}

fn assert_error(got: &(StatusCode, Value), status: StatusCode, name: &str) {
    assert_eq!(got.0, status, "{}", got.1);
    let e: OdooError = serde_json::from_value(got.1.clone()).expect("an Odoo error object");
    assert_eq!(e.name, name, "{}", got.1);
    assert!(!e.message.is_empty());
    assert_eq!(e.arguments, vec![Value::from(e.message.clone())], "Odoo's shape");
}

#[tokio::test]
async fn a_valid_push_is_applied_and_answered_with_pull_modes_acknowledgement() {
    let h = harness();
    let (status, body) = h
        .push(document("e1", 3, &[("team-a", "wiki"), ("kube-system", "intruder")]))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["protocol_version"], protocol::PROTOCOL_VERSION.to_string());
    // Exactly the type pull mode sends back in `acks`.
    let ack: DocumentAck = serde_json::from_value(body.clone()).unwrap();
    assert_eq!(
        (ack.epoch.as_str(), ack.revision, ack.outcome),
        ("e1", 3, DocumentOutcome::Applied)
    );
    let outcomes: Vec<_> = ack
        .objects
        .iter()
        .map(|o| (o.name.as_str(), o.outcome, o.reason.as_deref()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("wiki", ObjectOutcome::Applied, None),
            ("intruder", ObjectOutcome::Refused, Some("NamespaceNotAllowed")),
        ],
        "the same allow-list as pull mode"
    );
    assert_eq!(ack.objects[0].uid.as_deref(), Some("uid-wiki"));
    assert_eq!(h.fake.writes(), ["apply team-a/wiki"]);
    let pull_shape = serde_json::to_value(&ack).unwrap();
    for key in pull_shape.as_object().unwrap().keys() {
        assert_eq!(body[key], pull_shape[key], "{key}");
    }

    // The same push again (its answer was lost): the same acknowledgement, nothing written.
    let (status, again) = h
        .push(document("e1", 3, &[("team-a", "wiki"), ("kube-system", "intruder")]))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again, body);
    assert_eq!(h.fake.writes().len(), 1);

    // An older revision of the same epoch: refused, nothing written.
    let stale = h.push(document("e1", 2, &[("team-a", "other")])).await;
    assert_error(&stale, StatusCode::CONFLICT, error_names::CONFLICT);
    assert!(stale.1["message"].as_str().unwrap().contains("e1/3"), "{}", stale.1);
    assert_eq!(h.fake.writes().len(), 1);

    // A new epoch (Odoo restored from a backup) is applied whatever its revision.
    let (status, body) = h.push(document("e2", 1, &[("team-a", "wiki")])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["objects"][0]["outcome"], "unchanged", "already as desired");
    assert_eq!(h.state.ledger.lock().await.known().unwrap().to_string(), "e2/1");

    assert!(h.metric("vworkspace_agent_documents_total{outcome=\"applied\"} 2"));
    assert!(h.metric("vworkspace_agent_push_requests_total{endpoint=\"apply\",code=\"200\"} 3"));
    assert!(h.metric("vworkspace_agent_push_requests_total{endpoint=\"apply\",code=\"409\"} 1"));
    assert!(h.metric("vworkspace_agent_known_revision 1"));
    let c = h.state.health.condition();
    assert_eq!((c.status, c.reason), ("True", "PushServing"));
    assert!(c.message.contains("last authenticated push"), "{}", c.message);
}

#[tokio::test]
async fn missing_or_wrong_tokens_get_401_and_nothing_is_applied() {
    let h = harness();
    let body = apply_body(document("e1", 1, &[("team-a", "wiki")]));
    let wrong = format!("bearer {TOKEN}x");
    let basic = format!("Basic {TOKEN}");
    let short = format!("bearer {}", &TOKEN[..10]);
    for auth in [
        None,
        Some("bearer "),
        Some(wrong.as_str()),
        Some(short.as_str()),
        Some(basic.as_str()),
        Some(TOKEN),
    ] {
        let got = h.call(APPLY, auth, body.clone()).await;
        assert_error(&got, StatusCode::UNAUTHORIZED, names::UNAUTHORIZED);
        let got = h.call(STATUS, auth, json!({})).await;
        assert_error(&got, StatusCode::UNAUTHORIZED, names::UNAUTHORIZED);
    }
    assert!(h.fake.writes().is_empty());
    assert_eq!(h.state.ledger.lock().await.known(), None);
    assert!(h.metric("vworkspace_agent_push_requests_total{endpoint=\"apply\",code=\"401\"} 6"));
    let text = h.metrics.encode().unwrap();
    assert!(!text.contains(&TOKEN[..10]), "no part of the token in the metrics");
}

#[tokio::test]
async fn bad_requests_get_json_errors_and_apply_nothing() {
    let h = harness();
    let auth = format!("bearer {TOKEN}");
    let auth = Some(auth.as_str());
    let raw = |body: &str| body.as_bytes().to_vec();

    let got = h.call_raw("POST", APPLY, auth, raw("{\"document\": ")).await;
    assert_error(&got, StatusCode::BAD_REQUEST, names::BAD_REQUEST);
    let got = h.call_raw("POST", APPLY, auth, raw("[1, 2]")).await;
    assert_error(&got, StatusCode::BAD_REQUEST, names::BAD_REQUEST);
    let got = h.call(APPLY, auth, json!({"protocol_version": "1.0"})).await;
    assert_error(&got, StatusCode::UNPROCESSABLE_ENTITY, names::UNPROCESSABLE_ENTITY);
    let got = h
        .call(
            APPLY,
            auth,
            json!({"protocol_version": "2.0", "document": document("e1", 1, &[("team-a", "wiki")])}),
        )
        .await;
    assert_error(&got, StatusCode::UNPROCESSABLE_ENTITY, names::PROTOCOL_VERSION_MISMATCH);
    let mut other_cluster = apply_body(document("e1", 1, &[("team-a", "wiki")]));
    other_cluster["cluster_uid"] = json!("uid-elsewhere");
    let got = h.call(APPLY, auth, other_cluster).await;
    assert_error(&got, StatusCode::FORBIDDEN, names::CLUSTER_MISMATCH);
    // Larger than --push-max-body: refused before it is parsed.
    let big = "x".repeat(h.state.max_body + 1);
    let got = h
        .call(
            APPLY,
            auth,
            apply_body(json!({"epoch": "e1", "revision": 1, "pad": big})),
        )
        .await;
    assert_error(
        &got,
        StatusCode::PAYLOAD_TOO_LARGE,
        error_names::REQUEST_ENTITY_TOO_LARGE,
    );
    // A document without a readable cursor cannot even be acknowledged.
    let got = h.push(json!({"applications": "all"})).await;
    assert_error(&got, StatusCode::UNPROCESSABLE_ENTITY, names::UNPROCESSABLE_ENTITY);
    let got = h.call_raw("GET", APPLY, auth, Vec::new()).await;
    assert_error(&got, StatusCode::METHOD_NOT_ALLOWED, error_names::METHOD_NOT_ALLOWED);
    let got = h.call("/json/2/vworkspace.cluster/agent_sync", auth, json!({})).await;
    assert_error(&got, StatusCode::NOT_FOUND, names::NOT_FOUND);
    assert!(h.fake.writes().is_empty());
    assert_eq!(h.state.ledger.lock().await.known(), None, "nothing processed");

    // As in pull mode: a document that does not parse but has a cursor is acknowledged
    // refused/MalformedDocument; an invalid one refused/InvalidDocument. Nothing applied.
    let (status, body) = h
        .push(json!({"epoch": "e1", "revision": 1, "applications": "all", "deletions": 42}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (body["outcome"].as_str(), body["reason"].as_str()),
        (Some("refused"), Some("MalformedDocument"))
    );
    let mut dup = document("e1", 2, &[("team-a", "wiki"), ("team-a", "wiki")]);
    dup["generated_at"] = json!("2026-01-01T00:00:00Z");
    let (status, body) = h.push(dup).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (body["outcome"].as_str(), body["reason"].as_str()),
        (Some("refused"), Some("InvalidDocument"))
    );
    assert_eq!(body["objects"], json!([]));
    assert!(h.fake.writes().is_empty(), "nothing of a refused document is applied");
    assert_eq!(h.state.ledger.lock().await.known().unwrap().to_string(), "e1/2");
}

#[tokio::test]
async fn a_follower_answers_503_and_applies_nothing() {
    let h = harness_with(false, TOKEN_TTL, TOKEN_MIN_RELOAD);
    let got = h.push(document("e1", 1, &[("team-a", "wiki")])).await;
    assert_error(&got, StatusCode::SERVICE_UNAVAILABLE, error_names::SERVICE_UNAVAILABLE);
    assert!(got.1["message"].as_str().unwrap().contains("not the leader"));
    let got = h.status(true).await;
    assert_error(&got, StatusCode::SERVICE_UNAVAILABLE, error_names::SERVICE_UNAVAILABLE);
    assert!(h.fake.writes().is_empty());
    // Authentication comes first: a follower tells nothing to a caller without the token.
    let got = h.call(APPLY, None, json!({})).await;
    assert_error(&got, StatusCode::UNAUTHORIZED, names::UNAUTHORIZED);
}

fn report(name: &str, state: ObjectState, rv: &str) -> ObjectReport {
    let mut r = deleted_report(
        ObjectKind::ApplicationInstance,
        "team-a",
        name,
        Some(format!("uid-{name}")),
        Timestamp::UNIX_EPOCH,
    );
    r.state = state;
    r.resource_version = Some(rv.into());
    r
}

fn names_of(body: &Value) -> Vec<String> {
    body["reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| format!("{}={}", r["name"].as_str().unwrap(), r["state"].as_str().unwrap()))
        .collect()
}

#[tokio::test]
async fn status_hands_out_changes_once_and_full_snapshots_on_request() {
    let h = harness();
    let got = h.status(false).await;
    assert_error(&got, StatusCode::SERVICE_UNAVAILABLE, error_names::SERVICE_UNAVAILABLE);
    assert!(got.1["message"].as_str().unwrap().contains("listing"));

    h.state.status.with(|c| {
        c.replace_kind(
            ObjectKind::ApplicationInstance,
            vec![
                report("a", ObjectState::Progressing, "1"),
                report("b", ObjectState::Ready, "2"),
                report("c", ObjectState::Ready, "3"),
            ],
            Timestamp::UNIX_EPOCH,
        );
        c.replace_kind(ObjectKind::Operation, vec![], Timestamp::UNIX_EPOCH);
    });
    let (status, first) = h.status(false).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let parsed: StatusResult = serde_json::from_value(first.clone()).unwrap();
    assert_eq!(parsed.cluster.uid, "uid-kube-system");
    assert_eq!(parsed.agent.mode, AgentMode::Push);
    assert_eq!(parsed.allowed_namespaces, ["team-a"]);
    assert!(!parsed.full);
    assert_eq!(parsed.reports.len(), 2, "at most the batch size");
    assert!(parsed.more);
    let (_, second) = h.status(false).await;
    assert_eq!(second["reports"].as_array().unwrap().len(), 1);
    assert_eq!(second["more"], false);
    let (_, third) = h.status(false).await;
    assert_eq!(third["reports"], json!([]), "delivered changes are not sent again");

    h.state.status.with(|c| c.upsert(report("a", ObjectState::Ready, "4")));
    let (_, changed) = h.status(false).await;
    assert_eq!(names_of(&changed), ["a=ready"]);

    h.state
        .status
        .with(|c| c.remove(&report("c", ObjectState::Ready, "3").key(), Timestamp::UNIX_EPOCH));
    let (_, full) = h
        .call(
            STATUS,
            Some(&format!("bearer {TOKEN}")),
            json!({"full": true, "protocol_version": "1.0"}),
        )
        .await;
    assert_eq!(full["full"], true);
    assert_eq!(
        names_of(&full),
        ["a=ready", "b=ready"],
        "every object, sorted; the deleted one is absent"
    );
    let (_, after) = h.status(false).await;
    assert_eq!(
        after["reports"],
        json!([]),
        "a full snapshot covers the pending deletion"
    );

    let (_, empty_body) = h
        .call_raw("POST", STATUS, Some(&format!("bearer {TOKEN}")), Vec::new())
        .await;
    assert_eq!(empty_body["full"], false, "an empty body asks for the changes");
    h.push(document("e1", 5, &[("team-a", "wiki")])).await;
    let (_, s) = h.status(false).await;
    assert_eq!(s["known"], json!({"epoch": "e1", "revision": 5}));
    assert!(h.metric("vworkspace_agent_push_requests_total{endpoint=\"status\",code=\"200\"}"));
}

#[tokio::test]
async fn a_rotated_token_is_picked_up_at_once_and_an_unreadable_one_fails_closed() {
    let h = harness_with(true, Duration::from_secs(3600), Duration::ZERO);
    h.state.health.set_caches_synced();
    let (status, _) = h.push(document("e1", 1, &[])).await;
    assert_eq!(status, StatusCode::OK);

    std::fs::write(&h.token_file, "rotated-token-42-0123456789abcdef-0123").unwrap();
    let got = h
        .call(
            APPLY,
            Some("bearer rotated-token-42-0123456789abcdef-0123"),
            apply_body(document("e1", 2, &[])),
        )
        .await;
    assert_eq!(
        got.0,
        StatusCode::OK,
        "the new token works without a restart: {}",
        got.1
    );
    let got = h.push(document("e1", 3, &[])).await;
    assert_error(&got, StatusCode::UNAUTHORIZED, names::UNAUTHORIZED);

    std::fs::remove_file(&h.token_file).unwrap();
    let got = h
        .call(
            APPLY,
            Some("bearer rotated-token-42-0123456789abcdef-0123"),
            apply_body(document("e1", 3, &[])),
        )
        .await;
    // The cached token still matches: a missing file only matters once it is re-read.
    assert_eq!(got.0, StatusCode::OK);
    let got = h
        .call(APPLY, Some("bearer something-else"), apply_body(document("e1", 4, &[])))
        .await;
    assert_error(&got, StatusCode::SERVICE_UNAVAILABLE, error_names::SERVICE_UNAVAILABLE);
    assert!(
        !got.1.to_string().contains("push-token"),
        "the answer names no file: {}",
        got.1
    );
    let got = h
        .call(
            APPLY,
            Some("bearer rotated-token-42-0123456789abcdef-0123"),
            apply_body(document("e1", 4, &[])),
        )
        .await;
    assert_error(&got, StatusCode::SERVICE_UNAVAILABLE, error_names::SERVICE_UNAVAILABLE);
    let c = h.state.health.condition();
    assert_eq!((c.status, c.reason), ("False", "CredentialsUnavailable"));
    assert!(c.message.contains("cannot read the push token file"), "{}", c.message);
    assert!(!h.readiness.is_ready(), "no readable token: not ready");

    std::fs::write(&h.token_file, "rotated-token-43-0123456789abcdef-0123").unwrap();
    let got = h
        .call(
            APPLY,
            Some("bearer rotated-token-43-0123456789abcdef-0123"),
            apply_body(document("e1", 4, &[])),
        )
        .await;
    assert_eq!(got.0, StatusCode::OK);
    assert!(h.readiness.is_ready());
}

#[tokio::test]
async fn a_revoked_token_stops_working_within_the_ttl() {
    let h = harness_with(true, Duration::from_millis(50), Duration::from_secs(3600));
    assert_eq!(h.push(document("e1", 1, &[])).await.0, StatusCode::OK);
    std::fs::write(&h.token_file, "the-new-one-0123456789abcdef-0123456789").unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let got = h.push(document("e1", 2, &[])).await;
    assert_error(&got, StatusCode::UNAUTHORIZED, names::UNAUTHORIZED);
}

#[test]
fn bearer_parsing() {
    let h = |v: &str| {
        let mut m = HeaderMap::new();
        m.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        bearer(&m).map(|t| String::from_utf8(t.to_vec()).unwrap())
    };
    assert_eq!(h("bearer abc").as_deref(), Some("abc"));
    assert_eq!(h("Bearer  abc ").as_deref(), Some("abc"));
    assert_eq!(h("BEARER abc").as_deref(), Some("abc"));
    assert_eq!(h("Basic abc"), None);
    assert_eq!(h("bearer"), None);
    assert_eq!(h("bearer   "), None);
    assert_eq!(bearer(&HeaderMap::new()), None);
}

/// Test PKI: a server CA and certificate for 127.0.0.1, and two client CAs with a client
/// certificate each.
struct Pki {
    dir: tempfile::TempDir,
}

fn issue(
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
    names: &[&str],
    usage: rcgen::ExtendedKeyUsagePurpose,
) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn ca(name: &str) -> (rcgen::Issuer<'static, rcgen::KeyPair>, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).unwrap();
    (rcgen::Issuer::new(params, key), cert.pem())
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let w = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        let (server_ca, server_ca_pem) = ca("server CA");
        let (server_cert, server_key) = issue(
            &server_ca,
            &["127.0.0.1", "localhost"],
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        );
        w("server-ca.pem", &server_ca_pem);
        w("server.pem", &server_cert);
        w("server-key.pem", &server_key);
        for (tag, ca_name) in [("client", "Odoo clients CA"), ("rogue", "someone else's CA")] {
            let (client_ca, client_ca_pem) = ca(ca_name);
            let (cert, key) = issue(&client_ca, &["odoo"], rcgen::ExtendedKeyUsagePurpose::ClientAuth);
            w(&format!("{tag}-ca.pem"), &client_ca_pem);
            w(&format!("{tag}.pem"), &format!("{cert}{key}"));
        }
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A client (with its own connection pool) trusting the server CA as it is now.
    fn client(&self, identity: Option<&str>) -> reqwest::Client {
        self.client_trusting("server-ca.pem", identity)
    }

    fn client_trusting(&self, ca_file: &str, identity: Option<&str>) -> reqwest::Client {
        let ca = std::fs::read(self.path(ca_file)).unwrap();
        let mut b = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .timeout(Duration::from_secs(10));
        if let Some(id) = identity {
            let pem = std::fs::read(self.path(id)).unwrap();
            b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
        }
        b.build().unwrap()
    }
}

fn tls_files(cert: PathBuf, key: PathBuf, client_ca: Option<PathBuf>) -> TlsFiles {
    TlsFiles { cert, key, client_ca }
}

async fn serve_tls(h: &Harness, pki: &Pki, client_ca: Option<&str>) -> (String, CancellationToken) {
    let files = tls_files(
        pki.path("server.pem"),
        pki.path("server-key.pem"),
        client_ca.map(|c| pki.path(c)),
    );
    let server = PushServer::bind("127.0.0.1:0".parse().unwrap(), Some(files))
        .await
        .unwrap()
        .with_tls_reload_interval(Duration::from_millis(40));
    let url = server.url();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let shutdown = CancellationToken::new();
    tokio::spawn(server.serve(router(h.state.clone()), shutdown.clone()));
    (url, shutdown)
}

async fn post(client: &reqwest::Client, url: &str, token: Option<&str>, body: Value) -> reqwest::Result<(u16, Value)> {
    let mut req = client
        .post(format!("{url}{APPLY}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let res = req.send().await?;
    let status = res.status().as_u16();
    let bytes = res.bytes().await?;
    Ok((status, serde_json::from_slice(&bytes).unwrap()))
}

#[tokio::test]
async fn tls_with_a_client_ca_needs_a_client_certificate_and_the_token() {
    let h = harness();
    let pki = Pki::new();
    let (url, shutdown) = serve_tls(&h, &pki, Some("client-ca.pem")).await;
    let body = |r: u64| apply_body(document("e1", r, &[("team-a", "wiki")]));

    let no_cert = post(&pki.client(None), &url, Some(TOKEN), body(1)).await;
    assert!(
        no_cert.is_err(),
        "no client certificate: the handshake fails, no HTTP answer: {no_cert:?}"
    );
    let rogue = post(&pki.client(Some("rogue.pem")), &url, Some(TOKEN), body(1)).await;
    assert!(rogue.is_err(), "a certificate from another CA fails too: {rogue:?}");
    assert!(h.fake.writes().is_empty());

    let odoo = pki.client(Some("client.pem"));
    let (status, ack) = post(&odoo, &url, None, body(1)).await.unwrap();
    assert_eq!(status, 401, "a valid certificate does not replace the token: {ack}");
    let (status, ack) = post(&odoo, &url, Some(TOKEN), body(1)).await.unwrap();
    assert_eq!(status, 200, "{ack}");
    assert_eq!(ack["objects"][0]["outcome"], "applied");
    assert_eq!(h.fake.writes(), ["apply team-a/wiki"]);
    shutdown.cancel();
}

#[tokio::test]
async fn tls_without_a_client_ca_needs_only_the_token() {
    let h = harness();
    let pki = Pki::new();
    let (url, shutdown) = serve_tls(&h, &pki, None).await;
    let (status, ack) = post(
        &pki.client(None),
        &url,
        Some(TOKEN),
        apply_body(document("e1", 1, &[("team-a", "wiki")])),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{ack}");
    // Plain http to the TLS port gets no answer.
    let plain = reqwest::Client::new()
        .post(format!("{}{APPLY}", url.replace("https://", "http://")))
        .bearer_auth(TOKEN)
        .send()
        .await;
    assert!(plain.as_ref().map_or(true, |r| r.status() != 200), "{plain:?}");
    shutdown.cancel();
}

#[tokio::test]
async fn tls_configuration_errors_name_the_file() {
    let pki = Pki::new();
    let err = |cert: &str, key: &str, ca: Option<&str>| {
        let files = tls_files(pki.path(cert), pki.path(key), ca.map(|c| pki.path(c)));
        async move { files.load().await.err().unwrap().to_string() }
    };
    let e = err("nope.pem", "server-key.pem", None).await;
    assert!(e.contains("TLS certificate") && e.contains("nope.pem"), "{e}");
    let e = err("server.pem", "server.pem", None).await;
    assert!(e.contains("TLS key"), "{e}");
    let e = err("server.pem", "server-key.pem", Some("server-key.pem")).await;
    assert!(e.contains("client CA"), "{e}");
    // A key that does not belong to the certificate.
    let e = err("server.pem", "client.pem", None).await;
    assert!(e.contains("invalid TLS configuration"), "{e}");
}

#[tokio::test]
async fn a_renewed_certificate_is_served_without_a_restart() {
    let h = harness();
    let pki = Pki::new();
    let (url, shutdown) = serve_tls(&h, &pki, None).await;
    let body = |r: u64| apply_body(document("e1", r, &[]));
    std::fs::copy(pki.path("server-ca.pem"), pki.path("old-server-ca.pem")).unwrap();
    // A fresh client for every check: a pooled connection would keep the old handshake.
    let old_ca_client = || pki.client_trusting("old-server-ca.pem", None);
    assert_eq!(post(&old_ca_client(), &url, Some(TOKEN), body(1)).await.unwrap().0, 200);

    // Renewal by another CA. Half-way (new key, old certificate) the pair does not
    // match: the previous configuration stays in use.
    let (new_ca, new_ca_pem) = ca("renewed server CA");
    let (cert, key) = issue(&new_ca, &["127.0.0.1"], rcgen::ExtendedKeyUsagePurpose::ServerAuth);
    std::fs::write(pki.path("server-key.pem"), key).unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(post(&old_ca_client(), &url, Some(TOKEN), body(2)).await.unwrap().0, 200);

    std::fs::write(pki.path("server.pem"), cert).unwrap();
    std::fs::write(pki.path("server-ca.pem"), new_ca_pem).unwrap();
    let mut served = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Ok(answer) = post(&pki.client(None), &url, Some(TOKEN), body(3)).await {
            served = Some(answer.0);
            break;
        }
    }
    assert_eq!(served, Some(200), "the renewed certificate is never served");
    let old = post(&old_ca_client(), &url, Some(TOKEN), body(4)).await;
    assert!(old.is_err(), "the old CA no longer verifies the endpoint: {old:?}");
    shutdown.cancel();
}

#[tokio::test]
async fn the_condition_follows_the_token_source_without_any_request() {
    // Not ready takes the agent out of its Service: it must notice a fixed token alone.
    let h = harness_with(true, Duration::from_millis(30), Duration::ZERO);
    h.state.health.set_caches_synced();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(refresh_token(h.state.clone(), "https://x".into(), shutdown.clone()));
    std::fs::remove_file(&h.token_file).unwrap();
    let wait_for = |reason: &'static str| {
        let health = h.state.health.clone();
        async move {
            for _ in 0..200 {
                if health.condition().reason == reason {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("condition never became {reason}: {:?}", health.condition());
        }
    };
    wait_for(CREDENTIALS_UNAVAILABLE).await;
    assert!(!h.readiness.is_ready());
    std::fs::write(&h.token_file, TOKEN).unwrap();
    wait_for(crate::health::PUSH_SERVING).await;
    assert!(h.readiness.is_ready());
    shutdown.cancel();
    task.await.unwrap();
}

/// The simulator's view of `edge-1`, once `check` holds (within 6 s).
async fn wait_view(sim: &odoo_sim::Sim, what: &str, check: fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    for _ in 0..300 {
        last = sim.view("edge-1").unwrap();
        if check(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what} never happened: {last:#}");
}

/// odoo-sim's push side (what the Odoo module does in push mode) against this endpoint:
/// it pushes the document when the intent changes, polls status (full first), and shows
/// acknowledgements and reports as in pull mode; a wrong token shows as a clear error.
#[tokio::test]
async fn the_simulator_drives_push_mode_as_the_odoo_module_would() {
    let h = harness();
    h.state.status.with(|c| {
        c.replace_kind(
            ObjectKind::ApplicationInstance,
            vec![report("old", ObjectState::Ready, "1")],
            Timestamp::UNIX_EPOCH,
        );
        c.replace_kind(ObjectKind::Operation, vec![], Timestamp::UNIX_EPOCH);
    });
    let server = PushServer::bind("127.0.0.1:0".parse().unwrap(), None).await.unwrap();
    let url = server.url();
    let shutdown = CancellationToken::new();
    tokio::spawn(server.serve(router(h.state.clone()), shutdown.clone()));

    let sim = odoo_sim::Sim::new(odoo_sim::SimConfig {
        state_file: None,
        database: None,
        sync_interval_seconds: None,
        offline_after: Duration::from_secs(90),
    })
    .unwrap();
    sim.add_cluster("edge-1", "an-api-key-unused-in-push-mode").unwrap();
    let target = |token: &str| odoo_sim::push::PushTarget {
        url: url.clone(),
        token: token.into(),
        ca_file: None,
        client_identity_file: None,
        poll_seconds: 1,
    };
    sim.set_push_target("edge-1", Some(target(TOKEN))).unwrap();
    let driving = tokio::spawn(odoo_sim::push::drive(sim.clone()));
    let view = || sim.view("edge-1").unwrap();
    let wait = |what: &'static str, check: fn(&Value) -> bool| wait_view(&sim, what, check);

    let first = wait("first full status", |v| v["resync"]["completed"] == 1).await;
    assert_eq!(first["mode"], "push");
    assert_eq!(first["uid"], "uid-kube-system");
    assert_eq!(first["agent"]["mode"], "push");
    assert_eq!(first["agent_online"], true);
    assert_eq!(
        first["reports"]["ApplicationInstance/team-a/old"]["report"]["state"],
        "ready"
    );

    // New intent is pushed at once (not at the next poll) and acknowledged.
    let spec =
        json!({"chart": {"name": "wiki", "version": "1.0.0", "repository": {"url": "https://charts.example.com"}}});
    let admin = odoo_sim::router(sim.clone());
    let put = Request::put("/sim/clusters/edge-1/applications/team-a/wiki")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(spec.to_string()))
        .unwrap();
    assert_eq!(admin.oneshot(put).await.unwrap().status(), StatusCode::OK);
    let acked = wait("acknowledged", |v| v["intent_acknowledged"] == true).await;
    assert_eq!(h.fake.writes(), ["apply team-a/wiki"]);
    assert_eq!(acked["objects"][0]["ack"]["outcome"], "applied", "{acked:#}");
    assert_eq!(acked["push"]["known"]["revision"], 1);
    assert!(acked["push"]["last_error"].is_null());

    // Status deltas: a change, and an object gone from the cluster.
    h.state.status.with(|c| {
        c.upsert(report("wiki", ObjectState::Ready, "5"));
        c.remove(&report("old", ObjectState::Ready, "1").key(), Timestamp::UNIX_EPOCH);
    });
    let polled = wait("deltas", |v| {
        v["reports"]["ApplicationInstance/team-a/wiki"]["report"]["state"] == "ready"
            && v["reports"]["ApplicationInstance/team-a/old"]["report"]["state"] == "deleted"
    })
    .await;
    assert_eq!(h.fake.writes().len(), 1, "the same cursor is not pushed again");
    assert!(polled["push"]["status_calls"].as_u64() >= Some(2));

    // A wrong token: the record says why, without the token.
    sim.set_push_target("edge-1", Some(target("not-the-token"))).unwrap();
    let refused = wait("401 shown", |v| !v["push"]["last_error"].is_null()).await;
    let error = refused["push"]["last_error"].as_str().unwrap();
    assert!(error.contains("HTTP 401") && error.contains("Unauthorized"), "{error}");
    assert!(!view().to_string().contains("not-the-token") && !view().to_string().contains(TOKEN));

    driving.abort();
    shutdown.cancel();
}
