//! The send pipeline (issue 4): file data read by worker threads ahead of
//! one ordered writer must not change a byte of the stream.
//!
//! * with 0 (data read on the calling thread), 1 and 3 data threads, the
//!   full streams of the fixtures with large files, holes and prealloc,
//!   compressed extents and many small files are byte for byte the
//!   kernel's stored streams, v1 and v2 with `--compressed-data`;
//! * a corrupt data block deep in a large file, sent with verification,
//!   fails the same way whatever the thread count: the same error (inode,
//!   path, file offset, logical address), after the same bytes, which are
//!   a prefix of the kernel's stream — errors come in stream order;
//! * so does a compressed extent that no longer decompresses (no
//!   verification: the decoder notices), naming inode, path, file offset
//!   and algorithm.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use btrsend::fs::items::{Compression, ExtentData};
use btrsend::fs::{Filesystem, WalkOptions};
use btrsend::send::{self, NoProgress, SendOptions};
use btrsend::types::Logical;

use crate::reader::fixtures;
use crate::send::{our_stream, read_zst};

const FIXTURES: [(&str, &str); 4] = [
    ("002-many-files", "snaps/m1"),
    ("003-large-files", "snaps/l2"),
    ("004-sparse-prealloc", "snaps/h2"),
    ("006-compression", "snaps/c2"),
];

fn fixture_devices(name: &str) -> (PathBuf, Vec<PathBuf>) {
    let fx = fixtures()
        .into_iter()
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("no fixture {name}"));
    (fx.dir, fx.devices)
}

#[test]
fn streams_are_the_kernels_whatever_the_thread_count() {
    for (name, snap) in FIXTURES {
        let (dir, devices) = fixture_devices(name);
        let s = snap.rsplit('/').next().unwrap();
        for (v, opts) in [
            ("v1", SendOptions::new(1)),
            ("v2c", SendOptions::new(2).with_compressed_data(true)),
        ] {
            let kernel = read_zst(&dir.join(format!("{s}.full.{v}.stream.zst")));
            for threads in [0, 1, 3] {
                let ours = our_stream(&devices, snap, opts.with_threads(threads));
                assert!(
                    ours == kernel,
                    "{name} {s} {v} with {threads} data threads: the stream differs from the \
                     kernel's ({} bytes, kernel {})",
                    ours.len(),
                    kernel.len()
                );
            }
        }
    }
}

/// The largest uncompressed, checksummed regular extent of snapshot
/// `tree`: (ino, file offset, disk_bytenr, num_bytes).
fn largest_extent(fs: &Filesystem, tree: u64) -> (u64, u64, u64, u64) {
    let t = fs.fs_tree(btrsend::types::TreeId(tree)).unwrap();
    let mut best = None;
    for g in t.inodes(WalkOptions::default()) {
        let g = g.unwrap();
        for e in &g.extents {
            if let ExtentData::Regular(d) = &e.data
                && d.disk_bytenr.get() != 0
                && d.offset == 0
                && e.compression == Compression::None
                && !g.inode.nodatasum()
                && best.is_none_or(|(_, _, _, n)| d.num_bytes > n)
            {
                best = Some((g.inode.ino, e.file_offset, d.disk_bytenr.get(), d.num_bytes));
            }
        }
    }
    best.expect("an uncompressed data extent")
}

#[test]
fn a_bad_data_block_fails_in_order_whatever_the_thread_count() {
    let (dir, devices) = fixture_devices("003-large-files");
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("dev1.img");
    std::fs::copy(&devices[0], &img).unwrap();
    let snap = "snaps/l1";
    let (ino, file_offset, logical) = {
        let fs = Filesystem::open(&[&img]).unwrap();
        let sv = send::find_subvolume(&fs, snap).unwrap();
        let (ino, off, bytenr, len) = largest_extent(&fs, sv.id().get());
        assert!(
            len >= 1 << 20,
            "extent of {len} bytes: too small to span jobs"
        );
        // A sector past the first data jobs of the extent.
        let k = (len / 2) / 4096 * 4096;
        let m = fs
            .volume()
            .chunk_map()
            .map(Logical(bytenr + k), 4096)
            .unwrap();
        let loc = m.copies().next().expect("a copy");
        let dev = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        dev.write_all_at(&[0x5a; 4096], loc.physical.get()).unwrap();
        (ino, off + k, bytenr + k)
    };
    let kernel = read_zst(&dir.join("l1.full.v1.stream.zst"));
    let fs = Filesystem::open(&[&img]).unwrap();
    let sv = send::find_subvolume(&fs, snap).unwrap();
    let mut results = Vec::new();
    for threads in [0, 1, 3] {
        let opts = SendOptions::new(1)
            .with_verify_data(true)
            .with_threads(threads);
        let mut out = Vec::new();
        let err = match send::send_full(&fs, &sv, &mut out, opts, &NoProgress) {
            Ok(_) => panic!("{threads} threads: the bad block went unnoticed"),
            Err(e) => e.to_string(),
        };
        for want in [
            format!("inode {ino} ("),
            format!("data of inode {ino} at file offset {file_offset} "),
            format!("logical {logical}, mirror 1 of 1"),
            "checksum".to_owned(),
        ] {
            assert!(
                err.contains(&want),
                "{threads} threads: {want:?} not in {err}"
            );
        }
        assert!(
            out.len() > 17 && kernel.starts_with(&out),
            "{threads} threads: the {} bytes written before the error are not the start of \
             the kernel's stream",
            out.len()
        );
        results.push((threads, err, out));
    }
    let (_, err0, out0) = &results[0];
    for (threads, err, out) in &results[1..] {
        assert_eq!(err, err0, "{threads} threads");
        assert!(
            out == out0,
            "{threads} threads: other bytes before the error"
        );
    }
}

#[test]
fn a_compressed_extent_that_does_not_decompress_fails_in_order() {
    let (dir, devices) = fixture_devices("006-compression");
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("dev1.img");
    std::fs::copy(&devices[0], &img).unwrap();
    let snap = "snaps/c1";
    // The first compressed regular extent of the snapshot (the send reads
    // inodes in this order): its first sector overwritten.
    let (ino, file_offset) = {
        let fs = Filesystem::open(&[&img]).unwrap();
        let sv = send::find_subvolume(&fs, snap).unwrap();
        let t = fs.fs_tree(sv.id()).unwrap();
        let mut found = None;
        for g in t.inodes(WalkOptions::default()) {
            let g = g.unwrap();
            for e in &g.extents {
                if let ExtentData::Regular(d) = &e.data
                    && d.disk_bytenr.get() != 0
                    && e.compression != Compression::None
                    && found.is_none()
                {
                    found = Some((g.inode.ino, e.file_offset, d.disk_bytenr));
                }
            }
        }
        let (ino, off, bytenr) = found.expect("a compressed extent");
        let m = fs.volume().chunk_map().map(bytenr, 4096).unwrap();
        let loc = m.copies().next().expect("a copy");
        let dev = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        dev.write_all_at(&[0x5a; 4096], loc.physical.get()).unwrap();
        (ino, off)
    };
    let kernel = read_zst(&dir.join("c1.full.v1.stream.zst"));
    let fs = Filesystem::open(&[&img]).unwrap();
    let sv = send::find_subvolume(&fs, snap).unwrap();
    let mut first: Option<(String, Vec<u8>)> = None;
    for threads in [0, 3] {
        let mut out = Vec::new();
        // Unverified: the decompressor is what notices (verified, the
        // checksum mismatch comes first).
        let opts = SendOptions::new(1)
            .with_threads(threads)
            .with_verify_data(false);
        let err = match send::send_full(&fs, &sv, &mut out, opts, &NoProgress) {
            Ok(_) => panic!("{threads} threads: the corrupt extent went unnoticed"),
            Err(e) => e.to_string(),
        };
        for want in [
            format!("inode {ino} ("),
            format!("data of inode {ino} at file offset {file_offset} "),
            " data: ".to_owned(),
        ] {
            assert!(
                err.contains(&want),
                "{threads} threads: {want:?} not in {err}"
            );
        }
        assert!(
            out.len() > 17 && kernel.starts_with(&out),
            "{threads} threads: what was written before the error is not the kernel's"
        );
        match &first {
            None => first = Some((err, out)),
            Some((e0, o0)) => {
                assert_eq!(&err, e0);
                assert!(
                    &out == o0,
                    "{threads} threads: other bytes before the error"
                );
            }
        }
    }
}

/// A send continued at any byte of the stream (what a mounted send does
/// after a balance moved blocks, issue 14) writes exactly the rest of the
/// kernel's stream: the commands before the point are planned and dropped,
/// a command the point cuts is written without its head; the kernel's
/// stream is the oracle. A resume token of the stream's real point is
/// accepted, one with another shape or point refused.
#[test]
fn a_send_continued_at_any_byte_writes_the_rest_of_the_kernels_stream() {
    use btrsend::resume::{FIRST_COMMAND, Shape, Token};
    use btrsend::send::ResumeFrom;
    for (name, snap) in FIXTURES {
        let (dir, devices) = fixture_devices(name);
        let s = snap.rsplit('/').next().unwrap();
        for (v, opts) in [
            ("v1", SendOptions::new(1)),
            ("v2c", SendOptions::new(2).with_compressed_data(true)),
        ] {
            let kernel = read_zst(&dir.join(format!("{s}.full.{v}.stream.zst")));
            let fs = Filesystem::open(&devices).unwrap();
            let sv = send::find_subvolume(&fs, snap).unwrap();
            let len = kernel.len() as u64;
            let mut rng = btrsend::testing::workload::Rng::new(len);
            let mut points = vec![0, 1, 16, 17, 18, len / 2, len - 10, len - 1];
            points.extend((0..8).map(|_| rng.below(len)));
            for at in points {
                let (rest, _) = send::send_resumed(
                    &fs,
                    &sv,
                    None,
                    &[],
                    Vec::new(),
                    opts,
                    ResumeFrom::Offset(at),
                    &NoProgress,
                )
                .unwrap();
                assert!(
                    rest[..] == kernel[at as usize..],
                    "{name} {s} {v} continued at byte {at}: {} bytes, want {}",
                    rest.len(),
                    len - at
                );
            }
            // A token of the real point of command k (its offset and
            // shape from the kernel's stream) gives the continuation
            // header and the rest; a wrong shape is refused.
            let mut r = btrsend::stream_format::StreamReader::new(&kernel[..]);
            let (mut shape, mut k, mut offset) = (Shape::default(), 0u64, FIRST_COMMAND);
            let stop = 1 + rng.below(20);
            while let Some((info, _)) = r.next_raw().unwrap() {
                if k == stop {
                    break;
                }
                let n = u64::from(info.len) + 10;
                shape.push(info.cmd, n);
                k += 1;
                offset += n;
            }
            let t = Token {
                uuid: sv.root.uuid.0,
                ctransid: sv.root.ctransid.get(),
                parent_uuid: [0; 16],
                parent_ctransid: 0,
                version: opts.version,
                index: k,
                offset,
                shape,
            };
            let (cont, _) = send::send_resumed(
                &fs,
                &sv,
                None,
                &[],
                Vec::new(),
                opts,
                ResumeFrom::Token(&t),
                &NoProgress,
            )
            .unwrap();
            let head = btrsend::resume::continuation_header(&t);
            assert!(cont[..head.len()] == head[..]);
            assert!(
                cont[head.len()..] == kernel[offset as usize..],
                "{name} {v} token"
            );
            let mut bad = t;
            bad.shape.push(1, 1);
            let e = send::send_resumed(
                &fs,
                &sv,
                None,
                &[],
                Vec::new(),
                opts,
                ResumeFrom::Token(&bad),
                &NoProgress,
            )
            .unwrap_err();
            assert!(
                e.to_string().contains("differ from the interrupted send"),
                "{e}"
            );
        }
    }
}
