//! Hold records: the source snapshots that repositories storing from one
//! snapshot directory need as their next parents, so that one
//! repository's `--keep-snapshots` never deletes another's.
//!
//! Each repository that runs with `--snapshot … --snapshot-dir DIR`
//! writes, after storing, `DIR/.btrsend-holds/ID` (ID: the repository's
//! id, from its `config`): per subvolume, the newest snapshot in DIR that
//! the repository has stored, which its next incremental stream is based
//! on (btrbk keeps the latest common snapshot per target the same way).
//! Pruning reads every record there and never deletes a snapshot one
//! names ([`snapshots::prune_plan`](super::snapshots::prune_plan)).
//!
//! ```json
//! {"format":"btrsend-holds","version":1,"repository":"ID","repo":"/backup/home",
//!  "updated":"2026-11-24T03:00:09Z",
//!  "snapshots":[{"subvolume":"home","snapshot":"home.2026-11-24T030000Z"}]}
//! ```
//!
//! A record of a repository that no longer stores from DIR holds its
//! snapshot forever: deleting the file releases it, and pruning warns about
//! a record not updated for [`STALE_DAYS`] days. Two repositories with one
//! id (a repository directory copied) share one record, each overwriting
//! the other's.
//!
//! Anyone who can write DIR can write these files, so they are read as
//! hostile: opened beneath the directory without following symlinks, a
//! regular file of at most [`MAX_BYTES`], strict JSON, every name one path
//! component; a record that fails any check is ignored with a warning (its
//! snapshots may be pruned). A name in a record is only ever compared with
//! names listed in DIR, never opened.

use std::collections::BTreeSet;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use serde::{Deserialize, Serialize};

use super::BackupError;

/// The directory of hold records in a snapshot directory.
pub const HOLDS_DIR: &str = ".btrsend-holds";
/// The largest record read.
pub const MAX_BYTES: u64 = 64 * 1024;
/// The most snapshots one record may name.
const MAX_SNAPSHOTS: usize = 1024;
/// A record older than this is reported as possibly stale.
pub const STALE_DAYS: i64 = 30;
const FORMAT: &str = "btrsend-holds";
const VERSION: u32 = 1;

/// One held snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Held {
    /// The subvolume's base name (the snapshot names' prefix).
    pub subvolume: String,
    /// The snapshot's name in the snapshot directory.
    pub snapshot: String,
}

/// A hold record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// Always `btrsend-holds`.
    pub format: String,
    /// 1.
    pub version: u32,
    /// The repository's id (the file's name).
    pub repository: String,
    /// The repository as given to `--repo` (for people).
    pub repo: String,
    /// When the run that wrote it ended (RFC 3339).
    pub updated: String,
    /// The held snapshots.
    pub snapshots: Vec<Held>,
}

/// A record read from a snapshot directory.
#[derive(Debug, Clone)]
pub struct Found {
    /// Its file name.
    pub file: String,
    /// What it says.
    pub record: Record,
}

/// Whether `id` can name a record: 8 to 64 lowercase hex digits (what
/// `backup init` makes; a repository's config is hostile input too).
pub fn valid_id(id: &str) -> bool {
    (8..=64).contains(&id.len()) && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `name` is one path component that a snapshot can have.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0'])
}

impl Record {
    /// The checks beyond the JSON's shape (see the module docs).
    fn check(&self, file: &str) -> Result<(), String> {
        if self.format != FORMAT || self.version != VERSION {
            return Err(format!(
                "format {:?} version {} (this btrsend reads {FORMAT} version {VERSION})",
                self.format, self.version
            ));
        }
        if self.repository != file {
            return Err(format!(
                "it names repository {:?}, not its file name",
                self.repository
            ));
        }
        if self.snapshots.len() > MAX_SNAPSHOTS {
            return Err(format!("more than {MAX_SNAPSHOTS} snapshots"));
        }
        if self.updated.parse::<jiff::Timestamp>().is_err() {
            return Err(format!("unreadable time {:?}", self.updated));
        }
        for h in &self.snapshots {
            if !valid_name(&h.subvolume) || !valid_name(&h.snapshot) {
                return Err(format!(
                    "{:?} / {:?} is not a name in the snapshot directory",
                    h.subvolume, h.snapshot
                ));
            }
        }
        Ok(())
    }

    /// How long ago it was updated, in whole days (0 when unreadable or
    /// in the future).
    pub fn age_days(&self, now: jiff::Timestamp) -> i64 {
        self.updated
            .parse::<jiff::Timestamp>()
            .map_or(0, |t| now.duration_since(t).as_hours() / 24)
            .max(0)
    }
}

/// Parse and check a record's bytes (`file`: its file name).
///
/// # Errors
///
/// What is wrong, as text.
pub fn parse(file: &str, bytes: &[u8]) -> Result<Record, String> {
    if bytes.len() as u64 > MAX_BYTES {
        return Err(format!("larger than {MAX_BYTES} bytes"));
    }
    let r: Record = serde_json::from_slice(bytes).map_err(|e| format!("unreadable: {e}"))?;
    r.check(file)?;
    Ok(r)
}

fn io_error(what: String) -> impl FnOnce(rustix::io::Errno) -> BackupError {
    move |e| BackupError::Io {
        what,
        error: std::io::Error::from(e),
    }
}

/// `DIR/.btrsend-holds`, opened without following symlinks (`None` when
/// it does not exist and `create` is false).
fn open_holds(dir: &Path, create: bool) -> Result<Option<OwnedFd>, BackupError> {
    let d = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_error(format!(
        "cannot open the snapshot directory {}",
        dir.display()
    )))?;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let what = || format!("cannot open {}", dir.join(HOLDS_DIR).display());
    match rustix::fs::openat(&d, HOLDS_DIR, flags, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::NOENT) if create => {
            match rustix::fs::mkdirat(&d, HOLDS_DIR, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(io_error(what())(e)),
            }
            rustix::fs::openat(&d, HOLDS_DIR, flags, Mode::empty())
                .map(Some)
                .map_err(io_error(what()))
        }
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(io_error(what())(e)),
    }
}

/// Read one record beneath `holds` (a regular file, not a symlink, at
/// most [`MAX_BYTES`]).
fn read_one(holds: &OwnedFd, name: &str) -> Result<Record, String> {
    let fd = rustix::fs::openat(
        holds,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open it: {e}"))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| format!("cannot examine it: {e}"))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(String::from("not a regular file"));
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    parse(name, &bytes)
}

/// Every readable record in `dir`'s holds, and a warning for each file
/// that is not one (ignored: see the module docs).
///
/// # Errors
///
/// [`BackupError::Io`]: the holds directory exists but cannot be opened
/// or listed.
pub fn read_all(dir: &Path) -> Result<(Vec<Found>, Vec<String>), BackupError> {
    let Some(holds) = open_holds(dir, false)? else {
        return Ok((Vec::new(), Vec::new()));
    };
    let shown = dir.join(HOLDS_DIR);
    let list = rustix::fs::Dir::read_from(&holds)
        .map_err(io_error(format!("cannot list {}", shown.display())))?;
    let mut found = Vec::new();
    let mut warnings = Vec::new();
    for e in list {
        let e = e.map_err(io_error(format!("cannot list {}", shown.display())))?;
        let name = String::from_utf8_lossy(e.file_name().to_bytes()).into_owned();
        // `.`, `..`, and the temporary files of a record being written.
        if name.starts_with('.') {
            continue;
        }
        let why = if valid_id(&name) {
            match read_one(&holds, &name) {
                Ok(record) => {
                    found.push(Found { file: name, record });
                    continue;
                }
                Err(why) => why,
            }
        } else {
            String::from("not the name of a hold record (a repository id)")
        };
        warnings.push(format!(
            "ignoring {}: {why}; the snapshots it may hold can be deleted",
            shown.join(&name).display()
        ));
    }
    found.sort_by(|a, b| a.file.cmp(&b.file));
    Ok((found, warnings))
}

/// The snapshot names the `records` hold.
pub fn held_names(records: &[Found]) -> BTreeSet<String> {
    records
        .iter()
        .flat_map(|f| f.record.snapshots.iter().map(|h| h.snapshot.clone()))
        .collect()
}

/// Write the record of repository `id` (atomically: a temporary file
/// renamed over it), keeping what the existing one holds for subvolumes
/// other than those in `subvols`, and holding `held` for those.
///
/// # Errors
///
/// [`BackupError::Invalid`] for an id that cannot name a file;
/// [`BackupError::Io`].
pub fn write(
    dir: &Path,
    id: &str,
    repo: &str,
    subvols: &BTreeSet<String>,
    held: &[Held],
) -> Result<(), BackupError> {
    if !valid_id(id) {
        return Err(BackupError::Invalid(format!(
            "the repository id {id:?} cannot name a hold record in {}",
            dir.join(HOLDS_DIR).display()
        )));
    }
    let Some(holds) = open_holds(dir, true)? else {
        return Err(BackupError::Invalid(String::from("no holds directory")));
    };
    let path = dir.join(HOLDS_DIR).join(id);
    let mut snapshots: Vec<Held> = read_one(&holds, id)
        .map(|r| r.snapshots)
        .unwrap_or_default()
        .into_iter()
        .filter(|h| !subvols.contains(&h.subvolume))
        .collect();
    snapshots.extend(held.iter().filter(|h| valid_name(&h.snapshot)).cloned());
    snapshots.sort_by(|a, b| (&a.subvolume, &a.snapshot).cmp(&(&b.subvolume, &b.snapshot)));
    snapshots.truncate(MAX_SNAPSHOTS);
    let record = Record {
        format: String::from(FORMAT),
        version: VERSION,
        repository: id.to_owned(),
        repo: repo.to_owned(),
        updated: jiff::Timestamp::now().to_string(),
        snapshots,
    };
    let mut bytes = serde_json::to_vec_pretty(&record).unwrap_or_default();
    bytes.push(b'\n');
    let tmp = format!(
        ".{id}.tmp.{}.{:08x}",
        std::process::id(),
        super::store::random_u64() & 0xffff_ffff
    );
    let what = || format!("cannot write the hold record {}", path.display());
    let fd = rustix::fs::openat(
        &holds,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(io_error(what()))?;
    let mut f = std::fs::File::from(fd);
    let written = std::io::Write::write_all(&mut f, &bytes).and_then(|()| f.sync_all());
    if let Err(error) = written {
        let _ = rustix::fs::unlinkat(&holds, tmp.as_str(), rustix::fs::AtFlags::empty());
        return Err(BackupError::Io {
            what: what(),
            error,
        });
    }
    if let Err(e) = rustix::fs::renameat(&holds, tmp.as_str(), &holds, id) {
        let _ = rustix::fs::unlinkat(&holds, tmp.as_str(), rustix::fs::AtFlags::empty());
        return Err(io_error(what())(e));
    }
    let _ = rustix::fs::fsync(holds.as_fd());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef";

    fn good() -> String {
        format!(
            r#"{{"format":"btrsend-holds","version":1,"repository":"{ID}","repo":"/backup/home",
               "updated":"2026-11-24T03:00:09Z",
               "snapshots":[{{"subvolume":"home","snapshot":"home.2026-11-24T030000Z"}}]}}"#
        )
    }

    #[test]
    fn a_good_record_parses() {
        let r = parse(ID, good().as_bytes()).unwrap();
        assert_eq!(r.snapshots[0].snapshot, "home.2026-11-24T030000Z");
        let now: jiff::Timestamp = "2026-12-25T03:00:00Z".parse().unwrap();
        assert_eq!(r.age_days(now), 30);
    }

    #[test]
    fn hostile_records_are_refused() {
        let g = good();
        let cases: Vec<(String, &str)> = vec![
            (
                g.replace("home.2026-11-24T030000Z", "../../etc"),
                "not a name",
            ),
            (g.replace("home.2026-11-24T030000Z", "a/b"), "not a name"),
            (g.replace("home.2026-11-24T030000Z", ".."), "not a name"),
            (g.replace("home.2026-11-24T030000Z", ""), "not a name"),
            (
                g.replace(r#""subvolume":"home""#, r#""subvolume":"h\u0000""#),
                "not a name",
            ),
            (g.replace("\"version\":1", "\"version\":2"), "version 2"),
            (g.replace("btrsend-holds", "x"), "format"),
            (
                g.replace("\"repo\":", "\"extra\":1,\"repo\":"),
                "unknown field",
            ),
            (
                g.replace("2026-11-24T03:00:09Z", "yesterday"),
                "unreadable time",
            ),
            (g.replace(ID, "ffffffffffffffff"), "not its file name"),
            (g[..g.len() - 3].to_owned(), "unreadable"),
            (String::from("null"), "unreadable"),
        ];
        for (text, want) in cases {
            let e = parse(ID, text.as_bytes()).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
        let big = format!("{}{}", " ".repeat(MAX_BYTES as usize), g);
        assert!(parse(ID, big.as_bytes()).unwrap_err().contains("larger"));
    }

    #[test]
    fn ids_are_hex_names() {
        assert!(valid_id(ID));
        for bad in [
            "",
            "abc",
            "../x",
            "ABCDEF0123",
            ".0123456789",
            &"a".repeat(65),
        ] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn records_are_written_merged_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let held = |s: &str, n: &str| Held {
            subvolume: s.into(),
            snapshot: n.into(),
        };
        let one = |s: &str| BTreeSet::from([String::from(s)]);
        write(d, ID, "/r", &one("home"), &[held("home", "home.1")]).unwrap();
        write(d, ID, "/r", &one("var"), &[held("var", "var.1")]).unwrap();
        // home's entry stays when var's run writes; home's next run
        // replaces it.
        write(d, ID, "/r", &one("home"), &[held("home", "home.2")]).unwrap();
        // Garbage beside it: a symlink, a non-id name, a directory.
        std::os::unix::fs::symlink(d.join("elsewhere"), d.join(HOLDS_DIR).join("aaaaaaaa"))
            .unwrap();
        std::fs::write(d.join(HOLDS_DIR).join("notes.txt"), "x").unwrap();
        std::fs::create_dir(d.join(HOLDS_DIR).join("bbbbbbbb")).unwrap();
        let (found, warnings) = read_all(d).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(
            held_names(&found),
            BTreeSet::from([String::from("home.2"), String::from("var.1")])
        );
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings.iter().all(|w| w.starts_with("ignoring ")));
        // No temporary file is left.
        let left: Vec<_> = std::fs::read_dir(d.join(HOLDS_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(write(d, "../x", "/r", &one("home"), &[]).is_err());
    }
}
