//! `btrsend list --json` (issue 15): every row's times, transids, UUIDs and
//! read-only flag equal what btrfs-progs reads from the kernel-made
//! filesystem — `btrfs inspect-internal dump-tree -t root` (every time to
//! the nanosecond, every transid) and `btrfs subvolume show` on the mount
//! (creation time, UUIDs, flags, generation at creation). The filesystem
//! holds a subvolume, a read-only snapshot of it and a received copy of that
//! snapshot, so send and receive times are set on one row.

use std::collections::BTreeMap;
use std::process::Command;

use btrsend::testing::{self, LiveBtrfs};

use crate::common::btrsend;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// `ROOT_ITEM` fields of every subvolume (id 5 or ≥ 256) in `dump-tree -t
/// root` output: id → {field → value}, times as `SEC.NSEC`.
fn dump_tree_roots(text: &str) -> BTreeMap<u64, BTreeMap<String, String>> {
    let mut roots = BTreeMap::new();
    let mut cur: Option<u64> = None;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("item ") {
            cur = None;
            if let Some(key) = t.split("key (").nth(1)
                && key.contains(" ROOT_ITEM ")
            {
                let obj = key.split(' ').next().unwrap_or("");
                let id = if obj == "FS_TREE" {
                    Some(5)
                } else {
                    obj.parse().ok()
                };
                cur = id.filter(|&i| i == 5 || i >= 256);
                if let Some(i) = cur {
                    roots.insert(i, BTreeMap::new());
                }
            }
            continue;
        }
        let Some(id) = cur else { continue };
        let fields = roots.get_mut(&id).unwrap();
        let words: Vec<&str> = t.split_whitespace().collect();
        match words.first().copied() {
            Some("ctime" | "otime" | "stime" | "rtime") => {
                fields.insert(words[0].to_owned(), words[1].to_owned());
            }
            Some("uuid" | "parent_uuid" | "received_uuid") => {
                fields.insert(words[0].to_owned(), words[1].to_owned());
            }
            Some("ctransid") => {
                for pair in words.chunks(2) {
                    fields.insert(pair[0].to_owned(), pair[1].to_owned());
                }
            }
            Some("last_snapshot") => {
                // "last_snapshot N flags 0x1(RDONLY) refs 1"
                fields.insert("flags".to_owned(), words[3].to_owned());
            }
            _ => {}
        }
    }
    roots
}

/// `SEC.NSEC` of a JSON RFC 3339 time, or `0.0` for null.
fn sec_nsec(v: &serde_json::Value) -> String {
    match v.as_str() {
        None => "0.0".to_owned(),
        Some(s) => {
            let ts: jiff::Timestamp = s.parse().expect("RFC 3339");
            format!("{}.{}", ts.as_second(), ts.subsec_nanosecond())
        }
    }
}

/// The value after `key:` in `btrfs subvolume show` output.
fn show_field<'a>(show: &'a str, key: &str) -> &'a str {
    show.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}:")))
        .map_or("", str::trim)
}

#[test]
fn list_json_times_match_dump_tree_and_subvolume_show() {
    if !testing::require_live("list_json_times_match_dump_tree_and_subvolume_show") {
        return;
    }
    let fs = LiveBtrfs::with_options(512 << 20, &[], "").expect("live btrfs");
    let m = fs.path();
    run(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(m.join("sv")));
    std::fs::write(m.join("sv/f"), b"data").unwrap();
    run(Command::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(m.join("sv"))
        .arg(m.join("snap")));
    std::fs::create_dir(m.join("recv")).unwrap();
    let stream = fs.scratch_dir().join("snap.stream");
    run(Command::new("btrfs")
        .args(["send", "-q", "-f"])
        .arg(&stream)
        .arg(m.join("snap")));
    run(Command::new("btrfs")
        .args(["receive", "-q", "-f"])
        .arg(&stream)
        .arg(m.join("recv")));
    run(Command::new("sync").arg("-f").arg(m));
    run(Command::new("btrfs").args(["filesystem", "sync"]).arg(m));

    let roots = dump_tree_roots(&run(Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "root"])
        .arg(fs.image())));
    let json = run(btrsend()
        .args(["list", "--json", "--device"])
        .arg(fs.image()));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&json).expect("JSON array");
    assert_eq!(rows.len(), 3, "sv, snap, recv/snap:\n{json}");
    let mut saw_received = false;
    for row in &rows {
        let id = row["id"].as_u64().expect("id");
        let path = row["path"].as_str().expect("path");
        let want = roots
            .get(&id)
            .unwrap_or_else(|| panic!("no ROOT_ITEM {id} in dump-tree"));
        for t in ["otime", "ctime", "stime", "rtime"] {
            assert_eq!(sec_nsec(&row[t]), want[t], "{path} {t}");
        }
        for t in ["ctransid", "otransid", "stransid", "rtransid"] {
            assert_eq!(row[t].as_u64().unwrap().to_string(), want[t], "{path} {t}");
        }
        for u in ["uuid", "parent_uuid", "received_uuid"] {
            let got = row[u]
                .as_str()
                .unwrap_or("00000000-0000-0000-0000-000000000000");
            assert_eq!(got, want[u], "{path} {u}");
        }
        assert_eq!(
            row["readonly"].as_bool().unwrap(),
            want["flags"].contains("RDONLY"),
            "{path} readonly"
        );
        // And as `btrfs subvolume show` prints them on the mount.
        let show = run(Command::new("btrfs")
            .args(["subvolume", "show"])
            .arg(m.join(path)));
        let created =
            jiff::Timestamp::strptime("%Y-%m-%d %H:%M:%S %z", show_field(&show, "Creation time"))
                .expect("creation time");
        let otime: jiff::Timestamp = row["otime"].as_str().unwrap().parse().unwrap();
        assert_eq!(otime.as_second(), created.as_second(), "{path} otime");
        assert_eq!(show_field(&show, "UUID"), row["uuid"].as_str().unwrap());
        assert_eq!(
            show_field(&show, "Gen at creation"),
            row["otransid"].to_string(),
            "{path}"
        );
        assert_eq!(
            show_field(&show, "Flags") == "readonly",
            row["readonly"].as_bool().unwrap(),
            "{path}"
        );
        if path == "recv/snap" {
            saw_received = true;
            // btrfs receive records the receive time; the send time it
            // leaves zero (dump-tree above agrees), so stime stays null.
            assert!(row["rtime"].is_string(), "{row}");
            assert_eq!(
                show_field(&show, "Receive transid"),
                row["rtransid"].to_string()
            );
            let rtime = jiff::Timestamp::strptime(
                "%Y-%m-%d %H:%M:%S %z",
                show_field(&show, "Receive time"),
            )
            .expect("receive time");
            let got: jiff::Timestamp = row["rtime"].as_str().unwrap().parse().unwrap();
            assert_eq!(got.as_second(), rtime.as_second());
        } else {
            assert!(row["rtime"].is_null(), "{path} was not received: {row}");
        }
    }
    assert!(saw_received, "no recv/snap row:\n{json}");
}
