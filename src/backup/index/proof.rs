//! The proof of a synthetic full stream: a digest of everything a
//! snapshot's tree holds, taken of the chain's index while the stream is
//! written from it, and of the index the stream itself makes when it is
//! applied to an empty one. Equal digests mean equal trees.
//!
//! Each path, in the walk's order (depth first, each directory's entries
//! in name order: the same on both sides whatever the inode numbers), adds
//! one record to the digest: its path, type, mode, owner, size, device
//! number, modification time, inode flags, link count, symlink target,
//! xattrs (sorted by name), and for a file its data ranges (where its
//! holes are) and its content hash ([`crate::manifest::content_hash`]).
//! A second name of an inode adds its path and the position of the first
//! name instead. A mismatch is found again by a second walk that keeps
//! one hash per path, to name the first path that differs.

use std::collections::HashMap;

use super::IndexError;
use super::model::{FileType, Inode, ROOT_INO};
use super::read::{DataSource, Snapshot, Visit};

/// What a file's data is: its data ranges and its content hash.
pub type Content = (Vec<(u64, u64)>, String);

/// A digest of a tree, path by path (see the module docs).
#[derive(Debug, Default)]
pub struct TreeDigest {
    whole: blake3::Hasher,
    /// The position of the first name of each inode with several.
    links: HashMap<u64, u64>,
    /// Paths recorded so far.
    paths: u64,
    /// Each path's own hash, when a mismatch is being looked for.
    each: Option<Vec<[u8; 32]>>,
    /// The first path whose hash differs from `against`'s, with its
    /// position.
    against: Option<Vec<[u8; 32]>>,
    first_difference: Option<(u64, Vec<u8>)>,
}

impl TreeDigest {
    /// An empty digest.
    pub fn new() -> TreeDigest {
        TreeDigest::default()
    }

    /// A digest that also keeps one hash per path.
    fn keeping() -> TreeDigest {
        TreeDigest {
            each: Some(Vec::new()),
            ..TreeDigest::default()
        }
    }

    /// A digest that looks for the first path whose hash differs from
    /// `hashes`' (a [`TreeDigest::keeping`] digest's).
    fn against(hashes: Vec<[u8; 32]>) -> TreeDigest {
        TreeDigest {
            against: Some(hashes),
            ..TreeDigest::default()
        }
    }

    /// Paths recorded.
    pub fn paths(&self) -> u64 {
        self.paths
    }

    /// The digest of what was recorded.
    pub fn finish(&self) -> [u8; 32] {
        let mut h = self.whole.clone();
        h.update(&self.paths.to_le_bytes());
        *h.finalize().as_bytes()
    }

    fn record(&mut self, path: &[u8], h: blake3::Hasher) {
        let one = *h.finalize().as_bytes();
        self.whole.update(&one);
        if let Some(each) = &mut self.each {
            each.push(one);
        }
        if let Some(want) = &self.against
            && self.first_difference.is_none()
            && want.get(self.paths as usize) != Some(&one)
        {
            self.first_difference = Some((self.paths, path.to_vec()));
        }
        self.paths += 1;
    }

    /// Record `path`, the first (or only) name of inode `ino`, with its
    /// xattrs and, for a file, its data.
    pub fn path(
        &mut self,
        path: &[u8],
        ino: u64,
        inode: &Inode,
        xattrs: &[(Vec<u8>, Vec<u8>)],
        content: Option<&Content>,
    ) {
        let mut h = blake3::Hasher::new();
        let field = |h: &mut blake3::Hasher, b: &[u8]| {
            h.update(&(b.len() as u64).to_le_bytes());
            h.update(b);
        };
        field(&mut h, path);
        h.update(&[inode.kind.code()]);
        for x in [inode.mode, inode.uid, inode.gid, inode.nlink, inode.mtime.1] {
            h.update(&x.to_le_bytes());
        }
        for x in [inode.size, inode.rdev, inode.mtime.0 as u64, inode.flags] {
            h.update(&x.to_le_bytes());
        }
        field(&mut h, &inode.target);
        h.update(&(xattrs.len() as u64).to_le_bytes());
        let mut sorted: Vec<_> = xattrs.iter().collect();
        sorted.sort();
        for (name, value) in sorted {
            field(&mut h, name);
            field(&mut h, value);
        }
        if let Some((ranges, b3)) = content {
            h.update(&(ranges.len() as u64).to_le_bytes());
            for (start, len) in ranges {
                h.update(&start.to_le_bytes());
                h.update(&len.to_le_bytes());
            }
            field(&mut h, b3.as_bytes());
        }
        if inode.kind != FileType::Dir && inode.nlink > 1 {
            self.links.insert(ino, self.paths);
        }
        self.record(path, h);
    }

    /// Record `path`, a further name of inode `ino`, recorded before.
    pub fn link(&mut self, path: &[u8], ino: u64) {
        let mut h = blake3::Hasher::new();
        h.update(&(path.len() as u64).to_le_bytes());
        h.update(path);
        h.update(b"link");
        let first = self.links.get(&ino).copied().unwrap_or(u64::MAX);
        h.update(&first.to_le_bytes());
        self.record(path, h);
    }

    /// Whether `ino` has had a name recorded already.
    pub fn seen(&self, ino: u64) -> bool {
        self.links.contains_key(&ino)
    }
}

/// The content of file `ino` of `snap`: its data ranges and content hash,
/// read through `data`.
fn content_of(
    snap: &Snapshot<'_, '_>,
    ino: u64,
    inode: &Inode,
    data: &dyn DataSource,
) -> Result<Content, IndexError> {
    let ranges = snap.data_ranges(ino, inode.size)?;
    let b3 = crate::manifest::content_hash(inode.size, ranges.iter().copied(), |off, buf| {
        snap.read(ino, inode, off, buf, data).map(|_| ())
    })?;
    Ok((ranges, b3))
}

/// A walk of a snapshot into a digest.
struct Walk<'a, 'p, 's> {
    snap: &'a Snapshot<'p, 's>,
    data: &'a dyn DataSource,
    digest: TreeDigest,
}

impl Walk<'_, '_, '_> {
    fn add(&mut self, path: &[u8], ino: u64, inode: &Inode) -> Result<(), IndexError> {
        if inode.kind != FileType::Dir && self.digest.seen(ino) {
            self.digest.link(path, ino);
            return Ok(());
        }
        let xattrs = self.snap.xattrs(ino)?;
        let content = match inode.kind {
            FileType::File => Some(content_of(self.snap, ino, inode, self.data)?),
            _ => None,
        };
        self.digest
            .path(path, ino, inode, &xattrs, content.as_ref());
        Ok(())
    }
}

impl Visit for Walk<'_, '_, '_> {
    fn enter(&mut self, path: &[u8], ino: u64, inode: &Inode) -> Result<bool, IndexError> {
        self.add(path, ino, inode)?;
        Ok(inode.kind == FileType::Dir)
    }

    fn leave(&mut self, _: &[u8], _: u64, _: &Inode) -> Result<(), IndexError> {
        Ok(())
    }
}

fn walk(
    snap: &Snapshot<'_, '_>,
    data: &dyn DataSource,
    digest: TreeDigest,
) -> Result<TreeDigest, IndexError> {
    let mut w = Walk { snap, data, digest };
    let root = snap.inode(ROOT_INO)?;
    w.add(b"", ROOT_INO, &root)?;
    snap.visit_below(ROOT_INO, &mut Vec::new(), &mut w)?;
    Ok(w.digest)
}

/// The digest of the whole of `snap`, its file data read through `data`.
///
/// # Errors
///
/// A damaged index, or data that cannot be read.
pub fn digest(snap: &Snapshot<'_, '_>, data: &dyn DataSource) -> Result<TreeDigest, IndexError> {
    walk(snap, data, TreeDigest::new())
}

/// Where two snapshots whose digests differ first differ: the path of
/// `b` at the first position whose record differs from `a`'s (`None`: the
/// first of them ends early, or they do not differ).
///
/// # Errors
///
/// A damaged index, or data that cannot be read.
pub fn first_difference(
    a: (&Snapshot<'_, '_>, &dyn DataSource),
    b: (&Snapshot<'_, '_>, &dyn DataSource),
) -> Result<Option<Vec<u8>>, IndexError> {
    let kept = walk(a.0, a.1, TreeDigest::keeping())?;
    let hashes = kept.each.unwrap_or_default();
    let found = walk(b.0, b.1, TreeDigest::against(hashes))?;
    Ok(found.first_difference.map(|(_, path)| path))
}
