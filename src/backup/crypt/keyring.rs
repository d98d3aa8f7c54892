//! `backup key`: the passphrases of a repository encrypted with one. Each
//! passphrase is one key object holding the same keys (see
//! [`keys`](super::keys)), so adding, changing or removing a passphrase
//! writes or deletes one object and re-encrypts nothing else.

use std::time::Duration;

use super::SecretString;
use super::repo::{KEYS_DIR, RECIPIENTS_KEY, pass_key_name};
use crate::backup::lock::LockKind;
use crate::backup::{BackupError, Progress, Repository};

/// One key of a repository, as `key list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeyInfo {
    /// Its name (`pass-…`, `recipients`).
    pub name: String,
    /// What it is.
    pub kind: &'static str,
    /// Whether the secret given opened it.
    pub current: bool,
}

/// The name `key list` shows for a key object's key.
fn short(key: &str) -> String {
    key.trim_start_matches(KEYS_DIR)
        .trim_end_matches(".age")
        .to_owned()
}

impl Repository {
    fn passphrase_mode(&self, what: &str) -> Result<(), BackupError> {
        match (self.config.encryption.as_deref(), &self.keys) {
            (Some("passphrase"), Some(_)) => Ok(()),
            (Some(mode), _) => Err(BackupError::Invalid(format!(
                "{}: {what}: the repository is encrypted for {mode}, which have no passphrases to manage",
                self.store.name()
            ))),
            (None, _) => Err(BackupError::Invalid(format!(
                "{}: {what}: the repository is not encrypted",
                self.store.name()
            ))),
        }
    }

    /// The repository's keys: its passphrase key objects, or its
    /// recipients key.
    ///
    /// # Errors
    ///
    /// Store errors; an unencrypted repository.
    pub fn key_list(&self) -> Result<Vec<KeyInfo>, BackupError> {
        if self.keys.is_none() {
            return Err(BackupError::Invalid(format!(
                "{}: the repository is not encrypted: it has no keys",
                self.store.name()
            )));
        }
        Ok(self
            .store
            .list(KEYS_DIR)?
            .into_iter()
            .filter(|o| o.key.ends_with(".age"))
            .map(|o| KeyInfo {
                name: short(&o.key),
                kind: if o.key == RECIPIENTS_KEY {
                    "recipients"
                } else {
                    "passphrase"
                },
                current: self.opened_by.as_deref() == Some(o.key.as_str()),
            })
            .collect())
    }

    /// The repository's recipients (public keys; in passphrase mode the
    /// repository's own).
    pub fn recipients(&self) -> Vec<String> {
        self.keys
            .as_ref()
            .map(|k| k.recipients.iter().map(ToString::to_string).collect())
            .unwrap_or_default()
    }

    /// The write key's fingerprint (it shows nothing of the key).
    pub fn write_key_fingerprint(&self) -> Option<String> {
        self.keys.as_ref().map(|k| k.write.fingerprint())
    }

    /// Add a passphrase: a new key object with the same keys; returns its
    /// name.
    ///
    /// # Errors
    ///
    /// Not a passphrase repository; lock and store errors.
    pub fn key_add(
        &self,
        passphrase: &SecretString,
        log_n: Option<u8>,
        wait: Duration,
        progress: &dyn Progress,
    ) -> Result<String, BackupError> {
        self.passphrase_mode("key add")?;
        let _lock = self.lock(LockKind::Exclusive, wait, progress)?;
        self.add_locked(passphrase, log_n)
    }

    fn add_locked(
        &self,
        passphrase: &SecretString,
        log_n: Option<u8>,
    ) -> Result<String, BackupError> {
        let Some(keys) = &self.keys else {
            return Err(BackupError::Invalid(String::from("no keys")));
        };
        let bytes = keys
            .passphrase_object(passphrase, log_n)
            .map_err(|e| BackupError::Invalid(format!("{}: {e}", self.store.name())))?;
        let key = pass_key_name();
        if !self.store.put_if_absent(&key, &bytes)? {
            return Err(BackupError::Invalid(format!(
                "{}: {key} exists already; try again",
                self.store.name()
            )));
        }
        Ok(short(&key))
    }

    /// Remove the passphrase key object `name` (as [`key_list`] names
    /// it): never the one the passphrase given opened, nor the last one.
    ///
    /// [`key_list`]: Repository::key_list
    ///
    /// # Errors
    ///
    /// Not a passphrase repository, no such key, the current or last one;
    /// lock and store errors.
    pub fn key_remove(
        &self,
        name: &str,
        wait: Duration,
        progress: &dyn Progress,
    ) -> Result<(), BackupError> {
        self.passphrase_mode("key remove")?;
        let _lock = self.lock(LockKind::Exclusive, wait, progress)?;
        let keys = self.key_list()?;
        let Some(k) = keys
            .iter()
            .find(|k| k.name == name && k.kind == "passphrase")
        else {
            return Err(BackupError::Invalid(format!(
                "{}: no passphrase key {name:?} (btrsend backup key list names them)",
                self.store.name()
            )));
        };
        if k.current {
            return Err(BackupError::Invalid(format!(
                "{}: {name} is the key the passphrase given opens: to change that passphrase use key passwd, or remove it with another passphrase",
                self.store.name()
            )));
        }
        self.store.delete(&format!("{KEYS_DIR}{name}.age"))?;
        Ok(())
    }

    /// Change the passphrase given to `new`: a new key object, then the
    /// old one removed. Returns the new key's name.
    ///
    /// # Errors
    ///
    /// As [`Repository::key_add`].
    pub fn key_passwd(
        &self,
        new: &SecretString,
        log_n: Option<u8>,
        wait: Duration,
        progress: &dyn Progress,
    ) -> Result<String, BackupError> {
        self.passphrase_mode("key passwd")?;
        let _lock = self.lock(LockKind::Exclusive, wait, progress)?;
        let name = self.add_locked(new, log_n)?;
        if let Some(old) = &self.opened_by {
            self.store.delete(old)?;
        }
        Ok(name)
    }
}
