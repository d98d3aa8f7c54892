//! Manifests: one sorted text line per path of a directory tree, the yardstick
//! of every round trip (the kernel's mount of a snapshot versus what a
//! receiver made of its stream).
//!
//! This module reads a *mounted* tree through the kernel (lstat, xattrs,
//! SEEK_DATA/SEEK_HOLE, file contents); it sits outside the device → model →
//! send data flow and depends on none of it.
//!
//! # Format, version 2
//!
//! Stored manifests depend on this format; any change to it must bump the
//! version in the header line. Version 2 changed only the definition of
//! `b3=` (version 1 hashed every byte of the file, holes included, so a
//! file with a huge i_size took forever).
//!
//! ```text
//! # btrsend manifest v2
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
//!   * `b3=` the content hash of a regular file, 64 hex digits (see
//!     [Content hash](#content-hash));
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
//! ## Content hash
//!
//! `b3=` is the BLAKE3 hash of an encoding of the file's contents that
//! leaves out its zero blocks, so that a hole costs nothing to hash however
//! long it is, yet two files get the same hash exactly when their contents
//! (the bytes a read returns, holes reading as zeros) are equal, whether
//! their zeros are holes, preallocated extents or written zeros. The
//! contents of size `S` are cut into blocks of [`HASH_BLOCK`] (4096) bytes
//! at multiples of 4096, the last one shorter when `S` is not a multiple;
//! the hashed bytes are, for each block that holds a non-zero byte, in
//! file order, its index (offset / 4096) as a little-endian `u64` followed
//! by the block's bytes; then `S` as a little-endian `u64`. The encoding
//! determines the contents (`S` gives the length of the last block), so
//! equal hashes mean equal contents as much as BLAKE3 does.
//!
//! Only the data ranges are read (`SEEK_DATA`/`SEEK_HOLE` on a mounted
//! tree, the extent items with `--device`), each widened to whole blocks,
//! so the work is the file's data plus a constant per hole: a file of
//! 2^63 - 1 bytes with one block of data hashes as fast as that block.
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
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::SeekFrom;
use rustix::io::Errno;

/// The first line of every manifest; names the format version.
pub const HEADER: &str = "# btrsend manifest v2";

/// The block size of the content hash (`b3=`, see the module docs).
pub const HASH_BLOCK: u64 = 4096;

/// How much [`content_hash`] reads at a time: a multiple of [`HASH_BLOCK`].
const HASH_READ: usize = 256 * 1024;

/// The `b3=` value of contents held in memory.
pub fn content_hash_of(bytes: &[u8]) -> String {
    let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    let copy = |off: u64, buf: &mut [u8]| -> Result<(), std::convert::Infallible> {
        // OK: `content_hash` asks only for ranges below `size`.
        let start = usize::try_from(off).unwrap_or(usize::MAX);
        buf.copy_from_slice(&bytes[start..start + buf.len()]);
        Ok(())
    };
    match content_hash(size, [(0, size)], copy) {
        Ok(h) => h,
        Err(never) => match never {},
    }
}

/// The `b3=` value (64 hex digits) of a file of `size` bytes whose data
/// lies in `data` (`(offset, length)` ranges in ascending order; the rest
/// reads as zeros), reading with `read(offset, buf)`, which must fill
/// `buf` with the file's bytes at `offset` (never past `size`).
///
/// Each range is widened to whole [`HASH_BLOCK`]s and read once; blocks of
/// zeros are skipped. Ranges may overlap or reach past `size`.
///
/// # Errors
///
/// The first error of `read`.
pub fn content_hash<E>(
    size: u64,
    data: impl IntoIterator<Item = (u64, u64)>,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<(), E>,
) -> Result<String, E> {
    let mut hasher = blake3::Hasher::new();
    let mut buf: Vec<u8> = Vec::new();
    // Every block below `next` is hashed (or known to be zero).
    let mut next = 0u64;
    for (off, len) in data {
        let end = off.saturating_add(len).min(size);
        let start = (off - off % HASH_BLOCK).max(next);
        if start >= end {
            continue;
        }
        let end = end
            .div_ceil(HASH_BLOCK)
            .saturating_mul(HASH_BLOCK)
            .min(size);
        if buf.is_empty() {
            buf = vec![0u8; HASH_READ];
        }
        let mut pos = start;
        while pos < end {
            let n = usize::try_from(end - pos).map_or(HASH_READ, |n| n.min(HASH_READ));
            let piece = &mut buf[..n];
            read(pos, piece)?;
            for (index, block) in (pos / HASH_BLOCK..).zip(piece.chunks(HASH_BLOCK as usize)) {
                if block.iter().any(|&b| b != 0) {
                    hasher.update(&index.to_le_bytes());
                    hasher.update(block);
                }
            }
            pos += n as u64;
        }
        next = end;
    }
    hasher.update(&size.to_le_bytes());
    Ok(hasher.finalize().to_hex().to_string())
}

/// [`content_hash`] of contents fed in pieces, in ascending offsets, as
/// they are read for another purpose (a synthetic full stream hashes each
/// file's data as it writes it, so its proof costs no second read).
/// Offsets not fed read as zeros; bytes at or past the size are ignored.
#[derive(Debug)]
pub struct ContentHasher {
    hasher: blake3::Hasher,
    size: u64,
    /// The block being filled and its index (`None`: none yet).
    block: Vec<u8>,
    index: Option<u64>,
}

impl ContentHasher {
    /// The hasher of a file of `size` bytes.
    pub fn new(size: u64) -> ContentHasher {
        ContentHasher {
            hasher: blake3::Hasher::new(),
            size,
            block: vec![0u8; HASH_BLOCK as usize],
            index: None,
        }
    }

    /// The file's bytes at `offset` (at or after the end of what was fed
    /// before).
    pub fn feed(&mut self, mut offset: u64, mut bytes: &[u8]) {
        let room = self.size.saturating_sub(offset);
        bytes = &bytes[..usize::try_from(room).map_or(bytes.len(), |r| r.min(bytes.len()))];
        while !bytes.is_empty() {
            let index = offset / HASH_BLOCK;
            let within = (offset % HASH_BLOCK) as usize;
            let n = (HASH_BLOCK as usize - within).min(bytes.len());
            if self.index != Some(index) {
                self.flush();
                if within == 0 && n == HASH_BLOCK as usize {
                    // A whole block: hashed from where it lies.
                    self.hash_block(index, &bytes[..n]);
                    offset += n as u64;
                    bytes = &bytes[n..];
                    continue;
                }
                self.index = Some(index);
            }
            self.block[within..within + n].copy_from_slice(&bytes[..n]);
            offset += n as u64;
            bytes = &bytes[n..];
        }
    }

    fn hash_block(&mut self, index: u64, block: &[u8]) {
        let len = self
            .size
            .saturating_sub(index.saturating_mul(HASH_BLOCK))
            .min(HASH_BLOCK) as usize;
        let block = &block[..len.min(block.len())];
        if block.iter().any(|&b| b != 0) {
            self.hasher.update(&index.to_le_bytes());
            self.hasher.update(block);
        }
    }

    fn flush(&mut self) {
        if let Some(index) = self.index.take() {
            let block = std::mem::take(&mut self.block);
            self.hash_block(index, &block);
            self.block = block;
            self.block.fill(0);
        }
    }

    /// The `b3=` value.
    pub fn finish(mut self) -> String {
        self.flush();
        self.hasher.update(&self.size.to_le_bytes());
        self.hasher.finalize().to_hex().to_string()
    }
}

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
    write_entries(entries, out)
}

/// What a manifest records of one path, wherever it was read from (the
/// kernel's mount here; a backup index elsewhere).
#[derive(Debug, Clone, Default)]
pub struct Described {
    /// Relative path, raw bytes; empty for the root.
    pub rel: Vec<u8>,
    /// The type as the format names it (`file`, `dir`, …; `subvol` gets no
    /// further fields).
    pub kind: &'static str,
    /// `mode & 0o7777`.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size (recorded for files and symlinks only).
    pub size: u64,
    /// `st_mtime` and `st_mtime_nsec`.
    pub mtime: (i64, i64),
    /// A symlink's target.
    pub target: Option<Vec<u8>>,
    /// A device's major and minor numbers.
    pub rdev: Option<(u32, u32)>,
    /// Which inode a non-directory with several links is (any key unique
    /// per inode).
    pub link_key: Option<(u64, u64)>,
    /// A regular file's content hash ([`content_hash`]).
    pub b3: Option<String>,
    /// A regular file's data ranges (with [`Options::holes`]).
    pub data: Option<Vec<(u64, u64)>>,
    /// Extended attributes, sorted by name.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Described {
    fn into_entry(self) -> Entry {
        if self.kind == "subvol" {
            return Entry {
                rel: self.rel,
                head: "subvol".to_owned(),
                tail: String::new(),
                link_key: None,
            };
        }
        let mut head = String::with_capacity(96);
        // Writing to a String cannot fail.
        let _ = write!(
            head,
            "{} mode={:04o} uid={} gid={}",
            self.kind, self.mode, self.uid, self.gid
        );
        if self.kind == "file" || self.kind == "symlink" {
            let _ = write!(head, " size={}", self.size);
        }
        let _ = write!(head, " mtime={}.{:09}", self.mtime.0, self.mtime.1);
        if let Some(target) = &self.target {
            head.push_str(" target=");
            escape_into(&mut head, target, false);
        }
        if let Some((major, minor)) = self.rdev {
            let _ = write!(head, " rdev={major}:{minor}");
        }
        let mut tail = String::new();
        if let Some(b3) = &self.b3 {
            let _ = write!(tail, " b3={b3}");
        }
        if let Some(ranges) = &self.data {
            tail.push_str(" data=");
            if ranges.is_empty() {
                tail.push('-');
            }
            for (i, (off, len)) in ranges.iter().enumerate() {
                if i > 0 {
                    tail.push(',');
                }
                let _ = write!(tail, "{off}+{len}");
            }
        }
        for (name, value) in &self.xattrs {
            tail.push_str(" xattr:");
            escape_into(&mut tail, name, true);
            tail.push('=');
            escape_into(&mut tail, value, false);
        }
        Entry {
            rel: self.rel,
            head,
            tail,
            link_key: self.link_key,
        }
    }
}

/// Write the manifest of the paths `described` (in any order).
///
/// # Errors
///
/// A write error.
pub fn write_described(described: Vec<Described>, out: &mut dyn Write) -> Result<()> {
    write_entries(
        described.into_iter().map(Described::into_entry).collect(),
        out,
    )
}

fn write_entries(mut entries: Vec<Entry>, out: &mut dyn Write) -> Result<()> {
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
    let mut d = Described {
        rel,
        kind,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        size: meta.size(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        link_key: (!ft.is_dir() && meta.nlink() > 1).then(|| (meta.dev(), meta.ino())),
        ..Described::default()
    };
    if ft.is_symlink() {
        let target = fs::read_link(path).map_err(io_err("readlink", path))?;
        d.target = Some(target.into_os_string().into_vec());
    }
    if ft.is_char_device() || ft.is_block_device() {
        let rdev = meta.rdev();
        d.rdev = Some((rustix::fs::major(rdev), rustix::fs::minor(rdev)));
    }
    if ft.is_file() {
        let file = File::open(path).map_err(io_err("open", path))?;
        let size = meta.size();
        let ranges = data_ranges(&file, size, path)?;
        d.b3 = Some(content_hash(size, ranges.iter().copied(), |off, buf| {
            file.read_exact_at(buf, off).map_err(io_err("read", path))
        })?);
        if opts.holes {
            d.data = Some(ranges);
        }
    }
    d.xattrs = xattrs(path)?;
    Ok(d.into_entry())
}

/// The file's data ranges `(offset, length)` from SEEK_DATA/SEEK_HOLE (the
/// `data=` value): one pair of seeks per range, whatever the holes' sizes.
fn data_ranges(file: &File, size: u64, path: &Path) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut pos = 0u64;
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
        out.push((data, hole.min(size).saturating_sub(data)));
        pos = hole;
    }
    out.retain(|&(_, len)| len > 0);
    Ok(out)
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

#[cfg(test)]
mod tests {
    //! Expected lines are written by hand from what each test created: the
    //! bytes it wrote (hashed with the blake3 crate directly), the modes,
    //! owners and times it set, and for symlink times GNU `touch`.

    use std::fs::{self, File, FileTimes};
    use std::io::{Seek, SeekFrom, Write as _};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{PermissionsExt, lchown};
    use std::path::Path;
    use std::process::Command;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use rustix::fs::{FileType, Mode, XattrFlags};

    use super::*;

    /// `b3=` as the module docs define it, written out directly: the
    /// index and bytes of each 4096-byte block that is not all zeros, then
    /// the size.
    fn b3(bytes: &[u8]) -> String {
        let mut h = blake3::Hasher::new();
        for (i, block) in bytes.chunks(4096).enumerate() {
            if block.iter().any(|&b| b != 0) {
                h.update(&(i as u64).to_le_bytes());
                h.update(block);
            }
        }
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.finalize().to_hex().to_string()
    }

    fn set_mtime(path: &Path, t: SystemTime) {
        // futimens works on a read-only descriptor (we own the file), which
        // also covers directories.
        let f = File::open(path).unwrap();
        f.set_times(FileTimes::new().set_modified(t).set_accessed(t))
            .unwrap();
    }

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Owner the test can give files: 1000:1000 as root, else our own ids.
    fn owner() -> (u32, u32) {
        if rustix::process::geteuid().is_root() {
            (1000, 1000)
        } else {
            (
                rustix::process::geteuid().as_raw(),
                rustix::process::getegid().as_raw(),
            )
        }
    }

    fn own(path: &Path) {
        let (u, g) = owner();
        lchown(path, Some(u), Some(g)).unwrap();
    }

    /// Whether the filesystem at `dir` stores holes (a 1 MiB file truncated
    /// from nothing occupies no blocks), according to `stat`.
    fn fs_has_holes(dir: &Path) -> bool {
        let p = dir.join("probe");
        File::create(&p).unwrap().set_len(1 << 20).unwrap();
        let out = Command::new("stat").arg("-c%b").arg(&p).output().unwrap();
        fs::remove_file(&p).unwrap();
        String::from_utf8(out.stdout).unwrap().trim() == "0"
    }

    fn xattr_supported(dir: &Path) -> bool {
        let p = dir.join("probe");
        File::create(&p).unwrap();
        let ok = rustix::fs::lsetxattr(&p, "user.probe", b"", XattrFlags::empty()).is_ok();
        fs::remove_file(&p).unwrap();
        ok
    }

    /// The pieces hasher agrees with [`content_hash`] over random
    /// contents with holes, fed in random pieces.
    #[test]
    fn content_hasher_agrees_with_content_hash() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for _ in 0..200 {
            let size = rnd(5 * HASH_BLOCK) + rnd(2);
            let mut bytes = vec![0u8; size as usize];
            let mut ranges = Vec::new();
            let mut at = rnd(HASH_BLOCK + 1);
            while at < size + 10 {
                let len = 1 + rnd(3 * HASH_BLOCK);
                ranges.push((at, len));
                for b in &mut bytes[(at.min(size) as usize)..((at + len).min(size) as usize)] {
                    // Zeros inside data too: written zeros hash as holes.
                    *b = rnd(3) as u8;
                }
                at += len + rnd(2 * HASH_BLOCK);
            }
            let mut h = ContentHasher::new(size);
            for &(off, len) in &ranges {
                let end = (off + len).min(size);
                let mut pos = off;
                while pos < end {
                    let n = (1 + rnd(HASH_BLOCK + 100)).min(end - pos);
                    h.feed(pos, &bytes[pos as usize..(pos + n) as usize]);
                    pos += n;
                }
            }
            let want = content_hash(size, ranges.iter().copied(), |off, buf| {
                buf.copy_from_slice(&bytes[off as usize..off as usize + buf.len()]);
                Ok::<(), ()>(())
            })
            .unwrap();
            assert_eq!(h.finish(), want, "size {size} ranges {ranges:?}");
        }
    }

    #[test]
    fn tree_with_every_kind_of_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        fs::create_dir(&root).unwrap();
        let (uid, gid) = owner();
        let t = UNIX_EPOCH + Duration::new(1_704_164_645, 123_456_789);

        // d/f: 6 known bytes, setuid mode, two xattrs incl. binary and empty.
        fs::create_dir(root.join("d")).unwrap();
        let f = root.join("d/f");
        fs::write(&f, b"hello\n").unwrap();
        own(&f);
        chmod(&f, 0o4751);
        let xattrs = xattr_supported(tmp.path());
        if xattrs {
            rustix::fs::lsetxattr(&f, "user.bin", b"\0\x01\xff= \\", XattrFlags::empty()).unwrap();
            rustix::fs::lsetxattr(&f, "user.empty", b"", XattrFlags::empty()).unwrap();
            rustix::fs::lsetxattr(&f, "user.a=b", b"text", XattrFlags::empty()).unwrap();
        }
        set_mtime(&f, t);
        // h: a hard link to d/f (sorts after it, so the group is named d/f).
        fs::hard_link(&f, root.join("h")).unwrap();

        // A symlink to d/f and a dangling one with odd bytes in name and target.
        std::os::unix::fs::symlink("d/f", root.join("s")).unwrap();
        let odd_name = std::ffi::OsStr::from_bytes(b"l\n\t \\\xff");
        let odd_target = std::ffi::OsStr::from_bytes(b"no where\x01");
        std::os::unix::fs::symlink(odd_target, root.join(odd_name)).unwrap();
        own(&root.join(odd_name));
        for link in [root.join("s"), root.join(odd_name)] {
            let st = Command::new("touch")
                .args(["-h", "-d", "@1000000000.25"])
                .arg(&link)
                .status()
                .unwrap();
            assert!(st.success());
        }

        // p: a fifo, sticky + setgid.
        let p = root.join("p");
        rustix::fs::mknodat(rustix::fs::CWD, &p, FileType::Fifo, Mode::from(0o600), 0).unwrap();
        chmod(&p, 0o3640);
        set_mtime_path(&p, "@7");

        // old: mtime half a second before the epoch.
        let old = root.join("old");
        fs::write(&old, b"").unwrap();
        chmod(&old, 0o644);
        set_mtime(&old, UNIX_EPOCH - Duration::from_millis(500));

        // sp: 1 MiB with 4 KiB of data at 64 KiB, the rest a hole.
        let sp = root.join("sp");
        let mut file = File::create(&sp).unwrap();
        file.set_len(1 << 20).unwrap();
        file.seek(SeekFrom::Start(65536)).unwrap();
        let block: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8 + 1).collect();
        file.write_all(&block).unwrap();
        file.sync_all().unwrap();
        drop(file);
        chmod(&sp, 0o600);
        set_mtime(&sp, t);
        let mut sp_bytes = vec![0u8; 1 << 20];
        sp_bytes[65536..65536 + 4096].copy_from_slice(&block);

        chmod(&root.join("d"), 0o750);
        set_mtime(&root.join("d"), t);
        chmod(&root, 0o755);
        set_mtime(&root, UNIX_EPOCH + Duration::new(1, 5));

        let xa = if xattrs {
            r" xattr:user.a\x3db=text xattr:user.bin=\x00\x01\xff=\x20\x5c xattr:user.empty="
        } else {
            ""
        };
        let sp_data = if fs_has_holes(tmp.path()) {
            "65536+4096".to_owned()
        } else {
            format!("0+{}", 1 << 20)
        };
        let hello = b3(b"hello\n");
        let expected = format!(
            "# btrsend manifest v2\n\
             . dir mode=0755 uid={ruid} gid={rgid} mtime=1.000000005\n\
             d dir mode=0750 uid={ruid} gid={rgid} mtime=1704164645.123456789\n\
             d/f file mode=4751 uid={uid} gid={gid} size=6 mtime=1704164645.123456789 link=d/f b3={hello} data=0+6{xa}\n\
             h file mode=4751 uid={uid} gid={gid} size=6 mtime=1704164645.123456789 link=d/f b3={hello} data=0+6{xa}\n\
             l\\x0a\\x09\\x20\\x5c\\xff symlink mode=0777 uid={uid} gid={gid} size=9 mtime=1000000000.250000000 target=no\\x20where\\x01\n\
             old file mode=0644 uid={ruid} gid={rgid} size=0 mtime=-1.500000000 b3={empty} data=-\n\
             p fifo mode=3640 uid={ruid} gid={rgid} mtime=7.000000000\n\
             s symlink mode=0777 uid={ruid} gid={rgid} size=3 mtime=1000000000.250000000 target=d/f\n\
             sp file mode=0600 uid={ruid} gid={rgid} size=1048576 mtime=1704164645.123456789 b3={sp} data={sp_data}\n",
            ruid = rustix::process::geteuid().as_raw(),
            rgid = rustix::process::getegid().as_raw(),
            empty = b3(b""),
            sp = b3(&sp_bytes),
        );
        let got = manifest(&root, Options { holes: true }).unwrap();
        assert_eq!(got, expected);

        // Without --holes the data= fields are absent, exactly as strip_holes
        // removes them.
        let plain = manifest(&root, Options::default()).unwrap();
        assert!(!plain.contains(" data="));
        assert_eq!(plain, strip_holes(&expected));
    }

    /// The content hash streams the blocks of its data ranges: whatever the
    /// ranges (unaligned, overlapping, past the size, none), it equals the
    /// definition applied to the whole contents, and zeros in data equal a
    /// hole.
    #[test]
    fn content_hash_matches_the_definition() {
        let mut bytes = vec![0u8; 3 * 4096 + 1000];
        bytes[10] = 1;
        bytes[2 * 4096 + 5] = 2;
        bytes[3 * 4096 + 999] = 3;
        let read = |off: u64, buf: &mut [u8]| -> Result<(), ()> {
            let off = off as usize;
            assert!(off.is_multiple_of(4096), "reads start at block boundaries");
            buf.copy_from_slice(&bytes[off..off + buf.len()]);
            Ok(())
        };
        let size = bytes.len() as u64;
        let want = b3(&bytes);
        for ranges in [
            vec![(0, size)],
            vec![(0, 11), (8197, 1), (12287, 2000)],
            vec![(5, 3), (0, 4096), (8192, 8192), (8192, 1 << 40)],
            vec![(10, 1), (8197, 1), (13287, 1)],
        ] {
            assert_eq!(
                content_hash(size, ranges.clone(), read).unwrap(),
                want,
                "{ranges:?}"
            );
        }
        // A range that misses data loses it: the ranges are trusted.
        assert_ne!(content_hash(size, [(0, 4096)], read).unwrap(), want);
        // All zeros: only the size is hashed, however the zeros are held.
        let zeros = vec![0u8; 50_000];
        assert_eq!(content_hash_of(&zeros), b3(&zeros));
        assert_eq!(content_hash(50_000, [], read).unwrap(), b3(&zeros));
        assert_ne!(content_hash_of(&zeros), content_hash_of(&zeros[..49_999]));
        // A huge size with no data costs nothing.
        let huge = content_hash(i64::MAX as u64, [], read).unwrap();
        let mut h = blake3::Hasher::new();
        h.update(&(i64::MAX as u64).to_le_bytes());
        assert_eq!(huge, h.finalize().to_hex().to_string());
    }

    #[test]
    fn sorted_by_raw_bytes_root_first() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        // '!' (0x21) and '-' (0x2d) sort before '.', '/' (0x2f) after '-'.
        for name in ["a", "a-c", "!x", "z"] {
            fs::create_dir(root.join(name)).unwrap();
        }
        fs::create_dir(root.join("a/b")).unwrap();
        let got = manifest(root, Options::default()).unwrap();
        let paths: Vec<&str> = got
            .lines()
            .skip(1)
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        assert_eq!(paths, [".", "!x", "a", "a-c", "a/b", "z"]);
        assert_eq!(got.lines().next(), Some(HEADER));
    }

    #[test]
    fn devices_and_sockets_as_root() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("=== SKIPPED devices_and_sockets_as_root: needs root to mknod ===");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let dev = |maj, min| rustix::fs::makedev(maj, min);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("c"),
            FileType::CharacterDevice,
            Mode::from(0o600),
            dev(1, 7),
        )
        .unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("b"),
            FileType::BlockDevice,
            Mode::from(0o600),
            dev(7, 200),
        )
        .unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("so"),
            FileType::Socket,
            Mode::from(0o600),
            0,
        )
        .unwrap();
        for n in ["b", "c", "so"] {
            chmod(&root.join(n), 0o640);
            set_mtime_path(&root.join(n), "@9");
        }
        let got = manifest(root, Options { holes: true }).unwrap();
        let lines: Vec<&str> = got.lines().skip(2).collect();
        assert_eq!(
            lines,
            [
                "b blk mode=0640 uid=0 gid=0 mtime=9.000000000 rdev=7:200",
                "c chr mode=0640 uid=0 gid=0 mtime=9.000000000 rdev=1:7",
                "so sock mode=0640 uid=0 gid=0 mtime=9.000000000",
            ]
        );
    }

    /// Set the mtime of a special file (opening a fifo would block) with GNU
    /// touch.
    fn set_mtime_path(path: &Path, when: &str) {
        let st = Command::new("touch")
            .args(["-h", "-d", when])
            .arg(path)
            .status()
            .unwrap();
        assert!(st.success());
    }

    #[test]
    fn errors_name_the_path() {
        let err = manifest(Path::new("/nonexistent/btrsend-x"), Options::default()).unwrap_err();
        assert_eq!(err.to_string(), "lstat failed on /nonexistent/btrsend-x");
    }

    #[test]
    fn strip_holes_removes_only_data_fields() {
        let m = "# btrsend manifest v1\n. dir mode=0755 uid=0 gid=0 mtime=1.000000000\n\
                 data=x file mode=0644 uid=0 gid=0 size=1 mtime=1.000000000 b3=ab data=0+1 xattr:user.k=data=1\n";
        assert_eq!(
            strip_holes(m),
            "# btrsend manifest v1\n. dir mode=0755 uid=0 gid=0 mtime=1.000000000\n\
             data=x file mode=0644 uid=0 gid=0 size=1 mtime=1.000000000 b3=ab xattr:user.k=data=1\n"
        );
    }

    #[test]
    fn diff_reports_missing_extra_and_changed() {
        let a = "# btrsend manifest v1\n. dir mode=0755\nf file size=1 b3=aa\ng file size=2\n";
        assert_eq!(diff(a, a, 10), None);
        let b = "# btrsend manifest v1\n. dir mode=0755\nf file size=1 b3=bb\nh file size=3\n";
        assert_eq!(
            diff(a, b, 10).unwrap(),
            "manifests differ in 3 path(s) (- expected only, + actual only, ~ changed):\n\
             ~ f: expected b3=aa / actual b3=bb\n\
             - g file size=2\n\
             + h file size=3\n"
        );
        let short = diff(a, b, 1).unwrap();
        assert!(
            short.ends_with("~ f: expected b3=aa / actual b3=bb\n… and 2 more\n"),
            "{short}"
        );
        // A different header is reported too.
        let c = a.replace("v1", "v2");
        assert!(diff(a, &c, 10).unwrap().contains("- # btrsend manifest v1"));
    }
}
