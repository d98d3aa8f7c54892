//! Errors of the send planner: a filesystem read error with the inode (and
//! path, when known) it happened for (bad file data included: checksum
//! mismatches and extents that do not decompress name the file offset and
//! logical address), or the output failing.

use std::fmt;

use stream_format::EncodeError;

/// Why a send failed.
///
/// Each message includes its cause, so there is no `source()` (see
/// [`crate::error`]: `main` would print the cause a second time).
#[derive(Debug)]
#[non_exhaustive]
pub enum SendError {
    /// Reading the filesystem failed while working on an inode.
    Fs {
        /// The inode being processed (0: none yet).
        ino: u64,
        /// Its path in the snapshot, when known.
        path: Option<Vec<u8>>,
        /// The read error (names device, address, tree, key).
        source: crate::Error,
    },
    /// The snapshot has something inconsistent or that send cannot express.
    Corrupt {
        /// The inode.
        ino: u64,
        /// What is wrong.
        what: String,
    },
    /// The snapshot holds something valid that this sender cannot send
    /// yet (an fs-verity file with protocol 3).
    Unsupported {
        /// The inode.
        ino: u64,
        /// What is not supported.
        what: &'static str,
    },
    /// The subvolume asked for does not exist.
    NoSubvolume(String),
    /// `-c` without `-p`: no clone source is the snapshot's source
    /// subvolume or another snapshot of it (btrfs-progs
    /// `find_good_parent`).
    NoGoodParent(u64),
    /// Writing the stream failed (a closed pipe: the receiver went away).
    Output(EncodeError),
    /// Finding or preparing a mounted filesystem failed.
    Mount(crate::mount::MountError),
    /// The devices of a mounted filesystem could not be read.
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
    NeedsDevice(String),
    /// The path names the top level of a mounted filesystem, which is not
    /// a read-only snapshot.
    TopLevel(std::path::PathBuf),
    /// A subvolume of a mounted filesystem that can change during the send
    /// (only read-only snapshots can be sent from it, as with `btrfs
    /// send`).
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
    OtherFilesystem {
        /// The path as given.
        given: String,
        /// The filesystem of the subvolume sent.
        fsid: String,
    },
    /// A block failed to read or verify on a mounted filesystem after part
    /// of the stream had been written (too late to start again).
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
    LayoutChanged {
        /// The filesystem.
        mount: String,
        /// The chunk tree generation the send read.
        was: u64,
        /// The chunk tree generation afterwards.
        now: u64,
    },
    /// `send --resume TOKEN`: the token does not belong to this send.
    ResumeMismatch(String),
    /// A send from a mounted filesystem, planned again after a balance
    /// moved blocks it was reading, makes other commands before the point
    /// where its stream stopped: it cannot continue that stream.
    Replanned {
        /// The filesystem.
        mount: String,
        /// The stream offset where the output stopped.
        at: u64,
        /// How the commands differ.
        why: String,
    },
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Fs { ino, path, source } => {
                write!(f, "{}{source}", InodeCtx(*ino, path.as_deref()))
            }
            SendError::Corrupt { ino, what } => write!(f, "{}{what}", InodeCtx(*ino, None)),
            SendError::Unsupported { ino, what } => write!(f, "{}{what}", InodeCtx(*ino, None)),
            SendError::NoSubvolume(name) => write!(f, "no subvolume {name}"),
            SendError::NoGoodParent(id) => write!(
                f,
                "parent determination failed for subvolume {id}: no clone source is the \
                 subvolume it was snapshotted from or another snapshot of that; give the \
                 parent with -p"
            ),
            SendError::Output(e) => write!(f, "cannot write the send stream: {e}"),
            SendError::Mount(e) => write!(f, "{e}"),
            SendError::OpenMounted { mount, devices, .. } => {
                write!(f, "cannot read {mount} from its devices ({devices})")
            }
            SendError::NeedsDevice(s) => write!(
                f,
                "{s} needs --device: without it SUBVOL is a path in a mounted btrfs"
            ),
            SendError::TopLevel(p) => write!(
                f,
                "{} is the top level of the filesystem, not a read-only snapshot",
                p.display()
            ),
            SendError::NotReadOnly { role, given, mount } => write!(
                f,
                "{role}{given} is not a read-only subvolume: on {mount} only read-only snapshots \
                 can be sent (as with btrfs send), since anything else may change during the \
                 send; make one with `btrfs subvolume snapshot -r SUBVOL SNAP` and send that"
            ),
            SendError::OtherFilesystem { given, fsid } => write!(
                f,
                "{given} is on another filesystem than the subvolume sent ({fsid})"
            ),
            SendError::Incomplete {
                mount,
                before,
                after,
                ..
            } => write!(
                f,
                "a block failed to read or verify on {mount} (generation {before} then {after}); \
                 the stream already written is incomplete: run the send again"
            ),
            SendError::LayoutChanged { mount, was, now } => write!(
                f,
                "the chunk layout of {mount} changed during the send (chunks removed or moved; \
                 chunk tree generation {was} then {now}: a balance?); the stream may hold stale \
                 blocks, so its end was withheld (a receiver of it fails): run the send again"
            ),
            SendError::Replanned { mount, at, why } => write!(
                f,
                "a balance moved blocks on {mount} during the send, and the send planned again \
                 differs from the stream written before byte {at}: {why}; the stream already \
                 written is incomplete: run the send again"
            ),
            SendError::ResumeMismatch(why) => write!(
                f,
                "the resume token does not match this send: {why}; give the same SUBVOL, \
                 parent, clone sources and options as the interrupted send, and the token \
                 `btrsend receive --resume-token DIR/NAME` prints now"
            ),
        }
    }
}

/// Only the variants whose message does not include their cause return it
/// here (`OpenMounted`, `Incomplete`), so that `{:#}` prints it once.
impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendError::OpenMounted { source, .. } => Some(source),
            SendError::Incomplete { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

impl From<crate::mount::MountError> for SendError {
    fn from(e: crate::mount::MountError) -> SendError {
        SendError::Mount(e)
    }
}

impl From<EncodeError> for SendError {
    fn from(e: EncodeError) -> SendError {
        SendError::Output(e)
    }
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
        matches!(self, SendError::Output(EncodeError::Io { error, .. })
            if error.kind() == std::io::ErrorKind::BrokenPipe)
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
