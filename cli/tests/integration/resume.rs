//! Resume (issue 14): `btrsend receive --resume-token DIR/NAME`, `btrsend
//! send --resume TOKEN` and the continuation stream, live (root; required
//! in CI).
//!
//! A kernel-made filesystem holds a full snapshot of ~300 MB and an
//! incremental one (renames, deletions, overwrites, new data). Each stream
//! goes `btrsend send | (this test, a relay) | btrsend receive DIR` and is
//! interrupted at random points, over and over, each time continued from
//! the token the receiver prints: the sender killed (-9), the receiver
//! killed (-9), the pipe closed between them, the target filesystem full
//! (ENOSPC). Every subvolume finally has the kernel's manifest of its
//! source snapshot and the source's UUID as received UUID; every
//! interruption re-sends at most the bound (64 MiB with the default
//! checkpoints; the checkpoint interval plus the receiver's read-ahead
//! with the short interval that makes a hundred interruptions cheap).
//! Also: the stock `btrfs receive` refuses a continuation and creates
//! nothing; a whole stream received again continues the partial subvolume;
//! a token of another send is refused.

use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use btrsend::manifest::{self, Options};
use btrsend::testing::workload::Rng;
use btrsend::testing::{self, LiveBtrfs, Tmpfs};

use crate::common::btrsend;
use crate::common::{sh, snapshot_ro, write_random};

const MIB: u64 = 1 << 20;
/// Continuation header: magic, version, length, 101-byte token.
const CONT_HEADER: u64 = 13 + 4 + 4 + 101;

/// How an interruption happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// After N bytes: the sender is killed (-9), the receiver's input ends.
    KillSender,
    /// After N bytes: the receiver is killed (-9).
    KillReceiver,
    /// After N bytes: the relay closes both ends (the sender fails on a
    /// closed pipe, the receiver's input ends).
    ClosePipe,
    /// No cut: the target filesystem runs full.
    Enospc,
    /// No cut: runs to the end.
    None,
}

/// One send → relay → receive run; the bytes relayed and whether the
/// receive finished.
struct Run {
    relayed: u64,
    ok: bool,
    /// The receive finished (its sender may have been killed after it
    /// wrote the whole stream, when the cut was past its end).
    recv_ok: bool,
    stderr: String,
}

fn spawn_send(src: &Path, parent: Option<&Path>, token: Option<&str>) -> Child {
    let mut c = btrsend();
    c.arg("send");
    if let Some(t) = token {
        c.args(["--resume", t]);
    }
    if let Some(p) = parent {
        c.arg("-p").arg(p);
    }
    c.arg(src)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("btrsend send")
}

fn spawn_receive(dir: &Path, every: Option<u64>) -> Child {
    let mut c = btrsend();
    c.arg("receive").arg(dir);
    if let Some(n) = every {
        c.env("BTRSEND_CHECKPOINT_BYTES", n.to_string());
    }
    c.stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("btrsend receive")
}

fn read_all(mut r: impl Read) -> String {
    let mut s = String::new();
    let _ = r.read_to_string(&mut s);
    s
}

/// Relay the sender's stream to the receiver, cutting it as `cut` says
/// after `at` bytes.
fn relay(mut send: Child, mut recv: Child, cut: Cut, at: u64) -> Run {
    let mut from = send.stdout.take().unwrap();
    let mut to = recv.stdin.take().unwrap();
    let send_err = send.stderr.take().unwrap();
    let recv_err = recv.stderr.take().unwrap();
    // The stderr pipes are read on threads (a full pipe must not block).
    let se = std::thread::spawn(move || read_all(send_err));
    let re = std::thread::spawn(move || read_all(recv_err));
    let limit = match cut {
        Cut::KillSender | Cut::KillReceiver | Cut::ClosePipe => at,
        Cut::Enospc | Cut::None => u64::MAX,
    };
    let mut relayed = 0u64;
    let mut buf = vec![0u8; 256 << 10];
    while relayed < limit {
        let want = usize::try_from((limit - relayed).min(buf.len() as u64)).unwrap();
        let n = match from.read(&mut buf[..want]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        relayed += n as u64;
    }
    match cut {
        Cut::KillSender => {
            let _ = send.kill();
            drop(to);
            drop(from);
        }
        Cut::KillReceiver => {
            let _ = recv.kill();
            drop(to);
            drop(from);
        }
        Cut::ClosePipe | Cut::Enospc | Cut::None => {
            drop(to);
            drop(from);
        }
    }
    let ss = send.wait().unwrap();
    let rs = recv.wait().unwrap();
    let (se, re) = (se.join().unwrap(), re.join().unwrap());
    match cut {
        Cut::KillSender if relayed == at => assert_eq!(ss.signal(), Some(9), "{se}"),
        Cut::KillReceiver if relayed == at => assert_eq!(rs.signal(), Some(9), "{re}"),
        Cut::ClosePipe if relayed == at => {
            assert!(!rs.success(), "a cut stream was received whole: {re}");
        }
        _ => {}
    }
    let ok = rs.success() && ss.success();
    if cut == Cut::None {
        assert!(ok, "send: {se}\nreceive: {re}");
    }
    Run {
        relayed,
        ok,
        recv_ok: rs.success(),
        stderr: format!("send: {se}\nreceive: {re}"),
    }
}

/// Where the next run of a chain is cut (`None`: it runs to the end),
/// given the run's number.
type Cuts<'a> = dyn FnMut(&mut Rng, u64) -> Option<(Cut, u64)> + 'a;

/// The token of `dir/name`, if it has a resume point; `Some("")`: it
/// was received completely (its receiver was killed after that).
fn token(dir: &Path, name: &str) -> Option<String> {
    let o = btrsend()
        .arg("receive")
        .arg("--resume-token")
        .arg(dir.join(name))
        .output()
        .unwrap();
    if !o.status.success() {
        let e = String::from_utf8_lossy(&o.stderr);
        if e.contains("received completely") {
            return Some(String::new());
        }
        // A receiver killed before it applied the stream's first command
        // made nothing: DIR/NAME does not exist, and the stream is sent
        // again from its start, as with no resume point.
        assert!(
            e.contains("no resume point") || e.contains("does not exist"),
            "{e}"
        );
        return None;
    }
    let t = String::from_utf8(o.stdout).unwrap();
    assert_eq!(t.lines().count(), 1, "{t}");
    Some(t.trim_end().to_owned())
}

/// A kernel-made scratch btrfs of `size` bytes with an empty subvolume
/// `vol`: the filesystem, its mount point and `vol`.
fn scratch_with_vol(size: u64) -> (LiveBtrfs, PathBuf, PathBuf) {
    let src = LiveBtrfs::with_options(size, &[], "").expect("scratch btrfs");
    let mnt = src.path().to_path_buf();
    let vol = mnt.join("vol");
    sh(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(&vol));
    (src, mnt, vol)
}

/// The stream offset a token continues from.
fn token_offset(t: &str) -> u64 {
    let hex = t.strip_prefix("btrsend-resume-1-").unwrap();
    let b: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    u64::from_le_bytes(b[61..69].try_into().unwrap())
}

fn received_uuid(path: &Path) -> String {
    let o = sh(Command::new("btrfs").args(["subvolume", "show"]).arg(path));
    let s = String::from_utf8(o.stdout).unwrap();
    let field = |k: &str| {
        s.lines()
            .find_map(|l| l.trim().strip_prefix(k).map(|v| v.trim().to_owned()))
            .unwrap_or_default()
    };
    field("Received UUID:")
}

fn uuid_of(path: &Path) -> String {
    let o = sh(Command::new("btrfs").args(["subvolume", "show"]).arg(path));
    let s = String::from_utf8(o.stdout).unwrap();
    s.lines()
        .find_map(|l| l.trim().strip_prefix("UUID:").map(|v| v.trim().to_owned()))
        .unwrap()
}

/// Where a test receives: a btrfs (subvolume mode) or a tmpfs (directory
/// mode).
enum Target<'a> {
    Btrfs(&'a LiveBtrfs),
    Tmpfs(&'a Tmpfs),
}

impl Target<'_> {
    fn root(&self) -> &Path {
        match self {
            Target::Btrfs(b) => b.path(),
            Target::Tmpfs(t) => t.path(),
        }
    }

    /// Delete the partial `path` (to start over).
    fn delete(&self, path: &Path) {
        match self {
            Target::Btrfs(_) => {
                sh(Command::new("btrfs")
                    .args(["subvolume", "delete"])
                    .arg(path));
            }
            Target::Tmpfs(_) => std::fs::remove_dir_all(path).unwrap(),
        }
    }
}

/// Receive `snap` (against `parent`) into `dir` through interruptions:
/// `cuts` (with `every` as checkpoint interval, `None`: the default), then
/// to the end. Returns the interruptions made.
#[allow(clippy::too_many_arguments)]
fn receive_interrupted(
    dst: &Target<'_>,
    dir: &Path,
    snap: &Path,
    parent: Option<&Path>,
    every: Option<u64>,
    cuts: &mut Cuts<'_>,
    rng: &mut Rng,
    max_resent: u64,
    log: &mut Vec<String>,
) -> usize {
    let name = snap.file_name().unwrap().to_str().unwrap().to_owned();
    let mut token_now: Option<String> = None;
    let mut done = 0usize;
    let mut step = 0u64;
    loop {
        let plan = cuts(rng, step);
        step += 1;
        let (cut, at) = plan.unwrap_or((Cut::None, 0));
        let mut filler = None;
        if cut == Cut::Enospc {
            // Leave ~80 MiB free (a tmpfs: 16 MiB): the receive runs out
            // of space.
            let f = dst.root().join("filler");
            let st = rustix::fs::statvfs(dst.root()).unwrap();
            let free = st.f_bavail * st.f_frsize;
            let left = match dst {
                Target::Btrfs(_) => 80 * MIB,
                Target::Tmpfs(_) => 16 * MIB,
            };
            let fill = free.saturating_sub(left);
            let fd = std::fs::File::create(&f).unwrap();
            rustix::fs::fallocate(&fd, rustix::fs::FallocateFlags::empty(), 0, fill).unwrap();
            fd.sync_all().unwrap();
            filler = Some(f);
        }
        let start = token_now.as_deref().map_or(0, token_offset);
        let send = spawn_send(snap, parent, token_now.as_deref());
        let recv = spawn_receive(dir, every);
        let run = relay(send, recv, cut, at);
        if let Some(f) = filler {
            std::fs::remove_file(&f).unwrap();
            if let Target::Btrfs(b) = dst {
                sh(Command::new("btrfs")
                    .args(["filesystem", "sync"])
                    .arg(b.path()));
            }
        }
        if run.recv_ok && !run.ok {
            // The receive got the whole rest of the stream before the cut
            // hit its sender.
            log.push(format!(
                "{name}: finished from offset {start}, {cut:?} at {} after the receiver: {}",
                run.relayed, run.stderr
            ));
            return done;
        }
        if run.ok {
            assert!(
                cut == Cut::None || cut == Cut::Enospc || run.relayed < at,
                "{cut:?}: finished although cut at {at}"
            );
            log.push(format!("{name}: finished from offset {start}"));
            return done;
        }
        if cut == Cut::Enospc {
            assert!(
                run.stderr.contains("No space left"),
                "ENOSPC run failed otherwise: {}",
                run.stderr
            );
        }
        done += 1;
        // Where the stream was cut, in the uninterrupted stream's offsets.
        let reached = if token_now.is_some() {
            start + run.relayed.saturating_sub(CONT_HEADER)
        } else {
            run.relayed
        };
        match token(dir, &name) {
            Some(t) if t.is_empty() => {
                log.push(format!(
                    "{name}: finished from offset {start}, {cut:?} at {} after the end",
                    run.relayed
                ));
                // Killed after it marked the subvolume complete, perhaps
                // before it deleted the resume point: the next receive
                // into DIR deletes it (here one of an empty input).
                let o = btrsend()
                    .arg("receive")
                    .arg(dir)
                    .stdin(Stdio::null())
                    .output()
                    .unwrap();
                assert!(!o.status.success());
                assert!(
                    !dir.join(btrsend::receive::RESUME_DIR).join(&name).exists(),
                    "{name}: the resume point of a complete subvolume stays: {:?}",
                    walkdir_names(&dir.join(btrsend::receive::RESUME_DIR))
                );
                return done;
            }
            Some(t) => {
                let from = token_offset(&t);
                assert!(
                    from <= reached.max(start),
                    "resume point {from} past the cut {reached}"
                );
                let resent = reached.saturating_sub(from);
                assert!(
                    resent <= max_resent,
                    "{cut:?} at {reached}: {resent} bytes would be sent again (bound {max_resent}): {}",
                    run.stderr
                );
                log.push(format!(
                    "{name}: {cut:?} at {reached}, resume at {from}, re-sent {resent}"
                ));
                token_now = Some(t);
            }
            None => {
                // Cut before the first checkpoint: start over.
                assert!(
                    reached <= every.unwrap_or(48 * MIB) + 16 * MIB,
                    "no resume point after {reached} bytes"
                );
                dst.delete(&dir.join(&name));
                log.push(format!("{name}: {cut:?} at {reached}, no checkpoint yet"));
                token_now = None;
            }
        }
    }
}

/// The end of an interruption test: at least 100 interruptions, no resume
/// point left in `dir`, and the log with how much each resume sent again.
fn finish(test: &str, dir: &Path, total_cuts: usize, log: &[String]) {
    assert!(total_cuts >= 100, "{total_cuts} interruptions: {log:#?}");
    assert!(
        !dir.join(btrsend::receive::RESUME_DIR).exists(),
        "resume points left behind: {:?}\n{log:#?}",
        walkdir_names(&dir.join(btrsend::receive::RESUME_DIR))
    );
    let resent: Vec<u64> = log
        .iter()
        .filter_map(|l| l.rsplit_once("re-sent ").and_then(|(_, n)| n.parse().ok()))
        .collect();
    eprintln!(
        "{test}: {total_cuts} interruptions, re-sent at most {} bytes (mean {})",
        resent.iter().max().unwrap_or(&0),
        resent.iter().sum::<u64>() / resent.len().max(1) as u64
    );
    for l in log {
        eprintln!("{test}: {l}");
    }
}

/// The paths under `root` (for a message).
fn walkdir_names(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The source: a kernel-made btrfs with `snaps/s1` (~300 MB in files of
/// 1-16 MB, small files, a hard link, a symlink) and `snaps/s2` (renames, a
/// swap too, deletions, overwrites, new data).
fn make_source(rng: &mut Rng) -> (LiveBtrfs, PathBuf, PathBuf) {
    let src = LiveBtrfs::with_options(2 << 30, &[], "").expect("scratch btrfs");
    let mnt = src.path().to_path_buf();

    // s1: ~300 MB in files of 1-16 MB, small files, links.
    let vol = mnt.join("vol");
    sh(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(&vol));
    for d in 0..6 {
        let dir = vol.join(format!("d{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..80 {
            let len = rng.below(9000) as usize;
            write_random(&dir.join(format!("s{f}")), len, rng);
        }
    }
    let mut total = 0u64;
    let mut big = 0;
    while total < 300 * MIB {
        let len = (MIB + rng.below(15 * MIB)) as usize;
        write_random(&vol.join(format!("d{}/big{big}", big % 6)), len, rng);
        total += len as u64;
        big += 1;
    }
    std::fs::hard_link(vol.join("d0/big0"), vol.join("d1/link0")).unwrap();
    std::os::unix::fs::symlink("d0/big1", vol.join("sym")).unwrap();
    // Xattrs and modes for an incremental to change.
    for f in 0..20 {
        let p = vol.join(format!("d5/s{f}"));
        sh(Command::new("setfattr")
            .args(["-n", "user.k", "-v", &format!("v{f}")])
            .arg(&p));
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
    }
    std::fs::create_dir(mnt.join("snaps")).unwrap();
    let s1 = mnt.join("snaps/s1");
    snapshot_ro(&vol, &s1);
    // s2: renames (a swap too), deletions, overwrites, new data.
    std::fs::rename(vol.join("d0"), vol.join("tmp")).unwrap();
    std::fs::rename(vol.join("d1"), vol.join("d0")).unwrap();
    std::fs::rename(vol.join("tmp"), vol.join("d1")).unwrap();
    std::fs::rename(vol.join("d2"), vol.join("d3/d2")).unwrap();
    for b in (0..big).step_by(5) {
        let p = ["d0", "d1", "d3/d2", "d3", "d4", "d5"]
            .iter()
            .map(|d| vol.join(format!("{d}/big{b}")))
            .find(|p| p.exists());
        if let Some(p) = p {
            std::fs::remove_file(p).unwrap();
        }
    }
    for b in (1..big).step_by(7) {
        let p = ["d0", "d1", "d3/d2", "d3", "d4", "d5"]
            .iter()
            .map(|d| vol.join(format!("{d}/big{b}")))
            .find(|p| p.exists());
        if let Some(p) = p {
            let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
            use std::os::unix::fs::FileExt;
            f.write_all_at(&rng.bytes(300_000, false), 100_000).unwrap();
        }
    }
    for n in 0..8 {
        let len = (2 * MIB + rng.below(10 * MIB)) as usize;
        write_random(&vol.join(format!("d4/new{n}")), len, rng);
    }
    std::fs::rename(vol.join("d4/new0"), vol.join("d5/s3")).unwrap();
    // Xattrs changed and removed, modes changed, a file cut short, a file
    // renamed over another.
    for f in 0..20 {
        let p = vol.join(format!("d5/s{f}"));
        if !p.exists() || f == 3 {
            continue;
        }
        let mut c = Command::new("setfattr");
        if f % 2 == 0 {
            c.args(["-n", "user.k", "-v", "changed"]);
        } else {
            c.args(["-x", "user.k"]);
        }
        sh(c.arg(&p));
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o604)).unwrap();
    }
    for b in (2..big).step_by(11) {
        let p = ["d0", "d1", "d3/d2", "d3", "d4", "d5"]
            .iter()
            .map(|d| vol.join(format!("{d}/big{b}")))
            .find(|p| p.exists());
        if let Some(p) = p {
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            let len = f.metadata().unwrap().len();
            f.set_len(len / 3).unwrap();
        }
    }
    std::fs::rename(vol.join("d4/s10"), vol.join("d5/s11")).unwrap();
    let s2 = mnt.join("snaps/s2");
    snapshot_ro(&vol, &s2);
    sh(&mut Command::new("sync"));
    (src, s1, s2)
}

#[test]
fn resume_after_interruptions_builds_the_kernels_tree() {
    let test = "resume_after_interruptions_builds_the_kernels_tree";
    if !testing::require_live(test) {
        return;
    }
    let mut rng = Rng::new(14);
    let (src, s1, s2) = make_source(&mut rng);
    let dst = LiveBtrfs::with_options(3 << 30, &[], "").expect("scratch btrfs");
    let opts = Options { holes: false };
    let want1 = src.manifest("snaps/s1", opts).unwrap();
    let want2 = src.manifest("snaps/s2", opts).unwrap();
    let len1 = {
        let o = sh(btrsend().args(["send", "--estimate"]).arg(&s1));
        String::from_utf8(o.stdout)
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    assert!(len1 > 250 * MIB, "stream of {len1} bytes");
    let dir = dst.path().join("recv");
    std::fs::create_dir(&dir).unwrap();
    let mut log = Vec::new();

    // Default checkpoints (48 MiB): one interruption of each kind, at
    // random points; at most 64 MiB re-sent each time.
    let kinds = [
        Cut::Enospc,
        Cut::KillSender,
        Cut::KillReceiver,
        Cut::ClosePipe,
    ];
    let mut k = 0;
    let n_default = receive_interrupted(
        &Target::Btrfs(&dst),
        &dir,
        &s1,
        None,
        None,
        &mut |rng, step| {
            let cut = *kinds.get(k)?;
            k += 1;
            let _ = step;
            Some((cut, 50 * MIB + rng.below(30 * MIB)))
        },
        &mut rng,
        64 * MIB,
        &mut log,
    );
    assert!(n_default >= 3, "{log:#?}");
    assert!(
        log.iter().filter(|l| l.contains("re-sent")).count() >= 2,
        "too few resumes from 48 MiB checkpoints: {log:#?}"
    );
    assert_eq!(
        src.manifest("snaps/s1", opts).unwrap(),
        want1,
        "the source is unchanged"
    );
    assert_eq!(
        dst.manifest("recv/s1", opts).unwrap(),
        want1,
        "resumed s1 differs from the kernel's snapshot\n{log:#?}"
    );
    assert_eq!(received_uuid(&dir.join("s1")), uuid_of(&s1));

    // The stock btrfs receive refuses a continuation and makes nothing;
    // the whole stream again continues a partial subvolume.
    sh(Command::new("btrfs")
        .args(["subvolume", "delete"])
        .arg(dir.join("s1")));
    let recv = spawn_receive(&dir, None);
    let run = relay(spawn_send(&s1, None, None), recv, Cut::ClosePipe, 120 * MIB);
    assert!(!run.ok);
    let t = token(&dir, "s1").expect("a checkpoint after 120 MiB");
    let cont = dst.scratch_dir().join("cont.stream");
    let o = btrsend()
        .args(["send", "--resume", &t, "-f"])
        .arg(&cont)
        .arg(&s1)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let before: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let o = Command::new("btrfs")
        .args(["receive", "-f"])
        .arg(&cont)
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("unexpected header"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let after: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        before, after,
        "btrfs receive of a continuation made something"
    );
    // A token is refused by a send of another snapshot or protocol.
    let o = btrsend()
        .args(["send", "--resume", &t, "-p"])
        .arg(&s1)
        .arg(&s2)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("does not match this send"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = btrsend()
        .args(["send", "--proto", "2", "--resume", &t])
        .arg(&s1)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("protocol 1 stream"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::remove_file(&cont).unwrap();
    let run = relay(
        spawn_send(&s1, None, None),
        spawn_receive(&dir, None),
        Cut::None,
        0,
    );
    assert!(
        run.stderr.contains("resuming"),
        "the whole stream again did not continue: {}",
        run.stderr
    );
    assert_eq!(dst.manifest("recv/s1", opts).unwrap(), want1);
    assert_eq!(received_uuid(&dir.join("s1")), uuid_of(&s1));

    // Many interruptions with 2 MiB checkpoints, of every kind but ENOSPC
    // (slow on a nearly full btrfs), chained: s1 received again, then the
    // incremental s2. Bound: the interval plus the receiver's read-ahead.
    let every = 2 * MIB;
    sh(Command::new("btrfs")
        .args(["subvolume", "delete"])
        .arg(dir.join("s1")));
    let quick = [Cut::KillSender, Cut::KillReceiver, Cut::ClosePipe];
    let cuts = |rng: &mut Rng, step: u64| {
        let cut = quick[usize::try_from(step % 3).unwrap()];
        Some((cut, 256 + rng.below(8 * MIB)))
    };
    let mut n = receive_interrupted(
        &Target::Btrfs(&dst),
        &dir,
        &s1,
        None,
        Some(every),
        &mut |rng, step| (step < 75).then(|| cuts(rng, step)).flatten(),
        &mut rng,
        every + 12 * MIB,
        &mut log,
    );
    assert_eq!(dst.manifest("recv/s1", opts).unwrap(), want1, "{log:#?}");
    assert_eq!(received_uuid(&dir.join("s1")), uuid_of(&s1));
    n += receive_interrupted(
        &Target::Btrfs(&dst),
        &dir,
        &s2,
        Some(&s1),
        Some(every),
        &mut |rng, step| (step < 30).then(|| cuts(rng, step)).flatten(),
        &mut rng,
        every + 12 * MIB,
        &mut log,
    );
    assert_eq!(
        dst.manifest("recv/s2", opts).unwrap(),
        want2,
        "resumed incremental s2 differs from the kernel's snapshot\n{log:#?}"
    );
    assert_eq!(received_uuid(&dir.join("s2")), uuid_of(&s2));
    finish(test, &dir, n + n_default + 1, &log);
    let _: PathBuf = dir;
}

/// Directory mode (issue 14): the same streams received into a tmpfs (no
/// subvolumes: directories with records, rolled back by the undo journal)
/// through over a hundred interruptions of every kind, ENOSPC included,
/// each finished by a resume; the trees are the kernel's.
#[test]
fn resume_into_directories_after_interruptions_builds_the_kernels_tree() {
    let test = "resume_into_directories_after_interruptions_builds_the_kernels_tree";
    if !testing::require_live(test) {
        return;
    }
    let mut rng = Rng::new(1414);
    let (src, s1, s2) = make_source(&mut rng);
    let opts = Options { holes: false };
    let want1 = src.manifest("snaps/s1", opts).unwrap();
    let want2 = src.manifest("snaps/s2", opts).unwrap();
    let tmpfs = Tmpfs::new(1400 * MIB).expect("tmpfs");
    let dst = Target::Tmpfs(&tmpfs);
    let dir = tmpfs.path().join("recv");
    std::fs::create_dir(&dir).unwrap();
    let got = |name: &str| btrsend::manifest::manifest(&dir.join(name), opts).unwrap();
    let mut log = Vec::new();

    // Default checkpoints: one interruption of each kind.
    let kinds = [
        Cut::KillSender,
        Cut::Enospc,
        Cut::KillReceiver,
        Cut::ClosePipe,
    ];
    let mut k = 0;
    let n_default = receive_interrupted(
        &dst,
        &dir,
        &s1,
        None,
        None,
        &mut |rng, _| {
            let cut = *kinds.get(k)?;
            k += 1;
            Some((cut, 50 * MIB + rng.below(30 * MIB)))
        },
        &mut rng,
        64 * MIB,
        &mut log,
    );
    assert!(n_default >= 3, "{log:#?}");
    assert!(
        log.iter().filter(|l| l.contains("re-sent")).count() >= 2,
        "too few resumes from 48 MiB checkpoints: {log:#?}"
    );
    assert!(
        manifest::diff(&want1, &got("s1"), 20).is_none(),
        "resumed s1 differs from the kernel's snapshot: {}\n{log:#?}",
        manifest::diff(&want1, &got("s1"), 20).unwrap_or_default()
    );

    // Many interruptions with 2 MiB checkpoints, of every kind (ENOSPC
    // every seventh), s1 again, then the incremental s2 (overwrites,
    // truncations, renames over files, xattrs and modes changed) with 1 MiB
    // checkpoints.
    let every = 2 * MIB;
    std::fs::remove_dir_all(dir.join("s1")).unwrap();
    let all = [
        Cut::KillSender,
        Cut::KillReceiver,
        Cut::ClosePipe,
        Cut::KillReceiver,
        Cut::KillSender,
        Cut::ClosePipe,
        Cut::Enospc,
    ];
    let cuts = |rng: &mut Rng, step: u64, most: u64| {
        let cut = all[usize::try_from(step % 7).unwrap()];
        Some((cut, 256 + rng.below(most)))
    };
    let mut n = receive_interrupted(
        &dst,
        &dir,
        &s1,
        None,
        Some(every),
        &mut |rng, step| (step < 75).then(|| cuts(rng, step, 4 * MIB)).flatten(),
        &mut rng,
        every + 12 * MIB,
        &mut log,
    );
    assert!(
        manifest::diff(&want1, &got("s1"), 20).is_none(),
        "s1 after many resumes: {}\n{log:#?}",
        manifest::diff(&want1, &got("s1"), 20).unwrap_or_default()
    );
    n += receive_interrupted(
        &dst,
        &dir,
        &s2,
        Some(&s1),
        Some(MIB),
        &mut |rng, step| (step < 45).then(|| cuts(rng, step, 2 * MIB)).flatten(),
        &mut rng,
        MIB + 12 * MIB,
        &mut log,
    );
    assert!(
        manifest::diff(&want2, &got("s2"), 20).is_none(),
        "resumed incremental s2 differs from the kernel's snapshot: {}\n{log:#?}",
        manifest::diff(&want2, &got("s2"), 20).unwrap_or_default()
    );
    finish(test, &dir, n + n_default, &log);
}

/// The flags `lsattr` shows for each file under `root` (letters d and A:
/// NODUMP, NOATIME), by path.
fn flags_under(root: &Path) -> Vec<(String, String)> {
    let o = sh(Command::new("lsattr").arg("-R").arg(root));
    let mut out: Vec<(String, String)> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (f, p) = l.split_once(' ')?;
            let p = p.trim().strip_prefix(root.to_str()?)?.to_owned();
            let keep: String = f.chars().filter(|c| *c == 'd' || *c == 'A').collect();
            Some((p, keep))
        })
        .collect();
    out.sort();
    out
}

/// Issue 14: a stream of two incremental subvolumes (`send -p S0 S1 S2`,
/// protocol 2: FILEATTR commands for the inode flags changed) interrupted
/// twice in the second one, with FILEATTRs before the last checkpoint,
/// resumed in both modes: the first subvolume is kept as received, the
/// second finished, both with the kernel's tree and the source's inode
/// flags.
#[test]
fn resume_in_the_second_subvolume_keeps_fileattrs_before_the_checkpoint() {
    let test = "resume_in_the_second_subvolume_keeps_fileattrs_before_the_checkpoint";
    if !testing::require_live(test) {
        return;
    }
    let (src, mnt, vol) = scratch_with_vol(1 << 30);
    let mut rng = Rng::new(1415);
    std::fs::create_dir(mnt.join("snaps")).unwrap();
    let file = |f: usize| vol.join(format!("f{f}"));
    for f in 0..60 {
        let len = if f % 2 == 0 { 1_000_000 } else { 3000 };
        write_random(&file(f), len + rng.below(500_000) as usize, &mut rng);
    }
    let snap = |v: &str| {
        snapshot_ro(&vol, &mnt.join(format!("snaps/{v}")));
    };
    snap("s0");
    // s1 and s2: new flags on most files (FILEATTR) and new data in many.
    for (v, shift) in [("s1", 0), ("s2", 1)] {
        for f in 0..60 {
            let flag = ["+d", "+A", "+dA", "-dA"][(f + shift) % 4];
            if f % 3 == 0 {
                write_random(&file(f), 600_000, &mut rng);
            }
            sh(Command::new("chattr").arg(flag).arg(file(f)));
        }
        snap(v);
    }
    sh(&mut Command::new("sync"));
    let snaps: Vec<PathBuf> = ["s0", "s1", "s2"]
        .iter()
        .map(|v| mnt.join(format!("snaps/{v}")))
        .collect();
    let opts = Options { holes: false };
    let want = |v: &str| src.manifest(&format!("snaps/{v}"), opts).unwrap();
    let want_flags = |v: &str| flags_under(&mnt.join(format!("snaps/{v}")));
    assert!(
        want_flags("s2")
            .iter()
            .filter(|(_, f)| !f.is_empty())
            .count()
            >= 30,
        "{:?}",
        want_flags("s2")
    );
    let len_s1 = {
        let o = sh(btrsend()
            .args(["send", "--estimate", "--proto", "2", "-p"])
            .arg(&snaps[0])
            .arg(&snaps[1]));
        String::from_utf8(o.stdout)
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    let send = |token: Option<&str>| {
        let mut c = btrsend();
        c.args(["send", "--proto", "2"]);
        if let Some(t) = token {
            c.args(["--resume", t]);
        }
        c.arg("-p")
            .arg(&snaps[0])
            .arg(&snaps[1])
            .arg(&snaps[2])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let btrfs_dst = LiveBtrfs::with_options(1 << 30, &[], "").expect("scratch btrfs");
    let tmpfs = Tmpfs::new(512 * MIB).expect("tmpfs");
    for (mode, root) in [
        ("subvolumes", btrfs_dst.path()),
        ("directories", tmpfs.path()),
    ] {
        let dir = root.join("recv");
        std::fs::create_dir(&dir).unwrap();
        let run = relay(
            spawn_send(&snaps[0], None, None),
            spawn_receive(&dir, None),
            Cut::None,
            0,
        );
        assert!(run.ok, "{mode}: {}", run.stderr);
        // Cut in s2 after ~8 MiB of it, then again 3 MiB into the
        // continuation; 1 MiB checkpoints.
        let recv = spawn_receive(&dir, Some(MIB));
        let run = relay(send(None), recv, Cut::KillReceiver, len_s1 + 8 * MIB);
        assert!(!run.ok, "{mode}: {}", run.stderr);
        assert!(
            token(&dir, "s1").is_some_and(|t| t.is_empty()),
            "{mode}: s1 is not complete"
        );
        let t = token(&dir, "s2").expect("a resume point in s2");
        assert!(!t.is_empty(), "{mode}: s2 complete");
        let run = relay(
            send(Some(&t)),
            spawn_receive(&dir, Some(MIB)),
            Cut::ClosePipe,
            3 * MIB,
        );
        assert!(!run.ok, "{mode}: {}", run.stderr);
        assert!(run.stderr.contains("resuming"), "{mode}: {}", run.stderr);
        let t2 = token(&dir, "s2").expect("a resume point in s2");
        assert!(
            token_offset(&t2) > token_offset(&t),
            "{mode}: no progress: {}",
            run.stderr
        );
        let run = relay(
            send(Some(&t2)),
            spawn_receive(&dir, Some(MIB)),
            Cut::None,
            0,
        );
        assert!(run.stderr.contains("resuming"), "{mode}: {}", run.stderr);
        for v in ["s0", "s1", "s2"] {
            let got = btrsend::manifest::manifest(&dir.join(v), opts).unwrap();
            assert!(
                manifest::diff(&want(v), &got, 20).is_none(),
                "{mode}: {v}: {}",
                manifest::diff(&want(v), &got, 20).unwrap_or_default()
            );
            assert_eq!(
                flags_under(&dir.join(v)),
                want_flags(v),
                "{mode}: {v}: inode flags"
            );
        }
        assert!(!dir.join(btrsend::receive::RESUME_DIR).exists(), "{mode}");
    }
}

/// `--checkpoint-interval 0` (a one-shot receive, for `backup restore`):
/// a receive cut short leaves no resume point in either mode, where
/// `--checkpoint-interval 1` leaves one; an uninterrupted receive without
/// checkpoints builds the kernel's tree. The stream is the kernel's.
#[test]
fn checkpoint_interval_zero_takes_no_checkpoints() {
    let test = "checkpoint_interval_zero_takes_no_checkpoints";
    if !testing::require_live(test) {
        return;
    }
    let (src, mnt, vol) = scratch_with_vol(512 * MIB);
    let mut rng = Rng::new(1733);
    for f in 0..24 {
        write_random(&vol.join(format!("f{f}")), 1_000_000, &mut rng);
    }
    let snap = mnt.join("snap");
    snapshot_ro(&vol, &snap);
    sh(&mut Command::new("sync"));
    let want = src.manifest("snap", Options { holes: false }).unwrap();
    let work = tempfile::tempdir().unwrap();
    let whole = work.path().join("whole.stream");
    sh(Command::new("btrfs")
        .args(["send", "-q", "-f"])
        .arg(&whole)
        .arg(&snap));
    let bytes = std::fs::read(&whole).unwrap();
    assert!(bytes.len() as u64 > 20 * MIB, "{} bytes", bytes.len());
    // Cut after 12 MiB: a receive that stops there.
    let cut = work.path().join("cut.stream");
    std::fs::write(&cut, &bytes[..12 << 20]).unwrap();
    let btrfs_dst = LiveBtrfs::with_options(512 * MIB, &[], "").expect("scratch btrfs");
    let tmpfs = Tmpfs::new(256 * MIB).expect("tmpfs");
    for (mode, root) in [
        ("subvolumes", btrfs_dst.path()),
        ("directories", tmpfs.path()),
    ] {
        let dst = if mode == "subvolumes" {
            Target::Btrfs(&btrfs_dst)
        } else {
            Target::Tmpfs(&tmpfs)
        };
        let dir = root.join("recv");
        std::fs::create_dir(&dir).unwrap();
        let receive = |stream: &Path, interval: &str| {
            btrsend()
                .args(["receive", "-q", "--checkpoint-interval", interval, "-f"])
                .arg(stream)
                .arg(&dir)
                .env_remove("BTRSEND_CHECKPOINT_BYTES")
                .output()
                .unwrap()
        };
        let o = receive(&cut, "0");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{mode}: a cut stream was received");
        assert!(err.contains("truncated"), "{mode}: {err}");
        assert_eq!(token(&dir, "snap"), None, "{mode}: a resume point");
        assert!(!dir.join(btrsend::receive::RESUME_DIR).exists(), "{mode}");
        dst.delete(&dir.join("snap"));
        let _ = std::fs::remove_dir_all(dir.join(".btrsend"));
        // The same cut with 1 MiB checkpoints: a resume point.
        let o = receive(&cut, "1");
        assert!(!o.status.success(), "{mode}: a cut stream was received");
        let t = token(&dir, "snap").expect("a resume point");
        assert!(token_offset(&t) > 8 * MIB, "{mode}: {t}");
        // The whole stream again, without checkpoints: it continues from
        // the checkpoint there is, and ends with the kernel's tree.
        let o = receive(&whole, "0");
        assert!(
            o.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let got = btrsend::manifest::manifest(&dir.join("snap"), Options { holes: false }).unwrap();
        assert!(
            manifest::diff(&want, &got, 20).is_none(),
            "{mode}: {}",
            manifest::diff(&want, &got, 20).unwrap_or_default()
        );
        assert!(!dir.join(btrsend::receive::RESUME_DIR).exists(), "{mode}");
        // And from nothing, without checkpoints.
        dst.delete(&dir.join("snap"));
        let _ = std::fs::remove_dir_all(dir.join(".btrsend"));
        let o = receive(&whole, "0");
        assert!(
            o.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let got = btrsend::manifest::manifest(&dir.join("snap"), Options { holes: false }).unwrap();
        assert!(
            manifest::diff(&want, &got, 20).is_none(),
            "{mode}: {}",
            manifest::diff(&want, &got, 20).unwrap_or_default()
        );
    }
}

/// Regression (issue 17, found by benches/receive-vs-kernel FS=ext4
/// comp-v2c): a `btrfs.compression` property (SET_XATTR `btrfs.*`) after
/// the first checkpoint of a directory-mode receive into a filesystem
/// without that namespace failed the receive ("Operation not supported"
/// from the undo journal reading the old value), where one before any
/// checkpoint is noted and skipped. Into a tmpfs with 1 MiB checkpoints:
/// the receive succeeds, with the kernel's tree less the property.
#[test]
fn btrfs_property_after_a_checkpoint_into_a_directory_is_skipped() {
    let test = "btrfs_property_after_a_checkpoint_into_a_directory_is_skipped";
    if !testing::require_live(test) {
        return;
    }
    let (src, mnt, vol) = scratch_with_vol(256 * MIB);
    let mut rng = Rng::new(1734);
    for f in 0..6 {
        let p = vol.join(format!("f{f}"));
        write_random(&p, 1_000_000, &mut rng);
        sh(Command::new("btrfs")
            .args(["property", "set"])
            .arg(&p)
            .args(["compression", "zstd"]));
    }
    let snap = mnt.join("snap");
    snapshot_ro(&vol, &snap);
    sh(&mut Command::new("sync"));
    let want = src.manifest("snap", Options { holes: false }).unwrap();
    assert!(want.contains("xattr:btrfs.compression=zstd"), "{want}");
    let want = want.replace(" xattr:btrfs.compression=zstd", "");
    let work = tempfile::tempdir().unwrap();
    let stream = work.path().join("s.stream");
    sh(Command::new("btrfs")
        .args(["send", "-q", "-f"])
        .arg(&stream)
        .arg(&snap));
    let tmpfs = Tmpfs::new(64 * MIB).expect("tmpfs");
    let dir = tmpfs.path().join("recv");
    std::fs::create_dir(&dir).unwrap();
    let o = btrsend()
        .args(["receive", "-f"])
        .arg(&stream)
        .arg(&dir)
        .env("BTRSEND_CHECKPOINT_BYTES", MIB.to_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("no btrfs.* properties"), "{err}");
    let got = btrsend::manifest::manifest(&dir.join("snap"), Options { holes: false }).unwrap();
    assert!(
        manifest::diff(&want, &got, 20).is_none(),
        "{}",
        manifest::diff(&want, &got, 20).unwrap_or_default()
    );
}

/// Replace the boot id in the state file of `dir/name` by `boot`.
fn set_state_boot(dir: &Path, name: &str, boot: &str) {
    let state = dir
        .join(btrsend::receive::RESUME_DIR)
        .join(name)
        .join("state");
    let text = std::fs::read_to_string(&state).unwrap();
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with("boot ") {
                format!("boot {boot}")
            } else {
                l.to_owned()
            }
        })
        .collect();
    assert_ne!(lines.join("\n") + "\n", text, "no boot line in {text}");
    std::fs::write(&state, lines.join("\n") + "\n").unwrap();
}

/// Issue 17 / 14: a resume point between flushed checkpoints serves only
/// in the boot that wrote it (its state records the kernel's boot id). A
/// restart is faked by editing that id in the state (1 MiB checkpoints, a
/// kernel stream cut after 12 MiB):
/// * directory mode, and subvolume mode with no durable checkpoint
///   (`BTRSEND_DURABLE_EVERY=0`): `--resume-token` and a continuation are
///   refused with the reason, and nothing under DIR changes (its manifest,
///   the resume point included); the whole stream received again starts
///   the partial subvolume over (its start mark names it) and ends with
///   the kernel's tree (in another DIR, cut the same way);
/// * subvolume mode with a durable snapshot every 4th checkpoint: the
///   token goes back to the last durable checkpoint (an earlier offset), a
///   continuation from the later point is refused, and one from the token
///   ends with the kernel's tree.
///
/// With the id put back, the refused ones continue from their later point
/// and end with the kernel's tree.
#[test]
fn a_resume_point_of_another_boot_falls_back_to_a_durable_checkpoint_or_is_refused() {
    let test = "a_resume_point_of_another_boot_falls_back_to_a_durable_checkpoint_or_is_refused";
    if !testing::require_live(test) {
        return;
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let boot = boot.trim();
    let other = "00000000-1111-2222-3333-444444444444";
    assert_ne!(boot, other);
    let (src, mnt, vol) = scratch_with_vol(512 * MIB);
    let mut rng = Rng::new(1735);
    for f in 0..24 {
        write_random(&vol.join(format!("f{f}")), 1_000_000, &mut rng);
    }
    let snap = mnt.join("snap");
    snapshot_ro(&vol, &snap);
    sh(&mut Command::new("sync"));
    let opts = Options { holes: false };
    let want = src.manifest("snap", opts).unwrap();
    let work = tempfile::tempdir().unwrap();
    let whole = work.path().join("whole.stream");
    sh(Command::new("btrfs")
        .args(["send", "-q", "-f"])
        .arg(&whole)
        .arg(&snap));
    let bytes = std::fs::read(&whole).unwrap();
    assert!(bytes.len() as u64 > 20 * MIB, "{} bytes", bytes.len());
    let cut = work.path().join("cut.stream");
    std::fs::write(&cut, &bytes[..12 << 20]).unwrap();
    let btrfs_dst = LiveBtrfs::with_options(512 * MIB, &[], "").expect("scratch btrfs");
    let tmpfs = Tmpfs::new(256 * MIB).expect("tmpfs");
    let continuation = |t: &str, to: &Path| {
        let o = btrsend()
            .args(["send", "--resume", t, "-f"])
            .arg(to)
            .arg(&snap)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    for (i, (mode, root, durable_every)) in [
        ("directories", tmpfs.path(), "4"),
        ("subvolumes, none durable", btrfs_dst.path(), "0"),
        ("subvolumes, every 4th durable", btrfs_dst.path(), "4"),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = root.join(format!("recv{i}"));
        std::fs::create_dir(&dir).unwrap();
        let receive_into = |stream: &Path, into: &Path| {
            btrsend()
                .args(["receive", "-f"])
                .arg(stream)
                .arg(into)
                .env("BTRSEND_CHECKPOINT_BYTES", MIB.to_string())
                .env("BTRSEND_DURABLE_EVERY", durable_every)
                .output()
                .unwrap()
        };
        let receive = |stream: &Path| receive_into(stream, &dir);
        let o = receive(&cut);
        assert!(!o.status.success(), "{mode}: a cut stream was received");
        let t = token(&dir, "snap").expect("a resume point");
        assert!(token_offset(&t) > 10 * MIB, "{mode}: {t}");
        let state = dir.join(btrsend::receive::RESUME_DIR).join("snap/state");
        let text = std::fs::read_to_string(&state).unwrap();
        assert!(
            text.lines().any(|l| l == format!("boot {boot}")),
            "{mode}: the state does not name this boot ({boot}): {text}"
        );
        let cont = work.path().join("cont.stream");
        continuation(&t, &cont);
        set_state_boot(&dir, "snap", other);
        if mode.contains("every 4th") {
            // Back to the last durable checkpoint: the 9th (of 1 MiB
            // each), before the 11th the state names.
            let d = token(&dir, "snap").expect("a durable resume point");
            let (from, light) = (token_offset(&d), token_offset(&t));
            assert!(
                from < light && from > 6 * MIB,
                "{mode}: durable point at {from}, the state's at {light}"
            );
            let o = receive(&cont);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success(), "{mode}: continued from the lost point");
            assert!(err.contains("can only continue from command"), "{err}");
            continuation(&d, &cont);
        } else {
            // DIR, and the partial subvolume (a subvolume is a line of
            // its parent's manifest).
            let tree = || {
                btrsend::manifest::manifest(&dir, opts).unwrap()
                    + &btrsend::manifest::manifest(&dir.join("snap"), opts).unwrap()
            };
            let before = tree();
            let o = btrsend()
                .arg("receive")
                .arg("--resume-token")
                .arg(dir.join("snap"))
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{mode}: {err}");
            assert!(o.stdout.is_empty());
            for s in [
                "before the system restarted",
                other,
                boot,
                "receive the whole stream again: the receive starts it over",
            ] {
                assert!(
                    err.contains(s),
                    "{mode}: --resume-token: {s:?} not in {err}"
                );
            }
            let o = receive(&cont);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success(), "{mode}: resumed after a restart");
            assert!(
                err.contains("before the system restarted")
                    && err.contains("receive the whole stream again: the receive starts it over"),
                "{mode}: {err}"
            );
            let after = tree();
            assert!(
                manifest::diff(&before, &after, 20).is_none(),
                "{mode}: a refused resume changed DIR: {}",
                manifest::diff(&before, &after, 20).unwrap_or_default()
            );
            // The whole stream, into another DIR cut the same way: started
            // over.
            let over = root.join(format!("recv{i}-over"));
            std::fs::create_dir(&over).unwrap();
            let receive_over = |stream: &Path| receive_into(stream, &over);
            assert!(!receive_over(&cut).status.success());
            set_state_boot(&over, "snap", other);
            let o = receive_over(&whole);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "{mode}: not started over: {err}");
            assert!(!err.contains("resuming"), "{mode}: {err}");
            let got = btrsend::manifest::manifest(&over.join("snap"), opts).unwrap();
            assert!(
                manifest::diff(&want, &got, 20).is_none(),
                "{mode}: started over: {}",
                manifest::diff(&want, &got, 20).unwrap_or_default()
            );
            assert!(!over.join(btrsend::receive::RESUME_DIR).exists(), "{mode}");
            // The same resume point in this boot: it continues.
            set_state_boot(&dir, "snap", boot);
        }
        let o = receive(&cont);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mode}: {err}");
        assert!(err.contains("resuming"), "{mode}: {err}");
        let got = btrsend::manifest::manifest(&dir.join("snap"), opts).unwrap();
        assert!(
            manifest::diff(&want, &got, 20).is_none(),
            "{mode}: {}",
            manifest::diff(&want, &got, 20).unwrap_or_default()
        );
        assert!(!dir.join(btrsend::receive::RESUME_DIR).exists(), "{mode}");
        std::fs::remove_file(&cont).unwrap();
    }
}

/// A `--compressed-data` stream received from a file: its ENCODED_WRITEs
/// are skimmed and written on the lanes, and a checkpoint does not wait
/// for the jobs queued before it (it journals the size they leave each
/// file). The receiver is killed (-9) right after a checkpoint became the
/// resume point (the next one pending, its jobs maybe half written), over
/// and over; each receive of the same whole file continues the partial
/// subvolume (rolled back through both journals), and the last builds the
/// kernel's tree. The stream is the kernel's.
#[test]
fn compressed_stream_from_a_file_killed_after_checkpoints_builds_the_kernels_tree() {
    let test = "compressed_stream_from_a_file_killed_after_checkpoints_builds_the_kernels_tree";
    if !testing::require_live(test) {
        return;
    }
    let mut rng = Rng::new(2911);
    let (src, mnt, vol) = scratch_with_vol(2 << 30);
    sh(Command::new("btrfs")
        .args(["property", "set"])
        .arg(&vol)
        .args(["compression", "zstd"]));
    // Letters from an alphabet of 16: about half compressed, so the
    // stream holds ~50 MiB of ENCODED_WRITEs.
    for f in 0..6 {
        let len = (12 * MIB + rng.below(8 * MIB)) as usize;
        let data: Vec<u8> = rng
            .bytes(len, false)
            .iter()
            .map(|b| b'a' + (b & 15))
            .collect();
        std::fs::write(vol.join(format!("big{f}")), data).unwrap();
        write_random(&vol.join(format!("small{f}")), 5000, &mut rng);
    }
    std::fs::create_dir(mnt.join("snaps")).unwrap();
    let snap = mnt.join("snaps/s");
    snapshot_ro(&vol, &snap);
    sh(&mut Command::new("sync"));
    let stream = src.scratch_dir().join("s.stream");
    sh(Command::new("btrfs")
        .args(["send", "-q", "--proto", "2", "--compressed-data", "-f"])
        .arg(&stream)
        .arg(&snap));
    let dump = sh(Command::new("btrfs")
        .args(["receive", "--dump", "-f"])
        .arg(&stream));
    let encoded = String::from_utf8_lossy(&dump.stdout)
        .lines()
        .filter(|l| l.starts_with("encoded_write"))
        .count();
    assert!(encoded > 200, "{encoded} ENCODED_WRITEs");
    let dir = mnt.join("recv");
    std::fs::create_dir(&dir).unwrap();
    let state = dir.join(btrsend::receive::RESUME_DIR).join("s/state");
    let mut kills = 0;
    let mut log = Vec::new();
    for run in 0..12 {
        let mut child = btrsend()
            .args(["receive", "-q", "-f"])
            .arg(&stream)
            .arg(&dir)
            .env("BTRSEND_CHECKPOINT_BYTES", (MIB).to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("btrsend receive");
        let err = child.stderr.take().unwrap();
        let err = std::thread::spawn(move || read_all(err));
        let mut killed = false;
        if run < 5 {
            // Kill after the resume point changed 1-3 times (the state
            // is replaced by a rename: a new inode each time).
            let want = 1 + rng.below(3);
            let ino = || {
                use std::os::unix::fs::MetadataExt;
                std::fs::metadata(&state).ok().map(|m| m.ino())
            };
            let mut last = ino();
            let mut seen = 0;
            while child.try_wait().unwrap().is_none() {
                let now = ino();
                if now.is_some() && now != last {
                    seen += 1;
                    last = now;
                    if seen >= want {
                        let _ = child.kill();
                        killed = true;
                        break;
                    }
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
        let st = child.wait().unwrap();
        let err = err.join().unwrap();
        let t = token(&dir, "s");
        log.push(format!(
            "run {run}: {st:?}, killed {killed}, token {t:?}: {err}"
        ));
        if st.success() {
            break;
        }
        assert!(killed && st.signal() == Some(9), "{log:#?}");
        assert!(t.as_deref().is_some_and(|t| !t.is_empty()), "{log:#?}");
        kills += 1;
    }
    assert!(kills >= 3, "{log:#?}");
    let opts = Options { holes: false };
    assert_eq!(
        src.manifest("recv/s", opts).unwrap(),
        src.manifest("snaps/s", opts).unwrap(),
        "{log:#?}"
    );
    assert_eq!(received_uuid(&dir.join("s")), uuid_of(&snap));
    assert!(!dir.join(btrsend::receive::RESUME_DIR).join("s").exists());
}

/// A snapshot made by `btrfs receive` has a received UUID, which the
/// streams sent from it carry (SUBVOL, as the kernel's `btrfs send` does),
/// and so does the token a receiver of such a stream prints: `send
/// --resume` must take it as that subvolume's (it once compared the
/// subvolume's own UUID and refused). Sent from that filesystem,
/// interrupted, resumed: the kernel's tree and the received UUID.
#[test]
fn resume_of_a_subvolume_that_was_itself_received() {
    let test = "resume_of_a_subvolume_that_was_itself_received";
    if !testing::require_live(test) {
        return;
    }
    let mut rng = Rng::new(1415);
    let (src, mnt, vol) = scratch_with_vol(1 << 30);
    for f in 0..12 {
        let len = (2 * MIB + rng.below(3 * MIB)) as usize;
        write_random(&vol.join(format!("f{f}")), len, &mut rng);
        write_random(&vol.join(format!("s{f}")), 3000, &mut rng);
    }
    std::fs::create_dir(mnt.join("snaps")).unwrap();
    let snap = mnt.join("snaps/s");
    snapshot_ro(&vol, &snap);
    // The kernel receives it: mid/s has the snapshot's UUID as received
    // UUID.
    let stream = src.scratch_dir().join("s.stream");
    sh(Command::new("btrfs")
        .args(["send", "-q", "-f"])
        .arg(&stream)
        .arg(&snap));
    std::fs::create_dir(mnt.join("mid")).unwrap();
    sh(Command::new("btrfs")
        .args(["receive", "-f"])
        .arg(&stream)
        .arg(mnt.join("mid")));
    std::fs::remove_file(&stream).unwrap();
    let mid = mnt.join("mid/s");
    assert_eq!(received_uuid(&mid), uuid_of(&snap));
    assert_ne!(uuid_of(&mid), uuid_of(&snap));
    sh(&mut Command::new("sync"));
    // btrsend sends mid/s, killed after 20 MiB (checkpoints every 4 MiB),
    // then resumed from the receiver's token.
    let dir = mnt.join("recv");
    std::fs::create_dir(&dir).unwrap();
    let every = 4 * MIB;
    let mut log = Vec::new();
    let n = receive_interrupted(
        &Target::Btrfs(&src),
        &dir,
        &mid,
        None,
        Some(every),
        &mut |_, step| (step == 0).then_some((Cut::KillSender, 20 * MIB)),
        &mut rng,
        every + 12 * MIB,
        &mut log,
    );
    assert_eq!(n, 1, "{log:#?}");
    assert!(
        log.iter().any(|l| l.contains("resume at")),
        "not resumed: {log:#?}"
    );
    let opts = Options { holes: false };
    assert_eq!(
        src.manifest("recv/s", opts).unwrap(),
        src.manifest("snaps/s", opts).unwrap(),
        "{log:#?}"
    );
    assert_eq!(received_uuid(&dir.join("s")), uuid_of(&snap));
}

/// A receive interrupted before its first checkpoint (the first 48 MiB of
/// a subvolume's stream) leaves a partial subvolume with a start mark and
/// no resume point: `--resume-token` says to receive the whole stream
/// again, and that receive starts the partial one over and builds the
/// kernel's tree, in both modes. In directory mode this covers an
/// incremental whose copy of its parent was cut short (here by a full
/// tmpfs, grown again before the second receive). A directory put in the
/// partial one's place by hand is not the one marked: refused, and left
/// as it is. Streams and manifests are the kernel's.
#[test]
fn a_receive_cut_before_its_first_checkpoint_starts_over() {
    let test = "a_receive_cut_before_its_first_checkpoint_starts_over";
    if !testing::require_live(test) {
        return;
    }
    let (src, mnt, vol) = scratch_with_vol(512 * MIB);
    let mut rng = Rng::new(1747);
    for d in 0..8 {
        std::fs::create_dir(vol.join(format!("d{d}"))).unwrap();
        for f in 0..250 {
            write_random(&vol.join(format!("d{d}/f{f}")), 6000, &mut rng);
        }
    }
    for f in 0..4 {
        write_random(&vol.join(format!("big{f}")), 4 << 20, &mut rng);
    }
    let snap = |name: &str| {
        snapshot_ro(&vol, &mnt.join(name));
    };
    snap("base");
    std::fs::remove_file(vol.join("d3/f7")).unwrap();
    std::fs::rename(vol.join("d1/f2"), vol.join("d5/moved")).unwrap();
    write_random(&vol.join("d2/new"), 100_000, &mut rng);
    snap("next");
    sh(&mut Command::new("sync"));
    let want_base = src.manifest("base", Options { holes: false }).unwrap();
    let want_next = src.manifest("next", Options { holes: false }).unwrap();
    let work = tempfile::tempdir().unwrap();
    let full = work.path().join("full.stream");
    let inc = work.path().join("inc.stream");
    sh(Command::new("btrfs")
        .args(["send", "-q", "-f"])
        .arg(&full)
        .arg(mnt.join("base")));
    sh(Command::new("btrfs")
        .args(["send", "-q", "-f"])
        .arg(&inc)
        .arg("-p")
        .arg(mnt.join("base"))
        .arg(mnt.join("next")));
    let bytes = std::fs::read(&full).unwrap();
    assert!(
        (20 * MIB..40 * MIB).contains(&(bytes.len() as u64)),
        "{} bytes",
        bytes.len()
    );
    let cut = work.path().join("cut.stream");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let receive = |stream: &Path, dir: &Path| {
        btrsend()
            .args(["receive", "-q", "-f"])
            .arg(stream)
            .arg(dir)
            .env_remove("BTRSEND_CHECKPOINT_BYTES")
            .output()
            .unwrap()
    };
    let ok = |o: std::process::Output, what: &str| {
        assert!(
            o.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let same = |dir: &Path, name: &str, want: &str, what: &str| {
        let got = manifest::manifest(&dir.join(name), Options { holes: false }).unwrap();
        if let Some(d) = manifest::diff(want, &got, 20) {
            panic!("{what}: {d}");
        }
        assert!(!dir.join(btrsend::receive::RESUME_DIR).exists(), "{what}");
    };
    let token_error = |dir: &Path, name: &str| {
        let o = btrsend()
            .args(["receive", "--resume-token"])
            .arg(dir.join(name))
            .output()
            .unwrap();
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };

    // A full stream cut half way, received again whole: in both modes.
    let btrfs_dst = LiveBtrfs::with_options(512 * MIB, &[], "").expect("scratch btrfs");
    let tmpfs = Tmpfs::new(256 * MIB).expect("tmpfs");
    for (mode, root) in [
        ("subvolumes", btrfs_dst.path()),
        ("directories", tmpfs.path()),
    ] {
        let dir = root.join("recv");
        std::fs::create_dir(&dir).unwrap();
        let o = receive(&cut, &dir);
        assert!(!o.status.success(), "{mode}: a cut stream was received");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("truncated"),
            "{mode}"
        );
        let e = token_error(&dir, "base");
        assert!(
            e.contains("has no resume point yet")
                && e.contains("receive the whole stream again, and the receive starts it over"),
            "{mode}: {e}"
        );
        ok(receive(&full, &dir), mode);
        same(&dir, "base", &want_base, mode);
        if mode == "subvolumes" {
            assert_eq!(received_uuid(&dir.join("base")), uuid_of(&mnt.join("base")));
        }
    }

    // Not the directory the receive made: refused, and left as it is.
    let dir = tmpfs.path().join("hand");
    std::fs::create_dir(&dir).unwrap();
    assert!(!receive(&cut, &dir).status.success());
    std::fs::remove_dir_all(dir.join("base")).unwrap();
    std::fs::create_dir(dir.join("base")).unwrap();
    std::fs::write(dir.join("base/mine"), b"keep me").unwrap();
    let o = receive(&full, &dir);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("exists already"), "{e}");
    assert_eq!(std::fs::read(dir.join("base/mine")).unwrap(), b"keep me");

    // An incremental into a directory whose copy of its parent runs out
    // of space: the copy is cut short; with room again, the whole stream
    // starts it over.
    let small = Tmpfs::new(48 * MIB).expect("tmpfs");
    let dir = small.path().join("recv");
    std::fs::create_dir(&dir).unwrap();
    ok(receive(&full, &dir), "parent");
    let o = receive(&inc, &dir);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the copy fit: enlarge the source");
    assert!(e.contains("No space left"), "{e}");
    assert!(dir.join("next").is_dir(), "no partial copy");
    let e = token_error(&dir, "next");
    assert!(e.contains("has no resume point yet"), "{e}");
    sh(Command::new("mount")
        .args(["-o", "remount,size=128m"])
        .arg(small.path()));
    ok(receive(&inc, &dir), "incremental, started over");
    same(&dir, "next", &want_next, "incremental, started over");
    same(&dir, "base", &want_base, "its parent");
}

/// Issue 28 (item 10): `--resume-token` on paths no receive left says
/// what each is, and never advises deleting a path btrsend did not make.
/// Not live: none of these needs a receive.
#[test]
fn issue_28_resume_token_on_what_no_receive_left() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir(dir.join("mine")).unwrap();
    std::fs::write(dir.join("file"), b"x").unwrap();
    std::os::unix::fs::symlink("mine", dir.join("link")).unwrap();
    // A resume directory whose state is not a resume state, and no start
    // mark: btrsend receive kept records of NAME, but none is usable.
    std::fs::create_dir(dir.join("cut")).unwrap();
    let rdir = dir.join(btrsend::receive::RESUME_DIR).join("cut");
    std::fs::create_dir_all(&rdir).unwrap();
    std::fs::write(rdir.join("state"), b"not a state\n").unwrap();
    let d = dir.display();
    for (path, want) in [
        (
            "/etc/passwd".to_owned(),
            "/etc/passwd is not a partial receive: it is a regular file, not a directory (a \
             receive makes a subvolume or a directory)"
                .to_owned(),
        ),
        (
            format!("{d}/file"),
            format!("{d}/file is not a partial receive: it is a regular file, not a directory"),
        ),
        (
            format!("{d}/link"),
            format!("{d}/link is not a partial receive: it is a symbolic link, not a directory"),
        ),
        (
            "/".to_owned(),
            "/ is not a partial receive: give DIR/NAME, the subvolume or directory an \
             interrupted receive into DIR left"
                .to_owned(),
        ),
        (
            format!("{d}/mine"),
            format!(
                "{d}/mine has no resume point and no resume state ({d}/.btrsend-resume/mine \
                 does not exist): it is not a partial receive that btrsend receive can resume"
            ),
        ),
        (format!("{d}/none"), format!("{d}/none does not exist")),
        (
            format!("{d}/cut"),
            format!("{d}/cut has no resume point ({d}/.btrsend-resume/cut/state: "),
        ),
    ] {
        let o = btrsend()
            .args(["receive", "--resume-token", &path])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{path}: {e}");
        assert!(o.stdout.is_empty(), "{path}");
        assert!(
            e.starts_with(&format!("btrsend: error: {want}")),
            "{path}: {e}"
        );
        assert_eq!(e.lines().count(), 1, "{path}: {e}");
        if path.ends_with("/cut") {
            // Only here did btrsend receive keep records of NAME, and
            // even so the advice is for what an interrupted receive left.
            assert!(
                e.contains(
                    "it cannot be resumed; if it is what an interrupted btrsend receive left, \
                     delete it and receive the stream again"
                ),
                "{e}"
            );
        } else {
            assert!(!e.contains("delete"), "{path}: {e}");
        }
    }
    assert!(dir.join("mine").is_dir() && dir.join("file").is_file());
}
