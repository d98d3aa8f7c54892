//! The back-reference walk of clone detection: every (root, inode, file
//! offset) that references a data extent, in the order the kernel's
//! `iterate_extent_inodes` (Linux `fs/btrfs/backref.c`, called by
//! `find_extent_clone` in `fs/btrfs/send.c`) reports them, restricted to the
//! clone roots.
//!
//! The extent's references (`ExtentRefs`) are resolved into leaves:
//!
//! * an indirect reference (EXTENT_DATA_REF: root, inode, file offset −
//!   extent offset, count) is looked up in that root's tree (which need not
//!   be a clone root: snapshots share the leaves of the subvolume they were
//!   taken of); leaves the root does not own, or that a shared reference
//!   names, are skipped (they are reached through their owner or the
//!   shared reference), and at most `count` items match;
//! * a shared reference (SHARED_DATA_REF: the leaf) names the leaf, read
//!   directly (its generation comes from the extent tree).
//!
//! The kernel sorts these preliminary references in an rb-tree whose
//! insertion makes the walk *descending*: by root, then key (inode, offset),
//! then leaf; shared references (root 0) come last. The items of an indirect
//! reference are in slot order, those of a shared leaf in reverse slot order
//! (its leaf scan prepends). References to the same leaf are merged at the
//! leaf's first position. Each leaf is then visited for every clone root
//! that reaches it — found by searching that root's tree for the leaf's
//! first key, cached per leaf — in descending root id.
//!
//! Linux ≥ 6.2 adds the send backref cache (`lookup_backref_cache`,
//! `store_backref_cache` in `fs/btrfs/send.c`), which changes that order:
//! a 128-entry LRU of leaf → the clone roots reaching it, filled for every
//! leaf the final loop of `iterate_extent_inodes` resolves roots for (not
//! when more than 17 clone roots reach it). While the references are
//! resolved (`check_extent_in_eb`), an item in a leaf the cache knows is
//! handed to the iterator at once: first the items of indirect references
//! in resolution order, then those of shared references in *forward* slot
//! order; only then come the leaves in their merged order, cached or not.
//! [`Walk`] holds the three sequences and [`KernelCache`] the LRU, so the
//! planner visits candidates as the kernel does (which candidate among
//! several whole-extent ones is taken depends on it: e.g. after a balance,
//! when all references are shared, the kernel clones every copy of a file
//! from the first one).

use std::collections::HashMap;

use crate::fs::Filesystem;
use crate::ondisk;
use crate::tree::check::BlockExpect;
use crate::tree::key::Key;
use crate::tree::walk::{BlockSource, Cursor, TreeRoot};
use crate::types::{Generation, Logical, TreeId};

use super::error::SendError;
use super::extent_tree::{ExtentRecord, ExtentTreeReader};
use crate::fs::{Compression, FileExtent};

/// Leaves whose reaching clone roots are cached before the cache is dropped
/// (memory bound; the kernel keeps 128).
const LEAF_ROOTS_CACHE_MAX: usize = 1 << 14;

/// `SEND_MAX_BACKREF_CACHE_SIZE`: leaves in the kernel's send backref cache.
const KERNEL_CACHE_SIZE: usize = 128;
/// `SEND_MAX_BACKREF_CACHE_ROOTS`: a leaf reached by more clone roots is
/// not cached.
const KERNEL_CACHE_ROOTS: usize = 17;

/// The kernel's send backref cache: leaf → the clone roots reaching it
/// (descending id, as [`Backrefs::roots_of`] gives them), least recently
/// used first. A lookup that hits makes the entry the most recently used;
/// a store into a full cache evicts the least recently used
/// (`btrfs_lru_cache`). One per send of a subvolume, as in the kernel.
#[derive(Debug, Default)]
pub(crate) struct KernelCache {
    entries: Vec<(u64, Vec<u64>)>,
}

impl KernelCache {
    /// `lookup_backref_cache`.
    pub fn lookup(&mut self, leaf: u64) -> Option<Vec<u64>> {
        let i = self.entries.iter().position(|e| e.0 == leaf)?;
        let e = self.entries.remove(i);
        let roots = e.1.clone();
        self.entries.push(e);
        Some(roots)
    }

    /// `store_backref_cache`, for a leaf the lookup missed.
    pub fn store(&mut self, leaf: u64, roots: &[u64]) {
        if roots.len() > KERNEL_CACHE_ROOTS || self.entries.iter().any(|e| e.0 == leaf) {
            return;
        }
        if self.entries.len() >= KERNEL_CACHE_SIZE {
            self.entries.remove(0);
        }
        self.entries.push((leaf, roots.to_vec()));
    }
}

/// The back-reference walk of one extent, as `iterate_extent_inodes` meets
/// its items.
#[derive(Debug, Clone, Default)]
pub(crate) struct Walk {
    /// The leaves in their merged order (`ctx->refs`), each with its items.
    pub leaves: Vec<LeafRefs>,
    /// The items of indirect references in the order they are resolved
    /// (index into `leaves`).
    pub resolved: Vec<(usize, Elem)>,
    /// The leaves of shared references (index into `leaves`), in the order
    /// they are read; their items are met in forward slot order there, the
    /// reverse of `leaves[i].elems`.
    pub shared: Vec<usize>,
}

/// One referencing file extent item (`struct extent_inode_elem`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Elem {
    pub ino: u64,
    /// File offset of the position the walk asked for (the item's key
    /// offset plus the distance into the extent).
    pub offset: u64,
    pub num_bytes: u64,
}

/// The referencing items of one leaf.
#[derive(Debug, Clone)]
pub(crate) struct LeafRefs {
    pub leaf: u64,
    pub first_key: Key,
    pub elems: Vec<Elem>,
}

/// A preliminary reference after resolution (`struct prelim_ref` in the
/// direct tree).
struct Prelim {
    root: u64,
    ino: u64,
    base: u64,
    leaf: u64,
    first_key: Key,
    /// Each item with its place in the resolution of its reference.
    elems: Vec<(usize, Elem)>,
}

/// Resolves references to leaves and leaves to clone roots, with caches.
pub(crate) struct Backrefs<'a> {
    fs: &'a Filesystem,
    /// The extent tree: the extents' references, and the generations of
    /// the leaves shared references name.
    pub extents: ExtentTreeReader<'a>,
    /// Tree roots by id (`None`: the root is gone).
    trees: HashMap<u64, Option<TreeRoot>>,
    /// Leaf → the clone roots reaching it, descending.
    leaf_roots: HashMap<u64, Vec<u64>>,
}

impl<'a> Backrefs<'a> {
    pub fn new(fs: &'a Filesystem, extents: ExtentTreeReader<'a>) -> Backrefs<'a> {
        Backrefs {
            fs,
            extents,
            trees: HashMap::new(),
            leaf_roots: HashMap::new(),
        }
    }

    fn tree(&mut self, id: u64) -> Result<Option<TreeRoot>, SendError> {
        if let Some(t) = self.trees.get(&id) {
            return Ok(*t);
        }
        let t = self.fs.root_item(TreeId(id))?.map(|r| r.tree_root());
        self.trees.insert(id, t);
        Ok(t)
    }

    /// The walk of the leaves referencing `disk_bytenr` with their items,
    /// in the kernel's orders. `pos` is the position in the extent the walk
    /// asks for (uncompressed extents: only items covering it count);
    /// `skip` drops a data reference (root, inode, base) unresolved.
    pub fn walk(
        &mut self,
        refs: &ExtentRecord,
        disk_bytenr: u64,
        pos: Option<u64>,
        skip: impl Fn(u64, u64, u64) -> bool,
    ) -> Result<Walk, SendError> {
        let mut prelims = Vec::new();
        for r in &refs.data_refs {
            let (root, ino, base, count) = (r.root, r.objectid, r.offset, r.count);
            if skip(root, ino, base) {
                continue;
            }
            let Some(tree) = self.tree(root)? else {
                continue;
            };
            self.resolve(
                tree,
                root,
                ino,
                base,
                count,
                disk_bytenr,
                pos,
                refs,
                &mut prelims,
            )?;
        }
        for &leaf in &refs.shared {
            if let Some((first_key, elems)) = self.shared_leaf(leaf, disk_bytenr, pos)? {
                prelims.push(Prelim {
                    root: 0,
                    ino: 0,
                    base: 0,
                    leaf,
                    first_key,
                    elems: elems.into_iter().map(|e| (0, e)).collect(),
                });
            }
        }
        prelims.sort_by_key(|p| std::cmp::Reverse((p.root, p.ino, p.base, p.leaf)));
        let mut walk = Walk::default();
        // Resolution order: the references descending (the indirect tree),
        // each one's items in tree order: ((root, inode, base) descending,
        // place in its resolution) → (leaf, item).
        type Order = (std::cmp::Reverse<(u64, u64, u64)>, usize);
        let mut resolved: Vec<(Order, (usize, Elem))> = Vec::new();
        for p in prelims {
            let i = match walk.leaves.iter().position(|l| l.leaf == p.leaf) {
                Some(i) => i,
                None => {
                    walk.leaves.push(LeafRefs {
                        leaf: p.leaf,
                        first_key: p.first_key,
                        elems: Vec::new(),
                    });
                    walk.leaves.len() - 1
                }
            };
            if p.root == 0 {
                walk.shared.push(i);
            } else {
                let key = std::cmp::Reverse((p.root, p.ino, p.base));
                resolved.extend(p.elems.iter().map(|&(seq, e)| ((key, seq), (i, e))));
            }
            let l = &mut walk.leaves[i];
            l.elems.extend(p.elems.into_iter().map(|(_, e)| e));
        }
        resolved.sort_by_key(|r| r.0);
        walk.resolved = resolved.into_iter().map(|r| r.1).collect();
        Ok(walk)
    }

    /// `resolve_indirect_ref` + `add_all_parents` of one data reference.
    #[allow(clippy::too_many_arguments)]
    fn resolve(
        &mut self,
        tree: TreeRoot,
        root: u64,
        ino: u64,
        base: u64,
        count: u64,
        disk_bytenr: u64,
        pos: Option<u64>,
        refs: &ExtentRecord,
        prelims: &mut Vec<Prelim>,
    ) -> Result<(), SendError> {
        // An offset that wrapped below zero is searched from the start.
        let from = if base >= i64::MAX as u64 { 0 } else { base };
        let mut c = Cursor::new(self.fs.volume(), tree);
        c.seek(&Key::new(ino, ondisk::BTRFS_EXTENT_DATA_KEY, from))?;
        let mut matched = 0;
        let mut checked_leaf = None;
        while matched < count {
            let Some(leaf) = c.leaf() else { break };
            let (leaf_addr, owner) = (leaf.logical().get(), leaf.node().owner().get());
            let first_key = leaf.node().key(0);
            if checked_leaf != Some(leaf_addr) {
                checked_leaf = Some(leaf_addr);
                if owner != root || refs.shared.binary_search(&leaf_addr).is_ok() {
                    if !c.next_leaf()? {
                        break;
                    }
                    continue;
                }
            }
            let Some(item) = c.current() else { break };
            if item.key.objectid != ino || item.key.item_type != ondisk::BTRFS_EXTENT_DATA_KEY {
                break;
            }
            let fe = FileExtent::parse(&item)?;
            if let Some(d) = fe.disk()
                && d.disk_bytenr.get() == disk_bytenr
                && item.key.offset.wrapping_sub(d.offset) == base
            {
                matched += 1;
                if let Some(elem) =
                    in_extent(item.key.offset, fe.compression, d.offset, d.num_bytes, pos)
                    && let Some(first_key) = first_key
                {
                    let seq = matched as usize;
                    match prelims.iter_mut().find(|p| {
                        p.root == root && p.ino == ino && p.base == base && p.leaf == leaf_addr
                    }) {
                        Some(p) => p.elems.push((seq, elem(ino))),
                        None => prelims.push(Prelim {
                            root,
                            ino,
                            base,
                            leaf: leaf_addr,
                            first_key,
                            elems: vec![(seq, elem(ino))],
                        }),
                    }
                }
            }
            if !c.advance()? {
                break;
            }
        }
        Ok(())
    }

    /// The items of a shared leaf referencing the extent, in reverse slot
    /// order (`find_extent_in_eb`).
    fn shared_leaf(
        &mut self,
        leaf: u64,
        disk_bytenr: u64,
        pos: Option<u64>,
    ) -> Result<Option<(Key, Vec<Elem>)>, SendError> {
        let Some(generation) = self.extents.tree_block_generation(leaf)? else {
            return Ok(None);
        };
        let block = self.fs.volume().read_block(&BlockExpect {
            logical: Logical(leaf),
            tree: TreeId(ondisk::BTRFS_FS_TREE_OBJECTID),
            generation: Generation(generation),
            level: 0,
            first_key: None,
        })?;
        let node = block.node();
        let Some(first_key) = node.key(0) else {
            return Ok(None);
        };
        let mut elems = Vec::new();
        for slot in 0..node.nritems() {
            let Some(it) = node.item(slot) else { break };
            if it.key.item_type != ondisk::BTRFS_EXTENT_DATA_KEY {
                continue;
            }
            let item = crate::tree::walk::ItemRef {
                key: it.key,
                data: it.data,
                leaf: Logical(leaf),
                slot: u32::try_from(slot).unwrap_or(u32::MAX),
                tree: TreeId(ondisk::BTRFS_FS_TREE_OBJECTID),
                block: None,
            };
            let fe = FileExtent::parse(&item)?;
            if let Some(d) = fe.disk()
                && d.disk_bytenr.get() == disk_bytenr
                && let Some(elem) =
                    in_extent(it.key.offset, fe.compression, d.offset, d.num_bytes, pos)
            {
                elems.insert(0, elem(it.key.objectid));
            }
        }
        Ok(Some((first_key, elems)))
    }

    /// The clone roots (ids, ascending in `clone_roots`) whose tree holds
    /// `leaf` (searched by `leaf.first_key`, or any other key in the leaf),
    /// in descending id.
    pub fn roots_of(
        &mut self,
        leaf: &LeafRefs,
        clone_roots: &[(u64, TreeRoot)],
    ) -> Result<Vec<u64>, SendError> {
        if let Some(r) = self.leaf_roots.get(&leaf.leaf) {
            return Ok(r.clone());
        }
        let mut roots = Vec::new();
        for &(id, tree) in clone_roots.iter().rev() {
            let mut c = Cursor::new(self.fs.volume(), tree);
            c.seek(&leaf.first_key)?;
            if c.leaf().is_some_and(|l| l.logical().get() == leaf.leaf) {
                roots.push(id);
            }
        }
        if self.leaf_roots.len() >= LEAF_ROOTS_CACHE_MAX {
            self.leaf_roots.clear();
        }
        self.leaf_roots.insert(leaf.leaf, roots.clone());
        Ok(roots)
    }
}

/// `check_extent_in_eb`: for an uncompressed item, only if it covers the
/// position `pos` of the extent (then the offset is moved there).
fn in_extent(
    key_offset: u64,
    compression: Compression,
    eoff: u64,
    num_bytes: u64,
    pos: Option<u64>,
) -> Option<impl Fn(u64) -> Elem> {
    let mut offset = key_offset;
    if compression == Compression::None {
        let pos = pos.unwrap_or(0);
        if pos < eoff || pos >= eoff.saturating_add(num_bytes) {
            return None;
        }
        offset = offset.saturating_add(pos - eoff);
    }
    Some(move |ino| Elem {
        ino,
        offset,
        num_bytes,
    })
}
