//! Sends with clone sources (`-c`) against the kernel, for every
//! `clonesend STEM CHILD [-p PARENT] -c SRC…` line of a fixture's
//! `meta.txt` (015-clone-sources), v1 and v2 `--compressed-data`:
//!
//! * `clone_source_send_matches_kernel`: the parent is the `-p` one, or,
//!   without `-p`, the one btrfs-progs picks (`send::find_good_parent`);
//!   our stream dumps to exactly the kernel's stored `STEM.V.dump` and
//!   decodes to the same commands and bytes as the kernel's stored stream.
//!   Normalisations: none.
//! * `clone_source_send_receives_to_stored_manifest` (live, root): the
//!   stock `btrfs receive` of the kernel's full streams of the parent and
//!   of every clone source, then of our stream, reproduces the child's
//!   stored manifest.

use btrsend::fs::Filesystem;
use btrsend::fs::subvol::Subvolume;
use btrsend::send::{self, NoProgress, SendOptions};

use crate::reader::{Fixture, fixtures};
use crate::send::{commands, read_zst, same_as_kernel, short, stored_dump};

const VARIANTS: [(&str, SendOptions); 2] = [
    ("v1", SendOptions::new(1)),
    ("v2c", SendOptions::new(2).with_compressed_data(true)),
];

/// One `clonesend` line.
struct CloneSend {
    stem: String,
    child: String,
    parent: Option<String>,
    sources: Vec<String>,
}

fn clone_sends(dir: &std::path::Path) -> Vec<CloneSend> {
    let meta = std::fs::read_to_string(dir.join("meta.txt")).unwrap();
    meta.lines()
        .filter_map(|l| l.strip_prefix("clonesend "))
        .map(|l| {
            let mut words = l.split_whitespace();
            let stem = words.next().unwrap().to_owned();
            let child = words.next().unwrap().to_owned();
            let (mut parent, mut sources) = (None, Vec::new());
            while let Some(flag) = words.next() {
                let arg = words.next().unwrap().to_owned();
                match flag {
                    "-p" => parent = Some(arg),
                    "-c" => sources.push(arg),
                    f => panic!("clonesend: unknown flag {f}"),
                }
            }
            CloneSend {
                stem,
                child,
                parent,
                sources,
            }
        })
        .collect()
}

/// The child, its parent (given or found) and the clone sources.
fn roots(fs: &Filesystem, cs: &CloneSend) -> (Subvolume, Subvolume, Vec<Subvolume>) {
    let child = send::find_subvolume(fs, &cs.child).unwrap();
    let sources: Vec<Subvolume> = cs
        .sources
        .iter()
        .map(|s| send::find_subvolume(fs, s).unwrap())
        .collect();
    let parent = match &cs.parent {
        Some(p) => send::find_subvolume(fs, p).unwrap(),
        None => send::find_good_parent(fs, &child, &sources).unwrap(),
    };
    (child, parent, sources)
}

fn ours(fs: &Filesystem, cs: &CloneSend, opts: SendOptions) -> Result<Vec<u8>, String> {
    let (child, parent, sources) = roots(fs, cs);
    send::send_with_clone_sources(
        fs,
        &child,
        Some(&parent),
        &sources,
        Vec::new(),
        opts,
        &NoProgress,
    )
    .map(|(out, _)| out)
    .map_err(|e| format!("send: {e}"))
}

fn check(fx: &Fixture, cs: &CloneSend, v: &str, opts: SendOptions) -> Result<(), String> {
    let stem = format!("{}.{v}", cs.stem);
    let kernel = read_zst(&fx.dir.join(format!("{stem}.stream.zst")));
    let fs = Filesystem::open(&fx.devices).unwrap();
    let ours = ours(&fs, cs, opts)?;
    same_as_kernel(&ours, &kernel, &stored_dump(&fx.dir, &stem))
}

#[test]
fn clone_source_send_matches_kernel() {
    let mut passed = Vec::new();
    let mut failures = Vec::new();
    for fx in fixtures() {
        for cs in clone_sends(&fx.dir) {
            for (v, opts) in VARIANTS {
                let what = format!("{} {}.{v}", fx.name(), cs.stem);
                match check(&fx, &cs, v, opts) {
                    Ok(()) => passed.push(what),
                    Err(e) => failures.push(format!("{what}: {e}")),
                }
            }
        }
    }
    eprintln!(
        "clone-source sends equal to the kernel: {}",
        passed.join(", ")
    );
    assert!(
        failures.is_empty(),
        "{} clone-source sends differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        passed.len() >= 10,
        "too few clone-source sends checked: {passed:?}"
    );
}

#[test]
fn find_good_parent_picks_as_btrfs_progs() {
    // The kernel's streams name the parent btrfs-progs picked in their
    // SNAPSHOT command (parent uuid).
    let mut checked = 0;
    for fx in fixtures() {
        let fs = Filesystem::open(&fx.devices).unwrap();
        for cs in clone_sends(&fx.dir)
            .into_iter()
            .filter(|c| c.parent.is_none())
        {
            let (_, parent, _) = roots(&fs, &cs);
            let dump = stored_dump(&fx.dir, &format!("{}.v1", cs.stem));
            let uuid = parent.root.uuid.to_string();
            assert!(
                dump.lines()
                    .next()
                    .is_some_and(|l| l.contains(&format!("parent_uuid={uuid}"))),
                "{}: we pick {} ({uuid}), the kernel's stream says {:?}",
                cs.stem,
                String::from_utf8_lossy(&parent.path),
                dump.lines().next()
            );
            checked += 1;
        }
        // A subvolume that is no snapshot has no parent to find.
        if let Some(cs) = clone_sends(&fx.dir).first() {
            let (_, _, sources) = roots(&fs, cs);
            let top = send::find_subvolume(&fs, "a").unwrap();
            let e = send::find_good_parent(&fs, &top, &sources).unwrap_err();
            assert!(e.to_string().contains("parent determination failed"), "{e}");
        }
    }
    assert!(checked >= 2, "too few -c sends without -p: {checked}");
}

#[test]
fn clone_source_send_receives_to_stored_manifest() {
    use btrsend::testing::{self, FixtureMeta, LiveBtrfs};

    let test = "clone_source_send_receives_to_stored_manifest";
    if !testing::require_live(test) {
        return;
    }
    let mut failures = Vec::new();
    let mut passed = 0;
    for meta in FixtureMeta::all().expect("fixtures' meta.txt") {
        let sends = clone_sends(&meta.dir);
        if sends.is_empty() {
            continue;
        }
        let fx = fixtures().into_iter().find(|f| f.dir == meta.dir).unwrap();
        let fs = Filesystem::open(&fx.devices).unwrap();
        let stored_of = |s: &str| meta.manifest(s).expect("stored manifest");
        for (version, opts) in VARIANTS {
            for (i, cs) in sends.iter().enumerate() {
                let what = format!("{} {}.{version}", meta.name(), cs.stem);
                let live = LiveBtrfs::new().expect("scratch btrfs");
                let (_, parent, sources) = roots(&fs, cs);
                let mut needed = vec![String::from_utf8_lossy(&parent.path).into_owned()];
                for s in &sources {
                    let p = String::from_utf8_lossy(&s.path).into_owned();
                    if !needed.contains(&p) {
                        needed.push(p);
                    }
                }
                let mut streams: Vec<std::path::PathBuf> = needed
                    .iter()
                    .map(|s| meta.full_stream(s, version))
                    .collect();
                let f = live.scratch_dir().join("ours.stream");
                match ours(&fs, cs, opts) {
                    Ok(bytes) => std::fs::write(&f, bytes).unwrap(),
                    Err(e) => {
                        failures.push(format!("{what}: {e}"));
                        continue;
                    }
                }
                streams.push(f);
                let refs: Vec<&std::path::Path> = streams.iter().map(|p| p.as_path()).collect();
                let dest = format!("c-{i}");
                let child_name = FixtureMeta::snap_name(&cs.child);
                let stored = stored_of(&cs.child);
                // The directories the kernel makes orphans in without a
                // UTIMES after them (send_incremental.rs): their mtime is
                // the receive time, for the kernel's stream as for ours.
                let kernel_stream = meta.dir.join(format!("{}.{version}.stream.zst", cs.stem));
                let exempt = testing::compare::orphan_dirs_without_utimes(
                    testing::open_stream(&kernel_stream).expect("kernel stream"),
                )
                .expect("kernel stream decodes");
                let result = live
                    .receive(&dest, &refs)
                    .map_err(|e| e.to_string())
                    .and_then(|()| {
                        live.manifest(&format!("{dest}/{child_name}"), crate::send_live::HOLES)
                            .map_err(|e| e.to_string())
                    })
                    .map(|got| testing::compare::exempt_mtimes(&stored, &got, &exempt))
                    .and_then(|got| crate::send_live::compare(&meta, &stored, &got).map(|_| ()));
                match result {
                    Ok(()) => passed += 1,
                    Err(e) => failures.push(format!("{what}: {e}")),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        passed >= 10 || !testing::in_ci(),
        "too few received: {passed}"
    );
}

/// `btrfs ARGS…`, which must succeed; its stdout.
fn btrfs(args: &[&str]) -> Vec<u8> {
    let out = std::process::Command::new("btrfs")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "btrfs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Our stream must be the kernel's, command for command (the first
/// difference named) and byte for byte.
fn same_stream(what: &str, ours: &[u8], kernel: &[u8]) {
    let (a, b) = (commands(ours), commands(kernel));
    if let Some(i) = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i)) {
        panic!(
            "{what}: command {i} differs: ours {:?}, kernel {:?}",
            a.get(i).map(short),
            b.get(i).map(short)
        );
    }
    assert!(ours == kernel, "{what}: bytes differ");
}

/// Deterministic bytes (xorshift) for the live scenario.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A live scenario the fixture lacks: snapshots whose source was not
/// modified afterwards, so new extents have a single reference and leaves
/// shared by two snapshots (the shared-leaf shortcut of clone detection):
/// `btrfs send -p a1 -c a2b a2` clones a2's new data from a2b. Our stream
/// must equal the kernel's, byte for byte; so must `-c a1 -c a2b a2`
/// (parent found: a2b, the closest ctransid).
#[test]
fn shared_leaf_clone_sources_match_the_kernel_live() {
    use btrsend::testing::{self, LiveBtrfs};
    use std::process::Command;

    let test = "shared_leaf_clone_sources_match_the_kernel_live";
    if !testing::require_live(test) {
        return;
    }
    let live = LiveBtrfs::new().expect("scratch btrfs");
    let m = live.path().to_path_buf();
    let p = |s: &str| m.join(s).to_string_lossy().into_owned();
    btrfs(&["subvolume", "create", &p("a")]);
    // Enough inline files for a tree of several leaves (a single-leaf tree
    // is copied, not shared, by a snapshot).
    for i in 0..300 {
        std::fs::write(m.join(format!("a/small{i:03}")), bytes(100 + i, 3000)).unwrap();
    }
    std::fs::write(m.join("a/f1"), bytes(1, 300 * 1024)).unwrap();
    std::fs::write(m.join("a/f2"), bytes(2, 8 * 1024)).unwrap();
    Command::new("sync").status().unwrap();
    btrfs(&["subvolume", "snapshot", "-r", &p("a"), &p("a1")]);
    std::fs::write(m.join("a/f3"), bytes(3, 200 * 1024)).unwrap();
    let mut f1 = std::fs::read(m.join("a/f1")).unwrap();
    f1.extend(bytes(4, 64 * 1024));
    std::fs::write(m.join("a/f1"), f1).unwrap();
    Command::new("sync").status().unwrap();
    btrfs(&["subvolume", "snapshot", "-r", &p("a"), &p("a2")]);
    btrfs(&["subvolume", "snapshot", "-r", &p("a"), &p("a2b")]);
    btrfs(&["filesystem", "sync", &p("")]);
    Command::new("sync").status().unwrap();
    let devices = live.loop_devices().unwrap();
    btrsend::mount::drop_page_cache(&devices).unwrap();
    let fs = Filesystem::open(&devices).unwrap();
    let cases: [(&str, Option<&str>, &[&str]); 2] = [
        ("-p a1 -c a2b", Some("a1"), &["a2b"]),
        ("-c a1 -c a2b", None, &["a1", "a2b"]),
    ];
    let mut clones = 0;
    for (what, parent, sources) in cases {
        let mut args = vec!["send".to_owned(), "-q".to_owned()];
        if let Some(pa) = parent {
            args.extend(["-p".to_owned(), p(pa)]);
        }
        for s in sources {
            args.extend(["-c".to_owned(), p(s)]);
        }
        args.push(p("a2"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let kernel = btrfs(&args);
        let cs = CloneSend {
            stem: what.to_owned(),
            child: "a2".to_owned(),
            parent: parent.map(str::to_owned),
            sources: sources.iter().map(|s| (*s).to_owned()).collect(),
        };
        let ours = ours(&fs, &cs, SendOptions::new(1)).unwrap();
        clones += commands(&kernel)
            .iter()
            .filter(|c| matches!(c, stream_format::Command::Clone { .. }))
            .count();
        same_stream(what, &ours, &kernel);
    }
    assert!(
        clones > 0,
        "the kernel's streams have no CLONE: the scenario tests nothing"
    );
}

/// After a balance every data reference of a shared leaf is a shared
/// reference (SHARED_DATA_REF naming the leaf), and which copy of a file
/// the kernel clones from depends on its send backref cache: a leaf it has
/// met before hands its items to the iterator in forward slot order (the
/// first copy), one it has not in reverse order (the latest copy). Copies
/// of one extent in one leaf and in other leaves, a modified source after
/// the first snapshot (references split between shared and indirect),
/// full, incremental and `-c` sends: our streams must equal the kernel's,
/// byte for byte.
#[test]
fn balanced_filesystem_clone_sources_match_the_kernel_live() {
    use btrsend::testing::{self, LiveBtrfs};
    use std::process::Command;

    let test = "balanced_filesystem_clone_sources_match_the_kernel_live";
    if !testing::require_live(test) {
        return;
    }
    let live = LiveBtrfs::new().expect("scratch btrfs");
    let m = live.path().to_path_buf();
    let p = |s: &str| m.join(s).to_string_lossy().into_owned();
    let reflink = |from: &str, to: &str| {
        let st = Command::new("cp")
            .args(["--reflink=always", &p(from), &p(to)])
            .status()
            .unwrap();
        assert!(st.success(), "cp --reflink {from} {to}");
    };
    btrfs(&["subvolume", "create", &p("sv")]);
    std::fs::write(m.join("sv/a"), bytes(1, 1 << 20)).unwrap();
    for c in ["b", "c", "d", "e"] {
        reflink("sv/a", &format!("sv/{c}"));
    }
    // Inline files between the copies: later copies sit in other leaves.
    std::fs::create_dir(m.join("sv/many")).unwrap();
    for i in 0..400 {
        std::fs::write(m.join(format!("sv/many/s{i:03}")), bytes(100 + i, 2000)).unwrap();
    }
    std::fs::create_dir(m.join("sv/z")).unwrap();
    for c in ["z/a2", "z/a3", "z/a4"] {
        reflink("sv/a", &format!("sv/{c}"));
    }
    std::fs::write(m.join("sv/two"), bytes(2, 256 * 1024)).unwrap();
    for c in ["two-b", "z/two-c", "two-d"] {
        reflink("sv/two", &format!("sv/{c}"));
    }
    Command::new("sync").status().unwrap();
    btrfs(&["subvolume", "snapshot", "-r", &p("sv"), &p("s1")]);
    // Change the source: its leaves are copied, the snapshot's keep shared
    // references.
    for i in (0..400).step_by(7) {
        std::fs::write(m.join(format!("sv/many/s{i:03}")), bytes(900 + i, 2500)).unwrap();
    }
    reflink("sv/a", "sv/many/late");
    let mut two = std::fs::read(m.join("sv/two")).unwrap();
    two.extend(bytes(3, 64 * 1024));
    std::fs::write(m.join("sv/two"), two).unwrap();
    reflink("sv/two", "sv/z/two-e");
    Command::new("sync").status().unwrap();
    btrfs(&["subvolume", "snapshot", "-r", &p("sv"), &p("s2")]);
    btrfs(&["balance", "start", "--full-balance", &p("")]);
    btrfs(&["filesystem", "sync", &p("")]);
    Command::new("sync").status().unwrap();
    let devices = live.loop_devices().unwrap();
    btrsend::mount::drop_page_cache(&devices).unwrap();
    let fs = Filesystem::open(&devices).unwrap();
    let cases: [(&str, &str, Option<&str>, &[&str]); 4] = [
        ("full s1", "s1", None, &[]),
        ("full s2", "s2", None, &[]),
        ("-p s1 s2", "s2", Some("s1"), &[]),
        ("-c s1 s2", "s2", None, &["s1"]),
    ];
    let (mut clones, mut not_from_previous) = (0, 0);
    for (what, child, parent, sources) in cases {
        for (v, opts) in VARIANTS {
            let mut args = vec!["send".to_owned(), "-q".to_owned()];
            if v == "v2c" {
                args.extend(["--proto".into(), "2".into(), "--compressed-data".into()]);
            }
            if let Some(pa) = parent {
                args.extend(["-p".to_owned(), p(pa)]);
            }
            for s in sources {
                args.extend(["-c".to_owned(), p(s)]);
            }
            args.push(p(child));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let kernel = btrfs(&args);
            let cs = CloneSend {
                stem: what.to_owned(),
                child: child.to_owned(),
                parent: parent.map(str::to_owned),
                sources: sources.iter().map(|s| (*s).to_owned()).collect(),
            };
            let ours = if parent.is_none() && sources.is_empty() {
                let child = send::find_subvolume(&fs, child).unwrap();
                send::send_with_clone_sources(&fs, &child, None, &[], Vec::new(), opts, &NoProgress)
                    .unwrap()
                    .0
            } else {
                ours(&fs, &cs, opts).unwrap()
            };
            for c in &commands(&kernel) {
                if let stream_format::Command::Clone {
                    path, clone_path, ..
                } = c
                {
                    clones += 1;
                    // The old order cloned each copy from the one before
                    // it; the kernel's cache makes it clone from `a`.
                    if path.as_ref() == b"c" && clone_path.as_ref() == b"a" {
                        not_from_previous += 1;
                    }
                }
            }
            same_stream(&format!("{what} {v}"), &ours, &kernel);
        }
    }
    assert!(
        clones > 0 && not_from_previous > 0,
        "the kernel's streams have {clones} CLONE, {not_from_previous} of c from a: \
         the scenario does not test the cache's order"
    );
}
