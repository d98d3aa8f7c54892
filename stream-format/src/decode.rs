//! Reading send streams: [`StreamReader`] yields one command at a time, as a
//! [`RawCommand`] (number + attribute list) or a typed [`Command`].
//!
//! Validation follows btrfs-progs `common/send-stream.c` (`read_cmd`,
//! `read_and_process_cmd`, `btrfs_read_and_process_send_stream`) and
//! `cmds/receive.c` (concatenated streams):
//!
//! * a 17-byte header: magic `btrfs-stream\0`, version `<=`
//!   [`ReaderOptions::max_version`] (version 0 is read like version 1);
//! * per command: 10-byte header, payload, CRC-32C (seed 0, crc field zeroed);
//! * attributes in any order; a repeated type overwrites the earlier one (last
//!   wins); type 0 or above 35 is an error whatever the version; in a version ≥ 2
//!   stream DATA has no length and runs to the end of the command;
//! * unknown command numbers are not errors ([`Command::Unknown`]);
//! * required attributes and the exact sizes of integer, UUID and timespec
//!   attributes are checked when a typed [`Command`] is built, in the order
//!   btrfs-progs asks for them; attributes a command does not use are ignored;
//! * after END, end of input exactly at a stream header boundary is a clean end,
//!   otherwise another stream header is read. A stream without END is an error.
//!
//! Unlike btrfs-progs, a command whose length exceeds
//! [`ReaderOptions::max_command_len`] (default 16 MiB, far above the kernel's
//! 144 KiB) is rejected before anything is allocated for it.
//!
//! The reader reads exactly the bytes it needs and does no buffering of its own:
//! give it a `BufReader` (or an in-memory slice) for small reads to be cheap.
//! [`BufStreamReader`] reads from a `BufRead` and splits a command where its
//! buffer holds it, with no copy.

use std::io::{self, Read, Seek};

use crate::attr::Attr;
use crate::command::{Command, CommandKind};
use crate::error::{CommandInfo, DecodeError};
use crate::{CMD_HEADER_SIZE, CONTINUATION_MAGIC, Crc, STREAM_HEADER_SIZE, STREAM_MAGIC};

mod buffered;
mod payload;

pub use buffered::BufStreamReader;
pub use payload::decode_payload;

/// Limits and compatibility switches of a [`StreamReader`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReaderOptions {
    /// Largest stream version accepted. Default 2, like btrfs-progs 6.2 (a normal
    /// build), so that `dump` fails where `btrfs receive --dump` fails. Set 3 to
    /// accept streams of `CONFIG_BTRFS_EXPERIMENTAL` kernels (ENABLE_VERITY).
    pub max_version: u32,
    /// Largest command payload accepted, in bytes (excluding the 10-byte header).
    /// Default [`ReaderOptions::DEFAULT_MAX_COMMAND_LEN`] (16 MiB). btrfs-progs has
    /// no limit, but allocating what a corrupt length field asks for is wrong; the
    /// kernel never writes more than 192 KiB.
    pub max_command_len: u32,
    /// Accept continuation streams (a header with
    /// [`CONTINUATION_MAGIC`](crate::CONTINUATION_MAGIC), btrsend's resumed
    /// sends): their record is then [`StreamReader::continuation`]. Default
    /// off: such a header is a bad magic, as for btrfs-progs.
    pub continuation: bool,
    /// Check each command's CRC-32C (default on). Off only for bytes that
    /// never left the process that wrote them (btrsend indexes a stream it
    /// is writing from its own buffers): anything read from a file, a pipe
    /// or a peer is checked.
    pub check_crc: bool,
}

impl ReaderOptions {
    /// Default for [`ReaderOptions::max_command_len`]: 16 MiB.
    pub const DEFAULT_MAX_COMMAND_LEN: u32 = 16 << 20;

    /// The defaults: versions up to 2, commands up to 16 MiB.
    pub const fn new() -> ReaderOptions {
        ReaderOptions {
            max_version: 2,
            max_command_len: ReaderOptions::DEFAULT_MAX_COMMAND_LEN,
            continuation: false,
            check_crc: true,
        }
    }

    /// Set [`ReaderOptions::continuation`].
    pub const fn with_continuation(mut self, on: bool) -> ReaderOptions {
        self.continuation = on;
        self
    }

    /// Set [`ReaderOptions::max_version`].
    pub const fn with_max_version(mut self, version: u32) -> ReaderOptions {
        self.max_version = version;
        self
    }

    /// Set [`ReaderOptions::check_crc`].
    pub const fn with_crc_check(mut self, on: bool) -> ReaderOptions {
        self.check_crc = on;
        self
    }

    /// Set [`ReaderOptions::max_command_len`].
    pub const fn with_max_command_len(mut self, len: u32) -> ReaderOptions {
        self.max_command_len = len;
        self
    }
}

impl Default for ReaderOptions {
    fn default() -> ReaderOptions {
        ReaderOptions::new()
    }
}

/// One attribute of a [`RawCommand`]: its type and where its value is in the
/// payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawAttr {
    ty: u16,
    tlv_offset: usize,
    start: usize,
    len: usize,
}

impl RawAttr {
    /// The attribute type number (1..=35).
    pub fn ty(&self) -> u16 {
        self.ty
    }

    /// The attribute, if the number is known (always, for a reader-produced one).
    pub fn attr(&self) -> Option<Attr> {
        Attr::from_u16(self.ty)
    }

    /// Offset of the attribute's TLV header within the command payload.
    pub fn tlv_offset(&self) -> usize {
        self.tlv_offset
    }

    /// Offset of the value within the command payload.
    pub fn value_offset(&self) -> usize {
        self.start
    }

    /// Length of the value.
    pub fn value_len(&self) -> usize {
        self.len
    }
}

/// A command as the receiver sees it before interpreting it: number, payload and
/// the attributes in wire order (duplicates included).
#[derive(Debug, Clone, Copy)]
pub struct RawCommand<'a> {
    cmd: u16,
    payload: &'a [u8],
    attrs: &'a [RawAttr],
}

impl<'a> RawCommand<'a> {
    /// The command number.
    pub fn cmd(&self) -> u16 {
        self.cmd
    }

    /// The command, if its number is known.
    pub fn kind(&self) -> Option<CommandKind> {
        CommandKind::from_u16(self.cmd)
    }

    /// The whole payload (attribute bytes).
    pub fn payload(&self) -> &'a [u8] {
        self.payload
    }

    /// The attributes in wire order, duplicates included.
    pub fn raw_attrs(&self) -> &'a [RawAttr] {
        self.attrs
    }

    /// `(type, value)` of every attribute in wire order, duplicates included.
    pub fn attrs(&self) -> impl Iterator<Item = (u16, &'a [u8])> + 'a {
        let payload = self.payload;
        self.attrs.iter().map(move |a| (a.ty, value_of(payload, a)))
    }

    /// The value of `attr` as the receiver uses it: the last occurrence wins.
    #[inline]
    pub fn get(&self, attr: Attr) -> Option<&'a [u8]> {
        self.find(attr).map(|a| value_of(self.payload, a))
    }

    /// The last occurrence of `attr`.
    #[inline]
    pub fn find(&self, attr: Attr) -> Option<&'a RawAttr> {
        self.attrs.iter().rev().find(|a| a.ty == attr.number())
    }
}

#[inline]
fn value_of<'a>(payload: &'a [u8], a: &RawAttr) -> &'a [u8] {
    // The reader only builds attributes inside the payload; an empty slice is the
    // safe answer for a range that does not fit.
    a.start
        .checked_add(a.len)
        .and_then(|end| payload.get(a.start..end))
        .unwrap_or_default()
}

/// Why an attribute walk failed, before the command's location is attached.
enum AttrWalkError {
    InvalidType {
        tlv_offset: usize,
        ty: u16,
    },
    Truncated {
        tlv_offset: usize,
        needed: usize,
        available: usize,
    },
}

/// A command header's fields: the payload's length, the command's number
/// and the stored CRC.
fn header_fields(h: [u8; CMD_HEADER_SIZE]) -> (u32, u16, u32) {
    let [l0, l1, l2, l3, c0, c1, s0, s1, s2, s3] = h;
    (
        u32::from_le_bytes([l0, l1, l2, l3]),
        u16::from_le_bytes([c0, c1]),
        u32::from_le_bytes([s0, s1, s2, s3]),
    )
}

/// Command `info`'s payload split into its attributes (`attrs` is reused).
fn split<'a>(
    info: &CommandInfo,
    payload: &'a [u8],
    attrs: &'a mut Vec<RawAttr>,
) -> Result<RawCommand<'a>, DecodeError> {
    parse_attrs(payload, info.version, attrs).map_err(|e| attr_error(*info, e))?;
    Ok(RawCommand {
        cmd: info.cmd,
        payload,
        attrs,
    })
}

/// The typed form of what a reader's `next_raw` gave.
fn typed(
    next: Option<(CommandInfo, RawCommand<'_>)>,
) -> Result<Option<(CommandInfo, Command<'_>)>, DecodeError> {
    let Some((info, raw)) = next else {
        return Ok(None);
    };
    let cmd = Command::from_raw(&raw, &info)?;
    Ok(Some((info, cmd)))
}

/// Split a payload into attributes, like btrfs-progs `read_cmd()`.
fn parse_attrs(payload: &[u8], version: u32, out: &mut Vec<RawAttr>) -> Result<(), AttrWalkError> {
    out.clear();
    let end = payload.len();
    let mut pos = 0usize;
    while pos < end {
        let tlv_offset = pos;
        let available = end.saturating_sub(pos);
        let truncated = |needed: usize| AttrWalkError::Truncated {
            tlv_offset,
            needed,
            available,
        };
        let ty = read_u16(payload, pos).ok_or_else(|| truncated(2))?;
        if ty == 0 || ty > Attr::MAX {
            return Err(AttrWalkError::InvalidType { tlv_offset, ty });
        }
        pos = pos.saturating_add(2);
        let len = if version >= 2 && ty == Attr::Data.number() {
            end.saturating_sub(pos)
        } else {
            let len = read_u16(payload, pos).ok_or_else(|| truncated(4))?;
            pos = pos.saturating_add(2);
            usize::from(len)
        };
        let value_end = pos
            .checked_add(len)
            .filter(|&e| e <= end)
            .ok_or_else(|| truncated(pos.saturating_sub(tlv_offset).saturating_add(len)))?;
        out.push(RawAttr {
            ty,
            tlv_offset,
            start: pos,
            len,
        });
        pos = value_end;
    }
    Ok(())
}

fn read_u16(b: &[u8], at: usize) -> Option<u16> {
    let end = at.checked_add(2)?;
    let s: [u8; 2] = b.get(at..end)?.try_into().ok()?;
    Some(u16::from_le_bytes(s))
}

fn add_offset(pos: u64, n: usize) -> u64 {
    pos.saturating_add(u64::try_from(n).unwrap_or(u64::MAX))
}

/// Read until `buf` is full or the input ends; returns the bytes read.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0usize;
    while let Some(rest) = buf.get_mut(n..).filter(|r| !r.is_empty()) {
        match r.read(rest) {
            Ok(0) => break,
            Ok(k) => n = n.saturating_add(k.min(rest.len())),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A stream header is due (start, or after END).
    Header,
    /// Inside a stream.
    Commands,
    /// Clean end of input.
    Done,
    /// A fatal error happened.
    Failed,
}

/// Reads send-stream commands from any [`Read`], one at a time, in constant memory
/// (one reused buffer of at most [`ReaderOptions::max_command_len`] bytes).
///
/// ```
/// # fn main() -> Result<(), stream_format::DecodeError> {
/// use stream_format::{Command, StreamReader};
/// let stream: &[u8] = b"btrfs-stream\0\x01\0\0\0\0\0\0\0\x15\0\x50\x6c\xc9\x9d";
/// let mut reader = StreamReader::new(stream);
/// while let Some((info, cmd)) = reader.next_command()? {
///     assert_eq!(info.offset, 17);
///     assert_eq!(cmd, Command::End);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct StreamReader<R> {
    inner: R,
    options: ReaderOptions,
    buf: Vec<u8>,
    attrs: Vec<RawAttr>,
    pos: u64,
    index: u64,
    streams: u32,
    version: u32,
    state: State,
    /// The record of the current stream's continuation header, if it has
    /// one.
    cont: Option<Vec<u8>>,
}

impl<R: Read> StreamReader<R> {
    /// A reader with the default [`ReaderOptions`]. Nothing is read yet.
    pub fn new(inner: R) -> StreamReader<R> {
        StreamReader::with_options(inner, ReaderOptions::default())
    }

    /// A reader with the given options. Nothing is read yet.
    pub fn with_options(inner: R, options: ReaderOptions) -> StreamReader<R> {
        StreamReader {
            inner,
            options,
            buf: Vec::new(),
            attrs: Vec::new(),
            pos: 0,
            index: 0,
            streams: 0,
            version: 0,
            state: State::Header,
            cont: None,
        }
    }

    /// The record of the current stream's header when it is a
    /// continuation (see [`ReaderOptions::continuation`]): the bytes after
    /// the magic, the version and their 32-bit length.
    pub fn continuation(&self) -> Option<&[u8]> {
        self.cont.as_deref()
    }

    /// Bytes consumed so far: the offset of the next byte to read.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Version of the current stream, once its header has been read.
    pub fn version(&self) -> Option<u32> {
        (self.streams > 0).then_some(self.version)
    }

    /// Number of stream headers read so far.
    pub fn streams(&self) -> u32 {
        self.streams
    }

    /// Give back the inner reader.
    pub fn into_inner(self) -> R {
        self.inner
    }

    /// Take the buffer that holds the payload of the last command read and
    /// give the reader `buf` to read the next one into (its contents do not
    /// matter; its capacity is reused).
    ///
    /// A receiver that hands a WRITE's data to another thread takes the
    /// buffer instead of copying the data out of it, and finds the data in
    /// it by [`StreamReader::data_range`].
    pub fn swap_buffer(&mut self, buf: Vec<u8>) -> Vec<u8> {
        std::mem::replace(&mut self.buf, buf)
    }

    /// Where the DATA value of the last command read whole lies in its
    /// payload buffer (the one [`StreamReader::swap_buffer`] hands out):
    /// the occurrence [`Command`] uses (the last). `None` if it has no DATA,
    /// or the last command was skimmed.
    ///
    /// A receiver that hands the buffer to another thread names the data by
    /// this range, not by the address of the [`Command`]'s slice.
    pub fn data_range(&self) -> Option<std::ops::Range<usize>> {
        let a = self
            .attrs
            .iter()
            .rev()
            .find(|a| a.ty == Attr::Data.number())?;
        let end = a.start.checked_add(a.len)?;
        (end <= self.buf.len()).then_some(a.start..end)
    }

    /// The next command with its attributes split but not interpreted.
    ///
    /// Returns `Ok(None)` at a clean end: end of input right after an END command.
    ///
    /// # Errors
    ///
    /// A [`DecodeError`] naming the stream offset (and the command index once
    /// inside a command) for read errors, truncation, a bad magic, an unsupported
    /// version, an over-long command, a checksum mismatch or a bad attribute walk.
    /// After a [recoverable](DecodeError::is_recoverable) error the next call reads
    /// the following command; after any other error it returns
    /// [`DecodeError::Stopped`].
    pub fn next_raw(&mut self) -> Result<Option<(CommandInfo, RawCommand<'_>)>, DecodeError> {
        if !self.at_command()? {
            return Ok(None);
        }
        let (info, stored) = self.read_command_header()?;
        self.read_payload(info, stored)?;
        self.raw_after_payload(info)
    }

    /// Split the attributes of the payload just read.
    fn raw_after_payload(
        &mut self,
        info: CommandInfo,
    ) -> Result<Option<(CommandInfo, RawCommand<'_>)>, DecodeError> {
        let raw = split(&info, &self.buf, &mut self.attrs)?;
        if info.cmd == CommandKind::End.number() {
            self.state = State::Header;
        }
        Ok(Some((info, raw)))
    }

    /// The next command, interpreted (see [`Command::from_raw`]).
    ///
    /// Returns `Ok(None)` at a clean end: end of input right after an END command.
    ///
    /// # Errors
    ///
    /// Everything [`StreamReader::next_raw`] reports, plus a missing required
    /// attribute or a wrong-sized integer, UUID or timespec attribute (both
    /// recoverable).
    pub fn next_command(&mut self) -> Result<Option<(CommandInfo, Command<'_>)>, DecodeError> {
        typed(self.next_raw()?)
    }

    fn fail(&mut self, e: DecodeError) -> DecodeError {
        self.state = State::Failed;
        e
    }

    fn read_into_header(&mut self, buf: &mut [u8]) -> Result<usize, DecodeError> {
        let offset = self.pos;
        match read_full(&mut self.inner, buf) {
            Ok(n) => {
                self.pos = add_offset(self.pos, n);
                Ok(n)
            }
            Err(source) => Err(self.fail(DecodeError::Io {
                offset,
                error: source,
            })),
        }
    }

    /// Whether a command may follow (reading the stream header first if
    /// it is still to come): `false` when the input is done, the
    /// [`DecodeError::Stopped`] error after a fatal one. A reader that
    /// needs a stream's header before its first command
    /// ([`StreamReader::continuation`]) calls this first.
    ///
    /// # Errors
    ///
    /// As [`StreamReader::next_raw`] for the stream header.
    pub fn at_command(&mut self) -> Result<bool, DecodeError> {
        match self.state {
            State::Done => Ok(false),
            State::Failed => Err(DecodeError::Stopped { offset: self.pos }),
            State::Header => self.read_stream_header(),
            State::Commands => Ok(true),
        }
    }

    fn read_stream_header(&mut self) -> Result<bool, DecodeError> {
        let offset = self.pos;
        let mut h = [0u8; STREAM_HEADER_SIZE];
        let n = self.read_into_header(&mut h)?;
        if n == 0 {
            if self.streams == 0 {
                return Err(self.fail(DecodeError::Empty));
            }
            self.state = State::Done;
            return Ok(false);
        }
        if n < STREAM_HEADER_SIZE {
            return Err(self.fail(DecodeError::TruncatedStreamHeader {
                offset,
                available: n,
            }));
        }
        let (magic, version) = h.split_at(STREAM_MAGIC.len());
        self.cont = None;
        if self.options.continuation && magic == CONTINUATION_MAGIC {
            self.read_continuation(offset)?;
        } else if magic != STREAM_MAGIC {
            let mut found = [0u8; 13];
            found.copy_from_slice(magic);
            return Err(self.fail(DecodeError::BadMagic { offset, found }));
        }
        let version = u32::from_le_bytes(version.try_into().unwrap_or_default());
        if version > self.options.max_version {
            return Err(self.fail(DecodeError::UnsupportedVersion {
                offset,
                version,
                max: self.options.max_version,
            }));
        }
        self.version = version;
        self.streams = self.streams.saturating_add(1);
        self.state = State::Commands;
        Ok(true)
    }

    /// The record after a continuation header's magic and version: a
    /// 32-bit length (at most 4096) and that many bytes.
    fn read_continuation(&mut self, offset: u64) -> Result<(), DecodeError> {
        let mut l = [0u8; 4];
        let n = self.read_into_header(&mut l)?;
        let len = u32::from_le_bytes(l);
        if n < 4 || len > 4096 {
            return Err(self.fail(DecodeError::TruncatedStreamHeader {
                offset,
                available: STREAM_HEADER_SIZE.saturating_add(n),
            }));
        }
        let mut rec = vec![0u8; usize::try_from(len).unwrap_or(0)];
        let got = self.read_into_header(&mut rec)?;
        if got < rec.len() {
            return Err(self.fail(DecodeError::TruncatedStreamHeader {
                offset,
                available: STREAM_HEADER_SIZE.saturating_add(4).saturating_add(got),
            }));
        }
        self.cont = Some(rec);
        Ok(())
    }

    /// Read one command header; returns it and its stored CRC.
    fn read_command_header(&mut self) -> Result<(CommandInfo, u32), DecodeError> {
        let offset = self.pos;
        let mut h = [0u8; CMD_HEADER_SIZE];
        let n = self.read_into_header(&mut h)?;
        if n < CMD_HEADER_SIZE {
            return Err(self.fail(DecodeError::TruncatedCommandHeader {
                index: self.index,
                offset,
                available: n,
            }));
        }
        let (len, cmd, stored) = header_fields(h);
        let info = CommandInfo {
            offset,
            index: self.index,
            cmd,
            len,
            stream: self.streams.saturating_sub(1),
            version: self.version,
        };
        if info.len > self.options.max_command_len {
            return Err(self.fail(DecodeError::CommandTooLong {
                cmd: info,
                max: self.options.max_command_len,
            }));
        }
        Ok((info, stored))
    }

    /// Read the next `n` bytes of command `info`'s payload into `self.buf`
    /// (its whole length): an I/O error or fewer bytes fail the stream.
    fn read_buf(&mut self, info: CommandInfo, n: usize) -> Result<(), DecodeError> {
        // Not cleared first: the bytes already there are overwritten by the
        // read (or, if it comes short, never looked at), so a reused buffer
        // is not zeroed again.
        self.buf.resize(n, 0);
        let got = match read_full(&mut self.inner, &mut self.buf) {
            Ok(n) => n,
            Err(source) => {
                let offset = self.pos;
                return Err(self.fail(DecodeError::Io {
                    offset,
                    error: source,
                }));
            }
        };
        self.pos = add_offset(self.pos, got);
        if got < n {
            return Err(self.fail(DecodeError::TruncatedCommand {
                cmd: info,
                available: got,
            }));
        }
        Ok(())
    }

    /// Read the payload of the command whose header was just read into
    /// `self.buf` and check its CRC.
    fn read_payload(&mut self, info: CommandInfo, stored: u32) -> Result<(), DecodeError> {
        let len = usize::try_from(info.len).unwrap_or(usize::MAX);
        self.read_buf(info, len)?;
        self.index = self.index.saturating_add(1);
        if !self.options.check_crc {
            return Ok(());
        }
        check_crc(&info, stored, &self.buf)
    }
}

/// One step of [`StreamReader::next_skimmed`].
#[derive(Debug)]
pub enum Next<'a> {
    /// A command read whole and checked, as [`StreamReader::next_command`]
    /// gives it.
    Command(CommandInfo, Command<'a>),
    /// A command of which only the first bytes of the payload were read:
    /// neither its CRC nor its attributes are checked yet (see
    /// [`decode_payload`]).
    Skimmed {
        /// The command's header.
        info: CommandInfo,
        /// Its stored CRC.
        crc: u32,
        /// The first bytes of its payload (as many as asked for, at most
        /// the payload).
        prefix: &'a [u8],
    },
}

impl<R: Read + Seek> StreamReader<R> {
    /// Like [`StreamReader::next_command`], but a command for which `skim`
    /// returns `Some(n)` is skimmed: only the first `n` bytes of its payload
    /// are read and the rest is skipped (seeked over, not read). Its reader
    /// (another thread, a later `pread` of the input) checks it with
    /// [`decode_payload`]. Skipping past the end of the input is not noticed
    /// here (the next header read finds the end): `skim` should ask only
    /// for commands that lie within the input.
    ///
    /// # Errors
    ///
    /// As [`StreamReader::next_command`]; for a skimmed command, a read or
    /// seek error and a prefix cut short by the end of the input.
    pub fn next_skimmed(
        &mut self,
        skim: impl FnOnce(&CommandInfo) -> Option<usize>,
    ) -> Result<Option<Next<'_>>, DecodeError> {
        if !self.at_command()? {
            return Ok(None);
        }
        let (info, stored) = self.read_command_header()?;
        let len = usize::try_from(info.len).unwrap_or(usize::MAX);
        let Some(want) = skim(&info).filter(|_| info.cmd != CommandKind::End.number()) else {
            self.read_payload(info, stored)?;
            let Some((info, raw)) = self.raw_after_payload(info)? else {
                return Ok(None);
            };
            let cmd = Command::from_raw(&raw, &info)?;
            return Ok(Some(Next::Command(info, cmd)));
        };
        let n = want.min(len);
        // Its attributes are not split: none of the last command's remain.
        self.attrs.clear();
        self.read_buf(info, n)?;
        // `n <= len`.
        let rest = len.saturating_sub(n);
        let skip = i64::try_from(rest).unwrap_or(i64::MAX);
        if let Err(source) = self.inner.seek_relative(skip) {
            let offset = self.pos;
            return Err(self.fail(DecodeError::Io {
                offset,
                error: source,
            }));
        }
        self.pos = add_offset(self.pos, rest);
        self.index = self.index.saturating_add(1);
        Ok(Some(Next::Skimmed {
            info,
            crc: stored,
            prefix: &self.buf,
        }))
    }
}

/// Check the CRC of a command (header `info` with stored CRC `stored`,
/// payload `payload`).
fn check_crc(info: &CommandInfo, stored: u32, payload: &[u8]) -> Result<(), DecodeError> {
    let mut crc = Crc::new();
    let mut h = [0u8; CMD_HEADER_SIZE];
    let (l, rest) = h.split_at_mut(4);
    l.copy_from_slice(&info.len.to_le_bytes());
    if let Some(c) = rest.get_mut(..2) {
        c.copy_from_slice(&info.cmd.to_le_bytes());
    }
    crc.update(&h);
    crc.update(payload);
    let computed = crc.finish();
    if computed != stored {
        return Err(DecodeError::CrcMismatch {
            cmd: *info,
            stored,
            computed,
        });
    }
    Ok(())
}

fn attr_error(info: CommandInfo, e: AttrWalkError) -> DecodeError {
    let cmd_start = add_offset(info.offset, CMD_HEADER_SIZE);
    match e {
        AttrWalkError::InvalidType { tlv_offset, ty } => DecodeError::InvalidAttrType {
            cmd: info,
            attr_offset: add_offset(cmd_start, tlv_offset),
            attr_type: ty,
        },
        AttrWalkError::Truncated {
            tlv_offset,
            needed,
            available,
        } => DecodeError::TruncatedAttr {
            cmd: info,
            attr_offset: add_offset(cmd_start, tlv_offset),
            needed,
            available,
        },
    }
}

#[cfg(test)]
mod tests;
