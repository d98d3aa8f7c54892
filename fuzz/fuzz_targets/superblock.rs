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

use std::path::Path;

use btrsend::chunk_map::ChunkMap;
use btrsend::csum::CsumType;
use btrsend::device::MemDevice;
use btrsend::superblock::{Superblock, read_superblock, super_offset};
use btrsend::types::{Logical, Physical};
use libfuzzer_sys::fuzz_target;

const SIZE: usize = 4096;

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
    let mirror = super_offset(1).get() as usize;
    let mut dev = vec![0u8; mirror + SIZE];
    dev[65536..65536 + SIZE].copy_from_slice(&b);
    if mode & 2 != 0 {
        let mut m = b.clone();
        m[0x30..0x38].copy_from_slice(&(mirror as u64).to_le_bytes());
        reseal(&mut m);
        dev[mirror..].copy_from_slice(&m);
    }
    if let Ok((sb, _)) = read_superblock(&MemDevice::new(dev, "fuzz")) {
        exercise(&sb);
    }
});
