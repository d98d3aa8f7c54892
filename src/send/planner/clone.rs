//! Clones: finding a clone source for an extent among the clone roots as
//! the kernel does (`find_extent_clone`: the back-reference walk and
//! `iterate_backrefs` choice), and emitting CLONE for what the source
//! shares, with writes for the rest (`send_write_or_clone`,
//! `clone_range`).

use std::io::Write;

use stream_format::Command;

use crate::fs::{Compression, ExtentData, FileExtent};
use crate::ondisk;
use crate::send::backref::{Elem, LeafRefs, Walk};
use crate::send::error::SendError;
use crate::send::pipeline::DataOp;
use crate::send::view::TreeView;
use crate::tree::check::BlockExpect;
use crate::tree::key::Key;
use crate::tree::walk::BlockSource;
use crate::types::Logical;
use crate::types::{Generation, TreeId};

use super::Planner;
use super::paths::inode_path;
use super::state::CloneSrc;

/// `SEND_MAX_EXTENT_REFS`: more references than this and no clone is tried.
pub(super) const SEND_MAX_EXTENT_REFS: u64 = 1024;
/// The kernel's `PAGE_SIZE` on the machines whose streams we match (x86-64,
/// arm64 with 4 KiB pages): `clone_range` rounds an inline source extent's
/// `ram_bytes` up to a page (`PAGE_ALIGN`), not to the sector size.
const PAGE_SIZE: u64 = 4096;
/// 64 KiB, the largest sector size btrfs allows: `clone_range` cuts a
/// clone of an unaligned EOF block at a multiple of it.
const MAX_SECTOR_SIZE: u64 = 64 * 1024;

impl<'a, W: Write> Planner<'a, W> {
    /// The data commands of extent `ext` (`find_extent_clone`, then
    /// `send_write_or_clone`), or, continuing a mounted send's stream and
    /// before the point where it stopped, the very commands made for it
    /// when it was written: the clone source chosen follows the order of
    /// back references, and what the source shares the extent addresses,
    /// both of which a relocation may have changed since (see `Trail` in
    /// `src/send/pipeline.rs`).
    pub(super) fn extent_data(&mut self, ext: &FileExtent, leaf: Logical) -> Result<(), SendError> {
        let ino = self.cur.ino;
        if let Some(ops) = self.out.replayed_ops(ino, ext) {
            for op in ops {
                match op {
                    DataOp::Write { offset, len } => self.send_extent_data(ext, offset, len)?,
                    DataOp::Clone { offset, len, src } => self.send_clone(
                        offset,
                        len,
                        CloneSrc {
                            ino: src.0,
                            offset: src.1,
                            root: src.2,
                        },
                    )?,
                    DataOp::Truncate { size } => self.send_truncate(size)?,
                }
            }
            let end = ext.end(self.sectorsize).min(self.cur.size);
            if ext.file_offset < end {
                self.cur.next_write_offset = end;
            }
            return Ok(());
        }
        if self.out.tracing() && crate::send::pipeline::layout_dependent(ext) {
            self.recording = Some(Vec::new());
        }
        let res = self
            .find_extent_clone(ext, leaf)
            .and_then(|clone| self.send_write_or_clone(ext, clone));
        let ops = self.recording.take();
        res?;
        if let Some(ops) = ops {
            self.out.record_ops(ino, ext, ops);
        }
        Ok(())
    }

    /// TRUNCATE of the current inode to `size`.
    fn send_truncate(&mut self, size: u64) -> Result<(), SendError> {
        if let Some(r) = &mut self.recording {
            r.push(DataOp::Truncate { size });
        }
        let path = self.cur_inode_path()?;
        self.emit(&Command::Truncate {
            path: path.as_slice().into(),
            size,
        })
    }

    /// `find_extent_clone`: the clone root and reference to clone `ext`
    /// from, chosen as the kernel chooses (`iterate_backrefs`, then the
    /// root with the most bytes, lowest id first).
    pub(super) fn find_extent_clone(
        &mut self,
        ext: &FileExtent,
        leaf: Logical,
    ) -> Result<Option<CloneSrc>, SendError> {
        let data_offset = ext.file_offset;
        let ino_size = self.cur.size;
        if data_offset >= ino_size {
            return Ok(None);
        }
        let Some(d) = ext.disk() else {
            return Ok(None);
        };
        let (disk_bytenr, ext_off, num_bytes) = (d.disk_bytenr.get(), d.offset, d.num_bytes);
        if disk_bytenr == 0 {
            return Ok(None);
        }
        // Only the send root as clone root and this extent not sent yet:
        // no inode before this one references it.
        if self
            .clone_index
            .as_ref()
            .is_some_and(|index| !index.contains(&disk_bytenr))
        {
            return Ok(None);
        }
        // check_extent_item: one reference is our own; the kernel gives up
        // on heavily shared extents.
        let Some(refs) = self.backrefs.extents.data_extent(disk_bytenr)? else {
            return Ok(None);
        };
        let only_send_root = self.clone_roots.len() == 1;
        if (refs.refs <= 1 && only_send_root) || refs.refs > SEND_MAX_EXTENT_REFS {
            return Ok(None);
        }
        let extent_len = if data_offset.saturating_add(num_bytes) >= ino_size {
            ino_size - data_offset
        } else {
            num_bytes
        };
        let compressed = ext.compression != Compression::None;
        let pos = (!compressed).then_some(ext_off);
        let (cur_ino, backref_offset) = (self.cur.ino, data_offset.wrapping_sub(ext_off));
        // The shared-leaf shortcut: the extent's one reference is our own
        // item's (a data ref naming our inode and position, or a shared ref
        // naming our leaf), so the walk could only find our item, in our
        // leaf: skip resolving it and ask only which clone roots share the
        // leaf (the same candidates, in the same order).
        let own_only = refs.refs == 1
            && match (&refs.data_refs[..], &refs.shared[..]) {
                ([r], []) => r.count == 1 && r.objectid == cur_ino && r.offset == backref_offset,
                ([], [shared]) => *shared == leaf.get(),
                _ => false,
            };
        let walk = if own_only {
            let elem = Elem {
                ino: cur_ino,
                offset: data_offset,
                num_bytes,
            };
            let shared = !refs.shared.is_empty();
            Walk {
                leaves: vec![LeafRefs {
                    leaf: leaf.get(),
                    // Any key in the leaf finds it.
                    first_key: Key::new(cur_ino, ondisk::BTRFS_EXTENT_DATA_KEY, data_offset),
                    elems: vec![elem],
                }],
                resolved: if shared { Vec::new() } else { vec![(0, elem)] },
                shared: if shared { vec![0] } else { Vec::new() },
            }
        } else {
            // skip_self_data_ref: with the send root as the only clone root,
            // our own data reference (its root is the owner of our leaf,
            // which a snapshot may share) is not resolved at all.
            let owner = if only_send_root {
                self.leaf_owner(leaf)?
            } else {
                0
            };
            self.backrefs
                .walk(&refs, disk_bytenr, pos, |root, ino, base| {
                    only_send_root && root == owner && ino == cur_ino && base == backref_offset
                })?
        };
        let roots: Vec<(u64, crate::tree::walk::TreeRoot)> = self
            .clone_roots
            .iter()
            .map(|r| (r.id, r.view.root))
            .collect();
        let mut cands = Candidates {
            found: vec![None; roots.len()],
            send_root: self.send_root,
            cur_ino,
            data_offset,
            extent_len,
            next_write_offset: self.cur.next_write_offset,
        };
        let root_index = |id: u64| roots.iter().position(|r| r.0 == id);
        'walk: {
            // The items of leaves the cache knows, as the references are
            // resolved (check_extent_in_eb)...
            for &(i, e) in &walk.resolved {
                for r in self.kcache.lookup(walk.leaves[i].leaf).unwrap_or_default() {
                    if root_index(r).is_some_and(|ri| cands.visit(ri, &e)) {
                        break 'walk;
                    }
                }
            }
            // ... and as the shared references' leaves are read
            // (find_extent_in_eb: forward slot order) ...
            for &i in &walk.shared {
                for e in walk.leaves[i].elems.iter().rev() {
                    for r in self.kcache.lookup(walk.leaves[i].leaf).unwrap_or_default() {
                        if root_index(r).is_some_and(|ri| cands.visit(ri, e)) {
                            break 'walk;
                        }
                    }
                }
            }
            // ... then every leaf, with the roots reaching it
            // (iterate_extent_inodes).
            for l in &walk.leaves {
                let leaf_roots = match self.kcache.lookup(l.leaf) {
                    Some(r) => r,
                    None => {
                        let r = self.backrefs.roots_of(l, &roots)?;
                        self.kcache.store(l.leaf, &r);
                        r
                    }
                };
                for r in leaf_roots {
                    let Some(ri) = root_index(r) else { continue };
                    for e in &l.elems {
                        if cands.visit(ri, e) {
                            break 'walk;
                        }
                    }
                }
            }
        }
        let found = cands.found;
        let mut chosen: Option<(usize, (u64, u64, u64))> = None;
        for (i, f) in found.iter().enumerate() {
            let Some(f) = *f else { continue };
            if chosen.is_none_or(|(_, c)| f.2 > c.2) {
                chosen = Some((i, f));
                if f.2 >= extent_len {
                    break;
                }
            }
        }
        Ok(chosen.map(|(root, (ino, offset, _))| CloneSrc { ino, offset, root }))
    }

    /// The owner in the header of leaf `leaf` of the tree being sent
    /// (`btrfs_header_owner`: a snapshot shares its source's leaves).
    fn leaf_owner(&mut self, leaf: Logical) -> Result<u64, SendError> {
        let Some(generation) = self.backrefs.extents.tree_block_generation(leaf.get())? else {
            return Err(SendError::corrupt(
                self.cur.ino,
                "the leaf holding its file extent item has no extent item",
            ));
        };
        let block = self.fs.volume().read_block(&BlockExpect {
            logical: leaf,
            tree: TreeId(ondisk::BTRFS_FS_TREE_OBJECTID),
            generation: Generation(generation),
            level: 0,
            first_key: None,
        })?;
        Ok(block.node().owner().get())
    }

    /// The tree a clone source lives in.
    pub(super) fn clone_tree(&self, src: &CloneSrc) -> TreeView<'a> {
        self.clone_roots
            .get(src.root)
            .map_or_else(|| self.view.clone(), |r| r.view.clone())
    }

    pub(super) fn clone_src_size(&self, src: &CloneSrc) -> Result<u64, SendError> {
        self.clone_tree(src)
            .inode(src.ino)?
            .map(|i| i.size)
            .ok_or_else(|| SendError::corrupt(src.ino, "clone source has no inode item"))
    }

    /// `send_write_or_clone`.
    pub(super) fn send_write_or_clone(
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
            Some(c) if end.is_multiple_of(u64::from(self.sectorsize)) => Some(c),
            // An unaligned end can only be cloned up to both files' EOF;
            // in an incremental send the file is first truncated to the
            // clone's start, since the receiver's file may be longer.
            Some(c) if end == self.cur.size => {
                let src_size = self.clone_src_size(&c)?;
                let ok = c.offset.saturating_add(num_bytes) == src_size;
                if ok && self.parent.is_some() {
                    self.send_truncate(offset)?;
                }
                ok.then_some(c)
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
    pub(super) fn clone_range(
        &mut self,
        ext: &FileExtent,
        mut src: CloneSrc,
        mut offset: u64,
        mut len: u64,
    ) -> Result<(), SendError> {
        let disk_byte = ext.disk().map_or(0, |d| d.disk_bytenr.get());
        let mut data_offset = ext.disk().map_or(0, |d| d.offset);
        if src.offset == 0 && len == u64::from(self.sectorsize) {
            return self.send_extent_data(ext, offset, len);
        }
        let src_size = self.clone_src_size(&src)?;
        let view = self.clone_tree(&src);
        let mut it = view.extents_from_iter(src.ino, src.offset)?;
        while let Some(se) = it.next_extent()? {
            let mut ext_len = match &se.data {
                ExtentData::Inline(_) => se.ram_bytes.div_ceil(PAGE_SIZE).saturating_mul(PAGE_SIZE),
                ExtentData::Regular(d) | ExtentData::Prealloc(d) => d.num_bytes,
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
            let mut clone_data_offset = se.disk().map_or(0, |d| d.offset);
            let same_extent = se.disk().is_some_and(|d| d.disk_bytenr.get() == disk_byte);
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
                // middle of a file; the piece is cut at a multiple of the
                // largest sector size, whatever the receiver's is.
                if src_end == src_size
                    && !src_end.is_multiple_of(MAX_SECTOR_SIZE)
                    && offset.saturating_add(clone_len) < self.cur.size
                {
                    let slen = (src_end - src.offset) / MAX_SECTOR_SIZE * MAX_SECTOR_SIZE;
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
            if src.root == self.send_root
                && src.ino == self.cur.ino
                && src.offset >= self.cur.next_write_offset
            {
                break;
            }
            data_offset += clone_len;
        }
        if len > 0 {
            self.send_extent_data(ext, offset, len)?;
        }
        Ok(())
    }

    pub(super) fn send_clone(
        &mut self,
        offset: u64,
        len: u64,
        src: CloneSrc,
    ) -> Result<(), SendError> {
        let path = self.cur_inode_path()?;
        let (clone_path, clone_uuid, clone_ctransid) = match self.clone_roots.get(src.root) {
            Some(r) if src.root != self.send_root => {
                (inode_path(&r.view, src.ino)?, r.uuid, r.ctransid)
            }
            _ => {
                let src_gen = self.inode(src.ino)?.generation.get();
                (self.cur_path(src.ino, src_gen)?, self.uuid, self.ctransid)
            }
        };
        if let Some(r) = &mut self.recording {
            r.push(DataOp::Clone {
                offset,
                len,
                src: (src.ino, src.offset, src.root),
            });
        }
        self.stats.cloned_bytes = self.stats.cloned_bytes.saturating_add(len);
        self.emit(&Command::Clone {
            offset,
            len,
            path: path.into(),
            clone_uuid,
            clone_ctransid,
            clone_path: clone_path.into(),
            clone_offset: src.offset,
        })
    }
}

/// `iterate_backrefs`: the best reference per clone root so far.
struct Candidates {
    /// Per clone root: (ino, offset, num_bytes) of the best reference.
    found: Vec<Option<(u64, u64, u64)>>,
    send_root: usize,
    cur_ino: u64,
    data_offset: u64,
    extent_len: u64,
    next_write_offset: u64,
}

impl Candidates {
    /// One reference of clone root `i`; true: a whole-extent candidate,
    /// the walk stops (`BTRFS_ITERATE_EXTENT_INODES_STOP`).
    fn visit(&mut self, i: usize, e: &Elem) -> bool {
        if i == self.send_root {
            if e.ino == self.cur_ino && e.offset == self.data_offset {
                return false;
            }
            if e.ino > self.cur_ino
                || (e.ino == self.cur_ino
                    && e.offset.saturating_add(self.extent_len) > self.next_write_offset)
            {
                return false;
            }
        }
        let best = &mut self.found[i];
        if best.is_none_or(|(_, _, n)| e.num_bytes > n) {
            *best = Some((e.ino, e.offset, e.num_bytes));
            return e.num_bytes >= self.extent_len;
        }
        false
    }
}
