//! The block cache and readahead behind `Volume`'s `BlockSource`: walks
//! give the same items whatever the read options; a forward scan announces
//! every block before it reads it, once; readahead failures never fail a
//! walk (the demand read reports); data prefetch. And the verification every
//! cached block passed: thousands of mutated real blocks give a located
//! error or a sound view, never a panic.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::PathBuf;

use btrsend::Result;
use btrsend::device::readahead::ReadOptions;
use btrsend::fs::Filesystem;
use btrsend::tree::check::BlockExpect;
use btrsend::tree::key::Key;
use btrsend::tree::node::{Node, TreeBlock};
use btrsend::tree::walk::{BlockSource, Cursor, TreeRoot, for_each_in_range};
use btrsend::types::{Logical, TreeId};
use btrsend::volume::Volume;

use super::raid56::{all_items, extents};
use super::reader::fixtures;

fn open(devices: &[PathBuf], options: &ReadOptions) -> Filesystem {
    Filesystem::from_volume(Volume::open_with(devices, options).unwrap())
}

fn option_sets() -> Vec<(&'static str, ReadOptions)> {
    vec![
        ("default", ReadOptions::default()),
        ("off", ReadOptions::no_readahead()),
        (
            "tiny cache, window 1, one thread",
            ReadOptions {
                readahead: true,
                threads: 1,
                window: 1,
                cache_bytes: 64 << 10,
                data_queue_bytes: 1 << 20,
                ..ReadOptions::default()
            },
        ),
        (
            "no cache, wide window",
            ReadOptions {
                readahead: true,
                threads: 8,
                window: 1000,
                cache_bytes: 0,
                data_queue_bytes: 1 << 20,
                ..ReadOptions::default()
            },
        ),
    ]
}

#[test]
fn walks_agree_whatever_the_read_options() {
    for fx in fixtures() {
        let reference = all_items(&open(&fx.devices, &ReadOptions::no_readahead()));
        for (name, options) in option_sets() {
            let fs = open(&fx.devices, &options);
            // Twice: cold, then from the cache.
            for pass in 0..2 {
                let items = all_items(&fs);
                assert!(items == reference, "{} with {name}, pass {pass}", fx.name());
            }
            let stats = fs.volume().cache_stats();
            if options.cache_bytes >= 1 << 20 {
                assert!(stats.hits > 0, "{} {name}: {stats:?}", fx.name());
            }
            if !options.readahead {
                assert_eq!(stats.prefetch_queued, 0);
            }
        }
    }
}

/// A source that records what the walker announces and reads, and
/// "prefetches" instantly: an announced block is read at once, so
/// [`BlockSource::cached`] holds it as a perfect readahead pool would.
struct Recorder<'a> {
    vol: &'a Volume,
    window: usize,
    store: RefCell<HashMap<Logical, TreeBlock>>,
    announced: RefCell<Vec<Logical>>,
    reads: RefCell<Vec<(Logical, bool)>>,
    hint_calls: RefCell<usize>,
}

impl<'a> Recorder<'a> {
    fn new(vol: &'a Volume, window: usize) -> Recorder<'a> {
        Recorder {
            vol,
            window,
            store: RefCell::default(),
            announced: RefCell::default(),
            reads: RefCell::default(),
            hint_calls: RefCell::default(),
        }
    }
}

impl BlockSource for Recorder<'_> {
    fn read_block(&self, expect: &BlockExpect) -> Result<TreeBlock> {
        let was_announced = self.announced.borrow().contains(&expect.logical);
        self.reads
            .borrow_mut()
            .push((expect.logical, was_announced));
        let block = self.vol.read_block(expect)?;
        self.store
            .borrow_mut()
            .insert(expect.logical, block.clone());
        Ok(block)
    }

    fn will_need(&self, upcoming: &[BlockExpect]) {
        *self.hint_calls.borrow_mut() += 1;
        for e in upcoming {
            self.announced.borrow_mut().push(e.logical);
            let block = self.vol.read_block(e).unwrap();
            self.store.borrow_mut().insert(e.logical, block);
        }
    }

    fn readahead_window(&self) -> usize {
        self.window
    }

    fn cached(&self, expect: &BlockExpect) -> Option<TreeBlock> {
        self.store.borrow().get(&expect.logical).cloned()
    }
}

/// The fs tree of the fixture with the most tree levels (4 KiB nodes).
fn deep_tree() -> Option<(Filesystem, TreeRoot)> {
    let fx = fixtures()
        .into_iter()
        .find(|f| f.name().starts_with("002"))?;
    let fs = open(&fx.devices, &ReadOptions::no_readahead());
    let root = fs.tree_root(TreeId::FS).ok()?;
    let snaps = btrsend::fs::subvol::list_subvolumes(&fs).unwrap();
    let root = snaps
        .iter()
        .map(|s| s.root.tree_root())
        .chain([root])
        .max_by_key(|r| r.level)
        .unwrap();
    assert!(root.level >= 2, "002 should have a deep tree");
    Some((fs, root))
}

#[test]
fn forward_scan_announces_every_block_before_reading_it_once() {
    let Some((fs, root)) = deep_tree() else {
        return;
    };
    for window in [1, 3, 64, 10_000] {
        let rec = Recorder::new(fs.volume(), window);
        let mut items = 0usize;
        let mut leaves = HashSet::new();
        for_each_in_range(&rec, root, &Key::MIN, &Key::MAX, |item| {
            items += 1;
            leaves.insert(item.leaf);
            Ok(())
        })
        .unwrap();
        let reads = rec.reads.borrow();
        let announced = rec.announced.borrow();
        // The seek reads the path to the first leaf unannounced; after that,
        // every block was announced before it was needed.
        let seek_path = usize::from(root.level) + 1;
        let late: Vec<_> = reads[seek_path..].iter().filter(|r| !r.1).collect();
        assert!(
            late.is_empty(),
            "window {window}: read before announced: {late:?}"
        );
        // Nothing is announced twice.
        let unique: HashSet<_> = announced.iter().collect();
        assert_eq!(unique.len(), announced.len(), "window {window}");
        // Every block of the tree was read once: the seek path, then what
        // was announced.
        assert_eq!(reads.len(), seek_path + announced.len(), "window {window}");
        assert!(leaves.len() > 10);
        // Hints came at every leaf step (the recorder holds everything
        // announced, so each step finds its blocks cached).
        if window == 1 {
            assert_eq!(*rec.hint_calls.borrow(), leaves.len() - 1);
        }
        assert!(items > leaves.len());
    }
    // A lone seek (a point lookup), and steps within the leaf it found (a
    // short range lookup), announce nothing; the first step to the next
    // leaf starts the readahead, announcing that leaf before reading it.
    let rec = Recorder::new(fs.volume(), 64);
    let mut cursor = Cursor::new(&rec, root);
    cursor.find(&Key::new(256, 1, 0)).unwrap();
    assert_eq!(*rec.hint_calls.borrow(), 0);
    assert!(cursor.advance().unwrap());
    assert_eq!(*rec.hint_calls.borrow(), 0);
    let first_leaf = cursor.current().unwrap().leaf;
    while cursor.current().unwrap().leaf == first_leaf {
        assert!(cursor.advance().unwrap());
    }
    assert!(*rec.hint_calls.borrow() >= 1);
    // The window ramps up (2, then doubling per leaf step): one leaf step
    // asks for a few blocks per level, not the source's 64.
    let asked = rec.announced.borrow().len();
    assert!(
        asked <= 8 * usize::from(root.level) && asked < 64,
        "a short range crossing one leaf boundary announced {asked} blocks"
    );
    let second_leaf = cursor.current().unwrap().leaf;
    let reads = rec.reads.borrow();
    let last = reads.last().unwrap();
    assert_eq!(last.0, second_leaf);
    assert!(last.1, "the second leaf was read before it was announced");
}

/// A leaf in the middle of `tree` (one the readahead reaches before the
/// walk does) and the physical offsets of its copies.
fn middle_leaf_copies(devices: &[PathBuf], tree: TreeId) -> (Logical, Vec<u64>) {
    let fs = open(devices, &ReadOptions::no_readahead());
    let root = fs.tree_root(tree).unwrap();
    let mut leaves = Vec::new();
    for_each_in_range(fs.volume(), root, &Key::MIN, &Key::MAX, |item| {
        if leaves.last() != Some(&item.leaf) {
            leaves.push(item.leaf);
        }
        Ok(())
    })
    .unwrap();
    let leaf = leaves[leaves.len() / 2];
    let copies = fs
        .volume()
        .chunk_map()
        .map(leaf, 1)
        .unwrap()
        .copies()
        .map(|c| c.physical.get())
        .collect();
    (leaf, copies)
}

/// Corrupt the copies of a leaf one by one: while one is good, every read
/// option set walks as before; when none is, readahead on or off gives the
/// same error, naming the block.
fn corrupt_leaf_case(prefix: &str) {
    let Some(fx) = fixtures()
        .into_iter()
        .find(|f| f.name().starts_with(prefix) && f.devices.len() == 1)
    else {
        return;
    };
    let reference = all_items(&open(&fx.devices, &ReadOptions::no_readahead()));
    let (leaf, copies) = middle_leaf_copies(&fx.devices, TreeId::FS);
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("dev1.img");
    fs::copy(&fx.devices[0], &img).unwrap();
    let mut bytes = fs::read(&img).unwrap();
    for (i, &at) in copies.iter().enumerate() {
        bytes[usize::try_from(at).unwrap() + 200] ^= 0xff;
        fs::write(&img, &bytes).unwrap();
        if i + 1 < copies.len() {
            for (name, options) in option_sets() {
                let items = all_items(&open(std::slice::from_ref(&img), &options));
                assert!(items == reference, "{prefix}: {} bad copies, {name}", i + 1);
            }
        }
    }
    let error = |options: &ReadOptions| {
        let fs = open(std::slice::from_ref(&img), options);
        let root = fs.tree_root(TreeId::FS).unwrap();
        for_each_in_range(fs.volume(), root, &Key::MIN, &Key::MAX, |_| Ok(()))
            .unwrap_err()
            .to_string()
    };
    let off = error(&ReadOptions::no_readahead());
    assert!(
        off.starts_with(&format!("corrupt tree block at logical {leaf} (tree 5): ")),
        "{off}"
    );
    for (name, options) in option_sets() {
        assert_eq!(error(&options), off, "{prefix}: {name}");
    }
}

#[test]
fn readahead_errors_never_fail_a_walk_the_demand_read_reports() {
    // Single metadata with 4 KiB nodes (many leaves), and DUP.
    corrupt_leaf_case("002");
    corrupt_leaf_case("014");
}

#[test]
fn data_prefetch_is_bounded_and_reads_agree() {
    let Some(fx) = fixtures().into_iter().find(|f| f.name().starts_with("003")) else {
        return;
    };
    let fs = open(&fx.devices, &ReadOptions::default());
    let ranges: Vec<(Logical, u64)> = extents(&fs)
        .into_iter()
        .map(|(s, l)| (Logical(s), l))
        .collect();
    let total: u64 = ranges.iter().map(|r| r.1).sum();
    let queued = fs.volume().prefetch_data(&ranges);
    assert!(queued > 0);
    assert!(queued <= total.min(fs.volume().read_options().data_queue_bytes));
    let off = open(&fx.devices, &ReadOptions::no_readahead());
    assert_eq!(off.volume().prefetch_data(&ranges), 0);
    for &(start, len) in ranges.iter().take(50) {
        let mut a = vec![0u8; usize::try_from(len).unwrap()];
        let mut b = a.clone();
        fs.volume().read_logical(start, &mut a).unwrap();
        off.volume().read_logical(start, &mut b).unwrap();
        assert!(a == b, "extent at {start}");
    }
}

/// Files read in order through the file reader prefetch their next
/// extents (readahead on only) and read the same bytes as without, from
/// the start, from the middle and after seeking back.
#[test]
fn file_reads_prefetch_ahead_and_agree() {
    let Some(fx) = fixtures().into_iter().find(|f| f.name().starts_with("003")) else {
        return;
    };
    let on = open(&fx.devices, &ReadOptions::default());
    let off = open(&fx.devices, &ReadOptions::no_readahead());
    let read_all = |fs: &Filesystem, verify: bool| {
        let snap = btrsend::fs::subvol::list_subvolumes(fs).unwrap()[0].id();
        let tree = fs.fs_tree(snap).unwrap();
        let mut files = Vec::new();
        for g in tree.inodes(btrsend::fs::WalkOptions::default()) {
            let g = g.unwrap();
            if g.inode.file_type() != btrsend::fs::FileType::Regular
                || g.inode.size < (1 << 20)
                || g.inode.size > (64 << 20)
            {
                continue;
            }
            let mut r = tree.reader(&g.inode, verify);
            let mut data = Vec::new();
            let mut buf = vec![0u8; 256 << 10];
            loop {
                let n = r.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                data.extend_from_slice(&buf[..n]);
            }
            // Back to the middle, then to the start.
            let size = data.len();
            let mut part = vec![0u8; size / 2];
            r.read_exact_at(u64::try_from(size / 3).unwrap(), &mut part)
                .unwrap();
            assert!(part == data[size / 3..size / 3 + size / 2]);
            r.read_exact_at(0, &mut part).unwrap();
            assert!(part == data[..size / 2]);
            files.push((g.inode.ino, data));
        }
        files
    };
    let want = read_all(&off, true);
    assert!(!want.is_empty(), "003 has files of 1 MiB and more");
    assert_eq!(off.volume().data_prefetch_queued(), 0);
    for verify in [true, false] {
        let before = on.volume().data_prefetch_queued();
        assert!(read_all(&on, verify) == want, "verify {verify}");
        assert!(on.volume().data_prefetch_queued() > before);
    }
}

/// A filesystem and some of its tree blocks, with what they were read as.
type BlockSet = (Filesystem, Vec<(BlockExpect, Vec<u8>)>);

/// Real tree blocks (leaves and root nodes of several trees) of fixtures
/// with 4, 16 and 64 KiB nodes.
fn real_blocks() -> Vec<BlockSet> {
    let mut out = Vec::new();
    for prefix in ["001", "002", "007"] {
        let Some(fx) = fixtures()
            .into_iter()
            .find(|f| f.name().starts_with(prefix))
        else {
            continue;
        };
        let fs = open(&fx.devices, &ReadOptions::no_readahead());
        let mut roots = vec![fs.volume().root_tree(), fs.volume().chunk_tree()];
        roots.push(fs.tree_root(TreeId::FS).unwrap());
        for s in btrsend::fs::subvol::list_subvolumes(&fs).unwrap() {
            roots.push(s.root.tree_root());
        }
        let mut blocks = Vec::new();
        for root in roots {
            let expect = root.expect();
            let block = fs.volume().read_block(&expect).unwrap();
            blocks.push((expect, block.bytes().to_vec()));
            let mut leaves = Vec::new();
            for_each_in_range(fs.volume(), root, &Key::MIN, &Key::MAX, |item| {
                if leaves.last() != Some(&item.leaf) && leaves.len() < 6 {
                    leaves.push(item.leaf);
                }
                Ok(())
            })
            .unwrap();
            for leaf in leaves.into_iter().filter(|&l| l != root.logical) {
                // A leaf reached without its parent pointer: expect what it
                // holds (level 0, its own generation).
                let mut raw = vec![0u8; fs.volume().superblock().nodesize as usize];
                fs.volume().read_logical(leaf, &mut raw).unwrap();
                let generation = btrsend::types::Generation(u64::from_le_bytes(
                    raw[0x50..0x58].try_into().unwrap(),
                ));
                blocks.push((
                    BlockExpect {
                        logical: leaf,
                        tree: root.tree,
                        generation,
                        level: 0,
                        first_key: None,
                    },
                    raw,
                ));
            }
        }
        out.push((fs, blocks));
    }
    out
}

#[test]
fn mutated_real_blocks_give_located_errors_never_panics() {
    let sets = real_blocks();
    if sets.is_empty() {
        return;
    }
    let mut seed = 0x853c_49e6_748f_ea9bu64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut accepted, mut rejected) = (0usize, 0usize);
    let mut kinds = HashSet::new();
    for (fs, blocks) in &sets {
        let check = fs.volume().block_check();
        for (expect, good) in blocks {
            // The real block passes as it is.
            Node::new(good, check, expect).unwrap();
            for round in 0..400 {
                let mut b = good.clone();
                let pick = |r: u64, n: usize| usize::try_from(r).unwrap() % n;
                for _ in 0..1 + round % 4 {
                    let r = next();
                    let len = b.len();
                    if len <= 0x65 + 40 * 25 {
                        break;
                    }
                    match r % 6 {
                        // Any byte.
                        0 => b[pick(r >> 8, len)] ^= (r >> 40) as u8 | 1,
                        // A header field: nritems, level, owner, bytenr.
                        1 => b[0x60 + pick(r >> 8, 5)] = (r >> 32) as u8,
                        2 => b[0x58 + pick(r >> 8, 8)] ^= 1 << pick(r >> 20, 8),
                        // Item headers / key pointers: offsets, sizes, keys.
                        3 | 4 => {
                            let at = 0x65 + pick(r >> 8, 40 * 25);
                            if at + 4 <= len {
                                b[at..at + 4].copy_from_slice(&((r >> 32) as u32).to_le_bytes());
                            }
                        }
                        // A short or long block.
                        _ => b.resize(pick(r >> 8, 2 * len), (r >> 50) as u8),
                    }
                }
                if b.len() >= 0x20 && round % 3 != 0 {
                    // Reseal, so the checks past the checksum run.
                    let c = check.csum_type.compute(&b[0x20..]);
                    b[..c.as_bytes().len()].copy_from_slice(c.as_bytes());
                }
                match Node::new(&b, check, expect) {
                    Ok(node) => {
                        accepted += 1;
                        for i in 0..=node.nritems() {
                            let _ = (node.key(i), node.item(i), node.ptr(i));
                        }
                        let _ = node.search(&Key::MAX);
                    }
                    Err(e) => {
                        rejected += 1;
                        let msg = e.to_string();
                        assert!(
                            msg.starts_with("corrupt ")
                                && msg.contains(&format!(
                                    " at logical {} (tree {})",
                                    expect.logical, expect.tree
                                )),
                            "unlocated error: {msg}"
                        );
                        let kind = msg
                            .split(": ")
                            .nth(1)
                            .unwrap_or("")
                            .split(' ')
                            .next()
                            .unwrap_or("");
                        kinds.insert(kind.to_owned());
                    }
                }
            }
        }
    }
    assert!(rejected + accepted >= 3000, "{rejected} + {accepted}");
    assert!(
        rejected > accepted,
        "{rejected} rejected, {accepted} accepted"
    );
    // Many different checks fired, not just the checksum.
    assert!(kinds.len() >= 6, "{kinds:?}");
}
