//! An encrypted repository's objects as plaintext: a [`Store`] over
//! another that seals catalogs ([`seal`](super::seal)) and writes and
//! reads stream objects as age files ([`agefile`]), so that everything
//! above it (the catalog, the stream file's writer and reader, verify,
//! restore) works on plaintext and never sees a key.
//!
//! * `catalog/…`: sealed with the write key; one that does not open is
//!   refused as forged.
//! * `streams/…`: age files for the recipients, bound to their key. A
//!   range of the plaintext is read by opening the chunks that hold it;
//!   [`Store::plain_len`] gives the plaintext's length from the stored
//!   size (reading the header, which is checked there: recipients,
//!   binding, MAC). Reading them needs an identity: a host holding only
//!   the write key gets a clear error.
//! * Everything else (`config`, `keys/`, `locks/`, `lock`) passes through.
//!
//! Unfinished uploads are not continued in an encrypted repository yet:
//! the store says it cannot ([`Store::continues_uploads`]) and records no
//! state, so an interrupted run's upload is removed and sent again.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::agefile::{self, BindKey, ObjectName, PayloadKey, PayloadWriter, Unwrap};
use super::keys::Keys;
use super::seal::SealKey;
use crate::backup::STREAMS_DIR;
use crate::backup::catalog::CATALOG_DIR;
use crate::backup::store::{LocalStore, ObjectInfo, Recorded, Store, StoreError, Upload};

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
}

fn is_stream(key: &str) -> bool {
    key.starts_with(STREAMS_DIR)
}

fn is_catalog(key: &str) -> bool {
    key.starts_with(CATALOG_DIR)
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
        });
        self.lock_heads().insert(key.to_owned(), Arc::clone(&head));
        Ok(head)
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

    /// The plaintext `range` of stream object `key`.
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
        let head = self.cached_head(key)?;
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
        let chunk = agefile::CHUNK as u64;
        let (first, last) = (range.start / chunk, (range.end - 1) / chunk);
        let chunks = plain.div_ceil(chunk).max(1);
        let from = head.len + agefile::chunk_offset(first);
        let to = (head.len + agefile::chunk_offset(last + 1)).min(head.stored);
        let sealed = self.inner.get(key, Some(from..to))?;
        let mut opened = Vec::with_capacity((last - first + 1) as usize * agefile::CHUNK);
        agefile::open_chunks(&head.key, first, &sealed, last + 1 == chunks, &mut opened).map_err(
            |i| {
                self.err(
                    "decrypt",
                    key,
                    format!(
                        "chunk {i} (bytes {}..{} of the object) does not authenticate: changed, cut short or reordered",
                        head.len + agefile::chunk_offset(i),
                        (head.len + agefile::chunk_offset(i + 1)).min(head.stored)
                    ),
                )
            },
        )?;
        let skip = (range.start - first * chunk) as usize;
        let n = (range.end - range.start) as usize;
        out.extend_from_slice(&opened[skip..skip + n]);
        Ok(())
    }
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
        self.inner.get(key, range)
    }

    fn get_into(&self, key: &str, range: Range<u64>, buf: &mut Vec<u8>) -> Result<(), StoreError> {
        if is_stream(key) {
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
        self.inner.list(prefix)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.lock_heads().remove(key);
        self.inner.delete(key)
    }

    fn multipart(&self, key: &str) -> Result<Box<dyn Upload>, StoreError> {
        let mut inner = self.inner.multipart(key)?;
        if !is_stream(key) {
            return Ok(inner);
        }
        let (header, pk) =
            agefile::new_header(&self.keys.recipients, &self.bind, self.name_of(key))
                .map_err(|e| self.err("encrypt", key, e))?;
        inner.write(&header)?;
        Ok(Box::new(AgeUpload {
            inner,
            header: header.len() as u64,
            writer: Some(PayloadWriter::new(pk)),
            out: Vec::new(),
        }))
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

    fn recorded(&self, _tmp: &str) -> Result<Option<Recorded>, StoreError> {
        Ok(None)
    }

    fn discard_unfinished(&self, key: &str) -> Result<(), StoreError> {
        self.inner.discard_unfinished(key)
    }

    fn write_only(&self) -> bool {
        self.keys.identities.is_empty()
    }

    fn check_reachable(&self) -> Result<(), StoreError> {
        self.inner.check_reachable()
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

    fn complete(mut self: Box<Self>) -> Result<(), StoreError> {
        if let Some(w) = self.writer.take() {
            self.out.clear();
            w.finish(&mut self.out);
            self.inner.write(&self.out)?;
        }
        self.inner.complete()
    }

    fn stored_size(&self, plain: u64) -> u64 {
        let chunks = plain.div_ceil(agefile::CHUNK as u64).max(1);
        self.header + plain + chunks * agefile::TAG as u64
    }
}

#[cfg(test)]
mod tests;
