use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::*;

const SOURCE: &str = r#"{"repoURL": "http://127.0.0.1:18879", "chart": "test-app", "targetRevision": "0.1.0",
    "helm": {"releaseName": "wiki", "valuesObject": {"message": "hi"}}}"#;

fn application(status: Value) -> DynamicObject {
    let source: Value = serde_json::from_str(SOURCE).unwrap_or_default();
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": "team-a.wiki", "namespace": "argocd"},
        "spec": {
            "project": "team-a.wiki",
            "source": source,
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "team-a"},
            "syncPolicy": {"automated": {"prune": true, "selfHeal": false}},
        },
        "status": status,
    }))
    .unwrap()
}

/// `status.sync` as Argo CD writes it after comparing the current spec.
fn sync(status: &str) -> Value {
    let source: Value = serde_json::from_str(SOURCE).unwrap_or_default();
    json!({
        "status": status,
        "revision": "0.1.0",
        "comparedTo": {
            "source": source,
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "team-a"},
        },
    })
}

fn ready(observation: &Observation) -> (String, String, String) {
    let c = observation.condition("Ready").cloned().unwrap_or_default();
    (c.status, c.reason, c.message)
}

fn triple(status: &str, reason: &str, message: &str) -> (String, String, String) {
    (status.into(), reason.into(), message.into())
}

#[test]
fn ready_mapping_table() {
    let cases = [
        (
            "synced and healthy",
            json!({"sync": sync("Synced"), "health": {"status": "Healthy"}}),
            triple("True", "Healthy", "synced chart version 0.1.0; all resources healthy"),
        ),
        (
            "healthy with Argo's message",
            json!({"sync": sync("Synced"), "health": {"status": "Healthy", "message": "all good"}}),
            triple("True", "Healthy", "all good"),
        ),
        (
            "an error condition wins, verbatim",
            json!({
                "sync": sync("Unknown"), "health": {"status": "Healthy"},
                "conditions": [
                    {"type": "RepeatedResourceWarning", "message": "ignored"},
                    {"type": "ComparisonError", "message": "Failed to load target state: chart 9.9.9 not found — ü"},
                ],
            }),
            triple(
                "False",
                "ComparisonError",
                "Failed to load target state: chart 9.9.9 not found — ü",
            ),
        ),
        (
            "a failed sync",
            json!({
                "sync": sync("OutOfSync"), "health": {"status": "Healthy"},
                "operationState": {"phase": "Failed", "message": "one or more synchronization tasks completed unsuccessfully"},
            }),
            triple(
                "False",
                "SyncFailed",
                "one or more synchronization tasks completed unsuccessfully",
            ),
        ),
        (
            "a running sync",
            json!({
                "sync": sync("OutOfSync"), "health": {"status": "Progressing"},
                "operationState": {"phase": "Running", "message": "waiting for completion of hook batch/Job/migrate"},
            }),
            triple("Unknown", "Running", "waiting for completion of hook batch/Job/migrate"),
        ),
        (
            "a failed attempt being retried",
            json!({
                "sync": sync("OutOfSync"), "health": {"status": "Healthy"},
                "operationState": {"phase": "Running", "retryCount": 2,
                    "message": "one or more synchronization tasks completed unsuccessfully, reason: Secret \"shop-broken-tls\" is invalid: data[tls.key]: Required value. Retrying attempt #2 at 2026-11-27T07:21:08Z."},
            }),
            triple(
                "False",
                "SyncFailed",
                "one or more synchronization tasks completed unsuccessfully, reason: Secret \"shop-broken-tls\" is invalid: data[tls.key]: Required value. Retrying attempt #2 at 2026-11-27T07:21:08Z.",
            ),
        ),
        (
            "degraded",
            json!({"sync": sync("Synced"), "health": {"status": "Degraded", "message": "Deployment exceeded its progress deadline"}}),
            triple("False", "Degraded", "Deployment exceeded its progress deadline"),
        ),
        (
            "out of sync names what differs",
            json!({
                "sync": sync("OutOfSync"), "health": {"status": "Healthy"},
                "resources": [
                    {"kind": "ConfigMap", "name": "wiki", "status": "OutOfSync"},
                    {"kind": "Service", "name": "wiki", "status": "Synced"},
                ],
            }),
            triple("Unknown", "OutOfSync", "1 resources out of sync: ConfigMap/wiki"),
        ),
        (
            "progressing",
            json!({"sync": sync("Synced"), "health": {"status": "Progressing", "message": "waiting for rollout"}}),
            triple("Unknown", "Progressing", "waiting for rollout"),
        ),
        (
            "a failed older sync does not hide a later success",
            json!({
                "sync": sync("Synced"), "health": {"status": "Healthy"},
                "operationState": {"phase": "Failed", "message": "old"},
            }),
            triple("True", "Healthy", "synced chart version 0.1.0; all resources healthy"),
        ),
    ];
    for (name, status, expected) in cases {
        let observation = observe(&application(status));
        assert!(observation.observed_generation_current, "{name}");
        assert_eq!(ready(&observation), expected, "{name}");
    }
}

#[test]
fn reconciling_and_stalled_accompany_ready() {
    let types = |status: Value| -> Vec<(String, String)> {
        observe(&application(status))
            .conditions
            .into_iter()
            .map(|c| (c.type_, c.status))
            .collect()
    };
    let pair = |t: &str, s: &str| (t.to_owned(), s.to_owned());
    assert_eq!(
        types(json!({"sync": sync("OutOfSync"), "health": {"status": "Healthy"}})),
        [pair("Ready", "Unknown"), pair("Reconciling", "True")]
    );
    assert_eq!(
        types(json!({"sync": sync("OutOfSync"), "operationState": {"phase": "Error", "message": "x"}})),
        [pair("Ready", "False"), pair("Stalled", "True")]
    );
    assert_eq!(
        types(json!({"sync": sync("Synced"), "health": {"status": "Healthy"}})),
        [pair("Ready", "True")]
    );
    // Argo CD v3.6 after an automated sync failed: it will not try that revision again.
    assert_eq!(
        types(json!({
            "sync": sync("OutOfSync"), "health": {"status": "Healthy"},
            "operationState": {"phase": "Failed", "message": "one or more synchronization tasks completed unsuccessfully"},
            "conditions": [{"type": "SyncError", "message": "Failed last sync attempt to [0.3.0]: one or more synchronization tasks completed unsuccessfully"}],
        })),
        [pair("Ready", "False"), pair("Stalled", "True")]
    );
    assert_eq!(
        types(
            json!({"sync": sync("Unknown"), "conditions": [{"type": "ComparisonError", "message": "chart not found"}]})
        ),
        [pair("Ready", "False")],
        "Argo CD compares again at its next resync: not stalled"
    );
}

#[test]
fn not_current_until_argo_compared_the_spec_we_wrote() {
    let mut older = sync("Synced");
    older["comparedTo"]["source"]["targetRevision"] = json!("0.0.9");
    let cases = [
        ("no status", json!({}), false),
        (
            "compared an older source",
            json!({"sync": older, "health": {"status": "Healthy"}}),
            false,
        ),
        ("compared ours", json!({"sync": sync("Synced")}), true),
    ];
    for (name, status, expected) in cases {
        assert_eq!(
            observe(&application(status)).observed_generation_current,
            expected,
            "{name}"
        );
    }

    let mut with_default = sync("Synced");
    with_default["comparedTo"]["source"]["path"] = json!("");
    let observed = observe(&application(json!({ "sync": with_default })));
    assert!(observed.observed_generation_current, "a default Argo CD added");
    let mut null_source = application(json!({ "sync": sync("Synced") }));
    null_source.data["spec"]["source"] = Value::Null;
    assert!(
        !observe(&null_source).observed_generation_current,
        "a null source is not what Argo CD compared"
    );
}

#[test]
fn history_newest_first_with_the_deployed_version() {
    let observation = observe(&application(json!({
        "sync": sync("Synced"),
        "health": {"status": "Healthy"},
        "history": [
            {"id": 0, "revision": "0.1.0", "deployedAt": "2026-11-27T06:00:00Z", "source": {"chart": "test-app"}},
            {"id": 1, "revision": "0.2.0", "deployedAt": "2026-11-27T07:00:00Z", "source": {"chart": "test-app"}},
            {"bad": "entry"},
        ],
        "operationState": {"phase": "Succeeded", "syncResult": {"revision": "0.2.0"}},
    })));
    assert_eq!(observation.deployed_chart_version.as_deref(), Some("0.2.0"));
    assert_eq!(observation.last_attempted_revision.as_deref(), Some("0.2.0"));
    assert_eq!(observation.materialized_chart_version.as_deref(), Some("0.1.0"));
    let summary: Vec<(i64, &str, &str)> = observation
        .history
        .iter()
        .map(|r| (r.revision, r.chart_version.as_str(), r.status.as_str()))
        .collect();
    assert_eq!(summary, [(1, "0.2.0", "deployed"), (0, "0.1.0", "superseded")]);
    assert_eq!(observation.history[0].chart_name.as_deref(), Some("test-app"));
    assert!(!observation.suspended);
}

#[test]
fn no_automated_sync_is_suspended() {
    let mut app = application(json!({"sync": sync("Synced")}));
    if let Some(policy) = app.data.pointer_mut("/spec/syncPolicy") {
        *policy = json!({});
    }
    assert!(observe(&app).suspended);
}
