//! Taking resume checkpoints of the subvolume being received (the design
//! is in [`crate::resume`]): where the receive is in the stream
//! ([`Tracker`]), when a checkpoint is due and when it is also durable (a
//! snapshot, on a time budget), the checkpoint itself (a new undo journal
//! and the state naming it, promoted once the lanes have written what came
//! before it), the start mark of a new subvolume, and dropping a finished
//! subvolume's resume point. It must not roll anything back: that is
//! `rollback`'s.

use std::ffi::OsStr;
use std::io::{self};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, Mode, OFlags};
use stream_format::CommandInfo;

use super::Receiver;
use super::journal::{self, TrashAt};
use super::point::{
    RESUME_DIR, START, STATE_FILES, Start, checkpoint_bytes, drop_journals, identity, os,
    put_state, read_start,
};
use crate::receive::ApplyErrorKind;
use crate::receive::meta::State;
use crate::receive::subvol;
use crate::resume::{CHECKPOINT_BYTES, FIRST_COMMAND, Shape, Token};
use crate::sys;
use crate::types::Uuid;

/// A durable (snapshot) checkpoint of a subvolume-mode receive is due
/// when the time since the last one is at least this many times what the
/// last one cost (so they cost at most about 5 % of the receive)...
pub(super) const DURABLE_FACTOR: u32 = 20;

/// ...taking the first to cost this (so the first comes after 2 s)...
pub(super) const DURABLE_FIRST_COST: std::time::Duration = std::time::Duration::from_millis(100);

/// ...and each to cost at least the time to write the stream bytes applied
/// since the last one at this rate (bytes per second): the snapshot
/// flushes the data written since, which the time of the last one does not
/// tell when little was written then (a snapshot after a run of large
/// WRITEs costs about the time to write them out)...
pub(super) const DURABLE_FLUSH_RATE: u64 = 256 << 20;

/// ...or when this much stream was applied since the last one.
pub(super) const DURABLE_BYTES: u64 = 4 << 30;

/// When the checkpoints of a subvolume-mode receive are also durable (see
/// "What survives what" in [`crate::resume`]).
#[derive(Debug)]
pub(super) struct Budget {
    /// The subvolume it counts for.
    pub(super) name: Vec<u8>,
    /// When the last durable checkpoint ended (at first: the first
    /// checkpoint of the subvolume).
    pub(super) last: std::time::Instant,
    /// What it cost.
    pub(super) cost: std::time::Duration,
    /// Stream bytes since.
    pub(super) bytes: u64,
    /// Checkpoints of the subvolume so far.
    pub(super) count: u64,
}

impl Budget {
    pub(super) fn new(name: &[u8]) -> Budget {
        Budget {
            name: name.to_vec(),
            last: std::time::Instant::now(),
            cost: DURABLE_FIRST_COST,
            bytes: 0,
            count: 0,
        }
    }
}

/// `BTRSEND_DURABLE_EVERY=N` (for tests): every Nth checkpoint of a
/// subvolume-mode receive is durable, from the first; 0: none. Unset: the
/// time budget.
pub(super) fn durable_every() -> Option<u64> {
    std::env::var("BTRSEND_DURABLE_EVERY").ok()?.parse().ok()
}

/// Where the receive is in the current subvolume's stream.
#[derive(Debug, Clone)]
pub struct Tracker {
    /// Index of the next command (SUBVOL / SNAPSHOT is 0).
    pub(super) index: u64,
    /// Its offset in the (uninterrupted) stream.
    pub(super) offset: u64,
    pub(super) shape: Shape,
    pub(super) version: u32,
    /// Stream bytes since the last checkpoint.
    pub(super) since: u64,
    /// Stream bytes between checkpoints; 0: none.
    pub(super) every: u64,
    /// Drop the commands before this index (the checkpoint holds them);
    /// the shape there must be this.
    pub(super) skip_to: Option<(u64, Shape)>,
    /// The stream being tracked (its number in the input).
    pub(super) stream: Option<u32>,
}

impl Default for Tracker {
    /// A checkpoint every [`CHECKPOINT_BYTES`].
    fn default() -> Tracker {
        Tracker::new(CHECKPOINT_BYTES)
    }
}

/// What the driver does with a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Apply it.
    Apply,
    /// Drop it: the checkpoint rolled back to holds it already.
    Drop,
}

impl Tracker {
    /// A tracker that makes a checkpoint due every `every` bytes of stream
    /// applied ([`crate::receive::ReceiveOptions::checkpoint_interval`]);
    /// 0: never.
    pub fn new(every: u64) -> Tracker {
        Tracker {
            index: 0,
            offset: FIRST_COMMAND,
            shape: Shape::default(),
            version: 0,
            since: 0,
            every: checkpoint_bytes(every),
            skip_to: None,
            stream: None,
        }
    }

    /// Count command `info` (read whole or skimmed): whether it is to be
    /// applied.
    ///
    /// # Errors
    ///
    /// The commands up to the checkpoint do not have its shape (the
    /// stream is not the one the checkpoint was made from).
    pub fn command(&mut self, info: &CommandInfo) -> Result<Step, ApplyErrorKind> {
        if self.stream != Some(info.stream) {
            // A new stream of the input (not a continuation: see
            // `Receiver::continuation`).
            *self = Tracker::new(self.every);
            self.stream = Some(info.stream);
        }
        self.version = info.version;
        let len = u64::from(info.len).saturating_add(stream_format::CMD_HEADER_SIZE as u64);
        if let Some((to, shape)) = self.skip_to
            && self.index == to
        {
            self.skip_to = None;
            if self.shape != shape {
                return Err(ApplyErrorKind::Invalid(format!(
                    "the stream differs from the one the resume checkpoint was made from (at \
                     command {to}): it is not the same send (snapshot, parent, clone sources, \
                     options)"
                )));
            }
        }
        let step = if self.skip_to.is_some() {
            Step::Drop
        } else {
            Step::Apply
        };
        self.shape.push(info.cmd, len);
        self.index += 1;
        self.offset = self.offset.saturating_add(len);
        if step == Step::Apply {
            self.since = self.since.saturating_add(len);
        }
        Ok(step)
    }

    /// Whether a checkpoint is due (enough stream applied since the last).
    pub fn due(&self) -> bool {
        self.every != 0 && self.since >= self.every && self.skip_to.is_none()
    }

    /// Bytes of stream applied after a [`Pending`] checkpoint by which it
    /// is made the resume point, waiting for the lanes if they are not
    /// there yet: a sixteenth of the interval, at most 4 MiB (so what is
    /// sent again after an interruption stays within the interval plus
    /// 16 MiB, with the read-ahead).
    pub(super) fn lead(&self) -> u64 {
        (self.every / 16).min(4 << 20)
    }

    /// The SUBVOL / SNAPSHOT just applied rolled its partial subvolume
    /// back to checkpoint `t`: drop the commands it holds.
    pub fn resumed(&mut self, t: &Token) {
        if t.index > self.index {
            self.skip_to = Some((t.index, t.shape));
        }
    }

    /// Start tracking a continuation stream (number `stream`) whose first
    /// command is the token's.
    pub(super) fn continue_at(&mut self, stream: u32, t: &Token, checkpoint: &Token) {
        *self = Tracker::new(self.every);
        self.stream = Some(stream);
        self.index = t.index;
        self.offset = t.offset;
        self.shape = t.shape;
        self.version = t.version;
        if checkpoint.index > t.index {
            self.skip_to = Some((checkpoint.index, checkpoint.shape));
        }
    }
}

/// A checkpoint taken without waiting for the data lanes (see "Receiver:
/// checkpoints with rollback" in [`crate::resume`]): its undo journal is
/// the current one, but the state still names the previous checkpoint
/// until the lanes have run every job queued before it (`marks`); then
/// its state (`text`, made at the checkpoint) is written and the previous
/// journal dropped. Until then a rollback undoes both journals, the newer
/// first.
pub(super) struct Pending {
    pub(super) name: Vec<u8>,
    pub(super) index: u64,
    pub(super) text: String,
    pub(super) marks: Vec<u64>,
}

impl Receiver<'_> {
    /// Take a checkpoint of the current subvolume if `track` says one is
    /// due (and it has no errors): start a new undo journal and record the
    /// token, then drop the previous checkpoint. With data lanes it waits
    /// for nothing (`Pending`): it becomes the resume point once the
    /// lanes have written everything before it, checked at each call, and
    /// waited for `Tracker::lead` bytes after it. Without lanes, and for
    /// a durable checkpoint (in subvolume mode, when the budget allows: a
    /// snapshot), the lanes are drained first. Whether a checkpoint was
    /// begun or made the resume point. A failure is reported once and the
    /// receive goes on (the previous checkpoint stays the resume point),
    /// but for a full disk: then the receive stops here, so that no more
    /// than one interval of stream is sent again after it.
    ///
    /// # Errors
    ///
    /// The checkpoint failed for want of space (`ENOSPC`, `EDQUOT`).
    pub fn checkpoint(
        &mut self,
        track: &mut Tracker,
    ) -> Result<bool, Box<crate::receive::ApplyError>> {
        let mut acted = false;
        if self.pending.is_some() {
            let wait = track.since >= track.lead();
            acted = self.promote(wait)?;
        }
        if !track.due() {
            return Ok(acted);
        }
        if self.cur.as_ref().is_none_or(|c| c.errors != 0) {
            return Ok(acted);
        }
        // One pending checkpoint at a time.
        self.promote(true)?;
        let durable = match self.cur.as_ref() {
            Some(c) if c.subvolume => {
                let name = c.record.name.clone();
                self.durable_due(&name, track.since)
            }
            _ => false,
        };
        let early = self.lanes.is_some() && !durable;
        if !early {
            self.wait_lanes();
        }
        self.wcache = None;
        let Some(cur) = self.cur.as_ref().filter(|c| c.errors == 0) else {
            return Ok(true);
        };
        let token = Token {
            uuid: cur.record.uuid.0,
            ctransid: cur.record.ctransid,
            parent_uuid: cur.record.parent.map_or([0; 16], |p| p.0.0),
            parent_ctransid: cur.record.parent.map_or(0, |p| p.1),
            version: track.version,
            index: track.index,
            offset: track.offset,
            shape: track.shape,
        };
        let name = cur.record.name.clone();
        let written = if early && !durable {
            self.begin_checkpoint(&name, &token)
        } else if cur.subvolume {
            self.write_subvol_checkpoint(&name, &token, durable)
        } else {
            self.write_dir_checkpoint(&name, &token)
        };
        // Not again for a while, whatever happened.
        track.since = 0;
        self.checkpoint_failed(&name, written)?;
        Ok(true)
    }

    /// A checkpoint that failed with `written`'s error: `Err` for a full
    /// disk, else noted once (the previous checkpoint stays the resume
    /// point).
    pub(super) fn checkpoint_failed(
        &mut self,
        name: &[u8],
        written: io::Result<()>,
    ) -> Result<(), Box<crate::receive::ApplyError>> {
        let Err(e) = written else {
            return Ok(());
        };
        let full = [rustix::io::Errno::NOSPC, rustix::io::Errno::DQUOT]
            .iter()
            .any(|n| e.raw_os_error() == Some(n.raw_os_error()));
        if full {
            return Err(Box::new(crate::receive::ApplyError {
                cmd: None,
                op: "checkpoint",
                path: Vec::new(),
                target: Some(self.dir.display_path(name)),
                path2: None,
                kind: ApplyErrorKind::Io(e),
            }));
        }
        let msg = format!(
            "cannot take a resume checkpoint of {}: {e} (an interrupted receive resumes from the \
             previous one)",
            self.dir.display_path(name).display()
        );
        self.note("checkpoint", msg);
        Ok(())
    }

    /// A checkpoint that waits for nothing ([`Pending`]): a new undo
    /// journal for what follows, and the state to write once the lanes
    /// have run the jobs queued so far (the FILEATTR paths are those of
    /// now, the checkpoint's tree).
    pub(super) fn begin_checkpoint(&mut self, name: &[u8], token: &Token) -> io::Result<()> {
        let Some(cur) = self.cur.as_ref() else {
            return Ok(());
        };
        let Some(l) = self.lanes.as_ref() else {
            return Ok(());
        };
        let marks = l.pool.marks();
        let at = if cur.subvolume {
            TrashAt::Subvol(cur.target.root(), cur.record.uuid.0)
        } else {
            TrashAt::ResumeDir
        };
        let rdir = self.resume_dir(name, true)?;
        let text = self.state_text(token)?;
        let journal = journal::Journal::create(rdir.as_fd(), token.index, at)?;
        self.journal = Some(journal);
        self.pending = Some(Pending {
            name: name.to_vec(),
            index: token.index,
            text,
            marks,
        });
        Ok(())
    }

    /// Make the [`Pending`] checkpoint the resume point if the lanes have
    /// run the jobs queued before it (`wait`: after waiting for them), and
    /// no command of the subvolume failed: write its state, drop the
    /// previous journal and trash. Whether there was one to make so.
    ///
    /// # Errors
    ///
    /// The state cannot be written for want of space.
    pub(super) fn promote(&mut self, wait: bool) -> Result<bool, Box<crate::receive::ApplyError>> {
        let Some(p) = &self.pending else {
            return Ok(false);
        };
        if let Some(l) = &self.lanes {
            if wait {
                l.pool.wait_marks(&p.marks);
            } else if !l.pool.reached(&p.marks) {
                return Ok(false);
            }
        }
        let Some(p) = self.pending.take() else {
            return Ok(false);
        };
        // The lanes' errors so far count (a job before the checkpoint
        // that failed leaves a tree the checkpoint does not describe).
        let errs = self.take_lane_errors();
        self.lane_errors.extend(errs);
        let Some(cur) = self
            .cur
            .as_ref()
            .filter(|c| c.errors == 0 && c.record.name == p.name)
        else {
            return Ok(true);
        };
        let written = (|| {
            let rdir = self.resume_dir(&p.name, false)?;
            put_state(&rdir, &p.text, "state", false)?;
            drop_journals(&rdir, Some(p.index));
            if cur.subvolume {
                let _ = journal::drop_subvol_trash(
                    cur.target.root(),
                    &cur.record.uuid.0,
                    Some(p.index),
                );
            }
            Ok(())
        })();
        self.checkpoint_failed(&p.name, written)?;
        Ok(true)
    }

    /// Mark the subvolume `name` just made for snapshot `uuid` /
    /// `ctransid` (before a directory-mode SNAPSHOT copies its parent into
    /// it): until its first checkpoint, the start mark lets the next
    /// receive of the whole stream start it over instead of refusing it
    /// ([`Receiver::take_partial`]). Not with checkpoints off (`--checkpoint-interval
    /// 0`: an interrupted receive leaves no resume point). A mark that
    /// cannot be written is noted once; the receive goes on.
    pub(super) fn mark_start(&mut self, name: &[u8], uuid: [u8; 16], ctransid: u64) {
        if !self.checkpoints {
            return;
        }
        let written = (|| {
            let fd = journal::open_dir(self.dir.fd(), os(name))?;
            let Some(identity) = identity(fd.as_fd(), self.btrfs.is_some()) else {
                return Ok(());
            };
            let rdir = self.resume_dir(name, true)?;
            let start = Start {
                uuid: Uuid(uuid),
                ctransid,
                identity,
            };
            put_state(&rdir, &start.text(), START, false)
        })();
        if let Err(e) = written {
            let msg = format!(
                "cannot mark the start of {}: {e} (if this receive is interrupted before its \
                 first checkpoint, delete it before receiving it again)",
                self.dir.display_path(name).display()
            );
            self.note("checkpoint", msg);
        }
    }

    /// The resume directory of `DIR/name` if its start mark is for
    /// snapshot `uuid` / `ctransid` and names the object at `DIR/name`
    /// (see "Start mark" in [`crate::resume`]).
    pub(super) fn marked(&self, name: &[u8], uuid: [u8; 16], ctransid: u64) -> Option<OwnedFd> {
        let rdir = self.resume_dir(name, false).ok()?;
        let start =
            read_start(rdir.as_fd()).filter(|s| s.uuid.0 == uuid && s.ctransid == ctransid)?;
        let fd = journal::open_dir(self.dir.fd(), os(name)).ok()?;
        (identity(fd.as_fd(), self.btrfs.is_some()).as_ref() == Some(&start.identity))
            .then_some(rdir)
    }

    /// Delete the resume points of subvolumes received completely: a
    /// receiver killed at the very end of one (after it marked it
    /// complete, before it deleted its resume point) leaves both.
    pub fn drop_stale_resume_points(&mut self) {
        let Ok(top) = rustix::fs::openat(
            self.dir.fd(),
            RESUME_DIR,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        ) else {
            return;
        };
        let Ok(it) = rustix::fs::Dir::read_from(top) else {
            return;
        };
        let names: Vec<Vec<u8>> = it
            .flatten()
            .map(|e| e.file_name().to_bytes().to_vec())
            .filter(|n| n != b"." && n != b"..")
            .collect();
        for n in names {
            if self.complete(&n) {
                self.drop_resume_point(&n);
            }
        }
    }

    /// Whether `DIR/name` was received completely: a subvolume with its
    /// received UUID, or a directory whose record says so.
    pub(super) fn complete(&self, name: &[u8]) -> bool {
        let Ok(fd) = rustix::fs::openat(
            self.dir.fd(),
            os(name),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        ) else {
            return false;
        };
        if rustix::fs::fstat(&fd).is_ok_and(|st| st.st_ino == subvol::FIRST_FREE) {
            sys::subvol_info(fd.as_fd()).is_ok_and(|i| i.received_uuid != [0; 16])
        } else {
            self.records.list().is_ok_and(|l| {
                l.iter()
                    .any(|r| r.name == name && r.state == State::Complete)
            })
        }
    }

    /// The resume directory of `name`, created if needed.
    pub(super) fn resume_dir(&self, name: &[u8], create: bool) -> io::Result<std::os::fd::OwnedFd> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let open = |at, n: &OsStr| rustix::fs::openat(at, n, flags, Mode::empty());
        let top = match open(self.dir.fd(), OsStr::new(RESUME_DIR)) {
            Err(rustix::io::Errno::NOENT) if create => {
                rustix::fs::mkdirat(self.dir.fd(), RESUME_DIR, Mode::from_raw_mode(0o700))?;
                open(self.dir.fd(), OsStr::new(RESUME_DIR))?
            }
            r => r?,
        };
        Ok(match open(top.as_fd(), os(name)) {
            Err(rustix::io::Errno::NOENT) if create => {
                rustix::fs::mkdirat(&top, os(name), Mode::from_raw_mode(0o700))?;
                open(top.as_fd(), os(name))?
            }
            r => r?,
        })
    }

    /// Whether this checkpoint of subvolume `name` (`since` bytes of
    /// stream after the last) is to be durable: see [`Budget`].
    pub(super) fn durable_due(&mut self, name: &[u8], since: u64) -> bool {
        let b = self.budget.get_or_insert_with(|| Budget::new(name));
        if b.name != name {
            *b = Budget::new(name);
        }
        b.bytes = b.bytes.saturating_add(since);
        b.count += 1;
        match durable_every() {
            Some(0) => false,
            Some(n) => (b.count - 1).is_multiple_of(n),
            None => {
                let flush = std::time::Duration::from_millis(b.bytes / (DURABLE_FLUSH_RATE / 1000));
                b.bytes >= DURABLE_BYTES
                    || b.last.elapsed() >= b.cost.max(flush).saturating_mul(DURABLE_FACTOR)
            }
        }
    }

    /// A checkpoint of a subvolume-mode receive: a new undo journal and
    /// trash (in the subvolume's root), and if `durable` a snapshot of the
    /// subvolume with its state flushed (`durable`); the state naming the
    /// journal; then the previous journal, trash and snapshot deleted (see
    /// the design in [`crate::resume`]).
    pub(super) fn write_subvol_checkpoint(
        &mut self,
        name: &[u8],
        token: &Token,
        durable: bool,
    ) -> io::Result<()> {
        let Some(cur) = self.cur.as_ref() else {
            return Ok(());
        };
        let root = rustix::io::dup(cur.target.root())?;
        let uuid = cur.record.uuid.0;
        let rdir = self.resume_dir(name, true)?;
        let journal = journal::Journal::create(
            rdir.as_fd(),
            token.index,
            TrashAt::Subvol(root.as_fd(), uuid),
        )?;
        if durable {
            let start = std::time::Instant::now();
            let ckpt = format!("ckpt-{}", token.index);
            // A leftover of an interrupted checkpoint with this index.
            let _ = sys::snap_destroy(rdir.as_fd(), ckpt.as_bytes());
            let src = subvol::reopen_dir(root.as_fd())?;
            sys::snapshot_create(rdir.as_fd(), ckpt.as_bytes(), src.as_fd())?;
            self.write_state(&rdir, token, "durable", true)?;
            self.write_state(&rdir, token, "state", false)?;
            self.journal = Some(journal);
            self.drop_checkpoints(&rdir, Some(&ckpt));
            if let Some(b) = &mut self.budget {
                b.cost = start.elapsed();
                b.last = std::time::Instant::now();
                b.bytes = 0;
            }
        } else {
            self.write_state(&rdir, token, "state", false)?;
            self.journal = Some(journal);
        }
        // The state names the new journal: what is left of the previous
        // checkpoint goes (if that fails, the next checkpoint, the end of
        // the subvolume or a rollback removes it).
        drop_journals(&rdir, Some(token.index));
        let _ = journal::drop_subvol_trash(root.as_fd(), &uuid, Some(token.index));
        Ok(())
    }

    /// The resume point `token` of the current subvolume in `rdir`: the
    /// token, the boot id, then a line per FILEATTR still to be set at its
    /// end (the file's path now, hex, and the flags), written to a
    /// temporary file and renamed into place; `durable`: flushed (the file
    /// and the rename) before that returns, else valid only until the
    /// system restarts (see "What survives what" in [`crate::resume`]).
    pub(super) fn write_state(
        &self,
        rdir: &std::os::fd::OwnedFd,
        token: &Token,
        file: &str,
        durable: bool,
    ) -> io::Result<()> {
        let text = self.state_text(token)?;
        put_state(rdir, &text, file, durable)
    }

    /// The state of resume point `token` (see [`Receiver::write_state`]).
    pub(super) fn state_text(&self, token: &Token) -> io::Result<String> {
        let mut text = format!("{token}\n");
        if let Some(b) = crate::resume::boot_id() {
            text.push_str(&format!("boot {b}\n"));
        }
        if let Some(cur) = &self.cur {
            let link = |fd: std::os::fd::BorrowedFd<'_>| {
                std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            };
            let root = link(cur.target.root())?;
            for (fd, _, flags) in &cur.fileattrs {
                let p = link(fd.as_fd())?;
                // Unlinked since: nothing to set.
                let Ok(rel) = p.strip_prefix(&root) else {
                    continue;
                };
                let rel = rel.as_os_str().as_bytes();
                if rel.ends_with(b" (deleted)") {
                    continue;
                }
                let hex: String = rel.iter().map(|b| format!("{b:02x}")).collect();
                text.push_str(&format!("fileattr {hex} {flags}\n"));
            }
        }
        Ok(text)
    }

    /// A checkpoint of a directory-mode receive: a new journal and trash,
    /// the state naming them, then the previous journal and trash deleted;
    /// nothing flushed (see the design in [`crate::resume`]).
    pub(super) fn write_dir_checkpoint(&mut self, name: &[u8], token: &Token) -> io::Result<()> {
        let rdir = self.resume_dir(name, true)?;
        let journal = journal::Journal::create(rdir.as_fd(), token.index, TrashAt::ResumeDir)?;
        self.write_state(&rdir, token, "state", false)?;
        self.journal = Some(journal);
        drop_journals(&rdir, Some(token.index));
        Ok(())
    }

    /// Delete the checkpoints in `rdir` but `keep`.
    pub(super) fn drop_checkpoints(&self, rdir: &std::os::fd::OwnedFd, keep: Option<&str>) {
        let Ok(dup) = rustix::io::dup(rdir) else {
            return;
        };
        let Ok(mut it) = rustix::fs::Dir::read_from(dup) else {
            return;
        };
        let mut old = Vec::new();
        while let Some(Ok(e)) = it.next() {
            let n = e.file_name().to_bytes().to_vec();
            if n.starts_with(b"ckpt-") && keep.is_none_or(|k| k.as_bytes() != n) {
                old.push(n);
            }
        }
        for n in old {
            let _ = sys::snap_destroy(rdir.as_fd(), &n);
        }
    }

    /// The subvolume `name` finished: its resume point goes.
    pub(super) fn drop_resume_point(&self, name: &[u8]) {
        let Ok(rdir) = self.resume_dir(name, false) else {
            return;
        };
        self.drop_checkpoints(&rdir, None);
        drop_journals(&rdir, None);
        for f in STATE_FILES {
            let _ = rustix::fs::unlinkat(&rdir, f, AtFlags::empty());
        }
        drop(rdir);
        if let Ok(top) = rustix::fs::openat(
            self.dir.fd(),
            RESUME_DIR,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        ) {
            let _ = rustix::fs::unlinkat(&top, os(name), AtFlags::REMOVEDIR);
            let _ = rustix::fs::unlinkat(self.dir.fd(), RESUME_DIR, AtFlags::REMOVEDIR);
        }
    }
}
