//! What a driven object (Velero Backup/Restore, VolumeSnapshots, Job) says
//! about the work, before it becomes an Operation status.
//!
//! Depends on [`crate::status`] (the [`Outcome`] it becomes, the [`Report`] it carries),
//! never the reverse.

use api::ObjectReference;

use crate::status::{Outcome, Report};

/// The state of the driven object(s), mapped per `docs/api/conditions.md` §3.3–3.5.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Still working (or retrying); the message says where it is.
    Running {
        /// Human-readable progress, naming the driven object and its state.
        message: String,
    },
    /// Done successfully.
    Succeeded {
        /// Final message (becomes `status.result`).
        message: String,
        /// What the engine reports, to record.
        report: Report,
    },
    /// Done unsuccessfully.
    Failed {
        /// `Succeeded=False` reason: `Failed`, `PartiallyFailed`, or a Job condition's reason.
        reason: String,
        /// Why, for people.
        message: String,
        /// What the engine reports, to record.
        report: Report,
    },
}

impl Progress {
    /// Whether the driven work has ended.
    pub fn is_finished(&self) -> bool {
        !matches!(self, Progress::Running { .. })
    }

    /// The Operation outcome for this progress, with the children it was read from.
    pub fn into_outcome(self, children: Vec<ObjectReference>) -> Outcome {
        match self {
            Progress::Running { message } => Outcome::Running { message, children },
            Progress::Succeeded { message, report } => Outcome::Succeeded {
                result: message,
                children,
                report,
            },
            Progress::Failed {
                reason,
                message,
                report,
            } => Outcome::Failed {
                reason,
                message,
                children,
                report,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn into_outcome_keeps_everything() {
        let child = ObjectReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: "j".into(),
            namespace: Some("ns".into()),
        };
        let report = Report {
            warnings: Some(1),
            errors: Some(2),
            ..Report::default()
        };
        let cases = [
            (
                Progress::Running { message: "m".into() },
                Outcome::Running {
                    message: "m".into(),
                    children: vec![child.clone()],
                },
            ),
            (
                Progress::Succeeded {
                    message: "ok".into(),
                    report: report.clone(),
                },
                Outcome::Succeeded {
                    result: "ok".into(),
                    children: vec![child.clone()],
                    report: report.clone(),
                },
            ),
            (
                Progress::Failed {
                    reason: "PartiallyFailed".into(),
                    message: "bad".into(),
                    report: report.clone(),
                },
                Outcome::Failed {
                    reason: "PartiallyFailed".into(),
                    message: "bad".into(),
                    children: vec![child.clone()],
                    report: report.clone(),
                },
            ),
        ];
        for (progress, expected) in cases {
            let finished = !matches!(progress, Progress::Running { .. });
            assert_eq!(progress.is_finished(), finished);
            assert_eq!(progress.into_outcome(vec![child.clone()]), expected);
        }
    }
}
