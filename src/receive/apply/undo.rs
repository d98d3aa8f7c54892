//! The undo journal of a receive into directories (directory mode; the
//! design is in [`crate::resume`]): what each command after the last
//! checkpoint changes, written before the change, so that a resume rolls
//! the partial directory back to the checkpoint exactly.
//!
//! Files of checkpoint `K`, in `DIR/.btrsend-resume/NAME/`: `undo-K`, the
//! journal (a 16-byte header: magic and the number of entries already
//! undone, counted from the end; then the entries, each with its length and
//! a check sum, so a torn tail is ignored), and `trash-K/`, where UNLINK,
//! RMDIR and a replaced RENAME destination move what they remove (it is
//! deleted for real at the next checkpoint, so an undo can put it back).
//! Into a btrfs subvolume (subvolume mode) the trash is
//! `DIR/NAME/.btrsend-trash-UUID-K/` instead, in the subvolume's root (a
//! rename cannot leave a subvolume), UUID being the hex of the received
//! subvolume's UUID, so that no entry of the tree received is ever taken
//! for a trash (a source may well hold a `.btrsend-trash-…` name); it is
//! made and removed with the root's times kept, and the last one goes
//! before the subvolume is made read-only.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps, XattrFlags};
use rustix::io::Errno;

use super::Receiver;
use crate::receive::ApplyErrorKind;
use crate::receive::copy;

const MAGIC: &[u8; 8] = b"bsundo01";
const HEADER: u64 = 16;
/// Paths remembered in `Journal::done_paths`: a file and the directories
/// around it.
const DONE_PATHS: usize = 4;
/// Saved file data is journaled in pieces of at most this many bytes.
const PIECE: u64 = 4 << 20;

/// What undoes one change (see the module doc); paths are stream paths,
/// valid in the state right after the change.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// The object's attributes before its first change since the
    /// checkpoint (and a regular file's size then).
    Attr {
        path: Vec<u8>,
        mode: u32,
        uid: u32,
        gid: u32,
        atime: (i64, u32),
        mtime: (i64, u32),
        size: Option<u64>,
    },
    /// A new entry (created or linked): removed.
    Created { path: Vec<u8> },
    /// A RENAME; its replaced destination went to trash entry `trash`.
    Renamed {
        from: Vec<u8>,
        to: Vec<u8>,
        trash: Option<u64>,
    },
    /// An UNLINK or RMDIR: moved to trash entry `trash`.
    Trashed { path: Vec<u8>, trash: u64 },
    /// File data at `offset` before it was overwritten.
    Bytes {
        path: Vec<u8>,
        offset: u64,
        data: Vec<u8>,
    },
    /// An xattr's value before SET_XATTR / REMOVE_XATTR (`None`: absent).
    Xattr {
        path: Vec<u8>,
        name: Vec<u8>,
        old: Option<Vec<u8>>,
    },
}

fn put(out: &mut Vec<u8>, b: &[u8]) {
    // Paths, xattr names and values are far below 4 GiB; data pieces are
    // at most PIECE.
    out.extend_from_slice(&u32::try_from(b.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(b);
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let (a, b) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = b;
        Some(a)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = usize::try_from(self.u32()?).ok()?;
        Some(self.take(n)?.to_vec())
    }
    fn time(&mut self) -> Option<(i64, u32)> {
        Some((self.u64()?.cast_signed(), self.u32()?))
    }
}

impl Entry {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Entry::Attr {
                path,
                mode,
                uid,
                gid,
                atime,
                mtime,
                size,
            } => {
                b.push(1);
                put(&mut b, path);
                for v in [*mode, *uid, *gid] {
                    b.extend_from_slice(&v.to_le_bytes());
                }
                for (s, n) in [atime, mtime] {
                    b.extend_from_slice(&s.to_le_bytes());
                    b.extend_from_slice(&n.to_le_bytes());
                }
                b.extend_from_slice(&size.map_or(u64::MAX, |s| s).to_le_bytes());
            }
            Entry::Created { path } => {
                b.push(2);
                put(&mut b, path);
            }
            Entry::Renamed { from, to, trash } => {
                b.push(3);
                put(&mut b, from);
                put(&mut b, to);
                b.extend_from_slice(&trash.map_or(u64::MAX, |t| t).to_le_bytes());
            }
            Entry::Trashed { path, trash } => {
                b.push(4);
                put(&mut b, path);
                b.extend_from_slice(&trash.to_le_bytes());
            }
            Entry::Bytes { path, offset, data } => {
                b.push(5);
                put(&mut b, path);
                b.extend_from_slice(&offset.to_le_bytes());
                put(&mut b, data);
            }
            Entry::Xattr { path, name, old } => {
                b.push(6);
                put(&mut b, path);
                put(&mut b, name);
                b.push(u8::from(old.is_some()));
                put(&mut b, old.as_deref().unwrap_or_default());
            }
        }
        b
    }

    fn decode(body: &[u8]) -> Option<Entry> {
        let mut c = Cursor(body);
        let tag = *c.take(1)?.first()?;
        let e = match tag {
            1 => Entry::Attr {
                path: c.bytes()?,
                mode: c.u32()?,
                uid: c.u32()?,
                gid: c.u32()?,
                atime: c.time()?,
                mtime: c.time()?,
                size: Some(c.u64()?).filter(|&s| s != u64::MAX),
            },
            2 => Entry::Created { path: c.bytes()? },
            3 => Entry::Renamed {
                from: c.bytes()?,
                to: c.bytes()?,
                trash: Some(c.u64()?).filter(|&t| t != u64::MAX),
            },
            4 => Entry::Trashed {
                path: c.bytes()?,
                trash: c.u64()?,
            },
            5 => Entry::Bytes {
                path: c.bytes()?,
                offset: c.u64()?,
                data: c.bytes()?,
            },
            6 => {
                let path = c.bytes()?;
                let name = c.bytes()?;
                let has = *c.take(1)?.first()? != 0;
                let v = c.bytes()?;
                Entry::Xattr {
                    path,
                    name,
                    old: has.then_some(v),
                }
            }
            _ => return None,
        };
        c.0.is_empty().then_some(e)
    }
}

fn sum(body: &[u8]) -> [u8; 4] {
    let h = blake3::hash(body);
    let mut s = [0u8; 4];
    s.copy_from_slice(&h.as_bytes()[..4]);
    s
}

/// The journal of the current interval (see the module doc).
#[derive(Debug)]
pub(super) struct Journal {
    file: File,
    end: u64,
    trash: OwnedFd,
    next_trash: u64,
    /// Inodes created since the checkpoint: nothing of them to save.
    new: HashSet<u64>,
    /// Inodes whose attributes are saved since the checkpoint, with a
    /// regular file's size then.
    touched: HashMap<u64, u64>,
    /// The last paths [`Receiver::j_touch`] found saved or new (at most
    /// [`DONE_PATHS`]), each with whether it is new: nothing to do for them
    /// while no RENAME, UNLINK or RMDIR changed what a path names
    /// (creations refuse a taken name), so the directory that a run of
    /// creations makes entries in is looked up once.
    done_paths: Vec<(Vec<u8>, bool)>,
}

/// The journal and trash names of checkpoint `index` (the trash of a
/// directory-mode receive, in the resume directory).
pub(super) fn names(index: u64) -> (String, String) {
    (format!("undo-{index}"), format!("trash-{index}"))
}

/// Prefix of the trash of a subvolume-mode receive, in the subvolume's
/// root.
pub(super) const SUBVOL_TRASH: &str = ".btrsend-trash-";

/// The prefix of the trash names of the receive of subvolume `uuid`:
/// [`SUBVOL_TRASH`], its UUID in hex, `-`.
fn subvol_trash_prefix(uuid: &[u8; 16]) -> String {
    let mut s = String::from(SUBVOL_TRASH);
    for b in uuid {
        s.push_str(&format!("{b:02x}"));
    }
    s.push('-');
    s
}

/// Where the trash of a journal is: `rdir` (directory mode), or the root
/// of the subvolume received (subvolume mode).
#[derive(Debug, Clone, Copy)]
pub(super) enum TrashAt<'a> {
    /// `trash-K` in the resume directory.
    ResumeDir,
    /// `.btrsend-trash-UUID-K` in this subvolume root, that of the
    /// received subvolume `UUID`.
    Subvol(BorrowedFd<'a>, [u8; 16]),
}

impl<'a> TrashAt<'a> {
    /// The directory the trash is in, and its name for checkpoint `index`.
    fn place(self, rdir: BorrowedFd<'a>, index: u64) -> (BorrowedFd<'a>, String) {
        match self {
            TrashAt::ResumeDir => (rdir, names(index).1),
            TrashAt::Subvol(root, uuid) => (root, format!("{}{index}", subvol_trash_prefix(&uuid))),
        }
    }
}

/// Run `f` on the subvolume root `root` (when there is one) and set its
/// access and modification times back as they were (the trash comes and
/// goes there without changing the received tree).
pub(super) fn keeping_times<T>(
    root: Option<BorrowedFd<'_>>,
    f: impl FnOnce() -> io::Result<T>,
) -> io::Result<T> {
    let Some(root) = root else {
        return f();
    };
    let st = rustix::fs::fstat(root)?;
    let r = f();
    let (a, m) = stat_times(&st);
    let ts = |(s, n): (i64, u32)| Timespec {
        tv_sec: s,
        tv_nsec: n.into(),
    };
    rustix::fs::utimensat(
        root,
        ".",
        &Timestamps {
            last_access: ts(a),
            last_modification: ts(m),
        },
        AtFlags::empty(),
    )?;
    r
}

/// Remove every trash of the subvolume-mode receive of subvolume `uuid`
/// (`.btrsend-trash-UUID-*`) in the subvolume root `root` but that of
/// checkpoint `keep`, keeping the root's times. Other entries, whatever
/// their names, belong to the tree received and stay.
pub(super) fn drop_subvol_trash(
    root: BorrowedFd<'_>,
    uuid: &[u8; 16],
    keep: Option<u64>,
) -> io::Result<()> {
    let prefix = subvol_trash_prefix(uuid);
    let keep = keep.map(|k| format!("{prefix}{k}"));
    let mut old = Vec::new();
    for e in rustix::fs::Dir::read_from(open_dir(root, OsStr::new("."))?)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n.starts_with(prefix.as_bytes()) && keep.as_deref().is_none_or(|k| k.as_bytes() != n) {
            old.push(n.to_vec());
        }
    }
    if old.is_empty() {
        return Ok(());
    }
    keeping_times(Some(root), || {
        for n in &old {
            remove_tree(root, OsStr::from_bytes(n))?;
        }
        Ok(())
    })
}

/// Open (`O_PATH`-free) directory `name` in `at`.
pub(super) fn open_dir(at: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )?)
}

/// Remove `name` in `at`, a directory with everything in it or another
/// entry. Missing: nothing to do. A directory we may not change (a stream
/// can make one mode 0555, and an ordinary user's receive is refused
/// then) is made writable first: it goes anyway.
pub(super) fn remove_tree(at: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let st = match rustix::fs::statat(at, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => return Ok(()),
        r => r?,
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Ok(rustix::fs::unlinkat(at, name, AtFlags::empty())?);
    }
    let dir = open_dir(at, name)?;
    if st.st_mode & 0o700 != 0o700 {
        rustix::fs::fchmod(&dir, Mode::from_raw_mode((st.st_mode | 0o700) & 0o7777))?;
    }
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(&dir)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(n.to_vec());
        }
    }
    for n in names {
        remove_tree(dir.as_fd(), OsStr::from_bytes(&n))?;
    }
    Ok(rustix::fs::unlinkat(at, name, AtFlags::REMOVEDIR)?)
}

impl Journal {
    /// A new, empty journal for checkpoint `index` in the resume directory
    /// `rdir`, and its trash `at` (leftovers of the same names are removed
    /// first).
    pub(super) fn create(rdir: BorrowedFd<'_>, index: u64, at: TrashAt<'_>) -> io::Result<Journal> {
        let undo = names(index).0;
        let (tdir, trash) = at.place(rdir, index);
        let root = match at {
            TrashAt::ResumeDir => None,
            TrashAt::Subvol(r, _) => Some(r),
        };
        keeping_times(root, || {
            remove_tree(tdir, OsStr::new(&trash))?;
            rustix::fs::mkdirat(tdir, trash.as_str(), Mode::from_raw_mode(0o700))?;
            Ok(())
        })?;
        let fd = rustix::fs::openat(
            rdir,
            undo.as_str(),
            OFlags::RDWR | OFlags::CREATE | OFlags::TRUNC | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )?;
        let file = File::from(fd);
        let mut h = [0u8; 16];
        h[..8].copy_from_slice(MAGIC);
        // Not flushed: a directory-mode resume point serves only while
        // the system runs (see "What survives what" in crate::resume).
        file.write_all_at(&h, 0)?;
        let trash = open_dir(tdir, OsStr::new(&trash))?;
        Ok(Journal {
            file,
            end: HEADER,
            trash,
            next_trash: 0,
            new: HashSet::new(),
            touched: HashMap::new(),
            done_paths: Vec::new(),
        })
    }

    /// Note `rel` in `done_paths` (dropping the oldest beyond
    /// [`DONE_PATHS`]).
    fn done(&mut self, rel: &[u8], new: bool) {
        if self.done_paths.len() >= DONE_PATHS {
            self.done_paths.remove(0);
        }
        self.done_paths.push((rel.to_vec(), new));
    }

    /// Append `e` (before the change it undoes is made).
    fn append(&mut self, e: &Entry) -> io::Result<()> {
        let body = e.encode();
        let mut rec = Vec::with_capacity(body.len() + 8);
        rec.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
        rec.extend_from_slice(&sum(&body));
        rec.extend_from_slice(&body);
        self.file.write_all_at(&rec, self.end)?;
        self.end += rec.len() as u64;
        Ok(())
    }

    fn trash_name(&mut self) -> (u64, String) {
        let n = self.next_trash;
        self.next_trash += 1;
        (n, format!("t{n}"))
    }
}

/// The entries of journal `file` and how many are undone already.
fn read_journal(file: &File) -> io::Result<(Vec<Entry>, u64)> {
    let len = usize::try_from(file.metadata()?.len()).map_err(io::Error::other)?;
    let mut all = vec![0u8; len];
    file.read_exact_at(&mut all, 0)?;
    parse_journal(&all)
}

/// The entries of the journal `all` (a whole `undo-K` file) and how many
/// are undone already.
fn parse_journal(all: &[u8]) -> io::Result<(Vec<Entry>, u64)> {
    let Some(h) = all.get(..16) else {
        return Ok((Vec::new(), 0));
    };
    if &h[..8] != MAGIC {
        return Err(io::Error::other("not an undo journal (bad magic)"));
    }
    let done = u64::from_le_bytes(h[8..16].try_into().unwrap_or_default());
    let mut out = Vec::new();
    let mut at = 16usize;
    // A torn last entry (the receiver was killed while writing it) ends
    // the journal: its change was not made.
    while let Some(head) = all.get(at..at + 8) {
        let len = u32::from_le_bytes(head[..4].try_into().unwrap_or_default()) as usize;
        let Some(body) = all.get(at + 8..at + 8 + len) else {
            break;
        };
        if sum(body) != head[4..8] {
            break;
        }
        let Some(e) = Entry::decode(body) else {
            break;
        };
        out.push(e);
        at += 8 + len;
    }
    Ok((out, done))
}

fn stat_times(st: &rustix::fs::Stat) -> ((i64, u32), (i64, u32)) {
    let t = |s: i64, n: u64| (s, u32::try_from(n).unwrap_or(0));
    (
        t(st.st_atime, st.st_atime_nsec),
        t(st.st_mtime, st.st_mtime_nsec),
    )
}

/// The parent stream path of `path` ("" for the root's entries).
fn parent_of(path: &[u8]) -> &[u8] {
    path.iter()
        .rposition(|&b| b == b'/')
        .and_then(|i| path.get(..i))
        .unwrap_or_default()
}

impl Receiver<'_> {
    /// Whether changes are journaled (a directory-mode receive past its
    /// first checkpoint).
    pub(super) fn journaling(&self) -> bool {
        self.journal.is_some()
    }

    /// `lstat` of stream path `rel` (the root: "").
    fn j_stat(&self, rel: &[u8]) -> Result<rustix::fs::Stat, ApplyErrorKind> {
        let t = &self.cur()?.target;
        Ok(t.locate(rel)?.lstat()?)
    }

    /// The inode of `rel`: from an open file where there is one.
    fn j_ino(&self, rel: &[u8]) -> Result<u64, ApplyErrorKind> {
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
        let (atime, mtime) = stat_times(&st);
        let size = regular.then_some(st.st_size.cast_unsigned());
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

    fn j_to_trash(&mut self, rel: &[u8], n: &str) -> Result<(), ApplyErrorKind> {
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
    fn j_undo_journal(
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
    fn undo(&mut self, e: &Entry, trash: Option<BorrowedFd<'_>>) -> io::Result<()> {
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

/// An entry for a message.
fn describe(e: &Entry) -> String {
    let p = |b: &[u8]| b.escape_ascii().to_string();
    match e {
        Entry::Attr { path, .. } => format!("the attributes of {}", p(path)),
        Entry::Created { path } => format!("the creation of {}", p(path)),
        Entry::Renamed { from, to, .. } => format!("the rename of {} to {}", p(from), p(to)),
        Entry::Trashed { path, .. } => format!("the removal of {}", p(path)),
        Entry::Bytes { path, offset, .. } => {
            format!("a write to {} at {offset}", p(path))
        }
        Entry::Xattr { path, name, .. } => {
            format!("xattr {} of {}", p(name), p(path))
        }
    }
}

/// Entry points for the fuzz targets (`fuzz/`): an undo journal is a file
/// beside DIR, which anyone who can write there can change.
#[doc(hidden)]
pub mod fuzz {
    /// Parse `bytes` as a whole journal file; every entry read must
    /// encode back to an entry that decodes to itself. The number of
    /// entries and of entries undone, or `None` for a journal refused.
    pub fn journal(bytes: &[u8]) -> Option<(usize, u64)> {
        let (entries, done) = super::parse_journal(bytes).ok()?;
        for e in &entries {
            assert_eq!(super::Entry::decode(&e.encode()).as_ref(), Some(e));
        }
        Some((entries.len(), done))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_a_torn_tail_is_dropped() {
        let all = vec![
            Entry::Attr {
                path: b"a/b".to_vec(),
                mode: 0o100644,
                uid: 1,
                gid: 2,
                atime: (-5, 7),
                mtime: (1_700_000_000, 999_999_999),
                size: Some(12),
            },
            Entry::Attr {
                path: Vec::new(),
                mode: 0o40755,
                uid: 0,
                gid: 0,
                atime: (0, 0),
                mtime: (1, 2),
                size: None,
            },
            Entry::Created {
                path: b"o257-5-0".to_vec(),
            },
            Entry::Renamed {
                from: b"x".to_vec(),
                to: b"y/z".to_vec(),
                trash: Some(3),
            },
            Entry::Renamed {
                from: b"x".to_vec(),
                to: b"y".to_vec(),
                trash: None,
            },
            Entry::Trashed {
                path: b"d".to_vec(),
                trash: 4,
            },
            Entry::Bytes {
                path: b"f".to_vec(),
                offset: 4096,
                data: vec![9; 100],
            },
            Entry::Xattr {
                path: b"f".to_vec(),
                name: b"user.a".to_vec(),
                old: None,
            },
            Entry::Xattr {
                path: b"f".to_vec(),
                name: b"user.a".to_vec(),
                old: Some(Vec::new()),
            },
        ];
        for e in &all {
            assert_eq!(Entry::decode(&e.encode()).as_ref(), Some(e));
        }
        let dir = tempfile::tempdir().unwrap();
        let rdir = rustix::fs::open(
            dir.path(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        let mut j = Journal::create(rdir.as_fd(), 7, TrashAt::ResumeDir).unwrap();
        for e in &all {
            j.append(e).unwrap();
        }
        let f = File::open(dir.path().join("undo-7")).unwrap();
        assert_eq!(read_journal(&f).unwrap(), (all.clone(), 0));
        // Cut inside the last entry, then a flipped byte in the last whole
        // one: each ends the journal there.
        let len = f.metadata().unwrap().len();
        let w = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("undo-7"))
            .unwrap();
        w.set_len(len - 3).unwrap();
        let got = read_journal(&f).unwrap().0;
        assert_eq!(got[..], all[..all.len() - 1]);
        w.write_all_at(&[0xff], len - 40).unwrap();
        let got = read_journal(&f).unwrap().0;
        assert_eq!(got[..], all[..all.len() - 2]);
        assert!(dir.path().join("trash-7").is_dir());
    }
}
