//! Fuzz chunk parsing: a superblock's `sys_chunk_array` and single
//! CHUNK_ITEM payloads must parse or give an error, never panic; every
//! mapping of a parsed chunk (all profiles, incl. the RAID5/6 row geometry)
//! must stay panic-free and inside the chunk's stripes.
#![no_main]

use std::path::Path;

use btrsend::chunk_map::{ChunkInfo, ChunkMap, ChunkRules};
use btrsend::error::Location;
use btrsend::types::Logical;
use libfuzzer_sys::fuzz_target;

fn probe(chunk: &ChunkInfo, seed: u64) {
    let len = chunk.length;
    let start = chunk.logical.get();
    for off in [0, 1, len / 2, len.saturating_sub(1), seed % len.max(1), len] {
        let at = Logical(start.saturating_add(off));
        if let Some(m) = chunk.mapping(at, 1 << 20) {
            assert!(m.len <= 1 << 20);
            assert!(m.num_copies() >= 1);
            for c in m.copies() {
                assert!(chunk.stripes.iter().any(|s| s.devid == c.devid));
            }
        }
        if let Some(row) = chunk.raid56_row(at, 4096) {
            assert!(row.col < row.data.len());
            assert!(row.len <= 4096);
        }
        let _ = chunk.parity_of(at);
    }
    assert!(chunk.num_copies() >= 1);
}

fuzz_target!(|data: &[u8]| {
    if let Ok(map) = ChunkMap::from_sys_chunk_array(data, ChunkRules::new(4096), Path::new("fuzz"))
    {
        for chunk in map.chunks() {
            probe(chunk, 7);
            let _ = map.map(chunk.logical, 4096);
        }
    }
    if data.len() > 16 {
        let (head, item) = data.split_at(16);
        let logical = u64::from_le_bytes(head[..8].try_into().unwrap());
        let seed = u64::from_le_bytes(head[8..].try_into().unwrap());
        let loc = Location::Logical(Logical(logical));
        if let Ok(chunk) = ChunkInfo::parse(logical, item, ChunkRules::new(4096), &loc) {
            probe(&chunk, seed);
        }
    }
});
