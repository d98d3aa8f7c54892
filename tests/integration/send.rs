//! Full send against the kernel: for every fixture snapshot and both stored
//! protocols (v1, and v2 with `--compressed-data`), our stream must
//!
//! * dump (`btrsend dump`, progs 6.2 text, `TZ=UTC`) to exactly the
//!   kernel's stored `S.full.*.dump` (made by `btrfs receive --dump` of the
//!   kernel's stream) — the oracle is the kernel, never our output;
//! * decode to the same commands as the kernel's stored stream, attribute
//!   by attribute (paths, offsets, data bytes, uuids, times);
//! * be within 1 % of the kernel's stream size.
//!
//! Normalisations: **none**. Everything that could legitimately differ
//! between two senders of the same snapshot is fixed by the image we read:
//! the SUBVOL uuid and ctransid come from the root item, ctime/otime from
//! the inode items, orphan names from inode numbers and generations, write
//! chunk boundaries from the protocol's `max_send_read_size` (48 KiB v1,
//! 128 KiB v2) and the extent items. Only the stream *bytes* of a fixture
//! regenerated later differ (new uuids, ctimes), which is why the kernel
//! stream stored next to the very image we read is the reference.

use std::io::Read;
use std::path::{Path, PathBuf};

use btrsend::fs::Filesystem;
use btrsend::send::{self, NoProgress, SendOptions};
use btrsend::stream_format::dump::{DumpOptions, dump};
use btrsend::stream_format::{Command, StreamReader};

use crate::reader::{Fixture, fixtures};

/// The snapshots of a fixture (`snapshot` lines of `meta.txt`), as paths
/// from the top level.
pub(crate) fn snapshots(fx: &Fixture) -> Vec<String> {
    let meta = std::fs::read_to_string(fx.dir.join("meta.txt")).unwrap();
    meta.lines()
        .filter_map(|l| l.strip_prefix("snapshot "))
        .map(|s| s.trim().to_owned())
        .collect()
}

pub(crate) fn read_zst(path: &Path) -> Vec<u8> {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    zstd::stream::read::Decoder::new(f)
        .unwrap()
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// `S.full.V.dump`, or its `.zst`.
pub(crate) fn stored_dump(dir: &Path, stem: &str) -> String {
    let plain = dir.join(format!("{stem}.dump"));
    if plain.is_file() {
        return std::fs::read_to_string(plain).unwrap();
    }
    String::from_utf8(read_zst(&dir.join(format!("{stem}.dump.zst")))).unwrap()
}

pub(crate) fn dump_text(stream: &[u8]) -> String {
    let mut out = Vec::new();
    dump(
        stream,
        &mut out,
        &DumpOptions::with_time_zone(jiff::tz::TimeZone::UTC),
    )
    .unwrap();
    String::from_utf8(out).unwrap()
}

pub(crate) fn commands(stream: &[u8]) -> Vec<Command<'static>> {
    let mut r = StreamReader::new(stream);
    let mut out = Vec::new();
    while let Some((_, cmd)) = r.next_command().unwrap() {
        let end = cmd == Command::End;
        out.push(cmd.into_owned());
        if end {
            break;
        }
    }
    out
}

/// The first difference between two texts, with context.
pub(crate) fn first_difference(ours: &str, theirs: &str) -> Option<String> {
    let a: Vec<&str> = ours.lines().collect();
    let b: Vec<&str> = theirs.lines().collect();
    let i = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i))?;
    let lo = i.saturating_sub(3);
    let mut s = format!("first difference at line {}:\n", i + 1);
    for j in lo..(i + 4) {
        if let Some(l) = b.get(j) {
            s.push_str(&format!("  kernel {}: {l}\n", j + 1));
        }
    }
    for j in lo..(i + 4) {
        if let Some(l) = a.get(j) {
            s.push_str(&format!("  ours   {}: {l}\n", j + 1));
        }
    }
    Some(s)
}

/// Our stream against the kernel's: (1) its dump text equals the stored
/// kernel dump, (2) command by command every attribute (data bytes too)
/// equals the kernel stream's, (3) the bytes are the same (equal commands
/// give equal bytes unless something follows END). `Err` describes the
/// first difference.
pub(crate) fn same_as_kernel(ours: &[u8], kernel: &[u8], stored: &str) -> Result<(), String> {
    if let Some(d) = first_difference(&dump_text(ours), stored) {
        return Err(format!("dump differs from the stored kernel dump\n{d}"));
    }
    let (a, b) = (commands(ours), commands(kernel));
    if a.len() != b.len() {
        return Err(format!("{} commands, kernel {}", a.len(), b.len()));
    }
    if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
        return Err(format!(
            "command {i} differs: ours {:?}, kernel {:?}",
            short(&a[i]),
            short(&b[i])
        ));
    }
    if ours != kernel {
        return Err(format!(
            "bytes differ ({} bytes, kernel {})",
            ours.len(),
            kernel.len()
        ));
    }
    Ok(())
}

/// Send `snapshot` of `fx` with `opts`.
pub fn our_stream(devices: &[PathBuf], snapshot: &str, opts: SendOptions) -> Vec<u8> {
    let fs = Filesystem::open(devices).unwrap();
    let sv = send::find_subvolume(&fs, snapshot).unwrap();
    send::send_full(&fs, &sv, Vec::new(), opts, &NoProgress)
        .unwrap_or_else(|e| panic!("send {snapshot}: {e}"))
        .0
}

pub(crate) const VARIANTS: [(&str, SendOptions); 2] = [
    ("v1", SendOptions::new(1)),
    ("v2c", SendOptions::new(2).with_compressed_data(true)),
];

#[test]
fn full_send_matches_kernel() {
    let only = std::env::var("BTRSEND_TEST_FIXTURE").ok();
    let mut checked = 0;
    let mut failures = Vec::new();
    for fx in fixtures() {
        if only.as_deref().is_some_and(|o| !fx.name().starts_with(o)) {
            continue;
        }
        for snap in snapshots(&fx) {
            let s = snap.rsplit('/').next().unwrap().to_owned();
            for (v, opts) in VARIANTS {
                let stem = format!("{s}.full.{v}");
                let kernel = read_zst(&fx.dir.join(format!("{stem}.stream.zst")));
                let ours = our_stream(&fx.devices, &snap, opts);
                let what = format!("{} {stem}", fx.name());
                checked += 1;
                if let Err(e) = same_as_kernel(&ours, &kernel, &stored_dump(&fx.dir, &stem)) {
                    failures.push(format!("{what}: {e}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} streams differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 0 || only.is_some(), "no fixture streams found");
}

pub(crate) fn short(c: &Command<'_>) -> String {
    let s = format!("{c:?}");
    if s.len() > 300 {
        format!("{}…", &s[..300])
    } else {
        s
    }
}
