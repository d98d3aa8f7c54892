//! The applier: typed commands applied to DIR, one at a time, as
//! btrfs-progs `cmds/receive.c` does on btrfs, but on any filesystem and
//! with every path resolved by [`super::target`]. It must not read the
//! stream (that is the driver's, `receive::driver`) nor count errors
//! against `--max-errors`.
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
//!
//! The rooms, one concern each (all but `point` and `journal` are `impl
//! Receiver` blocks over the state declared here):
//!
//! | file | what |
//! | --- | --- |
//! | `apply.rs` | the [`Receiver`]'s state and setup, [`Receiver::apply`] and the dispatch to one method per command |
//! | `namespace` | MKFILE, MKDIR, MKNOD, MKFIFO, MKSOCK, SYMLINK, RENAME, LINK, UNLINK, RMDIR; a creation renamed into place; the name caches |
//! | `attrs` | SET_XATTR, REMOVE_XATTR, CHMOD, CHOWN, UTIMES, FILEATTR, ENABLE_VERITY |
//! | `data` | WRITE, TRUNCATE, FALLOCATE, ENCODED_WRITE, CLONE; the open file they write |
//! | `offload` | the lanes' offload: which data commands go to a worker lane, and the waits that keep the stream's order |
//! | `subvols` | SUBVOL, SNAPSHOT, parents and clone sources by UUID, finishing a subvolume |
//! | `checkpoint` | where the receive is in the stream ([`Tracker`]), taking checkpoints, start marks |
//! | `rollback` | continuation streams and partial subvolumes rolled back to their resume point |
//! | `point` | the files of a resume point, and [`resume_token`] |
//! | `undo` | journaling what undoes each command after a checkpoint, and undoing it |
//! | `journal` | the undo journal's file format and trash |

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, FileType};
use stream_format::{Command, CommandInfo, CommandKind};

use super::copy::Notes;
use super::encoded;
use super::lanes::Pool;
use super::meta::{Record, Records};
use super::subvol::Btrfs;
use super::target::{ReceiveDir, Target};
use super::{ApplyError, ApplyErrorKind, Progress};
use crate::sys;
use crate::types::Uuid;

mod attrs;
mod checkpoint;
mod data;
mod journal;
mod namespace;
mod offload;
mod point;
mod rollback;
mod subvols;
mod undo;
pub use checkpoint::{Step, Tracker};
pub(crate) use journal::{open_dir, remove_tree};
pub use point::{RESUME_DIR, ResumeTokenError, resume_token};
pub(crate) use point::{STATE_FILES, drop_journals};

/// Entry points for the fuzz targets (`fuzz/`) into the parsers of the
/// files a receive keeps beside DIR (state, start mark, undo journal),
/// which anyone who can write there can change. Not an API.
#[doc(hidden)]
pub mod fuzz {
    pub use super::journal::fuzz::journal;
    pub use super::point::fuzz::{start, state};
}

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
    /// What its queued jobs make of its size.
    size: QueuedSize,
}

/// What the jobs queued for a [`LaneFile`] make of its size, so that a
/// checkpoint can journal the size the file has at the checkpoint without
/// waiting for them (see `Receiver::j_touch_queued`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QueuedSize {
    /// Writes alone, ending at most here: the size becomes the larger of
    /// this and the size the file has whenever it is looked at (a write
    /// only extends a file).
    Grows(u64),
    /// A TRUNCATE to this and writes ending at most here after it.
    Exact(u64),
    /// Anything else (attributes, FALLOCATE, a write whose end is not
    /// known): only the file, once its jobs ran, tells.
    Unknown,
}

impl QueuedSize {
    /// After a job that writes up to `end` (`None`: not known).
    fn wrote(self, end: Option<u64>) -> QueuedSize {
        match (self, end) {
            (QueuedSize::Grows(s), Some(e)) => QueuedSize::Grows(s.max(e)),
            (QueuedSize::Exact(s), Some(e)) => QueuedSize::Exact(s.max(e)),
            _ => QueuedSize::Unknown,
        }
    }

    /// After a job that is not a write: a TRUNCATE to `to`, else `None`.
    fn set(self, to: Option<u64>) -> QueuedSize {
        match (self, to) {
            (QueuedSize::Unknown, _) | (_, None) => QueuedSize::Unknown,
            (_, Some(s)) => QueuedSize::Exact(s),
        }
    }
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
    /// a lookup (a negative lookup in a large directory is a B-tree search,
    /// a sizeable part of a many-small-files receive). `None`: unknown, ask
    /// the filesystem.
    root_names: Option<HashSet<Vec<u8>>>,
    /// Why the target refused `BTRFS_IOC_ENCODED_WRITE` for good (see
    /// [`sys::Refusal::Never`]), for the fallback lines of `-vv`.
    ioctl_refused: Option<rustix::io::Errno>,
    /// The undo journal of a directory-mode receive past its first
    /// checkpoint (see `journal`).
    journal: Option<journal::Journal>,
    /// When a subvolume-mode checkpoint is also durable.
    budget: Option<checkpoint::Budget>,
    /// A checkpoint waiting for the lanes to become the resume point.
    pending: Option<checkpoint::Pending>,
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

    /// Whether the progress sink lists every command
    /// ([`Progress::lists_commands`]).
    pub fn lists_commands(&self) -> bool {
        self.progress.lists_commands()
    }

    /// Give `cmd` to the progress sink's listing ([`Progress::command`]).
    pub fn list_command(&self, cmd: &Command<'_>) {
        self.progress.command(cmd);
    }
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
mod tests;
