//! The undo journal's side of applying commands (directory mode, and
//! subvolume mode between durable checkpoints; the design is in
//! [`crate::resume`]): before each command after the last checkpoint
//! changes something, what undoes it is journaled (`j_*`), and a rollback
//! plays the journal backwards ([`Receiver::j_rollback`]). The journal's
//! file format and trash are `journal`'s; this module must not decide when
//! a checkpoint is taken.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps, XattrFlags};
use rustix::io::Errno;

use super::journal::{
    Entry, Journal, PIECE, TrashAt, describe, names, open_dir, parent_of, read_journal,
    remove_tree, stat_times,
};
use super::{QueuedSize, Receiver};
use crate::receive::ApplyErrorKind;
use crate::receive::copy;

impl Receiver<'_> {
    /// Whether changes are journaled (a directory-mode receive past its
    /// first checkpoint).
    pub(super) fn journaling(&self) -> bool {
        self.journal.is_some()
    }

    /// `lstat` of stream path `rel` (the root: "").
    pub(super) fn j_stat(&self, rel: &[u8]) -> Result<rustix::fs::Stat, ApplyErrorKind> {
        let t = &self.cur()?.target;
        Ok(t.locate(rel)?.lstat()?)
    }

    /// The inode of `rel`: from an open file where there is one.
    pub(super) fn j_ino(&self, rel: &[u8]) -> Result<u64, ApplyErrorKind> {
        if let Some(w) = &self.wcache
            && w.path == rel
        {
            return Ok(w.ino);
        }
        if let Some(l) = &self.lanes
            && let Some(f) = l.files.get(rel)
        {
            return Ok(f.ino);
        }
        Ok(self.j_stat(rel)?.st_ino)
    }

    /// Before the first change of `rel` since the checkpoint: save its
    /// attributes (and a regular file's size). Nothing for a new object.
    pub(super) fn j_touch(&mut self, rel: &[u8]) -> Result<(), ApplyErrorKind> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        if j.done_paths.iter().any(|(p, _)| p == rel) {
            return Ok(());
        }
        let ino = self.j_ino(rel)?;
        let new = j.new.contains(&ino);
        if new || j.touched.contains_key(&ino) {
            if let Some(j) = &mut self.journal {
                j.done(rel, new);
            }
            return Ok(());
        }
        // Jobs queued before the checkpoint may still be writing it (see
        // `Pending`): its state at the checkpoint is after them.
        self.settle(rel);
        let st = self.j_stat(rel)?;
        let regular = FileType::from_raw_mode(st.st_mode) == FileType::RegularFile;
        self.j_save_attrs(rel, &st, regular.then_some(st.st_size.cast_unsigned()))
    }

    /// Journal the attributes `st` of `rel`, with `size` as its size (a
    /// regular file's).
    fn j_save_attrs(
        &mut self,
        rel: &[u8],
        st: &rustix::fs::Stat,
        size: Option<u64>,
    ) -> Result<(), ApplyErrorKind> {
        let (atime, mtime) = stat_times(st);
        let e = Entry::Attr {
            path: rel.to_vec(),
            mode: st.st_mode,
            uid: st.st_uid,
            gid: st.st_gid,
            atime,
            mtime,
            size,
        };
        let j = self.journal.as_mut().ok_or(ApplyErrorKind::NoSubvol)?;
        j.append(&e)?;
        j.touched.insert(st.st_ino, size.unwrap_or(0));
        j.done(rel, false);
        Ok(())
    }

    /// Before the first change of `rel` since the checkpoint, a write at
    /// `start` to a file with jobs queued on a lane: save its attributes
    /// without waiting for the jobs (which would drain the lane at every
    /// checkpoint), when they leave a size known here and the write starts
    /// there or beyond (an append: no data to save). The jobs queued are
    /// all from before the checkpoint, and they change nothing saved but
    /// the size and times: a CHMOD or CHOWN among them makes the size
    /// unknown, and the times saved, those of a file being written, are
    /// set again by the stream's UTIMES after its writes. Whether it saved
    /// them; `false`: [`j_touch`](Self::j_touch) after the jobs.
    pub(super) fn j_touch_queued(
        &mut self,
        rel: &[u8],
        start: u64,
    ) -> Result<bool, ApplyErrorKind> {
        let Some(f) = self
            .lanes
            .as_ref()
            .and_then(|l| l.files.get(rel))
            .filter(|_| self.journal.is_some())
        else {
            return Ok(false);
        };
        let st = rustix::fs::fstat(&*f.file)?;
        let now = st.st_size.cast_unsigned();
        let size = match f.size {
            QueuedSize::Grows(end) => now.max(end),
            QueuedSize::Exact(size) => size,
            QueuedSize::Unknown => return Ok(false),
        };
        if start < size || FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Ok(false);
        }
        self.j_save_attrs(rel, &st, Some(size))?;
        Ok(true)
    }

    /// A RENAME, UNLINK or RMDIR was made: a path may name another object
    /// now (see `Journal::done_paths`).
    pub(super) fn j_names_changed(&mut self) {
        if let Some(j) = &mut self.journal {
            j.done_paths.clear();
        }
    }

    /// Before an entry `rel` is created (or linked): `Ok(true)` if it was
    /// journaled (the name is free) or needs no journal (its directory is
    /// new since the checkpoint); `Ok(false)`: the name is taken (the
    /// creation fails, nothing to undo).
    pub(super) fn j_create(&mut self, rel: &[u8]) -> Result<bool, ApplyErrorKind> {
        if self.journal.is_none() {
            return Ok(true);
        }
        // In a directory created since the checkpoint nothing is journaled:
        // undoing the directory's creation removes it with all it holds
        // (what is renamed or linked out of it is journaled as such, and
        // comes back into it first). Nor is the name checked: a creation at
        // a taken name fails and changes nothing.
        self.j_touch(parent_of(rel))?;
        if self.journal.as_ref().is_some_and(|j| {
            j.done_paths
                .iter()
                .any(|(p, new)| *new && p.as_slice() == parent_of(rel))
        }) {
            return Ok(true);
        }
        let t = &self.cur()?.target;
        match t.locate_entry(rel)?.lstat() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Ok(_) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        let j = self.journal.as_mut().ok_or(ApplyErrorKind::NoSubvol)?;
        j.append(&Entry::Created { path: rel.to_vec() })?;
        Ok(true)
    }

    /// Whether `rel` was created since the checkpoint (nothing of it is
    /// saved).
    pub(super) fn j_new(&self, rel: &[u8]) -> bool {
        self.journal
            .as_ref()
            .is_some_and(|j| self.j_ino(rel).is_ok_and(|i| j.new.contains(&i)))
    }

    /// After `rel` was created: it is new (nothing of it is saved).
    pub(super) fn j_created(&mut self, rel: &[u8]) {
        if self.journal.is_none() {
            return;
        }
        if let Ok(ino) = self.j_ino(rel)
            && let Some(j) = &mut self.journal
        {
            j.new.insert(ino);
        }
    }

    /// Before RENAME `from` → `to`: journal it and move a replaced `to`
    /// to the trash.
    pub(super) fn j_rename(&mut self, from: &[u8], to: &[u8]) -> Result<(), ApplyErrorKind> {
        if self.journal.is_none() {
            return Ok(());
        }
        self.j_touch(parent_of(from))?;
        self.j_touch(parent_of(to))?;
        let t = &self.cur()?.target;
        let src = t.locate_entry(from)?.lstat()?;
        let dst = match t.locate_entry(to)?.lstat() {
            Ok(st) => Some(st),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        };
        // rename(2) of two names of one inode does nothing: nothing moves.
        let replaced = dst.filter(|d| d.st_ino != src.st_ino);
        let j = self.journal.as_mut().ok_or(ApplyErrorKind::NoSubvol)?;
        let trash = replaced.map(|_| j.trash_name());
        j.append(&Entry::Renamed {
            from: from.to_vec(),
            to: to.to_vec(),
            trash: trash.as_ref().map(|t| t.0),
        })?;
        if let Some((_, n)) = trash {
            self.j_to_trash(to, &n)?;
        }
        Ok(())
    }

    pub(super) fn j_to_trash(&mut self, rel: &[u8], n: &str) -> Result<(), ApplyErrorKind> {
        let cur = self.cur.as_ref().ok_or(ApplyErrorKind::NoSubvol)?;
        let j = self.journal.as_ref().ok_or(ApplyErrorKind::NoSubvol)?;
        let l = cur.target.locate_entry(rel)?;
        let moved = rustix::fs::renameat(&l.parent, l.name(), &j.trash, n);
        drop(l);
        cur.target.forget(rel);
        self.j_names_changed();
        moved?;
        Ok(())
    }

    /// UNLINK / RMDIR `rel` when journaling: moved to the trash (with the
    /// checks the system call would make).
    pub(super) fn j_unlink(&mut self, rel: &[u8], rmdir: bool) -> Result<(), ApplyErrorKind> {
        self.j_touch(parent_of(rel))?;
        let t = &self.cur()?.target;
        let l = t.locate_entry(rel)?;
        let st = l.lstat()?;
        let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        if rmdir && !is_dir {
            return Err(io::Error::from(Errno::NOTDIR).into());
        }
        if !rmdir && is_dir {
            return Err(io::Error::from(Errno::ISDIR).into());
        }
        if is_dir {
            let d = open_dir(l.parent.as_fd(), l.name())?;
            let mut empty = true;
            for e in rustix::fs::Dir::read_from(&d)? {
                let n = e?.file_name().to_bytes().to_vec();
                if n != b"." && n != b".." {
                    empty = false;
                    break;
                }
            }
            if !empty {
                return Err(io::Error::from(Errno::NOTEMPTY).into());
            }
        }
        drop(l);
        let j = self.journal.as_mut().ok_or(ApplyErrorKind::NoSubvol)?;
        let (n, name) = j.trash_name();
        j.append(&Entry::Trashed {
            path: rel.to_vec(),
            trash: n,
        })?;
        self.j_to_trash(rel, &name)
    }

    /// Before file data in `start..end` (`None`: to the end) of `rel`
    /// changes: save its attributes once, and the part of the range that
    /// held data at the checkpoint. Waits for the file's lane only when
    /// there is something to read.
    pub(super) fn j_data(
        &mut self,
        rel: &[u8],
        start: u64,
        end: Option<u64>,
    ) -> Result<(), ApplyErrorKind> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        let ino = self.j_ino(rel)?;
        if j.new.contains(&ino) {
            return Ok(());
        }
        if let Some(&s0) = j.touched.get(&ino)
            && start >= s0
        {
            return Ok(());
        }
        if self.j_touch_queued(rel, start)? {
            return Ok(());
        }
        self.settle(rel);
        self.j_touch(rel)?;
        let s0 = self
            .journal
            .as_ref()
            .and_then(|j| j.touched.get(&ino).copied())
            .unwrap_or(0);
        let hi = end.unwrap_or(u64::MAX).min(s0);
        if start >= hi {
            return Ok(());
        }
        let f = self.cur()?.target.open_regular(rel, false)?;
        let mut at = start;
        while at < hi {
            let n = (hi - at).min(PIECE);
            let mut buf = vec![0u8; usize::try_from(n).unwrap_or(0)];
            let mut got = 0;
            while got < buf.len() {
                match f.read_at(&mut buf[got..], at + got as u64) {
                    Ok(0) => break,
                    Ok(k) => got += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e.into()),
                }
            }
            buf.truncate(got);
            if buf.is_empty() {
                break;
            }
            let j = self.journal.as_mut().ok_or(ApplyErrorKind::NoSubvol)?;
            j.append(&Entry::Bytes {
                path: rel.to_vec(),
                offset: at,
                data: buf,
            })?;
            at += got as u64;
        }
        Ok(())
    }

    /// Whether a write of `rel` at `start` saves no data: `rel` is new
    /// since the checkpoint, or `start` is at or beyond its size at the
    /// checkpoint (its attributes and that size are journaled first if
    /// they were not yet, after its lane jobs, as [`Receiver::j_data`]
    /// does). `false` also when that cannot be found out: the caller then
    /// goes through [`Receiver::j_data`], which reports why.
    pub(super) fn j_appends(&mut self, rel: &[u8], start: u64) -> bool {
        let Ok(ino) = self.j_ino(rel) else {
            return false;
        };
        let Some(j) = &self.journal else {
            return true;
        };
        if j.new.contains(&ino) {
            return true;
        }
        if !j.touched.contains_key(&ino) {
            match self.j_touch_queued(rel, start) {
                Ok(true) => return true,
                Ok(false) => {}
                Err(_) => return false,
            }
            self.settle(rel);
            if self.j_touch(rel).is_err() {
                return false;
            }
        }
        self.journal
            .as_ref()
            .and_then(|j| j.touched.get(&ino))
            .is_some_and(|&s0| start >= s0)
    }

    /// Before SET_XATTR / REMOVE_XATTR `name` of `rel`: its value now.
    pub(super) fn j_xattr(&mut self, rel: &[u8], name: &[u8]) -> Result<(), ApplyErrorKind> {
        if self.journal.is_none() {
            return Ok(());
        }
        self.j_touch(rel)?;
        let l = self.cur()?.target.locate(rel)?;
        let p = l.proc_path();
        let n = OsStr::from_bytes(name);
        let mut buf = vec![0u8; 64 << 10];
        let old = match rustix::fs::lgetxattr(&p, n, &mut buf[..]) {
            Ok(k) => {
                buf.truncate(k);
                Some(buf)
            }
            Err(Errno::NODATA) => None,
            // The target has no such namespace (btrfs.* elsewhere): the
            // command changes nothing (`set_xattr` notes that it is not
            // set), so there is nothing to undo.
            Err(Errno::OPNOTSUPP) => return Ok(()),
            Err(Errno::RANGE) => {
                let k = rustix::fs::lgetxattr(&p, n, &mut [0u8; 0][..])?;
                let mut b = vec![0u8; k];
                let k = rustix::fs::lgetxattr(&p, n, &mut b[..])?;
                b.truncate(k);
                Some(b)
            }
            Err(e) => return Err(e.into()),
        };
        drop(l);
        let j = self.journal.as_mut().ok_or(ApplyErrorKind::NoSubvol)?;
        j.append(&Entry::Xattr {
            path: rel.to_vec(),
            name: name.to_vec(),
            old,
        })?;
        Ok(())
    }

    /// Roll the current directory back to checkpoint `index` with its
    /// journal in `rdir` and its trash `at`, then start a fresh journal
    /// there. The journals of later checkpoints (begun, not yet the resume
    /// point: see `Pending`) are undone first, the newest first, and then
    /// deleted.
    ///
    /// Each step is safe to make again (a rollback can itself be
    /// interrupted): each journal's header counts its steps done.
    pub(super) fn j_rollback(
        &mut self,
        rdir: BorrowedFd<'_>,
        index: u64,
        at: TrashAt<'_>,
    ) -> io::Result<()> {
        self.journal = None;
        let mut later: Vec<u64> = rustix::fs::Dir::read_from(rdir)?
            .filter_map(|e| {
                let e = e.ok()?;
                let n = e.file_name().to_str().ok()?;
                n.strip_prefix("undo-")?.parse::<u64>().ok()
            })
            .filter(|&k| k > index)
            .collect();
        later.sort_unstable_by(|a, b| b.cmp(a));
        for k in later.iter().copied().chain([index]) {
            self.j_undo_journal(rdir, k, at)?;
        }
        for k in later {
            let (undo, trash) = names(k);
            remove_tree(rdir, OsStr::new(&undo))?;
            if matches!(at, TrashAt::ResumeDir) {
                remove_tree(rdir, OsStr::new(&trash))?;
            }
        }
        // Fresh for what follows (whatever the trash still holds was
        // never part of the checkpoint's tree).
        self.journal = Some(Journal::create(rdir, index, at)?);
        Ok(())
    }

    /// Play journal `index` in `rdir` (with its trash `at`) backwards, from
    /// where an earlier rollback stopped; nothing if there is none.
    pub(super) fn j_undo_journal(
        &mut self,
        rdir: BorrowedFd<'_>,
        index: u64,
        at: TrashAt<'_>,
    ) -> io::Result<()> {
        let undo = names(index).0;
        let (tdir, trash) = at.place(rdir, index);
        match rustix::fs::openat(
            rdir,
            undo.as_str(),
            OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        ) {
            Err(Errno::NOENT) => {}
            r => {
                let file = File::from(r?);
                let (entries, done) = read_journal(&file)?;
                let trash_fd = match open_dir(tdir, OsStr::new(&trash)) {
                    Ok(fd) => Some(fd),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                    Err(e) => return Err(e),
                };
                let n = entries.len() as u64;
                let mut done = done.min(n);
                while done < n {
                    // OK to index: done < n = entries.len().
                    let e = &entries[usize::try_from(n - 1 - done).unwrap_or(0)];
                    self.undo(e, trash_fd.as_ref().map(|f| f.as_fd()))
                        .map_err(|err| {
                            io::Error::new(
                                err.kind(),
                                format!("cannot undo {}: {err}", describe(e)),
                            )
                        })?;
                    done += 1;
                    file.write_all_at(&done.to_le_bytes(), 8)?;
                }
            }
        }
        if let Some(cur) = &self.cur {
            cur.target.forget(b"");
        }
        Ok(())
    }

    /// Undo one entry.
    pub(super) fn undo(&mut self, e: &Entry, trash: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let cur = self
            .cur
            .as_ref()
            .ok_or_else(|| io::Error::other("no subvolume"))?;
        let t = &cur.target;
        let te = |e: crate::receive::target::TargetError| io::Error::other(e.to_string());
        let missing = |r: &io::Result<rustix::fs::Stat>| matches!(r, Err(e) if e.kind() == io::ErrorKind::NotFound);
        match e {
            Entry::Attr {
                path,
                mode,
                uid,
                gid,
                atime,
                mtime,
                size,
            } => {
                let l = t.locate(path).map_err(te)?;
                let st = l.lstat();
                if missing(&st) {
                    return Ok(());
                }
                let st = st?;
                if let Some(s) = size
                    && FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
                {
                    l.open_regular(true)?.set_len(*s)?;
                }
                struct Quiet;
                impl copy::Notes for Quiet {
                    fn note(&mut self, _: &'static str, _: String) {}
                }
                copy::set_owner(&l, *uid, *gid, &mut Quiet)?;
                copy::chmod_located(&l, *mode)?;
                let ts = |(s, n): (i64, u32)| Timespec {
                    tv_sec: s,
                    tv_nsec: n.into(),
                };
                let times = Timestamps {
                    last_access: ts(*atime),
                    last_modification: ts(*mtime),
                };
                rustix::fs::utimensat(&l.parent, l.name(), &times, AtFlags::SYMLINK_NOFOLLOW)?;
            }
            Entry::Created { path } => {
                let l = t.locate_entry(path).map_err(te)?;
                remove_tree(l.parent.as_fd(), l.name())?;
                drop(l);
                t.forget(path);
            }
            Entry::Renamed { from, to, trash: n } => {
                {
                    let a = t.locate_entry(from).map_err(te)?;
                    let b = t.locate_entry(to).map_err(te)?;
                    let (sa, sb) = (a.lstat(), b.lstat());
                    if missing(&sa) && sb.is_ok() {
                        rustix::fs::renameat(&b.parent, b.name(), &a.parent, a.name())?;
                    }
                }
                t.forget(b"");
                if let (Some(n), Some(tr)) = (n, trash) {
                    let name = format!("t{n}");
                    if rustix::fs::statat(tr, name.as_str(), AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                        let b = t.locate_entry(to).map_err(te)?;
                        rustix::fs::renameat(tr, name.as_str(), &b.parent, b.name())?;
                    }
                }
                t.forget(b"");
            }
            Entry::Trashed { path, trash: n } => {
                if let Some(tr) = trash {
                    let name = format!("t{n}");
                    if rustix::fs::statat(tr, name.as_str(), AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                        let l = t.locate_entry(path).map_err(te)?;
                        rustix::fs::renameat(tr, name.as_str(), &l.parent, l.name())?;
                    }
                }
                t.forget(b"");
            }
            Entry::Bytes { path, offset, data } => {
                let l = t.locate_entry(path).map_err(te)?;
                if missing(&l.lstat()) {
                    return Ok(());
                }
                l.open_regular(true)?.write_all_at(data, *offset)?;
            }
            Entry::Xattr { path, name, old } => {
                let l = t.locate(path).map_err(te)?;
                if missing(&l.lstat()) {
                    return Ok(());
                }
                let p = l.proc_path();
                let n = OsStr::from_bytes(name);
                match old {
                    Some(v) => rustix::fs::lsetxattr(&p, n, v, XattrFlags::empty())?,
                    None => match rustix::fs::lremovexattr(&p, n) {
                        Err(Errno::NODATA) => {}
                        r => r?,
                    },
                }
            }
        }
        Ok(())
    }
}
