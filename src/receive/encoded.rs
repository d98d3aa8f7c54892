//! Decoding the data of `ENCODED_WRITE` (`--compressed-data` streams) so it
//! can be written to any filesystem.
//!
//! The data is the extent exactly as btrfs stores it (`BTRFS_ENCODED_IO_*`,
//! Linux `include/uapi/linux/btrfs.h`, `fs/btrfs/send.c`): compression 0 none, 1 zlib (one zlib stream), 2 zstd (one frame), 3..7
//! LZO with btrfs's per-sector framing for sector sizes 4 KiB .. 64 KiB. The
//! data may carry sector padding after the compressed bytes.
//!
//! The decoders themselves (zlib, zstd, btrfs's LZO framing) are shared with
//! the filesystem model: [`crate::fs::compress`].

use std::fmt;

use stream_format::Command;

use crate::fs::compress::{Algorithm, DecompressError, decompress};
use crate::sys;

/// Largest decoded extent (`BTRFS_MAX_UNCOMPRESSED`, 128 KiB): the uapi
/// limit of `unencoded_len`, and a bound on what a hostile stream can make us
/// allocate.
pub const MAX_UNENCODED: u64 = 128 * 1024;

/// Why encoded data could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeDataError {
    /// A compression number this receiver does not know.
    UnknownCompression(u32),
    /// Encrypted data (ENCRYPTION ≠ 0) cannot be decoded.
    Encrypted(u32),
    /// `unencoded_len` above [`MAX_UNENCODED`].
    TooLarge(u64),
    /// `unencoded_offset + unencoded_file_len > unencoded_len`.
    BadRange {
        /// UNENCODED_OFFSET.
        offset: u64,
        /// UNENCODED_FILE_LEN.
        len: u64,
        /// UNENCODED_LEN.
        total: u64,
    },
    /// The compressed bytes are corrupt.
    Corrupt(String),
}

impl fmt::Display for DecodeDataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeDataError::UnknownCompression(c) => write!(f, "unknown compression {c}"),
            DecodeDataError::Encrypted(e) => {
                write!(f, "encrypted data (encryption {e}) is not supported")
            }
            DecodeDataError::TooLarge(n) => {
                write!(
                    f,
                    "unencoded_len {n} is larger than the limit of {MAX_UNENCODED} bytes"
                )
            }
            DecodeDataError::BadRange { offset, len, total } => write!(
                f,
                "unencoded_offset {offset} + unencoded_file_len {len} is past unencoded_len {total}"
            ),
            DecodeDataError::Corrupt(m) => write!(f, "corrupt compressed data: {m}"),
        }
    }
}

impl std::error::Error for DecodeDataError {}

/// The name of a compression number, for messages.
pub fn compression_name(c: u32) -> &'static str {
    match c {
        0 => "none",
        1 => "zlib",
        2 => "zstd",
        3..=7 => "lzo",
        _ => "unknown",
    }
}

/// The error for a command taken for an ENCODED_WRITE that is none (a
/// caller matched it first: never seen).
pub(super) fn not_encoded() -> super::ApplyErrorKind {
    super::ApplyErrorKind::Invalid("not an ENCODED_WRITE command".into())
}

/// An ENCODED_WRITE command's fields as the ioctl takes them, checked with
/// [`check`]; `None` for any other command.
pub fn fields<'c>(cmd: &'c Command<'_>) -> Option<Result<sys::Encoded<'c>, DecodeDataError>> {
    let Command::EncodedWrite {
        offset,
        unencoded_file_len,
        unencoded_len,
        unencoded_offset,
        compression,
        encryption,
        data,
        ..
    } = cmd
    else {
        return None;
    };
    let e = sys::Encoded {
        offset: *offset,
        unencoded_file_len: *unencoded_file_len,
        unencoded_len: *unencoded_len,
        unencoded_offset: *unencoded_offset,
        compression: compression.unwrap_or(0),
        encryption: encryption.unwrap_or(0),
        data,
    };
    Some(
        check(
            e.compression,
            e.encryption,
            e.unencoded_len,
            e.unencoded_offset,
            e.unencoded_file_len,
        )
        .map(|()| e),
    )
}

/// Check an ENCODED_WRITE's fields without decoding its data: a known
/// compression, no encryption, `unencoded_len` within [`MAX_UNENCODED`] and
/// the file's range within the extent. [`decode`] does these checks too;
/// they come first when the data is written encoded, unchecked (as the
/// kernel does: corrupt compressed bytes show only when read).
///
/// # Errors
///
/// See [`DecodeDataError`] (never `Corrupt`).
pub fn check(
    compression: u32,
    encryption: u32,
    unencoded_len: u64,
    unencoded_offset: u64,
    unencoded_file_len: u64,
) -> Result<(), DecodeDataError> {
    if encryption != 0 {
        return Err(DecodeDataError::Encrypted(encryption));
    }
    if compression > 7 {
        return Err(DecodeDataError::UnknownCompression(compression));
    }
    if unencoded_len > MAX_UNENCODED {
        return Err(DecodeDataError::TooLarge(unencoded_len));
    }
    let end = unencoded_offset.checked_add(unencoded_file_len);
    if end.is_none_or(|e| e > unencoded_len) {
        return Err(DecodeDataError::BadRange {
            offset: unencoded_offset,
            len: unencoded_file_len,
            total: unencoded_len,
        });
    }
    Ok(())
}

/// Decode an ENCODED_WRITE's data and return the `unencoded_file_len` bytes
/// that go into the file (from `unencoded_offset` of the decoded extent).
///
/// # Errors
///
/// See [`DecodeDataError`].
pub fn decode(
    compression: u32,
    encryption: u32,
    data: &[u8],
    unencoded_len: u64,
    unencoded_offset: u64,
    unencoded_file_len: u64,
) -> Result<Vec<u8>, DecodeDataError> {
    check(
        compression,
        encryption,
        unencoded_len,
        unencoded_offset,
        unencoded_file_len,
    )?;
    // OK to convert: bounded by MAX_UNENCODED above.
    let total = usize::try_from(unencoded_len).expect("bounded");
    let corrupt = |e: DecompressError| DecodeDataError::Corrupt(e.0);
    let mut out = match compression {
        0 => data
            .get(..total.min(data.len()))
            .unwrap_or_default()
            .to_vec(),
        1 => decompress(Algorithm::Zlib, data, total).map_err(corrupt)?,
        2 => decompress(Algorithm::Zstd, data, total).map_err(corrupt)?,
        3..=7 => decompress(
            Algorithm::Lzo {
                sectorsize: 4096 << (compression - 3),
            },
            data,
            total,
        )
        .map_err(corrupt)?,
        c => return Err(DecodeDataError::UnknownCompression(c)),
    };
    // The decoder may stop short of the extent's length: the rest is zeros,
    // as in the kernel's decompression into zeroed pages.
    out.resize(total, 0);
    // OK to convert and slice: checked against unencoded_len above.
    let start = usize::try_from(unencoded_offset).expect("bounded");
    let len = usize::try_from(unencoded_file_len).expect("bounded");
    out.truncate(start + len);
    out.drain(..start);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_and_ranges() {
        let d = decode(0, 0, b"abcdefgh", 8, 2, 3).unwrap();
        assert_eq!(d, b"cde");
        assert_eq!(decode(0, 0, b"ab", 4, 0, 4).unwrap(), b"ab\0\0");
        assert!(matches!(
            decode(0, 0, b"ab", 4, 2, 4),
            Err(DecodeDataError::BadRange { .. })
        ));
        assert!(matches!(
            decode(0, 1, b"ab", 2, 0, 2),
            Err(DecodeDataError::Encrypted(1))
        ));
        assert!(matches!(
            decode(9, 0, b"ab", 2, 0, 2),
            Err(DecodeDataError::UnknownCompression(9))
        ));
        assert!(matches!(
            decode(0, 0, b"ab", 1 << 20, 0, 2),
            Err(DecodeDataError::TooLarge(_))
        ));
    }

    #[test]
    fn zlib_and_zstd_with_padding() {
        let plain: Vec<u8> = (0..10000u32).map(|i| (i % 251) as u8).collect();
        let mut z = Vec::new();
        {
            use std::io::Write;
            let mut e = flate2::write::ZlibEncoder::new(&mut z, flate2::Compression::default());
            e.write_all(&plain).unwrap();
            e.finish().unwrap();
        }
        z.resize(4096, 0);
        assert_eq!(
            decode(1, 0, &z, 10000, 100, 5000).unwrap(),
            &plain[100..5100]
        );
        let mut s = zstd::bulk::compress(&plain, 3).unwrap();
        s.resize(4096, 0);
        assert_eq!(decode(2, 0, &s, 10000, 0, 10000).unwrap(), plain);
        assert!(matches!(
            decode(2, 0, &[0x28, 0xb5, 0x2f, 0xfd, 1, 2], 100, 0, 100),
            Err(DecodeDataError::Corrupt(_))
        ));
        // More output than unencoded_len is corrupt, not a big allocation.
        assert!(matches!(
            decode(2, 0, &s, 100, 0, 100),
            Err(DecodeDataError::Corrupt(_))
        ));
    }

    #[test]
    fn lzo_framing_errors_do_not_panic() {
        for data in [
            &[][..],
            &[1, 0, 0, 0],
            &[100, 0, 0, 0, 1],
            &[12, 0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 0],
        ] {
            assert!(
                matches!(
                    decode(3, 0, data, 4096, 0, 4096),
                    Err(DecodeDataError::Corrupt(_))
                ),
                "{data:?}"
            );
        }
    }
}
