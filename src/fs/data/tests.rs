//! File contents of kernel-made images against what the kernel showed
//! through the mounted snapshot (the fixture manifests: BLAKE3 of the
//! bytes `read` returned, and the `SEEK_DATA`/`SEEK_HOLE` ranges):
//! sparse and preallocated files (004) and zlib, LZO and zstd extents,
//! inline and regular (006).
#![allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::as_conversions
)]

use std::path::Path;

use super::*;
use crate::fs::subvol::list_subvolumes;
use crate::fs::{Filesystem, Target};

/// Every regular file of `snapshot` in fixture `fixture`: its path, the
/// kernel's hash of its bytes and its data ranges.
fn check(fixture: &str, snapshot: &str) -> usize {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(fixture);
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("dev1.img");
    let zst = std::fs::File::open(base.join("dev1.img.zst")).unwrap();
    let mut dec = zstd::stream::read::Decoder::new(zst).unwrap();
    std::io::copy(&mut dec, &mut std::fs::File::create(&img).unwrap()).unwrap();
    let fs = Filesystem::open(&[&img]).unwrap();
    let want = format!("snaps/{snapshot}");
    let subvol = list_subvolumes(&fs)
        .unwrap()
        .into_iter()
        .find(|s| s.path == want.as_bytes())
        .unwrap();
    let tree = fs.fs_tree(subvol.id()).unwrap();
    let manifest = std::fs::read_to_string(base.join(format!("{snapshot}.manifest"))).unwrap();
    let mut files = 0;
    for line in manifest.lines().filter(|l| !l.starts_with('#')) {
        let mut fields = line.split(' ');
        let (Some(path), Some("file")) = (fields.next(), fields.next()) else {
            continue;
        };
        let field = |name: &str| {
            line.split(' ')
                .find_map(|f| f.strip_prefix(name))
                .unwrap_or_else(|| panic!("{path}: no {name}"))
                .to_owned()
        };
        let mut ino = tree.root_dir();
        for name in path.split('/') {
            let e = tree.lookup(ino, name.as_bytes()).unwrap().unwrap();
            let Target::Inode(i) = e.target else {
                panic!("{path}: a subvolume")
            };
            ino = i;
        }
        let inode = tree.inode(ino).unwrap().unwrap();
        // The whole file, in reads of an odd size, verified.
        let mut reader = tree.reader(&inode, true);
        let mut all = Vec::new();
        let mut buf = vec![0u8; 7777];
        loop {
            let n = reader.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        assert_eq!(all.len() as u64, inode.size, "{path}");
        assert_eq!(
            crate::manifest::content_hash_of(&all),
            field("b3="),
            "{path}"
        );
        // Reads at offsets, backwards too, give the same bytes.
        let offsets = [all.len() / 2, 1, all.len().saturating_sub(5000), 0];
        for off in offsets.into_iter().filter(|&o| o <= all.len()) {
            let len = (all.len() - off).min(9000);
            let mut part = vec![0u8; len];
            reader.read_exact_at(off as u64, &mut part).unwrap();
            assert_eq!(part, &all[off..off + len], "{path} at {off}");
        }
        // The data ranges lseek reported.
        let ranges = data_ranges(tree.segments(&inode)).unwrap();
        let text = if ranges.is_empty() {
            "-".to_owned()
        } else {
            let parts: Vec<String> = ranges.iter().map(|(o, l)| format!("{o}+{l}")).collect();
            parts.join(",")
        };
        assert_eq!(text, field("data="), "{path}");
        files += 1;
    }
    files
}

#[test]
fn sparse_and_preallocated_files_read_as_the_kernel_read_them() {
    assert!(check("004-sparse-prealloc", "h1") >= 10);
    assert!(check("004-sparse-prealloc", "h2") >= 10);
}

#[test]
fn compressed_files_read_as_the_kernel_read_them() {
    assert!(check("006-compression", "c1") >= 50);
}
