//! `backup copy`: store in one repository the entries another holds and
//! it lacks, with everything their chains need, parents first (3-2-1: an
//! off-site copy made from the local repository, not from the source).
//!
//! Each stream is read from the source repository as restore reads it
//! (every frame's stored bytes against their hash, the raw stream against
//! the BLAKE3 its catalog records) and written through a new stream file
//! into the destination, as run writes it: so the two repositories may
//! have different stores, compression and keys, and the copy's own
//! trailer must hash to the source's value before its entry is listed. An
//! interrupted copy leaves what run leaves (entries copied are listed; the
//! stream being copied is an unfinished upload) and the next copy goes on
//! from there: the copied entries are found by uuid and ctransid, and the
//! unfinished stream file is continued after its kept part is checked
//! against the source's bytes (see [`partial`](super::partial)).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::time::Duration;

use super::catalog::{Catalog, Entry};
use super::error::BackupError;
use super::file::{self, Damage, FileWriter, ReadError, StreamIdentity, WriterOptions};
use super::frames;
use super::lock::LockKind;
use super::repository::{Repository, now_rfc3339};
use super::restore::ChainReader;
use super::run::Counted;
use super::run::unfinished::{Resumed, VerifyHead};
use super::treehash::TreeHasher;
use super::verify::{either_synthesized, entry_differences};
use crate::progress::{NoProgress, Progress};

/// How to copy.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CopyOptions {
    /// Wait this long for either repository's lock.
    pub wait_lock: Duration,
    /// The zstd level of the stream files written.
    pub level: i32,
    /// Raw bytes per frame of the stream files written (tests use small
    /// ones).
    pub frame_bytes: usize,
}

impl CopyOptions {
    /// Defaults: no waiting, level 3, 4 MiB frames (as run).
    pub fn new() -> CopyOptions {
        CopyOptions {
            wait_lock: Duration::ZERO,
            level: 3,
            frame_bytes: WriterOptions::new().frame_bytes,
        }
    }

    /// Set [`CopyOptions::wait_lock`].
    pub fn with_wait_lock(mut self, d: Duration) -> CopyOptions {
        self.wait_lock = d;
        self
    }

    /// Set [`CopyOptions::level`].
    pub fn with_level(mut self, l: i32) -> CopyOptions {
        self.level = l;
        self
    }

    /// Set [`CopyOptions::frame_bytes`].
    pub fn with_frame_bytes(mut self, n: usize) -> CopyOptions {
        self.frame_bytes = n.max(1);
        self
    }
}

impl Default for CopyOptions {
    fn default() -> CopyOptions {
        CopyOptions::new()
    }
}

/// What a copy did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct CopyReport {
    /// The entries stored in the destination (their ids there).
    pub copied: Vec<Entry>,
    /// Entries the destination held already (path, id in the source).
    pub present: Vec<(String, u64)>,
    /// Entries that could not be copied (path, why); an entry whose parent
    /// failed fails too.
    pub failed: Vec<(String, BackupError)>,
}

impl Repository {
    /// Copy into this repository the entries `from` holds that it lacks:
    /// those `specs` name (as restore names them; all when empty) and
    /// every ancestor their chains need, oldest first. An entry both hold
    /// must record the same stream (else it is a failure, and nothing is
    /// copied on top of it). Holds this repository's exclusive lock and
    /// `from`'s shared lock.
    ///
    /// # Errors
    ///
    /// Errors before any entry is tried (a lock, a catalog, a name that
    /// matches nothing, a key that cannot read `from`'s streams);
    /// per-entry failures are in [`CopyReport::failed`].
    pub fn copy_from(
        &self,
        from: &Repository,
        specs: &[String],
        opts: &CopyOptions,
        progress: &dyn Progress,
    ) -> Result<CopyReport, BackupError> {
        from.need_contents("copy")?;
        if from.config.id == self.config.id && from.store.name() == self.store.name() {
            return Err(BackupError::Invalid(format!(
                "{}: copy needs two repositories, --from and --to name the same one",
                self.store.name()
            )));
        }
        let _theirs = from.lock(LockKind::Shared, opts.wait_lock, progress)?;
        let _ours = self.lock(LockKind::Exclusive, opts.wait_lock, progress)?;
        let src = from.catalog()?;
        let mut cat = self.catalog()?;
        let mut report = CopyReport::default();

        // The entries asked for and their chains, by source id: a parent's
        // id is below its child's (the catalog checks it), so id order is
        // parents first.
        let mut wanted: BTreeSet<u64> = BTreeSet::new();
        let asked: Vec<&Entry> = if specs.is_empty() {
            src.entries.iter().collect()
        } else {
            specs
                .iter()
                .map(|s| from.find(&src, s))
                .collect::<Result<_, _>>()?
        };
        for e in asked {
            match src.chain(e.id) {
                Ok(chain) => wanted.extend(chain.iter().map(|c| c.id)),
                Err(missing) => report.failed.push((
                    e.path.clone(),
                    BackupError::Catalog {
                        repo: from.store.name().to_owned(),
                        what: format!(
                            "entry {} ({}) cannot be copied: its chain needs entry {missing}, which is not in the catalog",
                            e.id, e.path
                        ),
                    },
                )),
            }
        }
        let todo: BTreeSet<(String, u64)> = wanted
            .iter()
            .filter_map(|id| src.get(*id))
            .filter(|e| cat.find(&e.uuid, e.ctransid).is_none())
            .map(|e| (e.uuid.clone(), e.ctransid))
            .collect();
        // What an interrupted copy left of the streams still to copy
        // stays, to be continued.
        self.clean_leftovers(&cat, &|u, c| todo.contains(&(u.to_owned(), c)), progress)?;
        let raw: u64 = wanted
            .iter()
            .filter_map(|id| src.get(*id))
            .filter(|e| todo.contains(&(e.uuid.clone(), e.ctransid)))
            .map(|e| e.stream_bytes)
            .sum();
        progress.plan(todo.len(), raw);

        // Source ids whose copy failed: their descendants cannot be copied.
        let mut broken: BTreeMap<u64, String> = BTreeMap::new();
        for id in wanted {
            let Some(e) = src.get(id) else { continue };
            if let Some(p) = e.parent_id
                && let Some(why) = broken.get(&p)
            {
                let why = format!("its parent entry {p} was not copied ({why})");
                broken.insert(e.id, why.clone());
                report.failed.push((
                    e.path.clone(),
                    BackupError::Invalid(format!("{}: {why}", e.path)),
                ));
                continue;
            }
            if let Some(have) = cat.find(&e.uuid, e.ctransid) {
                let diff = entry_differences(e, have);
                // A synthetic full stream on either side is another
                // proven stream of the same snapshot: the entries based
                // on it apply to either.
                if diff.is_empty() || either_synthesized(e, have) {
                    progress.skipped(&e.path, have);
                    report.present.push((e.path.clone(), e.id));
                } else {
                    let err = BackupError::Catalog {
                        repo: self.store.name().to_owned(),
                        what: format!(
                            "entry {} records another stream of {} ctransid {} than entry {} of {}: {}",
                            have.id,
                            e.uuid,
                            e.ctransid,
                            e.id,
                            from.store.name(),
                            diff.join("; ")
                        ),
                    };
                    progress.failed(&e.path, &err);
                    broken.insert(e.id, err.to_string());
                    report.failed.push((e.path.clone(), err));
                }
                continue;
            }
            match self.copy_one(from, e, &mut cat, opts, progress) {
                Ok(new) => {
                    progress.stored(&new);
                    report.copied.push(new);
                }
                Err(err) => {
                    progress.failed(&e.path, &err);
                    let fatal = err.is_lock_held() || matches!(err, BackupError::Catalog { .. });
                    broken.insert(e.id, err.to_string());
                    report.failed.push((e.path.clone(), err));
                    if fatal {
                        return Ok(report);
                    }
                }
            }
        }
        Ok(report)
    }

    /// Copy one entry whose parent (if any) this repository holds.
    fn copy_one(
        &self,
        from: &Repository,
        e: &Entry,
        cat: &mut Catalog,
        opts: &CopyOptions,
        progress: &dyn Progress,
    ) -> Result<Entry, BackupError> {
        let parent = match (&e.parent_uuid, e.parent_ctransid) {
            (Some(u), Some(c)) => Some(cat.find(u, c).cloned().ok_or_else(|| {
                BackupError::Invalid(format!(
                    "{}: its parent {u} ctransid {c} is not in {}",
                    e.path,
                    self.store.name()
                ))
            })?),
            _ => None,
        };
        let parent_id = parent.as_ref().map(|p| (p.uuid.clone(), p.ctransid));
        let wopts = WriterOptions::new()
            .with_level(opts.level)
            .with_frame_bytes(opts.frame_bytes);
        let (file, trailer, size) = self.store_copy(from, e, parent_id, wopts, progress)?;
        let entry = Entry {
            id: 0,
            parent_id: parent.as_ref().map(|p| p.id),
            file,
            stored_bytes: size,
            commands: trailer.commands,
            proto: trailer.proto,
            stored_at: now_rfc3339(),
            ..e.clone()
        };
        let mut next = cat.clone();
        let id = next.add(entry);
        next.commit(&*self.store)?;
        *cat = next;
        cat.get(id)
            .cloned()
            .ok_or_else(|| BackupError::Invalid(String::from("entry vanished")))
    }

    /// Store `from`'s stream of `e` (whose parent snapshot is `parent_id`)
    /// as a new stream file here, every byte read checked against its
    /// hash and the copy's raw stream against `e`'s BLAKE3: its key, its
    /// trailer and its stored size. Nothing is listed; a copy that does
    /// not hash to `e`'s value is deleted.
    ///
    /// # Errors
    ///
    /// Damage in `from`'s file, store errors, a copy that differs.
    pub(super) fn store_copy(
        &self,
        from: &Repository,
        e: &Entry,
        parent_id: Option<(String, u64)>,
        wopts: WriterOptions,
        progress: &dyn Progress,
    ) -> Result<(String, file::Trailer, u64), BackupError> {
        let damage = |d: Damage| BackupError::Damage {
            repo: from.store.name().to_owned(),
            damage: Box::new(d),
        };
        let read_err = |err: ReadError| match err {
            ReadError::Damage(d) => damage(d),
            ReadError::Store(s) => BackupError::Store(s),
        };
        // The trailer against the entry, the first command against the
        // entry's snapshot and parent: what the copy's entry records is
        // then what the stream is.
        let f = from.open_file(e)?;
        from.check_ident(e, &f)?;
        progress.start(&e.path, e.kind, e.stream_bytes);
        let key = super::new_stream_key(&e.uuid, e.ctransid);
        let files = [f];
        let work = frames::Work {
            hash: true,
            decompress: true,
            decode: false,
        };
        // The source's raw stream, every frame and the whole stream
        // checked, into `out`.
        let pour = |out: &mut dyn Write| -> Result<(), BackupError> {
            let found = std::sync::Mutex::new(None);
            frames::read_ahead(&*from.store, &files, work, |ahead| {
                let mut input = ChainReader::new(ahead, &files, &found, &NoProgress);
                io::copy(&mut input, out).map(|_| ())
            })
            .map_err(|err| match found.lock().ok().and_then(|mut d| d.take()) {
                Some(d) => damage(d),
                None => match file::into_read_error(err) {
                    Ok(r) => read_err(r),
                    Err(err) => BackupError::Io {
                        what: format!("cannot copy {} into {}", e.path, self.store.name()),
                        error: err,
                    },
                },
            })
        };
        let mut partial = self.find_partial(&e.uuid, e.ctransid, parent_id.as_ref(), progress);
        let mut file = key.clone();
        let writer = loop {
            let Some((tmp, scan)) = partial.take() else {
                file.clone_from(&key);
                let mut upload = self.store.multipart(&key)?;
                upload.keep_when_dropped();
                let mut counted = Counted {
                    inner: FileWriter::new(upload, wopts),
                    progress,
                };
                pour(&mut counted)?;
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
                Err(err) => {
                    self.discard_partial(&tmp, &err.to_string(), progress);
                    continue;
                }
            };
            upload.keep_when_dropped();
            // The partial file's kept part must hash to the source's first
            // bytes before anything is appended (as run checks it against
            // its send).
            let differs = std::cell::Cell::new(false);
            let mut out = VerifyHead {
                inner: Counted {
                    inner: FileWriter::continued(upload, wopts, scan.kept.clone()),
                    progress,
                },
                left: scan.kept.raw_bytes,
                hasher: TreeHasher::new(),
                expected: scan.kept.hasher.finalize(),
                differs: &differs,
                resumed: Some(Resumed {
                    path: &e.path,
                    stream_bytes: scan.kept.raw_bytes,
                    stored_bytes: scan.kept.stored_bytes,
                }),
                progress,
            };
            match pour(&mut out) {
                Ok(()) => break out.inner.inner,
                Err(_) if differs.get() => {
                    self.discard_partial(&tmp, "its bytes are not the stream copied", progress);
                }
                Err(err) => return Err(err),
            }
        };
        let (trailer, size) = writer.finish(StreamIdentity {
            uuid: e.uuid.clone(),
            ctransid: e.ctransid,
            parent: parent_id,
        })?;
        // The pour checked the source's bytes; this checks what was
        // written, before the entry is listed.
        if trailer.stream_bytes != e.stream_bytes || trailer.stream_blake3 != e.stream_blake3 {
            let _ = self.store.delete(&file);
            return Err(BackupError::Invalid(format!(
                "{}: the copy has {} raw bytes with BLAKE3 {}, the source's entry {} records {} with {}",
                e.path,
                trailer.stream_bytes,
                trailer.stream_blake3,
                e.id,
                e.stream_bytes,
                e.stream_blake3
            )));
        }
        Ok((file, trailer, size))
    }
}
