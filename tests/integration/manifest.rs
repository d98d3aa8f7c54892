//! The manifest tool on a real btrfs (root only): nested subvolumes are
//! marked and not descended into, and a kernel `btrfs send | btrfs receive`
//! round trip gives the same manifest, bar the nested subvolume the stream
//! does not carry.

use std::process::Command;

use btrsend::manifest::{self, Options};
use btrsend::testing::{self, LiveBtrfs, run};

fn stat_dev(path: &std::path::Path) -> String {
    let out = run(Command::new("stat").arg("-c%d").arg(path)).unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn nested_subvolume_is_marked_and_kernel_round_trip_matches() {
    if !testing::require_live("nested_subvolume_is_marked_and_kernel_round_trip_matches") {
        return;
    }
    let fs = LiveBtrfs::new().unwrap();
    let m = fs.path();
    let btrfs = |args: &[&str]| {
        run(Command::new("btrfs").args(args)).unwrap();
    };
    let s = m.join("s");
    btrfs(&["subvolume", "create", s.to_str().unwrap()]);
    btrfs(&["subvolume", "create", s.join("inner").to_str().unwrap()]);
    std::fs::write(s.join("inner/hidden"), b"not in the outer manifest").unwrap();
    std::fs::create_dir(s.join("d")).unwrap();
    std::fs::write(s.join("d/f"), b"data").unwrap();
    std::fs::hard_link(s.join("d/f"), s.join("g")).unwrap();
    std::os::unix::fs::symlink("d/f", s.join("l")).unwrap();
    run(Command::new("setfattr")
        .args(["-n", "user.k", "-v", "v"])
        .arg(s.join("d/f")))
    .unwrap();
    run(Command::new("truncate")
        .args(["-s", "1M"])
        .arg(s.join("sparse")))
    .unwrap();
    let snap = m.join("snap");
    btrfs(&[
        "subvolume",
        "snapshot",
        "-r",
        s.to_str().unwrap(),
        snap.to_str().unwrap(),
    ]);

    // The kernel says: the nested subvolume (and its placeholder in the
    // snapshot) has another st_dev than the tree it sits in.
    assert_ne!(stat_dev(&s), stat_dev(&s.join("inner")));
    assert_ne!(stat_dev(&snap), stat_dev(&snap.join("inner")));
    let live = manifest::manifest(&s, Options { holes: true }).unwrap();
    let snapped = manifest::manifest(&snap, Options { holes: true }).unwrap();
    for text in [&live, &snapped] {
        assert!(text.lines().any(|l| l == "inner subvol"), "{text}");
        assert!(!text.contains("hidden"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("sparse file ") && l.contains(" data=-"))
        );
    }

    // Kernel send → stock receive; the received tree has no `inner` at all.
    let stream = fs.scratch_dir().join("snap.stream");
    btrfs(&[
        "send",
        "-q",
        "-f",
        stream.to_str().unwrap(),
        snap.to_str().unwrap(),
    ]);
    fs.receive("r", &[&stream]).unwrap();
    let received = fs.manifest("r/snap", Options { holes: true }).unwrap();
    let expected: String = snapped
        .lines()
        .filter(|l| *l != "inner subvol")
        .map(|l| format!("{l}\n"))
        .collect();
    if let Some(d) = manifest::diff(&expected, &received, 20) {
        panic!("kernel round trip differs:\n{d}");
    }
    assert!(received.contains(" link=d/f "));
}

/// Issue 28 item 5: a file of i_size 2^63 - 1 and a 1 TiB file with a
/// little data each hash in time proportional to their data (the manifest
/// used to hash their holes byte by byte, forever), and the two forms, the
/// mounted tree (SEEK_DATA/SEEK_HOLE) and the device (extent items), agree.
/// Their `b3=` values are worked out here from the bytes written.
#[test]
fn huge_sparse_files_hash_by_extent_in_both_forms() {
    if !testing::require_live("huge_sparse_files_hash_by_extent_in_both_forms") {
        return;
    }
    use std::os::unix::fs::FileExt;
    let fs = LiveBtrfs::new().unwrap();
    let m = fs.path();
    let btrfs = |args: &[&str]| {
        run(Command::new("btrfs").args(args)).unwrap();
    };
    let s = m.join("s");
    btrfs(&["subvolume", "create", s.to_str().unwrap()]);
    const TIB: u64 = 1 << 40;
    let max = i64::MAX as u64;
    /// Bytes written at offsets.
    type Writes = Vec<(u64, Vec<u8>)>;
    // (file, size, writes)
    let files: [(&str, u64, Writes); 3] = [
        ("max", max, vec![]),
        (
            "max-data",
            max,
            vec![(0, b"head".to_vec()), (max - 5000, vec![7u8; 5000])],
        ),
        (
            "tib",
            TIB,
            vec![
                ((1 << 20) + 100, b"hello".to_vec()),
                (TIB / 2, vec![0x5a; 8192]),
                (TIB - 4096, vec![1u8; 4096]),
            ],
        ),
    ];
    for (name, size, writes) in &files {
        let f = std::fs::File::create(s.join(name)).unwrap();
        f.set_len(*size).unwrap();
        for (off, bytes) in writes {
            f.write_all_at(bytes, *off).unwrap();
        }
    }
    let snap = m.join("snap");
    btrfs(&[
        "subvolume",
        "snapshot",
        "-r",
        s.to_str().unwrap(),
        snap.to_str().unwrap(),
    ]);
    run(&mut Command::new("sync")).unwrap();

    let mounted = manifest::manifest(&snap, Options { holes: true }).unwrap();
    let fsys = btrsend::fs::Filesystem::open(&[fs.image()]).unwrap();
    let sv = btrsend::send::find_subvolume(&fsys, "snap").unwrap();
    let tree = fsys.fs_tree(sv.id()).unwrap();
    let device = btrsend::fs::manifest::manifest(&tree, Options { holes: true }, true).unwrap();
    assert_eq!(device, mounted);

    for (name, size, writes) in &files {
        // The hashed blocks: each written one, with what the file holds
        // there (writes do not share blocks here).
        let mut blocks: std::collections::BTreeMap<u64, Vec<u8>> = Default::default();
        for (off, bytes) in writes {
            for (i, b) in bytes.iter().enumerate() {
                let at = off + i as u64;
                let block = blocks.entry(at / 4096).or_insert_with(|| {
                    let len = (size - at / 4096 * 4096).min(4096);
                    vec![0; len as usize]
                });
                block[(at % 4096) as usize] = *b;
            }
        }
        let mut h = blake3::Hasher::new();
        for (index, block) in &blocks {
            h.update(&index.to_le_bytes());
            h.update(block);
        }
        h.update(&size.to_le_bytes());
        let want = format!(" size={size} ");
        let line = mounted
            .lines()
            .find(|l| l.starts_with(&format!("{name} file ")))
            .unwrap();
        assert!(line.contains(&want), "{line}");
        assert!(
            line.contains(&format!(" b3={} ", h.finalize().to_hex())),
            "{line}"
        );
    }
}
