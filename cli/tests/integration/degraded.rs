//! Issue 15: a filesystem with a missing device is read only with
//! `--degraded`, as the kernel mounts it only with `-o degraded`. On a
//! two-device RAID1 made and filled by the kernel (live: root, loop
//! devices), each device given alone: without `--degraded`, `send` and
//! `list` fail naming the other device's devid and uuid (as `btrfs
//! inspect-internal dump-super` prints them) and the option; with it, the
//! send (a warning names the missing device) is received by the stock
//! `btrfs receive` into a subvolume whose manifest is the kernel mount's
//! of the original snapshot — from either mirror. The config file's job
//! key `degraded` does the same for `backup run --config`.

use std::path::{Path, PathBuf};
use std::process::Command;

use btrsend::manifest::{self, Options};
use btrsend::testing::{self, LiveBtrfs};

use crate::common::btrsend;
use crate::common::{Mount, sh, stderr};

/// Detaches a loop device on drop.
struct Loop(PathBuf);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

/// `dev_item.devid` and `dev_item.uuid` of the device, as btrfs-progs
/// prints them.
fn dev_item(img: &Path) -> (String, String) {
    let out = sh(Command::new("btrfs")
        .args(["inspect-internal", "dump-super"])
        .arg(img));
    let text = String::from_utf8(out.stdout).unwrap();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("no {name} in dump-super"))
    };
    (field("dev_item.devid"), field("dev_item.uuid"))
}

#[test]
fn missing_device_needs_degraded() {
    if !testing::require_live("missing_device_needs_degraded") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let imgs: Vec<PathBuf> = (1..=2)
        .map(|i| {
            let img = tmp.path().join(format!("dev{i}.img"));
            std::fs::File::create(&img)
                .unwrap()
                .set_len(512 << 20)
                .unwrap();
            img
        })
        .collect();
    let manifest_want;
    {
        let loops: Vec<Loop> = imgs
            .iter()
            .map(|img| {
                let o = sh(Command::new("losetup").args(["-f", "--show"]).arg(img));
                Loop(PathBuf::from(String::from_utf8(o.stdout).unwrap().trim()))
            })
            .collect();
        sh(Command::new("mkfs.btrfs")
            .args(["-q", "-f", "-d", "raid1", "-m", "raid1"])
            .arg(&loops[0].0)
            .arg(&loops[1].0));
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
        let m = mnt.display();
        sh(Command::new("sh").arg("-c").arg(format!(
            "cd {m} && btrfs -q subvolume create sv && head -c 3000000 /dev/urandom > sv/big && \
             mkdir -p sv/d/e && echo small > sv/d/e/f && ln sv/big sv/d/link && \
             ln -s ../big sv/d/sym && truncate -s 10M sv/sparse && \
             head -c 70000 /dev/urandom | dd of=sv/sparse bs=4096 seek=700 conv=notrunc status=none && \
             btrfs -q subvolume snapshot -r sv snap && sync"
        )));
        manifest_want = manifest::manifest(&mnt.join("snap"), Options::default()).unwrap();
        drop(guard);
    }
    let ids = [dev_item(&imgs[0]), dev_item(&imgs[1])];
    let target = LiveBtrfs::new().expect("live btrfs");
    for (alone, other) in [(0, 1), (1, 0)] {
        let img = &imgs[alone];
        let (devid, uuid) = &ids[other];
        let want = format!(
            "missing device: devid {devid} uuid {uuid} was not given; give every device of the \
             filesystem, or read it degraded from the remaining copies with --degraded (as \
             mounting needs -o degraded)"
        );
        // Without --degraded: refused, naming the device and the option;
        // nothing written.
        let file = tmp.path().join(format!("alone{alone}.stream"));
        for args in [
            &["send", "-f", file.to_str().unwrap(), "--device"][..],
            &["list", "--device"],
        ] {
            let mut cmd = btrsend();
            cmd.args(args).arg(img);
            if args[0] == "send" {
                cmd.arg("snap");
            }
            let o = cmd.output().unwrap();
            assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
            assert_eq!(stderr(&o), format!("btrsend: error: {want}\n"), "{args:?}");
            assert!(!file.exists());
        }
        // With it: a warning names the missing device; the stock receiver
        // rebuilds the snapshot as the kernel had it.
        let o = btrsend()
            .args(["send", "--degraded", "-f"])
            .arg(&file)
            .arg("--device")
            .arg(img)
            .arg("snap")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(
            stderr(&o),
            format!(
                "btrsend: warning: missing device: devid {devid} uuid {uuid} (reading from the \
                 remaining copies)\n"
            )
        );
        let dest = format!("from{alone}");
        target.receive(&dest, &[&file]).expect("btrfs receive");
        let got = target
            .manifest(&format!("{dest}/snap"), Options::default())
            .unwrap();
        assert_eq!(
            got,
            manifest_want,
            "received from device {} alone",
            alone + 1
        );
        let o = btrsend()
            .args(["list", "--degraded", "--device"])
            .arg(img)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("snap\n"));
    }

    // The job key degraded = true of a config file does what the option
    // does: without it the job's run fails naming the option; with it,
    // the stored snapshot restores to the kernel mount's manifest.
    let repo = tmp.path().join("repo");
    let repo = repo.to_str().unwrap();
    let o = btrsend()
        .args(["backup", "init", "--encryption", "none", "--repo", repo])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let config = tmp.path().join("btrsend.toml");
    let run = |degraded: bool| {
        std::fs::write(
            &config,
            format!(
                "[job.alone]\ndevice = \"{}\"\nsnapshots = [\"snap\"]\ndegraded = {degraded}\n\
                 [[job.alone.destination]]\nrepo = \"{repo}\"\n",
                imgs[0].display()
            ),
        )
        .unwrap();
        btrsend()
            .args(["backup", "run", "--config"])
            .arg(&config)
            .output()
            .unwrap()
    };
    let o = run(false);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--degraded"), "{}", stderr(&o));
    let o = run(true);
    assert!(o.status.success(), "{}", stderr(&o));
    let stream = tmp.path().join("restored.stream");
    let o = btrsend()
        .args(["backup", "restore", "--stdout", "--repo", repo, "snap"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(&stream, &o.stdout).unwrap();
    target
        .receive("from-config", &[&stream])
        .expect("btrfs receive");
    let got = target
        .manifest("from-config/snap", Options::default())
        .unwrap();
    assert_eq!(got, manifest_want, "stored by the config's job");
}
