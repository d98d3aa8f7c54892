//! Applying a stream to an index: a receive whose target is the index.
//!
//! Commands follow the semantics the receiver gives them (btrfs-progs
//! `cmds/receive.c` on the `*at` calls), checked the same way: every path
//! passes [`check_path`], names are resolved entry by entry from the root,
//! creating over an existing name, removing a missing one, a directory loop
//! or a non-empty `RMDIR` are errors naming the command. A stream that can
//! be received is indexed; one that cannot is refused, never half-guessed.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, Read};
use std::ops::ControlFlow;

use indexmap::IndexMap;
use stream_format::{
    Attr, BufStreamReader, Command, CommandInfo, CommandKind, DecodeError, RawAttr, RawCommand,
    ReaderOptions, StreamReader, Timespec, parse_orphan_name,
};

use super::IndexError;
use super::model::{
    Encoding, Extent, FileType, Inode, NAME_MAX, ROOT_INO, decode_dirent, dirent_dir, dirent_key,
    dirent_key_into, dirent_prefix, extent_key, extent_key_into, extent_offset, extent_prefix,
    inode_key, inode_key_into, is_xattr_name, xattr_key, xattr_prefix,
};
use super::tree::{PackId, PageId, PageRef, Pages, Place, Records, Tree};
use crate::memo::SlotMemo;
use crate::receive::target::check_path;

/// Changed nodes kept in memory before they are written out as pages: a
/// bound on the memory an indexing takes whatever the tree's size (a
/// node is a page of up to 16 KiB, about twice that in memory). More
/// saves little: a flush rewrites only the nodes on the paths to the
/// changed leaves.
const DIRTY_NODES: usize = 2048;

/// Paths whose inode is remembered, and inodes changed but not yet put in
/// the tree, before each cache is emptied: a stream names the same few
/// directories and files over and over (each file gets several commands,
/// most under one directory), and these spare the tree a look-up per path
/// component and a write per command. Extents wait as many as inodes.
/// Larger caches miss the CPU's caches on most look-ups, which costs more
/// than the more frequent, smaller runs put in the tree.
pub(super) const CACHED_PATHS: usize = 1 << 13;
const CACHED_INODES: usize = 1 << 11;

/// Orphan-shaped names kept in `Indexer::orphans`, at most.
pub(super) const ORPHANS: usize = 1 << 10;

/// Slots of the memo of inode kinds (see `Indexer::kinds`).
const KINDS: usize = 64;

/// `fallocate(2)` flags a stream may carry.
const FALLOC_FL_KEEP_SIZE: u32 = 1;
const FALLOC_FL_PUNCH_HOLE: u32 = 2;

/// The state of a snapshot's index: its tree and what the tree's records
/// refer to. The repository stores one per indexed snapshot.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexRoot {
    /// The tree's root page (`None`: no records, never for a finished index).
    pub tree: Option<PageId>,
    /// Where the root page is: in a pack (absent: an object of its own, as
    /// indexes made before packs store it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<RootPlace>,
    /// The next inode number to hand out.
    pub next_ino: u64,
    /// The streams extents point into, by the extents' `source` number:
    /// names the caller gives (the repository: stream objects).
    pub sources: Vec<String>,
}

/// Where an index's root page lies in its pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RootPlace {
    /// The pack.
    pub pack: PackId,
    /// Where the page's stored bytes start in it.
    pub offset: u64,
    /// Their length.
    pub len: u64,
}

impl IndexRoot {
    /// The root page and where it is.
    pub fn top(&self) -> Option<PageRef> {
        let id = self.tree?;
        Some(PageRef {
            id,
            place: match self.at {
                None => Place::Object,
                Some(RootPlace { pack, offset, len }) => Place::Packed { pack, offset, len },
            },
        })
    }

    /// Make `r` the root page.
    pub fn set_top(&mut self, r: Option<PageRef>) {
        self.tree = r.map(|r| r.id);
        self.at = match r.map(|r| r.place) {
            Some(Place::Packed { pack, offset, len }) => Some(RootPlace { pack, offset, len }),
            _ => None,
        };
    }
}

/// The index of a snapshot some CLONE command reads from, found by the
/// snapshot's UUID (the parent's too, for a `SNAPSHOT` command).
pub trait Snapshots {
    /// The index of the snapshot `uuid`, if there is one.
    fn index_of(&self, uuid: &[u8; 16]) -> Option<IndexRoot>;
}

/// A receive into an index (see the module docs).
pub struct Indexer<'p, 's> {
    tree: Tree<'p, 's>,
    root: IndexRoot,
    /// The source number of the stream being applied.
    source: u32,
    /// The name of the stream being applied (its `sources` entry).
    source_name: String,
    /// The snapshot's UUID, once its SUBVOL or SNAPSHOT came.
    uuid: Option<[u8; 16]>,
    ended: bool,
    /// Resolved paths (see [`CACHED_PATHS`]); a name that changes takes
    /// its path and everything below it out.
    paths: RefCell<BTreeMap<Vec<u8>, u64>>,
    /// The directory path resolved last, and its inode: the files of one
    /// directory come one after the other, and this spares the look-up
    /// in `paths` for each.
    last_dir: PathMemo,
    /// Inodes changed since they were last put in the tree, but those
    /// in `made`.
    inodes: HashMap<u64, Inode, Fixed>,
    /// The inodes made since the changed ones were last put in the tree,
    /// in the order they were made (so by number): kept out of `inodes`,
    /// a new file's data and attribute commands change the last one with
    /// no look-up, and an inode made earlier is found by a binary search.
    made: Vec<(u64, Inode)>,
    /// Where in `made` the last inode searched for was: the directory new
    /// files go to is asked for again and again.
    made_hint: Cell<usize>,
    /// Directory entries changed since they were last put in the tree
    /// (see [`Dirent`]), by their tree key, in the order they changed: a
    /// kernel stream creates each new file under an orphan name in the
    /// root and renames it at once, which here costs nothing in the tree.
    dirents: IndexMap<Vec<u8>, Dirent, Fixed>,
    /// Directories numbered from here on have no entries in the tree yet
    /// (they were made since the entries were last put there): looking
    /// their names up there is skipped.
    fresh_from: u64,
    /// Directories numbered from here on were made by this stream: the
    /// tree holds only the entries it put there, which `put_names` knows.
    made_from: u64,
    /// The entries this stream put in the tree.
    put_names: PutNames,
    /// The entries with orphan names (`o<ino>-<gen>-<idx>`, see
    /// [`parse_orphan_name`]) in directories this stream made, by key,
    /// while there are at most [`ORPHANS`]: a kernel stream makes each new
    /// inode under such a name, looked for first in vain, and one missing
    /// here is in neither the cache nor the tree, which spares looking in
    /// both (and in `put_names`). `None` once there were more, for the
    /// rest of the stream.
    orphans: Option<HashSet<Vec<u8>, Fixed>>,
    /// The last path resolved and its inode: a file's data and attribute
    /// commands name it one after the other.
    last: PathMemo,
    /// Kinds of inodes read from the tree: no command changes an inode's
    /// kind, and an inode put or deleted leaves the memo.
    kinds: RefCell<SlotMemo<FileType>>,
    /// The key of the entry looked up last: built here rather than in a
    /// new vector, as a look-up happens for every name a stream gives.
    scratch: RefCell<Vec<u8>>,
    /// Extents written past their files' ends (nothing to cut) since they
    /// were last put in the tree, which takes them in runs.
    extents: Records,
    /// A key and a record being made, before they are copied into a run.
    run_key: Vec<u8>,
    run_value: Vec<u8>,
    /// The last command's new non-directory, not made yet (see [`Held`]).
    held: Option<Held>,
}

/// A new non-directory, held until the next command: a kernel stream makes
/// each new inode under an orphan name and renames it at once, and when
/// the next command is that RENAME the inode is made under its final name
/// alone, which is what the two commands do. Any other command makes it
/// first, under the name it was created with.
struct Held {
    info: CommandInfo,
    path: Vec<u8>,
    inode: Inode,
}

/// The hasher of the indexer's maps: fixed, fast (the keys are the
/// stream's names, and a slow hash showed in profiles; a collision costs
/// time, never a wrong answer).
type Fixed = foldhash::fast::FixedState;

/// The directory entries a stream put in the tree, as a Bloom filter of
/// fixed size (so bounded memory whatever the tree): an entry of a
/// directory the stream made that is not in it is in neither the tree nor
/// the cache, which spares a tree look-up for every name a stream creates
/// (each new file's orphan name, then its real one). A false positive
/// costs one look-up.
#[derive(Default)]
struct PutNames {
    /// The bits; allocated with the first entry put.
    bits: Vec<u64>,
}

impl PutNames {
    /// 2^25 bits (4 MiB) in blocks of a cache line, each key's probes in
    /// one block (one cache miss a look-up): about 1 % false positives
    /// at 2M entries.
    const BLOCKS: u64 = (1 << 25) / 512;

    /// The block of `key` and its probes' bits there.
    fn probes(key: &[u8]) -> (usize, [u16; 4]) {
        use std::hash::BuildHasher;
        let h = Fixed::with_seed(0x6274_7273_656e_6400).hash_one(key);
        let block = ((h >> 32) % Self::BLOCKS) as usize;
        let bits = [0, 9, 18, 27].map(|s| ((h >> s) & 511) as u16);
        (block, bits)
    }

    /// Add every key of `keys`. The probes are all made first, then set:
    /// each set is a cache miss, and with nothing else between them the
    /// CPU overlaps them. Setting them in the order of their blocks cost
    /// more in sorting than it saved (2026-11-30).
    fn add_all<'k>(&mut self, keys: impl Iterator<Item = &'k [u8]>) {
        let probes: Vec<(usize, [u16; 4])> = keys.map(Self::probes).collect();
        if probes.is_empty() {
            return;
        }
        if self.bits.is_empty() {
            self.bits = vec![0; (Self::BLOCKS * 8) as usize];
        }
        for (block, bits) in probes {
            for b in bits {
                self.bits[block * 8 + usize::from(b / 64)] |= 1 << (b % 64);
            }
        }
    }

    fn may_hold(&self, key: &[u8]) -> bool {
        if self.bits.is_empty() {
            return false;
        }
        let (block, bits) = Self::probes(key);
        bits.iter()
            .all(|b| self.bits[block * 8 + usize::from(b / 64)] & (1 << (b % 64)) != 0)
    }
}

/// A changed directory entry.
#[derive(Debug, Clone, Copy)]
struct Dirent {
    /// What it names now (`None`: removed).
    ino: Option<u64>,
    /// Whether the tree has it.
    stored: bool,
}

/// One path and its inode, remembered until the names change (the
/// indexer's `forget_path`); its buffer is reused.
#[derive(Default)]
struct PathMemo(RefCell<Option<(Vec<u8>, u64)>>);

impl PathMemo {
    /// The inode of `path`, if it is the path remembered.
    fn get(&self, path: &[u8]) -> Option<u64> {
        match &*self.0.borrow() {
            Some((p, ino)) if p == path => Some(*ino),
            _ => None,
        }
    }

    /// Remember that `path` names `ino`.
    fn set(&self, path: &[u8], ino: u64) {
        let mut m = self.0.borrow_mut();
        match &mut *m {
            Some((p, i)) => {
                p.clear();
                p.extend_from_slice(path);
                *i = ino;
            }
            None => *m = Some((path.to_vec(), ino)),
        }
    }

    fn clear(&self) {
        *self.0.borrow_mut() = None;
    }
}

/// Where a command is, for messages.
struct At<'a> {
    info: &'a CommandInfo,
    path: &'a [u8],
}

impl At<'_> {
    fn err(&self, reason: impl Into<String>) -> IndexError {
        IndexError::Apply {
            command: self.info.to_string(),
            path: crate::manifest::escape(self.path),
            reason: reason.into(),
        }
    }
}

impl<'p, 's> Indexer<'p, 's> {
    /// An indexer of the stream named `source`, writing pages to `pages`.
    pub fn new(pages: &'p Pages<'s>, source: &str) -> Indexer<'p, 's> {
        Indexer {
            tree: Tree::open(pages, None),
            root: IndexRoot {
                tree: None,
                at: None,
                next_ino: ROOT_INO + 1,
                sources: Vec::new(),
            },
            source: 0,
            source_name: source.to_owned(),
            uuid: None,
            ended: false,
            paths: RefCell::new(BTreeMap::new()),
            last_dir: PathMemo::default(),
            inodes: HashMap::default(),
            made: Vec::new(),
            made_hint: Cell::new(0),
            dirents: IndexMap::default(),
            fresh_from: ROOT_INO,
            made_from: ROOT_INO,
            put_names: PutNames::default(),
            orphans: Some(HashSet::default()),
            last: PathMemo::default(),
            scratch: RefCell::new(Vec::with_capacity(64)),
            kinds: RefCell::new(SlotMemo::new(KINDS)),
            extents: Records::default(),
            run_key: Vec::with_capacity(32),
            run_value: Vec::with_capacity(128),
            held: None,
        }
    }

    /// The snapshot's UUID (from its SUBVOL or SNAPSHOT command).
    pub fn uuid(&self) -> Option<[u8; 16]> {
        self.uuid
    }

    /// Whether the stream's END came.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Write out the index: its root, once the stream ended.
    ///
    /// # Errors
    ///
    /// The stream did not end, or a page cannot be written.
    pub fn finish(mut self) -> Result<IndexRoot, IndexError> {
        // Nothing is held once END came: it made what was.
        if !self.ended {
            return Err(IndexError::Apply {
                command: "the end of the stream".into(),
                path: String::new(),
                reason: "the stream ended without its END command".into(),
            });
        }
        self.put_inodes()?;
        self.put_dirents()?;
        self.put_extents()?;
        let top = self.tree.flush()?;
        self.root.set_top(top);
        Ok(self.root)
    }

    /// Apply one command; `data_offset` is where its DATA attribute's bytes
    /// start in the raw stream (for WRITE and ENCODED_WRITE).
    ///
    /// # Errors
    ///
    /// The command cannot be applied (see the module docs), or a page
    /// cannot be read or written.
    pub fn apply(
        &mut self,
        info: &CommandInfo,
        cmd: &Command<'_>,
        data_offset: u64,
        snapshots: &dyn Snapshots,
    ) -> Result<(), IndexError> {
        let at = At {
            info,
            path: cmd.path().unwrap_or_default(),
        };
        if let Some(p) = cmd.path()
            && !matches!(cmd, Command::Subvol { .. } | Command::Snapshot { .. })
        {
            check_path(p).map_err(|e| at.err(e.to_string()))?;
        }
        // The second path of a RENAME or LINK is checked as the receiver
        // checks it: unchecked, `..` or `.` would become a name in the
        // index (the CLONE source's is checked where it is read).
        if let Command::Rename { path_to: p, .. } | Command::Link { path_link: p, .. } = cmd {
            check_path(p).map_err(|e| at.err(e.to_string()))?;
        }
        if self.ended {
            return Err(at.err("a command after END (one stream is indexed at a time)"));
        }
        if let Some(h) = self.held.take() {
            if let Command::Rename { path, path_to } = cmd
                && *path == h.path.as_slice()
                && self.create_renamed(&h, &at, path_to)?
            {
                return self.tree.flush_if_over(DIRTY_NODES);
            }
            self.create_held(h)?;
        }
        let started = self.uuid.is_some();
        match cmd {
            Command::Subvol { .. } | Command::Snapshot { .. } if started => {
                return Err(at.err("a second subvolume in one stream"));
            }
            Command::Subvol { uuid, .. } => {
                self.uuid = Some(*uuid);
                self.root.sources.push(self.source_name.clone());
                let mut r = Inode::new(FileType::Dir, 0o755);
                r.parent = ROOT_INO;
                self.put_inode(ROOT_INO, &r)?;
            }
            Command::Snapshot {
                uuid, clone_uuid, ..
            } => {
                let parent = snapshots
                    .index_of(clone_uuid)
                    .ok_or_else(|| at.err("the parent snapshot has no index"))?;
                self.tree = Tree::open(self.tree.pages(), parent.top());
                self.root = parent;
                self.fresh_from = self.root.next_ino;
                self.made_from = self.root.next_ino;
                self.uuid = Some(*uuid);
                self.source = self.source_of(&self.source_name.clone());
            }
            _ if !started => return Err(at.err("a command before SUBVOL or SNAPSHOT")),
            Command::Mkfile { path, .. } => {
                self.hold(info, path, Inode::new(FileType::File, 0o600))
            }
            Command::Mkdir { path, .. } => {
                self.create(&at, path, Inode::new(FileType::Dir, 0o700))?
            }
            Command::Mknod {
                path, rdev, mode, ..
            } => {
                let kind = FileType::from_mode(*mode)
                    .filter(|k| {
                        matches!(
                            k,
                            FileType::Chr | FileType::Blk | FileType::Fifo | FileType::Sock
                        )
                    })
                    .ok_or_else(|| at.err(format!("MKNOD of mode {mode:o}")))?;
                let mut i = Inode::new(kind, (*mode & 0o7777) as u32);
                i.rdev = *rdev;
                self.hold(info, path, i);
            }
            Command::Mkfifo { path, .. } => {
                self.hold(info, path, Inode::new(FileType::Fifo, 0o600))
            }
            Command::Mksock { path, .. } => {
                self.hold(info, path, Inode::new(FileType::Sock, 0o600))
            }
            Command::Symlink {
                path, path_link, ..
            } => {
                let mut i = Inode::new(FileType::Symlink, 0o777);
                i.target = path_link.to_vec();
                i.size = path_link.len() as u64;
                self.hold(info, path, i);
            }
            Command::Rename { path, path_to } => self.rename(&at, path, path_to)?,
            Command::Link { path, path_link } => {
                let ino = self.resolve(&at, path_link)?;
                let mut i = self.inode(ino)?;
                if i.kind == FileType::Dir {
                    return Err(at.err("LINK to a directory"));
                }
                let (dir, name) = self.parent_of(&at, path)?;
                self.add_entry(&at, dir, name, ino)?;
                i.nlink = i
                    .nlink
                    .checked_add(1)
                    .ok_or_else(|| at.err("too many links"))?;
                self.put_inode(ino, &i)?;
            }
            Command::Unlink { path } => {
                // A directory here fails the command, and the indexing.
                self.forget_path(path, false);
                let (dir, name) = self.parent_of(&at, path)?;
                let ino = self
                    .entry(dir, name)?
                    .ok_or_else(|| at.err("no such file"))?;
                if self.inode(ino)?.kind == FileType::Dir {
                    return Err(at.err("UNLINK of a directory"));
                }
                self.remove_entry(dir, name)?;
                self.drop_link(ino)?;
            }
            Command::Rmdir { path } => {
                self.forget_path(path, true);
                let (dir, name) = self.parent_of(&at, path)?;
                let ino = self
                    .entry(dir, name)?
                    .ok_or_else(|| at.err("no such directory"))?;
                if self.inode(ino)?.kind != FileType::Dir {
                    return Err(at.err("RMDIR of a non-directory"));
                }
                self.put_dirents()?;
                if self.tree.prefixed_any(&dirent_prefix(ino))? {
                    return Err(at.err("RMDIR of a directory that is not empty"));
                }
                self.remove_entry(dir, name)?;
                self.delete_inode(ino)?;
            }
            Command::SetXattr { path, name, data } => {
                let ino = self.resolve(&at, path)?;
                if !is_xattr_name(name) {
                    return Err(at.err("a bad xattr name"));
                }
                self.tree.insert(&xattr_key(ino, name), data)?;
            }
            Command::RemoveXattr { path, name } => {
                let ino = self.resolve(&at, path)?;
                if self.tree.remove(&xattr_key(ino, name))?.is_none() {
                    return Err(at.err("REMOVE_XATTR of an xattr the file does not have"));
                }
            }
            Command::Write { offset, data, .. } => {
                self.write_plain(&at, *offset, data.len() as u64, data_offset)?
            }
            Command::EncodedWrite {
                path,
                offset,
                unencoded_file_len,
                unencoded_len,
                unencoded_offset,
                compression,
                encryption,
                data,
            } => {
                let ino = self.file(&at, path)?;
                crate::receive::encoded::check(
                    compression.unwrap_or(0),
                    encryption.unwrap_or(0),
                    *unencoded_len,
                    *unencoded_offset,
                    *unencoded_file_len,
                )
                .map_err(|e| at.err(e.to_string()))?;
                let encoding = match compression.unwrap_or(0) {
                    // Uncompressed: the file's bytes are the data's from
                    // `unencoded_offset` (which must hold them all).
                    0 => {
                        if unencoded_offset
                            .checked_add(*unencoded_file_len)
                            .is_none_or(|e| e > data.len() as u64)
                        {
                            return Err(at.err("ENCODED_WRITE data shorter than its range"));
                        }
                        None
                    }
                    c => Some(Encoding::Encoded {
                        compression: c,
                        encoded_len: data.len() as u64,
                        unencoded_len: *unencoded_len,
                        unencoded_offset: *unencoded_offset,
                    }),
                };
                let extent = Extent {
                    len: *unencoded_file_len,
                    source: self.source,
                    stream_offset: match encoding {
                        None => data_offset + unencoded_offset,
                        Some(_) => data_offset,
                    },
                    encoding: encoding.unwrap_or(Encoding::Plain),
                };
                self.write(&at, ino, *offset, *unencoded_file_len, Some(extent))?;
            }
            Command::Clone {
                offset,
                len,
                path,
                clone_uuid,
                clone_path,
                clone_offset,
                ..
            } => {
                check_path(clone_path).map_err(|e| at.err(e.to_string()))?;
                self.put_extents()?;
                let ino = self.file(&at, path)?;
                let pieces = if Some(*clone_uuid) == self.uuid {
                    let src = self.file(&at, clone_path)?;
                    extents_in(&self.tree, src, *clone_offset, *len)?
                } else {
                    let other = snapshots
                        .index_of(clone_uuid)
                        .ok_or_else(|| at.err("the clone source has no index"))?;
                    let t = Tree::open(self.tree.pages(), other.top());
                    let src = resolve_in(&t, clone_path).map_err(|e| match e {
                        IndexError::NotFound { .. } => at.err("the clone source has no such file"),
                        e => e,
                    })?;
                    let mut pieces = extents_in(&t, src, *clone_offset, *len)?;
                    for (_, e) in &mut pieces {
                        let name = other.sources.get(e.source as usize).ok_or_else(|| {
                            at.err("the clone source's index names no such stream")
                        })?;
                        e.source = self.source_of(name);
                    }
                    pieces
                };
                self.write(&at, ino, *offset, *len, None)?;
                for (off, e) in pieces {
                    // Offsets relative to the source range.
                    self.tree
                        .insert(&extent_key(ino, offset + off), &e.encode())?;
                }
            }
            Command::Truncate { path, size } => {
                let ino = self.file(&at, path)?;
                if *size < self.inode_mut(ino)?.size {
                    self.put_extents()?;
                    punch(&mut self.tree, ino, *size, u64::MAX)?;
                }
                self.inode_mut(ino)?.size = *size;
            }
            Command::Chmod { mode, .. } => self.chmod(&at, *mode)?,
            Command::Chown { uid, gid, .. } => self.chown(&at, *uid, *gid)?,
            Command::Utimes { mtime, .. } => self.utimes(&at, mtime)?,
            Command::Fallocate {
                path,
                mode,
                offset,
                size,
            } => {
                let ino = self.file(&at, path)?;
                let end = offset
                    .checked_add(*size)
                    .ok_or_else(|| at.err("range past 2^64"))?;
                match *mode {
                    0 => {
                        let i = self.inode_mut(ino)?;
                        i.size = i.size.max(end);
                    }
                    FALLOC_FL_KEEP_SIZE => {}
                    m if m == FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE => {
                        self.put_extents()?;
                        punch(&mut self.tree, ino, *offset, end)?;
                    }
                    m => return Err(at.err(format!("FALLOCATE mode {m:#x}"))),
                }
            }
            Command::Fileattr { path, attr } => {
                let ino = self.resolve(&at, path)?;
                self.inode_mut(ino)?.flags = *attr;
            }
            Command::UpdateExtent { .. } => {
                return Err(at.err("a stream without file data (--no-data) cannot be indexed"));
            }
            Command::End => self.ended = true,
            // Verity and commands this crate does not know change nothing a
            // listing shows (the receiver ignores unknown commands too).
            Command::EnableVerity { .. } | Command::Unknown { .. } => {}
        }
        self.tree.flush_if_over(DIRTY_NODES)
    }

    /// Apply `raw` undecoded when it is a MKFILE, the RENAME of the file
    /// just made, or a WRITE, CHMOD, CHOWN or UTIMES of the file the last
    /// command named, as most commands of a stream are (a kernel stream
    /// makes each new file under an orphan name, renames it, then gives
    /// it its data and attributes): true when applied, or the change's
    /// error (the one `apply` gives). False when it is anything else, or
    /// an attribute is missing or mis-sized: [`apply`](Self::apply) of the
    /// decoded command then reports it. Decoding a command costs more than
    /// these changes do.
    pub(crate) fn apply_quick(
        &mut self,
        info: &CommandInfo,
        raw: &RawCommand<'_>,
    ) -> Result<bool, IndexError> {
        fn fixed<const N: usize>(raw: &RawCommand<'_>, attr: Attr) -> Option<[u8; N]> {
            raw.get(attr)?.try_into().ok()
        }
        fn u64_of(raw: &RawCommand<'_>, attr: Attr) -> Option<u64> {
            fixed(raw, attr).map(u64::from_le_bytes)
        }
        if self.ended || self.uuid.is_none() {
            return Ok(false);
        }
        let Some(path) = raw.get(Attr::Path) else {
            return Ok(false);
        };
        match raw.kind() {
            // The RENAME of a new file from the name it was made under.
            Some(CommandKind::Rename) => {
                let (Some(h), Some(to)) = (&self.held, raw.get(Attr::PathTo)) else {
                    return Ok(false);
                };
                // The held path passed `check_path` with its MKFILE.
                if path != h.path.as_slice() || check_path(to).is_err() {
                    return Ok(false);
                }
                let Some(h) = self.held.take() else {
                    return Ok(false);
                };
                let at = At { info, path };
                if !self.create_renamed(&h, &at, to)? {
                    self.create_held(h)?;
                    self.rename(&at, path, to)?;
                }
                self.tree.flush_if_over(DIRTY_NODES)?;
                return Ok(true);
            }
            _ if self.held.is_some() => return Ok(false),
            Some(CommandKind::Mkfile) => {
                if fixed::<8>(raw, Attr::Ino).is_none() || check_path(path).is_err() {
                    return Ok(false);
                }
                self.hold(info, path, Inode::new(FileType::File, 0o600));
                return Ok(true);
            }
            _ => {}
        }
        // The remembered path passed `check_path` when it was resolved; the
        // changes below check the rest as `apply` does.
        if self.last.get(path).is_none() {
            return Ok(false);
        }
        let at = At { info, path };
        match raw.kind() {
            Some(CommandKind::Chmod) => {
                let Some(mode) = u64_of(raw, Attr::Mode) else {
                    return Ok(false);
                };
                self.chmod(&at, mode)?;
            }
            Some(CommandKind::Chown) => {
                let (Some(uid), Some(gid)) = (u64_of(raw, Attr::Uid), u64_of(raw, Attr::Gid))
                else {
                    return Ok(false);
                };
                self.chown(&at, uid, gid)?;
            }
            Some(CommandKind::Utimes) => {
                let (Some(_), Some(mtime), Some(_)) = (
                    fixed::<12>(raw, Attr::Atime),
                    fixed::<12>(raw, Attr::Mtime),
                    fixed::<12>(raw, Attr::Ctime),
                ) else {
                    return Ok(false);
                };
                self.utimes(&at, &Timespec::from_bytes(mtime))?;
            }
            Some(CommandKind::Write) => {
                let (Some(offset), Some(data)) =
                    (u64_of(raw, Attr::FileOffset), raw.find(Attr::Data))
                else {
                    return Ok(false);
                };
                let len = data.value_len() as u64;
                self.write_plain(&at, offset, len, data_offset_of(info, data))?;
            }
            _ => return Ok(false),
        }
        self.tree.flush_if_over(DIRTY_NODES)?;
        Ok(true)
    }

    /// CHMOD `at`'s path to `mode`.
    fn chmod(&mut self, at: &At<'_>, mode: u64) -> Result<(), IndexError> {
        let ino = self.resolve(at, at.path)?;
        self.inode_mut(ino)?.mode = (mode & 0o7777) as u32;
        Ok(())
    }

    /// CHOWN `at`'s path to `uid` and `gid`.
    fn chown(&mut self, at: &At<'_>, uid: u64, gid: u64) -> Result<(), IndexError> {
        let ino = self.resolve(at, at.path)?;
        let uid = u32::try_from(uid).map_err(|_| at.err("uid out of range"))?;
        let gid = u32::try_from(gid).map_err(|_| at.err("gid out of range"))?;
        let i = self.inode_mut(ino)?;
        (i.uid, i.gid) = (uid, gid);
        Ok(())
    }

    /// UTIMES of `at`'s path: its modification time `mtime`.
    fn utimes(&mut self, at: &At<'_>, mtime: &Timespec) -> Result<(), IndexError> {
        let ino = self.resolve(at, at.path)?;
        if mtime.nsec >= 1_000_000_000 {
            return Err(at.err("nanoseconds out of range"));
        }
        self.inode_mut(ino)?.mtime = (mtime.sec as i64, mtime.nsec);
        Ok(())
    }

    /// WRITE of `len` bytes at `offset` of `at`'s path, lying at
    /// `stream_offset` of the stream.
    fn write_plain(
        &mut self,
        at: &At<'_>,
        offset: u64,
        len: u64,
        stream_offset: u64,
    ) -> Result<(), IndexError> {
        let ino = self.file(at, at.path)?;
        let extent = Extent {
            len,
            source: self.source,
            stream_offset,
            encoding: Encoding::Plain,
        };
        self.write(at, ino, offset, len, Some(extent))
    }

    /// Make the held inode `h` under the name it was made with.
    fn create_held(&mut self, h: Held) -> Result<(), IndexError> {
        let made = At {
            info: &h.info,
            path: &h.path,
        };
        self.create(&made, &h.path, h.inode)
    }

    /// The number of the stream `name` in the source list (added if new).
    fn source_of(&mut self, name: &str) -> u32 {
        match self.root.sources.iter().position(|s| s == name) {
            Some(i) => i as u32,
            None => {
                self.root.sources.push(name.to_owned());
                (self.root.sources.len() - 1) as u32
            }
        }
    }

    fn inode(&self, ino: u64) -> Result<Inode, IndexError> {
        match self.changed(ino) {
            Some(i) => Ok(i.clone()),
            None => self.stored_inode(ino),
        }
    }

    /// Inode `ino` if it changed since the changed ones were last put in
    /// the tree.
    fn changed(&self, ino: u64) -> Option<&Inode> {
        match self.made_at(ino) {
            Some(at) => self.made.get(at).map(|(_, i)| i),
            None => self.inodes.get(&ino),
        }
    }

    /// [`changed`](Self::changed), to change.
    fn changed_mut(&mut self, ino: u64) -> Option<&mut Inode> {
        match self.made_at(ino) {
            Some(at) => self.made.get_mut(at).map(|(_, i)| i),
            None => self.inodes.get_mut(&ino),
        }
    }

    /// Where inode `ino` is in `made`, if it is.
    fn made_at(&self, ino: u64) -> Option<usize> {
        match self.made.last() {
            Some((n, _)) if *n == ino => Some(self.made.len() - 1),
            Some((n, _)) if *n > ino => {
                let hint = self.made_hint.get();
                if self.made.get(hint).is_some_and(|(n, _)| *n == ino) {
                    return Some(hint);
                }
                let at = self.made.binary_search_by_key(&ino, |(n, _)| *n).ok()?;
                self.made_hint.set(at);
                Some(at)
            }
            _ => None,
        }
    }

    /// The kind of inode `ino`.
    fn kind(&self, ino: u64) -> Result<FileType, IndexError> {
        if let Some(i) = self.changed(ino) {
            return Ok(i.kind);
        }
        // A directory's kind is asked for every name made in it, long
        // after its inode left the cache of changed ones (the root's, for
        // every new file's orphan name): from the memo, not the tree.
        if let Some(k) = self.kinds.borrow().get(ino) {
            return Ok(k);
        }
        let k = self.stored_inode(ino)?.kind;
        self.kinds.borrow_mut().put(ino, k);
        Ok(k)
    }

    /// Inode `ino` to change, in the cache of changed inodes.
    fn inode_mut(&mut self, ino: u64) -> Result<&mut Inode, IndexError> {
        let missing = || IndexError::Record {
            what: "inode",
            key: inode_key(ino),
            reason: "missing",
        };
        // One search of `made`: a new file's commands all land there.
        if let Some(at) = self.made_at(ino) {
            return self.made.get_mut(at).map(|(_, i)| i).ok_or_else(missing);
        }
        if !self.inodes.contains_key(&ino) {
            let i = self.stored_inode(ino)?;
            self.cache_inode(ino, i)?;
        }
        self.inodes.get_mut(&ino).ok_or_else(missing)
    }

    /// Inode `ino` as the tree has it.
    fn stored_inode(&self, ino: u64) -> Result<Inode, IndexError> {
        let k = inode_key(ino);
        let v = self.tree.get(&k)?.ok_or_else(|| IndexError::Record {
            what: "inode",
            key: k.clone(),
            reason: "missing",
        })?;
        Inode::decode(&k, &v)
    }

    fn put_inode(&mut self, ino: u64, i: &Inode) -> Result<(), IndexError> {
        if let Some(was) = self.changed_mut(ino) {
            *was = i.clone();
            return Ok(());
        }
        self.cache_inode(ino, i.clone())
    }

    /// Put `i` in the map of changed inodes as inode `ino` (in neither
    /// that map nor `made`).
    fn cache_inode(&mut self, ino: u64, i: Inode) -> Result<(), IndexError> {
        if self.inodes.len() >= CACHED_INODES {
            self.put_inodes()?;
        }
        // What the tree has of it is changing (a forged parent index may
        // hand out a number it uses).
        self.kinds.get_mut().forget(ino);
        self.inodes.insert(ino, i);
        Ok(())
    }

    /// Make `i` the new inode `ino`: a number just handed out, above
    /// every one handed out before (see `made`).
    fn put_new_inode(&mut self, ino: u64, i: Inode) -> Result<(), IndexError> {
        if self.made.len() >= CACHED_INODES {
            self.put_inodes()?;
        }
        // What the tree has of it is changing (a forged parent index may
        // hand out a number it uses).
        self.kinds.get_mut().forget(ino);
        self.made.push((ino, i));
        Ok(())
    }

    /// Put the changed inodes in the tree.
    fn put_inodes(&mut self) -> Result<(), IndexError> {
        let mut all: Vec<(u64, Inode)> = self.inodes.drain().collect();
        // `made` is in order already: a merge sort takes it as one run.
        all.append(&mut self.made);
        all.sort_by_key(|(ino, _)| *ino);
        let mut run = Records::with_capacity(all.len() * 80, all.len());
        for (ino, i) in &all {
            inode_key_into(&mut self.run_key, *ino);
            i.encode_into(&mut self.run_value);
            run.push(&self.run_key, &self.run_value);
        }
        self.tree.insert_sorted(&run)
    }

    /// Put the extents written since the last time in the tree: before
    /// anything reads or cuts extents there.
    fn put_extents(&mut self) -> Result<(), IndexError> {
        let mut all = std::mem::take(&mut self.extents);
        all.sort();
        self.tree.insert_sorted(&all)
    }

    /// Forget what is cached of `path`, and of every path below it if it
    /// names a directory (`dir`; the cache has paths below directories
    /// alone, as it always follows the tree).
    fn forget_path(&self, path: &[u8], dir: bool) {
        self.last.clear();
        self.last_dir.clear();
        let mut paths = self.paths.borrow_mut();
        paths.remove(path);
        if !dir {
            return;
        }
        let mut below = path.to_vec();
        below.push(b'/');
        if !paths
            .range(below.clone()..)
            .next()
            .is_some_and(|(k, _)| k.starts_with(&below))
        {
            return;
        }
        let mut end = path.to_vec();
        end.push(b'/' + 1);
        let gone: Vec<Vec<u8>> = paths.range(below..end).map(|(k, _)| k.clone()).collect();
        for k in gone {
            paths.remove(&k);
        }
    }

    fn entry(&self, dir: u64, name: &[u8]) -> Result<Option<u64>, IndexError> {
        Ok(self.dirent(dir, name)?.ino)
    }

    /// The entry `name` of `dir`, changed or as the tree has it.
    fn dirent(&self, dir: u64, name: &[u8]) -> Result<Dirent, IndexError> {
        let mut k = self.scratch.borrow_mut();
        dirent_key_into(&mut k, dir, name);
        if dir >= self.made_from
            && let Some(o) = &self.orphans
            && (o.is_empty() || !o.contains(k.as_slice()))
            && parse_orphan_name(name).is_some()
        {
            return Ok(Dirent {
                ino: None,
                stored: false,
            });
        }
        if let Some(d) = self.dirents.get(k.as_slice()) {
            return Ok(*d);
        }
        if dir >= self.fresh_from || dir >= self.made_from && !self.put_names.may_hold(&k) {
            return Ok(Dirent {
                ino: None,
                stored: false,
            });
        }
        let ino = self
            .tree
            .get(&k)?
            .map(|v| decode_dirent(&k, &v))
            .transpose()?;
        Ok(Dirent {
            ino,
            stored: ino.is_some(),
        })
    }

    /// Make the entry `name` of `dir`, which is `was`, name `ino`
    /// (`None`: remove it).
    fn set_dirent(
        &mut self,
        dir: u64,
        name: &[u8],
        mut was: Dirent,
        ino: Option<u64>,
    ) -> Result<(), IndexError> {
        if self.dirents.len() >= CACHED_PATHS {
            self.put_dirents()?;
            // The tree has every entry now: `was` is there if it names
            // anything. Left as it was, an entry only the cache had would
            // stay in the tree when removed here.
            was.stored = was.ino.is_some();
        }
        let mut key = self.scratch.borrow_mut();
        dirent_key_into(&mut key, dir, name);
        let d = Dirent {
            ino,
            stored: was.stored,
        };
        if ino.is_none() && !was.stored {
            self.dirents.swap_remove(key.as_slice());
        } else if let Some(e) = self.dirents.get_mut(key.as_slice()) {
            *e = d;
        } else {
            self.dirents.insert(key.clone(), d);
        }
        if dir >= self.made_from
            && let Some(o) = &mut self.orphans
            && parse_orphan_name(name).is_some()
        {
            if ino.is_none() {
                o.remove(key.as_slice());
            } else if o.len() < ORPHANS {
                o.insert(key.clone());
            } else if !o.contains(key.as_slice()) {
                self.orphans = None;
            }
        }
        Ok(())
    }

    /// Put the changed directory entries in the tree.
    fn put_dirents(&mut self) -> Result<(), IndexError> {
        self.fresh_from = self.root.next_ino;
        let mut all: Vec<(Vec<u8>, Dirent)> = self.dirents.drain(..).collect();
        // In the order they were made: a stream makes a directory's entries
        // together, often in name order, and a merge sort takes the runs
        // that leaves as they are.
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let made_from = self.made_from;
        self.put_names.add_all(
            all.iter()
                .filter(|(k, d)| d.ino.is_some() && dirent_dir(k) >= made_from)
                .map(|(k, _)| k.as_slice()),
        );
        let mut put = Records::with_capacity(all.len() * 40, all.len());
        for (k, d) in all {
            match d.ino {
                Some(ino) => put.push(&k, &ino.to_le_bytes()),
                None => {
                    self.tree.remove(&k)?;
                }
            }
        }
        self.tree.insert_sorted(&put)
    }

    fn resolve(&self, at: &At<'_>, path: &[u8]) -> Result<u64, IndexError> {
        if let Some(ino) = self.last.get(path) {
            return Ok(ino);
        }
        let (dir, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (self.resolve_dir(at, &path[..i])?, &path[i + 1..]),
            None if path.is_empty() => return Ok(ROOT_INO),
            None => (ROOT_INO, path),
        };
        let ino = self
            .entry(dir, name)?
            .ok_or_else(|| at.err("no such file or directory"))?;
        self.last.set(path, ino);
        Ok(ino)
    }

    /// [`resolve`](Self::resolve) of a path that leads to a directory
    /// (the directory part of a path), remembered (see [`CACHED_PATHS`]).
    fn resolve_dir(&self, at: &At<'_>, path: &[u8]) -> Result<u64, IndexError> {
        if let Some(ino) = self.last_dir.get(path) {
            return Ok(ino);
        }
        let cached = self.paths.borrow().get(path).copied();
        let ino = match cached {
            Some(ino) => ino,
            None => {
                let ino = self.resolve(at, path)?;
                let mut paths = self.paths.borrow_mut();
                if paths.len() >= CACHED_PATHS {
                    paths.clear();
                }
                paths.insert(path.to_vec(), ino);
                ino
            }
        };
        self.last_dir.set(path, ino);
        Ok(ino)
    }

    /// The inode of `path`, which must be a regular file.
    fn file(&self, at: &At<'_>, path: &[u8]) -> Result<u64, IndexError> {
        let ino = self.resolve(at, path)?;
        if self.kind(ino)? != FileType::File {
            return Err(at.err("not a regular file"));
        }
        Ok(ino)
    }

    /// The directory holding `path`'s last component, and that name.
    fn parent_of<'n>(&self, at: &At<'_>, path: &'n [u8]) -> Result<(u64, &'n [u8]), IndexError> {
        if path.is_empty() {
            return Err(at.err("the subvolume root cannot be the target of this command"));
        }
        let (dir, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (self.resolve_dir(at, &path[..i])?, &path[i + 1..]),
            None => (ROOT_INO, path),
        };
        if name.len() > NAME_MAX {
            return Err(at.err(format!("a name longer than {NAME_MAX} bytes")));
        }
        if self.kind(dir)? != FileType::Dir {
            return Err(at.err("a path component is not a directory"));
        }
        Ok((dir, name))
    }

    fn add_entry(
        &mut self,
        at: &At<'_>,
        dir: u64,
        name: &[u8],
        ino: u64,
    ) -> Result<(), IndexError> {
        let was = self.dirent(dir, name)?;
        if was.ino.is_some() {
            return Err(at.err("the name exists already"));
        }
        self.fill_entry(dir, name, was, ino)
    }

    /// Make the free entry `name` of `dir`, which is `was`, name `ino`.
    fn fill_entry(
        &mut self,
        dir: u64,
        name: &[u8],
        was: Dirent,
        ino: u64,
    ) -> Result<(), IndexError> {
        self.set_dirent(dir, name, was, Some(ino))?;
        self.inode_mut(dir)?.size += 2 * name.len() as u64;
        Ok(())
    }

    /// The next inode number, handed out.
    fn new_ino(&mut self, at: &At<'_>) -> Result<u64, IndexError> {
        let ino = self.root.next_ino;
        self.root.next_ino = ino
            .checked_add(1)
            .ok_or_else(|| at.err("out of inode numbers"))?;
        Ok(ino)
    }

    fn remove_entry(&mut self, dir: u64, name: &[u8]) -> Result<(), IndexError> {
        let was = self.dirent(dir, name)?;
        self.set_dirent(dir, name, was, None)?;
        let d = self.inode_mut(dir)?;
        d.size = d.size.saturating_sub(2 * name.len() as u64);
        Ok(())
    }

    /// Hold the new non-directory `inode` at `path` (see [`Held`]).
    fn hold(&mut self, info: &CommandInfo, path: &[u8], inode: Inode) {
        self.held = Some(Held {
            info: *info,
            path: path.to_vec(),
            inode,
        });
    }

    /// Make `h`'s inode under `to`, as its creation and the RENAME `at` of
    /// it would, when that is all they do: false (nothing done) when `to`
    /// names something already, or lies below `h`'s path (the two
    /// commands then run one after the other).
    fn create_renamed(&mut self, h: &Held, at: &At<'_>, to: &[u8]) -> Result<bool, IndexError> {
        if to
            .strip_prefix(h.path.as_slice())
            .is_some_and(|r| r.first() == Some(&b'/'))
        {
            return Ok(false);
        }
        let made = At {
            info: &h.info,
            path: &h.path,
        };
        let (fdir, fname) = self.parent_of(&made, &h.path)?;
        if self.entry(fdir, fname)?.is_some() {
            return Err(made.err("the name exists already"));
        }
        let (tdir, tname) = self.parent_of(at, to)?;
        let was = self.dirent(tdir, tname)?;
        if was.ino.is_some() {
            return Ok(false);
        }
        let ino = self.new_ino(&made)?;
        self.fill_entry(tdir, tname, was, ino)?;
        self.put_new_inode(ino, h.inode.clone())?;
        // The new file's data and attributes come next, by this name.
        self.last.set(to, ino);
        Ok(true)
    }

    fn create(&mut self, at: &At<'_>, path: &[u8], mut inode: Inode) -> Result<(), IndexError> {
        let (dir, name) = self.parent_of(at, path)?;
        let ino = self.new_ino(at)?;
        if inode.kind == FileType::Dir {
            inode.parent = dir;
        }
        self.add_entry(at, dir, name, ino)?;
        self.put_new_inode(ino, inode)
    }

    fn drop_link(&mut self, ino: u64) -> Result<(), IndexError> {
        let mut i = self.inode(ino)?;
        i.nlink = i.nlink.saturating_sub(1);
        if i.nlink == 0 {
            self.delete_inode(ino)
        } else {
            self.put_inode(ino, &i)
        }
    }

    fn delete_inode(&mut self, ino: u64) -> Result<(), IndexError> {
        self.put_extents()?;
        if let Some(at) = self.made_at(ino) {
            self.made.remove(at);
        } else {
            self.inodes.remove(&ino);
        }
        self.kinds.get_mut().forget(ino);
        for prefix in [xattr_prefix(ino), extent_prefix(ino)] {
            for (k, _) in self.tree.prefixed(&prefix)? {
                self.tree.remove(&k)?;
            }
        }
        self.tree.remove(&inode_key(ino))?;
        Ok(())
    }

    fn rename(&mut self, at: &At<'_>, from: &[u8], to: &[u8]) -> Result<(), IndexError> {
        // Names resolve as the tree is before the rename, which the cache
        // follows until the names change below.
        let (fdir, fname) = self.parent_of(at, from)?;
        let ino = self
            .entry(fdir, fname)?
            .ok_or_else(|| at.err("no such file or directory"))?;
        let (tdir, tname) = self.parent_of(at, to)?;
        let mut moved = self.inode(ino)?;
        self.forget_path(from, moved.kind == FileType::Dir);
        if let Some(existing) = self.entry(tdir, tname)? {
            self.forget_path(to, self.kind(existing)? == FileType::Dir);
            if existing == ino {
                // rename(2) of two names of one inode does nothing.
                return Ok(());
            }
            let old = self.inode(existing)?;
            match (moved.kind == FileType::Dir, old.kind == FileType::Dir) {
                (true, true) => {
                    self.put_dirents()?;
                    if self.tree.prefixed_any(&dirent_prefix(existing))? {
                        return Err(at.err("RENAME over a directory that is not empty"));
                    }
                    self.remove_entry(tdir, tname)?;
                    self.delete_inode(existing)?;
                }
                (false, false) => {
                    self.remove_entry(tdir, tname)?;
                    self.drop_link(existing)?;
                }
                _ => return Err(at.err("RENAME between a directory and a non-directory")),
            }
        }
        if moved.kind == FileType::Dir {
            // No directory may move below itself.
            let mut d = tdir;
            loop {
                if d == ino {
                    return Err(at.err("RENAME of a directory below itself"));
                }
                if d == ROOT_INO {
                    break;
                }
                d = self.inode(d)?.parent;
            }
        }
        self.remove_entry(fdir, fname)?;
        self.add_entry(at, tdir, tname, ino)?;
        if moved.kind == FileType::Dir {
            moved = self.inode(ino)?;
            moved.parent = tdir;
            self.put_inode(ino, &moved)?;
        }
        Ok(())
    }

    /// Make `[offset, offset + len)` of `ino` hold `extent` (`None`: leave
    /// it a hole, for a CLONE to fill), growing the file to cover it.
    fn write(
        &mut self,
        at: &At<'_>,
        ino: u64,
        offset: u64,
        len: u64,
        extent: Option<Extent>,
    ) -> Result<(), IndexError> {
        let end = offset
            .checked_add(len)
            .ok_or_else(|| at.err("range past 2^64"))?;
        if len == 0 {
            return Ok(());
        }
        let size = self.inode_mut(ino)?.size;
        // Extents lie below the size (every change that adds one grows the
        // size over it, every cut takes those past the new size away): a
        // write past the end, as a new file's are, has nothing to cut.
        if offset < size {
            self.put_extents()?;
            punch(&mut self.tree, ino, offset, end)?;
        }
        if let Some(e) = extent {
            extent_key_into(&mut self.run_key, ino, offset);
            e.encode_into(&mut self.run_value);
            self.extents.push(&self.run_key, &self.run_value);
            if self.extents.len() >= CACHED_INODES {
                self.put_extents()?;
            }
        }
        if end > size {
            self.inode_mut(ino)?.size = end;
        }
        Ok(())
    }
}

/// Index the first stream of `input` (named `source` in the index's source
/// list), starting from its parent's index for an incremental stream: the
/// snapshot's UUID and its index.
///
/// # Errors
///
/// The stream does not decode or cannot be applied, or a page cannot be
/// read or written.
pub fn index_stream(
    pages: &Pages<'_>,
    input: impl Read,
    source: &str,
    snapshots: &dyn Snapshots,
) -> Result<([u8; 16], IndexRoot), IndexError> {
    // Read no further than END: the caller reads on to the stream file's
    // end, where its hash is checked.
    let reader = StreamReader::with_options(input, ReaderOptions::new());
    index_with(pages, reader, source, snapshots)
}

/// [`index_stream`] of the bytes a stream is being written from, in this
/// process: their CRCs are left unchecked, as nothing could have changed
/// them since they were computed (the stored file is checked whenever it
/// is read), and commands are split in the batches they come in.
pub(super) fn index_own_stream(
    pages: &Pages<'_>,
    input: impl BufRead,
    source: &str,
    snapshots: &dyn Snapshots,
) -> Result<([u8; 16], IndexRoot), IndexError> {
    let options = ReaderOptions::new().with_crc_check(false);
    let reader = BufStreamReader::with_options(input, options);
    index_with(pages, reader, source, snapshots)
}

/// Where [`index_with`] takes commands from.
trait Commands {
    fn next(&mut self) -> Result<Option<(CommandInfo, RawCommand<'_>)>, DecodeError>;
}

impl<R: Read> Commands for StreamReader<R> {
    fn next(&mut self) -> Result<Option<(CommandInfo, RawCommand<'_>)>, DecodeError> {
        self.next_raw()
    }
}

impl<R: BufRead> Commands for BufStreamReader<R> {
    fn next(&mut self) -> Result<Option<(CommandInfo, RawCommand<'_>)>, DecodeError> {
        self.next_raw()
    }
}

/// Where the value of `data`, an attribute of the command `info`, starts in
/// the raw stream.
fn data_offset_of(info: &CommandInfo, data: &RawAttr) -> u64 {
    /// A command's header: length, number, CRC.
    const COMMAND_HEADER: u64 = 10;
    info.offset + COMMAND_HEADER + data.value_offset() as u64
}

fn index_with(
    pages: &Pages<'_>,
    mut reader: impl Commands,
    source: &str,
    snapshots: &dyn Snapshots,
) -> Result<([u8; 16], IndexRoot), IndexError> {
    let mut ix = Indexer::new(pages, source);
    while let Some((info, raw)) = reader.next()? {
        if ix.apply_quick(&info, &raw)? {
            continue;
        }
        let data_offset = raw.find(Attr::Data).map_or(0, |a| data_offset_of(&info, a));
        let cmd = Command::from_raw(&raw, &info)?;
        ix.apply(&info, &cmd, data_offset, snapshots)?;
        if ix.ended() {
            break;
        }
    }
    // OK: finish refuses a stream without END, which comes after SUBVOL.
    let uuid = ix.uuid().unwrap_or_default();
    Ok((uuid, ix.finish()?))
}

impl Tree<'_, '_> {
    /// Whether any key starts with `prefix`.
    pub(crate) fn prefixed_any(&self, prefix: &[u8]) -> Result<bool, IndexError> {
        let mut any = false;
        self.scan(prefix, &mut |k, _| {
            any = k.starts_with(prefix);
            Ok(ControlFlow::Break(()))
        })?;
        Ok(any)
    }
}

/// The inode of `path` in `tree`.
pub(crate) fn resolve_in(tree: &Tree<'_, '_>, path: &[u8]) -> Result<u64, IndexError> {
    let mut ino = ROOT_INO;
    if path.is_empty() {
        return Ok(ino);
    }
    for name in path.split(|&b| b == b'/') {
        let k = dirent_key(ino, name);
        ino = match tree.get(&k)? {
            Some(v) => decode_dirent(&k, &v)?,
            None => {
                return Err(IndexError::NotFound {
                    path: crate::manifest::escape(path),
                });
            }
        };
    }
    Ok(ino)
}

/// The extents of `ino` that hold data in `[offset, offset + len)`, cut to
/// that range, each with its start relative to `offset`.
pub(crate) fn extents_in(
    tree: &Tree<'_, '_>,
    ino: u64,
    offset: u64,
    len: u64,
) -> Result<Vec<(u64, Extent)>, IndexError> {
    let end = offset.saturating_add(len);
    let mut out = Vec::new();
    overlapping(tree, ino, offset, end, &mut |start, e| {
        let s = start.max(offset);
        let cut = e.skip(s - start);
        let keep = (start + e.len).min(end) - s;
        out.push((s - offset, Extent { len: keep, ..cut }));
    })?;
    Ok(out)
}

/// Call `f` with every extent of `ino` overlapping `[from, to)` (its start
/// and record), in order.
pub(crate) fn overlapping(
    tree: &Tree<'_, '_>,
    ino: u64,
    from: u64,
    to: u64,
    f: &mut dyn FnMut(u64, Extent),
) -> Result<(), IndexError> {
    overlapping_until(tree, ino, from, to, &mut |start, e| {
        f(start, e);
        ControlFlow::Continue(())
    })
}

/// [`overlapping`], until `f` breaks.
pub(crate) fn overlapping_until(
    tree: &Tree<'_, '_>,
    ino: u64,
    from: u64,
    to: u64,
    f: &mut dyn FnMut(u64, Extent) -> ControlFlow<()>,
) -> Result<(), IndexError> {
    let prefix = extent_prefix(ino);
    // The extent starting at or before `from` may reach into the range.
    if let Some((k, v)) = tree.floor(&extent_key(ino, from))?
        && k.starts_with(&prefix)
        && let Some(start) = extent_offset(&k)
        && start < from
    {
        let e = Extent::decode(&k, &v)?;
        if start.saturating_add(e.len) > from && f(start, e).is_break() {
            return Ok(());
        }
    }
    let mut err = None;
    tree.scan(&extent_key(ino, from), &mut |k, v| {
        let Some(start) = extent_offset(k).filter(|_| k.starts_with(&prefix)) else {
            return Ok(ControlFlow::Break(()));
        };
        if start >= to {
            return Ok(ControlFlow::Break(()));
        }
        match Extent::decode(k, v) {
            Ok(e) => Ok(f(start, e)),
            Err(e) => {
                err = Some(e);
                Ok(ControlFlow::Break(()))
            }
        }
    })?;
    err.map_or(Ok(()), Err)
}

/// Remove `ino`'s data in `[from, to)`, cutting the extents that straddle
/// either end.
fn punch(tree: &mut Tree<'_, '_>, ino: u64, from: u64, to: u64) -> Result<(), IndexError> {
    let mut hit = Vec::new();
    overlapping(tree, ino, from, to, &mut |start, e| hit.push((start, e)))?;
    for (start, e) in hit {
        tree.remove(&extent_key(ino, start))?;
        let end = start.saturating_add(e.len);
        if start < from {
            let left = Extent {
                len: from - start,
                ..e
            };
            tree.insert(&extent_key(ino, start), &left.encode())?;
        }
        if end > to {
            let right = e.skip(to - start);
            tree.insert(&extent_key(ino, to), &right.encode())?;
        }
    }
    Ok(())
}
