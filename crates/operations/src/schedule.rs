//! Backups on a schedule: what the backup engine does about an ApplicationInstance's
//! `spec.backupSchedule` now ([ADR 0008](../../../docs/adr/0008-backup-schedules.md)).
//!
//! [`decide`] is a pure function of the ApplicationInstance (spec and the status written
//! before), `now`, the runs (Backup Operations) and the Velero Backups the engine listed. It
//! returns one [`Decision`]: the run to create, if any; the scheduled time skipped; the
//! Velero Backups to delete (each through a `DeleteBackupRequest`, [`delete_backup_request`]);
//! the runs to delete; when to look again; and the status to write.
//!
//! ## Runs
//!
//! A run is a Backup Operation in the application's namespace, named after its scheduled
//! time in UTC ([`run_name`], `<app>-backup-<YYYYMMDDhhmm>`), with the `requestId`
//! `backup-schedule:<app>:<YYYYMMDDThhmmZ>` ([`request_id`]): a restarted engine, or two
//! replicas, create it once (the name is taken; a replay is a duplicate). It is owned by the
//! ApplicationInstance (controller reference) and labelled [`LABEL_SCHEDULE`]; it runs through
//! the ordinary lifecycle (queue, duplicates, tenancy, Events). It counts as this schedule's
//! only if all of these hold ([`scheduled_time_of`]): the label, the controller owner
//! reference to this ApplicationInstance's UID, type Backup on this application, the
//! annotation [`ANNOTATION_SCHEDULED_TIME`], and a name and requestId that are exactly those
//! derived from that time. Anything else is not touched.
//!
//! ## Which time runs
//!
//! Only the newest scheduled time after the last one handled (run or skipped, or after the
//! moment the schedule took effect, `status.since`) and not after `now` is considered: a
//! schedule never catches up run after run. It is created when no run of the schedule is
//! active and it is not later than the starting deadline (`startingDeadlineSeconds`; default
//! 60 s for [`MissedRunPolicy::Skip`], unlimited for [`MissedRunPolicy::RunOnce`]); later,
//! it is skipped (`lastSkippedTime`). While a run is active the time waits (a `Skip` one
//! until its deadline). The run's `deadline` is its scheduled time plus the starting
//! deadline, so a run queued behind a Restore for too long ends `Expired` without acting.
//!
//! ## Time zones and daylight saving
//!
//! The cron expression is read in `timeZone` (IANA, default UTC) by `croner`, which follows
//! the Open Cron Pattern Specification and Vixie cron: a time with fixed minute and hour
//! that does not exist that night (spring forward) runs at the first minute after the gap
//! (02:30 in Europe/Brussels on the last Sunday of March runs at 03:00 CEST); one that occurs
//! twice (fall back) runs once, at its first occurrence (CEST). Expressions with a wildcard
//! or step in the minute or hour run on the real clock: the skipped hour has no runs, the
//! repeated hour has them twice. Times are kept and compared in UTC.
//!
//! ## Retention
//!
//! Only Velero Backups of this schedule's runs are ever deleted: the labels the backup
//! engine puts on each (`app.kubernetes.io/managed-by: vworkspace-operator`, the application,
//! the Operation's namespace, type `Backup`, and the run's name **and UID**) must name a run
//! of this schedule as verified above. Of those that ended:
//!
//! * `Completed` ones are kept, newest first, up to `keepLast` (all, without `keepLast`);
//! * any one older than `ttl` (from its creation) is deleted;
//! * an unsuccessful one (`Failed`, `PartiallyFailed`, `FailedValidation`) is deleted once a
//!   newer backup of the schedule completed;
//! * a backup still running, being deleted, or without a creation time is left alone.
//!
//! A backup is deleted through a Velero `DeleteBackupRequest` (deleting the `Backup` object
//! alone is undone by Velero's backup sync). A run is deleted once no Velero Backup of it is
//! left and it is not among the newest `max(keepLast, 1)` runs, so the runs whose backups
//! are kept stay visible; a run is never deleted before its backup, which would leave that
//! backup without a run to verify it by.

use std::collections::BTreeMap;

use api::schedule::{BackupSchedule, BackupScheduleStatus, DEFAULT_TIME_ZONE, MAX_KEPT_BACKUPS, MissedRunPolicy};
use api::{ApplicationInstance, ApplicationReference, BackupParams, LABEL_MANAGED_BY, MANAGED_BY};
use api::{Operation, OperationPhase, OperationSpec, OperationType};
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp, Zoned};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde_json::{Value, json};

use crate::{meta, names};

/// Label on every run: the name of the ApplicationInstance whose schedule created it.
pub const LABEL_SCHEDULE: &str = "vworkspace.io/backup-schedule";
/// Annotation on every run: its scheduled time (RFC 3339, UTC).
pub const ANNOTATION_SCHEDULED_TIME: &str = "vworkspace.io/scheduled-time";
/// Prefix of a run's `requestId`.
pub const REQUEST_ID_PREFIX: &str = "backup-schedule";
/// Starting deadline of [`MissedRunPolicy::Skip`] without `startingDeadlineSeconds`.
pub const DEFAULT_SKIP_DEADLINE_SECONDS: i64 = 60;
/// How often to look again while a run is active and a scheduled time waits for it.
pub const ACTIVE_POLL: SignedDuration = SignedDuration::from_secs(30);
/// Velero phases after which a backup does not change any more (apart from deletion).
const VELERO_TERMINAL: [&str; 4] = ["Completed", "PartiallyFailed", "Failed", "FailedValidation"];

/// Why a schedule cannot be used. Each becomes the condition `Scheduled=False`, reason
/// [`ScheduleError::reason`], with the error as its message; nothing is created or deleted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The cron expression does not parse.
    #[error("cron {cron:?} is not a valid cron expression: {problem}")]
    Cron {
        /// The expression.
        cron: String,
        /// The parser's words.
        problem: String,
    },
    /// The cron expression parses but never fires (e.g. `0 0 30 2 *`).
    #[error("cron {cron:?} in {zone} never fires")]
    NeverFires {
        /// The expression.
        cron: String,
        /// The time zone.
        zone: String,
    },
    /// The time zone is not in the time zone database.
    #[error("timeZone {zone:?} is not a time zone of the IANA database ({problem})")]
    TimeZone {
        /// The name.
        zone: String,
        /// The database's words.
        problem: String,
    },
    /// `ttl` is not a duration.
    #[error("ttl {ttl:?} is not a duration such as 168h or 30m")]
    Ttl {
        /// The value.
        ttl: String,
    },
    /// The ApplicationInstance lacks metadata every object read from the API server has.
    #[error("the ApplicationInstance has no metadata.{0} (it was not read from the API server)")]
    MissingMetadata(&'static str),
}

impl ScheduleError {
    /// The condition reason: always `InvalidSchedule`.
    pub fn reason(&self) -> &'static str {
        api::schedule::conditions::REASON_INVALID_SCHEDULE
    }
}

/// A parsed, usable schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    zone: TimeZone,
    expression: String,
    zone_name: String,
    keep_last: Option<usize>,
    ttl: Option<SignedDuration>,
    policy: MissedRunPolicy,
    starting_deadline: Option<SignedDuration>,
}

impl Schedule {
    /// Parses `spec`: a five-field cron expression or a macro (no seconds, no years), an
    /// IANA zone, a Go duration `ttl`. Checks the expression fires at least once.
    pub fn parse(spec: &BackupSchedule) -> Result<Self, ScheduleError> {
        let zone_name = spec.time_zone.clone().unwrap_or_else(|| DEFAULT_TIME_ZONE.to_owned());
        let cron_error = |problem: String| ScheduleError::Cron {
            cron: spec.cron.clone(),
            problem,
        };
        api::schedule::cron_shape(&spec.cron).map_err(&cron_error)?;
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(&spec.cron)
            .map_err(|e| cron_error(e.to_string()))?;
        api::schedule::time_zone_shape(&zone_name).map_err(|problem| ScheduleError::TimeZone {
            zone: zone_name.clone(),
            problem,
        })?;
        let zone = jiff::tz::db().get(&zone_name).map_err(|e| ScheduleError::TimeZone {
            zone: zone_name.clone(),
            problem: e.to_string(),
        })?;
        let ttl = match &spec.ttl {
            Some(ttl) => Some(parse_duration(ttl).ok_or_else(|| ScheduleError::Ttl { ttl: ttl.clone() })?),
            None => None,
        };
        let policy = spec.missed_run_policy.unwrap_or_default();
        let starting_deadline = match (spec.starting_deadline_seconds, policy) {
            (Some(s), _) => Some(SignedDuration::from_secs(s.max(1))),
            (None, MissedRunPolicy::Skip) => Some(SignedDuration::from_secs(DEFAULT_SKIP_DEADLINE_SECONDS)),
            (None, MissedRunPolicy::RunOnce) => None,
        };
        let schedule = Self {
            cron,
            zone,
            expression: spec.cron.clone(),
            zone_name,
            keep_last: spec.keep_last.and_then(|n| usize::try_from(n.max(1)).ok()),
            ttl,
            policy,
            starting_deadline,
        };
        // One search from a fixed instant tells whether the expression ever fires.
        schedule
            .next_after(Timestamp::UNIX_EPOCH)
            .map_err(|_| ScheduleError::NeverFires {
                cron: spec.cron.clone(),
                zone: schedule.zone_name.clone(),
            })?;
        Ok(schedule)
    }

    /// `<cron> in <zone>`, as recorded in `status.backupSchedule.schedule`.
    pub fn describe(&self) -> String {
        format!("{} in {}", self.expression, self.zone_name)
    }

    /// The missed-run policy in force.
    pub fn policy(&self) -> MissedRunPolicy {
        self.policy
    }

    /// The first scheduled time strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Result<Timestamp, croner::errors::CronError> {
        let start = Zoned::new(t, self.zone.clone());
        self.cron.find_next_occurrence(&start, false).map(|z| z.timestamp())
    }

    /// The newest scheduled time `s` with `after < s <= t`, if any.
    pub fn newest_in(&self, after: Timestamp, t: Timestamp) -> Option<Timestamp> {
        let end = Zoned::new(t, self.zone.clone());
        let newest = self.cron.find_previous_occurrence(&end, true).ok()?.timestamp();
        (newest > after && newest <= t).then_some(newest)
    }
}

/// A Go duration (`1h30m`, `90s`, `1.5h`, `250ms`) as a [`SignedDuration`]; `None` when it
/// is not one (or overflows).
pub fn parse_duration(s: &str) -> Option<SignedDuration> {
    if s.is_empty() {
        return None;
    }
    let mut total_ms: f64 = 0.0;
    let mut rest = s;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (number, tail) = rest.split_at(number_len);
        if number.is_empty() || number.starts_with('.') || number.ends_with('.') || number.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        let (unit_ms, unit_len) = if tail.starts_with("ms") {
            (1.0, 2)
        } else if tail.starts_with('s') {
            (1_000.0, 1)
        } else if tail.starts_with('m') {
            (60_000.0, 1)
        } else if tail.starts_with('h') {
            (3_600_000.0, 1)
        } else {
            return None;
        };
        total_ms += value * unit_ms;
        rest = tail.get(unit_len..)?;
    }
    // Bounded to ~100 years: anything longer is not a retention, and stays representable.
    if !total_ms.is_finite() || total_ms > 3.2e12 {
        return None;
    }
    Some(SignedDuration::from_millis(total_ms.round() as i64))
}

/// The name of the run of `app` scheduled at `at`: `<app>-backup-<YYYYMMDDhhmm>` (UTC), made
/// a DNS-1123 label (hashed when too long).
pub fn run_name(app: &str, at: Timestamp) -> String {
    names::dns_label(&format!("{app}-backup-{}", at.strftime("%Y%m%d%H%M")))
}

/// The `requestId` of the run of `app` scheduled at `at`:
/// `backup-schedule:<app>:<YYYYMMDDThhmmZ>` (UTC).
pub fn request_id(app: &str, at: Timestamp) -> String {
    format!("{REQUEST_ID_PREFIX}:{app}:{}", at.strftime("%Y%m%dT%H%MZ"))
}

/// The scheduled time of `op` if it is a run of `app`'s schedule (see the module docs for
/// every check), else `None`.
pub fn scheduled_time_of(op: &Operation, app: &ApplicationInstance) -> Option<Timestamp> {
    let app_name = app.metadata.name.as_deref()?;
    let app_uid = app.metadata.uid.as_deref()?;
    let labels = op.metadata.labels.as_ref()?;
    if labels.get(LABEL_SCHEDULE).map(String::as_str) != Some(app_name)
        || op.metadata.namespace != app.metadata.namespace
        || op.spec.type_ != OperationType::Backup
        || op.spec.application_ref.name != app_name
    {
        return None;
    }
    let owned = op.metadata.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true) && o.kind == "ApplicationInstance" && o.uid == app_uid && o.name == app_name
    });
    if !owned {
        return None;
    }
    let at: Timestamp = op
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_SCHEDULED_TIME)?
        .parse()
        .ok()?;
    let name_matches = op.metadata.name.as_deref() == Some(run_name(app_name, at).as_str());
    (name_matches && op.spec.request_id == request_id(app_name, at)).then_some(at)
}

/// A Velero Backup as the engine listed it (in Velero's namespace, by the label
/// `vworkspace.io/application=<app>`; the rest is checked here).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObservedBackup {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.creationTimestamp`.
    pub created: Option<Timestamp>,
    /// `status.phase` (`Completed`, `InProgress`, `Deleting`, …), as Velero wrote it.
    pub phase: Option<String>,
    /// A `DeleteBackupRequest` for it exists already.
    pub deletion_requested: bool,
}

/// Everything [`decide`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The ApplicationInstance: its name, namespace, UID, `spec.backupSchedule` and
    /// `status.backupSchedule`.
    pub app: &'a ApplicationInstance,
    /// The current time.
    pub now: Timestamp,
    /// Operations of the namespace labelled [`LABEL_SCHEDULE`]`=<app>` (others are ignored).
    pub runs: &'a [Operation],
    /// Velero Backups labelled with the application (others are ignored).
    pub backups: &'a [ObservedBackup],
}

/// What the engine does now.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    /// Create this run by server-side apply. Its name is derived from its scheduled time, so
    /// a repeated apply changes nothing.
    pub create: Option<Operation>,
    /// The scheduled time the missed-run policy skipped in this pass.
    pub skipped: Option<Timestamp>,
    /// Velero Backups to delete, each through a `DeleteBackupRequest`
    /// ([`delete_backup_request`]).
    pub delete_backups: Vec<String>,
    /// Runs (Operations in the application's namespace) to delete: no Velero Backup of theirs
    /// is left and retention no longer shows them.
    pub delete_runs: Vec<String>,
    /// Look again at this time at the latest (the next scheduled time, or sooner while a run
    /// is active). `None`: only a change of the ApplicationInstance matters.
    pub requeue_at: Option<Timestamp>,
    /// The `status.backupSchedule` to write when it differs from the current one; `None`:
    /// remove it (no schedule).
    pub status: Option<BackupScheduleStatus>,
}

fn time(t: Timestamp) -> Time {
    Time(t)
}

fn is_terminal(op: &Operation) -> bool {
    op.status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(OperationPhase::is_terminal)
}

/// Decides what to do about `observed.app`'s backup schedule now. Never fails: an unusable
/// schedule is reported in the returned status (`Scheduled=False`, `InvalidSchedule`) and
/// nothing is created or deleted.
pub fn decide(observed: Observed<'_>) -> Decision {
    let Observed {
        app,
        now,
        runs,
        backups,
    } = observed;
    let Some(spec) = app.spec.backup_schedule.as_ref() else {
        return Decision::default();
    };
    let previous = app
        .status
        .as_ref()
        .and_then(|s| s.backup_schedule.clone())
        .unwrap_or_default();
    let generation = app.metadata.generation;
    let now_time = time(now);
    let mut status = previous.clone();

    let metadata = [
        ("name", &app.metadata.name),
        ("namespace", &app.metadata.namespace),
        ("uid", &app.metadata.uid),
    ];
    let parsed = match metadata.iter().find(|(_, v)| v.as_deref().is_none_or(str::is_empty)) {
        Some((field, _)) => Err(ScheduleError::MissingMetadata(field)),
        None => Schedule::parse(spec),
    };
    let schedule = match parsed {
        Ok(s) => s,
        Err(e) => {
            status.next_schedule_time = None;
            let mut c = api::conditions::Setter::new(&mut status.conditions, generation, &now_time);
            c.set(api::schedule::conditions::SCHEDULED, "False", e.reason(), e.to_string());
            return Decision {
                status: Some(status),
                ..Decision::default()
            };
        }
    };
    let app_name = app.metadata.name.clone().unwrap_or_default();

    // The runs of this schedule, oldest first.
    let mut ours: Vec<(Timestamp, &Operation)> = runs
        .iter()
        .filter_map(|op| scheduled_time_of(op, app).map(|t| (t, op)))
        .collect();
    ours.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.metadata.name.cmp(&b.1.metadata.name)));

    // A changed schedule starts afresh.
    let describe = schedule.describe();
    let same_schedule = previous.schedule.as_deref() == Some(describe.as_str());
    let since = match (&previous.since, same_schedule) {
        (Some(since), true) => since.0,
        _ => now,
    };
    status.schedule = Some(describe);
    status.since = Some(time(since));
    if !same_schedule {
        status.last_skipped_time = None;
    }
    let newest_run = ours.last().map(|(t, _)| *t);
    let last_scheduled = [newest_run, status.last_schedule_time.as_ref().map(|t| t.0)]
        .into_iter()
        .flatten()
        .max();
    status.last_schedule_time = last_scheduled.map(time);
    let last_success = ours
        .iter()
        .filter(|(_, op)| op.status.as_ref().and_then(|s| s.phase) == Some(OperationPhase::Succeeded))
        .filter_map(|(_, op)| op.status.as_ref().and_then(|s| s.completion_time.as_ref()).map(|t| t.0))
        .chain(status.last_successful_time.as_ref().map(|t| t.0))
        .max();
    status.last_successful_time = last_success.map(time);
    let active = ours.iter().rev().find(|(_, op)| !is_terminal(op)).map(|(_, op)| *op);
    status.active = active.and_then(|op| op.metadata.name.clone());

    let mut decision = Decision::default();
    let handled = [
        Some(since),
        last_scheduled,
        status.last_skipped_time.as_ref().map(|t| t.0),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(since);

    let mut c = api::conditions::Setter::new(&mut status.conditions, generation, &now_time);
    if spec.suspend {
        c.set(
            api::schedule::conditions::SCHEDULED,
            "False",
            api::schedule::conditions::REASON_SUSPENDED,
            "backupSchedule.suspend is true: no runs are created; retention goes on",
        );
        status.next_schedule_time = None;
    } else {
        c.set(
            api::schedule::conditions::SCHEDULED,
            "True",
            api::schedule::conditions::REASON_SCHEDULED,
            format!("Backups run at {}", schedule.describe()),
        );
        let mut wake: Vec<Timestamp> = Vec::new();
        if let Some(due) = schedule.newest_in(handled, now) {
            let late = now.duration_since(due);
            let too_late = schedule.starting_deadline.is_some_and(|d| late > d);
            if too_late {
                decision.skipped = Some(due);
                status.last_skipped_time = Some(time(due));
            } else if active.is_some() {
                wake.push(now.checked_add(ACTIVE_POLL).unwrap_or(now));
                if let Some(d) = schedule.starting_deadline
                    && let Ok(at) = due.checked_add(d)
                {
                    wake.push(at.checked_add(SignedDuration::from_secs(1)).unwrap_or(at));
                }
            } else {
                decision.create = Some(run(app, &app_name, spec, &schedule, due));
                status.last_schedule_time = Some(time(due));
                status.active = Some(run_name(&app_name, due));
            }
        }
        match schedule.next_after(now) {
            Ok(next) => {
                status.next_schedule_time = Some(time(next));
                wake.push(next);
            }
            Err(_) => status.next_schedule_time = None,
        }
        decision.requeue_at = wake.into_iter().min();
    }

    retention(&schedule, now, &ours, backups, app, &mut decision, &mut status);
    decision.status = Some(status);
    decision
}

/// The run of `app` scheduled at `at`.
fn run(
    app: &ApplicationInstance,
    app_name: &str,
    spec: &BackupSchedule,
    schedule: &Schedule,
    at: Timestamp,
) -> Operation {
    let name = run_name(app_name, at);
    let backup = BackupParams {
        ttl: spec.ttl.clone(),
        ..spec.backup.clone().unwrap_or_default()
    };
    let deadline = schedule
        .starting_deadline
        .and_then(|d| at.checked_add(d).ok())
        .map(time);
    Operation {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: app.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
                (LABEL_SCHEDULE.to_owned(), app_name.to_owned()),
                (meta::LABEL_APPLICATION.to_owned(), app_name.to_owned()),
            ])),
            annotations: Some(BTreeMap::from([(
                ANNOTATION_SCHEDULED_TIME.to_owned(),
                at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            )])),
            owner_references: Some(vec![OwnerReference {
                api_version: api::API_VERSION.to_owned(),
                kind: "ApplicationInstance".to_owned(),
                name: app_name.to_owned(),
                uid: app.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: OperationSpec {
            type_: OperationType::Backup,
            application_ref: ApplicationReference {
                name: app_name.to_owned(),
            },
            request_id: request_id(app_name, at),
            deadline,
            backup: Some(backup),
            ..OperationSpec::default()
        },
        status: None,
    }
}

/// Whether `backup` carries the labels the backup engine put on the Velero Backup of `run`.
fn is_backup_of(backup: &ObservedBackup, run: &Operation, app: &ApplicationInstance) -> bool {
    let label = |k: &str| backup.labels.get(k).map(String::as_str);
    let (Some(name), Some(uid)) = (run.metadata.name.as_deref(), run.metadata.uid.as_deref()) else {
        return false;
    };
    label(LABEL_MANAGED_BY) == Some(MANAGED_BY)
        && label(meta::LABEL_OPERATION_TYPE) == Some(OperationType::Backup.as_str())
        && label(meta::LABEL_APPLICATION) == app.metadata.name.as_deref()
        && label(meta::LABEL_OPERATION_NAMESPACE) == app.metadata.namespace.as_deref()
        && label(meta::LABEL_OPERATION) == Some(names::label_value(name).as_str())
        && label(meta::LABEL_OPERATION_UID) == Some(names::label_value(uid).as_str())
}

fn retention(
    schedule: &Schedule,
    now: Timestamp,
    ours: &[(Timestamp, &Operation)],
    backups: &[ObservedBackup],
    app: &ApplicationInstance,
    decision: &mut Decision,
    status: &mut BackupScheduleStatus,
) {
    // Every Velero Backup of one of our runs, with the run it belongs to.
    let of_ours: Vec<(&ObservedBackup, &Operation)> = backups
        .iter()
        .filter_map(|b| {
            ours.iter()
                .find(|(_, run)| is_backup_of(b, run, app))
                .map(|(_, run)| (b, *run))
        })
        .collect();

    // Those that ended and are not being deleted, newest first.
    let mut ended: Vec<(&ObservedBackup, Timestamp)> = of_ours
        .iter()
        .filter(|(b, _)| !b.deletion_requested && b.phase.as_deref() != Some("Deleting"))
        .filter(|(b, _)| b.phase.as_deref().is_some_and(|p| VELERO_TERMINAL.contains(&p)))
        .filter_map(|(b, _)| b.created.map(|c| (*b, c)))
        .collect();
    ended.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.name.cmp(&a.0.name)));

    let expired = |created: Timestamp| {
        schedule
            .ttl
            .is_some_and(|ttl| created.checked_add(ttl).is_ok_and(|end| end <= now))
    };
    let newest_completed = ended
        .iter()
        .find(|(b, _)| b.phase.as_deref() == Some("Completed"))
        .map(|(_, c)| *c);
    let mut kept = Vec::new();
    let mut completed_seen = 0usize;
    for (backup, created) in &ended {
        let completed = backup.phase.as_deref() == Some("Completed");
        let delete = if expired(*created) {
            true
        } else if completed {
            completed_seen += 1;
            schedule.keep_last.is_some_and(|n| completed_seen > n)
        } else {
            newest_completed.is_some_and(|newest| newest > *created)
        };
        if delete {
            decision.delete_backups.push(backup.name.clone());
        } else if completed {
            kept.push(backup.name.clone());
        }
    }
    kept.truncate(MAX_KEPT_BACKUPS);
    status.kept_backups = kept;

    // Runs: deleted once none of their Velero Backups is left, outside the newest ones.
    let history = schedule.keep_last.unwrap_or(1).max(1);
    let newest_first: Vec<&Operation> = ours.iter().rev().map(|(_, run)| *run).collect();
    for run in newest_first.iter().skip(history) {
        let has_backup = of_ours.iter().any(|(_, r)| r.metadata.uid == run.metadata.uid);
        if is_terminal(run)
            && !has_backup
            && let Some(name) = &run.metadata.name
        {
            decision.delete_runs.push(name.clone());
        }
    }
}

/// A Velero `DeleteBackupRequest` for the Backup `backup` of `app`'s schedule, in Velero's
/// namespace: named after the backup (so asking twice is one request), labelled
/// `velero.io/backup-name` (as the Velero CLI does) and with the application's labels.
pub fn delete_backup_request(backup: &str, velero_namespace: &str, app: &ApplicationInstance) -> Value {
    json!({
        "apiVersion": crate::velero::API_VERSION,
        "kind": "DeleteBackupRequest",
        "metadata": {
            "name": names::with_suffix(backup, "delete"),
            "namespace": velero_namespace,
            "labels": {
                "velero.io/backup-name": names::label_value(backup),
                LABEL_MANAGED_BY: MANAGED_BY,
                LABEL_SCHEDULE: app.metadata.name.clone().unwrap_or_default(),
                meta::LABEL_APPLICATION: app.metadata.name.clone().unwrap_or_default(),
                meta::LABEL_OPERATION_NAMESPACE: app.metadata.namespace.clone().unwrap_or_default(),
            },
        },
        "spec": {"backupName": backup},
    })
}

#[cfg(test)]
mod tests;
