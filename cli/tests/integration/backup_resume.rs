//! `backup run` continuing the stream an interrupted run left (issue 14),
//! live (root; required in CI), in a directory repository.
//!
//! A kernel-made btrfs holds `snaps/s1` (~300 MB: files of 1-12 MB, some
//! compressible, small files), `snaps/s2` (overwrites, renames, ~80 MB of
//! new data) and `snaps/s3` (~60 MB more). `backup run` is killed with
//! SIGKILL at 16 points of s1's full stream and 4 of s2's incremental one,
//! each re-run continuing the partial file of the one before (and then
//! killed itself). The test hook `BTRSEND_TEST_PAUSE_AT=N` stops the
//! run's sender once N bytes of stream went to the stream file's writer
//! (its threads go on with the frames in flight) and says so on stderr; the
//! test then
//! kills it: so the kills fall at chosen points of the stream, and the
//! stream re-sent after each is measured exactly (what the killed run had
//! produced minus what the next one kept), within 64 MiB plus one frame.
//! A torn tail and a flipped byte in the partial's last frame are cut back
//! to the last intact frame; a partial of another snapshot, and one made
//! for another parent, are discarded with a notice and the stream started
//! over. In the end `verify --read-data` passes, `restore --to` of every
//! snapshot has the kernel mount's manifest, and `restore --stdout` of the
//! chain into `btrfs receive` too.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use btrsend::manifest::{self, Options};
use btrsend::testing::workload::Rng;
use btrsend::testing::{self, LiveBtrfs};
use serde_json::Value;

use crate::common::btrsend;
use crate::common::{keygen, sh, snapshot_ro, write_random};
use crate::repo_store::SshServer;

const MIB: u64 = 1 << 20;
/// The default frame size of a stream file.
const FRAME: u64 = 4 * MIB;

/// The source filesystem and its three snapshots, s1 holding `size` bytes
/// of large files.
fn make_source(rng: &mut Rng, size: u64) -> (LiveBtrfs, [PathBuf; 3]) {
    let src = LiveBtrfs::with_options(3 << 30, &[], "").expect("scratch btrfs");
    let mnt = src.path().to_path_buf();
    let vol = mnt.join("vol");
    sh(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(&vol));
    for d in 0..4 {
        let dir = vol.join(format!("d{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..50 {
            let len = rng.below(9000) as usize;
            write_random(&dir.join(format!("s{f}")), len, rng);
        }
    }
    let (mut total, mut big) = (0u64, 0);
    while total < size {
        let len = (MIB + rng.below(11 * MIB)) as usize;
        write_random(&vol.join(format!("d{}/big{big}", big % 4)), len, rng);
        total += len as u64;
        big += 1;
    }
    std::fs::create_dir(mnt.join("snaps")).unwrap();
    let s1 = mnt.join("snaps/s1");
    snapshot_ro(&vol, &s1);
    // s2: overwrites, a rename, new data.
    for b in (0..big).step_by(6) {
        let p = vol.join(format!("d{}/big{b}", b % 4));
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&rng.bytes(200_000, false), 50_000).unwrap();
    }
    std::fs::rename(vol.join("d1"), vol.join("d0/moved")).unwrap();
    for n in 0..8 {
        write_random(&vol.join(format!("d2/new{n}")), 10 << 20, rng);
    }
    let s2 = mnt.join("snaps/s2");
    snapshot_ro(&vol, &s2);
    // s3: more new data, a deletion.
    std::fs::remove_file(vol.join("d2/new0")).unwrap();
    for n in 0..6 {
        write_random(&vol.join(format!("d3/more{n}")), 10 << 20, rng);
    }
    let s3 = mnt.join("snaps/s3");
    snapshot_ro(&vol, &s3);
    sh(&mut Command::new("sync"));
    (src, [s1, s2, s3])
}

/// What one `backup run --json` did: its JSON lines, where its sender was
/// stopped (then it was killed with SIGKILL), its stderr.
struct Run {
    lines: Vec<Value>,
    paused_at: Option<u64>,
    stderr: String,
}

impl Run {
    /// The notices it printed.
    fn notices(&self) -> Vec<String> {
        self.lines
            .iter()
            .filter_map(|l| l["notice"].as_str().map(str::to_owned))
            .collect()
    }

    /// Its `stored` message.
    fn stored(&self) -> Option<&Value> {
        self.lines.iter().find(|l| l["message_type"] == "stored")
    }

    fn resumed_from(&self) -> Option<u64> {
        self.lines
            .iter()
            .filter(|l| l["message_type"] == "status")
            .find_map(|l| l.get("resumed_from_bytes")?.as_u64())
    }
}

/// `backup run --json --repo REPO EXTRA… SNAP`, killed with SIGKILL once
/// its sender stopped at `pause_at` stream bytes (if it gets there).
fn run(repo: &Path, snap: &Path, pause_at: Option<u64>, extra: &[&str]) -> Run {
    run_in(repo.as_os_str(), &[], snap, pause_at, None, extra)
}

/// [`run`] with the variables `envs` (an S3 server's); once paused, the
/// kill waits (up to a minute) until `settled` says so.
fn run_in(
    repo: &std::ffi::OsStr,
    envs: &[(&str, String)],
    snap: &Path,
    pause_at: Option<u64>,
    settled: Option<&dyn Fn() -> bool>,
    extra: &[&str],
) -> Run {
    run_cut(repo, envs, snap, pause_at, settled, false, extra)
}

/// [`run_in`]; with `cut_first`, `settled` cuts the run's connection to
/// its repository, so the run may end with an error of its own before
/// the kill.
fn run_cut(
    repo: &std::ffi::OsStr,
    envs: &[(&str, String)],
    snap: &Path,
    pause_at: Option<u64>,
    settled: Option<&dyn Fn() -> bool>,
    cut_first: bool,
    extra: &[&str],
) -> Run {
    let mut c = btrsend();
    c.args(["backup", "run", "--json", "--repo"])
        .arg(repo)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .args(extra)
        .arg(snap)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(n) = pause_at {
        c.env("BTRSEND_TEST_PAUSE_AT", n.to_string());
    }
    let mut child = c.spawn().expect("btrsend backup run");
    let mut out = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if let Some(n) = line
                .strip_prefix("btrsend: test: paused after ")
                .and_then(|r| r.strip_suffix(" stream bytes"))
            {
                let _ = tx.send(n.parse::<u64>().unwrap());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let paused_at = match rx.recv_timeout(Duration::from_secs(600)) {
        Ok(n) => {
            if let Some(f) = settled {
                let t = std::time::Instant::now();
                while !f() && t.elapsed() < Duration::from_secs(60) {
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            child.kill().unwrap();
            Some(n)
        }
        Err(_) => None,
    };
    let status = child.wait().unwrap();
    let stdout = stdout.join().unwrap();
    let stderr = stderr.join().unwrap();
    if paused_at.is_some() {
        assert!(
            status.signal() == Some(9) || (cut_first && !status.success()),
            "{status:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    } else {
        assert!(status.success(), "{status:?}: {stderr}");
    }
    let lines = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    Run {
        lines,
        paused_at,
        stderr,
    }
}

/// The partial stream files in the repository's `tmp/`.
fn partials(repo: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo.join("tmp"))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    // (Not the record of an encrypted one: NAME.btrs.zst.key.)
    v.retain(|p| {
        let p = p.to_string_lossy();
        p.contains(".btrs.zst.") && !p.ends_with(".key")
    });
    v.sort();
    v
}

/// Kill runs of `snap` at each of `points`, each run continuing the
/// partial of the one before; the largest stream re-sent after a kill.
fn kill_at(repo: &Path, snap: &Path, points: &[u64], extra: &[&str], log: &mut Vec<String>) -> u64 {
    let mut prev: Option<u64> = None;
    let mut max_resent = 0;
    for &at in points {
        // The kill waits until the partial file stops growing: the run's
        // threads write the frames in flight after its sender stopped,
        // and on a loaded machine a kill at once can find not even the
        // first frame whole.
        let last = std::cell::Cell::new((u64::MAX, std::time::Instant::now()));
        let settled = || {
            let size: u64 = partials(repo)
                .iter()
                .filter_map(|p| std::fs::metadata(p).ok())
                .map(|m| m.len())
                .sum();
            let (prev, since) = last.get();
            if size != prev {
                last.set((size, std::time::Instant::now()));
                return false;
            }
            since.elapsed() >= Duration::from_millis(1000)
        };
        let r = run_in(repo.as_os_str(), &[], snap, Some(at), Some(&settled), extra);
        let paused = r
            .paused_at
            .unwrap_or_else(|| panic!("the run of {} ended before {at} bytes", snap.display()));
        let kept = r.resumed_from();
        if let Some(p) = prev {
            let kept = kept.unwrap_or_else(|| {
                panic!(
                    "the run after a kill at {p} did not continue: {:?}",
                    r.lines
                )
            });
            let resent = p - kept;
            log.push(format!(
                "{}: killed at {p}, continued from {kept}: {resent} re-sent",
                snap.display()
            ));
            // (An encrypted one's writer holds up to a chunk more.)
            assert!(
                resent <= 64 * MIB + FRAME + 64 * 1024,
                "{resent} bytes re-sent after a kill at {p}"
            );
            max_resent = max_resent.max(resent);
        }
        assert_eq!(partials(repo).len(), 1, "{}", r.stderr);
        prev = Some(paused);
    }
    max_resent
}

/// The exact length of `snap`'s stream (incremental from `parent`), as
/// `send --estimate` gives it.
fn estimate(snap: &Path, parent: Option<&Path>) -> u64 {
    let mut c = btrsend();
    c.args(["send", "--estimate"]);
    if let Some(p) = parent {
        c.arg("-p").arg(p);
    }
    let o = sh(c.arg(snap));
    String::from_utf8(o.stdout)
        .unwrap()
        .trim()
        .parse::<u64>()
        .unwrap()
}

/// `backup restore --to DIR SNAP` and the manifests of its chain.
fn check_restore(repo: &Path, src: &LiveBtrfs, to: &Path, snap: &str, chain: &[&str]) {
    std::fs::create_dir_all(to).unwrap();
    sh(btrsend()
        .args(["backup", "restore", "--repo"])
        .arg(repo)
        .arg("--to")
        .arg(to)
        .arg(snap));
    let opts = Options { holes: false };
    for s in chain {
        let want = src.manifest(&format!("snaps/{s}"), opts).unwrap();
        let got = manifest::manifest(&to.join(s), opts).unwrap();
        assert!(
            manifest::diff(&want, &got, 20).is_none(),
            "{s}: {}",
            manifest::diff(&want, &got, 20).unwrap_or_default()
        );
    }
}

/// What `restore` (a `backup restore --stdout …` command) writes, into
/// the kernel's `btrfs receive`, whose trees of the chain `chain` must
/// have the kernel mount's manifests.
fn check_received(mut restore: Command, src: &LiveBtrfs, scratch: &Path, chain: &[&str]) {
    let stream = scratch.join("chain.stream");
    let out = restore
        .stdout(std::fs::File::create(&stream).unwrap())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    src.receive("recv", &[&stream]).unwrap();
    // Hundreds of MiB: gone before the next step writes more.
    std::fs::remove_file(&stream).unwrap();
    let opts = Options { holes: false };
    for s in chain {
        let want = src.manifest(&format!("snaps/{s}"), opts).unwrap();
        let got = src.manifest(&format!("recv/{s}"), opts).unwrap();
        assert!(
            manifest::diff(&want, &got, 20).is_none(),
            "btrfs receive {s}: {}",
            manifest::diff(&want, &got, 20).unwrap_or_default()
        );
    }
}

/// `btrsend backup restore --stdout ARGS… --repo REPO SNAP`.
fn restore_stdout(repo: &Path, args: &[&str], snap: &str) -> Command {
    let mut c = btrsend();
    c.args(["backup", "restore", "--stdout"])
        .args(args)
        .arg("--repo")
        .arg(repo)
        .arg(snap);
    c
}

#[test]
fn backup_run_continues_the_stream_an_interrupted_run_left() {
    let test = "backup_run_continues_the_stream_an_interrupted_run_left";
    if !testing::require_live(test) {
        return;
    }
    let mut rng = Rng::new(1414);
    let (src, [s1, s2, s3]) = make_source(&mut rng, 300 * MIB);
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    sh(btrsend()
        .args(["backup", "init", "--repo"])
        .arg(&repo)
        .args(["--encryption", "none"]));
    let len1 = estimate(&s1, None);
    let len2 = estimate(&s2, Some(&s1));
    assert!(len1 > 250 * MIB && len2 > 80 * MIB, "{len1} {len2}");
    let mut log = Vec::new();

    // s1: 16 kills spread over its stream, at random points of 16 equal
    // slices.
    let points: Vec<u64> = (0..16)
        .map(|k| 40 * MIB + (len1 - 48 * MIB) * k / 16 + rng.below((len1 - 48 * MIB) / 16))
        .collect();
    let mut max_resent = kill_at(&repo, &s1, &points, &[], &mut log);
    // Nothing partial is listed; verify passes and notes the partial file.
    let list = sh(btrsend()
        .args(["backup", "list", "--json", "--repo"])
        .arg(&repo));
    assert_eq!(String::from_utf8_lossy(&list.stdout).trim(), "[]");
    let v = sh(btrsend()
        .args(["backup", "verify", "--read-data", "--repo"])
        .arg(&repo));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );
    assert!(
        !text.contains("error") && !text.contains("btrsend: damage"),
        "verify: {text}"
    );
    // The last run continues and stores it.
    let r = run(&repo, &s1, None, &[]);
    let kept = r.resumed_from().expect("the last run continued");
    let last = points[points.len() - 1];
    max_resent = max_resent.max(last.saturating_sub(kept));
    let stored = r.stored().expect("s1 stored");
    assert_eq!(stored["stream_bytes"].as_u64(), Some(len1));
    assert_eq!(stored["resumed_from_bytes"].as_u64(), Some(kept));
    assert_eq!(stored["sent_bytes"].as_u64(), Some(len1 - kept));
    assert!(partials(&repo).is_empty());

    // s2 (incremental from s1): 4 kills; the partial of the second one
    // gets a torn tail, that of the third a flipped byte in its last frame.
    let points: Vec<u64> = (0..4)
        .map(|k| 40 * MIB + k * (len2 - 46 * MIB) / 4)
        .collect();
    let mut prev = None;
    let mut s2_copy = None;
    for (k, &at) in points.iter().enumerate() {
        let r = run(&repo, &s2, Some(at), &[]);
        if let Some((p, cut)) = prev {
            let kept = r
                .resumed_from()
                .unwrap_or_else(|| panic!("not continued: {:?} {}", r.lines, r.stderr));
            let resent = p - kept;
            log.push(format!("s2: killed at {p}, continued from {kept}"));
            assert!(resent <= 64 * MIB + FRAME + cut, "{resent} re-sent");
            if cut > 0 {
                assert!(
                    r.notices().iter().any(|n| n.contains("keeping its first")),
                    "{:?}",
                    r.notices()
                );
            } else {
                max_resent = max_resent.max(resent);
            }
        }
        let part = partials(&repo);
        assert_eq!(part.len(), 1);
        let path = &part[0];
        let mut bytes = std::fs::read(path).unwrap();
        let cut = match k {
            1 => {
                // Torn: the last 1000 bytes gone.
                bytes.truncate(bytes.len() - 1000);
                std::fs::write(path, &bytes).unwrap();
                FRAME + 1000
            }
            2 => {
                let n = bytes.len();
                bytes[n - 100] ^= 0x55;
                std::fs::write(path, &bytes).unwrap();
                2 * FRAME
            }
            _ => 0,
        };
        if k == 0 {
            s2_copy = Some(bytes);
        }
        prev = Some((r.paused_at.unwrap(), cut));
    }
    let r = run(&repo, &s2, None, &[]);
    assert!(r.resumed_from().is_some(), "{:?}", r.lines);
    let stored = r.stored().expect("s2 stored");
    let uuid2 = stored["uuid"].as_str().unwrap().to_owned();
    assert_eq!(stored["kind"], "incremental");
    assert_eq!(stored["stream_bytes"].as_u64(), Some(len2));

    // s3: a partial holding another snapshot's stream (s2's, named as
    // s3's), and one of s3 made incremental while this run stores it full.
    let r = run(&repo, &s3, Some(44 * MIB), &[]);
    assert!(r.paused_at.is_some());
    let real = partials(&repo);
    assert_eq!(real.len(), 1);
    let name = real[0].file_name().unwrap().to_string_lossy().into_owned();
    let fake = real[0].with_file_name(format!("{name}.0"));
    std::fs::write(&fake, s2_copy.unwrap()).unwrap();
    let r = run(&repo, &s3, None, &["--full-every", "1"]);
    let notices = r.notices();
    assert!(
        notices
            .iter()
            .any(|n| n.contains("not continuing") && n.contains("holds the stream of snapshot")),
        "{notices:?}"
    );
    assert!(
        notices.iter().any(|n| n.contains("not continuing")
            && n.contains("it holds incremental from")
            && n.contains("this run stores a full stream")),
        "{notices:?}"
    );
    assert_eq!(r.resumed_from(), None);
    let stored = r.stored().expect("s3 stored");
    let uuid3 = stored["uuid"].as_str().unwrap().to_owned();
    assert_eq!(stored["kind"], "full");
    assert!(partials(&repo).is_empty());

    // The repository verifies, and restores to the kernel's trees.
    let v = sh(btrsend()
        .args(["backup", "verify", "--read-data", "--repo"])
        .arg(&repo));
    assert!(
        v.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&v.stderr)
    );
    let to = src.path().join("restored");
    check_restore(&repo, &src, &to, &uuid2, &["s1", "s2"]);
    check_restore(&repo, &src, &to.join("3"), &uuid3, &["s3"]);
    check_received(
        restore_stdout(&repo, &[], &uuid2),
        &src,
        tmp.path(),
        &["s1", "s2"],
    );
    eprintln!(
        "{test}: 20 kills; largest stream re-sent after a kill: {max_resent} bytes ({:.1} MiB)\n{}",
        max_resent as f64 / MIB as f64,
        log.join("\n")
    );
}

/// The markers of unfinished uploads in an S3 repository's `tmp/` (as the
/// server's files).
fn markers(files: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(files.join("tmp"))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.to_string_lossy().ends_with(".upload"));
    v.sort();
    v
}

/// The same in an S3 repository (issue 14): `backup run` killed with
/// SIGKILL at 10 points of s1's full stream, each next run continuing the
/// multipart upload from the state its marker recorded as parts were
/// stored (re-sent: at most 64 MiB plus one 8 MiB part after each kill).
/// The kill comes once the parts in flight when the sender stopped are
/// stored and recorded (a kill while parts are in flight loses them too:
/// up to four parts of 8 MiB more, see the S3 store's doc);
/// the stored stream's BLAKE3 is that of an uninterrupted send, computed
/// here from `restore --stdout`. A marker of another snapshot is discarded
/// with a notice, and so is one whose upload the server no longer has (the
/// stream is then sent again). In the end nothing of an upload is left on
/// the server, `verify --read-data` passes, and `restore --to` and
/// `restore --stdout | btrfs receive` give the kernel mount's manifests.
#[test]
fn backup_run_continues_an_interrupted_s3_upload() {
    s3_case("backup_run_continues_an_interrupted_s3_upload", "none");
}

/// The same in an encrypted repository (issue 31, passphrase mode): the
/// marker's state is sealed (no frame table or hash state in the clear),
/// and the continued upload is an age file the identity opens.
#[test]
fn backup_run_continues_an_interrupted_encrypted_s3_upload() {
    s3_case(
        "backup_run_continues_an_interrupted_encrypted_s3_upload",
        "passphrase",
    );
}

fn s3_case(test: &str, encryption: &str) {
    use crate::repo_store::{Backend, Kind};
    const PART: u64 = 8 * MIB;
    if !testing::require_live(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(be) = Backend::new(Kind::S3, test, tmp.path()) else {
        return;
    };
    let repo = be.repo("repo");
    let mut envs = be.envs();
    if encryption != "none" {
        envs.push(("BTRSEND_PASSWORD", String::from("correct horse")));
        envs.push(("BTRSEND_SCRYPT_LOG_N", String::from("10")));
    }
    let spec = std::ffi::OsString::from(&repo.spec);
    let cmd = || {
        let mut c = btrsend();
        c.envs(envs.iter().map(|(k, v)| (k, v)));
        c
    };
    // The parts of the upload on the server are those its marker records
    // (a part being stored is on the server already; the one-byte probe
    // part of a continued upload that no part replaced yet is not counted).
    let server_root = repo.files.parent().unwrap().parent().unwrap().to_path_buf();
    let files = repo.files.clone();
    let repo_files = repo.files.clone();
    let settled = move || {
        let m = markers(&files);
        let Some(Ok(body)) = m
            .first()
            .map(|p| serde_json::from_slice::<Value>(&std::fs::read(p).unwrap_or_default()))
        else {
            return false;
        };
        let recorded = body["parts"].as_array().map_or(0, Vec::len);
        let id = body["upload_id"].as_str().unwrap_or_default().to_owned();
        let on_server: Vec<(usize, u64)> = std::fs::read_dir(&server_root)
            .unwrap()
            .filter_map(|e| {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                let n = name
                    .strip_prefix(&format!(".upload_id-{id}.part-"))?
                    .parse()
                    .ok()?;
                Some((n, e.metadata().unwrap().len()))
            })
            .collect();
        // No request being stored (s3s-fs writes each into a temporary
        // file first).
        let busy = std::fs::read_dir(&server_root).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".tmp.")
        });
        recorded > 0
            && !busy
            && on_server
                .iter()
                .all(|&(n, len)| n <= recorded || n == recorded + 1 && len == 1)
    };
    // Settled, and still so a second later (no request in between).
    let settled = move || {
        let state = |f: &dyn Fn() -> bool| {
            f().then(|| {
                markers(&repo_files)
                    .first()
                    .map(|p| std::fs::read(p).unwrap_or_default())
            })
        };
        let Some(a) = state(&settled) else {
            return false;
        };
        std::thread::sleep(Duration::from_secs(1));
        state(&settled).is_some_and(|b| b == a)
    };
    let settled: Option<&dyn Fn() -> bool> = Some(&settled);
    let mut rng = Rng::new(1416);
    let (src, [s1, s2, _]) = make_source(&mut rng, 300 * MIB);
    sh(cmd()
        .args(["backup", "init", "--repo"])
        .arg(&spec)
        .args(["--encryption", encryption]));
    let len1 = estimate(&s1, None);
    assert!(len1 > 250 * MIB, "{len1}");
    let mut log = Vec::new();
    let mut max_resent = 0;
    let points: Vec<u64> = (0..10)
        .map(|k| 40 * MIB + (len1 - 48 * MIB) * k / 10 + rng.below((len1 - 48 * MIB) / 10))
        .collect();
    let mut prev: Option<u64> = None;
    let mut s1_marker = None;
    for &at in &points {
        let r = run_in(&spec, &envs, &s1, Some(at), settled, &[]);
        let paused = r.paused_at.expect("killed");
        if let Some(p) = prev {
            let kept = r
                .resumed_from()
                .unwrap_or_else(|| panic!("not continued after a kill at {p}: {:?}", r.lines));
            let resent = p - kept;
            log.push(format!(
                "s1: killed at {p}, continued from {kept}: {resent} re-sent"
            ));
            assert!(
                resent <= 64 * MIB + PART,
                "{resent} bytes re-sent after a kill at {p}"
            );
            max_resent = max_resent.max(resent);
        }
        let m = markers(&repo.files);
        assert_eq!(m.len(), 1, "{m:?} {}", r.stderr);
        // What the marker records: the upload, its parts in order, a state.
        let body: Value = serde_json::from_slice(&std::fs::read(&m[0]).unwrap()).unwrap();
        assert!(
            body["parts"].as_array().is_some_and(|p| !p.is_empty()),
            "{body}"
        );
        assert!(body["state"].is_string(), "{body}");
        if encryption != "none" {
            let state = body["state"].as_str().unwrap();
            assert!(
                !state.contains("frames") && !state.contains("blake3"),
                "{body}"
            );
        }
        s1_marker.get_or_insert(std::fs::read(&m[0]).unwrap());
        prev = Some(paused);
    }
    assert!(
        !be.upload_parts().is_empty(),
        "the killed upload's parts are on the server"
    );
    let r = run_in(&spec, &envs, &s1, None, None, &[]);
    let kept = r.resumed_from().expect("the last run continued");
    let last = points[points.len() - 1];
    max_resent = max_resent.max(last.saturating_sub(kept));
    let stored = r.stored().expect("s1 stored").clone();
    assert_eq!(stored["stream_bytes"].as_u64(), Some(len1));
    assert_eq!(stored["resumed_from_bytes"].as_u64(), Some(kept));
    assert_eq!(stored["sent_bytes"].as_u64(), Some(len1 - kept));
    assert!(markers(&repo.files).is_empty());
    assert_eq!(be.upload_parts(), Vec::<String>::new());
    // The stored stream is the uninterrupted send's, byte for byte: its
    // BLAKE3, computed here, is the catalog's, and a plain send's.
    let restored = cmd()
        .args(["backup", "restore", "--stdout", "--repo"])
        .arg(&spec)
        .arg(stored["uuid"].as_str().unwrap())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        restored.status.success(),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );
    let hash = blake3::hash(&restored.stdout).to_hex().to_string();
    assert_eq!(stored["stream_blake3"].as_str(), Some(hash.as_str()));
    let sent = sh(btrsend().arg("send").arg(&s1));
    assert_eq!(blake3::hash(&sent.stdout).to_hex().to_string(), hash);
    drop((restored, sent));

    // s2: killed once; then a marker of s1's upload named as s2's is put
    // beside its own: the next run discards it and continues s2's.
    let r = run_in(&spec, &envs, &s2, Some(30 * MIB), settled, &[]);
    let paused = r.paused_at.expect("killed");
    let m = markers(&repo.files);
    assert_eq!(m.len(), 1);
    let name = m[0].file_name().unwrap().to_string_lossy().into_owned();
    let base = name.split_once(".btrs.zst.").unwrap().0;
    let fake = m[0].with_file_name(format!("{base}.btrs.zst.0000000000000000.upload"));
    std::fs::write(&fake, s1_marker.unwrap()).unwrap();
    let r = run_in(&spec, &envs, &s2, Some(60 * MIB), settled, &[]);
    let notices = r.notices();
    assert!(
        notices
            .iter()
            .any(|n| n.contains("not continuing") && n.contains("holds the stream of snapshot")),
        "{notices:?}"
    );
    let kept = r.resumed_from().expect("s2 continued");
    assert!(paused - kept <= 64 * MIB + PART);
    log.push(format!("s2: killed at {paused}, continued from {kept}"));
    assert_eq!(markers(&repo.files).len(), 1);
    // The server forgets s2's upload (as a lifecycle rule would abort
    // it): the next run says so and sends the stream again.
    let body: Value =
        serde_json::from_slice(&std::fs::read(&markers(&repo.files)[0]).unwrap()).unwrap();
    let id = body["upload_id"].as_str().unwrap();
    let server_root = repo.files.parent().unwrap().parent().unwrap();
    std::fs::remove_file(server_root.join(format!(".upload-{id}.json"))).unwrap();
    let r = run_in(&spec, &envs, &s2, None, None, &[]);
    assert!(
        r.notices()
            .iter()
            .any(|n| n.contains("not continuing") && n.contains("continue upload of")),
        "{:?}",
        r.notices()
    );
    assert_eq!(r.resumed_from(), None);
    let stored2 = r.stored().expect("s2 stored").clone();
    assert_eq!(stored2["resumed_from_bytes"].as_u64(), Some(0));
    assert_eq!(stored2["kind"], "incremental");
    assert!(markers(&repo.files).is_empty());

    // The repository verifies and restores to the kernel's trees.
    let v = sh(cmd()
        .args(["backup", "verify", "--read-data", "--repo"])
        .arg(&spec));
    assert!(
        v.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&v.stderr)
    );
    let uuid2 = stored2["uuid"].as_str().unwrap();
    let to = src.path().join("restored-s3");
    std::fs::create_dir_all(&to).unwrap();
    sh(cmd()
        .args(["backup", "restore", "--repo"])
        .arg(&spec)
        .arg("--to")
        .arg(&to)
        .arg(uuid2));
    let opts = Options { holes: false };
    for s in ["s1", "s2"] {
        let want = src.manifest(&format!("snaps/{s}"), opts).unwrap();
        let got = manifest::manifest(&to.join(s), opts).unwrap();
        assert!(
            manifest::diff(&want, &got, 20).is_none(),
            "{s}: {}",
            manifest::diff(&want, &got, 20).unwrap_or_default()
        );
    }
    let mut restore = cmd();
    restore
        .args(["backup", "restore", "--stdout", "--repo"])
        .arg(&spec)
        .arg(uuid2);
    check_received(restore, &src, tmp.path(), &["s1", "s2"]);
    eprintln!(
        "{test}: 11 kills; largest stream re-sent after a kill: {max_resent} bytes ({:.1} MiB)\n{}",
        max_resent as f64 / MIB as f64,
        log.join("\n")
    );
}

/// The same in an encrypted directory repository (issue 31), in recipients
/// mode, the runs holding only the public recipient and the write key:
/// `backup run` killed at 18 points of s1's full stream and 2 of s2's
/// incremental one, each next run continuing the age file the one before
/// left (its chunks read back with the payload key of its sealed record
/// `tmp/NAME.key`). The partial file is an age file that holds no zstd
/// frame in the clear; a chunk changed in the middle of it ends what the
/// next run keeps, with a notice. In the end no record is left, `verify
/// --read-data` with the identity passes, the stored s1 stream is the
/// plain send's byte for byte, and `restore --stdout | btrfs receive`
/// gives the kernel mount's manifests.
#[test]
fn backup_run_continues_an_encrypted_upload() {
    let test = "backup_run_continues_an_encrypted_upload";
    if !testing::require_live(test) {
        return;
    }
    let mut rng = Rng::new(1417);
    let (src, [s1, s2, _]) = make_source(&mut rng, 200 * MIB);
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let (identity, recipient) = keygen(tmp.path(), "identity.txt");
    let write_key = tmp.path().join("write-key.json");
    sh(btrsend()
        .args(["backup", "init", "--repo"])
        .arg(&repo)
        .args(["--encryption", "recipients", "--recipient", &recipient])
        .arg("--write-key")
        .arg(&write_key));
    let wk = write_key.to_str().unwrap();
    let host = ["--write-key", wk];
    let len1 = estimate(&s1, None);
    let len2 = estimate(&s2, Some(&s1));
    assert!(len1 > 190 * MIB && len2 > 80 * MIB, "{len1} {len2}");
    let mut log = Vec::new();

    // (From 40 MiB on: a run killed as early as that may not have stored
    // a whole frame yet, its frames still being compressed.)
    let points: Vec<u64> = (0..18)
        .map(|k| 40 * MIB + (len1 - 48 * MIB) * k / 18 + rng.below((len1 - 48 * MIB) / 18))
        .collect();
    let mut max_resent = kill_at(&repo, &s1, &points, &host, &mut log);
    // What a killed run leaves: an age file, and its sealed record.
    let part = partials(&repo);
    let bytes = std::fs::read(&part[0]).unwrap();
    assert!(bytes.starts_with(b"age-encryption.org/v1\n"));
    // No zstd frames in the clear: a plaintext partial has a frame magic
    // at each of its dozens of frames. Ciphertext holds any four bytes
    // once per 4 GiB on average (about 0.05 times in these 200 MiB, so
    // "never" failed about one run in twenty); three or more is
    // plaintext, not chance (p < 2e-5).
    let magics = bytes
        .windows(4)
        .filter(|w| *w == [0x28, 0xb5, 0x2f, 0xfd])
        .count();
    assert!(magics <= 2, "{magics} zstd frame magics in the clear");
    let name = part[0].file_name().unwrap().to_string_lossy().into_owned();
    let base = name.split_once(".btrs.zst.").unwrap().0;
    let record = repo.join(format!("tmp/{base}.btrs.zst.key"));
    assert!(
        std::fs::read(&record)
            .unwrap()
            .starts_with(b"btrsend-sealed-1\n")
    );
    drop(bytes);
    let r = run(&repo, &s1, None, &host);
    let kept = r.resumed_from().expect("the last run continued");
    max_resent = max_resent.max(points[points.len() - 1].saturating_sub(kept));
    let stored = r.stored().expect("s1 stored").clone();
    assert_eq!(stored["stream_bytes"].as_u64(), Some(len1));
    assert_eq!(stored["resumed_from_bytes"].as_u64(), Some(kept));
    assert!(partials(&repo).is_empty());
    assert!(!record.exists(), "the record goes with the upload");

    // s2: killed; a byte of a chunk in the middle of the partial file is
    // changed; the next run keeps the frames before that chunk, is killed
    // too, and the last one completes it.
    let r = run(&repo, &s2, Some(50 * MIB), &host);
    let paused = r.paused_at.expect("killed");
    let part = partials(&repo);
    assert_eq!(part.len(), 1);
    let mut bytes = std::fs::read(&part[0]).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x55;
    std::fs::write(&part[0], &bytes).unwrap();
    let r = run(&repo, &s2, Some(70 * MIB), &host);
    let kept = r
        .resumed_from()
        .unwrap_or_else(|| panic!("not continued: {:?} {}", r.lines, r.stderr));
    // (The change sits about halfway through what the killed run kept.)
    assert!(kept > 0 && kept < paused * 3 / 4, "{kept} {paused}");
    assert!(
        r.notices()
            .iter()
            .any(|n| n.contains("keeping its first") && n.contains("does not authenticate")),
        "{:?}",
        r.notices()
    );
    log.push(format!(
        "s2: killed at {paused}, chunk at byte {at} changed, continued from {kept}"
    ));
    let r = run(&repo, &s2, None, &host);
    assert!(r.resumed_from().is_some(), "{:?}", r.lines);
    let stored2 = r.stored().expect("s2 stored").clone();
    assert_eq!(stored2["stream_bytes"].as_u64(), Some(len2));
    assert!(partials(&repo).is_empty());
    let left: Vec<_> = std::fs::read_dir(repo.join("tmp"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // Read with the identity: it verifies; s1 is the plain send's stream;
    // the chain restores to the kernel's trees.
    let id = identity.to_str().unwrap();
    let v = sh(btrsend()
        .args([
            "backup",
            "verify",
            "--read-data",
            "--identity",
            id,
            "--repo",
        ])
        .arg(&repo));
    assert!(
        v.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&v.stderr)
    );
    let restored = sh(btrsend()
        .args(["backup", "restore", "--stdout", "--identity", id, "--repo"])
        .arg(&repo)
        .arg(stored["uuid"].as_str().unwrap()));
    let sent = sh(btrsend().arg("send").arg(&s1));
    assert!(restored.stdout == sent.stdout, "s1 as sent");
    drop((restored, sent));
    check_received(
        restore_stdout(
            &repo,
            &["--identity", id],
            stored2["uuid"].as_str().unwrap(),
        ),
        &src,
        tmp.path(),
        &["s1", "s2"],
    );
    eprintln!(
        "{test}: 20 kills; largest stream re-sent after a kill: {max_resent} bytes ({:.1} MiB)\n{}",
        max_resent as f64 / MIB as f64,
        log.join("\n")
    );
}

/// `backup run` into a repository on the far end of a real `sshd`
/// (issue 33), its connection cut at 20 points of s1's full stream: by
/// killing the ssh client, the far end's `btrsend serve`, or the run
/// itself, in turn. Each next run continues the partial file the far end
/// kept (re-sending at most 64 MiB plus a frame); then s2 goes
/// incrementally over the same ssh, `verify --read-data` passes over ssh
/// and `restore --to` over ssh gives the kernel mount's manifests.
#[test]
fn backup_run_over_ssh_continues_after_the_connection_is_cut() {
    let test = "backup_run_over_ssh_continues_after_the_connection_is_cut";
    if !testing::require_live(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(sshd) = SshServer::start(test, &tmp.path().join("sshd"), "") else {
        return;
    };
    let mut rng = Rng::new(1433);
    let (src, [s1, s2, _]) = make_source(&mut rng, 200 * MIB);
    let repo = tmp.path().join("repo");
    sh(btrsend()
        .args(["backup", "init", "--repo"])
        .arg(&repo)
        .args(["--encryption", "none"]));
    // The far end's btrsend under a name of this test's own, so that
    // killing it kills no other test's server.
    let far = tmp.path().join("btrsend-far");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_btrsend"), &far).unwrap();
    let far = far.to_str().unwrap().to_owned();
    let envs = vec![
        ("BTRSEND_SSH", sshd.ssh_command()),
        ("BTRSEND_REMOTE_PATH", far.clone()),
    ];
    let url = sshd.url(&repo);
    let len1 = estimate(&s1, None);
    assert!(len1 > 190 * MIB, "{len1}");
    let points: Vec<u64> = (0..20)
        .map(|k| 40 * MIB + (len1 - 48 * MIB) * k / 20 + rng.below((len1 - 48 * MIB) / 20))
        .collect();
    let pkill = |pattern: &str| {
        let _ = Command::new("pkill")
            .args(["-KILL", "-f", pattern])
            .status();
        std::thread::sleep(Duration::from_millis(300));
        true
    };
    let ssh_client = format!("client_key .*-p {} ", sshd.port());
    let far_end = format!("{far} serve");
    let mut log = Vec::new();
    let mut prev: Option<(u64, &str)> = None;
    let mut max_resent = 0;
    for (i, &at) in points.iter().enumerate() {
        let (victim, cut): (&str, Option<&dyn Fn() -> bool>) = match i % 3 {
            0 => ("the run", None),
            1 => ("ssh", Some(&|| pkill(&ssh_client))),
            _ => ("serve", Some(&|| pkill(&far_end))),
        };
        let r = run_cut(url.as_ref(), &envs, &s1, Some(at), cut, cut.is_some(), &[]);
        let paused = r.paused_at.expect("paused");
        if let Some((p, was)) = prev {
            let kept = r
                .resumed_from()
                .unwrap_or_else(|| panic!("not continued after a cut at {p}: {:?}", r.lines));
            let resent = p - kept;
            log.push(format!(
                "killed {was} at {p}, continued from {kept}: {resent} re-sent"
            ));
            assert!(
                resent <= 64 * MIB + FRAME,
                "{resent} bytes re-sent after a cut at {p}"
            );
            max_resent = max_resent.max(resent);
        }
        assert_eq!(partials(&repo).len(), 1, "{}", r.stderr);
        prev = Some((paused, victim));
    }
    let r = run_in(url.as_ref(), &envs, &s1, None, None, &[]);
    let kept = r.resumed_from().expect("the last run continued");
    let stored = r.stored().expect("s1 stored");
    assert_eq!(stored["stream_bytes"].as_u64(), Some(len1));
    assert_eq!(stored["sent_bytes"].as_u64(), Some(len1 - kept));
    assert!(partials(&repo).is_empty());
    let r = run_in(url.as_ref(), &envs, &s2, None, None, &[]);
    let stored = r.stored().expect("s2 stored");
    assert_eq!(stored["kind"], "incremental");
    let uuid2 = stored["uuid"].as_str().unwrap().to_owned();
    let over_ssh = |args: &[&str]| {
        let mut c = btrsend();
        c.arg("backup")
            .args(args)
            .args(["--repo", &url])
            .envs(envs.iter().map(|(k, v)| (k, v)));
        c
    };
    let v = sh(&mut over_ssh(&["verify", "--read-data"]));
    assert!(
        v.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&v.stderr)
    );
    let to = src.path().join("restored");
    std::fs::create_dir_all(&to).unwrap();
    sh(&mut over_ssh(&[
        "restore",
        "--to",
        to.to_str().unwrap(),
        &uuid2,
    ]));
    let opts = Options { holes: false };
    for s in ["s1", "s2"] {
        let want = src.manifest(&format!("snaps/{s}"), opts).unwrap();
        let got = manifest::manifest(&to.join(s), opts).unwrap();
        assert!(
            manifest::diff(&want, &got, 20).is_none(),
            "{s}: {}",
            manifest::diff(&want, &got, 20).unwrap_or_default()
        );
    }
    eprintln!(
        "{test}: 20 cuts; largest stream re-sent after one: {max_resent} bytes ({:.1} MiB)\n{}",
        max_resent as f64 / MIB as f64,
        log.join("\n")
    );
}
