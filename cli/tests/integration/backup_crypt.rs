//! Encrypted repositories end to end, in a directory and on the S3 test
//! server, on the kernel-made `014-incremental` image: what is stored is
//! judged by the kernel's own streams (`restore --stdout`, and `age -d |
//! zstd -d` with the real `age` command, must give `btrfs send`'s bytes),
//! secrecy by the kernel's own names and xattr values, which must appear in
//! no object of the repository; keys made by the real `age-keygen`.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Output};

use crate::common::{btrsend, fixture_dir, stderr, unpack};
use crate::repo_store::{Backend, Kind, TestRepo};

const FIX: &str = "014-incremental";

/// What the kernel's streams carry and no repository object may show: a
/// file name, an xattr name and value, a snapshot's uuid and path.
const CANARIES: [&str; 6] = [
    "o257-7-0",
    "deep",
    "user.change",
    "new-value",
    "3d5317cc-0196",
    "snaps/s1",
];

struct Env {
    dir: tempfile::TempDir,
    img: PathBuf,
    be: Backend,
    repo: TestRepo,
    /// HOME for btrsend: where init keeps the write key.
    home: PathBuf,
}

impl Env {
    fn new(kind: Kind, test: &str) -> Option<Env> {
        if Command::new("age-keygen")
            .arg("--version")
            .output()
            .is_err()
        {
            btrsend::testing::skip_or_fail(test, "needs age-keygen (apt-get install age)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = unpack(dir.path(), FIX, "dev1.img");
        let be = Backend::new(kind, test, dir.path())?;
        let repo = be.repo("repo");
        let home = dir.path().join("home");
        fs::create_dir(&home).unwrap();
        Some(Env {
            dir,
            img,
            be,
            repo,
            home,
        })
    }

    fn repo(&self) -> &str {
        &self.repo.spec
    }

    /// `btrsend backup ARGS…` with this test's HOME, no secret in the
    /// environment but what `env` adds, and a fast scrypt.
    fn backup(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
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
        ] {
            c.env_remove(v);
        }
        c.envs(env.iter().copied());
        c.arg("backup").args(args).output().expect("run btrsend")
    }

    fn run(&self, env: &[(&str, &str)]) -> Output {
        let img = self.img.to_str().unwrap();
        self.backup(
            &[
                "run",
                "--repo",
                self.repo(),
                "--device",
                img,
                "--frame-bytes",
                "4096",
                "snaps/s*",
            ],
            env,
        )
    }

    /// A new age identity from `age-keygen`: (identity file, recipient).
    fn keygen(&self, name: &str) -> (PathBuf, String) {
        crate::common::keygen(self.dir.path(), name)
    }

    /// Every object of the repository, raw and as `zstd -dc` makes it.
    fn objects(&self) -> Vec<(PathBuf, Vec<u8>)> {
        crate::common::objects(&self.repo.files)
    }
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        stderr(out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A command that fails with `code` and one line naming `what`.
fn refused(out: &Output, code: i32, what: &str) {
    assert_eq!(out.status.code(), Some(code), "{}", stderr(out));
    let err = stderr(out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(what), "{err}");
    assert!(out.stdout.is_empty());
}

/// The kernel's stream `name` of the fixture, decompressed.
fn kernel_stream(name: &str) -> Vec<u8> {
    zstd::decode_all(fs::File::open(fixture_dir(FIX).join(name)).unwrap()).unwrap()
}

/// The kernel's s1 full, s1→s2 and s2→s3 streams.
fn kernel_chain() -> Vec<u8> {
    let mut chain = kernel_stream("s1.full.v1.stream.zst");
    chain.extend(kernel_stream("s1--s2.inc.v1.stream.zst"));
    chain.extend(kernel_stream("s2--s3.inc.v1.stream.zst"));
    chain
}

fn no_canary(env: &Env) {
    let dump = fs::read_to_string(fixture_dir(FIX).join("s1--s2.inc.v1.dump")).unwrap()
        + &fs::read_to_string(fixture_dir(FIX).join("s1.full.v1.dump")).unwrap();
    for c in CANARIES.iter().filter(|c| !c.starts_with("snaps/")) {
        assert!(dump.contains(c), "{c} is not in the kernel's streams");
    }
    let objects = env.objects();
    assert!(objects.len() > 6, "{}", objects.len());
    crate::common::assert_absent(&objects, &CANARIES);
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

both!(passphrase_repository, passphrase_case);
fn passphrase_case(env: Env) {
    let pw = env.dir.path().join("pw");
    fs::write(&pw, "correct horse battery\n").unwrap();
    let pw_s = pw.to_str().unwrap();
    // No --encryption: a usage error listing the modes, nothing made.
    let o = env.backup(&["init", "--repo", env.repo()], &[]);
    refused(&o, 2, "passphrase");
    assert!(stderr(&o).contains("recipients") && stderr(&o).contains("none"));
    let said = ok(&env.backup(
        &[
            "init",
            "--repo",
            env.repo(),
            "--encryption",
            "passphrase",
            "--password-file",
            pw_s,
        ],
        &[],
    ));
    assert!(said.contains("encrypted with a passphrase"), "{said}");
    let with_pw = [("BTRSEND_PASSWORD_FILE", pw_s)];
    ok(&env.run(&with_pw));
    no_canary(&env);

    // Without the passphrase, with a wrong one: exit 13, one line.
    refused(
        &env.backup(&["list", "--repo", env.repo()], &[]),
        13,
        "--password-file",
    );
    refused(
        &env.backup(
            &["list", "--repo", env.repo()],
            &[("BTRSEND_PASSWORD", "wrong")],
        ),
        13,
        "wrong passphrase",
    );
    refused(
        &env.run(&[("BTRSEND_PASSWORD", "wrong")]),
        13,
        "wrong passphrase",
    );

    // With it: listed, verified, restored as the kernel sent it.
    let list = ok(&env.backup(&["list", "--repo", env.repo(), "--json"], &with_pw));
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 3);
    let v = env.backup(&["verify", "--read-data", "--repo", env.repo()], &with_pw);
    ok(&v);
    let cmd = format!("cat {pw_s}");
    let out = env.backup(
        &[
            "restore",
            "--repo",
            env.repo(),
            "--stdout",
            "--password-command",
            &cmd,
            "snaps/s3",
        ],
        &[],
    );
    ok(&out);
    assert!(
        out.stdout == kernel_chain(),
        "restore --stdout differs from the kernel's chain"
    );

    // Without btrsend, as btrsend-repository(5) says: `age -d` of the key
    // object asks for the passphrase (on a terminal: script(1) makes one)
    // and prints the JSON whose "identity" opens the stream files.
    let key = fs::read_dir(env.repo.files.join("keys"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("pass-"))
        .expect("a key object");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "script -qec \"age -d '{}'\" /dev/null < '{pw_s}'",
            key.display()
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text
        .find("{\"")
        .and_then(|at| text[at..].lines().next())
        .unwrap_or_else(|| panic!("age -d printed no key: {text} {}", stderr(&out)));
    let key: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    let id = env.dir.path().join("from-key.txt");
    fs::write(&id, format!("{}\n", key["identity"].as_str().unwrap())).unwrap();
    let list = list.as_array().unwrap();
    let first = env.repo.files.join(list[0]["file"].as_str().unwrap());
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "age -d -i '{}' '{}' | zstd -dc",
            id.display(),
            first.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        out.stdout == kernel_stream("s1.full.v1.stream.zst"),
        "age -d | zstd -d of the full stream differs from the kernel's"
    );
}

both!(recipients_repository, recipients_case);
fn recipients_case(env: Env) {
    let (id, recipient) = env.keygen("id.txt");
    let said = ok(&env.backup(
        &[
            "init",
            "--repo",
            env.repo(),
            "--encryption",
            "recipients",
            "--recipient",
            &recipient,
        ],
        &[],
    ));
    assert!(said.contains("its write key"), "{said}");
    let keys: Vec<_> = fs::read_dir(env.home.join(".config/btrsend/keys"))
        .unwrap()
        .collect();
    assert_eq!(keys.len(), 1, "init wrote the write key under HOME");
    // The nightly job: the write key (found under HOME), no identity.
    ok(&env.run(&[]));
    no_canary(&env);
    // It lists the catalog, and cannot read what is stored.
    let list = ok(&env.backup(&["list", "--repo", env.repo(), "--json"], &[]));
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    let list = list.as_array().unwrap().clone();
    assert_eq!(list.len(), 3);
    refused(
        &env.backup(
            &["restore", "--repo", env.repo(), "--stdout", "snaps/s3"],
            &[],
        ),
        13,
        "write key alone cannot",
    );
    refused(
        &env.backup(&["verify", "--repo", env.repo()], &[]),
        13,
        "--identity",
    );
    // Another identity is refused; the recipient's reads.
    let (other, _) = env.keygen("other.txt");
    let other_s = other.to_str().unwrap();
    let wrong = [("BTRSEND_IDENTITY_FILE", other_s)];
    refused(
        &env.backup(&["verify", "--repo", env.repo()], &wrong),
        13,
        "none of the identities",
    );
    let id_s = id.to_str().unwrap();
    let ok_id = ["--identity", id_s];
    ok(&env.backup(
        &[
            "verify",
            "--read-data",
            "--repo",
            env.repo(),
            ok_id[0],
            ok_id[1],
        ],
        &[],
    ));
    let out = env.backup(
        &[
            "restore",
            "--repo",
            env.repo(),
            "--stdout",
            "--identity",
            id_s,
            "snaps/s3",
        ],
        &[],
    );
    ok(&out);
    assert!(
        out.stdout == kernel_chain(),
        "restore --stdout differs from the kernel's chain"
    );
    // Without btrsend: age -d -i ID FILE | zstd -d gives each kernel stream.
    let kernel = [
        "s1.full.v1.stream.zst",
        "s1--s2.inc.v1.stream.zst",
        "s2--s3.inc.v1.stream.zst",
    ];
    for (e, k) in list.iter().zip(kernel) {
        let file = env.repo.files.join(e["file"].as_str().unwrap());
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "age -d -i '{id_s}' '{}' | zstd -dc",
                file.display()
            ))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            out.stdout == kernel_stream(k),
            "{k}: age -d | zstd -d differs"
        );
    }
}

both!(tampered_repository_is_refused, tamper_case);
fn tamper_case(env: Env) {
    let (id, recipient) = env.keygen("id.txt");
    ok(&env.backup(
        &[
            "init",
            "--repo",
            env.repo(),
            "--encryption",
            "recipients",
            "--recipient",
            &recipient,
        ],
        &[],
    ));
    ok(&env.run(&[]));
    let id_s = id.to_str().unwrap();
    let with_id = [("BTRSEND_IDENTITY_FILE", id_s)];
    let list = ok(&env.backup(&["list", "--repo", env.repo(), "--json"], &[]));
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    let files: Vec<PathBuf> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|e| env.repo.files.join(e["file"].as_str().unwrap()))
        .collect();
    let saved: Vec<Vec<u8>> = files.iter().map(|f| fs::read(f).unwrap()).collect();
    let restore_refused = |what: &str| {
        let v = env.backup(&["verify", "--read-data", "--repo", env.repo()], &with_id);
        assert_eq!(v.status.code(), Some(12), "{what}: {}", stderr(&v));
        let r = env.backup(
            &["restore", "--repo", env.repo(), "--stdout", "snaps/s3"],
            &with_id,
        );
        assert_ne!(r.status.code(), Some(0), "{what}");
        assert!(
            r.stdout.is_empty() || r.stdout.len() < 200,
            "{what}: restore wrote data"
        );
    };
    // Two stream objects swapped.
    fs::write(&files[1], &saved[2]).unwrap();
    fs::write(&files[2], &saved[1]).unwrap();
    restore_refused("swapped");
    // Re-encrypted by someone who knows the public recipient: the stream
    // file decrypted, then encrypted again by the age command.
    let plain = Command::new("age")
        .arg("-d")
        .arg("-i")
        .arg(&id)
        .arg(&files[0])
        .output()
        .unwrap();
    fs::write(&files[1], &saved[1]).unwrap();
    fs::write(&files[2], &saved[2]).unwrap();
    let reenc = env.dir.path().join("reenc");
    fs::write(env.dir.path().join("plain"), &plain.stdout).unwrap();
    let o = Command::new("age")
        .args(["-r", &recipient, "-o"])
        .arg(&reenc)
        .arg(env.dir.path().join("plain"))
        .output()
        .unwrap();
    assert!(o.status.success());
    fs::write(&files[0], fs::read(&reenc).unwrap()).unwrap();
    restore_refused("re-encrypted");
    // A flipped byte.
    let mut b = saved[0].clone();
    let at = b.len() / 2;
    b[at] ^= 1;
    fs::write(&files[0], &b).unwrap();
    restore_refused("flipped");
    fs::write(&files[0], &saved[0]).unwrap();
    ok(&env.backup(&["verify", "--read-data", "--repo", env.repo()], &with_id));
    // An older catalog generation under the newest one's name.
    let cat_dir = env.repo.files.join("catalog");
    let mut gens: Vec<PathBuf> = fs::read_dir(&cat_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    gens.sort();
    let newest = gens.last().unwrap().clone();
    let older = gens[gens.len() - 2].clone();
    fs::write(&newest, fs::read(&older).unwrap()).unwrap();
    let v = env.backup(&["verify", "--repo", env.repo()], &with_id);
    assert_eq!(v.status.code(), Some(12), "{}", stderr(&v));
    assert!(
        stderr(&v).contains("does not authenticate"),
        "{}",
        stderr(&v)
    );
    let l = env.backup(&["list", "--repo", env.repo()], &with_id);
    assert_ne!(l.status.code(), Some(0), "{}", stderr(&l));
}

both!(passphrases_are_added_removed_and_changed, key_case);
fn key_case(env: Env) {
    let pw = |n: &str, text: &str| {
        let p = env.dir.path().join(n);
        fs::write(&p, format!("{text}\n")).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let (one, two, three) = (
        pw("one", "first one"),
        pw("two", "second"),
        pw("three", "third"),
    );
    let with = |p: &str| vec![("BTRSEND_PASSWORD_FILE", p.to_owned())];
    let b = |args: &[&str], p: &str| {
        let v = with(p);
        let v: Vec<(&str, &str)> = v.iter().map(|(k, x)| (*k, x.as_str())).collect();
        env.backup(args, &v)
    };
    ok(&b(
        &["init", "--repo", env.repo(), "--encryption", "passphrase"],
        &one,
    ));
    ok(&b(
        &[
            "run",
            "--repo",
            env.repo(),
            "--device",
            env.img.to_str().unwrap(),
            "snaps/s*",
        ],
        &one,
    ));
    let keys = |p: &str| -> Vec<serde_json::Value> {
        let out = ok(&b(&["key", "list", "--repo", env.repo(), "--json"], p));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["keys"].as_array().unwrap().clone()
    };
    let first = keys(&one);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0]["current"], true);
    let first_name = first[0]["name"].as_str().unwrap().to_owned();
    // The only key, opened by the passphrase given: not removable.
    refused(
        &b(&["key", "remove", "--repo", env.repo(), &first_name], &one),
        1,
        "key passwd",
    );
    // A second passphrase; the first removed with it.
    ok(&b(
        &[
            "key",
            "add",
            "--repo",
            env.repo(),
            "--new-password-file",
            &two,
        ],
        &one,
    ));
    assert_eq!(keys(&two).len(), 2);
    ok(&b(
        &["key", "remove", "--repo", env.repo(), &first_name],
        &two,
    ));
    refused(
        &b(&["list", "--repo", env.repo()], &one),
        13,
        "wrong passphrase",
    );
    let restore = |p: &str| {
        let out = b(
            &["restore", "--repo", env.repo(), "--stdout", "snaps/s3"],
            p,
        );
        ok(&out);
        assert!(out.stdout == kernel_chain(), "the old backups restore");
    };
    restore(&two);
    // Changed: the old one opens nothing, the new one everything.
    ok(&b(
        &[
            "key",
            "passwd",
            "--repo",
            env.repo(),
            "--new-password-file",
            &three,
        ],
        &two,
    ));
    refused(
        &b(&["list", "--repo", env.repo()], &two),
        13,
        "wrong passphrase",
    );
    assert_eq!(keys(&three).len(), 1);
    restore(&three);
}
