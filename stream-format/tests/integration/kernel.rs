//! Kernel streams: `dump` equals `btrfs receive --dump` (btrfs-progs 6.2, TZ=UTC)
//! byte for byte, and decode → encode reproduces the kernel's bytes.

use std::fs;

use jiff::tz::TimeZone;
use stream_format::dump::{DumpOptions, dump};
use stream_format::{Command, StreamReader, StreamWriter, WriterOptions};

use crate::common::{self, KernelStream};

fn utc() -> DumpOptions {
    DumpOptions::with_time_zone(TimeZone::UTC)
}

/// Every kernel stream we have: shared fixtures and repository fixtures.
fn all_streams() -> Option<Vec<KernelStream>> {
    let dir = common::send_streams_dir();
    let mut v = common::shared_streams(&dir);
    let repo = common::repo_fixture_streams();
    eprintln!(
        "{} shared and {} tests/fixtures kernel streams",
        v.len(),
        repo.len()
    );
    v.extend(repo);
    Some(v)
}

#[test]
fn dump_matches_btrfs_progs() {
    let Some(streams) = all_streams() else { return };
    assert!(!streams.is_empty());
    for s in &streams {
        let mut out = Vec::new();
        let res = dump(s.stream.as_slice(), &mut out, &utc());
        assert!(res.is_ok(), "{}: {}", s.name, res.unwrap_err());
        if out != s.dump {
            let ours = String::from_utf8_lossy(&out);
            let theirs = String::from_utf8_lossy(&s.dump);
            let first = ours.lines().zip(theirs.lines()).position(|(a, b)| a != b);
            panic!(
                "{}: dump differs (first differing line {first:?})\nours:   {:?}\nprogs:  {:?}",
                s.name,
                first.and_then(|i| ours.lines().nth(i)),
                first.and_then(|i| theirs.lines().nth(i)),
            );
        }
    }
    eprintln!("dump checked on {} kernel streams", streams.len());
}

/// Decode every command (typed) and write it again; the whole file, including
/// concatenated streams, must come out identical.
fn reencode_typed(bytes: &[u8]) -> Vec<u8> {
    let mut reader = StreamReader::new(bytes);
    let mut out = Vec::new();
    let mut current: Option<(u32, StreamWriter<Vec<u8>>)> = None;
    while let Some((info, cmd)) = reader.next_command().unwrap() {
        if current.as_ref().map(|(s, _)| *s) != Some(info.stream) {
            if let Some((_, w)) = current.take() {
                out.extend(w.into_inner());
            }
            current = Some((
                info.stream,
                StreamWriter::new(Vec::new(), info.version).unwrap(),
            ));
        }
        let (_, w) = current.as_mut().unwrap();
        w.write(&cmd).unwrap_or_else(|e| panic!("{info}: {e}"));
        // Owned copies encode the same.
        let owned: Command<'static> = cmd.into_owned();
        let mut again = StreamWriter::with_options(
            Vec::new(),
            WriterOptions::new(info.version).without_header(),
        )
        .unwrap();
        again.write(&owned).unwrap();
    }
    if let Some((_, w)) = current {
        out.extend(w.into_inner());
    }
    out
}

fn reencode_raw(bytes: &[u8]) -> Vec<u8> {
    let mut reader = StreamReader::new(bytes);
    let mut out = Vec::new();
    let mut stream = None;
    let mut w: Option<StreamWriter<Vec<u8>>> = None;
    while let Some((info, raw)) = reader.next_raw().unwrap() {
        if stream != Some(info.stream) {
            if let Some(w) = w.take() {
                out.extend(w.into_inner());
            }
            w = Some(StreamWriter::new(Vec::new(), info.version).unwrap());
            stream = Some(info.stream);
        }
        w.as_mut().unwrap().write_raw(&raw).unwrap();
    }
    if let Some(w) = w {
        out.extend(w.into_inner());
    }
    out
}

#[test]
fn decode_encode_reproduces_kernel_bytes() {
    let Some(streams) = all_streams() else { return };
    for s in &streams {
        assert!(
            reencode_typed(&s.stream) == s.stream,
            "{}: typed re-encoding differs",
            s.name
        );
        assert!(
            reencode_raw(&s.stream) == s.stream,
            "{}: raw re-encoding differs",
            s.name
        );
    }
    eprintln!("round trip checked on {} kernel streams", streams.len());
}

/// The malformed streams (derived from tiny.v1 by hand): our stdout equals what
/// btrfs-progs printed before failing, we fail exactly where progs returned 1, and
/// our error (wording differs from progs on purpose) names the offset.
#[test]
fn malformed_streams_like_btrfs_progs() {
    let dir = common::send_streams_dir();
    let dir = dir.join("malformed");
    let cases = common::files_with_suffix(&dir, ".stream");
    assert!(cases.len() >= 13, "{}", cases.len());
    for case in &cases {
        let stream = fs::read(case).unwrap();
        let stdout = fs::read(case.with_extension("stdout")).unwrap();
        let rc: i32 = fs::read_to_string(case.with_extension("rc"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let mut out = Vec::new();
        let res = dump(stream.as_slice(), &mut out, &utc());
        let name = case.file_name().unwrap().to_string_lossy();
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&stdout),
            "{name}"
        );
        match res {
            Ok(_) => assert_eq!(rc, 0, "{name}: progs failed, we did not"),
            Err(e) => {
                assert_ne!(rc, 0, "{name}: we failed: {e}");
                assert!(e.to_string().contains("offset"), "{name}: {e}");
            }
        }
    }
}

/// With its CRC check off (for bytes that never left the process), the
/// kernel's stream with a damaged CRC reads as the intact one does; with it
/// on (the default), it is refused.
#[test]
fn crc_check_off_reads_a_bad_crc_as_the_intact_stream() {
    use stream_format::{ReaderOptions, StreamReader};
    let dir = common::send_streams_dir();
    let read = |name: &str, opts: ReaderOptions| {
        let bytes = std::fs::read(dir.join(format!("malformed/{name}.stream"))).unwrap();
        let mut r = StreamReader::with_options(&bytes[..], opts);
        let mut cmds = Vec::new();
        while let Some((_, c)) = r.next_command()? {
            cmds.push(format!("{c:?}"));
        }
        Ok::<_, stream_format::DecodeError>(cmds)
    };
    let bad = read("bad_crc", ReaderOptions::new());
    assert!(bad.is_err(), "{bad:?}");
    let unchecked = read("bad_crc", ReaderOptions::new().with_crc_check(false)).unwrap();
    let mut good = std::fs::read(dir.join("malformed/bad_crc.stream")).unwrap();
    // The damage is one bit of the first command's stored CRC (offset 17 +
    // 6, the value the message above names): undone here.
    good[23] ^= 1;
    let mut r = StreamReader::new(&good[..]);
    let mut intact = Vec::new();
    while let Some((_, c)) = r.next_command().unwrap() {
        intact.push(format!("{c:?}"));
    }
    assert_eq!(unchecked, intact);
    assert!(!intact.is_empty());
}

/// Our own error texts for the malformed cases (progs' are in `*.stderr`).
#[test]
fn malformed_error_messages() {
    let dir = common::send_streams_dir();
    let expect = [
        (
            "bad_crc",
            "crc32 mismatch in command 0 (SUBVOL) at stream offset 17: stored 0xc7bb0a61, computed 0xc7bb0a60",
        ),
        (
            "bad_magic",
            "unexpected header at stream offset 0: magic is \"Xtrfs-stream\\0\", expected \"btrfs-stream\\0\"",
        ),
        (
            "bad_ver3",
            "stream version 3 not supported at stream offset 0: this reader accepts versions up to 2",
        ),
        (
            "trunc",
            "stream truncated in command 1 (CHOWN) at stream offset 72: needed 28 bytes of payload, 14 available",
        ),
        (
            "hdronly",
            "stream truncated before command 0 at stream offset 17: needed 10 bytes of command header, 0 available (a stream must end with END)",
        ),
        (
            "unknown_attr",
            "invalid attribute type 40 at stream offset 110 in command 1 (CHOWN) at stream offset 72",
        ),
        (
            "missing_attr",
            "attribute 7 (GID) requested but not present in command 1 (CHOWN) at stream offset 72",
        ),
        (
            "wrong_size",
            "invalid size for attribute 6 (UID) at stream offset 86 in command 1 (CHOWN) at stream offset 72: expected 8, got 4",
        ),
        (
            "noend",
            "stream truncated before command 15 at stream offset 622: needed 10 bytes of command header, 0 available (a stream must end with END)",
        ),
    ];
    for (name, want) in expect {
        let stream = fs::read(dir.join(format!("malformed/{name}.stream"))).unwrap();
        let err = dump(stream.as_slice(), std::io::sink(), &utc()).unwrap_err();
        assert_eq!(err.to_string(), want, "{name}");
    }
}
