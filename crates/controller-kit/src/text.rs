//! Bounding text that comes from users or from other controllers (Flux and Velero messages
//! may hold any UTF-8), without ever cutting a character in two.

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

#[cfg(test)]
mod tests {
    use super::prefix_within;

    #[test]
    fn cuts_only_on_character_boundaries() {
        assert_eq!(prefix_within("hello", 10), "hello");
        assert_eq!(prefix_within("hello", 3), "hel");
        assert_eq!(prefix_within("", 0), "");
        // "é" is two bytes and "🙂" four: a cut inside them backs off to the character's start.
        assert_eq!(prefix_within("aé", 2), "a");
        assert_eq!(prefix_within("ab🙂", 5), "ab");
        let long = "€".repeat(400); // 1,200 bytes; byte 1,000 falls inside a character
        let cut = prefix_within(&long, 1000);
        assert_eq!(cut.len(), 999);
        assert!(cut.chars().all(|c| c == '€'));
    }
}
