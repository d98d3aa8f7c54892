#![allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::as_conversions
)]
use super::*;

const SL: u64 = 65536;

fn chunk(
    profile_bits: u64,
    logical: u64,
    length: u64,
    sub: u16,
    stripes: &[(u64, u64)],
) -> ChunkInfo {
    let mut b = Vec::new();
    b.extend_from_slice(&length.to_le_bytes());
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(&SL.to_le_bytes());
    b.extend_from_slice(&(ondisk::BTRFS_BLOCK_GROUP_DATA | profile_bits).to_le_bytes());
    b.extend_from_slice(&65536u32.to_le_bytes());
    b.extend_from_slice(&65536u32.to_le_bytes());
    b.extend_from_slice(&4096u32.to_le_bytes());
    b.extend_from_slice(&(stripes.len() as u16).to_le_bytes());
    b.extend_from_slice(&sub.to_le_bytes());
    for &(devid, off) in stripes {
        b.extend_from_slice(&devid.to_le_bytes());
        b.extend_from_slice(&off.to_le_bytes());
        b.extend_from_slice(&[devid as u8; 16]);
    }
    ChunkInfo::parse(
        logical,
        &b,
        ChunkRules::new(4096),
        &Location::Logical(Logical(logical)),
    )
    .unwrap()
}

fn locs(m: &Mapping) -> Vec<(u64, u64)> {
    m.copies()
        .map(|l| (l.devid.get(), l.physical.get()))
        .collect()
}

#[test]
fn mirrored_profiles() {
    let c = chunk(
        ondisk::BTRFS_BLOCK_GROUP_DUP,
        1 << 30,
        1 << 28,
        1,
        &[(1, 1 << 20), (1, 300 << 20)],
    );
    let m = c.map(Logical((1 << 30) + 5000), 1 << 20).unwrap();
    assert_eq!(locs(&m), [(1, (1 << 20) + 5000), (1, (300 << 20) + 5000)]);
    assert_eq!(m.len, 1 << 20);
    let c = chunk(
        ondisk::BTRFS_BLOCK_GROUP_RAID1C4,
        0,
        1 << 20,
        1,
        &[(1, 10), (2, 20), (3, 30), (4, 40)],
    );
    let m = c.map(Logical(7), 100).unwrap();
    assert_eq!(locs(&m), [(1, 17), (2, 27), (3, 37), (4, 47)]);
    // Never past the chunk end.
    assert_eq!(c.map(Logical((1 << 20) - 10), 100).unwrap().len, 10);
    assert!(c.map(Logical(1 << 20), 1).is_none());
}

#[test]
fn raid0() {
    let c = chunk(
        ondisk::BTRFS_BLOCK_GROUP_RAID0,
        0,
        6 * SL,
        1,
        &[(1, 1000), (2, 2000), (3, 3000)],
    );
    // stripe_nr 4 -> device index 1, row 1.
    let m = c.map(Logical(4 * SL + 7), 2 * SL).unwrap();
    assert_eq!(locs(&m), [(2, 2000 + SL + 7)]);
    assert_eq!(m.len, SL - 7);
}

#[test]
fn raid10() {
    let c = chunk(
        ondisk::BTRFS_BLOCK_GROUP_RAID10,
        0,
        8 * SL,
        2,
        &[(1, 0), (2, 0), (3, 0), (4, 0)],
    );
    // groups = 2; stripe 3 -> group 1 (devices 3, 4), row 1.
    let m = c.map(Logical(3 * SL + 1), 10).unwrap();
    assert_eq!(locs(&m), [(3, SL + 1), (4, SL + 1)]);
}

#[test]
fn raid5_parity_rotates() {
    // 3 devices: 2 data + 1 parity per row.
    let c = chunk(
        ondisk::BTRFS_BLOCK_GROUP_RAID5,
        0,
        6 * SL,
        1,
        &[(1, 0), (2, 0), (3, 0)],
    );
    let dev_of = |stripe: u64| locs(&c.map(Logical(stripe * SL), 1).unwrap())[0];
    // Row 0: D0 on dev1, D1 on dev2, P on dev3.
    assert_eq!(dev_of(0), (1, 0));
    assert_eq!(dev_of(1), (2, 0));
    assert_eq!(c.parity_of(Logical(0))[0].devid, DevId(3));
    // Row 1 rotates by one: D2 on dev2, D3 on dev3, P on dev1.
    assert_eq!(dev_of(2), (2, SL));
    assert_eq!(dev_of(3), (3, SL));
    assert_eq!(c.parity_of(Logical(2 * SL))[0].devid, DevId(1));
    // Row 2: D4 on dev3, D5 on dev1, P on dev2.
    assert_eq!(dev_of(4), (3, 2 * SL));
    assert_eq!(dev_of(5), (1, 2 * SL));
}

#[test]
fn raid6_p_and_q() {
    let c = chunk(
        ondisk::BTRFS_BLOCK_GROUP_RAID6,
        0,
        4 * SL,
        1,
        &[(1, 0), (2, 0), (3, 0), (4, 0)],
    );
    let p: Vec<u64> = c
        .parity_of(Logical(2 * SL))
        .iter()
        .map(|l| l.devid.get())
        .collect();
    // Row 1, rot 1: data on devs 2, 3; P on 4; Q on 1.
    assert_eq!(locs(&c.map(Logical(2 * SL), 1).unwrap()), [(2, SL)]);
    assert_eq!(p, [4, 1]);
    assert_eq!(c.num_copies(), 4);
    // The row of logical 3·SL + 5 (column 1 of row 1), as a rebuild sees it.
    let row = c.raid56_row(Logical(3 * SL + 5), 1 << 20).unwrap();
    let devs = |v: &[StripeLoc]| {
        v.iter()
            .map(|l| (l.devid.get(), l.physical.get()))
            .collect::<Vec<_>>()
    };
    assert_eq!(devs(&row.data), [(2, SL + 5), (3, SL + 5)]);
    assert_eq!(devs(&row.parity), [(4, SL + 5), (1, SL + 5)]);
    assert_eq!((row.col, row.len), (1, SL - 5));
    assert_eq!(c.raid56_row(Logical(4 * SL), 1), None);
    let r1 = chunk(ondisk::BTRFS_BLOCK_GROUP_RAID1, 0, SL, 1, &[(1, 0), (2, 0)]);
    assert_eq!(r1.raid56_row(Logical(0), 1), None);
}

#[test]
fn map_lookup_and_last_hit() {
    let mut map = ChunkMap::new();
    let loc = Location::Logical(Logical(0));
    map.insert(chunk(0, 1 << 20, 1 << 20, 1, &[(1, 0)]), &loc)
        .unwrap();
    map.insert(chunk(0, 4 << 20, 1 << 20, 1, &[(1, 1 << 20)]), &loc)
        .unwrap();
    assert_eq!(
        locs(&map.map(Logical((4 << 20) + 3), 1).unwrap()),
        [(1, (1 << 20) + 3)]
    );
    assert_eq!(LAST_HIT.with(Cell::get), 1);
    // Another thread has its own last hit.
    std::thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(LAST_HIT.with(Cell::get), 0);
            assert_eq!(
                map.lookup(Logical(1 << 20)).unwrap().logical,
                Logical(1 << 20)
            );
        });
    });
    assert_eq!(LAST_HIT.with(Cell::get), 1);
    assert_eq!(locs(&map.map(Logical((1 << 20) + 3), 1).unwrap()), [(1, 3)]);
    let e = map.map(Logical(3 << 20), 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "corrupt logical 3145728: logical 3145728 is not mapped by any chunk"
    );
    let e = map
        .insert(chunk(0, (1 << 20) + 4096, 4096, 1, &[(1, 0)]), &loc)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("overlaps the previous chunk ending at 2097152"),
        "{e}"
    );
}

/// A chunk item (one stripe) of `flags` and `length` at logical 0.
fn raw_chunk(flags: u64, length: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&length.to_le_bytes());
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(&SL.to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&4096u32.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&[1; 32]);
    b
}

/// The kernel's `btrfs_check_chunk_valid` rules on type and length.
#[test]
fn kernel_chunk_rules() {
    use ondisk::*;
    let loc = Location::Logical(Logical(0));
    let parse = |flags, length, mixed| {
        let rules = ChunkRules {
            sectorsize: 4096,
            mixed_groups: mixed,
        };
        ChunkInfo::parse(0, &raw_chunk(flags, length), rules, &loc).map_err(|e| e.to_string())
    };
    // The kernel's limit: 2^32 - 1 stripes of 64 KiB; one sector less is
    // accepted.
    assert_eq!(
        parse(BTRFS_BLOCK_GROUP_SYSTEM, 2400000000000000000, false).unwrap_err(),
        "corrupt logical 0: invalid length 2400000000000000000: chunk length too large: the \
         kernel's limit is 2^32 - 1 stripes of 64 KiB (281474976645120 bytes)"
    );
    assert!(parse(BTRFS_BLOCK_GROUP_DATA, MAX_CHUNK_LENGTH, false).is_err());
    parse(BTRFS_BLOCK_GROUP_DATA, MAX_CHUNK_LENGTH - 4096, false).unwrap();
    assert_eq!(
        parse(
            BTRFS_BLOCK_GROUP_SYSTEM | BTRFS_BLOCK_GROUP_METADATA,
            1 << 20,
            false
        )
        .unwrap_err(),
        "corrupt logical 0: invalid type 6: a system chunk holds neither data nor metadata"
    );
    let mixed = BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA;
    assert_eq!(
        parse(mixed, 1 << 20, false).unwrap_err(),
        "corrupt logical 0: invalid type 5: data and metadata in one chunk without the \
         mixed-bg feature"
    );
    parse(mixed, 1 << 20, true).unwrap();
}

/// Only SYSTEM chunks may sit in the superblock's sys_chunk_array.
#[test]
fn sys_chunk_array_holds_only_system_chunks() {
    let array = |flags| {
        let mut a = Vec::new();
        a.extend_from_slice(&ondisk::BTRFS_FIRST_CHUNK_TREE_OBJECTID.to_le_bytes());
        a.push(ondisk::BTRFS_CHUNK_ITEM_KEY);
        a.extend_from_slice(&(1u64 << 20).to_le_bytes());
        a.extend_from_slice(&raw_chunk(flags, 1 << 20));
        a
    };
    let path = std::path::Path::new("img");
    let map = ChunkMap::from_sys_chunk_array(
        &array(ondisk::BTRFS_BLOCK_GROUP_SYSTEM),
        ChunkRules::new(4096),
        path,
    )
    .unwrap();
    assert_eq!(map.chunks().len(), 1);
    let e = ChunkMap::from_sys_chunk_array(
        &array(ondisk::BTRFS_BLOCK_GROUP_METADATA),
        ChunkRules::new(4096),
        path,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "corrupt sys_chunk_array of superblock on img at byte 0: invalid type 4: a chunk in \
         sys_chunk_array must be a SYSTEM chunk"
    );
}

/// Found by the superblock fuzz target: a DUP system chunk whose second
/// stripe starts at 2^64 - 1 parsed, then every read past its first
/// byte said "not mapped by any chunk".
#[test]
fn stripe_past_the_end_of_any_device_is_refused() {
    let mut b = raw_chunk(
        ondisk::BTRFS_BLOCK_GROUP_SYSTEM | ondisk::BTRFS_BLOCK_GROUP_DUP,
        8 << 20,
    );
    b[44..46].copy_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    b.extend_from_slice(&[1; 16]);
    let loc = Location::Logical(Logical(0));
    let e = ChunkInfo::parse(0, &b, ChunkRules::new(4096), &loc).unwrap_err();
    assert_eq!(
        e.to_string(),
        "corrupt logical 0: invalid stripe offset 18446744073709551615: the stripe would end \
         past 2^64 bytes of its device"
    );
    // One sector less than the limit is fine.
    let n = b.len();
    b[n - 24..n - 16].copy_from_slice(&(u64::MAX - (8 << 20)).to_le_bytes());
    ChunkInfo::parse(0, &b, ChunkRules::new(4096), &loc).unwrap();
}

#[test]
fn bad_chunks() {
    let mut b = Vec::new();
    b.extend_from_slice(&(1u64 << 20).to_le_bytes());
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(&SL.to_le_bytes());
    b.extend_from_slice(
        &(ondisk::BTRFS_BLOCK_GROUP_DATA | ondisk::BTRFS_BLOCK_GROUP_RAID1).to_le_bytes(),
    );
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&4096u32.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&[0; 32]);
    let loc = Location::Logical(Logical(0));
    let e = ChunkInfo::parse(0, &b, ChunkRules::new(4096), &loc).unwrap_err();
    assert_eq!(
        e.to_string(),
        "corrupt logical 0: invalid num_stripes 1: does not fit the chunk profile"
    );
    let e = ChunkInfo::parse(0, &b[..60], ChunkRules::new(4096), &loc).unwrap_err();
    assert_eq!(
        e.to_string(),
        "corrupt logical 0: truncated chunk stripes: need 80 bytes, 60 available"
    );
}
