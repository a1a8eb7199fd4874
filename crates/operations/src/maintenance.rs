//! Maintenance windows: is the application's window open at a given time, and if not, when
//! does the next one open ([ADR 0009](../../../docs/adr/0009-maintenance-windows.md))?
//!
//! Pure: the time is passed in. Used by the day-2 engines' gate ([`crate::lifecycle`]) for
//! Upgrade, Rollback and Restore Operations, and by the app controller to hold a chart
//! version change from intent until the next window.

use api::maintenance::{MAX_DURATION_MINUTES, MIN_DURATION_MINUTES, MaintenanceWindow, start_shape};
use api::schedule::{DEFAULT_TIME_ZONE, time_zone_shape};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Span, Timestamp};

use crate::schedule::parse_duration;

/// A window opening (a weekday a window is declared for) is looked for this many days before
/// and after the current local date: enough for a window of up to a week that opened before
/// today, and for the next opening of a window declared on one day a week.
const SCAN_DAYS: i64 = 8;

/// `spec.maintenanceWindows`, checked and ready for arithmetic.
#[derive(Debug, Clone)]
pub struct Windows {
    windows: Vec<Window>,
}

#[derive(Debug, Clone)]
struct Window {
    /// Indexed by days from Monday.
    days: [bool; 7],
    hour: i8,
    minute: i8,
    duration: SignedDuration,
    zone: TimeZone,
    description: String,
}

/// Whether the application may be changed at a given time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowState {
    /// The application declares no windows: always open.
    Unrestricted,
    /// Inside a window, which closes at `closes` (the latest close of the windows open now).
    Open {
        /// When the window open now closes.
        closes: Timestamp,
    },
    /// Outside every window.
    Closed {
        /// When the next window opens.
        opens: Timestamp,
        /// That window, as people read it (`Saturday 02:00 for 2h (Europe/Brussels)`).
        window: String,
    },
}

impl WindowState {
    /// Changes may start now.
    pub fn is_open(&self) -> bool {
        !matches!(self, WindowState::Closed { .. })
    }

    /// The message of something that waits for the window: `the maintenance window
    /// Saturday 02:00 for 2h (UTC) opens at 2026-11-28T02:00:00Z`. `None` when open.
    pub fn waiting_message(&self) -> Option<String> {
        match self {
            WindowState::Closed { opens, window } => Some(format!("the maintenance window {window} opens at {opens}")),
            WindowState::Unrestricted | WindowState::Open { .. } => None,
        }
    }
}

impl Windows {
    /// Checks `windows` (the time zone exists, the start is a time, the duration is 1m to
    /// 168h). The error names the window by its index, as `spec.maintenanceWindows[i]`.
    pub fn parse(windows: &[MaintenanceWindow]) -> Result<Self, String> {
        let parsed = windows
            .iter()
            .enumerate()
            .map(|(i, w)| Window::parse(w).map_err(|problem| format!("spec.maintenanceWindows[{i}]: {problem}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { windows: parsed })
    }

    /// No windows at all: always open.
    pub fn none() -> Self {
        Self { windows: Vec::new() }
    }

    /// No windows: always open.
    pub fn is_unrestricted(&self) -> bool {
        self.windows.is_empty()
    }

    /// The state at `now`.
    pub fn at(&self, now: Timestamp) -> WindowState {
        if self.windows.is_empty() {
            return WindowState::Unrestricted;
        }
        let mut closes: Option<Timestamp> = None;
        let mut next: Option<(Timestamp, &str)> = None;
        for window in &self.windows {
            for (opens, close) in window.openings_around(now) {
                if opens <= now && now < close {
                    closes = Some(closes.map_or(close, |c| c.max(close)));
                } else if opens > now && next.is_none_or(|(t, _)| opens < t) {
                    next = Some((opens, &window.description));
                }
            }
        }
        match (closes, next) {
            (Some(closes), _) => WindowState::Open { closes },
            (None, Some((opens, window))) => WindowState::Closed {
                opens,
                window: window.to_owned(),
            },
            // Every window is declared on at least one day, so an opening lies within a week;
            // reaching this means the time is at the edge of what jiff represents.
            (None, None) => WindowState::Closed {
                opens: Timestamp::MAX,
                window: self.windows.first().map(|w| w.description.clone()).unwrap_or_default(),
            },
        }
    }
}

impl Window {
    fn parse(window: &MaintenanceWindow) -> Result<Self, String> {
        if window.days.is_empty() {
            return Err("days must name at least one day".into());
        }
        let mut days = [false; 7];
        for day in &window.days {
            if let Some(slot) = days.get_mut(day.days_from_monday() as usize) {
                *slot = true;
            }
        }
        let (hour, minute) = start_shape(&window.start)?;
        let duration = parse_duration(&window.duration)
            .filter(|d| {
                let minutes = d.as_secs() / 60;
                d.as_secs() % 60 == 0 && (MIN_DURATION_MINUTES..=MAX_DURATION_MINUTES).contains(&minutes)
            })
            .ok_or_else(|| {
                format!(
                    "duration {:?} is not a whole number of minutes from 1m to 168h",
                    window.duration
                )
            })?;
        let zone_name = window.time_zone.as_deref().unwrap_or(DEFAULT_TIME_ZONE);
        time_zone_shape(zone_name)?;
        let zone = jiff::tz::db()
            .get(zone_name)
            .map_err(|_| format!("timeZone {zone_name:?} is not in the time zone database"))?;
        Ok(Self {
            days,
            hour,
            minute,
            duration,
            zone,
            description: window.describe(),
        })
    }

    /// Every `(opens, closes)` of this window whose local opening date lies within
    /// [`SCAN_DAYS`] of `now`'s local date.
    fn openings_around(&self, now: Timestamp) -> impl Iterator<Item = (Timestamp, Timestamp)> + '_ {
        let today = now.to_zoned(self.zone.clone()).date();
        (-SCAN_DAYS..=SCAN_DAYS).filter_map(move |offset| {
            let date = today.checked_add(Span::new().days(offset)).ok()?;
            if !self
                .days
                .get(date.weekday().to_monday_zero_offset() as usize)
                .copied()
                .unwrap_or(false)
            {
                return None;
            }
            // A local time inside a daylight saving gap moves forward by the gap's length; a
            // time that occurs twice takes its first occurrence (jiff's `compatible`, as RFC 5545).
            let opens = date
                .at(self.hour, self.minute, 0, 0)
                .to_zoned(self.zone.clone())
                .ok()?
                .timestamp();
            let closes = opens.checked_add(self.duration).ok()?;
            Some((opens, closes))
        })
    }
}

#[cfg(test)]
mod tests {
    use api::maintenance::Weekday::{self, *};

    use super::*;

    fn window(days: &[Weekday], start: &str, duration: &str, zone: Option<&str>) -> MaintenanceWindow {
        MaintenanceWindow {
            days: days.to_vec(),
            start: start.into(),
            duration: duration.into(),
            time_zone: zone.map(str::to_owned),
        }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn state(windows: &[MaintenanceWindow], now: &str) -> WindowState {
        Windows::parse(windows)
            .map(|w| w.at(at(now)))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn closed(opens: &str, window: &str) -> WindowState {
        WindowState::Closed {
            opens: at(opens),
            window: window.into(),
        }
    }

    fn open(closes: &str) -> WindowState {
        WindowState::Open { closes: at(closes) }
    }

    // 2026-11-28 is a Saturday.
    #[test]
    fn weekly_windows_in_a_table() {
        let sat = window(&[Saturday], "02:00", "2h", None);
        let brussels = window(&[Saturday, Sunday], "02:00", "2h", Some("Europe/Brussels"));
        let overnight = window(&[Friday], "23:00", "4h", None);
        let cases: Vec<(&str, Vec<MaintenanceWindow>, &str, WindowState)> = vec![
            (
                "no windows: always open",
                vec![],
                "2026-11-26T12:00:00Z",
                WindowState::Unrestricted,
            ),
            (
                "before the window",
                vec![sat.clone()],
                "2026-11-26T12:00:00Z",
                closed("2026-11-28T02:00:00Z", "Saturday 02:00 for 2h (UTC)"),
            ),
            (
                "at the opening: open",
                vec![sat.clone()],
                "2026-11-28T02:00:00Z",
                open("2026-11-28T04:00:00Z"),
            ),
            (
                "inside",
                vec![sat.clone()],
                "2026-11-28T03:59:59Z",
                open("2026-11-28T04:00:00Z"),
            ),
            (
                "at the close: closed until next week",
                vec![sat.clone()],
                "2026-11-28T04:00:00Z",
                closed("2026-12-05T02:00:00Z", "Saturday 02:00 for 2h (UTC)"),
            ),
            (
                "local time: 02:00 in Brussels is 01:00 UTC in winter",
                vec![brussels.clone()],
                "2026-11-28T00:30:00Z",
                closed(
                    "2026-11-28T01:00:00Z",
                    "Saturday, Sunday 02:00 for 2h (Europe/Brussels)",
                ),
            ),
            (
                "the second day of the same window",
                vec![brussels.clone()],
                "2026-11-28T05:00:00Z",
                closed(
                    "2026-11-29T01:00:00Z",
                    "Saturday, Sunday 02:00 for 2h (Europe/Brussels)",
                ),
            ),
            (
                "past midnight, opened the day before",
                vec![overnight.clone()],
                "2026-11-28T01:00:00Z",
                open("2026-11-28T03:00:00Z"),
            ),
            (
                "the earliest of several windows",
                vec![sat.clone(), overnight.clone()],
                "2026-11-26T12:00:00Z",
                closed("2026-11-27T23:00:00Z", "Friday 23:00 for 4h (UTC)"),
            ),
            (
                "overlapping windows: open until the later close",
                vec![sat.clone(), overnight],
                "2026-11-28T02:30:00Z",
                open("2026-11-28T04:00:00Z"),
            ),
            (
                "a week-long window is always open",
                vec![window(&[Monday], "00:00", "168h", None)],
                "2026-11-29T23:59:59Z",
                open("2026-11-30T00:00:00Z"),
            ),
        ];
        for (name, windows, now, expected) in cases {
            assert_eq!(state(&windows, now), expected, "{name}");
        }
    }

    #[test]
    fn daylight_saving_nights() {
        // 2027-03-28 (a Sunday): Brussels jumps from 02:00 to 03:00. The 02:30 opening does
        // not exist; it moves forward by the gap, to 03:30 CEST (01:30 UTC).
        let spring = window(&[Sunday], "02:30", "1h", Some("Europe/Brussels"));
        assert_eq!(
            state(std::slice::from_ref(&spring), "2027-03-28T00:00:00Z"),
            closed("2027-03-28T01:30:00Z", "Sunday 02:30 for 1h (Europe/Brussels)")
        );
        // 2026-10-25 (a Sunday): 02:30 happens twice; the window opens at the first (00:30 UTC).
        assert_eq!(
            state(&[spring], "2026-10-25T00:00:00Z"),
            closed("2026-10-25T00:30:00Z", "Sunday 02:30 for 1h (Europe/Brussels)")
        );
    }

    #[test]
    fn bad_windows_are_named() {
        let cases = [
            (
                window(&[Monday], "25:00", "1h", None),
                "spec.maintenanceWindows[0]: start \"25:00\"",
            ),
            (
                window(&[Monday], "02:00", "30s", None),
                "duration \"30s\" is not a whole number",
            ),
            (window(&[Monday], "02:00", "169h", None), "from 1m to 168h"),
            (window(&[Monday], "02:00", "90s", None), "whole number of minutes"),
            (
                window(&[Monday], "02:00", "1h", Some("Mars/Olympus")),
                "\"Mars/Olympus\" is not in the time zone database",
            ),
            (
                window(&[Monday], "02:00", "1h", Some("../etc")),
                "not an IANA time zone name",
            ),
            (window(&[], "02:00", "1h", None), "at least one day"),
        ];
        for (bad, words) in cases {
            match Windows::parse(&[window(&[Tuesday], "01:00", "1h", None), bad.clone()]) {
                Ok(_) => panic!("{bad:?} accepted"),
                Err(e) => assert!(
                    e.starts_with("spec.maintenanceWindows[1]: ")
                        && e.contains(words.trim_start_matches("spec.maintenanceWindows[0]: ")),
                    "{e}"
                ),
            }
        }
    }

    #[test]
    fn the_waiting_message_names_window_and_time() {
        let state = state(&[window(&[Saturday], "02:00", "2h", None)], "2026-11-26T12:00:00Z");
        assert_eq!(
            state.waiting_message().as_deref(),
            Some("the maintenance window Saturday 02:00 for 2h (UTC) opens at 2026-11-28T02:00:00Z")
        );
        assert!(!state.is_open());
        assert!(WindowState::Unrestricted.is_open() && WindowState::Unrestricted.waiting_message().is_none());
    }
}
