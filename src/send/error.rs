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
        }
    }
}

impl std::error::Error for SendError {}

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
