//! Raw on-disk structures: our `btrfs_tree.h`.
//!
//! Each struct mirrors one C struct of btrfs-progs
//! `kernel-shared/uapi/btrfs_tree.h` byte for byte: `#[repr(C)]`, every field
//! little-endian or a byte array, so the `Unaligned` derive holds and a view
//! can be taken anywhere in a block. Each size is pinned with a `const`
//! assertion. Enum-like fields stay raw integers; the layers above convert
//! them and report unknown values as `Unsupported`. No logic lives here.
//!
//! Offsets and sizes: Linux `include/uapi/linux/btrfs_tree.h` and
//! `fs/btrfs/accessors.h`, btrfs-progs `kernel-shared/uapi/btrfs_tree.h`.

#![warn(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::as_conversions
)]

mod chunk;
pub mod consts;
mod items;
mod superblock;
mod tree;

pub use chunk::{Chunk, Stripe};
pub use consts::*;
pub use items::{
    BlockGroupItem, DevExtent, DirItem, ExtentDataRef, ExtentItem, FileExtentItem,
    FileExtentItemHeader, InodeExtref, InodeItem, InodeRef, RootItem, RootRef, SharedDataRef,
    Timespec, TreeBlockInfo,
};
pub use superblock::{BackupRoot, DevItem, SuperBlock};
pub use tree::{DiskKey, Header, Item, KeyPtr};

/// The byte-order-aware integer types every raw struct uses.
pub use zerocopy::little_endian::{U16, U32, U64};

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromBytes;

    #[test]
    fn views_at_odd_offsets() {
        // Unaligned structs can be viewed anywhere, e.g. an item header at
        // byte 101 of a leaf.
        let mut buf = [0u8; 200];
        buf[101] = 7;
        let (item, _) = Item::ref_from_prefix(&buf[101..]).unwrap();
        assert_eq!(item.key.objectid.get(), 7);
    }
}
