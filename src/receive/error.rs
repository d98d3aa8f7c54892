//! The receive's errors: a command that cannot be applied
//! ([`ApplyError`], why in [`ApplyErrorKind`]) and why a receive stopped
//! ([`ReceiveError`]), with the messages they print. It must not decide
//! which errors stop a receive (`--max-errors`): that is the driver's.

use std::fmt;
use std::io;
use std::path::PathBuf;

use stream_format::{CommandInfo, DecodeError};

use super::encoded;
use super::target::TargetError;
use crate::types::Uuid;

/// Why one command could not be applied.
#[derive(Debug)]
#[non_exhaustive]
pub enum ApplyErrorKind {
    /// The OS refused.
    Io(io::Error),
    /// A path was refused or could not be resolved safely.
    Target(TargetError),
    /// A command before any SUBVOL or SNAPSHOT.
    NoSubvol,
    /// SUBVOL / SNAPSHOT: `DIR/<name>` exists already.
    Exists,
    /// SUBVOL / SNAPSHOT: `DIR/<name>` exists already and its record says
    /// an earlier receive of it did not finish.
    ExistsIncomplete {
        /// `DIR/<name>`.
        dir: PathBuf,
        /// Its record.
        record: PathBuf,
    },
    /// SUBVOL / SNAPSHOT: `DIR/<name>` exists already as a real subvolume
    /// that is writable and has no received UUID, as an interrupted or
    /// failed receive leaves it, with no resume point of this stream. It
    /// may as well be the user's own: nothing says a receive made it.
    ExistsIncompleteSubvol {
        /// `DIR/<name>`.
        dir: PathBuf,
    },
    /// SUBVOL / SNAPSHOT: the record of the new subvolume could not be
    /// written (e.g. the disk is full); the new, empty `DIR/<name>` and the
    /// temporary record were removed again.
    RecordWrite(io::Error),
    /// No received subvolume has this UUID.
    ParentMissing {
        /// The UUID asked for.
        uuid: Uuid,
        /// The ctransid asked for.
        ctransid: u64,
        /// A SNAPSHOT's parent (else a CLONE's source).
        parent: bool,
    },
    /// No subvolume of DIR's btrfs has this received UUID or UUID, and none
    /// was received into DIR as a directory.
    NotOnFilesystem {
        /// The UUID asked for.
        uuid: Uuid,
        /// The ctransid asked for.
        ctransid: u64,
        /// The mount root searched from.
        mount: PathBuf,
        /// A SNAPSHOT's parent (else a CLONE's source).
        parent: bool,
    },
    /// The only subvolume with this UUID is incomplete.
    ParentIncomplete {
        /// The UUID asked for.
        uuid: Uuid,
        /// The ctransid asked for.
        ctransid: u64,
        /// The incomplete subvolume.
        name: Vec<u8>,
        /// A SNAPSHOT's parent (else a CLONE's source).
        parent: bool,
    },
    /// Copying the parent failed.
    Copy {
        /// The source path.
        from: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// UPDATE_EXTENT: a `--no-data` stream.
    NoData,
    /// ENCODED_WRITE data that cannot be decoded.
    Decode(encoded::DecodeDataError),
    /// A MKNOD / CHMOD mode that makes no sense.
    BadMode(u64),
    /// MKNOD of a character or block device as an ordinary user (it needs
    /// `CAP_MKNOD`).
    DeviceNeedsRoot,
    /// Another invalid value.
    Invalid(String),
}

impl fmt::Display for ApplyErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = |parent: bool| {
            if parent {
                "parent subvolume"
            } else {
                "clone source subvolume"
            }
        };
        match self {
            ApplyErrorKind::Io(e) => e.fmt(f),
            ApplyErrorKind::Target(e) => e.fmt(f),
            ApplyErrorKind::NoSubvol => f.write_str("no SUBVOL or SNAPSHOT command before it"),
            ApplyErrorKind::Exists => f.write_str("subvolume directory exists already"),
            ApplyErrorKind::ExistsIncomplete { dir, record } => write!(
                f,
                "subvolume directory exists already, and its record {} says it is incomplete \
                 (an earlier receive was interrupted or failed): to receive it again, delete \
                 {} and {}",
                record.display(),
                dir.display(),
                record.display()
            ),
            // A writable subvolume without received UUID is what an
            // interrupted receive leaves, but also any subvolume the user
            // made: deleting it is advised only if a receive made it.
            ApplyErrorKind::ExistsIncompleteSubvol { dir } => write!(
                f,
                "subvolume exists already, writable and without a received UUID (as an \
                 interrupted or failed receive leaves it), and no resume point of this stream \
                 is kept for it: if an earlier receive made it, delete it (btrfs subvolume \
                 delete {}) and receive again; otherwise receive into another directory",
                dir.display()
            ),
            ApplyErrorKind::RecordWrite(e) => write!(
                f,
                "cannot write the subvolume's record: {e} (nothing was received: the new \
                 subvolume directory was removed again)"
            ),
            ApplyErrorKind::ParentMissing { uuid, ctransid, parent } => write!(
                f,
                "cannot find {} with uuid {uuid} ctransid {ctransid}: it was not received into this directory",
                what(*parent)
            ),
            ApplyErrorKind::NotOnFilesystem { uuid, ctransid, mount, parent } => write!(
                f,
                "cannot find {} with uuid {uuid} ctransid {ctransid}: no subvolume of the btrfs mounted at {} has it as received UUID or UUID, and none was received into this directory",
                what(*parent),
                mount.display()
            ),
            ApplyErrorKind::ParentIncomplete { uuid, ctransid, name, parent } => write!(
                f,
                "{} with uuid {uuid} ctransid {ctransid} ({}) was received incompletely: refusing to use it",
                what(*parent),
                name.escape_ascii()
            ),
            ApplyErrorKind::Copy { from, source } => {
                write!(f, "cannot copy the parent subvolume: {}: {source}", from.display())
            }
            ApplyErrorKind::NoData => f.write_str(
                "the stream was made with --no-data (UPDATE_EXTENT has no file data): it cannot be applied",
            ),
            ApplyErrorKind::Decode(e) => e.fmt(f),
            ApplyErrorKind::BadMode(m) => write!(f, "invalid mode {m:o}"),
            ApplyErrorKind::DeviceNeedsRoot => f.write_str(
                "creating a device node needs root (CAP_MKNOD) and btrsend is not running as root: receive as root, or with --max-errors 0 to receive everything else (the subvolume is then marked incomplete)",
            ),
            ApplyErrorKind::Invalid(m) => f.write_str(m),
        }
    }
}

impl From<io::Error> for ApplyErrorKind {
    fn from(e: io::Error) -> Self {
        ApplyErrorKind::Io(e)
    }
}

impl From<rustix::io::Errno> for ApplyErrorKind {
    fn from(e: rustix::io::Errno) -> Self {
        ApplyErrorKind::Io(e.into())
    }
}

impl From<TargetError> for ApplyErrorKind {
    fn from(e: TargetError) -> Self {
        ApplyErrorKind::Target(e)
    }
}

impl From<encoded::DecodeDataError> for ApplyErrorKind {
    fn from(e: encoded::DecodeDataError) -> Self {
        ApplyErrorKind::Decode(e)
    }
}

/// A command that could not be applied: which command, which paths, why.
#[derive(Debug)]
pub struct ApplyError {
    /// Where the command is in the stream (none when finishing a subvolume).
    pub cmd: Option<CommandInfo>,
    /// The operation (`WRITE`, …).
    pub op: &'static str,
    /// The command's PATH (for SUBVOL / SNAPSHOT, the subvolume name).
    pub path: Vec<u8>,
    /// Where PATH is on the filesystem, if a subvolume was open.
    pub target: Option<PathBuf>,
    /// The second path of RENAME (PATH_TO), LINK (PATH_LINK), CLONE
    /// (CLONE_PATH), with its filesystem path when known.
    pub path2: Option<(Vec<u8>, Option<PathBuf>)>,
    /// The cause.
    pub kind: ApplyErrorKind,
}

fn fmt_path(f: &mut fmt::Formatter<'_>, p: &[u8], t: Option<&PathBuf>) -> fmt::Result {
    write!(f, "\"{}\"", p.escape_ascii())?;
    if let Some(t) = t {
        write!(f, " ({})", t.display())?;
    }
    Ok(())
}

impl fmt::Display for ApplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cmd {
            Some(c) => write!(f, "cannot apply {c}: {} ", self.op)?,
            None => write!(f, "cannot {} ", self.op)?,
        }
        fmt_path(f, &self.path, self.target.as_ref())?;
        if let Some((p, t)) = &self.path2 {
            f.write_str(if self.op == "CLONE" { " from " } else { " -> " })?;
            fmt_path(f, p, t.as_ref())?;
        }
        write!(f, ": {}", self.kind)
    }
}

/// The message already includes the cause, so there is no `source()`
/// (a chain printer would repeat it).
impl std::error::Error for ApplyError {}

impl ApplyError {
    /// The OS error behind this failure, if there is one.
    pub fn io_error(&self) -> Option<&io::Error> {
        match &self.kind {
            ApplyErrorKind::Io(e) | ApplyErrorKind::Copy { source: e, .. } => Some(e),
            ApplyErrorKind::Target(TargetError::Io(e)) => Some(e),
            _ => None,
        }
    }
}

/// Why a receive failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiveError {
    /// DIR cannot be used.
    #[error("cannot receive into {}: {error}", dir.display())]
    Dir {
        /// DIR.
        dir: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// The stream is corrupt, truncated or unreadable.
    #[error("{error}{}", in_subvol(.subvol))]
    Stream {
        /// The reader's error (it names the offset and the command).
        error: DecodeError,
        /// The subvolume being received then, left incomplete.
        subvol: Option<String>,
    },
    /// A command could not be applied.
    #[error(transparent)]
    Apply(Box<ApplyError>),
    /// Errors below the `--max-errors` limit happened (each was reported
    /// through [`Progress::error`](crate::progress::Progress::error)).
    #[error(
        "{0} errors while receiving (see above); the subvolumes they hit are marked incomplete"
    )]
    Errors(u64),
}

fn in_subvol(s: &Option<String>) -> String {
    match s {
        Some(n) => format!(" (subvolume {n} left incomplete)"),
        None => String::new(),
    }
}

impl From<Box<ApplyError>> for ReceiveError {
    fn from(e: Box<ApplyError>) -> Self {
        ReceiveError::Apply(e)
    }
}
