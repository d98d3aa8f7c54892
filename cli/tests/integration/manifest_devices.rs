//! `btrsend manifest --device IMG SUBVOL` end to end: the manifest read
//! straight from a fixture image (no mount) equals the one the fixture
//! generator took from the kernel's mount of that snapshot; bad subvolume
//! names and bad images fail with `btrsend: error:` and exit code 1.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// Unpack the single device image of fixture `name` into `tmp`.
fn unpack(name: &str, tmp: &Path) -> Option<PathBuf> {
    let src = fixture_dir(name).join("dev1.img.zst");
    if !src.is_file() {
        eprintln!("=== SKIPPED: no fixture image {} ===", src.display());
        return None;
    }
    let dest = tmp.join(format!("{name}.img"));
    let mut out = fs::File::create(&dest).unwrap();
    zstd::stream::copy_decode(fs::File::open(&src).unwrap(), &mut out).unwrap();
    Some(dest)
}

fn manifest(args: &[&str], img: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_btrsend"))
        .arg("manifest")
        .arg("--device")
        .arg(img)
        .args(args)
        .output()
        .expect("run btrsend")
}

#[test]
fn manifests_from_images_equal_the_kernels() {
    let tmp = tempfile::tempdir().unwrap();
    let mut compared = 0;
    for (fixture, snaps) in [
        (
            "013-mixed-nested-subvols",
            &["n1", "nested1", "inner1", "n1-of-n1", "n2"][..],
        ),
        ("001-basic", &["basic"][..]),
    ] {
        let Some(img) = unpack(fixture, tmp.path()) else {
            continue;
        };
        for snap in snaps {
            let out = manifest(
                &["--holes", "--verify-data", &format!("snaps/{snap}")],
                &img,
            );
            assert!(
                out.status.success(),
                "{fixture} {snap}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let expected =
                fs::read_to_string(fixture_dir(fixture).join(format!("{snap}.manifest"))).unwrap();
            assert_eq!(
                String::from_utf8(out.stdout).unwrap(),
                expected,
                "{fixture} {snap}"
            );
            assert!(out.stderr.is_empty());
            compared += 1;
        }
        // `-o FILE` writes the same text.
        let file = tmp.path().join("out.manifest");
        let out = manifest(
            &[
                "--holes",
                "-o",
                file.to_str().unwrap(),
                &format!("snaps/{}", snaps[0]),
            ],
            &img,
        );
        assert!(out.status.success());
        assert_eq!(
            fs::read_to_string(&file).unwrap(),
            fs::read_to_string(fixture_dir(fixture).join(format!("{}.manifest", snaps[0])))
                .unwrap()
        );
    }
    eprintln!("{compared} manifests compared");
}

#[test]
fn unknown_subvolume_and_bad_image_fail_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let not_btrfs = tmp.path().join("zeros.img");
    fs::write(&not_btrfs, vec![0u8; 1 << 20]).unwrap();
    let out = manifest(&["."], &not_btrfs);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "btrsend: error: not a btrfs filesystem: {} (no btrfs superblock magic at physical 65536)\n",
            not_btrfs.display()
        )
    );
    let Some(img) = unpack("013-mixed-nested-subvols", tmp.path()) else {
        return;
    };
    let out = manifest(&["snaps/none"], &img);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "btrsend: error: no subvolume snaps/none in this filesystem\n"
    );
    // By id, as `send` names it (`id:N`, issue 28) and bare, and for the
    // top level.
    let n2 =
        fs::read_to_string(fixture_dir("013-mixed-nested-subvols").join("n2.manifest")).unwrap();
    for id in ["id:265", "265"] {
        let by_id = manifest(&["--holes", id], &img);
        assert!(
            by_id.status.success(),
            "{id}: {}",
            String::from_utf8_lossy(&by_id.stderr)
        );
        assert_eq!(String::from_utf8(by_id.stdout).unwrap(), n2, "{id}");
    }
    for top in [".", "id:5"] {
        let top = manifest(&[top], &img);
        assert!(top.status.success());
        assert!(
            String::from_utf8(top.stdout)
                .unwrap()
                .contains("\nsv-top subvol\n")
        );
    }
    for bad in ["id:99999", "id:x", "id:", "99999"] {
        let out = manifest(&[bad], &img);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!("btrsend: error: no subvolume {bad} in this filesystem\n")
        );
    }
}

/// Issue 28: `manifest --device` takes a subvolume in every form `send`
/// takes: the manifests of `id:N` and of its path are the kernel mount's.
#[test]
fn manifest_takes_the_forms_send_takes() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(img) = unpack("001-basic", tmp.path()) else {
        return;
    };
    let want = fs::read_to_string(fixture_dir("001-basic").join("basic.manifest")).unwrap();
    let listed = fs::read_to_string(fixture_dir("001-basic").join("subvol-list.txt")).unwrap();
    let id = listed
        .lines()
        .find(|l| l.ends_with(" path snaps/basic"))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("snaps/basic in the kernel's subvolume list");
    for given in [
        format!("id:{id}"),
        "snaps/basic".into(),
        "/snaps/basic".into(),
    ] {
        let out = manifest(&["--holes", &given], &img);
        assert!(
            out.status.success(),
            "{given}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8(out.stdout).unwrap(), want, "{given}");
        // `send` takes the same words.
        let out = Command::new(env!("CARGO_BIN_EXE_btrsend"))
            .args(["send", "--estimate", "--device"])
            .arg(&img)
            .arg(&given)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "send {given}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
