//! File data commands: UPDATE_EXTENT (`--no-data`), ENCODED_WRITE
//! (`--compressed-data`) and WRITE (`send_extent_data`,
//! `send_encoded_extent`); the data itself is read by the pipeline.

use std::io::Write;

use stream_format::Command;

use crate::fs::{Compression, ExtentData, FileExtent};
use crate::send::data;
use crate::send::error::SendError;

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
        if let Some(r) = &mut self.recording {
            r.push(crate::send::pipeline::DataOp::Write { offset, len });
        }
        let path = self.cur_inode_path()?;
        if self.opts.no_data {
            return self.emit(&Command::UpdateExtent {
                path: path.into(),
                offset,
                size: len,
            });
        }
        if self.opts.compressed_data
            && ext.compression != Compression::None
            && encoded_len(ext) <= len
        {
            return self.send_encoded(ext, &path, offset, len);
        }
        // Holes and preallocated ranges of an existing file read as zeros.
        let source = (!ext.is_hole_or_prealloc()).then_some(ext);
        self.out
            .write_data(self.cur.ino, &path, offset, len, source)?;
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
        let compression = data::encoded_compression(ext.compression, self.sectorsize)
            .ok_or_else(|| SendError::corrupt(self.cur.ino, "unknown compression type"))?;
        let n = encoded_len(ext);
        // The data is read by a job of the pipeline.
        let bytes: &[u8] = &[];
        let cmd = match &ext.data {
            ExtentData::Inline(_) => Command::EncodedWrite {
                path: path.into(),
                offset,
                unencoded_file_len: (ext.file_offset + ext.ram_bytes - offset).min(len),
                unencoded_len: ext.ram_bytes,
                unencoded_offset: offset - ext.file_offset,
                compression: Some(compression),
                encryption: None,
                data: bytes.into(),
            },
            ExtentData::Regular(d) | ExtentData::Prealloc(d) => Command::EncodedWrite {
                path: path.into(),
                offset,
                unencoded_file_len: (ext.file_offset + d.num_bytes - offset).min(len),
                unencoded_len: ext.ram_bytes,
                unencoded_offset: offset - ext.file_offset + d.offset,
                compression: Some(compression),
                encryption: Some(0),
                data: bytes.into(),
            },
        };
        self.out
            .write_encoded(self.cur.ino, cmd.into_owned(), ext)?;
        self.progress.data(len);
        self.stats.encoded_bytes = self.stats.encoded_bytes.saturating_add(n);
        Ok(())
    }
}

/// The encoded (on-disk) size of an extent's data: the inline payload, or
/// `disk_num_bytes`.
fn encoded_len(ext: &FileExtent) -> u64 {
    match &ext.data {
        ExtentData::Inline(data) => u64::try_from(data.len()).unwrap_or(u64::MAX),
        ExtentData::Regular(d) | ExtentData::Prealloc(d) => d.disk_num_bytes,
    }
}
