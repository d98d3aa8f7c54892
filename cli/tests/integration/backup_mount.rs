//! `backup mount`, judged by the kernel (live: needs root and /dev/fuse):
//! the fixture chains of `backup_browse` are imported into a directory
//! repository and an encrypted one on the S3 test server and mounted; the
//! manifest of every snapshot's root in the mount (`uuid/UUID`) must equal
//! the kernel's manifest of that snapshot, hard links must share their
//! inode number, the views by origin and by time must lead to the same
//! roots, writes must fail with EROFS, SIGINT and SIGTERM must unmount
//! and exit 0, and a damaged index page must give EIO, not data.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use btrsend::manifest::{self, Options};
use btrsend::testing::FixtureMeta;

use crate::backup_browse::{CHAINS, Repo, each_damaged_page, imported, ok};
use crate::common::fixture_dir;
use crate::repo_store::{Backend, Kind};

const EROFS: i32 = 30;
const EIO: i32 = 5;

/// Whether this machine can mount FUSE (skipped loudly, failed in CI).
fn live(test: &str) -> bool {
    if !btrsend::testing::require_live(test) {
        return false;
    }
    if !Path::new("/dev/fuse").exists() {
        btrsend::testing::skip_or_fail(test, "needs /dev/fuse");
        return false;
    }
    true
}

fn mounted(mp: &Path) -> bool {
    let mp = mp.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(mp))
}

/// A running `backup mount`: unmounted and reaped on drop, whatever the
/// test did, so a failing test leaves no mount behind.
pub(crate) struct Mounted {
    child: Option<Child>,
    pub(crate) mp: PathBuf,
    stderr: PathBuf,
}

impl Mounted {
    fn new(repo: &Repo, mp: &Path, log: &Path) -> Mounted {
        Mounted::spawn(mp, log, |mp| repo.command(&["mount", mp.to_str().unwrap()]))
    }

    /// Run `command(MP)` (a `backup mount` at `mp`, made absolute) with
    /// its stderr in `log`, and wait until `mp` is mounted.
    pub(crate) fn spawn(
        mp: &Path,
        log: &Path,
        command: impl FnOnce(&Path) -> std::process::Command,
    ) -> Mounted {
        std::fs::create_dir_all(mp).unwrap();
        let mp = std::fs::canonicalize(mp).unwrap();
        let child = command(&mp)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        let mut m = Mounted {
            child: Some(child),
            mp,
            stderr: log.to_path_buf(),
        };
        let t = Instant::now();
        while !mounted(&m.mp) {
            if let Some(st) = m.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("backup mount exited with {st}: {}", m.log());
            }
            assert!(t.elapsed() < Duration::from_secs(30), "not mounted in 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGINT or SIGTERM: unmounts, exits 0.
    pub(crate) fn interrupt(&mut self, sig: rustix::process::Signal) {
        let mut child = self.child.take().unwrap();
        let pid = rustix::process::Pid::from_child(&child);
        rustix::process::kill_process(pid, sig).unwrap();
        // Never wait forever: a mount that stays busy asks for a second
        // interrupt, and the test must then fail, not hang.
        let t = Instant::now();
        let st = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if t.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("not exited 60 s after {sig:?}: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(st.success(), "after {sig:?}: {st}: {}", self.log());
        assert!(!mounted(&self.mp), "still mounted after {sig:?}");
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if mounted(&self.mp) {
            let _ = rustix::mount::unmount(&self.mp, rustix::mount::UnmountFlags::DETACH);
        }
        if let Some(mut c) = self.child.take() {
            let t = Instant::now();
            while c.try_wait().ok().flatten().is_none() && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The root a link of the views leads to, as `uuid/NAME`.
fn uuid_of(link: &Path) -> String {
    let target = std::fs::read_link(link).unwrap();
    let t = target.to_str().unwrap();
    let name = t.rsplit_once("uuid/").unwrap().1;
    assert!(!name.contains('/'), "{t}");
    name.to_owned()
}

fn mount_case(kind: Kind, encryption: &str, test: &str) {
    if !live(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(repo) = imported(kind, encryption, test, dir.path()) else {
        return;
    };
    ok(&repo.backup(&["index"]));
    let mut m = Mounted::new(
        &repo,
        &dir.path().join("mnt"),
        &dir.path().join("mount.log"),
    );
    let mp = m.mp.clone();
    let top: BTreeSet<String> = std::fs::read_dir(&mp)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(top, ["snapshots", "time", "uuid"].map(String::from).into());
    // `import` names each snapshot after its subvolume, origin "imported".
    let by_name = mp.join("snapshots/imported");
    let mut roots = BTreeSet::new();
    for (fx, streams) in CHAINS {
        let meta = FixtureMeta::load(&fixture_dir(fx)).unwrap();
        for (_, snap) in *streams {
            let uuid = uuid_of(&by_name.join(snap));
            let root = mp.join("uuid").join(&uuid);
            roots.insert(uuid.clone());
            assert_eq!(
                std::fs::metadata(by_name.join(snap)).unwrap().ino(),
                std::fs::metadata(&root).unwrap().ino()
            );
            let want = manifest::strip_holes(&meta.manifest(snap).unwrap());
            let got = manifest::manifest(&root, Options::default()).unwrap();
            if let Some(d) = manifest::diff(&want, &got, 20) {
                panic!("{fx} {snap} ({encryption}, {kind:?}): mount differs from the kernel:\n{d}");
            }
            // Every name of a hard link has one inode number.
            let mut groups: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
            for line in want.lines().skip(1) {
                let path = line.split(' ').next().unwrap();
                if let Some(link) = line.split(' ').find_map(|f| f.strip_prefix("link=")) {
                    let ino = std::fs::symlink_metadata(root.join(path)).unwrap().ino();
                    groups.entry(link).or_default().insert(ino);
                }
            }
            assert!(
                groups.values().all(|s| s.len() == 1),
                "{fx} {snap}: {groups:?}"
            );
            if *fx == "008-hardlinks-xattrs" {
                assert!(!groups.is_empty(), "{fx} has hard links");
            }
        }
    }
    // uuid/ holds exactly the snapshots, and time/ leads to each of them.
    let listed: BTreeSet<String> = std::fs::read_dir(mp.join("uuid"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(listed, roots);
    let timed: BTreeSet<String> = std::fs::read_dir(mp.join("time"))
        .unwrap()
        .map(|e| uuid_of(&e.unwrap().path()))
        .collect();
    assert_eq!(timed, roots);
    // Read-only: create, write, unlink, mkdir.
    let root = mp.join("uuid").join(roots.first().unwrap());
    let file = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.symlink_metadata().unwrap().is_file());
    let errs = [
        std::fs::write(root.join("new-file"), b"x").unwrap_err(),
        std::fs::create_dir(root.join("new-dir")).unwrap_err(),
        std::fs::create_dir(mp.join("uuid/new-dir")).unwrap_err(),
    ];
    for e in errs {
        assert_eq!(e.raw_os_error(), Some(EROFS), "{e}");
    }
    if let Some(f) = file {
        for e in [
            std::fs::OpenOptions::new()
                .write(true)
                .open(&f)
                .unwrap_err(),
            std::fs::remove_file(&f).unwrap_err(),
        ] {
            assert_eq!(e.raw_os_error(), Some(EROFS), "{e}");
        }
    }
    m.interrupt(if kind == Kind::S3 {
        rustix::process::Signal::TERM
    } else {
        rustix::process::Signal::INT
    });
}

#[test]
fn mount_shows_the_kernels_snapshots_from_a_directory() {
    mount_case(
        Kind::Dir,
        "none",
        "mount_shows_the_kernels_snapshots_from_a_directory",
    );
}

#[test]
fn mount_shows_the_kernels_snapshots_encrypted_on_s3() {
    mount_case(
        Kind::S3,
        "passphrase",
        "mount_shows_the_kernels_snapshots_encrypted_on_s3",
    );
}

#[test]
fn mount_shows_the_kernels_snapshots_over_ssh() {
    mount_case(
        Kind::Ssh,
        "none",
        "mount_shows_the_kernels_snapshots_over_ssh",
    );
}

#[test]
fn mount_gives_eio_for_a_damaged_index_page() {
    const TEST: &str = "mount_gives_eio_for_a_damaged_index_page";
    if !live(TEST) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let be = Backend::new(Kind::Dir, TEST, dir.path()).unwrap();
    let r = be.repo("repo");
    let repo = Repo {
        spec: r.spec.clone(),
        files: r.files.clone(),
        be,
        password: false,
    };
    ok(&repo.backup(&["init", "--encryption", "none"]));
    let (fx, streams) = CHAINS[0];
    let path = fixture_dir(fx).join(streams[0].0);
    ok(&repo.backup(&["import", path.to_str().unwrap()]));
    ok(&repo.backup(&["index"]));
    let log = dir.path().join("mount.log");
    each_damaged_page(&repo, &mut |pack, _| {
        let m = Mounted::new(&repo, &dir.path().join("mnt"), &log);
        let root = std::fs::read_dir(m.mp.join("uuid"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let err = manifest::manifest(&root, Options::default()).unwrap_err();
        let io = std::error::Error::source(&err)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .unwrap_or_else(|| panic!("{}: not an I/O error: {err}", pack.display()));
        assert_eq!(io.raw_os_error(), Some(EIO), "{}: {err}", pack.display());
        drop(m);
        assert!(
            std::fs::read_to_string(&log)
                .unwrap()
                .contains("index page"),
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
    });
    let m = Mounted::new(&repo, &dir.path().join("mnt"), &log);
    let meta = FixtureMeta::load(&fixture_dir(fx)).unwrap();
    let uuid = uuid_of(&m.mp.join("snapshots/imported").join(streams[0].1));
    let got = manifest::manifest(&m.mp.join("uuid").join(uuid), Options::default()).unwrap();
    assert_eq!(
        got,
        manifest::strip_holes(&meta.manifest(streams[0].1).unwrap())
    );
}
