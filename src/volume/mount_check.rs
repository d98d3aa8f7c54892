//! What the kernel checks when it mounts a filesystem, beyond the
//! superblock and the chunk tree that [`Volume::open`] reads: the roots of
//! the trees `open_ctree` loads, the block groups against the chunks
//! (`block-group.c`: `read_bg_from_eb`, `check_chunk_block_group_mappings`),
//! the dev extents against the chunks and devices (`volumes.c`:
//! `btrfs_verify_dev_extents`), and the top-level subvolume's root
//! directory (`btrfs_fill_super` reads inode 256 of tree 5).
//!
//! Every leaf these reads pass through gets the item checks of
//! [`crate::tree::check`], as the kernel's tree-checker runs on each leaf
//! it reads at mount: a corrupt block group, extent or dev extent item in
//! them refuses the filesystem here, as it refuses the mount.
//!
//! The cost is the kernel's: one search per block group (in the extent
//! tree, or in the block group tree where the filesystem has one), a walk
//! of the dev tree (one item per stripe of each chunk), one root block per
//! tree.

use zerocopy::FromBytes;

use super::Volume;
use crate::chunk_map::ChunkInfo;
use crate::error::{CorruptKind, Error, Location, Result};
use crate::ondisk::{self, BlockGroupItem, DevExtent, RootItem};
use crate::tree::key::Key;
use crate::tree::walk::{BlockSource, Cursor, ItemRef, TreeRoot};
use crate::types::{Generation, Logical, TreeId};

/// Leaves a block group search may step forward before it searches from
/// the root: block groups follow each other in the extent tree, mostly a
/// few leaves apart.
const FORWARD_LEAVES: usize = 4;

impl Volume {
    /// Check what the kernel checks when it mounts this filesystem (see
    /// the [module](self) documentation); [`Filesystem::open`] calls it.
    ///
    /// [`Filesystem::open`]: crate::fs::Filesystem::open
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] naming the first item, block or chunk the kernel
    /// would refuse, and why; read errors.
    pub fn check_mountable(&self) -> Result<()> {
        match self.mount_checks() {
            // Degraded, a block whose every copy lies on a missing device
            // stops the checks, not the open: reads stay lazy, and the one
            // that needs such a block fails naming the device.
            Err(Error::MissingDevice { .. }) if self.read_options().degraded => Ok(()),
            r => r,
        }
    }

    fn mount_checks(&self) -> Result<()> {
        let sb = self.superblock();
        let extent = self.required_root(ondisk::BTRFS_EXTENT_TREE_OBJECTID)?;
        let dev = self.required_root(ondisk::BTRFS_DEV_TREE_OBJECTID)?;
        let fs = self.required_root(ondisk::BTRFS_FS_TREE_OBJECTID)?;
        let bg_tree = sb.compat_ro_flags & ondisk::BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE != 0;
        let fst = sb.compat_ro_flags & ondisk::BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE != 0;
        let mut optional = vec![
            ondisk::BTRFS_CSUM_TREE_OBJECTID,
            ondisk::BTRFS_UUID_TREE_OBJECTID,
            ondisk::BTRFS_QUOTA_TREE_OBJECTID,
            ondisk::BTRFS_DATA_RELOC_TREE_OBJECTID,
        ];
        if fst {
            optional.push(ondisk::BTRFS_FREE_SPACE_TREE_OBJECTID);
        }
        // The roots load first, each block read and checked.
        for root in [extent, dev, fs] {
            self.read_block(&root.expect())?;
        }
        for id in optional {
            if let Some(root) = self.tree_root_of(id)? {
                self.read_block(&root.expect())?;
            }
        }
        let bg_root = if bg_tree {
            let root = self.required_root(ondisk::BTRFS_BLOCK_GROUP_TREE_OBJECTID)?;
            self.read_block(&root.expect())?;
            root
        } else {
            extent
        };
        self.check_block_groups(bg_root)?;
        self.check_dev_extents(dev)?;
        self.check_fs_root_dir(fs)
    }

    /// The root of tree `id` from its ROOT_ITEM, if it has one.
    fn tree_root_of(&self, id: u64) -> Result<Option<TreeRoot>> {
        let mut c = Cursor::new(self, self.root_tree());
        c.seek(&Key::new(id, ondisk::BTRFS_ROOT_ITEM_KEY, 0))?;
        let Some(item) = c.current() else {
            return Ok(None);
        };
        if item.key.objectid != id || item.key.item_type != ondisk::BTRFS_ROOT_ITEM_KEY {
            return Ok(None);
        }
        // The leaf check already refused a root item of another size than
        // 439 or 239 (legacy) bytes; a legacy one reads as zeros past its
        // end, after the fields read here.
        let mut buf = [0u8; size_of::<RootItem>()];
        let n = item.data.len().min(buf.len());
        if let (Some(dst), Some(src)) = (buf.get_mut(..n), item.data.get(..n)) {
            dst.copy_from_slice(src);
        }
        let root = RootItem::read_from_bytes(&buf)
            .map_err(|_| item.truncated("root item", size_of::<RootItem>()))?;
        Ok(Some(TreeRoot {
            tree: TreeId(id),
            logical: Logical(root.bytenr.get()),
            level: root.level,
            generation: Generation(root.generation.get()),
        }))
    }

    fn required_root(&self, id: u64) -> Result<TreeRoot> {
        self.tree_root_of(id)?.ok_or_else(|| {
            Error::corrupt(
                Location::Tree(TreeId::ROOT),
                CorruptKind::MissingItem {
                    what: "root item",
                    key: Key::new(id, ondisk::BTRFS_ROOT_ITEM_KEY, 0),
                },
            )
        })
    }

    /// Every block group item, found as the kernel's
    /// `btrfs_read_block_groups` finds them (the next one at or after the
    /// end of the last), matches a chunk exactly, in start, length and
    /// type; then every chunk has its block group.
    fn check_block_groups(&self, root: TreeRoot) -> Result<()> {
        let chunks = self.chunk_map();
        let mut matched = vec![false; chunks.chunks().len()];
        let mut c = Cursor::new(self, root);
        let mut pos = 0u64;
        let mut first = true;
        loop {
            let key = Key::new(pos, ondisk::BTRFS_BLOCK_GROUP_ITEM_KEY, 0);
            if first {
                c.seek(&key)?;
                first = false;
            } else {
                c.seek_near(&key, FORWARD_LEAVES)?;
            }
            // The items between block groups (extent items) are read on
            // the way, as the kernel's search reads them.
            loop {
                match c.current() {
                    None => return chunk_without_block_group(root.tree, chunks.chunks(), &matched),
                    Some(it) if it.key.item_type == ondisk::BTRFS_BLOCK_GROUP_ITEM_KEY => break,
                    Some(_) => {
                        if !c.advance()? {
                            return chunk_without_block_group(root.tree, chunks.chunks(), &matched);
                        }
                    }
                }
            }
            let Some(item) = c.current() else { continue };
            let (start, len) = (item.key.objectid, item.key.offset);
            let mismatch = |rule, detail| {
                Err(Error::corrupt(
                    item.location(),
                    CorruptKind::Mismatch { rule, detail },
                ))
            };
            // The chunk overlapping the block group, as the kernel's
            // lookup_extent_mapping(start, len) finds it.
            let end = start.saturating_add(len);
            let hit = chunks
                .chunks()
                .iter()
                .position(|ch| ch.logical.get() < end && start < ch.end());
            let Some(i) = hit else {
                return mismatch(
                    "block group without a chunk",
                    format!("block group {start} length {len}: no chunk maps any of it"),
                );
            };
            let Some(chunk) = chunks.chunks().get(i) else {
                continue;
            };
            if chunk.logical.get() != start || chunk.length != len {
                return mismatch(
                    "block group does not match its chunk",
                    format!(
                        "block group {start} length {len}, chunk {} length {}",
                        chunk.logical, chunk.length
                    ),
                );
            }
            let flags = BlockGroupItem::ref_from_bytes(item.data)
                .map(|bg| bg.flags.get())
                .map_err(|_| item.truncated("block group item", size_of::<BlockGroupItem>()))?;
            let mask = ondisk::BTRFS_BLOCK_GROUP_TYPE_MASK;
            if flags & mask != chunk.flags & mask {
                return mismatch(
                    "block group type does not match its chunk",
                    format!(
                        "block group {start} length {len} type {:#x}, chunk type {:#x}",
                        flags & mask,
                        chunk.flags & mask
                    ),
                );
            }
            if let Some(m) = matched.get_mut(i) {
                *m = true;
            }
            pos = end;
        }
    }

    /// Every dev extent, in key order, does not overlap the previous one
    /// of its device, lies in a chunk whose stripe size it has, is one of
    /// that chunk's stripes (at most once each), and ends within its
    /// device; then every chunk has all its dev extents.
    fn check_dev_extents(&self, root: TreeRoot) -> Result<()> {
        let chunks = self.chunk_map();
        let mut verified = vec![0usize; chunks.chunks().len()];
        let mut c = Cursor::new(self, root);
        c.seek(&Key::new(1, ondisk::BTRFS_DEV_EXTENT_KEY, 0))?;
        let mut prev: Option<(u64, u64)> = None;
        while let Some(item) = c.current() {
            if item.key.item_type != ondisk::BTRFS_DEV_EXTENT_KEY {
                break;
            }
            self.check_dev_extent(&item, chunks.chunks(), &mut verified, prev)?;
            let (devid, physical) = (item.key.objectid, item.key.offset);
            let len = DevExtent::ref_from_prefix(item.data).map_or(0, |(d, _)| d.length.get());
            prev = Some((devid, physical.saturating_add(len)));
            if !c.advance()? {
                break;
            }
        }
        for (chunk, &found) in chunks.chunks().iter().zip(&verified) {
            if found != chunk.stripes.len() {
                return Err(Error::corrupt(
                    Location::Tree(root.tree),
                    CorruptKind::Mismatch {
                        rule: "chunk stripes without dev extents",
                        detail: format!(
                            "chunk {} has dev extents for {found} of its {} stripes",
                            chunk.logical,
                            chunk.stripes.len()
                        ),
                    },
                ));
            }
        }
        Ok(())
    }

    fn check_dev_extent(
        &self,
        item: &ItemRef<'_>,
        chunks: &[ChunkInfo],
        verified: &mut [usize],
        prev: Option<(u64, u64)>,
    ) -> Result<()> {
        let (devid, physical) = (item.key.objectid, item.key.offset);
        let mismatch = |rule, detail| {
            Err(Error::corrupt(
                item.location(),
                CorruptKind::Mismatch { rule, detail },
            ))
        };
        if let Some((prev_devid, prev_end)) = prev
            && prev_devid == devid
            && physical < prev_end
        {
            return mismatch(
                "dev extents overlap",
                format!(
                    "devid {devid} physical {physical} is before the end of the previous dev                      extent, {prev_end}"
                ),
            );
        }
        let (de, _) = DevExtent::ref_from_prefix(item.data)
            .map_err(|_| item.truncated("dev extent", size_of::<DevExtent>()))?;
        let (chunk_offset, len) = (de.chunk_offset.get(), de.length.get());
        let Some(i) = chunks
            .iter()
            .position(|ch| ch.contains(Logical(chunk_offset)))
        else {
            return mismatch(
                "dev extent without a chunk",
                format!(
                    "devid {devid} physical {physical} belongs to chunk {chunk_offset}, which                      no chunk maps"
                ),
            );
        };
        let (Some(chunk), Some(count)) = (chunks.get(i), verified.get_mut(i)) else {
            return Ok(());
        };
        if len != chunk.stripe_size() {
            return mismatch(
                "dev extent length does not match its chunk",
                format!(
                    "devid {devid} physical {physical} length {len}, but chunk {} has stripes                      of {}",
                    chunk.logical,
                    chunk.stripe_size()
                ),
            );
        }
        let is_stripe = chunk
            .stripes
            .iter()
            .any(|s| s.devid.get() == devid && s.offset.get() == physical);
        if !is_stripe {
            return mismatch(
                "dev extent without a chunk stripe",
                format!(
                    "devid {devid} physical {physical} is not a stripe of chunk {}",
                    chunk.logical
                ),
            );
        }
        if *count >= chunk.stripes.len() {
            return mismatch(
                "too many dev extents for a chunk",
                format!(
                    "chunk {} has {} stripes, and devid {devid} physical {physical} is one more",
                    chunk.logical,
                    chunk.stripes.len()
                ),
            );
        }
        *count = count.saturating_add(1);
        let Some(dev) = self.devices().iter().find(|d| d.devid.get() == devid) else {
            return mismatch(
                "dev extent on an unknown device",
                format!("devid {devid} is not among the chunk tree's devices"),
            );
        };
        let end = physical.saturating_add(len);
        if end > dev.total_bytes {
            return mismatch(
                "dev extent past the end of its device",
                format!(
                    "devid {devid} physical {physical} length {len} ends at {end}, past the                      device's {} bytes",
                    dev.total_bytes
                ),
            );
        }
        Ok(())
    }

    /// The top-level subvolume's root directory, inode 256, which the
    /// kernel reads to fill the superblock at mount.
    fn check_fs_root_dir(&self, root: TreeRoot) -> Result<()> {
        let key = Key::new(
            ondisk::BTRFS_FIRST_FREE_OBJECTID,
            ondisk::BTRFS_INODE_ITEM_KEY,
            0,
        );
        let mut c = Cursor::new(self, root);
        if c.find(&key)?.is_none() {
            return Err(Error::corrupt(
                Location::Tree(root.tree),
                CorruptKind::MissingItem {
                    what: "root directory inode",
                    key,
                },
            ));
        }
        Ok(())
    }
}

fn chunk_without_block_group(tree: TreeId, chunks: &[ChunkInfo], matched: &[bool]) -> Result<()> {
    match chunks.iter().zip(matched).find(|(_, m)| !**m) {
        Some((chunk, _)) => Err(Error::corrupt(
            Location::Tree(tree),
            CorruptKind::Mismatch {
                rule: "chunk without a block group",
                detail: format!(
                    "chunk {} length {} type {:#x} has no block group item",
                    chunk.logical, chunk.length, chunk.flags
                ),
            },
        )),
        None => Ok(()),
    }
}
