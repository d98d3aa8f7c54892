//! Mounted filesystems: from a path inside a mounted btrfs to the devices
//! that back it and the subvolume's path from the top level, without
//! ioctls — `/proc/self/mountinfo` and `/sys/fs/btrfs/<fsid>/devices/`.
//!
//! [`resolve`] serves `btrsend send PATH` without `--device`;
//! [`mounted_filesystem_of`] tells whether a `--device` (a block device,
//! or an image file backing a loop device) belongs to a mounted btrfs.
//! The send policy for a mounted filesystem
//! ([`crate::send::mounted`]) then [`sync`](MountedFs::sync)s it and drops
//! the block devices' page cache ([`drop_page_cache`]) so that reading the
//! devices directly sees what the kernel wrote, not stale cached copies.

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
    /// Whether the filesystem is mounted read-only (its superblock
    /// options in mountinfo start with `ro`).
    pub read_only: bool,
}

impl MountedSubvol {
    /// `syncfs` the mounted filesystem, so that what was written through
    /// the mount is on the devices.
    ///
    /// # Errors
    ///
    /// The mount point cannot be opened or synced.
    pub fn sync(&self) -> Result<(), MountError> {
        syncfs(&self.mount_point)
    }

    /// The filesystem as [`mounted_filesystem_of`] describes it.
    pub fn filesystem(&self) -> MountedFs {
        MountedFs {
            fsid: self.fsid.clone(),
            devices: self.devices.clone(),
            mount_point: Some(self.mount_point.clone()),
            read_only: self.read_only,
        }
    }
}

/// `syncfs` the filesystem mounted at `mount_point`.
fn syncfs(mount_point: &Path) -> Result<(), MountError> {
    let err = |error| MountError::Io {
        what: "cannot sync the filesystem mounted at",
        path: mount_point.to_path_buf(),
        error,
    };
    let dir = File::open(mount_point).map_err(err)?;
    rustix::fs::syncfs(&dir).map_err(|e| err(e.into()))
}

/// A mounted btrfs, as sysfs and mountinfo show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedFs {
    /// The filesystem's UUID (its directory in `/sys/fs/btrfs`), when
    /// known.
    pub fsid: Option<String>,
    /// Its devices (`/dev/NAME` for each entry of
    /// `/sys/fs/btrfs/<fsid>/devices`).
    pub devices: Vec<PathBuf>,
    /// A mount point of it in this mount namespace (none when it is
    /// mounted only elsewhere, e.g. in another container).
    pub mount_point: Option<PathBuf>,
    /// Whether it is mounted read-only (mountinfo's superblock options;
    /// `false` when no mount of it is visible here).
    pub read_only: bool,
}

impl MountedFs {
    /// `syncfs` the filesystem through its mount point, so that what was
    /// written through the mount is on the devices (nothing when no mount
    /// point is visible here).
    ///
    /// # Errors
    ///
    /// The mount point cannot be opened or synced.
    pub fn sync(&self) -> Result<(), MountError> {
        match &self.mount_point {
            Some(m) => syncfs(m),
            None => Ok(()),
        }
    }

    /// A name for messages: the mount point, else the fsid.
    pub fn describe(&self) -> String {
        match (&self.mount_point, &self.fsid) {
            (Some(m), _) => format!("the filesystem mounted at {}", m.display()),
            (None, Some(f)) => format!("the mounted filesystem {f}"),
            (None, None) => "the mounted filesystem".to_owned(),
        }
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
    /// The superblock's options start with `ro` (the filesystem, not just
    /// this mount, is read-only).
    read_only: bool,
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
            let fstype = post.next()?.to_owned();
            let source = unescape(post.next()?);
            let read_only = post
                .next()
                .is_some_and(|o| o.split(',').next() == Some("ro"));
            Some(MountLine {
                root: unescape(pre.get(3)?),
                mount_point: PathBuf::from(unescape(pre.get(4)?)),
                fstype,
                source,
                read_only,
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
        read_only: mount.read_only,
    })
}

/// What a path given as `--device` is: a block device (its device
/// number) or a regular file (its identity, to match a loop device's
/// backing file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeviceId {
    Block { major: u32, minor: u32 },
    File { dev: u64, ino: u64 },
}

fn device_id(path: &Path) -> std::io::Result<DeviceId> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path)?;
    Ok(if meta.file_type().is_block_device() {
        let rdev = meta.rdev();
        DeviceId::Block {
            major: rustix::fs::major(rdev),
            minor: rustix::fs::minor(rdev),
        }
    } else {
        DeviceId::File {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    })
}

/// `MAJOR:MINOR` from a sysfs `dev` file.
fn sysfs_dev(path: &Path) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(path).ok()?;
    let (major, minor) = text.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The loop devices (kernel names, e.g. `loop3`) whose backing file is
/// the file with this identity.
fn loops_backed_by(sys_block: &Path, dev: u64, ino: u64) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(sys_block) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path().join("loop/backing_file")) else {
            continue;
        };
        let backing = text.trim_end_matches('\n');
        if std::fs::metadata(backing).is_ok_and(|m| m.dev() == dev && m.ino() == ino) {
            found.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    found
}

/// The mounted btrfs whose devices in sysfs (`/sys/fs/btrfs/<fsid>/devices`)
/// include `path`: a block device with the same device number, or a
/// loop device backed by the image file `path`. `None` when it belongs to
/// no mounted btrfs (an unmounted device or image, or a copy of a mounted
/// one's image: the fsid alone does not make it the mounted filesystem).
///
/// # Errors
///
/// Mountinfo cannot be read.
pub fn mounted_filesystem_of(path: &Path) -> Result<Option<MountedFs>, MountError> {
    // A path that cannot be examined is no mounted device; opening it
    // reports why.
    let Ok(id) = device_id(path) else {
        return Ok(None);
    };
    let loops = match id {
        DeviceId::File { dev, ino } => loops_backed_by(Path::new("/sys/block"), dev, ino),
        DeviceId::Block { .. } => Vec::new(),
    };
    if matches!(id, DeviceId::File { .. }) && loops.is_empty() {
        return Ok(None);
    }
    let Ok(filesystems) = std::fs::read_dir("/sys/fs/btrfs") else {
        return Ok(None);
    };
    for fs in filesystems.flatten() {
        let devices = fs.path().join("devices");
        let Ok(entries) = std::fs::read_dir(&devices) else {
            continue;
        };
        let names: Vec<String> = entries
            .flatten()
            .map(|d| d.file_name().to_string_lossy().into_owned())
            .collect();
        let hit = names.iter().any(|name| match id {
            DeviceId::Block { major, minor } => {
                sysfs_dev(&devices.join(name).join("dev")) == Some((major, minor))
            }
            DeviceId::File { .. } => loops.contains(name),
        });
        if !hit {
            continue;
        }
        let mut list: Vec<PathBuf> = names.iter().map(|n| Path::new("/dev").join(n)).collect();
        list.sort();
        let info = Path::new("/proc/self/mountinfo");
        let text = std::fs::read_to_string(info).map_err(|error| MountError::Io {
            what: "cannot read",
            path: info.to_path_buf(),
            error,
        })?;
        let mount = parse_mountinfo(&text).into_iter().find(|m| {
            m.fstype == "btrfs"
                && std::fs::canonicalize(&m.source)
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .is_some_and(|n| names.contains(&n))
        });
        return Ok(Some(MountedFs {
            fsid: Some(fs.file_name().to_string_lossy().into_owned()),
            devices: list,
            read_only: mount.as_ref().is_some_and(|m| m.read_only),
            mount_point: mount.map(|m| m.mount_point),
        }));
    }
    Ok(None)
}

/// Whether `path` is a block device (whose page cache the kernel's btrfs
/// bypasses when it writes, so cached pages of it can be stale; an image
/// file backing a loop device is written through its own page cache).
pub fn is_block_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
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
45 27 0:40 / /tmp/r ro,relatime - btrfs /dev/loop1 ro,space_cache=v2,subvolid=5,subvol=/
";

    #[test]
    fn mountinfo_lines() {
        let m = parse_mountinfo(INFO);
        assert_eq!(m.len(), 4);
        assert!(!m[1].read_only && !m[2].read_only);
        assert!(m[3].read_only, "superblock options start with ro");
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
