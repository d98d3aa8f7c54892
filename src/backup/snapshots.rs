//! `backup run --snapshot SUBVOL --snapshot-dir DIR [--keep-snapshots N]`:
//! the source snapshots a nightly job takes and prunes itself.
//!
//! * **Taking**: a read-only snapshot `DIR/<name>.<UTC time>` of SUBVOL
//!   (the btrfs snapshot ioctl with the read-only flag, as `btrfs
//!   subvolume snapshot -r` does), where `<name>` is SUBVOL's last path
//!   component and the time is written `YYYY-MM-DDTHHMMSSZ` (no colons:
//!   the names travel through scp, rsync and other systems' file names).
//! * **Selecting**: the snapshots of SUBVOL found in DIR (any name) that
//!   are newer than the newest one stored are stored; older ones that are
//!   not stored (dropped by `backup forget`, or never meant to be stored)
//!   are left alone, so a forgotten entry is never stored again.
//! * **Pruning** ([`prune_plan`]): of the snapshots in DIR that btrsend
//!   took (named by the pattern above, of SUBVOL), the newest N stay; of
//!   the others, the newest stored one (the next incremental's parent)
//!   and every one newer than it that is not stored yet stay too; the rest
//!   are deleted (the snapshot-destroy ioctl, as `btrfs subvolume delete`
//!   does). A snapshot btrsend did not name is never deleted.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::BackupError;
use crate::receive::sys;

/// The time in a snapshot's name: `2026-11-24T030000Z`.
const TIME_FORMAT: &str = "%Y-%m-%dT%H%M%SZ";

/// The name btrsend gives a snapshot of a subvolume called `base` taken
/// at `at`: `base.2026-11-24T030000Z`.
pub fn snapshot_name(base: &str, at: jiff::Timestamp) -> String {
    format!("{base}.{}", at.strftime(TIME_FORMAT))
}

/// The time in `name` when btrsend named it as a snapshot of `base`
/// ([`snapshot_name`]); `None` for any other name.
pub fn parse_snapshot_name(base: &str, name: &str) -> Option<jiff::Timestamp> {
    let rest = name.strip_prefix(base)?.strip_prefix('.')?;
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
        .map(|z| z.timestamp())
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

/// Take a read-only snapshot of `subvol` in `dir`, named for `at`;
/// returns its path.
///
/// # Errors
///
/// [`BackupError::Io`]: a directory cannot be opened, or the kernel
/// refuses (not root, not btrfs, another filesystem, the name exists).
pub fn take(subvol: &Path, dir: &Path, at: jiff::Timestamp) -> Result<PathBuf, BackupError> {
    let name = snapshot_name(&base_name(subvol), at);
    let src = open_dir(subvol, "the subvolume")?;
    let d = open_dir(dir, "the snapshot directory")?;
    let path = dir.join(&name);
    sys::snapshot_create_readonly(d.as_fd(), name.as_bytes(), src.as_fd()).map_err(|e| {
        errno_error(
            format!(
                "cannot take a read-only snapshot of {} as {}",
                subvol.display(),
                path.display()
            ),
            e,
        )
    })?;
    Ok(path)
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
    /// Whether btrsend took it (its name is [`snapshot_name`]'s).
    pub ours: bool,
    /// Whether the repository holds its stream.
    pub stored: bool,
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
        .filter(|&i| candidates[i].ours)
        .collect();
    // Newest first (by name, which holds the time, within one
    // transaction).
    ours.sort_by(|&a, &b| {
        let (a, b) = (&candidates[a], &candidates[b]);
        (b.otransid, &b.name).cmp(&(a.otransid, &a.name))
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
            ours,
            stored,
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
