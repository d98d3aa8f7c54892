//! Issue 15: a closed standard output behaves the same in every subcommand
//! that writes to it — `send`, `dump`, `receive --dump`, `list`,
//! `manifest`, `completions`, `backup list`/`verify --json`/`restore
//! --stdout`/`forget --dry-run`, and `receive`'s "At snapshot" line: one
//! line saying the output is incomplete, exit status 141 (128 + SIGPIPE,
//! what a shell reports for a command killed by SIGPIPE), no panic,
//! nothing else. `receive` still receives (its line is only a report).

use std::path::Path;
use std::process::{Output, Stdio};

use crate::common::{self, btrsend};

const MESSAGE: &str = "btrsend: error: standard output was closed by its reader (broken pipe): the output it got is incomplete\n";

/// Run btrsend with `args` and a standard output whose reader is gone
/// before the command starts: the first write fails, whatever its size.
///
/// The reader is dropped here, but a child that another test thread is
/// forking at that moment holds a copy of it until its `exec` closes it
/// (close-on-exec). An output small enough for the pipe's buffer can then
/// be written whole and the command succeeds: that run proves nothing, so
/// it is run again (a few times at most; the window is microseconds).
pub fn with_closed_stdout(args: &[&str]) -> Output {
    for _ in 0..20 {
        let out = closed_stdout_once(args);
        if !out.status.success() {
            return out;
        }
    }
    panic!("{args:?}: succeeded 20 times with a closed standard output");
}

fn closed_stdout_once(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    btrsend()
        .args(args)
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

fn check(args: &[&str]) {
    let out = with_closed_stdout(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
    assert_eq!(stderr, MESSAGE, "{args:?}");
}

fn run_ok(args: &[&str]) {
    let out = btrsend().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn closed_pipe_is_the_same_in_every_subcommand() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::unpack(tmp.path(), "001-basic", "dev1.img");
    let stream = common::unpack(tmp.path(), "001-basic", "basic.full.v1.stream");
    let img = img.to_str().unwrap();
    let stream = stream.to_str().unwrap();
    let cases: [&[&str]; 7] = [
        &["send", "--device", img, "snaps/basic"],
        &["dump", "-f", stream],
        &["receive", "--dump", "-f", stream],
        &["list", "--device", img],
        &["list", "--json", "--device", img],
        &["manifest", "--device", img, "snaps/basic"],
        &["completions", "bash"],
    ];
    for args in cases {
        check(args);
    }
}

#[test]
fn closed_pipe_in_backup_and_receive() {
    let tmp = tempfile::tempdir().unwrap();
    let full = common::unpack(tmp.path(), "014-incremental", "s1.full.v1.stream");
    let inc = common::unpack(tmp.path(), "014-incremental", "s1--s2.inc.v1.stream");
    let repo = tmp.path().join("repo");
    let repo = repo.to_str().unwrap();
    run_ok(&["backup", "init", "--repo", repo, "--encryption", "none"]);
    run_ok(&[
        "backup",
        "import",
        "--repo",
        repo,
        full.to_str().unwrap(),
        inc.to_str().unwrap(),
    ]);
    for args in [
        &["backup", "list", "--repo", repo][..],
        &["backup", "list", "--json", "--repo", repo],
        &["backup", "verify", "--json", "--repo", repo],
        &["backup", "restore", "--stdout", "--repo", repo, "s2"],
        &[
            "backup",
            "forget",
            "--dry-run",
            "--keep-last",
            "1",
            "--repo",
            repo,
        ],
    ] {
        check(args);
    }

    // receive -v prints "At snapshot s2" on standard output (as
    // btrfs-progs does) for the incremental stream; the receive itself
    // completes, then the closed pipe is reported.
    // Each try receives into a fresh directory (see with_closed_stdout
    // for why a try can prove nothing).
    let mut tries = 0..20;
    let (out, d) = loop {
        let n = tries.next().expect("receive -v never saw the closed pipe");
        let dir = tmp.path().join(format!("into{n}"));
        std::fs::create_dir(&dir).unwrap();
        let d = dir.to_str().unwrap().to_owned();
        run_ok(&["receive", "--directories", "-f", full.to_str().unwrap(), &d]);
        let out = closed_stdout_once(&[
            "receive",
            "--directories",
            "-v",
            "-f",
            inc.to_str().unwrap(),
            &d,
        ]);
        if !out.status.success() {
            break (out, d);
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    // -v's own stderr lines (btrfs receive -v's "receiving snapshot ...",
    // the writes, then that it is complete), then the one closed-pipe
    // line.
    assert!(
        stderr.starts_with("receiving snapshot s2 uuid=")
            && stderr.ends_with(&format!("\ns2 received completely\n{MESSAGE}")),
        "{stderr}"
    );
    assert!(Path::new(&d).join("s2").is_dir(), "s2 received");
}
