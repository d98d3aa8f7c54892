//! File extents: which extents of a file are sent (`process_extent`),
//! unchanged extents of an incremental send (`is_extent_unchanged`), and
//! holes (`maybe_send_hole`, `send_hole`: v1 zero writes, v2 punches).

use std::io::Write;

use stream_format::Command;

use crate::fs::FileType;
use crate::fs::{ExtentData, FileExtent};
use crate::ondisk;
use crate::send::compare::Change;
use crate::send::error::SendError;
use crate::tree::walk::ItemRef;
use crate::types::Logical;

use super::Planner;

/// Data extents remembered as sent (for the full-send shortcut of clone
/// detection) before the index is dropped and every shared extent is
/// walked (memory bound: ~16 MiB).
const CLONE_INDEX_MAX: usize = 1 << 20;
/// `FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE` (incremental v2 holes).
const FALLOC_PUNCH: u32 = 3;

impl<'a, W: Write> Planner<'a, W> {
    /// `changed_extent`: a new or changed EXTENT_DATA item of the current
    /// inode (deleted ones need nothing: holes are found from the next
    /// item or at the end of the inode).
    pub(super) fn changed_extent(
        &mut self,
        change: Change,
        left: Option<&ItemRef<'_>>,
    ) -> Result<(), SendError> {
        if self.cur.new_gen || self.cur.deleted || change == Change::Deleted {
            return Ok(());
        }
        if let Some(l) = left {
            let ext = FileExtent::parse(l)?;
            self.process_extent(&ext, l.leaf, l.slot)?;
        }
        Ok(())
    }

    /// `process_all_extents` of a new-generation inode.
    pub(super) fn process_all_extents(&mut self) -> Result<(), SendError> {
        let ino = self.cur.ino;
        let mut exts = Vec::new();
        let data = ondisk::BTRFS_EXTENT_DATA_KEY;
        self.view.each_item(ino, data..=data, |item| {
            exts.push((FileExtent::parse(item)?, item.leaf, item.slot));
            Ok(())
        })?;
        for (ext, leaf, slot) in exts {
            self.process_extent(&ext, leaf, slot)?;
        }
        Ok(())
    }

    /// `process_extent`: the extent item of the current inode at `slot` of
    /// `leaf`.
    pub(super) fn process_extent(
        &mut self,
        ext: &FileExtent,
        leaf: Logical,
        slot: u32,
    ) -> Result<(), SendError> {
        if self.cur.file_type() == FileType::Symlink {
            return Ok(());
        }
        let incremental = self.parent.is_some() && !self.cur.new;
        if incremental && self.is_extent_unchanged(ext)? {
            return self.maybe_send_hole(ext, slot);
        }
        if !incremental && ext.is_hole_or_prealloc() {
            return Ok(());
        }
        self.extent_data(ext, leaf)?;
        self.maybe_send_hole(ext, slot)?;
        if let Some(d) = ext.disk()
            && d.disk_bytenr.get() != 0
            && let Some(index) = &mut self.clone_index
        {
            if index.len() >= CLONE_INDEX_MAX {
                self.clone_index = None;
            } else {
                index.insert(d.disk_bytenr.get());
            }
        }
        Ok(())
    }

    /// `need_send_hole`.
    pub(super) fn need_send_hole(&self) -> bool {
        self.parent.is_some()
            && !self.cur.new
            && !self.cur.new_gen
            && !self.cur.deleted
            && self.cur.file_type() == FileType::Regular
    }

    /// `get_last_extent`: the end of the snapshot's extent item of the
    /// current inode at or before `offset` (0 if none).
    pub(super) fn last_extent_end(&self, offset: u64) -> Result<u64, SendError> {
        let ino = self.cur.ino;
        let mut it = self.view.extents_from_iter(ino, offset)?;
        match it.next_extent()? {
            Some(e) if e.file_offset <= offset => Ok(e.end(self.sectorsize)),
            _ => Ok(0),
        }
    }

    /// `maybe_send_hole`.
    pub(super) fn maybe_send_hole(&mut self, ext: &FileExtent, slot: u32) -> Result<(), SendError> {
        if !self.need_send_hole() {
            return Ok(());
        }
        let off = ext.file_offset;
        if self.cur.last_extent.is_none()
            || (slot == 0 && self.cur.last_extent.is_some_and(|l| l < off))
        {
            let end = if off == 0 {
                0
            } else {
                self.last_extent_end(off - 1)?
            };
            self.cur.last_extent = Some(end);
        }
        let last = self.cur.last_extent.unwrap_or(0);
        if last < off && !self.range_is_hole_in_parent(last, off)? {
            self.send_hole(off)?;
        }
        self.cur.last_extent = Some(ext.end(self.sectorsize));
        Ok(())
    }

    /// `range_is_hole_in_parent`.
    pub(super) fn range_is_hole_in_parent(&self, start: u64, end: u64) -> Result<bool, SendError> {
        let Some(parent) = self.parent.clone() else {
            return Ok(true);
        };
        let mut it = parent.extents_from_iter(self.cur.ino, start)?;
        while let Some(e) = it.next_extent()? {
            if e.file_offset >= end {
                break;
            }
            if e.end(self.sectorsize) <= start {
                continue;
            }
            if e.disk().is_some_and(|d| d.disk_bytenr.get() == 0) {
                continue;
            }
            return Ok(false);
        }
        Ok(true)
    }

    /// `send_hole`: punch `[last_extent, end)` (v2) or write zeros (v1).
    pub(super) fn send_hole(&mut self, end: u64) -> Result<(), SendError> {
        let offset = self.cur.last_extent.unwrap_or(0);
        let path = self.cur_inode_path()?;
        if self.opts.version >= 2 {
            return self.emit(&Command::Fallocate {
                path: path.into(),
                mode: FALLOC_PUNCH,
                offset,
                size: end - offset,
            });
        }
        if offset >= self.cur.size {
            return Ok(());
        }
        let end = end.min(self.cur.size);
        if self.opts.no_data {
            return self.emit(&Command::UpdateExtent {
                path: path.into(),
                offset,
                size: end - offset,
            });
        }
        self.out
            .write_data(self.cur.ino, &path, offset, end - offset, None)?;
        self.cur.next_write_offset = end;
        Ok(())
    }

    /// `is_extent_unchanged`: the parent's extents cover the same range
    /// with the same data.
    pub(super) fn is_extent_unchanged(&self, ext: &FileExtent) -> Result<bool, SendError> {
        let Some(parent) = self.parent.clone() else {
            return Ok(false);
        };
        let ExtentData::Regular(left) = &ext.data else {
            return Ok(false);
        };
        let (left_disknr, left_offset, left_len) =
            (left.disk_bytenr.get(), left.offset, left.num_bytes);
        let ekey = ext.file_offset;
        let left_gen = ext.generation;
        let mut it = parent.extents_from_iter(self.cur.ino, ekey)?;
        let Some(mut e) = it.next_extent()?.filter(|e| e.file_offset <= ekey) else {
            return Ok(left_disknr == 0);
        };
        let end = ekey.saturating_add(left_len);
        let mut key_off = e.file_offset;
        let mut first = true;
        while key_off < end {
            let (right_len, right) = match &e.data {
                ExtentData::Inline(_) => {
                    let sector = u64::from(self.sectorsize);
                    (e.ram_bytes.div_ceil(sector).saturating_mul(sector), None)
                }
                ExtentData::Regular(d) => (d.num_bytes, Some((d.disk_bytenr.get(), d.offset))),
                ExtentData::Prealloc(_) => return Ok(false),
            };
            if first && key_off.saturating_add(right_len) <= ekey {
                return Ok(left_disknr == 0);
            }
            first = false;
            let Some((right_disknr, mut right_offset)) = right else {
                return Ok(false);
            };
            let mut left_fixed = left_offset;
            if key_off < ekey {
                right_offset += ekey - key_off;
            } else {
                left_fixed += key_off - ekey;
            }
            if left_disknr != right_disknr || left_fixed != right_offset || left_gen != e.generation
            {
                return Ok(false);
            }
            match it.next_extent()? {
                Some(n) if n.file_offset == key_off.saturating_add(right_len) => {
                    key_off = n.file_offset;
                    e = n;
                }
                Some(_) => return Ok(false),
                None => {
                    key_off = key_off.saturating_add(right_len);
                    break;
                }
            }
        }
        Ok(key_off >= end)
    }
}
