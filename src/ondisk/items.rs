//! Item payloads of the root, fs, extent and dev trees (btrfs_tree.h).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{DiskKey, U16, U32, U64};

/// `struct btrfs_timespec` (12 bytes). `sec` is signed in meaning.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Timespec {
    /// Seconds since the epoch (two's complement).
    pub sec: U64,
    /// Nanoseconds.
    pub nsec: U32,
}
const _: () = assert!(size_of::<Timespec>() == 12);

/// `struct btrfs_inode_item` (160 bytes), key `(ino, INODE_ITEM, 0)`.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct InodeItem {
    /// Transid that created the inode.
    pub generation: U64,
    /// Last transid that modified it.
    pub transid: U64,
    /// i_size.
    pub size: U64,
    /// Bytes allocated.
    pub nbytes: U64,
    /// Unused hint.
    pub block_group: U64,
    /// Link count.
    pub nlink: U32,
    /// Owner.
    pub uid: U32,
    /// Group.
    pub gid: U32,
    /// File type and permissions.
    pub mode: U32,
    /// Kernel-internal dev_t.
    pub rdev: U64,
    /// Inode flags (low 32 bits) and ro flags (high 32 bits).
    pub flags: U64,
    /// NFS i_version.
    pub sequence: U64,
    /// Zero.
    pub reserved: [U64; 4],
    /// Access time.
    pub atime: Timespec,
    /// Change time.
    pub ctime: Timespec,
    /// Modification time.
    pub mtime: Timespec,
    /// Birth time.
    pub otime: Timespec,
}
const _: () = assert!(size_of::<InodeItem>() == 160);

/// `struct btrfs_root_item` (439 bytes; legacy items end after `level`, at
/// [`RootItem::LEGACY_SIZE`] = 239 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RootItem {
    /// Embedded stub inode.
    pub inode: InodeItem,
    /// Last update of this root item.
    pub generation: U64,
    /// 256 for subvolumes.
    pub root_dirid: U64,
    /// Logical address of the root node.
    pub bytenr: U64,
    /// Unused.
    pub byte_limit: U64,
    /// Bytes used.
    pub bytes_used: U64,
    /// Transid of the last snapshot taken of this root.
    pub last_snapshot: U64,
    /// `BTRFS_ROOT_SUBVOL_RDONLY`, `BTRFS_ROOT_SUBVOL_DEAD`.
    pub flags: U64,
    /// 0 when the subvolume is deleted.
    pub refs: U32,
    /// Where deletion stopped.
    pub drop_progress: DiskKey,
    /// Level where deletion stopped.
    pub drop_level: u8,
    /// Level of the root node.
    pub level: u8,
    /// The fields below are valid when this equals `generation`.
    pub generation_v2: U64,
    /// Subvolume UUID.
    pub uuid: [u8; 16],
    /// UUID of the snapshot source.
    pub parent_uuid: [u8; 16],
    /// UUID of the received subvolume.
    pub received_uuid: [u8; 16],
    /// Last change inside the subvolume.
    pub ctransid: U64,
    /// Creation transid.
    pub otransid: U64,
    /// Sender's ctransid (received subvolumes).
    pub stransid: U64,
    /// Receive transid.
    pub rtransid: U64,
    /// Change time.
    pub ctime: Timespec,
    /// Creation time.
    pub otime: Timespec,
    /// Send time.
    pub stime: Timespec,
    /// Receive time.
    pub rtime: Timespec,
    /// Zero.
    pub reserved: [U64; 8],
}
const _: () = assert!(size_of::<RootItem>() == 439);
const _: () = assert!(core::mem::offset_of!(RootItem, generation_v2) == RootItem::LEGACY_SIZE);

impl RootItem {
    /// Size of a legacy (pre-3.x) root item, which ends before `generation_v2`.
    pub const LEGACY_SIZE: usize = 239;
}

/// `struct btrfs_root_ref` (18 bytes + name): ROOT_REF and ROOT_BACKREF.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RootRef {
    /// Directory inode in the parent subvolume holding the entry.
    pub dirid: U64,
    /// DIR_INDEX index of the entry.
    pub sequence: U64,
    /// Length of the name that follows.
    pub name_len: U16,
}
const _: () = assert!(size_of::<RootRef>() == 18);

/// `struct btrfs_inode_ref` (10 bytes + name), repeated in one item.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct InodeRef {
    /// DIR_INDEX index of this name.
    pub index: U64,
    /// Length of the name that follows.
    pub name_len: U16,
}
const _: () = assert!(size_of::<InodeRef>() == 10);

/// `struct btrfs_inode_extref` (18 bytes + name), repeated in one item.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct InodeExtref {
    /// Parent directory inode.
    pub parent_objectid: U64,
    /// DIR_INDEX index of this name.
    pub index: U64,
    /// Length of the name that follows.
    pub name_len: U16,
}
const _: () = assert!(size_of::<InodeExtref>() == 18);

/// `struct btrfs_dir_item` (30 bytes + name + data), repeated in one item.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DirItem {
    /// Target: an INODE_ITEM or ROOT_ITEM key; zero for xattrs.
    pub location: DiskKey,
    /// Transid of creation.
    pub transid: U64,
    /// Length of the data (xattr value) after the name.
    pub data_len: U16,
    /// Length of the name.
    pub name_len: U16,
    /// `BTRFS_FT_*`.
    pub dir_type: u8,
}
const _: () = assert!(size_of::<DirItem>() == 30);

/// The first 21 bytes of `struct btrfs_file_extent_item`, shared by inline
/// and regular extents; inline data follows directly.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct FileExtentItemHeader {
    /// Transid that created the extent.
    pub generation: U64,
    /// Decoded size.
    pub ram_bytes: U64,
    /// `BTRFS_COMPRESS_*`.
    pub compression: u8,
    /// Must be 0.
    pub encryption: u8,
    /// Must be 0.
    pub other_encoding: U16,
    /// `BTRFS_FILE_EXTENT_*`.
    pub extent_type: u8,
}
const _: () = assert!(size_of::<FileExtentItemHeader>() == 21);

/// `struct btrfs_file_extent_item` of a regular or prealloc extent (53 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct FileExtentItem {
    /// Common part.
    pub header: FileExtentItemHeader,
    /// Logical address of the on-disk extent; 0 for a hole.
    pub disk_bytenr: U64,
    /// On-disk (possibly compressed) size.
    pub disk_num_bytes: U64,
    /// Offset into the decoded extent.
    pub offset: U64,
    /// Length of the file range.
    pub num_bytes: U64,
}
const _: () = assert!(size_of::<FileExtentItem>() == 53);

/// `struct btrfs_extent_item` (24 bytes); inline refs follow.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ExtentItem {
    /// Reference count.
    pub refs: U64,
    /// Allocation transid.
    pub generation: U64,
    /// `BTRFS_EXTENT_FLAG_*`.
    pub flags: U64,
}
const _: () = assert!(size_of::<ExtentItem>() == 24);

/// `struct btrfs_tree_block_info` (18 bytes), after a non-skinny tree-block
/// EXTENT_ITEM.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct TreeBlockInfo {
    /// First key of the block.
    pub key: DiskKey,
    /// Level of the block.
    pub level: u8,
}
const _: () = assert!(size_of::<TreeBlockInfo>() == 18);

/// `struct btrfs_extent_data_ref` (28 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ExtentDataRef {
    /// Subvolume tree.
    pub root: U64,
    /// Inode.
    pub objectid: U64,
    /// File offset where the extent would start.
    pub offset: U64,
    /// Number of file extent items.
    pub count: U32,
}
const _: () = assert!(size_of::<ExtentDataRef>() == 28);

/// `struct btrfs_shared_data_ref` (4 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SharedDataRef {
    /// Number of file extent items in the parent leaf.
    pub count: U32,
}
const _: () = assert!(size_of::<SharedDataRef>() == 4);

/// `struct btrfs_block_group_item` (24 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct BlockGroupItem {
    /// Bytes used.
    pub used: U64,
    /// Always 256.
    pub chunk_objectid: U64,
    /// Type and profile bits.
    pub flags: U64,
}
const _: () = assert!(size_of::<BlockGroupItem>() == 24);

/// `struct btrfs_dev_extent` (48 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DevExtent {
    /// Always 3.
    pub chunk_tree: U64,
    /// Always 256.
    pub chunk_objectid: U64,
    /// Logical start of the chunk.
    pub chunk_offset: U64,
    /// Length.
    pub length: U64,
    /// Chunk tree UUID.
    pub chunk_tree_uuid: [u8; 16],
}
const _: () = assert!(size_of::<DevExtent>() == 48);
