//! Rolling a partial subvolume back to its resume point: when a
//! continuation stream arrives ([`Receiver::continuation`]) or SUBVOL /
//! SNAPSHOT finds its subvolume partial ([`Receiver::take_partial`]), its
//! undo journal is played backwards or it is replaced by a snapshot of its
//! durable checkpoint, and the commands the checkpoint holds are dropped.
//! It must not take checkpoints: that is `checkpoint`'s.

use std::io::{self};
use std::os::fd::AsFd;
use std::sync::Arc;

use rustix::fs::{AtFlags, Mode, OFlags};

use super::checkpoint::Tracker;
use super::journal::{self, TrashAt};
use super::point::{
    Point, RESUME_DIR, STATE_FILES, Via, drop_journals, os, read_point, restarted_message,
};
use super::{Current, Receiver};
use crate::receive::ApplyErrorKind;
use crate::receive::meta::{Record, State};
use crate::receive::subvol;
use crate::resume::Token;
use crate::sys;
use crate::types::Uuid;

/// What [`Receiver::take_partial`] did with a partial `DIR/NAME`.
pub(super) enum Partial {
    /// Rolled back to its resume point, this one.
    Resumed(Token),
    /// Removed, to be made afresh.
    Removed,
    /// Left as it is.
    Kept,
}

impl Receiver<'_> {
    /// The resume point of `name`, if it has one (see [`read_point`]).
    pub(super) fn point(&self, name: &[u8]) -> Option<Point> {
        let rdir = self.resume_dir(name, false).ok()?;
        read_point(rdir.as_fd()).ok()
    }

    /// The partial subvolume whose resume point is for snapshot `uuid` /
    /// `ctransid`: its name and recorded token.
    pub(super) fn find_resume_point(
        &self,
        uuid: [u8; 16],
        ctransid: u64,
    ) -> Option<(Vec<u8>, Point)> {
        let top = rustix::fs::openat(
            self.dir.fd(),
            RESUME_DIR,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .ok()?;
        let mut it = rustix::fs::Dir::read_from(top).ok()?;
        while let Some(Ok(e)) = it.next() {
            let n = e.file_name().to_bytes().to_vec();
            if n == b"." || n == b".." {
                continue;
            }
            if let Some(p) = self.point(&n)
                && p.token.uuid == uuid
                && p.token.ctransid == ctransid
            {
                return Some((n, p));
            }
        }
        None
    }

    /// A continuation stream (number `stream`, header record `rec`)
    /// begins: find the partial subvolume it continues, roll it back to
    /// its checkpoint, make it current, and set `track` to drop what the
    /// checkpoint holds.
    ///
    /// # Errors
    ///
    /// The token cannot be read, no partial subvolume has a resume point
    /// for it, the continuation starts after the resume point, or the
    /// rollback fails.
    pub fn continuation(
        &mut self,
        stream: u32,
        rec: &[u8],
        track: &mut Tracker,
    ) -> Result<(), ApplyErrorKind> {
        self.finish_subvol().map_err(|e| e.kind)?;
        let t = Token::from_bytes(rec).map_err(|e| {
            ApplyErrorKind::Invalid(format!(
                "invalid continuation stream header: its token: {e}"
            ))
        })?;
        let (name, point) = self.find_resume_point(t.uuid, t.ctransid).ok_or_else(|| {
            ApplyErrorKind::Invalid(format!(
                "this continuation stream (btrsend send --resume) continues the snapshot with \
                 uuid {} ctransid {}, but no partial subvolume in {} has a resume point for it \
                 (see btrsend receive --resume-token)",
                Uuid(t.uuid),
                t.ctransid,
                self.dir.display_path(b"").display()
            ))
        })?;
        self.refuse_restarted(&name, &point)?;
        let ckpt = point.token;
        if t.index > ckpt.index
            || t.parent_uuid != ckpt.parent_uuid
            || t.parent_ctransid != ckpt.parent_ctransid
            || t.version != ckpt.version
        {
            return Err(ApplyErrorKind::Invalid(format!(
                "this continuation stream starts at command {} (stream offset {}), but {} can \
                 only continue from command {} (offset {}): make the continuation with the token \
                 `btrsend receive --resume-token` prints now",
                t.index,
                t.offset,
                self.dir.display_path(&name).display(),
                ckpt.index,
                ckpt.offset
            )));
        }
        self.rollback(&name, &point)?;
        track.continue_at(stream, &t, &ckpt);
        Ok(())
    }

    /// SUBVOL / SNAPSHOT of `name` found it partial. If it has a resume
    /// point for this stream, roll it back to its checkpoint (the commands
    /// the checkpoint holds are then dropped: `track`). Else, if it has no
    /// resume point this boot can use (none yet, or one of another boot
    /// with no durable checkpoint) and its start mark says this receive
    /// made it for snapshot `uuid` / `ctransid` (the object there is the
    /// one marked), remove it when `remove`, so that the SUBVOL / SNAPSHOT
    /// makes it afresh (see "Start mark" in [`crate::resume`]).
    ///
    /// # Errors
    ///
    /// The rollback fails (or its point is of another boot, unmarked), or
    /// the partial one cannot be removed.
    pub(super) fn take_partial(
        &mut self,
        name: &[u8],
        uuid: Uuid,
        ctransid: u64,
        remove: bool,
    ) -> Result<Partial, ApplyErrorKind> {
        let point = self.point(name);
        let marked = self.marked(name, uuid.0, ctransid);
        if let Some(p) = &point
            && p.token.uuid == uuid.0
            && p.token.ctransid == ctransid
            && (p.refused.is_none() || marked.is_none())
        {
            self.rollback(name, p)?;
            return Ok(Partial::Resumed(p.token));
        }
        let usable = point.is_some_and(|p| p.refused.is_none());
        let (Some(rdir), false, true) = (marked, usable, remove) else {
            return Ok(Partial::Kept);
        };
        let path = self.dir.display_path(name);
        let failed = |e: io::Error| {
            ApplyErrorKind::Invalid(format!(
                "cannot remove the partial {} to receive it over: {e}",
                path.display()
            ))
        };
        self.drop_checkpoints(&rdir, None);
        drop_journals(&rdir, None);
        if self.btrfs.is_some() {
            let d = subvol::reopen_dir(self.dir.fd()).map_err(failed)?;
            sys::snap_destroy(d.as_fd(), name).map_err(|e| failed(e.into()))?;
        } else {
            journal::remove_tree(self.dir.fd(), os(name)).map_err(failed)?;
        }
        for f in STATE_FILES {
            let _ = rustix::fs::unlinkat(&rdir, f, AtFlags::empty());
        }
        Ok(Partial::Removed)
    }

    /// A resume point of another boot that cannot be used: the error.
    pub(super) fn refuse_restarted(
        &self,
        name: &[u8],
        point: &Point,
    ) -> Result<(), ApplyErrorKind> {
        match &point.refused {
            Some((was, now)) => Err(ApplyErrorKind::Invalid(restarted_message(
                &self.dir.display_path(name),
                self.marked(name, point.token.uuid, point.token.ctransid)
                    .is_some(),
                was,
                now,
            ))),
            None => Ok(()),
        }
    }

    /// Roll the partial `DIR/name` back to its resume point `point` (its
    /// journal played backwards, or replaced by a snapshot of its durable
    /// checkpoint), and make it the current subvolume.
    pub(super) fn rollback(&mut self, name: &[u8], point: &Point) -> Result<(), ApplyErrorKind> {
        self.refuse_restarted(name, point)?;
        let rdir = self.resume_dir(name, false)?;
        match point.via {
            Via::Journal => self.rollback_journal(name, &point.token, &rdir)?,
            Via::Snapshot => {
                self.rollback_subvol(name, &point.token)?;
                // What the journal and trash held after the snapshot
                // does not concern it (the next checkpoint starts anew).
                drop_journals(&rdir, None);
                if let Some(cur) = &self.cur {
                    journal::drop_subvol_trash(cur.target.root(), &cur.record.uuid.0, None)?;
                }
            }
        }
        if let Some(cur) = self.cur.as_mut() {
            for (path, flags) in &point.fileattrs {
                // Removed since the checkpoint's tree: nothing to set.
                if let Ok(fd) = cur.target.locate(path).and_then(|l| Ok(l.open_path()?)) {
                    cur.fileattrs.push((fd, path.clone(), *flags));
                }
            }
        }
        Ok(())
    }

    /// Roll `DIR/name` (a directory, or in subvolume mode a subvolume)
    /// back to checkpoint `ckpt` with its undo journal in `rdir`, and make
    /// it the current subvolume.
    pub(super) fn rollback_journal(
        &mut self,
        name: &[u8],
        ckpt: &Token,
        rdir: &std::os::fd::OwnedFd,
    ) -> Result<(), ApplyErrorKind> {
        let subvolume = self.btrfs.is_some();
        if subvolume {
            if !self.incomplete_subvolume(name) {
                return Err(ApplyErrorKind::Invalid(format!(
                    "cannot resume {}: it is not a subvolume that an interrupted receive left \
                     incomplete",
                    self.dir.display_path(name).display()
                )));
            }
        } else {
            let incomplete = self.records.list().is_ok_and(|l| {
                l.iter()
                    .any(|r| r.name == name && r.state != State::Complete)
            });
            let is_dir = rustix::fs::statat(self.dir.fd(), os(name), AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir());
            if !incomplete || !is_dir {
                return Err(ApplyErrorKind::Invalid(format!(
                    "cannot resume {}: it is not a directory that an interrupted receive left \
                     incomplete",
                    self.dir.display_path(name).display()
                )));
            }
        }
        self.wait_lanes();
        self.wcache = None;
        let target = self.dir.target(name)?;
        let record = Record {
            name: name.to_vec(),
            uuid: Uuid(ckpt.uuid),
            ctransid: ckpt.ctransid,
            parent: ckpt
                .has_parent()
                .then_some((Uuid(ckpt.parent_uuid), ckpt.parent_ctransid)),
            state: State::Incomplete,
        };
        self.progress.subvol_start(name, record.parent.is_some());
        self.progress.note(&format!(
            "resuming {} from its checkpoint at stream offset {}",
            self.dir.display_path(name).display(),
            ckpt.offset
        ));
        let base = Arc::new(target.display(b""));
        self.root_names = None;
        self.cur = Some(Current {
            target,
            record,
            errors: 0,
            fileattrs: Vec::new(),
            base,
            subvolume,
        });
        let root = match &self.cur {
            Some(c) if subvolume => Some((rustix::io::dup(c.target.root())?, c.record.uuid.0)),
            _ => None,
        };
        let at = root.as_ref().map_or(TrashAt::ResumeDir, |(r, uuid)| {
            TrashAt::Subvol(r.as_fd(), *uuid)
        });
        self.j_rollback(rdir.as_fd(), ckpt.index, at)
            .and_then(|()| match &root {
                // Trash of checkpoints begun after this one.
                Some((r, uuid)) => journal::drop_subvol_trash(r.as_fd(), uuid, Some(ckpt.index)),
                None => Ok(()),
            })
            .map_err(|e| {
                ApplyErrorKind::Invalid(format!(
                    "cannot roll {} back to its checkpoint: {e}",
                    self.dir.display_path(name).display()
                ))
            })?;
        Ok(())
    }

    /// Replace the partial subvolume `DIR/name` by a writable snapshot of
    /// its checkpoint `ckpt`, and make it the current subvolume.
    pub(super) fn rollback_subvol(
        &mut self,
        name: &[u8],
        ckpt: &Token,
    ) -> Result<(), ApplyErrorKind> {
        if self.btrfs.is_none() {
            return Err(ApplyErrorKind::Invalid(
                "a continuation stream can only be received into btrfs as subvolumes (as root)"
                    .into(),
            ));
        }
        let dir = subvol::reopen_dir(self.dir.fd())?;
        let exists = rustix::fs::statat(self.dir.fd(), os(name), AtFlags::SYMLINK_NOFOLLOW).is_ok();
        if exists {
            if !self.incomplete_subvolume(name) {
                return Err(ApplyErrorKind::Exists);
            }
            sys::snap_destroy(dir.as_fd(), name)?;
        }
        let rdir = self.resume_dir(name, false)?;
        let src = rustix::fs::openat(
            &rdir,
            format!("ckpt-{}", ckpt.index),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        sys::snapshot_create(dir.as_fd(), name, src.as_fd())?;
        let target = self.dir.target(name)?;
        let record = Record {
            name: name.to_vec(),
            uuid: Uuid(ckpt.uuid),
            ctransid: ckpt.ctransid,
            parent: ckpt
                .has_parent()
                .then_some((Uuid(ckpt.parent_uuid), ckpt.parent_ctransid)),
            state: State::Incomplete,
        };
        self.progress.subvol_start(name, record.parent.is_some());
        self.progress.note(&format!(
            "resuming {} from its checkpoint at stream offset {}",
            self.dir.display_path(name).display(),
            ckpt.offset
        ));
        let base = Arc::new(target.display(b""));
        // Its root holds what the checkpoint holds: names not tracked.
        self.root_names = None;
        self.cur = Some(Current {
            target,
            record,
            errors: 0,
            fileattrs: Vec::new(),
            base,
            subvolume: true,
        });
        Ok(())
    }
}
