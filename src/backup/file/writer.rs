//! Writing a stream file: [`FileWriter`] takes a raw send stream as an
//! [`io::Write`], cuts it into frames at command boundaries, encodes them on
//! worker threads ([`FrameEncoder`]), and writes them in order with the
//! frame table, then the trailer.
//!
//! The writer follows the stream's framing (headers and lengths) and
//! nothing more: it never decodes a command's payload. It records the
//! state a continuation needs only when its upload asks for it (S3), and
//! it can go on from a partial file's kept frames ([`Continued`]).

use std::collections::BTreeMap;
use std::io;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use stream_format::{CMD_HEADER_SIZE, STREAM_HEADER_SIZE};

use super::format::{
    FrameEncoder, FrameInfo, Ident, MAX_FRAME_BYTES, TRAILER_VERSION, Trailer, encode_trailer,
};
use crate::backup::partial::{self, Checkpoint, Continued};
use crate::backup::store::{StoreError, Upload};
use crate::backup::treehash::TreeHasher;
use crate::resume::Shape;

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
                self.ident = partial::ident_of(&raw);
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
                let mut c = FrameEncoder::new(self.opts.level).map_err(compress_err)?;
                let mut out = Vec::new();
                let data = c.encode(&raw, &mut out).map(|()| {
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
        let size = sink.upload.stored_size(sink.offset + bytes.len() as u64);
        sink.upload.write(&bytes)?;
        sink.upload.complete()?;
        Ok((trailer, size))
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

fn compress_worker(
    jobs: &Mutex<mpsc::Receiver<Job>>,
    done: &mpsc::SyncSender<Done>,
    pool: &Pool,
    level: i32,
) {
    // One context for every frame of the stream.
    let mut ctx = FrameEncoder::new(level);
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok((index, raw, at)) = job else { return };
        let mut out = Pool::take(&pool.stored);
        let data = match ctx.as_mut() {
            Ok(c) => c.encode(&raw, &mut out).map(|()| {
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
