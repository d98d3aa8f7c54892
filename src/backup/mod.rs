//! The backup repository: snapshots stored as verifiable, chain-aware
//! stream files in a directory or an S3 bucket (`btrsend backup`).
//!
//! The backup room sits beside send and receive and uses them as
//! libraries: [`run`](Repository::run) sends snapshots read straight from
//! their devices into stream files, [`restore`](Repository::restore)
//! receives a chain of them, [`verify`](Repository::verify) checks
//! everything, [`import`](Repository::import) adopts existing stream files.
//!
//! # Layout
//!
//! ```text
//! REPO/config                       {"format":"btrsend-repository","version":1,"id":…,"created":…}
//! REPO/catalog/NNNNNNNNNNNNNNNN.json the catalog, one file per generation (catalog)
//! REPO/streams/UUID-CTRANSID-RANDOM.btrs.zst   stream files (file)
//! REPO/lock                         flock(2) target (local directories)
//! REPO/locks/…                      lock objects (S3)
//! REPO/tmp/…                        unfinished uploads (partial stream files; S3: markers of multipart uploads)
//! ```
//!
//! * [`store`]: where objects live (a directory; an S3 bucket in `s3`,
//!   with the `s3` feature);
//! * [`mod@file`]: the stream-file format — zstd frames cut at command
//!   boundaries, BLAKE3 per frame, a trailer in a skippable frame;
//! * [`catalog`]: the list of stored streams, replaced atomically;
//! * [`lock`]: exclusive for `run`, shared for the readers;
//! * [`retention`]: which stored streams `backup forget` keeps;
//! * [`forget`]: `backup forget`, which applies it;
//! * [`partial`]: continuing the stream file an interrupted run left;
//! * [`plan`]: which stream a run stores each snapshot as;
//! * [`snapshots`] and [`holds`]: the source snapshots `run --snapshot`
//!   takes and prunes, and what other repositories still need of them.
//!
//! A stream file becomes part of the repository only when its upload is
//! complete and durable and the catalog that lists it is stored: a run
//! killed at any point leaves at most an unreferenced file (reported by
//! `verify`, removed by the next `run`) or, in a directory, a partial stream
//! file in `tmp/` that the next `run` of the same snapshot continues
//! ([`partial`]), and never a listed stream that is not whole.

pub mod catalog;
mod error;
pub mod file;
pub mod find;
pub mod forget;
mod frames;
#[doc(hidden)]
pub mod fuzz;
pub mod holds;
mod import;
pub mod lock;
pub mod partial;
pub mod plan;
mod repository;
mod restore;
pub mod retention;
mod run;
#[cfg(feature = "s3")]
pub mod s3;
pub mod snapshots;
pub mod store;
mod treehash;
mod verify;

use std::path::Path;

pub use catalog::{Catalog, Entry, Kind};
pub use error::BackupError;
pub use file::{Damage, FileWriter, ReadError, StreamFile, StreamIdentity, WriterOptions};
pub use forget::{ChainHeld, ForgetOptions, ForgetReport, Verdict};
pub use import::{ImportOptions, ImportReport};
pub use lock::{LockKind, RepoLock};
pub use plan::glob_match;
pub use repository::{Config, Repository, store_for};
pub use restore::RestoreTarget;
pub use run::{RunOptions, RunReport, SnapshotOptions};
#[cfg(feature = "s3")]
pub use s3::S3Store;
pub use store::{LocalStore, Store, StoreError};
pub use verify::{Problem, VerifyReport};

/// The repository format this code writes (the `version` in `config`).
pub const REPO_VERSION: u32 = 1;
/// The key of the repository's configuration.
pub const CONFIG_KEY: &str = "config";
/// Where stream files live.
pub const STREAMS_DIR: &str = "streams/";
/// The environment variable `--repo` falls back to.
pub const REPO_ENV: &str = "BTRSEND_REPOSITORY";

/// What a backup reports while it works (every method does nothing by
/// default). Methods take `&self`: the send's data counter is called from
/// the sender.
pub trait Progress: Sync {
    /// Something the user should know (a stale lock taken over, a leftover
    /// file removed).
    fn notice(&self, _msg: &str) {}
    /// Before the first snapshot is stored, when [`Progress::wants_total`]
    /// says so: how many snapshots the run stores and the size of all
    /// their raw streams, from exact estimates (`send --estimate`: a
    /// metadata pass over each snapshot, no file data read).
    fn plan(&self, _snapshots: usize, _stream_bytes: u64) {}
    /// Something the user must hear even from cron, where notices are not
    /// shown (a full stream nobody planned for, a hold record that cannot
    /// be read).
    fn warning(&self, _msg: &str) {}
    /// The snapshot about to be stored gets a full stream, and why.
    fn full(&self, _path: &str, _why: plan::FullReason) {}
    /// A snapshot starts being stored; `stream_total` is its raw stream's
    /// estimated size in bytes (0 when not computed).
    fn start(&self, _path: &str, _kind: Kind, _stream_total: u64) {}
    /// `bytes` more file data were sent.
    fn data(&self, _bytes: u64) {}
    /// `bytes` more of the raw stream were stored.
    fn stream(&self, _bytes: u64) {}
    /// The stream of the snapshot being stored continues the partial file
    /// an interrupted run left: `stream_bytes` of its raw stream
    /// (`stored_bytes` in the file) are kept, the rest is sent now.
    fn resumed(&self, _path: &str, _stream_bytes: u64, _stored_bytes: u64) {}
    /// A snapshot was stored.
    fn stored(&self, _entry: &Entry) {}
    /// `subvol` has not changed since its newest snapshot `snapshot`: no
    /// snapshot is taken (`--snapshot`).
    fn unchanged(&self, _subvol: &Path, _snapshot: &Path) {}
    /// A snapshot was already stored.
    fn skipped(&self, _path: &str, _entry: &Entry) {}
    /// A snapshot could not be stored (the run goes on with the others).
    fn failed(&self, _path: &str, _err: &BackupError) {}
    /// Whether to estimate every snapshot's stream first (a pass over its
    /// metadata) for [`Progress::plan`].
    fn wants_total(&self) -> bool {
        false
    }
}

/// A [`Progress`] that reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl Progress for NoProgress {}
