//! A snapshot's index written back out as a full send stream, of the
//! whole snapshot or of the paths a [`Selection`] picks: what
//! `backup restore --include` receives into a directory.
//!
//! The stream creates each path at its final name, parents first, so it
//! needs no orphan names and no renames. Its commands come in the order
//! the kernel sends a new inode's (create, xattrs, data, TRUNCATE, CHOWN,
//! CHMOD, FILEATTR, the capabilities xattr that CHOWN drops, UTIMES), and
//! a directory's attributes come after everything in it was made, so the
//! directory's mtime and a read-only mode hold. A
//! second name of an inode already written is a LINK to the first. File
//! data is read from the streams the index points into and sent as plain
//! WRITEs of at most 48 KiB (the kernel's size, so any receiver takes
//! them); holes are left unwritten and the file's size set by TRUNCATE.
//!
//! The index keeps a modification time only: the access and change times
//! sent are the modification time, as close as a receiver can come (it
//! cannot set a change time anyway).

use std::collections::HashMap;
use std::io::Write;

use stream_format::{Command, StreamWriter, Timespec};

use super::IndexError;
use super::glob::Glob;
use super::model::{FileType, Inode, ROOT_INO};
use super::proof::{Content, TreeDigest};
use super::read::{DataSource, Snapshot, Visit};
use super::tree::Record;
use crate::manifest::ContentHasher;

/// Bytes of file data in one WRITE: the kernel's `BTRFS_SEND_READ_SIZE`.
const WRITE_SIZE: usize = 48 << 10;

/// The xattr of file capabilities, which a change of owner drops.
const CAPABILITY: &[u8] = b"security.capability";

/// Bytes of file data read from the index at once.
const READ_SIZE: usize = 1 << 20;

/// Which paths of a snapshot a stream carries, with restic's rules: a
/// path matching an include pattern is taken with everything below it,
/// and the directories leading to it with their attributes; a path
/// matching an exclude pattern is left out with everything below it. No
/// include pattern: every path not excluded.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    include: Vec<Glob>,
    exclude: Vec<Glob>,
}

impl Selection {
    /// The paths `include` picks (all, if it is empty) and `exclude` does
    /// not.
    pub fn new(include: Vec<Glob>, exclude: Vec<Glob>) -> Selection {
        Selection { include, exclude }
    }

    fn includes(&self, path: &[u8]) -> bool {
        self.include.is_empty() || self.include.iter().any(|g| g.is_match(path))
    }

    fn excludes(&self, path: &[u8]) -> bool {
        self.exclude.iter().any(|g| g.is_match(path))
    }

    fn may_include_below(&self, dir: &[u8]) -> bool {
        self.include.iter().any(|g| g.may_match_below(dir))
    }
}

/// The subvolume a stream makes: SUBVOL's fields.
#[derive(Debug, Clone, Copy)]
pub struct Head<'a> {
    /// Its name.
    pub name: &'a [u8],
    /// Its UUID.
    pub uuid: [u8; 16],
    /// Its ctransid.
    pub ctransid: u64,
}

/// What a stream carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    /// Paths made (names of the root's attributes not counted).
    pub paths: u64,
    /// Bytes of file data.
    pub bytes: u64,
}

/// Write the stream of the paths of `snap` that `sel` picks to `out`
/// (which has written the stream header), its data read through `data`,
/// ending with END; what it carried.
///
/// # Errors
///
/// A damaged index, data that cannot be read, or a write error
/// ([`IndexError::Output`]).
pub fn write_stream<W: Write>(
    snap: &Snapshot<'_, '_>,
    data: &dyn DataSource,
    sel: &Selection,
    head: Head<'_>,
    out: &mut StreamWriter<W>,
) -> Result<Written, IndexError> {
    write(snap, data, sel, head, out, None)
}

/// Write the whole of `snap` as [`write_stream`] does, recording in
/// `proof` the digest of the tree written ([`super::proof`]): each file's
/// content is hashed from the data as it is written.
///
/// # Errors
///
/// As [`write_stream`].
pub fn write_proved<W: Write>(
    snap: &Snapshot<'_, '_>,
    data: &dyn DataSource,
    head: Head<'_>,
    out: &mut StreamWriter<W>,
    proof: &mut TreeDigest,
) -> Result<Written, IndexError> {
    write(snap, data, &Selection::default(), head, out, Some(proof))
}

fn write<W: Write>(
    snap: &Snapshot<'_, '_>,
    data: &dyn DataSource,
    sel: &Selection,
    head: Head<'_>,
    out: &mut StreamWriter<W>,
    proof: Option<&mut TreeDigest>,
) -> Result<Written, IndexError> {
    let mut s = Synth {
        snap,
        data,
        sel,
        out,
        open: Vec::new(),
        links: HashMap::new(),
        written: Written::default(),
        buf: vec![0u8; READ_SIZE],
        proof,
    };
    s.put(&Command::Subvol {
        path: head.name.into(),
        uuid: head.uuid,
        ctransid: head.ctransid,
    })?;
    let root = snap.inode(ROOT_INO)?;
    if let Some(p) = &mut s.proof {
        p.path(b"", ROOT_INO, &root, &snap.xattrs(ROOT_INO)?, None);
    }
    snap.visit_below(ROOT_INO, &mut Vec::new(), &mut s)?;
    s.attributes(b"", ROOT_INO, &root)?;
    s.put(&Command::End)?;
    s.out.flush().map_err(output)?;
    Ok(s.written)
}

fn output(e: stream_format::EncodeError) -> IndexError {
    IndexError::Output(e.to_string())
}

/// A directory the walk is in.
struct Open {
    path: Vec<u8>,
    /// Its MKDIR was sent.
    made: bool,
    /// Everything below it is picked (it, or a directory above it,
    /// matched an include pattern).
    whole: bool,
}

struct Synth<'a, 'p, 's, W: Write> {
    snap: &'a Snapshot<'p, 's>,
    data: &'a dyn DataSource,
    sel: &'a Selection,
    out: &'a mut StreamWriter<W>,
    open: Vec<Open>,
    /// The first path sent of each inode with several names.
    links: HashMap<u64, Vec<u8>>,
    written: Written,
    buf: Vec<u8>,
    /// The digest of what is written, for a synthetic full's proof.
    proof: Option<&'a mut TreeDigest>,
}

fn time(t: (i64, u32)) -> Timespec {
    Timespec {
        // Two's complement on the wire, as the kernel sends it.
        sec: t.0 as u64,
        nsec: t.1,
    }
}

impl<W: Write> Synth<'_, '_, '_, W> {
    fn put(&mut self, cmd: &Command<'_>) -> Result<(), IndexError> {
        self.out.write(cmd).map_err(output)
    }

    /// Send MKDIR for the directories the walk is in that are not made
    /// yet: a path below them is picked.
    fn make_parents(&mut self) -> Result<(), IndexError> {
        for o in self.open.iter_mut().filter(|o| !o.made) {
            self.out
                .write(&Command::Mkdir {
                    path: o.path.as_slice().into(),
                    ino: 0,
                })
                .map_err(output)?;
            o.made = true;
            self.written.paths += 1;
        }
        Ok(())
    }

    /// Make `path`; for anything but a directory, with its data and
    /// attributes.
    fn make(&mut self, path: &[u8], ino: u64, inode: &Inode) -> Result<(), IndexError> {
        self.written.paths += 1;
        let p = || path.into();
        if inode.kind != FileType::Dir && inode.nlink > 1 {
            if let Some(first) = self.links.get(&ino) {
                let first = first.clone();
                if let Some(p) = &mut self.proof {
                    p.link(path, ino);
                }
                return self.put(&Command::Link {
                    path: p(),
                    path_link: first.into(),
                });
            }
            self.links.insert(ino, path.to_vec());
        }
        let mode = inode.kind.mode_bits() | u64::from(inode.mode);
        let cmd = match inode.kind {
            FileType::File => Command::Mkfile { path: p(), ino },
            FileType::Dir => Command::Mkdir { path: p(), ino },
            FileType::Symlink => Command::Symlink {
                path: p(),
                ino,
                path_link: inode.target.as_slice().into(),
            },
            FileType::Fifo => Command::Mkfifo {
                path: p(),
                ino,
                rdev: Some(0),
                mode: Some(mode),
            },
            FileType::Sock => Command::Mksock {
                path: p(),
                ino,
                rdev: Some(0),
                mode: Some(mode),
            },
            FileType::Chr | FileType::Blk => Command::Mknod {
                path: p(),
                ino,
                rdev: inode.rdev,
                mode,
            },
        };
        self.put(&cmd)?;
        if inode.kind != FileType::Dir {
            let (xattrs, content) = self.attributes(path, ino, inode)?;
            if let Some(p) = &mut self.proof {
                p.path(path, ino, inode, &xattrs, content.as_ref());
            }
        } else if self.proof.is_some() {
            let xattrs = self.snap.xattrs(ino)?;
            if let Some(p) = &mut self.proof {
                p.path(path, ino, inode, &xattrs, None);
            }
        }
        Ok(())
    }

    /// Send the xattrs, data, owner, mode and times of `path`; the xattrs
    /// and, for a file in a proved stream, its content.
    fn attributes(
        &mut self,
        path: &[u8],
        ino: u64,
        inode: &Inode,
    ) -> Result<(Vec<Record>, Option<Content>), IndexError> {
        let p = || path.into();
        let all = self.snap.xattrs(ino)?;
        // File capabilities go last: a CHOWN drops them.
        let (caps, xattrs): (Vec<_>, Vec<_>) = all
            .iter()
            .cloned()
            .partition(|(name, _)| name == CAPABILITY);
        self.set_xattrs(path, xattrs)?;
        let mut content = None;
        if inode.kind == FileType::File {
            content = self.file_data(path, ino, inode)?;
            self.put(&Command::Truncate {
                path: p(),
                size: inode.size,
            })?;
        }
        self.put(&Command::Chown {
            path: p(),
            uid: u64::from(inode.uid),
            gid: u64::from(inode.gid),
        })?;
        if inode.kind != FileType::Symlink {
            self.put(&Command::Chmod {
                path: p(),
                mode: u64::from(inode.mode),
            })?;
        }
        if inode.flags != 0 {
            self.put(&Command::Fileattr {
                path: p(),
                attr: inode.flags,
            })?;
        }
        self.set_xattrs(path, caps)?;
        let t = time(inode.mtime);
        self.put(&Command::Utimes {
            path: p(),
            atime: t,
            mtime: t,
            ctime: t,
            otime: None,
        })?;
        Ok((all, content))
    }

    fn set_xattrs(
        &mut self,
        path: &[u8],
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<(), IndexError> {
        for (name, value) in xattrs {
            self.put(&Command::SetXattr {
                path: path.into(),
                name: name.into(),
                data: value.into(),
            })?;
        }
        Ok(())
    }

    /// Send the data of file `path`; its content, in a proved stream.
    fn file_data(
        &mut self,
        path: &[u8],
        ino: u64,
        inode: &Inode,
    ) -> Result<Option<Content>, IndexError> {
        let mut buf = std::mem::take(&mut self.buf);
        let mut hasher = self.proof.is_some().then(|| ContentHasher::new(inode.size));
        let res = (|| -> Result<Vec<(u64, u64)>, IndexError> {
            let ranges = self.snap.data_ranges(ino, inode.size)?;
            for &(start, len) in &ranges {
                let end = start.saturating_add(len);
                let mut at = start;
                while at < end {
                    let want = usize::try_from(end - at)
                        .unwrap_or(usize::MAX)
                        .min(buf.len());
                    let n = self
                        .snap
                        .read(ino, inode, at, &mut buf[..want], self.data)?;
                    if n == 0 {
                        break;
                    }
                    if let Some(h) = &mut hasher {
                        h.feed(at, &buf[..n]);
                    }
                    for (i, piece) in buf[..n].chunks(WRITE_SIZE).enumerate() {
                        self.put(&Command::Write {
                            path: path.into(),
                            offset: at + (i * WRITE_SIZE) as u64,
                            data: piece.into(),
                        })?;
                    }
                    at += n as u64;
                    self.written.bytes += n as u64;
                }
            }
            Ok(ranges)
        })();
        self.buf = buf;
        let ranges = res?;
        Ok(hasher.map(|h| (ranges, h.finish())))
    }
}

impl<W: Write> Visit for Synth<'_, '_, '_, W> {
    fn enter(&mut self, path: &[u8], ino: u64, inode: &Inode) -> Result<bool, IndexError> {
        if self.sel.excludes(path) {
            return Ok(false);
        }
        let whole = self.open.last().is_some_and(|o| o.whole) || self.sel.includes(path);
        let dir = inode.kind == FileType::Dir;
        if whole {
            self.make_parents()?;
            self.make(path, ino, inode)?;
        } else if !(dir && self.sel.may_include_below(path)) {
            return Ok(false);
        }
        if dir {
            self.open.push(Open {
                path: path.to_vec(),
                made: whole,
                whole,
            });
        }
        Ok(dir)
    }

    fn leave(&mut self, path: &[u8], ino: u64, inode: &Inode) -> Result<(), IndexError> {
        if self.open.pop().is_some_and(|o| o.made) {
            self.attributes(path, ino, inode)?;
        }
        Ok(())
    }
}
