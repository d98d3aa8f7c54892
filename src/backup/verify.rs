//! `backup verify`: check the catalog, every stream file's presence, size,
//! trailer and first command, every chain, and with `--read-data` every
//! stored byte; and the structural check `forget` needs before it deletes.
//!
//! Damage is a finding, reported, not an error; verify never changes the
//! repository (leftovers of interrupted runs are noted, not removed).

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use stream_format::{ReaderOptions, StreamReader};

use super::catalog::{Catalog, Entry};
use super::error::BackupError;
use super::file::{self, Damage, StreamFile};
use super::lock::LockKind;
use super::remote::proto::printable;
use super::repository::Repository;
use super::store::{self, HoldError, LocalStore, Store, StoreError};
use super::{frames, partial};
use crate::progress::Progress;

/// How often a lock-free `verify` checks again when a writer replaced the
/// catalog while it was checking.
const VERIFY_TRIES: u32 = 3;

/// Whether every frame of `f` is sound: its stored bytes match their
/// BLAKE3, it decompresses to its recorded length, and its commands decode
/// (CRC included) — frames are cut at command boundaries, so each decodes
/// alone behind the stream header — and the whole raw stream matches its
/// BLAKE3, length and command count. Frames are read, hashed, decompressed
/// and decoded on [`frames::workers`] threads, ahead of this one, which
/// hashes the raw stream in order. `false` tells nothing about where: the
/// caller reads the file again in order for that.
pub(crate) fn check_frames_parallel(
    store: &dyn Store,
    f: &StreamFile,
    progress: &dyn Progress,
) -> bool {
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

/// Where the damage of a stream file lies that [`check_frames_parallel`]
/// found unsound: it is read again in order, for a message that names the
/// file, the frame and the byte offset in the stream.
pub(crate) fn locate_damage(store: &dyn Store, f: &StreamFile, name: &str) -> String {
    let mut reader = StreamReader::with_options(
        f.raw_reader(store),
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
                return inner
                    .unwrap_or_else(|| format!("{name}: the raw stream does not decode: {err}"));
            }
        }
    }
    if reader.streams() != 1 || commands != f.trailer.commands {
        return format!(
            "{name}: the raw stream has {commands} commands in {} streams, the trailer says {} in 1",
            reader.streams(),
            f.trailer.commands
        );
    }
    format!("{name}: its frames do not agree with its trailer")
}

/// The report a far end sent for `verify --read-data` of `repo`,
/// checked: JSON of a [`VerifyReport`], its text without control
/// characters.
fn far_report(bytes: &[u8], repo: &str) -> Result<VerifyReport, BackupError> {
    let mut rep: VerifyReport = serde_json::from_slice(bytes).map_err(|e| {
        BackupError::Invalid(format!(
            "{repo}: the far end's verify report does not parse: {e}"
        ))
    })?;
    let clean = |s: &mut String| *s = printable(s);
    for p in &mut rep.problems {
        clean(&mut p.message);
        if let Some(f) = &mut p.file {
            clean(f);
        }
    }
    rep.unrestorable
        .iter_mut()
        .for_each(|(_, path)| clean(path));
    rep.notices.iter_mut().for_each(clean);
    Ok(rep)
}

/// One problem `verify` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Problem {
    /// The entry it concerns, if one.
    pub entry: Option<u64>,
    /// The file it concerns, if one.
    pub file: Option<String>,
    /// What is wrong (names file, frame and byte offset where they apply).
    pub message: String,
}

/// What `verify` found.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
        self.need_contents("verify")?;
        if read_data
            && self.keys.is_none()
            && let Some(far) = self.store.verify_far(wait)
        {
            // The far end reads every byte where it lies (and takes the
            // lock there); only its report comes back.
            let far = far.map_err(|e| match e {
                HoldError::Held(holder) => BackupError::LockHeld {
                    repo: self.store.name().to_owned(),
                    holder,
                },
                HoldError::Store(e) => e.into(),
            })?;
            return far_report(&far, self.store.name());
        }
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

    pub(super) fn verify_once(
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
        self.check_indexes(&cat, read_data, &bad, &mut rep)?;
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
        Err(locate_damage(&*self.store, &f, &e.file))
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
    pub(super) fn check_structure(&self, cat: &Catalog) -> Result<(), BackupError> {
        let present = self.stream_sizes()?;
        for e in &cat.entries {
            let problem = match present.get(&e.file) {
                None => Some(format!("{}: the stream file is missing", e.file)),
                Some(&size) if size != e.stored_bytes => Some(format!(
                    "{}: {size} bytes, the catalog says {}",
                    e.file, e.stored_bytes
                )),
                // A host holding only the write key cannot read the
                // streams; the catalog's links are authenticated by that
                // key, so only someone holding it could have changed them.
                Some(_) if self.store.write_only() => None,
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

/// An entry as [`CompareReport`] names it: its id in its repository, its
/// path, and the snapshot (uuid and ctransid) that identifies it in both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EntryRef {
    /// Its id in its own repository (ids differ between repositories).
    pub id: u64,
    /// Its path.
    pub path: String,
    /// The snapshot's UUID as its stream carries it.
    pub uuid: String,
    /// Its ctransid.
    pub ctransid: u64,
}

impl EntryRef {
    fn of(e: &Entry) -> EntryRef {
        EntryRef {
            id: e.id,
            path: e.path.clone(),
            uuid: e.uuid.clone(),
            ctransid: e.ctransid,
        }
    }
}

/// An entry both repositories hold whose records disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disagreement {
    /// The entry in the first repository.
    pub first: EntryRef,
    /// Its id in the second.
    pub second_id: u64,
    /// Each field that differs: `field: FIRST ≠ SECOND`.
    pub differences: Vec<String>,
}

/// How two repositories' catalogs compare ([`compare`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompareReport {
    /// Entries both hold (same uuid and ctransid).
    pub shared: usize,
    /// Of those, the ones whose records disagree: damage.
    pub disagree: Vec<Disagreement>,
    /// Of those, the ones one repository stores as a synthetic full
    /// stream and the other as another stream (the original one, or
    /// another synthetic one): two proven streams of one snapshot, not
    /// damage.
    pub other_stream: Vec<Disagreement>,
    /// Entries only the first holds.
    pub only_in_first: Vec<EntryRef>,
    /// Entries only the second holds.
    pub only_in_second: Vec<EntryRef>,
}

/// Compare two repositories from their catalogs alone (no stream data is
/// read): the entries they share, by snapshot (uuid and ctransid), must
/// record the same stream: kind, parent snapshot, raw size, BLAKE3 of the
/// raw stream, command count and protocol, unless one of them is a
/// synthetic full stream ([`CompareReport::other_stream`]). The stored bytes may differ
/// (compression, encryption) and are not compared; the paths, times and
/// origins are labels and are not compared either. Takes no lock: each
/// catalog generation is replaced atomically.
///
/// # Errors
///
/// Either catalog is unreadable or inconsistent ([`BackupError::Catalog`]);
/// store errors.
pub fn compare(first: &Repository, second: &Repository) -> Result<CompareReport, BackupError> {
    let a = first.catalog()?;
    let b = second.catalog()?;
    let mut rep = CompareReport::default();
    let mut seen = BTreeSet::new();
    for ea in &a.entries {
        let Some(eb) = b.find(&ea.uuid, ea.ctransid) else {
            rep.only_in_first.push(EntryRef::of(ea));
            continue;
        };
        seen.insert(eb.id);
        rep.shared += 1;
        let differences = entry_differences(ea, eb);
        if !differences.is_empty() {
            let d = Disagreement {
                first: EntryRef::of(ea),
                second_id: eb.id,
                differences,
            };
            if either_synthesized(ea, eb) {
                rep.other_stream.push(d);
            } else {
                rep.disagree.push(d);
            }
        }
    }
    rep.only_in_second = b
        .entries
        .iter()
        .filter(|e| !seen.contains(&e.id))
        .map(EntryRef::of)
        .collect();
    Ok(rep)
}

/// Whether either of two records of one snapshot is a synthetic full
/// stream: then they may record different streams, both of the snapshot
/// (a synthetic full replaces the stream it was made for in one
/// repository, not in its copies).
pub(crate) fn either_synthesized(a: &Entry, b: &Entry) -> bool {
    a.synthesized_from.is_some() || b.synthesized_from.is_some()
}

/// The fields of two records of one snapshot's stream that differ.
pub(crate) fn entry_differences(a: &Entry, b: &Entry) -> Vec<String> {
    let mut out = Vec::new();
    let mut field = |name: &str, x: String, y: String| {
        if x != y {
            out.push(format!("{name}: {x} ≠ {y}"));
        }
    };
    field("kind", a.kind.as_str().into(), b.kind.as_str().into());
    let parent = |e: &Entry| match (&e.parent_uuid, e.parent_ctransid) {
        (Some(u), Some(c)) => format!("{u} ctransid {c}"),
        _ => String::from("none"),
    };
    field("parent", parent(a), parent(b));
    field(
        "stream_bytes",
        a.stream_bytes.to_string(),
        b.stream_bytes.to_string(),
    );
    field(
        "stream_blake3",
        store::quoted(&a.stream_blake3),
        store::quoted(&b.stream_blake3),
    );
    field("commands", a.commands.to_string(), b.commands.to_string());
    field("proto", a.proto.to_string(), b.proto.to_string());
    out
}

#[cfg(test)]
mod compare_tests {
    use super::*;
    use crate::backup::catalog::Kind;

    fn entry(id: u64, uuid: &str, parent: Option<(&str, u64)>, hash: &str) -> Entry {
        Entry {
            id,
            path: format!("snaps/s{id}"),
            uuid: uuid.to_owned(),
            ctransid: 7,
            parent_uuid: parent.map(|p| p.0.to_owned()),
            parent_ctransid: parent.map(|p| p.1),
            parent_id: parent.map(|_| 1),
            kind: if parent.is_some() {
                Kind::Incremental
            } else {
                Kind::Full
            },
            time: String::new(),
            origin: String::new(),
            file: String::new(),
            stream_bytes: 100,
            stored_bytes: 50,
            stream_blake3: hash.to_owned(),
            commands: 3,
            proto: 1,
            stored_at: String::new(),
            synthesized_from: None,
        }
    }

    #[test]
    fn records_of_one_stream_agree_whatever_is_stored() {
        let a = entry(1, "u1", None, "h");
        let mut b = entry(9, "u1", None, "h");
        b.stored_bytes = 77;
        b.path = String::from("elsewhere");
        assert!(entry_differences(&a, &b).is_empty());
    }

    #[test]
    fn a_hash_size_or_parent_that_differs_is_named() {
        let a = entry(2, "u2", Some(("u1", 7)), "h");
        let mut b = entry(2, "u2", Some(("u0", 7)), "x\u{1b}");
        b.stream_bytes = 101;
        assert_eq!(
            entry_differences(&a, &b),
            [
                "parent: u1 ctransid 7 ≠ u0 ctransid 7",
                "stream_bytes: 100 ≠ 101",
                "stream_blake3: \"h\" ≠ \"x\\u{1b}\"",
            ]
        );
    }
}
