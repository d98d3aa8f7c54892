//! The records of an index and their keys.
//!
//! Keys are a kind byte and big-endian numbers, so the tree keeps each
//! inode's records together and in order: a directory's entries by name,
//! a file's extents by offset.
//!
//! ```text
//! 01 INO                  inode     kind, mode, uid, gid, nlink, size, rdev, mtime, flags, parent, target
//! 02 DIR-INO NAME         entry     INO of the child
//! 03 INO NAME             xattr     value
//! 04 INO OFFSET           extent    length, source, stream offset, encoding
//! ```

use super::IndexError;

/// The root directory's inode number.
pub const ROOT_INO: u64 = 256;

const INODE: u8 = 1;
const DIRENT: u8 = 2;
const XATTR: u8 = 3;
const EXTENT: u8 = 4;

fn key(kind: u8, ino: u64, rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + rest.len());
    key_into(&mut k, kind, ino, rest);
    k
}

/// [`key`] written into `out` (what it held is dropped).
fn key_into(out: &mut Vec<u8>, kind: u8, ino: u64, rest: &[u8]) {
    out.clear();
    out.push(kind);
    out.extend_from_slice(&ino.to_be_bytes());
    out.extend_from_slice(rest);
}

/// The key of inode `ino`.
pub fn inode_key(ino: u64) -> Vec<u8> {
    key(INODE, ino, &[])
}

/// [`inode_key`] written into `out` (what it held is dropped).
pub fn inode_key_into(out: &mut Vec<u8>, ino: u64) {
    key_into(out, INODE, ino, &[]);
}

/// The key of the entry `name` in directory `dir`.
pub fn dirent_key(dir: u64, name: &[u8]) -> Vec<u8> {
    key(DIRENT, dir, name)
}

/// [`dirent_key`] written into `out` (what it held is dropped).
pub fn dirent_key_into(out: &mut Vec<u8>, dir: u64, name: &[u8]) {
    key_into(out, DIRENT, dir, name);
}

/// The prefix of every entry of directory `dir`.
pub fn dirent_prefix(dir: u64) -> Vec<u8> {
    key(DIRENT, dir, &[])
}

/// The key of xattr `name` of `ino`.
pub fn xattr_key(ino: u64, name: &[u8]) -> Vec<u8> {
    key(XATTR, ino, name)
}

/// The prefix of every xattr of `ino`.
pub fn xattr_prefix(ino: u64) -> Vec<u8> {
    key(XATTR, ino, &[])
}

/// The key of the extent of `ino` starting at `offset`.
pub fn extent_key(ino: u64, offset: u64) -> Vec<u8> {
    key(EXTENT, ino, &offset.to_be_bytes())
}

/// [`extent_key`] written into `out` (what it held is dropped).
pub fn extent_key_into(out: &mut Vec<u8>, ino: u64, offset: u64) {
    key_into(out, EXTENT, ino, &offset.to_be_bytes());
}

/// The prefix of every extent of `ino`.
pub fn extent_prefix(ino: u64) -> Vec<u8> {
    key(EXTENT, ino, &[])
}

/// The file offset of an extent key (`None`: not an extent key of 17 bytes).
pub fn extent_offset(key: &[u8]) -> Option<u64> {
    (key.len() == 17 && key[0] == EXTENT)
        .then(|| u64::from_be_bytes(key[9..17].try_into().unwrap_or_default()))
}

/// The directory of an entry key (the inode of an inode, xattr or extent
/// key); 0 for a key too short to hold one.
pub fn dirent_dir(key: &[u8]) -> u64 {
    key.get(1..9)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

/// The name in an entry or xattr key.
pub fn name_of(key: &[u8]) -> &[u8] {
    key.get(9..).unwrap_or_default()
}

/// The longest name an entry or an xattr may have, in bytes (Linux's
/// `NAME_MAX` and `XATTR_NAME_MAX`).
pub const NAME_MAX: usize = 255;

/// Whether `name` can name a directory entry: 1 to [`NAME_MAX`] bytes,
/// neither `/` nor NUL in it, and not `.` or `..`. A stream's names pass
/// the receiver's checks before they are indexed; a page that holds any
/// other is forged or damaged, and a name from it that reached a tar
/// member or a FUSE directory could point outside its directory.
pub fn is_entry_name(name: &[u8]) -> bool {
    // One component by the receiver's own path rules (no `.`, `..` or NUL).
    !name.is_empty()
        && name.len() <= NAME_MAX
        && !name.contains(&b'/')
        && crate::receive::target::check_path(name).is_ok()
}

/// Whether `name` can name an xattr: 1 to [`NAME_MAX`] bytes, no NUL.
pub fn is_xattr_name(name: &[u8]) -> bool {
    !name.is_empty() && name.len() <= NAME_MAX && !name.contains(&0)
}

/// The type of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A socket.
    Sock,
    /// A character device.
    Chr,
    /// A block device.
    Blk,
}

impl FileType {
    pub(crate) fn code(self) -> u8 {
        match self {
            FileType::File => 1,
            FileType::Dir => 2,
            FileType::Symlink => 3,
            FileType::Fifo => 4,
            FileType::Sock => 5,
            FileType::Chr => 6,
            FileType::Blk => 7,
        }
    }

    fn from_code(c: u8) -> Option<FileType> {
        Some(match c {
            1 => FileType::File,
            2 => FileType::Dir,
            3 => FileType::Symlink,
            4 => FileType::Fifo,
            5 => FileType::Sock,
            6 => FileType::Chr,
            7 => FileType::Blk,
            _ => return None,
        })
    }

    /// The type as a manifest names it.
    pub fn manifest_name(self) -> &'static str {
        match self {
            FileType::File => "file",
            FileType::Dir => "dir",
            FileType::Symlink => "symlink",
            FileType::Fifo => "fifo",
            FileType::Sock => "sock",
            FileType::Chr => "chr",
            FileType::Blk => "blk",
        }
    }

    /// The `S_IFMT` bits of a mode of this type.
    pub fn mode_bits(self) -> u64 {
        match self {
            FileType::File => 0o100_000,
            FileType::Dir => 0o040_000,
            FileType::Symlink => 0o120_000,
            FileType::Fifo => 0o010_000,
            FileType::Sock => 0o140_000,
            FileType::Chr => 0o020_000,
            FileType::Blk => 0o060_000,
        }
    }

    /// The type from the `S_IFMT` bits of a mode.
    pub fn from_mode(mode: u64) -> Option<FileType> {
        Some(match mode & 0o170_000 {
            0o100_000 => FileType::File,
            0o040_000 => FileType::Dir,
            0o120_000 => FileType::Symlink,
            0o010_000 => FileType::Fifo,
            0o140_000 => FileType::Sock,
            0o020_000 => FileType::Chr,
            0o060_000 => FileType::Blk,
            _ => return None,
        })
    }
}

/// An inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    /// Its type.
    pub kind: FileType,
    /// Permission bits with setuid, setgid and sticky (`mode & 07777`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Names it has (directories: 1).
    pub nlink: u32,
    /// Size: of a file, its length; of a symlink, its target's; of a
    /// directory, twice the length of its names, as btrfs counts it.
    pub size: u64,
    /// Device number of a device (userspace `dev_t`).
    pub rdev: u64,
    /// Modification time: seconds and nanoseconds.
    pub mtime: (i64, u32),
    /// The inode flags FILEATTR set (`btrfs_inode_item.flags`).
    pub flags: u64,
    /// A directory's parent (the root's own number for the root).
    pub parent: u64,
    /// A symlink's target.
    pub target: Vec<u8>,
}

const INODE_FIXED: usize = 1 + 4 * 4 + 8 + 8 + 8 + 4 + 8 + 8;

impl Inode {
    /// A new inode of `kind` with `mode`, owned by root, time zero.
    pub fn new(kind: FileType, mode: u32) -> Inode {
        Inode {
            kind,
            mode,
            uid: 0,
            gid: 0,
            nlink: 1,
            size: 0,
            rdev: 0,
            mtime: (0, 0),
            flags: 0,
            parent: 0,
            target: Vec::new(),
        }
    }

    /// A device's major and minor numbers.
    pub fn rdev_parts(&self) -> (u32, u32) {
        (rustix::fs::major(self.rdev), rustix::fs::minor(self.rdev))
    }

    /// Its record.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(INODE_FIXED + self.target.len());
        self.encode_into(&mut v);
        v
    }

    /// Its record, written into `v` (what it held is dropped).
    pub fn encode_into(&self, v: &mut Vec<u8>) {
        v.clear();
        v.push(self.kind.code());
        for x in [self.mode, self.uid, self.gid, self.nlink] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(&self.rdev.to_le_bytes());
        v.extend_from_slice(&self.mtime.0.to_le_bytes());
        v.extend_from_slice(&self.mtime.1.to_le_bytes());
        v.extend_from_slice(&self.flags.to_le_bytes());
        v.extend_from_slice(&self.parent.to_le_bytes());
        v.extend_from_slice(&self.target);
    }

    /// Parse the record of `key`.
    ///
    /// # Errors
    ///
    /// The record is too short, of an unknown type, or out of range.
    pub fn decode(key: &[u8], v: &[u8]) -> Result<Inode, IndexError> {
        let bad = |reason| IndexError::Record {
            what: "inode",
            key: key.to_vec(),
            reason,
        };
        if v.len() < INODE_FIXED {
            return Err(bad("too short"));
        }
        let mut r = Reader(v);
        let kind = FileType::from_code(r.u8()).ok_or_else(|| bad("unknown type"))?;
        let inode = Inode {
            kind,
            mode: r.u32(),
            uid: r.u32(),
            gid: r.u32(),
            nlink: r.u32(),
            size: r.u64(),
            rdev: r.u64(),
            mtime: (r.u64() as i64, r.u32()),
            flags: r.u64(),
            parent: r.u64(),
            target: r.0.to_vec(),
        };
        if inode.mode > 0o7777 || inode.mtime.1 >= 1_000_000_000 {
            return Err(bad("mode or time out of range"));
        }
        if inode.kind != FileType::Symlink && !inode.target.is_empty() {
            return Err(bad("a target on a non-symlink"));
        }
        Ok(inode)
    }
}

/// Little-endian fields of a record whose length is checked first.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let (a, rest) = self.0.split_at(N);
        self.0 = rest;
        // OK to unwrap: split at N.
        a.try_into().unwrap()
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

/// How an extent's bytes are stored in its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// As they are: the file's bytes at `[offset, offset + len)` are the
    /// stream's at `[stream_offset, stream_offset + len)`.
    Plain,
    /// Compressed (`ENCODED_WRITE`): the stream's `encoded_len` bytes at
    /// `stream_offset` decode to `unencoded_len` bytes, of which the file
    /// holds `len` from `unencoded_offset`.
    Encoded {
        /// The btrfs compression number.
        compression: u32,
        /// Bytes of encoded data in the stream.
        encoded_len: u64,
        /// Bytes once decoded.
        unencoded_len: u64,
        /// Where the extent's first byte sits in the decoded data.
        unencoded_offset: u64,
    },
}

/// Where a range of a file's data is: one record per written range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Bytes of the file it covers.
    pub len: u64,
    /// Which stream of the index's source list holds them.
    pub source: u32,
    /// Where in that raw stream (from its first byte, the header).
    pub stream_offset: u64,
    /// How they are stored.
    pub encoding: Encoding,
}

impl Extent {
    /// Its record.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(53);
        self.encode_into(&mut v);
        v
    }

    /// Its record, written into `v` (what it held is dropped).
    pub fn encode_into(&self, v: &mut Vec<u8>) {
        v.clear();
        v.extend_from_slice(&self.len.to_le_bytes());
        v.extend_from_slice(&self.source.to_le_bytes());
        v.extend_from_slice(&self.stream_offset.to_le_bytes());
        match self.encoding {
            Encoding::Plain => v.push(0),
            Encoding::Encoded {
                compression,
                encoded_len,
                unencoded_len,
                unencoded_offset,
            } => {
                v.push(1);
                v.extend_from_slice(&compression.to_le_bytes());
                v.extend_from_slice(&encoded_len.to_le_bytes());
                v.extend_from_slice(&unencoded_len.to_le_bytes());
                v.extend_from_slice(&unencoded_offset.to_le_bytes());
            }
        }
    }

    /// Parse the record of `key`.
    ///
    /// # Errors
    ///
    /// The record has the wrong length, or an encoded range out of bounds.
    pub fn decode(key: &[u8], v: &[u8]) -> Result<Extent, IndexError> {
        let bad = |reason| IndexError::Record {
            what: "extent",
            key: key.to_vec(),
            reason,
        };
        if v.len() != 21 && v.len() != 49 {
            return Err(bad("wrong length"));
        }
        let mut r = Reader(v);
        let len = r.u64();
        let source = r.u32();
        let stream_offset = r.u64();
        let encoding = match r.u8() {
            0 if r.0.is_empty() => Encoding::Plain,
            1 if r.0.len() == 28 => Encoding::Encoded {
                compression: r.u32(),
                encoded_len: r.u64(),
                unencoded_len: r.u64(),
                unencoded_offset: r.u64(),
            },
            _ => return Err(bad("unknown encoding")),
        };
        if len == 0 {
            return Err(bad("empty"));
        }
        if let Encoding::Encoded {
            unencoded_len,
            unencoded_offset,
            ..
        } = encoding
            && unencoded_offset
                .checked_add(len)
                .is_none_or(|e| e > unencoded_len)
        {
            return Err(bad("range past the decoded data"));
        }
        Ok(Extent {
            len,
            source,
            stream_offset,
            encoding,
        })
    }

    /// The same extent without its first `n` bytes (`n < len`).
    pub fn skip(&self, n: u64) -> Extent {
        let mut e = *self;
        e.len -= n;
        match &mut e.encoding {
            Encoding::Plain => e.stream_offset += n,
            Encoding::Encoded {
                unencoded_offset, ..
            } => *unencoded_offset += n,
        }
        e
    }
}

/// An entry's record: the child's inode number.
pub fn decode_dirent(key: &[u8], v: &[u8]) -> Result<u64, IndexError> {
    let a: [u8; 8] = v.try_into().map_err(|_| IndexError::Record {
        what: "directory entry",
        key: key.to_vec(),
        reason: "wrong length",
    })?;
    Ok(u64::from_le_bytes(a))
}
