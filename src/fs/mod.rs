//! The filesystem model: trees found through the root tree, subvolumes,
//! and (later) inodes, directories, xattrs and extents.
//!
//! Stage 4 of the data flow (device → chunk map → tree → **fs**).

pub mod subvol;

use std::path::Path;

use crate::error::{CorruptKind, Error, Location, Result};
use crate::ondisk;
use crate::tree::key::Key;
use crate::tree::walk::{Cursor, TreeRoot};
use crate::types::TreeId;
use crate::volume::Volume;

pub use subvol::{RootInfo, Subvolume};

/// An opened filesystem.
#[derive(Debug)]
pub struct Filesystem {
    volume: Volume,
}

impl Filesystem {
    /// Open the devices of a filesystem.
    ///
    /// # Errors
    ///
    /// As [`Volume::open`].
    pub fn open<P: AsRef<Path>>(paths: &[P]) -> Result<Filesystem> {
        Ok(Filesystem {
            volume: Volume::open(paths)?,
        })
    }

    /// Wrap an assembled volume.
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
