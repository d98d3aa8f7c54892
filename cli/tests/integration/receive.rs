//! `btrsend receive` end to end: exit codes, stdout, stderr.

use crate::common;

use std::fs;
use std::process::{Command, Output, Stdio};

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_btrsend"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run btrsend")
}

#[test]
fn receive_full_stream_prints_nothing_and_succeeds() {
    let streams = common::send_streams_dir();
    let dir = tempfile::tempdir().unwrap();
    let s = streams.join("tiny.v2.stream");
    let out = run(&[
        "receive".as_ref(),
        "-f".as_ref(),
        s.as_os_str(),
        dir.path().as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Values of tiny.v2's dump (tests/fixtures/send-streams/tiny.v2.dump).
    assert_eq!(fs::read(dir.path().join("tiny.snap/d/f")).unwrap(), b"hi\n");
    let rec = fs::read_to_string(dir.path().join(".btrsend/tiny.snap.subvol")).unwrap();
    assert!(
        rec.contains("uuid=e690ca2d-c5e4-7c45-a7c4-07550d5a5f09\nctransid=7\n"),
        "{rec}"
    );
    // Receiving it again: the subvolume exists.
    let out = run(&[
        "receive".as_ref(),
        "-f".as_ref(),
        s.as_os_str(),
        dir.path().as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("btrsend: error: cannot apply command 0 (SUBVOL) at stream offset 17: SUBVOL \"tiny.snap\"")
            && err.contains("exists already"),
        "{err}"
    );
}

#[test]
fn receive_reads_stdin_and_reports_a_truncated_stream() {
    let streams = common::send_streams_dir();
    let dir = tempfile::tempdir().unwrap();
    let bytes = fs::read(streams.join("tiny.v1.stream")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_btrsend"))
        .args(["receive".as_ref(), dir.path().as_os_str()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Cut inside the header of CHOWN d/f at 0x16a.
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), &bytes[..0x170]).unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("btrsend: error: stream truncated before command 10 at stream offset 362"),
        "{err}"
    );
    assert!(err.contains("subvolume tiny.snap left incomplete"), "{err}");
    let rec = fs::read_to_string(dir.path().join(".btrsend/tiny.snap.subvol")).unwrap();
    assert!(rec.ends_with("state=incomplete\n"), "{rec}");
}

#[test]
fn receive_needs_dir_unless_dump() {
    let out = run(&["receive".as_ref()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("<DIR>"));
}

#[test]
fn receive_dump_is_forwarded_to_dump() {
    let streams = common::send_streams_dir();
    let s = streams.join("tiny.v1.stream");
    let out = Command::new(env!("CARGO_BIN_EXE_btrsend"))
        .args([
            "receive".as_ref(),
            "--dump".as_ref(),
            "-f".as_ref(),
            s.as_os_str(),
        ])
        .env("TZ", "UTC")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, fs::read(streams.join("tiny.v1.dump")).unwrap());
}

/// Whether this test can run a command as `nobody` (root and setpriv);
/// if not, says loudly that `test` is skipped.
fn can_drop_to_nobody(test: &str) -> bool {
    let have_setpriv = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n");
    if !is_root || !have_setpriv {
        eprintln!("SKIPPED: {test} needs root and setpriv (to drop to nobody)");
        return false;
    }
    true
}

#[test]
fn receive_as_ordinary_user_reports_owners_once() {
    let streams = common::send_streams_dir();
    if !can_drop_to_nobody("receive_as_ordinary_user_reports_owners_once") {
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let dir = tmp.path().join("dir");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let s = streams.join("g1.full.v1.stream");
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_btrsend"))
        .args([
            "receive".as_ref(),
            "-f".as_ref(),
            s.as_os_str(),
            dir.as_os_str(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        err,
        "btrsend: note: not running as root: file owners (uid/gid) were not set, files belong to the receiving user\n"
    );
    let rec = fs::read_to_string(dir.join(".btrsend/g.1.subvol")).unwrap();
    assert!(rec.ends_with("state=complete\n"), "{rec}");
    assert_eq!(fs::metadata(dir.join("g.1")).unwrap().uid(), 65534);
}

#[test]
fn receive_device_node_as_ordinary_user_says_it_needs_root() {
    use btrsend::stream_format::{Command as Cmd, StreamWriter};
    use std::borrow::Cow;
    use std::os::unix::fs::PermissionsExt;
    if !can_drop_to_nobody("receive_device_node_as_ordinary_user_says_it_needs_root") {
        return;
    }
    let mut w = StreamWriter::new(Vec::new(), 1).unwrap();
    let b = |s: &'static str| Cow::Borrowed(s.as_bytes());
    for c in [
        Cmd::Subvol {
            path: b("sv"),
            uuid: [9; 16],
            ctransid: 1,
        },
        // /dev/null's numbers, then a file after it.
        Cmd::Mknod {
            path: b("null"),
            ino: 257,
            rdev: (1 << 8) | 3,
            mode: 0o20644,
        },
        Cmd::Mkfile {
            path: b("f"),
            ino: 258,
        },
    ] {
        w.write(&c).unwrap();
    }
    let bytes = w.finish().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let stream = tmp.path().join("s");
    fs::write(&stream, bytes).unwrap();
    fs::set_permissions(&stream, fs::Permissions::from_mode(0o644)).unwrap();
    let recv = |dir: &str, extra: &[&str]| {
        let dir = tmp.path().join(dir);
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_btrsend"))
            .args(["receive", "--no-progress"])
            .args(extra)
            .arg("-f")
            .arg(&stream)
            .arg(&dir)
            .output()
            .unwrap();
        (out, dir)
    };
    let (out, _) = recv("d1", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("MKNOD \"null\"")
            && err.contains("creating a device node needs root (CAP_MKNOD)")
            && err.contains("--max-errors 0"),
        "{err}"
    );
    // With -E 0 the rest is received, the subvolume marked incomplete.
    let (out, dir) = recv("d2", &["-E", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(dir.join("sv/f").is_file(), "{err}");
    assert!(!dir.join("sv/null").exists());
    let rec = fs::read_to_string(dir.join(".btrsend/sv.subvol")).unwrap();
    assert!(rec.contains("state=incomplete"), "{rec}");
}

/// Into btrfs as root, `btrsend receive` prints what `btrfs receive` 6.2
/// prints ("At subvol NAME" on stderr for a full stream, "At snapshot NAME"
/// on stdout for an incremental one), and nothing with -q; with -v and -vv
/// the same detail lines, byte for byte; `-m ROOTMOUNT`
/// and `-C` are accepted as progs accepts them. The oracle is `btrfs
/// receive` of the same streams into another filesystem (both receivers
/// find parents across the whole filesystem, so they must not share one).
#[test]
fn receive_into_btrfs_prints_what_btrfs_receive_prints() {
    let test = "receive_into_btrfs_prints_what_btrfs_receive_prints";
    let streams = common::send_streams_dir();
    if !btrsend::testing::require_live(test) {
        return;
    }
    let chain = ["full.v1", "inc12.v1"];
    let kernel = btrsend::testing::LiveBtrfs::new().expect("scratch btrfs");
    let ours = btrsend::testing::LiveBtrfs::new().expect("scratch btrfs");
    let quiet = btrsend::testing::LiveBtrfs::new().expect("scratch btrfs");
    for s in chain {
        let f = streams.join(format!("{s}.stream"));
        let k = Command::new("btrfs")
            .arg("receive")
            .arg("-f")
            .arg(&f)
            .arg(kernel.path())
            .output()
            .unwrap();
        assert!(k.status.success(), "{}", String::from_utf8_lossy(&k.stderr));
        let b = run(&[
            "receive".as_ref(),
            "-C".as_ref(),
            "-m".as_ref(),
            ours.path().as_os_str(),
            "-f".as_ref(),
            f.as_os_str(),
            ours.path().as_os_str(),
        ]);
        assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
        assert_eq!(
            String::from_utf8_lossy(&b.stderr),
            String::from_utf8_lossy(&k.stderr),
            "{s}: stderr"
        );
        assert_eq!(b.stdout, k.stdout, "{s}: stdout");
        let q = run(&[
            "receive".as_ref(),
            "-q".as_ref(),
            "-f".as_ref(),
            f.as_os_str(),
            quiet.path().as_os_str(),
        ]);
        assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
        assert!(q.stderr.is_empty() && q.stdout.is_empty());
    }
    // -v and -vv: progs' detail lines, the same on both (received into
    // directories of the same filesystems: parents are found by UUID).
    for v in ["-v", "-vv"] {
        for fs_ in [&kernel, &ours] {
            fs::create_dir(fs_.path().join(v)).unwrap();
        }
        for s in chain {
            let f = streams.join(format!("{s}.stream"));
            let k = Command::new("btrfs")
                .args(["receive", v, "-f"])
                .arg(&f)
                .arg(kernel.path().join(v))
                .output()
                .unwrap();
            assert!(k.status.success(), "{}", String::from_utf8_lossy(&k.stderr));
            let b = run(&[
                "receive".as_ref(),
                v.as_ref(),
                "-f".as_ref(),
                f.as_os_str(),
                ours.path().join(v).as_os_str(),
            ]);
            assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
            let lines = k.stderr.split(|&c| c == b'\n').count();
            assert!(lines > 5, "{s} {v}: {lines} lines from btrfs receive");
            // btrsend escapes control characters of the stream's paths
            // (`\x0a` for a newline in a name), where progs prints them
            // raw: none reaches the terminal, and with them put back the
            // lines are progs' own.
            assert!(
                !b.stderr.iter().any(|&c| c < 0x20 && c != b'\n'),
                "{s} {v}: a raw control character"
            );
            let b_stderr = unescape(&b.stderr);
            if b_stderr != k.stderr {
                let (kt, bt) = (
                    String::from_utf8_lossy(&k.stderr),
                    String::from_utf8_lossy(&b_stderr),
                );
                let diff: Vec<String> = kt
                    .lines()
                    .zip(bt.lines())
                    .filter(|(a, b)| a != b)
                    .take(5)
                    .map(|(a, b)| format!("btrfs:   {a}\nbtrsend: {b}"))
                    .collect();
                panic!(
                    "{s} {v}: stderr differs ({} vs {} lines):\n{}",
                    kt.lines().count(),
                    bt.lines().count(),
                    diff.join("\n")
                );
            }
            assert_eq!(b.stdout, k.stdout, "{s} {v}: stdout");
        }
    }
    // The snapshot is a read-only subvolume.
    let show = Command::new("btrfs")
        .args(["subvolume", "show"])
        .arg(ours.path().join("src.s2"))
        .output()
        .unwrap();
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(show.contains("readonly"), "{show}");
}

/// Issue 15, progress: `receive --progress` from a pipe with standard error
/// not a terminal prints plain lines with bytes, rate and elapsed time —
/// no total, since a pipe has none — and a summary; without `--progress`
/// (cron) it prints nothing. From a file the lines give the file's size as
/// the total.
#[test]
fn receive_progress_lines_from_a_pipe_and_silence_in_cron() {
    let tmp = tempfile::tempdir().unwrap();
    let stream = common::unpack(tmp.path(), "001-basic", "basic.full.v1.stream");
    let bytes = fs::read(&stream).unwrap();
    let receive_piped = |dir: &std::path::Path, args: &[&str]| {
        let mut child = common::btrsend()
            .arg("receive")
            .args(args)
            .arg(dir)
            .env("BTRSEND_PROGRESS_INTERVAL_MS", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let data = bytes.clone();
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            // In pieces, so the receiver sees the input grow.
            for chunk in data.chunks(64 << 10) {
                stdin.write_all(chunk).unwrap();
            }
        });
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap();
        out
    };
    let dir = tmp.path().join("a");
    fs::create_dir(&dir).unwrap();
    let out = receive_piped(&dir, &["--progress"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8(out.stderr).unwrap();
    let lines: Vec<&str> = err.lines().collect();
    let (summary, progress) = lines.split_last().expect("some output");
    assert!(!progress.is_empty(), "progress lines: {err}");
    for l in progress {
        assert!(l.starts_with("btrsend: received "), "{l}");
        assert!(l.contains("/s, ") && l.ends_with(" elapsed"), "{l}");
        assert!(
            !l.contains(" of ") && !l.contains('%'),
            "a pipe has no total: {l}"
        );
    }
    assert!(
        summary.starts_with("btrsend: done: received ") && summary.ends_with("/s"),
        "{summary}"
    );
    let size = bytes.len();
    let last = progress.last().unwrap();
    let kib = format!("{:.2} KiB", size as f64 / 1024.0);
    assert!(
        last.contains(&kib) || summary.contains(&kib),
        "{last} / {summary}: {kib}"
    );

    // Cron: no terminal, no --progress: nothing at all.
    let dir = tmp.path().join("b");
    fs::create_dir(&dir).unwrap();
    let out = receive_piped(&dir, &[]);
    assert!(out.status.success());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // From a file: its size is the total.
    let dir = tmp.path().join("c");
    fs::create_dir(&dir).unwrap();
    let out = common::btrsend()
        .args(["receive", "--progress", "-f"])
        .arg(&stream)
        .arg(&dir)
        .env("BTRSEND_PROGRESS_INTERVAL_MS", "0")
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.lines().any(|l| l.contains(&format!(" of {kib} ("))),
        "file size as total: {err}"
    );
}

/// Where the target refuses compressed data as it is (a directory off
/// btrfs: `BTRFS_IOC_ENCODED_WRITE` is `ENOTTY` there), `-vv` says so after
/// each ENCODED_WRITE line, in btrfs-progs' words (cmds/receive.c: "%s -
/// falling back to decompress and write due to errno %d (\"%m\")"): one per
/// ENCODED_WRITE of the stream, as the stock `btrfs receive --dump` lists
/// them; the data is decompressed and written all the same.
#[test]
fn vv_says_when_compressed_data_is_decompressed_instead() {
    let streams = common::send_streams_dir();
    let s = streams.join("comp.v2c.stream");
    let dir = tempfile::tempdir().unwrap();
    let on_btrfs = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(dir.path())
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"btrfs"));
    if on_btrfs {
        eprintln!(
            "SKIPPED vv_says_when_compressed_data_is_decompressed_instead: the temporary directory is on btrfs (the ioctl is not refused there)"
        );
        return;
    }
    let out = run(&[
        "receive".as_ref(),
        "-vv".as_ref(),
        "-f".as_ref(),
        s.as_os_str(),
        dir.path().as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    let mut fallbacks = 0;
    for (i, l) in lines.iter().enumerate() {
        if let Some(rest) = l.strip_prefix("encoded_write ")
            && let Some((path, _)) = rest.split_once(" - offset=")
        {
            let want = format!(
                "encoded_write {path} - falling back to decompress and write due to errno 25 (\"Inappropriate ioctl for device\")"
            );
            assert_eq!(lines.get(i + 1).copied(), Some(want.as_str()), "{err}");
            fallbacks += 1;
        }
    }
    let dump = Command::new("btrfs")
        .args(["receive", "--dump", "-f"])
        .arg(&s)
        .output();
    let want = match &dump {
        Ok(d) if d.status.success() => String::from_utf8_lossy(&d.stdout)
            .lines()
            .filter(|l| l.starts_with("encoded_write"))
            .count(),
        // Without btrfs-progs: the fixture's dump, made by it.
        _ => fs::read_to_string(streams.join("comp.v2c.dump"))
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("encoded_write"))
            .count(),
    };
    assert!(want > 0);
    assert_eq!(fallbacks, want, "{err}");
    assert_eq!(err.matches("falling back").count(), want, "{err}");
}

/// Control characters that btrsend printed as `\xNN` put back as bytes.
fn unescape(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"\\x")
            && let Some(h) = b.get(i + 2..i + 4)
            && let Ok(n) = u8::from_str_radix(std::str::from_utf8(h).unwrap_or("zz"), 16)
            && (n < 0x20 || n == 0x7f)
        {
            out.push(n);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    out
}
