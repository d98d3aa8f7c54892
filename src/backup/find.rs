//! Which stored snapshot a user means: the `SNAPSHOT` of `backup restore`.
//!
//! Pure: it reads catalog entries and a time zone, nothing else, and never
//! touches the store. The forms, tried in this order (the first that
//! matches anything decides):
//!
//! 1. an entry id (`7`);
//! 2. a UUID, the snapshot's as its stream carries it;
//! 3. the path as stored (`snaps/home.2026-11-20T030000Z`);
//! 4. `latest`: the newest entry, when the repository holds one origin;
//! 5. a base name (`home`): the newest entry whose path's last name is
//!    `home`, or `home` followed by a `.` and a date (the names `backup run
//!    --snapshot`, btrbk and snapper-style scripts give);
//! 6. a date/time prefix (`2026-11-20`, `2026-11-20T03`, `2026-11-20
//!    03:00`): the newest entry whose time, in the local time zone or in
//!    UTC, begins so;
//! 7. a prefix of the path's last name (`home.2026-11-2`) or of the path
//!    (`snaps/home.2026-11-2`).
//!
//! Each form picks the newest match (greatest ctransid, then id). Forms 4
//! to 7 refuse to choose between origins: when the matches belong to
//! several, the error lists each origin's newest match. When nothing
//! matches, the error names the nearest stored snapshots. Entries come
//! from a catalog someone else may have written: nothing here indexes by
//! their values or trusts their shape; texts are returned for the caller
//! to escape.

use std::collections::BTreeMap;

use jiff::tz::TimeZone;

use super::Entry;

/// Why no entry was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FindError {
    /// Nothing matches; the nearest entries (path, id), best first.
    NoMatch(Vec<(String, u64)>),
    /// Matches in several origins; each origin's newest (path, id).
    Ambiguous(Vec<(String, u64)>),
}

/// How many near candidates a failed look-up names.
const NEAREST: usize = 5;

/// The entry `spec` names in `entries` (see the module docs), with times
/// read in `tz`.
///
/// # Errors
///
/// [`FindError`] when nothing, or more than one origin, matches.
pub fn find<'e>(entries: &'e [Entry], spec: &str, tz: &TimeZone) -> Result<&'e Entry, FindError> {
    if !spec.is_empty()
        && spec.bytes().all(|b| b.is_ascii_digit())
        && let Some(e) = spec
            .parse::<u64>()
            .ok()
            .and_then(|id| entries.iter().find(|e| e.id == id))
    {
        return Ok(e);
    }
    if let Some(e) = newest(entries.iter().filter(|e| e.uuid.eq_ignore_ascii_case(spec))) {
        return Ok(e);
    }
    let want = spec.trim_matches('/');
    if let Some(e) = newest(entries.iter().filter(|e| e.path == want)) {
        return Ok(e);
    }
    let forms: [&dyn Fn(&Entry) -> bool; 4] = [
        &|_| spec == "latest",
        &|e| {
            let name = last_name(&e.path);
            let base = base_name(name);
            base == want
                || e.path
                    .strip_suffix(name)
                    .is_some_and(|dir| format!("{dir}{base}") == want)
        },
        &|e| is_time_prefix(want) && time_begins(e, want, tz),
        &|e| !want.is_empty() && (last_name(&e.path).starts_with(want) || e.path.starts_with(want)),
    ];
    for form in forms {
        let matches: Vec<&Entry> = entries.iter().filter(|e| form(e)).collect();
        if matches.is_empty() {
            continue;
        }
        let mut by_origin: BTreeMap<&str, &Entry> = BTreeMap::new();
        for e in matches {
            let slot = by_origin.entry(e.origin.as_str()).or_insert(e);
            if key(e) > key(slot) {
                *slot = e;
            }
        }
        if by_origin.len() == 1 {
            return by_origin
                .into_values()
                .next()
                .ok_or(FindError::NoMatch(Vec::new()));
        }
        let mut each: Vec<&Entry> = by_origin.into_values().collect();
        each.sort_by_key(|e| std::cmp::Reverse(key(e)));
        return Err(FindError::Ambiguous(
            each.into_iter().map(|e| (e.path.clone(), e.id)).collect(),
        ));
    }
    Err(FindError::NoMatch(nearest(entries, want)))
}

fn key(e: &Entry) -> (u64, u64) {
    (e.ctransid, e.id)
}

fn newest<'e>(it: impl Iterator<Item = &'e Entry>) -> Option<&'e Entry> {
    it.max_by_key(|e| key(e))
}

/// The last name of a path.
fn last_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A snapshot name without its date: `home` of `home.2026-11-20T030000Z`,
/// `home.20261120T0300` or `home.2026-11-20T030000Z_1`; the name itself
/// when it has none.
pub fn base_name(name: &str) -> &str {
    for (i, _) in name.match_indices('.') {
        let rest = &name.as_bytes()[i + 1..];
        if i > 0 && rest.len() >= 4 && rest[..4].iter().all(u8::is_ascii_digit) {
            return &name[..i];
        }
    }
    name
}

/// `2026`, `2026-11`, `2026-11-20`, `2026-11-20T03`, `2026-11-20 03:00`…:
/// digits in the places of `YYYY-MM-DDTHH:MM:SS`, with `T` or a space
/// between date and time.
fn is_time_prefix(s: &str) -> bool {
    const SHAPE: &[u8] = b"dddd-dd-ddTdd:dd:dd";
    s.len() >= 4
        && s.len() <= SHAPE.len()
        && s.bytes().zip(SHAPE).all(|(c, &p)| match p {
            b'd' => c.is_ascii_digit(),
            b'T' => c == b'T' || c == b' ',
            p => c == p,
        })
}

/// Whether the entry's time, in `tz` or in UTC, begins with `prefix` (a
/// space and a `T` between date and time are the same).
fn time_begins(e: &Entry, prefix: &str, tz: &TimeZone) -> bool {
    let Ok(t) = e.time.parse::<jiff::Timestamp>() else {
        return false;
    };
    let want = prefix.replace(' ', "T");
    [tz.clone(), TimeZone::UTC].iter().any(|z| {
        t.to_zoned(z.clone())
            .strftime("%Y-%m-%dT%H:%M:%S")
            .to_string()
            .starts_with(&want)
    })
}

/// The entries whose last name is nearest `want`: the longest common
/// prefix first, then the fewest edits, then the newest.
fn nearest(entries: &[Entry], want: &str) -> Vec<(String, u64)> {
    let score = |e: &Entry| {
        let name = last_name(&e.path);
        let common = name
            .chars()
            .zip(want.chars())
            .take_while(|(a, b)| a == b)
            .count();
        (
            std::cmp::Reverse(common),
            edits(name, want),
            std::cmp::Reverse(key(e)),
        )
    };
    let mut scored: Vec<&Entry> = entries.iter().collect();
    scored.sort_by_cached_key(|e| score(e));
    scored
        .into_iter()
        .take(NEAREST)
        .map(|e| (e.path.clone(), e.id))
        .collect()
}

/// Levenshtein distance, over at most the first 256 characters of each
/// (names are short; a hostile catalog's long ones cost no more).
fn edits(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().take(256).collect();
    let b: Vec<char> = b.chars().take(256).collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == cb {
                prev
            } else {
                1 + prev.min(cur).min(row[j])
            };
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::Kind;

    fn e(id: u64, path: &str, origin: &str, time: &str) -> Entry {
        Entry {
            id,
            path: path.into(),
            uuid: format!("00000000-0000-0000-0000-{id:012}"),
            ctransid: id * 10,
            parent_uuid: None,
            parent_ctransid: None,
            parent_id: None,
            kind: Kind::Full,
            time: time.into(),
            origin: origin.into(),
            file: format!("streams/{id}.btrs.zst"),
            stream_bytes: 1,
            stored_bytes: 1,
            stream_blake3: String::new(),
            commands: 1,
            proto: 1,
            stored_at: time.into(),
            synthesized_from: None,
        }
    }

    fn repo() -> Vec<Entry> {
        vec![
            e(
                1,
                "snaps/home.2026-11-19T030000Z",
                "H",
                "2026-11-19T03:00:00Z",
            ),
            e(
                2,
                "snaps/root.2026-11-19T030000Z",
                "R",
                "2026-11-19T03:00:05Z",
            ),
            e(
                3,
                "snaps/home.2026-11-20T030000Z",
                "H",
                "2026-11-20T03:00:00Z",
            ),
            e(
                4,
                "snaps/home.2026-11-20T030000Z_1",
                "H",
                "2026-11-20T03:00:00Z",
            ),
            e(
                5,
                "snaps/root.2026-11-20T230000Z",
                "R",
                "2026-11-20T23:00:00Z",
            ),
        ]
    }

    fn id(r: Result<&Entry, FindError>) -> Result<u64, FindError> {
        r.map(|e| e.id)
    }

    #[test]
    fn ids_uuids_and_paths() {
        let r = repo();
        let tz = TimeZone::UTC;
        assert_eq!(id(find(&r, "2", &tz)), Ok(2));
        assert_eq!(
            id(find(&r, "00000000-0000-0000-0000-000000000003", &tz)),
            Ok(3)
        );
        assert_eq!(id(find(&r, "/snaps/home.2026-11-19T030000Z", &tz)), Ok(1));
    }

    #[test]
    fn latest_and_base_names_per_origin() {
        let r = repo();
        let tz = TimeZone::UTC;
        assert_eq!(
            find(&r, "latest", &tz),
            Err(FindError::Ambiguous(vec![
                ("snaps/root.2026-11-20T230000Z".into(), 5),
                ("snaps/home.2026-11-20T030000Z_1".into(), 4),
            ]))
        );
        assert_eq!(id(find(&r[..1], "latest", &tz)), Ok(1));
        assert_eq!(id(find(&r, "home", &tz)), Ok(4));
        assert_eq!(id(find(&r, "root", &tz)), Ok(5));
        assert_eq!(id(find(&r, "snaps/root", &tz)), Ok(5));
        assert_eq!(base_name("home.20261120T0300"), "home");
        assert_eq!(base_name("v1.2"), "v1.2");
        assert_eq!(base_name(".2026"), ".2026");
    }

    #[test]
    fn time_prefixes_in_the_local_zone_or_utc() {
        let r = repo();
        let tz = TimeZone::UTC;
        // Both origins on the 19th: ambiguous; the 20th at 23h is root's.
        assert!(matches!(
            find(&r, "2026-11-19", &tz),
            Err(FindError::Ambiguous(_))
        ));
        assert_eq!(id(find(&r, "2026-11-20T23", &tz)), Ok(5));
        assert_eq!(id(find(&r, "2026-11-20 03:00", &tz)), Ok(4));
        // 23:00 UTC is the 21st in Berlin: found by the local date too.
        let berlin = TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        assert_eq!(id(find(&r, "2026-11-21", &berlin)), Ok(5));
        assert!(matches!(
            find(&r, "2026-11-21", &tz),
            Err(FindError::NoMatch(_))
        ));
    }

    #[test]
    fn name_prefixes_and_the_nearest_when_nothing_matches() {
        let r = repo();
        let tz = TimeZone::UTC;
        assert_eq!(id(find(&r, "root.2026-11-2", &tz)), Ok(5));
        let Err(FindError::NoMatch(near)) = find(&r, "home.2026-12-01", &tz) else {
            panic!("expected no match");
        };
        assert_eq!(near.len(), 3 + 2);
        assert!(near[..3].iter().all(|(p, _)| p.contains("/home.2026-11-")));
        assert_eq!(
            find(&[], "latest", &tz),
            Err(FindError::NoMatch(Vec::new()))
        );
    }
}
