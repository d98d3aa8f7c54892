//! Items of the trees that allocate space: block groups, dev extents,
//! extent items and their back references (`check_block_group_item`,
//! `check_dev_extent_item`, `check_extent_item`,
//! `check_simple_keyed_refs`, `check_extent_data_ref` in the kernel's
//! `fs/btrfs/tree-checker.c`), checked as [`super`] checks every item of a
//! leaf.

use zerocopy::FromBytes;

use super::{BlockCheck, len64};
use crate::error::{CorruptKind, Error, Result};
use crate::ondisk::{
    self, BlockGroupItem, DevExtent, ExtentDataRef, ExtentItem, SharedDataRef, TreeBlockInfo,
};
use crate::tree::key::Key;
use crate::types::Generation;

/// `BLOCK_GROUP_ITEM` (`check_block_group_item`): a size, 24 bytes, the
/// chunk tree's objectid, no more used than its size, at most one
/// profile bit and one of the four types.
pub(super) fn block_group(
    key: &Key,
    data: &[u8],
    bad: &dyn Fn(CorruptKind) -> Error,
) -> Result<()> {
    let field = |field, value, why| bad(CorruptKind::BadField { field, value, why });
    if key.offset == 0 {
        return Err(field(
            "block group size (key offset)",
            0,
            "a block group is not empty",
        ));
    }
    let bg = BlockGroupItem::ref_from_bytes(data).map_err(|_| {
        bad(CorruptKind::BadSize {
            what: "block group item",
            found: len64(data.len()),
            expected: len64(size_of::<BlockGroupItem>()),
        })
    })?;
    if bg.chunk_objectid.get() != ondisk::BTRFS_FIRST_CHUNK_TREE_OBJECTID {
        return Err(field(
            "block group chunk_objectid",
            bg.chunk_objectid.get(),
            "must be 256 (FIRST_CHUNK_TREE)",
        ));
    }
    if bg.used.get() > key.offset {
        return Err(field(
            "block group used",
            bg.used.get(),
            "more than the block group's size (key offset)",
        ));
    }
    let flags = bg.flags.get();
    if (flags & ondisk::BTRFS_BLOCK_GROUP_PROFILE_MASK).count_ones() > 1 {
        return Err(field(
            "block group flags",
            flags,
            "more than one profile bit",
        ));
    }
    let data_meta = ondisk::BTRFS_BLOCK_GROUP_DATA | ondisk::BTRFS_BLOCK_GROUP_METADATA;
    if !matches!(
        flags & ondisk::BTRFS_BLOCK_GROUP_TYPE_MASK,
        ondisk::BTRFS_BLOCK_GROUP_DATA
            | ondisk::BTRFS_BLOCK_GROUP_METADATA
            | ondisk::BTRFS_BLOCK_GROUP_SYSTEM
    ) && flags & ondisk::BTRFS_BLOCK_GROUP_TYPE_MASK != data_meta
    {
        return Err(field(
            "block group flags",
            flags,
            "the type must be DATA, METADATA, SYSTEM or DATA|METADATA",
        ));
    }
    Ok(())
}

/// `DEV_EXTENT` (`check_dev_extent_item`): it belongs to the chunk tree,
/// its offsets and length are sector-aligned, and it starts after the
/// previous dev extent of its device ends.
pub(super) fn dev_extent(
    key: &Key,
    data: &[u8],
    prev: Option<(Key, &[u8])>,
    check: &BlockCheck,
    bad: &dyn Fn(CorruptKind) -> Error,
) -> Result<()> {
    let field = |field, value, why| bad(CorruptKind::BadField { field, value, why });
    let (de, _) = DevExtent::ref_from_prefix(data).map_err(|_| {
        bad(CorruptKind::Truncated {
            what: "dev extent",
            needed: len64(size_of::<DevExtent>()),
            available: len64(data.len()),
        })
    })?;
    if de.chunk_tree.get() != ondisk::BTRFS_CHUNK_TREE_OBJECTID {
        return Err(field(
            "dev extent chunk_tree",
            de.chunk_tree.get(),
            "must be 3 (the chunk tree)",
        ));
    }
    if de.chunk_objectid.get() != ondisk::BTRFS_FIRST_CHUNK_TREE_OBJECTID {
        return Err(field(
            "dev extent chunk_objectid",
            de.chunk_objectid.get(),
            "must be 256 (FIRST_CHUNK_TREE)",
        ));
    }
    let sector = check.sectorsize;
    for (what, value) in [
        ("dev extent physical offset (key offset)", key.offset),
        ("dev extent chunk_offset", de.chunk_offset.get()),
        ("dev extent length", de.length.get()),
    ] {
        if !value.is_multiple_of(u64::from(sector.max(1))) {
            return Err(bad(CorruptKind::Unaligned {
                field: what,
                value,
                align: sector,
            }));
        }
    }
    if let Some((pk, pdata)) = prev
        && pk.objectid == key.objectid
        && pk.item_type == key.item_type
        && let Ok((pde, _)) = DevExtent::ref_from_prefix(pdata)
    {
        let prev_end = pk.offset.saturating_add(pde.length.get());
        if prev_end > key.offset {
            return Err(bad(CorruptKind::Mismatch {
                rule: "dev extents overlap",
                detail: format!(
                    "the previous dev extent of devid {} at physical {} with length {} ends at \
                     {prev_end}, past this one's start",
                    key.objectid,
                    pk.offset,
                    pde.length.get()
                ),
            }));
        }
    }
    Ok(())
}

/// `btrfs_extent_inline_ref_size`: the bytes of an inline reference of
/// type `ty`, its type byte included; `None` for an unknown type.
fn inline_ref_size(ty: u8) -> Option<usize> {
    // The type byte and the u64 offset, which an EXTENT_DATA_REF's 28
    // bytes overlay and a SHARED_DATA_REF's 4-byte count follows.
    const HEAD: usize = 9;
    const DATA_REF: usize = 1 + size_of::<ExtentDataRef>();
    const SHARED_DATA_REF: usize = HEAD + size_of::<SharedDataRef>();
    match ty {
        ondisk::BTRFS_TREE_BLOCK_REF_KEY
        | ondisk::BTRFS_SHARED_BLOCK_REF_KEY
        | ondisk::BTRFS_EXTENT_OWNER_REF_KEY => Some(HEAD),
        ondisk::BTRFS_EXTENT_DATA_REF_KEY => Some(DATA_REF),
        ondisk::BTRFS_SHARED_DATA_REF_KEY => Some(SHARED_DATA_REF),
        _ => None,
    }
}

/// `EXTENT_ITEM` and `METADATA_ITEM` (`check_extent_item`), the rules
/// that bear on what clone detection reads: the key, the item's header
/// (generation, flags), the tree block info, the inline references
/// (each fits and is known, addresses aligned), no more inline
/// references than `refs`, and no overlap with the previous extent. Not
/// checked: the order of the inline references, which only writers rely
/// on.
pub(super) fn extent_item(
    key: &Key,
    data: &[u8],
    prev: Option<Key>,
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
    let metadata_item = key.item_type == ondisk::BTRFS_METADATA_ITEM_KEY;
    if metadata_item && !check.skinny_metadata {
        return Err(field(
            "extent key type",
            key.item_type.into(),
            "METADATA_ITEM without the skinny-metadata feature",
        ));
    }
    aligned("extent bytenr (key objectid)", key.objectid)?;
    if metadata_item && key.offset >= u64::from(ondisk::BTRFS_MAX_LEVEL) {
        return Err(field(
            "tree block level (key offset)",
            key.offset,
            "must be below 8",
        ));
    }
    let (ei, mut rest) = ExtentItem::ref_from_prefix(data).map_err(|_| {
        bad(CorruptKind::Truncated {
            what: "extent item",
            needed: len64(size_of::<ExtentItem>()),
            available: len64(data.len()),
        })
    })?;
    if ei.generation.get() > check.super_generation.get().saturating_add(1) {
        return Err(bad(CorruptKind::TooNew {
            what: "extent generation",
            found: Generation(ei.generation.get()),
            super_generation: check.super_generation,
        }));
    }
    let flags = ei.flags.get();
    let kind = flags & (ondisk::BTRFS_EXTENT_FLAG_DATA | ondisk::BTRFS_EXTENT_FLAG_TREE_BLOCK);
    if kind.count_ones() != 1 {
        return Err(field(
            "extent flags",
            flags,
            "exactly one of DATA (0x1) and TREE_BLOCK (0x2) is set",
        ));
    }
    let tree_block = kind == ondisk::BTRFS_EXTENT_FLAG_TREE_BLOCK;
    if tree_block {
        if !metadata_item && key.offset != u64::from(check.nodesize) {
            return Err(field(
                "tree block length (key offset)",
                key.offset,
                "must be the nodesize",
            ));
        }
    } else {
        if metadata_item {
            return Err(field(
                "extent key type",
                key.item_type.into(),
                "a data extent's item is an EXTENT_ITEM",
            ));
        }
        aligned("data extent length (key offset)", key.offset)?;
        if flags & ondisk::BTRFS_BLOCK_FLAG_FULL_BACKREF != 0 {
            return Err(field(
                "extent flags",
                flags,
                "FULL_BACKREF is for tree blocks only",
            ));
        }
    }
    if tree_block && !metadata_item {
        let (info, tail) = TreeBlockInfo::ref_from_prefix(rest).map_err(|_| {
            bad(CorruptKind::Truncated {
                what: "tree block info",
                needed: len64(size_of::<TreeBlockInfo>()),
                available: len64(rest.len()),
            })
        })?;
        if info.level >= ondisk::BTRFS_MAX_LEVEL {
            return Err(field(
                "tree block info level",
                info.level.into(),
                "must be below 8",
            ));
        }
        rest = tail;
    }
    let mut inline_refs = 0u64;
    while let Some(&ty) = rest.first() {
        let size = inline_ref_size(ty)
            .ok_or_else(|| field("inline ref type", ty.into(), "unknown inline ref type"))?;
        let Some(payload) = rest.get(1..size) else {
            return Err(bad(CorruptKind::Truncated {
                what: "inline extent ref",
                needed: len64(size),
                available: len64(rest.len()),
            }));
        };
        let (offset, tail) = zerocopy::little_endian::U64::read_from_prefix(payload)
            .map(|(o, t)| (o.get(), t))
            .unwrap_or_default();
        match ty {
            ondisk::BTRFS_TREE_BLOCK_REF_KEY => inline_refs = inline_refs.saturating_add(1),
            ondisk::BTRFS_SHARED_BLOCK_REF_KEY => {
                aligned("inline shared block ref parent", offset)?;
                inline_refs = inline_refs.saturating_add(1);
            }
            ondisk::BTRFS_EXTENT_DATA_REF_KEY => {
                if let Ok(dref) = ExtentDataRef::ref_from_bytes(payload) {
                    aligned("inline data ref offset", dref.offset.get())?;
                    inline_refs = inline_refs.saturating_add(dref.count.get().into());
                }
            }
            ondisk::BTRFS_SHARED_DATA_REF_KEY => {
                aligned("inline shared data ref parent", offset)?;
                if let Ok(sref) = SharedDataRef::ref_from_bytes(tail) {
                    inline_refs = inline_refs.saturating_add(sref.count.get().into());
                }
            }
            _ => {}
        }
        rest = rest.get(size..).unwrap_or_default();
    }
    if inline_refs > ei.refs.get() {
        return Err(bad(CorruptKind::Mismatch {
            rule: "extent refs below its inline references",
            detail: format!(
                "refs {}, but the inline references count {inline_refs}",
                ei.refs.get()
            ),
        }));
    }
    if let Some(p) = prev
        && matches!(
            p.item_type,
            ondisk::BTRFS_EXTENT_ITEM_KEY | ondisk::BTRFS_METADATA_ITEM_KEY
        )
    {
        let len = if p.item_type == ondisk::BTRFS_METADATA_ITEM_KEY {
            u64::from(check.nodesize)
        } else {
            p.offset
        };
        let prev_end = p.objectid.saturating_add(len);
        if prev_end > key.objectid {
            return Err(bad(CorruptKind::Mismatch {
                rule: "extents overlap",
                detail: format!(
                    "the previous extent {p} ends at {prev_end}, past this one's start"
                ),
            }));
        }
    }
    Ok(())
}

/// Keyed back references (`check_simple_keyed_refs`,
/// `check_extent_data_ref`): their size, an aligned extent address, and
/// an aligned parent address or data ref offset.
pub(super) fn keyed_ref(
    key: &Key,
    data: &[u8],
    check: &BlockCheck,
    bad: &dyn Fn(CorruptKind) -> Error,
) -> Result<()> {
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
    if key.item_type == ondisk::BTRFS_EXTENT_DATA_REF_KEY {
        let refs = <[ExtentDataRef]>::ref_from_bytes(data).map_err(|_| {
            bad(CorruptKind::BadField {
                field: "extent data ref item size",
                value: len64(data.len()),
                why: "must be a multiple of 28",
            })
        })?;
        aligned("extent bytenr (key objectid)", key.objectid)?;
        for r in refs {
            aligned("extent data ref offset", r.offset.get())?;
        }
        return Ok(());
    }
    let expected = if key.item_type == ondisk::BTRFS_SHARED_DATA_REF_KEY {
        size_of::<SharedDataRef>()
    } else {
        0
    };
    if data.len() != expected {
        return Err(bad(CorruptKind::BadSize {
            what: "keyed back reference",
            found: len64(data.len()),
            expected: len64(expected),
        }));
    }
    aligned("extent bytenr (key objectid)", key.objectid)?;
    if key.item_type != ondisk::BTRFS_TREE_BLOCK_REF_KEY {
        aligned("back reference parent (key offset)", key.offset)?;
    }
    Ok(())
}
