//! Chunk lookups per second: the logical → chunk step every read takes.
//!
//! A map of 4096 chunks (1 GiB each, profiles mixed as on a big
//! multi-device filesystem); lookups of addresses in sequence (a tree walk
//! or file read moving forward: the per-thread last hit answers), at random
//! (binary search), the binary search alone, and full mappings (lookup plus
//! stripe arithmetic). Criterion reports elements per second = lookups per
//! second. Inputs are built outside the timed loops.

// criterion_group! makes an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;

use btrsend::chunk_map::{ChunkInfo, ChunkMap, ChunkRules};
use btrsend::error::Location;
use btrsend::ondisk;
use btrsend::types::Logical;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

const CHUNKS: u64 = 4096;
const CHUNK_LEN: u64 = 1 << 30;
const LOOKUPS: u64 = 10_000;

/// A CHUNK_ITEM payload.
fn chunk_item(flags: u64, length: u64, stripes: &[(u64, u64)]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&length.to_le_bytes());
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(&65536u64.to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(&65536u32.to_le_bytes());
    b.extend_from_slice(&65536u32.to_le_bytes());
    b.extend_from_slice(&4096u32.to_le_bytes());
    b.extend_from_slice(&u16::try_from(stripes.len()).unwrap().to_le_bytes());
    let sub: u16 = if flags & ondisk::BTRFS_BLOCK_GROUP_RAID10 != 0 {
        2
    } else {
        1
    };
    b.extend_from_slice(&sub.to_le_bytes());
    for &(devid, off) in stripes {
        b.extend_from_slice(&devid.to_le_bytes());
        b.extend_from_slice(&off.to_le_bytes());
        b.extend_from_slice(&[u8::try_from(devid).unwrap(); 16]);
    }
    b
}

fn big_map() -> ChunkMap {
    let mut map = ChunkMap::new();
    let loc = Location::Logical(Logical(0));
    for i in 0..CHUNKS {
        let logical = (1 << 40) + i * CHUNK_LEN;
        let phys = i * CHUNK_LEN;
        let (flags, stripes): (u64, Vec<(u64, u64)>) = match i % 4 {
            0 => (ondisk::BTRFS_BLOCK_GROUP_DATA, vec![(1, phys)]),
            1 => (
                ondisk::BTRFS_BLOCK_GROUP_METADATA | ondisk::BTRFS_BLOCK_GROUP_RAID1,
                vec![(1, phys), (2, phys)],
            ),
            2 => (
                ondisk::BTRFS_BLOCK_GROUP_DATA | ondisk::BTRFS_BLOCK_GROUP_RAID10,
                vec![(1, phys), (2, phys), (3, phys), (4, phys)],
            ),
            _ => (
                ondisk::BTRFS_BLOCK_GROUP_DATA | ondisk::BTRFS_BLOCK_GROUP_RAID5,
                vec![(1, phys), (2, phys), (3, phys)],
            ),
        };
        let chunk = ChunkInfo::parse(
            logical,
            &chunk_item(flags, CHUNK_LEN, &stripes),
            ChunkRules::new(4096),
            &loc,
        )
        .unwrap();
        map.insert(chunk, &loc).unwrap();
    }
    map
}

/// Addresses in order: 16 KiB apart (tree blocks of one chunk in a row),
/// crossing into the next chunk now and then.
fn sequential() -> Vec<Logical> {
    let start = (1u64 << 40) + 5 * CHUNK_LEN - 100 * 16384;
    (0..LOOKUPS).map(|i| Logical(start + i * 16384)).collect()
}

/// Addresses all over the map (xorshift, fixed seed).
fn random() -> Vec<Logical> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    (0..LOOKUPS)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            Logical((1 << 40) + s % (CHUNKS * CHUNK_LEN))
        })
        .collect()
}

fn lookups(c: &mut Criterion) {
    let map = big_map();
    let mut g = c.benchmark_group("chunk_lookup");
    g.throughput(Throughput::Elements(LOOKUPS));
    for (name, addrs) in [("sequential", sequential()), ("random", random())] {
        g.bench_with_input(BenchmarkId::new("lookup", name), &addrs, |b, addrs| {
            b.iter(|| {
                for &a in addrs {
                    black_box(map.lookup(black_box(a)));
                }
            });
        });
        g.bench_with_input(BenchmarkId::new("search", name), &addrs, |b, addrs| {
            b.iter(|| {
                for &a in addrs {
                    black_box(map.search(black_box(a)));
                }
            });
        });
        g.bench_with_input(BenchmarkId::new("map", name), &addrs, |b, addrs| {
            b.iter(|| {
                for &a in addrs {
                    black_box(map.map(black_box(a), 16384).unwrap());
                }
            });
        });
    }
    g.finish();
}

criterion_group!(benches, lookups);
criterion_main!(benches);
