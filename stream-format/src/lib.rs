//! The btrfs send stream wire format: commands, attributes, encode, decode and
//! the `btrfs receive --dump` text format.
//!
//! Layout and numbers: Linux `fs/btrfs/send.h`, btrfs-progs
//! `common/send-stream.c`.
//!
//! * [`attr`] and [`command`]: the typed model ([`Attr`], [`CommandKind`],
//!   [`Command`]) with the kernel's attribute order and the receiver's
//!   requirements per command;
//! * [`StreamReader`]: validate and decode a stream from any `Read`, one command
//!   at a time ([`RawCommand`] or [`Command`]); [`BufStreamReader`] the same
//!   from a `BufRead`, splitting commands where its buffer holds them;
//! * [`StreamWriter`]: encode commands exactly as the kernel does;
//! * [`dump`](dump::dump): the text of `btrfs receive --dump` (btrfs-progs 6.2);
//! * [`verbose`]: the lines `btrfs receive -v` prints about the commands it
//!   applies.
//!
//! Protocol versions: the reader accepts headers with versions `0..=`
//! [`ReaderOptions::max_version`] (default 2 like btrfs-progs 6.2; set 3 for
//! ENABLE_VERITY streams), the writer writes 1, 2 or 3.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::as_conversions
)]

pub mod attr;
pub mod command;
mod decode;
pub mod dump;
mod encode;
mod error;
mod timespec;
pub mod verbose;

pub use attr::{Attr, AttrType};
pub use command::{Bytes, Command, CommandKind, CommandName, Timespec};
pub use decode::{
    BufStreamReader, Next, RawAttr, RawCommand, ReaderOptions, StreamReader, decode_payload,
};
pub use encode::{StreamWriter, WriterOptions, default_max_command_size};
pub use error::{AttrName, CommandInfo, DecodeError, DumpError, EncodeError};

/// The stream magic, `"btrfs-stream"` with its terminating NUL.
pub const STREAM_MAGIC: &[u8; 13] = b"btrfs-stream\0";
/// Magic of a btrsend continuation stream (a resumed send): the rest of a
/// stream after a resume point, which btrfs-progs refuses as a bad header.
pub const CONTINUATION_MAGIC: &[u8; 13] = b"btrsend-cont\0";

/// Size of the stream header: magic and a u32 version.
pub const STREAM_HEADER_SIZE: usize = 17;

/// Size of a command header: u32 length, u16 command, u32 crc.
pub const CMD_HEADER_SIZE: usize = 10;

/// The checksum btrfs puts in command headers: CRC-32C (Castagnoli) with seed 0
/// and no final inversion, unlike the standard CRC-32C.
pub fn btrfs_crc32c(data: &[u8]) -> u32 {
    let mut c = Crc::new();
    c.update(data);
    c.finish()
}

/// `name` as `(ino, gen, idx)` when it is exactly an orphan name
/// `o<ino>-<gen>-<idx>` as the kernel's `gen_unique_name` writes it
/// (decimal, no leading zeros): the name a send gives each new inode until
/// it has its own, and any inode it moves out of the way.
pub fn parse_orphan_name(name: &[u8]) -> Option<(u64, u64, u64)> {
    let rest = name.strip_prefix(b"o")?;
    let mut parts = rest.split(|&b| b == b'-');
    let mut num = || -> Option<u64> {
        let p = parts.next()?;
        let canonical = !p.is_empty()
            && p.iter().all(u8::is_ascii_digit)
            && (p.len() == 1 || p.first() != Some(&b'0'));
        canonical.then(|| std::str::from_utf8(p).ok()?.parse().ok())?
    };
    let t = (num()?, num()?, num()?);
    parts.next().is_none().then_some(t)
}

/// Incremental btrfs CRC-32C. `crc32c_append(c, d)` is `!raw(!c, d)`, so keeping
/// the inverted state gives the raw seed-0 CRC.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Crc(u32);

impl Crc {
    pub(crate) fn new() -> Crc {
        Crc(!0)
    }

    pub(crate) fn update(&mut self, data: &[u8]) {
        self.0 = crc32c::crc32c_append(self.0, data);
    }

    pub(crate) fn finish(self) -> u32 {
        !self.0
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn orphan_names_are_parsed_only_in_their_exact_shape() {
        use super::parse_orphan_name;
        assert_eq!(parse_orphan_name(b"o257-7-0"), Some((257, 7, 0)));
        assert_eq!(
            parse_orphan_name(b"o18446744073709551615-0-10"),
            Some((u64::MAX, 0, 10))
        );
        for other in [
            &b"o0257-7-0"[..],
            b"o257-07-0",
            b"o257-7-00",
            b"o257-7",
            b"o257-7-0-",
            b"o257-7-0-1",
            b"o-7-0",
            b"p257-7-0",
            b"o257-7-x",
            b"o18446744073709551616-0-0",
            b"o257--0",
            b"",
        ] {
            assert_eq!(
                parse_orphan_name(other),
                None,
                "{:?}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn crc_check_values() {
        assert_eq!(super::btrfs_crc32c(b"123456789"), 0x58e3_fa20);
        assert_eq!(
            super::btrfs_crc32c(&[0, 0, 0, 0, 0x15, 0, 0, 0, 0, 0]),
            0x9dc9_6c50
        );
    }
}
