//! Repositories on another host over a real `sshd` on 127.0.0.1 (issue
//! 33): a forced command that serves append-only, and far ends that lie.
//! (The backup suites in `backup.rs`, `backup_crypt.rs` and
//! `backup_forget.rs` run over ssh too, and `backup_resume.rs` cuts the
//! connection of a run.)

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use btrsend::backup::Store;
use btrsend::backup::remote::spec::SshSpec;
use btrsend::backup::remote::ssh::{self, SshOptions};

use crate::backup::kernel_manifest;
use crate::common::{btrsend, stderr, unpack};
use crate::repo_store::SshServer;

const FIX: &str = "014-incremental";

/// `btrsend backup ARGS…` with `envs`.
fn backup(envs: &[(&str, String)], args: &[&str]) -> Output {
    btrsend()
        .arg("backup")
        .args(args)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run btrsend")
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{:?}: {}", o.status, stderr(o));
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Every file below `dir` but the lock file, with its bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.file_name().is_some_and(|n| n != "lock") {
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                out.push((rel, fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn manifest(dir: &Path) -> String {
    ok(&btrsend().arg("manifest").arg(dir).output().unwrap())
}

#[test]
fn an_append_only_forced_command_refuses_deletes_overwrites_and_rollbacks() {
    let test = "an_append_only_forced_command_refuses_deletes_overwrites_and_rollbacks";
    let tmp = tempfile::tempdir().unwrap();
    let served = tmp.path().join("served");
    let repo = served.join("host1");
    fs::create_dir(&served).unwrap();
    let forced = format!(
        "command=\"{} serve --append-only --restrict-to-path {}\",restrict",
        env!("CARGO_BIN_EXE_btrsend"),
        served.display()
    );
    let Some(sshd) = SshServer::start(test, &tmp.path().join("sshd"), &forced) else {
        return;
    };
    let img = unpack(tmp.path(), FIX, "dev1.img");
    let img = img.to_str().unwrap();
    // The client's remote path is not what runs: the forced command is.
    let envs = [
        ("BTRSEND_SSH", sshd.ssh_command()),
        ("BTRSEND_REMOTE_PATH", String::from("/nonexistent/btrsend")),
    ];
    let url = sshd.url(&repo);
    ok(&backup(
        &envs,
        &["init", "--repo", &url, "--encryption", "none"],
    ));
    ok(&backup(
        &envs,
        &[
            "run", "--repo", &url, "--device", img, "snaps/s1", "snaps/s2",
        ],
    ));
    let before = files(&repo);

    // forget through it: refused, with what to do instead.
    let o = backup(&envs, &["forget", "--repo", &url, "--keep-last", "1"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("served append-only") && stderr(&o).contains("prune on the server"),
        "{}",
        stderr(&o)
    );
    // A dry run only reads.
    let o = backup(
        &envs,
        &["forget", "--repo", &url, "--keep-last", "1", "--dry-run"],
    );
    ok(&o);

    // Requests a compromised client could make by hand.
    let spec = SshSpec::parse(&url).unwrap().unwrap();
    let options = SshOptions {
        command: Some(sshd.ssh_command()),
        remote_path: None,
    };
    let store = ssh::open(&url, &spec, &options).unwrap();
    assert!(store.append_only());
    let streams: Vec<String> = store
        .list("streams/")
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(streams.len(), 2, "{streams:?}");
    for key in [
        "config",
        "catalog/0000000000000003.json",
        streams[0].as_str(),
    ] {
        let e = store.delete(key).unwrap_err().to_string();
        assert!(e.contains("append-only"), "{key}: {e}");
    }
    assert!(!store.put_if_absent(&streams[1], b"overwritten").unwrap());
    let mut upload = store.multipart("config").unwrap();
    upload.write(b"overwritten").unwrap();
    assert!(
        upload.complete().is_err(),
        "config overwritten by an upload"
    );
    let newest = store
        .list("catalog/")
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .max()
        .unwrap();
    let catalog = store.get(&newest, None).unwrap();
    // An older generation again, and a newer one that drops an entry.
    let e = store
        .put_if_absent("catalog/0000000000000001.json", &catalog)
        .unwrap_err()
        .to_string();
    assert!(e.contains("append-only"), "{e}");
    let mut dropped: serde_json::Value = serde_json::from_slice(&catalog).unwrap();
    dropped["entries"].as_array_mut().unwrap().pop();
    dropped["generation"] = serde_json::json!(99);
    let e = store
        .put_if_absent(
            "catalog/0000000000000099.json",
            dropped.to_string().as_bytes(),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("drops or changes entry"), "{e}");
    drop(store);
    assert!(before == files(&repo), "something stored was changed");

    // A path outside the served directory is refused.
    let outside = sshd.url(&tmp.path().join("elsewhere"));
    let o = backup(&envs, &["list", "--repo", &outside]);
    assert_eq!(o.status.code(), Some(10), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("outside the directories this server serves"),
        "{}",
        stderr(&o)
    );

    // The server's own forget prunes; runs over ssh go on after it. (It
    // keeps the chain whole: here s1 stays for s2.)
    let local = repo.to_str().unwrap();
    ok(&backup(
        &[],
        &[
            "forget",
            "--repo",
            local,
            "--keep-last",
            "1",
            "--no-synthesize",
        ],
    ));
    ok(&backup(
        &envs,
        &["run", "--repo", &url, "--device", img, "snaps/s3"],
    ));
    let list: serde_json::Value =
        serde_json::from_str(&ok(&backup(&envs, &["list", "--repo", &url, "--json"]))).unwrap();
    let paths: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["snaps/s1", "snaps/s2", "snaps/s3"]);
    let to = tmp.path().join("to");
    fs::create_dir(&to).unwrap();
    ok(&backup(
        &envs,
        &[
            "restore",
            "--repo",
            &url,
            "--to",
            to.to_str().unwrap(),
            "snaps/s3",
        ],
    ));
    for snap in ["s1", "s2", "s3"] {
        assert_eq!(manifest(&to.join(snap)), kernel_manifest(snap), "{snap}");
    }
}

/// A far end between the client and the real `btrsend serve` that
/// changes what it answers, as the first argument says: `flip` flips a
/// byte in the data of every stream-file read; `short` answers a
/// stream-file read with one byte fewer (its length fixed to match);
/// `garbage` and `truncate` answer the fourth request with bytes that
/// are no frame, or half a frame, and hang up; `count=FILE` changes
/// nothing and keeps in FILE how many payload bytes it passed on.
const LIAR: &str = r#"
import collections, json, struct, subprocess, sys, threading
mode, real = sys.argv[1], sys.argv[2:]
p = subprocess.Popen(real, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
cin, cout = sys.stdin.buffer, sys.stdout.buffer
flags = collections.deque()
ready = threading.Condition()

def exact(f, n):
    b = b""
    while len(b) < n:
        c = f.read(n - len(b))
        if not c:
            return None
        b += c
    return b

def frame(f):
    lens = exact(f, 8)
    if lens is None:
        return None
    hl, pl = struct.unpack("<II", lens)
    return exact(f, hl), exact(f, pl)

def pack(h, pay):
    return struct.pack("<II", len(h), len(pay)) + h + pay

def up():
    while True:
        fr = frame(cin)
        if fr is None:
            p.stdin.close()
            return
        h, pay = fr
        m = json.loads(h)
        if m["op"] != "write":
            with ready:
                flags.append(m["op"] == "get" and m["key"].startswith("streams/"))
                ready.notify()
        p.stdin.write(pack(h, pay))
        p.stdin.flush()

threading.Thread(target=up, daemon=True).start()
answered = 0
follow = 0
data_bytes = 0
while True:
    fr = frame(p.stdout)
    if fr is None:
        break
    h, pay = fr
    m = json.loads(h)
    data_bytes += len(pay)
    if mode.startswith("count="):
        with open(mode[6:], "w") as f:
            f.write(str(data_bytes))
    if follow:
        follow -= 1
        cout.write(pack(h, pay))
        cout.flush()
        continue
    if m.get("reply") == "listing" and not m["done"]:
        cout.write(pack(h, pay))
        cout.flush()
        continue
    with ready:
        while not flags:
            ready.wait()
        stream = flags.popleft()
    answered += 1
    if m.get("reply") == "data":
        follow = m["more"]
        if stream and mode == "flip" and pay:
            pay = bytearray(pay)
            pay[len(pay) // 2] ^= 0x10
            pay = bytes(pay)
        if stream and mode == "short" and pay and not follow:
            pay = pay[:-1]
            m["len"] -= 1
            h = json.dumps(m).encode()
    if answered == 4 and mode == "garbage":
        cout.write(b"\xff\xfe not a frame at all " * 8)
        cout.flush()
        sys.exit(0)
    if answered == 4 and mode == "truncate":
        whole = pack(h, pay)
        cout.write(whole[: max(5, len(whole) // 2)])
        cout.flush()
        sys.exit(0)
    cout.write(pack(h, pay))
    cout.flush()
"#;

#[test]
fn a_far_end_that_lies_is_caught_and_nothing_wrong_is_restored() {
    let test = "a_far_end_that_lies_is_caught_and_nothing_wrong_is_restored";
    let tmp = tempfile::tempdir().unwrap();
    let Some(sshd) = SshServer::start(test, &tmp.path().join("sshd"), "") else {
        return;
    };
    if Command::new("python3").arg("-V").output().is_err() {
        btrsend::testing::skip_or_fail(test, "needs python3 for the lying far end");
        return;
    }
    let liar = tmp.path().join("liar.py");
    fs::write(&liar, LIAR).unwrap();
    let img = unpack(tmp.path(), FIX, "dev1.img");
    let repo = tmp.path().join("repo");
    let honest = sshd.envs();
    let url = sshd.url(&repo);
    ok(&backup(
        &honest,
        &["init", "--repo", &url, "--encryption", "none"],
    ));
    ok(&backup(
        &honest,
        &[
            "run",
            "--repo",
            &url,
            "--device",
            img.to_str().unwrap(),
            "snaps/s1",
            "snaps/s2",
        ],
    ));
    let lying = |mode: &str| {
        [
            ("BTRSEND_SSH", sshd.ssh_command()),
            (
                "BTRSEND_REMOTE_PATH",
                format!(
                    "python3 {} {mode} {}",
                    liar.display(),
                    env!("CARGO_BIN_EXE_btrsend")
                ),
            ),
        ]
    };
    // The honest far end through the same relay: everything as it is,
    // and verify --read-data checks the stream files where they lie,
    // reading only their trailers and first frames over ssh.
    let counted = tmp.path().join("counted");
    ok(&backup(
        &lying(&format!("count={}", counted.display())),
        &["verify", "--read-data", "--repo", &url],
    ));
    let passed: u64 = fs::read_to_string(&counted).unwrap().parse().unwrap();
    let stored: u64 = fs::read_dir(repo.join("streams"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    eprintln!("verify --read-data over ssh: {passed} payload bytes of {stored} stored");
    assert!(
        passed < stored / 2,
        "{passed} of {stored} bytes came over ssh"
    );
    let clean = |o: &Output, what: &str| {
        let err = stderr(o);
        assert!(!o.status.success(), "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert!(err.contains("btrsend: error:"), "{what}: {err}");
    };
    for mode in ["flip", "short", "garbage", "truncate"] {
        let envs = lying(mode);
        // verify, which reads the trailers over ssh: flipped bytes are
        // damage; a reply shorter than asked ends the connection.
        let v = backup(&envs, &["verify", "--repo", &url]);
        if mode == "flip" {
            assert_eq!(v.status.code(), Some(12), "{}", stderr(&v));
            assert!(stderr(&v).contains("btrsend: damage:"), "{}", stderr(&v));
        } else {
            clean(&v, &format!("{mode}: verify"));
        }
        let to = tmp.path().join(format!("to-{mode}"));
        fs::create_dir(&to).unwrap();
        let o = backup(
            &envs,
            &[
                "restore",
                "--repo",
                &url,
                "--to",
                to.to_str().unwrap(),
                "snaps/s2",
            ],
        );
        clean(&o, &format!("{mode}: restore --to"));
        assert_eq!(
            fs::read_dir(&to).unwrap().count(),
            0,
            "{mode}: something was restored"
        );
        let o = backup(&envs, &["restore", "--repo", &url, "--stdout", "snaps/s2"]);
        clean(&o, &format!("{mode}: restore --stdout"));
        assert!(o.stdout.is_empty(), "{mode}: bytes were written");
    }
    // The repository itself is sound.
    ok(&backup(&honest, &["verify", "--read-data", "--repo", &url]));
}
