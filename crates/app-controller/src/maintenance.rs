//! Chart version changes wait for the application's maintenance windows (ADR 0009). Pure:
//! the time and what the engine reports are passed in.
//!
//! A change of `spec.chart.version` away from what the engine objects hold is applied only
//! inside a window. It is applied at once when:
//! - the application declares no windows;
//! - nothing was materialised yet (an install is not a change), or the engine objects'
//!   version cannot be read;
//! - the version is the one an Upgrade or Rollback Operation set (annotation
//!   `vworkspace.io/operation-chart-version`): the Operation passed its own window check,
//!   or is `urgent`;
//! - an Operation holds the release suspended (a Restore, itself started in a window or
//!   urgent): the suspension must reach the release, and the change goes with it.
//!
//! While a change waits, nothing else of the spec reaches the release either: the release
//! stays exactly as it was, so new values never meet the old chart.

use std::time::Duration;

use api::ApplicationInstance;
use api::conditions::reasons;
use api::maintenance::ANNOTATION_OPERATION_CHART_VERSION;
use jiff::Timestamp;
use operations::maintenance::{WindowState, Windows};

/// The version Flux is given when the spec sets none (`helmengine`'s default).
const ANY_VERSION: &str = "*";

/// What to do with the desired state now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChartChange {
    /// Materialise as usual.
    Apply,
    /// Leave the release as it is; report `Reconciling=True` with this reason and message,
    /// and look again after `recheck` (the window's opening) at the latest.
    Hold {
        /// One of `api::conditions::reasons`.
        reason: &'static str,
        /// Names the waiting version and the window.
        message: String,
        /// When to look again.
        recheck: Duration,
    },
}

/// Decides whether `app`'s chart version may reach the release at `now`, given the version
/// the engine objects hold (`None`: nothing materialised, or unreadable) and whether an
/// Operation holds the release suspended. `longest_wait` caps `recheck`.
pub fn chart_change(
    app: &ApplicationInstance,
    materialized_version: Option<&str>,
    suspended_by_operation: bool,
    now: Timestamp,
    longest_wait: Duration,
) -> ChartChange {
    if app.spec.maintenance_windows.is_empty() || suspended_by_operation {
        return ChartChange::Apply;
    }
    let Some(current) = materialized_version else {
        return ChartChange::Apply;
    };
    let desired = app.spec.chart.version.as_deref().unwrap_or(ANY_VERSION);
    let from_operation = app
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_OPERATION_CHART_VERSION))
        .is_some_and(|v| v == desired);
    if desired == current || from_operation {
        return ChartChange::Apply;
    }
    let change = format!("the chart version change from {current} to {desired}");
    match Windows::parse(&app.spec.maintenance_windows) {
        Err(problem) => ChartChange::Hold {
            reason: reasons::INVALID_MAINTENANCE_WINDOW,
            message: format!(
                "{change} is held: the maintenance windows cannot be used ({problem}); an urgent Upgrade Operation applies it at once"
            ),
            recheck: longest_wait,
        },
        Ok(windows) => match windows.at(now) {
            WindowState::Unrestricted | WindowState::Open { .. } => ChartChange::Apply,
            WindowState::Closed { opens, window } => ChartChange::Hold {
                reason: reasons::WAITING_FOR_MAINTENANCE_WINDOW,
                message: format!(
                    "{change} waits for the maintenance window {window}, which opens at {opens}; the release is left as it is until then (an urgent Upgrade Operation applies it at once)"
                ),
                recheck: wait_until(now, opens).min(longest_wait),
            },
        },
    }
}

/// From `now` to `at` (at least a second, so a requeue never spins).
fn wait_until(now: Timestamp, at: Timestamp) -> Duration {
    let millis = at.duration_since(now).as_millis().max(1_000);
    Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use api::maintenance::{MaintenanceWindow, Weekday};
    use api::{ApplicationInstanceSpec, ChartSpec};

    use super::*;

    const LONGEST: Duration = Duration::from_secs(600);

    // 2026-11-26 is a Thursday; the window opens at 12:01 UTC.
    fn now() -> Timestamp {
        "2026-11-26T12:00:00Z".parse().unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn app(version: Option<&str>, windows: &[(&str, &str)], annotation: Option<&str>) -> ApplicationInstance {
        let mut app = ApplicationInstance::new(
            "wiki",
            ApplicationInstanceSpec {
                chart: ChartSpec {
                    name: "wiki".into(),
                    version: version.map(str::to_owned),
                    ..Default::default()
                },
                maintenance_windows: windows
                    .iter()
                    .map(|(start, zone)| MaintenanceWindow {
                        days: vec![Weekday::Thursday],
                        start: (*start).into(),
                        duration: "10m".into(),
                        time_zone: Some((*zone).into()),
                    })
                    .collect(),
                ..Default::default()
            },
        );
        app.metadata.annotations =
            annotation.map(|v| BTreeMap::from([(ANNOTATION_OPERATION_CHART_VERSION.to_owned(), v.to_owned())]));
        app
    }

    /// Name, application, version the release holds, suspended by an Operation, time, expected.
    type Case = (
        &'static str,
        ApplicationInstance,
        Option<&'static str>,
        bool,
        Timestamp,
        ChartChange,
    );

    #[test]
    fn when_a_chart_version_change_waits() {
        let window = [("12:01", "UTC")];
        let waiting = ChartChange::Hold {
            reason: reasons::WAITING_FOR_MAINTENANCE_WINDOW,
            message:
                "the chart version change from 0.1.0 to 0.2.0 waits for the maintenance window Thursday 12:01 for 10m \
                      (UTC), which opens at 2026-11-26T12:01:00Z; the release is left as it is until then (an urgent \
                      Upgrade Operation applies it at once)"
                    .into(),
            recheck: Duration::from_secs(60),
        };
        let cases: Vec<Case> = vec![
            ("no windows", app(Some("0.2.0"), &[], None), Some("0.1.0"), false, now(), ChartChange::Apply),
            ("no change", app(Some("0.1.0"), &window, None), Some("0.1.0"), false, now(), ChartChange::Apply),
            ("a change outside the window waits", app(Some("0.2.0"), &window, None), Some("0.1.0"), false, now(), waiting),
            (
                "inside the window it goes",
                app(Some("0.2.0"), &window, None),
                Some("0.1.0"),
                false,
                "2026-11-26T12:05:00Z".parse().unwrap_or(Timestamp::UNIX_EPOCH),
                ChartChange::Apply,
            ),
            ("an install is not a change", app(Some("0.2.0"), &window, None), None, false, now(), ChartChange::Apply),
            (
                "the version an Operation set goes",
                app(Some("0.2.0"), &window, Some("0.2.0")),
                Some("0.1.0"),
                false,
                now(),
                ChartChange::Apply,
            ),
            (
                "another version than the Operation's waits",
                app(Some("0.3.0"), &window, Some("0.2.0")),
                Some("0.2.0"),
                false,
                now(),
                ChartChange::Hold {
                    reason: reasons::WAITING_FOR_MAINTENANCE_WINDOW,
                    message: "the chart version change from 0.2.0 to 0.3.0 waits for the maintenance window Thursday 12:01 \
                              for 10m (UTC), which opens at 2026-11-26T12:01:00Z; the release is left as it is until then \
                              (an urgent Upgrade Operation applies it at once)"
                        .into(),
                    recheck: Duration::from_secs(60),
                },
            ),
            (
                "a release suspended by an Operation takes the change with the suspension",
                app(Some("0.2.0"), &window, None),
                Some("0.1.0"),
                true,
                now(),
                ChartChange::Apply,
            ),
            (
                "unset version means any",
                app(None, &window, None),
                Some("*"),
                false,
                now(),
                ChartChange::Apply,
            ),
        ];
        for (name, app, current, suspended, at, expected) in cases {
            assert_eq!(chart_change(&app, current, suspended, at, LONGEST), expected, "{name}");
        }
    }

    #[test]
    fn the_recheck_is_capped_and_unusable_windows_hold() {
        let far = app(Some("0.2.0"), &[("11:00", "UTC")], None);
        assert!(matches!(
            chart_change(&far, Some("0.1.0"), false, now(), LONGEST),
            ChartChange::Hold { recheck, .. } if recheck == LONGEST
        ));
        let bad = app(Some("0.2.0"), &[("12:01", "Mars/Olympus")], None);
        match chart_change(&bad, Some("0.1.0"), false, now(), LONGEST) {
            ChartChange::Hold { reason, message, .. } => {
                assert_eq!(reason, reasons::INVALID_MAINTENANCE_WINDOW);
                assert!(
                    message.contains("\"Mars/Olympus\" is not in the time zone database"),
                    "{message}"
                );
            }
            ChartChange::Apply => panic!("unusable windows let the change through"),
        }
    }
}
