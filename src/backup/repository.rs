//! The repository itself: making one ([`Repository::init`]), opening it
//! ([`Repository::open`]), its lock, its catalog, finding an entry by what
//! the user typed ([`Repository::find`]), removing what interrupted runs
//! left, and opening an entry's stream file checked against the entry.
//!
//! The operations (`run`, `verify`, `restore`, `import`, `forget`) live in
//! their own modules and build on this one; nothing here stores, checks
//! or restores a snapshot, and nothing here reports progress beyond the
//! lock's notices.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[cfg(feature = "s3")]
use super::S3Store;
use super::catalog::{Catalog, Entry};
use super::crypt::{
    self,
    keys::Keys,
    repo::{Encryption, Secrets},
    store::CryptStore,
};
use super::error::BackupError;
use super::file::format;
use super::file::{Damage, ReadError, StreamFile};
use super::lock::{self, LockKind, RepoLock};
use super::remote::{self, spec::SshSpec, ssh::SshOptions};
use super::store::{self, LocalStore, Store};
use super::{CONFIG_KEY, REPO_ENV, REPO_VERSION, STREAMS_DIR, find, partial};
use crate::progress::Progress;

/// The repository's `config` object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Always `btrsend-repository`.
    pub format: String,
    /// [`REPO_VERSION`].
    pub version: u32,
    /// A random id.
    pub id: String,
    /// When it was made (RFC 3339).
    pub created: String,
    /// How it is encrypted (format 2): `passphrase` or `recipients`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<String>,
    /// The MAC of the fields above under the write key (format 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// An opened repository.
#[derive(Debug, Clone)]
pub struct Repository {
    pub(super) store: Arc<dyn Store>,
    pub(super) config: Config,
    /// The keys it was opened with (encrypted repositories).
    pub(super) keys: Option<Keys>,
    /// The key object the passphrase opened (passphrase mode).
    pub(super) opened_by: Option<String>,
}

/// The store a repository spec names: `s3://BUCKET[/PREFIX]`,
/// `ssh://[USER@]HOST[:PORT]/PATH` (ssh as the environment says) or a
/// directory.
///
/// # Errors
///
/// A malformed S3 spec, or S3 variables that do not work.
pub fn store_for(spec: &str) -> Result<Arc<dyn Store>, BackupError> {
    store_with(spec, &SshOptions::default())
}

/// [`store_for`], reaching an `ssh://[USER@]HOST[:PORT]/PATH` repository
/// as `ssh` says.
///
/// # Errors
///
/// As [`store_for`]; the far end cannot be reached.
pub fn store_with(spec: &str, ssh: &SshOptions) -> Result<Arc<dyn Store>, BackupError> {
    if let Some(parsed) = SshSpec::parse(spec) {
        let parsed = parsed.map_err(BackupError::Invalid)?;
        return Ok(Arc::new(remote::ssh::open(spec, &parsed, ssh)?));
    }
    if spec.is_empty() {
        return Err(BackupError::Invalid(format!(
            "no repository given: use --repo REPO or set {REPO_ENV}"
        )));
    }
    if spec.starts_with("s3://") {
        #[cfg(feature = "s3")]
        return Ok(Arc::new(S3Store::new(spec)?));
        #[cfg(not(feature = "s3"))]
        return Err(BackupError::RepoMissing {
            repo: spec.to_owned(),
            what: String::from("S3 repositories are not supported by this build"),
        });
    }
    Ok(Arc::new(LocalStore::new(Path::new(spec))))
}

pub(super) fn now_rfc3339() -> String {
    jiff::Timestamp::now().to_string()
}

impl Repository {
    /// Make a new, empty repository at `spec` (a missing directory is
    /// created).
    ///
    /// # Errors
    ///
    /// The directory is not empty or holds a repository already; store
    /// errors.
    pub fn init(spec: &str) -> Result<Repository, BackupError> {
        let store = store_for(spec)?;
        Self::init_in(store)
    }

    /// [`Repository::init`] in a given store.
    ///
    /// # Errors
    ///
    /// As [`Repository::init`].
    pub fn init_in(store: Arc<dyn Store>) -> Result<Repository, BackupError> {
        Self::init_encrypted(store, &Encryption::None).map(|(r, _)| r)
    }

    /// [`Repository::init_in`], encrypted as `enc` says: returns the
    /// repository and, when encrypted, its keys (recipients mode: what
    /// the write-key file holds).
    ///
    /// # Errors
    ///
    /// As [`Repository::init`].
    pub fn init_encrypted(
        store: Arc<dyn Store>,
        enc: &Encryption,
    ) -> Result<(Repository, Option<Keys>), BackupError> {
        if let Some(root) = store.local_root() {
            // A stored stream holds every file of a snapshot: a directory
            // this makes is the owner's alone, whatever the umask (one
            // that exists keeps its mode; `verify` warns when others can
            // read it).
            if !root.exists() {
                use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(store::DIR_MODE)
                    .create(root)
                    .and_then(|()| {
                        std::fs::set_permissions(
                            root,
                            std::fs::Permissions::from_mode(store::DIR_MODE),
                        )
                    })
                    .map_err(|e| BackupError::Io {
                        what: format!("cannot create the repository directory {}", root.display()),
                        error: e,
                    })?;
            }
            let mut rd = std::fs::read_dir(root).map_err(|e| BackupError::Io {
                what: format!("cannot read {}", root.display()),
                error: e,
            })?;
            if rd.next().is_some() && !root.join(CONFIG_KEY).exists() {
                return Err(BackupError::Invalid(format!(
                    "{}: the directory is not empty and holds no repository: init needs a new or empty directory",
                    root.display()
                )));
            }
        } else if let Some(made) = store.init_root() {
            made?;
        } else {
            store.check_reachable()?;
        }
        let mut config = Config {
            format: String::from("btrsend-repository"),
            version: REPO_VERSION,
            id: format!("{:016x}{:016x}", store::random_u64(), store::random_u64()),
            created: now_rfc3339(),
            encryption: None,
            mac: None,
        };
        let keys = match enc {
            Encryption::None => None,
            enc => {
                crypt::no_core_dumps();
                Some(crypt::repo::init(&*store, &mut config, enc)?)
            }
        };
        let bytes = serde_json::to_vec_pretty(&config).unwrap_or_default();
        if !store.put_if_absent(CONFIG_KEY, &bytes)? {
            return Err(BackupError::Invalid(format!(
                "{}: a repository exists there already",
                store.name()
            )));
        }
        let store: Arc<dyn Store> = match &keys {
            Some(k) => {
                crypt::repo::store_key_objects(&*store, k, enc)?;
                Arc::new(CryptStore::new(store, k.clone()))
            }
            None => store,
        };
        Catalog::empty().commit(&*store)?;
        if let Some(local) = store.local() {
            let _ = local.open_lock(lock::LOCK_FILE, true);
        }
        Ok((
            Repository {
                store,
                config,
                keys: keys.clone(),
                opened_by: None,
            },
            keys,
        ))
    }

    /// Open the repository at `spec`.
    ///
    /// # Errors
    ///
    /// [`BackupError::RepoMissing`] when there is none (exit code 10);
    /// an unknown format version.
    pub fn open(spec: &str) -> Result<Repository, BackupError> {
        Self::open_in(store_for(spec)?)
    }

    /// [`Repository::open`] of a given store.
    ///
    /// # Errors
    ///
    /// As [`Repository::open`].
    pub fn open_in(store: Arc<dyn Store>) -> Result<Repository, BackupError> {
        Self::open_with(store, &Secrets::default())
    }

    /// [`Repository::open_in`] with the secrets an encrypted repository
    /// needs (none for an unencrypted one, which refuses any).
    ///
    /// # Errors
    ///
    /// As [`Repository::open`]; [`BackupError::Key`] for a missing or
    /// wrong secret.
    pub fn open_with(
        store: Arc<dyn Store>,
        secrets: &Secrets<'_>,
    ) -> Result<Repository, BackupError> {
        store.check_reachable()?;
        let bytes = match store.get(CONFIG_KEY, None) {
            Ok(b) => b,
            Err(e) if e.is_not_found() => {
                return Err(BackupError::RepoMissing {
                    repo: store.name().to_owned(),
                    what: String::from(
                        "not a btrsend repository (no config; make one with `btrsend backup init`)",
                    ),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let config: Config = serde_json::from_slice(&bytes).map_err(|e| BackupError::Catalog {
            repo: store.name().to_owned(),
            what: format!("config: unreadable JSON: {e}"),
        })?;
        if config.format != "btrsend-repository"
            || (config.version != REPO_VERSION && config.version != crypt::repo::VERSION)
        {
            return Err(BackupError::Invalid(format!(
                "{}: config: format {} version {} (this btrsend reads btrsend-repository versions {REPO_VERSION} and {})",
                store.name(),
                config.format,
                config.version,
                crypt::repo::VERSION
            )));
        }
        let (store, keys) = if config.version == REPO_VERSION {
            crypt::repo::check_plain(&*store, &config, secrets)?;
            (store, None)
        } else {
            let (keys, by) = crypt::repo::open(&*store, &config, secrets)?;
            crypt::no_core_dumps();
            let crypt: Arc<dyn Store> = Arc::new(CryptStore::new(store, keys.clone()));
            (crypt, Some((keys, by)))
        };
        let (keys, opened_by) = keys.unzip();
        Ok(Repository {
            store,
            config,
            keys,
            opened_by: opened_by.flatten(),
        })
    }

    /// Refuse, before any work, an operation that reads stream contents
    /// when the keys at hand cannot (a write key alone).
    pub(super) fn need_contents(&self, what: &str) -> Result<(), BackupError> {
        if self.store.write_only() {
            return Err(BackupError::Key {
                repo: self.store.name().to_owned(),
                what: format!(
                    "{what} reads the stored streams, which the write key alone cannot: give an identity of one of the repository's recipients (--identity FILE or BTRSEND_IDENTITY_FILE)"
                ),
            });
        }
        Ok(())
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Take the lock.
    ///
    /// # Errors
    ///
    /// [`BackupError::LockHeld`]; store errors.
    pub fn lock(
        &self,
        kind: LockKind,
        wait: Duration,
        progress: &dyn Progress,
    ) -> Result<RepoLock, BackupError> {
        lock::lock(&self.store, kind, wait, &mut |m| progress.notice(m))
    }

    /// The current catalog.
    ///
    /// # Errors
    ///
    /// [`BackupError::Catalog`]; store errors.
    pub fn catalog(&self) -> Result<Catalog, BackupError> {
        Catalog::load(&*self.store)
    }

    /// The stored entries, of the newest catalog generation. Takes no lock:
    /// a generation is replaced atomically and never changed, so a `list`
    /// never waits for a `run` (and works in a repository it cannot write).
    ///
    /// # Errors
    ///
    /// Catalog and store errors.
    pub fn list(&self) -> Result<Vec<Entry>, BackupError> {
        Ok(self.catalog()?.entries)
    }

    /// The entry `spec` names: its id, its uuid, its path, `latest`, a base
    /// name, a date/time prefix or a name prefix (see [`find`]).
    ///
    /// # Errors
    ///
    /// [`BackupError::NoSuchSnapshot`], naming the nearest candidates or,
    /// when `spec` matches in several origins, each origin's newest match.
    pub fn find<'c>(&self, cat: &'c Catalog, spec: &str) -> Result<&'c Entry, BackupError> {
        find::find(&cat.entries, spec, &jiff::tz::TimeZone::system()).map_err(|e| {
            let list = |v: &[(String, u64)]| {
                v.iter()
                    .map(|(p, id)| format!("{p} (id {id})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let what = match e {
                find::FindError::NoMatch(v) if v.is_empty() => {
                    format!("no stored snapshot matches {spec}: the repository holds none")
                }
                find::FindError::NoMatch(v) => format!(
                    "no stored snapshot matches {spec}; the nearest: {}",
                    list(&v)
                ),
                find::FindError::Ambiguous(v) => format!(
                    "{spec} matches snapshots of more than one origin; name one (the newest of each: {})",
                    list(&v)
                ),
            };
            BackupError::NoSuchSnapshot {
                repo: self.store.name().to_owned(),
                spec: spec.to_owned(),
                what,
            }
        })
    }

    /// Remove stream files no catalog entry names and unfinished uploads
    /// (left by an interrupted run), but the partial stream files of the
    /// snapshots `keep` names (uuid, ctransid): a later run continues them
    /// (see [`partial`]). Needs the exclusive lock.
    pub(super) fn clean_leftovers(
        &self,
        cat: &Catalog,
        keep: &dyn Fn(&str, u64) -> bool,
        progress: &dyn Progress,
    ) -> Result<(), BackupError> {
        let named: BTreeSet<&str> = cat.entries.iter().map(|e| e.file.as_str()).collect();
        for o in self.store.list(STREAMS_DIR)? {
            if !named.contains(o.key.as_str()) {
                progress.notice(&format!(
                    "removing {}: a stream file no catalog entry names (left by an interrupted run)",
                    o.key
                ));
                self.store.delete(&o.key)?;
            }
        }
        // Unfinished uploads: temporary files, or S3 multipart uploads
        // (aborted, so no part stays behind). One that cannot be removed
        // now is tried again next time.
        let resumable = self.store.continues_uploads();
        for o in self.store.list(&format!("{}/", store::TMP_DIR))? {
            if resumable
                && partial::snapshot_of(&o.key).is_some_and(|(u, c)| keep(&u, c))
                && o.size > 0
            {
                continue;
            }
            if let Err(e) = self.store.discard_unfinished(&o.key) {
                progress.notice(&format!(
                    "cannot remove what an interrupted upload left ({}): {e}; the next run tries again",
                    o.key
                ));
            }
        }
        Ok(())
    }

    /// Open an entry's stream file and check its trailer against the
    /// entry.
    pub(super) fn open_file(&self, e: &Entry) -> Result<StreamFile, BackupError> {
        let damage = |d: Damage| BackupError::Damage {
            repo: self.store.name().to_owned(),
            damage: Box::new(d),
        };
        let f =
            StreamFile::open(&*self.store, &e.file, e.stored_bytes).map_err(|err| match err {
                ReadError::Damage(d) => damage(d),
                ReadError::Store(s) => BackupError::Store(s),
            })?;
        let t = &f.trailer;
        let mismatch = |what: String| {
            damage(Damage::Mismatch {
                file: e.file.clone(),
                what,
            })
        };
        if t.uuid != e.uuid || t.ctransid != e.ctransid {
            return Err(mismatch(format!(
                "uuid {} ctransid {} (entry {}: {} {})",
                t.uuid, t.ctransid, e.id, e.uuid, e.ctransid
            )));
        }
        if t.parent_uuid != e.parent_uuid || t.parent_ctransid != e.parent_ctransid {
            return Err(mismatch(format!(
                "parent {:?} {:?} (entry {})",
                t.parent_uuid, t.parent_ctransid, e.id
            )));
        }
        if t.stream_bytes != e.stream_bytes || t.stream_blake3 != e.stream_blake3 {
            return Err(mismatch(format!(
                "{} raw bytes with BLAKE3 {} (entry {})",
                t.stream_bytes, t.stream_blake3, e.id
            )));
        }
        if t.proto != e.proto || t.commands != e.commands {
            return Err(mismatch(format!(
                "protocol {} with {} commands (entry {}: protocol {} with {})",
                t.proto, t.commands, e.id, e.proto, e.commands
            )));
        }
        Ok(f)
    }

    /// Check that the stream's own first command is of the entry's
    /// snapshot and, for an incremental stream, of its parent entry's
    /// snapshot (the catalog's links are checked against the streams, not
    /// taken on trust: `forget` deletes by them).
    pub(super) fn check_ident(&self, e: &Entry, f: &StreamFile) -> Result<(), BackupError> {
        let ident = f.first_ident(&*self.store).map_err(|err| match err {
            ReadError::Damage(d) => BackupError::Damage {
                repo: self.store.name().to_owned(),
                damage: Box::new(d),
            },
            ReadError::Store(s) => BackupError::Store(s),
        })?;
        let (uuid, ctransid, parent) = format::ident_text(&ident);
        let recorded = e.parent_uuid.clone().zip(e.parent_ctransid);
        if uuid != e.uuid || ctransid != e.ctransid || parent != recorded {
            let of = |p: &Option<(String, u64)>| {
                p.as_ref().map_or_else(
                    || String::from("a full stream"),
                    |(u, c)| format!("incremental from {u} ctransid {c}"),
                )
            };
            return Err(BackupError::Damage {
                repo: self.store.name().to_owned(),
                damage: Box::new(Damage::Mismatch {
                    file: e.file.clone(),
                    what: format!(
                        "its stream is of {uuid} ctransid {ctransid}, {} (entry {}: {} ctransid {}, {})",
                        of(&parent),
                        e.id,
                        e.uuid,
                        e.ctransid,
                        of(&recorded)
                    ),
                }),
            });
        }
        Ok(())
    }

    /// The stream files present, by key, with their sizes.
    pub(super) fn stream_sizes(&self) -> Result<BTreeMap<String, u64>, BackupError> {
        Ok(self
            .store
            .list(STREAMS_DIR)?
            .into_iter()
            .map(|o| (o.key, o.size))
            .collect())
    }
}
