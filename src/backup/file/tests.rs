//! Tests of the stream file: round trips through the writer and the
//! reader, and damage of every kind found where it is.

use std::io::{self, Read, Write};

use super::*;
use crate::backup::store::{LocalStore, Store};

/// A small valid stream: header, SUBVOL-ish commands (content does not
/// matter to the framing), END.
pub(crate) fn stream(cmds: usize) -> Vec<u8> {
    let mut w = stream_format::StreamWriter::new(Vec::new(), 1).unwrap();
    w.write(&stream_format::Command::Subvol {
        path: std::borrow::Cow::Borrowed(b"s"),
        uuid: [1; 16],
        ctransid: 7,
    })
    .unwrap();
    for i in 0..cmds {
        let data = vec![(i % 251) as u8; 1000 + i];
        w.write(&stream_format::Command::Write {
            path: std::borrow::Cow::Borrowed(b"f"),
            offset: (i * 2000) as u64,
            data: std::borrow::Cow::Borrowed(&data),
        })
        .unwrap();
    }
    w.write(&stream_format::Command::End).unwrap();
    w.into_inner()
}

pub(crate) fn id() -> StreamIdentity {
    StreamIdentity {
        uuid: "01010101-0101-0101-0101-010101010101".into(),
        ctransid: 7,
        parent: None,
    }
}

fn write_file(store: &LocalStore, key: &str, raw: &[u8], opts: WriterOptions) -> u64 {
    let up = store.multipart(key).unwrap();
    let mut w = FileWriter::new(up, opts);
    // Odd-sized writes, to split headers, then one large write.
    let (a, b) = raw.split_at(raw.len() / 2);
    for chunk in a.chunks(777) {
        w.write_all(chunk).unwrap();
    }
    w.write_all(b).unwrap();
    w.finish(id()).unwrap().1
}

fn read_all(store: &LocalStore, key: &str) -> Result<Vec<u8>, io::Error> {
    let size = std::fs::metadata(store.root().join(key)).map_or(0, |m| m.len());
    let f = StreamFile::open(store, key, size).map_err(io_damage)?;
    let mut out = Vec::new();
    f.raw_reader(store).read_to_end(&mut out)?;
    Ok(out)
}

fn small() -> WriterOptions {
    WriterOptions::new().with_frame_bytes(8000).with_threads(2)
}

#[test]
fn parallel_frame_check_passes_whole_files_and_fails_damaged_ones() {
    let dir = tempfile::tempdir().unwrap();
    let s = LocalStore::new(dir.path());
    let raw = stream(300);
    let size = write_file(&s, "streams/x", &raw, small());
    let f = StreamFile::open(&s, "streams/x", size).unwrap();
    assert!(f.trailer.frames.len() > 20, "{}", f.trailer.frames.len());
    assert!(crate::backup::verify::check_frames_parallel(
        &s,
        &f,
        &crate::backup::NoProgress
    ));
    // One frame's bytes changed (its hash no longer matches).
    let path = dir.path().join("streams/x");
    let good = std::fs::read(&path).unwrap();
    let mut bad = good.clone();
    let at = usize::try_from(f.trailer.frames[13].offset).unwrap() + 5;
    bad[at] ^= 1;
    std::fs::write(&path, &bad).unwrap();
    assert!(!crate::backup::verify::check_frames_parallel(
        &s,
        &f,
        &crate::backup::NoProgress
    ));
    // A trailer that claims one command more than the frames hold.
    std::fs::write(&path, &good).unwrap();
    let mut more = f.clone();
    more.trailer.commands += 1;
    assert!(!crate::backup::verify::check_frames_parallel(
        &s,
        &more,
        &crate::backup::NoProgress
    ));
    // A stream hash that does not match.
    let mut other = f.clone();
    other.trailer.stream_blake3 = blake3::hash(b"other").to_hex().to_string();
    assert!(!crate::backup::verify::check_frames_parallel(
        &s,
        &other,
        &crate::backup::NoProgress
    ));
    assert!(crate::backup::verify::check_frames_parallel(
        &s,
        &f,
        &crate::backup::NoProgress
    ));
}

#[test]
fn round_trip_many_frames_and_zstd_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = LocalStore::new(dir.path());
    let raw = stream(200);
    let size = write_file(&s, "streams/x", &raw, small());
    let f = StreamFile::open(&s, "streams/x", size).unwrap();
    assert!(f.trailer.frames.len() > 20, "{}", f.trailer.frames.len());
    assert_eq!(f.trailer.commands, 202);
    assert_eq!(f.trailer.proto, 1);
    assert_eq!(f.trailer.stream_bytes, raw.len() as u64);
    assert_eq!(
        f.trailer.stream_blake3,
        blake3::hash(&raw).to_hex().to_string()
    );
    assert_eq!(read_all(&s, "streams/x").unwrap(), raw);
    // Every frame starts at a command boundary: each decompresses to
    // whole commands (the first with the header).
    let mut at = 0usize;
    for (i, fr) in f.trailer.frames.iter().enumerate() {
        let data = f.read_frame(&s, i).unwrap();
        let plain = f.decompress(i, &data).unwrap();
        let mut p = if i == 0 { 17 } else { 0 };
        while p < plain.len() {
            let len = u32::from_le_bytes(plain[p..p + 4].try_into().unwrap()) as usize;
            p += 10 + len;
        }
        assert_eq!(p, plain.len(), "frame {i} ends inside a command");
        at += fr.raw_len as usize;
    }
    assert_eq!(at, raw.len());
    // The zstd tool (the oracle for "restorable without btrsend").
    let out = std::process::Command::new("zstd")
        .arg("-dc")
        .arg(dir.path().join("streams/x"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, raw);
}

#[test]
fn single_thread_and_one_frame() {
    let dir = tempfile::tempdir().unwrap();
    let s = LocalStore::new(dir.path());
    let raw = stream(3);
    let opts = WriterOptions::new().with_threads(0);
    let size = write_file(&s, "a", &raw, opts);
    let f = StreamFile::open(&s, "a", size).unwrap();
    assert_eq!(f.trailer.frames.len(), 1);
    assert_eq!(read_all(&s, "a").unwrap(), raw);
}

#[test]
fn cut_stream_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = LocalStore::new(dir.path());
    let raw = stream(3);
    let mut w = FileWriter::new(s.multipart("a").unwrap(), small());
    w.write_all(&raw[..raw.len() - 5]).unwrap();
    let e = w.finish(id()).unwrap_err();
    assert!(e.to_string().contains("ends inside a command"), "{e}");
    assert!(s.list("").unwrap().is_empty(), "nothing visible");
}

fn damaged(f: impl FnOnce(&mut Vec<u8>, &Trailer)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let s = LocalStore::new(dir.path());
    let raw = stream(100);
    let size = write_file(&s, "x", &raw, small());
    let t = StreamFile::open(&s, "x", size).unwrap().trailer;
    let path = dir.path().join("x");
    let mut bytes = std::fs::read(&path).unwrap();
    f(&mut bytes, &t);
    std::fs::write(&path, &bytes).unwrap();
    match read_all(&s, "x") {
        Ok(_) => panic!("damage not found"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn flipped_byte_in_every_position_class_is_found() {
    let e = damaged(|b, t| {
        let f = &t.frames[3];
        b[(f.offset + f.len / 2) as usize] ^= 0x40;
    });
    assert!(e.contains("x: frame 3 (bytes"), "{e}");
    assert!(e.contains("BLAKE3 mismatch"), "{e}");
    let e = damaged(|b, _| {
        let n = b.len();
        b[n - 20] ^= 1;
    });
    assert!(e.contains("bad trailer"), "{e}");
    let e = damaged(|b, _| b[0] ^= 1);
    assert!(e.contains("frame 0 (bytes 0.."), "{e}");
}

#[test]
fn truncation_is_found() {
    let e = damaged(|b, _| b.truncate(b.len() - 1));
    assert!(e.contains("bad trailer: no end magic"), "{e}");
    let e = damaged(|b, t| b.truncate(t.frames[2].offset as usize));
    assert!(e.contains("bad trailer"), "{e}");
    let e = damaged(|b, _| b.truncate(3));
    assert!(e.contains("only 3 bytes long"), "{e}");
}

#[test]
fn swapped_frames_are_found() {
    let e = damaged(|b, t| {
        // Two frames of the same length, swapped.
        let (a, c) = t
            .frames
            .iter()
            .enumerate()
            .find_map(|(i, f)| {
                t.frames
                    .iter()
                    .enumerate()
                    .skip(i + 1)
                    .find(|(_, g)| g.len == f.len && g.blake3 != f.blake3)
                    .map(|(j, _)| (i, j))
            })
            .expect("two frames of equal length");
        let fa = t.frames[a].clone();
        let fc = t.frames[c].clone();
        let xa = b[fa.offset as usize..(fa.offset + fa.len) as usize].to_vec();
        let xc = b[fc.offset as usize..(fc.offset + fc.len) as usize].to_vec();
        b[fa.offset as usize..(fa.offset + fa.len) as usize].copy_from_slice(&xc);
        b[fc.offset as usize..(fc.offset + fc.len) as usize].copy_from_slice(&xa);
    });
    assert!(e.contains("BLAKE3 mismatch"), "{e}");
}

#[test]
fn missing_file_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let s = LocalStore::new(dir.path());
    let e = StreamFile::open(&s, "streams/gone", 1000).unwrap_err();
    assert!(
        matches!(e, ReadError::Store(ref s) if s.is_not_found()),
        "{e}"
    );
}
