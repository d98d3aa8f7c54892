//! The file data commands: WRITE, TRUNCATE, FALLOCATE, ENCODED_WRITE (as it
//! is through `BTRFS_IOC_ENCODED_WRITE` where the target takes it, else
//! decoded) and CLONE, and the open file they go through (the receiver's
//! `wcache`). When the file has lane jobs queued a command goes to its lane
//! (`offload`); it must not change names or other attributes.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rustix::fs::FallocateFlags;

use super::subvols::{not_found, subvol_target};
use super::{Receiver, WFile};
use crate::receive::ApplyErrorKind;
use crate::receive::copy::{self};
use crate::receive::encoded;
use crate::receive::lanes::Op;
use crate::receive::subvol::NotFound;
use crate::sys;
use crate::types::Uuid;

impl Receiver<'_> {
    /// WRITE `data` at `offset` (after the file's queued jobs, if it has
    /// any: then on its lane).
    pub(super) fn write(
        &mut self,
        path: &[u8],
        offset: u64,
        data: &[u8],
    ) -> Result<(), ApplyErrorKind> {
        if self.queued(path) {
            let buf = data.to_vec();
            let len = buf.len();
            let op = Op::Write {
                buf,
                start: 0,
                len,
                offset,
            };
            return self.queue_on_lane(path, op);
        }
        self.file(path)?.write_all_at(data, offset)?;
        Ok(())
    }

    /// TRUNCATE to `size`.
    pub(super) fn truncate(&mut self, path: &[u8], size: u64) -> Result<(), ApplyErrorKind> {
        if self.queued(path) {
            return self.queue_on_lane(path, Op::Truncate(size));
        }
        self.file(path)?.set_len(size)?;
        Ok(())
    }

    /// FALLOCATE with the stream's mode bits (the kernel sends hole punches).
    pub(super) fn fallocate(
        &mut self,
        path: &[u8],
        mode: u32,
        offset: u64,
        size: u64,
    ) -> Result<(), ApplyErrorKind> {
        if self.queued(path) {
            let op = Op::Fallocate { mode, offset, size };
            return self.queue_on_lane(path, op);
        }
        let f = self.file(path)?;
        rustix::fs::fallocate(f, FallocateFlags::from_bits_retain(mode), offset, size)?;
        Ok(())
    }

    /// ENCODED_WRITE (fields `e` checked, `data` its DATA): as it is where
    /// the target takes it, else decoded and written.
    pub(super) fn encoded_write(
        &mut self,
        path: &[u8],
        data: &[u8],
        e: sys::Encoded<'_>,
    ) -> Result<(), ApplyErrorKind> {
        if self.queued(path) {
            let buf = data.to_vec();
            let len = buf.len();
            let fields = sys::Encoded { data: &[], ..e };
            let op = Op::Encoded {
                buf,
                start: 0,
                len,
                fields,
            };
            return self.queue_on_lane(path, op);
        }
        // Uncompressed data cannot go through the ioctl: plain write.
        if self.encoded_ioctl.load(Ordering::Relaxed) && e.compression != 0 {
            let f = self.file(path)?;
            match sys::encoded_write(f, &e) {
                Ok(()) => return Ok(()),
                Err(err) => match sys::refusal(err) {
                    sys::Refusal::Never => {
                        self.encoded_ioctl.store(false, Ordering::Relaxed);
                        self.ioctl_refused = Some(err);
                        self.progress.encoded_fallback(path, err.into());
                    }
                    sys::Refusal::ThisOne => self.progress.encoded_fallback(path, err.into()),
                    sys::Refusal::Fail => return Err(err.into()),
                },
            }
        } else if let Some(err) = self.ioctl_refused
            && e.compression != 0
        {
            // Given up for good after the target refused it: btrfs-progs
            // tries each time, is refused the same way and says so.
            self.progress.encoded_fallback(path, err.into());
        }
        let bytes = encoded::decode(
            e.compression,
            e.encryption,
            data,
            e.unencoded_len,
            e.unencoded_offset,
            e.unencoded_file_len,
        )?;
        self.file(path)?.write_all_at(&bytes, e.offset)?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn clone_range(
        &mut self,
        path: &[u8],
        offset: u64,
        len: u64,
        clone_uuid: Uuid,
        clone_ctransid: u64,
        clone_path: &[u8],
        clone_offset: u64,
    ) -> Result<(), ApplyErrorKind> {
        self.settle(path);
        self.settle(clone_path);
        let cur = self.cur()?;
        let other;
        let src_target = if cur.record.uuid == clone_uuid {
            &cur.target
        } else {
            let found = self
                .btrfs
                .as_ref()
                .map(|b| b.find(clone_uuid.0, clone_ctransid));
            other = match found {
                Some(Ok(f)) => subvol_target(&f.path)?,
                None | Some(Err(NotFound::Missing)) => {
                    let rec = self.find_received(clone_uuid, clone_ctransid, false)?;
                    self.dir.target(&rec.name)?
                }
                Some(Err(e)) => {
                    return Err(match not_found(e, clone_uuid, clone_ctransid) {
                        ApplyErrorKind::ParentMissing { uuid, ctransid, .. } => {
                            ApplyErrorKind::ParentMissing {
                                uuid,
                                ctransid,
                                parent: false,
                            }
                        }
                        k => k,
                    });
                }
            };
            &other
        };
        let src = src_target.open_regular(clone_path, false)?;
        let dst = self.file(path)?;
        copy::copy_range(&src, clone_offset, dst, offset, len, false)?;
        Ok(())
    }

    /// The cached open file, if `path` names it.
    pub(super) fn cached_file(&self, path: &[u8]) -> Option<&File> {
        match &self.wcache {
            Some(w) if w.path == path => Some(&w.file),
            _ => None,
        }
    }

    /// The open file for `path`, from the cache or opened now.
    pub(super) fn file(&mut self, path: &[u8]) -> Result<&File, ApplyErrorKind> {
        Ok(self.file_arc(path)?.0)
    }

    /// The open file for `path` and whether it has a single link (checked
    /// when it was opened).
    pub(super) fn file_arc(&mut self, path: &[u8]) -> Result<(&Arc<File>, bool), ApplyErrorKind> {
        let hit = matches!(&self.wcache, Some(w) if w.path == path);
        if !hit {
            self.wcache = None;
            let (f, st) = self.cur()?.target.open_regular_stat(path, true)?;
            self.wcache = Some(WFile {
                path: path.to_vec(),
                file: Arc::new(f),
                single: self.lanes.is_some() && st.st_nlink == 1,
                ino: st.st_ino,
                fresh_owner: None,
            });
        }
        // OK to unwrap: filled just above.
        let w = self.wcache.as_ref().expect("write cache");
        Ok((&w.file, w.single))
    }
}
