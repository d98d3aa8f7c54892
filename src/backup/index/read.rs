//! Reading a snapshot's index: paths, attributes, directory listings, and
//! file data read from the streams the extents point into.

use std::ops::ControlFlow;

use super::IndexError;
use super::apply::{IndexRoot, overlapping, resolve_in};
use super::model::{
    Encoding, FileType, Inode, ROOT_INO, decode_dirent, dirent_prefix, inode_key, is_entry_name,
    is_xattr_name, name_of, xattr_prefix,
};
use super::tree::{Pages, Record, Scan, Tree};
use crate::manifest::{self, Described};

/// Deepest directory nesting a walk follows (a path of at most 4096
/// bytes has at most 2048 components): deeper is damage, an error.
const MAX_DEPTH: usize = 2048;

/// A walk's callback: each path, its inode number and inode.
pub type Walk<'f> = dyn FnMut(&[u8], u64, &Inode) -> Result<(), IndexError> + 'f;

/// What [`Snapshot::visit_below`] shows each path to.
pub trait Visit {
    /// `path` (inode `ino`) is reached; for a directory, whether to go
    /// into it.
    ///
    /// # Errors
    ///
    /// Whatever stops the walk.
    fn enter(&mut self, path: &[u8], ino: u64, inode: &Inode) -> Result<bool, IndexError>;

    /// Everything below directory `path`, which `enter` went into, was
    /// shown.
    ///
    /// # Errors
    ///
    /// Whatever stops the walk.
    fn leave(&mut self, path: &[u8], ino: u64, inode: &Inode) -> Result<(), IndexError> {
        let _ = (path, ino, inode);
        Ok(())
    }
}

/// A listing's callback: each entry's name and inode number.
pub type Entries<'f> = dyn FnMut(&[u8], u64) -> Result<Scan, IndexError> + 'f;

/// Where file data is read from: the raw bytes of a stream by its name in
/// the index's source list.
pub trait DataSource {
    /// Fill `buf` with the bytes of stream `source` at `offset`.
    ///
    /// # Errors
    ///
    /// The stream cannot be read there (missing, damaged, too short).
    fn read(&self, source: &str, offset: u64, buf: &mut [u8]) -> Result<(), IndexError>;
}

/// A stored snapshot's index, open for reading.
pub struct Snapshot<'p, 's> {
    tree: Tree<'p, 's>,
    root: IndexRoot,
}

impl<'p, 's> Snapshot<'p, 's> {
    /// The snapshot whose index is `root`.
    pub fn open(pages: &'p Pages<'s>, root: IndexRoot) -> Snapshot<'p, 's> {
        Snapshot {
            tree: Tree::open(pages, root.top()),
            root,
        }
    }

    /// The inode of `path` (relative to the snapshot's root, `/`-separated;
    /// empty: the root).
    ///
    /// # Errors
    ///
    /// [`IndexError::NotFound`], or a damaged index.
    pub fn lookup(&self, path: &[u8]) -> Result<u64, IndexError> {
        resolve_in(&self.tree, path)
    }

    /// Inode `ino`.
    ///
    /// # Errors
    ///
    /// It is missing, or its record is damaged.
    pub fn inode(&self, ino: u64) -> Result<Inode, IndexError> {
        let k = inode_key(ino);
        let v = self.tree.get(&k)?.ok_or_else(|| IndexError::Record {
            what: "inode",
            key: k.clone(),
            reason: "missing (an entry names it)",
        })?;
        Inode::decode(&k, &v)
    }

    /// Call `f` with the name and inode number of each entry of directory
    /// `dir`, in name order, until it breaks.
    ///
    /// # Errors
    ///
    /// A damaged index, or the first error of `f`.
    pub fn children(&self, dir: u64, f: &mut Entries<'_>) -> Result<(), IndexError> {
        let prefix = dirent_prefix(dir);
        self.tree.scan(&prefix, &mut |k, v| {
            if !k.starts_with(&prefix) {
                return Ok(ControlFlow::Break(()));
            }
            let name = name_of(k);
            if !is_entry_name(name) {
                return Err(bad_name(k, "directory entry"));
            }
            f(name, decode_dirent(k, v)?)
        })
    }

    /// The xattrs of `ino`, by name.
    ///
    /// # Errors
    ///
    /// A damaged index.
    pub fn xattrs(&self, ino: u64) -> Result<Vec<Record>, IndexError> {
        let prefix = xattr_prefix(ino);
        self.tree
            .prefixed(&prefix)?
            .into_iter()
            .map(|(k, v)| {
                let name = name_of(&k);
                if !is_xattr_name(name) {
                    return Err(bad_name(&k, "xattr"));
                }
                Ok((name.to_vec(), v))
            })
            .collect()
    }

    /// The ranges of `ino` that hold data (the rest reads as zeros), merged,
    /// within `size`.
    ///
    /// # Errors
    ///
    /// A damaged index.
    pub fn data_ranges(&self, ino: u64, size: u64) -> Result<Vec<(u64, u64)>, IndexError> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        overlapping(&self.tree, ino, 0, size, &mut |start, e| {
            let end = start.saturating_add(e.len).min(size);
            match out.last_mut() {
                Some((s, l)) if *s + *l == start => *l = end - *s,
                _ => out.push((start, end - start)),
            }
        })?;
        Ok(out)
    }

    /// The stream the extent of `ino` at `start` points into.
    fn source_of(
        &self,
        ino: u64,
        start: u64,
        e: &super::model::Extent,
    ) -> Result<&str, IndexError> {
        self.root
            .sources
            .get(e.source as usize)
            .map(String::as_str)
            .ok_or(IndexError::Record {
                what: "extent",
                key: super::model::extent_key(ino, start),
                reason: "names a stream the index does not list",
            })
    }

    /// Read `buf.len()` bytes of file `ino` at `offset` (holes and the part
    /// past its data read as zeros); the bytes read, short at the end of
    /// the file.
    ///
    /// # Errors
    ///
    /// A damaged index, or data that cannot be read from its stream.
    pub fn read(
        &self,
        ino: u64,
        inode: &Inode,
        offset: u64,
        buf: &mut [u8],
        data: &dyn DataSource,
    ) -> Result<usize, IndexError> {
        let end = offset.saturating_add(buf.len() as u64).min(inode.size);
        if offset >= end {
            return Ok(0);
        }
        let n = (end - offset) as usize;
        let buf = &mut buf[..n];
        buf.fill(0);
        let mut pieces = Vec::new();
        overlapping(&self.tree, ino, offset, end, &mut |start, e| {
            pieces.push((start, e));
        })?;
        for (start, e) in pieces {
            let s = start.max(offset);
            let t = start.saturating_add(e.len).min(end);
            let into = &mut buf[(s - offset) as usize..(t - offset) as usize];
            let source = self.source_of(ino, start, &e)?;
            match e.encoding {
                Encoding::Plain => {
                    let at = e
                        .stream_offset
                        .checked_add(s - start)
                        .ok_or(IndexError::Record {
                            what: "extent",
                            key: super::model::extent_key(ino, start),
                            reason: "stream offset out of range",
                        })?;
                    data.read(source, at, into)?
                }
                Encoding::Encoded {
                    compression,
                    encoded_len,
                    unencoded_len,
                    unencoded_offset,
                } => {
                    let len = usize::try_from(encoded_len)
                        .ok()
                        .filter(|&l| l <= 16 << 20)
                        .ok_or(IndexError::Record {
                            what: "extent",
                            key: super::model::extent_key(ino, start),
                            reason: "encoded length out of range",
                        })?;
                    let mut blob = vec![0u8; len];
                    data.read(source, e.stream_offset, &mut blob)?;
                    let out = crate::receive::encoded::decode(
                        compression,
                        0,
                        &blob,
                        unencoded_len,
                        unencoded_offset
                            .checked_add(s - start)
                            .ok_or(IndexError::Record {
                                what: "extent",
                                key: super::model::extent_key(ino, start),
                                reason: "offset in the encoded data out of range",
                            })?,
                        t - s,
                    )
                    .map_err(|err| IndexError::Data {
                        path: format!("inode {ino}"),
                        reason: err.to_string(),
                    })?;
                    into.copy_from_slice(&out);
                }
            }
        }
        Ok(n)
    }

    /// Call `f` with every path below the root (not the root itself),
    /// depth first, each directory's entries in name order.
    ///
    /// # Errors
    ///
    /// A damaged index, or the first error of `f`.
    pub fn walk(&self, f: &mut Walk<'_>) -> Result<(), IndexError> {
        self.walk_below(ROOT_INO, &mut Vec::new(), f)
    }

    /// Call `f` with every path below directory `dir` (whose path is
    /// `path`, with no leading `/`; given back as it came), as [`walk`].
    ///
    /// # Errors
    ///
    /// A damaged index, or the first error of `f`.
    ///
    /// [`walk`]: Snapshot::walk
    pub fn walk_below(
        &self,
        dir: u64,
        path: &mut Vec<u8>,
        f: &mut Walk<'_>,
    ) -> Result<(), IndexError> {
        struct All<'a, 'f>(&'a mut Walk<'f>);
        impl Visit for All<'_, '_> {
            fn enter(&mut self, path: &[u8], ino: u64, inode: &Inode) -> Result<bool, IndexError> {
                (self.0)(path, ino, inode)?;
                Ok(true)
            }
        }
        self.visit_below(dir, path, &mut All(f))
    }

    /// Show `v` every path below directory `dir` (whose path is `path`),
    /// depth first, each directory's entries in name order, entering a
    /// directory only where `v` asks to, and telling `v` when it leaves
    /// one.
    ///
    /// # Errors
    ///
    /// A damaged index, or the first error of `v`.
    pub fn visit_below(
        &self,
        dir: u64,
        path: &mut Vec<u8>,
        v: &mut dyn Visit,
    ) -> Result<(), IndexError> {
        self.visit_dir(dir, path, &mut vec![dir], v)
    }

    /// `above` holds the directories from where the visit started down to
    /// `dir`: a directory has one parent (no hard links to directories),
    /// so one that contains an entry already above it is a loop only a
    /// damaged or forged index can hold, refused at once rather than after
    /// [`MAX_DEPTH`] levels of it.
    fn visit_dir(
        &self,
        dir: u64,
        path: &mut Vec<u8>,
        above: &mut Vec<u64>,
        v: &mut dyn Visit,
    ) -> Result<(), IndexError> {
        if above.len() > MAX_DEPTH {
            return Err(IndexError::Record {
                what: "directory",
                key: inode_key(dir),
                reason: "nested deeper than any path can be",
            });
        }
        self.children(dir, &mut |name, ino| {
            let inode = self.inode(ino)?;
            let len = path.len();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(name);
            if v.enter(path, ino, &inode)? && inode.kind == FileType::Dir {
                if above.contains(&ino) {
                    return Err(IndexError::Record {
                        what: "directory",
                        key: inode_key(ino),
                        reason: "an entry of a directory below it (a loop)",
                    });
                }
                above.push(ino);
                self.visit_dir(ino, path, above, v)?;
                above.pop();
                v.leave(path, ino, &inode)?;
            }
            path.truncate(len);
            Ok(ControlFlow::Continue(()))
        })
    }

    /// What a manifest records of `path` (inode `ino`), its content hash
    /// read through `data`.
    ///
    /// # Errors
    ///
    /// A damaged index, or data that cannot be read.
    pub fn describe(
        &self,
        path: &[u8],
        ino: u64,
        inode: &Inode,
        opts: manifest::Options,
        data: &dyn DataSource,
    ) -> Result<Described, IndexError> {
        let mut d = Described {
            rel: path.to_vec(),
            kind: inode.kind.manifest_name(),
            mode: inode.mode,
            uid: inode.uid,
            gid: inode.gid,
            size: inode.size,
            mtime: (inode.mtime.0, i64::from(inode.mtime.1)),
            link_key: (inode.kind != FileType::Dir && inode.nlink > 1).then_some((0, ino)),
            xattrs: self.xattrs(ino)?,
            ..Described::default()
        };
        match inode.kind {
            FileType::Symlink => d.target = Some(inode.target.clone()),
            FileType::Chr | FileType::Blk => {
                d.rdev = Some((rustix::fs::major(inode.rdev), rustix::fs::minor(inode.rdev)));
            }
            FileType::File => {
                let ranges = self.data_ranges(ino, inode.size)?;
                d.b3 = Some(manifest::content_hash(
                    inode.size,
                    ranges.iter().copied(),
                    |off, buf| self.read(ino, inode, off, buf, data).map(|_| ()),
                )?);
                if opts.holes {
                    d.data = Some(ranges);
                }
            }
            _ => {}
        }
        Ok(d)
    }

    /// The manifest of the whole snapshot (the format of
    /// [`crate::manifest`]), file contents read through `data`.
    ///
    /// # Errors
    ///
    /// A damaged index, or data that cannot be read.
    pub fn manifest(
        &self,
        opts: manifest::Options,
        data: &dyn DataSource,
    ) -> Result<String, IndexError> {
        let root = self.inode(ROOT_INO)?;
        let mut all = vec![self.describe(b"", ROOT_INO, &root, opts, data)?];
        self.walk(&mut |path, ino, inode| {
            all.push(self.describe(path, ino, inode, opts, data)?);
            Ok(())
        })?;
        let mut out = Vec::new();
        manifest::write_described(all, &mut out).map_err(|e| IndexError::Store(e.to_string()))?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// A record whose name no stream can give (see [`is_entry_name`]).
fn bad_name(key: &[u8], what: &'static str) -> IndexError {
    IndexError::Record {
        what,
        key: key.to_vec(),
        reason: "a name no file system allows (forged or damaged)",
    }
}

// Lookups for a live view of a snapshot (`backup mount`): one name in a
// directory, and the data run at an offset, each costing the pages on
// its way rather than a scan of the directory or of the file's extents.
impl Snapshot<'_, '_> {
    /// The inode number of the entry `name` of directory `dir`, if it has
    /// one.
    ///
    /// # Errors
    ///
    /// A damaged index.
    pub fn child(&self, dir: u64, name: &[u8]) -> Result<Option<u64>, IndexError> {
        let k = super::model::dirent_key(dir, name);
        match self.tree.get(&k)? {
            Some(v) => decode_dirent(&k, &v).map(Some),
            None => Ok(None),
        }
    }

    /// The data of `ino` (a file of `size` bytes) that holds offset `from`,
    /// or else the first that starts after it: `(start, end)` of the run of
    /// touching extents, cut at `size`; `None` when only a hole lies from
    /// `from` to the end (`lseek`'s `SEEK_DATA` and `SEEK_HOLE`).
    ///
    /// # Errors
    ///
    /// A damaged index.
    pub fn data_run(
        &self,
        ino: u64,
        size: u64,
        from: u64,
    ) -> Result<Option<(u64, u64)>, IndexError> {
        if from >= size {
            return Ok(None);
        }
        let mut run: Option<(u64, u64)> = None;
        super::apply::overlapping_until(&self.tree, ino, from, size, &mut |start, e| {
            if run.is_some_and(|(_, end)| start > end) {
                return ControlFlow::Break(());
            }
            let end = start.saturating_add(e.len);
            run = Some(match run {
                Some((s, t)) => (s, t.max(end)),
                None => (start, end),
            });
            ControlFlow::Continue(())
        })?;
        Ok(run.map(|(s, t)| (s, t.min(size))).filter(|(s, t)| s < t))
    }
}

impl Snapshot<'_, '_> {
    /// The extents of `ino` that start below `size`: each start, its
    /// record, and the name of the stream it points into (what `diff`
    /// compares to tell equal data without reading it).
    ///
    /// # Errors
    ///
    /// A damaged index, or an extent naming a stream the index does not
    /// list.
    pub fn extents(
        &self,
        ino: u64,
        size: u64,
    ) -> Result<Vec<(u64, super::model::Extent, String)>, IndexError> {
        let mut out = Vec::new();
        overlapping(&self.tree, ino, 0, size, &mut |start, e| {
            out.push((start, e))
        })?;
        out.into_iter()
            .map(|(start, e)| {
                let source = self.source_of(ino, start, &e)?.to_owned();
                Ok((start, e, source))
            })
            .collect()
    }
}

#[cfg(test)]
mod live_lookup_tests {

    use super::super::tree::Pages;
    use super::super::{IndexRoot, Snapshots, index_stream};
    use super::{FileType, Snapshot};
    use crate::testing::FixtureMeta;

    type Mem = super::super::tree::MemPages;

    struct None_;

    impl Snapshots for None_ {
        fn index_of(&self, _: &[u8; 16]) -> Option<IndexRoot> {
            None
        }
    }

    /// `child` finds what `children` lists, and following `data_run` from
    /// offset 0 gives `data_ranges`, in the kernel's sparse and compressed
    /// snapshots.
    #[test]
    fn child_and_data_run_agree_with_the_full_listings() {
        for (fixture, snap) in [("004-sparse-prealloc", "h1"), ("006-compression", "c1")] {
            let fx = FixtureMeta::load(&crate::testing::fixtures_dir().join(fixture)).unwrap();
            let stream = std::fs::File::open(fx.full_stream(snap, "v2c")).unwrap();
            let raw = zstd::Decoder::new(stream).unwrap();
            let mem = Mem::default();
            let pages = Pages::new(&mem, [0; 32]);
            let (_, root) = index_stream(&pages, raw, "s", &None_).unwrap();
            let s = Snapshot::open(&pages, root);
            let mut files = 0;
            s.walk(&mut |path, ino, inode| {
                let (dir, name) = match path.iter().rposition(|&b| b == b'/') {
                    Some(i) => (s.lookup(&path[..i])?, &path[i + 1..]),
                    None => (super::ROOT_INO, path),
                };
                assert_eq!(s.child(dir, name)?, Some(ino));
                let mut missing = name.to_vec();
                missing.push(b'~');
                assert_eq!(s.child(dir, &missing)?, None);
                if inode.kind == FileType::File {
                    files += 1;
                    let mut runs = Vec::new();
                    let mut at = 0;
                    while let Some((start, end)) = s.data_run(ino, inode.size, at)? {
                        assert!(start >= at && end > start);
                        // From inside a run, the same run's end.
                        let inside = s.data_run(ino, inode.size, end - 1)?;
                        assert!(inside.is_some_and(|(s, e)| s < end && e == end));
                        runs.push((start, end - start));
                        at = end;
                    }
                    assert_eq!(
                        runs,
                        s.data_ranges(ino, inode.size)?,
                        "{fixture} inode {ino}"
                    );
                }
                Ok(())
            })
            .unwrap();
            assert!(files > 0);
        }
    }
}
