//! Rules shared by the tests that compare a received tree with the manifest
//! of the source snapshot (the stock `btrfs receive` in `tests/integration/
//! live.rs`, `btrsend receive` in `tests/integration/receive.rs`): one place,
//! so both receivers are held to the same exemptions.
//!
//! # Directory mtimes after orphan names
//!
//! In an incremental stream the kernel creates new inodes at orphan names
//! (`o<ino>-<gen>-<n>`) in some directory, often the root, and renames them
//! into place, but sends no UTIMES for that directory when the directory did
//! not change in the source: any receiver leaves it with the time of the
//! receive (observed in `tests/fixtures/007-reflinks`, root of `r2`). The
//! mtime of exactly those directories — orphans made in them, no UTIMES of
//! them anywhere in the stream — cannot be restored from the stream:
//! [`orphan_dirs_without_utimes`] finds them, [`exempt_mtimes`] takes their
//! expected mtime over before comparing.
//!
//! # Data maps
//!
//! [`data_ranges`] reads the `data=` fields of a manifest (see
//! [`crate::manifest`]), [`data_within`] checks that one map's data lies
//! inside another's (a receiver may turn a hole into zeros where the stream
//! writes zeros, never drop data).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

use stream_format::{Command, ReaderOptions, StreamReader};

use crate::manifest;

fn parent_of(p: &[u8]) -> &[u8] {
    p.iter()
        .rposition(|&b| b == b'/')
        .map_or(&[][..], |i| &p[..i])
}

fn manifest_path(p: &[u8]) -> String {
    if p.is_empty() {
        ".".to_owned()
    } else {
        manifest::escape(p)
    }
}

/// The directories (as manifest paths: `.` for the root) in which `stream`
/// creates orphan-named inodes but which it never sends a UTIMES for (see
/// the module doc). Reads every concatenated stream in the input; paths are
/// relative to the received subvolume, as in the stream.
///
/// # Errors
///
/// The stream cannot be decoded (its error names the offset and command).
pub fn orphan_dirs_without_utimes(
    stream: impl Read,
) -> Result<Vec<String>, stream_format::DecodeError> {
    let mut reader = StreamReader::with_options(stream, ReaderOptions::new().with_max_version(3));
    let mut orphan_dirs: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut utimes: BTreeSet<Vec<u8>> = BTreeSet::new();
    while let Some((_, cmd)) = reader.next_command()? {
        match &cmd {
            Command::Mkfile { path, .. }
            | Command::Mkdir { path, .. }
            | Command::Mknod { path, .. }
            | Command::Mkfifo { path, .. }
            | Command::Mksock { path, .. }
            | Command::Symlink { path, .. } => {
                let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
                if stream_format::parse_orphan_name(name).is_some() {
                    orphan_dirs.insert(parent_of(path).to_vec());
                }
            }
            Command::Utimes { path, .. } => {
                utimes.insert(path.to_vec());
            }
            _ => {}
        }
    }
    Ok(orphan_dirs
        .difference(&utimes)
        .map(|p| manifest_path(p))
        .collect())
}

/// The value of `key=` on the manifest line of `path`, if any.
pub fn field<'a>(manifest: &'a str, path: &str, key: &str) -> Option<&'a str> {
    let line = manifest
        .lines()
        .find(|l| l.split(' ').next() == Some(path))?;
    line.split(' ')
        .skip(2)
        .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
}

/// `got` with the mtime of each of `paths` replaced by `expected`'s (paths
/// missing from either side are left alone, so the comparison still sees
/// them).
pub fn exempt_mtimes(expected: &str, got: &str, paths: &[String]) -> String {
    let mut out = String::with_capacity(got.len());
    for line in got.lines() {
        let p = line.split(' ').next().unwrap_or("");
        let want = if paths.iter().any(|x| x == p) {
            field(expected, p, "mtime")
        } else {
            None
        };
        match want {
            Some(want) => {
                let fields: Vec<String> = line
                    .split(' ')
                    .map(|f| {
                        if f.starts_with("mtime=") {
                            format!("mtime={want}")
                        } else {
                            f.to_owned()
                        }
                    })
                    .collect();
                out.push_str(&fields.join(" "));
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Data ranges `(start, end)` per file path, from the `data=` fields of a
/// manifest made with `holes` (files without the field are left out).
pub fn data_ranges(m: &str) -> BTreeMap<String, Vec<(u64, u64)>> {
    let mut out = BTreeMap::new();
    for l in m.lines() {
        let Some(p) = l.split(' ').next() else {
            continue;
        };
        let Some(d) = l.split(' ').skip(2).find_map(|f| f.strip_prefix("data=")) else {
            continue;
        };
        let ranges = if d == "-" {
            Vec::new()
        } else {
            d.split(',')
                .filter_map(|r| {
                    let (o, n) = r.split_once('+')?;
                    let o: u64 = o.parse().ok()?;
                    Some((o, o.saturating_add(n.parse().ok()?)))
                })
                .collect()
        };
        out.insert(p.to_owned(), ranges);
    }
    out
}

/// Every data range of every file of `inner` lies inside a data range of the
/// same file in `outer`.
///
/// # Errors
///
/// The first file and range that does not, or a file without a data map in
/// `outer`.
pub fn data_within(inner: &str, outer: &str) -> Result<(), String> {
    let (ri, ro) = (data_ranges(inner), data_ranges(outer));
    for (p, list) in &ri {
        let other = ro.get(p).ok_or_else(|| format!("{p}: no data map"))?;
        for &(s, e) in list {
            if !other.iter().any(|&(os, oe)| os <= s && e <= oe) {
                return Err(format!("{p}: data {s}..{e} is a hole in the other map"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use stream_format::{StreamWriter, Timespec};

    #[test]
    fn orphan_dirs_from_a_stream() {
        let t = Timespec { sec: 1, nsec: 2 };
        let utimes = |p: &'static [u8]| Command::Utimes {
            path: p.into(),
            atime: t,
            mtime: t,
            ctime: t,
            otime: None,
        };
        let mut w = StreamWriter::new(Vec::new(), 1).unwrap();
        for c in [
            Command::Snapshot {
                path: b"s".as_slice().into(),
                uuid: [1; 16],
                ctransid: 2,
                clone_uuid: [3; 16],
                clone_ctransid: 1,
            },
            Command::Mkfile {
                path: b"o260-5-0".as_slice().into(),
                ino: 260,
            },
            Command::Mkdir {
                path: b"d/o261-5-0".as_slice().into(),
                ino: 261,
            },
            Command::Mkdir {
                path: b"e/o262-5-0".as_slice().into(),
                ino: 262,
            },
            Command::Mkfile {
                path: b"f/plain".as_slice().into(),
                ino: 263,
            },
            utimes(b"d"),
        ] {
            w.write(&c).unwrap();
        }
        let bytes = w.finish().unwrap();
        let dirs = orphan_dirs_without_utimes(bytes.as_slice()).unwrap();
        assert_eq!(dirs, vec![".".to_owned(), "e".to_owned()]);
    }

    #[test]
    fn mtimes_and_data_maps() {
        let want = ". dir mode=0755 mtime=1.000000000\nf file size=9 mtime=2.0 data=0+4,6+3\n";
        let got = ". dir mode=0755 mtime=9.000000000\nf file size=9 mtime=2.0 data=0+9\n";
        let fixed = exempt_mtimes(want, got, &[".".to_owned()]);
        assert_eq!(field(&fixed, ".", "mtime"), Some("1.000000000"));
        assert_eq!(field(&fixed, "f", "data"), Some("0+9"));
        assert_eq!(data_ranges(want)["f"], vec![(0, 4), (6, 9)]);
        assert_eq!(data_within(want, got), Ok(()));
        assert!(data_within(got, want).unwrap_err().contains("f: data 0..9"));
        assert_eq!(
            data_ranges("g file data=-\n")["g"],
            Vec::<(u64, u64)>::new()
        );
    }
}
