//! Browsing stored snapshots from their index (`backup index`, `ls`,
//! `dump`), judged by the kernel: the kernel's streams of several fixture
//! chains (renames, hard links, xattrs, reflinks, compressed extents sent
//! encoded) are imported into a repository, in a directory and on the S3
//! test server, encrypted and not; for every stored snapshot `ls -R
//! --json` must give the fields of the kernel's manifest of that snapshot,
//! and `dump` of every regular file its content hash.

use std::collections::BTreeMap;
use std::process::Output;

use btrsend::manifest::{content_hash_of, escape};
use btrsend::testing::FixtureMeta;
use serde_json::Value;

use crate::common::{assert_absent, btrsend, fixture_dir, json_lines, objects, stderr};
use crate::repo_store::{Backend, Kind};

/// Fixture chains: the streams imported in order, each with the snapshot
/// it makes.
pub(crate) const CHAINS: &[(&str, &[(&str, &str)])] = &[
    (
        "014-incremental",
        &[
            ("s1.full.v2c.stream.zst", "s1"),
            ("s1--s2.inc.v2c.stream.zst", "s2"),
            ("s2--s3.inc.v2c.stream.zst", "s3"),
        ],
    ),
    (
        "008-hardlinks-xattrs",
        &[
            ("x1.full.v1.stream.zst", "x1"),
            ("x1--x2.inc.v1.stream.zst", "x2"),
        ],
    ),
    (
        "006-compression",
        &[
            ("c1.full.v2c.stream.zst", "c1"),
            ("c1--c2.inc.v2c.stream.zst", "c2"),
        ],
    ),
    (
        "007-reflinks",
        &[
            ("r1.full.v1.stream.zst", "r1"),
            ("r1--r2.inc.v1.stream.zst", "r2"),
        ],
    ),
];

/// Names and values from the kernel's 014 streams that no object of an
/// encrypted repository may show, index pages included.
const CANARIES: [&str; 4] = ["o257-7-0", "deep", "user.change", "new-value"];

pub(crate) fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        stderr(out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) struct Repo {
    pub(crate) be: Backend,
    pub(crate) spec: String,
    pub(crate) files: std::path::PathBuf,
    pub(crate) password: bool,
}

impl Repo {
    pub(crate) fn backup(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run btrsend")
    }

    /// `btrsend backup SUB --repo REPO ARGS...` with this repository's
    /// server and passphrase.
    pub(crate) fn command(&self, args: &[&str]) -> std::process::Command {
        let mut c = btrsend();
        self.be.apply(&mut c);
        c.env_remove("BTRSEND_PASSWORD_FILE")
            .env("BTRSEND_SCRYPT_LOG_N", "10");
        if self.password {
            c.env("BTRSEND_PASSWORD", "correct horse");
        } else {
            c.env_remove("BTRSEND_PASSWORD");
        }
        c.arg("backup");
        let (sub, rest) = args.split_first().unwrap();
        c.arg(sub).args(["--repo", &self.spec]).args(rest);
        c
    }

    /// `backup restore ID --to TO PICK...` (PICK: the --include and
    /// --exclude options).
    pub(crate) fn restore_picked(&self, id: &str, to: &std::path::Path, pick: &[&str]) -> Output {
        let mut args = vec!["restore", id, "--to", to.to_str().unwrap()];
        args.extend(pick);
        self.backup(&args)
    }
}

/// The manifest's fields that `ls --json` has, one canonical line per path.
pub(crate) fn expected_lines(manifest: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in manifest.lines().skip(1) {
        let mut f = line.split(' ');
        let (Some(path), Some(kind)) = (f.next(), f.next()) else {
            continue;
        };
        if kind == "subvol" {
            continue;
        }
        let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
        for kv in f {
            if let Some((k, v)) = kv.split_once('=')
                && !k.starts_with("xattr:")
            {
                fields.insert(k, v);
            }
        }
        let mut s = format!(
            "{kind} mode={} uid={} gid={}",
            fields["mode"], fields["uid"], fields["gid"]
        );
        if let Some(size) = fields.get("size") {
            s += &format!(" size={size}");
        }
        s += &format!(" mtime={}", fields["mtime"]);
        if kind != "dir" {
            s += &format!(" linked={}", fields.contains_key("link"));
        }
        for k in ["target", "rdev"] {
            if let Some(v) = fields.get(k) {
                s += &format!(" {k}={v}");
            }
        }
        out.insert(path.to_owned(), s);
    }
    out
}

/// The same canonical lines from `ls -R --json`.
pub(crate) fn listed_lines(values: &[Value]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for v in values {
        let path = v["path"].as_str().unwrap();
        let rel = path.strip_prefix('/').unwrap();
        let key = if rel.is_empty() {
            ".".to_owned()
        } else {
            escape(rel.as_bytes())
        };
        let kind = match v["type"].as_str().unwrap() {
            "socket" => "sock",
            "chardev" => "chr",
            "blockdev" => "blk",
            k => k,
        };
        let mut s = format!(
            "{kind} mode={:04o} uid={} gid={}",
            v["mode"].as_u64().unwrap(),
            v["uid"],
            v["gid"]
        );
        if kind == "file" || kind == "symlink" {
            s += &format!(" size={}", v["size"]);
        }
        let t: jiff::Timestamp = v["mtime"].as_str().unwrap().parse().unwrap();
        s += &format!(" mtime={}.{:09}", t.as_second(), t.subsec_nanosecond());
        if kind != "dir" {
            s += &format!(" linked={}", v["nlink"].as_u64().unwrap() > 1);
        }
        if let Some(target) = v.get("target") {
            s += &format!(" target={}", escape(target.as_str().unwrap().as_bytes()));
        }
        if let Some(rdev) = v.get("rdev") {
            s += &format!(" rdev={}", rdev.as_str().unwrap());
        }
        out.insert(key, s);
    }
    out
}

/// A repository in `dir` holding every chain of [`CHAINS`] (in order:
/// entry ids 1, 2, ...), indexed as import stores them; `None` when its store is not
/// available here.
pub(crate) fn imported(
    kind: Kind,
    encryption: &str,
    test: &str,
    dir: &std::path::Path,
) -> Option<Repo> {
    let be = Backend::new(kind, test, dir)?;
    let r = be.repo("repo");
    let repo = Repo {
        spec: r.spec.clone(),
        files: r.files.clone(),
        be,
        password: encryption == "passphrase",
    };
    ok(&repo.backup(&["init", "--encryption", encryption]));
    for (fx, streams) in CHAINS {
        let mut args = vec!["import".to_owned()];
        args.extend(
            streams
                .iter()
                .map(|(s, _)| fixture_dir(fx).join(s).to_str().unwrap().to_owned()),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok(&repo.backup(&args));
    }
    Some(repo)
}

/// Import every chain (which indexes it), and check every snapshot against
/// the kernel.
fn browse_case(kind: Kind, encryption: &str, test: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(repo) = imported(kind, encryption, test, dir.path()) else {
        return;
    };
    // Import indexed every stream as it stored it: `backup index` finds
    // everything indexed and writes nothing.
    let names = || -> Vec<std::path::PathBuf> {
        objects(&repo.files)
            .into_iter()
            .map(|o| o.0)
            .filter(|p| !p.ends_with("lock"))
            .collect()
    };
    let before = names();
    assert!(
        before
            .iter()
            .any(|p| p.to_string_lossy().contains("index/r"))
    );
    ok(&repo.backup(&["index"]));
    assert_eq!(names(), before);

    let mut id = 0;
    for (fx, streams) in CHAINS {
        let meta = FixtureMeta::load(&fixture_dir(fx)).unwrap();
        for (_, snap) in *streams {
            id += 1;
            let manifest = meta.manifest(snap).unwrap();
            let listed = json_lines(&ok(&repo.backup(&["ls", "-R", "--json", &id.to_string()])));
            let (want, got) = (expected_lines(&manifest), listed_lines(&listed));
            assert_eq!(got, want, "{fx} {snap} ({encryption}, {kind:?})");
            // Every regular file's bytes (on S3 and over ssh, where each
            // command costs round trips or a handshake, every fifth).
            let every = if kind == Kind::Dir { 1 } else { 5 };
            let mut files = 0;
            for line in manifest.lines().skip(1).step_by(every) {
                let mut f = line.split(' ');
                let (Some(path), Some("file")) = (f.next(), f.next()) else {
                    continue;
                };
                let b3 = line
                    .split(' ')
                    .find_map(|kv| kv.strip_prefix("b3="))
                    .unwrap();
                // The fixtures' names are printable ASCII: the escaped
                // path is the path.
                assert_eq!(escape(path.as_bytes()), path);
                let out = repo.backup(&["dump", &id.to_string(), &format!("/{path}")]);
                let bytes = out.stdout.clone();
                ok(&out);
                assert_eq!(content_hash_of(&bytes), b3, "{fx} {snap} {path}");
                files += 1;
            }
            assert!(files > 0 || every > 1, "{fx} {snap}");
        }
    }
    // A directory (a tar archive: backup_query checks its contents), a
    // missing path and a path escaping the root.
    let out = repo.backup(&["dump", "1", "/"]);
    ok(&out);
    assert!(out.stdout.len().is_multiple_of(512) && out.stdout.get(257..263) == Some(b"ustar\0"));
    let out = repo.backup(&["ls", "1", "/no/such/thing"]);
    assert!(
        !out.status.success() && stderr(&out).contains("no such file"),
        "{}",
        stderr(&out)
    );
    let out = repo.backup(&["ls", "1", "/a/../../etc"]);
    assert!(
        !out.status.success() && stderr(&out).contains("'..'"),
        "{}",
        stderr(&out)
    );
    if encryption != "none" {
        assert_absent(&objects(&repo.files), &CANARIES);
    }
}

#[test]
fn ls_and_dump_give_the_kernels_snapshots_in_a_directory() {
    browse_case(
        Kind::Dir,
        "none",
        "ls_and_dump_give_the_kernels_snapshots_in_a_directory",
    );
}

#[test]
fn ls_and_dump_give_the_kernels_snapshots_encrypted_on_s3() {
    browse_case(
        Kind::S3,
        "passphrase",
        "ls_and_dump_give_the_kernels_snapshots_encrypted_on_s3",
    );
}

#[test]
fn ls_and_dump_give_the_kernels_snapshots_encrypted_over_ssh() {
    browse_case(
        Kind::Ssh,
        "passphrase",
        "ls_and_dump_give_the_kernels_snapshots_encrypted_over_ssh",
    );
}

fn dir_repo(dir: &std::path::Path, name: &str) -> Repo {
    let be = Backend::new(Kind::Dir, name, dir).unwrap();
    let r = be.repo(name);
    let repo = Repo {
        spec: r.spec.clone(),
        files: r.files.clone(),
        be,
        password: false,
    };
    ok(&repo.backup(&["init", "--encryption", "none"]));
    repo
}

/// The names of the repository's index objects starting with `kind`
/// (`k` packs, `r` roots).
pub(crate) fn index_objects(repo: &Repo, kind: char) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(repo.files.join("index"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(kind))
        .collect();
    v.sort();
    v
}

/// The byte ranges of the pages in the pack `bytes` of a repository
/// without encryption: its zstd frames, one a page.
pub(crate) fn pack_pages(bytes: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let n = zstd::zstd_safe::find_frame_compressed_size(&bytes[at..]).unwrap();
        out.push(at..at + n);
        at += n;
    }
    out
}

/// Every page of every pack of `repo`, one at a time: each damaged in
/// place (a byte of its frame flipped, so the page no longer matches its
/// name or does not decompress), given to `f` with its pack's path and
/// its good bytes, and mended after.
pub(crate) fn each_damaged_page(repo: &Repo, f: &mut dyn FnMut(&std::path::Path, &[u8])) {
    let packs = index_objects(repo, 'k');
    assert!(!packs.is_empty());
    for pack in &packs {
        let good = std::fs::read(pack).unwrap();
        for r in pack_pages(&good) {
            let mut bad = good.clone();
            bad[r.start + r.len() / 2] ^= 0x20;
            std::fs::write(pack, &bad).unwrap();
            f(pack, &good);
            std::fs::write(pack, &good).unwrap();
        }
    }
}

#[test]
fn a_damaged_index_page_is_refused_reported_and_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir_repo(dir.path(), "a_damaged_index_page");
    let (fx, streams) = CHAINS[0];
    let mut args = vec!["import".to_owned()];
    args.extend(
        streams
            .iter()
            .map(|(s, _)| fixture_dir(fx).join(s).to_str().unwrap().to_owned()),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(&repo.backup(&args));
    let listing = ok(&repo.backup(&["ls", "-R", "--json", "1"]));
    let mut seen = 0;
    each_damaged_page(&repo, &mut |pack, good| {
        let mut failed = false;
        for id in 1..=3 {
            let id = id.to_string();
            let out = repo.backup(&["ls", "-R", &id]);
            if out.status.success() {
                continue;
            }
            assert!(stderr(&out).contains("index page"), "{}", stderr(&out));
            failed = true;
            // A restore of everything refuses too, and leaves nothing.
            let to = dir.path().join("picked");
            let out = repo.restore_picked(&id, &to, &["--include", "**"]);
            assert!(
                !out.status.success() && stderr(&out).contains("index page"),
                "{}",
                stderr(&out)
            );
            assert_eq!(std::fs::read_dir(&to).unwrap().count(), 0);
            // So does a dump of the whole snapshot (it reads what ls -R
            // reads, and the data): it fails, never ends a shorter
            // archive as if whole.
            let out = repo.backup(&["dump", &id, "/"]);
            assert!(
                !out.status.success() && stderr(&out).contains("index page"),
                "{}",
                stderr(&out)
            );
        }
        assert!(failed, "{}", pack.display());
        if seen % 3 == 0 {
            // verify --read-data reads every page and reports it; backup
            // index builds it again, the pack as it was.
            let out = repo.backup(&["verify", "--read-data"]);
            assert!(!out.status.success());
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
            assert!(text.contains("is damaged"), "{text}");
            ok(&repo.backup(&["index"]));
            assert_eq!(std::fs::read(pack).unwrap(), good, "{}", pack.display());
            ok(&repo.backup(&["verify", "--read-data"]));
            assert_eq!(ok(&repo.backup(&["ls", "-R", "--json", "1"])), listing);
        }
        seen += 1;
    });
    assert!(seen >= 3, "{seen} pages");
    // A missing root: ls says what to do, verify notes it, index builds it.
    for root in index_objects(&repo, 'r') {
        std::fs::remove_file(root).unwrap();
    }
    let out = repo.backup(&["ls", "1"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("btrsend backup index"),
        "{}",
        stderr(&out)
    );
    let out = repo.backup(&["verify"]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(
        text.contains("3 stored snapshot(s) have no index"),
        "{text}"
    );
    ok(&repo.backup(&["index"]));
    assert_eq!(ok(&repo.backup(&["ls", "-R", "--json", "1"])), listing);
}

#[test]
fn forget_deletes_the_index_pages_only_forgotten_snapshots_used() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir_repo(dir.path(), "forget_sweeps");
    let x1 = fixture_dir("008-hardlinks-xattrs").join("x1.full.v1.stream.zst");
    let s1 = fixture_dir("014-incremental").join("s1.full.v2c.stream.zst");
    ok(&repo.backup(&[
        "import",
        "--time",
        "2026-01-01T00:00:00Z",
        s1.to_str().unwrap(),
    ]));
    ok(&repo.backup(&[
        "import",
        "--time",
        "2026-01-02T00:00:00Z",
        x1.to_str().unwrap(),
    ]));
    let listing = ok(&repo.backup(&["ls", "-R", "--json", "2"]));
    // What an index of x1 alone is: in an unencrypted repository pack
    // names depend on the pages only.
    let alone = dir_repo(dir.path(), "forget_sweeps_alone");
    ok(&alone.backup(&["import", x1.to_str().unwrap()]));
    let names = |r: &Repo, k: char| -> Vec<String> {
        index_objects(r, k)
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
            .collect()
    };
    assert!(names(&repo, 'k').len() > names(&alone, 'k').len());
    ok(&repo.backup(&["forget", "--keep-last", "1"]));
    assert_eq!(names(&repo, 'k'), names(&alone, 'k'));
    assert_eq!(index_objects(&repo, 'r').len(), 1);
    assert_eq!(ok(&repo.backup(&["ls", "-R", "--json", "2"])), listing);
    ok(&repo.backup(&["verify", "--read-data"]));
}
