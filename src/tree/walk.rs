//! Walking a tree in key order: a cursor (search, next item, next leaf) over
//! any [`BlockSource`].
//!
//! The walker never reads devices itself: it asks its `BlockSource` for a
//! validated block described by a [`BlockExpect`] (address, generation and
//! level from the parent pointer, the first key).
//!
//! Readahead is forward-always: once a cursor scans (it steps out of the
//! leaf a [`seek`](Cursor::seek) found; a lone seek or [`find`](Cursor::find),
//! or a short range within one leaf — the many small lookups of an
//! incremental send — asks for nothing more), every step to a
//! new leaf tells the source, through [`BlockSource::will_need`], the next
//! [`readahead_window`](BlockSource::readahead_window) children after the
//! path's slot at every level of the path — the leaves that follow, then
//! the following nodes above them — whether or not the blocks it needed
//! just now were cached. When a window runs past the end of its node, it
//! continues into the next sibling node if that one is already cached
//! ([`BlockSource::cached`]), so a walk does not stall at node boundaries.
//! Each level remembers how far it has asked, so a step announces only the
//! blocks that entered the window. The window of a scan starts at 2 and
//! doubles at every leaf step up to the source's, as the kernel's page
//! readahead ramps up: a short range that crosses a leaf boundary asks
//! for a few blocks, a long scan soon for the whole window.

#![warn(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::as_conversions
)]

use std::sync::Arc;

use crate::error::{CorruptKind, Error, Location, Result};
use crate::tree::buf::BlockBuf;
use crate::tree::check::BlockExpect;
use crate::tree::key::Key;
use crate::tree::node::{LeafItem, TreeBlock};
use crate::types::{Generation, Logical, TreeId, len64};

/// Where the walker gets blocks from.
pub trait BlockSource {
    /// Read and validate the block `expect` describes, trying every mirror.
    ///
    /// # Errors
    ///
    /// The error of the first copy when no copy is valid.
    fn read_block(&self, expect: &BlockExpect) -> Result<TreeBlock>;

    /// A hint: these blocks will be read soon, in this order. The default
    /// ignores it.
    fn will_need(&self, _upcoming: &[BlockExpect]) {}

    /// How many blocks ahead per tree level the walker should announce
    /// through [`will_need`](Self::will_need); 0 (the default) turns
    /// readahead hints off.
    fn readahead_window(&self) -> usize {
        0
    }

    /// The block, if the source already holds it (no read, no wait). The
    /// walker peeks at the next sibling node to carry a window across node
    /// boundaries; the default holds nothing.
    fn cached(&self, _expect: &BlockExpect) -> Option<TreeBlock> {
        None
    }
}

impl<S: BlockSource + ?Sized> BlockSource for &S {
    fn read_block(&self, expect: &BlockExpect) -> Result<TreeBlock> {
        (**self).read_block(expect)
    }

    fn will_need(&self, upcoming: &[BlockExpect]) {
        (**self).will_need(upcoming);
    }

    fn readahead_window(&self) -> usize {
        (**self).readahead_window()
    }

    fn cached(&self, expect: &BlockExpect) -> Option<TreeBlock> {
        (**self).cached(expect)
    }
}

/// The root of a tree: where a walk starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeRoot {
    /// The tree id (for owner checks and messages).
    pub tree: TreeId,
    /// Logical address of the root node.
    pub logical: Logical,
    /// Its level.
    pub level: u8,
    /// Its generation.
    pub generation: Generation,
}

impl TreeRoot {
    /// What the root block must be.
    pub fn expect(&self) -> BlockExpect {
        BlockExpect {
            logical: self.logical,
            tree: self.tree,
            generation: self.generation,
            level: self.level,
            first_key: None,
        }
    }
}

/// One item under the cursor, with where it lives (for error locations).
#[derive(Debug, Clone, Copy)]
pub struct ItemRef<'a> {
    /// The key.
    pub key: Key,
    /// The item data.
    pub data: &'a [u8],
    /// The leaf holding it.
    pub leaf: Logical,
    /// Its slot in the leaf.
    pub slot: u32,
    /// The tree.
    pub tree: TreeId,
    /// The leaf's bytes, when the item's data is a slice of them (values
    /// that hold on to a part of the item, such as inline file data, may
    /// keep the block instead of copying).
    pub block: Option<&'a Arc<BlockBuf>>,
}

impl ItemRef<'_> {
    /// The item's location, for errors.
    pub fn location(&self) -> Location {
        Location::Item {
            leaf: self.leaf,
            tree: self.tree,
            slot: self.slot,
            key: self.key,
        }
    }

    /// The error for an item shorter than the `needed` bytes that `what`
    /// takes.
    pub fn truncated(&self, what: &'static str, needed: usize) -> Error {
        self.record_truncated(what, needed, self.data.len())
    }

    /// The error for a record inside the item (a name, a packed entry) of
    /// which only `available` of the `needed` bytes are left.
    pub fn record_truncated(&self, what: &'static str, needed: usize, available: usize) -> Error {
        Error::corrupt(
            self.location(),
            CorruptKind::Truncated {
                what,
                needed: len64(needed),
                available: len64(available),
            },
        )
    }
}

/// A position in a tree: the path of (block, slot) from the root to a leaf.
#[derive(Debug)]
pub struct Cursor<S> {
    source: S,
    root: TreeRoot,
    /// `path[0]` is the root; the last entry is the leaf.
    path: Vec<(TreeBlock, usize)>,
    /// Whether the cursor scans forward (readahead on).
    scanning: bool,
    /// Whether [`seek_near`](Self::seek_near)'s steps read ahead as a scan
    /// does (see [`point_lookups`](Self::point_lookups)).
    step_readahead: bool,
    /// The last reposition of a [`point_lookups`](Self::point_lookups)
    /// cursor was a step to the next leaf: one more makes it a scan.
    stepped_last: bool,
    /// The readahead window of this scan so far: it starts small and
    /// doubles at every leaf step up to the source's window, so that a
    /// short range crossing a leaf boundary does not announce a whole
    /// window of blocks it never reads.
    ramp: usize,
    /// Per path level: up to which slot of that node the children were
    /// announced.
    announced: Vec<Option<Announced>>,
    /// Per path level: the same for the node after that level's node,
    /// entered when the window ran past its end.
    announced_next: Vec<Option<Announced>>,
    /// What is known of the items before the current leaf (for
    /// [`seek_near`](Self::seek_near)).
    floor: Option<Floor>,
}

/// A bound on the keys of every item before the current leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Floor {
    /// All are smaller than this key (the cursor was sought with it).
    Under(Key),
    /// None is greater than this key (the last key of the leaf the cursor
    /// stepped out of).
    AtMost(Key),
}

/// How [`Cursor::seek_near`] reached its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reposition {
    /// The key is in the leaf under the cursor: a binary search in it.
    InLeaf,
    /// This many steps to the following leaves (with readahead), then a
    /// binary search in the last.
    Forward(usize),
    /// A search from the node at this depth of the path (0 is the root),
    /// the deepest whose subtree holds the key: the key is behind the
    /// current leaf or far ahead, in a part of the tree under that node.
    Subtree(usize),
    /// A search from the root (the key is outside every subtree of the
    /// path below the root, or the cursor was not positioned).
    Root,
}

/// The first readahead window of a scan (see `Cursor::ramp`).
const RAMP_START: usize = 2;

/// Children `..upto` of the node at `node` have been announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Announced {
    node: Logical,
    upto: usize,
}

fn child_expect(parent: &TreeBlock, slot: usize) -> Option<BlockExpect> {
    let node = parent.node();
    let ptr = node.ptr(slot)?;
    Some(BlockExpect {
        logical: ptr.blockptr,
        tree: parent.tree(),
        generation: ptr.generation,
        level: node.level().checked_sub(1)?,
        first_key: Some(ptr.key),
    })
}

impl<S: BlockSource> Cursor<S> {
    /// A cursor over the tree at `root`, not yet positioned.
    pub fn new(source: S, root: TreeRoot) -> Cursor<S> {
        Cursor {
            source,
            root,
            path: Vec::new(),
            scanning: false,
            step_readahead: true,
            stepped_last: false,
            ramp: 0,
            announced: Vec::new(),
            announced_next: Vec::new(),
            floor: None,
        }
    }

    /// This cursor for point lookups that skip most of the tree (an
    /// incremental send's planner follows the changes, which the
    /// comparison finds in leaves the snapshots do not share):
    /// [`seek_near`](Self::seek_near) then reaches a key in the next leaf by
    /// a step without readahead, and any farther one by a search down from
    /// the node of its path that holds it, so a lookup reads only the leaf
    /// that holds its key; lookups that step to the next leaf twice in a
    /// row are a scan and read ahead as one. With a scan's readahead, measured on 2026-11-29
    /// (benches/vs-kernel inc5k: 5,000 changes in 500k files), such
    /// lookups announced 19,184 blocks of which 16,833 were never read by
    /// anyone: half the blocks the send read. A scan after the lookup
    /// ([`advance`](Self::advance) across leaves) still reads ahead.
    pub fn point_lookups(mut self) -> Cursor<S> {
        self.step_readahead = false;
        self
    }

    /// The tree's root.
    pub fn root(&self) -> &TreeRoot {
        &self.root
    }

    /// The block source.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// Announce what a forward scan reads next: at every internal level of
    /// the path, the window of children after the path's slot, deepest
    /// level (the next leaves) first.
    fn readahead(&mut self) {
        let max = self.source.readahead_window();
        let depth = self.path.len();
        if max == 0 || depth < 2 {
            return;
        }
        self.ramp = if self.ramp == 0 {
            RAMP_START
        } else {
            self.ramp.saturating_mul(2)
        }
        .min(max);
        let window = self.ramp;
        self.announced.resize(depth, None);
        self.announced_next.resize(depth, None);
        let mut upcoming = Vec::new();
        // Internal levels, deepest first.
        for i in (0..depth.saturating_sub(1)).rev() {
            let Some((node, slot)) = self.path.get(i) else {
                continue;
            };
            let nritems = node.node().nritems();
            let from = slot.saturating_add(1);
            let want = from.saturating_add(window);
            let here = node.logical();
            // Continue where this level stopped: in this node, or in the
            // node that was "next" when the window last ran past the end.
            let done = match (
                self.announced.get(i).copied().flatten(),
                self.announced_next.get(i).copied().flatten(),
            ) {
                (Some(a), _) if a.node == here => a.upto,
                (_, Some(a)) if a.node == here => a.upto,
                _ => 0,
            };
            let start = done.max(from);
            let end = want.min(nritems);
            upcoming.extend((start..end).filter_map(|s| child_expect(node, s)));
            if let Some(a) = self.announced.get_mut(i) {
                *a = Some(Announced {
                    node: here,
                    upto: start.max(end),
                });
            }
            // The window runs past this node: go on into the next one if
            // it is cached (its pointer is the parent's next slot).
            let over = want.saturating_sub(nritems);
            if over == 0 || i == 0 {
                continue;
            }
            let next = i
                .checked_sub(1)
                .and_then(|p| self.path.get(p))
                .and_then(|(parent, pslot)| child_expect(parent, pslot.saturating_add(1)))
                .and_then(|e| self.source.cached(&e));
            if let Some(next) = next {
                let there = next.logical();
                let done = match self.announced_next.get(i).copied().flatten() {
                    Some(a) if a.node == there => a.upto,
                    _ => 0,
                };
                let end = over.min(next.node().nritems());
                upcoming.extend((done..end).filter_map(|s| child_expect(&next, s)));
                if let Some(a) = self.announced_next.get_mut(i) {
                    *a = Some(Announced {
                        node: there,
                        upto: done.max(end),
                    });
                }
            }
        }
        if !upcoming.is_empty() {
            self.source.will_need(&upcoming);
        }
    }

    /// Descend from the block on top of the path to a leaf, always taking
    /// the slot `pick` chooses.
    fn descend(&mut self, pick: impl Fn(&TreeBlock) -> usize) -> Result<()> {
        loop {
            let Some((top, slot)) = self.path.last() else {
                return Ok(());
            };
            if top.node().is_leaf() {
                return Ok(());
            }
            let Some(expect) = child_expect(top, *slot) else {
                return Ok(());
            };
            let child = self.source.read_block(&expect)?;
            let slot = pick(&child);
            self.path.push((child, slot));
        }
    }

    /// Position at the first item with key ≥ `key` (possibly past the end:
    /// then [`current`](Self::current) is `None`).
    ///
    /// # Errors
    ///
    /// Block read errors.
    pub fn seek(&mut self, key: &Key) -> Result<()> {
        self.path.clear();
        let root = self.source.read_block(&self.root.expect())?;
        self.path.push((root, 0));
        self.search_down(key)
    }

    /// Search `key` from the node on top of the path (the path above it
    /// stays: its subtree must hold every item ≥ `key` that precedes the
    /// next subtree of the path, as the root's does).
    fn search_down(&mut self, key: &Key) -> Result<()> {
        self.reset_scan();
        self.stepped_last = false;
        self.floor = None;
        let pick = |b: &TreeBlock| {
            let node = b.node();
            match node.search(key) {
                Ok(slot) => slot,
                // In a node: the last pointer whose key ≤ `key` (slot 0 if
                // `key` is smaller than all). In a leaf: the insert position.
                Err(slot) if node.is_leaf() => slot,
                Err(slot) => slot.saturating_sub(1),
            }
        };
        if let Some((top, slot)) = self.path.last_mut() {
            *slot = pick(top);
        }
        self.descend(pick)?;
        // Every item before the slot found, so before the leaf, is smaller.
        self.floor = Some(Floor::Under(*key));
        if self.leaf_exhausted() {
            self.next_leaf()?;
        }
        Ok(())
    }

    /// The deepest internal node of the path whose subtree holds `key`'s
    /// place: at or after the pointer that leads to it, before the pointer
    /// after that one (or, for a last child, before its parent's bound).
    /// Every item before the subtree is then smaller than `key`, and every
    /// item after it larger. `None` when only the root's does.
    fn covering_level(&self, key: &Key) -> Option<usize> {
        let internal = self.path.len().checked_sub(1)?;
        let mut best = None;
        // The upper bound of the subtree at the current level (None: none).
        let mut high: Option<Key> = None;
        for i in 1..internal {
            let (parent, slot) = self.path.get(i.checked_sub(1)?)?;
            let node = parent.node();
            let low = node.key(*slot)?;
            if let Some(next) = node.key(slot.saturating_add(1)) {
                high = Some(next);
            }
            if *key < low || high.is_some_and(|h| *key >= h) {
                break;
            }
            best = Some(i);
        }
        best
    }

    /// Position at the first item with key ≥ `key`, as
    /// [`seek`](Self::seek) does, but from where the cursor is: a key in
    /// the current leaf is a binary search in it; a key at most
    /// `max_leaves` leaves further on (as far as the leaf's parent node
    /// tells) is reached by stepping forward leaf by leaf, as a scan does
    /// (with its readahead); any other key — behind the leaf, farther
    /// ahead, or past a step that did not reach it — is searched from the
    /// deepest node of the path whose subtree holds it, else from the
    /// root. For many lookups in mostly ascending key order, or within a
    /// part of the tree.
    ///
    /// # Errors
    ///
    /// Block read errors.
    pub fn seek_near(&mut self, key: &Key, max_leaves: usize) -> Result<Reposition> {
        let mut steps = 0usize;
        while let Some((leaf, _)) = self.path.last() {
            let node = leaf.node();
            let last = node.nritems().checked_sub(1).and_then(|i| node.key(i));
            let (Some(first), Some(last)) = (node.key(0), last) else {
                break;
            };
            // A key before the leaf's first one is still answered here
            // when every item before the leaf is known to be smaller.
            let after_floor = match self.floor {
                Some(Floor::Under(k)) => *key >= k,
                Some(Floor::AtMost(k)) => *key > k,
                None => false,
            };
            let slot = if *key <= last && (*key >= first || after_floor) {
                match node.search(key) {
                    Ok(slot) | Err(slot) => Some(slot),
                }
            } else {
                None
            };
            if let Some(slot) = slot {
                if let Some((_, s)) = self.path.last_mut() {
                    *s = slot;
                }
                return Ok(if steps == 0 {
                    Reposition::InLeaf
                } else {
                    Reposition::Forward(steps)
                });
            }
            // Behind the leaf, or ahead and out of reach: search down.
            let near = if self.step_readahead {
                steps < max_leaves && self.within(key, max_leaves.saturating_sub(steps))
            } else {
                // A point lookup steps only into the next leaf of the same
                // parent; past the parent's last child, a step could read
                // a leaf of the next node that does not hold the key.
                steps == 0 && self.in_next_sibling(key)
            };
            if *key <= last || !near {
                break;
            }
            steps = steps.saturating_add(1);
            // Lookups that step from leaf to leaf are a scan: read ahead.
            let stepped = if self.step_readahead || self.stepped_last {
                self.next_leaf()?
            } else {
                self.step_quietly()?
            };
            self.stepped_last = true;
            if !stepped {
                // Past the last leaf: no item ≥ `key`, as a seek finds.
                return Ok(Reposition::Forward(steps));
            }
        }
        match self.covering_level(key) {
            Some(level) => {
                self.path.truncate(level.saturating_add(1));
                self.search_down(key)?;
                Ok(Reposition::Subtree(level))
            }
            None => {
                self.seek(key)?;
                Ok(Reposition::Root)
            }
        }
    }

    /// Whether the parent of the current leaf does not rule out that `key`
    /// lies at most `leaves` leaves further on: the last child whose first
    /// key is ≤ `key` is at most that far (a key past the parent's last
    /// child may lie in the next node: only a step tells).
    fn within(&self, key: &Key, leaves: usize) -> bool {
        self.sibling_of(key)
            .is_none_or(|(child, slot, _)| child <= slot.saturating_add(leaves))
    }

    /// Whether `key` lies in the leaf after the current one, in the same
    /// parent node (as far as the parent tells).
    fn in_next_sibling(&self, key: &Key) -> bool {
        self.sibling_of(key).is_some_and(|(child, slot, nritems)| {
            let next = slot.saturating_add(1);
            child == next && next.saturating_add(1) < nritems
        })
    }

    /// In the parent of the current leaf: the child whose subtree holds
    /// `key`'s place, the current leaf's slot, and the parent's item
    /// count. `None` when the leaf is the root.
    fn sibling_of(&self, key: &Key) -> Option<(usize, usize, usize)> {
        let (parent, slot) = self.path.get(self.path.len().checked_sub(2)?)?;
        let node = parent.node();
        let child = match node.search(key) {
            Ok(c) => c,
            Err(c) => c.saturating_sub(1),
        };
        Some((child, *slot, node.nritems()))
    }

    fn leaf_exhausted(&self) -> bool {
        self.path
            .last()
            .is_none_or(|(leaf, slot)| *slot >= leaf.node().nritems())
    }

    /// The leaf under the cursor.
    pub fn leaf(&self) -> Option<&TreeBlock> {
        self.path.last().map(|(leaf, _)| leaf)
    }

    /// The item under the cursor.
    pub fn current(&self) -> Option<ItemRef<'_>> {
        let (leaf, slot) = self.path.last()?;
        let LeafItem { key, data } = leaf.node().item(*slot)?;
        Some(ItemRef {
            key,
            data,
            leaf: leaf.logical(),
            slot: u32::try_from(*slot).ok()?,
            tree: self.root.tree,
            block: Some(leaf.bytes()),
        })
    }

    /// Step to the next item; `false` at the end of the tree.
    ///
    /// # Errors
    ///
    /// Block read errors.
    pub fn advance(&mut self) -> Result<bool> {
        let Some((_, slot)) = self.path.last_mut() else {
            return Ok(false);
        };
        *slot = slot.saturating_add(1);
        if self.leaf_exhausted() {
            return self.next_leaf();
        }
        Ok(true)
    }

    /// Move to the first item of the next leaf; `false` (and no current
    /// item) at the end of the tree.
    ///
    /// # Errors
    ///
    /// Block read errors.
    pub fn next_leaf(&mut self) -> Result<bool> {
        self.step(true)
    }

    /// [`next_leaf`](Self::next_leaf) without readahead, for a point
    /// lookup: the scan state is left as a search leaves it, so a scan
    /// that follows starts its readahead from the smallest window.
    fn step_quietly(&mut self) -> Result<bool> {
        let stepped = self.step(false)?;
        self.reset_scan();
        Ok(stepped)
    }

    /// Forget the readahead of a scan: the next scan starts from the
    /// smallest window.
    fn reset_scan(&mut self) {
        self.scanning = false;
        self.ramp = 0;
        self.announced.clear();
        self.announced_next.clear();
    }

    fn step(&mut self, readahead: bool) -> Result<bool> {
        if readahead && !self.scanning {
            // The first step out of the leaf a seek found: from here on,
            // read ahead, starting with the leaf about to be read.
            self.scanning = true;
            self.readahead();
        }
        let left = self.path.last().and_then(|(leaf, _)| {
            let node = leaf.node();
            node.nritems().checked_sub(1).and_then(|i| node.key(i))
        });
        self.floor = None;
        // Climb until a node has a next pointer.
        loop {
            self.path.pop();
            let Some((node, slot)) = self.path.last_mut() else {
                return Ok(false);
            };
            let next = slot.saturating_add(1);
            if next < node.node().nritems() {
                *slot = next;
                break;
            }
        }
        self.descend(|_| 0)?;
        if self.leaf_exhausted() {
            // Only an empty root leaf can get here.
            self.path.clear();
            return Ok(false);
        }
        // Every item before the new leaf is at most the last one of the
        // leaf stepped out of.
        self.floor = left.map(Floor::AtMost);
        if readahead {
            self.scanning = true;
            self.readahead();
        }
        Ok(true)
    }

    /// The next item with key ≤ `last`, starting at the current one on the
    /// first call after [`seek`](Self::seek): use as
    /// `cursor.seek(&first)?; while let Some(item) = cursor.next_until(&last, &mut started)? {…}`.
    ///
    /// # Errors
    ///
    /// Block read errors.
    pub fn next_until(&mut self, last: &Key, started: &mut bool) -> Result<Option<ItemRef<'_>>> {
        if *started {
            if !self.advance()? {
                return Ok(None);
            }
        } else {
            *started = true;
        }
        Ok(self.current().filter(|item| item.key <= *last))
    }

    /// The item with exactly this key.
    ///
    /// # Errors
    ///
    /// Block read errors.
    pub fn find(&mut self, key: &Key) -> Result<Option<ItemRef<'_>>> {
        self.seek(key)?;
        Ok(self.current().filter(|item| item.key == *key))
    }
}

/// Call `f` for every item with `first ≤ key ≤ last`, in key order.
///
/// # Errors
///
/// Block read errors, or the first error `f` returns.
pub fn for_each_in_range<S: BlockSource>(
    source: S,
    root: TreeRoot,
    first: &Key,
    last: &Key,
    mut f: impl FnMut(ItemRef<'_>) -> Result<()>,
) -> Result<()> {
    let mut cursor = Cursor::new(source, root);
    cursor.seek(first)?;
    let mut started = false;
    while let Some(item) = cursor.next_until(last, &mut started)? {
        f(item)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The cursor on a kernel-made image (fixture 002: 1000+ inodes, so
    //! the fs trees have several leaves and levels). The expected positions
    //! come from one forward scan of the whole tree (every key, in order),
    //! not from the cursor's own searches.
    #![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

    use super::*;
    use crate::fs::Filesystem;
    use crate::ondisk;

    fn open_fixture(dir: &tempfile::TempDir) -> Filesystem {
        let zst = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/002-many-files/dev1.img.zst");
        let img = dir.path().join("dev1.img");
        let mut dec = zstd::stream::read::Decoder::new(std::fs::File::open(zst).unwrap()).unwrap();
        std::io::copy(&mut dec, &mut std::fs::File::create(&img).unwrap()).unwrap();
        Filesystem::open(&[&img]).unwrap()
    }

    /// The biggest subvolume tree of the image and every key in it, by a
    /// scan with `advance`.
    fn biggest_tree(fs: &Filesystem) -> (TreeRoot, Vec<Key>) {
        let mut best: Option<(TreeRoot, Vec<Key>)> = None;
        for id in [ondisk::BTRFS_FS_TREE_OBJECTID, 256, 257, 258, 259, 260] {
            let Ok(root) = fs.tree_root(TreeId(id)) else {
                continue;
            };
            let mut keys = Vec::new();
            for_each_in_range(fs.volume(), root, &Key::MIN, &Key::MAX, |item| {
                keys.push(item.key);
                Ok(())
            })
            .unwrap();
            if best.as_ref().is_none_or(|(_, k)| keys.len() > k.len()) {
                best = Some((root, keys));
            }
        }
        best.unwrap()
    }

    /// Keys around every item: the item's own, one just below, one just
    /// above (other item types and offsets), in a deterministic shuffle.
    fn probes(keys: &[Key]) -> Vec<Key> {
        let mut out = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            if i % 7 != 0 {
                continue;
            }
            out.push(*k);
            out.push(Key::new(k.objectid, k.item_type, k.offset.wrapping_add(1)));
            out.push(Key::new(k.objectid, k.item_type.wrapping_sub(1), u64::MAX));
        }
        out.push(Key::MIN);
        out.push(Key::MAX);
        out
    }

    fn first_at_or_after(keys: &[Key], key: &Key) -> Option<Key> {
        keys.get(keys.partition_point(|k| k < key)).copied()
    }

    #[test]
    fn seek_finds_the_first_item_at_or_after_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let fs = open_fixture(&dir);
        let (root, keys) = biggest_tree(&fs);
        assert!(keys.len() > 1000, "{} items", keys.len());
        let mut c = Cursor::new(fs.volume(), root);
        for key in probes(&keys) {
            c.seek(&key).unwrap();
            assert_eq!(c.current().map(|i| i.key), first_at_or_after(&keys, &key));
            let found = Cursor::new(fs.volume(), root)
                .find(&key)
                .unwrap()
                .map(|i| i.key);
            assert_eq!(found, keys.binary_search(&key).ok().map(|_| key));
        }
    }

    /// Counts the blocks read and announced.
    struct Counting<'a> {
        inner: &'a crate::volume::Volume,
        read: std::cell::RefCell<Vec<Logical>>,
        announced: std::cell::RefCell<Vec<Logical>>,
    }

    impl BlockSource for &Counting<'_> {
        fn read_block(&self, expect: &BlockExpect) -> Result<TreeBlock> {
            self.read.borrow_mut().push(expect.logical);
            self.inner.read_block(expect)
        }
        fn will_need(&self, upcoming: &[BlockExpect]) {
            self.announced
                .borrow_mut()
                .extend(upcoming.iter().map(|e| e.logical));
        }
        fn readahead_window(&self) -> usize {
            64
        }
    }

    /// A point-lookup cursor reads the leaf of each key and the nodes above
    /// it, nothing between, and announces nothing while its lookups skip
    /// leaves; lookups in every leaf in turn are a scan and read ahead.
    #[test]
    fn point_lookups_read_only_the_leaves_of_their_keys() {
        let dir = tempfile::tempdir().unwrap();
        let fs = open_fixture(&dir);
        let (root, _) = biggest_tree(&fs);
        // The first key and address of every leaf, in key order.
        let mut leaves: Vec<(Key, Logical)> = Vec::new();
        for_each_in_range(fs.volume(), root, &Key::MIN, &Key::MAX, |item| {
            if leaves.last().is_none_or(|(_, l)| *l != item.leaf) {
                leaves.push((item.key, item.leaf));
            }
            Ok(())
        })
        .unwrap();
        assert!(leaves.len() > 20, "{} leaves", leaves.len());
        let counting = Counting {
            inner: fs.volume(),
            read: Default::default(),
            announced: Default::default(),
        };
        // Every third leaf: lookups skip two leaves each time.
        let mut c = Cursor::new(&counting, root).point_lookups();
        let wanted: Vec<_> = leaves.iter().step_by(3).collect();
        for (key, leaf) in &wanted {
            c.seek_near(key, 4).unwrap();
            assert_eq!(c.current().map(|i| (i.key, i.leaf)), Some((*key, *leaf)));
        }
        let read = counting.read.borrow().clone();
        let all: std::collections::HashSet<_> = leaves.iter().map(|(_, l)| *l).collect();
        let leaves_read: Vec<_> = read.iter().filter(|l| all.contains(l)).copied().collect();
        let expected: Vec<_> = wanted.iter().map(|(_, l)| *l).collect();
        let first_diff = leaves_read.iter().zip(&expected).position(|(a, b)| a != b);
        assert!(
            leaves_read == expected,
            "{} leaves read, {} wanted, first difference at {first_diff:?}",
            leaves_read.len(),
            expected.len()
        );
        assert!(counting.announced.borrow().is_empty(), "announced");
        // A scan's cursor steps through the skipped leaves and reads ahead.
        let scan = Counting {
            inner: fs.volume(),
            read: Default::default(),
            announced: Default::default(),
        };
        let mut c = Cursor::new(&scan, root);
        for (key, _) in &wanted {
            c.seek_near(key, 4).unwrap();
        }
        assert!(scan.read.borrow().len() > read.len());
        // Point lookups in every leaf in turn: a scan, with readahead.
        let every = Counting {
            inner: fs.volume(),
            read: Default::default(),
            announced: Default::default(),
        };
        let mut c = Cursor::new(&every, root).point_lookups();
        for (key, leaf) in &leaves {
            c.seek_near(key, 4).unwrap();
            assert_eq!(c.current().map(|i| i.leaf), Some(*leaf));
        }
        let announced: std::collections::HashSet<_> =
            every.announced.borrow().iter().copied().collect();
        assert!(
            announced.len() * 2 >= leaves.len(),
            "{} of {} leaves announced",
            announced.len(),
            leaves.len()
        );
    }

    /// `seek_near` lands where a seek from the root does (same key, same
    /// leaf and slot) whatever the cursor's previous position, in ascending
    /// order (steps forward and in-leaf searches), descending order (subtree
    /// searches) and a scattered order.
    #[test]
    fn seek_near_lands_where_seek_does() {
        let dir = tempfile::tempdir().unwrap();
        let fs = open_fixture(&dir);
        let (root, keys) = biggest_tree(&fs);
        let probes = probes(&keys);
        let mut scattered = probes.clone();
        let n = scattered.len();
        for i in 0..n {
            scattered.swap(i, (i * 7919 + 13) % n);
        }
        let mut descending = probes.clone();
        descending.reverse();
        let mut kinds = std::collections::HashSet::new();
        for (order, point) in [&probes, &descending, &scattered]
            .into_iter()
            .flat_map(|o| [(o, false), (o, true)])
        {
            let mut near = Cursor::new(fs.volume(), root);
            if point {
                near = near.point_lookups();
            }
            for key in order {
                let how = near.seek_near(key, 4).unwrap();
                kinds.insert(std::mem::discriminant(&how));
                let mut fresh = Cursor::new(fs.volume(), root);
                fresh.seek(key).unwrap();
                let at = |c: &Cursor<&crate::volume::Volume>| {
                    c.current().map(|i| (i.key, i.leaf, i.slot))
                };
                assert_eq!(at(&near), at(&fresh), "{key:?} ({how:?})");
                assert_eq!(near.current().map(|i| i.key), first_at_or_after(&keys, key));
                // The cursor walks on from there as a scan does.
                if near.current().is_some() {
                    let more = near.advance().unwrap();
                    let i = keys.partition_point(|k| k < key) + 1;
                    assert_eq!(more, i < keys.len());
                    assert_eq!(near.current().map(|i| i.key), keys.get(i).copied());
                }
            }
        }
        // Every way of getting there was used.
        assert!(kinds.contains(&std::mem::discriminant(&Reposition::InLeaf)));
        assert!(kinds.contains(&std::mem::discriminant(&Reposition::Forward(1))));
        assert!(
            kinds.contains(&std::mem::discriminant(&Reposition::Subtree(0)))
                || kinds.contains(&std::mem::discriminant(&Reposition::Root))
        );
    }

    #[test]
    fn next_until_stops_at_the_last_key_and_the_tree_end() {
        let dir = tempfile::tempdir().unwrap();
        let fs = open_fixture(&dir);
        let (root, keys) = biggest_tree(&fs);
        let (first, last) = (keys[10], keys[keys.len() / 2]);
        let mut c = Cursor::new(fs.volume(), root);
        c.seek(&first).unwrap();
        let mut started = false;
        let mut got = Vec::new();
        while let Some(item) = c.next_until(&last, &mut started).unwrap() {
            got.push(item.key);
        }
        assert_eq!(got, keys[10..=keys.len() / 2].to_vec());
        // Past the end: nothing, and stepping on stays at the end.
        c.seek(&Key::MAX).unwrap();
        assert!(c.current().is_none() || c.current().map(|i| i.key) == Some(Key::MAX));
        let mut end = Cursor::new(fs.volume(), root);
        end.seek(keys.last().unwrap()).unwrap();
        assert!(!end.advance().unwrap());
        assert!(end.current().is_none());
        assert!(!end.advance().unwrap());
    }
}
