//! Helm tests in the protocol (1.5): Odoo sends `spec.test` of an application's spec verbatim
//! ([`api::ReleaseTest`]); the agent checks its shape with the rest of the document
//! ([`check`]). Results come back as the relayed condition `TestSuccess` of the application's
//! report, which every version carries.

use api::ReleaseTest;

use crate::version::ProtocolVersion;

/// The protocol version that introduced `spec.test`: Odoo sends it only to an agent announcing
/// this version or a later one (an older agent would drop the field without a word, and the
/// tests Odoo asked for would never run).
pub const SINCE: ProtocolVersion = ProtocolVersion { major: 1, minor: 5 };

/// Whether a peer speaking `version` understands `spec.test`.
pub fn supported_by(version: ProtocolVersion) -> bool {
    version.major == SINCE.major && version.minor >= SINCE.minor
}

/// Checks a `spec.test` against the CRD's rules: `timeout` a duration. The message names the
/// field.
pub fn check(test: &ReleaseTest) -> Result<(), String> {
    match &test.timeout {
        Some(timeout) if !crate::schedule::duration_shape(timeout) => Err(format!(
            "spec.test.timeout {timeout:?} is not a duration such as 90s, 5m or 1h30m"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts() {
        let test = |timeout: Option<&str>| ReleaseTest {
            timeout: timeout.map(Into::into),
            ..Default::default()
        };
        assert_eq!(check(&test(None)), Ok(()));
        assert_eq!(check(&test(Some("2m30s"))), Ok(()));
        assert!(check(&test(Some("2 minutes"))).is_err_and(|m| m.starts_with("spec.test.timeout ")));
    }

    #[test]
    fn supported_from_1_5() {
        let v = |s: &str| s.parse::<ProtocolVersion>().unwrap();
        assert!(!supported_by(v("1.4")));
        assert!(supported_by(v("1.5")));
        assert!(!supported_by(v("2.5")));
    }
}
