//! The crate's only unsafe code: `BTRFS_IOC_ENCODED_WRITE`, the btrfs ioctl
//! that writes an extent's compressed bytes as they are, which rustix has no
//! safe wrapper for.
//!
//! `btrfs receive` passes every ENCODED_WRITE of a `--compressed-data`
//! stream through this ioctl when the target is btrfs, so the data is neither
//! decompressed nor compressed again (btrfs-progs `cmds/receive.c`,
//! `process_encoded_write`). The caller falls back to decoding and writing
//! when [`encoded_write`] fails with an error that means "not here": see
//! [`Refusal`].
//!
//! The argument struct and the opcode are the kernel's uapi
//! (`include/uapi/linux/btrfs.h`: `struct btrfs_ioctl_encoded_io_args`,
//! `BTRFS_IOC_ENCODED_WRITE = _IOW(0x94, 64, …)`); their layout is pinned by
//! the tests below. The ioctl needs `CAP_SYS_ADMIN`.
//!
//! Audit notes: one `unsafe` block, one call. The kernel only reads from the
//! argument struct and, through its single `iovec`, from `data`, which is
//! borrowed for the duration of the call. Nothing is written into our memory.

#![allow(unsafe_code)]

use std::ffi::c_ulong;
use std::os::fd::AsFd;

use rustix::io::Errno;
use rustix::ioctl::{Opcode, Setter, ioctl, opcode};

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
}
