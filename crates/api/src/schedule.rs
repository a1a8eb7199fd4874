//! Backups on a schedule: the policy `spec.backupSchedule` of an ApplicationInstance and
//! what the backup engine reports about it in `status.backupSchedule`
//! ([ADR 0008](../../../docs/adr/0008-backup-schedules.md)).
//!
//! Each run is an ordinary Backup `Operation` created by the backup engine, named after
//! the scheduled time, so everything an Operation guarantees (queueing behind a Restore,
//! the tenant's scope, duplicates, Events) holds for scheduled backups too. Retention
//! deletes only backups of this schedule's own runs, through Velero's
//! `DeleteBackupRequest`. The decisions are pure functions in `operations::schedule`.
//!
//! This module holds the types and the shape checks that need no cron parser
//! ([`cron_shape`], [`time_zone_shape`]), shared by the CRD schema and the protocol's
//! validation; whether an expression ever fires, or a zone exists, is decided by the
//! engine and reported as a condition.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{BackupParams, schema};

/// Longest cron expression accepted.
pub const MAX_CRON_LEN: usize = 128;
/// Longest IANA time zone name accepted (the longest in the tz database has 32 characters).
pub const MAX_TIME_ZONE_LEN: usize = 64;
/// Largest `keepLast`.
pub const MAX_KEEP_LAST: i32 = 100;
/// Most entries of `status.backupSchedule.keptBackups`.
pub const MAX_KEPT_BACKUPS: usize = 100;
/// Largest `startingDeadlineSeconds`: one day.
pub const MAX_STARTING_DEADLINE_SECONDS: i64 = 86_400;
/// The time zone of a schedule without `timeZone`.
pub const DEFAULT_TIME_ZONE: &str = "UTC";

/// Shape of a cron expression: five fields of `[0-9A-Za-z*,/?#-]` separated by spaces (minute,
/// hour, day of month, month, day of week), or one of the macros `@yearly`, `@annually`,
/// `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`.
pub const CRON_PATTERN: &str =
    r"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[0-9A-Za-z*,/?#-]+( +[0-9A-Za-z*,/?#-]+){4})$";
/// Shape of an IANA time zone name (`UTC`, `Europe/Brussels`, `America/Argentina/Buenos_Aires`,
/// `Etc/GMT+1`).
pub const TIME_ZONE_PATTERN: &str = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$";

const MACROS: [&str; 7] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
];

/// Checks what [`CRON_PATTERN`] checks, without a regex engine: a macro, or exactly five
/// space-separated fields of `[0-9A-Za-z*,/?#-]`, at most [`MAX_CRON_LEN`] characters.
/// Whether the fields make sense (minute 61, February 30th) is for the parser.
pub fn cron_shape(cron: &str) -> Result<(), String> {
    if cron.is_empty() || cron.len() > MAX_CRON_LEN {
        return Err(format!("cron must be 1 to {MAX_CRON_LEN} characters"));
    }
    if cron.starts_with('@') {
        return if MACROS.contains(&cron) {
            Ok(())
        } else {
            Err(format!(
                "cron {cron:?}: unknown macro; use one of {}",
                MACROS.join(", ")
            ))
        };
    }
    if cron.starts_with(' ') || cron.ends_with(' ') || cron.contains(|c: char| c.is_whitespace() && c != ' ') {
        return Err(format!(
            "cron {cron:?}: fields are separated by single spaces, without leading or trailing ones"
        ));
    }
    let fields: Vec<&str> = cron.split(' ').filter(|f| !f.is_empty()).collect();
    if fields.len() != 5 {
        return Err(format!(
            "cron {cron:?} has {} fields; it needs 5 (minute hour day-of-month month day-of-week) or a macro such as @daily",
            fields.len()
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '*' | ',' | '/' | '?' | '#' | '-');
    match fields.iter().find(|f| !f.chars().all(allowed)) {
        Some(field) => Err(format!(
            "cron {cron:?}: field {field:?} may contain only letters, digits and * , / ? # -"
        )),
        None => Ok(()),
    }
}

/// Checks what [`TIME_ZONE_PATTERN`] checks: the shape of an IANA name, at most
/// [`MAX_TIME_ZONE_LEN`] characters. Whether the zone exists is for the time zone database.
pub fn time_zone_shape(zone: &str) -> Result<(), String> {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-'))
    };
    if zone.is_empty() || zone.len() > MAX_TIME_ZONE_LEN {
        return Err(format!("timeZone must be 1 to {MAX_TIME_ZONE_LEN} characters"));
    }
    if !zone.starts_with(|c: char| c.is_ascii_alphabetic()) || !zone.split('/').all(part_ok) {
        return Err(format!(
            "timeZone {zone:?} is not an IANA time zone name such as UTC or Europe/Brussels"
        ));
    }
    Ok(())
}

/// Backups of the application on a schedule. Each run is a Backup Operation created by the
/// backup engine in the ApplicationInstance's namespace; retention deletes the backups of
/// this schedule's own runs only, through Velero.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.keepLast) || has(self.ttl)")
    .message("backupSchedule needs a retention: keepLast, ttl, or both"))]
#[x_kube(validation = Rule::new("!has(self.backup) || !has(self.backup.ttl)")
    .message("backupSchedule.backup.ttl is not used: set backupSchedule.ttl"))]
pub struct BackupSchedule {
    /// When to back up: a standard five-field cron expression (minute hour day-of-month month
    /// day-of-week, e.g. `0 2 * * *` for 02:00 every night) or a macro (`@daily`, `@hourly`,
    /// …), read in `timeZone`.
    #[schemars(
        length(min = 1, max = 128),
        regex(
            pattern = r"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[0-9A-Za-z*,/?#-]+( +[0-9A-Za-z*,/?#-]+){4})$"
        )
    )]
    pub cron: String,

    /// IANA time zone the cron expression is read in, e.g. `Europe/Brussels`. Default `UTC`.
    /// Across a daylight saving change, a time that does not exist that night runs at the
    /// first minute after the gap, and a time that occurs twice runs once, at its first
    /// occurrence (wildcard or step minutes and hours run on the real clock instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$")
    )]
    pub time_zone: Option<String>,

    /// Keep the newest N completed backups of this schedule; older ones are deleted through
    /// Velero (1 to 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub keep_last: Option<i32>,

    /// Delete a backup of this schedule once it is older than this (Go duration, e.g. `168h`).
    /// Also given to Velero as the backup's `ttl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub ttl: Option<String>,

    /// What happens to a run whose time passed while no run could be made (engine down, the
    /// previous run still going). Default `RunOnce`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed_run_policy: Option<MissedRunPolicy>,

    /// How late after its scheduled time a run may still be created (like a CronJob's
    /// `startingDeadlineSeconds`). Default: 60 for `Skip`, unlimited for `RunOnce`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub starting_deadline_seconds: Option<i64>,

    /// Stop creating runs; retention goes on. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,

    /// Settings of each run's backup (volumes, storage location); `ttl` is the schedule's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupParams>,
}

/// What happens to scheduled times that passed without a run. Only the newest missed time
/// is ever considered: a schedule never catches up run after run.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MissedRunPolicy {
    /// Run the newest missed time once, late (within `startingDeadlineSeconds` when set).
    #[default]
    RunOnce,
    /// Run only on time (within `startingDeadlineSeconds`, default 60 s); a later one is
    /// skipped and recorded as `lastSkippedTime`.
    Skip,
}

impl MissedRunPolicy {
    /// Name as written in the spec.
    pub fn as_str(self) -> &'static str {
        match self {
            MissedRunPolicy::RunOnce => "RunOnce",
            MissedRunPolicy::Skip => "Skip",
        }
    }
}

/// What the backup engine observed and decided about the schedule, in the
/// ApplicationInstance's `status.backupSchedule` (written by the backup engine only).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BackupScheduleStatus {
    /// The schedule these times belong to, `<cron> in <timeZone>`; a changed schedule starts
    /// afresh (times of the old one are not missed runs of the new one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub schedule: Option<String>,
    /// When the schedule as written in `schedule` took effect; earlier times are not runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// The scheduled time of the newest run created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// When the newest successful run completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_time: Option<Time>,
    /// The newest scheduled time skipped by the missed-run policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_skipped_time: Option<Time>,
    /// The next scheduled time (absent while suspended or invalid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Time>,
    /// The run (Backup Operation) that has not ended yet, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub active: Option<String>,
    /// Velero Backups of this schedule that retention keeps, newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub kept_backups: Vec<String>,
    /// `Scheduled`: `True` while runs are being created, `False` with reason `InvalidSchedule`
    /// or `Suspended`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
}

/// Condition type and reasons of `status.backupSchedule.conditions`.
pub mod conditions {
    /// Condition type: whether the schedule creates runs.
    pub const SCHEDULED: &str = "Scheduled";
    /// Reason: the schedule is valid and runs are created on time.
    pub const REASON_SCHEDULED: &str = "Scheduled";
    /// Reason: the cron expression or the time zone cannot be used; nothing is created or deleted.
    pub const REASON_INVALID_SCHEDULE: &str = "InvalidSchedule";
    /// Reason: `suspend: true`; retention goes on.
    pub const REASON_SUSPENDED: &str = "Suspended";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cron_shapes() {
        for ok in [
            "* * * * *",
            "0 2 * * *",
            "*/15 0-6 1,15 JAN-MAR MON-FRI",
            "0 0 L * ?",
            "0 0 * * 5#3",
            "@daily",
            "@hourly",
        ] {
            assert_eq!(cron_shape(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            " * * * * *",
            "* * * * * ",
            "* * * *",
            "* * * * * *",
            "*  * * * *x;",
            "@every 5m",
            "* * * * *\t",
            "0 2 * * * rm",
            &"1".repeat(129),
        ] {
            assert!(cron_shape(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn time_zone_shapes() {
        for ok in [
            "UTC",
            "Europe/Brussels",
            "America/Argentina/Buenos_Aires",
            "Etc/GMT+1",
            "EST5EDT",
        ] {
            assert_eq!(time_zone_shape(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "/UTC",
            "Europe/",
            "Europe//Brussels",
            "1Europe",
            "Europe/Brus sels",
            "../etc/passwd",
            &"A".repeat(65),
        ] {
            assert!(time_zone_shape(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_schema_patterns_are_the_constants() {
        let schema = serde_json::to_value(schemars::schema_for!(BackupSchedule)).unwrap_or_default();
        let props = &schema["properties"];
        assert_eq!(props["cron"]["pattern"], CRON_PATTERN);
        assert_eq!(props["timeZone"]["pattern"], TIME_ZONE_PATTERN);
        assert_eq!(props["ttl"]["pattern"], schema::DURATION_PATTERN);
    }
}
