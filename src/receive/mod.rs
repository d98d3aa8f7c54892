//! The receiver: applies send streams to a directory on any filesystem.
//!
//! Flow: [`stream_format::StreamReader`] → [`apply`] (one typed command at a
//! time) → [`target`] (the only stream-path → filesystem-path code) → the
//! kernel's `*at` system calls. [`meta`] keeps a record beside each received
//! subvolume (received UUID, ctransid, parent, completeness), the part of
//! `btrfs receive`'s root-item bookkeeping that a plain directory cannot hold;
//! [`copy`] makes a snapshot's starting point from its parent and copies
//! CLONE ranges; [`encoded`] decodes `--compressed-data` extents, which the
//! private `sys` module (the crate's only unsafe code) writes as they are
//! into a btrfs target.
//! Semantics per command follow btrfs-progs `cmds/receive.c` (see
//! `shared/docs/send-stream-format.md` §9, §10).
//!
//! Errors: a corrupt or truncated stream is a [`ReceiveError::Stream`] that
//! names the byte offset and the command (from the reader); a command that
//! cannot be applied is an [`ApplyError`] that names the command, its stream
//! path(s), the target path(s) and the OS error. As `btrfs receive -E N`,
//! receiving stops at the N-th error ([`ReceiveOptions::max_errors`], 0 =
//! never); earlier ones go to [`Progress::error`]. A subvolume with any
//! error is left marked incomplete.

pub mod apply;
pub mod copy;
pub mod encoded;
pub mod meta;
mod sys;
pub mod target;

use std::fmt;
use std::io::{self, BufReader, Read};

use std::path::{Path, PathBuf};

use stream_format::{Command, CommandInfo, DecodeError, ReaderOptions, StreamReader};

pub use apply::Receiver;
use meta::Uuid;
use target::TargetError;

/// Where a receive reports what it is doing. Every method has a default that
/// does nothing; the CLI draws a progress bar and prints notes.
pub trait Progress {
    /// The reader is at byte `offset` of the input, after `commands`
    /// commands.
    fn position(&mut self, offset: u64, commands: u64) {
        let _ = (offset, commands);
    }
    /// A subvolume is being created (`incremental`: from a parent).
    fn subvol_start(&mut self, name: &[u8], incremental: bool) {
        let _ = (name, incremental);
    }
    /// A subvolume is finished; `complete` is false if any command failed.
    fn subvol_done(&mut self, name: &[u8], complete: bool) {
        let _ = (name, complete);
    }
    /// Something not applied, reported once (e.g. owners as an ordinary
    /// user, fs-verity, inode flags the target refuses). Not an error.
    fn note(&mut self, msg: &str) {
        let _ = msg;
    }
    /// An error below the `--max-errors` limit: receiving goes on.
    fn error(&mut self, err: &ReceiveError) {
        let _ = err;
    }
}

/// A [`Progress`] that reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// How to receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReceiveOptions {
    /// Stop at the N-th error; 0 = never (`-E`, default 1).
    pub max_errors: u64,
    /// Stop after the first END (`-e`).
    pub stop_at_end: bool,
    /// Decode compressed ENCODED_WRITE data even where the target could take
    /// it as it is (`--force-decompress`).
    pub force_decompress: bool,
}

impl ReceiveOptions {
    /// The defaults: stop at the first error, read every concatenated stream.
    pub const fn new() -> ReceiveOptions {
        ReceiveOptions {
            max_errors: 1,
            stop_at_end: false,
            force_decompress: false,
        }
    }
}

impl Default for ReceiveOptions {
    fn default() -> ReceiveOptions {
        ReceiveOptions::new()
    }
}

/// Why one command could not be applied.
#[derive(Debug)]
#[non_exhaustive]
pub enum ApplyErrorKind {
    /// The OS refused.
    Io(io::Error),
    /// A path was refused or could not be resolved safely.
    Target(TargetError),
    /// A command before any SUBVOL or SNAPSHOT.
    NoSubvol,
    /// SUBVOL / SNAPSHOT: `DIR/<name>` exists already.
    Exists,
    /// No received subvolume has this UUID.
    ParentMissing {
        /// The UUID asked for.
        uuid: Uuid,
        /// The ctransid asked for.
        ctransid: u64,
        /// A SNAPSHOT's parent (else a CLONE's source).
        parent: bool,
    },
    /// The only subvolume with this UUID is incomplete.
    ParentIncomplete {
        /// The UUID asked for.
        uuid: Uuid,
        /// The ctransid asked for.
        ctransid: u64,
        /// The incomplete subvolume.
        name: Vec<u8>,
        /// A SNAPSHOT's parent (else a CLONE's source).
        parent: bool,
    },
    /// A received subvolume has the UUID but another ctransid.
    ParentCtransid {
        /// The UUID asked for.
        uuid: Uuid,
        /// The ctransid asked for.
        ctransid: u64,
        /// The subvolume found.
        name: Vec<u8>,
        /// Its ctransid.
        found: u64,
    },
    /// Copying the parent failed.
    Copy {
        /// The source path.
        from: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// UPDATE_EXTENT: a `--no-data` stream.
    NoData,
    /// ENCODED_WRITE data that cannot be decoded.
    Decode(encoded::DecodeDataError),
    /// A MKNOD / CHMOD mode that makes no sense.
    BadMode(u64),
    /// Another invalid value.
    Invalid(String),
}

impl fmt::Display for ApplyErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = |parent: bool| {
            if parent {
                "parent subvolume"
            } else {
                "clone source subvolume"
            }
        };
        match self {
            ApplyErrorKind::Io(e) => e.fmt(f),
            ApplyErrorKind::Target(e) => e.fmt(f),
            ApplyErrorKind::NoSubvol => f.write_str("no SUBVOL or SNAPSHOT command before it"),
            ApplyErrorKind::Exists => f.write_str("subvolume directory exists already"),
            ApplyErrorKind::ParentMissing { uuid, ctransid, parent } => write!(
                f,
                "cannot find {} with uuid {uuid} ctransid {ctransid}: it was not received into this directory",
                what(*parent)
            ),
            ApplyErrorKind::ParentIncomplete { uuid, ctransid, name, parent } => write!(
                f,
                "{} with uuid {uuid} ctransid {ctransid} ({}) was received incompletely: refusing to use it",
                what(*parent),
                name.escape_ascii()
            ),
            ApplyErrorKind::ParentCtransid { uuid, ctransid, name, found } => write!(
                f,
                "parent subvolume with uuid {uuid} ({}) has ctransid {found}, the stream needs ctransid {ctransid}",
                name.escape_ascii()
            ),
            ApplyErrorKind::Copy { from, source } => {
                write!(f, "cannot copy the parent subvolume: {}: {source}", from.display())
            }
            ApplyErrorKind::NoData => f.write_str(
                "the stream was made with --no-data (UPDATE_EXTENT has no file data): it cannot be applied",
            ),
            ApplyErrorKind::Decode(e) => e.fmt(f),
            ApplyErrorKind::BadMode(m) => write!(f, "invalid mode {m:o}"),
            ApplyErrorKind::Invalid(m) => f.write_str(m),
        }
    }
}

impl From<io::Error> for ApplyErrorKind {
    fn from(e: io::Error) -> Self {
        ApplyErrorKind::Io(e)
    }
}

impl From<rustix::io::Errno> for ApplyErrorKind {
    fn from(e: rustix::io::Errno) -> Self {
        ApplyErrorKind::Io(e.into())
    }
}

impl From<TargetError> for ApplyErrorKind {
    fn from(e: TargetError) -> Self {
        ApplyErrorKind::Target(e)
    }
}

impl From<encoded::DecodeDataError> for ApplyErrorKind {
    fn from(e: encoded::DecodeDataError) -> Self {
        ApplyErrorKind::Decode(e)
    }
}

/// A command that could not be applied: which command, which paths, why.
#[derive(Debug)]
pub struct ApplyError {
    /// Where the command is in the stream (none when finishing a subvolume).
    pub cmd: Option<CommandInfo>,
    /// The operation (`WRITE`, …).
    pub op: &'static str,
    /// The command's PATH (for SUBVOL / SNAPSHOT, the subvolume name).
    pub path: Vec<u8>,
    /// Where PATH is on the filesystem, if a subvolume was open.
    pub target: Option<PathBuf>,
    /// The second path of RENAME (PATH_TO), LINK (PATH_LINK), CLONE
    /// (CLONE_PATH), with its filesystem path when known.
    pub path2: Option<(Vec<u8>, Option<PathBuf>)>,
    /// The cause.
    pub kind: ApplyErrorKind,
}

fn fmt_path(f: &mut fmt::Formatter<'_>, p: &[u8], t: Option<&PathBuf>) -> fmt::Result {
    write!(f, "\"{}\"", p.escape_ascii())?;
    if let Some(t) = t {
        write!(f, " ({})", t.display())?;
    }
    Ok(())
}

impl fmt::Display for ApplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cmd {
            Some(c) => write!(f, "cannot apply {c}: {} ", self.op)?,
            None => write!(f, "cannot {} ", self.op)?,
        }
        fmt_path(f, &self.path, self.target.as_ref())?;
        if let Some((p, t)) = &self.path2 {
            f.write_str(if self.op == "CLONE" { " from " } else { " -> " })?;
            fmt_path(f, p, t.as_ref())?;
        }
        write!(f, ": {}", self.kind)
    }
}

/// The message already includes the cause, so there is no `source()`
/// (a chain printer would repeat it).
impl std::error::Error for ApplyError {}

impl ApplyError {
    /// The OS error behind this failure, if there is one.
    pub fn io_error(&self) -> Option<&io::Error> {
        match &self.kind {
            ApplyErrorKind::Io(e) | ApplyErrorKind::Copy { source: e, .. } => Some(e),
            ApplyErrorKind::Target(TargetError::Io(e)) => Some(e),
            _ => None,
        }
    }
}

/// Why a receive failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiveError {
    /// DIR cannot be used.
    #[error("cannot receive into {}: {error}", dir.display())]
    Dir {
        /// DIR.
        dir: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// The stream is corrupt, truncated or unreadable.
    #[error("{error}{}", in_subvol(.subvol))]
    Stream {
        /// The reader's error (it names the offset and the command).
        error: DecodeError,
        /// The subvolume being received then, left incomplete.
        subvol: Option<String>,
    },
    /// A command could not be applied.
    #[error(transparent)]
    Apply(Box<ApplyError>),
    /// Errors below the `--max-errors` limit happened (each was reported
    /// through [`Progress::error`]).
    #[error(
        "{0} errors while receiving (see above); the subvolumes they hit are marked incomplete"
    )]
    Errors(u64),
}

fn in_subvol(s: &Option<String>) -> String {
    match s {
        Some(n) => format!(" (subvolume {n} left incomplete)"),
        None => String::new(),
    }
}

impl From<Box<ApplyError>> for ReceiveError {
    fn from(e: Box<ApplyError>) -> Self {
        ReceiveError::Apply(e)
    }
}

/// What a receive did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Commands read.
    pub commands: u64,
    /// Bytes read.
    pub bytes: u64,
}

/// Commands the reader thread hands over at once: up to this many ...
const BATCH_COMMANDS: usize = 256;
/// ... or this many bytes of command payload, whichever comes first.
const BATCH_BYTES: usize = 1 << 20;
/// Batches read ahead and not yet applied (the bounded queue).
const QUEUE_BATCHES: usize = 4;
/// Largest run of consecutive WRITEs written with one `pwritev`.
const COALESCE_BYTES: usize = 1 << 20;

/// What the reader thread read: a command with the input position after
/// it, or a stream error.
enum Item {
    Cmd(CommandInfo, Command<'static>, u64),
    Err(DecodeError),
}

/// The reader thread: read, check (CRC-32C, attributes) and decode commands,
/// and send them in batches. Stops at the end of the input, after an error
/// that cannot be read past, after the first END with `stop_at_end` (so it
/// does not read past it), or when the applier hangs up. Returns the input
/// position where it stopped.
fn read_ahead(
    input: impl Read,
    stop_at_end: bool,
    tx: &std::sync::mpsc::SyncSender<Vec<Item>>,
) -> u64 {
    // Version 3 streams are accepted: ENABLE_VERITY is reported, not refused.
    let ropts = ReaderOptions::new().with_max_version(3);
    let mut reader = StreamReader::with_options(BufReader::with_capacity(1 << 18, input), ropts);
    let mut batch = Vec::with_capacity(BATCH_COMMANDS);
    let mut bytes = 0usize;
    loop {
        let (item, stop) = match reader.next_command() {
            Ok(None) => break,
            Ok(Some((info, cmd))) => {
                let end = matches!(cmd, Command::End);
                let cmd = cmd.into_owned();
                bytes = bytes.saturating_add(info.len as usize);
                (Item::Cmd(info, cmd, reader.position()), end && stop_at_end)
            }
            Err(e) => {
                let stop = !e.is_recoverable();
                (Item::Err(e), stop)
            }
        };
        batch.push(item);
        if stop || batch.len() >= BATCH_COMMANDS || bytes >= BATCH_BYTES {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH_COMMANDS));
            bytes = 0;
            if tx.send(full).is_err() {
                return reader.position();
            }
        }
        if stop {
            return reader.position();
        }
    }
    if !batch.is_empty() {
        // The applier may have hung up: nothing left to do then.
        let _ = tx.send(batch);
    }
    reader.position()
}

/// Consecutive WRITEs to one file, each starting where the one before it
/// ends: written with one `pwritev`.
#[derive(Default)]
struct WriteRun {
    cmds: Vec<(CommandInfo, Command<'static>)>,
    bytes: usize,
}

impl WriteRun {
    /// Whether `cmd` is a WRITE that continues this run (an empty run takes
    /// no command: the caller starts runs).
    fn continues(&self, cmd: &Command<'_>) -> bool {
        let (Some((_, last)), Command::Write { path, offset, data }) = (self.cmds.last(), cmd)
        else {
            return false;
        };
        let Command::Write {
            path: lp,
            offset: lo,
            data: ld,
        } = last
        else {
            return false;
        };
        lp == path
            && lo.checked_add(ld.len() as u64) == Some(*offset)
            && self.bytes.saturating_add(data.len()) <= COALESCE_BYTES
    }

    fn push(&mut self, info: CommandInfo, cmd: Command<'static>) {
        if let Command::Write { data, .. } = &cmd {
            self.bytes = self.bytes.saturating_add(data.len());
        }
        self.cmds.push((info, cmd));
    }
}

/// Receive every stream in `input` into `dir`.
///
/// A reader thread reads, checks and decodes the commands ahead of the
/// applier (this thread), through a bounded queue: at most
/// `QUEUE_BATCHES` (4) + 2 batches of `BATCH_COMMANDS` (256) commands or
/// `BATCH_BYTES` (1 MiB) of payload, whichever comes first, are held at
/// once; for kernel-made streams (commands of at most a few hundred KiB)
/// that is about 6 MiB, for any stream at most 6 × (1 MiB +
/// [`ReaderOptions::max_command_len`]). Consecutive WRITEs to one file that
/// follow each other in it are written with one `pwritev` of up to 1 MiB;
/// if that fails they are applied one by one, so the error names the exact
/// command.
///
/// # Errors
///
/// See [`ReceiveError`]: the stream error or apply error that stopped the
/// receive, or [`ReceiveError::Errors`] when errors below the limit
/// happened.
pub fn receive(
    input: impl Read + Send,
    dir: &Path,
    opts: &ReceiveOptions,
    progress: &mut dyn Progress,
) -> Result<Summary, ReceiveError> {
    let mut rx = Receiver::new(dir, progress).map_err(|error| ReceiveError::Dir {
        dir: dir.to_path_buf(),
        error,
    })?;
    rx.force_decompress(opts.force_decompress);
    let (tx, rx_batches) = std::sync::mpsc::sync_channel::<Vec<Item>>(QUEUE_BATCHES);
    std::thread::scope(|s| {
        let stop_at_end = opts.stop_at_end;
        let reader = s.spawn(move || read_ahead(input, stop_at_end, &tx));
        let res = apply_all(&mut rx, &rx_batches, opts);
        // Hang up first, so a reader blocked on a full queue returns.
        drop(rx_batches);
        // OK to unwrap: the reader thread does not panic (a panic there is
        // a bug, passed on as one).
        let end = reader.join().expect("reader thread");
        let mut summary = res?;
        summary.bytes = end;
        Ok(summary)
    })
}

/// The applier: take the reader thread's batches and apply them in order.
fn apply_all(
    rx: &mut Receiver<'_>,
    batches: &std::sync::mpsc::Receiver<Vec<Item>>,
    opts: &ReceiveOptions,
) -> Result<Summary, ReceiveError> {
    let mut errors = 0u64;
    let mut summary = Summary::default();
    let max = opts.max_errors;
    // Apply one command, counting an error against the limit.
    let apply = |rx: &mut Receiver<'_>,
                 info: &CommandInfo,
                 cmd: &Command<'_>,
                 errors: &mut u64|
     -> Result<(), ReceiveError> {
        if let Err(e) = rx.apply(info, cmd) {
            rx.count_error();
            *errors += 1;
            let err = ReceiveError::from(e);
            if max != 0 && *errors >= max {
                return Err(err);
            }
            rx.progress_error(&err);
        }
        Ok(())
    };
    // Write a run of WRITEs; if that fails, apply them one by one (each
    // error then names its own command).
    let flush = |rx: &mut Receiver<'_>, run: &mut WriteRun, errors: &mut u64| {
        let cmds = std::mem::take(&mut run.cmds);
        run.bytes = 0;
        if cmds.len() > 1 && rx.write_run(&cmds) {
            return Ok(());
        }
        for (info, cmd) in &cmds {
            apply(rx, info, cmd, errors)?;
        }
        Ok::<(), ReceiveError>(())
    };
    // A MKFILE or MKDIR held back for one command: if the next one renames
    // it, both become one creation ([`Receiver::create_renamed`]).
    let mut held: Option<(CommandInfo, Command<'static>)> = None;
    let mut run = WriteRun::default();
    'batches: for batch in batches {
        for item in batch {
            let (info, cmd, pos) = match item {
                Item::Cmd(info, cmd, pos) => (info, cmd, pos),
                Item::Err(e) => {
                    flush(rx, &mut run, &mut errors)?;
                    if let Some((hi, hc)) = held.take() {
                        apply(rx, &hi, &hc, &mut errors)?;
                    }
                    let recoverable = e.is_recoverable();
                    rx.count_error();
                    errors += 1;
                    let subvol = rx.current().map(|n| n.escape_ascii().to_string());
                    let err = ReceiveError::Stream { error: e, subvol };
                    if !recoverable || (max != 0 && errors >= max) {
                        return Err(err);
                    }
                    rx.progress_error(&err);
                    continue;
                }
            };
            summary.commands = info.index + 1;
            let is_end = matches!(cmd, Command::End);
            if run.continues(&cmd) {
                run.push(info, cmd);
                rx.position(pos, summary.commands);
                continue;
            }
            flush(rx, &mut run, &mut errors)?;
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
                match cmd {
                    Command::Mkfile { .. } | Command::Mkdir { .. } => held = Some((info, cmd)),
                    Command::Write { .. } => run.push(info, cmd),
                    cmd => apply(rx, &info, &cmd, &mut errors)?,
                }
            }
            rx.position(pos, summary.commands);
            if is_end && opts.stop_at_end {
                break 'batches;
            }
        }
    }
    flush(rx, &mut run, &mut errors)?;
    if let Some((hi, hc)) = held.take() {
        apply(rx, &hi, &hc, &mut errors)?;
    }
    rx.finish_subvol()?;
    if errors > 0 {
        return Err(ReceiveError::Errors(errors));
    }
    Ok(summary)
}
