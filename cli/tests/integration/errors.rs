//! Error texts end to end (issue 15): printed once as `btrsend: error: …`,
//! each cause once, saying what and where.

use std::fs;
use std::process::Command;

use crate::common::{btrsend, unpack};

fn stderr_of(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let out = btrsend().args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn missing_device_prints_the_os_error_once() {
    let (ok, err) = stderr_of(&[
        "list".as_ref(),
        "--device".as_ref(),
        "/nonexistent/btrsend.img".as_ref(),
    ]);
    assert!(!ok);
    assert_eq!(
        err,
        "btrsend: error: cannot open /nonexistent/btrsend.img: No such file or directory (os error 2)\n"
    );
}

#[test]
fn a_file_that_is_not_btrfs_is_called_so() {
    let tmp = tempfile::tempdir().unwrap();
    let short = tmp.path().join("short.img");
    fs::write(&short, vec![0u8; 1000]).unwrap();
    let (ok, err) = stderr_of(&["list".as_ref(), "--device".as_ref(), short.as_os_str()]);
    assert!(!ok);
    assert_eq!(
        err,
        format!(
            "btrsend: error: not a btrfs filesystem: {} (1000 bytes, too short to hold a \
             superblock: the primary copy ends at byte 69632)\n",
            short.display()
        )
    );
    let zeros = tmp.path().join("zeros.img");
    fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    let (ok, err) = stderr_of(&[
        "send".as_ref(),
        "--device".as_ref(),
        zeros.as_os_str(),
        "-f".as_ref(),
        tmp.path().join("s").as_os_str(),
        "snap".as_ref(),
    ]);
    assert!(!ok);
    assert_eq!(
        err,
        format!(
            "btrsend: error: not a btrfs filesystem: {} (no btrfs superblock magic at physical \
             65536)\n",
            zeros.display()
        )
    );
}

/// ENOSPC on `send -f`: once (it was printed three times).
#[test]
fn send_to_a_full_disk_prints_enospc_once() {
    if !btrsend::testing::require_live("send_to_a_full_disk_prints_enospc_once") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = unpack(tmp.path(), "001-basic", "dev1.img");
    let t = btrsend::testing::Tmpfs::new(100 << 10).unwrap();
    let (ok, err) = stderr_of(&[
        "send".as_ref(),
        "--device".as_ref(),
        img.as_os_str(),
        "-f".as_ref(),
        t.path().join("s").as_os_str(),
        "snaps/basic".as_ref(),
    ]);
    assert!(!ok);
    assert_eq!(err.matches("No space left on device").count(), 1, "{err}");
    assert!(err.starts_with("btrsend: error: "), "{err}");
    assert!(
        err.ends_with(": No space left on device (os error 28)\n"),
        "{err}"
    );
}

/// A permission error on a block device says what is needed.
#[test]
fn unreadable_block_device_says_root_or_the_disk_group() {
    let is_root = rustix_like_is_root();
    let have_setpriv = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let disk = fs::read_to_string("/etc/group").ok().and_then(|t| {
        t.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&"disk")).then(|| f.get(2)?.parse::<u32>().ok())?
        })
    });
    let (true, true, Some(disk)) = (is_root, have_setpriv, disk) else {
        btrsend::testing::skip_or_fail(
            "unreadable_block_device_says_root_or_the_disk_group",
            "needs root, setpriv and a group disk",
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let node = tmp.path().join("loop200");
    // Loop device 7:200, mode 0660 root:disk; never opened by anyone here.
    let st = Command::new("mknod")
        .args(["-m", "0660"])
        .arg(&node)
        .args(["b", "7", "200"])
        .status()
        .unwrap();
    assert!(st.success());
    std::os::unix::fs::chown(&node, None, Some(disk)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_btrsend"))
        .args(["list", "--device"])
        .arg(&node)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "btrsend: error: cannot open {}: Permission denied (os error 13): reading a block \
             device needs root, or read access to the device: membership in its group `disk` \
             (e.g. `usermod -aG disk USER`, then log in again)\n",
            node.display()
        )
    );
}

fn rustix_like_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n")
}

/// Issue 15: options that conflict, or an argument the other options make
/// invalid, are usage errors in every subcommand: exit status 2 (clap's
/// own code), nothing read or written. Clap's conflicts print clap's
/// message; the ones btrsend finds print `btrsend: error: …` once (and as
/// a JSON error line with --json).
#[test]
fn conflicting_or_invalid_options_exit_2_in_every_subcommand() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let stream = tmp.path().join("s");
    fs::write(&stream, b"").unwrap();
    let stream = stream.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        // Clap's conflicts.
        (
            &["send", "-q", "-v", "--device", "x", "a"],
            "error: the argument '--quiet' cannot be used with '--verbose...'",
        ),
        (
            &["receive", "-q", "-v", dir],
            "error: the argument '--quiet' cannot be used with '--verbose...'",
        ),
        (
            &["receive", "--dump", "-f", stream, dir],
            "error: the argument '--dump' cannot be used with '[DIR]'",
        ),
        (
            &["receive", "--dump", "--directories", "-f", stream],
            "error: the argument '--dump' cannot be used with '--directories'",
        ),
        (
            &["receive", "--dump", "-E", "3", "-f", stream],
            "error: the argument '--dump' cannot be used with '--max-errors <N>'",
        ),
        (
            &["manifest", "--verify-data", dir],
            "error: the following required arguments were not provided:\n  --device <PATH>",
        ),
        (
            &["manifest", "--degraded", dir],
            "error: the following required arguments were not provided:\n  --device <PATH>",
        ),
        (
            &[
                "backup", "restore", "--repo", dir, "--to", dir, "--stdout", "x",
            ],
            "error: the argument '--to <DIR>' cannot be used with '--stdout'",
        ),
        (
            &["send", "--proto", "9", "--device", "x", "a"],
            "error: invalid value '9' for '--proto <N>'",
        ),
        // Found by btrsend.
        (
            &[
                "send",
                "--proto",
                "1",
                "--compressed-data",
                "--device",
                "x",
                "a",
            ],
            "btrsend: error: --compressed-data needs protocol 2 or later (--proto 1 given)\n",
        ),
        (
            &["send", "id:257"],
            "btrsend: error: id:257 needs --device: without it SUBVOL is a path in a mounted btrfs\n",
        ),
        (
            &["backup", "list"],
            "btrsend: error: no repository given: use --repo REPO or set BTRSEND_REPOSITORY\n",
        ),
        (
            &["backup", "run", "--json", "x"],
            "{\"exit_code\":2,\"message\":\"no repository given: use --repo REPO or set BTRSEND_REPOSITORY\",\"message_type\":\"error\"}\n",
        ),
        (
            &["backup", "forget", "--repo", dir],
            "btrsend: error: refusing an empty policy, which would delete every backup: give at least one --keep-* option\n",
        ),
    ];
    for (args, want) in cases {
        let out = btrsend()
            .args(*args)
            .env_remove("BTRSEND_REPOSITORY")
            .stdout(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        if want.starts_with("error: ") {
            assert!(err.starts_with(want), "{args:?}: {err}");
        } else {
            assert_eq!(err, *want, "{args:?}");
        }
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // Nothing was written into the directory.
    assert_eq!(
        fs::read_dir(tmp.path()).unwrap().count(),
        1,
        "only the stream"
    );
}
