//! The Upgrade and Rollback machines, one table row per transition: an observation in, the
//! stage `determine_state` finds and the action `next_action` returns out.

use std::collections::BTreeMap;

use api::{
    ApplicationInstance, ApplicationInstanceSpec, ApplicationInstanceStatus, ChartSpec, ObjectReference, Operation,
    OperationPhase, OperationType, RollbackParams, SourceKind, SourceReference, UpgradeFailurePolicy, UpgradeParams,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

use super::rollback;
use super::upgrade::{self, ChildState, ChildStatus, UpgradeChild};
use super::{ReleaseAction, history_reference, operation_reference};
use crate::meta::OpId;
use crate::revisions::{self, AppRevision};
use crate::status::Outcome;
use crate::{Error, release};

const NOW: &str = "2026-12-01T02:00:00Z";

fn now() -> Timestamp {
    NOW.parse().expect("timestamp")
}

/// What Flux says about the application, as relayed on its status.
#[derive(Clone, Copy)]
enum Flux {
    /// The status is from an older generation.
    Behind,
    /// Ready at this chart version.
    Ready(&'static str),
    /// Released=False, Ready=False, not reconciling: `UpgradeFailed`, "boom".
    Failed,
}

/// The ApplicationInstance `team-a/nextcloud` asking for `version` with `values`.
fn app(version: &str, values: Value, flux: Flux) -> ApplicationInstance {
    let mut app = ApplicationInstance::new(
        "nextcloud",
        ApplicationInstanceSpec {
            chart: ChartSpec {
                name: "nextcloud".into(),
                version: Some(version.into()),
                ..Default::default()
            },
            values: Some(values),
            ..Default::default()
        },
    );
    app.metadata.namespace = Some("team-a".into());
    app.metadata.uid = Some("uid-app".into());
    app.metadata.generation = Some(2);
    let condition = |type_: &str, status: &str, reason: &str, message: &str| Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: Some(2),
    };
    let (observed, deployed, conditions) = match flux {
        Flux::Behind => (1, "0.1.0", vec![condition("Ready", "True", "UpgradeSucceeded", "ok")]),
        Flux::Ready(deployed) => (2, deployed, vec![condition("Ready", "True", "UpgradeSucceeded", "ok")]),
        Flux::Failed => (
            2,
            "0.1.0",
            vec![
                condition("Ready", "False", "UpgradeFailed", "boom"),
                condition("Released", "False", "UpgradeFailed", "boom"),
            ],
        ),
    };
    app.status = Some(ApplicationInstanceStatus {
        observed_generation: Some(observed),
        deployed_chart_version: Some(deployed.into()),
        conditions,
        ..Default::default()
    });
    app
}

fn rev(number: i64, version: &str, values: Value, operation: Option<&str>) -> AppRevision {
    AppRevision {
        number,
        chart_version: version.into(),
        values,
        operation: operation.map(str::to_owned),
        at: Timestamp::UNIX_EPOCH,
    }
}

fn child(phase: Option<OperationPhase>, result: Option<&str>) -> ChildStatus {
    ChildStatus {
        phase,
        result: result.map(str::to_owned),
        annotations: BTreeMap::new(),
    }
}

/// The child Rollback of a failed upgrade, with Flux's cause in its annotations.
fn rollback_child(phase: Option<OperationPhase>, result: Option<&str>) -> ChildStatus {
    let mut status = child(phase, result);
    status.annotations = BTreeMap::from([
        (upgrade::ANNOTATION_CAUSE_REASON.to_owned(), "UpgradeFailed".to_owned()),
        (upgrade::ANNOTATION_CAUSE_MESSAGE.to_owned(), "boom".to_owned()),
    ]);
    status
}

fn running(message: &str, children: Vec<ObjectReference>) -> Outcome {
    Outcome::Running {
        message: message.into(),
        children,
    }
}

fn failed(reason: &str, message: &str, children: Vec<ObjectReference>) -> Outcome {
    Outcome::Failed {
        reason: reason.into(),
        message: message.into(),
        children,
        report: Default::default(),
    }
}

fn succeeded(result: &str, children: Vec<ObjectReference>) -> Outcome {
    Outcome::Succeeded {
        result: result.into(),
        children,
        report: Default::default(),
    }
}

fn report(outcome: Outcome) -> ReleaseAction {
    ReleaseAction::Report(outcome)
}

fn set_state(config_map: Option<Value>, version: &str, values: Value, then: Outcome) -> ReleaseAction {
    ReleaseAction::SetDesiredState {
        config_map,
        application: "nextcloud".into(),
        fields: json!({
            "metadata": {"annotations": {"vworkspace.io/operation-chart-version": version}},
            "spec": {"chart": {"version": version}, "values": values},
        }),
        then,
    }
}

fn config_map(history: &[AppRevision]) -> Value {
    revisions::history_config_map(&app("0.1.0", json!({}), Flux::Behind), history).expect("config map")
}

fn cm() -> ObjectReference {
    history_reference("nextcloud", "team-a")
}

fn op_ref(name: &str) -> ObjectReference {
    operation_reference(name, "team-a")
}

// ---------------------------------------------------------------- Upgrade

fn upgrade_op(params: Option<UpgradeParams>) -> Operation {
    let mut op = crate::meta::tests::op("up", OperationType::Upgrade);
    op.spec.upgrade = params;
    op
}

fn params(backup_first: bool, on_failure: Option<UpgradeFailurePolicy>) -> UpgradeParams {
    UpgradeParams {
        chart_version: "0.2.0".into(),
        values_patch: Some(json!({"replicas": 2})),
        backup_first: backup_first.then_some(true),
        backup: None,
        on_failure,
    }
}

/// One Upgrade transition.
struct UpgradeRow {
    name: &'static str,
    op: Operation,
    app: Option<ApplicationInstance>,
    backup: ChildState,
    rollback: Option<ChildStatus>,
    restore: ChildState,
    history: Result<Vec<AppRevision>, Error>,
    stage: &'static str,
    action: ReleaseAction,
}

impl UpgradeRow {
    /// An Upgrade to 0.2.0 (valuesPatch `replicas: 2`) of an application at 0.1.0 without
    /// history, nothing created yet; each row changes what it is about.
    fn new(name: &'static str, stage: &'static str, action: ReleaseAction) -> Self {
        Self {
            name,
            op: upgrade_op(Some(params(false, None))),
            app: Some(app("0.1.0", json!({}), Flux::Ready("0.1.0"))),
            backup: ChildState::Absent,
            rollback: None,
            restore: ChildState::Absent,
            history: Ok(Vec::new()),
            stage,
            action,
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Self)) -> Self {
        change(&mut self);
        self
    }
}

fn upgrade_stage(stage: &upgrade::Stage) -> &'static str {
    use upgrade::Stage::*;
    match stage {
        Refused(_) => "Refused",
        BackupToCreate { .. } => "BackupToCreate",
        NameTaken { .. } => "NameTaken",
        BackupRunning { .. } => "BackupRunning",
        BackupEnded { .. } => "BackupEnded",
        ApplicationGone => "ApplicationGone",
        RollingBack { .. } => "RollingBack",
        RollbackEnded { .. } => "RollbackEnded",
        RolledBack { .. } => "RolledBack",
        RestoreToCreate { .. } => "RestoreToCreate",
        Restoring { .. } => "Restoring",
        RestoreEnded { .. } => "RestoreEnded",
        Setting { setting, .. } => match setting {
            super::Setting::RecordAndSet { .. } => "Setting/RecordAndSet",
            super::Setting::Record { .. } => "Setting/Record",
            super::Setting::Set => "Setting/Set",
        },
        Releasing { .. } => "Releasing",
        Released { .. } => "Released",
        ReleaseFailed { .. } => "ReleaseFailed",
        RollbackToCreate { .. } => "RollbackToCreate",
    }
}

/// The history after the Upgrade recorded its baseline (1, 0.1.0) and target (2, 0.2.0).
fn recorded() -> Vec<AppRevision> {
    vec![
        rev(1, "0.1.0", json!({}), None),
        rev(2, "0.2.0", json!({"replicas": 2}), Some("up")),
    ]
}

/// The application once the target is set on it.
fn upgraded(flux: Flux) -> Option<ApplicationInstance> {
    Some(app("0.2.0", json!({"replicas": 2}), flux))
}

fn id_of(op: &Operation) -> OpId<'_> {
    OpId::of(op).expect("id")
}

/// `upgrade.backup` with volume data through Velero's file-system backup.
fn with_volume_backup(mut op: Operation) -> Operation {
    if let Some(params) = op.spec.upgrade.as_mut() {
        params.backup = Some(api::BackupParams {
            include_volumes: Some(true),
            volume_method: Some(api::VolumeBackupMethod::FileSystem),
            ..Default::default()
        });
    }
    op
}

fn child_op(child: UpgradeChild, payload: Value, annotations: BTreeMap<String, String>) -> Value {
    let op = upgrade_op(Some(params(true, Some(UpgradeFailurePolicy::RollbackAndRestore))));
    upgrade::child_operation(&id_of(&op), child, payload, annotations)
}

#[test]
fn upgrade_transitions() {
    use OperationPhase::{Expired, Failed, Running, Succeeded};
    let backup_first = |policy| upgrade_op(Some(params(true, policy)));
    let backup_done = ChildState::Ours(child(Some(Succeeded), Some("backed up")));
    let remediate = |r: &mut UpgradeRow| {
        r.op = backup_first(Some(UpgradeFailurePolicy::RollbackAndRestore));
        r.backup = ChildState::Ours(child(Some(Succeeded), Some("backed up")));
        r.rollback = Some(rollback_child(Some(Succeeded), Some("Rolled back to 0.1.0")));
        r.app = Some(app("0.1.0", json!({}), Flux::Ready("0.1.0")));
    };
    let summary = "upgrade to chart version 0.2.0 failed (UpgradeFailed: boom)";
    let rolled_back = format!("{summary}; rolled back: Rolled back to 0.1.0");
    let restore_children = vec![op_ref("up-backup"), op_ref("up-rollback"), op_ref("up-restore")];
    let fresh = vec![
        rev(1, "0.1.0", json!({}), None),
        rev(2, "0.2.0", json!({"replicas": 2}), Some("up")),
    ];
    let mut fresh_now = fresh.clone();
    for r in &mut fresh_now {
        r.at = now();
    }

    let rows = vec![
        // Refusals.
        UpgradeRow::new(
            "no spec.upgrade",
            "Refused",
            report(failed("InvalidSpec", "spec.upgrade is missing", vec![])),
        )
        .with(|r| r.op = upgrade_op(None)),
        UpgradeRow::new(
            "an Operation without a UID",
            "Refused",
            report(failed(
                "InvalidSpec",
                "the Operation has no metadata.uid (it was not read from the API server)",
                vec![],
            )),
        )
        .with(|r| r.op.metadata.uid = None),
        // 1. backupFirst.
        UpgradeRow::new(
            "backupFirst: create the backup",
            "BackupToCreate",
            ReleaseAction::CreateChild {
                object: child_op(UpgradeChild::Backup, json!({}), BTreeMap::new()),
                then: running(
                    "waiting for the pre-upgrade backup Operation up-backup",
                    vec![op_ref("up-backup")],
                ),
            },
        )
        .with(|r| r.op = backup_first(None)),
        UpgradeRow::new(
            "backupFirst with volume data: the backup carries upgrade.backup",
            "BackupToCreate",
            ReleaseAction::CreateChild {
                object: child_op(
                    UpgradeChild::Backup,
                    json!({"includeVolumes": true, "volumeMethod": "FileSystem"}),
                    BTreeMap::new(),
                ),
                then: running(
                    "waiting for the pre-upgrade backup Operation up-backup",
                    vec![op_ref("up-backup")],
                ),
            },
        )
        .with(|r| r.op = with_volume_backup(backup_first(None))),
        UpgradeRow::new(
            "backupFirst: the name is taken",
            "NameTaken",
            report(failed(
                "Failed",
                "Operation team-a/up-backup already exists and was not created by this Operation; it is left alone",
                vec![],
            )),
        )
        .with(|r| {
            r.op = backup_first(None);
            r.backup = ChildState::Foreign;
        }),
        UpgradeRow::new(
            "backupFirst: no status yet",
            "BackupRunning",
            report(running(
                "waiting for the pre-upgrade backup Operation up-backup",
                vec![op_ref("up-backup")],
            )),
        )
        .with(|r| {
            r.op = backup_first(None);
            r.backup = ChildState::Ours(child(None, None));
        }),
        UpgradeRow::new(
            "backupFirst: running",
            "BackupRunning",
            report(running(
                "waiting for the pre-upgrade backup Operation up-backup",
                vec![op_ref("up-backup")],
            )),
        )
        .with(|r| {
            r.op = backup_first(None);
            r.backup = ChildState::Ours(child(Some(Running), None));
        }),
        UpgradeRow::new(
            "backupFirst: the backup failed",
            "BackupEnded",
            report(failed(
                "BackupFailed",
                "pre-upgrade backup Operation up-backup ended Failed: velero said no; the application was not changed",
                vec![op_ref("up-backup")],
            )),
        )
        .with(|r| {
            r.op = backup_first(None);
            r.backup = ChildState::Ours(child(Some(Failed), Some("velero said no")));
        }),
        UpgradeRow::new(
            "backupFirst: the backup expired",
            "BackupEnded",
            report(failed(
                "BackupFailed",
                "pre-upgrade backup Operation up-backup ended Expired: no result; the application was not changed",
                vec![op_ref("up-backup")],
            )),
        )
        .with(|r| {
            r.op = backup_first(None);
            r.backup = ChildState::Ours(child(Some(Expired), None));
        }),
        // 2. The application.
        UpgradeRow::new(
            "backed up, then the application was deleted",
            "ApplicationGone",
            report(failed(
                "ApplicationNotFound",
                "the ApplicationInstance was deleted during the upgrade",
                vec![op_ref("up-backup")],
            )),
        )
        .with(|r| {
            r.op = backup_first(None);
            r.backup = backup_done.clone();
            r.app = None;
        }),
        UpgradeRow::new(
            "the application was deleted",
            "ApplicationGone",
            report(failed(
                "ApplicationNotFound",
                "the ApplicationInstance was deleted during the upgrade",
                vec![],
            )),
        )
        .with(|r| r.app = None),
        // 4. Record and set.
        UpgradeRow::new(
            "the history cannot be read",
            "Refused",
            report(failed("Failed", "revision history team-a/nextcloud-revisions: garbled", vec![])),
        )
        .with(|r| {
            r.history = Err(Error::CorruptHistory(
                "revision history team-a/nextcloud-revisions: garbled".into(),
            ))
        }),
        UpgradeRow::new(
            "backed up: record the baseline and the target, set the target",
            "Setting/RecordAndSet",
            set_state(
                Some(config_map(&fresh_now)),
                "0.2.0",
                json!({"replicas": 2}),
                running(
                    "chart version 0.2.0 set on the application (revision 2)",
                    vec![op_ref("up-backup"), cm()],
                ),
            ),
        )
        .with(|r| {
            r.op = backup_first(None);
            r.backup = backup_done.clone();
        }),
        UpgradeRow::new(
            "the application already asks for the target: record only",
            "Setting/Record",
            ReleaseAction::RecordRevisions {
                config_map: config_map(&[rev(1, "0.2.0", json!({"replicas": 2}), None), {
                    let mut mine = rev(2, "0.2.0", json!({"replicas": 2}), Some("up"));
                    mine.at = now();
                    mine
                }]),
                history: vec![rev(1, "0.2.0", json!({"replicas": 2}), None), {
                    let mut mine = rev(2, "0.2.0", json!({"replicas": 2}), Some("up"));
                    mine.at = now();
                    mine
                }],
            },
        )
        .with(|r| {
            r.app = upgraded(Flux::Ready("0.2.0"));
            r.history = Ok(vec![rev(1, "0.2.0", json!({"replicas": 2}), None)]);
        }),
        UpgradeRow::new(
            "recorded, but the application asks for something else: set it again",
            "Setting/Set",
            set_state(
                None,
                "0.2.0",
                json!({"replicas": 2}),
                running("chart version 0.2.0 set on the application (revision 2)", vec![cm()]),
            ),
        )
        .with(|r| r.history = Ok(recorded())),
        // 5. Flux's verdict.
        UpgradeRow::new(
            "Flux has not observed the change",
            "Releasing",
            report(running(
                "waiting for ApplicationInstance nextcloud to observe the change",
                vec![cm()],
            )),
        )
        .with(|r| {
            r.app = upgraded(Flux::Behind);
            r.history = Ok(recorded());
        }),
        UpgradeRow::new(
            "Ready at the old version",
            "Releasing",
            report(running("Ready at chart version 0.1.0, waiting for 0.2.0", vec![cm()])),
        )
        .with(|r| {
            r.app = upgraded(Flux::Ready("0.1.0"));
            r.history = Ok(recorded());
        }),
        UpgradeRow::new(
            "released",
            "Released",
            report(succeeded(
                "Upgraded to chart version 0.2.0 (revision 2): chart version 0.2.0 released and Ready",
                vec![cm()],
            )),
        )
        .with(|r| {
            r.app = upgraded(Flux::Ready("0.2.0"));
            r.history = Ok(recorded());
        }),
        UpgradeRow::new(
            "released after spec.deadline: the deadline bounds only the start",
            "Released",
            report(succeeded(
                "Upgraded to chart version 0.2.0 (revision 2): chart version 0.2.0 released and Ready",
                vec![cm()],
            )),
        )
        .with(|r| {
            r.op.spec.deadline = Some(Time(Timestamp::UNIX_EPOCH));
            r.app = upgraded(Flux::Ready("0.2.0"));
            r.history = Ok(recorded());
        }),
        UpgradeRow::new(
            "Flux failed it, onFailure None",
            "ReleaseFailed",
            report(failed(
                "UpgradeFailed",
                "upgrade to chart version 0.2.0 failed: boom",
                vec![cm()],
            )),
        )
        .with(|r| {
            r.app = upgraded(Flux::Failed);
            r.history = Ok(recorded());
        }),
        UpgradeRow::new(
            "Flux failed it, onFailure Rollback, but no revision before the target",
            "ReleaseFailed",
            report(failed(
                "UpgradeFailed",
                "upgrade to chart version 0.2.0 failed: boom",
                vec![cm()],
            )),
        )
        .with(|r| {
            r.op = upgrade_op(Some(params(false, Some(UpgradeFailurePolicy::Rollback))));
            r.app = upgraded(Flux::Failed);
            r.history = Ok(vec![rev(2, "0.2.0", json!({"replicas": 2}), Some("up"))]);
        }),
        UpgradeRow::new(
            "Flux failed it, onFailure Rollback: roll back to the baseline",
            "RollbackToCreate",
            ReleaseAction::CreateChild {
                object: {
                    let op = upgrade_op(Some(params(false, Some(UpgradeFailurePolicy::Rollback))));
                    upgrade::child_operation(
                        &id_of(&op),
                        UpgradeChild::Rollback,
                        json!({"revision": 1}),
                        BTreeMap::from([
                            ("vworkspace.io/cause-reason".to_owned(), "UpgradeFailed".to_owned()),
                            ("vworkspace.io/cause-message".to_owned(), "boom".to_owned()),
                        ]),
                    )
                },
                then: running(
                    "upgrade failed (UpgradeFailed); rolling back to revision 1",
                    vec![cm(), op_ref("up-rollback")],
                ),
            },
        )
        .with(|r| {
            r.op = upgrade_op(Some(params(false, Some(UpgradeFailurePolicy::Rollback))));
            r.app = upgraded(Flux::Failed);
            r.history = Ok(recorded());
        }),
        // 3. Remediation, followed once the child Rollback exists.
        UpgradeRow::new(
            "rolling back",
            "RollingBack",
            report(running(
                &format!("{summary}; rolling back (Operation up-rollback)"),
                vec![op_ref("up-rollback")],
            )),
        )
        .with(|r| {
            r.op = upgrade_op(Some(params(false, Some(UpgradeFailurePolicy::Rollback))));
            r.rollback = Some(rollback_child(Some(Running), None));
        }),
        UpgradeRow::new(
            "rolling back, the history unreadable: the remediation does not need it",
            "RollingBack",
            report(running(
                &format!("{summary}; rolling back (Operation up-rollback)"),
                vec![op_ref("up-rollback")],
            )),
        )
        .with(|r| {
            r.op = upgrade_op(Some(params(false, Some(UpgradeFailurePolicy::Rollback))));
            r.rollback = Some(rollback_child(None, None));
            r.history = Err(Error::CorruptHistory("garbled".into()));
        }),
        UpgradeRow::new(
            "a rollback without cause annotations",
            "RollingBack",
            report(running(
                "upgrade to chart version 0.2.0 failed (Failed: ); rolling back (Operation up-rollback)",
                vec![op_ref("up-rollback")],
            )),
        )
        .with(|r| r.rollback = Some(child(Some(Running), None))),
        UpgradeRow::new(
            "the rollback failed",
            "RollbackEnded",
            report(failed(
                "UpgradeFailed",
                &format!("{summary}; rollback Operation up-rollback ended Failed: revision 1 is not in the history"),
                vec![op_ref("up-rollback")],
            )),
        )
        .with(|r| {
            r.op = upgrade_op(Some(params(false, Some(UpgradeFailurePolicy::Rollback))));
            r.rollback = Some(rollback_child(Some(Failed), Some("revision 1 is not in the history")));
        }),
        UpgradeRow::new(
            "rolled back, onFailure Rollback: the upgrade ends Failed",
            "RolledBack",
            report(failed("UpgradeFailed", &rolled_back, vec![op_ref("up-rollback")])),
        )
        .with(|r| {
            r.op = upgrade_op(Some(params(false, Some(UpgradeFailurePolicy::Rollback))));
            r.rollback = Some(rollback_child(Some(Succeeded), Some("Rolled back to 0.1.0")));
        }),
        UpgradeRow::new(
            "rolled back, RollbackAndRestore: create the restore",
            "RestoreToCreate",
            ReleaseAction::CreateChild {
                object: child_op(
                    UpgradeChild::Restore,
                    json!({"source": {"operationName": "up-backup"}}),
                    BTreeMap::new(),
                ),
                then: running(
                    &format!("{rolled_back}; restoring the pre-upgrade backup (Operation up-restore)"),
                    restore_children.clone(),
                ),
            },
        )
        .with(remediate),
        UpgradeRow::new(
            "rolled back, RollbackAndRestore after a volume backup: the restore brings the volume data back",
            "RestoreToCreate",
            ReleaseAction::CreateChild {
                object: child_op(
                    UpgradeChild::Restore,
                    json!({"source": {"operationName": "up-backup"}, "restoreVolumes": true}),
                    BTreeMap::new(),
                ),
                then: running(
                    &format!("{rolled_back}; restoring the pre-upgrade backup (Operation up-restore)"),
                    restore_children.clone(),
                ),
            },
        )
        .with(|r| {
            remediate(r);
            r.op = with_volume_backup(r.op.clone());
        }),
        UpgradeRow::new(
            "rolled back, the restore's name is taken",
            "NameTaken",
            report(failed(
                "Failed",
                "Operation team-a/up-restore already exists and was not created by this Operation; it is left alone",
                vec![],
            )),
        )
        .with(|r| {
            remediate(r);
            r.restore = ChildState::Foreign;
        }),
        UpgradeRow::new(
            "restoring",
            "Restoring",
            report(running(
                &format!("{rolled_back}; restoring the pre-upgrade backup (Operation up-restore)"),
                restore_children.clone(),
            )),
        )
        .with(|r| {
            remediate(r);
            r.restore = ChildState::Ours(child(Some(Running), None));
        }),
        UpgradeRow::new(
            "restored: the upgrade still ends Failed",
            "RestoreEnded",
            report(failed(
                "UpgradeFailed",
                &format!(
                    "{rolled_back}; restore of the pre-upgrade backup (Operation up-restore) ended Succeeded: restored 12 items"
                ),
                restore_children.clone(),
            )),
        )
        .with(|r| {
            remediate(r);
            r.restore = ChildState::Ours(child(Some(Succeeded), Some("restored 12 items")));
        }),
        UpgradeRow::new(
            "the restore failed",
            "RestoreEnded",
            report(failed(
                "UpgradeFailed",
                &format!("{rolled_back}; restore of the pre-upgrade backup (Operation up-restore) ended Failed: no result"),
                restore_children.clone(),
            )),
        )
        .with(|r| {
            remediate(r);
            r.restore = ChildState::Ours(child(Some(Failed), None));
        }),
    ];

    for row in rows {
        let observation = upgrade::Observation {
            op: &row.op,
            app: row.app.as_ref(),
            backup: row.backup.clone(),
            rollback: row.rollback.clone(),
            restore: row.restore.clone(),
            history: row.history.clone(),
            now: now(),
        };
        let state = upgrade::determine_state(&observation);
        assert_eq!(upgrade_stage(&state.stage), row.stage, "{}: stage", row.name);
        assert_eq!(upgrade::next_action(state), row.action, "{}: action", row.name);
    }
}

/// The driver decides again after recording: the next decision rests on what was written.
#[test]
fn upgrade_records_then_reaches_the_verdict() {
    let op = upgrade_op(Some(params(false, None)));
    let app = app("0.2.0", json!({"replicas": 2}), Flux::Ready("0.2.0"));
    let mut observation = upgrade::Observation {
        op: &op,
        app: Some(&app),
        backup: ChildState::Absent,
        rollback: None,
        restore: ChildState::Absent,
        history: Ok(Vec::new()),
        now: now(),
    };
    let ReleaseAction::RecordRevisions { history, .. } = upgrade::next_action(upgrade::determine_state(&observation))
    else {
        panic!("records first");
    };
    assert_eq!(history.len(), 2, "baseline and target: {history:?}");
    observation.history = Ok(history);
    assert_eq!(
        upgrade::next_action(upgrade::determine_state(&observation)),
        report(succeeded(
            "Upgraded to chart version 0.2.0 (revision 2): chart version 0.2.0 released and Ready",
            vec![cm()],
        ))
    );
}

#[test]
fn child_operations_are_built_as_documented() {
    let object = child_op(
        UpgradeChild::Rollback,
        json!({"revision": 1}),
        BTreeMap::from([("vworkspace.io/cause-reason".to_owned(), "UpgradeFailed".to_owned())]),
    );
    assert_eq!(object["apiVersion"], "vworkspace.io/v1alpha1");
    assert_eq!(object["kind"], "Operation");
    assert_eq!(object["metadata"]["name"], "up-rollback");
    assert_eq!(object["metadata"]["namespace"], "team-a");
    assert_eq!(object["metadata"]["ownerReferences"][0]["name"], "up");
    assert_eq!(
        object["metadata"]["annotations"]["vworkspace.io/cause-reason"],
        "UpgradeFailed"
    );
    assert_eq!(
        object["metadata"]["annotations"]["vworkspace.io/request-id"],
        "odoo:op:4711"
    );
    assert_eq!(
        object["spec"],
        json!({
            "type": "Rollback",
            "applicationRef": {"name": "nextcloud"},
            "requestId": "odoo:op:4711:rollback",
            "rollback": {"revision": 1},
        })
    );
    let backup = child_op(UpgradeChild::Backup, json!({}), BTreeMap::new());
    assert_eq!(backup["spec"]["type"], "Backup");
    assert_eq!(backup["spec"]["backup"], json!({}));
    assert_eq!(backup["spec"]["requestId"], "odoo:op:4711:backup");
}

#[test]
fn cause_messages_are_cut_on_a_character_boundary() {
    let op = upgrade_op(Some(params(false, Some(UpgradeFailurePolicy::Rollback))));
    let mut app = app("0.2.0", json!({"replicas": 2}), Flux::Failed);
    let long = "€".repeat(400); // 1,200 bytes; byte 1,000 falls inside a character
    if let Some(status) = app.status.as_mut() {
        for condition in &mut status.conditions {
            condition.message = long.clone();
        }
    }
    let observation = upgrade::Observation {
        op: &op,
        app: Some(&app),
        backup: ChildState::Absent,
        rollback: None,
        restore: ChildState::Absent,
        history: Ok(recorded()),
        now: now(),
    };
    let ReleaseAction::CreateChild { object, .. } = upgrade::next_action(upgrade::determine_state(&observation)) else {
        panic!("creates the rollback");
    };
    let cause = object["metadata"]["annotations"]["vworkspace.io/cause-message"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(cause.len(), 999);
    assert!(cause.chars().all(|c| c == '€'));
}

#[test]
fn child_request_ids_stay_valid() {
    assert_eq!(upgrade::child_request_id("req-1", "backup"), "req-1:backup");
    let long = "a".repeat(128);
    let id = upgrade::child_request_id(&long, "rollback");
    assert!(id.len() <= 128, "{}", id.len());
    assert!(id.ends_with(":rollback"));
    assert_ne!(
        upgrade::child_request_id(&long, "restore"),
        upgrade::child_request_id(&"b".repeat(128), "restore")
    );
    // Multi-byte characters around the cut do not panic.
    let wide = "é".repeat(64);
    assert!(upgrade::child_request_id(&wide, "restore").ends_with(":restore"));
}

#[test]
fn cuts_respect_char_boundaries() {
    // The cut is api::text::prefix_within (table-tested there); these are the cases the
    // cause message and the child requestId rely on.
    assert_eq!(api::text::prefix_within("héllo", 2), "h");
    assert_eq!(api::text::prefix_within("abc", 10), "abc");
}

#[test]
fn child_states_tell_ours_from_foreign() {
    let op = upgrade_op(Some(params(true, None)));
    let id = id_of(&op);
    let mut ours = child_op(UpgradeChild::Backup, json!({}), BTreeMap::new());
    ours["status"] = json!({"phase": "Failed", "result": "no space left"});
    assert_eq!(ChildState::of(None, &id), ChildState::Absent);
    assert_eq!(
        ChildState::of(Some(&ours), &id),
        ChildState::Ours(ChildStatus {
            phase: Some(OperationPhase::Failed),
            result: Some("no space left".into()),
            annotations: BTreeMap::from([("vworkspace.io/request-id".to_owned(), "odoo:op:4711".to_owned())]),
        })
    );
    let mut foreign = ours.clone();
    foreign["metadata"]["labels"]["vworkspace.io/operation-uid"] = json!("uid-someone-else");
    assert_eq!(ChildState::of(Some(&foreign), &id), ChildState::Foreign);
    // A phase this engine does not know reads as "not ended".
    assert_eq!(ChildStatus::of(&json!({"status": {"phase": "Paused"}})).phase, None);
}

#[test]
fn sources_that_pin_the_version_are_refused() {
    let with_source = |kind| {
        let mut app = app("0.1.0", json!({}), Flux::Behind);
        app.spec.chart.source_ref = Some(SourceReference {
            kind,
            name: "src".into(),
            ..Default::default()
        });
        app
    };
    assert_eq!(release::pinned_by_source(&app("0.1.0", json!({}), Flux::Behind)), None);
    assert_eq!(
        release::pinned_by_source(&with_source(SourceKind::HelmRepository)),
        None
    );
    assert_eq!(
        release::pinned_by_source(&with_source(SourceKind::OciRepository)),
        Some(Outcome::failed(
            "NotSupported",
            "the chart comes from a OCIRepository whose own spec pins the version; change the source instead"
        ))
    );
    assert!(release::pinned_by_source(&with_source(SourceKind::HelmChart)).is_some());
}

// ---------------------------------------------------------------- Rollback

/// One Rollback transition.
struct RollbackRow {
    name: &'static str,
    op: Operation,
    app: Option<ApplicationInstance>,
    history: Result<Vec<AppRevision>, Error>,
    stage: &'static str,
    action: ReleaseAction,
}

impl RollbackRow {
    /// `rollback: {}` of an application at 0.2.0 (revision 2) after 0.1.0 (revision 1).
    fn new(name: &'static str, stage: &'static str, action: ReleaseAction) -> Self {
        let mut op = crate::meta::tests::op("back", OperationType::Rollback);
        op.spec.rollback = Some(RollbackParams::default());
        Self {
            name,
            op,
            app: Some(app("0.2.0", json!({"replicas": 2}), Flux::Ready("0.2.0"))),
            history: Ok(two_revisions()),
            stage,
            action,
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Self)) -> Self {
        change(&mut self);
        self
    }
}

fn two_revisions() -> Vec<AppRevision> {
    vec![
        rev(1, "0.1.0", json!({"replicas": 1}), None),
        rev(2, "0.2.0", json!({"replicas": 2}), Some("up")),
    ]
}

/// The history once the Rollback recorded its target (revision 1's state) as revision 3.
fn rolled_back_history(at: Timestamp) -> Vec<AppRevision> {
    let mut history = two_revisions();
    let mut mine = rev(3, "0.1.0", json!({"replicas": 1}), Some("back"));
    mine.at = at;
    history.push(mine);
    history
}

fn rollback_stage(stage: &rollback::Stage) -> &'static str {
    use rollback::Stage::*;
    match stage {
        Refused(_) => "Refused",
        ApplicationGone => "ApplicationGone",
        Setting { setting, .. } => match setting {
            super::Setting::RecordAndSet { .. } => "Setting/RecordAndSet",
            super::Setting::Record { .. } => "Setting/Record",
            super::Setting::Set => "Setting/Set",
        },
        Releasing { .. } => "Releasing",
        Released { .. } => "Released",
        ReleaseFailed { .. } => "ReleaseFailed",
    }
}

#[test]
fn rollback_transitions() {
    let rolled_back = || Some(app("0.1.0", json!({"replicas": 1}), Flux::Ready("0.1.0")));
    let rows = vec![
        RollbackRow::new(
            "an Operation without a name",
            "Refused",
            report(failed(
                "InvalidSpec",
                "the Operation has no metadata.name (it was not read from the API server)",
                vec![],
            )),
        )
        .with(|r| r.op.metadata.name = None),
        RollbackRow::new(
            "the application was deleted",
            "ApplicationGone",
            report(failed(
                "ApplicationNotFound",
                "the ApplicationInstance was deleted during the rollback",
                vec![],
            )),
        )
        .with(|r| {
            r.app = None;
            r.history = Err(Error::CorruptHistory("garbled".into()));
        }),
        RollbackRow::new(
            "the history cannot be read",
            "Refused",
            report(failed("Failed", "garbled", vec![])),
        )
        .with(|r| r.history = Err(Error::CorruptHistory("garbled".into()))),
        RollbackRow::new(
            "no history",
            "Refused",
            report(failed(
                "RevisionNotFound",
                "the application has no revision history; there is nothing to roll back to",
                vec![],
            )),
        )
        .with(|r| r.history = Ok(Vec::new())),
        RollbackRow::new(
            "a revision the history does not hold",
            "Refused",
            report(failed(
                "RevisionNotFound",
                "revision 42 is not in the history (it holds revisions 1 to 2; older ones are not kept)",
                vec![],
            )),
        )
        .with(|r| {
            r.op.spec.rollback = Some(RollbackParams {
                revision: Some(42),
                ..Default::default()
            })
        }),
        RollbackRow::new(
            "choose the previous revision, record it, set it",
            "Setting/RecordAndSet",
            set_state(
                Some(config_map(&rolled_back_history(now()))),
                "0.1.0",
                json!({"replicas": 1}),
                running(
                    "chart version 0.1.0 and its values set on the application from revision 1 (revision 3)",
                    vec![cm()],
                ),
            ),
        ),
        RollbackRow::new(
            "the application already asks for the target: record only",
            "Setting/Record",
            ReleaseAction::RecordRevisions {
                config_map: config_map(&{
                    let mut history = two_revisions();
                    let mut mine = rev(3, "0.2.0", json!({"replicas": 2}), Some("back"));
                    mine.at = now();
                    history.push(mine);
                    history
                }),
                history: {
                    let mut history = two_revisions();
                    let mut mine = rev(3, "0.2.0", json!({"replicas": 2}), Some("back"));
                    mine.at = now();
                    history.push(mine);
                    history
                },
            },
        )
        .with(|r| {
            r.op.spec.rollback = Some(RollbackParams {
                revision: Some(2),
                ..Default::default()
            })
        }),
        RollbackRow::new(
            "recorded, but the application asks for something else: set it again",
            "Setting/Set",
            set_state(
                None,
                "0.1.0",
                json!({"replicas": 1}),
                running(
                    "chart version 0.1.0 and its values set on the application (revision 3)",
                    vec![cm()],
                ),
            ),
        )
        .with(|r| r.history = Ok(rolled_back_history(Timestamp::UNIX_EPOCH))),
        RollbackRow::new(
            "Flux has not observed the change",
            "Releasing",
            report(running(
                "waiting for ApplicationInstance nextcloud to observe the change",
                vec![cm()],
            )),
        )
        .with(|r| {
            r.app = Some(app("0.1.0", json!({"replicas": 1}), Flux::Behind));
            r.history = Ok(rolled_back_history(Timestamp::UNIX_EPOCH));
        }),
        RollbackRow::new(
            "released",
            "Released",
            report(succeeded(
                "Rolled back to chart version 0.1.0 (recorded as revision 3): chart version 0.1.0 released and Ready",
                vec![cm()],
            )),
        )
        .with(|r| {
            r.app = rolled_back();
            r.history = Ok(rolled_back_history(Timestamp::UNIX_EPOCH));
        }),
        RollbackRow::new(
            "the target is chosen once: a later revision does not move it",
            "Released",
            report(succeeded(
                "Rolled back to chart version 0.1.0 (recorded as revision 3): chart version 0.1.0 released and Ready",
                vec![cm()],
            )),
        )
        .with(|r| {
            r.app = rolled_back();
            let mut history = rolled_back_history(Timestamp::UNIX_EPOCH);
            history.push(rev(4, "0.1.0", json!({"replicas": 1}), None));
            r.history = Ok(history);
        }),
        RollbackRow::new(
            "Flux failed it",
            "ReleaseFailed",
            report(failed(
                "UpgradeFailed",
                "rollback to chart version 0.1.0 failed: boom",
                vec![cm()],
            )),
        )
        .with(|r| {
            r.app = Some(app("0.1.0", json!({"replicas": 1}), Flux::Failed));
            r.history = Ok(rolled_back_history(Timestamp::UNIX_EPOCH));
        }),
    ];

    for row in rows {
        let observation = rollback::Observation {
            op: &row.op,
            app: row.app.as_ref(),
            history: row.history.clone(),
            now: now(),
        };
        let state = rollback::determine_state(&observation);
        assert_eq!(rollback_stage(&state.stage), row.stage, "{}: stage", row.name);
        assert_eq!(rollback::next_action(state), row.action, "{}: action", row.name);
    }
}
