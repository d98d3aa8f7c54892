//! Applying typed commands to DIR, one at a time, as btrfs-progs
//! `cmds/receive.c` does on btrfs, but on any filesystem and with every path
//! resolved by [`super::target`] (see `shared/docs/send-stream-format.md` §10
//! for the reference actions).
//!
//! Differences from `btrfs receive`, all deliberate:
//!
//! * SUBVOL and SNAPSHOT make plain directories; the received UUID and
//!   ctransid go into a record ([`super::meta`]) instead of the root item.
//!   SNAPSHOT copies the parent (reflink where possible, holes kept, see
//!   [`super::copy`]) and checks the parent's ctransid too.
//! * MKFILE uses `O_EXCL` and every creation refuses an existing entry; a
//!   file is opened for I/O only after it was checked to be a regular file.
//! * ENCODED_WRITE of compressed data is written as it is with
//!   `BTRFS_IOC_ENCODED_WRITE` (`receive::sys`, private) where the target allows it
//!   (btrfs, `CAP_SYS_ADMIN`), as `btrfs receive` does; elsewhere, for
//!   extents the ioctl refuses, and with `--force-decompress`, it is decoded
//!   and written ([`super::encoded`]). Its fields are checked either way; the
//!   compressed bytes are not (the kernel stores them unchecked, as for
//!   `btrfs receive`: corrupt data shows as a read error later).
//! * FILEATTR is applied (btrfs-progs ignores it): the flags that map to
//!   `FS_IOC_SETFLAGS` flags are set at the end of the subvolume (so an
//!   immutable flag does not block the commands that follow); flags the
//!   target refuses are reported once. Internal btrfs flags (NODATASUM,
//!   READONLY, PREALLOC) have no meaning elsewhere and are ignored.
//! * A MKFILE or MKDIR at an orphan name that the next command renames into
//!   place (the kernel's way of making every new inode) is created at its
//!   final name directly when that gives the same entry (nothing at the
//!   orphan name, nothing at the destination): one namespace change instead
//!   of two, and the orphan's directory keeps its time where the stream
//!   sends no UTIMES for it ([`Receiver::create_renamed`]).
//! * ENABLE_VERITY is reported, not applied.
//! * As an ordinary user, owners and privileged xattrs cannot be set: that
//!   is reported once, not an error. A character or block device node
//!   cannot be made at all: that is an error that says so
//!   ([`super::ApplyErrorKind::DeviceNeedsRoot`]); with `--max-errors 0` the rest
//!   is received (and the subvolume marked incomplete).
//! * A `--no-data` stream (UPDATE_EXTENT) is refused: it has no file data.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use rustix::fs::{
    AtFlags, FallocateFlags, FileType, IFlags, Mode, OFlags, Timespec, Timestamps, XattrFlags,
};
use stream_format::{Command, CommandInfo, CommandKind};

use super::copy::{self, Notes};
use super::encoded;
use super::meta::{Record, Records, State, Uuid};
use super::sys;
use super::target::{self, ReceiveDir, Target, TargetError};
use super::{ApplyError, ApplyErrorKind, Progress};

/// btrfs inode flags (`BTRFS_INODE_*`) → `FS_*_FL`, for FILEATTR.
const FLAG_MAP: &[(u64, IFlags, &str)] = &[
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
const FS_NOCOMP_FL: u32 = 0x0000_0400;

/// The subvolume being received.
#[derive(Debug)]
struct Current {
    target: Target,
    record: Record,
    /// Errors while applying its commands (it stays incomplete if any).
    errors: u64,
    /// FILEATTR flags to set at its end: O_PATH fd, stream path, wanted flags.
    fileattrs: Vec<(OwnedFd, Vec<u8>, u32)>,
}

/// Notes reported once each, through the [`Progress`] sink.
struct NoteSink<'p> {
    seen: &'p mut BTreeMap<&'static str, ()>,
    progress: &'p mut dyn Progress,
}

impl Notes for NoteSink<'_> {
    fn note(&mut self, key: &'static str, msg: String) {
        if self.seen.insert(key, ()).is_none() {
            self.progress.note(&msg);
        }
    }
}

/// Applies commands to DIR; one per receive.
pub struct Receiver<'p> {
    dir: ReceiveDir,
    records: Records,
    cur: Option<Current>,
    /// The last file created or written to: a stream path and the regular
    /// file it names, open for reading and writing. The name is kept true:
    /// it follows the file through a RENAME and is dropped when a path it
    /// depends on is renamed over or removed (see `renamed`, `removed`);
    /// nothing else can change what a path names (creations refuse an
    /// existing name).
    wcache: Option<(Vec<u8>, File)>,
    seen_notes: BTreeMap<&'static str, ()>,
    /// Try `BTRFS_IOC_ENCODED_WRITE` for compressed ENCODED_WRITE data
    /// (cleared for good when the target refuses it, see [`sys::Refusal`]).
    encoded_ioctl: bool,
    progress: &'p mut dyn Progress,
}

impl std::fmt::Debug for Receiver<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("dir", &self.dir)
            .field("cur", &self.cur)
            .finish_non_exhaustive()
    }
}

fn uuid_of(u: &[u8; 16]) -> Uuid {
    Uuid(*u)
}

fn ts(t: stream_format::Timespec) -> Timespec {
    Timespec {
        tv_sec: t.sec_signed(),
        tv_nsec: t.nsec.into(),
    }
}

impl<'p> Receiver<'p> {
    /// Prepare to receive into `dir` (which must exist).
    ///
    /// # Errors
    ///
    /// DIR cannot be opened, or its records directory cannot be read.
    pub fn new(dir: &std::path::Path, progress: &'p mut dyn Progress) -> io::Result<Receiver<'p>> {
        let dir = ReceiveDir::open(dir).map_err(|e| super::meta::with_path(e, dir))?;
        let records = Records::open(&dir)?;
        Ok(Receiver {
            dir,
            records,
            cur: None,
            wcache: None,
            seen_notes: BTreeMap::new(),
            encoded_ioctl: true,
            progress,
        })
    }

    /// Always decode ENCODED_WRITE data and write it (`--force-decompress`);
    /// by default compressed data is first offered to the target as it is
    /// (`BTRFS_IOC_ENCODED_WRITE`, btrfs only, as root).
    pub fn force_decompress(&mut self, yes: bool) {
        self.encoded_ioctl = !yes;
    }

    fn note(&mut self, key: &'static str, msg: String) {
        if self.seen_notes.insert(key, ()).is_none() {
            self.progress.note(&msg);
        }
    }

    /// Report an error below the limit (see [`Progress::error`]).
    pub fn progress_error(&mut self, e: &super::ReceiveError) {
        self.progress.error(e);
    }

    /// Report the reader's position (see [`Progress::position`]).
    pub fn position(&mut self, offset: u64, commands: u64) {
        self.progress.position(offset, commands);
    }

    /// The name of the subvolume being received, if any.
    pub fn current(&self) -> Option<&[u8]> {
        self.cur.as_ref().map(|c| c.target.name())
    }

    /// Count an error against the current subvolume (it will stay
    /// incomplete). Called by the driver for stream errors too.
    pub fn count_error(&mut self) {
        if let Some(c) = &mut self.cur {
            c.errors += 1;
        }
    }

    /// Finish the current subvolume: apply deferred flags, and mark it
    /// complete if none of its commands failed. Done at END, at the next
    /// SUBVOL / SNAPSHOT, and at the end of the input.
    ///
    /// # Errors
    ///
    /// The record cannot be written.
    pub fn finish_subvol(&mut self) -> Result<(), Box<ApplyError>> {
        self.wcache = None;
        let Some(mut cur) = self.cur.take() else {
            return Ok(());
        };
        let fileattrs = std::mem::take(&mut cur.fileattrs);
        for (fd, path, flags) in fileattrs {
            self.set_flags(&fd, &path, flags);
        }
        if cur.errors == 0 {
            cur.record.state = State::Complete;
            self.records.write(&self.dir, &cur.record).map_err(|e| {
                Box::new(ApplyError {
                    cmd: None,
                    op: "finish",
                    path: Vec::new(),
                    target: Some(self.records.path_of(&cur.record.name)),
                    path2: None,
                    kind: ApplyErrorKind::Io(e),
                })
            })?;
        }
        self.progress
            .subvol_done(cur.target.name(), cur.errors == 0);
        Ok(())
    }

    /// Set inode flags through a reopened fd, reporting (once) the flags the
    /// target refuses.
    fn set_flags(&mut self, fd: &OwnedFd, path: &[u8], want: u32) {
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

    fn cur(&self) -> Result<&Current, ApplyErrorKind> {
        self.cur.as_ref().ok_or(ApplyErrorKind::NoSubvol)
    }

    /// Apply one command (END is the driver's: it calls
    /// [`Receiver::finish_subvol`]).
    ///
    /// # Errors
    ///
    /// An [`ApplyError`] naming the command, its stream path(s), the target
    /// path(s) and the cause.
    pub fn apply(&mut self, info: &CommandInfo, cmd: &Command<'_>) -> Result<(), Box<ApplyError>> {
        let op = cmd.kind().map_or("unknown", CommandKind::name);
        let path = cmd.path().map(<[u8]>::to_vec).unwrap_or_default();
        let mut path2: Option<Vec<u8>> = None;
        match self.apply_inner(cmd, &mut path2) {
            Ok(()) => Ok(()),
            Err(kind) => {
                let is_subvol = matches!(cmd, Command::Subvol { .. } | Command::Snapshot { .. });
                let disp = |p: &[u8]| {
                    if is_subvol {
                        Some(self.dir.display_path(p))
                    } else {
                        self.cur.as_ref().map(|c| c.target.display(p))
                    }
                };
                let target = disp(&path);
                let path2 = path2.map(|p| {
                    // A clone source lives in another subvolume: its own display.
                    let d = disp(&p);
                    (p, d)
                });
                Err(Box::new(ApplyError {
                    cmd: Some(*info),
                    op,
                    path,
                    target,
                    path2,
                    kind,
                }))
            }
        }
    }

    fn apply_inner(
        &mut self,
        cmd: &Command<'_>,
        path2: &mut Option<Vec<u8>>,
    ) -> Result<(), ApplyErrorKind> {
        use Command as C;
        match cmd {
            C::Subvol {
                path,
                uuid,
                ctransid,
            } => self.subvol(path, uuid_of(uuid), *ctransid, None),
            C::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                clone_ctransid,
            } => self.subvol(
                path,
                uuid_of(uuid),
                *ctransid,
                Some((uuid_of(clone_uuid), *clone_ctransid)),
            ),
            C::End => self.finish_subvol().map_err(|e| e.kind),
            C::Mkfile { path, .. } => {
                let t = &self.cur()?.target;
                let l = t.locate_entry(path)?;
                let f = create_file(&l)?;
                // The new, empty regular file is the one the next WRITEs go
                // to: keep it open (see `wcache`).
                self.wcache = Some((path.to_vec(), f));
                Ok(())
            }
            C::Mkdir { path, .. } => {
                let l = self.cur()?.target.locate_entry(path)?;
                rustix::fs::mkdirat(&l.parent, l.name(), Mode::from_raw_mode(0o700))?;
                Ok(())
            }
            C::Mknod {
                path, rdev, mode, ..
            } => {
                let ft = FileType::from_raw_mode(
                    u32::try_from(*mode).map_err(|_| ApplyErrorKind::BadMode(*mode))?,
                );
                if !matches!(
                    ft,
                    FileType::CharacterDevice
                        | FileType::BlockDevice
                        | FileType::Fifo
                        | FileType::Socket
                ) {
                    return Err(ApplyErrorKind::BadMode(*mode));
                }
                let l = self.cur()?.target.locate_entry(path)?;
                match rustix::fs::mknodat(
                    &l.parent,
                    l.name(),
                    ft,
                    Mode::from_raw_mode(0o600),
                    *rdev,
                ) {
                    // Device nodes need CAP_MKNOD: as an ordinary user this is
                    // an error (the subvolume would lack the node, and the
                    // commands on it would fail), with what to do about it.
                    Err(rustix::io::Errno::PERM)
                        if matches!(ft, FileType::CharacterDevice | FileType::BlockDevice)
                            && !rustix::process::geteuid().is_root() =>
                    {
                        Err(ApplyErrorKind::DeviceNeedsRoot)
                    }
                    r => Ok(r?),
                }
            }
            C::Mkfifo { path, .. } | C::Mksock { path, .. } => {
                let ft = if matches!(cmd, C::Mkfifo { .. }) {
                    FileType::Fifo
                } else {
                    FileType::Socket
                };
                let l = self.cur()?.target.locate_entry(path)?;
                rustix::fs::mknodat(&l.parent, l.name(), ft, Mode::from_raw_mode(0o600), 0)?;
                Ok(())
            }
            C::Symlink {
                path, path_link, ..
            } => {
                if path_link.contains(&0) {
                    return Err(ApplyErrorKind::Invalid("NUL byte in symlink target".into()));
                }
                let l = self.cur()?.target.locate_entry(path)?;
                rustix::fs::symlinkat(std::ffi::OsStr::from_bytes(path_link), &l.parent, l.name())?;
                Ok(())
            }
            C::Rename { path, path_to } => {
                *path2 = Some(path_to.to_vec());
                let t = &self.cur()?.target;
                let from = t.locate_entry(path)?;
                let to = t.locate_entry(path_to)?;
                let r = rustix::fs::renameat(&from.parent, from.name(), &to.parent, to.name());
                drop((from, to));
                self.renamed(path, path_to, r.is_ok());
                r?;
                Ok(())
            }
            C::Link { path, path_link } => {
                *path2 = Some(path_link.to_vec());
                let t = &self.cur()?.target;
                let new = t.locate_entry(path)?;
                let old = t.locate_entry(path_link)?;
                rustix::fs::linkat(
                    &old.parent,
                    old.name(),
                    &new.parent,
                    new.name(),
                    AtFlags::empty(),
                )?;
                Ok(())
            }
            C::Unlink { path } | C::Rmdir { path } => {
                let flags = if matches!(cmd, C::Rmdir { .. }) {
                    AtFlags::REMOVEDIR
                } else {
                    AtFlags::empty()
                };
                let t = &self.cur()?.target;
                let l = t.locate_entry(path)?;
                let r = rustix::fs::unlinkat(&l.parent, l.name(), flags);
                drop(l);
                self.removed(path);
                r?;
                Ok(())
            }
            C::SetXattr { path, name, data } => {
                let l = self.cur()?.target.locate(path)?;
                let r = rustix::fs::lsetxattr(
                    l.proc_path(),
                    std::ffi::OsStr::from_bytes(name),
                    data,
                    XattrFlags::empty(),
                );
                match r {
                    // btrfs.* xattrs are btrfs properties (btrfs.compression):
                    // other filesystems have no such namespace.
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
                    // security.* and trusted.* need privileges: as an
                    // ordinary user, like owners, reported once.
                    Err(rustix::io::Errno::PERM)
                        if !rustix::process::geteuid().is_root()
                            && (name.starts_with(b"security.")
                                || name.starts_with(b"trusted.")) =>
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
            C::RemoveXattr { path, name } => {
                let l = self.cur()?.target.locate(path)?;
                rustix::fs::lremovexattr(l.proc_path(), std::ffi::OsStr::from_bytes(name))?;
                Ok(())
            }
            C::Write { path, offset, data } => {
                let f = self.file(path)?;
                f.write_all_at(data, *offset)?;
                Ok(())
            }
            C::Clone {
                offset,
                len,
                path,
                clone_uuid,
                clone_ctransid,
                clone_path,
                clone_offset,
            } => {
                *path2 = Some(clone_path.to_vec());
                self.clone_range(
                    path,
                    *offset,
                    *len,
                    uuid_of(clone_uuid),
                    *clone_ctransid,
                    clone_path,
                    *clone_offset,
                )
            }
            C::Truncate { path, size } => {
                let f = self.file(path)?;
                f.set_len(*size)?;
                Ok(())
            }
            C::Chmod { path, mode } => {
                let mode =
                    u32::try_from(*mode & 0o7777).map_err(|_| ApplyErrorKind::BadMode(*mode))?;
                if let Some(f) = self.cached_file(path) {
                    // The open regular file that `path` names.
                    rustix::fs::fchmod(f, Mode::from_raw_mode(mode))?;
                    return Ok(());
                }
                let l = self.cur()?.target.locate(path)?;
                copy::chmod_located(&l, mode)?;
                Ok(())
            }
            C::Chown { path, uid, gid } => {
                let bad = || ApplyErrorKind::Invalid(format!("uid {uid} / gid {gid} out of range"));
                let uid = u32::try_from(*uid)
                    .ok()
                    .filter(|&u| u != u32::MAX)
                    .ok_or_else(bad)?;
                let gid = u32::try_from(*gid)
                    .ok()
                    .filter(|&g| g != u32::MAX)
                    .ok_or_else(bad)?;
                let cur = self.cur.as_ref().ok_or(ApplyErrorKind::NoSubvol)?;
                let l = cur.target.locate(path)?;
                let mut sink = NoteSink {
                    seen: &mut self.seen_notes,
                    progress: &mut *self.progress,
                };
                copy::set_owner(&l, uid, gid, &mut sink)?;
                Ok(())
            }
            C::Utimes {
                path, atime, mtime, ..
            } => {
                let l = self.cur()?.target.locate(path)?;
                let t = Timestamps {
                    last_access: ts(*atime),
                    last_modification: ts(*mtime),
                };
                rustix::fs::utimensat(&l.parent, l.name(), &t, AtFlags::SYMLINK_NOFOLLOW)?;
                Ok(())
            }
            C::UpdateExtent { .. } => Err(ApplyErrorKind::NoData),
            C::Fallocate {
                path,
                mode,
                offset,
                size,
            } => {
                let f = self.file(path)?;
                rustix::fs::fallocate(f, FallocateFlags::from_bits_retain(*mode), *offset, *size)?;
                Ok(())
            }
            C::Fileattr { path, attr } => {
                let want = FLAG_MAP
                    .iter()
                    .filter(|(b, _, _)| attr & b != 0)
                    .fold(0u32, |a, (_, f, _)| a | f.bits());
                let want = if attr & (1 << 3) != 0 {
                    want | FS_NOCOMP_FL
                } else {
                    want
                };
                let cur = self.cur.as_mut().ok_or(ApplyErrorKind::NoSubvol)?;
                let l = cur.target.locate(path)?;
                let fd = l.open_path()?;
                cur.fileattrs.push((fd, path.to_vec(), want));
                Ok(())
            }
            C::EncodedWrite {
                path,
                offset,
                unencoded_file_len,
                unencoded_len,
                unencoded_offset,
                compression,
                encryption,
                data,
            } => {
                let e = sys::Encoded {
                    offset: *offset,
                    unencoded_file_len: *unencoded_file_len,
                    unencoded_len: *unencoded_len,
                    unencoded_offset: *unencoded_offset,
                    compression: compression.unwrap_or(0),
                    encryption: encryption.unwrap_or(0),
                    data,
                };
                encoded::check(
                    e.compression,
                    e.encryption,
                    e.unencoded_len,
                    e.unencoded_offset,
                    e.unencoded_file_len,
                )?;
                // Uncompressed data cannot go through the ioctl: plain write.
                if self.encoded_ioctl && e.compression != 0 {
                    let f = self.file(path)?;
                    match sys::encoded_write(f, &e) {
                        Ok(()) => return Ok(()),
                        Err(err) => match sys::refusal(err) {
                            sys::Refusal::Never => self.encoded_ioctl = false,
                            sys::Refusal::ThisOne => {}
                            sys::Refusal::Fail => return Err(err.into()),
                        },
                    }
                }
                let bytes = encoded::decode(
                    e.compression,
                    e.encryption,
                    data,
                    e.unencoded_len,
                    e.unencoded_offset,
                    e.unencoded_file_len,
                )?;
                let f = self.file(path)?;
                f.write_all_at(&bytes, *offset)?;
                Ok(())
            }
            C::EnableVerity { path, .. } => {
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
            C::Unknown { .. } => Ok(()),
        }
    }

    /// Apply MKFILE or MKDIR `mk` and the RENAME of its path to `to` that
    /// immediately follows it (how the kernel creates every new inode: at an
    /// orphan name, then renamed into place) as one creation at `to`, when
    /// that gives the same result: nothing is at the orphan name and the
    /// O_EXCL creation at `to` works. Saves a rename, and leaves the orphan's
    /// directory untouched (its mtime stays the source's even when the stream
    /// sends no UTIMES for it).
    ///
    /// Returns `false` when it did nothing: the caller then applies both
    /// commands one by one (and gets their errors).
    pub fn create_renamed(&mut self, mk: &Command<'_>, to: &[u8]) -> bool {
        let Some(cur) = &self.cur else {
            return false;
        };
        let t = &cur.target;
        let (path, is_file) = match mk {
            Command::Mkfile { path, .. } => (path, true),
            Command::Mkdir { path, .. } => (path, false),
            _ => return false,
        };
        let free = t
            .locate_entry(path)
            .is_ok_and(|l| matches!(l.lstat(), Err(e) if e.kind() == io::ErrorKind::NotFound));
        if !free {
            return false;
        }
        let Ok(l) = t.locate_entry(to) else {
            return false;
        };
        if is_file {
            let Ok(f) = create_file(&l) else {
                return false;
            };
            drop(l);
            self.renamed(path, to, false);
            self.wcache = Some((to.to_vec(), f));
        } else {
            if rustix::fs::mkdirat(&l.parent, l.name(), Mode::from_raw_mode(0o700)).is_err() {
                return false;
            }
            drop(l);
            self.renamed(path, to, false);
        }
        true
    }

    /// The cached open file, if `path` names it.
    fn cached_file(&self, path: &[u8]) -> Option<&File> {
        match &self.wcache {
            Some((p, f)) if p.as_slice() == path => Some(f),
            _ => None,
        }
    }

    /// After a RENAME `from` → `to` (`ok`: it worked): the cached
    /// directories at or below either path are dropped; the cached file
    /// follows its inode to `to`, or is dropped if a path it lived at is
    /// gone. A failed rename changed nothing, but dropping is always safe.
    fn renamed(&mut self, from: &[u8], to: &[u8], ok: bool) {
        if let Some(cur) = &self.cur {
            cur.target.forget(from);
            cur.target.forget(to);
        }
        if let Some((p, _)) = &mut self.wcache {
            if ok && p.as_slice() == from {
                p.clear();
                p.extend_from_slice(to);
            } else if target::is_at_or_under(p, from) || target::is_at_or_under(p, to) {
                self.wcache = None;
            }
        }
    }

    /// After an UNLINK or RMDIR of `path` (tried).
    fn removed(&mut self, path: &[u8]) {
        if let Some(cur) = &self.cur {
            cur.target.forget(path);
        }
        if matches!(&self.wcache, Some((p, _)) if target::is_at_or_under(p, path)) {
            self.wcache = None;
        }
    }

    /// The open file for `path`, from the cache or opened now.
    fn file(&mut self, path: &[u8]) -> Result<&File, ApplyErrorKind> {
        let hit = matches!(&self.wcache, Some((p, _)) if p.as_slice() == path);
        if !hit {
            self.wcache = None;
            let f = self.cur()?.target.open_regular(path, true)?;
            self.wcache = Some((path.to_vec(), f));
        }
        // OK to unwrap: filled just above.
        Ok(&self.wcache.as_ref().expect("write cache").1)
    }

    #[allow(clippy::too_many_arguments)]
    fn clone_range(
        &mut self,
        path: &[u8],
        offset: u64,
        len: u64,
        clone_uuid: Uuid,
        clone_ctransid: u64,
        clone_path: &[u8],
        clone_offset: u64,
    ) -> Result<(), ApplyErrorKind> {
        let cur = self.cur()?;
        let other;
        let src_target = if cur.record.uuid == clone_uuid {
            &cur.target
        } else {
            let rec = self.find_received(clone_uuid, clone_ctransid, false)?;
            other = self.dir.target(&rec.name)?;
            &other
        };
        let src = src_target.open_regular(clone_path, false)?;
        let dst = self.file(path)?;
        copy::copy_range(&src, clone_offset, dst, offset, len, false)?;
        Ok(())
    }

    /// A complete received subvolume with this UUID: with this ctransid if
    /// there is one, else (clone sources only, as btrfs-progs) any.
    fn find_received(
        &self,
        uuid: Uuid,
        ctransid: u64,
        parent: bool,
    ) -> Result<Record, ApplyErrorKind> {
        let recs = self.records.list().map_err(ApplyErrorKind::Io)?;
        let same: Vec<&Record> = recs.iter().filter(|r| r.uuid == uuid).collect();
        let complete = || same.iter().filter(|r| r.state == State::Complete);
        if let Some(r) = complete().find(|r| r.ctransid == ctransid) {
            return Ok((*r).clone());
        }
        if !parent && let Some(r) = complete().next() {
            return Ok((*r).clone());
        }
        if let Some(r) = complete().next() {
            return Err(ApplyErrorKind::ParentCtransid {
                uuid,
                ctransid,
                name: r.name.clone(),
                found: r.ctransid,
            });
        }
        if let Some(r) = same.first() {
            return Err(ApplyErrorKind::ParentIncomplete {
                uuid,
                ctransid,
                name: r.name.clone(),
                parent,
            });
        }
        Err(ApplyErrorKind::ParentMissing {
            uuid,
            ctransid,
            parent,
        })
    }

    fn subvol(
        &mut self,
        name: &[u8],
        uuid: Uuid,
        ctransid: u64,
        parent: Option<(Uuid, u64)>,
    ) -> Result<(), ApplyErrorKind> {
        self.finish_subvol().map_err(|e| e.kind)?;
        target::check_subvol_name(name).map_err(TargetError::Path)?;
        let parent_rec = match parent {
            Some((pu, pc)) => Some(self.find_received(pu, pc, true)?),
            None => None,
        };
        match rustix::fs::mkdirat(
            self.dir.fd(),
            std::ffi::OsStr::from_bytes(name),
            Mode::from_raw_mode(0o700),
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST) => return Err(ApplyErrorKind::Exists),
            Err(e) => return Err(e.into()),
        }
        let record = Record {
            name: name.to_vec(),
            uuid,
            ctransid,
            parent,
            state: State::Incomplete,
        };
        self.records.write(&self.dir, &record)?;
        let target = self.dir.target(name)?;
        self.progress.subvol_start(name, parent.is_some());
        // Current from here on, so a failed copy leaves it incomplete and
        // the commands that follow are counted against it.
        let cur = self.cur.insert(Current {
            target,
            record,
            errors: 0,
            fileattrs: Vec::new(),
        });
        if let Some(p) = parent_rec {
            let src = self.dir.target(&p.name)?;
            let mut sink = NoteSink {
                seen: &mut self.seen_notes,
                progress: &mut *self.progress,
            };
            copy::copy_tree(&src, &cur.target, &mut sink).map_err(|e| ApplyErrorKind::Copy {
                from: src.display(&e.path),
                source: e.source,
            })?;
        }
        Ok(())
    }
}

/// Create a new regular file at `l` (`O_EXCL`, never following a final
/// symlink), open for reading and writing, mode 0600 until CHMOD.
fn create_file(l: &target::Located<'_>) -> Result<File, ApplyErrorKind> {
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(&l.parent, l.name(), flags, Mode::from_raw_mode(0o600))?;
    Ok(File::from(fd))
}

use std::os::unix::ffi::OsStrExt as _;
