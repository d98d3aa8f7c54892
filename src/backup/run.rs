//! `backup run`: store snapshots as stream files, each incremental from
//! the newest stored snapshot of its origin that is still on the source,
//! else full; with `--snapshot`, take the source snapshots first and prune
//! them after.
//!
//! This module drives a run: the lock, the catalog, the order, the
//! estimate for the progress of the whole run, and storing one snapshot
//! (the send into a [`FileWriter`], then the catalog). What it decides is
//! decided in [`plan`](super::plan) (pure, tested alone); finding the
//! snapshots is in `select`, the snapshot directory of `--snapshot` in
//! `snapshot_dir`, continuing an interrupted run's stream file in
//! `unfinished`. It must not write anything but stream files and catalog
//! generations into the repository, nor list a stream that is not whole.

pub(crate) mod dry;
pub(crate) mod select;
pub(crate) mod snapshot_dir;
pub(crate) mod unfinished;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Duration;

use select::{
    Selected, Sources, full_time_of, in_catalog, origin_of, otime_of, otime_ts, select, stream_uuid,
};
use snapshot_dir::{prune_snapshots, take_snapshots, write_holds};
use unfinished::{Resumed, VerifyHead};

pub use dry::{DryRunReport, PlannedStream};

use super::catalog::{Catalog, Entry, Kind};
use super::error::BackupError;
use super::file::{FileWriter, StreamIdentity, WriterOptions};
use super::index::{IndexTee, InlineIndex};
use super::lock::LockKind;
use super::plan;
use super::repository::{Repository, now_rfc3339};
use super::treehash::TreeHasher;
use crate::fs::subvol::Subvolume;
use crate::progress::Progress;
use crate::send::SendOptions;
use crate::send::mounted::Request;

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
    /// Refuse a run into a directory whose filesystem has less free space
    /// than the raw streams (see [`Repository::check_room`]); off for
    /// data zstd is known to shrink, or a filesystem that compresses.
    pub space_check: bool,
    /// Index each stream as it is stored (see [`index`](super::index)).
    pub index: bool,
    /// At most this many bytes per second of stream into a target
    /// (`--limit-rate` with `--target`; a repository's limit is its
    /// store's, [`LimitedStore`](super::store::LimitedStore)).
    pub target_rate: Option<u64>,
}

/// `backup run --snapshot SUBVOL --snapshot-dir DIR [--keep-snapshots N]`
/// (see [`snapshots`](super::snapshots)).
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
            space_check: true,
            index: true,
            target_rate: None,
        }
    }

    /// Set [`RunOptions::target_rate`].
    pub fn with_target_rate(mut self, rate: Option<u64>) -> RunOptions {
        self.target_rate = rate;
        self
    }

    /// Set [`RunOptions::index`].
    pub fn with_index(mut self, on: bool) -> RunOptions {
        self.index = on;
        self
    }

    /// Set [`RunOptions::space_check`].
    pub fn with_space_check(mut self, on: bool) -> RunOptions {
        self.space_check = on;
        self
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

    pub(crate) fn read_options(&self) -> crate::device::readahead::ReadOptions {
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

/// The stream being stored, counted for [`Progress::stream`].
pub(crate) struct Counted<'p, W> {
    pub(crate) inner: W,
    pub(crate) progress: &'p dyn Progress,
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

/// The protocol version of the streams a run stores.
pub(crate) const RUN_PROTO: u32 = 1;

/// The send a run makes of a snapshot, incremental from `parent` when
/// there is one: what `verify --against-source` and `repair` make again,
/// so it is built in one place.
pub(crate) struct RunSend {
    /// The snapshot, by id: unambiguous on devices and in a mount alike.
    subvol: String,
    /// The parent's snapshot, by id.
    parent: Option<String>,
}

impl RunSend {
    /// The send of `subvol`, incremental from `parent`.
    pub(crate) fn new(subvol: &Subvolume, parent: Option<&Subvolume>) -> RunSend {
        RunSend {
            subvol: format!("id:{}", subvol.id().get()),
            parent: parent.map(|p| format!("id:{}", p.id().get())),
        }
    }

    /// The request for [`Source::send`](crate::send::mounted::Source::send).
    pub(crate) fn request(&self) -> Request<'_> {
        Request {
            subvol: &self.subvol,
            parent: self.parent.as_deref(),
            clone_sources: &[],
        }
    }

    /// The send options of a run: protocol [`RUN_PROTO`], data verified.
    pub(crate) fn options(&self) -> SendOptions {
        SendOptions::new(RUN_PROTO)
    }

    /// The exact size of the stream, planned on `sel`'s filesystem in
    /// `src` (no data read).
    pub(crate) fn size(&self, src: &Sources, sel: &Selected) -> Result<u64, BackupError> {
        let Some(fs) = src.fss.get(sel.fs) else {
            return Err(BackupError::Invalid(format!(
                "{}: its filesystem is not open",
                sel.path
            )));
        };
        fs.estimate(&self.request(), self.options())
            .map(|st| st.stream_bytes)
            .map_err(|e| BackupError::Send {
                snapshot: sel.path.clone(),
                error: Box::new(e),
            })
    }
}

/// The bytes free for an unprivileged writer (statvfs `f_bavail`) on the
/// filesystem of `dir`.
///
/// # Errors
///
/// [`BackupError::Io`] when the filesystem cannot be asked.
pub(crate) fn free_bytes_at(dir: &std::path::Path) -> Result<u64, BackupError> {
    let st = rustix::fs::statvfs(dir).map_err(|e| BackupError::Io {
        what: format!("cannot read the free space of {}", dir.display()),
        error: e.into(),
    })?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// `free` when `needed` bytes fit in it, else [`BackupError::NoRoom`]
/// naming `name` (a repository or a target) with both figures.
pub(crate) fn room_for(name: &str, free: u64, needed: u64) -> Result<u64, BackupError> {
    if needed > free {
        return Err(BackupError::NoRoom {
            repo: name.to_owned(),
            needed,
            free,
        });
    }
    Ok(free)
}

/// The stream a snapshot is planned as ([`Repository::estimate`]).
pub(super) struct Planned {
    /// What the incremental stream's parent is: its path and, when it is
    /// stored already, its entry id (`None`: a snapshot this run stores
    /// first).
    pub(super) parent: Option<(String, Option<u64>)>,
    /// Why the stream is full, when it is.
    pub(super) full: Option<plan::FullReason>,
    /// The exact size of the raw stream.
    pub(super) stream_bytes: Result<u64, BackupError>,
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

impl Repository {
    /// Store every selected snapshot not yet stored, oldest first:
    /// incremental from the newest stored snapshot of the same origin
    /// whose chain is intact and which is still on the source, else full
    /// (see [`RunOptions::full_every`]). One snapshot's failure does not
    /// stop the others. With [`RunOptions::snapshots`], first take a
    /// read-only snapshot of each subvolume, and afterwards prune the old
    /// ones (see [`snapshots`](super::snapshots)).
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
        let mut src = select(opts, specs, &mut found, &in_catalog(&cat))?;
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
        let selected = src.take_oldest_first();
        // A local repository needs the sizes for its room check: a full
        // disk found halfway leaves a partial stream and wasted hours.
        let local = opts.space_check && self.store.local_root().is_some();
        let estimates: Vec<Option<u64>> = if progress.wants_total() || local {
            self.estimate(&cat, &src, &selected, opts)?
                .into_iter()
                .map(|p| p.map(|p| p.stream_bytes.unwrap_or(0)))
                .collect()
        } else {
            vec![None; selected.len()]
        };
        if local {
            self.check_room(estimates.iter().flatten().sum())?;
        }
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
            let holder = (self.config.id.as_str(), self.store.name());
            write_holds(holder, so, &found, &in_catalog(&cat), progress);
            if let Some(keep) = so.keep {
                prune_snapshots(so, keep, &found, &in_catalog(&cat), &mut report, progress);
            }
        }
        Ok(report)
    }

    /// The stream each of `selected` will be stored as (`None`: stored
    /// already), with its exact size: for the progress of the whole run,
    /// the room check and `--dry-run`. A snapshot's parent is the one
    /// [`Repository::pick_parent`] picks now, or the previous snapshot of
    /// its origin stored by this run, and the same rules
    /// ([`plan::continues`], [`plan::full_due`]) make it full.
    fn estimate(
        &self,
        cat: &Catalog,
        src: &Sources,
        selected: &[Selected],
        opts: &RunOptions,
    ) -> Result<Vec<Option<Planned>>, BackupError> {
        let present = self.stream_sizes()?;
        // Per origin: the last snapshot planned in this run and its chain.
        let mut planned: BTreeMap<String, (usize, plan::Chain)> = BTreeMap::new();
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
            let mut full = None;
            // The parent's snapshot on the source, what names it (a stored
            // entry's id, or a snapshot this run stores first) and its chain.
            let (parent, parent_of, chain) = match planned.get(&origin) {
                Some(&(j, chain)) if plan::continues(chain, time, opts.full_policy()) => {
                    let p = selected.get(j);
                    (
                        p.map(|p| p.subvol.clone()),
                        p.map(|p| (p.path.clone(), None)),
                        Some(chain),
                    )
                }
                Some(&(_, chain)) => {
                    full = plan::full_due(chain.depth, chain.full_time, time, opts.full_policy());
                    (None, None, None)
                }
                None => {
                    let pick = self.pick_parent(cat, src, sel, opts, &present);
                    full = pick.full;
                    match pick.parent {
                        Some((e, p)) => (
                            Some(p),
                            Some((e.path.clone(), Some(e.id))),
                            Some(plan::Chain {
                                depth: cat.depth(e.id).unwrap_or(usize::MAX),
                                full_time: full_time_of(cat, e.id),
                            }),
                        ),
                        None => (None, None, None),
                    }
                }
            };
            let chain = plan::Chain::after(chain.filter(|_| parent.is_some()), time);
            let stream_bytes = RunSend::new(&sel.subvol, parent.as_ref()).size(src, sel);
            out.push(Some(Planned {
                parent: parent_of,
                full: if parent.is_some() { None } else { full },
                stream_bytes,
            }));
            planned.insert(origin, (i, chain));
        }
        Ok(out)
    }

    /// Refuse a run whose streams cannot fit in a local repository: the
    /// sum of their raw sizes (zstd may not shrink them) against the free
    /// space of the repository's filesystem. Returns the free bytes
    /// (`None`: not a local directory, where nothing can be asked).
    ///
    /// # Errors
    ///
    /// [`BackupError::NoRoom`] with both figures; [`BackupError::Io`] when
    /// the filesystem cannot be asked.
    pub fn check_room(&self, needed: u64) -> Result<Option<u64>, BackupError> {
        let Some(root) = self.store.local_root() else {
            return Ok(None);
        };
        room_for(self.store.name(), free_bytes_at(root)?, needed).map(Some)
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
        let key = super::new_stream_key(&uuid, ctransid);
        let wopts = WriterOptions::new()
            .with_level(opts.level)
            .with_frame_bytes(opts.frame_bytes);
        let send = RunSend::new(&sel.subvol, parent.as_ref().map(|(_, p)| p));
        let sopts = send.options();
        let req = send.request();
        let parent_id = parent.as_ref().map(|(e, _)| (e.uuid.clone(), e.ctransid));
        let mut partial = self.find_partial(&uuid, ctransid, parent_id.as_ref(), progress);
        // The key the stream file gets (a continued S3 upload keeps its own).
        let mut file = key.clone();
        let parent_entry = parent.as_ref().map(|(e, _)| *e);
        let mut index: Option<InlineIndex>;
        let start_index = |file: &str| {
            opts.index
                .then(|| self.inline_index(cat, file, parent_entry))
                .flatten()
        };
        let writer = loop {
            let Some((tmp, scan)) = partial.take() else {
                file.clone_from(&key);
                let mut upload = self.store.multipart(&key)?;
                upload.keep_when_dropped();
                let counted = Counted {
                    inner: FileWriter::new(upload, wopts),
                    progress,
                };
                index = start_index(&file);
                let tee = IndexTee {
                    inner: counted,
                    index: index.as_mut(),
                };
                let (tee, _stats) = source.send(&req, tee, sopts, progress).map_err(send_err)?;
                break tee.inner.inner;
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
            index = start_index(&file);
            let tee = IndexTee {
                inner: out,
                index: index.as_mut(),
            };
            match source.send(&req, tee, sopts, progress) {
                Ok((tee, _stats)) => break tee.inner.inner.inner,
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
            synthesized_from: None,
        };
        self.record_inline_index(&entry, index, &|w| progress.warning(w));
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
