//! A full key-order walk of the largest fs tree of fixture 002 (many small
//! files, 4 KiB nodes), readahead off and on.
//!
//! Three cases per setting: `page-cache` drops the block cache before each
//! walk, so every block is read again (from the OS page cache: this is the
//! CPU cost of reading, verifying and walking); `block-cache` walks with
//! every block already cached. Criterion reports items per second. The
//! cold-cache numbers (after `drop_caches`) come from `benches/walk-cold-warm`,
//! which needs root and a large filesystem.

// criterion_group! makes an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::path::{Path, PathBuf};

use btrsend::device::readahead::ReadOptions;
use btrsend::fs::Filesystem;
use btrsend::tree::key::Key;
use btrsend::tree::walk::{TreeRoot, for_each_in_range};
use btrsend::types::TreeId;
use btrsend::volume::Volume;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

/// Unpack the fixture image once (outside the timed loops).
fn image() -> Option<PathBuf> {
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/002-many-files/dev1.img.zst");
    if !src.exists() {
        eprintln!(
            "=== tree_walk bench: {} missing: nothing measured ===",
            src.display()
        );
        return None;
    }
    let dest = std::env::temp_dir().join("btrsend-bench-002.img");
    if !dest.exists() {
        let tmp = dest.with_extension("part");
        let mut dec = zstd::stream::read::Decoder::new(std::fs::File::open(&src).ok()?).ok()?;
        let mut out = std::fs::File::create(&tmp).ok()?;
        std::io::copy(&mut dec, &mut out).ok()?;
        std::fs::rename(&tmp, &dest).ok()?;
    }
    Some(dest)
}

fn deepest_tree(fs: &Filesystem) -> TreeRoot {
    let mut roots = vec![fs.tree_root(TreeId::FS).unwrap()];
    for s in btrsend::fs::subvol::list_subvolumes(fs).unwrap() {
        roots.push(s.root.tree_root());
    }
    roots.into_iter().max_by_key(|r| r.level).unwrap()
}

fn walk(fs: &Filesystem, root: TreeRoot) -> u64 {
    let mut n = 0u64;
    for_each_in_range(fs.volume(), root, &Key::MIN, &Key::MAX, |item| {
        black_box(item.data);
        n += 1;
        Ok(())
    })
    .unwrap();
    n
}

fn tree_walk(c: &mut Criterion) {
    let Some(img) = image() else {
        return;
    };
    let mut g = c.benchmark_group("tree_walk");
    for (name, options) in [
        ("readahead-off", ReadOptions::no_readahead()),
        ("readahead-on", ReadOptions::default()),
    ] {
        let fs = Filesystem::from_volume(Volume::open_with(&[&img], &options).unwrap());
        let root = deepest_tree(&fs);
        let items = walk(&fs, root);
        g.throughput(Throughput::Elements(items));
        g.bench_function(BenchmarkId::new("page-cache", name), |b| {
            b.iter(|| {
                fs.volume().drop_cache();
                black_box(walk(&fs, root))
            });
        });
        g.bench_function(BenchmarkId::new("block-cache", name), |b| {
            b.iter(|| black_box(walk(&fs, root)));
        });
    }
    g.finish();
}

criterion_group!(benches, tree_walk);
criterion_main!(benches);
