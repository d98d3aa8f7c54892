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
