//! One test per command, each on a scratch directory: the command's
//! effect as `cmds/receive.c` defines it (creations at mode 0600/0700
//! until CHMOD, rename(2), link(2) with PATH as the new name, …), and
//! the errors it must give.

use super::*;
use crate::receive::NoProgress;
use crate::receive::meta::State;
use crate::receive::target::TargetError;
use rustix::fs::IFlags;
use std::borrow::Cow;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use stream_format::Timespec as StreamTime;

const UUID: [u8; 16] = [7; 16];

fn b(s: &str) -> Cow<'static, [u8]> {
    Cow::Owned(s.as_bytes().to_vec())
}

fn info(cmd: &Command<'_>) -> CommandInfo {
    CommandInfo {
        offset: 17,
        index: 1,
        cmd: cmd.kind().map_or(99, CommandKind::number),
        len: 0,
        stream: 0,
        version: 2,
    }
}

/// Receive SUBVOL "s" into `dir`, then `cmds`; the result of the last.
fn run_in(dir: &Path, cmds: &[Command<'_>]) -> Result<(), Box<ApplyError>> {
    let mut p = NoProgress;
    let mut rx = Receiver::new(dir, &mut p).unwrap();
    let subvol = Command::Subvol {
        path: b("s"),
        uuid: UUID,
        ctransid: 5,
    };
    rx.apply(&info(&subvol), &subvol).unwrap();
    let mut last = Ok(());
    for c in cmds {
        last = rx.apply(&info(c), c);
    }
    rx.finish_subvol().unwrap();
    last
}

/// [`run_in`] a new scratch directory; the directory and the result.
fn run(cmds: &[Command<'_>]) -> (tempfile::TempDir, Result<(), Box<ApplyError>>) {
    let d = tempfile::tempdir().unwrap();
    let r = run_in(d.path(), cmds);
    (d, r)
}

fn mkfile(p: &str) -> Command<'static> {
    Command::Mkfile {
        path: b(p),
        ino: 257,
    }
}

fn write(p: &str, offset: u64, data: &[u8]) -> Command<'static> {
    Command::Write {
        path: b(p),
        offset,
        data: Cow::Owned(data.to_vec()),
    }
}

fn kind_of(r: Result<(), Box<ApplyError>>) -> ApplyErrorKind {
    r.unwrap_err().kind
}

fn errno_of(r: Result<(), Box<ApplyError>>) -> Option<i32> {
    match kind_of(r) {
        ApplyErrorKind::Io(e) => e.raw_os_error(),
        ApplyErrorKind::Target(TargetError::Io(e)) => e.raw_os_error(),
        k => panic!("not an OS error: {k}"),
    }
}

#[test]
fn subvol_makes_the_directory_and_end_marks_it_complete() {
    let (d, r) = run(&[Command::End]);
    r.unwrap();
    let m = std::fs::metadata(d.path().join("s")).unwrap();
    assert!(m.is_dir());
    let dir = ReceiveDir::open(d.path()).unwrap();
    let recs = Records::open(&dir).unwrap().list().unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].uuid, Uuid(UUID));
    assert_eq!(recs[0].ctransid, 5);
    assert_eq!(recs[0].state, State::Complete);
    // Again into the same DIR: the name is taken.
    let mut p = NoProgress;
    let mut rx = Receiver::new(d.path(), &mut p).unwrap();
    let again = Command::Subvol {
        path: b("s"),
        uuid: UUID,
        ctransid: 5,
    };
    let e = rx.apply(&info(&again), &again).unwrap_err();
    assert!(matches!(e.kind, ApplyErrorKind::Exists), "{e}");
}

#[test]
fn a_failed_command_leaves_the_subvolume_incomplete() {
    let d = tempfile::tempdir().unwrap();
    let mut p = NoProgress;
    let mut rx = Receiver::new(d.path(), &mut p).unwrap();
    let s = Command::Subvol {
        path: b("s"),
        uuid: UUID,
        ctransid: 5,
    };
    rx.apply(&info(&s), &s).unwrap();
    rx.count_error();
    rx.finish_subvol().unwrap();
    let dir = ReceiveDir::open(d.path()).unwrap();
    let recs = Records::open(&dir).unwrap().list().unwrap();
    assert_eq!(recs[0].state, State::Incomplete);
}

#[test]
fn snapshot_copies_its_parent_preferably_with_the_streams_transid_and_needs_it() {
    let (d, r) = run(&[mkfile("f"), write("f", 0, b"parent")]);
    r.unwrap();
    let mut p = NoProgress;
    let mut rx = Receiver::new(d.path(), &mut p).unwrap();
    let snap = |name: &str, clone_ctransid| Command::Snapshot {
        path: b(name),
        uuid: [8; 16],
        ctransid: 6,
        clone_uuid: UUID,
        clone_ctransid,
    };
    rx.apply(&info(&snap("t", 5)), &snap("t", 5)).unwrap();
    rx.finish_subvol().unwrap();
    assert_eq!(std::fs::read(d.path().join("t/f")).unwrap(), b"parent");
    // The parent has ctransid 5, not 4: used all the same, as
    // btrfs-progs uses a parent found by UUID.
    rx.apply(&info(&snap("t4", 4)), &snap("t4", 4)).unwrap();
    rx.finish_subvol().unwrap();
    assert_eq!(std::fs::read(d.path().join("t4/f")).unwrap(), b"parent");
    // A second one with the UUID, ctransid 7: the one with the
    // stream's transid is taken.
    let s2 = Command::Subvol {
        path: b("s2"),
        uuid: UUID,
        ctransid: 7,
    };
    for c in [s2, mkfile("f"), write("f", 0, b"second")] {
        rx.apply(&info(&c), &c).unwrap();
    }
    rx.finish_subvol().unwrap();
    for (name, transid, want) in [("v7", 7, &b"second"[..]), ("v5", 5, b"parent")] {
        rx.apply(&info(&snap(name, transid)), &snap(name, transid))
            .unwrap();
        rx.finish_subvol().unwrap();
        let got = std::fs::read(d.path().join(name).join("f")).unwrap();
        assert_eq!(got, want, "{name}");
    }
    let other = Command::Snapshot {
        path: b("u"),
        uuid: [9; 16],
        ctransid: 6,
        clone_uuid: [1; 16],
        clone_ctransid: 5,
    };
    let e = rx.apply(&info(&other), &other).unwrap_err();
    assert!(
        matches!(e.kind, ApplyErrorKind::ParentMissing { .. }),
        "{e}"
    );
}

#[test]
fn a_command_before_subvol_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let mut p = NoProgress;
    let mut rx = Receiver::new(d.path(), &mut p).unwrap();
    let c = mkfile("f");
    let e = rx.apply(&info(&c), &c).unwrap_err();
    assert!(matches!(e.kind, ApplyErrorKind::NoSubvol), "{e}");
}

#[test]
fn mkfile_creates_an_empty_file_0600_and_refuses_an_existing_name() {
    let (d, r) = run(&[mkfile("f")]);
    r.unwrap();
    let m = std::fs::symlink_metadata(d.path().join("s/f")).unwrap();
    assert!(m.is_file());
    assert_eq!(m.len(), 0);
    assert_eq!(m.permissions().mode() & 0o7777, 0o600);
    let (_d, r) = run(&[mkfile("f"), mkfile("f")]);
    assert_eq!(errno_of(r), Some(libc_eexist()));
}

fn libc_eexist() -> i32 {
    rustix::io::Errno::EXIST.raw_os_error()
}

#[test]
fn mkdir_creates_a_directory_0700() {
    let (d, r) = run(&[Command::Mkdir {
        path: b("d"),
        ino: 257,
    }]);
    r.unwrap();
    let m = std::fs::symlink_metadata(d.path().join("s/d")).unwrap();
    assert!(m.is_dir());
    assert_eq!(m.permissions().mode() & 0o7777, 0o700);
}

#[test]
fn mknod_makes_the_type_of_its_mode_and_refuses_others() {
    let mk = |mode| Command::Mknod {
        path: b("n"),
        ino: 257,
        rdev: 0,
        mode,
    };
    let (d, r) = run(&[mk(0o10644)]);
    r.unwrap();
    let m = std::fs::symlink_metadata(d.path().join("s/n")).unwrap();
    assert!(m.file_type().is_fifo());
    // A regular file or a directory is not MKNOD's to make.
    let (_d, r) = run(&[mk(0o100644)]);
    assert!(matches!(kind_of(r), ApplyErrorKind::BadMode(0o100644)));
    let (_d, r) = run(&[mk(1 << 40)]);
    assert!(matches!(kind_of(r), ApplyErrorKind::BadMode(_)));
}

#[test]
fn mkfifo_and_mksock_make_their_types() {
    let (d, r) = run(&[
        Command::Mkfifo {
            path: b("p"),
            ino: 257,
            rdev: Some(0),
            mode: Some(0o10644),
        },
        Command::Mksock {
            path: b("k"),
            ino: 258,
            rdev: None,
            mode: None,
        },
    ]);
    r.unwrap();
    let p = std::fs::symlink_metadata(d.path().join("s/p")).unwrap();
    assert!(p.file_type().is_fifo());
    assert_eq!(p.permissions().mode() & 0o7777, 0o600);
    let k = std::fs::symlink_metadata(d.path().join("s/k")).unwrap();
    assert!(k.file_type().is_socket());
}

#[test]
fn symlink_stores_its_target_verbatim() {
    let (d, r) = run(&[Command::Symlink {
        path: b("l"),
        ino: 257,
        path_link: b("/etc/../x y"),
    }]);
    r.unwrap();
    let t = std::fs::read_link(d.path().join("s/l")).unwrap();
    assert_eq!(t, Path::new("/etc/../x y"));
    let (_d, r) = run(&[Command::Symlink {
        path: b("l"),
        ino: 257,
        path_link: Cow::Owned(b"a\0b".to_vec()),
    }]);
    assert!(matches!(kind_of(r), ApplyErrorKind::Invalid(_)));
}

#[test]
fn rename_moves_and_replaces_and_stays_inside() {
    let (d, r) = run(&[
        mkfile("a"),
        write("a", 0, b"A"),
        mkfile("b"),
        Command::Rename {
            path: b("a"),
            path_to: b("b"),
        },
    ]);
    r.unwrap();
    assert!(!d.path().join("s/a").exists());
    assert_eq!(std::fs::read(d.path().join("s/b")).unwrap(), b"A");
    let (d, r) = run(&[
        mkfile("a"),
        Command::Rename {
            path: b("a"),
            path_to: b("../escaped"),
        },
    ]);
    let e = r.unwrap_err();
    assert!(
        matches!(e.kind, ApplyErrorKind::Target(TargetError::Path(_))),
        "{e}"
    );
    assert_eq!(
        e.path2.as_ref().map(|p| p.0.as_slice()),
        Some(&b"../escaped"[..])
    );
    assert!(!d.path().join("escaped").exists());
}

#[test]
fn link_gives_the_file_a_second_name() {
    let (d, r) = run(&[
        mkfile("a"),
        write("a", 0, b"A"),
        Command::Link {
            path: b("b"),
            path_link: b("a"),
        },
    ]);
    r.unwrap();
    let m = std::fs::metadata(d.path().join("s/b")).unwrap();
    assert_eq!(m.nlink(), 2);
    assert_eq!(std::fs::read(d.path().join("s/b")).unwrap(), b"A");
}

#[test]
fn unlink_and_rmdir_remove_their_kind_only() {
    let (d, r) = run(&[
        mkfile("f"),
        Command::Mkdir {
            path: b("d"),
            ino: 258,
        },
        Command::Unlink { path: b("f") },
        Command::Rmdir { path: b("d") },
    ]);
    r.unwrap();
    assert_eq!(std::fs::read_dir(d.path().join("s")).unwrap().count(), 0);
    let (_d, r) = run(&[
        Command::Mkdir {
            path: b("d"),
            ino: 258,
        },
        Command::Unlink { path: b("d") },
    ]);
    assert!(errno_of(r).is_some());
    let (_d, r) = run(&[mkfile("f"), Command::Rmdir { path: b("f") }]);
    assert_eq!(errno_of(r), Some(rustix::io::Errno::NOTDIR.raw_os_error()));
}

#[test]
fn set_and_remove_xattr() {
    let (d, r) = run(&[
        mkfile("f"),
        Command::SetXattr {
            path: b("f"),
            name: b("user.a"),
            data: b("1"),
        },
        Command::SetXattr {
            path: b("f"),
            name: b("user.b"),
            data: b("2"),
        },
        Command::RemoveXattr {
            path: b("f"),
            name: b("user.a"),
        },
    ]);
    r.unwrap();
    let f = d.path().join("s/f");
    let mut buf = [0u8; 16];
    let n = rustix::fs::lgetxattr(&f, "user.b", &mut buf).unwrap();
    assert_eq!(&buf[..n], b"2");
    assert_eq!(
        rustix::fs::lgetxattr(&f, "user.a", &mut buf).unwrap_err(),
        rustix::io::Errno::NODATA
    );
}

#[test]
fn write_places_data_at_its_offset() {
    let (d, r) = run(&[mkfile("f"), write("f", 3, b"xy"), write("f", 0, b"ab")]);
    r.unwrap();
    assert_eq!(std::fs::read(d.path().join("s/f")).unwrap(), b"ab\0xy");
    // Only into a regular file.
    let (_d, r) = run(&[
        Command::Mkdir {
            path: b("d"),
            ino: 257,
        },
        write("d", 0, b"x"),
    ]);
    assert!(r.is_err());
}

#[test]
fn clone_copies_a_range_within_the_subvolume() {
    let (d, r) = run(&[
        mkfile("a"),
        write("a", 0, b"0123456789"),
        mkfile("b"),
        Command::Clone {
            offset: 2,
            len: 4,
            path: b("b"),
            clone_uuid: UUID,
            clone_ctransid: 5,
            clone_path: b("a"),
            clone_offset: 3,
        },
    ]);
    r.unwrap();
    assert_eq!(std::fs::read(d.path().join("s/b")).unwrap(), b"\0\x003456");
    // From a subvolume that was never received here.
    let (_d, r) = run(&[
        mkfile("b"),
        Command::Clone {
            offset: 0,
            len: 4,
            path: b("b"),
            clone_uuid: [3; 16],
            clone_ctransid: 5,
            clone_path: b("a"),
            clone_offset: 0,
        },
    ]);
    assert!(matches!(
        kind_of(r),
        ApplyErrorKind::ParentMissing { parent: false, .. }
    ));
}

#[test]
fn truncate_sets_the_size() {
    let (d, r) = run(&[
        mkfile("f"),
        write("f", 0, b"abcdef"),
        Command::Truncate {
            path: b("f"),
            size: 2,
        },
    ]);
    r.unwrap();
    assert_eq!(std::fs::read(d.path().join("s/f")).unwrap(), b"ab");
}

#[test]
fn chmod_sets_permission_bits_only() {
    let (d, r) = run(&[
        Command::Mkdir {
            path: b("d"),
            ino: 257,
        },
        Command::Chmod {
            path: b("d"),
            mode: 0o41755,
        },
    ]);
    r.unwrap();
    let m = std::fs::metadata(d.path().join("s/d")).unwrap();
    assert!(m.is_dir());
    assert_eq!(m.permissions().mode() & 0o7777, 0o1755);
}

#[test]
fn chown_sets_owners_and_refuses_minus_one() {
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let (d, r) = run(&[
        mkfile("f"),
        Command::Chown {
            path: b("f"),
            uid: uid.into(),
            gid: gid.into(),
        },
    ]);
    r.unwrap();
    let m = std::fs::metadata(d.path().join("s/f")).unwrap();
    assert_eq!((m.uid(), m.gid()), (uid, gid));
    let (_d, r) = run(&[
        mkfile("f"),
        Command::Chown {
            path: b("f"),
            uid: u32::MAX.into(),
            gid: 0,
        },
    ]);
    assert!(matches!(kind_of(r), ApplyErrorKind::Invalid(_)));
}

#[test]
fn chown_to_the_owner_a_new_file_has_still_clears_set_id_bits_after_a_chmod() {
    // chown(2) to the same owner clears S_ISUID (and S_ISGID with
    // group execute): a CHOWN skipped because the new file already has
    // that owner must not keep them.
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let chown = Command::Chown {
        path: b("f"),
        uid: uid.into(),
        gid: gid.into(),
    };
    let chmod = Command::Chmod {
        path: b("f"),
        mode: 0o6755,
    };
    let (d, r) = run(&[
        mkfile("f"),
        write("f", 0, b"x"),
        chmod.clone(),
        chown.clone(),
    ]);
    r.unwrap();
    let m = std::fs::metadata(d.path().join("s/f")).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o755);
    // In the kernel's order (CHOWN, then CHMOD) the bits stay.
    let (d, r) = run(&[mkfile("f"), write("f", 0, b"x"), chown, chmod]);
    r.unwrap();
    let m = std::fs::metadata(d.path().join("s/f")).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o6755);
    assert_eq!((m.uid(), m.gid()), (uid, gid));
}

#[test]
fn utimes_sets_atime_and_mtime_without_following_symlinks() {
    let t = |sec| StreamTime { sec, nsec: 5 };
    let (d, r) = run(&[
        Command::Symlink {
            path: b("l"),
            ino: 257,
            path_link: b("nowhere"),
        },
        Command::Utimes {
            path: b("l"),
            atime: t(1000),
            mtime: t(2000),
            ctime: t(3000),
            otime: None,
        },
    ]);
    r.unwrap();
    let m = std::fs::symlink_metadata(d.path().join("s/l")).unwrap();
    assert_eq!((m.atime(), m.atime_nsec()), (1000, 5));
    assert_eq!((m.mtime(), m.mtime_nsec()), (2000, 5));
}

#[test]
fn update_extent_is_refused() {
    let (_d, r) = run(&[
        mkfile("f"),
        Command::UpdateExtent {
            path: b("f"),
            offset: 0,
            size: 4096,
        },
    ]);
    assert!(matches!(kind_of(r), ApplyErrorKind::NoData));
}

#[test]
fn fallocate_punches_a_hole() {
    let (d, r) = run(&[
        mkfile("f"),
        write("f", 0, &[1; 8192]),
        Command::Fallocate {
            path: b("f"),
            mode: 3,
            offset: 0,
            size: 4096,
        },
    ]);
    r.unwrap();
    let got = std::fs::read(d.path().join("s/f")).unwrap();
    assert_eq!(got.len(), 8192);
    assert!(got[..4096].iter().all(|&x| x == 0));
    assert!(got[4096..].iter().all(|&x| x == 1));
}

#[test]
fn fileattr_flags_are_set_at_the_end() {
    // NOATIME (1 << 9): set after the commands that follow it, at END.
    let (d, r) = run(&[
        mkfile("f"),
        Command::Fileattr {
            path: b("f"),
            attr: 1 << 9,
        },
        write("f", 0, b"x"),
    ]);
    r.unwrap();
    let f = std::fs::File::open(d.path().join("s/f")).unwrap();
    if let Ok(flags) = rustix::fs::ioctl_getflags(&f) {
        assert!(flags.contains(IFlags::NOATIME), "{flags:?}");
    }
    assert_eq!(std::fs::read(d.path().join("s/f")).unwrap(), b"x");
}

#[test]
fn encoded_write_decodes_where_the_ioctl_is_refused() {
    let plain = b"hello hello hello hello".repeat(10);
    let z = zstd::encode_all(&plain[..], 3).unwrap();
    let (d, r) = run(&[
        mkfile("f"),
        Command::EncodedWrite {
            path: b("f"),
            offset: 0,
            unencoded_file_len: 100,
            unencoded_len: plain.len() as u64,
            unencoded_offset: 6,
            compression: Some(2),
            encryption: Some(0),
            data: Cow::Owned(z),
        },
    ]);
    r.unwrap();
    assert_eq!(std::fs::read(d.path().join("s/f")).unwrap(), &plain[6..106]);
    let (_d, r) = run(&[
        mkfile("f"),
        Command::EncodedWrite {
            path: b("f"),
            offset: 0,
            unencoded_file_len: 10,
            unencoded_len: 10,
            unencoded_offset: 0,
            compression: Some(2),
            encryption: Some(1),
            data: b("xx"),
        },
    ]);
    assert!(r.is_err());
}

#[test]
fn a_refused_encoded_write_is_reported_each_time_it_is_decoded() {
    // Off btrfs the ioctl is refused (ENOTTY): the first ENCODED_WRITE
    // says why it is decoded instead, and so does every later one (as
    // btrfs-progs, which tries each time); --force-decompress says
    // nothing.
    struct Log(std::sync::Mutex<Vec<(Vec<u8>, Option<i32>)>>);
    impl Progress for Log {
        fn encoded_fallback(&self, path: &[u8], err: std::io::Error) {
            self.0
                .lock()
                .unwrap()
                .push((path.to_vec(), err.raw_os_error()));
        }
    }
    let d = tempfile::tempdir().unwrap();
    let on_btrfs = rustix::fs::statfs(d.path()).unwrap().f_type == 0x9123_683e;
    let plain = b"hello hello hello hello".repeat(10);
    let z = zstd::encode_all(&plain[..], 3).unwrap();
    let ew = |p: &'static str, offset: u64| Command::EncodedWrite {
        path: b(p),
        offset,
        unencoded_file_len: plain.len() as u64,
        unencoded_len: plain.len() as u64,
        unencoded_offset: 0,
        compression: Some(2),
        encryption: Some(0),
        data: Cow::Owned(z.clone()),
    };
    for force in [false, true] {
        let mut p = Log(std::sync::Mutex::new(Vec::new()));
        {
            let mut rx = Receiver::new(d.path(), &mut p).unwrap();
            rx.force_decompress(force);
            let name = if force { "t" } else { "s" };
            let cmds = [
                Command::Subvol {
                    path: b(name),
                    uuid: UUID,
                    ctransid: 5,
                },
                mkfile("f"),
                mkfile("g"),
                ew("f", 0),
                ew("g", 0),
                ew("f", plain.len() as u64),
            ];
            for c in &cmds {
                rx.apply(&info(c), c).unwrap();
            }
            rx.finish_subvol().unwrap();
            let got = std::fs::read(d.path().join(name).join("f")).unwrap();
            assert_eq!(got, plain.repeat(2));
        }
        let log = p.0.into_inner().unwrap();
        if force {
            assert!(log.is_empty(), "{log:?}");
        } else if !on_btrfs {
            let enotty = Some(rustix::io::Errno::NOTTY.raw_os_error());
            let want: Vec<(Vec<u8>, Option<i32>)> = ["f", "g", "f"]
                .iter()
                .map(|p| (p.as_bytes().to_vec(), enotty))
                .collect();
            assert_eq!(log, want);
        }
    }
}

#[test]
fn an_orphan_name_in_a_new_subvolume_is_known_free_or_taken_without_a_lookup() {
    // The MKFILE + RENAME shortcut needs the orphan name free; in a new
    // subvolume the receiver knows its root's names. Taken: the
    // shortcut is refused (the caller then applies MKFILE, which fails
    // as in stream order); free again after a rename or unlink.
    let d = tempfile::tempdir().unwrap();
    let mut p = NoProgress;
    let mut rx = Receiver::new(d.path(), &mut p).unwrap();
    let cmds = [
        Command::Subvol {
            path: b("s"),
            uuid: UUID,
            ctransid: 5,
        },
        mkfile("o1"),
        Command::Mkdir {
            path: b("dir"),
            ino: 0,
        },
        mkfile("o2"),
    ];
    for c in &cmds {
        rx.apply(&info(c), c).unwrap();
    }
    assert!(rx.root_names.is_some());
    // Taken (made by MKFILE): refused, nothing made at the new name.
    assert!(!rx.create_renamed(&mkfile("o1"), b"dir/a"));
    assert!(!d.path().join("s/dir/a").exists());
    let m = mkfile("o1");
    let e = rx.apply(&info(&m), &m).unwrap_err();
    assert_eq!(
        e.io_error().and_then(io::Error::raw_os_error),
        Some(libc_eexist())
    );
    // Renamed away and unlinked: free.
    for c in [
        Command::Rename {
            path: b("o1"),
            path_to: b("dir/x"),
        },
        Command::Unlink { path: b("o2") },
    ] {
        rx.apply(&info(&c), &c).unwrap();
    }
    assert!(rx.create_renamed(&mkfile("o1"), b"dir/a"));
    assert!(rx.create_renamed(&mkfile("o2"), b"top"));
    assert!(d.path().join("s/dir/a").is_file() && d.path().join("s/top").is_file());
    assert!(!d.path().join("s/o1").exists() && !d.path().join("s/o2").exists());
    // "top" was made at the root by the shortcut: taken.
    assert!(!rx.create_renamed(&mkfile("top"), b"dir/b"));
    // A failed command leaves the names unknown: the filesystem is asked.
    let bad = Command::Rename {
        path: b("missing"),
        path_to: b("other"),
    };
    assert!(rx.apply(&info(&bad), &bad).is_err());
    assert!(rx.root_names.is_none());
    assert!(!rx.create_renamed(&mkfile("top"), b"dir/b"));
    assert!(rx.create_renamed(&mkfile("o3"), b"dir/c"));
    rx.finish_subvol().unwrap();
}

#[test]
fn enable_verity_is_a_note_and_unknown_commands_are_ignored() {
    struct Count(std::sync::atomic::AtomicUsize);
    impl Progress for Count {
        fn note(&self, _: &str) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let d = tempfile::tempdir().unwrap();
    let mut p = Count(0.into());
    {
        let mut rx = Receiver::new(d.path(), &mut p).unwrap();
        let cmds = [
            Command::Subvol {
                path: b("s"),
                uuid: UUID,
                ctransid: 5,
            },
            mkfile("f"),
            Command::EnableVerity {
                path: b("f"),
                algorithm: 1,
                block_size: 4096,
                salt: b(""),
                sig: b(""),
            },
            Command::Unknown {
                cmd: 99,
                payload: b(""),
            },
        ];
        for c in &cmds {
            rx.apply(&info(c), c).unwrap();
        }
        rx.finish_subvol().unwrap();
    }
    assert_eq!(p.0.load(Ordering::Relaxed), 1);
}
