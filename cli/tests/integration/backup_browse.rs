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
        c.output().expect("run btrsend")
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

/// Import every chain, index, and check every snapshot against the kernel.
fn browse_case(kind: Kind, encryption: &str, test: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(be) = Backend::new(kind, test, dir.path()) else {
        return;
    };
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
    // Before `backup index`, ls says what to do.
    let out = repo.backup(&["ls", "1"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("btrsend backup index"),
        "{}",
        stderr(&out)
    );
    ok(&repo.backup(&["index"]));
    // A second run finds everything indexed and writes nothing.
    let before = objects(&repo.files).len();
    ok(&repo.backup(&["index"]));
    assert_eq!(objects(&repo.files).len(), before);

    let mut id = 0;
    for (fx, streams) in CHAINS {
        let meta = FixtureMeta::load(&fixture_dir(fx)).unwrap();
        for (_, snap) in *streams {
            id += 1;
            let manifest = meta.manifest(snap).unwrap();
            let listed = json_lines(&ok(&repo.backup(&["ls", "-R", "--json", &id.to_string()])));
            let (want, got) = (expected_lines(&manifest), listed_lines(&listed));
            assert_eq!(got, want, "{fx} {snap} ({encryption}, {kind:?})");
            // Every regular file's bytes (on S3, where each command costs
            // round trips, every fifth).
            let every = if kind == Kind::S3 { 5 } else { 1 };
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
fn a_damaged_index_page_is_refused_not_misread() {
    let dir = tempfile::tempdir().unwrap();
    let be = Backend::new(Kind::Dir, "a_damaged_index_page", dir.path()).unwrap();
    let r = be.repo("repo");
    let repo = Repo {
        spec: r.spec.clone(),
        files: r.files.clone(),
        be,
        password: false,
    };
    ok(&repo.backup(&["init", "--encryption", "none"]));
    let (fx, streams) = CHAINS[0];
    let path = fixture_dir(fx).join(streams[0].0);
    ok(&repo.backup(&["import", path.to_str().unwrap()]));
    ok(&repo.backup(&["index"]));
    let pages: Vec<_> = std::fs::read_dir(repo.files.join("index"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with('p'))
        .collect();
    assert!(!pages.is_empty());
    for page in pages {
        let good = std::fs::read(&page).unwrap();
        // A page that decompresses to other bytes: its name no longer fits.
        let mut plain = zstd::decode_all(&good[..]).unwrap();
        let last = plain.len() - 1;
        plain[last] ^= 0x20;
        std::fs::write(&page, zstd::encode_all(&plain[..], 3).unwrap()).unwrap();
        let out = repo.backup(&["ls", "-R", "1"]);
        assert!(!out.status.success(), "{}", page.display());
        assert!(stderr(&out).contains("index page"), "{}", stderr(&out));
        std::fs::write(&page, &good).unwrap();
    }
    ok(&repo.backup(&["ls", "-R", "1"]));
}
