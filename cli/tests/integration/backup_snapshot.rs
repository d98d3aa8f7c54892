//! `btrsend backup run --snapshot SUBVOL --snapshot-dir DIR
//! [--keep-snapshots N]` on a loop-mounted btrfs: the nightly job that
//! takes its own read-only snapshots, stores them, and prunes them without
//! ever deleting the next incremental's parent, a snapshot not stored
//! yet, or one btrsend did not take; 30 nights of run + forget whose kept
//! entries all restore to the tree the kernel mount showed that night.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;

use btrsend::manifest::{self, Options};
use btrsend::testing::{self, LiveBtrfs};
use serde_json::Value;

use crate::backup_forget::{change, listed, ok, run};
use crate::common::{json_lines, sh, subvolume_show};

/// The subvolume names in `dir`, sorted (the hold records' directory,
/// which every run writes, is not one).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != btrsend::backup::holds::HOLDS_DIR)
        .collect();
    v.sort();
    v
}

/// Wait for the next second: snapshot names carry the time to the second.
fn next_second() {
    let now = jiff::Timestamp::now();
    let ns = 1_000_000_000 - i64::from(now.subsec_nanosecond());
    std::thread::sleep(std::time::Duration::from_nanos(ns as u64 + 1_000_000));
}

/// 30 nights: each night changes the subvolume, then `backup run
/// --snapshot … --keep-snapshots 3 --full-every 7` and `backup forget
/// --keep-last 5`. After each night the snapshot directory holds exactly
/// the 3 newest snapshots (all stored), each one read-only as `btrfs
/// subvolume show` says; at the end every kept entry restores to the
/// manifest taken of its snapshot on its night, through btrsend's receive
/// and through the kernel's.
#[test]
fn thirty_nights_of_snapshot_store_forget_and_prune() {
    const TEST: &str = "thirty_nights_of_snapshot_store_forget_and_prune";
    const NIGHTS: u32 = 30;
    if !testing::require_live(TEST) {
        return;
    }
    let live = LiveBtrfs::with_options(1 << 30, &[], "").expect("scratch btrfs");
    let mnt = live.path();
    let sub = mnt.join("home");
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "create"])
        .arg(&sub));
    let snaps = mnt.join("snaps");
    fs::create_dir(&snaps).unwrap();
    let work = tempfile::tempdir().unwrap();
    let repo = work.path().join("repo");
    let repo = repo.to_str().unwrap();
    ok(&["backup", "init", "--repo", repo, "--encryption", "none"]);
    let mut manifests = std::collections::BTreeMap::new();
    let mut taken: Vec<String> = Vec::new();
    for night in 0..NIGHTS {
        change(&sub, night);
        next_second();
        let out = ok(&[
            "backup",
            "run",
            "--repo",
            repo,
            "--snapshot",
            sub.to_str().unwrap(),
            "--snapshot-dir",
            snaps.to_str().unwrap(),
            "--keep-snapshots",
            "3",
            "--full-every",
            "7",
            "--json",
        ]);
        let lines = json_lines(&out);
        let stored: Vec<&Value> = lines
            .iter()
            .filter(|l| l["message_type"] == "stored")
            .collect();
        assert_eq!(stored.len(), 1, "night {night}: {out}");
        let path = stored[0]["path"].as_str().unwrap().to_owned();
        let name = path.strip_prefix("snaps/").unwrap().to_owned();
        assert!(name.starts_with("home.20"), "{name}");
        let kind = stored[0]["kind"].as_str().unwrap();
        assert_eq!(
            kind,
            if night.is_multiple_of(7) {
                "full"
            } else {
                "incremental"
            },
            "night {night}"
        );
        let snap = snaps.join(&name);
        assert_eq!(subvolume_show(&snap, "Flags"), "readonly", "{name}");
        manifests.insert(
            path.clone(),
            manifest::manifest(&snap, Options::default()).unwrap(),
        );
        taken.push(name);
        let summary = lines.last().unwrap();
        assert_eq!(summary["message_type"], "summary");
        assert_eq!(summary["snapshots_taken"], 1);
        assert_eq!(
            summary["snapshots_deleted"],
            u64::from(night >= 3),
            "night {night}: {out}"
        );
        // Only the 3 newest stay in the snapshot directory.
        let keep: Vec<String> = taken.iter().rev().take(3).rev().cloned().collect();
        assert_eq!(names(&snaps), keep, "night {night}");
        // Chains as `run` made them (synthetic full streams would reset
        // --full-every's count; the 400 nights of backup_forget have them).
        ok(&[
            "backup",
            "forget",
            "--repo",
            repo,
            "--no-synthesize",
            "--keep-last",
            "5",
        ]);
    }
    ok(&["backup", "verify", "--repo", repo, "--read-data"]);
    let kept = listed(repo);
    // The 5 newest, plus the entries back to each one's full stream.
    let newest: BTreeSet<String> = taken
        .iter()
        .rev()
        .take(5)
        .map(|n| format!("snaps/{n}"))
        .collect();
    for n in &newest {
        assert!(kept.contains_key(n), "{n} not kept: {kept:?}");
    }
    assert!(kept.len() < 5 + 7, "{kept:?}");
    for (path, id) in &kept {
        let to = work.path().join(format!("restore-{id}"));
        fs::create_dir(&to).unwrap();
        ok(&[
            "backup",
            "restore",
            "--repo",
            repo,
            &id.to_string(),
            "--to",
            to.to_str().unwrap(),
        ]);
        let name = path.strip_prefix("snaps/").unwrap();
        let got = manifest::manifest(&to.join(name), Options::default()).unwrap();
        assert!(
            got == manifests[path],
            "{path} (entry {id}) restores to another tree"
        );
        fs::remove_dir_all(&to).unwrap();
    }
    // The newest through the kernel's receive too.
    let (path, id) = kept
        .iter()
        .max_by_key(|(_, id)| **id)
        .map(|(p, i)| (p.clone(), *i))
        .unwrap();
    let dest = mnt.join("restored");
    fs::create_dir(&dest).unwrap();
    let restore = format!(
        "{} backup restore --repo {repo} {id} --stdout | btrfs receive -q {}",
        env!("CARGO_BIN_EXE_btrsend"),
        dest.display()
    );
    sh(Command::new("sh").args(["-c", &restore]));
    let name = path.strip_prefix("snaps/").unwrap();
    let got = manifest::manifest(&dest.join(name), Options::default()).unwrap();
    assert!(got == manifests[&path], "{path} through btrfs receive");
}

/// The failures: a subvolume that cannot be snapshotted is exit status 3
/// while the other is stored; a run whose store fails (a full repository
/// disk) leaves its new snapshot in place however small N is; a snapshot
/// btrsend did not take is never deleted; the next run stores what was
/// left and prunes down to the newest stored one.
#[test]
fn snapshots_not_taken_not_stored_or_not_ours_are_handled() {
    const TEST: &str = "snapshots_not_taken_not_stored_or_not_ours_are_handled";
    if !testing::require_live(TEST) {
        return;
    }
    let live = LiveBtrfs::with_options(1 << 30, &[], "").expect("scratch btrfs");
    let mnt = live.path();
    let sub = mnt.join("home");
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "create"])
        .arg(&sub));
    fs::write(sub.join("a"), "first\n").unwrap();
    let plain = mnt.join("plain-dir");
    fs::create_dir(&plain).unwrap();
    let snaps = mnt.join("snaps");
    fs::create_dir(&snaps).unwrap();
    // A snapshot made by hand, of the same subvolume.
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "snapshot", "-r"])
        .arg(&sub)
        .arg(snaps.join("manual")));
    // The repository on a small tmpfs, to fill it later.
    let work = tempfile::tempdir().unwrap();
    let repo_mnt = work.path().join("repo-fs");
    fs::create_dir(&repo_mnt).unwrap();
    sh(Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
        .arg(&repo_mnt));
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&repo_mnt);
    let repo = repo_mnt.join("repo");
    let repo = repo.to_str().unwrap();
    ok(&["backup", "init", "--repo", repo, "--encryption", "none"]);
    let base = [
        "backup",
        "run",
        "--repo",
        repo,
        "--snapshot-dir",
        snaps.to_str().unwrap(),
        "--keep-snapshots",
        "0",
    ];

    // --device and --snapshot: a usage error.
    let out = run(&[
        "backup",
        "run",
        "--repo",
        repo,
        "--device",
        "/dev/null",
        "--snapshot",
        sub.to_str().unwrap(),
        "--snapshot-dir",
        snaps.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));

    // Night 1: the plain directory cannot be snapshotted (exit 3); home
    // and the manual snapshot are stored (no stored one yet: every
    // snapshot of home in DIR is new).
    next_second();
    let mut args = base.to_vec();
    args.extend(["--snapshot", sub.to_str().unwrap()]);
    args.extend(["--snapshot", plain.to_str().unwrap()]);
    let out = run(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("plain-dir"), "{err}");
    let stored = listed(repo);
    assert_eq!(stored.len(), 2, "{stored:?}");
    assert!(stored.contains_key("snaps/manual"), "{stored:?}");
    let first: Vec<String> = names(&snaps)
        .into_iter()
        .filter(|n| n != "manual")
        .collect();
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(subvolume_show(&snaps.join(&first[0]), "Flags"), "readonly");

    // Night 2: the repository's disk is full: the new snapshot is not
    // stored, so it stays although N is 0; the newest stored one stays as
    // the next parent; the manual one stays.
    // 4 MiB that zstd cannot shrink.
    let mut noise = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(fs::File::open("/dev/urandom").unwrap(), 4 << 20),
        &mut noise,
    )
    .unwrap();
    fs::write(sub.join("big"), &noise).unwrap();
    sh(Command::new("mount")
        .args(["-o", "remount,size=1m"])
        .arg(&repo_mnt));
    next_second();
    let mut args = base.to_vec();
    args.extend(["--snapshot", sub.to_str().unwrap()]);
    let out = run(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let second: Vec<String> = names(&snaps)
        .into_iter()
        .filter(|n| n != "manual" && !first.contains(n))
        .collect();
    assert_eq!(second.len(), 1, "{:?}", names(&snaps));
    assert!(
        snaps.join(&first[0]).exists(),
        "the stored parent was deleted"
    );
    assert_eq!(listed(repo).len(), 2);

    // Night 3: room again: the unstored one and the new one are stored,
    // oldest first, then everything btrsend took but the newest goes.
    sh(Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(&repo_mnt));
    fs::write(sub.join("c"), "third\n").unwrap();
    next_second();
    let out = run(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let stored = listed(repo);
    assert_eq!(stored.len(), 4, "{stored:?}");
    assert!(stored.contains_key(&format!("snaps/{}", second[0])));
    let left = names(&snaps);
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&String::from("manual")), "{left:?}");
    let newest = left.iter().find(|n| *n != "manual").unwrap();
    assert!(!first.contains(newest) && !second.contains(newest));
    ok(&["backup", "verify", "--repo", repo, "--read-data"]);
}

/// Every nightly command line the README and `contrib/` show parses: run
/// against a repository that does not exist, each part of each line gets
/// exit status 10 (repository missing), never 2 (usage).
#[test]
fn documented_nightly_lines_parse() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    let service = fs::read_to_string(root.join("contrib/btrsend-backup.service")).unwrap();
    let mut lines: Vec<String> = readme
        .lines()
        .filter_map(|l| l.trim().strip_prefix("0 3 * * * "))
        .flat_map(|l| l.split("&&"))
        .map(|p| p.trim().to_owned())
        .collect();
    assert!(lines.len() >= 4, "{lines:?}");
    let units: Vec<String> = service
        .lines()
        .filter_map(|l| l.strip_prefix("ExecStart="))
        .map(|l| l.replace("snaps/home.*", "'snaps/home.*'"))
        .collect();
    assert_eq!(units.len(), 2, "{service}");
    lines.extend(units);
    // The man pages' crontab examples, unfolded.
    let mut man_lines = 0;
    for page in [
        "btrsend-backup",
        "btrsend-backup-run",
        "btrsend-backup-forget",
    ] {
        for section in btrsend_cli::man::extra_sections(page) {
            for block in section.blocks {
                if let btrsend_cli::man::Block::Example(_, cmd) = block
                    && let Some(l) = cmd.strip_prefix("0 3 * * * ")
                {
                    man_lines += 1;
                    lines.extend(l.split("&&").map(|p| p.trim().to_owned()));
                }
            }
        }
    }
    assert!(
        man_lines >= 4,
        "the backup man pages lost their crontab examples"
    );
    let missing = tempfile::tempdir().unwrap();
    let repo = missing.path().join("no-such-repo");
    // The unit's config file: contrib's example, every destination's repo
    // the missing one (and no write-key file to read).
    let example =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/btrsend.toml"))
            .unwrap();
    let config: String = example
        .lines()
        .filter(|l| !l.starts_with("write_key"))
        .map(|l| {
            if l.starts_with("repo = ") {
                format!("repo = \"{}\"\n", repo.display())
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    let config_file = missing.path().join("btrsend.toml");
    fs::write(&config_file, config).unwrap();
    for line in &lines {
        let cmd = line
            .strip_prefix("/usr/local/bin/btrsend ")
            .unwrap_or_else(|| panic!("not a btrsend line: {line}"))
            .replace("/backup/home", repo.to_str().unwrap())
            .replace("/etc/btrsend/btrsend.toml", config_file.to_str().unwrap());
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("\"$BTRSEND\" {cmd}"))
            .env("BTRSEND", env!("CARGO_BIN_EXE_btrsend"))
            .env("BTRSEND_REPOSITORY", &repo)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(10),
            "{line}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
