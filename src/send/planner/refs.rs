//! References: recording new and deleted names with their cancellation
//! (`record_new_ref_if_needed`, `record_deleted_ref_if_needed`), and
//! processing them once per inode (`process_recorded_refs`): orphanizing
//! inodes whose names are taken, RENAME / LINK / UNLINK, removing deleted
//! directories when they are empty (`can_rmdir`, `orphan_dir_info`).

use std::io::Write;

use stream_format::Command;

use crate::fs::FileType;
use crate::ondisk;
use crate::send::compare::Change;
use crate::send::error::SendError;
use crate::send::view;
use crate::tree::walk::ItemRef;

use super::state::NewRef;
use super::{FIRST_FREE, Planner};

impl<'a, W: Write> Planner<'a, W> {
    /// `changed_ref`: record the names of a new, deleted or changed
    /// INODE_REF / INODE_EXTREF item (new: the snapshot's, deleted: the
    /// parent's).
    pub(super) fn changed_ref(
        &mut self,
        change: Change,
        left: Option<&ItemRef<'_>>,
        right: Option<&ItemRef<'_>>,
    ) -> Result<(), SendError> {
        if self.cur.ino == FIRST_FREE || self.cur.new_gen {
            return Ok(());
        }
        if let Some(l) = left.filter(|_| change != Change::Deleted) {
            for (dir, name) in view::parse_refs(l)? {
                self.record_ref(true, dir, &name)?;
            }
        }
        if let Some(r) = right.filter(|_| change != Change::New) {
            for (dir, name) in view::parse_refs(r)? {
                self.record_ref(false, dir, &name)?;
            }
        }
        Ok(())
    }

    /// `process_all_refs`: record every reference of the current inode in
    /// the snapshot (`new`) or the parent, and process them.
    pub(super) fn process_all_refs(&mut self, new: bool) -> Result<(), SendError> {
        let tree = self.tree_of(new);
        let Some(tree) = tree else {
            return Ok(());
        };
        for (dir, name) in tree.refs(self.cur.ino)? {
            self.record_ref(new, dir, &name)?;
        }
        // A delayed rename of a re-created directory happens with its
        // parent's; nothing else depends on it here.
        self.process_recorded_refs().map(drop)
    }

    /// `record_new_ref_if_needed` / `record_deleted_ref_if_needed`, with
    /// the cancellation of a name both added and removed.
    pub(super) fn record_ref(&mut self, new: bool, dir: u64, name: &[u8]) -> Result<(), SendError> {
        let dir_gen = self.inode_gen(new, dir)?.unwrap_or(0);
        let other = if new {
            &mut self.deleted_refs
        } else {
            &mut self.new_refs
        };
        if let Some(pos) = other
            .iter()
            .position(|r| r.dir == dir && r.dir_gen == dir_gen && r.name == name)
        {
            other.remove(pos);
            return Ok(());
        }
        let full_path = self.ref_path(dir, dir_gen, name)?;
        let r = NewRef {
            dir,
            dir_gen,
            name: name.to_vec(),
            full_path,
        };
        if new {
            self.new_refs.push(r);
        } else {
            self.deleted_refs.push(r);
        }
        Ok(())
    }

    /// `process_recorded_refs`; returns whether the current directory's
    /// rename was delayed (`pending_move`).
    pub(super) fn process_recorded_refs(&mut self) -> Result<bool, SendError> {
        let mut refs = std::mem::take(&mut self.new_refs);
        let mut deleted = std::mem::take(&mut self.deleted_refs);
        let ino = self.cur.ino;
        let generation = self.cur.generation;
        let is_dir = self.cur.file_type() == FileType::Dir;
        let mut pending = false;
        let first_overwritten = if self.cur.new {
            false
        } else {
            match self.first_ref_gen(false, ino)? {
                Some((d, dg, n)) => self.did_overwrite_ref(d, dg, ino, generation, &n)?,
                None => false,
            }
        };
        let mut is_orphan = self.cur.new || first_overwritten;
        let mut valid_path = if is_orphan {
            self.orphan_name(ino, generation)?
        } else {
            self.cur_inode_path()?
        };
        let mut check_dirs: Vec<(u64, u64)> = Vec::new();
        let mut orphanized_dir = false;
        let mut orphanized_ancestor = false;
        // Pass 1: move unprocessed inodes out of the names we take.
        for rec in &mut refs {
            let (dir, dir_gen, name) = (rec.dir, rec.dir_gen, rec.name.clone());
            let (l, r) = self.inode_state(dir, dir_gen)?;
            if dir != FIRST_FREE && l && !r && dir >= self.send_progress {
                continue;
            }
            let Some((ow, ow_gen, ow_dir)) = self.will_overwrite_ref(dir, dir_gen, &name)? else {
                continue;
            };
            if orphanized_dir {
                rec.full_path = self.ref_path(dir, dir_gen, &name)?;
            }
            if self.is_first_ref_in_parent(ow, dir, &name)? {
                let path = rec.full_path.clone();
                self.orphanize(ow, ow_gen, &path)?;
                if ow_dir {
                    orphanized_dir = true;
                }
                if let Some(w) = self.waiting_moves.get_mut(&ow) {
                    w.orphanized = true;
                }
                if self.is_ancestor(ow, ow_gen, ino)? {
                    orphanized_ancestor = true;
                    self.cur.path = None;
                    valid_path = self.cur_inode_path()?;
                }
            } else {
                self.emit(&Command::Unlink {
                    path: rec.full_path.as_slice().into(),
                })?;
            }
        }
        // Pass 2: create, move, link.
        let mut can_rename = true;
        for i in 0..refs.len() {
            let (l, rr) = self.inode_state(refs[i].dir, refs[i].dir_gen)?;
            let dir = refs[i].dir;
            let will_create = dir != FIRST_FREE && l && !rr && dir >= self.send_progress;
            if will_create
                && !refs.iter().take(i).any(|o| o.dir == dir)
                && !self.created_dirs.contains(&dir)
            {
                let info = self.inode(dir)?;
                self.send_create_inode(dir, &info)?;
                self.created_dirs.insert(dir);
            }
            if is_dir && self.parent.is_some() {
                let r = refs[i].clone();
                let mut under = self.wait_for_dest_dir_move(&r)?;
                if under.is_none() && can_rename {
                    under = self.wait_for_parent_move(&r)?;
                }
                if let Some(under) = under {
                    let dirs = self.ref_dirs(&refs, &deleted);
                    self.add_pending_move(ino, generation, under, dirs, is_orphan);
                    can_rename = false;
                    pending = true;
                }
            }
            if can_rename && (is_orphan || is_dir) {
                let to = refs[i].full_path.clone();
                self.emit(&Command::Rename {
                    path: valid_path.as_slice().into(),
                    path_to: to.as_slice().into(),
                })?;
                self.cur.path = Some(to.clone());
                valid_path = to;
                is_orphan = false;
            } else if can_rename {
                if orphanized_dir {
                    let r = &refs[i];
                    let p = self.ref_path(r.dir, r.dir_gen, &r.name.clone())?;
                    refs[i].full_path = p;
                }
                self.emit(&Command::Link {
                    path: refs[i].full_path.as_slice().into(),
                    path_link: valid_path.as_slice().into(),
                })?;
            }
            let key = (refs[i].dir, refs[i].dir_gen);
            if !check_dirs.contains(&key) {
                check_dirs.push(key);
            }
        }
        if is_dir && self.cur.deleted {
            if self.can_rmdir(ino, generation)? {
                self.emit(&Command::Rmdir {
                    path: valid_path.as_slice().into(),
                })?;
            } else if !is_orphan {
                self.orphanize(ino, generation, &valid_path)?;
            }
            for r in &deleted {
                if !check_dirs.contains(&(r.dir, r.dir_gen)) {
                    check_dirs.push((r.dir, r.dir_gen));
                }
            }
        } else if is_dir {
            if let Some(r) = deleted.first()
                && !check_dirs.contains(&(r.dir, r.dir_gen))
            {
                check_dirs.push((r.dir, r.dir_gen));
            }
        } else {
            for r in &mut deleted {
                if !self.did_overwrite_ref(r.dir, r.dir_gen, ino, generation, &r.name)? {
                    if orphanized_ancestor {
                        r.full_path = self.ref_path(r.dir, r.dir_gen, &r.name.clone())?;
                    }
                    self.emit(&Command::Unlink {
                        path: r.full_path.as_slice().into(),
                    })?;
                    if self.cur.path.as_deref() == Some(r.full_path.as_slice()) {
                        self.cur.path = None;
                    }
                }
                if !check_dirs.contains(&(r.dir, r.dir_gen)) {
                    check_dirs.push((r.dir, r.dir_gen));
                }
            }
            if is_orphan {
                self.emit(&Command::Unlink {
                    path: valid_path.as_slice().into(),
                })?;
            }
        }
        for (dir, dir_gen) in check_dirs {
            // Parents not processed yet get their utimes when they are.
            if dir > ino {
                continue;
            }
            let (l, r) = self.inode_state(dir, dir_gen)?;
            let exists_now = dir == FIRST_FREE || (l && (r || dir < self.send_progress));
            if exists_now {
                self.cache_dir_utimes(dir, dir_gen);
            } else if r && !l && dir < self.send_progress && self.can_rmdir(dir, dir_gen)? {
                let path = self.cur_path(dir, dir_gen)?;
                self.emit(&Command::Rmdir {
                    path: path.as_slice().into(),
                })?;
            }
        }
        Ok(pending)
    }

    /// `can_rmdir`: every entry the directory had in the parent belongs to
    /// a processed inode and none to a directory whose move is delayed
    /// (that one then retries the rmdir after its move). A directory that
    /// cannot be removed yet is remembered as an orphan directory, with
    /// where to resume the check (`struct orphan_dir_info`).
    pub(super) fn can_rmdir(&mut self, dir: u64, dir_gen: u64) -> Result<bool, SendError> {
        if dir == FIRST_FREE {
            return Ok(false);
        }
        let Some(parent) = self.parent.clone() else {
            return Ok(false);
        };
        let odi = self.orphan_dirs.get(&(dir, dir_gen)).copied();
        if odi.is_some_and(|o| self.cur.ino < o.high_ino) {
            return Ok(false);
        }
        // Every (dir index offset, inode) of the directory in the parent.
        let mut entries: Vec<(u64, u64)> = Vec::new();
        let index = ondisk::BTRFS_DIR_INDEX_KEY;
        parent.each_item(dir, index..=index, |item| {
            for e in view::parse_dir_items(item)? {
                entries.push((item.key.offset, e.location.objectid));
            }
            Ok(())
        })?;
        let mut high_ino = 0;
        let mut last_index = 0;
        let can = 'check: {
            if odi.is_none() {
                // The last entry very likely names the highest inode.
                let Some(&(_, last_ino)) = entries.last() else {
                    return Ok(true);
                };
                high_ino = last_ino;
                if self.cur.ino < high_ino {
                    break 'check false;
                }
            }
            let from = odi.map_or(0, |o| o.last_index);
            for &(index, ino) in entries.iter().filter(|(i, _)| *i >= from) {
                high_ino = high_ino.max(ino);
                last_index = index;
                if let Some(w) = self.waiting_moves.get_mut(&ino) {
                    w.rmdir = Some((dir, dir_gen));
                    break 'check false;
                }
                if ino > self.cur.ino {
                    break 'check false;
                }
            }
            true
        };
        if can {
            self.orphan_dirs.remove(&(dir, dir_gen));
        } else {
            let o = self.orphan_dirs.entry((dir, dir_gen)).or_default();
            o.last_index = last_index;
            o.high_ino = o.high_ino.max(high_ino);
        }
        Ok(can)
    }

    /// `orphanize_inode`: move `path` to the orphan name of (ino, gen).
    pub(super) fn orphanize(
        &mut self,
        ino: u64,
        generation: u64,
        path: &[u8],
    ) -> Result<Vec<u8>, SendError> {
        let orphan = self.orphan_name(ino, generation)?;
        self.emit(&Command::Rename {
            path: path.into(),
            path_to: orphan.as_slice().into(),
        })?;
        if ino == self.cur.ino && generation == self.cur.generation {
            self.cur.path = Some(orphan.clone());
        }
        Ok(orphan)
    }
}
