//! Maintenance windows in the protocol (1.2): Odoo sends `spec.maintenanceWindows` of an
//! application's spec ([`api::maintenance::MaintenanceWindow`]) and `spec.urgent` of an
//! Operation's spec verbatim (ADR 0009, `docs/adr/0009-maintenance-windows.md`); the agent
//! checks the windows' shape with the rest of the document ([`check`]). `urgent` is a plain
//! boolean and needs no check.
//!
//! Only what the CRD would reject for sure is checked here, so a document is never refused
//! for what the cluster could accept: whether a time zone exists, or a duration lies between
//! 1m and 168h in whole minutes, is the cluster's to say, as the Operation's `Pending` reason
//! `InvalidMaintenanceWindow` or the application's `Reconciling` reason
//! `InvalidMaintenanceWindow`, both relayed in their reports' conditions.

use api::maintenance::{MAX_WINDOWS, MaintenanceWindow, Weekday};

use crate::version::ProtocolVersion;

/// The protocol version that introduced maintenance windows: Odoo sends
/// `spec.maintenanceWindows` and `spec.urgent` only to an agent announcing this version or a
/// later one (an older agent would drop the fields without a word).
pub const SINCE: ProtocolVersion = ProtocolVersion { major: 1, minor: 2 };

/// Longest `duration` the CRD accepts (its `maxLength`).
const MAX_DURATION_LEN: usize = 32;

/// Whether a peer speaking `version` understands maintenance windows and `urgent`.
pub fn supported_by(version: ProtocolVersion) -> bool {
    version.major == SINCE.major && version.minor >= SINCE.minor
}

/// Checks a `spec.maintenanceWindows` against the CRD's rules: at most 16 windows, each with
/// 1–7 days named once, a `start` `HH:MM`, a `duration` shaped as a Go duration (at most 32
/// characters), a time zone shaped as an IANA name. The message names the field.
pub fn check(windows: &[MaintenanceWindow]) -> Result<(), String> {
    if windows.len() > MAX_WINDOWS {
        return Err(format!(
            "spec.maintenanceWindows: {} windows; at most {MAX_WINDOWS} are allowed",
            windows.len()
        ));
    }
    for (i, window) in windows.iter().enumerate() {
        check_window(window).map_err(|problem| format!("spec.maintenanceWindows[{i}]: {problem}"))?;
    }
    Ok(())
}

fn check_window(window: &MaintenanceWindow) -> Result<(), String> {
    if window.days.is_empty() || window.days.len() > Weekday::ALL.len() {
        return Err(format!(
            "days must name 1 to {} days (got {})",
            Weekday::ALL.len(),
            window.days.len()
        ));
    }
    let mut seen = [false; 7];
    for day in &window.days {
        let Some(seen) = seen.get_mut(day.days_from_monday() as usize) else {
            return Err(format!("days names an unknown day {}", day.as_str()));
        };
        if *seen {
            return Err(format!("days names {} more than once", day.as_str()));
        }
        *seen = true;
    }
    api::maintenance::start_shape(&window.start)?;
    let duration = &window.duration;
    if duration.len() > MAX_DURATION_LEN || !crate::schedule::duration_shape(duration) {
        return Err(format!(
            "duration {duration:?} is not a duration such as 2h or 90m (at most {MAX_DURATION_LEN} characters)"
        ));
    }
    if let Some(zone) = &window.time_zone {
        api::schedule::time_zone_shape(zone)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use api::maintenance::Weekday::*;

    use super::*;

    fn weekend() -> MaintenanceWindow {
        MaintenanceWindow {
            days: vec![Saturday, Sunday],
            start: "02:00".into(),
            duration: "2h".into(),
            time_zone: Some("Europe/Brussels".into()),
        }
    }

    #[test]
    fn shapes_the_crd_would_reject_are_refused() {
        assert_eq!(check(&[]), Ok(()));
        assert_eq!(check(&[weekend()]), Ok(()));
        type Mutation = fn(&mut MaintenanceWindow);
        let cases: [(Mutation, &str); 9] = [
            (|w| w.days.clear(), "days must name 1 to 7 days"),
            (|w| w.days = vec![Monday; 8], "days must name 1 to 7 days"),
            (
                |w| w.days = vec![Monday, Tuesday, Monday],
                "days names Monday more than once",
            ),
            (|w| w.start = "25:00".into(), "start \"25:00\""),
            (|w| w.start = "2:00".into(), "start \"2:00\""),
            (|w| w.duration = "2d".into(), "duration \"2d\""),
            (|w| w.duration = String::new(), "duration \"\""),
            (|w| w.duration = "1m".repeat(17), "at most 32 characters"),
            (|w| w.time_zone = Some("../etc/passwd".into()), "timeZone"),
        ];
        for (mutate, words) in cases {
            let mut w = weekend();
            mutate(&mut w);
            let err = check(&[weekend(), w]).unwrap_err();
            assert!(
                err.starts_with("spec.maintenanceWindows[1]: ") && err.contains(words),
                "{err:?} / {words:?}"
            );
        }
        let err = check(&vec![weekend(); MAX_WINDOWS + 1]).unwrap_err();
        assert!(
            err.starts_with("spec.maintenanceWindows: ") && err.contains("at most 16"),
            "{err:?}"
        );
        assert_eq!(check(&vec![weekend(); MAX_WINDOWS]), Ok(()));
    }

    #[test]
    fn what_only_the_cluster_can_tell_is_left_to_it() {
        // A zone missing from the database, a duration out of range or not in whole minutes:
        // the CRD accepts them; the engines and the app controller report them.
        let cases: [fn(&mut MaintenanceWindow); 4] = [
            |w| w.time_zone = Some("Mars/Olympus_Mons".into()),
            |w| w.duration = "0m".into(),
            |w| w.duration = "200h".into(),
            |w| w.duration = "90s".into(),
        ];
        for mutate in cases {
            let mut w = weekend();
            mutate(&mut w);
            assert_eq!(check(&[w.clone()]), Ok(()), "{w:?}");
        }
        let every_day = MaintenanceWindow {
            days: Weekday::ALL.to_vec(),
            time_zone: None,
            ..weekend()
        };
        assert_eq!(check(&[every_day]), Ok(()));
    }

    #[test]
    fn supported_from_1_2() {
        let v = |s: &str| s.parse::<ProtocolVersion>().unwrap();
        assert!(!supported_by(v("1.0")) && !supported_by(v("1.1")));
        assert!(supported_by(v("1.2")) && supported_by(v("1.4")));
        assert!(!supported_by(v("2.0")));
    }
}
