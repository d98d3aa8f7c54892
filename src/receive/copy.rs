//! Copying data and trees inside DIR: the range copy behind CLONE and the
//! whole-tree copy that makes a SNAPSHOT's starting point from its parent.
//!
//! Holes stay holes. A range is copied by walking the source's data and holes
//! with `lseek(SEEK_DATA)` / `lseek(SEEK_HOLE)`, each step starting where the
//! previous one stopped (never from the start again, which would make large
//! sparse files quadratic); data runs go through `copy_file_range` (a reflink
//! on btrfs and XFS, an in-kernel copy elsewhere), holes are punched or, in a
//! fresh file, simply skipped. A whole file is first tried as a reflink
//! (`FICLONE`), which keeps holes and shares data where the filesystem can.
//!
//! The tree copy keeps what `btrfs subvolume snapshot` keeps: file types,
//! contents and sparseness, hard links, symlink targets, device numbers,
//! owners, modes (with setuid/setgid/sticky), extended attributes, and
//! access/modification times. Inode flags (`chattr`) are not copied. Owners
//! need root: as an ordinary user a failed `chown` is reported once through
//! `notes`, not as an error.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::sync::{Condvar, Mutex, PoisonError};

use rustix::fs::{
    AtFlags, FallocateFlags, FileType, Mode, OFlags, SeekFrom, Stat, Timespec, Timestamps,
    XattrFlags,
};
use rustix::io::Errno;

use super::target::{Located, Target};

/// Notes that are reported once per receive (not errors).
pub trait Notes {
    /// Record a note; the same `key` is reported only once.
    fn note(&mut self, key: &'static str, msg: String);
}

/// Size of the buffer of the read/write fallback copy.
const COPY_BUF: usize = 1 << 20;

fn is_unsupported(e: Errno) -> bool {
    matches!(
        e,
        Errno::XDEV | Errno::INVAL | Errno::OPNOTSUPP | Errno::NOSYS | Errno::NOTTY | Errno::BADF
    )
}

/// Copy `len` data bytes from `src` at `s` to `dst` at `d` (no hole logic):
/// `copy_file_range`, else `pread`/`pwrite`. Stops early at the source's end.
fn copy_data(src: &File, mut s: u64, dst: &File, mut d: u64, mut len: u64) -> io::Result<()> {
    let mut use_cfr = true;
    let mut buf = Vec::new();
    while len > 0 {
        let chunk = usize::try_from(len.min(1 << 30)).unwrap_or(1 << 30);
        if use_cfr {
            match rustix::fs::copy_file_range(src, Some(&mut s), dst, Some(&mut d), chunk) {
                Ok(0) => return Ok(()),
                // copy_file_range advanced `s` and `d` itself.
                Ok(n) => len -= u64::try_from(n).unwrap_or(len).min(len),
                Err(e) if is_unsupported(e) => use_cfr = false,
                Err(e) => return Err(e.into()),
            }
            continue;
        }
        if buf.is_empty() {
            buf = vec![0u8; COPY_BUF];
        }
        let want = chunk.min(buf.len());
        // OK to slice: `want <= buf.len()`.
        let n = src.read_at(&mut buf[..want], s)?;
        if n == 0 {
            return Ok(());
        }
        dst.write_all_at(&buf[..n], d)?;
        let n64 = u64::try_from(n).unwrap_or(len);
        s += n64;
        d += n64;
        len -= n64.min(len);
    }
    Ok(())
}

/// Make `[off, off+len)` of `dst` read as zeros without writing zeros:
/// punch a hole (keeping the size); where the filesystem cannot, write zeros
/// over the part that holds data.
fn zero_range(dst: &File, off: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let size = dst.metadata()?.len();
    if off >= size {
        return Ok(());
    }
    let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    match rustix::fs::fallocate(dst, mode, off, len) {
        Ok(()) => Ok(()),
        Err(e) if is_unsupported(e) => {
            let end = off.saturating_add(len).min(size);
            let zeros = vec![0u8; COPY_BUF];
            let mut p = off;
            while p < end {
                let n = usize::try_from(end - p).unwrap_or(COPY_BUF).min(COPY_BUF);
                // OK to slice: `n <= COPY_BUF`.
                dst.write_all_at(&zeros[..n], p)?;
                p += u64::try_from(n).unwrap_or(end - p);
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Copy `[src_off, src_off+len)` of `src` over `[dst_off, dst_off+len)` of
/// `dst` as CLONE does: data runs copied, holes kept as holes, and `dst`
/// grown to `dst_off + len` if it was shorter. `fresh` says `dst` has no data
/// in the range (nothing to punch). `len == 0` means "to the source's end".
///
/// # Errors
///
/// The OS error.
pub fn copy_range(
    src: &File,
    src_off: u64,
    dst: &File,
    dst_off: u64,
    len: u64,
    fresh: bool,
) -> io::Result<()> {
    let src_size = src.metadata()?.len();
    let len = if len == 0 {
        src_size.saturating_sub(src_off)
    } else {
        len
    };
    let end = src_off
        .checked_add(len)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "source range overflows"))?;
    let dst_end = dst_off.checked_add(len).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "destination range overflows")
    })?;
    // Past the source's end everything reads as zeros: a hole.
    let data_end = end.min(src_size);
    let mut pos = src_off;
    while pos < data_end {
        let data = match rustix::fs::seek(src, SeekFrom::Data(pos)) {
            Ok(d) => d.min(data_end),
            Err(Errno::NXIO) => data_end,
            // No SEEK_DATA support: everything is data.
            Err(e) if is_unsupported(e) => pos,
            Err(e) => return Err(e.into()),
        };
        if data > pos && !fresh {
            zero_range(dst, dst_off + (pos - src_off), data - pos)?;
        }
        if data >= data_end {
            pos = data_end;
            break;
        }
        let hole = match rustix::fs::seek(src, SeekFrom::Hole(data)) {
            Ok(h) => h.min(data_end),
            Err(e) if is_unsupported(e) => data_end,
            Err(e) => return Err(e.into()),
        };
        copy_data(src, data, dst, dst_off + (data - src_off), hole - data)?;
        pos = hole.max(data + 1).min(data_end);
    }
    if pos < end && !fresh {
        zero_range(dst, dst_off + (pos - src_off), end - pos)?;
    }
    if dst.metadata()?.len() < dst_end {
        dst.set_len(dst_end)?;
    }
    Ok(())
}

/// Copy a whole regular file into a new, empty `dst`: a reflink where the
/// filesystem can, else [`copy_range`] (which grows `dst` to `size`, so the
/// size is exact: `dst` was empty).
fn copy_file_contents(src: &File, dst: &File, size: u64) -> io::Result<()> {
    match rustix::fs::ioctl_ficlone(dst, src) {
        Ok(()) => return Ok(()),
        Err(e) if is_unsupported(e) || e == Errno::PERM => {}
        Err(e) => return Err(e.into()),
    }
    copy_range(src, 0, dst, 0, size, true)
}

/// The attributes of an entry, read from the source, set on the copy.
struct Meta {
    st: Stat,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Read every xattr of the object at `path` (a `/proc/self/fd/N/name`
/// path: `l*` calls do not follow a final symlink).
fn read_xattrs(path: &std::path::Path) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    xattrs_with(
        |buf| match buf {
            Some(b) => rustix::fs::llistxattr(path, b),
            None => rustix::fs::llistxattr_query(path),
        },
        |name, buf| match buf {
            Some(b) => rustix::fs::lgetxattr(path, name, b),
            None => rustix::fs::lgetxattr_query(path, name),
        },
    )
}

/// [`read_xattrs`] of an open file.
fn read_xattrs_fd(f: &File) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    xattrs_with(
        |buf| match buf {
            Some(b) => rustix::fs::flistxattr(f, b),
            None => rustix::fs::flistxattr_query(f),
        },
        |name, buf| match buf {
            Some(b) => rustix::fs::fgetxattr(f, name, b),
            None => rustix::fs::fgetxattr_query(f, name),
        },
    )
}

/// Every xattr, by `list` (the names; `None`: their length) and `get` (a
/// value; `None`: its length).
fn xattrs_with(
    list: impl Fn(Option<&mut [u8]>) -> rustix::io::Result<usize>,
    get: impl Fn(&OsStr, Option<&mut [u8]>) -> rustix::io::Result<usize>,
) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let n = match list(None) {
        Ok(n) => n,
        Err(Errno::OPNOTSUPP) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut names = vec![0u8; n];
    let n = list(Some(&mut names))?;
    names.truncate(n);
    let mut out = Vec::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name_os = OsStr::from_bytes(name);
        let len = match get(name_os, None) {
            Ok(l) => l,
            Err(Errno::NODATA) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut val = vec![0u8; len];
        let l = get(name_os, Some(&mut val))?;
        val.truncate(l);
        out.push((name.to_vec(), val));
    }
    Ok(out)
}

/// Set owner, mode, xattrs and times on `dst`, in that order (a `chown`
/// clears setuid bits and `security.capability`, so both come after it).
fn apply_meta(dst: &Located<'_>, m: &Meta, notes: &mut dyn Notes) -> io::Result<()> {
    let ft = FileType::from_raw_mode(m.st.st_mode);
    set_owner(dst, m.st.st_uid, m.st.st_gid, notes)?;
    if ft != FileType::Symlink {
        chmod_located(dst, m.st.st_mode & 0o7777)?;
    }
    if !m.xattrs.is_empty() {
        let p = dst.proc_path();
        for (k, v) in &m.xattrs {
            rustix::fs::lsetxattr(&p, OsStr::from_bytes(k), v, XattrFlags::empty())?;
        }
    }
    rustix::fs::utimensat(
        &dst.parent,
        dst.name(),
        &times_of(&m.st),
        AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

/// [`apply_meta`] of a regular file through its open fd `f` (no path
/// lookups).
fn apply_meta_fd(f: &File, m: &Meta, notes: &mut dyn Notes) -> io::Result<()> {
    set_owner_fd(f, m.st.st_uid, m.st.st_gid, notes)?;
    rustix::fs::fchmod(f, Mode::from_raw_mode(m.st.st_mode & 0o7777))?;
    for (k, v) in &m.xattrs {
        rustix::fs::fsetxattr(f, OsStr::from_bytes(k), v, XattrFlags::empty())?;
    }
    rustix::fs::futimens(f, &times_of(&m.st))?;
    Ok(())
}

/// The access and modification times of `st`.
fn times_of(st: &Stat) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec.try_into().unwrap_or(0),
        },
        last_modification: Timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec.try_into().unwrap_or(0),
        },
    }
}

/// `lchown`; as an ordinary user `EPERM` is a note, not an error.
///
/// # Errors
///
/// The OS error (other than a non-root `EPERM`).
pub fn set_owner(dst: &Located<'_>, uid: u32, gid: u32, notes: &mut dyn Notes) -> io::Result<()> {
    let r = rustix::fs::chownat(
        &dst.parent,
        dst.name(),
        Some(rustix::fs::Uid::from_raw_unchecked(uid)),
        Some(rustix::fs::Gid::from_raw_unchecked(gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    );
    owner_result(r, notes)
}

/// The result of a chown: a non-root `EPERM` is a note, not an error.
fn owner_result(r: rustix::io::Result<()>, notes: &mut dyn Notes) -> io::Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(Errno::PERM) if !rustix::process::geteuid().is_root() => {
            notes.note(
                "chown",
                "not running as root: file owners (uid/gid) were not set, files belong to the receiving user".into(),
            );
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// [`set_owner`] of an open file.
///
/// # Errors
///
/// The OS error (other than a non-root `EPERM`).
pub fn set_owner_fd(f: &impl AsFd, uid: u32, gid: u32, notes: &mut dyn Notes) -> io::Result<()> {
    let r = rustix::fs::fchown(
        f,
        Some(rustix::fs::Uid::from_raw_unchecked(uid)),
        Some(rustix::fs::Gid::from_raw_unchecked(gid)),
    );
    owner_result(r, notes)
}

/// `chmod` of the object itself: opened `O_PATH | O_NOFOLLOW`, then changed
/// through `/proc/self/fd/N` (which names that inode, so a final symlink is
/// never followed). Symlinks have no mode of their own: nothing to do.
///
/// # Errors
///
/// The OS error.
pub fn chmod_located(dst: &Located<'_>, mode: u32) -> io::Result<()> {
    let fd = dst.open_path()?;
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
        return Ok(());
    }
    let p = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::fs::chmod(p.as_str(), Mode::from_raw_mode(mode & 0o7777))?;
    Ok(())
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        return name.to_vec();
    }
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    p.extend_from_slice(dir);
    p.push(b'/');
    p.extend_from_slice(name);
    p
}

fn read_dir_names(dir: BorrowedFd<'_>) -> io::Result<Vec<Vec<u8>>> {
    let fd: OwnedFd = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut d = rustix::fs::Dir::new(fd)?;
    let mut names = Vec::new();
    while let Some(ent) = d.read() {
        let ent = ent?;
        let n = ent.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(n.to_vec());
        }
    }
    names.sort();
    Ok(names)
}

/// Copy the regular file `src` (its `lstat` `st`) to a new file `name` in
/// `ddir`, with its attributes: read, copied and set through open files
/// (no path lookups after the two opens).
fn copy_regular(
    src: &Located<'_>,
    ddir: BorrowedFd<'_>,
    name: &OsStr,
    st: Stat,
    notes: &mut dyn Notes,
) -> io::Result<()> {
    let s = src.open_regular(false)?;
    let meta = Meta {
        xattrs: read_xattrs_fd(&s)?,
        st,
    };
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let d = File::from(rustix::fs::openat(
        ddir,
        name,
        flags,
        Mode::from_raw_mode(0o600),
    )?);
    let size = u64::try_from(meta.st.st_size).unwrap_or(0);
    copy_file_contents(&s, &d, size)?;
    apply_meta_fd(&d, &meta, notes)
}

/// An error of the tree copy: the source-relative path it is about.
#[derive(Debug)]
pub struct CopyError {
    /// Path relative to the subvolume roots.
    pub path: Vec<u8>,
    /// What failed.
    pub source: io::Error,
}

/// Copy every entry of `src` (a received subvolume) into `dst` (a new, empty
/// subvolume directory), then the root's own attributes.
///
/// Directories are copied by several threads at once (each takes a
/// directory, makes its entries and queues its subdirectories; everything
/// through directory fds, so no path is looked up twice). Entries with
/// more than one link are copied afterwards on this thread, in path order:
/// the first name gets the copy, the others are linked to it. Directory
/// attributes come last, deepest first, so that setting a parent's times
/// comes after everything made in it.
///
/// # Errors
///
/// The first failure, with the path it is about.
pub fn copy_tree(src: &Target, dst: &Target, notes: &mut dyn Notes) -> Result<(), CopyError> {
    let err = |path: &[u8]| {
        let path = path.to_vec();
        move |source: io::Error| CopyError {
            path: path.clone(),
            source,
        }
    };
    let tgt = |path: &[u8]| {
        let path = path.to_vec();
        move |e: super::target::TargetError| CopyError {
            path: path.clone(),
            source: match e {
                super::target::TargetError::Io(e) => e,
                super::target::TargetError::Path(p) => {
                    io::Error::new(io::ErrorKind::InvalidInput, p.to_string())
                }
            },
        }
    };
    let work = Work {
        state: Mutex::new(WorkState {
            queue: VecDeque::from([DirJob {
                rel: Vec::new(),
                src: src.open_dir(b"").map_err(tgt(b""))?,
                dst: dst.open_dir(b"").map_err(tgt(b""))?,
            }]),
            busy: 0,
            error: None,
        }),
        cv: Condvar::new(),
        dirs: Mutex::new(Vec::new()),
        linked: Mutex::new(Vec::new()),
        notes: Mutex::new(Vec::new()),
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(COPY_THREADS));
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(|| work.run());
        }
        work.run();
    });
    let Work {
        state,
        dirs,
        linked,
        notes: noted,
        ..
    } = work;
    for (k, m) in noted.into_inner().unwrap_or_else(PoisonError::into_inner) {
        notes.note(k, m);
    }
    if let Some(e) = state
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner)
        .error
    {
        return Err(e);
    }
    // Entries with several links, in path order: the first name of each
    // inode is copied, the later ones linked to it.
    let mut linked = linked.into_inner().unwrap_or_else(PoisonError::into_inner);
    linked.sort_by(|a, b| a.0.cmp(&b.0));
    let mut firsts: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    for (crel, st) in linked {
        let e = err(&crel);
        let dl = dst.locate_entry(&crel).map_err(tgt(&crel))?;
        let key = (st.st_dev, st.st_ino);
        if let Some(first) = firsts.get(&key) {
            let fl = dst.locate_entry(first).map_err(tgt(&crel))?;
            rustix::fs::linkat(
                &fl.parent,
                fl.name(),
                &dl.parent,
                dl.name(),
                AtFlags::empty(),
            )
            .map_err(|x| e(x.into()))?;
            continue;
        }
        let sl = src.locate_entry(&crel).map_err(tgt(&crel))?;
        copy_entry(sl.parent.as_fd(), dl.parent.as_fd(), sl.name, st, notes).map_err(&e)?;
        drop((sl, dl));
        firsts.insert(key, crel);
    }
    // Deepest directories first, so setting a parent's times comes last.
    let mut dirs = dirs.into_inner().unwrap_or_else(PoisonError::into_inner);
    dirs.sort_by_key(|(rel, _)| std::cmp::Reverse(rel.iter().filter(|&&b| b == b'/').count()));
    for (rel, meta) in &dirs {
        let loc = dst.locate_entry(rel).map_err(tgt(rel))?;
        apply_meta(&loc, meta, notes).map_err(err(rel))?;
    }
    let sroot = src.locate(b"").map_err(tgt(b""))?;
    let root_meta = Meta {
        st: rustix::fs::statat(&sroot.parent, sroot.name(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|x| err(b"")(x.into()))?,
        xattrs: read_xattrs(&sroot.proc_path()).map_err(err(b""))?,
    };
    let droot = dst.locate(b"").map_err(tgt(b""))?;
    apply_meta(&droot, &root_meta, notes).map_err(err(b""))?;
    Ok(())
}

/// Threads of a tree copy (at most; fewer on fewer CPUs).
const COPY_THREADS: usize = 4;

/// A directory to copy the entries of: its path and both directories.
struct DirJob {
    rel: Vec<u8>,
    src: OwnedFd,
    dst: OwnedFd,
}

/// The queue of a tree copy's threads.
struct WorkState {
    queue: VecDeque<DirJob>,
    /// Threads copying a directory now (which may queue more).
    busy: usize,
    /// The first failure: the copy stops.
    error: Option<CopyError>,
}

/// What the threads of a tree copy share.
struct Work {
    state: Mutex<WorkState>,
    /// Signalled when a job is queued or a thread finishes one.
    cv: Condvar,
    /// Directories made, with the attributes to set at the end.
    dirs: Mutex<Vec<(Vec<u8>, Meta)>>,
    /// Entries with several links, copied afterwards.
    linked: Mutex<Vec<(Vec<u8>, Stat)>>,
    /// Notes of the threads.
    notes: Mutex<Vec<(&'static str, String)>>,
}

/// Notes collected by one thread of a tree copy.
#[derive(Default)]
struct Collect(Vec<(&'static str, String)>);

impl Notes for Collect {
    fn note(&mut self, key: &'static str, msg: String) {
        if !self.0.iter().any(|(k, _)| *k == key) {
            self.0.push((key, msg));
        }
    }
}

impl Work {
    fn lock(&self) -> std::sync::MutexGuard<'_, WorkState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Take directories until none is queued and no thread may queue more
    /// (or one failed).
    fn run(&self) {
        let mut notes = Collect::default();
        loop {
            let job = {
                let mut st = self.lock();
                loop {
                    if st.error.is_some() {
                        break None;
                    }
                    if let Some(j) = st.queue.pop_front() {
                        st.busy += 1;
                        break Some(j);
                    }
                    if st.busy == 0 {
                        break None;
                    }
                    st = self.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
                }
            };
            let Some(job) = job else {
                break;
            };
            let r = self.copy_dir(&job, &mut notes);
            let mut st = self.lock();
            st.busy -= 1;
            if let Err(e) = r
                && st.error.is_none()
            {
                st.error = Some(e);
            }
            drop(st);
            self.cv.notify_all();
        }
        self.cv.notify_all();
        self.notes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(notes.0);
    }

    /// Copy the entries of one directory: subdirectories are made and
    /// queued, entries with several links put aside, the rest copied.
    fn copy_dir(&self, job: &DirJob, notes: &mut dyn Notes) -> Result<(), CopyError> {
        let err = |path: &[u8], source: io::Error| CopyError {
            path: path.to_vec(),
            source,
        };
        let names = read_dir_names(job.src.as_fd()).map_err(|x| err(&job.rel, x))?;
        for name in names {
            if self.lock().error.is_some() {
                return Ok(());
            }
            let crel = join(&job.rel, &name);
            let name_os = OsStr::from_bytes(&name);
            let st = rustix::fs::statat(&job.src, name_os, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|x| err(&crel, x.into()))?;
            let ft = FileType::from_raw_mode(st.st_mode);
            if ft != FileType::Directory {
                if st.st_nlink > 1 {
                    self.linked
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((crel, st));
                } else {
                    copy_entry(job.src.as_fd(), job.dst.as_fd(), &name, st, notes)
                        .map_err(|x| err(&crel, x))?;
                }
                continue;
            }
            let sloc = Located {
                parent: super::target::DirFd::Borrowed(job.src.as_fd()),
                name: &name,
            };
            let meta = Meta {
                xattrs: read_xattrs(&sloc.proc_path()).map_err(|x| err(&crel, x))?,
                st,
            };
            rustix::fs::mkdirat(&job.dst, name_os, Mode::from_raw_mode(0o700))
                .map_err(|x| err(&crel, x.into()))?;
            let open = |d: &OwnedFd| {
                rustix::fs::openat(
                    d,
                    name_os,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|x| err(&crel, x.into()))
            };
            let sub = DirJob {
                src: open(&job.src)?,
                dst: open(&job.dst)?,
                rel: crel.clone(),
            };
            self.dirs
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((crel, meta));
            self.lock().queue.push_back(sub);
            self.cv.notify_one();
        }
        Ok(())
    }
}

/// Copy the entry `name` of `sdir` (not a directory; its `lstat` `st`) to
/// a new entry of `ddir`, with its attributes.
fn copy_entry(
    sdir: BorrowedFd<'_>,
    ddir: BorrowedFd<'_>,
    name: &[u8],
    st: Stat,
    notes: &mut dyn Notes,
) -> io::Result<()> {
    let ft = FileType::from_raw_mode(st.st_mode);
    let name_os = OsStr::from_bytes(name);
    let sloc = Located {
        parent: super::target::DirFd::Borrowed(sdir),
        name,
    };
    match ft {
        FileType::RegularFile => return copy_regular(&sloc, ddir, name_os, st, notes),
        FileType::Symlink => {
            let t = rustix::fs::readlinkat(sdir, name_os, Vec::new())?;
            rustix::fs::symlinkat(t.as_c_str(), ddir, name_os)?;
        }
        FileType::Fifo | FileType::Socket | FileType::CharacterDevice | FileType::BlockDevice => {
            rustix::fs::mknodat(ddir, name_os, ft, Mode::from_raw_mode(0o600), st.st_rdev)?;
        }
        FileType::Directory | FileType::Unknown => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "unknown file type",
            ));
        }
    }
    let meta = Meta {
        xattrs: read_xattrs(&sloc.proc_path())?,
        st,
    };
    let dloc = Located {
        parent: super::target::DirFd::Borrowed(ddir),
        name,
    };
    apply_meta(&dloc, &meta, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_map(f: &File) -> Vec<(u64, u64)> {
        let size = f.metadata().unwrap().len();
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < size {
            let Ok(d) = rustix::fs::seek(f, SeekFrom::Data(pos)) else {
                break;
            };
            let h = rustix::fs::seek(f, SeekFrom::Hole(d)).unwrap();
            out.push((d, h - d));
            pos = h;
        }
        out
    }

    #[test]
    fn copy_tree_copies_every_entry_link_and_attribute() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = super::super::target::ReceiveDir::open(tmp.path()).unwrap();
        let (s, d) = (tmp.path().join("s"), tmp.path().join("d"));
        std::fs::create_dir(&s).unwrap();
        std::fs::create_dir(&d).unwrap();
        // Enough directories that several threads take some, with hard
        // links across them, and every kind of entry.
        for i in 0..12 {
            let sub = s.join(format!("d{i}/e{}", i % 3));
            std::fs::create_dir_all(&sub).unwrap();
            for j in 0..5 {
                let f = sub.join(format!("f{j}"));
                std::fs::write(&f, vec![(i * 5 + j) as u8; 100 * j + i]).unwrap();
                std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640 + j as u32))
                    .unwrap();
            }
            std::os::unix::fs::symlink(format!("../d{i}"), s.join(format!("d{i}/up"))).unwrap();
        }
        std::fs::hard_link(s.join("d3/e0/f1"), s.join("d7/e1/linked")).unwrap();
        std::fs::hard_link(s.join("d3/e0/f1"), s.join("top-link")).unwrap();
        std::os::unix::fs::symlink("d1", s.join("sym")).unwrap();
        std::os::unix::fs::symlink("d1", s.join("d2/sym-linked")).unwrap();
        std::fs::hard_link(s.join("d2/sym-linked"), s.join("d5/sym-linked2")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            s.join("d4/fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o620),
            0,
        )
        .unwrap();
        let big = File::create(s.join("d6/sparse")).unwrap();
        big.write_all_at(b"end", 5 << 20).unwrap();
        let xattr_ok =
            rustix::fs::setxattr(s.join("d8/e2/f2"), "user.k", b"v", XattrFlags::empty()).is_ok();
        std::fs::set_permissions(s.join("d9"), std::fs::Permissions::from_mode(0o1750)).unwrap();
        let t = |sec| Timespec {
            tv_sec: sec,
            tv_nsec: 7,
        };
        for (i, p) in ["d0/e0/f0", "d9", "d0", "", "d6/sparse"].iter().enumerate() {
            let ts = Timestamps {
                last_access: t(1000 + i as i64),
                last_modification: t(2000 + i as i64),
            };
            rustix::fs::utimensat(rustix::fs::CWD, s.join(p), &ts, AtFlags::empty()).unwrap();
        }
        let src = dir.target(b"s").unwrap();
        let dst = dir.target(b"d").unwrap();
        struct Fail;
        impl Notes for Fail {
            fn note(&mut self, k: &'static str, m: String) {
                panic!("note {k}: {m}");
            }
        }
        copy_tree(&src, &dst, &mut Fail).unwrap();
        // The project's manifest: type, mode, owner, size, mtime, link
        // group, xattrs, content hash and data ranges of every path.
        let manifest = |root: &std::path::Path| {
            crate::manifest::manifest(root, crate::manifest::Options { holes: true }).unwrap()
        };
        let (want, got) = (manifest(&s), manifest(&d));
        // The header, the root, then the entries.
        assert_eq!(want.lines().count(), 2 + 12 * (1 + 1 + 5 + 1) + 7);
        assert_eq!(got, want);
        if xattr_ok {
            assert!(got.contains(" xattr:user.k=v"));
        }
        // The sparse file stays sparse; the root's own attributes are copied.
        let m = std::fs::metadata(d.join("d6/sparse")).unwrap();
        assert!(std::os::unix::fs::MetadataExt::blocks(&m) < 1024);
        let (ms, md) = (
            std::fs::metadata(&s).unwrap(),
            std::fs::metadata(&d).unwrap(),
        );
        assert_eq!(ms.modified().unwrap(), md.modified().unwrap());
        assert_eq!(ms.permissions().mode(), md.permissions().mode());
    }

    #[test]
    fn copy_range_keeps_holes_and_grows() {
        let tmp = tempfile::tempdir().unwrap();
        let src = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(tmp.path().join("s"))
            .unwrap();
        src.write_all_at(&[1u8; 4096], 0).unwrap();
        src.write_all_at(&[2u8; 4096], 1 << 20).unwrap();
        src.set_len(2 << 20).unwrap();
        let dst = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(tmp.path().join("d"))
            .unwrap();
        copy_range(&src, 0, &dst, 0, 2 << 20, true).unwrap();
        assert_eq!(dst.metadata().unwrap().len(), 2 << 20);
        let map = data_map(&dst);
        // Only the two data blocks are allocated (the filesystem may round).
        let total: u64 = map.iter().map(|(_, l)| l).sum();
        assert!(total < (1 << 20), "{map:?}");
        let mut b = [0u8; 1];
        dst.read_exact_at(&mut b, 1 << 20).unwrap();
        assert_eq!(b, [2]);
        // Cloning a hole over data zeroes it without writing data.
        let dst2 = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(tmp.path().join("d2"))
            .unwrap();
        dst2.write_all_at(&[9u8; 8192], 0).unwrap();
        copy_range(&src, 4096, &dst2, 0, 8192, false).unwrap();
        let mut b = [7u8; 8192];
        dst2.read_exact_at(&mut b, 0).unwrap();
        assert!(b.iter().all(|&x| x == 0));
    }
}
