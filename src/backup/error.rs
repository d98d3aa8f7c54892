//! [`BackupError`]: everything that can go wrong in the backup room, and
//! which of it the command line maps to its own exit status (a missing
//! repository, a held lock).
//!
//! It only names failures; it decides nothing and does no I/O. The
//! operations build these errors, the CLI renders them.

use std::io;
use std::path::PathBuf;

use super::file::Damage;
use super::store::StoreError;
use crate::receive::ReceiveError;
use crate::send::SendError;

/// Everything that can go wrong in the backup room.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    /// There is no repository there (or it cannot be reached).
    #[error("{repo}: {what}")]
    RepoMissing {
        /// The repository.
        repo: String,
        /// What is wrong.
        what: String,
    },
    /// Another process holds the lock.
    #[error("{repo} is locked by {holder} (wait for it with --retry-lock DURATION)")]
    LockHeld {
        /// The repository (or target).
        repo: String,
        /// Who holds it.
        holder: String,
    },
    /// The catalog is unreadable or inconsistent.
    #[error("{repo}: catalog: {what}")]
    Catalog {
        /// The repository.
        repo: String,
        /// What is wrong.
        what: String,
    },
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stream file is damaged.
    #[error("{repo}: {damage}")]
    Damage {
        /// The repository.
        repo: String,
        /// The damage.
        damage: Box<Damage>,
    },
    /// Sending a snapshot failed.
    #[error("cannot send {snapshot}: {error}")]
    Send {
        /// The snapshot.
        snapshot: String,
        /// Why.
        error: Box<SendError>,
    },
    /// Receiving (restoring) failed.
    #[error("cannot restore {snapshot} into {}: {error}", dir.display())]
    Receive {
        /// The snapshot.
        snapshot: String,
        /// The target directory.
        dir: PathBuf,
        /// Why.
        error: Box<ReceiveError>,
    },
    /// Receiving into a received-subvolume target failed (here, or on
    /// the far end, whose words `error` carries, made printable).
    #[error("cannot receive into {target}: {error}")]
    TargetReceive {
        /// The target, as the user named it.
        target: String,
        /// Why.
        error: String,
    },
    /// A snapshot's index could not be read.
    #[error("{what}: {error}")]
    Index {
        /// Which snapshot, and what was being done.
        what: String,
        /// Why.
        error: Box<super::index::IndexError>,
    },
    /// Reading the source filesystem failed.
    #[error("{what}: {error}")]
    Fs {
        /// What was being read.
        what: String,
        /// Why.
        error: Box<crate::Error>,
    },
    /// A file could not be read or written.
    #[error("{what}: {error}")]
    Io {
        /// What and where.
        what: String,
        /// Why.
        error: io::Error,
    },
    /// A stream file given to `import` is not a usable send stream.
    #[error("{file}: {what}")]
    Import {
        /// The file.
        file: String,
        /// What is wrong.
        what: String,
    },
    /// Nothing in the repository matches.
    #[error("{repo}: {what}")]
    NoSuchSnapshot {
        /// The repository.
        repo: String,
        /// What was asked for.
        spec: String,
        /// Why nothing was chosen, with the nearest candidates or the
        /// origins `spec` matches in.
        what: String,
    },
    /// A local repository's filesystem has less room than the raw streams
    /// a run stores (zstd may not shrink them: the raw size is the bound).
    #[error(
        "{repo}: not enough room for the run: {needed} bytes of raw stream to store, {free} bytes free"
    )]
    NoRoom {
        /// The repository.
        repo: String,
        /// The raw bytes of the streams the run stores.
        needed: u64,
        /// The bytes free for an unprivileged writer (statvfs `f_bavail`).
        free: u64,
    },
    /// Anything else the caller asked for that cannot be done.
    #[error("{0}")]
    Invalid(String),
    /// A secret of an encrypted repository is missing or wrong (or keys
    /// are given for an unencrypted one).
    #[error("{repo}: {what}")]
    Key {
        /// The repository.
        repo: String,
        /// What is missing or wrong, and what supplies it.
        what: String,
    },
}

impl BackupError {
    /// Whether the repository is missing or unreachable (exit code 10).
    pub fn is_repo_missing(&self) -> bool {
        matches!(
            self,
            BackupError::RepoMissing { .. }
                | BackupError::Store(StoreError::Unreachable { .. } | StoreError::Missing { .. })
        )
    }

    /// Whether the lock was held (exit code 11).
    pub fn is_lock_held(&self) -> bool {
        matches!(self, BackupError::LockHeld { .. })
    }

    /// Whether a secret was missing or wrong (exit code 13).
    pub fn is_key(&self) -> bool {
        matches!(self, BackupError::Key { .. })
    }
}
