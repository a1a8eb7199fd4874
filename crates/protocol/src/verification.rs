//! Verified restores in the protocol (1.3): Odoo sends `restore.verify` in a Restore
//! Operation's payload and `spec.restoreVerification` in an application's spec verbatim
//! (ADR 0011, `docs/adr/0011-verified-restore.md`); the agent checks the declaration's shape
//! with the rest of the document ([`check`]), and reports the evidence an ended verified
//! restore recorded (`status.verification`) as the Operation report's `verification`
//! ([`VerificationReport`]).
//!
//! Whether the Job passes Pod Security `restricted` is the restore engine's to say, as the
//! Operation's reason `InvalidSpec`, relayed in its report.

use api::{RestoreVerification, RestoreVerificationStatus};
use serde::{Deserialize, Serialize};

use crate::version::ProtocolVersion;

/// The protocol version that introduced verified restores: Odoo sends `restore.verify` and
/// `spec.restoreVerification` only to an agent announcing this version or a later one (an
/// older agent would drop the fields without a word, and a `verify` Restore would become an
/// ordinary restore over the live application).
pub const SINCE: ProtocolVersion = ProtocolVersion { major: 1, minor: 3 };

/// Range of `timeoutSeconds` the CRD accepts.
const TIMEOUT_SECONDS: std::ops::RangeInclusive<i64> = 30..=86400;

/// Whether a peer speaking `version` understands verified restores.
pub fn supported_by(version: ProtocolVersion) -> bool {
    version.major == SINCE.major && version.minor >= SINCE.minor
}

/// Checks a `spec.restoreVerification` against the CRD's rules: `timeoutSeconds` in
/// 30–86400, `job` an object. The message names the field.
pub fn check(verification: &RestoreVerification) -> Result<(), String> {
    if let Some(timeout) = verification.timeout_seconds
        && !TIMEOUT_SECONDS.contains(&timeout)
    {
        return Err(format!(
            "spec.restoreVerification.timeoutSeconds: {timeout} is outside {}–{}",
            TIMEOUT_SECONDS.start(),
            TIMEOUT_SECONDS.end()
        ));
    }
    if verification.job.as_ref().is_some_and(|job| !job.is_object()) {
        return Err("spec.restoreVerification.job must be an object (a batch/v1 JobSpec)".into());
    }
    Ok(())
}

/// The evidence of an ended verified restore, in its Operation's report (protocol 1.3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct VerificationReport {
    /// Whether every check passed.
    pub passed: bool,
    /// What was checked and found.
    pub message: String,
    /// The Velero Backup restored.
    pub backup: String,
    /// The scratch namespace the copy was checked in.
    pub scratch_namespace: String,
    /// Whether the scratch namespace has been removed.
    pub scratch_namespace_removed: bool,
    /// Items Velero restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items_restored: Option<i64>,
    /// Volumes whose data Velero restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes_restored: Option<i64>,
    /// The restored workloads found ready, as `Kind/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workloads_ready: Vec<String>,
    /// The verification Job, `<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
}

impl VerificationReport {
    /// The report of `status.verification`.
    pub fn of(status: &RestoreVerificationStatus) -> Self {
        Self {
            passed: status.passed,
            message: status.message.clone(),
            backup: status.backup.clone(),
            scratch_namespace: status.scratch_namespace.clone(),
            scratch_namespace_removed: status.scratch_namespace_removed,
            items_restored: status.items_restored,
            volumes_restored: status.volumes_restored,
            workloads_ready: status.workloads_ready.clone(),
            job: status.job.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn shapes_the_crd_refuses_are_refused_with_the_field_named() {
        let ok = RestoreVerification {
            timeout_seconds: Some(300),
            job: Some(json!({"template": {}})),
        };
        assert_eq!(check(&ok), Ok(()));
        assert_eq!(check(&RestoreVerification::default()), Ok(()));
        let short = RestoreVerification {
            timeout_seconds: Some(5),
            ..RestoreVerification::default()
        };
        assert!(check(&short).is_err_and(|m| m.contains("timeoutSeconds: 5")));
        let not_a_job = RestoreVerification {
            job: Some(json!(["x"])),
            ..RestoreVerification::default()
        };
        assert!(check(&not_a_job).is_err_and(|m| m.contains("restoreVerification.job")));
    }

    #[test]
    fn only_a_peer_from_1_3_on_is_sent_verified_restores() {
        assert!(!supported_by(ProtocolVersion { major: 1, minor: 2 }));
        assert!(supported_by(ProtocolVersion { major: 1, minor: 3 }));
        assert!(!supported_by(ProtocolVersion { major: 2, minor: 3 }));
    }
}
