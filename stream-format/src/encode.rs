//! Writing send streams: [`StreamWriter`] turns [`Command`]s into the bytes the
//! kernel would send.
//!
//! Producer rules from Linux `fs/btrfs/send.c` (`send_header`, `begin_cmd`,
//! `send_cmd`, `tlv_put`, `put_data_header`, `proto_cmd_ok`):
//!
//! * attributes in the kernel's order (the order of [`Command`]'s fields);
//! * every value fits a 16-bit TLV length, except DATA in version ≥ 2, which is
//!   written as its type only and is always last;
//! * the command (10-byte header included) must fit the kernel's send buffer,
//!   [`WriterOptions::max_command_size`]: 65536 bytes for v1, 147456 for v2/v3
//!   (4 KiB pages). Nothing is ever split or truncated: a command that does not fit
//!   is an error, and so is a command or attribute the stream's version lacks;
//! * CRC-32C with seed 0 and no final inversion over the header (crc field 0) and
//!   the payload, computed incrementally so file data is never copied.

use std::io::Write;

use crate::attr::Attr;
use crate::command::{Command, CommandName, Value};
use crate::decode::RawCommand;
use crate::error::EncodeError;
use crate::{CMD_HEADER_SIZE, Crc, STREAM_MAGIC};

/// Default maximum command size (10-byte header included) for `version`: the
/// kernel's send buffer, `BTRFS_SEND_BUF_SIZE_V1` = 65536 for v1 and
/// `BTRFS_SEND_BUF_SIZE_V2` = 147456 (with 4 KiB pages) for v2 and v3.
pub const fn default_max_command_size(version: u32) -> u32 {
    if version <= 1 { 65536 } else { 147456 }
}

/// How a [`StreamWriter`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriterOptions {
    /// Protocol version: 1, 2 or 3.
    pub version: u32,
    /// Largest command accepted, 10-byte header included; default
    /// [`default_max_command_size`].
    pub max_command_size: u32,
    /// Write the 17-byte stream header first (default). Off for the second and
    /// later subvolumes of a `btrfs send -e` style stream (the kernel's
    /// `BTRFS_SEND_FLAG_OMIT_STREAM_HEADER`).
    pub write_header: bool,
}

impl WriterOptions {
    /// Defaults for `version`.
    pub const fn new(version: u32) -> WriterOptions {
        WriterOptions {
            version,
            max_command_size: default_max_command_size(version),
            write_header: true,
        }
    }

    /// Set [`WriterOptions::max_command_size`] (e.g. 196608 to match a kernel with
    /// 64 KiB pages).
    pub const fn with_max_command_size(mut self, size: u32) -> WriterOptions {
        self.max_command_size = size;
        self
    }

    /// Do not write the stream header ([`WriterOptions::write_header`]).
    pub const fn without_header(mut self) -> WriterOptions {
        self.write_header = false;
        self
    }
}

/// Writes a send stream to any [`Write`].
///
/// The writer never buffers: give it a `BufWriter` for small commands to be cheap
/// (large data is passed through from the caller's slice).
///
/// To write a multi-subvolume stream like `btrfs send -e`, write each subvolume's
/// commands (starting with SUBVOL or SNAPSHOT) into the same writer and call
/// [`StreamWriter::finish`] once; or, across writers, use
/// [`WriterOptions::without_header`] for all but the first and
/// [`StreamWriter::into_inner`] (no END) for all but the last.
///
/// ```
/// # fn main() -> Result<(), stream_format::EncodeError> {
/// use std::borrow::Cow;
/// use stream_format::{Command, StreamWriter};
/// let mut w = StreamWriter::new(Vec::new(), 2)?;
/// let data = vec![7u8; 1000];
/// w.write(&Command::Write { path: Cow::Borrowed(b"f"), offset: 0, data: Cow::Borrowed(&data) })?;
/// let bytes = w.finish()?;
/// assert_eq!(&bytes[bytes.len() - 10..], &[0, 0, 0, 0, 0x15, 0, 0x50, 0x6c, 0xc9, 0x9d]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct StreamWriter<W: Write> {
    inner: W,
    options: WriterOptions,
    scratch: Vec<u8>,
    pos: u64,
}

impl<W: Write> StreamWriter<W> {
    /// Start a stream of `version` (1, 2 or 3) with default options; writes the
    /// stream header.
    ///
    /// # Errors
    ///
    /// [`EncodeError::UnsupportedVersion`], or [`EncodeError::Io`] if the header
    /// cannot be written.
    pub fn new(inner: W, version: u32) -> Result<StreamWriter<W>, EncodeError> {
        StreamWriter::with_options(inner, WriterOptions::new(version))
    }

    /// Start a stream with the given options; writes the stream header unless
    /// [`WriterOptions::write_header`] is off.
    ///
    /// # Errors
    ///
    /// [`EncodeError::UnsupportedVersion`], or [`EncodeError::Io`] if the header
    /// cannot be written.
    pub fn with_options(inner: W, options: WriterOptions) -> Result<StreamWriter<W>, EncodeError> {
        if !(1..=3).contains(&options.version) {
            return Err(EncodeError::UnsupportedVersion(options.version));
        }
        let mut w = StreamWriter {
            inner,
            options,
            scratch: Vec::with_capacity(512),
            pos: 0,
        };
        if options.write_header {
            let mut h = [0u8; crate::STREAM_HEADER_SIZE];
            let (m, v) = h.split_at_mut(STREAM_MAGIC.len());
            m.copy_from_slice(STREAM_MAGIC);
            v.copy_from_slice(&options.version.to_le_bytes());
            w.put(&h, &[])?;
        }
        Ok(w)
    }

    /// The stream's protocol version.
    pub fn version(&self) -> u32 {
        self.options.version
    }

    /// Bytes written so far (stream header included).
    pub fn bytes_written(&self) -> u64 {
        self.pos
    }

    /// A reference to the inner writer.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// A mutable reference to the inner writer (what is written through it
    /// is not counted by [`StreamWriter::bytes_written`]).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// Write one command.
    ///
    /// [`Command::Unknown`] is written verbatim (its number and payload), like
    /// [`StreamWriter::write_raw`].
    ///
    /// # Errors
    ///
    /// [`EncodeError::CommandNotInVersion`] / [`EncodeError::AttrNotInVersion`] for
    /// a command or attribute the stream's version does not have (OTIME counts as
    /// v2: the kernel sends it only from v2 on), [`EncodeError::AttrTooLong`] for a
    /// value over 65535 bytes (except v2+ DATA), [`EncodeError::CommandTooLarge`],
    /// or [`EncodeError::Io`]. Nothing is written when an error other than `Io` is
    /// returned.
    pub fn write(&mut self, cmd: &Command<'_>) -> Result<(), EncodeError> {
        let Some(kind) = cmd.kind() else {
            return match cmd {
                Command::Unknown { cmd, payload } => self.write_payload(*cmd, payload),
                _ => Ok(()),
            };
        };
        let version = self.options.version;
        if kind.since_version() > version {
            return Err(EncodeError::CommandNotInVersion { cmd: kind, version });
        }
        let name = CommandName(kind.number());
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend_from_slice(&[0; CMD_HEADER_SIZE]);
        let mut data: &[u8] = &[];
        let res = cmd.visit_attrs(|attr, value| {
            let needed = if attr == Attr::Otime {
                2
            } else {
                attr.since_version()
            };
            if needed > version {
                return Err(EncodeError::AttrNotInVersion {
                    cmd: kind,
                    attr,
                    needed,
                    version,
                });
            }
            debug_assert!(data.is_empty(), "DATA must be the last attribute");
            match value {
                Value::U8(v) => put_tlv(&mut scratch, name, attr, &[v]),
                Value::U32(v) => put_tlv(&mut scratch, name, attr, &v.to_le_bytes()),
                Value::U64(v) => put_tlv(&mut scratch, name, attr, &v.to_le_bytes()),
                Value::Uuid(v) => put_tlv(&mut scratch, name, attr, v),
                Value::Timespec(t) => put_tlv(&mut scratch, name, attr, &t.to_bytes()),
                Value::Bytes(b) if attr == Attr::Data => {
                    // The value is written straight from the caller's slice, after
                    // the copied attributes (DATA is always last).
                    data = b;
                    scratch.extend_from_slice(&attr.number().to_le_bytes());
                    if version < 2 {
                        let len = tlv_len(name, attr, b)?;
                        scratch.extend_from_slice(&len.to_le_bytes());
                    }
                    Ok(())
                }
                Value::Bytes(b) => put_tlv(&mut scratch, name, attr, b),
            }
        });
        let res = res.and_then(|()| {
            let header_and_attrs = scratch.len();
            fill_header(
                &mut scratch,
                kind.number(),
                header_and_attrs,
                data,
                self.options.max_command_size,
            )
        });
        let res = res.and_then(|()| self.put(&scratch, data));
        self.scratch = scratch;
        res
    }

    /// The bytes of the command written last, as written, but for its
    /// DATA attribute's value (not copied: [`write`](Self::write) writes it
    /// from the caller's slice): the whole command when it has no DATA.
    pub fn last_encoded(&self) -> &[u8] {
        &self.scratch
    }

    /// Write commands encoded already, verbatim: `bytes` are whole
    /// commands as [`write`](Self::write) of a writer of the same version
    /// and options (without a header) wrote them. What
    /// [`last_encoded`](Self::last_encoded) returns does not change.
    ///
    /// # Errors
    ///
    /// [`EncodeError::Io`].
    pub fn write_encoded(&mut self, bytes: &[u8]) -> Result<(), EncodeError> {
        self.put(bytes, &[])
    }

    /// Write a command verbatim from its number and payload: no version or
    /// attribute checks (use it to pass through what a reader accepted).
    ///
    /// # Errors
    ///
    /// [`EncodeError::CommandTooLarge`] or [`EncodeError::Io`].
    pub fn write_payload(&mut self, cmd: u16, payload: &[u8]) -> Result<(), EncodeError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend_from_slice(&[0; CMD_HEADER_SIZE]);
        let res = fill_header(
            &mut scratch,
            cmd,
            CMD_HEADER_SIZE,
            payload,
            self.options.max_command_size,
        )
        .and_then(|()| self.put(&scratch, payload));
        self.scratch = scratch;
        res
    }

    /// Write a command as read by a [`crate::StreamReader`], verbatim
    /// ([`StreamWriter::write_payload`]).
    ///
    /// # Errors
    ///
    /// [`EncodeError::CommandTooLarge`] or [`EncodeError::Io`].
    pub fn write_raw(&mut self, raw: &RawCommand<'_>) -> Result<(), EncodeError> {
        self.write_payload(raw.cmd(), raw.payload())
    }

    /// Flush the inner writer.
    ///
    /// # Errors
    ///
    /// [`EncodeError::Io`].
    pub fn flush(&mut self) -> Result<(), EncodeError> {
        let offset = self.pos;
        self.inner.flush().map_err(|source| EncodeError::Io {
            offset,
            error: source,
        })
    }

    /// Write END, flush, and give back the inner writer.
    ///
    /// # Errors
    ///
    /// [`EncodeError::Io`].
    pub fn finish(mut self) -> Result<W, EncodeError> {
        self.write(&Command::End)?;
        self.flush()?;
        Ok(self.inner)
    }

    /// Give back the inner writer without writing END (for all but the last part
    /// of a `btrfs send -e` style stream, the kernel's
    /// `BTRFS_SEND_FLAG_OMIT_END_CMD`). Does not flush.
    pub fn into_inner(self) -> W {
        self.inner
    }

    fn put(&mut self, head: &[u8], data: &[u8]) -> Result<(), EncodeError> {
        let offset = self.pos;
        let res = self.inner.write_all(head).and_then(|()| {
            if data.is_empty() {
                Ok(())
            } else {
                self.inner.write_all(data)
            }
        });
        res.map_err(|source| EncodeError::Io {
            offset,
            error: source,
        })?;
        self.pos = self
            .pos
            .saturating_add(u64::try_from(head.len()).unwrap_or(u64::MAX))
            .saturating_add(u64::try_from(data.len()).unwrap_or(u64::MAX));
        Ok(())
    }
}

fn tlv_len(cmd: CommandName, attr: Attr, value: &[u8]) -> Result<u16, EncodeError> {
    u16::try_from(value.len()).map_err(|_| EncodeError::AttrTooLong {
        cmd,
        attr,
        len: value.len(),
    })
}

fn put_tlv(
    scratch: &mut Vec<u8>,
    cmd: CommandName,
    attr: Attr,
    value: &[u8],
) -> Result<(), EncodeError> {
    let len = tlv_len(cmd, attr, value)?;
    scratch.extend_from_slice(&attr.number().to_le_bytes());
    scratch.extend_from_slice(&len.to_le_bytes());
    scratch.extend_from_slice(value);
    Ok(())
}

/// Check the size of `scratch[..used]` + `data` and fill in the 10-byte header
/// at the start of `scratch`: length, command number and CRC.
fn fill_header(
    scratch: &mut [u8],
    cmd: u16,
    used: usize,
    data: &[u8],
    max: u32,
) -> Result<(), EncodeError> {
    let size = u64::try_from(used)
        .ok()
        .and_then(|u| u.checked_add(u64::try_from(data.len()).ok()?))
        .unwrap_or(u64::MAX);
    let too_large = || EncodeError::CommandTooLarge {
        cmd: CommandName(cmd),
        size,
        max,
    };
    if size > u64::from(max) {
        return Err(too_large());
    }
    let payload_len = size
        .checked_sub(10)
        .and_then(|p| u32::try_from(p).ok())
        .ok_or_else(too_large)?;
    let Some(head) = scratch.get_mut(..used) else {
        return Err(too_large());
    };
    let Some((hdr, _)) = head.split_first_chunk_mut::<CMD_HEADER_SIZE>() else {
        return Err(too_large());
    };
    let [l0, l1, l2, l3] = payload_len.to_le_bytes();
    let [c0, c1] = cmd.to_le_bytes();
    *hdr = [l0, l1, l2, l3, c0, c1, 0, 0, 0, 0];
    let mut crc = Crc::new();
    crc.update(head);
    crc.update(data);
    let [k0, k1, k2, k3] = crc.finish().to_le_bytes();
    if let Some((hdr, _)) = head.split_first_chunk_mut::<CMD_HEADER_SIZE>() {
        *hdr = [l0, l1, l2, l3, c0, c1, k0, k1, k2, k3];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::command::Timespec;

    #[test]
    fn end_command_bytes() {
        let w = StreamWriter::new(Vec::new(), 1).unwrap();
        let b = w.finish().unwrap();
        let mut want = STREAM_MAGIC.to_vec();
        want.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 0x15, 0, 0x50, 0x6c, 0xc9, 0x9d]);
        assert_eq!(b, want);
    }

    #[test]
    fn encoded_len_is_what_a_v1_writer_writes() {
        let t = Timespec::default();
        let cmds = [
            Command::Utimes {
                path: Cow::Borrowed(b"a/b"),
                atime: t,
                mtime: t,
                ctime: t,
                otime: None,
            },
            Command::Write {
                path: Cow::Borrowed(b"f"),
                offset: 4096,
                data: Cow::Owned(vec![7; 1000]),
            },
            Command::SetXattr {
                path: Cow::Borrowed(b"x"),
                name: Cow::Borrowed(b"user.k"),
                data: Cow::Borrowed(b"value"),
            },
            Command::End,
        ];
        for cmd in cmds {
            let mut w = StreamWriter::with_options(
                Vec::new(),
                WriterOptions {
                    write_header: false,
                    ..WriterOptions::new(1)
                },
            )
            .unwrap();
            w.write(&cmd).unwrap();
            assert_eq!(cmd.encoded_len(), w.bytes_written(), "{cmd:?}");
        }
    }

    /// UTIMES of `a/b`, all times zero: a command without data.
    fn utimes_ab() -> Command<'static> {
        let t = Timespec::default();
        Command::Utimes {
            path: Cow::Borrowed(b"a/b"),
            atime: t,
            mtime: t,
            ctime: t,
            otime: None,
        }
    }

    #[test]
    fn last_encoded_is_the_command_but_for_its_data() {
        let utimes = utimes_ab();
        let write = Command::Write {
            path: Cow::Borrowed(b"f"),
            offset: 4096,
            data: Cow::Owned(vec![7; 1000]),
        };
        let mut w =
            StreamWriter::with_options(Vec::new(), WriterOptions::new(1).without_header()).unwrap();
        w.write(&utimes).unwrap();
        // Without DATA: every byte written.
        assert_eq!(w.last_encoded(), &w.get_ref()[..]);
        let before = w.get_ref().len();
        w.write(&write).unwrap();
        // With DATA: all but the value of DATA, which ends the command.
        let written = w.get_ref().get(before..).unwrap();
        assert_eq!(w.last_encoded().len() + 1000, written.len());
        assert_eq!(Some(w.last_encoded()), written.get(..written.len() - 1000));
    }

    #[test]
    fn write_encoded_passes_commands_through() {
        let utimes = utimes_ab();
        let rmdir = Command::Rmdir {
            path: Cow::Borrowed(b"d"),
        };
        let mut direct = StreamWriter::new(Vec::new(), 1).unwrap();
        let mut enc =
            StreamWriter::with_options(Vec::new(), WriterOptions::new(1).without_header()).unwrap();
        for cmd in [&utimes, &rmdir] {
            direct.write(cmd).unwrap();
            enc.write(cmd).unwrap();
        }
        let mut w = StreamWriter::new(Vec::new(), 1).unwrap();
        w.write_encoded(enc.get_ref()).unwrap();
        assert_eq!(w.bytes_written(), direct.bytes_written());
        assert_eq!(w.finish().unwrap(), direct.finish().unwrap());
    }

    #[test]
    fn version_rules() {
        let mut w = StreamWriter::new(Vec::new(), 1).unwrap();
        let fa = Command::Fileattr {
            path: Cow::Borrowed(b"x"),
            attr: 16,
        };
        let e = w.write(&fa).unwrap_err();
        assert_eq!(
            e.to_string(),
            "command FILEATTR needs stream version 2, the stream is version 1"
        );
        let t = Timespec::default();
        let ut = Command::Utimes {
            path: Cow::Borrowed(b""),
            atime: t,
            mtime: t,
            ctime: t,
            otime: Some(t),
        };
        let e = w.write(&ut).unwrap_err();
        assert!(matches!(
            e,
            EncodeError::AttrNotInVersion {
                attr: Attr::Otime,
                needed: 2,
                ..
            }
        ));
        assert_eq!(w.bytes_written(), 17, "nothing written on error");
        assert!(matches!(
            StreamWriter::new(Vec::new(), 4),
            Err(EncodeError::UnsupportedVersion(4))
        ));
        assert!(matches!(
            StreamWriter::new(Vec::new(), 0),
            Err(EncodeError::UnsupportedVersion(0))
        ));
    }

    #[test]
    fn size_limits() {
        let path = Cow::Borrowed(&b"f"[..]);
        // v1: 65536 - 10 (header) - 5 (PATH) - 12 (FILE_OFFSET) - 4 (DATA header).
        let fits = vec![0u8; 65536 - 31];
        let mut w = StreamWriter::new(Vec::new(), 1).unwrap();
        w.write(&Command::Write {
            path: path.clone(),
            offset: 0,
            data: Cow::Borrowed(&fits),
        })
        .unwrap();
        assert_eq!(w.bytes_written(), 17 + 65536);
        let big = vec![0u8; 65536 - 30];
        let e = w.write(&Command::Write {
            path: path.clone(),
            offset: 0,
            data: Cow::Borrowed(&big),
        });
        assert_eq!(
            e.unwrap_err().to_string(),
            "command WRITE would be 65537 bytes including its header, more than the maximum 65536 of this stream"
        );
        // v2: DATA has no length field; 128 KiB fits, as the kernel sends.
        let mut w = StreamWriter::new(Vec::new(), 2).unwrap();
        let d = vec![1u8; 131072];
        w.write(&Command::Write {
            path: Cow::Borrowed(b"big"),
            offset: 0,
            data: Cow::Borrowed(&d),
        })
        .unwrap();
        assert_eq!(w.bytes_written(), 17 + 10 + 131093);
        // A 70000-byte path never fits a TLV.
        let long = vec![b'a'; 70000];
        let opts = WriterOptions::new(2).with_max_command_size(1 << 20);
        let mut w = StreamWriter::with_options(Vec::new(), opts).unwrap();
        let e = w
            .write(&Command::Unlink {
                path: Cow::Borrowed(&long),
            })
            .unwrap_err();
        assert!(matches!(
            e,
            EncodeError::AttrTooLong {
                attr: Attr::Path,
                len: 70000,
                ..
            }
        ));
    }

    #[test]
    fn omit_header() {
        let w =
            StreamWriter::with_options(Vec::new(), WriterOptions::new(2).without_header()).unwrap();
        assert_eq!(w.finish().unwrap().len(), 10);
    }
}
