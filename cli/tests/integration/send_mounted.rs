//! `btrsend send` user-facing parts (issue 4):
//!
//! * mounted paths (live, root; required in CI): a read-only snapshot sent
//!   by its path in a mounted btrfs — through a top-level mount and through
//!   a `subvol=` mount — is received by the stock `btrfs receive` into the
//!   same manifest, and its stream equals the kernel's `btrfs send` of it
//!   command for command; a writable subvolume by path is refused; a path
//!   not on btrfs and a directory that is not a subvolume are clear errors;
//! * a two-device RAID1 fixture mounted read-only: both devices are found
//!   from sysfs and the stream by path is byte for byte the kernel's;
//! * progress: with stderr not a terminal nothing is printed on success;
//!   `--progress` forces a plain-text summary;
//! * data verification (the default; `--verify-data` still accepted): a
//!   corrupted data block of a single-copy image fails the send naming
//!   inode, path, file offset, logical address and mirror (with
//!   `--no-verify-data` the send does not notice); on a RAID1 image
//!   with a bad sector on each mirror the send succeeds from the good copies and the
//!   stream is byte for byte the kernel's stored stream.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use btrsend::fs::Filesystem;
use btrsend::manifest::Options;
use btrsend::testing::{self, LiveBtrfs};

use crate::common;
use crate::common::{Mount, corrupt, data_extent, sh, stderr};
use crate::common::{btrsend, unpack};

/// `btrfs receive --dump` of a stream file.
fn kernel_dump(stream: &Path) -> String {
    let out = sh(Command::new("btrfs")
        .args(["receive", "--dump", "-f"])
        .arg(stream));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn mounted_paths() {
    let test = "mounted_paths";
    if !testing::require_live(test) {
        return;
    }
    let live = LiveBtrfs::new().expect("scratch btrfs");
    let mnt = live.path().to_path_buf();
    sh(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(mnt.join("src")));
    sh(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(mnt.join("snaps")));
    let src = mnt.join("src");
    std::fs::create_dir(src.join("dir")).unwrap();
    std::fs::write(src.join("small"), b"inline data\n").unwrap();
    let big: Vec<u8> = (0..600_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(src.join("dir/big"), &big).unwrap();
    std::fs::hard_link(src.join("dir/big"), src.join("link")).unwrap();
    std::os::unix::fs::symlink("dir/big", src.join("sym")).unwrap();
    let snap = mnt.join("snaps/daily");
    sh(Command::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(&src)
        .arg(&snap));

    // By path through the top-level mount; through a symlink to it.
    let ours = live.scratch_dir().join("ours.stream");
    let o = btrsend()
        .arg("send")
        .arg("-f")
        .arg(&ours)
        .arg(&snap)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stderr.is_empty(), "quiet on success: {}", stderr(&o));
    let link = live.scratch_dir().join("via-link");
    std::os::unix::fs::symlink(&snap, &link).unwrap();
    let o = btrsend().arg("send").arg(&link).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        o.stdout,
        std::fs::read(&ours).unwrap(),
        "same stream via a symlink"
    );

    // Through a subvol= mount of the same device.
    let dev = live.loop_devices().unwrap().remove(0);
    let mnt2 = live.scratch_dir().join("mnt2");
    std::fs::create_dir(&mnt2).unwrap();
    sh(Command::new("mount")
        .args(["-o", "subvol=/snaps"])
        .arg(&dev)
        .arg(&mnt2));
    let guard = Mount(mnt2.clone());
    let o = btrsend()
        .arg("send")
        .arg(mnt2.join("daily"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        o.stdout,
        std::fs::read(&ours).unwrap(),
        "same stream via subvol=/snaps"
    );
    drop(guard);

    // The kernel's stream of the same snapshot: the same commands.
    let kernel = live.scratch_dir().join("kernel.stream");
    sh(Command::new("btrfs")
        .args(["send", "-q", "-f"])
        .arg(&kernel)
        .arg(&snap));
    assert_eq!(kernel_dump(&ours), kernel_dump(&kernel));

    // The stock receiver recreates the snapshot.
    live.receive("recv", &[&ours]).expect("btrfs receive");
    let opts = Options { holes: true };
    assert_eq!(
        live.manifest("recv/daily", opts).unwrap(),
        live.manifest("snaps/daily", opts).unwrap()
    );

    // A writable subvolume is refused; so is a plain directory.
    let o = btrsend().arg("send").arg(&src).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    let e = stderr(&o);
    assert!(
        e.contains("is not a read-only subvolume") && e.contains("only read-only snapshots"),
        "{e}"
    );
    let o = btrsend().arg("send").arg(src.join("dir")).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("is not a subvolume"), "{}", stderr(&o));
}

#[test]
fn mounted_clone_sources() {
    let test = "mounted_clone_sources";
    if !testing::require_live(test) {
        return;
    }
    let live = LiveBtrfs::new().expect("scratch btrfs");
    let mnt = live.path().to_path_buf();
    for sv in ["src", "other", "snaps"] {
        sh(Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(mnt.join(sv)));
    }
    let (src, other) = (mnt.join("src"), mnt.join("other"));
    let data = |seed: u32, n: u32| -> Vec<u8> {
        (0..n).map(|i| (i.wrapping_mul(seed) >> 3) as u8).collect()
    };
    std::fs::write(src.join("a"), data(7, 200_000)).unwrap();
    std::fs::write(other.join("own"), data(13, 300_000)).unwrap();
    let snap = |from: &Path, name: &str| {
        sh(Command::new("btrfs")
            .args(["subvolume", "snapshot", "-r"])
            .arg(from)
            .arg(mnt.join("snaps").join(name)));
    };
    snap(&src, "s1");
    snap(&other, "o1");
    sh(Command::new("cp")
        .arg("--reflink=always")
        .arg(other.join("own"))
        .arg(src.join("from-other")));
    std::fs::write(src.join("b"), data(17, 50_000)).unwrap();
    snap(&src, "s2");
    let s = |n: &str| mnt.join("snaps").join(n);
    for args in [
        vec!["-c".into(), s("s1"), "-c".into(), s("o1")],
        vec!["-p".into(), s("s1"), "-c".into(), s("o1")],
    ] {
        let ours = live.scratch_dir().join("ours.stream");
        let o = btrsend()
            .arg("send")
            .args(&args)
            .arg("-f")
            .arg(&ours)
            .arg(s("s2"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        let kernel = live.scratch_dir().join("kernel.stream");
        sh(Command::new("btrfs")
            .args(["send", "-q"])
            .args(&args)
            .arg("-f")
            .arg(&kernel)
            .arg(s("s2")));
        let dump = kernel_dump(&kernel);
        assert!(
            dump.contains("clone "),
            "{args:?}: the kernel's stream has no clone"
        );
        assert_eq!(kernel_dump(&ours), dump, "{args:?}");
    }
    // A writable clone source is refused, as by btrfs send.
    let o = btrsend()
        .arg("send")
        .arg("-c")
        .arg(&other)
        .arg("-p")
        .arg(s("s1"))
        .arg(s("s2"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("not a read-only subvolume"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn path_not_on_btrfs_is_a_clear_error() {
    let o = btrsend().args(["send", "/proc"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("/proc is not on a btrfs filesystem (it is on proc"),
        "{e}"
    );
    // `id:N` without --device is a usage error (issue 15).
    let o = btrsend().args(["send", "id:257"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("id:257 needs --device"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn progress_quiet_by_default_and_forced() {
    let tmp = tempfile::tempdir().unwrap();
    let img = unpack(tmp.path(), "001-basic", "dev1.img");
    // stderr is a pipe here: nothing at default verbosity.
    let o = btrsend()
        .arg("send")
        .arg("--device")
        .arg(&img)
        .arg("snaps/basic")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!o.stdout.is_empty());
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
    // --progress forces a plain-text report; --no-progress wins when last.
    let o = btrsend()
        .args(["send", "--progress", "--device"])
        .arg(&img)
        .arg("snaps/basic")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.starts_with("btrsend: done: ")
            && e.contains(" of file data in a ")
            && e.ends_with("/s\n"),
        "{e}"
    );
    let o = btrsend()
        .args(["send", "--progress", "--no-progress", "--device"])
        .arg(&img)
        .arg("snaps/basic")
        .output()
        .unwrap();
    assert!(o.status.success() && o.stderr.is_empty(), "{}", stderr(&o));
}

#[test]
fn verify_data_names_the_bad_block_and_uses_the_other_copy() {
    let tmp = tempfile::tempdir().unwrap();
    // Single copy: the send fails, naming everything.
    let img = unpack(tmp.path(), "001-basic", "dev1.img");
    let (ino, name, off, logical) = {
        let fs = Filesystem::open(&[&img]).unwrap();
        let found = data_extent(&fs, 257);
        corrupt(&fs, found.3, 0);
        found
    };
    let o = btrsend()
        .args(["send", "--verify-data", "--device"])
        .arg(&img)
        .arg("snaps/basic")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    for want in [
        format!("inode {ino} ("),
        format!("{name}): "),
        format!("data of inode {ino} at file offset {off} "),
        format!("logical {logical}, mirror 1 of 1"),
        "checksum".to_owned(),
    ] {
        assert!(e.contains(&want), "{want:?} not in {e}");
    }
    // Verification is the default: the same failure without the flag.
    let o = btrsend()
        .args(["send", "--device"])
        .arg(&img)
        .arg("snaps/basic")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o) == e, "{}", stderr(&o));
    // With --no-verify-data the bad block goes out unnoticed.
    let o = btrsend()
        .args(["send", "--no-verify-data", "--device"])
        .arg(&img)
        .arg("snaps/basic")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));

    // RAID1: the other copy is good; the stream is the kernel's.
    let d1 = unpack(tmp.path(), "009-raid1", "dev1.img");
    let d2 = unpack(tmp.path(), "009-raid1", "dev2.img");
    {
        let fs = Filesystem::open(&[&d1, &d2]).unwrap();
        let (_, _, _, logical) = data_extent(&fs, 257);
        // A bad sector on each mirror: each is read from the other.
        corrupt(&fs, logical, 0);
        corrupt(&fs, logical + 4096, 1);
    }
    let o = btrsend()
        .args(["send", "--verify-data", "--device"])
        .arg(&d1)
        .arg("--device")
        .arg(&d2)
        .arg("snaps/raid1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mut kernel = Vec::new();
    let mut f =
        std::fs::File::open(common::fixture_dir("009-raid1").join("raid1.full.v1.stream.zst"))
            .unwrap();
    let mut z = Vec::new();
    f.read_to_end(&mut z).unwrap();
    zstd::stream::copy_decode(&z[..], &mut kernel).unwrap();
    assert!(o.stdout == kernel, "stream differs from the kernel's");
    // The default verifies too; unverified, the corrupt first copy would
    // have been sent.
    let o = btrsend()
        .args(["send", "--device"])
        .arg(&d1)
        .arg("--device")
        .arg(&d2)
        .arg("snaps/raid1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout == kernel, "stream differs from the kernel's");
    let o = btrsend()
        .args(["send", "--no-verify-data", "--device"])
        .arg(&d1)
        .arg("--device")
        .arg(&d2)
        .arg("snaps/raid1")
        .output()
        .unwrap();
    assert!(o.status.success() && o.stdout != kernel);
}

/// Detaches a loop device on drop.
struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

#[test]
fn mounted_two_device_raid1_by_path_is_the_kernels_stream() {
    let test = "mounted_two_device_raid1_by_path_is_the_kernels_stream";
    if !testing::require_live(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let imgs = [
        unpack(tmp.path(), "009-raid1", "dev1.img"),
        unpack(tmp.path(), "009-raid1", "dev2.img"),
    ];
    let loops: Vec<Loop> = imgs
        .iter()
        .map(|img| {
            let o = sh(Command::new("losetup").args(["-f", "--show"]).arg(img));
            Loop(String::from_utf8(o.stdout).unwrap().trim().to_owned())
        })
        .collect();
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let opts = format!("ro,device={},device={}", loops[0].0, loops[1].0);
    sh(Command::new("mount")
        .args(["-t", "btrfs", "-o", &opts])
        .arg(&loops[0].0)
        .arg(&mnt));
    let guard = Mount(mnt.clone());
    let o = btrsend()
        .arg("send")
        .arg(mnt.join("snaps/raid1"))
        .output()
        .unwrap();
    let found = btrsend::mount::resolve(&mnt.join("snaps/raid1"));
    drop(guard);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        o.stderr.is_empty(),
        "no missing-device warning: {}",
        stderr(&o)
    );
    let found = found.unwrap();
    assert_eq!(found.subvol_path, "snaps/raid1");
    let mut want: Vec<PathBuf> = loops.iter().map(|l| PathBuf::from(&l.0)).collect();
    want.sort();
    assert_eq!(found.devices, want, "both devices, from sysfs");
    let mut z = Vec::new();
    std::fs::File::open(common::fixture_dir("009-raid1").join("raid1.full.v1.stream.zst"))
        .unwrap()
        .read_to_end(&mut z)
        .unwrap();
    let mut kernel = Vec::new();
    zstd::stream::copy_decode(&z[..], &mut kernel).unwrap();
    assert!(
        o.stdout == kernel,
        "stream of the mounted RAID1 snapshot differs from the kernel's"
    );
    drop(loops);
}

/// A balance running while mounted snapshots are sent (issues 4, 14, 18):
/// `btrfs balance start --full-balance` runs in a loop while full and
/// incremental sends run; every send succeeds and writes the stream an
/// undisturbed send wrote before the balance, byte for byte (which the
/// stock `btrfs receive` turns into the snapshots' exact manifests), also
/// when a block the balance moved failed to read and the send continued
/// its stream (the files share no extents, so the stream does not depend
/// on the layout; for shared extents see the library's
/// `send_continue` tests).
#[test]
fn send_during_balance_continues_the_same_stream() {
    let test = "send_during_balance_continues_the_same_stream";
    if !testing::require_live(test) {
        return;
    }
    let live = LiveBtrfs::with_options(1 << 30, &[], "").expect("scratch btrfs");
    let mnt = live.path().to_path_buf();
    sh(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(mnt.join("src")));
    std::fs::create_dir(mnt.join("snaps")).unwrap();
    let src = mnt.join("src");
    // Data in many extents and metadata in many leaves, so that the
    // balance has block groups of both kinds to relocate.
    let data = |seed: u32, len: u32| -> Vec<u8> {
        (0..len)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
            .collect()
    };
    for d in 0..8u32 {
        let dir = src.join(format!("d{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..300u32 {
            let len = if f % 30 == 0 { 1 << 20 } else { 3000 };
            std::fs::write(dir.join(format!("f{f}")), data(d * 1000 + f, len)).unwrap();
        }
    }
    let snap = mnt.join("snaps/s");
    sh(Command::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(&src)
        .arg(&snap));
    std::fs::rename(src.join("d0"), src.join("d7/d0")).unwrap();
    for f in (0..300u32).step_by(11) {
        std::fs::write(src.join(format!("d3/f{f}")), data(f, 70_000)).unwrap();
        let _ = std::fs::remove_file(src.join(format!("d5/f{f}")));
    }
    let snap2 = mnt.join("snaps/s2");
    sh(Command::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(&src)
        .arg(&snap2));
    sh(&mut Command::new("sync"));
    let opts = Options { holes: false };
    let send = |args: &[&Path]| -> Vec<u8> {
        let o = btrsend()
            .arg("send")
            .args(args.iter().map(|p| p.as_os_str()))
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        o.stdout
    };
    let p = Path::new("-p");
    let full = send(&[&snap]);
    let incr = send(&[p, &snap, &snap2]);
    // The undisturbed streams round-trip through btrfs receive.
    let full_file = live.scratch_dir().join("full.stream");
    let incr_file = live.scratch_dir().join("incr.stream");
    std::fs::write(&full_file, &full).unwrap();
    std::fs::write(&incr_file, &incr).unwrap();
    live.receive("recv", &[&full_file, &incr_file])
        .expect("btrfs receive");
    assert_eq!(
        live.manifest("recv/s", opts).unwrap(),
        live.manifest("snaps/s", opts).unwrap()
    );
    assert_eq!(
        live.manifest("recv/s2", opts).unwrap(),
        live.manifest("snaps/s2", opts).unwrap()
    );

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let balancer = {
        let stop = std::sync::Arc::clone(&stop);
        let mnt = mnt.clone();
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let ok = Command::new("btrfs")
                    .args(["balance", "start", "--full-balance"])
                    .arg(&mnt)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                n += u32::from(ok);
            }
            n
        })
    };
    // Every send succeeds with the undisturbed stream; a note says when
    // it continued after a moved block.
    let mut continued = 0u32;
    let mut during = |args: &[&Path], want: &[u8], what: &str| {
        let o = btrsend()
            .arg("send")
            .args(args.iter().map(|p| p.as_os_str()))
            .output()
            .unwrap();
        assert!(o.status.success(), "{what}: {}", stderr(&o));
        assert!(
            o.stdout == want,
            "{what}: the stream sent during a balance differs"
        );
        continued += u32::from(stderr(&o).contains("its stream continued where it stopped"));
    };
    for round in 0..6 {
        during(&[&snap], &full, &format!("round {round}, full"));
        during(
            &[p, &snap, &snap2],
            &incr,
            &format!("round {round}, incremental"),
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let balances = balancer.join().unwrap();
    assert!(balances > 0, "no balance ran");
    eprintln!(
        "{test}: 12 sends during {balances} full balances, all the undisturbed streams, \
         {continued} continued after a moved block"
    );
}
