//! Reading a stream file: [`StreamFile::open`] reads and checks its
//! trailer, then frames are read one by one, each checked against its hash
//! before it is decoded, or the whole raw stream through a [`RawReader`],
//! whose stream hash and length are checked at its end.
//!
//! It only reads. Reading many frames ahead on several threads is
//! [`frames`](crate::backup::frames)' job, built on this one; what the
//! bytes mean is [`format`](super::format)'s.

use std::io::{self, Read};

use super::format::{self, Damage, Ident, ReadError, SKIPPABLE_HEADER, TRAILER_TAIL, Trailer};
use crate::backup::store::Store;

/// A stream file opened for reading: its trailer.
#[derive(Debug, Clone)]
pub struct StreamFile {
    /// The key of the file.
    pub key: String,
    /// Its size (of the plaintext, for an encrypted object).
    pub size: u64,
    /// Its trailer.
    pub trailer: Trailer,
}

impl StreamFile {
    /// Read the trailer of `key` (`stored` bytes long in the store; an
    /// encrypted object's plaintext is read) and check that the frame
    /// table covers the file up to the trailer.
    ///
    /// # Errors
    ///
    /// [`Damage::Trailer`]; store errors.
    pub fn open(store: &dyn Store, key: &str, stored: u64) -> Result<StreamFile, ReadError> {
        let size = store.plain_len(key, stored)?;
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
        let span = format::trailer_span(&tail, size).map_err(bad)?;
        let start = span.start;
        let head = store.get(key, Some(span))?;
        let trailer = format::decode_trailer(&head, start).map_err(bad)?;
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
        let out = format::decode_frame(data, cap)
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
        format::decode_frame_start(&data, RAW.min(f.raw_len), &mut raw)
            .map_err(|e| bad(format!("does not decompress: {e}")))?;
        format::ident_of_prefix(&raw).map_err(bad)
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
