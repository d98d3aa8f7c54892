//! File data for WRITE and ENCODED_WRITE: the planner hands the filesystem
//! model's extents ([`crate::fs::FileExtent`]) to its one data path
//! ([`crate::fs::ExtentReader`]: reads, checksum verification with mirror
//! fallback, decompression of zlib, LZO and zstd), which the pipeline's
//! data jobs call; here, the stream's name for a compression type.

use crate::fs::Compression;

/// `btrfs_encoded_io_compression_from_extent`: the stream's COMPRESSION
/// value of an on-disk compression type (`None` for LZO on a sector size
/// outside 4 KiB .. 64 KiB).
pub(crate) fn encoded_compression(compression: Compression, sectorsize: u32) -> Option<u32> {
    match compression {
        Compression::None => Some(0),
        Compression::Zlib => Some(1),
        Compression::Zstd => Some(2),
        Compression::Lzo => {
            // 3 + log2(sectorsize) - 12, for sector sizes 4 KiB .. 64 KiB.
            let bits = sectorsize.trailing_zeros();
            (12..=16).contains(&bits).then(|| 3 + bits - 12)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::encoded_compression;
    use crate::fs::Compression;

    #[test]
    fn compression_numbers() {
        assert_eq!(encoded_compression(Compression::None, 4096), Some(0));
        assert_eq!(encoded_compression(Compression::Zlib, 4096), Some(1));
        assert_eq!(encoded_compression(Compression::Zstd, 4096), Some(2));
        assert_eq!(encoded_compression(Compression::Lzo, 4096), Some(3));
        assert_eq!(encoded_compression(Compression::Lzo, 65536), Some(7));
        assert_eq!(encoded_compression(Compression::Lzo, 2048), None);
    }
}
