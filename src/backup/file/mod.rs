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
//!
//! The file is three modules: [`format`](mod@format) (what the bytes are: the frame
//! table, the trailer, and the frame codec, the one place where stored
//! bytes are encoded and decoded), the writer ([`FileWriter`]) and the
//! reader ([`StreamFile`], [`RawReader`]). Only `format` knows how stored
//! bytes encode raw ones; the writer and the reader must go through it.

pub mod format;
mod reader;
mod writer;

pub use format::{
    Damage, FrameInfo, MAX_FRAME_BYTES, MAX_FRAME_RAW, ReadError, TRAILER_END_MAGIC,
    TRAILER_FRAME_MAGIC, TRAILER_VERSION, Trailer,
};
pub use reader::{RawReader, StreamFile, damage_of};
pub(crate) use reader::{into_read_error, io_damage};
pub use writer::{FileWriter, StreamIdentity, WriterOptions};

#[cfg(test)]
pub(crate) mod tests;
