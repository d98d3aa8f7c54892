//! Devices: where bytes come from.
//!
//! A [`Device`] reads exact byte ranges at physical offsets. [`FileDevice`]
//! wraps an image file or block device opened read-only and reads with
//! `pread` (`FileExt::read_exact_at`), so one device can serve several
//! threads without a shared file position. [`MemDevice`] holds an image in
//! memory (tests, fuzzing). Everything above talks to `&dyn Device`.
//!
//! Submodules: [`readahead`], the reader-thread pool and bounded cache the
//! volume reads tree blocks through, and [`raid56`], the parity arithmetic
//! that rebuilds RAID5/6 strips.

pub mod raid56;
pub mod readahead;

use std::fmt;
use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::types::Physical;

/// A source of bytes at physical offsets: one device of a filesystem.
pub trait Device: Send + Sync + fmt::Debug {
    /// The path, for messages.
    fn path(&self) -> &Path;

    /// Size in bytes.
    fn size(&self) -> u64;

    /// Fill `buf` from `offset`.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the read fails or would pass the end of the device.
    fn read_at(&self, buf: &mut [u8], offset: Physical) -> Result<()>;
}

/// An image file or block device, opened read-only.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    size: u64,
}

impl FileDevice {
    /// Open `path` read-only.
    ///
    /// # Errors
    ///
    /// [`Error::Open`] if it cannot be opened or sized.
    pub fn open(path: impl AsRef<Path>) -> Result<FileDevice> {
        let path = path.as_ref().to_path_buf();
        let open_err = |error: io::Error| Error::Open {
            hint: permission_hint(&path, &error),
            device: path.clone(),
            error,
        };
        let mut file = File::open(&path).map_err(open_err)?;
        // A directory opens, but every read fails: say so at once.
        if file.metadata().map_err(open_err)?.is_dir() {
            return Err(open_err(io::Error::from_raw_os_error(21)));
        }
        // A block device reports length 0 in its metadata; seeking to the
        // end gives its size for both kinds.
        let size = file.seek(SeekFrom::End(0)).map_err(open_err)?;
        Ok(FileDevice { file, path, size })
    }
}

/// What a permission error on `path` asks for: for a block device, root or
/// read access through the group that owns it (usually `disk`).
fn permission_hint(path: &Path, error: &io::Error) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if error.kind() != io::ErrorKind::PermissionDenied {
        return None;
    }
    let meta = std::fs::metadata(path).ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    let group = group_name(meta.gid()).unwrap_or_else(|| format!("gid {}", meta.gid()));
    Some(format!(
        "reading a block device needs root, or read access to the device: \
         membership in its group `{group}` (e.g. `usermod -aG {group} USER`, then log in again)"
    ))
}

/// The name of group `gid` from `/etc/group`.
fn group_name(gid: u32) -> Option<String> {
    let text = std::fs::read_to_string("/etc/group").ok()?;
    text.lines().find_map(|line| {
        let mut f = line.split(':');
        let name = f.next()?;
        let id = f.nth(1)?;
        (id.parse() == Ok(gid)).then(|| name.to_owned())
    })
}

impl Device for FileDevice {
    fn path(&self) -> &Path {
        &self.path
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: Physical) -> Result<()> {
        self.file
            .read_exact_at(buf, offset.get())
            .map_err(|error| Error::Io {
                device: self.path.clone(),
                offset,
                error,
            })
    }
}

/// A device held in memory.
pub struct MemDevice {
    data: Vec<u8>,
    path: PathBuf,
}

impl MemDevice {
    /// A device with these bytes, named `path` in messages.
    pub fn new(data: Vec<u8>, path: impl Into<PathBuf>) -> MemDevice {
        MemDevice {
            data,
            path: path.into(),
        }
    }

    /// The bytes, for patching in tests.
    pub fn data_mut(&mut self) -> &mut Vec<u8> {
        &mut self.data
    }
}

impl fmt::Debug for MemDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemDevice")
            .field("path", &self.path)
            .field("len", &self.data.len())
            .finish()
    }
}

impl Device for MemDevice {
    fn path(&self) -> &Path {
        &self.path
    }

    fn size(&self) -> u64 {
        u64::try_from(self.data.len()).unwrap_or(u64::MAX)
    }

    fn read_at(&self, buf: &mut [u8], offset: Physical) -> Result<()> {
        let src = usize::try_from(offset.get())
            .ok()
            .and_then(|start| self.data.get(start..start.checked_add(buf.len())?));
        match src {
            Some(src) => {
                buf.copy_from_slice(src);
                Ok(())
            }
            None => Err(Error::Io {
                device: self.path.clone(),
                offset,
                error: io::Error::from(io::ErrorKind::UnexpectedEof),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_device_reads_and_reports_eof() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut f, b"0123456789").unwrap();
        let dev = FileDevice::open(f.path()).unwrap();
        assert_eq!(dev.size(), 10);
        let mut buf = [0u8; 4];
        dev.read_at(&mut buf, Physical(3)).unwrap();
        assert_eq!(&buf, b"3456");
        let err = dev.read_at(&mut buf, Physical(8)).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("read error on ") && msg.contains(" at physical 8: "),
            "{msg}"
        );
    }

    #[test]
    fn open_missing() {
        let err = FileDevice::open("/nonexistent/btrsend-test").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot open /nonexistent/btrsend-test: ")
        );
    }

    /// The hint of a permission error on a block device names root and the
    /// group owning the node (`disk` here, as udev makes it).
    #[test]
    fn permission_error_on_a_block_device_says_what_is_needed() {
        use rustix::fs::{CWD, FileType, Mode};
        if !rustix::process::geteuid().is_root() {
            eprintln!(
                "=== SKIPPED permission_error_on_a_block_device_says_what_is_needed: \
                 needs root (mknod) ==="
            );
            return;
        }
        let Some(disk) = group_id("disk") else {
            eprintln!(
                "=== SKIPPED permission_error_on_a_block_device_says_what_is_needed: no group disk ==="
            );
            return;
        };
        let tmp = tempfile::tempdir().unwrap();
        let node = tmp.path().join("loop200");
        // A node for loop device 200 (7:200); never opened.
        let dev = (7 << 8) | 200;
        rustix::fs::mknodat(
            CWD,
            &node,
            FileType::BlockDevice,
            Mode::from_raw_mode(0o660),
            dev,
        )
        .unwrap();
        rustix::fs::chown(&node, None, Some(rustix::fs::Gid::from_raw(disk))).unwrap();
        let denied = io::Error::from_raw_os_error(13);
        let e = Error::Open {
            hint: permission_hint(&node, &denied),
            device: node.clone(),
            error: denied,
        };
        assert_eq!(
            e.to_string(),
            format!(
                "cannot open {}: Permission denied (os error 13): reading a block device needs \
                 root, or read access to the device: membership in its group `disk` (e.g. \
                 `usermod -aG disk USER`, then log in again)",
                node.display()
            )
        );
        // An image file: the OS error says it all.
        let file = tmp.path().join("img");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(
            permission_hint(&file, &io::Error::from_raw_os_error(13)),
            None
        );
        // Another error: no hint.
        assert_eq!(
            permission_hint(&node, &io::Error::from_raw_os_error(2)),
            None
        );
    }

    fn group_id(name: &str) -> Option<u32> {
        let text = std::fs::read_to_string("/etc/group").ok()?;
        text.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&name)).then(|| f.get(2)?.parse().ok())?
        })
    }

    #[test]
    fn mem_device_bounds() {
        let dev = MemDevice::new(vec![1, 2, 3], "mem");
        let mut buf = [0u8; 2];
        dev.read_at(&mut buf, Physical(1)).unwrap();
        assert_eq!(buf, [2, 3]);
        assert!(dev.read_at(&mut buf, Physical(u64::MAX)).is_err());
    }
}
