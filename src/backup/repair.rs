//! `backup repair`: store again the damaged or missing stream files
//! `verify --read-data` finds, byte-identical to what was stored.
//!
//! A stream is made again from the source (its snapshot and its parent's
//! still there: sent as `run` sent it, [`OnSource::send_again`]) or copied
//! from a second repository whose entry for the same snapshot records the
//! same raw stream. Either way the new stream file must hash to the
//! catalog's BLAKE3 before anything refers to it. It gets a new key; the
//! entry is switched to it in one new catalog generation, and only then is
//! the damaged file deleted, so an interruption at any point leaves a
//! catalog whose files are either the damaged ones or the repaired ones.
//!
//! An index names the stream files it reads by key: the entry's own index
//! root is stored under the new key before the switch, and the roots of
//! the other entries whose indexes read the stream are rewritten after
//! it (until then they name a file no entry lists, which `verify` reports
//! and `backup index` rebuilds).

use std::collections::BTreeSet;
use std::time::Duration;

use super::against::{OnSource, SourceOptions};
use super::catalog::{Catalog, Entry};
use super::error::BackupError;
use super::file::{FileWriter, StreamIdentity, WriterOptions};
use super::index::IndexRoot;
use super::index::repo::root_key;
use super::lock::LockKind;
use super::repository::Repository;
use super::run::Counted;
use crate::progress::Progress;

/// How to repair.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RepairOptions {
    /// Wait this long for either repository's lock.
    pub wait_lock: Duration,
    /// The zstd level of the stream files written.
    pub level: i32,
    /// Raw bytes per frame of the stream files written.
    pub frame_bytes: usize,
    /// Make streams again from this source (tried before a second
    /// repository).
    pub source: Option<SourceOptions>,
}

impl RepairOptions {
    /// Defaults: no source, no waiting, level 3, 4 MiB frames (as run).
    pub fn new() -> RepairOptions {
        RepairOptions {
            wait_lock: Duration::ZERO,
            level: 3,
            frame_bytes: WriterOptions::new().frame_bytes,
            source: None,
        }
    }

    /// Set [`RepairOptions::source`].
    pub fn with_source(mut self, s: SourceOptions) -> RepairOptions {
        self.source = Some(s);
        self
    }

    /// Set [`RepairOptions::wait_lock`].
    pub fn with_wait_lock(mut self, d: Duration) -> RepairOptions {
        self.wait_lock = d;
        self
    }

    fn writer(&self) -> WriterOptions {
        WriterOptions::new()
            .with_level(self.level)
            .with_frame_bytes(self.frame_bytes)
    }
}

impl Default for RepairOptions {
    fn default() -> RepairOptions {
        RepairOptions::new()
    }
}

/// One entry repaired.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Repaired {
    /// The entry's id.
    pub entry: u64,
    /// Its path.
    pub path: String,
    /// Where its stream came from: `source` or the second repository's
    /// name.
    pub from: String,
    /// Its new stream file.
    pub file: String,
}

/// One damaged entry not repaired.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NotRepaired {
    /// The entry's id.
    pub entry: u64,
    /// Its path.
    pub path: String,
    /// Why, for each way tried.
    pub why: String,
}

/// What a repair did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RepairReport {
    /// Entries whose stream file was damaged or missing (of those asked
    /// for).
    pub damaged: usize,
    /// Those repaired.
    pub repaired: Vec<Repaired>,
    /// Those not repaired.
    pub failed: Vec<NotRepaired>,
    /// Harmless findings (an index root that could not be rewritten).
    pub warnings: Vec<String>,
}

impl Repository {
    /// Repair the entries (those `specs` name, as restore names them; all
    /// when empty) whose stream file `verify --read-data` finds damaged or
    /// missing: from the source of [`RepairOptions::source`], else from
    /// `from` (see the module docs). Holds this repository's exclusive
    /// lock and `from`'s shared lock.
    ///
    /// # Errors
    ///
    /// Errors before any entry is tried (a lock, a catalog, the source, a
    /// name that matches nothing); per-entry failures are in
    /// [`RepairReport::failed`].
    pub fn repair(
        &self,
        from: Option<&Repository>,
        specs: &[String],
        opts: &RepairOptions,
        progress: &dyn Progress,
    ) -> Result<RepairReport, BackupError> {
        self.need_contents("repair")?;
        if opts.source.is_none() && from.is_none() {
            return Err(BackupError::Invalid(String::from(
                "repair needs a source (--device) or a second repository (--from)",
            )));
        }
        if let Some(f) = from {
            f.need_contents("repair")?;
            if f.config.id == self.config.id && f.store.name() == self.store.name() {
                return Err(BackupError::Invalid(format!(
                    "{}: repair --from needs another repository",
                    self.store.name()
                )));
            }
        }
        let _theirs = from
            .map(|f| f.lock(LockKind::Shared, opts.wait_lock, progress))
            .transpose()?;
        let _ours = self.lock(LockKind::Exclusive, opts.wait_lock, progress)?;
        let mut cat = self.catalog()?;
        let wanted: Option<BTreeSet<u64>> = if specs.is_empty() {
            None
        } else {
            Some(
                specs
                    .iter()
                    .map(|s| self.find(&cat, s).map(|e| e.id))
                    .collect::<Result<_, _>>()?,
            )
        };
        let found = self.verify_once(true, progress)?;
        let damaged: BTreeSet<u64> = found
            .problems
            .iter()
            .filter_map(|p| {
                let e = cat.get(p.entry?)?;
                (p.file.as_deref() == Some(e.file.as_str())).then_some(e.id)
            })
            .filter(|id| wanted.as_ref().is_none_or(|w| w.contains(id)))
            .collect();
        let mut rep = RepairReport {
            damaged: damaged.len(),
            ..RepairReport::default()
        };
        if damaged.is_empty() {
            return Ok(rep);
        }
        let mut src = opts.source.as_ref().map(OnSource::open).transpose()?;
        let theirs = from.map(|f| f.catalog().map(|c| (f, c))).transpose()?;
        for id in damaged {
            let Some(e) = cat.get(id).cloned() else {
                continue;
            };
            let mut tried = Vec::new();
            let mut done = None;
            if let Some(src) = src.as_mut() {
                match self.again_from_source(&cat, &e, src, opts, progress) {
                    Ok(made) => done = Some((String::from("source"), made)),
                    Err(err) => tried.push(format!("from the source: {err}")),
                }
            }
            if done.is_none()
                && let Some((f, fcat)) = &theirs
            {
                match self.again_from_repository(&e, f, fcat, opts, progress) {
                    Ok(made) => done = Some((f.store.name().to_owned(), made)),
                    Err(err) => tried.push(format!("from {}: {err}", f.store.name())),
                }
            }
            let Some((how, (file, size))) = done else {
                rep.failed.push(NotRepaired {
                    entry: e.id,
                    path: e.path.clone(),
                    why: tried.join("; "),
                });
                continue;
            };
            match self.switch(&mut cat, &e, &file, size, &mut rep.warnings) {
                Ok(()) => rep.repaired.push(Repaired {
                    entry: e.id,
                    path: e.path.clone(),
                    from: how,
                    file,
                }),
                Err(err) => {
                    let _ = self.store.delete(&file);
                    let fatal = matches!(err, BackupError::Catalog { .. });
                    rep.failed.push(NotRepaired {
                        entry: e.id,
                        path: e.path.clone(),
                        why: err.to_string(),
                    });
                    if fatal {
                        return Ok(rep);
                    }
                }
            }
        }
        Ok(rep)
    }

    /// Send `e`'s stream again from the source into a new stream file:
    /// its key and stored size, once its raw stream hashes to `e`'s.
    fn again_from_source(
        &self,
        cat: &Catalog,
        e: &Entry,
        src: &mut OnSource,
        opts: &RepairOptions,
        progress: &dyn Progress,
    ) -> Result<(String, u64), BackupError> {
        let (snap, parent) = src.snapshot_and_parent(cat, e).map_err(|why| {
            BackupError::Invalid(format!("{} cannot be sent again: {why}", e.path))
        })?;
        progress.start(&e.path, e.kind, e.stream_bytes);
        let key = super::new_stream_key(&e.uuid, e.ctransid);
        // A failed send drops the upload, which removes it.
        let upload = self.store.multipart(&key)?;
        let out = Counted {
            inner: FileWriter::new(upload, opts.writer()),
            progress,
        };
        let out = src.send_again(e, &snap, parent.as_ref(), out, progress)?;
        let (trailer, size) = out.inner.finish(identity(e))?;
        if trailer.stream_bytes != e.stream_bytes || trailer.stream_blake3 != e.stream_blake3 {
            let _ = self.store.delete(&key);
            return Err(BackupError::Invalid(format!(
                "the stream sent again is {} raw bytes with BLAKE3 {}, entry {} records {} with {}: not the stored stream (the snapshot's extents moved since, or a parent differs); try --from",
                trailer.stream_bytes, trailer.stream_blake3, e.id, e.stream_bytes, e.stream_blake3
            )));
        }
        Ok((key, size))
    }

    /// Copy `e`'s stream from `from`, whose entry for the same snapshot
    /// records the same raw stream, into a new stream file: its key and
    /// stored size.
    fn again_from_repository(
        &self,
        e: &Entry,
        from: &Repository,
        fcat: &Catalog,
        opts: &RepairOptions,
        progress: &dyn Progress,
    ) -> Result<(String, u64), BackupError> {
        let Some(theirs) = fcat.find(&e.uuid, e.ctransid) else {
            return Err(BackupError::Invalid(format!(
                "it has no entry for {} ctransid {}",
                e.uuid, e.ctransid
            )));
        };
        let diff = super::verify::entry_differences(e, theirs);
        if !diff.is_empty() {
            return Err(BackupError::Invalid(format!(
                "its entry {} records another stream: {}",
                theirs.id,
                diff.join("; ")
            )));
        }
        let parent = identity(e).parent;
        let (key, _trailer, size) =
            self.store_copy(from, theirs, parent, opts.writer(), progress)?;
        Ok((key, size))
    }

    /// Switch entry `e` to its repaired stream file `file` in a new
    /// catalog generation, its index with it, then delete the damaged
    /// file.
    fn switch(
        &self,
        cat: &mut Catalog,
        e: &Entry,
        file: &str,
        size: u64,
        warnings: &mut Vec<String>,
    ) -> Result<(), BackupError> {
        let old = e.file.clone();
        // The entry's own index root, under the new key first (nothing
        // names it until the catalog does).
        let own = self.moved_root(&old, &old, file);
        if let (Some(json), Some(key)) = (&own, root_key(file)) {
            self.store.put_if_absent(&key, json)?;
        }
        let mut next = cat.clone();
        for x in next.entries.iter_mut().filter(|x| x.id == e.id) {
            x.file = file.to_owned();
            x.stored_bytes = size;
        }
        next.commit(&*self.store)?;
        *cat = next;
        // The other indexes that read the stream.
        for x in &cat.entries {
            if x.id == e.id {
                continue;
            }
            let Some(json) = self.moved_root(&x.file, &old, file) else {
                continue;
            };
            let Some(key) = root_key(&x.file) else {
                continue;
            };
            let put = self
                .store
                .delete(&key)
                .and_then(|()| self.store.put_if_absent(&key, &json));
            if let Err(err) = put {
                warnings.push(format!(
                    "{key}: the index of entry {} could not be rewritten to read {file} ({err}): `btrsend backup index` builds it again",
                    x.id
                ));
            }
        }
        for key in [root_key(&old), Some(old.clone())].into_iter().flatten() {
            match self.store.delete(&key) {
                Ok(()) => {}
                Err(err) if err.is_not_found() => {}
                Err(err) => warnings.push(format!("{key}: not deleted: {err}")),
            }
        }
        Ok(())
    }

    /// The index root of stream `file`, its source `old` renamed `new`, as
    /// JSON (`None`: it has none, cannot be read, or does not read `old`).
    fn moved_root(&self, file: &str, old: &str, new: &str) -> Option<Vec<u8>> {
        let key = root_key(file)?;
        // An index that cannot be read is left to `backup index`.
        let bytes = self.store.get(&key, None).ok()?;
        let mut root: IndexRoot = serde_json::from_slice(&bytes).ok()?;
        if !root.sources.iter().any(|s| s == old) {
            return None;
        }
        for s in root.sources.iter_mut().filter(|s| *s == old) {
            new.clone_into(s);
        }
        serde_json::to_vec(&root).ok()
    }
}

/// What a stream file of `e` must begin with.
fn identity(e: &Entry) -> StreamIdentity {
    StreamIdentity {
        uuid: e.uuid.clone(),
        ctransid: e.ctransid,
        parent: e.parent_uuid.clone().zip(e.parent_ctransid),
    }
}
