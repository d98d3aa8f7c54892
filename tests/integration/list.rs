//! `list_subvolumes` against btrfs-progs: the stored
//! `subvol-list.txt` of every fixture (`btrfs subvolume list -a -p -u -q -R`
//! on the kernel mount), and a live filesystem made here when running as
//! root (nested subvolumes, a deleted one, a snapshot of the top level).

use std::path::Path;
use std::process::Command;

use btrsend::fs::Filesystem;
use btrsend::fs::subvol::{Subvolume, list_subvolumes};
use btrsend::types::Uuid;

use crate::common::shell;
use crate::reader::fixtures;

fn uuid_or_dash(u: &Uuid) -> String {
    if u.is_nil() {
        "-".to_owned()
    } else {
        u.to_string()
    }
}

/// Our subvolumes as `btrfs subvolume list -a -p -u -q -R` prints them from
/// the top-level mount: `-a` prefixes `<FS_TREE>/` to subvolumes whose
/// parent is not the top level.
fn as_progs(subvols: &[Subvolume]) -> Vec<String> {
    subvols
        .iter()
        .map(|s| {
            let path = String::from_utf8_lossy(&s.path);
            let path = if s.parent.get() == 5 { path.into_owned() } else { format!("<FS_TREE>/{path}") };
            format!(
                "ID {} gen {} parent {} top level {} parent_uuid {} received_uuid {} uuid {} path {}",
                s.id(),
                s.root.generation,
                s.parent,
                s.parent,
                uuid_or_dash(&s.root.parent_uuid),
                uuid_or_dash(&s.root.received_uuid),
                uuid_or_dash(&s.root.uuid),
                path
            )
        })
        .collect()
}

/// Progs' lines with the column padding collapsed.
fn normalise(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn list_matches_stored_subvol_list() {
    let mut compared = 0;
    for fx in fixtures() {
        let Ok(expected) = std::fs::read_to_string(fx.dir.join("subvol-list.txt")) else {
            continue;
        };
        let fs = Filesystem::open(&fx.devices).unwrap();
        let ours = list_subvolumes(&fs).unwrap();
        assert_eq!(as_progs(&ours), normalise(&expected), "{}", fx.name());
        compared += 1;
    }
    eprintln!("list: compared {compared} fixtures with their subvol-list.txt");
}

/// Unmounts (and so detaches the loop device of) a mount made here, also
/// when the test fails half-way.
struct Unmount(String);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// A filesystem made and read back here: nested subvolumes below
/// directories, a read-only snapshot, a snapshot of the top level, a deleted
/// subvolume (no backref: skipped), a received-uuid-less layout with
/// non-ASCII names — compared with `btrfs subvolume list` on the mount.
#[test]
fn list_matches_live_btrfs_subvolume_list() {
    if !is_root()
        || Command::new("mkfs.btrfs")
            .arg("--version")
            .output()
            .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "live list test must run in CI (root, btrfs-progs)"
        );
        eprintln!(
            "=== SKIPPED live test list_matches_live_btrfs_subvolume_list: needs root and btrfs-progs ==="
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("live.img");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let (img_s, mnt_s) = (img.display().to_string(), mnt.display().to_string());
    shell(&format!(
        "truncate -s 200M '{img_s}' && mkfs.btrfs -q -n 4096 '{img_s}' >/dev/null && mount -o loop '{img_s}' '{mnt_s}'"
    ));
    let mounted = Unmount(mnt_s.clone());
    let m = &mnt_s;
    shell(&format!(
        "cd '{m}'
         btrfs -q subvolume create a
         mkdir -p a/x/y 'dir é'
         btrfs -q subvolume create a/x/y/b
         btrfs -q subvolume create 'dir é/c'
         btrfs -q subvolume create a/x/y/b/d
         btrfs -q subvolume snapshot -r a snap-a
         btrfs -q subvolume create gone
         btrfs -q subvolume delete gone >/dev/null
         btrfs -q subvolume snapshot . top-snap
         sync"
    ));
    let listed = shell(&format!("btrfs subvolume list -a -p -u -q -R '{m}'"));
    drop(mounted);
    let fs = Filesystem::open(&[Path::new(&img)]).unwrap();
    let ours = list_subvolumes(&fs).unwrap();
    assert_eq!(as_progs(&ours), normalise(&listed));
    assert!(
        ours.iter()
            .any(|s| s.root.is_readonly() && s.path == b"snap-a")
    );
    assert!(ours.iter().any(|s| s.path == b"a/x/y/b/d"));
}
