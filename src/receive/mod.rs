//! The receiver: applies send streams to a directory, on btrfs as real
//! subvolumes (as `btrfs receive` does), elsewhere as plain directories.
//!
//! Flow: [`stream_format::StreamReader`] → the private `driver` (decode,
//! skim, read-ahead, `--max-errors`) → [`apply`] (one typed command at a
//! time, one method per command, in files by concern) → [`target`] (the only stream-path →
//! filesystem-path code) → the kernel's `*at` system calls. Two modes,
//! chosen per receive ([`ReceiveOptions::subvolumes`],
//! [`subvol_mode_possible`]):
//!
//! * on btrfs as root, [`subvol`]: SUBVOL creates a subvolume, SNAPSHOT
//!   snapshots the parent found by UUID on the filesystem, and a finished
//!   subvolume gets its received UUID and is made read-only, exactly as
//!   btrfs-progs does, so `btrfs send -p`, btrbk and `btrfs receive` use it
//!   as they would their own;
//! * elsewhere (or asked for), [`meta`] keeps a record beside each received
//!   directory (received UUID, ctransid, parent, completeness), the part of
//!   the root-item bookkeeping that a plain directory cannot hold; [`copy`]
//!   makes a snapshot's starting point from its parent.
//!
//! Either way a parent received in the other mode serves (a directory parent
//! is copied into the new subvolume; a subvolume received by `btrfs
//! receive` into DIR is found by its received UUID). [`copy`] also copies
//! CLONE ranges; [`encoded`] decodes `--compressed-data` extents, which the
//! crate's private `sys` module (its only unsafe code: the btrfs ioctls)
//! writes as they are into a btrfs target. The private `lanes` module runs
//! the worker threads that write file data (see [`receive`] for what they
//! do and the memory bound, `apply`'s `Lanes` for the ordering rules).
//! Semantics per command follow btrfs-progs `cmds/receive.c`.
//!
//! Errors (the private `error` module): a corrupt or truncated stream is a [`ReceiveError::Stream`] that
//! names the byte offset and the command (from the reader); a command that
//! cannot be applied is an [`ApplyError`] that names the command, its stream
//! path(s), the target path(s) and the OS error. As `btrfs receive -E N`,
//! receiving stops at the N-th error ([`ReceiveOptions::max_errors`], 0 =
//! never); earlier ones go to [`Progress::error`]. A subvolume with any
//! error is left marked incomplete.

pub mod apply;
pub mod copy;
mod driver;
pub mod encoded;
mod error;
mod lanes;
pub mod meta;
pub mod subvol;
pub mod target;

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use stream_format::StreamReader;

pub use apply::{RESUME_DIR, Receiver, ResumeTokenError, resume_token};
pub use driver::StreamBlocks;
use driver::{
    Blocks, FILE_READ, Skim, decode_and_apply, decode_and_apply_from, reader_options, send_blocks,
    with_read_ahead,
};
pub use error::{ApplyError, ApplyErrorKind, ReceiveError};

/// Where a receive reports what it is doing: the crate's one [`Progress`]
/// interface (receive reports `position`, `subvol_start`/`subvol_done`,
/// `note` and `error`; the CLI draws a progress bar and prints notes).
pub use crate::progress::{NoProgress, Progress};

/// How to receive.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReceiveOptions {
    /// Receive subvolumes as real btrfs subvolumes where DIR is on btrfs
    /// and btrsend runs as root (default true; see [`subvol`]); false:
    /// always as directories with records in `DIR/.btrsend/`.
    pub subvolumes: bool,
    /// The mount root that subvolume paths found by UUID are relative to
    /// (`-m`); default: the mount point of DIR.
    pub root_mount: Option<PathBuf>,
    /// Stop at the N-th error; 0 = never (`-E`, default 1).
    pub max_errors: u64,
    /// Stop after the first END (`-e`).
    pub stop_at_end: bool,
    /// Decode compressed ENCODED_WRITE data even where the target could take
    /// it as it is (`--force-decompress`).
    pub force_decompress: bool,
    /// Worker threads that write file data (`--threads`); 0 or 1: every
    /// command is applied on the receiving thread. See [`receive`].
    pub threads: usize,
    /// Bytes of stream between two resume checkpoints of a subvolume
    /// (default [`crate::resume::CHECKPOINT_BYTES`], 48 MiB; the design is
    /// in [`crate::resume`]). 0: no checkpoints, for a one-shot receive
    /// that is never resumed (e.g. a restore from a stream that can simply
    /// be received again): no snapshots or `syncfs` on the way, no undo
    /// journal; an interrupted receive then leaves its subvolume
    /// incomplete with no resume point (delete it and receive it again).
    /// A larger interval makes fewer checkpoints and more stream sent
    /// again after an interruption (at most the interval plus 16 MiB).
    pub checkpoint_interval: u64,
}

impl ReceiveOptions {
    /// The defaults: stop at the first error, read every concatenated stream.
    pub const fn new() -> ReceiveOptions {
        ReceiveOptions {
            subvolumes: true,
            root_mount: None,
            max_errors: 1,
            stop_at_end: false,
            force_decompress: false,
            threads: DEFAULT_THREADS,
            checkpoint_interval: crate::resume::CHECKPOINT_BYTES,
        }
    }
}

/// Default of [`ReceiveOptions::threads`].
pub const DEFAULT_THREADS: usize = 2;

/// Bytes of file data queued to the worker threads at most (the memory
/// bound of a receive with threads, besides the read-ahead).
pub const MAX_QUEUED_DATA: usize = lanes::MAX_IN_FLIGHT;

impl Default for ReceiveOptions {
    fn default() -> ReceiveOptions {
        ReceiveOptions::new()
    }
}

/// What a receive did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Commands read.
    pub commands: u64,
    /// Bytes read.
    pub bytes: u64,
}

/// Receive every stream in `input` into `dir`.
///
/// The input is read on a thread of its own, in blocks of 1 MiB, up to 8
/// blocks ahead of the decoder (bounded: at most 11 blocks, 11 MiB, exist
/// at once, reused), so the `read` system calls overlap the decoding (CRC-32C)
/// and the applying; the bytes are copied once, into the stream reader's
/// command buffer, as with a `BufReader`. [`receive_file`] reads a regular
/// file straight into the command buffers instead.
///
/// Commands are decoded and checked in order on the calling thread. With
/// [`ReceiveOptions::threads`] > 1, the data of WRITE (8 KiB and more) and
/// ENCODED_WRITE commands is written by that many worker threads, one queue
/// per file, from the command buffer it was read into (no copy), with the
/// commands that follow on the same file (TRUNCATE, FALLOCATE, CHMOD,
/// CHOWN, UTIMES) queued after it; every
/// other command waits for the queued jobs it depends on, and SUBVOL,
/// SNAPSHOT and END wait for all (the rules are in `apply`'s `Lanes`). At
/// most [`MAX_QUEUED_DATA`] bytes of data are queued at once. An error in a
/// queued job names its command, stream offset and path as any other; it is
/// counted against `--max-errors` when the receiving thread sees it, so a
/// few commands after it may have been applied already (the subvolume is
/// marked incomplete all the same).
///
/// # Errors
///
/// See [`ReceiveError`]: the stream error or apply error that stopped the
/// receive, or [`ReceiveError::Errors`] when errors below the limit
/// happened.
pub fn receive(
    input: impl Read + Send,
    dir: &Path,
    opts: &ReceiveOptions,
    progress: &mut dyn Progress,
) -> Result<Summary, ReceiveError> {
    let mut rx = receiver(dir, opts, progress)?;
    with_read_ahead(input, |blocks| decode_and_apply(&mut rx, blocks, opts))
}

/// A receiver into `dir` set up as `opts` ask (decompression, worker
/// threads).
fn receiver<'p>(
    dir: &Path,
    opts: &ReceiveOptions,
    progress: &'p mut dyn Progress,
) -> Result<Receiver<'p>, ReceiveError> {
    let err = |error| ReceiveError::Dir {
        dir: dir.to_path_buf(),
        error,
    };
    let mut rx = Receiver::new(dir, progress).map_err(err)?;
    if opts.subvolumes && subvol_mode_possible(dir) {
        let b = subvol::Btrfs::open(dir, opts.root_mount.as_deref()).map_err(err)?;
        rx.subvolumes(Some(b));
    }
    rx.force_decompress(opts.force_decompress);
    rx.threads(opts.threads, MAX_QUEUED_DATA).map_err(err)?;
    rx.drop_stale_resume_points();
    Ok(rx)
}

/// Whether subvolumes can be received into `dir` as real btrfs
/// subvolumes: it is on btrfs and btrsend runs as root (the subvolume and
/// tree-search ioctls need `CAP_SYS_ADMIN`).
pub fn subvol_mode_possible(dir: &Path) -> bool {
    rustix::process::geteuid().is_root()
        && target::ReceiveDir::open(dir).is_ok_and(|d| subvol::on_btrfs(d.fd()))
}

/// Receive every stream in `input` into `dir`, as [`receive`]; a regular
/// file is read without a read-ahead thread, anything else (a pipe, a
/// terminal) as [`receive`] does.
///
/// With worker threads ([`ReceiveOptions::threads`] > 1), the WRITE and
/// ENCODED_WRITE commands of a regular file (8 KiB and longer) are
/// *skimmed*: the receiving thread reads their header and PATH and skips
/// the data; the worker that writes the file reads the command from the
/// input (`pread`, into a buffer it reuses), checks its CRC-32C and
/// attributes as the stream reader does and writes the data from that
/// buffer: one copy of the data out of the input's page cache, made by the
/// thread that writes it, and no limit on how far the receiving thread
/// runs ahead (a queued job holds no data), so several files are written at
/// once even though the stream sends them one after the other. A file that
/// shrinks while it is read gives a "truncated" error (it is read, not
/// mapped: no `SIGBUS`); an error found by a worker (CRC mismatch,
/// truncation, a bad attribute) names the command, its stream offset and
/// its path, and is counted as other errors. Commands whose file cannot be
/// given to a worker (several links) are read whole and applied on the
/// receiving thread.
///
/// # Errors
///
/// As [`receive`].
pub fn receive_file(
    input: std::fs::File,
    dir: &Path,
    opts: &ReceiveOptions,
    progress: &mut dyn Progress,
) -> Result<Summary, ReceiveError> {
    let regular = input.metadata().is_ok_and(|m| m.file_type().is_file());
    if !regular {
        return receive(input, dir, opts, progress);
    }
    // A listing of every command needs every command read whole.
    let skim = opts.threads > 1 && !progress.lists_commands();
    let mut rx = receiver(dir, opts, progress)?;
    let len = input.metadata().map_or(0, |m| m.len());
    let input = std::sync::Arc::new(input);
    let file = input.try_clone().map_err(|error| ReceiveError::Dir {
        dir: dir.to_path_buf(),
        error,
    })?;
    let mut src = Skim {
        reader: StreamReader::with_options(
            io::BufReader::with_capacity(FILE_READ, file),
            reader_options(),
        ),
        len,
        on: skim,
    };
    decode_and_apply_from(&mut rx, &mut src, Some(&input), opts)
}

/// Receive every stream in the buffers `input` gives into `dir`, as
/// [`receive`] does with what it reads: `input` runs on a thread of its
/// own, at most `queue` buffers ahead of the decoder (at least 1), which
/// copies the commands out of them; each buffer is given back once its
/// bytes are copied.
///
/// # Errors
///
/// As [`receive`].
pub fn receive_blocks(
    input: impl StreamBlocks + Send,
    queue: usize,
    dir: &Path,
    opts: &ReceiveOptions,
    progress: &mut dyn Progress,
) -> Result<Summary, ReceiveError> {
    let mut rx = receiver(dir, opts, progress)?;
    let queue = queue.max(1);
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel(queue);
    let (empty_tx, empty_rx) = std::sync::mpsc::sync_channel(queue + 2);
    std::thread::scope(|s| {
        s.spawn(move || send_blocks(input, &full_tx, &empty_rx));
        let blocks = Blocks {
            full: full_rx,
            empty: empty_tx,
            cur: (Vec::new(), 0),
            pos: 0,
            done: false,
        };
        // As in `with_read_ahead`: dropping `blocks` ends the thread.
        decode_and_apply(&mut rx, blocks, opts)
    })
}

/// Remove what a receive into `dir` made of the subvolume `name`: the
/// subvolume (a real one, as [`receive`] makes where
/// [`subvol_mode_possible`]) or the directory with its record, and its
/// resume point. For a caller that must leave nothing of a receive it
/// stopped (`backup restore` after finding damage); `name` must be one
/// that receive reported with [`Progress::subvol_start`] (it made it).
///
/// # Errors
///
/// The OS error, naming the path it concerns.
pub fn discard(dir: &Path, name: &[u8]) -> io::Result<()> {
    use std::ffi::OsStr;
    use std::os::fd::AsFd;
    use std::os::unix::ffi::OsStrExt;

    use rustix::fs::{AtFlags, Mode, OFlags};

    let rdir = target::ReceiveDir::open(dir)?;
    let path = rdir.display_path(name);
    let named = |e: io::Error, p: &Path| meta::with_path(e, p);
    let os = OsStr::from_bytes(name);
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    // The resume point first: its checkpoints are snapshots of `name`.
    let resume = rdir.display_path(RESUME_DIR.as_bytes());
    if let Ok(top) = rustix::fs::openat(rdir.fd(), RESUME_DIR, flags, Mode::empty())
        && let Ok(points) = rustix::fs::openat(&top, os, flags, Mode::empty())
    {
        let mut ckpts = Vec::new();
        let mut it = rustix::fs::Dir::read_from(&points).map_err(|e| named(e.into(), &resume))?;
        while let Some(Ok(e)) = it.next() {
            let n = e.file_name().to_bytes();
            if n.starts_with(b"ckpt-") {
                ckpts.push(n.to_vec());
            }
        }
        for n in ckpts {
            crate::sys::snap_destroy(points.as_fd(), &n).map_err(|e| named(e.into(), &resume))?;
        }
        // A directory-mode resume point: its undo journal and trash.
        apply::drop_journals(&points, None);
        for f in apply::STATE_FILES {
            match rustix::fs::unlinkat(&points, f, AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(named(e.into(), &resume)),
            }
        }
        drop(points);
        rustix::fs::unlinkat(&top, os, AtFlags::REMOVEDIR).map_err(|e| named(e.into(), &resume))?;
        // Only if no other subvolume has a resume point.
        let _ = rustix::fs::unlinkat(rdir.fd(), RESUME_DIR, AtFlags::REMOVEDIR);
    }
    if subvol_mode_possible(dir) {
        let d = subvol::reopen_dir(rdir.fd()).map_err(|e| named(e, dir))?;
        return match crate::sys::snap_destroy(d.as_fd(), name) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(named(e.into(), &path)),
        };
    }
    match std::fs::remove_dir_all(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(named(e, &path)),
    }
    let record = meta::Records::open(&rdir)?.path_of(name);
    match std::fs::remove_file(&record) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(named(e, &record)),
    }
    // Only if no other record is there.
    let _ = rustix::fs::unlinkat(
        rdir.fd(),
        OsStr::from_bytes(target::RESERVED_NAME),
        AtFlags::REMOVEDIR,
    );
    Ok(())
}

#[cfg(test)]
mod tests;
