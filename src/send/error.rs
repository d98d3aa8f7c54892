//! Errors of the send planner: a filesystem read error with the inode (and
//! path, when known) it happened for (bad file data included: checksum
//! mismatches and extents that do not decompress name the file offset and
//! logical address), or the output failing.

use std::fmt;

use stream_format::EncodeError;

/// Why a send failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// Reading the filesystem failed while working on an inode.
    #[error("{}{source}", InodeCtx(*ino, path.as_deref()))]
    Fs {
        /// The inode being processed (0: none yet).
        ino: u64,
        /// Its path in the snapshot, when known.
        path: Option<Vec<u8>>,
        /// The read error (names device, address, tree, key).
        source: crate::Error,
    },
    /// The snapshot has something inconsistent or that send cannot express.
    #[error("{}{what}", InodeCtx(*ino, None))]
    Corrupt {
        /// The inode.
        ino: u64,
        /// What is wrong.
        what: String,
    },
    /// The subvolume asked for does not exist.
    #[error("no subvolume {0}")]
    NoSubvolume(String),
    /// `-c` without `-p`: no clone source is the snapshot's source
    /// subvolume or another snapshot of it (btrfs-progs
    /// `find_good_parent`).
    #[error(
        "parent determination failed for subvolume {0}: no clone source is the subvolume it \
         was snapshotted from or another snapshot of that; give the parent with -p"
    )]
    NoGoodParent(u64),
    /// Writing the stream failed (a closed pipe: the receiver went away).
    #[error("cannot write the send stream: {0}")]
    Output(#[from] EncodeError),
    /// Finding or preparing a mounted filesystem failed.
    #[error(transparent)]
    Mount(#[from] crate::mount::MountError),
    /// The devices of a mounted filesystem could not be read.
    #[error("cannot read {mount} from its devices ({devices})")]
    OpenMounted {
        /// The filesystem, as [`MountedFs::describe`](crate::mount::MountedFs::describe) names it.
        mount: String,
        /// The devices, comma-separated.
        devices: String,
        /// Why.
        source: crate::Error,
    },
    /// A subvolume id was given where only a path in a mounted btrfs can
    /// name the subvolume (no devices were given).
    #[error("{0} needs --device: without it SUBVOL is a path in a mounted btrfs")]
    NeedsDevice(String),
    /// The path names the top level of a mounted filesystem, which is not
    /// a read-only snapshot.
    #[error("{0} is the top level of the filesystem, not a read-only snapshot")]
    TopLevel(std::path::PathBuf),
    /// A subvolume of a mounted filesystem that can change during the send
    /// (only read-only snapshots can be sent from it, as with `btrfs
    /// send`).
    #[error(
        "{role}{given} is not a read-only subvolume: on {mount} only read-only snapshots can be \
         sent (as with btrfs send), since anything else may change during the send; make one \
         with `btrfs subvolume snapshot -r SUBVOL SNAP` and send that"
    )]
    NotReadOnly {
        /// `""`, `"parent "` or `"clone source "`.
        role: &'static str,
        /// The subvolume as given.
        given: String,
        /// The filesystem ("a mounted filesystem", "the filesystem mounted read-write at …").
        mount: String,
    },
    /// A parent or clone source given by path lies on another filesystem
    /// than the subvolume sent.
    #[error("{given} is on another filesystem than the subvolume sent ({fsid})")]
    OtherFilesystem {
        /// The path as given.
        given: String,
        /// The filesystem of the subvolume sent.
        fsid: String,
    },
    /// A block failed to read or verify on a mounted filesystem after part
    /// of the stream had been written (too late to start again).
    #[error(
        "a block failed to read or verify on {mount} (generation {before} then {after}); the \
         stream already written is incomplete: run the send again"
    )]
    Incomplete {
        /// The filesystem.
        mount: String,
        /// Its generation when the send started.
        before: u64,
        /// Its generation after the failure.
        after: u64,
        /// The failure.
        source: Box<SendError>,
    },
    /// The chunk layout of a mounted filesystem changed during the send (a
    /// balance relocated block groups): blocks read through the old chunk
    /// map may be stale. The stream's END command was withheld, so a
    /// receiver of it fails too.
    #[error(
        "the chunk layout of {mount} changed during the send (chunks removed or moved; chunk \
         tree generation {was} then {now}: a balance?); the stream may hold stale blocks, so its \
         end was withheld (a receiver of it fails): run the send again"
    )]
    LayoutChanged {
        /// The filesystem.
        mount: String,
        /// The chunk tree generation the send read.
        was: u64,
        /// The chunk tree generation afterwards.
        now: u64,
    },
}

impl SendError {
    pub(crate) fn fs(ino: u64, source: crate::Error) -> SendError {
        SendError::Fs {
            ino,
            path: None,
            source,
        }
    }

    pub(crate) fn corrupt(ino: u64, what: impl Into<String>) -> SendError {
        SendError::Corrupt {
            ino,
            what: what.into(),
        }
    }

    /// Whether the output was a pipe whose reader went away.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, SendError::Output(EncodeError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

impl From<crate::Error> for SendError {
    fn from(source: crate::Error) -> SendError {
        SendError::fs(0, source)
    }
}

struct InodeCtx<'a>(u64, Option<&'a [u8]>);

impl fmt::Display for InodeCtx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0, self.1) {
            (0, _) => Ok(()),
            (ino, Some(p)) => write!(f, "inode {ino} ({}): ", String::from_utf8_lossy(p)),
            (ino, None) => write!(f, "inode {ino}: "),
        }
    }
}
