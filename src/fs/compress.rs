//! Decompression of btrfs compressed extents, shared by the filesystem model
//! (extents read from disk) and the receiver (`ENCODED_WRITE` data, which is
//! the same bytes).
//!
//! Formats (Linux `fs/btrfs/{zlib,lzo,zstd}.c`): zlib is one
//! zlib stream, zstd one frame, LZO btrfs's own per-sector framing. The
//! compressed bytes may be followed by zero padding up to the sector size.
//!
//! btrfs LZO framing (Linux `fs/btrfs/lzo.c`): a little-endian u32 total
//! length (including itself), then segments, each a little-endian u32 length
//! and that many bytes of one LZO1X block that decodes to at most one sector.
//! A segment header never straddles a sector boundary: when fewer than 4
//! bytes are left in the current sector, they are padding and the next header
//! starts at the next sector. Offsets count from the start of the data.

use std::io::Read;

/// Largest decoded extent (`BTRFS_MAX_UNCOMPRESSED`, 128 KiB).
pub const MAX_UNCOMPRESSED: usize = 128 * 1024;

/// A compression algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// One zlib stream.
    Zlib,
    /// btrfs's LZO framing with this sector size.
    Lzo {
        /// The filesystem's sector size (4 KiB .. 64 KiB).
        sectorsize: usize,
    },
    /// One zstd frame.
    Zstd,
}

impl Algorithm {
    /// The name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Zlib => "zlib",
            Algorithm::Lzo { .. } => "lzo",
            Algorithm::Zstd => "zstd",
        }
    }
}

/// Why compressed bytes could not be decoded: the decoder's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecompressError(pub String);

/// Decode `data` into at most `max` bytes. The result may be shorter than
/// the extent's decoded length (a short last LZO segment, a stream that ends
/// early); callers zero-fill the rest, as the kernel decompresses into
/// zeroed pages.
///
/// # Errors
///
/// [`DecompressError`] for corrupt data, or zlib/zstd data that decodes to
/// more than `max` bytes.
pub fn decompress(alg: Algorithm, data: &[u8], max: usize) -> Result<Vec<u8>, DecompressError> {
    match alg {
        Algorithm::Zlib => read_bounded(flate2::read::ZlibDecoder::new(data), max),
        Algorithm::Zstd => {
            let d = zstd::stream::read::Decoder::with_buffer(data)
                .map_err(|e| DecompressError(e.to_string()))?
                .single_frame();
            read_bounded(d, max)
        }
        Algorithm::Lzo { sectorsize } => lzo_btrfs(data, sectorsize, max),
    }
}

fn read_bounded(r: impl Read, max: usize) -> Result<Vec<u8>, DecompressError> {
    let mut out = Vec::with_capacity(max);
    // One more byte than allowed shows an over-long stream without
    // decompressing all of it.
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    r.take(limit)
        .read_to_end(&mut out)
        .map_err(|e| DecompressError(e.to_string()))?;
    if out.len() > max {
        return Err(DecompressError(format!(
            "decodes to more than unencoded_len {max} bytes"
        )));
    }
    Ok(out)
}

fn le32(data: &[u8], at: usize) -> Option<usize> {
    let b: [u8; 4] = data.get(at..at.checked_add(4)?)?.try_into().ok()?;
    usize::try_from(u32::from_le_bytes(b)).ok()
}

/// btrfs's LZO framing (see the module doc).
fn lzo_btrfs(data: &[u8], sector: usize, max: usize) -> Result<Vec<u8>, DecompressError> {
    let corrupt = |m: String| DecompressError(format!("lzo: {m}"));
    if sector < 4 {
        return Err(corrupt(format!("sector size {sector} too small")));
    }
    let total = le32(data, 0).ok_or_else(|| corrupt("no header".into()))?;
    if total > data.len() || total < 4 {
        return Err(corrupt(format!(
            "total length {total} does not fit the {} bytes of data",
            data.len()
        )));
    }
    let mut out = Vec::with_capacity(max);
    let mut pos = 4usize;
    let mut buf = vec![0u8; sector];
    while pos < total && out.len() < max {
        // OK: sector >= 4 checked above, so the remainder is < sector.
        let left_in_sector = sector - pos % sector;
        if left_in_sector < 4 {
            pos = pos.saturating_add(left_in_sector);
            if pos >= total {
                break;
            }
        }
        let seg =
            le32(data, pos).ok_or_else(|| corrupt(format!("segment header at {pos} truncated")))?;
        pos = pos.saturating_add(4);
        let src = pos
            .checked_add(seg)
            .filter(|&e| e <= total)
            .and_then(|e| data.get(pos..e))
            .ok_or_else(|| {
                corrupt(format!(
                    "segment of {seg} bytes at {pos} runs past the total length {total}"
                ))
            })?;
        let n = lzo::decompress_into(src, &mut buf)
            .map_err(|e| corrupt(format!("segment at {pos}: {e}")))?;
        let n = n.min(max.saturating_sub(out.len()));
        out.extend_from_slice(buf.get(..n).unwrap_or_default());
        pos = pos.saturating_add(seg);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frame `segments` (each already LZO1X-compressed) the way the kernel
    /// does for `sector`.
    fn frame(segments: &[Vec<u8>], sector: usize) -> Vec<u8> {
        let mut out = vec![0u8; 4];
        for seg in segments {
            let left = sector - out.len() % sector;
            if left < 4 {
                out.resize(out.len() + left, 0);
            }
            out.extend_from_slice(&u32::try_from(seg.len()).unwrap().to_le_bytes());
            out.extend_from_slice(seg);
        }
        let total = u32::try_from(out.len()).unwrap();
        out[..4].copy_from_slice(&total.to_le_bytes());
        out
    }

    /// An LZO1X block of literals only (how LZO stores incompressible
    /// input): a literal-run instruction, the bytes, the end marker.
    fn lzo1x(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let n = data.len();
        if (1..=238).contains(&n) {
            out.push(u8::try_from(n + 17).unwrap());
        } else {
            assert!(n >= 4);
            let mut t = n - 3;
            if t <= 15 {
                out.push(u8::try_from(t).unwrap());
            } else {
                out.push(0);
                t -= 15;
                while t > 255 {
                    out.push(0);
                    t -= 255;
                }
                out.push(u8::try_from(t).unwrap());
            }
        }
        out.extend_from_slice(data);
        out.extend_from_slice(&[17, 0, 0]);
        out
    }

    fn random(n: usize, seed: u32) -> Vec<u8> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x.to_le_bytes()[0]
            })
            .collect()
    }

    #[test]
    fn lzo_segments_concatenate() {
        let a = vec![b'a'; 4096];
        let b = b"tail".to_vec();
        let data = frame(&[lzo1x(&a), lzo1x(&b)], 4096);
        let out = decompress(Algorithm::Lzo { sectorsize: 4096 }, &data, 8192).unwrap();
        assert_eq!(out.len(), 4100);
        assert_eq!(&out[..4096], &a[..]);
        assert_eq!(&out[4096..], b"tail");
        // Capped at `max`.
        let out = decompress(Algorithm::Lzo { sectorsize: 4096 }, &data, 4098).unwrap();
        assert_eq!(out.len(), 4098);
    }

    #[test]
    fn lzo_header_never_straddles_a_sector() {
        // Find an incompressible first segment whose end leaves 1..=3 bytes
        // in the first sector, so the second header must skip to 4096.
        for pad in 1..=3usize {
            let mut found = None;
            for len in 3900..4096 {
                let seg = lzo1x(&random(len, 7));
                if 4 + 4 + seg.len() == 4096 - pad {
                    found = Some((len, seg));
                    break;
                }
            }
            let (len, seg) = found.expect("a segment of the needed size");
            let second = b"second segment".to_vec();
            let data = frame(&[seg, lzo1x(&second)], 4096);
            // The second header sits right at the sector boundary.
            assert_eq!(
                u32::from_le_bytes(data[4096..4100].try_into().unwrap()),
                u32::try_from(lzo1x(&second).len()).unwrap()
            );
            assert!(data[4096 - pad..4096].iter().all(|&b| b == 0));
            let out = decompress(Algorithm::Lzo { sectorsize: 4096 }, &data, 8192).unwrap();
            assert_eq!(out.len(), len + second.len(), "pad {pad}");
            assert_eq!(&out[..len], &random(len, 7)[..]);
            assert_eq!(&out[len..], &second[..]);
        }
    }

    #[test]
    fn lzo_payload_may_straddle_and_padding_may_end_the_data() {
        // Two incompressible segments: the second's payload crosses the
        // sector boundary (allowed).
        let a = random(3000, 1);
        let b = random(3000, 2);
        let data = frame(&[lzo1x(&a), lzo1x(&b)], 4096);
        assert!(data.len() > 4096);
        let out = decompress(Algorithm::Lzo { sectorsize: 4096 }, &data, 8192).unwrap();
        assert_eq!(out, [a, b].concat());
        // A total length that ends in a sector's padding stops cleanly.
        let mut one = frame(&[lzo1x(&random(100, 3))], 4096);
        one.resize(4096, 0);
        let out = decompress(Algorithm::Lzo { sectorsize: 4096 }, &one, 4096).unwrap();
        assert_eq!(out.len(), 100);
    }

    #[test]
    fn lzo_errors_do_not_panic() {
        let alg = Algorithm::Lzo { sectorsize: 4096 };
        for data in [
            &[][..],
            &[1, 0, 0, 0],
            &[3, 0, 0, 0],
            &[100, 0, 0, 0, 1],
            &[12, 0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 0],
            &[10, 0, 0, 0, 2, 0, 0, 0, 0xff, 0xff],
        ] {
            assert!(decompress(alg, data, 4096).is_err(), "{data:?}");
        }
        // A segment decoding to more than a sector is corrupt.
        let big = frame(&[lzo1x(&[0u8; 8192])], 4096);
        assert!(decompress(alg, &big, 65536).is_err());
        // Header at the very end of a sector: truncated, not a panic.
        let mut d = vec![0u8; 4094];
        d[..4].copy_from_slice(&4094u32.to_le_bytes());
        assert!(decompress(Algorithm::Lzo { sectorsize: 8 }, &d, 10).is_err());
        assert!(decompress(Algorithm::Lzo { sectorsize: 0 }, &d, 10).is_err());
    }

    #[test]
    fn zlib_and_zstd_stop_at_the_stream_end() {
        let plain = random(10000, 9);
        let mut z = Vec::new();
        {
            use std::io::Write;
            let mut e = flate2::write::ZlibEncoder::new(&mut z, flate2::Compression::default());
            e.write_all(&plain).unwrap();
            e.finish().unwrap();
        }
        z.resize(z.len() + 4096, 0);
        assert_eq!(decompress(Algorithm::Zlib, &z, 10000).unwrap(), plain);
        assert!(decompress(Algorithm::Zlib, &z, 9999).is_err());
        let mut s = zstd::bulk::compress(&plain, 3).unwrap();
        s.resize(s.len() + 100, 0);
        assert_eq!(decompress(Algorithm::Zstd, &s, 10000).unwrap(), plain);
        assert!(decompress(Algorithm::Zstd, &[0x28, 0xb5, 0x2f, 0xfd, 1], 10).is_err());
        assert!(decompress(Algorithm::Zlib, b"not zlib", 10).is_err());
    }
}
