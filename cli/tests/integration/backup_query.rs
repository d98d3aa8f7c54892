//! Questions across stored snapshots (`backup find`, `diff`), judged by
//! the kernel: the fixture chains of `backup_browse` are imported and
//! indexed, and every answer must follow from the kernel's manifests of
//! the snapshots (no root needed).

use std::collections::{BTreeMap, BTreeSet};

use btrsend::testing::FixtureMeta;

use crate::backup_browse::{CHAINS, Repo, imported, ok};
use crate::common::{fixture_dir, json_lines, stderr};
use crate::repo_store::Kind;

/// A directory repository holding every fixture chain, indexed; with each
/// stored snapshot's manifest, by entry id.
fn fixture_repo(dir: &std::path::Path, test: &str) -> (Repo, Vec<(u64, &'static str, String)>) {
    let repo = imported(Kind::Dir, "none", test, dir).unwrap();
    let mut snaps = Vec::new();
    for (fx, streams) in CHAINS {
        let meta = FixtureMeta::load(&fixture_dir(fx)).unwrap();
        for (_, snap) in *streams {
            snaps.push((snaps.len() as u64 + 1, *fx, meta.manifest(snap).unwrap()));
        }
    }
    (repo, snaps)
}

/// A manifest as diff sees it, path (from the root, with /) to line: the
/// hole layout (`data=`) is not compared, and a hard-link group only as
/// being one (`link=` names the group by its first path, which diff does
/// not track).
pub(crate) fn diff_lines(manifest: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in manifest.lines().skip(1) {
        let (path, rest) = line.split_once(' ').unwrap();
        if rest.starts_with("subvol") {
            continue;
        }
        let fields: Vec<&str> = rest
            .split(' ')
            .filter(|f| !f.starts_with("data="))
            .map(|f| if f.starts_with("link=") { "link" } else { f })
            .collect();
        let key = if path == "." {
            "/".to_owned()
        } else {
            format!("/{path}")
        };
        out.insert(key, fields.join(" "));
    }
    out
}

/// What `diff --json` must say from manifest `old` to `new`: (path,
/// change) for every path only in one of them or with other lines.
pub(crate) fn manifest_diff(old: &str, new: &str) -> BTreeSet<(String, &'static str)> {
    let (a, b) = (diff_lines(old), diff_lines(new));
    let mut want = BTreeSet::new();
    for (p, l) in &a {
        match b.get(p) {
            None => want.insert((p.clone(), "removed")),
            Some(m) if m != l => want.insert((p.clone(), "modified")),
            _ => false,
        };
    }
    for p in b.keys().filter(|p| !a.contains_key(*p)) {
        want.insert((p.clone(), "added"));
    }
    want
}

/// The `diff --json` output as (path, change).
pub(crate) fn diff_of_json(out: &str) -> BTreeSet<(String, &'static str)> {
    json_lines(out)
        .iter()
        .map(|v| {
            let change = match v["change"].as_str().unwrap() {
                "added" => "added",
                "removed" => "removed",
                "modified" => "modified",
                c => panic!("change {c}"),
            };
            (v["path"].as_str().unwrap().to_owned(), change)
        })
        .collect()
}

fn names(manifest: &str) -> Vec<String> {
    diff_lines(manifest)
        .into_keys()
        .filter(|p| p != "/")
        .collect()
}

#[test]
fn find_gives_the_paths_the_kernels_snapshots_hold() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, snaps) = fixture_repo(dir.path(), "find_gives_the_paths");
    let patterns = ["*file*", "/a/b/*", "[xy]?"];
    let want_of = |manifest: &str| -> BTreeSet<String> {
        names(manifest)
            .into_iter()
            .filter(|p| {
                let comps: Vec<&str> = p[1..].split('/').collect();
                let name = comps.last().unwrap();
                name.contains("file")
                    || (comps.len() == 3 && comps[0] == "a" && comps[1] == "b")
                    || (name.len() == 2 && matches!(name.as_bytes()[0], b'x' | b'y'))
            })
            .collect()
    };
    let mut total = 0;
    for (id, fx, manifest) in &snaps {
        let mut args = vec!["find", "--json", "--snapshot"];
        let id_s = id.to_string();
        args.push(&id_s);
        args.extend(patterns);
        let got: BTreeSet<String> = json_lines(&ok(&repo.backup(&args)))
            .iter()
            .map(|v| {
                assert!(v["snapshot"].as_str().unwrap().len() >= 32, "{v}");
                assert!(v["type"].is_string() && v["mtime"].is_string(), "{v}");
                v["path"].as_str().unwrap().to_owned()
            })
            .collect();
        let want = want_of(manifest);
        assert_eq!(got, want, "{fx} entry {id}");
        total += want.len();
    }
    assert!(total > 0);
    // Every snapshot at once: the same matches, grouped under a header.
    let mut args = vec!["find"];
    args.extend(patterns);
    let out = ok(&repo.backup(&args));
    let lines = out.lines().filter(|l| l.starts_with('/')).count();
    assert_eq!(lines, total, "{out}");
    assert!(
        out.contains("Found matching entries in snapshot 1 ("),
        "{out}"
    );
    // A name no snapshot holds finds nothing; a bad pattern is refused.
    assert_eq!(ok(&repo.backup(&["find", "no-such-name-anywhere"])), "");
    let out = repo.backup(&["find", "a[b"]);
    assert!(
        !out.status.success() && stderr(&out).contains("unclosed ["),
        "{}",
        stderr(&out)
    );
}

#[test]
fn diff_gives_the_difference_of_the_kernels_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, snaps) = fixture_repo(dir.path(), "diff_gives_the_difference");
    let mut checked = 0;
    for pair in snaps.windows(2) {
        let ((ia, fa, ma), (ib, fb, mb)) = (&pair[0], &pair[1]);
        if fa != fb {
            continue;
        }
        let want = manifest_diff(ma, mb);
        let out = ok(&repo.backup(&["diff", "--json", &ia.to_string(), &ib.to_string()]));
        let got = diff_of_json(&out);
        assert_eq!(got, want, "{fa}: entry {ia} to {ib}");
        // The human form: one line per change, restic's marks.
        let human = ok(&repo.backup(&["diff", &ia.to_string(), &ib.to_string()]));
        assert_eq!(human.lines().count(), want.len());
        for (p, c) in &want {
            let mark = match *c {
                "added" => '+',
                "removed" => '-',
                _ => 'M',
            };
            assert!(
                human.contains(&format!("{mark}    {p}\n")),
                "{p} {c}: {human}"
            );
        }
        // A snapshot against itself: nothing.
        assert_eq!(
            ok(&repo.backup(&["diff", &ib.to_string(), &ib.to_string()])),
            ""
        );
        checked += 1;
    }
    assert_eq!(checked, 5);
}

/// A manifest's lines as a tar round trip keeps them: holes are not kept
/// (tar holds zeros), nested subvolumes are not in an index; without root
/// neither owners nor devices can be made; GNU tar leaves out the xattrs of a
/// file with one very large value.
fn tar_lines(manifest: &str, root: bool) -> Vec<String> {
    btrsend::manifest::strip_holes(manifest)
        .lines()
        .skip(1)
        .filter(|l| {
            let kind = l.split(' ').nth(1).unwrap_or("");
            kind != "subvol" && (root || !matches!(kind, "chr" | "blk"))
        })
        .map(|l| {
            l.split(' ')
                .filter(|f| root || !(f.starts_with("uid=") || f.starts_with("gid=")))
                // 008's xattr/big (one value near the 64 KiB limit): GNU
                // tar sets none of its xattrs back (the archive is not yet
                // checked with another reader).
                .filter(|f| !(l.starts_with("xattr/big ") && f.starts_with("xattr:")))
                // btrfs.* properties exist only on btrfs; the archive is
                // extracted into a temporary directory.
                .filter(|f| !f.starts_with("xattr:btrfs."))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[test]
fn dump_of_a_directory_is_a_tar_of_the_kernels_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, snaps) = fixture_repo(dir.path(), "dump_of_a_directory_is_a_tar");
    let root = rustix::process::geteuid().is_root();
    for (id, fx, manifest) in &snaps {
        let out = repo.backup(&["dump", &id.to_string(), "/"]);
        ok(&out);
        let to = tempfile::tempdir().unwrap();
        let mut tar = std::process::Command::new("tar");
        tar.args([
            "--xattrs",
            "--xattrs-include=*",
            "--numeric-owner",
            "-xpf",
            "-",
            "-C",
        ])
        .arg(to.path())
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        let mut child = tar.spawn().expect("run GNU tar");
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), &out.stdout).unwrap();
        drop(child.stdin.take());
        let res = child.wait_with_output().unwrap();
        // Without root, tar cannot make devices (and says so).
        assert!(
            res.status.success() || !root,
            "{fx} entry {id}: {}",
            String::from_utf8_lossy(&res.stderr)
        );
        let got =
            btrsend::manifest::manifest(to.path(), btrsend::manifest::Options { holes: false })
                .unwrap();
        let (got, want) = (tar_lines(&got, root), tar_lines(manifest, root));
        let only = |x: &[String], y: &[String]| -> Vec<String> {
            x.iter()
                .filter(|l| !y.contains(l))
                .map(|l| l.chars().take(300).collect())
                .collect()
        };
        assert!(
            got == want,
            "{fx} entry {id}: only from tar {:#?}\nonly in the kernel's {:#?}",
            only(&got, &want),
            only(&want, &got)
        );
    }
}

/// The lines of a manifest that `keep` picks (the root left out), the
/// hole layout dropped and each hard-link group named by its first path
/// among them (a group with one name among them is no group): what a
/// restore of those paths alone must show.
pub(crate) fn subtree_lines(manifest: &str, keep: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut picked: Vec<(&str, Vec<&str>)> = Vec::new();
    for line in manifest.lines().skip(1) {
        let (path, rest) = line.split_once(' ').unwrap();
        if path != "." && keep(path) {
            picked.push((
                path,
                rest.split(' ')
                    .filter(|f| !f.starts_with("data="))
                    .collect(),
            ));
        }
    }
    let mut first: BTreeMap<&str, (&str, usize)> = BTreeMap::new();
    for (path, fields) in &picked {
        if let Some(g) = fields.iter().find_map(|f| f.strip_prefix("link=")) {
            first.entry(g).or_insert((path, 0)).1 += 1;
        }
    }
    picked
        .iter()
        .map(|(path, fields)| {
            let fields: Vec<String> = fields
                .iter()
                .filter_map(|f| match f.strip_prefix("link=") {
                    Some(g) if first[g].1 > 1 => Some(format!("link={}", first[g].0)),
                    Some(_) => None,
                    None => Some((*f).to_owned()),
                })
                .collect();
            format!("{path} {}", fields.join(" "))
        })
        .collect()
}

/// Whether `path` is `top` or below it.
pub(crate) fn within(path: &str, top: &str) -> bool {
    path == top || path.strip_prefix(top).is_some_and(|r| r.starts_with('/'))
}

/// `restore --include` of each top-level directory of every stored
/// snapshot, and of a name at any depth with an exclusion, into a
/// loop-mounted btrfs (root: owners and btrfs properties need it): the
/// restored tree must be that part of the kernel's snapshot, with the
/// directories leading to it.
#[test]
fn restore_include_gives_the_kernels_subtrees() {
    let test = "restore_include_gives_the_kernels_subtrees";
    if !btrsend::testing::require_live(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (repo, snaps) = fixture_repo(dir.path(), test);
    let live = btrsend::testing::LiveBtrfs::new().unwrap();
    let mut restores = 0;
    for (id, fx, manifest) in &snaps {
        let tops: BTreeSet<&str> = manifest
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(' '))
            .filter(|(p, rest)| *p != "." && !p.contains('/') && rest.starts_with("dir"))
            .map(|(p, _)| p)
            .collect();
        for top in tops {
            let to = live.path().join(format!("to{restores}"));
            ok(&repo.restore_picked(&id.to_string(), &to, &["--include", &format!("/{top}")]));
            let got =
                btrsend::manifest::manifest(&to, btrsend::manifest::Options::default()).unwrap();
            let keep = |p: &str| within(p, top);
            assert_eq!(
                subtree_lines(&got, &|_| true),
                subtree_lines(manifest, &keep),
                "{fx} entry {id} --include /{top}"
            );
            restores += 1;
        }
    }
    assert!(restores >= 8, "{restores}");

    // A name at any depth, with the directories leading to it, less what
    // an exclusion takes: 008's link3 (under links/other) and the whole
    // acl directory but its file.
    let (id, _, manifest) = snaps
        .iter()
        .find(|(_, fx, _)| *fx == "008-hardlinks-xattrs")
        .unwrap();
    let to = live.path().join("picked");
    ok(&repo.restore_picked(
        &id.to_string(),
        &to,
        &[
            "--include",
            "link3",
            "--include",
            "acl",
            "--exclude",
            "file",
        ],
    ));
    let got = btrsend::manifest::manifest(&to, btrsend::manifest::Options::default()).unwrap();
    let keep = |p: &str| {
        let name = p.rsplit('/').next().unwrap();
        ["links", "links/other", "links/other/link3"].contains(&p)
            || (within(p, "acl") && name != "file")
    };
    let want = subtree_lines(manifest, &keep);
    assert!(
        want.iter().any(|l| l.starts_with("links/other/link3 file")),
        "{want:?}"
    );
    assert_eq!(subtree_lines(&got, &|_| true), want);
}

/// What `restore --include` refuses: a name already in DIR (a symlink
/// there is not followed, a file not replaced), a pattern that picks
/// nothing, and --stdout; nothing in DIR changes and no staging directory
/// is left.
#[test]
fn restore_include_never_replaces_what_the_target_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, snaps) = fixture_repo(dir.path(), "restore_include_never_replaces");
    let (id, _, _) = snaps
        .iter()
        .find(|(_, fx, _)| *fx == "008-hardlinks-xattrs")
        .unwrap();
    let id = id.to_string();
    let to = dir.path().join("to");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(to.join("links")).unwrap();
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(to.join("links/target"), "mine").unwrap();
    std::os::unix::fs::symlink(&elsewhere, to.join("caps")).unwrap();
    let listing = |d: &std::path::Path| -> Vec<String> {
        let mut v: Vec<String> = walkdir(d);
        v.sort();
        v
    };
    let before = (listing(&to), listing(&elsewhere));
    for (pattern, says) in [
        ("/links", "links/target already exists"),
        ("/caps", "caps already exists"),
        ("no-such-name", "no path of the snapshot matches"),
    ] {
        let out = repo.restore_picked(&id, &to, &["--include", pattern]);
        assert!(
            !out.status.success() && stderr(&out).contains(says),
            "{pattern}: {}",
            stderr(&out)
        );
        assert_eq!((listing(&to), listing(&elsewhere)), before, "{pattern}");
    }
    assert_eq!(std::fs::read(to.join("links/target")).unwrap(), b"mine");
    let out = repo.backup(&["restore", &id, "--stdout", "--include", "links"]);
    assert!(!out.status.success(), "{}", stderr(&out));
    // Into the directory that is there, next to what it holds.
    ok(&repo.restore_picked(&id, &to, &["--include", "/links/other"]));
    assert_eq!(std::fs::read(to.join("links/target")).unwrap(), b"mine");
    assert_eq!(
        std::fs::read(to.join("links/other/link3")).unwrap().len(),
        1000
    );
    assert!(!listing(&to).iter().any(|p| p.contains(".btrsend")));
}

/// Every path below `d`, relative, with its type and size or target.
fn walkdir(d: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).unwrap() {
        let e = e.unwrap();
        let m = e.path().symlink_metadata().unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        out.push(format!("{name} {:?} {}", m.file_type(), m.len()));
        if m.is_dir() {
            out.extend(
                walkdir(&e.path())
                    .into_iter()
                    .map(|s| format!("{name}/{s}")),
            );
        }
    }
    out
}
