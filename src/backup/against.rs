//! `backup verify --against-source`: prove stored streams equal to the
//! snapshots still on the source, reading nothing of the repository but
//! its catalog.
//!
//! Sends are deterministic: the stream of a snapshot, incremental from
//! the same parent with the same protocol, is the same bytes each time it
//! is made, so the stream a run stored is made again (as the run made it,
//! [`RunSend`]) into a sink that only counts and hashes it, and its length
//! and BLAKE3 are compared with the catalog's. A balance since the stream
//! was stored may legitimately change it (clone choices follow the
//! extents' places); where it differs the snapshot's content is compared
//! instead: its manifest read from the source against the manifest of the
//! entry's index (whose file contents are read from the repository).
//!
//! Like `verify`, it finds and never changes anything.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use super::catalog::{Catalog, Entry};
use super::error::BackupError;
use super::lock::LockKind;
use super::repository::Repository;
use super::run::RunSend;
use super::run::select::{open_devices, stream_uuid};
use crate::fs::subvol::Subvolume;
use crate::manifest;
use crate::progress::Progress;
use crate::send::mounted::Source;

/// Where the source snapshots are read.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct SourceOptions {
    /// The devices or images of the source filesystem (mounted or not).
    pub devices: Vec<PathBuf>,
    /// Read a filesystem with missing devices from the remaining copies.
    pub degraded: bool,
    /// Wait this long for the shared lock.
    pub wait_lock: Duration,
}

impl SourceOptions {
    /// The filesystem on `devices`, not degraded, no waiting for the lock.
    pub fn new(devices: Vec<PathBuf>) -> SourceOptions {
        SourceOptions {
            devices,
            ..SourceOptions::default()
        }
    }

    /// Set [`SourceOptions::degraded`].
    pub fn with_degraded(mut self, on: bool) -> SourceOptions {
        self.degraded = on;
        self
    }

    /// Set [`SourceOptions::wait_lock`].
    pub fn with_wait_lock(mut self, d: Duration) -> SourceOptions {
        self.wait_lock = d;
        self
    }
}

/// What was compared to decide an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Comparison {
    /// The raw stream made again: its length and BLAKE3 against the
    /// catalog's.
    Stream,
    /// The snapshot's manifest on the source against the manifest of the
    /// entry's index (after the stream differed).
    Content,
}

/// How one entry compares with its snapshot on the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Proven equal (by [`SourceCheck::comparison`]).
    Proven,
    /// Not equal, or not provable after the stream differed: damage.
    Differs,
    /// Not compared (see [`SourceCheck::detail`]).
    Skipped,
}

/// One entry's result.
#[derive(Debug, Clone, Serialize)]
pub struct SourceCheck {
    /// The entry's id.
    pub entry: u64,
    /// Its path.
    pub path: String,
    /// The outcome.
    pub outcome: Outcome,
    /// The last comparison made (`None`: skipped).
    pub comparison: Option<Comparison>,
    /// Why it differs or was skipped, or how the stream differed before
    /// the content was proven equal.
    pub detail: Option<String>,
}

/// What `verify --against-source` found, entry by entry in catalog order.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SourceReport {
    /// Entries in the catalog.
    pub entries: usize,
    /// Each entry's result.
    pub checks: Vec<SourceCheck>,
}

impl SourceReport {
    /// The entries with `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.checks.iter().filter(|c| c.outcome == outcome).count()
    }
}

/// A sink that counts and BLAKE3-hashes a stream and keeps nothing.
struct HashSink {
    hasher: blake3::Hasher,
    bytes: u64,
}

impl Write for HashSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.hasher.update(buf);
        self.bytes += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The source filesystem, its subvolumes, and where each stored entry's
/// snapshot is among them.
pub(crate) struct OnSource {
    pub(crate) source: Source,
    subvols: Vec<Subvolume>,
}

impl OnSource {
    /// Open the filesystem on `opts.devices` and list its subvolumes.
    pub(crate) fn open(opts: &SourceOptions) -> Result<OnSource, BackupError> {
        if opts.devices.is_empty() {
            return Err(BackupError::Invalid(String::from(
                "no source device given (--device)",
            )));
        }
        let read = crate::device::readahead::ReadOptions::default().with_degraded(opts.degraded);
        let (source, subvols, _) = open_devices(&opts.devices, &read)?;
        Ok(OnSource { source, subvols })
    }

    /// The snapshot on the source an entry stores: the same stream UUID
    /// (received UUID, else UUID) and ctransid, as `run` finds them.
    pub(crate) fn find(&self, e: &Entry) -> Option<&Subvolume> {
        self.subvols
            .iter()
            .find(|s| stream_uuid(s) == e.uuid && s.root.ctransid.get() == e.ctransid)
    }

    /// The snapshot of `e` and of its parent entry on the source, or why
    /// its stream cannot be made again.
    pub(crate) fn snapshot_and_parent(
        &self,
        cat: &Catalog,
        e: &Entry,
    ) -> Result<(Subvolume, Option<Subvolume>), String> {
        let Some(s) = self.find(e) else {
            return Err(format!(
                "its snapshot (uuid {} ctransid {}) is not on the source",
                e.uuid, e.ctransid
            ));
        };
        let parent = match e.parent_id {
            None => None,
            Some(pid) => {
                let Some(pe) = cat.get(pid) else {
                    return Err(format!("its parent entry {pid} is not in the catalog"));
                };
                match self.find(pe) {
                    Some(p) => Some(p.clone()),
                    None => {
                        return Err(format!(
                            "its parent's snapshot ({}, entry {pid}) is not on the source",
                            pe.path
                        ));
                    }
                }
            }
        };
        Ok((s.clone(), parent))
    }

    /// Make `e`'s stream again as `run` made it (same parent, same
    /// protocol) into `out`.
    pub(crate) fn send_again<W: Write>(
        &mut self,
        e: &Entry,
        snap: &Subvolume,
        parent: Option<&Subvolume>,
        out: W,
        progress: &dyn Progress,
    ) -> Result<W, BackupError> {
        let send = RunSend::new(snap, parent);
        let mut opts = send.options();
        opts.version = e.proto;
        self.source
            .send(&send.request(), out, opts, progress)
            .map(|(w, _)| w)
            .map_err(|err| BackupError::Send {
                snapshot: e.path.clone(),
                error: Box::new(err),
            })
    }

    /// The manifest of `snap` read from the source.
    fn manifest(&self, snap: &Subvolume) -> Result<String, String> {
        let tree = self
            .source
            .fs()
            .fs_tree(snap.id())
            .map_err(|e| format!("cannot read its snapshot on the source: {e}"))?;
        crate::fs::manifest::manifest(&tree, manifest::Options { holes: false }, true)
            .map_err(|e| format!("cannot read its snapshot on the source: {e}"))
    }
}

impl Repository {
    /// Compare every stored entry whose snapshot (and parent's snapshot)
    /// is still on the source with it: its stream made again and hashed
    /// (nothing of the repository read but the catalog), and where that
    /// differs, the snapshot's content against the entry's index (see the
    /// module docs). Holds the shared lock, so that no `forget` deletes an
    /// index being read.
    ///
    /// # Errors
    ///
    /// The source cannot be opened; lock, catalog and store errors (an
    /// entry that differs is in the report, not an error).
    pub fn verify_against_source(
        &self,
        opts: &SourceOptions,
        progress: &dyn Progress,
    ) -> Result<SourceReport, BackupError> {
        let _lock = self.lock(LockKind::Shared, opts.wait_lock, progress)?;
        let cat = self.catalog()?;
        let mut src = OnSource::open(opts)?;
        let mut rep = SourceReport {
            entries: cat.entries.len(),
            checks: Vec::with_capacity(cat.entries.len()),
        };
        let found: BTreeMap<u64, Result<(Subvolume, Option<Subvolume>), String>> = cat
            .entries
            .iter()
            .map(|e| (e.id, src.snapshot_and_parent(&cat, e)))
            .collect();
        let total = found
            .iter()
            .filter(|(_, f)| f.is_ok())
            .filter_map(|(id, _)| cat.get(*id))
            .map(|e| e.stream_bytes)
            .sum();
        progress.plan(found.values().filter(|f| f.is_ok()).count(), total);
        for e in &cat.entries {
            let check = |outcome, comparison, detail| SourceCheck {
                entry: e.id,
                path: e.path.clone(),
                outcome,
                comparison,
                detail,
            };
            let (snap, parent) = match found.get(&e.id) {
                Some(Ok(f)) => f,
                Some(Err(why)) => {
                    rep.checks
                        .push(check(Outcome::Skipped, None, Some(why.clone())));
                    continue;
                }
                None => continue,
            };
            progress.start(&e.path, e.kind, e.stream_bytes);
            let sink = HashSink {
                hasher: blake3::Hasher::new(),
                bytes: 0,
            };
            let sink = super::run::Counted {
                inner: sink,
                progress,
            };
            let stream_differs = match src.send_again(e, snap, parent.as_ref(), sink, progress) {
                Ok(c) => {
                    let hash = c.inner.hasher.finalize().to_hex().to_string();
                    if c.inner.bytes == e.stream_bytes && hash == e.stream_blake3 {
                        rep.checks
                            .push(check(Outcome::Proven, Some(Comparison::Stream), None));
                        continue;
                    }
                    format!(
                        "the stream made again is {} bytes with BLAKE3 {hash}, the catalog says {} bytes with BLAKE3 {}",
                        c.inner.bytes, e.stream_bytes, e.stream_blake3
                    )
                }
                Err(err) => format!("the stream cannot be made again: {err}"),
            };
            let content = self.compare_content(&cat, e, &src, snap);
            rep.checks.push(match content {
                Ok(None) => check(
                    Outcome::Proven,
                    Some(Comparison::Content),
                    Some(stream_differs),
                ),
                Ok(Some(diff)) => check(
                    Outcome::Differs,
                    Some(Comparison::Content),
                    Some(format!("{stream_differs}; the content differs: {diff}")),
                ),
                Err(why) => check(
                    Outcome::Differs,
                    Some(Comparison::Stream),
                    Some(format!(
                        "{stream_differs}; the content could not be compared: {why}"
                    )),
                ),
            });
        }
        Ok(rep)
    }

    /// The first differences between the manifest of `snap` on the source
    /// and that of `e`'s index (`None`: equal), or why they cannot be
    /// compared.
    fn compare_content(
        &self,
        cat: &Catalog,
        e: &Entry,
        src: &OnSource,
        snap: &Subvolume,
    ) -> Result<Option<String>, String> {
        let opts = manifest::Options { holes: false };
        let stored = self
            .with_index(cat, e, |index, data| {
                index
                    .manifest(opts, data)
                    .map_err(|err| BackupError::Invalid(format!("its index: {err}")))
            })
            .map_err(|err| err.to_string())?;
        let live = src.manifest(snap)?;
        Ok(manifest::diff(&live, &stored, 5))
    }
}
