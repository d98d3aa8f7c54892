//! Extended attributes (`changed_xattr`, `process_new_xattr`,
//! `process_deleted_xattr`) and the directory-utimes cache of Linux ≥ 6.3
//! (`cache_dir_utimes`: 64 entries, trimmed after every item, flushed most
//! recently used first).

use std::io::Write;

use stream_format::Command;

use crate::fs::Timespec;
use crate::ondisk;
use crate::send::compare::Change;
use crate::send::error::SendError;
use crate::send::view;
use crate::tree::walk::ItemRef;

use super::Planner;

/// `SEND_MAX_DIR_UTIMES_CACHE_SIZE`.
const DIR_UTIMES_CACHE_SIZE: usize = 64;
const XATTR_ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const XATTR_ACL_DEFAULT: &[u8] = b"system.posix_acl_default";
/// The xattr the kernel sends only at the end of an inode.
pub(super) const XATTR_NAME_CAPS: &[u8] = b"security.capability";

impl<'a, W: Write> Planner<'a, W> {
    /// `changed_xattr`: SET_XATTR for new or changed names, REMOVE_XATTR
    /// for names only in the parent's item.
    pub(super) fn changed_xattr(
        &mut self,
        change: Change,
        left: Option<&ItemRef<'_>>,
        right: Option<&ItemRef<'_>>,
    ) -> Result<(), SendError> {
        if self.cur.new_gen || self.cur.deleted {
            return Ok(());
        }
        let new = match left.filter(|_| change != Change::Deleted) {
            Some(l) => view::parse_dir_items(l)?,
            None => Vec::new(),
        };
        let old = match right.filter(|_| change != Change::New) {
            Some(r) => view::parse_dir_items(r)?,
            None => Vec::new(),
        };
        for e in &new {
            if !old.iter().any(|o| o.name == e.name && o.data == e.data) {
                self.process_new_xattr(e.name, e.data)?;
            }
        }
        for o in &old {
            if !new.iter().any(|e| e.name == o.name) {
                self.process_deleted_xattr(o.name)?;
            }
        }
        Ok(())
    }

    /// `process_all_new_xattrs` of a new-generation inode.
    pub(super) fn process_all_new_xattrs(&mut self) -> Result<(), SendError> {
        let ino = self.cur.ino;
        let mut all = Vec::new();
        let xattr = ondisk::BTRFS_XATTR_ITEM_KEY;
        self.view.each_item(ino, xattr..=xattr, |item| {
            for e in view::parse_dir_items(item)? {
                all.push((e.name.to_vec(), e.data.to_vec()));
            }
            Ok(())
        })?;
        for (n, d) in all {
            self.process_new_xattr(&n, &d)?;
        }
        Ok(())
    }

    /// `__process_new_xattr`.
    pub(super) fn process_new_xattr(&mut self, name: &[u8], data: &[u8]) -> Result<(), SendError> {
        // The kernel compares only `name_len` bytes: any prefix of the
        // capability name is left for the end of the inode too.
        if XATTR_NAME_CAPS.starts_with(name) {
            return Ok(());
        }
        // Empty ACLs are stored as empty values; receivers reject those, so
        // the kernel sends an ACL header without entries (version 2).
        let acl_header = [2u8, 0, 0, 0];
        let data = if data.is_empty()
            && (XATTR_ACL_ACCESS.starts_with(name) || XATTR_ACL_DEFAULT.starts_with(name))
        {
            &acl_header[..]
        } else {
            data
        };
        let path = self.cur_inode_path()?;
        self.emit(&Command::SetXattr {
            path: path.into(),
            name: name.into(),
            data: data.into(),
        })
    }

    /// `__process_deleted_xattr`.
    pub(super) fn process_deleted_xattr(&mut self, name: &[u8]) -> Result<(), SendError> {
        let path = self.cur_inode_path()?;
        self.emit(&Command::RemoveXattr {
            path: path.into(),
            name: name.into(),
        })
    }

    /// `cache_dir_utimes`: mark (or re-mark) a directory as most recently used.
    pub(super) fn cache_dir_utimes(&mut self, ino: u64, generation: u64) {
        if let Some(pos) = self.dir_utimes.iter().position(|e| *e == (ino, generation)) {
            self.dir_utimes.remove(pos);
        }
        self.dir_utimes.push_back((ino, generation));
    }

    pub(super) fn trim_dir_utimes_cache(&mut self) -> Result<(), SendError> {
        while self.dir_utimes.len() > DIR_UTIMES_CACHE_SIZE {
            let Some((ino, generation)) = self.dir_utimes.pop_front() else {
                break;
            };
            self.send_utimes(ino, generation)?;
        }
        Ok(())
    }

    pub(super) fn send_utimes(&mut self, ino: u64, generation: u64) -> Result<(), SendError> {
        let info = self.inode(ino)?;
        let path = self.cur_path(ino, generation)?;
        let otime = (self.opts.version >= 2).then_some(stream_time(info.otime));
        self.emit(&Command::Utimes {
            path: path.into(),
            atime: stream_time(info.atime),
            mtime: stream_time(info.mtime),
            ctime: stream_time(info.ctime),
            otime,
        })
    }
}

/// An inode time as the stream carries it: the on-disk seconds and
/// nanoseconds, bit for bit (`struct btrfs_timespec` → `TLV_PUT_BTRFS_TIMESPEC`).
fn stream_time(t: Timespec) -> stream_format::Timespec {
    stream_format::Timespec {
        sec: t.sec.cast_unsigned(),
        nsec: t.nsec,
    }
}
