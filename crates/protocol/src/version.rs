//! Protocol version and compatibility rules.
//!
//! A version is `MAJOR.MINOR`, written as a JSON string (`"1.0"`).
//!
//! * Both sides send their version in every call and answer ([`crate::messages`]).
//! * Peers with the same MAJOR are compatible. A MINOR bump only adds optional fields or
//!   new enum values that an older peer may ignore: both sides ignore unknown fields; an
//!   unknown outcome, state or mode reads as `unknown` (reasons are plain strings), never
//!   an error.
//! * A MAJOR bump changes or removes meaning. Odoo answers a call from another MAJOR with
//!   the error `ProtocolVersionMismatch` (HTTP 422), and the agent refuses an answer from
//!   another MAJOR (condition reason `IncompatibleProtocol`) without applying anything.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The version the binaries announce (`protocol_version` of every call and answer): the
/// newest one ([`LATEST`]), since the backup engine runs what 1.1 adds, the engines and the
/// app controller honour what 1.2 adds, the restore engine runs what 1.3 adds, and the app
/// controller materialises what 1.5 adds.
pub const PROTOCOL_VERSION: ProtocolVersion = LATEST;

/// The newest version this crate describes. History (`docs/connectivity/protocol.md`):
///
/// * 1.0: the first version.
/// * 1.1: backup schedules, `spec.backupSchedule` in an application's spec and
///   `backup_schedule` in its report ([`crate::schedule`]).
/// * 1.2: maintenance windows, `spec.maintenanceWindows` in an application's spec and
///   `spec.urgent` in an Operation's ([`crate::maintenance`]); `upgrade.backup` and
///   `restore.targetNamespace` in an Operation's payload.
/// * 1.3: verified restores, `restore.verify` in an Operation's payload,
///   `spec.restoreVerification` in an application's spec, and `verification` in an
///   Operation's report ([`crate::verification`]).
/// * 1.4: `max_reports_per_sync` in `agent_sync`'s answer (a lowered limit reaches the
///   agent at its next call).
/// * 1.5: Helm tests, `spec.test` in an application's spec ([`crate::release_test`]).
pub const LATEST: ProtocolVersion = ProtocolVersion { major: 1, minor: 5 };

/// The version that added `max_reports_per_sync` to `agent_sync`'s answer (an older agent
/// ignores it, so Odoo may send it to any agent).
pub const SYNC_RESULT_REPORT_LIMIT_SINCE: ProtocolVersion = ProtocolVersion { major: 1, minor: 4 };

/// `MAJOR.MINOR`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProtocolVersion {
    /// Incompatible changes.
    pub major: u16,
    /// Compatible additions.
    pub minor: u16,
}

impl ProtocolVersion {
    /// Whether a peer speaking `other` can be talked to (same MAJOR).
    pub fn is_compatible_with(self, other: ProtocolVersion) -> bool {
        self.major == other.major
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A version string that is not `MAJOR.MINOR`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid protocol version {0:?}: expected MAJOR.MINOR, e.g. \"1.0\"")]
pub struct VersionError(pub String);

impl FromStr for ProtocolVersion {
    type Err = VersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || VersionError(s.to_owned());
        let (major, minor) = s.split_once('.').ok_or_else(err)?;
        let parse = |p: &str| {
            if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err());
            }
            p.parse::<u16>().map_err(|_| err())
        };
        Ok(Self {
            major: parse(major)?,
            minor: parse(minor)?,
        })
    }
}

impl Serialize for ProtocolVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ProtocolVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display() {
        assert_eq!("1.5".parse(), Ok(PROTOCOL_VERSION));
        assert_eq!(
            LATEST,
            crate::release_test::SINCE,
            "the newest feature's version is the latest"
        );
        assert!(SYNC_RESULT_REPORT_LIMIT_SINCE < LATEST);
        assert_eq!("2.13".parse::<ProtocolVersion>().unwrap().to_string(), "2.13");
        for bad in ["", "1", "1.", ".1", "1.0.0", "a.b", "-1.0", "1.+2", "999999.0"] {
            assert!(bad.parse::<ProtocolVersion>().is_err(), "{bad:?}");
        }
        assert_eq!(serde_json::to_string(&PROTOCOL_VERSION).unwrap(), "\"1.5\"");
        assert!(
            serde_json::from_str::<ProtocolVersion>("1.0").is_err(),
            "a number is not a version"
        );
    }

    #[test]
    fn compatibility_is_same_major() {
        let v = |s: &str| s.parse::<ProtocolVersion>().unwrap();
        assert!(v("1.0").is_compatible_with(v("1.7")));
        assert!(v("1.7").is_compatible_with(v("1.0")));
        assert!(!v("1.0").is_compatible_with(v("2.0")));
        assert!(!v("1.0").is_compatible_with(v("0.9")));
    }
}
