//! Receiving into btrfs as real subvolumes, as `btrfs receive` does
//! (btrfs-progs `cmds/receive.c`, `common/send-utils.c`; facts only).
//!
//! When DIR is on btrfs and btrsend may use the subvolume ioctls (root), a
//! SUBVOL is a new subvolume and a SNAPSHOT a snapshot of its parent (O(1),
//! no copy); at the end of a subvolume with no error its received UUID and
//! stransid are set (`BTRFS_IOC_SET_RECEIVED_SUBVOL`, which also sets the
//! rtransid) and it is made read-only. A subvolume whose receive failed or
//! was interrupted keeps no received UUID: btrfs-progs, btrbk and btrsend
//! itself never take it for a parent.
//!
//! Parents and clone sources are found as `btrfs receive` finds them: in
//! the filesystem's UUID tree (`BTRFS_IOC_TREE_SEARCH`), first among
//! received UUIDs, then among subvolume UUIDs; each candidate's path is
//! built from its ROOT_BACKREF and `BTRFS_IOC_INO_LOOKUP`, from the top
//! level, and made relative to the mount root (`-m ROOTMOUNT`, else the
//! mount point of DIR in `/proc/self/mountinfo`), whose own subvolume path
//! must prefix it. Among several candidates, one with the stream's
//! ctransid (its stransid if found by received UUID, its ctransid if by
//! UUID) is preferred; if none has it, the first is used, as btrfs-progs
//! does (the transids legitimately differ in chains through received
//! subvolumes, see [`Btrfs::find`]).

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::sys::{self, SubvolInfo};

/// `BTRFS_SUPER_MAGIC` (statfs `f_type`).
pub const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;
/// `BTRFS_ROOT_TREE_OBJECTID`.
const ROOT_TREE: u64 = 1;
/// `BTRFS_UUID_TREE_OBJECTID`.
const UUID_TREE: u64 = 9;
/// `BTRFS_FS_TREE_OBJECTID`: the top-level subvolume.
const FS_TREE: u64 = 5;
/// `BTRFS_FIRST_FREE_OBJECTID`: a subvolume's root directory.
pub(super) const FIRST_FREE: u64 = 256;
/// `BTRFS_ROOT_BACKREF_KEY`.
const ROOT_BACKREF_KEY: u32 = 144;
/// `BTRFS_UUID_KEY_SUBVOL`.
const UUID_KEY_SUBVOL: u32 = 251;
/// `BTRFS_UUID_KEY_RECEIVED_SUBVOL`.
const UUID_KEY_RECEIVED_SUBVOL: u32 = 252;

/// Whether `dir` (an fd of DIR) is on btrfs.
#[allow(
    clippy::useless_conversion,
    reason = "f_type is not i64 on every target"
)]
pub fn on_btrfs(dir: BorrowedFd<'_>) -> bool {
    rustix::fs::fstatfs(dir).is_ok_and(|s| i64::from(s.f_type) == BTRFS_SUPER_MAGIC)
}

/// Open `path` beneath nothing (an absolute or cwd-relative path the user
/// or the kernel gave) as a directory fd that ioctls accept.
fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOATIME,
        Mode::empty(),
    )
    .or_else(|_| {
        // O_NOATIME needs ownership: not an error worth failing for.
        rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
    })?)
}

/// An fd of `at`'s directory that ioctls accept (not `O_PATH`).
pub fn reopen_dir(at: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        at,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The btrfs filesystem DIR is on, seen from its mount root.
#[derive(Debug)]
pub struct Btrfs {
    /// The mount root (where found subvolume paths start).
    mnt: OwnedFd,
    mnt_path: PathBuf,
    /// The path of the mount root's subvolume from the top level (empty:
    /// the top level is mounted).
    root_path: Vec<u8>,
}

/// A subvolume found by UUID.
#[derive(Debug)]
pub struct Found {
    /// Its path (the mount root joined with its path below it).
    pub path: PathBuf,
    /// Its root directory, open for reading.
    pub fd: OwnedFd,
    /// What the kernel says of it.
    pub info: SubvolInfo,
}

/// Why no usable subvolume was found.
#[derive(Debug)]
pub enum NotFound {
    /// None has the UUID (as received UUID nor as UUID).
    Missing,
    /// One has it, but lies outside the mounted subvolume.
    Unreachable(Vec<u8>),
    /// The search failed.
    Io(io::Error),
}

impl Btrfs {
    /// The filesystem of DIR (`dir`, as given; `dir_fd` an fd of it), seen
    /// from `root_mount` (`-m`) or from the mount point of DIR.
    ///
    /// # Errors
    ///
    /// The mount point cannot be found or opened, or its subvolume cannot be
    /// resolved (`EPERM` without `CAP_SYS_ADMIN`).
    pub fn open(dir: &Path, root_mount: Option<&Path>) -> io::Result<Btrfs> {
        let mnt_path = match root_mount {
            Some(m) => m.to_path_buf(),
            None => mount_point_of(dir)?,
        };
        let mnt = open_dir(&mnt_path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot open mount root {}: {e}", mnt_path.display()),
            )
        })?;
        if !on_btrfs(mnt.as_fd()) {
            return Err(io::Error::other(format!(
                "mount root {} is not on btrfs",
                mnt_path.display()
            )));
        }
        let (root_id, _) = sys::ino_lookup(mnt.as_fd(), 0, FIRST_FREE)?;
        let root_path = if root_id == FS_TREE {
            Vec::new()
        } else {
            subvol_path(mnt.as_fd(), root_id)?
        };
        Ok(Btrfs {
            mnt,
            mnt_path,
            root_path,
        })
    }

    /// The mount root.
    pub fn mount_root(&self) -> &Path {
        &self.mnt_path
    }

    /// The subvolume with received UUID `uuid` (else UUID `uuid`),
    /// preferably with transid `ctransid`, else the first found (as
    /// btrfs-progs, for parents and clone sources alike).
    ///
    /// # Errors
    ///
    /// See [`NotFound`].
    pub fn find(&self, uuid: [u8; 16], ctransid: u64) -> Result<Found, NotFound> {
        let mut other: Option<Found> = None;
        let mut unreachable = None;
        for (key, received) in [(UUID_KEY_RECEIVED_SUBVOL, true), (UUID_KEY_SUBVOL, false)] {
            let ids = uuid_lookup(self.mnt.as_fd(), uuid, key).map_err(NotFound::Io)?;
            for id in ids {
                let full = subvol_path(self.mnt.as_fd(), id).map_err(NotFound::Io)?;
                let Some(rel) = below(&self.root_path, &full) else {
                    unreachable = Some(full);
                    continue;
                };
                let path = if rel.is_empty() {
                    self.mnt_path.clone()
                } else {
                    self.mnt_path.join(OsStr::from_bytes(rel))
                };
                let fd = open_dir(&path).map_err(NotFound::Io)?;
                let info = sys::subvol_info(fd.as_fd()).map_err(|e| NotFound::Io(e.into()))?;
                let (has, transid) = if received {
                    (info.received_uuid == uuid, info.stransid)
                } else {
                    (info.uuid == uuid, info.ctransid)
                };
                if !has {
                    continue;
                }
                let f = Found { path, fd, info };
                if transid == ctransid {
                    return Ok(f);
                }
                other.get_or_insert(f);
            }
        }
        // None with the transid: the first found, as btrfs-progs takes it.
        // The kernel sends a parent's own ctransid, which is not the
        // stransid of a copy received from another sender in the chain
        // (fstests btrfs/110), and a dedupe into a read-only snapshot
        // raises its ctransid (btrfs/191): refusing would fail where
        // `btrfs receive` succeeds.
        other.ok_or_else(|| unreachable.map_or(NotFound::Missing, NotFound::Unreachable))
    }
}

/// The part of `full` below `root` (both paths from the top level); `None`
/// if `full` is not at or below `root`.
fn below<'a>(root: &[u8], full: &'a [u8]) -> Option<&'a [u8]> {
    if root.is_empty() {
        return Some(full);
    }
    let rest = full.strip_prefix(root)?;
    match rest.first() {
        None => Some(rest),
        Some(b'/') => rest.get(1..),
        Some(_) => None,
    }
}

/// The subvolume ids the UUID tree lists for `uuid` under `key` (none if
/// there is no such item, or no UUID tree).
fn uuid_lookup(fd: BorrowedFd<'_>, uuid: [u8; 16], key: u32) -> io::Result<Vec<u64>> {
    let (lo, hi) = uuid.split_at(8);
    // The UUID tree key: objectid = first 8 bytes, offset = last 8, both
    // little-endian (btrfs_uuid_to_key).
    let objectid = u64::from_le_bytes(lo.try_into().unwrap_or_default());
    let offset = u64::from_le_bytes(hi.try_into().unwrap_or_default());
    let items = match sys::tree_search(
        fd,
        UUID_TREE,
        key,
        (objectid, objectid),
        (offset, offset),
        1,
    ) {
        Ok(i) => i,
        Err(Errno::NOENT) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    Ok(items
        .iter()
        .flat_map(|i| {
            i.data
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        })
        .collect())
}

/// The path of subvolume `id` from the top level ("" for the top level):
/// its ROOT_BACKREF names its parent subvolume, the directory in it and its
/// name; the directory's path comes from `BTRFS_IOC_INO_LOOKUP`.
fn subvol_path(fd: BorrowedFd<'_>, id: u64) -> io::Result<Vec<u8>> {
    let mut parts: Vec<Vec<u8>> = Vec::new();
    let mut cur = id;
    // Each step goes one subvolume up; a filesystem has fewer than 2^16
    // levels of nesting in practice, and a loop would be corruption.
    for _ in 0..4096 {
        if cur == FS_TREE {
            parts.reverse();
            return Ok(parts.concat());
        }
        let refs = sys::tree_search(
            fd,
            ROOT_TREE,
            ROOT_BACKREF_KEY,
            (cur, cur),
            (0, u64::MAX),
            1,
        )?;
        let r = refs.first().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("subvolume {cur} has no ROOT_BACKREF (deleted?)"),
            )
        })?;
        // struct btrfs_root_ref: dirid u64, sequence u64, name_len u16, name.
        let bad = || io::Error::other(format!("corrupt ROOT_BACKREF of subvolume {cur}"));
        let dirid = r
            .data
            .get(0..8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or_else(bad)?;
        let name_len = r
            .data
            .get(16..18)
            .and_then(|b| b.try_into().ok())
            .map(u16::from_le_bytes)
            .ok_or_else(bad)?;
        let name = r.data.get(18..18 + usize::from(name_len)).ok_or_else(bad)?;
        let mut part = Vec::new();
        if dirid != FIRST_FREE {
            let (_, dir) = sys::ino_lookup(fd, r.offset, dirid)?;
            part.extend_from_slice(&dir);
        }
        part.extend_from_slice(name);
        if r.offset != FS_TREE {
            part.insert(0, b'/');
        }
        parts.push(part);
        cur = r.offset;
    }
    Err(io::Error::other(format!(
        "subvolume {id}: ROOT_BACKREF chain does not end at the top level"
    )))
}

/// The mount point of the filesystem DIR is on: the longest mount point in
/// `/proc/self/mountinfo` that prefixes DIR's canonical path.
fn mount_point_of(dir: &Path) -> io::Result<PathBuf> {
    let dir = std::fs::canonicalize(dir)?;
    let info = std::fs::read("/proc/self/mountinfo")?;
    let mut best: Option<PathBuf> = None;
    for line in info.split(|&b| b == b'\n') {
        // id parent major:minor root mount-point options ... - fstype ...
        let Some(mp) = line.split(|&b| b == b' ').nth(4) else {
            continue;
        };
        let mp = PathBuf::from(OsStr::from_bytes(&unescape(mp)));
        if dir.starts_with(&mp)
            && best
                .as_ref()
                .is_none_or(|b| mp.as_os_str().len() >= b.as_os_str().len())
        {
            best = Some(mp);
        }
    }
    best.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no mount point found for {}", dir.display()),
        )
    })
}

/// Undo mountinfo's octal escapes (`\040` for a space, …).
fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while let Some(&c) = s.get(i) {
        let oct = s
            .get(i + 1..i + 4)
            .filter(|d| c == b'\\' && d.iter().all(|x| (b'0'..=b'7').contains(x)));
        match oct {
            Some(d) => {
                let v = d.iter().fold(0u32, |a, x| a * 8 + u32::from(x - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// The subvolumes directly in DIR (`dir`, on btrfs) that carry `uuid` as
/// their received UUID (read-only, as `btrfs receive` leaves them) or, as
/// btrfs-progs falls back to, as their UUID, as complete records: how a
/// directory-mode receive finds a parent that `btrfs receive` (or btrsend
/// in subvolume mode) put there. `BTRFS_IOC_GET_SUBVOL_INFO` needs no
/// privileges. Nothing if DIR is not on btrfs or cannot be read.
pub fn received_in(dir: BorrowedFd<'_>, uuid: [u8; 16]) -> Vec<super::meta::Record> {
    use super::meta::{Record, State};
    use crate::types::Uuid;
    let mut out = Vec::new();
    if !on_btrfs(dir) {
        return out;
    }
    let Ok(fd) = reopen_dir(dir) else {
        return out;
    };
    let Ok(entries) = rustix::fs::Dir::read_from(&fd) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_bytes();
        if name == b"." || name == b".." || e.ino() != FIRST_FREE {
            continue;
        }
        let Ok(sub) = rustix::fs::openat(
            &fd,
            e.file_name(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let Ok(info) = sys::subvol_info(sub.as_fd()) else {
            continue;
        };
        // BTRFS_ROOT_SUBVOL_RDONLY in the root item flags.
        let read_only = info.flags & 1 != 0;
        let (ctransid, ok) = if info.received_uuid == uuid {
            (info.stransid, read_only)
        } else {
            (info.ctransid, info.uuid == uuid)
        };
        if ok {
            out.push(Record {
                name: name.to_vec(),
                uuid: Uuid(uuid),
                ctransid,
                parent: None,
                state: State::Complete,
            });
        }
    }
    out
}

/// Finish a received subvolume as btrfs-progs does: set its received UUID
/// and stransid, then make it read-only. Returns the rtransid.
///
/// # Errors
///
/// The ioctl that failed, named.
pub fn finish(root: BorrowedFd<'_>, uuid: [u8; 16], stransid: u64) -> io::Result<u64> {
    let fd = reopen_dir(root)?;
    let named =
        |what: &str, e: Errno| io::Error::new(io::Error::from(e).kind(), format!("{what}: {e}"));
    let rtransid = sys::set_received_subvol(fd.as_fd(), uuid, stransid)
        .map_err(|e| named("BTRFS_IOC_SET_RECEIVED_SUBVOL", e))?;
    let flags = sys::subvol_flags(fd.as_fd()).map_err(|e| named("BTRFS_IOC_SUBVOL_GETFLAGS", e))?;
    sys::set_subvol_flags(fd.as_fd(), flags | sys::SUBVOL_RDONLY)
        .map_err(|e| named("cannot make the subvolume read-only", e))?;
    Ok(rtransid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_below_the_mounted_subvolume() {
        assert_eq!(below(b"", b"a/b"), Some(&b"a/b"[..]));
        assert_eq!(below(b"a", b"a/b"), Some(&b"b"[..]));
        assert_eq!(below(b"a", b"a"), Some(&b""[..]));
        assert_eq!(below(b"a", b"ab/c"), None);
        assert_eq!(below(b"a/b", b"a"), None);
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(br"/mnt/a\040b"), b"/mnt/a b");
        assert_eq!(unescape(br"/x\134y"), b"/x\\y");
        assert_eq!(unescape(br"/x\9"), br"/x\9");
    }

    #[test]
    fn the_mount_point_of_a_directory() {
        let d = tempfile::tempdir().unwrap();
        let m = mount_point_of(d.path()).unwrap();
        assert!(std::fs::canonicalize(d.path()).unwrap().starts_with(&m));
        assert_eq!(mount_point_of(Path::new("/")).unwrap(), Path::new("/"));
    }
}
