//! Synthetic full streams: an incremental entry's stream replaced by a
//! full stream of the same snapshot, made from the repository alone, so
//! that the entries before it in its chain can go.
//!
//! The stream is written from the entry's index ([`index::synth`]): the
//! chain applied to a model of the tree, its file data read from the
//! chain's streams. It is an ordinary full stream of the snapshot: its
//! SUBVOL carries the snapshot's name (as the entry's own stream names
//! it), UUID and ctransid, so the chain's later incremental streams find
//! their parent in whatever receives it, as they found the one the old
//! chain made. It differs from the kernel's full stream of the snapshot
//! in two ways, both invisible to a manifest: data the snapshot shares
//! between files (reflinks, clones) is written once per file, with no
//! CLONE; and the access time of each path is its modification time (the
//! index keeps only the latter).
//!
//! The stream is stored like any stream (compressed, sealed and, in an
//! encrypted repository, encrypted), and indexed while it is written.
//! Before it counts, it is proven: the index it made (the stream applied
//! to an empty tree, its data read back from the stored file) must hold
//! exactly the tree the chain's index holds, path for path and byte for
//! byte ([`index::proof`]); a stream that fails is deleted and the entry
//! stays as it was. Only then may the caller store a catalog in which the
//! entry names the new stream (same id, `full`, with `synthesized_from`)
//! and delete what it replaces: a crash before that catalog leaves a
//! stream file no entry names, which the next `forget` or `run` removes.

use stream_format::{Command, StreamReader, StreamWriter};

use super::catalog::{Catalog, Entry, Kind};
use super::error::BackupError;
use super::file::format::hyphenated;
use super::file::{FileWriter, StreamIdentity, WriterOptions};
use super::index;
use super::index::proof::{self, TreeDigest};
use super::index::synth::{self, Head};
use super::index::{IndexError, IndexTee};
use super::repository::{Repository, now_rfc3339};
use crate::progress::Progress;

/// zstd level of synthetic streams (the default of `run`).
const LEVEL: i32 = 3;

/// The steps of a synthesizing `forget` or `synthesize` at which a test
/// can have the process stop for good (`BTRSEND_TEST_PAUSE_SYNTH=STEP`),
/// to kill it there: every window between two durable changes.
pub const PAUSE_STEPS: &[&str] = &[
    "start",
    "stored",
    "proven",
    "committed",
    "replaced",
    "reindexed",
];

/// A test hook: when `BTRSEND_TEST_PAUSE_SYNTH` names `step`, say so on
/// standard error and stop here until killed.
pub(crate) fn pause(step: &str) {
    if std::env::var("BTRSEND_TEST_PAUSE_SYNTH").is_ok_and(|s| s == step) {
        eprintln!("btrsend: test pause at {step}");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// A synthetic full stream made for an entry, not yet in the catalog.
#[derive(Debug, Clone)]
pub struct Synthesized {
    /// The entry as the catalog is to hold it: full, naming the new
    /// stream file.
    pub entry: Entry,
    /// The entry as it was.
    pub old: Entry,
    /// Paths and bytes of file data the stream carries.
    pub paths: u64,
    /// Bytes of file data.
    pub data_bytes: u64,
}

impl Catalog {
    /// The catalog with `s`'s entry replacing the one of its id.
    pub(crate) fn with_synthesized(&self, s: &Synthesized) -> Catalog {
        let mut next = self.clone();
        for e in &mut next.entries {
            if e.id == s.entry.id {
                *e = s.entry.clone();
            }
        }
        next
    }
}

impl Repository {
    /// Make, store and prove a synthetic full stream of entry `id` of
    /// `cat` (see the module docs); the caller holds the exclusive lock
    /// and stores the catalog. The chain's missing indexes are built
    /// first.
    ///
    /// # Errors
    ///
    /// The entry is unknown or full already; a chain that cannot be
    /// indexed or read; a stream that fails its proof
    /// ([`BackupError::Invalid`]); store errors.
    pub fn synthesize_full(
        &self,
        cat: &Catalog,
        id: u64,
        progress: &dyn Progress,
    ) -> Result<Synthesized, BackupError> {
        self.need_contents("synthesizing a full stream")?;
        let name = self.store().name().to_owned();
        let old = cat
            .get(id)
            .ok_or_else(|| BackupError::Invalid(format!("{name}: no entry {id}")))?
            .clone();
        if old.kind == Kind::Full {
            return Err(BackupError::Invalid(format!(
                "{name}: entry {id} ({}) is a full stream already",
                crate::manifest::escape(old.path.as_bytes())
            )));
        }
        let chain: Vec<u64> = cat
            .chain(id)
            .map_err(|missing| {
                BackupError::Invalid(format!("{name}: entry {id}'s chain lacks entry {missing}"))
            })?
            .iter()
            .map(|e| e.id)
            .collect();
        self.index_chain(cat, &chain, progress)?;
        let head_name = self.subvolume_name(&old)?;
        let key = super::new_stream_key(&old.uuid, old.ctransid);
        progress.notice(&format!(
            "synthesizing a full stream of entry {id} ({}) from {} stream(s)",
            crate::manifest::escape(old.path.as_bytes()),
            chain.len()
        ));
        pause("start");
        let made = self.write_synthetic(cat, &old, &head_name, &key);
        let (entry, root, digest, written) = match made {
            Ok(m) => m,
            Err(e) => {
                let _ = self.store().delete(&key);
                return Err(e);
            }
        };
        pause("stored");
        let entry = Entry {
            synthesized_from: Some(chain),
            ..entry
        };
        let s = Synthesized {
            entry,
            old,
            paths: digest.paths(),
            data_bytes: written.bytes,
        };
        if let Err(e) = self.prove(cat, &s, root, &digest) {
            let _ = self.store().delete(&key);
            return Err(e);
        }
        pause("proven");
        Ok(s)
    }

    /// Build the indexes of `chain`'s entries that have none.
    fn index_chain(
        &self,
        cat: &Catalog,
        chain: &[u64],
        progress: &dyn Progress,
    ) -> Result<(), BackupError> {
        let mut todo = Vec::new();
        for id in chain {
            let Some(e) = cat.get(*id) else { continue };
            match self.index_root(cat, e) {
                Ok(_) => {}
                Err(BackupError::Store(s)) if s.is_not_found() => todo.push(e),
                Err(err) => return Err(err),
            }
        }
        if todo.is_empty() {
            return Ok(());
        }
        let mut report = index::repo::IndexReport::default();
        self.index_entries(cat, &todo, &mut report, progress);
        match report.failed.first() {
            None => Ok(()),
            Some((id, why)) => Err(BackupError::Invalid(format!(
                "{}: entry {id} cannot be indexed, so no full stream can be made from its chain: {why}",
                self.store().name()
            ))),
        }
    }

    /// The subvolume name `e`'s own stream gives its snapshot.
    fn subvolume_name(&self, e: &Entry) -> Result<Vec<u8>, BackupError> {
        let f = self.open_file(e)?;
        let mut r = StreamReader::new(f.raw_reader(&**self.store()));
        let bad = |what: String| BackupError::Invalid(format!("{}: {what}", e.file));
        match r.next_command() {
            Ok(Some((_, Command::Snapshot { path, .. } | Command::Subvol { path, .. }))) => {
                Ok(path.into_owned())
            }
            Ok(_) => Err(bad("does not start with SUBVOL or SNAPSHOT".into())),
            Err(err) => Err(bad(format!("not a send stream: {err}"))),
        }
    }

    /// Write the synthetic stream of `old` to `key`, indexing it as it
    /// goes: the entry it makes (without `synthesized_from`), its index,
    /// the digest of the chain's tree, what it carried.
    fn write_synthetic(
        &self,
        cat: &Catalog,
        old: &Entry,
        head_name: &[u8],
        key: &str,
    ) -> Result<(Entry, index::IndexRoot, TreeDigest, synth::Written), BackupError> {
        let what = format!("entry {} ({})", old.id, old.path);
        let index_err = |error: IndexError| BackupError::Index {
            what: what.clone(),
            error: Box::new(error),
        };
        let uuid = uuid::Uuid::try_parse(&old.uuid)
            .map_err(|_| BackupError::Invalid(format!("{what}: its uuid does not parse")))?
            .into_bytes();
        let upload = self.store().multipart(key)?;
        let mut inline = self.inline_index(cat, key, None).ok_or_else(|| {
            BackupError::Invalid(format!("{what}: cannot start indexing the new stream"))
        })?;
        let mut tee = IndexTee {
            inner: FileWriter::new(upload, WriterOptions::new().with_level(LEVEL)),
            index: Some(&mut inline),
        };
        let mut digest = TreeDigest::new();
        let written = self.with_index(cat, old, |snap, data| {
            let mut w = StreamWriter::new(&mut tee, 1)
                .map_err(|e| index_err(IndexError::Output(e.to_string())))?;
            let head = Head {
                name: head_name,
                uuid,
                ctransid: old.ctransid,
            };
            let written =
                synth::write_proved(snap, data, head, &mut w, &mut digest).map_err(index_err)?;
            w.flush()
                .map_err(|e| index_err(IndexError::Output(e.to_string())))?;
            Ok(written)
        })?;
        let writer = tee.inner;
        let (trailer, size) = writer.finish(StreamIdentity {
            uuid: old.uuid.clone(),
            ctransid: old.ctransid,
            parent: None,
        })?;
        let (made, root) = inline.finish().map_err(index_err)?;
        if !hyphenated(&made).eq_ignore_ascii_case(&old.uuid) {
            return Err(BackupError::Invalid(format!(
                "{what}: the synthetic stream indexed as another snapshot"
            )));
        }
        let entry = Entry {
            parent_uuid: None,
            parent_ctransid: None,
            parent_id: None,
            kind: Kind::Full,
            file: key.to_owned(),
            stream_bytes: trailer.stream_bytes,
            stored_bytes: size,
            stream_blake3: trailer.stream_blake3,
            commands: trailer.commands,
            proto: trailer.proto,
            stored_at: now_rfc3339(),
            ..old.clone()
        };
        Ok((entry, root, digest, written))
    }

    /// Check that the index the new stream made holds the tree the chain
    /// gave (`want`), its data read back from the stored stream; store
    /// that index as the new entry's.
    fn prove(
        &self,
        cat: &Catalog,
        s: &Synthesized,
        root: index::IndexRoot,
        want: &TreeDigest,
    ) -> Result<(), BackupError> {
        let what = format!("entry {} ({})", s.old.id, s.old.path);
        let index_err = |error: IndexError| BackupError::Index {
            what: what.clone(),
            error: Box::new(error),
        };
        let next = cat.with_synthesized(s);
        let differs = self.with_index_root(&next, root.clone(), |snap, data| {
            let got = proof::digest(snap, data).map_err(index_err)?;
            if got.finish() == want.finish() {
                return Ok(None);
            }
            let at = self
                .with_index(cat, &s.old, |old, old_data| {
                    proof::first_difference((old, old_data), (snap, data)).map_err(index_err)
                })
                .ok()
                .flatten();
            Ok(Some(match at {
                Some(p) => format!("first at {}", crate::manifest::escape(&p)),
                None => format!("{} paths against {}", got.paths(), want.paths()),
            }))
        })?;
        if let Some(how) = differs {
            return Err(BackupError::Invalid(format!(
                "{}: the synthetic full stream of {what} does not hold the snapshot its chain holds ({how}); it was not kept",
                self.store().name(),
            )));
        }
        self.put_index_root(&s.entry, &root)
    }
}

impl Repository {
    /// `backup synthesize`: replace the incremental stream of stored
    /// snapshot `spec` by a synthetic full stream (see the module docs),
    /// under the exclusive lock. Its ancestors stay: the next `forget`
    /// deletes those its policy drops and no other kept entry needs.
    ///
    /// # Errors
    ///
    /// [`BackupError::NoSuchSnapshot`], a full entry, a catalog the
    /// streams do not confirm; what [`Repository::synthesize_full`]
    /// returns; lock, catalog and store errors.
    pub fn synthesize(
        &self,
        spec: &str,
        wait: std::time::Duration,
        progress: &dyn Progress,
    ) -> Result<Synthesized, BackupError> {
        self.need_contents("synthesizing a full stream")?;
        if self.store().append_only() {
            return Err(BackupError::Invalid(format!(
                "{} is served append-only: a stream stored there cannot be replaced from here",
                self.store().name()
            )));
        }
        let _lock = self.lock(super::LockKind::Exclusive, wait, progress)?;
        let cat = self.catalog()?;
        let id = self.find(&cat, spec)?.id;
        // The old stream file is deleted by the catalog's links.
        self.check_structure(&cat)?;
        let s = self.synthesize_full(&cat, id, progress)?;
        let mut next = cat.with_synthesized(&s);
        next.commit(&**self.store())?;
        pause("committed");
        let _ = self.store().delete(&s.old.file);
        pause("replaced");
        self.refresh_stale_indexes(&next, progress)?;
        pause("reindexed");
        if let Some(why) = self.sweep_indexes(&next, true)?.skipped {
            progress.warning(&why);
        }
        Ok(s)
    }
}
