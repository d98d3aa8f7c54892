//! Issue 18: a send by `--device` of a mounted filesystem is never wrong
//! and never a false alarm, and data checksums are verified by default.
//! The oracle is the kernel's `btrfs send` of the same snapshot (byte for
//! byte: commands and data).
//!
//! * the stale-cache sequence (live): the loop device's page cache is
//!   filled, files are rewritten and snapshotted (the test checks that the
//!   cached pages are then stale: a buffered read of the device differs
//!   from a direct one), and `send --device LOOP` of the new snapshot —
//!   full, incremental, verified or not, by the loop device or its image
//!   file — is the kernel's stream;
//! * rounds of rewrites between snapshots (live; a nodatacow file among
//!   them, which has no checksums): each snapshot sent by `--device` while
//!   the filesystem stays mounted read-write, full and incremental, is the
//!   kernel's stream;
//! * what counts as mounted (live): the loop device and its backing image
//!   are found in sysfs, a copy of the image is not; a writable subvolume
//!   of a read-write mount is refused, of a read-only mount sent;
//! * a two-device RAID1 mounted read-write, both devices' caches filled
//!   before a change: sent by its two devices, the kernel's stream;
//! * a corrupted data block on an unmounted DUP image (no root needed
//!   beyond making the image, which is live): one bad copy is read from
//!   the other (the kernel's stream); both bad, the send fails naming
//!   inode, path, file offset and logical address, and the bad bytes are
//!   never sent; `--no-verify-data` sends them.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use btrsend::fs::Filesystem;
use btrsend::testing::{self, LiveBtrfs};

use crate::common;
use crate::common::btrsend;
use crate::common::{Mount, corrupt, data_extent, sh, snapshot_ro, stderr};

/// The kernel's stream of `snap` (incremental against `parent`).
fn kernel_stream(snap: &Path, parent: Option<&Path>) -> Vec<u8> {
    let mut cmd = Command::new("btrfs");
    cmd.args(["send", "-q"]);
    if let Some(p) = parent {
        cmd.arg("-p").arg(p);
    }
    sh(cmd.arg(snap)).stdout
}

/// `btrsend send ARGS…`, which must succeed: its stream.
fn ours(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Vec<u8> {
    let mut cmd = btrsend();
    cmd.arg("send");
    for a in args {
        cmd.arg(a);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{cmd:?}: {}", stderr(&o));
    assert!(o.stderr.is_empty(), "quiet on success: {}", stderr(&o));
    o.stdout
}

/// Deterministic bytes.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Read the whole device through its page cache (filling it).
fn fill_cache(dev: &Path) {
    sh(Command::new("dd")
        .arg(format!("if={}", dev.display()))
        .args(["of=/dev/null", "bs=1M", "status=none"]));
}

/// Whether a buffered read of the device differs from a direct one
/// (some of its cached pages are stale).
fn cache_is_stale(dev: &Path) -> bool {
    let d = dev.display();
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "cmp -s <(dd if={d} bs=1M status=none) <(dd if={d} bs=1M iflag=direct status=none)"
        ))
        .output()
        .unwrap();
    match o.status.code() {
        Some(0) => false,
        Some(1) => true,
        _ => panic!("cmp failed: {}", stderr(&o)),
    }
}

#[test]
fn issue18_stale_block_device_cache_gives_the_right_stream() {
    let test = "issue18_stale_block_device_cache_gives_the_right_stream";
    if !testing::require_live(test) {
        return;
    }
    let live = LiveBtrfs::with_options(1 << 30, &[], "").expect("scratch btrfs");
    let mnt = live.path().to_path_buf();
    let dev = live.loop_devices().unwrap().remove(0);
    sh(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(mnt.join("sv")));
    std::fs::create_dir(mnt.join("snaps")).unwrap();
    let sv = mnt.join("sv");
    for i in 0..6u64 {
        std::fs::write(
            sv.join(format!("f{i}")),
            bytes(i, 150_000 + 40_000 * i as usize),
        )
        .unwrap();
    }
    let s1 = mnt.join("snaps/s1");
    snapshot_ro(&sv, &s1);
    assert!(ours(&[&"--device", &dev, &"snaps/s1"]) == kernel_stream(&s1, None));
    // An earlier reader of the device (dd, blkid, an older btrsend) leaves
    // its pages in the block device's page cache.
    fill_cache(&dev);
    for i in 0..6u64 {
        std::fs::write(
            sv.join(format!("f{i}")),
            bytes(100 + i, 150_000 + 40_000 * i as usize),
        )
        .unwrap();
    }
    std::fs::write(sv.join("new"), bytes(7, 90_000)).unwrap();
    let s2 = mnt.join("snaps/s2");
    snapshot_ro(&sv, &s2);
    sh(&mut Command::new("sync"));
    // The scenario needs stale pages in the loop device's page cache;
    // under memory pressure they may have been evicted already (the sends
    // below are still checked against the kernel's streams).
    if !cache_is_stale(&dev) {
        eprintln!(
            "{test}: note: no stale pages left in the page cache of {}",
            dev.display()
        );
    }
    let kernel_full = kernel_stream(&s2, None);
    let kernel_inc = kernel_stream(&s2, Some(&s1));
    assert!(
        ours(&[&"--device", &dev, &"snaps/s2"]) == kernel_full,
        "full stream of s2 by the mounted device differs from the kernel's"
    );
    fill_cache(&dev);
    assert!(
        ours(&[&"--device", &dev, &"-p", &"snaps/s1", &"snaps/s2"]) == kernel_inc,
        "incremental stream differs from the kernel's"
    );
    fill_cache(&dev);
    assert!(
        ours(&[&"--no-verify-data", &"--device", &dev, &"snaps/s2"]) == kernel_full,
        "unverified full stream differs from the kernel's"
    );
    assert!(
        ours(&[&"--device", &live.image(), &"snaps/s2"]) == kernel_full,
        "full stream by the image file differs from the kernel's"
    );
}

#[test]
fn issue18_rewrites_between_snapshots_by_mounted_device_match_the_kernel() {
    let test = "issue18_rewrites_between_snapshots_by_mounted_device_match_the_kernel";
    if !testing::require_live(test) {
        return;
    }
    let live = LiveBtrfs::with_options(1 << 30, &[], "").expect("scratch btrfs");
    let mnt = live.path().to_path_buf();
    let dev = live.loop_devices().unwrap().remove(0);
    sh(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(mnt.join("sv")));
    std::fs::create_dir(mnt.join("snaps")).unwrap();
    let sv = mnt.join("sv");
    // A nodatacow file (no data checksums: read unverified).
    let nocow = sv.join("nocow");
    std::fs::write(&nocow, b"").unwrap();
    sh(Command::new("chattr").arg("+C").arg(&nocow));
    let mut prev: Option<PathBuf> = None;
    for round in 0..5u64 {
        for i in 0..8u64 {
            let p = sv.join(format!("f{i}"));
            let seed = round * 100 + i;
            match (round + i) % 4 {
                // Rewrite whole.
                0 => std::fs::write(&p, bytes(seed, 60_000 + 9_000 * i as usize)).unwrap(),
                // Overwrite the middle in place.
                1 => {
                    let f = OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .open(&p)
                        .unwrap();
                    f.write_all_at(&bytes(seed, 20_000), 8192).unwrap();
                }
                // Truncate and append.
                2 => {
                    let f = OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .open(&p)
                        .unwrap();
                    f.set_len(30_000).unwrap();
                    f.write_all_at(&bytes(seed, 50_000), 30_000).unwrap();
                }
                _ => {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
        let f = OpenOptions::new().write(true).open(&nocow).unwrap();
        f.write_all_at(&bytes(round + 1000, 64 << 10), round * 16384)
            .unwrap();
        drop(f);
        let snap = mnt.join(format!("snaps/r{round}"));
        snapshot_ro(&sv, &snap);
        // Each send leaves the device's pages cached for the next round's.
        let name = format!("snaps/r{round}");
        assert!(
            ours(&[&"--device", &dev, &name]) == kernel_stream(&snap, None),
            "round {round}: full stream differs from the kernel's"
        );
        if let Some(p) = &prev {
            let pname = format!("snaps/{}", p.file_name().unwrap().to_str().unwrap());
            assert!(
                ours(&[&"--device", &dev, &"-p", &pname, &name]) == kernel_stream(&snap, Some(p)),
                "round {round}: incremental stream differs from the kernel's"
            );
        }
        prev = Some(snap);
    }
}

#[test]
fn issue18_what_counts_as_mounted_and_writable_subvolumes() {
    let test = "issue18_what_counts_as_mounted_and_writable_subvolumes";
    if !testing::require_live(test) {
        return;
    }
    let live = LiveBtrfs::with_options(1 << 30, &[], "").expect("scratch btrfs");
    let mnt = live.path().to_path_buf();
    let dev = live.loop_devices().unwrap().remove(0);
    sh(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(mnt.join("sv")));
    std::fs::write(mnt.join("sv/a"), bytes(1, 10_000)).unwrap();
    sh(&mut Command::new("sync"));

    let by_dev = btrsend::mount::mounted_filesystem_of(&dev)
        .unwrap()
        .expect("the loop device is mounted");
    assert_eq!(by_dev.mount_point.as_deref(), Some(mnt.as_path()));
    assert!(!by_dev.read_only);
    assert_eq!(by_dev.devices, vec![dev.clone()]);
    let by_img = btrsend::mount::mounted_filesystem_of(live.image())
        .unwrap()
        .expect("the image backs the mounted loop device");
    assert_eq!(by_img, by_dev);
    // A copy has the same fsid but is not the mounted filesystem.
    let copy = live.scratch_dir().join("copy.img");
    sh(Command::new("cp")
        .arg("--sparse=always")
        .arg(live.image())
        .arg(&copy));
    assert_eq!(btrsend::mount::mounted_filesystem_of(&copy).unwrap(), None);

    // Read-write: the writable subvolume is refused, naming the mount.
    let o = btrsend()
        .args(["send", "--device"])
        .arg(&dev)
        .arg("sv")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    let e = stderr(&o);
    assert!(
        e.contains("sv is not a read-only subvolume")
            && e.contains(&format!("the filesystem mounted at {}", mnt.display()))
            && e.contains("btrfs subvolume snapshot -r"),
        "{e}"
    );
    // The copy is not mounted: any subvolume.
    let o = btrsend()
        .args(["send", "--device"])
        .arg(&copy)
        .arg("sv")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // Read-only mount: nothing can change, the writable subvolume is sent.
    sh(Command::new("mount").args(["-o", "remount,ro"]).arg(&mnt));
    let ro = btrsend::mount::mounted_filesystem_of(&dev)
        .unwrap()
        .unwrap();
    let o = btrsend()
        .args(["send", "--device"])
        .arg(&dev)
        .arg("sv")
        .output()
        .unwrap();
    sh(Command::new("mount").args(["-o", "remount,rw"]).arg(&mnt));
    assert!(ro.read_only);
    assert!(o.status.success(), "{}", stderr(&o));
    // The stock receiver makes of it what the mount shows.
    let stream = live.scratch_dir().join("sv.stream");
    std::fs::write(&stream, &o.stdout).unwrap();
    live.receive("recv", &[&stream]).expect("btrfs receive");
    let opts = btrsend::manifest::Options { holes: true };
    assert_eq!(
        live.manifest("recv/sv", opts).unwrap(),
        live.manifest("sv", opts).unwrap()
    );
}

#[test]
fn issue18_corrupt_data_block_recovered_from_the_mirror_or_reported() {
    let test = "issue18_corrupt_data_block_recovered_from_the_mirror_or_reported";
    if !testing::require_live(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("dup.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    sh(Command::new("mkfs.btrfs")
        .args(["-q", "-d", "dup", "-m", "dup"])
        .arg(&img));
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    sh(Command::new("mount")
        .arg("-o")
        .arg("loop")
        .arg(&img)
        .arg(&mnt));
    let guard = Mount(mnt.clone());
    sh(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(mnt.join("sv")));
    std::fs::write(mnt.join("sv/data"), bytes(3, 300_000)).unwrap();
    std::fs::write(mnt.join("sv/other"), bytes(4, 20_000)).unwrap();
    snapshot_ro(&mnt.join("sv"), &mnt.join("snap"));
    let kernel = kernel_stream(&mnt.join("snap"), None);
    drop(guard);

    let fs = Filesystem::open(&[&img]).unwrap();
    let snap_id = btrsend::send::find_subvolume(&fs, "snap")
        .unwrap()
        .id()
        .get();
    let (ino, name, off, logical) = data_extent(&fs, snap_id);
    assert_eq!(
        fs.volume()
            .num_copies(btrsend::types::Logical(logical))
            .unwrap(),
        2
    );
    // One bad copy: read from the other; the kernel's stream.
    corrupt(&fs, logical, 0);
    drop(fs);
    assert!(
        ours(&[&"--device", &img, &"snap"]) == kernel,
        "stream with one bad copy differs from the kernel's"
    );
    // Both bad: reported, and the bad bytes are not sent.
    let fs = Filesystem::open(&[&img]).unwrap();
    corrupt(&fs, logical, 1);
    drop(fs);
    let o = btrsend()
        .args(["send", "--device"])
        .arg(&img)
        .arg("snap")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    for want in [
        format!("inode {ino} ({name}): "),
        format!("data of inode {ino} at file offset {off} "),
        format!("logical {logical}, mirror "),
        " of 2)".to_owned(),
        "checksum mismatch".to_owned(),
    ] {
        assert!(e.contains(&want), "{want:?} not in {e}");
    }
    let bad = [0xa5u8; 4096];
    assert!(
        !o.stdout.windows(bad.len()).any(|w| w == bad),
        "the bad block was sent"
    );
    // Unverified, it is.
    let sent = ours(&[&"--no-verify-data", &"--device", &img, &"snap"]);
    assert!(sent.windows(bad.len()).any(|w| w == bad));
}

/// Detaches a loop device on drop.
struct Loop(PathBuf);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

#[test]
fn issue18_two_device_raid1_mounted_read_write_by_its_devices() {
    let test = "issue18_two_device_raid1_mounted_read_write_by_its_devices";
    if !testing::require_live(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let imgs = [
        common::unpack(tmp.path(), "009-raid1", "dev1.img"),
        common::unpack(tmp.path(), "009-raid1", "dev2.img"),
    ];
    let loops: Vec<Loop> = imgs
        .iter()
        .map(|img| {
            let o = sh(Command::new("losetup").args(["-f", "--show"]).arg(img));
            Loop(PathBuf::from(String::from_utf8(o.stdout).unwrap().trim()))
        })
        .collect();
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let opts = format!(
        "device={},device={}",
        loops[0].0.display(),
        loops[1].0.display()
    );
    sh(Command::new("mount")
        .args(["-t", "btrfs", "-o", &opts])
        .arg(&loops[0].0)
        .arg(&mnt));
    let guard = Mount(mnt.clone());
    // Both devices' pages cached, then the filesystem changes.
    for l in &loops {
        fill_cache(&l.0);
    }
    std::fs::write(mnt.join("new-file"), bytes(9, 200_000)).unwrap();
    snapshot_ro(&mnt, &mnt.join("snaps/top"));
    sh(&mut Command::new("sync"));
    let kernel = kernel_stream(&mnt.join("snaps/top"), None);
    let found = btrsend::mount::mounted_filesystem_of(&loops[1].0)
        .unwrap()
        .expect("the second device is mounted");
    let o = btrsend()
        .arg("send")
        .arg("--device")
        .arg(&loops[0].0)
        .arg("--device")
        .arg(&loops[1].0)
        .arg("snaps/top")
        .output()
        .unwrap();
    drop(guard);
    assert_eq!(found.mount_point.as_deref(), Some(mnt.as_path()));
    let mut want: Vec<PathBuf> = loops.iter().map(|l| l.0.clone()).collect();
    want.sort();
    assert_eq!(found.devices, want, "both devices, from sysfs");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        o.stdout == kernel,
        "stream of the mounted RAID1 filesystem by its devices differs from the kernel's"
    );
}
