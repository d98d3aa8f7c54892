//! The stream file's format: what its bytes are, apart from who writes or
//! reads them. The frame table ([`FrameInfo`]) and the [`Trailer`], the
//! trailer's encoding in a zstd skippable frame, the limits a reader
//! enforces, the identity of the stream a file holds (its first command),
//! the damage a reader can find ([`Damage`]), and the frame codec.
//!
//! # The frame codec: the seam for another encoding of stored bytes
//!
//! Every place that turns a frame's raw bytes (a run of whole send-stream
//! commands) into its stored bytes, or back, goes through the codec section
//! below (`FrameEncoder`, `FrameDecoder`, `decode_frame`,
//! `decode_frame_start`, and for a file without a trailer `frame_raw_len`
//! and `frame_stored_len`): today an ordinary zstd frame
//! with its content size and checksum, so `zstd -dc FILE` restores the raw
//! stream. A codec that changes the stored bytes (encryption, say) plugs in
//! here and nowhere else: it encodes after compression and decodes before
//! decompression. The frame table's BLAKE3 is of the stored bytes, so
//! damage is still found before a frame is decoded; a codec that does not
//! keep zstd's framing must also say how long a stored frame is, for the
//! scan of a partial file ([`partial`](crate::backup::partial)).
//!
//! This module does no I/O and keeps no state: the writer and the reader
//! own the files.

use std::io::{self, Read};
use std::ops::Range;

use serde::{Deserialize, Serialize};
use stream_format::{Command, ReaderOptions, StreamReader};

use crate::backup::store::StoreError;

/// Magic of the trailer's skippable frame (one of zstd's sixteen).
pub const TRAILER_FRAME_MAGIC: u32 = 0x184D_2A5E;
/// The last 8 bytes of a stream file.
pub const TRAILER_END_MAGIC: &[u8; 8] = b"BTRSTRL1";
/// Bytes after the trailer's JSON: its length and [`TRAILER_END_MAGIC`].
pub(crate) const TRAILER_TAIL: u64 = 16;
/// The skippable frame's header: magic and length.
pub(crate) const SKIPPABLE_HEADER: u64 = 8;
/// The trailer format this code writes.
pub const TRAILER_VERSION: u32 = 1;
/// Largest trailer JSON accepted (a corrupt length must not allocate
/// gigabytes): 64 MiB, room for about 300 000 frames.
pub(crate) const MAX_TRAILER_JSON: u64 = 64 << 20;

/// Largest [`WriterOptions::frame_bytes`](super::WriterOptions::frame_bytes) honoured (a frame is cut after
/// the command that crosses it, so readers can bound what they allocate).
pub const MAX_FRAME_BYTES: usize = 256 << 20;

/// Frames decompressed at most (a larger raw length in a trailer is damage):
/// writers cut frames at [`WriterOptions::frame_bytes`] plus one command
/// (`frame_bytes` is at most [`MAX_FRAME_BYTES`]).
///
/// [`WriterOptions::frame_bytes`]: super::WriterOptions::frame_bytes
pub const MAX_FRAME_RAW: u64 = 1 << 30;

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

/// A stream's snapshot: uuid and ctransid, and its parent's.
pub(crate) type Ident = ([u8; 16], u64, Option<([u8; 16], u64)>);

/// A UUID as text: hyphenated, lowercase.
pub(crate) fn hyphenated(u: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*u).hyphenated().to_string()
}

/// The snapshot a stream is of, from its first bytes (the stream header
/// and the first command: SUBVOL or SNAPSHOT).
///
/// # Errors
///
/// What is wrong, as text.
pub(crate) fn ident_of_prefix(raw: &[u8]) -> Result<Ident, String> {
    let mut reader = StreamReader::with_options(
        io::Cursor::new(raw),
        ReaderOptions::new().with_max_version(3),
    );
    match reader.next_command() {
        Ok(Some((_, Command::Subvol { uuid, ctransid, .. }))) => Ok((uuid, ctransid, None)),
        Ok(Some((
            _,
            Command::Snapshot {
                uuid,
                ctransid,
                clone_uuid,
                clone_ctransid,
                ..
            },
        ))) => Ok((uuid, ctransid, Some((clone_uuid, clone_ctransid)))),
        Ok(_) => Err(String::from(
            "the stream does not start with SUBVOL or SNAPSHOT",
        )),
        Err(e) => Err(format!("its first command does not decode: {e}")),
    }
}

/// An [`Ident`] as the catalog writes it: hyphenated UUIDs.
pub(crate) fn ident_text(id: &Ident) -> (String, u64, Option<(String, u64)>) {
    (
        hyphenated(&id.0),
        id.1,
        id.2.map(|(u, c)| (hyphenated(&u), c)),
    )
}

/// The trailer's bytes: the skippable frame.
pub(crate) fn encode_trailer(t: &Trailer) -> Result<Vec<u8>, StoreError> {
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

/// Where the trailer's skippable frame lies in a file of `size` bytes
/// whose last [`TRAILER_TAIL`] bytes are `tail`.
///
/// # Errors
///
/// What is wrong, as text.
pub(crate) fn trailer_span(tail: &[u8], size: u64) -> Result<Range<u64>, String> {
    if tail.get(8..16) != Some(&TRAILER_END_MAGIC[..]) {
        return Err(format!(
            "no end magic {} in the last 8 bytes (a truncated file?)",
            String::from_utf8_lossy(TRAILER_END_MAGIC)
        ));
    }
    let json_len = u64::from_le_bytes(tail[..8].try_into().unwrap_or_default());
    let start = size
        .checked_sub(TRAILER_TAIL)
        .and_then(|s| s.checked_sub(json_len))
        .and_then(|s| s.checked_sub(SKIPPABLE_HEADER))
        .filter(|_| json_len <= MAX_TRAILER_JSON)
        .ok_or_else(|| format!("trailer length {json_len} does not fit the file"))?;
    Ok(start..start + SKIPPABLE_HEADER + json_len)
}

/// The trailer in `head`, the bytes of [`trailer_span`] (which starts at
/// `start`), with its frame table checked against the file: frames one
/// after the other from offset 0 up to the trailer, their raw lengths
/// adding up to the stream's.
///
/// # Errors
///
/// What is wrong, as text.
pub(crate) fn decode_trailer(head: &[u8], start: u64) -> Result<Trailer, String> {
    let json_len = head.len() as u64 - SKIPPABLE_HEADER;
    let magic = u32::from_le_bytes(head[..4].try_into().unwrap_or_default());
    let body = u32::from_le_bytes(head[4..8].try_into().unwrap_or_default());
    if magic != TRAILER_FRAME_MAGIC || u64::from(body) != json_len + TRAILER_TAIL {
        return Err(format!("no skippable frame header at byte offset {start}"));
    }
    let trailer: Trailer = serde_json::from_slice(&head[8..])
        .map_err(|e| format!("unreadable JSON at byte offset {}: {e}", start + 8))?;
    if trailer.format != "btrsend-stream" || trailer.version != TRAILER_VERSION {
        return Err(format!(
            "format {} version {} (this btrsend reads btrsend-stream version {TRAILER_VERSION})",
            trailer.format, trailer.version
        ));
    }
    let mut at = 0u64;
    let mut raw = 0u64;
    for (i, f) in trailer.frames.iter().enumerate() {
        if f.raw_len > MAX_FRAME_RAW {
            return Err(format!(
                "frame {i} is recorded with {} raw bytes, more than any writer puts in a frame",
                f.raw_len
            ));
        }
        if f.offset != at || f.len == 0 {
            return Err(format!(
                "frame {i} is recorded at byte offset {} length {}, expected offset {at}",
                f.offset, f.len
            ));
        }
        at = at.saturating_add(f.len);
        raw = raw.saturating_add(f.raw_len);
    }
    if at != start {
        return Err(format!(
            "the frames end at byte offset {at}, the trailer starts at {start}"
        ));
    }
    if raw != trailer.stream_bytes {
        return Err(format!(
            "the frames hold {raw} raw bytes, the trailer says {}",
            trailer.stream_bytes
        ));
    }
    Ok(trailer)
}

// The frame codec (see the module docs): the only code that knows how a
// frame's stored bytes encode its raw bytes.

/// Encodes frames: one zstd context for every frame of a stream.
pub(crate) struct FrameEncoder(zstd::bulk::Compressor<'static>);

impl FrameEncoder {
    /// An encoder at zstd `level`.
    pub(crate) fn new(level: i32) -> io::Result<FrameEncoder> {
        zstd::bulk::Compressor::new(level).map(FrameEncoder)
    }

    /// One zstd frame with its content size and checksum, into `out`.
    pub(crate) fn encode(&mut self, raw: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        let c = &mut self.0;
        c.include_checksum(true)?;
        c.include_contentsize(true)?;
        out.clear();
        out.reserve(zstd::zstd_safe::compress_bound(raw.len()));
        c.compress_to_buffer(raw, out)?;
        Ok(())
    }
}

/// Decodes frames into buffers the caller reuses: one zstd context for
/// every frame a reading thread decodes.
pub(crate) struct FrameDecoder(Option<zstd::bulk::Decompressor<'static>>);

impl FrameDecoder {
    /// A decoder; `hash_checked`: the caller checks each frame's stored
    /// bytes against the trailer's BLAKE3 first. zstd then skips the
    /// frame's own checksum (XXH64 of its raw bytes): stored bytes that
    /// match their BLAKE3 hold the checksum the writer computed, so
    /// checking it again costs time and finds nothing.
    pub(crate) fn new(hash_checked: bool) -> FrameDecoder {
        let mut dctx = zstd::bulk::Decompressor::new().ok();
        if hash_checked && let Some(d) = dctx.as_mut() {
            // Should zstd refuse, it checks.
            let _ = d.set_parameter(zstd::zstd_safe::DParameter::ForceIgnoreChecksum(true));
        }
        FrameDecoder(dctx)
    }

    /// Decode the frame `stored` into `out`; returns the raw length.
    ///
    /// # Errors
    ///
    /// What is wrong, as text.
    pub(crate) fn decode_into(&mut self, stored: &[u8], out: &mut [u8]) -> Result<usize, String> {
        let Some(dctx) = self.0.as_mut() else {
            return Err(String::from("cannot start a zstd decompressor"));
        };
        dctx.decompress_to_buffer(stored, out)
            .map_err(|e| format!("does not decompress: {e}"))
    }
}

/// Decode the frame `stored` whose raw length is at most `capacity`.
pub(crate) fn decode_frame(stored: &[u8], capacity: usize) -> io::Result<Vec<u8>> {
    zstd::bulk::decompress(stored, capacity)
}

/// Decode the start of a frame from the start of its stored bytes: up to
/// `limit` raw bytes into `raw`. A frame cut short still gives what its
/// first blocks hold: an error after some bytes were decoded is not one.
pub(crate) fn decode_frame_start(stored: &[u8], limit: u64, raw: &mut Vec<u8>) -> io::Result<()> {
    let read = zstd::stream::read::Decoder::with_buffer(stored)
        .map(|d| d.single_frame().take(limit).read_to_end(raw));
    match read {
        Ok(Ok(_)) => Ok(()),
        // The first block was read whole: what it gave is enough.
        Ok(Err(_)) if !raw.is_empty() => Ok(()),
        Ok(Err(e)) | Err(e) => Err(e),
    }
}

/// Largest frame header (zstd: magic, descriptor, window, dictionary id,
/// content size).
pub(crate) const FRAME_HEADER_MAX: u64 = 18;

/// The raw length a stored frame's header records, from its first
/// [`FRAME_HEADER_MAX`] bytes (`None`: not a whole header, or none
/// recorded). For files without a trailer (a partial file).
pub(crate) fn frame_raw_len(head: &[u8]) -> Option<u64> {
    zstd::zstd_safe::get_frame_content_size(head).ok().flatten()
}

/// The most stored bytes a frame of `raw_len` raw bytes can take.
pub(crate) fn frame_stored_bound(raw_len: u64) -> u64 {
    // OK to convert: the caller bounds raw_len by MAX_FRAME_RAW.
    zstd::zstd_safe::compress_bound(usize::try_from(raw_len).unwrap_or(0)) as u64
}

/// The length of the stored frame that starts `buf` (`None`: cut short).
pub(crate) fn frame_stored_len(buf: &[u8]) -> Option<usize> {
    zstd::zstd_safe::find_frame_compressed_size(buf).ok()
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
