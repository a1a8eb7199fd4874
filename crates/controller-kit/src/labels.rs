//! Label selectors given on the command line (`--watch-label-selector`), checked at start-up.
//!
//! A selector the API server rejects would make every list and watch fail with a `400` for
//! as long as the binary runs, so the flag is checked with Kubernetes' own rules first
//! (`k8s.io/apimachinery/pkg/labels`, `Parse`): requirements separated by commas, each
//! `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (v1,v2)` or
//! `key notin (v1,v2)`; keys are an optional DNS-subdomain prefix and `/` before a name of
//! at most 63 characters; values are at most 63 characters, possibly empty.
//!
//! [`LabelSelector`] keeps the text as given (the API server parses it again) and only
//! vouches that it parses.

use std::{fmt, str::FromStr};

/// Why a label selector was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelSelectorError {
    /// The whole selector was blank: that would select everything, which is the default
    /// without the flag.
    #[error("the label selector is empty; leave the flag unset to select every object")]
    Empty,
    /// One requirement (between commas) does not parse.
    #[error("label selector requirement {requirement:?}: {reason}")]
    Requirement {
        /// The requirement as written.
        requirement: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A label selector in Kubernetes' string syntax that parses by the API server's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSelector(String);

impl LabelSelector {
    /// The selector text, for `ListParams::labels` and `watcher::Config::labels`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for LabelSelector {
    type Err = LabelSelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        if text.is_empty() {
            return Err(LabelSelectorError::Empty);
        }
        for requirement in split_requirements(text) {
            check_requirement(requirement.trim()).map_err(|reason| LabelSelectorError::Requirement {
                requirement: requirement.trim().to_owned(),
                reason,
            })?;
        }
        Ok(Self(text.to_owned()))
    }
}

/// Splits at the commas that separate requirements, not those inside `( … )`.
fn split_requirements(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(text.get(start..i).unwrap_or_default());
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(text.get(start..).unwrap_or_default());
    parts
}

fn check_requirement(req: &str) -> Result<(), String> {
    if req.is_empty() {
        return Err("empty (two commas in a row, or a trailing comma)".into());
    }
    if let Some(key) = req.strip_prefix('!') {
        return check_key(key.trim());
    }
    for op in ["==", "!=", "="] {
        if let Some((key, value)) = req.split_once(op) {
            check_key(key.trim())?;
            return check_value(value.trim());
        }
    }
    for op in [" notin ", " in "] {
        if let Some((key, set)) = req.split_once(op) {
            check_key(key.trim())?;
            let inner = set
                .trim()
                .strip_prefix('(')
                .and_then(|s| s.strip_suffix(')'))
                .ok_or_else(|| format!("the values after {:?} must be in parentheses", op.trim()))?;
            if inner.trim().is_empty() {
                return Err(format!("{:?} needs at least one value", op.trim()));
            }
            return inner.split(',').try_for_each(|v| check_value(v.trim()));
        }
    }
    check_key(req)
}

fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let valid_label = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(valid_label) {
            return Err(format!("key prefix {prefix:?} is not a DNS subdomain"));
        }
    }
    if name.is_empty() {
        return Err("a key is missing".into());
    }
    check_name(name).map_err(|reason| format!("key {key:?}: {reason}"))
}

fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    check_name(value).map_err(|reason| format!("value {value:?}: {reason}"))
}

/// A label name or value: at most 63 of `[A-Za-z0-9._-]`, starting and ending alphanumeric.
fn check_name(name: &str) -> Result<(), String> {
    if name.len() > 63 {
        return Err("longer than 63 characters".into());
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err("only letters, digits, '-', '_' and '.' are allowed".into());
    }
    let alnum = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    if !alnum(name.bytes().next()) || !alnum(name.bytes().last()) {
        return Err("must start and end with a letter or digit".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_api_servers_syntax() {
        for ok in [
            "vworkspace.io/shard=b",
            "vworkspace.io/shard==b",
            "vworkspace.io/shard!=b",
            "!vworkspace.io/shard",
            "vworkspace.io/shard",
            "vworkspace.io/shard in (a, b)",
            "vworkspace.io/shard notin (a,b),team=x",
            "tier=",
            " env = prod ",
        ] {
            assert!(ok.parse::<LabelSelector>().is_ok(), "{ok}");
        }
    }

    #[test]
    fn refuses_what_the_api_server_would_with_the_requirement_named() {
        for (bad, says) in [
            ("", "empty"),
            ("a=b,,c=d", "two commas"),
            ("a=b,", "trailing comma"),
            ("shard=ä", "only letters"),
            ("-shard=b", "start and end"),
            ("Vworkspace.IO/shard=b", "DNS subdomain"),
            ("/shard=b", "DNS subdomain"),
            ("shard in a,b", "parentheses"),
            ("shard in ()", "at least one value"),
            ("=b", "key is missing"),
        ] {
            let err = bad.parse::<LabelSelector>().expect_err(bad).to_string();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
        let long = format!("shard={}", "x".repeat(64));
        assert!(long.parse::<LabelSelector>().is_err());
    }

    #[test]
    fn keeps_the_text_for_the_api_server() {
        let selector: LabelSelector = " vworkspace.io/shard notin (b) ".parse().expect("valid");
        assert_eq!(selector.as_str(), "vworkspace.io/shard notin (b)");
    }
}
