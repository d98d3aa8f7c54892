//! The receiver: applies send streams to a directory, on btrfs as real
//! subvolumes (as `btrfs receive` does), elsewhere as plain directories.
//!
//! Flow: [`stream_format::StreamReader`] → [`apply`] (one typed command at a
//! time, one method per command) → [`target`] (the only stream-path →
//! filesystem-path code) → the kernel's `*at` system calls. Two modes,
//! chosen per receive ([`ReceiveOptions::subvolumes`],
//! [`subvol_mode_possible`]):
//!
//! * on btrfs as root, [`subvol`]: SUBVOL creates a subvolume, SNAPSHOT
//!   snapshots the parent found by UUID on the filesystem, and a finished
//!   subvolume gets its received UUID and is made read-only, exactly as
//!   btrfs-progs does, so `btrfs send -p`, btrbk and `btrfs receive` use it
//!   as they would their own;
//! * elsewhere (or asked for), [`meta`] keeps a record beside each received
//!   directory (received UUID, ctransid, parent, completeness), the part of
//!   the root-item bookkeeping that a plain directory cannot hold; [`copy`]
//!   makes a snapshot's starting point from its parent.
//!
//! Either way a parent received in the other mode serves (a directory parent
//! is copied into the new subvolume; a subvolume received by `btrfs
//! receive` into DIR is found by its received UUID). [`copy`] also copies
//! CLONE ranges; [`encoded`] decodes `--compressed-data` extents, which the
//! crate's private `sys` module (its only unsafe code: the btrfs ioctls)
//! writes as they are into a btrfs target. The private `lanes` module runs
//! the worker threads that write file data (see [`receive`] for what they
//! do and the memory bound, `apply`'s `Lanes` for the ordering rules).
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
mod lanes;
pub mod meta;
pub mod subvol;
pub mod target;

use std::fmt;
use std::io::{self, Read};

use std::path::{Path, PathBuf};

use stream_format::{
    Command, CommandInfo, CommandKind, DecodeError, Next, ReaderOptions, StreamReader,
};

pub use apply::{RESUME_DIR, Receiver, TokenError as ResumeTokenError, resume_token};
use target::TargetError;

use crate::types::Uuid;

/// Where a receive reports what it is doing: the crate's one [`Progress`]
/// interface (receive reports `position`, `subvol_start`/`subvol_done`,
/// `note` and `error`; the CLI draws a progress bar and prints notes).
pub use crate::progress::{NoProgress, Progress};

/// How to receive.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReceiveOptions {
    /// Receive subvolumes as real btrfs subvolumes where DIR is on btrfs
    /// and btrsend runs as root (default true; see [`subvol`]); false:
    /// always as directories with records in `DIR/.btrsend/`.
    pub subvolumes: bool,
    /// The mount root that subvolume paths found by UUID are relative to
    /// (`-m`); default: the mount point of DIR.
    pub root_mount: Option<PathBuf>,
    /// Stop at the N-th error; 0 = never (`-E`, default 1).
    pub max_errors: u64,
    /// Stop after the first END (`-e`).
    pub stop_at_end: bool,
    /// Decode compressed ENCODED_WRITE data even where the target could take
    /// it as it is (`--force-decompress`).
    pub force_decompress: bool,
    /// Worker threads that write file data (`--threads`); 0 or 1: every
    /// command is applied on the receiving thread. See [`receive`].
    pub threads: usize,
    /// Bytes of stream between two resume checkpoints of a subvolume
    /// (default [`crate::resume::CHECKPOINT_BYTES`], 48 MiB; the design is
    /// in [`crate::resume`]). 0: no checkpoints, for a one-shot receive
    /// that is never resumed (e.g. a restore from a stream that can simply
    /// be received again): no snapshots or `syncfs` on the way, no undo
    /// journal; an interrupted receive then leaves its subvolume
    /// incomplete with no resume point (delete it and receive it again).
    /// A larger interval makes fewer checkpoints and more stream sent
    /// again after an interruption (at most the interval plus 16 MiB).
    pub checkpoint_interval: u64,
}

impl ReceiveOptions {
    /// The defaults: stop at the first error, read every concatenated stream.
    pub const fn new() -> ReceiveOptions {
        ReceiveOptions {
            subvolumes: true,
            root_mount: None,
            max_errors: 1,
            stop_at_end: false,
            force_decompress: false,
            threads: DEFAULT_THREADS,
            checkpoint_interval: crate::resume::CHECKPOINT_BYTES,
        }
    }
}

/// Default of [`ReceiveOptions::threads`].
pub const DEFAULT_THREADS: usize = 2;

/// Bytes of file data queued to the worker threads at most (the memory
/// bound of a receive with threads, besides the read-ahead).
pub const MAX_QUEUED_DATA: usize = lanes::MAX_IN_FLIGHT;

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
    /// SUBVOL / SNAPSHOT: `DIR/<name>` exists already and its record says
    /// an earlier receive of it did not finish.
    ExistsIncomplete {
        /// `DIR/<name>`.
        dir: PathBuf,
        /// Its record.
        record: PathBuf,
    },
    /// SUBVOL / SNAPSHOT: `DIR/<name>` exists already as a real subvolume
    /// that an earlier receive left incomplete (writable, no received
    /// UUID).
    ExistsIncompleteSubvol {
        /// `DIR/<name>`.
        dir: PathBuf,
    },
    /// SUBVOL / SNAPSHOT: the record of the new subvolume could not be
    /// written (e.g. the disk is full); the new, empty `DIR/<name>` and the
    /// temporary record were removed again.
    RecordWrite(io::Error),
    /// No received subvolume has this UUID.
    ParentMissing {
        /// The UUID asked for.
        uuid: Uuid,
        /// The ctransid asked for.
        ctransid: u64,
        /// A SNAPSHOT's parent (else a CLONE's source).
        parent: bool,
    },
    /// No subvolume of DIR's btrfs has this received UUID or UUID, and none
    /// was received into DIR as a directory.
    NotOnFilesystem {
        /// The UUID asked for.
        uuid: Uuid,
        /// The ctransid asked for.
        ctransid: u64,
        /// The mount root searched from.
        mount: PathBuf,
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
    /// MKNOD of a character or block device as an ordinary user (it needs
    /// `CAP_MKNOD`).
    DeviceNeedsRoot,
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
            ApplyErrorKind::ExistsIncomplete { dir, record } => write!(
                f,
                "subvolume directory exists already, and its record {} says it is incomplete \
                 (an earlier receive was interrupted or failed): to receive it again, delete \
                 {} and {}",
                record.display(),
                dir.display(),
                record.display()
            ),
            ApplyErrorKind::ExistsIncompleteSubvol { dir } => write!(
                f,
                "subvolume exists already and is incomplete (writable, no received UUID: an \
                 earlier receive was interrupted or failed) and has no resume point for this \
                 stream: to receive it again, delete it (btrfs subvolume delete {})",
                dir.display()
            ),
            ApplyErrorKind::RecordWrite(e) => write!(
                f,
                "cannot write the subvolume's record: {e} (nothing was received: the new \
                 subvolume directory was removed again)"
            ),
            ApplyErrorKind::ParentMissing { uuid, ctransid, parent } => write!(
                f,
                "cannot find {} with uuid {uuid} ctransid {ctransid}: it was not received into this directory",
                what(*parent)
            ),
            ApplyErrorKind::NotOnFilesystem { uuid, ctransid, mount, parent } => write!(
                f,
                "cannot find {} with uuid {uuid} ctransid {ctransid}: no subvolume of the btrfs mounted at {} has it as received UUID or UUID, and none was received into this directory",
                what(*parent),
                mount.display()
            ),
            ApplyErrorKind::ParentIncomplete { uuid, ctransid, name, parent } => write!(
                f,
                "{} with uuid {uuid} ctransid {ctransid} ({}) was received incompletely: refusing to use it",
                what(*parent),
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
            ApplyErrorKind::DeviceNeedsRoot => f.write_str(
                "creating a device node needs root (CAP_MKNOD) and btrsend is not running as root: receive as root, or with --max-errors 0 to receive everything else (the subvolume is then marked incomplete)",
            ),
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

/// Bytes the reader thread asks for with one `read`.
const BLOCK: usize = 1 << 20;
/// Blocks read ahead and not yet decoded (the bounded queue).
const QUEUE_BLOCKS: usize = 8;

/// A block of input read by the reader thread: a buffer of [`BLOCK`] bytes
/// and how many of them were read.
type Block = (Vec<u8>, usize);

/// The reader thread: read the input in blocks of up to [`BLOCK`] bytes and
/// send them in order; stop at the end of the input, after a read error
/// (sent), or when the decoder hangs up. Buffers come back through `empty`
/// to be reused (no allocation, no page faults per block).
fn read_blocks(
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
struct Blocks {
    full: std::sync::mpsc::Receiver<io::Result<Block>>,
    empty: std::sync::mpsc::SyncSender<Vec<u8>>,
    cur: Block,
    pos: usize,
    done: bool,
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

/// Receive every stream in `input` into `dir`.
///
/// The input is read on a thread of its own, in blocks of 1 MiB, up to 8
/// blocks ahead of the decoder (bounded: at most 11 blocks, 11 MiB, exist
/// at once, reused), so the `read` system calls overlap the decoding (CRC-32C)
/// and the applying; the bytes are copied once, into the stream reader's
/// command buffer, as with a `BufReader`. [`receive_file`] reads a regular
/// file straight into the command buffers instead.
///
/// Commands are decoded and checked in order on the calling thread. With
/// [`ReceiveOptions::threads`] > 1, the data of WRITE (8 KiB and more) and
/// ENCODED_WRITE commands is written by that many worker threads, one queue
/// per file, from the command buffer it was read into (no copy), with the
/// commands that follow on the same file (TRUNCATE, FALLOCATE, CHMOD,
/// CHOWN, UTIMES) queued after it; every
/// other command waits for the queued jobs it depends on, and SUBVOL,
/// SNAPSHOT and END wait for all (the rules are in `apply`'s `Lanes`). At
/// most [`MAX_QUEUED_DATA`] bytes of data are queued at once. An error in a
/// queued job names its command, stream offset and path as any other; it is
/// counted against `--max-errors` when the receiving thread sees it, so a
/// few commands after it may have been applied already (the subvolume is
/// marked incomplete all the same).
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
    let mut rx = receiver(dir, opts, progress)?;
    with_read_ahead(input, |blocks| decode_and_apply(&mut rx, blocks, opts))
}

/// A receiver into `dir` set up as `opts` ask (decompression, worker
/// threads).
fn receiver<'p>(
    dir: &Path,
    opts: &ReceiveOptions,
    progress: &'p mut dyn Progress,
) -> Result<Receiver<'p>, ReceiveError> {
    let err = |error| ReceiveError::Dir {
        dir: dir.to_path_buf(),
        error,
    };
    let mut rx = Receiver::new(dir, progress).map_err(err)?;
    if opts.subvolumes && subvol_mode_possible(dir) {
        let b = subvol::Btrfs::open(dir, opts.root_mount.as_deref()).map_err(err)?;
        rx.subvolumes(Some(b));
    }
    rx.force_decompress(opts.force_decompress);
    rx.threads(opts.threads, MAX_QUEUED_DATA).map_err(err)?;
    rx.drop_stale_resume_points();
    Ok(rx)
}

/// Whether subvolumes can be received into `dir` as real btrfs
/// subvolumes: it is on btrfs and btrsend runs as root (the subvolume and
/// tree-search ioctls need `CAP_SYS_ADMIN`).
pub fn subvol_mode_possible(dir: &Path) -> bool {
    rustix::process::geteuid().is_root()
        && target::ReceiveDir::open(dir).is_ok_and(|d| subvol::on_btrfs(d.fd()))
}

/// Bytes read at once from a regular file (commands longer than that are
/// read straight into their buffer).
const FILE_READ: usize = 8 << 10;

/// Receive every stream in `input` into `dir`, as [`receive`]; a regular
/// file is read without a read-ahead thread, anything else (a pipe, a
/// terminal) as [`receive`] does.
///
/// With worker threads ([`ReceiveOptions::threads`] > 1), the WRITE and
/// ENCODED_WRITE commands of a regular file (8 KiB and longer) are
/// *skimmed*: the receiving thread reads their header and PATH and skips
/// the data; the worker that writes the file reads the command from the
/// input (`pread`, into a buffer it reuses), checks its CRC-32C and
/// attributes as the stream reader does and writes the data from that
/// buffer: one copy of the data out of the input's page cache, made by the
/// thread that writes it, and no limit on how far the receiving thread
/// runs ahead (a queued job holds no data), so several files are written at
/// once even though the stream sends them one after the other. A file that
/// shrinks while it is read gives a "truncated" error (it is read, not
/// mapped: no `SIGBUS`); an error found by a worker (CRC mismatch,
/// truncation, a bad attribute) names the command, its stream offset and
/// its path, and is counted as other errors. Commands whose file cannot be
/// given to a worker (several links) are read whole and applied on the
/// receiving thread.
///
/// # Errors
///
/// As [`receive`].
pub fn receive_file(
    input: std::fs::File,
    dir: &Path,
    opts: &ReceiveOptions,
    progress: &mut dyn Progress,
) -> Result<Summary, ReceiveError> {
    let regular = input.metadata().is_ok_and(|m| m.file_type().is_file());
    if !regular {
        return receive(input, dir, opts, progress);
    }
    // A listing of every command needs every command read whole.
    let skim = opts.threads > 1 && !progress.lists_commands();
    let mut rx = receiver(dir, opts, progress)?;
    let len = input.metadata().map_or(0, |m| m.len());
    let input = std::sync::Arc::new(input);
    let file = input.try_clone().map_err(|error| ReceiveError::Dir {
        dir: dir.to_path_buf(),
        error,
    })?;
    let mut src = Skim {
        reader: StreamReader::with_options(
            io::BufReader::with_capacity(FILE_READ, file),
            reader_options(),
        ),
        len,
        on: skim,
    };
    decode_and_apply_from(&mut rx, &mut src, Some(&input), opts)
}

/// Run `f` with `input` read ahead on a thread of its own (see
/// [`receive`]).
fn with_read_ahead<T>(input: impl Read + Send, f: impl FnOnce(Blocks) -> T) -> T {
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

/// Where [`receive_blocks`] gets its input: buffers of the stream, in
/// order, made by the caller (e.g. decompressed), so that they need not be
/// copied into blocks of a reader thread.
pub trait BlockSource {
    /// The next buffer and how many of its first bytes are input; `None`
    /// at the end of the input. An error ends the input.
    fn next_block(&mut self) -> Option<io::Result<(Vec<u8>, usize)>>;
    /// A buffer [`BlockSource::next_block`] gave, decoded, for reuse.
    fn give_back(&mut self, buf: Vec<u8>) {
        drop(buf);
    }
}

/// Receive every stream in the buffers `input` gives into `dir`, as
/// [`receive`] does with what it reads: `input` runs on a thread of its
/// own, at most `queue` buffers ahead of the decoder (at least 1), which
/// copies the commands out of them; each buffer is given back once its
/// bytes are copied.
///
/// # Errors
///
/// As [`receive`].
pub fn receive_blocks(
    input: impl BlockSource + Send,
    queue: usize,
    dir: &Path,
    opts: &ReceiveOptions,
    progress: &mut dyn Progress,
) -> Result<Summary, ReceiveError> {
    let mut rx = receiver(dir, opts, progress)?;
    let queue = queue.max(1);
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel(queue);
    let (empty_tx, empty_rx) = std::sync::mpsc::sync_channel(queue + 2);
    std::thread::scope(|s| {
        s.spawn(move || send_blocks(input, &full_tx, &empty_rx));
        let blocks = Blocks {
            full: full_rx,
            empty: empty_tx,
            cur: (Vec::new(), 0),
            pos: 0,
            done: false,
        };
        // As in `with_read_ahead`: dropping `blocks` ends the thread.
        decode_and_apply(&mut rx, blocks, opts)
    })
}

/// The thread of [`receive_blocks`]: the buffers of `input` in order, the
/// decoded ones given back first; stops at the end, after an error (sent),
/// or when the decoder hangs up.
fn send_blocks(
    mut input: impl BlockSource,
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

/// Read the commands from `input` and apply them (the body of [`receive`]).
fn decode_and_apply(
    rx: &mut Receiver<'_>,
    input: impl Read,
    opts: &ReceiveOptions,
) -> Result<Summary, ReceiveError> {
    let mut src = Whole(StreamReader::with_options(input, reader_options()));
    decode_and_apply_from(rx, &mut src, None, opts)
}

/// Version 3 streams are accepted: ENABLE_VERITY is reported, not refused.
/// Continuation streams (`btrsend send --resume`) are recognised.
fn reader_options() -> ReaderOptions {
    ReaderOptions::new()
        .with_max_version(3)
        .with_continuation(true)
}

/// Where [`decode_and_apply_from`] gets its commands.
trait Source {
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
struct Whole<R>(StreamReader<R>);

/// See [`Source::begin`].
fn begin<R: Read>(r: &mut StreamReader<R>) -> Result<Option<(u32, Vec<u8>)>, DecodeError> {
    let before = r.streams();
    r.at_command()?;
    if r.streams() == before {
        return Ok(None);
    }
    Ok(r.continuation()
        .map(|c| (r.streams().saturating_sub(1), c.to_vec())))
}

impl<R: Read> Source for Whole<R> {
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
struct Skim {
    reader: StreamReader<io::BufReader<std::fs::File>>,
    /// The input's length when the receive started.
    len: u64,
    on: bool,
}

/// Commands at least this long are skimmed.
const SKIM_MIN: u32 = 8192;
/// Payload bytes read of a skimmed command: room for a PATH of `PATH_MAX`
/// bytes and the attributes before it.
const SKIM_PREFIX: usize = 4096 + 64;

impl Source for Skim {
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
fn read_payload(input: &std::fs::File, info: &CommandInfo) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    read_payload_into(input, info, &mut buf)?;
    Ok(buf)
}

/// [`read_payload`] into `buf` (reused): as much of the payload as there
/// is, so a short one (the input shrank) is the decoder's "truncated
/// command" error.
pub(crate) fn read_payload_into(
    input: &std::fs::File,
    info: &CommandInfo,
    buf: &mut Vec<u8>,
) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = usize::try_from(info.len).unwrap_or(usize::MAX);
    buf.resize(len, 0);
    let at = info
        .offset
        .saturating_add(stream_format::CMD_HEADER_SIZE as u64);
    let mut got = 0;
    while let Some(rest) = buf.get_mut(got..).filter(|r| !r.is_empty()) {
        match input.read_at(rest, at.saturating_add(got as u64)) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(())
}

/// The body of [`receive`] and [`receive_file`]: read the commands from
/// `reader` and apply them; `input` is the input file when `reader` skims.
fn decode_and_apply_from(
    rx: &mut Receiver<'_>,
    reader: &mut dyn Source,
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

/// Remove what a receive into `dir` made of the subvolume `name`: the
/// subvolume (a real one, as [`receive`] makes where
/// [`subvol_mode_possible`]) or the directory with its record, and its
/// resume point. For a caller that must leave nothing of a receive it
/// stopped (`backup restore` after finding damage); `name` must be one
/// that receive reported with [`Progress::subvol_start`] (it made it).
///
/// # Errors
///
/// The OS error, naming the path it concerns.
pub fn discard(dir: &Path, name: &[u8]) -> io::Result<()> {
    use std::ffi::OsStr;
    use std::os::fd::AsFd;
    use std::os::unix::ffi::OsStrExt;

    use rustix::fs::{AtFlags, Mode, OFlags};

    let rdir = target::ReceiveDir::open(dir)?;
    let path = rdir.display_path(name);
    let named = |e: io::Error, p: &Path| meta::with_path(e, p);
    let os = OsStr::from_bytes(name);
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    // The resume point first: its checkpoints are snapshots of `name`.
    let resume = rdir.display_path(RESUME_DIR.as_bytes());
    if let Ok(top) = rustix::fs::openat(rdir.fd(), RESUME_DIR, flags, Mode::empty())
        && let Ok(points) = rustix::fs::openat(&top, os, flags, Mode::empty())
    {
        let mut ckpts = Vec::new();
        let mut it = rustix::fs::Dir::read_from(&points).map_err(|e| named(e.into(), &resume))?;
        while let Some(Ok(e)) = it.next() {
            let n = e.file_name().to_bytes();
            if n.starts_with(b"ckpt-") {
                ckpts.push(n.to_vec());
            }
        }
        for n in ckpts {
            crate::sys::snap_destroy(points.as_fd(), &n).map_err(|e| named(e.into(), &resume))?;
        }
        // A directory-mode resume point: its undo journal and trash.
        apply::drop_journals(&points, None);
        for f in apply::STATE_FILES {
            match rustix::fs::unlinkat(&points, f, AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(named(e.into(), &resume)),
            }
        }
        drop(points);
        rustix::fs::unlinkat(&top, os, AtFlags::REMOVEDIR).map_err(|e| named(e.into(), &resume))?;
        // Only if no other subvolume has a resume point.
        let _ = rustix::fs::unlinkat(rdir.fd(), RESUME_DIR, AtFlags::REMOVEDIR);
    }
    if subvol_mode_possible(dir) {
        let d = subvol::reopen_dir(rdir.fd()).map_err(|e| named(e, dir))?;
        return match crate::sys::snap_destroy(d.as_fd(), name) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(named(e.into(), &path)),
        };
    }
    match std::fs::remove_dir_all(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(named(e, &path)),
    }
    let record = meta::Records::open(&rdir)?.path_of(name);
    match std::fs::remove_file(&record) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(named(e, &record)),
    }
    // Only if no other record is there.
    let _ = rustix::fs::unlinkat(
        rdir.fd(),
        OsStr::from_bytes(target::RESERVED_NAME),
        AtFlags::REMOVEDIR,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that returns at most `step` bytes per read, then `err` (if
    /// any) instead of the end.
    struct Choppy {
        data: Vec<u8>,
        pos: usize,
        step: usize,
        err: bool,
    }

    impl Read for Choppy {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let left = self.data.len() - self.pos;
            if left == 0 && self.err {
                return Err(io::Error::other("broken input"));
            }
            let n = buf.len().min(self.step).min(left);
            buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    #[test]
    fn discard_removes_a_directory_mode_resume_point_with_its_journal_and_trash() {
        let d = tempfile::tempdir().unwrap();
        if subvol_mode_possible(d.path()) {
            return;
        }
        let points = d.path().join(RESUME_DIR).join("s");
        std::fs::create_dir_all(points.join("trash-5/t0/deep")).unwrap();
        std::fs::write(points.join("trash-5/t0/deep/f"), b"x").unwrap();
        std::fs::write(points.join("undo-5"), b"bsundo01").unwrap();
        std::fs::write(points.join("state"), b"token").unwrap();
        std::fs::create_dir_all(d.path().join("s/a")).unwrap();
        discard(d.path(), b"s").unwrap();
        assert!(!d.path().join(RESUME_DIR).exists());
        assert!(!d.path().join("s").exists());
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4099) as u8).collect()
    }

    #[test]
    fn read_ahead_passes_every_byte_in_order() {
        // Over several blocks, with buffers reused: full-block reads, short
        // (pipe-like) reads, and readers asking for odd sizes.
        let want = data(3 * BLOCK + 12345);
        for (step, ask) in [(usize::MAX, 10), (65536, 131_094), (1000, 3 * BLOCK)] {
            let input = Choppy {
                data: want.clone(),
                pos: 0,
                step,
                err: false,
            };
            let got = with_read_ahead(input, |mut b| {
                let mut got = Vec::new();
                let mut buf = vec![0; ask];
                loop {
                    let n = b.read(&mut buf).unwrap();
                    if n == 0 {
                        break got;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
            });
            assert!(got == want, "step {step} ask {ask}: {} bytes", got.len());
        }
    }

    #[test]
    fn read_ahead_passes_errors_and_stops_early() {
        let input = Choppy {
            data: data(BLOCK + 5),
            pos: 0,
            step: usize::MAX,
            err: true,
        };
        let e = with_read_ahead(input, |mut b| {
            let mut v = Vec::new();
            b.read_to_end(&mut v).unwrap_err()
        });
        assert_eq!(e.to_string(), "broken input");
        // The decoder stops after a few bytes of a long input: the reader
        // thread ends (this returns) without reading it all.
        let input = Choppy {
            data: data(64 * BLOCK),
            pos: 0,
            step: usize::MAX,
            err: false,
        };
        let first = with_read_ahead(input, |mut b| {
            let mut x = [0u8; 4];
            b.read_exact(&mut x).unwrap();
            x
        });
        assert_eq!(first.to_vec(), data(4));
    }
}
