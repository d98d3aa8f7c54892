//! The extent-tree reader of clone detection
//! (`btrsend::send::extent_tree`), which keeps one cursor for a whole send
//! and moves it by binary search in the current leaf, steps to the next
//! leaves or a search from the root, against a fresh search from the root
//! for every lookup. A consistency test: the kernel oracle of what clone
//! detection does with the answers stays the streams (`send_clone`,
//! `send_incremental`, `send_random`).
//!
//! * `extent_tree_cursor_answers_as_fresh_searches`: in every fixture
//!   image, every EXTENT_ITEM / METADATA_ITEM address (and the address
//!   after each, where there is none) is looked up in ascending, descending
//!   and random order without the cache, and in random order with repeats
//!   through the cache; every answer equals the fresh search's and names
//!   the item the tree walk found. An ascending pass searches from the root
//!   only at its start and after running off the end of the tree.
//! * `extent_tree_cursor_on_small_nodes_live` (root): the same on a
//!   filesystem made here with 4 KiB nodes and no skinny metadata (tree
//!   blocks as EXTENT_ITEMs with their tree_block_info), many extents and
//!   reflinks (keyed references that continue in the next leaves), shared
//!   references after a snapshot, and a reader that skips the lists of
//!   extents with more than 8 references; three tree levels, so that
//!   lookups behind the cursor search from a node below the root.

use std::collections::BTreeMap;

use btrsend::fs::Filesystem;
use btrsend::ondisk;
use btrsend::send::extent_tree::{ExtentTreeReader, ExtentTreeStats};
use btrsend::testing::{self, LiveBtrfs, workload::Rng};
use btrsend::tree::key::Key;
use btrsend::tree::walk::for_each_in_range;
use btrsend::types::TreeId;

use crate::common::shell;
use crate::reader::fixtures;

/// What the walk of the whole extent tree finds.
struct Walked {
    /// Extent item keys by address.
    items: BTreeMap<u64, Key>,
    /// Distinct leaves.
    leaves: usize,
    /// Addresses with a keyed reference item in another leaf than their
    /// extent item.
    split: usize,
    /// Extent items followed by a keyed data reference.
    keyed: usize,
}

fn walk(fs: &Filesystem) -> Walked {
    let root = fs
        .root_item(TreeId(ondisk::BTRFS_EXTENT_TREE_OBJECTID))
        .unwrap()
        .expect("extent tree")
        .tree_root();
    let mut items = BTreeMap::new();
    let mut leaves = std::collections::HashSet::new();
    let mut item_leaf = BTreeMap::new();
    let (mut split, mut keyed) = (std::collections::HashSet::new(), 0);
    for_each_in_range(
        fs.volume(),
        root,
        &Key::new(0, 0, 0),
        &Key::new(u64::MAX, u8::MAX, u64::MAX),
        |item| {
            leaves.insert(item.leaf);
            let k = item.key;
            if k.item_type == ondisk::BTRFS_EXTENT_ITEM_KEY
                || k.item_type == ondisk::BTRFS_METADATA_ITEM_KEY
            {
                items.insert(k.objectid, k);
                item_leaf.insert(k.objectid, item.leaf);
            } else if k.item_type == ondisk::BTRFS_EXTENT_DATA_REF_KEY
                || k.item_type == ondisk::BTRFS_SHARED_DATA_REF_KEY
            {
                if item_leaf.get(&k.objectid).is_some_and(|l| *l != item.leaf) {
                    split.insert(k.objectid);
                }
                if k.item_type == ondisk::BTRFS_EXTENT_DATA_REF_KEY {
                    keyed += 1;
                }
            }
            Ok(())
        },
    )
    .unwrap();
    Walked {
        items,
        leaves: leaves.len(),
        split: split.len(),
        keyed,
    }
}

/// Look every address of `order` up through `reader` and by a fresh
/// search; the failures, described.
fn check(
    what: &str,
    reader: &mut ExtentTreeReader<'_>,
    order: &[u64],
    walked: &Walked,
    failures: &mut Vec<String>,
) {
    for &bytenr in order {
        let got = reader.lookup(bytenr).unwrap();
        let fresh = reader.lookup_fresh(bytenr).unwrap();
        let got_key = got.as_ref().map(|r| r.key);
        if got.as_deref() != fresh.as_ref() || got_key != walked.items.get(&bytenr).copied() {
            failures.push(format!(
                "{what}: {bytenr}: cursor {got:?}, fresh search {fresh:?}, walk {:?}",
                walked.items.get(&bytenr)
            ));
            if failures.len() > 20 {
                return;
            }
        }
    }
}

fn shuffled(mut v: Vec<u64>, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    for i in (1..v.len()).rev() {
        let j = usize::try_from(rng.below(u64::try_from(i + 1).unwrap())).unwrap();
        v.swap(i, j);
    }
    v
}

/// Every pass over `fs`; the ascending pass's counters.
fn every_order(
    what: &str,
    fs: &Filesystem,
    max_refs: u64,
    failures: &mut Vec<String>,
) -> (Walked, ExtentTreeStats) {
    let walked = walk(fs);
    // Each extent address, and the one after it (none there: the answer
    // is "absent", from a position between two items).
    let ascending: Vec<u64> = walked.items.keys().flat_map(|&b| [b, b + 1]).collect();
    let uncached = || {
        let mut r = ExtentTreeReader::new(fs, max_refs).unwrap();
        r.set_cache_extents(0);
        r
    };
    let mut r = uncached();
    check(
        &format!("{what} ascending"),
        &mut r,
        &ascending,
        &walked,
        failures,
    );
    let up: ExtentTreeStats = r.stats();
    let descending: Vec<u64> = ascending.iter().rev().copied().collect();
    check(
        &format!("{what} descending"),
        &mut uncached(),
        &descending,
        &walked,
        failures,
    );
    let random = shuffled(ascending.clone(), 1);
    let mut r = uncached();
    check(
        &format!("{what} random"),
        &mut r,
        &random,
        &walked,
        failures,
    );
    let random_stats = r.stats();
    // With the cache (small enough to evict): each run of 32 random
    // addresses is looked up again backwards (hits), and the whole list
    // once more in another order (mostly evicted by then).
    let mut repeated: Vec<u64> = random
        .chunks(32)
        .flat_map(|c| c.iter().chain(c.iter().rev()).copied())
        .collect();
    repeated.extend(shuffled(ascending.clone(), 2));
    let mut cached = ExtentTreeReader::new(fs, max_refs).unwrap();
    cached.set_cache_extents(64);
    check(
        &format!("{what} cached"),
        &mut cached,
        &repeated,
        &walked,
        failures,
    );
    let st = cached.stats();
    if st.cache_hits < u64::try_from(random.len() / 2).unwrap() {
        failures.push(format!("{what}: cached pass hit nothing: {st:?}"));
    }
    // Ascending lookups go back to the root only after the first and
    // after the cursor ran off the end of the tree (past the last item).
    if up.descents + up.subtree_descents > 2
        || up.lookups != u64::try_from(ascending.len()).unwrap()
    {
        failures.push(format!(
            "{what}: ascending pass searched from the root more than once: {up:?}"
        ));
    }
    eprintln!(
        "{what}: {} extent items, {} leaves, {} keyed data refs ({} extents split over leaves); \
         ascending {up:?}, random {random_stats:?}",
        walked.items.len(),
        walked.leaves,
        walked.keyed,
        walked.split
    );
    (walked, random_stats)
}

#[test]
fn extent_tree_cursor_answers_as_fresh_searches() {
    let mut failures = Vec::new();
    let mut compared = 0;
    for fx in fixtures() {
        let fs = Filesystem::open(&fx.devices).unwrap();
        let (w, _) = every_order(&fx.name(), &fs, 1024, &mut failures);
        compared += w.items.len();
    }
    eprintln!("{compared} extent items compared");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        compared > 1000 || fixtures().is_empty(),
        "{compared} items compared"
    );
}

#[test]
fn extent_tree_cursor_on_small_nodes_live() {
    let test = "extent_tree_cursor_on_small_nodes_live";
    if !testing::require_live(test) {
        return;
    }
    let live = LiveBtrfs::with_options(
        256 << 20,
        &["-n", "4096", "-O", "^skinny-metadata"],
        "noatime",
    )
    .expect("scratch btrfs");
    let m = live.path().display().to_string();
    // 600 extents of 4 KiB (one write and sync each, out of order), 20
    // reflinked copies (keyed data refs: 21 per extent do not fit inline in
    // 4 KiB nodes), a snapshot, then rewrites in the subvolume (its leaves
    // are COWed away from the snapshot's: shared references).
    shell(&format!(
        "cd {m} && btrfs -q subvolume create sv && cd sv && \
         for i in $(seq 0 599); do \
           dd if=/dev/urandom of=f bs=4096 count=1 seek=$(( (i * 7) % 600 )) conv=notrunc \
              status=none; \
           [ $((i % 50)) -eq 0 ] && sync; \
         done; sync; \
         for c in $(seq 1 20); do cp --reflink=always f f$c; done; \
         mkdir d && for i in $(seq 1 300); do echo $i > d/small$i; done; sync; \
         btrfs -q subvolume snapshot -r {m}/sv {m}/snap; \
         dd if=/dev/urandom of=f bs=4096 count=8 seek=100 conv=notrunc status=none; \
         touch d/small*; sync"
    ));
    shell("sync");
    let fs = Filesystem::open(&[live.scratch_dir().join("fs.img")]).expect("open image");
    let mut failures = Vec::new();
    let (w, random) = every_order("4k-nodes", &fs, 1024, &mut failures);
    every_order("4k-nodes, at most 8 refs", &fs, 8, &mut failures);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The scenario exercises what it is for: random lookups search from
    // nodes below the root (a tree of three levels or more).
    assert!(random.subtree_descents > 0, "{random:?}");
    let mut reader = ExtentTreeReader::new(&fs, 1024).unwrap();
    let (mut tree_block_items, mut shared) = (0, 0);
    for &b in w.items.keys() {
        let r = reader.lookup(b).unwrap().expect("extent item");
        if !r.is_data() && r.key.item_type == ondisk::BTRFS_EXTENT_ITEM_KEY {
            tree_block_items += 1;
        }
        if !r.shared.is_empty() {
            shared += 1;
        }
    }
    assert!(
        w.leaves > 50 && w.split > 0 && w.keyed > 1000 && tree_block_items > 0 && shared > 0,
        "scenario too small: {} leaves, {} extents with refs in the next leaf, {} keyed data refs, \
         {tree_block_items} tree-block EXTENT_ITEMs, {shared} extents with shared refs",
        w.leaves,
        w.split,
        w.keyed
    );
}
