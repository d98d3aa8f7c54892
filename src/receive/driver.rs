//! The driver of a receive: reads the input (on a read-ahead thread, from
//! a caller's buffers, or from a regular file whose large WRITEs it skims
//! for the lanes to read), decodes the commands in order, and hands them
//! to the [`Receiver`]: a MKFILE or MKDIR held back for the RENAME that may
//! follow, file data offloaded to the lanes, checkpoints when due, resume
//! points dropped from a continuation, errors counted against
//! `--max-errors`. It must not apply a command itself: that is
//! [`apply`](super::apply)'s.

use std::io::{self, Read};

use stream_format::{
    Command, CommandInfo, CommandKind, DecodeError, Next, ReaderOptions, StreamReader,
};

use super::apply::{self, Receiver};
use super::lanes::read_payload_into;
use super::{ApplyError, ReceiveError, ReceiveOptions, Summary};

/// Bytes the reader thread asks for with one `read`.
pub(super) const BLOCK: usize = 1 << 20;

/// Blocks read ahead and not yet decoded (the bounded queue).
pub(super) const QUEUE_BLOCKS: usize = 8;

/// A block of input read by the reader thread: a buffer of [`BLOCK`] bytes
/// and how many of them were read.
pub(super) type Block = (Vec<u8>, usize);

/// The reader thread: read the input in blocks of up to [`BLOCK`] bytes and
/// send them in order; stop at the end of the input, after a read error
/// (sent), or when the decoder hangs up. Buffers come back through `empty`
/// to be reused (no allocation, no page faults per block).
pub(super) fn read_blocks(
    mut input: impl Read,
    full: &std::sync::mpsc::SyncSender<io::Result<Block>>,
    empty: &std::sync::mpsc::Receiver<Vec<u8>>,
) {
    loop {
        let mut buf = empty
            .try_recv()
            .ok()
            .filter(|b| b.len() == BLOCK)
            .unwrap_or_else(|| vec![0; BLOCK]);
        let r = loop {
            match input.read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => break r,
            }
        };
        let stop = !matches!(r, Ok(n) if n > 0);
        match r {
            Ok(0) => return,
            Ok(n) => {
                if full.send(Ok((buf, n))).is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = full.send(Err(e));
            }
        }
        if stop {
            return;
        }
    }
}

/// The decoder's end of the reader thread: the blocks, read in order.
/// It owns the channels' ends: dropping it is what tells the reader thread
/// to stop.
pub(super) struct Blocks {
    pub(super) full: std::sync::mpsc::Receiver<io::Result<Block>>,
    pub(super) empty: std::sync::mpsc::SyncSender<Vec<u8>>,
    pub(super) cur: Block,
    pub(super) pos: usize,
    pub(super) done: bool,
}

impl Read for Blocks {
    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.cur.1 {
            if self.done || dst.is_empty() {
                return Ok(0);
            }
            match self.full.recv() {
                Ok(Ok(b)) => {
                    let (old, _) = std::mem::replace(&mut self.cur, b);
                    self.pos = 0;
                    // The pool may be full: then the buffer is freed (and
                    // the first, empty, one is never a block's).
                    if old.capacity() > 0 {
                        let _ = self.empty.try_send(old);
                    }
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                // The reader thread is done: end of input.
                Err(_) => {
                    self.done = true;
                    return Ok(0);
                }
            }
        }
        let src = self.cur.0.get(self.pos..self.cur.1).unwrap_or_default();
        let n = dst.len().min(src.len());
        dst[..n].copy_from_slice(&src[..n]);
        self.pos += n;
        Ok(n)
    }
}

/// Bytes read at once from a regular file (commands longer than that are
/// read straight into their buffer).
pub(super) const FILE_READ: usize = 8 << 10;

/// Run `f` with `input` read ahead on a thread of its own (see
/// [`receive`](super::receive)).
pub(super) fn with_read_ahead<T>(input: impl Read + Send, f: impl FnOnce(Blocks) -> T) -> T {
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel(QUEUE_BLOCKS);
    let (empty_tx, empty_rx) = std::sync::mpsc::sync_channel(QUEUE_BLOCKS + 2);
    std::thread::scope(|s| {
        s.spawn(move || read_blocks(input, &full_tx, &empty_rx));
        let blocks = Blocks {
            full: full_rx,
            empty: empty_tx,
            cur: (Vec::new(), 0),
            pos: 0,
            done: false,
        };
        // `f` drops `blocks` (also when it stops early, on an error): the
        // reader thread's next send fails and it ends; the scope waits for
        // it.
        f(blocks)
    })
}

/// Where [`receive_blocks`](super::receive_blocks) gets its input: buffers
/// of the stream, in order, made by the caller (e.g. decompressed), so that
/// they need not be copied into blocks of a reader thread.
pub trait StreamBlocks {
    /// The next buffer and how many of its first bytes are input; `None`
    /// at the end of the input. An error ends the input.
    fn next_block(&mut self) -> Option<io::Result<(Vec<u8>, usize)>>;
    /// A buffer [`StreamBlocks::next_block`] gave, decoded, for reuse.
    fn give_back(&mut self, buf: Vec<u8>) {
        drop(buf);
    }
}

/// The thread of [`receive_blocks`](super::receive_blocks): the buffers of
/// `input` in order, the decoded ones given back first; stops at the end,
/// after an error (sent), or when the decoder hangs up.
pub(super) fn send_blocks(
    mut input: impl StreamBlocks,
    full: &std::sync::mpsc::SyncSender<io::Result<Block>>,
    empty: &std::sync::mpsc::Receiver<Vec<u8>>,
) {
    loop {
        while let Ok(b) = empty.try_recv() {
            input.give_back(b);
        }
        match input.next_block() {
            None => return,
            Some(Ok(b)) => {
                if full.send(Ok(b)).is_err() {
                    return;
                }
            }
            Some(Err(e)) => {
                let _ = full.send(Err(e));
                return;
            }
        }
    }
}

/// Read the commands from `input` and apply them (the body of
/// [`receive`](super::receive)).
pub(super) fn decode_and_apply(
    rx: &mut Receiver<'_>,
    input: impl Read,
    opts: &ReceiveOptions,
) -> Result<Summary, ReceiveError> {
    let mut src = Whole(StreamReader::with_options(input, reader_options()));
    decode_and_apply_from(rx, &mut src, None, opts)
}

/// Version 3 streams are accepted: ENABLE_VERITY is reported, not refused.
/// Continuation streams (`btrsend send --resume`) are recognised.
pub(super) fn reader_options() -> ReaderOptions {
    ReaderOptions::new()
        .with_max_version(3)
        .with_continuation(true)
}

/// Where [`decode_and_apply_from`] gets its commands.
pub(super) trait CommandSource {
    /// Read the next stream header if one is due: the stream's number and
    /// its continuation record when it is a continuation stream.
    fn begin(&mut self) -> Result<Option<(u32, Vec<u8>)>, DecodeError>;
    /// The next command, whole or skimmed.
    fn next_item(&mut self) -> Result<Option<Next<'_>>, DecodeError>;
    /// See [`StreamReader::position`].
    fn position(&self) -> u64;
    /// See [`StreamReader::swap_buffer`].
    fn swap_buffer(&mut self, buf: Vec<u8>) -> Vec<u8>;
    /// See [`StreamReader::data_range`].
    fn data_range(&self) -> Option<std::ops::Range<usize>>;
}

/// Every command read whole.
pub(super) struct Whole<R>(StreamReader<R>);

/// See [`CommandSource::begin`].
pub(super) fn begin<R: Read>(
    r: &mut StreamReader<R>,
) -> Result<Option<(u32, Vec<u8>)>, DecodeError> {
    let before = r.streams();
    r.at_command()?;
    if r.streams() == before {
        return Ok(None);
    }
    Ok(r.continuation()
        .map(|c| (r.streams().saturating_sub(1), c.to_vec())))
}

impl<R: Read> CommandSource for Whole<R> {
    fn begin(&mut self) -> Result<Option<(u32, Vec<u8>)>, DecodeError> {
        begin(&mut self.0)
    }
    fn next_item(&mut self) -> Result<Option<Next<'_>>, DecodeError> {
        Ok(self.0.next_command()?.map(|(i, c)| Next::Command(i, c)))
    }
    fn position(&self) -> u64 {
        self.0.position()
    }
    fn swap_buffer(&mut self, buf: Vec<u8>) -> Vec<u8> {
        self.0.swap_buffer(buf)
    }
    fn data_range(&self) -> Option<std::ops::Range<usize>> {
        self.0.data_range()
    }
}

/// A regular file: WRITE and ENCODED_WRITE commands of at least
/// [`SKIM_MIN`] bytes that lie within the file are skimmed (their data is
/// read by the lane that writes it), when `on`.
pub(super) struct Skim {
    pub(super) reader: StreamReader<io::BufReader<std::fs::File>>,
    /// The input's length when the receive started.
    pub(super) len: u64,
    pub(super) on: bool,
}

/// Commands at least this long are skimmed.
pub(super) const SKIM_MIN: u32 = 8192;

/// Payload bytes read of a skimmed command: room for a PATH of `PATH_MAX`
/// bytes and the attributes before it.
pub(super) const SKIM_PREFIX: usize = 4096 + 64;

impl CommandSource for Skim {
    fn begin(&mut self) -> Result<Option<(u32, Vec<u8>)>, DecodeError> {
        begin(&mut self.reader)
    }
    fn next_item(&mut self) -> Result<Option<Next<'_>>, DecodeError> {
        let (on, len) = (self.on, self.len);
        self.reader.next_skimmed(|info| {
            let data = info.cmd == CommandKind::Write.number()
                || info.cmd == CommandKind::EncodedWrite.number();
            let end = info
                .offset
                .saturating_add(stream_format::CMD_HEADER_SIZE as u64)
                .saturating_add(info.len.into());
            (on && data && info.len >= SKIM_MIN && end <= len).then_some(SKIM_PREFIX)
        })
    }
    fn position(&self) -> u64 {
        self.reader.position()
    }
    fn swap_buffer(&mut self, buf: Vec<u8>) -> Vec<u8> {
        self.reader.swap_buffer(buf)
    }
    fn data_range(&self) -> Option<std::ops::Range<usize>> {
        self.reader.data_range()
    }
}

/// The payload of the command `info` in `input`, read whole (or as much of
/// it as there is).
pub(super) fn read_payload(input: &std::fs::File, info: &CommandInfo) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    read_payload_into(input, info, &mut buf)?;
    Ok(buf)
}

/// The body of [`receive`](super::receive) and
/// [`receive_file`](super::receive_file): read the commands from `reader`
/// and apply them; `input` is the input file when `reader` skims.
pub(super) fn decode_and_apply_from(
    rx: &mut Receiver<'_>,
    reader: &mut dyn CommandSource,
    input: Option<&std::sync::Arc<std::fs::File>>,
    opts: &ReceiveOptions,
) -> Result<Summary, ReceiveError> {
    let mut errors = 0u64;
    let mut summary = Summary::default();
    let max = opts.max_errors;
    // Count an error (of a command applied on this thread, or of a lane
    // job: `counted`, already counted against its subvolume).
    let failed = |rx: &mut Receiver<'_>,
                  e: Box<ApplyError>,
                  counted: bool,
                  errors: &mut u64|
     -> Result<(), ReceiveError> {
        if !counted {
            rx.count_error();
        }
        *errors += 1;
        let err = ReceiveError::from(e);
        if max != 0 && *errors >= max {
            return Err(err);
        }
        rx.progress_error(&err);
        Ok(())
    };
    // Apply one command, counting an error against the limit; then the
    // errors the lanes had meanwhile.
    let apply = |rx: &mut Receiver<'_>,
                 info: &CommandInfo,
                 cmd: &Command<'_>,
                 errors: &mut u64|
     -> Result<(), ReceiveError> {
        if let Err(e) = rx.apply(info, cmd) {
            failed(rx, e, false, errors)?;
        }
        for e in rx.take_lane_errors() {
            failed(rx, Box::new(e), true, errors)?;
        }
        Ok(())
    };
    // A MKFILE or MKDIR held back for one command: if the next one renames
    // it, both become one creation ([`Receiver::create_renamed`]).
    let mut held: Option<(CommandInfo, Command<'static>)> = None;
    // A stream error: counted; `Err` if it stops the receive.
    let stream_error =
        |rx: &mut Receiver<'_>, e: DecodeError, errors: &mut u64| -> Result<(), ReceiveError> {
            let recoverable = e.is_recoverable();
            rx.count_error();
            *errors += 1;
            let subvol = rx.current().map(|n| n.escape_ascii().to_string());
            let err = ReceiveError::Stream { error: e, subvol };
            if !recoverable || (max != 0 && *errors >= max) {
                return Err(err);
            }
            rx.progress_error(&err);
            Ok(())
        };
    let mut attrs = Vec::new();
    let list = rx.lists_commands();
    // Where the current subvolume's stream is, for its resume points.
    let mut track = apply::Tracker::new(opts.checkpoint_interval);
    rx.set_checkpoints(opts.checkpoint_interval != 0);
    // A resume error stops the receive.
    let resume_error = |kind| {
        ReceiveError::Apply(Box::new(ApplyError {
            cmd: None,
            op: "resume",
            path: Vec::new(),
            target: None,
            path2: None,
            kind,
        }))
    };
    // A checkpoint when one is due; the lanes' errors it drains are
    // reported at once (a full disk stops the receive there, not much
    // later).
    let checkpoint = |rx: &mut Receiver<'_>,
                      track: &mut apply::Tracker,
                      errors: &mut u64|
     -> Result<(), ReceiveError> {
        if rx.checkpoint(track).map_err(ReceiveError::Apply)? {
            for e in rx.take_lane_errors() {
                failed(rx, Box::new(e), true, errors)?;
            }
        }
        Ok(())
    };
    loop {
        match reader.begin() {
            Ok(None) => {}
            Ok(Some((stream, rec))) => {
                if let Some((hi, hc)) = held.take() {
                    apply(rx, &hi, &hc, &mut errors)?;
                }
                rx.continuation(stream, &rec, &mut track)
                    .map_err(resume_error)?;
            }
            Err(e) => {
                if let Some((hi, hc)) = held.take() {
                    apply(rx, &hi, &hc, &mut errors)?;
                }
                stream_error(rx, e, &mut errors)?;
                continue;
            }
        }
        let next = reader.next_item();
        let item = match next {
            Ok(Some(x)) => x,
            Ok(None) => break,
            Err(e) => {
                if let Some((hi, hc)) = held.take() {
                    apply(rx, &hi, &hc, &mut errors)?;
                }
                stream_error(rx, e, &mut errors)?;
                continue;
            }
        };
        let (info, cmd) = match item {
            Next::Command(info, cmd) => (info, cmd),
            Next::Skimmed { info, crc, prefix } => {
                summary.commands = info.index + 1;
                if track.command(&info).map_err(resume_error)? == apply::Step::Drop {
                    rx.position(reader.position(), summary.commands);
                    continue;
                }
                if let Some((hi, hc)) = held.take() {
                    apply(rx, &hi, &hc, &mut errors)?;
                }
                let Some(input) = input else {
                    return Err(ReceiveError::Stream {
                        error: DecodeError::Stopped {
                            offset: info.offset,
                        },
                        subvol: None,
                    });
                };
                if rx.skimmed(&info, crc, prefix, input) {
                    for e in rx.take_lane_errors() {
                        failed(rx, Box::new(e), true, &mut errors)?;
                    }
                } else {
                    // Read whole, checked and applied here.
                    let payload =
                        read_payload(input, &info).map_err(|source| ReceiveError::Stream {
                            error: DecodeError::Io {
                                offset: info.offset,
                                error: source,
                            },
                            subvol: rx.current().map(|n| n.escape_ascii().to_string()),
                        })?;
                    match stream_format::decode_payload(&info, crc, &payload, &mut attrs) {
                        Ok(cmd) => apply(rx, &info, &cmd, &mut errors)?,
                        Err(e) => stream_error(rx, e, &mut errors)?,
                    }
                }
                rx.position(reader.position(), summary.commands);
                if held.is_none() {
                    checkpoint(rx, &mut track, &mut errors)?;
                }
                continue;
            }
        };
        summary.commands = info.index + 1;
        if track.command(&info).map_err(resume_error)? == apply::Step::Drop {
            drop(cmd);
            rx.position(reader.position(), summary.commands);
            continue;
        }
        let starts = matches!(cmd, Command::Subvol { .. } | Command::Snapshot { .. });
        if list {
            rx.list_command(&cmd);
        }
        let is_end = matches!(cmd, Command::End);
        let mut done = false;
        if let Some((hi, hc)) = held.take() {
            match &cmd {
                Command::Rename { path, path_to } if hc.path() == Some(&path[..]) => {
                    done = rx.create_renamed(&hc, path_to);
                    if !done {
                        apply(rx, &hi, &hc, &mut errors)?;
                    }
                }
                _ => apply(rx, &hi, &hc, &mut errors)?,
            }
        }
        if !done {
            if matches!(cmd, Command::Mkfile { .. } | Command::Mkdir { .. }) {
                held = Some((info, cmd.into_owned()));
            } else if let Some(o) = rx.offload(&info, &cmd) {
                // To a lane, with the buffer its data is in.
                drop(cmd);
                let data = reader.data_range();
                let buf = reader.swap_buffer(rx.buffer());
                if let Err(e) = rx.submit(o, buf, data) {
                    failed(rx, e, false, &mut errors)?;
                }
            } else {
                apply(rx, &info, &cmd, &mut errors)?;
                drop(cmd);
                if starts && let Some(t) = rx.take_resumed() {
                    track.resumed(&t);
                }
            }
        } else {
            drop(cmd);
        }
        rx.position(reader.position(), summary.commands);
        if held.is_none() {
            checkpoint(rx, &mut track, &mut errors)?;
        }
        if is_end && opts.stop_at_end {
            break;
        }
    }
    if let Some((hi, hc)) = held.take() {
        apply(rx, &hi, &hc, &mut errors)?;
    }
    summary.bytes = reader.position();
    rx.finish_subvol()?;
    for e in rx.take_lane_errors() {
        failed(rx, Box::new(e), true, &mut errors)?;
    }
    if errors > 0 {
        return Err(ReceiveError::Errors(errors));
    }
    Ok(summary)
}
