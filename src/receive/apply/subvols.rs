//! Subvolumes and snapshots: SUBVOL and SNAPSHOT (a real subvolume, a
//! snapshot of the parent found by UUID, or a directory with its record and
//! a copy of its parent), finding parents and clone sources by UUID, and
//! finishing a subvolume (deferred flags, received UUID and read-only, or
//! its record marked complete). Resume points of a partial subvolume are
//! `checkpoint`'s and `rollback`'s; this module must not write them.

use std::collections::HashSet;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt as _;
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};

use super::{Current, NoteSink, Receiver};
use crate::receive::copy::{self};
use crate::receive::meta::{Record, State};
use crate::receive::subvol::{self, NotFound};
use crate::receive::target::{self, ReceiveDir, Target, TargetError};
use crate::receive::{ApplyError, ApplyErrorKind};
use crate::sys;
use crate::types::Uuid;

impl Receiver<'_> {
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
            // The undo journal's trash goes first (see `journal`); then, as
            // btrfs-progs: received UUID and stransid, then read-only.
            super::journal::drop_subvol_trash(cur.target.root(), &cur.record.uuid.0, None)
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

    pub(super) fn subvol(
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
                        super::rollback::Partial::Resumed(t) => {
                            self.resumed = Some(t);
                            return Ok(());
                        }
                        super::rollback::Partial::Removed => {
                            restarted = true;
                            continue;
                        }
                        super::rollback::Partial::Kept => {}
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

    /// A complete received subvolume with this UUID: with this ctransid if
    /// there is one, else (clone sources only, as btrfs-progs) any.
    pub(super) fn find_received(
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

    /// `DIR/<name>` is a subvolume that an earlier receive left incomplete:
    /// writable and without a received UUID (how btrfs-progs and btrbk
    /// recognise a garbled receive).
    pub(super) fn incomplete_subvolume(&self, name: &[u8]) -> bool {
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
}

/// The error for a parent or clone source that [`subvol::Btrfs::find`] did
/// not find.
pub(super) fn not_found(e: NotFound, uuid: Uuid, ctransid: u64) -> ApplyErrorKind {
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
pub(super) fn subvol_target(path: &std::path::Path) -> Result<Target, ApplyErrorKind> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(ApplyErrorKind::Invalid(format!(
            "cannot use {} as a clone source",
            path.display()
        )));
    };
    let dir = ReceiveDir::open(parent)?;
    Ok(dir.target(name.as_bytes())?)
}
