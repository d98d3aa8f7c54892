//! A corruption campaign: flip bytes in the tree blocks of the kernel-made
//! fixture images (every copy of the block, so DUP cannot hide it), reseal
//! most of them (a fresh checksum, so the checks behind the checksum are
//! reached), and send every subvolume. Nothing may panic, and every error
//! must print each cause once: rendered as `main` renders it (`{err:#}`:
//! the message, then `: ` and each `source()` in turn), no link of the
//! chain may repeat the text of the next.
//!
//! CI runs a fixed set of cases (`CASES` per fixture, seed 1). Run more with
//!
//!     BTRSEND_CORRUPT_CASES=2000 BTRSEND_CORRUPT_SEED=7 cargo test --release \
//!         -p btrsend --test integration corruption_campaign -- --nocapture
//!
//! which prints the counts (cases, errors, panics, duplicated causes) and
//! the first failing cases.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error as StdError;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use btrsend::csum::CsumType;
use btrsend::device::Device;
use btrsend::fs::Filesystem;
use btrsend::send::{self, NoProgress, SendOptions};
use btrsend::superblock::read_superblock;
use btrsend::testing::workload::Rng;
use btrsend::types::Physical;
use btrsend::volume::Volume;

use crate::reader::fixtures;

/// Cases per fixture in a default run.
const CASES: u64 = 40;

/// How `main` prints an error: `{err:#}` of anyhow, i.e. the message, then
/// `: ` and the message of each `source()` in turn.
pub fn render_chain(err: &dyn StdError) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push_str(": ");
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out
}

/// The first link of the chain whose message already contains the message
/// of its source (so the rendered error prints that cause twice).
pub fn repeated_cause(err: &dyn StdError) -> Option<String> {
    let mut cur: &dyn StdError = err;
    while let Some(src) = cur.source() {
        let (outer, inner) = (cur.to_string(), src.to_string());
        if !inner.is_empty() && outer.contains(&inner) {
            return Some(inner);
        }
        cur = src;
    }
    None
}

/// An image in memory with some blocks replaced.
struct Patched {
    base: Arc<Vec<u8>>,
    patches: BTreeMap<u64, Vec<u8>>,
    path: PathBuf,
    /// Where reads started, when recording.
    reads: Option<Arc<Mutex<BTreeSet<u64>>>>,
}

impl fmt::Debug for Patched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Patched({})", self.path.display())
    }
}

impl Device for Patched {
    fn path(&self) -> &Path {
        &self.path
    }

    fn size(&self) -> u64 {
        self.base.len() as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: Physical) -> btrsend::Result<()> {
        let start = offset.get() as usize;
        let Some(src) = self.base.get(start..start + buf.len()) else {
            return Err(btrsend::Error::Io {
                device: self.path.clone(),
                offset,
                error: std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
            });
        };
        buf.copy_from_slice(src);
        if let Some(r) = &self.reads {
            r.lock().unwrap().insert(start as u64);
        }
        let end = (start + buf.len()) as u64;
        for (&at, bytes) in self.patches.range(..end) {
            let p_end = at + bytes.len() as u64;
            if p_end <= start as u64 {
                continue;
            }
            let lo = at.max(start as u64);
            let hi = p_end.min(end);
            buf[(lo - start as u64) as usize..(hi - start as u64) as usize]
                .copy_from_slice(&bytes[(lo - at) as usize..(hi - at) as usize]);
        }
        Ok(())
    }
}

/// The tree blocks of an image: physical offsets of blocks that carry the
/// filesystem's fsid and a valid checksum, grouped by their bytenr (the
/// copies of one block).
fn tree_blocks(img: &[u8], fsid: &[u8; 16], nodesize: usize, csum: CsumType) -> Vec<Vec<u64>> {
    let mut by_bytenr: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
    let mut off = 0usize;
    while off + nodesize <= img.len() {
        let block = &img[off..off + nodesize];
        if &block[32..48] == fsid && csum.verify(&block[..32], &block[32..]).is_ok() {
            let bytenr = u64::from_le_bytes(block[48..56].try_into().unwrap());
            let generation = u64::from_le_bytes(block[80..88].try_into().unwrap());
            by_bytenr
                .entry((bytenr, generation))
                .or_default()
                .push(off as u64);
        }
        off += 4096;
    }
    by_bytenr.into_values().collect()
}

/// What a campaign found.
#[derive(Debug, Default)]
pub struct Tally {
    /// Cases run.
    pub cases: u64,
    /// Cases that ended in an error.
    pub errors: u64,
    /// Of those, the ones that print a cause twice.
    pub repeated: u64,
    /// Cases that panicked.
    pub panics: u64,
    /// The first few failures (repeated causes and panics), for the report.
    pub examples: Vec<String>,
}

/// Open and send everything; the first error.
fn send_all(dev: Patched) -> Result<(), Box<dyn StdError>> {
    let vol = Volume::from_devices(vec![Box::new(dev)])?;
    let fs = Filesystem::from_volume(vol);
    for sv in btrsend::fs::subvol::list_subvolumes(&fs)? {
        send::send_full(&fs, &sv, std::io::sink(), SendOptions::new(2), &NoProgress)?;
    }
    Ok(())
}

fn run_campaign(cases_per_fixture: u64, seed: u64) -> Tally {
    let mut tally = Tally::default();
    for fx in fixtures() {
        if fx.devices.len() != 1 {
            continue;
        }
        let img = Arc::new(std::fs::read(&fx.devices[0]).unwrap());
        let reads = Arc::new(Mutex::new(BTreeSet::new()));
        let dev = Patched {
            base: Arc::clone(&img),
            patches: BTreeMap::new(),
            path: fx.devices[0].clone(),
            reads: Some(Arc::clone(&reads)),
        };
        let (sb, _) = read_superblock(&dev).unwrap();
        let nodesize = sb.nodesize as usize;
        // The blocks a clean run reads (any copy of them).
        send_all(dev).unwrap_or_else(|e| panic!("{}: {}", fx.name(), render_chain(e.as_ref())));
        let read = std::mem::take(&mut *reads.lock().unwrap());
        let blocks: Vec<Vec<u64>> = tree_blocks(&img, &sb.metadata_uuid.0, nodesize, sb.csum_type)
            .into_iter()
            .filter(|copies| copies.iter().any(|p| read.contains(p)))
            .collect();
        assert!(!blocks.is_empty(), "{}: no tree blocks found", fx.name());
        let mut rng = Rng::new(seed ^ fx.name().len() as u64);
        for case in 0..cases_per_fixture {
            let copies = rng.pick(&blocks).unwrap().clone();
            let first = copies[0] as usize;
            let mut block = img[first..first + nodesize].to_vec();
            // Header fields (past the checksum), item headers or key
            // pointers, or the item data in use.
            let nritems = u32::from_le_bytes(block[96..100].try_into().unwrap()) as usize;
            let leaf = block[100] == 0;
            let slots_end = 101 + nritems * if leaf { 25 } else { 33 };
            let data_start = if leaf && nritems > 0 {
                let last = 101 + (nritems - 1) * 25;
                101 + u32::from_le_bytes(block[last + 17..last + 21].try_into().unwrap()) as usize
            } else {
                nodesize
            };
            let pos = match rng.below(3) {
                0 => 32 + rng.below(101 - 32) as usize,
                1 => 101 + rng.below((slots_end - 101) as u64) as usize,
                _ if data_start < nodesize => {
                    data_start + rng.below((nodesize - data_start) as u64) as usize
                }
                _ => 101 + rng.below((slots_end - 101) as u64) as usize,
            };
            let flip = 1 + rng.below(255) as u8;
            block[pos] ^= flip;
            let reseal = rng.chance(80);
            if reseal {
                let c = sb.csum_type.compute(&block[32..]);
                let bytes = c.as_bytes();
                block[..bytes.len()].copy_from_slice(bytes);
            }
            let patches = copies.iter().map(|&p| (p, block.clone())).collect();
            let dev = Patched {
                base: Arc::clone(&img),
                patches,
                path: fx.devices[0].clone(),
                reads: None,
            };
            tally.cases += 1;
            let what = format!(
                "{} case {case}: block at physical {first} byte {pos} ^= {flip:#04x}{}",
                fx.name(),
                if reseal { ", resealed" } else { "" }
            );
            match catch_unwind(AssertUnwindSafe(|| send_all(dev))) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tally.errors += 1;
                    if let Some(cause) = repeated_cause(e.as_ref()) {
                        tally.repeated += 1;
                        if tally.examples.len() < 20 {
                            tally.examples.push(format!(
                                "{what}: cause printed twice ({cause}): {}",
                                render_chain(e.as_ref())
                            ));
                        }
                    }
                }
                Err(p) => {
                    tally.panics += 1;
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_default();
                    tally.examples.push(format!("{what}: panic: {msg}"));
                }
            }
        }
    }
    tally
}

#[test]
fn corruption_campaign() {
    let cases = std::env::var("BTRSEND_CORRUPT_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CASES);
    let seed = std::env::var("BTRSEND_CORRUPT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let tally = run_campaign(cases, seed);
    eprintln!(
        "corruption campaign (seed {seed}): {} cases, {} errors, {} print a cause twice, {} panics",
        tally.cases, tally.errors, tally.repeated, tally.panics
    );
    for e in &tally.examples {
        eprintln!("  {e}");
    }
    if tally.cases == 0 {
        return;
    }
    assert!(tally.errors > 0, "no case produced an error: {tally:?}");
    assert_eq!(tally.panics, 0, "{:#?}", tally.examples);
    assert_eq!(tally.repeated, 0, "{:#?}", tally.examples);
}
