use std::borrow::Cow;

use super::*;

const END: [u8; 10] = [0, 0, 0, 0, 0x15, 0, 0x50, 0x6c, 0xc9, 0x9d];

fn stream(version: u32, cmds: &[&[u8]]) -> Vec<u8> {
    let mut s = STREAM_MAGIC.to_vec();
    s.extend_from_slice(&version.to_le_bytes());
    for c in cmds {
        s.extend_from_slice(c);
    }
    s
}

fn cmd(num: u16, payload: &[u8]) -> Vec<u8> {
    let mut c = Vec::new();
    c.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_le_bytes());
    c.extend_from_slice(&num.to_le_bytes());
    c.extend_from_slice(&[0; 4]);
    c.extend_from_slice(payload);
    let mut crc = Crc::new();
    crc.update(&c);
    let v = crc.finish().to_le_bytes();
    c.get_mut(6..10).unwrap().copy_from_slice(&v);
    c
}

#[test]
#[allow(
    clippy::indexing_slicing,
    clippy::as_conversions,
    clippy::arithmetic_side_effects
)]
fn skimmed_commands_decode_apart_as_read_whole() {
    use crate::StreamWriter;
    let data: Vec<u8> = (0..20000u32).map(|i| (i % 251) as u8).collect();
    let w = Command::Write {
        path: Cow::Borrowed(b"d/f"),
        offset: 4096,
        data: Cow::Borrowed(&data),
    };
    let chmod = Command::Chmod {
        path: Cow::Borrowed(b"d/f"),
        mode: 0o644,
    };
    for version in [1, 2] {
        let mut sw = StreamWriter::new(Vec::new(), version).unwrap();
        for c in [&w, &chmod, &w] {
            sw.write(c).unwrap();
        }
        let bytes = sw.finish().unwrap();
        let mut r = StreamReader::new(std::io::Cursor::new(&bytes));
        let mut skimmed = Vec::new();
        let mut whole = Vec::new();
        let is_write = |i: &CommandInfo| i.cmd == CommandKind::Write.number();
        while let Some(n) = r.next_skimmed(|i| is_write(i).then_some(100)).unwrap() {
            match n {
                Next::Skimmed { info, crc, prefix } => {
                    assert_eq!(prefix.len(), 100);
                    let at = usize::try_from(info.offset).unwrap() + CMD_HEADER_SIZE;
                    // The prefix is the payload's start.
                    assert_eq!(prefix, &bytes[at..at + 100]);
                    skimmed.push((info, crc));
                }
                Next::Command(info, c) => whole.push((info.index, c.into_owned())),
            }
        }
        assert_eq!(r.position(), bytes.len() as u64);
        assert_eq!(skimmed.len(), 2, "v{version}");
        assert_eq!(whole.len(), 2, "v{version}: CHMOD and END");
        assert_eq!(whole[0], (1, chmod.clone()));
        for (info, crc) in skimmed {
            let at = usize::try_from(info.offset).unwrap() + CMD_HEADER_SIZE;
            let len = usize::try_from(info.len).unwrap();
            let mut payload = bytes[at..at + len].to_vec();
            let mut attrs = Vec::new();
            let c = decode_payload(&info, crc, &payload, &mut attrs).unwrap();
            assert_eq!(c, w);
            // Cut short, or changed: the reader's errors.
            let mut attrs = Vec::new();
            let e = decode_payload(&info, crc, &payload[..len - 1], &mut attrs).unwrap_err();
            assert!(matches!(e, DecodeError::TruncatedCommand { .. }), "{e}");
            payload[len - 1] ^= 1;
            let mut attrs = Vec::new();
            let e = decode_payload(&info, crc, &payload, &mut attrs).unwrap_err();
            assert!(
                matches!(e, DecodeError::CrcMismatch { cmd, .. } if cmd == info),
                "{e}"
            );
        }
    }
}

#[test]
fn end_only_stream() {
    let s = stream(1, &[&END]);
    let mut r = StreamReader::new(s.as_slice());
    let (info, c) = r.next_command().unwrap().unwrap();
    assert_eq!(c, Command::End);
    assert_eq!((info.offset, info.index, info.version), (17, 0, 1));
    assert!(r.next_command().unwrap().is_none());
    assert!(r.next_command().unwrap().is_none());
}

#[test]
fn v2_data_runs_to_the_end_and_v1_data_has_a_length() {
    let mut p = vec![15, 0, 1, 0, b'f', 18, 0, 8, 0];
    p.extend_from_slice(&5u64.to_le_bytes());
    let mut v2 = p.clone();
    v2.extend_from_slice(&[19, 0, b'x', b'y', b'z']);
    let s = stream(2, &[&cmd(15, &v2), &END]);
    let mut r = StreamReader::new(s.as_slice());
    let (_, c) = r.next_command().unwrap().unwrap();
    assert_eq!(
        c,
        Command::Write {
            path: Cow::Borrowed(b"f"),
            offset: 5,
            data: Cow::Borrowed(b"xyz")
        }
    );
    // The same bytes in a v1 stream: DATA's "length" is b"xy" = 0x7978, truncated.
    let s = stream(1, &[&cmd(15, &v2), &END]);
    let e = StreamReader::new(s.as_slice()).next_command().unwrap_err();
    assert!(
        matches!(
            e,
            DecodeError::TruncatedAttr {
                attr_offset: 44,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("offset 44"), "{e}");
}

#[test]
fn duplicate_attribute_last_wins_and_missing_is_reported() {
    let mut p = vec![15, 0, 0, 0];
    for uid in [5u64, 6] {
        p.extend_from_slice(&[6, 0, 8, 0]);
        p.extend_from_slice(&uid.to_le_bytes());
    }
    let s = stream(1, &[&cmd(19, &p), &END]);
    let mut r = StreamReader::new(s.as_slice());
    let e = r.next_command().unwrap_err();
    assert_eq!(
        e.to_string(),
        "attribute 7 (GID) requested but not present in command 0 (CHOWN) at stream offset 17"
    );
    assert!(e.is_recoverable());
    assert_eq!(r.next_command().unwrap().unwrap().1, Command::End);

    p.extend_from_slice(&[7, 0, 4, 0, 1, 0, 0, 0]);
    let s = stream(1, &[&cmd(19, &p), &END]);
    let e = StreamReader::new(s.as_slice()).next_command().unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid size for attribute 7 (GID) at stream offset 55 in command 0 (CHOWN) at stream offset 17: expected 8, got 4"
    );
    p.truncate(p.len() - 8);
    p.extend_from_slice(&[7, 0, 8, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
    let s = stream(1, &[&cmd(19, &p), &END]);
    let mut r = StreamReader::new(s.as_slice());
    let (_, c) = r.next_command().unwrap().unwrap();
    assert_eq!(
        c,
        Command::Chown {
            path: Cow::Borrowed(b""),
            uid: 6,
            gid: 1
        }
    );
}

#[test]
fn concatenated_streams_and_eof_rules() {
    let one = stream(1, &[&END]);
    let mut two = one.clone();
    two.extend_from_slice(&stream(2, &[&END]));
    let mut r = StreamReader::new(two.as_slice());
    assert_eq!(r.next_command().unwrap().unwrap().0.stream, 0);
    let (info, _) = r.next_command().unwrap().unwrap();
    assert_eq!(
        (info.stream, info.version, info.index, info.offset),
        (1, 2, 1, 44)
    );
    assert!(r.next_command().unwrap().is_none());

    // A partial header after END is an error.
    let mut bad = one.clone();
    bad.extend_from_slice(b"btrfs");
    let mut r = StreamReader::new(bad.as_slice());
    r.next_command().unwrap();
    let e = r.next_command().unwrap_err();
    assert!(matches!(
        e,
        DecodeError::TruncatedStreamHeader {
            offset: 27,
            available: 5
        }
    ));
    assert!(matches!(
        r.next_command().unwrap_err(),
        DecodeError::Stopped { offset: 32 }
    ));

    let e = StreamReader::new(&[][..]).next_command().unwrap_err();
    assert!(matches!(e, DecodeError::Empty));
    let e = StreamReader::new(&stream(1, &[])[..])
        .next_command()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "stream truncated before command 0 at stream offset 17: needed 10 bytes of command header, 0 available (a stream must end with END)"
    );
}

#[test]
fn header_checks() {
    let mut s = stream(3, &[&END]);
    let e = StreamReader::new(s.as_slice()).next_command().unwrap_err();
    assert!(matches!(
        e,
        DecodeError::UnsupportedVersion {
            version: 3,
            max: 2,
            ..
        }
    ));
    let opts = ReaderOptions::new().with_max_version(3);
    assert!(
        StreamReader::with_options(s.as_slice(), opts)
            .next_command()
            .is_ok()
    );
    *s.get_mut(12).unwrap() = b'!';
    let e = StreamReader::new(s.as_slice()).next_command().unwrap_err();
    assert!(matches!(e, DecodeError::BadMagic { offset: 0, .. }), "{e}");
}

#[test]
fn command_length_limit() {
    let mut c = cmd(99, &[0; 64]);
    let s = stream(1, &[&c, &END]);
    let opts = ReaderOptions::new().with_max_command_len(63);
    let e = StreamReader::with_options(s.as_slice(), opts)
        .next_raw()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "command 0 (cmd 99) at stream offset 17 has a payload of 64 bytes, more than the 63 bytes this reader accepts"
    );
    c.get_mut(0..4)
        .unwrap()
        .copy_from_slice(&u32::MAX.to_le_bytes());
    let s = stream(1, &[&c]);
    let e = StreamReader::new(s.as_slice()).next_raw().unwrap_err();
    assert!(matches!(
        e,
        DecodeError::CommandTooLong { max: 16777216, .. }
    ));
}

#[test]
fn unknown_commands_are_kept() {
    let s = stream(1, &[&cmd(99, &[1, 0, 0, 0]), &END]);
    let mut r = StreamReader::new(s.as_slice());
    let (info, c) = r.next_command().unwrap().unwrap();
    assert_eq!(info.cmd, 99);
    assert_eq!(
        c,
        Command::Unknown {
            cmd: 99,
            payload: Cow::Borrowed(&[1, 0, 0, 0])
        }
    );
}
