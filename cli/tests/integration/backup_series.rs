//! A series of snapshots with seeded random changes (the project's random
//! workload, `btrsend::testing::workload`), on a loop-mounted btrfs (root;
//! see `btrsend::testing` for the skip/fail policy), backed up by `backup
//! run` from the image in two runs (`--full-every 5`: two chains, one
//! incremental across the runs), into a directory encrypted for an age
//! recipient, onto S3 encrypted with a passphrase, and into a plain
//! directory. Every check is judged by the kernel's mount of each snapshot
//! (its manifest), still mounted while the checks run:
//!
//! * a re-run stores nothing; `verify --read-data` finds nothing;
//! * restores (encrypted repositories): every snapshot is restored twice,
//!   `restore --to` into a tmpfs (btrsend's receiver) and `restore --stdout
//!   | btrfs receive` (the kernel's), and each copy must have the manifest
//!   of the kernel's mount. Exempt, as in `send_random`: hole maps (not
//!   compared), and the mtime of directories in which the restored chain
//!   creates orphans without sending their UTIMES
//!   (`orphan_dirs_without_utimes`): a receiver's mkfile touches them, the
//!   sender's did not;
//! * browsing, from the index `backup run` builds: `ls -R --json` gives the
//!   manifest's fields, `dump` of a seeded sample of regular files their
//!   content hash, `diff --json` of consecutive snapshots the difference of
//!   their manifests, `restore --include` of a seeded directory of each
//!   snapshot that part of its manifest, `find --json` of a name planted
//!   in some snapshots exactly those snapshots, and the FUSE `backup
//!   mount` (needs /dev/fuse) every snapshot's manifest. The index applies
//!   each stream's commands to a model and takes mtimes from its UTIMES,
//!   touching no directory: nothing is exempt there but hole maps.
//!
//! The encrypted repositories (issue 31): the directory for an age
//! recipient made by `age-keygen` (the runs hold only the write key, the
//! reads the identity), the S3 one with a passphrase. A file name, its
//! contents and an xattr value planted in the first snapshot appear in no
//! object of them, read raw or through `zstd -dc`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use btrsend::manifest::{self, Options, content_hash_of};
use btrsend::testing::workload::{Rng, Workload};
use btrsend::testing::{self, LiveBtrfs, Tmpfs};

use crate::backup_browse::{expected_lines, listed_lines};
use crate::backup_mount::Mounted;
use crate::backup_query::{diff_lines, diff_of_json, manifest_diff, subtree_lines, within};
use crate::common::{self, json_lines, sh};
use crate::repo_store::{Backend, Kind, TestRepo};

/// Snapshots in the series.
const SNAPSHOTS: usize = 10;
/// Random operations that make the first tree.
const POPULATE: usize = 200;
/// Random operations between two snapshots.
const OPS: usize = 100;
/// What the first snapshot holds and no repository object may show.
const CANARIES: [&str; 3] = [
    "canary-name-7f3e",
    "canary-content-91ab",
    "canary-xattr-55c2",
];
/// A name at the volume's root in some snapshots only, for `find`.
const PLANTED: &str = "planted-4d1c";
/// Before which snapshot the planted file is made (true) or deleted
/// (false), after that step's random operations (which may rename or
/// replace it too: the kernel's manifests say where it is).
const PLANTS: [(usize, bool); 3] = [(3, true), (6, false), (8, true)];
/// Regular files `dump` reads per snapshot: a seeded sample of this many,
/// or all.
const DUMPS: usize = 200;

/// How a series' repository is encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encryption {
    /// For an age recipient; reads take the identity.
    Recipient,
    /// With a passphrase.
    Passphrase,
    /// Not at all.
    None,
}

/// The checks of a case, each judged by the kernel's manifests; one
/// failing names the seed and the snapshot.
type Check = (&'static str, fn(&Series));

/// Every check: restores, then what reads the index.
const ALL: &[Check] = &[
    ("restore", check_restores),
    ("ls and dump", check_ls_and_dump),
    ("restore --include", check_restore_include),
    ("diff", check_diff),
    ("find", check_find),
    ("mount", check_mount),
];

/// The index checks only: what a restore reads does not depend on the
/// encryption, which the other cases cover.
const BROWSE: &[Check] = &[
    ("ls and dump", check_ls_and_dump),
    ("restore --include", check_restore_include),
    ("diff", check_diff),
    ("find", check_find),
    ("mount", check_mount),
];

/// Cases from one body: `NAME::dir` (age recipient), `NAME::s3`
/// (passphrase) and `NAME::plain` (a directory, unencrypted), with
/// different seeds.
macro_rules! cases {
    ($name:ident, $body:ident) => {
        mod $name {
            use super::{ALL, BROWSE, Encryption, Kind};
            #[test]
            fn dir() {
                super::$body(
                    Kind::Dir,
                    Encryption::Recipient,
                    concat!(stringify!($name), "::dir"),
                    0x5e71e5,
                    ALL,
                );
            }
            #[test]
            fn s3() {
                super::$body(
                    Kind::S3,
                    Encryption::Passphrase,
                    concat!(stringify!($name), "::s3"),
                    0x5e71e6,
                    ALL,
                );
            }
            #[test]
            fn plain() {
                super::$body(
                    Kind::Dir,
                    Encryption::None,
                    concat!(stringify!($name), "::plain"),
                    0x5e71e7,
                    BROWSE,
                );
            }
        }
    };
}

cases!(random_series_matches_the_kernel, series_case);
fn series_case(kind: Kind, enc: Encryption, test: &'static str, seed: u64, checks: &[Check]) {
    if !testing::require_live(test) {
        return;
    }
    let t = Instant::now();
    let Some(s) = Series::new(kind, enc, test, seed) else {
        return;
    };
    eprintln!("{test}: series made and backed up in {:?}", t.elapsed());
    for (what, check) in checks {
        let t = Instant::now();
        check(&s);
        eprintln!("{test}: {what}: passed in {:?}", t.elapsed());
    }
}

/// One snapshot of the series, as the kernel has it.
struct Snap {
    /// Its path on the filesystem, as `backup run` stores it and the
    /// commands take it: `snaps/vol.I`.
    path: String,
    /// The kernel's uuid of it.
    uuid: String,
    /// The manifest of the kernel's mount of it (no hole maps).
    manifest: String,
}

/// A series on a loop-mounted btrfs, backed up into a repository; the
/// snapshots stay mounted while it lives. Fields drop in order: the
/// filesystem, the S3 server, then the directory holding both.
struct Series {
    test: &'static str,
    seed: u64,
    kind: Kind,
    live: LiveBtrfs,
    be: Backend,
    repo: TestRepo,
    /// The HOME of every command (the runs' write key lies under it).
    home: PathBuf,
    /// The environment of every command.
    env: Vec<(&'static str, String)>,
    /// The environment of every command but `run` (the identity).
    reader_env: Vec<(&'static str, String)>,
    /// The workload's operations, for failure messages.
    log: Vec<String>,
    snaps: Vec<Snap>,
    dir: tempfile::TempDir,
}

impl Series {
    /// Make the series, back it up and check the backups' bookkeeping;
    /// `None` when the S3 server is not available here.
    fn new(kind: Kind, enc: Encryption, test: &'static str, seed: u64) -> Option<Series> {
        let dir = tempfile::tempdir().unwrap();
        let be = Backend::new(kind, test, dir.path())?;
        let repo = be.repo("repo");
        // The keys: the write key goes under this HOME; reads take the
        // identity (recipient) or the passphrase from the environment.
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        let mut init: Vec<String> = ["init", "--repo", &repo.spec, "--encryption"]
            .map(String::from)
            .into();
        let mut env = vec![("BTRSEND_SCRYPT_LOG_N", String::from("10"))];
        let mut reader_env = Vec::new();
        match enc {
            Encryption::Recipient => {
                let (identity, recipient) = common::keygen(dir.path(), "identity.txt");
                init.extend(["recipients", "--recipient", &recipient].map(String::from));
                reader_env.push((
                    "BTRSEND_IDENTITY_FILE",
                    identity.to_str().unwrap().to_owned(),
                ));
            }
            Encryption::Passphrase => {
                init.push("passphrase".into());
                env.push(("BTRSEND_PASSWORD", String::from("series passphrase")));
            }
            Encryption::None => init.push("none".into()),
        }
        let live = LiveBtrfs::new().unwrap();
        let mut s = Series {
            test,
            seed,
            kind,
            live,
            be,
            repo,
            home,
            env,
            reader_env,
            log: Vec::new(),
            snaps: Vec::new(),
            dir,
        };
        s.make_snapshots();
        let init: Vec<&str> = init.iter().map(String::as_str).collect();
        s.ok(&init);
        s.back_up();
        if enc != Encryption::None {
            no_canary(&s.repo.files);
        }
        Some(s)
    }

    /// Populate a subvolume and take [`SNAPSHOTS`] read-only snapshots of
    /// it, with random operations between them, the canaries in the first
    /// and [`PLANTED`] in some; then record what the kernel has.
    fn make_snapshots(&mut self) {
        let seed = self.seed;
        let mnt = self.live.path().to_path_buf();
        let vol = mnt.join("vol");
        std::fs::create_dir(mnt.join("snaps")).unwrap();
        sh(Command::new("btrfs")
            .args(["-q", "subvolume", "create"])
            .arg(&vol));
        let canary = vol.join(CANARIES[0]);
        std::fs::write(&canary, CANARIES[1].repeat(5000)).unwrap();
        sh(Command::new("setfattr")
            .args(["-n", "user.c", "-v", CANARIES[2]])
            .arg(&canary));
        let mut w = Workload::new(&vol, seed);
        for i in 0..SNAPSHOTS {
            let step = if i == 0 {
                w.populate(POPULATE)
            } else {
                w.run(OPS)
            };
            step.unwrap_or_else(|e| panic!("seed {seed}: workload: {e}\n{}", w.log().join("\n")));
            for (_, make) in PLANTS.iter().filter(|(at, _)| *at == i) {
                let planted = vol.join(PLANTED);
                if *make {
                    std::fs::write(&planted, format!("planted before snapshot {i}")).unwrap();
                    w.note(format!("make {PLANTED}"));
                } else if planted.symlink_metadata().is_ok() {
                    // Whatever took the name (the workload renames over
                    // names of the same kind: a file).
                    std::fs::remove_file(&planted).unwrap();
                    w.note(format!("delete {PLANTED}"));
                }
            }
            sh(Command::new("btrfs")
                .args(["-q", "subvolume", "snapshot", "-r"])
                .arg(&vol)
                .arg(mnt.join(format!("snaps/vol.{i}"))));
        }
        // The snapshots are committed; flush this filesystem for the image
        // reader.
        sh(Command::new("sync").arg("-f").arg(&mnt));
        self.log = w.log().to_vec();
        for i in 0..SNAPSHOTS {
            let path = format!("snaps/vol.{i}");
            self.snaps.push(Snap {
                uuid: common::subvolume_show(&mnt.join(&path), "UUID"),
                manifest: self.live.manifest(&path, Options::default()).unwrap(),
                path,
            });
        }
    }

    /// `backup run` in two runs and a third that stores nothing; the
    /// chains' kinds and uuids as `list` gives them; `verify --read-data`.
    fn back_up(&self) {
        let img = self.live.image().to_str().unwrap().to_owned();
        let run = |glob: &str| -> serde_json::Value {
            let out = self.ok(&[
                "run",
                "--repo",
                &self.repo.spec,
                "--device",
                &img,
                "--full-every",
                "5",
                "--json",
                glob,
            ]);
            let text = String::from_utf8(out).unwrap();
            serde_json::from_str(text.lines().last().unwrap()).unwrap()
        };
        let first = run("snaps/vol.[0-3]");
        assert_eq!(first["stored"], 4, "{first}");
        let second = run("snaps/vol.*");
        assert_eq!(
            (&second["stored"], &second["already_stored"]),
            (&6.into(), &4.into()),
            "{second}"
        );
        let again = run("snaps/vol.*");
        assert_eq!(
            (&again["stored"], &again["already_stored"]),
            (&0.into(), &10.into()),
            "a re-run stores nothing: {again}"
        );
        let list: serde_json::Value =
            serde_json::from_slice(&self.ok(&["list", "--repo", &self.repo.spec, "--json"]))
                .unwrap();
        let entries = list.as_array().unwrap();
        let kinds: Vec<&str> = entries
            .iter()
            .map(|e| e["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "full",
                "incremental",
                "incremental",
                "incremental",
                "incremental",
                "full",
                "incremental",
                "incremental",
                "incremental",
                "incremental"
            ]
        );
        let stored: Vec<(&str, &str)> = entries
            .iter()
            .map(|e| (e["path"].as_str().unwrap(), e["uuid"].as_str().unwrap()))
            .collect();
        let kernel: Vec<(&str, &str)> = self
            .snaps
            .iter()
            .map(|s| (s.path.as_str(), s.uuid.as_str()))
            .collect();
        assert_eq!(stored, kernel);
        self.ok(&["verify", "--read-data", "--repo", &self.repo.spec]);
    }

    /// `btrsend backup ARGS` with this series' server, HOME and keys.
    fn command(&self, args: &[&str]) -> Command {
        let mut c = common::btrsend();
        self.be
            .apply(&mut c)
            .env("HOME", &self.home)
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("BTRSEND_IDENTITY_FILE")
            .env_remove("BTRSEND_PASSWORD")
            .env_remove("BTRSEND_PASSWORD_FILE")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        // The nightly job holds no identity.
        if args.first() != Some(&"run") {
            c.envs(self.reader_env.iter().map(|(k, v)| (k, v)));
        }
        c.arg("backup").args(args);
        c
    }

    fn backup(&self, args: &[&str]) -> Output {
        self.command(args).stdin(Stdio::null()).output().unwrap()
    }

    /// The stdout of a `backup ARGS` that must succeed.
    fn ok(&self, args: &[&str]) -> Vec<u8> {
        let o = self.backup(args);
        assert!(
            o.status.success(),
            "{}: backup {args:?}: exit {:?}: {}",
            self.test,
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        );
        o.stdout
    }

    /// The stdout of `backup SUB --repo REPO ARGS` that must succeed, as
    /// text.
    fn query(&self, sub: &str, args: &[&str]) -> String {
        let mut all = vec![sub, "--repo", &self.repo.spec];
        all.extend(args);
        String::from_utf8(self.ok(&all)).unwrap()
    }

    /// What a failure message ends with: how to make the series again.
    fn how(&self) -> String {
        format!(
            "seed {:#x} ({}, {:?}); op log:\n{}",
            self.seed,
            self.test,
            self.kind,
            self.log.join("\n")
        )
    }
}

/// Every snapshot restored by btrsend's receiver and by the kernel's has
/// the kernel's manifest (but for the exemptions of the module doc).
fn check_restores(s: &Series) {
    let tmpfs = Tmpfs::new(1 << 30).unwrap();
    let opts = Options::default();
    let mnt = s.live.path();
    for (i, snap) in s.snaps.iter().enumerate() {
        let name = format!("vol.{i}");
        let expected = &snap.manifest;
        let chain = s.ok(&["restore", "--repo", &s.repo.spec, "--stdout", &snap.path]);
        let exempt = testing::compare::orphan_dirs_without_utimes(chain.as_slice()).unwrap();
        let compare = |how: &str, got: &str| {
            let got = testing::compare::exempt_mtimes(expected, got, &exempt);
            if let Some(d) = manifest::diff(
                &manifest::strip_holes(expected),
                &manifest::strip_holes(&got),
                30,
            ) {
                panic!(
                    "{} restored by {how} differs from the kernel mount:\n{d}\n{}",
                    snap.path,
                    s.how()
                );
            }
        };
        // restore --to a tmpfs: btrsend's receiver.
        let to = tmpfs.path().join(format!("to{i}"));
        std::fs::create_dir(&to).unwrap();
        s.ok(&[
            "restore",
            "--repo",
            &s.repo.spec,
            "--to",
            to.to_str().unwrap(),
            &snap.path,
        ]);
        compare(
            "restore --to",
            &manifest::manifest(&to.join(&name), opts).unwrap(),
        );
        let _ = std::fs::remove_dir_all(&to);
        // restore --stdout | btrfs receive: the kernel's receiver.
        let file = s.live.scratch_dir().join("chain.stream");
        std::fs::write(&file, &chain).unwrap();
        let dest = format!("recv{i}");
        s.live.receive(&dest, &[&file]).unwrap();
        compare(
            "restore --stdout | btrfs receive",
            &s.live.manifest(&format!("{dest}/{name}"), opts).unwrap(),
        );
        delete_received(&mnt.join(&dest));
        eprintln!(
            "{}: {}: {} manifest lines, {} orphan-dir mtimes exempt, chain of {} bytes: restored twice",
            s.test,
            snap.path,
            expected.lines().count(),
            exempt.len(),
            chain.len()
        );
    }
}

/// `ls -R --json` of every snapshot gives the fields of the kernel's
/// manifest; `dump` of a seeded sample of its regular files (all, if
/// fewer than [`DUMPS`]) their content hash.
fn check_ls_and_dump(s: &Series) {
    for (i, snap) in s.snaps.iter().enumerate() {
        let listed = json_lines(&s.query("ls", &[&snap.path, "/", "-R", "--json"]));
        let (want, got) = (expected_lines(&snap.manifest), listed_lines(&listed));
        if got != want {
            let only = |x: &std::collections::BTreeMap<String, String>,
                        y: &std::collections::BTreeMap<String, String>| {
                x.iter()
                    .filter(|(p, l)| y.get(*p) != Some(l))
                    .take(20)
                    .map(|(p, l)| format!("{p} {l}"))
                    .collect::<Vec<_>>()
            };
            panic!(
                "{}: ls -R differs from the kernel mount:\nonly the kernel's: {:#?}\nonly ls: {:#?}\n{}",
                snap.path,
                only(&want, &got),
                only(&got, &want),
                s.how()
            );
        }
        let mut files: Vec<(&str, &str)> = snap
            .manifest
            .lines()
            .skip(1)
            .filter_map(|line| {
                let mut f = line.split(' ');
                let (path, "file") = (f.next()?, f.next()?) else {
                    return None;
                };
                Some((path, f.find_map(|kv| kv.strip_prefix("b3="))?))
            })
            .collect();
        assert!(!files.is_empty(), "{}", snap.path);
        // A partial Fisher-Yates shuffle picks the sample.
        let mut rng = Rng::new(s.seed.wrapping_add(i as u64));
        let n = files.len().min(DUMPS);
        for k in 0..n {
            let j = k + rng.below((files.len() - k) as u64) as usize;
            files.swap(k, j);
        }
        for (path, b3) in &files[..n] {
            // The workload's names are printable ASCII: the escaped path
            // is the path.
            assert!(!path.contains('\\'), "{path}");
            let bytes = s.ok(&[
                "dump",
                "--repo",
                &s.repo.spec,
                &snap.path,
                &format!("/{path}"),
            ]);
            assert_eq!(
                &content_hash_of(&bytes),
                b3,
                "{}: dump /{path} ({} bytes) differs from the kernel mount; {}",
                snap.path,
                bytes.len(),
                s.how()
            );
        }
        eprintln!(
            "{}: {}: ls gives {} paths, dump {n} of {} files",
            s.test,
            snap.path,
            want.len(),
            files.len()
        );
    }
}

/// `restore --include /DIR` of a seeded directory of every snapshot into
/// a tmpfs gives that part of the kernel's manifest: the directory with
/// everything below it and the directories leading to it.
fn check_restore_include(s: &Series) {
    let tmpfs = Tmpfs::new(1 << 30).unwrap();
    for (i, snap) in s.snaps.iter().enumerate() {
        let dirs: Vec<&str> = snap
            .manifest
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(' '))
            .filter(|(p, rest)| *p != "." && rest.starts_with("dir"))
            .map(|(p, _)| p)
            .collect();
        assert!(!dirs.is_empty(), "{}", snap.path);
        let mut rng = Rng::new(s.seed.wrapping_add(0x1000 + i as u64));
        let pick = dirs[rng.below(dirs.len() as u64) as usize];
        // The workload's names are printable ASCII without glob bytes.
        assert!(!pick.contains(['\\', '*', '?', '[']), "{pick}");
        let to = tmpfs.path().join(format!("picked{i}"));
        let pattern = format!("/{pick}");
        s.ok(&[
            "restore",
            "--repo",
            &s.repo.spec,
            "--to",
            to.to_str().unwrap(),
            "--include",
            &pattern,
            &snap.path,
        ]);
        let got = manifest::manifest(&to, Options::default()).unwrap();
        let leading = |p: &str| pick.strip_prefix(p).is_some_and(|r| r.starts_with('/'));
        let want = subtree_lines(&snap.manifest, &|p| within(p, pick) || leading(p));
        let got = subtree_lines(&got, &|_| true);
        if got != want {
            panic!(
                "{}: restore --include {pattern} differs from the kernel mount:\nonly the kernel's: {:#?}\nonly restored: {:#?}\n{}",
                snap.path,
                want.iter()
                    .filter(|l| !got.contains(l))
                    .take(20)
                    .collect::<Vec<_>>(),
                got.iter()
                    .filter(|l| !want.contains(l))
                    .take(20)
                    .collect::<Vec<_>>(),
                s.how()
            );
        }
        let _ = std::fs::remove_dir_all(&to);
        eprintln!(
            "{}: {}: restore --include {pattern}: {} paths",
            s.test,
            snap.path,
            want.len()
        );
    }
}

/// `diff --json` of consecutive snapshots (across the two chains too)
/// gives the difference of their kernel manifests.
fn check_diff(s: &Series) {
    let mut changes = 0;
    for pair in s.snaps.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let want = manifest_diff(&a.manifest, &b.manifest);
        let got = diff_of_json(&s.query("diff", &["--json", &a.path, &b.path]));
        if got != want {
            panic!(
                "{} to {}: diff differs from the kernel's manifests:\nonly the kernel's: {:#?}\nonly diff: {:#?}\n{}",
                a.path,
                b.path,
                want.difference(&got).take(20).collect::<Vec<_>>(),
                got.difference(&want).take(20).collect::<Vec<_>>(),
                s.how()
            );
        }
        changes += want.len();
    }
    assert!(changes > SNAPSHOTS, "{changes} changes in the series");
}

/// `find --json PLANTED` gives exactly the snapshots (and paths) whose
/// kernel mount holds that name.
fn check_find(s: &Series) {
    let mut want = BTreeSet::new();
    for snap in &s.snaps {
        for path in diff_lines(&snap.manifest).into_keys() {
            if path.rsplit('/').next() == Some(PLANTED) {
                want.insert((snap.uuid.clone(), path));
            }
        }
    }
    let holders: BTreeSet<&str> = want.iter().map(|(u, _)| u.as_str()).collect();
    assert!(
        !holders.is_empty() && holders.len() < SNAPSHOTS,
        "{PLANTED} is in {} snapshots: plant it in some",
        holders.len()
    );
    let got: BTreeSet<(String, String)> = json_lines(&s.query("find", &["--json", PLANTED]))
        .iter()
        .map(|v| {
            (
                v["snapshot"].as_str().unwrap().to_owned(),
                v["path"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(got, want, "find {PLANTED}; {}", s.how());
    eprintln!(
        "{}: find {PLANTED}: {} of {SNAPSHOTS} snapshots",
        s.test,
        holders.len()
    );
}

/// The FUSE `backup mount` shows every snapshot (`uuid/UUID`) with the
/// kernel's manifest; SIGTERM unmounts it.
fn check_mount(s: &Series) {
    if !Path::new("/dev/fuse").exists() {
        testing::skip_or_fail(s.test, "needs /dev/fuse");
        return;
    }
    let mut m = Mounted::spawn(
        &s.dir.path().join("fuse"),
        &s.dir.path().join("mount.log"),
        |mp| s.command(&["mount", "--repo", &s.repo.spec, mp.to_str().unwrap()]),
    );
    for snap in &s.snaps {
        let root = m.mp.join("uuid").join(&snap.uuid);
        let got = manifest::manifest(&root, Options::default())
            .unwrap_or_else(|e| panic!("{}: manifest of the mount: {e}", snap.path));
        if let Some(d) = manifest::diff(&snap.manifest, &got, 30) {
            panic!(
                "{}: the mount differs from the kernel mount:\n{d}\n{}",
                snap.path,
                s.how()
            );
        }
    }
    m.interrupt(rustix::process::Signal::TERM);
}

/// No object under `files` (a repository's, or an S3 server's files of
/// it) shows a canary, raw or through `zstd -dc`; the first snapshot
/// holds them all.
fn no_canary(files: &Path) {
    let objects = common::objects(files);
    assert!(objects.len() > 20, "{}", objects.len());
    common::assert_absent(&objects, &CANARIES);
}

/// Delete the subvolumes `btrfs receive` made in `dir`, then `dir`.
fn delete_received(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        sh(Command::new("btrfs")
            .args(["-q", "subvolume", "delete"])
            .arg(&p));
    }
    std::fs::remove_dir(dir).unwrap();
}
