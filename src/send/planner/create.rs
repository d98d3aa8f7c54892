//! Creating inodes: MKFILE, MKDIR, SYMLINK, MKNOD, MKFIFO, MKSOCK at the
//! orphan name (`send_create_inode`), unless a directory was created
//! early for a child with a lower number (`send_create_inode_if_needed`).

use std::io::Write;

use stream_format::Command;

use crate::fs::{Compression, ExtentData, FileType, Inode};
use crate::send::error::SendError;

use super::Planner;

impl<'a, W: Write> Planner<'a, W> {
    /// `send_create_inode_if_needed`.
    pub(super) fn create_inode_if_needed(
        &mut self,
        ino: u64,
        info: &Inode,
    ) -> Result<(), SendError> {
        if info.file_type() == FileType::Dir && self.created_dirs.remove(&ino) {
            return Ok(());
        }
        self.send_create_inode(ino, info)
    }

    /// `send_create_inode`: create `ino` at its orphan name.
    pub(super) fn send_create_inode(&mut self, ino: u64, info: &Inode) -> Result<(), SendError> {
        let path = self.orphan_name(ino, info.generation.get())?;
        let mode = u64::from(info.mode);
        let rdev = info.rdev_encoded();
        let cmd = match info.file_type() {
            FileType::Regular => Command::Mkfile {
                path: path.into(),
                ino,
            },
            FileType::Dir => Command::Mkdir {
                path: path.into(),
                ino,
            },
            FileType::Symlink => {
                let target = self.read_symlink(ino)?;
                Command::Symlink {
                    path: path.into(),
                    ino,
                    path_link: target.into(),
                }
            }
            FileType::CharDev | FileType::BlockDev => Command::Mknod {
                path: path.into(),
                ino,
                rdev,
                mode,
            },
            FileType::Fifo => Command::Mkfifo {
                path: path.into(),
                ino,
                rdev: Some(rdev),
                mode: Some(mode),
            },
            FileType::Socket => Command::Mksock {
                path: path.into(),
                ino,
                rdev: Some(rdev),
                mode: Some(mode),
            },
            FileType::Unknown(_) => {
                return Err(SendError::corrupt(
                    ino,
                    format!("unsupported file type in mode 0{:o}", info.mode),
                ));
            }
        };
        self.emit(&cmd)
    }

    /// `read_symlink`: the target is the inline extent at offset 0.
    pub(super) fn read_symlink(&self, ino: u64) -> Result<Vec<u8>, SendError> {
        let mut it = self.view.extents_from_iter(ino, 0)?;
        let ext = it
            .next_extent()?
            .filter(|e| e.file_offset == 0)
            .ok_or_else(|| SendError::corrupt(ino, "empty symlink inode"))?;
        match ext.data {
            ExtentData::Inline(data) if ext.compression == Compression::None => {
                let n = usize::try_from(ext.ram_bytes).unwrap_or(usize::MAX);
                data.get(..n)
                    .map(<[u8]>::to_vec)
                    .ok_or_else(|| SendError::corrupt(ino, "symlink target shorter than ram_bytes"))
            }
            _ => Err(SendError::corrupt(
                ino,
                "symlink extent is not inline and uncompressed",
            )),
        }
    }
}
