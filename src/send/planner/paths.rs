//! Paths on the receiver as they are at this point of the stream
//! (`get_cur_path`): the state of an inode (`get_cur_inode_state`), first
//! references in the snapshot and the parent, orphan names
//! (`gen_unique_name`), the overwrite checks of an incremental send
//! (`will_overwrite_ref`, `did_overwrite_ref`), ancestry in the parent, and
//! the paths of clone sources in other roots (`get_inode_path`).

use std::io::Write;

use crate::fs::{FileType, Inode};
use crate::ondisk;
use crate::send::error::SendError;
use crate::send::view::TreeView;

use super::{FIRST_FREE, Planner};

/// The most directories a path walk climbs before it gives up: a path has
/// at most `PATH_MAX` (4096) bytes, so fewer components than that; more
/// steps mean references that loop (a corrupt tree) or delayed moves that
/// never resolve.
pub(super) const MAX_PATH_STEPS: usize = 4096;
/// Entries kept in the first-ref cache before it is dropped (memory bound).
const NAME_CACHE_MAX: usize = 1 << 16;

impl<'a, W: Write> Planner<'a, W> {
    /// The snapshot's view (`left`), else the parent's (if any).
    pub(super) fn tree_of(&self, left: bool) -> Option<TreeView<'a>> {
        if left {
            Some(self.view.clone())
        } else {
            self.parent.clone()
        }
    }

    pub(super) fn inode(&self, ino: u64) -> Result<Inode, SendError> {
        self.view
            .inode(ino)?
            .ok_or_else(|| SendError::corrupt(ino, "missing inode item"))
    }

    /// `gen_unique_name`: the orphan name, unique in the root directory.
    pub(super) fn orphan_name(&self, ino: u64, generation: u64) -> Result<Vec<u8>, SendError> {
        let mut idx = 0u64;
        loop {
            let name = orphan_bytes(ino, generation, idx);
            let id = (ino, generation, idx);
            let in_parent = match &self.parent {
                Some(p) => p.has_orphan_name(id, &name)?,
                None => false,
            };
            if !in_parent && !self.view.has_orphan_name(id, &name)? {
                return Ok(name);
            }
            idx = idx.saturating_add(1);
        }
    }

    /// The first reference of an inode in the snapshot, cached (a
    /// snapshot's names never change).
    pub(super) fn first_ref(&mut self, ino: u64) -> Result<(u64, Vec<u8>), SendError> {
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

    /// The generation of a linked inode in the snapshot (`left`) or the
    /// parent.
    pub(super) fn gen_in(&self, left: bool, ino: u64) -> Result<Option<u64>, SendError> {
        let tree = self.tree_of(left);
        let Some(tree) = tree else {
            return Ok(None);
        };
        Ok(tree
            .inode(ino)?
            .filter(|i| i.nlink > 0)
            .map(|i| i.generation.get()))
    }

    /// `get_cur_inode_state` as (exists in S, exists in P, processed).
    pub(super) fn inode_state(&self, ino: u64, generation: u64) -> Result<(bool, bool), SendError> {
        let l = self.gen_in(true, ino)? == Some(generation);
        let r = self.gen_in(false, ino)? == Some(generation);
        Ok((l, r))
    }

    /// `is_inode_existent`: on the receiver now.
    pub(super) fn is_inode_existent(&self, ino: u64, generation: u64) -> Result<bool, SendError> {
        if ino == FIRST_FREE {
            return Ok(true);
        }
        let (l, r) = self.inode_state(ino, generation)?;
        Ok(match (l, r) {
            (true, true) => true,
            (true, false) => ino < self.send_progress,
            (false, true) => ino >= self.send_progress,
            (false, false) => false,
        })
    }

    /// `did_overwrite_ref`.
    pub(super) fn did_overwrite_ref(
        &self,
        dir: u64,
        dir_gen: u64,
        ino: u64,
        ino_gen: u64,
        name: &[u8],
    ) -> Result<bool, SendError> {
        if self.parent.is_none() {
            return Ok(false);
        }
        if !self.is_inode_existent(dir, dir_gen)? {
            return Ok(false);
        }
        if dir != FIRST_FREE && self.gen_in(true, dir)? != Some(dir_gen) {
            return Ok(false);
        }
        let Some(loc) = self.view.lookup_dir_item(dir, name)? else {
            return Ok(false);
        };
        if loc.item_type != ondisk::BTRFS_INODE_ITEM_KEY {
            return Ok(false);
        }
        let ow = loc.objectid;
        let ow_gen = self.gen_in(true, ow)?;
        if ow == ino && ow_gen == Some(ino_gen) {
            return Ok(false);
        }
        Ok(ow < self.send_progress
            || (ino != self.cur.ino && ow == self.cur.ino && ow_gen == Some(self.cur.generation)))
    }

    /// `will_overwrite_ref`: the unprocessed inode (ino, gen, is dir) that
    /// owns `name` in `dir` in the parent.
    pub(super) fn will_overwrite_ref(
        &self,
        dir: u64,
        dir_gen: u64,
        name: &[u8],
    ) -> Result<Option<(u64, u64, bool)>, SendError> {
        let Some(parent) = self.parent.clone() else {
            return Ok(None);
        };
        if !self.is_inode_existent(dir, dir_gen)? {
            return Ok(None);
        }
        if dir != FIRST_FREE && self.gen_in(false, dir)? != Some(dir_gen) {
            return Ok(None);
        }
        let Some(loc) = parent.lookup_dir_item(dir, name)? else {
            return Ok(None);
        };
        if loc.item_type != ondisk::BTRFS_INODE_ITEM_KEY {
            return Ok(None);
        }
        let other = loc.objectid;
        // Not processed yet, or processed but its move is delayed: its old
        // dentry is still there.
        if other > self.send_progress || self.waiting_moves.contains_key(&other) {
            let Some(info) = parent.inode(other)? else {
                return Ok(None);
            };
            return Ok(Some((
                other,
                info.generation.get(),
                info.file_type() == FileType::Dir,
            )));
        }
        Ok(None)
    }

    /// The first reference of `ino` in the parent.
    pub(super) fn parent_first_ref(&self, ino: u64) -> Result<Option<(u64, Vec<u8>)>, SendError> {
        match self.parent.clone() {
            Some(p) => Ok(p.first_ref(ino)?),
            None => Ok(None),
        }
    }

    /// `get_inode_gen`: the generation of `ino` in the snapshot (`left`) or
    /// the parent, whatever its link count.
    pub(super) fn inode_gen(&self, left: bool, ino: u64) -> Result<Option<u64>, SendError> {
        let tree = self.tree_of(left);
        let Some(tree) = tree else {
            return Ok(None);
        };
        Ok(tree.inode(ino)?.map(|i| i.generation.get()))
    }

    /// `get_first_ref` with the parent directory's generation, in the
    /// snapshot (`left`) or the parent.
    pub(super) fn first_ref_gen(
        &mut self,
        left: bool,
        ino: u64,
    ) -> Result<Option<(u64, u64, Vec<u8>)>, SendError> {
        let r = if left {
            Some(self.first_ref(ino)?)
        } else {
            self.parent_first_ref(ino)?
        };
        let Some((dir, name)) = r else {
            return Ok(None);
        };
        let dir_gen = self.inode_gen(left, dir)?.unwrap_or(0);
        Ok(Some((dir, dir_gen, name)))
    }

    /// `__get_cur_name_and_parent`: the name of `ino` on the receiver now
    /// and its parent, or `None` when it sits at its orphan name.
    pub(super) fn cur_name_and_parent(
        &mut self,
        ino: u64,
        generation: u64,
    ) -> Result<Option<(u64, u64, Vec<u8>)>, SendError> {
        if !self.is_inode_existent(ino, generation)? {
            return Ok(None);
        }
        let left = ino < self.send_progress;
        let Some((dir, dir_gen, name)) = self.first_ref_gen(left, ino)? else {
            return Err(SendError::corrupt(ino, "inode has no reference"));
        };
        if self.did_overwrite_ref(dir, dir_gen, ino, generation, &name)? {
            return Ok(None);
        }
        Ok(Some((dir, dir_gen, name)))
    }

    /// `get_cur_path`: where `ino` is on the receiver right now.
    pub(super) fn cur_path(&mut self, ino: u64, generation: u64) -> Result<Vec<u8>, SendError> {
        let is_cur = ino == self.cur.ino && generation == self.cur.generation;
        if is_cur && let Some(p) = &self.cur.path {
            return Ok(p.clone());
        }
        let mut parts: Vec<Vec<u8>> = Vec::new();
        let (start, mut ino, mut generation) = (ino, ino, generation);
        while ino != FIRST_FREE {
            if parts.len() > MAX_PATH_STEPS {
                return Err(SendError::corrupt(
                    start,
                    "path resolution loops through delayed directory moves",
                ));
            }
            if self.orphan_dirs.contains_key(&(ino, generation)) {
                parts.push(self.orphan_name(ino, generation)?);
                break;
            }
            let next =
                match self.waiting_moves.get(&ino) {
                    Some(w) if w.orphanized => None,
                    Some(_) => Some(self.first_ref_gen(false, ino)?.ok_or_else(|| {
                        SendError::corrupt(ino, "moved directory not in the parent")
                    })?),
                    None => self.cur_name_and_parent(ino, generation)?,
                };
            let Some((dir, dir_gen, name)) = next else {
                parts.push(self.orphan_name(ino, generation)?);
                break;
            };
            parts.push(name);
            ino = dir;
            generation = dir_gen;
        }
        let mut out = Vec::new();
        for p in parts.iter().rev() {
            if !out.is_empty() {
                out.push(b'/');
            }
            out.extend_from_slice(p);
        }
        if is_cur {
            self.cur.path = Some(out.clone());
        }
        Ok(out)
    }

    pub(super) fn cur_inode_path(&mut self) -> Result<Vec<u8>, SendError> {
        self.cur_path(self.cur.ino, self.cur.generation)
    }

    pub(super) fn ref_path(
        &mut self,
        dir: u64,
        dir_gen: u64,
        name: &[u8],
    ) -> Result<Vec<u8>, SendError> {
        let mut full_path = self.cur_path(dir, dir_gen)?;
        if !full_path.is_empty() {
            full_path.push(b'/');
        }
        full_path.extend_from_slice(name);
        Ok(full_path)
    }

    /// `is_first_ref` in the parent.
    pub(super) fn is_first_ref_in_parent(
        &self,
        ino: u64,
        dir: u64,
        name: &[u8],
    ) -> Result<bool, SendError> {
        Ok(self
            .parent_first_ref(ino)?
            .is_some_and(|(d, n)| d == dir && n == name))
    }

    /// Every reference (parent directory) of `ino` in the parent.
    pub(super) fn parent_ref_dirs(&self, ino: u64) -> Result<Vec<u64>, SendError> {
        let Some(tree) = self.parent.clone() else {
            return Ok(Vec::new());
        };
        Ok(tree.refs(ino)?.into_iter().map(|(dir, _)| dir).collect())
    }

    /// `is_ancestor` in the parent: whether (ino1, gen1) is an ancestor of
    /// `ino2` through any of its references (`check_ino_in_path`).
    pub(super) fn is_ancestor(
        &mut self,
        ino1: u64,
        gen1: u64,
        ino2: u64,
    ) -> Result<bool, SendError> {
        for dir in self.parent_ref_dirs(ino2)? {
            let dir_gen = self.inode_gen(false, dir)?.unwrap_or(0);
            if dir == ino1 {
                if dir_gen == gen1 {
                    return Ok(true);
                }
                continue;
            }
            let mut ino = dir;
            let mut steps = 0;
            while ino > FIRST_FREE && steps < MAX_PATH_STEPS {
                steps += 1;
                let Some((p, p_gen, _)) = self.first_ref_gen(false, ino)? else {
                    break;
                };
                if p == ino1 {
                    if p_gen == gen1 {
                        return Ok(true);
                    }
                    break;
                }
                ino = p;
            }
        }
        Ok(false)
    }
}

/// `get_inode_path` in a clone root other than the send root: the
/// first-ref path from its top.
pub(super) fn inode_path(view: &TreeView<'_>, mut ino: u64) -> Result<Vec<u8>, SendError> {
    let mut parts = Vec::new();
    while ino != FIRST_FREE && parts.len() < MAX_PATH_STEPS {
        let (dir, name) = view
            .first_ref(ino)?
            .ok_or_else(|| SendError::corrupt(ino, "clone source has no reference"))?;
        parts.push(name);
        ino = dir;
    }
    parts.reverse();
    Ok(parts.join(&b'/'))
}

/// `o{ino}-{generation}-{idx}`, built without the formatting machinery
/// (every new inode of a full send gets one: `format!` was 3 % of a full
/// estimate).
fn orphan_bytes(ino: u64, generation: u64, idx: u64) -> Vec<u8> {
    let mut name = Vec::with_capacity(3 * 20 + 3);
    name.push(b'o');
    push_decimal(&mut name, ino);
    name.push(b'-');
    push_decimal(&mut name, generation);
    name.push(b'-');
    push_decimal(&mut name, idx);
    name
}

/// Append `n` in decimal.
fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        // A remainder below 10: the cast keeps it.
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::orphan_bytes;

    #[test]
    fn orphan_names_are_what_format_writes() {
        for (ino, generation, idx) in [
            (0, 0, 0),
            (256, 7, 0),
            (257, 1_000_000, 12),
            (9, 10, 99),
            (u64::MAX, u64::MAX - 1, u64::MAX),
        ] {
            assert_eq!(
                orphan_bytes(ino, generation, idx),
                format!("o{ino}-{generation}-{idx}").into_bytes()
            );
        }
    }
}
