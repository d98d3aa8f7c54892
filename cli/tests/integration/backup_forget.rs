//! `btrsend backup forget` end to end: the policy on imported kernel
//! streams, chains kept whole, exit codes, and a 400-night schedule on a
//! loop-mounted btrfs whose kept entries all restore to the snapshot the
//! kernel mount showed that night.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use btrsend::manifest::{self, Options};
use btrsend::testing::{self, LiveBtrfs};
use serde_json::Value;

use crate::common::{self, sh};
use crate::repo_store::{Backend, Kind, TestRepo};

std::thread_local! {
    /// The S3 server variables of the test running on this thread (none
    /// for a directory): every command the helpers run gets them.
    static S3_ENV: std::cell::RefCell<Vec<(&'static str, String)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// `btrsend`, pointed at this thread's S3 server if there is one.
fn btrsend() -> Command {
    let mut c = common::btrsend();
    S3_ENV.with_borrow(|e| c.envs(e.iter().cloned()));
    c
}

/// The backend for a test; later commands on this thread use it.
fn backend(kind: Kind, test: &str, dir: &Path) -> Option<Backend> {
    let be = Backend::new(kind, test, dir)?;
    S3_ENV.set(be.envs());
    Some(be)
}

/// Three tests from one body: `NAME::dir`, `NAME::s3` and `NAME::ssh`.
macro_rules! both {
    ($name:ident, $body:ident) => {
        mod $name {
            #[test]
            fn dir() {
                super::$body(super::Kind::Dir, concat!(stringify!($name), "::dir"));
            }
            #[test]
            fn s3() {
                super::$body(super::Kind::S3, concat!(stringify!($name), "::s3"));
            }
            #[test]
            fn ssh() {
                super::$body(super::Kind::Ssh, concat!(stringify!($name), "::ssh"));
            }
        }
    };
}

pub(crate) fn run(args: &[&str]) -> Output {
    btrsend()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run btrsend")
}

#[track_caller]
pub(crate) fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "btrsend {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `forget --json` (a dry run unless `delete`): id -> (action, reasons).
fn decisions(repo: &str, policy: &[&str], delete: bool) -> BTreeMap<u64, (String, Vec<String>)> {
    let mut args = vec!["backup", "forget", "--repo", repo, "--json"];
    if !delete {
        args.push("--dry-run");
    }
    args.extend_from_slice(policy);
    let rows: Value = serde_json::from_str(&ok(&args)).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let reasons = r["reasons"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_owned())
                .collect();
            (
                r["id"].as_u64().unwrap(),
                (r["action"].as_str().unwrap().to_owned(), reasons),
            )
        })
        .collect()
}

/// `backup list --json`: path -> id.
pub(crate) fn listed(repo: &str) -> BTreeMap<String, u64> {
    let rows: Value =
        serde_json::from_str(&ok(&["backup", "list", "--repo", repo, "--json"])).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap().to_owned(),
                r["id"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn import(repo: &str, time: &str, origin: Option<&str>, file: &Path) {
    let mut args = vec!["backup", "import", "--repo", repo, "--time", time];
    if let Some(o) = origin {
        args.extend(["--origin", o]);
    }
    args.push(file.to_str().unwrap());
    ok(&args);
}

both!(forget_keeps_what_the_policy_and_the_chains_need, keeps_case);
fn keeps_case(kind: Kind, test: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(be) = backend(kind, test, dir.path()) else {
        return;
    };
    let r = be.repo("repo");
    let repo = r.spec.as_str();
    ok(&["backup", "init", "--repo", repo, "--encryption", "none"]);
    let inc = common::fixture_dir("014-incremental");
    let clones = common::fixture_dir("015-clone-sources");
    // Origin "imported": s1 (full) <- s2, then s3 as a new full stream.
    import(
        repo,
        "2025-01-01T10:00:00Z",
        None,
        &inc.join("s1.full.v1.stream.zst"),
    );
    import(
        repo,
        "2025-01-02T10:00:00Z",
        None,
        &inc.join("s1--s2.inc.v1.stream.zst"),
    );
    import(
        repo,
        "2025-01-03T10:00:00Z",
        None,
        &inc.join("s3.full.v1.stream.zst"),
    );
    // Another origin, older than all of them.
    import(
        repo,
        "2024-06-01T10:00:00Z",
        Some("other"),
        &clones.join("a1.full.v1.stream.zst"),
    );
    let ids = listed(repo);
    let (s1, s2, s3, a1) = (ids["s1"], ids["s2"], ids["s3"], ids["a1"]);
    let keep = |r: &[&str]| ("keep".to_owned(), r.iter().map(|s| s.to_string()).collect());
    let delete = || ("delete".to_owned(), Vec::<String>::new());

    // --keep-last 1, per origin: s3 and a1; s2 and s1 go.
    let d = decisions(repo, &["--keep-last", "1"], false);
    assert_eq!(d[&s3], keep(&["last"]));
    assert_eq!(d[&a1], keep(&["last"]));
    assert_eq!(d[&s2], delete());
    assert_eq!(d[&s1], delete());
    // --keep-last 2 --no-synthesize: s2 is kept, and with it its parent
    // s1.
    let d = decisions(repo, &["--keep-last", "2", "--no-synthesize"], false);
    assert_eq!(d[&s2], keep(&["last"]));
    assert_eq!(d[&s1], keep(&[&format!("parent of {s2}")]));
    // --keep-last 2: s2 gets a synthetic full stream, so s1 can go.
    let rows: Value = serde_json::from_str(&ok(&[
        "backup",
        "forget",
        "--repo",
        repo,
        "--json",
        "--dry-run",
        "--keep-last",
        "2",
    ]))
    .unwrap();
    let row = |id: u64| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(
        (&row(s2)["action"], &row(s2)["synthesize"]),
        (&"keep".into(), &true.into())
    );
    assert_eq!(row(s1)["action"], "delete");
    assert_eq!(row(s3)["synthesize"], false);
    // --keep-daily 5 with three days: all kept, the oldest as a day too
    // (and as the parent of s2).
    let d = decisions(repo, &["--keep-daily", "5"], false);
    assert_eq!(d[&s1], keep(&["daily", &format!("parent of {s2}")]));
    assert_eq!(d[&s3], keep(&["daily"]));
    // The dry runs deleted nothing; the human form says what would go.
    assert_eq!(listed(repo).len(), 4);
    let text = ok(&[
        "backup",
        "forget",
        "--repo",
        repo,
        "--dry-run",
        "--keep-last",
        "1",
    ]);
    // s1 and s2 hold these bytes (the files' sizes).
    let freed: u64 = ["s1", "s2"]
        .iter()
        .map(|n| {
            let rows: Value =
                serde_json::from_str(&ok(&["backup", "list", "--repo", repo, "--json"])).unwrap();
            let e = rows
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["path"] == *n)
                .unwrap()
                .clone();
            fs::metadata(r.files.join(e["file"].as_str().unwrap()))
                .unwrap()
                .len()
        })
        .sum();
    assert!(
        text.contains("would delete")
            && text.ends_with(&format!(
                "2 kept, 2 would delete; {freed} bytes of stream files to delete\n"
            )),
        "{text}"
    );

    // An empty policy deletes nothing and is a usage error.
    for empty in [&[][..], &["--keep-last", "0"][..]] {
        let mut args = vec!["backup", "forget", "--repo", repo];
        args.extend_from_slice(empty);
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{empty:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("refusing an empty policy"), "{err}");
    }
    for bad in [&["--keep-daily", "-2"][..], &["--keep-within", "1w"][..]] {
        let mut args = vec!["backup", "forget", "--repo", repo];
        args.extend_from_slice(bad);
        assert_eq!(run(&args).status.code(), Some(2), "{bad:?}");
    }
    assert_eq!(listed(repo).len(), 4);

    // The real thing with --keep-last 2: s2's stream is replaced by a
    // synthetic full stream (same entry, now full, made from s1 and s2),
    // s1 goes; the repository verifies and s2 restores to the kernel's
    // tree below (root).
    let out = run(&["backup", "forget", "--repo", repo, "--keep-last", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after: Value =
        serde_json::from_str(&ok(&["backup", "list", "--repo", repo, "--json"])).unwrap();
    let e2 = after
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == s2)
        .unwrap()
        .clone();
    assert_eq!(e2["kind"], "full", "{e2}");
    assert_eq!(e2["parent_id"], Value::Null, "{e2}");
    assert_eq!(e2["synthesized_from"], serde_json::json!([s1, s2]), "{e2}");
    assert_eq!(listed(repo).keys().collect::<Vec<_>>(), ["a1", "s2", "s3"]);
    assert_eq!(fs::read_dir(r.files.join("streams")).unwrap().count(), 3);
    ok(&["backup", "verify", "--repo", repo, "--read-data"]);
    let restored_s2 = dir.path().join("restored-s2");
    fs::create_dir(&restored_s2).unwrap();
    let s2_restore = run(&[
        "backup",
        "restore",
        "--repo",
        repo,
        "s2",
        "--to",
        restored_s2.to_str().unwrap(),
    ]);

    // Then --keep-last 1: silent without a terminal, s2 gone with its
    // file, the rest verifies.
    let out = run(&["backup", "forget", "--repo", repo, "--keep-last", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
    let left = listed(repo);
    assert_eq!(left.keys().collect::<Vec<_>>(), ["a1", "s3"]);
    let files = fs::read_dir(r.files.join("streams")).unwrap().count();
    assert_eq!(files, 2);
    ok(&["backup", "verify", "--repo", repo, "--read-data"]);
    // A missing repository is exit 10, as for every backup command.
    let gone = dir.path().join("nothing");
    let out = run(&[
        "backup",
        "forget",
        "--repo",
        gone.to_str().unwrap(),
        "--keep-last",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(10));

    // What is left restores to the kernel's tree (root: owners).
    if !rustix::process::geteuid().is_root() {
        testing::skip_or_fail(
            "forget_keeps_what_the_policy_and_the_chains_need (restore)",
            "needs root",
        );
        return;
    }
    let to = dir.path().join("restored");
    fs::create_dir(&to).unwrap();
    ok(&[
        "backup",
        "restore",
        "--repo",
        repo,
        "s3",
        "--to",
        to.to_str().unwrap(),
    ]);
    let got = manifest::manifest(&to.join("s3"), Options { holes: true }).unwrap();
    let want = fs::read_to_string(inc.join("s3.manifest")).unwrap();
    assert_eq!(got, want);
    // The synthetic full stream of s2 restored as the kernel's s2. Not
    // its hole map: the kernel's incremental stream s1--s2 sends a hole
    // punched in data-punch as written zeros, so the chain (and the full
    // stream made from it) restores them as data.
    assert!(
        s2_restore.status.success(),
        "{}",
        String::from_utf8_lossy(&s2_restore.stderr)
    );
    let got = manifest::manifest(&restored_s2.join("s2"), Options::default()).unwrap();
    let want = fs::read_to_string(inc.join("s2.manifest")).unwrap();
    assert_eq!(got, manifest::strip_holes(&want));
}

// kill -9 of a synthesizing `forget` at 24 points in time and at each of
// its 6 steps: the repository always lists
// either every entry or the final ones, verifies, and a rerun of forget
// ends with the final ones and no file of a deleted entry.
both!(
    forget_killed_at_any_moment_leaves_a_consistent_repository,
    killed_case
);
fn killed_case(kind: Kind, test: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(be) = backend(kind, test, dir.path()) else {
        return;
    };
    let b = be.repo("base");
    let (base, base_s) = (&b.files, b.spec.as_str());
    ok(&["backup", "init", "--repo", base_s, "--encryption", "none"]);
    let inc = common::fixture_dir("014-incremental");
    let clones = common::fixture_dir("015-clone-sources");
    let files = [
        (&inc, "s1.full.v1.stream.zst", None),
        (&inc, "s1--s2.inc.v1.stream.zst", None),
        (&inc, "s2--s3.inc.v1.stream.zst", None),
        (&clones, "b1.full.v1.stream.zst", None),
        (&clones, "b2.full.v1.stream.zst", None),
        (&clones, "a1.full.v1.stream.zst", Some("a")),
        (&clones, "a1--a2.inc.v1.stream.zst", Some("a")),
        (&clones, "a2--a3.inc.v1.stream.zst", Some("a")),
    ];
    for (day, (fixture, name, origin)) in files.iter().enumerate() {
        let time = format!("2025-02-{:02}T12:00:00Z", day + 1);
        import(base_s, &time, *origin, &fixture.join(name));
    }
    let all = listed(base_s);
    // --keep-last 1: b2 of "imported" (a full stream), and a3 of "a",
    // which gets a synthetic full stream made from its chain a1 <- a2 <-
    // a3 (whose a2 clones from b1), so a1 and a2 go. Each kill lands
    // before the new catalog (every entry listed, a3 incremental; maybe a
    // stream file no entry names) or after it.
    let end: Vec<&str> = vec!["a3", "b2"];
    // How long a whole forget takes here: the kill points spread over it.
    // (A copy of the files is a copy of the repository, on the S3 server
    // too.)
    let whole = be.repo("whole");
    sh(Command::new("cp").arg("-a").arg(base).arg(&whole.files));
    let started = std::time::Instant::now();
    ok(&[
        "backup",
        "forget",
        "--repo",
        &whole.spec,
        "--keep-last",
        "1",
    ]);
    let took = started.elapsed();
    // After the kill: either catalog, a repository that verifies, and a
    // forget run again that ends as one never killed, whose a3 restores.
    let after_kill = |point: &str, r: &TestRepo, last_step: Option<bool>| {
        let (repo, repo_s) = (&r.files, r.spec.as_str());
        let now = listed(repo_s);
        let names: Vec<&str> = now.keys().map(String::as_str).collect();
        match last_step {
            // Before the new catalog, or after it.
            Some(false) => assert!(now == all, "{point}: {names:?}"),
            Some(true) => assert_eq!(names, end, "{point}"),
            None => assert!(now == all || names == end, "{point}: {names:?}"),
        }
        let leftovers = fs::read_dir(repo.join("streams")).unwrap().count() - now.len();
        eprintln!(
            "kill {point}: {} entries listed, {leftovers} leftover files",
            now.len()
        );
        ok(&["backup", "verify", "--repo", repo_s, "--read-data"]);
        ok(&["backup", "forget", "--repo", repo_s, "--keep-last", "1"]);
        let names: Vec<String> = listed(repo_s).into_keys().collect();
        assert_eq!(names, end, "{point}");
        assert_eq!(
            fs::read_dir(repo.join("streams")).unwrap().count(),
            end.len()
        );
        ok(&["backup", "verify", "--repo", repo_s, "--read-data"]);
        // a3, now a synthetic full stream, restores to the kernel's a3
        // (root: owners).
        if rustix::process::geteuid().is_root() {
            let to = dir.path().join(format!("restored-{point}"));
            fs::create_dir(&to).unwrap();
            ok(&[
                "backup",
                "restore",
                "--repo",
                repo_s,
                "a3",
                "--to",
                to.to_str().unwrap(),
            ]);
            let got = manifest::manifest(&to.join("a3"), Options { holes: true }).unwrap();
            let want = fs::read_to_string(clones.join("a3.manifest")).unwrap();
            assert_eq!(got, want, "{point}");
            fs::remove_dir_all(&to).unwrap();
        }
    };
    for point in 0..24u32 {
        let r = be.repo(&format!("r{point}"));
        sh(Command::new("cp").arg("-a").arg(base).arg(&r.files));
        let mut child = btrsend()
            .args(["backup", "forget", "--repo", &r.spec, "--keep-last", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(took * point / 20);
        let _ = child.kill();
        let _ = child.wait();
        after_kill(&format!("at point {point}"), &r, None);
    }
    // And at each step of the synthesis, where a test hook stops the
    // process for good until it is killed: every window between two
    // durable changes.
    let steps = btrsend::backup::synthesize::PAUSE_STEPS;
    for (i, step) in steps.iter().enumerate() {
        let r = be.repo(&format!("step-{step}"));
        sh(Command::new("cp").arg("-a").arg(base).arg(&r.files));
        let err = dir.path().join(format!("{step}.stderr"));
        let mut child = btrsend()
            .args(["backup", "forget", "--repo", &r.spec, "--keep-last", "1"])
            .env("BTRSEND_TEST_PAUSE_SYNTH", step)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let waiting = std::time::Instant::now();
        let said = format!("test pause at {step}");
        while !fs::read_to_string(&err).unwrap().contains(&said) {
            assert!(
                child.try_wait().unwrap().is_none() && waiting.elapsed().as_secs() < 120,
                "forget never paused at {step}: {}",
                fs::read_to_string(&err).unwrap()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        let committed = steps.iter().position(|s| *s == "committed").unwrap();
        after_kill(&format!("at step {step}"), &r, Some(i >= committed));
    }
}

/// One night's changes: plain creates, rewrites, appends, deletes,
/// renames, a directory, a hard link and an xattr now and then, so that
/// the kernel's own stream reproduces the snapshot exactly.
pub(crate) fn change(root: &Path, night: u32) {
    let f = |i: u32| root.join(format!("f{:02}", i % 40));
    fs::write(
        f(night),
        format!("night {night}\n").repeat((night % 13 + 1) as usize),
    )
    .unwrap();
    let log = root.join("log");
    let mut text = fs::read_to_string(&log).unwrap_or_default();
    text.push_str(&format!("{night}\n"));
    fs::write(&log, text).unwrap();
    let _ = fs::remove_file(f(night + 17));
    let d = root.join(format!("d{}", night % 5));
    fs::create_dir_all(&d).unwrap();
    if f(night + 3).exists() {
        fs::rename(f(night + 3), d.join(format!("moved{night}"))).unwrap();
    }
    if night.is_multiple_of(7) {
        let _ = fs::hard_link(&log, d.join(format!("link{night}")));
    }
    if night.is_multiple_of(11) {
        sh(Command::new("setfattr")
            .args(["-n", "user.night", "-v", &night.to_string()])
            .arg(f(night)));
    }
    if night.is_multiple_of(9) {
        let _ = fs::remove_dir_all(root.join(format!("d{}", (night + 2) % 5)));
    }
}

/// ≥ 400 nights: each night changes the subvolume, takes a read-only
/// snapshot, has the kernel send it (a full stream every 10th night, else
/// an incremental from the night before), imports it with that night's
/// time and runs forget, which synthesizes full streams; the kernel's
/// snapshot of the night before is then deleted (the repository is all
/// that is left of it). Every night, each entry that got a synthetic full
/// stream restores to the manifest of its night's kernel mount, and
/// nothing is kept below the oldest entry the policy keeps in each chain
/// (the repository is bounded by the policy). At the end every kept
/// entry must restore to the manifest of its night's kernel mount.
#[test]
fn four_hundred_nights_of_import_and_forget() {
    const TEST: &str = "four_hundred_nights_of_import_and_forget";
    const NIGHTS: u32 = 400;
    if !testing::require_live(TEST) {
        return;
    }
    let live = LiveBtrfs::with_options(2 << 30, &[], "").expect("scratch btrfs");
    let mnt = live.path();
    let sub = mnt.join("home");
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "create"])
        .arg(&sub));
    let work = tempfile::tempdir().unwrap();
    let repo = work.path().join("repo");
    let repo = repo.to_str().unwrap();
    ok(&["backup", "init", "--repo", repo, "--encryption", "none"]);
    let policy = [
        "--keep-daily",
        "7",
        "--keep-weekly",
        "4",
        "--keep-monthly",
        "6",
        "--keep-yearly",
        "2",
    ];
    let start: jiff::Timestamp = "2024-01-01T02:00:00Z".parse().unwrap();
    let manifests: std::cell::RefCell<BTreeMap<String, String>> = Default::default();
    // Entry `id` restores to the manifest of the night `name` was taken.
    let restores = |name: &str, id: u64, when: &str| {
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
        let got = manifest::manifest(&to.join(name), Options::default()).unwrap();
        assert!(
            got == manifests.borrow()[name],
            "{when}: {name} (entry {id}) restores to another tree"
        );
        fs::remove_dir_all(&to).unwrap();
    };
    let mut most = 0;
    let mut synthesized = 0;
    for night in 0..NIGHTS {
        change(&sub, night);
        let name = format!("home.{night:03}");
        let snap = mnt.join(&name);
        sh(Command::new("btrfs")
            .args(["-q", "subvolume", "snapshot", "-r"])
            .arg(&sub)
            .arg(&snap));
        manifests.borrow_mut().insert(
            name.clone(),
            manifest::manifest(&snap, Options::default()).unwrap(),
        );
        let stream = work.path().join("night.stream");
        let mut send = Command::new("btrfs");
        send.args(["-q", "send", "-f"]).arg(&stream);
        if !night.is_multiple_of(10) {
            send.arg("-p")
                .arg(mnt.join(format!("home.{:03}", night - 1)));
        }
        sh(send.arg(&snap));
        let time = start
            .checked_add(jiff::SignedDuration::from_hours(24 * i64::from(night)))
            .unwrap()
            .to_string();
        import(repo, &time, Some("home"), &stream);
        let mut forget = vec!["backup", "forget", "--repo", repo, "--json"];
        forget.extend_from_slice(&policy);
        let rows: Value = serde_json::from_str(&ok(&forget)).unwrap();
        let rows = rows.as_array().unwrap();
        let by_id: BTreeMap<u64, &Value> = rows
            .iter()
            .map(|r| (r["id"].as_u64().unwrap(), r))
            .collect();
        for r in rows.iter().filter(|r| r["kept_for_chain"] == true) {
            // A kept entry the policy keeps lies below it in its chain.
            let mut cur = r;
            let held = loop {
                match cur["parent_id"].as_u64().map(|p| by_id[&p]) {
                    Some(p) if p["action"] == "keep" && p["kept_for_chain"] == false => {
                        break true;
                    }
                    Some(p) => cur = p,
                    None => break false,
                }
            };
            assert!(
                held,
                "night {night}: {r} is kept below the policy's entries"
            );
        }
        for r in rows.iter().filter(|r| r["synthesize"] == true) {
            let (name, id) = (r["path"].as_str().unwrap(), r["id"].as_u64().unwrap());
            restores(name, id, &format!("night {night}, synthesized"));
            synthesized += 1;
        }
        if night > 0 {
            sh(Command::new("btrfs")
                .args(["-q", "subvolume", "delete"])
                .arg(mnt.join(format!("home.{:03}", night - 1))));
        }
        most = most.max(listed(repo).len());
    }
    ok(&["backup", "verify", "--repo", repo, "--read-data"]);
    let kept = listed(repo);
    // From Monday 2024-01-01 to night 399 (Monday 2025-02-03): 7 days, 2
    // more weeks and 4 more months (the years coincide with them), plus
    // what lies between kept entries of a chain (a full stream every 10
    // nights: at most 9 for each of the at most 19 entries the policy
    // keeps).
    assert!(kept.len() >= 13, "{kept:?}");
    assert!(most <= 19 * 10, "the repository grew to {most} entries");
    assert!(synthesized > 0, "no synthetic full stream in 400 nights");
    eprintln!("{TEST}: {synthesized} synthetic full streams, at most {most} entries");
    let newest = format!("home.{:03}", NIGHTS - 1);
    assert!(kept.contains_key(&newest), "{kept:?}");
    for (name, id) in &kept {
        restores(name, *id, "at the end");
    }
}
