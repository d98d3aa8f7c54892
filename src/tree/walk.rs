//! Walking a tree in key order: a cursor (search, next item, next leaf) over
//! any [`BlockSource`].
//!
//! The walker never reads devices itself: it asks its `BlockSource` for a
//! validated block described by a [`BlockExpect`] (address, generation and
//! level from the parent pointer, the first key). Whenever it enters an
//! internal node it tells the source, through [`BlockSource::will_need`],
//! which children it will visit next in key order, so a readahead pool can
//! slot in behind the trait without changing the walker.

#![warn(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::as_conversions
)]

use crate::error::{Location, Result};
use crate::tree::key::Key;
use crate::tree::node::{BlockExpect, LeafItem, TreeBlock};
use crate::types::{Generation, Logical, TreeId};

/// How many upcoming sibling blocks a node entry announces.
const READAHEAD_HINT: usize = 64;

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
}

impl<S: BlockSource + ?Sized> BlockSource for &S {
    fn read_block(&self, expect: &BlockExpect) -> Result<TreeBlock> {
        (**self).read_block(expect)
    }

    fn will_need(&self, upcoming: &[BlockExpect]) {
        (**self).will_need(upcoming);
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
    fn expect(&self) -> BlockExpect {
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
}

/// A position in a tree: the path of (block, slot) from the root to a leaf.
#[derive(Debug)]
pub struct Cursor<S> {
    source: S,
    root: TreeRoot,
    /// `path[0]` is the root; the last entry is the leaf.
    path: Vec<(TreeBlock, usize)>,
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
        }
    }

    /// The tree's root.
    pub fn root(&self) -> &TreeRoot {
        &self.root
    }

    fn hint_after(&self, block: &TreeBlock, slot: usize) {
        let node = block.node();
        if node.is_leaf() {
            return;
        }
        let end = node.nritems().min(slot.saturating_add(READAHEAD_HINT));
        let upcoming: Vec<BlockExpect> =
            (slot..end).filter_map(|s| child_expect(block, s)).collect();
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
            self.hint_after(&child, slot);
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
        let slot = pick(&root);
        self.hint_after(&root, slot);
        self.path.push((root, slot));
        self.descend(pick)?;
        if self.leaf_exhausted() {
            self.next_leaf()?;
        }
        Ok(())
    }

    fn leaf_exhausted(&self) -> bool {
        self.path
            .last()
            .is_none_or(|(leaf, slot)| *slot >= leaf.node().nritems())
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
