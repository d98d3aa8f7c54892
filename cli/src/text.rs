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

/// An error and its causes on one line, `what: why: why`, as `{:#}`
/// prints them, but never with an empty part or a dangling `: ` (a cause
/// whose message is empty, as some I/O and server errors have, is left
/// out; an error with no message at all says so).
pub fn error_text(err: &anyhow::Error) -> String {
    join_causes(err.chain().map(ToString::to_string))
}

/// [`error_text`] of a plain error and its sources.
pub fn error_text_of(err: &(dyn std::error::Error + 'static)) -> String {
    join_causes(std::iter::successors(Some(err), |e| e.source()).map(ToString::to_string))
}

fn join_causes(parts: impl Iterator<Item = String>) -> String {
    let mut out = String::new();
    for p in parts {
        let p = p.trim().trim_end_matches(':').trim_end();
        // A cause already spelled out in the text before it (an error that
        // prints its source too) is not repeated.
        if p.is_empty() || out.contains(p) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(p);
    }
    if out.is_empty() {
        out.push_str("failed, with no message from the failing part");
    }
    out
}

/// A byte count in IEC units (`1.50 GiB`, `512 B`), for people; JSON
/// keeps exact numbers.
pub fn iec(bytes: u64) -> String {
    indicatif::HumanBytes(bytes).to_string()
}

/// An RFC 3339 time in the local time zone (`TZ`), to the second, with the
/// zone's abbreviation: `2026-11-20 02:00:00 CET`. Text that is not a time
/// (a catalog someone else wrote) is shown escaped as it is.
pub fn local_time(rfc3339: &str) -> String {
    local_time_in(rfc3339, &jiff::tz::TimeZone::system())
}

fn local_time_in(rfc3339: &str, tz: &jiff::tz::TimeZone) -> String {
    match rfc3339.parse::<jiff::Timestamp>() {
        Ok(t) => t
            .to_zoned(tz.clone())
            .strftime("%Y-%m-%d %H:%M:%S %Z")
            .to_string(),
        Err(_) => printable(rfc3339).into_owned(),
    }
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

    #[test]
    fn error_lines_have_no_empty_parts() {
        let e = anyhow::Error::new(std::io::Error::other(""))
            .context("cannot read x: ")
            .context("run failed");
        assert_eq!(error_text(&e), "run failed: cannot read x");
        let e = anyhow::anyhow!("");
        assert_eq!(
            error_text(&e),
            "failed, with no message from the failing part"
        );
        let e = anyhow::Error::new(std::io::Error::other("disk full")).context("writing f");
        assert_eq!(error_text(&e), "writing f: disk full");
        assert_eq!(error_text_of(&std::io::Error::other("x: ")), "x");
    }

    #[test]
    fn sizes_and_times_for_people() {
        assert_eq!(iec(512), "512 B");
        assert_eq!(iec(3 << 29), "1.50 GiB");
        // A POSIX rule, so the test needs no tz database.
        let berlin = jiff::tz::TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        assert_eq!(
            local_time_in("2026-11-20T01:00:00Z", &berlin),
            "2026-11-20 02:00:00 CET"
        );
        assert_eq!(
            local_time_in("2026-07-20T01:00:00Z", &berlin),
            "2026-07-20 03:00:00 CEST"
        );
        assert_eq!(local_time_in("x\x1b[2J", &berlin), "x\\x1b[2J");
    }
}
