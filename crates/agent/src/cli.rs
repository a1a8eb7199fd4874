//! Flags of the `agent` binary: the common controller flags plus the control plane's.
//! Pull mode (the default) needs the control plane's URL and API key; push mode needs its
//! endpoint's TLS files and token instead ([`AgentArgs::validate`]).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Args;
use controller_kit::{CommonArgs, args::parse_duration};
use protocol::messages::AgentMode;

/// Agent flags. Each can also be set through its environment variable.
#[derive(Args, Debug, Clone)]
pub struct AgentArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Base URL of the Odoo control plane, e.g. `https://odoo.example.com`. Required in
    /// pull mode; unused in push mode, which makes no outbound call. (Checked by
    /// `validate`: clap's conditional rules ignore --mode's default.)
    #[arg(long, env = "VWS_CONTROL_PLANE_URL")]
    pub control_plane_url: Option<String>,

    /// File holding the API key (e.g. a mounted Secret). Exclusive with --credentials-secret;
    /// pull mode needs one of the two.
    #[arg(long, env = "VWS_API_KEY_FILE", conflicts_with = "credentials_secret")]
    pub api_key_file: Option<PathBuf>,

    /// Secret in the agent's own namespace holding the API key (key --credentials-secret-key).
    #[arg(long, env = "VWS_CREDENTIALS_SECRET")]
    pub credentials_secret: Option<String>,

    /// Data key of the API key in --credentials-secret.
    #[arg(long, env = "VWS_CREDENTIALS_SECRET_KEY", default_value = "api-key")]
    pub credentials_secret_key: String,

    /// Odoo database (`X-Odoo-Database` header), when the server hosts several.
    #[arg(long, env = "VWS_ODOO_DATABASE")]
    pub database: Option<String>,

    /// Human name of this cluster, shown in Odoo.
    #[arg(long, env = "VWS_CLUSTER_NAME")]
    pub cluster_name: String,

    /// Periodic sync interval (a status change syncs at once).
    #[arg(long, env = "VWS_SYNC_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub sync_interval: Duration,

    /// Timeout of one call to the control plane.
    #[arg(long, env = "VWS_REQUEST_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// Largest answer accepted from the control plane, in bytes (suffixes Ki, Mi).
    #[arg(long, env = "VWS_MAX_RESPONSE_SIZE", default_value = "8Mi", value_parser = parse_size)]
    pub max_response_size: usize,

    /// PEM file of CA certificates trusted for the control plane, besides the system roots.
    #[arg(long, env = "VWS_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,

    /// Allow a plain http:// control plane URL. Development only: the API key would travel in clear.
    #[arg(long, env = "VWS_INSECURE_ALLOW_HTTP", default_value_t = false, value_parser = clap::builder::BoolishValueParser::new())]
    pub insecure_allow_http: bool,

    /// Most status reports per call.
    #[arg(long, env = "VWS_REPORT_BATCH_SIZE", default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub report_batch_size: u32,

    /// Delay after a status change before syncing, to batch bursts.
    #[arg(long, env = "VWS_REPORT_DELAY", default_value = "250ms", value_parser = parse_duration)]
    pub report_delay: Duration,

    /// How often the agent relists the CRs and sends a full resync of status.
    #[arg(long, env = "VWS_FULL_RESYNC_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub full_resync_interval: Duration,

    /// Longest delay between retries after failures (exponential backoff with jitter from 1s).
    #[arg(long, env = "VWS_MAX_BACKOFF", default_value = "5m", value_parser = parse_duration)]
    pub max_backoff: Duration,

    /// ConfigMap (in the agent's namespace) recording the agent's condition.
    #[arg(long, env = "VWS_STATUS_CONFIGMAP", default_value = "vworkspace-agent-status")]
    pub status_configmap: String,

    /// Address of the gRPC status channel the controllers publish to (their
    /// --status-channel-endpoint); `off` disables it. An accelerator only: the agent's
    /// watches and relists are complete without it.
    #[arg(long, env = "VWS_STATUS_CHANNEL_ADDR", default_value = "0.0.0.0:9090", value_parser = parse_listen_addr)]
    pub status_channel_addr: ListenAddr,

    /// Audience the status channel's publishers' ServiceAccount tokens must be issued for
    /// (their projected token volume's `audience`); checked by a TokenReview.
    #[arg(long, env = "VWS_STATUS_CHANNEL_AUDIENCE", default_value = status_channel::auth::AUDIENCE)]
    pub status_channel_audience: String,

    /// ServiceAccounts allowed to publish to the status channel, comma-separated: `name`
    /// (in the agent's own namespace) or `namespace/name`. Any other token is refused.
    #[arg(
        long,
        env = "VWS_STATUS_CHANNEL_CLIENTS",
        value_delimiter = ',',
        default_value = "app-controller,backup-engine,restore-engine,upgrade-engine,runbook-engine"
    )]
    pub status_channel_clients: Vec<String>,

    /// How intent reaches the agent: `pull` (it calls Odoo, outbound only; the default) or
    /// `push` (Odoo calls its HTTPS endpoint; opt-in, see docs/connectivity).
    #[arg(long, env = "VWS_AGENT_MODE", default_value = "pull", value_parser = parse_mode)]
    pub mode: AgentMode,

    /// Push mode: listen address of the HTTPS endpoint Odoo calls.
    #[arg(long, env = "VWS_PUSH_ADDR", default_value = "0.0.0.0:8443")]
    pub push_addr: SocketAddr,

    /// Push mode: PEM certificate chain of the endpoint (with --push-tls-key).
    #[arg(long, env = "VWS_PUSH_TLS_CERT", requires = "push_tls_key")]
    pub push_tls_cert: Option<PathBuf>,

    /// Push mode: PEM private key of the endpoint's certificate.
    #[arg(long, env = "VWS_PUSH_TLS_KEY", requires = "push_tls_cert")]
    pub push_tls_key: Option<PathBuf>,

    /// Push mode: PEM CA certificates; when set, a client must present a certificate
    /// chained to one of them (mutual TLS), besides the bearer token.
    #[arg(long, env = "VWS_PUSH_CLIENT_CA")]
    pub push_client_ca: Option<PathBuf>,

    /// Push mode: serve plain http instead of https. Development only: the token would
    /// travel in clear.
    #[arg(long, env = "VWS_PUSH_INSECURE_HTTP", default_value_t = false,
        value_parser = clap::builder::BoolishValueParser::new(),
        conflicts_with_all = ["push_tls_cert", "push_tls_key", "push_client_ca"])]
    pub push_insecure_http: bool,

    /// Push mode: file holding the bearer token Odoo must send (e.g. a mounted Secret).
    /// Exclusive with --push-token-secret.
    #[arg(long, env = "VWS_PUSH_TOKEN_FILE", conflicts_with = "push_token_secret")]
    pub push_token_file: Option<PathBuf>,

    /// Push mode: Secret in the agent's own namespace holding the token (key
    /// --push-token-secret-key).
    #[arg(long, env = "VWS_PUSH_TOKEN_SECRET")]
    pub push_token_secret: Option<String>,

    /// Data key of the token in --push-token-secret.
    #[arg(long, env = "VWS_PUSH_TOKEN_SECRET_KEY", default_value = "push-token")]
    pub push_token_secret_key: String,

    /// Push mode: open connections allowed per client address; more are closed before the
    /// TLS handshake. Raise it when Odoo reaches the agent through a proxy or NAT that
    /// shares one address with other clients.
    #[arg(long, env = "VWS_PUSH_MAX_CONNECTIONS_PER_IP", default_value_t = crate::push::limits::CONNECTIONS_PER_IP,
        value_parser = parse_connections)]
    pub push_max_connections_per_ip: usize,

    /// Push mode: largest request body accepted, in bytes (suffixes Ki, Mi); larger is 413.
    #[arg(long, env = "VWS_PUSH_MAX_BODY", default_value = "8Mi", value_parser = parse_size)]
    pub push_max_body: usize,
}

/// A combination of flags that cannot work (what clap's rules cannot express).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModeError {
    /// Pull mode without a URL.
    #[error("pull mode needs --control-plane-url")]
    MissingControlPlaneUrl,
    /// Pull mode without an API key source.
    #[error("pull mode needs --api-key-file or --credentials-secret")]
    MissingApiKey,
    /// Push mode without a token source.
    #[error("push mode needs --push-token-file or --push-token-secret")]
    MissingPushToken,
    /// Push mode without TLS files and without the development flag.
    #[error("push mode needs --push-tls-cert and --push-tls-key (or --push-insecure-http, for development only)")]
    MissingPushTls,
    /// A mode this binary does not implement.
    #[error("unknown mode: use pull or push")]
    UnknownMode,
}

impl AgentArgs {
    /// Checks the flags each mode needs. Pull needs the control plane's URL and a key;
    /// push needs a token and TLS (unless --push-insecure-http), and ignores the pull flags.
    pub fn validate(&self) -> Result<(), ModeError> {
        match self.mode {
            AgentMode::Pull => {
                if self.control_plane_url.as_deref().is_none_or(|u| u.trim().is_empty()) {
                    return Err(ModeError::MissingControlPlaneUrl);
                }
                if self.api_key_file.is_none() && self.credentials_secret.is_none() {
                    return Err(ModeError::MissingApiKey);
                }
            }
            AgentMode::Push => {
                if self.push_token_file.is_none() && self.push_token_secret.is_none() {
                    return Err(ModeError::MissingPushToken);
                }
                let tls = self.push_tls_cert.is_some() && self.push_tls_key.is_some();
                if !tls && !self.push_insecure_http {
                    return Err(ModeError::MissingPushTls);
                }
            }
            AgentMode::Unknown => return Err(ModeError::UnknownMode),
        }
        Ok(())
    }
}

/// 1 to 1024 connections.
pub fn parse_connections(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(format!("invalid connection count {s:?}: use 1 to 1024")),
    }
}

/// `pull` or `push`.
pub fn parse_mode(s: &str) -> Result<AgentMode, String> {
    match s.trim() {
        "pull" => Ok(AgentMode::Pull),
        "push" => Ok(AgentMode::Push),
        other => Err(format!("invalid mode {other:?}: use pull or push")),
    }
}

/// A listen address, or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenAddr(pub Option<SocketAddr>);

/// `0.0.0.0:9090`, `127.0.0.1:0`, or `off`.
pub fn parse_listen_addr(s: &str) -> Result<ListenAddr, String> {
    match s.trim() {
        "off" | "" => Ok(ListenAddr(None)),
        addr => addr
            .parse()
            .map(|a| ListenAddr(Some(a)))
            .map_err(|_| format!("invalid listen address {addr:?}: use host:port, or off")),
    }
}

/// `8Mi`, `512Ki`, `1048576`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("Mi") {
        (n, 1024 * 1024)
    } else if let Some(n) = s.strip_suffix("Ki") {
        (n, 1024)
    } else {
        (s, 1)
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("invalid size {s:?}: use bytes, or Ki / Mi"))?;
    let size = n.checked_mul(mult).ok_or_else(|| format!("size {s:?} is too large"))?;
    if size < 1024 {
        return Err(format!("size {s:?} is below 1Ki"));
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        agent: AgentArgs,
    }

    fn parse(args: &[&str]) -> Result<AgentArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("agent").chain(args.iter().copied())).map(|c| c.agent)
    }

    #[test]
    fn defaults_and_required_flags() {
        let a = parse(&[
            "--control-plane-url",
            "https://odoo",
            "--api-key-file",
            "/k",
            "--cluster-name",
            "c",
        ])
        .unwrap();
        assert_eq!(a.sync_interval, Duration::from_secs(30));
        assert_eq!(a.request_timeout, Duration::from_secs(15));
        assert_eq!(a.max_response_size, 8 * 1024 * 1024);
        assert!(!a.insecure_allow_http);
        assert_eq!(a.status_configmap, "vworkspace-agent-status");
        assert_eq!(a.max_backoff, Duration::from_secs(300));
        assert_eq!(a.status_channel_addr, ListenAddr(Some("0.0.0.0:9090".parse().unwrap())));
        assert_eq!(a.status_channel_audience, "vworkspace-status-channel");
        assert_eq!(
            a.status_channel_clients,
            [
                "app-controller",
                "backup-engine",
                "restore-engine",
                "upgrade-engine",
                "runbook-engine"
            ]
        );
        assert_eq!(a.mode, AgentMode::Pull, "pull is the default");
        a.validate().unwrap();
        assert_eq!(
            parse(&["--control-plane-url", "https://odoo", "--cluster-name", "c"])
                .unwrap()
                .validate(),
            Err(ModeError::MissingApiKey),
            "a key source is required"
        );
        assert!(
            parse(&[
                "--control-plane-url",
                "https://odoo",
                "--cluster-name",
                "c",
                "--api-key-file",
                "/k",
                "--credentials-secret",
                "s"
            ])
            .is_err(),
            "only one key source"
        );
        assert!(
            parse(&[
                "--control-plane-url",
                "https://odoo",
                "--cluster-name",
                "c",
                "--credentials-secret",
                "s"
            ])
            .is_ok()
        );
    }

    #[test]
    fn pull_mode_needs_the_control_plane_push_mode_does_not() {
        assert_eq!(
            parse(&["--api-key-file", "/k", "--cluster-name", "c"])
                .unwrap()
                .validate(),
            Err(ModeError::MissingControlPlaneUrl),
            "pull (the default) needs --control-plane-url"
        );
        assert_eq!(
            parse(&["--mode", "pull", "--api-key-file", "/k", "--cluster-name", "c"])
                .unwrap()
                .validate(),
            Err(ModeError::MissingControlPlaneUrl),
            "and so does an explicit pull"
        );
        let push = parse(&[
            "--mode",
            "push",
            "--cluster-name",
            "c",
            "--push-token-file",
            "/t",
            "--push-tls-cert",
            "/c.pem",
            "--push-tls-key",
            "/k.pem",
        ])
        .unwrap();
        assert_eq!(push.mode, AgentMode::Push);
        assert_eq!(push.control_plane_url, None);
        assert_eq!(push.push_addr, "0.0.0.0:8443".parse().unwrap());
        assert_eq!(push.push_max_body, 8 * 1024 * 1024);
        assert_eq!(push.push_max_connections_per_ip, 8);
        assert_eq!(push.push_token_secret_key, "push-token");
        assert!(!push.push_insecure_http);
        push.validate().unwrap();
        assert!(parse(&["--mode", "sideways", "--cluster-name", "c"]).is_err());
    }

    #[test]
    fn push_mode_needs_a_token_and_tls_unless_insecure() {
        let base = ["--mode", "push", "--cluster-name", "c"];
        let with = |extra: &[&str]| parse(&[&base[..], extra].concat());
        assert_eq!(
            with(&["--push-tls-cert", "/c", "--push-tls-key", "/k"])
                .unwrap()
                .validate(),
            Err(ModeError::MissingPushToken)
        );
        assert_eq!(
            with(&["--push-token-file", "/t"]).unwrap().validate(),
            Err(ModeError::MissingPushTls)
        );
        assert!(
            with(&["--push-token-file", "/t", "--push-tls-cert", "/c"]).is_err(),
            "a certificate needs its key"
        );
        assert!(
            with(&[
                "--push-token-file",
                "/t",
                "--push-token-secret",
                "s",
                "--push-insecure-http"
            ])
            .is_err(),
            "only one token source"
        );
        assert!(
            with(&[
                "--push-token-file",
                "/t",
                "--push-insecure-http",
                "--push-client-ca",
                "/ca"
            ])
            .is_err(),
            "client certificates need TLS"
        );
        let dev = with(&["--push-token-secret", "s", "--push-insecure-http"]).unwrap();
        dev.validate().unwrap();
        let mtls = with(&[
            "--push-token-file",
            "/t",
            "--push-tls-cert",
            "/c",
            "--push-tls-key",
            "/k",
            "--push-client-ca",
            "/ca",
            "--push-max-body",
            "1Mi",
        ])
        .unwrap();
        mtls.validate().unwrap();
        assert_eq!(mtls.push_max_body, 1024 * 1024);
        // Pull flags are allowed in push mode (ignored): one manifest can switch modes.
        with(&[
            "--push-token-file",
            "/t",
            "--push-insecure-http",
            "--control-plane-url",
            "https://odoo",
        ])
        .unwrap()
        .validate()
        .unwrap();
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen_addr("off"), Ok(ListenAddr(None)));
        assert_eq!(
            parse_listen_addr("127.0.0.1:19090"),
            Ok(ListenAddr(Some("127.0.0.1:19090".parse().unwrap())))
        );
        assert!(parse_listen_addr("9090").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8Mi"), Ok(8 * 1024 * 1024));
        assert_eq!(parse_size("512Ki"), Ok(512 * 1024));
        assert_eq!(parse_size("2048"), Ok(2048));
        assert!(parse_size("12").is_err());
        assert!(parse_size("lots").is_err());
    }
}
