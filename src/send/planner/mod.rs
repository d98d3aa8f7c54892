//! The send planner, full and incremental: walks every item of the
//! snapshot's tree in key order (full send), or the items that differ from
//! the parent snapshot's (`compare`, incremental send), and emits
//! the commands the kernel's `btrfs send` emits, in the same order
//! (the kernel functions named here are in Linux `fs/btrfs/send.c`).
//!
//! The structure follows the kernel's event loop so that the order of
//! commands is the same by construction: every item goes through
//! `finish_inode_if_needed` first (which processes the current
//! inode's references once its ref items are over, and finishes the inode
//! when the key moves to another inode), then to the handler of its type.
//!
//! Incremental sends add: new, deleted, changed and new-generation inodes
//! (`changed_inode`), deleted references and their cancellation against new
//! ones, paths resolved from the parent for inodes not processed yet,
//! overwrite checks with orphanization (`will_overwrite_ref`,
//! `did_overwrite_ref`), `can_rmdir` with orphaned directories, xattr
//! removal, attribute commands only for what changed (FILEATTR in v2),
//! unchanged extents skipped (`is_extent_unchanged`), holes (`send_hole`:
//! v1 zero writes, v2 punch), truncation of existing files, and delayed
//! directory moves as the kernel orders them: `wait_for_dest_dir_move`,
//! `wait_for_parent_move`, `apply_children_dir_moves` with the `path_loop`
//! re-queueing, and deleted directories that wait for a delayed move of a
//! child before their rmdir (`can_rmdir` with `orphan_dir_info`). Paths
//! are computed afresh where the kernel consults its 128-entry name cache.
//!
//! Clone sources: the send root, the parent and the `-c` roots (sorted by
//! id, as the kernel keeps `clone_roots`); `find_extent_clone` walks the
//! extent's back references in the kernel's order (`backref`) and picks
//! the reference `iterate_backrefs` would, with the kernel's send backref
//! cache (an LRU of leaves whose items reach the iterator early, which
//! decides among several whole-extent candidates). Not modelled: the
//! cache entries the kernel makes while walking an extent this send has
//! not written yet with only the send root as clone root (no candidate
//! can come of that walk, so the planner skips it; only the cache's
//! evictions could differ).
//!
//! Full and incremental sends are one planner, as in the kernel: a full
//! send is an incremental send in which every item is new. What both share:
//!
//! * `send_progress`: inodes below it have their final names on the
//!   receiver; every other inode is at its orphan name `o<ino>-<generation>-<idx>`
//!   (or does not exist yet);
//! * directories with a higher number than a child are created early at
//!   their orphan name (`did_create_dir`);
//! * the directory-utimes LRU cache of Linux ≥ 6.3 (64 entries, trimmed
//!   after every `finish_inode_if_needed`, flushed most recently used first);
//! * file data: writes in `max_send_read_size` chunks, encoded writes, and
//!   clones of extents shared with the clone roots (`find_extent_clone`,
//!   `clone_range`).
//!
//! The rooms, one concern each (all are `impl Planner` blocks over the
//! state declared here and in `state`):
//!
//! | file | what |
//! | --- | --- |
//! | `mod.rs` | the planner, the event loop (`changed_cb`), changed inodes (`changed_inode`), finishing an inode (`finish_inode_if_needed`: refs, holes, truncate, chown, chmod, fileattr, capabilities, utimes) |
//! | `state` | the state types: the current inode, recorded refs, delayed moves, orphan directories, clone roots, statistics |
//! | `paths` | receiver-side paths now (`get_cur_path`), inode state, first refs, orphan names, overwrite checks |
//! | `create` | creating inodes at their orphan names |
//! | `refs` | recording refs and processing them: rename, link, unlink, orphanize, rmdir |
//! | `moves` | delayed directory moves |
//! | `attrs` | xattrs and the directory-utimes cache |
//! | `extents` | which extents are sent, unchanged extents, holes |
//! | `clone` | finding clone sources and emitting CLONE |
//! | `write` | WRITE, ENCODED_WRITE, UPDATE_EXTENT |

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;

use stream_format::Command;

use crate::fs::subvol::Subvolume;
use crate::fs::{FileExtent, FileType, Filesystem, Inode};
use crate::ondisk;
use crate::tree::key::Key;
use crate::tree::walk::ItemRef;

use super::backref::{Backrefs, KernelCache};
use super::compare::{Change, compare_trees};
use super::error::SendError;
use super::extent_tree::ExtentTreeReader;
use super::pipeline::Pipeline;
use super::view::{self, TreeView};
use super::{Progress, SendOptions};

mod attrs;
mod clone;
mod create;
mod extents;
mod moves;
mod paths;
mod refs;
mod state;
mod write;

use attrs::XATTR_NAME_CAPS;
use clone::SEND_MAX_EXTENT_REFS;
pub use state::SendStats;
use state::{CloneRoot, Cur, NewRef, OrphanDir, PendingMove, WaitingMove};

const FIRST_FREE: u64 = ondisk::BTRFS_FIRST_FREE_OBJECTID;

pub(crate) struct Planner<'a, W: Write> {
    fs: &'a Filesystem,
    view: TreeView<'a>,
    /// The parent snapshot of an incremental send.
    parent: Option<TreeView<'a>>,
    /// Its UUID (received_uuid preferred) and ctransid.
    parent_uuid: [u8; 16],
    parent_ctransid: u64,
    out: Pipeline<'a, W>,
    /// The data commands made for the current extent, while a mounted
    /// send records them (see [`Planner::extent_data`]).
    recording: Option<Vec<crate::send::pipeline::DataOp>>,
    opts: SendOptions,
    progress: &'a dyn Progress,
    sectorsize: u32,
    /// UUID and ctransid of the send root, for CLONE.
    uuid: [u8; 16],
    ctransid: u64,
    cur: Cur,
    send_progress: u64,
    new_refs: Vec<NewRef>,
    deleted_refs: Vec<NewRef>,
    /// Deleted directories not removed yet (at their orphan names), by
    /// (inode, generation).
    orphan_dirs: HashMap<(u64, u64), OrphanDir>,
    /// Delayed directory moves by the directory they wait for.
    pending_moves: HashMap<u64, Vec<PendingMove>>,
    /// Directories whose move is delayed.
    waiting_moves: HashMap<u64, WaitingMove>,
    created_dirs: HashSet<u64>,
    /// LRU first, MRU last.
    dir_utimes: VecDeque<(u64, u64)>,
    names: HashMap<u64, (u64, Vec<u8>)>,
    /// The clone roots sorted by id (the send root included) and the send
    /// root's index among them.
    clone_roots: Vec<CloneRoot<'a>>,
    send_root: usize,
    backrefs: Backrefs<'a>,
    /// The kernel's send backref cache, which orders the candidates.
    kcache: KernelCache,
    /// The data extents this send already wrote (full send without clone
    /// sources: no other extent can be a clone source); at most
    /// `CLONE_INDEX_MAX` entries, then `None` and the backref walk decides.
    clone_index: Option<HashSet<u64>>,
    stats: SendStats,
}

impl<'a, W: Write> Planner<'a, W> {
    pub(crate) fn new(
        fs: &'a Filesystem,
        subvol: &Subvolume,
        parent: Option<&Subvolume>,
        clone_sources: &[Subvolume],
        out: Pipeline<'a, W>,
        opts: SendOptions,
        progress: &'a dyn Progress,
    ) -> Result<Planner<'a, W>, SendError> {
        let view = TreeView::new(fs, subvol.id())?;
        // The kernel adds the send root to the roots btrfs-progs passes (the
        // parent and every -c root) and sorts them by id.
        let mut clone_roots = vec![CloneRoot::new(fs, subvol)?];
        for s in parent.into_iter().chain(clone_sources) {
            if clone_roots.iter().all(|r| r.id != s.id().get()) {
                clone_roots.push(CloneRoot::new(fs, s)?);
            }
        }
        clone_roots.sort_by_key(|r| r.id);
        let send_root = clone_roots
            .iter()
            .position(|r| r.id == subvol.id().get())
            .unwrap_or(0);
        let (parent_view, parent_uuid, parent_ctransid) = match parent {
            Some(p) => {
                let r = &p.root;
                let u = if r.received_uuid.is_nil() {
                    r.uuid.0
                } else {
                    r.received_uuid.0
                };
                (Some(TreeView::new(fs, p.id())?), u, r.ctransid.get())
            }
            None => (None, [0; 16], 0),
        };
        let sectorsize = fs.volume().superblock().sectorsize;
        let root = &subvol.root;
        let uuid = if root.received_uuid.is_nil() {
            root.uuid.0
        } else {
            root.received_uuid.0
        };
        Ok(Planner {
            fs,
            view,
            parent: parent_view,
            parent_uuid,
            parent_ctransid,
            out,
            recording: None,
            opts,
            progress,
            sectorsize,
            uuid,
            ctransid: root.ctransid.get(),
            cur: Cur::default(),
            send_progress: 0,
            new_refs: Vec::new(),
            deleted_refs: Vec::new(),
            orphan_dirs: HashMap::new(),
            pending_moves: HashMap::new(),
            waiting_moves: HashMap::new(),
            created_dirs: HashSet::new(),
            dir_utimes: VecDeque::new(),
            names: HashMap::new(),
            backrefs: Backrefs::new(fs, ExtentTreeReader::new(fs, SEND_MAX_EXTENT_REFS)?),
            kcache: KernelCache::default(),
            clone_index: (clone_roots.len() == 1).then(HashSet::new),
            clone_roots,
            send_root,
            stats: SendStats::default(),
        })
    }

    fn emit(&mut self, cmd: &Command<'_>) -> Result<(), SendError> {
        self.out.emit(cmd)
    }

    /// Run the whole send: SUBVOL, every inode, the deferred directory
    /// utimes, END. An error of the planner comes after what it queued
    /// before it is written (or the first error among that).
    pub(crate) fn run(mut self, name: &[u8]) -> Result<(W, SendStats), SendError> {
        match self.plan(name) {
            Ok(()) => {
                let done = self.out.finish()?;
                let w = done.out;
                self.stats.stream_bytes = done.len;
                self.stats.commands = done.counts;
                self.stats.extent_tree = self.backrefs.extents.stats();
                Ok((w, self.stats))
            }
            Err(e) => Err(self.out.drain().err().unwrap_or(e)),
        }
    }

    /// Every command but END.
    fn plan(&mut self, name: &[u8]) -> Result<(), SendError> {
        let uuid = self.uuid;
        let ctransid = self.ctransid;
        if let Some(parent) = self.parent.clone() {
            self.emit(&Command::Snapshot {
                path: name.into(),
                uuid,
                ctransid,
                clone_uuid: self.parent_uuid,
                clone_ctransid: self.parent_ctransid,
            })?;
            let (left, right) = (self.view.root, parent.root);
            compare_trees(self.fs.volume(), left, right, |change, l, r| {
                self.changed(change, l, r).map_err(|e| self.locate(e))
            })?;
        } else {
            self.emit(&Command::Subvol {
                path: name.into(),
                uuid,
                ctransid,
            })?;
            let mut cursor = self.view.cursor();
            cursor.seek(&Key::new(FIRST_FREE, ondisk::BTRFS_INODE_ITEM_KEY, 0))?;
            while let Some(item) = cursor.current() {
                self.changed(Change::New, Some(&item), None)
                    .map_err(|e| self.locate(e))?;
                if !cursor.advance().map_err(|e| self.locate(e.into()))? {
                    break;
                }
            }
        }
        self.finish_inode_if_needed(None)
            .map_err(|e| self.locate(e))?;
        // Flush the directory utimes cache, most recently used first.
        while let Some((ino, generation)) = self.dir_utimes.pop_back() {
            self.send_utimes(ino, generation)?;
        }
        Ok(())
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

    /// `changed_cb`: one item event (`left`: the snapshot's item, `right`:
    /// the parent's).
    fn changed(
        &mut self,
        mut change: Change,
        left: Option<&ItemRef<'_>>,
        right: Option<&ItemRef<'_>>,
    ) -> Result<(), SendError> {
        let Some(key) = left.or(right).map(|i| i.key) else {
            return Ok(());
        };
        if change == Change::Same {
            match key.item_type {
                ondisk::BTRFS_INODE_REF_KEY | ondisk::BTRFS_INODE_EXTREF_KEY => {
                    if !self.compare_refs(left)? {
                        return Ok(());
                    }
                    change = Change::Changed;
                }
                ondisk::BTRFS_EXTENT_DATA_KEY => {
                    if key.objectid == self.cur.ino
                        && let Some(l) = left
                    {
                        let ext = FileExtent::parse(l)?;
                        return self.maybe_send_hole(&ext, l.slot);
                    }
                    return Ok(());
                }
                _ => return Ok(()),
            }
        }
        self.finish_inode_if_needed(Some(key))?;
        if key.objectid == ondisk::BTRFS_FREE_INO_OBJECTID
            || key.objectid == ondisk::BTRFS_FREE_SPACE_OBJECTID
        {
            return Ok(());
        }
        if key.item_type == ondisk::BTRFS_INODE_ITEM_KEY {
            return self.changed_inode(change, left, right);
        }
        if self.cur.ignore || key.objectid != self.cur.ino {
            return Ok(());
        }
        match key.item_type {
            ondisk::BTRFS_INODE_REF_KEY | ondisk::BTRFS_INODE_EXTREF_KEY => {
                self.changed_ref(change, left, right)?;
            }
            ondisk::BTRFS_XATTR_ITEM_KEY => self.changed_xattr(change, left, right)?,
            ondisk::BTRFS_EXTENT_DATA_KEY => self.changed_extent(change, left)?,
            ondisk::BTRFS_VERITY_DESC_ITEM_KEY if key.offset == 0 && self.opts.version >= 3 => {
                return Err(SendError::Unsupported {
                    ino: key.objectid,
                    what: "fs-verity files cannot be sent with protocol 3 yet",
                });
            }
            _ => {}
        }
        Ok(())
    }

    /// `compare_refs` for a SAME ref item: whether some parent directory
    /// has another generation in the parent snapshot.
    fn compare_refs(&mut self, left: Option<&ItemRef<'_>>) -> Result<bool, SendError> {
        let (Some(l), Some(parent)) = (left, self.parent.clone()) else {
            return Ok(false);
        };
        for (dir, _) in view::parse_refs(l)? {
            let a = self.view.inode(dir)?.map(|i| i.generation);
            let b = parent.inode(dir)?.map(|i| i.generation);
            if a != b {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// `changed_inode`.
    fn changed_inode(
        &mut self,
        change: Change,
        left: Option<&ItemRef<'_>>,
        right: Option<&ItemRef<'_>>,
    ) -> Result<(), SendError> {
        let ino = left.or(right).map_or(0, |i| i.key.objectid);
        self.cur = Cur {
            ino,
            ..Cur::default()
        };
        self.send_progress = ino;
        let linfo = match left.filter(|_| change != Change::Deleted) {
            Some(l) => Some(Inode::parse(l)?),
            None => None,
        };
        let rinfo = match right.filter(|_| change != Change::New) {
            Some(r) => Some(Inode::parse(r)?),
            None => None,
        };
        let set = |cur: &mut Cur, i: &Inode| {
            cur.generation = i.generation.get();
            cur.size = i.size;
            cur.mode = i.mode;
        };
        match (linfo, rinfo) {
            (Some(l), None) => {
                if l.nlink == 0 {
                    // An orphan inode (deleted while open): the kernel ignores it.
                    self.cur.ignore = true;
                    return Ok(());
                }
                set(&mut self.cur, &l);
                self.cur.new = true;
                self.count_inode(ino);
                if ino != FIRST_FREE {
                    self.create_inode_if_needed(ino, &l)?;
                }
            }
            (None, Some(r)) => {
                set(&mut self.cur, &r);
                self.cur.deleted = true;
            }
            (Some(l), Some(r)) => {
                if l.nlink == 0 && r.nlink == 0 {
                    self.cur.ignore = true;
                    return Ok(());
                }
                let new_gen = (l.generation != r.generation && ino != FIRST_FREE)
                    || (l.nlink == 0) != (r.nlink == 0);
                self.count_inode(ino);
                if !new_gen {
                    set(&mut self.cur, &l);
                    return Ok(());
                }
                self.cur.new_gen = true;
                if r.nlink > 0 {
                    set(&mut self.cur, &r);
                    self.cur.deleted = true;
                    self.process_all_refs(false)?;
                }
                if l.nlink > 0 {
                    set(&mut self.cur, &l);
                    self.cur.deleted = false;
                    self.cur.new = true;
                    self.cur.path = None;
                    self.create_inode_if_needed(ino, &l)?;
                    self.process_all_refs(true)?;
                    self.send_progress = ino.saturating_add(1);
                    self.process_all_extents()?;
                    self.process_all_new_xattrs()?;
                } else {
                    self.cur.ignore = true;
                }
            }
            (None, None) => {}
        }
        Ok(())
    }

    fn count_inode(&mut self, ino: u64) {
        self.stats.inodes = self.stats.inodes.saturating_add(1);
        self.progress.inode(ino);
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
        if ino != 0
            && !still_in_refs
            && (!self.new_refs.is_empty() || !self.deleted_refs.is_empty())
        {
            // A delayed rename leaves the inode at its old place: paths
            // keep resolving it from the parent until it moves.
            let pending_move = self.process_recorded_refs()?;
            if !pending_move {
                self.send_progress = ino.saturating_add(1);
            }
        }
        let inode_done = ino != 0 && key.is_none_or(|k| k.objectid != ino);
        if inode_done && !self.cur.deleted {
            self.finish_inode()?;
        }
        self.trim_dir_utimes_cache()
    }

    /// The attribute commands at the end of an inode.
    fn finish_inode(&mut self) -> Result<(), SendError> {
        let info = self.inode(self.cur.ino)?;
        let is_lnk = self.cur.file_type() == FileType::Symlink;
        let old = match self.parent.clone() {
            Some(p) if !self.cur.new => p.inode(self.cur.ino)?,
            _ => None,
        };
        let (need_chown, need_chmod, need_fileattr, mut need_truncate) = match old {
            None => (
                true,
                !is_lnk,
                false,
                self.cur.next_write_offset != self.cur.size,
            ),
            Some(o) => (
                o.uid != info.uid || o.gid != info.gid,
                !is_lnk && o.mode != info.mode,
                !is_lnk && self.opts.version >= 2 && o.flags != info.flags,
                !(o.size == self.cur.size
                    || (self.cur.size > o.size && self.cur.next_write_offset == self.cur.size)),
            ),
        };
        if self.cur.file_type() == FileType::Regular {
            if self.need_send_hole() {
                if self.cur.last_extent.is_none_or(|l| l < self.cur.size) {
                    self.cur.last_extent = Some(self.last_extent_end(u64::MAX)?);
                }
                let last = self.cur.last_extent.unwrap_or(0);
                if last < self.cur.size && !self.range_is_hole_in_parent(last, self.cur.size)? {
                    self.send_hole(self.cur.size)?;
                }
            }
        } else {
            need_truncate = false;
        }
        let path = self.cur_inode_path()?;
        if need_truncate {
            self.emit(&Command::Truncate {
                path: path.as_slice().into(),
                size: self.cur.size,
            })?;
        }
        if need_chown {
            self.emit(&Command::Chown {
                path: path.as_slice().into(),
                uid: u64::from(info.uid),
                gid: u64::from(info.gid),
            })?;
        }
        if need_chmod {
            self.emit(&Command::Chmod {
                path: path.as_slice().into(),
                mode: u64::from(info.mode & 0o7777),
            })?;
        }
        if need_fileattr {
            self.emit(&Command::Fileattr {
                path: path.as_slice().into(),
                attr: info.flags,
            })?;
        }
        if let Some(caps) = self.view.xattr(self.cur.ino, XATTR_NAME_CAPS)? {
            self.emit(&Command::SetXattr {
                path: path.as_slice().into(),
                name: XATTR_NAME_CAPS.into(),
                data: caps.into(),
            })?;
        }
        if self.waiting_moves.contains_key(&self.cur.ino) {
            // Its utimes go with its delayed move.
            return Ok(());
        }
        self.apply_children_dir_moves()?;
        self.send_progress = self.cur.ino.saturating_add(1);
        if self.cur.file_type() == FileType::Dir && self.cur.size > 0 {
            self.cache_dir_utimes(self.cur.ino, self.cur.generation);
        } else {
            self.send_utimes(self.cur.ino, self.cur.generation)?;
        }
        Ok(())
    }
}
