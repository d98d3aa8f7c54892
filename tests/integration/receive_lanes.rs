//! `btrsend receive` with its data written by worker threads ("lanes", one
//! queue per file): a hand-built stream whose commands only come out right
//! if the lanes keep the stream's order where it matters, received with 1,
//! 2 and 5 threads and compared with the tree the stream means (built here
//! by hand, with plain system calls); as root, the real `btrfs receive` of
//! the same stream into a loop-mounted btrfs must give that tree too (the
//! oracle for the expectation itself). And an error in a lane (a full disk)
//! names the stream offset, the command and the path.

use std::borrow::Cow;
use std::fs;
use std::io::Cursor;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use btrsend::manifest::{self, Options};
use btrsend::receive::{self, NoProgress, ReceiveError, ReceiveOptions};
use btrsend::testing::{self, LiveBtrfs};
use stream_format::{Command, StreamWriter, Timespec};

const UUID: [u8; 16] = [9; 16];
/// Data chunks: above the size that goes to a lane.
const K16: usize = 16 << 10;

fn p(s: &str) -> Cow<'_, [u8]> {
    Cow::Borrowed(s.as_bytes())
}

fn fill(b: u8, n: usize) -> Vec<u8> {
    vec![b; n]
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn t(sec: u64) -> Timespec {
    Timespec { sec, nsec: 123 }
}

fn write(path: &str, offset: u64, data: Vec<u8>) -> Command<'_> {
    Command::Write {
        path: p(path),
        offset,
        data: Cow::Owned(data),
    }
}

fn ren<'a>(a: &'a str, b: &'a str) -> Command<'a> {
    Command::Rename {
        path: p(a),
        path_to: p(b),
    }
}

fn mkfile(path: &str, ino: u64) -> Command<'_> {
    Command::Mkfile { path: p(path), ino }
}

fn utimes(path: &str, sec: u64) -> Command<'_> {
    Command::Utimes {
        path: p(path),
        atime: t(sec),
        mtime: t(sec),
        ctime: t(sec),
        otime: None,
    }
}

/// CHOWN (to `ids`), CHMOD, UTIMES of `path`, as the kernel ends an inode.
fn meta(path: &str, ids: (u32, u32), mode: u64, sec: u64) -> [Command<'_>; 3] {
    [
        Command::Chown {
            path: p(path),
            uid: ids.0.into(),
            gid: ids.1.into(),
        },
        Command::Chmod {
            path: p(path),
            mode,
        },
        utimes(path, sec),
    ]
}

/// The stream: interleaved writes to several files, TRUNCATE and CHMOD of a
/// file with writes queued, a RENAME over a file with writes queued (both
/// files have some), a directory renamed while its child has writes queued,
/// a CLONE from a file with writes queued, a LINK to one, a written file
/// unlinked, an xattr on one, and UTIMES of the files and directories after
/// everything in them.
fn ordering_stream(ids: (u32, u32)) -> Vec<u8> {
    let mut cmds = vec![
        Command::Subvol {
            path: p("sv"),
            uuid: UUID,
            ctransid: 1,
        },
        mkfile("o257-1-0", 257),
        ren("o257-1-0", "a"),
        mkfile("o258-1-0", 258),
        ren("o258-1-0", "b"),
        Command::Mkdir {
            path: p("o259-1-0"),
            ino: 259,
        },
        ren("o259-1-0", "d"),
        mkfile("d/c", 260),
        write("a", 0, fill(b'A', K16)),
        write("b", 0, fill(b'B', K16)),
        write("d/c", 0, fill(b'C', K16)),
        write("a", K16 as u64, fill(b'a', K16)),
        write("b", K16 as u64, fill(b'b', K16)),
        Command::Truncate {
            path: p("a"),
            size: 24 << 10,
        },
        Command::Chmod {
            path: p("a"),
            mode: 0o640,
        },
        // b replaces a (both with writes queued), then grows.
        ren("b", "a"),
        write("a", 32 << 10, fill(b'X', K16)),
        // The directory moves while d/c has writes queued.
        ren("d", "e"),
        write("e/c", K16 as u64, fill(b'c', K16)),
        // A clone of the whole of e/c, whose writes may be queued.
        mkfile("f", 261),
        Command::Clone {
            offset: 0,
            len: 32 << 10,
            path: p("f"),
            clone_uuid: UUID,
            clone_ctransid: 1,
            clone_path: p("e/c"),
            clone_offset: 0,
        },
        // f is written after the clone: the clone must not see it.
        write("f", K16 as u64, fill(b'F', 8 << 10)),
        mkfile("e/g", 262),
        write("e/g", 0, fill(b'G', K16)),
        // A second name for a, whose writes may be queued; written by it.
        Command::Link {
            path: p("h"),
            path_link: p("a"),
        },
        write("h", 48 << 10, fill(b'Y', K16)),
        // Written, then gone.
        mkfile("u", 263),
        write("u", 0, fill(b'U', K16)),
        Command::Unlink { path: p("u") },
        write("e/g", K16 as u64, fill(b'g', K16)),
        ren("e/g", "e/g2"),
        Command::SetXattr {
            path: p("e/g2"),
            name: p("user.k"),
            data: p("v"),
        },
        write("e/g2", 32 << 10, fill(b'2', K16)),
    ];
    cmds.extend(meta("a", ids, 0o604, 1_000_001));
    cmds.extend(meta("f", ids, 0o600, 1_000_002));
    cmds.extend(meta("e/c", ids, 0o644, 1_000_003));
    cmds.extend(meta("e/g2", ids, 0o640, 1_000_004));
    cmds.extend(meta("e", ids, 0o750, 1_000_005));
    cmds.extend(meta("", ids, 0o755, 1_000_006));
    let mut w = StreamWriter::new(Vec::new(), 2).unwrap();
    for c in &cmds {
        w.write(c).unwrap();
    }
    w.finish().unwrap()
}

/// The tree the stream means, made with plain system calls in `root`.
fn expected_tree(root: &Path) {
    let k = K16;
    let set = |rel: &str, mode: u32, sec: i64| {
        let path = root.join(rel);
        fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
        let ts = rustix::fs::Timespec {
            tv_sec: sec,
            tv_nsec: 123,
        };
        let times = rustix::fs::Timestamps {
            last_access: ts,
            last_modification: ts,
        };
        rustix::fs::utimensat(rustix::fs::CWD, &path, &times, rustix::fs::AtFlags::empty())
            .unwrap();
    };
    fs::create_dir_all(root.join("e")).unwrap();
    let a = cat(&[
        &fill(b'B', k),
        &fill(b'b', k),
        &fill(b'X', k),
        &fill(b'Y', k),
    ]);
    fs::write(root.join("a"), a).unwrap();
    fs::hard_link(root.join("a"), root.join("h")).unwrap();
    let c = cat(&[&fill(b'C', k), &fill(b'c', k)]);
    fs::write(root.join("e/c"), &c).unwrap();
    let f = cat(&[&fill(b'C', k), &fill(b'F', 8 << 10), &fill(b'c', 8 << 10)]);
    fs::write(root.join("f"), f).unwrap();
    let g = cat(&[&fill(b'G', k), &fill(b'g', k), &fill(b'2', k)]);
    fs::write(root.join("e/g2"), g).unwrap();
    rustix::fs::setxattr(
        root.join("e/g2").as_path(),
        "user.k",
        b"v",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    set("a", 0o604, 1_000_001);
    set("f", 0o600, 1_000_002);
    set("e/c", 0o644, 1_000_003);
    set("e/g2", 0o640, 1_000_004);
    set("e", 0o750, 1_000_005);
    set("", 0o755, 1_000_006);
}

fn manifest_of(root: &Path) -> String {
    manifest::manifest(root, Options::default())
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
}

#[test]
fn lanes_keep_the_stream_order() {
    let tmp = tempfile::tempdir().unwrap();
    let md = fs::metadata(tmp.path()).unwrap();
    let ids = (md.uid(), md.gid());
    let bytes = ordering_stream(ids);
    let want_dir = tmp.path().join("want");
    expected_tree(&want_dir);
    let want = manifest_of(&want_dir);
    for threads in [1, 2, 5] {
        for round in 0..3 {
            let dir = tmp.path().join(format!("t{threads}-{round}"));
            fs::create_dir(&dir).unwrap();
            let mut opts = ReceiveOptions::new();
            opts.threads = threads;
            receive::receive(Cursor::new(&bytes), &dir, &opts, &mut NoProgress)
                .unwrap_or_else(|e| panic!("threads {threads}: {e}"));
            let got = manifest_of(&dir.join("sv"));
            if let Some(d) = manifest::diff(&want, &got, 20) {
                panic!("threads {threads}, round {round}: not the stream's tree:\n{d}");
            }
        }
    }
    // The same stream from a regular file (read without a reader thread).
    let file = tmp.path().join("s.stream");
    fs::write(&file, &bytes).unwrap();
    let dir = tmp.path().join("file");
    fs::create_dir(&dir).unwrap();
    let f = fs::File::open(&file).unwrap();
    receive::receive_file(f, &dir, &ReceiveOptions::new(), &mut NoProgress).unwrap();
    assert_eq!(
        manifest::diff(&want, &manifest_of(&dir.join("sv")), 20),
        None
    );

    // The oracle: the real `btrfs receive` makes the same tree (as root).
    if !testing::require_live("lanes_keep_the_stream_order") {
        return;
    }
    let live = LiveBtrfs::new().expect("scratch btrfs");
    live.receive("", &[file.as_path()]).expect("btrfs receive");
    let theirs = live.manifest("sv", Options::default()).unwrap();
    if let Some(d) = manifest::diff(&want, &theirs, 20) {
        panic!("btrfs receive does not make the expected tree:\n{d}");
    }
}

/// A write that fails in a lane (the target is full) is an error naming its
/// stream offset, command and path, and the subvolume stays incomplete.
#[test]
fn lane_errors_name_offset_command_and_path() {
    let test = "lane_errors_name_offset_command_and_path";
    if !testing::require_live(test) {
        return;
    }
    let fs_ = testing::Tmpfs::new(1 << 20).expect("mount a small tmpfs");
    let mut cmds = vec![Command::Subvol {
        path: p("sv"),
        uuid: UUID,
        ctransid: 1,
    }];
    cmds.push(mkfile("big", 257));
    for i in 0..32u64 {
        cmds.push(write("big", i * 65536, fill(b'x', 65536)));
    }
    let mut w = StreamWriter::new(Vec::new(), 2).unwrap();
    for c in &cmds {
        w.write(c).unwrap();
    }
    let bytes = w.finish().unwrap();
    let mut opts = ReceiveOptions::new();
    opts.threads = 2;
    let e = receive::receive(Cursor::new(&bytes), fs_.path(), &opts, &mut NoProgress).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ReceiveError::Apply(_)), "{msg}");
    assert!(
        msg.contains("(WRITE) at stream offset") && msg.contains("\"big\""),
        "{msg}"
    );
    assert!(msg.contains("No space left on device"), "{msg}");
    let rec = fs::read_to_string(fs_.path().join(".btrsend/sv.subvol")).unwrap();
    assert!(rec.contains("state=incomplete\n"), "{rec}");
}

/// A WRITE whose data is corrupt, in a stream read from a regular file (so
/// the worker reads and checks it, not the reader): the CRC error names the
/// command and its stream offset, as the reader's would, the rest is
/// received (`-E 0`) and the subvolume is incomplete; the same with every
/// command read on one thread.
#[test]
fn corrupt_skimmed_write_is_a_crc_error_at_its_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let md = fs::metadata(tmp.path()).unwrap();
    let mut bytes = ordering_stream((md.uid(), md.gid()));
    // The first WRITE (of "a"): flip its last data byte.
    let mut r = stream_format::StreamReader::new(Cursor::new(&bytes));
    let info = loop {
        let (info, c) = r.next_command().unwrap().unwrap();
        if matches!(c, Command::Write { .. }) {
            break info;
        }
    };
    let end = usize::try_from(info.offset).unwrap() + 10 + usize::try_from(info.len).unwrap();
    bytes[end - 1] ^= 0x55;
    let file = tmp.path().join("bad.stream");
    fs::write(&file, &bytes).unwrap();
    struct Collect(std::sync::Mutex<Vec<String>>);
    impl receive::Progress for Collect {
        fn error(&self, e: &dyn std::error::Error) {
            self.0.lock().unwrap().push(e.to_string());
        }
    }
    for threads in [1, 2] {
        let dir = tmp.path().join(format!("t{threads}"));
        fs::create_dir(&dir).unwrap();
        let mut opts = ReceiveOptions::new();
        opts.threads = threads;
        opts.max_errors = 0;
        let mut c = Collect(Default::default());
        let f = fs::File::open(&file).unwrap();
        let e = receive::receive_file(f, &dir, &opts, &mut c).unwrap_err();
        assert!(
            matches!(e, ReceiveError::Errors(1)),
            "threads {threads}: {e}"
        );
        let errs = c.0.get_mut().unwrap();
        assert_eq!(errs.len(), 1, "threads {threads}: {errs:?}");
        let want = format!("(WRITE) at stream offset {}", info.offset);
        assert!(
            errs[0].contains(&want) && errs[0].to_lowercase().contains("crc"),
            "threads {threads}: {}",
            errs[0]
        );
        let rec = fs::read_to_string(dir.join(".btrsend/sv.subvol")).unwrap();
        assert!(rec.contains("state=incomplete\n"), "{rec}");
        // Everything else was received: e/c is whole.
        let c_data = fs::read(dir.join("sv/e/c")).unwrap();
        assert_eq!(c_data, cat(&[&fill(b'C', K16), &fill(b'c', K16)]));
    }
}
