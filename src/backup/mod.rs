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
pub mod file;
pub mod find;
pub mod forget;
mod frames;
#[doc(hidden)]
pub mod fuzz;
pub mod holds;
pub mod lock;
pub mod partial;
pub mod plan;
pub mod retention;
#[cfg(feature = "s3")]
pub mod s3;
pub mod snapshots;
pub mod store;
mod treehash;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use stream_format::{Command, ReaderOptions, StreamReader};
use treehash::TreeHasher;

use crate::fs::subvol::{Subvolume, list_subvolumes};
use crate::receive::{self, ReceiveError, ReceiveOptions};
use crate::send::mounted::{Request, Source};
use crate::send::{self, SendError, SendOptions};

pub use catalog::{Catalog, Entry, Kind};
pub use file::{Damage, FileWriter, ReadError, StreamFile, StreamIdentity, WriterOptions};
pub use forget::{ChainHeld, ForgetOptions, ForgetReport, Verdict};
pub use lock::{LockKind, RepoLock};
#[cfg(feature = "s3")]
pub use s3::S3Store;
pub use store::{LocalStore, Store, StoreError};

/// The repository format this code writes (the `version` in `config`).
pub const REPO_VERSION: u32 = 1;
/// The key of the repository's configuration.
pub const CONFIG_KEY: &str = "config";
/// Where stream files live.
pub const STREAMS_DIR: &str = "streams/";
/// How often a lock-free `verify` checks again when a writer replaced the
/// catalog while it was checking.
const VERIFY_TRIES: u32 = 3;
/// The environment variable `--repo` falls back to.
pub const REPO_ENV: &str = "BTRSEND_REPOSITORY";

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
    #[error(
        "{repo}: the repository is locked by {holder} (wait for it with --retry-lock DURATION)"
    )]
    LockHeld {
        /// The repository.
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
    /// Anything else the caller asked for that cannot be done.
    #[error("{0}")]
    Invalid(String),
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
}

/// The repository's `config` object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Always `btrsend-repository`.
    pub format: String,
    /// [`REPO_VERSION`].
    pub version: u32,
    /// A random id.
    pub id: String,
    /// When it was made (RFC 3339).
    pub created: String,
}

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

/// Adapts [`Progress`] to the sender's.
struct SendBridge<'a>(&'a dyn Progress);

impl send::Progress for SendBridge<'_> {
    fn data(&self, bytes: u64) {
        self.0.data(bytes);
    }
}

/// The stream being stored, counted for [`Progress::stream`].
struct Counted<'p, W> {
    inner: W,
    progress: &'p dyn Progress,
}

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.progress.stream(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// An opened repository.
#[derive(Debug, Clone)]
pub struct Repository {
    store: Arc<dyn Store>,
    config: Config,
}

/// The store a repository spec names: `s3://BUCKET[/PREFIX]` or a
/// directory.
///
/// # Errors
///
/// A malformed S3 spec, or S3 variables that do not work.
pub fn store_for(spec: &str) -> Result<Arc<dyn Store>, BackupError> {
    if spec.is_empty() {
        return Err(BackupError::Invalid(format!(
            "no repository given: use --repo REPO or set {REPO_ENV}"
        )));
    }
    if spec.starts_with("s3://") {
        #[cfg(feature = "s3")]
        return Ok(Arc::new(S3Store::new(spec)?));
        #[cfg(not(feature = "s3"))]
        return Err(BackupError::RepoMissing {
            repo: spec.to_owned(),
            what: String::from("S3 repositories are not supported by this build"),
        });
    }
    Ok(Arc::new(LocalStore::new(Path::new(spec))))
}

fn now_rfc3339() -> String {
    jiff::Timestamp::now().to_string()
}

impl Repository {
    /// Make a new, empty repository at `spec` (a missing directory is
    /// created).
    ///
    /// # Errors
    ///
    /// The directory is not empty or holds a repository already; store
    /// errors.
    pub fn init(spec: &str) -> Result<Repository, BackupError> {
        let store = store_for(spec)?;
        Self::init_in(store)
    }

    /// [`Repository::init`] in a given store.
    ///
    /// # Errors
    ///
    /// As [`Repository::init`].
    pub fn init_in(store: Arc<dyn Store>) -> Result<Repository, BackupError> {
        if let Some(root) = store.local_root() {
            // A stored stream holds every file of a snapshot: a directory
            // this makes is the owner's alone, whatever the umask (one
            // that exists keeps its mode; `verify` warns when others can
            // read it).
            if !root.exists() {
                use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(store::DIR_MODE)
                    .create(root)
                    .and_then(|()| {
                        std::fs::set_permissions(
                            root,
                            std::fs::Permissions::from_mode(store::DIR_MODE),
                        )
                    })
                    .map_err(|e| BackupError::Io {
                        what: format!("cannot create the repository directory {}", root.display()),
                        error: e,
                    })?;
            }
            let mut rd = std::fs::read_dir(root).map_err(|e| BackupError::Io {
                what: format!("cannot read {}", root.display()),
                error: e,
            })?;
            if rd.next().is_some() && !root.join(CONFIG_KEY).exists() {
                return Err(BackupError::Invalid(format!(
                    "{}: the directory is not empty and holds no repository: init needs a new or empty directory",
                    root.display()
                )));
            }
        } else {
            store.check_reachable()?;
        }
        let config = Config {
            format: String::from("btrsend-repository"),
            version: REPO_VERSION,
            id: format!("{:016x}{:016x}", store::random_u64(), store::random_u64()),
            created: now_rfc3339(),
        };
        let bytes = serde_json::to_vec_pretty(&config).unwrap_or_default();
        if !store.put_if_absent(CONFIG_KEY, &bytes)? {
            return Err(BackupError::Invalid(format!(
                "{}: a repository exists there already",
                store.name()
            )));
        }
        Catalog::empty().commit(&*store)?;
        if let Some(local) = store.local() {
            let _ = local.open_lock(lock::LOCK_FILE, true);
        }
        Ok(Repository { store, config })
    }

    /// Open the repository at `spec`.
    ///
    /// # Errors
    ///
    /// [`BackupError::RepoMissing`] when there is none (exit code 10);
    /// an unknown format version.
    pub fn open(spec: &str) -> Result<Repository, BackupError> {
        Self::open_in(store_for(spec)?)
    }

    /// [`Repository::open`] of a given store.
    ///
    /// # Errors
    ///
    /// As [`Repository::open`].
    pub fn open_in(store: Arc<dyn Store>) -> Result<Repository, BackupError> {
        store.check_reachable()?;
        let bytes = match store.get(CONFIG_KEY, None) {
            Ok(b) => b,
            Err(e) if e.is_not_found() => {
                return Err(BackupError::RepoMissing {
                    repo: store.name().to_owned(),
                    what: String::from(
                        "not a btrsend repository (no config; make one with `btrsend backup init`)",
                    ),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let config: Config = serde_json::from_slice(&bytes).map_err(|e| BackupError::Catalog {
            repo: store.name().to_owned(),
            what: format!("config: unreadable JSON: {e}"),
        })?;
        if config.format != "btrsend-repository" || config.version != REPO_VERSION {
            return Err(BackupError::Invalid(format!(
                "{}: config: format {} version {} (this btrsend reads btrsend-repository version {REPO_VERSION})",
                store.name(),
                config.format,
                config.version
            )));
        }
        Ok(Repository { store, config })
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Take the lock.
    ///
    /// # Errors
    ///
    /// [`BackupError::LockHeld`]; store errors.
    pub fn lock(
        &self,
        kind: LockKind,
        wait: Duration,
        progress: &dyn Progress,
    ) -> Result<RepoLock, BackupError> {
        lock::lock(&self.store, kind, wait, &mut |m| progress.notice(m))
    }

    /// The current catalog.
    ///
    /// # Errors
    ///
    /// [`BackupError::Catalog`]; store errors.
    pub fn catalog(&self) -> Result<Catalog, BackupError> {
        Catalog::load(&*self.store)
    }

    /// The stored entries, of the newest catalog generation. Takes no lock:
    /// a generation is replaced atomically and never changed, so a `list`
    /// never waits for a `run` (and works in a repository it cannot write).
    ///
    /// # Errors
    ///
    /// Catalog and store errors.
    pub fn list(&self) -> Result<Vec<Entry>, BackupError> {
        Ok(self.catalog()?.entries)
    }

    /// The entry `spec` names: its id, its uuid, its path, `latest`, a base
    /// name, a date/time prefix or a name prefix (see [`find`]).
    ///
    /// # Errors
    ///
    /// [`BackupError::NoSuchSnapshot`], naming the nearest candidates or,
    /// when `spec` matches in several origins, each origin's newest match.
    pub fn find<'c>(&self, cat: &'c Catalog, spec: &str) -> Result<&'c Entry, BackupError> {
        find::find(&cat.entries, spec, &jiff::tz::TimeZone::system()).map_err(|e| {
            let list = |v: &[(String, u64)]| {
                v.iter()
                    .map(|(p, id)| format!("{p} (id {id})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let what = match e {
                find::FindError::NoMatch(v) if v.is_empty() => {
                    format!("no stored snapshot matches {spec}: the repository holds none")
                }
                find::FindError::NoMatch(v) => format!(
                    "no stored snapshot matches {spec}; the nearest: {}",
                    list(&v)
                ),
                find::FindError::Ambiguous(v) => format!(
                    "{spec} matches snapshots of more than one origin; name one (the newest of each: {})",
                    list(&v)
                ),
            };
            BackupError::NoSuchSnapshot {
                repo: self.store.name().to_owned(),
                spec: spec.to_owned(),
                what,
            }
        })
    }

    /// Remove stream files no catalog entry names and unfinished uploads
    /// (left by an interrupted run), but the partial stream files of the
    /// snapshots `keep` names (uuid, ctransid): a later run continues them
    /// (see [`partial`]). Needs the exclusive lock.
    fn clean_leftovers(
        &self,
        cat: &Catalog,
        keep: &dyn Fn(&str, u64) -> bool,
        progress: &dyn Progress,
    ) -> Result<(), BackupError> {
        let named: BTreeSet<&str> = cat.entries.iter().map(|e| e.file.as_str()).collect();
        for o in self.store.list(STREAMS_DIR)? {
            if !named.contains(o.key.as_str()) {
                progress.notice(&format!(
                    "removing {}: a stream file no catalog entry names (left by an interrupted run)",
                    o.key
                ));
                self.store.delete(&o.key)?;
            }
        }
        // Unfinished uploads: temporary files, or S3 multipart uploads
        // (aborted, so no part stays behind). One that cannot be removed
        // now is tried again next time.
        let resumable = self.store.continues_uploads();
        for o in self.store.list(&format!("{}/", store::TMP_DIR))? {
            if resumable
                && partial::snapshot_of(&o.key).is_some_and(|(u, c)| keep(&u, c))
                && o.size > 0
            {
                continue;
            }
            if let Err(e) = self.store.discard_unfinished(&o.key) {
                progress.notice(&format!(
                    "cannot remove what an interrupted upload left ({}): {e}; the next run tries again",
                    o.key
                ));
            }
        }
        Ok(())
    }
}

/// What to back up and how.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunOptions {
    /// Devices or images of the filesystem; empty: the snapshots are paths
    /// in a mounted btrfs.
    pub devices: Vec<PathBuf>,
    /// Make every N-th stream of a chain a full one (0: never).
    pub full_every: u32,
    /// Make a new full stream when the chain's full one is this many days
    /// older than the snapshot (0: never; see [`plan`]).
    pub full_every_days: u32,
    /// The stream files' zstd level.
    pub level: i32,
    /// Wait this long for the lock.
    pub wait_lock: Duration,
    /// Raw bytes per frame (tests use small ones).
    pub frame_bytes: usize,
    /// Read a filesystem with missing devices from the remaining copies
    /// ([`ReadOptions::degraded`](crate::device::readahead::ReadOptions::degraded)).
    pub degraded: bool,
    /// Take (and prune) source snapshots first (`--snapshot`).
    pub snapshots: Option<SnapshotOptions>,
}

/// `backup run --snapshot SUBVOL --snapshot-dir DIR [--keep-snapshots N]`
/// (see [`snapshots`]).
#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    /// The subvolumes to snapshot (paths in a mounted btrfs).
    pub subvols: Vec<PathBuf>,
    /// Where the snapshots go (on the same filesystem).
    pub dir: PathBuf,
    /// Keep this many of the snapshots btrsend took, per subvolume, and
    /// delete older ones (`None`: delete none).
    pub keep: Option<usize>,
}

impl RunOptions {
    /// Defaults: no devices, a new full stream every
    /// [`plan::DEFAULT_FULL_EVERY_DAYS`] days (none by count), level 3, no
    /// waiting, 4 MiB frames.
    pub fn new() -> RunOptions {
        RunOptions {
            devices: Vec::new(),
            full_every: 0,
            full_every_days: plan::DEFAULT_FULL_EVERY_DAYS,
            level: 3,
            wait_lock: Duration::ZERO,
            frame_bytes: WriterOptions::new().frame_bytes,
            degraded: false,
            snapshots: None,
        }
    }

    /// Set [`RunOptions::snapshots`].
    pub fn with_snapshots(mut self, s: SnapshotOptions) -> RunOptions {
        self.snapshots = Some(s);
        self
    }

    /// Set [`RunOptions::devices`].
    pub fn with_devices(mut self, d: Vec<PathBuf>) -> RunOptions {
        self.devices = d;
        self
    }

    /// Set [`RunOptions::full_every`].
    pub fn with_full_every(mut self, n: u32) -> RunOptions {
        self.full_every = n;
        self
    }

    /// Set [`RunOptions::full_every_days`].
    pub fn with_full_every_days(mut self, days: u32) -> RunOptions {
        self.full_every_days = days;
        self
    }

    fn full_policy(&self) -> plan::FullPolicy {
        plan::FullPolicy {
            every: self.full_every,
            every_days: self.full_every_days,
        }
    }

    /// Set [`RunOptions::level`].
    pub fn with_level(mut self, l: i32) -> RunOptions {
        self.level = l;
        self
    }

    /// Set [`RunOptions::wait_lock`].
    pub fn with_wait_lock(mut self, d: Duration) -> RunOptions {
        self.wait_lock = d;
        self
    }

    /// Set [`RunOptions::frame_bytes`].
    pub fn with_frame_bytes(mut self, n: usize) -> RunOptions {
        self.frame_bytes = n;
        self
    }

    /// Set [`RunOptions::degraded`].
    pub fn with_degraded(mut self, on: bool) -> RunOptions {
        self.degraded = on;
        self
    }

    fn read_options(&self) -> crate::device::readahead::ReadOptions {
        crate::device::readahead::ReadOptions::default().with_degraded(self.degraded)
    }
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions::new()
    }
}

/// What a run did.
#[derive(Debug, Default)]
pub struct RunReport {
    /// Entries stored.
    pub stored: Vec<Entry>,
    /// Why each full stream stored is full, by entry id.
    pub full_reasons: BTreeMap<u64, plan::FullReason>,
    /// Snapshots already stored (path, entry id).
    pub skipped: Vec<(String, u64)>,
    /// Snapshots that failed.
    pub failed: Vec<(String, BackupError)>,
    /// Source snapshots taken (`--snapshot`).
    pub taken: Vec<PathBuf>,
    /// Subvolumes not snapshotted because they have not changed since
    /// their newest snapshot (the subvolume, that snapshot).
    pub unchanged: Vec<(PathBuf, PathBuf)>,
    /// Source snapshots deleted (`--keep-snapshots`).
    pub pruned: Vec<PathBuf>,
    /// Source snapshots that could not be taken or deleted (the subvolume
    /// or snapshot, why).
    pub snapshot_failed: Vec<(PathBuf, BackupError)>,
}

/// Take a read-only snapshot of each subvolume (`--snapshot`), then find
/// the snapshots of each in the snapshot directory. A snapshot that cannot
/// be taken is a failure of its own; the others proceed.
fn take_snapshots(
    so: &SnapshotOptions,
    report: &mut RunReport,
    progress: &dyn Progress,
) -> Result<Vec<Found>, BackupError> {
    let now = jiff::Timestamp::now();
    for subvol in &so.subvols {
        match snapshots::newest_taken(subvol, &so.dir) {
            Ok(Some(name)) => {
                let snap = so.dir.join(name);
                progress.unchanged(subvol, &snap);
                report.unchanged.push((subvol.clone(), snap));
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                progress.failed(&subvol.display().to_string(), &e);
                report.snapshot_failed.push((subvol.clone(), e));
                continue;
            }
        }
        match snapshots::take(subvol, &so.dir, now) {
            Ok(path) => {
                progress.notice(&format!("took the snapshot {}", path.display()));
                report.taken.push(path);
            }
            Err(e) => {
                progress.failed(&subvol.display().to_string(), &e);
                report.snapshot_failed.push((subvol.clone(), e));
            }
        }
    }
    // The directory once, with every new snapshot in it.
    let paths: Vec<String> = snapshots::subvolumes_in(&so.dir)?
        .into_iter()
        .map(|n| so.dir.join(n).display().to_string())
        .collect();
    Ok(so
        .subvols
        .iter()
        .map(|subvol| Found {
            paths: paths.clone(),
            origin: subvol.clone(),
            snaps: Vec::new(),
        })
        .collect())
}

/// Record, for the other repositories storing from the snapshot
/// directory, the snapshots this one's next incremental streams need: per
/// subvolume, the newest of its snapshots in the directory that is stored
/// (see [`holds`]); the record's time is renewed in any case. A record that cannot be written is a warning: the run
/// stored what it should, but another repository's pruning may now delete
/// this one's next parent.
fn write_holds(
    repo: &Repository,
    so: &SnapshotOptions,
    found: &[Found],
    cat: &Catalog,
    progress: &dyn Progress,
) {
    let mut subvols = BTreeSet::new();
    let mut held = Vec::new();
    for f in found {
        let base = snapshots::base_name(&f.origin);
        let newest = f
            .snaps
            .iter()
            .filter(|(_, s)| cat.find(&stream_uuid(s), s.root.ctransid.get()).is_some())
            .max_by_key(|(name, s)| (s.root.otransid.get(), name.clone()));
        // Without one (nothing stored yet, or the source could not be
        // read this time) the record keeps what it held for the subvolume.
        if let Some((name, _)) = newest {
            held.push(holds::Held {
                subvolume: base.clone(),
                snapshot: name.clone(),
            });
            subvols.insert(base);
        }
    }
    if let Err(e) = holds::write(&so.dir, &repo.config.id, repo.store.name(), &subvols, &held) {
        progress.warning(&format!(
            "{e}: another repository's --keep-snapshots may delete the snapshot this one's next incremental stream needs"
        ));
    }
}

/// Delete the source snapshots btrsend took beyond the newest `keep`
/// (see [`snapshots::prune_plan`]), but none a hold record names.
fn prune_snapshots(
    so: &SnapshotOptions,
    keep: usize,
    found: &[Found],
    cat: &Catalog,
    report: &mut RunReport,
    progress: &dyn Progress,
) {
    let records = match holds::read_all(&so.dir) {
        Ok((records, warnings)) => {
            for w in warnings {
                progress.warning(&w);
            }
            records
        }
        Err(e) => {
            // Without the records nothing is known to be free: prune
            // nothing this time.
            progress.failed(&so.dir.display().to_string(), &e);
            report.snapshot_failed.push((so.dir.clone(), e));
            return;
        }
    };
    let held = holds::held_names(&records);
    let now = jiff::Timestamp::now();
    for f in found {
        let base = snapshots::base_name(&f.origin);
        let cands: Vec<snapshots::Candidate> = f
            .snaps
            .iter()
            .map(|(name, s)| snapshots::Candidate {
                taken: snapshots::parse_snapshot_seq(&base, name),
                name: name.clone(),
                otransid: s.root.otransid.get(),
                stored: cat.find(&stream_uuid(s), s.root.ctransid.get()).is_some(),
                held: held.contains(name),
            })
            .collect();
        for (c, v) in cands.iter().zip(snapshots::prune_plan(&cands, keep)) {
            if v == snapshots::PruneVerdict::KeepHeld {
                // A record nobody updates holds its snapshot forever.
                for r in &records {
                    let days = r.record.age_days(now);
                    if days >= holds::STALE_DAYS
                        && r.record.snapshots.iter().any(|h| h.snapshot == c.name)
                    {
                        progress.warning(&format!(
                            "{} is kept for repository {} ({}), whose hold record {} was last updated {days} days ago: delete that file if the repository no longer stores from here",
                            so.dir.join(&c.name).display(),
                            r.record.repo,
                            r.file,
                            so.dir.join(holds::HOLDS_DIR).join(&r.file).display(),
                        ));
                    }
                }
            }
            if v != snapshots::PruneVerdict::Delete {
                continue;
            }
            let path = so.dir.join(&c.name);
            match snapshots::destroy(&so.dir, &c.name) {
                Ok(()) => {
                    progress.notice(&format!("deleted the snapshot {}", path.display()));
                    report.pruned.push(path);
                }
                Err(e) => {
                    progress.failed(&path.display().to_string(), &e);
                    report.snapshot_failed.push((path, e));
                }
            }
        }
    }
}

/// A selected snapshot and the filesystem it lives in.
struct Selected {
    fs: usize,
    subvol: Subvolume,
    /// Its path as entries record it.
    path: String,
}

/// The UUID a stream carries for a subvolume: its received UUID if set,
/// else its UUID.
fn stream_uuid(s: &Subvolume) -> String {
    let u = if s.root.received_uuid.is_nil() {
        s.root.uuid
    } else {
        s.root.received_uuid
    };
    uuid::Uuid::from_bytes(u.0).hyphenated().to_string()
}

/// The origin of a snapshot: the subvolume it was taken of, else itself.
fn origin_of(s: &Subvolume) -> String {
    let u = if s.root.parent_uuid.is_nil() {
        s.root.uuid
    } else {
        s.root.parent_uuid
    };
    uuid::Uuid::from_bytes(u.0).hyphenated().to_string()
}

/// The creation time of a snapshot.
fn otime_ts(s: &Subvolume) -> jiff::Timestamp {
    let (sec, nsec) = (s.root.otime.sec, s.root.otime.nsec);
    jiff::Timestamp::new(sec, i32::try_from(nsec).unwrap_or(0))
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

/// The creation time of a snapshot, RFC 3339.
fn otime_of(s: &Subvolume) -> String {
    otime_ts(s).to_string()
}

/// The time of the full stream of entry `id`'s chain (`None`: a broken
/// chain or an unreadable time).
fn full_time_of(cat: &Catalog, id: u64) -> Option<jiff::Timestamp> {
    cat.chain(id).ok()?.first()?.timestamp()
}

/// What [`Repository::pick_parent`] found.
struct Pick<'c> {
    /// The parent entry and its snapshot on the source.
    parent: Option<(&'c Entry, Subvolume)>,
    /// Why the stream is full, when it is.
    full: Option<plan::FullReason>,
    /// For a full stream: the newest stored entry of the origin not newer
    /// than the snapshot (which [`plan::FullReason::ParentGone`] names).
    newest: Option<&'c Entry>,
}

/// Shell-style match of `pat` against `text`: `*` and `?` do not match
/// `/`; `[abc]`, `[a-z]` and `[!a]` are classes; `\` quotes.
pub fn glob_match(pat: &str, text: &str) -> bool {
    fn class(p: &[char], c: char) -> Option<(bool, usize)> {
        // Returns (matched, chars consumed incl. brackets).
        let mut i = 1;
        let neg = matches!(p.get(i), Some('!' | '^'));
        if neg {
            i += 1;
        }
        let mut hit = false;
        let start = i;
        while let Some(&ch) = p.get(i) {
            if ch == ']' && i > start {
                return Some((hit != neg, i + 1));
            }
            if p.get(i + 1) == Some(&'-') && p.get(i + 2).is_some_and(|&e| e != ']') {
                let hi = p[i + 2];
                if ch <= c && c <= hi {
                    hit = true;
                }
                i += 3;
            } else {
                if ch == c {
                    hit = true;
                }
                i += 1;
            }
        }
        None
    }
    fn go(p: &[char], t: &[char]) -> bool {
        match p.first() {
            None => t.is_empty(),
            Some('*') => (0..=t.len())
                .take_while(|&k| k == 0 || t[k - 1] != '/')
                .any(|k| go(&p[1..], &t[k..])),
            Some('?') => t.first().is_some_and(|&c| c != '/') && go(&p[1..], &t[1..]),
            Some('[') => match (t.first(), class(p, t.first().copied().unwrap_or('\0'))) {
                (Some(&c), Some((true, n))) if c != '/' => go(&p[n..], &t[1..]),
                (_, Some(_)) => false,
                (Some(&c), None) => c == '[' && go(&p[1..], &t[1..]),
                (None, None) => false,
            },
            Some('\\') if p.len() > 1 => t.first() == Some(&p[1]) && go(&p[2..], &t[1..]),
            Some(&c) => t.first() == Some(&c) && go(&p[1..], &t[1..]),
        }
    }
    let p: Vec<char> = pat.chars().collect();
    let t: Vec<char> = text.chars().collect();
    go(&p, &t)
}

fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// The filesystems and snapshots a run reads.
struct Sources {
    /// The filesystems, each with the policy for a mounted one
    /// ([`send::mounted`]).
    fss: Vec<Source>,
    /// Per filesystem: its subvolumes.
    subvols: Vec<Vec<Subvolume>>,
    selected: Vec<Selected>,
    /// Snapshots that cannot be backed up (path, why); the others go on.
    rejected: Vec<(String, BackupError)>,
    /// How the devices are read ([`RunOptions::degraded`]).
    read: crate::device::readahead::ReadOptions,
}

fn fs_error(what: String) -> impl FnOnce(crate::Error) -> BackupError {
    move |source| BackupError::Fs {
        what,
        error: Box::new(source),
    }
}

fn source_error(what: String) -> impl FnOnce(SendError) -> BackupError {
    move |error| BackupError::Send {
        snapshot: what,
        error: Box::new(error),
    }
}

/// Snapshots of one subvolume found in a snapshot directory (`run
/// --snapshot`): stored when newer than the newest of them stored.
struct Found {
    /// The subvolume roots in the snapshot directory (`DIR/NAME`).
    paths: Vec<String>,
    /// The subvolume they are snapshots of.
    origin: PathBuf,
    /// Those of `paths` that are snapshots of `origin` (by name in DIR),
    /// as [`select_found`] found them; pruning decides among them.
    snaps: Vec<(String, Subvolume)>,
}

impl Sources {
    fn push(&mut self, fs: usize, s: &Subvolume, path: String) {
        if self
            .selected
            .iter()
            .any(|x| x.fs == fs && x.subvol.id() == s.id())
        {
            return;
        }
        self.selected.push(Selected {
            fs,
            subvol: s.clone(),
            path,
        });
    }

    /// The filesystem mounted where `path` lies (opened once per
    /// filesystem), and `path`'s top-level path in it.
    fn mounted(
        &mut self,
        path: &str,
        by_devices: &mut BTreeMap<Vec<PathBuf>, usize>,
    ) -> Result<(usize, String), BackupError> {
        let m = crate::mount::resolve(Path::new(path))
            .map_err(|e| BackupError::Invalid(format!("{path}: {e}")))?;
        if let Some(&i) = by_devices.get(&m.devices) {
            return Ok((i, m.subvol_path));
        }
        let source = Source::open_path_with(Path::new(path), &self.read)
            .map_err(source_error(path.to_owned()))?;
        let subs = list_subvolumes(source.fs()).map_err(fs_error(format!(
            "cannot list the subvolumes of {}",
            m.mount_point.display()
        )))?;
        self.fss.push(source);
        self.subvols.push(subs);
        by_devices.insert(m.devices.clone(), self.fss.len() - 1);
        Ok((self.fss.len() - 1, m.subvol_path))
    }
}

fn select(
    opts: &RunOptions,
    specs: &[String],
    found: &mut [Found],
    cat: &Catalog,
) -> Result<Sources, BackupError> {
    let mut src = Sources {
        fss: Vec::new(),
        subvols: Vec::new(),
        selected: Vec::new(),
        rejected: Vec::new(),
        read: opts.read_options(),
    };
    if specs.is_empty() && found.is_empty() && opts.snapshots.is_none() {
        return Err(BackupError::Invalid(String::from("no snapshot given")));
    }
    if !opts.devices.is_empty() {
        let list = opts
            .devices
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let source = Source::open_devices_with(&opts.devices, &src.read)
            .map_err(source_error(list.clone()))?;
        let subs = list_subvolumes(source.fs())
            .map_err(fs_error(format!("cannot list the subvolumes on {list}")))?;
        let mut chosen = Vec::new();
        for spec in specs {
            let matched: Vec<&Subvolume> = if let Some(id) = spec.strip_prefix("id:") {
                let id: u64 = id
                    .parse()
                    .map_err(|_| BackupError::Invalid(format!("bad snapshot id {spec}")))?;
                subs.iter().filter(|s| s.id().get() == id).collect()
            } else if has_glob(spec) {
                let pat = spec.trim_matches('/');
                subs.iter()
                    .filter(|s| glob_match(pat, &String::from_utf8_lossy(&s.path)))
                    .collect()
            } else {
                let want = spec.trim_matches('/').as_bytes();
                subs.iter().filter(|s| s.path == want).collect()
            };
            if matched.is_empty() {
                return Err(BackupError::Invalid(format!(
                    "no subvolume on {list} matches {spec}"
                )));
            }
            chosen.extend(matched.into_iter().cloned());
        }
        for s in chosen {
            let path = String::from_utf8_lossy(&s.path).into_owned();
            // On a filesystem mounted read-write only read-only snapshots
            // may be sent (the source's policy).
            match source.subvolume(&format!("id:{}", s.id().get())) {
                Ok(_) => src.push(0, &s, path),
                Err(e) => src.rejected.push((path.clone(), source_error(path)(e))),
            }
        }
        src.fss.push(source);
        src.subvols.push(subs);
        return Ok(src);
    }
    // Paths of read-only snapshots in mounted filesystems.
    let mut by_devices: BTreeMap<Vec<PathBuf>, usize> = BTreeMap::new();
    for spec in specs {
        if spec.starts_with("id:") || has_glob(spec) {
            return Err(BackupError::Invalid(format!(
                "{spec} needs --device: without it each SNAPSHOT is the path of a read-only snapshot in a mounted btrfs"
            )));
        }
        let (fs, subvol_path) = src.mounted(spec, &mut by_devices)?;
        if subvol_path.is_empty() {
            return Err(BackupError::Invalid(format!(
                "{spec} is the top level of its filesystem, not a read-only snapshot"
            )));
        }
        let s = src.fss[fs]
            .subvolume(spec)
            .map_err(source_error(spec.clone()))?;
        src.push(fs, &s, subvol_path);
    }
    // Snapshots found in a snapshot directory: those of the origin, read-
    // only, newer than the newest of them stored.
    for f in found.iter_mut() {
        // A subvolume that cannot be read is its own failure: the others
        // proceed.
        if let Err(e) = select_found(&mut src, f, cat, &mut by_devices) {
            src.rejected.push((f.origin.display().to_string(), e));
        }
    }
    Ok(src)
}

/// The snapshots of `f.origin` among `f.paths` that are newer than the
/// newest of them stored (see [`snapshots`]).
fn select_found(
    src: &mut Sources,
    f: &mut Found,
    cat: &Catalog,
    by_devices: &mut BTreeMap<Vec<PathBuf>, usize>,
) -> Result<(), BackupError> {
    let origin = f.origin.display().to_string();
    let (fs, origin_path) = src.mounted(&origin, by_devices)?;
    let Some(origin_uuid) = src.subvols[fs]
        .iter()
        .find(|s| s.path == origin_path.as_bytes())
        .map(|o| o.root.uuid)
    else {
        return Err(BackupError::Invalid(format!(
            "{origin}: subvolume {origin_path} not found on the devices"
        )));
    };
    let mut snaps = Vec::new();
    for p in &f.paths {
        let (pfs, top) = src.mounted(p, by_devices)?;
        if pfs != fs {
            continue;
        }
        let subs = &src.subvols[fs];
        if let Some(s) = subs
            .iter()
            .find(|s| s.path == top.as_bytes() && s.root.parent_uuid == origin_uuid)
        {
            let name = Path::new(p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            f.snaps.push((name, s.clone()));
            if s.root.is_readonly() {
                snaps.push((top, s.clone()));
            }
        }
    }
    // By creation (otransid): a snapshot taken when nothing changed
    // has the ctransid of the one before, and is new all the same.
    let newest_stored = snaps
        .iter()
        .filter(|(_, s)| cat.find(&stream_uuid(s), s.root.ctransid.get()).is_some())
        .map(|(_, s)| s.root.otransid.get())
        .max();
    for (top, s) in snaps {
        if newest_stored.is_none_or(|n| s.root.otransid.get() > n) {
            src.push(fs, &s, top);
        }
    }
    Ok(())
}

impl Repository {
    /// Store every selected snapshot not yet stored, oldest first:
    /// incremental from the newest stored snapshot of the same origin
    /// whose chain is intact and which is still on the source, else full
    /// (see [`RunOptions::full_every`]). One snapshot's failure does not
    /// stop the others. With [`RunOptions::snapshots`], first take a
    /// read-only snapshot of each subvolume, and afterwards prune the old
    /// ones (see [`snapshots`]).
    ///
    /// # Errors
    ///
    /// Errors before any snapshot is tried (the source, the lock, the
    /// catalog); per-snapshot failures are in [`RunReport::failed`] and
    /// [`RunReport::snapshot_failed`].
    pub fn run(
        &self,
        specs: &[String],
        opts: &RunOptions,
        progress: &dyn Progress,
    ) -> Result<RunReport, BackupError> {
        let _lock = self.lock(LockKind::Exclusive, opts.wait_lock, progress)?;
        let mut cat = self.catalog()?;
        let mut report = RunReport::default();
        let mut found = match &opts.snapshots {
            Some(so) => take_snapshots(so, &mut report, progress)?,
            None => Vec::new(),
        };
        let mut src = select(opts, specs, &mut found, &cat)?;
        // The partial stream files of the snapshots this run stores stay,
        // to be continued.
        let todo: BTreeSet<(String, u64)> = src
            .selected
            .iter()
            .map(|s| (stream_uuid(&s.subvol), s.subvol.root.ctransid.get()))
            .filter(|(u, c)| cat.find(u, *c).is_none())
            .collect();
        self.clean_leftovers(&cat, &|u, c| todo.contains(&(u.to_owned(), c)), progress)?;
        for (path, err) in std::mem::take(&mut src.rejected) {
            progress.failed(&path, &err);
            report.failed.push((path, err));
        }
        src.selected.sort_by_key(|s| {
            (
                s.subvol.root.otransid.get(),
                s.subvol.root.ctransid.get(),
                s.subvol.id().get(),
            )
        });
        let selected = std::mem::take(&mut src.selected);
        let estimates = if progress.wants_total() {
            self.estimate(&cat, &src, &selected, opts)?
        } else {
            vec![None; selected.len()]
        };
        if progress.wants_total() {
            let todo = estimates.iter().flatten().count();
            progress.plan(todo, estimates.iter().flatten().sum());
        }
        for (sel, estimate) in selected.iter().zip(&estimates) {
            let uuid = stream_uuid(&sel.subvol);
            let ctransid = sel.subvol.root.ctransid.get();
            if let Some(e) = cat.find(&uuid, ctransid) {
                progress.skipped(&sel.path, e);
                report.skipped.push((sel.path.clone(), e.id));
                continue;
            }
            match self.store_one(
                &mut cat,
                &mut src,
                sel,
                opts,
                estimate.unwrap_or(0),
                progress,
            ) {
                Ok((e, why)) => {
                    progress.stored(&e);
                    if let Some(why) = why {
                        report.full_reasons.insert(e.id, why);
                    }
                    report.stored.push(e);
                }
                Err(err) => {
                    progress.failed(&sel.path, &err);
                    let fatal = err.is_lock_held() || matches!(err, BackupError::Catalog { .. });
                    report.failed.push((sel.path.clone(), err));
                    if fatal {
                        return Ok(report);
                    }
                }
            }
        }
        if let Some(so) = &opts.snapshots {
            write_holds(self, so, &found, &cat, progress);
            if let Some(keep) = so.keep {
                prune_snapshots(so, keep, &found, &cat, &mut report, progress);
            }
        }
        Ok(report)
    }

    /// The exact size of the stream each of `selected` will be stored as
    /// (`None`: stored already), for the progress of the whole run. A
    /// snapshot's parent is the one [`Repository::pick_parent`] picks now,
    /// or the previous snapshot of its origin stored by this run, and the
    /// same rules ([`plan::full_due`]) make it full.
    fn estimate(
        &self,
        cat: &Catalog,
        src: &Sources,
        selected: &[Selected],
        opts: &RunOptions,
    ) -> Result<Vec<Option<u64>>, BackupError> {
        let present = self.stream_sizes()?;
        // Per origin: the last snapshot planned in this run, the depth of
        // its chain and the time of the chain's full stream.
        let mut planned: BTreeMap<String, (usize, usize, Option<jiff::Timestamp>)> =
            BTreeMap::new();
        let mut out = Vec::with_capacity(selected.len());
        for (i, sel) in selected.iter().enumerate() {
            if cat
                .find(&stream_uuid(&sel.subvol), sel.subvol.root.ctransid.get())
                .is_some()
            {
                out.push(None);
                continue;
            }
            let origin = origin_of(&sel.subvol);
            let time = otime_ts(&sel.subvol);
            let (parent, depth, full_time) = match planned.get(&origin) {
                Some(&(j, depth, full_time)) => {
                    match plan::full_due(depth, full_time, time, opts.full_policy()) {
                        Some(_) => (None, 0, None),
                        None => (selected.get(j).map(|p| p.subvol.clone()), depth, full_time),
                    }
                }
                None => {
                    let pick = self.pick_parent(cat, src, sel, opts, &present);
                    match pick.parent {
                        Some((e, p)) => (
                            Some(p),
                            cat.depth(e.id).unwrap_or(usize::MAX),
                            full_time_of(cat, e.id),
                        ),
                        None => (None, 0, None),
                    }
                }
            };
            let (depth, full_time) = if parent.is_some() {
                (depth.saturating_add(1), full_time)
            } else {
                (1, Some(time))
            };
            let subvol = format!("id:{}", sel.subvol.id().get());
            let parent_spec = parent.as_ref().map(|p| format!("id:{}", p.id().get()));
            let req = Request {
                subvol: &subvol,
                parent: parent_spec.as_deref(),
                clone_sources: &[],
            };
            let bytes = src
                .fss
                .get(sel.fs)
                .and_then(|s| s.estimate(&req, SendOptions::new(1)).ok())
                .map_or(0, |st| st.stream_bytes);
            out.push(Some(bytes));
            planned.insert(origin, (i, depth, full_time));
        }
        Ok(out)
    }

    /// The parent for `sel` if it gets an incremental stream, else why it
    /// is full ([`plan::choose`] over the stored entries of its origin).
    fn pick_parent<'c>(
        &self,
        cat: &'c Catalog,
        src: &Sources,
        sel: &Selected,
        opts: &RunOptions,
        present: &BTreeMap<String, u64>,
    ) -> Pick<'c> {
        let origin = origin_of(&sel.subvol);
        let ctransid = sel.subvol.root.ctransid.get();
        let mut cands = Vec::new();
        let mut on_source: BTreeMap<u64, &Subvolume> = BTreeMap::new();
        for e in &cat.entries {
            if e.origin != origin || e.ctransid > ctransid {
                continue;
            }
            let found = src.subvols[sel.fs]
                .iter()
                .find(|s| stream_uuid(s) == e.uuid && s.root.ctransid.get() == e.ctransid);
            if found.is_some_and(|s| s.id() == sel.subvol.id()) {
                continue;
            }
            let chain = cat.chain(e.id);
            cands.push(plan::ParentCandidate {
                id: e.id,
                ctransid: e.ctransid,
                on_source: found.is_some(),
                chain_intact: chain.as_ref().is_ok_and(|ch| {
                    ch.iter()
                        .all(|c| present.get(&c.file) == Some(&c.stored_bytes))
                }),
                depth: chain.as_ref().map_or(usize::MAX, Vec::len),
                full_time: full_time_of(cat, e.id),
            });
            if let Some(s) = found {
                on_source.insert(e.id, s);
            }
        }
        match plan::choose(&cands, otime_ts(&sel.subvol), opts.full_policy()) {
            plan::Choice::Incremental(id) => Pick {
                parent: cat.get(id).zip(on_source.get(&id).map(|s| (*s).clone())),
                full: None,
                newest: None,
            },
            plan::Choice::Full(why) => Pick {
                parent: None,
                full: Some(why),
                newest: cands
                    .iter()
                    .max_by_key(|c| (c.ctransid, c.id))
                    .and_then(|c| cat.get(c.id)),
            },
        }
    }

    fn store_one(
        &self,
        cat: &mut Catalog,
        src: &mut Sources,
        sel: &Selected,
        opts: &RunOptions,
        estimate: u64,
        progress: &dyn Progress,
    ) -> Result<(Entry, Option<plan::FullReason>), BackupError> {
        let present = self.stream_sizes()?;
        let pick = self.pick_parent(cat, src, sel, opts, &present);
        if let Some(why) = pick.full {
            progress.full(&sel.path, why);
            if why == plan::FullReason::ParentGone
                && let Some(newest) = pick.newest
            {
                progress.warning(&format!(
                    "storing {} as a full stream: the snapshot its incremental stream needs, {} (entry {}, the newest stored of its origin), is gone from the source; keep it there until the next run (see --keep-snapshots and its holds)",
                    sel.path, newest.path, newest.id
                ));
            }
        }
        let full_reason = pick.full;
        let parent = pick.parent;
        let source = &mut src.fss[sel.fs];
        let uuid = stream_uuid(&sel.subvol);
        let ctransid = sel.subvol.root.ctransid.get();
        let kind = if parent.is_some() {
            Kind::Incremental
        } else {
            Kind::Full
        };
        let send_err = |source| BackupError::Send {
            snapshot: sel.path.clone(),
            error: Box::new(source),
        };
        progress.start(&sel.path, kind, estimate);
        let key = format!(
            "{STREAMS_DIR}{uuid}-{ctransid}-{:08x}.btrs.zst",
            store::random_u64() & 0xffff_ffff
        );
        let wopts = WriterOptions::new()
            .with_level(opts.level)
            .with_frame_bytes(opts.frame_bytes);
        let sopts = SendOptions::new(1);
        let bridge = SendBridge(progress);
        // By id: unambiguous on devices and in a mount alike.
        let subvol = format!("id:{}", sel.subvol.id().get());
        let parent_spec = parent.as_ref().map(|(_, p)| format!("id:{}", p.id().get()));
        let req = Request {
            subvol: &subvol,
            parent: parent_spec.as_deref(),
            clone_sources: &[],
        };
        let parent_id = parent.as_ref().map(|(e, _)| (e.uuid.clone(), e.ctransid));
        let mut partial = self.find_partial(&uuid, ctransid, parent_id.as_ref(), progress);
        // The key the stream file gets (a continued S3 upload keeps its own).
        let mut file = key.clone();
        let writer = loop {
            let Some((tmp, scan)) = partial.take() else {
                file.clone_from(&key);
                let mut upload = self.store.multipart(&key)?;
                upload.keep_when_dropped();
                let counted = Counted {
                    inner: FileWriter::new(upload, wopts),
                    progress,
                };
                let (counted, _stats) = source
                    .send(&req, counted, sopts, &bridge)
                    .map_err(send_err)?;
                break counted.inner;
            };
            file = scan.file.clone().unwrap_or_else(|| key.clone());
            let mut upload = match self
                .store
                .continue_upload(&tmp, scan.kept.stored_bytes, &file)
            {
                Ok(Some(u)) => u,
                Ok(None) => {
                    self.discard_partial(&tmp, "this store cannot continue it", progress);
                    continue;
                }
                Err(e) => {
                    // (An S3 upload the server no longer has.)
                    self.discard_partial(&tmp, &e.to_string(), progress);
                    continue;
                }
            };
            upload.keep_when_dropped();
            let counted = Counted {
                inner: FileWriter::continued(upload, wopts, scan.kept.clone()),
                progress,
            };
            // The partial file may not be this host's (a repository that
            // others can write): the send makes the whole stream again, and
            // its first bytes must hash to what the kept frames hold before
            // anything is appended. The kept part is reported once the send
            // is past it (a send that refuses it starts over, counting from
            // zero).
            let differs = std::cell::Cell::new(false);
            let out = VerifyHead {
                inner: counted,
                left: scan.kept.raw_bytes,
                hasher: TreeHasher::new(),
                expected: scan.kept.hasher.finalize(),
                differs: &differs,
                resumed: Some(Resumed {
                    path: &sel.path,
                    stream_bytes: scan.kept.raw_bytes,
                    stored_bytes: scan.kept.stored_bytes,
                }),
                progress,
            };
            match source.send(&req, out, sopts, &bridge) {
                Ok((out, _stats)) => break out.inner.inner,
                Err(_) if differs.get() => {
                    // Another stream than the partial file's: start over.
                    self.discard_partial(&tmp, "its bytes are not what this send makes", progress);
                }
                Err(e) => return Err(send_err(e)),
            }
        };
        let id = StreamIdentity {
            uuid: uuid.clone(),
            ctransid,
            parent: parent_id.clone(),
        };
        let (trailer, size) = writer.finish(id)?;
        let entry = Entry {
            id: 0,
            path: sel.path.clone(),
            uuid,
            ctransid,
            parent_uuid: parent.as_ref().map(|(e, _)| e.uuid.clone()),
            parent_ctransid: parent.as_ref().map(|(e, _)| e.ctransid),
            parent_id: parent.as_ref().map(|(e, _)| e.id),
            kind,
            time: otime_of(&sel.subvol),
            origin: origin_of(&sel.subvol),
            file,
            stream_bytes: trailer.stream_bytes,
            stored_bytes: size,
            stream_blake3: trailer.stream_blake3,
            commands: trailer.commands,
            proto: trailer.proto,
            stored_at: now_rfc3339(),
        };
        let mut next = cat.clone();
        let id = next.add(entry);
        next.commit(&*self.store)?;
        *cat = next;
        cat.get(id)
            .cloned()
            .map(|e| (e, full_reason))
            .ok_or_else(|| BackupError::Invalid(String::from("entry vanished")))
    }
}

/// A writer that takes the first `left` bytes written to it (the part of
/// the stream a partial file holds) without passing them on, hashing them:
/// when they do not hash to `expected`, the write fails and `differs` says
/// so. Past them it reports the continuation, then passes everything on.
struct VerifyHead<'p, W> {
    inner: W,
    left: u64,
    hasher: TreeHasher,
    expected: blake3::Hash,
    differs: &'p std::cell::Cell<bool>,
    resumed: Option<Resumed<'p>>,
    progress: &'p dyn Progress,
}

/// What [`Progress::resumed`] says.
struct Resumed<'p> {
    path: &'p str,
    stream_bytes: u64,
    stored_bytes: u64,
}

impl<W: Write> Write for VerifyHead<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // OK to convert: at most buf.len().
        let skip = usize::try_from(self.left.min(buf.len() as u64)).unwrap_or(buf.len());
        self.hasher.update(&buf[..skip]);
        self.left -= skip as u64;
        if self.left > 0 {
            return Ok(skip);
        }
        if let Some(r) = self.resumed.take() {
            if self.hasher.finalize() != self.expected {
                self.differs.set(true);
                return Err(io::Error::other(
                    "the partial stream file differs from the stream this send makes",
                ));
            }
            self.progress
                .resumed(r.path, r.stream_bytes, r.stored_bytes);
            self.progress.stream(r.stream_bytes);
        }
        if skip == buf.len() {
            return Ok(skip);
        }
        Ok(skip + self.inner.write(&buf[skip..])?)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl Repository {
    /// The partial stream file an interrupted run left for this snapshot
    /// (stream `uuid`, `ctransid`, incremental from `parent`), scanned
    /// (see [`partial`]); the others of the same snapshot, and one that
    /// does not match, are removed with a notice.
    fn find_partial(
        &self,
        uuid: &str,
        ctransid: u64,
        parent: Option<&(String, u64)>,
        progress: &dyn Progress,
    ) -> Option<(String, partial::Scan)> {
        if !self.store.continues_uploads() {
            return None;
        }
        let tmp = self.store.list(&format!("{}/", store::TMP_DIR)).ok()?;
        let mut best: Option<(String, partial::Scan)> = None;
        for o in tmp {
            if partial::snapshot_of(&o.key).is_none_or(|(u, c)| u != uuid || c != ctransid) {
                continue;
            }
            let scan = match self.scan_partial(&o.key, o.size) {
                Ok(s) => s,
                Err(why) => {
                    self.discard_partial(&o.key, &why, progress);
                    continue;
                }
            };
            if scan.uuid != uuid || scan.ctransid != ctransid {
                let why = format!(
                    "it holds the stream of snapshot {} ctransid {}",
                    scan.uuid, scan.ctransid
                );
                self.discard_partial(&o.key, &why, progress);
                continue;
            }
            if scan.parent.as_ref() != parent {
                let was = scan.parent.as_ref().map_or_else(
                    || String::from("a full stream"),
                    |(u, c)| format!("incremental from {u} ctransid {c}"),
                );
                let now = parent.map_or_else(
                    || String::from("a full stream"),
                    |(u, c)| format!("incremental from {u} ctransid {c}"),
                );
                let why = format!("it holds {was}, this run stores {now}");
                self.discard_partial(&o.key, &why, progress);
                continue;
            }
            if let Some(cut) = &scan.cut {
                progress.notice(&format!(
                    "{}: keeping its first {} frames ({} bytes of stream): {cut}",
                    o.key,
                    scan.kept.frames.len(),
                    scan.kept.raw_bytes
                ));
            }
            // Two partial files of one snapshot (two runs killed): the
            // longer is continued.
            let longer = best
                .as_ref()
                .is_none_or(|(_, b)| scan.kept.raw_bytes > b.kept.raw_bytes);
            if longer {
                if let Some((k, _)) = best.replace((o.key.clone(), scan)) {
                    self.discard_partial(&k, &format!("{} holds more", o.key), progress);
                }
            } else if let Some((k, _)) = &best {
                self.discard_partial(&o.key, &format!("{k} holds more"), progress);
            }
        }
        best
    }

    /// What the unfinished upload `key` (`size` bytes in `tmp/`) lets a
    /// run keep: the state it recorded (S3), or what its partial file
    /// holds (a directory).
    fn scan_partial(&self, key: &str, size: u64) -> Result<partial::Scan, String> {
        match self.store.recorded(key) {
            Ok(Some(r)) => partial::from_checkpoint(&r.state, r.stored_bytes, &r.key),
            Ok(None) if self.store.local_root().is_some() => partial::scan(&*self.store, key, size),
            Ok(None) => Err(String::from("no part of its upload was recorded as stored")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Remove a partial stream file that cannot be continued, saying why.
    fn discard_partial(&self, key: &str, why: &str, progress: &dyn Progress) {
        progress.notice(&format!(
            "{key}: not continuing the stream an interrupted run left: {why}; sending it again"
        ));
        if let Err(e) = self.store.discard_unfinished(key) {
            progress.notice(&format!(
                "cannot remove {key}: {e}; the next run tries again"
            ));
        }
    }
}

/// Whether every frame of `f` is sound: its stored bytes match their
/// BLAKE3, it decompresses to its recorded length, and its commands decode
/// (CRC included) — frames are cut at command boundaries, so each decodes
/// alone behind the stream header — and the whole raw stream matches its
/// BLAKE3, length and command count. Frames are read, hashed, decompressed
/// and decoded on [`frames::workers`] threads, ahead of this one, which
/// hashes the raw stream in order. `false` tells nothing about where: the
/// caller reads the file again in order for that.
fn check_frames_parallel(store: &dyn Store, f: &StreamFile, progress: &dyn Progress) -> bool {
    let work = frames::Work {
        hash: true,
        decompress: true,
        decode: true,
    };
    frames::read_ahead(store, std::slice::from_ref(f), work, |ahead| {
        let mut hasher = blake3::Hasher::new();
        let (mut total, mut commands, mut ended) = (0u64, 0u64, false);
        while let Some(r) = ahead.next() {
            let Ok(fr) = r else { return false };
            // Only the last frame may end the stream.
            if ended {
                return false;
            }
            hasher.update(fr.raw());
            total += fr.raw().len() as u64;
            progress.stream(fr.raw().len() as u64);
            commands += fr.commands;
            ended = fr.ended;
            ahead.recycle(fr.into_buf());
        }
        ended
            && commands == f.trailer.commands
            && total == f.trailer.stream_bytes
            && hasher.finalize().to_hex().as_str() == f.trailer.stream_blake3
    })
}

/// One problem `verify` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The entry it concerns, if one.
    pub entry: Option<u64>,
    /// The file it concerns, if one.
    pub file: Option<String>,
    /// What is wrong (names file, frame and byte offset where they apply).
    pub message: String,
}

/// What `verify` found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    /// Entries checked.
    pub entries: usize,
    /// Stored bytes read (with `--read-data`).
    pub bytes_read: u64,
    /// Damage: empty when the repository is sound.
    pub problems: Vec<Problem>,
    /// Entries that cannot be restored because of it: (id, path).
    pub unrestorable: Vec<(u64, String)>,
    /// Harmless findings (leftover files of an interrupted run).
    pub notices: Vec<String>,
}

impl Repository {
    /// Check the catalog, the presence and size of every stream file, every
    /// chain, every trailer, and with `read_data` every frame's hash and
    /// every command (CRC included) and every stream's hash.
    ///
    /// # Errors
    ///
    /// Lock and store errors (damage is in the report, not an error).
    ///
    /// Without `read_data` it takes no lock (it never waits for a `run`):
    /// it reads the newest catalog generation, and when it finds damage it
    /// loads the newest generation again; if a writer stored a new one in
    /// the meantime (a `forget` deleting files the older one named), it
    /// checks again, so a concurrent writer is never reported as damage.
    /// With `read_data` it holds the shared lock, waiting up to `wait`.
    pub fn verify(
        &self,
        read_data: bool,
        wait: Duration,
        progress: &dyn Progress,
    ) -> Result<VerifyReport, BackupError> {
        if read_data {
            let _lock = self.lock(LockKind::Shared, wait, progress)?;
            return self.verify_once(true, progress);
        }
        let mut tries = 0;
        loop {
            let before = Catalog::newest(&*self.store).ok();
            let rep = self.verify_once(false, progress)?;
            if rep.problems.is_empty() || tries >= VERIFY_TRIES {
                return Ok(rep);
            }
            if Catalog::newest(&*self.store).ok() == before {
                return Ok(rep);
            }
            tries += 1;
        }
    }

    fn verify_once(
        &self,
        read_data: bool,
        progress: &dyn Progress,
    ) -> Result<VerifyReport, BackupError> {
        let mut rep = VerifyReport::default();
        let cat = match self.catalog() {
            Ok(c) => c,
            Err(
                e @ (BackupError::Catalog { .. } | BackupError::Store(StoreError::Other { .. })),
            ) => {
                rep.problems.push(Problem {
                    entry: None,
                    file: None,
                    message: e.to_string(),
                });
                return Ok(rep);
            }
            Err(e) => return Err(e),
        };
        rep.entries = cat.entries.len();
        if let Some(w) = self.store.local().and_then(LocalStore::readable_by_others) {
            rep.notices.push(w);
        }
        let present = self.stream_sizes()?;
        let named: BTreeSet<&str> = cat.entries.iter().map(|e| e.file.as_str()).collect();
        for k in present.keys() {
            if !named.contains(k.as_str()) {
                rep.notices.push(format!(
                    "{k}: a stream file no catalog entry names (left by an interrupted run; the next run removes it)"
                ));
            }
        }
        let resumable = self.store.continues_uploads();
        for o in self.store.list(&format!("{}/", store::TMP_DIR))? {
            let what = match partial::snapshot_of(&o.key) {
                Some((u, c)) if resumable && cat.find(&u, c).is_none() => {
                    "the partial stream file of an interrupted run (the next run that stores its snapshot continues it)"
                }
                _ => "an unfinished upload (left by an interrupted run; the next run removes it)",
            };
            rep.notices.push(format!("{}: {what}", o.key));
        }
        if read_data {
            let raw = cat.entries.iter().map(|e| e.stream_bytes).sum();
            progress.plan(cat.entries.len(), raw);
        }
        let mut bad: BTreeSet<u64> = BTreeSet::new();
        for e in &cat.entries {
            if read_data {
                progress.start(&e.path, e.kind, e.stream_bytes);
            }
            let problem = |message: String| Problem {
                entry: Some(e.id),
                file: Some(e.file.clone()),
                message,
            };
            match present.get(&e.file) {
                None => {
                    rep.problems
                        .push(problem(format!("{}: the stream file is missing", e.file)));
                    bad.insert(e.id);
                    continue;
                }
                Some(&size) if size != e.stored_bytes => {
                    rep.problems.push(problem(
                        Damage::Size {
                            file: e.file.clone(),
                            found: size,
                            expected: e.stored_bytes,
                        }
                        .to_string(),
                    ));
                    bad.insert(e.id);
                    continue;
                }
                Some(_) => {}
            }
            match self.check_entry(e, read_data, progress) {
                Ok(n) => rep.bytes_read += n,
                Err(msg) => {
                    rep.problems.push(problem(msg));
                    bad.insert(e.id);
                }
            }
        }
        // A checked catalog has each parent before its children: one pass
        // in order finds every entry whose chain holds a damaged one.
        let mut broken: BTreeSet<u64> = BTreeSet::new();
        for e in &cat.entries {
            let parent_broken = e.parent_id.is_some_and(|p| broken.contains(&p));
            if bad.contains(&e.id) || parent_broken {
                broken.insert(e.id);
                rep.unrestorable.push((e.id, e.path.clone()));
            }
        }
        Ok(rep)
    }

    /// Check one entry's file; returns the bytes read.
    fn check_entry(
        &self,
        e: &Entry,
        read_data: bool,
        progress: &dyn Progress,
    ) -> Result<u64, String> {
        let f = self.open_file(e).map_err(|err| err.to_string())?;
        self.check_ident(e, &f).map_err(|err| err.to_string())?;
        if !read_data {
            return Ok(0);
        }
        if check_frames_parallel(&*self.store, &f, progress) {
            return Ok(f.size);
        }
        // Damage: read it again in order, for a message that names the
        // file, the frame and the byte offset in the stream.
        let mut reader = StreamReader::with_options(
            f.raw_reader(&*self.store),
            ReaderOptions::new().with_max_version(3),
        );
        let mut commands = 0u64;
        loop {
            match reader.next_raw() {
                Ok(Some(_)) => commands += 1,
                Ok(None) => break,
                Err(err) => {
                    // Damage found by the raw reader (hash) or the decoder
                    // (CRC, truncation).
                    let inner = match &err {
                        stream_format::DecodeError::Io { error, .. } => {
                            file::damage_of(error).map(ToString::to_string)
                        }
                        _ => None,
                    };
                    return Err(match inner {
                        Some(d) => d,
                        None => format!("{}: the raw stream does not decode: {err}", e.file),
                    });
                }
            }
        }
        if reader.streams() != 1 || commands != f.trailer.commands {
            return Err(format!(
                "{}: the raw stream has {commands} commands in {} streams, the trailer says {} in 1",
                e.file,
                reader.streams(),
                f.trailer.commands
            ));
        }
        Ok(f.size)
    }

    /// Open an entry's stream file and check its trailer against the
    /// entry.
    fn open_file(&self, e: &Entry) -> Result<StreamFile, BackupError> {
        let damage = |d: Damage| BackupError::Damage {
            repo: self.store.name().to_owned(),
            damage: Box::new(d),
        };
        let f =
            StreamFile::open(&*self.store, &e.file, e.stored_bytes).map_err(|err| match err {
                ReadError::Damage(d) => damage(d),
                ReadError::Store(s) => BackupError::Store(s),
            })?;
        let t = &f.trailer;
        let mismatch = |what: String| {
            damage(Damage::Mismatch {
                file: e.file.clone(),
                what,
            })
        };
        if t.uuid != e.uuid || t.ctransid != e.ctransid {
            return Err(mismatch(format!(
                "uuid {} ctransid {} (entry {}: {} {})",
                t.uuid, t.ctransid, e.id, e.uuid, e.ctransid
            )));
        }
        if t.parent_uuid != e.parent_uuid || t.parent_ctransid != e.parent_ctransid {
            return Err(mismatch(format!(
                "parent {:?} {:?} (entry {})",
                t.parent_uuid, t.parent_ctransid, e.id
            )));
        }
        if t.stream_bytes != e.stream_bytes || t.stream_blake3 != e.stream_blake3 {
            return Err(mismatch(format!(
                "{} raw bytes with BLAKE3 {} (entry {})",
                t.stream_bytes, t.stream_blake3, e.id
            )));
        }
        if t.proto != e.proto || t.commands != e.commands {
            return Err(mismatch(format!(
                "protocol {} with {} commands (entry {}: protocol {} with {})",
                t.proto, t.commands, e.id, e.proto, e.commands
            )));
        }
        Ok(f)
    }

    /// Check that the stream's own first command is of the entry's
    /// snapshot and, for an incremental stream, of its parent entry's
    /// snapshot (the catalog's links are checked against the streams, not
    /// taken on trust: `forget` deletes by them).
    fn check_ident(&self, e: &Entry, f: &StreamFile) -> Result<(), BackupError> {
        let ident = f.first_ident(&*self.store).map_err(|err| match err {
            ReadError::Damage(d) => BackupError::Damage {
                repo: self.store.name().to_owned(),
                damage: Box::new(d),
            },
            ReadError::Store(s) => BackupError::Store(s),
        })?;
        let (uuid, ctransid, parent) = partial::ident_text(&ident);
        let recorded = e.parent_uuid.clone().zip(e.parent_ctransid);
        if uuid != e.uuid || ctransid != e.ctransid || parent != recorded {
            let of = |p: &Option<(String, u64)>| {
                p.as_ref().map_or_else(
                    || String::from("a full stream"),
                    |(u, c)| format!("incremental from {u} ctransid {c}"),
                )
            };
            return Err(BackupError::Damage {
                repo: self.store.name().to_owned(),
                damage: Box::new(Damage::Mismatch {
                    file: e.file.clone(),
                    what: format!(
                        "its stream is of {uuid} ctransid {ctransid}, {} (entry {}: {} ctransid {}, {})",
                        of(&parent),
                        e.id,
                        e.uuid,
                        e.ctransid,
                        of(&recorded)
                    ),
                }),
            });
        }
        Ok(())
    }

    /// The stream files present, by key, with their sizes.
    fn stream_sizes(&self) -> Result<BTreeMap<String, u64>, BackupError> {
        Ok(self
            .store
            .list(STREAMS_DIR)?
            .into_iter()
            .map(|o| (o.key, o.size))
            .collect())
    }

    /// The structural check `forget` needs before it deletes anything:
    /// every entry's stream file present with its size, its trailer and
    /// its first command agreeing with the entry and its parent entry.
    /// Reads each file's trailer and the start of its first frame.
    ///
    /// # Errors
    ///
    /// [`BackupError::Invalid`] naming the first entry that does not
    /// agree; store errors.
    fn check_structure(&self, cat: &Catalog) -> Result<(), BackupError> {
        let present = self.stream_sizes()?;
        for e in &cat.entries {
            let problem = match present.get(&e.file) {
                None => Some(format!("{}: the stream file is missing", e.file)),
                Some(&size) if size != e.stored_bytes => Some(format!(
                    "{}: {size} bytes, the catalog says {}",
                    e.file, e.stored_bytes
                )),
                Some(_) => match self.open_file(e).and_then(|f| self.check_ident(e, &f)) {
                    Ok(()) => None,
                    Err(BackupError::Store(s)) if !matches!(s, StoreError::Other { .. }) => {
                        return Err(BackupError::Store(s));
                    }
                    Err(err) => Some(err.to_string()),
                },
            };
            if let Some(p) = problem {
                return Err(BackupError::Invalid(format!(
                    "{}: not deleting anything: entry {} does not agree with its stream file ({p}); run `btrsend backup verify` for every problem",
                    self.store.name(),
                    e.id
                )));
            }
        }
        Ok(())
    }
}

/// Where a restore goes.
pub enum RestoreTarget<'a> {
    /// Receive the chain into this directory with btrsend's receiver.
    Dir(&'a Path),
    /// Write the chain's raw streams, full first, here.
    Writer(&'a mut dyn Write),
}

impl std::fmt::Debug for RestoreTarget<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreTarget::Dir(d) => f.debug_tuple("Dir").field(d).finish(),
            RestoreTarget::Writer(_) => f.write_str("Writer"),
        }
    }
}

/// The raw streams of a chain, one after the other, from frames
/// decompressed ahead on other threads. Each stream's BLAKE3 and length are
/// checked when its last frame arrives, before any byte of that frame is
/// given out: the END command that finishes a received subvolume is in it,
/// so a stream whose hash does not match never ends as a finished
/// subvolume. Damage is an error from `read`, and is also left in
/// `damage` for the caller (the receiver wraps the error in its own).
struct ChainReader<'a, 'b> {
    ahead: &'a mut frames::Ahead<'b>,
    files: &'a [StreamFile],
    cur: Option<frames::Frame>,
    pos: usize,
    /// The file being read and its hash so far.
    file: usize,
    hasher: blake3::Hasher,
    total: u64,
    done: bool,
    damage: &'a std::sync::Mutex<Option<Damage>>,
    /// Told of each frame's raw bytes as they are given out.
    watch: &'a dyn Progress,
}

impl<'a, 'b> ChainReader<'a, 'b> {
    /// A reader of the frames of `files` from `ahead`.
    fn new(
        ahead: &'a mut frames::Ahead<'b>,
        files: &'a [StreamFile],
        damage: &'a std::sync::Mutex<Option<Damage>>,
        watch: &'a dyn Progress,
    ) -> ChainReader<'a, 'b> {
        ChainReader {
            ahead,
            files,
            cur: None,
            pos: 0,
            file: 0,
            hasher: blake3::Hasher::new(),
            total: 0,
            done: false,
            damage,
            watch,
        }
    }

    /// The error for `err`, its damage kept in `self.damage`.
    fn fail(&self, err: ReadError) -> io::Error {
        if let ReadError::Damage(d) = &err
            && let Ok(mut slot) = self.damage.lock()
        {
            slot.get_or_insert_with(|| d.clone());
        }
        file::io_damage(err)
    }

    /// Check the stream of file `self.file` and move to the next file.
    fn finish_file(&mut self) -> io::Result<()> {
        let Some(f) = self.files.get(self.file) else {
            return Ok(());
        };
        let found = self.hasher.finalize().to_hex().to_string();
        if self.total != f.trailer.stream_bytes || found != f.trailer.stream_blake3 {
            let d = Damage::Stream {
                file: f.key.clone(),
                what: format!(
                    "has {} bytes with BLAKE3 {found}, the trailer says {} bytes with BLAKE3 {}",
                    self.total, f.trailer.stream_bytes, f.trailer.stream_blake3
                ),
            };
            return Err(self.fail(ReadError::Damage(d)));
        }
        self.file += 1;
        self.hasher = blake3::Hasher::new();
        self.total = 0;
        Ok(())
    }

    /// Load the next frame; false at the end of the chain.
    fn load(&mut self) -> io::Result<bool> {
        if let Some(old) = self.cur.take() {
            self.ahead.recycle(old.into_buf());
        }
        let Some(r) = self.ahead.next() else {
            while self.file < self.files.len() {
                self.finish_file()?;
            }
            return Ok(false);
        };
        let fr = r.map_err(|e| self.fail(e))?;
        while self.file < fr.file {
            self.finish_file()?;
        }
        self.hasher.update(fr.raw());
        self.total += fr.raw().len() as u64;
        self.watch.stream(fr.raw().len() as u64);
        let last = self
            .files
            .get(fr.file)
            .is_some_and(|f| fr.index + 1 >= f.trailer.frames.len());
        self.pos = 0;
        self.cur = Some(fr);
        if last {
            self.finish_file()?;
        }
        Ok(true)
    }
}

impl Read for ChainReader<'_, '_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(fr) = &self.cur {
                let raw = fr.raw();
                if self.pos < raw.len() {
                    let n = (raw.len() - self.pos).min(out.len());
                    out[..n].copy_from_slice(&raw[self.pos..self.pos + n]);
                    self.pos += n;
                    return Ok(n);
                }
            }
            if self.done {
                return Ok(0);
            }
            if !self.load()? {
                self.done = true;
                return Ok(0);
            }
        }
    }
}

/// The frames themselves are the receiver's input blocks (no copy): each
/// stream's hash is checked as [`Read`] does it, before its last frame is
/// given out.
impl receive::BlockSource for ChainReader<'_, '_> {
    fn next_block(&mut self) -> Option<io::Result<(Vec<u8>, usize)>> {
        if self.done {
            return None;
        }
        match self.load() {
            Ok(true) => self.cur.take().map(|fr| Ok(fr.into_raw())),
            Ok(false) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }

    fn give_back(&mut self, buf: Vec<u8>) {
        self.ahead.recycle(buf);
    }
}

/// Frames queued for the receiver at most in a restore (besides those
/// [`frames::read_ahead`] holds): with 4 MiB frames, 8 MiB.
const RESTORE_QUEUE: usize = 2;

/// A receive's progress, passed on, with the names of the subvolumes it
/// made (for [`receive::discard`]).
struct Made<'p> {
    inner: &'p dyn receive::Progress,
    names: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl receive::Progress for Made<'_> {
    fn subvol_start(&self, name: &[u8], incremental: bool) {
        if let Ok(mut n) = self.names.lock() {
            n.push(name.to_vec());
        }
        self.inner.subvol_start(name, incremental);
    }
    fn subvol_done(&self, name: &[u8], complete: bool) {
        self.inner.subvol_done(name, complete);
    }
    fn data(&self, bytes: u64) {
        self.inner.data(bytes);
    }
    fn position(&self, offset: u64, commands: u64) {
        self.inner.position(offset, commands);
    }
    fn inode(&self, ino: u64) {
        self.inner.inode(ino);
    }
    fn note(&self, msg: &str) {
        self.inner.note(msg);
    }
    fn error(&self, err: &dyn std::error::Error) {
        self.inner.error(err);
    }
    fn lists_commands(&self) -> bool {
        self.inner.lists_commands()
    }
    fn command(&self, cmd: &Command<'_>) {
        self.inner.command(cmd);
    }
    fn encoded_fallback(&self, path: &[u8], err: io::Error) {
        self.inner.encoded_fallback(path, err);
    }
}

impl Repository {
    /// Restore the snapshot `spec` names (uuid, id or path): every file of
    /// its chain present, with a trailer that matches its entry, then its
    /// streams in order, oldest first.
    ///
    /// Nothing damaged is applied or written. [`RestoreTarget::Writer`]:
    /// the files are read twice, every frame's hash and every stream's
    /// hash checked before the first byte is written (written bytes cannot
    /// be taken back).
    /// [`RestoreTarget::Dir`] reads the files once: each frame's hash is
    /// checked before it is decompressed and applied, each stream's hash
    /// before its last frame (with the END command that finishes a
    /// subvolume); damage stops the receive there, and the subvolumes this
    /// restore made are removed, so `dir` is left as it was. It takes no
    /// resume checkpoints: an interrupted restore leaves its partial
    /// subvolume (delete it and restore again).
    ///
    /// # Errors
    ///
    /// [`BackupError::NoSuchSnapshot`], [`BackupError::Damage`], receive
    /// and write errors.
    pub fn restore(
        &self,
        spec: &str,
        target: RestoreTarget<'_>,
        wait: Duration,
        progress: &mut dyn receive::Progress,
        watch: &dyn Progress,
    ) -> Result<Entry, BackupError> {
        let _lock = self.lock(LockKind::Shared, wait, watch)?;
        let cat = self.catalog()?;
        let entry = self.find(&cat, spec)?;
        let chain = cat.chain(entry.id).map_err(|missing| BackupError::Catalog {
            repo: self.store.name().to_owned(),
            what: format!(
                "entry {} ({}) cannot be restored: its chain needs entry {missing}, which is not in the catalog",
                entry.id, entry.path
            ),
        })?;
        let mut files = Vec::new();
        for e in &chain {
            files.push(self.open_file(e)?);
        }
        // Exact totals: the catalog knows every stream's size. Writing to
        // a pipe reads the chain twice (checked first, then written).
        let passes = if matches!(target, RestoreTarget::Writer(_)) {
            2
        } else {
            1
        };
        let raw: u64 = files.iter().map(|f| f.trailer.stream_bytes).sum();
        watch.plan(1, raw.saturating_mul(passes));
        watch.start(&entry.path, entry.kind, raw);
        let store = &*self.store;
        let damage = |d: Damage| BackupError::Damage {
            repo: self.store.name().to_owned(),
            damage: Box::new(d),
        };
        let read_err = |err| match err {
            ReadError::Damage(d) => damage(d),
            ReadError::Store(s) => BackupError::Store(s),
        };
        let found = std::sync::Mutex::new(None);
        let mut decompress = frames::Work {
            hash: true,
            decompress: true,
            decode: false,
        };
        let damage_or = |e: io::Error, what: String| match file::damage_of(&e) {
            Some(ReadError::Damage(d)) => damage(d.clone()),
            _ => BackupError::Io { what, error: e },
        };
        if matches!(target, RestoreTarget::Writer(_)) {
            // Bytes written cannot be taken back: a whole pass first, each
            // frame's stored bytes against their hash and each stream's
            // raw bytes against theirs (frames intact under a forged
            // stream hash are found only so), nothing written.
            frames::read_ahead(store, &files, decompress, |ahead| {
                let mut check = ChainReader::new(ahead, &files, &found, watch);
                while let Some(b) = receive::BlockSource::next_block(&mut check) {
                    let (buf, _) = b?;
                    check.ahead.recycle(buf);
                }
                Ok(())
            })
            .map_err(|e| match file::into_read_error(e) {
                Ok(err) => read_err(err),
                Err(e) => BackupError::Io {
                    what: String::from("cannot read the streams"),
                    error: e,
                },
            })?;
            // Then decompressed again and written (zstd checks each
            // frame's checksum, each stream's hash is checked again).
            decompress.hash = false;
        }
        frames::read_ahead(store, &files, decompress, |ahead| {
            let mut input = ChainReader::new(ahead, &files, &found, watch);
            match target {
                RestoreTarget::Writer(w) => {
                    io::copy(&mut input, w)
                        .map_err(|e| damage_or(e, String::from("cannot write the streams")))?;
                    w.flush().map_err(|e| BackupError::Io {
                        what: String::from("cannot write the streams"),
                        error: e,
                    })
                }
                RestoreTarget::Dir(dir) => {
                    // No resume checkpoints: the stream is in the
                    // repository, an interrupted restore is run again (each
                    // checkpoint snapshots the subvolume, which writes out
                    // its data: about half the time of a 4 GiB restore).
                    let mut opts = ReceiveOptions::new();
                    opts.checkpoint_interval = 0;
                    let mut made = Made {
                        inner: &*progress,
                        names: std::sync::Mutex::new(Vec::new()),
                    };
                    let res = receive::receive_blocks(input, RESTORE_QUEUE, dir, &opts, &mut made);
                    let Err(source) = res else { return Ok(()) };
                    // Whatever failed (damage found, or the receive itself:
                    // a full disk, a stream the target refuses), what this
                    // restore made of the chain goes, later ones first, so
                    // DIR is left as it was.
                    let names = made.names.into_inner().unwrap_or_default();
                    for n in names.iter().rev() {
                        if let Err(e) = receive::discard(dir, n) {
                            progress.note(&format!(
                                "the failed restore left {} incomplete and cannot remove it ({e}): remove it by hand (`btrfs subvolume delete` for a subvolume, else `rm -r`)",
                                dir.join(String::from_utf8_lossy(n).as_ref()).display()
                            ));
                        }
                    }
                    match found.lock().ok().and_then(|mut f| f.take()) {
                        Some(d) => Err(damage(d)),
                        None => Err(BackupError::Receive {
                            snapshot: format!("{} ({})", entry.path, entry.id),
                            dir: dir.to_path_buf(),
                            error: Box::new(source),
                        }),
                    }
                }
            }
        })?;
        Ok(entry.clone())
    }
}

/// How to import.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ImportOptions {
    /// The entries' time (RFC 3339); default: each file's mtime.
    pub time: Option<jiff::Timestamp>,
    /// The origin the entries belong to; default `imported`.
    pub origin: Option<String>,
    /// Wait this long for the lock.
    pub wait_lock: Duration,
    /// The stream files' zstd level (default 3).
    pub level: Option<i32>,
}

/// What an import found in one file.
struct Parsed {
    file: PathBuf,
    name: String,
    uuid: String,
    ctransid: u64,
    parent: Option<(String, u64)>,
    mtime: Option<jiff::Timestamp>,
}

/// Open a stream file given to import: raw, or zstd-compressed.
fn open_input(path: &Path) -> Result<Box<dyn Read>, BackupError> {
    let io_err = |e| BackupError::Io {
        what: format!("cannot read {}", path.display()),
        error: e,
    };
    let mut f = std::fs::File::open(path).map_err(io_err)?;
    let mut magic = [0u8; 4];
    let n = f.read(&mut magic).map_err(io_err)?;
    use std::io::Seek;
    f.rewind().map_err(io_err)?;
    let f = io::BufReader::with_capacity(1 << 20, f);
    if n == 4 && u32::from_le_bytes(magic) == 0xFD2F_B528 {
        Ok(Box::new(
            zstd::stream::read::Decoder::with_buffer(f).map_err(io_err)?,
        ))
    } else {
        Ok(Box::new(f))
    }
}

fn parse_import(path: &Path) -> Result<Parsed, BackupError> {
    let name = path.display().to_string();
    let bad = |what: String| BackupError::Import {
        file: name.clone(),
        what,
    };
    let mut r =
        StreamReader::with_options(open_input(path)?, ReaderOptions::new().with_max_version(3));
    let first = match r.next_command() {
        Ok(Some((
            _,
            Command::Subvol {
                path,
                uuid,
                ctransid,
            },
        ))) => (
            String::from_utf8_lossy(&path).into_owned(),
            uuid,
            ctransid,
            None,
        ),
        Ok(Some((
            _,
            Command::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                clone_ctransid,
            },
        ))) => (
            String::from_utf8_lossy(&path).into_owned(),
            uuid,
            ctransid,
            Some((
                uuid::Uuid::from_bytes(clone_uuid).hyphenated().to_string(),
                clone_ctransid,
            )),
        ),
        Ok(Some((info, _))) => {
            return Err(bad(format!(
                "the stream does not start with SUBVOL or SNAPSHOT ({info})"
            )));
        }
        Ok(None) => return Err(bad(String::from("empty stream"))),
        Err(e) => return Err(bad(format!("not a send stream: {e}"))),
    };
    loop {
        match r.next_raw() {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => return Err(bad(format!("damaged send stream: {e}"))),
        }
    }
    if r.streams() != 1 {
        return Err(bad(format!(
            "holds {} concatenated streams; import takes one stream per file",
            r.streams()
        )));
    }
    let mtime = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| jiff::Timestamp::try_from(t).ok());
    Ok(Parsed {
        file: path.to_path_buf(),
        name: first.0,
        uuid: uuid::Uuid::from_bytes(first.1).hyphenated().to_string(),
        ctransid: first.2,
        parent: first.3,
        mtime,
    })
}

/// What an import did.
#[derive(Debug, Default)]
pub struct ImportReport {
    /// Entries stored.
    pub stored: Vec<Entry>,
    /// Why each full stream stored is full, by entry id.
    pub full_reasons: BTreeMap<u64, plan::FullReason>,
    /// Files whose stream was stored already: (file, entry id).
    pub skipped: Vec<(String, u64)>,
    /// Files that failed.
    pub failed: Vec<(String, BackupError)>,
}

impl Repository {
    /// Store existing send-stream files (raw or zstd) as entries; parents
    /// come from the streams' SNAPSHOT commands (in the repository, or
    /// among the files, in any order).
    ///
    /// # Errors
    ///
    /// Lock and catalog errors; per-file failures are in the report.
    pub fn import(
        &self,
        files: &[PathBuf],
        opts: &ImportOptions,
        progress: &dyn Progress,
    ) -> Result<ImportReport, BackupError> {
        let _lock = self.lock(LockKind::Exclusive, opts.wait_lock, progress)?;
        let mut cat = self.catalog()?;
        // A run's partial stream files stay for the next run, unless their
        // snapshot is stored.
        self.clean_leftovers(&cat, &|u, c| cat.find(u, c).is_none(), progress)?;
        let mut report = ImportReport::default();
        let mut todo = Vec::new();
        for f in files {
            match parse_import(f) {
                Ok(p) => todo.push(p),
                Err(e) => {
                    progress.failed(&f.display().to_string(), &e);
                    report.failed.push((f.display().to_string(), e));
                }
            }
        }
        // Parents first: repeat while something could be placed.
        while !todo.is_empty() {
            let before = todo.len();
            let mut rest = Vec::new();
            for p in todo {
                let fname = p.file.display().to_string();
                if let Some(e) = cat.find(&p.uuid, p.ctransid) {
                    progress.skipped(&fname, e);
                    report.skipped.push((fname, e.id));
                    continue;
                }
                let parent = match &p.parent {
                    None => None,
                    Some((u, c)) => match cat.find(u, *c) {
                        Some(e) => Some(e.clone()),
                        None => {
                            rest.push(p);
                            continue;
                        }
                    },
                };
                match self.import_one(&mut cat, &p, parent.as_ref(), opts) {
                    Ok(e) => {
                        progress.stored(&e);
                        report.stored.push(e);
                    }
                    Err(e) => {
                        progress.failed(&fname, &e);
                        report.failed.push((fname, e));
                    }
                }
            }
            if rest.len() == before {
                for p in rest {
                    let (u, c) = p.parent.clone().unwrap_or_default();
                    let e = BackupError::Import {
                        file: p.file.display().to_string(),
                        what: format!(
                            "an incremental stream whose parent (uuid {u} ctransid {c}) is neither in the repository nor among the files"
                        ),
                    };
                    progress.failed(&p.file.display().to_string(), &e);
                    report.failed.push((p.file.display().to_string(), e));
                }
                break;
            }
            todo = rest;
        }
        Ok(report)
    }

    fn import_one(
        &self,
        cat: &mut Catalog,
        p: &Parsed,
        parent: Option<&Entry>,
        opts: &ImportOptions,
    ) -> Result<Entry, BackupError> {
        let key = format!(
            "{STREAMS_DIR}{}-{}-{:08x}.btrs.zst",
            p.uuid,
            p.ctransid,
            store::random_u64() & 0xffff_ffff
        );
        let upload = self.store.multipart(&key)?;
        let wopts = WriterOptions::new().with_level(opts.level.unwrap_or(3));
        let mut writer = FileWriter::new(upload, wopts);
        let mut input = open_input(&p.file)?;
        io::copy(&mut input, &mut writer).map_err(|e| BackupError::Io {
            what: format!("cannot import {}", p.file.display()),
            error: e,
        })?;
        let (trailer, size) = writer.finish(StreamIdentity {
            uuid: p.uuid.clone(),
            ctransid: p.ctransid,
            parent: p.parent.clone(),
        })?;
        let time = opts
            .time
            .or(p.mtime)
            .unwrap_or_else(jiff::Timestamp::now)
            .to_string();
        let entry = Entry {
            id: 0,
            path: p.name.clone(),
            uuid: p.uuid.clone(),
            ctransid: p.ctransid,
            parent_uuid: p.parent.as_ref().map(|x| x.0.clone()),
            parent_ctransid: p.parent.as_ref().map(|x| x.1),
            parent_id: parent.map(|e| e.id),
            kind: if p.parent.is_some() {
                Kind::Incremental
            } else {
                Kind::Full
            },
            time,
            origin: opts
                .origin
                .clone()
                .unwrap_or_else(|| String::from("imported")),
            file: key,
            stream_bytes: trailer.stream_bytes,
            stored_bytes: size,
            stream_blake3: trailer.stream_blake3,
            commands: trailer.commands,
            proto: trailer.proto,
            stored_at: now_rfc3339(),
        };
        let mut next = cat.clone();
        let id = next.add(entry);
        next.commit(&*self.store)?;
        *cat = next;
        cat.get(id)
            .cloned()
            .ok_or_else(|| BackupError::Invalid(String::from("entry vanished")))
    }
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn globs_match_as_the_shell_does() {
        assert!(glob_match("snaps/home.*", "snaps/home.2026-11-20"));
        assert!(!glob_match("snaps/home.*", "snaps/home.x/nested"));
        assert!(!glob_match("snaps/*", "snaps"));
        assert!(glob_match("snaps/?", "snaps/a"));
        assert!(!glob_match("snaps/?", "snaps/ab"));
        assert!(glob_match("s[a-c]x", "sbx"));
        assert!(!glob_match("s[!a-c]x", "sbx"));
        assert!(glob_match("s[!a-c]x", "sdx"));
        assert!(glob_match(r"a\*", "a*"));
        assert!(!glob_match(r"a\*", "ab"));
        assert!(glob_match("*", "x"));
        assert!(glob_match("a*b*c", "aXbYc"));
    }
}
