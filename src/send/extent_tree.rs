//! The extent tree's back references, as clone detection reads them: the
//! extent item at a logical address (`EXTENT_ITEM`, or `METADATA_ITEM` for
//! a tree block on a skinny-metadata filesystem) with its reference count,
//! generation, and — for a data extent — its references, inline then keyed
//! (layout: `struct btrfs_extent_item`, `btrfs_extent_inline_ref`,
//! `btrfs_extent_data_ref`, `btrfs_shared_data_ref`, btrfs_tree.h).
//!
//! One [`ExtentTreeReader`] serves a whole send. It keeps one [`Cursor`]
//! and moves it with [`Cursor::seek_near`]: a lookup in the leaf under the
//! cursor is a binary search there, one a few leaves further on steps
//! forward (with the walk's readahead), and one behind or far ahead
//! searches down from the lowest node of the cursor's path that holds it
//! (the root only when none below it does). The data extents of a file are mostly allocated
//! in ascending address order, so most lookups of a send stay in the leaf
//! or the next one. The decoded references of recent extents are kept (an
//! extent is looked up again by every file that shares it), bounded in
//! entries and in references held.
//!
//! What the walk does is counted in [`ExtentTreeStats`] (reported in
//! [`SendStats`](super::SendStats)).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use zerocopy::FromBytes;

use crate::error::Result;
use crate::fs::Filesystem;
use crate::ondisk::{self, ExtentDataRef, ExtentItem};
use crate::tree::check::BlockExpect;
use crate::tree::key::Key;
use crate::tree::node::TreeBlock;
use crate::tree::walk::{BlockSource, Cursor, Reposition, TreeRoot};
use crate::types::TreeId;
use crate::volume::Volume;

/// Leaves a lookup may step forward before it searches from the root.
const FORWARD_LEAVES: usize = 4;

/// Extents whose decoded references are kept.
const CACHE_EXTENTS: usize = 4096;

/// References (inline and keyed, data and shared) the kept extents may
/// hold together (~32 bytes each).
const CACHE_REFS: usize = 1 << 16;

/// One `EXTENT_DATA_REF`, inline or keyed: `count` file extent items of
/// inode `objectid` in tree `root` reference the extent, at file offset −
/// extent offset = `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataRef {
    /// The subvolume tree.
    pub root: u64,
    /// The inode.
    pub objectid: u64,
    /// File offset of the item minus its offset into the extent.
    pub offset: u64,
    /// Items counted by this reference.
    pub count: u64,
}

/// An extent item and the references clone detection uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentRecord {
    /// Its key: `(bytenr, EXTENT_ITEM, length)`, or `(bytenr,
    /// METADATA_ITEM, level)` for a tree block with skinny metadata.
    pub key: Key,
    /// The reference count (`refs`).
    pub refs: u64,
    /// The transaction that allocated it.
    pub generation: u64,
    /// `BTRFS_EXTENT_FLAG_*`.
    pub flags: u64,
    /// Data extents: parent leaves of its SHARED_DATA_REFs, sorted.
    pub shared: Vec<u64>,
    /// Data extents: its EXTENT_DATA_REFs, inline then keyed.
    pub data_refs: Vec<DataRef>,
    /// The reference lists were not read: a tree block, or more
    /// references than the reader collects (the lists are then empty).
    pub lists_skipped: bool,
}

impl ExtentRecord {
    /// Whether this is a data extent's item (an EXTENT_ITEM not flagged as
    /// a tree block).
    pub fn is_data(&self) -> bool {
        self.key.item_type == ondisk::BTRFS_EXTENT_ITEM_KEY
            && self.flags & ondisk::BTRFS_EXTENT_FLAG_TREE_BLOCK == 0
    }

    fn refs_held(&self) -> usize {
        self.shared.len().saturating_add(self.data_refs.len())
    }
}

/// What an [`ExtentTreeReader`] did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExtentTreeStats {
    /// Lookups asked.
    pub lookups: u64,
    /// Lookups answered from the kept references.
    pub cache_hits: u64,
    /// Lookups found in the leaf under the cursor.
    pub in_leaf: u64,
    /// Lookups found by stepping forward to a following leaf.
    pub forward: u64,
    /// Leaves stepped to by those.
    pub leaves_stepped: u64,
    /// Searches from the root.
    pub descents: u64,
    /// Searches from a node of the cursor's path below the root whose
    /// subtree holds the key (a key behind the leaf or far ahead).
    pub subtree_descents: u64,
    /// Tree blocks the cursor read (from the block cache or the devices),
    /// keyed references that continue in the next leaf included.
    pub block_reads: u64,
}

/// A block source that counts the blocks read.
#[derive(Debug)]
struct Counting<'a> {
    volume: &'a Volume,
    reads: std::cell::Cell<u64>,
}

impl BlockSource for Counting<'_> {
    fn read_block(&self, expect: &BlockExpect) -> Result<TreeBlock> {
        self.reads.set(self.reads.get().saturating_add(1));
        self.volume.read_block(expect)
    }

    fn will_need(&self, upcoming: &[BlockExpect]) {
        self.volume.will_need(upcoming);
    }

    fn readahead_window(&self) -> usize {
        self.volume.readahead_window()
    }

    fn cached(&self, expect: &BlockExpect) -> Option<TreeBlock> {
        self.volume.cached(expect)
    }
}

/// The extent records of recent lookups (absent ones too), oldest dropped
/// first.
#[derive(Debug, Default)]
struct Recent {
    map: HashMap<u64, Option<Arc<ExtentRecord>>>,
    order: VecDeque<u64>,
    refs_held: usize,
    max_extents: usize,
}

impl Recent {
    fn get(&self, bytenr: u64) -> Option<&Option<Arc<ExtentRecord>>> {
        self.map.get(&bytenr)
    }

    fn insert(&mut self, bytenr: u64, rec: Option<Arc<ExtentRecord>>) {
        let held = rec.as_ref().map_or(0, |r| r.refs_held());
        if self.max_extents == 0 || held > CACHE_REFS {
            return;
        }
        while self.map.len() >= self.max_extents || self.refs_held.saturating_add(held) > CACHE_REFS
        {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(Some(r)) = self.map.remove(&old) {
                self.refs_held = self.refs_held.saturating_sub(r.refs_held());
            }
        }
        self.refs_held = self.refs_held.saturating_add(held);
        self.map.insert(bytenr, rec);
        self.order.push_back(bytenr);
    }
}

/// Extent items by address, from one cursor over the extent tree.
#[derive(Debug)]
pub struct ExtentTreeReader<'a> {
    volume: &'a Volume,
    /// `None`: the filesystem has no extent tree (every lookup is absent).
    cursor: Option<Cursor<Counting<'a>>>,
    /// More references than this: the lists are not read.
    max_refs: u64,
    recent: Recent,
    stats: ExtentTreeStats,
}

impl<'a> ExtentTreeReader<'a> {
    /// A reader of `fs`'s extent tree that collects the reference lists of
    /// data extents with at most `max_refs` references.
    ///
    /// # Errors
    ///
    /// Reading the extent tree's root item.
    pub fn new(fs: &'a Filesystem, max_refs: u64) -> Result<ExtentTreeReader<'a>> {
        let root = fs
            .root_item(TreeId(ondisk::BTRFS_EXTENT_TREE_OBJECTID))?
            .map(|r| r.tree_root());
        Ok(Self::with_root(fs.volume(), root, max_refs))
    }

    /// A reader of the extent tree at `root` (`None`: there is none).
    pub fn with_root(
        volume: &'a Volume,
        root: Option<TreeRoot>,
        max_refs: u64,
    ) -> ExtentTreeReader<'a> {
        ExtentTreeReader {
            volume,
            cursor: root.map(|root| {
                Cursor::new(
                    Counting {
                        volume,
                        reads: std::cell::Cell::new(0),
                    },
                    root,
                )
            }),
            max_refs,
            recent: Recent {
                max_extents: CACHE_EXTENTS,
                ..Recent::default()
            },
            stats: ExtentTreeStats::default(),
        }
    }

    /// Keep the records of at most `extents` recent lookups (0: none, so
    /// every lookup moves the cursor).
    pub fn set_cache_extents(&mut self, extents: usize) {
        self.recent = Recent {
            max_extents: extents,
            ..Recent::default()
        };
    }

    /// The extent item at `bytenr` (EXTENT_ITEM or METADATA_ITEM) and its
    /// references, if there is one.
    ///
    /// # Errors
    ///
    /// Block read errors; a truncated extent item or inline reference.
    pub fn lookup(&mut self, bytenr: u64) -> Result<Option<Arc<ExtentRecord>>> {
        self.stats.lookups = self.stats.lookups.saturating_add(1);
        if let Some(rec) = self.recent.get(bytenr) {
            self.stats.cache_hits = self.stats.cache_hits.saturating_add(1);
            return Ok(rec.clone());
        }
        let Some(cursor) = self.cursor.as_mut() else {
            return Ok(None);
        };
        match cursor.seek_near(&first_key(bytenr), FORWARD_LEAVES)? {
            Reposition::InLeaf => self.stats.in_leaf = self.stats.in_leaf.saturating_add(1),
            Reposition::Forward(n) => {
                self.stats.forward = self.stats.forward.saturating_add(1);
                self.stats.leaves_stepped = self
                    .stats
                    .leaves_stepped
                    .saturating_add(u64::try_from(n).unwrap_or(u64::MAX));
            }
            Reposition::Subtree(_) => {
                self.stats.subtree_descents = self.stats.subtree_descents.saturating_add(1);
            }
            Reposition::Root => self.stats.descents = self.stats.descents.saturating_add(1),
        }
        let rec = read_record(cursor, bytenr, self.max_refs)?.map(Arc::new);
        self.recent.insert(bytenr, rec.clone());
        Ok(rec)
    }

    /// The same answer as [`lookup`](Self::lookup), from a search of its
    /// own from the root (no cursor reuse, no cache, not counted).
    ///
    /// # Errors
    ///
    /// As [`lookup`](Self::lookup).
    pub fn lookup_fresh(&self, bytenr: u64) -> Result<Option<ExtentRecord>> {
        let Some(root) = self.cursor.as_ref().map(|c| *c.root()) else {
            return Ok(None);
        };
        let mut cursor = Cursor::new(self.volume, root);
        cursor.seek(&first_key(bytenr))?;
        read_record(&mut cursor, bytenr, self.max_refs)
    }

    /// The data extent at `bytenr`, if its item is a data extent's.
    ///
    /// # Errors
    ///
    /// As [`lookup`](Self::lookup).
    pub fn data_extent(&mut self, bytenr: u64) -> Result<Option<Arc<ExtentRecord>>> {
        Ok(self.lookup(bytenr)?.filter(|r| r.is_data()))
    }

    /// The generation of the tree block at `bytenr`, from its extent item
    /// (EXTENT_ITEM or METADATA_ITEM).
    ///
    /// # Errors
    ///
    /// As [`lookup`](Self::lookup).
    pub fn tree_block_generation(&mut self, bytenr: u64) -> Result<Option<u64>> {
        Ok(self.lookup(bytenr)?.map(|r| r.generation))
    }

    /// The counters so far.
    pub fn stats(&self) -> ExtentTreeStats {
        ExtentTreeStats {
            block_reads: self.cursor.as_ref().map_or(0, |c| c.source().reads.get()),
            ..self.stats
        }
    }
}

/// The smallest key an extent item at `bytenr` can have.
fn first_key(bytenr: u64) -> Key {
    Key::new(bytenr, ondisk::BTRFS_EXTENT_ITEM_KEY, 0)
}

fn data_ref(r: &ExtentDataRef) -> DataRef {
    DataRef {
        root: r.root.get(),
        objectid: r.objectid.get(),
        offset: r.offset.get(),
        count: u64::from(r.count.get()),
    }
}

/// The extent item at `bytenr` from a cursor positioned at the first item
/// ≥ `(bytenr, EXTENT_ITEM, 0)`, and (for a data extent with at most
/// `max_refs` references) the keyed references after it, which may
/// continue in the following leaves.
fn read_record<S: BlockSource>(
    c: &mut Cursor<S>,
    bytenr: u64,
    max_refs: u64,
) -> Result<Option<ExtentRecord>> {
    let Some(item) = c.current() else {
        return Ok(None);
    };
    if item.key.objectid != bytenr
        || (item.key.item_type != ondisk::BTRFS_EXTENT_ITEM_KEY
            && item.key.item_type != ondisk::BTRFS_METADATA_ITEM_KEY)
    {
        return Ok(None);
    }
    let (ei, rest) = ExtentItem::ref_from_prefix(item.data)
        .map_err(|_| item.truncated("extent item", size_of::<ExtentItem>()))?;
    let mut rec = ExtentRecord {
        key: item.key,
        refs: ei.refs.get(),
        generation: ei.generation.get(),
        flags: ei.flags.get(),
        shared: Vec::new(),
        data_refs: Vec::new(),
        lists_skipped: true,
    };
    if !rec.is_data() || rec.refs > max_refs {
        return Ok(Some(rec));
    }
    rec.lists_skipped = false;
    // A data extent's item has no tree_block_info: inline refs follow, a
    // type byte, then a payload whose size the type gives.
    let mut rest = rest;
    while let Some((&ty, tail)) = rest.split_first() {
        let len = match ty {
            ondisk::BTRFS_EXTENT_DATA_REF_KEY => size_of::<ExtentDataRef>(),
            ondisk::BTRFS_SHARED_DATA_REF_KEY => 12,
            ondisk::BTRFS_TREE_BLOCK_REF_KEY
            | ondisk::BTRFS_SHARED_BLOCK_REF_KEY
            | ondisk::BTRFS_EXTENT_OWNER_REF_KEY => 8,
            _ => break,
        };
        let Some(payload) = tail.get(..len) else {
            return Err(item.truncated("inline extent ref", len));
        };
        if ty == ondisk::BTRFS_SHARED_DATA_REF_KEY
            && let Ok((parent, _)) = zerocopy::little_endian::U64::read_from_prefix(payload)
        {
            rec.shared.push(parent.get());
        }
        if ty == ondisk::BTRFS_EXTENT_DATA_REF_KEY
            && let Ok((r, _)) = ExtentDataRef::read_from_prefix(payload)
        {
            rec.data_refs.push(data_ref(&r));
        }
        rest = tail.get(len..).unwrap_or_default();
    }
    // Keyed refs follow the extent item, possibly into the next leaves.
    while c.advance()? {
        let Some(item) = c.current() else { break };
        if item.key.objectid != bytenr {
            break;
        }
        if item.key.item_type == ondisk::BTRFS_SHARED_DATA_REF_KEY {
            rec.shared.push(item.key.offset);
        }
        if item.key.item_type == ondisk::BTRFS_EXTENT_DATA_REF_KEY
            && let Ok((r, _)) = ExtentDataRef::read_from_prefix(item.data)
        {
            rec.data_refs.push(data_ref(&r));
        }
    }
    rec.shared.sort_unstable();
    Ok(Some(rec))
}
