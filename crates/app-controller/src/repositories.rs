//! Which chart repository URLs the app controller materialises (pure, table-tested).
//!
//! Flux's source-controller fetches `spec.chart.repository.url` from inside the cluster, and
//! sends the `secretRef` credentials there. Without rules, whoever writes an
//! ApplicationInstance can make it fetch the cloud metadata service or a cluster-internal
//! Service (SSRF), and can send a tenant's repository credentials to a host of their
//! choosing. [`RepositoryPolicy::check`] is applied before anything is materialised, so a
//! refused URL produces no HelmRepository or OCIRepository, and its credentials go nowhere.
//!
//! The rules, in order (the first that fails is the refusal):
//! 1. the URL parses and is `http://`, `https://` or `oci://` (credentials in the URL are
//!    refused later by the engine with `InvalidSpec`; messages here never repeat the URL);
//! 2. an internal host is refused unless it is *named* (exactly, not through `*` or
//!    `*.domain`) in `--allowed-repository-hosts` or `--insecure-repository-hosts`:
//!    loopback, link-local (169.254.0.0/16, fe80::/10), unspecified, `localhost`,
//!    dot-less names (resolved through the cluster's DNS search path), `*.svc`,
//!    `*.cluster.local`, `*.internal`, `*.localhost`, and addresses in
//!    `--blocked-repository-cidrs` (e.g. the pod and service ranges, or RFC 1918);
//! 3. the host matches `--allowed-repository-hosts` (default `*`: any host);
//! 4. `http://` only for a host matching `--insecure-repository-hosts` (default: none).
//!
//! Names are never resolved here: a public-looking name whose DNS points at an internal
//! address passes rule 2; only the host allow-list (rule 3) stops it.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

/// Why a repository flag was rejected at startup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A host pattern that is neither `*`, `*.domain` nor a host name or IP address.
    #[error("{0:?} is not a host, `*` or `*.domain`")]
    BadHost(String),
    /// A CIDR that does not parse or whose prefix is too long.
    #[error("{0:?} is not a CIDR (e.g. 10.0.0.0/8 or fd00::/8)")]
    BadCidr(String),
}

/// One entry of a host list: `*`, `*.example.com` (any subdomain, not the domain itself), or
/// an exact host name or IP address.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Any,
    Suffix(String),
    Exact(String),
}

impl HostPattern {
    fn matches(&self, host: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Suffix(suffix) => host.len() > suffix.len() && host.ends_with(suffix.as_str()),
            Self::Exact(h) => h == host,
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            // The suffix keeps its leading dot: `*` + `.example.com`.
            Self::Suffix(s) => write!(f, "*{s}"),
            Self::Exact(h) => f.write_str(h),
        }
    }
}

/// A comma-separated host list, as given to `--allowed-repository-hosts` and
/// `--insecure-repository-hosts`. Empty means no host.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostList(Vec<HostPattern>);

impl HostList {
    fn matches(&self, host: &str) -> bool {
        self.0.iter().any(|p| p.matches(host))
    }

    /// Named exactly: an explicit decision about this host, which is what lets an internal
    /// host through.
    fn names(&self, host: &str) -> bool {
        self.0.iter().any(|p| matches!(p, HostPattern::Exact(h) if h == host))
    }
}

impl FromStr for HostList {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = Vec::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let pattern = if entry == "*" {
                HostPattern::Any
            } else if let Some(domain) = entry.strip_prefix("*.") {
                let domain = normalise_host(domain).ok_or_else(|| PolicyError::BadHost(entry.to_owned()))?;
                HostPattern::Suffix(format!(".{domain}"))
            } else {
                HostPattern::Exact(normalise_host(entry).ok_or_else(|| PolicyError::BadHost(entry.to_owned()))?)
            };
            out.push(pattern);
        }
        Ok(Self(out))
    }
}

impl fmt::Display for HostList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// The host form used for matching: lowercase, no trailing dot, IPv6 without brackets and
/// in canonical form. `None` when it is not a host.
fn normalise_host(s: &str) -> Option<String> {
    let s = s.trim().trim_end_matches('.').to_ascii_lowercase();
    let bare = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')).unwrap_or(&s);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Some(ip.to_string());
    }
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    ok.then_some(s)
}

/// An IP range: `10.0.0.0/8`, `fd00::/8`; a bare address is a /32 or /128.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PolicyError::BadCidr(s.to_owned());
        let (addr, prefix) = s.trim().split_once('/').unwrap_or((s.trim(), ""));
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = if prefix.is_empty() {
            max
        } else {
            prefix.parse::<u8>().map_err(|_| bad())?
        };
        if prefix > max {
            return Err(bad());
        }
        Ok(Self { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Comma-separated CIDRs (`--blocked-repository-cidrs`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CidrList(Vec<Cidr>);

impl FromStr for CidrList {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

/// The repository rules of one app controller, from its flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepositoryPolicy {
    /// `--allowed-repository-hosts`.
    pub allowed_hosts: HostList,
    /// `--insecure-repository-hosts`: hosts that may be fetched over plain `http://`.
    pub insecure_hosts: HostList,
    /// `--blocked-repository-cidrs`: ranges refused like loopback and link-local.
    pub blocked_cidrs: CidrList,
}

impl Default for RepositoryPolicy {
    /// The flags' defaults: any host over TLS, no plain http, only the built-in internal ranges.
    fn default() -> Self {
        Self {
            allowed_hosts: HostList(vec![HostPattern::Any]),
            insecure_hosts: HostList::default(),
            blocked_cidrs: CidrList::default(),
        }
    }
}

/// The app controller's repository flags; `main.rs` flattens them into its command line.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Chart repository rules")]
pub struct RepositoryArgs {
    /// Hosts `spec.chart.repository.url` may name: comma-separated host names or IP addresses,
    /// `*.example.com` (any subdomain), or `*` (any host). Internal hosts must be named exactly.
    #[arg(long, env = "VWS_ALLOWED_REPOSITORY_HOSTS", default_value = "*", value_parser = parse_hosts)]
    pub allowed_repository_hosts: HostList,

    /// Hosts a repository may be fetched from over plain `http://` (same syntax; default none).
    /// Naming a host exactly here also allows it if it is internal (e.g. a chart server on 127.0.0.1).
    #[arg(long, env = "VWS_INSECURE_REPOSITORY_HOSTS", default_value = "", value_parser = parse_hosts)]
    pub insecure_repository_hosts: HostList,

    /// IP ranges refused like loopback and link-local (e.g. the pod and service CIDRs, or
    /// 10.0.0.0/8,172.16.0.0/12,192.168.0.0/16): comma-separated CIDRs, default none.
    #[arg(long, env = "VWS_BLOCKED_REPOSITORY_CIDRS", default_value = "", value_parser = parse_cidrs)]
    pub blocked_repository_cidrs: CidrList,
}

impl RepositoryArgs {
    /// The policy these flags describe.
    pub fn policy(&self) -> RepositoryPolicy {
        RepositoryPolicy {
            allowed_hosts: self.allowed_repository_hosts.clone(),
            insecure_hosts: self.insecure_repository_hosts.clone(),
            blocked_cidrs: self.blocked_repository_cidrs.clone(),
        }
    }
}

fn parse_hosts(s: &str) -> Result<HostList, PolicyError> {
    s.parse()
}

fn parse_cidrs(s: &str) -> Result<CidrList, PolicyError> {
    s.parse()
}

/// Host-name suffixes that only resolve inside the cluster or the machine.
const INTERNAL_SUFFIXES: &[&str] = &[".svc", ".cluster.local", ".internal", ".localhost"];

impl RepositoryPolicy {
    /// `Ok` when `url` may be materialised; otherwise the refusal, naming the rule (and the flag
    /// that would allow it), for the `RepositoryNotAllowed` condition message.
    pub fn check(&self, url: &str) -> Result<(), String> {
        // Messages name the host at most, never the URL: it may carry `user:pass@`.
        let parsed = url::Url::parse(url).map_err(|e| format!("the repository URL does not parse: {e}"))?;
        let scheme = parsed.scheme();
        if !matches!(scheme, "http" | "https" | "oci") {
            return Err(format!(
                "repository URL scheme {scheme}:// is not allowed (https://, oci://)"
            ));
        }
        // The WHATWG parser has already normalised the host (`0x7f.1` → `127.0.0.1`,
        // IPv6 canonical form), so the checks below see what a client would connect to.
        let host = match parsed.host() {
            Some(url::Host::Domain(d)) => d.trim_end_matches('.').to_ascii_lowercase(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err("the repository URL has no host".to_owned()),
        };
        // Internal first: the most dangerous case, and the most useful message.
        let named = self.allowed_hosts.names(&host) || self.insecure_hosts.names(&host);
        if !named && let Some(why) = self.internal(&host) {
            return Err(format!(
                "repository host {host} is {why}, refused unless a cluster administrator names it in \
                 --allowed-repository-hosts"
            ));
        }
        if !self.allowed_hosts.matches(&host) {
            return Err(format!(
                "repository host {host} is not in the allowed repository hosts ({}; --allowed-repository-hosts)",
                self.allowed_hosts
            ));
        }
        if scheme == "http" && !self.insecure_hosts.matches(&host) {
            return Err(format!(
                "plain http:// to {host} is refused; use https://, or a cluster administrator can allow \
                 the host with --insecure-repository-hosts {host}"
            ));
        }
        Ok(())
    }

    /// Why `host` is internal to the cluster or the node, if it is.
    fn internal(&self, host: &str) -> Option<String> {
        let Ok(ip) = host.parse::<IpAddr>() else {
            if host == "localhost" {
                return Some("the local machine (localhost)".to_owned());
            }
            if !host.contains('.') {
                return Some("a name without a domain (resolved through the cluster's DNS search path)".to_owned());
            }
            return INTERNAL_SUFFIXES
                .iter()
                .find(|s| host.ends_with(*s))
                .map(|s| format!("a cluster-internal name (*{s})"));
        };
        // An IPv4 address written as IPv6 (`::ffff:169.254.169.254`) reaches the IPv4 one.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let builtin = match ip {
            IpAddr::V4(v4) => ipv4_class(v4),
            IpAddr::V6(v6) => ipv6_class(v6),
        };
        if let Some(class) = builtin {
            return Some(format!("a {class} address"));
        }
        self.blocked_cidrs
            .0
            .iter()
            .find(|c| c.contains(ip))
            .map(|c| format!("in a blocked range ({c}; --blocked-repository-cidrs)"))
    }
}

fn ipv4_class(ip: Ipv4Addr) -> Option<&'static str> {
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_link_local() {
        Some("link-local (169.254.0.0/16, cloud metadata)")
    } else if ip.is_unspecified() || ip.octets()[0] == 0 {
        // 0.0.0.0/8 reaches the local host on Linux.
        Some("unspecified (0.0.0.0/8)")
    } else {
        None
    }
}

fn ipv6_class(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.segments()[0] & 0xffc0 == 0xfe80 {
        Some("link-local (fe80::/10)")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allowed: &str, insecure: &str, blocked: &str) -> RepositoryPolicy {
        RepositoryPolicy {
            allowed_hosts: allowed.parse().unwrap(),
            insecure_hosts: insecure.parse().unwrap(),
            blocked_cidrs: blocked.parse().unwrap(),
        }
    }

    /// (url, allowed hosts, insecure hosts, blocked CIDRs, Ok or a fragment of the refusal)
    type Case = (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        Result<(), &'static str>,
    );

    #[test]
    fn check_table() {
        let cases: &[Case] = &[
            // The defaults: any public host over TLS.
            ("https://charts.example.com", "*", "", "", Ok(())),
            ("oci://ghcr.io/org/charts/app", "*", "", "", Ok(())),
            ("https://10.1.2.3/charts", "*", "", "", Ok(())),
            // Plain http.
            (
                "http://charts.example.com",
                "*",
                "",
                "",
                Err("plain http:// to charts.example.com is refused"),
            ),
            ("http://charts.example.com", "*", "charts.example.com", "", Ok(())),
            ("http://charts.example.com", "*", "*.example.com", "", Ok(())),
            ("http://example.com", "*", "*.example.com", "", Err("plain http://")),
            // The host allow-list.
            ("https://charts.example.com", "*.example.com", "", "", Ok(())),
            ("https://charts.example.com.", "*.example.com", "", "", Ok(())),
            ("https://CHARTS.Example.com", "*.example.com", "", "", Ok(())),
            (
                "https://evil.example.org",
                "*.example.com",
                "",
                "",
                Err("not in the allowed repository hosts (*.example.com"),
            ),
            (
                "https://example.com.evil.org",
                "*.example.com",
                "",
                "",
                Err("not in the allowed repository hosts"),
            ),
            (
                "oci://evil.example.org/charts",
                "charts.example.com",
                "",
                "",
                Err("not in the allowed repository hosts"),
            ),
            (
                "https://evil.example.org",
                "",
                "",
                "",
                Err("allowed repository hosts (none"),
            ),
            // Internal addresses, refused by default.
            (
                "http://169.254.169.254/latest/meta-data",
                "*",
                "169.254.169.254",
                "169.254.0.0/16",
                Ok(()),
            ),
            (
                "https://169.254.169.254/latest/meta-data",
                "*",
                "",
                "",
                Err("link-local"),
            ),
            ("http://169.254.169.254/", "*", "*", "", Err("link-local")),
            ("https://[fe80::1]/", "*", "", "", Err("link-local (fe80::/10)")),
            ("https://[::ffff:169.254.169.254]/", "*", "", "", Err("link-local")),
            ("https://127.0.0.1:8080/", "*", "", "", Err("loopback")),
            ("https://0x7f.1/", "*", "", "", Err("127.0.0.1 is a loopback")),
            ("https://2130706433/", "*", "", "", Err("loopback")),
            ("https://[::1]/", "*", "", "", Err("loopback")),
            ("https://0.0.0.0/", "*", "", "", Err("unspecified")),
            ("https://[::]/", "*", "", "", Err("unspecified")),
            ("https://localhost:5000/", "*", "", "", Err("localhost")),
            ("https://kubernetes/", "*", "", "", Err("without a domain")),
            (
                "https://kubernetes.default.svc/",
                "*",
                "",
                "",
                Err("cluster-internal name (*.svc)"),
            ),
            (
                "https://kubernetes.default.svc.cluster.local./",
                "*",
                "",
                "",
                Err("(*.cluster.local)"),
            ),
            ("https://metadata.google.internal/", "*", "", "", Err("(*.internal)")),
            (
                "oci://registry.kube-system.svc:5000/charts",
                "*",
                "",
                "",
                Err("(*.svc)"),
            ),
            (
                "https://10.96.0.1/",
                "*",
                "",
                "10.96.0.0/12, 10.244.0.0/16",
                Err("blocked range (10.96.0.0/12"),
            ),
            ("https://10.95.0.1/", "*", "", "10.96.0.0/12", Ok(())),
            (
                "https://[fd00::1]/",
                "*",
                "",
                "fd00::/8",
                Err("blocked range (fd00::/8"),
            ),
            // Named exactly, an internal host is allowed (the local test cluster's chart server).
            ("http://127.0.0.1:8879/charts", "*", "127.0.0.1", "", Ok(())),
            ("https://registry.ops.svc/", "registry.ops.svc", "", "", Ok(())),
            ("https://registry.ops.svc/", "*.ops.svc", "", "", Err("(*.svc)")),
            ("https://10.96.0.5/", "10.96.0.5", "", "10.96.0.0/12", Ok(())),
            // Malformed URLs. Credentials in the URL are the engine's InvalidSpec; the host rules
            // still apply to them.
            ("https://user:secret@charts.example.com", "*", "", "", Ok(())),
            ("https://user:secret@169.254.169.254/", "*", "", "", Err("link-local")),
            ("ftp://charts.example.com", "*", "", "", Err("scheme ftp://")),
            ("not a url", "*", "", "", Err("does not parse")),
        ];
        for (url, allowed, insecure, blocked, want) in cases {
            let got = policy(allowed, insecure, blocked).check(url);
            match (want, &got) {
                (Ok(()), Ok(())) => {}
                (Err(fragment), Err(message)) if message.contains(fragment) => {}
                _ => panic!(
                    "{url} (allowed {allowed:?}, insecure {insecure:?}, blocked {blocked:?}): want {want:?}, got {got:?}"
                ),
            }
        }
    }

    #[test]
    fn refusal_never_echoes_credentials() {
        for url in [
            "https://user:hunter2@169.254.169.254/",
            "http://user:hunter2@charts.example.com/",
            "https://user:hunter2@[bad/",
        ] {
            let err = RepositoryPolicy::default().check(url).unwrap_err();
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn default_is_any_host_over_tls() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            repositories: RepositoryArgs,
        }
        let p = RepositoryPolicy::default();
        assert_eq!(p, policy("*", "", ""));
        assert_eq!(
            Cli::parse_from(["app-controller"]).repositories.policy(),
            p,
            "the flags' defaults"
        );
        let flags = Cli::parse_from([
            "app-controller",
            "--allowed-repository-hosts",
            "*.example.com,127.0.0.1",
            "--insecure-repository-hosts",
            "127.0.0.1",
            "--blocked-repository-cidrs",
            "10.96.0.0/12",
        ]);
        assert_eq!(
            flags.repositories.policy(),
            policy("*.example.com,127.0.0.1", "127.0.0.1", "10.96.0.0/12")
        );
        assert!(p.check("https://charts.bitnami.com/bitnami").is_ok());
        assert!(p.check("http://charts.bitnami.com/bitnami").is_err());
    }

    #[test]
    fn flag_parsing_table() {
        let hosts: &[(&str, Result<&str, PolicyError>)] = &[
            ("", Ok("none")),
            ("*", Ok("*")),
            (" *.Example.com , 127.0.0.1,[::1] ", Ok("*.example.com, 127.0.0.1, ::1")),
            ("charts.example.com.", Ok("charts.example.com")),
            ("*.", Err(PolicyError::BadHost("*.".into()))),
            ("http://x", Err(PolicyError::BadHost("http://x".into()))),
            ("a b", Err(PolicyError::BadHost("a b".into()))),
            ("*example.com", Err(PolicyError::BadHost("*example.com".into()))),
        ];
        for (input, want) in hosts {
            let got = input.parse::<HostList>().map(|l| l.to_string());
            assert_eq!(got.as_deref().map_err(Clone::clone), want.clone(), "{input:?}");
        }
        let cidrs: &[(&str, bool)] = &[
            ("", true),
            ("10.0.0.0/8", true),
            ("10.0.0.0/8, 192.168.0.0/16 ,fd00::/8", true),
            ("10.1.2.3", true),
            ("10.0.0.0/33", false),
            ("fd00::/129", false),
            ("10.0.0/8", false),
            ("10.0.0.0/x", false),
        ];
        for (input, ok) in cidrs {
            assert_eq!(input.parse::<CidrList>().is_ok(), *ok, "{input:?}");
        }
    }

    #[test]
    fn cidr_contains_table() {
        let cases: &[(&str, &str, bool)] = &[
            ("10.0.0.0/8", "10.255.1.1", true),
            ("10.0.0.0/8", "11.0.0.1", false),
            ("0.0.0.0/0", "8.8.8.8", true),
            ("10.1.2.3", "10.1.2.3", true),
            ("10.1.2.3", "10.1.2.4", false),
            ("fd00::/8", "fd12::1", true),
            ("fd00::/8", "fe80::1", false),
            ("::/0", "2001:db8::1", true),
            ("10.0.0.0/8", "::1", false),
        ];
        for (cidr, ip, want) in cases {
            let c: Cidr = cidr.parse().unwrap();
            assert_eq!(c.contains(ip.parse().unwrap()), *want, "{cidr} ∋ {ip}");
        }
    }
}
