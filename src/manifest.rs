//! Manifests: one sorted text line per path of a directory tree, the yardstick
//! of every round trip (the kernel's mount of a snapshot versus what a
//! receiver made of its stream).
//!
//! This module reads a *mounted* tree through the kernel (lstat, xattrs,
//! SEEK_DATA/SEEK_HOLE, file contents); it sits outside the device → model →
//! send data flow and depends on none of it.
//!
//! # Format, version 1
//!
//! Stored manifests depend on this format; any change to it must bump the
//! version in the header line.
//!
//! ```text
//! # btrsend manifest v1
//! . dir mode=0755 uid=0 gid=0 mtime=1704164645.123456789
//! d dir mode=0755 uid=0 gid=0 mtime=1704164645.123456789
//! d/f file mode=0640 uid=1000 gid=1000 size=3 mtime=1704164645.123456789 b3=… xattr:user.k=v
//! d/l symlink mode=0777 uid=0 gid=0 size=1 mtime=0.000000000 target=f
//! dev chr mode=0600 uid=0 gid=0 mtime=0.000000000 rdev=1:7
//! ```
//!
//! * The first line is exactly [`HEADER`]. Every following line describes one
//!   path; fields are separated by one space, so every field is escaped (see
//!   below) and no field contains a space or a newline.
//! * Lines are sorted by the **raw bytes** of the relative path (not by the
//!   escaped text); the root is `.` and always comes first. Paths have no
//!   leading `./`.
//! * Field 1 is the escaped relative path, field 2 the type: `file`, `dir`,
//!   `symlink`, `fifo`, `sock`, `chr`, `blk`, or `subvol`. A `subvol` is a
//!   directory whose `st_dev` differs from the root's: a nested btrfs
//!   subvolume (or any other mount point). It is not descended into and its
//!   line has no further fields, because a send of the outer subvolume never
//!   includes it.
//! * Then `key=value` fields, always in this order, each only where it
//!   applies:
//!   * `mode=` permission bits including setuid, setgid and sticky, as four
//!     octal digits (`mode & 0o7777`);
//!   * `uid=`, `gid=` in decimal;
//!   * `size=` in bytes, for regular files and symlinks (a symlink's size is
//!     the length of its target). Omitted for directories (their sizes differ
//!     between filesystems and are meaningless) and for fifos, sockets and
//!     devices (always 0);
//!   * `mtime=SEC.NSEC`: the raw `struct timespec` of the modification time,
//!     `st_mtime` as a signed decimal and `st_mtime_nsec` as exactly nine
//!     digits. The time is SEC + NSEC/10⁹, so half a second before the epoch
//!     is `-1.500000000`;
//!   * `target=` the escaped symlink target;
//!   * `rdev=MAJOR:MINOR` of character and block devices;
//!   * `link=` the hard-link group of any non-directory with `st_nlink > 1`:
//!     the escaped path of the group's first member in sorted order, so two
//!     trees with the same link structure give the same text whatever their
//!     inode numbers. The first member names itself;
//!   * `b3=` the BLAKE3 hash of a regular file's contents, 64 hex digits;
//!   * `data=` (only with [`Options::holes`]) the data ranges of a regular
//!     file as found by `lseek(SEEK_DATA)` / `lseek(SEEK_HOLE)`, as
//!     comma-separated `OFFSET+LENGTH` in decimal bytes, or `-` if the file
//!     has no data (empty or all hole). A file without holes of size N has
//!     `data=0+N`;
//!   * `xattr:NAME=VALUE` for every extended attribute, sorted by the raw
//!     bytes of the name, including `security.*`, `system.posix_acl_*` and
//!     `trusted.*` as stored (values are the raw on-disk bytes, e.g. the
//!     binary ACL format). An empty value is `xattr:NAME=`.
//! * Never recorded: atime, ctime, birth time, inode numbers, `st_dev`,
//!   directory sizes and link counts.
//!
//! ## Escaping
//!
//! Paths, symlink targets, xattr names and values are byte strings, written
//! with every byte outside the printable ASCII range `0x21..=0x7e`, and the
//! backslash, as `\xHH` (two lowercase hex digits); in xattr names `=` is
//! escaped too, so the first unescaped `=` of an xattr field ends the name.
//! So a space is `\x20`, a newline `\x0a`, a backslash `\x5c`, and UTF-8
//! `é` is `\xc3\xa9`: the text is ASCII and maps back to exactly one byte
//! string.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::SeekFrom;
use rustix::io::Errno;

/// The first line of every manifest; names the format version.
pub const HEADER: &str = "# btrsend manifest v1";

/// What to record beyond the always-present fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Record the data ranges of regular files (the `data=` field).
    pub holes: bool,
}

/// A failure while describing a tree, naming the path it happened at.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A system call failed on a path.
    #[error("{op} failed on {path}")]
    Io {
        /// The operation, e.g. `lstat` or `read`.
        op: &'static str,
        /// The path it was applied to.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `lstat` reported a file type this format has no name for.
    #[error("unknown file type (mode {mode:#o}) at {path}")]
    UnknownType {
        /// The full `st_mode`.
        mode: u32,
        /// The path.
        path: PathBuf,
    },
    /// Writing the manifest out failed.
    #[error("cannot write the manifest")]
    Write(#[source] io::Error),
}

type Result<T, E = ManifestError> = std::result::Result<T, E>;

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ManifestError + 'a {
    move |source| ManifestError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn errno_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> ManifestError + 'a {
    move |e| ManifestError::Io {
        op,
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// Everything recorded about one path, before hard-link groups are named.
struct Entry {
    /// Relative path, raw bytes; empty for the root.
    rel: Vec<u8>,
    /// The line from field 2 up to (excluding) the `link=` field.
    head: String,
    /// The line after the `link=` field (`b3=`, `data=`, xattrs), with its
    /// leading space.
    tail: String,
    /// `(st_dev, st_ino)` for non-directories with `st_nlink > 1`.
    link_key: Option<(u64, u64)>,
}

/// Describe the tree at `root` and return the manifest text (header and
/// lines, each ending in `\n`).
///
/// # Errors
///
/// The first failing system call, with its path.
pub fn manifest(root: &Path, opts: Options) -> Result<String> {
    let mut out = Vec::new();
    write_manifest(root, opts, &mut out)?;
    // OK to unwrap: every byte written is ASCII (all fields are escaped).
    Ok(String::from_utf8(out).expect("manifest text is ASCII"))
}

/// Describe the tree at `root` and write the manifest to `out`.
///
/// # Errors
///
/// The first failing system call, with its path, or a write error.
pub fn write_manifest(root: &Path, opts: Options, out: &mut dyn Write) -> Result<()> {
    let root_meta = fs::symlink_metadata(root).map_err(io_err("lstat", root))?;
    let mut entries = Vec::new();
    let mut stack = vec![(root.to_path_buf(), Vec::new(), root_meta)];
    let root_dev = stack[0].2.dev();
    while let Some((path, rel, meta)) = stack.pop() {
        let is_dir = meta.file_type().is_dir();
        if is_dir && meta.dev() != root_dev {
            entries.push(Entry {
                rel,
                head: "subvol".to_owned(),
                tail: String::new(),
                link_key: None,
            });
            continue;
        }
        entries.push(describe(&path, rel.clone(), &meta, opts)?);
        if is_dir {
            for dirent in fs::read_dir(&path).map_err(io_err("readdir", &path))? {
                let dirent = dirent.map_err(io_err("readdir", &path))?;
                let child = dirent.path();
                let name = dirent.file_name();
                let mut child_rel = rel.clone();
                if !child_rel.is_empty() {
                    child_rel.push(b'/');
                }
                child_rel.extend_from_slice(name.as_bytes());
                let child_meta = fs::symlink_metadata(&child).map_err(io_err("lstat", &child))?;
                stack.push((child, child_rel, child_meta));
            }
        }
    }
    entries.sort_unstable_by(|a, b| a.rel.cmp(&b.rel));

    // Name each hard-link group after its first member in sorted order.
    let mut groups: HashMap<(u64, u64), String> = HashMap::new();
    let mut w = io::BufWriter::new(out);
    let mut line = String::new();
    writeln!(w, "{HEADER}").map_err(ManifestError::Write)?;
    for e in &entries {
        line.clear();
        if e.rel.is_empty() {
            line.push('.');
        } else {
            escape_into(&mut line, &e.rel, false);
        }
        line.push(' ');
        line.push_str(&e.head);
        if let Some(key) = e.link_key {
            let name = groups.entry(key).or_insert_with(|| {
                let mut s = String::new();
                escape_into(&mut s, &e.rel, false);
                s
            });
            line.push_str(" link=");
            line.push_str(name);
        }
        line.push_str(&e.tail);
        line.push('\n');
        w.write_all(line.as_bytes()).map_err(ManifestError::Write)?;
    }
    w.flush().map_err(ManifestError::Write)
}

/// Build the fields of one path (everything except its name and link group).
fn describe(path: &Path, rel: Vec<u8>, meta: &fs::Metadata, opts: Options) -> Result<Entry> {
    let ft = meta.file_type();
    let kind = if ft.is_file() {
        "file"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_symlink() {
        "symlink"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_socket() {
        "sock"
    } else if ft.is_char_device() {
        "chr"
    } else if ft.is_block_device() {
        "blk"
    } else {
        return Err(ManifestError::UnknownType {
            mode: meta.mode(),
            path: path.to_path_buf(),
        });
    };
    let mut head = String::with_capacity(96);
    // Writing to a String cannot fail.
    let _ = write!(
        head,
        "{kind} mode={:04o} uid={} gid={}",
        meta.mode() & 0o7777,
        meta.uid(),
        meta.gid()
    );
    if ft.is_file() || ft.is_symlink() {
        let _ = write!(head, " size={}", meta.size());
    }
    let _ = write!(head, " mtime={}.{:09}", meta.mtime(), meta.mtime_nsec());
    if ft.is_symlink() {
        let target = fs::read_link(path).map_err(io_err("readlink", path))?;
        head.push_str(" target=");
        escape_into(&mut head, target.as_os_str().as_bytes(), false);
    }
    if ft.is_char_device() || ft.is_block_device() {
        let rdev = meta.rdev();
        let _ = write!(
            head,
            " rdev={}:{}",
            rustix::fs::major(rdev),
            rustix::fs::minor(rdev)
        );
    }
    let link_key = (!ft.is_dir() && meta.nlink() > 1).then(|| (meta.dev(), meta.ino()));

    let mut tail = String::new();
    if ft.is_file() {
        let mut file = File::open(path).map_err(io_err("open", path))?;
        let mut hasher = blake3::Hasher::new();
        hasher
            .update_reader(&mut file)
            .map_err(io_err("read", path))?;
        let _ = write!(tail, " b3={}", hasher.finalize().to_hex());
        if opts.holes {
            tail.push_str(" data=");
            write_data_ranges(&mut tail, &file, meta.size(), path)?;
        }
    }
    for (name, value) in xattrs(path)? {
        tail.push_str(" xattr:");
        escape_into(&mut tail, &name, true);
        tail.push('=');
        escape_into(&mut tail, &value, false);
    }
    Ok(Entry {
        rel,
        head,
        tail,
        link_key,
    })
}

/// Append the `data=` value: the file's data ranges from SEEK_DATA/SEEK_HOLE.
fn write_data_ranges(out: &mut String, file: &File, size: u64, path: &Path) -> Result<()> {
    let mut pos = 0u64;
    let mut first = true;
    while pos < size {
        let data = match rustix::fs::seek(file, SeekFrom::Data(pos)) {
            Ok(d) => d,
            // No data at or after `pos`: the rest is a hole.
            Err(Errno::NXIO) => break,
            Err(e) => return Err(errno_err("lseek(SEEK_DATA)", path)(e)),
        };
        let hole = rustix::fs::seek(file, SeekFrom::Hole(data))
            .map_err(errno_err("lseek(SEEK_HOLE)", path))?;
        if hole <= data {
            // SEEK_HOLE always finds the implicit hole at EOF, so this means
            // the file changed under us; stop rather than loop forever.
            break;
        }
        if !first {
            out.push(',');
        }
        first = false;
        let _ = write!(out, "{data}+{}", hole - data);
        pos = hole;
    }
    if first {
        out.push('-');
    }
    Ok(())
}

/// All xattrs of `path` (not following a symlink), sorted by name.
fn xattrs(path: &Path) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let names = loop {
        let len = match rustix::fs::llistxattr_query(path) {
            Ok(n) => n,
            // A filesystem without xattr support has none.
            Err(Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(errno_err("llistxattr", path)(e)),
        };
        if len == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; len];
        match rustix::fs::llistxattr(path, &mut buf[..]) {
            Ok(n) => {
                buf.truncate(n);
                break buf;
            }
            // The list grew between the two calls: ask again.
            Err(Errno::RANGE) => continue,
            Err(e) => return Err(errno_err("llistxattr", path)(e)),
        }
    };
    let mut out = Vec::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name_os = std::ffi::OsStr::from_bytes(name);
        let value = loop {
            let len =
                rustix::fs::lgetxattr_query(path, name_os).map_err(errno_err("lgetxattr", path))?;
            let mut buf = vec![0u8; len];
            if len == 0 {
                break buf;
            }
            match rustix::fs::lgetxattr(path, name_os, &mut buf[..]) {
                Ok(n) => {
                    buf.truncate(n);
                    break buf;
                }
                Err(Errno::RANGE) => continue,
                Err(e) => return Err(errno_err("lgetxattr", path)(e)),
            }
        };
        out.push((name.to_vec(), value));
    }
    out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Append `bytes` escaped as the format requires (see the module doc); with
/// `xattr_name`, `=` is escaped too.
fn escape_into(out: &mut String, bytes: &[u8], xattr_name: bool) {
    for &b in bytes {
        if (0x21..=0x7e).contains(&b) && b != b'\\' && !(xattr_name && b == b'=') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
}

/// Escape a byte string the way the manifest does (paths, targets, xattr
/// values); handy for building expected lines in tests.
pub fn escape(bytes: &[u8]) -> String {
    let mut s = String::new();
    escape_into(&mut s, bytes, false);
    s
}

/// Remove every `data=` field, for comparing manifests whose hole maps may
/// legitimately differ (e.g. a receiver that writes holes as zeros).
pub fn strip_holes(manifest: &str) -> String {
    let mut out = String::with_capacity(manifest.len());
    for line in manifest.lines() {
        let mut first = true;
        for field in line.split(' ') {
            if field.starts_with("data=") && !first {
                continue;
            }
            if !first {
                out.push(' ');
            }
            out.push_str(field);
            first = false;
        }
        out.push('\n');
    }
    out
}

/// Compare two manifests and describe how they differ, or `None` if they are
/// equal. The description lists up to `max` differences, path by path: lines
/// only in `expected` (`-`), only in `actual` (`+`), or changed (both, with
/// the differing fields named).
pub fn diff(expected: &str, actual: &str, max: usize) -> Option<String> {
    if expected == actual {
        return None;
    }
    // Index by the path field; both are sorted by raw path bytes, but the
    // escaped text sorts differently, so match by key instead of merging.
    let split = |text: &str| -> Vec<(String, String)> {
        text.lines()
            .map(|l| match l.split_once(' ') {
                Some((p, rest)) if !l.starts_with('#') => (p.to_owned(), rest.to_owned()),
                _ => (l.to_owned(), String::new()),
            })
            .collect()
    };
    let exp = split(expected);
    let act = split(actual);
    let act_map: HashMap<&str, &str> = act.iter().map(|(p, r)| (p.as_str(), r.as_str())).collect();
    let exp_map: HashMap<&str, &str> = exp.iter().map(|(p, r)| (p.as_str(), r.as_str())).collect();
    let mut report = Vec::new();
    for (p, rest) in &exp {
        match act_map.get(p.as_str()) {
            None => report.push(format!("- {p} {rest}")),
            Some(a) if a != rest => {
                let ef: Vec<&str> = rest.split(' ').collect();
                let af: Vec<&str> = a.split(' ').collect();
                let only_e: Vec<&str> = ef.iter().copied().filter(|f| !af.contains(f)).collect();
                let only_a: Vec<&str> = af.iter().copied().filter(|f| !ef.contains(f)).collect();
                report.push(format!(
                    "~ {p}: expected {} / actual {}",
                    only_e.join(" "),
                    only_a.join(" ")
                ));
            }
            Some(_) => {}
        }
    }
    for (p, rest) in &act {
        if !exp_map.contains_key(p.as_str()) {
            report.push(format!("+ {p} {rest}"));
        }
    }
    if report.is_empty() {
        // Same lines in another order or with duplicates.
        report.push("same lines, different order or duplicates".to_owned());
    }
    let total = report.len();
    let mut text = format!(
        "manifests differ in {total} path(s) (- expected only, + actual only, ~ changed):\n"
    );
    for r in report.iter().take(max) {
        text.push_str(r);
        text.push('\n');
    }
    if total > max {
        let _ = writeln!(text, "… and {} more", total - max);
    }
    Some(text)
}
