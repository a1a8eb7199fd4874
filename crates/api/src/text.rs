//! Bounding text that comes from users or from other controllers (Flux and Velero messages
//! may hold any UTF-8), without ever cutting a character in two.
//!
//! The one home of the message cuts every crate uses (condition messages, Event notes,
//! annotations, status-channel events, child names). It lives here, in the lowest crate of
//! the workspace, rather than in `controller-kit`, because the pure crates (`operations`,
//! `protocol`) need it too and must not depend on controller-kit's runtime (tokio, axum,
//! OpenTelemetry); like the rest of this crate it is a pure function of its input.

/// The longest prefix of `text` that is at most `max_bytes` long and ends on a character
/// boundary. `String::truncate` panics when the cut falls inside a character; this does not.
pub fn prefix_within(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// The first `max_chars` characters (Unicode scalar values) of `text`: the unit the API
/// server's `maxLength` counts in a CRD schema.
pub fn prefix_chars(text: &str, max_chars: usize) -> &str {
    match text.char_indices().nth(max_chars) {
        Some((index, _)) => text.get(..index).unwrap_or_default(),
        None => text,
    }
}

/// `text` as is when it fits in `max_bytes`, else its [`prefix_within`] `max_bytes` followed
/// by `…`, so a reader sees that it was cut. The result may be up to three bytes (the
/// ellipsis) longer than `max_bytes`.
pub fn cut_with_ellipsis(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_owned();
    }
    format!("{}…", prefix_within(text, max_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_within_cuts_only_on_character_boundaries() {
        // "é" is two bytes, "€" three and "🙂" four: a cut inside them backs off to the
        // character's start.
        let cases: [(&str, usize, &str); 10] = [
            ("hello", 10, "hello"),
            ("hello", 5, "hello"),
            ("hello", 3, "hel"),
            ("", 0, ""),
            ("abc", 0, ""),
            ("aé", 2, "a"),
            ("aé", 3, "aé"),
            ("ab🙂", 5, "ab"),
            ("🙂", 3, ""),
            ("héllo", 2, "h"),
        ];
        for (text, max, expected) in cases {
            assert_eq!(prefix_within(text, max), expected, "{text:?} within {max}");
        }
        let long = "€".repeat(400); // 1,200 bytes; byte 1,000 falls inside a character
        let cut = prefix_within(&long, 1000);
        assert_eq!(cut.len(), 999);
        assert!(cut.chars().all(|c| c == '€'));
    }

    #[test]
    fn prefix_chars_counts_characters_not_bytes() {
        let cases: [(&str, usize, &str); 7] = [
            ("hello", 10, "hello"),
            ("hello", 5, "hello"),
            ("hello", 2, "he"),
            ("", 3, ""),
            ("éé🙂x", 3, "éé🙂"),
            ("éé🙂x", 0, ""),
            ("€€€", 2, "€€"),
        ];
        for (text, max, expected) in cases {
            assert_eq!(prefix_chars(text, max), expected, "{text:?} to {max}");
        }
        let long = "é".repeat(40_000);
        assert_eq!(prefix_chars(&long, 32_768).chars().count(), 32_768);
    }

    #[test]
    fn cut_with_ellipsis_marks_only_a_real_cut() {
        let cases: [(&str, usize, &str); 6] = [
            ("hello", 10, "hello"),
            ("hello", 5, "hello"),
            ("hello", 4, "hell…"),
            ("aé", 2, "a…"),
            ("ab🙂c", 5, "ab…"),
            ("🙂", 2, "…"),
        ];
        for (text, max, expected) in cases {
            assert_eq!(cut_with_ellipsis(text, max), expected, "{text:?} within {max}");
        }
        let long = "é".repeat(5000); // 10,000 bytes
        let cut = cut_with_ellipsis(&long, 4096);
        assert!(cut.ends_with('…'));
        assert_eq!(cut.len(), 4096 + '…'.len_utf8());
    }
}
