//! A series of snapshots with seeded random changes (the project's random
//! workload, `btrsend::testing::workload`), on a loop-mounted btrfs (root;
//! see `btrsend::testing` for the skip/fail policy), backed up by `backup
//! run` from the image in two runs (`--full-every 5`: two chains, one
//! incremental across the runs), in a directory and on S3:
//!
//! * a re-run stores nothing;
//! * every snapshot is restored twice, `restore --to` into a tmpfs (btrsend's
//!   receiver) and `restore --stdout | btrfs receive` (the kernel's), and
//!   each copy must have the manifest of the kernel's mount of the
//!   snapshot. Exempt, as in `send_random`: hole maps (not compared), and
//!   the mtime of directories in which the restored chain creates orphans
//!   without sending their UTIMES (`orphan_dirs_without_utimes`);
//! * `verify --read-data` finds nothing.
//!
//! Both repositories are encrypted (issue 31): the directory for an age
//! recipient made by `age-keygen` (the runs hold only the write key, the
//! reads the identity), the S3 one with a passphrase. A file name, its
//! contents and an xattr value planted in the first snapshot appear in no
//! object of the repository, read raw or through `zstd -dc`.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use btrsend::manifest::{self, Options};
use btrsend::testing::workload::Workload;
use btrsend::testing::{self, LiveBtrfs, Tmpfs};

use crate::common::{self, sh};
use crate::repo_store::{Backend, Kind};

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

/// Two tests from one body: `NAME::dir` and `NAME::s3`, with different
/// seeds.
macro_rules! both {
    ($name:ident, $body:ident) => {
        mod $name {
            #[test]
            fn dir() {
                super::$body(
                    super::Kind::Dir,
                    concat!(stringify!($name), "::dir"),
                    0x5e71e5,
                );
            }
            #[test]
            fn s3() {
                super::$body(
                    super::Kind::S3,
                    concat!(stringify!($name), "::s3"),
                    0x5e71e6,
                );
            }
        }
    };
}

both!(random_series_restores_every_snapshot, series_case);
fn series_case(kind: Kind, test: &str, seed: u64) {
    if !testing::require_live(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(be) = Backend::new(kind, test, dir.path()) else {
        return;
    };
    let repo = be.repo("repo");
    // The keys: the write key goes under this HOME; reads take the
    // identity (directory) or the passphrase (S3) from the environment.
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    // (Made by `keygen` below, for the directory.)
    let identity = dir.path().join("identity.txt");
    let mut init = vec!["init", "--repo", &repo.spec, "--encryption"];
    let recipient;
    let mut env: Vec<(&str, String)> = vec![("BTRSEND_SCRYPT_LOG_N", String::from("10"))];
    let mut reader_env = Vec::new();
    match kind {
        Kind::Dir => {
            recipient = common::keygen(dir.path(), "identity.txt").1;
            init.extend(["recipients", "--recipient", &recipient]);
            reader_env.push((
                "BTRSEND_IDENTITY_FILE",
                identity.to_str().unwrap().to_owned(),
            ));
        }
        Kind::S3 => {
            init.push("passphrase");
            env.push(("BTRSEND_PASSWORD", String::from("series passphrase")));
        }
    }
    let backup = |args: &[&str]| -> Output {
        let mut c = common::btrsend();
        be.apply(&mut c)
            .env("HOME", &home)
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("BTRSEND_IDENTITY_FILE")
            .envs(env.iter().map(|(k, v)| (k, v)));
        // The nightly job holds no identity.
        if args.first() != Some(&"run") {
            c.envs(reader_env.iter().map(|(k, v)| (k, v)));
        }
        c.arg("backup")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let ok = |args: &[&str]| -> Vec<u8> {
        let o = backup(args);
        assert!(
            o.status.success(),
            "backup {args:?}: exit {:?}: {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        );
        o.stdout
    };

    let live = LiveBtrfs::new().unwrap();
    let mnt = live.path();
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
        sh(Command::new("btrfs")
            .args(["-q", "subvolume", "snapshot", "-r"])
            .arg(&vol)
            .arg(mnt.join(format!("snaps/vol.{i}"))));
    }
    // The snapshots are committed; flush this filesystem for the image
    // reader.
    sh(Command::new("sync").arg("-f").arg(mnt));

    let img = live.image().to_str().unwrap().to_owned();
    ok(&init);
    let run = |glob: &str| -> serde_json::Value {
        let out = ok(&[
            "run",
            "--repo",
            &repo.spec,
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
        serde_json::from_slice(&ok(&["list", "--repo", &repo.spec, "--json"])).unwrap();
    let kinds: Vec<&str> = list
        .as_array()
        .unwrap()
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
    ok(&["verify", "--read-data", "--repo", &repo.spec]);
    no_canary(&repo.files);

    let tmpfs = Tmpfs::new(1 << 30).unwrap();
    let opts = Options::default();
    for i in 0..SNAPSHOTS {
        let name = format!("vol.{i}");
        let snap = format!("snaps/{name}");
        let expected = live.manifest(&snap, opts).unwrap();
        let chain = ok(&["restore", "--repo", &repo.spec, "--stdout", &snap]);
        let exempt = testing::compare::orphan_dirs_without_utimes(chain.as_slice()).unwrap();
        let compare = |how: &str, got: &str| {
            let got = testing::compare::exempt_mtimes(&expected, got, &exempt);
            if let Some(d) = manifest::diff(
                &manifest::strip_holes(&expected),
                &manifest::strip_holes(&got),
                30,
            ) {
                panic!(
                    "seed {seed}: {snap} restored by {how} differs from the kernel mount:\n{d}\nop log:\n{}",
                    w.log().join("\n")
                );
            }
        };
        // restore --to a tmpfs: btrsend's receiver.
        let to = tmpfs.path().join(format!("to{i}"));
        std::fs::create_dir(&to).unwrap();
        ok(&[
            "restore",
            "--repo",
            &repo.spec,
            "--to",
            to.to_str().unwrap(),
            &snap,
        ]);
        compare(
            "restore --to",
            &manifest::manifest(&to.join(&name), opts).unwrap(),
        );
        let _ = std::fs::remove_dir_all(&to);
        // restore --stdout | btrfs receive: the kernel's receiver.
        let file = live.scratch_dir().join("chain.stream");
        std::fs::write(&file, &chain).unwrap();
        let dest = format!("recv{i}");
        live.receive(&dest, &[&file]).unwrap();
        compare(
            "restore --stdout | btrfs receive",
            &live.manifest(&format!("{dest}/{name}"), opts).unwrap(),
        );
        delete_received(&mnt.join(&dest));
        eprintln!(
            "{test}: {snap}: {} manifest lines, {} orphan-dir mtimes exempt, chain of {} bytes: restored twice",
            expected.lines().count(),
            exempt.len(),
            chain.len()
        );
    }
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
