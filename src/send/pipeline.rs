//! The send pipeline: the planner hands every command to a [`Pipeline`] in
//! stream order; the file data of WRITE and ENCODED_WRITE commands is read
//! (verified, decompressed) by data jobs on a small rayon pool of worker
//! threads, ahead of the one ordered writer, which writes every command in the
//! planner's order as soon as the commands and data before it are out.
//!
//! ```text
//! tree walk → planner ──commands──────────────→ queue → writer → stream
//!                     └─jobs→ workers (read, verify, decompress) ↗
//! ```
//!
//! The writer runs on the planner's thread (the output need not be `Send`):
//! whenever the planner queues something, the writer first writes what is
//! ready at the head of the queue, without waiting; it waits for a job only
//! when the queue is full. A full queue holds [`MAX_QUEUED_BYTES`] of data
//! and commands (each entry charged its data buffer or encoded size plus
//! [`ENTRY_OVERHEAD`]; the commands without data queued one after
//! another are packed, encoded, into one entry, each charged alike) or
//! [`MAX_QUEUED_ENTRIES`] entries; one job reads at
//! most [`JOB_BYTES`] (a compressed extent is decoded whole: at most 128
//! KiB). Written data buffers are kept for the next jobs while the queue
//! and the kept buffers stay within [`MAX_QUEUED_BYTES`] together (fresh
//! buffers cost page faults). So memory stays bounded whatever the
//! snapshot's size.
//!
//! Errors keep the stream's order: a job's read error is reported when the
//! writer reaches its command (with the inode, path and file offset), after
//! everything before it was written; a planner error comes after the queued
//! commands before it were written (or the first error among them).
//!
//! With no worker threads the jobs run on the planner's thread when queued
//! (the single-threaded send); so do small plain reads
//! ([`INLINE_BELOW`]), which cost less than a hand-over.

use std::collections::VecDeque;
use std::io::Write;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};

use stream_format::{Command, StreamWriter};

use crate::fs::{Compression, ExtentData, FileExtent, FsTree, InlineData};
use crate::resume::Shape as Chain;
use crate::tree::buf::BlockBuf;

use super::error::SendError;

/// Bytes of queued data and commands before the writer waits for the
/// oldest job.
pub(crate) const MAX_QUEUED_BYTES: u64 = 16 << 20;
/// Entries queued before the writer waits for the oldest job.
pub(crate) const MAX_QUEUED_ENTRIES: usize = 16384;
/// Bytes charged to each queued entry besides its data.
pub(crate) const ENTRY_OVERHEAD: u64 = 128;
/// Largest read of one data job (rounded down to whole WRITE commands).
pub(crate) const JOB_BYTES: u64 = 256 << 10;
/// Plain reads (no checksums to verify, nothing to decompress) shorter
/// than this run on the writer's thread when queued.
pub(crate) const INLINE_BELOW: u64 = 64 << 10;
/// Jobs go to the workers in batches of this many bytes or
/// [`BATCH_JOBS`] jobs (small reads from the page cache cost less than
/// handing them to another thread one by one).
pub(crate) const BATCH_BYTES: u64 = 256 << 10;
/// See [`BATCH_BYTES`].
pub(crate) const BATCH_JOBS: usize = 64;
/// Spare data buffers kept for reuse (they count in
/// [`MAX_QUEUED_BYTES`] with the queue).
pub(crate) const POOL_BUFFERS: usize = 256;
/// The buffers of written [`Entry::Encoded`]s kept for the next ones
/// hold at most this many bytes (a few hundred bytes each for a small
/// file's commands: a batch of data jobs' worth of entries).
pub(crate) const SPARE_ENCODED_BYTES: usize = 256 << 10;
/// Worker threads when the options do not say
/// (`BTRSEND_SEND_THREADS` changes it, for benchmarks).
pub(crate) const DEFAULT_THREADS: usize = 4;

/// What a job produces: the bytes, or the read error.
type Reply = crate::Result<Vec<u8>>;

/// What a data job reads.
#[derive(Debug)]
enum Read {
    /// File bytes `[offset, offset + len)` of the extent.
    Range { offset: u64, len: u64 },
    /// The extent's encoded bytes as stored.
    Raw,
}

/// One data job: read (verify, decompress) part of an extent of an inode
/// into `buf` (a reused buffer).
#[derive(Debug)]
struct Job {
    ino: u64,
    ext: FileExtent,
    read: Read,
    buf: Vec<u8>,
}

impl Job {
    fn run(self, tree: &FsTree<'_>, verify: bool) -> Reply {
        let r = tree.extent_reader(self.ino, verify);
        match self.read {
            Read::Range { offset, len } => {
                // Every byte is written by the read: a reused buffer needs
                // no clearing.
                let mut buf = self.buf;
                buf.resize(usize::try_from(len).unwrap_or(usize::MAX), 0);
                r.read_at(&self.ext, offset, &mut buf)?;
                Ok(buf)
            }
            Read::Raw => r.raw(&self.ext),
        }
    }
}

/// A batch of jobs for one worker, and where to send their replies (in
/// order).
#[derive(Debug)]
struct Task {
    jobs: Vec<Job>,
    reply: SyncSender<Vec<Reply>>,
}

/// The worker threads' side: the tasks to run. Dropping it lets the
/// workers end (they skip the tasks still queued).
pub(crate) struct Workers {
    tasks: Sender<Task>,
    /// The workers' end of `tasks`, for the writer to take a task itself
    /// rather than sleep while all workers are busy.
    queue: Arc<Mutex<Receiver<Task>>>,
    stop: Arc<AtomicBool>,
}

impl Workers {
    /// The oldest task no worker took yet, unless a worker is taking one.
    fn steal(&self) -> Option<Task> {
        self.queue.try_lock().ok()?.try_recv().ok()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Start `threads` workers in `scope` (of a rayon pool with as many
/// threads) reading `tree`'s data (verified with `verify`).
pub(crate) fn spawn_workers<'env>(
    scope: &rayon::Scope<'env>,
    tree: &'env FsTree<'env>,
    verify: bool,
    threads: usize,
) -> Workers {
    let (tx, rx) = mpsc::channel::<Task>();
    let rx = Arc::new(Mutex::new(rx));
    let stop = Arc::new(AtomicBool::new(false));
    for _ in 0..threads {
        let rx = Arc::clone(&rx);
        let stop = Arc::clone(&stop);
        scope.spawn(move |_| {
            loop {
                // The lock is held only to take one task.
                let task = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                let Ok(task) = task else { break };
                if stop.load(Ordering::Relaxed) {
                    continue;
                }
                let replies = task.jobs.into_iter().map(|j| j.run(tree, verify));
                // The writer may have gone (an earlier error): nobody waits.
                let _ = task.reply.send(replies.collect());
            }
        });
    }
    Workers {
        tasks: tx,
        queue: rx,
        stop,
    }
}

/// Where a queued entry's data comes from.
enum Pending {
    /// Zeros (holes and prealloc ranges of v1 and incremental streams).
    Zeros,
    /// Read already.
    Ready(Reply),
    /// These bytes of plain inline data, as they are in the leaf (or the
    /// extent's own copy).
    Inline(InlineData, Range<usize>),
    /// The next reply of the batches, in order.
    Batched,
}

/// What the writer makes of an entry's data.
enum Shape {
    /// WRITE commands of `[offset, offset + len)`, at most `max_read`
    /// bytes each.
    Writes {
        path: Vec<u8>,
        offset: u64,
        len: u64,
    },
    /// This ENCODED_WRITE with the data filled in.
    Encoded(Command<'static>),
}

enum Entry {
    Cmd(Command<'static>),
    /// Commands without data encoded already, one after another: the
    /// planner's commands queued behind a data entry, packed into one
    /// buffer (no owned copy of each command, no entry each).
    Encoded(Encoded),
    Data {
        ino: u64,
        shape: Shape,
        data: Pending,
    },
}

/// Whole commands without data, encoded, and where each ends in `bytes`.
#[derive(Default)]
struct Encoded {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Encoded {
    /// The bytes its buffers hold.
    fn capacity(&self) -> usize {
        self.bytes
            .capacity()
            .saturating_add(self.ends.capacity().saturating_mul(size_of::<usize>()))
    }
}

/// The planner's output: commands in stream order, data read ahead in
/// parallel, one ordered writer (see the module doc).
pub(crate) struct Pipeline<'t, W: Write> {
    out: StreamWriter<W>,
    tree: &'t FsTree<'t>,
    verify: bool,
    /// Largest WRITE (`max_send_read_size`).
    max_read: u64,
    workers: Option<Workers>,
    queue: VecDeque<(Entry, u64)>,
    /// Bytes charged to the queued entries.
    queued: u64,
    /// Jobs not yet handed to the workers, and their bytes.
    open: Vec<Job>,
    open_bytes: u64,
    /// The batches handed to the workers, oldest first.
    sent: VecDeque<Receiver<Vec<Reply>>>,
    /// The replies of the oldest batch not yet written.
    replies: VecDeque<Reply>,
    /// Spare data buffers, and their bytes.
    pool: Vec<Vec<u8>>,
    pool_bytes: u64,
    /// The leaf the last inline entry queued keeps alive (its size is
    /// charged to the first entry of a run in one leaf; held, so that a
    /// later leaf cannot take its address and go uncharged).
    last_block: Option<Arc<BlockBuf>>,
    /// One WRITE's worth of zeros.
    zeros: Vec<u8>,
    /// An error was returned: nothing more is written.
    failed: bool,
    /// Commands written (or counted), by command number.
    counts: CommandCounts,
    /// An estimate ([`Pipeline::sizing`]): the bytes of the commands
    /// counted; nothing is read or written.
    sizing: Option<u64>,
    /// Resuming: the commands before the resume point are dropped.
    skip: Option<Skip>,
    /// Sets the cut of a straddling command (resuming only).
    cut: Option<fn(&mut W, u64)>,
    /// What is written, for a continuation (see [`Trail`]).
    trail: Option<&'t std::cell::RefCell<Trail>>,
    /// Encodes commands for their identity (see [`ident`]).
    ident_buf: Option<StreamWriter<Vec<u8>>>,
    /// Encodes queued commands (see [`Entry::Encoded`]).
    enc: Option<StreamWriter<Vec<u8>>>,
    /// The buffers of [`Entry::Encoded`]s written, for the next ones
    /// (kept while they hold at most [`SPARE_ENCODED_BYTES`] together), and
    /// those bytes.
    spares: Vec<Encoded>,
    spare_bytes: usize,
}

/// A command's identity for a [`Trail`]: its encoding without its file
/// data, and the data's length (`data_len` more bytes not in `cmd`), in
/// `buf`'s buffer.
fn ident<'b>(
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
/// counted (their shape and length, as [`Pipeline::sizing`] counts them:
/// no file data is read) and dropped; a command that straddles `until` is
/// written with its first bytes cut off by the [`Discard`] writer.
#[derive(Debug, Clone)]
pub(crate) struct Skip {
    /// Stream offset to continue from.
    pub(crate) until: u64,
    /// Stream offset and index of the next command planned.
    pos: u64,
    index: u64,
    shape: Chain,
    /// Continuing a [`Trail`]: the identity chain of the commands from this
    /// stream offset on.
    ident: Option<(u64, IdentChain)>,
    /// Points the dropped commands must match, by stream offset.
    checks: Vec<Check>,
    done: bool,
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
    fn push(&mut self, id: &[u8]) {
        self.0.update(id);
    }

    fn digest(&self) -> [u8; 16] {
        self.0.digest128().to_le_bytes()
    }
}

/// A point a resumed stream must have: a command boundary at stream offset
/// `at`, with `index` commands before it, whose shape chain (a resume
/// token's) or identity chain (a [`Trail`]'s) is this.
#[derive(Debug, Clone)]
struct Check {
    at: u64,
    index: u64,
    shape: Option<Chain>,
    ident: Option<[u8; 16]>,
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
    fn verify(&mut self) -> Result<(), SendError> {
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
    fn straddled(&self) -> Result<(), SendError> {
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

/// What a send wrote so far, kept across the attempts of one mounted send
/// (see [`super::mounted`]) so that a send planned again after a balance
/// moved blocks can continue the same stream: where it stopped, an
/// identity chain of the commands written, and the data commands made for
/// each extent with data on disk.
///
/// The stream btrfs and btrsend make depends on the layout: which of the
/// references to a shared extent a CLONE names follows the order of its
/// back references, which a relocation changes (it rewrites them as shared
/// references keyed by the new tree blocks' addresses); whether a source
/// shares an extent is decided by extent addresses, which a relocation in
/// progress may give to one tree before another; a relocation may also
/// split extents. So a send planned again after a balance may make other
/// commands before the point where the first one stopped. The data
/// commands of an extent before that point are therefore made again as
/// they were (when the extent still has the same shape; inline extents
/// and holes need no record, see [`layout_dependent`]), and the commands
/// dropped must be the very ones written (identity chain: each command as
/// encoded, without its file data, whose bytes its path, offset and length
/// fix), else the continuation is refused.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trail {
    /// Stream offset after the last command written (a command boundary).
    pub(crate) pos: u64,
    /// Index of the next command.
    pub(crate) index: u64,
    /// Identity chain of the commands written from stream offset `from` on.
    pub(crate) ident: IdentChain,
    /// Where the first attempt started writing commands, and the index of
    /// the command there.
    pub(crate) from: u64,
    from_index: u64,
    /// A command was written cut: the trail cannot be continued.
    pub(crate) broken: bool,
    /// The data commands made for each extent whose commands depend on
    /// the layout (see [`layout_dependent`]), sorted by (inode, file
    /// offset) of the extent, at most [`TRAIL_EXTENTS_MAX`].
    extents: Vec<TrailExtent>,
}

/// One extent's data commands in a [`Trail`], in 48 bytes: most extents
/// have one WRITE, kept inline; the others a boxed list.
#[derive(Debug, Clone)]
struct TrailExtent {
    ino: u64,
    file_offset: u64,
    /// A digest of the extent's shape (see [`shape_digest`]).
    shape: u64,
    ops: TrailOps,
}

/// The data commands of a [`TrailExtent`].
#[derive(Debug, Clone)]
enum TrailOps {
    /// One [`DataOp::Write`].
    Write { offset: u64, len: u64 },
    /// Any other list.
    List(Box<[DataOp]>),
}

impl TrailOps {
    fn new(ops: Vec<DataOp>) -> TrailOps {
        match ops.as_slice() {
            &[DataOp::Write { offset, len }] => TrailOps::Write { offset, len },
            _ => TrailOps::List(ops.into_boxed_slice()),
        }
    }

    fn to_vec(&self) -> Vec<DataOp> {
        match self {
            TrailOps::Write { offset, len } => vec![DataOp::Write {
                offset: *offset,
                len: *len,
            }],
            TrailOps::List(ops) => ops.to_vec(),
        }
    }
}

/// A digest of what identifies an extent item's data beside its key: its
/// kind, encoding and the range of the disk extent it covers (a
/// relocation may split an extent: then the recorded commands are not
/// reused). A collision (odds 2^-64) can only reuse commands that then
/// fail the identity chain: the continuation is refused, never wrong.
fn shape_digest(ext: &FileExtent) -> u64 {
    use std::hash::{Hash, Hasher};
    let shape = match &ext.data {
        ExtentData::Inline(b) => (
            0u8,
            ext.compression,
            ext.ram_bytes,
            u64::try_from(b.len()).unwrap_or(u64::MAX),
            0,
            0,
        ),
        ExtentData::Regular(d) | ExtentData::Prealloc(d) => (
            if matches!(ext.data, ExtentData::Regular(_)) {
                1
            } else {
                2
            },
            ext.compression,
            ext.ram_bytes,
            d.disk_num_bytes,
            d.offset,
            d.num_bytes,
        ),
    };
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    shape.hash(&mut h);
    h.finish()
}

/// Whether the data commands of `ext` may differ after a relocation:
/// only an extent with data on disk has back references, whose order
/// picks a clone source, and an address, by which sources share it. The
/// commands of an inline extent or a hole follow from the item and the
/// inode alone, which a relocation leaves as they are: planned again,
/// they are the very commands written, so a [`Trail`] need not keep them
/// (in a tree of small files, nearly every extent).
pub(crate) fn layout_dependent(ext: &FileExtent) -> bool {
    ext.disk().is_some_and(|d| d.disk_bytenr.get() != 0)
}

/// One command made for an extent's data (see [`Trail`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataOp {
    /// Its bytes `[offset, offset + len)` (WRITE, ENCODED_WRITE or
    /// UPDATE_EXTENT commands).
    Write { offset: u64, len: u64 },
    /// CLONE of `[offset, offset + len)` from `src` (inode, offset, clone
    /// root index).
    Clone {
        offset: u64,
        len: u64,
        src: (u64, u64, usize),
    },
    /// TRUNCATE to `size`.
    Truncate { size: u64 },
}

/// Extents whose commands a [`Trail`] keeps at most: 48 bytes each, 6 MiB
/// (plus the lists of extents with more than one command). Past it, an
/// extent's commands are planned afresh when a send is continued: the
/// continuation is refused ([`SendError::Replanned`]) if a relocation
/// changed them.
pub(crate) const TRAIL_EXTENTS_MAX: usize = 1 << 17;

impl Trail {
    /// A trail of a stream whose commands start at stream offset `from`
    /// with command `index`.
    pub(crate) fn new(from: u64, index: u64) -> Trail {
        Trail {
            pos: from,
            index,
            from,
            from_index: index,
            ..Trail::default()
        }
    }

    /// Record a command without file data, written as `encoded`: its
    /// stream length and its identity are that encoding (see [`ident`]).
    fn record_plain(&mut self, encoded: &[u8]) {
        self.pos = self
            .pos
            .saturating_add(u64::try_from(encoded.len()).unwrap_or(u64::MAX));
        self.index += 1;
        self.ident.push(encoded);
        self.ident.push(&0u64.to_le_bytes());
    }

    /// Keep `ops`, the data commands made for `ext` of `ino`, unless
    /// the trail is full or has the extent's commands already.
    fn keep(&mut self, ino: u64, ext: &FileExtent, ops: Vec<DataOp>) {
        if self.extents.len() >= TRAIL_EXTENTS_MAX {
            return;
        }
        let key = (ino, ext.file_offset);
        // A send plans extents in key order: appended, as a rule.
        let at = match self.extents.last() {
            Some(e) if (e.ino, e.file_offset) >= key => {
                match self
                    .extents
                    .binary_search_by_key(&key, |e| (e.ino, e.file_offset))
                {
                    Ok(_) => return,
                    Err(at) => at,
                }
            }
            _ => self.extents.len(),
        };
        self.extents.insert(
            at,
            TrailExtent {
                ino,
                file_offset: ext.file_offset,
                shape: shape_digest(ext),
                ops: TrailOps::new(ops),
            },
        );
    }

    /// The data commands kept for `ext` of `ino`, if its shape is the same.
    fn kept(&self, ino: u64, ext: &FileExtent) -> Option<Vec<DataOp>> {
        let i = self
            .extents
            .binary_search_by_key(&(ino, ext.file_offset), |e| (e.ino, e.file_offset))
            .ok()?;
        let e = self.extents.get(i)?;
        (e.shape == shape_digest(ext)).then(|| e.ops.to_vec())
    }

    /// Back to the start, nothing written (the clone choices are kept).
    pub(crate) fn rewind(&mut self) {
        self.pos = self.from;
        self.index = self.from_index;
        self.ident = IdentChain::default();
        self.broken = false;
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

/// Commands by command number (every number the protocol has fits).
pub type CommandCounts = [u64; 32];

/// What [`Pipeline::finish`] hands back.
pub(crate) struct Finished<W> {
    /// The output.
    pub(crate) out: W,
    /// The stream's length.
    pub(crate) len: u64,
    /// The commands of the stream, END included.
    pub(crate) counts: CommandCounts,
}

impl<'t, W: Write> Pipeline<'t, W> {
    pub(crate) fn new(
        out: StreamWriter<W>,
        tree: &'t FsTree<'t>,
        verify: bool,
        workers: Option<Workers>,
    ) -> Pipeline<'t, W> {
        // max_send_read_size: the send buffer less 16 KiB.
        let max_read = u64::from(stream_format::default_max_command_size(out.version()))
            .saturating_sub(16 * 1024);
        Pipeline {
            out,
            tree,
            verify,
            max_read: max_read.max(1),
            workers,
            queue: VecDeque::new(),
            queued: 0,
            open: Vec::new(),
            open_bytes: 0,
            sent: VecDeque::new(),
            replies: VecDeque::new(),
            pool: Vec::new(),
            pool_bytes: 0,
            last_block: None,
            zeros: Vec::new(),
            failed: false,
            counts: [0; 32],
            sizing: None,
            skip: None,
            cut: None,
            trail: None,
            ident_buf: None,
            enc: None,
            spares: Vec::new(),
            spare_bytes: 0,
        }
    }

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
    fn skipped(&mut self, cmd: &Command<'_>, data_len: u64) -> Result<bool, SendError> {
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
    fn skipped_bytes(&self) -> u64 {
        self.skip.as_ref().map_or(0, |s| s.pos.min(s.until))
    }

    /// A pipeline that only counts: the stream's length and commands as
    /// the planner's output would make them, without reading any file
    /// data or writing anything but the stream header to `out` (`send
    /// --estimate`).
    pub(crate) fn sizing(out: StreamWriter<W>, tree: &'t FsTree<'t>) -> Pipeline<'t, W> {
        let mut p = Pipeline::new(out, tree, false, None);
        p.sizing = Some(0);
        p
    }

    /// Count `cmd`, whose data (if any) is `data_len` bytes not in `cmd`.
    fn count(&mut self, cmd: &Command<'_>, data_len: u64) {
        if let Some(n) = cmd.kind().map(|k| usize::from(k.number()))
            && let Some(c) = self.counts.get_mut(n)
        {
            *c += 1;
        }
        if let Some(bytes) = &mut self.sizing {
            let len = cmd.stream_len(self.out.version()).saturating_add(data_len);
            *bytes = bytes.saturating_add(len);
        }
    }

    /// Queue a command without data.
    pub(crate) fn emit(&mut self, cmd: &Command<'_>) -> Result<(), SendError> {
        if self.sizing.is_some() {
            self.count(cmd, 0);
            return Ok(());
        }
        if self.skip.is_some() && self.skipped(cmd, 0)? {
            return Ok(());
        }
        if self.queue.is_empty() {
            return self.write(cmd);
        }
        let charge = cmd.encoded_len().saturating_add(ENTRY_OVERHEAD);
        self.make_room(charge)?;
        if self.queue.is_empty() {
            return self.write(cmd);
        }
        self.queue_encoded(cmd, charge)
    }

    /// Queue `cmd` (the queue is not empty) encoded, in the
    /// [`Entry::Encoded`] at the back of the queue or a new one. A command
    /// that does not encode is queued as it is: its error comes when the
    /// writer reaches it, in order.
    fn queue_encoded(&mut self, cmd: &Command<'_>, charge: u64) -> Result<(), SendError> {
        let version = self.out.version();
        let enc = match &mut self.enc {
            Some(w) => w,
            None => self.enc.insert(StreamWriter::with_options(
                Vec::with_capacity(512),
                stream_format::WriterOptions::new(version).without_header(),
            )?),
        };
        enc.get_mut().clear();
        if enc.write(cmd).is_err() {
            return self.push(Entry::Cmd(cmd.clone().into_owned()), charge);
        }
        let bytes = enc.get_ref();
        if let Some((Entry::Encoded(e), queued)) = self.queue.back_mut() {
            e.bytes.extend_from_slice(bytes);
            e.ends.push(e.bytes.len());
            *queued = queued.saturating_add(charge);
            self.queued = self.queued.saturating_add(charge);
            return self.pump(false);
        }
        // A new entry's buffers grow with it: the queue's charge (each
        // command's encoded size plus ENTRY_OVERHEAD) covers them.
        let mut e = self.spares.pop().unwrap_or_default();
        self.spare_bytes = self.spare_bytes.saturating_sub(e.capacity());
        e.bytes.extend_from_slice(bytes);
        e.ends.push(e.bytes.len());
        self.push(Entry::Encoded(e), charge)
    }

    /// Queue the WRITEs of `[offset, offset + len)` of inode `ino` at
    /// `path`: the bytes of `ext` (which covers the range), or zeros when
    /// `ext` is `None`.
    pub(crate) fn write_data(
        &mut self,
        ino: u64,
        path: &[u8],
        offset: u64,
        len: u64,
        ext: Option<&FileExtent>,
    ) -> Result<(), SendError> {
        let shape = |offset, len| Shape::Writes {
            path: path.to_vec(),
            offset,
            len,
        };
        if self.sizing.is_some() {
            // The WRITEs write_chunks makes, each counted without its data.
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(self.max_read);
                let cmd = Command::Write {
                    path: path.into(),
                    offset: offset + done,
                    data: (&[][..]).into(),
                };
                self.count(&cmd, n);
                done += n;
            }
            return Ok(());
        }
        let (mut offset, mut len) = (offset, len);
        if self.skip.as_ref().is_some_and(|s| !s.done) {
            // Drop the WRITEs before the resume point, one by one.
            while len > 0 {
                let n = len.min(self.max_read);
                let cmd = Command::Write {
                    path: path.into(),
                    offset,
                    data: (&[][..]).into(),
                };
                if !self.skipped(&cmd, n)? {
                    break;
                }
                offset += n;
                len -= n;
            }
            if len == 0 {
                return Ok(());
            }
        }
        let path_len = u64::try_from(path.len()).unwrap_or(u64::MAX);
        let Some(ext) = ext else {
            let entry = Entry::Data {
                ino,
                shape: shape(offset, len),
                data: Pending::Zeros,
            };
            let charge = path_len.saturating_add(ENTRY_OVERHEAD);
            self.make_room(charge)?;
            return self.push(entry, charge);
        };
        // A compressed or inline extent is decoded whole: one job.
        let whole =
            ext.compression != Compression::None || matches!(ext.data, ExtentData::Inline(_));
        let step = if whole {
            len.max(1)
        } else {
            (JOB_BYTES / self.max_read).max(1) * self.max_read
        };
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(step);
            let at = offset + done;
            let read = Read::Range { offset: at, len: n };
            let entry = |data| Entry::Data {
                ino,
                shape: shape(at, n),
                data,
            };
            self.job(ino, ext, read, n, path_len, entry)?;
            done += n;
        }
        Ok(())
    }

    /// Queue ENCODED_WRITE `cmd` (its data is ignored) with the encoded
    /// bytes of `ext`.
    pub(crate) fn write_encoded(
        &mut self,
        ino: u64,
        cmd: Command<'static>,
        ext: &FileExtent,
    ) -> Result<(), SendError> {
        let len = match &ext.data {
            ExtentData::Inline(b) => u64::try_from(b.len()).unwrap_or(u64::MAX),
            ExtentData::Regular(d) | ExtentData::Prealloc(d) => d.disk_num_bytes,
        };
        if self.sizing.is_some() {
            self.count(&cmd, len);
            return Ok(());
        }
        if self.skip.is_some() && self.skipped(&cmd, len)? {
            return Ok(());
        }
        let other = cmd.encoded_len();
        let entry = |data| Entry::Data {
            ino,
            shape: Shape::Encoded(cmd),
            data,
        };
        if let ExtentData::Inline(b) = &ext.data {
            let e = entry(Pending::Ready(Ok(b.to_vec())));
            let charge = other.saturating_add(len).saturating_add(ENTRY_OVERHEAD);
            self.make_room(charge)?;
            return self.push(e, charge);
        }
        self.job(ino, ext, Read::Raw, len, other, entry)
    }

    /// Queue entry `entry(data)` whose `len` bytes of data a job reads
    /// (charged with `other` more bytes).
    fn job(
        &mut self,
        ino: u64,
        ext: &FileExtent,
        read: Read,
        len: u64,
        other: u64,
        entry: impl FnOnce(Pending) -> Entry,
    ) -> Result<(), SendError> {
        // Plain inline data is in the leaf already: the entry keeps those
        // bytes (and the leaf, charged once for a run of entries in it),
        // with no copy and no job.
        if let (Read::Range { offset, len: n }, ExtentData::Inline(bytes), Compression::None) =
            (&read, &ext.data, ext.compression)
        {
            let within = offset.saturating_sub(ext.file_offset);
            let range = usize::try_from(within).ok().and_then(|a| {
                let b = a.checked_add(usize::try_from(*n).ok()?)?;
                (b <= bytes.len()).then_some(a..b)
            });
            if let Some(range) = range {
                let held = match bytes.block() {
                    Some(b) if !self.last_block.as_ref().is_some_and(|l| Arc::ptr_eq(l, b)) => {
                        self.last_block = Some(Arc::clone(b));
                        u64::try_from(b.len()).unwrap_or(u64::MAX)
                    }
                    _ => 0,
                };
                let charge = len
                    .saturating_add(other)
                    .saturating_add(held)
                    .saturating_add(ENTRY_OVERHEAD);
                self.make_room(charge)?;
                return self.push(entry(Pending::Inline(bytes.clone(), range)), charge);
            }
        }
        let mut buf = match read {
            Read::Range { .. } => self.buffer(len),
            Read::Raw => Vec::new(),
        };
        let data_len = len.max(u64::try_from(buf.capacity()).unwrap_or(u64::MAX));
        let charge = data_len
            .saturating_add(other)
            .saturating_add(ENTRY_OVERHEAD);
        self.make_room(charge)?;
        // Plain inline data past the item's bytes (zeros follow): copied
        // here, with no job handed to a worker.
        if let (Read::Range { offset, .. }, ExtentData::Inline(_), Compression::None) =
            (&read, &ext.data, ext.compression)
        {
            buf.resize(usize::try_from(len).unwrap_or(usize::MAX), 0);
            let r = self.tree.extent_reader(ino, self.verify);
            let data = r.read_at(ext, *offset, &mut buf).map(|()| buf);
            return self.push(entry(Pending::Ready(data)), charge);
        }
        let job = Job {
            ino,
            ext: ext.clone(),
            read,
            buf,
        };
        // A small plain read without verification costs less here than
        // handed to a worker (the OS reads ahead for both).
        let light = matches!(job.read, Read::Range { .. })
            && len < INLINE_BELOW
            && ext.compression == Compression::None
            && !self.verify;
        let data = if self.workers.is_some() && !light {
            self.open.push(job);
            self.open_bytes = self.open_bytes.saturating_add(len);
            if self.open_bytes >= BATCH_BYTES || self.open.len() >= BATCH_JOBS {
                self.submit();
            }
            Pending::Batched
        } else {
            Pending::Ready(job.run(self.tree, self.verify))
        };
        self.push(entry(data), charge)
    }

    /// A spare buffer for `len` bytes: the smallest that holds them, or
    /// none (a new one is made by the job).
    fn buffer(&mut self, len: u64) -> Vec<u8> {
        let need = usize::try_from(len).unwrap_or(usize::MAX);
        // Most reads are alike: the last buffer kept usually fits.
        if let Some(b) = self.pool.last()
            && b.capacity() >= need
            && b.capacity() / 2 <= need
            && let Some(b) = self.pool.pop()
        {
            let cap = u64::try_from(b.capacity()).unwrap_or(u64::MAX);
            self.pool_bytes = self.pool_bytes.saturating_sub(cap);
            return b;
        }
        let best = self
            .pool
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= need)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let b = self.pool.swap_remove(i);
                let cap = u64::try_from(b.capacity()).unwrap_or(u64::MAX);
                self.pool_bytes = self.pool_bytes.saturating_sub(cap);
                b
            }
            None => Vec::new(),
        }
    }

    /// Keep `buf` for another job, if the pool has room: the queue and
    /// the pool together hold at most [`MAX_QUEUED_BYTES`].
    fn recycle(&mut self, buf: Vec<u8>) {
        let cap = u64::try_from(buf.capacity()).unwrap_or(u64::MAX);
        let total = self.pool_bytes.saturating_add(self.queued);
        if cap > 0
            && self.pool.len() < POOL_BUFFERS
            && total.saturating_add(cap) <= MAX_QUEUED_BYTES
        {
            self.pool_bytes += cap;
            self.pool.push(buf);
        }
    }

    /// Hand the open batch to the workers.
    fn submit(&mut self) {
        if self.open.is_empty() {
            return;
        }
        let jobs = std::mem::take(&mut self.open);
        self.open_bytes = 0;
        let (reply, rx) = mpsc::sync_channel(1);
        let task = Task { jobs, reply };
        if let Some(w) = &self.workers
            && let Err(mpsc::SendError(task)) = w.tasks.send(task)
        {
            // No worker left (cannot happen while the scope runs): read
            // here.
            let replies = task.jobs.into_iter().map(|j| j.run(self.tree, self.verify));
            let _ = task.reply.send(replies.collect());
        }
        self.sent.push_back(rx);
    }

    /// The reply for the oldest batched entry: `None` when it is not there
    /// yet and `block` is off.
    fn next_reply(&mut self, block: bool) -> Option<Reply> {
        loop {
            if let Some(r) = self.replies.pop_front() {
                return Some(r);
            }
            let Some(rx) = self.sent.front() else {
                if !block || self.open.is_empty() {
                    return None;
                }
                self.submit();
                continue;
            };
            let mut got = rx.try_recv();
            if block && matches!(got, Err(TryRecvError::Empty)) {
                // Run queued tasks here while the reply is not there
                // (all workers busy, or not scheduled yet), then wait.
                while let Some(task) = self.workers.as_ref().and_then(Workers::steal) {
                    let replies = task.jobs.into_iter().map(|j| j.run(self.tree, self.verify));
                    let _ = task.reply.send(replies.collect());
                    got = match self.sent.front() {
                        Some(rx) => rx.try_recv(),
                        None => break,
                    };
                    if !matches!(got, Err(TryRecvError::Empty)) {
                        break;
                    }
                }
                if matches!(got, Err(TryRecvError::Empty))
                    && let Some(rx) = self.sent.front()
                {
                    got = rx.recv().map_err(|_| TryRecvError::Disconnected);
                }
            }
            match got {
                Ok(replies) => {
                    self.sent.pop_front();
                    self.replies.extend(replies);
                }
                Err(TryRecvError::Empty) => return None,
                Err(TryRecvError::Disconnected) => {
                    // A worker went away without an answer (it panicked).
                    self.sent.pop_front();
                    return Some(Err(crate::Error::corrupt(
                        crate::error::Location::Tree(self.tree.id()),
                        crate::error::CorruptKind::BadField {
                            field: "data job",
                            value: 0,
                            why: "a data reader thread stopped",
                        },
                    )));
                }
            }
        }
    }

    fn push(&mut self, entry: Entry, charge: u64) -> Result<(), SendError> {
        self.queue.push_back((entry, charge));
        self.queued = self.queued.saturating_add(charge);
        self.pump(false)
    }

    /// Write what is ready at the head of the queue; then, while the queue
    /// has no room for `charge` more bytes or one more entry, wait for its
    /// head.
    fn make_room(&mut self, charge: u64) -> Result<(), SendError> {
        self.pump(false)?;
        while !self.queue.is_empty()
            && (self.queued.saturating_add(charge) > MAX_QUEUED_BYTES
                || self.queue.len() >= MAX_QUEUED_ENTRIES)
        {
            self.write_head(true)?;
        }
        Ok(())
    }

    /// Write the head entries that are ready (all of them with `block`).
    fn pump(&mut self, block: bool) -> Result<(), SendError> {
        while !self.queue.is_empty() {
            if !self.write_head(block)? {
                break;
            }
        }
        Ok(())
    }

    /// Write the head entry if it is ready (or, with `block`, once it is);
    /// returns whether it was written.
    fn write_head(&mut self, block: bool) -> Result<bool, SendError> {
        let batched = matches!(
            self.queue.front(),
            Some((
                Entry::Data {
                    data: Pending::Batched,
                    ..
                },
                _
            ))
        );
        let reply = if batched {
            match self.next_reply(block) {
                Some(r) => Some(r),
                None => return Ok(false),
            }
        } else {
            None
        };
        let Some((mut entry, charge)) = self.queue.pop_front() else {
            return Ok(false);
        };
        if let (Some(r), Entry::Data { data, .. }) = (reply, &mut entry) {
            *data = Pending::Ready(r);
        }
        self.queued = self.queued.saturating_sub(charge);
        self.write_entry(entry)?;
        Ok(true)
    }

    fn write_entry(&mut self, entry: Entry) -> Result<(), SendError> {
        let (ino, shape, data) = match entry {
            Entry::Cmd(cmd) => return self.write(&cmd),
            Entry::Encoded(e) => return self.write_packed(e),
            Entry::Data { ino, shape, data } => (ino, shape, data),
        };
        let mut inline = None;
        let bytes = match data {
            Pending::Ready(Ok(b)) => Some(b),
            Pending::Inline(d, r) => {
                inline = Some((d, r));
                None
            }
            Pending::Ready(Err(source)) => {
                let path = match &shape {
                    Shape::Writes { path, .. } => Some(path.clone()),
                    Shape::Encoded(cmd) => cmd.path().map(<[u8]>::to_vec),
                };
                return Err(self.fail(SendError::Fs { ino, path, source }));
            }
            Pending::Zeros | Pending::Batched => None,
        };
        match shape {
            Shape::Encoded(mut cmd) => {
                if let Command::EncodedWrite { data, .. } = &mut cmd {
                    *data = match inline {
                        Some((d, r)) => d.get(r).unwrap_or_default().to_vec(),
                        None => bytes.unwrap_or_default(),
                    }
                    .into();
                }
                self.write(&cmd)
            }
            Shape::Writes { path, offset, len } => {
                let data = match &inline {
                    Some((d, r)) => d.get(r.clone()),
                    None => bytes.as_deref(),
                };
                let res = self.write_chunks(&path, offset, len, data);
                if let Some(b) = bytes {
                    self.recycle(b);
                }
                res
            }
        }
    }

    /// The WRITEs of `[offset, offset + len)`, `max_read` bytes each, with
    /// `data` (zeros when `None`).
    fn write_chunks(
        &mut self,
        path: &[u8],
        offset: u64,
        len: u64,
        data: Option<&[u8]>,
    ) -> Result<(), SendError> {
        let mut zeros = std::mem::take(&mut self.zeros);
        let want = usize::try_from(self.max_read.min(len)).unwrap_or(0);
        if data.is_none() && zeros.len() < want {
            zeros.resize(want, 0);
        }
        let mut done = 0u64;
        let mut res = Ok(());
        while done < len && res.is_ok() {
            let n = (len - done).min(self.max_read);
            let (a, b) = (
                usize::try_from(done).unwrap_or(usize::MAX),
                usize::try_from(n).unwrap_or(usize::MAX),
            );
            let chunk = match data {
                Some(d) => d.get(a..a.saturating_add(b)).unwrap_or_default(),
                None => zeros.get(..b).unwrap_or_default(),
            };
            res = self.write(&Command::Write {
                path: path.into(),
                offset: offset + done,
                data: chunk.into(),
            });
            done += n;
        }
        self.zeros = zeros;
        res
    }

    /// Write the commands of `e` (as [`write`](Self::write) writes each).
    fn write_packed(&mut self, mut e: Encoded) -> Result<(), SendError> {
        if self.failed {
            return Ok(());
        }
        self.out
            .write_encoded(&e.bytes)
            .map_err(|err| self.fail(err.into()))?;
        let mut trail = self.trail.map(|t| t.borrow_mut());
        let mut start = 0;
        for &end in &e.ends {
            let cmd = e.bytes.get(start..end).unwrap_or_default();
            // The command number: bytes 4..6 of its header.
            let number = cmd
                .get(4..6)
                .map_or(0, |n| u16::from_le_bytes([n[0], n[1]]));
            if let Some(c) = self.counts.get_mut(usize::from(number)) {
                *c += 1;
            }
            if let Some(t) = trail.as_mut() {
                t.record_plain(cmd);
            }
            start = end;
        }
        drop(trail);
        let cap = e.capacity();
        if self.spare_bytes.saturating_add(cap) <= SPARE_ENCODED_BYTES {
            e.bytes.clear();
            e.ends.clear();
            self.spare_bytes += cap;
            self.spares.push(e);
        }
        Ok(())
    }

    fn write(&mut self, cmd: &Command<'_>) -> Result<(), SendError> {
        if self.failed {
            return Ok(());
        }
        self.out.write(cmd).map_err(|e| self.fail(e.into()))?;
        self.count(cmd, 0);
        if let Some(t) = self.trail {
            let mut t = t.borrow_mut();
            if matches!(cmd, Command::Write { .. } | Command::EncodedWrite { .. }) {
                let version = self.out.version();
                t.pos = t.pos.saturating_add(cmd.stream_len(version));
                t.index += 1;
                t.ident.push(ident(&mut self.ident_buf, version, cmd, 0)?);
            } else {
                // The command as just written (no second encoding).
                t.record_plain(self.out.last_encoded());
            }
        }
        Ok(())
    }

    /// Stop: drop the queue and the jobs, tell the workers, pass `e` on.
    fn fail(&mut self, e: SendError) -> SendError {
        self.failed = true;
        self.queue.clear();
        self.queued = 0;
        self.open.clear();
        self.sent.clear();
        self.replies.clear();
        if let Some(w) = &self.workers {
            w.stop.store(true, Ordering::Relaxed);
        }
        e
    }

    /// Write everything queued; the first error among it, if any (none
    /// after an error was returned already).
    pub(crate) fn drain(&mut self) -> Result<(), SendError> {
        if self.failed {
            return Ok(());
        }
        self.pump(true)
    }

    /// Write everything queued and END, flush; the output and the stream's
    /// length.
    pub(crate) fn finish(mut self) -> Result<Finished<W>, SendError> {
        self.pump(true)?;
        if self.skip.is_some() && self.skipped(&Command::End, 0)? {
            return Err(SendError::ResumeMismatch(
                "this send's stream ends before the resume point".into(),
            ));
        }
        let end = Command::End.stream_len(self.out.version());
        let len = self
            .out
            .bytes_written()
            .saturating_add(self.sizing.unwrap_or(0))
            .saturating_add(self.skipped_bytes())
            .saturating_add(end);
        self.counts[usize::from(stream_format::CommandKind::End.number())] += 1;
        self.workers = None;
        let counts = self.counts;
        let out = self.out.finish()?;
        Ok(Finished { out, len, counts })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{Compression, DiskExtent};
    use crate::types::{Generation, Logical};

    fn regular(file_offset: u64, disk_bytenr: u64, num_bytes: u64) -> FileExtent {
        FileExtent {
            file_offset,
            generation: Generation(7),
            ram_bytes: num_bytes,
            compression: Compression::None,
            data: ExtentData::Regular(DiskExtent {
                disk_bytenr: Logical(disk_bytenr),
                disk_num_bytes: num_bytes,
                offset: 0,
                num_bytes,
            }),
        }
    }

    #[test]
    fn trail_keeps_each_extents_first_commands_in_any_order() {
        let mut t = Trail::new(0, 0);
        let write = |offset, len| vec![DataOp::Write { offset, len }];
        let clone = vec![
            DataOp::Truncate { size: 4096 },
            DataOp::Clone {
                offset: 4096,
                len: 8192,
                src: (258, 0, 1),
            },
            DataOp::Write {
                offset: 12288,
                len: 100,
            },
        ];
        let (a, b, c) = (
            regular(0, 1 << 20, 4096),
            regular(4096, 2 << 20, 8192),
            regular(0, 3 << 20, 4096),
        );
        t.keep(260, &a, write(0, 4096));
        t.keep(260, &b, clone.clone());
        // Out of order (a continuation records extents it did not keep).
        t.keep(259, &c, write(0, 1000));
        // The first commands stay.
        t.keep(260, &a, write(0, 1));
        assert_eq!(t.kept(260, &a), Some(write(0, 4096)));
        assert_eq!(t.kept(260, &b), Some(clone));
        assert_eq!(t.kept(259, &c), Some(write(0, 1000)));
        assert_eq!(t.kept(261, &a), None);
        // A relocation moved the extent: its commands are reused; it split
        // the extent: they are not.
        assert_eq!(
            t.kept(260, &regular(0, 5 << 20, 4096)),
            Some(write(0, 4096))
        );
        assert_eq!(t.kept(260, &regular(0, 1 << 20, 2048)), None);
        let keys: Vec<_> = t.extents.iter().map(|e| (e.ino, e.file_offset)).collect();
        assert_eq!(keys, [(259, 0), (260, 0), (260, 4096)]);
    }

    #[test]
    fn trail_stops_at_its_cap() {
        let mut t = Trail::new(0, 0);
        let n = u64::try_from(TRAIL_EXTENTS_MAX).unwrap();
        for ino in 256..256 + n + 10 {
            t.keep(
                ino,
                &regular(0, ino << 20, 4096),
                vec![DataOp::Truncate { size: 1 }],
            );
        }
        assert_eq!(t.extents.len(), TRAIL_EXTENTS_MAX);
        assert_eq!(t.kept(256 + n, &regular(0, (256 + n) << 20, 4096)), None);
        assert_eq!(
            t.kept(256 + n - 1, &regular(0, (256 + n - 1) << 20, 4096)),
            Some(vec![DataOp::Truncate { size: 1 }])
        );
    }

    #[test]
    fn only_extents_with_disk_data_depend_on_the_layout() {
        let inline = FileExtent {
            file_offset: 0,
            generation: Generation(7),
            ram_bytes: 3,
            compression: Compression::None,
            data: ExtentData::Inline(b"abc".to_vec().into()),
        };
        assert!(!layout_dependent(&inline));
        assert!(!layout_dependent(&regular(0, 0, 4096)));
        assert!(layout_dependent(&regular(0, 1 << 20, 4096)));
    }

    #[test]
    fn trail_extent_is_48_bytes() {
        assert_eq!(std::mem::size_of::<TrailExtent>(), 48);
    }
}
