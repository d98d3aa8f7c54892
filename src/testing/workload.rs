//! A seeded random workload in the manner of fstests' `fsstress`: a
//! deterministic sequence of file-system operations applied to a directory
//! tree (normally a btrfs subvolume between two snapshots), for the
//! random-workload tests of incremental send.
//!
//! The same seed applied to the same starting tree on the same kernel gives
//! the same operations: every choice comes from [`Rng`] (SplitMix64) and
//! the entries to choose from are listed in sorted order. An operation the
//! kernel refuses (renaming a directory into itself, removing a non-empty
//! directory, …) is logged as refused and changes nothing, which is just as
//! deterministic.
//!
//! The operations cover what incremental send has to express: create,
//! write, append, truncate (grow and shrink), punch hole, fallocate (with
//! and without `KEEP_SIZE`), reflink (whole files with `FICLONE`, ranges
//! with `xfs_io -c reflink` when `xfs_io` is installed), hard links,
//! unlink, renames of files and directories across directories and over
//! existing names, exchanges (`RENAME_EXCHANGE`), swaps through a
//! temporary name, inversions (a directory moved under its former child),
//! mkdir, rmdir and recursive removal, symlinks, fifos, xattrs set and
//! removed, chmod, chown and utimes. Names come from a small pool, so names
//! are reused and replaced often; a few look like the sender's orphan names
//! (`o<ino>-<gen>-<n>`) to test their uniqueness rule.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::fs::{AtFlags, CWD, FallocateFlags, Mode, RenameFlags, Timespec, Timestamps};

/// SplitMix64: a tiny, well-mixed, seedable generator (Steele, Lea and
/// Flood 2014), enough for choosing operations.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x6a09_e667_f3bc_c908)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`0` if `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A random element of `items`, `None` if it is empty.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        let n = u64::try_from(items.len()).ok()?;
        items.get(usize::try_from(self.below(n)).ok()?)
    }

    /// `len` random bytes; compressible (runs of one byte) with
    /// `compressible`.
    pub fn bytes(&mut self, len: usize, compressible: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        if compressible {
            while out.len() < len {
                let b = self.next_u64().to_le_bytes()[0];
                let run = usize::try_from(self.below(512)).unwrap_or(0) + 1;
                out.extend(std::iter::repeat_n(b, run.min(len - out.len())));
            }
        } else {
            while out.len() < len {
                let w = self.next_u64().to_le_bytes();
                out.extend_from_slice(&w[..w.len().min(len - out.len())]);
            }
        }
        out
    }
}

/// The type of an entry of the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// An entry: its path relative to the root and its type.
#[derive(Debug, Clone)]
struct Entry {
    rel: PathBuf,
    kind: Kind,
}

/// Names are drawn from this pool (plus a few long and orphan-like ones),
/// so that names collide and get replaced.
const NAMES: &[&str] = &["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"];

/// Deepest directory level the workload creates or moves into.
const MAX_DEPTH: usize = 6;

/// Largest file offset the workload writes at.
const MAX_OFFSET: u64 = 1 << 20;

/// A random workload on the tree under `root` (see the module doc).
#[derive(Debug)]
pub struct Workload {
    root: PathBuf,
    rng: Rng,
    log: Vec<String>,
    xfs_io: bool,
    rename_heavy: bool,
}

impl Workload {
    /// A workload for the tree under `root`, seeded with `seed`.
    pub fn new(root: &Path, seed: u64) -> Workload {
        let xfs_io = Command::new("xfs_io")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        Workload {
            root: root.to_path_buf(),
            rng: Rng::new(seed),
            log: Vec::new(),
            xfs_io,
            rename_heavy: false,
        }
    }

    /// Favour directory operations (mkdir, renames, exchanges, swaps,
    /// inversions) over data operations: deep reorganisations of the tree,
    /// where delayed directory moves and orphans come from.
    #[must_use]
    pub fn rename_heavy(mut self, on: bool) -> Workload {
        self.rename_heavy = on;
        self
    }

    /// The operations applied so far, one line each, refused ones marked.
    pub fn log(&self) -> &[String] {
        &self.log
    }

    /// Append a line to the log (e.g. a snapshot taken between runs).
    pub fn note(&mut self, line: impl Into<String>) {
        self.log.push(line.into());
    }

    /// The generator, for choices the caller makes (e.g. whether to
    /// remount between runs), so they too follow the seed.
    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    /// Build a starting tree: `n` operations biased towards creation.
    ///
    /// # Errors
    ///
    /// An I/O error that is not a refusal of one operation (the tree
    /// cannot be listed, `xfs_io` cannot be started).
    pub fn populate(&mut self, n: usize) -> io::Result<()> {
        for _ in 0..n {
            let op = match self.rng.below(10) {
                0..=3 => Op::Create,
                4..=6 => Op::Mkdir,
                7 => Op::Link,
                8 => Op::Symlink,
                _ => Op::Xattr,
            };
            self.apply(op)?;
        }
        Ok(())
    }

    /// Apply `n` random operations.
    ///
    /// # Errors
    ///
    /// As [`populate`](Self::populate).
    pub fn run(&mut self, n: usize) -> io::Result<()> {
        for _ in 0..n {
            let op = Op::random(&mut self.rng, self.rename_heavy);
            self.apply(op)?;
        }
        Ok(())
    }

    /// Every entry under the root, sorted by path.
    fn entries(&self) -> io::Result<Vec<Entry>> {
        let mut out = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let mut names: Vec<_> = fs::read_dir(self.root.join(&rel))?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<io::Result<_>>()?;
            names.sort();
            for name in names {
                let child = rel.join(&name);
                let ft = fs::symlink_metadata(self.root.join(&child))?.file_type();
                let kind = if ft.is_dir() {
                    Kind::Dir
                } else if ft.is_file() {
                    Kind::File
                } else if ft.is_symlink() {
                    Kind::Symlink
                } else {
                    Kind::Other
                };
                if kind == Kind::Dir {
                    stack.push(child.clone());
                }
                out.push(Entry { rel: child, kind });
            }
        }
        out.sort_by(|a, b| a.rel.cmp(&b.rel));
        Ok(out)
    }

    fn pick_kind(&mut self, all: &[Entry], kind: Option<Kind>) -> Option<Entry> {
        let list: Vec<&Entry> = all
            .iter()
            .filter(|e| kind.is_none_or(|k| e.kind == k))
            .collect();
        self.rng.pick(&list).map(|e| (*e).clone())
    }

    /// A directory (the root is `""`), shallow enough to receive entries.
    fn pick_dir(&mut self, all: &[Entry]) -> PathBuf {
        let mut dirs = vec![PathBuf::new()];
        dirs.extend(
            all.iter()
                .filter(|e| e.kind == Kind::Dir && e.rel.components().count() < MAX_DEPTH)
                .map(|e| e.rel.clone()),
        );
        // The root is picked more often: that is where orphans live.
        if self.rng.chance(25) {
            return PathBuf::new();
        }
        self.rng.pick(&dirs).cloned().unwrap_or_default()
    }

    fn pick_name(&mut self) -> String {
        match self.rng.below(40) {
            0 => format!(
                "o{}-{}-{}",
                256 + self.rng.below(48),
                5 + self.rng.below(20),
                self.rng.below(2)
            ),
            1 => format!(
                "long{}",
                "L".repeat(60 + usize::try_from(self.rng.below(60)).unwrap_or(0))
            ),
            _ => {
                let n = self.rng.pick(NAMES).copied().unwrap_or("a").to_owned();
                if self.rng.chance(20) {
                    format!("{n}{}", self.rng.below(4))
                } else {
                    n
                }
            }
        }
    }

    /// A path for a new entry: a random directory and name.
    fn new_path(&mut self, all: &[Entry]) -> PathBuf {
        let dir = self.pick_dir(all);
        dir.join(self.pick_name())
    }

    fn abs(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }

    fn record(&mut self, what: String, r: io::Result<()>) {
        match r {
            Ok(()) => self.log.push(what),
            Err(e) => self.log.push(format!("{what}  # refused: {e}")),
        }
    }

    /// Open a regular file for writing (creating it with `create`); never
    /// follows a symlink nor blocks on a fifo that took the name.
    fn open_write(&self, rel: &Path, create: bool) -> io::Result<File> {
        let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
        let f = OpenOptions::new()
            .write(true)
            .create(create)
            .truncate(false)
            .custom_flags(i32::try_from(flags.bits()).unwrap_or(0))
            .open(self.abs(rel))?;
        if !f.metadata()?.is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        Ok(f)
    }

    fn write_at(&mut self, rel: &Path, offset: u64, len: usize) -> io::Result<()> {
        let compressible = self.rng.chance(50);
        let data = self.rng.bytes(len, compressible);
        self.open_write(rel, false)?.write_all_at(&data, offset)
    }

    /// A length for a write: small (inline-sized), page-ish or large.
    fn data_len(&mut self) -> usize {
        let n = match self.rng.below(4) {
            0 => 1 + self.rng.below(3000),
            1 => 1 + self.rng.below(16384),
            2 => 4096 * (1 + self.rng.below(8)),
            _ => 1 + self.rng.below(200_000),
        };
        usize::try_from(n).unwrap_or(4096)
    }

    /// An offset: page aligned or not, inside or past the file.
    fn offset(&mut self, size: u64) -> u64 {
        let limit = (size + 65536).min(MAX_OFFSET);
        let o = self.rng.below(limit);
        if self.rng.chance(50) { o & !4095 } else { o }
    }

    fn size_of(&self, rel: &Path) -> u64 {
        fs::symlink_metadata(self.abs(rel)).map_or(0, |m| m.len())
    }

    fn apply(&mut self, op: Op) -> io::Result<()> {
        let all = self.entries()?;
        match op {
            Op::Create => {
                let rel = self.new_path(&all);
                let len = match self.rng.below(4) {
                    0 => 0,
                    1 => 1 + self.rng.below(2000),
                    _ => u64::try_from(self.data_len()).unwrap_or(0),
                };
                let r = File::create_new(self.abs(&rel)).map(drop).and_then(|()| {
                    if len > 0 {
                        self.write_at(&rel, 0, usize::try_from(len).unwrap_or(0))
                    } else {
                        Ok(())
                    }
                });
                self.record(format!("create {} len={len}", rel.display()), r);
            }
            Op::Mkdir => {
                let rel = self.new_path(&all);
                let r = fs::create_dir(self.abs(&rel));
                self.record(format!("mkdir {}", rel.display()), r);
            }
            Op::Write | Op::Append => {
                let Some(e) = self.pick_kind(&all, Some(Kind::File)) else {
                    return Ok(());
                };
                let size = self.size_of(&e.rel);
                let off = if op == Op::Append {
                    size
                } else {
                    self.offset(size)
                };
                let len = self.data_len();
                let r = self.write_at(&e.rel, off, len);
                self.record(format!("write {} off={off} len={len}", e.rel.display()), r);
            }
            Op::Truncate => {
                let Some(e) = self.pick_kind(&all, Some(Kind::File)) else {
                    return Ok(());
                };
                let size = self.size_of(&e.rel);
                let new = if self.rng.chance(50) {
                    self.rng.below(size + 1)
                } else {
                    size + self.rng.below(300_000)
                };
                let r = self.open_write(&e.rel, false).and_then(|f| f.set_len(new));
                self.record(format!("truncate {} {size}->{new}", e.rel.display()), r);
            }
            Op::Punch | Op::Fallocate => {
                let Some(e) = self.pick_kind(&all, Some(Kind::File)) else {
                    return Ok(());
                };
                let size = self.size_of(&e.rel);
                let off = self.offset(size);
                let len = u64::try_from(self.data_len()).unwrap_or(4096);
                let (mode, what) = if op == Op::Punch {
                    (
                        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
                        "punch",
                    )
                } else if self.rng.chance(50) {
                    (FallocateFlags::KEEP_SIZE, "fallocate-keep-size")
                } else {
                    (FallocateFlags::empty(), "fallocate")
                };
                let r = self
                    .open_write(&e.rel, false)
                    .and_then(|f| Ok(rustix::fs::fallocate(&f, mode, off, len)?));
                self.record(format!("{what} {} off={off} len={len}", e.rel.display()), r);
            }
            Op::Reflink => {
                let Some(src) = self.pick_kind(&all, Some(Kind::File)) else {
                    return Ok(());
                };
                let dst = if self.rng.chance(50) {
                    self.pick_kind(&all, Some(Kind::File))
                        .map_or_else(|| self.new_path(&all), |e| e.rel)
                } else {
                    self.new_path(&all)
                };
                let r = File::open(self.abs(&src.rel)).and_then(|s| {
                    let d = self.open_write(&dst, true)?;
                    Ok(rustix::fs::ioctl_ficlone(&d, &s)?)
                });
                self.record(
                    format!("reflink {} -> {}", src.rel.display(), dst.display()),
                    r,
                );
            }
            Op::ReflinkRange => {
                if !self.xfs_io {
                    return self.apply(Op::Reflink);
                }
                let Some(src) = self.pick_kind(&all, Some(Kind::File)) else {
                    return Ok(());
                };
                let dst = if self.rng.chance(30) {
                    src.clone()
                } else {
                    self.pick_kind(&all, Some(Kind::File))
                        .unwrap_or_else(|| src.clone())
                };
                let ssize = self.size_of(&src.rel);
                let dsize = self.size_of(&dst.rel);
                // Block aligned, or ending at the source's EOF.
                let soff = self.rng.below(ssize / 4096 + 1) * 4096;
                let avail = ssize.saturating_sub(soff);
                let mut len = (self.rng.below(avail / 4096 + 1) + 1) * 4096;
                if len >= avail || self.rng.chance(20) {
                    len = avail;
                }
                let doff = self.rng.below((dsize + 65536).min(MAX_OFFSET) / 4096 + 1) * 4096;
                let r = if len == 0 {
                    Err(io::Error::other("empty source range"))
                } else {
                    let cmd = format!(
                        "reflink {} {soff} {doff} {len}",
                        self.abs(&src.rel).display()
                    );
                    Command::new("xfs_io")
                        .arg("-c")
                        .arg(&cmd)
                        .arg(self.abs(&dst.rel))
                        .output()
                        .and_then(|o| {
                            // xfs_io reports errors on stderr, not in its status.
                            if o.status.success() && o.stderr.is_empty() {
                                Ok(())
                            } else {
                                Err(io::Error::other(
                                    String::from_utf8_lossy(&o.stderr).trim().to_owned(),
                                ))
                            }
                        })
                };
                self.record(
                    format!(
                        "reflink-range {} {soff}+{len} -> {} {doff}",
                        src.rel.display(),
                        dst.rel.display()
                    ),
                    r,
                );
            }
            Op::Link => {
                let list: Vec<Entry> = all
                    .iter()
                    .filter(|e| e.kind != Kind::Dir)
                    .cloned()
                    .collect();
                let Some(src) = self.rng.pick(&list).cloned() else {
                    return Ok(());
                };
                let dst = self.new_path(&all);
                let r = fs::hard_link(self.abs(&src.rel), self.abs(&dst));
                self.record(
                    format!("link {} -> {}", src.rel.display(), dst.display()),
                    r,
                );
            }
            Op::Unlink => {
                let list: Vec<Entry> = all
                    .iter()
                    .filter(|e| e.kind != Kind::Dir)
                    .cloned()
                    .collect();
                let Some(e) = self.rng.pick(&list).cloned() else {
                    return Ok(());
                };
                let r = fs::remove_file(self.abs(&e.rel));
                self.record(format!("unlink {}", e.rel.display()), r);
            }
            Op::Rename => {
                let Some(src) = self.pick_kind(&all, None) else {
                    return Ok(());
                };
                // Over an existing entry of the same kind, or to a new name.
                let dst = if self.rng.chance(35) {
                    let kind = if src.kind == Kind::Dir {
                        Kind::Dir
                    } else {
                        Kind::File
                    };
                    self.pick_kind(&all, Some(kind))
                        .map_or_else(|| self.new_path(&all), |e| e.rel)
                } else {
                    self.new_path(&all)
                };
                let r = fs::rename(self.abs(&src.rel), self.abs(&dst));
                self.record(
                    format!("rename {} -> {}", src.rel.display(), dst.display()),
                    r,
                );
            }
            Op::Exchange => {
                let (Some(a), Some(b)) = (self.pick_kind(&all, None), self.pick_kind(&all, None))
                else {
                    return Ok(());
                };
                let r = rustix::fs::renameat_with(
                    CWD,
                    self.abs(&a.rel),
                    CWD,
                    self.abs(&b.rel),
                    RenameFlags::EXCHANGE,
                )
                .map_err(io::Error::from);
                self.record(
                    format!("exchange {} <-> {}", a.rel.display(), b.rel.display()),
                    r,
                );
            }
            Op::Swap => {
                let kind = if self.rng.chance(50) {
                    Kind::Dir
                } else {
                    Kind::File
                };
                let (Some(a), Some(b)) = (
                    self.pick_kind(&all, Some(kind)),
                    self.pick_kind(&all, Some(kind)),
                ) else {
                    return Ok(());
                };
                let tmp = self.new_path(&all);
                let r = fs::rename(self.abs(&a.rel), self.abs(&tmp))
                    .and_then(|()| fs::rename(self.abs(&b.rel), self.abs(&a.rel)))
                    .and_then(|()| fs::rename(self.abs(&tmp), self.abs(&b.rel)));
                self.record(
                    format!(
                        "swap {} <-> {} via {}",
                        a.rel.display(),
                        b.rel.display(),
                        tmp.display()
                    ),
                    r,
                );
            }
            Op::Invert => {
                // A directory with a subdirectory: move the child up to the
                // parent's place, then the parent under the child.
                let pairs: Vec<(PathBuf, PathBuf)> = all
                    .iter()
                    .filter(|e| e.kind == Kind::Dir)
                    .filter_map(|e| {
                        let p = e.rel.parent()?;
                        let anc = p.components().next()?;
                        let anc = PathBuf::from(anc.as_os_str());
                        Some((anc, e.rel.clone()))
                    })
                    .collect();
                let Some((anc, child)) = self.rng.pick(&pairs).cloned() else {
                    return Ok(());
                };
                let up = anc.parent().unwrap_or(Path::new("")).join(self.pick_name());
                let under = self.pick_name();
                let r = fs::rename(self.abs(&child), self.abs(&up))
                    .and_then(|()| fs::rename(self.abs(&anc), self.abs(&up).join(&under)));
                self.record(
                    format!(
                        "invert {} -> {}, {} -> {}/{under}",
                        child.display(),
                        up.display(),
                        anc.display(),
                        up.display()
                    ),
                    r,
                );
            }
            Op::Rmdir => {
                let Some(e) = self.pick_kind(&all, Some(Kind::Dir)) else {
                    return Ok(());
                };
                if self.rng.chance(30) {
                    let r = fs::remove_dir_all(self.abs(&e.rel));
                    self.record(format!("rm -r {}", e.rel.display()), r);
                } else {
                    let r = fs::remove_dir(self.abs(&e.rel));
                    self.record(format!("rmdir {}", e.rel.display()), r);
                }
            }
            Op::Symlink => {
                let rel = self.new_path(&all);
                let target = match self.pick_kind(&all, None) {
                    Some(e) if self.rng.chance(70) => e.rel.display().to_string(),
                    _ => "x".repeat(1 + usize::try_from(self.rng.below(300)).unwrap_or(0)),
                };
                let r = std::os::unix::fs::symlink(&target, self.abs(&rel));
                self.record(format!("symlink {} -> {target}", rel.display()), r);
            }
            Op::Mkfifo => {
                let rel = self.new_path(&all);
                let r = rustix::fs::mknodat(
                    CWD,
                    self.abs(&rel),
                    rustix::fs::FileType::Fifo,
                    Mode::from_raw_mode(0o644),
                    0,
                )
                .map_err(io::Error::from);
                self.record(format!("mkfifo {}", rel.display()), r);
            }
            Op::Xattr => {
                let list: Vec<Entry> = all
                    .iter()
                    .filter(|e| matches!(e.kind, Kind::File | Kind::Dir))
                    .cloned()
                    .collect();
                let Some(e) = self.rng.pick(&list).cloned() else {
                    return Ok(());
                };
                let name = format!("user.{}", self.rng.pick(&["x", "y", "z"]).unwrap_or(&"x"));
                if self.rng.chance(30) {
                    let r = rustix::fs::removexattr(self.abs(&e.rel), name.as_str())
                        .map_err(io::Error::from);
                    self.record(format!("removexattr {} {name}", e.rel.display()), r);
                } else {
                    let len = usize::try_from(self.rng.below(40)).unwrap_or(0);
                    let value = self.rng.bytes(len, false);
                    let r = rustix::fs::setxattr(
                        self.abs(&e.rel),
                        name.as_str(),
                        &value,
                        rustix::fs::XattrFlags::empty(),
                    )
                    .map_err(io::Error::from);
                    self.record(format!("setxattr {} {name} len={len}", e.rel.display()), r);
                }
            }
            Op::Chmod => {
                let list: Vec<Entry> = all
                    .iter()
                    .filter(|e| e.kind != Kind::Symlink)
                    .cloned()
                    .collect();
                let Some(e) = self.rng.pick(&list).cloned() else {
                    return Ok(());
                };
                let mode = u32::try_from(self.rng.below(0o10000)).unwrap_or(0o644) | 0o700;
                let r = rustix::fs::chmod(self.abs(&e.rel), Mode::from_raw_mode(mode))
                    .map_err(io::Error::from);
                self.record(format!("chmod {} {mode:o}", e.rel.display()), r);
            }
            Op::Chown => {
                let Some(e) = self.pick_kind(&all, None) else {
                    return Ok(());
                };
                let (uid, gid) = (
                    u32::try_from(self.rng.below(3) * 500).unwrap_or(0),
                    u32::try_from(self.rng.below(3) * 500).unwrap_or(0),
                );
                let r = rustix::fs::chownat(
                    CWD,
                    self.abs(&e.rel),
                    Some(rustix::process::Uid::from_raw(uid)),
                    Some(rustix::process::Gid::from_raw(gid)),
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(io::Error::from);
                self.record(format!("chown {} {uid}:{gid}", e.rel.display()), r);
            }
            Op::Utimes => {
                let Some(e) = self.pick_kind(&all, None) else {
                    return Ok(());
                };
                let t = |rng: &mut Rng| Timespec {
                    tv_sec: i64::try_from(1_600_000_000 + rng.below(100_000_000)).unwrap_or(0),
                    tv_nsec: rng.below(1_000_000_000).try_into().unwrap_or(0),
                };
                let times = Timestamps {
                    last_access: t(&mut self.rng),
                    last_modification: t(&mut self.rng),
                };
                let r =
                    rustix::fs::utimensat(CWD, self.abs(&e.rel), &times, AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(io::Error::from);
                self.record(format!("utimes {}", e.rel.display()), r);
            }
        }
        Ok(())
    }
}

/// One kind of operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Create,
    Mkdir,
    Write,
    Append,
    Truncate,
    Punch,
    Fallocate,
    Reflink,
    ReflinkRange,
    Link,
    Unlink,
    Rename,
    Exchange,
    Swap,
    Invert,
    Rmdir,
    Symlink,
    Mkfifo,
    Xattr,
    Chmod,
    Chown,
    Utimes,
}

impl Op {
    /// Weighted choice: renames and data changes dominate (directory
    /// operations dominate more with `rename_heavy`).
    fn random(rng: &mut Rng, rename_heavy: bool) -> Op {
        const TABLE: &[(Op, u64)] = &[
            (Op::Create, 8),
            (Op::Mkdir, 6),
            (Op::Write, 7),
            (Op::Append, 3),
            (Op::Truncate, 4),
            (Op::Punch, 4),
            (Op::Fallocate, 3),
            (Op::Reflink, 3),
            (Op::ReflinkRange, 4),
            (Op::Link, 6),
            (Op::Unlink, 5),
            (Op::Rename, 16),
            (Op::Exchange, 4),
            (Op::Swap, 4),
            (Op::Invert, 4),
            (Op::Rmdir, 4),
            (Op::Symlink, 3),
            (Op::Mkfifo, 2),
            (Op::Xattr, 4),
            (Op::Chmod, 3),
            (Op::Chown, 3),
            (Op::Utimes, 3),
        ];
        let weight = |op: Op, w: u64| -> u64 {
            if !rename_heavy {
                return w;
            }
            match op {
                Op::Rename | Op::Exchange | Op::Swap | Op::Invert => w * 4,
                Op::Mkdir | Op::Link | Op::Rmdir => w * 2,
                Op::Write | Op::Append | Op::Truncate | Op::Punch | Op::Fallocate => 1,
                _ => w,
            }
        };
        let total: u64 = TABLE.iter().map(|&(op, w)| weight(op, w)).sum();
        let mut x = rng.below(total);
        for &(op, w) in TABLE {
            let w = weight(op, w);
            if x < w {
                return op;
            }
            x -= w;
        }
        Op::Create
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_spread() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<u64> = (0..100).map(|_| a.below(10)).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.below(10)).collect();
        assert_eq!(xs, ys);
        assert!((0..10).all(|d| xs.contains(&d)));
        assert_ne!(Rng::new(8).next_u64(), Rng::new(7).next_u64());
    }

    #[test]
    fn same_seed_same_tree() {
        let run = |seed| {
            let dir = tempfile::tempdir().unwrap();
            let mut w = Workload::new(dir.path(), seed);
            w.populate(30).unwrap();
            w.run(60).unwrap();
            let m =
                crate::manifest::manifest(dir.path(), crate::manifest::Options::default()).unwrap();
            // Times of the root and of touched entries are "now": compare
            // the op log and the paths only.
            let paths: Vec<String> = m
                .lines()
                .map(|l| l.split(' ').next().unwrap_or("").to_owned())
                .collect();
            (w.log().to_vec(), paths)
        };
        let (log, paths) = run(42);
        assert_eq!(run(42), (log.clone(), paths));
        assert_ne!(run(43).0, log);
        // Operations with nothing to act on (no file yet) log nothing.
        assert!(
            (45..=90).contains(&log.len()),
            "{} operations logged",
            log.len()
        );
    }
}
