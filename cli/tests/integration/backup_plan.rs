//! Issue 29, run planning, end to end on loop-mounted btrfs filesystems:
//! `--full-every-days` ends a chain so that `forget` frees it, and
//! `forget` says what chains still hold; two repositories storing from one
//! snapshot directory keep each other's parents (hold records) and a run
//! whose parent was deleted says so; snapshot names never clash; an
//! unchanged subvolume gets no new snapshot.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use btrsend::testing::{self, LiveBtrfs};
use serde_json::Value;

use crate::backup_forget::{change, ok, run};
use crate::common::{json_lines, sh, subvolume_show};

/// The `stored` lines.
fn stored(lines: &[Value]) -> Vec<&Value> {
    lines
        .iter()
        .filter(|l| l["message_type"] == "stored")
        .collect()
}

/// The summary line.
fn summary(lines: &[Value]) -> &Value {
    let s = lines.last().expect("no output");
    assert_eq!(s["message_type"], "summary", "{lines:?}");
    s
}

/// The subvolumes in `dir` (the hold records' directory is not one).
fn snapshots_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".btrsend-holds")
        .collect();
    v.sort();
    v
}

/// A scratch btrfs with the subvolume `home` and the directory `snaps`.
fn scratch() -> (LiveBtrfs, PathBuf, PathBuf) {
    let live = LiveBtrfs::with_options(1 << 30, &[], "").expect("scratch btrfs");
    let sub = live.path().join("home");
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "create"])
        .arg(&sub));
    let snaps = live.path().join("snaps");
    fs::create_dir(&snaps).unwrap();
    (live, sub, snaps)
}

/// `backup run --snapshot SUB --snapshot-dir SNAPS` and `extra`, which
/// must succeed: its JSON lines (`--json` is added).
fn run_json(repo: &str, sub: &Path, snaps: &Path, extra: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "backup",
        "run",
        "--repo",
        repo,
        "--snapshot",
        sub.to_str().unwrap(),
        "--snapshot-dir",
        snaps.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    json_lines(&ok(&args))
}

/// `backup list --json` of `repo`.
fn entries(repo: &str) -> Vec<Value> {
    let v: Value =
        serde_json::from_str(&ok(&["backup", "list", "--repo", repo, "--json"])).unwrap();
    v.as_array().unwrap().clone()
}

/// The size of an entry's stream file, as the repository's filesystem
/// has it.
fn file_size(repo: &str, entry: &Value) -> u64 {
    fs::metadata(Path::new(repo).join(entry["file"].as_str().unwrap()))
        .unwrap()
        .len()
}

/// `now - days`, RFC 3339.
fn days_ago(days: i64) -> String {
    jiff::Timestamp::now()
        .checked_sub(jiff::SignedDuration::from_hours(24 * days))
        .unwrap()
        .to_string()
}

/// Two kernel-made streams of `home`, a full one 40 days old and an
/// incremental one 20 days old, imported into the origin of `home` (as a
/// repository whose chain began 40 days ago): the next `run` with the
/// default `--full-every-days` (30) stores a full stream, one with 50 or 0
/// an incremental one; `forget --keep-last 1` first says that the old full
/// stream stays for the chain (with its file's size) and, after the new
/// full stream, deletes the whole old chain.
#[test]
fn full_every_days_ends_a_chain_that_forget_then_frees() {
    const TEST: &str = "full_every_days_ends_a_chain_that_forget_then_frees";
    if !testing::require_live(TEST) {
        return;
    }
    let (_live, sub, snaps) = scratch();
    let work = tempfile::tempdir().unwrap();
    let repo = work.path().join("repo");
    let repo = repo.to_str().unwrap();
    ok(&["backup", "init", "--repo", repo, "--encryption", "none"]);
    let origin = subvolume_show(&sub, "UUID");
    // The old chain, by the kernel: old1 (full) <- old2.
    let mut prev: Option<PathBuf> = None;
    for (night, age) in [(0u32, 40), (1, 20)] {
        change(&sub, night);
        let snap = snaps.join(format!("old{}", night + 1));
        sh(Command::new("btrfs")
            .args(["-q", "subvolume", "snapshot", "-r"])
            .arg(&sub)
            .arg(&snap));
        let stream = work.path().join(format!("old{}.stream", night + 1));
        let mut send = Command::new("btrfs");
        send.args(["-q", "send", "-f"]).arg(&stream);
        if let Some(p) = &prev {
            send.arg("-p").arg(p);
        }
        sh(send.arg(&snap));
        ok(&[
            "backup",
            "import",
            "--repo",
            repo,
            "--origin",
            &origin,
            "--time",
            &days_ago(age),
            stream.to_str().unwrap(),
        ]);
        prev = Some(snap);
    }
    let old = entries(repo);
    assert_eq!(old.len(), 2);
    let (old1, old2) = (&old[0], &old[1]);
    assert_eq!(old1["path"], "old1");
    assert_eq!(old2["parent_id"], old1["id"]);
    let old1_bytes = file_size(repo, old1);

    // forget says why old1 stays: --keep-last 1 keeps old2, whose chain
    // needs old1.
    let text = ok(&[
        "backup",
        "forget",
        "--repo",
        repo,
        "--dry-run",
        "--no-synthesize",
        "--keep-last",
        "1",
    ]);
    assert!(text.contains("2 kept, 0 would delete"), "{text}");
    let want = format!("1 entry ({old1_bytes} bytes) the policy would drop is kept");
    assert!(text.contains(&want), "{text}");
    assert!(text.contains("--full-every-days"), "{text}");
    let rows: Value = serde_json::from_str(&ok(&[
        "backup",
        "forget",
        "--repo",
        repo,
        "--dry-run",
        "--no-synthesize",
        "--keep-last",
        "1",
        "--json",
    ]))
    .unwrap();
    let row = |id: &Value| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == *id)
            .unwrap()
            .clone()
    };
    assert_eq!(row(&old1["id"])["kept_for_chain"], true);
    assert_eq!(row(&old1["id"])["stored_bytes"], old1_bytes);
    assert_eq!(row(&old2["id"])["kept_for_chain"], false);

    // The chain's full stream is 40 days old: with 50 days, and with the
    // rule off, the runs are incremental.
    for (night, days) in [(2, "50"), (3, "0")] {
        change(&sub, night);
        let lines = run_json(repo, &sub, &snaps, &["--full-every-days", days]);
        let s = stored(&lines);
        assert_eq!(s.len(), 1, "{lines:?}");
        assert_eq!(s[0]["kind"], "incremental", "--full-every-days {days}");
        assert!(s[0].get("full_reason").is_none(), "{:?}", s[0]);
    }
    // By default (30 days) the next is full, and says why.
    change(&sub, 4);
    let lines = run_json(repo, &sub, &snaps, &[]);
    let s = stored(&lines);
    assert_eq!(s.len(), 1, "{lines:?}");
    assert_eq!(s[0]["kind"], "full");
    assert_eq!(s[0]["full_reason"], "full_every_days");
    let newest = s[0]["id"].clone();
    // And the one after it is incremental from it.
    change(&sub, 5);
    let lines = run_json(repo, &sub, &snaps, &[]);
    assert_eq!(stored(&lines)[0]["parent_id"], newest);

    // Now --keep-last 1 frees the whole old chain: old1, old2 and the two
    // incrementals on them (with no synthetic full stream to free the new
    // chain's full one as well).
    let before: u64 = entries(repo).iter().map(|e| file_size(repo, e)).sum();
    ok(&[
        "backup",
        "forget",
        "--repo",
        repo,
        "--no-synthesize",
        "--keep-last",
        "1",
    ]);
    let left = entries(repo);
    assert_eq!(left.len(), 2, "{left:?}");
    assert_eq!(left[0]["id"], newest);
    let files = fs::read_dir(Path::new(repo).join("streams"))
        .unwrap()
        .count();
    assert_eq!(files, 2);
    let after: u64 = left.iter().map(|e| file_size(repo, e)).sum();
    assert!(after < before, "{after} >= {before}");
    ok(&["backup", "verify", "--repo", repo, "--read-data"]);
}

/// The id in a repository's config.
fn repo_id(repo: &str) -> String {
    let c: Value =
        serde_json::from_slice(&fs::read(Path::new(repo).join("config")).unwrap()).unwrap();
    c["id"].as_str().unwrap().to_owned()
}

/// Two directory repositories store from one snapshot directory, each
/// with `--keep-snapshots 1`, on alternating runs (each storing the other's
/// newest snapshot and its own). With the hold records, each one's runs
/// stay incremental whatever the other pruned. With B's record deleted, A's
/// pruning deletes B's parent: B's next run stores a full stream and says
/// so on stderr (no terminal, no --json), and in --json as full_reason
/// parent_gone and a warning line.
#[test]
fn two_repositories_sharing_a_snapshot_dir_keep_their_parents() {
    const TEST: &str = "two_repositories_sharing_a_snapshot_dir_keep_their_parents";
    if !testing::require_live(TEST) {
        return;
    }
    let (_live, sub, snaps) = scratch();
    let work = tempfile::tempdir().unwrap();
    let a = work.path().join("a");
    let b = work.path().join("b");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    ok(&["backup", "init", "--repo", a, "--encryption", "none"]);
    ok(&["backup", "init", "--repo", b, "--encryption", "none"]);
    let hold_b = snaps.join(".btrsend-holds").join(repo_id(b));
    let keep = ["--keep-snapshots", "1"];
    let kinds = |lines: &[Value]| -> Vec<String> {
        stored(lines)
            .iter()
            .map(|s| s["kind"].as_str().unwrap().to_owned())
            .collect()
    };

    change(&sub, 0);
    let l = run_json(a, &sub, &snaps, &keep);
    assert_eq!(kinds(&l), ["full"]);
    assert_eq!(stored(&l)[0]["full_reason"], "first");
    // B: nothing changed since A's snapshot, so none is taken; B stores it.
    let l = run_json(b, &sub, &snaps, &keep);
    assert_eq!(kinds(&l), ["full"]);
    assert_eq!(summary(&l)["snapshots_taken"], 0);
    assert_eq!(summary(&l)["unchanged"], 1);
    let s1 = snapshots_in(&snaps);
    assert_eq!(s1.len(), 1);
    assert!(hold_b.is_file(), "{}", hold_b.display());

    // Alternating nights: A prunes beyond 1, but never B's parent.
    for night in 1..5 {
        change(&sub, night);
        let l = run_json(a, &sub, &snaps, &keep);
        // A stores B's newest (after the first night) and its own.
        let want = if night == 1 { 1 } else { 2 };
        assert_eq!(
            kinds(&l),
            vec!["incremental"; want],
            "night {night}: A {l:?}"
        );
        change(&sub, night + 100);
        let l = run_json(b, &sub, &snaps, &keep);
        // B stores A's snapshot and its own, both incremental.
        assert_eq!(
            kinds(&l),
            ["incremental", "incremental"],
            "night {night}: B {l:?}"
        );
        // Left: A's next parent (held by A's record) and B's newest.
        assert_eq!(snapshots_in(&snaps).len(), 2, "night {night}");
    }
    assert_eq!(entries(a).len(), 8);
    assert_eq!(entries(b).len(), 9);

    // B's record released: A's pruning deletes B's parent.
    let b_parent = entries(b).last().unwrap()["path"]
        .as_str()
        .unwrap()
        .to_owned();
    fs::remove_file(&hold_b).unwrap();
    change(&sub, 10);
    run_json(a, &sub, &snaps, &keep);
    let b_parent_name = b_parent.rsplit('/').next().unwrap();
    assert!(!snapshots_in(&snaps).iter().any(|n| n == b_parent_name));
    change(&sub, 11);
    let out = run(&[
        "backup",
        "run",
        "--repo",
        b,
        "--snapshot",
        sub.to_str().unwrap(),
        "--snapshot-dir",
        snaps.to_str().unwrap(),
        "--keep-snapshots",
        "1",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("btrsend: warning: storing ")
            && err.contains("as a full stream")
            && err.contains(&b_parent)
            && err.contains("is gone from the source"),
        "{err}"
    );
    let e = entries(b);
    let n = e.len();
    assert_eq!(e[n - 2]["kind"], "full", "{e:?}");
    assert_eq!(e[n - 1]["kind"], "incremental");

    // Once more with --json.
    fs::remove_file(&hold_b).unwrap();
    change(&sub, 12);
    run_json(a, &sub, &snaps, &keep);
    change(&sub, 13);
    let l = run_json(b, &sub, &snaps, &keep);
    let s = stored(&l);
    assert_eq!(s[0]["kind"], "full", "{l:?}");
    assert_eq!(s[0]["full_reason"], "parent_gone");
    assert!(
        l.iter().any(|x| x["warning"]
            .as_str()
            .is_some_and(|w| w.contains("gone from the source"))),
        "{l:?}"
    );
    ok(&["backup", "verify", "--repo", a, "--read-data"]);
    ok(&["backup", "verify", "--repo", b, "--read-data"]);
}

/// A hold record that is not one (garbage, a symlink) is ignored with a
/// warning on stderr, and a name in it never reaches outside the snapshot
/// directory.
#[test]
fn hostile_hold_records_are_ignored_loudly() {
    const TEST: &str = "hostile_hold_records_are_ignored_loudly";
    if !testing::require_live(TEST) {
        return;
    }
    let (live, sub, snaps) = scratch();
    let work = tempfile::tempdir().unwrap();
    let repo = work.path().join("repo");
    let repo = repo.to_str().unwrap();
    ok(&["backup", "init", "--repo", repo, "--encryption", "none"]);
    change(&sub, 0);
    run_json(repo, &sub, &snaps, &["--keep-snapshots", "0"]);
    let holds = snaps.join(".btrsend-holds");
    // A subvolume outside DIR, which a record names by a path.
    let outside = live.path().join("outside");
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "snapshot", "-r"])
        .arg(&sub)
        .arg(&outside));
    fs::write(
        holds.join("0000000000000000aaaaaaaaaaaaaaaa"),
        r#"{"format":"btrsend-holds","version":1,"repository":"0000000000000000aaaaaaaaaaaaaaaa","repo":"x","updated":"2026-01-01T00:00:00Z","snapshots":[{"subvolume":"home","snapshot":"../outside"}]}"#,
    )
    .unwrap();
    std::os::unix::fs::symlink("/etc/passwd", holds.join("bbbbbbbbbbbbbbbb")).unwrap();
    change(&sub, 1);
    let out = run(&[
        "backup",
        "run",
        "--repo",
        repo,
        "--snapshot",
        sub.to_str().unwrap(),
        "--snapshot-dir",
        snaps.to_str().unwrap(),
        "--keep-snapshots",
        "0",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(
        err.matches("btrsend: warning: ignoring ").count(),
        2,
        "{err}"
    );
    assert!(
        err.contains("0000000000000000aaaaaaaaaaaaaaaa") && err.contains("not a name"),
        "{err}"
    );
    assert!(err.contains("bbbbbbbbbbbbbbbb"), "{err}");
    // Pruned down to the newest stored one; outside untouched.
    assert_eq!(snapshots_in(&snaps).len(), 1);
    assert_eq!(subvolume_show(&outside, "Flags"), "readonly");
}

/// Snapshot names never clash: with the names of the next seconds taken
/// (plain directories), `run --snapshot` takes `NAME_1`, a second run
/// `_1` or `_2`; `--keep-snapshots 1` then deletes the older, so suffixed
/// names are btrsend's. An unchanged subvolume gets no snapshot and the
/// run stores nothing; data written into an existing file (same size) is
/// a change.
#[test]
fn snapshot_names_never_clash_and_unchanged_subvolumes_get_none() {
    const TEST: &str = "snapshot_names_never_clash_and_unchanged_subvolumes_get_none";
    if !testing::require_live(TEST) {
        return;
    }
    let (_live, sub, snaps) = scratch();
    let work = tempfile::tempdir().unwrap();
    let repo = work.path().join("repo");
    let repo = repo.to_str().unwrap();
    ok(&["backup", "init", "--repo", repo, "--encryption", "none"]);
    let now = jiff::Timestamp::now();
    for s in 0..20 {
        let t = now.checked_add(jiff::SignedDuration::from_secs(s)).unwrap();
        let name = format!("home.{}", t.strftime("%Y-%m-%dT%H%M%SZ"));
        fs::create_dir(snaps.join(name)).unwrap();
    }
    let taken_name = |lines: &[Value]| -> String {
        let s = stored(lines);
        assert_eq!(s.len(), 1, "{lines:?}");
        s[0]["path"]
            .as_str()
            .unwrap()
            .strip_prefix("snaps/")
            .unwrap()
            .to_owned()
    };
    change(&sub, 0);
    let first = taken_name(&run_json(repo, &sub, &snaps, &[]));
    assert!(first.ends_with("_1"), "{first}");
    change(&sub, 1);
    let lines = run_json(repo, &sub, &snaps, &["--keep-snapshots", "1"]);
    let second = taken_name(&lines);
    let (stem, seq) = second.rsplit_once('_').unwrap();
    assert!(
        seq == "1" || (seq == "2" && format!("{stem}_1") == first),
        "{second}"
    );
    assert_eq!(summary(&lines)["snapshots_deleted"], 1);
    let subvols: Vec<String> = snapshots_in(&snaps)
        .into_iter()
        .filter(|n| n.contains('_'))
        .collect();
    assert_eq!(subvols, std::slice::from_ref(&second));

    // Nothing changed: no snapshot, nothing stored, and --json says so.
    let before = snapshots_in(&snaps);
    let lines = run_json(repo, &sub, &snaps, &["--keep-snapshots", "1"]);
    let s = summary(&lines);
    assert_eq!(s["snapshots_taken"], 0, "{lines:?}");
    assert_eq!(s["stored"], 0);
    assert_eq!(s["unchanged"], 1);
    let status = lines
        .iter()
        .find(|l| l["unchanged"] == true)
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert_eq!(
        status["newest_snapshot"],
        snaps.join(&second).to_str().unwrap()
    );
    assert_eq!(snapshots_in(&snaps), before);
    assert_eq!(entries(repo).len(), 2);

    // Bytes written into an existing file, its size unchanged.
    let log = sub.join("log");
    let len = fs::metadata(&log).unwrap().len();
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&log).unwrap();
        f.write_all_at(b"X", 0).unwrap();
    }
    assert_eq!(fs::metadata(&log).unwrap().len(), len);
    let lines = run_json(repo, &sub, &snaps, &["--keep-snapshots", "1"]);
    assert_eq!(summary(&lines)["snapshots_taken"], 1, "{lines:?}");
    let third = taken_name(&lines);
    let got = fs::read(snaps.join(&third).join("log")).unwrap();
    assert_eq!(got.first(), Some(&b'X'));
}

/// The default of `--full-every-days` and the holds' directory are the
/// same in the code, `--help`, the README and the systemd unit.
#[test]
fn the_docs_agree_on_full_every_days_and_holds() {
    let days = btrsend::backup::plan::DEFAULT_FULL_EVERY_DAYS;
    let holds = btrsend::backup::holds::HOLDS_DIR;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    let unit = fs::read_to_string(root.join("contrib/btrsend-backup.service")).unwrap();
    let run_help = ok(&["backup", "run", "--help"]);
    let forget_help = ok(&["backup", "forget", "--help"]);
    // Help text is wrapped: compare with runs of spaces and line ends
    // folded.
    let fold = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let (readme, unit, run_help, forget_help) = (
        fold(&readme),
        fold(&unit),
        fold(&run_help),
        fold(&forget_help),
    );
    assert!(
        run_help.contains(&format!("default {days}, about one full stream")),
        "{run_help}"
    );
    assert!(
        run_help.contains(&format!("full one is {days} days older")),
        "{run_help}"
    );
    assert!(run_help.contains(&format!("DIR/{holds}/ID")), "{run_help}");
    assert!(
        forget_help.contains(&format!(
            "full stream is {days} days old (--full-every-days)"
        )),
        "{forget_help}"
    );
    assert!(
        readme.contains(&format!(
            "chain's full stream is {days} days old (`--full-every-days D`"
        )),
        "README"
    );
    assert!(
        readme.contains(&format!(
            "a new full stream every {days} days, `--full-every-days D`"
        )),
        "README"
    );
    assert!(readme.contains(&format!("`DIR/{holds}/ID`")), "README");
    assert!(
        unit.contains(&format!(
            "new full stream every {days} days (--full-every-days)"
        )),
        "{unit}"
    );
    assert!(unit.contains(&format!("snaps/{holds} names")), "{unit}");
}
