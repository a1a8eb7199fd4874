//! `kubectl vws get`: one row per ApplicationInstance.

use api::{ApplicationInstance, Operation, OperationPhase, OperationType};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use operations::maintenance::{WindowState, Windows};

use crate::{age, table};

/// What `get` shows of one application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppRow {
    pub namespace: String,
    pub name: String,
    pub engine: String,
    pub chart: String,
    pub desired: String,
    pub deployed: String,
    pub ready: String,
    pub reason: String,
    pub last_backup: String,
    pub next_window: String,
}

/// The row of `app` at `now`. `operations` are Operations of the app's namespace (others are
/// ignored): the last backup is the latest successful Backup Operation of the app, or the
/// backup schedule's last success, whichever is newer.
pub fn row(app: &ApplicationInstance, operations: &[Operation], now: Timestamp) -> AppRow {
    let status = app.status.as_ref();
    let ready = status.and_then(|s| condition(&s.conditions, "Ready"));
    let engine = status
        .and_then(|s| s.engine.clone())
        .or_else(|| app.spec.engine.map(|e| e.as_str().to_owned()));
    AppRow {
        namespace: app.namespace().unwrap_or_default(),
        name: app.name_any(),
        engine: table::or_dash(engine.as_deref()),
        chart: app.spec.chart.name.clone(),
        desired: table::or_dash(app.spec.chart.version.as_deref()),
        deployed: table::or_dash(status.and_then(|s| s.deployed_chart_version.as_deref())),
        ready: table::or_dash(ready.map(|c| c.status.as_str())),
        reason: table::or_dash(ready.map(|c| c.reason.as_str())),
        last_backup: last_backup(app, operations).map_or_else(|| "-".to_owned(), |t| age::ago(t, now)),
        next_window: next_window(app, now),
    }
}

/// The condition of `type_` in `conditions`.
pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether `app` shows what its engine last reported, once the engine has answered a reconcile
/// request. The app controller relays the answer a moment after the engine writes it; until then
/// the app may still say `AwaitingEngine`, or a reason the engine gave mid-way (Flux's
/// `Progressing`), and a `get` straight after `reconcile` would show that.
///
/// `engine_reason` is the engine's Ready reason, which the app controller relays verbatim (Flux);
/// `None` where the app's reason is derived, not copied (Argo CD), and then any reason but
/// `AwaitingEngine` counts. The app's own verdicts (an invalid spec, a namespace not allowed, …)
/// count too: they rightly stand in for the engine's, and waiting for the engine's would hang.
pub fn relays_engine(app: &ApplicationInstance, engine_reason: Option<&str>) -> bool {
    use api::conditions::reasons::{APP_REASONS, AWAITING_ENGINE, PROGRESSING};
    let Some(ready) = app.status.as_ref().and_then(|s| condition(&s.conditions, "Ready")) else {
        return false;
    };
    let reason = ready.reason.as_str();
    let own_verdict = reason != PROGRESSING && APP_REASONS.contains(&reason);
    match engine_reason {
        _ if reason == AWAITING_ENGINE => false,
        Some(engine_reason) => reason == engine_reason || own_verdict,
        None => true,
    }
}

/// When the app was last backed up successfully.
pub fn last_backup(app: &ApplicationInstance, operations: &[Operation]) -> Option<Timestamp> {
    let namespace = app.namespace();
    let by_operation = operations
        .iter()
        .filter(|op| op.namespace() == namespace && op.spec.application_ref.name == app.name_any())
        .filter(|op| op.spec.type_ == OperationType::Backup)
        .filter_map(|op| {
            let status = op.status.as_ref()?;
            // A duplicate request points at the real backup, which is counted itself.
            (status.phase == Some(OperationPhase::Succeeded) && status.duplicate_of.is_none())
                .then_some(status.completion_time.as_ref()?.0)
        })
        .max();
    let by_schedule = app
        .status
        .as_ref()
        .and_then(|s| s.backup_schedule.as_ref())
        .and_then(|s| s.last_successful_time.as_ref())
        .map(|t| t.0);
    by_operation.max(by_schedule)
}

/// The maintenance window column: `-` without windows, `open (closes in 1h)`, `in 2d`.
pub fn next_window(app: &ApplicationInstance, now: Timestamp) -> String {
    if app.spec.maintenance_windows.is_empty() {
        return "-".to_owned();
    }
    match Windows::parse(&app.spec.maintenance_windows).map(|w| w.at(now)) {
        Err(_) => "invalid".to_owned(),
        Ok(WindowState::Unrestricted) => "-".to_owned(),
        Ok(WindowState::Open { closes }) => format!("open (closes in {})", age::short(closes.duration_since(now))),
        Ok(WindowState::Closed { opens, .. }) => format!("in {}", age::short(opens.duration_since(now))),
    }
}

/// The table of `rows`; the namespace column only across namespaces.
pub fn render(rows: &[AppRow], all_namespaces: bool) -> String {
    let mut headers = vec![
        "NAME",
        "ENGINE",
        "CHART",
        "DESIRED",
        "DEPLOYED",
        "READY",
        "REASON",
        "LAST BACKUP",
        "NEXT WINDOW",
    ];
    if all_namespaces {
        headers.insert(0, "NAMESPACE");
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut cells = vec![
                r.name.clone(),
                r.engine.clone(),
                r.chart.clone(),
                r.desired.clone(),
                r.deployed.clone(),
                r.ready.clone(),
                r.reason.clone(),
                r.last_backup.clone(),
                r.next_window.clone(),
            ];
            if all_namespaces {
                cells.insert(0, r.namespace.clone());
            }
            cells
        })
        .collect();
    table::render(&headers, &cells)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: &str = "2026-11-27T12:00:00Z";

    fn now() -> Timestamp {
        NOW.parse().unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn app(extra_spec: serde_json::Value, status: serde_json::Value) -> ApplicationInstance {
        let mut spec = json!({"chart": {"name": "nextcloud", "version": "6.2.0"}});
        if let (Some(spec), serde_json::Value::Object(extra)) = (spec.as_object_mut(), extra_spec) {
            spec.extend(extra);
        }
        serde_json::from_value(json!({
            "apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance",
            "metadata": {"name": "wiki", "namespace": "team-a"},
            "spec": spec, "status": status,
        }))
        .unwrap_or_else(|e| panic!("fixture: {e}"))
    }

    fn backup(name: &str, app: &str, phase: &str, completed: &str, duplicate_of: Option<&str>) -> Operation {
        serde_json::from_value(json!({
            "apiVersion": "vworkspace.io/v1alpha1", "kind": "Operation",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"type": "Backup", "applicationRef": {"name": app}, "requestId": name},
            "status": {"phase": phase, "completionTime": completed, "duplicateOf": duplicate_of},
        }))
        .unwrap_or_else(|e| panic!("fixture: {e}"))
    }

    #[test]
    fn a_ready_app_shows_engine_versions_and_reason() {
        let app = app(
            json!({}),
            json!({
                "engine": "flux", "deployedChartVersion": "6.1.0",
                "conditions": [{"type": "Ready", "status": "True", "reason": "InstallSucceeded",
                                "message": "ok", "lastTransitionTime": NOW}],
            }),
        );
        let row = row(&app, &[], now());
        assert_eq!(
            (
                row.engine.as_str(),
                row.chart.as_str(),
                row.desired.as_str(),
                row.deployed.as_str()
            ),
            ("flux", "nextcloud", "6.2.0", "6.1.0")
        );
        assert_eq!((row.ready.as_str(), row.reason.as_str()), ("True", "InstallSucceeded"));
        assert_eq!((row.last_backup.as_str(), row.next_window.as_str()), ("-", "-"));
    }

    #[test]
    fn an_app_relays_its_engine_once_it_shows_the_engines_reason_or_its_own() {
        let with_ready = |status: &str, reason: &str| {
            app(
                json!({}),
                json!({"conditions": [{"type": "Ready", "status": status, "reason": reason,
                                       "message": "", "lastTransitionTime": NOW}]}),
            )
        };
        let flux = Some("UpgradeSucceeded");
        let cases = [
            (with_ready("True", "UpgradeSucceeded"), flux, true),
            // The app's own verdict stands in for the engine's.
            (with_ready("False", "InvalidSpec"), flux, true),
            (with_ready("Unknown", "WaitingForMaintenanceWindow"), flux, true),
            // Not relayed yet: still awaiting, or a reason Flux gave mid-way or before.
            (with_ready("Unknown", "AwaitingEngine"), flux, false),
            (with_ready("Unknown", "Progressing"), flux, false),
            (with_ready("True", "InstallSucceeded"), flux, false),
            // Argo CD: the app's reason is derived, so anything but awaiting counts.
            (with_ready("Unknown", "OutOfSync"), None, true),
            (with_ready("True", "Healthy"), None, true),
            (with_ready("Unknown", "AwaitingEngine"), None, false),
            (app(json!({}), json!(null)), flux, false),
            (app(json!({}), json!(null)), None, false),
        ];
        for (app, engine_reason, expected) in cases {
            let ready = app
                .status
                .as_ref()
                .and_then(|s| condition(&s.conditions, "Ready"))
                .cloned();
            assert_eq!(
                relays_engine(&app, engine_reason),
                expected,
                "{ready:?} vs engine {engine_reason:?}"
            );
        }
    }

    #[test]
    fn an_app_without_status_shows_dashes_and_its_declared_engine() {
        let row = row(&app(json!({"engine": "argocd"}), json!(null)), &[], now());
        assert_eq!(
            (row.engine.as_str(), row.deployed.as_str(), row.ready.as_str()),
            ("argocd", "-", "-")
        );
    }

    #[test]
    fn the_last_backup_is_the_newest_success_of_this_app_or_its_schedule() {
        let ops = [
            backup("b1", "wiki", "Succeeded", "2026-11-27T09:00:00Z", None),
            backup("b2", "wiki", "Failed", "2026-11-27T11:30:00Z", None),
            backup("b3", "blog", "Succeeded", "2026-11-27T11:50:00Z", None),
            backup("b4", "wiki", "Succeeded", "2026-11-27T11:40:00Z", Some("b1")),
        ];
        let plain = app(json!({}), json!({}));
        assert_eq!(row(&plain, &ops, now()).last_backup, "3h ago");
        let scheduled = app(
            json!({}),
            json!({"backupSchedule": {"lastSuccessfulTime": "2026-11-27T11:00:00Z"}}),
        );
        assert_eq!(row(&scheduled, &ops, now()).last_backup, "60m ago");
    }

    #[test]
    fn the_window_column_says_when_changes_may_next_start() {
        // 2026-11-27 is a Friday.
        let closed = app(
            json!({"maintenanceWindows": [{"days": ["Saturday"], "start": "02:00", "duration": "2h"}]}),
            json!({}),
        );
        assert_eq!(next_window(&closed, now()), "in 14h");
        let open = app(
            json!({"maintenanceWindows": [{"days": ["Friday"], "start": "11:00", "duration": "3h"}]}),
            json!({}),
        );
        assert_eq!(next_window(&open, now()), "open (closes in 120m)");
        let invalid = app(
            json!({"maintenanceWindows": [{"days": ["Friday"], "start": "25:00", "duration": "3h"}]}),
            json!({}),
        );
        assert_eq!(next_window(&invalid, now()), "invalid");
    }

    #[test]
    fn across_namespaces_the_table_leads_with_the_namespace() {
        let rows = [row(&app(json!({}), json!(null)), &[], now())];
        let all = render(&rows, true);
        assert!(all.starts_with("NAMESPACE  NAME  ENGINE"), "{all}");
        assert!(
            all.lines().nth(1).is_some_and(|l| l.starts_with("team-a     wiki  -")),
            "{all}"
        );
        assert!(render(&rows, false).starts_with("NAME  ENGINE"));
    }
}
