//! The next `OperationStatus`, computed from the current one and what the
//! engine decided or observed ([`Outcome`]).
//!
//! Rules (`docs/api/conditions.md` §1 and §3.1):
//! - one summary condition, `Succeeded`: `Unknown` while Pending or Running, `True` or `False` at the end;
//! - `lastTransitionTime` moves only when the condition's `status` changes (apimachinery's rule);
//! - `observedGeneration` is set on the status and on the condition;
//! - `startTime` is set once, when the Operation starts acting; `completionTime` once, when it ends;
//! - children accumulate without duplicates, in the order they were first reported;
//! - a terminal status never changes again, and a started Operation never goes back to Pending;
//! - the result is a pure function of its inputs, so at rest it equals the stored status
//!   and [`needs_write`] is false (no heartbeat writes).

use api::conditions::{self, operation_reasons, types};
use api::{ObjectReference, OperationPhase, OperationStatus};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Longest condition message the API server accepts.
pub const MAX_MESSAGE_CHARS: usize = 32_768;
/// Most children the CRD schema allows in `status.children`.
pub const MAX_CHILDREN: usize = 128;

/// What the engine reports beside the message: Velero's warning and error counts, and a
/// verified restore's evidence.
/// `None` means "not reported", which leaves the status field as it is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    /// `status.warnings` to record.
    pub warnings: Option<i64>,
    /// `status.errors` to record.
    pub errors: Option<i64>,
    /// `status.verification` to record (a verified restore's evidence; boxed, as it is
    /// rare and large).
    pub verification: Option<Box<api::RestoreVerificationStatus>>,
}

/// What the engine decided (before acting) or observed (while acting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not started: waiting for `notBefore` or queued. Ignored once the Operation has started.
    Pending {
        /// `WaitingForNotBefore` or `Queued`.
        reason: String,
        /// Why it waits, for people.
        message: String,
    },
    /// Acting: the children exist and are being driven.
    Running {
        /// Progress, for people.
        message: String,
        /// Children created so far (merged into the recorded ones).
        children: Vec<ObjectReference>,
    },
    /// Ended successfully (reason `Completed`).
    Succeeded {
        /// The final message (also `status.result`).
        result: String,
        /// Children (merged into the recorded ones).
        children: Vec<ObjectReference>,
        /// What the engine reports, to record.
        report: Report,
    },
    /// Ended unsuccessfully.
    Failed {
        /// The `Succeeded=False` reason.
        reason: String,
        /// Why, for people (also `status.result`).
        message: String,
        /// Children (merged into the recorded ones); empty when it failed before acting.
        children: Vec<ObjectReference>,
        /// What the engine reports, to record.
        report: Report,
    },
    /// Not started before `spec.deadline`; nothing was done. Ignored once started.
    Expired {
        /// Names the deadline.
        message: String,
    },
    /// The `requestId` was already handled by `first`; nothing was done (phase Succeeded,
    /// reason `DuplicateRequest`, `status.duplicateOf`). Ignored once started.
    Duplicate {
        /// Name of the Operation that carries the request.
        first: String,
        /// Names the request and `first`.
        message: String,
    },
}

impl Outcome {
    /// A failure before acting: no children, no report.
    pub fn failed(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Outcome::Failed {
            reason: reason.into(),
            message: message.into(),
            children: Vec::new(),
            report: Report::default(),
        }
    }

    /// The phase this outcome leads to.
    pub fn phase(&self) -> OperationPhase {
        match self {
            Outcome::Pending { .. } => OperationPhase::Pending,
            Outcome::Running { .. } => OperationPhase::Running,
            Outcome::Succeeded { .. } | Outcome::Duplicate { .. } => OperationPhase::Succeeded,
            Outcome::Failed { .. } => OperationPhase::Failed,
            Outcome::Expired { .. } => OperationPhase::Expired,
        }
    }
}

/// The status after `outcome`, given the `current` one (`None` when the Operation has no
/// status yet), the Operation's `metadata.generation` and the time of the decision.
///
/// `now` is truncated to whole seconds, the precision `metav1.Time` is stored with, so the
/// value written equals the value read back and the next pass sees no difference.
pub fn next_status(
    current: Option<&OperationStatus>,
    generation: Option<i64>,
    outcome: Outcome,
    now: Timestamp,
) -> OperationStatus {
    let old = current.cloned().unwrap_or_default();
    if old.phase.is_some_and(OperationPhase::is_terminal) {
        return old;
    }
    let started = old.start_time.is_some() || old.phase == Some(OperationPhase::Running);
    let not_started_only = matches!(
        outcome,
        Outcome::Pending { .. } | Outcome::Expired { .. } | Outcome::Duplicate { .. }
    );
    if started && not_started_only {
        // A started Operation is never sent back to Pending, expired, or declared a duplicate:
        // the lifecycle gate never asks for it, and acting on a stale decision would lose work.
        return old;
    }

    let now = Time(truncate_to_seconds(now));
    let phase = outcome.phase();
    let mut new = old;
    new.phase = Some(phase);
    new.observed_generation = generation;

    let (status, reason, message, children, report, duplicate_of) = match outcome {
        Outcome::Pending { reason, message } => ("Unknown", reason, message, Vec::new(), None, None),
        Outcome::Running { message, children } => (
            "Unknown",
            operation_reasons::RUNNING.to_owned(),
            message,
            children,
            None,
            None,
        ),
        Outcome::Succeeded {
            result,
            children,
            report,
        } => (
            "True",
            operation_reasons::COMPLETED.to_owned(),
            result,
            children,
            Some(report),
            None,
        ),
        Outcome::Failed {
            reason,
            message,
            children,
            report,
        } => ("False", reason, message, children, Some(report), None),
        Outcome::Expired { message } => (
            "False",
            operation_reasons::DEADLINE_EXCEEDED.to_owned(),
            message,
            Vec::new(),
            None,
            None,
        ),
        Outcome::Duplicate { first, message } => (
            "True",
            operation_reasons::DUPLICATE_REQUEST.to_owned(),
            message,
            Vec::new(),
            None,
            Some(first),
        ),
    };
    let reason = valid_reason_or(reason, phase);
    let message = api::text::prefix_chars(&message, MAX_MESSAGE_CHARS).to_owned();

    let acted = phase == OperationPhase::Running || !children.is_empty();
    merge_children(&mut new.children, children);
    if acted && new.start_time.is_none() {
        // Normally set on the first Running write; an engine that observes the end before
        // ever writing Running still records that the Operation acted.
        new.start_time = Some(now.clone());
    }
    if phase.is_terminal() {
        new.completion_time.get_or_insert_with(|| now.clone());
        new.result = Some(one_line(&message));
    } else {
        new.result = None;
    }
    if let Some(first) = duplicate_of {
        new.duplicate_of = Some(first);
    }
    if let Some(report) = report {
        if report.warnings.is_some() {
            new.warnings = report.warnings;
        }
        if report.errors.is_some() {
            new.errors = report.errors;
        }
        if let Some(verification) = report.verification {
            new.verification = Some(*verification);
        }
    }
    // Kept in place among any other conditions (no reordering).
    conditions::Setter::new(&mut new.conditions, generation, &now).set(types::SUCCEEDED, status, reason, message);
    new
}

/// Whether `new` differs from the stored status, i.e. whether a status write is needed.
pub fn needs_write(old: Option<&OperationStatus>, new: &OperationStatus) -> bool {
    old != Some(new)
}

/// Appends the references not recorded yet, in order, up to [`MAX_CHILDREN`].
fn merge_children(recorded: &mut Vec<ObjectReference>, new: Vec<ObjectReference>) {
    for child in new {
        if recorded.len() >= MAX_CHILDREN {
            break;
        }
        if !recorded.contains(&child) {
            recorded.push(child);
        }
    }
}

/// `reason` if it matches the API server's pattern `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`
/// (1–1024 chars), else the phase's generic reason: a relayed reason that breaks the
/// pattern would make every status write fail.
fn valid_reason_or(reason: String, phase: OperationPhase) -> String {
    if is_valid_reason(&reason) {
        return reason;
    }
    match phase {
        OperationPhase::Pending => operation_reasons::QUEUED,
        OperationPhase::Running => operation_reasons::RUNNING,
        OperationPhase::Succeeded => operation_reasons::COMPLETED,
        OperationPhase::Failed => operation_reasons::FAILED,
        OperationPhase::Expired => operation_reasons::DEADLINE_EXCEEDED,
    }
    .to_owned()
}

/// Whether `reason` is a valid `metav1.Condition` reason.
pub fn is_valid_reason(reason: &str) -> bool {
    let bytes = reason.as_bytes();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b',' | b':');
    !bytes.is_empty()
        && bytes.len() <= 1024
        && bytes.first().is_some_and(u8::is_ascii_alphabetic)
        && bytes.iter().all(inner)
        && bytes.last().is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

/// The message on one line, for `status.result` and the `Result` column.
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn truncate_to_seconds(ts: Timestamp) -> Timestamp {
    Timestamp::from_second(ts.as_second()).unwrap_or(ts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn child(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: "velero.io/v1".into(),
            kind: "Backup".into(),
            name: name.into(),
            namespace: Some("velero".into()),
        }
    }

    fn running(children: &[&str]) -> Outcome {
        Outcome::Running {
            message: "working".into(),
            children: children.iter().map(|c| child(c)).collect(),
        }
    }

    fn succeeded() -> Outcome {
        Outcome::Succeeded {
            result: "done\n(2 warnings,  0 errors)".into(),
            children: vec![child("b")],
            report: Report {
                warnings: Some(2),
                errors: Some(0),
                ..Report::default()
            },
        }
    }

    fn pending(reason: &str) -> Outcome {
        Outcome::Pending {
            reason: reason.into(),
            message: "waiting".into(),
        }
    }

    fn cond(status: &OperationStatus) -> &Condition {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == "Succeeded")
            .expect("Succeeded condition")
    }

    const T0: &str = "2026-12-01T02:00:00Z";
    const T1: &str = "2026-12-01T02:05:00Z";
    const T2: &str = "2026-12-01T02:10:00Z";

    #[test]
    fn phase_condition_and_reason_per_outcome() {
        let cases = [
            (pending("Queued"), OperationPhase::Pending, "Unknown", "Queued"),
            (running(&["b"]), OperationPhase::Running, "Unknown", "Running"),
            (succeeded(), OperationPhase::Succeeded, "True", "Completed"),
            (
                Outcome::failed("ApplicationNotFound", "gone"),
                OperationPhase::Failed,
                "False",
                "ApplicationNotFound",
            ),
            (
                Outcome::Expired { message: "late".into() },
                OperationPhase::Expired,
                "False",
                "DeadlineExceeded",
            ),
            (
                Outcome::Duplicate {
                    first: "first".into(),
                    message: "dup".into(),
                },
                OperationPhase::Succeeded,
                "True",
                "DuplicateRequest",
            ),
        ];
        for (outcome, phase, status, reason) in cases {
            assert_eq!(outcome.phase(), phase);
            let new = next_status(None, Some(1), outcome, ts(T0));
            assert_eq!(new.phase, Some(phase), "{reason}");
            assert_eq!(new.observed_generation, Some(1));
            let c = cond(&new);
            assert_eq!((c.status.as_str(), c.reason.as_str()), (status, reason));
            assert_eq!(c.observed_generation, Some(1));
            assert_eq!(c.last_transition_time, Time(ts(T0)));
            assert_eq!(new.completion_time.is_some(), phase.is_terminal(), "{reason}");
            assert_eq!(new.result.is_some(), phase.is_terminal(), "{reason}");
        }
    }

    #[test]
    fn full_lifecycle_times_and_transitions() {
        let p = next_status(None, Some(1), pending("WaitingForNotBefore"), ts(T0));
        assert_eq!(p.start_time, None);
        // Same status Unknown, new reason: lastTransitionTime stays.
        let q = next_status(Some(&p), Some(1), pending("Queued"), ts(T1));
        assert_eq!(cond(&q).reason, "Queued");
        assert_eq!(cond(&q).last_transition_time, Time(ts(T0)));
        let r = next_status(Some(&q), Some(1), running(&["b"]), ts(T1));
        assert_eq!(r.start_time, Some(Time(ts(T1))));
        assert_eq!(cond(&r).last_transition_time, Time(ts(T0)), "Unknown -> Unknown");
        let r2 = next_status(Some(&r), Some(1), running(&["b"]), ts(T2));
        assert_eq!(r2.start_time, Some(Time(ts(T1))), "startTime set once");
        assert!(!needs_write(Some(&r), &r2), "at rest");
        let s = next_status(Some(&r2), Some(1), succeeded(), ts(T2));
        assert_eq!(s.phase, Some(OperationPhase::Succeeded));
        assert_eq!(s.start_time, Some(Time(ts(T1))));
        assert_eq!(s.completion_time, Some(Time(ts(T2))));
        assert_eq!(cond(&s).last_transition_time, Time(ts(T2)), "Unknown -> True moves it");
        assert_eq!(s.result.as_deref(), Some("done (2 warnings, 0 errors)"));
        assert_eq!(cond(&s).message, "done\n(2 warnings,  0 errors)");
        assert_eq!((s.warnings, s.errors), (Some(2), Some(0)));
        assert_eq!(s.children, vec![child("b")]);
        assert!(needs_write(Some(&r2), &s));
    }

    #[test]
    fn terminal_status_never_changes() {
        let done = next_status(None, Some(1), succeeded(), ts(T0));
        let outcomes = [
            pending("Queued"),
            running(&["x"]),
            Outcome::failed("Failed", "late failure"),
            Outcome::Expired { message: "e".into() },
            Outcome::Duplicate {
                first: "f".into(),
                message: "d".into(),
            },
            succeeded(),
        ];
        for outcome in outcomes {
            let after = next_status(Some(&done), Some(2), outcome, ts(T2));
            assert_eq!(after, done);
            assert!(!needs_write(Some(&done), &after));
        }
    }

    #[test]
    fn started_operation_is_never_unstarted() {
        let r = next_status(None, Some(1), running(&["b"]), ts(T0));
        let outcomes = [
            pending("Queued"),
            Outcome::Expired { message: "e".into() },
            Outcome::Duplicate {
                first: "f".into(),
                message: "d".into(),
            },
        ];
        for outcome in outcomes {
            assert_eq!(next_status(Some(&r), Some(1), outcome, ts(T1)), r);
        }
    }

    #[test]
    fn start_time_only_when_acted() {
        let cases = [
            (Outcome::failed("InvalidSpec", "bad"), false),
            (
                Outcome::Failed {
                    reason: "Failed".into(),
                    message: "velero said no".into(),
                    children: vec![child("b")],
                    report: Report::default(),
                },
                true,
            ),
            (succeeded(), true),
            (
                Outcome::Duplicate {
                    first: "f".into(),
                    message: "d".into(),
                },
                false,
            ),
            (Outcome::Expired { message: "e".into() }, false),
            (pending("Queued"), false),
        ];
        for (outcome, started) in cases {
            let label = format!("{outcome:?}");
            let new = next_status(None, Some(1), outcome, ts(T0));
            assert_eq!(new.start_time.is_some(), started, "{label}");
        }
    }

    #[test]
    fn duplicate_records_first() {
        let new = next_status(
            None,
            Some(1),
            Outcome::Duplicate {
                first: "first-op".into(),
                message: "requestId r was already handled by Operation first-op".into(),
            },
            ts(T0),
        );
        assert_eq!(new.duplicate_of.as_deref(), Some("first-op"));
        assert!(new.children.is_empty());
    }

    #[test]
    fn children_merge_without_duplicates_in_stable_order() {
        let r1 = next_status(None, Some(1), running(&["a", "b"]), ts(T0));
        let r2 = next_status(Some(&r1), Some(1), running(&["c", "a"]), ts(T1));
        let names: Vec<_> = r2.children.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        // Omitting children later does not drop them.
        let r3 = next_status(Some(&r2), Some(1), running(&[]), ts(T1));
        assert_eq!(r3.children.len(), 3);

        let many: Vec<String> = (0..200).map(|i| format!("c{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let capped = next_status(None, Some(1), running(&refs), ts(T0));
        assert_eq!(capped.children.len(), MAX_CHILDREN);
    }

    #[test]
    fn other_conditions_are_kept_and_failed_transition_moves_time() {
        let mut r = next_status(None, Some(1), running(&["b"]), ts(T0));
        r.conditions.insert(
            0,
            Condition {
                type_: "Other".into(),
                status: "True".into(),
                reason: "Mine".into(),
                message: String::new(),
                observed_generation: Some(1),
                last_transition_time: Time(ts(T0)),
            },
        );
        let f = next_status(
            Some(&r),
            Some(1),
            Outcome::Failed {
                reason: "PartiallyFailed".into(),
                message: "partially".into(),
                children: vec![child("b")],
                report: Report {
                    warnings: Some(1),
                    errors: Some(3),
                    ..Report::default()
                },
            },
            ts(T2),
        );
        assert_eq!(f.conditions.len(), 2);
        assert_eq!(f.conditions[0].type_, "Other");
        assert_eq!(cond(&f).last_transition_time, Time(ts(T2)));
        assert_eq!((f.warnings, f.errors), (Some(1), Some(3)));
        assert_eq!(f.children, vec![child("b")]);
    }

    #[test]
    fn counts_none_leave_fields() {
        let mut r = next_status(None, Some(1), running(&["b"]), ts(T0));
        r.warnings = Some(4);
        let s = next_status(
            Some(&r),
            Some(1),
            Outcome::Succeeded {
                result: "ok".into(),
                children: vec![],
                report: Report::default(),
            },
            ts(T1),
        );
        assert_eq!((s.warnings, s.errors), (Some(4), None));
    }

    #[test]
    fn invalid_reasons_fall_back_and_messages_are_capped() {
        let cases = [
            ("BackoffLimitExceeded", "BackoffLimitExceeded"),
            ("", "Failed"),
            ("has space", "Failed"),
            ("9Lives", "Failed"),
            ("Trailing,", "Failed"),
            ("A_b:c,D_", "A_b:c,D_"),
        ];
        for (reason, expected) in cases {
            let new = next_status(None, None, Outcome::failed(reason, "m"), ts(T0));
            assert_eq!(cond(&new).reason, expected, "{reason:?}");
        }
        let long = "é".repeat(MAX_MESSAGE_CHARS + 10);
        let new = next_status(None, None, Outcome::failed("Failed", long), ts(T0));
        assert_eq!(cond(&new).message.chars().count(), MAX_MESSAGE_CHARS);
        assert_eq!(new.observed_generation, None);
    }

    #[test]
    fn time_is_truncated_to_seconds() {
        let precise = ts("2026-12-01T02:00:00.987654321Z");
        let new = next_status(None, Some(1), running(&["b"]), precise);
        assert_eq!(new.start_time, Some(Time(ts(T0))));
        assert_eq!(cond(&new).last_transition_time, Time(ts(T0)));
        // What is written reads back identical, so the next pass is at rest.
        let json = serde_json::to_value(&new).expect("serialize");
        let back: OperationStatus = serde_json::from_value(json).expect("deserialize");
        let again = next_status(Some(&back), Some(1), running(&["b"]), ts(T1));
        assert!(!needs_write(Some(&back), &again));
    }

    #[test]
    fn needs_write_table() {
        let r = next_status(None, Some(1), running(&["b"]), ts(T0));
        assert!(needs_write(None, &r));
        assert!(!needs_write(Some(&r), &r.clone()));
        let mut changed = r.clone();
        changed.observed_generation = Some(2);
        assert!(needs_write(Some(&r), &changed));
    }
}
