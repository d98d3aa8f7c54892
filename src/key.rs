//! Keys: the in-memory form of `btrfs_disk_key`, ordered as btrfs orders them
//! (objectid, type, offset — each unsigned), and printed as btrfs-progs does.
//!
//! A value type at the ground of the data flow, beside [`crate::types`]:
//! errors carry keys, and every stage from `tree` up uses them (re-exported
//! as `tree::key`).

use std::fmt;

use crate::ondisk::{self, DiskKey};

/// A key in native byte order. Derived `Ord` follows field order, which is
/// exactly btrfs key order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key {
    /// Object id.
    pub objectid: u64,
    /// Item type.
    pub item_type: u8,
    /// Type-dependent offset.
    pub offset: u64,
}

impl Key {
    /// The smallest key.
    pub const MIN: Key = Key {
        objectid: 0,
        item_type: 0,
        offset: 0,
    };
    /// The largest key.
    pub const MAX: Key = Key {
        objectid: u64::MAX,
        item_type: u8::MAX,
        offset: u64::MAX,
    };

    /// A key from its parts.
    pub const fn new(objectid: u64, item_type: u8, offset: u64) -> Key {
        Key {
            objectid,
            item_type,
            offset,
        }
    }
}

impl From<&DiskKey> for Key {
    fn from(k: &DiskKey) -> Key {
        Key {
            objectid: k.objectid.get(),
            item_type: k.item_type,
            offset: k.offset.get(),
        }
    }
}

impl From<DiskKey> for Key {
    fn from(k: DiskKey) -> Key {
        Key::from(&k)
    }
}

/// btrfs-progs' name for an item type, if it has one.
pub fn item_type_name(t: u8) -> Option<&'static str> {
    use ondisk::*;
    Some(match t {
        BTRFS_INODE_ITEM_KEY => "INODE_ITEM",
        BTRFS_INODE_REF_KEY => "INODE_REF",
        BTRFS_INODE_EXTREF_KEY => "INODE_EXTREF",
        BTRFS_XATTR_ITEM_KEY => "XATTR_ITEM",
        BTRFS_VERITY_DESC_ITEM_KEY => "VERITY_DESC_ITEM",
        BTRFS_VERITY_MERKLE_ITEM_KEY => "VERITY_MERKLE_ITEM",
        BTRFS_ORPHAN_ITEM_KEY => "ORPHAN_ITEM",
        BTRFS_DIR_LOG_ITEM_KEY => "DIR_LOG_ITEM",
        BTRFS_DIR_LOG_INDEX_KEY => "DIR_LOG_INDEX",
        BTRFS_DIR_ITEM_KEY => "DIR_ITEM",
        BTRFS_DIR_INDEX_KEY => "DIR_INDEX",
        BTRFS_EXTENT_DATA_KEY => "EXTENT_DATA",
        BTRFS_EXTENT_CSUM_KEY => "EXTENT_CSUM",
        BTRFS_ROOT_ITEM_KEY => "ROOT_ITEM",
        BTRFS_ROOT_BACKREF_KEY => "ROOT_BACKREF",
        BTRFS_ROOT_REF_KEY => "ROOT_REF",
        BTRFS_EXTENT_ITEM_KEY => "EXTENT_ITEM",
        BTRFS_METADATA_ITEM_KEY => "METADATA_ITEM",
        BTRFS_TREE_BLOCK_REF_KEY => "TREE_BLOCK_REF",
        BTRFS_EXTENT_DATA_REF_KEY => "EXTENT_DATA_REF",
        BTRFS_SHARED_BLOCK_REF_KEY => "SHARED_BLOCK_REF",
        BTRFS_SHARED_DATA_REF_KEY => "SHARED_DATA_REF",
        BTRFS_BLOCK_GROUP_ITEM_KEY => "BLOCK_GROUP_ITEM",
        BTRFS_FREE_SPACE_INFO_KEY => "FREE_SPACE_INFO",
        BTRFS_FREE_SPACE_EXTENT_KEY => "FREE_SPACE_EXTENT",
        BTRFS_FREE_SPACE_BITMAP_KEY => "FREE_SPACE_BITMAP",
        BTRFS_DEV_EXTENT_KEY => "DEV_EXTENT",
        BTRFS_DEV_ITEM_KEY => "DEV_ITEM",
        BTRFS_CHUNK_ITEM_KEY => "CHUNK_ITEM",
        BTRFS_RAID_STRIPE_KEY => "RAID_STRIPE",
        BTRFS_QGROUP_STATUS_KEY => "QGROUP_STATUS",
        BTRFS_QGROUP_INFO_KEY => "QGROUP_INFO",
        BTRFS_QGROUP_LIMIT_KEY => "QGROUP_LIMIT",
        BTRFS_QGROUP_RELATION_KEY => "QGROUP_RELATION",
        BTRFS_TEMPORARY_ITEM_KEY => "TEMPORARY_ITEM",
        BTRFS_PERSISTENT_ITEM_KEY => "PERSISTENT_ITEM",
        BTRFS_DEV_REPLACE_KEY => "DEV_REPLACE",
        BTRFS_UUID_KEY_SUBVOL => "UUID_KEY_SUBVOL",
        BTRFS_UUID_KEY_RECEIVED_SUBVOL => "UUID_KEY_RECEIVED_SUBVOL",
        BTRFS_STRING_ITEM_KEY => "STRING_ITEM",
        _ => return None,
    })
}

/// btrfs-progs' name for a special (negative) objectid, if it has one.
fn objectid_name(id: u64) -> Option<&'static str> {
    use ondisk::*;
    Some(match id {
        BTRFS_BALANCE_OBJECTID => "BALANCE",
        BTRFS_ORPHAN_OBJECTID => "ORPHAN",
        BTRFS_TREE_LOG_OBJECTID => "TREE_LOG",
        BTRFS_TREE_LOG_FIXUP_OBJECTID => "TREE_LOG_FIXUP",
        BTRFS_TREE_RELOC_OBJECTID => "TREE_RELOC",
        BTRFS_DATA_RELOC_TREE_OBJECTID => "DATA_RELOC_TREE",
        BTRFS_EXTENT_CSUM_OBJECTID => "EXTENT_CSUM",
        BTRFS_FREE_SPACE_OBJECTID => "FREE_SPACE",
        BTRFS_FREE_INO_OBJECTID => "FREE_INO",
        BTRFS_CSUM_CHANGE_OBJECTID => "CSUM_CHANGE",
        u64::MAX => "-1",
        _ => return None,
    })
}

impl fmt::Display for Key {
    /// `(256 INODE_ITEM 0)`, as `btrfs inspect-internal dump-tree` prints keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(")?;
        match objectid_name(self.objectid) {
            Some(n) => f.write_str(n)?,
            None => write!(f, "{}", self.objectid)?,
        }
        match item_type_name(self.item_type) {
            Some(n) => write!(f, " {n}")?,
            None => write!(f, " UNKNOWN.{}", self.item_type)?,
        }
        if self.offset == u64::MAX {
            f.write_str(" -1)")
        } else {
            write!(f, " {})", self.offset)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_numeric_not_bytewise() {
        let a = Key::new(0x100, 1, 0);
        let b = Key::new(0x1ff, 0, 0);
        assert!(a < b);
        assert!(Key::new(5, 132, 0) < Key::new(5, 156, 256));
        assert!(Key::new(256, 1, 0) < Key::new(ondisk::BTRFS_ORPHAN_OBJECTID, 48, 0));
    }

    #[test]
    fn display_like_dump_tree() {
        assert_eq!(Key::new(256, 1, 0).to_string(), "(256 INODE_ITEM 0)");
        assert_eq!(
            Key::new(ondisk::BTRFS_EXTENT_CSUM_OBJECTID, 128, 13631488).to_string(),
            "(EXTENT_CSUM EXTENT_CSUM 13631488)"
        );
        assert_eq!(Key::new(6, 84, u64::MAX).to_string(), "(6 DIR_ITEM -1)");
        assert_eq!(Key::new(1, 7, 2).to_string(), "(1 UNKNOWN.7 2)");
    }
}
