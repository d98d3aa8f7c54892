//! A repository someone else can write to (a NAS share, a USB disk, a push
//! target), tampered with as an attacker would, and every command run
//! against it: each must end with a clean error (or do its work right),
//! touch nothing outside the repository and the restore target, and
//! delete nothing a kept entry needs. The repository is made by a real
//! `backup run` of the kernel-made fixture; the stream a forged partial
//! file is measured against is the kernel's own.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use btrsend::stream_format::{Command as Cmd, ReaderOptions, StreamReader, StreamWriter};
use serde_json::Value;

use crate::common::{self, fixture_dir, unpack};

const FIX: &str = "014-incremental";

/// `btrsend` with both outputs piped (for [`run`]).
fn btrsend() -> Command {
    let mut c = common::btrsend();
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Run `c`, killed after a minute: a command that hangs on hostile input
/// fails the test instead of hanging it.
fn run(c: &mut Command) -> Output {
    let mut child = c.spawn().expect("run btrsend");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let e = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{c:?} still runs after a minute (it hangs on the tampered repository)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: o.join().unwrap(),
        stderr: e.join().unwrap(),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A repository made by `backup run` of the fixture, with a victim
/// directory and a restore target (holding a canary) beside it.
struct Site {
    dir: tempfile::TempDir,
    img: PathBuf,
    /// Run btrsend under this umask (through `sh`).
    umask: Option<&'static str>,
}

impl Site {
    /// `snaps`: the snapshots the first run stores.
    fn new(snaps: &[&str]) -> Site {
        Site::with_umask(snaps, None)
    }

    fn with_umask(snaps: &[&str], umask: Option<&'static str>) -> Site {
        let dir = tempfile::tempdir().unwrap();
        let img = unpack(dir.path(), FIX, "dev1.img");
        let s = Site { dir, img, umask };
        fs::create_dir(s.victim()).unwrap();
        fs::write(s.victim().join("precious"), b"the host's own file\n").unwrap();
        fs::write(s.victim().join("passwd"), b"root:x:0:0::/root:/bin/sh\n").unwrap();
        fs::create_dir(s.to()).unwrap();
        fs::write(s.to().join("canary"), b"was here before\n").unwrap();
        s.ok(&["init", "--repo", s.repo_str(), "--encryption", "none"]);
        if !snaps.is_empty() {
            s.store(snaps);
        }
        s
    }

    fn repo(&self) -> PathBuf {
        self.dir.path().join("repo")
    }

    fn repo_str(&self) -> &str {
        // OK to unwrap: a tempdir path is UTF-8 here.
        Box::leak(self.repo().to_str().unwrap().to_owned().into_boxed_str())
    }

    fn victim(&self) -> PathBuf {
        self.dir.path().join("victim")
    }

    fn to(&self) -> PathBuf {
        self.dir.path().join("to")
    }

    fn backup(&self, args: &[&str]) -> Output {
        match self.umask {
            None => run(btrsend().arg("backup").args(args)),
            Some(m) => {
                let b = btrsend();
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("umask {m}; exec \"$0\" \"$@\""))
                    .arg(b.get_program())
                    .arg("backup")
                    .args(args)
                    .env("TZ", "UTC")
                    .env_remove("BTRSEND_REPOSITORY")
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                run(&mut c)
            }
        }
    }

    fn ok(&self, args: &[&str]) -> Output {
        let o = self.backup(args);
        assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
        o
    }

    fn store(&self, snaps: &[&str]) {
        self.store_with(snaps, &[]);
    }

    fn store_with(&self, snaps: &[&str], extra: &[&str]) {
        let img = self.img.to_str().unwrap();
        let mut a = vec!["run", "--repo", self.repo_str(), "--device", img];
        a.extend_from_slice(&["--frame-bytes", "4096"]);
        a.extend_from_slice(extra);
        a.extend_from_slice(snaps);
        self.ok(&a);
    }

    fn entries(&self) -> Vec<Value> {
        let o = self.ok(&["list", "--repo", self.repo_str(), "--json"]);
        serde_json::from_slice::<Value>(&o.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    /// The newest catalog generation's file.
    fn catalog_file(&self) -> PathBuf {
        let mut c: Vec<PathBuf> = fs::read_dir(self.repo().join("catalog"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        c.sort();
        c.pop().unwrap()
    }

    fn catalog(&self) -> Value {
        serde_json::from_slice(&fs::read(self.catalog_file()).unwrap()).unwrap()
    }

    /// Replace the newest catalog generation by `cat` (as an attacker
    /// with write access does).
    fn put_catalog(&self, cat: &Value) {
        fs::write(self.catalog_file(), serde_json::to_vec_pretty(cat).unwrap()).unwrap();
    }

    /// Everything outside the repository that a command could harm: each
    /// file's path, mode, link count and content.
    fn outside(&self) -> BTreeMap<PathBuf, (u32, u64, Vec<u8>)> {
        let mut m = BTreeMap::new();
        for d in [self.victim(), self.to()] {
            walk(&d, &mut m);
        }
        m
    }

    /// Every command a cron job or an admin runs, against the repository
    /// as it is now; the outcomes by command.
    fn every_command(&self, spec: &str) -> Vec<(String, Output)> {
        let repo = self.repo_str();
        let img = self.img.to_str().unwrap();
        let to = self.to().join("r");
        let to = to.to_str().unwrap();
        let cmds: Vec<Vec<&str>> = vec![
            vec!["list", "--repo", repo],
            vec!["list", "--repo", repo, "--json"],
            vec!["verify", "--repo", repo],
            vec!["verify", "--repo", repo, "--read-data"],
            vec!["restore", "--repo", repo, spec, "--to", to],
            vec!["restore", "--repo", repo, spec, "--stdout"],
            vec!["forget", "--repo", repo, "--keep-last", "1", "--dry-run"],
            vec!["forget", "--repo", repo, "--keep-last", "1"],
            vec!["run", "--repo", repo, "--device", img, "snaps/s3"],
        ];
        let mut out = Vec::new();
        for c in cmds {
            let o = self.backup(&c);
            let name = c
                .iter()
                .filter(|a| **a != repo)
                .cloned()
                .collect::<Vec<_>>()
                .join(" ");
            let err = text(&o.stderr);
            assert!(
                !err.contains("panicked") && o.status.code() != Some(101),
                "{name}: {err}"
            );
            assert!(
                o.status.success()
                    || err.contains("btrsend: error:")
                    || err.contains("btrsend: damage:"),
                "{name}: exit {:?} without an error line: {err}",
                o.status.code()
            );
            out.push((name, o));
        }
        out
    }
}

fn walk(d: &Path, m: &mut BTreeMap<PathBuf, (u32, u64, Vec<u8>)>) {
    let Ok(rd) = fs::read_dir(d) else { return };
    for e in rd {
        let p = e.unwrap().path();
        let md = fs::symlink_metadata(&p).unwrap();
        if md.is_dir() {
            m.insert(p.clone(), (md.permissions().mode(), md.nlink(), Vec::new()));
            walk(&p, m);
        } else if md.is_file() {
            m.insert(
                p.clone(),
                (md.permissions().mode(), md.nlink(), fs::read(&p).unwrap()),
            );
        } else {
            m.insert(p.clone(), (md.permissions().mode(), md.nlink(), Vec::new()));
        }
    }
}

/// The stream files the catalog names now.
fn files(cat: &Value) -> Vec<String> {
    cat["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["file"].as_str().unwrap().to_owned())
        .collect()
}

/// Assert that every command refuses the repository, that nothing
/// outside it changed, and that every stream file `keep` names is there.
fn all_refused(site: &Site, spec: &str, keep: &[String], why: &str) {
    let before = site.outside();
    for (name, o) in site.every_command(spec) {
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{name} accepted it: {err}");
        assert!(err.contains(why), "{name}: {err}");
    }
    assert_eq!(
        site.outside(),
        before,
        "something outside the repository changed"
    );
    for f in keep {
        assert!(site.repo().join(f).is_file(), "{f} was deleted");
    }
}

#[test]
fn catalog_keys_that_reach_outside_are_refused() {
    let site = Site::new(&["snaps/s1", "snaps/s2"]);
    let cat = site.catalog();
    let keep = files(&cat);
    let victim = site.victim().join("precious");
    let cases = [
        "../victim/precious",
        victim.to_str().unwrap(),
        "streams/../config",
        "streams/../../victim/precious",
        "config",
    ];
    for bad in cases {
        let mut c = cat.clone();
        c["entries"][1]["file"] = bad.into();
        site.put_catalog(&c);
        all_refused(&site, "snaps/s2", &keep, "entry 2: ");
        assert!(victim.is_file(), "{bad}: the victim was deleted");
        assert!(
            site.repo().join("config").is_file(),
            "{bad}: the config was deleted"
        );
    }
    site.put_catalog(&cat);
    site.ok(&["verify", "--repo", site.repo_str(), "--read-data"]);
}

#[test]
fn a_symlinked_or_linked_lock_file_is_never_written_through() {
    let site = Site::new(&["snaps/s1"]);
    let lock = site.repo().join("lock");
    let target = site.victim().join("passwd");
    let dangling = site.victim().join("created-by-nobody");
    let img = site.img.to_str().unwrap();
    let repo = site.repo_str();
    let cmds: [&[&str]; 4] = [
        &["verify", "--repo", repo, "--read-data"],
        &["run", "--repo", repo, "--device", img, "snaps/s2"],
        &["forget", "--repo", repo, "--keep-last", "1"],
        &["restore", "--repo", repo, "--stdout", "snaps/s1"],
    ];
    // The readers that take no lock never open the lock file: they work.
    let lock_free: [&[&str]; 3] = [
        &["list", "--repo", repo],
        &["verify", "--repo", repo],
        &["forget", "--repo", repo, "--keep-last", "1", "--dry-run"],
    ];
    // A symlink to a file, a dangling one, and a hard link (same
    // filesystem): each refused, the file elsewhere untouched, the
    // dangling target never made.
    for (kind, why) in [
        ("symlink", "symbolic link"),
        ("dangling", "symbolic link"),
        ("hardlink", "hard links"),
    ] {
        fs::remove_file(&lock).unwrap();
        match kind {
            "symlink" => std::os::unix::fs::symlink(&target, &lock).unwrap(),
            "dangling" => std::os::unix::fs::symlink(&dangling, &lock).unwrap(),
            _ => fs::hard_link(&target, &lock).unwrap(),
        }
        let before = site.outside();
        for c in cmds {
            let o = site.backup(c);
            let err = text(&o.stderr);
            assert!(!o.status.success(), "{kind} {c:?}: accepted");
            assert!(
                err.contains("lock file") && err.contains(why),
                "{kind} {c:?}: {err}"
            );
        }
        for c in lock_free {
            site.ok(c);
        }
        assert_eq!(site.outside(), before, "{kind}: something outside changed");
        assert!(!dangling.exists(), "the dangling lock's target was made");
    }
    // A FIFO as the lock is refused too, and never waited on.
    fs::remove_file(&lock).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &lock,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let o = site.backup(&["verify", "--repo", repo, "--read-data"]);
    assert!(!o.status.success() && text(&o.stderr).contains("not a regular file"));
    fs::remove_file(&lock).unwrap();
    site.ok(&["verify", "--repo", repo, "--read-data"]);
    assert!(lock.is_file(), "a missing lock file is made again");
    assert_eq!(
        fs::metadata(&lock).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[test]
fn a_wrong_parent_link_is_found_and_deletes_nothing() {
    // Entries: s1 full, s2 from s1, s3 from s2. The attacker relinks s3
    // to s1 (consistently in the catalog), so that `forget --keep-last 1`
    // would keep s1 and s3 and delete s2, the real parent of s3.
    let site = Site::new(&["snaps/s1", "snaps/s2", "snaps/s3"]);
    let cat = site.catalog();
    let keep = files(&cat);
    let mut c = cat.clone();
    let (id1, uuid1, ct1) = (
        c["entries"][0]["id"].clone(),
        c["entries"][0]["uuid"].clone(),
        c["entries"][0]["ctransid"].clone(),
    );
    c["entries"][2]["parent_id"] = id1;
    c["entries"][2]["parent_uuid"] = uuid1;
    c["entries"][2]["parent_ctransid"] = ct1;
    site.put_catalog(&c);
    let id3 = c["entries"][2]["id"].as_u64().unwrap();
    let before = site.outside();
    let o = site.backup(&["verify", "--repo", site.repo_str()]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(12), "{err}");
    assert!(err.contains(&format!("entry {id3}")), "{err}");
    let o = site.backup(&["forget", "--repo", site.repo_str(), "--keep-last", "1"]);
    let err = text(&o.stderr);
    assert!(!o.status.success(), "forget accepted it: {err}");
    assert!(
        err.contains("not deleting anything") && err.contains(&format!("entry {id3}")),
        "{err}"
    );
    for f in &keep {
        assert!(site.repo().join(f).is_file(), "{f} was deleted");
    }
    assert_eq!(site.catalog(), c, "the catalog was changed");
    // The same relink without the parent's uuid: the catalog itself is
    // refused by every command.
    let mut c = cat.clone();
    c["entries"][2]["parent_id"] = cat["entries"][0]["id"].clone();
    site.put_catalog(&c);
    all_refused(&site, "snaps/s3", &keep, "but its parent entry");
    assert_eq!(site.outside(), before);
}

#[test]
fn a_stream_file_that_is_a_fifo_is_refused_not_waited_on() {
    let site = Site::new(&["snaps/s1", "snaps/s2"]);
    let cat = site.catalog();
    let f = site
        .repo()
        .join(cat["entries"][1]["file"].as_str().unwrap());
    fs::remove_file(&f).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &f,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let before = site.outside();
    let repo = site.repo_str();
    let to = site.to().join("r");
    for c in [
        vec!["restore", "--repo", repo, "snaps/s2", "--stdout"],
        vec![
            "restore",
            "--repo",
            repo,
            "snaps/s2",
            "--to",
            to.to_str().unwrap(),
        ],
        vec!["verify", "--repo", repo, "--read-data"],
    ] {
        let o = site.backup(&c);
        assert!(!o.status.success(), "{c:?}: {}", text(&o.stderr));
        // verify lists only regular files as objects: the FIFO is missing.
        let err = text(&o.stderr);
        assert!(
            err.contains("not a regular file") || err.contains("the stream file is missing"),
            "{c:?}: {err}"
        );
    }
    assert_eq!(site.outside(), before);
    assert!(!to.exists(), "the restore left {}", to.display());
}

#[test]
fn catalog_counters_at_their_end_never_write_what_cannot_be_read() {
    // Two full streams: forget --keep-last 1 has one to delete.
    let site = Site::new(&[]);
    site.store_with(&["snaps/s1", "snaps/s2"], &["--full-every", "1"]);
    let cat = site.catalog();
    let keep = files(&cat);
    // The last generation a key can hold: readable, but forget and run
    // cannot store a next one, and delete nothing.
    let mut c = cat.clone();
    c["generation"] = 9_999_999_999_999_999u64.into();
    fs::remove_file(site.catalog_file()).unwrap();
    fs::write(
        site.repo().join("catalog/9999999999999999.json"),
        serde_json::to_vec(&c).unwrap(),
    )
    .unwrap();
    assert_eq!(site.entries().len(), 2);
    for args in [
        vec!["forget", "--repo", site.repo_str(), "--keep-last", "1"],
        vec![
            "run",
            "--repo",
            site.repo_str(),
            "--device",
            site.img.to_str().unwrap(),
            "snaps/s3",
        ],
    ] {
        let o = site.backup(&args);
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{args:?}: {err}");
        assert!(
            err.contains("refusing to store generation"),
            "{args:?}: {err}"
        );
        assert_eq!(site.entries().len(), 2, "{args:?}");
        for f in &keep {
            assert!(site.repo().join(f).is_file(), "{args:?}: {f} was deleted");
        }
    }
    // next_id with no room after it: refused at load.
    let mut c = cat.clone();
    c["generation"] = 9_999_999_999_999_999u64.into();
    c["next_id"] = u64::MAX.into();
    site.put_catalog(&c);
    all_refused(&site, "snaps/s2", &keep, "next_id");
}

#[test]
fn control_characters_from_the_catalog_reach_no_terminal() {
    let site = Site::new(&["snaps/s1"]);
    let mut c = site.catalog();
    c["entries"][0]["path"] = "snaps/\u{1b}]0;owned\u{7}\u{1b}[2J".into();
    c["entries"][0]["time"] = "2026-11-20T01:00:00Z\u{1b}[31m".into();
    site.put_catalog(&c);
    let o = site.ok(&["list", "--repo", site.repo_str()]);
    let out = text(&o.stdout);
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{out:?}");
    assert!(out.contains("snaps/\\x1b]0;owned\\x07\\x1b[2J"), "{out}");
    // JSON keeps the exact string, escaped by JSON itself.
    let o = site.ok(&["list", "--repo", site.repo_str(), "--json"]);
    assert!(!text(&o.stdout).contains('\u{1b}'));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["path"], "snaps/\u{1b}]0;owned\u{7}\u{1b}[2J");
    // An error that names it.
    let o = site.backup(&[
        "restore",
        "--repo",
        site.repo_str(),
        "nothing\u{1b}[2J",
        "--stdout",
    ]);
    assert!(!o.status.success());
    assert!(!text(&o.stderr).contains('\u{1b}'), "{}", text(&o.stderr));
}

#[test]
fn a_failed_restore_leaves_the_target_as_it_was() {
    // The chain's second stream is swapped for a third's (valid frames,
    // the wrong stream): the receiver fails on it after the first stream
    // made its subvolume, which must go again.
    let site = Site::new(&["snaps/s1", "snaps/s2", "snaps/s3"]);
    let cat = site.catalog();
    let before = site.outside();
    let to = site.to();
    let mut c = cat.clone();
    // s2's entry names s3's stream: trailer and identity differ, so the
    // restore refuses before receiving anything; then with a stream whose
    // identity is right but whose commands the receiver refuses.
    c["entries"][1]["file"] = cat["entries"][2]["file"].clone();
    c["entries"].as_array_mut().unwrap().truncate(2);
    site.put_catalog(&c);
    let o = site.backup(&[
        "restore",
        "--repo",
        site.repo_str(),
        "snaps/s2",
        "--to",
        to.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert_eq!(site.outside(), before, "{}", text(&o.stderr));
    site.put_catalog(&cat);
    // A target that already holds s2's name: the receive of s2 fails
    // after s1 was received, and s1 goes again.
    fs::create_dir(to.join("s2")).unwrap();
    fs::write(to.join("s2/mine"), b"the user's\n").unwrap();
    let before = site.outside();
    let o = site.backup(&[
        "restore",
        "--repo",
        site.repo_str(),
        "snaps/s2",
        "--to",
        to.to_str().unwrap(),
    ]);
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert_eq!(site.outside(), before, "{err}");
    assert!(!to.join("s1").exists(), "{err}");
}

/// The partial stream file of a run killed part way, forged: the kernel's
/// own incremental stream of s3 with one byte of file data changed (its
/// command CRC recomputed: every check of the file itself passes, and the
/// commands have the very shape of the real ones).
fn forged_partial(site: &Site) -> (PathBuf, Vec<u8>) {
    let kernel = zstd::decode_all(
        fs::File::open(fixture_dir(FIX).join("s2--s3.inc.v1.stream.zst")).unwrap(),
    )
    .unwrap();
    let mut reader =
        StreamReader::with_options(&kernel[..], ReaderOptions::new().with_max_version(3));
    let mut raw = Vec::new();
    let mut w = StreamWriter::new(&mut raw, 1).unwrap();
    let mut frames = Vec::new();
    let mut ident = None;
    let mut forged = false;
    let mut n = 0;
    while let Some((_, cmd)) = reader.next_command().unwrap() {
        if matches!(cmd, Cmd::End) {
            break;
        }
        let cmd = match cmd {
            Cmd::Snapshot { uuid, ctransid, .. } => {
                ident = Some((uuid, ctransid));
                cmd
            }
            Cmd::Write { path, offset, data } if !forged && !data.is_empty() => {
                forged = true;
                let mut d = data.to_vec();
                d[0] ^= 0xff;
                w.write(&Cmd::Write {
                    path,
                    offset,
                    data: d.into(),
                })
                .unwrap();
                n += 1;
                continue;
            }
            c => c,
        };
        w.write(&cmd).unwrap();
        n += 1;
        // A frame every 8 commands, whole commands each.
        if n % 8 == 0 {
            frames.push(w.get_ref().len());
        }
    }
    assert!(forged, "the kernel's stream has a WRITE");
    drop(w);
    // Keep the first 3/4 of the frames: a partial file, cut at a frame.
    let cut = frames[frames.len() * 3 / 4];
    let mut file = Vec::new();
    let mut at = 0;
    for &end in frames.iter().filter(|&&e| e <= cut) {
        file.extend(zstd::bulk::compress(&raw[at..end], 3).unwrap());
        at = end;
    }
    let (uuid, ctransid) = ident.unwrap();
    let uuid = uuid_text(&uuid);
    let tmp = site.repo().join("tmp");
    fs::create_dir_all(&tmp).unwrap();
    let name = tmp.join(format!(
        "{uuid}-{ctransid}-0badf00d.btrs.zst.1.00000000deadbeef"
    ));
    fs::write(&name, &file).unwrap();
    (name, kernel)
}

fn uuid_text(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[test]
fn a_planted_partial_is_not_continued() {
    let site = Site::new(&["snaps/s1", "snaps/s2"]);
    let (planted, kernel) = forged_partial(&site);
    let img = site.img.to_str().unwrap();
    let o = site.ok(&[
        "run",
        "--repo",
        site.repo_str(),
        "--device",
        img,
        "--json",
        "snaps/s3",
    ]);
    let lines: Vec<Value> = text(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines.iter().any(|l| l["notice"]
            .as_str()
            .is_some_and(|n| n.contains("not continuing")
                && n.contains("its bytes are not what this send makes"))),
        "{lines:?}"
    );
    let stored = lines
        .iter()
        .find(|l| l["message_type"] == "stored")
        .unwrap();
    assert_eq!(stored["resumed_from_bytes"], 0, "{stored}");
    assert!(!planted.exists(), "the planted file stays");
    // What is stored is the kernel's stream, byte for byte.
    let e = site.entries().pop().unwrap();
    assert_eq!(e["kind"], "incremental");
    let want = blake3::hash(&kernel).to_hex().to_string();
    assert_eq!(e["stream_blake3"].as_str(), Some(want.as_str()));
    site.ok(&["verify", "--repo", site.repo_str(), "--read-data"]);
}

#[test]
fn repository_files_are_the_owners_alone() {
    // Whatever the umask: a permissive one here.
    let site = Site::with_umask(&["snaps/s1", "snaps/s2"], Some("000"));
    let mut m = BTreeMap::new();
    walk(&site.repo(), &mut m);
    let root = fs::metadata(site.repo()).unwrap().permissions().mode() & 0o777;
    assert_eq!(root, 0o700);
    for (p, (mode, _, _)) in &m {
        let want = if p.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode & 0o777, want, "{}", p.display());
    }
    // A repository others can read is named by verify.
    fs::set_permissions(site.repo(), fs::Permissions::from_mode(0o755)).unwrap();
    let o = site.ok(&["verify", "--repo", site.repo_str()]);
    assert!(
        text(&o.stderr).contains("others than its owner may read"),
        "{}",
        text(&o.stderr)
    );
}
