//! Constants: magic, item types, well-known objectids, flags and feature
//! bits (btrfs_tree.h, btrfs.h, ctree.h).

#![allow(missing_docs)] // the names are btrfs-progs' own; the doc tables explain them

// --- Superblock ---------------------------------------------------------

/// `_BHRfS_M` as a little-endian u64.
pub const BTRFS_MAGIC: u64 = 0x4D5F_5366_5248_425F;
/// Size of a superblock copy.
pub const BTRFS_SUPER_INFO_SIZE: usize = 4096;
/// Physical offset of the primary superblock.
pub const BTRFS_SUPER_INFO_OFFSET: u64 = 0x1_0000;
/// Number of superblock copies (primary + 2 mirrors).
pub const BTRFS_SUPER_MIRROR_MAX: u32 = 3;
/// Shift between mirror locations: copy i > 0 is at `16 KiB << (12 * i)`.
pub const BTRFS_SUPER_MIRROR_SHIFT: u32 = 12;
/// Bytes of the superblock that are not checksummed (the csum itself).
pub const BTRFS_CSUM_SIZE: usize = 32;
/// Capacity of `sys_chunk_array`.
pub const BTRFS_SYSTEM_CHUNK_ARRAY_SIZE: usize = 2048;
/// Maximum tree height.
pub const BTRFS_MAX_LEVEL: u8 = 8;
/// Stripe length of every chunk.
pub const BTRFS_STRIPE_LEN: u64 = 0x1_0000;
/// Size of a UUID.
pub const BTRFS_UUID_SIZE: usize = 16;

pub const BTRFS_SUPER_FLAG_WRITTEN: u64 = 1 << 0;
pub const BTRFS_SUPER_FLAG_ERROR: u64 = 1 << 2;
pub const BTRFS_SUPER_FLAG_SEEDING: u64 = 1 << 32;
pub const BTRFS_SUPER_FLAG_METADUMP: u64 = 1 << 33;
pub const BTRFS_SUPER_FLAG_METADUMP_V2: u64 = 1 << 34;
pub const BTRFS_SUPER_FLAG_CHANGING_FSID: u64 = 1 << 35;
pub const BTRFS_SUPER_FLAG_CHANGING_FSID_V2: u64 = 1 << 36;
pub const BTRFS_SUPER_FLAG_CHANGING_BG_TREE: u64 = 1 << 38;
pub const BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM: u64 = 1 << 39;
pub const BTRFS_SUPER_FLAG_CHANGING_META_CSUM: u64 = 1 << 40;

pub const BTRFS_CSUM_TYPE_CRC32: u16 = 0;
pub const BTRFS_CSUM_TYPE_XXHASH: u16 = 1;
pub const BTRFS_CSUM_TYPE_SHA256: u16 = 2;
pub const BTRFS_CSUM_TYPE_BLAKE2: u16 = 3;

// --- Feature bits ---------------------------------------------------------

pub const BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE: u64 = 1 << 0;
pub const BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID: u64 = 1 << 1;
pub const BTRFS_FEATURE_COMPAT_RO_VERITY: u64 = 1 << 2;
pub const BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE: u64 = 1 << 3;

pub const BTRFS_FEATURE_INCOMPAT_MIXED_BACKREF: u64 = 1 << 0;
pub const BTRFS_FEATURE_INCOMPAT_DEFAULT_SUBVOL: u64 = 1 << 1;
pub const BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS: u64 = 1 << 2;
pub const BTRFS_FEATURE_INCOMPAT_COMPRESS_LZO: u64 = 1 << 3;
pub const BTRFS_FEATURE_INCOMPAT_COMPRESS_ZSTD: u64 = 1 << 4;
pub const BTRFS_FEATURE_INCOMPAT_BIG_METADATA: u64 = 1 << 5;
pub const BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF: u64 = 1 << 6;
pub const BTRFS_FEATURE_INCOMPAT_RAID56: u64 = 1 << 7;
pub const BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA: u64 = 1 << 8;
pub const BTRFS_FEATURE_INCOMPAT_NO_HOLES: u64 = 1 << 9;
pub const BTRFS_FEATURE_INCOMPAT_METADATA_UUID: u64 = 1 << 10;
pub const BTRFS_FEATURE_INCOMPAT_RAID1C34: u64 = 1 << 11;
pub const BTRFS_FEATURE_INCOMPAT_ZONED: u64 = 1 << 12;
pub const BTRFS_FEATURE_INCOMPAT_EXTENT_TREE_V2: u64 = 1 << 13;
pub const BTRFS_FEATURE_INCOMPAT_RAID_STRIPE_TREE: u64 = 1 << 14;
pub const BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA: u64 = 1 << 16;
pub const BTRFS_FEATURE_INCOMPAT_REMAP_TREE: u64 = 1 << 17;

// --- Objectids ----------------------------------------------------------

pub const BTRFS_DEV_STATS_OBJECTID: u64 = 0;
pub const BTRFS_ROOT_TREE_OBJECTID: u64 = 1;
pub const BTRFS_DEV_ITEMS_OBJECTID: u64 = 1;
pub const BTRFS_EXTENT_TREE_OBJECTID: u64 = 2;
pub const BTRFS_CHUNK_TREE_OBJECTID: u64 = 3;
pub const BTRFS_DEV_TREE_OBJECTID: u64 = 4;
pub const BTRFS_FS_TREE_OBJECTID: u64 = 5;
pub const BTRFS_ROOT_TREE_DIR_OBJECTID: u64 = 6;
pub const BTRFS_CSUM_TREE_OBJECTID: u64 = 7;
pub const BTRFS_QUOTA_TREE_OBJECTID: u64 = 8;
pub const BTRFS_UUID_TREE_OBJECTID: u64 = 9;
pub const BTRFS_FREE_SPACE_TREE_OBJECTID: u64 = 10;
pub const BTRFS_BLOCK_GROUP_TREE_OBJECTID: u64 = 11;
pub const BTRFS_RAID_STRIPE_TREE_OBJECTID: u64 = 12;
pub const BTRFS_REMAP_TREE_OBJECTID: u64 = 13;
pub const BTRFS_BALANCE_OBJECTID: u64 = !3; // -4
pub const BTRFS_ORPHAN_OBJECTID: u64 = !4; // -5
pub const BTRFS_TREE_LOG_OBJECTID: u64 = !5; // -6
pub const BTRFS_TREE_LOG_FIXUP_OBJECTID: u64 = !6; // -7
pub const BTRFS_TREE_RELOC_OBJECTID: u64 = !7; // -8
pub const BTRFS_DATA_RELOC_TREE_OBJECTID: u64 = !8; // -9
pub const BTRFS_EXTENT_CSUM_OBJECTID: u64 = !9; // -10
pub const BTRFS_FREE_SPACE_OBJECTID: u64 = !10; // -11
pub const BTRFS_FREE_INO_OBJECTID: u64 = !11; // -12
pub const BTRFS_CSUM_CHANGE_OBJECTID: u64 = !12; // -13
pub const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;
pub const BTRFS_LAST_FREE_OBJECTID: u64 = !255; // -256
pub const BTRFS_FIRST_CHUNK_TREE_OBJECTID: u64 = 256;

// --- Item types ---------------------------------------------------------

pub const BTRFS_INODE_ITEM_KEY: u8 = 1;
pub const BTRFS_INODE_REF_KEY: u8 = 12;
pub const BTRFS_INODE_EXTREF_KEY: u8 = 13;
pub const BTRFS_XATTR_ITEM_KEY: u8 = 24;
pub const BTRFS_VERITY_DESC_ITEM_KEY: u8 = 36;
pub const BTRFS_VERITY_MERKLE_ITEM_KEY: u8 = 37;
pub const BTRFS_ORPHAN_ITEM_KEY: u8 = 48;
pub const BTRFS_DIR_LOG_ITEM_KEY: u8 = 60;
pub const BTRFS_DIR_LOG_INDEX_KEY: u8 = 72;
pub const BTRFS_DIR_ITEM_KEY: u8 = 84;
pub const BTRFS_DIR_INDEX_KEY: u8 = 96;
pub const BTRFS_EXTENT_DATA_KEY: u8 = 108;
pub const BTRFS_CSUM_ITEM_KEY: u8 = 120;
pub const BTRFS_EXTENT_CSUM_KEY: u8 = 128;
pub const BTRFS_ROOT_ITEM_KEY: u8 = 132;
pub const BTRFS_ROOT_BACKREF_KEY: u8 = 144;
pub const BTRFS_ROOT_REF_KEY: u8 = 156;
pub const BTRFS_EXTENT_ITEM_KEY: u8 = 168;
pub const BTRFS_METADATA_ITEM_KEY: u8 = 169;
pub const BTRFS_EXTENT_OWNER_REF_KEY: u8 = 172;
pub const BTRFS_TREE_BLOCK_REF_KEY: u8 = 176;
pub const BTRFS_EXTENT_DATA_REF_KEY: u8 = 178;
pub const BTRFS_EXTENT_REF_V0_KEY: u8 = 180;
pub const BTRFS_SHARED_BLOCK_REF_KEY: u8 = 182;
pub const BTRFS_SHARED_DATA_REF_KEY: u8 = 184;
pub const BTRFS_BLOCK_GROUP_ITEM_KEY: u8 = 192;
pub const BTRFS_FREE_SPACE_INFO_KEY: u8 = 198;
pub const BTRFS_FREE_SPACE_EXTENT_KEY: u8 = 199;
pub const BTRFS_FREE_SPACE_BITMAP_KEY: u8 = 200;
pub const BTRFS_DEV_EXTENT_KEY: u8 = 204;
pub const BTRFS_DEV_ITEM_KEY: u8 = 216;
pub const BTRFS_CHUNK_ITEM_KEY: u8 = 228;
pub const BTRFS_RAID_STRIPE_KEY: u8 = 230;
pub const BTRFS_IDENTITY_REMAP_KEY: u8 = 234;
pub const BTRFS_REMAP_KEY: u8 = 235;
pub const BTRFS_REMAP_BACKREF_KEY: u8 = 236;
pub const BTRFS_QGROUP_STATUS_KEY: u8 = 240;
pub const BTRFS_QGROUP_INFO_KEY: u8 = 242;
pub const BTRFS_QGROUP_LIMIT_KEY: u8 = 244;
pub const BTRFS_QGROUP_RELATION_KEY: u8 = 246;
pub const BTRFS_TEMPORARY_ITEM_KEY: u8 = 248;
pub const BTRFS_PERSISTENT_ITEM_KEY: u8 = 249;
pub const BTRFS_DEV_REPLACE_KEY: u8 = 250;
pub const BTRFS_UUID_KEY_SUBVOL: u8 = 251;
pub const BTRFS_UUID_KEY_RECEIVED_SUBVOL: u8 = 252;
pub const BTRFS_STRING_ITEM_KEY: u8 = 253;

// --- Block group / chunk type bits -------------------------------------------

pub const BTRFS_BLOCK_GROUP_DATA: u64 = 1 << 0;
pub const BTRFS_BLOCK_GROUP_SYSTEM: u64 = 1 << 1;
pub const BTRFS_BLOCK_GROUP_METADATA: u64 = 1 << 2;
pub const BTRFS_BLOCK_GROUP_RAID0: u64 = 1 << 3;
pub const BTRFS_BLOCK_GROUP_RAID1: u64 = 1 << 4;
pub const BTRFS_BLOCK_GROUP_DUP: u64 = 1 << 5;
pub const BTRFS_BLOCK_GROUP_RAID10: u64 = 1 << 6;
pub const BTRFS_BLOCK_GROUP_RAID5: u64 = 1 << 7;
pub const BTRFS_BLOCK_GROUP_RAID6: u64 = 1 << 8;
pub const BTRFS_BLOCK_GROUP_RAID1C3: u64 = 1 << 9;
pub const BTRFS_BLOCK_GROUP_RAID1C4: u64 = 1 << 10;
pub const BTRFS_BLOCK_GROUP_REMAPPED: u64 = 1 << 11;
pub const BTRFS_BLOCK_GROUP_METADATA_REMAP: u64 = 1 << 12;
pub const BTRFS_BLOCK_GROUP_TYPE_MASK: u64 =
    BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_SYSTEM | BTRFS_BLOCK_GROUP_METADATA;
pub const BTRFS_BLOCK_GROUP_PROFILE_MASK: u64 = BTRFS_BLOCK_GROUP_RAID0
    | BTRFS_BLOCK_GROUP_RAID1
    | BTRFS_BLOCK_GROUP_DUP
    | BTRFS_BLOCK_GROUP_RAID10
    | BTRFS_BLOCK_GROUP_RAID5
    | BTRFS_BLOCK_GROUP_RAID6
    | BTRFS_BLOCK_GROUP_RAID1C3
    | BTRFS_BLOCK_GROUP_RAID1C4;

// --- Tree block header flags ------------------------------------------------

pub const BTRFS_HEADER_FLAG_WRITTEN: u64 = 1 << 0;
pub const BTRFS_HEADER_FLAG_RELOC: u64 = 1 << 1;
/// The backref revision lives in the top byte of the header flags.
pub const BTRFS_BACKREF_REV_SHIFT: u32 = 56;
pub const BTRFS_MIXED_BACKREF_REV: u64 = 1;

// --- Root item flags -----------------------------------------------------

pub const BTRFS_ROOT_SUBVOL_RDONLY: u64 = 1 << 0;
pub const BTRFS_ROOT_SUBVOL_DEAD: u64 = 1 << 48;

// --- Inode flags -----------------------------------------------------------

pub const BTRFS_INODE_NODATASUM: u64 = 1 << 0;
pub const BTRFS_INODE_NODATACOW: u64 = 1 << 1;
pub const BTRFS_INODE_READONLY: u64 = 1 << 2;
pub const BTRFS_INODE_NOCOMPRESS: u64 = 1 << 3;
pub const BTRFS_INODE_PREALLOC: u64 = 1 << 4;
pub const BTRFS_INODE_SYNC: u64 = 1 << 5;
pub const BTRFS_INODE_IMMUTABLE: u64 = 1 << 6;
pub const BTRFS_INODE_APPEND: u64 = 1 << 7;
pub const BTRFS_INODE_NODUMP: u64 = 1 << 8;
pub const BTRFS_INODE_NOATIME: u64 = 1 << 9;
pub const BTRFS_INODE_DIRSYNC: u64 = 1 << 10;
pub const BTRFS_INODE_COMPRESS: u64 = 1 << 11;
pub const BTRFS_INODE_ROOT_ITEM_INIT: u64 = 1 << 31;
pub const BTRFS_INODE_RO_VERITY: u64 = 1 << 32;

// --- Directory entry types -------------------------------------------------

pub const BTRFS_FT_UNKNOWN: u8 = 0;
pub const BTRFS_FT_REG_FILE: u8 = 1;
pub const BTRFS_FT_DIR: u8 = 2;
pub const BTRFS_FT_CHRDEV: u8 = 3;
pub const BTRFS_FT_BLKDEV: u8 = 4;
pub const BTRFS_FT_FIFO: u8 = 5;
pub const BTRFS_FT_SOCK: u8 = 6;
pub const BTRFS_FT_SYMLINK: u8 = 7;
pub const BTRFS_FT_XATTR: u8 = 8;
pub const BTRFS_FT_ENCRYPTED: u8 = 0x80;

// --- File extents ------------------------------------------------------------

pub const BTRFS_FILE_EXTENT_INLINE: u8 = 0;
pub const BTRFS_FILE_EXTENT_REG: u8 = 1;
pub const BTRFS_FILE_EXTENT_PREALLOC: u8 = 2;
pub const BTRFS_COMPRESS_NONE: u8 = 0;
pub const BTRFS_COMPRESS_ZLIB: u8 = 1;
pub const BTRFS_COMPRESS_LZO: u8 = 2;
pub const BTRFS_COMPRESS_ZSTD: u8 = 3;

// --- Extent items --------------------------------------------------------------

pub const BTRFS_EXTENT_FLAG_DATA: u64 = 1 << 0;
pub const BTRFS_EXTENT_FLAG_TREE_BLOCK: u64 = 1 << 1;
pub const BTRFS_BLOCK_FLAG_FULL_BACKREF: u64 = 1 << 8;
