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
//!
//! This module owns the format and the files; it must not decide what to
//! journal (that is `undo`'s) nor when a checkpoint is taken.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;

pub(super) const MAGIC: &[u8; 8] = b"bsundo01";

pub(super) const HEADER: u64 = 16;

/// Paths remembered in `Journal::done_paths`: a file and the directories
/// around it.
pub(super) const DONE_PATHS: usize = 4;

/// Saved file data is journaled in pieces of at most this many bytes.
pub(super) const PIECE: u64 = 4 << 20;

/// What undoes one change (see the module doc); paths are stream paths,
/// valid in the state right after the change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Entry {
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

pub(super) fn put(out: &mut Vec<u8>, b: &[u8]) {
    // Paths, xattr names and values are far below 4 GiB; data pieces are
    // at most PIECE.
    out.extend_from_slice(&u32::try_from(b.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(b);
}

pub(super) struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    pub(super) fn take(&mut self, n: usize) -> Option<&[u8]> {
        let (a, b) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = b;
        Some(a)
    }
    pub(super) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(super) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    pub(super) fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = usize::try_from(self.u32()?).ok()?;
        Some(self.take(n)?.to_vec())
    }
    pub(super) fn time(&mut self) -> Option<(i64, u32)> {
        Some((self.u64()?.cast_signed(), self.u32()?))
    }
}

impl Entry {
    pub(super) fn encode(&self) -> Vec<u8> {
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

    pub(super) fn decode(body: &[u8]) -> Option<Entry> {
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

pub(super) fn sum(body: &[u8]) -> [u8; 4] {
    let h = blake3::hash(body);
    let mut s = [0u8; 4];
    s.copy_from_slice(&h.as_bytes()[..4]);
    s
}

/// The journal of the current interval (see the module doc).
#[derive(Debug)]
pub(super) struct Journal {
    pub(super) file: File,
    pub(super) end: u64,
    pub(super) trash: OwnedFd,
    pub(super) next_trash: u64,
    /// Inodes created since the checkpoint: nothing of them to save.
    pub(super) new: HashSet<u64>,
    /// Inodes whose attributes are saved since the checkpoint, with a
    /// regular file's size then.
    pub(super) touched: HashMap<u64, u64>,
    /// The last paths [`Receiver::j_touch`] found saved or new (at most
    /// [`DONE_PATHS`]), each with whether it is new: nothing to do for them
    /// while no RENAME, UNLINK or RMDIR changed what a path names
    /// (creations refuse a taken name), so the directory that a run of
    /// creations makes entries in is looked up once.
    pub(super) done_paths: Vec<(Vec<u8>, bool)>,
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
pub(super) fn subvol_trash_prefix(uuid: &[u8; 16]) -> String {
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
    pub(super) fn place(self, rdir: BorrowedFd<'a>, index: u64) -> (BorrowedFd<'a>, String) {
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
pub(crate) fn open_dir(at: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
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
pub(crate) fn remove_tree(at: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
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
    pub(super) fn done(&mut self, rel: &[u8], new: bool) {
        if self.done_paths.len() >= DONE_PATHS {
            self.done_paths.remove(0);
        }
        self.done_paths.push((rel.to_vec(), new));
    }

    /// Append `e` (before the change it undoes is made).
    pub(super) fn append(&mut self, e: &Entry) -> io::Result<()> {
        let body = e.encode();
        let mut rec = Vec::with_capacity(body.len() + 8);
        rec.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
        rec.extend_from_slice(&sum(&body));
        rec.extend_from_slice(&body);
        self.file.write_all_at(&rec, self.end)?;
        self.end += rec.len() as u64;
        Ok(())
    }

    pub(super) fn trash_name(&mut self) -> (u64, String) {
        let n = self.next_trash;
        self.next_trash += 1;
        (n, format!("t{n}"))
    }
}

/// The longest entry [`Entry::encode`] makes: saved data of at most
/// [`PIECE`] bytes, or an xattr value (at most 64 KiB), with paths of at
/// most `PATH_MAX` bytes; a longer one can only be garbage, and ends the
/// journal as a torn entry does.
const MAX_ENTRY: u64 = PIECE + (1 << 20);

/// The entries of journal `file` and how many are undone already, as
/// [`parse_journal`] reads them, read one entry at a time: memory is
/// bounded by the entries there are, whatever length the file (or an
/// entry's header) claims.
pub(super) fn read_journal(file: &File) -> io::Result<(Vec<Entry>, u64)> {
    let mut r = io::BufReader::new(ReadAt { file, pos: 0 });
    let mut h = [0u8; 16];
    if !read_whole(&mut r, &mut h)? {
        return Ok((Vec::new(), 0));
    }
    let (_, done) = parse_journal(&h)?;
    let mut out = Vec::new();
    let mut head = [0u8; 8];
    let mut body = Vec::new();
    while read_whole(&mut r, &mut head)? {
        let len = u64::from(u32::from_le_bytes([head[0], head[1], head[2], head[3]]));
        if len > MAX_ENTRY {
            break;
        }
        body.clear();
        (&mut r).take(len).read_to_end(&mut body)?;
        if body.len() as u64 != len || sum(&body) != head[4..8] {
            break;
        }
        let Some(e) = Entry::decode(&body) else {
            break;
        };
        out.push(e);
    }
    Ok((out, done))
}

/// `file` read from `pos` on, whatever its file position (a journal is
/// read again after it was cut, by tests).
struct ReadAt<'a> {
    file: &'a File,
    pos: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Fill `buf` from `r`; `false` if the input ends first.
fn read_whole(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => return Ok(false),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The entries of the journal `all` (a whole `undo-K` file) and how many
/// are undone already.
pub(super) fn parse_journal(all: &[u8]) -> io::Result<(Vec<Entry>, u64)> {
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

pub(super) fn stat_times(st: &rustix::fs::Stat) -> ((i64, u32), (i64, u32)) {
    let t = |s: i64, n: u64| (s, u32::try_from(n).unwrap_or(0));
    (
        t(st.st_atime, st.st_atime_nsec),
        t(st.st_mtime, st.st_mtime_nsec),
    )
}

/// The parent stream path of `path` ("" for the root's entries).
pub(super) fn parent_of(path: &[u8]) -> &[u8] {
    path.iter()
        .rposition(|&b| b == b'/')
        .and_then(|i| path.get(..i))
        .unwrap_or_default()
}

/// An entry for a message.
pub(super) fn describe(e: &Entry) -> String {
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
