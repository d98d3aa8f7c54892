//! Errors of the reader ([`DecodeError`]), the writer ([`EncodeError`]) and the
//! dumper ([`DumpError`]).
//!
//! Every decode error says where: the byte offset in the input and, once inside a
//! command, the command's index and name (btrfs-progs reports neither). Wording
//! follows btrfs-progs where it has a message (`crc32 mismatch in command`,
//! `attribute 7 requested but not present`, …).

use std::fmt;
use std::io;

use crate::attr::{Attr, attr_name};
use crate::command::{CommandKind, CommandName};

/// Where a command sits in the input; returned with every command and carried by
/// every error about a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CommandInfo {
    /// Byte offset of the command's 10-byte header from the start of the input.
    pub offset: u64,
    /// 0-based index of the command in the input, counted across concatenated
    /// streams.
    pub index: u64,
    /// The command number from the header.
    pub cmd: u16,
    /// Payload length from the header (excludes the 10-byte header).
    pub len: u32,
    /// 0-based index of the stream (header) the command belongs to.
    pub stream: u32,
    /// Protocol version of that stream.
    pub version: u32,
}

impl fmt::Display for CommandInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "command {} ({}) at stream offset {}",
            self.index,
            CommandName(self.cmd),
            self.offset
        )
    }
}

/// An attribute number with its name, for messages: `7 (GID)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttrName(pub u16);

impl fmt::Display for AttrName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.0, attr_name(self.0))
    }
}

/// The input is not a valid send stream, or could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Reading the input failed.
    #[error("read error at stream offset {offset}: {error}")]
    Io {
        /// Offset of the first byte that could not be read.
        offset: u64,
        /// The underlying error (part of the message, not a `source()`).
        error: io::Error,
    },
    /// The input is empty (btrfs-progs: `empty stream is not considered valid`).
    #[error("empty stream: no stream header at offset 0")]
    Empty,
    /// The input ends inside a 17-byte stream header.
    #[error(
        "stream truncated in stream header at offset {offset}: needed 17 bytes, {available} available"
    )]
    TruncatedStreamHeader {
        /// Offset of the stream header.
        offset: u64,
        /// Bytes that were there.
        available: usize,
    },
    /// The magic is not `btrfs-stream\0` (btrfs-progs: `unexpected header`).
    #[error("unexpected header at stream offset {offset}: magic is {found:?}, expected \"btrfs-stream\\0\"", found = String::from_utf8_lossy(found))]
    BadMagic {
        /// Offset of the stream header.
        offset: u64,
        /// The 13 bytes found.
        found: [u8; 13],
    },
    /// The header's version is larger than the reader accepts.
    #[error(
        "stream version {version} not supported at stream offset {offset}: this reader accepts versions up to {max}"
    )]
    UnsupportedVersion {
        /// Offset of the stream header.
        offset: u64,
        /// Version in the header.
        version: u32,
        /// Largest accepted version ([`crate::ReaderOptions::max_version`]).
        max: u32,
    },
    /// The input ends where a 10-byte command header should be (btrfs-progs:
    /// `unexpected EOF in stream` when nothing is left, `short read` otherwise).
    #[error(
        "stream truncated before command {index} at stream offset {offset}: needed 10 bytes of command header, {available} available (a stream must end with END)"
    )]
    TruncatedCommandHeader {
        /// Index the command would have had.
        index: u64,
        /// Offset of the (partial) header.
        offset: u64,
        /// Bytes that were there.
        available: usize,
    },
    /// A command's length exceeds [`crate::ReaderOptions::max_command_len`].
    #[error("{cmd} has a payload of {} bytes, more than the {max} bytes this reader accepts", cmd.len)]
    CommandTooLong {
        /// The command.
        cmd: CommandInfo,
        /// The limit.
        max: u32,
    },
    /// The input ends inside a command's payload.
    #[error("stream truncated in {cmd}: needed {} bytes of payload, {available} available", cmd.len)]
    TruncatedCommand {
        /// The command.
        cmd: CommandInfo,
        /// Payload bytes that were there.
        available: usize,
    },
    /// The stored checksum does not match.
    #[error("crc32 mismatch in {cmd}: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch {
        /// The command.
        cmd: CommandInfo,
        /// Checksum in the header.
        stored: u32,
        /// Checksum of the bytes.
        computed: u32,
    },
    /// An attribute type is 0 or above [`Attr::MAX`] (btrfs-progs: `invalid tlv in
    /// cmd tlv_type = N`).
    #[error("invalid attribute type {attr_type} at stream offset {attr_offset} in {cmd}")]
    InvalidAttrType {
        /// The command.
        cmd: CommandInfo,
        /// Offset of the attribute.
        attr_offset: u64,
        /// The type found.
        attr_type: u16,
    },
    /// An attribute runs past the end of its command (btrfs-progs: `send stream is
    /// truncated`).
    #[error(
        "attribute truncated at stream offset {attr_offset} in {cmd}: needed {needed} bytes, {available} left in the command"
    )]
    TruncatedAttr {
        /// The command.
        cmd: CommandInfo,
        /// Offset of the attribute.
        attr_offset: u64,
        /// Bytes the attribute needs from its offset.
        needed: usize,
        /// Bytes left in the command from that offset.
        available: usize,
    },
    /// A required attribute is absent.
    #[error("attribute {} requested but not present in {cmd}", AttrName(attr.number()))]
    MissingAttr {
        /// The command.
        cmd: CommandInfo,
        /// The attribute.
        attr: Attr,
    },
    /// An integer, UUID or timespec attribute has the wrong size.
    #[error(
        "invalid size for attribute {} at stream offset {attr_offset} in {cmd}: expected {expected}, got {got}",
        AttrName(attr.number())
    )]
    AttrSize {
        /// The command.
        cmd: CommandInfo,
        /// The attribute.
        attr: Attr,
        /// Offset of the attribute.
        attr_offset: u64,
        /// Required size.
        expected: usize,
        /// Size found.
        got: usize,
    },
    /// The reader was used again after an error it cannot continue from.
    #[error("reader stopped at stream offset {offset} after an earlier error")]
    Stopped {
        /// Offset where the reader stopped.
        offset: u64,
    },
}

impl DecodeError {
    /// The stream offset the error is about (the command's offset for errors inside
    /// a command).
    pub fn offset(&self) -> u64 {
        match self {
            DecodeError::Empty => 0,
            DecodeError::Io { offset, .. }
            | DecodeError::TruncatedStreamHeader { offset, .. }
            | DecodeError::BadMagic { offset, .. }
            | DecodeError::UnsupportedVersion { offset, .. }
            | DecodeError::TruncatedCommandHeader { offset, .. }
            | DecodeError::Stopped { offset } => *offset,
            DecodeError::CommandTooLong { cmd, .. }
            | DecodeError::TruncatedCommand { cmd, .. }
            | DecodeError::CrcMismatch { cmd, .. }
            | DecodeError::InvalidAttrType { cmd, .. }
            | DecodeError::TruncatedAttr { cmd, .. }
            | DecodeError::MissingAttr { cmd, .. }
            | DecodeError::AttrSize { cmd, .. } => cmd.offset,
        }
    }

    /// The command the error is about, if it is inside one.
    pub fn command(&self) -> Option<&CommandInfo> {
        match self {
            DecodeError::CommandTooLong { cmd, .. }
            | DecodeError::TruncatedCommand { cmd, .. }
            | DecodeError::CrcMismatch { cmd, .. }
            | DecodeError::InvalidAttrType { cmd, .. }
            | DecodeError::TruncatedAttr { cmd, .. }
            | DecodeError::MissingAttr { cmd, .. }
            | DecodeError::AttrSize { cmd, .. } => Some(cmd),
            _ => None,
        }
    }

    /// Whether the reader can go on with the next command after this error: true
    /// when the whole bad command was consumed (checksum and attribute errors), as
    /// `btrfs receive -E 0` goes on.
    pub fn is_recoverable(&self) -> bool {
        matches!(
            self,
            DecodeError::CrcMismatch { .. }
                | DecodeError::InvalidAttrType { .. }
                | DecodeError::TruncatedAttr { .. }
                | DecodeError::MissingAttr { .. }
                | DecodeError::AttrSize { .. }
        )
    }
}

/// A command cannot be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// Writing the output failed.
    #[error("write error at stream offset {offset}: {error}")]
    Io {
        /// Offset of the command or header being written.
        offset: u64,
        /// The underlying error (part of the message, not a `source()`).
        error: io::Error,
    },
    /// Only versions 1, 2 and 3 exist.
    #[error("cannot write send stream version {0}: only versions 1, 2 and 3 exist")]
    UnsupportedVersion(u32),
    /// The command does not exist in the stream's version.
    #[error("command {cmd} needs stream version {}, the stream is version {version}", cmd.since_version())]
    CommandNotInVersion {
        /// The command.
        cmd: CommandKind,
        /// The stream's version.
        version: u32,
    },
    /// The attribute does not exist in (or is not sent in) the stream's version.
    #[error(
        "attribute {attr} of command {cmd} needs stream version {needed}, the stream is version {version}"
    )]
    AttrNotInVersion {
        /// The command.
        cmd: CommandKind,
        /// The attribute.
        attr: Attr,
        /// Version that has it.
        needed: u32,
        /// The stream's version.
        version: u32,
    },
    /// A value does not fit a TLV's 16-bit length.
    #[error("attribute {attr} of command {cmd} is {len} bytes, more than the 65535 a TLV can hold")]
    AttrTooLong {
        /// The command.
        cmd: CommandName,
        /// The attribute.
        attr: Attr,
        /// Its length.
        len: usize,
    },
    /// The command is larger than the maximum command size.
    #[error(
        "command {cmd} would be {size} bytes including its header, more than the maximum {max} of this stream"
    )]
    CommandTooLarge {
        /// The command.
        cmd: CommandName,
        /// Its size including the 10-byte header.
        size: u64,
        /// The maximum ([`crate::WriterOptions::max_command_size`]).
        max: u32,
    },
}

/// `dump` failed: a bad stream, an unprintable command, or the output.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DumpError {
    /// The stream is invalid or could not be read.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// Writing the text failed (e.g. a closed pipe: check
    /// `io::ErrorKind::BrokenPipe`).
    #[error("cannot write the dump: {0}")]
    Output(io::Error),
    /// Joining the subvolume path and a path reaches `PATH_MAX` (btrfs-progs:
    /// `path invalid`).
    #[error("path invalid in {cmd}: joined path would reach PATH_MAX (4096 bytes)")]
    PathTooLong {
        /// The command.
        cmd: CommandInfo,
    },
    /// A timestamp has no local-time representation (btrfs-progs: `failed to
    /// convert time`).
    #[error("failed to convert time {sec} in {cmd} to local time")]
    Time {
        /// The command.
        cmd: CommandInfo,
        /// The seconds value.
        sec: i64,
    },
}

impl DumpError {
    /// The stream offset the error is about, if it is about the stream.
    pub fn offset(&self) -> Option<u64> {
        match self {
            DumpError::Decode(e) => Some(e.offset()),
            DumpError::Output(_) => None,
            DumpError::PathTooLong { cmd } | DumpError::Time { cmd, .. } => Some(cmd.offset),
        }
    }
}
