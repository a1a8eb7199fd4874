use super::*;
use pretty_assertions::assert_eq;
use serde_json::json;

const NS: &str = "team-a";

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("fixture is a valid object")
}

/// A chart-template HelmRelease at `generation` with the given `status`.
fn hr(generation: i64, status: Value) -> DynamicObject {
    object(json!({
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "metadata": {"name": "wiki", "namespace": NS, "generation": generation},
        "spec": {
            "interval": "10m",
            "chart": {"spec": {"chart": "wiki", "sourceRef": {"kind": "HelmRepository", "name": "wiki", "namespace": NS}}},
        },
        "status": status,
    }))
}

fn cond(type_: &str, status: &str, reason: &str, message: &str, generation: i64) -> Value {
    json!({
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": "2026-08-01T10:00:00Z",
    })
}

fn engine_cond(type_: &str, status: &str, reason: &str, message: &str) -> EngineCondition {
    EngineCondition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
    }
}

fn snapshot(version: i64, status: &str, chart_version: &str) -> Value {
    json!({
        "apiVersion": "v2",
        "digest": format!("sha256:{version:0>4}"),
        "name": "wiki",
        "namespace": NS,
        "version": version,
        "status": status,
        "chartName": "wiki",
        "chartVersion": chart_version,
        "appVersion": format!("app-{chart_version}"),
        "configDigest": "sha256:cfg",
        "firstDeployed": "2026-07-01T10:00:00Z",
        "lastDeployed": format!("2026-07-{:02}T10:00:00Z", version.clamp(1, 28)),
    })
}

fn source_obj(kind: &str, name: &str, generation: i64, status: Value) -> DynamicObject {
    object(json!({
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": NS, "generation": generation},
        "spec": {"interval": "1h"},
        "status": status,
    }))
}

#[test]
fn release_without_status() {
    let release = object(json!({
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "metadata": {"name": "wiki", "namespace": NS, "generation": 1},
        "spec": {"interval": "10m"},
    }));
    assert_eq!(observe(&release, None, None), Observation::default());
}

#[test]
fn crd_default_status_is_not_current() {
    let release = hr(1, json!({"observedGeneration": -1}));
    let observation = observe(&release, None, None);
    assert!(!observation.observed_generation_current);
    assert!(observation.conditions.is_empty());
}

#[test]
fn stale_conditions_are_relayed_but_not_current() {
    let release = hr(
        3,
        json!({
            "observedGeneration": 2,
            "conditions": [
                cond("Ready", "True", "UpgradeSucceeded", "Helm upgrade succeeded", 2),
                cond("Released", "True", "UpgradeSucceeded", "Helm upgrade succeeded", 2),
            ],
        }),
    );
    let observation = observe(&release, None, None);
    assert!(!observation.observed_generation_current);
    assert_eq!(
        observation.conditions,
        [
            engine_cond("Ready", "True", "UpgradeSucceeded", "Helm upgrade succeeded"),
            engine_cond("Released", "True", "UpgradeSucceeded", "Helm upgrade succeeded"),
        ]
    );
}

#[test]
fn generation_is_current_by_ready_condition_or_status() {
    let cases = [
        (
            "Ready at generation, status behind",
            json!([cond("Ready", "Unknown", "Progressing", "", 4)]),
            3,
            true,
        ),
        ("status at generation, no Ready", json!([]), 4, true),
        (
            "both behind",
            json!([cond("Ready", "True", "InstallSucceeded", "", 3)]),
            3,
            false,
        ),
        (
            "Ready without observedGeneration",
            json!([{"type": "Ready", "status": "True", "reason": "InstallSucceeded"}]),
            3,
            false,
        ),
        (
            "Ready=True at generation, the rest of the status not yet written (a torn write)",
            json!([cond("Ready", "True", "UpgradeSucceeded", "", 4)]),
            3,
            false,
        ),
        (
            "Ready=True and status at generation",
            json!([cond("Ready", "True", "UpgradeSucceeded", "", 4)]),
            4,
            true,
        ),
        (
            "Ready=False at generation, status behind (Flux retries)",
            json!([cond("Ready", "False", "UpgradeFailed", "", 4)]),
            3,
            true,
        ),
    ];
    for (name, conditions, status_generation, want) in cases {
        let release = hr(
            4,
            json!({"observedGeneration": status_generation, "conditions": conditions}),
        );
        assert_eq!(
            observe(&release, None, None).observed_generation_current,
            want,
            "{name}"
        );
    }
}

#[test]
fn an_install_whose_history_is_not_written_yet_is_not_current() {
    // helm-controller's first request after the install: conditions only. The second
    // brings the history; observedGeneration comes when the reconcile ends.
    let release = hr(
        1,
        json!({
            "conditions": [
                cond("Reconciling", "True", "Progressing", "Running 'install' action with timeout of 1m0s", 1),
                cond("Ready", "True", "InstallSucceeded", "Helm install succeeded for release team-a/wiki.v1 with chart wiki@6.2.1", 1),
            ],
        }),
    );
    let observation = observe(&release, None, None);
    assert!(!observation.observed_generation_current);
    assert_eq!(observation.deployed_chart_version, None);
}

#[test]
fn install_succeeded() {
    let release = hr(
        1,
        json!({
            "observedGeneration": 1,
            "conditions": [
                cond("Ready", "True", "InstallSucceeded", "Helm install succeeded for release team-a/wiki.v1 with chart wiki@6.2.1", 1),
                cond("Released", "True", "InstallSucceeded", "Helm install succeeded for release team-a/wiki.v1 with chart wiki@6.2.1", 1),
            ],
            "history": [snapshot(1, "deployed", "6.2.1")],
            "lastAttemptedRevision": "6.2.1",
            "helmChart": "team-a/team-a-wiki",
        }),
    );
    let observation = observe(&release, None, None);
    assert!(observation.observed_generation_current);
    assert!(observation.condition("Ready").is_some_and(EngineCondition::is_true));
    assert_eq!(
        observation.condition("Ready").map(|c| c.reason.as_str()),
        Some("InstallSucceeded")
    );
    assert_eq!(observation.deployed_chart_version.as_deref(), Some("6.2.1"));
    assert_eq!(observation.app_version.as_deref(), Some("app-6.2.1"));
    assert_eq!(observation.last_attempted_revision.as_deref(), Some("6.2.1"));
    assert_eq!(
        observation.history,
        [ReleaseRecord {
            revision: 1,
            chart_name: Some("wiki".into()),
            chart_version: "6.2.1".into(),
            app_version: Some("app-6.2.1".into()),
            status: "deployed".into(),
            deployed_at: Some(Time("2026-07-01T10:00:00Z".parse().expect("timestamp"))),
        }]
    );
    assert!(!observation.suspended);
}

#[test]
fn upgrade_failed_rolled_back_and_stalled() {
    // Flux's own order: Stalled, Reconciling, Ready, then the rest.
    let release = hr(
        2,
        json!({
            "observedGeneration": 2,
            "conditions": [
                cond("Stalled", "True", "RetriesExceeded", "Failed to upgrade after 1 attempt(s)", 2),
                cond("Ready", "False", "RollbackSucceeded", "Helm rollback to previous release team-a/wiki.v1 with chart wiki@6.2.1 succeeded", 2),
                cond("Released", "False", "UpgradeFailed", "Helm upgrade failed for release team-a/wiki with chart wiki@7.0.0: timeout", 2),
                cond("Remediated", "True", "RollbackSucceeded", "Helm rollback to previous release team-a/wiki.v1 with chart wiki@6.2.1 succeeded", 2),
            ],
            "history": [
                snapshot(3, "deployed", "6.2.1"),
                snapshot(2, "failed", "7.0.0"),
                snapshot(1, "superseded", "6.2.1"),
            ],
            "lastAttemptedRevision": "7.0.0",
            "upgradeFailures": 2,
        }),
    );
    let observation = observe(&release, None, None);
    assert!(observation.observed_generation_current);
    assert_eq!(
        observation.conditions,
        [
            engine_cond(
                "Ready",
                "False",
                "RollbackSucceeded",
                "Helm rollback to previous release team-a/wiki.v1 with chart wiki@6.2.1 succeeded"
            ),
            engine_cond(
                "Released",
                "False",
                "UpgradeFailed",
                "Helm upgrade failed for release team-a/wiki with chart wiki@7.0.0: timeout"
            ),
            engine_cond(
                "Remediated",
                "True",
                "RollbackSucceeded",
                "Helm rollback to previous release team-a/wiki.v1 with chart wiki@6.2.1 succeeded"
            ),
            engine_cond(
                "Stalled",
                "True",
                "RetriesExceeded",
                "Failed to upgrade after 1 attempt(s)"
            ),
        ]
    );
    assert_eq!(observation.deployed_chart_version.as_deref(), Some("6.2.1"));
    assert_eq!(observation.last_attempted_revision.as_deref(), Some("7.0.0"));
    let statuses: Vec<_> = observation
        .history
        .iter()
        .map(|r| (r.revision, r.status.as_str()))
        .collect();
    assert_eq!(statuses, [(3, "deployed"), (2, "failed"), (1, "superseded")]);
}

#[test]
fn failed_newest_release_reports_the_older_deployed_one() {
    let release = hr(
        2,
        json!({"history": [snapshot(2, "failed", "7.0.0"), snapshot(1, "deployed", "6.2.1")]}),
    );
    let observation = observe(&release, None, None);
    assert_eq!(observation.deployed_chart_version.as_deref(), Some("6.2.1"));
    assert_eq!(observation.app_version.as_deref(), Some("app-6.2.1"));
}

/// Every reason of third-party-contracts.md §1.4, plus one Flux may add later,
/// comes out exactly as it went in, on every relayed condition type.
#[test]
fn every_flux_reason_is_relayed_verbatim() {
    let by_type: [(&str, &[&str]); 7] = [
        (
            "Ready",
            &[
                "InstallSucceeded",
                "UpgradeSucceeded",
                "TestSucceeded",
                "Progressing",
                "InstallFailed",
                "UpgradeFailed",
                "TestFailed",
                "RollbackSucceeded",
                "UninstallSucceeded",
                "RollbackFailed",
                "UninstallFailed",
                "ArtifactFailed",
                "DependencyNotReady",
                "HealthCheckCanceled",
                "InvalidCELExpression",
                "AccessDenied",
                "SourceNotReady",
                "ValuesError",
                "ChartMutateError",
                "RESTClientError",
                "ResourceManagerError",
                "FactoryError",
                "ConfigFactoryErr",
                "StateError",
                "ReconcileError",
                "SomethingFluxAddsInV3",
            ],
        ),
        (
            "Released",
            &[
                "InstallSucceeded",
                "UpgradeSucceeded",
                "InstallFailed",
                "UpgradeFailed",
                "UninstallSucceeded",
                "UninstallFailed",
                "PendingRelease",
                "SomethingFluxAddsInV3",
            ],
        ),
        (
            "TestSuccess",
            &["AwaitingTests", "TestSucceeded", "TestFailed", "SomethingFluxAddsInV3"],
        ),
        (
            "Remediated",
            &[
                "RollbackSucceeded",
                "UninstallSucceeded",
                "RollbackFailed",
                "UninstallFailed",
                "SomethingFluxAddsInV3",
            ],
        ),
        (
            "Drifted",
            &["DriftDetected", "NoDriftDetected", "SomethingFluxAddsInV3"],
        ),
        (
            "Reconciling",
            &["Progressing", "ProgressingWithRetry", "SomethingFluxAddsInV3"],
        ),
        (
            "Stalled",
            &[
                "RetriesExceeded",
                "MissingRollbackTarget",
                "InvalidCELExpression",
                "AccessDenied",
                "SomethingFluxAddsInV3",
            ],
        ),
    ];
    // Generic fluxcd/pkg reasons and the legacy v2beta ones: not set by helm-controller
    // v1.6.3 on these types, but nothing stops a future (or older) controller.
    let generic = [
        "Succeeded",
        "Failed",
        "Suspended",
        "InvalidPath",
        "InvalidURL",
        "InsecureConnectionsDisallowed",
        "UnsupportedConnectionType",
        "PruneFailed",
        "BuildFailed",
        "HealthCheckFailed",
        "ReconciliationSucceeded",
        "ReconciliationFailed",
        "FeatureGateDisabled",
        "InitFailed",
        "GetLastReleaseFailed",
    ];
    for (type_, reasons) in by_type {
        for status in ["True", "False", "Unknown"] {
            for reason in reasons.iter().chain(&generic) {
                let message = format!("{type_} {status} {reason}: message with ünïcode and 'quotes'");
                let release = hr(1, json!({"conditions": [cond(type_, status, reason, &message, 1)]}));
                assert_eq!(
                    observe(&release, None, None).conditions,
                    [engine_cond(type_, status, reason, &message)],
                    "{type_} {status} {reason}"
                );
            }
        }
    }
}

#[test]
fn only_relayed_types_in_canonical_order() {
    let release = hr(
        1,
        json!({"conditions": [
            cond("Drifted", "True", "DriftDetected", "", 1),
            cond("SomeFutureType", "True", "Whatever", "", 1),
            cond("Reconciling", "True", "Progressing", "", 1),
            cond("Ready", "Unknown", "Progressing", "", 1),
            cond("TestSuccess", "Unknown", "AwaitingTests", "", 1),
            {"type": "Released"},
            "not a condition",
        ]}),
    );
    let types: Vec<_> = observe(&release, None, None)
        .conditions
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert_eq!(types, ["Ready", "Released", "TestSuccess", "Drifted", "Reconciling"]);
}

#[test]
fn history_is_sorted_and_capped() {
    let entry = |v: i64| snapshot(v, if v == 13 { "deployed" } else { "superseded" }, &format!("1.0.{v}"));
    // A deterministic shuffle: odd revisions ascending, then even ones descending,
    // then a snapshot without a version (skipped, not fatal).
    let mut shuffled: Vec<Value> = (1..=13).filter(|v| v % 2 == 1).map(entry).collect();
    shuffled.extend((1..=13).rev().filter(|v| v % 2 == 0).map(entry));
    shuffled.push(json!({"status": "deployed", "chartVersion": "no-version-field"}));
    let observation = observe(&hr(1, json!({"history": shuffled})), None, None);
    let revisions: Vec<i64> = observation.history.iter().map(|r| r.revision).collect();
    assert_eq!(revisions, (4..=13).rev().collect::<Vec<_>>());
    assert_eq!(observation.history.len(), MAX_HISTORY);
    assert_eq!(observation.deployed_chart_version.as_deref(), Some("1.0.13"));
    assert!(observation.history.iter().all(|r| r.deployed_at.is_some()));
}

#[test]
fn unparsable_deploy_time_is_dropped_not_fatal() {
    let mut entry = snapshot(1, "deployed", "1.0.0");
    entry["lastDeployed"] = json!("yesterday");
    let observation = observe(&hr(1, json!({"history": [entry]})), None, None);
    assert_eq!(observation.history.len(), 1);
    assert_eq!(observation.history[0].deployed_at, None);
}

#[test]
fn suspended_release() {
    let mut release = hr(1, json!({"observedGeneration": 1}));
    release.data["spec"]["suspend"] = json!(true);
    assert!(observe(&release, None, None).suspended);
}

#[test]
fn values_revision_token_must_be_handled() {
    let ready = |handled: Option<&str>, extra: Option<Value>| {
        let mut conditions = vec![cond("Ready", "True", "UpgradeSucceeded", "", 5)];
        conditions.extend(extra);
        let mut status = json!({"observedGeneration": 5, "conditions": conditions});
        if let Some(handled) = handled {
            status["lastHandledReconcileAt"] = json!(handled);
        }
        let mut release = hr(5, status);
        release.metadata.annotations = Some([(ANNOTATION_REQUESTED_AT.to_owned(), "rv-2".to_owned())].into());
        release
    };
    let cases = [
        ("never handled", ready(None, None), false),
        ("older token handled", ready(Some("rv-1"), None), false),
        ("token handled", ready(Some("rv-2"), None), true),
        (
            "Ready from before the request, Flux has just started",
            ready(Some("rv-1"), Some(cond("Reconciling", "True", "Progressing", "", 5))),
            false,
        ),
        (
            "being worked on: Ready no longer True",
            {
                let mut r = ready(Some("rv-1"), Some(cond("Reconciling", "True", "Progressing", "", 5)));
                r.data["status"]["conditions"][0] = cond("Ready", "Unknown", "Progressing", "", 5);
                r
            },
            true,
        ),
        (
            "failed while being worked on",
            {
                let mut r = ready(
                    Some("rv-1"),
                    Some(cond("Reconciling", "True", "ProgressingWithRetry", "", 5)),
                );
                r.data["status"]["conditions"][0] = cond("Ready", "False", "UpgradeFailed", "", 5);
                r
            },
            true,
        ),
        (
            "a later reconcile after the request was handled",
            ready(Some("rv-2"), Some(cond("Reconciling", "True", "Progressing", "", 5))),
            true,
        ),
        (
            "suspended",
            {
                let mut r = ready(Some("rv-1"), None);
                r.data["spec"]["suspend"] = json!(true);
                r
            },
            true,
        ),
    ];
    for (name, release, want) in cases {
        assert_eq!(
            observe(&release, None, None).observed_generation_current,
            want,
            "{name}"
        );
    }
}

#[test]
fn chart_not_ready_is_reported_with_its_own_reason() {
    let release = hr(1, json!({"helmChart": "team-a/team-a-wiki"}));
    let repository = source_obj(
        "HelmRepository",
        "wiki",
        1,
        json!({"observedGeneration": 1, "conditions": [cond("Ready", "True", "Succeeded", "stored artifact: revision 'sha256:1'", 1)]}),
    );
    let chart = source_obj(
        "HelmChart",
        "team-a-wiki",
        1,
        json!({"observedGeneration": 1, "conditions": [
            cond("Ready", "False", "InvalidChartReference", "invalid chart reference: failed to get chart version for remote reference: no 'wiki' chart with version matching '9.9.9' found", 1),
        ]}),
    );
    let observation = observe(&release, Some(&repository), Some(&chart));
    assert_eq!(
        observation.source,
        Some(SourceObservation {
            ready: false,
            failed: true,
            reason: "InvalidChartReference".into(),
            message: "invalid chart reference: failed to get chart version for remote reference: no 'wiki' chart with version matching '9.9.9' found".into(),
            object: HELM_CHART.object_ref("team-a-wiki", NS),
        })
    );
}

#[test]
fn source_selection_table() {
    let ready = |kind, name| {
        source_obj(
            kind,
            name,
            2,
            json!({"observedGeneration": 2, "conditions": [cond("Ready", "True", "Succeeded", "ok", 2)]}),
        )
    };
    let failing = |kind, name, reason| {
        source_obj(
            kind,
            name,
            2,
            json!({"observedGeneration": 2, "conditions": [cond("Ready", "False", reason, "bad", 2)]}),
        )
    };
    let stale = |kind, name| {
        source_obj(
            kind,
            name,
            3,
            json!({"observedGeneration": 2, "conditions": [cond("Ready", "True", "Succeeded", "ok", 2)]}),
        )
    };
    let fresh = |kind, name| source_obj(kind, name, 1, json!({"observedGeneration": -1}));
    let chart_ok = source_obj(
        "HelmChart",
        "team-a-wiki",
        1,
        json!({"observedGeneration": 1, "conditions": [cond("Ready", "True", "ChartPullSucceeded", "pulled 'wiki' chart with version '6.2.1'", 1)]}),
    );
    let release = hr(1, json!({}));
    /// `(ready, failed, reason, kind)` of the reported source.
    type Want = Option<(bool, bool, &'static str, &'static str)>;
    let cases: [(&str, Option<DynamicObject>, Option<DynamicObject>, Want); 10] = [
        ("nothing readable", None, None, None),
        (
            "all ready: the chart",
            Some(ready("HelmRepository", "wiki")),
            Some(chart_ok.clone()),
            Some((true, false, "ChartPullSucceeded", "HelmChart")),
        ),
        (
            // Seen on the real cluster: source-controller keeps status.observedGeneration at -1
            // while the repository keeps failing, but stamps the generation on Ready=False.
            "failing repository that never succeeded",
            Some(source_obj(
                "HelmRepository",
                "wiki",
                1,
                json!({"observedGeneration": -1, "conditions": [cond("Ready", "False", "Failed", "connection refused", 1)]}),
            )),
            None,
            Some((false, true, "Failed", "HelmRepository")),
        ),
        (
            "repository unreachable wins",
            Some(failing("HelmRepository", "wiki", "IndexationFailed")),
            Some(chart_ok.clone()),
            Some((false, true, "IndexationFailed", "HelmRepository")),
        ),
        (
            "OCI source alone ready",
            Some(ready("OCIRepository", "wiki")),
            None,
            Some((true, false, "Succeeded", "OCIRepository")),
        ),
        (
            "OCI pull failed",
            Some(failing("OCIRepository", "wiki", "OCIArtifactPullFailed")),
            None,
            Some((false, true, "OCIArtifactPullFailed", "OCIRepository")),
        ),
        (
            "stale Ready is not ready",
            Some(stale("OCIRepository", "wiki")),
            None,
            Some((false, false, reasons::AWAITING_ENGINE, "OCIRepository")),
        ),
        (
            "never reconciled",
            Some(fresh("HelmRepository", "wiki")),
            Some(chart_ok),
            Some((false, false, reasons::AWAITING_ENGINE, "HelmRepository")),
        ),
        (
            "a failed chart wins over a repository still fetching",
            Some(fresh("HelmRepository", "wiki")),
            Some(failing("HelmChart", "team-a-wiki", "ChartPullError")),
            Some((false, true, "ChartPullError", "HelmChart")),
        ),
        (
            "only the chart",
            None,
            Some(failing("HelmChart", "team-a-wiki", "ChartPullError")),
            Some((false, true, "ChartPullError", "HelmChart")),
        ),
    ];
    for (name, source, chart, want) in cases {
        let got = observe(&release, source.as_ref(), chart.as_ref()).source;
        let got = got
            .as_ref()
            .map(|s| (s.ready, s.failed, s.reason.as_str(), s.object.kind.as_str()));
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn static_oci_helm_repository_is_ready() {
    let mut repository = source_obj("HelmRepository", "bitnami", 1, json!({}));
    repository.data["spec"]["type"] = json!("oci");
    let observation = observe(&hr(1, json!({})), Some(&repository), None);
    let source = observation.source.expect("source observed");
    assert!(source.ready);
    assert_eq!(source.reason, "Succeeded");
    assert_eq!(source.object, HELM_REPOSITORY.object_ref("bitnami", NS));
}

#[test]
fn source_refs_of_a_chart_template() {
    let mut release = hr(1, json!({"helmChart": "team-a/team-a-wiki"}));
    assert_eq!(
        source_refs(&release),
        SourceRefs {
            source: Some(HELM_REPOSITORY.object_ref("wiki", NS)),
            chart: Some(HELM_CHART.object_ref("team-a-wiki", NS)),
        }
    );
    // Source namespace defaults to the HelmRelease's.
    release.data["spec"]["chart"]["spec"]["sourceRef"] = json!({"kind": "GitRepository", "name": "charts"});
    release.data["status"]["helmChart"] = json!("malformed");
    assert_eq!(
        source_refs(&release),
        SourceRefs {
            source: Some(crate::flux::GIT_REPOSITORY.object_ref("charts", NS)),
            chart: None
        }
    );
}

#[test]
fn source_refs_of_a_chart_ref() {
    let mut release = hr(1, json!({"helmChart": "team-a/ignored"}));
    release.data["spec"] = json!({"interval": "10m", "chartRef": {"kind": "OCIRepository", "name": "wiki"}});
    assert_eq!(
        source_refs(&release),
        SourceRefs {
            source: Some(crate::flux::OCI_REPOSITORY.object_ref("wiki", NS)),
            chart: None
        }
    );
    release.data["spec"]["chartRef"] = json!({"kind": "ExternalArtifact", "name": "wiki"});
    assert_eq!(source_refs(&release), SourceRefs::default());
}

#[test]
fn the_materialised_chart_version_is_read_from_the_release_or_its_oci_source() {
    let mut release = hr(1, json!({}));
    assert_eq!(observe(&release, None, None).materialized_chart_version, None);
    release.data["spec"]["chart"]["spec"]["version"] = json!("6.2.1");
    assert_eq!(
        observe(&release, None, None).materialized_chart_version.as_deref(),
        Some("6.2.1")
    );
    let oci_release = object(json!({
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "metadata": {"name": "wiki", "namespace": NS, "generation": 1},
        "spec": {"interval": "10m", "chartRef": {"kind": "OCIRepository", "name": "wiki"}},
    }));
    let oci = object(json!({
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "OCIRepository",
        "metadata": {"name": "wiki", "namespace": NS, "generation": 1},
        "spec": {"url": "oci://registry.example/charts/wiki", "ref": {"semver": "~6.2"}},
    }));
    assert_eq!(
        observe(&oci_release, Some(&oci), None)
            .materialized_chart_version
            .as_deref(),
        Some("~6.2")
    );
}

/// The fingerprint that decides whether a shared source's event wakes its readers: only
/// what they report moves it (a failure on the current generation and its reason and message,
/// the generation itself, a deletion), not a finalizer, an artifact detail, an old Ready, or
/// the steps of a fetch that succeeds.
#[test]
fn a_source_fingerprint_moves_only_with_what_its_readers_see() {
    let ready = |message: &str| json!({"observedGeneration": 1, "conditions": [cond("Ready", "True", "Succeeded", message, 1)]});
    let base = source_obj("HelmRepository", "repo", 1, ready("stored artifact"));
    let print = source_fingerprint(&base);

    let mut other_details = source_obj("HelmRepository", "repo", 1, ready("stored artifact"));
    other_details.metadata.finalizers = Some(vec!["finalizers.fluxcd.io".into()]);
    other_details.data["status"]["artifact"] = json!({"revision": "sha256:def"});
    assert_eq!(source_fingerprint(&other_details), print);

    let new_message = source_obj("HelmRepository", "repo", 1, ready("stored artifact: revision 2"));
    assert_eq!(source_fingerprint(&new_message), print);
    let fetching = source_obj(
        "HelmRepository",
        "repo",
        1,
        json!({"conditions": [cond("Ready", "Unknown", "Progressing", "reconciliation in progress", 1)]}),
    );
    assert_eq!(source_fingerprint(&fetching), print);
    let never_reported = source_obj("HelmRepository", "repo", 1, json!({"observedGeneration": -1}));
    assert_eq!(source_fingerprint(&never_reported), print);
    let failed = |message: &str| {
        source_obj(
            "HelmRepository",
            "repo",
            1,
            json!({"conditions": [cond("Ready", "False", "FetchFailed", message, 1)]}),
        )
    };
    assert_ne!(source_fingerprint(&failed("unreachable")), print);
    assert_ne!(
        source_fingerprint(&failed("unreachable")),
        source_fingerprint(&failed("connection refused"))
    );
    let new_generation = source_obj("HelmRepository", "repo", 2, ready("stored artifact"));
    assert_ne!(source_fingerprint(&new_generation), print);
    let mut deleting = source_obj("HelmRepository", "repo", 1, ready("stored artifact"));
    deleting.metadata.deletion_timestamp = serde_json::from_value(json!("2026-11-27T01:00:00Z")).ok();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_ne!(source_fingerprint(&deleting), print);
}
