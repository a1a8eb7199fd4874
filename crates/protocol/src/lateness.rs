//! The rule for Operation intents that carry no `deadline` (protocol.md, "Operations and
//! lateness"): intent must never fire late, so an undated Operation is created only from a
//! document that is itself recent.
//!
//! The agent checks this when it would **create** the Operation, not when the Operation
//! already exists (that one was created in time, and re-sending it is the normal "send until
//! acknowledged"). It does not write a deadline into the Operation: Odoo builds a new
//! `generated_at` for each document, so a written deadline would differ from one revision to
//! the next and an immutable Operation would be refused as changed.

use jiff::{SignedDuration, Timestamp};

use crate::messages::reasons;

/// How old a document may be (by the agent's clock) for an Operation without `deadline` to
/// be created from it. Long enough for a slow push retry or a sync after a short outage;
/// short enough that "restart the database" asked for yesterday does not run today.
pub const MAX_UNDATED_OPERATION_AGE: SignedDuration = SignedDuration::from_hours(1);

/// Why an Operation intent without a deadline is not created: a reason code of
/// [`reasons`] and a message for Odoo's user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TooLate {
    /// [`reasons::DEADLINE_REQUIRED`] or [`reasons::EXPIRED`].
    pub reason: &'static str,
    /// What was found.
    pub message: String,
}

/// `None` when an Operation may be created now: it has a `deadline` (the operations
/// controller enforces that one), or the document's `generated_at` is at most
/// [`MAX_UNDATED_OPERATION_AGE`] old. A `generated_at` in the future (clock skew) counts
/// as recent.
pub fn undated_operation_too_late(
    deadline: Option<Timestamp>,
    generated_at: Option<Timestamp>,
    now: Timestamp,
) -> Option<TooLate> {
    if deadline.is_some() {
        return None;
    }
    let Some(generated_at) = generated_at else {
        return Some(TooLate {
            reason: reasons::DEADLINE_REQUIRED,
            message: "the Operation has no spec.deadline and the document no generated_at: nothing bounds how late it \
                      would run; send a deadline (or generated_at)"
                .to_owned(),
        });
    };
    let age = now.duration_since(generated_at);
    (age > MAX_UNDATED_OPERATION_AGE).then(|| TooLate {
        reason: reasons::EXPIRED,
        message: format!(
            "the Operation has no spec.deadline and its document was generated at {generated_at}, {}s ago (more than \
             {}s): not started late; send it again with a deadline or in a new document",
            age.as_secs(),
            MAX_UNDATED_OPERATION_AGE.as_secs()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_undated_operation_is_created_only_from_a_recent_document() {
        let now: Timestamp = "2026-11-26T12:00:00Z".parse().unwrap();
        let at = |s: &str| Some(s.parse::<Timestamp>().unwrap());
        let cases = [
            (
                "a deadline: the controller enforces it",
                at("2026-11-26T13:00:00Z"),
                None,
                None,
            ),
            (
                "no deadline, no generated_at",
                None,
                None,
                Some(reasons::DEADLINE_REQUIRED),
            ),
            ("generated a minute ago", None, at("2026-11-26T11:59:00Z"), None),
            ("generated exactly an hour ago", None, at("2026-11-26T11:00:00Z"), None),
            (
                "generated two days ago",
                None,
                at("2026-11-24T12:00:00Z"),
                Some(reasons::EXPIRED),
            ),
            ("generated in the future (skew)", None, at("2026-11-26T12:05:00Z"), None),
            (
                "an old document, but a deadline",
                at("2026-11-27T00:00:00Z"),
                at("2026-11-24T12:00:00Z"),
                None,
            ),
        ];
        for (name, deadline, generated_at, want) in cases {
            let got = undated_operation_too_late(deadline, generated_at, now);
            assert_eq!(got.as_ref().map(|t| t.reason), want, "{name}: {got:?}");
        }
    }
}
