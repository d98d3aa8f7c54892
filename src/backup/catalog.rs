//! The catalog: the list of stored streams, the only thing that makes a
//! stream file part of the repository.
//!
//! It is a JSON object stored as `catalog/NNNNNNNNNNNNNNNN.json` (16
//! decimal digits: its generation). A change writes the next generation
//! with put-if-absent (a link that refuses an existing name on a local
//! disk, `If-None-Match: *` on S3), so a catalog is replaced atomically and
//! two writers can never both succeed; readers take the highest generation.
//! The three newest generations are kept, older ones removed.
//!
//! ```json
//! {"format":"btrsend-catalog","version":1,"generation":7,"next_id":5,
//!  "entries":[{"id":1,"path":"snaps/home.1","uuid":"…","ctransid":12,
//!    "parent_uuid":null,"parent_ctransid":null,"parent_id":null,
//!    "kind":"full","time":"2026-11-20T01:00:00Z","origin":"…",
//!    "file":"streams/….btrs.zst","stream_bytes":…,"stored_bytes":…,
//!    "stream_blake3":"…","commands":…,"proto":1,
//!    "stored_at":"2026-11-20T01:02:03Z"}]}
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use super::entry::{Entry, Kind};
use super::error::BackupError;
use super::store::{Store, check_key, quoted};

/// The catalog format this code writes.
pub const CATALOG_VERSION: u32 = 1;
/// Where the catalog generations live.
pub const CATALOG_DIR: &str = "catalog/";
/// Catalog generations kept besides the newest.
const KEEP_OLD: usize = 2;

/// The catalog (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    /// Always `btrsend-catalog`.
    pub format: String,
    /// [`CATALOG_VERSION`].
    pub version: u32,
    /// This generation's number.
    pub generation: u64,
    /// The id the next entry gets.
    pub next_id: u64,
    /// The entries, oldest first.
    pub entries: Vec<Entry>,
}

/// How often [`Catalog::load`] lists again when the newest generation
/// vanishes before it is read.
const LOAD_TRIES: u32 = 5;
/// The last generation a catalog key can hold (16 decimal digits).
pub const MAX_GENERATION: u64 = 9_999_999_999_999_999;

/// Where stream files live.
const STREAM_PREFIX: &str = "streams/";
/// How a stream file's name ends.
const STREAM_SUFFIX: &str = ".btrs.zst";

/// Whether `key` has the shape of a stream file's key
/// (`streams/NAME.btrs.zst`, one name of safe characters).
///
/// # Errors
///
/// What is wrong, as text.
pub fn check_stream_key(key: &str) -> Result<(), String> {
    check_key(key)?;
    let ok = key
        .strip_prefix(STREAM_PREFIX)
        .is_some_and(|n| n.len() > STREAM_SUFFIX.len() && n.ends_with(STREAM_SUFFIX));
    if !ok {
        return Err(format!(
            "stream file key {} is not of the form {STREAM_PREFIX}NAME{STREAM_SUFFIX}",
            quoted(key)
        ));
    }
    Ok(())
}

/// Whether `s` is a UUID in its hyphenated form.
fn check_uuid(s: &str) -> Result<(), String> {
    if s.len() == 36 && uuid::Uuid::try_parse(s).is_ok() {
        Ok(())
    } else {
        Err(format!("{} is not a UUID", quoted(s)))
    }
}

/// The key of generation `g`.
fn key_of(g: u64) -> String {
    format!("{CATALOG_DIR}{g:016}.json")
}

/// The generation of a key, if it is a catalog's.
fn generation_of(key: &str) -> Option<u64> {
    let name = key.strip_prefix(CATALOG_DIR)?.strip_suffix(".json")?;
    (name.len() == 16 && name.bytes().all(|b| b.is_ascii_digit()))
        .then(|| name.parse().ok())
        .flatten()
}

impl Catalog {
    /// An empty catalog, generation 0 (not stored yet).
    pub fn empty() -> Catalog {
        Catalog {
            format: String::from("btrsend-catalog"),
            version: CATALOG_VERSION,
            generation: 0,
            next_id: 1,
            entries: Vec::new(),
        }
    }

    /// The newest generation in `store`.
    ///
    /// # Errors
    ///
    /// [`BackupError::Catalog`] when there is none or it is unreadable;
    /// store errors.
    pub fn load(store: &dyn Store) -> Result<Catalog, BackupError> {
        // A reader without the lock can list a generation that a writer
        // removes before the read (it keeps the newest few): list again.
        let mut tries = 0;
        let (g, key, bytes) = loop {
            let (g, key) = Self::newest(store)?;
            match store.get(&key, None) {
                Ok(bytes) => break (g, key, bytes),
                Err(e) if e.is_not_found() && tries < LOAD_TRIES => tries += 1,
                Err(e) => return Err(e.into()),
            }
        };
        let key = key.as_str();
        let cat: Catalog = serde_json::from_slice(&bytes).map_err(|e| BackupError::Catalog {
            repo: store.name().to_owned(),
            what: format!("{key}: unreadable JSON: {e}"),
        })?;
        if cat.format != "btrsend-catalog" || cat.version != CATALOG_VERSION {
            return Err(BackupError::Catalog {
                repo: store.name().to_owned(),
                what: format!(
                    "{key}: format {} version {} (this btrsend reads btrsend-catalog version {CATALOG_VERSION})",
                    cat.format, cat.version
                ),
            });
        }
        if cat.generation != g {
            return Err(BackupError::Catalog {
                repo: store.name().to_owned(),
                what: format!("{key}: records generation {}", cat.generation),
            });
        }
        cat.check().map_err(|what| BackupError::Catalog {
            repo: store.name().to_owned(),
            what: format!("{key}: {what}"),
        })?;
        Ok(cat)
    }

    /// The newest generation's number and key.
    ///
    /// # Errors
    ///
    /// [`BackupError::Catalog`] when there is none; store errors.
    pub fn newest(store: &dyn Store) -> Result<(u64, String), BackupError> {
        let list = store.list(CATALOG_DIR)?;
        list.into_iter()
            .filter_map(|o| generation_of(&o.key).map(|g| (g, o.key)))
            .max()
            .ok_or_else(|| BackupError::Catalog {
                repo: store.name().to_owned(),
                what: String::from("no catalog (catalog/*.json) in the repository"),
            })
    }

    /// Internal consistency, checked whenever a catalog is loaded and
    /// before one is stored: a catalog may have been written by someone
    /// else, and every later step trusts what this accepts.
    ///
    /// * ids strictly increasing (entries are oldest first) and below
    ///   `next_id`, which leaves room for another entry; a generation whose
    ///   successor still has a key ([`MAX_GENERATION`]);
    /// * each `file` a key of the one shape stream files have
    ///   (`streams/NAME.btrs.zst`, see [`check_key`]), named by one entry
    ///   only;
    /// * UUIDs that parse, a known protocol, unique uuid+ctransid;
    /// * a full stream with no parent; an incremental one whose parent is
    ///   an earlier entry with the very uuid and ctransid it records.
    ///
    /// # Errors
    ///
    /// What is wrong, as text.
    pub fn check(&self) -> Result<(), String> {
        if self.generation > MAX_GENERATION {
            return Err(format!(
                "generation {} is beyond the last one a key can hold ({MAX_GENERATION})",
                self.generation
            ));
        }
        if self.next_id == u64::MAX {
            return Err(String::from("next_id leaves no id for another entry"));
        }
        let mut by_id: BTreeMap<u64, &Entry> = BTreeMap::new();
        let mut keys = BTreeSet::new();
        let mut files = BTreeSet::new();
        let mut last = None;
        for e in &self.entries {
            if e.id >= self.next_id || last.is_some_and(|l| e.id <= l) {
                return Err(format!(
                    "entry {} has a duplicate, out of order or too large id",
                    e.id
                ));
            }
            last = Some(e.id);
            check_stream_key(&e.file).map_err(|why| format!("entry {}: {why}", e.id))?;
            if !files.insert(e.file.as_str()) {
                return Err(format!(
                    "entry {}: its stream file {} is named by another entry too",
                    e.id,
                    quoted(&e.file)
                ));
            }
            check_uuid(&e.uuid).map_err(|why| format!("entry {}: {why}", e.id))?;
            if e.stream_blake3.len() != 64
                || !e
                    .stream_blake3
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                return Err(format!(
                    "entry {}: its stream hash {} is not 64 lowercase hex digits",
                    e.id,
                    quoted(&e.stream_blake3)
                ));
            }
            if !(1..=3).contains(&e.proto) {
                return Err(format!("entry {}: unknown protocol {}", e.id, e.proto));
            }
            if e.path.len() > 4096 || e.origin.len() > 4096 {
                return Err(format!("entry {}: a path or origin too long", e.id));
            }
            if !keys.insert((e.uuid.as_str(), e.ctransid)) {
                return Err(format!(
                    "entry {}: uuid {} ctransid {} is stored twice",
                    e.id, e.uuid, e.ctransid
                ));
            }
            match (e.kind, e.parent_id) {
                (Kind::Full, None) if e.parent_uuid.is_none() && e.parent_ctransid.is_none() => {}
                (Kind::Incremental, Some(p)) if by_id.contains_key(&p) => {
                    let parent = by_id[&p];
                    if e.parent_uuid.as_deref() != Some(parent.uuid.as_str())
                        || e.parent_ctransid != Some(parent.ctransid)
                    {
                        return Err(format!(
                            "entry {} is incremental from {} ctransid {}, but its parent entry {p} stores {} ctransid {}",
                            e.id,
                            quoted(e.parent_uuid.as_deref().unwrap_or("nothing")),
                            e.parent_ctransid
                                .map_or_else(|| String::from("none"), |c| c.to_string()),
                            parent.uuid,
                            parent.ctransid
                        ));
                    }
                }
                _ => {
                    return Err(format!(
                        "entry {} ({}) has parent {:?}, which is not an earlier entry",
                        e.id,
                        e.kind.as_str(),
                        e.parent_id
                    ));
                }
            }
            by_id.insert(e.id, e);
        }
        Ok(())
    }

    /// Store this catalog as the next generation (atomically), and drop
    /// old generations.
    ///
    /// # Errors
    ///
    /// [`BackupError::Catalog`] when another writer stored that generation
    /// first; store errors.
    pub fn commit(&mut self, store: &dyn Store) -> Result<(), BackupError> {
        let next = self.generation + 1;
        let mut cat = self.clone();
        cat.generation = next;
        // Never write what the loader would refuse or ignore.
        cat.check().map_err(|what| BackupError::Catalog {
            repo: store.name().to_owned(),
            what: format!("refusing to store generation {next}: {what}"),
        })?;
        let bytes = serde_json::to_vec_pretty(&cat).map_err(|e| BackupError::Catalog {
            repo: store.name().to_owned(),
            what: format!("cannot encode the catalog: {e}"),
        })?;
        if !store.put_if_absent(&key_of(next), &bytes)? {
            return Err(BackupError::Catalog {
                repo: store.name().to_owned(),
                what: format!(
                    "{} was written by another process meanwhile (not holding the lock?)",
                    key_of(next)
                ),
            });
        }
        self.generation = next;
        // Old generations: best effort (a leftover is harmless; an
        // append-only store keeps them all).
        if store.append_only() {
            return Ok(());
        }
        if let Ok(list) = store.list(CATALOG_DIR) {
            let mut gens: Vec<u64> = list.iter().filter_map(|o| generation_of(&o.key)).collect();
            gens.sort_unstable();
            let keep_from = gens.len().saturating_sub(KEEP_OLD + 1);
            for g in gens.iter().take(keep_from) {
                let _ = store.delete(&key_of(*g));
            }
        }
        Ok(())
    }

    /// Add an entry (its id is assigned here and returned). A checked
    /// catalog always has room for one ([`Catalog::check`]); the one after
    /// it may not, and [`Catalog::commit`] refuses to store that.
    pub fn add(&mut self, mut entry: Entry) -> u64 {
        entry.id = self.next_id;
        self.next_id = self.next_id.saturating_add(1);
        let id = entry.id;
        self.entries.push(entry);
        id
    }

    /// The entry with this id (a binary search: a checked catalog's ids
    /// are in order).
    pub fn get(&self, id: u64) -> Option<&Entry> {
        match self.entries.binary_search_by_key(&id, |e| e.id) {
            Ok(i) => self.entries.get(i),
            Err(_) => None,
        }
    }

    /// The entry storing this snapshot.
    pub fn find(&self, uuid: &str, ctransid: u64) -> Option<&Entry> {
        self.entries
            .iter()
            .find(|e| e.uuid == uuid && e.ctransid == ctransid)
    }

    /// The chain that restores entry `id`: the full stream first, `id`
    /// last.
    ///
    /// # Errors
    ///
    /// The id of the first missing ancestor.
    pub fn chain(&self, id: u64) -> Result<Vec<&Entry>, u64> {
        let mut out = Vec::new();
        let mut cur = Some(id);
        while let Some(i) = cur {
            let e = self.get(i).ok_or(i)?;
            if out.len() > self.entries.len() {
                return Err(i);
            }
            out.push(e);
            cur = e.parent_id;
        }
        out.reverse();
        Ok(out)
    }

    /// How many streams the chain of `id` has (1 for a full stream).
    pub fn depth(&self, id: u64) -> Option<usize> {
        self.chain(id).ok().map(|c| c.len())
    }

    /// Remove the entries `ids` and store the catalog (atomically), then
    /// delete their stream files, children before parents. Refused, with
    /// nothing changed, when a remaining entry is an incremental stream of
    /// a removed one. This is what `forget` uses; it must hold the
    /// exclusive lock.
    ///
    /// # Errors
    ///
    /// [`BackupError::Invalid`] for an unknown id or a child left behind;
    /// what [`Catalog::commit`] returns. File deletion errors are not
    /// errors (a leftover file is removed by the next `run`).
    pub fn remove_entries(&mut self, store: &dyn Store, ids: &[u64]) -> Result<(), BackupError> {
        let gone: BTreeSet<u64> = ids.iter().copied().collect();
        for id in &gone {
            if self.get(*id).is_none() {
                return Err(BackupError::Invalid(format!(
                    "no entry {id} in the catalog of {}",
                    store.name()
                )));
            }
        }
        if let Some(child) = self
            .entries
            .iter()
            .find(|e| !gone.contains(&e.id) && e.parent_id.is_some_and(|p| gone.contains(&p)))
        {
            return Err(BackupError::Invalid(format!(
                "cannot remove entry {} of {}: entry {} is an incremental stream based on it",
                child.parent_id.unwrap_or_default(),
                store.name(),
                child.id
            )));
        }
        let mut next = self.clone();
        next.entries.retain(|e| !gone.contains(&e.id));
        next.commit(store)?;
        crate::backup::synthesize::pause("committed");
        // Children before parents: newest ids first (a child always has a
        // larger id than its parent).
        let mut files: Vec<(u64, String)> = self
            .entries
            .iter()
            .filter(|e| gone.contains(&e.id))
            .map(|e| (e.id, e.file.clone()))
            .collect();
        files.sort_by_key(|f| std::cmp::Reverse(f.0));
        // A file a remaining entry names stays, whatever the catalog says.
        let kept: BTreeSet<&str> = next.entries.iter().map(|e| e.file.as_str()).collect();
        for (_, f) in files {
            if !kept.contains(f.as_str()) {
                let _ = store.delete(&f);
            }
        }
        *self = next;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::backup::store::LocalStore;

    fn uuid() -> String {
        let r = crate::backup::store::random_u64();
        format!(
            "{:08x}-0000-4000-8000-{:012x}",
            r >> 32,
            r & 0xffff_ffff_ffff
        )
    }

    /// An entry of `c`, incremental from its entry `parent`.
    pub(crate) fn entry_in(c: &Catalog, parent: Option<u64>) -> Entry {
        let p = parent.and_then(|p| c.get(p));
        Entry {
            id: 0,
            path: "snaps/a".into(),
            uuid: uuid(),
            ctransid: 5,
            parent_uuid: p.map(|p| p.uuid.clone()),
            parent_ctransid: p.map(|p| p.ctransid),
            parent_id: parent,
            kind: if parent.is_some() {
                Kind::Incremental
            } else {
                Kind::Full
            },
            time: "2026-11-20T01:00:00Z".into(),
            origin: "o".into(),
            file: format!("streams/{}.btrs.zst", crate::backup::store::random_u64()),
            stream_bytes: 10,
            stored_bytes: 20,
            stream_blake3: "0123456789abcdef".repeat(4),
            commands: 3,
            proto: 1,
            stored_at: "2026-11-20T01:00:00Z".into(),
            synthesized_from: None,
        }
    }

    #[test]
    fn commit_load_generations_and_conflict() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        let mut c = Catalog::empty();
        c.commit(&s).unwrap();
        assert_eq!(Catalog::load(&s).unwrap().generation, 1);
        let a = c.add(entry_in(&c, None));
        let b = c.add(entry_in(&c, Some(a)));
        c.commit(&s).unwrap();
        let l = Catalog::load(&s).unwrap();
        assert_eq!(l, c);
        assert_eq!(
            l.chain(b).unwrap().iter().map(|e| e.id).collect::<Vec<_>>(),
            [a, b]
        );
        assert_eq!(l.depth(b), Some(2));
        // A second writer with a stale copy cannot overwrite.
        let mut stale = l.clone();
        c.commit(&s).unwrap();
        let e = stale.commit(&s).unwrap_err();
        assert!(e.to_string().contains("written by another process"), "{e}");
        for _ in 0..5 {
            c.commit(&s).unwrap();
        }
        assert_eq!(s.list(CATALOG_DIR).unwrap().len(), KEEP_OLD + 1);
        assert_eq!(Catalog::load(&s).unwrap().generation, c.generation);
    }

    #[test]
    fn remove_entries_refuses_orphaning_children() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        let mut c = Catalog::empty();
        let a = c.add(entry_in(&c, None));
        let b = c.add(entry_in(&c, Some(a)));
        for e in &c.entries {
            assert!(s.put_if_absent(&e.file, b"x").unwrap());
        }
        c.commit(&s).unwrap();
        let e = c.remove_entries(&s, &[a]).unwrap_err();
        assert!(
            e.to_string()
                .contains("entry 2 is an incremental stream based on it"),
            "{e}"
        );
        assert_eq!(Catalog::load(&s).unwrap().entries.len(), 2);
        let fb = c.get(b).unwrap().file.clone();
        c.remove_entries(&s, &[a, b]).unwrap();
        assert!(Catalog::load(&s).unwrap().entries.is_empty());
        assert!(s.get(&fb, None).unwrap_err().is_not_found());
        assert!(c.remove_entries(&s, &[a]).is_err());
    }

    #[test]
    fn damaged_catalog_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        let mut c = Catalog::empty();
        c.add(entry_in(&c, Some(9)));
        assert!(c.check().unwrap_err().contains("not an earlier entry"));
        assert!(s.put_if_absent(&key_of(1), b"{\"format\":").unwrap());
        let e = Catalog::load(&s).unwrap_err().to_string();
        assert!(
            e.contains("catalog/0000000000000001.json: unreadable JSON"),
            "{e}"
        );
        let empty = tempfile::tempdir().unwrap();
        let e = Catalog::load(&LocalStore::new(empty.path())).unwrap_err();
        assert!(e.to_string().contains("no catalog"), "{e}");
    }

    #[test]
    fn hostile_catalogs_are_refused_at_load() {
        let mut base = Catalog::empty();
        let a = base.add(entry_in(&base, None));
        let b = base.add(entry_in(&base, Some(a)));
        let other = base.add(entry_in(&base, None));
        base.check().unwrap();
        type Tamper = Box<dyn Fn(&mut Catalog)>;
        let cases: Vec<(&str, Tamper)> = vec![
            ("../x", Box::new(|c| c.entries[0].file = "../x".into())),
            (
                "/etc",
                Box::new(|c| c.entries[0].file = "/etc/passwd".into()),
            ),
            (
                "config",
                Box::new(|c| c.entries[0].file = "streams/../config".into()),
            ),
            (
                "nul",
                Box::new(|c| c.entries[0].file = "streams/a\0.btrs.zst".into()),
            ),
            (
                "shape",
                Box::new(|c| c.entries[0].file = "catalog/0000000000000001.json".into()),
            ),
            (
                "hidden",
                Box::new(|c| c.entries[0].file = "streams/.btrs.zst".into()),
            ),
            (
                "shared file",
                Box::new(|c| c.entries[2].file = c.entries[0].file.clone()),
            ),
            ("uuid", Box::new(|c| c.entries[0].uuid = "../../x".into())),
            (
                "hash",
                Box::new(|c| c.entries[0].stream_blake3 = "\x1b[2J".repeat(16)),
            ),
            (
                "hash case",
                Box::new(|c| c.entries[0].stream_blake3 = "ABCDEF0123456789".repeat(4)),
            ),
            ("proto", Box::new(|c| c.entries[0].proto = 9)),
            // The attack of a wrong parent id: the entry still names its
            // real parent's uuid, but points at another full stream.
            (
                "parent id",
                Box::new(move |c| c.entries[1].parent_id = Some(other)),
            ),
            (
                "full with parent",
                Box::new(|c| c.entries[0].parent_uuid = Some(uuid())),
            ),
            ("order", Box::new(|c| c.entries.swap(0, 2))),
            ("next_id", Box::new(|c| c.next_id = u64::MAX)),
            (
                "generation",
                Box::new(|c| c.generation = MAX_GENERATION + 1),
            ),
        ];
        for (what, tamper) in cases {
            let mut c = base.clone();
            tamper(&mut c);
            assert!(c.check().is_err(), "{what}: accepted");
        }
        // A loaded catalog goes through the same check.
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        let mut c = base.clone();
        c.entries[b as usize - 1].file = "../victim".into();
        c.generation = 1;
        let json = serde_json::to_vec(&c).unwrap();
        assert!(s.put_if_absent(&key_of(1), &json).unwrap());
        let e = Catalog::load(&s).unwrap_err().to_string();
        assert!(e.contains("\"../victim\"") && e.contains("entry 2"), "{e}");
    }

    #[test]
    fn the_last_generation_and_id_are_never_written() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        let mut c = Catalog::empty();
        c.generation = MAX_GENERATION - 1;
        c.commit(&s).unwrap();
        assert_eq!(Catalog::load(&s).unwrap().generation, MAX_GENERATION);
        let e = c.commit(&s).unwrap_err().to_string();
        assert!(e.contains("refusing to store generation"), "{e}");
        assert_eq!(Catalog::load(&s).unwrap().generation, MAX_GENERATION);

        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        let mut c = Catalog::empty();
        c.next_id = u64::MAX - 1;
        c.add(entry_in(&c, None));
        let e = c.commit(&s).unwrap_err().to_string();
        assert!(e.contains("next_id"), "{e}");
        assert!(Catalog::load(&s).is_err(), "nothing stored");
    }
}
