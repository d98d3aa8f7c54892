//! Tree blocks: a validated zero-copy view.
//!
//! Layout: `struct btrfs_header`, `btrfs_key_ptr`, `btrfs_item`
//! (btrfs_tree.h). [`Node::new`] checks a block once — size,
//! checksum, bytenr, fsid, chunk tree uuid, generation against the parent
//! pointer, level, owner, nritems, key order, item data layout — in the
//! spirit of btrfs-progs `disk-io.c` `check_tree_block` and `tree-checker.c`;
//! the accessors are then cheap and cannot panic. [`TreeBlock`] owns a block
//! that passed, so the walker can keep it on its path and hand out views.

#![warn(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::as_conversions
)]

use std::sync::Arc;

use zerocopy::FromBytes;

use crate::csum::Csum;
use crate::error::{CorruptKind, Error, Result};
use crate::ondisk::{self, DiskKey, Header, Item, KeyPtr};
use crate::tree::buf::BlockBuf;
use crate::tree::check::{self, BlockCheck, BlockExpect};
use crate::tree::key::Key;
use crate::types::{Generation, Logical, TreeId, Uuid, len64};

const HEADER: usize = size_of::<Header>();
const ITEM: usize = size_of::<Item>();
const KEY_PTR: usize = size_of::<KeyPtr>();

/// Whether blocks of `tree` may carry another subvolume's owner (snapshots
/// share blocks and keep the original owner).
fn is_subvol_tree(id: u64) -> bool {
    id == ondisk::BTRFS_FS_TREE_OBJECTID
        || (ondisk::BTRFS_FIRST_FREE_OBJECTID..=ondisk::BTRFS_LAST_FREE_OBJECTID).contains(&id)
}

/// Trees that always have at least one item.
fn never_empty(id: u64) -> bool {
    matches!(
        id,
        ondisk::BTRFS_ROOT_TREE_OBJECTID
            | ondisk::BTRFS_CHUNK_TREE_OBJECTID
            | ondisk::BTRFS_EXTENT_TREE_OBJECTID
            | ondisk::BTRFS_DEV_TREE_OBJECTID
            | ondisk::BTRFS_DATA_RELOC_TREE_OBJECTID
    ) || is_subvol_tree(id)
}

/// One item of a leaf: its key and data.
#[derive(Debug, Clone, Copy)]
pub struct LeafItem<'a> {
    /// The key.
    pub key: Key,
    /// The data.
    pub data: &'a [u8],
}

/// One pointer of an internal node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePtr {
    /// Lowest key of the child.
    pub key: Key,
    /// The child's address.
    pub blockptr: Logical,
    /// The child's generation.
    pub generation: Generation,
}

/// A validated view of one tree block.
#[derive(Debug, Clone, Copy)]
pub struct Node<'a> {
    bytes: &'a [u8],
    header: &'a Header,
    nritems: usize,
}

impl<'a> Node<'a> {
    /// Validate `bytes` as the block `expect` describes.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] naming the block, the tree, and what was expected
    /// and found.
    pub fn new(bytes: &'a [u8], check: &BlockCheck, expect: &BlockExpect) -> Result<Node<'a>> {
        let err = |level, kind| Error::corrupt(expect.location(level), kind);
        let nodesize = usize::try_from(check.nodesize).unwrap_or(usize::MAX);
        let (header, _) = Header::ref_from_prefix(bytes).map_err(|_| {
            err(
                None,
                CorruptKind::Truncated {
                    what: "tree block",
                    needed: check.nodesize.into(),
                    available: len64(bytes.len()),
                },
            )
        })?;
        if bytes.len() != nodesize {
            return Err(err(
                None,
                CorruptKind::BadSize {
                    what: "tree block",
                    found: len64(bytes.len()),
                    expected: check.nodesize.into(),
                },
            ));
        }
        let covered = bytes.get(ondisk::BTRFS_CSUM_SIZE..).unwrap_or_default();
        if let Err(computed) = check.csum_type.verify(&header.csum, covered) {
            return Err(err(
                None,
                CorruptKind::ChecksumMismatch {
                    algo: check.csum_type,
                    stored: Csum::from_stored(check.csum_type, &header.csum),
                    computed,
                },
            ));
        }
        let level = header.level;
        let at = |kind| err(Some(level), kind);
        if header.bytenr.get() != expect.logical.get() {
            return Err(at(CorruptKind::BytenrMismatch {
                expected: expect.logical.get(),
                found: header.bytenr.get(),
            }));
        }
        if Uuid(header.fsid) != check.metadata_uuid {
            return Err(at(CorruptKind::FsidMismatch {
                expected: check.metadata_uuid,
                found: Uuid(header.fsid),
            }));
        }
        if let Some(expected) = check.chunk_tree_uuid
            && Uuid(header.chunk_tree_uuid) != expected
        {
            return Err(at(CorruptKind::ChunkTreeUuidMismatch {
                expected,
                found: Uuid(header.chunk_tree_uuid),
            }));
        }
        let generation = Generation(header.generation.get());
        if generation != expect.generation {
            return Err(at(CorruptKind::TransidMismatch {
                expected: expect.generation,
                found: generation,
            }));
        }
        if level >= ondisk::BTRFS_MAX_LEVEL || level != expect.level {
            return Err(at(CorruptKind::LevelMismatch {
                expected: expect.level,
                found: level,
            }));
        }
        let owner = header.owner.get();
        let tree = expect.tree.get();
        let owner_ok = if is_subvol_tree(tree) {
            is_subvol_tree(owner)
        } else {
            tree == ondisk::BTRFS_TREE_RELOC_OBJECTID || owner == tree
        };
        if !owner_ok {
            return Err(at(CorruptKind::OwnerMismatch {
                expected: expect.tree,
                found: TreeId(owner),
            }));
        }
        let nritems_raw = header.nritems.get();
        let nritems = usize::try_from(nritems_raw).unwrap_or(usize::MAX);
        let slot_size = if level == 0 { ITEM } else { KEY_PTR };
        let data_size = nodesize.saturating_sub(HEADER);
        let max = data_size.checked_div(slot_size).unwrap_or(0);
        if nritems > max {
            return Err(at(CorruptKind::TooManyItems {
                nritems: nritems_raw,
                max: u32::try_from(max).unwrap_or(u32::MAX),
            }));
        }
        if nritems == 0 && (level > 0 || expect.first_key.is_some() || never_empty(tree)) {
            return Err(at(CorruptKind::Empty {
                what: if level == 0 { "leaf" } else { "node" },
            }));
        }
        let node = Node {
            bytes,
            header,
            nritems,
        };
        let headers_end = HEADER.saturating_add(nritems.saturating_mul(slot_size));
        let too_many = |max: usize| {
            at(CorruptKind::TooManyItems {
                nritems: nritems_raw,
                max: u32::try_from(max).unwrap_or(u32::MAX),
            })
        };
        // Keys strictly ascending; checked on the raw slots (one pass, no
        // per-slot decoding).
        let key_order = |slot: usize, key: &DiskKey, prev: &DiskKey| {
            if raw_key(key) <= raw_key(prev) {
                return Err(at(CorruptKind::KeyOrder {
                    slot: u32::try_from(slot).unwrap_or(u32::MAX),
                    key: Key::from(key),
                    prev: Key::from(prev),
                }));
            }
            Ok(())
        };
        if level == 0 {
            let items = node.items().ok_or_else(|| too_many(0))?;
            // Item data ends at the block end for item 0, then where the
            // previous item's data begins.
            let mut data_end = data_size;
            let mut prev: Option<&DiskKey> = None;
            for (slot, item) in items.iter().enumerate() {
                if let Some(prev) = prev {
                    key_order(slot, &item.key, prev)?;
                }
                prev = Some(&item.key);
                let slot32 = u32::try_from(slot).unwrap_or(u32::MAX);
                let offset = usize::try_from(item.offset.get()).unwrap_or(usize::MAX);
                let size = usize::try_from(item.size.get()).unwrap_or(usize::MAX);
                let end = offset.saturating_add(size);
                if end > data_size {
                    return Err(at(CorruptKind::ItemPastEnd {
                        slot: slot32,
                        end: len64(end),
                        limit: len64(data_size),
                    }));
                }
                if end != data_end {
                    return Err(at(CorruptKind::ItemGap {
                        slot: slot32,
                        end: len64(end),
                        expected: len64(data_end),
                    }));
                }
                let start = offset.saturating_add(HEADER);
                if start < headers_end {
                    return Err(at(CorruptKind::ItemOverlapsHeaders {
                        slot: slot32,
                        start: len64(start),
                        headers_end: len64(headers_end),
                    }));
                }
                data_end = offset;
            }
        } else {
            let ptrs = node.ptrs().ok_or_else(|| too_many(0))?;
            let sector = u64::from(check.sectorsize);
            let mut prev: Option<&DiskKey> = None;
            for (slot, ptr) in ptrs.iter().enumerate() {
                if let Some(prev) = prev {
                    key_order(slot, &ptr.key, prev)?;
                }
                prev = Some(&ptr.key);
                let at_ptr = ptr.blockptr.get();
                if at_ptr == 0 || !at_ptr.is_multiple_of(sector) {
                    return Err(at(CorruptKind::BadBlockPtr {
                        slot: u32::try_from(slot).unwrap_or(u32::MAX),
                        ptr: at_ptr,
                    }));
                }
            }
        }
        if let Some(expected) = expect.first_key
            && let Some(found) = node.key(0)
            && found != expected
        {
            return Err(at(CorruptKind::FirstKeyMismatch { expected, found }));
        }
        if level == 0 {
            let items = (0..node.nritems())
                .map_while(|slot| node.item(slot).map(|it| (slot, it.key, it.data)));
            check::leaf_items(node.owner().get(), items, check, expect)?;
        }
        Ok(node)
    }

    /// A view of a block that already passed [`Node::new`].
    fn trusted(bytes: &'a [u8]) -> Option<Node<'a>> {
        let (header, _) = Header::ref_from_prefix(bytes).ok()?;
        let nritems = usize::try_from(header.nritems.get()).ok()?;
        Some(Node {
            bytes,
            header,
            nritems,
        })
    }

    fn empty<'b>() -> Node<'b> {
        // OK to unwrap: a HEADER-byte array is exactly one header.
        let header = Header::ref_from_bytes(&EMPTY_BLOCK[..]).expect("header size is pinned");
        Node {
            bytes: &EMPTY_BLOCK,
            header,
            nritems: 0,
        }
    }

    /// The raw header.
    pub fn header(&self) -> &'a Header {
        self.header
    }

    /// The block's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// 0 for a leaf.
    pub fn level(&self) -> u8 {
        self.header.level
    }

    /// Whether this is a leaf.
    pub fn is_leaf(&self) -> bool {
        self.header.level == 0
    }

    /// Number of items or pointers.
    pub fn nritems(&self) -> usize {
        self.nritems
    }

    /// The block's address.
    pub fn bytenr(&self) -> Logical {
        Logical(self.header.bytenr.get())
    }

    /// The transaction that wrote it.
    pub fn generation(&self) -> Generation {
        Generation(self.header.generation.get())
    }

    /// The tree that allocated it.
    pub fn owner(&self) -> TreeId {
        TreeId(self.header.owner.get())
    }

    fn slot_bytes(&self, slot: usize, size: usize) -> Option<&'a [u8]> {
        let start = slot.checked_mul(size)?.checked_add(HEADER)?;
        self.bytes.get(start..start.checked_add(size)?)
    }

    fn item_header(&self, slot: usize) -> Option<&'a Item> {
        if slot >= self.nritems || !self.is_leaf() {
            return None;
        }
        Item::ref_from_bytes(self.slot_bytes(slot, ITEM)?).ok()
    }

    /// The key at `slot`.
    pub fn key(&self, slot: usize) -> Option<Key> {
        if slot >= self.nritems {
            return None;
        }
        if self.is_leaf() {
            self.item_header(slot).map(|i| Key::from(&i.key))
        } else {
            self.ptr(slot).map(|p| p.key)
        }
    }

    /// Item `slot` of a leaf.
    pub fn item(&self, slot: usize) -> Option<LeafItem<'a>> {
        let item = self.item_header(slot)?;
        let start = usize::try_from(item.offset.get())
            .ok()?
            .checked_add(HEADER)?;
        let end = start.checked_add(usize::try_from(item.size.get()).ok()?)?;
        Some(LeafItem {
            key: Key::from(&item.key),
            data: self.bytes.get(start..end)?,
        })
    }

    /// Pointer `slot` of an internal node.
    pub fn ptr(&self, slot: usize) -> Option<NodePtr> {
        if slot >= self.nritems || self.is_leaf() {
            return None;
        }
        let p = KeyPtr::ref_from_bytes(self.slot_bytes(slot, KEY_PTR)?).ok()?;
        Some(NodePtr {
            key: Key::from(&p.key),
            blockptr: Logical(p.blockptr.get()),
            generation: Generation(p.generation.get()),
        })
    }

    /// Binary search: `Ok(slot)` of `key`, or `Err(slot)` where it would be
    /// inserted.
    pub fn search(&self, key: &Key) -> std::result::Result<usize, usize> {
        let want = (key.objectid, key.item_type, key.offset);
        if self.is_leaf() {
            self.items()
                .unwrap_or_default()
                .binary_search_by(|i| raw_key(&i.key).cmp(&want))
        } else {
            self.ptrs()
                .unwrap_or_default()
                .binary_search_by(|p| raw_key(&p.key).cmp(&want))
        }
    }

    /// The item headers of a leaf, in key order (`None` for a node, or
    /// when they do not fit the block).
    pub fn items(&self) -> Option<&'a [Item]> {
        if !self.is_leaf() {
            return None;
        }
        let end = self.nritems.checked_mul(ITEM)?.checked_add(HEADER)?;
        <[Item]>::ref_from_bytes(self.bytes.get(HEADER..end)?).ok()
    }

    /// The pointers of a node, in key order (`None` for a leaf, or when
    /// they do not fit the block).
    pub fn ptrs(&self) -> Option<&'a [KeyPtr]> {
        if self.is_leaf() {
            return None;
        }
        let end = self.nritems.checked_mul(KEY_PTR)?.checked_add(HEADER)?;
        <[KeyPtr]>::ref_from_bytes(self.bytes.get(HEADER..end)?).ok()
    }
}

/// A disk key as a tuple that orders as btrfs keys do.
fn raw_key(k: &DiskKey) -> (u64, u8, u64) {
    (k.objectid.get(), k.item_type, k.offset.get())
}

/// An owned tree block that passed validation.
#[derive(Debug, Clone)]
pub struct TreeBlock {
    data: Arc<BlockBuf>,
    logical: Logical,
    tree: TreeId,
}

impl TreeBlock {
    /// Validate `data` and take it.
    ///
    /// # Errors
    ///
    /// As [`Node::new`].
    pub fn new(data: Arc<BlockBuf>, check: &BlockCheck, expect: &BlockExpect) -> Result<TreeBlock> {
        Node::new(&data, check, expect)?;
        Ok(TreeBlock {
            data,
            logical: expect.logical,
            tree: expect.tree,
        })
    }

    /// This block, validated for `expect.tree`, for `expect` naming
    /// another subvolume tree that shares it (a snapshot and its parent):
    /// without redoing the checksum and item checks, which do not depend on
    /// the tree. `None` when that shortcut does not apply (then validate
    /// anew with [`TreeBlock::new`]).
    pub fn shared_with(&self, expect: &BlockExpect) -> Option<TreeBlock> {
        let node = self.node();
        let same_block = self.logical == expect.logical
            && node.level() == expect.level
            && Generation(node.header().generation.get()) == expect.generation
            && node.nritems() > 0
            && expect.first_key.is_none_or(|k| node.key(0) == Some(k));
        // The owner rule gives the same answer for any two subvolume trees.
        (same_block && is_subvol_tree(self.tree.get()) && is_subvol_tree(expect.tree.get())).then(
            || TreeBlock {
                data: Arc::clone(&self.data),
                logical: self.logical,
                tree: expect.tree,
            },
        )
    }

    /// The view.
    pub fn node(&self) -> Node<'_> {
        // `new` validated the block, so `trusted` succeeds; an empty view is
        // the panic-free fallback.
        Node::trusted(&self.data).unwrap_or_else(Node::empty)
    }

    /// Its address.
    pub fn logical(&self) -> Logical {
        self.logical
    }

    /// The tree it was read for.
    pub fn tree(&self) -> TreeId {
        self.tree
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &Arc<BlockBuf> {
        &self.data
    }
}

static EMPTY_BLOCK: [u8; HEADER] = [0; HEADER];

#[cfg(test)]
mod tests {
    #![allow(
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects,
        clippy::as_conversions
    )]
    use super::*;
    use crate::csum::CsumType;
    use crate::error::Location;

    const LEAF: &[u8; 16384] = include_bytes!("testdata/chunk-leaf.bin");
    const FSID: &str = "aa751912-02b8-4b4b-85b4-6f7430c22e43";
    const CHUNK_UUID: &str = "8ae9989f-f1f8-4380-8c9d-e3cd5b34b4fe";

    fn uuid(s: &str) -> Uuid {
        Uuid(*uuid::Uuid::parse_str(s).unwrap().as_bytes())
    }

    fn check() -> BlockCheck {
        BlockCheck {
            nodesize: 16384,
            sectorsize: 4096,
            csum_type: CsumType::Crc32c,
            metadata_uuid: uuid(FSID),
            chunk_tree_uuid: Some(uuid(CHUNK_UUID)),
            super_generation: Generation(u64::MAX - 1),
            mixed_groups: false,
            skinny_metadata: true,
        }
    }

    fn expect() -> BlockExpect {
        BlockExpect {
            logical: Logical(22036480),
            tree: TreeId::CHUNK,
            generation: Generation(6),
            level: 0,
            first_key: None,
        }
    }

    fn reseal(mut b: Vec<u8>) -> Vec<u8> {
        let c = CsumType::Crc32c.compute(&b[32..]);
        b[..4].copy_from_slice(c.as_bytes());
        b
    }

    fn err(bytes: &[u8], expect: &BlockExpect) -> String {
        Node::new(bytes, &check(), expect).unwrap_err().to_string()
    }

    #[test]
    fn kernel_leaf_matches_dump_tree() {
        let node = Node::new(LEAF, &check(), &expect()).unwrap();
        assert_eq!(node.nritems(), 4);
        assert_eq!(node.owner(), TreeId::CHUNK);
        assert!(node.is_leaf());
        let keys: Vec<String> = (0..4).map(|i| node.key(i).unwrap().to_string()).collect();
        assert_eq!(
            keys,
            [
                "(1 DEV_ITEM 1)",
                "(256 CHUNK_ITEM 13631488)",
                "(256 CHUNK_ITEM 22020096)",
                "(256 CHUNK_ITEM 30408704)"
            ]
        );
        let sizes: Vec<usize> = (0..4).map(|i| node.item(i).unwrap().data.len()).collect();
        assert_eq!(sizes, [98, 80, 112, 112]);
        assert!(node.item(4).is_none());
        assert!(node.ptr(0).is_none());
        assert_eq!(node.search(&Key::new(256, 228, 22020096)), Ok(2));
        assert_eq!(node.search(&Key::new(256, 228, 22020097)), Err(3));
        assert_eq!(node.search(&Key::MIN), Err(0));
        assert_eq!(node.search(&Key::MAX), Err(4));
        let chunk = crate::chunk_map::ChunkInfo::parse(
            30408704,
            node.item(3).unwrap().data,
            crate::chunk_map::ChunkRules::new(4096),
            &Location::Logical(Logical(0)),
        )
        .unwrap();
        assert_eq!(chunk.profile, crate::chunk_map::Profile::Dup);
        assert_eq!(chunk.length, 33554432);
        assert_eq!(
            chunk.flags,
            ondisk::BTRFS_BLOCK_GROUP_METADATA | ondisk::BTRFS_BLOCK_GROUP_DUP
        );
    }

    #[test]
    fn checksum_mismatch() {
        let mut b = LEAF.to_vec();
        b[9000] ^= 1;
        let msg = err(&b, &expect());
        assert!(
            msg.starts_with(
                "corrupt tree block at logical 22036480 (tree 3): crc32c checksum mismatch: stored 0x"
            ),
            "{msg}"
        );
    }

    #[test]
    fn stale_block_and_wrong_address() {
        let mut e = expect();
        e.generation = Generation(7);
        assert_eq!(
            err(LEAF, &e),
            "corrupt leaf at logical 22036480 (tree 3): parent transid verify failed: wanted 7 found 6"
        );
        let mut e = expect();
        e.logical = Logical(22052864);
        assert_eq!(
            err(LEAF, &e),
            "corrupt leaf at logical 22052864 (tree 3): bytenr mismatch: expected 22052864, found 22036480"
        );
        let mut e = expect();
        e.level = 1;
        assert_eq!(
            err(LEAF, &e),
            "corrupt leaf at logical 22036480 (tree 3): level mismatch: expected 1, found 0"
        );
        let mut e = expect();
        e.tree = TreeId::ROOT;
        assert_eq!(
            err(LEAF, &e),
            "corrupt leaf at logical 22036480 (tree 1): owner mismatch: expected tree 1, found 3"
        );
        let mut e = expect();
        e.first_key = Some(Key::new(1, 216, 2));
        assert_eq!(
            err(LEAF, &e),
            "corrupt leaf at logical 22036480 (tree 3): first key mismatch: expected (1 DEV_ITEM 2), found (1 DEV_ITEM 1)"
        );
    }

    #[test]
    fn a_block_shared_by_subvolume_trees_is_not_checked_again() {
        // The chunk leaf, owned by subvolume 256 instead.
        let mut b = LEAF.to_vec();
        b[88..96].copy_from_slice(&256u64.to_le_bytes());
        let mut e = expect();
        e.tree = TreeId(256);
        let block = TreeBlock::new(Arc::new(BlockBuf::copy_of(&reseal(b))), &check(), &e).unwrap();
        let mut snap = e.clone();
        snap.tree = TreeId(257);
        snap.first_key = Some(Key::new(1, 216, 1));
        let shared = block.shared_with(&snap).unwrap();
        assert_eq!(shared.tree(), TreeId(257));
        assert_eq!(shared.logical(), block.logical());
        // Not for a tree of another kind, nor another block.
        let mut x = snap.clone();
        x.tree = TreeId::ROOT;
        assert!(block.shared_with(&x).is_none());
        let mut x = snap.clone();
        x.generation = Generation(7);
        assert!(block.shared_with(&x).is_none());
        let mut x = snap.clone();
        x.level = 1;
        assert!(block.shared_with(&x).is_none());
        let mut x = snap.clone();
        x.first_key = Some(Key::new(1, 216, 2));
        assert!(block.shared_with(&x).is_none());
        let mut x = snap;
        x.logical = Logical(22052864);
        assert!(block.shared_with(&x).is_none());
    }

    #[test]
    fn foreign_fsid_and_chunk_uuid() {
        let mut b = LEAF.to_vec();
        b[0x20] ^= 0xff;
        let msg = err(&reseal(b), &expect());
        assert!(
            msg.starts_with(
                "corrupt leaf at logical 22036480 (tree 3): fsid mismatch: expected aa751912-"
            ),
            "{msg}"
        );
        let mut b = LEAF.to_vec();
        b[0x40] ^= 0xff;
        let msg = err(&reseal(b), &expect());
        assert!(
            msg.contains(": chunk tree uuid mismatch: expected 8ae9989f-"),
            "{msg}"
        );
    }

    #[test]
    fn item_layout_and_order() {
        // Item 1's key objectid (header 101 + 25) lowered below item 0's.
        let mut b = LEAF.to_vec();
        b[101 + 25..101 + 25 + 8].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(
            err(&reseal(b), &expect()),
            "corrupt leaf at logical 22036480 (tree 3): bad key order: slot 1 key (0 CHUNK_ITEM 13631488) is not after (1 DEV_ITEM 1)"
        );
        // Item 2's size grown by one: its data end no longer meets item 1's.
        let mut b = LEAF.to_vec();
        let size_at = 101 + 2 * 25 + 21;
        b[size_at..size_at + 4].copy_from_slice(&113u32.to_le_bytes());
        assert_eq!(
            err(&reseal(b), &expect()),
            "corrupt leaf at logical 22036480 (tree 3): item 2 ends at 16106, expected 16105"
        );
        // Item 0 pointing past the block.
        let mut b = LEAF.to_vec();
        b[101 + 17..101 + 21].copy_from_slice(&16200u32.to_le_bytes());
        assert_eq!(
            err(&reseal(b), &expect()),
            "corrupt leaf at logical 22036480 (tree 3): item 0 ends at 16298, past leaf end 16283"
        );
        // nritems beyond what fits.
        let mut b = LEAF.to_vec();
        b[0x60..0x64].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(
            err(&reseal(b), &expect()),
            "corrupt leaf at logical 22036480 (tree 3): nritems 1000 exceeds maximum 651"
        );
        // A short buffer.
        assert_eq!(
            err(&LEAF[..4096], &expect()),
            "corrupt tree block at logical 22036480 (tree 3): bad tree block size 4096, expected 16384"
        );
    }

    #[test]
    fn tree_block_view() {
        let block =
            TreeBlock::new(Arc::new(BlockBuf::copy_of(&LEAF[..])), &check(), &expect()).unwrap();
        assert_eq!(block.node().nritems(), 4);
        assert_eq!(block.node().key(0), Some(Key::new(1, 216, 1)));
        assert_eq!(Node::empty().nritems(), 0);
    }
}
