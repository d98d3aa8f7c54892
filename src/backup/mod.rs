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
//! The repository, apart from the operations on it:
//!
//! * `repository`: [`Repository`]: making, opening, locking, the catalog,
//!   finding an entry, removing leftovers; [`BackupError`] in `error`;
//! * [`store`]: where objects live (a directory; an S3 bucket in `s3`,
//!   with the `s3` feature, whose async code stays there);
//! * [`mod@file`]: the stream file: its [`format`](file::format) (frames,
//!   trailer, and the frame codec, where an encoding of stored bytes such
//!   as encryption plugs in), its writer and its reader; `frames` reads
//!   frames ahead on several threads;
//! * [`catalog`]: the list of stored streams ([`entry`]), replaced
//!   atomically; [`find`]: an entry by what the user typed;
//! * [`lock`]: exclusive for `run`, shared for the readers.
//!
//! One module per operation, each built on the above: `run` (and its
//! `--dry-run`), `verify` (and `--compare`; `--against-source` in
//! `against`), `repair`, `restore`, `import`, `copy`,
//! [`forget`] and [`status`]. What they decide without I/O is in
//! pure, tested modules:
//!
//! * [`plan`]: which snapshots a run stores and which stream each is
//!   stored as;
//! * [`retention`]: which stored streams `backup forget` keeps;
//! * [`snapshots`] and [`holds`]: the source snapshots `run --snapshot`
//!   takes and prunes, and what other repositories still need of them;
//! * [`partial`]: continuing the stream file an interrupted run left.
//!
//! Every operation reports through the crate's one
//! [`Progress`] and never prints.
//!
//! A stream file becomes part of the repository only when its upload is
//! complete and durable and the catalog that lists it is stored: a run
//! killed at any point leaves at most an unreferenced file (reported by
//! `verify`, removed by the next `run`) or, in a directory, a partial stream
//! file in `tmp/` that the next `run` of the same snapshot continues
//! ([`partial`]), and never a listed stream that is not whole.

mod against;
pub mod catalog;
mod copy;
pub mod crypt;
pub mod entry;
mod error;
pub mod file;
pub mod find;
pub mod forget;
mod frames;
#[doc(hidden)]
pub mod fuzz;
pub mod holds;
mod import;
pub mod index;
pub mod lock;
#[cfg(feature = "mount")]
pub mod mount;
pub mod partial;
pub mod plan;
pub mod remote;
mod repair;
mod repository;
mod restore;
pub mod retention;
mod run;
#[cfg(feature = "s3")]
pub mod s3;
pub mod snapshots;
pub mod status;
pub mod store;
pub mod synthesize;
pub mod target;
mod treehash;
mod verify;

pub use against::{Comparison, Outcome, SourceCheck, SourceOptions, SourceReport};
pub use catalog::Catalog;
pub use copy::{CopyOptions, CopyReport};
pub use entry::{Entry, Kind};
pub use error::BackupError;
pub use file::{Damage, FileWriter, ReadError, StreamFile, StreamIdentity, WriterOptions};
pub use forget::{ChainHeld, ForgetOptions, ForgetReport, Verdict};
pub use import::{ImportOptions, ImportReport};
pub use lock::{LockKind, RepoLock};
pub use plan::glob_match;
pub use repair::{NotRepaired, RepairOptions, RepairReport, Repaired};
pub use repository::{Config, Repository, store_for, store_with};
pub use restore::RestoreTarget;
pub use run::{DryRunReport, PlannedStream, RunOptions, RunReport, SnapshotOptions};
#[cfg(feature = "s3")]
pub use s3::S3Store;
pub use status::{OriginStatus, StatusReport};
pub use store::{LocalStore, Store, StoreError};
pub use verify::{CompareReport, Disagreement, EntryRef, Problem, VerifyReport, compare};

/// Progress reports from the backup room: the crate's one [`Progress`]
/// interface (its backup methods), handed on to the sends and receives a
/// backup runs.
pub use crate::progress::{NoProgress, Progress};

/// The repository format this code writes (the `version` in `config`).
pub const REPO_VERSION: u32 = 1;
/// The key of the repository's configuration.
pub const CONFIG_KEY: &str = "config";
/// Where stream files live.
pub const STREAMS_DIR: &str = "streams/";
/// The environment variable `--repo` falls back to.
pub const REPO_ENV: &str = "BTRSEND_REPOSITORY";

/// A new key for a stream file of the snapshot `uuid` `ctransid`: random
/// at its end, so that a stream stored again (a copy, a repair) never
/// takes the name of a file that may still be listed.
pub(crate) fn new_stream_key(uuid: &str, ctransid: u64) -> String {
    format!(
        "{STREAMS_DIR}{uuid}-{ctransid}-{:08x}.btrs.zst",
        store::random_u64() & 0xffff_ffff
    )
}
