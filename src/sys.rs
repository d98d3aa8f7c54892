//! The crate's only unsafe code: the btrfs ioctls that rustix has no safe
//! wrapper for, used by the receiver (`receive`) and by the snapshots of
//! `backup run --snapshot`. It owns the argument structs, the opcodes and
//! one safe function per ioctl; it must not grow policy (what to do when an
//! ioctl fails is its callers' business) nor any other unsafe code.
//!
//! * `BTRFS_IOC_ENCODED_WRITE` writes an extent's compressed bytes as they
//!   are: `btrfs receive` passes every ENCODED_WRITE of a
//!   `--compressed-data` stream through it when the target is btrfs, so the
//!   data is neither decompressed nor compressed again (btrfs-progs
//!   `cmds/receive.c`, `process_encoded_write`). The caller falls back to
//!   decoding and writing when [`encoded_write`] fails with an error that
//!   means "not here": see [`Refusal`].
//! * For receiving into btrfs as real subvolumes, as `btrfs receive` does:
//!   `BTRFS_IOC_SUBVOL_CREATE` (SUBVOL), `BTRFS_IOC_SNAP_CREATE_V2`
//!   (SNAPSHOT), `BTRFS_IOC_SET_RECEIVED_SUBVOL` and
//!   `BTRFS_IOC_SUBVOL_GETFLAGS`/`SETFLAGS` (the end of a subvolume: received
//!   UUID, stransid, read-only), `BTRFS_IOC_TREE_SEARCH` and
//!   `BTRFS_IOC_INO_LOOKUP` (finding a parent or clone source by UUID in the
//!   UUID tree and its path, as btrfs-progs `common/send-utils.c` does) and
//!   `BTRFS_IOC_GET_SUBVOL_INFO` (a subvolume's UUIDs and transids from an fd).
//! * For `backup run --snapshot` and for removing receive checkpoints:
//!   read-only snapshots (`BTRFS_IOC_SNAP_CREATE_V2` with
//!   `BTRFS_SUBVOL_RDONLY`) and `BTRFS_IOC_SNAP_DESTROY`.
//!
//! The argument structs and opcodes are the kernel's uapi
//! (`include/uapi/linux/btrfs.h`; the same text is btrfs-progs
//! `kernel-shared/uapi/btrfs.h`); each layout and opcode is pinned by the
//! tests below against the uapi's sizes, offsets and `_IOW`/`_IOR`/`_IOWR`
//! numbers. All but GET_SUBVOL_INFO need `CAP_SYS_ADMIN`.
//!
//! Audit notes: one `unsafe` block per ioctl, each one call with an argument
//! struct that lives on our stack for the call's duration (the calls are
//! synchronous). Input structs are fully initialised (names copied into
//! zeroed arrays, NUL-terminated by construction, reserved fields zero).
//! Output structs are written by the kernel only within their size (the
//! opcode encodes it); what the kernel returns is then read with checked
//! slicing (a `TREE_SEARCH` result buffer is parsed with bounds checks, a
//! returned name up to its first NUL within the array).

#![allow(unsafe_code)]

use std::ffi::c_ulong;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use rustix::io::Errno;
use rustix::ioctl::{Getter, Opcode, Setter, Updater, ioctl, opcode};

/// `struct iovec` (`<sys/uio.h>`).
#[repr(C)]
#[derive(Debug)]
struct IoVec {
    base: *const u8,
    len: usize,
}

/// `struct btrfs_ioctl_encoded_io_args` (uapi `linux/btrfs.h`).
#[repr(C)]
#[derive(Debug)]
struct EncodedIoArgs {
    iov: *const IoVec,
    iovcnt: c_ulong,
    offset: i64,
    flags: u64,
    len: u64,
    unencoded_len: u64,
    unencoded_offset: u64,
    compression: u32,
    encryption: u32,
    reserved: [u8; 64],
}

/// `BTRFS_IOCTL_MAGIC`.
const BTRFS_IOCTL_MAGIC: u8 = 0x94;

/// `BTRFS_IOC_ENCODED_WRITE`: `_IOW(BTRFS_IOCTL_MAGIC, 64, struct
/// btrfs_ioctl_encoded_io_args)`.
const BTRFS_IOC_ENCODED_WRITE: Opcode = opcode::write::<EncodedIoArgs>(BTRFS_IOCTL_MAGIC, 64);

/// One ENCODED_WRITE command's fields, as the stream carries them.
#[derive(Debug, Clone, Copy)]
pub struct Encoded<'a> {
    /// File offset (OFFSET).
    pub offset: u64,
    /// Bytes of the file the extent covers (UNENCODED_FILE_LEN).
    pub unencoded_file_len: u64,
    /// Decoded length of the whole extent (UNENCODED_LEN).
    pub unencoded_len: u64,
    /// Where the file's bytes start in the decoded extent (UNENCODED_OFFSET).
    pub unencoded_offset: u64,
    /// `BTRFS_ENCODED_IO_COMPRESSION_*` (COMPRESSION).
    pub compression: u32,
    /// `BTRFS_ENCODED_IO_ENCRYPTION_*` (ENCRYPTION).
    pub encryption: u32,
    /// The encoded bytes (DATA).
    pub data: &'a [u8],
}

/// How an [`encoded_write`] error is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The target cannot do encoded writes at all (not btrfs: `ENOTTY`,
    /// `EOPNOTSUPP`; not `CAP_SYS_ADMIN`: `EPERM`): decode and write this
    /// extent and every later one.
    Never,
    /// This extent cannot be written encoded (`EINVAL`: e.g. an offset that
    /// is not sector aligned, an LZO sector size that is not the
    /// filesystem's; `ENOSPC`): decode and write it, try the next one.
    /// btrfs-progs falls back on `EINVAL`, `ENOSPC` and `ENOTTY`.
    ThisOne,
    /// A real error (`EIO`, `EFBIG`, …): the command fails.
    Fail,
}

/// Classify an error of [`encoded_write`].
pub fn refusal(e: Errno) -> Refusal {
    match e {
        Errno::NOTTY | Errno::OPNOTSUPP | Errno::PERM => Refusal::Never,
        Errno::INVAL | Errno::NOSPC => Refusal::ThisOne,
        _ => Refusal::Fail,
    }
}

/// Write one extent's encoded bytes into `fd` with `BTRFS_IOC_ENCODED_WRITE`
/// (the fd must be open for writing).
///
/// # Errors
///
/// The kernel's error; see [`refusal`] for which ones mean "decode and write
/// instead".
pub fn encoded_write(fd: impl AsFd, e: &Encoded<'_>) -> Result<(), Errno> {
    let offset = i64::try_from(e.offset).map_err(|_| Errno::INVAL)?;
    let iov = IoVec {
        base: e.data.as_ptr(),
        len: e.data.len(),
    };
    let args = EncodedIoArgs {
        iov: &raw const iov,
        iovcnt: 1,
        offset,
        flags: 0,
        len: e.unencoded_file_len,
        unencoded_len: e.unencoded_len,
        unencoded_offset: e.unencoded_offset,
        compression: e.compression,
        encryption: e.encryption,
        reserved: [0; 64],
    };
    // SAFETY: the opcode is BTRFS_IOC_ENCODED_WRITE and `EncodedIoArgs` is
    // the struct it takes (`_IOW`: the kernel only reads it), with the uapi
    // layout (pinned by the tests below) and `reserved` zeroed as the uapi
    // requires. Its `iov` points to one valid `IoVec` whose `base`/`len`
    // describe `e.data`; `iov` and `e.data` both outlive this call, which
    // is synchronous, and the kernel only reads through them.
    unsafe {
        ioctl(
            fd,
            Setter::<BTRFS_IOC_ENCODED_WRITE, EncodedIoArgs>::new(args),
        )
    }
}

/// `BTRFS_PATH_NAME_MAX`: a `btrfs_ioctl_vol_args` name, without its NUL.
const PATH_NAME_MAX: usize = 4087;
/// `BTRFS_SUBVOL_NAME_MAX`: a `btrfs_ioctl_vol_args_v2` name, without its NUL.
const SUBVOL_NAME_MAX: usize = 4039;
/// `BTRFS_INO_LOOKUP_PATH_MAX`.
const INO_LOOKUP_PATH_MAX: usize = 4080;
/// `BTRFS_VOL_NAME_MAX`.
const VOL_NAME_MAX: usize = 255;
/// `BTRFS_SUBVOL_RDONLY`: the read-only flag of SUBVOL_GETFLAGS/SETFLAGS.
pub const SUBVOL_RDONLY: u64 = 1 << 1;

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; PATH_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_vol_args_v2` (the `size`/`qgroup_inherit` union as
/// its `unused` arm, the name union as `name`).
#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; SUBVOL_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_timespec`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct IoctlTimespec {
    sec: u64,
    nsec: u32,
}

/// `struct btrfs_ioctl_received_subvol_args`.
#[repr(C)]
struct ReceivedSubvolArgs {
    uuid: [u8; 16],
    stransid: u64,
    rtransid: u64,
    stime: IoctlTimespec,
    rtime: IoctlTimespec,
    flags: u64,
    reserved: [u64; 16],
}

/// `struct btrfs_ioctl_search_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct SearchKey {
    tree_id: u64,
    min_objectid: u64,
    max_objectid: u64,
    min_offset: u64,
    max_offset: u64,
    min_transid: u64,
    max_transid: u64,
    min_type: u32,
    max_type: u32,
    nr_items: u32,
    unused: u32,
    unused1: u64,
    unused2: u64,
    unused3: u64,
    unused4: u64,
}

/// `BTRFS_SEARCH_ARGS_BUFSIZE`.
const SEARCH_BUF: usize = 4096 - size_of::<SearchKey>();

/// `struct btrfs_ioctl_search_args`.
#[repr(C)]
struct SearchArgs {
    key: SearchKey,
    buf: [u8; SEARCH_BUF],
}

/// `struct btrfs_ioctl_search_header` (read from the result buffer).
const SEARCH_HEADER: usize = 32;

/// `struct btrfs_ioctl_ino_lookup_args`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; INO_LOOKUP_PATH_MAX],
}

/// `struct btrfs_ioctl_get_subvol_info_args`.
#[repr(C)]
struct GetSubvolInfoArgs {
    treeid: u64,
    name: [u8; VOL_NAME_MAX + 1],
    parent_id: u64,
    dirid: u64,
    generation: u64,
    flags: u64,
    uuid: [u8; 16],
    parent_uuid: [u8; 16],
    received_uuid: [u8; 16],
    ctransid: u64,
    otransid: u64,
    stransid: u64,
    rtransid: u64,
    ctime: IoctlTimespec,
    otime: IoctlTimespec,
    stime: IoctlTimespec,
    rtime: IoctlTimespec,
    reserved: [u64; 8],
}

/// `BTRFS_IOC_SUBVOL_CREATE`: `_IOW(0x94, 14, struct btrfs_ioctl_vol_args)`.
const BTRFS_IOC_SUBVOL_CREATE: Opcode = opcode::write::<VolArgs>(BTRFS_IOCTL_MAGIC, 14);
/// `BTRFS_IOC_SNAP_DESTROY`: `_IOW(0x94, 15, struct btrfs_ioctl_vol_args)`.
const BTRFS_IOC_SNAP_DESTROY: Opcode = opcode::write::<VolArgs>(BTRFS_IOCTL_MAGIC, 15);
/// `BTRFS_IOC_TREE_SEARCH`: `_IOWR(0x94, 17, struct btrfs_ioctl_search_args)`.
const BTRFS_IOC_TREE_SEARCH: Opcode = opcode::read_write::<SearchArgs>(BTRFS_IOCTL_MAGIC, 17);
/// `BTRFS_IOC_INO_LOOKUP`: `_IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)`.
const BTRFS_IOC_INO_LOOKUP: Opcode = opcode::read_write::<InoLookupArgs>(BTRFS_IOCTL_MAGIC, 18);
/// `BTRFS_IOC_SNAP_CREATE_V2`: `_IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)`.
const BTRFS_IOC_SNAP_CREATE_V2: Opcode = opcode::write::<VolArgsV2>(BTRFS_IOCTL_MAGIC, 23);
/// `BTRFS_IOC_SUBVOL_GETFLAGS`: `_IOR(0x94, 25, __u64)`.
const BTRFS_IOC_SUBVOL_GETFLAGS: Opcode = opcode::read::<u64>(BTRFS_IOCTL_MAGIC, 25);
/// `BTRFS_IOC_SUBVOL_SETFLAGS`: `_IOW(0x94, 26, __u64)`.
const BTRFS_IOC_SUBVOL_SETFLAGS: Opcode = opcode::write::<u64>(BTRFS_IOCTL_MAGIC, 26);
/// `BTRFS_IOC_SET_RECEIVED_SUBVOL`: `_IOWR(0x94, 37, struct
/// btrfs_ioctl_received_subvol_args)`.
const BTRFS_IOC_SET_RECEIVED_SUBVOL: Opcode =
    opcode::read_write::<ReceivedSubvolArgs>(BTRFS_IOCTL_MAGIC, 37);
/// `BTRFS_IOC_GET_SUBVOL_INFO`: `_IOR(0x94, 60, struct
/// btrfs_ioctl_get_subvol_info_args)`.
const BTRFS_IOC_GET_SUBVOL_INFO: Opcode = opcode::read::<GetSubvolInfoArgs>(BTRFS_IOCTL_MAGIC, 60);

/// Copy `name` into a zeroed array of `N` bytes, leaving at least one NUL
/// after it; `EINVAL` for an empty name or one with a NUL or `/`,
/// `ENAMETOOLONG` for one that does not fit.
fn name_array<const N: usize>(name: &[u8]) -> Result<[u8; N], Errno> {
    if name.is_empty() || name.contains(&0) || name.contains(&b'/') {
        return Err(Errno::INVAL);
    }
    let mut a = [0u8; N];
    let dst = a
        .get_mut(..name.len())
        .filter(|_| name.len() < N)
        .ok_or(Errno::NAMETOOLONG)?;
    dst.copy_from_slice(name);
    Ok(a)
}

/// Create the empty subvolume `name` in the directory `dir` (an fd open
/// for reading, not `O_PATH`), as SUBVOL does.
///
/// # Errors
///
/// The kernel's (`EEXIST`, `EPERM`, `ENOTTY` off btrfs, …); `EINVAL` or
/// `ENAMETOOLONG` for a name the ioctl cannot carry.
pub fn subvol_create(dir: BorrowedFd<'_>, name: &[u8]) -> Result<(), Errno> {
    let args = VolArgs {
        fd: 0,
        name: name_array(name)?,
    };
    // SAFETY: BTRFS_IOC_SUBVOL_CREATE takes a `struct btrfs_ioctl_vol_args`
    // (`_IOW`: only read), whose layout `VolArgs` has (pinned by the tests);
    // the name is NUL-terminated within its array (`name_array`).
    unsafe { ioctl(dir, Setter::<BTRFS_IOC_SUBVOL_CREATE, VolArgs>::new(args)) }
}

/// Create `name` in `dir` as a writable snapshot of the subvolume open as
/// `source` (any fd of its root directory), as SNAPSHOT does.
///
/// # Errors
///
/// As [`subvol_create`]; `EXDEV` if `source` is on another filesystem.
pub fn snapshot_create(
    dir: BorrowedFd<'_>,
    name: &[u8],
    source: BorrowedFd<'_>,
) -> Result<(), Errno> {
    snapshot_create_flags(dir, name, source, 0)
}

/// Create `name` in `dir` as a read-only snapshot of the subvolume open as
/// `source`, as `btrfs subvolume snapshot -r` does (`backup run
/// --snapshot`).
///
/// # Errors
///
/// As [`snapshot_create`].
pub fn snapshot_create_readonly(
    dir: BorrowedFd<'_>,
    name: &[u8],
    source: BorrowedFd<'_>,
) -> Result<(), Errno> {
    snapshot_create_flags(dir, name, source, SUBVOL_RDONLY)
}

/// Delete the subvolume or snapshot `name` in the directory `dir`, as
/// `btrfs subvolume delete` does (the space is freed by the kernel's
/// cleaner afterwards).
///
/// # Errors
///
/// The kernel's (`ENOENT`, `EPERM` without CAP_SYS_ADMIN, `ENOTEMPTY` for
/// a subvolume that holds others, `ENOTTY` off btrfs, …); `EINVAL` or
/// `ENAMETOOLONG` for a name the ioctl cannot carry.
pub fn snap_destroy(dir: BorrowedFd<'_>, name: &[u8]) -> Result<(), Errno> {
    let args = VolArgs {
        fd: 0,
        name: name_array(name)?,
    };
    // SAFETY: BTRFS_IOC_SNAP_DESTROY takes a `struct btrfs_ioctl_vol_args`
    // (`_IOW`: only read), whose layout `VolArgs` has (pinned by the tests);
    // the name is NUL-terminated within its array (`name_array`).
    unsafe { ioctl(dir, Setter::<BTRFS_IOC_SNAP_DESTROY, VolArgs>::new(args)) }
}

/// SNAP_CREATE_V2 with `flags` (0 or [`SUBVOL_RDONLY`]).
fn snapshot_create_flags(
    dir: BorrowedFd<'_>,
    name: &[u8],
    source: BorrowedFd<'_>,
    flags: u64,
) -> Result<(), Errno> {
    let args = VolArgsV2 {
        fd: source.as_raw_fd().into(),
        transid: 0,
        flags,
        unused: [0; 4],
        name: name_array(name)?,
    };
    // SAFETY: BTRFS_IOC_SNAP_CREATE_V2 takes a `struct
    // btrfs_ioctl_vol_args_v2` (`_IOW`: only read), whose layout `VolArgsV2`
    // has (pinned by the tests); `fd` is an open fd borrowed for the call,
    // flags 0 or RDONLY (no qgroup inherit pointer, no async), the union
    // zeroed, the name NUL-terminated.
    unsafe {
        ioctl(
            dir,
            Setter::<BTRFS_IOC_SNAP_CREATE_V2, VolArgsV2>::new(args),
        )
    }
}

/// Set the received UUID and stransid of the subvolume `subvol` (an fd of
/// its root, open for reading); returns the rtransid the kernel set.
///
/// # Errors
///
/// The kernel's (`EPERM`, `EROFS` for a read-only subvolume, …).
pub fn set_received_subvol(
    subvol: BorrowedFd<'_>,
    uuid: [u8; 16],
    stransid: u64,
) -> Result<u64, Errno> {
    let mut args = ReceivedSubvolArgs {
        uuid,
        stransid,
        rtransid: 0,
        stime: IoctlTimespec::default(),
        rtime: IoctlTimespec::default(),
        flags: 0,
        reserved: [0; 16],
    };
    // SAFETY: BTRFS_IOC_SET_RECEIVED_SUBVOL takes a `struct
    // btrfs_ioctl_received_subvol_args` (`_IOWR`: read, then `rtransid` and
    // `rtime` written back), whose layout `ReceivedSubvolArgs` has (pinned
    // by the tests); it is borrowed mutably for the call only.
    unsafe {
        ioctl(
            subvol,
            Updater::<BTRFS_IOC_SET_RECEIVED_SUBVOL, ReceivedSubvolArgs>::new(&mut args),
        )?;
    }
    Ok(args.rtransid)
}

/// The subvolume flags of `subvol` ([`SUBVOL_RDONLY`]).
///
/// # Errors
///
/// The kernel's.
pub fn subvol_flags(subvol: BorrowedFd<'_>) -> Result<u64, Errno> {
    // SAFETY: BTRFS_IOC_SUBVOL_GETFLAGS writes one `__u64` (`_IOR`), the
    // `Getter`'s output type.
    unsafe { ioctl(subvol, Getter::<BTRFS_IOC_SUBVOL_GETFLAGS, u64>::new()) }
}

/// Set the subvolume flags of `subvol`.
///
/// # Errors
///
/// The kernel's.
pub fn set_subvol_flags(subvol: BorrowedFd<'_>, flags: u64) -> Result<(), Errno> {
    // SAFETY: BTRFS_IOC_SUBVOL_SETFLAGS reads one `__u64` (`_IOW`), passed
    // by pointer as the `Setter` does.
    unsafe { ioctl(subvol, Setter::<BTRFS_IOC_SUBVOL_SETFLAGS, u64>::new(flags)) }
}

/// One item found by [`tree_search`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchItem {
    /// Key objectid.
    pub objectid: u64,
    /// Key type.
    pub item_type: u32,
    /// Key offset.
    pub offset: u64,
    /// The item's data.
    pub data: Vec<u8>,
}

/// The items of tree `tree` with keys from `(min_objectid, ty, min_offset)`
/// to `(max_objectid, ty, max_offset)`, at most `max_items` of them (fewer
/// if they fill the 4 KiB result buffer: search again after the last key).
///
/// # Errors
///
/// The kernel's (`EPERM` without `CAP_SYS_ADMIN`, `ENOENT` for a missing
/// tree, `ENOTTY` off btrfs).
pub fn tree_search(
    fd: BorrowedFd<'_>,
    tree: u64,
    ty: u32,
    objectids: (u64, u64),
    offsets: (u64, u64),
    max_items: u32,
) -> Result<Vec<SearchItem>, Errno> {
    let mut args = SearchArgs {
        key: SearchKey {
            tree_id: tree,
            min_objectid: objectids.0,
            max_objectid: objectids.1,
            min_offset: offsets.0,
            max_offset: offsets.1,
            min_transid: 0,
            max_transid: u64::MAX,
            min_type: ty,
            max_type: ty,
            nr_items: max_items,
            ..SearchKey::default()
        },
        buf: [0; SEARCH_BUF],
    };
    // SAFETY: BTRFS_IOC_TREE_SEARCH takes a `struct btrfs_ioctl_search_args`
    // (`_IOWR`: the key is read, `nr_items` and `buf` written within the
    // struct), whose layout `SearchArgs` has (pinned by the tests); it is
    // borrowed mutably for the call only.
    unsafe {
        ioctl(
            fd,
            Updater::<BTRFS_IOC_TREE_SEARCH, SearchArgs>::new(&mut args),
        )?;
    }
    let mut items = Vec::new();
    let mut pos = 0usize;
    let u64_at = |b: &[u8], at: usize| -> Option<u64> {
        Some(u64::from_ne_bytes(
            b.get(at..at.checked_add(8)?)?.try_into().ok()?,
        ))
    };
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(
            b.get(at..at.checked_add(4)?)?.try_into().ok()?,
        ))
    };
    for _ in 0..args.key.nr_items {
        let buf = &args.buf[..];
        let parsed = (|| {
            let objectid = u64_at(buf, pos.checked_add(8)?)?;
            let offset = u64_at(buf, pos.checked_add(16)?)?;
            let item_type = u32_at(buf, pos.checked_add(24)?)?;
            let len = usize::try_from(u32_at(buf, pos.checked_add(28)?)?).ok()?;
            let start = pos.checked_add(SEARCH_HEADER)?;
            let end = start.checked_add(len)?;
            let data = buf.get(start..end)?.to_vec();
            Some((
                SearchItem {
                    objectid,
                    item_type,
                    offset,
                    data,
                },
                end,
            ))
        })();
        let Some((item, end)) = parsed else {
            return Err(Errno::OVERFLOW);
        };
        items.push(item);
        pos = end;
    }
    Ok(items)
}

/// `BTRFS_IOC_INO_LOOKUP`: the path of inode `objectid` (a directory) within
/// subvolume `treeid` (0: the subvolume of `fd`), ending in `/` unless
/// empty; and the tree id the kernel answered for.
///
/// # Errors
///
/// The kernel's.
pub fn ino_lookup(fd: BorrowedFd<'_>, treeid: u64, objectid: u64) -> Result<(u64, Vec<u8>), Errno> {
    let mut args = InoLookupArgs {
        treeid,
        objectid,
        name: [0; INO_LOOKUP_PATH_MAX],
    };
    // SAFETY: BTRFS_IOC_INO_LOOKUP takes a `struct
    // btrfs_ioctl_ino_lookup_args` (`_IOWR`: `treeid` and `name` written
    // back within the struct), whose layout `InoLookupArgs` has (pinned by
    // the tests); borrowed mutably for the call only.
    unsafe {
        ioctl(
            fd,
            Updater::<BTRFS_IOC_INO_LOOKUP, InoLookupArgs>::new(&mut args),
        )?;
    }
    Ok((args.treeid, until_nul(&args.name).to_vec()))
}

/// `b` up to its first NUL (all of it if none).
fn until_nul(b: &[u8]) -> &[u8] {
    b.split(|&c| c == 0).next().unwrap_or_default()
}

/// A subvolume as `BTRFS_IOC_GET_SUBVOL_INFO` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubvolInfo {
    /// Its tree (subvolume) id.
    pub treeid: u64,
    /// Its name in its parent directory.
    pub name: Vec<u8>,
    /// Root item flags (`BTRFS_ROOT_SUBVOL_RDONLY` = 1).
    pub flags: u64,
    /// The root item's generation (the transaction that last wrote it).
    pub generation: u64,
    /// Its UUID.
    pub uuid: [u8; 16],
    /// The UUID of the subvolume it is a snapshot of.
    pub parent_uuid: [u8; 16],
    /// The received UUID (zero if never received).
    pub received_uuid: [u8; 16],
    /// ctransid.
    pub ctransid: u64,
    /// otransid (the transaction that created it).
    pub otransid: u64,
    /// stransid (the sender's ctransid, for a received subvolume).
    pub stransid: u64,
    /// rtransid (when it was received).
    pub rtransid: u64,
    /// When it was made on this filesystem (seconds, nanoseconds).
    pub otime: (u64, u32),
}

/// The subvolume that `fd` is in (any fd in it; no privileges needed).
///
/// # Errors
///
/// The kernel's (`ENOTTY` off btrfs; kernels before 4.18 lack the ioctl).
pub fn subvol_info(fd: BorrowedFd<'_>) -> Result<SubvolInfo, Errno> {
    // SAFETY: BTRFS_IOC_GET_SUBVOL_INFO writes a `struct
    // btrfs_ioctl_get_subvol_info_args` (`_IOR`), the `Getter`'s output
    // type, whose layout `GetSubvolInfoArgs` has (pinned by the tests); the
    // kernel fills it whole (it zeroes it before filling).
    let a = unsafe {
        ioctl(
            fd,
            Getter::<BTRFS_IOC_GET_SUBVOL_INFO, GetSubvolInfoArgs>::new(),
        )?
    };
    Ok(SubvolInfo {
        treeid: a.treeid,
        name: until_nul(&a.name).to_vec(),
        flags: a.flags,
        generation: a.generation,
        uuid: a.uuid,
        parent_uuid: a.parent_uuid,
        received_uuid: a.received_uuid,
        ctransid: a.ctransid,
        otransid: a.otransid,
        stransid: a.stransid,
        rtransid: a.rtransid,
        otime: (a.otime.sec, a.otime.nsec),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn layout_matches_the_uapi() {
        // struct btrfs_ioctl_encoded_io_args on LP64: 128 bytes.
        assert_eq!(size_of::<EncodedIoArgs>(), 128);
        assert_eq!(offset_of!(EncodedIoArgs, iov), 0);
        assert_eq!(offset_of!(EncodedIoArgs, iovcnt), 8);
        assert_eq!(offset_of!(EncodedIoArgs, offset), 16);
        assert_eq!(offset_of!(EncodedIoArgs, flags), 24);
        assert_eq!(offset_of!(EncodedIoArgs, len), 32);
        assert_eq!(offset_of!(EncodedIoArgs, unencoded_len), 40);
        assert_eq!(offset_of!(EncodedIoArgs, unencoded_offset), 48);
        assert_eq!(offset_of!(EncodedIoArgs, compression), 56);
        assert_eq!(offset_of!(EncodedIoArgs, encryption), 60);
        assert_eq!(offset_of!(EncodedIoArgs, reserved), 64);
        assert_eq!(size_of::<IoVec>(), 16);
        // _IOW(0x94, 64, 128 bytes): dir 1 << 30 | size << 16 | 0x94 << 8 | 64.
        assert_eq!(BTRFS_IOC_ENCODED_WRITE, 0x4080_9440);
    }

    #[test]
    fn not_btrfs_means_never() {
        // A regular file on the temporary directory's filesystem: tmpfs or
        // another non-btrfs filesystem answers ENOTTY; as an ordinary user,
        // btrfs answers EPERM. Either way: fall back for good.
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(dir.path().join("f")).unwrap();
        let on_btrfs = rustix::fs::fstatfs(&f).unwrap().f_type == 0x9123_683e;
        let e = Encoded {
            offset: 0,
            unencoded_file_len: 4096,
            unencoded_len: 4096,
            unencoded_offset: 0,
            compression: 2,
            encryption: 0,
            data: &[0; 100],
        };
        match encoded_write(&f, &e) {
            Err(err) if !on_btrfs => assert_eq!(refusal(err), Refusal::Never, "{err}"),
            // On btrfs as root the bytes are written (not valid zstd: a read
            // would fail) or refused as invalid; either is fine here.
            _ => {}
        }
        assert_eq!(refusal(Errno::INVAL), Refusal::ThisOne);
        assert_eq!(refusal(Errno::IO), Refusal::Fail);
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn subvolume_layouts_match_the_uapi() {
        // The uapi's own _static_asserts: 4096, 4096, 200, 4096, 4096, 504.
        assert_eq!(size_of::<VolArgs>(), 4096);
        assert_eq!(offset_of!(VolArgs, name), 8);
        assert_eq!(size_of::<VolArgsV2>(), 4096);
        assert_eq!(offset_of!(VolArgsV2, transid), 8);
        assert_eq!(offset_of!(VolArgsV2, flags), 16);
        assert_eq!(offset_of!(VolArgsV2, unused), 24);
        assert_eq!(offset_of!(VolArgsV2, name), 56);
        assert_eq!(size_of::<IoctlTimespec>(), 16);
        assert_eq!(size_of::<ReceivedSubvolArgs>(), 200);
        assert_eq!(offset_of!(ReceivedSubvolArgs, stransid), 16);
        assert_eq!(offset_of!(ReceivedSubvolArgs, rtransid), 24);
        assert_eq!(offset_of!(ReceivedSubvolArgs, stime), 32);
        assert_eq!(offset_of!(ReceivedSubvolArgs, rtime), 48);
        assert_eq!(offset_of!(ReceivedSubvolArgs, flags), 64);
        assert_eq!(offset_of!(ReceivedSubvolArgs, reserved), 72);
        assert_eq!(size_of::<SearchKey>(), 104);
        assert_eq!(offset_of!(SearchKey, min_type), 56);
        assert_eq!(offset_of!(SearchKey, nr_items), 64);
        assert_eq!(offset_of!(SearchKey, unused1), 72);
        assert_eq!(size_of::<SearchArgs>(), 4096);
        assert_eq!(offset_of!(SearchArgs, buf), 104);
        assert_eq!(size_of::<InoLookupArgs>(), 4096);
        assert_eq!(offset_of!(InoLookupArgs, name), 16);
        assert_eq!(size_of::<GetSubvolInfoArgs>(), 504);
        assert_eq!(offset_of!(GetSubvolInfoArgs, name), 8);
        assert_eq!(offset_of!(GetSubvolInfoArgs, parent_id), 264);
        assert_eq!(offset_of!(GetSubvolInfoArgs, flags), 288);
        assert_eq!(offset_of!(GetSubvolInfoArgs, uuid), 296);
        assert_eq!(offset_of!(GetSubvolInfoArgs, received_uuid), 328);
        assert_eq!(offset_of!(GetSubvolInfoArgs, ctransid), 344);
        assert_eq!(offset_of!(GetSubvolInfoArgs, stransid), 360);
        assert_eq!(offset_of!(GetSubvolInfoArgs, rtransid), 368);
        assert_eq!(offset_of!(GetSubvolInfoArgs, ctime), 376);
        assert_eq!(offset_of!(GetSubvolInfoArgs, reserved), 440);
        // _IOC(dir, 0x94, nr, size): dir W = 1, R = 2, RW = 3 at bit 30.
        let ioc = |dir: u32, nr: u32, size: u32| (dir << 30) | (size << 16) | (0x94 << 8) | nr;
        assert_eq!(BTRFS_IOC_SUBVOL_CREATE, ioc(1, 14, 4096));
        assert_eq!(BTRFS_IOC_SNAP_DESTROY, ioc(1, 15, 4096));
        assert_eq!(BTRFS_IOC_TREE_SEARCH, ioc(3, 17, 4096));
        assert_eq!(BTRFS_IOC_INO_LOOKUP, ioc(3, 18, 4096));
        assert_eq!(BTRFS_IOC_SNAP_CREATE_V2, ioc(1, 23, 4096));
        assert_eq!(BTRFS_IOC_SUBVOL_GETFLAGS, ioc(2, 25, 8));
        assert_eq!(BTRFS_IOC_SUBVOL_SETFLAGS, ioc(1, 26, 8));
        assert_eq!(BTRFS_IOC_SET_RECEIVED_SUBVOL, ioc(3, 37, 200));
        assert_eq!(BTRFS_IOC_GET_SUBVOL_INFO, ioc(2, 60, 504));
        // The well-known values (btrfs-progs' headers, strace).
        assert_eq!(BTRFS_IOC_SUBVOL_CREATE, 0x5000_940e);
        assert_eq!(BTRFS_IOC_SNAP_DESTROY, 0x5000_940f);
        assert_eq!(BTRFS_IOC_SET_RECEIVED_SUBVOL, 0xc0c8_9425);
    }

    #[test]
    fn names_are_checked_before_any_ioctl() {
        assert_eq!(name_array::<8>(b""), Err(Errno::INVAL));
        assert_eq!(name_array::<8>(b"a/b"), Err(Errno::INVAL));
        assert_eq!(name_array::<8>(b"a\0b"), Err(Errno::INVAL));
        assert_eq!(name_array::<8>(b"1234567"), Ok(*b"1234567\0"));
        assert_eq!(name_array::<8>(b"12345678"), Err(Errno::NAMETOOLONG));
        assert_eq!(until_nul(b"ab\0cd"), b"ab");
        assert_eq!(until_nul(b"ab"), b"ab");
    }

    #[test]
    fn off_btrfs_the_subvolume_ioctls_are_refused() {
        // The temporary directory is not btrfs here (ext4/tmpfs): ENOTTY or
        // the like, never a success; as an ordinary user, EPERM.
        let dir = tempfile::tempdir().unwrap();
        let d = std::fs::File::open(dir.path()).unwrap();
        if rustix::fs::fstatfs(&d).unwrap().f_type == 0x9123_683e {
            return;
        }
        assert!(subvol_create(d.as_fd(), b"x").is_err());
        assert!(snapshot_create_readonly(d.as_fd(), b"y", d.as_fd()).is_err());
        assert!(!dir.path().join("y").exists());
        std::fs::create_dir(dir.path().join("z")).unwrap();
        assert!(snap_destroy(d.as_fd(), b"z").is_err());
        assert!(dir.path().join("z").exists());
        assert!(!dir.path().join("x").exists());
        assert!(subvol_info(d.as_fd()).is_err());
        assert!(tree_search(d.as_fd(), 1, 132, (5, 5), (0, u64::MAX), 1).is_err());
    }
}
