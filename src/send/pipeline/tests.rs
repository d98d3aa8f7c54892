use super::trail::{TRAIL_EXTENTS_MAX, TrailExtent};
use super::*;
use crate::fs::{Compression, DiskExtent};
use crate::types::{Generation, Logical};

fn regular(file_offset: u64, disk_bytenr: u64, num_bytes: u64) -> FileExtent {
    FileExtent {
        file_offset,
        generation: Generation(7),
        ram_bytes: num_bytes,
        compression: Compression::None,
        data: ExtentData::Regular(DiskExtent {
            disk_bytenr: Logical(disk_bytenr),
            disk_num_bytes: num_bytes,
            offset: 0,
            num_bytes,
        }),
    }
}

#[test]
fn trail_keeps_each_extents_first_commands_in_any_order() {
    let mut t = Trail::new(0, 0);
    let write = |offset, len| vec![DataOp::Write { offset, len }];
    let clone = vec![
        DataOp::Truncate { size: 4096 },
        DataOp::Clone {
            offset: 4096,
            len: 8192,
            src: (258, 0, 1),
        },
        DataOp::Write {
            offset: 12288,
            len: 100,
        },
    ];
    let (a, b, c) = (
        regular(0, 1 << 20, 4096),
        regular(4096, 2 << 20, 8192),
        regular(0, 3 << 20, 4096),
    );
    t.keep(260, &a, write(0, 4096));
    t.keep(260, &b, clone.clone());
    // Out of order (a continuation records extents it did not keep).
    t.keep(259, &c, write(0, 1000));
    // The first commands stay.
    t.keep(260, &a, write(0, 1));
    assert_eq!(t.kept(260, &a), Some(write(0, 4096)));
    assert_eq!(t.kept(260, &b), Some(clone));
    assert_eq!(t.kept(259, &c), Some(write(0, 1000)));
    assert_eq!(t.kept(261, &a), None);
    // A relocation moved the extent: its commands are reused; it split
    // the extent: they are not.
    assert_eq!(
        t.kept(260, &regular(0, 5 << 20, 4096)),
        Some(write(0, 4096))
    );
    assert_eq!(t.kept(260, &regular(0, 1 << 20, 2048)), None);
    let keys: Vec<_> = t.extents.iter().map(|e| (e.ino, e.file_offset)).collect();
    assert_eq!(keys, [(259, 0), (260, 0), (260, 4096)]);
}

#[test]
fn trail_stops_at_its_cap() {
    let mut t = Trail::new(0, 0);
    let n = u64::try_from(TRAIL_EXTENTS_MAX).unwrap();
    for ino in 256..256 + n + 10 {
        t.keep(
            ino,
            &regular(0, ino << 20, 4096),
            vec![DataOp::Truncate { size: 1 }],
        );
    }
    assert_eq!(t.extents.len(), TRAIL_EXTENTS_MAX);
    assert_eq!(t.kept(256 + n, &regular(0, (256 + n) << 20, 4096)), None);
    assert_eq!(
        t.kept(256 + n - 1, &regular(0, (256 + n - 1) << 20, 4096)),
        Some(vec![DataOp::Truncate { size: 1 }])
    );
}

#[test]
fn only_extents_with_disk_data_depend_on_the_layout() {
    let inline = FileExtent {
        file_offset: 0,
        generation: Generation(7),
        ram_bytes: 3,
        compression: Compression::None,
        data: ExtentData::Inline(b"abc".to_vec().into()),
    };
    assert!(!layout_dependent(&inline));
    assert!(!layout_dependent(&regular(0, 0, 4096)));
    assert!(layout_dependent(&regular(0, 1 << 20, 4096)));
}

#[test]
fn trail_extent_is_48_bytes() {
    assert_eq!(std::mem::size_of::<TrailExtent>(), 48);
}
