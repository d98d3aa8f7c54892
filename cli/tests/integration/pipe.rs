//! Issue 15: a closed standard output behaves the same in every subcommand
//! that writes to it — `send`, `dump`, `receive --dump`, `list`,
//! `manifest`, `completions`: one line saying the output is incomplete,
//! exit status 141 (128 + SIGPIPE, what a shell reports for a command killed
//! by SIGPIPE), no panic, nothing else.

use std::process::Stdio;

use crate::common::{self, btrsend};

const MESSAGE: &str = "btrsend: error: standard output was closed by its reader (broken pipe): the output it got is incomplete\n";

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
        // A pipe whose reader is gone before the command starts: the first
        // write fails, whatever its size.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = btrsend()
            .args(args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
        assert_eq!(stderr, MESSAGE, "{args:?}");
    }
}
