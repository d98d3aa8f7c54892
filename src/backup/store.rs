//! Where a repository's objects live: one small trait, [`Store`] — get
//! (whole or a byte range), put-if-absent, list, delete and multipart
//! upload — with two implementations: [`LocalStore`], a directory, and
//! `S3Store` (in `s3`, with the `s3` feature), an S3-compatible bucket
//! through `object_store` (its tokio runtime lives inside that type and
//! nowhere else).
//!
//! Keys are `/`-separated relative paths (`config`, `catalog/00000007.json`,
//! `streams/….btrs.zst`). Visibility is atomic in both stores: a local
//! object is written under a temporary name in `tmp/`, flushed (fsync of the
//! file), linked to its final name (which fails if the name exists) and its
//! directory flushed; an S3 object appears when its PUT (conditional:
//! `If-None-Match: *`) or its multipart upload completes.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The object does not exist.
    #[error("{location}: no such object")]
    NotFound {
        /// The repository and key.
        location: String,
    },
    /// The object exists already (put-if-absent).
    #[error("{location}: exists already")]
    Exists {
        /// The repository and key.
        location: String,
    },
    /// The repository itself cannot be reached (a missing directory, a
    /// refused connection, a missing bucket).
    #[error("{location}: repository unreachable: {error}")]
    Unreachable {
        /// The repository.
        location: String,
        /// Why.
        error: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Another failure (I/O, a refused request).
    #[error("{op} {location}: {error}")]
    Other {
        /// What was being done (`read`, `write`, `list`…).
        op: &'static str,
        /// The repository and key.
        location: String,
        /// Why.
        error: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StoreError {
    /// Whether the object was missing.
    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::NotFound { .. })
    }
}

/// A listed object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Its key.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
}

/// An upload in progress: bytes are appended, and the object appears only
/// at [`Upload::complete`]. Dropping an upload without completing it
/// aborts it (nothing appears).
pub trait Upload: Send {
    /// Append bytes.
    ///
    /// # Errors
    ///
    /// I/O or network errors.
    fn write(&mut self, data: &[u8]) -> Result<(), StoreError>;
    /// Make the object visible under its key, durably (fails if the key
    /// exists).
    ///
    /// # Errors
    ///
    /// I/O or network errors; [`StoreError::Exists`].
    fn complete(self: Box<Self>) -> Result<(), StoreError>;
    /// Keep what was written when the upload is dropped without being
    /// completed (a run killed, or failed: a lost connection, a full
    /// disk), for a later writer to continue ([`Store::continue_upload`]).
    /// Stores that cannot continue an upload abort it as before.
    fn keep_when_dropped(&mut self) {}
    /// Whether the store records, as the upload's parts are stored, the
    /// state a later writer continues from ([`Upload::write_resumable`]'s
    /// `state`): an S3 multipart upload, whose parts cannot be read back.
    fn records_state(&self) -> bool {
        false
    }
    /// Append bytes that end at a point where the upload can be continued
    /// (a frame of a stream file). `state` gives what a continuation needs
    /// at their end ([`Store::recorded`] gives it back); a store that
    /// [records state](Upload::records_state) asks for it when it stores
    /// what ends there (`None`: nothing to record yet).
    ///
    /// # Errors
    ///
    /// As [`Upload::write`].
    fn write_resumable(
        &mut self,
        data: &[u8],
        _state: &mut dyn FnMut() -> Option<String>,
    ) -> Result<(), StoreError> {
        self.write(data)
    }
}

/// What an unfinished upload recorded for a continuation
/// ([`Store::recorded`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The key the upload completes as.
    pub key: String,
    /// The bytes stored in it up to the recorded point.
    pub stored_bytes: u64,
    /// The state given with them ([`Upload::write_resumable`]).
    pub state: String,
}

/// The operations a repository needs from where it lives.
pub trait Store: Send + Sync + fmt::Debug {
    /// The repository as the user named it (for messages).
    fn name(&self) -> &str;
    /// The whole object, or the `range` of its bytes (the range must lie
    /// inside the object).
    ///
    /// # Errors
    ///
    /// [`StoreError::NotFound`]; I/O or network errors; a short object.
    fn get(&self, key: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, StoreError>;
    /// The `range` of `key`'s bytes into `buf` (replacing what it held):
    /// [`Store::get`] into a buffer the caller reuses.
    ///
    /// # Errors
    ///
    /// As [`Store::get`].
    fn get_into(&self, key: &str, range: Range<u64>, buf: &mut Vec<u8>) -> Result<(), StoreError> {
        *buf = self.get(key, Some(range))?;
        Ok(())
    }
    /// Create `key` with `data` unless it exists; returns false if it
    /// existed (nothing was written).
    ///
    /// # Errors
    ///
    /// I/O or network errors.
    fn put_if_absent(&self, key: &str, data: &[u8]) -> Result<bool, StoreError>;
    /// The objects whose keys start with `prefix`, sorted by key.
    ///
    /// # Errors
    ///
    /// I/O or network errors.
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError>;
    /// Remove `key` (no error if it is gone already).
    ///
    /// # Errors
    ///
    /// I/O or network errors.
    fn delete(&self, key: &str) -> Result<(), StoreError>;
    /// Start writing `key` piece by piece.
    ///
    /// # Errors
    ///
    /// I/O or network errors.
    fn multipart(&self, key: &str) -> Result<Box<dyn Upload>, StoreError>;
    /// Continue the unfinished upload `tmp` (a key in `tmp/` as
    /// [`Store::list`] gives it) as an upload of `key`: its first `keep`
    /// bytes stay, the rest is cut off, and what is written goes after
    /// them. Only stores whose unfinished uploads can be read back and cut
    /// (a directory) can; the others return `Ok(None)`.
    ///
    /// # Errors
    ///
    /// I/O errors; [`StoreError::NotFound`].
    fn continue_upload(
        &self,
        _tmp: &str,
        _keep: u64,
        _key: &str,
    ) -> Result<Option<Box<dyn Upload>>, StoreError> {
        Ok(None)
    }
    /// Whether [`Store::continue_upload`] can continue unfinished uploads
    /// (their entries in `tmp/` are then kept for the next writer).
    fn continues_uploads(&self) -> bool {
        false
    }
    /// The state the unfinished upload `tmp` recorded as its parts were
    /// stored, for stores that [record it](Upload::records_state); `None`
    /// when it recorded none (or the store records nothing: a directory's
    /// partial file is read back instead).
    ///
    /// # Errors
    ///
    /// I/O or network errors; [`StoreError::NotFound`].
    fn recorded(&self, _tmp: &str) -> Result<Option<Recorded>, StoreError> {
        Ok(None)
    }
    /// Remove what an unfinished upload left in `tmp/` (`key`, as
    /// [`Store::list`] gives it): a temporary file; in S3 a marker, whose
    /// multipart upload is aborted first (its parts deleted). Needs the
    /// exclusive lock.
    ///
    /// # Errors
    ///
    /// I/O or network errors (the key then stays, for the next try).
    fn discard_unfinished(&self, key: &str) -> Result<(), StoreError> {
        self.delete(key)
    }
    /// Check that the repository's root exists and can be reached.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unreachable`].
    fn check_reachable(&self) -> Result<(), StoreError>;
    /// The local directory, for a [`LocalStore`] (locks use `flock` there).
    fn local_root(&self) -> Option<&Path> {
        None
    }
}

/// A repository in a local directory.
#[derive(Debug)]
pub struct LocalStore {
    root: PathBuf,
    name: String,
}

/// Temporary files of unfinished uploads (removed by the next writer).
pub const TMP_DIR: &str = "tmp";

impl LocalStore {
    /// The store rooted at `root` (which need not exist yet).
    pub fn new(root: &Path) -> LocalStore {
        LocalStore {
            root: root.to_path_buf(),
            name: root.display().to_string(),
        }
    }

    /// The repository's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    fn location(&self, key: &str) -> String {
        format!("{}/{key}", self.name.trim_end_matches('/'))
    }

    fn err(&self, op: &'static str, key: &str, e: io::Error) -> StoreError {
        if e.kind() == io::ErrorKind::NotFound {
            if !self.root.is_dir() {
                return StoreError::Unreachable {
                    location: self.name.clone(),
                    error: Box::new(io::Error::new(io::ErrorKind::NotFound, "no such directory")),
                };
            }
            return StoreError::NotFound {
                location: self.location(key),
            };
        }
        StoreError::Other {
            op,
            location: self.location(key),
            error: Box::new(e),
        }
    }

    /// A new temporary file in `tmp/` (created with the directory).
    fn temp_file(&self, key: &str) -> Result<(File, PathBuf), StoreError> {
        let dir = self.root.join(TMP_DIR);
        match fs::create_dir(&dir) {
            Ok(()) => sync_dir(&self.root).map_err(|e| self.err("sync", "", e))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(self.err("create", TMP_DIR, e)),
        }
        let base = key.rsplit('/').next().unwrap_or(key);
        for _ in 0..16 {
            let path = dir.join(format!(
                "{base}.{}.{:016x}",
                std::process::id(),
                random_u64()
            ));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => return Ok((f, path)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(self.err("create", TMP_DIR, e)),
            }
        }
        Err(self.err(
            "create",
            TMP_DIR,
            io::Error::new(io::ErrorKind::AlreadyExists, "no free temporary name"),
        ))
    }

    /// Flush `file` (at `tmp`), give it the name `key` unless that exists,
    /// and flush the directory: the object is then durable.
    fn publish(&self, file: File, tmp: &Path, key: &str) -> Result<bool, StoreError> {
        file.sync_all().map_err(|e| self.err("sync", key, e))?;
        drop(file);
        let dst = self.path(key);
        let parent = dst.parent().unwrap_or(&self.root).to_path_buf();
        if let Err(e) = fs::create_dir_all(&parent) {
            let _ = fs::remove_file(tmp);
            return Err(self.err("create", key, e));
        }
        // link() refuses an existing name: put-if-absent.
        let res = fs::hard_link(tmp, &dst);
        let _ = fs::remove_file(tmp);
        match res {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(self.err("link", key, e)),
        }
        sync_dir(&parent).map_err(|e| self.err("sync", key, e))?;
        Ok(true)
    }
}

/// Flush a directory's entries.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A random number (from the OS's hasher keys: no extra crate).
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

impl Store for LocalStore {
    fn name(&self) -> &str {
        &self.name
    }

    fn get(&self, key: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, StoreError> {
        let mut f = File::open(self.path(key)).map_err(|e| self.err("open", key, e))?;
        match range {
            None => {
                let mut buf = Vec::new();
                f.read_to_end(&mut buf)
                    .map_err(|e| self.err("read", key, e))?;
                Ok(buf)
            }
            Some(r) => {
                let len = r
                    .end
                    .checked_sub(r.start)
                    .ok_or_else(|| self.err("read", key, io::Error::other("invalid byte range")))?;
                let len = usize::try_from(len)
                    .map_err(|_| self.err("read", key, io::Error::other("range too large")))?;
                let mut buf = vec![0; len];
                f.seek(SeekFrom::Start(r.start))
                    .and_then(|_| f.read_exact(&mut buf))
                    .map_err(|e| {
                        let e = if e.kind() == io::ErrorKind::UnexpectedEof {
                            io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                format!("the object ends before byte {}", r.end),
                            )
                        } else {
                            e
                        };
                        self.err("read", key, e)
                    })?;
                Ok(buf)
            }
        }
    }

    fn get_into(&self, key: &str, range: Range<u64>, buf: &mut Vec<u8>) -> Result<(), StoreError> {
        use std::os::unix::fs::FileExt;
        let f = File::open(self.path(key)).map_err(|e| self.err("open", key, e))?;
        let len = range
            .end
            .checked_sub(range.start)
            .and_then(|l| usize::try_from(l).ok())
            .ok_or_else(|| self.err("read", key, io::Error::other("invalid byte range")))?;
        // A reused buffer: only growth is zeroed.
        buf.resize(len, 0);
        f.read_exact_at(buf, range.start).map_err(|e| {
            let e = if e.kind() == io::ErrorKind::UnexpectedEof {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the object ends before byte {}", range.end),
                )
            } else {
                e
            };
            self.err("read", key, e)
        })
    }

    fn put_if_absent(&self, key: &str, data: &[u8]) -> Result<bool, StoreError> {
        if self.path(key).exists() {
            return Ok(false);
        }
        let (mut f, tmp) = self.temp_file(key)?;
        if let Err(e) = f.write_all(data) {
            let _ = fs::remove_file(&tmp);
            return Err(self.err("write", key, e));
        }
        self.publish(f, &tmp, key)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        // Keys are DIR/NAME at most one level deep below the prefix's
        // directory.
        let (dir, name_prefix) = match prefix.rfind('/') {
            Some(i) => (&prefix[..i], &prefix[i + 1..]),
            None => ("", prefix),
        };
        let path = if dir.is_empty() {
            self.root.clone()
        } else {
            self.path(dir)
        };
        let rd = match fs::read_dir(&path) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound && self.root.is_dir() => {
                return Ok(Vec::new());
            }
            Err(e) => return Err(self.err("list", dir, e)),
        };
        let mut out = Vec::new();
        for ent in rd {
            let ent = ent.map_err(|e| self.err("list", dir, e))?;
            let Some(name) = ent.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if !name.starts_with(name_prefix) {
                continue;
            }
            let meta = ent.metadata().map_err(|e| self.err("stat", &name, e))?;
            if !meta.is_file() {
                continue;
            }
            let key = if dir.is_empty() {
                name
            } else {
                format!("{dir}/{name}")
            };
            out.push(ObjectInfo {
                key,
                size: meta.len(),
            });
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        match fs::remove_file(self.path(key)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.err("delete", key, e)),
        }
    }

    fn multipart(&self, key: &str) -> Result<Box<dyn Upload>, StoreError> {
        let (file, tmp) = self.temp_file(key)?;
        Ok(Box::new(LocalUpload {
            store: LocalStore::new(&self.root),
            key: key.to_owned(),
            file: Some(io::BufWriter::with_capacity(1 << 20, file)),
            tmp,
            keep: false,
        }))
    }

    fn continue_upload(
        &self,
        tmp: &str,
        keep: u64,
        key: &str,
    ) -> Result<Option<Box<dyn Upload>>, StoreError> {
        let path = self.path(tmp);
        let mut file = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| self.err("open", tmp, e))?;
        file.set_len(keep)
            .and_then(|()| file.seek(SeekFrom::Start(keep)))
            .map_err(|e| self.err("truncate", tmp, e))?;
        Ok(Some(Box::new(LocalUpload {
            store: LocalStore::new(&self.root),
            key: key.to_owned(),
            file: Some(io::BufWriter::with_capacity(1 << 20, file)),
            tmp: path,
            keep: false,
        })))
    }

    fn continues_uploads(&self) -> bool {
        true
    }

    fn check_reachable(&self) -> Result<(), StoreError> {
        match fs::metadata(&self.root) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(StoreError::Unreachable {
                location: self.name.clone(),
                error: Box::new(io::Error::other("not a directory")),
            }),
            Err(e) => Err(StoreError::Unreachable {
                location: self.name.clone(),
                error: Box::new(e),
            }),
        }
    }

    fn local_root(&self) -> Option<&Path> {
        Some(&self.root)
    }
}

/// A local upload: a temporary file, linked into place at the end.
struct LocalUpload {
    store: LocalStore,
    key: String,
    file: Option<io::BufWriter<File>>,
    tmp: PathBuf,
    /// Leave the temporary file when dropped unfinished.
    keep: bool,
}

impl Upload for LocalUpload {
    fn write(&mut self, data: &[u8]) -> Result<(), StoreError> {
        let Some(f) = self.file.as_mut() else {
            return Ok(());
        };
        f.write_all(data)
            .map_err(|e| self.store.err("write", &self.key, e))
    }

    fn complete(mut self: Box<Self>) -> Result<(), StoreError> {
        let Some(f) = self.file.take() else {
            return Ok(());
        };
        let f = f
            .into_inner()
            .map_err(|e| self.store.err("write", &self.key, e.into_error()))?;
        if self.store.publish(f, &self.tmp, &self.key)? {
            Ok(())
        } else {
            Err(StoreError::Exists {
                location: self.store.location(&self.key),
            })
        }
    }

    fn keep_when_dropped(&mut self) {
        self.keep = true;
    }
}

impl Drop for LocalUpload {
    fn drop(&mut self) {
        if let Some(mut f) = self.file.take() {
            if self.keep {
                // What was written stays for the next run (a failed flush
                // leaves a shorter file, which is cut at its last whole
                // frame then).
                let _ = f.flush();
            } else {
                let _ = fs::remove_file(&self.tmp);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_put_if_absent_get_list_delete() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::new(dir.path());
        assert!(s.put_if_absent("catalog/00000001.json", b"one").unwrap());
        assert!(!s.put_if_absent("catalog/00000001.json", b"two").unwrap());
        assert_eq!(s.get("catalog/00000001.json", None).unwrap(), b"one");
        assert_eq!(s.get("catalog/00000001.json", Some(1..3)).unwrap(), b"ne");
        let e = s.get("catalog/00000001.json", Some(1..9)).unwrap_err();
        assert!(e.to_string().contains("ends before byte 9"), "{e}");
        assert!(s.get("catalog/2", None).unwrap_err().is_not_found());
        let mut up = s.multipart("streams/a").unwrap();
        up.write(b"ab").unwrap();
        up.write(b"cd").unwrap();
        assert!(
            s.list("streams/").unwrap().is_empty(),
            "invisible before complete"
        );
        up.complete().unwrap();
        let l = s.list("streams/").unwrap();
        assert_eq!(
            l,
            vec![ObjectInfo {
                key: "streams/a".into(),
                size: 4
            }]
        );
        let up = s.multipart("streams/b").unwrap();
        drop(up);
        assert_eq!(
            s.list("streams/").unwrap().len(),
            1,
            "dropped upload aborted"
        );
        assert!(s.list("tmp/").unwrap().is_empty(), "temporary file removed");
        s.delete("streams/a").unwrap();
        s.delete("streams/a").unwrap();
        assert!(s.list("streams/").unwrap().is_empty());
        let gone = LocalStore::new(&dir.path().join("nope"));
        assert!(matches!(
            gone.check_reachable(),
            Err(StoreError::Unreachable { .. })
        ));
        assert!(matches!(
            gone.get("config", None),
            Err(StoreError::Unreachable { .. })
        ));
    }
}
