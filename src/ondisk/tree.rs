//! Keys and tree blocks: `btrfs_disk_key`, `btrfs_header`, `btrfs_key_ptr`,
//! `btrfs_item` (btrfs_tree.h).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{U32, U64};

/// `struct btrfs_disk_key`: 17 bytes. Order is (objectid, type, offset),
/// each compared as an unsigned integer — not byte-wise.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct DiskKey {
    /// Object id (inode number, tree id, logical address, …).
    pub objectid: U64,
    /// Item type (`BTRFS_*_KEY`).
    pub item_type: u8,
    /// Type-dependent offset.
    pub offset: U64,
}
const _: () = assert!(size_of::<DiskKey>() == 17);

/// `struct btrfs_header`: the first 101 bytes of every tree block.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Header {
    /// Checksum of bytes 0x20..nodesize.
    pub csum: [u8; 32],
    /// Metadata UUID of the filesystem (fsid, or metadata_uuid).
    pub fsid: [u8; 16],
    /// Logical address of this block.
    pub bytenr: U64,
    /// Flags (low 56 bits) and backref revision (high 8 bits).
    pub flags: U64,
    /// UUID of the chunk tree.
    pub chunk_tree_uuid: [u8; 16],
    /// Transaction id that wrote this block.
    pub generation: U64,
    /// Tree that allocated this block.
    pub owner: U64,
    /// Number of key pointers (node) or items (leaf).
    pub nritems: U32,
    /// 0 for a leaf.
    pub level: u8,
}
const _: () = assert!(size_of::<Header>() == 101);

/// `struct btrfs_key_ptr`: one slot of an internal node (33 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct KeyPtr {
    /// Lowest key in the child subtree.
    pub key: DiskKey,
    /// Logical address of the child block.
    pub blockptr: U64,
    /// Expected generation of the child block.
    pub generation: U64,
}
const _: () = assert!(size_of::<KeyPtr>() == 33);

/// `struct btrfs_item`: one item header of a leaf (25 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Item {
    /// The item's key.
    pub key: DiskKey,
    /// Start of the data, relative to the end of the header.
    pub offset: U32,
    /// Length of the data.
    pub size: U32,
}
const _: () = assert!(size_of::<Item>() == 25);
