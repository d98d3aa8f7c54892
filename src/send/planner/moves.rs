//! Delayed directory moves of an incremental send: a directory whose new
//! place depends on another directory that has not moved yet waits for it
//! (`wait_for_dest_dir_move`, `wait_for_parent_move`,
//! `add_pending_dir_move`) and moves when that one is done
//! (`apply_children_dir_moves`, `apply_dir_move`), re-queued when its path
//! would loop through itself (`path_loop`).

use std::collections::VecDeque;
use std::io::Write;

use stream_format::Command;

use crate::ondisk;
use crate::send::error::SendError;

use super::paths::MAX_PATH_STEPS;
use super::state::{NewRef, PendingMove, WaitingMove};
use super::{FIRST_FREE, Planner};

impl<'a, W: Write> Planner<'a, W> {
    /// `add_pending_dir_move`: delay the rename of the current directory
    /// until `under` has moved.
    pub(super) fn add_pending_move(
        &mut self,
        ino: u64,
        generation: u64,
        under: u64,
        dirs: Vec<(u64, u64)>,
        orphanized: bool,
    ) {
        self.pending_moves
            .entry(under)
            .or_default()
            .push(PendingMove {
                ino,
                generation,
                dirs,
            });
        self.waiting_moves.insert(
            ino,
            WaitingMove {
                orphanized,
                rmdir: None,
            },
        );
    }

    /// The directories of the current inode's deleted then new refs (the
    /// `update_refs` of a pending move).
    pub(super) fn ref_dirs(&self, new: &[NewRef], deleted: &[NewRef]) -> Vec<(u64, u64)> {
        deleted
            .iter()
            .chain(new)
            .map(|r| (r.dir, r.dir_gen))
            .collect()
    }

    /// `wait_for_dest_dir_move`: the name we take belonged, in the parent,
    /// to a directory whose own move is delayed: ours must follow it.
    pub(super) fn wait_for_dest_dir_move(&mut self, r: &NewRef) -> Result<Option<u64>, SendError> {
        if self.waiting_moves.is_empty() {
            return Ok(None);
        }
        let Some(parent) = self.parent.clone() else {
            return Ok(None);
        };
        let Some(loc) = parent.lookup_dir_item(r.dir, &r.name)? else {
            return Ok(None);
        };
        if loc.item_type != ondisk::BTRFS_INODE_ITEM_KEY {
            return Ok(None);
        }
        let other = loc.objectid;
        let before = self.inode_gen(false, other)?;
        let Some(after) = self.inode_gen(true, other)? else {
            return Ok(None);
        };
        if before != Some(after) {
            return Ok(None);
        }
        Ok(match self.waiting_moves.get(&other) {
            Some(w) if !w.orphanized => Some(other),
            _ => None,
        })
    }

    /// `wait_for_parent_move`: the unprocessed directory on the new path
    /// (in the snapshot) that moves and must do so before us.
    pub(super) fn wait_for_parent_move(&mut self, r: &NewRef) -> Result<Option<u64>, SendError> {
        let (mut ino, mut ino_gen) = (r.dir, r.dir_gen);
        let mut steps = 0;
        while ino > FIRST_FREE && steps < MAX_PATH_STEPS {
            steps += 1;
            if self.waiting_moves.contains_key(&ino)
                && self.is_ancestor(self.cur.ino, self.cur.generation, ino)?
            {
                return Ok(Some(ino));
            }
            let Some((after_dir, after_gen, after_name)) = self.first_ref_gen(true, ino)? else {
                return Err(SendError::corrupt(ino, "inode has no reference"));
            };
            let Some(before) = self.parent_first_ref(ino)? else {
                return Ok(None);
            };
            if ino > self.cur.ino
                && (before.0 != after_dir || before.1 != after_name)
                && self.inode_gen(false, ino)? == Some(ino_gen)
            {
                return Ok(Some(ino));
            }
            ino = after_dir;
            ino_gen = after_gen;
        }
        Ok(None)
    }

    /// `apply_children_dir_moves`: the delayed moves waiting for the
    /// current inode, and those waiting for them.
    pub(super) fn apply_children_dir_moves(&mut self) -> Result<(), SendError> {
        let Some(list) = self.pending_moves.remove(&self.cur.ino) else {
            return Ok(());
        };
        let mut queue: VecDeque<PendingMove> = list.into();
        while let Some(pm) = queue.pop_front() {
            self.apply_dir_move(&pm)?;
            if let Some(more) = self.pending_moves.remove(&pm.ino) {
                queue.extend(more);
            }
        }
        Ok(())
    }

    /// `path_loop`: whether the would-be path of a delayed directory leads
    /// back to itself; then the first directory on it that waits for its
    /// own move (under which to delay again).
    pub(super) fn path_loop(
        &mut self,
        ino: u64,
        generation: u64,
    ) -> Result<Option<u64>, SendError> {
        let start = ino;
        let (mut ino, mut generation) = (ino, generation);
        let mut ancestor = None;
        let mut steps = 0;
        while ino != FIRST_FREE && steps < MAX_PATH_STEPS {
            steps += 1;
            if self.orphan_dirs.contains_key(&(ino, generation)) {
                break;
            }
            let next = if self.waiting_moves.contains_key(&ino) {
                ancestor.get_or_insert(ino);
                self.first_ref_gen(false, ino)?
            } else {
                self.cur_name_and_parent(ino, generation)?
            };
            let Some((dir, dir_gen, _)) = next else {
                break;
            };
            if dir == start {
                return Ok(Some(*ancestor.get_or_insert(ino)));
            }
            ino = dir;
            generation = dir_gen;
        }
        Ok(None)
    }

    /// `apply_dir_move`.
    pub(super) fn apply_dir_move(&mut self, pm: &PendingMove) -> Result<(), SendError> {
        let w = self.waiting_moves.remove(&pm.ino).unwrap_or_default();
        let from = if w.orphanized {
            self.orphan_name(pm.ino, pm.generation)?
        } else {
            let (pdir, pgen, pname) = self
                .first_ref_gen(false, pm.ino)?
                .ok_or_else(|| SendError::corrupt(pm.ino, "moved directory not in the parent"))?;
            self.ref_path(pdir, pgen, &pname)?
        };
        let saved = self.send_progress;
        self.send_progress = self.cur.ino.saturating_add(1);
        let result = self.apply_dir_move_at(pm, w, &from);
        self.send_progress = saved;
        result
    }

    pub(super) fn apply_dir_move_at(
        &mut self,
        pm: &PendingMove,
        w: WaitingMove,
        from: &[u8],
    ) -> Result<(), SendError> {
        if let Some(ancestor) = self.path_loop(pm.ino, pm.generation)? {
            // Its new path would go through itself: wait for that ancestor.
            self.add_pending_move(
                pm.ino,
                pm.generation,
                ancestor,
                pm.dirs.clone(),
                w.orphanized,
            );
            if let Some(wm) = self.waiting_moves.get_mut(&pm.ino) {
                wm.rmdir = w.rmdir;
            }
            return Ok(());
        }
        let to = self.cur_path(pm.ino, pm.generation)?;
        self.emit(&Command::Rename {
            path: from.into(),
            path_to: to.into(),
        })?;
        if let Some((dir, dir_gen)) = w.rmdir
            && self.orphan_dirs.contains_key(&(dir, dir_gen))
            && self.can_rmdir(dir, dir_gen)?
        {
            let path = self.cur_path(dir, dir_gen)?;
            self.emit(&Command::Rmdir { path: path.into() })?;
        }
        self.cache_dir_utimes(pm.ino, pm.generation);
        for &(dir, dir_gen) in &pm.dirs {
            // The parent may be gone from the snapshot.
            if self.view.inode(dir)?.is_some() {
                self.cache_dir_utimes(dir, dir_gen);
            }
        }
        Ok(())
    }
}
