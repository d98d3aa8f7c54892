//! A scratch tmpfs mounted under a temporary directory (root only).
//!
//! tmpfs keeps what a btrfs snapshot can hold and ext4 cannot: 64-bit
//! timestamps (times before 1901-12-13 and after 2038; ext4 with 256-byte
//! inodes stops at 1901-12-13), xattr values up to the VFS limit of 64 KiB
//! (ext4 without `ea_inode` refuses a value larger than a block), `user.*`
//! (Linux ≥ 6.6), `trusted.*`, `security.*` and POSIX ACLs, holes with
//! `SEEK_DATA`/`SEEK_HOLE` and hole punching at page (4 KiB) granularity.
//! Data lives in memory: only what is written costs anything.
//!
//! Dropping it unmounts (lazily if busy) and removes the directory.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{HarnessError, run};

/// A mounted tmpfs (see the module doc).
#[derive(Debug)]
pub struct Tmpfs {
    mnt: PathBuf,
    mounted: bool,
    // Declared last: removed after `Drop::drop` has unmounted.
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mount a tmpfs of at most `size` bytes.
    ///
    /// # Errors
    ///
    /// The temporary directory or the mount failed (not root, no tmpfs).
    pub fn new(size: u64) -> Result<Tmpfs, HarnessError> {
        let dir = super::temp_dir("btrsend-tmpfs.")?;
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).map_err(|source| HarnessError::Io {
            op: "mkdir",
            path: mnt.clone(),
            source,
        })?;
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size},mode=0755"))
            .arg("btrsend-test")
            .arg(&mnt))?;
        Ok(Tmpfs {
            mnt,
            mounted: true,
            _dir: dir,
        })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mnt
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if !self.mounted {
            return;
        }
        let ok = Command::new("umount")
            .arg(&self.mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!(
                "btrsend testing: umount {} failed; lazy unmount",
                self.mnt.display()
            );
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        self.mounted = false;
    }
}
