//! The attribute commands: SET_XATTR, REMOVE_XATTR, CHMOD, CHOWN, UTIMES,
//! FILEATTR (its inode flags set at the subvolume's end) and ENABLE_VERITY
//! (reported, not applied). It must not create, rename or remove entries,
//! nor write file data.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;

use rustix::fs::{AtFlags, FileType, IFlags, Mode, OFlags, Timespec, Timestamps, XattrFlags};

use super::{NoteSink, Receiver};
use crate::receive::ApplyErrorKind;
use crate::receive::copy;
use crate::receive::lanes::Op;

/// btrfs inode flags (`BTRFS_INODE_*`) → `FS_*_FL`, for FILEATTR.
pub(super) const FLAG_MAP: &[(u64, IFlags, &str)] = &[
    (1 << 1, IFlags::NOCOW, "NODATACOW"),
    (1 << 5, IFlags::SYNC, "SYNC"),
    (1 << 6, IFlags::IMMUTABLE, "IMMUTABLE"),
    (1 << 7, IFlags::APPEND, "APPEND"),
    (1 << 8, IFlags::NODUMP, "NODUMP"),
    (1 << 9, IFlags::NOATIME, "NOATIME"),
    (1 << 10, IFlags::DIRSYNC, "DIRSYNC"),
    (1 << 11, IFlags::COMPRESSED, "COMPRESS"),
];

/// `FS_NOCOMP_FL` (not in rustix's `IFlags`).
pub(super) const FS_NOCOMP_FL: u32 = 0x0000_0400;

pub(super) fn ts(t: stream_format::Timespec) -> Timespec {
    Timespec {
        tv_sec: t.sec_signed(),
        tv_nsec: t.nsec.into(),
    }
}

impl Receiver<'_> {
    /// SET_XATTR (flags 0: create or replace).
    pub(super) fn set_xattr(
        &mut self,
        path: &[u8],
        name: &[u8],
        data: &[u8],
    ) -> Result<(), ApplyErrorKind> {
        self.settle(path);
        let l = self.cur()?.target.locate(path)?;
        let r = rustix::fs::lsetxattr(
            l.proc_path(),
            std::ffi::OsStr::from_bytes(name),
            data,
            XattrFlags::empty(),
        );
        match r {
            // btrfs.* xattrs are btrfs properties (btrfs.compression): other
            // filesystems have no such namespace.
            Err(rustix::io::Errno::OPNOTSUPP) if name.starts_with(b"btrfs.") => {
                self.note(
                    "btrfs-xattr",
                    format!(
                        "the target filesystem has no btrfs.* properties: {}={} and other btrfs.* xattrs not set",
                        name.escape_ascii(),
                        data.escape_ascii()
                    ),
                );
                Ok(())
            }
            // security.* and trusted.* need privileges: as an ordinary user,
            // like owners, reported once.
            Err(rustix::io::Errno::PERM)
                if !rustix::process::geteuid().is_root()
                    && (name.starts_with(b"security.") || name.starts_with(b"trusted.")) =>
            {
                self.note(
                    "priv-xattr",
                    format!(
                        "not running as root: privileged xattrs (security.*, trusted.*) not set, first {} on {}",
                        name.escape_ascii(),
                        path.escape_ascii()
                    ),
                );
                Ok(())
            }
            r => Ok(r?),
        }
    }

    /// REMOVE_XATTR.
    pub(super) fn remove_xattr(&mut self, path: &[u8], name: &[u8]) -> Result<(), ApplyErrorKind> {
        self.settle(path);
        let l = self.cur()?.target.locate(path)?;
        match rustix::fs::lremovexattr(l.proc_path(), std::ffi::OsStr::from_bytes(name)) {
            // As for SET_XATTR: a filesystem without btrfs.* properties
            // never had the xattr set, so there is nothing to remove.
            Err(rustix::io::Errno::OPNOTSUPP) if name.starts_with(b"btrfs.") => {
                self.note(
                    "btrfs-xattr",
                    format!(
                        "the target filesystem has no btrfs.* properties: removal of {} and other btrfs.* xattrs skipped",
                        name.escape_ascii()
                    ),
                );
                Ok(())
            }
            r => Ok(r?),
        }
    }

    /// CHMOD to `mode & 07777`.
    pub(super) fn chmod(&mut self, path: &[u8], mode: u64) -> Result<(), ApplyErrorKind> {
        let mode = u32::try_from(mode & 0o7777).map_err(|_| ApplyErrorKind::BadMode(mode))?;
        if self.queued(path) {
            return self.queue_on_lane(path, Op::Chmod(mode));
        }
        if let Some(f) = self.cached_file(path) {
            // The open regular file that `path` names.
            rustix::fs::fchmod(f, Mode::from_raw_mode(mode))?;
            return Ok(());
        }
        let l = self.cur()?.target.locate(path)?;
        copy::chmod_located(&l, mode)?;
        Ok(())
    }

    /// CHOWN (not following a final symlink); as an ordinary user, reported
    /// once and skipped.
    pub(super) fn chown(&mut self, path: &[u8], uid: u64, gid: u64) -> Result<(), ApplyErrorKind> {
        let bad = || ApplyErrorKind::Invalid(format!("uid {uid} / gid {gid} out of range"));
        let id = |v: u64| u32::try_from(v).ok().filter(|&v| v != u32::MAX);
        let uid = id(uid).ok_or_else(bad)?;
        let gid = id(gid).ok_or_else(bad)?;
        if self.queued(path) {
            return self.queue_on_lane(path, Op::Chown(uid, gid));
        }
        let mut sink = NoteSink {
            seen: &mut self.seen_notes,
            progress: &mut *self.progress,
        };
        if let Some(w) = &mut self.wcache
            && w.path == path
        {
            if w.fresh_owner == Some((uid, gid)) {
                // Nothing to change (see `WFile::fresh_owner`).
                return Ok(());
            }
            w.fresh_owner = None;
            // The open regular file that `path` names: no lookup.
            copy::set_owner_fd(&w.file, uid, gid, &mut sink)?;
            return Ok(());
        }
        let cur = self.cur.as_ref().ok_or(ApplyErrorKind::NoSubvol)?;
        let l = cur.target.locate(path)?;
        copy::set_owner(&l, uid, gid, &mut sink)?;
        Ok(())
    }

    /// UTIMES: atime and mtime (CTIME and OTIME cannot be set, as for
    /// `btrfs receive`), not following a final symlink.
    pub(super) fn utimes(
        &mut self,
        path: &[u8],
        atime: stream_format::Timespec,
        mtime: stream_format::Timespec,
    ) -> Result<(), ApplyErrorKind> {
        let t = Timestamps {
            last_access: ts(atime),
            last_modification: ts(mtime),
        };
        if self.queued(path) {
            return self.queue_on_lane(path, Op::Utimes(t));
        }
        if let Some(f) = self.cached_file(path) {
            // The open regular file that `path` names: no lookup.
            rustix::fs::futimens(f, &t)?;
            return Ok(());
        }
        let l = self.cur()?.target.locate(path)?;
        rustix::fs::utimensat(&l.parent, l.name(), &t, AtFlags::SYMLINK_NOFOLLOW)?;
        Ok(())
    }

    /// FILEATTR: the flags that have an `FS_*_FL` meaning, set at the
    /// subvolume's end ([`Receiver::finish_subvol`]).
    pub(super) fn fileattr(&mut self, path: &[u8], attr: u64) -> Result<(), ApplyErrorKind> {
        let want = FLAG_MAP
            .iter()
            .filter(|(b, _, _)| attr & b != 0)
            .fold(0u32, |a, (_, f, _)| a | f.bits());
        let want = if attr & (1 << 3) != 0 {
            want | FS_NOCOMP_FL
        } else {
            want
        };
        self.settle(path);
        let cur = self.cur.as_mut().ok_or(ApplyErrorKind::NoSubvol)?;
        let l = cur.target.locate(path)?;
        let fd = l.open_path()?;
        cur.fileattrs.push((fd, path.to_vec(), want));
        Ok(())
    }

    /// Set inode flags through a reopened fd, reporting (once) the flags the
    /// target refuses.
    pub(super) fn set_flags(&mut self, fd: &OwnedFd, path: &[u8], want: u32) {
        let managed = FLAG_MAP
            .iter()
            .fold(FS_NOCOMP_FL, |a, (_, f, _)| a | f.bits());
        let res = (|| -> io::Result<()> {
            let st = rustix::fs::fstat(fd)?;
            let ft = FileType::from_raw_mode(st.st_mode);
            if ft != FileType::RegularFile && ft != FileType::Directory {
                return Ok(());
            }
            let p = format!("/proc/self/fd/{}", fd.as_raw_fd());
            let f = rustix::fs::open(
                p.as_str(),
                OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
                Mode::empty(),
            )?;
            let old = rustix::fs::ioctl_getflags(&f)?.bits();
            let new = (old & !managed) | want;
            if new == old {
                return Ok(());
            }
            rustix::fs::ioctl_setflags(&f, IFlags::from_bits_retain(new))?;
            Ok(())
        })();
        if let Err(e) = res {
            let names: Vec<&str> = FLAG_MAP
                .iter()
                .filter(|(_, f, _)| want & f.bits() != 0)
                .map(|x| x.2)
                .collect();
            self.note(
                "fileattr",
                format!(
                    "inode flags not set: the target refused [{}] on {} ({e}); further refusals are not reported",
                    names.join(","),
                    String::from_utf8_lossy(&path.escape_ascii().collect::<Vec<u8>>())
                ),
            );
        }
    }

    /// ENABLE_VERITY: reported once, not applied.
    pub(super) fn enable_verity(&mut self, path: &[u8]) -> Result<(), ApplyErrorKind> {
        self.settle(path);
        let t = self.cur()?.target.display(path);
        self.note(
            "verity",
            format!(
                "fs-verity is not enabled by btrsend receive: {} (and any later ENABLE_VERITY) received without it",
                t.display()
            ),
        );
        Ok(())
    }
}
