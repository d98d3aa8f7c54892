//! Newtypes for each address and id space, so mixing them up is a compile
//! error (as gimli does for its offsets).

use std::fmt;

macro_rules! newtype_u64 {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub u64);

        impl $name {
            /// The raw number.
            pub const fn get(self) -> u64 {
                self.0
            }

            /// `self + n`, or `None` on overflow.
            pub fn checked_add(self, n: u64) -> Option<Self> {
                self.0.checked_add(n).map(Self)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

newtype_u64!(
    /// A logical address: what tree pointers and extents name; mapped to
    /// devices by the chunk map.
    Logical
);
newtype_u64!(
    /// A byte offset on one device.
    Physical
);
newtype_u64!(
    /// A transaction id (`generation`, `transid`).
    Generation
);
newtype_u64!(
    /// A device id within a filesystem.
    DevId
);

/// A byte count or in-memory length as a disk-side `u64` (a `usize`
/// always fits on the targets we build for; saturates otherwise, so a
/// length in an error message can never wrap).
pub(crate) fn len64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// A tree id (the objectid of its ROOT_ITEM). Displayed as a number, as
/// btrfs-progs does in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TreeId(pub u64);

impl TreeId {
    /// The root tree (1).
    pub const ROOT: TreeId = TreeId(crate::ondisk::BTRFS_ROOT_TREE_OBJECTID);
    /// The chunk tree (3).
    pub const CHUNK: TreeId = TreeId(crate::ondisk::BTRFS_CHUNK_TREE_OBJECTID);
    /// The top-level subvolume (5).
    pub const FS: TreeId = TreeId(crate::ondisk::BTRFS_FS_TREE_OBJECTID);

    /// The raw number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for TreeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Negative ids (log, reloc, data reloc trees) read better signed.
        let signed = i64::from_ne_bytes(self.0.to_ne_bytes());
        if signed < 0 {
            write!(f, "{signed}")
        } else {
            write!(f, "{}", self.0)
        }
    }
}

/// A 16-byte UUID as stored on disk (same byte order as its text form).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Uuid(pub [u8; 16]);

impl Uuid {
    /// The all-zero UUID (btrfs uses it for "none").
    pub const NIL: Uuid = Uuid([0; 16]);

    /// Whether this is all zero.
    pub fn is_nil(&self) -> bool {
        self.0 == [0; 16]
    }

    /// Parse the text [`Display`](fmt::Display) writes: 32 hex digits
    /// with 4 dashes, 36 characters in all (`8-4-4-4-12`).
    pub fn parse(s: &str) -> Option<Uuid> {
        let hex: Vec<u8> = s.bytes().filter(|&b| b != b'-').collect();
        if hex.len() != 32 || s.len() != 36 {
            return None;
        }
        let mut out = [0u8; 16];
        for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
            let pair = std::str::from_utf8(pair).ok()?;
            *o = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(Uuid(out))
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&uuid::Uuid::from_bytes(self.0).hyphenated(), f)
    }
}

impl fmt::Debug for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display() {
        assert_eq!(TreeId(5).to_string(), "5");
        assert_eq!(
            TreeId(crate::ondisk::BTRFS_TREE_RELOC_OBJECTID).to_string(),
            "-8"
        );
        let u = Uuid([
            0x0b, 0x2b, 0x57, 0xc3, 0x6d, 0x56, 0x8d, 0x46, 0xaa, 0x28, 0x55, 0x53, 0xb5, 0xd3,
            0xc0, 0x6a,
        ]);
        assert_eq!(u.to_string(), "0b2b57c3-6d56-8d46-aa28-5553b5d3c06a");
    }
}
