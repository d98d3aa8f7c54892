//! Applying typed commands to DIR, one at a time, as btrfs-progs
//! `cmds/receive.c` does on btrfs, but on any filesystem and with every path
//! resolved by [`super::target`] (see `shared/docs/send-stream-format.md` §10
//! for the reference actions).
//!
//! Differences from `btrfs receive`, all deliberate:
//!
//! * On btrfs as root ([`Receiver::subvolumes`]), SUBVOL and SNAPSHOT make
//!   real subvolumes and a finished one gets its received UUID and is made
//!   read-only, as `btrfs receive` does ([`super::subvol`]). Elsewhere
//!   they make plain directories; the received UUID and ctransid go into a
//!   record ([`super::meta`]) instead of the root item, and SNAPSHOT copies
//!   the parent (reflink where possible, holes kept, see [`super::copy`]).
//!   Either way a parent or clone source with the stream's UUID but another
//!   transid is used, as btrfs-progs uses it (one with the transid is
//!   preferred).
//! * MKFILE uses `O_EXCL` and every creation refuses an existing entry; a
//!   file is opened for I/O only after it was checked to be a regular file.
//! * ENCODED_WRITE of compressed data is written as it is with
//!   `BTRFS_IOC_ENCODED_WRITE` (the crate's private `sys`) where the target allows it
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

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{
    AtFlags, FallocateFlags, FileType, IFlags, Mode, OFlags, Timespec, Timestamps, XattrFlags,
};
use stream_format::{Command, CommandInfo, CommandKind};

use super::copy::{self, Notes};
use super::encoded;
use super::lanes::{Job, Op, Pool};
use super::meta::{Record, Records, State};
use super::subvol::{self, Btrfs, NotFound};
use super::target::{self, ReceiveDir, Target, TargetError};
use super::{ApplyError, ApplyErrorKind, Progress};
use crate::sys;
use crate::types::Uuid;

mod resume;
mod undo;
pub use resume::{RESUME_DIR, Step, TokenError, Tracker, resume_token};
pub(crate) use resume::{STATE_FILES, drop_journals};

/// Entry points for the fuzz targets (`fuzz/`) into the parsers of the
/// files a receive keeps beside DIR (state, start mark, undo journal),
/// which anyone who can write there can change. Not an API.
#[doc(hidden)]
pub mod fuzz {
    pub use super::resume::fuzz::{start, state};
    pub use super::undo::fuzz::journal;
}

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
    /// Its root as messages show it ([`Target::display`] of "").
    base: Arc<PathBuf>,
    /// A real btrfs subvolume (else a directory with a record).
    subvolume: bool,
}

/// WRITE data smaller than this is written on the receiver's thread (unless
/// its file has jobs queued): a lane costs a wake-up and a lock per job.
const LANE_MIN: usize = 8192;

/// The worker lanes ([`super::lanes`]) and the files they have jobs for.
///
/// Why the result equals applying the stream in order:
///
/// * only regular files with one link go to a lane, named by an open fd, so
///   a job reaches the inode its command meant whatever RENAME, UNLINK or
///   creation happens later on the receiver's thread; no directory, entry
///   or other file changes on a lane;
/// * `files` maps the (single) stream path of every file that may have
///   jobs queued to its lane; it follows RENAMEs (entries at or under the
///   source move to the destination, entries at or under a replaced
///   destination go) and UNLINKs; LINK waits for its file's lane first (then
///   the file has two names and is never queued again: [`Receiver::file`]
///   checks the link count when it opens a file);
/// * a command on a path in `files` either goes to the same lane, after its
///   jobs (WRITE, ENCODED_WRITE, TRUNCATE, FALLOCATE, CHMOD, CHOWN, UTIMES:
///   all done through the fd, as the stream's order needs: a write after a
///   CHOWN would clear set-uid bits, a write after UTIMES would change the
///   mtime), or waits for the lane to run them and is applied here (xattrs,
///   FILEATTR, CLONE to or from it, LINK to it, ENABLE_VERITY);
/// * SUBVOL, SNAPSHOT, END and the end of the input wait for every lane
///   (and collect the lanes' errors before a subvolume is marked complete).
struct Lanes {
    pool: Pool,
    files: BTreeMap<Vec<u8>, LaneFile>,
}

/// A file with jobs (maybe) queued: its fd, its lane, its last job there.
struct LaneFile {
    file: Arc<File>,
    /// Its inode number.
    ino: u64,
    lane: usize,
    last: u64,
}

/// The last file created or written to ([`Receiver`]'s `wcache`).
struct WFile {
    /// Its stream path.
    path: Vec<u8>,
    /// The file, open for reading and writing.
    file: Arc<File>,
    /// It had a single link when opened.
    single: bool,
    /// Its inode number.
    ino: u64,
    /// Its owner (uid, gid), while it is a file this receiver created and
    /// that no command has changed since but WRITEs (and a RENAME): no
    /// set-id bit, no xattr. A CHOWN to that owner then changes nothing (the
    /// set-id bits and file capabilities it would clear are not there) and
    /// is skipped: one metadata transaction less per file of a tree owned by
    /// the receiving user, as most of a system's files are by root.
    fresh_owner: Option<(u32, u32)>,
}

impl WFile {
    /// A file just created (mode 0600, no xattrs): its inode and owner.
    fn created(path: &[u8], f: File) -> Result<WFile, ApplyErrorKind> {
        let st = rustix::fs::fstat(&f)?;
        Ok(WFile {
            path: path.to_vec(),
            file: Arc::new(f),
            single: true,
            ino: st.st_ino,
            fresh_owner: Some((st.st_uid, st.st_gid)),
        })
    }
}

/// `files` entries kept before the finished ones are dropped.
const LANE_FILES: usize = 256;

/// A WRITE or ENCODED_WRITE that goes to a lane without copying its data
/// ([`Receiver::offload`], then [`Receiver::submit`] with the command's
/// payload buffer).
#[derive(Debug)]
pub struct Offload {
    info: CommandInfo,
    path: Vec<u8>,
    /// DATA's length.
    len: usize,
    /// WRITE's offset.
    offset: u64,
    /// ENCODED_WRITE's fields (its `data` empty), else WRITE.
    encoded: Option<sys::Encoded<'static>>,
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
    /// file it names, open for reading and writing, and whether it had a
    /// single link when opened. The name is kept true: it follows the file
    /// through a RENAME and is dropped when a path it depends on is renamed
    /// over or removed (see `renamed`, `removed`), or linked to; nothing
    /// else can change what a path names (creations refuse an existing
    /// name).
    wcache: Option<WFile>,
    seen_notes: BTreeMap<&'static str, ()>,
    /// Try `BTRFS_IOC_ENCODED_WRITE` for compressed ENCODED_WRITE data
    /// (cleared for good when the target refuses it, see [`sys::Refusal`]).
    encoded_ioctl: Arc<AtomicBool>,
    /// Worker lanes for file data (none: everything on this thread).
    lanes: Option<Lanes>,
    /// Lane errors taken at a subvolume's end, for the driver.
    lane_errors: Vec<ApplyError>,
    /// The command being applied (for the lane jobs it queues).
    info: Option<CommandInfo>,
    /// DIR's btrfs, when subvolumes are received as real subvolumes
    /// ([`Receiver::subvolumes`]).
    btrfs: Option<Btrfs>,
    /// A SUBVOL / SNAPSHOT found its partial subvolume and rolled it back
    /// to this resume point (see [`Receiver::take_resumed`]).
    resumed: Option<crate::resume::Token>,
    /// The names in the root of the current subvolume, while they are all
    /// known: it was made empty by SUBVOL in this receive, every entry
    /// created, renamed or removed at its root since went through here and
    /// worked, and there are at most [`ROOT_NAMES`] of them. Lets
    /// [`Receiver::create_renamed`] see that an orphan name is free without
    /// a lookup (a negative lookup in a large directory is a B-tree search:
    /// 7 % of the time of a many-small-files receive). `None`: unknown, ask
    /// the filesystem.
    root_names: Option<HashSet<Vec<u8>>>,
    /// Why the target refused `BTRFS_IOC_ENCODED_WRITE` for good (see
    /// [`sys::Refusal::Never`]), for the fallback lines of `-vv`.
    ioctl_refused: Option<rustix::io::Errno>,
    /// The undo journal of a directory-mode receive past its first
    /// checkpoint (see `undo`).
    journal: Option<undo::Journal>,
    /// When a subvolume-mode checkpoint is also durable.
    budget: Option<resume::Budget>,
    /// A checkpoint waiting for the lanes to become the resume point.
    pending: Option<resume::Pending>,
    /// Checkpoints are taken ([`Receiver::set_checkpoints`]).
    checkpoints: bool,
    progress: &'p mut dyn Progress,
}

/// Root names tracked at most (see `Receiver::root_names`): the memory
/// bound of the tracking (a flat tree beyond it is looked up instead).
const ROOT_NAMES: usize = 1 << 16;

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
            encoded_ioctl: Arc::new(AtomicBool::new(true)),
            lanes: None,
            lane_errors: Vec::new(),
            info: None,
            btrfs: None,
            resumed: None,
            root_names: None,
            ioctl_refused: None,
            journal: None,
            budget: None,
            pending: None,
            checkpoints: true,
            progress,
        })
    }

    /// Receive subvolumes as real btrfs subvolumes of `btrfs`, the
    /// filesystem DIR is on (see [`super::subvol`]); `None`: as directories
    /// with records (the default). Call before the first command.
    pub fn subvolumes(&mut self, btrfs: Option<Btrfs>) {
        self.btrfs = btrfs;
    }

    /// Whether subvolumes are received as real btrfs subvolumes.
    pub fn receives_subvolumes(&self) -> bool {
        self.btrfs.is_some()
    }

    /// Always decode ENCODED_WRITE data and write it (`--force-decompress`);
    /// by default compressed data is first offered to the target as it is
    /// (`BTRFS_IOC_ENCODED_WRITE`, btrfs only, as root).
    pub fn force_decompress(&mut self, yes: bool) {
        self.encoded_ioctl.store(!yes, Ordering::Relaxed);
    }

    /// Write file data on `threads` worker threads (0 or 1: on this thread
    /// only), with at most `max_bytes` of data queued. Call before the
    /// first command.
    ///
    /// # Errors
    ///
    /// A thread cannot be started.
    pub fn threads(&mut self, threads: usize, max_bytes: usize) -> io::Result<()> {
        self.lanes = None;
        if threads > 1 {
            self.lanes = Some(Lanes {
                pool: Pool::new(threads, max_bytes, Arc::clone(&self.encoded_ioctl))?,
                files: BTreeMap::new(),
            });
        }
        Ok(())
    }

    /// Errors of commands applied by the lanes since the last call (each
    /// already counted against its subvolume), and their notes reported.
    pub fn take_lane_errors(&mut self) -> Vec<ApplyError> {
        let mut errs = std::mem::take(&mut self.lane_errors);
        if let Some(l) = &self.lanes {
            let (e, notes) = l.pool.take_reports();
            for (key, msg) in notes {
                self.note(key, msg);
            }
            if let Some(c) = &mut self.cur {
                c.errors += e.len() as u64;
            }
            errs.extend(e);
        }
        errs
    }

    /// Wait until the lanes have run every job (their errors are then
    /// counted, and returned by the next [`Receiver::take_lane_errors`]).
    pub fn wait_lanes(&mut self) {
        if let Some(l) = &mut self.lanes {
            l.pool.wait_all();
            l.files.clear();
            let errs = self.take_lane_errors();
            self.lane_errors.extend(errs);
        }
    }

    /// A buffer for the stream reader to read the next command into, given
    /// back by the lanes (see [`Receiver::submit`]).
    pub fn buffer(&mut self) -> Vec<u8> {
        self.lanes
            .as_mut()
            .map(|l| l.pool.buffer())
            .unwrap_or_default()
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
        self.wait_lanes();
        self.wcache = None;
        self.journal = None;
        // A complete subvolume drops its resume point; one with errors
        // keeps the previous checkpoint (and both journals).
        self.pending = None;
        let Some(mut cur) = self.cur.take() else {
            return Ok(());
        };
        let fileattrs = std::mem::take(&mut cur.fileattrs);
        for (fd, path, flags) in fileattrs {
            self.set_flags(&fd, &path, flags);
        }
        if cur.errors == 0 && cur.subvolume {
            // The undo journal's trash goes first (see `undo`); then, as
            // btrfs-progs: received UUID and stransid, then read-only.
            undo::drop_subvol_trash(cur.target.root(), &cur.record.uuid.0, None)
                .and_then(|()| {
                    subvol::finish(cur.target.root(), cur.record.uuid.0, cur.record.ctransid)
                })
                .map_err(|e| {
                    Box::new(ApplyError {
                        cmd: None,
                        op: "finish subvolume",
                        path: cur.record.name.clone(),
                        target: Some(self.dir.display_path(&cur.record.name)),
                        path2: None,
                        kind: ApplyErrorKind::Io(e),
                    })
                })?;
            self.drop_resume_point(&cur.record.name);
        } else if cur.errors == 0 {
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
            self.drop_resume_point(&cur.record.name);
        }
        self.progress
            .subvol_done(cur.target.name(), cur.errors == 0);
        Ok(())
    }

    /// Whether this receive takes resume checkpoints (default: it does):
    /// without, a new subvolume gets no start mark either ("Start mark" in
    /// [`crate::resume`]).
    pub fn set_checkpoints(&mut self, on: bool) {
        self.checkpoints = on;
    }

    /// The resume point the last SUBVOL / SNAPSHOT rolled its partial
    /// subvolume back to, if it did: the commands before it are to be
    /// dropped ([`Tracker::resumed`]).
    pub fn take_resumed(&mut self) -> Option<crate::resume::Token> {
        self.resumed.take()
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
        self.info = Some(*info);
        // Out-of-range offsets and sizes first (CLONE names its source
        // below as path2 anyway).
        let res = file_ranges(cmd, &mut None).and_then(|()| {
            if self.journaling() {
                self.journaled(cmd)
            } else {
                self.dispatch(cmd)
            }
        });
        self.track_root(cmd, res.is_ok());
        let Err(kind) = res else {
            return Ok(());
        };
        let path = cmd.path().map(<[u8]>::to_vec).unwrap_or_default();
        let path2 = match cmd {
            Command::Rename { path_to: p, .. }
            | Command::Link { path_link: p, .. }
            | Command::Clone { clone_path: p, .. } => Some(p.to_vec()),
            _ => None,
        };
        let is_subvol = matches!(cmd, Command::Subvol { .. } | Command::Snapshot { .. });
        let disp = |p: &[u8]| {
            if is_subvol {
                Some(self.dir.display_path(p))
            } else {
                self.cur.as_ref().map(|c| c.target.display(p))
            }
        };
        let target = disp(&path);
        // A clone source may live in another subvolume: shown as if in this one.
        let path2 = path2.map(|p| {
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

    /// [`Receiver::dispatch`] with what undoes the command journaled first
    /// (a directory-mode receive past a checkpoint: see `undo`). UNLINK and
    /// RMDIR move the entry to the trash instead.
    fn journaled(&mut self, cmd: &Command<'_>) -> Result<(), ApplyErrorKind> {
        use Command as C;
        let end = |a: u64, b: u64| Some(a.saturating_add(b));
        match cmd {
            C::Mkfile { path, .. }
            | C::Mkdir { path, .. }
            | C::Mknod { path, .. }
            | C::Mkfifo { path, .. }
            | C::Mksock { path, .. }
            | C::Symlink { path, .. } => {
                self.j_create(path)?;
                let r = self.dispatch(cmd);
                if r.is_ok() {
                    self.j_created(path);
                }
                return r;
            }
            // A new name of an existing inode: only the name is new.
            C::Link { path, .. } => {
                self.j_create(path)?;
            }
            C::Rename { path, path_to } => self.j_rename(path, path_to)?,
            C::Unlink { path } | C::Rmdir { path } => {
                let r = self.j_unlink(path, matches!(cmd, C::Rmdir { .. }));
                self.removed(path, r.is_ok());
                return r;
            }
            C::SetXattr { path, name, .. } | C::RemoveXattr { path, name } => {
                self.settle(path);
                self.j_xattr(path, name)?;
            }
            C::Write { path, offset, data } => {
                self.j_data(path, *offset, end(*offset, data.len() as u64))?;
            }
            C::Clone {
                path, offset, len, ..
            } => self.j_data(path, *offset, end(*offset, *len))?,
            C::Truncate { path, size } => self.j_data(path, *size, None)?,
            C::Fallocate {
                path, offset, size, ..
            } => self.j_data(path, *offset, end(*offset, *size))?,
            C::EncodedWrite { path, offset, .. } => {
                let len = encoded::fields(cmd)
                    .and_then(Result::ok)
                    .map_or(u64::MAX, |e| e.unencoded_file_len);
                self.j_data(path, *offset, end(*offset, len))?;
            }
            C::Chmod { path, .. } | C::Chown { path, .. } | C::Utimes { path, .. } => {
                self.j_touch(path)?;
            }
            _ => {}
        }
        self.dispatch(cmd)
    }

    /// One method per command, in the order of the stream's command set.
    fn dispatch(&mut self, cmd: &Command<'_>) -> Result<(), ApplyErrorKind> {
        use Command as C;
        if let Some(w) = &mut self.wcache
            && w.fresh_owner.is_some()
        {
            // What may give the file a set-id bit, an xattr or another owner
            // (through any of its names) ends `fresh_owner`.
            let keeps = match cmd {
                C::Write { .. }
                | C::EncodedWrite { .. }
                | C::Rename { .. }
                | C::Utimes { .. }
                | C::Truncate { .. }
                | C::Fallocate { .. }
                | C::Mkfile { .. }
                | C::Mkdir { .. } => true,
                C::Chown { path, .. } => path.as_ref() == w.path.as_slice(),
                _ => false,
            };
            if !keeps {
                w.fresh_owner = None;
            }
        }
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
            C::Mkfile { path, .. } => self.mkfile(path),
            C::Mkdir { path, .. } => self.mkdir(path),
            C::Mknod {
                path, rdev, mode, ..
            } => self.mknod(path, *mode, *rdev),
            C::Mkfifo { path, .. } => self.mkspecial(path, FileType::Fifo),
            C::Mksock { path, .. } => self.mkspecial(path, FileType::Socket),
            C::Symlink {
                path, path_link, ..
            } => self.symlink(path, path_link),
            C::Rename { path, path_to } => self.rename(path, path_to),
            C::Link { path, path_link } => self.link(path, path_link),
            C::Unlink { path } => self.unlink(path, AtFlags::empty()),
            C::Rmdir { path } => self.unlink(path, AtFlags::REMOVEDIR),
            C::SetXattr { path, name, data } => self.set_xattr(path, name, data),
            C::RemoveXattr { path, name } => self.remove_xattr(path, name),
            C::Write { path, offset, data } => self.write(path, *offset, data),
            C::Clone {
                offset,
                len,
                path,
                clone_uuid,
                clone_ctransid,
                clone_path,
                clone_offset,
            } => self.clone_range(
                path,
                *offset,
                *len,
                uuid_of(clone_uuid),
                *clone_ctransid,
                clone_path,
                *clone_offset,
            ),
            C::Truncate { path, size } => self.truncate(path, *size),
            C::Chmod { path, mode } => self.chmod(path, *mode),
            C::Chown { path, uid, gid } => self.chown(path, *uid, *gid),
            C::Utimes {
                path, atime, mtime, ..
            } => self.utimes(path, *atime, *mtime),
            C::End => self.finish_subvol().map_err(|e| e.kind),
            C::UpdateExtent { .. } => Err(ApplyErrorKind::NoData),
            C::Fallocate {
                path,
                mode,
                offset,
                size,
            } => self.fallocate(path, *mode, *offset, *size),
            C::Fileattr { path, attr } => self.fileattr(path, *attr),
            C::EncodedWrite { path, data, .. } => {
                let e = encoded::fields(cmd).ok_or_else(encoded::not_encoded)??;
                self.encoded_write(path, data, e)
            }
            C::EnableVerity { path, .. } => self.enable_verity(path),
            C::Unknown { .. } => Ok(()),
        }
    }

    /// MKFILE: a new empty regular file, mode 0600 until CHMOD.
    fn mkfile(&mut self, path: &[u8]) -> Result<(), ApplyErrorKind> {
        let l = self.cur()?.target.locate_entry(path)?;
        let f = create_file(&l)?;
        // The new, empty regular file is the one the next WRITEs go to: keep
        // it open (see `wcache`).
        self.wcache = Some(WFile::created(path, f)?);
        Ok(())
    }

    /// MKDIR: a new directory, mode 0700 until CHMOD.
    fn mkdir(&mut self, path: &[u8]) -> Result<(), ApplyErrorKind> {
        let l = self.cur()?.target.locate_entry(path)?;
        rustix::fs::mkdirat(&l.parent, l.name(), Mode::from_raw_mode(0o700))?;
        Ok(())
    }

    /// MKNOD: a device node, FIFO or socket of the type in `mode`, mode
    /// 0600 until CHMOD.
    fn mknod(&mut self, path: &[u8], mode: u64, rdev: u64) -> Result<(), ApplyErrorKind> {
        let ft = FileType::from_raw_mode(
            u32::try_from(mode).map_err(|_| ApplyErrorKind::BadMode(mode))?,
        );
        if !matches!(
            ft,
            FileType::CharacterDevice | FileType::BlockDevice | FileType::Fifo | FileType::Socket
        ) {
            return Err(ApplyErrorKind::BadMode(mode));
        }
        let l = self.cur()?.target.locate_entry(path)?;
        match rustix::fs::mknodat(&l.parent, l.name(), ft, Mode::from_raw_mode(0o600), rdev) {
            // Device nodes need CAP_MKNOD: as an ordinary user this is an
            // error (the subvolume would lack the node, and the commands on
            // it would fail), with what to do about it.
            Err(rustix::io::Errno::PERM)
                if matches!(ft, FileType::CharacterDevice | FileType::BlockDevice)
                    && !rustix::process::geteuid().is_root() =>
            {
                Err(ApplyErrorKind::DeviceNeedsRoot)
            }
            r => Ok(r?),
        }
    }

    /// MKFIFO, MKSOCK: a FIFO or socket (`ft`), mode 0600 until CHMOD.
    fn mkspecial(&mut self, path: &[u8], ft: FileType) -> Result<(), ApplyErrorKind> {
        let l = self.cur()?.target.locate_entry(path)?;
        rustix::fs::mknodat(&l.parent, l.name(), ft, Mode::from_raw_mode(0o600), 0)?;
        Ok(())
    }

    /// SYMLINK: a symbolic link to `link` (its bytes verbatim).
    fn symlink(&mut self, path: &[u8], link: &[u8]) -> Result<(), ApplyErrorKind> {
        if link.contains(&0) {
            return Err(ApplyErrorKind::Invalid("NUL byte in symlink target".into()));
        }
        let l = self.cur()?.target.locate_entry(path)?;
        rustix::fs::symlinkat(std::ffi::OsStr::from_bytes(link), &l.parent, l.name())?;
        Ok(())
    }

    /// RENAME `path` to `to` (replacing what is there, as rename(2)).
    fn rename(&mut self, path: &[u8], to: &[u8]) -> Result<(), ApplyErrorKind> {
        // Lanes need nothing: their jobs hold fds (see `Lanes`).
        let t = &self.cur()?.target;
        let from = t.locate_entry(path)?;
        let dst = t.locate_entry(to)?;
        let r = rustix::fs::renameat(&from.parent, from.name(), &dst.parent, dst.name());
        drop((from, dst));
        self.renamed(path, to, r.is_ok());
        r?;
        Ok(())
    }

    /// LINK: a new name `path` for the existing `link`.
    fn link(&mut self, path: &[u8], link: &[u8]) -> Result<(), ApplyErrorKind> {
        // Its file gets a second name: no more lane jobs for it.
        self.settle(link);
        if matches!(&self.wcache, Some(w) if w.path == link) {
            self.wcache = None;
        }
        let t = &self.cur()?.target;
        let new = t.locate_entry(path)?;
        let old = t.locate_entry(link)?;
        rustix::fs::linkat(
            &old.parent,
            old.name(),
            &new.parent,
            new.name(),
            AtFlags::empty(),
        )?;
        Ok(())
    }

    /// UNLINK (`flags` empty) or RMDIR (`AtFlags::REMOVEDIR`).
    fn unlink(&mut self, path: &[u8], flags: AtFlags) -> Result<(), ApplyErrorKind> {
        let l = self.cur()?.target.locate_entry(path)?;
        let r = rustix::fs::unlinkat(&l.parent, l.name(), flags);
        drop(l);
        self.removed(path, r.is_ok());
        r?;
        Ok(())
    }

    /// SET_XATTR (flags 0: create or replace).
    fn set_xattr(&mut self, path: &[u8], name: &[u8], data: &[u8]) -> Result<(), ApplyErrorKind> {
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
    fn remove_xattr(&mut self, path: &[u8], name: &[u8]) -> Result<(), ApplyErrorKind> {
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

    /// WRITE `data` at `offset` (after the file's queued jobs, if it has
    /// any: then on its lane).
    fn write(&mut self, path: &[u8], offset: u64, data: &[u8]) -> Result<(), ApplyErrorKind> {
        if self.queued(path) {
            let buf = data.to_vec();
            let len = buf.len();
            let op = Op::Write {
                buf,
                start: 0,
                len,
                offset,
            };
            return self.queue_on_lane(path, op);
        }
        self.file(path)?.write_all_at(data, offset)?;
        Ok(())
    }

    /// TRUNCATE to `size`.
    fn truncate(&mut self, path: &[u8], size: u64) -> Result<(), ApplyErrorKind> {
        if self.queued(path) {
            return self.queue_on_lane(path, Op::Truncate(size));
        }
        self.file(path)?.set_len(size)?;
        Ok(())
    }

    /// CHMOD to `mode & 07777`.
    fn chmod(&mut self, path: &[u8], mode: u64) -> Result<(), ApplyErrorKind> {
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
    fn chown(&mut self, path: &[u8], uid: u64, gid: u64) -> Result<(), ApplyErrorKind> {
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
    fn utimes(
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

    /// FALLOCATE with the stream's mode bits (the kernel sends hole punches).
    fn fallocate(
        &mut self,
        path: &[u8],
        mode: u32,
        offset: u64,
        size: u64,
    ) -> Result<(), ApplyErrorKind> {
        if self.queued(path) {
            let op = Op::Fallocate { mode, offset, size };
            return self.queue_on_lane(path, op);
        }
        let f = self.file(path)?;
        rustix::fs::fallocate(f, FallocateFlags::from_bits_retain(mode), offset, size)?;
        Ok(())
    }

    /// FILEATTR: the flags that have an `FS_*_FL` meaning, set at the
    /// subvolume's end ([`Receiver::finish_subvol`]).
    fn fileattr(&mut self, path: &[u8], attr: u64) -> Result<(), ApplyErrorKind> {
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

    /// ENCODED_WRITE (fields `e` checked, `data` its DATA): as it is where
    /// the target takes it, else decoded and written.
    fn encoded_write(
        &mut self,
        path: &[u8],
        data: &[u8],
        e: sys::Encoded<'_>,
    ) -> Result<(), ApplyErrorKind> {
        if self.queued(path) {
            let buf = data.to_vec();
            let len = buf.len();
            let fields = sys::Encoded { data: &[], ..e };
            let op = Op::Encoded {
                buf,
                start: 0,
                len,
                fields,
            };
            return self.queue_on_lane(path, op);
        }
        // Uncompressed data cannot go through the ioctl: plain write.
        if self.encoded_ioctl.load(Ordering::Relaxed) && e.compression != 0 {
            let f = self.file(path)?;
            match sys::encoded_write(f, &e) {
                Ok(()) => return Ok(()),
                Err(err) => match sys::refusal(err) {
                    sys::Refusal::Never => {
                        self.encoded_ioctl.store(false, Ordering::Relaxed);
                        self.ioctl_refused = Some(err);
                        self.progress.encoded_fallback(path, err.into());
                    }
                    sys::Refusal::ThisOne => self.progress.encoded_fallback(path, err.into()),
                    sys::Refusal::Fail => return Err(err.into()),
                },
            }
        } else if let Some(err) = self.ioctl_refused
            && e.compression != 0
        {
            // Given up for good after the target refused it: btrfs-progs
            // tries each time, is refused the same way and says so.
            self.progress.encoded_fallback(path, err.into());
        }
        let bytes = encoded::decode(
            e.compression,
            e.encryption,
            data,
            e.unencoded_len,
            e.unencoded_offset,
            e.unencoded_file_len,
        )?;
        self.file(path)?.write_all_at(&bytes, e.offset)?;
        Ok(())
    }

    /// ENABLE_VERITY: reported once, not applied.
    fn enable_verity(&mut self, path: &[u8]) -> Result<(), ApplyErrorKind> {
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
        let free = match &self.root_names {
            Some(names) if is_top(path) && target::check_path(path).is_ok() => {
                !names.contains(&path[..])
            }
            _ => t
                .locate_entry(path)
                .is_ok_and(|l| matches!(l.lstat(), Err(e) if e.kind() == io::ErrorKind::NotFound)),
        };
        if !free {
            return false;
        }
        if self.journaling() && !matches!(self.j_create(to), Ok(true)) {
            return false;
        }
        let Some(cur) = &self.cur else {
            return false;
        };
        let t = &cur.target;
        let Ok(l) = t.locate_entry(to) else {
            return false;
        };
        if is_file {
            let Ok(f) = create_file(&l) else {
                return false;
            };
            drop(l);
            self.renamed(path, to, false);
            match WFile::created(to, f) {
                Ok(w) => self.wcache = Some(w),
                // Created, but not to be cached: applied from here on by
                // path (the creation is journaled below either way).
                Err(_) => self.wcache = None,
            }
        } else {
            if rustix::fs::mkdirat(&l.parent, l.name(), Mode::from_raw_mode(0o700)).is_err() {
                return false;
            }
            drop(l);
            self.renamed(path, to, false);
        }
        self.root_created(to);
        self.j_created(to);
        true
    }

    /// `path` was created (it names an entry now): tracked if at the root.
    fn root_created(&mut self, path: &[u8]) {
        if let Some(names) = &mut self.root_names
            && is_top(path)
        {
            if names.len() >= ROOT_NAMES {
                self.root_names = None;
            } else {
                names.insert(path.to_vec());
            }
        }
    }

    /// Keep [`Receiver::root_names`] true after `cmd` was applied (`ok`:
    /// it worked). A failed command may have changed anything: the names
    /// are then unknown.
    fn track_root(&mut self, cmd: &Command<'_>, ok: bool) {
        use Command as C;
        let Some(names) = &mut self.root_names else {
            return;
        };
        match cmd {
            C::Mkfile { path, .. }
            | C::Mkdir { path, .. }
            | C::Mknod { path, .. }
            | C::Mkfifo { path, .. }
            | C::Mksock { path, .. }
            | C::Symlink { path, .. }
            | C::Link { path, .. }
                if ok =>
            {
                self.root_created(path);
            }
            C::Rename { path, path_to } if ok => {
                names.remove(&path[..]);
                self.root_created(path_to);
            }
            C::Unlink { path } | C::Rmdir { path } if ok => {
                names.remove(&path[..]);
            }
            C::Mkfile { .. }
            | C::Mkdir { .. }
            | C::Mknod { .. }
            | C::Mkfifo { .. }
            | C::Mksock { .. }
            | C::Symlink { .. }
            | C::Link { .. }
            | C::Rename { .. }
            | C::Unlink { .. }
            | C::Rmdir { .. } => self.root_names = None,
            _ => {}
        }
    }

    /// The cached open file, if `path` names it.
    fn cached_file(&self, path: &[u8]) -> Option<&File> {
        match &self.wcache {
            Some(w) if w.path == path => Some(&w.file),
            _ => None,
        }
    }

    /// After a RENAME `from` → `to` (`ok`: it worked): the cached
    /// directories at or below either path are dropped; the cached file
    /// follows its inode to `to`, or is dropped if a path it lived at is
    /// gone. A failed rename changed nothing, but dropping is always safe.
    fn renamed(&mut self, from: &[u8], to: &[u8], ok: bool) {
        if ok {
            self.j_names_changed();
        }
        if let Some(cur) = &self.cur {
            cur.target.forget(from);
            cur.target.forget(to);
        }
        if let Some(w) = &mut self.wcache {
            if ok && w.path == from {
                w.path.clear();
                w.path.extend_from_slice(to);
            } else if target::is_at_or_under(&w.path, from) || target::is_at_or_under(&w.path, to) {
                self.wcache = None;
            }
        }
        if ok && let Some(l) = &mut self.lanes {
            // The files replaced at `to` keep their jobs but lose their name;
            // those under `from` are now under `to`.
            remove_under(&mut l.files, to);
            let moved = remove_under(&mut l.files, from);
            for (p, f) in moved {
                let mut q = to.to_vec();
                // OK to index: `p` is at or under `from`.
                q.extend_from_slice(&p[from.len()..]);
                l.files.insert(q, f);
            }
        }
    }

    /// After an UNLINK or RMDIR of `path` (tried; `ok`: it worked).
    fn removed(&mut self, path: &[u8], ok: bool) {
        // (A journaled UNLINK or RMDIR moved the entry to the trash, which
        // told the journal: `j_to_trash`.)
        if let Some(cur) = &self.cur {
            cur.target.forget(path);
        }
        if matches!(&self.wcache, Some(w) if target::is_at_or_under(&w.path, path)) {
            self.wcache = None;
        }
        if ok && let Some(l) = &mut self.lanes {
            // Their jobs run on, on files without a name.
            remove_under(&mut l.files, path);
        }
    }

    /// The open file for `path`, from the cache or opened now.
    fn file(&mut self, path: &[u8]) -> Result<&File, ApplyErrorKind> {
        Ok(self.file_arc(path)?.0)
    }

    /// The open file for `path` and whether it has a single link (checked
    /// when it was opened).
    fn file_arc(&mut self, path: &[u8]) -> Result<(&Arc<File>, bool), ApplyErrorKind> {
        let hit = matches!(&self.wcache, Some(w) if w.path == path);
        if !hit {
            self.wcache = None;
            let (f, st) = self.cur()?.target.open_regular_stat(path, true)?;
            self.wcache = Some(WFile {
                path: path.to_vec(),
                file: Arc::new(f),
                single: self.lanes.is_some() && st.st_nlink == 1,
                ino: st.st_ino,
                fresh_owner: None,
            });
        }
        // OK to unwrap: filled just above.
        let w = self.wcache.as_ref().expect("write cache");
        Ok((&w.file, w.single))
    }

    /// `path` names a file with lane jobs (maybe) queued.
    fn queued(&self, path: &[u8]) -> bool {
        self.lanes
            .as_ref()
            .is_some_and(|l| l.files.contains_key(path))
    }

    /// If `path` names a file with lane jobs queued, wait for them; the file
    /// is then the receiver thread's again.
    fn settle(&mut self, path: &[u8]) {
        if let Some(l) = &mut self.lanes
            && let Some(f) = l.files.remove(path)
        {
            l.pool.wait(f.lane, f.last);
        }
    }

    /// Queue `op` on the lane of `path`, a file that has jobs there.
    fn queue_on_lane(&mut self, path: &[u8], op: Op) -> Result<(), ApplyErrorKind> {
        let Some(l) = &mut self.lanes else {
            return Err(ApplyErrorKind::Invalid("no lanes".into()));
        };
        let Some(base) = self.cur.as_ref().map(|c| Arc::clone(&c.base)) else {
            return Err(ApplyErrorKind::NoSubvol);
        };
        let Some(f) = l.files.get_mut(path) else {
            return Err(ApplyErrorKind::Invalid("no lane for the file".into()));
        };
        let job = Job {
            info: self.info.ok_or(ApplyErrorKind::NoSubvol)?,
            path: path.to_vec(),
            base,
            file: Arc::clone(&f.file),
            op,
        };
        f.last = l.pool.submit(f.lane, job);
        Ok(())
    }

    /// If `cmd` is a WRITE or ENCODED_WRITE to send to a lane with its data
    /// where it is (in the stream reader's payload buffer), what to send:
    /// the caller then takes the buffer from the reader and calls
    /// [`Receiver::submit`]. `None`: apply it with [`Receiver::apply`]
    /// (also whenever something is wrong: `apply` then reports it).
    pub fn offload(&mut self, info: &CommandInfo, cmd: &Command<'_>) -> Option<Offload> {
        self.lanes.as_ref()?;
        if self.progress.lists_commands() {
            // A listing shows what happens to each command in stream order
            // (the ENCODED_WRITE fallback line of -vv): applied here.
            return None;
        }
        let (path, data, offset, encoded) = match cmd {
            Command::Write {
                path,
                offset,
                data: Cow::Borrowed(data),
            } => (path, *data, *offset, None),
            Command::EncodedWrite {
                path,
                offset,
                data: Cow::Borrowed(data),
                ..
            } => {
                let e = encoded::fields(cmd)?.ok()?;
                let e = sys::Encoded { data: &[], ..e };
                (path, *data, *offset, Some(e))
            }
            _ => return None,
        };
        if !self.queued(path) && encoded.is_none() && data.len() < LANE_MIN {
            return None;
        }
        if self.journaling() {
            let len = encoded
                .as_ref()
                .map_or(data.len() as u64, |e| e.unencoded_file_len);
            self.j_data(path, offset, Some(offset.saturating_add(len)))
                .ok()?;
        }
        self.lane_file(path)?;
        Some(Offload {
            info: *info,
            path: path.to_vec(),
            len: data.len(),
            offset,
            encoded,
        })
    }

    /// Make sure `path` has a lane (it names a regular file with a single
    /// link); `None`: it cannot have one (or cannot be opened: applying the
    /// command here reports why).
    fn lane_file(&mut self, path: &[u8]) -> Option<()> {
        if self.queued(path) {
            return Some(());
        }
        let (f, single) = self.file_arc(path).ok()?;
        if !single {
            return None;
        }
        let file = Arc::clone(f);
        let ino = self.wcache.as_ref()?.ino;
        let l = self.lanes.as_mut()?;
        if l.files.len() >= LANE_FILES {
            let done = l.pool.done();
            l.files
                .retain(|_, f| done.get(f.lane).is_some_and(|&d| d < f.last));
        }
        let lane = l.pool.pick();
        l.files.insert(
            path.to_vec(),
            LaneFile {
                file,
                ino,
                lane,
                last: 0,
            },
        );
        Some(())
    }

    /// `DIR/<name>` is a subvolume that an earlier receive left incomplete:
    /// writable and without a received UUID (how btrfs-progs and btrbk
    /// recognise a garbled receive).
    fn incomplete_subvolume(&self, name: &[u8]) -> bool {
        let Ok(fd) = rustix::fs::openat(
            self.dir.fd(),
            std::ffi::OsStr::from_bytes(name),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        ) else {
            return false;
        };
        rustix::fs::fstat(&fd).is_ok_and(|st| st.st_ino == subvol::FIRST_FREE)
            && sys::subvol_info(fd.as_fd()).is_ok_and(|i| i.received_uuid == [0; 16])
            && sys::subvol_flags(fd.as_fd()).is_ok_and(|f| f & sys::SUBVOL_RDONLY == 0)
    }

    /// Whether the progress sink lists every command
    /// ([`Progress::lists_commands`]).
    pub fn lists_commands(&self) -> bool {
        self.progress.lists_commands()
    }

    /// Give `cmd` to the progress sink's listing ([`Progress::command`]).
    pub fn list_command(&self, cmd: &Command<'_>) {
        self.progress.command(cmd);
    }

    /// A WRITE or ENCODED_WRITE skimmed by the reader
    /// ([`stream_format::Next::Skimmed`]: its header and the first bytes of
    /// its payload, `prefix`): queue it on its file's lane, which reads the
    /// payload from `input`, checks it and writes it. Returns `false` when it
    /// cannot go to a lane (no lanes, no PATH in `prefix`, a file with
    /// several links, or one that cannot be opened): the caller then reads it
    /// whole and applies it here.
    pub fn skimmed(
        &mut self,
        info: &CommandInfo,
        crc: u32,
        prefix: &[u8],
        input: &Arc<File>,
    ) -> bool {
        if self.lanes.is_none() {
            return false;
        }
        let Some(path) = prefix_path(prefix) else {
            return false;
        };
        // Only its offset is known here: a write that may overwrite data
        // the file held at the checkpoint (data to save) is written
        // through `apply`. An ENCODED_WRITE at or beyond the file's size
        // then (an append: nothing to save but the attributes, journaled
        // here) goes to the lane as in a receive without a journal, where
        // it is decoded, or waits for the ioctl, beside the others; a
        // plain WRITE is written through `apply` (measured, 2 GiB of 48 KiB
        // WRITEs into ext4, load 1.5: 0.96 s on the lanes, 0.84 s so).
        if self.journaling() && !self.j_new(path) {
            let encoded = info.cmd == CommandKind::EncodedWrite.number();
            let appends = encoded && prefix_offset(prefix).is_some_and(|o| self.j_appends(path, o));
            if !appends {
                return false;
            }
        }
        if self.lane_file(path).is_none() {
            return false;
        }
        self.info = Some(*info);
        let op = Op::Stream {
            input: Arc::clone(input),
            crc,
        };
        self.queue_on_lane(path, op).is_ok()
    }

    /// Send an [`Offload`]ed command to its lane, with `buf`, the payload
    /// buffer its data is in, and `data`, where in `buf` the data is
    /// ([`stream_format::StreamReader::data_range`]).
    ///
    /// # Errors
    ///
    /// `data` is not a range of `buf` of the command's data length (a
    /// caller's mistake), or there is no subvolume.
    pub fn submit(
        &mut self,
        o: Offload,
        buf: Vec<u8>,
        data: Option<std::ops::Range<usize>>,
    ) -> Result<(), Box<ApplyError>> {
        let start = data
            .filter(|r| r.len() == o.len && r.end <= buf.len())
            .map(|r| r.start);
        let (op_name, op) = match (start, o.encoded) {
            (Some(start), None) => (
                "WRITE",
                Op::Write {
                    buf,
                    start,
                    len: o.len,
                    offset: o.offset,
                },
            ),
            (Some(start), Some(fields)) => (
                "ENCODED_WRITE",
                Op::Encoded {
                    buf,
                    start,
                    len: o.len,
                    fields,
                },
            ),
            (None, _) => {
                return Err(Box::new(ApplyError {
                    cmd: Some(o.info),
                    op: "WRITE",
                    path: o.path,
                    target: None,
                    path2: None,
                    kind: ApplyErrorKind::Invalid(
                        "internal: data not in its payload buffer".into(),
                    ),
                }));
            }
        };
        self.info = Some(o.info);
        self.queue_on_lane(&o.path, op).map_err(|kind| {
            Box::new(ApplyError {
                cmd: Some(o.info),
                op: op_name,
                target: self.cur.as_ref().map(|c| c.target.display(&o.path)),
                path: o.path,
                path2: None,
                kind,
            })
        })
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
        self.settle(path);
        self.settle(clone_path);
        let cur = self.cur()?;
        let other;
        let src_target = if cur.record.uuid == clone_uuid {
            &cur.target
        } else {
            let found = self
                .btrfs
                .as_ref()
                .map(|b| b.find(clone_uuid.0, clone_ctransid));
            other = match found {
                Some(Ok(f)) => subvol_target(&f.path)?,
                None | Some(Err(NotFound::Missing)) => {
                    let rec = self.find_received(clone_uuid, clone_ctransid, false)?;
                    self.dir.target(&rec.name)?
                }
                Some(Err(e)) => {
                    return Err(match not_found(e, clone_uuid, clone_ctransid) {
                        ApplyErrorKind::ParentMissing { uuid, ctransid, .. } => {
                            ApplyErrorKind::ParentMissing {
                                uuid,
                                ctransid,
                                parent: false,
                            }
                        }
                        k => k,
                    });
                }
            };
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
        let mut recs = self.records.list().map_err(ApplyErrorKind::Io)?;
        if !recs.iter().any(|r| r.uuid == uuid) {
            recs.extend(subvol::received_in(self.dir.fd(), uuid.0));
        }
        let same: Vec<&Record> = recs.iter().filter(|r| r.uuid == uuid).collect();
        let complete = || same.iter().filter(|r| r.state == State::Complete);
        // The one with the stream's ctransid, else the first complete one:
        // btrfs-progs takes a parent or clone source found by UUID whatever
        // its transid (`subvol_uuid_search` ignores it), and a stream made
        // from a received copy carries that copy's ctransid, not the
        // original's (fstests btrfs/110), so a mismatch is no error.
        if let Some(r) = complete()
            .find(|r| r.ctransid == ctransid)
            .or_else(|| complete().next())
        {
            return Ok((*r).clone());
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
        self.root_names = None;
        target::check_subvol_name(name).map_err(TargetError::Path)?;
        // Where the new subvolume starts from: a snapshot of a parent on
        // this btrfs, or a copy of a parent received as a directory here.
        let mut snapshot_of = None;
        let mut copy_of = None;
        if let Some((pu, pc)) = parent {
            match self.btrfs.as_ref().map(|b| b.find(pu.0, pc)) {
                Some(Ok(found)) => snapshot_of = Some(found),
                None | Some(Err(NotFound::Missing)) => {
                    copy_of = Some(self.find_received(pu, pc, true).map_err(|e| {
                        match (e, self.btrfs.as_ref()) {
                            (ApplyErrorKind::ParentMissing { .. }, Some(b)) => {
                                ApplyErrorKind::NotOnFilesystem {
                                    uuid: pu,
                                    ctransid: pc,
                                    mount: b.mount_root().to_path_buf(),
                                    parent: true,
                                }
                            }
                            (e, _) => e,
                        }
                    })?);
                }
                Some(Err(e)) => return Err(not_found(e, pu, pc)),
            }
        }
        // Made afresh after removing a partial one (see `take_partial`):
        // once.
        let mut restarted = false;
        loop {
            let created = match (&self.btrfs, &snapshot_of) {
                (Some(_), Some(found)) => {
                    let dir = subvol::reopen_dir(self.dir.fd())?;
                    sys::snapshot_create(dir.as_fd(), name, found.fd.as_fd())
                }
                (Some(_), None) => {
                    let dir = subvol::reopen_dir(self.dir.fd())?;
                    sys::subvol_create(dir.as_fd(), name)
                }
                (None, _) => rustix::fs::mkdirat(
                    self.dir.fd(),
                    std::ffi::OsStr::from_bytes(name),
                    Mode::from_raw_mode(0o700),
                ),
            };
            match created {
                Ok(()) => break,
                Err(rustix::io::Errno::EXIST) => {
                    let incomplete = if self.btrfs.is_some() {
                        self.incomplete_subvolume(name)
                    } else {
                        self.records.list().is_ok_and(|l| {
                            l.iter()
                                .any(|r| r.name == name && r.state != State::Complete)
                        })
                    };
                    if !incomplete {
                        return Err(ApplyErrorKind::Exists);
                    }
                    match self.take_partial(name, uuid, ctransid, !restarted)? {
                        resume::Partial::Resumed(t) => {
                            self.resumed = Some(t);
                            return Ok(());
                        }
                        resume::Partial::Removed => {
                            restarted = true;
                            continue;
                        }
                        resume::Partial::Kept => {}
                    }
                    let dir = self.dir.display_path(name);
                    return Err(if self.btrfs.is_some() {
                        ApplyErrorKind::ExistsIncompleteSubvol { dir }
                    } else {
                        ApplyErrorKind::ExistsIncomplete {
                            dir,
                            record: self.records.path_of(name),
                        }
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        let record = Record {
            name: name.to_vec(),
            uuid,
            ctransid,
            parent,
            state: State::Incomplete,
        };
        // A subvolume keeps its received UUID in its root item (set at its
        // end); a directory needs a record, incomplete until its end.
        if self.btrfs.is_none()
            && let Err(e) = self.records.write(&self.dir, &record)
        {
            // Nothing was received: leave nothing behind (the directory is
            // empty, just made).
            let _ = rustix::fs::unlinkat(
                self.dir.fd(),
                std::ffi::OsStr::from_bytes(name),
                rustix::fs::AtFlags::REMOVEDIR,
            );
            return Err(ApplyErrorKind::RecordWrite(e));
        }
        let target = self.dir.target(name)?;
        self.progress.subvol_start(name, parent.is_some());
        // Current from here on, so a failed copy leaves it incomplete and
        // the commands that follow are counted against it.
        let base = Arc::new(target.display(b""));
        self.cur = Some(Current {
            target,
            record,
            errors: 0,
            fileattrs: Vec::new(),
            base,
            subvolume: self.btrfs.is_some(),
        });
        self.mark_start(name, uuid.0, ctransid);
        if let Some(p) = copy_of
            && let Some(cur) = &self.cur
        {
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
        if parent.is_none() {
            // A new subvolume (or directory) is empty.
            self.root_names = Some(HashSet::new());
        }
        Ok(())
    }
}

/// The error for a parent or clone source that [`subvol::Btrfs::find`] did
/// not find.
fn not_found(e: NotFound, uuid: Uuid, ctransid: u64) -> ApplyErrorKind {
    match e {
        NotFound::Missing => ApplyErrorKind::ParentMissing {
            uuid,
            ctransid,
            parent: true,
        },
        NotFound::Unreachable(p) => ApplyErrorKind::Invalid(format!(
            "the subvolume with uuid {uuid} ({}) is not below the mounted subvolume: give the mount of the top level with -m",
            p.escape_ascii()
        )),
        NotFound::Io(e) => ApplyErrorKind::Io(e),
    }
}

/// A clone source found on the filesystem at `path`, as a [`Target`].
fn subvol_target(path: &std::path::Path) -> Result<Target, ApplyErrorKind> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(ApplyErrorKind::Invalid(format!(
            "cannot use {} as a clone source",
            path.display()
        )));
    };
    let dir = ReceiveDir::open(parent)?;
    Ok(dir.target(name.as_bytes())?)
}

/// Create a new regular file at `l` (`O_EXCL`, never following a final
/// symlink), open for reading and writing, mode 0600 until CHMOD.
/// A stream path of an entry in the subvolume root (one component).
fn is_top(path: &[u8]) -> bool {
    !path.is_empty() && !path.contains(&b'/')
}

fn create_file(l: &target::Located<'_>) -> Result<File, ApplyErrorKind> {
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(&l.parent, l.name(), flags, Mode::from_raw_mode(0o600))?;
    Ok(File::from(fd))
}

use std::os::unix::ffi::OsStrExt as _;

/// The PATH attribute among the attributes in `prefix` (the start of a
/// WRITE or ENCODED_WRITE payload) before DATA, if it is there whole (the
/// lane checks it against the whole, checked, command).
fn prefix_path(prefix: &[u8]) -> Option<&[u8]> {
    prefix_attr(prefix, stream_format::Attr::Path.number())?.0
}

/// The FILE_OFFSET attribute among the attributes in `prefix` (as
/// [`prefix_path`]), if it is there once, whole and 8 bytes long; `None`
/// also when it appears twice (the caller then reads the command whole).
fn prefix_offset(prefix: &[u8]) -> Option<u64> {
    match prefix_attr(prefix, stream_format::Attr::FileOffset.number())? {
        (Some(value), 1) => Some(u64::from_le_bytes(value.try_into().ok()?)),
        _ => None,
    }
}

/// Attribute `ty` among the attributes in `prefix` before DATA: its last
/// value and how many times it appears; `None` when the attributes before
/// DATA are not all there whole.
fn prefix_attr(prefix: &[u8], ty: u16) -> Option<(Option<&[u8]>, usize)> {
    let data_ty = stream_format::Attr::Data.number();
    let mut pos = 0usize;
    let mut found = (None, 0usize);
    loop {
        let h = prefix.get(pos..pos.checked_add(4)?)?;
        let t = u16::from_le_bytes([*h.first()?, *h.get(1)?]);
        if t == data_ty {
            return Some(found);
        }
        let len = usize::from(u16::from_le_bytes([*h.get(2)?, *h.get(3)?]));
        let start = pos.checked_add(4)?;
        let end = start.checked_add(len)?;
        let value = prefix.get(start..end)?;
        if t == ty {
            found = (Some(value), found.1.saturating_add(1));
        }
        pos = end;
    }
}

/// Remove the entries at or under `path` from `files`; returns them.
fn remove_under(files: &mut BTreeMap<Vec<u8>, LaneFile>, path: &[u8]) -> Vec<(Vec<u8>, LaneFile)> {
    let mut out = Vec::new();
    if let Some(f) = files.remove(path) {
        out.push((path.to_vec(), f));
    }
    // Entries under `path/` sort between `path/` and `path0` ('0' follows '/').
    let mut lo = path.to_vec();
    lo.push(b'/');
    let mut hi = path.to_vec();
    hi.push(b'0');
    let keys: Vec<Vec<u8>> = files.range(lo..hi).map(|(k, _)| k.clone()).collect();
    for k in keys {
        if let Some(f) = files.remove(&k) {
            out.push((k, f));
        }
    }
    out
}

/// The largest file offset (and size) a file can have: `loff_t` is signed.
const MAX_FILE_OFFSET: u64 = i64::MAX.unsigned_abs();

/// Refuse a TRUNCATE size, or a WRITE, CLONE, FALLOCATE or ENCODED_WRITE
/// range, that reaches past the largest file offset, with a message naming
/// the field (the caller adds the command, its stream offset and the path),
/// instead of the conversion error the system call wrapper would give.
/// For CLONE, `path2` gets the source path the message names.
fn file_ranges(cmd: &Command<'_>, path2: &mut Option<Vec<u8>>) -> Result<(), ApplyErrorKind> {
    use Command as C;
    let data_len = |d: &[u8]| u64::try_from(d.len()).unwrap_or(u64::MAX);
    let checks: Vec<(&str, u64, u64)> = match cmd {
        C::Truncate { size, .. } => vec![("size", *size, 0)],
        C::Write { offset, data, .. } => vec![("offset", *offset, data_len(&data[..]))],
        C::Clone {
            offset,
            len,
            clone_offset,
            ..
        } => vec![
            ("offset", *offset, *len),
            ("clone offset", *clone_offset, *len),
        ],
        C::Fallocate { offset, size, .. } => vec![("offset", *offset, *size)],
        C::EncodedWrite {
            offset,
            unencoded_file_len,
            ..
        } => vec![("offset", *offset, *unencoded_file_len)],
        _ => Vec::new(),
    };
    for (what, at, len) in checks {
        if at.checked_add(len).is_none_or(|end| end > MAX_FILE_OFFSET) {
            let range = if len == 0 {
                format!("{what} {at}")
            } else {
                format!("{what} {at} + length {len}")
            };
            if let C::Clone { clone_path, .. } = cmd {
                *path2 = Some(clone_path.to_vec());
            }
            return Err(ApplyErrorKind::Invalid(format!(
                "{range} is past the largest file offset {MAX_FILE_OFFSET} (2^63 - 1)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! One test per command, each on a scratch directory: the command's
    //! effect as `cmds/receive.c` defines it (creations at mode 0600/0700
    //! until CHMOD, rename(2), link(2) with PATH as the new name, …), and
    //! the errors it must give.
    use super::*;
    use crate::receive::NoProgress;
    use std::borrow::Cow;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    use std::path::Path;
    use stream_format::Timespec as StreamTime;

    const UUID: [u8; 16] = [7; 16];

    fn b(s: &str) -> Cow<'static, [u8]> {
        Cow::Owned(s.as_bytes().to_vec())
    }

    fn info(cmd: &Command<'_>) -> CommandInfo {
        CommandInfo {
            offset: 17,
            index: 1,
            cmd: cmd.kind().map_or(99, CommandKind::number),
            len: 0,
            stream: 0,
            version: 2,
        }
    }

    /// Receive SUBVOL "s" into `dir`, then `cmds`; the result of the last.
    fn run_in(dir: &Path, cmds: &[Command<'_>]) -> Result<(), Box<ApplyError>> {
        let mut p = NoProgress;
        let mut rx = Receiver::new(dir, &mut p).unwrap();
        let subvol = Command::Subvol {
            path: b("s"),
            uuid: UUID,
            ctransid: 5,
        };
        rx.apply(&info(&subvol), &subvol).unwrap();
        let mut last = Ok(());
        for c in cmds {
            last = rx.apply(&info(c), c);
        }
        rx.finish_subvol().unwrap();
        last
    }

    /// [`run_in`] a new scratch directory; the directory and the result.
    fn run(cmds: &[Command<'_>]) -> (tempfile::TempDir, Result<(), Box<ApplyError>>) {
        let d = tempfile::tempdir().unwrap();
        let r = run_in(d.path(), cmds);
        (d, r)
    }

    fn mkfile(p: &str) -> Command<'static> {
        Command::Mkfile {
            path: b(p),
            ino: 257,
        }
    }

    fn write(p: &str, offset: u64, data: &[u8]) -> Command<'static> {
        Command::Write {
            path: b(p),
            offset,
            data: Cow::Owned(data.to_vec()),
        }
    }

    fn kind_of(r: Result<(), Box<ApplyError>>) -> ApplyErrorKind {
        r.unwrap_err().kind
    }

    fn errno_of(r: Result<(), Box<ApplyError>>) -> Option<i32> {
        match kind_of(r) {
            ApplyErrorKind::Io(e) => e.raw_os_error(),
            ApplyErrorKind::Target(TargetError::Io(e)) => e.raw_os_error(),
            k => panic!("not an OS error: {k}"),
        }
    }

    #[test]
    fn subvol_makes_the_directory_and_end_marks_it_complete() {
        let (d, r) = run(&[Command::End]);
        r.unwrap();
        let m = std::fs::metadata(d.path().join("s")).unwrap();
        assert!(m.is_dir());
        let dir = ReceiveDir::open(d.path()).unwrap();
        let recs = Records::open(&dir).unwrap().list().unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].uuid, Uuid(UUID));
        assert_eq!(recs[0].ctransid, 5);
        assert_eq!(recs[0].state, State::Complete);
        // Again into the same DIR: the name is taken.
        let mut p = NoProgress;
        let mut rx = Receiver::new(d.path(), &mut p).unwrap();
        let again = Command::Subvol {
            path: b("s"),
            uuid: UUID,
            ctransid: 5,
        };
        let e = rx.apply(&info(&again), &again).unwrap_err();
        assert!(matches!(e.kind, ApplyErrorKind::Exists), "{e}");
    }

    #[test]
    fn a_failed_command_leaves_the_subvolume_incomplete() {
        let d = tempfile::tempdir().unwrap();
        let mut p = NoProgress;
        let mut rx = Receiver::new(d.path(), &mut p).unwrap();
        let s = Command::Subvol {
            path: b("s"),
            uuid: UUID,
            ctransid: 5,
        };
        rx.apply(&info(&s), &s).unwrap();
        rx.count_error();
        rx.finish_subvol().unwrap();
        let dir = ReceiveDir::open(d.path()).unwrap();
        let recs = Records::open(&dir).unwrap().list().unwrap();
        assert_eq!(recs[0].state, State::Incomplete);
    }

    #[test]
    fn snapshot_copies_its_parent_preferably_with_the_streams_transid_and_needs_it() {
        let (d, r) = run(&[mkfile("f"), write("f", 0, b"parent")]);
        r.unwrap();
        let mut p = NoProgress;
        let mut rx = Receiver::new(d.path(), &mut p).unwrap();
        let snap = |name: &str, clone_ctransid| Command::Snapshot {
            path: b(name),
            uuid: [8; 16],
            ctransid: 6,
            clone_uuid: UUID,
            clone_ctransid,
        };
        rx.apply(&info(&snap("t", 5)), &snap("t", 5)).unwrap();
        rx.finish_subvol().unwrap();
        assert_eq!(std::fs::read(d.path().join("t/f")).unwrap(), b"parent");
        // The parent has ctransid 5, not 4: used all the same, as
        // btrfs-progs uses a parent found by UUID.
        rx.apply(&info(&snap("t4", 4)), &snap("t4", 4)).unwrap();
        rx.finish_subvol().unwrap();
        assert_eq!(std::fs::read(d.path().join("t4/f")).unwrap(), b"parent");
        // A second one with the UUID, ctransid 7: the one with the
        // stream's transid is taken.
        let s2 = Command::Subvol {
            path: b("s2"),
            uuid: UUID,
            ctransid: 7,
        };
        for c in [s2, mkfile("f"), write("f", 0, b"second")] {
            rx.apply(&info(&c), &c).unwrap();
        }
        rx.finish_subvol().unwrap();
        for (name, transid, want) in [("v7", 7, &b"second"[..]), ("v5", 5, b"parent")] {
            rx.apply(&info(&snap(name, transid)), &snap(name, transid))
                .unwrap();
            rx.finish_subvol().unwrap();
            let got = std::fs::read(d.path().join(name).join("f")).unwrap();
            assert_eq!(got, want, "{name}");
        }
        let other = Command::Snapshot {
            path: b("u"),
            uuid: [9; 16],
            ctransid: 6,
            clone_uuid: [1; 16],
            clone_ctransid: 5,
        };
        let e = rx.apply(&info(&other), &other).unwrap_err();
        assert!(
            matches!(e.kind, ApplyErrorKind::ParentMissing { .. }),
            "{e}"
        );
    }

    #[test]
    fn a_command_before_subvol_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let mut p = NoProgress;
        let mut rx = Receiver::new(d.path(), &mut p).unwrap();
        let c = mkfile("f");
        let e = rx.apply(&info(&c), &c).unwrap_err();
        assert!(matches!(e.kind, ApplyErrorKind::NoSubvol), "{e}");
    }

    #[test]
    fn mkfile_creates_an_empty_file_0600_and_refuses_an_existing_name() {
        let (d, r) = run(&[mkfile("f")]);
        r.unwrap();
        let m = std::fs::symlink_metadata(d.path().join("s/f")).unwrap();
        assert!(m.is_file());
        assert_eq!(m.len(), 0);
        assert_eq!(m.permissions().mode() & 0o7777, 0o600);
        let (_d, r) = run(&[mkfile("f"), mkfile("f")]);
        assert_eq!(errno_of(r), Some(libc_eexist()));
    }

    fn libc_eexist() -> i32 {
        rustix::io::Errno::EXIST.raw_os_error()
    }

    #[test]
    fn mkdir_creates_a_directory_0700() {
        let (d, r) = run(&[Command::Mkdir {
            path: b("d"),
            ino: 257,
        }]);
        r.unwrap();
        let m = std::fs::symlink_metadata(d.path().join("s/d")).unwrap();
        assert!(m.is_dir());
        assert_eq!(m.permissions().mode() & 0o7777, 0o700);
    }

    #[test]
    fn mknod_makes_the_type_of_its_mode_and_refuses_others() {
        let mk = |mode| Command::Mknod {
            path: b("n"),
            ino: 257,
            rdev: 0,
            mode,
        };
        let (d, r) = run(&[mk(0o10644)]);
        r.unwrap();
        let m = std::fs::symlink_metadata(d.path().join("s/n")).unwrap();
        assert!(m.file_type().is_fifo());
        // A regular file or a directory is not MKNOD's to make.
        let (_d, r) = run(&[mk(0o100644)]);
        assert!(matches!(kind_of(r), ApplyErrorKind::BadMode(0o100644)));
        let (_d, r) = run(&[mk(1 << 40)]);
        assert!(matches!(kind_of(r), ApplyErrorKind::BadMode(_)));
    }

    #[test]
    fn mkfifo_and_mksock_make_their_types() {
        let (d, r) = run(&[
            Command::Mkfifo {
                path: b("p"),
                ino: 257,
                rdev: Some(0),
                mode: Some(0o10644),
            },
            Command::Mksock {
                path: b("k"),
                ino: 258,
                rdev: None,
                mode: None,
            },
        ]);
        r.unwrap();
        let p = std::fs::symlink_metadata(d.path().join("s/p")).unwrap();
        assert!(p.file_type().is_fifo());
        assert_eq!(p.permissions().mode() & 0o7777, 0o600);
        let k = std::fs::symlink_metadata(d.path().join("s/k")).unwrap();
        assert!(k.file_type().is_socket());
    }

    #[test]
    fn symlink_stores_its_target_verbatim() {
        let (d, r) = run(&[Command::Symlink {
            path: b("l"),
            ino: 257,
            path_link: b("/etc/../x y"),
        }]);
        r.unwrap();
        let t = std::fs::read_link(d.path().join("s/l")).unwrap();
        assert_eq!(t, Path::new("/etc/../x y"));
        let (_d, r) = run(&[Command::Symlink {
            path: b("l"),
            ino: 257,
            path_link: Cow::Owned(b"a\0b".to_vec()),
        }]);
        assert!(matches!(kind_of(r), ApplyErrorKind::Invalid(_)));
    }

    #[test]
    fn rename_moves_and_replaces_and_stays_inside() {
        let (d, r) = run(&[
            mkfile("a"),
            write("a", 0, b"A"),
            mkfile("b"),
            Command::Rename {
                path: b("a"),
                path_to: b("b"),
            },
        ]);
        r.unwrap();
        assert!(!d.path().join("s/a").exists());
        assert_eq!(std::fs::read(d.path().join("s/b")).unwrap(), b"A");
        let (d, r) = run(&[
            mkfile("a"),
            Command::Rename {
                path: b("a"),
                path_to: b("../escaped"),
            },
        ]);
        let e = r.unwrap_err();
        assert!(
            matches!(e.kind, ApplyErrorKind::Target(TargetError::Path(_))),
            "{e}"
        );
        assert_eq!(
            e.path2.as_ref().map(|p| p.0.as_slice()),
            Some(&b"../escaped"[..])
        );
        assert!(!d.path().join("escaped").exists());
    }

    #[test]
    fn link_gives_the_file_a_second_name() {
        let (d, r) = run(&[
            mkfile("a"),
            write("a", 0, b"A"),
            Command::Link {
                path: b("b"),
                path_link: b("a"),
            },
        ]);
        r.unwrap();
        let m = std::fs::metadata(d.path().join("s/b")).unwrap();
        assert_eq!(m.nlink(), 2);
        assert_eq!(std::fs::read(d.path().join("s/b")).unwrap(), b"A");
    }

    #[test]
    fn unlink_and_rmdir_remove_their_kind_only() {
        let (d, r) = run(&[
            mkfile("f"),
            Command::Mkdir {
                path: b("d"),
                ino: 258,
            },
            Command::Unlink { path: b("f") },
            Command::Rmdir { path: b("d") },
        ]);
        r.unwrap();
        assert_eq!(std::fs::read_dir(d.path().join("s")).unwrap().count(), 0);
        let (_d, r) = run(&[
            Command::Mkdir {
                path: b("d"),
                ino: 258,
            },
            Command::Unlink { path: b("d") },
        ]);
        assert!(errno_of(r).is_some());
        let (_d, r) = run(&[mkfile("f"), Command::Rmdir { path: b("f") }]);
        assert_eq!(errno_of(r), Some(rustix::io::Errno::NOTDIR.raw_os_error()));
    }

    #[test]
    fn set_and_remove_xattr() {
        let (d, r) = run(&[
            mkfile("f"),
            Command::SetXattr {
                path: b("f"),
                name: b("user.a"),
                data: b("1"),
            },
            Command::SetXattr {
                path: b("f"),
                name: b("user.b"),
                data: b("2"),
            },
            Command::RemoveXattr {
                path: b("f"),
                name: b("user.a"),
            },
        ]);
        r.unwrap();
        let f = d.path().join("s/f");
        let mut buf = [0u8; 16];
        let n = rustix::fs::lgetxattr(&f, "user.b", &mut buf).unwrap();
        assert_eq!(&buf[..n], b"2");
        assert_eq!(
            rustix::fs::lgetxattr(&f, "user.a", &mut buf).unwrap_err(),
            rustix::io::Errno::NODATA
        );
    }

    #[test]
    fn write_places_data_at_its_offset() {
        let (d, r) = run(&[mkfile("f"), write("f", 3, b"xy"), write("f", 0, b"ab")]);
        r.unwrap();
        assert_eq!(std::fs::read(d.path().join("s/f")).unwrap(), b"ab\0xy");
        // Only into a regular file.
        let (_d, r) = run(&[
            Command::Mkdir {
                path: b("d"),
                ino: 257,
            },
            write("d", 0, b"x"),
        ]);
        assert!(r.is_err());
    }

    #[test]
    fn clone_copies_a_range_within_the_subvolume() {
        let (d, r) = run(&[
            mkfile("a"),
            write("a", 0, b"0123456789"),
            mkfile("b"),
            Command::Clone {
                offset: 2,
                len: 4,
                path: b("b"),
                clone_uuid: UUID,
                clone_ctransid: 5,
                clone_path: b("a"),
                clone_offset: 3,
            },
        ]);
        r.unwrap();
        assert_eq!(std::fs::read(d.path().join("s/b")).unwrap(), b"\0\x003456");
        // From a subvolume that was never received here.
        let (_d, r) = run(&[
            mkfile("b"),
            Command::Clone {
                offset: 0,
                len: 4,
                path: b("b"),
                clone_uuid: [3; 16],
                clone_ctransid: 5,
                clone_path: b("a"),
                clone_offset: 0,
            },
        ]);
        assert!(matches!(
            kind_of(r),
            ApplyErrorKind::ParentMissing { parent: false, .. }
        ));
    }

    #[test]
    fn truncate_sets_the_size() {
        let (d, r) = run(&[
            mkfile("f"),
            write("f", 0, b"abcdef"),
            Command::Truncate {
                path: b("f"),
                size: 2,
            },
        ]);
        r.unwrap();
        assert_eq!(std::fs::read(d.path().join("s/f")).unwrap(), b"ab");
    }

    #[test]
    fn chmod_sets_permission_bits_only() {
        let (d, r) = run(&[
            Command::Mkdir {
                path: b("d"),
                ino: 257,
            },
            Command::Chmod {
                path: b("d"),
                mode: 0o41755,
            },
        ]);
        r.unwrap();
        let m = std::fs::metadata(d.path().join("s/d")).unwrap();
        assert!(m.is_dir());
        assert_eq!(m.permissions().mode() & 0o7777, 0o1755);
    }

    #[test]
    fn chown_sets_owners_and_refuses_minus_one() {
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        let (d, r) = run(&[
            mkfile("f"),
            Command::Chown {
                path: b("f"),
                uid: uid.into(),
                gid: gid.into(),
            },
        ]);
        r.unwrap();
        let m = std::fs::metadata(d.path().join("s/f")).unwrap();
        assert_eq!((m.uid(), m.gid()), (uid, gid));
        let (_d, r) = run(&[
            mkfile("f"),
            Command::Chown {
                path: b("f"),
                uid: u32::MAX.into(),
                gid: 0,
            },
        ]);
        assert!(matches!(kind_of(r), ApplyErrorKind::Invalid(_)));
    }

    #[test]
    fn chown_to_the_owner_a_new_file_has_still_clears_set_id_bits_after_a_chmod() {
        // chown(2) to the same owner clears S_ISUID (and S_ISGID with
        // group execute): a CHOWN skipped because the new file already has
        // that owner must not keep them.
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        let chown = Command::Chown {
            path: b("f"),
            uid: uid.into(),
            gid: gid.into(),
        };
        let chmod = Command::Chmod {
            path: b("f"),
            mode: 0o6755,
        };
        let (d, r) = run(&[
            mkfile("f"),
            write("f", 0, b"x"),
            chmod.clone(),
            chown.clone(),
        ]);
        r.unwrap();
        let m = std::fs::metadata(d.path().join("s/f")).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o755);
        // In the kernel's order (CHOWN, then CHMOD) the bits stay.
        let (d, r) = run(&[mkfile("f"), write("f", 0, b"x"), chown, chmod]);
        r.unwrap();
        let m = std::fs::metadata(d.path().join("s/f")).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o6755);
        assert_eq!((m.uid(), m.gid()), (uid, gid));
    }

    #[test]
    fn utimes_sets_atime_and_mtime_without_following_symlinks() {
        let t = |sec| StreamTime { sec, nsec: 5 };
        let (d, r) = run(&[
            Command::Symlink {
                path: b("l"),
                ino: 257,
                path_link: b("nowhere"),
            },
            Command::Utimes {
                path: b("l"),
                atime: t(1000),
                mtime: t(2000),
                ctime: t(3000),
                otime: None,
            },
        ]);
        r.unwrap();
        let m = std::fs::symlink_metadata(d.path().join("s/l")).unwrap();
        assert_eq!((m.atime(), m.atime_nsec()), (1000, 5));
        assert_eq!((m.mtime(), m.mtime_nsec()), (2000, 5));
    }

    #[test]
    fn update_extent_is_refused() {
        let (_d, r) = run(&[
            mkfile("f"),
            Command::UpdateExtent {
                path: b("f"),
                offset: 0,
                size: 4096,
            },
        ]);
        assert!(matches!(kind_of(r), ApplyErrorKind::NoData));
    }

    #[test]
    fn fallocate_punches_a_hole() {
        let (d, r) = run(&[
            mkfile("f"),
            write("f", 0, &[1; 8192]),
            Command::Fallocate {
                path: b("f"),
                mode: 3,
                offset: 0,
                size: 4096,
            },
        ]);
        r.unwrap();
        let got = std::fs::read(d.path().join("s/f")).unwrap();
        assert_eq!(got.len(), 8192);
        assert!(got[..4096].iter().all(|&x| x == 0));
        assert!(got[4096..].iter().all(|&x| x == 1));
    }

    #[test]
    fn fileattr_flags_are_set_at_the_end() {
        // NOATIME (1 << 9): set after the commands that follow it, at END.
        let (d, r) = run(&[
            mkfile("f"),
            Command::Fileattr {
                path: b("f"),
                attr: 1 << 9,
            },
            write("f", 0, b"x"),
        ]);
        r.unwrap();
        let f = std::fs::File::open(d.path().join("s/f")).unwrap();
        if let Ok(flags) = rustix::fs::ioctl_getflags(&f) {
            assert!(flags.contains(IFlags::NOATIME), "{flags:?}");
        }
        assert_eq!(std::fs::read(d.path().join("s/f")).unwrap(), b"x");
    }

    #[test]
    fn encoded_write_decodes_where_the_ioctl_is_refused() {
        let plain = b"hello hello hello hello".repeat(10);
        let z = zstd::encode_all(&plain[..], 3).unwrap();
        let (d, r) = run(&[
            mkfile("f"),
            Command::EncodedWrite {
                path: b("f"),
                offset: 0,
                unencoded_file_len: 100,
                unencoded_len: plain.len() as u64,
                unencoded_offset: 6,
                compression: Some(2),
                encryption: Some(0),
                data: Cow::Owned(z),
            },
        ]);
        r.unwrap();
        assert_eq!(std::fs::read(d.path().join("s/f")).unwrap(), &plain[6..106]);
        let (_d, r) = run(&[
            mkfile("f"),
            Command::EncodedWrite {
                path: b("f"),
                offset: 0,
                unencoded_file_len: 10,
                unencoded_len: 10,
                unencoded_offset: 0,
                compression: Some(2),
                encryption: Some(1),
                data: b("xx"),
            },
        ]);
        assert!(r.is_err());
    }

    #[test]
    fn a_refused_encoded_write_is_reported_each_time_it_is_decoded() {
        // Off btrfs the ioctl is refused (ENOTTY): the first ENCODED_WRITE
        // says why it is decoded instead, and so does every later one (as
        // btrfs-progs, which tries each time); --force-decompress says
        // nothing.
        struct Log(std::sync::Mutex<Vec<(Vec<u8>, Option<i32>)>>);
        impl Progress for Log {
            fn encoded_fallback(&self, path: &[u8], err: std::io::Error) {
                self.0
                    .lock()
                    .unwrap()
                    .push((path.to_vec(), err.raw_os_error()));
            }
        }
        let d = tempfile::tempdir().unwrap();
        let on_btrfs = rustix::fs::statfs(d.path()).unwrap().f_type == 0x9123_683e;
        let plain = b"hello hello hello hello".repeat(10);
        let z = zstd::encode_all(&plain[..], 3).unwrap();
        let ew = |p: &'static str, offset: u64| Command::EncodedWrite {
            path: b(p),
            offset,
            unencoded_file_len: plain.len() as u64,
            unencoded_len: plain.len() as u64,
            unencoded_offset: 0,
            compression: Some(2),
            encryption: Some(0),
            data: Cow::Owned(z.clone()),
        };
        for force in [false, true] {
            let mut p = Log(std::sync::Mutex::new(Vec::new()));
            {
                let mut rx = Receiver::new(d.path(), &mut p).unwrap();
                rx.force_decompress(force);
                let name = if force { "t" } else { "s" };
                let cmds = [
                    Command::Subvol {
                        path: b(name),
                        uuid: UUID,
                        ctransid: 5,
                    },
                    mkfile("f"),
                    mkfile("g"),
                    ew("f", 0),
                    ew("g", 0),
                    ew("f", plain.len() as u64),
                ];
                for c in &cmds {
                    rx.apply(&info(c), c).unwrap();
                }
                rx.finish_subvol().unwrap();
                let got = std::fs::read(d.path().join(name).join("f")).unwrap();
                assert_eq!(got, plain.repeat(2));
            }
            let log = p.0.into_inner().unwrap();
            if force {
                assert!(log.is_empty(), "{log:?}");
            } else if !on_btrfs {
                let enotty = Some(rustix::io::Errno::NOTTY.raw_os_error());
                let want: Vec<(Vec<u8>, Option<i32>)> = ["f", "g", "f"]
                    .iter()
                    .map(|p| (p.as_bytes().to_vec(), enotty))
                    .collect();
                assert_eq!(log, want);
            }
        }
    }

    #[test]
    fn an_orphan_name_in_a_new_subvolume_is_known_free_or_taken_without_a_lookup() {
        // The MKFILE + RENAME shortcut needs the orphan name free; in a new
        // subvolume the receiver knows its root's names. Taken: the
        // shortcut is refused (the caller then applies MKFILE, which fails
        // as in stream order); free again after a rename or unlink.
        let d = tempfile::tempdir().unwrap();
        let mut p = NoProgress;
        let mut rx = Receiver::new(d.path(), &mut p).unwrap();
        let cmds = [
            Command::Subvol {
                path: b("s"),
                uuid: UUID,
                ctransid: 5,
            },
            mkfile("o1"),
            Command::Mkdir {
                path: b("dir"),
                ino: 0,
            },
            mkfile("o2"),
        ];
        for c in &cmds {
            rx.apply(&info(c), c).unwrap();
        }
        assert!(rx.root_names.is_some());
        // Taken (made by MKFILE): refused, nothing made at the new name.
        assert!(!rx.create_renamed(&mkfile("o1"), b"dir/a"));
        assert!(!d.path().join("s/dir/a").exists());
        let m = mkfile("o1");
        let e = rx.apply(&info(&m), &m).unwrap_err();
        assert_eq!(
            e.io_error().and_then(io::Error::raw_os_error),
            Some(libc_eexist())
        );
        // Renamed away and unlinked: free.
        for c in [
            Command::Rename {
                path: b("o1"),
                path_to: b("dir/x"),
            },
            Command::Unlink { path: b("o2") },
        ] {
            rx.apply(&info(&c), &c).unwrap();
        }
        assert!(rx.create_renamed(&mkfile("o1"), b"dir/a"));
        assert!(rx.create_renamed(&mkfile("o2"), b"top"));
        assert!(d.path().join("s/dir/a").is_file() && d.path().join("s/top").is_file());
        assert!(!d.path().join("s/o1").exists() && !d.path().join("s/o2").exists());
        // "top" was made at the root by the shortcut: taken.
        assert!(!rx.create_renamed(&mkfile("top"), b"dir/b"));
        // A failed command leaves the names unknown: the filesystem is asked.
        let bad = Command::Rename {
            path: b("missing"),
            path_to: b("other"),
        };
        assert!(rx.apply(&info(&bad), &bad).is_err());
        assert!(rx.root_names.is_none());
        assert!(!rx.create_renamed(&mkfile("top"), b"dir/b"));
        assert!(rx.create_renamed(&mkfile("o3"), b"dir/c"));
        rx.finish_subvol().unwrap();
    }

    #[test]
    fn enable_verity_is_a_note_and_unknown_commands_are_ignored() {
        struct Count(std::sync::atomic::AtomicUsize);
        impl Progress for Count {
            fn note(&self, _: &str) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let d = tempfile::tempdir().unwrap();
        let mut p = Count(0.into());
        {
            let mut rx = Receiver::new(d.path(), &mut p).unwrap();
            let cmds = [
                Command::Subvol {
                    path: b("s"),
                    uuid: UUID,
                    ctransid: 5,
                },
                mkfile("f"),
                Command::EnableVerity {
                    path: b("f"),
                    algorithm: 1,
                    block_size: 4096,
                    salt: b(""),
                    sig: b(""),
                },
                Command::Unknown {
                    cmd: 99,
                    payload: b(""),
                },
            ];
            for c in &cmds {
                rx.apply(&info(c), c).unwrap();
            }
            rx.finish_subvol().unwrap();
        }
        assert_eq!(p.0.load(Ordering::Relaxed), 1);
    }
}
