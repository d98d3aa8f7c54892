//! `backup run --dry-run` (issue 35): the exact raw size of each stream a
//! run would store, judged by the kernel's own streams of the fixture
//! (`btrfs send` output, committed) and of live snapshots (`btrfs send |
//! wc -c`), and by what the real run then stores; nothing written to the
//! repository, no snapshot taken; and the refusal, dry or real, of a
//! local repository whose filesystem has no room for the raw streams.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{Mount, btrsend, fixture_dir, json_lines, ok, sh, stderr, unpack};
use crate::repo_store::{Backend, Kind};

const FIX: &str = "014-incremental";

/// The size of the kernel's stream `name` of the fixture.
fn kernel_len(name: &str) -> u64 {
    let f = fs::File::open(fixture_dir(FIX).join(format!("{name}.stream.zst"))).unwrap();
    zstd::decode_all(f).unwrap().len() as u64
}

/// Every file under `dir` (an S3 server's too) with its contents, sorted:
/// what "nothing written" is checked against.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let data = fs::read(&p).unwrap_or_default();
                out.push((p, data));
            }
        }
    }
    out.sort();
    out
}

fn backup(be: &Backend, args: &[&str]) -> Output {
    let mut c = btrsend();
    be.apply(&mut c);
    c.arg("backup").args(args).output().unwrap()
}

fn by_type<'v>(lines: &'v [serde_json::Value], t: &str) -> Vec<&'v serde_json::Value> {
    lines.iter().filter(|l| l["message_type"] == t).collect()
}

fn sizes_case(kind: Kind, test: &str) {
    let dir = tempfile::tempdir().unwrap();
    let img = unpack(dir.path(), FIX, "dev1.img");
    let Some(be) = Backend::new(kind, test, dir.path()) else {
        return;
    };
    let repo = be.repo("repo");
    let spec = repo.spec.as_str();
    let img = img.to_str().unwrap();
    ok(&backup(
        &be,
        &["init", "--repo", spec, "--encryption", "none"],
    ));
    // s1 stored first: the dry run then plans s2 from a stored entry and
    // s3 from a snapshot it stores first.
    ok(&backup(
        &be,
        &["run", "--repo", spec, "--device", img, "snaps/s1"],
    ));
    // What the S3 server holds, the bucket's directory and its own files.
    let watched = match kind {
        Kind::Dir | Kind::Ssh => repo.files.clone(),
        Kind::S3 => dir.path().join("s3"),
    };
    let before = tree(&watched);
    let run = [
        "run",
        "--repo",
        spec,
        "--device",
        img,
        "--limit-rate",
        "10K",
        "--dry-run",
        "--json",
        "snaps/s*",
    ];
    let out = backup(&be, &run);
    let lines = json_lines(&ok(&out));
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
    assert_eq!(
        tree(&watched),
        before,
        "the dry run wrote to the repository"
    );

    let planned = by_type(&lines, "dry_run");
    let want = [
        ("snaps/s2", "s1--s2.inc.v1", "snaps/s1", Some(1)),
        ("snaps/s3", "s2--s3.inc.v1", "snaps/s2", None),
    ];
    assert_eq!(planned.len(), want.len(), "{lines:?}");
    for (p, (snap, kernel, parent, parent_id)) in planned.iter().zip(want) {
        assert_eq!(p["snapshot"], snap);
        assert_eq!(p["kind"], "incremental");
        assert_eq!(p["parent"], parent);
        assert_eq!(p["parent_id"].as_u64(), parent_id);
        assert_eq!(
            p["stream_bytes"].as_u64(),
            Some(kernel_len(kernel)),
            "{snap}"
        );
    }
    let skipped = by_type(&lines, "status")
        .iter()
        .filter(|l| l["already_stored"].is_u64())
        .count();
    assert_eq!(skipped, 1, "{lines:?}");
    let total = lines.last().unwrap();
    assert_eq!(total["message_type"], "dry_run_total");
    let sum = kernel_len("s1--s2.inc.v1") + kernel_len("s2--s3.inc.v1");
    assert_eq!(total["stream_bytes"].as_u64(), Some(sum));
    assert_eq!(total["streams"], 2);
    assert!(total["stored_bytes"].is_null());
    assert_eq!(
        total["seconds_at_limit_rate"].as_u64(),
        Some(sum.div_ceil(10 << 10))
    );
    assert_eq!(total["free_bytes"].is_u64(), kind == Kind::Dir, "{total}");

    // The text says which figure is which.
    let text = ok(&backup(
        &be,
        &run[..run.len() - 2]
            .iter()
            .chain(&["snaps/s*"])
            .copied()
            .collect::<Vec<_>>(),
    ));
    assert!(
        text.contains(&format!(
            "would store snaps/s2: incremental from snaps/s1 (entry 1), {} bytes of raw stream",
            kernel_len("s1--s2.inc.v1")
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("total: 2 streams, {sum} bytes")),
        "{text}"
    );
    assert!(text.contains("stored size is unknown"), "{text}");
    assert!(
        text.contains("at --limit-rate 10240 bytes/s: at most"),
        "{text}"
    );

    // The real run stores what the dry run planned.
    let out = backup(
        &be,
        &["run", "--repo", spec, "--device", img, "--json", "snaps/s*"],
    );
    let stored = json_lines(&ok(&out));
    let stored = by_type(&stored, "stored");
    assert_eq!(stored.len(), 2);
    for (s, p) in stored.iter().zip(&planned) {
        assert_eq!(s["path"], p["snapshot"], "{s}");
        assert_eq!(s["stream_bytes"], p["stream_bytes"], "{s}");
    }
    // And a dry run now has nothing to do.
    let lines = json_lines(&ok(&backup(&be, &run)));
    assert!(by_type(&lines, "dry_run").is_empty());
    assert_eq!(lines.last().unwrap()["stream_bytes"], 0);
}

#[test]
fn dry_run_sizes_are_the_kernels_and_the_runs_dir() {
    sizes_case(Kind::Dir, "dry_run_sizes::dir");
}

#[test]
fn dry_run_sizes_are_the_kernels_and_the_runs_s3() {
    sizes_case(Kind::S3, "dry_run_sizes::s3");
}

/// A full stream, planned in a fresh repository: the kernel's full stream.
#[test]
fn dry_run_of_a_new_repository_plans_the_kernels_chain() {
    let dir = tempfile::tempdir().unwrap();
    let img = unpack(dir.path(), FIX, "dev1.img");
    let repo = dir.path().join("repo");
    let repo = repo.to_str().unwrap();
    let be = Backend::new(Kind::Dir, "dry_run_new", dir.path()).unwrap();
    ok(&backup(
        &be,
        &["init", "--repo", repo, "--encryption", "none"],
    ));
    let out = backup(
        &be,
        &[
            "run",
            "--repo",
            repo,
            "--device",
            img.to_str().unwrap(),
            "--dry-run",
            "--json",
            "snaps/s*",
        ],
    );
    let lines = json_lines(&ok(&out));
    let planned = by_type(&lines, "dry_run");
    let got: Vec<_> = planned
        .iter()
        .map(|p| {
            (
                p["kind"].as_str().unwrap(),
                p["full_reason"].as_str(),
                p["stream_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("full", Some("first"), kernel_len("s1.full.v1")),
            ("incremental", None, kernel_len("s1--s2.inc.v1")),
            ("incremental", None, kernel_len("s2--s3.inc.v1")),
        ]
    );
    let streams = Path::new(repo).join("streams");
    assert!(!streams.exists() || !streams.read_dir().unwrap().any(|_| true));
}

/// A tmpfs of `size` mounted at `dir` (root), or `None`, said loudly.
fn small_fs(dir: &Path, size: &str) -> Option<Mount> {
    fs::create_dir_all(dir).unwrap();
    let st = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0700"),
            "tmpfs",
        ])
        .arg(dir)
        .status();
    if !st.is_ok_and(|s| s.success()) {
        btrsend::testing::require_live("backup_dry_run: a small tmpfs for the repository");
        return None;
    }
    Some(Mount(dir.to_path_buf()))
}

#[test]
fn a_repository_without_room_is_refused_before_starting() {
    let dir = tempfile::tempdir().unwrap();
    let img = unpack(dir.path(), FIX, "dev1.img");
    let img = img.to_str().unwrap();
    // 512 KiB: room for the repository, not for s1's 700 KB full stream.
    let mnt = dir.path().join("small");
    let Some(_m) = small_fs(&mnt, "512k") else {
        return;
    };
    let repo = mnt.join("repo");
    let spec = repo.to_str().unwrap();
    let be = Backend::new(Kind::Dir, "dry_run_room", dir.path()).unwrap();
    ok(&backup(
        &be,
        &["init", "--repo", spec, "--encryption", "none"],
    ));
    let need = kernel_len("s1.full.v1") + kernel_len("s1--s2.inc.v1") + kernel_len("s2--s3.inc.v1");
    let free = || {
        let st = rustix::fs::statvfs(&mnt).unwrap();
        st.f_bavail * st.f_frsize
    };
    let free_before = free();
    let before = tree(&repo);

    // The dry run prints its plan, then refuses as the run would.
    let out = backup(
        &be,
        &[
            "run",
            "--repo",
            spec,
            "--device",
            img,
            "--dry-run",
            "snaps/s*",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let want = format!(
        "btrsend: error: {spec}: not enough room for the run: {need} bytes of raw stream to store, {free_before} bytes free\n"
    );
    assert_eq!(stderr(&out), want);
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("free in {spec}: {free_before} bytes"))
    );
    let out = backup(
        &be,
        &[
            "run",
            "--repo",
            spec,
            "--device",
            img,
            "--dry-run",
            "--json",
            "snaps/s*",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(err["exit_code"], 1);
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains(&format!("{need} bytes of raw stream"))
    );
    let total = json_lines(&String::from_utf8_lossy(&out.stdout));
    let total = total.last().unwrap();
    assert_eq!(total["stream_bytes"].as_u64(), Some(need));
    assert_eq!(total["free_bytes"].as_u64(), Some(free_before));

    // The real run, before storing anything (the free space it sees is
    // less the block its lock file's holder record takes).
    let out = backup(&be, &["run", "--repo", spec, "--device", img, "snaps/s*"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    let prefix = format!(
        "btrsend: error: {spec}: not enough room for the run: {need} bytes of raw stream to store, "
    );
    let free_then: u64 = err
        .strip_prefix(&prefix)
        .and_then(|r| r.strip_suffix(" bytes free\n"))
        .unwrap_or_else(|| panic!("{err}"))
        .parse()
        .unwrap();
    assert!(
        free_then <= free_before && free_then + 8192 >= free_before,
        "{err}"
    );
    let no_lock = |t: Vec<(PathBuf, Vec<u8>)>| -> Vec<(PathBuf, Vec<u8>)> {
        t.into_iter()
            .filter(|(p, _)| !p.ends_with("lock"))
            .collect()
    };
    assert_eq!(
        no_lock(tree(&repo)),
        no_lock(before),
        "a refused run wrote to the repository"
    );

    // --no-space-check plans without refusing (and would store).
    let out = backup(
        &be,
        &[
            "run",
            "--repo",
            spec,
            "--device",
            img,
            "--dry-run",
            "--no-space-check",
            "snaps/s*",
        ],
    );
    assert!(ok(&out).contains(&format!("total: 3 streams, {need} bytes")));

    // With room, the same run stores everything.
    let st = Command::new("mount")
        .args(["-o", "remount,size=2m"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success());
    let out = backup(
        &be,
        &["run", "--repo", spec, "--device", img, "--json", "snaps/s*"],
    );
    let lines = json_lines(&ok(&out));
    assert_eq!(by_type(&lines, "stored").len(), 3);
}

/// Live (root): kernel-made snapshots of a scratch btrfs, sized by the
/// kernel's `btrfs send`; `--snapshot` says what it would take and takes
/// nothing.
#[test]
fn dry_run_on_live_snapshots_matches_btrfs_send_and_takes_nothing() {
    const TEST: &str = "dry_run_on_live_snapshots_matches_btrfs_send_and_takes_nothing";
    if !btrsend::testing::require_live(TEST) {
        return;
    }
    let live =
        btrsend::testing::LiveBtrfs::with_options(512 << 20, &[], "").expect("scratch btrfs");
    let mnt = live.path().to_path_buf();
    let vol = mnt.join("vol");
    let snaps = mnt.join("snaps");
    sh(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(&vol));
    fs::create_dir(&snaps).unwrap();
    let mut rng = btrsend::testing::workload::Rng::new(35);
    crate::common::write_random(&vol.join("a"), 3 << 20, &mut rng);
    fs::write(vol.join("small"), b"x").unwrap();
    sh(&mut Command::new("sync"));
    let s1 = snaps.join("s1");
    sh(Command::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(&vol)
        .arg(&s1));
    crate::common::write_random(&vol.join("b"), 1 << 20, &mut rng);
    fs::remove_file(vol.join("small")).unwrap();
    sh(&mut Command::new("sync"));
    let s2 = snaps.join("s2");
    sh(Command::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(&vol)
        .arg(&s2));
    let kernel = |args: &[&Path]| -> u64 {
        let out = sh(Command::new("bash").arg("-c").arg(format!(
            "btrfs -q send {} | wc -c",
            args.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        )));
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let full = kernel(&[&s1]);
    let inc = kernel(&[Path::new("-p"), &s1, &s2]);

    let repo = live.scratch_dir().join("repo");
    let spec = repo.to_str().unwrap();
    let be = Backend::new(Kind::Dir, TEST, live.scratch_dir()).unwrap();
    ok(&backup(
        &be,
        &["init", "--repo", spec, "--encryption", "none"],
    ));
    let out = backup(
        &be,
        &[
            "run",
            "--repo",
            spec,
            "--dry-run",
            "--json",
            s1.to_str().unwrap(),
            s2.to_str().unwrap(),
        ],
    );
    let lines = json_lines(&ok(&out));
    let sizes: Vec<u64> = by_type(&lines, "dry_run")
        .iter()
        .map(|p| p["stream_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [full, inc], "{lines:?}");

    // --snapshot: vol changed since s2 was taken? Not by btrsend's rules
    // (it took none in DIR), so it would take one, and takes none.
    let listed = || fs::read_dir(&snaps).unwrap().count();
    let n = listed();
    let out = backup(
        &be,
        &[
            "run",
            "--repo",
            spec,
            "--dry-run",
            "--json",
            "--snapshot",
            vol.to_str().unwrap(),
            "--snapshot-dir",
            snaps.to_str().unwrap(),
        ],
    );
    let lines = json_lines(&ok(&out));
    assert_eq!(listed(), n, "the dry run took a snapshot");
    let take: Vec<_> = lines
        .iter()
        .filter(|l| l["would_take"].is_string())
        .collect();
    assert_eq!(take.len(), 1, "{lines:?}");
    assert_eq!(take[0]["would_take"], vol.to_str().unwrap());
    assert_eq!(lines.last().unwrap()["snapshots_to_take"], 1);
    let streams = repo.join("streams");
    assert!(!streams.exists() || !streams.read_dir().unwrap().any(|_| true));
}

/// `run --dry-run --target`: the streams a target would receive, with the
/// sizes of the kernel's own streams of the fixture (a full one of s1 into
/// an empty target; after s1 is received, s2 and s3 incremental from the
/// snapshot before each), what the target has named, nothing received;
/// and a local target whose filesystem has no room for the raw total is
/// refused by the dry run and by a real run, before anything is received.
#[test]
fn a_target_dry_run_plans_the_kernels_streams_and_checks_room() {
    let dir = tempfile::tempdir().unwrap();
    let img = unpack(dir.path(), FIX, "dev1.img");
    let img = img.to_str().unwrap();
    let be = Backend::new(Kind::Dir, "dry_run_target", dir.path()).unwrap();
    let target = dir.path().join("target");
    fs::create_dir(&target).unwrap();
    let t = target.to_str().unwrap();
    let dry = |t: &str| {
        backup(
            &be,
            &[
                "run",
                "--target",
                t,
                "--device",
                img,
                "--dry-run",
                "--json",
                "snaps/s*",
            ],
        )
    };
    let planned = |out: &Output| -> Vec<(String, String, Option<String>, u64)> {
        by_type(&json_lines(&ok(out)), "dry_run")
            .iter()
            .map(|p| {
                (
                    p["snapshot"].as_str().unwrap().to_owned(),
                    p["kind"].as_str().unwrap().to_owned(),
                    p["parent"].as_str().map(str::to_owned),
                    p["stream_bytes"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let s = |v: &str| v.to_owned();
    // Each snapshot's stream, as the kernel's fixture streams size it.
    let s1 = (s("snaps/s1"), s("full"), None, kernel_len("s1.full.v1"));
    let s2 = (
        s("snaps/s2"),
        s("incremental"),
        Some(s("snaps/s1")),
        kernel_len("s1--s2.inc.v1"),
    );
    let s3 = (
        s("snaps/s3"),
        s("incremental"),
        Some(s("snaps/s2")),
        kernel_len("s2--s3.inc.v1"),
    );
    let out = dry(t);
    assert_eq!(planned(&out), [s1, s2.clone(), s3.clone()]);
    assert!(tree(&target).is_empty(), "the dry run received something");
    assert_eq!(fs::read_dir(&target).unwrap().count(), 0);
    // s1 received: the plan starts from it.
    ok(&backup(
        &be,
        &["run", "--target", t, "--device", img, "snaps/s1"],
    ));
    let out = dry(t);
    assert_eq!(planned(&out), [s2, s3]);
    let lines = json_lines(&String::from_utf8_lossy(&out.stdout));
    let had: Vec<_> = by_type(&lines, "status")
        .iter()
        .filter_map(|l| Some((l["snapshot"].as_str()?, l["already_received"].as_str()?)))
        .collect();
    assert_eq!(had, [("snaps/s1", "s1")]);
    let total = by_type(&lines, "dry_run_total")[0];
    assert_eq!(
        total["stream_bytes"].as_u64(),
        Some(kernel_len("s1--s2.inc.v1") + kernel_len("s2--s3.inc.v1"))
    );
    assert!(total["free_bytes"].as_u64().is_some_and(|f| f > 0));

    // 512 KiB: not room for s1's 700 KB full stream.
    let mnt = dir.path().join("small");
    let Some(_m) = small_fs(&mnt, "512k") else {
        return;
    };
    let small = mnt.to_str().unwrap();
    let st = rustix::fs::statvfs(&mnt).unwrap();
    let free = st.f_bavail * st.f_frsize;
    let need = kernel_len("s1.full.v1") + kernel_len("s1--s2.inc.v1") + kernel_len("s2--s3.inc.v1");
    let want = format!(
        "btrsend: error: {small}: not enough room for the run: {need} bytes of raw stream to store, {free} bytes free\n"
    );
    let out = backup(
        &be,
        &[
            "run",
            "--target",
            small,
            "--device",
            img,
            "--dry-run",
            "snaps/s*",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(stderr(&out), want);
    assert!(String::from_utf8_lossy(&out.stdout).contains("would receive snaps/s1: full"));
    let out = backup(
        &be,
        &["run", "--target", small, "--device", img, "snaps/s*"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(stderr(&out), want);
    assert!(
        fs::read_dir(&mnt).unwrap().all(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with('.')),
        "a run without room received something"
    );
    // With --no-space-check the run goes on (and fails for want of room,
    // or fits: a receive into tmpfs stores the files, not the stream).
    let out = backup(
        &be,
        &[
            "run",
            "--target",
            small,
            "--device",
            img,
            "--no-space-check",
            "--dry-run",
            "snaps/s*",
        ],
    );
    ok(&out);
}
