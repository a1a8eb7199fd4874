//! `kubectl vws history`: the application's revisions, newest first, each with the
//! Operations that caused it (the audit trail).
//!
//! A revision is caused by an Upgrade, Rollback or Restore Operation of the application that
//! was running when the revision was deployed (started at or before `deployedAt`, not
//! completed before it). A revision no Operation explains came from a change of the
//! ApplicationInstance itself (Odoo's intent, or a kubectl edit): `spec change`.

use api::{ApplicationInstance, Operation, OperationType};
use jiff::Timestamp;
use kube::ResourceExt;

use crate::table;

/// One revision and what caused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    pub revision: i64,
    pub chart: String,
    pub app_version: String,
    pub status: String,
    pub deployed_at: Option<Timestamp>,
    /// `Type/name (requestId)` of each Operation that caused it; empty: a spec change.
    pub caused_by: Vec<String>,
}

/// The revisions of `app`, newest first, joined with `operations` (any; those of other
/// applications are ignored).
pub fn revisions(app: &ApplicationInstance, operations: &[Operation]) -> Vec<Revision> {
    let namespace = app.namespace();
    let name = app.name_any();
    let candidates: Vec<&Operation> = operations
        .iter()
        .filter(|op| op.namespace() == namespace && op.spec.application_ref.name == name)
        .filter(|op| {
            matches!(
                op.spec.type_,
                OperationType::Upgrade | OperationType::Rollback | OperationType::Restore
            )
        })
        .collect();
    let mut out: Vec<Revision> = app
        .status
        .iter()
        .flat_map(|s| &s.history)
        .map(|record| {
            let deployed_at = record.deployed_at.as_ref().map(|t| t.0);
            let caused_by = deployed_at
                .map(|at| {
                    candidates
                        .iter()
                        .filter(|op| was_running_at(op, at))
                        .map(|op| format!("{}/{} ({})", op.spec.type_.as_str(), op.name_any(), op.spec.request_id))
                        .collect()
                })
                .unwrap_or_default();
            Revision {
                revision: record.revision,
                chart: match &record.chart_name {
                    Some(chart) => format!("{chart}-{}", record.chart_version),
                    None => record.chart_version.clone(),
                },
                app_version: table::or_dash(record.app_version.as_deref()),
                status: record.status.clone(),
                deployed_at,
                caused_by,
            }
        })
        .collect();
    out.sort_by_key(|r| std::cmp::Reverse(r.revision));
    out
}

fn was_running_at(op: &Operation, at: Timestamp) -> bool {
    let Some(status) = &op.status else { return false };
    let started = status.start_time.as_ref().is_some_and(|t| t.0 <= at);
    let not_done_before = status.completion_time.as_ref().is_none_or(|t| t.0 >= at);
    started && not_done_before
}

/// The history table.
pub fn render(revisions: &[Revision]) -> String {
    let rows: Vec<Vec<String>> = revisions
        .iter()
        .map(|r| {
            vec![
                r.revision.to_string(),
                r.chart.clone(),
                r.app_version.clone(),
                r.status.clone(),
                r.deployed_at.map_or_else(|| "-".to_owned(), |t| t.to_string()),
                if r.caused_by.is_empty() {
                    "spec change".to_owned()
                } else {
                    r.caused_by.join(", ")
                },
            ]
        })
        .collect();
    table::render(
        &["REVISION", "CHART", "APP VERSION", "STATUS", "DEPLOYED", "CAUSED BY"],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn app() -> ApplicationInstance {
        serde_json::from_value(json!({
            "apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance",
            "metadata": {"name": "wiki", "namespace": "team-a"},
            "spec": {"chart": {"name": "wiki"}},
            "status": {"history": [
                {"revision": 1, "chartName": "wiki", "chartVersion": "1.0.0", "appVersion": "1.0",
                 "status": "superseded", "deployedAt": "2026-11-27T10:00:00Z"},
                {"revision": 3, "chartName": "wiki", "chartVersion": "1.0.0",
                 "status": "deployed", "deployedAt": "2026-11-27T11:00:30Z"},
                {"revision": 2, "chartName": "wiki", "chartVersion": "1.1.0", "appVersion": "1.1",
                 "status": "superseded", "deployedAt": "2026-11-27T10:30:10Z"},
            ]},
        }))
        .unwrap_or_else(|e| panic!("fixture: {e}"))
    }

    fn op(name: &str, type_: &str, app: &str, start: &str, end: Option<&str>) -> Operation {
        serde_json::from_value(json!({
            "apiVersion": "vworkspace.io/v1alpha1", "kind": "Operation",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"type": type_, "applicationRef": {"name": app}, "requestId": format!("odoo-{name}")},
            "status": {"phase": if end.is_some() { "Succeeded" } else { "Running" },
                       "startTime": start, "completionTime": end},
        }))
        .unwrap_or_else(|e| panic!("fixture: {e}"))
    }

    #[test]
    fn revisions_are_newest_first_with_the_operations_that_caused_them() {
        let ops = [
            op(
                "up",
                "Upgrade",
                "wiki",
                "2026-11-27T10:30:00Z",
                Some("2026-11-27T10:31:00Z"),
            ),
            op("rb", "Rollback", "wiki", "2026-11-27T11:00:00Z", None),
            // Not causes: a backup during the upgrade, another app's upgrade, an upgrade after.
            op(
                "bk",
                "Backup",
                "wiki",
                "2026-11-27T10:30:00Z",
                Some("2026-11-27T10:31:00Z"),
            ),
            op(
                "other",
                "Upgrade",
                "blog",
                "2026-11-27T10:30:00Z",
                Some("2026-11-27T10:31:00Z"),
            ),
            op("late", "Upgrade", "wiki", "2026-11-27T11:30:00Z", None),
        ];
        let revisions = revisions(&app(), &ops);
        let summary: Vec<(i64, &str, Vec<String>)> = revisions
            .iter()
            .map(|r| (r.revision, r.chart.as_str(), r.caused_by.clone()))
            .collect();
        assert_eq!(
            summary,
            vec![
                (3, "wiki-1.0.0", vec!["Rollback/rb (odoo-rb)".to_owned()]),
                (2, "wiki-1.1.0", vec!["Upgrade/up (odoo-up)".to_owned()]),
                (1, "wiki-1.0.0", vec![]),
            ]
        );
        let table = render(&revisions);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("REVISION  CHART"), "{table}");
        assert!(
            lines[1].starts_with("3") && lines[1].ends_with("Rollback/rb (odoo-rb)"),
            "{table}"
        );
        assert!(lines[3].ends_with("spec change"), "{table}");
    }

    #[test]
    fn an_app_without_history_has_no_revisions() {
        let mut app = app();
        app.status = None;
        assert!(revisions(&app, &[]).is_empty());
        assert_eq!(render(&[]).lines().count(), 1);
    }
}
