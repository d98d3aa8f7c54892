//! The full-send planner: walks every item of the snapshot's tree in key
//! order and emits the commands the kernel's `btrfs send` emits for the
//! same snapshot, in the same order (`shared/docs/send-algorithm.md`; the
//! kernel functions named here are in Linux `fs/btrfs/send.c`).
//!
//! The structure follows the kernel's event loop so that the order of
//! commands is the same by construction: every item goes through
//! [`FullSend::finish_inode_if_needed`] first (which processes the current
//! inode's references once its ref items are over, and finishes the inode
//! when the key moves to another inode), then to the handler of its type.
//! In a full send there is no parent snapshot, so the incremental machinery
//! (overwrite checks, delayed directory moves, rmdir) never triggers and is
//! left out; what remains is:
//!
//! * `send_progress`: inodes below it have their final names on the
//!   receiver; every other inode is at its orphan name `o<ino>-<generation>-<idx>`
//!   (or does not exist yet);
//! * directories with a higher number than a child are created early at
//!   their orphan name (`did_create_dir`);
//! * the directory-utimes LRU cache of Linux ≥ 6.3 (64 entries, trimmed
//!   after every `finish_inode_if_needed`, flushed most recently used first);
//! * file data: writes in `max_send_read_size` chunks, encoded writes, and
//!   clones of extents shared within the snapshot (`find_extent_clone`,
//!   `clone_range`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;

use stream_format::{Command, StreamWriter};

use crate::fs::Filesystem;
use crate::fs::subvol::Subvolume;
use crate::ondisk;
use crate::tree::key::Key;
use crate::tree::walk::ItemRef;

use super::data::{self, ExtentReader};
use super::error::SendError;
use super::view::{
    self, ExtentKind, FileExtent, InodeInfo, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT,
    S_IFREG, S_IFSOCK, TreeView,
};
use super::{Progress, SendOptions};

const FIRST_FREE: u64 = ondisk::BTRFS_FIRST_FREE_OBJECTID;
/// `SEND_MAX_EXTENT_REFS`: more references than this and no clone is tried.
const SEND_MAX_EXTENT_REFS: u64 = 1024;
/// `SEND_MAX_DIR_UTIMES_CACHE_SIZE`.
const DIR_UTIMES_CACHE_SIZE: usize = 64;
/// Entries kept in the first-ref cache before it is dropped (memory bound).
const NAME_CACHE_MAX: usize = 1 << 16;
/// The xattr the kernel sends only at the end of an inode.
const XATTR_NAME_CAPS: &[u8] = b"security.capability";
const XATTR_ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const XATTR_ACL_DEFAULT: &[u8] = b"system.posix_acl_default";
/// `FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE`, for reference: full sends
/// never punch holes.
#[allow(dead_code)]
const FALLOC_PUNCH: u32 = 3;

/// The inode being processed (`sctx->cur_*`).
#[derive(Debug, Default)]
struct Cur {
    ino: u64,
    generation: u64,
    size: u64,
    mode: u32,
    ignore: bool,
    next_write_offset: u64,
    /// Its path on the receiver now, when known (`cur_inode_path`).
    path: Option<Vec<u8>>,
}

/// A recorded new reference (`struct recorded_ref`).
#[derive(Debug)]
struct NewRef {
    dir: u64,
    dir_gen: u64,
    full_path: Vec<u8>,
}

/// A file extent item of the snapshot already passed: a clone source
/// candidate (what the kernel's backref walk finds, restricted to the send
/// root and to inodes ≤ the current one).
#[derive(Debug, Clone, Copy)]
struct CloneCand {
    leaf: u64,
    ino: u64,
    file_offset: u64,
    extent_offset: u64,
    num_bytes: u64,
}

/// The chosen clone source (`struct clone_root`).
#[derive(Debug, Clone, Copy)]
struct CloneSrc {
    ino: u64,
    offset: u64,
}

/// Statistics of a finished send.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendStats {
    /// Bytes of the stream.
    pub stream_bytes: u64,
    /// Inodes processed.
    pub inodes: u64,
    /// File data bytes sent in WRITE commands (plain data).
    pub data_bytes: u64,
    /// Bytes of ENCODED_WRITE data.
    pub encoded_bytes: u64,
    /// Bytes covered by CLONE commands.
    pub cloned_bytes: u64,
}

pub(crate) struct FullSend<'a, W: Write> {
    fs: &'a Filesystem,
    view: TreeView<'a>,
    out: StreamWriter<W>,
    opts: SendOptions,
    progress: &'a dyn Progress,
    sectorsize: u64,
    max_read: u64,
    /// UUID and ctransid of the send root, for CLONE.
    uuid: [u8; 16],
    ctransid: u64,
    cur: Cur,
    send_progress: u64,
    new_refs: Vec<NewRef>,
    created_dirs: HashSet<u64>,
    /// LRU first, MRU last.
    dir_utimes: VecDeque<(u64, u64)>,
    names: HashMap<u64, (u64, Vec<u8>)>,
    clone_index: HashMap<u64, Vec<CloneCand>>,
    stats: SendStats,
}

impl<'a, W: Write> FullSend<'a, W> {
    pub(crate) fn new(
        fs: &'a Filesystem,
        subvol: &Subvolume,
        out: StreamWriter<W>,
        opts: SendOptions,
        progress: &'a dyn Progress,
    ) -> Result<FullSend<'a, W>, SendError> {
        let view = TreeView::new(fs, subvol.id())?;
        let sectorsize = u64::from(fs.volume().superblock().sectorsize);
        let buf = u64::from(stream_format::default_max_command_size(opts.version));
        let root = &subvol.root;
        let uuid = if root.received_uuid.is_nil() {
            root.uuid.0
        } else {
            root.received_uuid.0
        };
        Ok(FullSend {
            fs,
            view,
            out,
            opts,
            progress,
            sectorsize,
            // max_send_read_size: the send buffer less 16 KiB.
            max_read: buf.saturating_sub(16 * 1024),
            uuid,
            ctransid: root.ctransid.get(),
            cur: Cur::default(),
            send_progress: 0,
            new_refs: Vec::new(),
            created_dirs: HashSet::new(),
            dir_utimes: VecDeque::new(),
            names: HashMap::new(),
            clone_index: HashMap::new(),
            stats: SendStats::default(),
        })
    }

    fn emit(&mut self, cmd: &Command<'_>) -> Result<(), SendError> {
        self.out.write(cmd)?;
        Ok(())
    }

    /// Run the whole send: SUBVOL, every inode, the deferred directory
    /// utimes, END.
    pub(crate) fn run(mut self, name: &[u8]) -> Result<(W, SendStats), SendError> {
        let uuid = self.uuid;
        let ctransid = self.ctransid;
        self.emit(&Command::Subvol {
            path: name.into(),
            uuid,
            ctransid,
        })?;
        let mut cursor = self.view.cursor();
        cursor.seek(&Key::new(FIRST_FREE, ondisk::BTRFS_INODE_ITEM_KEY, 0))?;
        while let Some(item) = cursor.current() {
            self.changed(&item).map_err(|e| self.locate(e))?;
            if !cursor.advance().map_err(|e| self.locate(e.into()))? {
                break;
            }
        }
        self.finish_inode_if_needed(None)
            .map_err(|e| self.locate(e))?;
        // Flush the directory utimes cache, most recently used first.
        while let Some((ino, generation)) = self.dir_utimes.pop_back() {
            self.send_utimes(ino, generation)?;
        }
        // END: written by `finish`, which also flushes.
        let before = self.out.bytes_written();
        let w = self.out.finish()?;
        self.stats.stream_bytes = before.saturating_add(10);
        Ok((w, self.stats))
    }

    /// Add the current inode (and its path when cheap) to a read error.
    fn locate(&mut self, e: SendError) -> SendError {
        match e {
            SendError::Fs {
                ino: 0,
                path: None,
                source,
            } => {
                let ino = self.cur.ino;
                let path = self.cur.path.clone();
                SendError::Fs { ino, path, source }
            }
            SendError::Fs {
                ino,
                path: None,
                source,
            } if ino == self.cur.ino => SendError::Fs {
                ino,
                path: self.cur.path.clone(),
                source,
            },
            e => e,
        }
    }

    /// `changed_cb` for a NEW item.
    fn changed(&mut self, item: &ItemRef<'_>) -> Result<(), SendError> {
        let key = item.key;
        self.finish_inode_if_needed(Some(key))?;
        if key.objectid == ondisk::BTRFS_FREE_INO_OBJECTID
            || key.objectid == ondisk::BTRFS_FREE_SPACE_OBJECTID
        {
            return Ok(());
        }
        if key.item_type == ondisk::BTRFS_INODE_ITEM_KEY {
            return self.changed_inode(item);
        }
        if self.cur.ignore {
            return Ok(());
        }
        match key.item_type {
            ondisk::BTRFS_INODE_REF_KEY | ondisk::BTRFS_INODE_EXTREF_KEY => {
                if key.objectid != self.cur.ino {
                    return Err(SendError::corrupt(
                        key.objectid,
                        "inconsistent snapshot: reference without an inode item",
                    ));
                }
                if self.cur.ino != FIRST_FREE {
                    for (dir, name) in view::parse_refs(item)? {
                        self.record_new_ref(dir, &name)?;
                    }
                }
            }
            ondisk::BTRFS_XATTR_ITEM_KEY => {
                if key.objectid != self.cur.ino {
                    return Err(SendError::corrupt(
                        key.objectid,
                        "inconsistent snapshot: xattr without an inode item",
                    ));
                }
                for e in view::parse_dir_items(item)? {
                    self.process_new_xattr(e.name, e.data)?;
                }
            }
            ondisk::BTRFS_EXTENT_DATA_KEY if key.objectid == self.cur.ino => {
                let ext = view::parse_file_extent(item)?;
                self.process_extent(ext)?;
            }
            ondisk::BTRFS_VERITY_DESC_ITEM_KEY if key.offset == 0 && self.opts.version >= 3 => {
                return Err(SendError::corrupt(
                    key.objectid,
                    "fs-verity files cannot be sent with protocol 3 yet",
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// `changed_inode` for a new inode.
    fn changed_inode(&mut self, item: &ItemRef<'_>) -> Result<(), SendError> {
        let ino = item.key.objectid;
        self.cur = Cur {
            ino,
            ..Cur::default()
        };
        self.send_progress = ino;
        let info = view::parse_inode(item)?;
        if info.nlink == 0 {
            // An orphan inode (deleted while open): the kernel ignores it.
            self.cur.ignore = true;
            return Ok(());
        }
        self.cur.generation = info.generation;
        self.cur.size = info.size;
        self.cur.mode = info.mode;
        self.stats.inodes = self.stats.inodes.saturating_add(1);
        self.progress.inode(ino);
        if ino != FIRST_FREE {
            // send_create_inode_if_needed
            if info.is_dir() && self.created_dirs.remove(&ino) {
                return Ok(());
            }
            self.send_create_inode(ino, &info)?;
        }
        Ok(())
    }

    fn inode(&self, ino: u64) -> Result<InodeInfo, SendError> {
        self.view
            .inode(ino)?
            .ok_or_else(|| SendError::corrupt(ino, "missing inode item"))
    }

    /// `gen_unique_name`: the orphan name, unique in the root directory.
    fn orphan_name(&self, ino: u64, generation: u64) -> Result<Vec<u8>, SendError> {
        let mut idx = 0u64;
        loop {
            let name = format!("o{ino}-{generation}-{idx}").into_bytes();
            if self.view.lookup_dir_item(FIRST_FREE, &name)?.is_none() {
                return Ok(name);
            }
            idx = idx.saturating_add(1);
        }
    }

    /// `send_create_inode`: create `ino` at its orphan name.
    fn send_create_inode(&mut self, ino: u64, info: &InodeInfo) -> Result<(), SendError> {
        let path = self.orphan_name(ino, info.generation)?;
        let mode = u64::from(info.mode);
        let rdev = u64::from(new_encode_dev(info.rdev));
        let cmd = match info.mode & S_IFMT {
            S_IFREG => Command::Mkfile {
                path: path.into(),
                ino,
            },
            S_IFDIR => Command::Mkdir {
                path: path.into(),
                ino,
            },
            S_IFLNK => {
                let target = self.read_symlink(ino)?;
                Command::Symlink {
                    path: path.into(),
                    ino,
                    path_link: target.into(),
                }
            }
            S_IFCHR | S_IFBLK => Command::Mknod {
                path: path.into(),
                ino,
                rdev,
                mode,
            },
            S_IFIFO => Command::Mkfifo {
                path: path.into(),
                ino,
                rdev: Some(rdev),
                mode: Some(mode),
            },
            S_IFSOCK => Command::Mksock {
                path: path.into(),
                ino,
                rdev: Some(rdev),
                mode: Some(mode),
            },
            _ => {
                return Err(SendError::corrupt(
                    ino,
                    format!("unsupported file type in mode 0{:o}", info.mode),
                ));
            }
        };
        self.emit(&cmd)
    }

    /// `read_symlink`: the target is the inline extent at offset 0.
    fn read_symlink(&self, ino: u64) -> Result<Vec<u8>, SendError> {
        let mut it = self.view.extents_from_iter(ino, 0)?;
        let ext = it
            .next_extent()?
            .filter(|e| e.file_offset == 0)
            .ok_or_else(|| SendError::corrupt(ino, "empty symlink inode"))?;
        match ext.kind {
            ExtentKind::Inline(data) if ext.compression == ondisk::BTRFS_COMPRESS_NONE => {
                let n = usize::try_from(ext.ram_bytes).unwrap_or(usize::MAX);
                data.get(..n)
                    .map(<[u8]>::to_vec)
                    .ok_or_else(|| SendError::corrupt(ino, "symlink target shorter than ram_bytes"))
            }
            _ => Err(SendError::corrupt(
                ino,
                "symlink extent is not inline and uncompressed",
            )),
        }
    }

    /// The first reference of an inode, cached for processed inodes (whose
    /// names no longer change in a full send).
    fn first_ref(&mut self, ino: u64) -> Result<(u64, Vec<u8>), SendError> {
        if let Some(r) = self.names.get(&ino) {
            return Ok(r.clone());
        }
        let r = self
            .view
            .first_ref(ino)?
            .ok_or_else(|| SendError::corrupt(ino, "inode has no reference"))?;
        if self.names.len() >= NAME_CACHE_MAX {
            self.names.clear();
        }
        self.names.insert(ino, r.clone());
        Ok(r)
    }

    /// `get_cur_path`: where `ino` is on the receiver right now.
    fn cur_path(&mut self, ino: u64, generation: u64) -> Result<Vec<u8>, SendError> {
        if ino == self.cur.ino
            && let Some(p) = &self.cur.path
        {
            return Ok(p.clone());
        }
        let mut parts: Vec<Vec<u8>> = Vec::new();
        let (mut ino, mut generation) = (ino, Some(generation));
        while ino != FIRST_FREE {
            if ino >= self.send_progress {
                // Not created yet, or created early: at its orphan name.
                let g = match generation {
                    Some(g) => g,
                    None => self.inode(ino)?.generation,
                };
                parts.push(self.orphan_name(ino, g)?);
                break;
            }
            let (parent, name) = self.first_ref(ino)?;
            parts.push(name);
            ino = parent;
            generation = None;
        }
        let mut out = Vec::new();
        for p in parts.iter().rev() {
            if !out.is_empty() {
                out.push(b'/');
            }
            out.extend_from_slice(p);
        }
        Ok(out)
    }

    fn cur_inode_path(&mut self) -> Result<Vec<u8>, SendError> {
        if let Some(p) = &self.cur.path {
            return Ok(p.clone());
        }
        let p = self.cur_path(self.cur.ino, self.cur.generation)?;
        self.cur.path = Some(p.clone());
        Ok(p)
    }

    /// `record_new_ref_if_needed`.
    fn record_new_ref(&mut self, dir: u64, name: &[u8]) -> Result<(), SendError> {
        let dir_gen = self.inode(dir)?.generation;
        let mut full_path = self.cur_path(dir, dir_gen)?;
        if !full_path.is_empty() {
            full_path.push(b'/');
        }
        full_path.extend_from_slice(name);
        self.new_refs.push(NewRef {
            dir,
            dir_gen,
            full_path,
        });
        Ok(())
    }

    /// `process_recorded_refs` for a new inode.
    fn process_recorded_refs(&mut self) -> Result<(), SendError> {
        let refs = std::mem::take(&mut self.new_refs);
        let is_dir = self.cur.mode & S_IFMT == S_IFDIR;
        let mut valid_path = self.orphan_name(self.cur.ino, self.cur.generation)?;
        let mut is_orphan = true;
        let mut check_dirs: Vec<(u64, u64)> = Vec::new();
        for (i, r) in refs.iter().enumerate() {
            // A parent with a higher number than ours does not exist yet:
            // create it now at its orphan name.
            let will_create = r.dir != FIRST_FREE && r.dir >= self.send_progress;
            if will_create
                && !refs.iter().take(i).any(|o| o.dir == r.dir)
                && !self.created_dirs.contains(&r.dir)
            {
                let info = self.inode(r.dir)?;
                self.send_create_inode(r.dir, &info)?;
                self.created_dirs.insert(r.dir);
            }
            if is_orphan || is_dir {
                self.emit(&Command::Rename {
                    path: valid_path.as_slice().into(),
                    path_to: r.full_path.as_slice().into(),
                })?;
                self.cur.path = Some(r.full_path.clone());
                valid_path.clone_from(&r.full_path);
                is_orphan = false;
            } else {
                self.emit(&Command::Link {
                    path: r.full_path.as_slice().into(),
                    path_link: valid_path.as_slice().into(),
                })?;
            }
            if !check_dirs.contains(&(r.dir, r.dir_gen)) {
                check_dirs.push((r.dir, r.dir_gen));
            }
        }
        if !is_dir && is_orphan {
            self.emit(&Command::Unlink {
                path: valid_path.as_slice().into(),
            })?;
        }
        for (dir, generation) in check_dirs {
            // Parents not processed yet get their utimes when they are.
            if dir > self.cur.ino {
                continue;
            }
            self.cache_dir_utimes(dir, generation);
        }
        Ok(())
    }

    /// `cache_dir_utimes`: mark (or re-mark) a directory as most recently used.
    fn cache_dir_utimes(&mut self, ino: u64, generation: u64) {
        if let Some(pos) = self.dir_utimes.iter().position(|e| *e == (ino, generation)) {
            self.dir_utimes.remove(pos);
        }
        self.dir_utimes.push_back((ino, generation));
    }

    fn trim_dir_utimes_cache(&mut self) -> Result<(), SendError> {
        while self.dir_utimes.len() > DIR_UTIMES_CACHE_SIZE {
            let Some((ino, generation)) = self.dir_utimes.pop_front() else {
                break;
            };
            self.send_utimes(ino, generation)?;
        }
        Ok(())
    }

    fn send_utimes(&mut self, ino: u64, generation: u64) -> Result<(), SendError> {
        let info = self.inode(ino)?;
        let path = self.cur_path(ino, generation)?;
        let otime = (self.opts.version >= 2).then_some(info.otime);
        self.emit(&Command::Utimes {
            path: path.into(),
            atime: info.atime,
            mtime: info.mtime,
            ctime: info.ctime,
            otime,
        })
    }

    /// `finish_inode_if_needed`; `key` is the next item's key, `None` at
    /// the end of the tree.
    fn finish_inode_if_needed(&mut self, key: Option<Key>) -> Result<(), SendError> {
        if self.cur.ignore {
            return Ok(());
        }
        let ino = self.cur.ino;
        let still_in_refs =
            key.is_some_and(|k| k.objectid == ino && k.item_type <= ondisk::BTRFS_INODE_EXTREF_KEY);
        if ino != 0 && !still_in_refs && !self.new_refs.is_empty() {
            self.process_recorded_refs()?;
            self.send_progress = ino.saturating_add(1);
        }
        let inode_done = ino != 0 && key.is_none_or(|k| k.objectid != ino);
        if inode_done {
            self.finish_inode()?;
        }
        self.trim_dir_utimes_cache()
    }

    /// The attribute commands at the end of an inode.
    fn finish_inode(&mut self) -> Result<(), SendError> {
        let info = self.inode(self.cur.ino)?;
        let is_lnk = self.cur.mode & S_IFMT == S_IFLNK;
        let path = self.cur_inode_path()?;
        if self.cur.mode & S_IFMT == S_IFREG && self.cur.next_write_offset != self.cur.size {
            self.emit(&Command::Truncate {
                path: path.as_slice().into(),
                size: self.cur.size,
            })?;
        }
        self.emit(&Command::Chown {
            path: path.as_slice().into(),
            uid: u64::from(info.uid),
            gid: u64::from(info.gid),
        })?;
        if !is_lnk {
            self.emit(&Command::Chmod {
                path: path.as_slice().into(),
                mode: u64::from(info.mode & 0o7777),
            })?;
        }
        if let Some(caps) = self.view.xattr(self.cur.ino, XATTR_NAME_CAPS)? {
            self.emit(&Command::SetXattr {
                path: path.as_slice().into(),
                name: XATTR_NAME_CAPS.into(),
                data: caps.into(),
            })?;
        }
        self.send_progress = self.cur.ino.saturating_add(1);
        if self.cur.mode & S_IFMT == S_IFDIR && self.cur.size > 0 {
            self.cache_dir_utimes(self.cur.ino, self.cur.generation);
        } else {
            self.send_utimes(self.cur.ino, self.cur.generation)?;
        }
        Ok(())
    }

    /// `__process_new_xattr`.
    fn process_new_xattr(&mut self, name: &[u8], data: &[u8]) -> Result<(), SendError> {
        // The kernel compares only `name_len` bytes: any prefix of the
        // capability name is left for the end of the inode too.
        if XATTR_NAME_CAPS.starts_with(name) {
            return Ok(());
        }
        // Empty ACLs are stored as empty values; receivers reject those, so
        // the kernel sends an ACL header without entries (version 2).
        let acl_header = [2u8, 0, 0, 0];
        let data = if data.is_empty()
            && (XATTR_ACL_ACCESS.starts_with(name) || XATTR_ACL_DEFAULT.starts_with(name))
        {
            &acl_header[..]
        } else {
            data
        };
        let path = self.cur_inode_path()?;
        self.emit(&Command::SetXattr {
            path: path.into(),
            name: name.into(),
            data: data.into(),
        })
    }

    /// `process_extent` for a new inode.
    fn process_extent(&mut self, ext: FileExtent) -> Result<(), SendError> {
        if self.cur.mode & S_IFMT == S_IFLNK {
            return Ok(());
        }
        let skip = matches!(
            ext.kind,
            ExtentKind::Regular { prealloc: true, .. } | ExtentKind::Regular { disk_bytenr: 0, .. }
        );
        if !skip {
            let clone = self.find_extent_clone(&ext)?;
            self.send_write_or_clone(&ext, clone)?;
        }
        if let ExtentKind::Regular {
            disk_bytenr,
            offset,
            num_bytes,
            ..
        } = ext.kind
            && disk_bytenr != 0
        {
            self.clone_index
                .entry(disk_bytenr)
                .or_default()
                .push(CloneCand {
                    leaf: ext.leaf,
                    ino: ext.ino,
                    file_offset: ext.file_offset,
                    extent_offset: offset,
                    num_bytes,
                });
        }
        Ok(())
    }

    /// `find_extent_clone`, with the send root as the only clone root.
    fn find_extent_clone(&mut self, ext: &FileExtent) -> Result<Option<CloneSrc>, SendError> {
        let data_offset = ext.file_offset;
        let ino_size = self.cur.size;
        if data_offset >= ino_size {
            return Ok(None);
        }
        let ExtentKind::Regular {
            disk_bytenr,
            offset: ext_off,
            num_bytes,
            ..
        } = ext.kind
        else {
            return Ok(None);
        };
        if disk_bytenr == 0 {
            return Ok(None);
        }
        if !self.clone_index.contains_key(&disk_bytenr) {
            return Ok(None);
        }
        // check_extent_item: one reference is our own; the kernel gives up
        // on heavily shared extents.
        let Some(refs) = self.view.extent_refs(disk_bytenr)? else {
            return Ok(None);
        };
        if refs.refs <= 1 || refs.refs > SEND_MAX_EXTENT_REFS {
            return Ok(None);
        }
        let cands = self
            .clone_index
            .get(&disk_bytenr)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let extent_len = if data_offset.saturating_add(num_bytes) >= ino_size {
            ino_size - data_offset
        } else {
            num_bytes
        };
        let compressed = ext.compression != ondisk::BTRFS_COMPRESS_NONE;
        let mut best: Option<(CloneSrc, u64)> = None;
        for c in backref_order(cands, &refs.shared) {
            let offset = if compressed {
                c.file_offset
            } else {
                // Only references covering the same position in the extent.
                if ext_off < c.extent_offset
                    || ext_off >= c.extent_offset.saturating_add(c.num_bytes)
                {
                    continue;
                }
                c.file_offset.saturating_add(ext_off - c.extent_offset)
            };
            if c.ino == self.cur.ino
                && (offset == data_offset
                    || offset.saturating_add(extent_len) > self.cur.next_write_offset)
            {
                continue;
            }
            if best.is_none_or(|(_, n)| c.num_bytes > n) {
                best = Some((CloneSrc { ino: c.ino, offset }, c.num_bytes));
                if c.num_bytes >= extent_len {
                    break;
                }
            }
        }
        Ok(best.map(|(src, _)| src))
    }

    /// `send_write_or_clone`.
    fn send_write_or_clone(
        &mut self,
        ext: &FileExtent,
        clone: Option<CloneSrc>,
    ) -> Result<(), SendError> {
        let offset = ext.file_offset;
        let end = ext.end(self.sectorsize).min(self.cur.size);
        if offset >= end {
            return Ok(());
        }
        let num_bytes = end - offset;
        let use_clone = match clone {
            None => None,
            Some(c) if end.is_multiple_of(self.sectorsize) => Some(c),
            // An unaligned end can only be cloned up to both files' EOF.
            Some(c) if end == self.cur.size => {
                let src_size = self.inode(c.ino)?.size;
                (c.offset.saturating_add(num_bytes) == src_size).then_some(c)
            }
            Some(_) => None,
        };
        match use_clone {
            Some(c) => self.clone_range(ext, c, offset, num_bytes)?,
            None => self.send_extent_data(ext, offset, num_bytes)?,
        }
        self.cur.next_write_offset = end;
        Ok(())
    }

    /// `clone_range`: clone what the source shares with us, write the rest.
    fn clone_range(
        &mut self,
        ext: &FileExtent,
        mut src: CloneSrc,
        mut offset: u64,
        mut len: u64,
    ) -> Result<(), SendError> {
        let disk_byte = ext.disk_bytenr();
        let mut data_offset = ext.extent_offset();
        if src.offset == 0 && len == self.sectorsize {
            return self.send_extent_data(ext, offset, len);
        }
        let src_size = self.inode(src.ino)?.size;
        let view = self.view;
        let mut it = view.extents_from_iter(src.ino, src.offset)?;
        while let Some(se) = it.next_extent()? {
            let mut ext_len = match se.kind {
                ExtentKind::Inline(_) => se.ram_bytes.div_ceil(4096).saturating_mul(4096),
                ExtentKind::Regular { num_bytes, .. } => num_bytes,
            };
            let key_offset = se.file_offset;
            if key_offset.saturating_add(ext_len) <= src.offset {
                continue;
            }
            if key_offset > src.offset {
                // An implicit hole in the source (no-holes): write ours.
                let hole_len = (key_offset - src.offset).min(len);
                self.send_extent_data(ext, offset, hole_len)?;
                len -= hole_len;
                if len == 0 {
                    break;
                }
                offset += hole_len;
                src.offset += hole_len;
                data_offset += hole_len;
            }
            if key_offset >= src.offset.saturating_add(len) || key_offset >= src_size {
                break;
            }
            let mut crossed_src_i_size = false;
            if key_offset.saturating_add(ext_len) > src_size {
                ext_len = src_size - key_offset;
                crossed_src_i_size = true;
            }
            let mut clone_data_offset = se.extent_offset();
            let same_extent =
                se.disk_bytenr() == disk_byte && matches!(se.kind, ExtentKind::Regular { .. });
            if same_extent {
                src.offset = key_offset;
                if clone_data_offset < data_offset
                    && clone_data_offset.saturating_add(ext_len) > data_offset
                {
                    let extent_offset = data_offset - clone_data_offset;
                    ext_len -= extent_offset;
                    clone_data_offset += extent_offset;
                    src.offset += extent_offset;
                }
            }
            let clone_len = ext_len.min(len);
            if same_extent && clone_data_offset == data_offset {
                let src_end = src.offset.saturating_add(clone_len);
                // The receiver cannot clone an unaligned EOF block into the
                // middle of a file; 64 KiB is the largest sector size.
                const ALIGN: u64 = 64 * 1024;
                if src_end == src_size
                    && !src_end.is_multiple_of(ALIGN)
                    && offset.saturating_add(clone_len) < self.cur.size
                {
                    let slen = (src_end - src.offset) / ALIGN * ALIGN;
                    if slen > 0 {
                        self.send_clone(offset, slen, src)?;
                    }
                    self.send_extent_data(ext, offset + slen, clone_len - slen)?;
                } else {
                    self.send_clone(offset, clone_len, src)?;
                }
            } else if crossed_src_i_size && clone_len < len {
                break;
            } else {
                self.send_extent_data(ext, offset, clone_len)?;
            }
            len -= clone_len;
            if len == 0 {
                break;
            }
            offset += clone_len;
            src.offset += clone_len;
            if src.ino == self.cur.ino && src.offset >= self.cur.next_write_offset {
                break;
            }
            data_offset += clone_len;
        }
        if len > 0 {
            self.send_extent_data(ext, offset, len)?;
        }
        Ok(())
    }

    fn send_clone(&mut self, offset: u64, len: u64, src: CloneSrc) -> Result<(), SendError> {
        let path = self.cur_inode_path()?;
        let src_gen = self.inode(src.ino)?.generation;
        let clone_path = self.cur_path(src.ino, src_gen)?;
        self.stats.cloned_bytes = self.stats.cloned_bytes.saturating_add(len);
        self.emit(&Command::Clone {
            offset,
            len,
            path: path.into(),
            clone_uuid: self.uuid,
            clone_ctransid: self.ctransid,
            clone_path: clone_path.into(),
            clone_offset: src.offset,
        })
    }

    /// `send_extent_data`: UPDATE_EXTENT, ENCODED_WRITE or WRITEs of
    /// `[offset, offset + len)`, which lies inside `ext`.
    fn send_extent_data(
        &mut self,
        ext: &FileExtent,
        offset: u64,
        len: u64,
    ) -> Result<(), SendError> {
        let path = self.cur_inode_path()?;
        if self.opts.no_data {
            return self.emit(&Command::UpdateExtent {
                path: path.into(),
                offset,
                size: len,
            });
        }
        if self.opts.compressed_data && ext.compression != ondisk::BTRFS_COMPRESS_NONE {
            let fits = match &ext.kind {
                ExtentKind::Inline(data) => u64::try_from(data.len()).unwrap_or(u64::MAX) <= len,
                ExtentKind::Regular { disk_num_bytes, .. } => *disk_num_bytes <= len,
            };
            if fits {
                return self.send_encoded(ext, &path, offset, len);
            }
        }
        let mut reader = ExtentReader::new(self.fs, ext, self.fs.volume().superblock().sectorsize);
        let mut sent = 0u64;
        while sent < len {
            let size = (len - sent).min(self.max_read);
            let data = reader.read(offset + sent, size)?;
            self.emit(&Command::Write {
                path: path.as_slice().into(),
                offset: offset + sent,
                data: data.into(),
            })?;
            self.progress.data(size);
            self.stats.data_bytes = self.stats.data_bytes.saturating_add(size);
            sent += size;
        }
        Ok(())
    }

    /// `send_encoded_inline_extent` / `send_encoded_extent`.
    fn send_encoded(
        &mut self,
        ext: &FileExtent,
        path: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<(), SendError> {
        let compression =
            data::encoded_compression(ext.compression, self.fs.volume().superblock().sectorsize)
                .ok_or_else(|| SendError::corrupt(ext.ino, "unknown compression type"))?;
        let bytes = data::encoded_bytes(self.fs, ext)?;
        let n = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        let cmd = match &ext.kind {
            ExtentKind::Inline(_) => Command::EncodedWrite {
                path: path.into(),
                offset,
                unencoded_file_len: (ext.file_offset + ext.ram_bytes - offset).min(len),
                unencoded_len: ext.ram_bytes,
                unencoded_offset: offset - ext.file_offset,
                compression: Some(compression),
                encryption: None,
                data: bytes.into(),
            },
            ExtentKind::Regular {
                offset: eoff,
                num_bytes,
                ..
            } => Command::EncodedWrite {
                path: path.into(),
                offset,
                unencoded_file_len: (ext.file_offset + num_bytes - offset).min(len),
                unencoded_len: ext.ram_bytes,
                unencoded_offset: offset - ext.file_offset + eoff,
                compression: Some(compression),
                encryption: Some(0),
                data: bytes.into(),
            },
        };
        self.emit(&cmd)?;
        self.progress.data(len);
        self.stats.encoded_bytes = self.stats.encoded_bytes.saturating_add(n);
        Ok(())
    }
}

/// The candidates in the order the kernel's backref walk
/// (`iterate_extent_inodes`, fs/btrfs/backref.c) reports them on Linux
/// 6.18, as the fixtures show: the preliminary references come out of its
/// rb-tree in *descending* (inode, key offset − extent offset) order, the
/// items of one reference in slot order; shared (full) backrefs, whose root
/// id is 0, come after them, by descending leaf address, each leaf's items
/// in reverse slot order (a leaf scan that prepends); the lists of one leaf
/// are concatenated at the leaf's first position.
fn backref_order(cands: &[CloneCand], shared: &[u64]) -> Vec<CloneCand> {
    let is_shared = |c: &CloneCand| shared.binary_search(&c.leaf).is_ok();
    let mut indirect: Vec<CloneCand> = cands.iter().copied().filter(|c| !is_shared(c)).collect();
    indirect.sort_by(|a, b| {
        let ka = (a.ino, a.file_offset.wrapping_sub(a.extent_offset));
        let kb = (b.ino, b.file_offset.wrapping_sub(b.extent_offset));
        kb.cmp(&ka)
            .then(b.leaf.cmp(&a.leaf))
            .then(a.file_offset.cmp(&b.file_offset))
    });
    let mut direct: Vec<CloneCand> = cands.iter().copied().filter(is_shared).collect();
    direct.sort_by(|a, b| {
        b.leaf
            .cmp(&a.leaf)
            .then((b.ino, b.file_offset).cmp(&(a.ino, a.file_offset)))
    });
    let mut groups: Vec<(u64, Vec<CloneCand>)> = Vec::new();
    for c in indirect.into_iter().chain(direct) {
        match groups.iter_mut().find(|(leaf, _)| *leaf == c.leaf) {
            Some((_, list)) => list.push(c),
            None => groups.push((c.leaf, vec![c])),
        }
    }
    groups.into_iter().flat_map(|(_, list)| list).collect()
}

/// Linux `new_encode_dev` of the kernel-internal `dev_t` stored in the
/// inode item (major in bits 20.., minor in bits 0..20).
fn new_encode_dev(rdev: u64) -> u32 {
    // The kernel's dev_t is 32 bits; the on-disk u64 is truncated to it.
    let dev = u32::try_from(rdev & 0xffff_ffff).unwrap_or(0);
    let major = dev >> 20;
    let minor = dev & 0xfffff;
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

#[cfg(test)]
mod tests {
    use super::new_encode_dev;

    #[test]
    fn rdev_encoding_matches_the_kernel() {
        // Observed: mknod c 1 7 -> on-disk 0x100007 -> stream 0x107;
        // b 7 200 -> 0x7000c8 -> 0x7c8.
        assert_eq!(new_encode_dev(0x10_0007), 0x107);
        assert_eq!(new_encode_dev(0x70_00c8), 0x7c8);
        assert_eq!(new_encode_dev(0), 0);
    }
}
