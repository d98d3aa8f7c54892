//! Encode → decode round trip of every command in every protocol version, and
//! the writer's version and size rules.

use std::borrow::Cow;

use stream_format::{
    Attr, Command, CommandKind, EncodeError, ReaderOptions, StreamReader, StreamWriter, Timespec,
    WriterOptions,
};

fn b(s: &[u8]) -> Cow<'_, [u8]> {
    Cow::Borrowed(s)
}

const UUID: [u8; 16] = *b"0123456789abcdef";
const UUID2: [u8; 16] = [0xff; 16];

/// Sample commands of `kind`, covering optional attributes present and absent,
/// empty and non-UTF-8 byte strings, and extreme integers.
fn samples(kind: CommandKind, data: &[u8]) -> Vec<Command<'_>> {
    let t = |sec, nsec| Timespec { sec, nsec };
    let path = b(b"dir/na\xffme with space");
    match kind {
        CommandKind::Subvol => vec![Command::Subvol {
            path: b(b"snap"),
            uuid: UUID,
            ctransid: u64::MAX,
        }],
        CommandKind::Snapshot => vec![Command::Snapshot {
            path: b(b"snap"),
            uuid: UUID,
            ctransid: 7,
            clone_uuid: UUID2,
            clone_ctransid: 0,
        }],
        CommandKind::Mkfile => vec![Command::Mkfile {
            path: b(b"o257-7-0"),
            ino: 257,
        }],
        CommandKind::Mkdir => vec![Command::Mkdir {
            path: b(b"o258-7-0"),
            ino: 258,
        }],
        CommandKind::Mknod => vec![Command::Mknod {
            path,
            ino: 259,
            rdev: 0x107,
            mode: 0o20644,
        }],
        CommandKind::Mkfifo => vec![
            Command::Mkfifo {
                path: path.clone(),
                ino: 1,
                rdev: Some(0),
                mode: Some(0o10644),
            },
            Command::Mkfifo {
                path,
                ino: 1,
                rdev: None,
                mode: None,
            },
        ],
        CommandKind::Mksock => vec![
            Command::Mksock {
                path: path.clone(),
                ino: 1,
                rdev: Some(0),
                mode: Some(0o140755),
            },
            Command::Mksock {
                path,
                ino: 1,
                rdev: None,
                mode: Some(1),
            },
        ],
        CommandKind::Symlink => vec![Command::Symlink {
            path,
            ino: 2,
            path_link: b(b"/abs/target with space"),
        }],
        CommandKind::Rename => vec![Command::Rename {
            path,
            path_to: b(b""),
        }],
        CommandKind::Link => vec![Command::Link {
            path,
            path_link: b(b"small"),
        }],
        CommandKind::Unlink => vec![Command::Unlink { path }],
        CommandKind::Rmdir => vec![Command::Rmdir { path: b(b"") }],
        CommandKind::SetXattr => vec![
            Command::SetXattr {
                path: path.clone(),
                name: b(b"user.bin"),
                data: b(b"\0\x01\x02"),
            },
            Command::SetXattr {
                path,
                name: b(b"user.empty"),
                data: b(b""),
            },
        ],
        CommandKind::RemoveXattr => vec![Command::RemoveXattr {
            path,
            name: b(b"user.foo"),
        }],
        CommandKind::Write => vec![
            Command::Write {
                path: path.clone(),
                offset: 0,
                data: b(data),
            },
            Command::Write {
                path: path.clone(),
                offset: u64::MAX,
                data: b(b""),
            },
            Command::Write {
                path,
                offset: 1,
                data: b(b"x"),
            },
        ],
        CommandKind::Clone => vec![Command::Clone {
            offset: 4096,
            len: 1 << 40,
            path,
            clone_uuid: UUID2,
            clone_ctransid: 9,
            clone_path: b(b"src/file"),
            clone_offset: 8192,
        }],
        CommandKind::Truncate => vec![Command::Truncate { path, size: 300000 }],
        CommandKind::Chmod => vec![Command::Chmod { path, mode: 0o7777 }],
        CommandKind::Chown => vec![Command::Chown {
            path,
            uid: 1000,
            gid: u64::MAX,
        }],
        CommandKind::Utimes => vec![
            Command::Utimes {
                path: path.clone(),
                atime: t(1_704_164_645, 123_456_789),
                mtime: t(u64::MAX, u32::MAX),
                ctime: t(0, 0),
                otime: None,
            },
            Command::Utimes {
                path,
                atime: t(1, 2),
                mtime: t(3, 4),
                ctime: t(5, 6),
                otime: Some(t(7, 8)),
            },
        ],
        CommandKind::End => vec![Command::End],
        CommandKind::UpdateExtent => vec![Command::UpdateExtent {
            path,
            offset: 0,
            size: 131072,
        }],
        CommandKind::Fallocate => vec![Command::Fallocate {
            path,
            mode: 3,
            offset: 0,
            size: 65536,
        }],
        CommandKind::Fileattr => vec![Command::Fileattr {
            path,
            attr: 1 << 32 | 16,
        }],
        CommandKind::EncodedWrite => vec![
            Command::EncodedWrite {
                path: path.clone(),
                offset: 0,
                unencoded_file_len: 2000,
                unencoded_len: 2000,
                unencoded_offset: 0,
                compression: Some(2),
                encryption: None,
                data: b(data),
            },
            Command::EncodedWrite {
                path: path.clone(),
                offset: 131072,
                unencoded_file_len: 4096,
                unencoded_len: 131072,
                unencoded_offset: 4096,
                compression: Some(3),
                encryption: Some(0),
                data: b(b"compressed"),
            },
            Command::EncodedWrite {
                path,
                offset: 1,
                unencoded_file_len: 1,
                unencoded_len: 1,
                unencoded_offset: 0,
                compression: None,
                encryption: None,
                data: b(b""),
            },
        ],
        CommandKind::EnableVerity => vec![Command::EnableVerity {
            path,
            algorithm: 1,
            block_size: 4096,
            salt: b(b"salt\0"),
            sig: b(b""),
        }],
    }
}

/// Whether the writer must refuse `cmd` in `version`.
fn not_in_version(cmd: &Command<'_>, version: u32) -> bool {
    let kind = cmd.kind().unwrap();
    kind.since_version() > version
        || matches!(cmd, Command::Utimes { otime: Some(_), .. } if version < 2)
}

#[test]
fn every_command_in_every_version() {
    // The largest DATA the v1 limit allows for a WRITE of the sample path.
    let data: Vec<u8> = (0..65536 - 10 - 24 - 12 - 4)
        .map(|i: u32| i.to_le_bytes()[0])
        .collect();
    let mut checked = 0;
    for version in 1..=3u32 {
        for &kind in CommandKind::ALL {
            for cmd in samples(kind, &data) {
                let mut w = StreamWriter::new(Vec::new(), version).unwrap();
                let res = w.write(&cmd);
                if not_in_version(&cmd, version) {
                    let e = res.unwrap_err();
                    assert!(
                        matches!(
                            e,
                            EncodeError::CommandNotInVersion { .. }
                                | EncodeError::AttrNotInVersion { .. }
                        ),
                        "{kind} v{version}: {e}"
                    );
                    assert_eq!(w.bytes_written(), 17);
                    continue;
                }
                res.unwrap_or_else(|e| panic!("{kind} v{version}: {e}"));
                // What an exact estimate counts: the bytes the writer wrote.
                assert_eq!(
                    cmd.stream_len(version),
                    w.bytes_written() - 17,
                    "stream_len of {kind} v{version}"
                );
                if cmd != Command::End {
                    w.write(&Command::End).unwrap();
                }
                let bytes = w.into_inner();

                let mut r = StreamReader::with_options(
                    bytes.as_slice(),
                    ReaderOptions::new().with_max_version(3),
                );
                let (info, raw) = r.next_raw().unwrap().unwrap();
                assert_eq!((info.offset, info.index, info.version), (17, 0, version));
                assert_eq!(info.cmd, kind.number());
                // Attribute order is the kernel's, and every required one is there.
                let types: Vec<Attr> = raw.raw_attrs().iter().map(|a| a.attr().unwrap()).collect();
                let mut order = kind.kernel_attrs().iter();
                for a in &types {
                    assert!(
                        order.any(|k| k == a),
                        "{kind}: {types:?} not in kernel order"
                    );
                }
                for a in kind.required_attrs() {
                    assert!(types.contains(a), "{kind}: {a} missing");
                }
                let decoded = Command::from_raw(&raw, &info).unwrap();
                assert_eq!(decoded, cmd, "{kind} v{version}");
                let next = r.next_command().unwrap();
                if cmd == Command::End {
                    assert!(next.is_none());
                } else {
                    assert_eq!(next.unwrap().1, Command::End);
                    assert!(r.next_command().unwrap().is_none());
                }
                checked += 1;
            }
        }
    }
    eprintln!("{checked} command/version round trips");
    assert!(checked > 80, "{checked}");
}

#[test]
fn v1_data_over_the_limit_is_refused_not_split() {
    let data = vec![0u8; 65536 - 10 - 24 - 12 - 4 + 1];
    let path = b"dir/na\xffme with space";
    let mut w = StreamWriter::new(Vec::new(), 1).unwrap();
    let e = w
        .write(&Command::Write {
            path: b(path),
            offset: 0,
            data: b(&data),
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            EncodeError::CommandTooLarge {
                size: 65537,
                max: 65536,
                ..
            }
        ),
        "{e}"
    );
    // More than a TLV can hold, even with a larger buffer.
    let data = vec![0u8; 65536];
    let mut w = StreamWriter::with_options(
        Vec::new(),
        WriterOptions::new(1).with_max_command_size(1 << 20),
    )
    .unwrap();
    let e = w
        .write(&Command::Write {
            path: b(path),
            offset: 0,
            data: b(&data),
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            EncodeError::AttrTooLong {
                attr: Attr::Data,
                len: 65536,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(w.bytes_written(), 17);
}

#[test]
fn v2_limit_fits_kernel_sized_writes_and_encoded_writes() {
    let data = vec![0xa5u8; 131072];
    let mut w = StreamWriter::new(Vec::new(), 2).unwrap();
    w.write(&Command::Write {
        path: b(b"big"),
        offset: 0,
        data: b(&data),
    })
    .unwrap();
    let ew = Command::EncodedWrite {
        path: b(b"big"),
        offset: 0,
        unencoded_file_len: 131072,
        unencoded_len: 131072,
        unencoded_offset: 0,
        compression: Some(1),
        encryption: Some(0),
        data: b(&data),
    };
    w.write(&ew).unwrap();
    let too_big = vec![0u8; 147456];
    let e = w
        .write(&Command::Write {
            path: b(b"big"),
            offset: 0,
            data: b(&too_big),
        })
        .unwrap_err();
    assert!(
        matches!(e, EncodeError::CommandTooLarge { max: 147456, .. }),
        "{e}"
    );
    let bytes = w.finish().unwrap();
    let mut r = StreamReader::new(bytes.as_slice());
    let (info, c) = r.next_command().unwrap().unwrap();
    assert_eq!(info.len, 131093);
    assert!(matches!(c, Command::Write { data, .. } if data.len() == 131072));
    assert_eq!(r.next_command().unwrap().unwrap().1, ew);
}

#[test]
fn multi_subvolume_stream_like_send_e() {
    // One header, two SUBVOLs, one END, as `btrfs send -e a b` writes.
    let mut w = StreamWriter::new(Vec::new(), 1).unwrap();
    w.write(&Command::Subvol {
        path: b(b"a"),
        uuid: UUID,
        ctransid: 1,
    })
    .unwrap();
    w.write(&Command::Subvol {
        path: b(b"b"),
        uuid: UUID2,
        ctransid: 2,
    })
    .unwrap();
    let one = w.finish().unwrap();
    // The same from separate writers: header omitted, END omitted.
    let w = StreamWriter::new(Vec::new(), 1).unwrap();
    let mut first = {
        let mut w = w;
        w.write(&Command::Subvol {
            path: b(b"a"),
            uuid: UUID,
            ctransid: 1,
        })
        .unwrap();
        w.into_inner()
    };
    let mut w =
        StreamWriter::with_options(Vec::new(), WriterOptions::new(1).without_header()).unwrap();
    w.write(&Command::Subvol {
        path: b(b"b"),
        uuid: UUID2,
        ctransid: 2,
    })
    .unwrap();
    first.extend(w.finish().unwrap());
    assert_eq!(first, one);
    let mut r = StreamReader::new(one.as_slice());
    let mut n = 0;
    while let Some((info, _)) = r.next_command().unwrap() {
        assert_eq!(info.stream, 0);
        n += 1;
    }
    assert_eq!(n, 3);
}
