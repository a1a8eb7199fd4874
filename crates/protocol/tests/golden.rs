//! Golden JSON files: one per message of the protocol (`tests/golden/*.json`). They are
//! the examples of docs/connectivity/protocol.md, and what the Odoo module's tests can
//! replay. Each test builds the message in Rust, compares it with the file, and checks
//! that the file parses back into the same message.
//!
//! `UPDATE_GOLDEN=1 cargo test -p protocol --test golden` rewrites the files.

use std::path::PathBuf;

use jiff::Timestamp;
use protocol::{
    error::{OdooError, names},
    *,
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn golden<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(file: &str, message: &T) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(file);
    let built = serde_json::to_value(message).unwrap();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&built).unwrap() + "\n").unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let on_disk: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(built, on_disk, "{file} differs from the message built in Rust");
    let parsed: T = serde_json::from_value(on_disk).unwrap();
    assert_eq!(&parsed, message, "{file} does not parse back into the same message");
}

fn cluster() -> ClusterIdentity {
    ClusterIdentity {
        uid: "5f0c2a8e-8d7c-4a39-9f5e-0a1b2c3d4e5f".into(),
        name: "edge-paris-1".into(),
    }
}

fn cond(type_: &str, status: &str, reason: &str, message: &str, at: &str, generation: i64) -> ReportCondition {
    ReportCondition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: ts(at),
        observed_generation: Some(generation),
    }
}

fn app_report() -> ObjectReport {
    ObjectReport {
        kind: ObjectKind::ApplicationInstance,
        namespace: "team-a".into(),
        name: "wiki".into(),
        uid: Some("0d9b3c1e-1111-4e7a-9c55-6f1f0e2d3c4b".into()),
        state: ObjectState::Ready,
        generation: Some(2),
        observed_generation: Some(2),
        resource_version: Some("48213".into()),
        managed_by_agent: true,
        conditions: vec![
            cond(
                "Ready",
                "True",
                "UpgradeSucceeded",
                "Helm upgrade succeeded for release team-a/wiki.v2 with chart wiki@1.2.3",
                "2026-11-21T10:04:12Z",
                2,
            ),
            cond(
                "Released",
                "True",
                "UpgradeSucceeded",
                "Helm upgrade succeeded",
                "2026-11-21T10:04:12Z",
                2,
            ),
        ],
        phase: None,
        result: None,
        start_time: None,
        completion_time: None,
        request_id: None,
        deployed_chart_version: Some("1.2.3".into()),
        desired_chart_version: Some("1.2.3".into()),
        backup_schedule: None,
        verification: None,
        created_at: Some(ts("2026-11-20T08:00:00Z")),
        observed_at: ts("2026-11-21T10:04:13Z"),
    }
}

fn op_report() -> ObjectReport {
    ObjectReport {
        kind: ObjectKind::Operation,
        namespace: "team-a".into(),
        name: "wiki-reindex-7".into(),
        uid: Some("7a1e2b3c-2222-4d5e-8f90-a1b2c3d4e5f6".into()),
        state: ObjectState::Succeeded,
        generation: Some(1),
        observed_generation: Some(1),
        resource_version: Some("48302".into()),
        managed_by_agent: true,
        conditions: vec![cond(
            "Succeeded",
            "True",
            "Completed",
            "Job wiki-reindex-7 completed",
            "2026-11-21T10:06:40Z",
            1,
        )],
        phase: Some("Succeeded".into()),
        result: Some("Job wiki-reindex-7 completed".into()),
        start_time: Some(ts("2026-11-21T10:06:01Z")),
        completion_time: Some(ts("2026-11-21T10:06:40Z")),
        request_id: Some("odoo-op-7".into()),
        deployed_chart_version: None,
        desired_chart_version: None,
        backup_schedule: None,
        verification: None,
        created_at: Some(ts("2026-11-21T10:06:00Z")),
        observed_at: ts("2026-11-21T10:06:41Z"),
    }
}

fn document() -> DesiredState {
    serde_json::from_value(json!({
        "epoch": "c7-20261120",
        "revision": 12,
        "generated_at": "2026-11-21T10:05:00Z",
        "applications": [{
            "namespace": "team-a",
            "name": "wiki",
            "spec": {
                "chart": {"name": "wiki", "version": "1.2.3",
                          "repository": {"url": "https://charts.example.com", "interval": "1h"}},
                "values": {"replicaCount": 2, "ingress": {"host": "wiki.example.com"}},
                "valuesFrom": [{"kind": "Secret", "name": "wiki-db"}],
                "timeout": "5m"
            }
        }],
        "operations": [{
            "namespace": "team-a",
            "name": "wiki-reindex-7",
            "spec": {
                "type": "Runbook",
                "applicationRef": {"name": "wiki"},
                "requestId": "odoo-op-7",
                "notBefore": "2026-11-21T10:06:00Z",
                "deadline": "2026-11-21T12:00:00Z",
                "runbook": {"job": {"backoffLimit": 0, "template": {"spec": {"containers": [
                    {"name": "main", "image": "registry.example.com/wiki-tools:1.2", "command": ["reindex"]}]}}}}
            }
        }],
        "deletions": [{
            "kind": "ApplicationInstance",
            "namespace": "team-a",
            "name": "old-blog",
            "uid": "3c2b1a00-3333-4bcd-9e8f-0123456789ab",
            "reason": "Subscription ended (Odoo sale.order S00042)"
        }]
    }))
    .unwrap()
}

#[test]
fn register_params() {
    golden(
        "register_params.json",
        &RegisterParams {
            protocol_version: PROTOCOL_VERSION,
            cluster: cluster(),
            agent: AgentInfo {
                version: "0.1.0".into(),
                instance: "agent-7d9f8b6c5-x2x9q".into(),
                mode: AgentMode::Pull,
                started_at: ts("2026-11-21T10:00:00Z"),
            },
            allowed_namespaces: vec!["team-a".into(), "team-b".into()],
            capabilities: vec!["conflict_report".into(), "deletions".into()],
        },
    );
}

#[test]
fn register_result() {
    golden(
        "register_result.json",
        &RegisterResult {
            protocol_version: PROTOCOL_VERSION,
            cluster_id: 7,
            server_time: ts("2026-11-21T10:00:01Z"),
            sync_interval_seconds: Some(30),
            max_reports_per_sync: Some(200),
        },
    );
}

#[test]
fn sync_params_full_resync_after_start() {
    golden(
        "sync_params_resync.json",
        &SyncParams {
            protocol_version: PROTOCOL_VERSION,
            cluster_uid: cluster().uid,
            agent_instance: "agent-7d9f8b6c5-x2x9q".into(),
            known: None,
            acks: vec![],
            reports: vec![app_report(), op_report()],
            resync: Some(ResyncMarker {
                id: "agent-7d9f8b6c5-x2x9q-1".into(),
                batch: 0,
                last_batch: true,
            }),
            more: false,
            last_error: None,
        },
    );
}

#[test]
fn sync_params_delta_with_acks() {
    let ack = DocumentAck {
        epoch: "c7-20261120".into(),
        revision: 12,
        outcome: DocumentOutcome::Applied,
        reason: None,
        message: None,
        processed_at: ts("2026-11-21T10:05:31Z"),
        objects: vec![
            ObjectAck {
                kind: ObjectKind::ApplicationInstance,
                namespace: "team-a".into(),
                name: "wiki".into(),
                outcome: ObjectOutcome::Conflict,
                reason: Some(reasons::OWNED_BY_OPERATION.into()),
                message: Some("spec.chart.version and spec.values are owned by vworkspace-upgrade-engine; the rest of the spec was applied".into()),
                uid: Some("0d9b3c1e-1111-4e7a-9c55-6f1f0e2d3c4b".into()),
                generation: Some(3),
                conflict: Some(ConflictReport {
                    fields: vec!["spec.chart.version".into(), "spec.values".into()],
                    managers: vec!["vworkspace-upgrade-engine".into()],
                    chart_version_in_force: Some("1.3.0".into()),
                    values_in_force: Some(json!({"replicaCount": 3, "ingress": {"host": "wiki.example.com"}})),
                    revision_in_effect: Some(4),
                    operation: Some("wiki-upgrade-3".into()),
                }),
            },
            ObjectAck {
                kind: ObjectKind::Operation,
                namespace: "team-a".into(),
                name: "wiki-reindex-7".into(),
                outcome: ObjectOutcome::Applied,
                reason: None,
                message: None,
                uid: Some("7a1e2b3c-2222-4d5e-8f90-a1b2c3d4e5f6".into()),
                generation: Some(1),
                conflict: None,
            },
            ObjectAck {
                kind: ObjectKind::ApplicationInstance,
                namespace: "team-a".into(),
                name: "old-blog".into(),
                outcome: ObjectOutcome::Deleted,
                reason: None,
                message: Some("deleted: Subscription ended (Odoo sale.order S00042)".into()),
                uid: None,
                generation: None,
                conflict: None,
            },
        ],
    };
    let mut refused = ack.clone();
    refused.revision = 13;
    refused.objects = vec![ObjectAck {
        kind: ObjectKind::ApplicationInstance,
        namespace: "kube-system".into(),
        name: "miner".into(),
        outcome: ObjectOutcome::Refused,
        reason: Some(reasons::NAMESPACE_NOT_ALLOWED.into()),
        message: Some("namespace \"kube-system\" is not in the agent's allow-list".into()),
        uid: None,
        generation: None,
        conflict: None,
    }];
    let mut report = op_report();
    report.state = ObjectState::Running;
    report.phase = Some("Running".into());
    report.completion_time = None;
    report.result = None;
    report.conditions = vec![cond(
        "Succeeded",
        "Unknown",
        "Running",
        "Job wiki-reindex-7 is running",
        "2026-11-21T10:06:01Z",
        1,
    )];
    golden(
        "sync_params_delta.json",
        &SyncParams {
            protocol_version: PROTOCOL_VERSION,
            cluster_uid: cluster().uid,
            agent_instance: "agent-7d9f8b6c5-x2x9q".into(),
            known: Some(Cursor {
                epoch: "c7-20261120".into(),
                revision: 13,
            }),
            acks: vec![ack, refused],
            reports: vec![report],
            resync: None,
            more: false,
            last_error: Some(AgentError {
                reason: "Timeout".into(),
                message: "no answer from https://odoo.example.com within 15s".into(),
                since: ts("2026-11-21T10:05:32Z"),
                attempts: 3,
            }),
        },
    );
}

#[test]
fn sync_result_with_document() {
    golden(
        "sync_result_document.json",
        &SyncResult {
            protocol_version: PROTOCOL_VERSION,
            server_time: ts("2026-11-21T10:05:30Z"),
            desired: Some(document()),
            resync_requested: false,
            next_sync_seconds: Some(30),
            max_reports_per_sync: None,
        },
    );
}

#[test]
fn sync_result_up_to_date() {
    golden(
        "sync_result_up_to_date.json",
        &SyncResult {
            protocol_version: PROTOCOL_VERSION,
            server_time: ts("2026-11-21T10:06:00Z"),
            desired: None,
            resync_requested: false,
            next_sync_seconds: None,
            // 1.4: the limit in force, so a lowered one reaches the agent at its next call.
            max_reports_per_sync: Some(200),
        },
    );
}

#[test]
fn document_ack_refused_whole() {
    golden(
        "document_ack_refused.json",
        &DocumentAck {
            epoch: "c7-20261120".into(),
            revision: 14,
            outcome: DocumentOutcome::Refused,
            reason: Some(reasons::INVALID_DOCUMENT.into()),
            message: Some("applications[1]: ApplicationInstance/team-a/wiki appears more than once".into()),
            processed_at: ts("2026-11-21T10:07:00Z"),
            objects: vec![],
        },
    );
}

/// An Operation without `deadline` from a document generated more than an hour before the
/// agent processed it: not created (protocol.md, the document's rules; `protocol::lateness`).
#[test]
fn document_ack_undated_operation_too_late() {
    let generated_at = ts("2026-11-21T08:00:00Z");
    let processed_at = ts("2026-11-21T10:07:00Z");
    let late =
        protocol::lateness::undated_operation_too_late(None, Some(generated_at), processed_at).expect("two hours old");
    golden(
        "document_ack_undated_operation_expired.json",
        &DocumentAck {
            epoch: "c7-20261120".into(),
            revision: 15,
            outcome: DocumentOutcome::Applied,
            reason: None,
            message: None,
            processed_at,
            objects: vec![ObjectAck {
                kind: ObjectKind::Operation,
                namespace: "team-a".into(),
                name: "wiki-restart-db".into(),
                outcome: ObjectOutcome::Refused,
                reason: Some(late.reason.into()),
                message: Some(late.message),
                uid: None,
                generation: None,
                conflict: None,
            }],
        },
    );
}

#[test]
fn errors() {
    golden(
        "error_unauthorized.json",
        &OdooError::new(names::UNAUTHORIZED, "Invalid apikey", Some(401)),
    );
    golden(
        "error_protocol_version_mismatch.json",
        &OdooError::new(
            names::PROTOCOL_VERSION_MISMATCH,
            "protocol version 2.0 is not supported; this server speaks 1.x",
            None,
        ),
    );
    golden(
        "error_cluster_mismatch.json",
        &OdooError::new(
            names::CLUSTER_MISMATCH,
            "this API key belongs to cluster edge-paris-1 (uid 5f0c2a8e-8d7c-4a39-9f5e-0a1b2c3d4e5f)",
            None,
        ),
    );
    golden(
        "error_not_registered.json",
        &OdooError::new(names::CLUSTER_NOT_REGISTERED, "call agent_register first", None),
    );
    golden(
        "error_invalid_params.json",
        &OdooError::new(
            names::INVALID_PARAMS,
            "reports: at most 200 reports per call (got 350)",
            None,
        ),
    );
}

#[test]
fn the_golden_document_is_valid_and_deletes_only_what_it_names() {
    let doc = document();
    protocol::validate::validate_document(&doc).unwrap();
    let deletes: Vec<_> = protocol::plan::plan(&doc, |_| true)
        .into_iter()
        .filter_map(|a| match a {
            protocol::plan::Action::Delete(d) => Some(d.name.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(deletes, ["old-blog"]);
}

#[test]
fn unknown_fields_and_values_are_tolerated() {
    // A newer minor version may add fields and enum values: an older agent still parses.
    let mut v = serde_json::to_value(SyncResult {
        protocol_version: "1.4".parse().unwrap(),
        server_time: ts("2026-11-21T10:06:00Z"),
        desired: Some(document()),
        resync_requested: false,
        next_sync_seconds: None,
        max_reports_per_sync: None,
    })
    .unwrap();
    v["brand_new_field"] = json!({"x": 1});
    v["desired"]["applications"][0]["priority"] = json!("high");
    let parsed: SyncResult = serde_json::from_value(v).unwrap();
    assert!(parsed.protocol_version.is_compatible_with(PROTOCOL_VERSION));
    let ack: ObjectAck = serde_json::from_value(json!({"kind": "Operation", "namespace": "a", "name": "b",
        "outcome": "postponed"}))
    .unwrap();
    assert_eq!(ack.outcome, ObjectOutcome::Unknown);
}

/// Protocol 1.1: an application with a backup schedule, as Odoo sends it.
fn document_with_backup_schedule() -> DesiredState {
    serde_json::from_value(json!({
        "epoch": "c7-20261120",
        "revision": 13,
        "generated_at": "2026-11-25T09:00:00Z",
        "applications": [{
            "namespace": "team-a",
            "name": "wiki",
            "spec": {
                "chart": {"name": "wiki", "version": "1.2.3",
                          "repository": {"url": "https://charts.example.com", "interval": "1h"}},
                "backupSchedule": {
                    "cron": "0 2 * * *",
                    "timeZone": "Europe/Brussels",
                    "keepLast": 7,
                    "ttl": "720h",
                    "missedRunPolicy": "RunOnce",
                    "startingDeadlineSeconds": 3600,
                    "backup": {"includeVolumes": true, "volumeMethod": "FileSystem"}
                }
            }
        }],
        "operations": [],
        "deletions": []
    }))
    .unwrap()
}

#[test]
fn sync_result_with_a_backup_schedule() {
    let doc = document_with_backup_schedule();
    protocol::validate::validate_document(&doc).unwrap();
    golden(
        "sync_result_document_backup_schedule.json",
        &SyncResult {
            protocol_version: protocol::schedule::SINCE,
            server_time: ts("2026-11-25T09:00:05Z"),
            desired: Some(doc),
            resync_requested: false,
            next_sync_seconds: Some(30),
            max_reports_per_sync: None,
        },
    );
}

#[test]
fn report_of_an_application_with_a_backup_schedule() {
    let mut report = app_report();
    report.backup_schedule = Some(protocol::schedule::BackupScheduleReport {
        scheduled: "True".into(),
        reason: Some("Scheduled".into()),
        message: Some("Backups run at 0 2 * * * in Europe/Brussels".into()),
        last_schedule_time: Some(ts("2026-11-25T01:00:00Z")),
        last_successful_time: Some(ts("2026-11-25T01:03:12Z")),
        last_skipped_time: None,
        next_schedule_time: Some(ts("2026-11-26T01:00:00Z")),
        active: None,
        kept_backups: vec![
            "team-a-wiki-backup-202611250100-5c1d0e9a7b".into(),
            "team-a-wiki-backup-202611240100-0f3a2b1c4d".into(),
        ],
    });
    golden("report_application_backup_schedule.json", &report);
}

/// Protocol 1.2: an application with a maintenance window, as Odoo sends it.
fn document_with_maintenance_windows() -> DesiredState {
    serde_json::from_value(json!({
        "epoch": "c7-20261120",
        "revision": 14,
        "generated_at": "2026-11-26T09:00:00Z",
        "applications": [{
            "namespace": "team-a",
            "name": "wiki",
            "spec": {
                "chart": {"name": "wiki", "version": "1.3.0",
                          "repository": {"url": "https://charts.example.com", "interval": "1h"}},
                "maintenanceWindows": [{
                    "days": ["Saturday", "Sunday"],
                    "start": "02:00",
                    "duration": "2h",
                    "timeZone": "Europe/Brussels"
                }]
            }
        }],
        "operations": [],
        "deletions": []
    }))
    .unwrap()
}

#[test]
fn sync_result_with_maintenance_windows() {
    let doc = document_with_maintenance_windows();
    protocol::validate::validate_document(&doc).unwrap();
    assert_eq!(doc.applications[0].spec.maintenance_windows.len(), 1);
    golden(
        "sync_result_document_maintenance_windows.json",
        &SyncResult {
            protocol_version: protocol::maintenance::SINCE,
            server_time: ts("2026-11-26T09:00:05Z"),
            desired: Some(doc),
            resync_requested: false,
            next_sync_seconds: Some(30),
            max_reports_per_sync: None,
        },
    );
}

/// Protocol 1.3: an application declaring how a copy of it is checked, and a verified
/// restore of its nightly backup, as Odoo sends them.
fn document_with_a_verified_restore() -> DesiredState {
    serde_json::from_value(json!({
        "epoch": "c7-20261120",
        "revision": 15,
        "generated_at": "2026-11-26T09:00:00Z",
        "applications": [{
            "namespace": "team-a",
            "name": "wiki",
            "spec": {
                "chart": {"name": "wiki", "version": "1.3.0",
                          "repository": {"url": "https://charts.example.com", "interval": "1h"}},
                "restoreVerification": {
                    "timeoutSeconds": 300,
                    "job": {
                        "backoffLimit": 0,
                        "template": {"spec": {"containers": [{
                            "name": "check",
                            "image": "registry.example.com/wiki-check:1",
                            "command": ["sh", "-c", "wget -qO- http://wiki.$VWS_VERIFY_NAMESPACE.svc/health"]
                        }]}}
                    }
                }
            }
        }],
        "operations": [{
            "namespace": "team-a",
            "name": "wiki-verify-20261126",
            "spec": {
                "type": "Restore",
                "applicationRef": {"name": "wiki"},
                "requestId": "odoo-op-31",
                "restore": {"source": {"operationName": "wiki-backup-20261126"}, "verify": true}
            }
        }],
        "deletions": []
    }))
    .unwrap()
}

#[test]
fn sync_result_with_a_verified_restore() {
    let doc = document_with_a_verified_restore();
    protocol::validate::validate_document(&doc).unwrap();
    assert!(doc.applications[0].spec.restore_verification.is_some());
    assert!(
        doc.operations[0]
            .spec
            .restore
            .as_ref()
            .is_some_and(api::RestoreParams::verifies)
    );
    golden(
        "sync_result_document_verified_restore.json",
        &SyncResult {
            protocol_version: protocol::verification::SINCE,
            server_time: ts("2026-11-26T09:00:05Z"),
            desired: Some(doc),
            resync_requested: false,
            next_sync_seconds: Some(30),
            max_reports_per_sync: None,
        },
    );
}

#[test]
fn report_of_a_verified_restore() {
    let mut report = op_report();
    report.name = "wiki-verify-20261126".into();
    report.request_id = Some("odoo-op-31".into());
    let message = "verification of Velero Backup team-a-wiki-backup-20261126-3f2a1b passed: Velero Restore \
                   velero/team-a-wiki-verify-20261126-9c1e2d completed (0 warnings, 0 errors); ready: Deployment/wiki; \
                   Job vws-verify-0b1c2d3e4f/vworkspace-verification completed (1 succeeded pods); scratch namespace \
                   vws-verify-0b1c2d3e4f removed";
    report.conditions = vec![cond(
        "Succeeded",
        "True",
        "Completed",
        message,
        "2026-11-26T09:04:10Z",
        1,
    )];
    report.result = Some(message.into());
    // The times of this Operation (the shared `op_report` is of 2026-11-21): requested,
    // started, and Succeeded at its completion.
    report.created_at = Some(ts("2026-11-26T09:03:20Z"));
    report.start_time = Some(ts("2026-11-26T09:03:21Z"));
    report.completion_time = Some(ts("2026-11-26T09:04:10Z"));
    report.observed_at = ts("2026-11-26T09:04:11Z");
    report.verification = Some(protocol::verification::VerificationReport {
        passed: true,
        message: "Velero Restore velero/team-a-wiki-verify-20261126-9c1e2d completed (0 warnings, 0 errors); ready: \
                  Deployment/wiki; Job vws-verify-0b1c2d3e4f/vworkspace-verification completed (1 succeeded pods)"
            .into(),
        backup: "team-a-wiki-backup-20261126-3f2a1b".into(),
        scratch_namespace: "vws-verify-0b1c2d3e4f".into(),
        scratch_namespace_removed: true,
        items_restored: Some(23),
        volumes_restored: Some(1),
        workloads_ready: vec!["Deployment/wiki".into()],
        job: Some("vws-verify-0b1c2d3e4f/vworkspace-verification".into()),
    });
    golden("report_operation_verified_restore.json", &report);
}

/// Protocol 1.5: an application whose chart's Helm tests run after every install and upgrade,
/// a failing test failing the application.
#[test]
fn sync_result_with_helm_tests() {
    let doc: DesiredState = serde_json::from_value(json!({
        "epoch": "c7-20261120",
        "revision": 16,
        "generated_at": "2026-11-27T09:00:00Z",
        "applications": [{
            "namespace": "team-a",
            "name": "wiki",
            "spec": {
                "chart": {"name": "wiki", "version": "1.3.0",
                          "repository": {"url": "https://charts.example.com", "interval": "1h"}},
                "test": {"timeout": "2m"}
            }
        }],
        "operations": [],
        "deletions": []
    }))
    .unwrap();
    protocol::validate::validate_document(&doc).unwrap();
    let test = doc.applications[0].spec.test.as_ref().expect("spec.test");
    assert!(test.enabled() && !test.ignore_failures);
    golden(
        "sync_result_document_helm_tests.json",
        &SyncResult {
            protocol_version: protocol::release_test::SINCE,
            server_time: ts("2026-11-27T09:00:05Z"),
            desired: Some(doc),
            resync_requested: false,
            next_sync_seconds: Some(30),
            max_reports_per_sync: None,
        },
    );
}
