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
//!
//! The rooms: this file holds the queue and the ordered writer; `jobs`
//! the data jobs and the worker threads; `skip` continuing a stream
//! (dropping what was sent, cutting a straddling command); `trail` what a
//! send wrote, for a send planned again after a relocation.

use std::collections::VecDeque;
use std::io::Write;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, TryRecvError};

use stream_format::{Command, StreamWriter};

use crate::fs::{Compression, ExtentData, FileExtent, FsTree, InlineData};
use crate::tree::buf::BlockBuf;

use super::error::SendError;

mod jobs;
mod skip;
mod trail;

use jobs::{Job, Read, Reply, Task};
pub(crate) use jobs::{Workers, spawn_workers};
use skip::ident;
pub(crate) use skip::{Discard, IdentChain, Skip};
pub(crate) use trail::{DataOp, Trail, layout_dependent};

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
mod tests;
