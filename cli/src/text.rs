//! Text that came from a repository or a stream (snapshot paths, times,
//! keys, names inside streams), made safe for a terminal: someone else may
//! have written it, and a control character in it (an escape sequence)
//! could retitle the terminal, clear it, or forge lines. Everything
//! human-readable that shows such text goes through here; JSON output
//! escapes by itself.

use std::borrow::Cow;

/// Whether a character is a control character (C0, DEL, C1).
fn is_control(c: char) -> bool {
    c.is_control()
}

/// `s` with every control character written as `\n`, `\t`, `\r` or
/// `\xNN` / `\u{NNNN}`, and a backslash that starts such an escape kept
/// as it is (the text is for a person, not for parsing back).
pub fn printable(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

/// [`printable`], but line breaks stay (messages of several lines that
/// btrsend wrote itself).
pub fn printable_lines(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

fn escape(s: &str, keep_newlines: bool) -> Cow<'_, str> {
    let bad = |c: char| is_control(c) && !(keep_newlines && c == '\n');
    if !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !bad(c) {
            out.push(c);
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:04x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

/// Raw bytes (a path as a stream has it) with control bytes escaped as
/// `\xNN`; other bytes, invalid UTF-8 too, pass as they are.
pub fn printable_bytes(b: &[u8]) -> Cow<'_, [u8]> {
    if !b.iter().any(|&c| c < 0x20 || c == 0x7f) {
        return Cow::Borrowed(b);
    }
    let mut out = Vec::with_capacity(b.len() + 8);
    for &c in b {
        if c < 0x20 || c == 0x7f {
            out.extend_from_slice(format!("\\x{c:02x}").as_bytes());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("snaps/home.1"), "snaps/home.1");
        assert!(matches!(printable("plain"), Cow::Borrowed(_)));
        assert_eq!(
            printable("a\x1b]0;owned\x07b\x1b[2J\n\u{9b}c"),
            "a\\x1b]0;owned\\x07b\\x1b[2J\\n\\x9bc"
        );
        assert_eq!(printable_lines("one\ntwo\x1b"), "one\ntwo\\x1b");
        assert_eq!(&*printable_bytes(b"d/\x1b[31m\xff"), b"d/\\x1b[31m\xff");
    }
}
