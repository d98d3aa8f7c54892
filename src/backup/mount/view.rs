//! The directories `backup mount` makes of the catalog, and the inode
//! numbers of everything it shows.
//!
//! ```text
//! MOUNTPOINT/uuid/UUID/                   the root of each stored snapshot
//! MOUNTPOINT/snapshots/ORIGIN/PATH        -> ../../uuid/UUID
//! MOUNTPOINT/time/YYYY-MM-DDTHH:MM:SSZ    -> ../uuid/UUID
//! ```
//!
//! Names come from the catalog, which a hostile store may have written:
//! each is made one harmless path component ([`component`]). A snapshot
//! stored twice (one UUID, several entries) is shown once, from its
//! newest entry, as [`find`](crate::backup::find) picks one by UUID.
//!
//! Inode numbers: this view's own directories and links have numbers below
//! 2^[`INO_BITS`]; a snapshot's inode `ino` of entry `id` is
//! `id << INO_BITS | ino`, so every name of a hard link has one number,
//! and the same file has the same number in every mount of the catalog.

use std::collections::BTreeMap;

use crate::backup::Entry;
use crate::backup::index::model::ROOT_INO;

/// Bits of a FUSE inode number that hold a snapshot's own inode number.
pub const INO_BITS: u32 = 40;

/// Entry ids a snapshot may have (its id is the top bits of its numbers).
const MAX_ID: u64 = (1 << (64 - INO_BITS)) - 1;

/// The mount's root (FUSE's root is always 1).
pub const ROOT: u64 = 1;
/// `uuid/`.
pub const UUID_DIR: u64 = 2;
/// `snapshots/`.
pub const SNAPSHOTS_DIR: u64 = 3;
/// `time/`.
pub const TIME_DIR: u64 = 4;

/// The longest name a component may have (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// The FUSE inode number of inode `ino` of the snapshot of entry `id`;
/// `None` when either is out of range (an index that names such an inode
/// is damaged).
pub fn fuse_ino(id: u64, ino: u64) -> Option<u64> {
    (id != 0 && id <= MAX_ID && ino != 0 && ino >> INO_BITS == 0).then_some(id << INO_BITS | ino)
}

/// What a FUSE inode number names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ino {
    /// A directory or link of this view.
    View(u64),
    /// Inode `ino` of the snapshot of entry `id`.
    Snapshot {
        /// The entry.
        id: u64,
        /// The index's inode number.
        ino: u64,
    },
}

/// Split a FUSE inode number.
pub fn split(n: u64) -> Ino {
    match n >> INO_BITS {
        0 => Ino::View(n),
        id => Ino::Snapshot {
            id,
            ino: n & ((1 << INO_BITS) - 1),
        },
    }
}

/// One of the view's own nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A directory: its parent and its entries, sorted by name, each a
    /// FUSE inode number (a snapshot's root for the entries of `uuid/`).
    Dir {
        /// The parent directory.
        parent: u64,
        /// Name and inode number, sorted by name.
        entries: Vec<(Vec<u8>, u64)>,
    },
    /// A symbolic link to a snapshot's root.
    Link {
        /// The target, relative to the link's directory.
        target: Vec<u8>,
        /// The snapshot's time (seconds since the epoch), if the catalog's
        /// parses.
        time: Option<i64>,
    },
}

/// A snapshot the view shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    /// Its catalog entry (the newest of its UUID).
    pub entry: usize,
    /// Its name under `uuid/`.
    pub name: Vec<u8>,
}

/// The view of one catalog.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// The view's nodes; node `n` is `nodes[n - 1]`.
    nodes: Vec<Node>,
    /// The snapshots shown, by entry id.
    pub snapshots: BTreeMap<u64, Shown>,
}

/// `raw` as one path component: `/`, `%`, `~`, NUL and the other control
/// characters as `%XX`; empty, `.` and `..` escaped whole. A name longer
/// than 255 bytes (`NAME_MAX`) is cut later, at a character boundary, and
/// given `~ID` (see [`View::new`]).
pub fn component(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    if raw.is_empty() {
        return b"%".to_vec();
    }
    if raw == b"." || raw == b".." {
        for _ in raw {
            out.extend_from_slice(b"%2E");
        }
        return out;
    }
    for &b in raw {
        if b < 0x20 || b == 0x7f || b == b'/' || b == b'%' || b == b'~' {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

/// `name` cut so that `suffix` fits after it in [`NAME_MAX`] bytes, then
/// `suffix`.
fn with_suffix(name: &[u8], suffix: &[u8]) -> Vec<u8> {
    let mut keep = name.len().min(NAME_MAX.saturating_sub(suffix.len()));
    // Do not cut a UTF-8 character in two.
    while keep > 0 && keep < name.len() && name[keep] & 0xc0 == 0x80 {
        keep -= 1;
    }
    let mut out = name[..keep].to_vec();
    out.extend_from_slice(suffix);
    out
}

/// Add `name` (for entry `id`) to `dir`: as it is if it is free and fits,
/// else cut and followed by `~ID` (`~` is escaped in every name, so the
/// suffix makes it unique).
fn add_unique(dir: &mut BTreeMap<Vec<u8>, u64>, name: Vec<u8>, id: u64, ino: u64) -> Vec<u8> {
    let name = if name.len() <= NAME_MAX && !dir.contains_key(&name) {
        name
    } else {
        with_suffix(&name, format!("~{id}").as_bytes())
    };
    dir.insert(name.clone(), ino);
    name
}

/// The name of a snapshot's time: `YYYY-MM-DDTHH:MM:SSZ` (UTC), or the
/// catalog's text escaped if it does not parse.
fn time_name(e: &Entry) -> (Vec<u8>, Option<i64>) {
    match e.timestamp() {
        Some(t) => (
            t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string().into_bytes(),
            Some(t.as_second()),
        ),
        None => (component(e.time.as_bytes()), None),
    }
}

impl View {
    /// The view of `entries` (a catalog's), and what it leaves out and why.
    pub fn new(entries: &[Entry]) -> (View, Vec<String>) {
        let mut notes = Vec::new();
        // The newest entry of each UUID.
        let mut by_uuid: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, e) in entries.iter().enumerate() {
            if fuse_ino(e.id, ROOT_INO).is_none() {
                notes.push(format!(
                    "entry {} is not shown: its id is out of the range a mount can number (1 to {MAX_ID})",
                    e.id
                ));
                continue;
            }
            match by_uuid.get(e.uuid.as_str()) {
                Some(&j) if entries[j].id > e.id => {}
                _ => {
                    by_uuid.insert(&e.uuid, i);
                }
            }
        }
        let mut order: Vec<usize> = by_uuid.into_values().collect();
        order.sort_by_key(|&i| entries[i].id);

        let mut uuids: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        let mut origins: BTreeMap<Vec<u8>, BTreeMap<Vec<u8>, u64>> = BTreeMap::new();
        let mut times: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        let mut view = View::default();
        // Nodes 1 to 4; their entries are filled in at the end.
        for parent in [ROOT, ROOT, ROOT, ROOT] {
            view.nodes.push(Node::Dir {
                parent,
                entries: Vec::new(),
            });
        }
        for i in order {
            let e = &entries[i];
            // OK to unwrap: checked above.
            let root = fuse_ino(e.id, ROOT_INO).unwrap_or_default();
            let name = add_unique(&mut uuids, component(e.uuid.as_bytes()), e.id, root);
            view.snapshots.insert(
                e.id,
                Shown {
                    entry: i,
                    name: name.clone(),
                },
            );
            let (time_text, secs) = time_name(e);
            let mut target = b"../../uuid/".to_vec();
            target.extend_from_slice(&name);
            let link = view.push(Node::Link {
                target: target.clone(),
                time: secs,
            });
            let path = e.path.trim_start_matches('/');
            add_unique(
                origins.entry(component(e.origin.as_bytes())).or_default(),
                component(path.as_bytes()),
                e.id,
                link,
            );
            let link = view.push(Node::Link {
                target: target[3..].to_vec(),
                time: secs,
            });
            add_unique(&mut times, time_text, e.id, link);
        }
        let mut origin_dirs = BTreeMap::new();
        for (name, links) in origins {
            let dir = view.push(Node::Dir {
                parent: SNAPSHOTS_DIR,
                entries: links.into_iter().collect(),
            });
            origin_dirs.insert(name, dir);
        }
        view.nodes[0] = Node::Dir {
            parent: ROOT,
            entries: vec![
                (b"snapshots".to_vec(), SNAPSHOTS_DIR),
                (b"time".to_vec(), TIME_DIR),
                (b"uuid".to_vec(), UUID_DIR),
            ],
        };
        view.nodes[1] = Node::Dir {
            parent: ROOT,
            entries: uuids.into_iter().collect(),
        };
        view.nodes[2] = Node::Dir {
            parent: ROOT,
            entries: origin_dirs.into_iter().collect(),
        };
        view.nodes[3] = Node::Dir {
            parent: ROOT,
            entries: times.into_iter().collect(),
        };
        (view, notes)
    }

    fn push(&mut self, node: Node) -> u64 {
        self.nodes.push(node);
        self.nodes.len() as u64
    }

    /// Node `n` of the view.
    pub fn node(&self, n: u64) -> Option<&Node> {
        self.nodes.get(usize::try_from(n.checked_sub(1)?).ok()?)
    }

    /// The entry `name` of the view's directory `dir`.
    pub fn lookup(&self, dir: u64, name: &[u8]) -> Option<u64> {
        match self.node(dir)? {
            Node::Dir { entries, .. } => entries
                .binary_search_by(|(n, _)| n.as_slice().cmp(name))
                .ok()
                .map(|i| entries[i].1),
            Node::Link { .. } => None,
        }
    }

    /// The snapshot of entry `id`, if the view shows it.
    pub fn shown(&self, id: u64) -> Option<&Shown> {
        self.snapshots.get(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64, uuid: &str, origin: &str, path: &str, time: &str) -> Entry {
        Entry {
            id,
            path: path.into(),
            uuid: uuid.into(),
            ctransid: 1,
            parent_uuid: None,
            parent_ctransid: None,
            parent_id: None,
            kind: crate::backup::Kind::Full,
            time: time.into(),
            origin: origin.into(),
            file: format!("streams/{id}.btrs.zst"),
            stream_bytes: 0,
            stored_bytes: 0,
            stream_blake3: String::new(),
            commands: 0,
            proto: 2,
            stored_at: time.into(),
            synthesized_from: None,
        }
    }

    #[test]
    fn components_cannot_leave_their_directory() {
        assert_eq!(component(b"a/b"), b"a%2Fb");
        assert_eq!(component(b".."), b"%2E%2E");
        assert_eq!(component(b"."), b"%2E");
        assert_eq!(component(b""), b"%");
        assert_eq!(component(b"a\0b\n%~"), b"a%00b%0A%25%7E");
        assert_eq!(component("é @x".as_bytes()), "é @x".as_bytes());
        let long = "é".repeat(200);
        let cut = with_suffix(long.as_bytes(), b"~7");
        assert!(cut.len() <= NAME_MAX && std::str::from_utf8(&cut).is_ok());
        assert!(cut.ends_with(b"~7"));
    }

    #[test]
    fn inode_numbers_split_back_and_refuse_what_does_not_fit() {
        assert_eq!(fuse_ino(3, 256), Some(3 << 40 | 256));
        assert_eq!(split(3 << 40 | 256), Ino::Snapshot { id: 3, ino: 256 });
        assert_eq!(split(4), Ino::View(4));
        assert_eq!(fuse_ino(0, 256), None);
        assert_eq!(fuse_ino(1, 1 << 40), None);
        assert_eq!(fuse_ino(1, 0), None);
        assert_eq!(fuse_ino(MAX_ID + 1, 256), None);
        assert!(fuse_ino(MAX_ID, (1 << 40) - 1).is_some());
    }

    #[test]
    fn the_view_names_each_uuid_once_and_every_name_is_unique() {
        let t = "2026-01-02T03:04:05Z";
        let entries = vec![
            entry(1, "u-1", "home", "/snaps/home.1", t),
            entry(2, "u-2", "home", "/snaps/home.1", t),
            entry(3, "u-1", "home", "/snaps/home.1", t),
            entry(4, "../x", "a/b", "..", "not a time"),
            entry(1 << 24, "u-big", "home", "/big", t),
        ];
        let (v, notes) = View::new(&entries);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert_eq!(v.snapshots.keys().copied().collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(v.lookup(UUID_DIR, b"u-1"), fuse_ino(3, ROOT_INO));
        assert_eq!(v.lookup(UUID_DIR, b"u-2"), fuse_ino(2, ROOT_INO));
        assert_eq!(v.lookup(UUID_DIR, b"..%2Fx"), fuse_ino(4, ROOT_INO));
        let home = v.lookup(SNAPSHOTS_DIR, b"home").unwrap();
        let first = v.lookup(home, b"snaps%2Fhome.1").unwrap();
        let second = v.lookup(home, b"snaps%2Fhome.1~3").unwrap();
        let Some(Node::Link { target, .. }) = v.node(first) else {
            panic!()
        };
        assert_eq!(target, b"../../uuid/u-2");
        let Some(Node::Link { target, .. }) = v.node(second) else {
            panic!()
        };
        assert_eq!(target, b"../../uuid/u-1");
        let odd = v.lookup(SNAPSHOTS_DIR, b"a%2Fb").unwrap();
        assert!(v.lookup(odd, b"%2E%2E").is_some());
        assert!(v.lookup(TIME_DIR, b"2026-01-02T03:04:05Z").is_some());
        assert!(v.lookup(TIME_DIR, b"2026-01-02T03:04:05Z~3").is_some());
        let Some(Node::Link { target, .. }) = v.node(v.lookup(TIME_DIR, b"not a time").unwrap())
        else {
            panic!()
        };
        assert_eq!(target, b"../uuid/..%2Fx");
        for n in 1..=v.nodes.len() as u64 {
            if let Some(Node::Dir { entries, .. }) = v.node(n) {
                for (name, _) in entries {
                    assert!(!name.contains(&b'/') && !name.contains(&0) && name.len() <= NAME_MAX);
                    assert!(name != b"." && name != b"..");
                }
            }
        }
    }
}
