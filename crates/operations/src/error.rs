//! The one error type of the crate: why an object cannot be built or a
//! reference cannot be resolved. Each variant maps to the `Succeeded=False`
//! reason the Operation ends with, so a controller turns any of them into a
//! terminal status with [`Error::outcome`].

use api::conditions::operation_reasons;

use crate::reasons;
use crate::status::Outcome;

/// Why an Operation cannot be acted on. All variants are permanent: the
/// Operation's spec is immutable, so retrying cannot help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The Operation (or ApplicationInstance) lacks metadata that objects read from the API
    /// server always carry. A caller bug, reported rather than panicking.
    #[error("the {kind} has no metadata.{field} (it was not read from the API server)")]
    MissingMetadata {
        /// `Operation` or `ApplicationInstance`.
        kind: &'static str,
        /// `name`, `namespace`, `uid` or `creationTimestamp`.
        field: &'static str,
    },
    /// The payload cannot be acted on (reason `InvalidSpec`).
    #[error("{0}")]
    InvalidSpec(String),
    /// The backup to restore from does not exist or did not succeed (reason `BackupNotFound`).
    #[error("{0}")]
    BackupNotFound(String),
    /// The revision a Rollback asks for is not in the history (reason `RevisionNotFound`).
    #[error("{0}")]
    RevisionNotFound(String),
    /// The stored revision history cannot be read (reason `Failed`).
    #[error("{0}")]
    CorruptHistory(String),
}

impl Error {
    /// The `Succeeded=False` reason the Operation ends with.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::MissingMetadata { .. } | Error::InvalidSpec(_) => operation_reasons::INVALID_SPEC,
            Error::BackupNotFound(_) => operation_reasons::BACKUP_NOT_FOUND,
            Error::RevisionNotFound(_) => reasons::REVISION_NOT_FOUND,
            Error::CorruptHistory(_) => operation_reasons::FAILED,
        }
    }

    /// The terminal outcome for this error (phase `Failed`).
    pub fn outcome(&self) -> Outcome {
        Outcome::failed(self.reason(), self.to_string())
    }

    pub(crate) fn missing(kind: &'static str, field: &'static str) -> Self {
        Error::MissingMetadata { kind, field }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_per_variant() {
        let cases = [
            (Error::missing("Operation", "uid"), "InvalidSpec"),
            (Error::InvalidSpec("x".into()), "InvalidSpec"),
            (Error::BackupNotFound("x".into()), "BackupNotFound"),
            (Error::RevisionNotFound("x".into()), "RevisionNotFound"),
            (Error::CorruptHistory("x".into()), "Failed"),
        ];
        for (error, reason) in cases {
            assert_eq!(error.reason(), reason, "{error:?}");
            match error.outcome() {
                Outcome::Failed { reason: r, .. } => assert_eq!(r, reason),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            Error::missing("Operation", "uid").to_string(),
            "the Operation has no metadata.uid (it was not read from the API server)"
        );
    }
}
