//! A manifest (format v2, see [`crate::manifest`]) computed from the
//! filesystem model alone, with no mount: the same text the kernel's view of
//! the subvolume gives through `btrsend manifest --holes`.
//!
//! One key-order pass over the fs tree ([`FsTree::inodes`]) describes every
//! inode and collects directory entries; paths are then built from the
//! root directory down. What the kernel shows is reproduced from the items:
//! `st_nlink` is the inode's `nlink`, `rdev` the kernel dev_t split into
//! major/minor, `data=` what `SEEK_DATA`/`SEEK_HOLE` report (inline and
//! regular extents are data, holes and prealloc are not, ranges end at
//! i_size), nested subvolumes are `subvol` lines. File contents are hashed
//! as [`content_hash`] defines it, reading only the data ranges (holes and
//! prealloc extents read as zeros, so they are skipped without reading).

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::error::{CorruptKind, Error, Location, Result};
use crate::manifest::{HEADER, Options, content_hash, escape};

use super::data::data_ranges;
use super::items::{FileType, Inode, Target, inode_key};
use super::tree::{FsTree, WalkOptions};

/// How one inode is described.
struct Described {
    /// From the type up to (excluding) `link=`.
    head: String,
    /// From `b3=` on, with a leading space.
    tail: String,
    /// Non-directory with nlink > 1.
    linked: bool,
}

fn type_name(t: FileType) -> &'static str {
    match t {
        FileType::Regular => "file",
        FileType::Dir => "dir",
        FileType::Symlink => "symlink",
        FileType::Fifo => "fifo",
        FileType::Socket => "sock",
        FileType::CharDev => "chr",
        FileType::BlockDev => "blk",
        FileType::Unknown(_) => "unknown",
    }
}

fn escape_xattr_name(name: &[u8]) -> String {
    // `escape` leaves '=' alone; in names it must be escaped too.
    escape(name).replace('=', "\\x3d")
}

fn describe(
    tree: &FsTree<'_>,
    inode: &Inode,
    xattrs: &mut [super::items::Xattr],
    opts: Options,
    verify: bool,
) -> Result<Described> {
    let ft = inode.file_type();
    let mut head = String::with_capacity(96);
    let _ = write!(
        head,
        "{} mode={:04o} uid={} gid={}",
        type_name(ft),
        inode.permissions(),
        inode.uid,
        inode.gid
    );
    if matches!(ft, FileType::Regular | FileType::Symlink) {
        let _ = write!(head, " size={}", inode.size);
    }
    let _ = write!(head, " mtime={}.{:09}", inode.mtime.sec, inode.mtime.nsec);
    if ft == FileType::Symlink {
        head.push_str(" target=");
        head.push_str(&escape(&tree.read_link(inode)?));
    }
    if matches!(ft, FileType::CharDev | FileType::BlockDev) {
        let _ = write!(head, " rdev={}:{}", inode.rdev_major(), inode.rdev_minor());
    }
    let mut tail = String::new();
    if ft == FileType::Regular {
        let ranges = data_ranges(tree.segments(inode))?;
        let mut reader = tree.reader(inode, verify);
        let b3 = content_hash(inode.size, ranges.iter().copied(), |off, buf| {
            reader.read_exact_at(off, buf)
        })?;
        let _ = write!(tail, " b3={b3}");
        if opts.holes {
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
    }
    xattrs.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    for x in xattrs.iter() {
        tail.push_str(" xattr:");
        tail.push_str(&escape_xattr_name(&x.name));
        tail.push('=');
        tail.push_str(&escape(&x.value));
    }
    Ok(Described {
        head,
        tail,
        linked: ft != FileType::Dir && inode.nlink > 1,
    })
}

/// The manifest of subvolume `tree` (header and lines, each ending in
/// `\n`), read from the devices alone. With `verify`, data checksums are
/// checked while hashing file contents.
///
/// # Errors
///
/// Tree and data read errors, corrupt items, checksum mismatches (with
/// `verify`).
pub fn manifest(tree: &FsTree<'_>, opts: Options, verify: bool) -> Result<String> {
    let mut described: HashMap<u64, Described> = HashMap::new();
    // dir -> (name, target)
    let mut children: HashMap<u64, Vec<(Vec<u8>, Target)>> = HashMap::new();
    let walk = WalkOptions {
        dir_entries: true,
        extents: false,
    };
    for group in tree.inodes(walk) {
        let mut g = group?;
        if g.inode.nlink == 0 {
            // An orphan: no names, not part of what the kernel shows.
            continue;
        }
        let d = describe(tree, &g.inode, &mut g.xattrs, opts, verify)?;
        described.insert(g.inode.ino, d);
        if !g.entries.is_empty() {
            children.insert(
                g.inode.ino,
                g.entries.into_iter().map(|e| (e.name, e.target)).collect(),
            );
        }
    }

    // (path bytes, line after the path, link key)
    let mut lines: Vec<(Vec<u8>, Option<u64>)> = Vec::new();
    let mut stack: Vec<(Vec<u8>, Target)> = vec![(Vec::new(), Target::Inode(tree.root_dir()))];
    while let Some((path, target)) = stack.pop() {
        match target {
            Target::Subvol(_) => lines.push((path, None)),
            Target::Inode(ino) => {
                // Descend into each directory once, even in a corrupt tree
                // where a directory contains itself.
                if let Some(kids) = children.remove(&ino) {
                    for (name, t) in kids {
                        let mut p = path.clone();
                        if !p.is_empty() {
                            p.push(b'/');
                        }
                        p.extend_from_slice(&name);
                        stack.push((p, t));
                    }
                }
                lines.push((path, Some(ino)));
            }
        }
    }
    lines.sort_unstable_by(|a, b| a.0.cmp(&b.0));

    let mut groups: HashMap<u64, String> = HashMap::new();
    let mut out = String::new();
    out.push_str(HEADER);
    out.push('\n');
    for (path, ino) in &lines {
        if path.is_empty() {
            out.push('.');
        } else {
            out.push_str(&escape(path));
        }
        out.push(' ');
        let Some(ino) = ino else {
            out.push_str("subvol\n");
            continue;
        };
        match described.get(ino) {
            Some(d) => {
                out.push_str(&d.head);
                if d.linked {
                    let name = groups.entry(*ino).or_insert_with(|| escape(path));
                    out.push_str(" link=");
                    out.push_str(name);
                }
                out.push_str(&d.tail);
            }
            None => {
                return Err(Error::corrupt(
                    Location::Tree(tree.id()),
                    CorruptKind::MissingItem {
                        what: "inode item of a directory entry",
                        key: inode_key(*ino),
                    },
                ));
            }
        }
        out.push('\n');
    }
    Ok(out)
}
