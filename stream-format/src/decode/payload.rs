//! From a command's checked payload to a typed [`Command`]: the attribute
//! getters (required, optional, sized) and, for a skimmed command read
//! apart from the stream, [`decode_payload`]. The framing (headers,
//! lengths, CRCs, streams one after another) is the parent module's.

use std::borrow::Cow;

use crate::attr::Attr;
use crate::command::{Command, CommandKind, Timespec};
use crate::error::{CommandInfo, DecodeError};

use super::{RawAttr, RawCommand, add_offset, check_crc, split, value_of};
use crate::CMD_HEADER_SIZE;

/// Check and decode a [skimmed](super::Next::Skimmed) command from its whole
/// payload, read apart from the stream: its length, CRC and attributes are
/// checked as [`StreamReader::next_command`](super::StreamReader::next_command) checks them, with the same
/// errors (offsets in the stream). `attrs` is scratch space, reused.
///
/// # Errors
///
/// A payload of the wrong length (the input was cut short), a CRC mismatch,
/// a bad attribute walk, a missing or wrong-sized attribute.
pub fn decode_payload<'a>(
    info: &CommandInfo,
    crc: u32,
    payload: &'a [u8],
    attrs: &'a mut Vec<RawAttr>,
) -> Result<Command<'a>, DecodeError> {
    let len = usize::try_from(info.len).unwrap_or(usize::MAX);
    if payload.len() != len {
        return Err(DecodeError::TruncatedCommand {
            cmd: *info,
            available: payload.len(),
        });
    }
    check_crc(info, crc, payload)?;
    let raw = split(info, payload, attrs)?;
    Command::from_raw(&raw, info)
}

/// Typed access to a raw command's attributes, with btrfs-progs' checks.
struct Getter<'r, 'a> {
    raw: &'r RawCommand<'a>,
    info: &'r CommandInfo,
}

impl<'a> Getter<'_, 'a> {
    fn attr_offset(&self, a: &RawAttr) -> u64 {
        add_offset(add_offset(self.info.offset, CMD_HEADER_SIZE), a.tlv_offset)
    }

    fn bytes(&self, attr: Attr) -> Result<Cow<'a, [u8]>, DecodeError> {
        match self.raw.get(attr) {
            Some(v) => Ok(Cow::Borrowed(v)),
            None => Err(DecodeError::MissingAttr {
                cmd: *self.info,
                attr,
            }),
        }
    }

    /// A present attribute checked for exact size `N`; `Ok(None)` if absent.
    fn fixed_opt<const N: usize>(&self, attr: Attr) -> Result<Option<[u8; N]>, DecodeError> {
        let Some(a) = self.raw.find(attr) else {
            return Ok(None);
        };
        let v = value_of(self.raw.payload, a);
        match <[u8; N]>::try_from(v) {
            Ok(arr) => Ok(Some(arr)),
            Err(_) => Err(DecodeError::AttrSize {
                cmd: *self.info,
                attr,
                attr_offset: self.attr_offset(a),
                expected: N,
                got: v.len(),
            }),
        }
    }

    fn fixed<const N: usize>(&self, attr: Attr) -> Result<[u8; N], DecodeError> {
        self.fixed_opt(attr)?.ok_or(DecodeError::MissingAttr {
            cmd: *self.info,
            attr,
        })
    }

    fn u8(&self, attr: Attr) -> Result<u8, DecodeError> {
        let [b] = self.fixed::<1>(attr)?;
        Ok(b)
    }

    fn u32(&self, attr: Attr) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.fixed(attr)?))
    }

    fn u64(&self, attr: Attr) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.fixed(attr)?))
    }

    fn uuid(&self, attr: Attr) -> Result<[u8; 16], DecodeError> {
        self.fixed(attr)
    }

    fn timespec(&self, attr: Attr) -> Result<Timespec, DecodeError> {
        Ok(Timespec::from_bytes(self.fixed(attr)?))
    }

    /// An optional u32 the receiver checks when present (ENCODED_WRITE's
    /// COMPRESSION and ENCRYPTION).
    fn u32_opt(&self, attr: Attr) -> Result<Option<u32>, DecodeError> {
        Ok(self.fixed_opt(attr)?.map(u32::from_le_bytes))
    }

    /// An attribute the receiver never asks for: kept when well-formed, dropped
    /// (like the receiver ignores it) otherwise.
    fn u64_ignored(&self, attr: Attr) -> Option<u64> {
        self.fixed_opt(attr).ok().flatten().map(u64::from_le_bytes)
    }

    fn timespec_ignored(&self, attr: Attr) -> Option<Timespec> {
        self.fixed_opt(attr)
            .ok()
            .flatten()
            .map(Timespec::from_bytes)
    }
}

impl<'a> Command<'a> {
    /// Interpret a raw command like btrfs-progs `read_and_process_cmd()`: required
    /// attributes are fetched in its order (last occurrence wins) and integer,
    /// UUID and timespec sizes are checked; unused attributes are ignored; unknown
    /// command numbers give [`Command::Unknown`]. Commands are interpreted by number
    /// whatever the stream version, as the receiver does.
    ///
    /// Byte strings borrow from `raw`. Optional attributes the receiver never reads
    /// (MKFIFO/MKSOCK RDEV and MODE, UTIMES OTIME) are `None` when absent or
    /// mis-sized.
    ///
    /// # Errors
    ///
    /// [`DecodeError::MissingAttr`] or [`DecodeError::AttrSize`], located with
    /// `info`.
    pub fn from_raw(raw: &RawCommand<'a>, info: &CommandInfo) -> Result<Command<'a>, DecodeError> {
        use Attr as A;
        let g = Getter { raw, info };
        let Some(kind) = raw.kind() else {
            return Ok(Command::Unknown {
                cmd: raw.cmd,
                payload: Cow::Borrowed(raw.payload),
            });
        };
        Ok(match kind {
            CommandKind::Subvol => Command::Subvol {
                path: g.bytes(A::Path)?,
                uuid: g.uuid(A::Uuid)?,
                ctransid: g.u64(A::Ctransid)?,
            },
            CommandKind::Snapshot => Command::Snapshot {
                path: g.bytes(A::Path)?,
                uuid: g.uuid(A::Uuid)?,
                ctransid: g.u64(A::Ctransid)?,
                clone_uuid: g.uuid(A::CloneUuid)?,
                clone_ctransid: g.u64(A::CloneCtransid)?,
            },
            CommandKind::Mkfile => Command::Mkfile {
                path: g.bytes(A::Path)?,
                ino: g.u64(A::Ino)?,
            },
            CommandKind::Mkdir => Command::Mkdir {
                path: g.bytes(A::Path)?,
                ino: g.u64(A::Ino)?,
            },
            CommandKind::Mknod => {
                let path = g.bytes(A::Path)?;
                let ino = g.u64(A::Ino)?;
                let mode = g.u64(A::Mode)?;
                let rdev = g.u64(A::Rdev)?;
                Command::Mknod {
                    path,
                    ino,
                    rdev,
                    mode,
                }
            }
            CommandKind::Mkfifo => Command::Mkfifo {
                path: g.bytes(A::Path)?,
                ino: g.u64(A::Ino)?,
                rdev: g.u64_ignored(A::Rdev),
                mode: g.u64_ignored(A::Mode),
            },
            CommandKind::Mksock => Command::Mksock {
                path: g.bytes(A::Path)?,
                ino: g.u64(A::Ino)?,
                rdev: g.u64_ignored(A::Rdev),
                mode: g.u64_ignored(A::Mode),
            },
            CommandKind::Symlink => Command::Symlink {
                path: g.bytes(A::Path)?,
                ino: g.u64(A::Ino)?,
                path_link: g.bytes(A::PathLink)?,
            },
            CommandKind::Rename => Command::Rename {
                path: g.bytes(A::Path)?,
                path_to: g.bytes(A::PathTo)?,
            },
            CommandKind::Link => Command::Link {
                path: g.bytes(A::Path)?,
                path_link: g.bytes(A::PathLink)?,
            },
            CommandKind::Unlink => Command::Unlink {
                path: g.bytes(A::Path)?,
            },
            CommandKind::Rmdir => Command::Rmdir {
                path: g.bytes(A::Path)?,
            },
            CommandKind::SetXattr => Command::SetXattr {
                path: g.bytes(A::Path)?,
                name: g.bytes(A::XattrName)?,
                data: g.bytes(A::XattrData)?,
            },
            CommandKind::RemoveXattr => Command::RemoveXattr {
                path: g.bytes(A::Path)?,
                name: g.bytes(A::XattrName)?,
            },
            CommandKind::Write => Command::Write {
                path: g.bytes(A::Path)?,
                offset: g.u64(A::FileOffset)?,
                data: g.bytes(A::Data)?,
            },
            CommandKind::Clone => {
                let path = g.bytes(A::Path)?;
                let offset = g.u64(A::FileOffset)?;
                let len = g.u64(A::CloneLen)?;
                let clone_uuid = g.uuid(A::CloneUuid)?;
                let clone_ctransid = g.u64(A::CloneCtransid)?;
                let clone_path = g.bytes(A::ClonePath)?;
                let clone_offset = g.u64(A::CloneOffset)?;
                Command::Clone {
                    offset,
                    len,
                    path,
                    clone_uuid,
                    clone_ctransid,
                    clone_path,
                    clone_offset,
                }
            }
            CommandKind::Truncate => Command::Truncate {
                path: g.bytes(A::Path)?,
                size: g.u64(A::Size)?,
            },
            CommandKind::Chmod => Command::Chmod {
                path: g.bytes(A::Path)?,
                mode: g.u64(A::Mode)?,
            },
            CommandKind::Chown => Command::Chown {
                path: g.bytes(A::Path)?,
                uid: g.u64(A::Uid)?,
                gid: g.u64(A::Gid)?,
            },
            CommandKind::Utimes => Command::Utimes {
                path: g.bytes(A::Path)?,
                atime: g.timespec(A::Atime)?,
                mtime: g.timespec(A::Mtime)?,
                ctime: g.timespec(A::Ctime)?,
                otime: g.timespec_ignored(A::Otime),
            },
            CommandKind::End => Command::End,
            CommandKind::UpdateExtent => Command::UpdateExtent {
                path: g.bytes(A::Path)?,
                offset: g.u64(A::FileOffset)?,
                size: g.u64(A::Size)?,
            },
            CommandKind::Fallocate => Command::Fallocate {
                path: g.bytes(A::Path)?,
                mode: g.u32(A::FallocateMode)?,
                offset: g.u64(A::FileOffset)?,
                size: g.u64(A::Size)?,
            },
            CommandKind::Fileattr => Command::Fileattr {
                path: g.bytes(A::Path)?,
                attr: g.u64(A::Fileattr)?,
            },
            CommandKind::EncodedWrite => Command::EncodedWrite {
                path: g.bytes(A::Path)?,
                offset: g.u64(A::FileOffset)?,
                unencoded_file_len: g.u64(A::UnencodedFileLen)?,
                unencoded_len: g.u64(A::UnencodedLen)?,
                unencoded_offset: g.u64(A::UnencodedOffset)?,
                compression: g.u32_opt(A::Compression)?,
                encryption: g.u32_opt(A::Encryption)?,
                data: g.bytes(A::Data)?,
            },
            CommandKind::EnableVerity => Command::EnableVerity {
                path: g.bytes(A::Path)?,
                algorithm: g.u8(A::VerityAlgorithm)?,
                block_size: g.u32(A::VerityBlockSize)?,
                salt: g.bytes(A::VeritySaltData)?,
                sig: g.bytes(A::VeritySigData)?,
            },
        })
    }
}
