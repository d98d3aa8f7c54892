//! Issue 36: `btrsend SNAPSHOT… [send options]` is `btrsend send SNAPSHOT…
//! [send options]` when the first word is not a subcommand.
//!
//! * On a kernel-made image (`014-incremental`, `--device`): the short form
//!   writes the bytes `btrsend send` writes, for a path, `id:N`, `-p`,
//!   several snapshots, `-f`, `--compressed-data` and `--estimate`, options
//!   before or after the snapshot; the streams' dumps are the kernel's
//!   stored `btrfs receive --dump` of its own streams.
//! * On a loop-mounted btrfs (live, root; required in CI): a mounted path,
//!   `-p` as the README's first line has it, a relative name of an existing
//!   directory, several snapshots: the same bytes as `btrsend send`, and the
//!   incremental's dump equals that of the kernel's `btrfs send -p`.
//! * A subcommand's name is always the subcommand (also when a directory
//!   of that name is in the way, which `./NAME` reaches); a first word that
//!   is neither gets a usage error (exit 2) naming both readings; a terminal
//!   on standard output is refused as `send` refuses it; `--help` shows the
//!   short form first.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use btrsend::testing::{self, LiveBtrfs};

use crate::common::{self, btrsend, sh, stderr};

const FIXTURE: &str = "014-incremental";

/// `btrsend ARGS`, which must succeed quietly: its standard output.
fn ok(args: &[&str], cwd: Option<&Path>) -> Vec<u8> {
    let mut c = btrsend();
    c.args(args).stdin(Stdio::null());
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    assert!(out.stderr.is_empty(), "{args:?}: {}", stderr(&out));
    out.stdout
}

/// `btrsend dump` of `bytes`.
fn dump_of(dir: &Path, bytes: &[u8]) -> String {
    let f = dir.join("dumped.stream");
    std::fs::write(&f, bytes).unwrap();
    common::dump(&f)
}

fn kernel_dump(name: &str) -> String {
    std::fs::read_to_string(common::fixture_dir(FIXTURE).join(name)).unwrap()
}

#[test]
fn issue_36_short_form_on_a_device_is_send_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::unpack(tmp.path(), FIXTURE, "dev1.img");
    let img = img.to_str().unwrap();
    // (short form, the same as `send`, the kernel's dump of its stream)
    let cases: [(&[&str], Option<&str>); 8] = [
        (&["-d", img, "snaps/s2"], Some("s2.full.v1.dump")),
        (&["snaps/s2", "--device", img], Some("s2.full.v1.dump")),
        (&["--device", img, "id:258"], Some("s2.full.v1.dump")),
        (
            &["-d", img, "--compressed-data", "snaps/s2"],
            Some("s2.full.v2c.dump"),
        ),
        (
            &["-d", img, "-p", "snaps/s1", "snaps/s3"],
            Some("s1--s3.inc.v1.dump"),
        ),
        (
            &["snaps/s3", "-p", "id:258", "-d", img],
            Some("s2--s3.inc.v1.dump"),
        ),
        (&["-d", img, "snaps/s1", "snaps/s2", "snaps/s3"], None),
        (&["-d", img, "-c", "snaps/s1", "snaps/s2", "snaps/s3"], None),
    ];
    for (short, kernel) in cases {
        let got = ok(short, None);
        let mut long = vec!["send"];
        long.extend_from_slice(short);
        let want = ok(&long, None);
        assert!(!want.is_empty(), "{short:?}");
        assert!(got == want, "{short:?}: not the bytes of btrsend send");
        if let Some(k) = kernel {
            assert_eq!(dump_of(tmp.path(), &got), kernel_dump(k), "{short:?}");
        }
    }

    // -f: the same file.
    let (a, b) = (tmp.path().join("short.f"), tmp.path().join("send.f"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    assert!(ok(&["-d", img, "-f", a, "-p", "snaps/s1", "snaps/s2"], None).is_empty());
    assert!(
        ok(
            &["send", "-d", img, "-f", b, "-p", "snaps/s1", "snaps/s2"],
            None
        )
        .is_empty()
    );
    let bytes = std::fs::read(a).unwrap();
    assert!(bytes == std::fs::read(b).unwrap(), "-f");
    assert_eq!(
        dump_of(tmp.path(), &bytes),
        kernel_dump("s1--s2.inc.v1.dump")
    );

    // --estimate: the same number, which is the stream's length.
    let est = ok(
        &["-d", img, "--estimate", "-p", "snaps/s1", "snaps/s2"],
        None,
    );
    assert_eq!(
        est,
        ok(
            &[
                "send",
                "-d",
                img,
                "--estimate",
                "-p",
                "snaps/s1",
                "snaps/s2"
            ],
            None
        )
    );
    assert_eq!(
        String::from_utf8(est).unwrap(),
        format!("{}\n", bytes.len())
    );
}

/// With `script` (util-linux) standard output is a terminal.
#[test]
fn issue_36_short_form_refuses_a_terminal() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::unpack(tmp.path(), FIXTURE, "dev1.img");
    let cmd = format!(
        "{} -d {} snaps/s1",
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
            eprintln!("=== SKIPPED issue_36_short_form_refuses_a_terminal: no script(1): {e} ===");
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

fn run_in(dir: &Path, args: &[&str]) -> Output {
    btrsend()
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn issue_36_subcommand_names_win_and_other_words_are_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    std::fs::create_dir(cwd.join("list")).unwrap();
    std::fs::create_dir(cwd.join("plain")).unwrap();

    // `list` is the subcommand, though a directory has its name: its own
    // usage error (it needs --device).
    let o = run_in(cwd, &["list"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("--device") && e.contains("Usage: btrsend list"),
        "{e}"
    );
    assert!(!e.contains("not a snapshot"), "{e}");
    // `./list`, and `plain` (an existing directory): snapshots to send;
    // send's own error, as `btrsend send` gives it (this is not btrfs).
    for word in ["./list", "plain"] {
        let o = run_in(cwd, &[word]);
        let s = run_in(cwd, &["send", word]);
        assert_eq!(o.status.code(), Some(1), "{word}: {}", stderr(&o));
        assert_eq!(stderr(&o), stderr(&s), "{word}");
        assert!(stderr(&o).starts_with("btrsend: error: "), "{}", stderr(&o));
        assert!(o.stdout.is_empty());
    }

    // Neither a subcommand nor a snapshot: exit 2, both readings named.
    for (args, word, tip) in [
        (
            &["lsit"][..],
            "lsit",
            Some("a similar subcommand exists: 'list'"),
        ),
        (&["nowhere"], "nowhere", None),
        (&["-p", "/mnt/a", "nowhere"], "nowhere", None),
        (
            &["id:257"],
            "id:257",
            Some("id:N names a subvolume of the filesystem given with --device"),
        ),
    ] {
        let o = run_in(cwd, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(o.stdout.is_empty());
        let e = stderr(&o);
        assert!(
            e.starts_with(&format!(
                "error: not a subcommand, and not a snapshot: '{word}' (a snapshot is a path"
            )),
            "{args:?}: {e}"
        );
        assert!(
            e.contains("Usage: btrsend SNAPSHOT... [send options]"),
            "{e}"
        );
        if let Some(tip) = tip {
            assert!(e.contains(tip), "{args:?}: {e}");
        }
    }
    // A control character of the word is shown escaped.
    let o = run_in(cwd, &["bad\x1b]0;title\x07"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(!e.contains('\x1b') && !e.contains('\x07'), "{e:?}");
    assert!(e.contains(r"'bad\x1b]0;title\x07'"), "{e}");

    // Options of neither kind: clap's own error; no arguments: the help.
    let o = run_in(cwd, &["--bogus"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unexpected argument '--bogus'"),
        "{}",
        stderr(&o)
    );
    let o = run_in(cwd, &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("Usage: btrsend SNAPSHOT... [send options]"));
    // Send's options without a snapshot: send says what is missing.
    let o = run_in(cwd, &["-q"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("<SUBVOL>"), "{}", stderr(&o));

    // --help shows the short form first, with the README's example.
    let o = run_in(cwd, &["--help"]);
    assert!(o.status.success());
    let help = String::from_utf8(o.stdout).unwrap();
    let usage = help.lines().find(|l| l.starts_with("Usage:")).unwrap();
    assert_eq!(usage, "Usage: btrsend SNAPSHOT... [send options]");
    assert!(
        help.contains(
            "btrsend /mnt/snaps/day2 -p /mnt/snaps/day1 | ssh backup btrsend receive /pool"
        ),
        "{help}"
    );
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let first = readme
        .lines()
        .find(|l| l.starts_with("    "))
        .expect("an indented command in the README");
    assert_eq!(
        first.trim(),
        "btrsend /mnt/snaps/day2 -p /mnt/snaps/day1 | ssh backup btrsend receive /pool"
    );
}

#[test]
fn issue_36_short_form_on_a_mounted_btrfs_is_send_byte_for_byte() {
    let test = "issue_36_short_form_on_a_mounted_btrfs_is_send_byte_for_byte";
    if !testing::require_live(test) {
        return;
    }
    let live = LiveBtrfs::new().expect("scratch btrfs");
    let mnt = live.path().to_path_buf();
    let m = mnt.to_str().unwrap();
    sh(Command::new("sh").arg("-c").arg(format!(
        "cd {m} && btrfs -q subvolume create sv && mkdir snaps && \
         head -c 300000 /dev/urandom > sv/a && mkdir sv/d && echo one > sv/d/f && \
         btrfs -q subvolume snapshot -r sv snaps/day1 && \
         cp --reflink=always sv/a sv/b && echo two >> sv/d/f && mv sv/d sv/e && \
         rm sv/a && btrfs -q subvolume snapshot -r sv snaps/day2 && sync"
    )));
    let (day1, day2) = (format!("{m}/snaps/day1"), format!("{m}/snaps/day2"));
    let snaps = mnt.join("snaps");
    let cases: [(&[&str], Option<&Path>); 5] = [
        (&[&day2], None),
        (&[&day2, "-p", &day1], None),
        (&["-p", &day1, &day2], None),
        (&["day2", "-p", "day1"], Some(&snaps)),
        (&[&day1, &day2], None),
    ];
    for (short, cwd) in cases {
        let got = ok(short, cwd);
        let mut long = vec!["send"];
        long.extend_from_slice(short);
        assert!(
            got == ok(&long, cwd),
            "{short:?}: not the bytes of btrsend send"
        );
    }

    // The README's line, judged against the kernel's stream.
    let kernel = live.scratch_dir().join("kernel.stream");
    sh(Command::new("btrfs")
        .args(["send", "-q", "-p", &day1, "-f"])
        .arg(&kernel)
        .arg(&day2));
    let ours = live.scratch_dir().join("ours.stream");
    let f = ours.to_str().unwrap();
    assert!(ok(&[&day2, "-p", &day1, "-f", f], None).is_empty());
    let dump = |p: &Path| {
        let o = sh(Command::new("btrfs")
            .args(["receive", "--dump", "-f"])
            .arg(p)
            .env("TZ", "UTC"));
        String::from_utf8(o.stdout).unwrap()
    };
    assert_eq!(dump(&ours), dump(&kernel));
}
