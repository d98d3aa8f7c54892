//! Decoding the items of a subvolume (fs) tree: inode items, inode refs and
//! extrefs, directory entries, xattrs and file extents.
//!
//! Layout: `struct btrfs_inode_item`, `btrfs_inode_ref`,
//! `btrfs_inode_extref`, `btrfs_dir_item`, `btrfs_file_extent_item`
//! (btrfs_tree.h). Packed records (several refs of one parent
//! in an INODE_REF, hash collisions in DIR_ITEM, XATTR_ITEM and
//! INODE_EXTREF) are walked with bounds checks; a record that does not fit
//! its item is a corruption naming the item (leaf, tree, slot, key).

#![warn(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::as_conversions
)]

use std::fmt;
use std::sync::Arc;

use zerocopy::FromBytes;

use crate::error::{CorruptKind, Error, Result};
use crate::ondisk::{self, DirItem, FileExtentItem, FileExtentItemHeader, InodeExtref, InodeRef};
use crate::tree::buf::BlockBuf;
use crate::tree::key::Key;
use crate::tree::walk::ItemRef;
use crate::types::{Generation, Logical, TreeId, len64};

use super::compress::Algorithm;

/// A raw `struct btrfs_timespec`: signed seconds and nanoseconds, exactly as
/// stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timespec {
    /// Seconds since the epoch (negative before 1970).
    pub sec: i64,
    /// Nanoseconds (below 10⁹ on a sane filesystem; not checked).
    pub nsec: u32,
}

impl From<&ondisk::Timespec> for Timespec {
    fn from(t: &ondisk::Timespec) -> Timespec {
        Timespec {
            sec: t.sec.get().cast_signed(),
            nsec: t.nsec.get(),
        }
    }
}

/// The file type bits of `mode` (`S_IFMT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileType {
    /// `S_IFREG`.
    Regular,
    /// `S_IFDIR`.
    Dir,
    /// `S_IFLNK`.
    Symlink,
    /// `S_IFIFO`.
    Fifo,
    /// `S_IFSOCK`.
    Socket,
    /// `S_IFCHR`.
    CharDev,
    /// `S_IFBLK`.
    BlockDev,
    /// Anything else (the raw `S_IFMT` bits).
    Unknown(u32),
}

impl FileType {
    /// From a full `st_mode`.
    pub fn from_mode(mode: u32) -> FileType {
        match mode & 0o170_000 {
            0o100_000 => FileType::Regular,
            0o040_000 => FileType::Dir,
            0o120_000 => FileType::Symlink,
            0o010_000 => FileType::Fifo,
            0o140_000 => FileType::Socket,
            0o020_000 => FileType::CharDev,
            0o060_000 => FileType::BlockDev,
            other => FileType::Unknown(other),
        }
    }
}

/// An INODE_ITEM, all fields, copied out of the leaf (160 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inode {
    /// The inode number (key objectid).
    pub ino: u64,
    /// Transid that created the inode; `(ino, generation)` identifies it
    /// across inode-number reuse.
    pub generation: Generation,
    /// Last transid that modified it.
    pub transid: Generation,
    /// i_size.
    pub size: u64,
    /// Bytes allocated.
    pub nbytes: u64,
    /// Unused allocation hint.
    pub block_group: u64,
    /// Link count (directories: 1).
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// File type and permission bits.
    pub mode: u32,
    /// The kernel-internal `dev_t` (`major << 20 | minor`).
    pub rdev: u64,
    /// Inode flags (low 32 bits) and ro flags (high 32 bits).
    pub flags: u64,
    /// NFS i_version.
    pub sequence: u64,
    /// Access time.
    pub atime: Timespec,
    /// Change time.
    pub ctime: Timespec,
    /// Modification time.
    pub mtime: Timespec,
    /// Birth time.
    pub otime: Timespec,
}

impl Inode {
    /// Decode the INODE_ITEM `item`.
    ///
    /// # Errors
    ///
    /// [`CorruptKind::BadSize`] when the item is not 160 bytes.
    pub fn parse(item: &ItemRef<'_>) -> Result<Inode> {
        let raw = ondisk::InodeItem::ref_from_bytes(item.data).map_err(|_| {
            Error::corrupt(
                item.location(),
                CorruptKind::BadSize {
                    what: "inode item",
                    found: len64(item.data.len()),
                    expected: len64(size_of::<ondisk::InodeItem>()),
                },
            )
        })?;
        Ok(Inode {
            ino: item.key.objectid,
            generation: Generation(raw.generation.get()),
            transid: Generation(raw.transid.get()),
            size: raw.size.get(),
            nbytes: raw.nbytes.get(),
            block_group: raw.block_group.get(),
            nlink: raw.nlink.get(),
            uid: raw.uid.get(),
            gid: raw.gid.get(),
            mode: raw.mode.get(),
            rdev: raw.rdev.get(),
            flags: raw.flags.get(),
            sequence: raw.sequence.get(),
            atime: (&raw.atime).into(),
            ctime: (&raw.ctime).into(),
            mtime: (&raw.mtime).into(),
            otime: (&raw.otime).into(),
        })
    }

    /// The file type from `mode`.
    pub fn file_type(&self) -> FileType {
        FileType::from_mode(self.mode)
    }

    /// Permission bits with setuid, setgid and sticky (`mode & 0o7777`).
    pub fn permissions(&self) -> u32 {
        self.mode & 0o7777
    }

    /// Major device number of `rdev` (the kernel's `MAJOR()`: bits 20..32).
    pub fn rdev_major(&self) -> u32 {
        u32::try_from((self.rdev >> 20) & 0xfff).unwrap_or(0)
    }

    /// Minor device number of `rdev` (the kernel's `MINOR()`: bits 0..20).
    pub fn rdev_minor(&self) -> u32 {
        u32::try_from(self.rdev & 0xf_ffff).unwrap_or(0)
    }

    /// `rdev` as the send stream carries it (`new_encode_dev`).
    pub fn rdev_encoded(&self) -> u64 {
        let (major, minor) = (u64::from(self.rdev_major()), u64::from(self.rdev_minor()));
        (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
    }

    /// Whether data checksums are off (NODATASUM, or NODATACOW which
    /// implies it).
    pub fn nodatasum(&self) -> bool {
        self.flags & (ondisk::BTRFS_INODE_NODATASUM | ondisk::BTRFS_INODE_NODATACOW) != 0
    }
}

/// One name of an inode: from an INODE_REF record (`parent` = key offset) or
/// an INODE_EXTREF record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InodeName {
    /// The directory holding the name.
    pub parent: u64,
    /// The DIR_INDEX index of the entry in `parent`.
    pub index: u64,
    /// The name (raw bytes).
    pub name: Vec<u8>,
    /// Whether it came from an INODE_EXTREF.
    pub extended: bool,
}

/// Append the records of an INODE_REF item (several links in one parent
/// directory are packed into one item).
///
/// # Errors
///
/// [`CorruptKind::Truncated`] when a record does not fit the item;
/// [`CorruptKind::BadField`] for an empty name.
pub fn parse_inode_refs(item: &ItemRef<'_>, out: &mut Vec<InodeName>) -> Result<()> {
    let mut rest = item.data;
    while !rest.is_empty() {
        let (head, tail) = InodeRef::ref_from_prefix(rest)
            .map_err(|_| item.record_truncated("inode ref", size_of::<InodeRef>(), rest.len()))?;
        let (name, tail) = split_name(item, "inode ref name", tail, head.name_len.get())?;
        out.push(InodeName {
            parent: item.key.offset,
            index: head.index.get(),
            name: name.to_vec(),
            extended: false,
        });
        rest = tail;
    }
    Ok(())
}

/// Append the records of an INODE_EXTREF item (several only on hash
/// collision).
///
/// # Errors
///
/// As [`parse_inode_refs`].
pub fn parse_inode_extrefs(item: &ItemRef<'_>, out: &mut Vec<InodeName>) -> Result<()> {
    let mut rest = item.data;
    while !rest.is_empty() {
        let (head, tail) = InodeExtref::ref_from_prefix(rest).map_err(|_| {
            item.record_truncated("inode extref", size_of::<InodeExtref>(), rest.len())
        })?;
        let (name, tail) = split_name(item, "inode extref name", tail, head.name_len.get())?;
        out.push(InodeName {
            parent: head.parent_objectid.get(),
            index: head.index.get(),
            name: name.to_vec(),
            extended: true,
        });
        rest = tail;
    }
    Ok(())
}

fn split_name<'a>(
    item: &ItemRef<'_>,
    what: &'static str,
    data: &'a [u8],
    len: u16,
) -> Result<(&'a [u8], &'a [u8])> {
    let len = usize::from(len);
    if len == 0 {
        return Err(Error::corrupt(
            item.location(),
            CorruptKind::BadField {
                field: "name_len",
                value: 0,
                why: "names are at least one byte",
            },
        ));
    }
    if data.len() < len {
        return Err(item.record_truncated(what, len, data.len()));
    }
    Ok(data.split_at(len))
}

/// What a directory entry points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// An inode of the same tree.
    Inode(u64),
    /// The root of another subvolume (a nested subvolume, shown by the
    /// kernel as an empty directory in snapshots).
    Subvol(TreeId),
}

/// One record of a DIR_ITEM, DIR_INDEX or XATTR_ITEM, borrowed from the
/// leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirRecord<'a> {
    /// The location key (zero for xattrs).
    pub location: Key,
    /// Transid that created the entry.
    pub transid: Generation,
    /// `BTRFS_FT_*` with the encryption bit masked off.
    pub dir_type: u8,
    /// Name bytes.
    pub name: &'a [u8],
    /// Data bytes (xattr value; empty for directory entries).
    pub data: &'a [u8],
}

/// The packed records of a DIR_ITEM, DIR_INDEX or XATTR_ITEM item, in order.
#[derive(Debug, Clone)]
pub struct DirRecords<'i, 'a> {
    item: &'i ItemRef<'a>,
    rest: &'a [u8],
}

/// Iterate the records packed in `item`.
pub fn dir_records<'i, 'a>(item: &'i ItemRef<'a>) -> DirRecords<'i, 'a> {
    DirRecords {
        item,
        rest: item.data,
    }
}

impl<'a> Iterator for DirRecords<'_, 'a> {
    type Item = Result<DirRecord<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let item = self.item;
        let rest = self.rest;
        let r = (|| {
            let (head, tail) = DirItem::ref_from_prefix(rest)
                .map_err(|_| item.record_truncated("dir item", size_of::<DirItem>(), rest.len()))?;
            let (name, tail) = split_name(item, "dir item name", tail, head.name_len.get())?;
            let data_len = usize::from(head.data_len.get());
            if tail.len() < data_len {
                return Err(item.record_truncated("dir item data", data_len, tail.len()));
            }
            let (data, tail) = tail.split_at(data_len);
            Ok((
                DirRecord {
                    location: Key::from(&head.location),
                    transid: Generation(head.transid.get()),
                    dir_type: head.dir_type & !0x80,
                    name,
                    data,
                },
                tail,
            ))
        })();
        match r {
            Ok((rec, tail)) => {
                self.rest = tail;
                Some(Ok(rec))
            }
            Err(e) => {
                // Stop after the first error.
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// A directory entry (from DIR_INDEX, or DIR_ITEM for lookups).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DirEntry {
    /// The directory.
    pub dir: u64,
    /// DIR_INDEX index (readdir order); 0 when found through DIR_ITEM.
    pub index: u64,
    /// The name (raw bytes).
    pub name: Vec<u8>,
    /// What it points at.
    pub target: Target,
    /// `BTRFS_FT_*` of the target.
    pub dir_type: u8,
    /// Transid that created the entry.
    pub transid: Generation,
}

impl DirEntry {
    /// A directory entry from one record of `item` (objectid = directory).
    ///
    /// # Errors
    ///
    /// [`CorruptKind::UnexpectedKey`] for a location that is neither an
    /// inode nor a root item.
    pub fn from_record(item: &ItemRef<'_>, rec: &DirRecord<'_>, index: u64) -> Result<DirEntry> {
        let target = match rec.location.item_type {
            ondisk::BTRFS_INODE_ITEM_KEY => Target::Inode(rec.location.objectid),
            ondisk::BTRFS_ROOT_ITEM_KEY => Target::Subvol(TreeId(rec.location.objectid)),
            _ => {
                return Err(Error::corrupt(
                    item.location(),
                    CorruptKind::UnexpectedKey {
                        key: rec.location,
                        what: "directory entry location",
                    },
                ));
            }
        };
        Ok(DirEntry {
            dir: item.key.objectid,
            index,
            name: rec.name.to_vec(),
            target,
            dir_type: rec.dir_type,
            transid: rec.transid,
        })
    }
}

/// Append the one entry of a DIR_INDEX item.
///
/// # Errors
///
/// Record decoding errors; [`CorruptKind::BadField`] when the item holds
/// more than one record.
pub fn parse_dir_index(item: &ItemRef<'_>, out: &mut Vec<DirEntry>) -> Result<()> {
    let mut recs = dir_records(item);
    let rec = recs
        .next()
        .ok_or_else(|| item.record_truncated("dir index", 30, 0))??;
    if recs.next().is_some() {
        return Err(Error::corrupt(
            item.location(),
            CorruptKind::BadField {
                field: "dir index item size",
                value: len64(item.data.len()),
                why: "a DIR_INDEX item holds exactly one entry",
            },
        ));
    }
    out.push(DirEntry::from_record(item, &rec, item.key.offset)?);
    Ok(())
}

/// One extended attribute.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Xattr {
    /// Full name (`user.foo`, `system.posix_acl_access`, …).
    pub name: Vec<u8>,
    /// Raw value as stored.
    pub value: Vec<u8>,
}

/// Append the records of an XATTR_ITEM (several on hash collision).
///
/// # Errors
///
/// Record decoding errors.
pub fn parse_xattrs(item: &ItemRef<'_>, out: &mut Vec<Xattr>) -> Result<()> {
    for rec in dir_records(item) {
        let rec = rec?;
        out.push(Xattr {
            name: rec.name.to_vec(),
            value: rec.data.to_vec(),
        });
    }
    Ok(())
}

/// How an extent's bytes are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    /// Stored as is.
    None,
    /// zlib.
    Zlib,
    /// btrfs LZO framing.
    Lzo,
    /// zstd.
    Zstd,
}

impl Compression {
    /// The decoder, for a filesystem with this sector size.
    pub fn algorithm(self, sectorsize: u32) -> Option<Algorithm> {
        match self {
            Compression::None => None,
            Compression::Zlib => Some(Algorithm::Zlib),
            Compression::Lzo => Some(Algorithm::Lzo {
                sectorsize: usize::try_from(sectorsize).unwrap_or(usize::MAX),
            }),
            Compression::Zstd => Some(Algorithm::Zstd),
        }
    }
}

/// The bytes of an inline extent: a range of the leaf that holds the item
/// (kept alive by a reference to the block: no allocation, no copy), or a
/// buffer of their own. Compares, hashes and prints as its bytes.
#[derive(Clone)]
pub struct InlineData(InlineRepr);

#[derive(Clone)]
enum InlineRepr {
    /// `block[start..end]`.
    Leaf {
        block: Arc<BlockBuf>,
        start: usize,
        end: usize,
    },
    Owned(Arc<[u8]>),
}

impl InlineData {
    /// `bytes`, which lie in `block` when it is given: then the block is
    /// kept instead of a copy.
    fn new(bytes: &[u8], block: Option<&Arc<BlockBuf>>) -> InlineData {
        let within = block.and_then(|b| {
            let start = bytes.as_ptr().addr().checked_sub(b.as_ptr().addr())?;
            let end = start.checked_add(bytes.len())?;
            // Only when the range is that very slice of the block.
            (b.get(start..end)?.as_ptr() == bytes.as_ptr()).then(|| InlineRepr::Leaf {
                block: Arc::clone(b),
                start,
                end,
            })
        });
        InlineData(within.unwrap_or_else(|| InlineRepr::Owned(bytes.into())))
    }

    /// The tree block the bytes keep alive, if any (whose size a queue
    /// holding them should count).
    pub fn block(&self) -> Option<&Arc<BlockBuf>> {
        match &self.0 {
            InlineRepr::Leaf { block, .. } => Some(block),
            InlineRepr::Owned(_) => None,
        }
    }
}

impl From<Vec<u8>> for InlineData {
    fn from(v: Vec<u8>) -> InlineData {
        InlineData(InlineRepr::Owned(v.into()))
    }
}

impl std::ops::Deref for InlineData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            InlineRepr::Leaf { block, start, end } => block.get(*start..*end).unwrap_or_default(),
            InlineRepr::Owned(b) => b,
        }
    }
}

impl fmt::Debug for InlineData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl PartialEq for InlineData {
    fn eq(&self, other: &InlineData) -> bool {
        **self == **other
    }
}

impl Eq for InlineData {}

impl std::hash::Hash for InlineData {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

/// Where a file extent's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ExtentData {
    /// Stored in the item (possibly compressed).
    Inline(InlineData),
    /// A regular extent: `disk_bytenr` 0 is an explicit hole.
    Regular(DiskExtent),
    /// Preallocated: reads as zeros.
    Prealloc(DiskExtent),
}

/// The on-disk part of a regular or prealloc extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DiskExtent {
    /// Logical address of the on-disk extent; 0 for a hole.
    pub disk_bytenr: Logical,
    /// Its on-disk size.
    pub disk_num_bytes: u64,
    /// Offset into the decoded extent where the file range starts.
    pub offset: u64,
    /// Length of the file range.
    pub num_bytes: u64,
}

/// One EXTENT_DATA item.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FileExtent {
    /// File offset (key offset).
    pub file_offset: u64,
    /// Transid that created the extent.
    pub generation: Generation,
    /// Decoded size of the whole extent.
    pub ram_bytes: u64,
    /// Encoding.
    pub compression: Compression,
    /// The bytes.
    pub data: ExtentData,
}

impl FileExtent {
    /// Decode the EXTENT_DATA `item`.
    ///
    /// # Errors
    ///
    /// [`CorruptKind::BadSize`]/[`CorruptKind::Truncated`] for a wrong item
    /// size, [`CorruptKind::BadField`] for an unknown type or compression,
    /// encryption, a zero-length or overflowing range.
    pub fn parse(item: &ItemRef<'_>) -> Result<FileExtent> {
        let bad = |field, value, why| {
            Error::corrupt(item.location(), CorruptKind::BadField { field, value, why })
        };
        let (head, inline) = FileExtentItemHeader::ref_from_prefix(item.data).map_err(|_| {
            item.record_truncated(
                "file extent item",
                size_of::<FileExtentItemHeader>(),
                item.data.len(),
            )
        })?;
        let compression = match head.compression {
            ondisk::BTRFS_COMPRESS_NONE => Compression::None,
            ondisk::BTRFS_COMPRESS_ZLIB => Compression::Zlib,
            ondisk::BTRFS_COMPRESS_LZO => Compression::Lzo,
            ondisk::BTRFS_COMPRESS_ZSTD => Compression::Zstd,
            c => return Err(bad("compression", c.into(), "unknown compression type")),
        };
        if head.encryption != 0 {
            return Err(bad(
                "encryption",
                head.encryption.into(),
                "encrypted extents are not defined",
            ));
        }
        if head.other_encoding.get() != 0 {
            return Err(bad(
                "other_encoding",
                head.other_encoding.get().into(),
                "must be 0",
            ));
        }
        let ram_bytes = head.ram_bytes.get();
        let data = match head.extent_type {
            ondisk::BTRFS_FILE_EXTENT_INLINE => {
                if item.key.offset != 0 {
                    return Err(bad(
                        "inline extent offset",
                        item.key.offset,
                        "inline extents start at file offset 0",
                    ));
                }
                if compression == Compression::None && len64(inline.len()) != ram_bytes {
                    return Err(bad(
                        "ram_bytes",
                        ram_bytes,
                        "differs from the inline data length",
                    ));
                }
                ExtentData::Inline(InlineData::new(inline, item.block))
            }
            t @ (ondisk::BTRFS_FILE_EXTENT_REG | ondisk::BTRFS_FILE_EXTENT_PREALLOC) => {
                let raw = FileExtentItem::ref_from_bytes(item.data).map_err(|_| {
                    Error::corrupt(
                        item.location(),
                        CorruptKind::BadSize {
                            what: "file extent item",
                            found: len64(item.data.len()),
                            expected: len64(size_of::<FileExtentItem>()),
                        },
                    )
                })?;
                let d = DiskExtent {
                    disk_bytenr: Logical(raw.disk_bytenr.get()),
                    disk_num_bytes: raw.disk_num_bytes.get(),
                    offset: raw.offset.get(),
                    num_bytes: raw.num_bytes.get(),
                };
                if d.num_bytes == 0 {
                    return Err(bad("num_bytes", 0, "an extent covers at least one byte"));
                }
                if item.key.offset.checked_add(d.num_bytes).is_none() {
                    return Err(bad("num_bytes", d.num_bytes, "extent ends past 2^64"));
                }
                if d.disk_bytenr.get() != 0 {
                    let decoded = if compression == Compression::None {
                        d.disk_num_bytes
                    } else {
                        ram_bytes
                    };
                    if d.offset
                        .checked_add(d.num_bytes)
                        .is_none_or(|e| e > decoded)
                    {
                        return Err(bad(
                            "num_bytes",
                            d.num_bytes,
                            "offset + num_bytes is past the end of the extent",
                        ));
                    }
                    if compression != Compression::None
                        && (d.disk_num_bytes == 0
                            || ram_bytes > len64(super::compress::MAX_UNCOMPRESSED))
                    {
                        return Err(bad(
                            "ram_bytes",
                            ram_bytes,
                            "a compressed extent decodes to at most 128 KiB",
                        ));
                    }
                }
                if t == ondisk::BTRFS_FILE_EXTENT_PREALLOC {
                    ExtentData::Prealloc(d)
                } else {
                    ExtentData::Regular(d)
                }
            }
            t => return Err(bad("extent type", t.into(), "unknown file extent type")),
        };
        Ok(FileExtent {
            file_offset: item.key.offset,
            generation: Generation(head.generation.get()),
            ram_bytes,
            compression,
            data,
        })
    }

    /// Where the extent ends in the file, as the kernel computes it
    /// (`btrfs_file_extent_end`): inline extents cover `ram_bytes` rounded up
    /// to the sector size. Not clamped to i_size.
    pub fn end(&self, sectorsize: u32) -> u64 {
        match &self.data {
            ExtentData::Inline(_) => {
                let s = u64::from(sectorsize.max(1));
                self.ram_bytes
                    .div_ceil(s)
                    .saturating_mul(s)
                    .saturating_add(self.file_offset)
            }
            ExtentData::Regular(d) | ExtentData::Prealloc(d) => {
                self.file_offset.saturating_add(d.num_bytes)
            }
        }
    }

    /// The on-disk part of a regular or prealloc extent (`None` for an
    /// inline one).
    pub fn disk(&self) -> Option<&DiskExtent> {
        match &self.data {
            ExtentData::Inline(_) => None,
            ExtentData::Regular(d) | ExtentData::Prealloc(d) => Some(d),
        }
    }

    /// Whether the range reads as zeros without touching the disk: an
    /// explicit hole or a prealloc extent.
    pub fn is_hole_or_prealloc(&self) -> bool {
        match &self.data {
            ExtentData::Inline(_) => false,
            ExtentData::Regular(d) => d.disk_bytenr.get() == 0,
            ExtentData::Prealloc(_) => true,
        }
    }
}

/// The hash of a DIR_ITEM or XATTR_ITEM name (the key offset):
/// `crc32c(~1, name)` without the final inversion (`btrfs_name_hash`).
pub fn name_hash(name: &[u8]) -> u64 {
    crate::tree::check::name_hash(name)
}

/// The key offset of an INODE_EXTREF (`btrfs_extref_hash`): the raw crc32c
/// of the name seeded with the parent's inode number (low 32 bits).
pub fn extref_hash(parent: u64, name: &[u8]) -> u64 {
    let seed = u32::try_from(parent & 0xffff_ffff).unwrap_or(0);
    u64::from(!crc32c::crc32c_append(!seed, name))
}

/// The key of an inode's first item.
pub fn inode_key(ino: u64) -> Key {
    Key::new(ino, ondisk::BTRFS_INODE_ITEM_KEY, 0)
}

/// Whether `objectid` can be an inode number of a subvolume tree.
pub fn is_inode_number(objectid: u64) -> bool {
    (ondisk::BTRFS_FIRST_FREE_OBJECTID..=ondisk::BTRFS_LAST_FREE_OBJECTID).contains(&objectid)
}

#[cfg(test)]
mod tests;
