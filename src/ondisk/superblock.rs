//! The superblock: `btrfs_super_block`, `btrfs_root_backup`, `btrfs_dev_item`
//! (btrfs_tree.h).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{U16, U32, U64};

/// `struct btrfs_dev_item` (98 bytes): in the chunk tree and in each
/// superblock.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DevItem {
    /// Device id.
    pub devid: U64,
    /// Size of the device.
    pub total_bytes: U64,
    /// Bytes allocated to chunks.
    pub bytes_used: U64,
    /// Informational.
    pub io_align: U32,
    /// Informational.
    pub io_width: U32,
    /// Informational.
    pub sector_size: U32,
    /// Unused.
    pub dev_type: U64,
    /// Unused.
    pub generation: U64,
    /// Unused.
    pub start_offset: U64,
    /// Unused.
    pub dev_group: U32,
    /// Unused.
    pub seek_speed: u8,
    /// Unused.
    pub bandwidth: u8,
    /// Device UUID.
    pub uuid: [u8; 16],
    /// Metadata UUID of the filesystem the device belongs to.
    pub fsid: [u8; 16],
}
const _: () = assert!(size_of::<DevItem>() == 98);

/// `struct btrfs_root_backup` (168 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct BackupRoot {
    /// Root tree root.
    pub tree_root: U64,
    /// Its generation.
    pub tree_root_gen: U64,
    /// Chunk tree root.
    pub chunk_root: U64,
    /// Its generation.
    pub chunk_root_gen: U64,
    /// Extent tree root.
    pub extent_root: U64,
    /// Its generation.
    pub extent_root_gen: U64,
    /// FS tree root.
    pub fs_root: U64,
    /// Its generation.
    pub fs_root_gen: U64,
    /// Dev tree root.
    pub dev_root: U64,
    /// Its generation.
    pub dev_root_gen: U64,
    /// Csum tree root.
    pub csum_root: U64,
    /// Its generation.
    pub csum_root_gen: U64,
    /// Total bytes at that commit.
    pub total_bytes: U64,
    /// Used bytes at that commit.
    pub bytes_used: U64,
    /// Devices at that commit.
    pub num_devices: U64,
    /// Unused.
    pub unused_64: [U64; 4],
    /// Root tree level.
    pub tree_root_level: u8,
    /// Chunk tree level.
    pub chunk_root_level: u8,
    /// Extent tree level.
    pub extent_root_level: u8,
    /// FS tree level.
    pub fs_root_level: u8,
    /// Dev tree level.
    pub dev_root_level: u8,
    /// Csum tree level.
    pub csum_root_level: u8,
    /// Unused.
    pub unused_8: [u8; 10],
}
const _: () = assert!(size_of::<BackupRoot>() == 168);

/// `struct btrfs_super_block` (4096 bytes, checksummed from byte 0x20).
#[derive(Debug, Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SuperBlock {
    /// Checksum of bytes 0x20..0x1000.
    pub csum: [u8; 32],
    /// Filesystem UUID.
    pub fsid: [u8; 16],
    /// Physical offset of this copy.
    pub bytenr: U64,
    /// `BTRFS_SUPER_FLAG_*`.
    pub flags: U64,
    /// `_BHRfS_M`.
    pub magic: U64,
    /// Last committed transaction.
    pub generation: U64,
    /// Logical address of the root tree root.
    pub root: U64,
    /// Logical address of the chunk tree root.
    pub chunk_root: U64,
    /// Logical address of the log root tree, 0 if none.
    pub log_root: U64,
    /// Unused.
    pub log_root_transid: U64,
    /// Sum of device sizes.
    pub total_bytes: U64,
    /// Bytes used.
    pub bytes_used: U64,
    /// Always 6.
    pub root_dir_objectid: U64,
    /// Number of devices.
    pub num_devices: U64,
    /// Data block size.
    pub sectorsize: U32,
    /// Tree block size.
    pub nodesize: U32,
    /// Obsolete; equals nodesize.
    pub leafsize: U32,
    /// Informational.
    pub stripesize: U32,
    /// Valid bytes of `sys_chunk_array`.
    pub sys_chunk_array_size: U32,
    /// Generation of the chunk root.
    pub chunk_root_generation: U64,
    /// None defined.
    pub compat_flags: U64,
    /// `BTRFS_FEATURE_COMPAT_RO_*`.
    pub compat_ro_flags: U64,
    /// `BTRFS_FEATURE_INCOMPAT_*`.
    pub incompat_flags: U64,
    /// `BTRFS_CSUM_TYPE_*`.
    pub csum_type: U16,
    /// Level of the root tree root.
    pub root_level: u8,
    /// Level of the chunk tree root.
    pub chunk_root_level: u8,
    /// Level of the log root tree root.
    pub log_root_level: u8,
    /// This device.
    pub dev_item: DevItem,
    /// NUL-padded label.
    pub label: [u8; 256],
    /// Free-space-cache v1 generation.
    pub cache_generation: U64,
    /// UUID tree generation.
    pub uuid_tree_generation: U64,
    /// Metadata UUID (only with INCOMPAT_METADATA_UUID).
    pub metadata_uuid: [u8; 16],
    /// Extent-tree-v2 only.
    pub nr_global_roots: U64,
    /// Remap tree root (experimental).
    pub remap_root: U64,
    /// Remap tree generation.
    pub remap_root_generation: U64,
    /// Remap tree level.
    pub remap_root_level: u8,
    /// Zero.
    pub reserved: [u8; 199],
    /// Embedded SYSTEM chunk items.
    pub sys_chunk_array: [u8; 2048],
    /// Backup roots ring.
    pub super_roots: [BackupRoot; 4],
    /// Zero.
    pub padding: [u8; 565],
}
const _: () = assert!(size_of::<SuperBlock>() == 4096);
const _: () = assert!(core::mem::offset_of!(SuperBlock, dev_item) == 0xC9);
const _: () = assert!(core::mem::offset_of!(SuperBlock, metadata_uuid) == 0x23B);
const _: () = assert!(core::mem::offset_of!(SuperBlock, sys_chunk_array) == 0x32B);
const _: () = assert!(core::mem::offset_of!(SuperBlock, super_roots) == 0xB2B);
