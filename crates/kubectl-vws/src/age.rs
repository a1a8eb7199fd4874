//! Durations as people read them in a table (`45s`, `12m`, `5h`, `3d`), like kubectl's ages.

use jiff::{SignedDuration, Timestamp};

/// `d` in its largest whole unit, kubectl style; a negative duration reads as `0s`.
pub fn short(d: SignedDuration) -> String {
    let secs = d.as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// Elapsed time with seconds kept (`1m05s`, `2h03m10s`): for a live progress line.
pub fn clock(d: SignedDuration) -> String {
    let secs = d.as_secs().max(0);
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s:02}s"),
        (h, m) => format!("{h}h{m:02}m{s:02}s"),
    }
}

/// How long ago `then` was, at `now`: `5m ago`.
pub fn ago(then: Timestamp, now: Timestamp) -> String {
    format!("{} ago", short(now.duration_since(then)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_ages_use_the_largest_whole_unit() {
        for (secs, want) in [
            (-5, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (3 * 3600 - 1, "179m"),
            (3 * 3600, "3h"),
            (48 * 3600 - 1, "47h"),
            (48 * 3600, "2d"),
            (400 * 86_400, "400d"),
        ] {
            assert_eq!(short(SignedDuration::from_secs(secs)), want, "{secs}");
        }
    }

    #[test]
    fn clocks_keep_seconds() {
        for (secs, want) in [(0, "0s"), (59, "59s"), (65, "1m05s"), (7390, "2h03m10s"), (-1, "0s")] {
            assert_eq!(clock(SignedDuration::from_secs(secs)), want, "{secs}");
        }
    }
}
