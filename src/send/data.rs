//! File data for WRITE and ENCODED_WRITE: the bytes of one file extent item
//! as the kernel's page cache would show them (decompressed, zero-filled
//! past the extent's data), or the raw on-disk compressed bytes.
//!
//! Compression formats: `BTRFS_COMPRESS_ZLIB` (one zlib stream),
//! `BTRFS_COMPRESS_LZO` (btrfs's per-sector LZO framing, Linux
//! `fs/btrfs/lzo.c`), `BTRFS_COMPRESS_ZSTD` (one frame). The decoders are
//! the receiver's ([`crate::receive::encoded::decode`]), which take the
//! `BTRFS_ENCODED_IO_COMPRESSION_*` numbers the stream uses.

use crate::fs::Filesystem;
use crate::ondisk;
use crate::receive::encoded;
use crate::types::Logical;

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

/// Read `len` bytes at `logical`.
pub(crate) fn read_logical(
    fs: &Filesystem,
    logical: u64,
    len: u64,
    ino: u64,
) -> Result<Vec<u8>, SendError> {
    let n = usize::try_from(len).map_err(|_| SendError::corrupt(ino, "extent length too large"))?;
    let mut buf = vec![0u8; n];
    fs.volume()
        .read_logical(Logical(logical), &mut buf)
        .map_err(|e| SendError::fs(ino, e))?;
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
        } => read_logical(fs, *disk_bytenr, *disk_num_bytes, ext.ino)?,
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
        } => read_logical(fs, *disk_bytenr, *disk_num_bytes, ext.ino),
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
            return read_logical(self.fs, start, len, ext.ino);
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
