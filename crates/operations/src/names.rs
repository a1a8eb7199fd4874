//! Deterministic names for the objects an Operation creates.
//!
//! A child's name is a pure function of the Operation, so an engine that
//! crashes between creating a child and recording it finds the same child on
//! restart instead of creating a second one. Names are DNS-1123 labels
//! (≤ 63 chars, `[a-z0-9-]`, alphanumeric at both ends), the strictest rule of
//! any object we create; a VolumeSnapshot, Job or Velero name also ends up in
//! label values, which share the 63-char limit.
//!
//! When the readable form would be too long or had to be altered (a `.` in an
//! Operation name), a stable hash of the exact input is appended, so two
//! different inputs never share a name. The hash is FNV-1a 64 (written out
//! here because `std`'s hasher is not guaranteed stable across Rust releases,
//! and a name must never change under an upgrade of the operator).

/// Longest DNS-1123 label, and longest label value.
pub const MAX_LEN: usize = 63;
/// Hex digits of the hash suffix (40 bits).
const HASH_LEN: usize = 10;
/// Longest readable prefix in front of `-<hash>`.
const PREFIX_LEN: usize = MAX_LEN - HASH_LEN - 1;

/// `input` as a DNS-1123 label: unchanged when it already is one, otherwise
/// lower-cased, every other character replaced by `-`, cut to fit, and
/// suffixed with a hash of the original.
pub fn dns_label(input: &str) -> String {
    if is_dns_label(input) {
        return input.to_owned();
    }
    hashed(&sanitize(input), input)
}

/// `<base>-<suffix>` as a DNS-1123 label, for a fixed suffix of ours (e.g.
/// `revisions`). Unambiguous without a hash because the suffix is a constant;
/// hashed only when too long or altered.
pub fn with_suffix(base: &str, suffix: &str) -> String {
    dns_label(&format!("{base}-{suffix}"))
}

/// A name combining two variable parts, `<first>-<second>-<hash>`, cut to fit.
///
/// The hash is always present: joined with `-`, two different pairs can spell
/// the same string (`team-a` + `prod-db` and `team-a-prod` + `db`), and the
/// Velero namespace holds the Backups of every tenant side by side.
pub fn pair(first: &str, second: &str) -> String {
    // `/` cannot occur in a Kubernetes name, so the hash input is unambiguous.
    hashed(&sanitize(&format!("{first}-{second}")), &format!("{first}/{second}"))
}

/// `value` as a label value (≤ 63 chars, alphanumeric at both ends,
/// `[-A-Za-z0-9_.]` inside): unchanged when valid, otherwise altered and
/// suffixed with a hash. Used for `requestId`, which may hold `:` and run to
/// 128 characters.
pub fn label_value(value: &str) -> String {
    if is_label_value(value) {
        return value.to_owned();
    }
    let cleaned: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let prefix = api::text::prefix_within(&cleaned, PREFIX_LEN);
    let prefix = prefix.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    join_hash(prefix, value)
}

/// Whether `s` is a DNS-1123 label.
pub fn is_dns_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_LEN
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Whether `s` is a valid label value (the empty string is).
pub fn is_label_value(s: &str) -> bool {
    let bytes = s.as_bytes();
    bytes.is_empty()
        || (bytes.len() <= MAX_LEN
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.last().is_some_and(u8::is_ascii_alphanumeric))
}

/// The stable short hash (10 lowercase hex digits) of `input`.
pub fn short_hash(input: &str) -> String {
    let full = format!("{:016x}", fnv1a64(input.as_bytes()));
    // Hex digits are ASCII: the prefix is always on a character boundary.
    api::text::prefix_within(&full, HASH_LEN).to_owned()
}

/// Lower-case, with every character outside `[a-z0-9-]` replaced by `-`.
fn sanitize(input: &str) -> String {
    input
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// `<sanitized prefix>-<hash of original>`, or just the hash when no prefix survives.
fn hashed(sanitized: &str, original: &str) -> String {
    let prefix = api::text::prefix_within(sanitized, PREFIX_LEN);
    let prefix = prefix.trim_matches('-');
    join_hash(prefix, original)
}

fn join_hash(prefix: &str, original: &str) -> String {
    let hash = short_hash(original);
    if prefix.is_empty() {
        hash
    } else {
        format!("{prefix}-{hash}")
    }
}

/// FNV-1a, 64 bits.
fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_reference_vectors() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(short_hash("foobar"), "85944171f7");
    }

    #[test]
    fn dns_label_table() {
        let long = "a".repeat(70);
        let cases: [(&str, Option<&str>); 5] = [
            ("nextcloud-backup", Some("nextcloud-backup")),
            ("a", Some("a")),
            (&long, None),
            ("db.backup", None),
            ("Upper", None),
        ];
        for (input, expected) in cases {
            let name = dns_label(input);
            assert!(is_dns_label(&name), "{input} -> {name}");
            match expected {
                Some(expected) => assert_eq!(name, expected),
                None => assert!(name.ends_with(&short_hash(input)), "{input} -> {name}"),
            }
        }
        assert_eq!(dns_label(&long).len(), MAX_LEN);
        assert_eq!(dns_label("db.backup"), format!("db-backup-{}", short_hash("db.backup")));
        // Lossy sanitization never merges two inputs.
        assert_ne!(dns_label("db.backup"), dns_label("db-backup"));
        // Nothing readable survives: just the hash.
        assert_eq!(dns_label("..."), short_hash("..."));
        assert_eq!(dns_label(""), short_hash(""));
    }

    #[test]
    fn with_suffix_table() {
        assert_eq!(with_suffix("nextcloud", "revisions"), "nextcloud-revisions");
        let long = "x".repeat(60);
        let name = with_suffix(&long, "revisions");
        assert_eq!(name.len(), MAX_LEN);
        assert!(is_dns_label(&name));
        assert!(name.starts_with(&"x".repeat(PREFIX_LEN)));
    }

    #[test]
    fn pair_is_unambiguous_and_stable() {
        let a = pair("team-a", "prod-db");
        let b = pair("team-a-prod", "db");
        assert_ne!(a, b);
        assert!(a.starts_with("team-a-prod-db-"));
        assert_eq!(a, pair("team-a", "prod-db"), "deterministic");
        assert_eq!(a, format!("team-a-prod-db-{}", short_hash("team-a/prod-db")));

        let cases = [
            ("team-a", "nextcloud-backup-20261201"),
            (&*"n".repeat(63), &*"o".repeat(63)),
            ("ns", "op.with.dots"),
            ("ns", "ends-with-dash-"),
        ];
        for (first, second) in cases {
            let name = pair(first, second);
            assert!(is_dns_label(&name), "{first}/{second} -> {name}");
            assert!(name.len() <= MAX_LEN);
        }
        // A cut that lands on '-' does not leave "--" before the hash.
        let cut = pair(&"a".repeat(51), "b");
        assert!(!cut.contains("--"), "{cut}");
    }

    #[test]
    fn label_value_table() {
        let long = "r".repeat(128);
        let cases: [(&str, Option<&str>); 6] = [
            ("odoo-op-4711", Some("odoo-op-4711")),
            ("Odoo_Op.1", Some("Odoo_Op.1")),
            ("", Some("")),
            ("odoo:op:4711", None),
            (&long, None),
            ("-x-", None),
        ];
        for (input, expected) in cases {
            let value = label_value(input);
            assert!(is_label_value(&value), "{input} -> {value}");
            match expected {
                Some(expected) => assert_eq!(value, expected),
                None => assert!(value.ends_with(&short_hash(input)), "{input} -> {value}"),
            }
        }
        assert_eq!(
            label_value("odoo:op:4711"),
            format!("odoo-op-4711-{}", short_hash("odoo:op:4711"))
        );
        assert_eq!(label_value(&long).len(), MAX_LEN);
    }

    #[test]
    fn validators() {
        for ok in ["a", "a-b", "0", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        for ok in ["", "a", "A.b_c-D", &"a".repeat(63)] {
            assert!(is_label_value(ok), "{ok}");
        }
        for bad in ["-a", "a.", "a:b", "a b", &"a".repeat(64)] {
            assert!(!is_label_value(bad), "{bad}");
        }
    }
}
