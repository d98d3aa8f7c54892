//! Shell-style patterns on a snapshot's paths, with restic's rules (what
//! `backup find` and `restore --include` take).
//!
//! A pattern without `/` matches a name at any depth; one with `/` is
//! anchored at the snapshot's root (a leading `/` is optional). `*` and
//! `?` match within one name, `[...]` one byte of a set (`[!...]` or
//! `[^...]` its complement, `a-z` ranges), `\` quotes the next byte, and
//! a whole component `**` any number of names (zero included). Paths are
//! bytes: nothing here assumes UTF-8.

/// A pattern that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("pattern {pattern:?}: {reason}")]
pub struct GlobError {
    /// The pattern, as text (bytes that are not UTF-8 as U+FFFD).
    pub pattern: String,
    /// What is wrong.
    pub reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Byte(u8),
    Any,
    Star,
    Class {
        negated: bool,
        ranges: Vec<(u8, u8)>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Comp {
    /// `**`: any number of names.
    Deep,
    Name(Vec<Tok>),
}

/// One compiled pattern.
#[derive(Debug, Clone)]
pub struct Glob {
    anchored: bool,
    comps: Vec<Comp>,
}

impl Glob {
    /// Compile `pattern`.
    ///
    /// # Errors
    ///
    /// An empty pattern, an unclosed `[`, or a trailing `\`.
    pub fn new(pattern: &[u8]) -> Result<Glob, GlobError> {
        let err = |reason| GlobError {
            pattern: String::from_utf8_lossy(pattern).into_owned(),
            reason,
        };
        let anchored = pattern.contains(&b'/');
        let trimmed = trim_slashes(pattern);
        if trimmed.is_empty() {
            return Err(err("empty"));
        }
        let mut comps = Vec::new();
        for c in trimmed.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
            if c == b"**" {
                if comps.last() != Some(&Comp::Deep) {
                    comps.push(Comp::Deep);
                }
                continue;
            }
            comps.push(Comp::Name(parse_name(c).map_err(err)?));
        }
        Ok(Glob { anchored, comps })
    }

    /// Whether `path` (from the snapshot's root, `/`-separated, with or
    /// without a leading `/`) matches.
    pub fn is_match(&self, path: &[u8]) -> bool {
        let names: Vec<&[u8]> = split(path);
        if !self.anchored {
            return match (names.last(), self.comps.as_slice()) {
                (Some(n), [Comp::Name(t)]) => match_name(t, n),
                (Some(_), [Comp::Deep]) => true,
                _ => false,
            };
        }
        match_comps(&self.comps, &names)
    }

    /// Whether something below directory `dir` could match: false only
    /// when no path that starts with `dir` can (an anchored pattern that
    /// leads elsewhere).
    pub fn may_match_below(&self, dir: &[u8]) -> bool {
        if !self.anchored {
            return true;
        }
        prefix_ok(&self.comps, &split(dir))
    }
}

fn trim_slashes(p: &[u8]) -> &[u8] {
    let start = p.iter().position(|&b| b != b'/').unwrap_or(p.len());
    let end = p.iter().rposition(|&b| b != b'/').map_or(start, |e| e + 1);
    p.get(start..end).unwrap_or_default()
}

fn split(path: &[u8]) -> Vec<&[u8]> {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .collect()
}

fn parse_name(c: &[u8]) -> Result<Vec<Tok>, &'static str> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&b) = c.get(i) {
        i += 1;
        match b {
            b'*' => {
                if out.last() != Some(&Tok::Star) {
                    out.push(Tok::Star);
                }
            }
            b'?' => out.push(Tok::Any),
            b'\\' => {
                let &q = c.get(i).ok_or("ends with a lone \\")?;
                i += 1;
                out.push(Tok::Byte(q));
            }
            b'[' => {
                let mut negated = false;
                if matches!(c.get(i), Some(b'!' | b'^')) {
                    negated = true;
                    i += 1;
                }
                let mut ranges = Vec::new();
                let mut first = true;
                loop {
                    let &x = c.get(i).ok_or("unclosed [")?;
                    i += 1;
                    if x == b']' && !first {
                        break;
                    }
                    first = false;
                    let lo = if x == b'\\' {
                        let &q = c.get(i).ok_or("unclosed [")?;
                        i += 1;
                        q
                    } else {
                        x
                    };
                    if c.get(i) == Some(&b'-') && c.get(i + 1).is_some_and(|&y| y != b']') {
                        let mut hi = c[i + 1];
                        i += 2;
                        if hi == b'\\' {
                            hi = *c.get(i).ok_or("unclosed [")?;
                            i += 1;
                        }
                        ranges.push((lo, hi));
                    } else {
                        ranges.push((lo, lo));
                    }
                }
                out.push(Tok::Class { negated, ranges });
            }
            _ => out.push(Tok::Byte(b)),
        }
    }
    Ok(out)
}

fn tok_matches(t: &Tok, b: u8) -> bool {
    match t {
        Tok::Byte(x) => *x == b,
        Tok::Any => true,
        Tok::Star => false,
        Tok::Class { negated, ranges } => {
            ranges.iter().any(|&(lo, hi)| lo <= b && b <= hi) != *negated
        }
    }
}

/// One name against one component's tokens: the usual greedy match with
/// one backtrack point (the last `*`), linear in practice.
fn match_name(toks: &[Tok], name: &[u8]) -> bool {
    let (mut t, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match toks.get(t) {
            Some(Tok::Star) => {
                star = Some((t, n));
                t += 1;
            }
            Some(tok) if tok_matches(tok, name[n]) => {
                t += 1;
                n += 1;
            }
            _ => match star {
                Some((st, sn)) => {
                    t = st + 1;
                    n = sn + 1;
                    star = Some((st, sn + 1));
                }
                None => return false,
            },
        }
    }
    toks[t..].iter().all(|x| *x == Tok::Star)
}

fn match_comps(comps: &[Comp], names: &[&[u8]]) -> bool {
    match comps.split_first() {
        None => names.is_empty(),
        Some((Comp::Deep, rest)) => (0..=names.len()).any(|k| match_comps(rest, &names[k..])),
        Some((Comp::Name(t), rest)) => match names.split_first() {
            Some((n, more)) => match_name(t, n) && match_comps(rest, more),
            None => false,
        },
    }
}

/// Whether `names` can be the start of a path that matches `comps`.
fn prefix_ok(comps: &[Comp], names: &[&[u8]]) -> bool {
    match (comps.split_first(), names.split_first()) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some((Comp::Deep, _)), Some(_)) => true,
        (Some((Comp::Name(t), rest)), Some((n, more))) => match_name(t, n) && prefix_ok(rest, more),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, path: &str) -> bool {
        Glob::new(p.as_bytes()).unwrap().is_match(path.as_bytes())
    }

    #[test]
    fn a_name_matches_at_any_depth() {
        assert!(m("*.txt", "a.txt"));
        assert!(m("*.txt", "d/e/a.txt"));
        assert!(!m("*.txt", "a.txt/b"));
        assert!(m("a?c", "x/abc"));
        assert!(!m("a?c", "x/ac"));
        assert!(m("[a-c]x", "bx"));
        assert!(!m("[!a-c]x", "bx"));
        assert!(m("[^a-c]x", "dx"));
        assert!(m("\\*", "*"));
        assert!(!m("\\*", "a"));
        assert!(m("*", "anything/at/all"));
    }

    #[test]
    fn a_path_is_anchored_at_the_root() {
        assert!(m("/d/*.txt", "d/a.txt"));
        assert!(m("d/*.txt", "/d/a.txt"));
        assert!(!m("d/*.txt", "x/d/a.txt"));
        assert!(!m("d/*", "d/e/f"));
        assert!(m("d/**", "d/e/f"));
        assert!(m("d/**/f", "d/f"));
        assert!(m("d/**/f", "d/e/g/f"));
        assert!(m("**/f", "f"));
        assert!(!m("d/**/f", "d/e/g"));
    }

    #[test]
    fn bytes_that_are_not_utf8_match() {
        let g = Glob::new(b"\xff*").unwrap();
        assert!(g.is_match(b"d/\xff\xfe"));
        assert!(!g.is_match(b"d/\xfe"));
    }

    #[test]
    fn prefixes_prune_only_what_cannot_match() {
        let g = Glob::new(b"/d/e*/f").unwrap();
        assert!(g.may_match_below(b""));
        assert!(g.may_match_below(b"d"));
        assert!(g.may_match_below(b"d/ex"));
        assert!(!g.may_match_below(b"x"));
        assert!(!g.may_match_below(b"d/ex/f/g"));
        assert!(Glob::new(b"f").unwrap().may_match_below(b"x/y"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert_eq!(Glob::new(b"a[bc").unwrap_err().reason, "unclosed [");
        assert_eq!(Glob::new(b"a\\").unwrap_err().reason, "ends with a lone \\");
        assert_eq!(Glob::new(b"//").unwrap_err().reason, "empty");
    }
}
