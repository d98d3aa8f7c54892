//! An encrypted repository's objects as plaintext: a [`Store`] over
//! another that seals catalogs ([`seal`](super::seal)) and writes and
//! reads stream objects as age files ([`agefile`]), so that everything
//! above it (the catalog, the stream file's writer and reader, verify,
//! restore) works on plaintext and never sees a key.
//!
//! * `catalog/…`: sealed with the write key; one that does not open is
//!   refused as forged. So are the browsing index's roots; its packs
//!   pass through (the index seals each page in them).
//! * `streams/…`: age files for the recipients, bound to their key. A
//!   range of the plaintext is read by opening the chunks that hold it;
//!   [`Store::plain_len`] gives the plaintext's length from the stored
//!   size (reading the header, which is checked there: recipients,
//!   binding, MAC). Reading them needs an identity: a host holding only
//!   the write key gets a clear error.
//! * Everything else (`config`, `keys/`, `locks/`, `lock`) passes through.
//!
//! * `tmp/…` (a directory): the partial file of an unfinished stream
//!   object is read as plaintext too (its whole chunks), with the payload
//!   key from its record `tmp/NAME.key` ([`unfinished`]), which listings
//!   hide; `continue_upload` cuts it at a chunk and seals on from there.
//!   In S3 the record travels in the upload's marker instead: the state
//!   [`Store::recorded`] gives back is opened from it.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::agefile::{self, BindKey, ObjectName, PayloadKey, PayloadState, PayloadWriter, Unwrap};
use super::keys::Keys;
use super::seal::SealKey;
use super::unfinished::{self, TmpKind, Unfinished};
use crate::backup::STREAMS_DIR;
use crate::backup::catalog::CATALOG_DIR;
use crate::backup::store::{
    HeldLock, HoldError, LocalStore, ObjectInfo, Recorded, Store, StoreError, TMP_DIR, Upload,
};
use crate::backup::treehash::{hex, unhex};

/// A store whose catalogs and stream objects are encrypted (see the
/// module docs).
pub struct CryptStore {
    inner: Arc<dyn Store>,
    keys: Arc<Keys>,
    seal: SealKey,
    bind: BindKey,
    /// Opened stream objects: their header length and payload key, by key.
    heads: Mutex<HashMap<String, Arc<Head>>>,
}

impl std::fmt::Debug for CryptStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CryptStore")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// What reading a stream object needs, from its header.
struct Head {
    /// The header's length (with the nonce): where the payload starts.
    len: u64,
    /// The object's stored size.
    stored: u64,
    key: PayloadKey,
    /// An unfinished upload's partial file: whole chunks, none the last.
    unfinished: bool,
}

fn is_stream(key: &str) -> bool {
    key.starts_with(STREAMS_DIR)
}

/// Objects sealed whole under the write key: catalogs, and the browsing
/// index's roots and pages of their own (file names and attributes are
/// user data). The index's packs pass through: each page in them is
/// sealed on its own by the index (so that one is read with one ranged
/// read), bound to its page's name.
fn is_catalog(key: &str) -> bool {
    use crate::backup::index::repo::{INDEX_DIR, PACK_PREFIX};
    key.starts_with(CATALOG_DIR) || key.starts_with(INDEX_DIR) && !key.starts_with(PACK_PREFIX)
}

impl CryptStore {
    /// `inner`'s objects, encrypted with `keys`.
    pub fn new(inner: Arc<dyn Store>, keys: Keys) -> CryptStore {
        CryptStore {
            seal: keys.write.seal_key(),
            bind: keys.write.bind_key(),
            inner,
            keys: Arc::new(keys),
            heads: Mutex::new(HashMap::new()),
        }
    }

    /// The keys.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    fn name_of<'a>(&'a self, key: &'a str) -> ObjectName<'a> {
        ObjectName {
            repo: &self.keys.repo,
            key,
        }
    }

    fn err(&self, op: &'static str, key: &str, what: String) -> StoreError {
        StoreError::Other {
            op,
            location: format!("{}: {key}", self.inner.name()),
            error: what.into(),
        }
    }

    /// The header of stream object `key` (`stored` bytes long), read and
    /// checked once.
    fn head(&self, key: &str, stored: u64) -> Result<Arc<Head>, StoreError> {
        if let Some(h) = self.lock_heads().get(key)
            && h.stored == stored
        {
            return Ok(Arc::clone(h));
        }
        if self.keys.identities.is_empty() {
            return Err(self.err(
                "decrypt",
                key,
                String::from(
                    "reading stream contents needs an identity of the repository (--identity FILE or BTRSEND_IDENTITY_FILE, or the passphrase): the write key alone cannot",
                ),
            ));
        }
        let prefix = self
            .inner
            .get(key, Some(0..stored.min(agefile::MAX_HEADER as u64)))?;
        let how = Unwrap::Identities(&self.keys.identities);
        let pk = agefile::open_header(&prefix, &how, &self.bind, self.name_of(key))
            .map_err(|e| self.err("decrypt", key, format!("refused: {e}")))?;
        let len = agefile::header_len(&prefix).unwrap_or(0) as u64;
        let head = Arc::new(Head {
            len,
            stored,
            key: pk,
            unfinished: false,
        });
        self.lock_heads().insert(key.to_owned(), Arc::clone(&head));
        Ok(head)
    }

    /// Whether `key` is the partial file of an unfinished stream object
    /// read back as plaintext (a directory's).
    fn is_partial(&self, key: &str) -> bool {
        self.reads_back() && unfinished::tmp_kind(key) == TmpKind::Partial
    }

    fn lock_heads(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Head>>> {
        self.heads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn cached_head(&self, key: &str) -> Result<Arc<Head>, StoreError> {
        match self.lock_heads().get(key) {
            Some(h) => Ok(Arc::clone(h)),
            None => Err(self.err(
                "decrypt",
                key,
                String::from("its length was not given before it was read"),
            )),
        }
    }

    /// The plaintext `range` of stream object `key`, or of the partial
    /// file `key` of an unfinished one.
    fn read_plain(
        &self,
        key: &str,
        range: Range<u64>,
        out: &mut Vec<u8>,
    ) -> Result<(), StoreError> {
        out.clear();
        if range.is_empty() {
            return Ok(());
        }
        let head = if is_stream(key) {
            self.cached_head(key)?
        } else {
            self.partial_head(key)?
        };
        let chunk = agefile::CHUNK as u64;
        let (first, last) = (range.start / chunk, (range.end - 1) / chunk);
        // An unfinished payload has no last chunk yet: the caller reads
        // only whole chunks (as the listing's size says).
        let (stored, chunks) = if head.unfinished {
            (u64::MAX, u64::MAX)
        } else {
            let payload = head.stored - head.len;
            let plain = agefile::plain_len(payload).ok_or_else(|| {
                self.err(
                    "decrypt",
                    key,
                    format!("{payload} payload bytes is no age payload's length"),
                )
            })?;
            if range.end > plain {
                return Err(self.err(
                    "read",
                    key,
                    format!("the plaintext ends before byte {}", range.end),
                ));
            }
            (head.stored, plain.div_ceil(chunk).max(1))
        };
        let from = head.len + agefile::chunk_offset(first);
        let to = (head.len + agefile::chunk_offset(last + 1)).min(stored);
        self.inner.get_into(key, from..to, out)?;
        let skip = (range.start - first * chunk) as usize;
        agefile::open_in_place(&head.key, first, out, 0, last + 1 == chunks, skip).map_err(|i| {
            self.err(
                "decrypt",
                key,
                format!(
                    "chunk {i} (bytes {}..{} of the object) does not authenticate: changed, cut short or reordered",
                    head.len + agefile::chunk_offset(i),
                    (head.len + agefile::chunk_offset(i + 1)).min(stored)
                ),
            )
        })?;
        let n = (range.end - range.start) as usize;
        if out.len() < n {
            out.clear();
            return Err(self.err(
                "read",
                key,
                format!("the plaintext ends before byte {}", range.end),
            ));
        }
        out.truncate(n);
        Ok(())
    }

    /// Whether unfinished uploads are read back (a directory), so their
    /// records are files of their own; else (S3) records ride in markers.
    fn reads_back(&self) -> bool {
        self.inner.reads_back_unfinished()
    }

    /// The record of the partial file `tmp` (a directory's), opened.
    fn record_of(&self, tmp: &str) -> Result<Unfinished, String> {
        let (name, _) = unfinished::split_tmp(tmp)
            .ok_or_else(|| String::from("not the partial file of a stream object"))?;
        let at = format!("{TMP_DIR}/{name}{}", unfinished::RECORD_SUFFIX);
        let sealed = self.inner.get(&at, None).map_err(|e| match e {
            StoreError::NotFound { .. } => format!("it has no record ({at})"),
            e => e.to_string(),
        })?;
        Unfinished::open(&self.seal, &self.keys.repo, name, &sealed)
    }

    /// The header and payload key of the partial file `tmp`, from its
    /// record, checked against the file's first bytes once.
    fn partial_head(&self, tmp: &str) -> Result<Arc<Head>, StoreError> {
        if let Some(h) = self.lock_heads().get(tmp) {
            return Ok(Arc::clone(h));
        }
        let refused = |what: String| self.err("decrypt", tmp, what);
        let u = self.record_of(tmp).map_err(refused)?;
        let header = self.inner.get(tmp, Some(0..u.header))?;
        if blake3::hash(&header).to_hex().as_str() != u.header_hash {
            return Err(refused(String::from(
                "its header is not the one its record was made for",
            )));
        }
        let key = u
            .payload_key()
            .ok_or_else(|| refused(String::from("its record holds no payload key")))?;
        let head = Arc::new(Head {
            len: u.header,
            stored: 0,
            key,
            unfinished: true,
        });
        self.lock_heads().insert(tmp.to_owned(), Arc::clone(&head));
        Ok(head)
    }

    /// The plaintext a partial file of `stored` bytes holds in whole
    /// chunks (0 when it cannot be read).
    fn partial_plain_len(&self, tmp: &str, stored: u64) -> u64 {
        match self.record_of(tmp) {
            Ok(u) => agefile::readable_unfinished(stored.saturating_sub(u.header)),
            Err(_) => 0,
        }
    }

    /// The record in an S3 upload's marker `tmp`, opened.
    fn marker_record(&self, tmp: &str) -> Result<Option<(Recorded, Unfinished)>, StoreError> {
        let Some(r) = self.inner.recorded(tmp)? else {
            return Ok(None);
        };
        let refused = |what: String| self.err("decrypt", tmp, what);
        let name = r.key.rsplit('/').next().unwrap_or_default();
        let sealed = unhex(&r.state)
            .ok_or_else(|| refused(String::from("its recorded state is not sealed")))?;
        let u = Unfinished::open(&self.seal, &self.keys.repo, name, &sealed).map_err(refused)?;
        if u.key != r.key || u.stored_bytes() != Some(r.stored_bytes) {
            return Err(refused(format!(
                "its record is of {} bytes stored, its parts hold {}",
                u.stored_bytes().unwrap_or(0),
                r.stored_bytes
            )));
        }
        Ok(Some((r, u)))
    }

    /// A new upload of stream object `key` through `inner`, its header
    /// written; `at`: where a continued one goes on from.
    fn age_upload(
        &self,
        mut inner: Box<dyn Upload>,
        key: &str,
        start: Start,
    ) -> Result<Box<dyn Upload>, StoreError> {
        let (header, writer, record) = match start {
            Start::New => {
                let (header, pk) =
                    agefile::new_header(&self.keys.recipients, &self.bind, self.name_of(key))
                        .map_err(|e| self.err("encrypt", key, e))?;
                let record = Unfinished::new(key, &header, &pk);
                if self.reads_back() {
                    // Before the header: a partial file without its
                    // record holds nothing (one that a kill left between
                    // the two is empty, and the next writer removes it).
                    let at = unfinished::record_key(key);
                    let sealed = record
                        .seal(&self.seal, &self.keys.repo)
                        .map_err(|e| self.err("encrypt", &at, e))?;
                    self.inner.delete(&at)?;
                    self.inner.put_if_absent(&at, &sealed)?;
                }
                inner.write(&header)?;
                (header.len() as u64, PayloadWriter::new(pk), record)
            }
            Start::Continued(u, state) => (u.header, PayloadWriter::resume(state), u),
        };
        let recorder = inner.records_state().then(|| Recorder {
            seal: self.seal.clone(),
            repo: self.keys.repo.clone(),
            record,
        });
        let record_file = self.reads_back().then(|| RecordFile {
            store: Arc::clone(&self.inner),
            key: unfinished::record_key(key),
            keep: false,
        });
        Ok(Box::new(AgeUpload {
            inner,
            header,
            writer: Some(writer),
            out: Vec::new(),
            recorder,
            record_file,
        }))
    }
}

/// Where an [`AgeUpload`] starts.
enum Start {
    New,
    /// Going on from a record, at the writer's place.
    Continued(Unfinished, PayloadState),
}

impl Store for CryptStore {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn get(&self, key: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, StoreError> {
        if is_catalog(key) {
            let sealed = self.inner.get(key, None)?;
            let plain = self
                .seal
                .open(&self.keys.repo, key, &sealed)
                .map_err(|e| self.err("decrypt", key, e.to_string()))?;
            return Ok(match range {
                None => plain,
                Some(r) => plain
                    .get(r.start as usize..r.end as usize)
                    .map(<[u8]>::to_vec)
                    .ok_or_else(|| self.err("read", key, String::from("short object")))?,
            });
        }
        if is_stream(key) {
            let range = match range {
                Some(r) => r,
                None => {
                    let h = self.cached_head(key)?;
                    0..self.plain_len(key, h.stored)?
                }
            };
            let mut out = Vec::new();
            self.read_plain(key, range, &mut out)?;
            return Ok(out);
        }
        if self.is_partial(key) {
            let range = range.ok_or_else(|| {
                self.err(
                    "read",
                    key,
                    String::from("a partial file is read by ranges"),
                )
            })?;
            let mut out = Vec::new();
            self.read_plain(key, range, &mut out)?;
            return Ok(out);
        }
        self.inner.get(key, range)
    }

    fn get_into(&self, key: &str, range: Range<u64>, buf: &mut Vec<u8>) -> Result<(), StoreError> {
        if is_stream(key) || self.is_partial(key) {
            return self.read_plain(key, range, buf);
        }
        *buf = self.get(key, Some(range))?;
        Ok(())
    }

    fn put_if_absent(&self, key: &str, data: &[u8]) -> Result<bool, StoreError> {
        if is_catalog(key) {
            let sealed = self
                .seal
                .seal(&self.keys.repo, key, data)
                .map_err(|e| self.err("encrypt", key, e))?;
            return self.inner.put_if_absent(key, &sealed);
        }
        if is_stream(key) {
            let mut up = self.multipart(key)?;
            up.write(data)?;
            // put_if_absent's contract: an existing object is not an error.
            return match up.complete() {
                Ok(()) => Ok(true),
                Err(StoreError::Exists { .. }) => Ok(false),
                Err(e) => Err(e),
            };
        }
        self.inner.put_if_absent(key, data)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let mut all = self.inner.list(prefix)?;
        if !self.reads_back() {
            return Ok(all);
        }
        // Partial files as the plaintext of their whole chunks; records
        // hidden behind their partial files. A record with none (an
        // upload completed or removed before its record was), or what
        // a killed write of one left, shows as an empty unfinished upload,
        // which the next writer removes.
        let partials: std::collections::HashSet<String> = all
            .iter()
            .filter(|o| unfinished::tmp_kind(&o.key) == TmpKind::Partial)
            .filter_map(|o| unfinished::split_tmp(&o.key).map(|(n, _)| n.to_owned()))
            .collect();
        all.retain_mut(|o| {
            let Some((name, _)) = unfinished::split_tmp(&o.key) else {
                return true;
            };
            match unfinished::tmp_kind(&o.key) {
                TmpKind::Partial => {
                    o.size = self.partial_plain_len(&o.key, o.size);
                    true
                }
                TmpKind::Record if partials.contains(name) => false,
                TmpKind::Record | TmpKind::Other => {
                    o.size = 0;
                    true
                }
            }
        });
        Ok(all)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.lock_heads().remove(key);
        self.inner.delete(key)
    }

    fn multipart(&self, key: &str) -> Result<Box<dyn Upload>, StoreError> {
        let inner = self.inner.multipart(key)?;
        if !is_stream(key) {
            return Ok(inner);
        }
        self.age_upload(inner, key, Start::New)
    }

    fn continue_upload(
        &self,
        tmp: &str,
        keep: u64,
        key: &str,
    ) -> Result<Option<Box<dyn Upload>>, StoreError> {
        let refused = |what: String| self.err("continue upload", tmp, what);
        if self.reads_back() {
            let u = self.record_of(tmp).map_err(refused)?;
            if u.key != key {
                return Err(refused(format!("its object is {}, not {key}", u.key)));
            }
            let head = self.partial_head(tmp)?;
            // The chunks before `keep` stay; the plaintext of the one it
            // falls in (a whole chunk when it falls on a boundary: the
            // writer holds one back until it knows it is not the last) is
            // sealed again with what follows.
            let chunk = agefile::CHUNK as u64;
            let mut chunks = keep / chunk;
            if keep > 0 && keep.is_multiple_of(chunk) {
                chunks -= 1;
            }
            let mut pending = Vec::new();
            if keep > chunks * chunk {
                self.read_plain(tmp, chunks * chunk..keep, &mut pending)?;
            }
            let state = PayloadState {
                key: head.key.clone(),
                chunks,
                pending,
            };
            let stored = head.len + agefile::chunk_offset(chunks);
            let Some(inner) = self.inner.continue_upload(tmp, stored, key)? else {
                return Ok(None);
            };
            self.lock_heads().remove(tmp);
            return self
                .age_upload(inner, key, Start::Continued(u, state))
                .map(Some);
        }
        let Some((r, u)) = self.marker_record(tmp)? else {
            return Ok(None);
        };
        let plain = u.plain_bytes().unwrap_or(0);
        if r.key != key || plain != keep {
            return Err(refused(format!(
                "its record is of {} at {plain} bytes, not {key} at {keep}",
                r.key
            )));
        }
        let state = u
            .state()
            .ok_or_else(|| refused(String::from("its record is inconsistent")))?;
        let Some(inner) = self.inner.continue_upload(tmp, r.stored_bytes, key)? else {
            return Ok(None);
        };
        self.age_upload(inner, key, Start::Continued(u, state))
            .map(Some)
    }

    fn continues_uploads(&self) -> bool {
        self.inner.continues_uploads()
    }

    fn completes_as(&self, tmp: &str) -> Option<String> {
        if self.reads_back() {
            return self.record_of(tmp).ok().map(|u| u.key.clone());
        }
        self.inner.completes_as(tmp)
    }

    fn plain_len(&self, key: &str, stored: u64) -> Result<u64, StoreError> {
        if !is_stream(key) {
            return self.inner.plain_len(key, stored);
        }
        let head = self.head(key, stored)?;
        agefile::plain_len(stored - head.len).ok_or_else(|| {
            self.err(
                "decrypt",
                key,
                format!(
                    "{} payload bytes is no age payload's length (cut short?)",
                    stored - head.len
                ),
            )
        })
    }

    fn recorded(&self, tmp: &str) -> Result<Option<Recorded>, StoreError> {
        if self.reads_back() {
            return Ok(None);
        }
        let Some((r, mut u)) = self.marker_record(tmp)? else {
            return Ok(None);
        };
        let (Some(state), Some(plain)) = (u.checkpoint.take(), u.plain_bytes()) else {
            return Err(self.err(
                "decrypt",
                tmp,
                String::from("its record holds no state of the stream file"),
            ));
        };
        Ok(Some(Recorded {
            key: r.key,
            stored_bytes: plain,
            state,
        }))
    }

    fn discard_unfinished(&self, key: &str) -> Result<(), StoreError> {
        self.lock_heads().remove(key);
        self.inner.discard_unfinished(key)?;
        if !self.reads_back() || unfinished::tmp_kind(key) != TmpKind::Partial {
            return Ok(());
        }
        // Its record goes with the last partial file of its name.
        let Some((name, _)) = unfinished::split_tmp(key) else {
            return Ok(());
        };
        let mut others = self.inner.list(&format!("{TMP_DIR}/{name}."))?;
        others.retain(|o| unfinished::tmp_kind(&o.key) == TmpKind::Partial);
        if others.is_empty() {
            self.inner
                .delete(&format!("{TMP_DIR}/{name}{}", unfinished::RECORD_SUFFIX))?;
        }
        Ok(())
    }

    fn write_only(&self) -> bool {
        self.keys.identities.is_empty()
    }

    fn check_reachable(&self) -> Result<(), StoreError> {
        self.inner.check_reachable()
    }

    fn reads_back_unfinished(&self) -> bool {
        self.inner.reads_back_unfinished()
    }

    fn append_only(&self) -> bool {
        self.inner.append_only()
    }

    fn init_root(&self) -> Option<Result<(), StoreError>> {
        self.inner.init_root()
    }

    fn hold_lock(
        &self,
        exclusive: bool,
        wait: std::time::Duration,
    ) -> Option<Result<Box<dyn HeldLock>, HoldError>> {
        self.inner.hold_lock(exclusive, wait)
    }

    fn local_root(&self) -> Option<&Path> {
        self.inner.local_root()
    }

    fn local(&self) -> Option<&LocalStore> {
        self.inner.local()
    }
}

/// A stream object being written: the header went first, the payload is
/// sealed as it comes.
struct AgeUpload {
    inner: Box<dyn Upload>,
    header: u64,
    writer: Option<PayloadWriter>,
    out: Vec<u8>,
    /// A store that records state (S3): the record sealed into it.
    recorder: Option<Recorder>,
    /// A directory: the record's file.
    record_file: Option<RecordFile>,
}

/// The record file of a directory's upload: removed once the object is
/// complete, or when the upload is dropped without being kept.
struct RecordFile {
    store: Arc<dyn Store>,
    key: String,
    keep: bool,
}

impl Drop for RecordFile {
    fn drop(&mut self) {
        if !self.keep {
            // One left behind is removed by the next writer (it lists as
            // an empty unfinished upload).
            let _ = self.store.delete(&self.key);
        }
    }
}

/// What seals an upload's state into its record (S3).
struct Recorder {
    seal: SealKey,
    repo: String,
    record: Unfinished,
}

impl Upload for AgeUpload {
    fn write(&mut self, data: &[u8]) -> Result<(), StoreError> {
        let Some(w) = self.writer.as_mut() else {
            return Ok(());
        };
        self.out.clear();
        w.write(data, &mut self.out);
        if self.out.is_empty() {
            return Ok(());
        }
        self.inner.write(&self.out)
    }

    fn write_resumable(
        &mut self,
        data: &[u8],
        state: &mut dyn FnMut() -> Option<String>,
    ) -> Result<(), StoreError> {
        let Some(rec) = &self.recorder else {
            return self.write(data);
        };
        let Some(w) = self.writer.as_mut() else {
            return Ok(());
        };
        self.out.clear();
        w.write(data, &mut self.out);
        let w = &*w;
        // Asked for when a part ends here: the stream file's state, and
        // the writer's place, sealed.
        let mut sealed = || {
            let checkpoint = state()?;
            let record = rec.record.at(&w.state(), checkpoint);
            record.seal(&rec.seal, &rec.repo).ok().map(|b| hex(&b))
        };
        self.inner.write_resumable(&self.out, &mut sealed)
    }

    fn complete(mut self: Box<Self>) -> Result<(), StoreError> {
        if let Some(w) = self.writer.take() {
            self.out.clear();
            w.finish(&mut self.out);
            self.inner.write(&self.out)?;
        }
        let AgeUpload {
            inner,
            mut record_file,
            ..
        } = *self;
        // On failure the partial file stays or goes as the upload was
        // told; so does its record. The object complete, the record goes.
        inner.complete()?;
        if let Some(r) = record_file.as_mut() {
            r.keep = false;
        }
        Ok(())
    }

    fn keep_when_dropped(&mut self) {
        if let Some(r) = self.record_file.as_mut() {
            r.keep = true;
        }
        self.inner.keep_when_dropped();
    }

    fn records_state(&self) -> bool {
        self.inner.records_state()
    }

    fn stored_size(&self, plain: u64) -> u64 {
        let chunks = plain.div_ceil(agefile::CHUNK as u64).max(1);
        self.header + plain + chunks * agefile::TAG as u64
    }
}

#[cfg(test)]
mod tests;
