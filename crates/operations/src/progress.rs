//! What a driven object (Velero Backup/Restore, VolumeSnapshots, Job) says
//! about the work, before it becomes an Operation status.
//!
//! Depends on [`crate::status`] (the [`Outcome`] it becomes, the [`Counts`] it carries),
//! never the reverse.

use api::ObjectReference;

use crate::status::{Counts, Outcome};

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
        /// Counts to record.
        counts: Counts,
    },
    /// Done unsuccessfully.
    Failed {
        /// `Succeeded=False` reason: `Failed`, `PartiallyFailed`, or a Job condition's reason.
        reason: String,
        /// Why, for people.
        message: String,
        /// Counts to record.
        counts: Counts,
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
            Progress::Succeeded { message, counts } => Outcome::Succeeded {
                result: message,
                children,
                counts,
            },
            Progress::Failed {
                reason,
                message,
                counts,
            } => Outcome::Failed {
                reason,
                message,
                children,
                counts,
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
        let counts = Counts {
            warnings: Some(1),
            errors: Some(2),
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
                    counts,
                },
                Outcome::Succeeded {
                    result: "ok".into(),
                    children: vec![child.clone()],
                    counts,
                },
            ),
            (
                Progress::Failed {
                    reason: "PartiallyFailed".into(),
                    message: "bad".into(),
                    counts,
                },
                Outcome::Failed {
                    reason: "PartiallyFailed".into(),
                    message: "bad".into(),
                    children: vec![child.clone()],
                    counts,
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
