//! Keeping indexes sound: the pages `forget` may delete, what `verify`
//! reports, and the damaged indexes `backup index` builds again.
//!
//! Pages are shared between snapshots, so no page belongs to one entry:
//! `forget` deletes the roots of the entries it deleted, then every pack
//! (and page of its own) no kept root reaches a page of (mark and sweep,
//! reading only internal pages). A pack is kept whole while any page of
//! it is in use.
//! When a kept index cannot be walked (damaged, or the store failing), no
//! page is deleted: a page that looks unused might be one a damaged index
//! needs once rebuilt from the same bytes, and deleting is never a guess.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};

use super::IndexError;
use super::apply::{IndexRoot, index_stream};
use super::repo::{
    CatalogIndexes, INDEX_DIR, PACK_PREFIX, StorePages, pack_key, page_key, root_key,
};
use super::tree::{PackId, PageId, PageRef, PageStore, Pages, Place, Tree, range_of, walk_pages};
use crate::backup::catalog::Catalog;
use crate::backup::entry::Entry;
use crate::backup::verify::{Problem, VerifyReport};
use crate::backup::{BackupError, Repository};

/// What the sweep of `forget` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Roots of entries no longer in the catalog, deleted.
    pub roots: usize,
    /// Packs and pages no kept index reaches, deleted.
    pub pages: usize,
    /// Why no page was deleted, when none was for a reason.
    pub skipped: Option<String>,
}

/// The state of one entry's index.
enum Health {
    Missing,
    Whole(IndexRoot),
    /// Damaged: why, and the pages whose bytes are wrong.
    Damaged(String, Vec<PageRef>),
}

/// The page `key` names (`index/pHEX`).
fn page_of(key: &str) -> Option<PageId> {
    named(key.strip_prefix(INDEX_DIR)?.strip_prefix('p')?)
}

/// The pack `key` names (`index/kHEX`).
fn pack_of(key: &str) -> Option<PackId> {
    named(key.strip_prefix(PACK_PREFIX)?)
}

/// The 32 bytes of a 64-digit hex name.
fn named(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut id = [0u8; 32];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

/// Pages read from the repository; packs a rebuild makes that it lacks
/// are kept in memory (a rebuild that matches makes none).
struct Rebuilt<'r> {
    stored: StorePages<'r>,
    present: &'r HashSet<PackId>,
    made: RefCell<HashMap<PackId, Vec<u8>>>,
}

impl PageStore for Rebuilt<'_> {
    fn get(&self, r: &PageRef) -> Result<Vec<u8>, IndexError> {
        if let Place::Packed { pack, offset, len } = r.place
            && let Some(b) = self.made.borrow().get(&pack)
        {
            let blob = range_of(b, offset, len).ok_or(IndexError::MissingPage { id: r.id })?;
            return self.stored.page_of_blob(&r.id, blob);
        }
        self.stored.get(r)
    }

    fn blob(&self, id: &PageId, page: &[u8]) -> Result<Vec<u8>, IndexError> {
        self.stored.blob(id, page)
    }

    fn put_pack(&self, name: &PackId, bytes: Vec<u8>, _: &[PageRef]) -> Result<(), IndexError> {
        if !self.present.contains(name) {
            self.made.borrow_mut().insert(*name, bytes);
        }
        Ok(())
    }
}

/// A digest of every record of the tree `top` (the index's contents,
/// whatever its pages' layout).
fn contents_digest(pages: &Pages<'_>, top: Option<PageRef>) -> Result<[u8; 32], IndexError> {
    let mut h = blake3::Hasher::new();
    Tree::open(pages, top).scan(b"", &mut |k, v| {
        for part in [k, v] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        Ok(std::ops::ControlFlow::Continue(()))
    })?;
    Ok(*h.finalize().as_bytes())
}

/// The stream files of `cat`'s entries: built once for a pass over every
/// entry's index, not once per entry.
fn stream_files(cat: &Catalog) -> HashSet<&str> {
    cat.entries.iter().map(|x| x.file.as_str()).collect()
}

impl Repository {
    /// The state of `e`'s index, its pages walked (`read_leaves`: every
    /// page read and checked; else the internal ones), skipping those in
    /// `seen` and adding the rest.
    ///
    /// # Errors
    ///
    /// The store failed (a damaged index is a [`Health`], not an error).
    fn index_health(
        &self,
        cat: &Catalog,
        e: &Entry,
        pages: &Pages<'_>,
        read_leaves: bool,
        seen: &mut HashSet<PageRef>,
        collect: bool,
    ) -> Result<Health, BackupError> {
        let root = match self.index_root(cat, e) {
            Ok(r) => r,
            Err(BackupError::Store(s)) if s.is_not_found() => return Ok(Health::Missing),
            Err(err @ BackupError::Catalog { .. }) => {
                return Ok(Health::Damaged(err.to_string(), Vec::new()));
            }
            Err(err) => return Err(err),
        };
        let Some(top) = root.top() else {
            return Ok(Health::Damaged("an empty tree".into(), Vec::new()));
        };
        let mut damaged = Vec::new();
        match walk_pages(
            pages,
            top,
            read_leaves,
            seen,
            collect.then_some(&mut damaged),
        ) {
            Ok(()) if damaged.is_empty() => Ok(Health::Whole(root)),
            Ok(()) => Ok(Health::Damaged(
                format!("{} damaged page(s)", damaged.len()),
                damaged,
            )),
            // Only when not collecting: a walk that collects goes past them.
            Err(err @ IndexError::Page { .. }) => Ok(Health::Damaged(err.to_string(), Vec::new())),
            Err(err @ IndexError::MissingPage { .. }) => {
                Ok(Health::Damaged(err.to_string(), Vec::new()))
            }
            Err(err) => Err(BackupError::Invalid(format!(
                "{}: reading the index of entry {}: {err}",
                self.store.name(),
                e.id
            ))),
        }
    }

    /// Delete the roots of entries `cat` no longer has and the pages no
    /// kept index reaches (see the module docs). `forget` calls it under
    /// the exclusive lock, after the catalog. The pages are looked at only
    /// when entries were `deleted` now or a root went (a forget that
    /// deletes nothing costs a listing, not a walk of every index); pages
    /// an interrupted run left go with the next forget that deletes.
    ///
    /// # Errors
    ///
    /// The store's.
    pub fn sweep_indexes(&self, cat: &Catalog, deleted: bool) -> Result<Sweep, BackupError> {
        let listed = self.store.list(INDEX_DIR)?;
        let kept: HashSet<String> = cat
            .entries
            .iter()
            .filter_map(|e| root_key(&e.file))
            .collect();
        let mut sweep = Sweep::default();
        for o in &listed {
            if o.key.starts_with(&format!("{INDEX_DIR}r")) && !kept.contains(&o.key) {
                self.store.delete(&o.key)?;
                sweep.roots += 1;
            }
        }
        if !deleted && sweep.roots == 0 {
            return Ok(sweep);
        }
        let store = self.page_store();
        let pages = Pages::new(&store, self.page_name_key());
        let mut seen = HashSet::new();
        for e in &cat.entries {
            match self.index_health(cat, e, &pages, false, &mut seen, false) {
                Ok(Health::Missing | Health::Whole(_)) => {}
                Ok(Health::Damaged(why, _)) => {
                    sweep.skipped = Some(format!(
                        "the index of entry {} is damaged ({why}): no page deleted; `btrsend backup index` rebuilds it",
                        e.id
                    ));
                    return Ok(sweep);
                }
                Err(err) => {
                    sweep.skipped = Some(format!("no index page deleted: {err}"));
                    return Ok(sweep);
                }
            }
        }
        let mut objects = HashSet::new();
        let mut packs = HashSet::new();
        for r in &seen {
            match r.place {
                Place::Object => objects.insert(r.id),
                Place::Packed { pack, .. } => packs.insert(pack),
                Place::Here { .. } => false,
            };
        }
        for o in &listed {
            let unused = match (page_of(&o.key), pack_of(&o.key)) {
                (Some(id), _) => !objects.contains(&id),
                (_, Some(pack)) => !packs.contains(&pack),
                _ => false,
            };
            if unused {
                self.store.delete(&o.key)?;
                sweep.pages += 1;
            }
        }
        Ok(sweep)
    }

    /// Whether `e`'s index names a stream not in `files`, the stream files
    /// of the catalog's entries (its data moved to a synthetic full
    /// stream): out of date, not damaged.
    /// Such an index is never read ([`Repository::index_root`] refuses
    /// it).
    ///
    /// # Errors
    ///
    /// The store's.
    pub(crate) fn stale_index(
        &self,
        files: &HashSet<&str>,
        e: &Entry,
    ) -> Result<bool, BackupError> {
        let Some(key) = root_key(&e.file) else {
            return Ok(false);
        };
        let bytes = match self.store.get(&key, None) {
            Ok(b) => b,
            Err(s) if s.is_not_found() => return Ok(false),
            Err(s) => return Err(s.into()),
        };
        let Ok(root) = serde_json::from_slice::<IndexRoot>(&bytes) else {
            return Ok(false);
        };
        Ok(root.sources.iter().any(|s| !files.contains(s.as_str())))
    }

    /// Build again, parents first, the indexes [`Repository::stale_index`]
    /// finds; one that fails is a warning (`backup index` tries again).
    ///
    /// # Errors
    ///
    /// The store's.
    pub(crate) fn refresh_stale_indexes(
        &self,
        cat: &Catalog,
        progress: &dyn crate::progress::Progress,
    ) -> Result<(), BackupError> {
        let mut stale = Vec::new();
        let mut order: Vec<&Entry> = cat.entries.iter().collect();
        order.sort_by_key(|e| e.id);
        let files = stream_files(cat);
        for e in order {
            if self.stale_index(&files, e)? {
                stale.push(e);
            }
        }
        for e in &stale {
            if let Some(k) = root_key(&e.file) {
                self.store.delete(&k)?;
            }
        }
        let mut report = super::repo::IndexReport::default();
        self.index_entries(cat, &stale, &mut report, progress);
        for (id, why) in report.failed {
            progress.warning(&format!(
                "the index of entry {id} could not be built again ({why}); `btrsend backup index` tries again"
            ));
        }
        Ok(())
    }

    /// `verify`'s part for indexes: a missing or out-of-date index is a
    /// notice, a damaged one a problem. With `read_data` every page is read, and
    /// each index is built again from its stream (unless the stream is in
    /// `bad`) and must come out the same.
    ///
    /// # Errors
    ///
    /// The store's.
    pub(crate) fn check_indexes(
        &self,
        cat: &Catalog,
        read_data: bool,
        bad: &BTreeSet<u64>,
        rep: &mut VerifyReport,
    ) -> Result<(), BackupError> {
        let listed = self.store.list(INDEX_DIR)?;
        let objects: HashSet<PageId> = listed.iter().filter_map(|o| page_of(&o.key)).collect();
        let present: HashSet<PackId> = listed.iter().filter_map(|o| pack_of(&o.key)).collect();
        let roots: HashSet<&str> = listed.iter().map(|o| o.key.as_str()).collect();
        let stored = |r: PageRef| match r.place {
            Place::Object => objects.contains(&r.id),
            Place::Packed { pack, .. } => present.contains(&pack),
            Place::Here { .. } => false,
        };
        let store = self.page_store();
        let pages = Pages::new(&store, self.page_name_key());
        let mut seen = HashSet::new();
        let mut missing = 0usize;
        let mut stale = 0usize;
        let files = stream_files(cat);
        let mut damaged: BTreeSet<u64> = BTreeSet::new();
        let mut order: Vec<&Entry> = cat.entries.iter().collect();
        order.sort_by_key(|e| e.id);
        for e in order {
            let problem = |message: String| Problem {
                entry: Some(e.id),
                file: root_key(&e.file),
                message,
            };
            if !root_key(&e.file).is_some_and(|k| roots.contains(k.as_str())) {
                missing += 1;
                continue;
            }
            if self.stale_index(&files, e)? {
                stale += 1;
                continue;
            }
            let root = if read_data {
                self.index_health(cat, e, &pages, true, &mut seen, false)?
            } else {
                // Without --read-data: the root and its top page.
                match self.index_root(cat, e) {
                    Ok(r) if r.top().is_some_and(stored) => Health::Whole(r),
                    Ok(_) => Health::Damaged("its top page is missing".into(), Vec::new()),
                    Err(err @ BackupError::Catalog { .. }) => {
                        Health::Damaged(err.to_string(), Vec::new())
                    }
                    Err(err) => return Err(err),
                }
            };
            let root = match root {
                Health::Whole(r) => r,
                Health::Missing => {
                    missing += 1;
                    continue;
                }
                Health::Damaged(why, _) => {
                    rep.problems.push(problem(format!(
                        "the index of entry {} is damaged: {why} (`btrsend backup index` rebuilds it)",
                        e.id
                    )));
                    damaged.insert(e.id);
                    continue;
                }
            };
            let parent_bad = e
                .parent_id
                .is_some_and(|p| damaged.contains(&p) || bad.contains(&p));
            if !read_data || bad.contains(&e.id) || parent_bad {
                continue;
            }
            match self.rebuild_index(cat, e, &store, &present, &root) {
                Ok(true) => {}
                Ok(false) => {
                    rep.problems.push(problem(format!(
                        "the index of entry {} is not what its stream makes (`btrsend backup index` rebuilds it)",
                        e.id
                    )));
                    damaged.insert(e.id);
                }
                Err(err) => {
                    rep.problems.push(problem(format!(
                        "the index of entry {} cannot be built again: {err}",
                        e.id
                    )));
                    damaged.insert(e.id);
                }
            }
        }
        if stale > 0 {
            rep.notices.push(format!(
                "{stale} stored snapshot(s) have an index that points into streams a synthetic full stream replaced (a `forget` was interrupted): the next `forget` or `btrsend backup index` builds them again"
            ));
        }
        if missing > 0 {
            rep.notices.push(format!(
                "{missing} stored snapshot(s) have no index (made before indexes, or with --no-index): `btrsend backup index` builds them"
            ));
        }
        Ok(())
    }

    /// Whether the index `e`'s stream makes on its parent's stored index,
    /// built without writing anything, is `root`: the same root (packs
    /// and all), or else the same records.
    fn rebuild_index(
        &self,
        cat: &Catalog,
        e: &Entry,
        stored: &StorePages<'_>,
        present: &HashSet<PackId>,
        root: &IndexRoot,
    ) -> Result<bool, BackupError> {
        let rebuilt = Rebuilt {
            stored: StorePages::new(stored.store, self.page_sealer()),
            present,
            made: RefCell::new(HashMap::new()),
        };
        let pages = Pages::new(&rebuilt, self.page_name_key());
        let f = self.open_file(e)?;
        let mut raw = f.raw_reader(&**self.store());
        let known = CatalogIndexes { repo: self, cat };
        let (_, again) = index_stream(&pages, &mut raw, &e.file, &known)
            .map_err(|err| BackupError::Invalid(err.to_string()))?;
        // The same root is the answer; another one (an index made before
        // packs, or by a version that lays pages out otherwise) must hold
        // the same records.
        if again == *root {
            return Ok(true);
        }
        let digest = |r: &IndexRoot| {
            contents_digest(&pages, r.top()).map_err(|err| BackupError::Invalid(err.to_string()))
        };
        Ok(again.next_ino == root.next_ino
            && again.sources == root.sources
            && digest(&again)? == digest(root)?)
    }

    /// The entries whose index is damaged, their roots and damaged pages
    /// deleted so that [`build_indexes`](Self::build_indexes) makes them
    /// again: every page of every index is read (pages shared once).
    ///
    /// # Errors
    ///
    /// The store's.
    pub(crate) fn drop_damaged_indexes(&self, cat: &Catalog) -> Result<Vec<u64>, BackupError> {
        let store = self.page_store();
        let pages = Pages::new(&store, self.page_name_key());
        let mut seen = HashSet::new();
        let mut dropped = Vec::new();
        let mut order: Vec<&Entry> = cat.entries.iter().collect();
        order.sort_by_key(|e| e.id);
        for e in order {
            // The pages below a damaged one are out of reach until the
            // rebuild writes it again: build_indexes walks again after it.
            if let Health::Damaged(_, bad) =
                self.index_health(cat, e, &pages, true, &mut seen, true)?
            {
                // A pack goes whole: the rebuild makes it again, with the
                // pages other indexes share from it.
                for r in bad {
                    match r.place {
                        Place::Object => self.store.delete(&page_key(&r.id))?,
                        Place::Packed { pack, .. } => self.store.delete(&pack_key(&pack))?,
                        Place::Here { .. } => {}
                    }
                }
                if let Some(k) = root_key(&e.file) {
                    self.store.delete(&k)?;
                }
                dropped.push(e.id);
            }
        }
        Ok(dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_keys_parse_only_in_their_one_shape() {
        let id = [0xab; 32];
        assert_eq!(page_of(&page_key(&id)), Some(id));
        assert_eq!(page_of("index/pab"), None);
        assert_eq!(page_of(&format!("index/r{}", "ab".repeat(32))), None);
        assert_eq!(page_of(&format!("index/p{}", "zz".repeat(32))), None);
        assert_eq!(page_of(&format!("streams/p{}", "ab".repeat(32))), None);
        assert_eq!(pack_of(&pack_key(&id)), Some(id));
        assert_eq!(pack_of(&page_key(&id)), None);
        assert_eq!(page_of(&pack_key(&id)), None);
    }
}
