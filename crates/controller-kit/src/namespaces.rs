//! Which namespaces a binary may touch.
//!
//! The design promise is "never go beyond the namespaces it has been told it may
//! touch". [`NamespacePolicy`] is that list, parsed once at startup from
//! `--allowed-namespaces`; controllers check [`WatchScope::allows`] before acting on
//! an object and use [`NamespacePolicy`]'s `Display` in condition messages when they
//! refuse. `--watch-namespace` narrows the watch itself (namespaced RBAC), and must
//! lie inside the allow-list.

use std::{collections::BTreeSet, fmt, str::FromStr};

/// Why a namespace flag was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespaceError {
    /// The flag was empty; use `*` to allow all namespaces.
    #[error("the namespace list is empty; use \"*\" to allow all namespaces")]
    Empty,
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
    /// Whether objects in `namespace` may be read and written.
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
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
            Self::All => f.write_str("allowed namespaces: all"),
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
}

impl WatchScope {
    /// Combines the policy with an optional single watch namespace; a watch namespace
    /// outside the policy is a startup error rather than a silently empty watch.
    pub fn new(policy: NamespacePolicy, watch_namespace: Option<String>) -> Result<Self, NamespaceError> {
        if let Some(ns) = &watch_namespace {
            validate_namespace(ns)?;
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
        })
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
        self.watch_namespace.as_deref().is_none_or(|w| w == namespace) && self.policy.allows(namespace)
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
    fn display() {
        assert_eq!(
            set(&["team-b", "team-a"]).to_string(),
            "allowed namespaces: team-a, team-b"
        );
        assert_eq!(NamespacePolicy::All.to_string(), "allowed namespaces: all");
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
