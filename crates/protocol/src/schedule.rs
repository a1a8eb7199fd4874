//! Backup schedules in the protocol (1.1): Odoo expresses one as `spec.backupSchedule` of an
//! application's spec, verbatim ([`api::schedule::BackupSchedule`], ADR 0008); the agent
//! checks its shape with the rest of the document ([`check`]); the application's report
//! carries what the backup engine wrote about it ([`BackupScheduleReport`]).
//!
//! Only what the CRD would reject for sure is checked here, so a document is never refused
//! for what the cluster could accept: whether a cron expression ever fires, or a time zone
//! exists, is the backup engine's to say, as the condition `Scheduled=False`
//! (`InvalidSchedule`) reported back in [`BackupScheduleReport`].

use api::schedule::{BackupSchedule, BackupScheduleStatus, MAX_KEEP_LAST, MAX_STARTING_DEADLINE_SECONDS};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::version::ProtocolVersion;

/// The protocol version that introduced backup schedules: Odoo sends `spec.backupSchedule`
/// only to an agent announcing this version or a later one (an older agent would drop the
/// field without a word).
pub const SINCE: ProtocolVersion = ProtocolVersion { major: 1, minor: 1 };

/// Whether a peer speaking `version` understands backup schedules.
pub fn supported_by(version: ProtocolVersion) -> bool {
    version.major == SINCE.major && version.minor >= SINCE.minor
}

/// A Go duration (`30m`, `168h`, `1h30m`), as the CRD's pattern `^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
/// ([`api::schema::DURATION_PATTERN`]). Also the shape of a maintenance window's `duration`.
pub(crate) fn duration_shape(s: &str) -> bool {
    let mut rest = s;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let int_len = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if int_len == 0 {
            return false;
        }
        let Some(after) = rest.get(int_len..) else { return false };
        rest = after;
        if let Some(frac) = rest.strip_prefix('.') {
            let frac_len = frac.find(|c: char| !c.is_ascii_digit()).unwrap_or(frac.len());
            if frac_len == 0 {
                return false;
            }
            let Some(after) = frac.get(frac_len..) else {
                return false;
            };
            rest = after;
        }
        rest = if let Some(r) = rest.strip_prefix("ms") {
            r
        } else if let Some(r) = rest.strip_prefix(['s', 'm', 'h']) {
            r
        } else {
            return false;
        };
    }
    true
}

/// Checks a `spec.backupSchedule` against the CRD's rules: cron and time zone shapes, a
/// retention (`keepLast` and/or `ttl`), `keepLast` 1–100, `ttl` a duration,
/// `startingDeadlineSeconds` 1–86400, no `backup.ttl`. The message names the field.
pub fn check(schedule: &BackupSchedule) -> Result<(), String> {
    let at = |problem: String| format!("spec.backupSchedule: {problem}");
    api::schedule::cron_shape(&schedule.cron).map_err(at)?;
    if let Some(zone) = &schedule.time_zone {
        api::schedule::time_zone_shape(zone).map_err(at)?;
    }
    if schedule.keep_last.is_none() && schedule.ttl.is_none() {
        return Err(at("a retention is needed: keepLast, ttl, or both".into()));
    }
    if let Some(n) = schedule.keep_last
        && !(1..=MAX_KEEP_LAST).contains(&n)
    {
        return Err(at(format!("keepLast {n} must be 1 to {MAX_KEEP_LAST}")));
    }
    if let Some(ttl) = &schedule.ttl
        && !duration_shape(ttl)
    {
        return Err(at(format!("ttl {ttl:?} is not a duration such as 168h or 90m")));
    }
    if let Some(s) = schedule.starting_deadline_seconds
        && !(1..=MAX_STARTING_DEADLINE_SECONDS).contains(&s)
    {
        return Err(at(format!(
            "startingDeadlineSeconds {s} must be 1 to {MAX_STARTING_DEADLINE_SECONDS}"
        )));
    }
    if schedule.backup.as_ref().is_some_and(|b| b.ttl.is_some()) {
        return Err(at("backup.ttl is not used: set backupSchedule.ttl".into()));
    }
    Ok(())
}

/// What the backup engine wrote about an application's schedule
/// (`status.backupSchedule`), in its report (protocol 1.1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct BackupScheduleReport {
    /// `Scheduled` condition status: `True`, `False` or `Unknown` (no condition yet).
    pub scheduled: String,
    /// Its reason: `Scheduled`, `InvalidSchedule`, `Suspended`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its message (for `InvalidSchedule`, what is wrong).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The scheduled time of the newest run created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Timestamp>,
    /// When the newest successful run completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_time: Option<Timestamp>,
    /// The newest scheduled time skipped by the missed-run policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_skipped_time: Option<Timestamp>,
    /// The next scheduled time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Timestamp>,
    /// The run (an Operation of the same namespace) not ended yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<String>,
    /// Velero Backups retention keeps, newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_backups: Vec<String>,
}

impl BackupScheduleReport {
    /// The report of `status.backupSchedule`.
    pub fn of(status: &BackupScheduleStatus) -> Self {
        let condition = api::conditions::find(&status.conditions, api::schedule::conditions::SCHEDULED);
        Self {
            scheduled: condition.map_or_else(|| "Unknown".to_owned(), |c| c.status.clone()),
            reason: condition.map(|c| c.reason.clone()),
            message: condition.map(|c| c.message.clone()),
            last_schedule_time: status.last_schedule_time.as_ref().map(|t| t.0),
            last_successful_time: status.last_successful_time.as_ref().map(|t| t.0),
            last_skipped_time: status.last_skipped_time.as_ref().map(|t| t.0),
            next_schedule_time: status.next_schedule_time.as_ref().map(|t| t.0),
            active: status.active.clone(),
            kept_backups: status.kept_backups.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nightly() -> BackupSchedule {
        BackupSchedule {
            cron: "0 2 * * *".into(),
            time_zone: Some("Europe/Brussels".into()),
            keep_last: Some(7),
            ..BackupSchedule::default()
        }
    }

    #[test]
    fn shapes_the_crd_would_reject_are_refused() {
        assert_eq!(check(&nightly()), Ok(()));
        type Mutation = fn(&mut BackupSchedule);
        let cases: [(Mutation, &str); 9] = [
            (|s| s.cron = "* * * *".into(), "has 4 fields"),
            (|s| s.cron = "@every 5m".into(), "unknown macro"),
            (|s| s.time_zone = Some("../etc/passwd".into()), "timeZone"),
            (|s| s.keep_last = None, "a retention is needed"),
            (|s| s.keep_last = Some(0), "keepLast 0"),
            (|s| s.keep_last = Some(101), "keepLast 101"),
            (|s| s.ttl = Some("7d".into()), "ttl \"7d\""),
            (|s| s.starting_deadline_seconds = Some(0), "startingDeadlineSeconds"),
            (
                |s| {
                    s.backup = Some(api::BackupParams {
                        ttl: Some("1h".into()),
                        ..Default::default()
                    })
                },
                "backup.ttl",
            ),
        ];
        for (mutate, words) in cases {
            let mut s = nightly();
            mutate(&mut s);
            let err = check(&s).unwrap_err();
            assert!(
                err.starts_with("spec.backupSchedule: ") && err.contains(words),
                "{err:?} / {words:?}"
            );
        }
        // What only the cluster can tell is left to it.
        for cron in ["61 * * * *", "0 0 30 2 *"] {
            let s = BackupSchedule {
                cron: cron.into(),
                ..nightly()
            };
            assert_eq!(check(&s), Ok(()), "{cron}");
        }
    }

    #[test]
    fn durations() {
        for ok in ["90m", "1h30m", "1.5h", "250ms", "168h"] {
            assert!(duration_shape(ok), "{ok}");
        }
        for bad in ["", "7d", "h", "1.h", ".5h", "1h ", "-1h"] {
            assert!(!duration_shape(bad), "{bad}");
        }
    }

    #[test]
    fn supported_from_1_1() {
        let v = |s: &str| s.parse::<ProtocolVersion>().unwrap();
        assert!(!supported_by(v("1.0")));
        assert!(supported_by(v("1.1")) && supported_by(v("1.4")));
        assert!(!supported_by(v("2.0")));
    }
}
