//! Reading the frames of stream files on several threads, ahead of the one
//! consumer that needs them in order: `verify --read-data` (every frame
//! read, hashed, decompressed and decoded) and `restore` (each frame hashed
//! and decompressed ahead of the receiver; for `--stdout`, whose bytes
//! cannot be taken back, all of that in a first pass that writes nothing,
//! then decompressed again to be written).
//!
//! [`read_ahead`] starts one worker per core. Workers take frames in file
//! order, at most [`window`] of them ahead of the consumer (so memory stays
//! bounded whatever the file's size), and leave each result in a slot; the
//! consumer takes the slots in order ([`Ahead::next`]) and gives the buffers
//! back ([`Ahead::recycle`]), so a long file costs no page faults after the
//! first frames. A frame's damage is the result of that frame: the
//! consumer meets it in order, at the frame it concerns.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use stream_format::{CommandKind, DecodeError, Next, ReaderOptions, StreamReader};

use super::file::StreamFile;
use super::file::format::{Damage, FrameDecoder, MAX_FRAME_RAW, ReadError};
use super::store::Store;

/// The 17-byte stream header (`btrfs-stream\0` and the version).
const STREAM_HEADER_SIZE: usize = stream_format::STREAM_HEADER_SIZE;

/// What is done with each frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Work {
    /// Check the BLAKE3 of the stored bytes against the trailer.
    pub hash: bool,
    /// Decompress (and check the length against the trailer). zstd checks
    /// the frame's own checksum (XXH64 of its raw bytes) only without
    /// [`Work::hash`]: a frame whose stored bytes match their BLAKE3 holds
    /// the checksum the writer computed, so checking it again costs time
    /// (about a tenth of the decompression) and finds nothing.
    pub decompress: bool,
    /// Decode every command, CRC included (needs `decompress`).
    pub decode: bool,
}

/// A frame as a worker left it.
#[derive(Debug)]
pub struct Frame {
    /// Which file of the list.
    pub file: usize,
    /// Which frame of that file.
    pub index: usize,
    buf: Vec<u8>,
    /// Where the raw bytes start in `buf` (after a stream header put in
    /// front for the decoder).
    start: usize,
    /// Commands decoded (with [`Work::decode`]).
    pub commands: u64,
    /// Whether the frame ends with the END command (with
    /// [`Work::decode`]).
    pub ended: bool,
}

impl Frame {
    /// The raw (decompressed) bytes; empty without [`Work::decompress`].
    pub fn raw(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }

    /// The buffer, to give back with [`Ahead::recycle`].
    pub fn into_buf(self) -> Vec<u8> {
        self.buf
    }

    /// The buffer with the raw bytes at its start, and their length.
    pub fn into_raw(mut self) -> (Vec<u8>, usize) {
        if self.start > 0 {
            self.buf.drain(..self.start.min(self.buf.len()));
        }
        let n = self.buf.len();
        (self.buf, n)
    }
}

/// Frames a worker may be ahead of the consumer, per worker.
const AHEAD_PER_WORKER: usize = 2;

/// Frames in flight (being read or waiting for the consumer) at most.
pub fn window(workers: usize) -> usize {
    workers.saturating_mul(AHEAD_PER_WORKER).saturating_add(2)
}

/// The workers: one per core (at least two, so reading from a slow store
/// overlaps).
pub fn workers() -> usize {
    std::thread::available_parallelism()
        .map_or(2, std::num::NonZero::get)
        .max(2)
}

struct State {
    /// Frames handed to workers so far (the next one to take).
    claimed: usize,
    /// Frames taken by the consumer so far.
    consumed: usize,
    done: BTreeMap<usize, Result<Frame, ReadError>>,
    free: Vec<Vec<u8>>,
    /// Workers still running.
    alive: usize,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    /// A slot was filled (or a worker ended).
    ready: Condvar,
    /// A slot was consumed (or the consumer stopped).
    space: Condvar,
    window: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The consumer's side of [`read_ahead`].
pub struct Ahead<'a> {
    shared: &'a Shared,
    jobs: &'a [(usize, usize)],
    next: usize,
    /// No worker thread could be started: each frame is read when the
    /// consumer asks for it, on its thread.
    inline: Option<Inline<'a>>,
}

/// What [`Ahead::next`] needs to read frames itself.
struct Inline<'a> {
    worker: Worker,
    store: &'a dyn Store,
    files: &'a [StreamFile],
    work: Work,
}

impl std::fmt::Debug for Ahead<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ahead")
            .field("next", &self.next)
            .field("frames", &self.jobs.len())
            .finish_non_exhaustive()
    }
}

impl Ahead<'_> {
    /// The next frame in order (files in the order given, frames in file
    /// order); `None` after the last.
    pub fn next(&mut self) -> Option<Result<Frame, ReadError>> {
        let &(f, i) = self.jobs.get(self.next)?;
        if let Some(inl) = self.inline.as_mut() {
            self.next += 1;
            let buf = self.shared.lock().free.pop().unwrap_or_default();
            return Some(inl.worker.frame(inl.store, inl.files, f, i, inl.work, buf));
        }
        let mut st = self.shared.lock();
        loop {
            if let Some(r) = st.done.remove(&self.next) {
                st.consumed += 1;
                self.next += 1;
                drop(st);
                self.shared.space.notify_all();
                return Some(r);
            }
            if st.alive == 0 {
                // Every worker ended without this frame: one panicked.
                self.next = self.jobs.len();
                return Some(Err(ReadError::Damage(Damage::Trailer {
                    file: String::from("stream"),
                    what: String::from("a reading thread stopped"),
                })));
            }
            st = self
                .shared
                .ready
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Give a frame's buffer back for another frame.
    pub fn recycle(&self, buf: Vec<u8>) {
        let mut st = self.shared.lock();
        if st.free.len() < self.shared.window {
            st.free.push(buf);
        }
    }
}

/// Read the frames of `files` (all of them, in order) with `work` done to
/// each on [`workers`] threads, and run `consume` on the consumer's side;
/// the workers stop when `consume` returns.
pub fn read_ahead<T>(
    store: &dyn Store,
    files: &[StreamFile],
    work: Work,
    consume: impl FnOnce(&mut Ahead<'_>) -> T,
) -> T {
    let jobs: Vec<(usize, usize)> = files
        .iter()
        .enumerate()
        .flat_map(|(f, file)| (0..file.trailer.frames.len()).map(move |i| (f, i)))
        .collect();
    let n = workers().min(jobs.len()).max(1);
    let shared = Shared {
        state: Mutex::new(State {
            claimed: 0,
            consumed: 0,
            done: BTreeMap::new(),
            free: Vec::new(),
            alive: n,
            stop: false,
        }),
        ready: Condvar::new(),
        space: Condvar::new(),
        window: window(n),
    };
    std::thread::scope(|s| {
        for i in 0..n {
            let (shared, jobs) = (&shared, &jobs);
            let spawned = std::thread::Builder::new()
                .name(format!("btrsend-frames-{i}"))
                .spawn_scoped(s, move || worker(shared, store, files, jobs, work));
            if spawned.is_err() {
                shared.lock().alive -= 1;
            }
        }
        // No thread could be started: the consumer reads each frame itself.
        let inline = (shared.lock().alive == 0).then(|| Inline {
            worker: Worker::new(work),
            store,
            files,
            work,
        });
        let mut ahead = Ahead {
            shared: &shared,
            jobs: &jobs,
            next: 0,
            inline,
        };
        let out = consume(&mut ahead);
        shared.lock().stop = true;
        shared.space.notify_all();
        out
    })
}

/// Ends a worker: one fewer alive, and the consumer hears of it.
struct Alive<'a>(&'a Shared);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.lock().alive -= 1;
        self.0.ready.notify_all();
    }
}

fn worker(
    shared: &Shared,
    store: &dyn Store,
    files: &[StreamFile],
    jobs: &[(usize, usize)],
    work: Work,
) {
    let _alive = Alive(shared);
    let mut w = Worker::new(work);
    loop {
        let (k, buf) = {
            let mut st = shared.lock();
            loop {
                if st.stop || st.claimed >= jobs.len() {
                    return;
                }
                if st.claimed < st.consumed.saturating_add(shared.window) {
                    break;
                }
                st = shared
                    .space
                    .wait(st)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            let k = st.claimed;
            st.claimed += 1;
            (k, st.free.pop().unwrap_or_default())
        };
        let Some(&(f, i)) = jobs.get(k) else { return };
        let r = w.frame(store, files, f, i, work, buf);
        shared.lock().done.insert(k, r);
        shared.ready.notify_all();
    }
}

/// A worker's reused state.
struct Worker {
    stored: Vec<u8>,
    dctx: FrameDecoder,
    attrs: Vec<stream_format::RawAttr>,
}

impl Worker {
    fn new(work: Work) -> Worker {
        // See [`Work::decompress`].
        let dctx = FrameDecoder::new(work.hash);
        Worker {
            stored: Vec::new(),
            dctx,
            attrs: Vec::new(),
        }
    }

    fn frame(
        &mut self,
        store: &dyn Store,
        files: &[StreamFile],
        f: usize,
        i: usize,
        work: Work,
        mut buf: Vec<u8>,
    ) -> Result<Frame, ReadError> {
        let file = files.get(f).ok_or_else(|| Damage::Trailer {
            file: String::from("stream"),
            what: format!("no file {f}"),
        })?;
        let fr = file.trailer.frames.get(i).ok_or_else(|| Damage::Trailer {
            file: file.key.clone(),
            what: format!("no frame {i}"),
        })?;
        let end = fr.offset.saturating_add(fr.len);
        store.get_into(&file.key, fr.offset..end, &mut self.stored)?;
        if work.hash {
            file.check_frame(i, &self.stored)?;
        }
        let mut frame = Frame {
            file: f,
            index: i,
            buf: Vec::new(),
            start: 0,
            commands: 0,
            ended: false,
        };
        if !work.decompress {
            frame.buf = buf;
            frame.buf.clear();
            return Ok(frame);
        }
        let bad = |what: String| Damage::Frame {
            file: file.key.clone(),
            frame: i,
            offset: fr.offset,
            what,
        };
        if fr.raw_len > MAX_FRAME_RAW {
            return Err(bad(format!(
                "the trailer records {} raw bytes, more than any writer puts in a frame ({MAX_FRAME_RAW})",
                fr.raw_len
            ))
            .into());
        }
        // OK to convert: at most MAX_FRAME_RAW.
        let raw_len = usize::try_from(fr.raw_len).unwrap_or(usize::MAX);
        // Frames after the first get the stream header in front, so the
        // decoder reads them alone (the trailer records the version).
        let start = if work.decode && i > 0 {
            STREAM_HEADER_SIZE
        } else {
            0
        };
        buf.resize(start + raw_len, 0);
        if start > 0 {
            let (magic, version) = buf.split_at_mut(STREAM_HEADER_SIZE - 4);
            magic.copy_from_slice(stream_format::STREAM_MAGIC);
            version[..4].copy_from_slice(&file.trailer.proto.to_le_bytes());
        }
        let n = self
            .dctx
            .decode_into(&self.stored, &mut buf[start..])
            .map_err(bad)?;
        if n != raw_len {
            return Err(bad(format!(
                "decompresses to {n} bytes, the trailer says {raw_len}"
            ))
            .into());
        }
        frame.buf = buf;
        frame.start = start;
        if work.decode {
            let (commands, ended) = decode(&frame.buf, &mut self.attrs)
                .map_err(|e| bad(format!("does not decode: {e}")))?;
            if i == 0 && frame.buf.get(13..17) != Some(&file.trailer.proto.to_le_bytes()[..]) {
                return Err(bad(format!(
                    "the stream header's version differs from the trailer's ({})",
                    file.trailer.proto
                ))
                .into());
            }
            frame.commands = commands;
            frame.ended = ended;
        }
        Ok(frame)
    }
}

/// Decode every command of `buf` (a stream header and whole commands):
/// their count and whether the last is END. The payloads are checked in
/// place (CRC, attributes), not copied.
fn decode(buf: &[u8], attrs: &mut Vec<stream_format::RawAttr>) -> Result<(u64, bool), String> {
    let mut reader =
        StreamReader::with_options(Cursor::new(buf), ReaderOptions::new().with_max_version(3));
    let mut commands = 0u64;
    let mut ended = false;
    loop {
        let next = match reader.next_skimmed(|_| Some(0)) {
            Ok(Some(n)) => n,
            Ok(None) => break,
            // The frame ends between two commands.
            Err(DecodeError::TruncatedCommandHeader { available: 0, .. }) => break,
            Err(e) => return Err(e.to_string()),
        };
        if ended {
            return Err(String::from("a second stream follows the END command"));
        }
        commands += 1;
        match next {
            Next::Command(info, _) => ended = info.cmd == CommandKind::End.number(),
            Next::Skimmed { info, crc, .. } => {
                let start = usize::try_from(info.offset)
                    .ok()
                    .and_then(|o| o.checked_add(stream_format::CMD_HEADER_SIZE));
                let len = usize::try_from(info.len).ok();
                let payload = start
                    .zip(len)
                    .and_then(|(s, l)| buf.get(s..s.checked_add(l)?));
                let Some(payload) = payload else {
                    return Err(DecodeError::TruncatedCommand {
                        cmd: info,
                        available: buf.len().saturating_sub(start.unwrap_or(0)),
                    }
                    .to_string());
                };
                stream_format::decode_payload(&info, crc, payload, attrs)
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    Ok((commands, ended))
}
