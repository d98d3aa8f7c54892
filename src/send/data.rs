//! File data for WRITE and ENCODED_WRITE: the planner's extent items handed
//! to the filesystem model's one data path ([`crate::fs::ExtentReader`]:
//! reads, checksum verification with mirror fallback, decompression of
//! zlib, LZO and zstd), which the pipeline's data jobs call.

use crate::fs::{Compression, DiskExtent, ExtentData};
use crate::ondisk;
use crate::types::{Generation, Logical};

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

/// The filesystem model's form of a planner extent item, for reading.
///
/// # Errors
///
/// [`SendError::Corrupt`] for an unknown compression type.
pub(crate) fn fs_extent(ext: &FileExtent) -> Result<crate::fs::FileExtent, SendError> {
    let compression = match ext.compression {
        ondisk::BTRFS_COMPRESS_NONE => Compression::None,
        ondisk::BTRFS_COMPRESS_ZLIB => Compression::Zlib,
        ondisk::BTRFS_COMPRESS_LZO => Compression::Lzo,
        ondisk::BTRFS_COMPRESS_ZSTD => Compression::Zstd,
        _ => {
            return Err(SendError::corrupt(
                ext.ino,
                "unknown compression type in a file extent item",
            ));
        }
    };
    let data = match &ext.kind {
        ExtentKind::Inline(bytes) => ExtentData::Inline(bytes.clone()),
        ExtentKind::Regular {
            prealloc,
            disk_bytenr,
            disk_num_bytes,
            offset,
            num_bytes,
        } => {
            let d = DiskExtent {
                disk_bytenr: Logical(*disk_bytenr),
                disk_num_bytes: *disk_num_bytes,
                offset: *offset,
                num_bytes: *num_bytes,
            };
            if *prealloc {
                ExtentData::Prealloc(d)
            } else {
                ExtentData::Regular(d)
            }
        }
    };
    Ok(crate::fs::FileExtent {
        file_offset: ext.file_offset,
        generation: Generation(ext.extent_gen),
        ram_bytes: ext.ram_bytes,
        compression,
        data,
    })
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
