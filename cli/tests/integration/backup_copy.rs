//! `backup copy` and `backup verify --compare` (issue 35), on the
//! kernel-made `014-incremental` image: what a copy stores is judged by
//! the kernel's own streams (`restore --stdout` of the copied chain must be
//! `btrfs send`'s bytes), between a directory and the S3 test server both
//! ways, encrypted with different keys (a passphrase, age recipients made
//! by the real `age-keygen`) and not at all; a second copy does nothing,
//! one killed with SIGKILL is continued (into a directory and into S3);
//! compare agrees on copies and finds a tampered catalog.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::{btrsend, fixture_dir, json_lines, ok, stderr, unpack};
use crate::repo_store::{Backend, Kind};

const FIX: &str = "014-incremental";

fn kernel(name: &str) -> Vec<u8> {
    let f = fs::File::open(fixture_dir(FIX).join(format!("{name}.stream.zst"))).unwrap();
    zstd::decode_all(f).unwrap()
}

/// The kernel's chain of `snaps/s3` (what restore must give), or of
/// `snaps/s2` with `upto_s2`.
fn kernel_chain(upto_s2: bool) -> Vec<u8> {
    let mut v = kernel("s1.full.v1");
    v.extend(kernel("s1--s2.inc.v1"));
    if !upto_s2 {
        v.extend(kernel("s2--s3.inc.v1"));
    }
    v
}

struct Env {
    dir: tempfile::TempDir,
    img: PathBuf,
    /// The S3 server, when a test uses one.
    be: Backend,
    home: PathBuf,
}

impl Env {
    fn new(kind: Kind, test: &str) -> Option<Env> {
        let dir = tempfile::tempdir().unwrap();
        let img = unpack(dir.path(), FIX, "dev1.img");
        let be = Backend::new(kind, test, dir.path())?;
        let home = dir.path().join("home");
        fs::create_dir(&home).unwrap();
        Some(Env { dir, img, be, home })
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = btrsend();
        self.be.apply(&mut c);
        c.env("HOME", &self.home)
            .env_remove("XDG_CONFIG_HOME")
            .env("BTRSEND_SCRYPT_LOG_N", "10");
        for v in [
            "BTRSEND_PASSWORD",
            "BTRSEND_PASSWORD_FILE",
            "BTRSEND_IDENTITY_FILE",
            "BTRSEND_WRITE_KEY_FILE",
            "BTRSEND_FROM_PASSWORD",
            "BTRSEND_FROM_PASSWORD_FILE",
            "BTRSEND_FROM_IDENTITY_FILE",
            "BTRSEND_FROM_WRITE_KEY_FILE",
        ] {
            c.env_remove(v);
        }
        c.arg("backup").args(args);
        c
    }

    fn backup(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    fn run_all(&self, repo: &str, keys: &[&str]) {
        let mut a = vec![
            "run",
            "--repo",
            repo,
            "--device",
            self.img.to_str().unwrap(),
        ];
        a.extend_from_slice(keys);
        a.push("snaps/s*");
        ok(&self.backup(&a));
    }

    fn restore(&self, repo: &str, keys: &[&str], snap: &str) -> Vec<u8> {
        let mut a = vec!["restore", "--repo", repo, "--stdout"];
        a.extend_from_slice(keys);
        a.push(snap);
        let out = self.backup(&a);
        assert!(out.status.success(), "{}", stderr(&out));
        out.stdout
    }

    fn list(&self, repo: &str, keys: &[&str]) -> Vec<serde_json::Value> {
        let mut a = vec!["list", "--repo", repo, "--json"];
        a.extend_from_slice(keys);
        let v: serde_json::Value = serde_json::from_str(&ok(&self.backup(&a))).unwrap();
        v.as_array().unwrap().clone()
    }
}

/// The summary line of a `copy --json`.
fn summary(out: &Output) -> serde_json::Value {
    let lines = json_lines(&ok(out));
    let last = lines.last().unwrap().clone();
    assert_eq!(last["message_type"], "summary", "{lines:?}");
    last
}

/// The newest catalog generation of a directory repository.
fn newest_catalog(repo: &Path) -> PathBuf {
    let mut v: Vec<PathBuf> = fs::read_dir(repo.join("catalog"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v.pop().unwrap()
}

fn cp_r(from: &str, to: &str) {
    let st = Command::new("cp").args(["-a", from, to]).status().unwrap();
    assert!(st.success());
}

#[test]
fn compare_agrees_on_shared_entries_and_finds_tampering() {
    let env = Env::new(Kind::Dir, "compare").unwrap();
    let (r1, r2) = (env.path("r1"), env.path("r2"));
    for r in [&r1, &r2] {
        ok(&env.backup(&["init", "--repo", r, "--encryption", "none"]));
    }
    env.run_all(&r1, &[]);
    // R2 made by its own run of s1 from the same source: deterministic
    // streams, the same record.
    ok(&env.backup(&[
        "run",
        "--repo",
        &r2,
        "--device",
        env.img.to_str().unwrap(),
        "snaps/s1",
    ]));
    let out = env.backup(&["verify", "--compare", &r1, &r2]);
    let text = ok(&out);
    assert!(
        text.contains(
            "agree on the 1 stored snapshots they share (2 only in the first, 0 only in the second"
        ),
        "{text}"
    );
    assert!(
        text.contains("only in ") && text.contains("snaps/s2"),
        "{text}"
    );
    let out = env.backup(&["verify", "--compare", &r1, &r2, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
    assert_eq!(v["agree"], true);
    assert_eq!(v["shared"], 1);
    assert_eq!(v["only_in_first"].as_array().unwrap().len(), 2);

    // A copy of R1 whose catalog drops entry 3: agreement, one entry only
    // in R1.
    let r3 = env.path("r3");
    cp_r(&r1, &r3);
    let cat = newest_catalog(Path::new(&r3));
    let mut json: serde_json::Value = serde_json::from_slice(&fs::read(&cat).unwrap()).unwrap();
    json["entries"].as_array_mut().unwrap().pop();
    fs::write(&cat, serde_json::to_vec(&json).unwrap()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&ok(&env.backup(&[
        "verify",
        "--compare",
        &r1,
        &r3,
        "--json",
    ])))
    .unwrap();
    assert_eq!(v["agree"], true);
    assert_eq!(v["shared"], 2);
    assert_eq!(v["only_in_first"][0]["path"], "snaps/s3");

    // A tampered hash and size: damage, exit 12, named.
    let r4 = env.path("r4");
    cp_r(&r1, &r4);
    let cat = newest_catalog(Path::new(&r4));
    let mut json: serde_json::Value = serde_json::from_slice(&fs::read(&cat).unwrap()).unwrap();
    let e = &mut json["entries"][1];
    let hash = e["stream_blake3"].as_str().unwrap().to_owned();
    let forged = format!(
        "{}{}",
        if hash.starts_with('0') { "1" } else { "0" },
        &hash[1..]
    );
    e["stream_blake3"] = forged.clone().into();
    fs::write(&cat, serde_json::to_vec(&json).unwrap()).unwrap();
    let out = env.backup(&["verify", "--compare", &r1, &r4]);
    assert_eq!(out.status.code(), Some(12), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("btrsend: damage: entry 2 (snaps/s2, ")
            && err.contains(&format!("stream_blake3: \"{hash}\" ≠ \"{forged}\"")),
        "{err}"
    );
    assert!(
        err.contains("disagree on 1 of the 3 stored snapshots they share"),
        "{err}"
    );
    let out = env.backup(&["verify", "--compare", &r1, &r4, "--json"]);
    assert_eq!(out.status.code(), Some(12));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["agree"], false);
    assert_eq!(v["disagree"][0]["first"]["id"], 2);

    // A catalog that is not JSON: an error naming it, not a panic.
    let r5 = env.path("r5");
    cp_r(&r1, &r5);
    fs::write(newest_catalog(Path::new(&r5)), b"{\"format\":").unwrap();
    let out = env.backup(&["verify", "--compare", &r1, &r5]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("unreadable JSON"), "{}", stderr(&out));
}

/// Directory (passphrase) to S3 (age recipients) and back to a plain
/// directory: every copy restores to the kernel's bytes.
#[test]
fn copy_between_a_directory_and_s3_with_different_keys() {
    const TEST: &str = "copy_between_a_directory_and_s3_with_different_keys";
    if Command::new("age-keygen")
        .arg("--version")
        .output()
        .is_err()
    {
        btrsend::testing::skip_or_fail(TEST, "needs age-keygen (apt-get install age)");
        return;
    }
    let Some(env) = Env::new(Kind::S3, TEST) else {
        return;
    };
    let pw = env.dir.path().join("pw");
    fs::write(&pw, "first secret\n").unwrap();
    let pw = pw.to_str().unwrap();
    let (id, recipient) = crate::common::keygen(env.dir.path(), "id.txt");
    let id = id.to_str().unwrap();
    let r1 = env.path("r1");
    let r2 = env.be.repo("r2").spec;
    let r3 = env.path("r3");
    ok(&env.backup(&[
        "init",
        "--repo",
        &r1,
        "--encryption",
        "passphrase",
        "--password-file",
        pw,
    ]));
    ok(&env.backup(&[
        "init",
        "--repo",
        &r2,
        "--encryption",
        "recipients",
        "--recipient",
        &recipient,
    ]));
    ok(&env.backup(&["init", "--repo", &r3, "--encryption", "none"]));
    env.run_all(&r1, &["--password-file", pw]);

    // Dir → S3: R1's passphrase, R2's write key (found under HOME).
    let copy = [
        "copy",
        "--from",
        &r1,
        "--to",
        &r2,
        "--from-password-file",
        pw,
        "--json",
    ];
    let out = env.backup(&copy);
    let s = summary(&out);
    assert_eq!(
        (s["copied"].as_u64(), s["failed"].as_u64()),
        (Some(3), Some(0)),
        "{s}"
    );
    assert_eq!(
        s["stream_bytes"].as_u64(),
        Some(kernel_chain(false).len() as u64)
    );
    assert_eq!(
        env.restore(&r2, &["--identity", id], "snaps/s3"),
        kernel_chain(false)
    );
    // The write key reads R2's catalog: enough to compare.
    let v: serde_json::Value = serde_json::from_str(&ok(&env.backup(&[
        "verify",
        "--compare",
        &r1,
        &r2,
        "--from-password-file",
        pw,
        "--json",
    ])))
    .unwrap();
    assert_eq!(
        (v["agree"].as_bool(), v["shared"].as_u64()),
        (Some(true), Some(3)),
        "{v}"
    );
    // R1's passphrase is not R2's: without --from-*, R1 does not open.
    let out = env.backup(&["copy", "--from", &r1, "--to", &r2, "--password-file", pw]);
    assert_eq!(out.status.code(), Some(13), "{}", stderr(&out));
    // A second copy does nothing.
    let before = env.list(&r2, &[]);
    let s = summary(&env.backup(&copy));
    assert_eq!(
        (s["copied"].as_u64(), s["already_present"].as_u64()),
        (Some(0), Some(3)),
        "{s}"
    );
    assert_eq!(env.list(&r2, &[]), before);

    // S3 → dir: R2 read with its identity; first s2's chain alone.
    let out = env.backup(&[
        "copy",
        "--from",
        &r2,
        "--to",
        &r3,
        "--from-identity",
        id,
        "--json",
        "snaps/s2",
    ]);
    let s = summary(&out);
    assert_eq!(s["copied"].as_u64(), Some(2), "{s}");
    assert_eq!(env.restore(&r3, &[], "snaps/s2"), kernel_chain(true));
    let out = env.backup(&[
        "copy",
        "--from",
        &r2,
        "--to",
        &r3,
        "--from-identity",
        id,
        "--json",
    ]);
    let s = summary(&out);
    assert_eq!(
        (s["copied"].as_u64(), s["already_present"].as_u64()),
        (Some(1), Some(2)),
        "{s}"
    );
    assert_eq!(env.restore(&r3, &[], "snaps/s3"), kernel_chain(false));
    ok(&env.backup(&["verify", "--read-data", "--repo", &r3]));
    // The write key alone cannot read R2's streams: refused up front.
    let r4 = env.path("r4");
    ok(&env.backup(&["init", "--repo", &r4, "--encryption", "none"]));
    let out = env.backup(&["copy", "--from", &r2, "--to", &r4]);
    assert_eq!(out.status.code(), Some(13), "{}", stderr(&out));
    assert!(env.list(&r4, &[]).is_empty());
}

/// `backup copy --json ARGS…` killed with SIGKILL once it has written
/// `pause_at` bytes of stream and the files in `tmp` stopped growing (the
/// frames in flight written: the partial file of a directory, the
/// multipart upload's parts on the S3 server).
fn copy_killed(env: &Env, args: &[&str], pause_at: u64, tmp: &Path) {
    let mut child = env
        .cmd(&[&["copy", "--json"], args].concat())
        .env("BTRSEND_TEST_PAUSE_AT", pause_at.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "the copy ended without pausing"
        );
        if line.starts_with("btrsend: test: paused after ") {
            break;
        }
    }
    let mut last = u64::MAX;
    for _ in 0..25 {
        std::thread::sleep(Duration::from_millis(200));
        let now = tmp_size(tmp);
        if now == last {
            break;
        }
        last = now;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = stdout.join();
}

fn tmp_size(tmp: &Path) -> u64 {
    fs::read_dir(tmp)
        .map(|d| d.map(|e| e.unwrap().metadata().unwrap().len()).sum())
        .unwrap_or(0)
}

/// A copy killed between two entries: the next one keeps what the first
/// listed and copies the rest.
#[test]
fn an_interrupted_copy_keeps_the_entries_it_copied() {
    let env = Env::new(Kind::Dir, "copy_interrupted").unwrap();
    let (r1, r2) = (env.path("r1"), env.path("r2"));
    for r in [&r1, &r2] {
        ok(&env.backup(&["init", "--repo", r, "--encryption", "none"]));
    }
    env.run_all(&r1, &[]);
    // Past s1's 700934 bytes: in s2's stream.
    let tmp = Path::new(&r2).join("tmp");
    copy_killed(&env, &["--from", &r1, "--to", &r2], 750_000, &tmp);
    let listed: Vec<_> = env
        .list(&r2, &[])
        .iter()
        .map(|e| e["path"].clone())
        .collect();
    assert_eq!(listed, ["snaps/s1"]);
    let out = env.backup(&["copy", "--from", &r1, "--to", &r2, "--json"]);
    let s = summary(&out);
    assert_eq!(
        (s["copied"].as_u64(), s["already_present"].as_u64()),
        (Some(2), Some(1)),
        "{s}"
    );
    assert_eq!(env.restore(&r2, &[], "snaps/s3"), kernel_chain(false));
    ok(&env.backup(&["verify", "--read-data", "--repo", &r2]));
}

/// Live (root): a copy killed in the middle of a 6 MiB stream of random
/// data (so that the partial file holds frames: a directory store writes
/// through a 1 MiB buffer) continues it; the copy restores to the kernel's
/// own `btrfs send` of the snapshot.
#[test]
fn an_interrupted_copy_continues_its_stream() {
    interrupted_copy("an_interrupted_copy_continues_its_stream", Kind::Dir);
}

/// Live (root): the same into an S3 repository, killed in the middle of
/// a 40 MiB stream once some 8 MiB parts of its multipart upload are on
/// the server: the next copy continues the upload from those parts and
/// completes, leaves no upload open, and the
/// copy passes `verify --read-data`, agrees with R1 (`verify --compare`),
/// restores to the kernel's `btrfs send` bytes and, received, to the
/// source snapshot's manifest.
#[test]
fn an_interrupted_copy_into_s3_completes() {
    interrupted_copy("an_interrupted_copy_into_s3_completes", Kind::S3);
}

fn interrupted_copy(test: &str, kind: Kind) {
    use btrsend::manifest::{self, Options};
    if !btrsend::testing::require_live(test) {
        return;
    }
    let Some(env) = Env::new(kind, test) else {
        return;
    };
    let live =
        btrsend::testing::LiveBtrfs::with_options(512 << 20, &[], "").expect("scratch btrfs");
    let vol = live.path().join("vol");
    crate::common::sh(
        Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(&vol),
    );
    let size = if kind == Kind::S3 { 40 << 20 } else { 6 << 20 };
    let mut rng = btrsend::testing::workload::Rng::new(35);
    fs::write(vol.join("random"), rng.bytes(size, false)).unwrap();
    let snap = live.path().join("s1");
    crate::common::sh(
        Command::new("btrfs")
            .args(["subvolume", "snapshot", "-r"])
            .arg(&vol)
            .arg(&snap),
    );
    let kernel = crate::common::sh(Command::new("btrfs").arg("-q").arg("send").arg(&snap)).stdout;

    let r1 = env.path("r1");
    let r2 = env.be.repo("r2");
    for r in [&r1, &r2.spec] {
        ok(&env.backup(&["init", "--repo", r, "--encryption", "none"]));
    }
    ok(&env.backup(&["run", "--repo", &r1, snap.to_str().unwrap()]));
    // What grows while the copy writes: the partial file of a directory,
    // the parts in the S3 server's root (beside the bucket).
    let (tmp, pause_at) = match kind {
        Kind::S3 => (
            r2.files.parent().unwrap().parent().unwrap().to_path_buf(),
            24 << 20,
        ),
        _ => (r2.files.join("tmp"), 4 << 20),
    };
    let args = [
        "--from",
        r1.as_str(),
        "--to",
        r2.spec.as_str(),
        "--frame-bytes",
        "65536",
    ];
    copy_killed(&env, &args, pause_at, &tmp);
    assert!(
        env.list(&r2.spec, &[]).is_empty(),
        "nothing is listed halfway"
    );
    if kind == Kind::S3 {
        assert!(
            !env.be.upload_parts().is_empty(),
            "parts of the upload stay"
        );
    } else {
        assert!(tmp_size(&tmp) >= 1 << 20, "the partial stream file stays");
    }

    let out = env.backup(&[&["copy", "--json"], &args[..]].concat());
    let lines = json_lines(&ok(&out));
    let kept = lines
        .iter()
        .filter(|l| l["message_type"] == "status")
        .find_map(|l| l.get("resumed_from_bytes")?.as_u64());
    let kept = kept.unwrap_or_else(|| panic!("not continued: {lines:?}"));
    // A directory keeps what its 1 MiB buffer wrote, S3 the 8 MiB parts
    // stored before the kill.
    let least = if kind == Kind::S3 { 8 << 20 } else { 1 << 20 };
    assert!((least..=pause_at).contains(&kept), "{kept}");
    assert_eq!(
        env.be.upload_parts(),
        Vec::<String>::new(),
        "no upload left open"
    );
    assert_eq!(lines.last().unwrap()["copied"], 1);
    let path = env.list(&r2.spec, &[])[0]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(env.restore(&r2.spec, &[], &path), kernel);
    ok(&env.backup(&["verify", "--read-data", "--repo", &r2.spec]));
    ok(&env.backup(&["verify", "--compare", &r1, &r2.spec]));
    let to = live.path().join("restored");
    fs::create_dir(&to).unwrap();
    ok(&env.backup(&[
        "restore",
        "--repo",
        &r2.spec,
        "--to",
        to.to_str().unwrap(),
        &path,
    ]));
    let want = manifest::manifest(&snap, Options::default()).unwrap();
    let got = manifest::manifest(&to.join("s1"), Options::default()).unwrap();
    assert!(
        manifest::diff(&want, &got, 20).is_none(),
        "{}",
        manifest::diff(&want, &got, 20).unwrap_or_default()
    );
    // A third copy does nothing.
    let s = summary(&env.backup(&[&["copy", "--json"], &args[..]].concat()));
    assert_eq!(
        (s["copied"].as_u64(), s["already_present"].as_u64()),
        (Some(0), Some(1)),
        "{s}"
    );
}

/// A stream damaged in R1 is not copied, nor anything of its chain after
/// it: exit 12, R2 unchanged but for what came before.
#[test]
fn a_damaged_stream_is_not_copied() {
    let env = Env::new(Kind::Dir, "copy_damaged").unwrap();
    let (r1, r2) = (env.path("r1"), env.path("r2"));
    for r in [&r1, &r2] {
        ok(&env.backup(&["init", "--repo", r, "--encryption", "none"]));
    }
    env.run_all(&r1, &[]);
    let list = env.list(&r1, &[]);
    // Flip a byte in the middle of s2's stream file (a frame's payload).
    let f = Path::new(&r1).join(list[1]["file"].as_str().unwrap());
    let mut bytes = fs::read(&f).unwrap();
    let mid = bytes.len() / 3;
    bytes[mid] ^= 0x40;
    fs::write(&f, bytes).unwrap();
    let out = env.backup(&["copy", "--from", &r1, "--to", &r2, "--json"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let s = json_lines(&String::from_utf8_lossy(&out.stdout));
    let s = s.last().unwrap();
    assert_eq!(
        (s["copied"].as_u64(), s["failed"].as_u64()),
        (Some(1), Some(2)),
        "{s}"
    );
    let paths: Vec<_> = env
        .list(&r2, &[])
        .iter()
        .map(|e| e["path"].clone())
        .collect();
    assert_eq!(paths, ["snaps/s1"]);
    // Only s2's chain: its own failure's status.
    let (r3, _) = (env.path("r3"), ());
    ok(&env.backup(&["init", "--repo", &r3, "--encryption", "none"]));
    ok(&env.backup(&["copy", "--from", &r1, "--to", &r3, "snaps/s1"]));
    let out = env.backup(&["copy", "--from", &r1, "--to", &r3, "snaps/s2"]);
    assert_eq!(out.status.code(), Some(12), "{}", stderr(&out));
}

/// A synthetic full stream in one repository (issue 34) is another
/// stream of a snapshot the copy holds as the kernel's incremental one:
/// `verify --compare` lists it apart and agrees, and a copy goes on
/// with the entries based on it, which restore from the copy to the
/// kernel's bytes.
#[test]
fn copies_go_on_past_a_synthetic_full_stream() {
    let env = Env::new(Kind::Dir, "synthetic").unwrap();
    let (r1, r2) = (env.path("r1"), env.path("r2"));
    for r in [&r1, &r2] {
        ok(&env.backup(&["init", "--repo", r, "--encryption", "none"]));
    }
    let img = env.img.to_str().unwrap().to_owned();
    ok(&env.backup(&["run", "--repo", &r1, "--device", &img, "snaps/s[12]"]));
    ok(&env.backup(&["copy", "--from", &r1, "--to", &r2]));
    // s2 becomes a synthetic full stream in R1 only.
    ok(&env.backup(&["synthesize", "--repo", &r1, "snaps/s2"]));
    let s2 = env
        .list(&r1, &[])
        .into_iter()
        .find(|e| e["path"] == "snaps/s2")
        .unwrap();
    assert_eq!(
        (&s2["kind"], &s2["parent_id"]),
        (&"full".into(), &serde_json::Value::Null)
    );
    let out = env.backup(&["verify", "--compare", &r1, &r2]);
    let text = ok(&out);
    assert!(
        text.contains("another stream: entry 2 (snaps/s2")
            && text.contains("agree on the 2 stored snapshots they share"),
        "{text}"
    );
    let out = env.backup(&["verify", "--compare", &r1, &r2, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
    assert_eq!(v["agree"], true);
    assert_eq!(v["other_stream"][0]["first"]["id"], 2);
    // s3, incremental from s2, stored in R1 and copied on.
    ok(&env.backup(&["run", "--repo", &r1, "--device", &img, "snaps/s3"]));
    let out = env.backup(&["copy", "--from", &r1, "--to", &r2, "--json"]);
    let s = summary(&out);
    assert_eq!(s["copied"], 1, "{s}");
    ok(&env.backup(&["verify", "--repo", &r2, "--read-data"]));
    // R2's chain of s3 is the kernel's: s1, s1--s2, then the s2--s3 that
    // R1 stored from the same source.
    assert!(env.restore(&r2, &[], "snaps/s3") == kernel_chain(false));
    // R1's chain of s3 starts with the synthetic full stream of s2.
    let chain = env.restore(&r1, &[], "snaps/s3");
    assert!(chain.ends_with(&kernel("s2--s3.inc.v1")));
}
