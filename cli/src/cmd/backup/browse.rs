//! `btrsend backup index`, `ls` and `dump`: the browsing index of stored
//! snapshots (core `btrsend::backup::index`), built, listed and read.
//!
//! Names from the index are the snapshot's own: printed escaped (no
//! control character reaches a terminal), given to JSON as text (bytes
//! that are not UTF-8 become U+FFFD).

use std::io::{IsTerminal, Write};
use std::ops::ControlFlow;

use btrsend::backup::index::model::{FileType, Inode};
use btrsend::backup::index::{DataSource, IndexError, Snapshot};
use btrsend::backup::{BackupError, LockKind, NoProgress};
use btrsend::receive::target::check_path;
use clap::Args;
use serde_json::json;

use super::{LockArg, RepoArg};
use crate::text::printable_bytes;

/// Arguments of `btrsend backup index`.
#[derive(Debug, Args)]
pub struct IndexArgs {
    #[command(flatten)]
    repo: RepoArg,
    #[command(flatten)]
    lock: LockArg,
}

/// Arguments of `btrsend backup ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    #[command(flatten)]
    repo: RepoArg,
    /// Long listing: type and mode, links, owner, group, size, modification
    /// time (UTC), path (and a symlink's target).
    #[arg(short = 'l', long = "long")]
    long: bool,
    /// List PATH and everything below it, depth first.
    #[arg(short = 'R', long = "recursive")]
    recursive: bool,
    /// One JSON object per line, with the keys path (from the snapshot's
    /// root, starting with /), type (file, dir, symlink, fifo, socket,
    /// chardev, blockdev), mode (permission bits with setuid, setgid and
    /// sticky, an integer), uid, gid, size, mtime (RFC 3339, UTC, with
    /// nanoseconds), nlink, and target (symlinks) or rdev (devices,
    /// MAJOR:MINOR).
    #[arg(long)]
    json: bool,
    /// The stored snapshot (as `backup restore` takes it).
    #[arg(value_name = "SNAPSHOT")]
    snapshot: String,
    /// A path inside the snapshot (default: its root): a directory lists
    /// its entries, anything else itself.
    #[arg(value_name = "PATH", default_value = "/")]
    path: String,
}

/// Arguments of `btrsend backup dump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    #[command(flatten)]
    repo: RepoArg,
    /// The stored snapshot (as `backup restore` takes it).
    #[arg(value_name = "SNAPSHOT")]
    snapshot: String,
    /// The path inside the snapshot: a regular file's bytes go to
    /// standard output (holes as zeros); a directory's tree goes as a POSIX
    /// pax tar archive, names from the snapshot's root without the leading
    /// / (owners, modes, mtimes with nanoseconds, xattrs as
    /// SCHILY.xattr.*, symlinks, hard links, devices and fifos; sockets
    /// are left out).
    #[arg(value_name = "PATH")]
    path: String,
}

/// Run `btrsend backup index`.
pub fn index(a: &IndexArgs) -> anyhow::Result<()> {
    let repo = a.repo.open()?;
    let report = repo.build_indexes(a.lock.wait(), &NoProgress)?;
    for (id, why) in &report.failed {
        eprintln!(
            "btrsend: entry {id} could not be indexed: {}",
            crate::text::printable(why)
        );
    }
    if std::io::stderr().is_terminal() {
        eprintln!(
            "btrsend: indexed {} snapshot(s) ({} of them again: their index was damaged); {} had a whole index",
            report.built.len(),
            report.rebuilt.len(),
            report.present
        );
    }
    if !report.failed.is_empty() {
        anyhow::bail!("{} snapshot(s) could not be indexed", report.failed.len());
    }
    Ok(())
}

/// PATH as the index takes it: no leading or trailing `/`, checked as a
/// stream path is.
fn inner_path(path: &str) -> anyhow::Result<Vec<u8>> {
    let p = path.trim_matches('/').as_bytes().to_vec();
    check_path(&p).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
    Ok(p)
}

/// Open SNAPSHOT's index with a shared lock and hand it to `f`.
fn with_snapshot(
    repo: &RepoArg,
    spec: &str,
    f: impl FnOnce(&Snapshot<'_, '_>, &dyn DataSource) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let repo = repo.open()?;
    let _lock = repo.lock(LockKind::Shared, std::time::Duration::ZERO, &NoProgress)?;
    let cat = repo.catalog()?;
    let entry = repo.find(&cat, spec)?;
    let mut result = Ok(());
    repo.with_index(&cat, entry, |snap, data| {
        result = f(snap, data);
        Ok::<(), BackupError>(())
    })?;
    result
}

pub(super) fn index_err(e: IndexError) -> anyhow::Error {
    anyhow::Error::new(e)
}

/// Run `btrsend backup ls`.
pub fn ls(a: &LsArgs) -> anyhow::Result<()> {
    let path = inner_path(&a.path)?;
    with_snapshot(&a.repo, &a.snapshot, |snap, _| {
        let mut out = std::io::BufWriter::new(crate::exit::stdout());
        let ino = snap.lookup(&path).map_err(index_err)?;
        let inode = snap.inode(ino).map_err(index_err)?;
        let mut print = |p: &[u8], i: &Inode| -> Result<(), IndexError> {
            line(&mut out, p, i, a).map_err(|e| IndexError::Store(e.to_string()))
        };
        if a.recursive {
            print(&path, &inode).map_err(index_err)?;
            if inode.kind == FileType::Dir {
                snap.walk_below(ino, &mut path.clone(), &mut |p, _, i| print(p, i))
                    .map_err(index_err)?;
            }
        } else if inode.kind == FileType::Dir {
            snap.children(ino, &mut |name, child| {
                let i = snap.inode(child)?;
                print(&join(&path, name), &i)?;
                Ok(ControlFlow::Continue(()))
            })
            .map_err(index_err)?;
        } else {
            print(&path, &inode).map_err(index_err)?;
        }
        out.flush()?;
        Ok(())
    })
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn type_name(k: FileType) -> &'static str {
    match k {
        FileType::File => "file",
        FileType::Dir => "dir",
        FileType::Symlink => "symlink",
        FileType::Fifo => "fifo",
        FileType::Sock => "socket",
        FileType::Chr => "chardev",
        FileType::Blk => "blockdev",
    }
}

/// RFC 3339 in UTC with nanoseconds.
fn rfc3339(sec: i64, nsec: u32) -> String {
    match jiff::Timestamp::new(sec, nsec as i32) {
        Ok(t) => format!("{}.{nsec:09}Z", t.strftime("%Y-%m-%dT%H:%M:%S")),
        Err(_) => format!("{sec}.{nsec:09}"),
    }
}

/// The `ls --json` object of `shown` (from the root, with its leading /).
pub(super) fn json_of(shown: &[u8], i: &Inode) -> serde_json::Value {
    let mut v = json!({
        "path": String::from_utf8_lossy(shown),
        "type": type_name(i.kind),
        "mode": i.mode,
        "uid": i.uid,
        "gid": i.gid,
        "size": i.size,
        "mtime": rfc3339(i.mtime.0, i.mtime.1),
        "nlink": i.nlink,
    });
    if i.kind == FileType::Symlink {
        v["target"] = json!(String::from_utf8_lossy(&i.target));
    }
    if matches!(i.kind, FileType::Chr | FileType::Blk) {
        let (major, minor) = i.rdev_parts();
        v["rdev"] = json!(format!("{major}:{minor}"));
    }
    v
}

fn line(out: &mut dyn Write, path: &[u8], i: &Inode, a: &LsArgs) -> std::io::Result<()> {
    let shown = {
        let mut p = b"/".to_vec();
        p.extend_from_slice(path);
        p
    };
    if a.json {
        let v = json_of(&shown, i);
        return writeln!(out, "{v}");
    }
    if a.long {
        let t = match i.kind {
            FileType::File => '-',
            FileType::Dir => 'd',
            FileType::Symlink => 'l',
            FileType::Fifo => 'p',
            FileType::Sock => 's',
            FileType::Chr => 'c',
            FileType::Blk => 'b',
        };
        write!(
            out,
            "{t}{} {:>3} {:>6} {:>6} {:>12} {} ",
            mode_string(i.mode),
            i.nlink,
            i.uid,
            i.gid,
            i.size,
            rfc3339(i.mtime.0, i.mtime.1)
        )?;
    }
    out.write_all(&printable_bytes(&shown))?;
    if a.long && i.kind == FileType::Symlink {
        out.write_all(b" -> ")?;
        out.write_all(&printable_bytes(&i.target))?;
    }
    writeln!(out)
}

/// `rwxr-x---` with setuid, setgid and sticky as `ls` shows them.
fn mode_string(m: u32) -> String {
    let bit = |b: u32, c: char| if m & b != 0 { c } else { '-' };
    let special = |x: bool, s: bool, on: char, off: char| match (x, s) {
        (true, true) => on,
        (false, true) => off,
        (true, false) => 'x',
        (false, false) => '-',
    };
    [
        bit(0o400, 'r'),
        bit(0o200, 'w'),
        special(m & 0o100 != 0, m & 0o4000 != 0, 's', 'S'),
        bit(0o040, 'r'),
        bit(0o020, 'w'),
        special(m & 0o010 != 0, m & 0o2000 != 0, 's', 'S'),
        bit(0o004, 'r'),
        bit(0o002, 'w'),
        special(m & 0o001 != 0, m & 0o1000 != 0, 't', 'T'),
    ]
    .iter()
    .collect()
}

/// Run `btrsend backup dump`.
pub fn dump(a: &DumpArgs) -> anyhow::Result<()> {
    let path = inner_path(&a.path)?;
    if std::io::stdout().is_terminal() {
        anyhow::bail!(
            "refusing to write file contents to a terminal: redirect standard output to a file or a pipe"
        );
    }
    with_snapshot(&a.repo, &a.snapshot, |snap, data| {
        let ino = snap.lookup(&path).map_err(index_err)?;
        let inode = snap.inode(ino).map_err(index_err)?;
        if inode.kind == FileType::Dir {
            let mut out = std::io::BufWriter::with_capacity(1 << 20, crate::exit::stdout());
            super::tar::write_dir(snap, data, ino, &path, &mut out).map_err(index_err)?;
            out.flush()?;
            return Ok(());
        }
        if inode.kind != FileType::File {
            anyhow::bail!(
                "{}: a {}, not a regular file or directory: dump writes regular files, and directories as tar",
                String::from_utf8_lossy(&printable_bytes(&path)),
                type_name(inode.kind)
            );
        }
        let mut out = crate::exit::stdout();
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < inode.size {
            let n = snap
                .read(ino, &inode, at, &mut buf, data)
                .map_err(index_err)?;
            out.write_all(&buf[..n])?;
            at += n as u64;
        }
        out.flush()?;
        Ok(())
    })
}
