//! Which namespaces a binary may touch.
//!
//! The design promise is "never go beyond the namespaces it has been told it may
//! touch". [`NamespacePolicy`] is that list, parsed once at startup from
//! `--allowed-namespaces`; controllers check [`WatchScope::allows`] before acting on
//! an object and use [`NamespacePolicy`]'s `Display` in condition messages when they
//! refuse. `--watch-namespace` narrows the watch itself (namespaced RBAC), and must
//! lie inside the allow-list.
//!
//! The allow-list is required (no implicit `*`), and some namespaces are never allowed,
//! not even under `*` ([`is_system_namespace`]): the cluster's own (`kube-*`), Flux's,
//! Velero's and the operator's. Writing into one of them is a cluster-wide escalation
//! (a release in `kube-system` or `flux-system` runs with the rights of what lives
//! there), so no flag can open them.

use std::{collections::BTreeSet, fmt, str::FromStr};

/// Why a namespace flag was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespaceError {
    /// The flag was empty; use `*` to allow all namespaces.
    #[error("the namespace list is empty; use \"*\" to allow all namespaces")]
    Empty,
    /// No allow-list was given at all: the binary must be told where it may act.
    #[error(
        "no namespace allow-list: set --allowed-namespaces or the env var VWS_ALLOWED_NAMESPACES \
         (comma-separated namespaces, or \"*\" for every namespace but the system ones)"
    )]
    Required,
    /// A namespace that is never allowed was named explicitly.
    #[error("{0:?} is a system namespace and is never allowed ({SYSTEM_NAMESPACES_TEXT})")]
    System(String),
    /// An entry between two commas was blank (e.g. `team-a,,team-b`).
    #[error("the namespace list {0:?} has an empty entry")]
    EmptyEntry(String),
    /// `*` was mixed with explicit names.
    #[error("\"*\" must stand alone, not be combined with namespace names")]
    WildcardNotAlone,
    /// Not a DNS-1123 label.
    #[error(
        "{name:?} is not a valid namespace name: {reason} (DNS-1123 label: at most 63 lowercase \
         alphanumerics or '-', starting and ending with an alphanumeric)"
    )]
    Invalid {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An `--allowed-namespace-pairs` entry that is not `FROM=TO`.
    #[error("namespace pair {0:?} is not of the form FROM=TO (e.g. team-a=shared-charts)")]
    BadPair(String),
    /// `--watch-namespace` names a namespace the policy does not allow.
    #[error("watch namespace {namespace:?} is outside the {policy}")]
    WatchNotAllowed {
        /// The requested watch namespace.
        namespace: String,
        /// The policy it violates.
        policy: NamespacePolicy,
    },
}

/// Namespaces that are never allowed, by exact name. Every `kube-` namespace is refused too
/// (Kubernetes reserves that prefix: `kube-system`, `kube-public`, `kube-node-lease`).
/// `velero` is here because whoever writes there reads and writes every namespace through
/// Velero Backups and Restores.
pub const SYSTEM_NAMESPACES: &[&str] = &["flux-system", "vworkspace-system", "velero"];

/// The rule in words, for messages and docs.
pub const SYSTEM_NAMESPACES_TEXT: &str =
    "system namespaces: kube-*, flux-system, vworkspace-system, velero and the binary's own namespace";

/// Whether `namespace` is a system namespace no policy may allow: a `kube-` namespace, one of
/// [`SYSTEM_NAMESPACES`], or `own` (the binary's pod namespace, when known), so a tenant's
/// release can never reach the operator's Secrets, Leases or RBAC.
pub fn is_system_namespace(namespace: &str, own: Option<&str>) -> bool {
    namespace.starts_with("kube-") || SYSTEM_NAMESPACES.contains(&namespace) || own == Some(namespace)
}

/// Checks that `name` is a DNS-1123 label, the rule Kubernetes applies to namespace names.
pub fn validate_namespace(name: &str) -> Result<(), NamespaceError> {
    let invalid = |reason| {
        Err(NamespaceError::Invalid {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return invalid("empty");
    }
    if name.len() > 63 {
        return invalid("longer than 63 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return invalid("only lowercase letters, digits and '-' are allowed");
    }
    if name.starts_with('-') || name.ends_with('-') {
        return invalid("must start and end with a letter or digit");
    }
    Ok(())
}

/// The set of namespaces a binary may act in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespacePolicy {
    /// Every namespace (`*`).
    All,
    /// Only these namespaces. Never empty.
    AllowList(BTreeSet<String>),
}

impl NamespacePolicy {
    /// Whether objects in `namespace` may be read and written. A system namespace never is,
    /// not even under `*` ([`is_system_namespace`]; the binary's own namespace is checked by
    /// [`WatchScope`], which knows it).
    pub fn allows(&self, namespace: &str) -> bool {
        !is_system_namespace(namespace, None)
            && match self {
                Self::All => true,
                Self::AllowList(set) => set.contains(namespace),
            }
    }
}

impl FromStr for NamespacePolicy {
    type Err = NamespaceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(NamespaceError::Empty);
        }
        if s == "*" {
            return Ok(Self::All);
        }
        let mut set = BTreeSet::new();
        for entry in s.split(',').map(str::trim) {
            match entry {
                "" => return Err(NamespaceError::EmptyEntry(s.to_owned())),
                "*" => return Err(NamespaceError::WildcardNotAlone),
                name => {
                    validate_namespace(name)?;
                    // Refused at startup rather than dropped: a listed system namespace
                    // is a configuration mistake the operator should see.
                    if is_system_namespace(name, None) {
                        return Err(NamespaceError::System(name.to_owned()));
                    }
                    set.insert(name.to_owned());
                }
            }
        }
        Ok(Self::AllowList(set))
    }
}

/// Human-readable, for condition messages: `all namespaces` or `allowed namespaces: team-a, team-b`.
impl fmt::Display for NamespacePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => write!(f, "allowed namespaces: all but the {SYSTEM_NAMESPACES_TEXT}"),
            Self::AllowList(set) => {
                f.write_str("allowed namespaces: ")?;
                for (i, ns) in set.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(ns)?;
                }
                Ok(())
            }
        }
    }
}

/// Namespace pairs a cluster administrator allows an object in the first namespace to reach
/// in the second (`--allowed-namespace-pairs team-a=shared-charts,...`). Without a pair, an
/// object reaches only its own namespace: one tenant's intent never names another tenant's
/// namespace. Tenants cannot set this; it is a flag of the binary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespacePairs(BTreeSet<(String, String)>);

impl NamespacePairs {
    /// Whether an object in `from` may reference `to`: its own namespace, or an allowed pair.
    pub fn allows(&self, from: &str, to: &str) -> bool {
        from == to || self.0.contains(&(from.to_owned(), to.to_owned()))
    }
}

impl FromStr for NamespacePairs {
    type Err = NamespaceError;

    /// `""` (no pairs) or comma-separated `FROM=TO` pairs of namespace names.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut pairs = BTreeSet::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((from, to)) = entry.split_once('=') else {
                return Err(NamespaceError::BadPair(entry.to_owned()));
            };
            let (from, to) = (from.trim(), to.trim());
            validate_namespace(from)?;
            validate_namespace(to)?;
            pairs.insert((from.to_owned(), to.to_owned()));
        }
        Ok(Self(pairs))
    }
}

/// The namespace policy combined with `--watch-namespace`: what to watch, and what to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchScope {
    policy: NamespacePolicy,
    watch_namespace: Option<String>,
    /// The binary's own (pod) namespace, never allowed: see [`WatchScope::with_own_namespace`].
    own_namespace: Option<String>,
}

impl WatchScope {
    /// Combines the policy with an optional single watch namespace; a watch namespace
    /// outside the policy is a startup error rather than a silently empty watch.
    pub fn new(policy: NamespacePolicy, watch_namespace: Option<String>) -> Result<Self, NamespaceError> {
        if let Some(ns) = &watch_namespace {
            validate_namespace(ns)?;
            if is_system_namespace(ns, None) {
                return Err(NamespaceError::System(ns.clone()));
            }
            if !policy.allows(ns) {
                return Err(NamespaceError::WatchNotAllowed {
                    namespace: ns.clone(),
                    policy,
                });
            }
        }
        Ok(Self {
            policy,
            watch_namespace,
            own_namespace: None,
        })
    }

    /// Never allows `own`, the namespace the binary runs in (its pod's, from the downward
    /// API), which holds its credentials, Leases and configuration. Naming it in the
    /// allow-list or as the watch namespace is a startup error.
    pub fn with_own_namespace(mut self, own: Option<String>) -> Result<Self, NamespaceError> {
        if let Some(own) = &own {
            let listed = matches!(&self.policy, NamespacePolicy::AllowList(set) if set.contains(own));
            if listed || self.watch_namespace.as_ref() == Some(own) {
                return Err(NamespaceError::System(own.clone()));
            }
        }
        self.own_namespace = own;
        Ok(self)
    }

    /// The allow-list.
    pub fn policy(&self) -> &NamespacePolicy {
        &self.policy
    }

    /// The single namespace to watch, if any; `None` means a cluster-wide watch.
    pub fn watch_namespace(&self) -> Option<&str> {
        self.watch_namespace.as_deref()
    }

    /// Whether an object in `namespace` may be acted on: inside the watch namespace
    /// (when one is set) and allowed by the policy.
    pub fn allows(&self, namespace: &str) -> bool {
        self.watch_namespace.as_deref().is_none_or(|w| w == namespace) && self.allows_reference(namespace)
    }

    /// Whether `namespace` may be named by an object (a target, a source, a dependency):
    /// allowed by the policy and not the binary's own namespace. Unlike [`WatchScope::allows`],
    /// the watch namespace does not narrow it.
    pub fn allows_reference(&self, namespace: &str) -> bool {
        self.policy.allows(namespace) && !is_system_namespace(namespace, self.own_namespace.as_deref())
    }

    /// An `Api` over the watched namespace, or over all namespaces for a cluster-wide watch.
    pub fn api<K>(&self, client: kube::Client) -> kube::Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.watch_namespace {
            Some(ns) => kube::Api::namespaced(client, ns),
            None => kube::Api::all(client),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> NamespacePolicy {
        NamespacePolicy::AllowList(names.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn parse_table() {
        let cases: &[(&str, Result<NamespacePolicy, NamespaceError>)] = &[
            ("*", Ok(NamespacePolicy::All)),
            (" * ", Ok(NamespacePolicy::All)),
            ("team-a", Ok(set(&["team-a"]))),
            ("team-b, team-a", Ok(set(&["team-a", "team-b"]))),
            (" team-a ,team-a", Ok(set(&["team-a"]))),
            ("a1,0b", Ok(set(&["0b", "a1"]))),
            ("", Err(NamespaceError::Empty)),
            ("   ", Err(NamespaceError::Empty)),
            (
                "team-a,,team-b",
                Err(NamespaceError::EmptyEntry("team-a,,team-b".into())),
            ),
            ("team-a,", Err(NamespaceError::EmptyEntry("team-a,".into()))),
            ("*,team-a", Err(NamespaceError::WildcardNotAlone)),
            ("kube-system", Err(NamespaceError::System("kube-system".into()))),
            ("team-a,flux-system", Err(NamespaceError::System("flux-system".into()))),
            (
                "vworkspace-system",
                Err(NamespaceError::System("vworkspace-system".into())),
            ),
            ("velero,team-a", Err(NamespaceError::System("velero".into()))),
            ("kube-node-lease", Err(NamespaceError::System("kube-node-lease".into()))),
        ];
        for (input, want) in cases {
            assert_eq!(&input.parse::<NamespacePolicy>(), want, "input {input:?}");
        }
    }

    #[test]
    fn invalid_names_table() {
        let long = "a".repeat(64);
        for bad in ["Team-A", "team_a", "-team", "team-", "team.a", "tëam", long.as_str()] {
            let err = bad.parse::<NamespacePolicy>().unwrap_err();
            assert!(
                matches!(&err, NamespaceError::Invalid { name, .. } if name == bad),
                "{bad:?}: {err}"
            );
            assert!(
                err.to_string().contains("DNS-1123"),
                "message should explain the rule: {err}"
            );
        }
        assert!(validate_namespace(&"a".repeat(63)).is_ok());
    }

    #[test]
    fn namespace_pairs_allow_only_listed_pairs_and_the_own_namespace() {
        let pairs: NamespacePairs = "team-a=shared, team-b=shared".parse().unwrap();
        assert!(pairs.allows("team-a", "team-a"));
        assert!(pairs.allows("team-a", "shared"));
        assert!(!pairs.allows("shared", "team-a"), "pairs are one-way");
        assert!(!pairs.allows("team-a", "team-b"));
        assert!(!NamespacePairs::default().allows("team-a", "team-b"));
        assert_eq!("".parse::<NamespacePairs>().unwrap(), NamespacePairs::default());
        assert!(matches!(
            "team-a".parse::<NamespacePairs>(),
            Err(NamespaceError::BadPair(_))
        ));
        assert!(matches!(
            "team-a=Team_B".parse::<NamespacePairs>(),
            Err(NamespaceError::Invalid { .. })
        ));
    }

    #[test]
    fn allows_table() {
        let cases = [
            (NamespacePolicy::All, "anything", true),
            (set(&["team-a", "team-b"]), "team-a", true),
            (set(&["team-a", "team-b"]), "team-c", false),
            (set(&["team-a"]), "", false),
        ];
        for (policy, ns, want) in cases {
            assert_eq!(policy.allows(ns), want, "{policy} / {ns}");
        }
    }

    #[test]
    fn system_namespaces_table() {
        let cases: &[(&str, Option<&str>, bool)] = &[
            ("kube-system", None, true),
            ("kube-public", None, true),
            ("kube-node-lease", None, true),
            ("kube-anything-new", None, true),
            ("flux-system", None, true),
            ("vworkspace-system", None, true),
            ("velero", None, true),
            ("ops", Some("ops"), true),
            ("ops", None, false),
            ("ops", Some("vworkspace-ops"), false),
            ("default", None, false),
            ("kubernetes", None, false),
            ("team-a", Some("vworkspace-system"), false),
            ("my-kube-system", None, false),
        ];
        for (ns, own, want) in cases {
            assert_eq!(is_system_namespace(ns, *own), *want, "{ns} (own {own:?})");
        }
    }

    #[test]
    fn system_namespaces_are_never_allowed_even_under_the_wildcard() {
        for ns in [
            "kube-system",
            "kube-public",
            "kube-node-lease",
            "flux-system",
            "vworkspace-system",
            "velero",
        ] {
            assert!(!NamespacePolicy::All.allows(ns), "{ns}");
            let scope = WatchScope::new(NamespacePolicy::All, None).unwrap();
            assert!(!scope.allows(ns) && !scope.allows_reference(ns), "{ns}");
            assert_eq!(
                WatchScope::new(NamespacePolicy::All, Some(ns.to_owned())),
                Err(NamespaceError::System(ns.to_owned())),
            );
        }
    }

    #[test]
    fn own_namespace_table() {
        let all = || WatchScope::new(NamespacePolicy::All, None).unwrap();
        let scope = all().with_own_namespace(Some("ops".into())).unwrap();
        assert!(!scope.allows("ops"), "own namespace under *");
        assert!(!scope.allows_reference("ops"), "own namespace as a target");
        assert!(scope.allows("team-a"));
        assert!(scope.allows_reference("team-a"));
        assert!(all().with_own_namespace(None).unwrap().allows("ops"));

        let listed = WatchScope::new(set(&["ops", "team-a"]), None).unwrap();
        assert_eq!(
            listed.with_own_namespace(Some("ops".into())),
            Err(NamespaceError::System("ops".into())),
            "the own namespace named explicitly is a startup error"
        );
        let watched = WatchScope::new(NamespacePolicy::All, Some("ops".into())).unwrap();
        assert_eq!(
            watched.with_own_namespace(Some("ops".into())),
            Err(NamespaceError::System("ops".into()))
        );
        // The namespaced overlay: the pod runs in vworkspace-system and watches team-a.
        let confined = WatchScope::new(set(&["team-a"]), Some("team-a".into()))
            .unwrap()
            .with_own_namespace(Some("vworkspace-system".into()))
            .unwrap();
        assert!(confined.allows("team-a"));
    }

    #[test]
    fn display() {
        assert_eq!(
            set(&["team-b", "team-a"]).to_string(),
            "allowed namespaces: team-a, team-b"
        );
        assert_eq!(
            NamespacePolicy::All.to_string(),
            "allowed namespaces: all but the system namespaces: kube-*, flux-system, vworkspace-system, velero \
             and the binary's own namespace"
        );
        assert!(
            NamespaceError::Required.to_string().contains("--allowed-namespaces")
                && NamespaceError::Required.to_string().contains("VWS_ALLOWED_NAMESPACES"),
            "the startup error names the flag and the env var"
        );
    }

    #[test]
    fn watch_scope_table() {
        let cases: &[(NamespacePolicy, Option<&str>, bool)] = &[
            (NamespacePolicy::All, None, true),
            (NamespacePolicy::All, Some("team-a"), true),
            (set(&["team-a"]), Some("team-a"), true),
            (set(&["team-a"]), Some("team-b"), false),
            (set(&["team-a"]), None, true),
            (NamespacePolicy::All, Some("Bad"), false),
        ];
        for (policy, watch, ok) in cases {
            let res = WatchScope::new(policy.clone(), watch.map(str::to_owned));
            assert_eq!(res.is_ok(), *ok, "{policy} / {watch:?}: {res:?}");
        }
        let err = WatchScope::new(set(&["team-a"]), Some("team-b".into())).unwrap_err();
        assert_eq!(
            err.to_string(),
            "watch namespace \"team-b\" is outside the allowed namespaces: team-a"
        );
    }

    #[test]
    fn watch_scope_allows() {
        let scope = WatchScope::new(set(&["team-a", "team-b"]), Some("team-a".into())).unwrap();
        assert!(scope.allows("team-a"));
        assert!(!scope.allows("team-b"), "outside the watch namespace");
        assert!(!scope.allows("team-c"));
        let scope = WatchScope::new(set(&["team-a", "team-b"]), None).unwrap();
        assert!(scope.allows("team-b"));
        assert!(!scope.allows("team-c"));
        assert_eq!(scope.watch_namespace(), None);
    }
}
