//! The lines `btrfs receive -v` and `-vv` print about the commands it
//! applies, byte for byte as btrfs-progs 6.2 prints them (`cmds/receive.c`:
//! the `process_*` callbacks and `finish_subvol`), beside [`dump`](crate::dump)'s
//! `--dump` text. Paths are the stream's, relative to the subvolume, raw
//! bytes (progs prints them unescaped).
//!
//! This module only makes the text of a line (without its newline); it
//! must not print, decide the verbosity a receive runs at or know where a
//! line goes: that is the caller's (btrsend's `receive` command).

use crate::command::Command;
use crate::dump::UuidText;

/// `parts` joined: a line of raw bytes.
fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// "At subvol NAME" (a SUBVOL) or "At snapshot NAME" (`incremental`: a
/// SNAPSHOT), the line progs prints when it starts a subvolume.
pub fn at(name: &[u8], incremental: bool) -> Vec<u8> {
    let what: &[u8] = if incremental {
        b"At snapshot "
    } else {
        b"At subvol "
    };
    cat(&[what, name])
}

/// The `-v` line of a SUBVOL or SNAPSHOT ("receiving subvol …", "receiving
/// snapshot …" with its UUIDs and transids); `None` for other commands.
pub fn receiving(cmd: &Command<'_>) -> Option<Vec<u8>> {
    Some(match cmd {
        Command::Subvol {
            path,
            uuid,
            ctransid,
        } => cat(&[
            b"receiving subvol ",
            path,
            format!(" uuid={}, stransid={ctransid}", UuidText(uuid)).as_bytes(),
        ]),
        Command::Snapshot {
            path,
            uuid,
            ctransid,
            clone_uuid,
            clone_ctransid,
        } => cat(&[
            b"receiving snapshot ",
            path,
            format!(
                " uuid={}, ctransid={ctransid} parent_uuid={}, parent_ctransid={clone_ctransid}",
                UuidText(uuid),
                UuidText(clone_uuid)
            )
            .as_bytes(),
        ]),
        _ => return None,
    })
}

/// The `-v` line at the end of a subvolume received as a real one: the
/// received UUID and stransid set on it.
pub fn set_received_subvol(uuid: &[u8; 16], stransid: u64) -> Vec<u8> {
    format!(
        "BTRFS_IOC_SET_RECEIVED_SUBVOL uuid={}, stransid={stransid}",
        UuidText(uuid)
    )
    .into_bytes()
}

/// The `-vv` line of an ENCODED_WRITE of `path` written decoded because
/// the target refused `BTRFS_IOC_ENCODED_WRITE` with `err`: progs'
/// `"%d (\"%m\")"`, the errno and its text.
pub fn encoded_fallback(path: &[u8], err: &std::io::Error) -> Vec<u8> {
    let code = err.raw_os_error().unwrap_or(0);
    let text = err.to_string();
    let text = text
        .strip_suffix(&format!(" (os error {code})"))
        .unwrap_or(&text);
    cat(&[
        b"encoded_write ",
        path,
        format!(" - falling back to decompress and write due to errno {code} (\"{text}\")")
            .as_bytes(),
    ])
}

/// The line progs prints for `cmd` at verbosity `level` (1: `-v`, WRITE
/// and CLONE only; 2: `-vv`, every command it has a line for); `None`
/// when it prints none. SUBVOL and SNAPSHOT have theirs in [`receiving`].
pub fn command(cmd: &Command<'_>, level: u8) -> Option<Vec<u8>> {
    use Command as C;
    Some(match cmd {
        C::Write { path, offset, data } => cat(&[
            b"write ",
            path,
            format!(" - offset={offset} length={}", data.len()).as_bytes(),
        ]),
        C::Clone {
            offset,
            len,
            path,
            clone_path,
            clone_offset,
            ..
        } => cat(&[
            b"clone ",
            path,
            b" - source=",
            clone_path,
            format!(" source offset={clone_offset} offset={offset} length={len}").as_bytes(),
        ]),
        _ if level < 2 => return None,
        C::Mkfile { path, .. } => cat(&[b"mkfile ", path]),
        C::Mkdir { path, .. } => cat(&[b"mkdir ", path]),
        C::Mknod {
            path, rdev, mode, ..
        } => cat(&[
            b"mknod ",
            path,
            format!(" mode={mode}, dev={rdev}").as_bytes(),
        ]),
        C::Mkfifo { path, .. } => cat(&[b"mkfifo ", path]),
        C::Mksock { path, .. } => cat(&[b"mksock ", path]),
        C::Symlink {
            path, path_link, ..
        } => cat(&[b"symlink ", path, b" -> ", path_link]),
        C::Rename { path, path_to } => cat(&[b"rename ", path, b" -> ", path_to]),
        C::Link { path, path_link } => cat(&[b"link ", path, b" -> ", path_link]),
        C::Unlink { path } => cat(&[b"unlink ", path]),
        C::Rmdir { path } => cat(&[b"rmdir ", path]),
        C::SetXattr { path, name, data } => cat(&[
            b"set_xattr ",
            path,
            b" - name=",
            name,
            format!(" data_len={} data=", data.len()).as_bytes(),
            // progs prints the value as a C string: up to its first NUL.
            data.split(|&b| b == 0).next().unwrap_or_default(),
        ]),
        C::RemoveXattr { path, name } => cat(&[b"remove_xattr ", path, b" - name=", name]),
        C::Truncate { path, size } => {
            cat(&[b"truncate ", path, format!(" size={size}").as_bytes()])
        }
        // progs prints the mode as a C int, in octal.
        C::Chmod { path, mode } => cat(&[
            b"chmod ",
            path,
            format!(" - mode=0{:o}", mode & u64::from(u32::MAX)).as_bytes(),
        ]),
        C::Chown { path, uid, gid } => cat(&[
            b"chown ",
            path,
            format!(" - uid={uid}, gid={gid}").as_bytes(),
        ]),
        C::Utimes { path, .. } => cat(&[b"utimes ", path]),
        C::UpdateExtent { path, offset, size } => cat(&[
            b"update_extent ",
            path,
            format!(": offset={offset}, len={size}").as_bytes(),
        ]),
        C::Fallocate {
            path,
            mode,
            offset,
            size,
        } => cat(&[
            b"fallocate ",
            path,
            format!(" - offset={offset}, len={size}, mode={mode}").as_bytes(),
        ]),
        C::EncodedWrite {
            path,
            offset,
            unencoded_file_len,
            unencoded_len,
            unencoded_offset,
            compression,
            encryption,
            data,
        } => cat(&[
            b"encoded_write ",
            path,
            format!(
                " - offset={offset}, len={}, unencoded_offset={unencoded_offset}, \
                 unencoded_file_len={unencoded_file_len}, unencoded_len={unencoded_len}, \
                 compression={}, encryption={}",
                data.len(),
                compression.unwrap_or(0),
                encryption.unwrap_or(0)
            )
            .as_bytes(),
        ]),
        // SUBVOL and SNAPSHOT: `receiving`; progs prints nothing for the
        // rest (END, FILEATTR, ENABLE_VERITY).
        _ => return None,
    })
}
