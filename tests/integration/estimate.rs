//! `send::estimate` against the kernel: for every fixture snapshot and
//! pair, v1 and v2 with `--compressed-data`, the estimate's stream length
//! is the length of the kernel's stored stream, byte for byte, and its
//! command counts are the kernel stream's, kind by kind (decoded from the
//! kernel's bytes, not from ours). The random workloads check it against
//! our real streams too (`send_random`).

use std::collections::BTreeMap;

use btrsend::fs::Filesystem;
use btrsend::send::{self, SendStats};
use btrsend::stream_format::{CommandKind, ReaderOptions, StreamReader};

use crate::reader::fixtures;
use crate::send::{VARIANTS, read_zst, snapshots};
use crate::send_incremental::{last, pairs};

/// Commands of a stream by kind, decoded.
fn counts_of(stream: &[u8]) -> BTreeMap<String, u64> {
    let mut r = StreamReader::with_options(stream, ReaderOptions::new().with_max_version(3));
    let mut counts = BTreeMap::new();
    while let Some((info, _)) = r.next_raw().expect("kernel stream decodes") {
        let name = CommandKind::from_u16(info.cmd)
            .map_or_else(|| format!("#{}", info.cmd), |k| k.name().to_owned());
        *counts.entry(name).or_insert(0) += 1;
    }
    counts
}

/// The estimate's counts, in the same form.
fn counts_of_estimate(stats: &SendStats) -> BTreeMap<String, u64> {
    CommandKind::ALL
        .iter()
        .filter(|&&k| stats.count(k) > 0)
        .map(|&k| (k.name().to_owned(), stats.count(k)))
        .collect()
}

fn check(what: &str, est: &SendStats, kernel: &[u8], failures: &mut Vec<String>) {
    let len = u64::try_from(kernel.len()).unwrap();
    if est.stream_bytes != len {
        failures.push(format!(
            "{what}: estimate {} bytes, the kernel's stream {len}",
            est.stream_bytes
        ));
    }
    let (ours, theirs) = (counts_of_estimate(est), counts_of(kernel));
    if ours != theirs {
        failures.push(format!(
            "{what}: estimated commands {ours:?}, the kernel's {theirs:?}"
        ));
    }
    if est.total_commands() != theirs.values().sum::<u64>() {
        failures.push(format!("{what}: total_commands"));
    }
}

#[test]
fn estimate_is_the_kernels_stream_size_and_commands() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for fx in fixtures() {
        let fs = Filesystem::open(&fx.devices).unwrap();
        for snap in snapshots(&fx) {
            let s = snap.rsplit('/').next().unwrap().to_owned();
            let sv = send::find_subvolume(&fs, &snap).unwrap();
            for (v, opts) in VARIANTS {
                let stem = format!("{s}.full.{v}");
                let kernel = read_zst(&fx.dir.join(format!("{stem}.stream.zst")));
                let est = send::estimate(&fs, &sv, None, &[], opts)
                    .unwrap_or_else(|e| panic!("estimate {snap}: {e}"));
                check(
                    &format!("{} {stem}", fx.name()),
                    &est,
                    &kernel,
                    &mut failures,
                );
                checked += 1;
            }
        }
        for (parent, child) in pairs(&fx) {
            let p = send::find_subvolume(&fs, &parent).unwrap();
            let c = send::find_subvolume(&fs, &child).unwrap();
            for (v, opts) in VARIANTS {
                let stem = format!("{}--{}.inc.{v}", last(&parent), last(&child));
                let kernel = read_zst(&fx.dir.join(format!("{stem}.stream.zst")));
                let est = send::estimate(&fs, &c, Some(&p), &[], opts)
                    .unwrap_or_else(|e| panic!("estimate -p {parent} {child}: {e}"));
                check(
                    &format!("{} {stem}", fx.name()),
                    &est,
                    &kernel,
                    &mut failures,
                );
                checked += 1;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} estimates are wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 0, "no fixture streams found");
    eprintln!("estimate: {checked} fixture streams, every size and count exact");
}
