//! `btrsend send` end to end (issue 4): the real binary on a kernel-made
//! fixture image prints a stream whose `btrsend dump` equals the kernel's
//! stored `btrfs receive --dump` of its own stream; `-f` writes the same
//! bytes; bad arguments fail with exit status 1 and a closed pipe with 141, each with a
//! clear message, never a panic; a terminal is refused.

use std::io::Read;
use std::process::{Command, Stdio};

use crate::common;
use crate::common::{btrsend, dump};

const FIXTURE: &str = "001-basic";

#[test]
fn send_to_stdout_and_file_match_the_kernel_dump() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::unpack(tmp.path(), FIXTURE, "dev1.img");
    for (version, args, stored) in [
        ("v1", &[][..], "basic.full.v1.dump"),
        ("v2c", &["--compressed-data"][..], "basic.full.v2c.dump"),
    ] {
        let out = btrsend()
            .arg("send")
            .arg("--device")
            .arg(&img)
            .args(args)
            .arg("snaps/basic")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{version}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stderr.is_empty(), "{version}: quiet on success");
        let stdout_file = tmp.path().join(format!("stdout.{version}"));
        std::fs::write(&stdout_file, &out.stdout).unwrap();
        let expected = std::fs::read_to_string(common::fixture_dir(FIXTURE).join(stored)).unwrap();
        assert_eq!(dump(&stdout_file), expected, "{version}");

        let file = tmp.path().join(format!("f.{version}"));
        let st = btrsend()
            .arg("send")
            .arg("-d")
            .arg(&img)
            .args(args)
            .arg("-f")
            .arg(&file)
            .arg("id:257")
            .status()
            .unwrap();
        assert!(st.success());
        assert_eq!(std::fs::read(&file).unwrap(), out.stdout, "{version}: -f");

        // Any number of data threads writes the same (kernel-equal) stream.
        for threads in ["0", "3"] {
            let t = btrsend()
                .args(["send", "--threads", threads, "-d"])
                .arg(&img)
                .args(args)
                .arg("snaps/basic")
                .output()
                .unwrap();
            assert!(t.status.success(), "{version} --threads {threads}");
            assert!(
                t.stdout == out.stdout,
                "{version}: --threads {threads} changed the stream"
            );
        }
    }
}

#[test]
fn closed_pipe_is_a_clear_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::unpack(tmp.path(), FIXTURE, "dev1.img");
    let mut child = btrsend()
        .arg("send")
        .arg("--device")
        .arg(&img)
        .arg("snaps/basic")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut head = [0u8; 17];
    stdout.read_exact(&mut head).unwrap();
    assert_eq!(&head[..13], b"btrfs-stream\0");
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert_eq!(
        stderr,
        "btrsend: error: standard output was closed by its reader (broken pipe): the output it got is incomplete\n"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_arguments_fail_with_status_1() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::unpack(tmp.path(), FIXTURE, "dev1.img");
    for (args, msg) in [
        (
            vec!["snaps/nope"],
            "btrsend: error: no subvolume snaps/nope\n",
        ),
        (vec!["id:99999"], "btrsend: error: no subvolume id:99999\n"),
    ] {
        let out = btrsend()
            .arg("send")
            .arg("-d")
            .arg(&img)
            .args(&args)
            .stdout(Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), msg, "{args:?}");
        assert!(out.stdout.is_empty());
    }
    // Several SUBVOLs: every one is found before anything is written, so
    // a wrong second one leaves no stream of the first (issue 15).
    let file = tmp.path().join("several.stream");
    let out = btrsend()
        .arg("send")
        .arg("-d")
        .arg(&img)
        .arg("-f")
        .arg(&file)
        .args(["snaps/basic", "snaps/nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "btrsend: error: no subvolume snaps/nope\n"
    );
    assert!(!file.exists(), "nothing written");
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        1,
        "only the image: no temporary file"
    );
    let out = btrsend()
        .args(["send", "-d", "/nonexistent/img", "snaps/basic"])
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/img"), "{stderr}");
}

/// With `script` (util-linux) standard output is a terminal.
#[test]
fn refuses_to_write_to_a_terminal() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::unpack(tmp.path(), FIXTURE, "dev1.img");
    let cmd = format!(
        "{} send -d {} snaps/basic",
        env!("CARGO_BIN_EXE_btrsend"),
        img.display()
    );
    let out = match Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "script(1) needed in CI: {e}"
            );
            eprintln!("=== SKIPPED refuses_to_write_to_a_terminal: no script(1): {e} ===");
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("not writing a binary send stream to a terminal"),
        "{text}"
    );
    assert!(!text.contains("btrfs-stream"), "{text}");
    assert_eq!(out.status.code(), Some(1));
}

/// Issue 15: options that conflict are a usage error (exit 2, as clap's
/// own), caught before anything is read or written.
#[test]
fn conflicting_options_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::unpack(tmp.path(), FIXTURE, "dev1.img");
    let stream = tmp.path().join("s");
    for (args, msg) in [
        (
            vec!["--proto", "1", "--compressed-data"],
            "btrsend: error: --compressed-data needs protocol 2 or later (--proto 1 given)\n",
        ),
        (
            vec!["--proto", "9"],
            "error: invalid value '9' for '--proto <N>'\n  [possible values: 0, 1, 2, 3]\n\nFor more information, try '--help'.\n",
        ),
    ] {
        let out = btrsend()
            .arg("send")
            .arg("-d")
            .arg(&img)
            .args(&args)
            .arg("-f")
            .arg(&stream)
            .arg("snaps/basic")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), msg, "{args:?}");
        assert!(!stream.exists(), "{args:?}: no stream file");
    }
}

/// Issue 15: whatever `send --proto N` writes, `dump` and `receive` read —
/// version 3 too. The commands of a v3 stream of the fixture equal the
/// kernel's v2 ones (`btrfs receive --dump` of its stored stream: v3 adds
/// only ENABLE_VERITY, which the fixture does not need), and receiving it
/// gives the manifest the fixture generator took of the kernel's mount.
#[test]
fn proto_3_is_read_by_dump_and_receive() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::unpack(tmp.path(), FIXTURE, "dev1.img");
    let stream = tmp.path().join("v3.stream");
    let got = common::send_dump(
        &img,
        &["--proto", "3", "--compressed-data"],
        &stream,
        "snaps/basic",
    );
    let bytes = std::fs::read(&stream).unwrap();
    assert_eq!(&bytes[..17], b"btrfs-stream\0\x03\0\0\0", "a v3 header");
    let expected =
        std::fs::read_to_string(common::fixture_dir(FIXTURE).join("basic.full.v2c.dump")).unwrap();
    assert_eq!(got, expected);
    // `receive --dump` is the same reader.
    let out = btrsend()
        .args(["receive", "--dump", "-f"])
        .arg(&stream)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);
    let dir = tmp.path().join("recv");
    std::fs::create_dir(&dir).unwrap();
    let out = btrsend()
        .args(["receive", "-f"])
        .arg(&stream)
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest = btrsend()
        .args(["manifest", "--holes"])
        .arg(dir.join("basic"))
        .output()
        .unwrap();
    let want =
        std::fs::read_to_string(common::fixture_dir(FIXTURE).join("basic.manifest")).unwrap();
    let got = String::from_utf8(manifest.stdout).unwrap();
    // ext4 and XFS (a temporary directory's usual home) clamp times before
    // 1901-12-13; the fixture has one such file.
    let got = btrsend::testing::compare::exempt_mtimes(&want, &got, &["times/year-1901".into()]);
    assert_eq!(got, want);
}

/// Issue 15: `send --help` states what data verification costs as
/// measured (CPU time per GiB), not "a few percent", and how to skip it;
/// and documents --degraded.
#[test]
fn help_states_the_verification_cost_and_degraded() {
    let out = btrsend().args(["send", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(!help.contains("few percent"), "{help}");
    assert!(help.contains("about 0.1 s per GiB of file data"), "{help}");
    assert!(
        help.contains("--no-verify-data skips verification and sends data unchecked"),
        "{help}"
    );
    assert!(help.contains("--degraded"), "{help}");
    assert!(help.contains("as `mount -o degraded` does"), "{help}");
    // The summary says full or incremental, in --help, -h and the
    // subcommand list.
    for args in [&["send", "--help"][..], &["send", "-h"], &["--help"]] {
        let out = btrsend().args(args).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains("Write a full or incremental send stream"),
            "{args:?}: {text}"
        );
    }
}

/// The length of a stored kernel stream (`tests/fixtures/<fx>/<stem>.stream.zst`).
fn kernel_stream_len(fixture: &str, stem: &str) -> u64 {
    let path = common::fixture_dir(fixture).join(format!("{stem}.stream.zst"));
    let bytes = zstd::decode_all(std::fs::File::open(&path).unwrap()).unwrap();
    u64::try_from(bytes.len()).unwrap()
}

/// `send --estimate` prints the length of the kernel's stream of the
/// same send (full and incremental, v1 and v2 --compressed-data, on the
/// compression fixture); `--json` says the same and counts the commands
/// the kernel's stream has; the options that make no sense with it exit 2.
#[test]
fn estimate_prints_the_kernels_stream_length() {
    const FX: &str = "006-compression";
    let tmp = tempfile::tempdir().unwrap();
    let img = common::unpack(tmp.path(), FX, "dev1.img");
    let cases: [(&[&str], &str); 4] = [
        (&["snaps/c1"], "c1.full.v1"),
        (&["--compressed-data", "snaps/c2"], "c2.full.v2c"),
        (&["-p", "snaps/c1", "snaps/c2"], "c1--c2.inc.v1"),
        (
            &["--compressed-data", "-p", "snaps/c1", "snaps/c2"],
            "c1--c2.inc.v2c",
        ),
    ];
    for (args, stem) in cases {
        let out = btrsend()
            .args(["send", "--estimate", "--device"])
            .arg(&img)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed: u64 = String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(printed, kernel_stream_len(FX, stem), "{stem}");
    }
    // --json: the same length, and the kernel stream's command counts.
    let out = btrsend()
        .args([
            "send",
            "--estimate",
            "--json",
            "--compressed-data",
            "--device",
        ])
        .arg(&img)
        .arg("snaps/c2")
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stream_bytes"], kernel_stream_len(FX, "c2.full.v2c"));
    let dump = std::fs::read_to_string(common::fixture_dir(FX).join("c2.full.v2c.dump")).unwrap();
    let count = |word: &str| {
        dump.lines()
            .filter(|l| l.split_whitespace().next() == Some(word))
            .count() as u64
    };
    assert_eq!(v["by_command"]["ENCODED_WRITE"], count("encoded_write"));
    assert_eq!(v["encoded_writes"], count("encoded_write"));
    assert_eq!(v["files"], count("mkfile"));
    assert_eq!(v["directories"], count("mkdir"));
    assert!(
        count("encoded_write") > 0,
        "the fixture has compressed extents"
    );
    // Usage errors.
    for bad in [
        &["--estimate", "-f", "x"][..],
        &["--json"][..],
        &["--estimate", "--proto", "1", "--compressed-data"][..],
    ] {
        let out = btrsend()
            .arg("send")
            .args(bad)
            .arg("--device")
            .arg(&img)
            .arg("snaps/c2")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}

/// Progress (issue 14): the total of a send's progress is the estimate of
/// the stream, from its thread beside the send, and equals the length of
/// the kernel's stream of the same send (full and incremental, v1 and v2
/// --compressed-data, and two SUBVOLs in one stream); the plain lines of
/// `--progress` count stream bytes. `BTRSEND_DEBUG_TOTAL` makes the send
/// wait for that thread and print the total beside the stream's size.
#[test]
fn progress_total_is_the_kernels_stream_length() {
    const FX: &str = "006-compression";
    let tmp = tempfile::tempdir().unwrap();
    let img = common::unpack(tmp.path(), FX, "dev1.img");
    let cases: [(&[&str], u64); 4] = [
        (&["snaps/c1"], kernel_stream_len(FX, "c1.full.v1")),
        (
            &["--compressed-data", "snaps/c2"],
            kernel_stream_len(FX, "c2.full.v2c"),
        ),
        (
            &["--compressed-data", "-p", "snaps/c1", "snaps/c2"],
            kernel_stream_len(FX, "c1--c2.inc.v2c"),
        ),
        (
            &["snaps/c1", "snaps/c2"],
            kernel_stream_len(FX, "c1.full.v1") + kernel_stream_len(FX, "c2.full.v1"),
        ),
    ];
    for (args, kernel) in cases {
        let out = btrsend()
            .env("BTRSEND_DEBUG_TOTAL", "1")
            .env("BTRSEND_PROGRESS_INTERVAL_MS", "0")
            .args(["send", "--progress", "--device"])
            .arg(&img)
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {err}");
        assert_eq!(out.stdout.len() as u64, kernel, "{args:?}");
        assert!(
            err.contains(&format!(
                "btrsend: total {kernel} bytes, stream {kernel} bytes\n"
            )),
            "{args:?}: {err}"
        );
        // Every line counts stream bytes (never more than the stream).
        let human = indicatif::HumanBytes(kernel).to_string();
        let last = err
            .lines()
            .rfind(|l| l.starts_with("btrsend: sent "))
            .unwrap_or_else(|| panic!("{args:?}: no progress line: {err}"));
        assert!(
            last.starts_with(&format!("btrsend: sent {human}")),
            "{args:?}: {last}"
        );
    }
}
