//! Chunks: `btrfs_chunk` and `btrfs_stripe` (btrfs_tree.h).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{U16, U32, U64};

/// `struct btrfs_chunk` without its stripes (48 bytes); `num_stripes`
/// [`Stripe`]s follow it.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Chunk {
    /// Size of the chunk in logical bytes.
    pub length: U64,
    /// Always the extent tree (2).
    pub owner: U64,
    /// Stripe length; 64 KiB.
    pub stripe_len: U64,
    /// Block group type and profile bits (`BTRFS_BLOCK_GROUP_*`).
    pub chunk_type: U64,
    /// Informational.
    pub io_align: U32,
    /// Informational.
    pub io_width: U32,
    /// Equals the filesystem's sectorsize.
    pub sector_size: U32,
    /// Number of stripes that follow.
    pub num_stripes: U16,
    /// 2 for RAID10, 1 otherwise.
    pub sub_stripes: U16,
}
const _: () = assert!(size_of::<Chunk>() == 48);

/// `struct btrfs_stripe` (32 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Stripe {
    /// Device holding this stripe.
    pub devid: U64,
    /// Physical byte offset of the stripe on that device.
    pub offset: U64,
    /// UUID of that device.
    pub dev_uuid: [u8; 16],
}
const _: () = assert!(size_of::<Stripe>() == 32);
