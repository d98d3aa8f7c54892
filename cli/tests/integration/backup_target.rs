//! Received-subvolume targets (`backup run/list/forget --target`, issue
//! 33), live (root; required in CI): a seeded series on one loop-mounted
//! btrfs received into another, here and through a real `sshd` on
//! 127.0.0.1 (`btrsend serve` on the far end), judged by the kernel:
//!
//! * every received snapshot has the kernel mount's manifest of its
//!   source (hole maps aside; the mtimes of directories in which the
//!   stream creates orphans without sending their UTIMES are exempt, as
//!   for every btrsend receive), and `btrfs subvolume show` gives it the
//!   source's UUID as its received UUID and the read-only flag;
//! * the stock `btrfs send -p` of two received snapshots is accepted by
//!   the stock `btrfs receive`;
//! * a second run receives nothing; `forget --target --keep-last 2`
//!   keeps the newest two, and the next run's stream is still an
//!   incremental one;
//! * a run killed at 20 points (the client, or the far end's `serve`)
//!   is continued by the next from the far end's resume point (re-sent
//!   stream within the resume bound: a checkpoint interval, 48 MiB, plus
//!   16 MiB) and ends with the source's tree;
//! * through an `--append-only` forced command a target receives but
//!   `forget` is refused and nothing changes; the server's own `forget`
//!   prunes it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use btrsend::manifest::{self, Options};
use btrsend::testing::workload::{Rng, Workload};
use btrsend::testing::{self, LiveBtrfs};
use serde_json::Value;

use crate::common::{btrsend, json_lines, sh, subvolume_show, write_random};
use crate::repo_store::SshServer;

const MIB: u64 = 1 << 20;
/// Snapshots in the series.
const SNAPSHOTS: usize = 6;

/// A source filesystem with its snapshots, a target filesystem, and how
/// to reach the target (a path, or an ssh:// address with its server).
struct Setup {
    src: LiveBtrfs,
    dst: LiveBtrfs,
    /// The target directory on `dst`.
    dir: PathBuf,
    /// `--target`'s value.
    spec: String,
    /// The environment of every command (ssh's).
    env: Vec<(&'static str, String)>,
    _ssh: Option<SshServer>,
    _tmp: tempfile::TempDir,
}

impl Setup {
    /// A target on a fresh btrfs; over ssh (with `options` on the key's
    /// line) when `ssh` is given. `None` when sshd is missing here.
    fn new(test: &str, src: LiveBtrfs, ssh: Option<&str>) -> Option<Setup> {
        let dst = LiveBtrfs::with_options(3 << 30, &[], "").expect("target btrfs");
        let dir = dst.path().join("backup");
        std::fs::create_dir(&dir).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let (spec, env, server) = match ssh {
            Some(options) => {
                let options = options.replace("{DIR}", dir.to_str().unwrap());
                let server = SshServer::start(test, &tmp.path().join("ssh"), &options)?;
                (server.url(&dir), server.envs(), Some(server))
            }
            None => (dir.display().to_string(), Vec::new(), None),
        };
        Some(Setup {
            src,
            dst,
            dir,
            spec,
            env,
            _ssh: server,
            _tmp: tmp,
        })
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = btrsend();
        c.arg("backup")
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// `backup ARGS --target SPEC`, which must succeed: its output.
    fn ok(&self, args: &[&str]) -> Output {
        let mut c = self.cmd(args);
        sh(c.args(["--target", &self.spec]))
    }

    /// `backup run --json --target SPEC SNAPSHOTS...` (paths in the
    /// source's mount): its JSON lines.
    fn run(&self, snaps: &[String]) -> Vec<Value> {
        let mut args = vec!["run", "--json"];
        args.extend(snaps.iter().map(String::as_str));
        json_lines(&String::from_utf8(self.ok(&args).stdout).unwrap())
    }

    /// `backup list --json --target SPEC`.
    fn list(&self) -> Vec<Value> {
        let out = self.ok(&["list", "--json"]);
        serde_json::from_slice::<Value>(&out.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    fn snap(&self, name: &str) -> String {
        self.src
            .path()
            .join("snaps")
            .join(name)
            .display()
            .to_string()
    }
}

/// A seeded series of [`SNAPSHOTS`] snapshots `snaps/vol.I` of `vol`.
fn series(seed: u64) -> LiveBtrfs {
    let live = LiveBtrfs::with_options(2 << 30, &[], "").expect("source btrfs");
    let mnt = live.path().to_path_buf();
    let vol = mnt.join("vol");
    std::fs::create_dir(mnt.join("snaps")).unwrap();
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "create"])
        .arg(&vol));
    let mut w = Workload::new(&vol, seed);
    for i in 0..SNAPSHOTS {
        let step = if i == 0 { w.populate(200) } else { w.run(100) };
        step.unwrap_or_else(|e| panic!("seed {seed}: workload: {e}\n{}", w.log().join("\n")));
        sh(Command::new("btrfs")
            .args(["-q", "subvolume", "snapshot", "-r"])
            .arg(&vol)
            .arg(mnt.join(format!("snaps/vol.{i}"))));
    }
    live
}

/// The received `name` must have the manifest of the source's `name`
/// (the stream `stream` made it from its parent), the source's UUID as
/// its received UUID, and be read-only.
fn check_received(s: &Setup, name: &str, parent: Option<&str>) {
    let mut send = btrsend();
    send.arg("send");
    if let Some(p) = parent {
        send.arg("-p").arg(s.snap(p));
    }
    let stream = sh(send.arg(s.snap(name))).stdout;
    let exempt = testing::compare::orphan_dirs_without_utimes(stream.as_slice()).unwrap();
    let opts = Options::default();
    let want = s.src.manifest(&format!("snaps/{name}"), opts).unwrap();
    let got = manifest::manifest(&s.dir.join(name), opts).unwrap();
    let got = testing::compare::exempt_mtimes(&want, &got, &exempt);
    if let Some(d) = manifest::diff(
        &manifest::strip_holes(&want),
        &manifest::strip_holes(&got),
        30,
    ) {
        panic!(
            "{name} received into {} differs from the source:\n{d}",
            s.spec
        );
    }
    let uuid = subvolume_show(&s.src.path().join("snaps").join(name), "UUID");
    assert_eq!(
        subvolume_show(&s.dir.join(name), "Received UUID"),
        uuid,
        "{name}"
    );
    assert_eq!(
        subvolume_show(&s.dir.join(name), "Flags"),
        "readonly",
        "{name}"
    );
}

/// Cases from one body: `NAME::local` and `NAME::ssh`.
macro_rules! cases {
    ($name:ident, $body:ident) => {
        mod $name {
            #[test]
            fn local() {
                super::$body(concat!(stringify!($name), "::local"), None);
            }
            #[test]
            fn ssh() {
                super::$body(concat!(stringify!($name), "::ssh"), Some(""));
            }
        }
    };
}

cases!(series_into_a_target_matches_the_kernel, series_case);
fn series_case(test: &str, ssh: Option<&str>) {
    if !testing::require_live(test) {
        return;
    }
    let seed = 0x7a_12e7;
    let Some(s) = Setup::new(test, series(seed), ssh) else {
        return;
    };
    let names: Vec<String> = (0..SNAPSHOTS).map(|i| format!("vol.{i}")).collect();
    let paths: Vec<String> = names.iter().map(|n| s.snap(n)).collect();
    // Two runs: the second's first stream is incremental from the first's.
    let first = s.run(&paths[..3]);
    let second = s.run(&paths);
    let received: Vec<&Value> = first
        .iter()
        .chain(&second)
        .filter(|l| l["message_type"] == "received")
        .collect();
    assert_eq!(received.len(), SNAPSHOTS, "{first:?} {second:?}");
    for (i, r) in received.iter().enumerate() {
        assert_eq!(r["name"], names[i].as_str(), "{r}");
        if i == 0 {
            assert_eq!(r["kind"], "full", "{r}");
        } else {
            assert_eq!(r["kind"], "incremental", "{r}");
            assert!(
                r["parent"].as_str().unwrap().ends_with(&names[i - 1]),
                "{r}"
            );
        }
        assert_eq!(r["resumed_from_bytes"], Value::Null, "{r}");
    }
    for (i, n) in names.iter().enumerate() {
        let parent = i.checked_sub(1).map(|p| names[p].as_str());
        check_received(&s, n, parent);
    }
    // The list agrees, and a third run receives nothing.
    let list = s.list();
    assert_eq!(list.len(), SNAPSHOTS, "{list:?}");
    assert!(list.iter().all(|r| r["complete"] == true), "{list:?}");
    let again = s.run(&paths);
    let summary = again.last().unwrap();
    assert_eq!(summary["received"], 0, "{again:?}");
    assert_eq!(summary["already_received"], SNAPSHOTS, "{again:?}");
    // status: one group (vol.N), fresh; stale once older than --max-age.
    let out = s.ok(&["status", "--json", "--max-age", "1h"]);
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["stale"], false, "{st}");
    assert_eq!(st["groups"].as_array().unwrap().len(), 1, "{st}");
    assert_eq!(st["groups"][0]["group"], "vol", "{st}");
    assert_eq!(st["groups"][0]["complete"], SNAPSHOTS, "{st}");
    assert_eq!(
        st["groups"][0]["newest"]["name"],
        names[SNAPSHOTS - 1].as_str(),
        "{st}"
    );
    std::thread::sleep(Duration::from_millis(2100));
    let out = s
        .cmd(&["status", "--max-age", "2", "--target", &s.spec])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(14), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stale"),
        "{out:?}"
    );
    // The stock tools take the received subvolumes for their own.
    let third = LiveBtrfs::with_options(1 << 30, &[], "").expect("third btrfs");
    let (a, b) = (&names[SNAPSHOTS - 2], &names[SNAPSHOTS - 1]);
    let full = sh(Command::new("btrfs")
        .args(["send", "-q"])
        .arg(s.dir.join(a)))
    .stdout;
    let inc = sh(Command::new("btrfs")
        .args(["send", "-q", "-p"])
        .arg(s.dir.join(a))
        .arg(s.dir.join(b)))
    .stdout;
    for stream in [full, inc] {
        let mut rx = Command::new("btrfs")
            .args(["receive", "-q"])
            .arg(third.path())
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut rx.stdin.take().unwrap(), &stream).unwrap();
        let out = rx.wait_with_output().unwrap();
        assert!(out.status.success(), "btrfs receive: {out:?}");
    }
    let opts = Options::default();
    let want = s.src.manifest(&format!("snaps/{b}"), opts).unwrap();
    let got = manifest::manifest(&third.path().join(b), opts).unwrap();
    let got = testing::compare::exempt_mtimes(
        &want,
        &got,
        &testing::compare::orphan_dirs_without_utimes(
            sh(btrsend().args(["send", "-p"]).arg(s.snap(a)).arg(s.snap(b)))
                .stdout
                .as_slice(),
        )
        .unwrap(),
    );
    assert!(
        manifest::diff(
            &manifest::strip_holes(&want),
            &manifest::strip_holes(&got),
            30
        )
        .is_none(),
        "btrfs send -p of the received {b}, received by btrfs receive, differs from the source"
    );
    // Pruning keeps the newest two; the next snapshot is still received
    // incrementally, onto the newest.
    let out = s.ok(&["forget", "--keep-last", "2", "--json"]);
    let verdicts: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let kept: Vec<&str> = verdicts
        .iter()
        .filter(|v| v["action"] == "keep")
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(kept, [b.as_str(), a.as_str()], "{verdicts:?}");
    let left: Vec<String> = s
        .list()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left, [a.clone(), b.clone()]);
    for n in &names[..SNAPSHOTS - 2] {
        assert!(!s.dir.join(n).exists(), "{n} was not deleted");
    }
    let vol = s.src.path().join("vol");
    std::fs::write(vol.join("after-forget"), b"new").unwrap();
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "snapshot", "-r"])
        .arg(&vol)
        .arg(s.src.path().join("snaps/vol.next")));
    let next = s.run(&[s.snap("vol.next")]);
    let r = next
        .iter()
        .find(|l| l["message_type"] == "received")
        .unwrap();
    assert_eq!(r["kind"], "incremental", "{next:?}");
    assert!(r["parent"].as_str().unwrap().ends_with(b.as_str()), "{r}");
    check_received(&s, "vol.next", Some(b));
}

/// `backup run` of `snap` into `s` with the test hook that pauses the
/// sender after `pause` bytes (this run's); `kill` then kills the run or
/// the far end. Whether it paused (else it completed), and its JSON.
fn run_killed(
    s: &Setup,
    snap: &str,
    pause: u64,
    kill: &dyn Fn(&mut std::process::Child),
) -> (bool, Vec<Value>) {
    let mut c = s.cmd(&["run", "--json", "--target", &s.spec, snap]);
    c.env("BTRSEND_TEST_PAUSE_AT", pause.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if line.starts_with("btrsend: test: paused after ") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let paused = rx.recv_timeout(Duration::from_secs(300)).is_ok();
    if paused {
        kill(&mut child);
    }
    let out = child.wait_with_output().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    if !paused {
        assert!(out.status.success(), "{:?}: {stderr}", out.status);
    }
    let lines = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (paused, lines)
}

/// Wait until the target's resume state of `name` stops changing (the
/// far end has applied what reached it), at most 30 s.
fn settle(dir: &Path, name: &str) {
    let state = dir.join(".btrsend-resume").join(name).join("state");
    let stamp = || {
        std::fs::metadata(&state)
            .ok()
            .and_then(|m| m.modified().ok())
    };
    let t = Instant::now();
    let mut last = stamp();
    let mut since = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
        let now = stamp();
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() > Duration::from_millis(1500) {
            return;
        }
    }
}

/// The resume point's offset of the partial `name` on the target.
fn resume_offset(s: &Setup, name: &str) -> Option<u64> {
    let out = btrsend()
        .args(["receive", "--resume-token"])
        .arg(s.dir.join(name))
        .output()
        .unwrap();
    let token = String::from_utf8(out.stdout).ok()?;
    let token = btrsend::resume::Token::parse(token.trim()).ok()?;
    Some(token.offset)
}

#[test]
fn killed_runs_into_a_target_over_ssh_continue() {
    let test = "killed_runs_into_a_target_over_ssh_continue";
    if !testing::require_live(test) {
        return;
    }
    let src = LiveBtrfs::with_options(3 << 30, &[], "").expect("source btrfs");
    let vol = src.path().join("vol");
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "create"])
        .arg(&vol));
    let mut rng = Rng::new(0x2a77);
    for i in 0..100 {
        write_random(&vol.join(format!("f{i:03}")), 10 * MIB as usize, &mut rng);
    }
    std::fs::create_dir(src.path().join("snaps")).unwrap();
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "snapshot", "-r"])
        .arg(&vol)
        .arg(src.path().join("snaps/big")));
    // The far end's program under a name of this test's, so that killing
    // it kills no other test's server.
    let tmp = tempfile::tempdir().unwrap();
    let far = tmp.path().join("btrsend-far-end-of-killed-runs");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_btrsend"), &far).unwrap();
    let Some(mut s) = Setup::new(test, src, Some("")) else {
        return;
    };
    s.env.retain(|(k, _)| *k != "BTRSEND_REMOTE_PATH");
    s.env
        .push(("BTRSEND_REMOTE_PATH", far.display().to_string()));
    let snap = s.snap("big");
    let mut kills = 0;
    let mut prev: Option<u64> = None;
    let mut max_resent = 0;
    let mut log = Vec::new();
    let mut done = None;
    while done.is_none() {
        let pause = 40 * MIB + rng.below(40 * MIB);
        let far_end = kills % 3 == 2;
        let kill = |child: &mut std::process::Child| {
            settle(&s.dir, "big");
            if far_end {
                // The receiver dies where it is; the paused run stays.
                let _ = Command::new("pkill")
                    .args(["-KILL", "-f"])
                    .arg(far.display().to_string())
                    .status();
                std::thread::sleep(Duration::from_millis(300));
            }
            let _ = child.kill();
        };
        let start = resume_offset(&s, "big");
        let (paused, lines) = run_killed(&s, &snap, pause, &kill);
        let received = lines.iter().find(|l| l["message_type"] == "received");
        if let (Some(p), Some(k)) = (prev, start) {
            let resent = p.saturating_sub(k);
            log.push(format!(
                "stopped at {p}, continued from {k}: {resent} re-sent"
            ));
            assert!(resent <= 64 * MIB, "{resent} bytes re-sent: {log:?}");
            max_resent = max_resent.max(resent);
        }
        if paused {
            kills += 1;
            prev = Some(start.unwrap_or(0) + pause);
        } else {
            done = received.cloned();
        }
        assert!(kills <= 60, "no end after 60 kills: {log:?}");
    }
    let r = done.unwrap();
    assert!(kills >= 20, "only {kills} kills before the end: {log:?}");
    assert!(r["resumed_from_bytes"].as_u64().is_some(), "{r}");
    eprintln!("{test}: {kills} kills, at most {max_resent} bytes re-sent");
    check_received(&s, "big", None);
    assert!(!s.dir.join(".btrsend-resume").exists());
}

#[test]
fn append_only_targets_refuse_deletions() {
    let test = "append_only_targets_refuse_deletions";
    if !testing::require_live(test) {
        return;
    }
    let forced = format!(
        "command=\"{} serve --append-only --restrict-to-path {{DIR}}\",restrict",
        env!("CARGO_BIN_EXE_btrsend")
    );
    let Some(s) = Setup::new(test, series(0x51de), Some(&forced)) else {
        return;
    };
    let paths: Vec<String> = (0..3).map(|i| s.snap(&format!("vol.{i}"))).collect();
    let lines = s.run(&paths);
    assert_eq!(lines.last().unwrap()["received"], 3, "{lines:?}");
    let before = s.list();
    let out = s
        .cmd(&["forget", "--keep-last", "1", "--target", &s.spec])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("append-only"), "{err}");
    assert_eq!(s.list(), before);
    // Another directory than the one allowed is refused outright.
    let other = s.dst.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let spec = s.spec.replace("/backup", "/other");
    let out = s.cmd(&["list", "--target", &spec]).output().unwrap();
    assert!(!out.status.success(), "{out:?}");
    // The server's own forget (a local path) prunes.
    sh(btrsend()
        .args(["backup", "forget", "--keep-last", "1", "--target"])
        .arg(&s.dir));
    let left = s.list();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["name"], "vol.2");
}

/// The names in `dir` (subvolumes and directories), sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    v.sort();
    v
}

#[test]
fn keep_snapshots_keeps_what_the_targets_need() {
    let test = "keep_snapshots_keeps_what_the_targets_need";
    if !testing::require_live(test) {
        return;
    }
    let src = LiveBtrfs::with_options(1 << 30, &[], "").expect("source btrfs");
    let vol = src.path().join("vol");
    let snaps = src.path().join("snaps");
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "create"])
        .arg(&vol));
    std::fs::create_dir(&snaps).unwrap();
    let Some(s) = Setup::new(test, src, None) else {
        return;
    };
    let (t1, t2) = (s.dir.join("t1"), s.dir.join("t2"));
    std::fs::create_dir(&t1).unwrap();
    std::fs::create_dir(&t2).unwrap();
    let run = |target: &Path, keep: bool, n: u32| -> Output {
        std::fs::write(vol.join(format!("f{n}")), format!("change {n}")).unwrap();
        // Snapshot names have a second's resolution.
        std::thread::sleep(Duration::from_millis(1100));
        let mut c = btrsend();
        c.args(["backup", "run", "--json", "--target"])
            .arg(target)
            .arg("--snapshot")
            .arg(&vol)
            .arg("--snapshot-dir")
            .arg(&snaps);
        if keep {
            c.args(["--keep-snapshots", "1"]);
        }
        c.output().unwrap()
    };
    // t2 receives A and then is not run again: its hold keeps A.
    sh_ok(run(&t2, false, 0));
    let a = names_in(&snaps);
    assert_eq!(a.len(), 1);
    sh_ok(run(&t1, true, 1));
    sh_ok(run(&t1, true, 2));
    let now = names_in(&snaps);
    assert_eq!(now.len(), 2, "{now:?}");
    assert_eq!(now[0], a[0], "the snapshot t2's hold names was deleted");
    let c = now[1].clone();
    assert_eq!(names_in(&t1).len(), 3);
    assert!(names_in(&t1).contains(&c));
    // A run whose receive fails keeps the newest snapshot t1 has (the
    // next incremental's parent) besides the new one.
    sh(Command::new("chattr").arg("+i").arg(&t1));
    let out = run(&t1, true, 3);
    sh(Command::new("chattr").arg("-i").arg(&t1));
    assert!(!out.status.success(), "{out:?}");
    let now = names_in(&snaps);
    assert_eq!(now.len(), 3, "{now:?}");
    assert!(now.contains(&c), "{c} was deleted: {now:?}");
    // The next run receives the new one, incrementally from c.
    let out = run(&t1, true, 4);
    let lines = json_lines(&String::from_utf8(sh_ok(out).stdout).unwrap());
    let received: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message_type"] == "received")
        .collect();
    assert_eq!(received.len(), 2, "{lines:?}");
    assert!(
        received[0]["parent"].as_str().unwrap().ends_with(&c),
        "{lines:?}"
    );
    // The target's lock: flock(1) on the directory, as another run holds
    // it. A run says so (exit 11) and changes nothing; with --retry-lock
    // it waits for the holder.
    let holder = Command::new("flock")
        .arg(&t1)
        .args(["sleep", "3"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let before = names_in(&t1);
    let out = run(&t1, false, 5);
    assert_eq!(out.status.code(), Some(11), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("locked by"),
        "{out:?}"
    );
    assert_eq!(names_in(&t1), before);
    let out = btrsend()
        .args([
            "backup",
            "forget",
            "--keep-last",
            "1",
            "--retry-lock",
            "20s",
            "--target",
        ])
        .arg(&t1)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut holder = holder;
    assert!(holder.wait().unwrap().success());
    assert_eq!(names_in(&t1).len(), 1);
}

/// `out` of a command that must have succeeded.
fn sh_ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
