//! A subvolume's fs tree as the send planner sees it: a single key-order
//! pass yielding one [`InodeGroup`] per inode (inode item, names, xattrs,
//! directory entries, extents arrive together), plus random lookups (inode by
//! number, directory entries, lookup by name, names, xattrs, extents).
//!
//! Everything streams over a [`Cursor`]: memory is bounded by the blocks on
//! the cursor's path and the items of one inode, never by the tree. Items
//! are decoded straight from the cached leaf (`crate::fs::items`); only what
//! a group hands out is copied.

#![warn(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::as_conversions
)]

use crate::error::{CorruptKind, Error, Location, Result};
use crate::ondisk;
use crate::tree::check::BlockExpect;
use crate::tree::key::Key;
use crate::tree::walk::{BlockSource, Cursor, ItemRef, TreeRoot};
use crate::types::TreeId;
use crate::volume::Volume;

use super::Filesystem;
use super::items::{
    self, DirEntry, FileExtent, Inode, InodeName, Xattr, dir_records, inode_key, is_inode_number,
    name_hash,
};
use super::subvol::RootInfo;

/// One subvolume (or snapshot) tree, opened for reading.
#[derive(Debug)]
pub struct FsTree<'fs> {
    fs: &'fs Filesystem,
    info: RootInfo,
    csum_root: Option<TreeRoot>,
}

impl Filesystem {
    /// Open the subvolume tree `id` (5 for the top level, or a subvolume or
    /// snapshot id).
    ///
    /// # Errors
    ///
    /// [`CorruptKind::MissingItem`] when there is no such tree; tree read
    /// errors.
    pub fn fs_tree(&self, id: TreeId) -> Result<FsTree<'_>> {
        let info = self.root_item(id)?.ok_or_else(|| {
            Error::corrupt(
                Location::Tree(TreeId::ROOT),
                CorruptKind::MissingItem {
                    what: "root item",
                    key: Key::new(id.get(), ondisk::BTRFS_ROOT_ITEM_KEY, 0),
                },
            )
        })?;
        let csum_root = self
            .root_item(TreeId(ondisk::BTRFS_CSUM_TREE_OBJECTID))?
            .map(|r| r.tree_root());
        Ok(FsTree {
            fs: self,
            info,
            csum_root,
        })
    }
}

/// What an [`InodeGroup`] collects besides the inode item, names and xattrs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkOptions {
    /// Collect the DIR_INDEX entries of directories (readdir order).
    pub dir_entries: bool,
    /// Collect the file extents.
    pub extents: bool,
}

impl Default for WalkOptions {
    /// Everything.
    fn default() -> Self {
        WalkOptions {
            dir_entries: true,
            extents: true,
        }
    }
}

/// All items of one inode, as a key-order pass meets them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeGroup {
    /// The inode item.
    pub inode: Inode,
    /// All names: INODE_REF records, then INODE_EXTREF records, in key
    /// order.
    pub names: Vec<InodeName>,
    /// Extended attributes in key (name hash) order.
    pub xattrs: Vec<Xattr>,
    /// DIR_INDEX entries in index order (when asked for).
    pub entries: Vec<DirEntry>,
    /// File extents in file-offset order (when asked for).
    pub extents: Vec<FileExtent>,
}

impl<'fs> FsTree<'fs> {
    /// The tree id.
    pub fn id(&self) -> TreeId {
        self.info.id
    }

    /// Its root item.
    pub fn root_info(&self) -> &RootInfo {
        &self.info
    }

    /// The filesystem.
    pub fn filesystem(&self) -> &'fs Filesystem {
        self.fs
    }

    pub(crate) fn volume(&self) -> &'fs Volume {
        self.fs.volume()
    }

    /// The inode number of the root directory (256).
    pub fn root_dir(&self) -> u64 {
        self.info.root_dirid
    }

    /// Where the tree starts.
    pub fn tree_root(&self) -> TreeRoot {
        self.info.tree_root()
    }

    pub(crate) fn csum_root(&self) -> Option<TreeRoot> {
        self.csum_root
    }

    /// Filesystem sector size.
    pub fn sectorsize(&self) -> u32 {
        self.volume().superblock().sectorsize
    }

    fn cursor(&self) -> Cursor<&'fs Volume> {
        Cursor::new(self.volume(), self.tree_root())
    }

    /// Every inode in inode-number order, one group per inode, in a single
    /// pass over the leaves.
    pub fn inodes(&self, opts: WalkOptions) -> InodeWalker<'fs> {
        InodeWalker {
            cursor: self.cursor(),
            start: Some(Key::MIN),
            until: u64::MAX,
            opts,
            done: false,
        }
    }

    /// Like [`inodes`](Self::inodes), starting at inode `first`.
    pub fn inodes_from(&self, first: u64, opts: WalkOptions) -> InodeWalker<'fs> {
        InodeWalker {
            start: Some(inode_key(first)),
            ..self.inodes(opts)
        }
    }

    /// The items of inode `ino`, or `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// Tree read errors and corrupt items.
    pub fn inode_group(&self, ino: u64, opts: WalkOptions) -> Result<Option<InodeGroup>> {
        let mut w = InodeWalker {
            until: ino,
            ..self.inodes_from(ino, opts)
        };
        w.next().transpose()
    }

    /// The inode item of `ino`.
    ///
    /// # Errors
    ///
    /// Tree read errors and a corrupt inode item.
    pub fn inode(&self, ino: u64) -> Result<Option<Inode>> {
        let mut c = self.cursor();
        match c.find(&inode_key(ino))? {
            Some(item) => Inode::parse(&item).map(Some),
            None => Ok(None),
        }
    }

    /// Items with keys in `[first, last]`, streamed.
    pub fn items(&self, first: Key, last: Key) -> Items<'fs> {
        Items {
            cursor: self.cursor(),
            first: Some(first),
            last,
            started: false,
        }
    }

    /// The entries of directory `dir` in DIR_INDEX (readdir) order.
    pub fn dir_entries(&self, dir: u64) -> DirEntries<'fs> {
        DirEntries {
            items: self.items(
                Key::new(dir, ondisk::BTRFS_DIR_INDEX_KEY, 0),
                Key::new(dir, ondisk::BTRFS_DIR_INDEX_KEY, u64::MAX),
            ),
            buf: Vec::new(),
        }
    }

    /// Look `name` up in directory `dir` through its DIR_ITEM (name hash;
    /// colliding names share an item). The entry's `index` is 0: DIR_ITEM
    /// does not record it.
    ///
    /// # Errors
    ///
    /// Tree read errors and corrupt items.
    pub fn lookup(&self, dir: u64, name: &[u8]) -> Result<Option<DirEntry>> {
        let mut c = self.cursor();
        let key = Key::new(dir, ondisk::BTRFS_DIR_ITEM_KEY, name_hash(name));
        let Some(item) = c.find(&key)? else {
            return Ok(None);
        };
        for rec in dir_records(&item) {
            let rec = rec?;
            if rec.name == name {
                return DirEntry::from_record(&item, &rec, 0).map(Some);
            }
        }
        Ok(None)
    }

    /// The value of xattr `name` of `ino` (XATTR_ITEM lookup by name hash).
    ///
    /// # Errors
    ///
    /// Tree read errors and corrupt items.
    pub fn xattr(&self, ino: u64, name: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut c = self.cursor();
        let key = Key::new(ino, ondisk::BTRFS_XATTR_ITEM_KEY, name_hash(name));
        let Some(item) = c.find(&key)? else {
            return Ok(None);
        };
        for rec in dir_records(&item) {
            let rec = rec?;
            if rec.name == name {
                return Ok(Some(rec.data.to_vec()));
            }
        }
        Ok(None)
    }

    /// All xattrs of `ino`, in key order.
    ///
    /// # Errors
    ///
    /// Tree read errors and corrupt items.
    pub fn xattrs(&self, ino: u64) -> Result<Vec<Xattr>> {
        let mut out = Vec::new();
        let mut it = self.items(
            Key::new(ino, ondisk::BTRFS_XATTR_ITEM_KEY, 0),
            Key::new(ino, ondisk::BTRFS_XATTR_ITEM_KEY, u64::MAX),
        );
        while let Some(item) = it.next_item()? {
            items::parse_xattrs(&item, &mut out)?;
        }
        Ok(out)
    }

    /// All names of `ino`: INODE_REF records, then INODE_EXTREF records.
    ///
    /// # Errors
    ///
    /// Tree read errors and corrupt items.
    pub fn names(&self, ino: u64) -> Result<Vec<InodeName>> {
        let mut out = Vec::new();
        let mut it = self.items(
            Key::new(ino, ondisk::BTRFS_INODE_REF_KEY, 0),
            Key::new(ino, ondisk::BTRFS_INODE_EXTREF_KEY, u64::MAX),
        );
        while let Some(item) = it.next_item()? {
            match item.key.item_type {
                ondisk::BTRFS_INODE_REF_KEY => items::parse_inode_refs(&item, &mut out)?,
                _ => items::parse_inode_extrefs(&item, &mut out)?,
            }
        }
        Ok(out)
    }

    /// The file extents of `ino` in file-offset order, streamed.
    pub fn extents(&self, ino: u64) -> Extents<'fs> {
        self.extents_from_key(ino, 0)
    }

    fn extents_from_key(&self, ino: u64, offset: u64) -> Extents<'fs> {
        Extents {
            items: self.items(
                Key::new(ino, ondisk::BTRFS_EXTENT_DATA_KEY, offset),
                Key::new(ino, ondisk::BTRFS_EXTENT_DATA_KEY, u64::MAX),
            ),
        }
    }

    /// The file extents of `ino` starting with the one that covers (or
    /// is the last before) file offset `offset`.
    ///
    /// # Errors
    ///
    /// Tree read errors.
    pub fn extents_at(&self, ino: u64, offset: u64) -> Result<Extents<'fs>> {
        let key = Key::new(ino, ondisk::BTRFS_EXTENT_DATA_KEY, offset);
        let start = match search_le(self.volume(), self.tree_root(), &key)? {
            Some(k) if k.objectid == ino && k.item_type == ondisk::BTRFS_EXTENT_DATA_KEY => {
                k.offset
            }
            _ => 0,
        };
        Ok(self.extents_from_key(ino, start))
    }
}

/// Items of a key range, streamed over a cursor.
#[derive(Debug)]
pub struct Items<'fs> {
    cursor: Cursor<&'fs Volume>,
    first: Option<Key>,
    last: Key,
    started: bool,
}

impl Items<'_> {
    /// The next item, borrowed from its leaf.
    ///
    /// # Errors
    ///
    /// Tree read errors.
    pub fn next_item(&mut self) -> Result<Option<ItemRef<'_>>> {
        if let Some(first) = self.first.take() {
            self.cursor.seek(&first)?;
        }
        self.cursor.next_until(&self.last, &mut self.started)
    }
}

/// The entries of one directory in DIR_INDEX order.
#[derive(Debug)]
pub struct DirEntries<'fs> {
    items: Items<'fs>,
    buf: Vec<DirEntry>,
}

impl Iterator for DirEntries<'_> {
    type Item = Result<DirEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        let r = (|| {
            let Some(item) = self.items.next_item()? else {
                return Ok(None);
            };
            self.buf.clear();
            items::parse_dir_index(&item, &mut self.buf)?;
            Ok(self.buf.pop())
        })();
        r.transpose()
    }
}

/// The file extents of one inode in offset order.
#[derive(Debug)]
pub struct Extents<'fs> {
    items: Items<'fs>,
}

impl Iterator for Extents<'_> {
    type Item = Result<FileExtent>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.items.next_item() {
            Ok(Some(item)) => Some(FileExtent::parse(&item)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// The key-order pass over a tree's inodes (see [`FsTree::inodes`]).
#[derive(Debug)]
pub struct InodeWalker<'fs> {
    cursor: Cursor<&'fs Volume>,
    start: Option<Key>,
    until: u64,
    opts: WalkOptions,
    done: bool,
}

impl InodeWalker<'_> {
    fn next_group(&mut self) -> Result<Option<InodeGroup>> {
        if let Some(start) = self.start.take() {
            self.cursor.seek(&start)?;
        }
        // Skip what is not an inode (objectids below 256 in old trees);
        // orphan items and other negative objectids sort after all inodes.
        let (ino, inode) = loop {
            let Some(item) = self.cursor.current() else {
                return Ok(None);
            };
            let ino = item.key.objectid;
            if ino > self.until || ino > ondisk::BTRFS_LAST_FREE_OBJECTID {
                return Ok(None);
            }
            if !is_inode_number(ino) {
                self.cursor.advance()?;
                continue;
            }
            if item.key.item_type != ondisk::BTRFS_INODE_ITEM_KEY {
                return Err(Error::corrupt(
                    item.location(),
                    CorruptKind::MissingItem {
                        what: "inode item",
                        key: inode_key(ino),
                    },
                ));
            }
            break (ino, Inode::parse(&item)?);
        };
        let mut g = InodeGroup {
            inode,
            names: Vec::new(),
            xattrs: Vec::new(),
            entries: Vec::new(),
            extents: Vec::new(),
        };
        while self.cursor.advance()? {
            let Some(item) = self.cursor.current() else {
                break;
            };
            if item.key.objectid != ino {
                break;
            }
            match item.key.item_type {
                ondisk::BTRFS_INODE_REF_KEY => items::parse_inode_refs(&item, &mut g.names)?,
                ondisk::BTRFS_INODE_EXTREF_KEY => {
                    items::parse_inode_extrefs(&item, &mut g.names)?;
                }
                ondisk::BTRFS_XATTR_ITEM_KEY => items::parse_xattrs(&item, &mut g.xattrs)?,
                ondisk::BTRFS_DIR_INDEX_KEY if self.opts.dir_entries => {
                    items::parse_dir_index(&item, &mut g.entries)?;
                }
                ondisk::BTRFS_EXTENT_DATA_KEY if self.opts.extents => {
                    g.extents.push(FileExtent::parse(&item)?);
                }
                // DIR_ITEM duplicates DIR_INDEX; verity and unknown items
                // are not part of the model.
                _ => {}
            }
        }
        Ok(Some(g))
    }
}

impl Iterator for InodeWalker<'_> {
    type Item = Result<InodeGroup>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.next_group();
        if !matches!(r, Ok(Some(_))) {
            self.done = true;
        }
        r.transpose()
    }
}

/// The key of the last item with key ≤ `key`, or `None` when every key is
/// larger. Descends once: node pointer keys are their children's first
/// keys, so the leaf reached holds the answer.
///
/// # Errors
///
/// Tree read errors.
pub fn search_le<S: BlockSource>(source: S, root: TreeRoot, key: &Key) -> Result<Option<Key>> {
    let mut expect = BlockExpect {
        logical: root.logical,
        tree: root.tree,
        generation: root.generation,
        level: root.level,
        first_key: None,
    };
    loop {
        let block = source.read_block(&expect)?;
        let node = block.node();
        let slot = match node.search(key) {
            Ok(s) => s,
            Err(0) => return Ok(None),
            Err(s) => s.saturating_sub(1),
        };
        if node.is_leaf() {
            return Ok(node.key(slot));
        }
        let Some(ptr) = node.ptr(slot) else {
            return Ok(None);
        };
        expect = BlockExpect {
            logical: ptr.blockptr,
            tree: root.tree,
            generation: ptr.generation,
            level: node.level().saturating_sub(1),
            first_key: Some(ptr.key),
        };
    }
}
