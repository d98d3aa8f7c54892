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

fn sh(cmd: &str) {
    let st = Command::new("sh")
        .arg("-ec")
        .arg(cmd)
        .status()
        .expect("run sh");
    assert!(st.success(), "{cmd}");
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
    sh(&format!(
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
    sh("sync");
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
