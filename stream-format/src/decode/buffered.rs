//! [`BufStreamReader`]: a [`StreamReader`] over a [`BufRead`] that splits a
//! command where the reader buffered it, without copying it out.
//!
//! A stream of many small files is millions of commands of a few dozen
//! bytes each, and reading each with two reads (header, payload) into the
//! reader's own buffer cost a fifth of decoding them. Here a command lying
//! whole in the inner reader's buffer is checked and split there; it is
//! consumed from that buffer when the next command is asked for. Anything
//! else (a stream header, a command across the buffer's end, one too long)
//! goes through the [`StreamReader`], with its checks and errors.

use std::io::BufRead;

use super::{
    RawCommand, ReaderOptions, State, StreamReader, add_offset, check_crc, header_fields, split,
    typed,
};
use crate::CMD_HEADER_SIZE;
use crate::command::{Command, CommandKind};
use crate::error::{CommandInfo, DecodeError};

/// Reads send-stream commands from a [`BufRead`]: what
/// [`StreamReader::next_raw`] and [`StreamReader::next_command`] give, with
/// the same checks and errors, but a command the inner reader holds whole in
/// its buffer is not copied (see the module docs).
///
/// ```
/// # fn main() -> Result<(), stream_format::DecodeError> {
/// use stream_format::{BufStreamReader, Command};
/// let stream: &[u8] = b"btrfs-stream\0\x01\0\0\0\0\0\0\0\x15\0\x50\x6c\xc9\x9d";
/// let mut reader = BufStreamReader::new(stream);
/// while let Some((info, cmd)) = reader.next_command()? {
///     assert_eq!(info.offset, 17);
///     assert_eq!(cmd, Command::End);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct BufStreamReader<R> {
    reader: StreamReader<R>,
    /// Bytes of the last command, split in the inner reader's buffer and
    /// not consumed from it yet.
    unread: usize,
}

impl<R: BufRead> BufStreamReader<R> {
    /// A reader with the default [`ReaderOptions`]. Nothing is read yet.
    pub fn new(inner: R) -> BufStreamReader<R> {
        BufStreamReader::with_options(inner, ReaderOptions::default())
    }

    /// A reader with the given options. Nothing is read yet.
    pub fn with_options(inner: R, options: ReaderOptions) -> BufStreamReader<R> {
        BufStreamReader {
            reader: StreamReader::with_options(inner, options),
            unread: 0,
        }
    }

    /// Bytes consumed so far: the offset of the next byte to read.
    pub fn position(&self) -> u64 {
        self.reader.position()
    }

    /// Give back the inner reader, at the byte after the last command read.
    pub fn into_inner(mut self) -> R {
        self.settle();
        self.reader.into_inner()
    }

    /// Consume the last command from the inner reader's buffer.
    fn settle(&mut self) {
        let n = std::mem::take(&mut self.unread);
        if n > 0 {
            self.reader.inner.consume(n);
        }
    }

    /// The length, number and stored CRC of the next command, and where it
    /// ends, when the inner reader holds it whole, within the length limit
    /// (otherwise `None`: the [`StreamReader`] reads it).
    fn whole_in_buffer(&mut self) -> Option<(u32, u16, u32, usize)> {
        let buf = self.reader.inner.fill_buf().ok()?;
        let h: [u8; CMD_HEADER_SIZE] = buf.get(..CMD_HEADER_SIZE)?.try_into().ok()?;
        let (len, cmd, stored) = header_fields(h);
        if len > self.reader.options.max_command_len {
            return None;
        }
        let end = CMD_HEADER_SIZE.checked_add(usize::try_from(len).ok()?)?;
        (buf.len() >= end).then_some((len, cmd, stored, end))
    }

    /// As [`StreamReader::next_raw`].
    ///
    /// # Errors
    ///
    /// As [`StreamReader::next_raw`].
    pub fn next_raw(&mut self) -> Result<Option<(CommandInfo, RawCommand<'_>)>, DecodeError> {
        self.settle();
        if self.reader.state != State::Commands {
            return self.reader.next_raw();
        }
        let Some((len, cmd, stored, end)) = self.whole_in_buffer() else {
            return self.reader.next_raw();
        };
        let r = &mut self.reader;
        let info = CommandInfo {
            offset: r.pos,
            index: r.index,
            cmd,
            len,
            stream: r.streams.saturating_sub(1),
            version: r.version,
        };
        let buf = r.inner.fill_buf().map_err(|error| DecodeError::Io {
            offset: info.offset,
            error,
        })?;
        // A reader's buffer stays as it is until it is consumed from.
        let Some(payload) = buf.get(CMD_HEADER_SIZE..end) else {
            return Err(DecodeError::Io {
                offset: info.offset,
                error: std::io::Error::other("the reader's buffer shrank"),
            });
        };
        // The command is read, whatever its checks find: the next call
        // reads the one after (the errors below are recoverable, as the
        // `StreamReader`'s are).
        self.unread = end;
        r.pos = add_offset(r.pos, end);
        r.index = r.index.saturating_add(1);
        if r.options.check_crc {
            check_crc(&info, stored, payload)?;
        }
        let raw = split(&info, payload, &mut r.attrs)?;
        if cmd == CommandKind::End.number() {
            r.state = State::Header;
        }
        Ok(Some((info, raw)))
    }

    /// As [`StreamReader::next_command`].
    ///
    /// # Errors
    ///
    /// As [`StreamReader::next_command`].
    pub fn next_command(&mut self) -> Result<Option<(CommandInfo, Command<'_>)>, DecodeError> {
        typed(self.next_raw()?)
    }
}
