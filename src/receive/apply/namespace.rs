//! The namespace commands: MKFILE, MKDIR, MKNOD, MKFIFO, MKSOCK, SYMLINK,
//! RENAME, LINK, UNLINK and RMDIR, the creation at its final name of a new
//! inode that the next command renames into place
//! ([`Receiver::create_renamed`]), and what keeps the receiver's caches
//! true when a name changes (the open file, the root's names, the lanes'
//! files). It must not touch file data or attributes: those are `data`'s
//! and `attrs`'.

use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt as _;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use stream_format::Command;

use super::offload::remove_under;
use super::{ROOT_NAMES, Receiver, WFile};
use crate::receive::ApplyErrorKind;
use crate::receive::target::{self};

impl Receiver<'_> {
    /// MKFILE: a new empty regular file, mode 0600 until CHMOD.
    pub(super) fn mkfile(&mut self, path: &[u8]) -> Result<(), ApplyErrorKind> {
        let l = self.cur()?.target.locate_entry(path)?;
        let f = create_file(&l)?;
        // The new, empty regular file is the one the next WRITEs go to: keep
        // it open (see `wcache`).
        self.wcache = Some(WFile::created(path, f)?);
        Ok(())
    }

    /// MKDIR: a new directory, mode 0700 until CHMOD.
    pub(super) fn mkdir(&mut self, path: &[u8]) -> Result<(), ApplyErrorKind> {
        let l = self.cur()?.target.locate_entry(path)?;
        rustix::fs::mkdirat(&l.parent, l.name(), Mode::from_raw_mode(0o700))?;
        Ok(())
    }

    /// MKNOD: a device node, FIFO or socket of the type in `mode`, mode
    /// 0600 until CHMOD.
    pub(super) fn mknod(
        &mut self,
        path: &[u8],
        mode: u64,
        rdev: u64,
    ) -> Result<(), ApplyErrorKind> {
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
    pub(super) fn mkspecial(&mut self, path: &[u8], ft: FileType) -> Result<(), ApplyErrorKind> {
        let l = self.cur()?.target.locate_entry(path)?;
        rustix::fs::mknodat(&l.parent, l.name(), ft, Mode::from_raw_mode(0o600), 0)?;
        Ok(())
    }

    /// SYMLINK: a symbolic link to `link` (its bytes verbatim).
    pub(super) fn symlink(&mut self, path: &[u8], link: &[u8]) -> Result<(), ApplyErrorKind> {
        if link.contains(&0) {
            return Err(ApplyErrorKind::Invalid("NUL byte in symlink target".into()));
        }
        let l = self.cur()?.target.locate_entry(path)?;
        rustix::fs::symlinkat(std::ffi::OsStr::from_bytes(link), &l.parent, l.name())?;
        Ok(())
    }

    /// RENAME `path` to `to` (replacing what is there, as rename(2)).
    pub(super) fn rename(&mut self, path: &[u8], to: &[u8]) -> Result<(), ApplyErrorKind> {
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
    pub(super) fn link(&mut self, path: &[u8], link: &[u8]) -> Result<(), ApplyErrorKind> {
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
    pub(super) fn unlink(&mut self, path: &[u8], flags: AtFlags) -> Result<(), ApplyErrorKind> {
        let l = self.cur()?.target.locate_entry(path)?;
        let r = rustix::fs::unlinkat(&l.parent, l.name(), flags);
        drop(l);
        self.removed(path, r.is_ok());
        r?;
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
    pub(super) fn root_created(&mut self, path: &[u8]) {
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
    pub(super) fn track_root(&mut self, cmd: &Command<'_>, ok: bool) {
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

    /// After a RENAME `from` → `to` (`ok`: it worked): the cached
    /// directories at or below either path are dropped; the cached file
    /// follows its inode to `to`, or is dropped if a path it lived at is
    /// gone. A failed rename changed nothing, but dropping is always safe.
    pub(super) fn renamed(&mut self, from: &[u8], to: &[u8], ok: bool) {
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
    pub(super) fn removed(&mut self, path: &[u8], ok: bool) {
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
}

/// Create a new regular file at `l` (`O_EXCL`, never following a final
/// symlink), open for reading and writing, mode 0600 until CHMOD.
/// A stream path of an entry in the subvolume root (one component).
pub(super) fn is_top(path: &[u8]) -> bool {
    !path.is_empty() && !path.contains(&b'/')
}

pub(super) fn create_file(l: &target::Located<'_>) -> Result<File, ApplyErrorKind> {
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(&l.parent, l.name(), flags, Mode::from_raw_mode(0o600))?;
    Ok(File::from(fd))
}
