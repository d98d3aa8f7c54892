//! The core error type.
//!
//! Shaped like ext4-view's `src/error.rs`: [`Error::Io`] (the device failed),
//! [`Error::Corrupt`] (the image is wrong), [`Error::Unsupported`] (valid,
//! but not handled). Every corruption carries its [`Location`]: device,
//! physical or logical address, tree, key. Messages follow btrfs-progs'
//! conventions: lowercase, no trailing period, what then where, e.g.
//! `corrupt leaf at logical 30408704 (tree 5): item 12 ends at 16400, past
//! leaf end 16283`.
//!
//! Every message is complete on its own: a cause (an OS error, a corrupt
//! block behind a send error) is part of the message and is *not* also
//! returned by `source()`, since `main` prints `{err:#}`, which appends each
//! `source()` — a cause in both places would be printed twice. The errors of
//! the whole workspace follow this rule; `tests/integration/corruption.rs`
//! checks it on thousands of damaged images.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::csum::{Csum, CsumType};
use crate::key::Key;
use crate::types::{DevId, Generation, Logical, Physical, TreeId, Uuid};

/// Result with the core [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while reading a filesystem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A device could not be opened.
    #[error("cannot open {}: {error}{}", device.display(), Hint(hint.as_deref()))]
    Open {
        /// The path given.
        device: PathBuf,
        /// What the OS said (part of the message, not a `source()`).
        error: io::Error,
        /// What would make it work (for a permission error on a block
        /// device: root, or read access through the group owning it).
        hint: Option<String>,
    },
    /// A read failed (or hit the end of the device).
    #[error("read error on {} at physical {offset}: {error}", device.display())]
    Io {
        /// The device.
        device: PathBuf,
        /// Where the read started.
        offset: Physical,
        /// What the OS said (part of the message, not a `source()`).
        error: io::Error,
    },
    /// The filesystem is damaged.
    #[error(transparent)]
    Corrupt(Box<Corrupt>),
    /// The device or image holds no btrfs: no superblock copy carries the
    /// magic, or it is too short to hold the primary copy.
    #[error("not a btrfs filesystem: {} ({why})", device.display())]
    NotBtrfs {
        /// The device.
        device: PathBuf,
        /// What was found instead.
        why: NotBtrfs,
    },
    /// Every superblock copy of a device is bad (at least one looks like
    /// btrfs): each copy's failure, primary first.
    #[error(
        "every superblock copy on {} is bad: {}",
        device.display(),
        SuperCopies(copies)
    )]
    Superblocks {
        /// The device.
        device: PathBuf,
        /// Where each copy was read and why it was refused.
        copies: Vec<(Physical, Error)>,
    },
    /// Every copy of a tree block is bad: each copy's failure, in copy
    /// order (DUP and RAID1 keep two or more).
    #[error("{}", BlockCopies(*logical, *tree, failures))]
    TreeBlockCopies {
        /// The block.
        logical: Logical,
        /// The tree being read.
        tree: TreeId,
        /// Why each copy was refused, copy 1 first.
        failures: Vec<Error>,
    },
    /// The filesystem is valid but uses something not handled.
    #[error(transparent)]
    Unsupported(Unsupported),
    /// A device holding data we need was not given.
    #[error("missing device: devid {devid} uuid {uuid} is needed to read logical {logical}")]
    MissingDevice {
        /// Its device id.
        devid: DevId,
        /// Its device UUID.
        uuid: Uuid,
        /// The first address we could not read without it.
        logical: Logical,
    },
    /// The devices given do not form one filesystem.
    #[error(transparent)]
    DeviceSet(DeviceSetError),
}

impl Error {
    /// A corruption error.
    pub fn corrupt(location: Location, kind: CorruptKind) -> Error {
        Error::Corrupt(Box::new(Corrupt { location, kind }))
    }

    /// The corruption details, if this is one.
    pub fn as_corrupt(&self) -> Option<&Corrupt> {
        match self {
            Error::Corrupt(c) => Some(c),
            _ => None,
        }
    }
}

/// Why a device is not btrfs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotBtrfs {
    /// Shorter than the end of the primary superblock.
    TooShort {
        /// Its size in bytes.
        size: u64,
    },
    /// No copy that fits on the device has the magic.
    NoMagic {
        /// Where the copies were looked for.
        copies: Vec<Physical>,
    },
}

impl fmt::Display for NotBtrfs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotBtrfs::TooShort { size } => write!(
                f,
                "{size} bytes, too short to hold a superblock: the primary copy ends at byte 69632"
            ),
            NotBtrfs::NoMagic { copies } => {
                f.write_str("no btrfs superblock magic at physical ")?;
                for (i, p) in copies.iter().enumerate() {
                    match i {
                        0 => {}
                        i if i + 1 == copies.len() => f.write_str(" or ")?,
                        _ => f.write_str(", ")?,
                    }
                    write!(f, "{p}")?;
                }
                Ok(())
            }
        }
    }
}

/// One copy's failure without the location the outer message already
/// gives: the corruption kind for a corruption of that very place, else the
/// whole error.
fn fmt_copy_failure(f: &mut fmt::Formatter<'_>, e: &Error, same_place: bool) -> fmt::Result {
    match e {
        Error::Corrupt(c) if same_place => write!(f, "{}", c.kind),
        e => write!(f, "{e}"),
    }
}

/// `primary at physical 65536: …; mirror 1 at physical 67108864: …`.
struct SuperCopies<'a>(&'a [(Physical, Error)]);

impl fmt::Display for SuperCopies<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (physical, e)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            match i {
                0 => write!(f, "primary at physical {physical}: ")?,
                i => write!(f, "mirror {i} at physical {physical}: ")?,
            }
            let same = matches!(e, Error::Corrupt(c)
                if matches!(&c.location, Location::Superblock { physical: p, .. } if p == physical));
            fmt_copy_failure(f, e, same)?;
        }
        Ok(())
    }
}

/// `all 2 copies of tree block at logical L (tree T) are bad: copy 1: …;
/// copy 2: …`, or when every copy failed alike, that failure once and
/// `(the same in all 2 copies)`.
struct BlockCopies<'a>(Logical, TreeId, &'a [Error]);

impl fmt::Display for BlockCopies<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.2.len();
        let texts: Vec<String> = self.2.iter().map(ToString::to_string).collect();
        if let Some(first) = texts.first()
            && texts.iter().all(|t| t == first)
        {
            return write!(f, "{first} (the same in all {n} copies)");
        }
        write!(
            f,
            "all {n} copies of tree block at logical {} (tree {}) are bad: ",
            self.0, self.1
        )?;
        for (i, e) in self.2.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "copy {}: ", i.saturating_add(1))?;
            let same = matches!(e, Error::Corrupt(c)
                if matches!(c.location, Location::TreeBlock { logical, .. } if logical == self.0));
            fmt_copy_failure(f, e, same)?;
        }
        Ok(())
    }
}

/// `: HINT`, or nothing.
struct Hint<'a>(Option<&'a str>);

impl fmt::Display for Hint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(h) => write!(f, ": {h}"),
            None => Ok(()),
        }
    }
}

/// A corruption and where it was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupt {location}: {kind}")]
pub struct Corrupt {
    /// Where.
    pub location: Location,
    /// What.
    pub kind: CorruptKind,
}

/// Where a corruption was found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Location {
    /// A superblock copy.
    Superblock {
        /// The device.
        device: PathBuf,
        /// Where the copy was read.
        physical: Physical,
    },
    /// The `sys_chunk_array` of a superblock.
    SysChunkArray {
        /// The device.
        device: PathBuf,
        /// Byte offset inside the array.
        offset: usize,
    },
    /// A tree block.
    TreeBlock {
        /// Its logical address.
        logical: Logical,
        /// The tree being read.
        tree: TreeId,
        /// Its level, when known (prints "leaf"/"node").
        level: Option<u8>,
    },
    /// One item of a leaf.
    Item {
        /// The leaf.
        leaf: Logical,
        /// The tree being read.
        tree: TreeId,
        /// The slot in the leaf.
        slot: u32,
        /// The item's key.
        key: Key,
    },
    /// A tree, with no particular block.
    Tree(TreeId),
    /// A logical address.
    Logical(Logical),
    /// File data: an inode's bytes at a file offset, read from a logical
    /// address on one mirror.
    FileData {
        /// The subvolume tree.
        tree: TreeId,
        /// The inode.
        ino: u64,
        /// The file offset of the first bad byte (or of the extent).
        file_offset: u64,
        /// The logical address read.
        logical: Logical,
        /// Which copy (1-based), and how many there are.
        mirror: (usize, usize),
    },
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Superblock { device, physical } => {
                write!(
                    f,
                    "superblock on {} at physical {physical}",
                    device.display()
                )
            }
            Location::SysChunkArray { device, offset } => {
                write!(
                    f,
                    "sys_chunk_array of superblock on {} at byte {offset}",
                    device.display()
                )
            }
            Location::TreeBlock {
                logical,
                tree,
                level,
            } => {
                let what = match level {
                    Some(0) => "leaf",
                    Some(_) => "node",
                    None => "tree block",
                };
                write!(f, "{what} at logical {logical} (tree {tree})")
            }
            Location::Item {
                leaf,
                tree,
                slot,
                key,
            } => {
                write!(
                    f,
                    "item {slot} key {key} in leaf at logical {leaf} (tree {tree})"
                )
            }
            Location::Tree(tree) => write!(f, "tree {tree}"),
            Location::Logical(l) => write!(f, "logical {l}"),
            Location::FileData {
                tree,
                ino,
                file_offset,
                logical,
                mirror: (mirror, copies),
            } => write!(
                f,
                "data of inode {ino} at file offset {file_offset} (tree {tree}, logical {logical}, mirror {mirror} of {copies})"
            ),
        }
    }
}

/// What is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CorruptKind {
    /// Not a btrfs superblock.
    #[error("bad magic 0x{found:016x}, expected _BHRfS_M")]
    BadMagic {
        /// The magic found.
        found: u64,
    },
    /// Checksum does not match the contents.
    #[error("{algo} checksum mismatch: stored {stored}, computed {computed}")]
    ChecksumMismatch {
        /// The algorithm.
        algo: CsumType,
        /// The stored value.
        stored: Csum,
        /// The value of the contents.
        computed: Csum,
    },
    /// The block or copy says it lives elsewhere.
    #[error("bytenr mismatch: expected {expected}, found {found}")]
    BytenrMismatch {
        /// Where it was read.
        expected: u64,
        /// What it says.
        found: u64,
    },
    /// A tree block of another filesystem.
    #[error("fsid mismatch: expected {expected}, found {found}")]
    FsidMismatch {
        /// Our metadata UUID.
        expected: Uuid,
        /// The header's.
        found: Uuid,
    },
    /// A tree block with another chunk tree UUID.
    #[error("chunk tree uuid mismatch: expected {expected}, found {found}")]
    ChunkTreeUuidMismatch {
        /// Our chunk tree UUID.
        expected: Uuid,
        /// The header's.
        found: Uuid,
    },
    /// A stale or torn block (btrfs-progs: "parent transid verify failed").
    #[error("parent transid verify failed: wanted {expected} found {found}")]
    TransidMismatch {
        /// From the parent pointer, root item or superblock.
        expected: Generation,
        /// The header's.
        found: Generation,
    },
    /// The block is not at the expected level.
    #[error("level mismatch: expected {expected}, found {found}")]
    LevelMismatch {
        /// From the parent or root.
        expected: u8,
        /// The header's.
        found: u8,
    },
    /// The first key differs from the parent pointer's key.
    #[error("first key mismatch: expected {expected}, found {found}")]
    FirstKeyMismatch {
        /// The parent pointer's key.
        expected: Key,
        /// The block's first key.
        found: Key,
    },
    /// The block belongs to another tree.
    #[error("owner mismatch: expected tree {expected}, found {found}")]
    OwnerMismatch {
        /// The tree being read.
        expected: TreeId,
        /// The header's owner.
        found: TreeId,
    },
    /// Too many items for the block.
    #[error("nritems {nritems} exceeds maximum {max}")]
    TooManyItems {
        /// From the header.
        nritems: u32,
        /// What fits.
        max: u32,
    },
    /// An internal node without pointers, or an empty leaf where that is not
    /// allowed.
    #[error("empty {what}")]
    Empty {
        /// "node" or "leaf".
        what: &'static str,
    },
    /// Keys not strictly increasing.
    #[error("bad key order: slot {slot} key {key} is not after {prev}")]
    KeyOrder {
        /// The offending slot.
        slot: u32,
        /// Its key.
        key: Key,
        /// The previous key.
        prev: Key,
    },
    /// Item data outside the leaf data area.
    #[error("item {slot} ends at {end}, past leaf end {limit}")]
    ItemPastEnd {
        /// The slot.
        slot: u32,
        /// End of its data, relative to the header end (as `itemoff`).
        end: u64,
        /// Size of the leaf data area (nodesize - 101).
        limit: u64,
    },
    /// Item data not packed right after the previous item's.
    #[error("item {slot} ends at {end}, expected {expected}")]
    ItemGap {
        /// The slot.
        slot: u32,
        /// End of its data, relative to the header end.
        end: u64,
        /// Where the previous item's data begins.
        expected: u64,
    },
    /// Item data overlapping the item headers.
    #[error("item {slot} data starts at {start}, inside the item headers (end {headers_end})")]
    ItemOverlapsHeaders {
        /// The slot.
        slot: u32,
        /// Start of its data, relative to the block start.
        start: u64,
        /// End of the item header array.
        headers_end: u64,
    },
    /// A node pointer that cannot be a tree block.
    #[error("slot {slot} has invalid block pointer {ptr}")]
    BadBlockPtr {
        /// The slot.
        slot: u32,
        /// The pointer.
        ptr: u64,
    },
    /// A structure shorter than its fixed part or its declared length.
    #[error("truncated {what}: need {needed} bytes, {available} available")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        needed: u64,
        /// Bytes there.
        available: u64,
    },
    /// An item of the wrong size.
    #[error("bad {what} size {found}, expected {expected}")]
    BadSize {
        /// The item kind.
        what: &'static str,
        /// Its size.
        found: u64,
        /// The size it must have.
        expected: u64,
    },
    /// A field with an impossible value.
    #[error("invalid {field} {value}: {why}")]
    BadField {
        /// The field name (btrfs-progs' name).
        field: &'static str,
        /// Its value.
        value: u64,
        /// The rule it breaks.
        why: &'static str,
    },
    /// A key that cannot appear here.
    #[error("unexpected key {key} in {what}")]
    UnexpectedKey {
        /// The key.
        key: Key,
        /// Where it was found.
        what: &'static str,
    },
    /// Two chunks overlap.
    #[error("chunk at logical {logical} overlaps the previous chunk ending at {prev_end}")]
    ChunkOverlap {
        /// Start of the chunk.
        logical: Logical,
        /// End of the previous chunk.
        prev_end: u64,
    },
    /// No chunk maps the address.
    #[error("logical {logical} is not mapped by any chunk")]
    Unmapped {
        /// The address.
        logical: Logical,
    },
    /// An item that must exist is missing.
    #[error("missing {what} {key}")]
    MissingItem {
        /// What was looked for.
        what: &'static str,
        /// Its key (or the key searched for).
        key: Key,
    },
    /// Compressed data that does not decode.
    #[error("bad {algorithm} data: {reason}")]
    Decompress {
        /// The compression algorithm.
        algorithm: &'static str,
        /// What the decoder said.
        reason: String,
    },
    /// A DIR_ITEM or XATTR_ITEM whose key offset is not the hash of its
    /// name (kernel tree-checker: "name hash mismatch with key").
    #[error(
        "name hash mismatch: key offset {found:#x}, but the name \"{name}\" hashes to {expected:#x}"
    )]
    NameHash {
        /// The key offset.
        found: u64,
        /// The hash of the name.
        expected: u64,
        /// The name, escaped.
        name: String,
    },
    /// A field that must be a multiple of the sector size.
    #[error("unaligned {field} {value}: must be a multiple of the sector size {align}")]
    Unaligned {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The sector size.
        align: u32,
    },
    /// A generation newer than the filesystem's last commit allows.
    #[error(
        "{what} {found} is newer than the filesystem: the superblock's generation is \
         {super_generation}, so at most {} is possible",
        super_generation.0.saturating_add(1)
    )]
    TooNew {
        /// The field.
        what: &'static str,
        /// Its value.
        found: Generation,
        /// The superblock's generation.
        super_generation: Generation,
    },
    /// A rule tying an item to another one (the previous item, its
    /// chunk, its block group, its device) that does not hold: `rule`
    /// names it, `detail` gives both sides.
    #[error("{rule}: {detail}")]
    Mismatch {
        /// The rule, one greppable phrase.
        rule: &'static str,
        /// The values on both sides.
        detail: String,
    },
    /// A reference chain that loops or is too deep.
    #[error("{what} loop at objectid {objectid}")]
    Loop {
        /// The chain.
        what: &'static str,
        /// Where it was detected.
        objectid: u64,
    },
}

/// Things we recognise but do not handle (yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unsupported {
    /// An unknown checksum algorithm.
    #[error("unsupported checksum type {0}")]
    CsumType(u16),
    /// A known incompat feature we cannot read.
    #[error("unsupported incompat feature {name} (0x{bit:x})")]
    IncompatFeature {
        /// btrfs-progs' name (`mkfs.btrfs -O list-all`).
        name: &'static str,
        /// The bit value.
        bit: u64,
    },
    /// Incompat bits nobody defined.
    #[error("unknown incompat feature bits 0x{0:x}")]
    UnknownIncompat(u64),
    /// A superblock flag that makes the image unreadable for us.
    #[error("unsupported superblock flag {0}")]
    SuperFlag(&'static str),
    /// A chunk profile we cannot map.
    #[error("unsupported chunk type 0x{flags:x} at logical {logical}")]
    ChunkType {
        /// The chunk's type bits.
        flags: u64,
        /// The chunk start.
        logical: Logical,
    },
    /// RAID5/6 reconstruction from parity.
    #[error("cannot rebuild logical {0} from RAID5/6 parity: not supported yet")]
    Raid56Rebuild(Logical),
    /// A seed/sprout filesystem.
    #[error("seed device of filesystem {0} is not supported yet")]
    Seed(Uuid),
    /// A geometry outside what we handle.
    #[error("unsupported {what} {value}")]
    Geometry {
        /// The superblock field.
        what: &'static str,
        /// Its value.
        value: u64,
    },
}

/// The devices given do not form one filesystem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceSetError {
    /// A device of another filesystem.
    #[error("{} belongs to filesystem {found}, not {expected}", device.display())]
    ForeignDevice {
        /// The device.
        device: PathBuf,
        /// Its fsid.
        found: Uuid,
        /// The fsid of the first device.
        expected: Uuid,
    },
    /// Two devices claim the same devid.
    #[error("{} and {} both claim devid {devid}", first.display(), second.display())]
    DuplicateDevid {
        /// The id.
        devid: DevId,
        /// The first device.
        first: PathBuf,
        /// The second one.
        second: PathBuf,
    },
    /// A device whose UUID differs from the chunk tree's record.
    #[error("{} has devid {devid} uuid {found}, but the filesystem expects uuid {expected}", device.display())]
    UuidMismatch {
        /// The device.
        device: PathBuf,
        /// The id.
        devid: DevId,
        /// Its UUID.
        found: Uuid,
        /// The chunk tree's.
        expected: Uuid,
    },
    /// No device given.
    #[error("no device given")]
    NoDevice,
    /// Devices of the filesystem were not given, and degraded reading
    /// ([`ReadOptions::degraded`](crate::device::readahead::ReadOptions::degraded))
    /// was not asked for.
    #[error("{}", missing_text(missing))]
    Missing {
        /// The devices the chunk tree lists that were not given: devid and
        /// UUID.
        missing: Vec<(DevId, Uuid)>,
    },
}

/// "missing device: devid 2 uuid … was not given …" for
/// [`DeviceSetError::Missing`].
fn missing_text(missing: &[(DevId, Uuid)]) -> String {
    let list: Vec<String> = missing
        .iter()
        .map(|(devid, uuid)| format!("devid {devid} uuid {uuid}"))
        .collect();
    let (what, verb) = if missing.len() == 1 {
        ("device", "was")
    } else {
        ("devices", "were")
    };
    format!(
        "missing {what}: {} {verb} not given; give every device of the filesystem, or read \
         it degraded from the remaining copies with --degraded (as mounting needs -o degraded)",
        list.join(", ")
    )
}

/// Something worth telling the user that does not stop reading.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Notice {
    /// A log tree exists: fsynced data after the last commit is not seen.
    #[error("dirty log tree: reading the last committed state (log root at logical {0})")]
    DirtyLog(Logical),
    /// The kernel flagged an error on this filesystem.
    #[error("superblock has the ERROR flag set: the filesystem may be inconsistent")]
    ErrorFlag,
    /// The primary superblock was bad and a mirror was used.
    #[error("primary superblock on {} is bad ({reason}); using the mirror at physical {mirror}", device.display())]
    SuperblockMirror {
        /// The device.
        device: PathBuf,
        /// Where the used copy is.
        mirror: Physical,
        /// Why the primary was rejected.
        reason: String,
    },
    /// compat_ro bits we do not know; reading stays safe.
    #[error("unknown compat_ro feature bits 0x{0:x} (ignored: reading is safe)")]
    UnknownCompatRo(u64),
    /// Devices of the filesystem that were not given.
    #[error("missing device: devid {devid} uuid {uuid} (reading from the remaining copies)")]
    MissingDevice {
        /// Its id.
        devid: DevId,
        /// Its UUID.
        uuid: Uuid,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wording() {
        let e = Error::corrupt(
            Location::TreeBlock {
                logical: Logical(30408704),
                tree: TreeId(5),
                level: Some(0),
            },
            CorruptKind::ItemPastEnd {
                slot: 12,
                end: 16400,
                limit: 16283,
            },
        );
        assert_eq!(
            e.to_string(),
            "corrupt leaf at logical 30408704 (tree 5): item 12 ends at 16400, past leaf end 16283"
        );
        let e = Error::Io {
            device: "/dev/sdx".into(),
            offset: Physical(65536),
            error: io::Error::from(io::ErrorKind::UnexpectedEof),
        };
        assert_eq!(
            e.to_string(),
            "read error on /dev/sdx at physical 65536: unexpected end of file"
        );
    }
}
