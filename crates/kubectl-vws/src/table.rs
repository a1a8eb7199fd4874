//! Plain aligned columns, like kubectl's tables: headers in capitals, two spaces between
//! columns, no trailing blanks. Widths count characters, so any UTF-8 text lines up as
//! well as a terminal allows.

/// `text` safe to print on a terminal: every control character (C0, DEL, C1: escape
/// sequences that move the cursor, recolour, retitle the window or rewrite earlier lines) and
/// every bidirectional override or isolate (text shown in another order than it is) becomes a
/// space. Cells, reasons and messages come from charts, Flux and tenants.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}') {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// `rows` under `headers`, each column as wide as its widest cell; every cell
/// [`printable`].
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| printable(cell)).collect())
        .collect();
    let rows = rows.as_slice();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            let len = cell.chars().count();
            match widths.get_mut(i) {
                Some(w) => *w = (*w).max(len),
                None => widths.push(len),
            }
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            let width = widths.get(i).copied().unwrap_or(0);
            let pad = width.saturating_sub(cell.chars().count());
            line.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A cell for a value that may be absent: `-` when it is.
pub fn or_dash(value: Option<&str>) -> String {
    match value {
        Some(v) if !v.is_empty() => v.to_owned(),
        _ => "-".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_on_characters_not_bytes() {
        let rows = vec![
            vec!["wiki".to_owned(), "Prêt à l'emploi".to_owned(), "1".to_owned()],
            vec!["nextcloud-долго".to_owned(), "x".to_owned(), "22".to_owned()],
        ];
        let out = render(&["NAME", "MESSAGE", "N"], &rows);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "NAME             MESSAGE          N");
        assert_eq!(lines[1], "wiki             Prêt à l'emploi  1");
        assert_eq!(lines[2], "nextcloud-долго  x                22");
    }

    #[test]
    fn terminal_escapes_and_bidi_overrides_in_cells_are_not_printed() {
        let rows = vec![vec![
            "wiki".to_owned(),
            "6.2\u{1b}]0;owned\u{7}\u{1b}[2J\u{9b}31m".to_owned(),
            "ok\u{202E}gnp.exe".to_owned(),
        ]];
        let out = render(&["NAME", "APP VERSION", "REASON"], &rows);
        assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
        assert!(!out.contains('\u{202E}'));
        assert!(out.contains("6.2 ]0;owned  [2J 31m"), "{out:?}");
        assert_eq!(printable("Prêt à l'emploi"), "Prêt à l'emploi");
    }

    #[test]
    fn absent_or_empty_values_are_dashes() {
        assert_eq!(or_dash(None), "-");
        assert_eq!(or_dash(Some("")), "-");
        assert_eq!(or_dash(Some("6.2.0")), "6.2.0");
    }
}
