//! `backup run --dry-run`: what a run would store, with the exact size of
//! each stream, found as the run finds it (the same selection, parents and
//! full-stream rules) but without the lock, the snapshots `--snapshot`
//! would take, the cleaning of leftovers or any write.
//!
//! The catalog is read as `list` reads it: one generation, replaced
//! atomically, so no lock is needed, and none is taken (a lock would write
//! a lock object in S3).

use std::path::PathBuf;

use crate::backup::catalog::Kind;
use crate::backup::error::BackupError;
use crate::backup::plan;
use crate::backup::repository::Repository;
use crate::backup::snapshots;

use super::RunOptions;
use super::select::{Found, select, stream_uuid};

/// One stream a run would store.
#[derive(Debug)]
#[non_exhaustive]
pub struct PlannedStream {
    /// The snapshot, as its entry would record it.
    pub path: String,
    /// The UUID its stream carries.
    pub uuid: String,
    /// Its ctransid.
    pub ctransid: u64,
    /// Full or incremental.
    pub kind: Kind,
    /// The parent of an incremental stream: its path and, when it is
    /// stored already, its entry id (`None`: a snapshot the run stores
    /// first).
    pub parent: Option<(String, Option<u64>)>,
    /// Why the stream is full, when it is.
    pub full_reason: Option<plan::FullReason>,
    /// The exact size of the raw send stream, in bytes (what `btrfs send`
    /// would write); the stored size is smaller by zstd's ratio, unknown
    /// until it is compressed.
    pub stream_bytes: u64,
}

/// What a run would do ([`Repository::dry_run`]).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct DryRunReport {
    /// The streams it would store, in the order it would store them.
    pub streams: Vec<PlannedStream>,
    /// Snapshots already stored (path, entry id).
    pub skipped: Vec<(String, u64)>,
    /// Snapshots a target has received already (path, name there).
    pub received: Vec<(String, String)>,
    /// Snapshots it could not store (path, why).
    pub failed: Vec<(String, BackupError)>,
    /// The subvolumes `--snapshot` would take a snapshot of (their streams
    /// are not among [`DryRunReport::streams`]: a snapshot not yet taken
    /// has no stream to size).
    pub would_take: Vec<PathBuf>,
    /// Subvolumes not snapshotted because they have not changed since
    /// their newest snapshot (the subvolume, that snapshot).
    pub unchanged: Vec<(PathBuf, PathBuf)>,
    /// Subvolumes whose snapshot directory could not be read (the
    /// subvolume, why).
    pub snapshot_failed: Vec<(PathBuf, BackupError)>,
    /// The free space of a local repository's or target's filesystem
    /// (`None`: not a local directory).
    pub free_bytes: Option<u64>,
    /// The refusal a real run would meet: the raw streams do not fit in
    /// the local repository or target ([`BackupError::NoRoom`]).
    pub no_room: Option<BackupError>,
}

impl DryRunReport {
    /// The raw bytes of every stream it would store.
    pub fn stream_bytes(&self) -> u64 {
        self.streams.iter().map(|s| s.stream_bytes).sum()
    }
}

impl Repository {
    /// What [`Repository::run`] would store, and the exact raw size of
    /// each stream, without storing, locking, cleaning or taking any
    /// snapshot: the same selection, order, parents and full-stream rules,
    /// and the same room check (in [`DryRunReport::no_room`]).
    ///
    /// # Errors
    ///
    /// As [`Repository::run`] before any snapshot is tried (the source,
    /// the catalog); a snapshot whose stream cannot be sized is in
    /// [`DryRunReport::failed`].
    pub fn dry_run(
        &self,
        specs: &[String],
        opts: &RunOptions,
    ) -> Result<DryRunReport, BackupError> {
        let cat = self.catalog()?;
        let mut report = DryRunReport::default();
        let mut found = match &opts.snapshots {
            Some(so) => would_take(so, &mut report)?,
            None => Vec::new(),
        };
        let mut src = select(opts, specs, &mut found, &super::select::in_catalog(&cat))?;
        report.failed = std::mem::take(&mut src.rejected);
        src.selected.sort_by_key(|s| {
            (
                s.subvol.root.otransid.get(),
                s.subvol.root.ctransid.get(),
                s.subvol.id().get(),
            )
        });
        let selected = std::mem::take(&mut src.selected);
        let planned = self.estimate(&cat, &src, &selected, opts)?;
        for (sel, p) in selected.iter().zip(planned) {
            let uuid = stream_uuid(&sel.subvol);
            let ctransid = sel.subvol.root.ctransid.get();
            let Some(p) = p else {
                if let Some(e) = cat.find(&uuid, ctransid) {
                    report.skipped.push((sel.path.clone(), e.id));
                }
                continue;
            };
            match p.stream_bytes {
                Ok(stream_bytes) => report.streams.push(PlannedStream {
                    path: sel.path.clone(),
                    uuid,
                    ctransid,
                    kind: if p.parent.is_some() {
                        Kind::Incremental
                    } else {
                        Kind::Full
                    },
                    parent: p.parent,
                    full_reason: p.full,
                    stream_bytes,
                }),
                Err(e) => report.failed.push((sel.path.clone(), e)),
            }
        }
        // Without the check, the free space is still told.
        let needed = if opts.space_check {
            report.stream_bytes()
        } else {
            0
        };
        match self.check_room(needed) {
            Ok(free) => report.free_bytes = free,
            Err(e @ BackupError::NoRoom { free, .. }) => {
                report.free_bytes = Some(free);
                report.no_room = Some(e);
            }
            Err(e) => return Err(e),
        }
        Ok(report)
    }
}

/// What `take_snapshots` would do, without taking any: which subvolumes
/// have changed since their newest snapshot, and the snapshot directory as
/// it is now.
pub(crate) fn would_take(
    so: &super::SnapshotOptions,
    report: &mut DryRunReport,
) -> Result<Vec<Found>, BackupError> {
    for subvol in &so.subvols {
        match snapshots::newest_taken(subvol, &so.dir) {
            Ok(Some(name)) => report.unchanged.push((subvol.clone(), so.dir.join(name))),
            Ok(None) => report.would_take.push(subvol.clone()),
            Err(e) => report.snapshot_failed.push((subvol.clone(), e)),
        }
    }
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
