#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
use super::*;

fn item(key: Key, data: &[u8]) -> ItemRef<'_> {
    ItemRef {
        key,
        data,
        leaf: Logical(30408704),
        tree: TreeId(256),
        slot: 3,
        block: None,
    }
}

fn inode_ref(index: u64, name: &[u8]) -> Vec<u8> {
    let mut v = index.to_le_bytes().to_vec();
    v.extend_from_slice(&u16::try_from(name.len()).unwrap().to_le_bytes());
    v.extend_from_slice(name);
    v
}

fn extref(parent: u64, index: u64, name: &[u8]) -> Vec<u8> {
    let mut v = parent.to_le_bytes().to_vec();
    v.extend_from_slice(&inode_ref(index, name));
    v
}

fn dir_rec(loc: Key, ty: u8, name: &[u8], data: &[u8]) -> Vec<u8> {
    let mut v = loc.objectid.to_le_bytes().to_vec();
    v.push(loc.item_type);
    v.extend_from_slice(&loc.offset.to_le_bytes());
    v.extend_from_slice(&7u64.to_le_bytes());
    v.extend_from_slice(&u16::try_from(data.len()).unwrap().to_le_bytes());
    v.extend_from_slice(&u16::try_from(name.len()).unwrap().to_le_bytes());
    v.push(ty);
    v.extend_from_slice(name);
    v.extend_from_slice(data);
    v
}

#[test]
fn packed_inode_refs() {
    // Three links of inode 300 in directory 256, in one item.
    let data = [
        inode_ref(2, b"a"),
        inode_ref(5, b"second"),
        inode_ref(9, b"\xffodd"),
    ]
    .concat();
    let it = item(Key::new(300, 12, 256), &data);
    let mut names = Vec::new();
    parse_inode_refs(&it, &mut names).unwrap();
    let got: Vec<(u64, u64, &[u8])> = names
        .iter()
        .map(|n| (n.parent, n.index, &n.name[..]))
        .collect();
    assert_eq!(
        got,
        [
            (256, 2, &b"a"[..]),
            (256, 5, b"second"),
            (256, 9, b"\xffodd")
        ]
    );
    // The last record cut short by one byte.
    let it = item(Key::new(300, 12, 256), &data[..data.len() - 1]);
    let e = parse_inode_refs(&it, &mut Vec::new()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "corrupt item 3 key (300 INODE_REF 256) in leaf at logical 30408704 (tree 256): truncated inode ref name: need 4 bytes, 3 available"
    );
    // A header cut short.
    let it = item(Key::new(300, 12, 256), &data[..15]);
    let e = parse_inode_refs(&it, &mut Vec::new()).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("truncated inode ref: need 10 bytes, 4 available"),
        "{e}"
    );
    // A zero-length name would loop forever elsewhere: refused.
    let bad = inode_ref(2, b"");
    let it = item(Key::new(300, 12, 256), &bad);
    let e = parse_inode_refs(&it, &mut Vec::new()).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("invalid name_len 0: names are at least one byte"),
        "{e}"
    );
}

#[test]
fn extrefs_with_collisions() {
    let data = [extref(257, 3, b"long-name"), extref(4000, 12, b"other")].concat();
    let it = item(Key::new(300, 13, 12345), &data);
    let mut names = Vec::new();
    parse_inode_extrefs(&it, &mut names).unwrap();
    assert_eq!(names.len(), 2);
    assert_eq!(
        (
            names[1].parent,
            names[1].index,
            &names[1].name[..],
            names[1].extended
        ),
        (4000, 12, &b"other"[..], true)
    );
    let it = item(Key::new(300, 13, 12345), &data[..20]);
    assert!(parse_inode_extrefs(&it, &mut Vec::new()).is_err());
}

#[test]
fn xattrs_colliding_in_one_item() {
    let zero = Key::new(0, 0, 0);
    let data = [
        dir_rec(zero, 8, b"user.a", b"1"),
        dir_rec(zero, 8, b"user.b", b""),
        dir_rec(zero, 8, b"security.x", &[0, 1, 2, 255]),
    ]
    .concat();
    let it = item(Key::new(300, 24, name_hash(b"user.a")), &data);
    let mut x = Vec::new();
    parse_xattrs(&it, &mut x).unwrap();
    assert_eq!(x.len(), 3);
    assert_eq!(x[1].value, b"");
    assert_eq!(x[2].value, [0, 1, 2, 255]);
    // Value length past the item end.
    let it = item(Key::new(300, 24, 1), &data[..data.len() - 2]);
    let e = parse_xattrs(&it, &mut Vec::new()).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("truncated dir item data: need 4 bytes, 2 available"),
        "{e}"
    );
}

#[test]
fn dir_index_entries_and_targets() {
    let data = dir_rec(Key::new(260, 1, 0), 1 | 0x80, b"f", b"");
    let it = item(Key::new(256, 96, 7), &data);
    let mut e = Vec::new();
    parse_dir_index(&it, &mut e).unwrap();
    assert_eq!(e[0].target, Target::Inode(260));
    assert_eq!((e[0].index, e[0].dir_type, e[0].dir), (7, 1, 256));
    let data = dir_rec(Key::new(258, 132, u64::MAX), 2, b"sub", b"");
    let it = item(Key::new(256, 96, 8), &data);
    parse_dir_index(&it, &mut e).unwrap();
    assert_eq!(e[1].target, Target::Subvol(TreeId(258)));
    let two = [data.clone(), data.clone()].concat();
    let it = item(Key::new(256, 96, 8), &two);
    assert!(parse_dir_index(&it, &mut e).is_err());
    let data = dir_rec(Key::new(258, 84, 0), 2, b"sub", b"");
    let it = item(Key::new(256, 96, 8), &data);
    let err = parse_dir_index(&it, &mut e).unwrap_err().to_string();
    assert!(
        err.ends_with("unexpected key (258 DIR_ITEM 0) in directory entry location"),
        "{err}"
    );
}

fn extent(ty: u8, compression: u8, ram: u64, rest: &[u64]) -> Vec<u8> {
    let mut v = 9u64.to_le_bytes().to_vec();
    v.extend_from_slice(&ram.to_le_bytes());
    v.extend_from_slice(&[compression, 0, 0, 0, ty]);
    for r in rest {
        v.extend_from_slice(&r.to_le_bytes());
    }
    v
}

#[test]
fn file_extents() {
    let data = extent(1, 0, 8192, &[13631488, 8192, 4096, 4096]);
    let e = FileExtent::parse(&item(Key::new(300, 108, 4096), &data)).unwrap();
    assert_eq!(e.end(4096), 8192);
    assert!(!e.is_hole_or_prealloc());
    let hole = extent(1, 0, 8192, &[0, 0, 0, 8192]);
    assert!(
        FileExtent::parse(&item(Key::new(300, 108, 0), &hole))
            .unwrap()
            .is_hole_or_prealloc()
    );
    let mut inline = extent(0, 0, 5, &[]);
    inline.extend_from_slice(b"hello");
    let e = FileExtent::parse(&item(Key::new(300, 108, 0), &inline)).unwrap();
    assert_eq!(e.data, ExtentData::Inline(b"hello".to_vec().into()));
    assert_eq!(e.end(4096), 4096);
    // In a leaf given with the item, the bytes are the leaf's (no copy).
    let mut leaf = vec![0u8; 100];
    leaf[40..40 + inline.len()].copy_from_slice(&inline);
    let block = Arc::new(BlockBuf::copy_of(&leaf));
    let it = ItemRef {
        block: Some(&block),
        ..item(Key::new(300, 108, 0), &block[40..40 + inline.len()])
    };
    let ExtentData::Inline(d) = FileExtent::parse(&it).unwrap().data else {
        panic!("not inline");
    };
    assert!(d.block().is_some_and(|b| Arc::ptr_eq(b, &block)));
    assert_eq!(&d[..], b"hello");
    // Bytes that are not in the block given are copied.
    let it = ItemRef {
        block: Some(&block),
        ..item(Key::new(300, 108, 0), &inline)
    };
    let ExtentData::Inline(d) = FileExtent::parse(&it).unwrap().data else {
        panic!("not inline");
    };
    assert!(d.block().is_none());
    assert_eq!(&d[..], b"hello");
    // Uncompressed inline data must be ram_bytes long.
    let short = &inline[..inline.len() - 1];
    assert!(FileExtent::parse(&item(Key::new(300, 108, 0), short)).is_err());
    // Range past the extent, bad compression, bad type, short item.
    let over = extent(1, 0, 8192, &[13631488, 8192, 4096, 8192]);
    let msg = FileExtent::parse(&item(Key::new(300, 108, 0), &over))
        .unwrap_err()
        .to_string();
    assert!(
        msg.ends_with("invalid num_bytes 8192: offset + num_bytes is past the end of the extent"),
        "{msg}"
    );
    let c = extent(1, 4, 8192, &[13631488, 4096, 0, 8192]);
    assert!(FileExtent::parse(&item(Key::new(300, 108, 0), &c)).is_err());
    let t = extent(3, 0, 8192, &[13631488, 8192, 0, 8192]);
    assert!(FileExtent::parse(&item(Key::new(300, 108, 0), &t)).is_err());
    assert!(FileExtent::parse(&item(Key::new(300, 108, 0), &data[..40])).is_err());
    let zero = extent(2, 0, 8192, &[13631488, 8192, 0, 0]);
    assert!(FileExtent::parse(&item(Key::new(300, 108, 0), &zero)).is_err());
}

#[test]
fn inode_fields_and_rdev() {
    let mut raw = vec![0u8; 160];
    raw[0x34..0x38].copy_from_slice(&0o020644u32.to_le_bytes());
    raw[0x38..0x40].copy_from_slice(&0x0010_0003u64.to_le_bytes());
    raw[0x88..0x90].copy_from_slice(&(-2i64).to_le_bytes());
    raw[0x90..0x94].copy_from_slice(&500_000_000u32.to_le_bytes());
    let i = Inode::parse(&item(Key::new(300, 1, 0), &raw)).unwrap();
    assert_eq!(i.file_type(), FileType::CharDev);
    assert_eq!((i.rdev_major(), i.rdev_minor()), (1, 3));
    assert_eq!(i.rdev_encoded(), 0x103);
    assert_eq!(
        i.mtime,
        Timespec {
            sec: -2,
            nsec: 500_000_000
        }
    );
    assert!(Inode::parse(&item(Key::new(300, 1, 0), &raw[..159])).is_err());
    // 259:70000 (a minor above 255) in new_encode_dev form.
    let big = Inode {
        rdev: (259 << 20) | 70000,
        ..i
    };
    assert_eq!(
        big.rdev_encoded(),
        (70000 & 0xff) | (259 << 8) | ((70000 & !0xff) << 12)
    );
    // Observed in kernel send streams: mknod c 1 7 (on disk 0x100007)
    // is sent as 0x107, b 7 200 (0x7000c8) as 0x7c8.
    for (on_disk, sent) in [(0x10_0007, 0x107), (0x70_00c8, 0x7c8), (0, 0)] {
        assert_eq!(Inode { rdev: on_disk, ..i }.rdev_encoded(), sent);
    }
}

#[test]
fn hashes() {
    // Known values: crc32c("") with seed ~1 unfinalised is ~1.
    assert_eq!(name_hash(b""), u64::from(!1u32));
    assert_eq!(extref_hash(5, b""), 5);
}
