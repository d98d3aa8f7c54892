//! `--limit-rate` (issue 35): what goes through the limit is what goes
//! without it, byte for byte, judged by the kernel's own streams of the
//! `014-incremental` image (and, into a target, by the kernel's manifests
//! of its snapshots); bad rates are usage errors. The rate itself is
//! measured by `benches/limit-rate`, not by a timed test.

use std::fs;

use btrsend::manifest;

use crate::common::{btrsend, fixture_dir, ok, stderr, unpack};

const FIX: &str = "014-incremental";

fn kernel_stream(name: &str) -> Vec<u8> {
    zstd::decode_all(fs::File::open(fixture_dir(FIX).join(name)).unwrap()).unwrap()
}

#[test]
fn send_run_and_restore_at_a_limit_give_the_kernels_streams() {
    let dir = tempfile::tempdir().unwrap();
    let img = unpack(dir.path(), FIX, "dev1.img");
    let img = img.to_str().unwrap();
    // send: the kernel's full stream of s1.
    let out = btrsend()
        .args(["send", "--limit-rate", "64M", "--device", img, "snaps/s1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        out.stdout == kernel_stream("s1.full.v1.stream.zst"),
        "send --limit-rate differs from the kernel's stream"
    );
    // backup run and restore --stdout: the kernel's chain.
    let repo = dir.path().join("repo");
    let repo = repo.to_str().unwrap();
    ok(&btrsend()
        .args(["backup", "init", "--encryption", "none", "--repo", repo])
        .output()
        .unwrap());
    ok(&btrsend()
        .args(["backup", "run", "--limit-rate", "100M", "--repo", repo])
        .args(["--device", img, "--frame-bytes", "4096", "snaps/s*"])
        .output()
        .unwrap());
    let out = btrsend()
        .args(["backup", "restore", "--stdout", "--limit-rate", "100M"])
        .args(["--repo", repo, "snaps/s3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let mut chain = kernel_stream("s1.full.v1.stream.zst");
    chain.extend(kernel_stream("s1--s2.inc.v1.stream.zst"));
    chain.extend(kernel_stream("s2--s3.inc.v1.stream.zst"));
    assert!(
        out.stdout == chain,
        "restore --limit-rate differs from the kernel's chain"
    );
    // backup run --target: each received snapshot has the kernel's
    // manifest of it.
    let target = dir.path().join("target");
    fs::create_dir(&target).unwrap();
    ok(&btrsend()
        .args(["backup", "run", "--limit-rate", "100M", "--target"])
        .arg(&target)
        .args(["--device", img, "snaps/s*"])
        .output()
        .unwrap());
    for s in ["s1", "s2", "s3"] {
        let want = fs::read_to_string(fixture_dir(FIX).join(format!("{s}.manifest"))).unwrap();
        let got = manifest::manifest(&target.join(s), manifest::Options::default()).unwrap();
        let (want, got) = (manifest::strip_holes(&want), manifest::strip_holes(&got));
        let diff = manifest::diff(&want, &got, 20);
        assert!(diff.is_none(), "{s}: {}", diff.unwrap_or_default());
    }
}

#[test]
fn bad_rates_are_usage_errors() {
    for (rate, what) in [
        ("0", "more than 0"),
        ("10X", "invalid rate"),
        ("1.5M", "invalid rate"),
        ("", "invalid rate"),
    ] {
        for cmd in [
            &["send", "--limit-rate", rate, "snaps/s1"][..],
            &[
                "backup",
                "run",
                "--repo",
                "/nonexistent",
                "--limit-rate",
                rate,
                "s",
            ][..],
            &[
                "backup",
                "restore",
                "--repo",
                "/nonexistent",
                "--stdout",
                "--limit-rate",
                rate,
                "s",
            ][..],
        ] {
            let out = btrsend().args(cmd).output().unwrap();
            assert_eq!(out.status.code(), Some(2), "{cmd:?}: {}", stderr(&out));
            assert!(stderr(&out).contains(what), "{cmd:?}: {}", stderr(&out));
        }
    }
}
