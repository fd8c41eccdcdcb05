//! Making text a plugin controls safe to show: in a daemon log line, in an API answer.
//!
//! A plugin decides the bytes of its `narad.log` lines, of its `narad_last_error` message, and
//! of the function names in a trap's backtrace. Written raw, a `\n` in them forges a separate
//! log line in the text format, a NUL or an escape sequence reaches the operator's terminal,
//! and a 4 KiB message fills the children listing. [`sanitize`] is the one place that turns such
//! text into something safe to show: every control character is written as an escape, and the
//! result is cut to a byte budget with a marker saying how much was left out.
//!
//! What is escaped: the C0 controls (U+0000 to U+001F), DEL, the C1 controls (U+0080 to
//! U+009F), the line and paragraph separators U+2028 and U+2029 (line breaks for some log
//! viewers), and the bidirectional formatting characters (U+200E, U+200F, U+202A to U+202E,
//! U+2066 to U+2069), which can make a line read differently from what it holds. `\n`, `\r`,
//! `\t` and NUL become `\n`, `\r`, `\t` and `\0`; every other one becomes `\u{…}` in hex. All
//! other text, including non-ASCII letters, is kept as it is.
//!
//! A backslash is kept as it is, so the output of [`sanitize`] sanitizes to itself (the daemon
//! may sanitize a message made of already sanitized parts). The price: a `\n` in the output may
//! also be two characters the plugin wrote; what is promised is that no control character
//! gets through, not that the escaping can be undone.

use std::fmt::Write as _;

/// Budget, in bytes of output, for one piece of plugin text (a log line, an error message, a
/// trap message): 512 bytes, a few lines of a terminal, enough for any useful error message,
/// small enough that a listing of many partitions stays readable.
pub const MAX_PLUGIN_TEXT_BYTES: usize = 512;

/// Longest cut marker [`sanitize`] appends, in bytes: `…(` and `)` plus
/// ` 18446744073709551615 more bytes` (the longest `usize` count) rounded up.
pub const CUT_MARKER_MAX_BYTES: usize = 40;

/// Whether `c` is written as an escape by [`sanitize`].
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// Appends the escape of `c` (which [`needs_escape`]) to `out`.
fn push_escape(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\0' => out.push_str("\\0"),
        other => {
            // Writing to a String cannot fail.
            let _ = write!(out, "\\u{{{:x}}}", u32::from(other));
        }
    }
}

/// `text` with every control character escaped (see the module docs), cut to at most
/// `max_bytes` bytes of escaped text. When something is cut, a marker
/// `…(N more bytes)` follows, N counting the bytes of `text` left out, so the result is at most
/// `max_bytes + CUT_MARKER_MAX_BYTES` bytes long. A cut never splits a character or an escape.
pub fn sanitize(text: &str, max_bytes: usize) -> String {
    sanitize_cut(text, 0, max_bytes)
}

/// [`sanitize`] for text of which `already_cut` more bytes were never read (a guest buffer
/// longer than the host reads): they count in the marker, which is shown even when `text`
/// itself fits.
pub fn sanitize_cut(text: &str, already_cut: usize, max_bytes: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_bytes) + 8);
    let mut piece = String::new();
    let mut shown_input = text.len();
    for (at, c) in text.char_indices() {
        piece.clear();
        if needs_escape(c) {
            push_escape(&mut piece, c);
        } else {
            piece.push(c);
        }
        if out.len() + piece.len() > max_bytes {
            shown_input = at;
            break;
        }
        out.push_str(&piece);
    }
    let cut = (text.len() - shown_input).saturating_add(already_cut);
    if cut > 0 {
        let _ = write!(out, "…({cut} more bytes)");
    }
    out
}

/// [`sanitize`] for bytes read from guest memory: invalid UTF-8 becomes U+FFFD first.
pub fn sanitize_bytes(bytes: &[u8], already_cut: usize, max_bytes: usize) -> String {
    sanitize_cut(&String::from_utf8_lossy(bytes), already_cut, max_bytes)
}

/// Longest part of a record key [`describe_key`] shows, in bytes.
pub const SHOWN_KEY_BYTES: usize = 64;

/// A record's key for a message: `key "text"` (escaped and cut to [`SHOWN_KEY_BYTES`]),
/// `key 0x..` (its first 32 bytes in hex, and its length) for bytes that are not UTF-8, or
/// `no key`.
pub fn describe_key(key: Option<&[u8]>) -> String {
    match key {
        None => "no key".to_owned(),
        Some(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => format!("key \"{}\"", sanitize(text, SHOWN_KEY_BYTES)),
            Err(_) => {
                let hex: String = bytes.iter().take(32).map(|b| format!("{b:02x}")).collect();
                let more = if bytes.len() > 32 { ".." } else { "" };
                format!("key 0x{hex}{more} ({} bytes)", bytes.len())
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_described_as_text_bytes_or_none() {
        assert_eq!(describe_key(Some(b"user-9")), "key \"user-9\"");
        assert_eq!(describe_key(None), "no key");
        assert_eq!(describe_key(Some(&[0xff, 0x00])), "key 0xff00 (2 bytes)");
        assert_eq!(describe_key(Some(b"a\nb")), "key \"a\\nb\"");
    }

    #[test]
    fn a_newline_or_a_nul_cannot_reach_the_output() {
        let shown = sanitize("a\nforged line\0\r\tend\u{1b}[31m", 512);
        assert_eq!(shown, "a\\nforged line\\0\\r\\tend\\u{1b}[31m");
        assert!(!shown.chars().any(char::is_control));
    }

    #[test]
    fn ordinary_text_and_non_ascii_letters_are_kept_as_they_are() {
        let text = "Zürich: ключ 東京 → partition 3 (C:\\path)";
        assert_eq!(sanitize(text, 512), text);
    }

    #[test]
    fn c1_controls_line_separators_and_bidi_overrides_are_escaped() {
        let shown = sanitize("x\u{85}y\u{2028}z\u{202E}w\u{7f}", 512);
        assert_eq!(shown, "x\\u{85}y\\u{2028}z\\u{202e}w\\u{7f}");
    }

    #[test]
    fn long_text_is_cut_to_the_budget_with_a_marker_saying_how_much_was_left_out() {
        let text = "e".repeat(4096);
        let shown = sanitize(&text, MAX_PLUGIN_TEXT_BYTES);
        assert!(shown.starts_with(&"e".repeat(MAX_PLUGIN_TEXT_BYTES)));
        assert!(shown.ends_with("…(3584 more bytes)"), "{shown}");
        assert!(shown.len() <= MAX_PLUGIN_TEXT_BYTES + CUT_MARKER_MAX_BYTES);
    }

    #[test]
    fn a_cut_never_splits_an_escape_or_a_character() {
        // 3 bytes of budget: "ab" fits, the 2-byte escape of \n does not.
        assert_eq!(sanitize("ab\ncd", 3), "ab…(3 more bytes)");
        // "é" is 2 bytes: with 3 bytes of budget only one fits whole.
        assert_eq!(sanitize("éé", 3), "é…(2 more bytes)");
    }

    #[test]
    fn sanitized_text_sanitizes_to_itself() {
        let once = sanitize("a\nb\\n\0", 512);
        assert_eq!(sanitize(&once, 512), once);
    }

    #[test]
    fn bytes_never_read_count_in_the_marker() {
        assert_eq!(sanitize_cut("abc", 10, 512), "abc…(10 more bytes)");
    }

    #[test]
    fn invalid_utf8_from_guest_memory_is_replaced_not_refused() {
        assert_eq!(sanitize_bytes(b"ok\xff\n", 0, 512), "ok\u{fffd}\\n");
    }
}
