//! Receive errors that must say what and where and leave nothing behind
//! (issue 15, "Hardening"): out-of-range offsets in a stream, a rerun over
//! an incompletely received subvolume, a record that cannot be written.

use std::borrow::Cow;
use std::fs;
use std::io::Cursor;
use std::path::Path;

use btrsend::receive::{self, NoProgress, ReceiveOptions};
use stream_format::{Command, StreamWriter};

fn p(s: &str) -> Cow<'_, [u8]> {
    Cow::Borrowed(s.as_bytes())
}

/// A v2 stream of `cmds`, ended by the writer's END.
fn stream(cmds: &[Command<'_>]) -> Vec<u8> {
    let mut w = StreamWriter::new(Vec::new(), 2).unwrap();
    for c in cmds {
        w.write(c).unwrap();
    }
    w.finish().unwrap()
}

/// The stream offset of command `index` (0-based), read from the headers
/// as the format defines them: a 17-byte stream header, then per command
/// a 10-byte header whose first 4 bytes are the payload length.
fn command_offset(bytes: &[u8], index: usize) -> usize {
    let mut at = 17;
    for _ in 0..index {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += 10 + len;
    }
    at
}

fn receive_err(dir: &Path, bytes: &[u8]) -> String {
    receive_err_with(dir, bytes, &ReceiveOptions::default())
}

fn receive_ok(dir: &Path, bytes: &[u8]) {
    receive::receive(
        Cursor::new(bytes),
        dir,
        &ReceiveOptions::default(),
        &mut NoProgress,
    )
    .unwrap();
}

fn receive_err_with(dir: &Path, bytes: &[u8], opts: &ReceiveOptions) -> String {
    receive::receive(Cursor::new(bytes), dir, opts, &mut NoProgress)
        .unwrap_err()
        .to_string()
}

fn sv() -> Command<'static> {
    Command::Subvol {
        path: p("sv"),
        uuid: [7; 16],
        ctransid: 1,
    }
}

fn mkfile(name: &str, ino: u64) -> Command<'_> {
    Command::Mkfile { path: p(name), ino }
}

#[test]
fn truncate_size_and_clone_offset_past_2_pow_63_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = stream(&[
        sv(),
        mkfile("f", 257),
        Command::Truncate {
            path: p("f"),
            size: 1 << 63,
        },
    ]);
    let f = tmp.path().join("sv/f");
    assert_eq!(
        receive_err(tmp.path(), &bytes),
        format!(
            "cannot apply command 2 (TRUNCATE) at stream offset {}: TRUNCATE \"f\" ({}): size \
             9223372036854775808 is past the largest file offset 9223372036854775807 (2^63 - 1)",
            command_offset(&bytes, 2),
            f.display()
        )
    );

    let tmp = tempfile::tempdir().unwrap();
    let bytes = stream(&[
        sv(),
        mkfile("f", 257),
        mkfile("g", 258),
        Command::Clone {
            offset: 1 << 63,
            len: 4096,
            path: p("g"),
            clone_uuid: [7; 16],
            clone_ctransid: 1,
            clone_path: p("f"),
            clone_offset: 0,
        },
    ]);
    assert_eq!(
        receive_err(tmp.path(), &bytes),
        format!(
            "cannot apply command 3 (CLONE) at stream offset {}: CLONE \"g\" ({}) from \"f\" \
             ({}): offset 9223372036854775808 + length 4096 is past the largest file offset \
             9223372036854775807 (2^63 - 1)",
            command_offset(&bytes, 3),
            tmp.path().join("sv/g").display(),
            tmp.path().join("sv/f").display()
        )
    );
}

#[test]
fn rerun_over_an_incomplete_subvolume_says_how_to_receive_again() {
    let tmp = tempfile::tempdir().unwrap();
    // Fails at its TRUNCATE: `sv` is left recorded as incomplete. Without
    // checkpoints, so with no start mark either (see below).
    let bad = stream(&[
        sv(),
        mkfile("f", 257),
        Command::Truncate {
            path: p("f"),
            size: u64::MAX,
        },
    ]);
    let mut once = ReceiveOptions::default();
    once.checkpoint_interval = 0;
    receive_err_with(tmp.path(), &bad, &once);
    let record = tmp.path().join(".btrsend/sv.subvol");
    assert!(
        fs::read_to_string(&record)
            .unwrap()
            .ends_with("state=incomplete\n")
    );
    let good = stream(&[sv(), mkfile("f", 257)]);
    assert_eq!(
        receive_err(tmp.path(), &good),
        format!(
            "cannot apply command 0 (SUBVOL) at stream offset 17: SUBVOL \"sv\" ({dir}): \
             subvolume directory exists already, and its record {rec} says it is incomplete (an \
             earlier receive was interrupted or failed): to receive it again, delete {dir} and \
             {rec}",
            dir = tmp.path().join("sv").display(),
            rec = record.display()
        )
    );
    // Doing so works.
    fs::remove_dir_all(tmp.path().join("sv")).unwrap();
    fs::remove_file(&record).unwrap();
    receive_ok(tmp.path(), &good);
    // A complete one keeps the plain message.
    assert_eq!(
        receive_err(tmp.path(), &good),
        format!(
            "cannot apply command 0 (SUBVOL) at stream offset 17: SUBVOL \"sv\" ({}): subvolume \
             directory exists already",
            tmp.path().join("sv").display()
        )
    );

    // With checkpoints (the default) the failed receive leaves a start
    // mark: the same subvolume received again starts it over.
    let tmp = tempfile::tempdir().unwrap();
    receive_err(tmp.path(), &bad);
    fs::write(
        tmp.path().join("sv/stray"),
        b"made by the failed receive's era",
    )
    .unwrap();
    receive_ok(tmp.path(), &good);
    assert!(
        fs::read_to_string(tmp.path().join(".btrsend/sv.subvol"))
            .unwrap()
            .ends_with("state=complete\n")
    );
    let mut names: Vec<_> = fs::read_dir(tmp.path().join("sv"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["f"]);
    assert!(!tmp.path().join(receive::RESUME_DIR).exists());
}

#[test]
fn full_disk_at_the_record_leaves_nothing_behind() {
    if !btrsend::testing::require_live("full_disk_at_the_record_leaves_nothing_behind") {
        return;
    }
    let t = btrsend::testing::Tmpfs::new(64 << 10).unwrap();
    let dir = t.path();
    // Fill it: directories still fit (tmpfs charges them no blocks), the
    // record's bytes do not.
    let mut fill = fs::File::create(dir.join("fill")).unwrap();
    let chunk = vec![0u8; 4096];
    while std::io::Write::write_all(&mut fill, &chunk).is_ok() {}
    drop(fill);
    let bytes = stream(&[sv(), mkfile("f", 257)]);
    assert_eq!(
        receive_err(dir, &bytes),
        format!(
            "cannot apply command 0 (SUBVOL) at stream offset 17: SUBVOL \"sv\" ({}): cannot \
             write the subvolume's record: {}: No space left on device (os error 28) (nothing \
             was received: the new subvolume directory was removed again)",
            dir.join("sv").display(),
            dir.join(".btrsend/sv.subvol").display()
        )
    );
    assert!(!dir.join("sv").exists(), "DIR/sv left behind");
    let left: Vec<_> = fs::read_dir(dir.join(".btrsend"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "records left behind: {left:?}");
}
