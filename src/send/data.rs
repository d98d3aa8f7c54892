//! File data for WRITE and ENCODED_WRITE: the bytes of one file extent item
//! as the kernel's page cache would show them (decompressed, zero-filled
//! past the extent's data), or the raw on-disk compressed bytes.
//!
//! Compression formats: `BTRFS_COMPRESS_ZLIB` (one zlib stream),
//! `BTRFS_COMPRESS_LZO` (btrfs's per-sector LZO framing, Linux
//! `fs/btrfs/lzo.c`), `BTRFS_COMPRESS_ZSTD` (one frame). The decoders are
//! the receiver's ([`crate::receive::encoded::decode`]), which take the
//! `BTRFS_ENCODED_IO_COMPRESSION_*` numbers the stream uses.

use std::cell::Cell;

use crate::error::{CorruptKind, Error, Location};
use crate::fs::Filesystem;
use crate::ondisk;
use crate::receive::encoded;
use crate::tree::key::Key;
use crate::tree::walk::for_each_in_range;
use crate::types::{Logical, TreeId};

use super::error::SendError;
use super::view::{ExtentKind, FileExtent};

/// `btrfs_encoded_io_compression_from_extent`: the stream's COMPRESSION
/// value of an on-disk compression type.
pub(crate) fn encoded_compression(compression: u8, sectorsize: u32) -> Option<u32> {
    match compression {
        ondisk::BTRFS_COMPRESS_NONE => Some(0),
        ondisk::BTRFS_COMPRESS_ZLIB => Some(1),
        ondisk::BTRFS_COMPRESS_ZSTD => Some(2),
        ondisk::BTRFS_COMPRESS_LZO => {
            // 3 + log2(sectorsize) - 12, for sector sizes 4 KiB .. 64 KiB.
            let bits = sectorsize.trailing_zeros();
            (12..=16).contains(&bits).then(|| 3 + bits - 12)
        }
        _ => None,
    }
}

thread_local! {
    /// The subvolume whose file data the send on this thread verifies
    /// against the csum tree (`--verify-data`), set for the duration of a
    /// send by [`VerifyScope`]: it reaches every data read of the planner
    /// without threading a flag through it.
    static VERIFY: Cell<Option<TreeId>> = const { Cell::new(None) };
}

/// Verify the file data read on this thread while alive.
pub(crate) struct VerifyScope(Option<TreeId>);

impl VerifyScope {
    /// Verify the data of `tree` (`None`: do not verify).
    pub(crate) fn enter(tree: Option<TreeId>) -> VerifyScope {
        VerifyScope(VERIFY.with(|v| v.replace(tree)))
    }
}

impl Drop for VerifyScope {
    fn drop(&mut self) {
        VERIFY.with(|v| v.set(self.0));
    }
}

/// Read `len` bytes at `logical` (verified when a [`VerifyScope`] asks).
#[allow(
    dead_code,
    reason = "the planners' entry point for raw reads; full send reads through read_logical_at"
)]
pub(crate) fn read_logical(
    fs: &Filesystem,
    logical: u64,
    len: u64,
    ino: u64,
) -> Result<Vec<u8>, SendError> {
    read_logical_at(fs, logical, len, ino, None)
}

/// [`read_logical`] of the bytes at `file_offset` of inode `ino` (for the
/// error of a checksum mismatch; `None`: unknown, the extent's).
fn read_logical_at(
    fs: &Filesystem,
    logical: u64,
    len: u64,
    ino: u64,
    file_offset: Option<u64>,
) -> Result<Vec<u8>, SendError> {
    let n = usize::try_from(len).map_err(|_| SendError::corrupt(ino, "extent length too large"))?;
    if let Some(tree) = VERIFY.with(Cell::get) {
        return read_verified(fs, tree, logical, n, ino, file_offset.unwrap_or(0))
            .map_err(|e| SendError::fs(ino, e));
    }
    let mut buf = vec![0u8; n];
    fs.volume()
        .read_logical(Logical(logical), &mut buf)
        .map_err(|e| SendError::fs(ino, e))?;
    Ok(buf)
}

/// The stored checksum of each sector of `[start, end)` (sector-aligned;
/// `None` where the csum tree has none: nodatasum files, holes).
fn sector_csums(
    fs: &Filesystem,
    start: u64,
    end: u64,
    sector: u64,
) -> crate::Result<Vec<Option<Vec<u8>>>> {
    let sectors = usize::try_from((end - start) / sector).unwrap_or(0);
    let mut out = vec![None; sectors];
    let Some(root) = fs.root_item(TreeId(ondisk::BTRFS_CSUM_TREE_OBJECTID))? else {
        return Ok(out);
    };
    let size = fs.volume().superblock().csum_type.size().max(1);
    let obj = ondisk::BTRFS_EXTENT_CSUM_OBJECTID;
    let ty = ondisk::BTRFS_EXTENT_CSUM_KEY;
    // A csum item starting before `start` may cover it: begin at the last
    // item at or before it.
    let at_start = Key::new(obj, ty, start);
    let first = match crate::fs::tree::search_le(fs.volume(), root.tree_root(), &at_start)? {
        Some(k) if k.objectid == obj && k.item_type == ty => k,
        _ => at_start,
    };
    let last = Key::new(obj, ty, end.saturating_sub(1));
    for_each_in_range(fs.volume(), root.tree_root(), &first, &last, |item| {
        if item.key.objectid != obj || item.key.item_type != ty {
            return Ok(());
        }
        for (i, c) in item.data.chunks_exact(size).enumerate() {
            let at = item
                .key
                .offset
                .saturating_add(u64::try_from(i).unwrap_or(0) * sector);
            if at >= end {
                break;
            }
            if at >= start
                && let Some(slot) = usize::try_from((at - start) / sector)
                    .ok()
                    .and_then(|k| out.get_mut(k))
            {
                *slot = Some(c.to_vec());
            }
        }
        Ok(())
    })?;
    Ok(out)
}

/// Read `n` bytes at `logical` checking every whole sector they touch
/// against the csum tree; a sector that fails is read from the next copy
/// (`Volume::read_verified_copies`), so bad sectors on different mirrors
/// still give good data. When no copy of a sector verifies, the error
/// names the inode, file offset, logical address and the first bad mirror.
fn read_verified(
    fs: &Filesystem,
    tree: TreeId,
    logical: u64,
    n: usize,
    ino: u64,
    file_offset: u64,
) -> crate::Result<Vec<u8>> {
    let vol = fs.volume();
    let sector = u64::from(vol.superblock().sectorsize.max(1));
    let start = logical - logical % sector;
    let len = u64::try_from(n).unwrap_or(u64::MAX);
    let unmapped = || {
        Error::corrupt(
            Location::Tree(tree),
            CorruptKind::Unmapped {
                logical: Logical(logical),
            },
        )
    };
    let end = logical
        .checked_add(len)
        .and_then(|e| e.checked_next_multiple_of(sector))
        .ok_or_else(unmapped)?;
    let csums = sector_csums(fs, start, end, sector)?;
    let ty = vol.superblock().csum_type;
    let span = usize::try_from(end - start).map_err(|_| unmapped())?;
    let head = usize::try_from(logical - start).unwrap_or(0);
    let sector_len = usize::try_from(sector).unwrap_or(4096);
    let copies = vol.num_copies(Logical(logical))?;
    let sectors = csums.len();
    // Per sector: verified on some copy; the first copy's mismatch.
    let mut good = vec![false; sectors];
    let mut bad: Vec<Option<Error>> = (0..sectors).map(|_| None).collect();
    let mut buf = vec![0u8; span];
    let all = vol.read_verified_copies(Logical(start), &mut buf, |off, bytes, copy| {
        let mut ok = true;
        for (k, data) in bytes.chunks(sector_len).enumerate() {
            let i = off / sector_len + k;
            let Some(stored) = csums.get(i).and_then(|c| c.as_deref()) else {
                continue;
            };
            match ty.verify(stored, data) {
                Ok(()) => {
                    if let Some(g) = good.get_mut(i) {
                        *g = true;
                    }
                }
                Err(computed) => {
                    ok = false;
                    let mut raw = [0u8; 32];
                    if let Some(dst) = raw.get_mut(..stored.len()) {
                        dst.copy_from_slice(stored);
                    }
                    let at = start + u64::try_from(i).unwrap_or(0) * sector;
                    if let Some(slot @ None) = bad.get_mut(i) {
                        *slot = Some(Error::corrupt(
                            Location::FileData {
                                tree,
                                ino,
                                file_offset: file_offset + at.saturating_sub(logical),
                                logical: Logical(at.max(logical)),
                                mirror: (copy + 1, copies),
                            },
                            CorruptKind::ChecksumMismatch {
                                algo: ty,
                                stored: crate::csum::Csum::from_stored(ty, &raw),
                                computed,
                            },
                        ));
                    }
                }
            }
        }
        ok
    })?;
    if !all {
        let err = good
            .iter()
            .zip(bad)
            .find_map(|(g, e)| if *g { None } else { e });
        return Err(err.unwrap_or_else(unmapped));
    }
    buf.drain(..head);
    buf.truncate(n);
    Ok(buf)
}

/// The whole decoded content of a compressed or inline extent
/// (`ram_bytes` long).
pub(crate) fn decoded_extent(
    fs: &Filesystem,
    ext: &FileExtent,
    sectorsize: u32,
) -> Result<Vec<u8>, SendError> {
    let raw = match &ext.kind {
        ExtentKind::Inline(data) => data.clone(),
        ExtentKind::Regular {
            disk_bytenr,
            disk_num_bytes,
            ..
        } => read_logical_at(
            fs,
            *disk_bytenr,
            *disk_num_bytes,
            ext.ino,
            Some(ext.file_offset),
        )?,
    };
    if ext.compression == ondisk::BTRFS_COMPRESS_NONE {
        return Ok(raw);
    }
    let c = encoded_compression(ext.compression, sectorsize).ok_or_else(|| {
        SendError::corrupt(ext.ino, "unknown compression type in a file extent item")
    })?;
    encoded::decode(c, 0, &raw, ext.ram_bytes, 0, ext.ram_bytes).map_err(|e| {
        SendError::Decompress {
            ino: ext.ino,
            file_offset: ext.file_offset,
            logical: ext.disk_bytenr(),
            source: e,
        }
    })
}

/// The raw bytes an ENCODED_WRITE carries: the inline payload or the
/// whole on-disk extent.
pub(crate) fn encoded_bytes(fs: &Filesystem, ext: &FileExtent) -> Result<Vec<u8>, SendError> {
    match &ext.kind {
        ExtentKind::Inline(data) => Ok(data.clone()),
        ExtentKind::Regular {
            disk_bytenr,
            disk_num_bytes,
            ..
        } => read_logical_at(
            fs,
            *disk_bytenr,
            *disk_num_bytes,
            ext.ino,
            Some(ext.file_offset),
        ),
    }
}

/// A source of file bytes for one extent item: reads lazily, decodes at
/// most once.
pub(crate) struct ExtentReader<'a> {
    fs: &'a Filesystem,
    ext: &'a FileExtent,
    sectorsize: u32,
    decoded: Option<Vec<u8>>,
}

impl<'a> ExtentReader<'a> {
    pub fn new(fs: &'a Filesystem, ext: &'a FileExtent, sectorsize: u32) -> ExtentReader<'a> {
        ExtentReader {
            fs,
            ext,
            sectorsize,
            decoded: None,
        }
    }

    /// File bytes `[offset, offset + len)` (offsets in the file), which lie
    /// inside this extent item's range; bytes past the extent's data are
    /// zeros.
    pub fn read(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, SendError> {
        let ext = self.ext;
        let n = usize::try_from(len).map_err(|_| SendError::corrupt(ext.ino, "write too large"))?;
        let rel = offset.saturating_sub(ext.file_offset);
        let plain_regular = ext.compression == ondisk::BTRFS_COMPRESS_NONE
            && matches!(ext.kind, ExtentKind::Regular { .. });
        if plain_regular {
            let ExtentKind::Regular {
                disk_bytenr,
                offset: eoff,
                ..
            } = ext.kind
            else {
                unreachable!("checked above")
            };
            let start = disk_bytenr
                .checked_add(eoff)
                .and_then(|v| v.checked_add(rel))
                .ok_or_else(|| SendError::corrupt(ext.ino, "extent address overflows"))?;
            return read_logical_at(self.fs, start, len, ext.ino, Some(offset));
        }
        if self.decoded.is_none() {
            self.decoded = Some(decoded_extent(self.fs, ext, self.sectorsize)?);
        }
        let data = self.decoded.as_deref().unwrap_or_default();
        let mut out = vec![0u8; n];
        let from = usize::try_from(rel.saturating_add(ext.extent_offset())).unwrap_or(usize::MAX);
        if let Some(src) = data.get(from..) {
            let k = src.len().min(n);
            out[..k].copy_from_slice(&src[..k]);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::encoded_compression;

    #[test]
    fn compression_numbers() {
        assert_eq!(encoded_compression(1, 4096), Some(1));
        assert_eq!(encoded_compression(3, 4096), Some(2));
        assert_eq!(encoded_compression(2, 4096), Some(3));
        assert_eq!(encoded_compression(2, 65536), Some(7));
        assert_eq!(encoded_compression(9, 4096), None);
    }
}
