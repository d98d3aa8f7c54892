//! The filesystem model against the kernel: for every fixture snapshot, the
//! manifest computed from our reader alone (no mount) must equal the one
//! the fixture generator took from the kernel's mount of that snapshot
//! (`S.manifest`, holes included). Plus corruption: a bad tree-block copy on
//! DUP falls back, on single metadata fails by name; a bad data sector fails
//! by inode and offset when verifying.

use std::fs;
use std::path::{Path, PathBuf};

use btrsend::fs::manifest::manifest;
use btrsend::fs::subvol::list_subvolumes;
use btrsend::fs::{FileType, Filesystem, FsTree, InodeGroup, SegmentKind, Target, WalkOptions};
use btrsend::manifest::{Options, diff};
use btrsend::ondisk;
use btrsend::tree::key::Key;
use btrsend::tree::walk::for_each_in_range;
use btrsend::types::TreeId;

use crate::reader::{Fixture, fixtures};

const HOLES: Options = Options { holes: true };

/// `snapshot` lines of `meta.txt`.
fn snapshots(fx: &Fixture) -> Vec<String> {
    fs::read_to_string(fx.dir.join("meta.txt"))
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("snapshot "))
        .map(|s| s.trim().to_owned())
        .collect()
}

/// The kernel's manifest of snapshot `path` (`S.manifest[.zst]`).
fn kernel_manifest(fx: &Fixture, path: &str) -> String {
    let name = path.rsplit('/').next().unwrap();
    let plain = fx.dir.join(format!("{name}.manifest"));
    if plain.is_file() {
        return fs::read_to_string(plain).unwrap();
    }
    let z = fs::read(fx.dir.join(format!("{name}.manifest.zst"))).unwrap();
    String::from_utf8(zstd::decode_all(&z[..]).unwrap()).unwrap()
}

fn tree_id(fs: &Filesystem, path: &str) -> TreeId {
    list_subvolumes(fs)
        .unwrap()
        .into_iter()
        .find(|s| s.path == path.as_bytes())
        .unwrap_or_else(|| panic!("no subvolume {path}"))
        .id()
}

fn check_fixture(fx: &Fixture, verify: bool) -> usize {
    let fs = Filesystem::open(&fx.devices).unwrap();
    let mut n = 0;
    for snap in snapshots(fx) {
        let tree = fs.fs_tree(tree_id(&fs, &snap)).unwrap();
        let ours =
            manifest(&tree, HOLES, verify).unwrap_or_else(|e| panic!("{} {snap}: {e}", fx.name()));
        let kernel = kernel_manifest(fx, &snap);
        if let Some(d) = diff(&kernel, &ours, 20) {
            panic!(
                "{} {snap}: our manifest differs from the kernel's:\n{d}",
                fx.name()
            );
        }
        n += 1;
    }
    n
}

/// Fixtures whose files are so large (1 GiB sparse files) or so many (20 000
/// files) that hashing them in a debug build takes minutes: they run in
/// release builds (`cargo test --release`), and say so otherwise.
fn heavy(fx: &Fixture) -> bool {
    let n = fx.name();
    n.starts_with("002") || n.starts_with("004") || n.starts_with("005")
}

#[test]
fn manifests_match_the_kernel() {
    let mut compared = 0;
    let mut skipped = Vec::new();
    for fx in fixtures() {
        if heavy(&fx) && cfg!(debug_assertions) {
            skipped.push(fx.name());
            continue;
        }
        compared += check_fixture(&fx, true);
    }
    if !skipped.is_empty() {
        eprintln!(
            "=== fs_model: {skipped:?} compared only in release builds (cargo test --release) ==="
        );
    }
    eprintln!("fs_model: {compared} snapshot manifests equal the kernel's");
}

/// The single pass and the random lookups agree on every inode of every
/// fixture snapshot: inode items, names (refs and extrefs, checked back
/// through DIR_ITEM lookups and DIR_INDEX listings), xattrs (each found by
/// name hash), extents.
#[test]
fn walk_and_lookups_agree() {
    for fx in fixtures() {
        if fx.name().starts_with("002") && cfg!(debug_assertions) {
            continue;
        }
        let fs = Filesystem::open(&fx.devices).unwrap();
        for snap in snapshots(&fx) {
            let tree = fs.fs_tree(tree_id(&fs, &snap)).unwrap();
            let ctx = format!("{} {snap}", fx.name());
            let mut count = 0;
            let mut prev = 0;
            for g in tree.inodes(WalkOptions::default()) {
                let g = g.unwrap();
                assert!(g.inode.ino > prev, "{ctx}: inode order");
                prev = g.inode.ino;
                check_group(&tree, &g, &ctx);
                count += 1;
            }
            assert!(count > 1, "{ctx}");
        }
    }
}

fn check_group(tree: &FsTree<'_>, g: &InodeGroup, ctx: &str) {
    let ino = g.inode.ino;
    let ctx = format!("{ctx} inode {ino}");
    assert_eq!(tree.inode(ino).unwrap(), Some(g.inode), "{ctx}");
    assert_eq!(
        tree.inode_group(ino, WalkOptions::default())
            .unwrap()
            .as_ref(),
        Some(g),
        "{ctx}"
    );
    assert_eq!(tree.names(ino).unwrap(), g.names, "{ctx}");
    assert_eq!(tree.xattrs(ino).unwrap(), g.xattrs, "{ctx}");
    for x in &g.xattrs {
        assert_eq!(
            tree.xattr(ino, &x.name).unwrap().as_ref(),
            Some(&x.value),
            "{ctx}"
        );
    }
    let extents: Vec<_> = tree.extents(ino).map(Result::unwrap).collect();
    assert_eq!(extents, g.extents, "{ctx}");
    if g.inode.nlink > 0 && ino != tree.root_dir() {
        // Every name is a DIR_ITEM of its parent pointing back here, with
        // the same DIR_INDEX index in the parent's listing.
        assert!(!g.names.is_empty(), "{ctx}: no names");
        for n in &g.names {
            let e = tree.lookup(n.parent, &n.name).unwrap();
            assert_eq!(
                e.map(|e| e.target),
                Some(Target::Inode(ino)),
                "{ctx}: lookup {:?}",
                String::from_utf8_lossy(&n.name)
            );
        }
        let nlink = usize::try_from(g.inode.nlink).unwrap();
        if g.inode.file_type() != FileType::Dir {
            assert_eq!(g.names.len(), nlink, "{ctx}: names vs nlink");
        }
    }
    if g.inode.file_type() == FileType::Dir {
        let listed: Vec<_> = tree.dir_entries(ino).map(Result::unwrap).collect();
        assert_eq!(listed, g.entries, "{ctx}");
        let mut prev = 1;
        for e in &listed {
            assert!(e.index > prev, "{ctx}: DIR_INDEX order");
            prev = e.index;
            let found = tree.lookup(ino, &e.name).unwrap().unwrap();
            assert_eq!(found.target, e.target, "{ctx}");
        }
        assert!(tree.lookup(ino, b"no such name here").unwrap().is_none());
    }
    if g.inode.file_type() == FileType::Regular {
        // Segments cover [0, size) without gaps; reading from the middle
        // gives what a read from the start gives.
        let segs: Vec<_> = tree.segments(&g.inode).map(Result::unwrap).collect();
        let mut at = 0;
        for s in &segs {
            assert_eq!(s.offset, at, "{ctx}");
            at = s.end();
        }
        assert_eq!(at, g.inode.size, "{ctx}");
        if g.inode.size > 0 && g.inode.size < (8 << 20) {
            let size = usize::try_from(g.inode.size).unwrap();
            let mut all = vec![0u8; size];
            let mut r = tree.reader(&g.inode, true);
            r.read_exact_at(0, &mut all).unwrap();
            let mid = size / 3;
            let mut part = vec![0u8; size - mid];
            r.read_exact_at(u64::try_from(mid).unwrap(), &mut part)
                .unwrap();
            assert_eq!(part, all[mid..], "{ctx}: read from {mid}");
            for s in &segs {
                if matches!(s.kind, SegmentKind::Hole(_) | SegmentKind::Prealloc(_)) {
                    let (a, b) = (
                        usize::try_from(s.offset).unwrap(),
                        usize::try_from(s.end()).unwrap(),
                    );
                    assert!(all[a..b].iter().all(|&x| x == 0), "{ctx}: hole not zero");
                }
            }
        }
    }
}

/// Name hashes: every DIR_ITEM and XATTR_ITEM key offset of 008 (hard links,
/// extrefs, 100 xattrs) equals our hash of the names it holds, and every
/// INODE_EXTREF key offset our extref hash.
#[test]
fn name_hashes_match_the_kernel() {
    let Some(fx) = fixtures().into_iter().find(|f| f.name().starts_with("008")) else {
        return;
    };
    let fs = Filesystem::open(&fx.devices).unwrap();
    let mut seen = [0usize; 3];
    for snap in snapshots(&fx) {
        let tree = fs.fs_tree(tree_id(&fs, &snap)).unwrap();
        for_each_in_range(
            fs.volume(),
            tree.tree_root(),
            &Key::MIN,
            &Key::MAX,
            |item| {
                match item.key.item_type {
                    ondisk::BTRFS_DIR_ITEM_KEY | ondisk::BTRFS_XATTR_ITEM_KEY => {
                        for rec in btrsend::fs::items::dir_records(&item) {
                            let rec = rec?;
                            assert_eq!(btrsend::fs::items::name_hash(rec.name), item.key.offset);
                        }
                        seen[usize::from(item.key.item_type == ondisk::BTRFS_XATTR_ITEM_KEY)] += 1;
                    }
                    ondisk::BTRFS_INODE_EXTREF_KEY => {
                        let mut names = Vec::new();
                        btrsend::fs::items::parse_inode_extrefs(&item, &mut names)?;
                        for n in names {
                            assert_eq!(
                                btrsend::fs::items::extref_hash(n.parent, &n.name),
                                item.key.offset
                            );
                        }
                        seen[2] += 1;
                    }
                    _ => {}
                }
                Ok(())
            },
        )
        .unwrap();
    }
    assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
}

fn scratch_copy(src: &Path, dir: &Path) -> PathBuf {
    let dest = dir.join(src.file_name().unwrap());
    fs::copy(src, &dest).unwrap();
    dest
}

/// Logical address and level of the first leaf of `tree`.
fn first_leaf(fs: &Filesystem, tree: &FsTree<'_>) -> u64 {
    let mut leaf = 0;
    for_each_in_range(
        fs.volume(),
        tree.tree_root(),
        &Key::MIN,
        &Key::MAX,
        |item| {
            if leaf == 0 {
                leaf = item.leaf.get();
            }
            Ok(())
        },
    )
    .unwrap();
    leaf
}

fn physical_copies(fs: &Filesystem, logical: u64) -> Vec<usize> {
    fs.volume()
        .chunk_map()
        .map(btrsend::types::Logical(logical), 1)
        .unwrap()
        .copies()
        .map(|c| usize::try_from(c.physical.get()).unwrap())
        .collect()
}

/// A scratch copy (in `dir`) of the fixture's first image, its first
/// snapshot, the logical address of that snapshot's first fs-tree leaf, and
/// the leaf's offsets in the image (one per copy).
fn scratch_leaf(fx: &Fixture, dir: &Path) -> (PathBuf, String, u64, Vec<usize>) {
    let img = scratch_copy(&fx.devices[0], dir);
    let snap = snapshots(fx).remove(0);
    let fs = Filesystem::open(&[&img]).unwrap();
    let tree = fs.fs_tree(tree_id(&fs, &snap)).unwrap();
    let leaf = first_leaf(&fs, &tree);
    let copies = physical_copies(&fs, leaf);
    (img, snap, leaf, copies)
}

#[test]
fn corrupt_leaf_copy_on_dup_falls_back_and_manifest_is_unchanged() {
    let Some(fx) = fixtures().into_iter().find(|f| f.name().starts_with("001")) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (img, snap, leaf, copies) = scratch_leaf(&fx, tmp.path());
    assert_eq!(copies.len(), 2, "001 has DUP metadata");
    let mut bytes = fs::read(&img).unwrap();
    for b in &mut bytes[copies[0] + 300..copies[0] + 340] {
        *b ^= 0x5a;
    }
    fs::write(&img, &bytes).unwrap();
    let fs = Filesystem::open(&[&img]).unwrap();
    let tree = fs.fs_tree(tree_id(&fs, &snap)).unwrap();
    let ours = manifest(&tree, HOLES, true).unwrap();
    assert_eq!(diff(&kernel_manifest(&fx, &snap), &ours, 10), None);
    drop(fs);
    // Both copies bad: a clear error naming the block.
    for b in &mut bytes[copies[1] + 300..copies[1] + 340] {
        *b ^= 0x5a;
    }
    fs::write(&img, &bytes).unwrap();
    let fs = Filesystem::open(&[&img]).unwrap();
    let tree = fs.fs_tree(tree_id(&fs, &snap)).unwrap();
    let msg = manifest(&tree, HOLES, true).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!(
            "corrupt tree block at logical {leaf} (tree {}): crc32c checksum mismatch: stored 0x",
            tree.id()
        )),
        "{msg}"
    );
}

#[test]
fn corrupt_leaf_on_single_metadata_is_named() {
    // 003: `-m single`, sha256.
    let Some(fx) = fixtures().into_iter().find(|f| f.name().starts_with("003")) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (img, snap, leaf, copies) = scratch_leaf(&fx, tmp.path());
    assert_eq!(copies.len(), 1, "003 has single metadata");
    let mut bytes = fs::read(&img).unwrap();
    bytes[copies[0] + 1000] ^= 0x01;
    fs::write(&img, &bytes).unwrap();
    let fs = Filesystem::open(&[&img]).unwrap();
    let id = tree_id(&fs, &snap);
    let tree = fs.fs_tree(id).unwrap();
    let err = tree
        .inodes(WalkOptions::default())
        .find_map(Result::err)
        .expect("the walk must fail");
    assert!(
        err.to_string().starts_with(&format!(
            "corrupt tree block at logical {leaf} (tree {id}): sha256 checksum mismatch: stored 0x"
        )),
        "{err}"
    );
}

/// A flipped bit in a file's data: with verification the read fails naming
/// the inode, file offset, logical address and mirror; without it, the
/// (wrong) bytes are returned.
#[test]
fn data_checksum_mismatch_names_inode_and_offset() {
    let Some(fx) = fixtures().into_iter().find(|f| f.name().starts_with("003")) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let img = scratch_copy(&fx.devices[0], tmp.path());
    let snap = snapshots(&fx).remove(0);
    // The first regular file with an uncompressed regular extent.
    let (ino, file_offset, logical, physical) = {
        let fs = Filesystem::open(&[&img]).unwrap();
        let tree = fs.fs_tree(tree_id(&fs, &snap)).unwrap();
        let mut found = None;
        for g in tree.inodes(WalkOptions::default()) {
            let g = g.unwrap();
            if g.inode.nodatasum() {
                continue;
            }
            for e in &g.extents {
                if let btrsend::fs::ExtentData::Regular(d) = &e.data
                    && d.disk_bytenr.get() != 0
                    && e.compression == btrsend::fs::Compression::None
                    && d.num_bytes >= 8192
                {
                    // The second sector of the extent's file range.
                    let logical = d.disk_bytenr.get() + d.offset + 4096;
                    found = Some((g.inode.ino, e.file_offset + 4096, logical));
                    break;
                }
            }
            if found.is_some() {
                break;
            }
        }
        let (ino, off, logical) = found.expect("a file with a regular extent");
        let phys = physical_copies(&fs, logical);
        assert_eq!(phys.len(), 1);
        (ino, off, logical, phys[0])
    };
    let mut bytes = fs::read(&img).unwrap();
    bytes[physical + 10] ^= 0x80;
    fs::write(&img, &bytes).unwrap();
    let fs = Filesystem::open(&[&img]).unwrap();
    let id = tree_id(&fs, &snap);
    let tree = fs.fs_tree(id).unwrap();
    let inode = tree.inode(ino).unwrap().unwrap();
    let mut buf = vec![0u8; 16384];
    let msg = tree
        .reader(&inode, true)
        .read_exact_at(file_offset - 4096, &mut buf)
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with(&format!(
            "corrupt data of inode {ino} at file offset {file_offset} (tree {id}, logical {logical}, mirror 1 of 1): sha256 checksum mismatch: stored 0x"
        )),
        "{msg}"
    );
    // Unverified reads return the flipped byte.
    let mut r = tree.reader(&inode, false);
    r.read_exact_at(file_offset, &mut buf[..4096]).unwrap();
    let mut good = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(
        &fs::File::open(&fx.devices[0]).unwrap(),
        &mut good,
        u64::try_from(physical + 10).unwrap(),
    )
    .unwrap();
    assert_eq!(buf[10], good[0] ^ 0x80);
    // The manifest fails the same way with verification.
    assert!(manifest(&tree, HOLES, true).is_err());
}

#[test]
fn missing_subvolume_and_inode() {
    let Some(fx) = fixtures().into_iter().find(|f| f.name().starts_with("001")) else {
        return;
    };
    let fs = Filesystem::open(&fx.devices).unwrap();
    let e = fs.fs_tree(TreeId(4242)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "corrupt tree 1: missing root item (4242 ROOT_ITEM 0)"
    );
    let tree = fs.fs_tree(TreeId::FS).unwrap();
    assert_eq!(tree.inode(1 << 40).unwrap(), None);
    assert_eq!(
        tree.inode_group(1 << 40, WalkOptions::default()).unwrap(),
        None
    );
    assert_eq!(tree.dir_entries(1 << 40).count(), 0);
}

/// The whole path from devices to a manifest, for bad-input tests.
fn open_and_describe(devices: &[PathBuf]) -> btrsend::Result<String> {
    let fs = Filesystem::open(devices)?;
    let snaps = list_subvolumes(&fs)?;
    let id = snaps.first().map_or(TreeId::FS, |s| s.id());
    let tree = fs.fs_tree(id)?;
    manifest(&tree, HOLES, true)
}

/// Not btrfs, too short, absent, a directory, truncated images, a
/// multi-device set missing devices: each a clear error, never a panic.
/// (Foreign and duplicate devices: `reader.rs`.)
#[test]
fn bad_inputs_give_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let err = |p: &Path| {
        open_and_describe(&[p.to_path_buf()])
            .unwrap_err()
            .to_string()
    };
    let zeros = tmp.path().join("zeros.img");
    fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    assert_eq!(
        err(&zeros),
        format!(
            "not a btrfs filesystem: {} (no btrfs superblock magic at physical 65536)",
            zeros.display()
        )
    );
    let text = tmp.path().join("text.img");
    fs::write(&text, "hello\n".repeat(20000)).unwrap();
    assert_eq!(
        err(&text),
        format!(
            "not a btrfs filesystem: {} (no btrfs superblock magic at physical 65536)",
            text.display()
        )
    );
    let short = tmp.path().join("short.img");
    fs::write(&short, vec![0u8; 1000]).unwrap();
    assert_eq!(
        err(&short),
        format!(
            "not a btrfs filesystem: {} (1000 bytes, too short to hold a superblock: the \
             primary copy ends at byte 69632)",
            short.display()
        )
    );
    let absent = tmp.path().join("absent.img");
    assert_eq!(
        err(&absent),
        format!(
            "cannot open {}: No such file or directory (os error 2)",
            absent.display()
        )
    );
    assert_eq!(
        err(tmp.path()),
        format!(
            "cannot open {}: Is a directory (os error 21)",
            tmp.path().display()
        )
    );
    let Some(fx) = fixtures().into_iter().find(|f| f.name().starts_with("001")) else {
        return;
    };
    // Truncated images: cut inside the metadata, and right after the
    // primary superblock. The read past the end is named.
    for cut in [24u64 << 20, 69632] {
        let img = tmp.path().join(format!("cut-{cut}.img"));
        let f = fs::File::create(&img).unwrap();
        std::io::copy(
            &mut std::io::Read::take(fs::File::open(&fx.devices[0]).unwrap(), cut),
            &mut &f,
        )
        .unwrap();
        // Both DUP copies of the first block past the cut are unreadable:
        // each read error is named.
        let msg = err(&img);
        let read_error = format!("read error on {} at physical ", img.display());
        assert!(
            msg.starts_with(&read_error)
                || (msg.starts_with("all 2 copies of tree block at logical ")
                    && msg.contains(&format!("copy 1: {read_error}"))
                    && msg.contains(&format!("; copy 2: {read_error}"))),
            "{msg}"
        );
    }
    // RAID10 given only devids 1 and 2: refused, naming the two others
    // (the kernel does not mount it without -o degraded either); degraded,
    // either every block has a copy on them, or the error names a device
    // that was not given.
    if let Some(fx) = fixtures().into_iter().find(|f| f.name().starts_with("010")) {
        match Filesystem::open(&fx.devices[..2]) {
            Err(btrsend::Error::DeviceSet(btrsend::error::DeviceSetError::Missing { missing })) => {
                let ids: Vec<u64> = missing.iter().map(|(d, _)| d.get()).collect();
                assert_eq!(ids, [3, 4]);
            }
            other => panic!("unexpected: {other:?}"),
        }
        let degraded = btrsend::device::readahead::ReadOptions::default().with_degraded(true);
        let fs = Filesystem::open_with(&fx.devices[..2], &degraded).unwrap();
        let described = list_subvolumes(&fs).and_then(|snaps| {
            let id = snaps.first().map_or(TreeId::FS, |s| s.id());
            manifest(&fs.fs_tree(id)?, HOLES, true)
        });
        match described {
            Ok(_) => {}
            Err(btrsend::Error::MissingDevice { devid, .. }) => {
                assert!(devid.get() > 2, "{devid}");
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
}

/// RAID1 data: a bad sector on the first copy is read from the second (the
/// manifest, with verification, still equals the kernel's); a different bad
/// sector on each copy of one extent still reads right (each sector falls
/// back on its own); the same sector bad on both, the error names the
/// inode, the offset and the first mirror.
#[test]
fn data_checksum_mismatch_on_raid1_uses_the_other_copy() {
    let Some(fx) = fixtures().into_iter().find(|f| f.name().starts_with("009")) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let imgs: Vec<PathBuf> = fx
        .devices
        .iter()
        .map(|d| scratch_copy(d, tmp.path()))
        .collect();
    let snap = snapshots(&fx).remove(0);
    let (ino, file_offset, copies) = {
        let fs = Filesystem::open(&imgs).unwrap();
        let tree = fs.fs_tree(tree_id(&fs, &snap)).unwrap();
        let mut found = None;
        for g in tree.inodes(WalkOptions::default()) {
            let g = g.unwrap();
            let e = g.extents.iter().find(|e| {
                matches!(&e.data, btrsend::fs::ExtentData::Regular(d)
                    if d.disk_bytenr.get() != 0 && d.num_bytes >= 8192)
                    && e.compression == btrsend::fs::Compression::None
            });
            if let (Some(e), false) = (e, g.inode.nodatasum()) {
                let btrsend::fs::ExtentData::Regular(d) = &e.data else {
                    unreachable!()
                };
                found = Some((g.inode.ino, e.file_offset, d.disk_bytenr.get() + d.offset));
                break;
            }
        }
        let (ino, off, logical) = found.expect("a file with a regular extent");
        let copies: Vec<(usize, u64)> = fs
            .volume()
            .chunk_map()
            .map(btrsend::types::Logical(logical), 1)
            .unwrap()
            .copies()
            .map(|c| {
                (
                    usize::try_from(c.devid.get() - 1).unwrap(),
                    c.physical.get(),
                )
            })
            .collect();
        (ino, off, copies)
    };
    assert_eq!(copies.len(), 2, "RAID1 data has two copies");
    // Flip a bit `at` bytes into the extent's copy on one device.
    let flip = |(dev, physical): (usize, u64), at: u64| {
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&imgs[dev])
            .unwrap();
        let mut b = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, physical + at).unwrap();
        b[0] ^= 0x10;
        std::os::unix::fs::FileExt::write_all_at(&f, &b, physical + at).unwrap();
    };
    flip(copies[0], 7);
    let fs = Filesystem::open(&imgs).unwrap();
    let id = tree_id(&fs, &snap);
    let tree = fs.fs_tree(id).unwrap();
    let ours = manifest(&tree, HOLES, true).unwrap();
    assert_eq!(diff(&kernel_manifest(&fx, &snap), &ours, 10), None);
    // Unverified reads take the first copy: the manifest differs.
    assert_ne!(manifest(&tree, HOLES, false).unwrap(), ours);
    drop(fs);
    // The second sector bad on the second copy: no copy is good whole, but
    // each sector is good on one of them.
    flip(copies[1], 4096 + 7);
    let fs = Filesystem::open(&imgs).unwrap();
    let tree = fs.fs_tree(id).unwrap();
    let two_bad = manifest(&tree, HOLES, true).unwrap();
    assert_eq!(diff(&kernel_manifest(&fx, &snap), &two_bad, 10), None);
    drop(fs);
    flip(copies[1], 7);
    let fs = Filesystem::open(&imgs).unwrap();
    let tree = fs.fs_tree(id).unwrap();
    let msg = manifest(&tree, HOLES, true).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!(
            "corrupt data of inode {ino} at file offset {file_offset} (tree {id}, logical "
        )) && msg.contains(", mirror 1 of 2): crc32c checksum mismatch: stored 0x"),
        "{msg}"
    );
}
