//! What changed between two stored snapshots, from their indexes: both
//! trees walked together, each directory's entries merged in name order,
//! so memory holds one directory per level.
//!
//! A path is modified when its type, mode, owner, size (not of
//! directories, whose size is the filesystem's business), mtime, symlink
//! target, device number, xattrs, link count or content differ. Content
//! is equal without reading it when both files' extents point at the same
//! places of the same streams; otherwise it is read and compared.

use std::ops::ControlFlow;

use super::IndexError;
use super::model::{FileType, Inode, ROOT_INO};
use super::read::{DataSource, Snapshot};

/// How a path changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Only in the second snapshot.
    Added,
    /// Only in the first snapshot.
    Removed,
    /// In both, with other attributes or content.
    Modified,
}

impl Change {
    /// The name `diff --json` gives it.
    pub fn name(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Removed => "removed",
            Change::Modified => "modified",
        }
    }
}

/// What a diff does with each changed path (from the root, no leading
/// `/`; empty: the root).
pub type OnChange<'f> = dyn FnMut(&[u8], Change) -> Result<(), IndexError> + 'f;

/// One side of a diff: a snapshot and where its data is read.
pub struct Side<'a, 'p, 's> {
    /// The snapshot.
    pub snap: &'a Snapshot<'p, 's>,
    /// Its data.
    pub data: &'a dyn DataSource,
}

/// Call `f` with every path that differs between `old` and `new`, in the
/// order of a depth-first walk of names.
///
/// # Errors
///
/// A damaged index, data that cannot be read, or the first error of `f`.
pub fn diff(
    old: &Side<'_, '_, '_>,
    new: &Side<'_, '_, '_>,
    f: &mut OnChange<'_>,
) -> Result<(), IndexError> {
    let (a, b) = (old.snap.inode(ROOT_INO)?, new.snap.inode(ROOT_INO)?);
    if differs(old, ROOT_INO, &a, new, ROOT_INO, &b)? {
        f(b"", Change::Modified)?;
    }
    let mut path = Vec::new();
    dir(old, ROOT_INO, new, ROOT_INO, &mut path, 0, f)
}

const MAX_DEPTH: usize = 2048;

fn entries(s: &Snapshot<'_, '_>, dir: u64) -> Result<Vec<(Vec<u8>, u64)>, IndexError> {
    let mut v = Vec::new();
    s.children(dir, &mut |name, ino| {
        v.push((name.to_vec(), ino));
        Ok(ControlFlow::Continue(()))
    })?;
    Ok(v)
}

fn push(path: &mut Vec<u8>, name: &[u8]) -> usize {
    let len = path.len();
    if !path.is_empty() {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    len
}

fn dir(
    old: &Side<'_, '_, '_>,
    da: u64,
    new: &Side<'_, '_, '_>,
    db: u64,
    path: &mut Vec<u8>,
    depth: usize,
    f: &mut OnChange<'_>,
) -> Result<(), IndexError> {
    if depth > MAX_DEPTH {
        return Err(IndexError::Record {
            what: "directory",
            key: super::model::inode_key(db),
            reason: "nested deeper than any path can be (a loop)",
        });
    }
    let (xs, ys) = (entries(old.snap, da)?, entries(new.snap, db)?);
    let (mut i, mut j) = (0, 0);
    while i < xs.len() || j < ys.len() {
        let order = match (xs.get(i), ys.get(j)) {
            (Some(x), Some(y)) => x.0.cmp(&y.0),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Less => {
                let (name, ino) = &xs[i];
                let len = push(path, name);
                one_side(old.snap, *ino, path, Change::Removed, f)?;
                path.truncate(len);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                let (name, ino) = &ys[j];
                let len = push(path, name);
                one_side(new.snap, *ino, path, Change::Added, f)?;
                path.truncate(len);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                let ((name, ia), (_, ib)) = (&xs[i], &ys[j]);
                let len = push(path, name);
                let (a, b) = (old.snap.inode(*ia)?, new.snap.inode(*ib)?);
                if differs(old, *ia, &a, new, *ib, &b)? {
                    f(path, Change::Modified)?;
                }
                match (a.kind == FileType::Dir, b.kind == FileType::Dir) {
                    (true, true) => dir(old, *ia, new, *ib, path, depth + 1, f)?,
                    (true, false) => old
                        .snap
                        .walk_below(*ia, path, &mut |p, _, _| f(p, Change::Removed))?,
                    (false, true) => new
                        .snap
                        .walk_below(*ib, path, &mut |p, _, _| f(p, Change::Added))?,
                    (false, false) => {}
                }
                path.truncate(len);
                i += 1;
                j += 1;
            }
        }
    }
    Ok(())
}

/// `path` (inode `ino`) and everything below it, all `change`.
fn one_side(
    s: &Snapshot<'_, '_>,
    ino: u64,
    path: &mut Vec<u8>,
    change: Change,
    f: &mut OnChange<'_>,
) -> Result<(), IndexError> {
    f(path, change)?;
    if s.inode(ino)?.kind == FileType::Dir {
        s.walk_below(ino, path, &mut |p, _, _| f(p, change))?;
    }
    Ok(())
}

fn differs(
    old: &Side<'_, '_, '_>,
    ia: u64,
    a: &Inode,
    new: &Side<'_, '_, '_>,
    ib: u64,
    b: &Inode,
) -> Result<bool, IndexError> {
    if a.kind != b.kind
        || a.mode != b.mode
        || a.uid != b.uid
        || a.gid != b.gid
        || a.mtime != b.mtime
        || (a.kind != FileType::Dir && (a.size != b.size || (a.nlink > 1) != (b.nlink > 1)))
    {
        return Ok(true);
    }
    match a.kind {
        FileType::Symlink if a.target != b.target => return Ok(true),
        FileType::Chr | FileType::Blk if a.rdev != b.rdev => return Ok(true),
        _ => {}
    }
    if old.snap.xattrs(ia)? != new.snap.xattrs(ib)? {
        return Ok(true);
    }
    if a.kind == FileType::File {
        return Ok(!same_content(old, ia, a, new, ib)?);
    }
    Ok(false)
}

/// Whether two files of equal size hold the same bytes.
fn same_content(
    old: &Side<'_, '_, '_>,
    ia: u64,
    a: &Inode,
    new: &Side<'_, '_, '_>,
    ib: u64,
) -> Result<bool, IndexError> {
    let size = a.size;
    let clip = |v: Vec<(u64, super::model::Extent, String)>| {
        v.into_iter()
            .map(|(start, mut e, src)| {
                e.len = e.len.min(size.saturating_sub(start));
                e.source = 0;
                (start, e, src)
            })
            .collect::<Vec<_>>()
    };
    if clip(old.snap.extents(ia, size)?) == clip(new.snap.extents(ib, size)?) {
        return Ok(true);
    }
    let b = new.snap.inode(ib)?;
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut at = 0;
    while at < size {
        let n = old.snap.read(ia, a, at, &mut x, old.data)?;
        let m = new.snap.read(ib, &b, at, &mut y, new.data)?;
        if n != m || x[..n] != y[..m] {
            return Ok(false);
        }
        if n == 0 {
            break;
        }
        at += n as u64;
    }
    Ok(true)
}
