//! `send -f FILE` never leaves a partial FILE (issue 15): the stream is
//! written under a temporary name beside FILE and renamed when complete.
//! On a full disk (ENOSPC on a small tmpfs), on a read error mid-send (a
//! data block whose checksum no longer matches), and on Ctrl-C (SIGINT:
//! exit status 130) neither FILE nor the temporary file is left, and a FILE
//! that was there before is untouched.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use btrsend::testing::{self, LiveBtrfs};

use crate::common::{btrsend, shell};

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A btrfs with a read-only snapshot `snap` holding `mib` MiB of data in
/// `snap/big` (and the marker "BTRSEND-MARKER" repeated in `snap/marked`).
fn fs_with_snapshot(mib: u32) -> LiveBtrfs {
    let fs = LiveBtrfs::with_options(2 << 30, &[], "").expect("live btrfs");
    let m = fs.path().display();
    shell(&format!(
        "cd {m} && btrfs -q subvolume create sv && head -c {mib}M /dev/urandom > sv/big && \
         yes BTRSEND-MARKER | head -c 65536 > sv/marked && \
         btrfs -q subvolume snapshot -r sv snap && sync"
    ));
    fs
}

#[test]
fn send_file_is_never_left_partial() {
    if !testing::require_live("send_file_is_never_left_partial") {
        return;
    }
    let fs = fs_with_snapshot(200);
    let snap = fs.path().join("snap");

    // ENOSPC: a 16 MiB tmpfs cannot hold the 200 MiB stream.
    let tmpfs = testing::Tmpfs::new(16 << 20).expect("tmpfs");
    let target = tmpfs.path().join("out.stream");
    std::fs::write(&target, b"the old stream").unwrap();
    let out = btrsend()
        .arg("send")
        .arg("-f")
        .arg(&target)
        .arg(&snap)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("btrsend: error: ") && stderr.contains("No space left"),
        "{stderr}"
    );
    assert_eq!(
        names(tmpfs.path()),
        ["out.stream"],
        "no temporary file left"
    );
    assert_eq!(
        std::fs::read(&target).unwrap(),
        b"the old stream",
        "old file untouched"
    );

    // Success replaces it whole.
    let big = fs.scratch_dir().join("ok.stream");
    let out = btrsend()
        .arg("send")
        .arg("-f")
        .arg(&big)
        .arg(&snap)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::metadata(&big).unwrap().len() > 200 << 20);
    let leftovers: Vec<String> = names(fs.scratch_dir())
        .into_iter()
        .filter(|n| n.ends_with(".part"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // SIGINT mid-send: exit 130, nothing left.
    let dir = fs.scratch_dir().join("sigint");
    std::fs::create_dir(&dir).unwrap();
    let target = dir.join("out.stream");
    let mut child = btrsend()
        .arg("send")
        .arg("-f")
        .arg(&target)
        .arg(&snap)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    // Stop it once its temporary file exists, then interrupt it.
    let t = Instant::now();
    loop {
        if names(&dir).iter().any(|n| n.ends_with(".part")) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no temporary file appeared"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "send ended before it could be interrupted"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    shell(&format!("kill -STOP {pid}"));
    shell(&format!("kill -INT {pid}"));
    shell(&format!("kill -CONT {pid}"));
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(names(&dir).is_empty(), "left behind: {:?}", names(&dir));

    // A read error mid-send: corrupt the marked file's data on the device
    // (its checksum then fails; the send reads the image, not the mount).
    let img = fs.image().to_path_buf();
    let bytes = std::fs::read(&img).unwrap();
    let at = bytes
        .windows(15)
        .position(|w| w == b"BTRSEND-MARKER\n")
        .expect("marker on the device");
    drop(bytes);
    corrupt(&img, at as u64);
    let dir = fs.scratch_dir().join("readerr");
    std::fs::create_dir(&dir).unwrap();
    let target = dir.join("out.stream");
    let out = btrsend()
        .args(["send", "--verify-data", "--device"])
        .arg(&img)
        .arg("-f")
        .arg(&target)
        .arg("snap")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("checksum"), "{stderr}");
    assert!(names(&dir).is_empty(), "left behind: {:?}", names(&dir));
}

fn corrupt(img: &PathBuf, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    f.write_all_at(b"X", at).unwrap();
}
