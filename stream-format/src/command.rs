//! The typed command model: [`CommandKind`] (numbers and per-version tables) and
//! [`Command`] (one command with its values).
//!
//! Numbers: Linux `fs/btrfs/send.h` (`BTRFS_SEND_C_*`). Attribute order: what
//! `fs/btrfs/send.c` emits, so encoding a [`Command`] reproduces kernel bytes.
//! Required attributes: what btrfs-progs `common/send-stream.c`
//! (`read_and_process_cmd`) asks for.

use std::borrow::Cow;
use std::fmt;

pub use crate::timespec::Timespec;

use crate::attr::Attr;

macro_rules! commands {
    ($( $(#[$doc:meta])* $variant:ident = $num:literal, $name:literal, $since:literal,
        kernel [$($k:ident),*], required [$($r:ident),*]; )*) => {
        /// A known command number (`BTRFS_SEND_C_*`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        pub enum CommandKind {
            $( $(#[$doc])* $variant = $num, )*
        }

        impl CommandKind {
            /// Every known command, in numeric order.
            pub const ALL: &'static [CommandKind] = &[ $( CommandKind::$variant, )* ];

            /// The command with wire number `n`, if it is known.
            pub const fn from_u16(n: u16) -> Option<CommandKind> {
                match n {
                    $( $num => Some(CommandKind::$variant), )*
                    _ => None,
                }
            }

            /// The upstream name without the `BTRFS_SEND_C_` prefix, e.g. `"WRITE"`.
            pub const fn name(self) -> &'static str {
                match self {
                    $( CommandKind::$variant => $name, )*
                }
            }

            /// The first protocol version that has this command
            /// (`BTRFS_SEND_C_MAX_V1/V2/V3`).
            pub const fn since_version(self) -> u32 {
                match self {
                    $( CommandKind::$variant => $since, )*
                }
            }

            /// Every attribute the kernel can emit for this command, in the kernel's
            /// order. Optional ones ([`CommandKind::required_attrs`] lacks them) may be
            /// absent: OTIME before v2, ENCRYPTION for inline extents.
            pub const fn kernel_attrs(self) -> &'static [Attr] {
                match self {
                    $( CommandKind::$variant => &[ $( Attr::$k, )* ], )*
                }
            }

            /// The attributes the btrfs-progs receiver requires, in the order it asks
            /// for them (a missing one is an error).
            pub const fn required_attrs(self) -> &'static [Attr] {
                match self {
                    $( CommandKind::$variant => &[ $( Attr::$r, )* ], )*
                }
            }
        }
    };
}

commands! {
    /// Start of a full stream: create a subvolume.
    Subvol = 1, "SUBVOL", 1,
        kernel [Path, Uuid, Ctransid], required [Path, Uuid, Ctransid];
    /// Start of an incremental stream: snapshot the parent.
    Snapshot = 2, "SNAPSHOT", 1,
        kernel [Path, Uuid, Ctransid, CloneUuid, CloneCtransid],
        required [Path, Uuid, Ctransid, CloneUuid, CloneCtransid];
    /// Create a regular file.
    Mkfile = 3, "MKFILE", 1, kernel [Path, Ino], required [Path, Ino];
    /// Create a directory.
    Mkdir = 4, "MKDIR", 1, kernel [Path, Ino], required [Path, Ino];
    /// Create a device node.
    Mknod = 5, "MKNOD", 1, kernel [Path, Ino, Rdev, Mode], required [Path, Ino, Mode, Rdev];
    /// Create a FIFO.
    Mkfifo = 6, "MKFIFO", 1, kernel [Path, Ino, Rdev, Mode], required [Path, Ino];
    /// Create a socket.
    Mksock = 7, "MKSOCK", 1, kernel [Path, Ino, Rdev, Mode], required [Path, Ino];
    /// Create a symlink.
    Symlink = 8, "SYMLINK", 1, kernel [Path, Ino, PathLink], required [Path, Ino, PathLink];
    /// Rename.
    Rename = 9, "RENAME", 1, kernel [Path, PathTo], required [Path, PathTo];
    /// Create a hard link.
    Link = 10, "LINK", 1, kernel [Path, PathLink], required [Path, PathLink];
    /// Remove a non-directory.
    Unlink = 11, "UNLINK", 1, kernel [Path], required [Path];
    /// Remove a directory.
    Rmdir = 12, "RMDIR", 1, kernel [Path], required [Path];
    /// Set an extended attribute.
    SetXattr = 13, "SET_XATTR", 1,
        kernel [Path, XattrName, XattrData], required [Path, XattrName, XattrData];
    /// Remove an extended attribute.
    RemoveXattr = 14, "REMOVE_XATTR", 1, kernel [Path, XattrName], required [Path, XattrName];
    /// Write data.
    Write = 15, "WRITE", 1, kernel [Path, FileOffset, Data], required [Path, FileOffset, Data];
    /// Clone a range from another file.
    Clone = 16, "CLONE", 1,
        kernel [FileOffset, CloneLen, Path, CloneUuid, CloneCtransid, ClonePath, CloneOffset],
        required [Path, FileOffset, CloneLen, CloneUuid, CloneCtransid, ClonePath, CloneOffset];
    /// Truncate.
    Truncate = 17, "TRUNCATE", 1, kernel [Path, Size], required [Path, Size];
    /// Change permission bits.
    Chmod = 18, "CHMOD", 1, kernel [Path, Mode], required [Path, Mode];
    /// Change owner.
    Chown = 19, "CHOWN", 1, kernel [Path, Uid, Gid], required [Path, Uid, Gid];
    /// Set times.
    Utimes = 20, "UTIMES", 1,
        kernel [Path, Atime, Mtime, Ctime, Otime], required [Path, Atime, Mtime, Ctime];
    /// End of one logical stream.
    End = 21, "END", 1, kernel [], required [];
    /// An extent exists (`--no-data` streams).
    UpdateExtent = 22, "UPDATE_EXTENT", 1,
        kernel [Path, FileOffset, Size], required [Path, FileOffset, Size];
    /// `fallocate(2)` (hole punching).
    Fallocate = 23, "FALLOCATE", 2,
        kernel [Path, FallocateMode, FileOffset, Size],
        required [Path, FallocateMode, FileOffset, Size];
    /// Inode flags.
    Fileattr = 24, "FILEATTR", 2, kernel [Path, Fileattr], required [Path, Fileattr];
    /// Write compressed data as is.
    EncodedWrite = 25, "ENCODED_WRITE", 2,
        kernel [Path, FileOffset, UnencodedFileLen, UnencodedLen, UnencodedOffset,
                Compression, Encryption, Data],
        required [Path, FileOffset, UnencodedFileLen, UnencodedLen, UnencodedOffset, Data];
    /// Enable fs-verity.
    EnableVerity = 26, "ENABLE_VERITY", 3,
        kernel [Path, VerityAlgorithm, VerityBlockSize, VeritySaltData, VeritySigData],
        required [Path, VerityAlgorithm, VerityBlockSize, VeritySaltData, VeritySigData];
}

impl CommandKind {
    /// Largest command number of protocol `version` (`BTRFS_SEND_C_MAX_V*`);
    /// version 0 is treated as 1, versions above 3 as 3.
    pub const fn max_for_version(version: u32) -> u16 {
        match version {
            0 | 1 => 22,
            2 => 25,
            _ => 26,
        }
    }

    /// The wire number.
    #[allow(clippy::as_conversions)] // a fieldless `repr(u16)` enum: lossless
    pub const fn number(self) -> u16 {
        self as u16
    }
}

impl fmt::Display for CommandKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A command number for messages: `WRITE`, or `cmd 99` when unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandName(pub u16);

impl fmt::Display for CommandName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match CommandKind::from_u16(self.0) {
            Some(k) => f.write_str(k.name()),
            None => write!(f, "cmd {}", self.0),
        }
    }
}

/// Raw bytes of a path, name or binary value: borrowed from a reader's buffer or a
/// caller's slice, or owned.
pub type Bytes<'a> = Cow<'a, [u8]>;

/// One send-stream command with typed values.
///
/// Paths and names are raw bytes (they may be non-UTF-8; the receiver cuts them at
/// the first NUL). Variant fields follow the kernel's attribute order. Optional
/// fields are attributes the kernel may send but the receiver does not require.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'a> {
    /// `SUBVOL`: start of a full stream.
    Subvol {
        /// Subvolume name (no slashes).
        path: Bytes<'a>,
        /// Its received UUID if set, else its UUID.
        uuid: [u8; 16],
        /// Its ctransid.
        ctransid: u64,
    },
    /// `SNAPSHOT`: start of an incremental stream.
    Snapshot {
        /// Snapshot name.
        path: Bytes<'a>,
        /// UUID of the sent subvolume.
        uuid: [u8; 16],
        /// Its ctransid.
        ctransid: u64,
        /// UUID of the parent.
        clone_uuid: [u8; 16],
        /// ctransid of the parent.
        clone_ctransid: u64,
    },
    /// `MKFILE`.
    Mkfile {
        /// New path (an orphan name from the kernel).
        path: Bytes<'a>,
        /// Inode number.
        ino: u64,
    },
    /// `MKDIR`.
    Mkdir {
        /// New path.
        path: Bytes<'a>,
        /// Inode number.
        ino: u64,
    },
    /// `MKNOD`.
    Mknod {
        /// New path.
        path: Bytes<'a>,
        /// Inode number.
        ino: u64,
        /// Device number (userspace `dev_t`).
        rdev: u64,
        /// Full `st_mode` including the type bits.
        mode: u64,
    },
    /// `MKFIFO`.
    Mkfifo {
        /// New path.
        path: Bytes<'a>,
        /// Inode number.
        ino: u64,
        /// RDEV as sent by the kernel (0); not required by the receiver.
        rdev: Option<u64>,
        /// MODE as sent by the kernel; not required by the receiver.
        mode: Option<u64>,
    },
    /// `MKSOCK`.
    Mksock {
        /// New path.
        path: Bytes<'a>,
        /// Inode number.
        ino: u64,
        /// RDEV as sent by the kernel (0); not required by the receiver.
        rdev: Option<u64>,
        /// MODE as sent by the kernel; not required by the receiver.
        mode: Option<u64>,
    },
    /// `SYMLINK`.
    Symlink {
        /// New path.
        path: Bytes<'a>,
        /// Inode number.
        ino: u64,
        /// Link target, verbatim.
        path_link: Bytes<'a>,
    },
    /// `RENAME` from `path` to `path_to`.
    Rename {
        /// Old path.
        path: Bytes<'a>,
        /// New path.
        path_to: Bytes<'a>,
    },
    /// `LINK`: create `path` as a hard link to the existing `path_link`.
    Link {
        /// New name.
        path: Bytes<'a>,
        /// Existing path.
        path_link: Bytes<'a>,
    },
    /// `UNLINK`.
    Unlink {
        /// Path to remove.
        path: Bytes<'a>,
    },
    /// `RMDIR`.
    Rmdir {
        /// Directory to remove.
        path: Bytes<'a>,
    },
    /// `SET_XATTR`.
    SetXattr {
        /// File.
        path: Bytes<'a>,
        /// Attribute name.
        name: Bytes<'a>,
        /// Attribute value.
        data: Bytes<'a>,
    },
    /// `REMOVE_XATTR`.
    RemoveXattr {
        /// File.
        path: Bytes<'a>,
        /// Attribute name.
        name: Bytes<'a>,
    },
    /// `WRITE`.
    Write {
        /// File.
        path: Bytes<'a>,
        /// File offset.
        offset: u64,
        /// Data.
        data: Bytes<'a>,
    },
    /// `CLONE`: copy `len` bytes at `clone_offset` of `clone_path` (in the subvolume
    /// `clone_uuid`) to `path` at `offset`.
    Clone {
        /// Destination offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Destination file.
        path: Bytes<'a>,
        /// Source subvolume.
        clone_uuid: [u8; 16],
        /// Source subvolume's ctransid.
        clone_ctransid: u64,
        /// Source file, relative to the source subvolume.
        clone_path: Bytes<'a>,
        /// Source offset.
        clone_offset: u64,
    },
    /// `TRUNCATE`.
    Truncate {
        /// File.
        path: Bytes<'a>,
        /// New size.
        size: u64,
    },
    /// `CHMOD`.
    Chmod {
        /// File.
        path: Bytes<'a>,
        /// `st_mode & 07777`.
        mode: u64,
    },
    /// `CHOWN`.
    Chown {
        /// File.
        path: Bytes<'a>,
        /// Owner.
        uid: u64,
        /// Group.
        gid: u64,
    },
    /// `UTIMES`.
    Utimes {
        /// File.
        path: Bytes<'a>,
        /// Access time.
        atime: Timespec,
        /// Modification time.
        mtime: Timespec,
        /// Change time.
        ctime: Timespec,
        /// Creation time: sent by the kernel from v2 on; ignored by the receiver.
        otime: Option<Timespec>,
    },
    /// `END`.
    End,
    /// `UPDATE_EXTENT` (`--no-data` streams).
    UpdateExtent {
        /// File.
        path: Bytes<'a>,
        /// File offset.
        offset: u64,
        /// Length.
        size: u64,
    },
    /// `FALLOCATE` (v2).
    Fallocate {
        /// File.
        path: Bytes<'a>,
        /// `fallocate(2)` mode flags.
        mode: u32,
        /// Offset.
        offset: u64,
        /// Length.
        size: u64,
    },
    /// `FILEATTR` (v2).
    Fileattr {
        /// File.
        path: Bytes<'a>,
        /// Raw `btrfs_inode_item.flags`.
        attr: u64,
    },
    /// `ENCODED_WRITE` (v2).
    EncodedWrite {
        /// File.
        path: Bytes<'a>,
        /// File offset.
        offset: u64,
        /// Logical bytes placed in the file.
        unencoded_file_len: u64,
        /// Length of the decoded extent.
        unencoded_len: u64,
        /// Offset in the decoded extent.
        unencoded_offset: u64,
        /// Compression; the receiver defaults to 0 when absent.
        compression: Option<u32>,
        /// Encryption; the kernel omits it for inline extents.
        encryption: Option<u32>,
        /// Encoded data.
        data: Bytes<'a>,
    },
    /// `ENABLE_VERITY` (v3).
    EnableVerity {
        /// File.
        path: Bytes<'a>,
        /// Hash algorithm.
        algorithm: u8,
        /// Block size.
        block_size: u32,
        /// Salt.
        salt: Bytes<'a>,
        /// Signature.
        sig: Bytes<'a>,
    },
    /// A command number this crate does not know (the receiver ignores it), kept
    /// with its payload so it can be written back verbatim.
    Unknown {
        /// Command number.
        cmd: u16,
        /// Whole payload (the attribute bytes).
        payload: Bytes<'a>,
    },
}

/// One attribute value, borrowed from a [`Command`] for encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Value<'v> {
    U8(u8),
    U32(u32),
    U64(u64),
    Uuid(&'v [u8; 16]),
    Timespec(Timespec),
    Bytes(&'v [u8]),
}

impl<'a> Command<'a> {
    /// The command's kind, or `None` for [`Command::Unknown`].
    pub fn kind(&self) -> Option<CommandKind> {
        use CommandKind as K;
        Some(match self {
            Command::Subvol { .. } => K::Subvol,
            Command::Snapshot { .. } => K::Snapshot,
            Command::Mkfile { .. } => K::Mkfile,
            Command::Mkdir { .. } => K::Mkdir,
            Command::Mknod { .. } => K::Mknod,
            Command::Mkfifo { .. } => K::Mkfifo,
            Command::Mksock { .. } => K::Mksock,
            Command::Symlink { .. } => K::Symlink,
            Command::Rename { .. } => K::Rename,
            Command::Link { .. } => K::Link,
            Command::Unlink { .. } => K::Unlink,
            Command::Rmdir { .. } => K::Rmdir,
            Command::SetXattr { .. } => K::SetXattr,
            Command::RemoveXattr { .. } => K::RemoveXattr,
            Command::Write { .. } => K::Write,
            Command::Clone { .. } => K::Clone,
            Command::Truncate { .. } => K::Truncate,
            Command::Chmod { .. } => K::Chmod,
            Command::Chown { .. } => K::Chown,
            Command::Utimes { .. } => K::Utimes,
            Command::End => K::End,
            Command::UpdateExtent { .. } => K::UpdateExtent,
            Command::Fallocate { .. } => K::Fallocate,
            Command::Fileattr { .. } => K::Fileattr,
            Command::EncodedWrite { .. } => K::EncodedWrite,
            Command::EnableVerity { .. } => K::EnableVerity,
            Command::Unknown { .. } => return None,
        })
    }

    /// The wire command number.
    pub fn number(&self) -> u16 {
        match self {
            Command::Unknown { cmd, .. } => *cmd,
            _ => self.kind().map_or(0, CommandKind::number),
        }
    }

    /// The `PATH` attribute, for commands that have one.
    pub fn path(&self) -> Option<&[u8]> {
        match self {
            Command::Subvol { path, .. }
            | Command::Snapshot { path, .. }
            | Command::Mkfile { path, .. }
            | Command::Mkdir { path, .. }
            | Command::Mknod { path, .. }
            | Command::Mkfifo { path, .. }
            | Command::Mksock { path, .. }
            | Command::Symlink { path, .. }
            | Command::Rename { path, .. }
            | Command::Link { path, .. }
            | Command::Unlink { path }
            | Command::Rmdir { path }
            | Command::SetXattr { path, .. }
            | Command::RemoveXattr { path, .. }
            | Command::Write { path, .. }
            | Command::Clone { path, .. }
            | Command::Truncate { path, .. }
            | Command::Chmod { path, .. }
            | Command::Chown { path, .. }
            | Command::Utimes { path, .. }
            | Command::UpdateExtent { path, .. }
            | Command::Fallocate { path, .. }
            | Command::Fileattr { path, .. }
            | Command::EncodedWrite { path, .. }
            | Command::EnableVerity { path, .. } => Some(path),
            Command::End | Command::Unknown { .. } => None,
        }
    }

    /// Copy every borrowed byte string so the command outlives its source buffer.
    pub fn into_owned(self) -> Command<'static> {
        fn o(b: Bytes<'_>) -> Bytes<'static> {
            Cow::Owned(b.into_owned())
        }
        match self {
            Command::Subvol {
                path,
                uuid,
                ctransid,
            } => Command::Subvol {
                path: o(path),
                uuid,
                ctransid,
            },
            Command::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                clone_ctransid,
            } => Command::Snapshot {
                path: o(path),
                uuid,
                ctransid,
                clone_uuid,
                clone_ctransid,
            },
            Command::Mkfile { path, ino } => Command::Mkfile { path: o(path), ino },
            Command::Mkdir { path, ino } => Command::Mkdir { path: o(path), ino },
            Command::Mknod {
                path,
                ino,
                rdev,
                mode,
            } => Command::Mknod {
                path: o(path),
                ino,
                rdev,
                mode,
            },
            Command::Mkfifo {
                path,
                ino,
                rdev,
                mode,
            } => Command::Mkfifo {
                path: o(path),
                ino,
                rdev,
                mode,
            },
            Command::Mksock {
                path,
                ino,
                rdev,
                mode,
            } => Command::Mksock {
                path: o(path),
                ino,
                rdev,
                mode,
            },
            Command::Symlink {
                path,
                ino,
                path_link,
            } => Command::Symlink {
                path: o(path),
                ino,
                path_link: o(path_link),
            },
            Command::Rename { path, path_to } => Command::Rename {
                path: o(path),
                path_to: o(path_to),
            },
            Command::Link { path, path_link } => Command::Link {
                path: o(path),
                path_link: o(path_link),
            },
            Command::Unlink { path } => Command::Unlink { path: o(path) },
            Command::Rmdir { path } => Command::Rmdir { path: o(path) },
            Command::SetXattr { path, name, data } => Command::SetXattr {
                path: o(path),
                name: o(name),
                data: o(data),
            },
            Command::RemoveXattr { path, name } => Command::RemoveXattr {
                path: o(path),
                name: o(name),
            },
            Command::Write { path, offset, data } => Command::Write {
                path: o(path),
                offset,
                data: o(data),
            },
            Command::Clone {
                offset,
                len,
                path,
                clone_uuid,
                clone_ctransid,
                clone_path,
                clone_offset,
            } => Command::Clone {
                offset,
                len,
                path: o(path),
                clone_uuid,
                clone_ctransid,
                clone_path: o(clone_path),
                clone_offset,
            },
            Command::Truncate { path, size } => Command::Truncate {
                path: o(path),
                size,
            },
            Command::Chmod { path, mode } => Command::Chmod {
                path: o(path),
                mode,
            },
            Command::Chown { path, uid, gid } => Command::Chown {
                path: o(path),
                uid,
                gid,
            },
            Command::Utimes {
                path,
                atime,
                mtime,
                ctime,
                otime,
            } => Command::Utimes {
                path: o(path),
                atime,
                mtime,
                ctime,
                otime,
            },
            Command::End => Command::End,
            Command::UpdateExtent { path, offset, size } => Command::UpdateExtent {
                path: o(path),
                offset,
                size,
            },
            Command::Fallocate {
                path,
                mode,
                offset,
                size,
            } => Command::Fallocate {
                path: o(path),
                mode,
                offset,
                size,
            },
            Command::Fileattr { path, attr } => Command::Fileattr {
                path: o(path),
                attr,
            },
            Command::EncodedWrite {
                path,
                offset,
                unencoded_file_len,
                unencoded_len,
                unencoded_offset,
                compression,
                encryption,
                data,
            } => Command::EncodedWrite {
                path: o(path),
                offset,
                unencoded_file_len,
                unencoded_len,
                unencoded_offset,
                compression,
                encryption,
                data: o(data),
            },
            Command::EnableVerity {
                path,
                algorithm,
                block_size,
                salt,
                sig,
            } => Command::EnableVerity {
                path: o(path),
                algorithm,
                block_size,
                salt: o(salt),
                sig: o(sig),
            },
            Command::Unknown { cmd, payload } => Command::Unknown {
                cmd,
                payload: o(payload),
            },
        }
    }

    /// The bytes this command takes in a v1 stream: the command header and
    /// every attribute's type-length header and value (in v2+, DATA has no
    /// length field: two bytes fewer).
    pub fn encoded_len(&self) -> u64 {
        let mut n = u64::try_from(crate::CMD_HEADER_SIZE).unwrap_or(u64::MAX);
        if let Command::Unknown { payload, .. } = self {
            return n.saturating_add(u64::try_from(payload.len()).unwrap_or(u64::MAX));
        }
        let _ = self.visit_attrs(|_, value| {
            let len = match value {
                Value::U8(_) => 1,
                Value::U32(_) => 4,
                Value::U64(_) => 8,
                Value::Uuid(_) => 16,
                Value::Timespec(_) => 12,
                Value::Bytes(b) => b.len(),
            };
            n = n.saturating_add(u64::try_from(len).unwrap_or(u64::MAX).saturating_add(4));
            Ok::<(), std::convert::Infallible>(())
        });
        n
    }

    /// The bytes this command takes in a stream of `version`, as
    /// [`crate::StreamWriter::write`] writes it: [`encoded_len`](Self::encoded_len),
    /// less the length field DATA does not have from v2 on.
    pub fn stream_len(&self, version: u32) -> u64 {
        let mut n = self.encoded_len();
        if version >= 2 && !matches!(self, Command::Unknown { .. }) {
            let _ = self.visit_attrs(|attr, _| {
                if attr == Attr::Data {
                    n = n.saturating_sub(2);
                }
                Ok::<(), std::convert::Infallible>(())
            });
        }
        n
    }

    /// Call `f` for every attribute present, in the kernel's order.
    ///
    /// [`Command::Unknown`] has no typed attributes (its payload is raw).
    pub(crate) fn visit_attrs<'s, E>(
        &'s self,
        mut f: impl FnMut(Attr, Value<'s>) -> Result<(), E>,
    ) -> Result<(), E> {
        use Value as V;
        match self {
            Command::Subvol {
                path,
                uuid,
                ctransid,
            } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::Uuid, V::Uuid(uuid))?;
                f(Attr::Ctransid, V::U64(*ctransid))
            }
            Command::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                clone_ctransid,
            } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::Uuid, V::Uuid(uuid))?;
                f(Attr::Ctransid, V::U64(*ctransid))?;
                f(Attr::CloneUuid, V::Uuid(clone_uuid))?;
                f(Attr::CloneCtransid, V::U64(*clone_ctransid))
            }
            Command::Mkfile { path, ino } | Command::Mkdir { path, ino } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::Ino, V::U64(*ino))
            }
            Command::Mknod {
                path,
                ino,
                rdev,
                mode,
            } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::Ino, V::U64(*ino))?;
                f(Attr::Rdev, V::U64(*rdev))?;
                f(Attr::Mode, V::U64(*mode))
            }
            Command::Mkfifo {
                path,
                ino,
                rdev,
                mode,
            }
            | Command::Mksock {
                path,
                ino,
                rdev,
                mode,
            } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::Ino, V::U64(*ino))?;
                if let Some(rdev) = rdev {
                    f(Attr::Rdev, V::U64(*rdev))?;
                }
                if let Some(mode) = mode {
                    f(Attr::Mode, V::U64(*mode))?;
                }
                Ok(())
            }
            Command::Symlink {
                path,
                ino,
                path_link,
            } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::Ino, V::U64(*ino))?;
                f(Attr::PathLink, V::Bytes(path_link))
            }
            Command::Rename { path, path_to } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::PathTo, V::Bytes(path_to))
            }
            Command::Link { path, path_link } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::PathLink, V::Bytes(path_link))
            }
            Command::Unlink { path } | Command::Rmdir { path } => f(Attr::Path, V::Bytes(path)),
            Command::SetXattr { path, name, data } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::XattrName, V::Bytes(name))?;
                f(Attr::XattrData, V::Bytes(data))
            }
            Command::RemoveXattr { path, name } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::XattrName, V::Bytes(name))
            }
            Command::Write { path, offset, data } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::FileOffset, V::U64(*offset))?;
                f(Attr::Data, V::Bytes(data))
            }
            Command::Clone {
                offset,
                len,
                path,
                clone_uuid,
                clone_ctransid,
                clone_path,
                clone_offset,
            } => {
                f(Attr::FileOffset, V::U64(*offset))?;
                f(Attr::CloneLen, V::U64(*len))?;
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::CloneUuid, V::Uuid(clone_uuid))?;
                f(Attr::CloneCtransid, V::U64(*clone_ctransid))?;
                f(Attr::ClonePath, V::Bytes(clone_path))?;
                f(Attr::CloneOffset, V::U64(*clone_offset))
            }
            Command::Truncate { path, size } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::Size, V::U64(*size))
            }
            Command::Chmod { path, mode } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::Mode, V::U64(*mode))
            }
            Command::Chown { path, uid, gid } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::Uid, V::U64(*uid))?;
                f(Attr::Gid, V::U64(*gid))
            }
            Command::Utimes {
                path,
                atime,
                mtime,
                ctime,
                otime,
            } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::Atime, V::Timespec(*atime))?;
                f(Attr::Mtime, V::Timespec(*mtime))?;
                f(Attr::Ctime, V::Timespec(*ctime))?;
                if let Some(otime) = otime {
                    f(Attr::Otime, V::Timespec(*otime))?;
                }
                Ok(())
            }
            Command::End | Command::Unknown { .. } => Ok(()),
            Command::UpdateExtent { path, offset, size } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::FileOffset, V::U64(*offset))?;
                f(Attr::Size, V::U64(*size))
            }
            Command::Fallocate {
                path,
                mode,
                offset,
                size,
            } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::FallocateMode, V::U32(*mode))?;
                f(Attr::FileOffset, V::U64(*offset))?;
                f(Attr::Size, V::U64(*size))
            }
            Command::Fileattr { path, attr } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::Fileattr, V::U64(*attr))
            }
            Command::EncodedWrite {
                path,
                offset,
                unencoded_file_len,
                unencoded_len,
                unencoded_offset,
                compression,
                encryption,
                data,
            } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::FileOffset, V::U64(*offset))?;
                f(Attr::UnencodedFileLen, V::U64(*unencoded_file_len))?;
                f(Attr::UnencodedLen, V::U64(*unencoded_len))?;
                f(Attr::UnencodedOffset, V::U64(*unencoded_offset))?;
                if let Some(c) = compression {
                    f(Attr::Compression, V::U32(*c))?;
                }
                if let Some(e) = encryption {
                    f(Attr::Encryption, V::U32(*e))?;
                }
                f(Attr::Data, V::Bytes(data))
            }
            Command::EnableVerity {
                path,
                algorithm,
                block_size,
                salt,
                sig,
            } => {
                f(Attr::Path, V::Bytes(path))?;
                f(Attr::VerityAlgorithm, V::U8(*algorithm))?;
                f(Attr::VerityBlockSize, V::U32(*block_size))?;
                f(Attr::VeritySaltData, V::Bytes(salt))?;
                f(Attr::VeritySigData, V::Bytes(sig))
            }
        }
    }
}

#[cfg(test)]
mod tests;
