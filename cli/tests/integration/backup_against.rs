//! `backup verify --against-source` on a series of snapshots made by the
//! project's random workload on a loop-mounted btrfs (root; see
//! `btrsend::testing` for the skip/fail policy), backed up from the image
//! by `backup run`:
//!
//! * every entry is proven by its stream made again, in an S3 copy of
//!   the repository too, with its stream objects deleted (nothing but the
//!   catalog is read);
//! * an entry whose catalog hash is changed (the stream made again no
//!   longer matches it) is proven by its content, and one whose index is
//!   gone as well differs (exit status 12);
//! * after a full balance of the mounted source every entry is still
//!   proven: by its stream exactly where `btrsend send` makes the stored
//!   bytes again (checked apart from verify), else by its content;
//! * after a snapshot is deleted from the source, it and the snapshot
//!   whose stream is incremental from it are skipped, the others proven.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use btrsend::testing::workload::Workload;
use btrsend::testing::{self, LiveBtrfs};
use serde_json::Value;

use crate::common::{self, sh};
use crate::repo_store::{Backend, Kind};

/// Snapshots in the series.
const SNAPSHOTS: usize = 5;

fn btrsend(args: &[&str]) -> Output {
    common::btrsend()
        .args(args)
        .output()
        .expect("spawn btrsend")
}

fn ok(args: &[&str]) -> Output {
    let out = btrsend(args);
    assert!(
        out.status.success(),
        "btrsend {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The newest catalog generation's file and its JSON.
fn newest_catalog(repo: &Path) -> (PathBuf, Value) {
    let mut gens: Vec<PathBuf> = std::fs::read_dir(repo.join("catalog"))
        .unwrap()
        .map(|d| d.unwrap().path())
        .collect();
    gens.sort();
    let path = gens.pop().expect("a catalog generation");
    let v = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    (path, v)
}

/// Store `cat` as the next catalog generation.
fn store_catalog(repo: &Path, mut cat: Value) {
    let g = cat["generation"].as_u64().unwrap() + 1;
    cat["generation"] = g.into();
    std::fs::write(
        repo.join(format!("catalog/{g:016}.json")),
        serde_json::to_vec(&cat).unwrap(),
    )
    .unwrap();
}

/// `verify --against-source --json`: its exit status and report.
fn against(repo: &str, img: &str) -> (Option<i32>, Value) {
    against_with(repo, img, &[])
}

/// [`against`] with these environment variables (an S3 server's).
fn against_with(repo: &str, img: &str, envs: &[(&str, String)]) -> (Option<i32>, Value) {
    let out = common::btrsend()
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .args([
            "backup",
            "verify",
            "--repo",
            repo,
            "--against-source",
            "--device",
            img,
            "--json",
        ])
        .output()
        .expect("spawn btrsend");
    let text = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{e}: {text}\n{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), v)
}

/// Per snapshot path: (outcome, comparison).
fn outcomes(rep: &Value) -> Vec<(String, String, String)> {
    rep["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_owned(),
                c["outcome"].as_str().unwrap().to_owned(),
                c["comparison"].as_str().unwrap_or("none").to_owned(),
            )
        })
        .collect()
}

#[test]
fn verify_against_source_proves_a_series_and_skips_what_is_gone() {
    const TEST: &str = "verify_against_source_proves_a_series_and_skips_what_is_gone";
    if !testing::require_live(TEST) {
        return;
    }
    let live = LiveBtrfs::with_options(1 << 30, &[], "").expect("scratch btrfs");
    let mnt = live.path().to_path_buf();
    let vol = mnt.join("vol");
    std::fs::create_dir(mnt.join("snaps")).unwrap();
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "create"])
        .arg(&vol));
    let mut w = Workload::new(&vol, 35);
    let paths: Vec<String> = (0..SNAPSHOTS).map(|i| format!("snaps/vol.{i}")).collect();
    for (i, p) in paths.iter().enumerate() {
        let step = if i == 0 { w.populate(200) } else { w.run(100) };
        step.unwrap_or_else(|e| panic!("workload: {e}\n{}", w.log().join("\n")));
        // Clones, for a balance to move.
        if i == 0 {
            std::fs::write(vol.join("big"), vec![0x5a; 3 << 20]).unwrap();
            sh(Command::new("cp")
                .arg("--reflink=always")
                .arg(vol.join("big"))
                .arg(vol.join("big.clone")));
        }
        sh(Command::new("btrfs")
            .args(["-q", "subvolume", "snapshot", "-r"])
            .arg(&vol)
            .arg(mnt.join(p)));
    }
    let sync = || {
        sh(Command::new("btrfs")
            .args(["-q", "subvolume", "sync"])
            .arg(&mnt));
        sh(Command::new("sync").arg("-f").arg(&mnt));
    };
    sync();
    let img = live.image().to_str().unwrap().to_owned();
    let work = tempfile::tempdir().unwrap();
    let repo_dir = work.path().join("repo");
    let repo = repo_dir.to_str().unwrap();
    ok(&["backup", "init", "--repo", repo, "--encryption", "none"]);
    ok(&[
        "backup",
        "run",
        "--repo",
        repo,
        "--device",
        &img,
        "snaps/vol.*",
    ]);
    let all_by = |how: &str| -> Vec<(String, String, String)> {
        paths
            .iter()
            .map(|p| (p.clone(), String::from("proven"), how.to_owned()))
            .collect()
    };

    // Every stream made again is the stored one.
    let (code, rep) = against(repo, &img);
    assert_eq!(code, Some(0), "{rep}");
    assert_eq!(outcomes(&rep), all_by("stream"), "{rep}");
    assert_eq!(rep["proven"], SNAPSHOTS, "{rep}");

    // An S3 copy is proven from its catalog alone: with every stream
    // object gone from the bucket.
    if let Some(backend) = Backend::new(Kind::S3, TEST, work.path()) {
        let s3 = backend.repo("s3");
        let envs = backend.envs();
        for args in [
            vec!["init", "--repo", &s3.spec, "--encryption", "none"],
            vec!["copy", "--from", repo, "--to", &s3.spec],
        ] {
            let out = common::btrsend()
                .envs(envs.iter().map(|(k, v)| (k, v)))
                .arg("backup")
                .args(&args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let streams = s3.files.join("streams");
        let gone = std::fs::read_dir(&streams).unwrap().count();
        assert_eq!(gone, SNAPSHOTS);
        std::fs::remove_dir_all(&streams).unwrap();
        let (code, rep) = against_with(&s3.spec, &img, &envs);
        assert_eq!(code, Some(0), "{rep}");
        assert_eq!(outcomes(&rep), all_by("stream"), "{rep}");
    }

    // A stored stream this send does not make (its hash, in the catalog
    // and in the stream file's trailer, is another's), of the same
    // content: the content decides.
    let (_, original) = newest_catalog(&repo_dir);
    let mut changed = original.clone();
    let e = &mut changed["entries"][2];
    assert_eq!(e["path"], paths[2]);
    let was = e["stream_blake3"].as_str().unwrap().to_owned();
    let other = blake3::hash(b"not the stream").to_hex().to_string();
    e["stream_blake3"] = other.clone().into();
    let stream_file = repo_dir.join(e["file"].as_str().unwrap());
    let stored = std::fs::read(&stream_file).unwrap();
    let mut text = stored.clone();
    let at = text
        .windows(was.len())
        .rposition(|w| w == was.as_bytes())
        .expect("the trailer names the stream's hash");
    text[at..at + was.len()].copy_from_slice(other.as_bytes());
    std::fs::write(&stream_file, &text).unwrap();
    store_catalog(&repo_dir, changed.clone());
    let (code, rep) = against(repo, &img);
    assert_eq!(code, Some(0), "{rep}");
    let mut want = all_by("stream");
    want[2].2 = String::from("content");
    assert_eq!(outcomes(&rep), want, "{rep}");
    // Without its index the content cannot prove it either: damage.
    let file = changed["entries"][2]["file"].as_str().unwrap().to_owned();
    let name = file
        .strip_prefix("streams/")
        .and_then(|n| n.strip_suffix(".btrs.zst"))
        .unwrap();
    let index_root = repo_dir.join(format!("index/r{name}.json"));
    let kept = std::fs::read(&index_root).expect("the entry's index root");
    std::fs::remove_file(&index_root).unwrap();
    let (code, rep) = against(repo, &img);
    assert_eq!(code, Some(12), "{rep}");
    want[2] = (
        paths[2].clone(),
        String::from("differs"),
        String::from("stream"),
    );
    assert_eq!(outcomes(&rep), want, "{rep}");
    assert_eq!(rep["differs"], 1, "{rep}");
    std::fs::write(&index_root, kept).unwrap();
    std::fs::write(&stream_file, &stored).unwrap();
    store_catalog(&repo_dir, {
        let mut c = original.clone();
        c["generation"] = changed["generation"].as_u64().unwrap().into();
        c
    });
    let (code, rep) = against(repo, &img);
    assert_eq!(code, Some(0), "{rep}");
    assert_eq!(outcomes(&rep), all_by("stream"), "{rep}");

    // Whether a stream is still what a send makes is found apart from
    // verify: each snapshot sent again with `btrsend send` from its stored
    // parent, compared byte for byte with the stored stream. Before the
    // balance every one is the same (which checks the method).
    let (_, cat) = newest_catalog(&repo_dir);
    let work_dir = work.path().to_path_buf();
    let resent_equal = || -> Vec<bool> {
        let entries = cat["entries"].as_array().unwrap();
        entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let out = work_dir.join(format!("resent.{i}"));
                let proto = e["proto"].as_u64().unwrap().to_string();
                let mut args = vec![
                    String::from("send"),
                    String::from("--device"),
                    img.clone(),
                    String::from("--proto"),
                    proto,
                    String::from("-f"),
                    out.to_str().unwrap().to_owned(),
                ];
                if let Some(parent) = e["parent_id"].as_u64() {
                    let p = entries.iter().find(|p| p["id"].as_u64() == Some(parent));
                    args.push(String::from("-p"));
                    args.push(p.unwrap()["path"].as_str().unwrap().to_owned());
                }
                args.push(e["path"].as_str().unwrap().to_owned());
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                ok(&args);
                let stored_file = std::fs::File::open(repo_dir.join(e["file"].as_str().unwrap()));
                let stored = zstd::decode_all(stored_file.unwrap()).unwrap();
                std::fs::read(&out).unwrap() == stored
            })
            .collect()
    };
    assert_eq!(resent_equal(), vec![true; SNAPSHOTS], "before the balance");

    // A full balance moves every extent (the clones too): each snapshot
    // is still proven, by its stream where the send makes the stored bytes
    // again, else by its content.
    sh(Command::new("btrfs")
        .args(["balance", "start", "--full-balance"])
        .arg(&mnt));
    sync();
    let equal = resent_equal();
    let (code, rep) = against(repo, &img);
    assert_eq!(code, Some(0), "{rep}");
    let want: Vec<(String, String, String)> = paths
        .iter()
        .zip(&equal)
        .map(|(p, &same)| {
            let how = if same { "stream" } else { "content" };
            (p.clone(), String::from("proven"), how.to_owned())
        })
        .collect();
    assert_eq!(
        outcomes(&rep),
        want,
        "stream equal after the balance: {equal:?}\n{rep}"
    );
    eprintln!("{TEST}: streams equal after a full balance: {equal:?}");

    // A deleted snapshot is skipped, and so is the one whose stream is
    // incremental from it (a single run: each from the one before).
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "delete"])
        .arg(mnt.join(&paths[2])));
    sync();
    let (code, rep) = against(repo, &img);
    assert_eq!(code, Some(0), "{rep}");
    let got = outcomes(&rep);
    for (i, (path, outcome, _)) in got.iter().enumerate() {
        let want = if i == 2 || i == 3 {
            "skipped"
        } else {
            "proven"
        };
        assert_eq!(outcome, want, "{path}: {rep}");
    }
    let detail = |i: usize| rep["checks"][i]["detail"].as_str().unwrap().to_owned();
    assert!(detail(2).contains("its snapshot"), "{rep}");
    assert!(detail(3).contains("its parent's snapshot"), "{rep}");
    assert_eq!(rep["skipped"], 2, "{rep}");
}

/// Restore `path` from `repo` with btrsend's receiver into `to` and
/// compare it with the kernel's manifest of the snapshot (`expected`),
/// but for the mtimes of directories whose orphans the chain creates
/// without their UTIMES (see `backup_series`).
fn check_restore(repo: &str, path: &str, expected: &str, to: &Path) {
    use btrsend::manifest::{self, Options};
    let chain = ok(&["backup", "restore", "--repo", repo, "--stdout", path]).stdout;
    let exempt = testing::compare::orphan_dirs_without_utimes(chain.as_slice()).unwrap();
    std::fs::create_dir_all(to).unwrap();
    ok(&[
        "backup",
        "restore",
        "--repo",
        repo,
        "--to",
        to.to_str().unwrap(),
        path,
    ]);
    let name = Path::new(path).file_name().unwrap();
    let got = manifest::manifest(&to.join(name), Options::default()).unwrap();
    let got = testing::compare::exempt_mtimes(expected, &got, &exempt);
    if let Some(d) = manifest::diff(
        &manifest::strip_holes(expected),
        &manifest::strip_holes(&got),
        30,
    ) {
        panic!("{path} restored differs from the kernel's snapshot:\n{d}");
    }
    std::fs::remove_dir_all(to).unwrap();
}

/// The stream file of entry `i` (catalog order) of the repository in
/// `dir`.
fn stream_file(dir: &Path, i: usize) -> PathBuf {
    let (_, cat) = newest_catalog(dir);
    dir.join(cat["entries"][i]["file"].as_str().unwrap())
}

/// Flip one byte in the middle of a stream file.
fn flip_byte(file: &Path) {
    let mut b = std::fs::read(file).unwrap();
    let at = b.len() / 3;
    b[at] ^= 0x40;
    std::fs::write(file, b).unwrap();
}

#[test]
fn repair_stores_deleted_and_flipped_streams_again() {
    const TEST: &str = "repair_stores_deleted_and_flipped_streams_again";
    if !testing::require_live(TEST) {
        return;
    }
    let live = LiveBtrfs::with_options(1 << 30, &[], "").expect("scratch btrfs");
    let mnt = live.path().to_path_buf();
    let vol = mnt.join("vol");
    std::fs::create_dir(mnt.join("snaps")).unwrap();
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "create"])
        .arg(&vol));
    let mut w = Workload::new(&vol, 3535);
    let paths: Vec<String> = (0..3).map(|i| format!("snaps/vol.{i}")).collect();
    let mut expected = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let step = if i == 0 { w.populate(150) } else { w.run(80) };
        step.unwrap_or_else(|e| panic!("workload: {e}\n{}", w.log().join("\n")));
        sh(Command::new("btrfs")
            .args(["-q", "subvolume", "snapshot", "-r"])
            .arg(&vol)
            .arg(mnt.join(p)));
        expected.push(
            live.manifest(p, btrsend::manifest::Options::default())
                .unwrap(),
        );
    }
    sh(Command::new("sync").arg("-f").arg(&mnt));
    let img = live.image().to_str().unwrap().to_owned();
    let work = tempfile::tempdir().unwrap();
    let a_dir = work.path().join("a");
    let b_dir = work.path().join("b");
    let (a, b) = (a_dir.to_str().unwrap(), b_dir.to_str().unwrap());
    for r in [a, b] {
        ok(&["backup", "init", "--repo", r, "--encryption", "none"]);
    }
    ok(&[
        "backup",
        "run",
        "--repo",
        a,
        "--device",
        &img,
        "snaps/vol.*",
    ]);
    ok(&["backup", "copy", "--from", a, "--to", b]);
    let verify = |r: &str| {
        btrsend(&["backup", "verify", "--repo", r, "--read-data"])
            .status
            .code()
    };
    let restore_dir = work.path().join("restored");

    for (how, extra) in [("source", ["--device", img.as_str()]), ("b", ["--from", b])] {
        // A deleted stream file (the middle of the chain) and a flipped
        // byte (its end).
        std::fs::remove_file(stream_file(&a_dir, 1)).unwrap();
        flip_byte(&stream_file(&a_dir, 2));
        assert_eq!(verify(a), Some(12), "{how}: the damage is not found");
        let out = ok(&[
            "backup", "repair", "--repo", a, extra[0], extra[1], "--json",
        ]);
        let rep: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(rep["damaged"], 2, "{how}: {rep}");
        let repaired: Vec<(&str, &str)> = rep["repaired"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["path"].as_str().unwrap(), r["from"].as_str().unwrap()))
            .collect();
        let from = if how == "source" { "source" } else { b };
        assert_eq!(
            repaired,
            [(paths[1].as_str(), from), (paths[2].as_str(), from)],
            "{how}: {rep}"
        );
        assert_eq!(verify(a), Some(0), "{how}: not repaired");
        // Every stream file the catalog names is there, and no other.
        let (_, cat) = newest_catalog(&a_dir);
        let mut named: Vec<String> = cat["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["file"].as_str().unwrap().to_owned())
            .collect();
        named.sort();
        let mut present: Vec<String> = std::fs::read_dir(a_dir.join("streams"))
            .unwrap()
            .map(|d| format!("streams/{}", d.unwrap().file_name().to_str().unwrap()))
            .collect();
        present.sort();
        assert_eq!(named, present, "{how}");
        for (p, want) in paths.iter().zip(&expected) {
            check_restore(a, p, want, &restore_dir);
        }
        // The index follows the new files.
        ok(&["backup", "ls", "--repo", a, &paths[2]]);
    }
    // Driven by a config file: the job's device is the source of verify
    // --against-source and of repair, and each writes its metrics file
    // (parsed by prometheus_client), labelled with the job, the
    // destination and the command. All three snapshots are still on the
    // source and stored unchanged, so all three are proven; one deleted
    // stream file is the one damaged and repaired.
    let config = work.path().join("btrsend.toml");
    std::fs::write(
        &config,
        format!(
            "[job.vol]\ndevice = \"{img}\"\nsnapshots = \"snaps/vol.*\"\n\
             [[job.vol.destination]]\nrepo = \"{a}\"\n"
        ),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    let labels = |command: &'static str| [("job", "vol"), ("destination", a), ("command", command)];
    let prom = work.path().join("verify.prom");
    let prom_s = prom.to_str().unwrap();
    ok(&[
        "backup",
        "verify",
        "--config",
        cfg,
        "--against-source",
        "--metrics-file",
        prom_s,
    ]);
    if let Some(m) = crate::backup_status::parse_metrics(TEST, &prom) {
        let v = |name: &str| crate::backup_status::sample(&m, name, &labels("verify"));
        assert_eq!(v("btrsend_verify_against_source_proven"), 3.0);
        assert_eq!(v("btrsend_verify_against_source_differing"), 0.0);
        assert_eq!(v("btrsend_verify_against_source_skipped"), 0.0);
        assert_eq!(v("btrsend_verify_problems"), 0.0);
        assert_eq!(v("btrsend_last_attempt_exit_status"), 0.0);
    }
    std::fs::remove_file(stream_file(&a_dir, 1)).unwrap();
    assert_eq!(verify(a), Some(12));
    let prom = work.path().join("repair.prom");
    ok(&[
        "backup",
        "repair",
        "--config",
        cfg,
        "--metrics-file",
        prom.to_str().unwrap(),
    ]);
    assert_eq!(verify(a), Some(0), "not repaired from the job's device");
    if let Some(m) = crate::backup_status::parse_metrics(TEST, &prom) {
        let v = |name: &str| crate::backup_status::sample(&m, name, &labels("repair"));
        assert_eq!(v("btrsend_repair_damaged"), 1.0);
        assert_eq!(v("btrsend_repair_repaired"), 1.0);
        assert_eq!(v("btrsend_repair_failed"), 0.0);
        assert_eq!(v("btrsend_last_attempt_exit_status"), 0.0);
    }

    // A stream the source no longer makes is not stored: after the
    // snapshot is gone, repair from the source alone fails.
    std::fs::remove_file(stream_file(&a_dir, 2)).unwrap();
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "delete"])
        .arg(mnt.join(&paths[2])));
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "sync"])
        .arg(&mnt));
    sh(Command::new("sync").arg("-f").arg(&mnt));
    let out = btrsend(&["backup", "repair", "--repo", a, "--device", &img]);
    assert_eq!(out.status.code(), Some(12));
    assert_eq!(verify(a), Some(12));
}
