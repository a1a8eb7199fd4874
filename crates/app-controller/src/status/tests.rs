use api::{ApplicationInstanceSpec, ObjectReference, ReleaseRecord};
use helmengine::{EngineCondition, SourceObservation};
use pretty_assertions::assert_eq;

use super::*;

fn time(s: &str) -> Time {
    Time(s.parse().expect("timestamp"))
}

fn app(generation: i64, status: Option<ApplicationInstanceStatus>) -> ApplicationInstance {
    let mut app = ApplicationInstance::new("wiki", ApplicationInstanceSpec::default());
    app.metadata.namespace = Some("team-a".into());
    app.metadata.generation = Some(generation);
    app.status = status;
    app
}

fn materialized() -> Materialized {
    Materialized {
        engine_ref: ObjectReference {
            api_version: "helm.toolkit.fluxcd.io/v2".into(),
            kind: "HelmRelease".into(),
            name: "wiki".into(),
            namespace: Some("team-a".into()),
        },
        source_ref: None,
        observation: None,
        engine_version: None,
    }
}

/// What materialising through Flux produced, with the engine's view (if any).
fn flux<'a>(materialized: &'a Materialized, observation: Option<&'a Observation>) -> Assessment<'a> {
    Assessment::Materialized {
        engine: EngineKind::Flux,
        materialized,
        observation,
        suspended_by: None,
        held: None,
    }
}

fn cond(type_: &str, status: &str, reason: &str, message: &str) -> EngineCondition {
    EngineCondition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
    }
}

fn observed(conditions: Vec<EngineCondition>) -> Observation {
    Observation {
        observed_generation_current: true,
        conditions,
        ..Default::default()
    }
}

fn get<'a>(s: &'a ApplicationInstanceStatus, type_: &str) -> Option<&'a Condition> {
    s.conditions.iter().find(|c| c.type_ == type_)
}

fn triple(s: &ApplicationInstanceStatus, type_: &str) -> Option<(String, String, String)> {
    get(s, type_).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn t(s: &str, r: &str, m: &str) -> Option<(String, String, String)> {
    Some((s.into(), r.into(), m.into()))
}

#[test]
fn engine_conditions_are_relayed_verbatim_once_observed() {
    let m = materialized();
    let obs = observed(vec![
        cond("Ready", "False", "UpgradeFailed", "Helm upgrade failed: boom"),
        cond("Released", "False", "UpgradeFailed", "Helm upgrade failed: boom"),
        cond(
            "Remediated",
            "True",
            "RollbackSucceeded",
            "Helm rollback to previous release succeeded",
        ),
        cond(
            "Stalled",
            "True",
            "RetriesExceeded",
            "Failed to upgrade after 1 attempt(s)",
        ),
        cond("Ready", "ignored", "duplicate", "only the first of a type counts"),
    ]);
    let now = time("2026-11-21T10:00:00Z");
    let s = next_status(&app(3, None), &flux(&m, Some(&obs)), &now);
    assert_eq!(s.observed_generation, Some(3));
    assert_eq!(
        triple(&s, "Ready"),
        t("False", "UpgradeFailed", "Helm upgrade failed: boom")
    );
    assert_eq!(
        triple(&s, "Remediated"),
        t(
            "True",
            "RollbackSucceeded",
            "Helm rollback to previous release succeeded"
        )
    );
    assert_eq!(
        triple(&s, "Stalled"),
        t("True", "RetriesExceeded", "Failed to upgrade after 1 attempt(s)")
    );
    assert!(get(&s, "Reconciling").is_none());
    assert!(
        s.conditions
            .iter()
            .all(|c| c.observed_generation == Some(3) && c.last_transition_time == now)
    );
    assert_eq!(s.engine.as_deref(), Some("flux"));
    assert_eq!(s.engine_ref, Some(m.engine_ref.clone()));
    let order: Vec<&str> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(order, ["Ready", "Stalled", "Released", "Remediated"]);
}

#[test]
fn unknown_future_reasons_pass_through() {
    let m = materialized();
    let obs = observed(vec![cond("Ready", "False", "SomethingFluxAddsIn2027", "new")]);
    let s = next_status(&app(1, None), &flux(&m, Some(&obs)), &time("2026-11-21T10:00:00Z"));
    assert_eq!(triple(&s, "Ready"), t("False", "SomethingFluxAddsIn2027", "new"));
}

#[test]
fn until_the_engine_observes_the_generation_we_report_awaiting_engine() {
    let m = materialized();
    let mut obs = observed(vec![cond("Ready", "True", "InstallSucceeded", "old generation")]);
    obs.observed_generation_current = false;
    let s = next_status(&app(2, None), &flux(&m, Some(&obs)), &time("2026-11-21T10:00:00Z"));
    let msg = "HelmRelease team-a/wiki has not yet observed the latest desired state";
    assert_eq!(triple(&s, "Ready"), t("Unknown", "AwaitingEngine", msg));
    assert_eq!(triple(&s, "Reconciling"), t("True", "AwaitingEngine", msg));

    let s = next_status(&app(2, None), &flux(&m, None), &time("2026-11-21T10:00:00Z"));
    assert_eq!(triple(&s, "Ready").map(|c| c.1), Some("AwaitingEngine".to_string()));
}

#[test]
fn transition_time_moves_only_when_status_changes() {
    let m = materialized();
    let t0 = time("2026-11-21T10:00:00Z");
    let t1 = time("2026-11-21T10:05:00Z");
    let obs = observed(vec![cond("Ready", "False", "InstallFailed", "first")]);
    let first = next_status(&app(1, None), &flux(&m, Some(&obs)), &t0);

    // Same status, new reason and message: time stays.
    let obs = observed(vec![cond("Ready", "False", "ArtifactFailed", "second")]);
    let second = next_status(&app(1, Some(first.clone())), &flux(&m, Some(&obs)), &t1);
    assert_eq!(get(&second, "Ready").unwrap().last_transition_time, t0);
    assert_eq!(get(&second, "Ready").unwrap().reason, "ArtifactFailed");

    // Status flips: time moves.
    let obs = observed(vec![cond("Ready", "True", "InstallSucceeded", "ok")]);
    let third = next_status(&app(1, Some(second)), &flux(&m, Some(&obs)), &t1);
    assert_eq!(get(&third, "Ready").unwrap().last_transition_time, t1);
}

#[test]
fn an_unchanged_world_needs_no_write() {
    let m = materialized();
    let obs = Observation {
        deployed_chart_version: Some("0.1.0".into()),
        app_version: Some("1.0.0".into()),
        last_attempted_revision: Some("0.1.0".into()),
        history: vec![ReleaseRecord {
            revision: 1,
            chart_version: "0.1.0".into(),
            status: "deployed".into(),
            ..Default::default()
        }],
        ..observed(vec![
            cond("Ready", "True", "InstallSucceeded", "ok"),
            cond("Released", "True", "InstallSucceeded", "ok"),
        ])
    };
    let assessment = flux(&m, Some(&obs));
    let first = next_status(&app(1, None), &assessment, &time("2026-11-21T10:00:00Z"));
    let settled = app(1, Some(first.clone()));
    assert!(!needs_write(
        &settled,
        &next_status(&settled, &assessment, &time("2026-11-21T11:00:00Z"))
    ));
    assert_eq!(first.deployed_chart_version.as_deref(), Some("0.1.0"));
    assert_eq!(first.history.len(), 1);
}

#[test]
fn own_failures_set_ready_false_and_stalled_when_terminal() {
    let now = time("2026-11-21T10:00:00Z");
    let msg = "namespace team-x is not allowed (allowed namespaces: team-a)";
    let s = next_status(
        &app(1, None),
        &Assessment::Failed {
            reason: reasons::NAMESPACE_NOT_ALLOWED,
            message: msg.into(),
            stalled: true,
        },
        &now,
    );
    assert_eq!(triple(&s, "Ready"), t("False", "NamespaceNotAllowed", msg));
    assert_eq!(triple(&s, "Stalled"), t("True", "NamespaceNotAllowed", msg));

    let s = next_status(
        &app(1, Some(s)),
        &Assessment::Failed {
            reason: reasons::REFERENCED_OBJECT_NOT_FOUND,
            message: "Secret x".into(),
            stalled: false,
        },
        &now,
    );
    assert!(get(&s, "Stalled").is_none(), "a transient failure clears Stalled");
}

#[test]
fn source_problems_surface_with_the_sources_reason() {
    let m = materialized();
    let obs = Observation {
        source: Some(SourceObservation {
            ready: false,
            failed: true,
            reason: "InvalidChartReference".into(),
            message: "no chart version found for demo-app-9.9.9".into(),
            object: ObjectReference {
                api_version: "source.toolkit.fluxcd.io/v1".into(),
                kind: "HelmChart".into(),
                name: "team-a-wiki".into(),
                namespace: Some("team-a".into()),
            },
        }),
        ..observed(vec![cond("Ready", "False", "ArtifactFailed", "HelmChart not ready")])
    };
    let s = next_status(&app(1, None), &flux(&m, Some(&obs)), &time("2026-11-21T10:00:00Z"));
    assert_eq!(
        triple(&s, "SourceReady"),
        t(
            "False",
            "InvalidChartReference",
            "HelmChart team-a/team-a-wiki: no chart version found for demo-app-9.9.9"
        )
    );
    assert_eq!(triple(&s, "Ready").map(|c| c.1), Some("ArtifactFailed".to_string()));
}

/// A source still fetching, or not reported on yet, is progress the HelmRelease tells: an app
/// gets no `SourceReady` for it, so a new shared source costs its apps no extra status write.
#[test]
fn a_source_in_progress_is_not_shown() {
    let m = materialized();
    for reason in [api::conditions::reasons::AWAITING_ENGINE, "Progressing"] {
        let obs = Observation {
            source: Some(SourceObservation {
                ready: false,
                failed: false,
                reason: reason.into(),
                message: "fetching".into(),
                object: ObjectReference {
                    api_version: "source.toolkit.fluxcd.io/v1".into(),
                    kind: "HelmRepository".into(),
                    name: "wiki".into(),
                    namespace: Some("team-a".into()),
                },
            }),
            ..observed(vec![cond(
                "Ready",
                "Unknown",
                "Progressing",
                "reconciliation in progress",
            )])
        };
        let s = next_status(&app(1, None), &flux(&m, Some(&obs)), &time("2026-11-21T10:00:00Z"));
        assert_eq!(triple(&s, "SourceReady"), None, "{reason}");
    }
}

#[test]
fn suspended_keeps_ready_status_and_says_why() {
    let m = materialized();
    let mut suspended = app(4, None);
    suspended.spec.suspend = true;
    let mut obs = observed(vec![
        cond("Ready", "True", "UpgradeSucceeded", "Helm upgrade succeeded"),
        cond("Reconciling", "True", "Progressing", "stale"),
    ]);
    obs.observed_generation_current = false;
    obs.suspended = true;
    let s = next_status(&suspended, &flux(&m, Some(&obs)), &time("2026-11-21T10:00:00Z"));
    let ready = get(&s, "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", "Suspended"));
    assert!(ready.message.contains("UpgradeSucceeded"));
    assert!(get(&s, "Reconciling").is_none());
}

#[test]
fn uninstalling_reports_progress() {
    let s = next_status(
        &app(1, None),
        &Assessment::Uninstalling {
            message: "waiting for helm-controller".into(),
        },
        &time("2026-11-21T10:00:00Z"),
    );
    assert_eq!(
        triple(&s, "Ready"),
        t("Unknown", "Uninstalling", "waiting for helm-controller")
    );
}

#[test]
fn long_messages_are_truncated_on_a_char_boundary() {
    let long = "é".repeat(5000);
    let s = next_status(
        &app(1, None),
        &Assessment::Failed {
            reason: reasons::APPLY_FAILED,
            message: long,
            stalled: false,
        },
        &time("2026-11-21T10:00:00Z"),
    );
    let msg = &get(&s, "Ready").unwrap().message;
    assert!(msg.len() <= MAX_MESSAGE + 4 && msg.ends_with('…'));
}

#[test]
fn a_held_chart_change_is_reconciling_while_ready_describes_the_running_release() {
    let m = materialized();
    let obs = observed(vec![cond(
        "Ready",
        "True",
        "UpgradeSucceeded",
        "Helm upgrade succeeded",
    )]);
    let message = "the chart version change from 0.1.0 to 0.2.0 waits for the maintenance window Thursday 12:01 for 10m (UTC), which opens at 2026-11-26T12:01:00Z";
    let held = Assessment::Materialized {
        engine: EngineKind::Flux,
        materialized: &m,
        observation: Some(&obs),
        suspended_by: None,
        held: Some((reasons::WAITING_FOR_MAINTENANCE_WINDOW, message)),
    };
    let status = next_status(&app(2, None), &held, &time("2026-11-26T12:00:00Z"));
    assert_eq!(
        triple(&status, "Ready"),
        t("True", "UpgradeSucceeded", "Helm upgrade succeeded")
    );
    assert_eq!(
        triple(&status, "Reconciling"),
        t("True", "WaitingForMaintenanceWindow", message)
    );
    // Once the window opens and the change is applied, the relayed state replaces it.
    let applied = next_status(
        &app(2, Some(status)),
        &flux(&m, Some(&obs)),
        &time("2026-11-26T12:01:05Z"),
    );
    assert_eq!(get(&applied, "Reconciling"), None);
}
