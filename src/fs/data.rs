//! File contents: a file's extents turned into a gap-free sequence of
//! [`Segment`]s (data, prealloc, holes — explicit or implied under
//! NO_HOLES — clamped to i_size), and a [`FileReader`] that returns the
//! bytes, decompressing zlib, LZO and zstd extents and optionally verifying
//! data checksums against the csum tree, trying every mirror.
//!
//! Read path as in btrfs-progs `restore` (and
//! btrfs-fuse `btrfs_read_file`): extents in offset order, a compressed
//! extent is read and decoded whole, an uncompressed one only where it is
//! needed; checksums cover on-disk sectors, indexed by logical address
//! (the csum tree's `EXTENT_CSUM` items). NODATASUM inodes and prealloc ranges have no checksums.

#![warn(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::as_conversions
)]

use std::collections::BTreeMap;

use crate::csum::Csum;
use crate::error::{CorruptKind, Error, Location, Result};
use crate::ondisk;
use crate::tree::key::Key;
use crate::tree::walk::ItemRef;
use crate::types::Logical;

use super::compress::{self, decompress};
use super::items::{Compression, DiskExtent, ExtentData, FileExtent, Inode};
use super::tree::{Extents, FsTree, search_le};

/// Largest read done in one step of [`FileReader::read`] (bounds memory).
const MAX_READ: usize = 1 << 20;

/// How far past the current read a [`FileReader`] asks for data to be
/// prefetched (at most half the volume's data queue).
const PREFETCH_AHEAD: u64 = 16 << 20;

/// What a file range holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SegmentKind {
    /// No extent covers it (NO_HOLES), or an explicit hole extent
    /// (`disk_bytenr` 0; the extent is given).
    Hole(Option<FileExtent>),
    /// A preallocated extent: reads as zeros.
    Prealloc(FileExtent),
    /// Data: an inline or a regular extent.
    Data(FileExtent),
}

/// A file range `[offset, offset + len)` and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// File offset.
    pub offset: u64,
    /// Length (> 0).
    pub len: u64,
    /// What is there.
    pub kind: SegmentKind,
}

impl Segment {
    /// End offset.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }

    /// Whether `lseek(SEEK_DATA)` reports it as data (btrfs: inline and
    /// regular extents; holes and prealloc are holes).
    pub fn is_data(&self) -> bool {
        matches!(self.kind, SegmentKind::Data(_))
    }
}

/// The segments of one file, in order, covering `[start, i_size)` without
/// gaps. Streams over the file's extent items.
#[derive(Debug)]
pub struct Segments<'fs> {
    extents: Extents<'fs>,
    next: Option<FileExtent>,
    exhausted: bool,
    pos: u64,
    size: u64,
    sectorsize: u32,
}

impl<'fs> FsTree<'fs> {
    /// The segments of `inode` from file offset 0.
    pub fn segments(&self, inode: &Inode) -> Segments<'_> {
        Segments {
            extents: self.extents(inode.ino),
            next: None,
            exhausted: false,
            pos: 0,
            size: inode.size,
            sectorsize: self.sectorsize(),
        }
    }

    /// The segments of `inode` from file offset `offset` (the first one
    /// starts there).
    ///
    /// # Errors
    ///
    /// Tree read errors.
    pub fn segments_at(&self, inode: &Inode, offset: u64) -> Result<Segments<'_>> {
        Ok(Segments {
            extents: self.extents_at(inode.ino, offset)?,
            next: None,
            exhausted: false,
            pos: offset,
            size: inode.size,
            sectorsize: self.sectorsize(),
        })
    }

    /// A reader of `inode`'s contents; with `verify`, data checksums are
    /// checked (except for NODATASUM inodes).
    pub fn reader(&self, inode: &Inode, verify: bool) -> FileReader<'_, 'fs> {
        FileReader {
            tree: self,
            inode: *inode,
            verify,
            segments: None,
            current: None,
            pos: 0,
            decoded: None,
            ahead: None,
        }
    }

    /// The target of symlink `inode` (its inline extent, i_size bytes).
    ///
    /// # Errors
    ///
    /// Read errors; [`CorruptKind::BadField`] for an absurd size.
    pub fn read_link(&self, inode: &Inode) -> Result<Vec<u8>> {
        let len = usize::try_from(inode.size)
            .ok()
            .filter(|&n| n <= 65536)
            .ok_or_else(|| {
                Error::corrupt(
                    Location::Tree(self.id()),
                    CorruptKind::BadField {
                        field: "symlink size",
                        value: inode.size,
                        why: "longer than any symlink target",
                    },
                )
            })?;
        let mut buf = vec![0u8; len];
        self.reader(inode, false).read_exact_at(0, &mut buf)?;
        Ok(buf)
    }
}

impl Segments<'_> {
    fn next_segment(&mut self) -> Result<Option<Segment>> {
        if self.pos >= self.size {
            return Ok(None);
        }
        // The next extent that ends after `pos`.
        while self.next.is_none() && !self.exhausted {
            match self.extents.next().transpose()? {
                Some(e) if e.end(self.sectorsize) > self.pos => self.next = Some(e),
                Some(_) => {}
                None => self.exhausted = true,
            }
        }
        let start = self.pos;
        let seg = match &self.next {
            None => Segment {
                offset: start,
                len: self.size.saturating_sub(start),
                kind: SegmentKind::Hole(None),
            },
            Some(e) if e.file_offset > start => Segment {
                offset: start,
                len: e.file_offset.min(self.size).saturating_sub(start),
                kind: SegmentKind::Hole(None),
            },
            Some(e) => {
                let end = e.end(self.sectorsize).min(self.size);
                let kind = match &e.data {
                    ExtentData::Prealloc(_) => SegmentKind::Prealloc(e.clone()),
                    ExtentData::Regular(d) if d.disk_bytenr.get() == 0 => {
                        SegmentKind::Hole(Some(e.clone()))
                    }
                    _ => SegmentKind::Data(e.clone()),
                };
                if end >= e.end(self.sectorsize) {
                    self.next = None;
                }
                Segment {
                    offset: start,
                    len: end.saturating_sub(start),
                    kind,
                }
            }
        };
        self.pos = seg.end();
        if seg.len == 0 {
            // Only past i_size, which the check above excludes.
            self.pos = self.size;
            return Ok(None);
        }
        Ok(Some(seg))
    }
}

impl Iterator for Segments<'_> {
    type Item = Result<Segment>;

    fn next(&mut self) -> Option<Self::Item> {
        let r = self.next_segment();
        if r.is_err() {
            self.pos = self.size;
        }
        r.transpose()
    }
}

/// The data ranges `lseek(SEEK_DATA)`/`SEEK_HOLE` report for a file:
/// adjacent data segments merged, as `(offset, len)`.
///
/// # Errors
///
/// Tree read errors and corrupt extent items.
pub fn data_ranges(segments: Segments<'_>) -> Result<Vec<(u64, u64)>> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for seg in segments {
        let seg = seg?;
        if !seg.is_data() {
            continue;
        }
        match out.last_mut() {
            Some((off, len)) if off.saturating_add(*len) == seg.offset => {
                *len = len.saturating_add(seg.len);
            }
            _ => out.push((seg.offset, seg.len)),
        }
    }
    Ok(out)
}

/// A decoded compressed or inline extent, kept while reads stay inside it.
#[derive(Debug)]
struct Decoded {
    /// Identifies the extent: (disk_bytenr, disk_num_bytes) or inline.
    id: (u64, u64),
    bytes: Vec<u8>,
}

/// Reads a file's bytes, forward from where the last read stopped (seeking
/// back restarts the extent walk at the right extent).
#[derive(Debug)]
pub struct FileReader<'t, 'fs> {
    tree: &'t FsTree<'fs>,
    inode: Inode,
    verify: bool,
    segments: Option<Segments<'t>>,
    current: Option<Segment>,
    pos: u64,
    decoded: Option<Decoded>,
    /// Data prefetch: how far ahead the extents were announced.
    ahead: Option<Ahead<'fs>>,
}

/// A second walk over a file's extents, running ahead of the reads: the
/// data of the next extents is queued for prefetch
/// ([`Volume::prefetch_data`](crate::volume::Volume::prefetch_data)), a
/// bounded window ahead, forward only.
#[derive(Debug)]
struct Ahead<'fs> {
    extents: Extents<'fs>,
    /// The extent the window stopped in.
    pending: Option<FileExtent>,
    /// File offset up to which data was announced.
    to: u64,
    exhausted: bool,
}

impl<'t, 'fs> FileReader<'t, 'fs> {
    /// The inode being read.
    pub fn inode(&self) -> &Inode {
        &self.inode
    }

    /// The current position.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Move to `offset`. Forward moves continue the extent walk; backward
    /// moves restart it at the extent covering `offset`.
    pub fn seek(&mut self, offset: u64) {
        if offset < self.current.as_ref().map_or(0, |s| s.offset) {
            self.segments = None;
            self.current = None;
        }
        if offset < self.pos {
            self.ahead = None;
        }
        self.pos = offset;
    }

    /// Announce the data of `[from, from + PREFETCH_AHEAD)` not announced
    /// yet (the read about to be done ends at `from`). Only with readahead,
    /// and only for files that go on past `from`. Errors stop the prefetch
    /// (the reads report them).
    fn prefetch_ahead(&mut self, from: u64) {
        if self.prefetch_ahead_inner(from).is_err()
            && let Some(a) = self.ahead.as_mut()
        {
            a.exhausted = true;
            a.pending = None;
        }
    }

    fn prefetch_ahead_inner(&mut self, from: u64) -> Result<()> {
        let vol = self.tree.volume();
        if from >= self.inode.size || !vol.read_options().readahead {
            return Ok(());
        }
        let window = PREFETCH_AHEAD.min(vol.read_options().data_queue_bytes / 2);
        let target = from.saturating_add(window).min(self.inode.size);
        if self.ahead.as_ref().is_none_or(|a| a.to < from) {
            self.ahead = Some(Ahead {
                extents: self.tree.extents_at(self.inode.ino, from)?,
                pending: None,
                to: from,
                exhausted: false,
            });
        }
        let Some(ahead) = self.ahead.as_mut() else {
            return Ok(());
        };
        let sectorsize = self.tree.sectorsize();
        let mut ranges: Vec<(Logical, u64)> = Vec::new();
        while ahead.to < target && !ahead.exhausted {
            let e = match ahead.pending.take() {
                Some(e) => e,
                None => match ahead.extents.next().transpose()? {
                    Some(e) => e,
                    None => {
                        // No more extents: nothing left to announce (a hole
                        // up to i_size under NO_HOLES), and no restart.
                        ahead.exhausted = true;
                        ahead.to = ahead.to.max(self.inode.size);
                        break;
                    }
                },
            };
            let end = e.end(sectorsize);
            if end <= ahead.to {
                continue;
            }
            let lo = ahead.to.max(e.file_offset);
            if lo >= target {
                ahead.pending = Some(e);
                break;
            }
            let hi = end.min(target);
            match (&e.data, e.compression) {
                (ExtentData::Regular(d), Compression::None) if d.disk_bytenr.get() != 0 => {
                    let at = d
                        .disk_bytenr
                        .checked_add(d.offset)
                        .and_then(|l| l.checked_add(lo.saturating_sub(e.file_offset)));
                    if let Some(at) = at {
                        ranges.push((at, hi.saturating_sub(lo)));
                    }
                }
                // Compressed: read whole, once (when the window enters it).
                (ExtentData::Regular(d), _) if d.disk_bytenr.get() != 0 && lo == e.file_offset => {
                    ranges.push((d.disk_bytenr, d.disk_num_bytes));
                }
                // Inline, holes, prealloc: nothing to read.
                _ => {}
            }
            ahead.to = hi;
            if hi < end {
                ahead.pending = Some(e);
            }
        }
        if !ranges.is_empty() {
            vol.prefetch_data(&ranges);
        }
        Ok(())
    }

    /// Read at the current position into `buf`; returns how many bytes were
    /// read (0 at end of file; possibly fewer than asked, as
    /// `std::io::Read`).
    ///
    /// # Errors
    ///
    /// Tree and device read errors, corrupt extents, data that does not
    /// decompress, and (when verifying) checksum mismatches on every
    /// mirror, naming the inode, file offset, logical address and mirror.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        if self.pos >= self.inode.size || buf.is_empty() {
            return Ok(0);
        }
        let seg = loop {
            match &self.current {
                Some(s) if s.offset <= self.pos && self.pos < s.end() => break s.clone(),
                _ => {}
            }
            if self.segments.is_none() {
                self.segments = Some(self.tree.segments_at(&self.inode, self.pos)?);
            }
            let next = match self.segments.as_mut() {
                Some(s) => s.next_segment()?,
                None => None,
            };
            match next {
                Some(s) => self.current = Some(s),
                // Cannot happen below i_size (segments cover it); be safe.
                None => return Ok(0),
            }
        };
        let left = usize::try_from(seg.end().saturating_sub(self.pos)).unwrap_or(usize::MAX);
        let n = buf.len().min(left).min(MAX_READ);
        self.prefetch_ahead(self.pos.saturating_add(u64::try_from(n).unwrap_or(0)));
        let out = buf.get_mut(..n).unwrap_or_default();
        match &seg.kind {
            SegmentKind::Hole(_) | SegmentKind::Prealloc(_) => out.fill(0),
            SegmentKind::Data(e) => self.read_extent(e, out)?,
        }
        self.pos = self.pos.saturating_add(u64::try_from(n).unwrap_or(0));
        Ok(n)
    }

    /// Fill `buf` from file offset `offset`; bytes past i_size read as
    /// zeros.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    pub fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.seek(offset);
        let mut done = 0usize;
        while done < buf.len() {
            let n = self.read(buf.get_mut(done..).unwrap_or_default())?;
            if n == 0 {
                buf.get_mut(done..).unwrap_or_default().fill(0);
                break;
            }
            done = done.saturating_add(n);
        }
        Ok(())
    }

    /// The reader of this inode's extent items.
    fn extent_reader(&self) -> ExtentReader<'t, 'fs> {
        self.tree
            .extent_reader(self.inode.ino, self.verify && !self.inode.nodatasum())
    }

    /// Fill `out` with the bytes of data extent `e` at `self.pos`, keeping
    /// a decoded extent for the next reads.
    fn read_extent(&mut self, e: &FileExtent, out: &mut [u8]) -> Result<()> {
        let ext = self.extent_reader();
        ext.read_cached(e, self.pos, out, &mut self.decoded)
    }
}

/// Reads the bytes of one inode's file extent items — the one data path of
/// the filesystem model, used by [`FileReader`] and by send (which reads
/// extent by extent, from several threads: it is `Copy` and `Sync`).
///
/// An uncompressed extent is read only where asked; a compressed or inline
/// one is decoded whole. With verification, every sector read is checked
/// against the csum tree and a bad one is read from the next copy.
#[derive(Debug, Clone, Copy)]
pub struct ExtentReader<'t, 'fs> {
    tree: &'t FsTree<'fs>,
    ino: u64,
    verify: bool,
}

impl<'fs> FsTree<'fs> {
    /// A reader of the extent items of inode `ino`; with `verify`, data
    /// checksums are checked (sectors without a stored checksum, as in
    /// NODATASUM files and prealloc ranges, are not).
    pub fn extent_reader(&self, ino: u64, verify: bool) -> ExtentReader<'_, 'fs> {
        ExtentReader {
            tree: self,
            ino,
            verify,
        }
    }
}

impl ExtentReader<'_, '_> {
    /// The inode whose extents are read.
    pub fn ino(&self) -> u64 {
        self.ino
    }

    fn data_error(&self, file_offset: u64, logical: Logical, kind: CorruptKind) -> Error {
        Error::corrupt(
            Location::FileData {
                tree: self.tree.id(),
                ino: self.ino,
                file_offset,
                logical,
                mirror: (1, 1),
            },
            kind,
        )
    }

    /// Fill `out` with the file bytes of extent `e` from file offset
    /// `offset` (inside the extent's range); bytes past the extent's data
    /// (an inline extent's sector tail) and holes and prealloc ranges read
    /// as zeros.
    ///
    /// # Errors
    ///
    /// Device read errors, corrupt extents, data that does not decompress,
    /// and (when verifying) checksum mismatches on every mirror, naming the
    /// inode, file offset, logical address and mirror.
    pub fn read_at(&self, e: &FileExtent, offset: u64, out: &mut [u8]) -> Result<()> {
        self.read_cached(e, offset, out, &mut None)
    }

    /// [`read_at`](Self::read_at), keeping the decoded extent in `cache`
    /// (and using it when it is `e`'s).
    fn read_cached(
        &self,
        e: &FileExtent,
        offset: u64,
        out: &mut [u8],
        cache: &mut Option<Decoded>,
    ) -> Result<()> {
        if e.is_hole_or_prealloc() {
            out.fill(0);
            return Ok(());
        }
        let within = offset.saturating_sub(e.file_offset);
        match (&e.data, e.compression) {
            (ExtentData::Regular(d), Compression::None) => {
                let at = d
                    .disk_bytenr
                    .checked_add(d.offset)
                    .and_then(|l| l.checked_add(within))
                    .ok_or_else(|| {
                        self.data_error(
                            offset,
                            d.disk_bytenr,
                            CorruptKind::BadField {
                                field: "disk_bytenr",
                                value: d.disk_bytenr.get(),
                                why: "extent ends past 2^64",
                            },
                        )
                    })?;
                self.read_disk(at, out, offset).map(|_| ())
            }
            // Plain inline data: straight from the item, no decoded copy.
            (ExtentData::Inline(bytes), Compression::None) => {
                copy_padded(bytes, within, out);
                Ok(())
            }
            _ => {
                let id = match &e.data {
                    ExtentData::Regular(d) => (d.disk_bytenr.get(), d.disk_num_bytes),
                    _ => (0, 0),
                };
                if cache.as_ref().is_none_or(|c| c.id != id) {
                    let bytes = self.decoded(e)?;
                    *cache = Some(Decoded { id, bytes });
                }
                let bytes = cache.as_ref().map(|d| &d.bytes[..]).unwrap_or(&[]);
                let skip = match &e.data {
                    ExtentData::Regular(d) => d.offset,
                    _ => 0,
                }
                .saturating_add(within);
                copy_padded(bytes, skip, out);
                Ok(())
            }
        }
    }

    /// The encoded bytes of extent `e` as stored: an inline extent's
    /// payload, or a regular extent's whole on-disk extent
    /// (`disk_num_bytes`, verified when asked; at most 128 KiB when
    /// compressed). Empty for holes and prealloc extents.
    ///
    /// # Errors
    ///
    /// As [`read_at`](Self::read_at).
    pub fn raw(&self, e: &FileExtent) -> Result<Vec<u8>> {
        match &e.data {
            ExtentData::Inline(bytes) => Ok(bytes.to_vec()),
            ExtentData::Regular(d) if d.disk_bytenr.get() != 0 => {
                let mut buf = vec![0u8; self.disk_len(e, d)?];
                self.read_disk(d.disk_bytenr, &mut buf, e.file_offset)?;
                Ok(buf)
            }
            ExtentData::Regular(_) | ExtentData::Prealloc(_) => Ok(Vec::new()),
        }
    }

    /// The on-disk length of regular extent `d` of `e`, as a buffer size.
    fn disk_len(&self, e: &FileExtent, d: &DiskExtent) -> Result<usize> {
        let max = if e.compression == Compression::None {
            usize::MAX
        } else {
            compress::MAX_UNCOMPRESSED
        };
        usize::try_from(d.disk_num_bytes)
            .ok()
            .filter(|&n| n <= max)
            .ok_or_else(|| {
                self.data_error(
                    e.file_offset,
                    d.disk_bytenr,
                    CorruptKind::BadField {
                        field: "disk_num_bytes",
                        value: d.disk_num_bytes,
                        why: "a compressed extent is at most 128 KiB on disk",
                    },
                )
            })
    }

    /// The whole decoded content of an inline or compressed extent
    /// (`ram_bytes` long, at most 128 KiB). When the bytes read were not
    /// checked against checksums and do not decompress, the other copies
    /// are tried in turn.
    ///
    /// # Errors
    ///
    /// As [`read_at`](Self::read_at).
    pub fn decoded(&self, e: &FileExtent) -> Result<Vec<u8>> {
        let ram = usize::try_from(e.ram_bytes).unwrap_or(usize::MAX);
        let ram = ram.min(compress::MAX_UNCOMPRESSED);
        let Some(alg) = e.compression.algorithm(self.tree.sectorsize()) else {
            // Uncompressed inline data.
            return Ok(match &e.data {
                ExtentData::Inline(bytes) => bytes.to_vec(),
                _ => Vec::new(),
            });
        };
        let decode = |raw: &[u8], logical: Logical| {
            decompress(alg, raw, ram)
                .map(|mut out| {
                    out.resize(ram, 0);
                    out
                })
                .map_err(|err| {
                    self.data_error(
                        e.file_offset,
                        logical,
                        CorruptKind::Decompress {
                            algorithm: alg.name(),
                            reason: err.0,
                        },
                    )
                })
        };
        match &e.data {
            ExtentData::Inline(bytes) => decode(&bytes[..], Logical(0)),
            ExtentData::Regular(d) => {
                let mut buf = vec![0u8; self.disk_len(e, d)?];
                let checked = self.read_disk(d.disk_bytenr, &mut buf, e.file_offset)?;
                let first = match decode(&buf, d.disk_bytenr) {
                    Ok(out) => return Ok(out),
                    Err(err) => err,
                };
                if checked {
                    return Err(first);
                }
                // Unchecked bytes that do not decompress: maybe a bad copy.
                let vol = self.tree.volume();
                for copy in 1..vol.num_copies(d.disk_bytenr)? {
                    if vol.read_copy(d.disk_bytenr, &mut buf, copy).is_ok()
                        && let Ok(out) = decode(&buf, d.disk_bytenr)
                    {
                        return Ok(out);
                    }
                }
                Err(first)
            }
            // Holes and prealloc never get here.
            ExtentData::Prealloc(_) => Ok(Vec::new()),
        }
    }

    /// Read `[logical, logical + out.len())` into `out`, verifying the
    /// checksums of the sectors it touches when asked: each sector that
    /// fails is read from the next copy on its own
    /// ([`Volume::read_verified_copies`](crate::volume::Volume::read_verified_copies)).
    /// Returns whether the bytes were checked against checksums (else a
    /// plain read, each piece from the first copy that can be read).
    fn read_disk(&self, logical: Logical, out: &mut [u8], file_offset: u64) -> Result<bool> {
        let vol = self.tree.volume();
        if !self.verify {
            vol.read_logical(logical, out)?;
            vol.note_unverified(u64::try_from(out.len()).unwrap_or(u64::MAX));
            return Ok(false);
        }
        let sector = u64::from(self.tree.sectorsize().max(1));
        let start = logical
            .get()
            .saturating_sub(logical.get().checked_rem(sector).unwrap_or(0));
        let len = u64::try_from(out.len()).unwrap_or(u64::MAX);
        let end = logical
            .get()
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(sector))
            .ok_or_else(|| {
                self.data_error(file_offset, logical, CorruptKind::Unmapped { logical })
            })?;
        let csums = self.tree.csums(Logical(start), end.saturating_sub(start))?;
        let span = usize::try_from(end.saturating_sub(start)).unwrap_or(usize::MAX);
        let head = usize::try_from(logical.get().saturating_sub(start)).unwrap_or(0);
        let ty = vol.superblock().csum_type;
        let sector_bytes = usize::try_from(sector).unwrap_or(4096);
        // Sector index -> (copy, computed) of its first failure, while no
        // copy has verified it.
        let mut failed: BTreeMap<usize, (usize, Csum)> = BTreeMap::new();
        let mut unchecked = false;
        let mut check = |off: usize, bytes: &[u8], copy: usize| {
            let i = off.checked_div(sector_bytes).unwrap_or(0);
            let Some(stored) = csums.get(i) else {
                unchecked = true;
                return true;
            };
            match ty.verify(stored, bytes) {
                Ok(()) => {
                    failed.remove(&i);
                    true
                }
                Err(computed) => {
                    failed.entry(i).or_insert((copy, computed));
                    false
                }
            }
        };
        // Whole sectors are needed to verify: read into `out` directly when
        // it is sector-aligned, else through a buffer.
        let all = if head == 0 && span == out.len() {
            vol.read_verified_copies(Logical(start), out, &mut check)?
        } else {
            let mut buf = vec![0u8; span];
            let all = vol.read_verified_copies(Logical(start), &mut buf, &mut check)?;
            let want = buf.get(head..).unwrap_or_default();
            let n = want.len().min(out.len());
            if let (Some(dst), Some(src)) = (out.get_mut(..n), want.get(..n)) {
                dst.copy_from_slice(src);
            }
            all
        };
        if unchecked {
            vol.note_unverified(len);
        }
        if all {
            return Ok(true);
        }
        let Some((&i, (copy, computed))) = failed.iter().next() else {
            return Err(self.data_error(file_offset, logical, CorruptKind::Unmapped { logical }));
        };
        let stored = csums.get(i).unwrap_or_default();
        let mut raw = [0u8; 32];
        if let Some(dst) = raw.get_mut(..stored.len()) {
            dst.copy_from_slice(stored);
        }
        let sector_logical = u64::try_from(i)
            .ok()
            .and_then(|i| i.checked_mul(sector))
            .and_then(|o| o.checked_add(start))
            .unwrap_or(start);
        let copies = vol.num_copies(Logical(sector_logical)).unwrap_or(1);
        // The file offset of this sector (or of the read's start if the
        // sector begins before it).
        let off = file_offset.saturating_add(sector_logical.saturating_sub(logical.get()));
        Err(Error::corrupt(
            Location::FileData {
                tree: self.tree.id(),
                ino: self.ino,
                file_offset: off,
                logical: Logical(sector_logical.max(logical.get())),
                mirror: (copy.saturating_add(1), copies),
            },
            CorruptKind::ChecksumMismatch {
                algo: ty,
                stored: Csum::from_stored(ty, &raw),
                computed: *computed,
            },
        ))
    }
}

/// Per-sector checksums of a logical range (`None` where the csum tree has
/// none).
#[derive(Debug)]
pub(crate) struct SectorCsums {
    size: usize,
    bytes: Vec<u8>,
    present: Vec<bool>,
}

impl SectorCsums {
    /// Take the checksums of csum `item` for the sectors of
    /// `[start, end)`.
    fn fill(&mut self, item: &ItemRef<'_>, start: u64, end: u64, sector: u64) -> Result<()> {
        let size = self.size;
        if item.data.len().checked_rem(size).is_none_or(|r| r != 0) {
            return Err(Error::corrupt(
                item.location(),
                CorruptKind::BadSize {
                    what: "csum item",
                    found: u64::try_from(item.data.len()).unwrap_or(u64::MAX),
                    expected: u64::try_from(size).unwrap_or(0),
                },
            ));
        }
        for (i, c) in item.data.chunks_exact(size).enumerate() {
            let Some(at) = u64::try_from(i)
                .ok()
                .and_then(|i| i.checked_mul(sector))
                .and_then(|o| o.checked_add(item.key.offset))
            else {
                break;
            };
            if at >= end {
                break;
            }
            if at < start {
                continue;
            }
            let idx = usize::try_from(at.saturating_sub(start).checked_div(sector).unwrap_or(0))
                .unwrap_or(usize::MAX);
            let dst = idx
                .checked_mul(size)
                .and_then(|o| self.bytes.get_mut(o..o.checked_add(size)?));
            if let (Some(dst), Some(p)) = (dst, self.present.get_mut(idx)) {
                dst.copy_from_slice(c);
                *p = true;
            }
        }
        Ok(())
    }

    fn get(&self, i: usize) -> Option<&[u8]> {
        if !self.present.get(i).copied().unwrap_or(false) {
            return None;
        }
        let at = i.checked_mul(self.size)?;
        self.bytes.get(at..at.checked_add(self.size)?)
    }
}

impl FsTree<'_> {
    /// The stored checksums of the sectors of `[start, start + len)`
    /// (sector-aligned).
    pub(crate) fn csums(&self, start: Logical, len: u64) -> Result<SectorCsums> {
        let ty = self.volume().superblock().csum_type;
        let size = ty.size();
        let sector = u64::from(self.sectorsize().max(1));
        let sectors = usize::try_from(len.checked_div(sector).unwrap_or(0)).unwrap_or(0);
        let mut out = SectorCsums {
            size,
            bytes: vec![0u8; sectors.saturating_mul(size)],
            present: vec![false; sectors],
        };
        let Some(root) = self.csum_root() else {
            return Ok(out);
        };
        let end = start.get().saturating_add(len);
        let obj = ondisk::BTRFS_EXTENT_CSUM_OBJECTID;
        let ty_key = ondisk::BTRFS_EXTENT_CSUM_KEY;
        let is_csum = |k: &Key| k.objectid == obj && k.item_type == ty_key;
        let first = Key::new(obj, ty_key, start.get());
        let last = Key::new(obj, ty_key, end.saturating_sub(1));
        let mut cursor = crate::tree::walk::Cursor::new(self.volume(), root);
        cursor.seek(&first)?;
        // The item that covers `start` may begin before it: the one before
        // the cursor's. In the same leaf it is taken from there (one
        // descent); else the search starts again from it.
        let mut seek_back = None;
        match (cursor.leaf(), cursor.current()) {
            (_, Some(item)) if item.key == first => {}
            (Some(leaf), Some(item)) if item.slot > 0 => {
                let slot = item.slot.saturating_sub(1);
                if let Some(it) = leaf
                    .node()
                    .item(usize::try_from(slot).unwrap_or(usize::MAX))
                    && is_csum(&it.key)
                {
                    let prev = ItemRef {
                        key: it.key,
                        data: it.data,
                        slot,
                        ..item
                    };
                    out.fill(&prev, start.get(), end, sector)?;
                }
            }
            _ => {
                seek_back = search_le(self.volume(), root, &first)?.filter(is_csum);
            }
        }
        if let Some(k) = seek_back {
            cursor.seek(&k)?;
        }
        let mut started = false;
        while let Some(item) = cursor.next_until(&last, &mut started)? {
            if is_csum(&item.key) {
                out.fill(&item, start.get(), end, sector)?;
            }
        }
        Ok(out)
    }
}

/// Fill `out` from `bytes` at `skip`, zeros past their end (an inline
/// extent's tail up to the sector end, or past a decoded extent's
/// `ram_bytes`).
fn copy_padded(bytes: &[u8], skip: u64, out: &mut [u8]) {
    let skip = usize::try_from(skip).unwrap_or(usize::MAX);
    let avail = bytes.get(skip..).unwrap_or_default();
    let n = avail.len().min(out.len());
    let (head, tail) = out.split_at_mut(n);
    head.copy_from_slice(avail.get(..n).unwrap_or_default());
    tail.fill(0);
}

#[cfg(test)]
mod tests;
