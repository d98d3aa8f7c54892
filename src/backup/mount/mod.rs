//! `backup mount`: every stored snapshot of a repository as a read-only
//! FUSE filesystem, read from the browsing index ([`crate::backup::index`])
//! and the streams its extents point into.
//!
//! The layout of the mount and its inode numbers are [`view`]'s; each
//! snapshot's index is read on a thread of its own (`worker`). This
//! module is the only one that knows FUSE (the `fuser` crate, without
//! libfuse: as root it calls mount(2) itself, otherwise it runs
//! `fusermount3`), as `backup::s3` is the only one that knows
//! tokio.
//!
//! What a snapshot's files show: type, mode, owner, size, link count and
//! the modification time as stored (the index keeps no other time, so
//! atime and ctime show it too), xattrs, symlink targets, device numbers,
//! holes (`SEEK_DATA`/`SEEK_HOLE` find them; they read as zeros). Every
//! name of a hard link has one inode number. Nothing can be written: the
//! mount is read-only and every write operation that still reaches it is
//! refused with `EROFS`.
//!
//! A damaged index (a page that does not match its name, a record that
//! does not parse, an inode number out of range) fails the operation that
//! met it with `EIO`, and says so once through the report callback; it is
//! never answered with other data.

pub mod view;
mod worker;

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FopenFlags, Generation, INodeNo, MountOption, OpenAccMode,
    OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
};

use self::view::{Ino, Node, View};
use self::worker::{Open, Workers};
use crate::backup::index::IndexError;
use crate::backup::index::model::{FileType, Inode, ROOT_INO};
use crate::backup::{BackupError, Catalog, Repository};

/// How long the kernel may keep names and attributes: a mounted
/// repository holds its shared lock, so its catalog cannot change.
const TTL: Duration = Duration::from_secs(24 * 3600);

/// Distinct problems reported, at most (then one last line says so).
const MAX_REPORTS: usize = 1000;

/// How a mount is made.
#[derive(Debug, Clone, Copy, Default)]
pub struct MountOptions {
    /// Let every user in (FUSE's `allow_other`); the kernel checks each
    /// access against the stored owner and mode (`default_permissions`).
    pub allow_other: bool,
}

/// Where problems met while the mount serves are said (one line each,
/// not escaped: the receiver escapes them).
pub type Report = Arc<dyn Fn(&str) + Send + Sync>;

/// A mounted repository, not yet served.
pub struct Mount {
    session: fuser::Session<BackupFs>,
    mountpoint: PathBuf,
    shown: usize,
}

/// Unmounts a [`Mount`] from another thread (a signal handler's).
#[derive(Debug, Clone)]
pub struct Unmounter {
    mountpoint: PathBuf,
}

impl Unmounter {
    /// What unmounts whatever is mounted on `mountpoint` (made absolute
    /// now, as the mount makes it).
    pub fn new(mountpoint: &Path) -> Unmounter {
        Unmounter {
            mountpoint: std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.into()),
        }
    }

    /// Unmount (with `lazy`, detach it even while it is busy: it goes
    /// when the last file in it is closed).
    ///
    /// # Errors
    ///
    /// umount(2) failed, e.g. `EBUSY`.
    pub fn unmount(&self, lazy: bool) -> std::io::Result<()> {
        let flags = if lazy {
            rustix::mount::UnmountFlags::DETACH
        } else {
            rustix::mount::UnmountFlags::empty()
        };
        rustix::mount::unmount(&self.mountpoint, flags).map_err(std::io::Error::from)
    }

    /// The mount point.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }
}

impl Mount {
    /// Mount every snapshot of `cat` (the catalog of `repo`, read under
    /// the lock its caller holds) on `mountpoint`; problems met later go
    /// to `report`, and so do the catalog entries the view leaves out.
    ///
    /// # Errors
    ///
    /// The repository's streams cannot be read with its keys (a write key
    /// alone), or the mount fails.
    pub fn new(
        repo: Arc<Repository>,
        cat: Catalog,
        mountpoint: &Path,
        opts: MountOptions,
        report: Report,
    ) -> Result<Mount, BackupError> {
        repo.need_contents("mount")?;
        let (view, notes) = View::new(&cat.entries);
        for n in &notes {
            report(n);
        }
        let shown = view.snapshots.len();
        let fs = BackupFs {
            workers: Workers::new(repo, Arc::new(cat)),
            shared: Arc::new(Shared {
                view,
                dirs: Mutex::new(HashMap::new()),
                next_fh: AtomicU64::new(1),
                reports: Mutex::new(HashSet::new()),
                report,
                uid: rustix::process::geteuid().as_raw(),
                gid: rustix::process::getegid().as_raw(),
                since: SystemTime::now(),
            }),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("btrsend".into()),
            MountOption::Subtype("btrsend".into()),
            MountOption::RO,
            MountOption::NoDev,
            MountOption::NoSuid,
            MountOption::DefaultPermissions,
        ];
        if opts.allow_other {
            config.acl = fuser::SessionACL::All;
        }
        let session =
            fuser::Session::new(fs, mountpoint, &config).map_err(|error| BackupError::Io {
                what: format!("mounting on {}", mountpoint.display()),
                error,
            })?;
        Ok(Mount {
            session,
            mountpoint: Unmounter::new(mountpoint).mountpoint,
            shown,
        })
    }

    /// How many snapshots the mount shows.
    pub fn snapshots(&self) -> usize {
        self.shown
    }

    /// What unmounts it from another thread.
    pub fn unmounter(&self) -> Unmounter {
        Unmounter {
            mountpoint: self.mountpoint.clone(),
        }
    }

    /// Serve requests until the filesystem is unmounted.
    ///
    /// # Errors
    ///
    /// Reading from the FUSE device failed.
    pub fn run(self) -> Result<(), BackupError> {
        let what = format!("serving the mount on {}", self.mountpoint.display());
        self.session
            .run()
            .map_err(|error| BackupError::Io { what, error })
    }
}

/// A directory listing being read (`opendir` to `releasedir`).
type Listing = Arc<Vec<(Vec<u8>, u64, fuser::FileType)>>;

/// What the session and the snapshots' threads share.
struct Shared {
    view: View,
    dirs: Mutex<HashMap<u64, Listing>>,
    next_fh: AtomicU64,
    reports: Mutex<HashSet<String>>,
    report: Report,
    uid: u32,
    gid: u32,
    since: SystemTime,
}

/// Why an operation failed.
enum Fail {
    /// An answer for the caller, nothing wrong with the repository.
    Errno(Errno),
    /// The index is damaged, or data cannot be read.
    Index(IndexError),
    /// The snapshot cannot be opened.
    Open(String),
}

impl From<IndexError> for Fail {
    fn from(e: IndexError) -> Fail {
        Fail::Index(e)
    }
}

impl Shared {
    /// The errno of `f`; a problem of the repository is reported (once)
    /// and is `EIO`.
    fn errno(&self, id: u64, f: Fail) -> Errno {
        let msg = match f {
            Fail::Errno(e) => return e,
            Fail::Index(e) => e.to_string(),
            Fail::Open(m) => m,
        };
        let name = self
            .view
            .shown(id)
            .map(|s| String::from_utf8_lossy(&s.name).into_owned())
            .unwrap_or_default();
        let line = format!("mount: snapshot {name} (entry {id}): {msg}");
        let mut seen = self.reports.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() < MAX_REPORTS && seen.insert(line.clone()) {
            (self.report)(&line);
            if seen.len() == MAX_REPORTS {
                (self.report)("mount: more problems are not reported");
            }
        }
        Errno::EIO
    }

    /// The attributes of the view's node `n`.
    fn view_attr(&self, n: u64) -> Option<FileAttr> {
        let (kind, perm, size, time) = match self.view.node(n)? {
            Node::Dir { .. } => (fuser::FileType::Directory, 0o555, 0, self.since),
            Node::Link { target, time } => (
                fuser::FileType::Symlink,
                0o777,
                target.len() as u64,
                time.map_or(self.since, |t| system_time(t, 0)),
            ),
        };
        Some(FileAttr {
            ino: INodeNo(n),
            size,
            blocks: 0,
            atime: time,
            mtime: time,
            ctime: time,
            crtime: time,
            kind,
            perm,
            nlink: if kind == fuser::FileType::Directory {
                2
            } else {
                1
            },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }
}

/// The time `sec` seconds and `nsec` nanoseconds from the epoch.
fn system_time(sec: i64, nsec: u32) -> SystemTime {
    let t = if sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(sec.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(sec.unsigned_abs()))
    };
    t.and_then(|t| t.checked_add(Duration::from_nanos(u64::from(nsec))))
        .unwrap_or(UNIX_EPOCH)
}

fn kind_of(k: FileType) -> fuser::FileType {
    match k {
        FileType::File => fuser::FileType::RegularFile,
        FileType::Dir => fuser::FileType::Directory,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::Sock => fuser::FileType::Socket,
        FileType::Chr => fuser::FileType::CharDevice,
        FileType::Blk => fuser::FileType::BlockDevice,
    }
}

/// The FUSE number of inode `ino` of entry `id`, or the error of a damaged
/// index that names an inode beyond what a mount can number.
fn number(id: u64, ino: u64, key: &[u8]) -> Result<u64, IndexError> {
    view::fuse_ino(id, ino).ok_or_else(|| IndexError::Record {
        what: "directory entry",
        key: key.to_vec(),
        reason: "names an inode number out of range",
    })
}

/// The attributes of `inode` as FUSE inode `n`.
fn attr(n: u64, ino: u64, inode: &Inode) -> Result<FileAttr, IndexError> {
    let rdev = if matches!(inode.kind, FileType::Chr | FileType::Blk) {
        // The kernel's 32-bit encoding (new_encode_dev), which FUSE uses.
        let (major, minor) = inode.rdev_parts();
        if major >= 1 << 12 || minor >= 1 << 20 {
            return Err(IndexError::Record {
                what: "inode",
                key: crate::backup::index::model::inode_key(ino),
                reason: "a device number FUSE cannot show",
            });
        }
        (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
    } else {
        0
    };
    let t = system_time(inode.mtime.0, inode.mtime.1);
    Ok(FileAttr {
        ino: INodeNo(n),
        size: inode.size,
        blocks: if inode.kind == FileType::File {
            inode.size.div_ceil(512)
        } else {
            0
        },
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind: kind_of(inode.kind),
        // OK: `Inode::decode` checks `mode <= 0o7777`.
        perm: u16::try_from(inode.mode & 0o7777).unwrap_or(0),
        nlink: inode.nlink,
        uid: inode.uid,
        gid: inode.gid,
        rdev,
        blksize: 4096,
        flags: 0,
    })
}

/// A reply that can fail.
trait Answer: Send + 'static {
    fn fail(self, e: Errno);
}

macro_rules! answer {
    ($($t:ty),*) => {$(
        impl Answer for $t {
            fn fail(self, e: Errno) {
                self.error(e);
            }
        }
    )*};
}
answer!(
    ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, ReplyXattr, ReplyLseek
);

/// The filesystem.
struct BackupFs {
    workers: Workers,
    shared: Arc<Shared>,
}

impl BackupFs {
    /// Run `work` on snapshot `id`'s thread and answer with `done`, or
    /// fail `reply`.
    fn on<A: Answer, T>(
        &self,
        id: u64,
        reply: A,
        work: impl for<'a> FnOnce(&'a Open<'a>) -> Result<T, Fail> + Send + 'static,
        done: impl FnOnce(A, T) + Send + 'static,
    ) {
        let Some(shown) = self.shared.view.shown(id) else {
            reply.fail(Errno::ENOENT);
            return;
        };
        let sh = Arc::clone(&self.shared);
        self.workers.run(id, shown.entry, move |open| {
            let r = match open {
                Ok(o) => work(o),
                Err(m) => Err(Fail::Open(m.to_owned())),
            };
            match r {
                Ok(t) => done(reply, t),
                Err(f) => reply.fail(sh.errno(id, f)),
            }
        });
    }

    /// Answer with the attributes of inode `ino` of snapshot `id`.
    fn entry_of(&self, id: u64, ino: u64, reply: ReplyEntry) {
        self.on(
            id,
            reply,
            move |o| {
                let n = number(id, ino, &[])?;
                Ok(attr(n, ino, &o.inode(ino)?)?)
            },
            |r, a| r.entry(&TTL, &a, Generation(0)),
        );
    }
}

impl fuser::Filesystem for BackupFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name.as_bytes().to_vec();
        match view::split(parent.0) {
            Ino::View(dir) => match self.shared.view.lookup(dir, &name).map(view::split) {
                None => reply.error(Errno::ENOENT),
                Some(Ino::View(n)) => match self.shared.view_attr(n) {
                    Some(a) => reply.entry(&TTL, &a, Generation(0)),
                    None => reply.error(Errno::ENOENT),
                },
                Some(Ino::Snapshot { id, ino }) => self.entry_of(id, ino, reply),
            },
            Ino::Snapshot { id, ino: dir } => self.on(
                id,
                reply,
                move |o| {
                    let key = crate::backup::index::model::dirent_key(dir, &name);
                    let child = o
                        .snap
                        .child(dir, &name)?
                        .ok_or(Fail::Errno(Errno::ENOENT))?;
                    let n = number(id, child, &key)?;
                    Ok(attr(n, child, &o.inode(child)?)?)
                },
                |r, a| r.entry(&TTL, &a, Generation(0)),
            ),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match view::split(ino.0) {
            Ino::View(n) => match self.shared.view_attr(n) {
                Some(a) => reply.attr(&TTL, &a),
                None => reply.error(Errno::ENOENT),
            },
            Ino::Snapshot { id, ino: i } => {
                let n = ino.0;
                self.on(
                    id,
                    reply,
                    move |o| Ok(attr(n, i, &o.inode(i)?)?),
                    |r, a| r.attr(&TTL, &a),
                );
            }
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match view::split(ino.0) {
            Ino::View(n) => match self.shared.view.node(n) {
                Some(Node::Link { target, .. }) => reply.data(target),
                _ => reply.error(Errno::EINVAL),
            },
            Ino::Snapshot { id, ino } => self.on(
                id,
                reply,
                move |o| {
                    let i = o.inode(ino)?;
                    if i.kind != FileType::Symlink {
                        return Err(Fail::Errno(Errno::EINVAL));
                    }
                    Ok(i.target)
                },
                |r, t| r.data(&t),
            ),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc_o_trunc() != 0 {
            reply.error(Errno::EROFS);
            return;
        }
        // Contents never change while mounted: keep them cached.
        reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let Ino::Snapshot { id, ino } = view::split(ino.0) else {
            reply.error(Errno::EISDIR);
            return;
        };
        let size = (size as usize).min(16 << 20);
        self.on(
            id,
            reply,
            move |o| {
                let inode = o.inode(ino)?;
                match inode.kind {
                    FileType::File => {}
                    FileType::Dir => return Err(Fail::Errno(Errno::EISDIR)),
                    _ => return Err(Fail::Errno(Errno::EINVAL)),
                }
                let mut buf = vec![0u8; size];
                let n = o.snap.read(ino, &inode, offset, &mut buf, o.data)?;
                buf.truncate(n);
                Ok(buf)
            },
            |r, b| r.data(&b),
        );
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let Ino::Snapshot { id, ino: dir } = view::split(ino.0) else {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_CACHE_DIR);
            return;
        };
        let sh = Arc::clone(&self.shared);
        let own = ino.0;
        self.on(
            id,
            reply,
            move |o| {
                let inode = o.inode(dir)?;
                if inode.kind != FileType::Dir {
                    return Err(Fail::Errno(Errno::ENOTDIR));
                }
                let parent = if dir == ROOT_INO {
                    view::UUID_DIR
                } else {
                    number(id, inode.parent, &[])?
                };
                let mut items = vec![
                    (b".".to_vec(), own, fuser::FileType::Directory),
                    (b"..".to_vec(), parent, fuser::FileType::Directory),
                ];
                o.snap.children(dir, &mut |name, child| {
                    let key = crate::backup::index::model::dirent_key(dir, name);
                    let n = number(id, child, &key)?;
                    let kind = kind_of(o.snap.inode(child)?.kind);
                    items.push((name.to_vec(), n, kind));
                    Ok(std::ops::ControlFlow::Continue(()))
                })?;
                Ok(items)
            },
            move |r, items| {
                let fh = sh.next_fh.fetch_add(1, Ordering::Relaxed);
                sh.dirs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(fh, Arc::new(items));
                r.opened(
                    FileHandle(fh),
                    FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
                );
            },
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listing: Listing = match view::split(ino.0) {
            Ino::View(n) => match self.shared.view.node(n) {
                Some(Node::Dir { parent, entries }) => {
                    let mut items = vec![
                        (b".".to_vec(), n, fuser::FileType::Directory),
                        (b"..".to_vec(), *parent, fuser::FileType::Directory),
                    ];
                    for (name, child) in entries {
                        let kind = match view::split(*child) {
                            Ino::Snapshot { .. } => fuser::FileType::Directory,
                            Ino::View(c) => match self.shared.view.node(c) {
                                Some(Node::Link { .. }) => fuser::FileType::Symlink,
                                _ => fuser::FileType::Directory,
                            },
                        };
                        items.push((name.clone(), *child, kind));
                    }
                    Arc::new(items)
                }
                _ => {
                    reply.error(Errno::ENOTDIR);
                    return;
                }
            },
            Ino::Snapshot { .. } => {
                let dirs = self
                    .shared
                    .dirs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                match dirs.get(&fh.0) {
                    Some(l) => Arc::clone(l),
                    None => {
                        reply.error(Errno::EBADF);
                        return;
                    }
                }
            }
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (name, n, kind)) in listing.iter().enumerate().skip(start) {
            if reply.add(INodeNo(*n), i as u64 + 1, *kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.shared
            .dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(0, 0, 0, 0, 0, 4096, 255, 4096);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let Ino::Snapshot { id, ino } = view::split(ino.0) else {
            reply.error(Errno::NO_XATTR);
            return;
        };
        let name = name.as_bytes().to_vec();
        self.on(
            id,
            reply,
            move |o| {
                let all = o.snap.xattrs(ino)?;
                let (_, value) = all
                    .into_iter()
                    .find(|(n, _)| *n == name)
                    .ok_or(Fail::Errno(Errno::NO_XATTR))?;
                Ok(value)
            },
            move |r, v| sized(r, size, &v),
        );
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let Ino::Snapshot { id, ino } = view::split(ino.0) else {
            sized(reply, size, &[]);
            return;
        };
        self.on(
            id,
            reply,
            move |o| {
                let mut names = Vec::new();
                for (n, _) in o.snap.xattrs(ino)? {
                    names.extend_from_slice(&n);
                    names.push(0);
                }
                Ok(names)
            },
            move |r, v| sized(r, size, &v),
        );
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        const SEEK_DATA: i32 = 3;
        const SEEK_HOLE: i32 = 4;
        let Ino::Snapshot { id, ino } = view::split(ino.0) else {
            reply.error(Errno::EINVAL);
            return;
        };
        if whence != SEEK_DATA && whence != SEEK_HOLE {
            reply.error(Errno::EINVAL);
            return;
        }
        let Ok(from) = u64::try_from(offset) else {
            reply.error(Errno::ENXIO);
            return;
        };
        self.on(
            id,
            reply,
            move |o| {
                let inode = o.inode(ino)?;
                if from >= inode.size {
                    return Err(Fail::Errno(Errno::ENXIO));
                }
                let run = o.snap.data_run(ino, inode.size, from)?;
                let at = match (whence, run) {
                    (SEEK_DATA, Some((start, _))) => start.max(from),
                    (SEEK_DATA, None) => return Err(Fail::Errno(Errno::ENXIO)),
                    (_, Some((start, end))) if start <= from => end,
                    _ => from,
                };
                i64::try_from(at).map_err(|_| Fail::Errno(Errno::ENXIO))
            },
            |r, at| r.offset(at),
        );
    }

    // Writes: the mount is read-only (the kernel refuses most of them
    // itself; whatever reaches here is refused too).

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }
}

/// `O_TRUNC`.
fn libc_o_trunc() -> i32 {
    rustix::fs::OFlags::TRUNC.bits() as i32
}

/// Answer an xattr request of `size` bytes with `v` (its size when
/// `size` is 0; `ERANGE` when it does not fit).
fn sized(r: ReplyXattr, size: u32, v: &[u8]) {
    let len = u32::try_from(v.len()).unwrap_or(u32::MAX);
    if size == 0 {
        r.size(len);
    } else if len > size {
        r.error(Errno::ERANGE);
    } else {
        r.data(v);
    }
}
