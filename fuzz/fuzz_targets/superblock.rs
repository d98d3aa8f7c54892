//! Fuzz the superblock: any 4096 bytes must parse or give an error, never
//! panic; a superblock that parses must answer `check_supported`, and its
//! `sys_chunk_array` must bootstrap a chunk map or give an error, whose
//! mappings stay inside their chunks. `read_superblock` picks among the
//! copies of a device holding the input as its primary and mirror 1.
//!
//! The first input byte chooses how: bit 0 reseals the copy (crc32c over
//! the rest, csum_type set to crc32c) so the checks behind the checksum are
//! reached; bit 1 makes mirror 1 a resealed copy too, with bytenr fixed.
#![no_main]

use std::path::{Path, PathBuf};

use btrsend::chunk_map::ChunkMap;
use btrsend::csum::CsumType;
use btrsend::device::Device;
use btrsend::superblock::{Superblock, read_superblock, super_offset};
use btrsend::types::{Logical, Physical};
use libfuzzer_sys::fuzz_target;

const SIZE: usize = 4096;

/// A device of 64 MiB + 4 KiB, all zeros but its superblock copies (held
/// alone, so an input costs no 64 MiB of memory).
#[derive(Debug)]
struct Sparse {
    path: PathBuf,
    copies: Vec<(u64, Vec<u8>)>,
}

impl Device for Sparse {
    fn path(&self) -> &Path {
        &self.path
    }

    fn size(&self) -> u64 {
        super_offset(1).get() + SIZE as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: Physical) -> btrsend::Result<()> {
        buf.fill(0);
        let (start, end) = (offset.get(), offset.get() + buf.len() as u64);
        assert!(end <= self.size(), "read past the device end");
        for (at, bytes) in &self.copies {
            let lo = start.max(*at);
            let hi = end.min(at + bytes.len() as u64);
            if lo < hi {
                buf[(lo - start) as usize..(hi - start) as usize]
                    .copy_from_slice(&bytes[(lo - at) as usize..(hi - at) as usize]);
            }
        }
        Ok(())
    }
}

fn reseal(b: &mut [u8]) {
    b[0xc4..0xc6].copy_from_slice(&0u16.to_le_bytes());
    let c = CsumType::Crc32c.compute(&b[32..]);
    b[..32].fill(0);
    b[..4].copy_from_slice(c.as_bytes());
}

fn exercise(sb: &Superblock) {
    let _ = sb.check_supported();
    if let Ok(map) =
        ChunkMap::from_sys_chunk_array(&sb.sys_chunk_array, sb.chunk_rules(), Path::new("fuzz"))
    {
        for chunk in map.chunks() {
            assert!(chunk.length > 0);
            for at in [chunk.logical, Logical(chunk.end().saturating_sub(1))] {
                let m = map.map(at, 1 << 20).unwrap();
                assert!(m.len >= 1 && m.len <= 1 << 20);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut b = vec![0u8; SIZE];
    let n = rest.len().min(SIZE);
    b[..n].copy_from_slice(&rest[..n]);
    if mode & 1 != 0 {
        reseal(&mut b);
    }
    if let Ok(sb) = Superblock::parse(&b, Path::new("fuzz"), Physical(65536)) {
        exercise(&sb);
    }
    // A device holding it as the primary, and maybe as mirror 1.
    let mirror = super_offset(1).get();
    let mut copies = vec![(65536, b.clone())];
    if mode & 2 != 0 {
        let mut m = b;
        m[0x30..0x38].copy_from_slice(&mirror.to_le_bytes());
        reseal(&mut m);
        copies.push((mirror, m));
    }
    let dev = Sparse {
        path: PathBuf::from("fuzz"),
        copies,
    };
    if let Ok((sb, _)) = read_superblock(&dev) {
        exercise(&sb);
    }
});
