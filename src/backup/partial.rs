//! Continuing the stream file an interrupted `backup run` was writing.
//!
//! A run writes a stream file as whole zstd frames, each a run of whole
//! send-stream commands (see [`file`](super::file)), into a temporary file
//! `tmp/UUID-CTRANSID-RANDOM.btrs.zst.PID.RANDOM` of a directory
//! repository. A run that stops before the file is complete (killed with
//! `kill -9`, a full disk, a read error, Ctrl-C) leaves that file in
//! `tmp/`: an unfinished upload is kept, not removed, when the run fails or
//! dies. The next run that stores the same snapshot continues it:
//!
//! 1. **Scan.** The file is read from its start, frame by frame: each zstd
//!    frame's header gives its raw length, its compressed length is found
//!    by walking its blocks, then it is decompressed (zstd checks the
//!    frame's content checksum) and each of its commands decoded (each
//!    command's CRC32C checked). The first frame that is cut short (the
//!    torn tail of a killed writer: its last megabyte of buffered output
//!    may be missing or half there), does not decompress, or holds a
//!    damaged or cut command ends what is kept; so does the frame with the
//!    END command (its stream would be whole; it is simply sent again). No
//!    side record is written while the run goes: the frames carry their
//!    own checksums, and re-deriving the state costs a decompression of
//!    what is kept (about a second per few hundred MB), against a send of
//!    it again. Neither is anything synced while the run goes: after a
//!    kill the page cache holds what was written; after a power cut the
//!    checks find whatever did not reach the disk.
//! 2. **State.** What the scan hashed and counted is what the writer
//!    needs to go on: the frame table (offset, length, raw length and
//!    BLAKE3 of each stored frame), the BLAKE3 state of the raw stream
//!    (rebuilt by hashing the decompressed frames in order: a
//!    `blake3::Hasher` has no serialised form, and rehashing is cheaper
//!    than the decompression it rides on), the command count, the protocol,
//!    and the shape chain of the resume design with the command index and
//!    stream offset where the kept frames end: a resume [`Token`].
//! 3. **Identity.** The first frame starts with the stream header and the
//!    SUBVOL or SNAPSHOT command: the snapshot's UUID and ctransid and, for
//!    an incremental stream, its parent's. They must be the snapshot this
//!    run stores and the parent it picks now; else the partial file is
//!    removed and the stream started over, with a notice. The zstd level
//!    and frame size may differ from the interrupted run's: they change
//!    the stored bytes, never the raw stream.
//! 4. **Proof, then append.** A repository may be writable by others, so
//!    a partial file in `tmp/` is not taken on trust: the send makes the
//!    whole stream again, and its first bytes, up to where the kept frames
//!    end, must have the BLAKE3 the scan found in them (other send options,
//!    another protocol, a filesystem whose layout changed, or a file this
//!    host did not write: the stream is started over, with a notice).
//!    That costs reading the kept part's file data again from the source,
//!    never compressing, storing or uploading it again. Then the file is
//!    cut after the last kept frame and the rest of the send appended as
//!    new frames, and the trailer is written over the whole frame table.
//!    The raw stream is byte for byte the stream an uninterrupted run
//!    stores (its BLAKE3 proves it); only the compressed bytes of frames
//!    may differ.
//!
//! A partial file is never listed, restored or verified as a stream:
//! `verify` notes it. `run` keeps only the partial files of the snapshots it
//! is about to store and removes the others (a partial of a snapshot that
//! is stored already, no longer on the source, changed since, or not
//! selected by this run); `forget` and `import` keep those whose snapshot is
//! not stored yet.
//!
//! # S3: recorded state
//!
//! The parts of an unfinished S3 multipart upload cannot be read back, so
//! step 1 and 2 cannot be done by reading: the state is recorded instead as
//! the parts are stored (`Checkpoint`, in the upload's marker; see the
//! `backup::s3` module, built with the `s3` feature). Parts end at frame
//! ends, so the point after a part is a clean cut: the stored bytes are
//! whole frames, the raw stream ends at a command boundary. The state
//! there is what the scan above derives:
//! the frame table, the command count and shape chain (the resume
//! [`Token`]), the protocol and snapshot identity, and the raw stream's
//! BLAKE3 state. That last one is a `blake3::Hasher`, which has no
//! serialised form, so the writer hashes the raw stream as aligned 16 KiB
//! subtrees (`treehash`, with blake3's `hazmat`), whose chaining values
//! and last partial block are the state: the continuation finishes the
//! same root hash from them, and the proof of step 4 compares the prefix
//! the send makes again with them. Steps 3 and 4 are the same (identity,
//! proof, then the remaining parts uploaded with the next part numbers and
//! the upload completed with all the parts).

use std::io::Cursor;

use serde::{Deserialize, Serialize};
use stream_format::{Command, DecodeError, ReaderOptions, StreamReader};

use super::file::format::{self, FRAME_HEADER_MAX, FrameInfo, Ident, MAX_FRAME_RAW, hyphenated};
use super::store::{Store, StoreError, TMP_DIR};
use super::treehash::{BLOCK, HashState, TreeHasher};
use crate::resume::{Shape, Token};

/// The snapshot (stream UUID, ctransid) whose stream file a `tmp/` key is
/// the unfinished upload of, from its name
/// (`tmp/UUID-CTRANSID-RANDOM.btrs.zst.…`); `None` for other temporary
/// files.
pub(crate) fn snapshot_of(key: &str) -> Option<(String, u64)> {
    let name = key.strip_prefix(TMP_DIR)?.strip_prefix('/')?;
    let (base, _) = name.split_once(".btrs.zst.")?;
    let uuid = base.get(..36)?;
    uuid::Uuid::try_parse(uuid).ok()?;
    let rest = base.get(36..)?.strip_prefix('-')?;
    let (ctransid, _) = rest.split_once('-')?;
    Some((uuid.to_ascii_lowercase(), ctransid.parse().ok()?))
}

/// What a stream file's writer continues from: the frames an interrupted
/// writer left whole (see this module), and the state of
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

/// What a partial stream file holds: its whole frames, the state after
/// them, and the snapshot it is of.
#[derive(Debug, Clone)]
pub(crate) struct Scan {
    /// The state the writer goes on from.
    pub(crate) kept: Continued,
    /// The resume point where the kept frames end, as `send --resume`
    /// takes it. A run sends the whole stream again instead and checks
    /// the kept part against it (step 4 of the module doc); the tests
    /// check the scan through it.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) token: Token,
    /// The snapshot's stream UUID (hyphenated, lowercase) and ctransid.
    pub(crate) uuid: String,
    pub(crate) ctransid: u64,
    /// The parent's, for an incremental stream.
    pub(crate) parent: Option<(String, u64)>,
    /// Why the file was cut where it was (`None`: it ended after a whole
    /// frame).
    pub(crate) cut: Option<String>,
    /// The key the continued upload completes as, when the store fixed it
    /// at the upload's start (an S3 multipart upload); `None`: any.
    pub(crate) file: Option<String>,
}

/// The snapshot a stream's first frame (its raw bytes, stream header
/// first) is of; `None` when it does not start with SUBVOL or SNAPSHOT.
pub(crate) fn ident_of(frame0: &[u8]) -> Option<Ident> {
    decode(true, 0, frame0).ok()?.ident
}

/// The state a continuation needs at the end of a frame, as a store that
/// cannot read an unfinished upload back (S3) records it when the parts
/// up to that frame are stored (see the module doc): JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    /// The snapshot's stream UUID (hyphenated) and ctransid.
    pub(crate) uuid: String,
    pub(crate) ctransid: u64,
    /// The parent's, for an incremental stream.
    pub(crate) parent: Option<(String, u64)>,
    /// The stream's protocol version.
    pub(crate) proto: u32,
    /// Commands before the point (the index of the next one).
    pub(crate) commands: u64,
    /// Their shape chain, hex.
    pub(crate) shape: String,
    /// Stored bytes before the point (the frames' total length).
    pub(crate) stored_bytes: u64,
    /// Raw stream bytes before the point.
    pub(crate) raw_bytes: u64,
    /// The raw stream's BLAKE3 state there.
    pub(crate) hash: HashState,
    /// The frames before the point.
    pub(crate) frames: Vec<FrameInfo>,
}

impl Checkpoint {
    /// The state after `frames` (`stored` bytes in the file, `raw` bytes of
    /// stream), of a stream of `ident`, as JSON.
    pub(crate) fn encode(
        ident: &Ident,
        (commands, shape, proto): (u64, Shape, u32),
        frames: &[FrameInfo],
        (stored, raw): (u64, u64),
        hasher: &TreeHasher,
    ) -> String {
        let c = Checkpoint {
            uuid: hyphenated(&ident.0),
            ctransid: ident.1,
            parent: ident.2.map(|(u, c)| (hyphenated(&u), c)),
            proto,
            commands,
            shape: shape.0.iter().map(|b| format!("{b:02x}")).collect(),
            stored_bytes: stored,
            raw_bytes: raw,
            hash: hasher.state(),
            frames: frames.to_vec(),
        };
        serde_json::to_string(&c).unwrap_or_default()
    }
}

/// The continuation an upload's recorded state allows: `json` is the
/// state recorded with its parts, which hold `stored` bytes; `file` the
/// key the upload completes as.
///
/// # Errors
///
/// Why the state cannot be continued (not one [`Checkpoint::encode`] makes,
/// or not the parts' end).
pub(crate) fn from_checkpoint(json: &str, stored: u64, file: &str) -> Result<Scan, String> {
    let c: Checkpoint =
        serde_json::from_str(json).map_err(|e| format!("its recorded state is unreadable: {e}"))?;
    let bad = |what: &str| format!("its recorded state is inconsistent: {what}");
    let uuid_bytes = |u: &str| uuid::Uuid::try_parse(u).ok().map(|u| *u.as_bytes());
    let uuid = uuid_bytes(&c.uuid).ok_or_else(|| bad("no snapshot UUID"))?;
    let parent = match &c.parent {
        Some((u, t)) => Some((uuid_bytes(u).ok_or_else(|| bad("no parent UUID"))?, *t)),
        None => None,
    };
    let mut shape = [0u8; 16];
    if c.shape.len() != 32 {
        return Err(bad("no shape chain"));
    }
    for (i, b) in shape.iter_mut().enumerate() {
        *b = c
            .shape
            .get(2 * i..2 * i + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .ok_or_else(|| bad("no shape chain"))?;
    }
    let (mut at, mut raw) = (0u64, 0u64);
    for f in &c.frames {
        if f.offset != at || f.len == 0 || f.raw_len == 0 {
            return Err(bad("the frame table has gaps"));
        }
        at = at.saturating_add(f.len);
        raw = raw.saturating_add(f.raw_len);
    }
    if at != c.stored_bytes || raw != c.raw_bytes || c.stored_bytes != stored {
        return Err(bad(&format!(
            "frames of {at} bytes ({raw} raw), state at {} ({} raw), parts of {stored} bytes",
            c.stored_bytes, c.raw_bytes
        )));
    }
    let hasher = TreeHasher::from_state(&c.hash)
        .filter(|_| {
            let tail = c.hash.tail.len() as u64 / 2;
            c.hash
                .blocks
                .checked_mul(BLOCK as u64)
                .and_then(|b| b.checked_add(tail))
                == Some(c.raw_bytes)
        })
        .ok_or_else(|| bad("no hash state of its raw bytes"))?;
    let token = Token {
        uuid,
        ctransid: c.ctransid,
        parent_uuid: parent.map_or([0; 16], |p| p.0),
        parent_ctransid: parent.map_or(0, |p| p.1),
        version: c.proto,
        index: c.commands,
        offset: c.raw_bytes,
        shape: Shape(shape),
    };
    Token::from_bytes(&token.to_bytes()).map_err(|e| bad(&e.to_string()))?;
    Ok(Scan {
        kept: Continued {
            frames: c.frames,
            stored_bytes: c.stored_bytes,
            raw_bytes: c.raw_bytes,
            commands: c.commands,
            shape: Shape(shape),
            proto: c.proto,
            ident: (uuid, c.ctransid, parent),
            hasher,
        },
        token,
        uuid: hyphenated(&uuid),
        ctransid: c.ctransid,
        parent: parent.map(|(u, t)| (hyphenated(&u), t)),
        cut: None,
        file: Some(file.to_owned()),
    })
}

/// A frame's commands, checked: their (number, wire length), and the first
/// command's identity for frame 0.
struct Decoded {
    shape: Vec<(u16, u64)>,
    ended: bool,
    proto: u32,
    ident: Option<Ident>,
}

/// Decode the commands of one frame's raw bytes (`raw` starts with the
/// stream header for frame 0; later frames get `proto`'s header in front).
fn decode(first: bool, proto: u32, raw: &[u8]) -> Result<Decoded, String> {
    let mut buf;
    let input: &[u8] = if first {
        raw
    } else {
        buf = Vec::with_capacity(raw.len() + stream_format::STREAM_HEADER_SIZE);
        buf.extend_from_slice(stream_format::STREAM_MAGIC);
        buf.extend_from_slice(&proto.to_le_bytes());
        buf.extend_from_slice(raw);
        &buf
    };
    let mut reader =
        StreamReader::with_options(Cursor::new(input), ReaderOptions::new().with_max_version(3));
    let mut out = Decoded {
        shape: Vec::new(),
        ended: false,
        proto,
        ident: None,
    };
    loop {
        let (info, cmd) = match reader.next_command() {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(DecodeError::TruncatedCommandHeader { available: 0, .. }) => break,
            Err(e) => return Err(e.to_string()),
        };
        if out.ended {
            return Err(String::from("a command follows the END command"));
        }
        if first && out.shape.is_empty() {
            out.ident = match cmd {
                Command::Subvol { uuid, ctransid, .. } => Some((uuid, ctransid, None)),
                Command::Snapshot {
                    uuid,
                    ctransid,
                    clone_uuid,
                    clone_ctransid,
                    ..
                } => Some((uuid, ctransid, Some((clone_uuid, clone_ctransid)))),
                _ => {
                    return Err(String::from(
                        "the stream does not start with SUBVOL or SNAPSHOT",
                    ));
                }
            };
        }
        out.ended = info.cmd == stream_format::CommandKind::End.number();
        out.shape.push((
            info.cmd,
            stream_format::CMD_HEADER_SIZE as u64 + u64::from(info.len),
        ));
    }
    if first {
        out.proto = reader.version().unwrap_or(0);
    }
    Ok(out)
}

/// Whether a read failed on what the partial file holds (an encrypted
/// one's chunk that does not authenticate: torn or changed), not on the
/// store: what comes before it can be kept.
fn is_damage(e: &StoreError) -> bool {
    matches!(e, StoreError::Other { op: "decrypt", .. })
}

/// Read the partial stream file `key` (`size` bytes) of `store` and work
/// out what of it can be kept (see the module doc).
///
/// # Errors
///
/// Why nothing of it can be kept (no whole first frame, not a snapshot's
/// stream); store errors as text.
pub(crate) fn scan(store: &dyn Store, key: &str, size: u64) -> Result<Scan, String> {
    let mut frames: Vec<FrameInfo> = Vec::new();
    let mut hasher = TreeHasher::new();
    let mut shape = Shape::default();
    let (mut at, mut raw_total, mut commands, mut proto) = (0u64, 0u64, 0u64, 0u32);
    let mut ident = None;
    let mut head = Vec::new();
    let mut buf = Vec::new();
    let cut = loop {
        let i = frames.len();
        if at >= size {
            break None;
        }
        let torn = |what: &str| Some(format!("frame {i} at byte offset {at} {what}"));
        let hlen = (size - at).min(FRAME_HEADER_MAX);
        match store.get_into(key, at..at + hlen, &mut head) {
            Ok(()) => {}
            Err(e) if is_damage(&e) => break torn(&format!("cannot be read: {e}")),
            Err(e) => return Err(e.to_string()),
        }
        let raw_len = match format::frame_raw_len(&head) {
            Some(n) if n > 0 && n <= MAX_FRAME_RAW => n,
            _ => break torn("has no whole zstd frame header with a content size"),
        };
        let bound = format::frame_stored_bound(raw_len);
        let window = (bound + 64).min(size - at);
        match store.get_into(key, at..at + window, &mut buf) {
            Ok(()) => {}
            Err(e) if is_damage(&e) => break torn(&format!("cannot be read: {e}")),
            Err(e) => return Err(e.to_string()),
        }
        let len = match format::frame_stored_len(&buf) {
            Some(l) if l > 0 => l,
            _ => break torn("is cut short"),
        };
        let data = &buf[..len];
        // OK to convert: at most MAX_FRAME_RAW (1 GiB).
        let raw = match format::decode_frame(data, usize::try_from(raw_len).unwrap_or(0)) {
            Ok(r) if r.len() as u64 == raw_len => r,
            Ok(r) => {
                break torn(&format!(
                    "decompresses to {} bytes, its header says {raw_len}",
                    r.len()
                ));
            }
            Err(e) => break torn(&format!("does not decompress: {e}")),
        };
        let d = match decode(i == 0, proto, &raw) {
            Ok(d) => d,
            Err(e) => {
                if i == 0 && e.contains("SUBVOL") {
                    return Err(e);
                }
                break torn(&format!("holds a damaged command: {e}"));
            }
        };
        if d.shape.is_empty() {
            break torn("holds no command");
        }
        if d.ended {
            // The whole stream is here: its last frame is sent again (a
            // continuation needs a point before the END command).
            break None;
        }
        if i == 0 {
            proto = d.proto;
            ident = d.ident;
        }
        for (cmd, wire) in d.shape {
            shape.push(cmd, wire);
            commands += 1;
        }
        hasher.update(&raw);
        frames.push(FrameInfo {
            offset: at,
            len: len as u64,
            raw_len,
            blake3: blake3::hash(data).to_hex().to_string(),
        });
        at += len as u64;
        raw_total += raw_len;
    };
    let Some((uuid, ctransid, parent)) = ident else {
        return Err(cut.unwrap_or_else(|| String::from("no whole frame before the END command")));
    };
    let token = Token {
        uuid,
        ctransid,
        parent_uuid: parent.map_or([0; 16], |p| p.0),
        parent_ctransid: parent.map_or(0, |p| p.1),
        version: proto,
        index: commands,
        offset: raw_total,
        shape,
    };
    Ok(Scan {
        kept: Continued {
            frames,
            stored_bytes: at,
            raw_bytes: raw_total,
            commands,
            shape,
            proto,
            ident: (uuid, ctransid, parent),
            hasher,
        },
        token,
        uuid: hyphenated(&uuid),
        ctransid,
        parent: parent.map(|(u, c)| (hyphenated(&u), c)),
        cut,
        file: None,
    })
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;
    use crate::backup::file::{FileWriter, StreamFile, StreamIdentity, WriterOptions};
    use crate::backup::store::LocalStore;

    /// A stream of a snapshot (SUBVOL) or an incremental one (SNAPSHOT)
    /// with `cmds` WRITEs of varied lengths.
    fn stream(cmds: usize, parent: bool) -> Vec<u8> {
        use std::borrow::Cow;
        let mut w = stream_format::StreamWriter::new(Vec::new(), 1).unwrap();
        if parent {
            w.write(&Command::Snapshot {
                path: Cow::Borrowed(b"s"),
                uuid: [1; 16],
                ctransid: 7,
                clone_uuid: [2; 16],
                clone_ctransid: 5,
            })
            .unwrap();
        } else {
            w.write(&Command::Subvol {
                path: Cow::Borrowed(b"s"),
                uuid: [1; 16],
                ctransid: 7,
            })
            .unwrap();
        }
        for i in 0..cmds {
            let data: Vec<u8> = (0..1000 + 37 * (i % 50))
                .map(|j| (j * 7 + i) as u8)
                .collect();
            w.write(&Command::Write {
                path: Cow::Borrowed(b"f"),
                offset: (i * 4000) as u64,
                data: Cow::Borrowed(&data),
            })
            .unwrap();
        }
        w.write(&Command::End).unwrap();
        w.into_inner()
    }

    const KEY: &str = "tmp/01010101-0101-0101-0101-010101010101-7-0000abcd.btrs.zst.77.0123";

    fn opts() -> WriterOptions {
        WriterOptions::new().with_frame_bytes(6000).with_threads(2)
    }

    /// The partial file a writer killed after `n` raw bytes leaves (the
    /// frames handed to the upload, flushed; the rest lost).
    fn interrupted(store: &LocalStore, raw: &[u8], n: usize) -> u64 {
        let mut up = store.multipart("streams/x").unwrap();
        up.keep_when_dropped();
        let mut w = FileWriter::new(up, opts());
        w.write_all(&raw[..n]).unwrap();
        drop(w);
        let tmp = store.list("tmp/").unwrap();
        assert_eq!(tmp.len(), 1, "{tmp:?}");
        std::fs::rename(store.root().join(&tmp[0].key), store.root().join(KEY)).unwrap();
        tmp[0].size
    }

    /// Continue the partial file with the rest of `raw` from the scan's
    /// point; the finished file's raw stream.
    fn finish(store: &LocalStore, raw: &[u8], scan: &Scan) -> Vec<u8> {
        let up = store
            .continue_upload(KEY, scan.kept.stored_bytes, "streams/done")
            .unwrap()
            .unwrap();
        let mut w = FileWriter::continued(up, opts(), scan.kept.clone());
        let from = usize::try_from(scan.token.offset).unwrap();
        for c in raw[from..].chunks(3333) {
            w.write_all(c).unwrap();
        }
        let id = StreamIdentity {
            uuid: scan.uuid.clone(),
            ctransid: scan.ctransid,
            parent: scan.parent.clone(),
        };
        let (trailer, size) = w.finish(id).unwrap();
        assert_eq!(trailer.stream_bytes, raw.len() as u64);
        assert_eq!(
            trailer.stream_blake3,
            blake3::hash(raw).to_hex().to_string(),
            "the whole stream's hash goes on from the kept frames"
        );
        assert_eq!(trailer.commands, stream_format_commands(raw));
        assert!(store.list("tmp/").unwrap().is_empty());
        let f = StreamFile::open(store, "streams/done", size).unwrap();
        let mut out = Vec::new();
        f.raw_reader(store).read_to_end(&mut out).unwrap();
        assert!(crate::backup::verify::check_frames_parallel(
            store,
            &f,
            &crate::backup::NoProgress
        ));
        out
    }

    fn stream_format_commands(raw: &[u8]) -> u64 {
        let mut r = StreamReader::new(raw);
        let mut n = 0;
        while r.next_command().unwrap().is_some() {
            n += 1;
        }
        n
    }

    /// The shape chain and the command count up to byte `at` of `raw`.
    fn shape_at(raw: &[u8], at: u64) -> (Shape, u64) {
        let mut r = StreamReader::new(raw);
        let (mut s, mut n) = (Shape::default(), 0);
        while let Some((info, _)) = r.next_command().unwrap() {
            if info.offset >= at {
                break;
            }
            s.push(info.cmd, 10 + u64::from(info.len));
            n += 1;
        }
        (s, n)
    }

    /// An upload into memory that records the state at the end of every
    /// write that fills a "part" of `part` bytes, as the S3 store does.
    struct Recording {
        data: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
        states: std::sync::Arc<std::sync::Mutex<Vec<(u64, String)>>>,
        part: usize,
        buffered: usize,
    }

    impl crate::backup::store::Upload for Recording {
        fn write(&mut self, data: &[u8]) -> Result<(), crate::backup::StoreError> {
            self.data.lock().unwrap().extend_from_slice(data);
            Ok(())
        }
        fn records_state(&self) -> bool {
            true
        }
        fn write_resumable(
            &mut self,
            data: &[u8],
            state: &mut dyn FnMut() -> Option<String>,
        ) -> Result<(), crate::backup::StoreError> {
            self.write(data)?;
            self.buffered += data.len();
            if self.buffered >= self.part {
                self.buffered = 0;
                let at = self.data.lock().unwrap().len() as u64;
                let s = state().expect("a state once frame 0 is stored");
                self.states.lock().unwrap().push((at, s));
            }
            Ok(())
        }
        fn complete(self: Box<Self>) -> Result<(), crate::backup::StoreError> {
            Ok(())
        }
    }

    type Shared<T> = std::sync::Arc<std::sync::Mutex<T>>;
    /// The states recorded: (stored bytes, state).
    type States = Shared<Vec<(u64, String)>>;

    fn recording(start: Vec<u8>) -> (Recording, Shared<Vec<u8>>, States) {
        let data = std::sync::Arc::new(std::sync::Mutex::new(start));
        let states = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let up = Recording {
            data: data.clone(),
            states: states.clone(),
            part: 1500,
            buffered: 0,
        };
        (up, data, states)
    }

    #[test]
    fn a_recorded_state_continues_into_the_same_file() {
        for parent in [false, true] {
            let raw = stream(400, parent);
            let (up, data, states) = recording(Vec::new());
            let mut w = FileWriter::new(Box::new(up), opts());
            for c in raw.chunks(5000) {
                w.write_all(c).unwrap();
            }
            let id = StreamIdentity {
                uuid: String::from("01010101-0101-0101-0101-010101010101"),
                ctransid: 7,
                parent: parent.then(|| (String::from("02020202-0202-0202-0202-020202020202"), 5)),
            };
            let (want, _) = w.finish(id.clone()).unwrap();
            let whole = data.lock().unwrap().clone();
            let states = states.lock().unwrap().clone();
            assert!(states.len() > 10, "{}", states.len());
            for (stored, state) in states.iter().step_by(3) {
                let scan = from_checkpoint(state, *stored, "streams/k").unwrap();
                assert_eq!(scan.file.as_deref(), Some("streams/k"));
                assert_eq!((scan.uuid.as_str(), scan.ctransid), (id.uuid.as_str(), 7));
                assert_eq!(scan.parent, id.parent);
                let (shape, index) = shape_at(&raw, scan.token.offset);
                assert_eq!((scan.token.shape, scan.token.index), (shape, index));
                assert_eq!(scan.kept.frames[..], want.frames[..scan.kept.frames.len()]);
                // Continued by a writer that holds only the stored prefix.
                let prefix = whole[..usize::try_from(*stored).unwrap()].to_vec();
                let (up, data2, _) = recording(prefix);
                let mut w = FileWriter::continued(Box::new(up), opts(), scan.kept.clone());
                let from = usize::try_from(scan.token.offset).unwrap();
                for c in raw[from..].chunks(3333) {
                    w.write_all(c).unwrap();
                }
                let (t, _) = w.finish(id.clone()).unwrap();
                assert_eq!(t, want, "continued at {stored}");
                assert_eq!(*data2.lock().unwrap(), whole);
                assert_eq!(t.stream_blake3, blake3::hash(&raw).to_hex().to_string());
            }
            // A state that does not match its parts is refused.
            let (stored, state) = &states[2];
            let e = from_checkpoint(state, stored + 1, "k").unwrap_err();
            assert!(e.contains("inconsistent"), "{e}");
            let e = from_checkpoint("{}", 0, "k").unwrap_err();
            assert!(e.contains("unreadable"), "{e}");
        }
    }

    #[test]
    fn names_of_partial_stream_files() {
        assert_eq!(
            snapshot_of(KEY),
            Some((String::from("01010101-0101-0101-0101-010101010101"), 7))
        );
        assert_eq!(snapshot_of("tmp/00000007.json.12.0123"), None);
        assert_eq!(
            snapshot_of("streams/01010101-0101-0101-0101-010101010101-7-0.btrs.zst"),
            None
        );
        assert_eq!(
            snapshot_of("tmp/not-a-uuid-at-all-0101-010101010101-7-0.btrs.zst.1.2"),
            None
        );
    }

    #[test]
    fn an_interrupted_file_continues_into_the_same_raw_stream() {
        for parent in [false, true] {
            let raw = stream(400, parent);
            for n in [raw.len() / 5, raw.len() / 2, raw.len() - 3] {
                let dir = tempfile::tempdir().unwrap();
                let s = LocalStore::new(dir.path());
                let size = interrupted(&s, &raw, n);
                let scan = scan(&s, KEY, size).unwrap();
                assert_eq!(scan.cut, None, "whole frames only");
                assert_eq!(scan.uuid, "01010101-0101-0101-0101-010101010101");
                assert_eq!(scan.ctransid, 7);
                let want_parent =
                    parent.then(|| (String::from("02020202-0202-0202-0202-020202020202"), 5));
                assert_eq!(scan.parent, want_parent);
                assert_eq!(scan.kept.stored_bytes, size);
                // At most the frame being filled and those in the
                // compression pipeline are lost.
                assert!(scan.kept.raw_bytes > 0 && scan.kept.raw_bytes <= n as u64);
                let (shape, index) = shape_at(&raw, scan.token.offset);
                assert_eq!((scan.token.shape, scan.token.index), (shape, index));
                assert_eq!(scan.token.offset, scan.kept.raw_bytes);
                assert_eq!(scan.kept.commands, index);
                // The token is one `send --resume` accepts.
                let t = Token::from_bytes(&scan.token.to_bytes()).unwrap();
                assert_eq!(t.has_parent(), parent);
                assert_eq!(finish(&s, &raw, &scan), raw);
            }
        }
    }

    #[test]
    fn a_torn_or_damaged_tail_is_cut_back_to_the_last_intact_frame() {
        let raw = stream(400, false);
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        let size = interrupted(&s, &raw, raw.len() * 2 / 3);
        let path = dir.path().join(KEY);
        let whole = std::fs::read(&path).unwrap();
        let full = scan(&s, KEY, size).unwrap();
        let frames = full.kept.frames.clone();
        assert!(frames.len() > 10, "{}", frames.len());
        let last = frames.last().unwrap().clone();
        let kept_before_last = |sc: &Scan| {
            assert_eq!(sc.kept.frames.len(), frames.len() - 1);
            assert_eq!(sc.kept.stored_bytes, last.offset);
            assert_eq!(sc.kept.frames[..], frames[..frames.len() - 1]);
        };
        // Torn: the last frame cut in its middle.
        let torn = u64::try_from(whole.len()).unwrap() - last.len / 2;
        std::fs::write(&path, &whole[..usize::try_from(torn).unwrap()]).unwrap();
        let sc = scan(&s, KEY, torn).unwrap();
        kept_before_last(&sc);
        let why = sc.cut.clone().unwrap();
        assert!(
            why.contains(&format!(
                "frame {} at byte offset {}",
                frames.len() - 1,
                last.offset
            )) && why.contains("cut short"),
            "{why}"
        );
        // A byte flipped in the last frame's compressed bytes, or a few
        // bytes of garbage after the last whole frame.
        for flip in [last.offset + last.len / 2, last.offset + last.len - 2] {
            let mut bad = whole.clone();
            bad[usize::try_from(flip).unwrap()] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            let sc = scan(&s, KEY, size).unwrap();
            kept_before_last(&sc);
            assert!(sc.cut.is_some());
        }
        let mut garbage = whole.clone();
        garbage.extend_from_slice(&[0x28, 0xb5, 0x2f, 0xfd, 0, 0]);
        std::fs::write(&path, &garbage).unwrap();
        let sc = scan(&s, KEY, size + 6).unwrap();
        assert_eq!(sc.kept.frames, frames);
        assert!(sc.cut.unwrap().contains(&format!("frame {}", frames.len())));
        // Cut back, it still continues into the same stream.
        std::fs::write(&path, &whole[..usize::try_from(torn).unwrap()]).unwrap();
        let sc = scan(&s, KEY, torn).unwrap();
        assert_eq!(finish(&s, &raw, &sc), raw);
    }

    #[test]
    fn a_file_without_a_whole_first_frame_or_of_no_snapshot_is_refused() {
        let raw = stream(400, false);
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        let size = interrupted(&s, &raw, raw.len() / 2);
        let path = dir.path().join(KEY);
        let whole = std::fs::read(&path).unwrap();
        std::fs::write(&path, &whole[..100]).unwrap();
        let e = scan(&s, KEY, 100).unwrap_err();
        assert!(e.contains("frame 0 at byte offset 0 is cut short"), "{e}");
        std::fs::write(&path, b"").unwrap();
        assert!(scan(&s, KEY, 0).is_err());
        let _ = size;
        // A stream that starts with another command.
        let mut w = stream_format::StreamWriter::new(Vec::new(), 1).unwrap();
        w.write(&Command::Mkdir {
            path: std::borrow::Cow::Borrowed(b"d"),
            ino: 257,
        })
        .unwrap();
        let other = zstd::bulk::compress(&w.into_inner(), 3).unwrap();
        std::fs::write(&path, &other).unwrap();
        let e = scan(&s, KEY, other.len() as u64).unwrap_err();
        assert!(e.contains("does not start with SUBVOL or SNAPSHOT"), "{e}");
    }
}
