//! Maintenance windows: when an application may be changed
//! ([ADR 0009](../../../docs/adr/0009-maintenance-windows.md)).
//!
//! An ApplicationInstance may declare weekly windows (`spec.maintenanceWindows`). Outside
//! them, its Upgrade, Rollback and Restore Operations wait in `Pending` (reason
//! `QueuedForMaintenanceWindow`, the message naming the next window) unless the Operation
//! is `urgent`, and a chart version change coming from intent is held: the release stays as
//! it is until the next window opens. No windows means always open. The window only gates
//! the start: a change that started inside a window runs to its end.
//!
//! This module holds the types and the shape checks that need no time zone database; the
//! arithmetic is `operations::maintenance`.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most windows an application may declare.
pub const MAX_WINDOWS: usize = 16;
/// Shape of `start`: `HH:MM`, 24-hour clock.
pub const START_PATTERN: &str = r"^([01][0-9]|2[0-3]):[0-5][0-9]$";
/// Shortest window, in minutes.
pub const MIN_DURATION_MINUTES: i64 = 1;
/// Longest window: one week, in minutes (a window at least this long is always open).
pub const MAX_DURATION_MINUTES: i64 = 7 * 24 * 60;
/// Annotation on an ApplicationInstance, set by the upgrade engine together with
/// `spec.chart.version`: the chart version an Upgrade or Rollback Operation set after passing
/// its own window check (or as `urgent`). The app controller does not hold back a change to
/// exactly this version outside the windows: the Operation already decided when it may happen.
pub const ANNOTATION_OPERATION_CHART_VERSION: &str = "vworkspace.io/operation-chart-version";

/// A day of the week.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[allow(missing_docs)]
pub enum Weekday {
    Monday,
    Tuesday,
    Wednesday,
    Thursday,
    Friday,
    Saturday,
    Sunday,
}

impl Weekday {
    /// Every day, Monday first.
    pub const ALL: [Weekday; 7] = [
        Weekday::Monday,
        Weekday::Tuesday,
        Weekday::Wednesday,
        Weekday::Thursday,
        Weekday::Friday,
        Weekday::Saturday,
        Weekday::Sunday,
    ];

    /// Name as written in the spec.
    pub fn as_str(self) -> &'static str {
        match self {
            Weekday::Monday => "Monday",
            Weekday::Tuesday => "Tuesday",
            Weekday::Wednesday => "Wednesday",
            Weekday::Thursday => "Thursday",
            Weekday::Friday => "Friday",
            Weekday::Saturday => "Saturday",
            Weekday::Sunday => "Sunday",
        }
    }

    /// Days since Monday (Monday 0, Sunday 6).
    pub fn days_from_monday(self) -> i8 {
        match self {
            Weekday::Monday => 0,
            Weekday::Tuesday => 1,
            Weekday::Wednesday => 2,
            Weekday::Thursday => 3,
            Weekday::Friday => 4,
            Weekday::Saturday => 5,
            Weekday::Sunday => 6,
        }
    }
}

/// A weekly maintenance window: it opens at `start` (local time in `timeZone`) on each of
/// `days` and stays open for `duration`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// Days on which the window opens (it may run past midnight), each at most once.
    #[schemars(length(min = 1, max = 7), extend("x-kubernetes-list-type" = "set"))]
    pub days: Vec<Weekday>,

    /// Local opening time, `HH:MM` (24-hour clock) in `timeZone`. On a daylight saving night
    /// where that time does not exist, the opening moves forward by the length of the gap
    /// (02:30 becomes 03:30); where it occurs twice, the window opens at its first occurrence.
    #[schemars(regex(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub start: String,

    /// How long the window stays open: a Go duration from `1m` to `168h` (e.g. `2h`, `90m`).
    #[schemars(length(min = 2, max = 32), regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub duration: String,

    /// IANA time zone `start` is read in, e.g. `Europe/Brussels`. Default `UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$")
    )]
    pub time_zone: Option<String>,
}

impl MaintenanceWindow {
    /// The window as people read it: `Saturday, Sunday 02:00 for 2h (Europe/Brussels)`.
    pub fn describe(&self) -> String {
        let days: Vec<&str> = self.days.iter().map(|d| d.as_str()).collect();
        let zone = self.time_zone.as_deref().unwrap_or(crate::schedule::DEFAULT_TIME_ZONE);
        format!("{} {} for {} ({zone})", days.join(", "), self.start, self.duration)
    }
}

/// Checks what [`START_PATTERN`] checks, without a regex engine: `HH:MM`, 00:00 to 23:59.
/// Returns the hour and minute.
pub fn start_shape(start: &str) -> Result<(i8, i8), String> {
    let err = || format!("start {start:?} is not a time HH:MM from 00:00 to 23:59");
    let (h, m) = start.split_once(':').ok_or_else(err)?;
    let two_digits = |s: &str| s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit());
    if !two_digits(h) || !two_digits(m) {
        return Err(err());
    }
    let hour: i8 = h.parse().map_err(|_| err())?;
    let minute: i8 = m.parse().map_err(|_| err())?;
    if hour > 23 || minute > 59 {
        return Err(err());
    }
    Ok((hour, minute))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_shapes() {
        assert_eq!(start_shape("00:00"), Ok((0, 0)));
        assert_eq!(start_shape("23:59"), Ok((23, 59)));
        assert_eq!(start_shape("02:30"), Ok((2, 30)));
        for bad in [
            "",
            "2:30",
            "24:00",
            "12:60",
            "12-30",
            "12:3",
            "١٢:٣٠",
            "12:30:00",
            "+1:30",
        ] {
            assert!(start_shape(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_schema_pattern_is_the_constant() {
        let schema = serde_json::to_value(schemars::schema_for!(MaintenanceWindow)).unwrap_or_default();
        assert_eq!(schema["properties"]["start"]["pattern"], START_PATTERN);
        assert_eq!(
            schema["properties"]["duration"]["pattern"],
            crate::schema::DURATION_PATTERN
        );
        assert_eq!(
            schema["properties"]["timeZone"]["pattern"],
            crate::schedule::TIME_ZONE_PATTERN
        );
    }

    #[test]
    fn describes_itself() {
        let window = MaintenanceWindow {
            days: vec![Weekday::Saturday, Weekday::Sunday],
            start: "02:00".into(),
            duration: "2h".into(),
            time_zone: Some("Europe/Brussels".into()),
        };
        assert_eq!(window.describe(), "Saturday, Sunday 02:00 for 2h (Europe/Brussels)");
    }
}
