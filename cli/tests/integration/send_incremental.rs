//! `btrsend send -p PARENT` end to end (issue 6): the real binary on a
//! kernel-made fixture image (002-many-files, a pair whose stream is
//! command-identical to the kernel's) writes an incremental stream whose
//! `btrsend dump` equals the kernel's stored `btrfs receive --dump` of its
//! own `btrfs send -p` stream; so does `-c` with and without `-p`
//! (015-clone-sources; without `-p` the parent is picked as btrfs-progs
//! does); `-c` with no suitable parent and an unknown parent fail with exit
//! status 1 and a clear message.

use crate::common;
use crate::common::btrsend;

const FIXTURE: &str = "002-many-files";

#[test]
fn incremental_send_matches_the_kernel_dump() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::unpack(tmp.path(), FIXTURE, "dev1.img");
    for (v, args) in [
        ("v1", &[][..]),
        ("v2c", &["--proto", "2", "--compressed-data"][..]),
    ] {
        let stream = tmp.path().join(format!("{v}.stream"));
        let args = [args, &["-p", "snaps/m1"][..]].concat();
        let dump = common::send_dump(&img, &args, &stream, "snaps/m2");
        let expected = std::fs::read_to_string(
            common::fixture_dir(FIXTURE).join(format!("m1--m2.inc.{v}.dump")),
        )
        .unwrap();
        assert!(dump == expected, "{v}: dump differs from the kernel's");
    }
}

#[test]
fn clone_source_send_matches_the_kernel_dump() {
    let fixture = "015-clone-sources";
    let tmp = tempfile::tempdir().unwrap();
    let img = common::unpack(tmp.path(), fixture, "dev1.img");
    for (stem, args) in [
        ("a2.c-a1+b1", &["-c", "snaps/a1", "-c", "snaps/b1"][..]),
        ("a2.p-a1.c-b1", &["-p", "snaps/a1", "-c", "snaps/b1"][..]),
    ] {
        let stream = tmp.path().join(format!("{stem}.stream"));
        let dump = common::send_dump(&img, args, &stream, "snaps/a2");
        let expected =
            std::fs::read_to_string(common::fixture_dir(fixture).join(format!("{stem}.v1.dump")))
                .unwrap();
        assert!(dump == expected, "{stem}: dump differs from the kernel's");
    }
    // b1 is no snapshot of a2's source: no parent to pick (as btrfs-progs).
    let out = btrsend()
        .arg("send")
        .arg("--device")
        .arg(&img)
        .args(["-c", "snaps/b1", "-f"])
        .arg(tmp.path().join("x"))
        .arg("snaps/a2")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("parent determination failed"), "{stderr}");
}

#[test]
fn bad_parent_arguments_fail_with_status_1() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::unpack(tmp.path(), FIXTURE, "dev1.img");
    let f = tmp.path().join("s");
    for (args, want) in [
        (&["-c", "snaps/nope"][..], "snaps/nope"),
        (&["-p", "snaps/nope"][..], "snaps/nope"),
    ] {
        let out = btrsend()
            .arg("send")
            .arg("--device")
            .arg(&img)
            .args(args)
            .arg("-f")
            .arg(&f)
            .arg("snaps/m2")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
