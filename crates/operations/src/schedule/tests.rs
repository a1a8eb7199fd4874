use api::schedule::conditions::{REASON_INVALID_SCHEDULE, REASON_SUSPENDED, SCHEDULED};
use api::{ApplicationInstanceSpec, ApplicationInstanceStatus, OperationStatus};

use super::*;
use crate::meta::OpId;

const NS: &str = "team-a";
const APP: &str = "wiki";
const APP_UID: &str = "app-uid-1";

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn spec(cron: &str) -> BackupSchedule {
    BackupSchedule {
        cron: cron.into(),
        keep_last: Some(2),
        ..BackupSchedule::default()
    }
}

fn app(schedule: BackupSchedule, status: Option<BackupScheduleStatus>) -> ApplicationInstance {
    let mut app = ApplicationInstance::new(
        APP,
        ApplicationInstanceSpec {
            backup_schedule: Some(schedule),
            ..ApplicationInstanceSpec::default()
        },
    );
    app.metadata.namespace = Some(NS.into());
    app.metadata.uid = Some(APP_UID.into());
    app.metadata.generation = Some(1);
    app.status = status.map(|s| ApplicationInstanceStatus {
        backup_schedule: Some(s),
        ..ApplicationInstanceStatus::default()
    });
    app
}

/// The run `decide` would create for `at`, as read back from the API server.
fn run_at(app: &ApplicationInstance, at: &str, phase: Option<OperationPhase>) -> Operation {
    let spec = app.spec.backup_schedule.clone().unwrap();
    let schedule = Schedule::parse(&spec).unwrap();
    let mut op = run(app, APP, &spec, &schedule, ts(at));
    op.metadata.uid = Some(format!("uid-{at}"));
    op.status = phase.map(|phase| OperationStatus {
        phase: Some(phase),
        completion_time: phase
            .is_terminal()
            .then(|| Time(ts(at).checked_add(SignedDuration::from_secs(40)).unwrap())),
        ..OperationStatus::default()
    });
    op
}

/// The Velero Backup the backup engine creates for `run`, with exactly its labels.
fn backup_of(run: &Operation, name: &str, created: &str, phase: &str) -> ObservedBackup {
    ObservedBackup {
        name: name.into(),
        labels: meta::labels(&OpId::of(run).unwrap()),
        created: Some(ts(created)),
        phase: Some(phase.into()),
        deletion_requested: false,
    }
}

fn decide_at(app: &ApplicationInstance, now: &str, runs: &[Operation], backups: &[ObservedBackup]) -> Decision {
    decide(Observed {
        app,
        now: ts(now),
        runs,
        backups,
    })
}

fn condition(d: &Decision) -> (String, String, String) {
    let status = d.status.as_ref().unwrap();
    let c = api::conditions::find(&status.conditions, SCHEDULED).unwrap();
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

fn created_name(d: &Decision) -> Option<String> {
    d.create.as_ref().and_then(|op| op.metadata.name.clone())
}

#[test]
fn no_schedule_no_decision() {
    let mut a = app(spec("* * * * *"), None);
    a.spec.backup_schedule = None;
    assert_eq!(decide_at(&a, "2026-11-25T03:00:30Z", &[], &[]), Decision::default());
}

#[test]
fn every_minute_creates_one_run_per_minute_and_never_twice() {
    // First pass: the schedule takes effect now; earlier times are not runs.
    let first = decide_at(&app(spec("* * * * *"), None), "2026-11-25T03:00:30Z", &[], &[]);
    assert_eq!(first.create, None);
    let status = first.status.clone().unwrap();
    assert_eq!(status.since, Some(Time(ts("2026-11-25T03:00:30Z"))));
    assert_eq!(status.next_schedule_time, Some(Time(ts("2026-11-25T03:01:00Z"))));
    assert_eq!(first.requeue_at, Some(ts("2026-11-25T03:01:00Z")));
    assert_eq!(condition(&first).0, "True");

    // At 03:01:00 the run of 03:01 is created, named and keyed after its time.
    let a = app(spec("* * * * *"), Some(status));
    let second = decide_at(&a, "2026-11-25T03:01:00Z", &[], &[]);
    let created = second.create.clone().unwrap();
    assert_eq!(created.metadata.name.as_deref(), Some("wiki-backup-202611250301"));
    assert_eq!(created.spec.request_id, "backup-schedule:wiki:20261125T0301Z");
    assert_eq!(created.spec.type_, OperationType::Backup);
    assert_eq!(created.spec.deadline, None, "RunOnce without a starting deadline");
    assert_eq!(scheduled_time_of(&created, &a), Some(ts("2026-11-25T03:01:00Z")));
    let status = second.status.clone().unwrap();
    assert_eq!(status.last_schedule_time, Some(Time(ts("2026-11-25T03:01:00Z"))));
    assert_eq!(status.active.as_deref(), Some("wiki-backup-202611250301"));
    assert_eq!(status.next_schedule_time, Some(Time(ts("2026-11-25T03:02:00Z"))));

    // The status write was lost, the run exists: it is not created again.
    let run = run_at(&a, "2026-11-25T03:01:00Z", Some(OperationPhase::Running));
    let again = decide_at(&a, "2026-11-25T03:01:20Z", std::slice::from_ref(&run), &[]);
    assert_eq!(again.create, None);
    // Nor after a restart that lost the whole status.
    let fresh = app(spec("* * * * *"), None);
    assert_eq!(decide_at(&fresh, "2026-11-25T03:01:20Z", &[run], &[]).create, None);

    // The next minute, with the previous run done: the next run.
    let done = run_at(&a, "2026-11-25T03:01:00Z", Some(OperationPhase::Succeeded));
    let third = decide_at(&a, "2026-11-25T03:02:01Z", &[done], &[]);
    assert_eq!(created_name(&third).as_deref(), Some("wiki-backup-202611250302"));
    assert_eq!(
        third.status.unwrap().last_successful_time,
        Some(Time(ts("2026-11-25T03:01:40Z")))
    );
}

#[test]
fn nightly_in_brussels_across_daylight_saving_changes() {
    let brussels = |cron: &str| BackupSchedule {
        time_zone: Some("Europe/Brussels".into()),
        ..spec(cron)
    };
    let nightly = Schedule::parse(&brussels("30 2 * * *")).unwrap();
    let two = Schedule::parse(&brussels("0 2 * * *")).unwrap();
    let half_hourly = Schedule::parse(&brussels("*/30 * * * *")).unwrap();
    let cases: [(&Schedule, &str, &[&str]); 5] = [
        // Winter: 02:30 CET is 01:30 UTC.
        (
            &nightly,
            "2026-12-01T12:00:00Z",
            &["2026-12-02T01:30:00Z", "2026-12-03T01:30:00Z"],
        ),
        // Spring forward (2027-03-28, 02:00 → 03:00): 02:30 does not exist; it runs at
        // 03:00 CEST (01:00 UTC), then 02:30 CEST (00:30 UTC).
        (
            &nightly,
            "2027-03-27T12:00:00Z",
            &["2027-03-28T01:00:00Z", "2027-03-29T00:30:00Z"],
        ),
        // Fall back (2026-10-25, 03:00 → 02:00): 02:30 occurs twice; it runs once, at the
        // first (CEST, 00:30 UTC), then 02:30 CET (01:30 UTC).
        (
            &nightly,
            "2026-10-24T12:00:00Z",
            &["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
        ),
        // 02:00 on the spring-forward night is the first minute of the gap: 03:00 CEST.
        (
            &two,
            "2027-03-27T12:00:00Z",
            &["2027-03-28T01:00:00Z", "2027-03-29T00:00:00Z"],
        ),
        // A step in the hour runs on the real clock: the repeated hour has its runs twice.
        (
            &half_hourly,
            "2026-10-24T23:45:00Z",
            &[
                "2026-10-25T00:00:00Z",
                "2026-10-25T00:30:00Z",
                "2026-10-25T01:00:00Z",
                "2026-10-25T01:30:00Z",
                "2026-10-25T02:00:00Z",
            ],
        ),
    ];
    for (schedule, from, expected) in cases {
        let mut t = ts(from);
        for want in expected {
            t = schedule.next_after(t).unwrap();
            assert_eq!(t, ts(want), "{} after {from}", schedule.describe());
            // The backward search (used to find a missed time) lands on the same instant.
            assert_eq!(
                schedule.newest_in(ts(from), t.checked_add(SignedDuration::from_secs(59)).unwrap()),
                Some(t),
                "{} newest before {t}",
                schedule.describe()
            );
        }
    }
}

#[test]
fn a_missed_time_runs_once_or_is_skipped_per_policy() {
    let hourly = |policy: Option<MissedRunPolicy>, deadline: Option<i64>| BackupSchedule {
        missed_run_policy: policy,
        starting_deadline_seconds: deadline,
        ..spec("0 * * * *")
    };
    let since = BackupScheduleStatus {
        schedule: Some("0 * * * * in UTC".into()),
        since: Some(Time(ts("2026-11-25T00:10:00Z"))),
        ..BackupScheduleStatus::default()
    };
    // (policy, startingDeadlineSeconds, now, created, skipped)
    type Case<'a> = (
        Option<MissedRunPolicy>,
        Option<i64>,
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
    );
    let cases: [Case<'_>; 6] = [
        // Down from 00:10 to 03:20: RunOnce makes the newest missed run (03:00) once, late.
        (
            None,
            None,
            "2026-11-25T03:20:00Z",
            Some("wiki-backup-202611250300"),
            None,
        ),
        (
            Some(MissedRunPolicy::RunOnce),
            None,
            "2026-11-25T03:20:00Z",
            Some("wiki-backup-202611250300"),
            None,
        ),
        // RunOnce within a 10-minute deadline: 20 minutes late is skipped.
        (
            Some(MissedRunPolicy::RunOnce),
            Some(600),
            "2026-11-25T03:20:00Z",
            None,
            Some("2026-11-25T03:00:00Z"),
        ),
        // Skip: 30 s late is on time (default deadline 60 s) ...
        (
            Some(MissedRunPolicy::Skip),
            None,
            "2026-11-25T03:00:30Z",
            Some("wiki-backup-202611250300"),
            None,
        ),
        // ... 5 minutes late is skipped.
        (
            Some(MissedRunPolicy::Skip),
            None,
            "2026-11-25T03:05:00Z",
            None,
            Some("2026-11-25T03:00:00Z"),
        ),
        // Skip with a longer deadline.
        (
            Some(MissedRunPolicy::Skip),
            Some(600),
            "2026-11-25T03:05:00Z",
            Some("wiki-backup-202611250300"),
            None,
        ),
    ];
    for (policy, deadline, now, created, skipped) in cases {
        let a = app(hourly(policy, deadline), Some(since.clone()));
        let d = decide_at(&a, now, &[], &[]);
        let what = format!("{policy:?} {deadline:?} at {now}");
        assert_eq!(created_name(&d).as_deref(), created, "{what}");
        assert_eq!(d.skipped, skipped.map(ts), "{what}");
        let status = d.status.clone().unwrap();
        assert_eq!(status.last_skipped_time, skipped.map(|s| Time(ts(s))), "{what}");
        assert_eq!(
            status.next_schedule_time,
            Some(Time(ts("2026-11-25T04:00:00Z"))),
            "{what}"
        );
        if let (Some(op), Some(dl)) = (
            &d.create,
            deadline.or(policy.and_then(|p| (p == MissedRunPolicy::Skip).then_some(60))),
        ) {
            // The run carries its starting deadline, so one queued too long expires.
            let want = ts("2026-11-25T03:00:00Z")
                .checked_add(SignedDuration::from_secs(dl))
                .unwrap();
            assert_eq!(op.spec.deadline, Some(Time(want)), "{what}");
        }
        // A skipped time is handled: the next pass neither creates nor skips it again.
        if skipped.is_some() {
            let a = app(hourly(policy, deadline), d.status);
            let later = decide_at(&a, "2026-11-25T03:30:00Z", &[], &[]);
            assert_eq!((later.create, later.skipped), (None, None), "{what}");
        }
    }
}

#[test]
fn a_due_time_waits_for_the_active_run() {
    let status = BackupScheduleStatus {
        schedule: Some("0 * * * * in UTC".into()),
        since: Some(Time(ts("2026-11-25T00:10:00Z"))),
        ..BackupScheduleStatus::default()
    };
    let a = app(spec("0 * * * *"), Some(status));
    let running = run_at(&a, "2026-11-25T02:00:00Z", Some(OperationPhase::Running));
    let d = decide_at(&a, "2026-11-25T03:00:10Z", std::slice::from_ref(&running), &[]);
    assert_eq!((d.create.clone(), d.skipped), (None, None));
    assert_eq!(
        d.requeue_at,
        Some(ts("2026-11-25T03:00:40Z")),
        "polls while the run is active"
    );
    assert_eq!(d.status.unwrap().active.as_deref(), Some("wiki-backup-202611250200"));
    // Once it ended, RunOnce makes the 03:00 run, late.
    let ended = run_at(&a, "2026-11-25T02:00:00Z", Some(OperationPhase::Failed));
    let d = decide_at(&a, "2026-11-25T03:12:00Z", &[ended], &[]);
    assert_eq!(created_name(&d).as_deref(), Some("wiki-backup-202611250300"));
}

#[test]
fn keep_last_two_of_four_deletes_the_two_oldest_then_their_runs() {
    let status = BackupScheduleStatus {
        schedule: Some("* * * * * in UTC".into()),
        since: Some(Time(ts("2026-11-25T02:00:00Z"))),
        ..BackupScheduleStatus::default()
    };
    let a = app(spec("* * * * *"), Some(status));
    let times = [
        "2026-11-25T03:01:00Z",
        "2026-11-25T03:02:00Z",
        "2026-11-25T03:03:00Z",
        "2026-11-25T03:04:00Z",
    ];
    let runs: Vec<Operation> = times
        .iter()
        .map(|t| run_at(&a, t, Some(OperationPhase::Succeeded)))
        .collect();
    let backups: Vec<ObservedBackup> = runs
        .iter()
        .zip(times)
        .enumerate()
        .map(|(i, (r, t))| backup_of(r, &format!("b{}", i + 1), t, "Completed"))
        .collect();
    let d = decide_at(&a, "2026-11-25T03:04:50Z", &runs, &backups);
    assert_eq!(d.delete_backups, ["b2", "b1"]);
    assert!(d.delete_runs.is_empty(), "runs stay while their backups exist");
    assert_eq!(d.status.as_ref().unwrap().kept_backups, ["b4", "b3"]);
    assert_eq!(d.create, None, "the 03:04 run exists");

    // Velero is deleting them (a DeleteBackupRequest exists): not asked again.
    let mut deleting = backups.clone();
    deleting[0].deletion_requested = true;
    deleting[1].phase = Some("Deleting".into());
    let d = decide_at(&a, "2026-11-25T03:04:50Z", &runs, &deleting);
    assert!(d.delete_backups.is_empty(), "{:?}", d.delete_backups);

    // Velero deleted them: now the two oldest runs go.
    let d = decide_at(&a, "2026-11-25T03:04:50Z", &runs, &backups[2..]);
    assert!(d.delete_backups.is_empty());
    assert_eq!(d.delete_runs, ["wiki-backup-202611250302", "wiki-backup-202611250301"]);
}

#[test]
fn ttl_expires_backups_and_unsuccessful_ones_go_once_a_newer_completes() {
    let status = BackupScheduleStatus {
        schedule: Some("0 * * * * in UTC".into()),
        since: Some(Time(ts("2026-11-25T00:00:00Z"))),
        ..BackupScheduleStatus::default()
    };
    let ttl = BackupSchedule {
        keep_last: None,
        ttl: Some("90m".into()),
        ..spec("0 * * * *")
    };
    let a = app(ttl, Some(status));
    let rows = [
        ("2026-11-25T01:00:00Z", "old", "Completed"),          // 2h50 old: expired
        ("2026-11-25T02:00:00Z", "failed", "PartiallyFailed"), // a newer one completed
        ("2026-11-25T03:00:00Z", "new", "Completed"),          // kept
        ("2026-11-25T03:50:00Z", "running", "InProgress"),     // never touched
    ];
    let runs: Vec<Operation> = rows
        .iter()
        .map(|(t, _, _)| run_at(&a, t, Some(OperationPhase::Succeeded)))
        .collect();
    let backups: Vec<ObservedBackup> = runs
        .iter()
        .zip(rows)
        .map(|(r, (t, name, phase))| backup_of(r, name, t, phase))
        .collect();
    let d = decide_at(&a, "2026-11-25T03:50:30Z", &runs, &backups);
    assert_eq!(d.delete_backups, ["failed", "old"]);
    assert_eq!(d.status.unwrap().kept_backups, ["new"]);

    // The ttl is Velero's too.
    let spec = a.spec.backup_schedule.clone().unwrap();
    let op = run(
        &a,
        APP,
        &spec,
        &Schedule::parse(&spec).unwrap(),
        ts("2026-11-25T04:00:00Z"),
    );
    assert_eq!(op.spec.backup.unwrap().ttl.as_deref(), Some("90m"));
}

#[test]
fn only_backups_of_verified_runs_are_ever_deleted() {
    let status = BackupScheduleStatus {
        schedule: Some("* * * * * in UTC".into()),
        since: Some(Time(ts("2026-11-25T02:00:00Z"))),
        ..BackupScheduleStatus::default()
    };
    let one = BackupSchedule {
        keep_last: Some(1),
        ..spec("* * * * *")
    };
    let a = app(one, Some(status));
    let newest = run_at(&a, "2026-11-25T03:05:00Z", Some(OperationPhase::Succeeded));
    let ours = run_at(&a, "2026-11-25T03:01:00Z", Some(OperationPhase::Succeeded));
    let mut backups = vec![
        backup_of(&newest, "kept", "2026-11-25T03:05:00Z", "Completed"),
        backup_of(&ours, "ours", "2026-11-25T03:01:00Z", "Completed"),
    ];
    // Each of these is old enough to be deleted if it were ours.
    let mut label_changed = |name: &str, key: &str, value: Option<&str>| {
        let mut b = backup_of(&ours, name, "2026-11-25T03:00:00Z", "Completed");
        match value {
            Some(v) => b.labels.insert(key.into(), v.into()),
            None => b.labels.remove(key),
        };
        backups.push(b);
    };
    label_changed("not-managed", LABEL_MANAGED_BY, None);
    label_changed("other-namespace", meta::LABEL_OPERATION_NAMESPACE, Some("team-b"));
    label_changed("other-app", meta::LABEL_APPLICATION, Some("blog"));
    label_changed("other-uid", meta::LABEL_OPERATION_UID, Some("uid-of-a-namesake"));
    label_changed("other-operation", meta::LABEL_OPERATION, Some("wiki-backup-manual"));
    label_changed("a-restore", meta::LABEL_OPERATION_TYPE, Some("Restore"));

    // Operations that look like runs but are not this schedule's.
    let mut forged_owner = run_at(&a, "2026-11-25T03:02:00Z", Some(OperationPhase::Succeeded));
    forged_owner.metadata.owner_references = None;
    let mut renamed = run_at(&a, "2026-11-25T03:03:00Z", Some(OperationPhase::Succeeded));
    renamed.metadata.name = Some("wiki-backup-by-hand".into());
    let mut other_app_uid = run_at(&a, "2026-11-25T03:04:00Z", Some(OperationPhase::Succeeded));
    if let Some(refs) = other_app_uid.metadata.owner_references.as_mut() {
        refs[0].uid = "uid-of-a-deleted-wiki".into();
    }
    for (run, name) in [
        (&forged_owner, "forged"),
        (&renamed, "renamed"),
        (&other_app_uid, "stale-owner"),
    ] {
        backups.push(backup_of(run, name, "2026-11-25T03:00:00Z", "Completed"));
    }
    let runs = [newest, ours, forged_owner, renamed, other_app_uid];
    let d = decide_at(&a, "2026-11-25T03:05:30Z", &runs, &backups);
    assert_eq!(d.delete_backups, ["ours"]);
    assert_eq!(d.status.as_ref().unwrap().kept_backups, ["kept"]);
    assert!(d.delete_runs.is_empty(), "{:?}", d.delete_runs);
}

#[test]
fn an_invalid_schedule_is_a_condition_and_nothing_is_done() {
    let base = spec("0 2 * * *");
    let cases: [(BackupSchedule, &str); 6] = [
        (spec("61 * * * *"), "is not a valid cron expression"),
        (spec("* * * *"), "has 4 fields"),
        (spec("0 0 30 2 *"), "never fires"),
        (
            BackupSchedule {
                time_zone: Some("Mars/Olympus_Mons".into()),
                ..base.clone()
            },
            "is not a time zone of the IANA database",
        ),
        (
            BackupSchedule {
                time_zone: Some("../../etc/passwd".into()),
                ..base.clone()
            },
            "is not an IANA time zone name",
        ),
        (
            BackupSchedule {
                ttl: Some("7d".into()),
                ..base.clone()
            },
            "is not a duration",
        ),
    ];
    for (schedule, words) in cases {
        let a = app(schedule.clone(), None);
        let run = run_at(
            &app(base.clone(), None),
            "2026-11-25T01:00:00Z",
            Some(OperationPhase::Succeeded),
        );
        let old = backup_of(&run, "old", "2026-01-01T00:00:00Z", "Completed");
        let d = decide_at(&a, "2026-11-25T03:00:00Z", &[run], &[old]);
        let (status, reason, message) = condition(&d);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", REASON_INVALID_SCHEDULE),
            "{schedule:?}"
        );
        assert!(message.contains(words), "{message:?} should say {words:?}");
        assert_eq!(
            (d.create, d.delete_backups.len(), d.delete_runs.len(), d.requeue_at),
            (None, 0, 0, None),
            "{schedule:?}"
        );
        assert_eq!(d.status.unwrap().next_schedule_time, None);
    }
}

#[test]
fn suspended_creates_nothing_but_retention_goes_on() {
    let status = BackupScheduleStatus {
        schedule: Some("* * * * * in UTC".into()),
        since: Some(Time(ts("2026-11-25T02:00:00Z"))),
        ..BackupScheduleStatus::default()
    };
    let a = app(
        BackupSchedule {
            suspend: true,
            keep_last: Some(1),
            ..spec("* * * * *")
        },
        Some(status),
    );
    let runs = [
        run_at(&a, "2026-11-25T03:01:00Z", Some(OperationPhase::Succeeded)),
        run_at(&a, "2026-11-25T03:02:00Z", Some(OperationPhase::Succeeded)),
    ];
    let backups = [
        backup_of(&runs[0], "b1", "2026-11-25T03:01:00Z", "Completed"),
        backup_of(&runs[1], "b2", "2026-11-25T03:02:00Z", "Completed"),
    ];
    let d = decide_at(&a, "2026-11-25T03:10:00Z", &runs, &backups);
    assert_eq!((d.create.clone(), d.requeue_at), (None, None));
    assert_eq!(condition(&d).1, REASON_SUSPENDED);
    assert_eq!(d.delete_backups, ["b1"]);
    assert_eq!(d.status.unwrap().next_schedule_time, None);
}

#[test]
fn a_changed_schedule_starts_afresh() {
    let status = BackupScheduleStatus {
        schedule: Some("0 * * * * in UTC".into()),
        since: Some(Time(ts("2026-11-25T00:00:00Z"))),
        last_skipped_time: Some(Time(ts("2026-11-25T01:00:00Z"))),
        ..BackupScheduleStatus::default()
    };
    let a = app(spec("30 * * * *"), Some(status));
    let d = decide_at(&a, "2026-11-25T03:40:00Z", &[], &[]);
    assert_eq!(d.create, None, "03:30 was before the new schedule took effect");
    let status = d.status.unwrap();
    assert_eq!(status.schedule.as_deref(), Some("30 * * * * in UTC"));
    assert_eq!(status.since, Some(Time(ts("2026-11-25T03:40:00Z"))));
    assert_eq!(status.last_skipped_time, None);
}

#[test]
fn an_unchanged_world_yields_the_same_status() {
    let a = app(spec("0 2 * * *"), None);
    let first = decide_at(&a, "2026-11-25T03:00:00Z", &[], &[]);
    let a = app(spec("0 2 * * *"), first.status.clone());
    let second = decide_at(&a, "2026-11-25T03:05:00Z", &[], &[]);
    assert_eq!(first.status, second.status, "no write at rest");
}

#[test]
fn names_and_request_ids_are_valid_and_deterministic() {
    let at = ts("2026-11-25T02:30:00Z");
    let long = "a".repeat(63);
    let name = run_name(&long, at);
    assert!(names::is_dns_label(&name) && name.len() <= 63, "{name}");
    assert_eq!(name, run_name(&long, at));
    assert_ne!(name, run_name(&long, ts("2026-11-26T02:30:00Z")));
    let id = request_id(&long, at);
    assert!(id.len() <= 128);
    assert!(
        id.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
    );
    assert!(id.ends_with('Z'));
}

#[test]
fn go_durations() {
    let cases: [(&str, Option<i64>); 10] = [
        ("90m", Some(5_400_000)),
        ("1h30m", Some(5_400_000)),
        ("1.5h", Some(5_400_000)),
        ("250ms", Some(250)),
        ("168h", Some(604_800_000)),
        ("7d", None),
        ("", None),
        ("h", None),
        ("1.h", None),
        ("99999999999h", None),
    ];
    for (input, millis) in cases {
        assert_eq!(parse_duration(input).map(|d| d.as_millis() as i64), millis, "{input:?}");
    }
}

#[test]
fn the_delete_backup_request_names_only_the_backup() {
    let a = app(spec("0 2 * * *"), None);
    let request = delete_backup_request("team-a-wiki-backup-202611250200-0123456789", "velero", &a);
    assert_eq!(request["kind"], "DeleteBackupRequest");
    assert_eq!(request["apiVersion"], "velero.io/v1");
    assert_eq!(request["metadata"]["namespace"], "velero");
    assert_eq!(
        request["spec"],
        json!({"backupName": "team-a-wiki-backup-202611250200-0123456789"})
    );
    let name = request["metadata"]["name"].as_str().unwrap();
    assert!(names::is_dns_label(name), "{name}");
    assert_eq!(request["metadata"]["labels"][LABEL_SCHEDULE], "wiki");
}
