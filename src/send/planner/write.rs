//! File data commands: UPDATE_EXTENT (`--no-data`), ENCODED_WRITE
//! (`--compressed-data`) and WRITE (`send_extent_data`,
//! `send_encoded_extent`); the data itself is read by the pipeline.

use std::io::Write;

use stream_format::Command;

use crate::ondisk;
use crate::send::data;
use crate::send::error::SendError;
use crate::send::view::{ExtentKind, FileExtent};

use super::Planner;

impl<'a, W: Write> Planner<'a, W> {
    /// `send_extent_data`: UPDATE_EXTENT, ENCODED_WRITE or WRITEs of
    /// `[offset, offset + len)`, which lies inside `ext`.
    pub(super) fn send_extent_data(
        &mut self,
        ext: &FileExtent,
        offset: u64,
        len: u64,
    ) -> Result<(), SendError> {
        let path = self.cur_inode_path()?;
        if self.opts.no_data {
            return self.emit(&Command::UpdateExtent {
                path: path.into(),
                offset,
                size: len,
            });
        }
        if self.opts.compressed_data && ext.compression != ondisk::BTRFS_COMPRESS_NONE {
            let fits = match &ext.kind {
                ExtentKind::Inline(data) => u64::try_from(data.len()).unwrap_or(u64::MAX) <= len,
                ExtentKind::Regular { disk_num_bytes, .. } => *disk_num_bytes <= len,
            };
            if fits {
                return self.send_encoded(ext, &path, offset, len);
            }
        }
        // Holes and preallocated ranges of an existing file read as zeros.
        let zeros = matches!(
            ext.kind,
            ExtentKind::Regular { prealloc: true, .. } | ExtentKind::Regular { disk_bytenr: 0, .. }
        );
        let source = if zeros {
            None
        } else {
            Some(data::fs_extent(ext)?)
        };
        self.out
            .write_data(self.cur.ino, &path, offset, len, source.as_ref())?;
        self.progress.data(len);
        self.stats.data_bytes = self.stats.data_bytes.saturating_add(len);
        Ok(())
    }

    /// `send_encoded_inline_extent` / `send_encoded_extent`.
    pub(super) fn send_encoded(
        &mut self,
        ext: &FileExtent,
        path: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<(), SendError> {
        let compression =
            data::encoded_compression(ext.compression, self.fs.volume().superblock().sectorsize)
                .ok_or_else(|| SendError::corrupt(ext.ino, "unknown compression type"))?;
        let source = data::fs_extent(ext)?;
        let n = match &ext.kind {
            ExtentKind::Inline(data) => u64::try_from(data.len()).unwrap_or(u64::MAX),
            ExtentKind::Regular { disk_num_bytes, .. } => *disk_num_bytes,
        };
        // The data is read by a job of the pipeline.
        let bytes: &[u8] = &[];
        let cmd = match &ext.kind {
            ExtentKind::Inline(_) => Command::EncodedWrite {
                path: path.into(),
                offset,
                unencoded_file_len: (ext.file_offset + ext.ram_bytes - offset).min(len),
                unencoded_len: ext.ram_bytes,
                unencoded_offset: offset - ext.file_offset,
                compression: Some(compression),
                encryption: None,
                data: bytes.into(),
            },
            ExtentKind::Regular {
                offset: eoff,
                num_bytes,
                ..
            } => Command::EncodedWrite {
                path: path.into(),
                offset,
                unencoded_file_len: (ext.file_offset + num_bytes - offset).min(len),
                unencoded_len: ext.ram_bytes,
                unencoded_offset: offset - ext.file_offset + eoff,
                compression: Some(compression),
                encryption: Some(0),
                data: bytes.into(),
            },
        };
        self.out
            .write_encoded(self.cur.ino, cmd.into_owned(), &source)?;
        self.progress.data(len);
        self.stats.encoded_bytes = self.stats.encoded_bytes.saturating_add(n);
        Ok(())
    }
}
