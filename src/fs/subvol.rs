//! Subvolumes: root items, their place in the tree of subvolumes, and
//! their paths — what `btrfs subvolume list` shows.
//!
//! Layout: `struct btrfs_root_item`, `btrfs_root_ref`, `btrfs_inode_ref`
//! (btrfs_tree.h). Paths are built as btrfs-progs
//! `cmds/subvolume-list.c` does: ROOT_BACKREF gives the parent subvolume,
//! the directory inode and the name; INODE_REFs in the parent's fs tree give
//! the directory's path. Subvolumes without a ROOT_BACKREF (deleted, being
//! cleaned) are skipped, as `btrfs subvolume list` skips them.

use std::collections::BTreeMap;

use zerocopy::FromBytes;

use crate::error::{CorruptKind, Error, Location, Result};
use crate::ondisk::{self, InodeExtref, InodeRef, RootItem, RootRef};
use crate::tree::key::Key;
use crate::tree::walk::{Cursor, ItemRef, TreeRoot, for_each_in_range};
use crate::types::{Generation, Logical, TreeId, Uuid};

use super::Filesystem;
use super::items::Timespec;

/// A decoded ROOT_ITEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootInfo {
    /// The tree id.
    pub id: TreeId,
    /// The key offset (snapshots: creation transid).
    pub key_offset: u64,
    /// Last update of the root item.
    pub generation: Generation,
    /// Root directory inode (256 for subvolumes).
    pub root_dirid: u64,
    /// Root node address.
    pub bytenr: Logical,
    /// Root node level.
    pub level: u8,
    /// `BTRFS_ROOT_SUBVOL_*` flags.
    pub flags: u64,
    /// 0 when deleted.
    pub refs: u32,
    /// Transid of the last snapshot of this root.
    pub last_snapshot: Generation,
    /// Whether the item has the v2 fields (uuid …), i.e. is not a legacy
    /// 239-byte item.
    pub has_v2_fields: bool,
    /// Whether `generation_v2 == generation` (the kernel trusts the v2
    /// fields only then).
    pub v2_current: bool,
    /// Subvolume UUID (nil for legacy items).
    pub uuid: Uuid,
    /// Snapshot source UUID.
    pub parent_uuid: Uuid,
    /// Received UUID.
    pub received_uuid: Uuid,
    /// Last change transid.
    pub ctransid: Generation,
    /// Creation transid.
    pub otransid: Generation,
    /// Sender's ctransid.
    pub stransid: Generation,
    /// Receive transid.
    pub rtransid: Generation,
    /// When the subvolume last changed (`ctime`; zero in a legacy item).
    pub ctime: Timespec,
    /// When it was created (`otime`, what `btrfs subvolume show` calls
    /// "Creation time"; zero in a legacy item and for the top level).
    pub otime: Timespec,
    /// When it was sent, for a received subvolume (`stime`; else zero).
    pub stime: Timespec,
    /// When it was received (`rtime`; else zero).
    pub rtime: Timespec,
}

impl RootInfo {
    /// Decode a ROOT_ITEM (full or legacy size).
    ///
    /// # Errors
    ///
    /// [`CorruptKind::BadSize`] for other sizes.
    pub fn parse(item: &ItemRef<'_>) -> Result<RootInfo> {
        let size = item.data.len();
        let mut buf = [0u8; size_of::<RootItem>()];
        if size != RootItem::LEGACY_SIZE && size != buf.len() {
            return Err(Error::corrupt(
                item.location(),
                CorruptKind::BadSize {
                    what: "root item",
                    found: u64::try_from(size).unwrap_or(u64::MAX),
                    expected: u64::try_from(buf.len()).unwrap_or(u64::MAX),
                },
            ));
        }
        // A legacy item is the prefix of a full one; the rest reads as zero.
        if let Some(dst) = buf.get_mut(..size) {
            dst.copy_from_slice(item.data);
        }
        let r = RootItem::read_from_bytes(&buf).map_err(|_| {
            Error::corrupt(
                item.location(),
                CorruptKind::BadSize {
                    what: "root item",
                    found: 0,
                    expected: 439,
                },
            )
        })?;
        let has_v2_fields = size > RootItem::LEGACY_SIZE;
        Ok(RootInfo {
            id: TreeId(item.key.objectid),
            key_offset: item.key.offset,
            generation: Generation(r.generation.get()),
            root_dirid: r.root_dirid.get(),
            bytenr: Logical(r.bytenr.get()),
            level: r.level,
            flags: r.flags.get(),
            refs: r.refs.get(),
            last_snapshot: Generation(r.last_snapshot.get()),
            has_v2_fields,
            v2_current: has_v2_fields && r.generation_v2.get() == r.generation.get(),
            uuid: Uuid(r.uuid),
            parent_uuid: Uuid(r.parent_uuid),
            received_uuid: Uuid(r.received_uuid),
            ctransid: Generation(r.ctransid.get()),
            otransid: Generation(r.otransid.get()),
            stransid: Generation(r.stransid.get()),
            rtransid: Generation(r.rtransid.get()),
            ctime: Timespec::from(&r.ctime),
            otime: Timespec::from(&r.otime),
            stime: Timespec::from(&r.stime),
            rtime: Timespec::from(&r.rtime),
        })
    }

    /// Where the tree starts.
    pub fn tree_root(&self) -> TreeRoot {
        TreeRoot {
            tree: self.id,
            logical: self.bytenr,
            level: self.level,
            generation: self.generation,
        }
    }

    /// Whether the subvolume is read-only.
    pub fn is_readonly(&self) -> bool {
        self.flags & ondisk::BTRFS_ROOT_SUBVOL_RDONLY != 0
    }
}

/// A subvolume as `btrfs subvolume list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subvolume {
    /// Its root item.
    pub root: RootInfo,
    /// The subvolume containing it ("top level" in btrfs-progs).
    pub parent: TreeId,
    /// The directory inode in the parent holding its entry.
    pub dirid: u64,
    /// Its name in that directory.
    pub name: Vec<u8>,
    /// Its path from the top-level subvolume (5), without a leading `/`.
    pub path: Vec<u8>,
}

impl Subvolume {
    /// The id.
    pub fn id(&self) -> TreeId {
        self.root.id
    }

    /// The UUID a send stream carries for it (SUBVOL, SNAPSHOT, CLONE):
    /// its received UUID if it has one (it was itself received), else its
    /// own, as the kernel's `btrfs send` does.
    pub fn stream_uuid(&self) -> [u8; 16] {
        if self.root.received_uuid.is_nil() {
            self.root.uuid.0
        } else {
            self.root.received_uuid.0
        }
    }
}

/// A ROOT_BACKREF: where a subvolume is linked.
#[derive(Debug, Clone)]
struct Backref {
    parent: TreeId,
    dirid: u64,
    name: Vec<u8>,
}

fn parse_root_ref(item: &ItemRef<'_>) -> Result<Backref> {
    let (raw, rest) =
        RootRef::ref_from_prefix(item.data).map_err(|_| item.truncated("root ref", 18))?;
    let n = usize::from(raw.name_len.get());
    let name = rest
        .get(..n)
        .ok_or_else(|| item.truncated("root ref name", 18usize.saturating_add(n)))?;
    Ok(Backref {
        parent: TreeId(item.key.offset),
        dirid: raw.dirid.get(),
        name: name.to_vec(),
    })
}

/// The first name of inode `ino` in the fs tree `root`: (parent dir, name).
fn first_ref(fs: &Filesystem, root: TreeRoot, ino: u64) -> Result<Option<(u64, Vec<u8>)>> {
    let mut cursor = Cursor::new(fs.volume(), root);
    cursor.seek(&Key::new(ino, ondisk::BTRFS_INODE_REF_KEY, 0))?;
    let Some(item) = cursor.current() else {
        return Ok(None);
    };
    if item.key.objectid != ino {
        return Ok(None);
    }
    match item.key.item_type {
        ondisk::BTRFS_INODE_REF_KEY => {
            let (raw, rest) = InodeRef::ref_from_prefix(item.data)
                .map_err(|_| item.truncated("inode ref", 10))?;
            let n = usize::from(raw.name_len.get());
            let name = rest
                .get(..n)
                .ok_or_else(|| item.truncated("inode ref name", 10usize.saturating_add(n)))?;
            Ok(Some((item.key.offset, name.to_vec())))
        }
        ondisk::BTRFS_INODE_EXTREF_KEY => {
            let (raw, rest) = InodeExtref::ref_from_prefix(item.data)
                .map_err(|_| item.truncated("inode extref", 18))?;
            let n = usize::from(raw.name_len.get());
            let name = rest
                .get(..n)
                .ok_or_else(|| item.truncated("inode extref name", 18usize.saturating_add(n)))?;
            Ok(Some((raw.parent_objectid.get(), name.to_vec())))
        }
        _ => Ok(None),
    }
}

/// Path of directory `dirid` inside the subvolume tree `root`, relative to
/// its root directory, with a trailing `/` when not empty.
fn dir_path(fs: &Filesystem, root: TreeRoot, dirid: u64) -> Result<Vec<u8>> {
    let mut parts: Vec<Vec<u8>> = Vec::new();
    let mut ino = dirid;
    while ino != ondisk::BTRFS_FIRST_FREE_OBJECTID {
        if parts.len() > 4096 {
            return Err(Error::corrupt(
                Location::Tree(root.tree),
                CorruptKind::Loop {
                    what: "inode ref",
                    objectid: ino,
                },
            ));
        }
        let Some((parent, name)) = first_ref(fs, root, ino)? else {
            return Err(Error::corrupt(
                Location::Tree(root.tree),
                CorruptKind::MissingItem {
                    what: "inode ref",
                    key: Key::new(ino, ondisk::BTRFS_INODE_REF_KEY, 0),
                },
            ));
        };
        parts.push(name);
        ino = parent;
    }
    let mut out = Vec::new();
    for part in parts.iter().rev() {
        out.extend_from_slice(part);
        out.push(b'/');
    }
    Ok(out)
}

/// List the subvolumes (not the top level, id 5), ordered by id.
///
/// # Errors
///
/// Tree read errors, malformed items, broken reference chains.
pub fn list_subvolumes(fs: &Filesystem) -> Result<Vec<Subvolume>> {
    let mut roots: BTreeMap<TreeId, RootInfo> = BTreeMap::new();
    let mut backrefs: BTreeMap<TreeId, Backref> = BTreeMap::new();
    let first = Key::new(ondisk::BTRFS_FIRST_FREE_OBJECTID, 0, 0);
    let last = Key::new(ondisk::BTRFS_LAST_FREE_OBJECTID, u8::MAX, u64::MAX);
    for_each_in_range(
        fs.volume(),
        fs.volume().root_tree(),
        &first,
        &last,
        |item| {
            match item.key.item_type {
                ondisk::BTRFS_ROOT_ITEM_KEY => {
                    let info = RootInfo::parse(&item)?;
                    roots.entry(info.id).or_insert(info);
                }
                // A subvolume has at most one backref; keep the first.
                ondisk::BTRFS_ROOT_BACKREF_KEY => {
                    let r = parse_root_ref(&item)?;
                    backrefs.entry(TreeId(item.key.objectid)).or_insert(r);
                }
                _ => {}
            }
            Ok(())
        },
    )?;

    let fs_root = fs.tree_root(TreeId::FS)?;
    let mut paths: BTreeMap<TreeId, Vec<u8>> = BTreeMap::new();
    paths.insert(TreeId::FS, Vec::new());
    let mut out = Vec::new();
    for (id, root) in &roots {
        if root.refs == 0 || !backrefs.contains_key(id) {
            continue;
        }
        // Walk up to a subvolume whose path is known, then come back down.
        let mut chain = vec![*id];
        let mut cur = *id;
        while let Some(b) = backrefs.get(&cur) {
            if paths.contains_key(&b.parent) {
                break;
            }
            if chain.len() > roots.len() || chain.contains(&b.parent) {
                return Err(Error::corrupt(
                    Location::Tree(TreeId::ROOT),
                    CorruptKind::Loop {
                        what: "root backref",
                        objectid: b.parent.get(),
                    },
                ));
            }
            chain.push(b.parent);
            cur = b.parent;
        }
        let mut orphaned = false;
        for sub in chain.iter().rev() {
            let Some(b) = backrefs.get(sub) else {
                orphaned = true;
                break;
            };
            let Some(parent_path) = paths.get(&b.parent).cloned() else {
                orphaned = true;
                break;
            };
            let parent_root = if b.parent == TreeId::FS {
                fs_root
            } else {
                match roots.get(&b.parent) {
                    Some(r) => r.tree_root(),
                    None => {
                        orphaned = true;
                        break;
                    }
                }
            };
            let mut path = parent_path;
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend(dir_path(fs, parent_root, b.dirid)?);
            path.extend_from_slice(&b.name);
            paths.insert(*sub, path);
        }
        if orphaned {
            // Linked below a subvolume that is gone: unreachable, skip.
            continue;
        }
        let (Some(b), Some(path)) = (backrefs.get(id), paths.get(id)) else {
            continue;
        };
        out.push(Subvolume {
            root: root.clone(),
            parent: b.parent,
            dirid: b.dirid,
            name: b.name.clone(),
            path: path.clone(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(data: &[u8]) -> ItemRef<'_> {
        ItemRef {
            key: Key::new(257, ondisk::BTRFS_ROOT_ITEM_KEY, 8),
            data,
            leaf: Logical(30408704),
            tree: TreeId::ROOT,
            slot: 3,
            block: None,
        }
    }

    fn root_item(generation: u64, generation_v2: u64) -> Vec<u8> {
        let mut b = vec![0u8; 439];
        b[0xA0..0xA8].copy_from_slice(&generation.to_le_bytes());
        b[0xB0..0xB8].copy_from_slice(&30425088u64.to_le_bytes());
        b[0xD0] = 1; // RDONLY
        b[0xD8] = 1; // refs
        b[0xEE] = 2; // level
        b[0xEF..0xF7].copy_from_slice(&generation_v2.to_le_bytes());
        b[0xF7] = 0xAB; // uuid[0]
        b[0x127..0x12F].copy_from_slice(&42u64.to_le_bytes()); // ctransid
        b
    }

    #[test]
    fn full_root_item() {
        let b = root_item(9, 9);
        let r = RootInfo::parse(&item(&b)).unwrap();
        assert_eq!(
            (r.id, r.key_offset, r.generation),
            (TreeId(257), 8, Generation(9))
        );
        assert_eq!((r.bytenr, r.level, r.refs), (Logical(30425088), 2, 1));
        assert!(r.is_readonly() && r.has_v2_fields && r.v2_current);
        assert_eq!(r.uuid.0[0], 0xAB);
        assert_eq!(r.ctransid, Generation(42));
        let t = r.tree_root();
        assert_eq!(
            (t.logical, t.level, t.generation),
            (Logical(30425088), 2, Generation(9))
        );
        // Written by an old kernel, then updated: v2 fields are stale.
        assert!(!RootInfo::parse(&item(&root_item(9, 5))).unwrap().v2_current);
    }

    #[test]
    fn legacy_root_item() {
        let b = root_item(9, 9);
        let r = RootInfo::parse(&item(&b[..RootItem::LEGACY_SIZE])).unwrap();
        assert!(!r.has_v2_fields && !r.v2_current);
        assert!(r.uuid.is_nil());
        assert_eq!(r.generation, Generation(9));
    }

    #[test]
    fn bad_root_item_size() {
        let b = root_item(9, 9);
        let e = RootInfo::parse(&item(&b[..300])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "corrupt item 3 key (257 ROOT_ITEM 8) in leaf at logical 30408704 (tree 1): bad root item size 300, expected 439"
        );
    }
}
