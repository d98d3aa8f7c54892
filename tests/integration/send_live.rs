//! Full send through the stock `btrfs receive` (root only; see
//! `btrsend::testing` for the skip/fail policy), and against the kernel's
//! own `btrfs send` on a filesystem made here.
//!
//! * `our_streams_receive_to_stored_manifests`: for every fixture snapshot,
//!   our v1 and v2 `--compressed-data` streams are received by the stock
//!   `btrfs receive` into a loop-mounted btrfs, and the received tree's
//!   manifest must equal the manifest stored from the kernel's mount of the
//!   snapshot. Legitimate differences, as for the kernel's own streams
//!   (`tests/integration/live.rs`): nested subvolumes are not in a send
//!   stream (`subvol` lines are dropped from the expected manifest); hole
//!   maps (`data=`) may differ only where the kernel's stream itself writes
//!   zeros — not at all under no-holes, except that preallocated ranges
//!   arrive as holes or zeros (004, 005) and explicit hole extents of a
//!   `^no-holes` filesystem (005) — and then file contents must still be
//!   equal and every original data range must be data in the copy.
//! * `kernel_oracle_on_a_fresh_filesystem`: the variants the fixtures do not
//!   store (`--no-data` v1 and v2, plain v2 of compressed files): the
//!   kernel's stream of a snapshot made here and ours of the same image must
//!   be the same commands.

use std::collections::BTreeMap;
use std::process::Command;

use btrsend::fs::Filesystem;
use btrsend::manifest::{self, Options};
use btrsend::send::{self, NoProgress, SendOptions};
use btrsend::stream_format::{Command as Cmd, StreamReader};
use btrsend::testing::{self, FixtureMeta, LiveBtrfs};

use crate::common::shell;

pub(crate) const HOLES: Options = Options { holes: true };

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|f| f.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
}

/// Data ranges (`data=o+n,…`) per path.
fn data_ranges(m: &str) -> BTreeMap<String, Vec<(u64, u64)>> {
    m.lines()
        .filter_map(|l| {
            let p = l.split(' ').next()?;
            let d = field(l, "data")?;
            let r = if d == "-" {
                Vec::new()
            } else {
                d.split(',')
                    .filter_map(|r| {
                        let (o, n) = r.split_once('+')?;
                        let o: u64 = o.parse().ok()?;
                        Some((o, o + n.parse::<u64>().ok()?))
                    })
                    .collect()
            };
            Some((p.to_owned(), r))
        })
        .collect()
}

pub(crate) fn compare(
    meta: &FixtureMeta,
    stored: &str,
    got: &str,
) -> Result<Option<String>, String> {
    let expected: String = stored
        .lines()
        .filter(|l| l.split(' ').nth(1) != Some("subvol"))
        .map(|l| format!("{l}\n"))
        .collect();
    let Some(d) = manifest::diff(&expected, got, 15) else {
        return Ok(None);
    };
    let why = if !meta.has_feature("no_holes") {
        "hole extents are sent as zeros without no-holes"
    } else if meta.description.contains("prealloc") {
        "preallocated ranges are not sent as prealloc"
    } else {
        return Err(d);
    };
    if let Some(d) = manifest::diff(
        &manifest::strip_holes(&expected),
        &manifest::strip_holes(got),
        15,
    ) {
        return Err(format!("(ignoring holes) {d}"));
    }
    let (want, have) = (data_ranges(&expected), data_ranges(got));
    for (p, list) in &want {
        let other = have.get(p).ok_or_else(|| format!("{p}: no data map"))?;
        for &(s, e) in list {
            if !other.iter().any(|&(os, oe)| os <= s && e <= oe) {
                return Err(format!("{p}: data {s}..{e} became a hole"));
            }
        }
    }
    Ok(Some(why.to_owned()))
}

#[test]
fn our_streams_receive_to_stored_manifests() {
    let test = "our_streams_receive_to_stored_manifests";
    if !testing::require_live(test) {
        return;
    }
    let mut metas = FixtureMeta::all().expect("fixtures' meta.txt");
    if let Ok(only) = std::env::var("BTRSEND_FIXTURE") {
        metas.retain(|m| m.name().contains(&only));
    }
    let mut failures = Vec::new();
    let mut notes = Vec::new();
    let mut checked = 0;
    for meta in &metas {
        // The unpacked images of the reader tests (cached between runs).
        let Some(fx) = crate::reader::fixtures()
            .into_iter()
            .find(|f| f.dir == meta.dir)
        else {
            failures.push(format!("{}: images not unpacked", meta.name()));
            continue;
        };
        let fs = Filesystem::open(&fx.devices).expect("open fixture");
        for (version, opts) in [
            ("v1", SendOptions::new(1)),
            ("v2c", SendOptions::new(2).with_compressed_data(true)),
        ] {
            let live = LiveBtrfs::new().expect("scratch btrfs");
            for snap in &meta.snapshots {
                let name = FixtureMeta::snap_name(snap);
                let what = format!("{} {name} ours {version}", meta.name());
                let sv = send::find_subvolume(&fs, snap).expect("snapshot");
                let file = live.scratch_dir().join(format!("{name}.{version}.stream"));
                let out = std::fs::File::create(&file).expect("stream file");
                send::send_full(&fs, &sv, out, opts, &NoProgress).expect("send");
                let dest = format!("ours-{version}");
                let stored = meta.manifest(snap).expect("stored manifest");
                let result = live
                    .receive(&dest, &[&file])
                    .map_err(|e| e.to_string())
                    .and_then(|()| {
                        let got = live
                            .manifest(&format!("{dest}/{name}"), HOLES)
                            .map_err(|e| e.to_string())?;
                        compare(meta, &stored, &got)
                    });
                checked += 1;
                match result {
                    Ok(None) => {}
                    Ok(Some(why)) => notes.push(format!("{what}: hole maps differ ({why})")),
                    Err(e) => failures.push(format!("{what}: {e}")),
                }
            }
        }
    }
    eprintln!(
        "{test}: {checked} receives; {}",
        if notes.is_empty() {
            "all hole maps equal".to_owned()
        } else {
            format!("legitimate differences:\n  {}", notes.join("\n  "))
        }
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked > 0 || std::env::var("BTRSEND_FIXTURE").is_ok());
}

fn commands(stream: &[u8]) -> Vec<Cmd<'static>> {
    let mut r = StreamReader::new(stream);
    let mut out = Vec::new();
    while let Some((_, c)) = r.next_command().expect("decode") {
        let end = c == Cmd::End;
        out.push(c.into_owned());
        if end {
            break;
        }
    }
    out
}

#[test]
fn kernel_oracle_on_a_fresh_filesystem() {
    let test = "kernel_oracle_on_a_fresh_filesystem";
    if !testing::require_live(test) {
        return;
    }
    let live = LiveBtrfs::with_options(1 << 30, &[], "compress=zstd").expect("scratch btrfs");
    let m = live.path().display().to_string();
    // Compressed and incompressible data, inline, sparse, a reflink, a
    // prealloc range, hard links, xattrs, a directory with a child of a
    // lower inode number (created early), special files.
    shell(&format!(
        "cd {m} && btrfs -q subvolume create src && cd src && mkdir d late && \
         head -c 300000 /dev/urandom > d/rand && yes hello | head -c 700000 > d/text && \
         printf abc > small && truncate -s 20000 small && \
         truncate -s 1M sparse && printf x | dd of=sparse bs=1 seek=500000 conv=notrunc status=none && \
         cp --reflink=always d/text textcopy && fallocate -l 65536 pre && \
         ln d/rand d/rand-link && setfattr -n user.k -v v small && mkfifo fifo && \
         touch late/f && mv late/f f2 && mv d late/ && sync && \
         btrfs -q subvolume snapshot -r {m}/src {m}/snap && sync"
    ));
    let scratch = live.scratch_dir().to_owned();
    let variants: [(&str, &[&str], SendOptions); 4] = [
        (
            "no-data v1",
            &["--no-data"],
            SendOptions::new(1).with_no_data(true),
        ),
        (
            "no-data v2",
            &["--no-data", "--proto", "2"],
            SendOptions::new(2).with_no_data(true),
        ),
        ("v2", &["--proto", "2"], SendOptions::new(2)),
        (
            "v2c",
            &["--proto", "2", "--compressed-data"],
            SendOptions::new(2).with_compressed_data(true),
        ),
    ];
    let mut kernel = Vec::new();
    for (i, (_, args, _)) in variants.iter().enumerate() {
        let f = scratch.join(format!("kernel{i}.stream"));
        let st = Command::new("btrfs")
            .arg("-q")
            .arg("send")
            .args(*args)
            .arg("-f")
            .arg(&f)
            .arg(live.path().join("snap"))
            .status()
            .expect("btrfs send");
        assert!(st.success());
        kernel.push(std::fs::read(&f).expect("kernel stream"));
    }
    shell("sync");
    let fs = Filesystem::open(&[scratch.join("fs.img")]).expect("open image");
    let sv = send::find_subvolume(&fs, "snap").expect("snap");
    let mut failures = Vec::new();
    for ((what, _, opts), k) in variants.iter().zip(&kernel) {
        let (ours, _) = send::send_full(&fs, &sv, Vec::new(), *opts, &NoProgress).expect("send");
        let (a, b) = (commands(&ours), commands(k));
        // The snapshot exercises what the variant is about.
        let has = |f: &dyn Fn(&Cmd<'_>) -> bool| b.iter().any(f);
        let exercised = match *what {
            "v2c" => has(&|c| matches!(c, Cmd::EncodedWrite { .. })),
            "v2" => has(&|c| matches!(c, Cmd::Write { data, .. } if data.len() == 128 * 1024)),
            _ => has(&|c| matches!(c, Cmd::UpdateExtent { .. })),
        };
        assert!(
            exercised && b.len() > 30,
            "{what}: kernel stream too trivial"
        );
        if let Some(i) = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i)) {
            let s = |c: Option<&Cmd<'_>>| {
                let t = format!("{c:?}");
                t.chars().take(300).collect::<String>()
            };
            failures.push(format!(
                "{what}: command {i} differs: ours {}, kernel {}",
                s(a.get(i)),
                s(b.get(i))
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// (inode number, generation) of each path, from `stat` and `lsattr -v`
/// (FS_IOC_GETVERSION: the inode item's generation on btrfs).
fn ino_gen(dir: &std::path::Path, paths: &[String]) -> Vec<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let out = Command::new("lsattr")
        .arg("-v")
        .arg("-d")
        .args(paths)
        .current_dir(dir)
        .output()
        .expect("lsattr");
    assert!(out.status.success(), "lsattr -v");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let gens: Vec<u64> = text
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(gens.len(), paths.len(), "{text}");
    paths
        .iter()
        .zip(gens)
        .map(|(p, g)| (std::fs::metadata(dir.join(p)).unwrap().ino(), g))
        .collect()
}

/// Orphan names (`o<ino>-<gen>-<idx>`) already taken in the root
/// directory, of the snapshot and of the parent, in sends that check
/// more names than the planner looks up one by one (it then scans the
/// root directory once): the kernel skips to the next free index, and so
/// must we; names of another shape (leading zeros, two numbers) take
/// nothing. Full send of the child and incremental from the parent,
/// compared command for command with the kernel's.
#[test]
fn orphan_names_taken_in_the_root_directory() {
    let test = "orphan_names_taken_in_the_root_directory";
    if !testing::require_live(test) {
        return;
    }
    const N: usize = 300;
    let live = LiveBtrfs::with_options(1 << 30, &[], "").expect("scratch btrfs");
    let m = live.path().display().to_string();
    // k first, then N directories, then a file in each (higher inode
    // numbers than every directory).
    shell(&format!(
        "cd {m} && btrfs -q subvolume create src && cd src && mkdir k && \
         for i in $(seq 0 {last}); do mkdir x$i; done && \
         for i in $(seq 0 {last}); do echo $i > x$i/f; done && sync",
        last = N - 1
    ));
    let src = live.path().join("src");
    let dirs: Vec<String> = (0..N).map(|i| format!("x{i}")).collect();
    let files: Vec<String> = (0..N).map(|i| format!("x{i}/f")).collect();
    let d = ino_gen(&src, &dirs);
    let f = ino_gen(&src, &files);
    let touch = |name: String| {
        std::fs::write(src.join(name), b"decoy").expect("decoy");
    };
    // The parent: names of the last directories' orphans (the
    // incremental send orphanizes each deleted directory while its file
    // is still in it): index 0 taken for 20 of them, 0 and 1 for the last;
    // decoys of other shapes for one.
    for &(ino, generation) in &d[N - 20..] {
        touch(format!("o{ino}-{generation}-0"));
    }
    let (ino, generation) = d[N - 1];
    touch(format!("o{ino}-{generation}-1"));
    let (ino, generation) = d[N - 11];
    for name in [
        format!("o0{ino}-{generation}-1"),
        format!("o{ino}-{generation}-01"),
        format!("o{ino}-{generation}"),
        format!("o{ino}-{generation}-1-"),
    ] {
        touch(name);
    }
    shell(&format!(
        "sync && btrfs -q subvolume snapshot -r {m}/src {m}/snap1 && sync"
    ));
    // The child: the files moved out, the directories deleted, the
    // parent's names for the first 10 of those directories gone (taken
    // in the parent only); the files' orphan names (each new in a full
    // send) taken for the last 20 files, 0 and 1 for the last.
    shell(&format!(
        "cd {m}/src && for i in $(seq 0 {last}); do mv x$i/f k/f$i && rmdir x$i; done",
        last = N - 1
    ));
    for &(ino, generation) in &d[N - 20..N - 10] {
        std::fs::remove_file(src.join(format!("o{ino}-{generation}-0"))).expect("rm");
    }
    for &(ino, generation) in &f[N - 20..] {
        touch(format!("o{ino}-{generation}-0"));
    }
    let (ino, generation) = f[N - 1];
    touch(format!("o{ino}-{generation}-1"));
    shell(&format!(
        "sync && btrfs -q subvolume snapshot -r {m}/src {m}/snap2 && sync"
    ));
    let scratch = live.scratch_dir().to_owned();
    let kernel_stream = |args: &[&str], name: &str| {
        let out = scratch.join(name);
        let st = Command::new("btrfs")
            .arg("-q")
            .arg("send")
            .args(args)
            .arg("-f")
            .arg(&out)
            .arg(live.path().join("snap2"))
            .status()
            .expect("btrfs send");
        assert!(st.success());
        commands(&std::fs::read(&out).expect("kernel stream"))
    };
    let full_k = kernel_stream(&[], "full.stream");
    let parent = format!("{m}/snap1");
    let inc_k = kernel_stream(&["-p", &parent], "inc.stream");
    shell("sync");
    let fs = Filesystem::open(&[scratch.join("fs.img")]).expect("open image");
    let snap1 = send::find_subvolume(&fs, "snap1").expect("snap1");
    let snap2 = send::find_subvolume(&fs, "snap2").expect("snap2");
    let opts = SendOptions::new(1);
    let (full, _) = send::send_full(&fs, &snap2, Vec::new(), opts, &NoProgress).expect("full");
    let (inc, _) =
        send::send_incremental(&fs, &snap2, &snap1, Vec::new(), opts, &NoProgress).expect("inc");
    // The kernel skipped taken names where this test expects it to: in the
    // parent (the orphanized directories) and in the child (new files).
    let names = |cmds: &[Cmd<'_>]| -> Vec<Vec<u8>> {
        cmds.iter()
            .filter_map(|c| match c {
                Cmd::Mkfile { path, .. } => Some(path.to_vec()),
                Cmd::Rename { path_to, .. } => Some(path_to.to_vec()),
                _ => None,
            })
            .collect()
    };
    let (ino, generation) = f[N - 1];
    assert!(
        names(&full_k).contains(&format!("o{ino}-{generation}-2").into_bytes()),
        "kernel full stream: no file created at index 2"
    );
    let (ino, generation) = d[N - 1];
    assert!(
        names(&inc_k).contains(&format!("o{ino}-{generation}-2").into_bytes()),
        "kernel incremental stream: no directory orphanized at index 2"
    );
    let (ino, generation) = d[N - 15];
    assert!(
        names(&inc_k).contains(&format!("o{ino}-{generation}-1").into_bytes()),
        "kernel incremental stream: a name taken in the parent only was used"
    );
    let mut failures = Vec::new();
    for (what, ours, k) in [("full", full, full_k), ("incremental", inc, inc_k)] {
        let a = commands(&ours);
        if let Some(i) = (0..a.len().max(k.len())).find(|&i| a.get(i) != k.get(i)) {
            failures.push(format!(
                "{what}: command {i} differs: ours {:?}, kernel {:?}",
                a.get(i),
                k.get(i)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
