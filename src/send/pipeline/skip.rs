//! Continuing a stream: which commands of a send planned again were
//! written already ([`Skip`]), the identity of a command ([`ident`],
//! [`IdentChain`]), and the writer that cuts off the part of a straddling
//! command already sent ([`Discard`]). This module drops and checks; it
//! never reads file data.

use std::io::Write;

use stream_format::{Command, StreamWriter};

use crate::resume::Shape as Chain;

use super::super::error::SendError;
use super::{DataOp, Pipeline, Trail};
use crate::fs::FileExtent;

/// A command's identity for a [`Trail`]: its encoding without its file
/// data, and the data's length (`data_len` more bytes not in `cmd`), in
/// `buf`'s buffer.
pub(super) fn ident<'b>(
    buf: &'b mut Option<StreamWriter<Vec<u8>>>,
    version: u32,
    cmd: &Command<'_>,
    data_len: u64,
) -> Result<&'b [u8], SendError> {
    let stripped;
    let (c, n) = match cmd {
        Command::Write { path, offset, data } => {
            stripped = Command::Write {
                path: path.as_ref().into(),
                offset: *offset,
                data: (&[][..]).into(),
            };
            (&stripped, data.len())
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
            stripped = Command::EncodedWrite {
                path: path.as_ref().into(),
                offset: *offset,
                unencoded_file_len: *unencoded_file_len,
                unencoded_len: *unencoded_len,
                unencoded_offset: *unencoded_offset,
                compression: *compression,
                encryption: *encryption,
                data: (&[][..]).into(),
            };
            (&stripped, data.len())
        }
        other => (other, 0),
    };
    let w = match buf {
        Some(w) => w,
        None => buf.insert(StreamWriter::with_options(
            Vec::with_capacity(512),
            stream_format::WriterOptions::new(version).without_header(),
        )?),
    };
    w.get_mut().clear();
    w.write(c)?;
    let n = u64::try_from(n)
        .unwrap_or(u64::MAX)
        .saturating_add(data_len);
    w.get_mut().extend_from_slice(&n.to_le_bytes());
    Ok(w.get_ref())
}

/// Resuming a stream: the commands before stream offset `until` are
/// counted (their shape and length, as [`Pipeline::sizing`](super::Pipeline::sizing) counts them:
/// no file data is read) and dropped; a command that straddles `until` is
/// written with its first bytes cut off by the [`Discard`] writer.
#[derive(Debug, Clone)]
pub(crate) struct Skip {
    /// Stream offset to continue from.
    pub(crate) until: u64,
    /// Stream offset and index of the next command planned.
    pub(super) pos: u64,
    pub(super) index: u64,
    pub(super) shape: Chain,
    /// Continuing a [`Trail`]: the identity chain of the commands from this
    /// stream offset on.
    pub(super) ident: Option<(u64, IdentChain)>,
    /// Points the dropped commands must match, by stream offset.
    pub(super) checks: Vec<Check>,
    pub(super) done: bool,
}

/// The running digest of commands' identities (see [`Trail`]): one
/// hasher fed every command, finished only when compared. XXH3-128: the
/// chains compared are two plans of one send in one process, not
/// anything an adversary chooses, and a send feeds it every command (a
/// cryptographic hash cost a tenth of a small-file send).
#[derive(Clone, Default)]
pub(crate) struct IdentChain(xxhash_rust::xxh3::Xxh3);

impl std::fmt::Debug for IdentChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("IdentChain")
            .field(&format_args!("{:032x}", self.0.digest128()))
            .finish()
    }
}

impl IdentChain {
    pub(super) fn push(&mut self, id: &[u8]) {
        self.0.update(id);
    }

    pub(super) fn digest(&self) -> [u8; 16] {
        self.0.digest128().to_le_bytes()
    }
}

/// A point a resumed stream must have: a command boundary at stream offset
/// `at`, with `index` commands before it, whose shape chain (a resume
/// token's) or identity chain (a [`Trail`]'s) is this.
#[derive(Debug, Clone)]
pub(super) struct Check {
    pub(super) at: u64,
    pub(super) index: u64,
    pub(super) shape: Option<Chain>,
    pub(super) ident: Option<[u8; 16]>,
}

impl Skip {
    /// Skip to byte `until` of the stream (any offset: within one
    /// process, the stream already written).
    pub(crate) fn to_offset(until: u64) -> Skip {
        Skip {
            until,
            pos: crate::resume::FIRST_COMMAND,
            index: 0,
            shape: Chain::default(),
            ident: None,
            checks: Vec::new(),
            done: until <= crate::resume::FIRST_COMMAND,
        }
    }

    /// Skip to a resume token's point.
    pub(crate) fn to_token(t: &crate::resume::Token) -> Skip {
        let mut s = Skip::to_offset(t.offset);
        s.checks.push(Check {
            at: t.offset,
            index: t.index,
            shape: Some(t.shape),
            ident: None,
        });
        s.done = false;
        s
    }

    /// Skip to where `trail`'s stream stopped, the commands dropped being
    /// the very ones written there (identity chains equal; and the
    /// token's point on the way, if the stream continues one).
    pub(crate) fn to_trail(trail: &Trail, token: Option<&crate::resume::Token>) -> Skip {
        let mut s = match token {
            Some(t) => Skip::to_token(t),
            None => Skip::to_offset(0),
        };
        s.until = trail.pos;
        s.ident = Some((trail.from, IdentChain::default()));
        s.checks.push(Check {
            at: trail.pos,
            index: trail.index,
            shape: None,
            ident: Some(trail.ident.digest()),
        });
        s.done = false;
        s
    }

    /// Check the points at or before the current position.
    pub(super) fn verify(&mut self) -> Result<(), SendError> {
        while let Some(c) = self.checks.first() {
            if self.pos < c.at {
                break;
            }
            let c = self.checks.remove(0);
            if self.pos != c.at {
                return Err(SendError::ResumeMismatch(format!(
                    "no command of this send starts at stream offset {} (command {} of the \
                     interrupted send)",
                    c.at, c.index
                )));
            }
            let ident = c
                .ident
                .and_then(|_| self.ident.as_ref().map(|(_, chain)| chain.digest()));
            if self.index != c.index
                || c.shape.is_some_and(|s| s != self.shape)
                || c.ident.is_some_and(|i| Some(i) != ident)
            {
                return Err(SendError::ResumeMismatch(format!(
                    "the commands before stream offset {} differ from the interrupted send's \
                     (command {} here, {} there)",
                    c.at, self.index, c.index
                )));
            }
        }
        Ok(())
    }

    /// The resume point is inside the next command: every point not
    /// passed yet fails.
    pub(super) fn straddled(&self) -> Result<(), SendError> {
        match self.checks.first() {
            Some(c) => Err(SendError::ResumeMismatch(format!(
                "no command of this send starts at stream offset {} (command {} of the \
                 interrupted send)",
                c.at, c.index
            ))),
            None => Ok(()),
        }
    }
}

/// A writer that drops the first `skip` bytes written through it (the
/// part of a straddling command already sent, see [`Skip`]).
#[derive(Debug)]
pub(crate) struct Discard<W> {
    pub(crate) inner: W,
    pub(crate) skip: u64,
}

impl<W: Write> Write for Discard<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.skip > 0 {
            let n = usize::try_from(self.skip)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            self.skip -= n as u64;
            if n == buf.len() {
                return Ok(n);
            }
            return self.inner.write(&buf[n..]).map(|w| w + n);
        }
        self.inner.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Where a resumed pipeline's writer sets how many bytes to cut off.
pub(crate) trait CutHead {
    /// Drop the next `n` bytes written.
    fn cut_head(&mut self, n: u64);
}

impl<W: Write> CutHead for Discard<W> {
    fn cut_head(&mut self, n: u64) {
        self.skip = n;
    }
}

impl CutHead for std::io::Sink {
    fn cut_head(&mut self, _: u64) {}
}

/// The pipeline's side of continuing: dropping the commands before the
/// resume point, and recording or replaying a [`Trail`].
impl<'t, W: Write> Pipeline<'t, W> {
    /// Drop the commands before `skip`'s resume point (see [`Skip`]).
    pub(crate) fn resume(mut self, skip: Skip) -> Pipeline<'t, W>
    where
        W: CutHead,
    {
        self.skip = Some(skip);
        self.cut = Some(<W as CutHead>::cut_head);
        self
    }

    /// Whether the next command, `kind` with `len` bytes on the wire, is
    /// before the resume point (then it is counted and dropped).
    pub(super) fn skipped(&mut self, cmd: &Command<'_>, data_len: u64) -> Result<bool, SendError> {
        if self.skip.as_ref().is_none_or(|s| s.done) {
            return Ok(false);
        }
        let len = cmd.stream_len(self.out.version()).saturating_add(data_len);
        let tracked = self
            .skip
            .as_ref()
            .and_then(|s| s.ident.as_ref().map(|(from, _)| s.pos >= *from))
            .unwrap_or(false);
        let version = self.out.version();
        let id = if tracked {
            Some(ident(&mut self.ident_buf, version, cmd, data_len)?)
        } else {
            None
        };
        let Some(skip) = self.skip.as_mut() else {
            return Ok(false);
        };
        skip.verify()?;
        if skip.pos >= skip.until {
            skip.done = true;
            return Ok(false);
        }
        let end = skip.pos.saturating_add(len);
        if end > skip.until {
            // Straddles the resume point: written, its head cut off.
            skip.done = true;
            skip.straddled()?;
            let n = skip.until - skip.pos;
            if let Some(cut) = self.cut {
                cut(self.out.get_mut(), n);
            }
            if let Some(t) = self.trail {
                t.borrow_mut().broken = true;
            }
            return Ok(false);
        }
        let number = cmd.kind().map_or(0, |k| k.number());
        skip.shape.push(number, len);
        if let (Some((_, chain)), Some(id)) = (&mut skip.ident, id) {
            chain.push(id);
        }
        skip.pos = end;
        skip.index += 1;
        skip.verify()?;
        if skip.pos == skip.until && skip.checks.is_empty() {
            skip.done = true;
        }
        self.count(cmd, data_len);
        Ok(true)
    }

    /// Keep what is written in `trail` (see [`Trail`]).
    pub(crate) fn traced(mut self, trail: &'t std::cell::RefCell<Trail>) -> Pipeline<'t, W> {
        self.trail = Some(trail);
        self
    }

    /// Continuing a [`Trail`] and still before its point: the data
    /// commands made for `ext` of `ino` when it was written, if its shape
    /// is the same.
    pub(crate) fn replayed_ops(&self, ino: u64, ext: &FileExtent) -> Option<Vec<DataOp>> {
        let skipping = self
            .skip
            .as_ref()
            .is_some_and(|s| !s.done && s.ident.is_some());
        if !skipping {
            return None;
        }
        self.trail?.borrow().kept(ino, ext)
    }

    /// Keep the data commands made for `ext` of `ino` (tracing a
    /// [`Trail`]).
    pub(crate) fn record_ops(&self, ino: u64, ext: &FileExtent, ops: Vec<DataOp>) {
        if let Some(t) = self.trail {
            t.borrow_mut().keep(ino, ext, ops);
        }
    }

    /// Whether data commands are worth recording (tracing a [`Trail`]).
    pub(crate) fn tracing(&self) -> bool {
        self.trail.is_some()
    }

    /// The stream bytes the resume point skipped (0 when not resuming).
    pub(super) fn skipped_bytes(&self) -> u64 {
        self.skip.as_ref().map_or(0, |s| s.pos.min(s.until))
    }
}
