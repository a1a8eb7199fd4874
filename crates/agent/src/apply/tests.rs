//! The apply rules against an in-memory API server.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use api::ApplicationInstanceSpec;
use serde_json::json;

use super::*;

#[derive(Default)]
struct Fake {
    apps: Mutex<BTreeMap<(String, String), ApplicationInstance>>,
    ops: Mutex<BTreeMap<(String, String), Operation>>,
    /// Fields an Operation owns, per application name: applying them yields a conflict.
    owned: Mutex<BTreeMap<String, String>>,
    writes: Mutex<Vec<String>>,
    unavailable: Mutex<bool>,
    next_uid: Mutex<u32>,
}

impl Fake {
    fn uid(&self) -> String {
        let mut n = self.next_uid.lock().unwrap();
        *n += 1;
        format!("uid-{n}")
    }
    fn writes(&self) -> Vec<String> {
        self.writes.lock().unwrap().clone()
    }
    fn down(&self) -> Result<(), ClusterError> {
        if *self.unavailable.lock().unwrap() {
            Err(ClusterError::Unavailable("connection refused".into()))
        } else {
            Ok(())
        }
    }
}

fn meta_of(body: &Value, uid: String, generation: i64) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    let mut meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta =
        serde_json::from_value(body["metadata"].clone()).unwrap();
    meta.uid = Some(uid);
    meta.generation = Some(generation);
    meta
}

impl Cluster for Arc<Fake> {
    async fn get_application(&self, ns: &str, name: &str) -> Result<Option<ApplicationInstance>, ClusterError> {
        self.down()?;
        Ok(self.apps.lock().unwrap().get(&(ns.into(), name.into())).cloned())
    }
    async fn apply_application(&self, ns: &str, name: &str, body: &Value) -> Result<ApplicationInstance, ClusterError> {
        self.down()?;
        if let Some(mgr) = self.owned.lock().unwrap().get(name) {
            let live = self.apps.lock().unwrap().get(&(ns.into(), name.into())).cloned();
            let sets_version = body["spec"]["chart"].get("version").is_some();
            let sets_values = body["spec"].get("values").is_some();
            let live_spec = live.map(|l| l.spec).unwrap_or_default();
            let differs = (sets_version && body["spec"]["chart"]["version"] != json!(live_spec.chart.version))
                || (sets_values && body["spec"]["values"] != json!(live_spec.values));
            if differs {
                return Err(ClusterError::Conflict(format!(
                    "Apply failed with 2 conflicts: conflicts with \"{mgr}\" using vworkspace.io/v1alpha1:\n- .spec.chart.version\n- .spec.values"
                )));
            }
        }
        if ns == "team-missing" {
            return Err(ClusterError::NotFound);
        }
        if body["spec"]["chart"]["name"] == "invalid" {
            return Err(ClusterError::Invalid("spec.chart.name: Invalid value".into()));
        }
        self.writes
            .lock()
            .unwrap()
            .push(format!("apply ApplicationInstance {ns}/{name}"));
        let mut apps = self.apps.lock().unwrap();
        let existing = apps.get(&(ns.into(), name.into())).cloned();
        let mut spec: Value = existing
            .as_ref()
            .map(|e| serde_json::to_value(&e.spec).unwrap())
            .unwrap_or(json!({}));
        // Server-side apply merge, good enough for these tests.
        for (k, v) in body["spec"].as_object().unwrap() {
            if k == "chart" {
                for (ck, cv) in v.as_object().unwrap() {
                    if spec.get("chart").is_none() {
                        spec["chart"] = json!({});
                    }
                    spec["chart"][ck] = cv.clone();
                }
            } else {
                spec[k] = v.clone();
            }
        }
        let generation = existing.as_ref().and_then(|e| e.metadata.generation).unwrap_or(0) + 1;
        let uid = existing
            .as_ref()
            .and_then(|e| e.metadata.uid.clone())
            .unwrap_or_else(|| self.uid());
        let app = ApplicationInstance {
            metadata: meta_of(body, uid, generation),
            spec: serde_json::from_value(spec).unwrap(),
            status: None,
        };
        apps.insert((ns.into(), name.into()), app.clone());
        Ok(app)
    }
    async fn get_operation(&self, ns: &str, name: &str) -> Result<Option<Operation>, ClusterError> {
        self.down()?;
        Ok(self.ops.lock().unwrap().get(&(ns.into(), name.into())).cloned())
    }
    async fn apply_operation(&self, ns: &str, name: &str, body: &Value) -> Result<Operation, ClusterError> {
        self.down()?;
        self.writes.lock().unwrap().push(format!("apply Operation {ns}/{name}"));
        let op = Operation {
            metadata: meta_of(body, self.uid(), 1),
            spec: serde_json::from_value(body["spec"].clone()).unwrap(),
            status: None,
        };
        self.ops.lock().unwrap().insert((ns.into(), name.into()), op.clone());
        Ok(op)
    }
    async fn delete(&self, kind: ObjectKind, ns: &str, name: &str, _uid: &str) -> Result<(), ClusterError> {
        self.down()?;
        self.writes
            .lock()
            .unwrap()
            .push(format!("delete {} {ns}/{name}", kind.as_str()));
        let key = (ns.to_owned(), name.to_owned());
        let found = match kind {
            ObjectKind::ApplicationInstance => self.apps.lock().unwrap().remove(&key).is_some(),
            ObjectKind::Operation => self.ops.lock().unwrap().remove(&key).is_some(),
        };
        if found { Ok(()) } else { Err(ClusterError::NotFound) }
    }
    async fn revision_history(&self, _ns: &str, _app: &str) -> Result<Option<Vec<AppRevision>>, ClusterError> {
        Ok(Some(vec![AppRevision {
            number: 4,
            chart_version: "1.3.0".into(),
            values: json!({"replicaCount": 3}),
            operation: Some("wiki-upgrade-3".into()),
            at: Timestamp::UNIX_EPOCH,
        }]))
    }
}

fn doc(revision: u64, v: Value) -> DesiredState {
    let mut v = v;
    v["epoch"] = json!("e1");
    v["revision"] = json!(revision);
    if v.get("generated_at").is_none() {
        // As recent as `run`'s clock.
        v["generated_at"] = json!(Timestamp::UNIX_EPOCH);
    }
    serde_json::from_value(v).unwrap()
}

fn app(ns: &str, name: &str, version: &str) -> Value {
    json!({"namespace": ns, "name": name, "spec": {"chart": {"name": "wiki", "version": version,
        "repository": {"url": "https://charts.example.com"}}, "values": {"a": 1}}})
}

fn op(ns: &str, name: &str, request: &str) -> Value {
    json!({"namespace": ns, "name": name, "spec": {"type": "Backup", "applicationRef": {"name": "wiki"},
        "requestId": request}})
}

async fn run(fake: &Arc<Fake>, d: &DesiredState) -> DocumentAck {
    apply_document(fake, d, |ns| ns.starts_with("team-"), || Timestamp::UNIX_EPOCH).await
}

fn outcomes(a: &DocumentAck) -> Vec<(String, ObjectOutcome, Option<String>)> {
    a.objects
        .iter()
        .map(|o| (format!("{}/{}", o.namespace, o.name), o.outcome, o.reason.clone()))
        .collect()
}

#[tokio::test]
async fn applies_then_reports_unchanged_without_writing() {
    let fake = Arc::new(Fake::default());
    let d = doc(
        1,
        json!({"applications": [app("team-a", "wiki", "1.0.0")], "operations": [op("team-a", "b1", "r1")]}),
    );
    let first = run(&fake, &d).await;
    assert_eq!(first.outcome, DocumentOutcome::Applied);
    assert_eq!(
        outcomes(&first),
        [
            ("team-a/wiki".into(), ObjectOutcome::Applied, None),
            ("team-a/b1".into(), ObjectOutcome::Applied, None)
        ]
    );
    assert_eq!(first.objects[0].generation, Some(1));
    assert!(first.objects[0].uid.is_some());
    let labels = fake.apps.lock().unwrap()[&("team-a".into(), "wiki".into())]
        .metadata
        .labels
        .clone();
    assert_eq!(labels.unwrap()["app.kubernetes.io/managed-by"], "vworkspace-agent");

    let writes = fake.writes().len();
    let again = run(&fake, &d).await;
    assert_eq!(
        again.objects.iter().map(|o| o.outcome).collect::<Vec<_>>(),
        [ObjectOutcome::Unchanged, ObjectOutcome::Unchanged]
    );
    assert_eq!(fake.writes().len(), writes, "a replayed document writes nothing");
}

#[tokio::test]
async fn an_invalid_document_applies_nothing() {
    let fake = Arc::new(Fake::default());
    // The second application is fine on its own; the duplicate makes the whole document invalid.
    let d = doc(
        2,
        json!({"applications": [app("team-a", "wiki", "1.0.0"), app("team-a", "blog", "1.0.0"), app("team-a", "wiki", "2.0.0")]}),
    );
    let a = run(&fake, &d).await;
    assert_eq!(a.outcome, DocumentOutcome::Refused);
    assert_eq!(a.reason.as_deref(), Some("InvalidDocument"));
    assert!(a.message.unwrap().contains("more than once"));
    assert!(a.objects.is_empty());
    assert!(fake.writes().is_empty(), "nothing applied: {:?}", fake.writes());
}

#[tokio::test]
async fn empty_or_partial_documents_delete_nothing_explicit_deletions_do() {
    let fake = Arc::new(Fake::default());
    run(
        &fake,
        &doc(
            1,
            json!({"applications": [app("team-a", "wiki", "1.0.0"), app("team-a", "blog", "1.0.0")]}),
        ),
    )
    .await;
    // A buggy control plane sends nothing, then only one of the two.
    run(&fake, &doc(2, json!({}))).await;
    run(
        &fake,
        &doc(3, json!({"applications": [app("team-a", "wiki", "1.0.0")]})),
    )
    .await;
    assert_eq!(fake.apps.lock().unwrap().len(), 2, "absence never deletes");
    assert!(!fake.writes().iter().any(|w| w.starts_with("delete")));

    let a = run(
        &fake,
        &doc(
            4,
            json!({"deletions": [
                {"kind": "ApplicationInstance", "namespace": "team-a", "name": "blog", "reason": "ended"},
                {"kind": "ApplicationInstance", "namespace": "team-a", "name": "never-existed"},
                {"kind": "ApplicationInstance", "namespace": "team-a", "name": "wiki", "uid": "uid-999"}
            ]}),
        ),
    )
    .await;
    assert_eq!(
        outcomes(&a),
        [
            ("team-a/blog".into(), ObjectOutcome::Deleted, None),
            ("team-a/never-existed".into(), ObjectOutcome::Absent, None),
            ("team-a/wiki".into(), ObjectOutcome::Refused, Some("UidMismatch".into())),
        ]
    );
    assert_eq!(a.objects[0].message.as_deref(), Some("deleted: ended"));
    assert_eq!(fake.apps.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn objects_not_created_by_the_agent_are_never_deleted() {
    let fake = Arc::new(Fake::default());
    let mut foreign = ApplicationInstance::new("handmade", ApplicationInstanceSpec::default());
    foreign.metadata.namespace = Some("team-a".into());
    foreign.metadata.uid = Some("uid-x".into());
    fake.apps
        .lock()
        .unwrap()
        .insert(("team-a".into(), "handmade".into()), foreign);
    let a = run(
        &fake,
        &doc(
            1,
            json!({"deletions": [{"kind": "ApplicationInstance", "namespace": "team-a", "name": "handmade"}]}),
        ),
    )
    .await;
    assert_eq!(a.objects[0].outcome, ObjectOutcome::Refused);
    assert_eq!(a.objects[0].reason.as_deref(), Some("NotManagedByAgent"));
    assert_eq!(fake.apps.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn objects_not_created_by_the_agent_are_never_taken_over() {
    let fake = Arc::new(Fake::default());
    let mut app_by_hand = ApplicationInstance::new("handmade", ApplicationInstanceSpec::default());
    app_by_hand.metadata.namespace = Some("team-a".into());
    app_by_hand.metadata.uid = Some("uid-a".into());
    fake.apps
        .lock()
        .unwrap()
        .insert(("team-a".into(), "handmade".into()), app_by_hand.clone());
    let mut op_by_hand: Operation = serde_json::from_value(json!({
        "apiVersion": "vworkspace.io/v1alpha1", "kind": "Operation",
        "metadata": {"name": "by-hand", "namespace": "team-a", "uid": "uid-o"},
        "spec": op("team-a", "by-hand", "r-1")["spec"],
    }))
    .unwrap();
    op_by_hand.metadata.labels = Some([("app.kubernetes.io/managed-by".to_owned(), "kubectl".to_owned())].into());
    fake.ops
        .lock()
        .unwrap()
        .insert(("team-a".into(), "by-hand".into()), op_by_hand.clone());
    // The same spec as the live Operation, and another one for the app: neither is adopted.
    let a = run(
        &fake,
        &doc(
            1,
            json!({"applications": [app("team-a", "handmade", "1.0.0")], "operations": [op("team-a", "by-hand", "r-1")]}),
        ),
    )
    .await;
    for o in &a.objects {
        assert_eq!(
            (o.outcome, o.reason.as_deref()),
            (ObjectOutcome::Refused, Some("NotManagedByAgent")),
            "{o:?}"
        );
        assert!(
            o.message
                .as_deref()
                .is_some_and(|m| m.contains("does not take it over")),
            "{o:?}"
        );
    }
    assert_eq!(a.objects.len(), 2);
    assert_eq!(
        fake.apps.lock().unwrap()[&("team-a".to_owned(), "handmade".to_owned())],
        app_by_hand,
        "left as it was, unlabelled"
    );
    assert_eq!(
        fake.ops.lock().unwrap()[&("team-a".to_owned(), "by-hand".to_owned())],
        op_by_hand
    );
}

#[tokio::test]
async fn disallowed_namespaces_are_refused_and_reported() {
    let fake = Arc::new(Fake::default());
    let mut escape = app("team-a", "escape", "1.0.0");
    escape["spec"]["targetNamespace"] = json!("kube-system");
    let a = run(
        &fake,
        &doc(1, json!({"applications": [app("kube-system", "miner", "1.0.0"), escape], "operations": [op("default", "x", "r")]})),
    )
    .await;
    assert_eq!(
        a.outcome,
        DocumentOutcome::Applied,
        "the document is processed; the objects are refused"
    );
    assert!(
        a.objects
            .iter()
            .all(|o| o.outcome == ObjectOutcome::Refused && o.reason.as_deref() == Some("NamespaceNotAllowed"))
    );
    assert!(fake.writes().is_empty());
}

#[tokio::test]
async fn conflicts_on_operation_owned_fields_apply_the_rest_and_report_what_is_in_force() {
    let fake = Arc::new(Fake::default());
    run(
        &fake,
        &doc(1, json!({"applications": [app("team-a", "wiki", "1.0.0")]})),
    )
    .await;
    // An Upgrade moved the application to 1.3.0 and took the two fields over.
    {
        let mut apps = fake.apps.lock().unwrap();
        let live = apps.get_mut(&("team-a".into(), "wiki".into())).unwrap();
        live.spec.chart.version = Some("1.3.0".into());
        live.spec.values = Some(json!({"replicaCount": 3}));
    }
    fake.owned
        .lock()
        .unwrap()
        .insert("wiki".into(), "vworkspace-upgrade-engine".into());
    // Odoo's stale intent, with another change (the timeout) that must still land.
    let mut stale = app("team-a", "wiki", "1.0.0");
    stale["spec"]["timeout"] = json!("9m");
    let a = run(&fake, &doc(2, json!({"applications": [stale]}))).await;
    let o = &a.objects[0];
    assert_eq!(o.outcome, ObjectOutcome::Conflict, "{o:?}");
    assert_eq!(o.reason.as_deref(), Some("OwnedByOperation"));
    let c = o.conflict.clone().unwrap();
    assert_eq!(c.fields, ["spec.chart.version", "spec.values"]);
    assert_eq!(c.managers, ["vworkspace-upgrade-engine"]);
    assert_eq!(c.chart_version_in_force.as_deref(), Some("1.3.0"));
    assert_eq!(c.values_in_force, Some(json!({"replicaCount": 3})));
    assert_eq!(
        (c.revision_in_effect, c.operation.as_deref()),
        (Some(4), Some("wiki-upgrade-3"))
    );
    let live = fake.apps.lock().unwrap()[&("team-a".into(), "wiki".into())].clone();
    assert_eq!(
        live.spec.chart.version.as_deref(),
        Some("1.3.0"),
        "the Operation's version stays"
    );
    assert_eq!(
        live.spec.timeout.as_deref(),
        Some("9m"),
        "the rest of the spec was applied"
    );
}

#[tokio::test]
async fn operations_are_immutable_and_api_errors_are_classified() {
    let fake = Arc::new(Fake::default());
    run(&fake, &doc(1, json!({"operations": [op("team-a", "b1", "r1")]}))).await;
    let mut bad = app("team-a", "broken", "1.0.0");
    bad["spec"]["chart"]["name"] = json!("invalid");
    let a = run(
        &fake,
        &doc(
            2,
            json!({"applications": [bad, app("team-missing", "wiki", "1.0.0")], "operations": [op("team-a", "b1", "r2")]}),
        ),
    )
    .await;
    assert_eq!(
        outcomes(&a),
        [
            (
                "team-a/broken".into(),
                ObjectOutcome::Refused,
                Some("InvalidSpec".into())
            ),
            (
                "team-missing/wiki".into(),
                ObjectOutcome::Refused,
                Some("NamespaceNotFound".into())
            ),
            ("team-a/b1".into(), ObjectOutcome::Refused, Some("Immutable".into())),
        ]
    );
    *fake.unavailable.lock().unwrap() = true;
    let a = run(
        &fake,
        &doc(3, json!({"applications": [app("team-a", "wiki", "1.0.0")]})),
    )
    .await;
    assert_eq!(a.outcome, DocumentOutcome::Incomplete);
    assert_eq!(a.objects[0].outcome, ObjectOutcome::Failed);
    assert_eq!(a.objects[0].reason.as_deref(), Some("ApiUnavailable"));
}

#[test]
fn conflict_messages_parse() {
    let (fields, managers) = parse_conflict(
        "Apply failed with 2 conflicts: conflicts with \"vworkspace-upgrade-engine\" using vworkspace.io/v1alpha1:\n- .spec.chart.version\n- .spec.values",
    );
    assert_eq!(fields, [".spec.chart.version", ".spec.values"]);
    assert_eq!(managers, ["vworkspace-upgrade-engine"]);
    let (fields, managers) =
        parse_conflict("Apply failed with 1 conflict: conflict with \"kubectl\" with subresource \"\": .spec.timeout");
    assert_eq!(fields, [".spec.timeout"]);
    assert_eq!(managers, ["kubectl"]);
}

/// Issue 18, item 2: an Operation without a deadline that arrives days late does not run.
#[tokio::test]
async fn an_undated_operation_from_an_old_document_is_not_created() {
    let fake = Arc::new(Fake::default());
    let now: Timestamp = "2026-11-26T12:00:00Z".parse().unwrap();
    let at = |generated_at: &str, ops: Value| {
        let mut d = doc(1, json!({"operations": ops}));
        d.generated_at = Some(generated_at.parse().unwrap());
        d
    };
    let two_days_old = at("2026-11-24T12:00:00Z", json!([op("team-a", "late", "r1")]));
    let ack = apply_document(&fake, &two_days_old, |_| true, || now).await;
    assert_eq!(
        outcomes(&ack),
        [("team-a/late".into(), ObjectOutcome::Refused, Some("Expired".into()))]
    );
    assert!(fake.ops.lock().unwrap().is_empty(), "nothing created");

    let mut dated = op("team-a", "dated", "r2");
    dated["spec"]["deadline"] = json!("2026-11-26T13:00:00Z");
    let recent = at(
        "2026-11-26T11:59:00Z",
        json!([op("team-a", "late", "r1"), dated.clone()]),
    );
    let ack = apply_document(&fake, &recent, |_| true, || now).await;
    assert_eq!(
        outcomes(&ack),
        [
            ("team-a/late".into(), ObjectOutcome::Applied, None),
            ("team-a/dated".into(), ObjectOutcome::Applied, None)
        ]
    );
    // Once created, the same intent in an old document is the normal re-send: unchanged.
    let resent = at("2026-11-20T00:00:00Z", json!([op("team-a", "late", "r1"), dated]));
    let ack = apply_document(&fake, &resent, |_| true, || now).await;
    assert_eq!(
        outcomes(&ack),
        [
            ("team-a/late".into(), ObjectOutcome::Unchanged, None),
            ("team-a/dated".into(), ObjectOutcome::Unchanged, None)
        ]
    );

    let mut undated = doc(2, json!({"operations": [op("team-a", "nodate", "r3")]}));
    undated.generated_at = None;
    let ack = apply_document(&fake, &undated, |_| true, || now).await;
    assert_eq!(
        outcomes(&ack),
        [(
            "team-a/nodate".into(),
            ObjectOutcome::Refused,
            Some("DeadlineRequired".into())
        )]
    );
}
