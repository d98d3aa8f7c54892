//! Checksums: the four `csum_type` algorithms (btrfs-progs `crypto/`).
//!
//! Stored values: crc32c as a little-endian u32 (the standard CRC-32C, i.e.
//! `~raw(~0, data)`), xxhash64 with seed 0 as a little-endian u64, sha256 and
//! blake2b-256 as digest bytes. The on-disk field is 32 bytes; bytes past
//! [`CsumType::size`] are zero and not compared.

use std::fmt;

use blake2::Digest as _;

use crate::ondisk;

/// A checksum algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CsumType {
    /// CRC-32C (Castagnoli), 4 bytes.
    Crc32c,
    /// XXH64 with seed 0, 8 bytes.
    Xxhash64,
    /// SHA-256, 32 bytes.
    Sha256,
    /// BLAKE2b with a 32-byte digest, 32 bytes.
    Blake2b,
}

impl CsumType {
    /// From the superblock's raw `csum_type`; `None` for a value btrfs does
    /// not define (the superblock reader refuses it as unsupported).
    pub fn from_raw(raw: u16) -> Option<CsumType> {
        Some(match raw {
            ondisk::BTRFS_CSUM_TYPE_CRC32 => CsumType::Crc32c,
            ondisk::BTRFS_CSUM_TYPE_XXHASH => CsumType::Xxhash64,
            ondisk::BTRFS_CSUM_TYPE_SHA256 => CsumType::Sha256,
            ondisk::BTRFS_CSUM_TYPE_BLAKE2 => CsumType::Blake2b,
            _ => return None,
        })
    }

    /// Significant bytes of a stored checksum.
    pub fn size(self) -> usize {
        match self {
            CsumType::Crc32c => 4,
            CsumType::Xxhash64 => 8,
            CsumType::Sha256 | CsumType::Blake2b => 32,
        }
    }

    /// The name btrfs-progs prints (`dump-super`'s `csum_type`).
    pub fn name(self) -> &'static str {
        match self {
            CsumType::Crc32c => "crc32c",
            CsumType::Xxhash64 => "xxhash64",
            CsumType::Sha256 => "sha256",
            CsumType::Blake2b => "blake2b",
        }
    }

    /// Checksum `data` as btrfs stores it.
    pub fn compute(self, data: &[u8]) -> Csum {
        let mut out = [0u8; 32];
        match self {
            CsumType::Crc32c => {
                out[..4].copy_from_slice(&crc32c::crc32c(data).to_le_bytes());
            }
            CsumType::Xxhash64 => {
                out[..8].copy_from_slice(&xxhash_rust::xxh64::xxh64(data, 0).to_le_bytes());
            }
            CsumType::Sha256 => out.copy_from_slice(&sha2::Sha256::digest(data)),
            CsumType::Blake2b => {
                out.copy_from_slice(&blake2::Blake2b::<blake2::digest::consts::U32>::digest(
                    data,
                ));
            }
        }
        Csum {
            bytes: out,
            len: self.size(),
        }
    }

    /// Whether `stored` (at least [`size`](Self::size) bytes) is the checksum
    /// of `data`; returns the computed value on mismatch.
    pub fn verify(self, stored: &[u8], data: &[u8]) -> Result<(), Csum> {
        let computed = self.compute(data);
        if stored.get(..self.size()) == Some(computed.as_bytes()) {
            Ok(())
        } else {
            Err(computed)
        }
    }
}

impl fmt::Display for CsumType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A checksum value: its significant bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Csum {
    bytes: [u8; 32],
    len: usize,
}

impl Csum {
    /// A stored checksum: the first `ty.size()` bytes of `stored`.
    pub fn from_stored(ty: CsumType, stored: &[u8; 32]) -> Csum {
        Csum {
            bytes: *stored,
            len: ty.size(),
        }
    }

    /// The significant bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&self.bytes)
    }
}

impl fmt::Display for Csum {
    /// `0x` and the stored bytes in order, as `dump-super` prints them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("0x")?;
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Csum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(c: Csum) -> String {
        c.to_string()
    }

    #[test]
    fn crc32c_check_value() {
        // "123456789" -> 0xE3069283, stored LE.
        assert_eq!(hex(CsumType::Crc32c.compute(b"123456789")), "0x839206e3");
    }

    #[test]
    fn zero_sector_vectors_from_the_format_doc() {
        let zero = [0u8; 4096];
        assert_eq!(hex(CsumType::Crc32c.compute(&zero)), "0x8941f998");
        assert_eq!(hex(CsumType::Xxhash64.compute(&zero)), "0xdbbbd8326f9b86ac");
        let sha = hex(CsumType::Sha256.compute(&zero));
        assert!(
            sha.starts_with("0xad7facb2") && sha.ends_with("48892ca7"),
            "{sha}"
        );
        let b2 = hex(CsumType::Blake2b.compute(&zero));
        assert!(
            b2.starts_with("0x686ede92") && b2.ends_with("f55b8e5f"),
            "{b2}"
        );
    }

    #[test]
    fn unknown_type() {
        assert_eq!(CsumType::from_raw(9), None);
        assert_eq!(CsumType::from_raw(0), Some(CsumType::Crc32c));
    }
}
