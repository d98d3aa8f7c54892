//! `btrsend::receive` end to end.
//!
//! * Kernel streams (`tests/fixtures/send-streams/`, full and incremental
//!   chains, v1, v2 and v2 `--compressed-data`) received into a temporary
//!   directory on the machine's filesystem (ext4 here) must give the same
//!   manifest (times and hole maps included) as the real `btrfs receive` of
//!   the same chain into a freshly made, loop-mounted btrfs. Needs root: with
//!   `CI` set the test fails without it, otherwise it says loudly that it
//!   skipped. `btrfs.*` xattrs (btrfs properties such as
//!   `btrfs.compression`) exist only on btrfs and are left out of both sides.
//! * Hostile streams, hand-built with the stream-format writer: nothing is
//!   created, changed or read outside DIR.
//! * Corrupt and truncated streams: the error names the byte offset and the
//!   command; the partial subvolume is marked incomplete and refused as a
//!   parent.
//! * `--compressed-data` into a loop-mounted btrfs: compressed extents are
//!   written as they are, as many as `btrfs receive` writes (into tmpfs, by
//!   the fixture test, they are decoded: the fallback).

use std::borrow::Cow;
use std::fs;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::Command as Proc;

use btrsend::manifest::{self, Options};
use btrsend::receive::{self, NoProgress, Progress, ReceiveError, ReceiveOptions};
use btrsend::testing::{self, FixtureMeta, LiveBtrfs, compare};
use stream_format::{Command, StreamWriter, Timespec};

pub(super) fn streams_dir() -> PathBuf {
    testing::send_streams_dir()
}

/// The receive chains of `tests/fixtures/send-streams/README.md`: each is
/// applied in order into one empty directory.
pub(super) const CHAINS: &[&[&str]] = &[
    &["full.v1", "inc12.v1", "inc23.v1"],
    &["full.v1", "inc12.v2", "inc23.v2"],
    &["full.v2", "inc12.v2", "inc23.v2"],
    &["cyc1.full.v1", "cyc.v1"],
    &["g1.full.v1", "g.v1"],
    &["ooo2.full.v1", "ooo23.v1"],
    &["b_full.v1", "b_inc.v1"],
    &["b_full.v1", "b_inc.v2"],
    &["tiny.v1"],
    &["tiny.v2"],
    &["ooo.v1"],
    &["comp.v2c"],
    &["multi.v1"],
    &["multi_noe.v1"],
];

fn receive_file(
    stream: &Path,
    dir: &Path,
    opts: &ReceiveOptions,
) -> Result<receive::Summary, ReceiveError> {
    let f = fs::File::open(stream).unwrap_or_else(|e| panic!("{}: {e}", stream.display()));
    receive::receive(f, dir, opts, &mut NoProgress)
}

/// Manifest with hole maps, without `btrfs.*` xattrs.
pub(super) fn manifest_of(root: &Path) -> String {
    let m = manifest::manifest(root, Options { holes: true })
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    m.lines()
        .map(|l| {
            l.split(' ')
                .filter(|f| !f.starts_with("xattr:btrfs."))
                .collect::<Vec<_>>()
                .join(" ")
                + "\n"
        })
        .collect()
}

pub(super) fn subvol_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        // The records (`.btrsend`) and the resume points
        // (`.btrsend-resume`) are not received subvolumes.
        .filter(|n| !n.starts_with(".btrsend"))
        .collect();
    v.sort();
    v
}

pub(super) fn run(cmd: &mut Proc) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Whether live kernel tests can run; with `CI` set they must.
pub(super) fn can_run_live(what: &str) -> bool {
    let root = rustix::process::geteuid().is_root();
    let tools = ["btrfs", "mkfs.btrfs", "losetup", "mount"].iter().all(|t| {
        Proc::new("sh")
            .arg("-c")
            .arg(format!("command -v {t}"))
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if root && tools {
        return true;
    }
    let why = if root {
        "btrfs-progs/util-linux missing"
    } else {
        "not root"
    };
    if std::env::var_os("CI").is_some() {
        panic!("{what}: cannot run ({why}) but CI is set");
    }
    eprintln!("SKIPPED: {what}: {why} (loop-mounted btrfs needed)");
    false
}

/// A loop-mounted btrfs made for one test; unmounted and detached on drop.
pub(super) struct LoopBtrfs {
    dev: String,
    pub(super) mnt: PathBuf,
    _tmp: tempfile::TempDir,
}

impl LoopBtrfs {
    pub(super) fn new(size: &str) -> LoopBtrfs {
        let tmp = tempfile::tempdir().unwrap();
        let img = tmp.path().join("img");
        run(Proc::new("truncate").arg("-s").arg(size).arg(&img));
        let dev = run(Proc::new("losetup").arg("-f").arg("--show").arg(&img));
        let mnt = tmp.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        let l = LoopBtrfs {
            dev,
            mnt,
            _tmp: tmp,
        };
        l.remake();
        l
    }

    /// A fresh filesystem: `btrfs receive` finds parents by UUID across the
    /// whole filesystem, so chains that share UUIDs must not meet.
    pub(super) fn remake(&self) {
        let _ = Proc::new("umount").arg(&self.mnt).output();
        run(Proc::new("mkfs.btrfs").arg("-q").arg("-f").arg(&self.dev));
        run(Proc::new("mount").arg(&self.dev).arg(&self.mnt));
    }
}

impl Drop for LoopBtrfs {
    fn drop(&mut self) {
        let _ = Proc::new("umount").arg(&self.mnt).output();
        let _ = Proc::new("losetup").arg("-d").arg(&self.dev).output();
    }
}

#[test]
fn shared_streams_match_btrfs_receive() {
    let streams = streams_dir();
    if !can_run_live("receive vs btrfs receive") {
        return;
    }
    let lb = LoopBtrfs::new("512M");
    let out = tempfile::tempdir().unwrap();
    let mut compared = 0;
    let mut failures = Vec::new();
    for (i, chain) in CHAINS.iter().enumerate() {
        lb.remake();
        let kdir = lb.mnt.join("k");
        fs::create_dir(&kdir).unwrap();
        let bdir = out.path().join(format!("c{i}"));
        fs::create_dir(&bdir).unwrap();
        for s in *chain {
            let file = streams.join(format!("{s}.stream"));
            run(Proc::new("btrfs")
                .arg("receive")
                .arg("-q")
                .arg("-f")
                .arg(&file)
                .arg(&kdir));
            receive_file(&file, &bdir, &ReceiveOptions::new())
                .unwrap_or_else(|e| panic!("{s}: {e}"));
        }
        let names = subvol_names(&kdir);
        assert_eq!(names, subvol_names(&bdir), "chain {chain:?}: subvolumes");
        for n in names {
            let (k, b) = (manifest_of(&kdir.join(&n)), manifest_of(&bdir.join(&n)));
            assert!(k.lines().count() > 1, "empty kernel manifest for {n}");
            if let Some(d) = manifest::diff(&k, &b, 20) {
                failures.push(format!("chain {chain:?} subvolume {n}:\n{d}"));
            }
            let rec =
                fs::read_to_string(bdir.join(".btrsend").join(format!("{n}.subvol"))).unwrap();
            assert!(rec.ends_with("state=complete\n"), "{n}: {rec}");
            compared += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(compared, 27);
}

#[test]
fn shared_streams_are_received_in_order() {
    // Without root: every chain is accepted and every subvolume completed.
    let streams = streams_dir();
    let out = tempfile::tempdir().unwrap();
    for (i, chain) in CHAINS.iter().enumerate() {
        let dir = out.path().join(format!("c{i}"));
        fs::create_dir(&dir).unwrap();
        for s in *chain {
            receive_file(
                &streams.join(format!("{s}.stream")),
                &dir,
                &ReceiveOptions::new(),
            )
            .unwrap_or_else(|e| panic!("{s}: {e}"));
        }
    }
    // tiny.v1: the values its kernel dump (tiny.v1.dump) shows.
    let f = out.path().join("c8/tiny.snap/d/f");
    assert_eq!(fs::read(&f).unwrap(), b"hi\n");
    let m = manifest::manifest(&out.path().join("c8/tiny.snap"), Options::default()).unwrap();
    assert!(
        m.contains("d/f file mode=0640 uid=1000 gid=1000 size=3 mtime=1704164645.123456789 "),
        "{m}"
    );
    // -e stops at the first END: multi_noe has two streams.
    let dir = out.path().join("e");
    fs::create_dir(&dir).unwrap();
    let mut opts = ReceiveOptions::new();
    opts.stop_at_end = true;
    receive_file(&streams.join("multi_noe.v1.stream"), &dir, &opts).unwrap();
    assert_eq!(subvol_names(&dir), ["tiny.snap"]);
}

#[test]
fn nodata_stream_is_refused() {
    let streams = streams_dir();
    let out = tempfile::tempdir().unwrap();
    receive_file(
        &streams.join("full.v1.stream"),
        out.path(),
        &ReceiveOptions::new(),
    )
    .unwrap();
    let e = receive_file(
        &streams.join("nodata.v1.stream"),
        out.path(),
        &ReceiveOptions::new(),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("UPDATE_EXTENT") && msg.contains("--no-data"),
        "{msg}"
    );
    let rec = fs::read_to_string(out.path().join(".btrsend/src.s2.subvol")).unwrap();
    assert!(rec.ends_with("state=incomplete\n"), "{rec}");
}

// ---- corrupt and truncated streams ----

/// (offset, command number, payload length) of every command, walked by
/// hand from the 10-byte headers not by our reader.
fn command_offsets(bytes: &[u8]) -> Vec<(usize, u16, usize)> {
    let mut out = Vec::new();
    let mut pos = 17;
    while pos + 10 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        let cmd = u16::from_le_bytes(bytes[pos + 4..pos + 6].try_into().unwrap());
        out.push((pos, cmd, len));
        pos += 10 + len;
        if cmd == 21 && pos + 17 <= bytes.len() {
            pos += 17;
        }
    }
    out
}

fn record(dir: &Path, name: &str) -> String {
    fs::read_to_string(dir.join(".btrsend").join(format!("{name}.subvol"))).unwrap()
}

/// `parent_uuid=… parent_transid=…` of a stream's snapshot line, from its
/// `btrfs receive --dump` text.
fn dump_parent(dump: &str) -> (String, String) {
    let line = dump.lines().find(|l| l.starts_with("snapshot")).unwrap();
    let field = |k: &str| {
        line.split(' ')
            .find_map(|f| f.strip_prefix(k))
            .unwrap()
            .to_string()
    };
    (field("parent_uuid="), field("parent_transid="))
}

#[test]
fn truncated_stream_names_offset_and_command_and_leaves_parent_unusable() {
    let streams = streams_dir();
    let bytes = fs::read(streams.join("full.v1.stream")).unwrap();
    let cmds = command_offsets(&bytes);
    // Cut in the middle of the 5th WRITE.
    let (i, &(off, _, len)) = cmds
        .iter()
        .enumerate()
        .filter(|(_, c)| c.1 == 15)
        .nth(4)
        .unwrap();
    let cut = &bytes[..off + 10 + len / 2];
    let out = tempfile::tempdir().unwrap();
    let e = receive::receive(
        Cursor::new(cut),
        out.path(),
        &ReceiveOptions::new(),
        &mut NoProgress,
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("command {i} (WRITE) at stream offset {off}")),
        "{msg}"
    );
    assert!(msg.contains("truncated") && msg.contains("src.s1"), "{msg}");
    assert!(record(out.path(), "src.s1").ends_with("state=incomplete\n"));
    // The incremental stream on top is refused, naming the parent.
    let (pu, pt) = dump_parent(&fs::read_to_string(streams.join("inc12.v1.dump")).unwrap());
    let e = receive_file(
        &streams.join("inc12.v1.stream"),
        out.path(),
        &ReceiveOptions::new(),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("uuid {pu} ctransid {pt}")) && msg.contains("incompletely"),
        "{msg}"
    );
    assert!(!out.path().join("src.s2").exists());
}

#[test]
fn crc_error_names_offset_and_command_and_max_errors_goes_on() {
    let streams = streams_dir();
    let mut bytes = fs::read(streams.join("tiny.v1.stream")).unwrap();
    let cmds = command_offsets(&bytes);
    let (i, &(off, _, len)) = cmds.iter().enumerate().find(|(_, c)| c.1 == 15).unwrap();
    // Flip the last data byte of the WRITE.
    bytes[off + 10 + len - 1] ^= 0xff;
    let out = tempfile::tempdir().unwrap();
    let e = receive::receive(
        Cursor::new(&bytes),
        out.path(),
        &ReceiveOptions::new(),
        &mut NoProgress,
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "crc32 mismatch in command {i} (WRITE) at stream offset {off}"
        )),
        "{msg}"
    );
    assert!(record(out.path(), "tiny.snap").ends_with("state=incomplete\n"));
    // -E 0: every error is reported, the rest is applied, the subvolume stays
    // incomplete.
    struct Count(std::sync::atomic::AtomicU32);
    impl Progress for Count {
        fn error(&self, _: &dyn std::error::Error) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let out = tempfile::tempdir().unwrap();
    let mut opts = ReceiveOptions::new();
    opts.max_errors = 0;
    let mut c = Count(0.into());
    let e = receive::receive(Cursor::new(&bytes), out.path(), &opts, &mut c).unwrap_err();
    assert!(matches!(e, ReceiveError::Errors(1)), "{e}");
    assert_eq!(c.0.into_inner(), 1);
    assert!(out.path().join("tiny.snap/d/f").exists());
    assert!(record(out.path(), "tiny.snap").ends_with("state=incomplete\n"));
}

#[test]
fn missing_parent_names_uuid_and_ctransid() {
    let streams = streams_dir();
    let out = tempfile::tempdir().unwrap();
    let (pu, pt) = dump_parent(&fs::read_to_string(streams.join("inc12.v2.dump")).unwrap());
    let e = receive_file(
        &streams.join("inc12.v2.stream"),
        out.path(),
        &ReceiveOptions::new(),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "cannot find parent subvolume with uuid {pu} ctransid {pt}"
        )),
        "{msg}"
    );
    assert!(
        msg.contains("command 0 (SNAPSHOT) at stream offset 17"),
        "{msg}"
    );
    assert!(subvol_names(out.path()).is_empty());
}

// ---- hostile streams ----

fn p(s: &str) -> Cow<'_, [u8]> {
    Cow::Borrowed(s.as_bytes())
}

/// A v2 stream of `cmds`, ended by the writer's END.
fn stream(cmds: &[Command<'_>]) -> Vec<u8> {
    let mut w = StreamWriter::new(Vec::new(), 2).unwrap();
    for c in cmds {
        w.write(c).unwrap();
    }
    w.finish().unwrap()
}

fn subvol(name: &str) -> Command<'_> {
    Command::Subvol {
        path: p(name),
        uuid: [7; 16],
        ctransid: 1,
    }
}

/// A tree beside DIR that no stream may touch, and its manifest.
struct Sandbox {
    tmp: tempfile::TempDir,
    before: String,
}

impl Sandbox {
    fn new() -> Sandbox {
        let tmp = tempfile::tempdir().unwrap();
        let s = tmp.path().join("sentinel");
        fs::create_dir_all(s.join("sub")).unwrap();
        fs::write(s.join("secret"), b"SECRET-BYTES-0123456789").unwrap();
        fs::write(s.join("sub/file"), b"keep").unwrap();
        fs::create_dir(tmp.path().join("dir")).unwrap();
        let before = Sandbox::snapshot(tmp.path());
        Sandbox { tmp, before }
    }

    /// The manifest of everything beside DIR (DIR itself excluded).
    fn snapshot(root: &Path) -> String {
        let mut text = manifest::manifest(&root.join("sentinel"), Options { holes: true }).unwrap();
        let mut names: Vec<String> = fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        text.push_str(&names.join(","));
        text
    }

    fn dir(&self) -> PathBuf {
        self.tmp.path().join("dir")
    }

    fn sentinel(&self) -> String {
        self.tmp
            .path()
            .join("sentinel")
            .to_string_lossy()
            .into_owned()
    }

    fn check(&self, case: &str) {
        let now = Sandbox::snapshot(self.tmp.path());
        assert_eq!(self.before, now, "{case}: something outside DIR changed");
        // Nothing read from outside landed inside.
        let m = manifest::manifest(&self.dir(), Options::default()).unwrap();
        let secret_hash = blake3_of(b"SECRET-BYTES-0123456789");
        assert!(
            !m.contains(&secret_hash),
            "{case}: the secret was copied into DIR:\n{m}"
        );
    }
}

fn blake3_of(b: &[u8]) -> String {
    // The manifest's b3= content hash: write a file and ask the manifest
    // (so this follows the manifest's definition).
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("f"), b).unwrap();
    let m = manifest::manifest(t.path(), Options::default()).unwrap();
    let line = m.lines().find(|l| l.starts_with("f ")).unwrap();
    line.split(' ')
        .find_map(|f| f.strip_prefix("b3="))
        .unwrap()
        .to_string()
}

/// Receive `bytes` with `-E 0`; return every error message.
fn receive_hostile(dir: &Path, bytes: &[u8]) -> Vec<String> {
    struct Collect(std::sync::Mutex<Vec<String>>);
    impl Progress for Collect {
        fn error(&self, e: &dyn std::error::Error) {
            self.0.lock().unwrap().push(e.to_string());
        }
    }
    let mut c = Collect(Default::default());
    let mut opts = ReceiveOptions::new();
    opts.max_errors = 0;
    let r = receive::receive(Cursor::new(bytes), dir, &opts, &mut c);
    if let Err(e) = r
        && !matches!(e, ReceiveError::Errors(_))
    {
        c.0.get_mut().unwrap().push(e.to_string());
    }
    c.0.into_inner().unwrap()
}

#[test]
fn hostile_subvolume_names_are_refused() {
    let sb = Sandbox::new();
    let names = ["/abs", "..", ".", "a/b", "../sentinel", ".btrsend", ""];
    for n in names {
        let errs = receive_hostile(&sb.dir(), &stream(&[subvol(n)]));
        assert_eq!(errs.len(), 1, "{n:?}: {errs:?}");
        assert!(
            errs[0].contains("cannot apply command 0 (SUBVOL)"),
            "{n:?}: {errs:?}"
        );
        sb.check(n);
    }
    // The absolute name of the sentinel itself.
    let s = sb.sentinel();
    let errs = receive_hostile(&sb.dir(), &stream(&[subvol(&s)]));
    assert!(errs.len() == 1 && errs[0].contains("absolute"), "{errs:?}");
    // A snapshot name climbing out, and one with an unknown parent.
    let snap = |n| Command::Snapshot {
        path: p(n),
        uuid: [8; 16],
        ctransid: 2,
        clone_uuid: [9; 16],
        clone_ctransid: 3,
    };
    let errs = receive_hostile(&sb.dir(), &stream(&[snap("../x")]));
    assert!(
        errs.len() == 1 && errs[0].contains("in subvolume name refused"),
        "{errs:?}"
    );
    sb.check("snapshot ../x");
    assert!(
        fs::read_dir(sb.dir())
            .unwrap()
            .all(|e| e.unwrap().file_name() == ".btrsend")
    );
}

#[test]
fn hostile_paths_are_refused() {
    let sb = Sandbox::new();
    let s = sb.sentinel();
    let abs_secret = format!("{s}/secret");
    let abs_sub = format!("{s}/sub");
    let abs_new = format!("{s}/new");
    let t = Timespec { sec: 1, nsec: 0 };
    let data = Cow::Borrowed(&b"EVIL"[..]);
    // Set-up commands that are fine, then hostile ones that must each fail.
    let setup = vec![
        subvol("sv"),
        Command::Mkdir {
            path: p("d"),
            ino: 257,
        },
        Command::Mkfile {
            path: p("f"),
            ino: 258,
        },
        Command::Write {
            path: p("f"),
            offset: 0,
            data: data.clone(),
        },
        // Symlinks pointing outside, created verbatim (never followed).
        Command::Symlink {
            path: p("out"),
            ino: 259,
            path_link: p(&s),
        },
        Command::Symlink {
            path: p("d/up"),
            ino: 260,
            path_link: p("../.."),
        },
        Command::Symlink {
            path: p("sec"),
            ino: 261,
            path_link: p(&abs_secret),
        },
        Command::Symlink {
            path: p("subl"),
            ino: 262,
            path_link: p(&abs_sub),
        },
    ];
    let hostile = vec![
        Command::Mkfile {
            path: p(&abs_new),
            ino: 300,
        },
        Command::Mkfile {
            path: p("../new"),
            ino: 301,
        },
        Command::Mkfile {
            path: p("d/../../new"),
            ino: 302,
        },
        Command::Mkfile {
            path: p("out/new"),
            ino: 303,
        },
        Command::Mkdir {
            path: p("d/up/sentinel/newdir"),
            ino: 304,
        },
        Command::Write {
            path: p("out/secret"),
            offset: 0,
            data: data.clone(),
        },
        Command::Write {
            path: p("sec"),
            offset: 0,
            data: data.clone(),
        },
        Command::Write {
            path: p("d/up/sentinel/secret"),
            offset: 0,
            data: data.clone(),
        },
        Command::Truncate {
            path: p("sec"),
            size: 0,
        },
        Command::Truncate {
            path: p("subl/file"),
            size: 0,
        },
        Command::Fallocate {
            path: p("sec"),
            mode: 3,
            offset: 0,
            size: 4096,
        },
        Command::Rename {
            path: p("f"),
            path_to: p("../f"),
        },
        Command::Rename {
            path: p("f"),
            path_to: p("out/f"),
        },
        Command::Rename {
            path: p("out/secret"),
            path_to: p("stolen"),
        },
        Command::Rename {
            path: p("d/up/sentinel/sub"),
            path_to: p("stolen"),
        },
        Command::Link {
            path: p("stolen"),
            path_link: p("out/secret"),
        },
        Command::Link {
            path: p("stolen"),
            path_link: p(&abs_secret),
        },
        Command::Link {
            path: p("out/l"),
            path_link: p("f"),
        },
        Command::Unlink {
            path: p("out/secret"),
        },
        Command::Unlink {
            path: p("../sentinel/secret"),
        },
        Command::Rmdir { path: p("out/sub") },
        Command::Rmdir { path: p("subl/") },
        Command::SetXattr {
            path: p("out/secret"),
            name: p("user.evil"),
            data: data.clone(),
        },
        Command::RemoveXattr {
            path: p("subl/file"),
            name: p("user.x"),
        },
        Command::Chmod {
            path: p("out/secret"),
            mode: 0o777,
        },
        Command::Chown {
            path: p("out/secret"),
            uid: 1234,
            gid: 1234,
        },
        Command::Utimes {
            path: p("subl/file"),
            atime: t,
            mtime: t,
            ctime: t,
            otime: None,
        },
        Command::Clone {
            offset: 0,
            len: 23,
            path: p("f"),
            clone_uuid: [7; 16],
            clone_ctransid: 1,
            clone_path: p("out/secret"),
            clone_offset: 0,
        },
        Command::Clone {
            offset: 0,
            len: 23,
            path: p("f"),
            clone_uuid: [7; 16],
            clone_ctransid: 1,
            clone_path: p("../sentinel/secret"),
            clone_offset: 0,
        },
        Command::Clone {
            offset: 0,
            len: 23,
            path: p("f"),
            clone_uuid: [7; 16],
            clone_ctransid: 1,
            clone_path: p("sec"),
            clone_offset: 0,
        },
        Command::Clone {
            offset: 0,
            len: 23,
            path: p("f"),
            clone_uuid: [0x55; 16],
            clone_ctransid: 1,
            clone_path: p("f"),
            clone_offset: 0,
        },
        Command::EncodedWrite {
            path: p("subl/file"),
            offset: 0,
            unencoded_file_len: 4,
            unencoded_len: 4,
            unencoded_offset: 0,
            compression: Some(0),
            encryption: None,
            data: data.clone(),
        },
    ];
    // Allowed on the symlink itself, never on what it points to.
    let harmless = [
        Command::Chmod {
            path: p("sec"),
            mode: 0o777,
        },
        Command::Chown {
            path: p("sec"),
            uid: 0,
            gid: 0,
        },
        Command::Utimes {
            path: p("sec"),
            atime: t,
            mtime: t,
            ctime: t,
            otime: None,
        },
        Command::Utimes {
            path: p("out"),
            atime: t,
            mtime: t,
            ctime: t,
            otime: None,
        },
    ];
    let mut all = setup.clone();
    all.extend(hostile.iter().cloned());
    all.extend(harmless.iter().cloned());
    let errs = receive_hostile(&sb.dir(), &stream(&all));
    // Each hostile command failed, in order; nothing else did.
    let n_setup = setup.len() as u64;
    for (k, c) in hostile.iter().enumerate() {
        let want = format!(
            "cannot apply command {} ({})",
            n_setup + k as u64,
            c.kind().unwrap()
        );
        assert!(
            errs.iter().any(|e| e.starts_with(&want)),
            "no error for {want}: {errs:#?}"
        );
    }
    assert_eq!(errs.len(), hostile.len(), "{errs:#?}");
    sb.check("hostile paths");
    // The set-up ones did their work inside DIR.
    let sv = sb.dir().join("sv");
    assert_eq!(fs::read(sv.join("f")).unwrap(), b"EVIL");
    assert_eq!(fs::read_link(sv.join("out")).unwrap(), Path::new(&s));
    assert!(record(&sb.dir(), "sv").ends_with("state=incomplete\n"));
}

#[test]
fn hostile_records_dir_and_existing_subvolume_are_refused() {
    let sb = Sandbox::new();
    // DIR/<name> exists (as a symlink to the sentinel): refused, not followed.
    std::os::unix::fs::symlink(sb.sentinel(), sb.dir().join("sv")).unwrap();
    let bytes = stream(&[
        subvol("sv"),
        Command::Mkfile {
            path: p("x"),
            ino: 257,
        },
        Command::Write {
            path: p("secret"),
            offset: 0,
            data: Cow::Borrowed(b"EVIL"),
        },
    ]);
    let errs = receive_hostile(&sb.dir(), &bytes);
    assert!(errs[0].contains("exists already"), "{errs:?}");
    sb.check("existing subvolume");
    fs::remove_file(sb.dir().join("sv")).unwrap();
    // The records directory is a symlink to the sentinel: refused.
    std::os::unix::fs::symlink(sb.sentinel(), sb.dir().join(".btrsend")).unwrap();
    let errs = receive_hostile(&sb.dir(), &stream(&[subvol("sv2")]));
    assert!(!errs.is_empty(), "a symlinked .btrsend was followed");
    sb.check("records dir symlink");
}

/// The receiver keeps resolved directories and the file being written open
/// between commands (and creates an orphan-named entry that is renamed right
/// away at its final name). Renames and removals must leave no stale name:
/// a directory renamed away, replaced by a new one or by a symlink to the
/// outside, and a file renamed or unlinked under the open file.
#[test]
fn cached_directories_and_files_follow_renames_and_removals() {
    let sb = Sandbox::new();
    let s = sb.sentinel();
    let data = |b: &'static [u8]| Cow::Borrowed(b);
    let write = |path: &'static str, d: &'static [u8]| Command::Write {
        path: p(path),
        offset: 0,
        data: data(d),
    };
    let ren = |a: &'static str, b: &'static str| Command::Rename {
        path: p(a),
        path_to: p(b),
    };
    let bytes = stream(&[
        subvol("sv"),
        // Orphan then rename (as the kernel does), a file in it.
        Command::Mkdir {
            path: p("o257-1-0"),
            ino: 257,
        },
        ren("o257-1-0", "a"),
        Command::Mkfile {
            path: p("o258-1-0"),
            ino: 258,
        },
        ren("o258-1-0", "a/f"),
        write("a/f", b"first"),
        // The directory moves away; a new one takes its name.
        ren("a", "b"),
        write("b/f", b"FIRST"),
        Command::Mkdir {
            path: p("a"),
            ino: 259,
        },
        Command::Mkfile {
            path: p("a/f"),
            ino: 260,
        },
        write("a/f", b"second"),
        // The open file is renamed, then another file takes its old name.
        ren("a/f", "a/g"),
        write("a/g", b"SECOND"),
        Command::Mkfile {
            path: p("a/f"),
            ino: 261,
        },
        write("a/f", b"third"),
        Command::Unlink { path: p("a/f") },
        // Writing to the unlinked name fails; nothing else is touched.
        write("a/f", b"EVIL"),
        // A directory removed and made again: the new one is used.
        Command::Mkdir {
            path: p("d"),
            ino: 270,
        },
        Command::Mkfile {
            path: p("d/x"),
            ino: 271,
        },
        Command::Unlink { path: p("d/x") },
        Command::Rmdir { path: p("d") },
        Command::Mkdir {
            path: p("d"),
            ino: 272,
        },
        Command::Mkfile {
            path: p("d/y"),
            ino: 273,
        },
        // The directory moves away and a symlink to the outside takes its
        // name: its cached fd must not be used.
        ren("a", "c"),
        Command::Symlink {
            path: p("a"),
            ino: 262,
            path_link: Cow::Owned(s.as_bytes().to_vec()),
        },
        Command::Mkfile {
            path: p("a/new"),
            ino: 263,
        },
        write("a/secret", b"EVIL"),
        // A created-then-renamed entry whose destination exists: the
        // rename replaces it, as it would without the shortcut.
        Command::Mkfile {
            path: p("o264-1-0"),
            ino: 264,
        },
        ren("o264-1-0", "b/f"),
        write("b/f", b"replaced"),
    ]);
    let errs = receive_hostile(&sb.dir(), &bytes);
    assert_eq!(errs.len(), 3, "{errs:#?}");
    assert!(errs[0].contains("WRITE \"a/f\""), "{errs:?}");
    assert!(errs[1].contains("MKFILE \"a/new\""), "{errs:?}");
    assert!(errs[2].contains("WRITE \"a/secret\""), "{errs:?}");
    sb.check("cached names");
    let sv = sb.dir().join("sv");
    assert_eq!(fs::read(sv.join("b/f")).unwrap(), b"replaced");
    assert_eq!(fs::read_link(sv.join("a")).unwrap(), Path::new(&s));
    assert_eq!(fs::read(sv.join("c/g")).unwrap(), b"SECOND");
    assert!(sv.join("d/y").is_file() && !sv.join("c/new").exists());
    let mut names: Vec<String> = fs::read_dir(&sv)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a", "b", "c", "d"]);
    assert_eq!(
        fs::read_dir(sv.join("b")).unwrap().count(),
        1,
        "only b/f (no orphan names left)"
    );
    // The same stream without the replacement: the renamed file kept its
    // data, written through the names it had at each step.
    let sb2 = Sandbox::new();
    let bytes = stream(&[
        subvol("sv"),
        Command::Mkdir {
            path: p("o257-1-0"),
            ino: 257,
        },
        ren("o257-1-0", "a"),
        Command::Mkfile {
            path: p("o258-1-0"),
            ino: 258,
        },
        ren("o258-1-0", "a/f"),
        write("a/f", b"first"),
        ren("a", "b"),
        Command::Write {
            path: p("b/f"),
            offset: 5,
            data: data(b"+more"),
        },
        Command::Mkdir {
            path: p("a"),
            ino: 259,
        },
        Command::Mkfile {
            path: p("a/f"),
            ino: 260,
        },
        write("a/f", b"second"),
        ren("a/f", "a/g"),
        Command::Write {
            path: p("a/g"),
            offset: 6,
            data: data(b"+more"),
        },
        Command::Chmod {
            path: p("a/g"),
            mode: 0o640,
        },
    ]);
    let errs = receive_hostile(&sb2.dir(), &bytes);
    assert!(errs.is_empty(), "{errs:#?}");
    let sv = sb2.dir().join("sv");
    assert_eq!(fs::read(sv.join("b/f")).unwrap(), b"first+more");
    assert_eq!(fs::read(sv.join("a/g")).unwrap(), b"second+more");
    assert!(!sv.join("a/f").exists());
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        fs::metadata(sv.join("a/g")).unwrap().permissions().mode() & 0o7777,
        0o640
    );
    sb2.check("cached names, no errors");
}

#[test]
fn hostile_device_nodes_are_never_opened() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: hostile_device_nodes_are_never_opened needs root (mknod)");
        return;
    }
    let sb = Sandbox::new();
    // /dev/zero's numbers: a WRITE or CLONE through it must not open it.
    let rdev = (1 << 8) | 5;
    let bytes = stream(&[
        subvol("sv"),
        Command::Mknod {
            path: p("zero"),
            ino: 257,
            rdev,
            mode: 0o20644,
        },
        Command::Mkfifo {
            path: p("fifo"),
            ino: 258,
            rdev: Some(0),
            mode: Some(0o10644),
        },
        Command::Write {
            path: p("zero"),
            offset: 0,
            data: Cow::Borrowed(b"x"),
        },
        Command::Truncate {
            path: p("fifo"),
            size: 0,
        },
        Command::Mknod {
            path: p("dir"),
            ino: 259,
            rdev: 0,
            mode: 0o40755,
        },
    ]);
    let errs = receive_hostile(&sb.dir(), &bytes);
    assert_eq!(errs.len(), 3, "{errs:#?}");
    assert!(
        errs[0].contains("not a regular file (character device)"),
        "{errs:?}"
    );
    assert!(errs[1].contains("not a regular file (fifo)"), "{errs:?}");
    assert!(errs[2].contains("invalid mode 40755"), "{errs:?}");
    sb.check("devices");
}

// ---- kernel fixtures (tests/fixtures/NNN-name) ----

fn strip_btrfs_xattrs(m: &str) -> String {
    m.lines()
        .map(|l| {
            l.split(' ')
                .filter(|f| !f.starts_with("xattr:btrfs."))
                .collect::<Vec<_>>()
                .join(" ")
                + "\n"
        })
        .collect()
}

/// One receive of the fixture test: a snapshot's full stream, or a pair's
/// chain (the parent's full stream, then the incremental one).
struct FixtureCase<'a> {
    meta: &'a FixtureMeta,
    /// The snapshot the chain ends with (its path in `meta.txt`).
    snapshot: &'a str,
    streams: Vec<PathBuf>,
}

impl FixtureCase<'_> {
    fn what(&self) -> String {
        let names: Vec<String> = self
            .streams
            .iter()
            .map(|s| {
                s.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .replace(".stream.zst", "")
            })
            .collect();
        format!("{} [{}]", self.meta.name(), names.join(" then "))
    }
}

fn fixture_cases(metas: &[FixtureMeta]) -> Vec<FixtureCase<'_>> {
    let mut cases = Vec::new();
    for meta in metas {
        for v in ["v1", "v2c"] {
            for snap in &meta.snapshots {
                cases.push(FixtureCase {
                    meta,
                    snapshot: snap,
                    streams: vec![meta.full_stream(snap, v)],
                });
            }
            for pair in &meta.pairs {
                cases.push(FixtureCase {
                    meta,
                    snapshot: &pair.child,
                    streams: vec![meta.full_stream(&pair.parent, v), meta.inc_stream(pair, v)],
                });
            }
        }
    }
    cases
}

/// Every snapshot's full v1 and v2c streams, and every pair's chain (parent
/// full stream, then the incremental one), received by `btrsend receive`,
/// give the kernel mount's manifest of the source snapshot (`NAME.manifest`,
/// times, xattrs and hole maps included).
///
/// The target is a **tmpfs** (mounted by the test, so it needs root; in CI
/// it must run): of the filesystems at hand it is the one that can hold a
/// btrfs snapshot exactly. ext4 clamps times before 1901-12-13 (`001`'s
/// `times/year-1901`) and refuses xattr values larger than a block (`008`'s
/// 16220-byte value, ENOSPC); XFS stops at 1901-12-13 too. tmpfs has 64-bit
/// times, 64 KiB xattr values, `user.*`/`trusted.*`/`security.*` and ACLs,
/// and holes at 4 KiB pages like the fixtures' 4 KiB sectors.
///
/// Left out, because no receiver can restore them from the stream (the
/// rules are shared with the stock-receive test, `tests/integration/live.rs`,
/// in [`testing::compare`]):
/// * nested subvolumes (`subvol` lines): a send never includes them;
/// * `btrfs.*` xattrs (btrfs properties such as `btrfs.compression`): only
///   btrfs has them (receiving them elsewhere is a note);
/// * the mtime of a directory in which the stream creates orphan-named
///   inodes but which it never sends a UTIMES for (`007` r1→r2, the root).
///
/// Hole maps: the kernel's stream itself writes zeros for some holes (v1
/// has no FALLOCATE, so punched holes of an incremental arrive as zero
/// WRITEs; without `no_holes` even v2 sends hole extents as zero WRITEs;
/// prealloc ranges inside i_size are sent as zero WRITEs). A WRITE of zeros
/// cannot be told from a WRITE of data that is zero (`006` has such files),
/// so a receiver must write them. Where our hole map differs from the
/// source's, the test receives the same chain with the real `btrfs receive`
/// on a loop-mounted btrfs and requires: everything but `data=` equal,
/// every data range of the source kept (never a data range lost), and no
/// data range that the kernel's receive does not have too (never more zeros
/// written than `btrfs receive` writes).
#[test]
fn kernel_fixtures_match_source_manifests() {
    let test = "kernel_fixtures_match_source_manifests";
    if !testing::require_live(test) {
        return;
    }
    let mut metas = FixtureMeta::all().expect("tests/fixtures/*/meta.txt");
    // To debug one fixture: BTRSEND_FIXTURE=002 (a substring of its name).
    if let Ok(only) = std::env::var("BTRSEND_FIXTURE") {
        metas.retain(|m| m.name().contains(&only));
    }
    if metas.is_empty() {
        testing::skip_or_fail(test, "no tests/fixtures/*/meta.txt");
        return;
    }
    let tmpfs = testing::Tmpfs::new(4 << 30).expect("mount a tmpfs");
    let mut failures = Vec::new();
    let mut notes = Vec::new();
    let cases = fixture_cases(&metas);
    // Every chain with the data written on this thread (1) and by worker
    // threads (the default, and more lanes than files in most fixtures):
    // each against the kernel's manifest, so an ordering mistake of the
    // lanes shows as a difference.
    let runs = [1, ReceiveOptions::new().threads, 5];
    let all = runs.iter().flat_map(|&t| cases.iter().map(move |c| (t, c)));
    for (n, (threads, case)) in all.enumerate() {
        let what = format!("{} (threads {threads})", case.what());
        let dir = tmpfs.path().join(n.to_string());
        fs::create_dir(&dir).unwrap();
        let mut opts = ReceiveOptions::new();
        opts.threads = threads;
        let received = case.streams.iter().try_for_each(|s| {
            let input = testing::open_stream(s).expect("fixture stream");
            receive::receive(input, &dir, &opts, &mut NoProgress).map(|_| ())
        });
        if let Err(e) = received {
            failures.push(format!("{what}: {e}"));
            fs::remove_dir_all(&dir).unwrap();
            continue;
        }
        let name = FixtureMeta::snap_name(case.snapshot);
        let want: String = strip_btrfs_xattrs(&case.meta.manifest(case.snapshot).unwrap())
            .lines()
            .filter(|l| l.split(' ').nth(1) != Some("subvol"))
            .map(|l| format!("{l}\n"))
            .collect();
        let got = manifest_of(&dir.join(name));
        fs::remove_dir_all(&dir).unwrap();
        let last = case.streams.last().unwrap();
        let exempt = compare::orphan_dirs_without_utimes(testing::open_stream(last).unwrap())
            .expect("kernel stream decodes");
        let adjusted = compare::exempt_mtimes(&want, &got, &exempt);
        if adjusted != got {
            notes.push(format!(
                "{what}: mtime of {} not restorable (orphans made in it, no UTIMES of it)",
                exempt.join(", ")
            ));
        }
        let got = adjusted;
        let Some(d) = manifest::diff(&want, &got, 10) else {
            continue;
        };
        if let Some(d) = manifest::diff(
            &manifest::strip_holes(&want),
            &manifest::strip_holes(&got),
            10,
        ) {
            failures.push(format!("{what}:\n{d}"));
            continue;
        }
        // Only hole maps differ: hold them against the stock receiver's.
        let kernel = LiveBtrfs::new().expect("scratch btrfs");
        let streams: Vec<&Path> = case.streams.iter().map(PathBuf::as_path).collect();
        kernel
            .receive("r", &streams)
            .expect("btrfs receive of a fixture chain");
        let theirs = kernel
            .manifest(&format!("r/{name}"), Options { holes: true })
            .unwrap();
        drop(kernel);
        let check = compare::data_within(&want, &got)
            .map_err(|e| format!("source data lost: {e}"))
            .and_then(|()| {
                compare::data_within(&got, &theirs)
                    .map_err(|e| format!("zeros written where btrfs receive keeps a hole: {e}"))
            });
        match check {
            Ok(()) => {
                let differ: Vec<String> = compare::data_ranges(&got)
                    .into_iter()
                    .filter(|(p, r)| compare::data_ranges(&want).get(p) != Some(r))
                    .map(|(p, _)| p)
                    .collect();
                let same = compare::data_ranges(&theirs) == compare::data_ranges(&got);
                notes.push(format!(
                    "{what}: zeros written by the stream made data of holes in {} (btrfs receive: {})",
                    differ.join(", "),
                    if same { "the same maps" } else { "more data" }
                ));
            }
            Err(e) => failures.push(format!("{what}: {e}\n{d}")),
        }
    }
    eprintln!(
        "{test}: {} receives ({} chains, threads {runs:?}) from {} fixture dirs into tmpfs; notes:\n  {}",
        cases.len() * runs.len(),
        cases.len(),
        metas.len(),
        notes.join("\n  ")
    );
    assert!(
        failures.is_empty(),
        "{} of {} failed:\n{}",
        failures.len(),
        cases.len() * runs.len(),
        failures.join("\n")
    );
}

/// File extent items with compressed data in `tree` of the btrfs mounted at
/// `fs`, from `btrfs inspect-internal dump-tree` (the kernel's on-disk
/// record, read after a sync).
fn compressed_extents(fs: &LiveBtrfs, trees: &[u64]) -> usize {
    run(Proc::new("sync").arg("-f").arg(fs.path()));
    let dev = fs.loop_devices().unwrap().remove(0);
    trees
        .iter()
        .map(|t| {
            let out = run(Proc::new("btrfs")
                .args(["inspect-internal", "dump-tree", "-t", &t.to_string()])
                .arg(&dev));
            out.lines()
                .filter(|l| {
                    let l = l.trim_start();
                    l.starts_with("extent compression ") && !l.starts_with("extent compression 0")
                })
                .count()
        })
        .sum()
}

/// `--compressed-data` streams into a btrfs as root: the compressed extents
/// are written as they are (`BTRFS_IOC_ENCODED_WRITE`), as `btrfs receive`
/// writes them, and the files are the source's. Fixture 006 (zlib, LZO,
/// zstd, inline and partially referenced extents), c1 then the c1→c2
/// incremental stream, received three times into fresh filesystems mounted
/// without compression: by `btrfs receive` (the oracle), by btrsend, and by
/// btrsend with `--force-decompress` (fewer compressed extents: only files
/// with a `btrfs.compression` property are compressed again by the kernel).
#[test]
fn compressed_data_is_written_encoded_on_btrfs() {
    let test = "compressed_data_is_written_encoded_on_btrfs";
    if !testing::require_live(test) {
        return;
    }
    let meta = FixtureMeta::all()
        .expect("tests/fixtures/*/meta.txt")
        .into_iter()
        .find(|m| m.name().starts_with("006"))
        .expect("fixture 006");
    let pair = meta.pairs.first().expect("006 has a pair");
    let streams = [
        meta.full_stream(&pair.parent, "v2c"),
        meta.inc_stream(pair, "v2c"),
    ];
    let kernel = LiveBtrfs::new().expect("scratch btrfs");
    let refs: Vec<&Path> = streams.iter().map(PathBuf::as_path).collect();
    kernel.receive("r", &refs).expect("btrfs receive of 006");
    // The received subvolumes are trees 256 and 257.
    let want_count = compressed_extents(&kernel, &[256, 257]);
    drop(kernel);
    assert!(
        want_count > 10,
        "kernel receive: {want_count} compressed extents"
    );
    let want: String = strip_btrfs_xattrs(&meta.manifest(&pair.child).unwrap())
        .lines()
        .filter(|l| l.split(' ').nth(1) != Some("subvol"))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut counts = Vec::new();
    for force in [false, true] {
        let fs = LiveBtrfs::new().expect("scratch btrfs");
        let mut opts = ReceiveOptions::new();
        opts.force_decompress = force;
        for s in &streams {
            let input = testing::open_stream(s).expect("fixture stream");
            receive::receive(input, fs.path(), &opts, &mut NoProgress)
                .unwrap_or_else(|e| panic!("{} (force {force}): {e}", s.display()));
        }
        let got = manifest_of(&fs.path().join(FixtureMeta::snap_name(&pair.child)));
        if let Some(d) = manifest::diff(&want, &got, 10) {
            panic!("006 c1->c2 v2c into btrfs (force_decompress {force}):\n{d}");
        }
        // As root on btrfs, btrsend makes real subvolumes too: 256 and
        // 257 (the snapshot of 256).
        counts.push(compressed_extents(&fs, &[256, 257]));
    }
    assert_eq!(
        counts[0], want_count,
        "compressed extents: btrsend {} vs btrfs receive {want_count}",
        counts[0]
    );
    assert!(
        counts[1] < want_count,
        "--force-decompress: {} compressed extents, not fewer than {want_count}",
        counts[1]
    );
}

/// A `btrfs.compression` property set in one snapshot and removed in the
/// next: the kernel's incremental stream carries a REMOVE_XATTR of it.
/// Into a filesystem without btrfs properties (tmpfs) the SET_XATTR is
/// noted and skipped, and so must be the REMOVE_XATTR (it failed the
/// receive with EOPNOTSUPP); the trees must be the kernel's otherwise.
#[test]
fn btrfs_property_removed_into_a_directory_is_skipped() {
    let test = "btrfs_property_removed_into_a_directory_is_skipped";
    if !testing::require_live(test) {
        return;
    }
    let src = LiveBtrfs::with_options(256 << 20, &[], "").expect("scratch btrfs");
    let mnt = src.path();
    let vol = mnt.join("vol");
    run(Proc::new("btrfs").args(["subvolume", "create"]).arg(&vol));
    for f in ["a", "b"] {
        fs::write(vol.join(f), vec![b'x'; 70_000]).unwrap();
        run(Proc::new("btrfs")
            .args(["property", "set"])
            .arg(vol.join(f))
            .args(["compression", "zstd"]));
    }
    run(Proc::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(&vol)
        .arg(mnt.join("s1")));
    run(Proc::new("btrfs")
        .args(["property", "set"])
        .arg(vol.join("a"))
        .args(["compression", ""]));
    fs::write(vol.join("b"), vec![b'y'; 50_000]).unwrap();
    run(Proc::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(&vol)
        .arg(mnt.join("s2")));
    run(&mut Proc::new("sync"));
    let work = tempfile::tempdir().unwrap();
    let full = work.path().join("full.stream");
    let inc = work.path().join("inc.stream");
    run(Proc::new("btrfs")
        .args(["send", "-q", "-f"])
        .arg(&full)
        .arg(mnt.join("s1")));
    run(Proc::new("btrfs")
        .args(["send", "-q", "-p"])
        .arg(mnt.join("s1"))
        .arg("-f")
        .arg(&inc)
        .arg(mnt.join("s2")));
    let dump = run(Proc::new("btrfs")
        .args(["receive", "--dump", "-f"])
        .arg(&inc));
    assert!(
        dump.lines()
            .any(|l| l.starts_with("remove_xattr") && l.contains("name=btrfs.compression")),
        "the kernel's stream has no REMOVE_XATTR of the property:\n{dump}"
    );
    let t = testing::Tmpfs::new(64 << 20).expect("tmpfs");
    let dir = t.path();
    let opts = ReceiveOptions::default();
    receive_file(&full, dir, &opts).unwrap_or_else(|e| panic!("full: {e:#}"));
    receive_file(&inc, dir, &opts).unwrap_or_else(|e| panic!("incremental: {e:#}"));
    for s in ["s1", "s2"] {
        let want = manifest_of(&mnt.join(s));
        let got = manifest_of(&dir.join(s));
        if let Some(d) = manifest::diff(&want, &got, 20) {
            panic!("{s} differs from the kernel's snapshot:\n{d}");
        }
    }
}

/// Entries of the source whose names look like btrsend's own trash
/// (`.btrsend-trash-…`, what a subvolume-mode receive keeps in the
/// subvolume's root between checkpoints) are part of the tree: a receive
/// into btrfs with checkpoints must keep them all, as the kernel's
/// snapshot has them (they were taken for trash and deleted).
#[test]
fn trash_like_names_in_the_root_are_received() {
    let test = "trash_like_names_in_the_root_are_received";
    if !testing::require_live(test) {
        return;
    }
    let src = LiveBtrfs::with_options(256 << 20, &[], "").expect("scratch btrfs");
    let mnt = src.path();
    let vol = mnt.join("vol");
    run(Proc::new("btrfs").args(["subvolume", "create"]).arg(&vol));
    for d in [".btrsend-trash-0", ".btrsend-trash-1", ".btrsend-trash-x"] {
        fs::create_dir(vol.join(d)).unwrap();
        fs::write(vol.join(d).join("kept"), d).unwrap();
    }
    fs::write(vol.join(".btrsend-trash-2"), b"a file").unwrap();
    // Enough data for several 1 MiB checkpoints.
    for f in 0..6u8 {
        fs::write(vol.join(format!("f{f}")), vec![f; 700_000]).unwrap();
    }
    run(Proc::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(&vol)
        .arg(mnt.join("snap")));
    run(&mut Proc::new("sync"));
    let work = tempfile::tempdir().unwrap();
    let stream = work.path().join("full.stream");
    run(Proc::new("btrfs")
        .args(["send", "-q", "-f"])
        .arg(&stream)
        .arg(mnt.join("snap")));
    let dst = LiveBtrfs::with_options(256 << 20, &[], "").expect("scratch btrfs");
    let mut opts = ReceiveOptions::default();
    opts.checkpoint_interval = 1 << 20;
    receive_file(&stream, dst.path(), &opts).unwrap_or_else(|e| panic!("receive: {e:#}"));
    let got_show = run(Proc::new("btrfs")
        .args(["subvolume", "show"])
        .arg(dst.path().join("snap")));
    assert!(got_show.contains("Received UUID"), "{got_show}");
    let want = manifest_of(&mnt.join("snap"));
    assert!(want.contains(".btrsend-trash-1/kept"), "{want}");
    let got = manifest_of(&dst.path().join("snap"));
    if let Some(d) = manifest::diff(&want, &got, 20) {
        panic!("the received subvolume differs from the kernel's snapshot:\n{d}");
    }
}
