//! The filesystem model: trees found through the root tree, subvolumes,
//! and inside a subvolume tree ([`FsTree`]) inodes, names, directories,
//! xattrs, extents and file contents.
//!
//! Stage 4 of the data flow (device → chunk map → tree → **fs**).
//!
//! What the send planner calls: [`Filesystem::fs_tree`] for a subvolume,
//! then [`FsTree::inodes`] for the single key-order pass (one
//! [`InodeGroup`] per inode), [`FsTree::inode`], [`FsTree::dir_entries`],
//! [`FsTree::lookup`], [`FsTree::names`], [`FsTree::xattrs`],
//! [`FsTree::extents`] for random access, [`FsTree::segments`] for the
//! data/hole layout and [`FsTree::reader`] for the bytes.

pub mod compress;
pub mod data;
pub mod items;
pub mod manifest;
pub mod subvol;
pub mod tree;

use std::path::Path;

use crate::error::{CorruptKind, Error, Location, Result};
use crate::ondisk;
use crate::tree::key::Key;
use crate::tree::walk::{Cursor, TreeRoot};
use crate::types::TreeId;
use crate::volume::Volume;

pub use data::{ExtentReader, FileReader, Segment, SegmentKind, Segments};
pub use items::{
    Compression, DirEntry, DiskExtent, ExtentData, FileExtent, FileType, InlineData, Inode,
    InodeName, Target, Timespec, Xattr,
};
pub use subvol::{RootInfo, Subvolume};
pub use tree::{DirEntries, Extents, FsTree, InodeGroup, InodeWalker, WalkOptions};

/// An opened filesystem.
#[derive(Debug)]
pub struct Filesystem {
    volume: Volume,
}

impl Filesystem {
    /// Open the devices of a filesystem and check what the kernel checks
    /// when it mounts one ([`Volume::check_mountable`]).
    ///
    /// # Errors
    ///
    /// As [`Volume::open`] and [`Volume::check_mountable`].
    pub fn open<P: AsRef<Path>>(paths: &[P]) -> Result<Filesystem> {
        Filesystem::open_with(paths, &crate::device::readahead::ReadOptions::default())
    }

    /// [`open`](Self::open) with these read options (e.g.
    /// [`ReadOptions::degraded`](crate::device::readahead::ReadOptions::degraded)).
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub fn open_with<P: AsRef<Path>>(
        paths: &[P],
        options: &crate::device::readahead::ReadOptions,
    ) -> Result<Filesystem> {
        let volume = Volume::open_with(paths, options)?;
        volume.check_mountable()?;
        Ok(Filesystem { volume })
    }

    /// Wrap an assembled volume, without the checks of
    /// [`Volume::check_mountable`] (a mounted filesystem passed them when
    /// the kernel mounted it).
    pub fn from_volume(volume: Volume) -> Filesystem {
        Filesystem { volume }
    }

    /// The devices and chunk map.
    pub fn volume(&self) -> &Volume {
        &self.volume
    }

    /// The ROOT_ITEM of tree `id`: the first item `(id, ROOT_ITEM, *)`.
    ///
    /// # Errors
    ///
    /// Tree read errors; a malformed root item.
    pub fn root_item(&self, id: TreeId) -> Result<Option<RootInfo>> {
        let mut cursor = Cursor::new(&self.volume, self.volume.root_tree());
        cursor.seek(&Key::new(id.get(), ondisk::BTRFS_ROOT_ITEM_KEY, 0))?;
        match cursor.current() {
            Some(item)
                if item.key.objectid == id.get()
                    && item.key.item_type == ondisk::BTRFS_ROOT_ITEM_KEY =>
            {
                RootInfo::parse(&item).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Where tree `id` starts.
    ///
    /// # Errors
    ///
    /// [`CorruptKind::MissingItem`] when it has no ROOT_ITEM.
    pub fn tree_root(&self, id: TreeId) -> Result<TreeRoot> {
        self.root_item(id)?.map(|r| r.tree_root()).ok_or_else(|| {
            Error::corrupt(
                Location::Tree(TreeId::ROOT),
                CorruptKind::MissingItem {
                    what: "root item",
                    key: Key::new(id.get(), ondisk::BTRFS_ROOT_ITEM_KEY, 0),
                },
            )
        })
    }
}
