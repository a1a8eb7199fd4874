//! Command-line flags shared by every binary.
//!
//! Each binary has its own `clap::Parser` and flattens [`CommonArgs`] into it, so
//! the operational surface (admin port, logging, namespaces, leader election) is
//! spelled the same way everywhere and configurable from the Deployment's `env`.
//!
//! ```
//! use clap::Parser;
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     common: controller_kit::args::CommonArgs,
//!     /// A flag only this binary has.
//!     #[arg(long, default_value = "vworkspace-system")]
//!     engine_namespace: String,
//! }
//!
//! let cli = Cli::parse_from([
//!     "app-controller", "--allowed-namespaces", "team-a", "--concurrency", "8", "--log-format", "json",
//! ]);
//! assert_eq!(cli.common.concurrency, 8);
//! cli.common.validate().unwrap();
//! ```

use std::{net::SocketAddr, time::Duration};

use crate::namespaces::{NamespaceError, NamespacePolicy, WatchScope, validate_namespace};

/// Output format of the log lines written to stdout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, for local runs.
    #[default]
    Text,
    /// One JSON object per line, for log collectors in the cluster.
    Json,
}

/// Flags every vWorkspace binary accepts. Flatten it with `#[command(flatten)]`.
#[derive(Clone, Debug, clap::Args)]
// The doc comment above is for rustdoc only; it must not become the binary's `about`.
#[command(about = None, long_about = None, next_help_heading = "Common controller options")]
pub struct CommonArgs {
    /// Address of the admin server (`/livez`, `/readyz`, `/metrics`).
    #[arg(long, env = "VWS_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,

    /// Log line format.
    #[arg(long, env = "VWS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter, in `RUST_LOG` syntax (e.g. `info,controller_kit=debug`).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_filter: String,

    /// OTLP/gRPC endpoint (e.g. `http://otel-collector:4317`); when set, traces are exported there.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// Namespaces this binary may touch: comma-separated DNS labels, or `*` for all. Required
    /// (no default, so no install is open to every namespace by accident); system namespaces
    /// (`kube-*`, `flux-system`, `vworkspace-system`, `velero`, the pod's own) are never allowed.
    // An Option checked in `watch_scope`, not a clap `required`: clap's error would not name
    // the env var, and this one does.
    #[arg(long, env = "VWS_ALLOWED_NAMESPACES", value_parser = parse_policy)]
    pub allowed_namespaces: Option<NamespacePolicy>,

    /// The namespace this binary runs in (the pod's, from the downward API): never allowed,
    /// since it holds the binary's credentials, Leases and configuration.
    #[arg(long, env = "POD_NAMESPACE", value_parser = parse_namespace)]
    pub pod_namespace: Option<String>,

    /// Watch this one namespace only, so the binary can run with namespaced RBAC (Role, not ClusterRole).
    #[arg(long, env = "VWS_WATCH_NAMESPACE", value_parser = parse_namespace)]
    pub watch_namespace: Option<String>,

    /// Maximum number of objects reconciled concurrently by each controller.
    #[arg(long, env = "VWS_CONCURRENCY", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,

    /// Elect a leader through a coordination.k8s.io Lease; only the leader writes.
    #[arg(long, env = "VWS_LEADER_ELECT", default_value_t = false, value_parser = clap::builder::BoolishValueParser::new())]
    pub leader_elect: bool,

    /// Name of the Lease (defaults to one chosen by the binary).
    #[arg(long, env = "VWS_LEASE_NAME", value_parser = parse_lease_name)]
    pub lease_name: Option<String>,

    /// Namespace of the Lease (defaults to the client's namespace, i.e. the pod's).
    #[arg(long, env = "POD_NAMESPACE", value_parser = parse_namespace)]
    pub lease_namespace: Option<String>,

    /// How long a non-leader waits after the last renewal before taking the Lease over.
    #[arg(long, env = "VWS_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// How long the leader keeps retrying a failed renewal before stepping down (and
    /// following again).
    #[arg(long, env = "VWS_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub renew_deadline: Duration,

    /// Interval between acquire or renew attempts.
    #[arg(long, env = "VWS_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub retry_period: Duration,

    /// Identity written into the Lease (defaults to `<hostname>-<pid>`).
    #[arg(long, env = "POD_NAME", default_value_t = default_identity())]
    pub identity: String,

    /// gRPC endpoint of the agent's status channel (e.g. `http://vworkspace-agent:9090`).
    /// Status changes are published there as they are written; unset, nothing is published.
    /// Publishing never blocks or fails the controller.
    #[arg(long, env = "VWS_STATUS_CHANNEL_ENDPOINT")]
    pub status_channel_endpoint: Option<String>,
}

/// A flag combination that is individually valid but inconsistent.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// The watch namespace is not allowed by the namespace policy.
    #[error(transparent)]
    Namespace(#[from] NamespaceError),
    /// Leader-election timings that would allow two leaders or constant flapping.
    #[error("invalid leader election timings: {0}")]
    LeaderTimings(String),
    /// The Lease identity is empty.
    #[error("--identity must not be empty")]
    EmptyIdentity,
}

impl CommonArgs {
    /// Checks the cross-flag rules clap cannot express. Call it right after parsing.
    pub fn validate(&self) -> Result<(), ArgsError> {
        self.watch_scope()?;
        if self.identity.trim().is_empty() {
            return Err(ArgsError::EmptyIdentity);
        }
        validate_timings(self.lease_duration, self.renew_deadline, self.retry_period)
    }

    /// Where the controllers should watch: one namespace or the whole cluster,
    /// combined with the allow-list. Errors if the allow-list is missing, if
    /// `--watch-namespace` is outside it, or if either names a system namespace.
    pub fn watch_scope(&self) -> Result<WatchScope, NamespaceError> {
        let policy = self.allowed_namespaces.clone().ok_or(NamespaceError::Required)?;
        WatchScope::new(policy, self.watch_namespace.clone())?.with_own_namespace(self.pod_namespace.clone())
    }
}

/// Rules from client-go's leader election: a follower must not take over while the
/// leader may still believe it leads (`lease_duration > renew_deadline`), and the
/// leader must get more than one jittered attempt before its deadline.
pub(crate) fn validate_timings(lease: Duration, renew: Duration, retry: Duration) -> Result<(), ArgsError> {
    if lease.subsec_nanos() != 0 || lease.as_secs() == 0 || lease.as_secs() > i32::MAX as u64 {
        return Err(ArgsError::LeaderTimings(format!(
            "--lease-duration must be a whole number of seconds (Lease.spec.leaseDurationSeconds), got {lease:?}"
        )));
    }
    if lease <= renew {
        return Err(ArgsError::LeaderTimings(format!(
            "--lease-duration ({lease:?}) must be greater than --renew-deadline ({renew:?})"
        )));
    }
    if renew <= retry.mul_f64(1.2) {
        return Err(ArgsError::LeaderTimings(format!(
            "--renew-deadline ({renew:?}) must be greater than 1.2 x --retry-period ({retry:?})"
        )));
    }
    Ok(())
}

/// `<hostname>-<pid>`: unique per process even when several run on one host.
pub fn default_identity() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let host = if host.is_empty() { "unknown".to_owned() } else { host };
    format!("{host}-{}", std::process::id())
}

/// Parses `15s`, `1m30s`, `500ms` (jiff's friendly format, or ISO 8601); rejects zero and negatives.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let signed: jiff::SignedDuration = s.trim().parse().map_err(|e| format!("invalid duration {s:?}: {e}"))?;
    let d = Duration::try_from(signed).map_err(|_| format!("duration {s:?} must not be negative"))?;
    if d.is_zero() {
        return Err(format!("duration {s:?} must be greater than zero"));
    }
    Ok(d)
}

fn parse_policy(s: &str) -> Result<NamespacePolicy, NamespaceError> {
    s.parse()
}

fn parse_namespace(s: &str) -> Result<String, NamespaceError> {
    validate_namespace(s.trim())?;
    Ok(s.trim().to_owned())
}

fn parse_lease_name(s: &str) -> Result<String, String> {
    let s = s.trim();
    // Lease names are DNS-1123 subdomains: lowercase alphanumerics, '-' and '.', at most 253.
    let ok = !s.is_empty() && s.len() <= 253 && s.split('.').all(|part| validate_namespace(part).is_ok());
    if ok {
        Ok(s.to_owned())
    } else {
        Err(format!("{s:?} is not a valid Lease name (DNS-1123 subdomain)"))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn parse(args: &[&str]) -> Result<CommonArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bin").chain(args.iter().copied())).map(|c| c.common)
    }

    #[test]
    fn defaults() {
        let a = parse(&["--allowed-namespaces", "*"]).unwrap();
        assert_eq!(a.admin_addr, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(a.log_format, LogFormat::Text);
        assert_eq!(a.concurrency, 4);
        assert!(!a.leader_elect);
        assert_eq!(a.allowed_namespaces, Some(NamespacePolicy::All));
        assert_eq!(a.lease_duration, Duration::from_secs(15));
        assert_eq!(a.renew_deadline, Duration::from_secs(10));
        assert_eq!(a.retry_period, Duration::from_secs(2));
        assert!(!a.identity.is_empty());
        a.validate().unwrap();
    }

    #[test]
    fn explicit_values() {
        let a = parse(&[
            "--admin-addr",
            "127.0.0.1:9000",
            "--log-format",
            "json",
            "--allowed-namespaces",
            "team-a, team-b",
            "--watch-namespace",
            "team-a",
            "--concurrency",
            "1",
            "--leader-elect",
            "--lease-name",
            "app-controller.vworkspace.io",
            "--lease-duration",
            "30s",
            "--renew-deadline",
            "20s",
            "--retry-period",
            "500ms",
            "--identity",
            "pod-0",
        ])
        .unwrap();
        assert_eq!(a.log_format, LogFormat::Json);
        assert_eq!(a.concurrency, 1);
        assert!(a.leader_elect);
        assert_eq!(a.retry_period, Duration::from_millis(500));
        assert_eq!(a.watch_namespace.as_deref(), Some("team-a"));
        a.validate().unwrap();
    }

    #[test]
    fn rejects_bad_flags() {
        for bad in [
            &["--concurrency", "0"][..],
            &["--allowed-namespaces", ""],
            &["--allowed-namespaces", "Team_A"],
            &["--allowed-namespaces", "team-a,kube-system"],
            &["--watch-namespace", "-x"],
            &["--lease-duration", "0s"],
            &["--lease-duration", "soon"],
            &["--lease-name", "UPPER"],
            &["--log-format", "xml"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn the_allow_list_is_required_and_system_namespaces_are_refused() {
        // Parsed without it (so `--help`-style tools and tests still parse), refused at validation.
        let a = parse(&[]).unwrap();
        let err = a.validate().unwrap_err();
        assert!(matches!(err, ArgsError::Namespace(NamespaceError::Required)), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("--allowed-namespaces") && text.contains("VWS_ALLOWED_NAMESPACES"),
            "{text}"
        );

        let cases: &[(&[&str], Result<(), NamespaceError>)] = &[
            (&["--allowed-namespaces", "*"], Ok(())),
            (&["--allowed-namespaces", "team-a"], Ok(())),
            (
                &["--allowed-namespaces", "*", "--watch-namespace", "flux-system"],
                Err(NamespaceError::System("flux-system".into())),
            ),
            (&["--allowed-namespaces", "*", "--pod-namespace", "ops"], Ok(())),
            (
                &["--allowed-namespaces", "ops", "--pod-namespace", "ops"],
                Err(NamespaceError::System("ops".into())),
            ),
            (
                &[
                    "--allowed-namespaces",
                    "team-a",
                    "--watch-namespace",
                    "team-a",
                    "--pod-namespace",
                    "vworkspace-system",
                ],
                Ok(()),
            ),
        ];
        for (args, want) in cases {
            let a = parse(args).unwrap();
            assert_eq!(&a.watch_scope().map(|_| ()), want, "{args:?}");
        }
        let a = parse(&["--allowed-namespaces", "*", "--pod-namespace", "ops"]).unwrap();
        assert!(!a.watch_scope().unwrap().allows("ops"), "the pod's namespace under *");
    }

    #[test]
    fn validate_cross_flag_rules() {
        let a = parse(&["--allowed-namespaces", "team-a", "--watch-namespace", "team-b"]).unwrap();
        assert!(matches!(a.validate(), Err(ArgsError::Namespace(_))));

        let a = parse(&[
            "--allowed-namespaces",
            "*",
            "--lease-duration",
            "10s",
            "--renew-deadline",
            "10s",
        ])
        .unwrap();
        assert!(matches!(a.validate(), Err(ArgsError::LeaderTimings(_))));

        let a = parse(&[
            "--allowed-namespaces",
            "*",
            "--renew-deadline",
            "2s",
            "--retry-period",
            "2s",
        ])
        .unwrap();
        assert!(matches!(a.validate(), Err(ArgsError::LeaderTimings(_))));

        let a = parse(&[
            "--allowed-namespaces",
            "*",
            "--lease-duration",
            "1500ms",
            "--renew-deadline",
            "1s",
            "--retry-period",
            "100ms",
        ])
        .unwrap();
        assert!(matches!(a.validate(), Err(ArgsError::LeaderTimings(_))));

        let a = parse(&["--allowed-namespaces", "*", "--identity", " "]).unwrap();
        assert!(matches!(a.validate(), Err(ArgsError::EmptyIdentity)));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("PT2S"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("-5s").is_err());
        assert!(parse_duration("0s").is_err());
    }
}
