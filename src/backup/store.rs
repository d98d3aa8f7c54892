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

mod limited;
mod local;

use std::fmt;
use std::ops::Range;
use std::path::Path;

pub use limited::LimitedStore;
pub use local::LocalStore;

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
    /// The repository's place is not there: an S3 bucket that does not
    /// exist.
    #[error("{location}: {what}")]
    Missing {
        /// The repository.
        location: String,
        /// What is missing and what to do.
        what: String,
    },
    /// The store is not set up to be used: no credentials, credentials or
    /// a region the server refuses, no permission. The message names what
    /// to set or check.
    #[error("{location}: {what}")]
    Setup {
        /// The repository, or the repository and key.
        location: String,
        /// What is wrong and what to do.
        what: String,
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
    /// The size of the object once `plain` bytes in all were written and
    /// it is complete: `plain` itself, but for an encrypted object.
    fn stored_size(&self, plain: u64) -> u64 {
        plain
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
    /// The key the unfinished upload `tmp` must complete as, when it is
    /// fixed (an encrypted object is bound to its name); `None`: any.
    fn completes_as(&self, _tmp: &str) -> Option<String> {
        None
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
    /// The length of what reading `key` (`stored` bytes long) gives: the
    /// stored size, but for an encrypted object, whose plaintext is read.
    ///
    /// # Errors
    ///
    /// The object cannot be read or is not what its length says (an
    /// encrypted object whose header does not open).
    fn plain_len(&self, _key: &str, stored: u64) -> Result<u64, StoreError> {
        Ok(stored)
    }
    /// Whether stream contents cannot be read with the keys at hand (an
    /// encrypted repository opened with its write key alone, whose
    /// catalogs are authenticated by that key).
    fn write_only(&self) -> bool {
        false
    }
    /// Check that the repository's root exists and can be reached.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unreachable`].
    fn check_reachable(&self) -> Result<(), StoreError>;
    /// Whether an unfinished upload's bytes are read back to continue it
    /// (a directory, here or on the far end of `btrsend serve`), rather
    /// than rebuilt from the state its upload recorded (S3).
    fn reads_back_unfinished(&self) -> bool {
        self.local_root().is_some()
    }
    /// Whether the store refuses to delete or overwrite what it holds
    /// (`btrsend serve --append-only`).
    fn append_only(&self) -> bool {
        false
    }
    /// Make the repository's root for `init` on a store that another
    /// process serves: `None` when the store is not such a one.
    ///
    /// # Errors
    ///
    /// The root cannot be made, or holds files that are no repository.
    fn init_root(&self) -> Option<Result<(), StoreError>> {
        None
    }
    /// Take the repository's lock where the store is served (the far end
    /// holds it for the connection's life); `None` when the store is not
    /// served that way.
    ///
    /// # Errors
    ///
    /// [`HoldError::Held`] after `wait`; store errors.
    fn hold_lock(
        &self,
        _exclusive: bool,
        _wait: std::time::Duration,
    ) -> Option<Result<Box<dyn HeldLock>, HoldError>> {
        None
    }
    /// Run `verify --read-data` of the (unencrypted) repository where it
    /// lies, by the process that serves it, waiting up to `wait` for its
    /// lock there: the report's JSON. `None`: read every byte here.
    ///
    /// # Errors
    ///
    /// [`HoldError::Held`] when the lock stayed held; the far end failed
    /// or refused.
    fn verify_far(&self, _wait: std::time::Duration) -> Option<Result<Vec<u8>, HoldError>> {
        None
    }
    /// The local directory, for a [`LocalStore`] (locks use `flock` there).
    fn local_root(&self) -> Option<&Path> {
        None
    }
    /// The store itself when it is a [`LocalStore`].
    fn local(&self) -> Option<&LocalStore> {
        None
    }
}

/// A lock a store's far end holds ([`Store::hold_lock`]); dropping it
/// lets go.
pub trait HeldLock: Send + Sync + fmt::Debug {}

/// Why [`Store::hold_lock`] did not take the lock.
#[derive(Debug)]
pub enum HoldError {
    /// Another process holds it; who, as its lock file says.
    Held(String),
    /// The store failed.
    Store(StoreError),
}

/// Whether `key` has the one shape a repository's keys have: one or two
/// `/`-separated names, each of letters, digits, `.`, `_` and `-`, not
/// starting with `.`, at most 200 bytes. Keys come from catalogs and
/// listings that someone else may have written: a key of any other shape
/// (`..`, an absolute path, an empty or hidden name, a NUL) is refused
/// before it reaches the filesystem or the network.
///
/// # Errors
///
/// What is wrong with it, as text.
pub fn check_key(key: &str) -> Result<(), String> {
    let mut parts = 0;
    for part in key.split('/') {
        parts += 1;
        check_name(part).map_err(|why| format!("invalid object key {}: {why}", quoted(key)))?;
    }
    if parts > 2 {
        return Err(format!(
            "invalid object key {}: more than two components",
            quoted(key)
        ));
    }
    Ok(())
}

/// One component of a key (see [`check_key`]).
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("an empty component");
    }
    if name.len() > 200 {
        return Err("a component longer than 200 bytes");
    }
    if name.starts_with('.') {
        return Err("a component starting with '.'");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("a character other than letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

/// `s` in double quotes with control characters and non-ASCII escaped, for
/// messages about untrusted text.
pub(crate) fn quoted(s: &str) -> String {
    format!("{:?}", s.chars().take(240).collect::<String>())
}

/// Temporary files of unfinished uploads (removed by the next writer).
pub const TMP_DIR: &str = "tmp";

/// The mode of the directories btrsend makes in a repository.
pub const DIR_MODE: u32 = 0o700;
/// The mode of the files btrsend writes there.
pub const FILE_MODE: u32 = 0o600;

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

    #[test]
    fn keys_and_links_never_reach_outside() {
        let top = tempfile::tempdir().unwrap();
        let root = top.path().join("repo");
        std::fs::create_dir(&root).unwrap();
        let s = LocalStore::new(&root);
        assert!(s.put_if_absent("config", b"c").unwrap());
        std::fs::write(top.path().join("victim"), b"mine").unwrap();
        for bad in [
            "../victim",
            "/etc/passwd",
            "streams/../config",
            "streams/../../victim",
            "a/b/c",
            "streams/.hidden",
            "",
            "streams/",
            "streams/a\0b",
            "streams/a b",
        ] {
            assert!(check_key(bad).is_err(), "{bad:?}");
            assert!(s.get(bad, None).is_err(), "{bad:?}");
            assert!(s.delete(bad).is_err(), "{bad:?}");
            assert!(s.put_if_absent(bad, b"x").is_err(), "{bad:?}");
            assert!(s.multipart(bad).is_err(), "{bad:?}");
        }
        // A directory of the repository that is a symlink to one outside,
        // and an object that is a symlink: neither is followed.
        std::fs::create_dir(top.path().join("elsewhere")).unwrap();
        std::fs::write(top.path().join("elsewhere/x.btrs.zst"), b"secret").unwrap();
        std::os::unix::fs::symlink(top.path().join("elsewhere"), root.join("streams")).unwrap();
        let e = s.get("streams/x.btrs.zst", None).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(s.delete("streams/x.btrs.zst").is_err());
        assert!(s.list("streams/").is_err());
        assert!(top.path().join("elsewhere/x.btrs.zst").exists());
        std::fs::remove_file(root.join("streams")).unwrap();
        std::os::unix::fs::symlink(top.path().join("victim"), root.join("catalog")).unwrap();
        assert!(s.put_if_absent("catalog/1", b"x").is_err());
        std::fs::remove_file(root.join("catalog")).unwrap();
        std::fs::create_dir(root.join("catalog")).unwrap();
        std::os::unix::fs::symlink(top.path().join("victim"), root.join("catalog/2")).unwrap();
        assert!(s.get("catalog/2", None).is_err());
        assert!(
            !s.put_if_absent("catalog/2", b"x").unwrap(),
            "a symlink takes the name"
        );
        assert!(
            s.list("catalog/").unwrap().is_empty(),
            "a symlink is no object"
        );
        s.delete("catalog/2").unwrap();
        assert_eq!(std::fs::read(top.path().join("victim")).unwrap(), b"mine");
        // An unfinished upload that is a hard link to a file outside is
        // never cut or written.
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        std::fs::hard_link(top.path().join("victim"), root.join("tmp/p")).unwrap();
        let e = match s.continue_upload("tmp/p", 0, "streams/a.btrs.zst") {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a hard link was continued"),
        };
        assert!(e.contains("hard links"), "{e}");
        assert_eq!(std::fs::read(top.path().join("victim")).unwrap(), b"mine");
        // Modes: 0700 directories, 0600 files.
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &str| {
            std::fs::metadata(root.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("tmp"), 0o700);
        assert_eq!(mode("config"), 0o600);
    }
}
