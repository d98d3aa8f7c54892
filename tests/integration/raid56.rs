//! RAID5/6 rebuild from parity: reads with a device missing or a strip
//! corrupted give exactly what a normal read gives. RAID5 on the kernel
//! fixture `012-raid5`; RAID6 on a filesystem the test makes with the kernel
//! (root; in CI it must run, elsewhere it says loudly that it skipped).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use btrsend::chunk_map::Profile;
use btrsend::device::readahead::ReadOptions;
use btrsend::fs::Filesystem;
use btrsend::manifest::Options;
use btrsend::ondisk;
use btrsend::tree::key::Key;
use btrsend::tree::walk::for_each_in_range;
use btrsend::types::{Logical, TreeId};
use btrsend::volume::Volume;

use super::reader::fixtures;

/// Open `devices` degraded: these tests read with devices missing (a full
/// set opens the same either way).
fn open_degraded(devices: &[PathBuf]) -> btrsend::Result<Filesystem> {
    Filesystem::open_with(devices, &ReadOptions::default().with_degraded(true))
}

/// Every item of every tree (root tree, chunk tree, each tree with a
/// ROOT_ITEM), as (tree, key, data).
pub type Items = Vec<(u64, Key, Vec<u8>)>;

pub fn all_items(fs: &Filesystem) -> Items {
    let vol = fs.volume();
    let mut ids = Vec::new();
    let mut out = Vec::new();
    for_each_in_range(vol, vol.root_tree(), &Key::MIN, &Key::MAX, |item| {
        if item.key.item_type == ondisk::BTRFS_ROOT_ITEM_KEY {
            ids.push(item.key.objectid);
        }
        out.push((1, item.key, item.data.to_vec()));
        Ok(())
    })
    .unwrap();
    ids.dedup();
    let mut roots = vec![vol.chunk_tree()];
    roots.extend(ids.iter().map(|&id| fs.tree_root(TreeId(id)).unwrap()));
    for root in roots {
        for_each_in_range(vol, root, &Key::MIN, &Key::MAX, |item| {
            out.push((root.tree.get(), item.key, item.data.to_vec()));
            Ok(())
        })
        .unwrap();
    }
    out
}

/// Every allocated extent (data and tree blocks) from the extent tree, as
/// (logical, length).
pub fn extents(fs: &Filesystem) -> Vec<(u64, u64)> {
    let nodesize = u64::from(fs.volume().superblock().nodesize);
    let root = fs
        .tree_root(TreeId(ondisk::BTRFS_EXTENT_TREE_OBJECTID))
        .unwrap();
    let mut out = Vec::new();
    for_each_in_range(fs.volume(), root, &Key::MIN, &Key::MAX, |item| {
        match item.key.item_type {
            ondisk::BTRFS_EXTENT_ITEM_KEY => out.push((item.key.objectid, item.key.offset)),
            ondisk::BTRFS_METADATA_ITEM_KEY => out.push((item.key.objectid, nodesize)),
            _ => {}
        }
        Ok(())
    })
    .unwrap();
    out
}

/// The manifest (holes, data verified against the csum tree) of the top
/// level and of every subvolume: file data read through the file reader.
fn manifests(fs: &Filesystem) -> Vec<String> {
    let mut ids = vec![TreeId::FS];
    ids.extend(
        btrsend::fs::subvol::list_subvolumes(fs)
            .unwrap()
            .iter()
            .map(|s| s.id()),
    );
    ids.iter()
        .map(|&id| {
            let tree = fs.fs_tree(id).unwrap();
            btrsend::fs::manifest::manifest(&tree, Options { holes: true }, true)
                .unwrap_or_else(|e| panic!("manifest of {id}: {e}"))
        })
        .collect()
}

/// The bytes of every extent, read with [`Volume::read_logical`].
fn extent_bytes(vol: &Volume, extents: &[(u64, u64)]) -> Vec<Vec<u8>> {
    extents
        .iter()
        .map(|&(start, len)| {
            let mut buf = vec![0u8; usize::try_from(len).unwrap()];
            vol.read_logical(Logical(start), &mut buf)
                .unwrap_or_else(|e| panic!("extent {start}+{len}: {e}"));
            buf
        })
        .collect()
}

/// What a full read of the filesystem sees.
struct Reference {
    items: Items,
    extents: Vec<(u64, u64)>,
    bytes: Vec<Vec<u8>>,
    manifests: Vec<String>,
}

impl Reference {
    fn of(devices: &[PathBuf]) -> Reference {
        let fs = open_degraded(devices).unwrap();
        let extents = extents(&fs);
        assert!(!extents.is_empty());
        Reference {
            items: all_items(&fs),
            bytes: extent_bytes(fs.volume(), &extents),
            manifests: manifests(&fs),
            extents,
        }
    }

    /// Open `devices` and check all items read the same (tree blocks are
    /// verified, so corrupt strips are rebuilt).
    fn check_items(&self, devices: &[PathBuf], ctx: &str) {
        let fs = open_degraded(devices).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert!(all_items(&fs) == self.items, "{ctx}: items differ");
    }

    /// Open `devices` and check everything reads the same: all items (tree
    /// blocks are verified, so a corrupt strip is rebuilt), and the plain
    /// bytes of every extent but those in `corrupt` (a plain read cannot
    /// tell a corrupt strip).
    fn check(&self, devices: &[PathBuf], corrupt: &[u64], ctx: &str) {
        let fs = open_degraded(devices).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let items = all_items(&fs);
        assert_eq!(items.len(), self.items.len(), "{ctx}");
        assert!(items == self.items, "{ctx}: items differ");
        let bytes = extent_bytes(fs.volume(), &self.extents);
        for ((e, a), b) in self.extents.iter().zip(&bytes).zip(&self.bytes) {
            assert!(
                a == b || corrupt.contains(&e.0),
                "{ctx}: extent {e:?} differs"
            );
        }
    }
}

/// Flip bytes of the data strip holding `logical` (copy 0) in a scratch
/// copy of the device images; returns the scratch device paths.
fn corrupt_strip(devices: &[PathBuf], dir: &Path, logical: u64, at: u64) -> Vec<PathBuf> {
    let vol = Volume::open(devices).unwrap();
    let mapping = vol.chunk_map().map(Logical(logical + at), 16).unwrap();
    assert_eq!(mapping.len, 16);
    let loc = mapping.copy(0).unwrap();
    let idx = vol
        .devices()
        .iter()
        .position(|d| d.devid == loc.devid)
        .unwrap();
    drop(vol);
    let copies: Vec<PathBuf> = devices
        .iter()
        .map(|d| {
            let dest = dir.join(d.file_name().unwrap());
            if !dest.exists() {
                fs::copy(d, &dest).unwrap();
            }
            dest
        })
        .collect();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&copies[idx])
        .unwrap();
    let pos = loc.physical.get();
    let mut b = [0u8; 16];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, pos).unwrap();
    for x in &mut b {
        *x ^= 0x5a;
    }
    std::os::unix::fs::FileExt::write_all_at(&f, &b, pos).unwrap();
    copies
}

fn without(devices: &[PathBuf], drop: &[usize]) -> Vec<PathBuf> {
    devices
        .iter()
        .enumerate()
        .filter(|(i, _)| !drop.contains(i))
        .map(|(_, d)| d.clone())
        .collect()
}

/// A tree block and a data extent of the filesystem, for corruption.
fn victims(devices: &[PathBuf]) -> (u64, (u64, u64)) {
    let fs = open_degraded(devices).unwrap();
    let root = fs.tree_root(TreeId::FS).unwrap().logical.get();
    // The largest data extent: on 012 it crosses a stripe boundary, so the
    // corrupt strip has good neighbours in the same read.
    let mut all = extents(&fs);
    all.sort_by_key(|&(_, len)| std::cmp::Reverse(len));
    let data = all
        .into_iter()
        .find(|&(start, len)| {
            len >= 8192
                && fs
                    .volume()
                    .chunk_map()
                    .lookup(Logical(start))
                    .is_some_and(|c| c.flags & ondisk::BTRFS_BLOCK_GROUP_DATA != 0)
        })
        .expect("a data extent of at least 8 KiB");
    (root, data)
}

/// A corrupt tree-block strip is rebuilt from parity; a corrupt data strip
/// is found by the caller's check and rebuilt.
fn corrupt_strips_are_rebuilt(devices: &[PathBuf], reference: &Reference, ctx: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let (tree_block, (data, data_len)) = victims(devices);
    let copies = corrupt_strip(devices, tmp.path(), tree_block, 300);
    let copies2 = corrupt_strip(&copies, tmp.path(), data, 4096);
    assert_eq!(copies, copies2);
    reference.check(
        &copies,
        &[tree_block, data],
        &format!("{ctx}, corrupt tree block {tree_block}"),
    );
    // File data read through the file reader with verification: the corrupt
    // strip is rebuilt sector by sector, the strips next to it are read as
    // they are, and every file hashes as before.
    let fs = open_degraded(&copies).unwrap();
    assert!(
        manifests(&fs) == reference.manifests,
        "{ctx}: manifests differ with a corrupt data strip"
    );
    drop(fs);
    let vol = Volume::open(&copies).unwrap();
    let idx = reference.extents.iter().position(|e| e.0 == data).unwrap();
    let good = &reference.bytes[idx];
    let mut buf = vec![0u8; usize::try_from(data_len).unwrap()];
    // A plain read returns the corrupt strip: only a checksum can tell.
    vol.read_logical(Logical(data), &mut buf).unwrap();
    assert_ne!(&buf, good, "{ctx}");
    let verified = vol
        .read_verified(Logical(data), &mut buf, |off, piece| {
            piece == &good[off..off + piece.len()]
        })
        .unwrap();
    assert!(verified, "{ctx}: the corrupt strip is rebuilt");
    assert_eq!(&buf, good);
    // Nothing verifies: the first copy read is returned, flagged.
    assert!(
        !vol.read_verified(Logical(data), &mut buf, |_, _| false)
            .unwrap()
    );
    let mut plain = vec![0u8; buf.len()];
    vol.read_logical(Logical(data), &mut plain).unwrap();
    assert_eq!(buf, plain);
}

#[test]
fn raid5_reads_survive_a_missing_device_and_corrupt_strips() {
    let Some(fx) = fixtures().into_iter().find(|f| f.name().contains("raid5")) else {
        return;
    };
    assert_eq!(fx.devices.len(), 3);
    let reference = Reference::of(&fx.devices);
    let vol = Volume::open(&fx.devices).unwrap();
    assert!(
        vol.chunk_map()
            .chunks()
            .iter()
            .all(|c| c.profile == Profile::Raid5)
    );
    assert_eq!(vol.num_copies(vol.root_tree().logical).unwrap(), 2);
    drop(vol);
    for d in 0..3 {
        reference.check(
            &without(&fx.devices, &[d]),
            &[],
            &format!("raid5 without device {}", d + 1),
        );
    }
    // Two missing devices are too many for RAID5: the error names one.
    let e = open_degraded(&without(&fx.devices, &[0, 1]))
        .map(|fs| all_items(&fs).len())
        .unwrap_err();
    assert!(e.to_string().starts_with("missing device: devid "), "{e}");
    corrupt_strips_are_rebuilt(&fx.devices, &reference, "raid5");
}

// ---------------------------------------------------------------------------
// RAID6, made by the kernel in the test.

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// Root and the tools, or a loud skip (a failure in CI).
fn require_root(test: &str) -> bool {
    let mut why = None;
    if !is_root() {
        why = Some("needs root".to_owned());
    }
    for tool in ["mkfs.btrfs", "losetup", "mount", "umount"] {
        if why.is_none()
            && !Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .is_ok_and(|o| o.status.success())
        {
            why = Some(format!("needs {tool}"));
        }
    }
    match why {
        None => true,
        Some(why) => {
            assert!(!in_ci(), "live test {test} cannot run in CI: {why}");
            eprintln!("=== SKIPPED live test {test}: {why} (run as root or in CI) ===");
            false
        }
    }
}

fn is_root() -> bool {
    // The effective uid, from /proc (no libc call needed).
    fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
            .unwrap_or(false)
    })
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Loop devices and a mount made by this test, undone on drop.
struct Scratch {
    loops: Vec<String>,
    mnt: Option<PathBuf>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(mnt) = self.mnt.take() {
            let _ = Command::new("umount").arg(&mnt).status();
        }
        for l in self.loops.drain(..) {
            let _ = Command::new("losetup").args(["-d", &l]).status();
        }
    }
}

/// Make a 4-device RAID6 filesystem (data and metadata RAID6, 4 KiB nodes
/// so the trees have several levels) with small files, a large file and a
/// snapshot; returns the image files.
fn make_raid6(dir: &Path) -> Vec<PathBuf> {
    let imgs: Vec<PathBuf> = (1..=4).map(|i| dir.join(format!("dev{i}.img"))).collect();
    let mut scratch = Scratch {
        loops: Vec::new(),
        mnt: None,
    };
    for img in &imgs {
        let f = fs::File::create(img).unwrap();
        f.set_len(160 << 20).unwrap();
        drop(f);
        scratch.loops.push(run(Command::new("losetup")
            .args(["--find", "--show"])
            .arg(img)));
    }
    run(Command::new("mkfs.btrfs")
        .args(["-f", "-q", "-d", "raid6", "-m", "raid6", "-n", "4096"])
        .args(&scratch.loops));
    let mnt = dir.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let opts = format!("device={}", scratch.loops.join(",device="));
    run(Command::new("mount")
        .args(["-t", "btrfs", "-o", &opts])
        .arg(&scratch.loops[0])
        .arg(&mnt));
    scratch.mnt = Some(mnt.clone());
    run(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(mnt.join("src")));
    let src = mnt.join("src");
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for d in 0..20 {
        let dir = src.join(format!("d{d}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..60 {
            let len = usize::try_from(next() % 3000).unwrap();
            let body: Vec<u8> = (0..len).map(|_| next().to_le_bytes()[0]).collect();
            fs::write(dir.join(format!("file-{f}")), body).unwrap();
        }
    }
    let big: Vec<u8> = (0..(3 << 20)).map(|_| next().to_le_bytes()[2]).collect();
    fs::write(src.join("big"), big).unwrap();
    run(&mut Command::new("sync"));
    run(Command::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(&src)
        .arg(mnt.join("snap")));
    drop(scratch);
    imgs
}

/// The stored P and Q of the rows holding some blocks equal what we compute
/// from the data strips: our field and column order are the kernel's.
fn parity_matches_kernel(devices: &[PathBuf]) {
    let vol = Volume::open(devices).unwrap();
    let paths: std::collections::BTreeMap<_, _> = vol
        .devices()
        .iter()
        .map(|d| (d.devid, d.path.clone().unwrap()))
        .collect();
    let read = |loc: &btrsend::chunk_map::StripeLoc| {
        let mut b = vec![0u8; 4096];
        let f = fs::File::open(&paths[&loc.devid]).unwrap();
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, loc.physical.get()).unwrap();
        b
    };
    let mut checked = 0;
    for chunk in vol.chunk_map().chunks() {
        assert_eq!(chunk.profile, Profile::Raid6);
        let row = chunk.raid56_row(chunk.logical, 4096).unwrap();
        let data: Vec<Vec<u8>> = row.data.iter().map(read).collect();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let (p, q) = btrsend::device::raid56::parity(&refs);
        assert!(p == read(&row.parity[0]), "P of chunk {}", chunk.logical);
        assert!(q == read(&row.parity[1]), "Q of chunk {}", chunk.logical);
        if data.iter().any(|d| d.iter().any(|&b| b != 0)) {
            checked += 1;
        }
    }
    assert!(checked > 0, "no row with data to check");
}

#[test]
fn raid6_reads_survive_two_missing_devices_and_corrupt_strips() {
    if !require_root("raid6_reads_survive_two_missing_devices_and_corrupt_strips") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let devices = make_raid6(tmp.path());
    parity_matches_kernel(&devices);
    let reference = Reference::of(&devices);
    let fs = open_degraded(&devices).unwrap();
    // One copy per stripe: data, from P, from Q, and one more bad strip.
    assert_eq!(
        fs.volume()
            .num_copies(fs.volume().root_tree().logical)
            .unwrap(),
        4
    );
    assert!(reference.items.len() > 2000, "{}", reference.items.len());
    drop(fs);
    for a in 0..4 {
        reference.check(&without(&devices, &[a]), &[], &format!("raid6 without {a}"));
        for b in a + 1..4 {
            reference.check(
                &without(&devices, &[a, b]),
                &[],
                &format!("raid6 without {a} and {b}"),
            );
        }
    }
    let e = open_degraded(&without(&devices, &[0, 1, 2]))
        .map(|fs| all_items(&fs).len())
        .unwrap_err();
    assert!(e.to_string().starts_with("missing device: devid "), "{e}");
    corrupt_strips_are_rebuilt(&devices, &reference, "raid6");
    // A corrupt strip and a missing device: whichever device is gone (the
    // corrupt strip's, another data strip's, P's or Q's), the block is
    // rebuilt — from P, from Q, or from P and Q together.
    let scratch = tempfile::tempdir().unwrap();
    let (tree_block, _) = victims(&devices);
    let copies = corrupt_strip(&devices, scratch.path(), tree_block, 1000);
    for d in 0..4 {
        // Plain reads of other blocks of the corrupt strip's row, rebuilt
        // through it, cannot be right: only verified reads are compared.
        reference.check_items(
            &without(&copies, &[d]),
            &format!("raid6 corrupt {tree_block} without {d}"),
        );
    }
}
