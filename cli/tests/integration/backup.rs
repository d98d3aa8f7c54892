//! `btrsend backup` end to end on the kernel-made fixture images: what is
//! stored is judged by the kernel's own streams (`restore --stdout` must
//! equal `btrfs send` of the chain byte for byte) and manifests (`restore
//! --to` must reproduce the kernel mount's manifest), damage by what
//! `verify` and `restore` say, and exit codes as `--help` documents them.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common::stderr;
use crate::common::{btrsend, fixture_dir, unpack};
use crate::repo_store::{Backend, Kind, TestRepo};

const FIX: &str = "014-incremental";

/// Standard output of a command that must succeed.
fn ok_bytes(out: &Output) -> Vec<u8> {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout.clone()
}

fn ok(out: &Output) -> String {
    String::from_utf8(ok_bytes(out)).unwrap()
}

/// A test's fixture image and repository, in a directory or on an S3
/// server (the same test runs against both: see [`both`]).
struct Env {
    dir: tempfile::TempDir,
    img: PathBuf,
    be: Backend,
    repo: TestRepo,
}

impl Env {
    fn new(kind: Kind, test: &str) -> Option<Env> {
        let dir = tempfile::tempdir().unwrap();
        let img = unpack(dir.path(), FIX, "dev1.img");
        let be = Backend::new(kind, test, dir.path())?;
        let repo = be.repo("repo");
        Some(Env { dir, img, be, repo })
    }

    fn repo(&self) -> &str {
        &self.repo.spec
    }

    /// `btrsend`, pointed at the S3 server if there is one.
    fn cmd(&self) -> Command {
        let mut c = btrsend();
        self.be.apply(&mut c);
        c
    }

    fn backup(&self, args: &[&str]) -> Output {
        self.cmd()
            .arg("backup")
            .args(args)
            .output()
            .expect("run btrsend")
    }

    fn init(&self) {
        ok(&self.backup(&["init", "--repo", self.repo(), "--encryption", "none"]));
    }

    /// `backup run` of the fixture's snapshots with small frames (several
    /// per stream).
    fn run(&self, extra: &[&str]) -> Output {
        let img = self.img.to_str().unwrap();
        let mut args = vec!["run", "--repo", self.repo(), "--device", img];
        args.extend_from_slice(&["--frame-bytes", "4096"]);
        args.extend_from_slice(extra);
        self.backup(&args)
    }

    fn list(&self) -> Vec<serde_json::Value> {
        let out = ok(&self.backup(&["list", "--repo", self.repo(), "--json"]));
        serde_json::from_str::<serde_json::Value>(&out)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    /// Where an entry's stream file lies (as a file on the S3 server too).
    fn stream_file(&self, entry: &serde_json::Value) -> PathBuf {
        self.repo.files.join(entry["file"].as_str().unwrap())
    }
}

/// Three tests from one body: `NAME::dir`, `NAME::s3` and `NAME::ssh`.
macro_rules! both {
    ($name:ident, $body:expr) => {
        mod $name {
            use super::*;
            #[test]
            fn dir() {
                if let Some(env) = Env::new(Kind::Dir, concat!(stringify!($name), "::dir")) {
                    $body(env);
                }
            }
            #[test]
            fn s3() {
                if let Some(env) = Env::new(Kind::S3, concat!(stringify!($name), "::s3")) {
                    $body(env);
                }
            }
            #[test]
            fn ssh() {
                if let Some(env) = Env::new(Kind::Ssh, concat!(stringify!($name), "::ssh")) {
                    $body(env);
                }
            }
        }
    };
}

/// The kernel's stream `name` of the fixture, decompressed.
fn kernel_stream(name: &str) -> Vec<u8> {
    zstd::decode_all(fs::File::open(fixture_dir(FIX).join(name)).unwrap()).unwrap()
}

/// `uuid=… transid=…` of the first line of the kernel's dump.
fn kernel_uuid(dump: &str) -> (String, u64) {
    let text = fs::read_to_string(fixture_dir(FIX).join(dump)).unwrap();
    let line = text.lines().next().unwrap();
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap()
            .to_owned()
    };
    (field("uuid="), field("transid=").parse().unwrap())
}

/// The `parent_uuid` of a snapshot in the kernel's `btrfs subvolume list`.
fn kernel_parent_uuid(path: &str) -> String {
    let text = fs::read_to_string(fixture_dir(FIX).join("subvol-list.txt")).unwrap();
    let line = text
        .lines()
        .find(|l| l.ends_with(&format!(" path {path}")))
        .unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    let i = words.iter().position(|w| *w == "parent_uuid").unwrap();
    words[i + 1].to_owned()
}

/// The kernel manifest without hole maps: the fixture README explains
/// that even `btrfs receive` of these incrementals differs there (protocol
/// 1 writes punched holes as zeros).
pub(crate) fn kernel_manifest(snap: &str) -> String {
    let text = fs::read_to_string(fixture_dir(FIX).join(format!("{snap}.manifest"))).unwrap();
    text.lines()
        .map(|l| {
            l.split(' ')
                .filter(|w| !w.starts_with("data="))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn manifest(dir: &Path) -> String {
    let out = btrsend().arg("manifest").arg(dir).output().unwrap();
    ok(&out)
}

both!(
    chain_is_stored_as_the_kernel_sends_it_and_restores_to_its_manifests,
    chain_case
);
fn chain_case(env: Env) {
    env.init();
    let out = env.run(&["--json", "snaps/s*"]);
    let text = ok(&out);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = lines.last().unwrap();
    assert_eq!(last["message_type"], "summary", "{text}");
    assert_eq!(last["stored"], 3);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l["message_type"] == "stored")
            .count(),
        3
    );
    assert!(out.stderr.is_empty(), "{}", stderr(&out));

    // The catalog: uuids and ctransids as the kernel's streams carry them,
    // parents linked, oldest first.
    let list = env.list();
    assert_eq!(list.len(), 3);
    let expect = [
        ("snaps/s1", "s1.full.v1.dump", "full", None),
        ("snaps/s2", "s1--s2.inc.v1.dump", "incremental", Some(0)),
        ("snaps/s3", "s2--s3.inc.v1.dump", "incremental", Some(1)),
    ];
    for (i, (path, dump, kind, parent)) in expect.iter().enumerate() {
        let e = &list[i];
        let (uuid, ctransid) = kernel_uuid(dump);
        assert_eq!(e["path"], *path);
        assert_eq!(e["uuid"], uuid);
        assert_eq!(e["ctransid"], ctransid);
        assert_eq!(e["kind"], *kind);
        match parent {
            None => assert!(e["parent_uuid"].is_null() && e["parent_id"].is_null()),
            Some(p) => {
                assert_eq!(e["parent_uuid"], list[*p]["uuid"]);
                assert_eq!(e["parent_id"], list[*p]["id"]);
            }
        }
        assert!(e["time"].as_str().unwrap().starts_with("2026-"), "{e}");
        assert_eq!(e["origin"], kernel_parent_uuid(path));
        let stored = fs::metadata(env.stream_file(e)).unwrap().len();
        assert_eq!(e["stored_bytes"], stored);
        // `zstd -dc FILE` gives the kernel's stream.
        let z = Command::new("zstd")
            .arg("-dc")
            .arg(env.stream_file(e))
            .output()
            .unwrap();
        assert!(z.status.success());
        let k = kernel_stream(&dump.replace(".dump", ".stream.zst"));
        assert_eq!(z.stdout.len(), k.len(), "{path}");
        assert!(
            z.stdout == k,
            "{path}: zstd -dc differs from the kernel's stream"
        );
        assert_eq!(e["stream_bytes"], k.len());
    }

    // A re-run stores nothing.
    let again = ok(&env.run(&["--json", "snaps/s*"]));
    let summary: serde_json::Value = serde_json::from_str(again.lines().last().unwrap()).unwrap();
    assert_eq!(
        (
            summary["stored"].as_u64(),
            summary["already_stored"].as_u64()
        ),
        (Some(0), Some(3))
    );

    // verify --read-data: clean and silent.
    let v = env.backup(&["verify", "--read-data", "--repo", env.repo()]);
    ok(&v);
    assert!(v.stderr.is_empty(), "{}", stderr(&v));

    // restore --stdout of s3 = the kernel's s1 full + s1→s2 + s2→s3.
    let out = ok_bytes(&env.backup(&["restore", "--repo", env.repo(), "--stdout", "snaps/s3"]));
    let mut chain = kernel_stream("s1.full.v1.stream.zst");
    chain.extend(kernel_stream("s1--s2.inc.v1.stream.zst"));
    chain.extend(kernel_stream("s2--s3.inc.v1.stream.zst"));
    assert!(
        out == chain,
        "restore --stdout differs from the kernel chain"
    );

    // restore --to by uuid, by id, by path: the kernel mount's manifests.
    let s2_uuid = list[1]["uuid"].as_str().unwrap().to_owned();
    for (spec, last) in [("snaps/s3", "s3"), (s2_uuid.as_str(), "s2"), ("1", "s1")] {
        let to = env.dir.path().join(format!("to-{last}"));
        fs::create_dir(&to).unwrap();
        let o = env
            .cmd()
            .args(["backup", "restore", "--repo", env.repo(), "--to"])
            .arg(&to)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "SNAPSHOT is required");
        let o = env
            .cmd()
            .args(["backup", "restore", "--repo", env.repo(), "--to"])
            .arg(&to)
            .arg(spec)
            .output()
            .unwrap();
        ok(&o);
        assert!(o.stderr.is_empty(), "{}", stderr(&o));
        for snap in ["s1", "s2", "s3"] {
            let p = to.join(snap);
            if snap > last {
                assert!(!p.exists(), "{spec}: {snap} restored too");
                continue;
            }
            assert_eq!(manifest(&p), kernel_manifest(snap), "{spec}: {snap}");
        }
    }
}

both!(full_every_bounds_chains, full_every_case);
fn full_every_case(env: Env) {
    env.init();
    ok(&env.run(&["--full-every", "2", "snaps/s1", "snaps/s2", "snaps/s3"]));
    let list = env.list();
    let kinds: Vec<&str> = list.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["full", "incremental", "full"]);
    // One at a time, in any order of the arguments, is the same.
    let env2 = Env {
        repo: env.be.repo("repo2"),
        ..env
    };
    env2.init();
    ok(&env2.run(&["snaps/s2"]));
    ok(&env2.run(&["--full-every", "2", "snaps/s3", "id:257"]));
    let list = env2.list();
    let got: Vec<(&str, &str)> = list
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    // s2 first (full); then s1 (older, full: s2 is newer), then s3 (from s2).
    assert_eq!(
        got,
        [
            ("snaps/s2", "full"),
            ("snaps/s1", "full"),
            ("snaps/s3", "incremental")
        ]
    );
    assert_eq!(list[2]["parent_id"], list[0]["id"]);
}

/// Damage one stream file in `how`; verify must name it (exit 12) and
/// restore must refuse every snapshot whose chain has it.
fn damage_case(env: Env, how: &str) {
    env.init();
    ok(&env.run(&["snaps/s*"]));
    let list = env.list();
    let s2 = env.stream_file(&list[1]);
    let mut bytes = fs::read(&s2).unwrap();
    match how {
        "flip" => {
            let at = bytes.len() / 3;
            bytes[at] ^= 0x10;
        }
        "truncate" => bytes.truncate(bytes.len() - 100),
        "missing" => bytes.clear(),
        "swap" => {
            // Swap frames 1 and 2.
            let f = frames(&bytes);
            assert!(f.len() > 2, "{f:?}");
            let (a, b) = (f[1], f[2]);
            let mut swapped = bytes[b.0..b.0 + b.1].to_vec();
            swapped.extend_from_slice(&bytes[a.0..a.0 + a.1]);
            bytes.splice(a.0..b.0 + b.1, swapped);
        }
        "forge" => {
            // Every frame intact, but the whole stream's BLAKE3 in the
            // trailer replaced (same length, so the trailer still parses)
            // and the catalog updated to match: only hashing the raw
            // stream finds it.
            let key = b"\"stream_blake3\":\"";
            let at = bytes
                .windows(key.len())
                .rposition(|w| w == key)
                .expect("stream_blake3 in the trailer")
                + key.len();
            let old = String::from_utf8(bytes[at..at + 64].to_vec()).unwrap();
            assert_eq!(old, list[1]["stream_blake3"].as_str().unwrap());
            let forged: String = old.chars().rev().collect();
            assert_ne!(forged, old);
            bytes[at..at + 64].copy_from_slice(forged.as_bytes());
            let cat = env.repo.files.join("catalog");
            let mut updated = 0;
            for e in fs::read_dir(&cat).unwrap() {
                let p = e.unwrap().path();
                let text = fs::read_to_string(&p).unwrap();
                if text.contains(&old) {
                    fs::write(&p, text.replace(&old, &forged)).unwrap();
                    updated += 1;
                }
            }
            assert!(updated > 0, "no catalog in {} names {old}", cat.display());
        }
        _ => unreachable!(),
    }
    if how == "missing" {
        fs::remove_file(&s2).unwrap();
    } else {
        fs::write(&s2, &bytes).unwrap();
    }
    let name = list[1]["file"].as_str().unwrap();
    let read_data = matches!(how, "flip" | "swap" | "forge");
    let args: &[&str] = if read_data {
        &["verify", "--read-data"]
    } else {
        &["verify"]
    };
    let mut a = args.to_vec();
    a.extend(["--repo", env.repo()]);
    let v = env.backup(&a);
    assert_eq!(v.status.code(), Some(12), "{how}: {}", stderr(&v));
    let err = stderr(&v);
    assert!(err.contains(name), "{how}: {err}");
    assert!(
        err.contains("unrestorable: entry 2 (snaps/s2)"),
        "{how}: {err}"
    );
    assert!(
        err.contains("unrestorable: entry 3 (snaps/s3)"),
        "{how}: {err}"
    );
    assert!(!err.contains("entry 1 (snaps/s1)"), "{how}: {err}");
    if how == "flip" || how == "swap" {
        assert!(
            err.contains("frame ") && err.contains("BLAKE3 mismatch"),
            "{how}: {err}"
        );
    }
    if how == "forge" {
        assert!(
            err.contains("the raw stream has") && err.contains("the trailer says"),
            "{how}: {err}"
        );
    }
    assert!(
        err.contains("btrsend: error: verify found damage"),
        "{how}: {err}"
    );
    // Restore refuses s2 and s3 before applying anything; s1 restores.
    for snap in ["snaps/s3", "snaps/s2"] {
        let to = env.dir.path().join(format!("to-{how}-{}", &snap[6..]));
        fs::create_dir(&to).unwrap();
        let o = env
            .cmd()
            .args(["backup", "restore", "--repo", env.repo(), "--to"])
            .arg(&to)
            .arg(snap)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{how} {snap}");
        assert!(stderr(&o).contains(name), "{how}: {}", stderr(&o));
        assert_eq!(
            fs::read_dir(&to).unwrap().count(),
            0,
            "{how}: {snap}: something was applied"
        );
        let o = env.backup(&["restore", "--repo", env.repo(), "--stdout", snap]);
        assert_eq!(o.status.code(), Some(1), "{how} {snap}");
        assert!(o.stdout.is_empty(), "{how}: {snap}: bytes were written");
    }
    // Into btrfs as real subvolumes (root): the frames before the damage
    // are applied as they are checked (s1 whole, s2 in part, with the small
    // frames of `Env::run`), and all of it is deleted again, the finished
    // read-only s1 too: the mount holds what mkfs made, nothing else.
    if read_data
        && btrsend::testing::require_live(&format!("backup damage {how}: restore into btrfs"))
    {
        let live = btrsend::testing::LiveBtrfs::new().unwrap();
        let o = env
            .cmd()
            .args(["backup", "restore", "--repo", env.repo(), "--to"])
            .arg(live.path())
            .arg("snaps/s3")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{how} into btrfs");
        assert!(stderr(&o).contains(name), "{how}: {}", stderr(&o));
        let left: Vec<_> = fs::read_dir(live.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{how}: left in the btrfs: {left:?}");
        let subvols = Command::new("btrfs")
            .args(["subvolume", "list", "-a"])
            .arg(live.path())
            .output()
            .unwrap();
        assert!(subvols.status.success(), "{}", stderr(&subvols));
        let list = String::from_utf8_lossy(&subvols.stdout);
        assert!(
            !list.lines().any(|l| !l.contains("DELETED")),
            "{how}: subvolumes left: {list}"
        );
    }
    let to = env.dir.path().join("to-s1");
    fs::create_dir(&to).unwrap();
    let o = env
        .cmd()
        .args(["backup", "restore", "--repo", env.repo(), "--to"])
        .arg(&to)
        .arg("snaps/s1")
        .output()
        .unwrap();
    ok(&o);
    assert_eq!(manifest(&to.join("s1")), kernel_manifest("s1"));
}

/// The (offset, length) of each frame, from the trailer at the end of a
/// stream file (its layout: btrsend-repository(5)).
fn frames(b: &[u8]) -> Vec<(usize, usize)> {
    let n = b.len();
    assert_eq!(&b[n - 8..], b"BTRSTRL1");
    let json_len = u64::from_le_bytes(b[n - 16..n - 8].try_into().unwrap()) as usize;
    let t: serde_json::Value = serde_json::from_slice(&b[n - 16 - json_len..n - 16]).unwrap();
    t["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["offset"].as_u64().unwrap() as usize,
                f["len"].as_u64().unwrap() as usize,
            )
        })
        .collect()
}

both!(flipped_byte_is_found_and_refused, |env| damage_case(
    env, "flip"
));

both!(truncated_file_is_found_and_refused, |env| damage_case(
    env, "truncate"
));

both!(missing_file_is_found_and_refused, |env| damage_case(
    env, "missing"
));

both!(swapped_frames_are_found_and_refused, |env| damage_case(
    env, "swap"
));

both!(forged_stream_hash_is_found_and_refused, |env| damage_case(
    env, "forge"
));

/// The repository's lock, held as another process would hold it: `flock`
/// on a directory's `lock` file, a lock object (of a live process on
/// another host) on S3. Released on drop.
enum Held {
    // The open file holds the flock.
    File(#[allow(dead_code)] fs::File),
    Object(PathBuf),
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Held::Object(p) = self {
            let _ = fs::remove_file(p);
        }
    }
}

impl Env {
    fn hold_lock(&self, exclusive: bool, age_secs: i64) -> Held {
        match self.be.kind() {
            // The far end of ssh takes the directory's own lock.
            Kind::Dir | Kind::Ssh => {
                // (Made by the first lock over ssh, by init here.)
                let f = fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(self.repo.files.join("lock"))
                    .unwrap();
                if exclusive {
                    f.lock().unwrap();
                } else {
                    f.lock_shared().unwrap();
                }
                Held::File(f)
            }
            Kind::S3 => {
                let kind = if exclusive { "exclusive" } else { "shared" };
                let dir = self.repo.files.join("locks");
                fs::create_dir_all(&dir).unwrap();
                let p = dir.join(format!("{kind}-elsewhere-1-{age_secs}.json"));
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs() as i64;
                let body = serde_json::json!({
                    "kind": kind, "host": "elsewhere", "pid": 1, "time": now - age_secs
                });
                fs::write(&p, body.to_string()).unwrap();
                Held::Object(p)
            }
        }
    }
}

/// Exit status 10, "repository unreachable".
fn assert_unreachable(o: &Output) {
    assert_eq!(o.status.code(), Some(10), "{}", stderr(o));
    assert!(
        stderr(o).contains("repository unreachable"),
        "{}",
        stderr(o)
    );
}

both!(
    exit_codes_for_missing_repository_and_held_lock,
    exit_codes_case
);
fn exit_codes_case(env: Env) {
    // Nothing there: exit 10.
    let (gone, what) = match env.be.kind() {
        Kind::Dir | Kind::Ssh => (env.repo().to_owned(), "repository unreachable"),
        Kind::S3 => (
            String::from("s3://no-such-bucket/repo"),
            "bucket \"no-such-bucket\" does not exist",
        ),
    };
    let o = env.backup(&["list", "--repo", &gone]);
    assert_eq!(o.status.code(), Some(10), "{}", stderr(&o));
    assert!(stderr(&o).contains(what), "{}", stderr(&o));
    assert!(stderr(&o).contains(&gone), "{}", stderr(&o));
    if let Some(port) = env.be.port() {
        // A server that does not answer: exit 10 too. (A port just freed;
        // the server's own port is busy, so this one is not it.)
        let closed = crate::repo_store::free_port();
        assert_ne!(closed, port);
        let o = env
            .cmd()
            .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{closed}"))
            // Retried for a second, not the default two minutes.
            .env("BTRSEND_S3_RETRY_TIMEOUT", "1s")
            .args(["backup", "list", "--repo", env.repo()])
            .output()
            .unwrap();
        assert_unreachable(&o);
    }
    if env.be.kind() == Kind::Ssh {
        // No sshd on that port: ssh fails, and btrsend says so (exit 10).
        let closed = crate::repo_store::free_port();
        let url = env.repo().replace(
            &format!(":{}/", env.be.ssh_port().unwrap()),
            &format!(":{closed}/"),
        );
        let o = env.backup(&["list", "--repo", &url]);
        assert_eq!(o.status.code(), Some(10), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("repository unreachable")
                && stderr(&o).contains("ssh ended with exit status: 255"),
            "{}",
            stderr(&o)
        );
        // A far end that is not btrsend serve.
        let o = env
            .cmd()
            .env("BTRSEND_REMOTE_PATH", "echo")
            .args(["backup", "list", "--repo", env.repo()])
            .output()
            .unwrap();
        assert_unreachable(&o);
    }
    // No repository given at all: a usage error (issue 15).
    let o = env.backup(&["list"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("use --repo REPO or set BTRSEND_REPOSITORY"));
    // BTRSEND_REPOSITORY: a place that holds no repository.
    if env.be.kind() != Kind::S3 {
        fs::create_dir(&env.repo.files).unwrap();
    }
    let o = env
        .cmd()
        .args(["backup", "verify"])
        .env("BTRSEND_REPOSITORY", env.repo())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(10), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("not a btrsend repository"),
        "{}",
        stderr(&o)
    );
    env.init();
    let o = env.backup(&["init", "--repo", env.repo(), "--encryption", "none"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("exists there already"),
        "{}",
        stderr(&o)
    );

    // Hold the lock as another process would: run waits, then exits 11.
    let lock = env.hold_lock(true, 0);
    let t = std::time::Instant::now();
    let o = env.run(&["--retry-lock", "1s", "snaps/s1"]);
    assert_eq!(o.status.code(), Some(11), "{}", stderr(&o));
    assert!(t.elapsed() >= std::time::Duration::from_secs(1));
    assert!(stderr(&o).contains("is locked by"), "{}", stderr(&o));
    let o = env.run(&["--json", "snaps/s1"]);
    assert_eq!(o.status.code(), Some(11));
    let err: serde_json::Value = serde_json::from_str(stderr(&o).trim()).unwrap();
    assert_eq!(err["message_type"], "error");
    assert_eq!(err["exit_code"], 11);
    assert!(
        err["message"].as_str().unwrap().contains("--retry-lock"),
        "{err}"
    );
    // Readers of one catalog generation take no lock: they never wait for
    // a run. Reading every byte does (a forget could delete them).
    ok(&env.backup(&["list", "--repo", env.repo()]));
    ok(&env.backup(&["verify", "--repo", env.repo()]));
    ok(&env.backup(&[
        "forget",
        "--repo",
        env.repo(),
        "--keep-last",
        "1",
        "--dry-run",
    ]));
    let o = env.backup(&["verify", "--repo", env.repo(), "--read-data"]);
    assert_eq!(o.status.code(), Some(11), "{}", stderr(&o));
    drop(lock);
    // Shared readers do not block each other; a held shared lock blocks run.
    let shared = env.hold_lock(false, 0);
    ok(&env.backup(&["list", "--repo", env.repo()]));
    assert_eq!(env.run(&["snaps/s1"]).status.code(), Some(11));
    drop(shared);
    ok(&env.run(&["snaps/s1"]));
    if env.be.kind() == Kind::S3 {
        // A lock object not refreshed for an hour is stale: taken over,
        // with a notice.
        let _old = env.hold_lock(true, 3600);
        let o = env.run(&["--json", "snaps/s2"]);
        let text = ok(&o);
        assert!(
            text.contains("taking over the stale exclusive lock of process 1 on elsewhere"),
            "{text}"
        );
        assert!(
            !env.repo
                .files
                .join("locks")
                .read_dir()
                .unwrap()
                .any(|_| true),
            "the stale lock object and run's own are gone"
        );
    }
    // A snapshot that is not there: nothing stored, exit 1.
    let o = env.run(&["snaps/none"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("matches snaps/none"), "{}", stderr(&o));
}

both!(
    import_of_kernel_streams_in_any_order_restores_the_chain,
    import_case
);
fn import_case(env: Env) {
    env.init();
    let dir = fixture_dir(FIX);
    // Raw and compressed, children first.
    let raw_s1 = env.dir.path().join("s1.stream");
    fs::write(&raw_s1, kernel_stream("s1.full.v1.stream.zst")).unwrap();
    let files = [
        dir.join("s2--s3.inc.v1.stream.zst"),
        dir.join("s1--s2.inc.v1.stream.zst"),
        raw_s1,
    ];
    let mut cmd = env.cmd();
    cmd.args([
        "backup",
        "import",
        "--repo",
        env.repo(),
        "--time",
        "2026-01-02T03:04:05Z",
        "--origin",
        "home",
    ]);
    ok(&cmd.args(&files).output().unwrap());
    let list = env.list();
    let paths: Vec<&str> = list.iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["s1", "s2", "s3"]);
    for e in &list {
        assert_eq!(e["time"], "2026-01-02T03:04:05Z");
        assert_eq!(e["origin"], "home");
    }
    assert_eq!(list[2]["parent_id"], list[1]["id"]);
    assert_eq!(list[1]["parent_id"], list[0]["id"]);
    let to = env.dir.path().join("to");
    fs::create_dir(&to).unwrap();
    ok(&env
        .cmd()
        .args(["backup", "restore", "--repo", env.repo(), "--to"])
        .arg(&to)
        .arg("s3")
        .output()
        .unwrap());
    assert_eq!(manifest(&to.join("s3")), kernel_manifest("s3"));
    // Importing again stores nothing; an incremental without its parent
    // and a file that is no stream fail, the others are stored: exit 3.
    let env2 = Env {
        repo: env.be.repo("repo2"),
        ..env
    };
    env2.init();
    let junk = env2.dir.path().join("junk");
    fs::write(&junk, b"not a stream").unwrap();
    let o = env2
        .cmd()
        .args(["backup", "import", "--repo", env2.repo()])
        .arg(dir.join("s1.full.v2c.stream.zst"))
        .arg(dir.join("s2--s3.inc.v1.stream.zst"))
        .arg(&junk)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("junk: not a send stream"), "{err}");
    assert!(
        err.contains("neither in the repository nor among the files"),
        "{err}"
    );
    let list = env2.list();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["origin"], "imported");
    assert_eq!(list[0]["proto"], 2);
}

/// `restore --stdout | btrfs receive` (the stock receiver, root): the
/// kernel mount's manifests.
#[test]
fn restore_stdout_into_btrfs_receive() {
    if !btrsend::testing::require_live("restore_stdout_into_btrfs_receive") {
        return;
    }
    let env = Env::new(Kind::Dir, "restore_stdout_into_btrfs_receive").unwrap();
    env.init();
    ok(&env.run(&["snaps/s*"]));
    let live = btrsend::testing::LiveBtrfs::new().unwrap();
    let stream = env.dir.path().join("chain");
    let out = env.backup(&["restore", "--repo", env.repo(), "--stdout", "snaps/s3"]);
    fs::write(&stream, ok_bytes(&out)).unwrap();
    live.receive("recv", &[&stream]).unwrap();
    for snap in ["s1", "s2", "s3"] {
        let m = live
            .manifest(
                &format!("recv/{snap}"),
                btrsend::manifest::Options::default(),
            )
            .unwrap();
        assert_eq!(m, kernel_manifest(snap), "{snap}");
    }
}

// kill -9 of `backup run` at ≥ 20 points spread over its run time: each
// time the repository verifies (`--read-data`, exit 0: a leftover file is
// only a notice), and a re-run completes and leaves no upload part on the
// S3 server; at the end every snapshot restores to the kernel mount's
// manifest.
both!(
    kill_9_during_run_leaves_a_repository_that_verifies,
    kill_9_case
);
fn kill_9_case(env: Env) {
    use std::os::unix::process::ExitStatusExt;
    let img = env.img.to_str().unwrap().to_owned();
    let run_args = |repo: &str, level: &str| -> Vec<String> {
        [
            "backup",
            "run",
            "--repo",
            repo,
            "--device",
            &img,
            "--frame-bytes",
            "4096",
            "--compression-level",
            level,
            "snaps/s*",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    // How long an uninterrupted run takes: the kills are spread over it.
    let probe = env.be.repo("probe");
    ok(&env.backup(&["init", "--repo", &probe.spec, "--encryption", "none"]));
    let t = std::time::Instant::now();
    ok(&env
        .cmd()
        .args(run_args(&probe.spec, "19"))
        .output()
        .unwrap());
    let span = t.elapsed().as_micros() as u64;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let (mut kills, mut tries) = (0, 0);
    while kills < 20 {
        tries += 1;
        assert!(
            tries < 200,
            "only {kills} runs were killed in {tries} tries"
        );
        let r = env.be.repo(&format!("repo{tries}"));
        let (repo, repo_s) = (r.files, r.spec);
        ok(&env.backup(&["init", "--repo", &repo_s, "--encryption", "none"]));
        // Half the runs start on a repository holding s1 already.
        if tries % 2 == 0 {
            let img2 = img.clone();
            ok(&env.backup(&["run", "--repo", &repo_s, "--device", &img2, "snaps/s1"]));
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = seed % span.max(1);
        let mut child = env
            .cmd()
            .args(run_args(&repo_s, "19"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_micros(delay));
        let _ = child.kill();
        let status = child.wait().unwrap();
        if status.signal() == Some(9) {
            kills += 1;
        }
        let v = env.backup(&["verify", "--read-data", "--repo", &repo_s]);
        assert!(
            v.status.success(),
            "after a kill at {delay} µs: {}",
            stderr(&v)
        );
        ok(&env.cmd().args(run_args(&repo_s, "3")).output().unwrap());
        let v = env.backup(&["verify", "--read-data", "--repo", &repo_s]);
        assert!(v.status.success() && v.stderr.is_empty(), "{}", stderr(&v));
        // In S3: the killed run's multipart upload was aborted by the
        // re-run (found by its marker), so no part stays on the server.
        assert_eq!(
            env.be.upload_parts(),
            Vec::<String>::new(),
            "parts of an upload killed at {delay} µs left on the server"
        );
        let list = serde_json::from_str::<serde_json::Value>(&ok(
            &env.backup(&["list", "--json", "--repo", &repo_s])
        ))
        .unwrap();
        assert_eq!(list.as_array().unwrap().len(), 3);
        assert_eq!(
            fs::read_dir(repo.join("streams")).unwrap().count(),
            3,
            "leftovers removed by the re-run"
        );
        if kills % 7 == 1 {
            let to = env.dir.path().join(format!("to{tries}"));
            fs::create_dir(&to).unwrap();
            ok(&env
                .cmd()
                .args(["backup", "restore", "--repo", &repo_s, "--to"])
                .arg(&to)
                .arg("snaps/s3")
                .output()
                .unwrap());
            for snap in ["s1", "s2", "s3"] {
                assert_eq!(manifest(&to.join(snap)), kernel_manifest(snap), "{snap}");
            }
        }
        let _ = fs::remove_dir_all(&repo);
    }
    eprintln!("{kills} runs killed with SIGKILL in {tries} tries (run time {span} µs)");
}

/// A valid send stream of about `mib` MiB of incompressible data (WRITE
/// commands of 48 KiB), so that its upload takes several parts.
fn big_stream(mib: usize) -> Vec<u8> {
    use std::borrow::Cow;
    let mut w = stream_format::StreamWriter::new(Vec::new(), 1).unwrap();
    w.write(&stream_format::Command::Subvol {
        path: Cow::Borrowed(b"big"),
        uuid: [7; 16],
        ctransid: 9,
    })
    .unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut data = vec![0u8; 48 << 10];
    for i in 0..(mib << 20) / data.len() {
        for b in data.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
        }
        w.write(&stream_format::Command::Write {
            path: Cow::Borrowed(b"f"),
            offset: (i * data.len()) as u64,
            data: Cow::Borrowed(&data),
        })
        .unwrap();
    }
    w.write(&stream_format::Command::End).unwrap();
    w.into_inner()
}

/// An S3 upload killed with parts on the server: the next writer aborts
/// it (it finds the upload's marker), so no part stays behind, and the
/// repository verifies.
#[test]
fn s3_upload_killed_with_parts_uploaded_is_aborted_by_the_next_run() {
    use std::os::unix::process::ExitStatusExt;
    let Some(env) = Env::new(
        Kind::S3,
        "s3_upload_killed_with_parts_uploaded_is_aborted_by_the_next_run",
    ) else {
        return;
    };
    env.init();
    let file = env.dir.path().join("big.stream");
    fs::write(&file, big_stream(96)).unwrap();
    let mut killed_with_parts = false;
    for _ in 0..5 {
        let mut child = env
            .cmd()
            .args(["backup", "import", "--repo", env.repo()])
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Kill it as soon as the server holds a part of its upload.
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if !env.be.upload_parts().is_empty() {
                let _ = child.kill();
                break child.wait().unwrap();
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        };
        if status.signal() == Some(9) && !env.be.upload_parts().is_empty() {
            killed_with_parts = true;
            break;
        }
        // It finished first: start again on an empty repository.
        let _ = fs::remove_dir_all(&env.repo.files);
        env.init();
    }
    assert!(
        killed_with_parts,
        "no import could be killed while its parts were on the server"
    );
    assert!(env.list().is_empty(), "nothing half-written is listed");
    // The next writer (here a run storing the fixture's s1) aborts the
    // killed upload.
    ok(&env.run(&["snaps/s1"]));
    assert_eq!(env.be.upload_parts(), Vec::<String>::new());
    let v = env.backup(&["verify", "--read-data", "--repo", env.repo()]);
    assert!(v.status.success() && v.stderr.is_empty(), "{}", stderr(&v));
    assert_eq!(env.list().len(), 1);
}

/// `man/btrsend-repository.5` is rendered from `repository_man.rs`
/// (`BTRSEND_UPDATE_MAN=1` rewrites it).
#[test]
fn repository_man_page_is_current() {
    let page = btrsend_cli::repository_man::render();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../man/btrsend-repository.5");
    if std::env::var_os("BTRSEND_UPDATE_MAN").is_some() {
        fs::write(&path, &page).unwrap();
        return;
    }
    let committed = fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == page,
        "man/btrsend-repository.5 is out of date; run BTRSEND_UPDATE_MAN=1 cargo test --release -p btrsend-cli --test integration backup::"
    );
    assert!(page.contains("BTRSTRL1") && page.contains(".SH \"CATALOG\""));
}
