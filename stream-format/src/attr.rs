//! Attribute numbers (`BTRFS_SEND_A_*`) and their wire types.
//!
//! Numbers and version markers: Linux `fs/btrfs/send.h` (`BTRFS_SEND_A_MAX_V1 = 24`,
//! `_MAX_V2 = 31`, `_MAX_V3 = 35`); wire types: what the kernel puts
//! (`TLV_PUT_U64`, `TLV_PUT_UUID`, …) and what btrfs-progs `common/send-stream.c`
//! checks (`TLV_CHECK_LEN`).

use std::fmt;

/// How an attribute's value is encoded on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttrType {
    /// One byte.
    U8,
    /// Little-endian `u32`, exactly 4 bytes.
    U32,
    /// Little-endian `u64`, exactly 8 bytes.
    U64,
    /// 16 raw bytes.
    Uuid,
    /// `struct btrfs_timespec`: `sec` u64 LE then `nsec` u32 LE, exactly 12 bytes.
    Timespec,
    /// A path or name: raw bytes, not NUL-terminated on the wire.
    String,
    /// Opaque bytes (xattr values, verity salt and signature).
    Binary,
    /// `BTRFS_SEND_A_DATA`: file data. In streams of version ≥ 2 it has no length
    /// field and runs to the end of the command, so it must be last.
    Data,
}

impl AttrType {
    /// The exact value size the receiver demands, for fixed-size types.
    pub const fn fixed_size(self) -> Option<usize> {
        match self {
            AttrType::U8 => Some(1),
            AttrType::U32 => Some(4),
            AttrType::U64 => Some(8),
            AttrType::Uuid => Some(16),
            AttrType::Timespec => Some(12),
            AttrType::String | AttrType::Binary | AttrType::Data => None,
        }
    }
}

macro_rules! attrs {
    ($( $(#[$doc:meta])* $variant:ident = $num:literal, $name:literal, $ty:ident, $since:literal; )*) => {
        /// A send-stream attribute (`BTRFS_SEND_A_*`), numbered as on the wire.
        ///
        /// Number 0 (`UNSPEC`) is invalid on the wire and has no variant.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        pub enum Attr {
            $( $(#[$doc])* $variant = $num, )*
        }

        impl Attr {
            /// Every attribute, in numeric order.
            pub const ALL: &'static [Attr] = &[ $( Attr::$variant, )* ];

            /// The attribute with wire number `n`, if there is one.
            pub const fn from_u16(n: u16) -> Option<Attr> {
                match n {
                    $( $num => Some(Attr::$variant), )*
                    _ => None,
                }
            }

            /// The upstream name without the `BTRFS_SEND_A_` prefix, e.g. `"PATH"`.
            pub const fn name(self) -> &'static str {
                match self {
                    $( Attr::$variant => $name, )*
                }
            }

            /// How the value is encoded.
            pub const fn wire_type(self) -> AttrType {
                match self {
                    $( Attr::$variant => AttrType::$ty, )*
                }
            }

            /// The first protocol version whose number range contains this attribute
            /// (`BTRFS_SEND_A_MAX_V1/V2/V3`).
            pub const fn since_version(self) -> u32 {
                match self {
                    $( Attr::$variant => $since, )*
                }
            }
        }
    };
}

attrs! {
    /// UUID of the subvolume (SUBVOL, SNAPSHOT).
    Uuid = 1, "UUID", Uuid, 1;
    /// ctransid of the subvolume.
    Ctransid = 2, "CTRANSID", U64, 1;
    /// Inode number of a new inode.
    Ino = 3, "INO", U64, 1;
    /// A size (TRUNCATE, UPDATE_EXTENT, FALLOCATE).
    Size = 4, "SIZE", U64, 1;
    /// A mode (`st_mode`).
    Mode = 5, "MODE", U64, 1;
    /// Owner uid.
    Uid = 6, "UID", U64, 1;
    /// Owner gid.
    Gid = 7, "GID", U64, 1;
    /// Device number (userspace `dev_t` encoding).
    Rdev = 8, "RDEV", U64, 1;
    /// Change time.
    Ctime = 9, "CTIME", Timespec, 1;
    /// Modification time.
    Mtime = 10, "MTIME", Timespec, 1;
    /// Access time.
    Atime = 11, "ATIME", Timespec, 1;
    /// Creation time; its number is in the v1 range but the kernel emits it only in v2+.
    Otime = 12, "OTIME", Timespec, 1;
    /// Extended attribute name.
    XattrName = 13, "XATTR_NAME", String, 1;
    /// Extended attribute value.
    XattrData = 14, "XATTR_DATA", Binary, 1;
    /// Path of the inode the command works on, relative to the subvolume root.
    Path = 15, "PATH", String, 1;
    /// New path of a RENAME.
    PathTo = 16, "PATH_TO", String, 1;
    /// Existing path of a LINK, or target of a SYMLINK.
    PathLink = 17, "PATH_LINK", String, 1;
    /// File offset.
    FileOffset = 18, "FILE_OFFSET", U64, 1;
    /// File data (special encoding in v2+, see [`AttrType::Data`]).
    Data = 19, "DATA", Data, 1;
    /// UUID of a clone source or snapshot parent.
    CloneUuid = 20, "CLONE_UUID", Uuid, 1;
    /// ctransid of a clone source or snapshot parent.
    CloneCtransid = 21, "CLONE_CTRANSID", U64, 1;
    /// Path of a clone source, relative to its subvolume.
    ClonePath = 22, "CLONE_PATH", String, 1;
    /// Offset in the clone source.
    CloneOffset = 23, "CLONE_OFFSET", U64, 1;
    /// Length of a clone.
    CloneLen = 24, "CLONE_LEN", U64, 1;
    /// `fallocate(2)` mode flags.
    FallocateMode = 25, "FALLOCATE_MODE", U32, 2;
    /// Raw `btrfs_inode_item.flags`.
    Fileattr = 26, "FILEATTR", U64, 2;
    /// Logical bytes an encoded write places in the file.
    UnencodedFileLen = 27, "UNENCODED_FILE_LEN", U64, 2;
    /// Length of the whole decoded extent.
    UnencodedLen = 28, "UNENCODED_LEN", U64, 2;
    /// Offset in the decoded extent where the file's data starts.
    UnencodedOffset = 29, "UNENCODED_OFFSET", U64, 2;
    /// `BTRFS_ENCODED_IO_COMPRESSION_*`.
    Compression = 30, "COMPRESSION", U32, 2;
    /// `BTRFS_ENCODED_IO_ENCRYPTION_*`.
    Encryption = 31, "ENCRYPTION", U32, 2;
    /// fs-verity hash algorithm.
    VerityAlgorithm = 32, "VERITY_ALGORITHM", U8, 3;
    /// fs-verity block size.
    VerityBlockSize = 33, "VERITY_BLOCK_SIZE", U32, 3;
    /// fs-verity salt.
    VeritySaltData = 34, "VERITY_SALT_DATA", Binary, 3;
    /// fs-verity signature.
    VeritySigData = 35, "VERITY_SIG_DATA", Binary, 3;
}

impl Attr {
    /// Largest valid attribute number (`BTRFS_SEND_A_MAX`); larger ones are rejected
    /// by the receiver whatever the stream version.
    pub const MAX: u16 = 35;

    /// The wire number.
    #[allow(clippy::as_conversions)] // a fieldless `repr(u16)` enum: lossless
    pub const fn number(self) -> u16 {
        self as u16
    }

    /// Largest attribute number of protocol `version` (`BTRFS_SEND_A_MAX_V*`);
    /// version 0 is treated as 1, versions above 3 as 3.
    pub const fn max_for_version(version: u32) -> u16 {
        match version {
            0 | 1 => 24,
            2 => 31,
            _ => 35,
        }
    }
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Name of attribute number `n` for messages: `"PATH"`, or `"?"` if unknown.
pub(crate) fn attr_name(n: u16) -> &'static str {
    match Attr::from_u16(n) {
        Some(a) => a.name(),
        None => "?",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_dense_and_round_trip() {
        assert_eq!(Attr::ALL.len(), usize::from(Attr::MAX));
        for (i, a) in Attr::ALL.iter().enumerate() {
            assert_eq!(usize::from(a.number()), i + 1);
            assert_eq!(Attr::from_u16(a.number()), Some(*a));
        }
        assert_eq!(Attr::from_u16(0), None);
        assert_eq!(Attr::from_u16(36), None);
    }

    #[test]
    fn version_ranges_match_the_markers() {
        for a in Attr::ALL {
            let n = a.number();
            let since = if n <= 24 {
                1
            } else if n <= 31 {
                2
            } else {
                3
            };
            assert_eq!(a.since_version(), since, "{a}");
            assert!(n <= Attr::max_for_version(a.since_version()));
        }
    }
}
