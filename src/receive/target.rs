//! The receive target: the **only** place where a stream path becomes a
//! filesystem path.
//!
//! A send stream names files by paths relative to the root of the subvolume
//! being received (Linux `fs/btrfs/send.c`, `get_cur_path`): raw bytes,
//! `/`-separated, no leading `/`, no `.` or `..` components, the root itself
//! being the empty path. A hostile stream may break every one of those rules,
//! so this module
//!
//! * checks each path ([`check_path`]) and each subvolume name
//!   ([`check_subvol_name`]) before any system call: absolute paths, `.`,
//!   `..`, empty components, NUL bytes and over-long paths are refused;
//! * resolves the directories of a path with `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` from a directory fd of the
//!   subvolume root, so no component is ever a symlink and nothing outside the
//!   root is reached. Kernels without `openat2` (before 5.6, or a seccomp
//!   filter that refuses it) get an equivalent walk, one component at a time,
//!   with `O_PATH | O_NOFOLLOW | O_DIRECTORY`;
//! * hands the caller a [`Located`]: a verified parent directory fd and the
//!   final name (never containing `/`), on which every operation is an `*at`
//!   call that does not follow a final symlink (`AT_SYMLINK_NOFOLLOW`,
//!   `O_NOFOLLOW`), or a path `/proc/self/fd/N/name` built from that verified
//!   fd for the calls that only exist with a path (`lsetxattr`, `chmod`).
//!
//! The subvolume root is located as (DIR fd, subvolume name), so the root is
//! handled by the same code as every other path.
//!
//! Files that are written to are first opened with `O_PATH | O_NOFOLLOW`,
//! checked to be regular files, and only then reopened for writing through
//! `/proc/self/fd/N`: a stream cannot make us open a device or a fifo it
//! created (opening a device can have effects of its own).

use std::cell::RefCell;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};

/// Longest path the kernel sends (`PATH_MAX`, including room for the NUL).
pub const PATH_MAX: usize = 4096;

/// The name reserved in DIR for the records of received subvolumes (see
/// [`super::meta`]).
pub const RESERVED_NAME: &[u8] = b".btrsend";

/// Why a stream path or subvolume name was refused before any system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// The path starts with `/`.
    Absolute,
    /// A `..` component.
    DotDot,
    /// A `.` component.
    Dot,
    /// An empty component (`a//b`, or a trailing `/`).
    EmptyComponent,
    /// A NUL byte.
    Nul,
    /// Longer than [`PATH_MAX`].
    TooLong,
    /// The empty path (the subvolume root) where a name is needed.
    Root,
    /// A subvolume name containing `/`.
    Slash,
    /// The subvolume name [`RESERVED_NAME`].
    Reserved,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathError::Absolute => "absolute path refused",
            PathError::DotDot => "'..' component refused",
            PathError::Dot => "'.' component refused",
            PathError::EmptyComponent => "empty path component refused",
            PathError::Nul => "NUL byte in path refused",
            PathError::TooLong => "path longer than PATH_MAX refused",
            PathError::Root => "the subvolume root cannot be the target of this command",
            PathError::Slash => "'/' in subvolume name refused",
            PathError::Reserved => "subvolume name reserved for btrsend's records",
        })
    }
}

impl std::error::Error for PathError {}

/// A failure of this layer: a refused path, or the OS error of a lookup.
#[derive(Debug)]
pub enum TargetError {
    /// The path was refused before any system call.
    Path(PathError),
    /// A system call failed.
    Io(io::Error),
}

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetError::Path(e) => e.fmt(f),
            TargetError::Io(e)
                if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) =>
            {
                write!(
                    f,
                    "{e} (a path component is a symlink: refusing to follow it)"
                )
            }
            TargetError::Io(e) => e.fmt(f),
        }
    }
}

/// The message is the cause's, so there is no `source()` (a chain printer
/// would repeat it).
impl std::error::Error for TargetError {}

impl From<PathError> for TargetError {
    fn from(e: PathError) -> Self {
        TargetError::Path(e)
    }
}

impl From<io::Error> for TargetError {
    fn from(e: io::Error) -> Self {
        TargetError::Io(e)
    }
}

impl From<rustix::io::Errno> for TargetError {
    fn from(e: rustix::io::Errno) -> Self {
        TargetError::Io(e.into())
    }
}

/// Result of this layer.
pub type Result<T, E = TargetError> = std::result::Result<T, E>;

/// Check a stream path (relative to the subvolume root; empty = the root).
///
/// # Errors
///
/// The first rule the path breaks.
pub fn check_path(path: &[u8]) -> Result<(), PathError> {
    if path.len() >= PATH_MAX {
        return Err(PathError::TooLong);
    }
    if path.contains(&0) {
        return Err(PathError::Nul);
    }
    if path.is_empty() {
        return Ok(());
    }
    if path.first() == Some(&b'/') {
        return Err(PathError::Absolute);
    }
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" => return Err(PathError::EmptyComponent),
            b"." => return Err(PathError::Dot),
            b".." => return Err(PathError::DotDot),
            _ => {}
        }
    }
    Ok(())
}

/// Check the name of a received subvolume (SUBVOL / SNAPSHOT PATH): one
/// component, not [`RESERVED_NAME`].
///
/// # Errors
///
/// The first rule the name breaks.
pub fn check_subvol_name(name: &[u8]) -> Result<(), PathError> {
    if name.is_empty() {
        return Err(PathError::Root);
    }
    if name.first() == Some(&b'/') {
        return Err(PathError::Absolute);
    }
    if name.contains(&b'/') {
        return Err(PathError::Slash);
    }
    check_path(name)?;
    if name == RESERVED_NAME {
        return Err(PathError::Reserved);
    }
    Ok(())
}

/// `openat2` support, probed once: 0 unknown, 1 available, 2 missing.
static OPENAT2: AtomicU8 = AtomicU8::new(0);

/// Force the component-by-component fallback (tests of the fallback).
#[doc(hidden)]
pub fn force_fallback_walk(on: bool) {
    OPENAT2.store(if on { 2 } else { 0 }, Ordering::Relaxed);
}

/// Open `rel` (checked, non-empty) beneath `root` as an `O_PATH` directory,
/// following no symlink in any component.
fn open_dir_beneath(root: BorrowedFd<'_>, rel: &[u8]) -> Result<OwnedFd> {
    if OPENAT2.load(Ordering::Relaxed) != 2 {
        // No O_NOFOLLOW here: with it, O_PATH would open a final symlink
        // itself (then ENOTDIR); without it RESOLVE_NO_SYMLINKS says ELOOP.
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        match rustix::fs::openat2(root, OsStr::from_bytes(rel), flags, Mode::empty(), resolve) {
            Ok(fd) => {
                OPENAT2.store(1, Ordering::Relaxed);
                return Ok(fd);
            }
            // Not implemented, or refused by a seccomp filter: walk instead.
            Err(e)
                if OPENAT2.load(Ordering::Relaxed) == 0
                    && (e == rustix::io::Errno::NOSYS || e == rustix::io::Errno::PERM) =>
            {
                OPENAT2.store(2, Ordering::Relaxed);
            }
            Err(e) => return Err(e.into()),
        }
    }
    // Fallback: `rel` has no `.`, `..` or empty component (checked), and each
    // step refuses a symlink, so
    // the walk cannot leave `root`. With O_PATH | O_NOFOLLOW a symlink is
    // opened as itself, which O_DIRECTORY then refuses (ENOTDIR).
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut cur: Option<OwnedFd> = None;
    for c in rel.split(|&b| b == b'/') {
        let at = cur.as_ref().map_or(root, |fd| fd.as_fd());
        let next = rustix::fs::openat(at, OsStr::from_bytes(c), flags, Mode::empty())?;
        cur = Some(next);
    }
    // OK to unwrap: `rel` is non-empty, so the loop ran at least once.
    Ok(cur.expect("non-empty path"))
}

/// A directory fd that is either borrowed (DIR, the subvolume root), owned
/// (a directory opened for one command) or shared with the [`Target`]'s
/// cache of resolved directories.
#[derive(Debug)]
pub enum DirFd<'a> {
    /// Borrowed from the [`Target`].
    Borrowed(BorrowedFd<'a>),
    /// Opened for this lookup.
    Owned(OwnedFd),
    /// From the directory cache (see [`Target::forget`]).
    Shared(Arc<OwnedFd>),
}

impl AsFd for DirFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            DirFd::Borrowed(fd) => *fd,
            DirFd::Owned(fd) => fd.as_fd(),
            DirFd::Shared(fd) => fd.as_fd(),
        }
    }
}

/// A stream path resolved to a verified parent directory and a final name.
#[derive(Debug)]
pub struct Located<'a> {
    /// The directory that holds `name`.
    pub parent: DirFd<'a>,
    /// The final component: non-empty, no `/`, not `.` or `..`.
    pub name: &'a [u8],
}

impl Located<'_> {
    /// The final name as an `OsStr`, for `*at` calls.
    pub fn name(&self) -> &OsStr {
        OsStr::from_bytes(self.name)
    }

    /// `/proc/self/fd/<parent>/<name>`: a path for the calls that have no
    /// `*at` form. Only the last component (`name`) is looked up by name, in
    /// the verified parent; callers use the `l*` (no-follow) variants.
    pub fn proc_path(&self) -> PathBuf {
        let mut p = OsString::from(format!(
            "/proc/self/fd/{}/",
            self.parent.as_fd().as_raw_fd()
        ));
        p.push(self.name());
        PathBuf::from(p)
    }

    /// `fstatat(parent, name, AT_SYMLINK_NOFOLLOW)`.
    ///
    /// # Errors
    ///
    /// The OS error.
    pub fn lstat(&self) -> io::Result<Stat> {
        Ok(rustix::fs::statat(
            &self.parent,
            self.name(),
            AtFlags::SYMLINK_NOFOLLOW,
        )?)
    }

    /// Open the object itself with `O_PATH | O_NOFOLLOW` (a symlink is opened
    /// as the link, never followed).
    ///
    /// # Errors
    ///
    /// The OS error.
    pub fn open_path(&self) -> io::Result<OwnedFd> {
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        Ok(rustix::fs::openat(
            &self.parent,
            self.name(),
            flags,
            Mode::empty(),
        )?)
    }

    /// Open a regular file for reading or writing (`write` picks `O_RDWR`),
    /// refusing anything that is not a regular file before it is opened for
    /// I/O (see the module doc).
    ///
    /// # Errors
    ///
    /// `EINVAL`-like errors for a non-regular file; the OS error otherwise.
    pub fn open_regular(&self, write: bool) -> io::Result<File> {
        Ok(self.open_regular_stat(write)?.0)
    }

    /// [`Located::open_regular`], with the file's status (from the check
    /// that it is a regular file: no second `fstat`).
    pub fn open_regular_stat(&self, write: bool) -> io::Result<(File, rustix::fs::Stat)> {
        let opath = self.open_path()?;
        let st = rustix::fs::fstat(&opath)?;
        let ft = FileType::from_raw_mode(st.st_mode);
        if ft != FileType::RegularFile {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not a regular file ({})", file_type_name(ft)),
            ));
        }
        Ok((reopen(&opath, write)?, st))
    }
}

/// Reopen an `O_PATH` fd of a regular file for I/O through
/// `/proc/self/fd/N` (the magic link names the very inode: no path lookup).
fn reopen(opath: &OwnedFd, write: bool) -> io::Result<File> {
    let p = format!("/proc/self/fd/{}", opath.as_raw_fd());
    let mode = if write { OFlags::RDWR } else { OFlags::RDONLY };
    let fd = rustix::fs::open(
        p.as_str(),
        mode | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| {
        if e == rustix::io::Errno::NOENT {
            io::Error::new(
                io::ErrorKind::NotFound,
                "/proc is not mounted: btrsend receive needs /proc/self/fd",
            )
        } else {
            e.into()
        }
    })?;
    Ok(File::from(fd))
}

/// A short name of a file type, for messages.
pub fn file_type_name(ft: FileType) -> &'static str {
    match ft {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symlink",
        FileType::Fifo => "fifo",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Unknown => "unknown file type",
    }
}

/// The directory DIR that subvolumes are received into.
#[derive(Debug)]
pub struct ReceiveDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl ReceiveDir {
    /// Open DIR (it must exist and be a directory; a symlink DIR given by the
    /// user on the command line is followed, as `btrfs receive` does).
    ///
    /// # Errors
    ///
    /// The OS error.
    pub fn open(path: &Path) -> io::Result<ReceiveDir> {
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(ReceiveDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// DIR's fd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// DIR as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `DIR/<name>` for messages (`name` checked by the caller).
    pub fn display_path(&self, name: &[u8]) -> PathBuf {
        concat_display(&self.path, &[name])
    }

    /// Open the existing directory `DIR/<name>` as a [`Target`].
    ///
    /// # Errors
    ///
    /// A refused name, or the OS error (a symlink `DIR/<name>` is refused).
    pub fn target(&self, name: &[u8]) -> Result<Target> {
        check_subvol_name(name)?;
        let root = open_dir_beneath(self.fd(), name)?;
        Ok(Target {
            dir: self.fd.try_clone()?,
            dir_path: self.path.clone(),
            name: name.to_vec(),
            root,
            dirs: RefCell::new(Vec::new()),
        })
    }
}

/// How many resolved directories a [`Target`] keeps open.
const DIR_CACHE: usize = 8;

/// One received subvolume: `DIR/<name>`, with every stream path resolved
/// beneath it.
///
/// The directories that [`Target::locate`] resolves are kept in a small
/// cache (stream path → `O_PATH` fd, most recent last), so the commands that
/// follow each other on one file do not resolve its directory again. Each fd
/// was opened beneath the root with the same checks as an uncached lookup
/// and names a directory inode of this subvolume; our own commands can only
/// move a directory within the subvolume (every RENAME destination is
/// resolved beneath the root too), so a cached fd never leads outside it.
/// What can go stale is the *name*: the receiver calls [`Target::forget`]
/// for both paths of every RENAME and for every RMDIR, which drops the
/// entries at and below those paths.
#[derive(Debug)]
pub struct Target {
    dir: OwnedFd,
    dir_path: PathBuf,
    name: Vec<u8>,
    root: OwnedFd,
    dirs: RefCell<Vec<(Vec<u8>, Arc<OwnedFd>)>>,
}

/// `p` is `dir` or lies beneath it.
pub fn is_at_or_under(p: &[u8], dir: &[u8]) -> bool {
    p.strip_prefix(dir)
        .is_some_and(|rest| rest.is_empty() || rest.first() == Some(&b'/'))
}

impl Target {
    /// The subvolume's name in DIR.
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The subvolume root's fd (`O_PATH`).
    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// The filesystem path of a stream path, for messages only (never used to
    /// reach a file).
    pub fn display(&self, rel: &[u8]) -> PathBuf {
        concat_display(&self.dir_path, &[&self.name, rel])
    }

    /// Resolve `rel` to its verified parent directory and final name. The
    /// empty path (the root) is (DIR, subvolume name).
    ///
    /// # Errors
    ///
    /// A refused path, or the OS error of the parent lookup (`ELOOP` for a
    /// symlink component, `ENOENT`, `ENOTDIR`).
    pub fn locate<'a>(&'a self, rel: &'a [u8]) -> Result<Located<'a>> {
        check_path(rel)?;
        if rel.is_empty() {
            return Ok(Located {
                parent: DirFd::Borrowed(self.dir.as_fd()),
                name: &self.name,
            });
        }
        match rel.iter().rposition(|&b| b == b'/') {
            None => Ok(Located {
                parent: DirFd::Borrowed(self.root.as_fd()),
                name: rel,
            }),
            Some(i) => {
                // OK to index: `i` is a position inside `rel`.
                let (dir, name) = (&rel[..i], &rel[i + 1..]);
                Ok(Located {
                    parent: DirFd::Shared(self.cached_dir(dir)?),
                    name,
                })
            }
        }
    }

    /// The directory `dir` (checked, non-empty) from the cache, or resolved
    /// now and cached.
    fn cached_dir(&self, dir: &[u8]) -> Result<Arc<OwnedFd>> {
        let mut dirs = self.dirs.borrow_mut();
        if let Some(i) = dirs.iter().rposition(|(p, _)| p.as_slice() == dir) {
            let e = dirs.remove(i);
            let fd = Arc::clone(&e.1);
            dirs.push(e);
            return Ok(fd);
        }
        let fd = Arc::new(open_dir_beneath(self.root.as_fd(), dir)?);
        if dirs.len() >= DIR_CACHE {
            dirs.remove(0);
        }
        dirs.push((dir.to_vec(), Arc::clone(&fd)));
        Ok(fd)
    }

    /// Drop the cached directories at or beneath the stream path `rel` (it
    /// was renamed, replaced or removed). The empty path drops all.
    pub fn forget(&self, rel: &[u8]) {
        let mut dirs = self.dirs.borrow_mut();
        if rel.is_empty() {
            dirs.clear();
        } else {
            dirs.retain(|(p, _)| !is_at_or_under(p, rel));
        }
    }

    /// Like [`Target::locate`], but the root is refused (for commands that
    /// create, remove or rename an entry).
    ///
    /// # Errors
    ///
    /// As [`Target::locate`], plus [`PathError::Root`].
    pub fn locate_entry<'a>(&'a self, rel: &'a [u8]) -> Result<Located<'a>> {
        if rel.is_empty() {
            return Err(PathError::Root.into());
        }
        self.locate(rel)
    }

    /// Open the directory `rel` beneath the root (`O_PATH`), following no
    /// symlink; the empty path is the root itself.
    ///
    /// # Errors
    ///
    /// A refused path, or the OS error.
    pub fn open_dir(&self, rel: &[u8]) -> Result<OwnedFd> {
        check_path(rel)?;
        if rel.is_empty() {
            return Ok(self.root.try_clone()?);
        }
        open_dir_beneath(self.root.as_fd(), rel)
    }

    /// Open the regular file `rel` for I/O (see [`Located::open_regular`]).
    ///
    /// # Errors
    ///
    /// A refused path, a non-regular file, or the OS error.
    pub fn open_regular(&self, rel: &[u8], write: bool) -> Result<File> {
        Ok(self.locate_entry(rel)?.open_regular(write)?)
    }

    /// [`Target::open_regular`], with the file's status.
    pub fn open_regular_stat(&self, rel: &[u8], write: bool) -> Result<(File, rustix::fs::Stat)> {
        Ok(self.locate_entry(rel)?.open_regular_stat(write)?)
    }
}

/// `base/part1/part2` by plain concatenation: unlike `Path::join`, an
/// absolute (hostile) part does not replace what comes before it, so a
/// message shows where the path would really have been. Empty parts are
/// skipped.
fn concat_display(base: &Path, parts: &[&[u8]]) -> PathBuf {
    let mut b = base.as_os_str().as_bytes().to_vec();
    for part in parts.iter().filter(|p| !p.is_empty()) {
        if b.last() != Some(&b'/') {
            b.push(b'/');
        }
        b.extend_from_slice(part);
    }
    PathBuf::from(OsString::from_vec(b))
}

/// The filesystem path of the stream path `rel` in the subvolume whose root
/// is displayed as `base` ([`Target::display`] of the empty path), for
/// messages only.
pub fn display_under(base: &Path, rel: &[u8]) -> PathBuf {
    concat_display(base, &[rel])
}

/// The raw bytes of a path (for messages and records).
pub fn path_bytes(p: &Path) -> Vec<u8> {
    p.as_os_str().to_owned().into_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_path_rules() {
        assert_eq!(check_path(b""), Ok(()));
        assert_eq!(check_path(b"a/b c/\xff"), Ok(()));
        assert_eq!(check_path(b"/etc/passwd"), Err(PathError::Absolute));
        assert_eq!(check_path(b"a/../../x"), Err(PathError::DotDot));
        assert_eq!(check_path(b".."), Err(PathError::DotDot));
        assert_eq!(check_path(b"a/./b"), Err(PathError::Dot));
        assert_eq!(check_path(b"a//b"), Err(PathError::EmptyComponent));
        assert_eq!(check_path(b"a/"), Err(PathError::EmptyComponent));
        assert_eq!(check_path(b"a\0b"), Err(PathError::Nul));
        assert_eq!(check_path(&[b'a'; PATH_MAX]), Err(PathError::TooLong));
        assert_eq!(check_path(b"..a/.b/..."), Ok(()));
    }

    #[test]
    fn check_subvol_name_rules() {
        assert_eq!(check_subvol_name(b"snap"), Ok(()));
        assert_eq!(check_subvol_name(b""), Err(PathError::Root));
        assert_eq!(check_subvol_name(b"a/b"), Err(PathError::Slash));
        assert_eq!(check_subvol_name(b"/a"), Err(PathError::Absolute));
        assert_eq!(check_subvol_name(b".."), Err(PathError::DotDot));
        assert_eq!(check_subvol_name(b"."), Err(PathError::Dot));
        assert_eq!(check_subvol_name(b".btrsend"), Err(PathError::Reserved));
    }

    fn setup() -> (tempfile::TempDir, Target) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("dir");
        std::fs::create_dir_all(root.join("sv/a/b")).unwrap();
        std::fs::write(root.join("sv/a/f"), b"x").unwrap();
        std::fs::create_dir(tmp.path().join("outside")).unwrap();
        std::fs::write(tmp.path().join("outside/secret"), b"s").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("outside"), root.join("sv/a/out")).unwrap();
        std::os::unix::fs::symlink("../..", root.join("sv/a/up")).unwrap();
        std::os::unix::fs::symlink("f", root.join("sv/a/lf")).unwrap();
        let rd = ReceiveDir::open(&root).unwrap();
        let t = rd.target(b"sv").unwrap();
        (tmp, t)
    }

    /// ELOOP (openat2) or ENOTDIR (the fallback walk opens the link itself).
    fn is_eloop(e: &TargetError) -> bool {
        let codes = [
            rustix::io::Errno::LOOP.raw_os_error(),
            rustix::io::Errno::NOTDIR.raw_os_error(),
        ];
        matches!(e, TargetError::Io(e) if e.raw_os_error().is_some_and(|c| codes.contains(&c)))
    }

    fn refuses_symlink_components() {
        let (_tmp, t) = setup();
        // A symlink in a directory component is never followed.
        assert!(is_eloop(&t.locate(b"a/out/secret").unwrap_err()));
        assert!(is_eloop(&t.locate(b"a/up/x").unwrap_err()));
        assert!(is_eloop(&t.open_dir(b"a/out").unwrap_err()));
        // A final symlink is located (as the link itself) but never opened
        // for I/O.
        let l = t.locate(b"a/lf").unwrap();
        assert_eq!(l.name, b"lf");
        assert!(l.open_regular(false).is_err());
        assert!(t.open_regular(b"a/out", true).is_err());
        // Ordinary paths work.
        let mut s = String::new();
        std::io::Read::read_to_string(&mut t.open_regular(b"a/f", false).unwrap(), &mut s).unwrap();
        assert_eq!(s, "x");
        t.open_dir(b"a/b").unwrap();
        assert!(matches!(
            t.locate_entry(b""),
            Err(TargetError::Path(PathError::Root))
        ));
        let root = t.locate(b"").unwrap();
        assert_eq!(root.name, b"sv");
        assert!(matches!(
            t.locate(b"../x"),
            Err(TargetError::Path(PathError::DotDot))
        ));
    }

    #[test]
    fn symlink_components_refused_openat2_and_fallback() {
        refuses_symlink_components();
        force_fallback_walk(true);
        refuses_symlink_components();
        force_fallback_walk(false);
    }

    #[test]
    fn non_regular_files_are_not_opened() {
        let (tmp, t) = setup();
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            tmp.path().join("dir/sv/a/fifo").as_path(),
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
        // Would block forever if the fifo were opened.
        let e = t.open_regular(b"a/fifo", true).unwrap_err();
        assert!(e.to_string().contains("not a regular file (fifo)"), "{e}");
        assert!(t.open_regular(b"a/b", true).is_err());
    }
}
