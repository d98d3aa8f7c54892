//! The send planner's point lookups in one subvolume tree, as the
//! kernel's send does them: inode items, first refs, dir items and xattrs
//! by name, the extent items of an inode from an offset. The extent tree's
//! items are read by `extent_tree`.
//!
//! Every item is decoded by the filesystem model (`crate::fs::items`:
//! [`Inode`], [`FileExtent`], names, dir and xattr records), with its
//! checks: there is no second decoder here. Items are read only through
//! [`Cursor`], so every block is validated by the tree layer.

use std::cell::RefCell;
use std::ops::RangeInclusive;
use std::rc::Rc;

use crate::error::Result;
use crate::fs::items::{self, name_hash};
use crate::fs::{FileExtent, Filesystem, Inode};
use crate::memo::SlotMemo;
use crate::ondisk;
use crate::tree::key::Key;
use crate::tree::walk::{Cursor, ItemRef, TreeRoot};
use crate::types::TreeId;
use crate::volume::Volume;

/// The (parent dir, name) entries of an INODE_REF or INODE_EXTREF item, in
/// item order (through the filesystem model's parsers).
pub(crate) fn parse_refs(item: &ItemRef<'_>) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut names = Vec::new();
    if item.key.item_type == ondisk::BTRFS_INODE_EXTREF_KEY {
        items::parse_inode_extrefs(item, &mut names)?;
    } else {
        items::parse_inode_refs(item, &mut names)?;
    }
    Ok(names.into_iter().map(|n| (n.parent, n.name)).collect())
}

/// One entry of a DIR_ITEM / XATTR_ITEM.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DirEntry<'a> {
    pub location: Key,
    pub name: &'a [u8],
    pub data: &'a [u8],
}

/// The entries of a DIR_ITEM, DIR_INDEX or XATTR_ITEM, in item order
/// (through the filesystem model's parser).
pub(crate) fn parse_dir_items<'a>(item: &ItemRef<'a>) -> Result<Vec<DirEntry<'a>>> {
    items::dir_records(item)
        .map(|r| {
            r.map(|r| DirEntry {
                location: r.location,
                name: r.name,
                data: r.data,
            })
        })
        .collect()
}

/// Inode items looked up so far in one tree (a sent tree does not change
/// during the send, so an answer holds for all of it). The planner asks for
/// the same directory's inode item once per entry in it (`compare_refs`,
/// `get_inode_gen`), and for an inode's several times while it is current.
/// Direct-mapped ([`SlotMemo`]): a SipHash map's hashing was 5 % of a full
/// estimate's time.
type InodeMemo = Rc<RefCell<SlotMemo<Option<Inode>>>>;

/// Slots of an [`InodeMemo`] (≈ 170 bytes each: 700 KiB once used; a
/// memo of 2^16 entries cost 33 MiB, a third of a small-file send's memory,
/// for no speed).
const INODE_MEMO_SLOTS: usize = 1 << 12;

/// Leaves a lookup steps forward through before it searches down from a
/// node of the path instead (as the extent-tree reader does).
const NEAR_LEAVES: usize = 4;

/// The cursor of a tree's point lookups, shared by a view's clones.
type SharedCursor<'a> = Rc<RefCell<Cursor<&'a Volume>>>;

/// The subvolume's root directory: its items (orphan-name checks, the
/// entries of top-level paths) have a lookup cursor of their own.
const ROOT_DIR: u64 = ondisk::BTRFS_FIRST_FREE_OBJECTID;

/// Orphan-name checks made by lookups before the root directory is
/// scanned once for the names that look like orphan names (a small
/// incremental send makes a few and never scans).
const ORPHAN_PROBES: u32 = 256;
/// The most root-directory entries that scan reads; a larger root
/// directory keeps the lookups.
const ORPHAN_SCAN_MAX: usize = 1 << 20;
/// The most orphan-like names kept from it (24 bytes each); more keep the
/// lookups.
const ORPHAN_SET_MAX: usize = 1 << 16;

/// What is known of the names `o<ino>-<gen>-<idx>` in a tree's root
/// directory (`gen_unique_name` asks whether one exists for every new
/// inode of a send).
#[derive(Debug)]
enum OrphanNames {
    /// Not scanned yet; this many lookups so far.
    Probing(u32),
    /// Every such name there, as (ino, gen, idx).
    Known(std::collections::HashSet<(u64, u64, u64)>),
    /// Too many to keep: look each up.
    Lookups,
}

/// Point lookups in one subvolume tree. Clones share the inode memo and
/// the lookup cursor: each lookup moves that cursor with
/// [`Cursor::seek_near`] (a binary search in the leaf under it when the key
/// is there, a few leaf steps forward, else a search from the lowest node
/// of its path that holds the key), not from the root. The planner's
/// lookups cluster: around the current inode, in the root directory
/// (orphan names), along a path. Lookups of the root directory's items
/// (every new inode's orphan name is checked there) go through a second
/// cursor, so that they do not pull the first away from the current inode
/// to the start of the tree and back: two searches from the root per
/// inode of a full send.
#[derive(Debug, Clone)]
pub(crate) struct TreeView<'a> {
    pub fs: &'a Filesystem,
    pub root: TreeRoot,
    inodes: InodeMemo,
    lookups: SharedCursor<'a>,
    root_dir: SharedCursor<'a>,
    orphans: Rc<RefCell<OrphanNames>>,
}

impl<'a> TreeView<'a> {
    pub fn new(fs: &'a Filesystem, tree: TreeId) -> Result<TreeView<'a>> {
        let root = fs.tree_root(tree)?;
        Ok(TreeView {
            fs,
            root,
            inodes: Rc::new(RefCell::new(SlotMemo::new(INODE_MEMO_SLOTS))),
            lookups: Rc::new(RefCell::new(Cursor::new(fs.volume(), root).point_lookups())),
            root_dir: Rc::new(RefCell::new(Cursor::new(fs.volume(), root).point_lookups())),
            orphans: Rc::new(RefCell::new(OrphanNames::Probing(0))),
        })
    }

    /// A cursor of its own (for a walk over the whole tree).
    pub fn cursor(&self) -> Cursor<&'a Volume> {
        Cursor::new(self.fs.volume(), self.root)
    }

    /// Position the lookup cursor at the first item with key ≥ `key` and
    /// call `f` with it. A lookup made from inside `f` (the shared cursor
    /// is busy) gets a cursor of its own, sought from the root: same
    /// answer, no shortcut.
    fn at<T>(&self, key: &Key, f: impl FnOnce(&mut Cursor<&'a Volume>) -> Result<T>) -> Result<T> {
        let shared = if key.objectid == ROOT_DIR {
            &self.root_dir
        } else {
            &self.lookups
        };
        if let Ok(mut c) = shared.try_borrow_mut() {
            c.seek_near(key, NEAR_LEAVES)?;
            return f(&mut c);
        }
        let mut c = self.cursor();
        c.seek(key)?;
        f(&mut c)
    }

    /// The inode item of `ino`.
    pub fn inode(&self, ino: u64) -> Result<Option<Inode>> {
        if let Some(known) = self.inodes.borrow().get(ino) {
            return Ok(known);
        }
        let key = Key::new(ino, ondisk::BTRFS_INODE_ITEM_KEY, 0);
        let info = self.at(&key, |c| match c.current() {
            Some(item) if item.key == key => Inode::parse(&item).map(Some),
            _ => Ok(None),
        })?;
        self.inodes.borrow_mut().put(ino, info);
        Ok(info)
    }

    /// The inode's first reference: first INODE_REF item's first name, else
    /// the first INODE_EXTREF's (`get_first_ref`).
    pub fn first_ref(&self, ino: u64) -> Result<Option<(u64, Vec<u8>)>> {
        self.at(&Key::new(ino, ondisk::BTRFS_INODE_REF_KEY, 0), |c| {
            let Some(item) = c.current() else {
                return Ok(None);
            };
            if item.key.objectid != ino
                || (item.key.item_type != ondisk::BTRFS_INODE_REF_KEY
                    && item.key.item_type != ondisk::BTRFS_INODE_EXTREF_KEY)
            {
                return Ok(None);
            }
            Ok(parse_refs(&item)?.into_iter().next())
        })
    }

    /// Every reference of `ino`: (parent directory, name) of its
    /// INODE_REF items, then of its INODE_EXTREF items, in key order.
    pub fn refs(&self, ino: u64) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut all = Vec::new();
        self.each_item(
            ino,
            ondisk::BTRFS_INODE_REF_KEY..=ondisk::BTRFS_INODE_EXTREF_KEY,
            |item| {
                all.extend(parse_refs(item)?);
                Ok(())
            },
        )?;
        Ok(all)
    }

    /// Call `f` with each item of `ino` whose type is in `types`, in key
    /// order.
    pub fn each_item(
        &self,
        ino: u64,
        types: RangeInclusive<u8>,
        mut f: impl FnMut(&ItemRef<'_>) -> Result<()>,
    ) -> Result<()> {
        self.at(&Key::new(ino, *types.start(), 0), |c| {
            while let Some(item) = c.current() {
                if item.key.objectid != ino || !types.contains(&item.key.item_type) {
                    break;
                }
                f(&item)?;
                if !c.advance()? {
                    break;
                }
            }
            Ok(())
        })
    }

    /// The DIR_ITEM entry `name` in directory `dir`: its location key.
    pub fn lookup_dir_item(&self, dir: u64, name: &[u8]) -> Result<Option<Key>> {
        self.lookup_named(dir, ondisk::BTRFS_DIR_ITEM_KEY, name)
            .map(|e| e.map(|(k, _)| k))
    }

    /// Whether the root directory has an entry named `o<ino>-<gen>-<idx>`
    /// (`name`): by lookups at first, then — for sends that ask often —
    /// from one scan of the root directory's DIR_ITEMs that keeps the
    /// names of that shape (the tree does not change during a send).
    pub fn has_orphan_name(
        &self,
        (ino, generation, idx): (u64, u64, u64),
        name: &[u8],
    ) -> Result<bool> {
        let scan = {
            let mut st = self.orphans.borrow_mut();
            match &mut *st {
                OrphanNames::Known(set) => return Ok(set.contains(&(ino, generation, idx))),
                OrphanNames::Lookups => false,
                OrphanNames::Probing(n) => {
                    *n = n.saturating_add(1);
                    *n > ORPHAN_PROBES
                }
            }
        };
        if scan {
            let known = self.scan_orphan_names()?;
            let found = known
                .as_ref()
                .map(|set| set.contains(&(ino, generation, idx)));
            *self.orphans.borrow_mut() = match known {
                Some(set) => OrphanNames::Known(set),
                None => OrphanNames::Lookups,
            };
            if let Some(found) = found {
                return Ok(found);
            }
        }
        Ok(self.lookup_dir_item(ROOT_DIR, name)?.is_some())
    }

    /// The orphan-shaped names of the root directory, unless it has more
    /// than [`ORPHAN_SCAN_MAX`] entries or more than [`ORPHAN_SET_MAX`] of
    /// them.
    fn scan_orphan_names(&self) -> Result<Option<std::collections::HashSet<(u64, u64, u64)>>> {
        let mut set = std::collections::HashSet::new();
        let mut seen = 0usize;
        let mut fits = true;
        self.each_item(
            ROOT_DIR,
            ondisk::BTRFS_DIR_ITEM_KEY..=ondisk::BTRFS_DIR_ITEM_KEY,
            |item| {
                if !fits {
                    return Ok(());
                }
                for e in items::dir_records(item) {
                    let e = e?;
                    seen = seen.saturating_add(1);
                    if let Some(t) = stream_format::parse_orphan_name(e.name) {
                        set.insert(t);
                    }
                }
                fits = seen <= ORPHAN_SCAN_MAX && set.len() <= ORPHAN_SET_MAX;
                Ok(())
            },
        )?;
        Ok(fits.then_some(set))
    }

    /// The value of xattr `name` of `ino`.
    pub fn xattr(&self, ino: u64, name: &[u8]) -> Result<Option<Vec<u8>>> {
        self.lookup_named(ino, ondisk::BTRFS_XATTR_ITEM_KEY, name)
            .map(|e| e.map(|(_, v)| v))
    }

    fn lookup_named(&self, ino: u64, ty: u8, name: &[u8]) -> Result<Option<(Key, Vec<u8>)>> {
        let key = Key::new(ino, ty, name_hash(name));
        self.at(&key, |c| {
            let Some(item) = c.current().filter(|i| i.key == key) else {
                return Ok(None);
            };
            Ok(parse_dir_items(&item)?
                .into_iter()
                .find(|e| e.name == name)
                .map(|e| (e.location, e.data.to_vec())))
        })
    }

    /// The key offset of the last extent item of `ino` at or before
    /// `offset`, or `offset` itself when there is none.
    fn extent_at_or_before(&self, ino: u64, offset: u64) -> Result<u64> {
        let is_extent = |k: &Key| k.objectid == ino && k.item_type == ondisk::BTRFS_EXTENT_DATA_KEY;
        let found = self.at(&Key::new(ino, ondisk::BTRFS_EXTENT_DATA_KEY, offset), |c| {
            let Some(item) = c.current() else {
                return Ok(None);
            };
            if is_extent(&item.key) && item.key.offset == offset {
                return Ok(Some(offset));
            }
            // The item before, when it is in the same leaf: the one slot
            // back (as the kernel steps back from its search).
            let before = usize::try_from(item.slot)
                .ok()
                .and_then(|s| s.checked_sub(1))
                .and_then(|s| c.leaf()?.node().item(s));
            Ok(before.map(|prev| {
                if is_extent(&prev.key) {
                    prev.key.offset
                } else {
                    offset
                }
            }))
        })?;
        if let Some(start) = found {
            return Ok(start);
        }
        // The item before is the last of an earlier leaf (or the search
        // ran off the tree's end): walk the inode's extents from the
        // start (rare: once per leaf boundary).
        self.at(&Key::new(ino, ondisk::BTRFS_EXTENT_DATA_KEY, 0), |c| {
            let mut best = None;
            while let Some(item) = c.current() {
                if !is_extent(&item.key) || item.key.offset > offset {
                    break;
                }
                best = Some(item.key.offset);
                if !c.advance()? {
                    break;
                }
            }
            Ok(best.unwrap_or(offset))
        })
    }

    /// The extent items of `ino` starting with the one at or before
    /// `offset` (the kernel's `btrfs_search_slot` then step back one slot),
    /// else the first one after it.
    pub fn extents_from_iter(&self, ino: u64, offset: u64) -> Result<ExtentIter<'a>> {
        let start = self.extent_at_or_before(ino, offset)?;
        Ok(ExtentIter {
            view: self.clone(),
            next: Some(Key::new(ino, ondisk::BTRFS_EXTENT_DATA_KEY, start)),
        })
    }
}

/// The extent items of one inode in key order, each found by a lookup
/// from the previous one's key (so the planner can emit commands and make
/// other lookups between items).
pub(crate) struct ExtentIter<'a> {
    view: TreeView<'a>,
    /// The key to look up next: the first item at or after it.
    next: Option<Key>,
}

impl ExtentIter<'_> {
    /// The next extent item of the inode.
    pub fn next_extent(&mut self) -> Result<Option<FileExtent>> {
        let Some(key) = self.next.take() else {
            return Ok(None);
        };
        self.view.at(&key, |c| {
            let Some(item) = c.current() else {
                return Ok(None);
            };
            if item.key.objectid != key.objectid
                || item.key.item_type != ondisk::BTRFS_EXTENT_DATA_KEY
            {
                return Ok(None);
            }
            let ext = FileExtent::parse(&item)?;
            self.next = item
                .key
                .offset
                .checked_add(1)
                .map(|o| Key::new(key.objectid, ondisk::BTRFS_EXTENT_DATA_KEY, o));
            Ok(Some(ext))
        })
    }
}
