//! The manifest's content hash (`b3=`) of sparse files: its cost follows
//! the data, not the file size (issue 28: version 1 hashed holes byte by
//! byte, so a file of i_size 2^63 - 1 never finished).
//!
//! * `content_hash/size`: one 4 KiB block of data in files of 1 GiB, 1 TiB
//!   and 2^63 - 1 bytes (the bytes come from memory): the times are equal.
//! * `content_hash/ranges`: 1, 16 and 256 data blocks spread over a file
//!   of 2^63 - 1 bytes: the time grows with the blocks (the holes between
//!   them cost a constant each).
//! * `manifest_dir`: the whole `manifest` of a directory holding one sparse
//!   file (a 4 KiB block at its middle) of each size, on the temporary
//!   directory's filesystem (SEEK_DATA/SEEK_HOLE and `pread`); sizes that
//!   filesystem cannot hold are left out, with a line saying so.
//!
//! Files and ranges are made outside the timed loops.

// criterion_group! makes an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::os::unix::fs::FileExt;

use btrsend::manifest::{Options, content_hash, manifest};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

const SIZES: [(&str, u64); 3] = [
    ("1GiB", 1 << 30),
    ("1TiB", 1 << 40),
    ("2^63-1", i64::MAX.unsigned_abs()),
];

fn fill(off: u64, buf: &mut [u8]) -> Result<(), ()> {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (off as usize + i) as u8 | 1;
    }
    Ok(())
}

fn hash(c: &mut Criterion) {
    let mut g = c.benchmark_group("content_hash");
    for (name, size) in SIZES {
        let ranges = [(size / 2 / 4096 * 4096, 4096)];
        g.bench_with_input(BenchmarkId::new("size", name), &ranges, |b, r| {
            b.iter(|| content_hash(black_box(size), r.iter().copied(), fill).unwrap());
        });
    }
    let size = i64::MAX.unsigned_abs();
    for n in [1u64, 16, 256] {
        let step = size / n / 4096 * 4096;
        let ranges: Vec<(u64, u64)> = (0..n).map(|i| (i * step, 4096)).collect();
        g.bench_with_input(BenchmarkId::new("ranges", n), &ranges, |b, r| {
            b.iter(|| content_hash(black_box(size), r.iter().copied(), fill).unwrap());
        });
    }
    g.finish();

    let mut g = c.benchmark_group("manifest_dir");
    for (name, size) in SIZES {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(dir.path().join("f")).unwrap();
        if let Err(e) = f.set_len(size) {
            eprintln!(
                "manifest_dir/{name}: left out, the temporary directory's filesystem cannot hold it: {e}"
            );
            continue;
        }
        f.write_all_at(&[7u8; 4096], size / 2 / 4096 * 4096)
            .unwrap();
        drop(f);
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| manifest(black_box(dir.path()), Options { holes: true }).unwrap());
        });
    }
    g.finish();
}

criterion_group!(benches, hash);
criterion_main!(benches);
