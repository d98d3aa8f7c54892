//! Send: plan and write a btrfs send stream of a subvolume read straight
//! from the devices — the same commands, in the same order, as the
//! kernel's `btrfs send` (Linux `fs/btrfs/send.c`).
//!
//! Stage 5 of the data flow (device → chunk map → tree → fs → **send**);
//! the wire format is the `stream-format` crate's [`StreamWriter`].
//!
//! * [`planner`]: the send planner, full and incremental (with a parent
//!   snapshot: [`send_incremental`]) alike, one room per concern (the
//!   event loop, paths, inode creation, refs, delayed moves, xattrs and
//!   utimes, extents and holes, clones, data commands);
//! * `backref`: the back-reference walk of clone detection;
//! * [`extent_tree`]: the extent items and back references it reads, by
//!   one cursor over the extent tree for the whole send;
//! * `compare`: the tree comparison of an incremental send, which skips
//!   subtrees both snapshots share;
//! * `view`: the planner's point lookups in a snapshot's tree, by one
//!   near-seeking cursor per tree; every item is decoded by the
//!   filesystem model ([`crate::fs::Inode`], [`crate::fs::FileExtent`], …);
//! * `data`: the stream's compression numbers; the planner hands the
//!   model's extents to its data path ([`crate::fs::ExtentReader`]:
//!   reads, `--verify-data` checksums with mirror fallback,
//!   decompression);
//! * `pipeline`: the planner's commands in order to one writer, with the
//!   file data read ahead by worker threads;
//! * [`mounted`]: where the filesystem is read from ([`mounted::Source`]:
//!   devices, or a path in a mounted btrfs) and the policy for a mounted
//!   one (flush, drop stale caches, restart, the layout check).
//!
//! Threads: the calling thread walks the tree, plans, and writes every
//! command in order; [`SendOptions::threads`] worker threads (default 4;
//! a rayon pool of their own) read, verify and decompress the file data of WRITE and ENCODED_WRITE
//! commands in batches of jobs (at most 256 KiB or 64 jobs a batch),
//! ahead of the writer. With 0 threads the data is read on the calling
//! thread when its command is planned, and so are reads under 64 KiB
//! with nothing to verify or decompress.
//!
//! Memory, whatever the snapshot's size: the queue between planner and
//! writer holds at most 16 MiB of data and commands (each entry charged
//! its data and encoded size plus 128 bytes; commands without data queued
//! one after another share an entry, packed encoded, each charged alike)
//! or 16384 entries, whichever comes first (one written buffer of packed
//! commands of at most 64 KiB is kept for the next); written data buffers are kept for reuse only while the
//! queue and the kept buffers hold at most 16 MiB together (so at most
//! 32 MiB of both). A data job reads at most 256 KiB, and a worker holds
//! one compressed extent (≤ 128 KiB on disk, ≤ 128 KiB decoded) at a time.
//! The planner holds one leaf path of the tree walk and one of the lookup
//! cursor per tree (snapshot, parent, clone sources), the current inode's
//! recorded references, at most 64 + a few deferred directory utimes, a
//! first-reference cache of at most 65536 entries, and for clone
//! detection: in a full send without clone sources, the set of data
//! extents already sent (at most 2^20 addresses, ~16 MiB; past that it is
//! dropped and every shared extent's back references are walked instead),
//! a per-leaf cache of the clone roots reaching a leaf (at most 2^14
//! leaves, then cleared), one tree root per referencing subvolume, one
//! leaf path of the extent tree, and the decoded back references of the
//! latest extents looked up (at most 4096 extents and 2^16 references
//! together, ~2 MiB; an extent's references are read only when it has at
//! most `SEND_MAX_EXTENT_REFS` = 1024, the most that are walked). A send
//! of a read-write mounted filesystem keeps the data commands of at most
//! 2^17 extents with data on disk (48 bytes each, ~6 MiB; see
//! [`mounted`]), for a continuation after a balance.
//! The block cache is bounded by [`ReadOptions`](crate::device::readahead::ReadOptions).

pub mod error;
pub mod extent_tree;
pub mod mounted;
pub mod planner;
pub mod several;
pub mod total;

mod backref;
mod compare;

mod data;
mod pipeline;
mod view;

use std::io::{BufWriter, Write};

use stream_format::{StreamWriter, WriterOptions};

use crate::fs::Filesystem;
use crate::fs::subvol::{Subvolume, list_subvolumes};
use crate::types::TreeId;

pub use error::SendError;
pub use planner::SendStats;

/// Highest protocol version this sender writes (3 only lacks fs-verity).
pub const MAX_PROTO: u32 = 2;

/// What to send and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SendOptions {
    /// Protocol version: 1 (default of btrfs-progs), 2 or 3.
    pub version: u32,
    /// Pass compressed extents through as ENCODED_WRITE (needs v2+).
    pub compressed_data: bool,
    /// Send UPDATE_EXTENT instead of file data (`--no-data`).
    pub no_data: bool,
    /// Verify file data against the csum tree, reading another copy when
    /// one is bad (on by default; off: `--no-verify-data`).
    pub verify_data: bool,
    /// Threads that read, verify and decompress file data ahead of the
    /// writer; 0 reads it on the calling thread. `None` (default): 4, or
    /// the `BTRSEND_SEND_THREADS` environment variable (for benchmarks).
    pub threads: Option<usize>,
}

impl SendOptions {
    /// Protocol `version` without flags; data is verified.
    pub const fn new(version: u32) -> SendOptions {
        SendOptions {
            version,
            compressed_data: false,
            no_data: false,
            verify_data: true,
            threads: None,
        }
    }

    /// Set [`SendOptions::compressed_data`].
    pub const fn with_compressed_data(mut self, on: bool) -> SendOptions {
        self.compressed_data = on;
        self
    }

    /// Set [`SendOptions::no_data`].
    pub const fn with_no_data(mut self, on: bool) -> SendOptions {
        self.no_data = on;
        self
    }

    /// Set [`SendOptions::verify_data`].
    pub const fn with_verify_data(mut self, on: bool) -> SendOptions {
        self.verify_data = on;
        self
    }

    /// Set [`SendOptions::threads`].
    pub const fn with_threads(mut self, threads: usize) -> SendOptions {
        self.threads = Some(threads);
        self
    }
}

/// Progress reports from a send: the crate's one [`Progress`] interface
/// (send reports `subvol_start`/`subvol_done`, `inode` and `data`).
pub use crate::progress::{NoProgress, Progress};

/// Find a subvolume by its path from the top level (as `btrsend list`
/// prints it) or `id:N`.
///
/// # Errors
///
/// [`SendError::NoSubvolume`]; read errors.
pub fn find_subvolume(fs: &Filesystem, spec: &str) -> Result<Subvolume, SendError> {
    let subvols = list_subvolumes(fs)?;
    let found = if let Some(id) = spec.strip_prefix("id:") {
        let id: u64 = id
            .parse()
            .map_err(|_| SendError::NoSubvolume(spec.to_owned()))?;
        subvols.into_iter().find(|s| s.id() == TreeId(id))
    } else {
        let want = spec.trim_matches('/').as_bytes();
        subvols.into_iter().find(|s| s.path == want)
    };
    found.ok_or_else(|| SendError::NoSubvolume(spec.to_owned()))
}

/// The parent btrfs-progs picks for `btrfs send -c SRC… SUBVOL` without
/// `-p` (`find_good_parent` in `cmds/send.c`): the subvolume `subvol` was
/// snapshotted from, if it is a clone source; else the clone source that is
/// another snapshot of that subvolume with the ctransid closest to its
/// ctransid (the first of equals).
///
/// # Errors
///
/// [`SendError::NoGoodParent`] when there is none; read errors.
pub fn find_good_parent(
    fs: &Filesystem,
    subvol: &Subvolume,
    clone_sources: &[Subvolume],
) -> Result<Subvolume, SendError> {
    let none = || SendError::NoGoodParent(subvol.id().get());
    let all = list_subvolumes(fs)?;
    let source_of = |s: &Subvolume| {
        let uuid = s.root.parent_uuid;
        if uuid.is_nil() {
            return None;
        }
        all.iter().find(|o| o.root.uuid == uuid)
    };
    let parent = source_of(subvol).ok_or_else(none)?;
    if let Some(c) = clone_sources.iter().find(|c| c.id() == parent.id()) {
        return Ok(c.clone());
    }
    let mut best: Option<(&Subvolume, u64)> = None;
    for c in clone_sources {
        if source_of(c).is_none_or(|p| p.id() != parent.id()) {
            continue;
        }
        let diff = c.root.ctransid.get().abs_diff(parent.root.ctransid.get());
        if best.is_none_or(|(_, d)| diff < d) {
            best = Some((c, diff));
        }
    }
    best.map(|(c, _)| c.clone()).ok_or_else(none)
}

/// Write a full send stream of `subvol` to `out`.
///
/// # Errors
///
/// [`SendError`]: read errors (with the inode and path), corrupt file data,
/// write errors (a closed pipe: [`SendError::is_broken_pipe`]).
pub fn send_full<W: Write>(
    fs: &Filesystem,
    subvol: &Subvolume,
    out: W,
    opts: SendOptions,
    progress: &dyn Progress,
) -> Result<(W, SendStats), SendError> {
    send_with_clone_sources(fs, subvol, None, &[], out, opts, progress)
}

/// Write an incremental send stream of `subvol` against `parent` (which
/// the receiver has) to `out`: SNAPSHOT, then only what changed.
///
/// # Errors
///
/// As [`send_full`].
pub fn send_incremental<W: Write>(
    fs: &Filesystem,
    subvol: &Subvolume,
    parent: &Subvolume,
    out: W,
    opts: SendOptions,
    progress: &dyn Progress,
) -> Result<(W, SendStats), SendError> {
    send_with_clone_sources(fs, subvol, Some(parent), &[], out, opts, progress)
}

/// `--compressed-data` needs protocol 2 or later.
fn check_options(opts: SendOptions) -> Result<(), SendError> {
    if opts.compressed_data && opts.version < 2 {
        return Err(SendError::Output(
            stream_format::EncodeError::CommandNotInVersion {
                cmd: stream_format::CommandKind::EncodedWrite,
                version: opts.version,
            },
        ));
    }
    Ok(())
}

/// The exact size and commands of the stream
/// [`send_with_clone_sources`] would write with these arguments
/// ([`SendStats::stream_bytes`], [`SendStats::commands`] and the data
/// counts), found by planning the whole send without reading any file
/// data or writing anything (`btrsend send --estimate`): it costs the
/// metadata walk of a send.
///
/// # Errors
///
/// As [`send_full`], but for output errors.
pub fn estimate(
    fs: &Filesystem,
    subvol: &Subvolume,
    parent: Option<&Subvolume>,
    clone_sources: &[Subvolume],
    opts: SendOptions,
) -> Result<SendStats, SendError> {
    check_options(opts)?;
    let tree = fs.fs_tree(subvol.id())?;
    let writer = StreamWriter::with_options(std::io::sink(), WriterOptions::new(opts.version))?;
    let out = pipeline::Pipeline::sizing(writer, &tree);
    let planner = planner::Planner::new(fs, subvol, parent, clone_sources, out, opts, &NoProgress)?;
    planner.run(&subvol.name).map(|(_, stats)| stats)
}

/// Write a send stream of `subvol` to `out` with clone sources: full, or
/// incremental against `parent`; data shared with `parent` or any of
/// `clone_sources` (snapshots the receiver has) is sent as CLONE commands,
/// as `btrfs send [-p PARENT] -c SRC…` does.
///
/// Reports [`Progress::subvol_start`] with the subvolume's path before and
/// [`Progress::subvol_done`] after (complete when it succeeded).
///
/// # Errors
///
/// As [`send_full`].
pub fn send_with_clone_sources<W: Write>(
    fs: &Filesystem,
    subvol: &Subvolume,
    parent: Option<&Subvolume>,
    clone_sources: &[Subvolume],
    out: W,
    opts: SendOptions,
    progress: &dyn Progress,
) -> Result<(W, SendStats), SendError> {
    progress.subvol_start(&subvol.path, parent.is_some());
    let res = send_stream(
        fs,
        subvol,
        parent,
        clone_sources,
        out,
        opts,
        None,
        None,
        progress,
    );
    progress.subvol_done(&subvol.path, res.is_ok());
    res
}

/// One attempt of a mounted send that keeps what it writes in a trail, so
/// that a later attempt can continue it (see [`pipeline::Trail`]).
#[derive(Clone, Copy)]
pub(crate) struct Traced<'a> {
    pub(crate) trail: &'a std::cell::RefCell<pipeline::Trail>,
    /// Continue the trail's stream where it stopped (else start: from the
    /// start, or the token's point).
    pub(crate) resume: bool,
    /// The resume token the whole send continues, if any.
    pub(crate) token: Option<&'a crate::resume::Token>,
    /// Keep the trail (identity chain, each extent's data commands):
    /// only a send that may continue after a relocation needs it.
    pub(crate) record: bool,
}

/// [`send_with_clone_sources`] or [`send_resumed`] (with `traced.token`),
/// keeping what it writes in `traced.trail`, or continuing it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn send_traced<W: Write>(
    fs: &Filesystem,
    subvol: &Subvolume,
    parent: Option<&Subvolume>,
    clone_sources: &[Subvolume],
    out: W,
    opts: SendOptions,
    traced: Traced<'_>,
    progress: &dyn Progress,
) -> Result<(W, SendStats), SendError> {
    let from = match traced.token {
        Some(t) if !traced.resume => {
            check_token(subvol, parent, opts, t)?;
            Some(ResumeFrom::Token(t))
        }
        _ => None,
    };
    progress.subvol_start(&subvol.path, parent.is_some());
    let res = send_stream(
        fs,
        subvol,
        parent,
        clone_sources,
        out,
        opts,
        from,
        Some(traced),
        progress,
    );
    progress.subvol_done(&subvol.path, res.is_ok());
    res
}

/// Where a resumed send continues (see [`crate::resume`]).
#[derive(Debug, Clone, Copy)]
pub enum ResumeFrom<'a> {
    /// A receiver's resume token: write a continuation stream (its header,
    /// then the commands from the token's point on), after checking that
    /// the commands before that point are the token's.
    Token(&'a crate::resume::Token),
    /// Within one process: continue the stream at this byte offset (the
    /// bytes before it were written already), as if it had never stopped.
    Offset(u64),
}

/// [`send_with_clone_sources`] continued from a resume point: only the
/// rest of the stream is written (see [`ResumeFrom`]). Nothing of the
/// file data before the point is read.
///
/// # Errors
///
/// As [`send_full`]; [`SendError::ResumeMismatch`] when the token is not
/// this send's (another snapshot, parent, protocol, options or clone
/// sources).
#[allow(clippy::too_many_arguments)]
pub fn send_resumed<W: Write>(
    fs: &Filesystem,
    subvol: &Subvolume,
    parent: Option<&Subvolume>,
    clone_sources: &[Subvolume],
    out: W,
    opts: SendOptions,
    from: ResumeFrom<'_>,
    progress: &dyn Progress,
) -> Result<(W, SendStats), SendError> {
    if let ResumeFrom::Token(t) = from {
        check_token(subvol, parent, opts, t)?;
    }
    progress.subvol_start(&subvol.path, parent.is_some());
    let res = send_stream(
        fs,
        subvol,
        parent,
        clone_sources,
        out,
        opts,
        Some(from),
        None,
        progress,
    );
    progress.subvol_done(&subvol.path, res.is_ok());
    res
}

/// The identities a token names against the send asked for.
fn check_token(
    subvol: &Subvolume,
    parent: Option<&Subvolume>,
    opts: SendOptions,
    t: &crate::resume::Token,
) -> Result<(), SendError> {
    let hex = |u: &[u8; 16]| uuid::Uuid::from_bytes(*u).hyphenated().to_string();
    // The UUID the stream carries (a received subvolume's received UUID):
    // a receiver's token holds what the stream carried.
    let stream_uuid = Subvolume::stream_uuid;
    let name = String::from_utf8_lossy(&subvol.path).into_owned();
    if stream_uuid(subvol) != t.uuid {
        return Err(SendError::ResumeMismatch(format!(
            "it continues the snapshot with uuid {}, not {name} (uuid {})",
            hex(&t.uuid),
            hex(&stream_uuid(subvol))
        )));
    }
    if subvol.root.ctransid.get() != t.ctransid {
        return Err(SendError::ResumeMismatch(format!(
            "{name} has ctransid {}, the token's snapshot {} (it changed)",
            subvol.root.ctransid.get(),
            t.ctransid
        )));
    }
    match (parent, t.has_parent()) {
        (None, true) => {
            return Err(SendError::ResumeMismatch(format!(
                "it continues an incremental send (parent uuid {}); this send is full: give -p",
                hex(&t.parent_uuid)
            )));
        }
        (Some(p), false) => {
            return Err(SendError::ResumeMismatch(format!(
                "it continues a full send; this send is incremental (parent {})",
                String::from_utf8_lossy(&p.path)
            )));
        }
        (Some(p), true)
            if stream_uuid(p) != t.parent_uuid || p.root.ctransid.get() != t.parent_ctransid =>
        {
            return Err(SendError::ResumeMismatch(format!(
                "its parent is uuid {} ctransid {}, not {} (uuid {} ctransid {})",
                hex(&t.parent_uuid),
                t.parent_ctransid,
                String::from_utf8_lossy(&p.path),
                hex(&stream_uuid(p)),
                p.root.ctransid.get()
            )));
        }
        _ => {}
    }
    if opts.version != t.version {
        return Err(SendError::ResumeMismatch(format!(
            "it continues a protocol {} stream, this send writes protocol {} (--proto)",
            t.version, opts.version
        )));
    }
    Ok(())
}

/// [`send_with_clone_sources`] without the progress bracket, from the
/// start or from a resume point.
#[allow(clippy::too_many_arguments)]
fn send_stream<W: Write>(
    fs: &Filesystem,
    subvol: &Subvolume,
    parent: Option<&Subvolume>,
    clone_sources: &[Subvolume],
    out: W,
    opts: SendOptions,
    from: Option<ResumeFrom<'_>>,
    traced: Option<Traced<'_>>,
    progress: &dyn Progress,
) -> Result<(W, SendStats), SendError> {
    check_options(opts)?;
    let threads = opts.threads.unwrap_or_else(|| {
        std::env::var("BTRSEND_SEND_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(pipeline::DEFAULT_THREADS)
    });
    let tree = fs.fs_tree(subvol.id())?;
    let mut buffered = BufWriter::with_capacity(256 * 1024, out);
    let io_err = |error| SendError::Output(stream_format::EncodeError::Io { offset: 0, error });
    let skip = match (traced.filter(|t| t.resume), from) {
        // The stream already written: nothing of the header again.
        (Some(t), _) => Some(pipeline::Skip::to_trail(&t.trail.borrow(), t.token)),
        (None, None) => None,
        (None, Some(ResumeFrom::Token(t))) => {
            buffered
                .write_all(&crate::resume::continuation_header(t))
                .map_err(io_err)?;
            Some(pipeline::Skip::to_token(t))
        }
        (None, Some(ResumeFrom::Offset(at))) => {
            // The part of the stream header not written yet.
            let mut h = stream_format::STREAM_MAGIC.to_vec();
            h.extend_from_slice(&opts.version.to_le_bytes());
            let from = usize::try_from(at).unwrap_or(usize::MAX).min(h.len());
            buffered.write_all(&h[from..]).map_err(io_err)?;
            Some(pipeline::Skip::to_offset(at))
        }
    };
    let inner = pipeline::Discard {
        inner: buffered,
        skip: 0,
    };
    let wopts = match skip {
        Some(_) => WriterOptions::new(opts.version).without_header(),
        None => WriterOptions::new(opts.version),
    };
    let writer = StreamWriter::with_options(inner, wopts)?;
    let run = |workers| {
        let out = pipeline::Pipeline::new(writer, &tree, opts.verify_data, workers);
        let out = match skip {
            Some(s) => out.resume(s),
            None => out,
        };
        let out = match traced {
            Some(t) if t.record => out.traced(t.trail),
            _ => out,
        };
        let planner =
            planner::Planner::new(fs, subvol, parent, clone_sources, out, opts, progress)?;
        planner.run(&subvol.name)
    };
    // The data workers run on a rayon pool of their own (without one — no
    // threads asked for, or none could be started — the planner's thread
    // reads the data itself).
    let pool = (threads > 0)
        .then(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("btrsend-data-{i}"))
                .build()
                .ok()
        })
        .flatten();
    let (discard, stats) = match &pool {
        Some(pool) => pool.in_place_scope(|scope| {
            run(Some(pipeline::spawn_workers(
                scope,
                &tree,
                opts.verify_data,
                threads,
            )))
        }),
        None => run(None),
    }?;
    let out = discard.inner.into_inner().map_err(|e| {
        SendError::Output(stream_format::EncodeError::Io {
            offset: stats.stream_bytes,
            error: e.into_error(),
        })
    })?;
    Ok((out, stats))
}
