//! Mutated kernel streams: the reader and the dumper never panic, and every
//! failure is an error that names a stream offset. Deterministic (seeded PRNG).

use std::io;

use jiff::tz::TimeZone;
use stream_format::dump::{DumpOptions, dump};
use stream_format::{
    BufStreamReader, Command, ReaderOptions, StreamReader, StreamWriter, WriterOptions,
    btrfs_crc32c,
};

use crate::common;

/// splitmix64: small, deterministic, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Command boundaries of a well-formed stream: (offset, header+payload length).
fn commands(stream: &[u8]) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    let mut pos = 17;
    while pos + 10 <= stream.len() {
        let len = u32::from_le_bytes(stream[pos..pos + 4].try_into().unwrap()) as usize;
        let end = pos + 10 + len;
        if end > stream.len() {
            break;
        }
        v.push((pos, 10 + len));
        let cmd = u16::from_le_bytes([stream[pos + 4], stream[pos + 5]]);
        pos = end;
        if cmd == 21 {
            pos += 17;
        }
    }
    v
}

/// Recompute every CRC whose command framing still fits, so mutations reach the
/// attribute parser and the typed decoder.
fn fix_crcs(s: &mut [u8]) {
    let mut pos = 17;
    while pos + 10 <= s.len() {
        let len = u32::from_le_bytes(s[pos..pos + 4].try_into().unwrap()) as usize;
        let Some(end) = (pos + 10).checked_add(len).filter(|&e| e <= s.len()) else {
            break;
        };
        s[pos + 6..pos + 10].fill(0);
        let crc = btrfs_crc32c(&s[pos..end]);
        s[pos + 6..pos + 10].copy_from_slice(&crc.to_le_bytes());
        let cmd = u16::from_le_bytes([s[pos + 4], s[pos + 5]]);
        pos = end;
        if cmd == 21 {
            pos += 17;
        }
    }
}

/// What a reader makes of a stream, step by step: each command (header,
/// attributes, typed form) or error (with whether it is recoverable), going
/// on after recoverable errors, and the position after each step.
fn outcomes<E: std::fmt::Display>(
    mut next: impl FnMut() -> Result<Option<String>, (E, bool)>,
) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..10_000 {
        match next() {
            Ok(None) => break,
            Ok(Some(step)) => out.push(step),
            Err((e, recoverable)) => {
                out.push(format!("error {e} recoverable {recoverable}"));
                if !recoverable {
                    break;
                }
            }
        }
    }
    out
}

/// One command as [`outcomes`] records it.
fn step(
    r: Result<
        Option<(stream_format::CommandInfo, stream_format::RawCommand<'_>)>,
        stream_format::DecodeError,
    >,
) -> Result<Option<String>, (stream_format::DecodeError, bool)> {
    match r {
        Ok(None) => Ok(None),
        Ok(Some((info, raw))) => {
            let attrs: Vec<(u16, &[u8])> = raw.attrs().collect();
            let typed = Command::from_raw(&raw, &info).map(|c| format!("{c:?}"));
            Ok(Some(format!("{info:?} {attrs:?} {typed:?}")))
        }
        Err(e) => {
            let recoverable = e.is_recoverable();
            Err((e, recoverable))
        }
    }
}

/// [`BufStreamReader`] over buffers of several sizes (commands split in
/// place, across the buffer's end, or not at all) gives what
/// [`StreamReader`] gives.
fn buffered_reads_the_same(input: &[u8], opts: ReaderOptions) {
    let mut plain = StreamReader::with_options(input, opts);
    let want = outcomes(|| {
        let s = step(plain.next_raw());
        s.map(|o| o.map(|x| format!("{x} at {}", plain.position())))
    });
    for cap in [16, 100, 4096, 1 << 20] {
        let mut r = BufStreamReader::with_options(io::BufReader::with_capacity(cap, input), opts);
        let got = outcomes(|| {
            let s = step(r.next_raw());
            s.map(|o| o.map(|x| format!("{x} at {}", r.position())))
        });
        assert_eq!(got, want, "buffer of {cap} bytes");
    }
}

/// Run every consumer over `input`; panics (the test failing) are what we look for.
fn exercise(input: &[u8]) -> usize {
    let mut failures = 0;
    for max_version in [2, 3] {
        let opts = ReaderOptions::new()
            .with_max_version(max_version)
            .with_max_command_len(1 << 20);
        // Typed, going on after recoverable errors like `btrfs receive -E 0`.
        let mut r = StreamReader::with_options(input, opts);
        for _ in 0..10_000 {
            match r.next_command() {
                Ok(None) => break,
                Ok(Some((info, cmd))) => reencode_check(&info, &cmd, opts),
                Err(e) => {
                    failures += 1;
                    let msg = e.to_string();
                    assert!(msg.contains("offset"), "no offset in: {msg}");
                    assert!(e.offset() <= input.len() as u64, "{msg}");
                    if !e.is_recoverable() {
                        break;
                    }
                }
            }
        }
        buffered_reads_the_same(input, opts);
        // Raw view.
        let mut r = StreamReader::with_options(input, opts);
        loop {
            match r.next_raw() {
                Ok(None) => break,
                Ok(Some((_, raw))) => {
                    for (_, v) in raw.attrs() {
                        assert!(v.len() <= raw.payload().len());
                    }
                }
                Err(e) => {
                    assert!(e.to_string().contains("offset"), "{e}");
                    break;
                }
            }
        }
    }
    let opts = DumpOptions::with_time_zone(TimeZone::UTC);
    if let Err(e) = dump(input, io::sink(), &opts) {
        assert!(
            e.to_string().contains("offset"),
            "dump error without offset: {e}"
        );
    }
    failures
}

/// A command that decoded must encode (when its version allows it) to bytes that
/// decode to the same command.
fn reencode_check(info: &stream_format::CommandInfo, cmd: &Command<'_>, opts: ReaderOptions) {
    let version = info.version.clamp(1, 3);
    let wopts = WriterOptions::new(version).with_max_command_size(2 << 20);
    let mut w = StreamWriter::with_options(Vec::new(), wopts).unwrap();
    if w.write(cmd).is_err() {
        return;
    }
    let bytes = w.into_inner();
    let mut r = StreamReader::with_options(bytes.as_slice(), opts.with_max_version(3));
    let (_, again) = r.next_command().unwrap().unwrap();
    assert_eq!(&again, cmd);
}

fn mutate(rng: &mut Rng, base: &[u8], cmds: &[(usize, usize)]) -> Vec<u8> {
    let mut s = base.to_vec();
    let rounds = 1 + rng.below(3);
    let mut fix = rng.below(4) != 0;
    for _ in 0..rounds {
        let at = rng.below(s.len());
        match rng.below(9) {
            0 => s[at] ^= 1 << rng.below(8),
            1 => s[at] = [0, 1, 0x7f, 0x80, 0xff, rng.next() as u8][rng.below(6)],
            2 => s.truncate(at),
            3 | 4 => {
                // A command length field.
                let (pos, _) = cmds[rng.below(cmds.len())];
                let v: u32 = [
                    0,
                    1,
                    2,
                    9,
                    10,
                    0xffff,
                    0x1_0000,
                    0x7fff_ffff,
                    0x8000_0000,
                    u32::MAX,
                    rng.next() as u32,
                ][rng.below(11)];
                if pos + 4 <= s.len() {
                    s[pos..pos + 4].copy_from_slice(&v.to_le_bytes());
                }
                fix = rng.below(2) == 0;
            }
            5 | 6 => {
                // A TLV type or length inside a command.
                let (pos, len) = cmds[rng.below(cmds.len())];
                if len > 12 {
                    let off = pos + 10 + rng.below(len - 11);
                    let v: u16 =
                        [0, 1, 2, 8, 12, 16, 19, 35, 36, 0xffff, rng.next() as u16][rng.below(11)];
                    if off + 2 <= s.len() {
                        s[off..off + 2].copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
            7 => {
                let n = 1 + rng.below(16);
                let end = (at + n).min(s.len());
                s.drain(at..end);
            }
            _ => {
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                s.splice(at..at, bytes);
            }
        }
        if s.is_empty() {
            break;
        }
    }
    if fix {
        fix_crcs(&mut s);
    }
    s
}

#[test]
fn mutated_kernel_streams_never_panic() {
    let dir = common::send_streams_dir();
    let names = [
        "tiny.v1",
        "tiny.v2",
        "g.v1",
        "cyc.v1",
        "multi.v1",
        "multi_noe.v1",
        "nodata.v2",
        "comp.v2c",
        "inc23.v2",
    ];
    let mut rng = Rng(0x5eed_b7f5);
    let (mut inputs, mut failures) = (0usize, 0usize);
    for name in names {
        let base = std::fs::read(dir.join(format!("{name}.stream"))).unwrap();
        let cmds = commands(&base);
        assert!(!cmds.is_empty(), "{name}");
        assert_eq!(exercise(&base), 0, "{name} itself must decode");
        let n = if base.len() > 10_000 { 300 } else { 2000 };
        for _ in 0..n {
            let m = mutate(&mut rng, &base, &cmds);
            failures += exercise(&m);
            inputs += 1;
        }
    }
    eprintln!("{inputs} mutated streams, {failures} decode errors, no panic");
    assert!(inputs > 10_000);
}

#[test]
fn every_truncation_of_small_streams() {
    let dir = common::send_streams_dir();
    for name in ["tiny.v1", "tiny.v2", "multi_noe.v1"] {
        let base = std::fs::read(dir.join(format!("{name}.stream"))).unwrap();
        let ends: Vec<usize> = {
            // Lengths that are clean ends: after each END at a stream boundary.
            let mut v = Vec::new();
            for (pos, len) in commands(&base) {
                if base[pos + 4] == 21 {
                    v.push(pos + len);
                }
            }
            v
        };
        for cut in 0..base.len() {
            let input = &base[..cut];
            let res = StreamReader::new(input).next_command_count();
            if ends.contains(&cut) {
                assert!(res.is_ok(), "{name} cut at {cut}: {:?}", res.err());
            } else {
                let e = res.unwrap_err();
                assert!(e.contains("offset"), "{name} cut at {cut}: {e}");
            }
            exercise(input);
        }
    }
}

/// Count commands to the end, or the first error's text.
trait CountExt {
    fn next_command_count(self) -> Result<usize, String>;
}

impl<R: io::Read> CountExt for StreamReader<R> {
    fn next_command_count(mut self) -> Result<usize, String> {
        let mut n = 0;
        while self.next_command().map_err(|e| e.to_string())?.is_some() {
            n += 1;
        }
        Ok(n)
    }
}

#[test]
fn huge_lengths_do_not_allocate() {
    // A command claiming u32::MAX bytes is refused before any allocation, and a
    // plausible length over a short input reports what is missing.
    let mut s = b"btrfs-stream\0\x01\0\0\0".to_vec();
    s.extend_from_slice(&u32::MAX.to_le_bytes());
    s.extend_from_slice(&[15, 0, 0, 0, 0, 0]);
    let e = StreamReader::new(s.as_slice()).next_raw().unwrap_err();
    assert_eq!(
        e.to_string(),
        "command 0 (WRITE) at stream offset 17 has a payload of 4294967295 bytes, more than the 16777216 bytes this reader accepts"
    );
    s[17..21].copy_from_slice(&(1u32 << 24).to_le_bytes());
    let e = StreamReader::new(s.as_slice()).next_raw().unwrap_err();
    assert_eq!(
        e.to_string(),
        "stream truncated in command 0 (WRITE) at stream offset 17: needed 16777216 bytes of payload, 0 available"
    );
}
