//! Indexes in a repository: pages and roots as objects, the streams as
//! the data source, and `backup index`, which builds what is missing.
//!
//! ```text
//! REPO/index/kHEX                   a pack: the pages one flush made, each zstd of its bytes
//! REPO/index/pHEX                   a page of its own (indexes made before packs)
//! REPO/index/rNAME.json             the root of the index of the stream streams/NAME.btrs.zst
//! ```
//!
//! In an encrypted repository roots are sealed as catalogs are (under the
//! write key, bound to their object key), and so is each page in a pack,
//! on its own (bound to its page's name: one page is read with one ranged
//! read); page and pack names are keyed by a key derived from the write
//! key, so neither contents nor equal pages show to the storage.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Read;
use std::rc::Rc;

use super::IndexError;
use super::apply::{IndexRoot, Snapshots, index_stream};
use super::read::{DataSource, Snapshot};
use super::tree::{PackId, PageId, PageRef, PageStore, Pages, Place};
use crate::backup::catalog::Catalog;
use crate::backup::crypt::seal::SealKey;
use crate::backup::entry::Entry;
use crate::backup::file::StreamFile;
use crate::backup::lock::LockKind;
use crate::backup::store::{Store, StoreError, check_key};
use crate::backup::{BackupError, Repository, STREAMS_DIR};
use crate::progress::Progress;

/// Where index objects live.
pub const INDEX_DIR: &str = "index/";

/// The largest page a store may hand back once decompressed (pages are
/// at most a few times [`MAX_PAGE`](super::tree)'s 16 KiB; an entry alone
/// may be 64 KiB of xattr).
const MAX_PAGE_BYTES: usize = 1 << 20;

/// Decompressed frames kept while reading file data, the least recently
/// used dropped first: reading a snapshot's files in path order reads
/// each stream of its chain forward, so one frame a stream is what
/// stays hot (a chain of ten streams thrashed a cache of 4, 2026-11-29).
const FRAME_CACHE: usize = 12;

fn hex(b: &[u8]) -> String {
    super::hex(b)
}

/// The key of page `id` as an object of its own (indexes made before
/// packs), and the name a sealed page in a pack is bound to.
pub fn page_key(id: &PageId) -> String {
    format!("{INDEX_DIR}p{}", hex(id))
}

/// What the keys of packs start with.
pub const PACK_PREFIX: &str = "index/k";

/// The key of pack `id`.
pub fn pack_key(id: &PackId) -> String {
    format!("{PACK_PREFIX}{}", hex(id))
}

/// The largest stored page a pack's reference may name.
const MAX_BLOB: u64 = 2 << 20;

/// The key of the root of the index of the stream `file`
/// (`streams/NAME.btrs.zst`).
pub fn root_key(file: &str) -> Option<String> {
    let name = file.strip_prefix(STREAMS_DIR)?.strip_suffix(".btrs.zst")?;
    Some(format!("{INDEX_DIR}r{name}.json"))
}

/// What seals each page of a pack in an encrypted repository: the key
/// and the repository's name the seal binds to.
#[derive(Clone)]
pub(super) struct Sealer {
    key: SealKey,
    repo: String,
}

/// A repository's store as a page store.
pub(super) struct StorePages<'r> {
    pub(super) store: &'r dyn Store,
    seal: Option<Sealer>,
    /// One compressor for every page (a context a page costs more than
    /// the page).
    zstd: RefCell<Option<zstd::bulk::Compressor<'static>>>,
}

impl PageStore for StorePages<'_> {
    fn get(&self, r: &PageRef) -> Result<Vec<u8>, IndexError> {
        let id = &r.id;
        let missing = |e: StoreError| match e.is_not_found() {
            true => IndexError::MissingPage { id: *id },
            false => IndexError::Store(e.to_string()),
        };
        match r.place {
            // Sealed whole, when sealed: the store opens it.
            Place::Object => {
                let z = self.store.get(&page_key(id), None).map_err(missing)?;
                unpack(id, &z)
            }
            Place::Packed { pack, offset, len } => {
                if len == 0 || len > MAX_BLOB {
                    return Err(IndexError::Page {
                        id: *id,
                        reason: format!("a reference to {len} stored bytes"),
                    });
                }
                let end = offset.checked_add(len).ok_or_else(|| IndexError::Page {
                    id: *id,
                    reason: "a reference past 2^64".into(),
                })?;
                let blob = self
                    .store
                    .get(&pack_key(&pack), Some(offset..end))
                    .map_err(missing)?;
                self.page_of_blob(id, &blob)
            }
            Place::Here { .. } => Err(IndexError::MissingPage { id: *id }),
        }
    }

    fn blob(&self, id: &PageId, page: &[u8]) -> Result<Vec<u8>, IndexError> {
        let mut zstd = self.zstd.borrow_mut();
        let c = match &mut *zstd {
            Some(c) => c,
            None => zstd.insert(
                zstd::bulk::Compressor::new(3).map_err(|e| IndexError::Store(e.to_string()))?,
            ),
        };
        let z = c
            .compress(page)
            .map_err(|e| IndexError::Store(e.to_string()))?;
        match &self.seal {
            None => Ok(z),
            Some(s) => s
                .key
                .seal(&s.repo, &page_key(id), &z)
                .map_err(IndexError::Store),
        }
    }

    fn put_pack(&self, name: &PackId, bytes: Vec<u8>, _: &[PageRef]) -> Result<(), IndexError> {
        self.store
            .put_if_absent(&pack_key(name), &bytes)
            .map(drop)
            .map_err(|e| IndexError::Store(e.to_string()))
    }
}

impl<'r> StorePages<'r> {
    /// The pages in `store`, sealed with `seal` (an encrypted repository).
    pub(super) fn new(store: &'r dyn Store, seal: Option<Sealer>) -> StorePages<'r> {
        StorePages {
            store,
            seal,
            zstd: RefCell::new(None),
        }
    }

    /// The bytes of page `id` from its blob in a pack (see
    /// [`PageStore::blob`]).
    pub(super) fn page_of_blob(&self, id: &PageId, blob: &[u8]) -> Result<Vec<u8>, IndexError> {
        match &self.seal {
            None => unpack(id, blob),
            Some(s) => {
                let z = s
                    .key
                    .open(&s.repo, &page_key(id), blob)
                    .map_err(|e| IndexError::Page {
                        id: *id,
                        reason: e.to_string(),
                    })?;
                unpack(id, &z)
            }
        }
    }
}

/// Page `id`'s bytes from their zstd, bounded.
fn unpack(id: &PageId, z: &[u8]) -> Result<Vec<u8>, IndexError> {
    let mut out = Vec::new();
    zstd::Decoder::new(z)
        .and_then(|d| d.take(MAX_PAGE_BYTES as u64 + 1).read_to_end(&mut out))
        .map_err(|e| IndexError::Page {
            id: *id,
            reason: format!("does not decompress: {e}"),
        })?;
    if out.len() > MAX_PAGE_BYTES {
        return Err(IndexError::Page {
            id: *id,
            reason: "larger than any page".into(),
        });
    }
    Ok(out)
}

/// A decompressed frame: its file, its number, its raw bytes.
type CachedFrame = (String, usize, Rc<Vec<u8>>);

/// The raw streams of a repository, read frame by frame.
pub struct RepoData<'r> {
    repo: &'r Repository,
    cat: &'r Catalog,
    /// Stream files opened so far, with the raw offset each frame starts at.
    files: RefCell<HashMap<String, (StreamFile, Vec<u64>)>>,
    /// Recently decompressed frames: (file, frame, bytes).
    frames: RefCell<Vec<CachedFrame>>,
    /// Stored bytes read so far.
    read: RefCell<u64>,
}

impl<'r> RepoData<'r> {
    fn new(repo: &'r Repository, cat: &'r Catalog) -> RepoData<'r> {
        RepoData {
            repo,
            cat,
            files: RefCell::new(HashMap::new()),
            frames: RefCell::new(Vec::new()),
            read: RefCell::new(0),
        }
    }

    /// Stored bytes read from stream objects so far.
    pub fn bytes_read(&self) -> u64 {
        *self.read.borrow()
    }

    fn frame(&self, file: &StreamFile, i: usize) -> Result<Rc<Vec<u8>>, IndexError> {
        {
            let mut frames = self.frames.borrow_mut();
            if let Some(at) = frames
                .iter()
                .position(|(k, n, _)| *k == file.key && *n == i)
            {
                let hit = frames.remove(at);
                let b = Rc::clone(&hit.2);
                frames.push(hit);
                return Ok(b);
            }
        }
        let bad = |e: String| IndexError::Data {
            path: file.key.clone(),
            reason: e,
        };
        let stored = file
            .read_frame(&**self.repo.store(), i)
            .map_err(|e| bad(e.to_string()))?;
        *self.read.borrow_mut() += stored.len() as u64;
        let raw = Rc::new(
            file.decompress(i, &stored)
                .map_err(|e| bad(e.to_string()))?,
        );
        let mut frames = self.frames.borrow_mut();
        if frames.len() >= FRAME_CACHE {
            frames.remove(0);
        }
        frames.push((file.key.clone(), i, Rc::clone(&raw)));
        Ok(raw)
    }
}

impl DataSource for RepoData<'_> {
    fn read(&self, source: &str, offset: u64, buf: &mut [u8]) -> Result<(), IndexError> {
        let bad = |reason: String| IndexError::Data {
            path: source.to_owned(),
            reason,
        };
        if !self.files.borrow().contains_key(source) {
            let e = self
                .cat
                .entries
                .iter()
                .find(|e| e.file == source)
                .ok_or_else(|| bad("no entry of the catalog has this stream".into()))?;
            let f = self.repo.open_file(e).map_err(|e| bad(e.to_string()))?;
            let mut starts = Vec::with_capacity(f.trailer.frames.len());
            let mut at = 0u64;
            for fr in &f.trailer.frames {
                starts.push(at);
                at = at.saturating_add(fr.raw_len);
            }
            self.files
                .borrow_mut()
                .insert(source.to_owned(), (f, starts));
        }
        let files = self.files.borrow();
        // OK: inserted above.
        let (file, starts) = &files[source];
        let mut pos = offset;
        let mut done = 0usize;
        while done < buf.len() {
            let i = starts.partition_point(|&s| s <= pos).saturating_sub(1);
            let raw = self.frame(file, i)?;
            let within = usize::try_from(pos - starts[i]).unwrap_or(usize::MAX);
            let have = raw
                .get(within..)
                .filter(|r| !r.is_empty())
                .ok_or_else(|| bad(format!("no data at raw offset {pos}")))?;
            let n = have.len().min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&have[..n]);
            done += n;
            pos += n as u64;
        }
        Ok(())
    }
}

/// What `backup index` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexReport {
    /// Entries indexed now.
    pub built: Vec<u64>,
    /// Entries whose index was whole already.
    pub present: usize,
    /// Entries whose index was damaged and was built again.
    pub rebuilt: Vec<u64>,
    /// Entries that could not be indexed, and why.
    pub failed: Vec<(u64, String)>,
}

/// The indexes of the catalog's entries, for CLONE sources and parents.
pub(super) struct CatalogIndexes<'a> {
    pub(super) repo: &'a Repository,
    pub(super) cat: &'a Catalog,
}

impl Snapshots for CatalogIndexes<'_> {
    fn index_of(&self, uuid: &[u8; 16]) -> Option<IndexRoot> {
        let want = crate::backup::file::format::hyphenated(uuid);
        let e = self.cat.entries.iter().rev().find(|e| e.uuid == want)?;
        self.repo.index_root(self.cat, e).ok()
    }
}

impl Repository {
    /// The name key of index pages: secret in an encrypted repository.
    pub(super) fn page_name_key(&self) -> [u8; 32] {
        match &self.keys {
            Some(k) => k.write.derive_index_key(),
            None => [0; 32],
        }
    }

    /// What seals index pages in packs: the write key's, in an encrypted
    /// repository.
    pub(super) fn page_sealer(&self) -> Option<Sealer> {
        self.keys.as_ref().map(|k| Sealer {
            key: k.write.seal_key(),
            repo: k.repo.clone(),
        })
    }

    /// The repository's index pages.
    pub(super) fn page_store(&self) -> StorePages<'_> {
        StorePages::new(&**self.store(), self.page_sealer())
    }

    /// The root of `e`'s index, checked against the catalog: every source
    /// it names is a stream of one of the catalog's entries.
    ///
    /// # Errors
    ///
    /// It is missing ([`BackupError::Store`] not found) or damaged.
    pub fn index_root(&self, cat: &Catalog, e: &Entry) -> Result<IndexRoot, BackupError> {
        let key = root_key(&e.file).ok_or_else(|| BackupError::Catalog {
            repo: self.store.name().to_owned(),
            what: format!("entry {} has no stream file name to index", e.id),
        })?;
        let bytes = self.store.get(&key, None)?;
        let bad = |what: String| BackupError::Catalog {
            repo: self.store.name().to_owned(),
            what: format!("index of entry {} ({key}): {what}", e.id),
        };
        let root: IndexRoot =
            serde_json::from_slice(&bytes).map_err(|err| bad(format!("unreadable: {err}")))?;
        for s in &root.sources {
            check_key(s).map_err(bad)?;
            if !cat.entries.iter().any(|x| x.file == *s) {
                return Err(bad(format!(
                    "names the stream {}, which no entry lists",
                    crate::backup::store::quoted(s)
                )));
            }
        }
        if root.tree.is_none() {
            return Err(bad("an empty tree".into()));
        }
        Ok(root)
    }

    /// Store `root` as the index of entry `e` (unless it has one).
    ///
    /// # Errors
    ///
    /// The store's.
    pub(crate) fn put_index_root(&self, e: &Entry, root: &IndexRoot) -> Result<(), BackupError> {
        let key = root_key(&e.file).ok_or_else(|| BackupError::Catalog {
            repo: self.store.name().to_owned(),
            what: format!("entry {} has no stream file name to index", e.id),
        })?;
        let json = serde_json::to_vec(root).map_err(|err| BackupError::Invalid(err.to_string()))?;
        self.store.put_if_absent(&key, &json)?;
        Ok(())
    }

    /// Build the index of every entry that has none (parents first), and
    /// again each damaged one: every page of every index is read and
    /// checked first (pages shared between indexes once), and the roots
    /// and damaged pages of a damaged index are deleted before it is built
    /// again. A stream that cannot be indexed is a failure in the report.
    ///
    /// # Errors
    ///
    /// The lock, the catalog, a store error.
    pub fn build_indexes(
        &self,
        wait: std::time::Duration,
        progress: &dyn Progress,
    ) -> Result<IndexReport, BackupError> {
        /// Passes of check and rebuild: a page below a damaged one is
        /// checked once the rebuild has written that one again.
        const PASSES: usize = 4;
        self.need_contents("indexing")?;
        let _lock = self.lock(LockKind::Exclusive, wait, progress)?;
        let cat = self.catalog()?;
        let mut report = IndexReport::default();
        for pass in 0..PASSES {
            let dropped = self.drop_damaged_indexes(&cat)?;
            if pass > 0 && dropped.is_empty() {
                break;
            }
            report.rebuilt.extend(dropped.iter().copied());
            let present: std::collections::BTreeSet<String> = self
                .store
                .list(INDEX_DIR)?
                .into_iter()
                .map(|o| o.key)
                .collect();
            let mut order: Vec<&Entry> = cat.entries.iter().collect();
            order.sort_by_key(|e| e.id);
            let todo: Vec<&Entry> = order
                .into_iter()
                .filter(|e| root_key(&e.file).is_some_and(|k| !present.contains(&k)))
                .filter(|e| !report.failed.iter().any(|(id, _)| *id == e.id))
                .collect();
            if pass == 0 {
                report.present = cat.entries.len() - todo.len();
            }
            progress.plan(todo.len(), todo.iter().map(|e| e.stream_bytes).sum());
            self.index_entries(&cat, &todo, &mut report, progress);
            if report.rebuilt.is_empty() {
                break;
            }
        }
        report.rebuilt.sort_unstable();
        report.rebuilt.dedup();
        Ok(report)
    }

    /// Index each of `todo` (parents first) from its stream; failures go
    /// to the report, and an entry whose parent failed is not tried.
    pub(crate) fn index_entries(
        &self,
        cat: &Catalog,
        todo: &[&Entry],
        report: &mut IndexReport,
        progress: &dyn Progress,
    ) {
        let store = self.page_store();
        let pages = Pages::new(&store, self.page_name_key());
        let known = CatalogIndexes { repo: self, cat };
        for e in todo {
            if let Some(p) = e.parent_id
                && report.failed.iter().any(|(id, _)| *id == p)
            {
                report
                    .failed
                    .push((e.id, format!("its parent, entry {p}, could not be indexed")));
                continue;
            }
            let r = (|| {
                let f = self.open_file(e)?;
                let mut raw = f.raw_reader(&**self.store());
                let (_, root) = index_stream(&pages, &mut raw, &e.file, &known)
                    .map_err(|err| BackupError::Invalid(err.to_string()))?;
                // The stream's own hash is checked at its end: read to
                // there, so a damaged stream is never indexed.
                std::io::copy(&mut raw, &mut std::io::sink()).map_err(|err| BackupError::Io {
                    what: format!("reading {}", e.file),
                    error: err,
                })?;
                self.put_index_root(e, &root)
            })();
            match r {
                Ok(()) => report.built.push(e.id),
                Err(err) => report.failed.push((e.id, err.to_string())),
            }
            progress.data(e.stream_bytes);
        }
    }

    /// Open the index of `e` for reading, with the streams as its data.
    ///
    /// # Errors
    ///
    /// The index is missing or damaged.
    pub fn with_index<T>(
        &self,
        cat: &Catalog,
        e: &Entry,
        f: impl FnOnce(&Snapshot<'_, '_>, &RepoData<'_>) -> Result<T, BackupError>,
    ) -> Result<T, BackupError> {
        let root = match self.index_root(cat, e) {
            Err(BackupError::Store(s)) if s.is_not_found() => {
                return Err(BackupError::Invalid(format!(
                    "{}: entry {} ({}) has no index yet: build it with `btrsend backup index`",
                    self.store.name(),
                    e.id,
                    e.path
                )));
            }
            r => r?,
        };
        self.with_index_root(cat, root, f)
    }

    /// Open the index `root` for reading, with the streams of `cat`'s
    /// entries as its data.
    ///
    /// # Errors
    ///
    /// What `f` returns.
    pub fn with_index_root<T>(
        &self,
        cat: &Catalog,
        root: IndexRoot,
        f: impl FnOnce(&Snapshot<'_, '_>, &RepoData<'_>) -> Result<T, BackupError>,
    ) -> Result<T, BackupError> {
        let store = self.page_store();
        let pages = Pages::new(&store, self.page_name_key());
        let snap = Snapshot::open(&pages, root);
        let data = RepoData::new(self, cat);
        f(&snap, &data)
    }
}
