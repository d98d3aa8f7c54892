//! Item checks at read time: what the kernel's tree-checker refuses in a
//! leaf (`fs/btrfs/tree-checker.c`, read for the facts),
//! checked once when [`Node::new`](super::node::Node::new) validates a leaf
//! (this module knows items, not blocks: the node hands it their keys and data),
//! so every reader of an item — the filesystem model, the send planner, the
//! listing — sees only items the kernel would also accept.
//!
//! Checked, per item type:
//!
//! * `DIR_ITEM`, `DIR_INDEX`, `XATTR_ITEM`: each record fits the item; its
//!   location key is an inode (offset 0; all zero for an xattr) or a
//!   subvolume root; the type is a known `BTRFS_FT_*` and `FT_XATTR` exactly
//!   in xattr items; the name is 1 to 255 bytes; only xattrs carry data; name
//!   and data fit `BTRFS_MAX_XATTR_SIZE`; and the key offset of a `DIR_ITEM`
//!   or `XATTR_ITEM` is the hash of its name.
//! * `INODE_ITEM`: an inode number (or 6, the root tree's directory), offset
//!   0, 160 bytes, generation and transid at most the superblock's
//!   generation + 1 (the kernel allows + 1 for the log tree), known mode
//!   bits and file type, at most one link for a directory.
//! * `EXTENT_DATA`: the file offset (key offset) is a multiple of the sector
//!   size; the header fits; known type and compression, no encryption; an
//!   inline extent starts at 0 and, uncompressed, holds `ram_bytes` bytes; a
//!   regular or prealloc item is 53 bytes, its `ram_bytes`, `disk_bytenr`,
//!   `disk_num_bytes`, `offset` and `num_bytes` are multiples of the sector
//!   size, and its end does not pass 2^64.
//! * `ROOT_ITEM` (`check_root_key`, `check_root_item`): the tree id is not
//!   0; a reloc tree (`TREE_RELOC`) belongs to a subvolume tree (its key
//!   offset); 439 or 239 (legacy) bytes; `generation`, `generation_v2` and
//!   `last_snapshot` at most the superblock's generation + 1; `bytenr`
//!   aligned to the sector size; `level` and `drop_level` below 8; no
//!   `drop_progress` at `drop_level` 0; no flags but `RDONLY` and `DEAD`.
//! * `INODE_REF` (`check_inode_ref`): records that fill the item, each
//!   name 1 to 255 bytes.
//! * `BLOCK_GROUP_ITEM` (`check_block_group_item`), `DEV_EXTENT`
//!   (`check_dev_extent_item`), `EXTENT_ITEM`/`METADATA_ITEM`
//!   (`check_extent_item`) and keyed back references
//!   (`check_simple_keyed_refs`, `check_extent_data_ref`): see each
//!   function. Whether block groups and dev extents agree with the chunks
//!   is checked when a filesystem is opened, as the kernel does at mount
//!   ([`crate::volume::mount_check`]).
//! * `CHUNK_ITEM`, in whichever tree it appears (`check_leaf_chunk_item`):
//!   the whole of [`ChunkInfo::parse`](crate::chunk_map::ChunkInfo::parse),
//!   the item exactly as long as its stripes.
//! * In subvolume trees, an item of these types (and `INODE_REF`,
//!   `INODE_EXTREF`) follows an item of the same inode: its `INODE_ITEM` is
//!   not missing.

#![warn(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::as_conversions
)]

use zerocopy::FromBytes;

mod alloc;

use crate::chunk_map::{ChunkInfo, ChunkRules};
use crate::csum::CsumType;
use crate::error::{CorruptKind, Error, Location, Result};
use crate::ondisk::{
    self, DirItem, FileExtentItem, FileExtentItemHeader, InodeItem, InodeRef, RootItem,
};
use crate::tree::key::Key;
use crate::types::{Generation, Logical, TreeId, Uuid};

/// Filesystem-wide facts every block is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockCheck {
    /// Tree block size.
    pub nodesize: u32,
    /// Data block size (node pointers must be aligned to it).
    pub sectorsize: u32,
    /// Checksum algorithm.
    pub csum_type: CsumType,
    /// The UUID in headers (`metadata_uuid` or `fsid`).
    pub metadata_uuid: Uuid,
    /// The chunk tree UUID, once known (from the chunk root's header).
    pub chunk_tree_uuid: Option<Uuid>,
    /// The superblock's generation: no inode or root item may be newer
    /// than it + 1.
    pub super_generation: Generation,
    /// INCOMPAT_MIXED_GROUPS: chunk items may then hold data and metadata.
    pub mixed_groups: bool,
    /// INCOMPAT_SKINNY_METADATA: tree blocks may then have METADATA_ITEMs.
    pub skinny_metadata: bool,
}

/// What the referrer (parent pointer, root item, superblock) says a block is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockExpect {
    /// Its address.
    pub logical: Logical,
    /// The tree being read.
    pub tree: TreeId,
    /// Its generation.
    pub generation: Generation,
    /// Its level.
    pub level: u8,
    /// Its first key, when reached through a parent pointer.
    pub first_key: Option<Key>,
}

impl BlockExpect {
    pub(crate) fn location(&self, level: Option<u8>) -> Location {
        Location::TreeBlock {
            logical: self.logical,
            tree: self.tree,
            level,
        }
    }
}

/// The hash of a DIR_ITEM or XATTR_ITEM name (its key offset):
/// `crc32c(~1, name)` without the final inversion (`btrfs_name_hash`).
pub fn name_hash(name: &[u8]) -> u64 {
    // The crate's crc32c_append(c, d) is !raw(!c, d), so raw(!1, d) is
    // !crc32c_append(1, d).
    u64::from(!crc32c::crc32c_append(1, name))
}

/// `BTRFS_NAME_LEN` and `XATTR_NAME_MAX`.
const NAME_MAX: usize = 255;
/// `BTRFS_FT_MAX`: file types are 1 to 8.
const FT_MAX: u8 = 9;
/// `S_IFMT | S_ISUID | S_ISGID | S_ISVTX | 0777`.
const MODE_MASK: u32 = 0o177_777;
const S_IFMT: u32 = 0o170_000;
const S_IFDIR: u32 = 0o040_000;
/// The file types a mode may have (`S_IFIFO` … `S_IFSOCK`).
const FILE_TYPES: [u32; 7] = [
    0o010_000, 0o020_000, S_IFDIR, 0o060_000, 0o100_000, 0o120_000, 0o140_000,
];
/// `BTRFS_FILE_EXTENT_INLINE_DATA_START`: the header of an inline extent.
const INLINE_START: usize = size_of::<FileExtentItemHeader>();
/// `BTRFS_NR_FILE_EXTENT_TYPES`, `BTRFS_NR_COMPRESS_TYPES`.
const EXTENT_TYPES: u8 = 3;
const COMPRESS_TYPES: u8 = 4;

/// Whether `id` is a subvolume tree (`is_fstree`): 5, or from 256 up as a
/// *signed* number, so the special trees' negative ids (-8 the reloc trees,
/// -9 the data reloc tree, …) are not.
fn is_fstree(id: u64) -> bool {
    id == ondisk::BTRFS_FS_TREE_OBJECTID
        || (ondisk::BTRFS_FIRST_FREE_OBJECTID..=i64::MAX.unsigned_abs()).contains(&id)
}

/// Whether `id` may be an inode of a tree (`check_inode_key`).
fn is_inode_id(id: u64) -> bool {
    (ondisk::BTRFS_FIRST_FREE_OBJECTID..=ondisk::BTRFS_LAST_FREE_OBJECTID).contains(&id)
        || id == ondisk::BTRFS_ROOT_TREE_DIR_OBJECTID
        || id == ondisk::BTRFS_FREE_INO_OBJECTID
}

fn len64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Check every item of a leaf owned by tree `owner`, given as (slot, key, data).
///
/// # Errors
///
/// [`Error::Corrupt`] at the first item the kernel's tree-checker refuses,
/// naming its slot and key.
pub(crate) fn leaf_items<'a>(
    owner: u64,
    items: impl Iterator<Item = (usize, Key, &'a [u8])>,
    check: &BlockCheck,
    expect: &BlockExpect,
) -> Result<()> {
    let fstree = is_fstree(owner);
    let mut prev: Option<(Key, &[u8])> = None;
    for (slot, key, data) in items {
        let bad = |kind| {
            Error::corrupt(
                Location::Item {
                    leaf: expect.logical,
                    tree: expect.tree,
                    slot: u32::try_from(slot).unwrap_or(u32::MAX),
                    key,
                },
                kind,
            )
        };
        let field = |field, value, why| bad(CorruptKind::BadField { field, value, why });
        let same_inode_kind = matches!(
            key.item_type,
            ondisk::BTRFS_XATTR_ITEM_KEY
                | ondisk::BTRFS_INODE_REF_KEY
                | ondisk::BTRFS_INODE_EXTREF_KEY
                | ondisk::BTRFS_DIR_ITEM_KEY
                | ondisk::BTRFS_DIR_INDEX_KEY
                | ondisk::BTRFS_EXTENT_DATA_KEY
        );
        if fstree
            && same_inode_kind
            && let Some((p, _)) = prev
            && p.objectid != key.objectid
        {
            return Err(field(
                "previous key objectid",
                p.objectid,
                "an inode's items follow its INODE_ITEM: it is missing",
            ));
        }
        match key.item_type {
            ondisk::BTRFS_DIR_ITEM_KEY
            | ondisk::BTRFS_DIR_INDEX_KEY
            | ondisk::BTRFS_XATTR_ITEM_KEY => dir_item(&key, data, check, &bad)?,
            ondisk::BTRFS_INODE_ITEM_KEY => inode_item(&key, data, check, &bad)?,
            ondisk::BTRFS_EXTENT_DATA_KEY => file_extent(&key, data, check, &bad)?,
            ondisk::BTRFS_ROOT_ITEM_KEY => root_item(&key, data, check, &bad)?,
            ondisk::BTRFS_INODE_REF_KEY => inode_ref(data, &bad)?,
            ondisk::BTRFS_BLOCK_GROUP_ITEM_KEY => alloc::block_group(&key, data, &bad)?,
            ondisk::BTRFS_DEV_EXTENT_KEY => alloc::dev_extent(&key, data, prev, check, &bad)?,
            ondisk::BTRFS_EXTENT_ITEM_KEY | ondisk::BTRFS_METADATA_ITEM_KEY => {
                alloc::extent_item(&key, data, prev.map(|(k, _)| k), check, &bad)?;
            }
            ondisk::BTRFS_TREE_BLOCK_REF_KEY
            | ondisk::BTRFS_SHARED_BLOCK_REF_KEY
            | ondisk::BTRFS_SHARED_DATA_REF_KEY
            | ondisk::BTRFS_EXTENT_DATA_REF_KEY => alloc::keyed_ref(&key, data, check, &bad)?,
            ondisk::BTRFS_CHUNK_ITEM_KEY => {
                let rules = ChunkRules {
                    sectorsize: check.sectorsize,
                    mixed_groups: check.mixed_groups,
                };
                let location = Location::Item {
                    leaf: expect.logical,
                    tree: expect.tree,
                    slot: u32::try_from(slot).unwrap_or(u32::MAX),
                    key,
                };
                ChunkInfo::parse(key.offset, data, rules, &location)?;
            }
            _ => {}
        }
        prev = Some((key, data));
    }
    Ok(())
}

fn dir_item(
    key: &Key,
    data: &[u8],
    check: &BlockCheck,
    bad: &dyn Fn(CorruptKind) -> Error,
) -> Result<()> {
    let field = |field, value, why| bad(CorruptKind::BadField { field, value, why });
    let xattr = key.item_type == ondisk::BTRFS_XATTR_ITEM_KEY;
    // BTRFS_MAX_XATTR_SIZE: the leaf data area less one item and one
    // dir item header.
    let max_xattr = usize::try_from(check.nodesize)
        .unwrap_or(usize::MAX)
        .saturating_sub(size_of::<ondisk::Header>())
        .saturating_sub(size_of::<ondisk::Item>())
        .saturating_sub(size_of::<DirItem>());
    let mut rest = data;
    while !rest.is_empty() {
        let (head, tail) = DirItem::ref_from_prefix(rest).map_err(|_| {
            bad(CorruptKind::Truncated {
                what: "dir item",
                needed: len64(size_of::<DirItem>()),
                available: len64(rest.len()),
            })
        })?;
        let loc = Key::from(&head.location);
        match loc.item_type {
            ondisk::BTRFS_ROOT_ITEM_KEY => {
                if loc.objectid == 0 || !is_fstree(loc.objectid) {
                    return Err(field(
                        "location key objectid",
                        loc.objectid,
                        "a subvolume entry points at a subvolume tree",
                    ));
                }
            }
            ondisk::BTRFS_INODE_ITEM_KEY | 0 => {
                if xattr {
                    if loc != Key::MIN {
                        return Err(bad(CorruptKind::UnexpectedKey {
                            key: loc,
                            what: "xattr location (must be all zero)",
                        }));
                    }
                } else if !is_inode_id(loc.objectid) {
                    return Err(field(
                        "location key objectid",
                        loc.objectid,
                        "not an inode number",
                    ));
                } else if loc.offset != 0 {
                    return Err(field("location key offset", loc.offset, "must be 0"));
                }
            }
            t => {
                return Err(field(
                    "location key type",
                    t.into(),
                    "must be INODE_ITEM or ROOT_ITEM",
                ));
            }
        }
        let dir_type = head.dir_type & !ondisk::BTRFS_FT_ENCRYPTED;
        if dir_type == ondisk::BTRFS_FT_UNKNOWN || dir_type >= FT_MAX {
            return Err(field("dir item type", dir_type.into(), "must be 1 to 8"));
        }
        if xattr != (dir_type == ondisk::BTRFS_FT_XATTR) {
            return Err(field(
                "dir item type",
                dir_type.into(),
                "FT_XATTR (8) is the type of xattr items, and only of them",
            ));
        }
        let name_len = usize::from(head.name_len.get());
        let data_len = usize::from(head.data_len.get());
        if name_len > NAME_MAX {
            return Err(field(
                "name_len",
                len64(name_len),
                "names are at most 255 bytes",
            ));
        }
        if name_len.saturating_add(data_len) > max_xattr {
            return Err(field(
                "name_len + data_len",
                len64(name_len.saturating_add(data_len)),
                "more than an item can hold (BTRFS_MAX_XATTR_SIZE)",
            ));
        }
        if data_len != 0 && !xattr {
            return Err(field(
                "data_len",
                len64(data_len),
                "only xattr items carry data",
            ));
        }
        let total = name_len.saturating_add(data_len);
        let (Some(name), Some(tail)) = (tail.get(..name_len), tail.get(total..)) else {
            return Err(bad(CorruptKind::Truncated {
                what: "dir item name and data",
                needed: len64(total),
                available: len64(tail.len()),
            }));
        };
        if key.item_type != ondisk::BTRFS_DIR_INDEX_KEY {
            let expected = name_hash(name);
            if key.offset != expected {
                return Err(bad(CorruptKind::NameHash {
                    found: key.offset,
                    expected,
                    name: name.escape_ascii().to_string(),
                }));
            }
        }
        rest = tail;
    }
    Ok(())
}

fn inode_item(
    key: &Key,
    data: &[u8],
    check: &BlockCheck,
    bad: &dyn Fn(CorruptKind) -> Error,
) -> Result<()> {
    let field = |field, value, why| bad(CorruptKind::BadField { field, value, why });
    if !is_inode_id(key.objectid) {
        return Err(field(
            "inode item objectid",
            key.objectid,
            "not an inode number",
        ));
    }
    if key.offset != 0 {
        return Err(field("inode item key offset", key.offset, "must be 0"));
    }
    let inode = InodeItem::ref_from_bytes(data).map_err(|_| {
        bad(CorruptKind::BadSize {
            what: "inode item",
            found: len64(data.len()),
            expected: len64(size_of::<InodeItem>()),
        })
    })?;
    let newest = check.super_generation.get().saturating_add(1);
    for (what, found) in [
        ("inode generation", inode.generation.get()),
        ("inode transid", inode.transid.get()),
    ] {
        if found > newest {
            return Err(bad(CorruptKind::TooNew {
                what,
                found: Generation(found),
                super_generation: check.super_generation,
            }));
        }
    }
    let mode = inode.mode.get();
    if mode & !MODE_MASK != 0 {
        return Err(field("mode", mode.into(), "unknown mode bits"));
    }
    if !FILE_TYPES.contains(&(mode & S_IFMT)) {
        return Err(field("mode", mode.into(), "not a file type"));
    }
    if mode & S_IFMT == S_IFDIR && inode.nlink.get() > 1 {
        return Err(field(
            "nlink",
            inode.nlink.get().into(),
            "a directory has at most one link",
        ));
    }
    Ok(())
}

fn root_item(
    key: &Key,
    data: &[u8],
    check: &BlockCheck,
    bad: &dyn Fn(CorruptKind) -> Error,
) -> Result<()> {
    let field = |field, value, why| bad(CorruptKind::BadField { field, value, why });
    // Relocation only copies subvolume trees this way; other trees are
    // just COWed, so a reloc tree of anything else cannot exist.
    if key.objectid == ondisk::BTRFS_TREE_RELOC_OBJECTID && !is_fstree(key.offset) {
        return Err(field(
            "reloc tree root id (key offset)",
            key.offset,
            "a reloc tree belongs to a subvolume tree (5, or 256 to 2^63 - 1)",
        ));
    }
    if key.objectid == 0 {
        return Err(field("root id", 0, "no tree has id 0"));
    }
    let full = size_of::<RootItem>();
    if data.len() != full && data.len() != RootItem::LEGACY_SIZE {
        return Err(bad(CorruptKind::BadSize {
            what: "root item",
            found: len64(data.len()),
            expected: len64(full),
        }));
    }
    // A legacy item ends before generation_v2: the rest reads as zeros,
    // which every check below accepts.
    let mut buf = [0u8; size_of::<RootItem>()];
    if let Some(dst) = buf.get_mut(..data.len()) {
        dst.copy_from_slice(data);
    }
    let Ok(root) = RootItem::read_from_bytes(&buf) else {
        return Ok(());
    };
    let newest = check.super_generation.get().saturating_add(1);
    for (what, found) in [
        ("root generation", root.generation.get()),
        ("root generation_v2", root.generation_v2.get()),
        ("root last_snapshot", root.last_snapshot.get()),
    ] {
        if found > newest {
            return Err(bad(CorruptKind::TooNew {
                what,
                found: Generation(found),
                super_generation: check.super_generation,
            }));
        }
    }
    let bytenr = root.bytenr.get();
    if !bytenr.is_multiple_of(u64::from(check.sectorsize.max(1))) {
        return Err(bad(CorruptKind::Unaligned {
            field: "root bytenr",
            value: bytenr,
            align: check.sectorsize,
        }));
    }
    for (name, level) in [
        ("root level", root.level),
        ("root drop_level", root.drop_level),
    ] {
        if level >= ondisk::BTRFS_MAX_LEVEL {
            return Err(field(name, level.into(), "must be below 8"));
        }
    }
    // A snapshot drop saves its progress only at node levels, so a drop
    // in progress at level 0 is a corrupt item (the kernel would trip on
    // it when it resumes the drop).
    let drop_objectid = root.drop_progress.objectid.get();
    if drop_objectid != 0 && root.drop_level == 0 {
        return Err(field(
            "root drop_progress objectid",
            drop_objectid,
            "set while drop_level is 0: a drop resumes at a node level, 1 or higher",
        ));
    }
    let flags = root.flags.get();
    let known = ondisk::BTRFS_ROOT_SUBVOL_RDONLY | ondisk::BTRFS_ROOT_SUBVOL_DEAD;
    if flags & !known != 0 {
        return Err(field(
            "root flags",
            flags,
            "unknown bits (only RDONLY 0x1 and DEAD 0x1000000000000 exist)",
        ));
    }
    Ok(())
}

fn file_extent(
    key: &Key,
    data: &[u8],
    check: &BlockCheck,
    bad: &dyn Fn(CorruptKind) -> Error,
) -> Result<()> {
    let field = |field, value, why| bad(CorruptKind::BadField { field, value, why });
    let sector = check.sectorsize;
    let aligned = |field, value: u64| {
        if value.is_multiple_of(u64::from(sector.max(1))) {
            Ok(())
        } else {
            Err(bad(CorruptKind::Unaligned {
                field,
                value,
                align: sector,
            }))
        }
    };
    aligned("file extent offset", key.offset)?;
    let (head, _) = FileExtentItemHeader::ref_from_prefix(data).map_err(|_| {
        bad(CorruptKind::Truncated {
            what: "file extent item",
            needed: len64(INLINE_START),
            available: len64(data.len()),
        })
    })?;
    if head.extent_type >= EXTENT_TYPES {
        return Err(field(
            "file extent type",
            head.extent_type.into(),
            "unknown file extent type",
        ));
    }
    if head.compression >= COMPRESS_TYPES {
        return Err(field(
            "compression",
            head.compression.into(),
            "unknown compression type",
        ));
    }
    if head.encryption != 0 {
        return Err(field(
            "encryption",
            head.encryption.into(),
            "encrypted extents are not defined",
        ));
    }
    if head.extent_type == ondisk::BTRFS_FILE_EXTENT_INLINE {
        if key.offset != 0 {
            return Err(field(
                "inline extent offset",
                key.offset,
                "inline extents start at file offset 0",
            ));
        }
        let expected = len64(INLINE_START).saturating_add(head.ram_bytes.get());
        if head.compression == ondisk::BTRFS_COMPRESS_NONE && len64(data.len()) != expected {
            return Err(bad(CorruptKind::BadSize {
                what: "uncompressed inline extent item (header + ram_bytes)",
                found: len64(data.len()),
                expected,
            }));
        }
        return Ok(());
    }
    let fe = FileExtentItem::ref_from_bytes(data).map_err(|_| {
        bad(CorruptKind::BadSize {
            what: "regular file extent item",
            found: len64(data.len()),
            expected: len64(size_of::<FileExtentItem>()),
        })
    })?;
    aligned("file extent ram_bytes", fe.header.ram_bytes.get())?;
    aligned("file extent disk_bytenr", fe.disk_bytenr.get())?;
    aligned("file extent disk_num_bytes", fe.disk_num_bytes.get())?;
    aligned("file extent data offset", fe.offset.get())?;
    aligned("file extent num_bytes", fe.num_bytes.get())?;
    if key.offset.checked_add(fe.num_bytes.get()).is_none() {
        return Err(field(
            "num_bytes",
            fe.num_bytes.get(),
            "the extent ends past 2^64",
        ));
    }
    Ok(())
}

/// `INODE_REF` (`check_inode_ref`): one or more records, each a header and
/// a name of 1 to 255 bytes, filling the item exactly.
fn inode_ref(data: &[u8], bad: &dyn Fn(CorruptKind) -> Error) -> Result<()> {
    let field = |field, value, why| bad(CorruptKind::BadField { field, value, why });
    if data.len() <= size_of::<InodeRef>() {
        return Err(field(
            "inode ref item size",
            len64(data.len()),
            "must hold a 10-byte header and a name",
        ));
    }
    let mut rest = data;
    while !rest.is_empty() {
        let (head, tail) = InodeRef::ref_from_prefix(rest).map_err(|_| {
            bad(CorruptKind::Truncated {
                what: "inode ref",
                needed: len64(size_of::<InodeRef>()),
                available: len64(rest.len()),
            })
        })?;
        let name_len = usize::from(head.name_len.get());
        if name_len == 0 || name_len > NAME_MAX {
            return Err(field(
                "inode ref name_len",
                len64(name_len),
                "must be 1 to 255",
            ));
        }
        rest = tail.get(name_len..).ok_or_else(|| {
            bad(CorruptKind::Truncated {
                what: "inode ref name",
                needed: len64(name_len),
                available: len64(tail.len()),
            })
        })?;
    }
    Ok(())
}
