//! Synthetic full streams (issue 34), live (root; see `btrsend::testing`
//! for the skip/fail policy): a seeded series of [`SNAPSHOTS`] snapshots
//! of the project's random workload (renames, hard links, reflinks,
//! holes, xattrs) on a btrfs mounted with `compress=zstd`, stored by
//! `backup run` as one chain, then `forget --keep-last 3`: the oldest
//! kept entry's stream becomes a synthetic full stream and the rest of
//! the chain goes. Judged by the kernel's mount of each snapshot (its
//! manifest; hole maps and the mtimes of directories a chain leaves
//! orphans in are exempt, as in `backup_series`):
//!
//! * the catalog: one full entry (synthesized from the chain up to it)
//!   and two incremental ones on it, three stream files, fewer bytes than
//!   before, the synthetic full within twice the kernel's full stream of
//!   that snapshot compressed alike;
//! * every kept snapshot restores by `restore --to` (btrsend's receiver)
//!   and `restore --stdout | btrfs receive` (the kernel's), and, for the
//!   unencrypted repository, by `zstd -dc` of each stream file of its
//!   chain in order into the stock `btrfs receive`;
//! * `verify --read-data` passes, and a next `backup run` stores an
//!   incremental stream on top of the kept chain, which restores too.

use std::process::{Command, Output, Stdio};

use btrsend::manifest::{self, Options};
use btrsend::testing::workload::Workload;
use btrsend::testing::{self, LiveBtrfs, Tmpfs};
use serde_json::Value;

use crate::common::{self, sh};

/// Snapshots in the series.
const SNAPSHOTS: usize = 12;
/// Random operations that make the first tree.
const POPULATE: usize = 200;
/// Random operations between two snapshots.
const OPS: usize = 100;

#[test]
fn forget_synthesizes_a_full_stream_that_restores_plain() {
    case(
        "forget_synthesizes_a_full_stream_that_restores_plain",
        0x5e_0001,
        false,
    );
}

#[test]
fn forget_synthesizes_a_full_stream_that_restores_encrypted() {
    case(
        "forget_synthesizes_a_full_stream_that_restores_encrypted",
        0x5e_0002,
        true,
    );
}

/// The repository and how commands reach it.
struct Repo {
    spec: String,
    encrypted: bool,
}

impl Repo {
    fn output(&self, args: &[&str]) -> Output {
        let mut c = common::btrsend();
        c.env_remove("BTRSEND_PASSWORD")
            .env_remove("BTRSEND_PASSWORD_FILE")
            .env("BTRSEND_SCRYPT_LOG_N", "10");
        if self.encrypted {
            c.env("BTRSEND_PASSWORD", "synthesize passphrase");
        }
        c.arg("backup")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// The stdout of `backup SUB --repo REPO ARGS`, which must succeed.
    fn ok(&self, sub: &str, args: &[&str]) -> Vec<u8> {
        let mut all = vec![sub, "--repo", &self.spec];
        all.extend_from_slice(args);
        let o = self.output(&all);
        assert!(
            o.status.success(),
            "backup {all:?}: exit {:?}: {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        );
        o.stdout
    }

    /// `backup list --json`.
    fn entries(&self) -> Vec<Value> {
        let v: Value = serde_json::from_slice(&self.ok("list", &["--json"])).unwrap();
        v.as_array().unwrap().clone()
    }
}

/// The manifest of `got` against the kernel's `want`, both without hole
/// maps, the mtimes of `exempt` directories taken from `want`.
fn same(what: &str, want: &str, got: &str, exempt: &[String], seed: u64) {
    let got = testing::compare::exempt_mtimes(want, got, exempt);
    if let Some(d) = manifest::diff(
        &manifest::strip_holes(want),
        &manifest::strip_holes(&got),
        30,
    ) {
        panic!("seed {seed:#x}: {what} differs from the kernel mount:\n{d}");
    }
}

fn case(test: &str, seed: u64, encrypted: bool) {
    if !testing::require_live(test) {
        return;
    }
    let live = LiveBtrfs::with_options(4 << 30, &[], "compress=zstd").unwrap();
    let mnt = live.path().to_path_buf();
    let vol = mnt.join("vol");
    std::fs::create_dir(mnt.join("snaps")).unwrap();
    sh(Command::new("btrfs")
        .args(["-q", "subvolume", "create"])
        .arg(&vol));
    let mut w = Workload::new(&vol, seed);
    let snapshot = |w: &mut Workload, i: usize| {
        let step = if i == 0 {
            w.populate(POPULATE)
        } else {
            w.run(OPS)
        };
        step.unwrap_or_else(|e| panic!("seed {seed:#x}: workload: {e}"));
        sh(Command::new("btrfs")
            .args(["-q", "subvolume", "snapshot", "-r"])
            .arg(&vol)
            .arg(mnt.join(format!("snaps/vol.{i}"))));
        sh(Command::new("sync").arg("-f").arg(&mnt));
    };
    for i in 0..SNAPSHOTS {
        snapshot(&mut w, i);
    }
    let kernel = |i: usize| {
        live.manifest(&format!("snaps/vol.{i}"), Options::default())
            .unwrap()
    };

    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("repo");
    let r = Repo {
        spec: files.to_str().unwrap().to_owned(),
        encrypted,
    };
    let enc = if encrypted { "passphrase" } else { "none" };
    r.ok("init", &["--encryption", enc]);
    let img = live.image().to_str().unwrap().to_owned();
    let run = |which: &str| r.ok("run", &["--device", &img, "--full-every", "100", which]);
    run("snaps/vol.*");
    let before = r.entries();
    let kinds: Vec<&str> = before.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.len(), SNAPSHOTS);
    assert!(
        kinds[0] == "full" && kinds[1..].iter().all(|k| *k == "incremental"),
        "{kinds:?}"
    );
    let ids: Vec<u64> = before.iter().map(|e| e["id"].as_u64().unwrap()).collect();
    let bytes =
        |es: &[Value]| -> u64 { es.iter().map(|e| e["stored_bytes"].as_u64().unwrap()).sum() };

    // The dry run says what would happen, and does nothing.
    let rows: Value =
        serde_json::from_slice(&r.ok("forget", &["--keep-last", "3", "--dry-run", "--json"]))
            .unwrap();
    let rows = rows.as_array().unwrap();
    let first_kept = ids[SNAPSHOTS - 3];
    for row in rows {
        let id = row["id"].as_u64().unwrap();
        let kept = id >= first_kept;
        assert_eq!(row["action"], if kept { "keep" } else { "delete" }, "{row}");
        assert_eq!(row["synthesize"], id == first_kept, "{row}");
    }
    assert_eq!(r.entries(), before);

    let text = String::from_utf8(r.ok("forget", &["--keep-last", "3"])).unwrap();
    assert!(
        text.is_empty(),
        "forget prints nothing without a terminal: {text}"
    );
    let after = r.entries();
    let kept: Vec<(u64, &str, Option<u64>)> = after
        .iter()
        .map(|e| {
            (
                e["id"].as_u64().unwrap(),
                e["kind"].as_str().unwrap(),
                e["parent_id"].as_u64(),
            )
        })
        .collect();
    let (k0, k1, k2) = (ids[SNAPSHOTS - 3], ids[SNAPSHOTS - 2], ids[SNAPSHOTS - 1]);
    assert_eq!(
        kept,
        [
            (k0, "full", None),
            (k1, "incremental", Some(k0)),
            (k2, "incremental", Some(k1))
        ]
    );
    assert_eq!(
        after[0]["synthesized_from"],
        serde_json::json!(ids[..SNAPSHOTS - 2])
    );
    for (b, a) in before[SNAPSHOTS - 3..].iter().zip(&after) {
        assert_eq!((&a["uuid"], &a["ctransid"]), (&b["uuid"], &b["ctransid"]));
    }
    assert_eq!(std::fs::read_dir(files.join("streams")).unwrap().count(), 3);
    let (was, now) = (bytes(&before), bytes(&after));
    assert!(now < was, "{now} bytes stored after, {was} before");
    // The kernel's full stream of that snapshot, compressed as the
    // repository compresses (zstd -3): the synthetic one writes shared
    // data once per file, so it may be larger, but not by much.
    let full = live.scratch_dir().join("kernel-full.stream");
    sh(Command::new("btrfs")
        .args(["-q", "send", "-f"])
        .arg(&full)
        .arg(mnt.join(format!("snaps/vol.{}", SNAPSHOTS - 3))));
    let z = sh(Command::new("zstd").args(["-3", "-c", "-q"]).arg(&full)).stdout;
    let synthetic = after[0]["stored_bytes"].as_u64().unwrap();
    eprintln!(
        "{test}: {was} bytes stored before, {now} after; synthetic full {synthetic} bytes, kernel's full {} compressed",
        z.len()
    );
    assert!(
        synthetic <= 2 * z.len() as u64,
        "synthetic full of {synthetic} bytes, kernel's {} compressed",
        z.len()
    );
    r.ok("verify", &["--read-data"]);

    // Every kept snapshot restores, three ways.
    let tmpfs = Tmpfs::new(1 << 30).unwrap();
    let check = |i: usize, chain_files: &[String]| {
        let path = format!("snaps/vol.{i}");
        let name = format!("vol.{i}");
        let want = kernel(i);
        let chain = r.ok("restore", &["--stdout", &path]);
        let exempt = testing::compare::orphan_dirs_without_utimes(chain.as_slice()).unwrap();
        let to = tmpfs.path().join(format!("to{i}"));
        std::fs::create_dir(&to).unwrap();
        r.ok("restore", &["--to", to.to_str().unwrap(), &path]);
        let got = manifest::manifest(&to.join(&name), Options::default()).unwrap();
        same(
            &format!("{path} by restore --to"),
            &want,
            &got,
            &exempt,
            seed,
        );
        std::fs::remove_dir_all(&to).unwrap();
        let file = live.scratch_dir().join("chain.stream");
        std::fs::write(&file, &chain).unwrap();
        let dest = format!("recv{i}");
        live.receive(&dest, &[&file]).unwrap();
        let got = live
            .manifest(&format!("{dest}/{name}"), Options::default())
            .unwrap();
        same(
            &format!("{path} by restore --stdout | btrfs receive"),
            &want,
            &got,
            &exempt,
            seed,
        );
        if !encrypted {
            // The stream files themselves, in chain order, into the stock
            // receiver.
            let dest = format!("zstd{i}");
            for f in chain_files {
                let one = live.scratch_dir().join("one.stream");
                let out = sh(Command::new("zstd").args(["-dc", "-q"]).arg(files.join(f)));
                std::fs::write(&one, &out.stdout).unwrap();
                live.receive(&dest, &[&one]).unwrap();
            }
            let got = live
                .manifest(&format!("{dest}/{name}"), Options::default())
                .unwrap();
            same(
                &format!("{path} by zstd -dc of its stream files | btrfs receive"),
                &want,
                &got,
                &exempt,
                seed,
            );
        }
        eprintln!("{test}: {path}: restored and received");
    };
    let file_of = |e: &Value| e["file"].as_str().unwrap().to_owned();
    let chain_files: Vec<String> = after.iter().map(file_of).collect();
    for n in 1..=3 {
        check(SNAPSHOTS - 4 + n, &chain_files[..n]);
    }

    // The next run stores an incremental stream on the kept chain (the
    // snapshots forget dropped are still on the source: the run is told
    // the new one only).
    snapshot(&mut w, SNAPSHOTS);
    run(&format!("snaps/vol.{SNAPSHOTS}"));
    let next = r.entries();
    let last = next.last().unwrap();
    assert_eq!(last["path"], format!("snaps/vol.{SNAPSHOTS}"));
    assert_eq!(last["kind"], "incremental");
    assert_eq!(last["parent_id"], k2);
    let mut chain_files = chain_files;
    chain_files.push(file_of(last));
    check(SNAPSHOTS, &chain_files);
    r.ok("verify", &["--read-data"]);
}
