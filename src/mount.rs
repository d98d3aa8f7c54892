//! Mounted filesystems: from a path inside a mounted btrfs to the devices
//! that back it and the subvolume's path from the top level, without
//! ioctls — `/proc/self/mountinfo` and `/sys/fs/btrfs/<fsid>/devices/`.
//!
//! Used by `btrsend send PATH` without `--device`: the caller then
//! [`sync`](MountedSubvol::sync)s the filesystem and drops the block
//! devices' page cache ([`drop_page_cache`]) so that reading the devices
//! directly sees what the kernel wrote, not stale cached copies.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The inode number of every subvolume's root directory
/// (`BTRFS_FIRST_FREE_OBJECTID`).
const SUBVOL_ROOT_INO: u64 = 256;

/// Why a path could not be resolved to a mounted subvolume.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MountError {
    /// A file could not be read or a path resolved.
    #[error("{what} {}: {error}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error (part of the message, not a `source()`).
        error: io::Error,
    },
    /// The path lies on another kind of filesystem.
    #[error(
        "{} is not on a btrfs filesystem (it is on {fstype}, mounted at {}); use --device to read an unmounted image",
        path.display(), mount_point.display()
    )]
    NotBtrfs {
        /// The path asked for.
        path: PathBuf,
        /// Its filesystem type.
        fstype: String,
        /// The mount point it lies under.
        mount_point: PathBuf,
    },
    /// The path is inside a btrfs but not the root of a subvolume.
    #[error(
        "{} is not a subvolume (its inode is {ino}, a subvolume's root directory is inode 256)",
        path.display()
    )]
    NotSubvolume {
        /// The path asked for.
        path: PathBuf,
        /// Its inode number.
        ino: u64,
    },
    /// No mount in `/proc/self/mountinfo` covers the path.
    #[error("no mount found for {} in /proc/self/mountinfo", path.display())]
    NoMount {
        /// The path asked for.
        path: PathBuf,
    },
}

/// A subvolume of a mounted btrfs, found from a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedSubvol {
    /// The path asked for, symlinks resolved.
    pub path: PathBuf,
    /// The mount point it lies under.
    pub mount_point: PathBuf,
    /// The mount's source device (from mountinfo).
    pub source: PathBuf,
    /// Every device of the filesystem (from `/sys/fs/btrfs/<fsid>/devices`;
    /// just `source` when sysfs does not list it).
    pub devices: Vec<PathBuf>,
    /// The filesystem's UUID (the sysfs directory name), when found.
    pub fsid: Option<String>,
    /// The subvolume's path from the top level, without a leading `/`
    /// (empty for the top level itself), as `btrsend list` prints it.
    pub subvol_path: String,
}

impl MountedSubvol {
    /// `syncfs` the mounted filesystem, so that what was written through
    /// the mount is on the devices.
    ///
    /// # Errors
    ///
    /// The mount point cannot be opened or synced.
    pub fn sync(&self) -> Result<(), MountError> {
        let err = |error| MountError::Io {
            what: "cannot sync the filesystem mounted at",
            path: self.mount_point.clone(),
            error,
        };
        let dir = File::open(&self.mount_point).map_err(err)?;
        rustix::fs::syncfs(&dir).map_err(|e| err(e.into()))
    }
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountLine {
    /// The mount's root inside its filesystem (for btrfs: the subvolume
    /// path from the top level, plus a bind mount's subdirectory).
    root: String,
    mount_point: PathBuf,
    fstype: String,
    source: String,
}

/// Undo mountinfo's octal escapes (`\040` for a space, …).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    use std::os::unix::ffi::OsStringExt;
    std::ffi::OsString::from_vec(out)
        .into_string()
        .unwrap_or_else(|s| s.to_string_lossy().into_owned())
}

fn parse_mountinfo(text: &str) -> Vec<MountLine> {
    text.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let mut post = post.split(' ');
            Some(MountLine {
                root: unescape(pre.get(3)?),
                mount_point: PathBuf::from(unescape(pre.get(4)?)),
                fstype: post.next()?.to_owned(),
                source: unescape(post.next()?),
            })
        })
        .collect()
}

/// The mount `path` (absolute, symlinks resolved) lies under: the longest
/// mount point that is a prefix of it, the last such line when mounts are
/// stacked.
fn covering_mount<'a>(mounts: &'a [MountLine], path: &Path) -> Option<&'a MountLine> {
    let mut best: Option<&MountLine> = None;
    for m in mounts {
        if path.starts_with(&m.mount_point)
            && best.is_none_or(|b| {
                m.mount_point.components().count() >= b.mount_point.components().count()
            })
        {
            best = Some(m);
        }
    }
    best
}

/// The subvolume path from the top level: the mount's root inside the
/// filesystem joined with the path below the mount point.
fn top_level_path(root: &str, mount_point: &Path, path: &Path) -> String {
    let mut parts: Vec<String> = root
        .split('/')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    if let Ok(rel) = path.strip_prefix(mount_point) {
        parts.extend(rel.iter().map(|c| c.to_string_lossy().into_owned()));
    }
    parts.join("/")
}

/// The filesystem UUID whose `devices/` directory in sysfs lists `dev`
/// (by its kernel name, e.g. `loop0` or `dm-1`), and all its devices.
fn sysfs_devices(sysfs: &Path, dev: &Path) -> Option<(String, Vec<PathBuf>)> {
    let name = dev.file_name()?;
    for fs in std::fs::read_dir(sysfs).ok()?.flatten() {
        let devices = fs.path().join("devices");
        if !devices.join(name).exists() {
            continue;
        }
        let mut list: Vec<PathBuf> = std::fs::read_dir(&devices)
            .ok()?
            .flatten()
            .map(|d| Path::new("/dev").join(d.file_name()))
            .collect();
        list.sort();
        return Some((fs.file_name().to_string_lossy().into_owned(), list));
    }
    None
}

/// Find the mounted btrfs subvolume at `path` (a subvolume's root
/// directory: inode 256), its devices and its path from the top level.
///
/// # Errors
///
/// [`MountError`]: the path does not exist, is not on btrfs, is not a
/// subvolume root, or mountinfo cannot be read.
pub fn resolve(path: &Path) -> Result<MountedSubvol, MountError> {
    let resolved = std::fs::canonicalize(path).map_err(|error| MountError::Io {
        what: "cannot resolve",
        path: path.to_path_buf(),
        error,
    })?;
    let meta = std::fs::metadata(&resolved).map_err(|error| MountError::Io {
        what: "cannot stat",
        path: resolved.clone(),
        error,
    })?;
    let info = Path::new("/proc/self/mountinfo");
    let text = std::fs::read_to_string(info).map_err(|error| MountError::Io {
        what: "cannot read",
        path: info.to_path_buf(),
        error,
    })?;
    let mounts = parse_mountinfo(&text);
    let mount = covering_mount(&mounts, &resolved).ok_or_else(|| MountError::NoMount {
        path: resolved.clone(),
    })?;
    if mount.fstype != "btrfs" {
        return Err(MountError::NotBtrfs {
            path: resolved,
            fstype: mount.fstype.clone(),
            mount_point: mount.mount_point.clone(),
        });
    }
    if meta.ino() != SUBVOL_ROOT_INO || !meta.is_dir() {
        return Err(MountError::NotSubvolume {
            path: resolved,
            ino: meta.ino(),
        });
    }
    let source = PathBuf::from(&mount.source);
    // /dev/mapper/x is a symlink to ../dm-N, the name sysfs uses.
    let canonical = std::fs::canonicalize(&source).unwrap_or_else(|_| source.clone());
    let (fsid, devices) = match sysfs_devices(Path::new("/sys/fs/btrfs"), &canonical) {
        Some((fsid, devices)) if !devices.is_empty() => (Some(fsid), devices),
        _ => (None, vec![source.clone()]),
    };
    Ok(MountedSubvol {
        subvol_path: top_level_path(&mount.root, &mount.mount_point, &resolved),
        path: resolved,
        mount_point: mount.mount_point.clone(),
        source,
        devices,
        fsid,
    })
}

/// Drop the page-cache copies of these block devices
/// (`posix_fadvise(POSIX_FADV_DONTNEED)` over the whole device), so that
/// reads through them come from the disk — where the kernel's btrfs wrote
/// (it writes through its own mapping, not through the block device's
/// page cache, which may hold stale blocks from earlier reads).
///
/// # Errors
///
/// A device cannot be opened or the advice is refused.
pub fn drop_page_cache(devices: &[PathBuf]) -> Result<(), MountError> {
    for dev in devices {
        let err = |error| MountError::Io {
            what: "cannot drop the page cache of",
            path: dev.clone(),
            error,
        };
        let f = File::open(dev).map_err(err)?;
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)
            .map_err(|e| err(e.into()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
43 27 0:39 / /tmp/m\\040x rw,relatime - btrfs /dev/loop0 rw,space_cache=v2,subvolid=5,subvol=/
44 27 0:39 /sv /tmp/m2 rw,relatime shared:7 - btrfs /dev/loop0 rw,subvolid=256,subvol=/sv
";

    #[test]
    fn mountinfo_lines() {
        let m = parse_mountinfo(INFO);
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].mount_point, Path::new("/tmp/m x"));
        assert_eq!(m[1].fstype, "btrfs");
        assert_eq!(m[2].root, "/sv");
        assert_eq!(m[2].source, "/dev/loop0");
        assert_eq!(m[0].fstype, "ext4");
    }

    #[test]
    fn covering_mount_is_the_longest_prefix() {
        let m = parse_mountinfo(INFO);
        let c = covering_mount(&m, Path::new("/tmp/m2/d/snap")).unwrap();
        assert_eq!(c.mount_point, Path::new("/tmp/m2"));
        let c = covering_mount(&m, Path::new("/tmp/m22")).unwrap();
        assert_eq!(
            c.mount_point,
            Path::new("/"),
            "component prefix, not string prefix"
        );
        assert_eq!(
            top_level_path("/sv", Path::new("/tmp/m2"), Path::new("/tmp/m2/d/snap")),
            "sv/d/snap"
        );
        assert_eq!(
            top_level_path("/", Path::new("/tmp/m"), Path::new("/tmp/m")),
            ""
        );
    }

    #[test]
    fn not_btrfs_is_named() {
        let e = resolve(Path::new("/proc")).unwrap_err();
        assert!(
            matches!(e, MountError::NotBtrfs { ref fstype, .. } if fstype == "proc"),
            "{e}"
        );
        assert!(
            e.to_string().contains("is not on a btrfs filesystem"),
            "{e}"
        );
        let e = resolve(Path::new("/nonexistent/btrsend")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("cannot resolve /nonexistent/btrsend: "),
            "{e}"
        );
    }
}
