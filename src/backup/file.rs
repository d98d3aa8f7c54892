//! The stream file: one btrfs send stream stored as a multi-frame zstd file
//! that plain `zstd -dc FILE` turns back into the raw stream.
//!
//! ```text
//! frame 0 | frame 1 | … | frame N-1 | trailer
//! ```
//!
//! * Each frame is an ordinary zstd frame (with its content size and the
//!   zstd content checksum) holding a run of whole send-stream commands (the
//!   stream header goes with the first); frames are cut at the first command
//!   boundary after [`WriterOptions::frame_bytes`] raw bytes (4 MiB by
//!   default) and compressed on several threads.
//! * The trailer is a zstd *skippable* frame (magic `0x184D2A5E`, which
//!   `zstd -d` skips): 4 bytes magic, 4 bytes little-endian length of what
//!   follows, a JSON object ([`Trailer`]), then 8 bytes little-endian length
//!   of that JSON and the 8 ASCII bytes `BTRSTRL1`. A reader finds it from
//!   the file's last 16 bytes.
//! * The JSON holds the BLAKE3 of the whole raw stream, its length, the
//!   command count, the protocol version, the snapshot's uuid and ctransid,
//!   the parent's (for an incremental stream), and the frame table: for each
//!   frame its offset and length in the file, its raw (decompressed) length
//!   and the BLAKE3 of its stored (compressed) bytes, so a damaged frame is
//!   found before it is decompressed.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use stream_format::{CMD_HEADER_SIZE, STREAM_HEADER_SIZE};

use super::partial::{Checkpoint, Ident};
use super::store::{Store, StoreError, Upload};
use super::treehash::TreeHasher;
use crate::resume::Shape;

/// Magic of the trailer's skippable frame (one of zstd's sixteen).
pub const TRAILER_FRAME_MAGIC: u32 = 0x184D_2A5E;
/// The last 8 bytes of a stream file.
pub const TRAILER_END_MAGIC: &[u8; 8] = b"BTRSTRL1";
/// Bytes after the trailer's JSON: its length and [`TRAILER_END_MAGIC`].
const TRAILER_TAIL: u64 = 16;
/// The skippable frame's header: magic and length.
const SKIPPABLE_HEADER: u64 = 8;
/// The trailer format this code writes.
pub const TRAILER_VERSION: u32 = 1;
/// Largest trailer JSON accepted (a corrupt length must not allocate
/// gigabytes): 64 MiB, room for about 300 000 frames.
const MAX_TRAILER_JSON: u64 = 64 << 20;

/// Largest [`WriterOptions::frame_bytes`] honoured (a frame is cut after
/// the command that crosses it, so readers can bound what they allocate).
pub const MAX_FRAME_BYTES: usize = 256 << 20;

/// One frame of a stream file, as the trailer lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameInfo {
    /// Offset of the frame in the file.
    pub offset: u64,
    /// Its length in the file (compressed).
    pub len: u64,
    /// Its decompressed length.
    pub raw_len: u64,
    /// BLAKE3 of its stored bytes, hex.
    pub blake3: String,
}

/// The trailer: what the stream file holds (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trailer {
    /// Always `btrsend-stream`.
    pub format: String,
    /// [`TRAILER_VERSION`].
    pub version: u32,
    /// Length of the raw stream.
    pub stream_bytes: u64,
    /// BLAKE3 of the raw stream, hex.
    pub stream_blake3: String,
    /// Commands in the stream (END included).
    pub commands: u64,
    /// The stream's protocol version (from its header).
    pub proto: u32,
    /// The snapshot's UUID as the stream carries it.
    pub uuid: String,
    /// Its ctransid.
    pub ctransid: u64,
    /// The parent's UUID for an incremental stream.
    pub parent_uuid: Option<String>,
    /// The parent's ctransid.
    pub parent_ctransid: Option<u64>,
    /// The frames, in file order.
    pub frames: Vec<FrameInfo>,
}

/// What identifies the stream, given by the caller when the file is
/// finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamIdentity {
    /// The snapshot's UUID as the stream carries it.
    pub uuid: String,
    /// Its ctransid.
    pub ctransid: u64,
    /// The parent's UUID and ctransid (an incremental stream).
    pub parent: Option<(String, u64)>,
}

/// How a stream file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriterOptions {
    /// zstd level (1 to 19; default 3, as `zstd` itself).
    pub level: i32,
    /// Raw bytes after which a frame is cut at the next command boundary.
    pub frame_bytes: usize,
    /// Compression threads (at least 1).
    pub threads: usize,
}

impl WriterOptions {
    /// Level 3, 4 MiB frames, 2 threads.
    pub const fn new() -> WriterOptions {
        WriterOptions {
            level: 3,
            frame_bytes: 4 << 20,
            threads: 2,
        }
    }

    /// Set [`WriterOptions::level`].
    pub const fn with_level(mut self, level: i32) -> WriterOptions {
        self.level = level;
        self
    }

    /// Set [`WriterOptions::frame_bytes`] (at most [`MAX_FRAME_BYTES`]).
    pub const fn with_frame_bytes(mut self, n: usize) -> WriterOptions {
        self.frame_bytes = if n > MAX_FRAME_BYTES {
            MAX_FRAME_BYTES
        } else {
            n
        };
        self
    }

    /// Set [`WriterOptions::threads`].
    pub const fn with_threads(mut self, n: usize) -> WriterOptions {
        self.threads = n;
        self
    }
}

impl Default for WriterOptions {
    fn default() -> WriterOptions {
        WriterOptions::new()
    }
}

/// Where the writer is in the raw stream's framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parse {
    /// Inside the 17-byte stream header: bytes of it seen.
    Header(usize),
    /// Inside a command's 10-byte header: bytes of it seen.
    CmdHeader(usize),
    /// Inside a command's payload: bytes left.
    Payload(u64),
}

/// A compressed frame back from a worker: its raw bytes (still to be
/// hashed into the stream's BLAKE3), its stored bytes and their BLAKE3.
struct Done {
    index: u64,
    raw: Vec<u8>,
    data: io::Result<(Vec<u8>, blake3::Hash)>,
    at: FrameEnd,
}

/// Where the stream stands at the end of a frame (for the state a
/// continuation needs, see [`Upload::write_resumable`]).
#[derive(Debug, Clone, Copy, Default)]
struct FrameEnd {
    /// Commands up to the frame's end.
    commands: u64,
    /// Their shape chain (kept only when the upload records state).
    shape: Shape,
    /// The stream's protocol version.
    proto: u32,
}

/// A frame to compress: its index, raw bytes and end.
type Job = (u64, Vec<u8>, FrameEnd);

/// Buffers given back by the writer for the next frames (so that a long
/// stream costs no page faults after its first frames).
#[derive(Default)]
struct Pool {
    raw: Mutex<Vec<Vec<u8>>>,
    stored: Mutex<Vec<Vec<u8>>>,
}

/// Buffers kept in each list of a [`Pool`] at most.
const POOL_KEEP: usize = 8;

impl Pool {
    fn take(list: &Mutex<Vec<Vec<u8>>>) -> Vec<u8> {
        list.lock()
            .ok()
            .and_then(|mut l| l.pop())
            .unwrap_or_default()
    }

    fn give(list: &Mutex<Vec<Vec<u8>>>, mut buf: Vec<u8>) {
        if let Ok(mut l) = list.lock()
            && l.len() < POOL_KEEP
        {
            buf.clear();
            l.push(buf);
        }
    }
}

/// The in-order end of the writer: hashes the raw stream, writes the
/// frames to the upload in order and records them. It runs on a thread of
/// its own (or on the sender's, when no thread could be started).
struct Sink {
    upload: Box<dyn Upload>,
    pending: BTreeMap<u64, (Vec<u8>, Vec<u8>, blake3::Hash, FrameEnd)>,
    next: u64,
    offset: u64,
    raw_offset: u64,
    frames: Vec<FrameInfo>,
    hasher: TreeHasher,
    /// The stream's snapshot, from frame 0's first command (kept only when
    /// the upload records state).
    ident: Option<Ident>,
    pool: Arc<Pool>,
}

impl Sink {
    /// Take a compressed frame and write what is next in order.
    fn push(&mut self, done: Done) -> Result<(), StoreError> {
        let (data, hash) = done.data.map_err(|e| StoreError::Other {
            op: "compress",
            location: String::from("stream"),
            error: Box::new(e),
        })?;
        self.pending
            .insert(done.index, (done.raw, data, hash, done.at));
        while let Some((raw, data, hash, at)) = self.pending.remove(&self.next) {
            self.hasher.update(&raw);
            let records = self.upload.records_state();
            if records && self.next == 0 {
                self.ident = super::partial::ident_of(&raw);
            }
            let len = data.len() as u64;
            self.frames.push(FrameInfo {
                offset: self.offset,
                len,
                raw_len: raw.len() as u64,
                blake3: hash.to_hex().to_string(),
            });
            self.offset += len;
            self.raw_offset += raw.len() as u64;
            if records {
                // The frame ends at a command boundary: a point a later
                // run can continue from, if the store records it.
                let (frames, hasher, ident) = (&self.frames, &self.hasher, &self.ident);
                let (stored, raw_bytes) = (self.offset, self.raw_offset);
                let mut state = || {
                    let ident = ident.as_ref()?;
                    Some(Checkpoint::encode(
                        ident,
                        (at.commands, at.shape, at.proto),
                        frames,
                        (stored, raw_bytes),
                        hasher,
                    ))
                };
                self.upload.write_resumable(&data, &mut state)?;
            } else {
                self.upload.write(&data)?;
            }
            self.next += 1;
            Pool::give(&self.pool.raw, raw);
            Pool::give(&self.pool.stored, data);
        }
        Ok(())
    }
}

/// Where the frames go: worker threads and a writer thread, or (no thread
/// could be started) the sender's own thread.
enum Stage {
    Threads {
        jobs: mpsc::SyncSender<Job>,
        workers: Vec<std::thread::JoinHandle<()>>,
        writer: std::thread::JoinHandle<Result<Sink, StoreError>>,
    },
    Inline(Box<Sink>),
}

/// Writes a raw send stream as a stream file (see the module docs): an
/// [`io::Write`] to hand to the sender, then [`FileWriter::finish`].
///
/// The sender's thread only copies the stream into frames and follows its
/// framing; [`WriterOptions::threads`] workers compress the frames and hash
/// what they store, and a writer thread hashes the raw stream and writes the
/// frames in order.
pub struct FileWriter {
    stage: Option<Stage>,
    opts: WriterOptions,
    /// Raw bytes of the frame being filled.
    buf: Vec<u8>,
    parse: Parse,
    hdr: [u8; CMD_HEADER_SIZE],
    stream_hdr: Vec<u8>,
    proto: Option<u32>,
    commands: u64,
    /// The shape chain of the commands so far (kept only when the upload
    /// records state).
    shape: Option<Shape>,
    raw_bytes: u64,
    next_index: u64,
    pool: Arc<Pool>,
    /// The writer thread's first error, as text for the sender (the error
    /// itself comes back from [`FileWriter::finish`]).
    failed: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for FileWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWriter")
            .field("raw_bytes", &self.raw_bytes)
            .field("frames", &self.next_index)
            .finish_non_exhaustive()
    }
}

/// Start `threads` compression workers and the writer thread; `Err` gives
/// the sink back when they could not be started.
fn start_threads(
    sink: Box<Sink>,
    threads: usize,
    level: i32,
    failed: &Arc<Mutex<Option<String>>>,
) -> Result<Stage, Box<Sink>> {
    if threads == 0 {
        return Err(sink);
    }
    // The writer first, the sink handed over once the workers run too (so
    // that it is still ours if something cannot start).
    let (sink_tx, sink_rx) = mpsc::channel::<Box<Sink>>();
    // Bounded: a writer that falls behind (a slow disk or network, or a
    // starved thread) stops the workers and then the sender, so that what
    // the sender produced and no store holds yet stays within a few frames
    // (it is what a killed run loses and the next one sends again).
    let (done_tx, done_rx) = mpsc::sync_channel::<Done>(threads + 1);
    let failed = Arc::clone(failed);
    let writer = std::thread::Builder::new()
        .name(String::from("btrsend-write"))
        .spawn(move || match sink_rx.recv() {
            Ok(sink) => write_frames(*sink, &done_rx, &failed),
            Err(_) => Err(worker_gone()),
        });
    let Ok(writer) = writer else {
        return Err(sink);
    };
    let (jobs_tx, jobs_rx) = mpsc::sync_channel::<Job>(threads);
    let jobs_rx = Arc::new(Mutex::new(jobs_rx));
    let workers = (0..threads)
        .map(|i| {
            let rx = Arc::clone(&jobs_rx);
            let tx = done_tx.clone();
            let pool = Arc::clone(&sink.pool);
            std::thread::Builder::new()
                .name(format!("btrsend-zstd-{i}"))
                .spawn(move || compress_worker(&rx, &tx, &pool, level))
        })
        .filter_map(Result::ok)
        .collect::<Vec<_>>();
    drop(done_tx);
    if workers.is_empty() {
        drop(sink_tx);
        let _ = writer.join();
        return Err(sink);
    }
    if let Err(mpsc::SendError(sink)) = sink_tx.send(sink) {
        drop(jobs_tx);
        for w in workers {
            let _ = w.join();
        }
        return Err(sink);
    }
    Ok(Stage::Threads {
        jobs: jobs_tx,
        workers,
        writer,
    })
}

/// The writer thread: frames in order into the sink until the workers
/// are done; after an error, the rest is drained (the workers must not
/// block) and the error returned.
fn write_frames(
    mut sink: Sink,
    done: &mpsc::Receiver<Done>,
    failed: &Mutex<Option<String>>,
) -> Result<Sink, StoreError> {
    let mut error = None;
    for d in done {
        if error.is_some() {
            continue;
        }
        if let Err(e) = sink.push(d) {
            if let Ok(mut f) = failed.lock() {
                *f = Some(e.to_string());
            }
            error = Some(e);
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(sink),
    }
}

/// What a stream file's writer continues from: the frames an interrupted
/// writer left whole (see [`partial`](super::partial)), and the state of
/// the raw stream after them.
#[derive(Debug, Clone)]
pub(crate) struct Continued {
    /// The frames kept, in file order.
    pub(crate) frames: Vec<FrameInfo>,
    /// Their stored length (where the next frame starts in the file).
    pub(crate) stored_bytes: u64,
    /// Their raw length (where the rest of the stream starts).
    pub(crate) raw_bytes: u64,
    /// Commands they hold.
    pub(crate) commands: u64,
    /// The shape chain of those commands.
    pub(crate) shape: Shape,
    /// The stream's protocol version (from its header).
    pub(crate) proto: u32,
    /// The snapshot the stream is of (from its first command).
    pub(crate) ident: Ident,
    /// The BLAKE3 of their raw bytes so far (the whole stream's hash goes
    /// on from it).
    pub(crate) hasher: TreeHasher,
}

impl FileWriter {
    /// A writer into `upload`.
    pub fn new(upload: Box<dyn Upload>, opts: WriterOptions) -> FileWriter {
        FileWriter::start(upload, opts, None)
    }

    /// A writer that appends to the frames of an interrupted file: `upload`
    /// holds them (its next byte goes at `from.stored_bytes`), and the raw
    /// bytes given to it go on from `from.raw_bytes` at a command boundary
    /// (no stream header).
    pub(crate) fn continued(
        upload: Box<dyn Upload>,
        opts: WriterOptions,
        from: Continued,
    ) -> FileWriter {
        FileWriter::start(upload, opts, Some(from))
    }

    fn start(upload: Box<dyn Upload>, opts: WriterOptions, from: Option<Continued>) -> FileWriter {
        let pool = Arc::new(Pool::default());
        let failed = Arc::new(Mutex::new(None));
        let (frames, offset, raw_offset, hasher, ident) = match &from {
            Some(c) => (
                c.frames.clone(),
                c.stored_bytes,
                c.raw_bytes,
                c.hasher.clone(),
                Some(c.ident),
            ),
            None => (Vec::new(), 0, 0, TreeHasher::new(), None),
        };
        let shape = upload
            .records_state()
            .then(|| from.as_ref().map_or_else(Shape::default, |c| c.shape));
        let next = frames.len() as u64;
        let sink = Box::new(Sink {
            upload,
            pending: BTreeMap::new(),
            next,
            offset,
            raw_offset,
            frames,
            hasher,
            ident,
            pool: Arc::clone(&pool),
        });
        let stage = match start_threads(sink, opts.threads, opts.level, &failed) {
            Ok(stage) => stage,
            Err(sink) => Stage::Inline(sink),
        };
        FileWriter {
            stage: Some(stage),
            opts,
            buf: Vec::with_capacity(opts.frame_bytes.saturating_add(256 << 10)),
            parse: if from.is_some() {
                Parse::CmdHeader(0)
            } else {
                Parse::Header(0)
            },
            hdr: [0; CMD_HEADER_SIZE],
            stream_hdr: Vec::with_capacity(STREAM_HEADER_SIZE),
            proto: from.as_ref().map(|c| c.proto),
            commands: from.as_ref().map_or(0, |c| c.commands),
            shape,
            raw_bytes: from.as_ref().map_or(0, |c| c.raw_bytes),
            next_index: next,
            pool,
            failed,
        }
    }

    /// Follow the framing of `data` (which is appended to the frame).
    fn parse(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            match self.parse {
                Parse::Header(seen) => {
                    let n = (STREAM_HEADER_SIZE - seen).min(data.len());
                    self.stream_hdr.extend_from_slice(&data[..n]);
                    data = &data[n..];
                    if seen + n == STREAM_HEADER_SIZE {
                        if self.proto.is_none() {
                            let v = self.stream_hdr.get(13..17).and_then(|b| b.try_into().ok());
                            self.proto = v.map(u32::from_le_bytes);
                        }
                        self.stream_hdr.clear();
                        self.parse = Parse::CmdHeader(0);
                    } else {
                        self.parse = Parse::Header(seen + n);
                    }
                }
                Parse::CmdHeader(seen) => {
                    let n = (CMD_HEADER_SIZE - seen).min(data.len());
                    self.hdr[seen..seen + n].copy_from_slice(&data[..n]);
                    data = &data[n..];
                    if seen + n == CMD_HEADER_SIZE {
                        self.commands += 1;
                        let len = u32::from_le_bytes([
                            self.hdr[0],
                            self.hdr[1],
                            self.hdr[2],
                            self.hdr[3],
                        ]);
                        let cmd = u16::from_le_bytes([self.hdr[4], self.hdr[5]]);
                        if let Some(s) = self.shape.as_mut() {
                            s.push(cmd, CMD_HEADER_SIZE as u64 + u64::from(len));
                        }
                        self.parse = if len > 0 {
                            Parse::Payload(len.into())
                        } else {
                            Self::after_command(cmd)
                        };
                    } else {
                        self.parse = Parse::CmdHeader(seen + n);
                    }
                }
                Parse::Payload(left) => {
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(data.len());
                    data = &data[n..];
                    let left = left - n as u64;
                    self.parse = if left == 0 {
                        let cmd = u16::from_le_bytes([self.hdr[4], self.hdr[5]]);
                        Self::after_command(cmd)
                    } else {
                        Parse::Payload(left)
                    };
                }
            }
        }
    }

    /// The state after a command's last byte.
    fn after_command(cmd: u16) -> Parse {
        if cmd == stream_format::CommandKind::End.number() {
            Parse::Header(0)
        } else {
            Parse::CmdHeader(0)
        }
    }

    /// Whether the raw bytes so far end at a command boundary.
    fn at_boundary(&self) -> bool {
        matches!(self.parse, Parse::CmdHeader(0) | Parse::Header(0))
    }

    /// The writer thread's error, if it stopped.
    fn failure(&self) -> Option<String> {
        self.failed.lock().ok().and_then(|f| f.clone())
    }

    /// Send the frame being filled to the workers.
    fn cut(&mut self) -> Result<(), StoreError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let mut next = Pool::take(&self.pool.raw);
        next.reserve(self.opts.frame_bytes.saturating_add(256 << 10));
        let raw = std::mem::replace(&mut self.buf, next);
        let index = self.next_index;
        self.next_index += 1;
        let at = FrameEnd {
            commands: self.commands,
            shape: self.shape.unwrap_or_default(),
            proto: self.proto.unwrap_or(0),
        };
        match self.stage.as_mut() {
            Some(Stage::Threads { jobs, .. }) => {
                if jobs.send((index, raw, at)).is_err() {
                    return Err(worker_gone());
                }
                Ok(())
            }
            Some(Stage::Inline(sink)) => {
                let mut c = zstd::bulk::Compressor::new(self.opts.level).map_err(compress_err)?;
                let mut out = Vec::new();
                let data = compress_frame(&mut c, &raw, &mut out).map(|()| {
                    let h = blake3::hash(&out);
                    (out, h)
                });
                sink.push(Done {
                    index,
                    raw,
                    data,
                    at,
                })
            }
            None => Err(worker_gone()),
        }
    }

    /// Raw bytes written so far.
    pub fn raw_bytes(&self) -> u64 {
        self.raw_bytes
    }

    /// Finish the file: the last frame, the trailer, and the upload's
    /// completion (the file becomes visible). Returns the trailer and the
    /// file's length.
    ///
    /// # Errors
    ///
    /// A stream that does not end at a command boundary (cut short); write
    /// errors.
    pub fn finish(mut self, id: StreamIdentity) -> Result<(Trailer, u64), StoreError> {
        let cut_short = !self.at_boundary() || self.raw_bytes == 0;
        let cut = if cut_short { Ok(()) } else { self.cut() };
        let sink = match self.stage.take() {
            Some(Stage::Threads {
                jobs,
                workers,
                writer,
            }) => {
                drop(jobs);
                for w in workers {
                    let _ = w.join();
                }
                writer.join().map_err(|_| worker_gone())?
            }
            Some(Stage::Inline(sink)) => Ok(*sink),
            None => Err(worker_gone()),
        };
        // The writer's error first: it is why a cut failed.
        let mut sink = sink?;
        cut?;
        if cut_short {
            return Err(StoreError::Other {
                op: "write",
                location: String::from("stream"),
                error: format!(
                    "the send stream ends inside a command or header (after {} bytes)",
                    self.raw_bytes
                )
                .into(),
            });
        }
        if sink.next != self.next_index {
            return Err(worker_gone());
        }
        let trailer = Trailer {
            format: String::from("btrsend-stream"),
            version: TRAILER_VERSION,
            stream_bytes: self.raw_bytes,
            stream_blake3: sink.hasher.finalize().to_hex().to_string(),
            commands: self.commands,
            proto: self.proto.unwrap_or(0),
            uuid: id.uuid,
            ctransid: id.ctransid,
            parent_uuid: id.parent.as_ref().map(|p| p.0.clone()),
            parent_ctransid: id.parent.as_ref().map(|p| p.1),
            frames: std::mem::take(&mut sink.frames),
        };
        let bytes = encode_trailer(&trailer)?;
        sink.upload.write(&bytes)?;
        sink.upload.complete()?;
        Ok((trailer, sink.offset + bytes.len() as u64))
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        // Unfinished: stop the threads; the upload is dropped (aborted)
        // with the sink.
        if let Some(Stage::Threads {
            jobs,
            workers,
            writer,
        }) = self.stage.take()
        {
            drop(jobs);
            for w in workers {
                let _ = w.join();
            }
            let _ = writer.join();
        }
    }
}

impl io::Write for FileWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if let Some(msg) = self.failure() {
            return Err(io::Error::other(format!(
                "the stream file could not be written: {msg}"
            )));
        }
        // Cut at a boundary inside `data`: feed command by command once the
        // frame is full.
        let mut rest = data;
        while !rest.is_empty() {
            let take = if self.buf.len() >= self.opts.frame_bytes {
                // Only up to the end of the current command.
                match self.parse {
                    Parse::Payload(left) => usize::try_from(left).unwrap_or(usize::MAX),
                    Parse::CmdHeader(seen) => CMD_HEADER_SIZE - seen,
                    Parse::Header(seen) => STREAM_HEADER_SIZE - seen,
                }
                .min(rest.len())
            } else {
                (self.opts.frame_bytes - self.buf.len()).min(rest.len())
            };
            let (now, later) = rest.split_at(take);
            self.parse(now);
            self.buf.extend_from_slice(now);
            self.raw_bytes += now.len() as u64;
            rest = later;
            if self.buf.len() >= self.opts.frame_bytes
                && self.at_boundary()
                && let Err(e) = self.cut()
            {
                let msg = self.failure().unwrap_or_else(|| e.to_string());
                return Err(io::Error::other(format!(
                    "the stream file could not be written: {msg}"
                )));
            }
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn worker_gone() -> StoreError {
    StoreError::Other {
        op: "compress",
        location: String::from("stream"),
        error: "a compression thread stopped".into(),
    }
}

fn compress_err(e: io::Error) -> StoreError {
    StoreError::Other {
        op: "compress",
        location: String::from("stream"),
        error: Box::new(e),
    }
}

/// One zstd frame with its content size and checksum, into `out`.
fn compress_frame(
    c: &mut zstd::bulk::Compressor<'_>,
    raw: &[u8],
    out: &mut Vec<u8>,
) -> io::Result<()> {
    c.include_checksum(true)?;
    c.include_contentsize(true)?;
    out.clear();
    out.reserve(zstd::zstd_safe::compress_bound(raw.len()));
    c.compress_to_buffer(raw, out)?;
    Ok(())
}

fn compress_worker(
    jobs: &Mutex<mpsc::Receiver<Job>>,
    done: &mpsc::SyncSender<Done>,
    pool: &Pool,
    level: i32,
) {
    // One context for every frame of the stream.
    let mut ctx = zstd::bulk::Compressor::new(level);
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok((index, raw, at)) = job else { return };
        let mut out = Pool::take(&pool.stored);
        let data = match ctx.as_mut() {
            Ok(c) => compress_frame(c, &raw, &mut out).map(|()| {
                let h = blake3::hash(&out);
                (out, h)
            }),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        };
        if done
            .send(Done {
                index,
                raw,
                data,
                at,
            })
            .is_err()
        {
            return;
        }
    }
}

/// The trailer's bytes: the skippable frame.
fn encode_trailer(t: &Trailer) -> Result<Vec<u8>, StoreError> {
    let json = serde_json::to_vec(t).map_err(|e| StoreError::Other {
        op: "encode",
        location: String::from("trailer"),
        error: Box::new(e),
    })?;
    let body = json.len() as u64 + TRAILER_TAIL;
    let body = u32::try_from(body).map_err(|_| StoreError::Other {
        op: "encode",
        location: String::from("trailer"),
        error: "trailer too large".into(),
    })?;
    let mut out = Vec::with_capacity(json.len() + 24);
    out.extend_from_slice(&TRAILER_FRAME_MAGIC.to_le_bytes());
    out.extend_from_slice(&body.to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(TRAILER_END_MAGIC);
    Ok(out)
}

/// Damage found in a stream file.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Damage {
    /// The file is shorter or longer than recorded.
    #[error("{file}: {found} bytes, the catalog records {expected}")]
    Size {
        /// The file.
        file: String,
        /// Its size.
        found: u64,
        /// The size recorded.
        expected: u64,
    },
    /// No valid trailer at the end.
    #[error("{file}: bad trailer: {what}")]
    Trailer {
        /// The file.
        file: String,
        /// What is wrong.
        what: String,
    },
    /// A frame's stored bytes do not match their hash.
    #[error(
        "{file}: frame {frame} (bytes {offset}..{end}): BLAKE3 mismatch (stored {found}, trailer {expected})"
    )]
    FrameHash {
        /// The file.
        file: String,
        /// The frame's index.
        frame: usize,
        /// Its offset in the file.
        offset: u64,
        /// Its end in the file.
        end: u64,
        /// The hash of what is stored.
        found: String,
        /// The hash the trailer records.
        expected: String,
    },
    /// A frame does not decompress to its recorded length.
    #[error("{file}: frame {frame} at byte offset {offset}: {what}")]
    Frame {
        /// The file.
        file: String,
        /// The frame's index.
        frame: usize,
        /// Its offset in the file.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// The raw stream's hash, length or command count differs.
    #[error("{file}: the raw stream {what}")]
    Stream {
        /// The file.
        file: String,
        /// What differs.
        what: String,
    },
    /// The trailer describes another stream than the catalog.
    #[error("{file}: the trailer says {what}, the catalog entry does not")]
    Mismatch {
        /// The file.
        file: String,
        /// What differs.
        what: String,
    },
}

/// An error reading a stream file: damage, or the store failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file is damaged.
    #[error(transparent)]
    Damage(#[from] Damage),
    /// The store failed (a missing file is [`StoreError::NotFound`]).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A stream file opened for reading: its trailer.
#[derive(Debug, Clone)]
pub struct StreamFile {
    /// The key of the file.
    pub key: String,
    /// Its size.
    pub size: u64,
    /// Its trailer.
    pub trailer: Trailer,
}

impl StreamFile {
    /// Read the trailer of `key` (`size` bytes long) and check that the
    /// frame table covers the file up to the trailer.
    ///
    /// # Errors
    ///
    /// [`Damage::Trailer`]; store errors.
    pub fn open(store: &dyn Store, key: &str, size: u64) -> Result<StreamFile, ReadError> {
        let bad = |what: String| {
            ReadError::Damage(Damage::Trailer {
                file: key.to_owned(),
                what,
            })
        };
        if size < TRAILER_TAIL + SKIPPABLE_HEADER {
            return Err(bad(format!("the file is only {size} bytes long")));
        }
        let tail = store.get(key, Some(size - TRAILER_TAIL..size))?;
        if tail.get(8..16) != Some(&TRAILER_END_MAGIC[..]) {
            return Err(bad(format!(
                "no end magic {} in the last 8 bytes (a truncated file?)",
                String::from_utf8_lossy(TRAILER_END_MAGIC)
            )));
        }
        let json_len = u64::from_le_bytes(tail[..8].try_into().unwrap_or_default());
        let start = size
            .checked_sub(TRAILER_TAIL)
            .and_then(|s| s.checked_sub(json_len))
            .and_then(|s| s.checked_sub(SKIPPABLE_HEADER))
            .filter(|_| json_len <= MAX_TRAILER_JSON)
            .ok_or_else(|| bad(format!("trailer length {json_len} does not fit the file")))?;
        let head = store.get(key, Some(start..start + SKIPPABLE_HEADER + json_len))?;
        let magic = u32::from_le_bytes(head[..4].try_into().unwrap_or_default());
        let body = u32::from_le_bytes(head[4..8].try_into().unwrap_or_default());
        if magic != TRAILER_FRAME_MAGIC || u64::from(body) != json_len + TRAILER_TAIL {
            return Err(bad(format!(
                "no skippable frame header at byte offset {start}"
            )));
        }
        let trailer: Trailer = serde_json::from_slice(&head[8..])
            .map_err(|e| bad(format!("unreadable JSON at byte offset {}: {e}", start + 8)))?;
        if trailer.format != "btrsend-stream" || trailer.version != TRAILER_VERSION {
            return Err(bad(format!(
                "format {} version {} (this btrsend reads btrsend-stream version {TRAILER_VERSION})",
                trailer.format, trailer.version
            )));
        }
        let mut at = 0u64;
        let mut raw = 0u64;
        for (i, f) in trailer.frames.iter().enumerate() {
            if f.raw_len > super::frames::MAX_FRAME_RAW {
                return Err(bad(format!(
                    "frame {i} is recorded with {} raw bytes, more than any writer puts in a frame",
                    f.raw_len
                )));
            }
            if f.offset != at || f.len == 0 {
                return Err(bad(format!(
                    "frame {i} is recorded at byte offset {} length {}, expected offset {at}",
                    f.offset, f.len
                )));
            }
            at = at.saturating_add(f.len);
            raw = raw.saturating_add(f.raw_len);
        }
        if at != start {
            return Err(bad(format!(
                "the frames end at byte offset {at}, the trailer starts at {start}"
            )));
        }
        if raw != trailer.stream_bytes {
            return Err(bad(format!(
                "the frames hold {raw} raw bytes, the trailer says {}",
                trailer.stream_bytes
            )));
        }
        Ok(StreamFile {
            key: key.to_owned(),
            size,
            trailer,
        })
    }

    /// The stored bytes of frame `i`, checked against their hash.
    ///
    /// # Errors
    ///
    /// [`Damage::FrameHash`]; store errors.
    pub fn read_frame(&self, store: &dyn Store, i: usize) -> Result<Vec<u8>, ReadError> {
        let f = self.trailer.frames.get(i).ok_or_else(|| Damage::Trailer {
            file: self.key.clone(),
            what: format!("no frame {i}"),
        })?;
        let data = store.get(&self.key, Some(f.offset..f.offset + f.len))?;
        self.check_frame(i, &data)?;
        Ok(data)
    }

    /// Check frame `i`'s stored bytes against the trailer.
    ///
    /// # Errors
    ///
    /// [`Damage::FrameHash`].
    pub fn check_frame(&self, i: usize, data: &[u8]) -> Result<(), Damage> {
        let Some(f) = self.trailer.frames.get(i) else {
            return Err(Damage::Trailer {
                file: self.key.clone(),
                what: format!("no frame {i}"),
            });
        };
        let found = blake3::hash(data).to_hex().to_string();
        if found != f.blake3 {
            return Err(Damage::FrameHash {
                file: self.key.clone(),
                frame: i,
                offset: f.offset,
                end: f.offset + f.len,
                found,
                expected: f.blake3.clone(),
            });
        }
        Ok(())
    }

    /// Decompress frame `i` (already checked) and check its length.
    ///
    /// # Errors
    ///
    /// [`Damage::Frame`].
    pub fn decompress(&self, i: usize, data: &[u8]) -> Result<Vec<u8>, Damage> {
        let f = self.trailer.frames.get(i);
        let raw_len = f.map_or(0, |f| f.raw_len);
        let offset = f.map_or(0, |f| f.offset);
        let bad = |what: String| Damage::Frame {
            file: self.key.clone(),
            frame: i,
            offset,
            what,
        };
        let cap = usize::try_from(raw_len).map_err(|_| bad("too large".into()))?;
        let out = zstd::bulk::decompress(data, cap)
            .map_err(|e| bad(format!("does not decompress: {e}")))?;
        if out.len() as u64 != raw_len {
            return Err(bad(format!(
                "decompresses to {} bytes, the trailer says {raw_len}",
                out.len()
            )));
        }
        Ok(out)
    }

    /// The snapshot the stream's own first command (SUBVOL or SNAPSHOT)
    /// names, with its parent: read from the start of the first frame
    /// only (a few hundred KiB at most, however long the stream).
    ///
    /// # Errors
    ///
    /// [`Damage::Frame`] when the start of the first frame does not
    /// decompress or decode to SUBVOL or SNAPSHOT; store errors.
    pub(crate) fn first_ident(&self, store: &dyn Store) -> Result<Ident, ReadError> {
        /// Enough stored bytes for zstd's first block (at most 128 KiB),
        /// which holds the stream header and the first command.
        const HEAD: u64 = 160 << 10;
        /// The stream header and a SUBVOL or SNAPSHOT command fit in this.
        const RAW: u64 = 8 << 10;
        let bad = |what: String| {
            ReadError::Damage(Damage::Frame {
                file: self.key.clone(),
                frame: 0,
                offset: 0,
                what,
            })
        };
        let f = self
            .trailer
            .frames
            .first()
            .ok_or_else(|| bad(String::from("the file has no frame")))?;
        let data = store.get(&self.key, Some(f.offset..f.offset + f.len.min(HEAD)))?;
        let mut raw = Vec::new();
        let read = zstd::stream::read::Decoder::with_buffer(&data[..]).map(|d| {
            d.single_frame()
                .take(RAW.min(f.raw_len))
                .read_to_end(&mut raw)
        });
        match read {
            Ok(Ok(_)) => {}
            // The first block was read whole: what it gave is enough.
            Ok(Err(_)) if !raw.is_empty() => {}
            Ok(Err(e)) | Err(e) => return Err(bad(format!("does not decompress: {e}"))),
        }
        super::partial::ident_of_prefix(&raw).map_err(bad)
    }

    /// Check every frame's hash (reads the whole file, decompresses
    /// nothing).
    ///
    /// # Errors
    ///
    /// The first damaged frame; store errors.
    pub fn check_hashes(&self, store: &dyn Store) -> Result<(), ReadError> {
        for i in 0..self.trailer.frames.len() {
            self.read_frame(store, i)?;
        }
        Ok(())
    }

    /// A reader of the raw stream: each frame's hash is checked before it
    /// is decompressed, and the whole stream's hash and length at the end
    /// (a mismatch is an error from `read`, before end of file).
    pub fn raw_reader<'s>(&self, store: &'s dyn Store) -> RawReader<'s> {
        RawReader {
            store,
            file: self.clone(),
            next: 0,
            cur: Vec::new(),
            pos: 0,
            hasher: blake3::Hasher::new(),
            total: 0,
            done: false,
        }
    }
}

/// The raw stream of a [`StreamFile`], checked as it is read.
pub struct RawReader<'s> {
    store: &'s dyn Store,
    file: StreamFile,
    next: usize,
    cur: Vec<u8>,
    pos: usize,
    hasher: blake3::Hasher,
    total: u64,
    done: bool,
}

impl std::fmt::Debug for RawReader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawReader")
            .field("file", &self.file.key)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

/// The error a [`RawReader`] returns, carrying the damage.
pub(crate) fn io_damage(e: ReadError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl RawReader<'_> {
    /// Load the next frame.
    fn load(&mut self) -> Result<bool, ReadError> {
        if self.next >= self.file.trailer.frames.len() {
            return Ok(false);
        }
        let data = self.file.read_frame(self.store, self.next)?;
        self.cur = self.file.decompress(self.next, &data)?;
        self.pos = 0;
        self.next += 1;
        self.hasher.update(&self.cur);
        self.total += self.cur.len() as u64;
        Ok(true)
    }

    /// At the end: compare the stream's hash and length.
    fn finish(&mut self) -> Result<(), Damage> {
        let t = &self.file.trailer;
        let found = self.hasher.finalize().to_hex().to_string();
        if self.total != t.stream_bytes || found != t.stream_blake3 {
            return Err(Damage::Stream {
                file: self.file.key.clone(),
                what: format!(
                    "has {} bytes with BLAKE3 {found}, the trailer says {} bytes with BLAKE3 {}",
                    self.total, t.stream_bytes, t.stream_blake3
                ),
            });
        }
        Ok(())
    }
}

impl Read for RawReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos >= self.cur.len() {
            if self.done {
                return Ok(0);
            }
            if !self.load().map_err(io_damage)? {
                self.finish().map_err(|d| io_damage(ReadError::Damage(d)))?;
                self.done = true;
                return Ok(0);
            }
        }
        let n = (self.cur.len() - self.pos).min(out.len());
        out[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// The error inside an I/O error from a [`RawReader`] (or the error
/// itself, when it holds none).
pub(crate) fn into_read_error(e: io::Error) -> Result<ReadError, io::Error> {
    if damage_of(&e).is_none() {
        return Err(e);
    }
    match e.into_inner().map(|inner| inner.downcast::<ReadError>()) {
        Some(Ok(r)) => Ok(*r),
        // Not reached: `damage_of` found a ReadError.
        Some(Err(inner)) => Err(io::Error::new(io::ErrorKind::InvalidData, inner)),
        None => Err(io::Error::from(io::ErrorKind::InvalidData)),
    }
}

/// The damage inside an I/O error from a [`RawReader`], if any.
pub fn damage_of(e: &io::Error) -> Option<&ReadError> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<ReadError>())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::backup::store::LocalStore;

    /// A small valid stream: header, SUBVOL-ish commands (content does not
    /// matter to the framing), END.
    fn stream(cmds: usize) -> Vec<u8> {
        let mut w = stream_format::StreamWriter::new(Vec::new(), 1).unwrap();
        w.write(&stream_format::Command::Subvol {
            path: std::borrow::Cow::Borrowed(b"s"),
            uuid: [1; 16],
            ctransid: 7,
        })
        .unwrap();
        for i in 0..cmds {
            let data = vec![(i % 251) as u8; 1000 + i];
            w.write(&stream_format::Command::Write {
                path: std::borrow::Cow::Borrowed(b"f"),
                offset: (i * 2000) as u64,
                data: std::borrow::Cow::Borrowed(&data),
            })
            .unwrap();
        }
        w.write(&stream_format::Command::End).unwrap();
        w.into_inner()
    }

    fn id() -> StreamIdentity {
        StreamIdentity {
            uuid: "01010101-0101-0101-0101-010101010101".into(),
            ctransid: 7,
            parent: None,
        }
    }

    fn write_file(store: &LocalStore, key: &str, raw: &[u8], opts: WriterOptions) -> u64 {
        let up = store.multipart(key).unwrap();
        let mut w = FileWriter::new(up, opts);
        // Odd-sized writes, to split headers, then one large write.
        let (a, b) = raw.split_at(raw.len() / 2);
        for chunk in a.chunks(777) {
            w.write_all(chunk).unwrap();
        }
        w.write_all(b).unwrap();
        w.finish(id()).unwrap().1
    }

    fn read_all(store: &LocalStore, key: &str) -> Result<Vec<u8>, io::Error> {
        let size = std::fs::metadata(store.root().join(key)).map_or(0, |m| m.len());
        let f = StreamFile::open(store, key, size).map_err(io_damage)?;
        let mut out = Vec::new();
        f.raw_reader(store).read_to_end(&mut out)?;
        Ok(out)
    }

    fn small() -> WriterOptions {
        WriterOptions::new().with_frame_bytes(8000).with_threads(2)
    }

    #[test]
    fn parallel_frame_check_passes_whole_files_and_fails_damaged_ones() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        let raw = stream(300);
        let size = write_file(&s, "streams/x", &raw, small());
        let f = StreamFile::open(&s, "streams/x", size).unwrap();
        assert!(f.trailer.frames.len() > 20, "{}", f.trailer.frames.len());
        assert!(crate::backup::verify::check_frames_parallel(
            &s,
            &f,
            &crate::backup::NoProgress
        ));
        // One frame's bytes changed (its hash no longer matches).
        let path = dir.path().join("streams/x");
        let good = std::fs::read(&path).unwrap();
        let mut bad = good.clone();
        let at = usize::try_from(f.trailer.frames[13].offset).unwrap() + 5;
        bad[at] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        assert!(!crate::backup::verify::check_frames_parallel(
            &s,
            &f,
            &crate::backup::NoProgress
        ));
        // A trailer that claims one command more than the frames hold.
        std::fs::write(&path, &good).unwrap();
        let mut more = f.clone();
        more.trailer.commands += 1;
        assert!(!crate::backup::verify::check_frames_parallel(
            &s,
            &more,
            &crate::backup::NoProgress
        ));
        // A stream hash that does not match.
        let mut other = f.clone();
        other.trailer.stream_blake3 = blake3::hash(b"other").to_hex().to_string();
        assert!(!crate::backup::verify::check_frames_parallel(
            &s,
            &other,
            &crate::backup::NoProgress
        ));
        assert!(crate::backup::verify::check_frames_parallel(
            &s,
            &f,
            &crate::backup::NoProgress
        ));
    }

    #[test]
    fn round_trip_many_frames_and_zstd_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        let raw = stream(200);
        let size = write_file(&s, "streams/x", &raw, small());
        let f = StreamFile::open(&s, "streams/x", size).unwrap();
        assert!(f.trailer.frames.len() > 20, "{}", f.trailer.frames.len());
        assert_eq!(f.trailer.commands, 202);
        assert_eq!(f.trailer.proto, 1);
        assert_eq!(f.trailer.stream_bytes, raw.len() as u64);
        assert_eq!(
            f.trailer.stream_blake3,
            blake3::hash(&raw).to_hex().to_string()
        );
        assert_eq!(read_all(&s, "streams/x").unwrap(), raw);
        // Every frame starts at a command boundary: each decompresses to
        // whole commands (the first with the header).
        let mut at = 0usize;
        for (i, fr) in f.trailer.frames.iter().enumerate() {
            let data = f.read_frame(&s, i).unwrap();
            let plain = f.decompress(i, &data).unwrap();
            let mut p = if i == 0 { 17 } else { 0 };
            while p < plain.len() {
                let len = u32::from_le_bytes(plain[p..p + 4].try_into().unwrap()) as usize;
                p += 10 + len;
            }
            assert_eq!(p, plain.len(), "frame {i} ends inside a command");
            at += fr.raw_len as usize;
        }
        assert_eq!(at, raw.len());
        // The zstd tool (the oracle for "restorable without btrsend").
        let out = std::process::Command::new("zstd")
            .arg("-dc")
            .arg(dir.path().join("streams/x"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(out.stdout, raw);
    }

    #[test]
    fn single_thread_and_one_frame() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        let raw = stream(3);
        let opts = WriterOptions::new().with_threads(0);
        let size = write_file(&s, "a", &raw, opts);
        let f = StreamFile::open(&s, "a", size).unwrap();
        assert_eq!(f.trailer.frames.len(), 1);
        assert_eq!(read_all(&s, "a").unwrap(), raw);
    }

    #[test]
    fn cut_stream_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        let raw = stream(3);
        let mut w = FileWriter::new(s.multipart("a").unwrap(), small());
        w.write_all(&raw[..raw.len() - 5]).unwrap();
        let e = w.finish(id()).unwrap_err();
        assert!(e.to_string().contains("ends inside a command"), "{e}");
        assert!(s.list("").unwrap().is_empty(), "nothing visible");
    }

    fn damaged(f: impl FnOnce(&mut Vec<u8>, &Trailer)) -> String {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        let raw = stream(100);
        let size = write_file(&s, "x", &raw, small());
        let t = StreamFile::open(&s, "x", size).unwrap().trailer;
        let path = dir.path().join("x");
        let mut bytes = std::fs::read(&path).unwrap();
        f(&mut bytes, &t);
        std::fs::write(&path, &bytes).unwrap();
        match read_all(&s, "x") {
            Ok(_) => panic!("damage not found"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn flipped_byte_in_every_position_class_is_found() {
        let e = damaged(|b, t| {
            let f = &t.frames[3];
            b[(f.offset + f.len / 2) as usize] ^= 0x40;
        });
        assert!(e.contains("x: frame 3 (bytes"), "{e}");
        assert!(e.contains("BLAKE3 mismatch"), "{e}");
        let e = damaged(|b, _| {
            let n = b.len();
            b[n - 20] ^= 1;
        });
        assert!(e.contains("bad trailer"), "{e}");
        let e = damaged(|b, _| b[0] ^= 1);
        assert!(e.contains("frame 0 (bytes 0.."), "{e}");
    }

    #[test]
    fn truncation_is_found() {
        let e = damaged(|b, _| b.truncate(b.len() - 1));
        assert!(e.contains("bad trailer: no end magic"), "{e}");
        let e = damaged(|b, t| b.truncate(t.frames[2].offset as usize));
        assert!(e.contains("bad trailer"), "{e}");
        let e = damaged(|b, _| b.truncate(3));
        assert!(e.contains("only 3 bytes long"), "{e}");
    }

    #[test]
    fn swapped_frames_are_found() {
        let e = damaged(|b, t| {
            // Two frames of the same length, swapped.
            let (a, c) = t
                .frames
                .iter()
                .enumerate()
                .find_map(|(i, f)| {
                    t.frames
                        .iter()
                        .enumerate()
                        .skip(i + 1)
                        .find(|(_, g)| g.len == f.len && g.blake3 != f.blake3)
                        .map(|(j, _)| (i, j))
                })
                .expect("two frames of equal length");
            let fa = t.frames[a].clone();
            let fc = t.frames[c].clone();
            let xa = b[fa.offset as usize..(fa.offset + fa.len) as usize].to_vec();
            let xc = b[fc.offset as usize..(fc.offset + fc.len) as usize].to_vec();
            b[fa.offset as usize..(fa.offset + fa.len) as usize].copy_from_slice(&xc);
            b[fc.offset as usize..(fc.offset + fc.len) as usize].copy_from_slice(&xa);
        });
        assert!(e.contains("BLAKE3 mismatch"), "{e}");
    }

    #[test]
    fn missing_file_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        let e = StreamFile::open(&s, "streams/gone", 1000).unwrap_err();
        assert!(
            matches!(e, ReadError::Store(ref s) if s.is_not_found()),
            "{e}"
        );
    }
}
