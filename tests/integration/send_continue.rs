//! A send from a mounted filesystem that continues its stream after a
//! balance moved blocks it was reading (issues 14 and 18; root only, see
//! `btrsend::testing` for the skip/fail policy).
//!
//! The stream btrfs and btrsend make depends on the layout: a CLONE names
//! one of the references to a shared extent, chosen in the order of the
//! extent's back references, which a relocation rewrites (as shared
//! references keyed by the new tree blocks' addresses). So a send planned
//! again after a balance may make other commands before the point where
//! the first attempt stopped; continuing it at that byte spliced two
//! different streams (fstests btrfs/252: `btrfs receive` read a garbage
//! command length). Here a read fails once at a chosen point, a full
//! balance runs before the send reads the filesystem again, and the
//! continued stream must receive (stock `btrfs receive`) to the snapshot's
//! exact tree; the balance must have changed the undisturbed stream
//! (else the test would prove nothing).

use std::path::Path;
use std::process::Command;

use btrsend::manifest::Options;
use btrsend::send::mounted::{Request, Source};
use btrsend::send::{NoProgress, SendOptions};
use btrsend::testing::{self, LiveBtrfs};

use crate::common::shell;

/// A subvolume `src` whose files share extents (reflinks under names of
/// different lengths, so that another clone source changes a CLONE's
/// length) in several leaves, snapshot `s1`, then changed (leaves copied
/// on write, so that the snapshot's references become shared references
/// keyed by its leaves' addresses, which a balance changes) and snapshot
/// `s2` with one more reflink, then new files (sent after its CLONE). Measured: each full balance makes the
/// incremental stream name another clone source.
fn populate(mnt: &Path) {
    let m = mnt.display();
    shell(&format!(
        "set -e; btrfs -q subvolume create {m}/src && mkdir {m}/snaps && cd {m}/src && \
         head -c 393216 /dev/urandom > a && \
         for n in bb ccc; do cp --reflink=always a $n; done && \
         mkdir many && for i in $(seq 1 300); do echo $i > many/file-$i; done && \
         for n in dddd eeeee ffffff; do cp --reflink=always a $n; done && \
         mkdir more && for i in $(seq 1 300); do echo $i > more/file-$i; done && \
         for n in g1 g22 g333; do cp --reflink=always a $n; done && \
         sync && touch a && setfattr -n user.x -v 1 bb && sync && \
         btrfs -q subvolume snapshot -r {m}/src {m}/snaps/s1 && sync && \
         touch a bb ccc dddd g1 many/file-1 more/file-1 && cp --reflink=always a zz && \
         mkdir late && for i in $(seq 1 300); do echo $i > late/file-$i; done && \
         rm more/file-2* && mv ccc many/ && sync && \
         btrfs -q subvolume snapshot -r {m}/src {m}/snaps/s2 && sync"
    ));
}

fn balance(mnt: &Path) {
    let o = Command::new("btrfs")
        .args(["balance", "start", "--full-balance"])
        .arg(mnt)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "btrfs balance: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn send(path: &Path, parent: Option<&Path>) -> Vec<u8> {
    let s = path.display().to_string();
    let p = parent.map(|p| p.display().to_string());
    let req = Request {
        subvol: &s,
        parent: p.as_deref(),
        clone_sources: &[],
    };
    let mut src = Source::open_path(path).unwrap();
    src.send(&req, Vec::new(), SendOptions::new(1), &NoProgress)
        .unwrap()
        .0
}

/// Full and incremental sends of snapshots with shared extents, each made
/// to fail once after `reads` block reads with a full balance before it
/// reads again: every one that continued gives a stream that receives to
/// the snapshot's exact tree.
#[test]
fn a_send_continued_after_a_balance_receives_to_the_snapshot() {
    let test = "a_send_continued_after_a_balance_receives_to_the_snapshot";
    if !testing::require_live(test) {
        return;
    }
    let live = LiveBtrfs::with_options(1 << 30, &[], "").expect("scratch btrfs");
    let mnt = live.path().to_path_buf();
    populate(&mnt);
    let (s1, s2) = (mnt.join("snaps/s1"), mnt.join("snaps/s2"));
    let opts = Options { holes: false };
    let want1 = live.manifest("snaps/s1", opts).unwrap();
    let want2 = live.manifest("snaps/s2", opts).unwrap();
    let (mut continued, mut changed, mut n) = (0u32, 0u32, 0u32);
    // Continued after the first command the balance changed: a
    // continuation at that byte would have spliced two streams.
    let mut crossing = 0u32;
    for permille in [0u64, 100, 300, 500, 700, 800, 900, 950, 980, 995] {
        for incremental in [false, true] {
            n += 1;
            let (path, parent) = if incremental {
                (&s2, Some(s1.as_path()))
            } else {
                (&s1, None)
            };
            let before = send(path, parent);
            let s = path.display().to_string();
            let p = parent.map(|p| p.display().to_string());
            let req = Request {
                subvol: &s,
                parent: p.as_deref(),
                clone_sources: &[],
            };
            // A read at permille/1000 of the reads of an undisturbed send.
            let mut src = Source::open_path(path).unwrap();
            let total = {
                src.send(&req, Vec::new(), SendOptions::new(1), &NoProgress)
                    .unwrap();
                src.fs().volume().reads()
            };
            let mut src = Source::open_path(path).unwrap();
            let reads = total * permille / 1000;
            let bm = mnt.clone();
            src.fail_once(reads, Box::new(move || balance(&bm)));
            let res = src.send(&req, Vec::new(), SendOptions::new(1), &NoProgress);
            let after = send(path, parent);
            changed += u32::from(before != after);
            let (stream, stats) = match res {
                Ok(r) => r,
                Err(e) => {
                    // Refused: the stream planned again differs before the
                    // point (a relocation split an extent there, say).
                    let mut msg = e.to_string();
                    let mut cause = std::error::Error::source(&e);
                    while let Some(c) = cause {
                        msg = format!("{msg}: {c}");
                        cause = c.source();
                    }
                    assert!(
                        msg.contains("the send planned again differs from the stream written")
                            && msg.contains("the stream already written is incomplete"),
                        "{test}: reads {reads} incremental {incremental}: {msg}"
                    );
                    eprintln!("{test}: reads {reads} incremental {incremental}: refused: {msg}");
                    continue;
                }
            };
            continued += stats.continued;
            eprintln!(
                "{test}: reads {reads}/{total} incremental {incremental}: continued {} at byte {} of {}, stream changed {}",
                stats.continued,
                stats.continued_at,
                stream.len(),
                before != after
            );
            let first_diff = before.iter().zip(&after).position(|(a, b)| a != b);
            if stats.continued > 0 && first_diff.is_some_and(|d| stats.continued_at > d as u64) {
                crossing += 1;
            }
            if stats.continued == 0 {
                // The failure came after the last read (a balance still ran).
                continue;
            }
            // The full stream first into a directory of its own, then the
            // incremental one on top of it.
            let dir = format!("r{n}");
            let full_file = live.scratch_dir().join(format!("{dir}.full"));
            let file = live.scratch_dir().join(format!("{dir}.stream"));
            std::fs::write(&file, &stream).unwrap();
            let chain: Vec<&Path> = if incremental {
                std::fs::write(&full_file, send(&s1, None)).unwrap();
                vec![&full_file, &file]
            } else {
                vec![&file]
            };
            live.receive(&dir, &chain).unwrap_or_else(|e| {
                panic!("{test}: reads {reads} incremental {incremental}: btrfs receive: {e}")
            });
            let (name, want) = if incremental {
                ("s2", &want2)
            } else {
                ("s1", &want1)
            };
            assert_eq!(
                &live.manifest(&format!("{dir}/{name}"), opts).unwrap(),
                want,
                "{test}: reads {reads} incremental {incremental}: the received tree differs"
            );
        }
    }
    eprintln!(
        "{test}: {n} sends, {continued} continued ({crossing} past a command the balance \
         changed), {changed} balances changed the stream"
    );
    assert!(
        continued >= 10,
        "{test}: only {continued} of {n} sends continued"
    );
    assert!(
        changed > 0 && crossing > 0,
        "{test}: no send continued past a command a balance changed: the test proves nothing"
    );
}
