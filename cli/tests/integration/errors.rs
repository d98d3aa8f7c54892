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
