//! `backup run --snapshot SUBVOL --snapshot-dir DIR [--keep-snapshots N]`:
//! the source snapshots a nightly job takes and prunes itself.
//!
//! * **Taking**: a read-only snapshot `DIR/<name>.<UTC time>` of SUBVOL
//!   (the btrfs snapshot ioctl with the read-only flag, as `btrfs
//!   subvolume snapshot -r` does), where `<name>` is SUBVOL's last path
//!   component and the time is written `YYYY-MM-DDTHHMMSSZ` (no colons:
//!   the names travel through scp, rsync and other systems' file names).
//!   Names have one-second resolution: when the name exists (a second run
//!   within the same second), `_1`, `_2`, … up to `_`[`MAX_SEQ`] is
//!   appended, as btrbk does. Unless SUBVOL changed since the newest
//!   snapshot btrsend took of it in DIR ([`newest_taken`],
//!   [`plan::unchanged_since`](super::plan::unchanged_since)), no snapshot
//!   is taken: an unchanged subvolume needs none (btrbk's `snapshot_create
//!   onchange`).
//! * **Selecting**: the snapshots of SUBVOL found in DIR (any name) that
//!   are newer than the newest one stored are stored; older ones that are
//!   not stored (dropped by `backup forget`, or never meant to be stored)
//!   are left alone, so a forgotten entry is never stored again.
//! * **Pruning** ([`prune_plan`]): of the snapshots in DIR that btrsend
//!   took (named by the pattern above, of SUBVOL), the newest N stay; of
//!   the others, the newest stored one (the next incremental's parent)
//!   and every one newer than it that is not stored yet stay too; the rest
//!   are deleted (the snapshot-destroy ioctl, as `btrfs subvolume delete`
//!   does). A snapshot btrsend did not name is never deleted, nor one that
//!   a hold record names: the parent another repository storing from the
//!   same DIR needs ([`holds`](super::holds)).

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::BackupError;
use crate::sys;

/// The time in a snapshot's name: `2026-11-24T030000Z`.
const TIME_FORMAT: &str = "%Y-%m-%dT%H%M%SZ";

/// The highest suffix a snapshot name gets (`_99`): more snapshots of one
/// subvolume in one second are refused.
pub const MAX_SEQ: u32 = 99;

/// The name btrsend gives a snapshot of a subvolume called `base` taken
/// at `at`: `base.2026-11-24T030000Z`.
pub fn snapshot_name(base: &str, at: jiff::Timestamp) -> String {
    format!("{base}.{}", at.strftime(TIME_FORMAT))
}

/// [`snapshot_name`] with the suffix `_seq` when `seq` is not 0: the
/// `seq`-th other snapshot taken in the same second.
pub fn snapshot_name_seq(base: &str, at: jiff::Timestamp, seq: u32) -> String {
    match seq {
        0 => snapshot_name(base, at),
        n => format!("{}_{n}", snapshot_name(base, at)),
    }
}

/// The time in `name` when btrsend named it as a snapshot of `base`
/// ([`snapshot_name`], with or without a suffix); `None` for any other
/// name.
pub fn parse_snapshot_name(base: &str, name: &str) -> Option<jiff::Timestamp> {
    parse_snapshot_seq(base, name).map(|(t, _)| t)
}

/// The time and the suffix (0: none) in `name` when btrsend named it as a
/// snapshot of `base` ([`snapshot_name_seq`]); `None` for any other name.
pub fn parse_snapshot_seq(base: &str, name: &str) -> Option<(jiff::Timestamp, u32)> {
    let rest = name.strip_prefix(base)?.strip_prefix('.')?;
    // `_N`: 1 to MAX_SEQ, no leading zero (one spelling per number).
    let (rest, seq) = match rest.split_once('_') {
        None => (rest, 0),
        Some((r, n)) => {
            let ok = !n.is_empty()
                && n.len() <= 2
                && n.bytes().all(|c| c.is_ascii_digit())
                && !n.starts_with('0');
            let seq: u32 = n.parse().ok().filter(|_| ok)?;
            (r, seq)
        }
    };
    // Exactly the pattern: 10 + 1 + 6 + 1 characters, digits where digits
    // go (so `home.2026-11-24T030000Z.bak` or a hand-made name is not
    // ours).
    let b = rest.as_bytes();
    let shape = b"dddd-dd-ddTddddddZ";
    if b.len() != shape.len()
        || !b.iter().zip(shape).all(|(&c, &s)| {
            if s == b'd' {
                c.is_ascii_digit()
            } else {
                c == s
            }
        })
    {
        return None;
    }
    let civil = jiff::civil::DateTime::strptime(TIME_FORMAT, rest).ok()?;
    civil
        .to_zoned(jiff::tz::TimeZone::UTC)
        .ok()
        .map(|z| (z.timestamp(), seq))
}

/// The name snapshots of `subvol` get: its last path component (`root`
/// for a filesystem's root directory).
pub fn base_name(subvol: &Path) -> String {
    subvol
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| String::from("root"))
}

fn open_dir(path: &Path, what: &str) -> Result<File, BackupError> {
    File::open(path).map_err(|error| BackupError::Io {
        what: format!("cannot open {what} {}", path.display()),
        error,
    })
}

/// What the kernel's error means here.
fn errno_error(what: String, e: rustix::io::Errno) -> BackupError {
    let hint = match e {
        rustix::io::Errno::PERM | rustix::io::Errno::ACCESS => {
            " (taking and deleting snapshots needs root)"
        }
        rustix::io::Errno::XDEV => " (the snapshot directory must be on the same btrfs)",
        rustix::io::Errno::NOTTY | rustix::io::Errno::OPNOTSUPP => " (not on btrfs)",
        _ => "",
    };
    BackupError::Io {
        what: format!("{what}{hint}"),
        error: io::Error::from(e),
    }
}

/// Take a read-only snapshot of `subvol` in `dir`, named for `at` (with
/// the first free suffix when the name exists); returns its path.
///
/// # Errors
///
/// [`BackupError::Io`]: a directory cannot be opened, or the kernel
/// refuses (not root, not btrfs, another filesystem; every suffix up to
/// [`MAX_SEQ`] taken).
pub fn take(subvol: &Path, dir: &Path, at: jiff::Timestamp) -> Result<PathBuf, BackupError> {
    let base = base_name(subvol);
    let src = open_dir(subvol, "the subvolume")?;
    let d = open_dir(dir, "the snapshot directory")?;
    let mut seq = 0;
    loop {
        let name = snapshot_name_seq(&base, at, seq);
        let path = dir.join(&name);
        match sys::snapshot_create_readonly(d.as_fd(), name.as_bytes(), src.as_fd()) {
            Ok(()) => return Ok(path),
            Err(rustix::io::Errno::EXIST) if seq < MAX_SEQ => seq += 1,
            Err(e) => {
                return Err(errno_error(
                    format!(
                        "cannot take a read-only snapshot of {} as {}",
                        subvol.display(),
                        path.display()
                    ),
                    e,
                ));
            }
        }
    }
}

/// The transids of the subvolume `fd` is in
/// ([`BTRFS_IOC_GET_SUBVOL_INFO`](sys::subvol_info)), its UUID and parent
/// UUID, and whether it is read-only.
fn info(fd: std::os::fd::BorrowedFd<'_>) -> Result<sys::SubvolInfo, rustix::io::Errno> {
    sys::subvol_info(fd)
}

fn transids(i: &sys::SubvolInfo) -> super::plan::Transids {
    super::plan::Transids {
        generation: i.generation,
        ctransid: i.ctransid,
        otransid: i.otransid,
    }
}

/// Whether `subvol` has not changed since the newest read-only snapshot
/// btrsend took of it in `dir` (by its name and its parent UUID); the
/// name of that snapshot when so. The filesystem is synced first: the
/// subvolume's generation is written when its transaction commits.
///
/// # Errors
///
/// [`BackupError::Io`]: `subvol` or `dir` cannot be opened or examined,
/// or the sync fails.
pub fn newest_taken(subvol: &Path, dir: &Path) -> Result<Option<String>, BackupError> {
    let base = base_name(subvol);
    let src = open_dir(subvol, "the subvolume")?;
    let io = |what: String| move |e: rustix::io::Errno| errno_error(what, e);
    rustix::fs::syncfs(&src).map_err(io(format!("cannot sync {}", subvol.display())))?;
    let me = info(src.as_fd()).map_err(io(format!("cannot examine {}", subvol.display())))?;
    let d = open_dir(dir, "the snapshot directory")?;
    let mut newest: Option<(u64, String, sys::SubvolInfo)> = None;
    for name in subvolumes_in(dir)? {
        if parse_snapshot_name(&base, &name).is_none() {
            continue;
        }
        // Relative to DIR, without following a symlink put in its place
        // since it was listed.
        let Ok(fd) = rustix::fs::openat(
            &d,
            name.as_str(),
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) else {
            continue;
        };
        let Ok(i) = info(fd.as_fd()) else { continue };
        if i.parent_uuid != me.uuid || i.flags & 1 == 0 {
            continue;
        }
        if newest
            .as_ref()
            .is_none_or(|(o, n, _)| (i.otransid, &name) > (*o, n))
        {
            newest = Some((i.otransid, name, i));
        }
    }
    Ok(newest
        .filter(|(_, _, snap)| super::plan::unchanged_since(transids(&me), transids(snap)))
        .map(|(_, name, _)| name))
}

/// Delete the snapshot `name` in `dir`.
///
/// # Errors
///
/// [`BackupError::Io`]: the directory cannot be opened, or the kernel
/// refuses.
pub fn destroy(dir: &Path, name: &str) -> Result<(), BackupError> {
    let d = open_dir(dir, "the snapshot directory")?;
    sys::snap_destroy(d.as_fd(), name.as_bytes()).map_err(|e| {
        errno_error(
            format!("cannot delete the snapshot {}", dir.join(name).display()),
            e,
        )
    })
}

/// The subvolume roots directly in `dir` (inode 256 on btrfs), by name.
///
/// # Errors
///
/// [`BackupError::Io`]: `dir` cannot be read.
pub fn subvolumes_in(dir: &Path) -> Result<Vec<String>, BackupError> {
    use std::os::unix::fs::MetadataExt;
    let rd = std::fs::read_dir(dir).map_err(|error| BackupError::Io {
        what: format!("cannot read the snapshot directory {}", dir.display()),
        error,
    })?;
    let mut names = Vec::new();
    for e in rd {
        let e = e.map_err(|error| BackupError::Io {
            what: format!("cannot read the snapshot directory {}", dir.display()),
            error,
        })?;
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        // Not following symlinks: only real subvolume roots in DIR.
        match std::fs::symlink_metadata(e.path()) {
            Ok(m) if m.is_dir() && m.ino() == 256 => names.push(name),
            _ => {}
        }
    }
    names.sort();
    Ok(names)
}

/// A source snapshot of one subvolume, as pruning sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its name in the snapshot directory.
    pub name: String,
    /// The transaction that created it (its otransid: orders snapshots
    /// of one subvolume, even when nothing changed between them).
    pub otransid: u64,
    /// When btrsend took it: the time and suffix in its name
    /// ([`parse_snapshot_seq`]); `None` for a name btrsend does not give.
    pub taken: Option<(jiff::Timestamp, u32)>,
    /// Whether the repository holds its stream.
    pub stored: bool,
    /// Whether a hold record names it (another repository's next
    /// parent).
    pub held: bool,
}

/// Why a source snapshot stays or goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneVerdict {
    /// Among the newest N of those btrsend took.
    KeepNewest,
    /// The newest stored one: the next incremental's parent.
    KeepBase,
    /// Newer than the newest stored one and not stored yet.
    KeepUnstored,
    /// Not named by btrsend: never deleted.
    KeepForeign,
    /// Named by a hold record: another repository's next parent.
    KeepHeld,
    /// Deleted.
    Delete,
}

/// Which snapshots to delete, keeping the newest `keep` of those btrsend
/// took (see the module doc); the verdicts in the order of `candidates`.
pub fn prune_plan(candidates: &[Candidate], keep: usize) -> Vec<PruneVerdict> {
    let base = candidates
        .iter()
        .filter(|c| c.stored)
        .map(|c| c.otransid)
        .max();
    let mut ours: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates[i].taken.is_some())
        .collect();
    // Newest first (by the time and suffix in the name within one
    // transaction: `_10` is newer than `_9`).
    ours.sort_by(|&a, &b| {
        let (a, b) = (&candidates[a], &candidates[b]);
        (b.otransid, b.taken, &b.name).cmp(&(a.otransid, a.taken, &a.name))
    });
    let mut verdicts = vec![PruneVerdict::KeepForeign; candidates.len()];
    let mut base_kept = false;
    for (rank, &i) in ours.iter().enumerate() {
        let c = &candidates[i];
        verdicts[i] = if rank < keep {
            if c.stored && Some(c.otransid) == base {
                base_kept = true;
            }
            PruneVerdict::KeepNewest
        } else if c.stored && Some(c.otransid) == base && !base_kept {
            base_kept = true;
            PruneVerdict::KeepBase
        } else if !c.stored && base.is_none_or(|b| c.otransid > b) {
            PruneVerdict::KeepUnstored
        } else if c.held {
            PruneVerdict::KeepHeld
        } else {
            PruneVerdict::Delete
        };
    }
    verdicts
}

#[cfg(test)]
mod tests {
    use super::*;
    use PruneVerdict::*;

    fn c(name: &str, otransid: u64, ours: bool, stored: bool) -> Candidate {
        Candidate {
            name: name.to_owned(),
            otransid,
            taken: ours.then_some((jiff::Timestamp::UNIX_EPOCH, 0)),
            stored,
            held: false,
        }
    }

    #[test]
    fn names_round_trip_and_nothing_else_is_ours() {
        let t: jiff::Timestamp = "2026-11-24T03:00:07Z".parse().unwrap();
        let n = snapshot_name("home", t);
        assert_eq!(n, "home.2026-11-24T030007Z");
        assert_eq!(parse_snapshot_name("home", &n), Some(t));
        for other in [
            "home.2026-11-24T030007Z.bak",
            "home.2026-11-24",
            "home.2026-11-24T03:00:07Z",
            "homes.2026-11-24T030007Z",
            "home.2026-13-24T030007Z",
            "home2026-11-24T030007Z",
            "home.２026-11-24T030007Z",
        ] {
            assert_eq!(parse_snapshot_name("home", other), None, "{other}");
        }
        assert_eq!(base_name(Path::new("/mnt/fs/home")), "home");
        assert_eq!(base_name(Path::new("/")), "root");
    }

    #[test]
    fn suffixed_names_are_ours_and_ordered() {
        let t: jiff::Timestamp = "2026-11-24T03:00:07Z".parse().unwrap();
        assert_eq!(snapshot_name_seq("home", t, 0), "home.2026-11-24T030007Z");
        for seq in [1, 2, 9, 10, MAX_SEQ] {
            let n = snapshot_name_seq("home", t, seq);
            assert_eq!(n, format!("home.2026-11-24T030007Z_{seq}"));
            assert_eq!(parse_snapshot_seq("home", &n), Some((t, seq)));
            assert_eq!(parse_snapshot_name("home", &n), Some(t));
        }
        for other in [
            "home.2026-11-24T030007Z_",
            "home.2026-11-24T030007Z_0",
            "home.2026-11-24T030007Z_01",
            "home.2026-11-24T030007Z_100",
            "home.2026-11-24T030007Z_1_2",
            "home.2026-11-24T030007Z_x",
            "home.2026-11-24T030007Z_-1",
            "home.2026-11-24T030007Z_+1",
        ] {
            assert_eq!(parse_snapshot_seq("home", other), None, "{other}");
        }
        // Within one transaction (nothing changed between the runs), `_10`
        // is newer than `_9` and than the plain name; the newest two stay.
        let mk = |seq: u32| Candidate {
            name: snapshot_name_seq("home", t, seq),
            otransid: 10,
            taken: Some((t, seq)),
            stored: true,
            held: false,
        };
        let cs = [mk(10), mk(0), mk(9), mk(2)];
        assert_eq!(prune_plan(&cs, 2), [KeepNewest, Delete, KeepNewest, Delete]);
    }

    #[test]
    fn held_snapshots_stay() {
        // Another repository's next parent is s2: it stays although this
        // repository's base is s4 and N is 1.
        let mut cs = [
            c("s1", 10, true, true),
            c("s2", 20, true, true),
            c("s3", 30, true, true),
            c("s4", 40, true, true),
        ];
        cs[1].held = true;
        assert_eq!(prune_plan(&cs, 1), [Delete, KeepHeld, Delete, KeepNewest]);
    }

    #[test]
    fn the_newest_n_stay_and_the_rest_go() {
        let cs: Vec<Candidate> = (1..=6)
            .map(|i| c(&format!("s{i}"), i * 10, true, true))
            .collect();
        let v = prune_plan(&cs, 2);
        assert_eq!(v, [Delete, Delete, Delete, Delete, KeepNewest, KeepNewest]);
    }

    #[test]
    fn the_base_and_unstored_newer_ones_stay_beyond_n() {
        // s4 is the newest stored; s5 and s6 are not stored yet (their
        // run failed); s2 was never stored (forgotten): it may go.
        let cs = [
            c("s1", 10, true, true),
            c("s2", 20, true, false),
            c("s3", 30, true, true),
            c("s4", 40, true, true),
            c("s5", 50, true, false),
            c("s6", 60, true, false),
        ];
        assert_eq!(
            prune_plan(&cs, 1),
            [Delete, Delete, Delete, KeepBase, KeepUnstored, KeepNewest]
        );
        assert_eq!(
            prune_plan(&cs, 0),
            [Delete, Delete, Delete, KeepBase, KeepUnstored, KeepUnstored]
        );
    }

    #[test]
    fn foreign_snapshots_are_never_deleted_but_can_be_the_base() {
        let cs = [
            c("manual-1", 5, false, false),
            c("s1", 10, true, true),
            c("s2", 20, true, true),
            c("manual-2", 30, false, true),
        ];
        // The base is the hand-made manual-2: btrsend's s1, s2 may go.
        assert_eq!(
            prune_plan(&cs, 0),
            [KeepForeign, Delete, Delete, KeepForeign]
        );
    }

    #[test]
    fn nothing_stored_yet_keeps_everything() {
        let cs = [c("s1", 10, true, false), c("s2", 20, true, false)];
        assert_eq!(prune_plan(&cs, 0), [KeepUnstored, KeepUnstored]);
    }
}
