//! `backup verify --against-source` on a series of snapshots made by the
//! project's random workload on a loop-mounted btrfs (root; see
//! `btrsend::testing` for the skip/fail policy), backed up from the image
//! by `backup run`:
//!
//! * every entry is proven by its stream made again;
//! * an entry whose catalog hash is changed (the stream made again no
//!   longer matches it) is proven by its content, and one whose index is
//!   gone as well differs (exit status 12);
//! * after a full balance of the mounted source every entry is still
//!   proven, by its stream or by its content;
//! * after a snapshot is deleted from the source, it and the snapshot
//!   whose stream is incremental from it are skipped, the others proven.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use btrsend::testing::workload::Workload;
use btrsend::testing::{self, LiveBtrfs};
use serde_json::Value;

use crate::common::{self, sh};

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
    let out = btrsend(&[
        "backup",
        "verify",
        "--repo",
        repo,
        "--against-source",
        "--device",
        img,
        "--json",
    ]);
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

    // A full balance moves every extent: whatever it changes in the
    // streams, every snapshot is still proven.
    sh(Command::new("btrfs")
        .args(["balance", "start", "--full-balance"])
        .arg(&mnt));
    sync();
    let (code, rep) = against(repo, &img);
    assert_eq!(code, Some(0), "{rep}");
    for (path, outcome, how) in outcomes(&rep) {
        assert_eq!(outcome, "proven", "{path}: {rep}");
        assert!(how == "stream" || how == "content", "{path}: {rep}");
    }

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
