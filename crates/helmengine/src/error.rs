//! Errors of the engine boundary, classified for the reconciler.
//!
//! The reconciler needs three answers from an error, and gets them without
//! matching on engine internals: which condition reason to show
//! ([`EngineError::reason`], one of `api::conditions::reasons`), whether
//! retrying can help ([`EngineError::is_terminal`]), and the usual API-error
//! classes (forbidden, conflict, not found).
//!
//! Messages never carry secret material: this crate never reads Secret data,
//! and API errors are rendered as `code reason: message` from the API
//! server's `Status`, which describes the request, not the values in it.

use api::conditions::reasons;

/// Why an engine call failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The engine's API is not served by the cluster (e.g. Flux's CRDs are
    /// missing or too old). The message names what is missing.
    #[error("{0}")]
    NotInstalled(String),

    /// The ApplicationInstance passed API validation but cannot be
    /// materialised (e.g. an `oci://` URL without a repository path). Retrying
    /// the same spec cannot succeed.
    #[error("{0}")]
    InvalidSpec(String),

    /// An object with the name the engine needs exists and belongs to someone
    /// else, or is still being deleted. Retried: it resolves when the other
    /// object goes away.
    #[error("{0}")]
    Conflict(String),

    /// The Kubernetes API refused or failed a request.
    #[error("{}", describe_kube(.0))]
    Kube(#[from] kube::Error),
}

impl EngineError {
    /// The ApplicationInstance condition reason for this error.
    ///
    /// A 422 from the API server on one of our writes means the engine's own
    /// schema (e.g. a Flux CEL rule) rejected what the spec asked for, which
    /// is an invalid spec from the user's point of view, so it maps to
    /// `InvalidSpec` rather than `ApplyFailed`.
    pub fn reason(&self) -> &'static str {
        match self {
            EngineError::NotInstalled(_) => reasons::ENGINE_NOT_INSTALLED,
            EngineError::InvalidSpec(_) => reasons::INVALID_SPEC,
            EngineError::Kube(_) if self.is_invalid() => reasons::INVALID_SPEC,
            EngineError::Conflict(_) | EngineError::Kube(_) => reasons::APPLY_FAILED,
        }
    }

    /// True when retrying without a spec change cannot help: the reconciler
    /// should mark the app Stalled and wait for a change instead of backing off.
    ///
    /// `NotInstalled` is not terminal: the cluster owner may install Flux at
    /// any time, and a slow requeue picks that up.
    pub fn is_terminal(&self) -> bool {
        matches!(self, EngineError::InvalidSpec(_)) || self.is_invalid()
    }

    /// The API server answered 403 Forbidden (RBAC, admission, or a namespace being terminated).
    pub fn is_forbidden(&self) -> bool {
        self.api_status().is_some_and(|s| s.is_forbidden())
    }

    /// A write lost a race (409 from the API server) or the name is taken ([`EngineError::Conflict`]).
    pub fn is_conflict(&self) -> bool {
        matches!(self, EngineError::Conflict(_)) || self.api_status().is_some_and(|s| s.is_conflict())
    }

    /// The API server answered 404 Not Found.
    pub fn is_not_found(&self) -> bool {
        self.api_status().is_some_and(|s| s.is_not_found())
    }

    /// The API server answered 422 Invalid.
    fn is_invalid(&self) -> bool {
        self.api_status().is_some_and(|s| s.is_invalid())
    }

    fn api_status(&self) -> Option<&kube::core::Status> {
        match self {
            EngineError::Kube(kube::Error::Api(status)) => Some(status),
            _ => None,
        }
    }
}

/// `kube::Error`'s own Display repeats the whole `Status` in Debug form; a
/// condition message wants one readable line.
fn describe_kube(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => {
            let reason = if status.reason.is_empty() {
                "Failure"
            } else {
                status.reason.as_str()
            };
            format!("Kubernetes API error {} {reason}: {}", status.code, status.message)
        }
        other => format!("Kubernetes API request failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api(code: u16, reason: &str) -> EngineError {
        let status = Status {
            code,
            reason: reason.into(),
            message: "boom".into(),
            ..Status::failure("boom", reason)
        };
        EngineError::Kube(kube::Error::Api(status.boxed()))
    }

    #[test]
    fn reason_and_terminal_table() {
        let cases = [
            (
                EngineError::NotInstalled("x".into()),
                reasons::ENGINE_NOT_INSTALLED,
                false,
            ),
            (EngineError::InvalidSpec("x".into()), reasons::INVALID_SPEC, true),
            (EngineError::Conflict("x".into()), reasons::APPLY_FAILED, false),
            (api(403, "Forbidden"), reasons::APPLY_FAILED, false),
            (api(409, "Conflict"), reasons::APPLY_FAILED, false),
            (api(500, "InternalError"), reasons::APPLY_FAILED, false),
            (api(422, "Invalid"), reasons::INVALID_SPEC, true),
        ];
        for (err, reason, terminal) in cases {
            assert_eq!(err.reason(), reason, "{err:?}");
            assert_eq!(err.is_terminal(), terminal, "{err:?}");
        }
    }

    #[test]
    fn classification_helpers() {
        assert!(api(403, "Forbidden").is_forbidden());
        assert!(api(409, "Conflict").is_conflict());
        assert!(EngineError::Conflict("taken".into()).is_conflict());
        assert!(api(404, "NotFound").is_not_found());
        assert!(!api(404, "NotFound").is_forbidden());
        assert!(!EngineError::InvalidSpec("x".into()).is_not_found());
    }

    #[test]
    fn api_errors_render_on_one_line() {
        assert_eq!(
            api(403, "Forbidden").to_string(),
            "Kubernetes API error 403 Forbidden: boom"
        );
    }
}
